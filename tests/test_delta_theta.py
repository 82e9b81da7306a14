"""Δθ (Table 7): the exact statistics on hand-computed arrays, the streaming histogram within its stated error
bounds, and orbax / HF checkpoints of a tiny model giving the same numbers as a direct computation (+ the CLI)."""

import csv
import dataclasses
import importlib.util
import json
import math
import os

import jax
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from helpers import launch

from rltldr_jax.analysis.delta_theta import (
    DeltaThetaError,
    LogHistogram,
    bin_index,
    compare,
    delta_stats,
    exceeds_bf16,
    format_table,
    gini,
    module_kind,
    open_checkpoint,
    split_step,
    top_count,
    top_share,
    write_rows,
)
from rltldr_jax.checkpoint import Checkpointer
from rltldr_jax.models import ModelSpec, get_preset, save_pretrained

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = dataclasses.replace(get_preset("tiny"), vocab_size=256)
BF16 = ml_dtypes.bfloat16

# ----------------------------------------------------------------------------------------------------
# Hand-computed numbers
# ----------------------------------------------------------------------------------------------------


def test_exact_statistics_by_hand():
    # Gini = Σ(2i − n − 1)x₍ᵢ₎ / (n Σx): [0,0,1,1] → (1·1 + 3·1)/(4·2) = 1/2; [1,2,3,4] → 10/40;
    # one holder → (n−1)/n.
    assert gini(np.array([0.0, 0.0, 1.0, 1.0])) == pytest.approx(0.5, abs=1e-15)
    assert gini(np.array([4.0, 1.0, 3.0, 2.0])) == pytest.approx(0.25, abs=1e-15)
    assert gini(np.array([0.0, 0.0, 0.0, 5.0])) == pytest.approx(0.75, abs=1e-15)
    assert gini(np.full((3, 3), 2.0)) == pytest.approx(0.0, abs=1e-15)
    assert gini(np.zeros(5)) == 0.0  # no update: defined as 0
    # Mean absolute difference over all ordered pairs / (2·mean), the textbook definition.
    x = np.array([0.5, 0.0, 2.0, 7.0, 0.25])
    assert gini(x) == pytest.approx(np.abs(x[:, None] - x[None, :]).sum() / (2 * x.size**2 * x.mean()), abs=1e-15)
    with pytest.raises(ValueError, match="non-negative"):
        gini(np.array([-1.0, 1.0]))

    # k = ⌈n/100⌉ entries.
    assert [top_count(n) for n in (1, 99, 100, 101, 200, 201)] == [1, 1, 1, 2, 2, 3]
    # 99 entries of Δ² = 1 and one of 100: the top 1 holds 100/199.
    assert top_share(np.array([1.0] * 99 + [100.0])) == pytest.approx(100 / 199, abs=1e-15)
    # 101 entries → k = 2: (100 + 1) / 200.
    assert top_share(np.array([1.0] * 100 + [100.0])) == pytest.approx(101 / 200, abs=1e-15)
    assert top_share(np.array([9.0, 16.0] + [0.0] * 198)) == pytest.approx(1.0, abs=1e-15)
    assert top_share(np.full(100, 3.0)) == pytest.approx(0.01, abs=1e-15)
    assert top_share(np.array([1.0, 3.0]), fraction=0.5) == pytest.approx(0.75, abs=1e-15)

    # |Δ| > 2⁻⁸|θ_a|: equal to the threshold is not beyond it; at θ_a = 0 any change is.
    base = np.array([1.0, 1.0, 0.0, 0.0, -2.0, 256.0])
    delta = np.array([2.0**-8, 2.0**-7, 0.0, 1e-30, -(2.0**-6), 0.9])
    np.testing.assert_array_equal(exceeds_bf16(base, delta), [False, True, False, True, True, False])


def test_delta_stats_by_hand():
    a = np.array([[1.0, 2.0], [3.0, 4.0]], np.float32)
    b = np.array([[1.0, 2.5], [2.0, 4.0]], np.float32)  # Δ = [0, .5, −1, 0]
    s = delta_stats(a, b)
    r = s.row()
    assert (s.tensors, s.n, s.exceed, s.changed) == (1, 4, 2, 2)
    assert r["l1"] == 1.5 and r["l2"] == pytest.approx(math.sqrt(1.25), abs=1e-15)
    assert (r["changed"], r["exceed_bf16"]) == (0.5, 0.5)
    # |Δ| sorted [0, 0, .5, 1]: Gini = (1·.5 + 3·1)/(4·1.5) = 7/12; top-1 of 4 holds 1/1.25. Each nonzero value
    # sits alone in its bin, so the histogram brackets them exactly.
    assert (r["gini"], r["gini_err"]) == (pytest.approx(7 / 12, abs=1e-15), 0.0)
    assert (r["top_share"], r["top_share_err"]) == (pytest.approx(0.8, abs=1e-15), 0.0)

    # bf16: one spacing up from 1 (2⁻⁷) is beyond precision, one spacing down from 1 (2⁻⁸) is not, 3 → 3
    # is unchanged, 0 → 2⁻²⁰ is beyond.
    a16 = np.array([1.0, 1.0, 3.0, 0.0], BF16)
    b16 = np.array([1.0078125, 0.99609375, 3.0, 2.0**-20], BF16)
    s16 = delta_stats(a16, b16)
    assert (s16.n, s16.changed, s16.exceed) == (4, 3, 2)
    assert s16.l1 == 2.0**-7 + 2.0**-8 + 2.0**-20

    # Identical tensors: everything is zero.
    z = delta_stats(a, a.copy()).row()
    keys = ("l1", "l2", "changed", "exceed_bf16", "gini", "gini_err", "top_share", "top_share_err")
    assert [z[k] for k in keys] == [0] * 8


# ----------------------------------------------------------------------------------------------------
# The streaming histogram and combining
# ----------------------------------------------------------------------------------------------------


def _samples(seed: int) -> np.ndarray:
    """|Δ|-like values: 60 % zeros, log-normal over ~10 decades, and runs of ties."""
    rs = np.random.default_rng(seed)
    x = np.abs(rs.standard_normal(40_000)) * np.exp(3.0 * rs.standard_normal(40_000)) * 1e-4
    x[rs.random(x.size) < 0.6] = 0.0
    x[:500] = 3e-3
    return rs.permutation(x)


@pytest.mark.parametrize("m", [1, 4, 1024])
def test_histogram_within_its_bounds(m):
    for seed in range(3):
        x = _samples(seed)
        h = LogHistogram.of(x, m)
        assert h.n == x.size and h.zeros == np.count_nonzero(x == 0)
        assert h.sums.sum() == pytest.approx(x.sum(), rel=1e-12)
        lo, hi = h.edges()
        assert np.all(np.diff(lo) > 0) and np.all(hi - lo <= lo / m)  # ordered; regular bins: width ≤ lo/M
        idx = bin_index(x[x > 0], m) - h.start
        assert np.all(lo[idx] <= x[x > 0]) and np.all(x[x > 0] < hi[idx])  # every value inside its bin
        g, s = h.gini(), h.top_share()
        exact_g, exact_s = gini(x), top_share(x * x)
        assert abs(g.value - exact_g) <= g.bound + 1e-12
        assert abs(s.value - exact_s) <= s.bound + 1e-12
        assert g.bound <= 1 / (8 * m)  # the documented worst case
        assert s.bound <= exact_s * (2 * m + 1) / (2 * m * m) + 1e-12
    if m == 1024:
        assert g.bound < 1e-6 and s.bound < 1e-6

    # Adversarial: one bin [1, 2) at M = 1, values piled at both ends; the bounds still hold.
    y = np.array([1.0] * 150 + [1.999] * 50)
    hy = LogHistogram.of(y, 1)
    assert np.count_nonzero(hy.counts) == 1
    gy, sy = hy.gini(), hy.top_share()
    assert abs(gy.value - gini(y)) <= gy.bound and abs(sy.value - top_share(y * y)) <= sy.bound
    assert gy.bound > 0.01  # the whole bin is uncertain here, and the bound says so


def test_histograms_and_stats_add_up():
    x1, x2 = _samples(10), _samples(11)[:1000]
    h = LogHistogram.of(x1, 64) + LogHistogram.of(x2, 64)
    whole = LogHistogram.of(np.concatenate([x1, x2]), 64)
    assert (h.start, h.zeros) == (whole.start, whole.zeros)
    np.testing.assert_array_equal(h.counts, whole.counts)
    np.testing.assert_allclose(h.sums, whole.sums, rtol=1e-12)
    np.testing.assert_allclose(h.sq_sums, whole.sq_sums, rtol=1e-12)
    assert h.max_value == whole.max_value
    with pytest.raises(ValueError, match="power of two"):
        LogHistogram.empty(3)

    rs = np.random.default_rng(0)
    a = rs.standard_normal((37, 11)).astype(np.float32)
    b = a + np.where(rs.random(a.shape) < 0.3, rs.standard_normal(a.shape) * 1e-2, 0).astype(np.float32)
    one = delta_stats(a, b)
    # Row blocks of 1..2 rows, transposed views, and two halves added: the same sums and counts.
    for other in (
        delta_stats(a, b, chunk_elems=20),
        delta_stats(a.T, b.T, chunk_elems=5),
        delta_stats(a[:20], b[:20]) + delta_stats(a[20:], b[20:]),
    ):
        assert (other.n, other.exceed, other.changed) == (one.n, one.exceed, one.changed) and one.n == 407
        assert other.l1 == pytest.approx(one.l1, rel=1e-12) and other.l2sq == pytest.approx(one.l2sq, rel=1e-12)
        np.testing.assert_array_equal(other.hist.counts, one.hist.counts)
    d = b.astype(np.float64) - a
    assert one.l1 == pytest.approx(np.abs(d).sum(), rel=1e-12)
    assert one.exceed == np.count_nonzero(np.abs(d) > np.abs(a.astype(np.float64)) / 256)
    assert one.changed == np.count_nonzero(d)
    assert b.sum() != a.sum() and a.dtype == np.float32  # the inputs are untouched

    with pytest.raises(DeltaThetaError, match=r"model\.x\.weight: shapes differ: a \(37, 11\) ≠ b \(11, 37\)"):
        delta_stats(a, b.T, name="model.x.weight")
    bad = b.copy()
    bad[3, 4] = np.nan
    with pytest.raises(DeltaThetaError, match=r"model\.y\.weight: non-finite"):
        delta_stats(a, bad, name="model.y.weight")


def test_module_kinds():
    kinds = {
        "model.embed_tokens.weight": "embeddings",
        "lm_head.weight": "embeddings",
        "model.norm.weight": "norms",
        "model.layers.0.input_layernorm.weight": "norms",
        "model.layers.3.self_attn.q_norm.weight": "norms",
        "model.layers.0.linear_attn.norm.weight": "norms",
        "model.layers.3.self_attn.o_proj.weight": "attention",
        "model.layers.0.linear_attn.conv1d.weight": "deltanet",
        "model.layers.0.linear_attn.A_log": "deltanet",
        "model.layers.0.linear_attn.in_proj_qkv.weight": "deltanet",
        "model.layers.7.mlp.down_proj.weight": "mlp",
    }
    assert {n: module_kind(n) for n in kinds} == kinds
    with pytest.raises(DeltaThetaError, match="model.visual.patch: no module kind"):
        module_kind("model.visual.patch")
    assert split_step("runs/x/checkpoints:12") == ("runs/x/checkpoints", 12)
    assert split_step("gs://b/run:7") == ("gs://b/run", 7) and split_step("/a/b") == ("/a/b", None)


# ----------------------------------------------------------------------------------------------------
# Checkpoints, end to end
# ----------------------------------------------------------------------------------------------------


def _kind_of_path(path: tuple) -> str:
    """Our parameter path → kind, independently of the HF names."""
    names = [str(p) for p in path]
    if names[-1] == "embedding" or names[0] == "lm_head":
        return "embeddings"
    if any(n.endswith("norm") for n in names):
        return "norms"
    for part, kind in (("self_attn", "attention"), ("linear_attn", "deltanet"), ("mlp", "mlp")):
        if part in names:
            return kind
    raise AssertionError(path)


def _params(config, seed: int):
    rs = np.random.default_rng(seed)
    graphdef, abstract = nnx.split(ModelSpec(config).abstract())
    return graphdef, jax.tree.map(lambda a: np.asarray(0.05 * rs.standard_normal(a.shape), np.float32), abstract)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Base and perturbed params of a tiny model, as orbax steps 1/2 of one run and as fp32 HF exports."""
    tmp = tmp_path_factory.mktemp("delta_theta")
    graphdef, base = _params(CONFIG, 0)
    rs = np.random.default_rng(1)

    def perturb(x):
        mask = rs.random(x.shape) < 0.05  # sparse, with a heavy tail: a few large changes
        step = rs.standard_normal(x.shape) * 1e-3 * np.exp(2.0 * rs.standard_normal(x.shape))
        return (x + np.where(mask, step, 0.0)).astype(x.dtype)

    trained = jax.tree.map(perturb, base)
    with Checkpointer(tmp / "run" / "checkpoints", keep=None, async_save=False) as ckpt:
        ckpt.save(1, params=base, opt_state=None, rng=None, model_config=CONFIG)
        ckpt.save(2, params=trained, opt_state=None, rng=None, model_config=CONFIG)
    with Checkpointer(tmp / "noconfig", keep=None, async_save=False) as ckpt:
        ckpt.save(5, params=trained, opt_state=None, rng=None)
    save_pretrained(nnx.merge(graphdef, base), tmp / "hf_a")
    save_pretrained(nnx.merge(graphdef, trained), tmp / "hf_b", max_shard_bytes=200_000)  # sharded, with an index
    save_pretrained(nnx.merge(graphdef, base), tmp / "hf16_a", dtype=BF16)
    save_pretrained(nnx.merge(graphdef, trained), tmp / "hf16_b", dtype=BF16)

    # The reference: every entry of our (stacked) parameters, grouped by kind.
    deltas: dict[str, list] = {}
    bases: dict[str, list] = {}
    for (path, va), (_, vb) in zip(nnx.to_flat_state(base), nnx.to_flat_state(trained), strict=False):
        x, y = np.asarray(va[...], np.float64).ravel(), np.asarray(vb[...], np.float64).ravel()
        deltas.setdefault(_kind_of_path(path), []).append(y - x)
        bases.setdefault(_kind_of_path(path), []).append(x)
    deltas = {k: np.concatenate(v) for k, v in deltas.items()}
    bases = {k: np.concatenate(v) for k, v in bases.items()}
    deltas["all"], bases["all"] = np.concatenate(list(deltas.values())), np.concatenate(list(bases.values()))
    return {"tmp": tmp, "deltas": deltas, "bases": bases}


def _by_kind(report):
    return {r["kind"]: r for r in report.rows()}


def _assert_rows_equal(got, want, what):
    assert got.keys() == want.keys(), what
    for kind in want:
        assert got[kind]["kind"] == kind
        for key, value in want[kind].items():
            if key != "kind":
                assert got[kind][key] == pytest.approx(value, rel=1e-12, abs=1e-15), (what, kind, key)


def test_checkpoints_of_both_kinds_agree_with_a_direct_computation(checkpoints):
    tmp, deltas, bases = checkpoints["tmp"], checkpoints["deltas"], checkpoints["bases"]
    run = tmp / "run" / "checkpoints"
    reports = {
        "orbax-orbax": compare(f"{run}:1", f"{run}:2"),
        "orbax-hf": compare(f"{run}:1", tmp / "hf_b"),
        "hf-orbax": compare(tmp / "hf_a", run),  # the latest step is 2
        "hf-hf": compare(tmp / "hf_a", tmp / "hf_b"),
        "stepdir-rundir": compare(run / "1", tmp / "run"),
    }
    ref = _by_kind(reports["orbax-orbax"])
    assert list(ref) == ["all", "attention", "deltanet", "mlp", "embeddings", "norms"]
    assert ref["all"]["entries"] == CONFIG.num_params() == deltas["all"].size
    # embed + final norm; per layer 2 norms + 3 MLP; 6 DeltaNet layers × 9 tensors; 2 attention layers × 6.
    assert ref["all"]["tensors"] == 2 + 8 * 5 + 6 * 9 + 2 * 6
    for kind, r in ref.items():
        d, a = deltas[kind], bases[kind]
        assert r["entries"] == d.size
        assert r["l1"] == pytest.approx(np.abs(d).sum(), rel=1e-12)
        assert r["l2"] == pytest.approx(np.sqrt(np.dot(d, d)), rel=1e-12)
        assert r["changed"] == np.count_nonzero(d) / d.size
        assert r["exceed_bf16"] == np.count_nonzero(np.abs(d) > np.abs(a) / 256) / d.size
        assert abs(r["gini"] - gini(np.abs(d))) <= r["gini_err"] + 1e-12 and r["gini_err"] < 1e-5
        assert abs(r["top_share"] - top_share(d * d)) <= r["top_share_err"] + 1e-12 and r["top_share_err"] < 1e-5
        assert 0.03 < r["changed"] < 0.07 and 0.9 < r["gini"] < 1.0
    for name, report in reports.items():
        _assert_rows_equal(_by_kind(report), ref, name)

    # Identical checkpoints, across formats: zero everywhere.
    for a, b in ((f"{run}:1", tmp / "hf_a"), (tmp / "hf_b", f"{run}:2")):
        for r in compare(a, b).rows():
            assert (r["l1"], r["l2"], r["changed"], r["exceed_bf16"], r["gini"], r["top_share"]) == (0, 0, 0, 0, 0, 0)

    # An orbax checkpoint without a recorded architecture needs one given.
    with pytest.raises(DeltaThetaError, match="records no model config"):
        open_checkpoint(tmp / "noconfig")
    row = _by_kind(compare(tmp / "hf_a", tmp / "noconfig", config=CONFIG))["all"]
    assert row["l1"] == pytest.approx(ref["all"]["l1"], rel=1e-12)


def test_bf16_checkpoints(checkpoints):
    tmp, deltas, bases = checkpoints["tmp"], checkpoints["deltas"], checkpoints["bases"]
    row = _by_kind(compare(tmp / "hf16_a", tmp / "hf16_b"))["all"]
    a16 = bases["all"].astype(BF16).astype(np.float64)
    d16 = (bases["all"] + deltas["all"]).astype(np.float32).astype(BF16).astype(np.float64) - a16
    assert row["l1"] == pytest.approx(np.abs(d16).sum(), rel=1e-12)
    assert row["changed"] == np.count_nonzero(d16) / d16.size
    assert row["exceed_bf16"] == np.count_nonzero(np.abs(d16) > np.abs(a16) / 256) / d16.size
    # Between bf16 values every change is ≥ 2⁻⁸|θ_a|; only steps down from a power of two equal it.
    on_threshold = (d16 != 0) & (np.abs(d16) * 256 == np.abs(a16))
    assert np.all(np.abs(d16[d16 != 0]) * 256 >= np.abs(a16[d16 != 0]))
    assert np.all(np.log2(np.abs(a16[on_threshold])) % 1 == 0)
    assert row["changed"] - row["exceed_bf16"] == pytest.approx(np.count_nonzero(on_threshold) / d16.size, abs=1e-15)
    assert row["exceed_bf16"] < row["changed"] < 0.05  # rounding to bf16 hides some of the fp32 changes


def test_mismatches_and_wrong_paths_say_what(checkpoints, tmp_path):
    tmp = checkpoints["tmp"]
    wider = dataclasses.replace(CONFIG, intermediate_size=96)
    graphdef, params = _params(wider, 3)
    save_pretrained(nnx.merge(graphdef, params), tmp_path / "wider")
    with pytest.raises(DeltaThetaError) as e:
        compare(tmp / "hf_a", tmp_path / "wider")
    assert "different shapes: model.layers.0.mlp.down_proj.weight: a (64, 128) ≠ b (64, 96)" in str(e.value)
    assert "(24 in all)" in str(e.value)  # 3 MLP projections × 8 layers

    deeper = dataclasses.replace(CONFIG, num_hidden_layers=12, layer_types=())
    graphdef, params = _params(deeper, 4)
    save_pretrained(nnx.merge(graphdef, params), tmp_path / "deeper")
    with pytest.raises(DeltaThetaError, match=r"only in b: model\.layers\.8\.input_layernorm\.weight"):
        compare(tmp / "hf_a", tmp_path / "deeper")

    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "weights.bin").write_bytes(b"\0")
    with pytest.raises(DeltaThetaError, match=r"junk' is not a checkpoint: expected an HF safetensors .*orbax"):
        open_checkpoint(tmp_path / "junk")
    with pytest.raises(DeltaThetaError, match="a :STEP applies to orbax checkpoints only"):
        open_checkpoint(f"{tmp / 'hf_a'}:3")
    with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 9 .*steps: \[1, 2\]"):
        open_checkpoint(f"{tmp / 'run' / 'checkpoints'}:9")
    # An HF directory whose tensors do not match its config.json.
    os.makedirs(tmp_path / "broken")
    with open(tmp / "hf_a" / "config.json") as f:
        cfg = json.load(f)
    cfg["intermediate_size"] = 96
    with open(tmp_path / "broken" / "config.json", "w") as f:
        json.dump(cfg, f)
    os.symlink(tmp / "hf_a" / "model.safetensors", tmp_path / "broken" / "model.safetensors")
    pattern = r"does not match its config.json: mis-shaped tensors: .*file \(128, 64\) ≠ config.json \(96, 64\)"
    with pytest.raises(DeltaThetaError, match=pattern):
        open_checkpoint(tmp_path / "broken")


def test_cli_and_outputs(checkpoints, tmp_path, capsys):
    tmp = checkpoints["tmp"]
    expected = _by_kind(compare(f"{tmp / 'run' / 'checkpoints'}:1", tmp / "hf_b"))
    out = launch(
        "delta_theta",
        f"--base_checkpoint={tmp / 'run' / 'checkpoints'}:1",
        f"--b={tmp / 'hf_b'}",  # (its name before --checkpoint: still accepted, with a notice)
        f"--out={tmp_path / 't.json'}",
        "--quiet",
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "notice: --b is now --checkpoint (the old name goes in the next release)" in out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("all ") for line in lines) and any(line.startswith("deltanet ") for line in lines)
    with open(tmp_path / "t.json") as f:
        written = json.load(f)
    assert written["a"].endswith("checkpoints:1") and written["b"] == str(tmp / "hf_b")
    _assert_rows_equal({r["kind"]: r for r in written["rows"]}, expected, "cli")

    rows = list(expected.values())
    write_rows(tmp_path / "t.csv", rows)
    with open(tmp_path / "t.csv", newline="") as f:
        read = list(csv.DictReader(f))
    assert [r["kind"] for r in read] == list(expected)
    assert float(read[0]["l1"]) == pytest.approx(expected["all"]["l1"], rel=1e-12)
    assert float(read[0]["gini"]) == pytest.approx(expected["all"]["gini"], rel=1e-12)
    with pytest.raises(ValueError, match=r"must end in \.csv or \.json"):
        write_rows(tmp_path / "t.txt", rows)
    table = format_table(rows).splitlines()
    assert len(table) == 2 + len(rows) and f"{100 * expected['all']['exceed_bf16']:.2f}%" in table[2]

    # Errors return 2 with a message (in-process: the flags module is loaded once).
    run = importlib.import_module("rltldr_jax.cli.delta_theta").run_comparison  # launch/delta_theta.py's
    kwargs = {"out": None, "preset": None, "config_json": None, "bins_per_octave": 1024, "quiet": True}
    assert run(str(tmp_path), str(tmp / "hf_b"), **kwargs) == 2
    assert "delta_theta: error:" in capsys.readouterr().err
    assert run(str(tmp / "hf_a"), str(tmp / "noconfig"), **{**kwargs, "preset": "tiny"}) == 2  # vocab ≠ 256
    assert "embed_tokens.embedding: checkpoint (256, 64) ≠ config (248320, 64)" in capsys.readouterr().err
    assert run(str(tmp / "hf_a"), str(tmp / "hf_b"), **{**kwargs, "out": str(tmp_path / "t.txt")}) == 2
    assert "must end in .csv or .json" in capsys.readouterr().err
    assert run(str(tmp / "hf_a"), str(tmp / "hf_b"), **kwargs) == 0
    assert "base = " + str(tmp / "hf_a") in capsys.readouterr().out
