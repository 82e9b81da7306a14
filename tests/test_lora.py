"""LoRA adapters on the Flax Qwen 3.5 (rltldr_jax/models/lora.py): attached with B = 0 they leave the logits exactly
as they were; merged they give the adapted logits; targets choose the layers; a train step moves the adapters alone
(gradients and optimizer state for them only, the base bitwise unchanged); `model.lora.*` is validated before
anything is built; a tiny LoRA run resumes exactly."""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import step_example, tiny_config, tiny_run_settings

from rltldr_jax.config import base
from rltldr_jax.models import ModelSpec, get_preset, lora
from rltldr_jax.sharding import MeshConfig
from rltldr_jax.train.batching import pack
from rltldr_jax.train.setup import ShardedUpdate
from rltldr_jax.train.step import LossConfig, make_optimizer

T = 16


def _model():
    """A 4-layer tiny Qwen 3.5 (3 DeltaNet + 1 attention layer), 256-token vocabulary."""
    return ModelSpec(
        dataclasses.replace(get_preset("tiny"), vocab_size=256, num_hidden_layers=4, layer_types=())
    ).build(seed=0)


IDS = (jnp.arange(2 * T, dtype=jnp.int32).reshape(2, T) * 7 + 3) % 256


def _perturb(model, scale: float = 0.05) -> None:
    """Random adapters (B ≠ 0), as after training."""
    state = lora.adapter_state(model)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(state))))
    nnx.update(model, jax.tree.map(lambda x: x + scale * jax.random.normal(next(keys), x.shape, x.dtype), state))


def test_attached_adapters_change_nothing_until_trained_and_merge_exactly():
    model = _model()
    before = model(IDS)
    lora.attach(model, lora.LoraSpec(rank=4, alpha=8.0), seed=3)
    np.testing.assert_array_equal(np.asarray(model(IDS)), np.asarray(before))  # B = 0
    # every projection of the 4 layers: per DeltaNet layer 5, per attention layer 4, per MLP 3 (stacked: 3 + 1 runs)
    paths = [p for p, m in lora.linear_layers(model) if m.lora is not None]
    assert len(paths) == 5 + 4 + 3 + 3 and not any("lm_head" in p for p in paths)
    q = next(m for p, m in lora.linear_layers(model) if p.endswith("self_attn/q_proj"))
    assert q.lora.lora_a.shape == (*q.kernel.shape[:-1], 4) and q.lora.lora_b.shape == (1, 1, 4, q.kernel.shape[-1])
    assert q.lora_scale == 2.0
    # rank 4 over a [64, 256] kernel: 4 · (64 + 256) per layer
    assert lora.adapter_count(model) == sum(
        int(np.prod(m.kernel.shape[:-2])) * 4 * sum(m.kernel.shape[-2:]) for _, m in lora.linear_layers(model)
    )
    _perturb(model)
    adapted = np.asarray(model(IDS))
    assert np.max(np.abs(adapted - np.asarray(before))) > 1e-2
    plain = lora.merged(model)
    assert not lora.has_adapters(plain) and lora.has_adapters(model)  # (a copy: the trained model keeps them)
    np.testing.assert_allclose(np.asarray(plain(IDS)), adapted, atol=2e-5)
    # merged by hand for one layer: W + (α/r)·A·B
    a, b = np.asarray(q.lora.lora_a[...]), np.asarray(q.lora.lora_b[...])
    q_plain = next(m for p, m in lora.linear_layers(plain) if p.endswith("self_attn/q_proj"))
    np.testing.assert_allclose(np.asarray(q_plain.kernel[...]), np.asarray(q.kernel[...]) + 2.0 * a @ b, rtol=1e-6)


def test_targets_choose_the_layers_and_bad_ones_are_one_line():
    model = lora.attach(_model(), lora.LoraSpec(rank=2, targets=(r"self_attn/(q_proj|v_proj)$",)))
    assert sorted(p.rsplit("/", 1)[-1] for p, m in lora.linear_layers(model) if m.lora is not None) == [
        "q_proj",
        "v_proj",
    ]
    with pytest.raises(ValueError, match="match no linear layer: the layers are down_proj, gate_proj"):
        lora.attach(_model(), lora.LoraSpec(rank=2, targets=("qproj",)))
    with pytest.raises(ValueError, match="holds LoRA adapters already"):
        lora.attach(model, lora.LoraSpec(rank=2))
    assert lora.parse_targets("") == lora.DEFAULT_TARGETS
    assert lora.parse_targets(" q_proj$ , mlp/ ") == ("q_proj$", "mlp/")
    with pytest.raises(base.ConfigError, match=r"model.lora.targets: '\(q_proj' is not a regular expression"):
        tiny_config({"model.lora.rank": 8, "model.lora.targets": "(q_proj"})
    with pytest.raises(base.ConfigError, match=r"model.lora.dropout=0.1 without adapters \(model.lora.rank=0\)"):
        tiny_config({"model.lora.dropout": 0.1})
    tiny_config({"model.lora.rank": 8, "model.lora.dropout": 0.1})
    tiny_config({"model.lora.targets": "(q_proj"})  # (rank 0: no adapters, nothing to check)


def test_a_train_step_moves_the_adapters_alone():
    model = lora.attach(_model(), lora.LoraSpec(rank=4))
    _perturb(model)  # (B ≠ 0: A gets a gradient too)
    update = ShardedUpdate(MeshConfig(), model, make_optimizer(1e-2), LossConfig(lam=0.5), micro_batch_size=1)
    adapters = {k for k, v in nnx.to_flat_state(update.params) if isinstance(v, nnx.LoRAParam)}
    before = {k: np.array(v[...]) for k, v in nnx.to_flat_state(update.params)}
    # AdamW's two moments per adapter, and a step count: nothing for the base
    moments = [x for x in jax.tree.leaves(update.opt_state) if np.ndim(x) > 0]
    assert len(moments) == 2 * len(adapters) and len(adapters) == 2 * 15
    (batch,) = pack([step_example(1.0), step_example(-1.0)], micro_batch_size=1, grad_accum_steps=2, pad_to_multiple=T)
    metrics = update.step(batch)
    assert float(metrics["skipped_nonfinite"]) == 0.0 and float(metrics["grad_norm"]) > 0
    after = {k: np.array(v[...]) for k, v in nnx.to_flat_state(update.params)}
    assert set(after) == set(before)
    for k in before:
        if k in adapters:
            assert not np.array_equal(after[k], before[k]), k
        else:
            np.testing.assert_array_equal(after[k], before[k])
    # what engines get: a plain model with the trained adapters merged in
    policy = update.model()
    assert not lora.has_adapters(policy)
    np.testing.assert_allclose(
        np.asarray(policy(IDS)), np.asarray(nnx.merge(update.graphdef, update.params)(IDS)), atol=2e-5
    )


def _host(tree) -> list[np.ndarray]:
    return [np.array(x) for x in jax.tree.leaves(tree)]


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory):
    """A tiny LoRA run (rank 8, adapter dropout 0.1) of two phases, and the same run stopped after one phase and
    resumed: their workdirs, the first run's parameters before and after, and both runs' final parameters and
    optimizer states. (With dropout, so that resuming also restores the step number its masks are drawn from.)"""
    from rltldr_jax.train.loop import Trainer

    tmp = tmp_path_factory.mktemp("lora_runs")
    overrides = {"model.lora.rank": 8, "model.lora.alpha": 16.0, "model.lora.dropout": 0.1}
    out = {"ref": str(tmp / "ref"), "run": str(tmp / "run")}
    ref = Trainer(tiny_run_settings(out["ref"], 2, overrides))
    try:
        out["start"] = {k: np.array(v[...]) for k, v in nnx.to_flat_state(ref.update.params)}
        ref.run_phase()
        ref.run_phase()
        out["ref_state"] = _host(ref.update.params) + _host(ref.update.opt_state)
        out["final"] = {k: np.array(v[...]) for k, v in nnx.to_flat_state(ref.update.params)}
    finally:
        ref.close()
    stopped = Trainer(tiny_run_settings(out["run"], 1, overrides))
    try:
        stopped.run_phase()
    finally:
        stopped.close()
    resumed = Trainer(tiny_run_settings(out["run"], 2, overrides), resume=True)
    try:
        out["resumed_phase"] = resumed.phase
        resumed.run_phase()
        out["run_state"] = _host(resumed.update.params) + _host(resumed.update.opt_state)
    finally:
        resumed.close()
    return out


@pytest.mark.slow  # with the other users of `lora_runs`: ~130 CPU s
def test_a_tiny_lora_run_checkpoints_and_resumes_exactly(lora_runs):
    """Two phases in one run vs one phase, then a resumed one: the same adapters and optimizer state, bit for bit;
    only the adapters moved."""
    moved = {k for k in lora_runs["start"] if not np.array_equal(lora_runs["start"][k], lora_runs["final"][k])}
    assert moved and all("lora" in k for k in moved)
    assert lora_runs["resumed_phase"] == 1
    for a, b in zip(lora_runs["run_state"], lora_runs["ref_state"], strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.slow  # reads `lora_runs` (slow)
def test_a_lora_runs_checkpoint_exports_as_adapter_or_merged_and_trains_on(lora_runs, tmp_path):
    """export_hf of a LoRA run: refused without --adapter/--merge; a PEFT adapter that, as model.checkpoint over its
    base (model.base_checkpoint), gives the run's policy (adapters kept at the same rank, merged at rank 0); merged
    full weights with the same logits."""
    from rltldr_jax.checkpoint import export_hf, restore_model
    from rltldr_jax.models import load_pretrained, save_pretrained
    from rltldr_jax.train.setup import build_policy

    ckpts = os.path.join(lora_runs["ref"], "checkpoints")
    step, trained = restore_model(ckpts, compute_dtype=jnp.float32)
    assert lora.has_adapters(trained)
    logits = np.asarray(trained(IDS % 200))
    with pytest.raises(ValueError, match="holds LoRA adapters: export them as a PEFT adapter"):
        export_hf(ckpts, None, tmp_path / "x")
    assert export_hf(ckpts, None, tmp_path / "adapter", adapter="peft") == step
    assert export_hf(ckpts, None, tmp_path / "merged", adapter="merge", dtype=jnp.float32) == step
    merged_model = load_pretrained(str(tmp_path / "merged"), compute_dtype=jnp.float32)
    np.testing.assert_allclose(np.asarray(merged_model(IDS % 200)), logits, atol=1e-4)
    save_pretrained(lora.without_adapters(trained), tmp_path / "base", dtype=jnp.float32)

    def policy(rank: int):
        overrides = {
            "model.checkpoint": str(tmp_path / "adapter"),
            "model.base_checkpoint": str(tmp_path / "base"),
            "model.lora.rank": rank,
            "model.dtype": "float32",
        }
        return build_policy(tiny_run_settings(str(tmp_path / "w"), 1, overrides))

    again = policy(8)
    assert lora.has_adapters(again) and lora.adapter_count(again) == lora.adapter_count(trained)
    np.testing.assert_allclose(np.asarray(again(IDS % 200)), logits, atol=1e-5)
    full = policy(0)
    assert not lora.has_adapters(full)
    np.testing.assert_allclose(np.asarray(full(IDS % 200)), logits, atol=1e-4)
    with pytest.raises(ValueError, match="model.lora.rank=4 but the adapter .* has rank 8"):
        policy(4)


@pytest.mark.slow  # reads `lora_runs` (slow)
def test_delta_theta_reads_a_lora_checkpoint_as_the_policy_it_trained(lora_runs, tmp_path):
    """Δθ of a LoRA run (analysis/delta_theta.py): its orbax checkpoint reads tensor for tensor as its merged export,
    and against its base, Δθ is the adapters' update, in the adapted layers only."""
    from rltldr_jax.analysis.delta_theta import compare, open_checkpoint
    from rltldr_jax.checkpoint import export_hf, restore_model
    from rltldr_jax.models import save_pretrained

    ckpts = os.path.join(lora_runs["ref"], "checkpoints")
    export_hf(ckpts, None, tmp_path / "merged", adapter="merge", dtype=jnp.float32)
    _, trained = restore_model(ckpts, compute_dtype=jnp.float32)
    save_pretrained(lora.without_adapters(trained), tmp_path / "base", dtype=jnp.float32)
    with open_checkpoint(ckpts) as ours, open_checkpoint(str(tmp_path / "merged")) as merged:
        assert [t.name for t in ours.tensors] == [t.name for t in merged.tensors]
        for t in ours.tensors:
            np.testing.assert_allclose(ours.read(t.name), merged.read(t.name), rtol=0, atol=1e-6, err_msg=t.name)
    report = compare(str(tmp_path / "base"), ckpts)
    reference = compare(str(tmp_path / "base"), str(tmp_path / "merged"))
    for kind, stats in report.by_kind.items():
        assert stats.n == reference.by_kind[kind].n
        assert stats.l2sq == pytest.approx(reference.by_kind[kind].l2sq, rel=1e-5, abs=1e-12), kind
    assert report.by_kind["embeddings"].l2sq == 0 and report.by_kind["norms"].l2sq == 0
    assert report.by_kind["attention"].l2sq > 0 and report.by_kind["mlp"].l2sq > 0


@pytest.mark.slow  # reads `lora_runs` (slow)
def test_the_export_launcher_writes_adapters_and_says_what_it_wrote(lora_runs, tmp_path, capsys):
    from rltldr_jax.cli import export_hf

    ckpts = os.path.join(lora_runs["ref"], "checkpoints")
    assert export_hf.main([f"--checkpoint={ckpts}", f"--out={tmp_path / 'a'}", "--adapter"]) == 0
    assert capsys.readouterr().out.strip().endswith(f"to {tmp_path / 'a'} (PEFT adapter, float32)")
    assert sorted(os.listdir(tmp_path / "a")) == sorted(  # with the run's tokenizer (tests/test_export_roundtrip.py)
        [lora.ADAPTER_CONFIG, lora.ADAPTER_WEIGHTS, "tokenizer.json", "tokenizer_config.json"]
    )
    assert export_hf.main([f"--checkpoint={ckpts}", f"--out={tmp_path / 'b'}"]) == 2
    assert "holds LoRA adapters: export them as a PEFT adapter (--adapter)" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        export_hf.parse_args(["--checkpoint=x", "--out=y", "--adapter", "--merge"])


def test_an_exported_adapter_loads_in_peft_with_our_logits_and_back(tmp_path):
    """save_adapter → transformers' Qwen 3.5 + peft: the same logits (fp32, ≤ 1e-4); load_adapter reads it back onto
    our base exactly."""
    import peft
    import torch
    import transformers

    from rltldr_jax.models import load_pretrained, save_pretrained

    model = _model()
    save_pretrained(model, tmp_path / "base", dtype=jnp.float32)
    lora.attach(model, lora.LoraSpec(rank=4, alpha=8.0), seed=3)
    _perturb(model, 0.1)
    ours = np.asarray(model(IDS))
    modules = lora.save_adapter(model, tmp_path / "adapter", base_model=str(tmp_path / "base"))
    # 3 DeltaNet layers × 5 projections + 1 attention layer × 4 + 4 MLPs × 3, by their HF names
    assert (
        len(modules) == 31 and "model.layers.3.self_attn.q_proj" in modules and "model.layers.2.mlp.up_proj" in modules
    )
    assert oct(os.stat(tmp_path / "adapter" / lora.ADAPTER_WEIGHTS).st_mode & 0o777) == "0o644"
    with pytest.raises(ValueError, match="model holds no LoRA adapters"):
        lora.save_adapter(_model(), tmp_path / "none")

    base = transformers.Qwen3_5ForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32).eval()
    peft_model = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()
    with torch.no_grad():
        theirs = peft_model(torch.tensor(np.asarray(IDS), dtype=torch.long)).logits.numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-4)

    again = lora.load_adapter(load_pretrained(str(tmp_path / "base"), compute_dtype=jnp.float32), tmp_path / "adapter")
    np.testing.assert_allclose(np.asarray(again(IDS)), ours, atol=1e-5)
    for (_, a), (_, b) in zip(lora.linear_layers(again), lora.linear_layers(model), strict=True):
        if b.lora is not None:
            np.testing.assert_array_equal(np.asarray(a.lora.lora_b[...]), np.asarray(b.lora.lora_b[...]))
            assert a.lora_scale == b.lora_scale
    with pytest.raises(ValueError, match="holds LoRA adapters already"):
        lora.load_adapter(again, tmp_path / "adapter")
    # a plain HF export of a model with adapters is refused: merge them, or save the adapter
    with pytest.raises(ValueError, match="holds LoRA adapters"):
        save_pretrained(model, tmp_path / "full")
    save_pretrained(lora.merged(model), tmp_path / "full", dtype=jnp.float32)
    full = transformers.Qwen3_5ForCausalLM.from_pretrained(tmp_path / "full", dtype=torch.float32).eval()
    with torch.no_grad():
        np.testing.assert_allclose(full(torch.tensor(np.asarray(IDS))).logits.numpy(), ours, atol=1e-4)


def test_the_sync_benchmark_pushes_the_same_policy_both_ways(monkeypatch, tmp_path):
    """benchmarks/lora_sync.py at the tiny preset: both pushes run and the adapter is the smaller file (no timing is
    asserted); what a server ends with is the same policy either way."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    monkeypatch.syspath_prepend(os.path.join(root, "benchmarks"))  # (the benchmarks import `common` as scripts)
    import lora_sync

    r = lora_sync.measure("tiny", 4, 1, str(tmp_path))
    assert r["adapter_bytes"] < r["full_bytes"] and all(r[k] > 0 for k in ("export_full_s", "load_adapter_s"))
    from rltldr_jax.models import load_pretrained

    full = load_pretrained(str(tmp_path / "full"), compute_dtype=jnp.float32)
    base = load_pretrained(str(tmp_path / "base"), compute_dtype=jnp.float32)
    adapted = lora.load_adapter(base, tmp_path / "adapter")
    # (bf16 weights: the merged export rounds W + ΔW once, the adapter path adds ΔW to the rounded W)
    np.testing.assert_allclose(np.asarray(adapted(IDS % 200)), np.asarray(full(IDS % 200)), atol=0.05)
