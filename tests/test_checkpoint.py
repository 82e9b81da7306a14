"""Checkpoints: bit-identical save/restore of params, optimizer state, step, RNG and meta; keep=N; atomicity;
exact training continuation; architecture mismatch errors; sharded restore; export to HF safetensors (+ CLI)."""

import dataclasses
import errno
import gc
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from helpers import fake_devices_xla_flags
from safetensors import safe_open
from safetensors.numpy import save_file

from rltldr_jax import sharding
from rltldr_jax.checkpoint import (
    SPACE_MARGIN,
    SPACE_SLACK_BYTES,
    Checkpointer,
    CheckpointMismatchError,
    CheckpointSaveError,
    CorruptCheckpointError,
    export_hf,
    load_model,
    tree_bytes,
)
from rltldr_jax.envs.base import Task, TaskSource
from rltldr_jax.models import ModelSpec, get_preset, load_pretrained, save_pretrained
from rltldr_jax.train.step import make_optimizer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = dataclasses.replace(get_preset("tiny"), vocab_size=256)
SPEC = ModelSpec(CONFIG)


def surrogate_loss(params, key):
    """A cheap stand-in for the RL loss (train_step compiles for a minute on 2 busy CPUs): pulls the weights
    towards RNG-dependent targets, so the optimizer state (AdamW moments, count) and the RNG stream both matter."""
    leaves = jax.tree.leaves(params)
    u = jax.random.uniform(key, (len(leaves),))
    return sum(jnp.mean((p - jnp.sin(7.0 * p + 6.0 * ui)) ** 2) for p, ui in zip(leaves, u, strict=False))


def random_params(seed: int = 0):
    """The tiny model's state with random values (numpy: building it eagerly takes ~10 s of per-op compiles)."""
    rs = np.random.default_rng(seed)
    graphdef, abstract = nnx.split(SPEC.abstract())
    params = jax.tree.map(lambda a: np.asarray(0.05 * rs.standard_normal(a.shape), a.dtype), abstract)
    # Committed to a device, like the trainer's sharded state and every restored array (jit keys on it).
    return graphdef, jax.device_put(params, jax.devices()[0])


@pytest.fixture(scope="module")
def setup():
    """graphdef, optimizer (`make_optimizer`), a jitted optimizer step, and the state after 2 steps."""
    graphdef, params = random_params()
    tx = make_optimizer(1e-2, weight_decay=0.01)

    @jax.jit
    def step_fn(params, opt_state, key):
        grads = jax.grad(surrogate_loss)(params, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state

    def run(params, opt_state, rng, n):
        for _ in range(n):
            rng, key = jax.random.split(rng)
            params, opt_state = step_fn(params, opt_state, key)
        return params, opt_state, rng

    params, opt_state, rng = run(params, tx.init(params), jax.random.key(7), 2)
    return dict(graphdef=graphdef, tx=tx, run=run, params=params, opt_state=opt_state, rng=rng)


def abstract_targets(tx, config=CONFIG):
    abstract_params = nnx.split(ModelSpec(config).abstract())[1]
    return abstract_params, jax.eval_shape(tx.init, abstract_params)


def assert_trees_identical(a, b):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=False):
        assert x.dtype == y.dtype and x.shape == y.shape
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_save_restore_is_bit_identical(setup, tmp_path):
    tasks = [Task(task_id=f"t{i}", goal="g", env="sapi", split="train") for i in range(5)]
    source = TaskSource(tasks, seed=3)
    source.take(3)
    meta = {
        "task_cursor": source.state(),
        "phase": 1,
        "env_steps": np.int64(42),
        "weight_version": 2,
        "metrics": {"pass1": np.float32(0.5), "counts": np.arange(3)},
        "config": {"lr": 1e-2, "name": "x"},
    }
    with Checkpointer(tmp_path / "ckpt", keep=3) as ckpt:
        ckpt.save(
            2, params=setup["params"], opt_state=setup["opt_state"], rng=setup["rng"], meta=meta, model_config=CONFIG
        )
        ckpt.wait_until_finished()
        assert ckpt.latest_step() == 2
        abstract_params, abstract_opt = abstract_targets(setup["tx"])
        r = ckpt.restore(abstract_params=abstract_params, abstract_opt_state=abstract_opt)
    assert r.step == 2
    assert_trees_identical(r.params, setup["params"])
    assert_trees_identical(r.opt_state, setup["opt_state"])
    assert int(r.opt_state[1][0].count) == 2
    assert jnp.issubdtype(r.rng.dtype, jax.dtypes.prng_key)
    np.testing.assert_array_equal(jax.random.key_data(r.rng), jax.random.key_data(setup["rng"]))
    assert r.meta == {
        "task_cursor": source.state(),
        "phase": 1,
        "env_steps": 42,
        "weight_version": 2,
        "metrics": {"pass1": 0.5, "counts": [0, 1, 2]},
        "config": {"lr": 1e-2, "name": "x"},
    }
    assert r.model_config == CONFIG
    resumed = TaskSource(tasks, seed=3)
    resumed.restore(r.meta["task_cursor"])
    assert [t.task_id for t in resumed.take(4)] == [t.task_id for t in source.take(4)]


def test_keep_latest_missing_and_raw_keys(setup, tmp_path):
    params = setup["params"]
    with Checkpointer(tmp_path, keep=2, async_save=False) as ckpt:
        for step in (1, 2, 3, 5):
            ckpt.save(step, params=params, opt_state=None, rng=jax.random.PRNGKey(step), meta={"step": step})
        assert ckpt.all_steps() == [3, 5] and ckpt.latest_step() == 5
        assert sorted(os.listdir(tmp_path)) == ["3", "5"]
        with pytest.raises(ValueError, match="already exists"):
            ckpt.save(5, params=params, opt_state=None, rng=None)
        abstract_params = nnx.split(SPEC.abstract())[1]
        r = ckpt.restore(abstract_params=abstract_params)
        assert (r.step, r.meta, r.opt_state) == (5, {"step": 5}, None)
        np.testing.assert_array_equal(r.rng, jax.random.PRNGKey(5))  # raw uint32 keys stay raw
        assert r.rng.dtype == jnp.uint32
        assert ckpt.restore(3, abstract_params=abstract_params).meta == {"step": 3}
        with pytest.raises(FileNotFoundError, match=r"no checkpoint for step 1 .*steps: \[3, 5\]"):
            ckpt.restore(1, abstract_params=abstract_params)
        with pytest.raises(CheckpointMismatchError, match="opt_state: the checkpoint has none"):
            ckpt.restore(abstract_params=abstract_params, abstract_opt_state=abstract_targets(setup["tx"])[1])
    with pytest.raises(FileNotFoundError, match="no checkpoint in"):
        Checkpointer(tmp_path / "empty", keep=1).restore(abstract_params=abstract_params)
    with pytest.raises(FileNotFoundError, match="no checkpoint directory"):
        Checkpointer(tmp_path / "absent", keep=1, create=False)


def test_partial_checkpoints_are_ignored(setup, tmp_path):
    with Checkpointer(tmp_path, keep=3) as ckpt:
        ckpt.save(1, params=setup["params"], opt_state=setup["opt_state"], rng=setup["rng"], meta={"ok": True})
    # What a crash mid-save leaves (orbax's temporary directory), and a step directory that never finished.
    for tmp in ("4.orbax-checkpoint-tmp", "5.orbax-checkpoint-tmp-1712345678"):  # orbax 0.12 names / older names
        (tmp_path / tmp / "params").mkdir(parents=True)
        (tmp_path / tmp / "params" / "junk").write_text("partial")
        (tmp_path / tmp / "_CHECKPOINT_METADATA").write_text("{}")
    (tmp_path / "6" / "params").mkdir(parents=True)
    ckpt = Checkpointer(tmp_path, keep=3)
    assert ckpt.all_steps() == [1] and ckpt.latest_step() == 1
    abstract_params, abstract_opt = abstract_targets(setup["tx"])
    r = ckpt.restore(abstract_params=abstract_params, abstract_opt_state=abstract_opt)
    assert r.step == 1 and r.meta == {"ok": True}
    assert_trees_identical(r.params, setup["params"])
    # The resumed run saves the step that crashed again: orbax replaces the unfinished temporary directory.
    ckpt.save(4, params=r.params, opt_state=r.opt_state, rng=r.rng, meta={"again": True})
    assert ckpt.restore(abstract_params=abstract_params).meta == {"again": True}
    assert ckpt.all_steps() == [1, 4] and not (tmp_path / "4.orbax-checkpoint-tmp").exists()
    ckpt.close()


def test_async_save_copies_before_returning(setup, tmp_path):
    """The caller may donate/delete its arrays as soon as `save` returns (the next train step donates them)."""
    params = jax.tree.map(jnp.copy, setup["params"])
    with Checkpointer(tmp_path, keep=1) as ckpt:
        ckpt.save(1, params=params, opt_state=None, rng=None)
        for leaf in jax.tree.leaves(params):
            leaf.delete()
        ckpt.wait_until_finished()
        r = ckpt.restore(abstract_params=nnx.split(SPEC.abstract())[1])
    assert r.step == 1 and all(not leaf.is_deleted() for leaf in jax.tree.leaves(r.params))
    assert_trees_identical(r.params, setup["params"])


def test_training_continues_exactly(setup, tmp_path):
    run, tx = setup["run"], setup["tx"]
    with Checkpointer(tmp_path, keep=2) as ckpt:
        ckpt.save(2, params=setup["params"], opt_state=setup["opt_state"], rng=setup["rng"], meta={})
        straight = run(setup["params"], setup["opt_state"], setup["rng"], 2)
    with Checkpointer(tmp_path, keep=2) as ckpt:  # a new process would do just this
        abstract_params, abstract_opt = abstract_targets(tx)
        r = ckpt.restore(abstract_params=abstract_params, abstract_opt_state=abstract_opt)
    resumed = run(r.params, r.opt_state, r.rng, 2)
    assert_trees_identical(resumed[0], straight[0])
    assert_trees_identical(resumed[1], straight[1])
    assert not np.array_equal(
        np.asarray(jax.tree.leaves(straight[0])[0]), np.asarray(jax.tree.leaves(setup["params"])[0])
    )


def test_wrong_architecture_names_the_parameters(setup, tmp_path):
    with Checkpointer(tmp_path, keep=1, async_save=False) as ckpt:
        ckpt.save(1, params=setup["params"], opt_state=setup["opt_state"], rng=None, model_config=CONFIG)
        wider = dataclasses.replace(CONFIG, intermediate_size=256)
        with pytest.raises(CheckpointMismatchError) as e:
            ckpt.restore(abstract_params=abstract_targets(setup["tx"], wider)[0])
        msg = str(e.value)
        assert "mis-shaped" in msg and "blocks.runs.0.mlp.up_proj.kernel.value: checkpoint (2, 3, 64, 128)" in msg
        assert "target (2, 3, 64, 256)" in msg and "intermediate_size=128" in msg
        untied = dataclasses.replace(CONFIG, tie_word_embeddings=False)
        with pytest.raises(CheckpointMismatchError, match=r"params: missing arrays: lm_head\.kernel\.value"):
            ckpt.restore(abstract_params=abstract_targets(setup["tx"], untied)[0])
        bf16 = nnx.split(ModelSpec(CONFIG, param_dtype=jnp.bfloat16).abstract())[1]
        with pytest.raises(CheckpointMismatchError, match="float32 ≠ target .* bfloat16"):
            ckpt.restore(abstract_params=bf16)


def test_sharded_restore_on_a_one_device_mesh(setup, tmp_path):
    mesh = sharding.make_mesh(data=1, fsdp=1, tensor=1, devices=jax.devices()[:1])
    abstract_params, abstract_opt = abstract_targets(setup["tx"])
    p_shard = sharding.param_shardings(abstract_params, mesh)
    o_shard = sharding.optimizer_shardings(setup["tx"], abstract_opt, p_shard, mesh)
    with_sharding = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)  # noqa: E731
    abstract_params = jax.tree.map(with_sharding, abstract_params, p_shard)
    abstract_opt = jax.tree.map(with_sharding, abstract_opt, o_shard)
    with Checkpointer(tmp_path, keep=1) as ckpt:
        ckpt.save(3, params=setup["params"], opt_state=setup["opt_state"], rng=setup["rng"])
        ckpt.wait_until_finished()
        r = ckpt.restore(abstract_params=abstract_params, abstract_opt_state=abstract_opt)
    wanted = jax.tree.leaves(p_shard) + jax.tree.leaves(o_shard)
    for leaf, s in zip(jax.tree.leaves(r.params) + jax.tree.leaves(r.opt_state), wanted, strict=False):
        assert isinstance(leaf.sharding, jax.sharding.NamedSharding) and leaf.sharding == s
    assert_trees_identical(r.params, setup["params"])
    assert_trees_identical(r.opt_state, setup["opt_state"])


RESHARD_SCRIPT = textwrap.dedent(
    """
    import dataclasses, json, sys
    import jax
    from flax import nnx
    from rltldr_jax import sharding
    from rltldr_jax.checkpoint import Checkpointer
    from rltldr_jax.models import ModelSpec, get_preset
    from rltldr_jax.train.step import make_optimizer

    src, dst = sys.argv[1:3]
    config = dataclasses.replace(get_preset("tiny"), vocab_size=256)
    mesh = sharding.make_mesh(data=1, fsdp=4, tensor=2)
    tx = make_optimizer(1e-2, weight_decay=0.01)
    ap = nnx.split(ModelSpec(config).abstract())[1]
    ao = jax.eval_shape(tx.init, ap)
    ps = sharding.param_shardings(ap, mesh)
    os_ = sharding.optimizer_shardings(tx, ao, ps, mesh)
    put = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
    with Checkpointer(src, keep=1) as ckpt:
        r = ckpt.restore(abstract_params=jax.tree.map(put, ap, ps), abstract_opt_state=jax.tree.map(put, ao, os_))
    leaves = jax.tree.leaves(r.params) + jax.tree.leaves(r.opt_state)
    assert all(x.sharding == s for x, s in zip(leaves, jax.tree.leaves(ps) + jax.tree.leaves(os_)))
    split = sum(x.addressable_shards[0].data.size < x.size for x in leaves)
    with Checkpointer(dst, keep=1) as ckpt:  # a sharded save
        ckpt.save(r.step + 1, params=r.params, opt_state=r.opt_state, rng=r.rng, meta=r.meta,
                  model_config=r.model_config)
    print(json.dumps({"devices": len(jax.devices()), "split_leaves": int(split), "leaves": len(leaves)}))
    """
)


def test_restore_onto_8_device_mesh_and_save_sharded(setup, tmp_path):
    with Checkpointer(tmp_path / "a", keep=1) as ckpt:
        ckpt.save(
            4,
            params=setup["params"],
            opt_state=setup["opt_state"],
            rng=setup["rng"],
            meta={"k": 1},
            model_config=CONFIG,
        )
    script = tmp_path / "reshard.py"
    script.write_text(RESHARD_SCRIPT)
    env = dict(os.environ, XLA_FLAGS=fake_devices_xla_flags(8), JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "a"), str(tmp_path / "b")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    info = json.loads(out.stdout.strip().splitlines()[-1])
    assert info["devices"] == 8 and info["split_leaves"] > info["leaves"] // 2
    with Checkpointer(tmp_path / "b", keep=1) as ckpt:
        abstract_params, abstract_opt = abstract_targets(setup["tx"])
        r = ckpt.restore(abstract_params=abstract_params, abstract_opt_state=abstract_opt)
    assert (r.step, r.meta, r.model_config) == (5, {"k": 1}, CONFIG)
    assert_trees_identical(r.params, setup["params"])
    assert_trees_identical(r.opt_state, setup["opt_state"])


def _load_cli():
    return importlib.import_module("rltldr_jax.cli.export_hf")  # launch/export_hf.py


def test_export_hf_round_trip_and_cli(setup, tmp_path, capsys):
    with Checkpointer(tmp_path / "ckpt", keep=2) as ckpt:
        ckpt.save(2, params=setup["params"], opt_state=setup["opt_state"], rng=setup["rng"], model_config=CONFIG)
        ckpt.save(3, params=setup["params"], opt_state=None, rng=None)  # no model config recorded
    assert export_hf(tmp_path / "ckpt", 2, tmp_path / "hf32", dtype=jnp.float32) == 2
    loaded = nnx.split(load_pretrained(tmp_path / "hf32"))[1]
    assert_trees_identical(loaded, setup["params"])
    fwd = jax.jit(lambda state, ids: nnx.merge(setup["graphdef"], state)(ids))
    ids = jax.random.randint(jax.random.key(0), (2, 12), 0, CONFIG.vocab_size, dtype=jnp.int32)
    np.testing.assert_array_equal(fwd(jax.device_put(loaded, jax.devices()[0]), ids), fwd(setup["params"], ids))

    # The CLI (bf16 default, architecture from the checkpoint) in a fresh process.
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "export_hf.py"),
            f"--checkpoint={tmp_path / 'ckpt'}",
            "--step=2",
            f"--out={tmp_path / 'hf16'}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "exported step 2" in out.stdout
    with open(tmp_path / "hf16" / "config.json") as f:
        assert json.load(f)["dtype"] == "bfloat16"
    loaded16 = nnx.split(load_pretrained(tmp_path / "hf16"))[1]
    assert_trees_identical(loaded16, jax.tree.map(lambda x: x.astype(jnp.bfloat16), setup["params"]))

    # Errors, in-process: no directory, no step, no recorded architecture, a disagreeing architecture.
    cli = _load_cli()
    cases = [
        ([f"--checkpoint={tmp_path / 'nope'}"], "no checkpoint directory"),
        ([f"--checkpoint={tmp_path / 'ckpt'}", "--step=9"], r"no checkpoint for step 9 .*steps: \[2, 3\]"),
        ([f"--checkpoint={tmp_path / 'ckpt'}"], "records no model config"),  # latest = 3
        ([f"--checkpoint={tmp_path / 'ckpt'}", "--step=2", "--preset=tiny"], "vocab_size: given 248320, saved 256"),
        (
            [f"--checkpoint={tmp_path / 'ckpt'}", "--preset=tiny"],
            r"mis-shaped arrays: embed_tokens\.embedding\.value: checkpoint \(256,",
        ),
    ]
    for args, pattern in cases:
        assert cli.main([*args, f"--out={tmp_path / 'x'}"]) == 2
        err = capsys.readouterr().err
        assert "export_hf: error:" in err
        assert re.search(pattern, err.replace("\n", " ")), err
    # With --config_json the un-recorded step 3 exports.
    assert (
        cli.main(
            [f"--checkpoint={tmp_path / 'ckpt'}", f"--config_json={tmp_path / 'hf32'}", f"--out={tmp_path / 'hf3'}"]
        )
        == 0
    )
    assert os.path.isfile(tmp_path / "hf3" / "model.safetensors")


# ----------------------------------------------------------------------------------------------------
# Corrupt files, failed saves, relative paths
# ----------------------------------------------------------------------------------------------------


def _hf_dir(setup, path):
    """An HF directory (single model.safetensors) of the setup's parameters."""
    save_pretrained(nnx.merge(setup["graphdef"], setup["params"]), path)
    return path


def test_corrupt_safetensors_are_one_clear_error(setup, tmp_path):
    good = _hf_dir(setup, tmp_path / "hf")
    raw = (good / "model.safetensors").read_bytes()
    truncated = _hf_dir(setup, tmp_path / "truncated")
    (truncated / "model.safetensors").write_bytes(raw[: len(raw) // 2])
    garbled = _hf_dir(setup, tmp_path / "garbled")
    (garbled / "model.safetensors").write_bytes(raw[:8] + b"\x00garbled{" + raw[17:])  # the JSON header
    for path, why in ((truncated, "incomplete metadata"), (garbled, "invalid JSON")):
        with pytest.raises(
            CorruptCheckpointError,
            match=rf"{re.escape(str(path / 'model.safetensors'))} is not a readable safetensors file .*{why}",
        ):
            load_pretrained(path)
        with pytest.raises(CorruptCheckpointError, match="truncated or damaged"):  # the analyses' path (Δθ, load_model)
            load_model(str(path))

    # NaN weights: refused, naming the file, the tensor and the count, unless allowed.
    nan = _hf_dir(setup, tmp_path / "nan")
    with safe_open(str(nan / "model.safetensors"), framework="numpy") as f:
        tensors = {k: np.array(f.get_tensor(k)) for k in f.keys()}
    tensors["model.norm.weight"][:3] = [np.nan, np.inf, np.nan]
    save_file(tensors, str(nan / "model.safetensors"))
    with pytest.raises(
        CorruptCheckpointError, match=r"model\.safetensors: tensor model\.norm\.weight holds 3 NaN/inf values of 64"
    ):
        load_pretrained(nan)
    model = load_pretrained(nan, allow_nonfinite=True)
    assert int(np.isnan(np.asarray(model.norm.weight[...])).sum()) == 2


def _orbax_data_files(step_dir):
    """The OCDBT data files of a checkpoint step's params, largest first."""
    files = [
        os.path.join(d, f)
        for d, _, fs in os.walk(step_dir / "params")
        for f in fs
        if os.sep + "d" + os.sep in os.path.join(d, f)
    ]
    return sorted(files, key=os.path.getsize, reverse=True)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax's reads orphaned by the error
def test_corrupt_orbax_checkpoints_are_one_clear_error(setup, tmp_path, capsys):
    abstract_params, abstract_opt = abstract_targets(setup["tx"])
    for name in ("truncated", "overwritten"):
        with Checkpointer(tmp_path / name, keep=None, async_save=False) as ckpt:
            ckpt.save(1, params=setup["params"], opt_state=setup["opt_state"], rng=None, model_config=CONFIG)
    data = _orbax_data_files(tmp_path / "truncated" / "1")[0]
    with open(data, "r+b") as f:
        f.truncate(os.path.getsize(data) // 2)
    data = _orbax_data_files(tmp_path / "overwritten" / "1")[0]
    with open(data, "r+b") as f:
        for at in range(os.path.getsize(data) // 8, os.path.getsize(data) - 64, os.path.getsize(data) // 8):
            f.seek(at)
            f.write(b"\xff" * 64)  # bytes overwritten in a few places
    with Checkpointer(tmp_path / "truncated", keep=None, create=False) as ckpt:
        with pytest.raises(
            CorruptCheckpointError,
            match=r"checkpoint step 1 in .*truncated.*: cannot read its arrays \(.*Error reading",
        ):
            ckpt.restore(abstract_params=abstract_params, abstract_opt_state=abstract_opt)
    with Checkpointer(tmp_path / "overwritten", keep=None, create=False) as ckpt:  # the checksums catch garbage
        with pytest.raises(
            CorruptCheckpointError,
            match=r"checkpoint step 1 in .*overwritten.*(cannot read|is corrupt: .* differ from the checksums)",
        ):
            ckpt.restore(abstract_params=abstract_params, abstract_opt_state=abstract_opt)

    # NaN values: refused on restore, export and load_model, naming the arrays, unless allowed.
    _, params = random_params()
    params = jax.tree_util.tree_map_with_path(
        lambda p, x: x * np.nan if "norm" in jax.tree_util.keystr(p) else x, params
    )
    with Checkpointer(tmp_path / "nan", keep=None, async_save=False) as ckpt:
        ckpt.save(1, params=params, opt_state=None, rng=None, model_config=CONFIG)
        with pytest.raises(CorruptCheckpointError, match=r"step 1 .* holds NaN/inf in \d+ arrays \(.*norm"):
            ckpt.restore(abstract_params=abstract_params)
        assert np.isnan(
            np.asarray(
                ckpt.restore(abstract_params=abstract_params, allow_nonfinite=True).params["norm"]["weight"][...]
            )
        ).all()
    with pytest.raises(CorruptCheckpointError, match="holds NaN/inf"):
        load_model(str(tmp_path / "nan"))
    cli = _load_cli()
    assert cli.main([f"--checkpoint_dir={tmp_path / 'nan'}", f"--out={tmp_path / 'hf_nan'}"]) == 2  # (its old name)
    assert re.search(r"export_hf: error: checkpoint step 1 .* holds NaN/inf", capsys.readouterr().err)
    assert not os.path.exists(tmp_path / "hf_nan")
    assert cli.main([f"--checkpoint={tmp_path / 'nan'}", f"--out={tmp_path / 'hf_nan'}", "--allow_nonfinite"]) == 0
    gc.collect()  # orbax's reads orphaned by the damaged files end here (their warning is filtered), not later


def _failing_writes(monkeypatch):
    """Every later save's background commit fails as on a full disk (a real full disk is not available in tests)."""
    import orbax.checkpoint as ocp

    class Full:
        def result(self, timeout=None):
            raise OSError(errno.ENOSPC, "No space left on device")

    original = ocp.StandardCheckpointHandler.async_save

    async def async_save(self, directory, *args, **kwargs):
        return [*(await original(self, directory, *args, **kwargs) or []), Full()]

    monkeypatch.setattr(ocp.StandardCheckpointHandler, "async_save", async_save)


def test_failed_save_is_reported_and_cleaned_up(setup, tmp_path, monkeypatch):
    params, opt = setup["params"], setup["opt_state"]
    ckpt = Checkpointer(tmp_path, keep=3)
    ckpt.save(1, params=params, opt_state=opt, rng=None)
    ckpt.wait_until_finished()
    with monkeypatch.context() as m:
        _failing_writes(m)
        ckpt.save(2, params=params, opt_state=opt, rng=None)  # returns; the write fails in the background
        while ckpt.saving():
            time.sleep(0.05)
        with pytest.raises(
            CheckpointSaveError,
            match=r"saving checkpoint step 2 in .* failed \(OSError: \[Errno 28\] No space left on device\); the newest saved checkpoint is step 1",  # noqa: E501
        ):
            ckpt.check_saved()
    assert sorted(os.listdir(tmp_path)) == ["1"]  # the temporary directory is gone
    ckpt.check_saved(wait=True)  # reported once
    # Free space below the checkpoint's size (params + optimizer state bytes, plus the margin): refused before
    # anything is written; exactly enough: saved.
    nbytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves((params, opt)))
    assert tree_bytes(params, opt) == nbytes > 500_000
    need = int(nbytes * (1 + SPACE_MARGIN)) + SPACE_SLACK_BYTES
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 * need, 9 * need, need - 1))
    with pytest.raises(
        CheckpointSaveError, match=r"not enough free space to save checkpoint step 3 .* it needs about 0.02 GiB"
    ):
        ckpt.save(3, params=params, opt_state=opt, rng=None)
    assert sorted(os.listdir(tmp_path)) == ["1"]
    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10 * need, 9 * need, need))
    ckpt.save(3, params=params, opt_state=opt, rng=None)
    ckpt.close()
    assert sorted(os.listdir(tmp_path)) == ["1", "3"]


def test_relative_checkpoint_directory(setup, tmp_path, monkeypatch):
    """orbax needs absolute paths: a relative directory works (and means the directory it names now)."""
    monkeypatch.chdir(tmp_path)
    with Checkpointer(os.path.join("run", "checkpoints"), keep=1) as ckpt:
        ckpt.save(1, params=setup["params"], opt_state=None, rng=None)
    monkeypatch.chdir(ROOT)
    with Checkpointer(tmp_path / "run" / "checkpoints", keep=1, create=False) as ckpt:
        assert ckpt.all_steps() == [1]
