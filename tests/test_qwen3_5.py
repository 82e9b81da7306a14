"""Qwen 3.5 in Flax NNX against transformers' Qwen3_5ForCausalLM on tiny random checkpoints made here."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from rltldr_jax.models import Qwen35Config, get_preset, init_decode_state, load_pretrained, save_pretrained
from rltldr_jax.models.hf import CheckpointError
from rltldr_jax.models.qwen3_5 import sequence_logprobs, unroll

torch = pytest.importorskip("torch")
import transformers  # noqa: E402

T = 150  # longer than one delta-rule chunk (64) and not a multiple of it

HF_TINY = dict(
    vocab_size=256,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=8,  # 2 blocks of (3 × DeltaNet, 1 × attn)
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=32,  # GQA 2
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=16,
    linear_value_head_dim=16,  # grouped v heads
    linear_conv_kernel_dim=4,
    rms_norm_eps=1e-6,
    tie_word_embeddings=False,
    rope_parameters={
        "rope_type": "default",
        "rope_theta": 1e7,
        "partial_rotary_factor": 0.25,
        "mrope_section": [2, 1, 1],
        "mrope_interleaved": True,
    },
)


def _perturbed_hf_model(seed: int = 0, **overrides):
    """A tiny random HF model whose norm weights, decays and biases are all perturbed away from their init."""
    torch.manual_seed(seed)
    cfg = transformers.Qwen3_5TextConfig(**{**HF_TINY, **overrides})
    model = transformers.Qwen3_5ForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight") and "linear_attn" not in name:  # zero-centred: 1 + w
                p.normal_(0.0, 0.3)
            elif name.endswith("linear_attn.norm.weight"):
                p.uniform_(0.5, 1.5)
            elif name.endswith(("A_log", "dt_bias")):
                p.uniform_(-1.0, 1.0)
            elif name.endswith("embed_tokens.weight"):
                p.normal_(0.0, 1.0)
            elif name == "lm_head.weight":
                p.normal_(0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    model = _perturbed_hf_model()
    path = tmp_path_factory.mktemp("hf_tiny")
    model.save_pretrained(path)
    return model, str(path)


@pytest.fixture(scope="module")
def ours(hf_checkpoint):
    return load_pretrained(hf_checkpoint[1])


@pytest.fixture(scope="module")
def ids():
    return np.random.default_rng(0).integers(0, HF_TINY["vocab_size"], size=(2, T)).astype(np.int32)


# One jitted forward (and one decode step) for every test: the jit cache is shared across models of one structure.
_forward = jax.jit(lambda model, x: model(x))
_step = jax.jit(lambda model, x, state, valid: model(x, state=state, valid=valid))


@pytest.fixture(scope="module")
def full_logits(ours, ids):
    """Our logits on the whole [2, T] batch; a causal model's logits on any prefix are a prefix of these."""
    return np.asarray(_forward(ours, ids))


def _hf_logits(model, ids) -> np.ndarray:
    with torch.no_grad():
        return model(torch.from_numpy(ids.astype(np.int64))).logits.float().numpy()


def test_logits_match_transformers(hf_checkpoint, full_logits, ids):
    model, _ = hf_checkpoint
    ref = _hf_logits(model, ids)
    got = full_logits
    assert got.shape == (2, T, 256) and got.dtype == np.float32
    assert np.abs(got - ref).max() <= 1e-4, np.abs(got - ref).max()
    assert np.abs(ref).max() > 1.0  # the check is not trivially satisfied by near-zero logits


def test_vlm_layout_with_sharded_index(hf_checkpoint, full_logits, ids, tmp_path):
    """The released layout: model.language_model.*, plus vision and MTP tensors that are skipped, in 2 shards."""
    _, path = hf_checkpoint
    tensors = {
        ("lm_head.weight" if k == "lm_head.weight" else k.replace("model.", "model.language_model.", 1)): v
        for k, v in load_file(os.path.join(path, "model.safetensors")).items()
    }
    tensors["model.visual.blocks.0.attn.qkv.weight"] = np.zeros((3, 3), np.float32)
    tensors["mtp.fc.weight"] = np.zeros((2, 2), np.float32)
    names = sorted(tensors)
    half = len(names) // 2
    shards = {
        "model.safetensors-00001-of-00002.safetensors": names[:half],
        "model.safetensors-00002-of-00002.safetensors": names[half:],
    }
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, tmp_path / file)
    index = {"metadata": {}, "weight_map": {k: f for f, keys in shards.items() for k in keys}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    text_config = json.load(open(os.path.join(path, "config.json")))
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "model_type": "qwen3_5",
                "architectures": ["Qwen3_5ForConditionalGeneration"],
                "text_config": text_config,
                "vision_config": {},
            }
        )
    )
    vlm = load_pretrained(tmp_path)
    np.testing.assert_array_equal(np.asarray(_forward(vlm, ids)), full_logits)


def test_round_trip_is_bit_exact(hf_checkpoint, tmp_path, ids):
    model, path = hf_checkpoint
    original = load_file(os.path.join(path, "model.safetensors"))
    save_pretrained(load_pretrained(path), tmp_path / "out", max_shard_bytes=200_000)  # forces several shards
    assert (tmp_path / "out" / "model.safetensors.index.json").exists()
    index = json.load(open(tmp_path / "out" / "model.safetensors.index.json"))["weight_map"]
    written = {}
    for file in set(index.values()):
        written.update(load_file(tmp_path / "out" / file))
    assert set(written) == set(original)
    for name, tensor in original.items():
        assert written[name].dtype == tensor.dtype and written[name].shape == tensor.shape, name
        np.testing.assert_array_equal(written[name].view(np.uint8), tensor.view(np.uint8), err_msg=name)
    # transformers itself loads what we wrote and computes the same logits.
    reloaded = transformers.Qwen3_5ForCausalLM.from_pretrained(tmp_path / "out", dtype=torch.float32).eval()
    np.testing.assert_array_equal(_hf_logits(reloaded, ids[:, :32]), _hf_logits(model, ids[:, :32]))


def test_bf16_path(hf_checkpoint, ours, ids):
    """bf16 parameters and activations vs the fp32 reference: the tolerance is bf16's (8 bits of mantissa)."""
    model, path = hf_checkpoint
    ref = _hf_logits(model, ids)
    ours_bf16 = load_pretrained(path, dtype=jnp.bfloat16, compute_dtype=jnp.bfloat16)
    got = np.asarray(_forward(ours_bf16, ids))
    hf_bf16 = _hf_logits(model.to(torch.bfloat16), ids)
    model.to(torch.float32)
    scale = np.abs(ref).max()
    err_ours, err_hf = np.abs(got - ref).max() / scale, np.abs(hf_bf16 - ref).max() / scale
    # Measured: ours ≈ HF's own bf16 error (both ~1e-2 relative to the logit range); allow 2× HF's.
    assert err_ours <= max(2 * err_hf, 2e-2), (err_ours, err_hf)
    assert (np.argmax(got, -1) == np.argmax(ref, -1)).mean() > 0.9


@pytest.mark.parametrize("unrolled", [False, True])
def test_decode_equals_full_forward(ours, ids, full_logits, unrolled):
    """Prefill then one token at a time equals the full forward (HF's logits); also for the engine's unrolled twin
    (one weight array per layer, [out, in] kernels)."""
    model = unroll(ours) if unrolled else ours
    state = init_decode_state(ours.config, batch=2, max_len=96)
    logits, state = _step(model, ids[:, :70], state, None)  # prefill 70 (> one delta-rule chunk)
    np.testing.assert_allclose(np.asarray(logits), full_logits[:, :70], atol=1e-4)
    for t in range(70, 80):  # then one token at a time
        logits, state = _step(model, ids[:, t : t + 1], state, None)
        np.testing.assert_allclose(np.asarray(logits[:, 0]), full_logits[:, t], atol=1e-4, err_msg=f"token {t}")
    assert state.lengths.tolist() == [80, 80]


def test_ragged_prefill_with_padding(ours, ids, full_logits):
    """Rows with different prompt lengths in one right-padded prefill, then decoding, match the full forward."""
    lengths = [37, 65]
    padded = np.zeros((2, 70), np.int32)
    valid = np.zeros((2, 70), bool)
    for r, n in enumerate(lengths):
        padded[r, :n] = ids[r, :n]
        valid[r, :n] = True
    state = init_decode_state(ours.config, batch=2, max_len=96)
    logits, state = _step(ours, padded, state, valid)
    assert state.lengths.tolist() == lengths
    nxt = np.array([[ids[0, 37]], [ids[1, 65]]], np.int32)
    step_logits, state = _step(ours, nxt, state, None)
    for r, n in enumerate(lengths):
        np.testing.assert_allclose(np.asarray(logits[r, :n]), full_logits[r, :n], atol=1e-4)
        np.testing.assert_allclose(np.asarray(step_logits[r, 0]), full_logits[r, n], atol=1e-4)


def test_sequence_logprobs_and_entropy(ours, ids, full_logits):
    lp, ent = jax.jit(lambda m, x: sequence_logprobs(m, x, chunk=64))(ours, ids)  # 149 positions: 3 chunks, padded
    logits = full_logits.astype(np.float64)
    top = logits.max(-1, keepdims=True)
    logp = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    expected = np.take_along_axis(logp[:, :-1], ids[:, 1:, None], -1)[..., 0]
    np.testing.assert_allclose(np.asarray(lp)[:, 1:], expected, atol=1e-5)
    assert np.all(np.asarray(lp)[:, 0] == 0)
    np.testing.assert_allclose(np.asarray(ent)[:, 1:], -(np.exp(logp) * logp).sum(-1)[:, :-1], atol=1e-4)


@pytest.mark.slow  # 35 CPU s
def test_sequence_logprobs_skips_chunks_without_needed_positions(ours, ids):
    """Chunks without a needed position are skipped: needed positions keep their exact values and gradients."""
    needed = np.zeros(ids.shape, bool)
    needed[:, 70:75] = True  # only the second of three 64-position chunks
    lp_all, ent_all = sequence_logprobs(ours, ids, chunk=64)
    lp, ent = sequence_logprobs(ours, ids, chunk=64, needed=jnp.asarray(needed))
    np.testing.assert_allclose(np.asarray(lp)[needed], np.asarray(lp_all)[needed], rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.asarray(ent)[needed], np.asarray(ent_all)[needed], rtol=1e-6, atol=1e-6)
    assert np.all(np.asarray(lp)[:, :64] == 0) and np.all(np.asarray(lp)[:, 129:] == 0)  # skipped chunks read 0
    graphdef, state = nnx.split(ours)

    def loss(s, need):
        return jnp.sum(sequence_logprobs(nnx.merge(graphdef, s), ids, chunk=64, needed=need)[0] * needed)

    g_all, g_skip = jax.grad(loss)(state, None), jax.grad(loss)(state, jnp.asarray(needed))
    for a, b in zip(jax.tree.leaves(g_all), jax.tree.leaves(g_skip), strict=True):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)


@pytest.mark.slow  # 39 CPU s
def test_remat_gives_the_same_gradients(hf_checkpoint, ids):
    x = ids[:, :48]

    @nnx.jit
    def grads(model):
        def loss(m):
            lp, _ = sequence_logprobs(m, x)
            return -lp.mean()

        return nnx.state(nnx.grad(loss)(model))

    plain = grads(load_pretrained(hf_checkpoint[1]))
    remat = grads(load_pretrained(hf_checkpoint[1], remat=True))
    for (k, a), (_, b) in zip(nnx.to_flat_state(plain), nnx.to_flat_state(remat), strict=False):
        np.testing.assert_allclose(np.asarray(a[...]), np.asarray(b[...]), rtol=1e-4, atol=1e-7, err_msg=str(k))
        assert np.isfinite(np.asarray(a[...])).all()


def test_tied_embeddings(tmp_path, ids):
    model = _perturbed_hf_model(seed=1, tie_word_embeddings=True, num_hidden_layers=4)
    model.save_pretrained(tmp_path)
    ours = load_pretrained(tmp_path)
    assert ours.lm_head is None
    np.testing.assert_allclose(np.asarray(_forward(ours, ids)), _hf_logits(model, ids), atol=1e-4)


def test_checkpoint_errors_are_clear(hf_checkpoint, tmp_path):
    _, path = hf_checkpoint
    tensors = load_file(os.path.join(path, "model.safetensors"))
    config = open(os.path.join(path, "config.json")).read()

    def write(ts, name):
        d = tmp_path / name
        d.mkdir()
        (d / "config.json").write_text(config)
        save_file(ts, d / "model.safetensors")
        return d

    broken = dict(tensors)
    del broken["model.layers.5.linear_attn.A_log"]
    broken["model.layers.0.mlp.extra.weight"] = np.zeros(3, np.float32)
    broken["model.norm.weight"] = np.zeros(7, np.float32)
    with pytest.raises(CheckpointError) as e:
        load_pretrained(write(broken, "broken"))
    msg = str(e.value)
    assert "missing tensors: model.layers.5.linear_attn.A_log" in msg
    assert "unexpected tensors: model.layers.0.mlp.extra.weight" in msg
    assert "model.norm.weight: checkpoint (7,) ≠ expected (64,)" in msg
    with pytest.raises(FileNotFoundError, match="no config.json"):
        load_pretrained(tmp_path)


def test_config_from_hf_and_presets():
    vlm = {
        "model_type": "qwen3_5",
        "text_config": {"model_type": "qwen3_5_text", "hidden_size": 4096, "rope_parameters": {"rope_theta": 1e7}},
    }
    c = Qwen35Config.from_hf_dict(vlm)
    assert c.block_pattern == ("linear_attention",) * 3 + ("full_attention",) and c.num_blocks == 8
    assert c.block_runs == (("linear_attention", 3), ("full_attention", 1))
    assert c.rotary_dim == 64 and c.conv_dim == 8192
    assert get_preset("qwen3_5_9b").num_params() == 8_953_803_264  # the reference's meta-device count
    hf_count = sum(
        p.numel() for p in transformers.Qwen3_5ForCausalLM(transformers.Qwen3_5TextConfig(**HF_TINY)).parameters()
    )
    assert Qwen35Config.from_hf_dict(transformers.Qwen3_5TextConfig(**HF_TINY).to_dict()).num_params() == hf_count
    with pytest.raises(ValueError, match="rope_theta"):
        Qwen35Config.from_hf_dict({"model_type": "qwen3_5_text"})
    with pytest.raises(ValueError, match="unknown model preset"):
        get_preset("qwen3_5_70b")


def test_program_size_does_not_grow_with_depth():
    """Blocks and runs are scanned: 32 layers lower to the same program as 8 (only array shapes differ)."""
    import dataclasses

    from rltldr_jax.models import ModelSpec

    def hlo_ops(layers: int) -> int:
        config = dataclasses.replace(get_preset("tiny"), vocab_size=256, num_hidden_layers=layers, layer_types=())
        graphdef, params = nnx.split(ModelSpec(config).abstract())
        lowered = jax.jit(lambda p, x: nnx.merge(graphdef, p)(x)).lower(
            params, jax.ShapeDtypeStruct((1, 16), jnp.int32)
        )
        return sum(1 for line in lowered.as_text().splitlines() if "=" in line)

    assert hlo_ops(32) == hlo_ops(8)
