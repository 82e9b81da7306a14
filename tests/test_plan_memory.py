"""benchmarks/plan_memory.py: the LoRA plan of the tiny preset on one device holds optimizer state for the adapters
alone (AdamW's two fp32 moments, far below full fine-tuning's) and a bf16 base, and XLA's argument bytes are exactly
that state plus the batch; the micro-batch × length search and the command line's refusals."""

import importlib.util
import os
import sys

import jax
import pytest
from flax import nnx

from rltldr_jax.models import ModelSpec, get_preset, lora

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MESH = (1, 1, 1)
MICRO, LENGTH, RANK = 1, 64, 4


@pytest.fixture(scope="module")
def plan_memory():
    # The script sets XLA_FLAGS (8 fake devices) and JAX_PLATFORMS on import, for its own process: keep them out of
    # this one's environment (the processes later tests start inherit it).
    saved = {k: os.environ.get(k) for k in ("XLA_FLAGS", "JAX_PLATFORMS")}
    spec = importlib.util.spec_from_file_location("plan_memory", os.path.join(ROOT, "benchmarks", "plan_memory.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves its annotations through sys.modules
    try:
        spec.loader.exec_module(module)
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield module
    del sys.modules[spec.name]


@pytest.fixture(scope="module")
def plans(plan_memory):
    """(full fine-tuning, LoRA rank 4) plans of the tiny preset on one device, 1 × 64 tokens."""
    full = plan_memory.compile_step("tiny", MESH, MICRO, LENGTH)
    adapted = plan_memory.compile_step("tiny", MESH, MICRO, LENGTH, lora_rank=RANK)
    return full, adapted


@pytest.mark.slow  # with the other user of `plans`: ~47 CPU s
def test_lora_plan_trains_the_adapters_alone(plans):
    full, adapted = plans
    model = nnx.eval_shape(
        lambda: lora.attach(ModelSpec(get_preset("tiny")).build(), lora.LoraSpec(rank=RANK, alpha=2 * RANK))
    )
    assert adapted.trainable == lora.adapter_count(model) > 0
    assert full.trainable == get_preset("tiny").num_params()
    assert adapted.trainable_bytes == 4 * adapted.trainable  # fp32 adapters
    assert full.trainable_bytes == full.param_bytes == 4 * full.trainable  # fp32 master weights
    # AdamW: two fp32 moments per trainable parameter, plus the same few scalars (step counts) in both plans
    scalars = full.optimizer_bytes - 2 * full.trainable_bytes
    assert 0 <= scalars < 1024
    assert adapted.optimizer_bytes == 2 * adapted.trainable_bytes + scalars
    assert adapted.optimizer_bytes * 20 < full.optimizer_bytes
    # the frozen base in bf16: half the fp32 master weights, plus the adapters
    assert adapted.param_bytes == full.param_bytes // 2 + adapted.trainable_bytes


@pytest.mark.slow  # reads `plans` (slow)
def test_compiled_arguments_are_the_planned_state(plans):
    """What XLA takes as arguments is the state the plan counts (params + optimizer state) and the batch."""
    batch = MICRO * LENGTH * (4 + 4 + 1 + 1) + MICRO * 4  # ids, old logprobs, two masks; advantages
    for plan in plans:
        assert plan.breakdown["arguments"] == plan.param_bytes + plan.optimizer_bytes + batch
    full, adapted = plans
    assert adapted.peak < full.peak


def test_hoisting_is_off_exactly_for_bf16_weights(plan_memory):
    assert plan_memory.hoist_of(0, None, "auto") and not plan_memory.hoist_of(4, None, "auto")
    assert plan_memory.hoist_of(4, "float32", "auto") and not plan_memory.hoist_of(0, "bfloat16", "auto")
    assert plan_memory.hoist_of(4, None, "on") and not plan_memory.hoist_of(0, None, "off")
    with pytest.raises(ValueError, match="hoist='maybe'"):
        plan_memory.hoist_of(0, None, "maybe")


def test_search_finds_the_largest_length(plan_memory, capsys):
    """With 1 MiB per token and example, a T4's budget (16 GB less 20 %) holds 12,207 tokens per device."""
    tokens = int(plan_memory.GPUS["T4"] * (1 - plan_memory.HEADROOM)) // 2**20
    plan_memory.search(lambda micro, length: micro * length * 2**20, ["T4"], micros=(1, 2, 16))
    out = capsys.readouterr().out
    for micro in (1, 2):
        best = tokens // micro // 1024 * 1024
        assert f"micro {micro}: up to {best} tokens per example ({micro * best} per device) fits" in out
    assert "micro 16: not even 1024 tokens per example fit" in out


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--mesh=1,1,1", "--gpus=A100"], "--gpus: unknown A100"),
        (["--mesh=1,1"], "give three sizes"),
        (["--mesh=1,16,1"], "needs 16 devices"),
        (["--mesh=1,1,1", "--lora_rank=-1"], "give rank >= 0"),
        (["--mesh=1,1,1", "--preset=nope"], "unknown model preset 'nope'"),
    ],
)
def test_bad_input_is_one_clear_error(plan_memory, monkeypatch, capsys, argv, message):
    monkeypatch.setattr(sys, "argv", ["plan_memory.py", *argv])
    with pytest.raises(SystemExit) as exit_info:
        plan_memory.main()
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_one_device_is_enough(plan_memory):
    """A one-device plan runs on the test process's devices (no 8 fake ones needed)."""
    assert plan_memory.make_plan_mesh(MESH).devices.size == 1 <= len(jax.devices())
