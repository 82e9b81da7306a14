"""benchmarks/device.py, the accelerator check of issue 15, in its CPU smoke mode (so that it never rots), and the
arithmetic behind its MFU column."""

import importlib.util
import json
import math
import os
import sys

import pytest

from rltldr_jax.models import get_preset

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def device_module():
    spec = importlib.util.spec_from_file_location("device_benchmark", os.path.join(ROOT, "benchmarks", "device.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses resolve their annotations through sys.modules
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_model_flops_per_token(device_module):
    """6·N_nonembedding + causal attention + the delta rule's state-size estimate, for the 0.8B preset at 4k."""
    config = get_preset("qwen3_5_0_8b")
    f = device_module.flops_per_token(config, 4096)
    assert f["dense"] == 6 * (752_393_024 - 248_320 * 1024)  # tied embeddings: one vocabulary matrix left out
    assert f["attention"] == 6 * 6 * 8 * 256 * 4096  # 6 attention layers, 8 heads of 256, causal
    assert f["deltanet"] == 18 * 18 * 16 * 128 * 128  # 18 DeltaNet layers, 16 value heads, 128 x 128 state
    assert f["total"] == f["dense"] + f["attention"] + f["deltanet"] == 3_375_604_608
    assert device_module.flops_per_token(config, 16384)["attention"] == 4 * f["attention"]


def test_peak_table(device_module):
    class Kind:
        def __init__(self, kind):
            self.device_kind = kind

    assert device_module.peak_tflops(Kind("NVIDIA H200")) == pytest.approx(989.4)
    assert device_module.peak_tflops(Kind("NVIDIA H100 80GB HBM3")) == pytest.approx(989.4)
    assert device_module.peak_tflops(Kind("NVIDIA A100-SXM4-80GB")) == 312.0
    assert device_module.peak_tflops(Kind("cpu")) is None


@pytest.mark.slow  # ~80 s on 2 cores (the whole benchmark at tiny shapes); `pytest -m slow` runs it
def test_smoke_run_prints_the_table(device_module, tmp_path, capsys):
    rows = device_module.main(["--smoke", "--out", str(tmp_path), "--budget-s", "3600"])
    by_key = {r.key: r for r in rows}
    expected = [
        "parity",
        "attention/blocked",
        "attention/cudnn/forward",
        "attention/cudnn/prefill",
        "train/tiny/64",
        "decode/2",
    ]
    assert list(by_key) == expected, [(r.key, r.status) for r in rows]
    assert not [r for r in rows if r.status.startswith(("error", "FAIL", "skipped: time"))]

    parity = by_key["parity"]
    assert parity.status == "pass" and 0 <= parity.value <= 1e-4
    assert 0.5 < parity.metrics["max_abs_logit"] < 50  # logits O(1), so the tolerance is meaningful
    blocked = by_key["attention/blocked"]
    assert blocked.status == "pass" and 0 <= blocked.value <= 1e-4
    for key in ("attention/cudnn/forward", "attention/cudnn/prefill"):
        assert by_key[key].status == "skipped: no GPU" and by_key[key].value is None

    train = by_key["train/tiny/64"]
    assert train.status == "n/a: no peak FLOP/s for device kind 'cpu'" and train.value is None
    for name in ("step_s", "tokens_per_s", "model_tflops_per_s", "flops_per_token", "compile_s"):
        assert math.isfinite(train.metrics[name]) and train.metrics[name] > 0, name
    assert train.metrics["tokens_per_s"] == pytest.approx(2 * 2 * 64 / train.metrics["step_s"])
    assert math.isfinite(train.metrics["loss"])
    assert "attention blocked" in train.note

    decode = by_key["decode/2"]
    assert decode.status == "ok" and math.isfinite(decode.value) and decode.value > 0
    assert decode.metrics["e2e_tokens_per_s"] > 0 and "prefill blocked, decode xla" in decode.note

    printed = capsys.readouterr().out
    assert "| check | setting | result | note |" in printed and "skipped: no GPU" in printed
    saved = json.loads((tmp_path / "device_table.json").read_text())
    assert [r["key"] for r in saved["rows"]] == expected and saved["platform"] == "cpu"
    assert (tmp_path / "device_table.md").read_text().count("\n| ") == len(expected) + 1  # header row + one per row


def test_bad_section_is_refused(device_module, capsys):
    with pytest.raises(SystemExit):
        device_module.main(["--only", "train,speed"])
    assert "--only: unknown section(s) speed; choose from parity, attention, train, decode" in capsys.readouterr().err


@pytest.fixture
def no_compilation_cache():
    """main() sets jax's persistent compilation cache once per process: start unset, restore afterwards."""
    import jax

    before = jax.config.jax_compilation_cache_dir
    jax.config.update("jax_compilation_cache_dir", None)
    yield
    jax.config.update("jax_compilation_cache_dir", before)


def test_xla_cache_is_a_private_per_user_directory(device_module, tmp_path, monkeypatch, no_compilation_cache):
    """The compiled-executable cache lives under $XDG_CACHE_HOME (not a fixed /tmp path another user can create
    first and fill with executables this process would run), created 0700."""
    import jax

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    device_module.main(["--smoke", "--only", "parity", "--budget-s", "3600"])
    cache = jax.config.jax_compilation_cache_dir
    assert cache == str(tmp_path / "xdg" / "rltldr_jax" / "device_xla_cache")
    info = os.stat(cache)
    assert info.st_uid == os.getuid() and info.st_mode & 0o777 == 0o700


@pytest.mark.parametrize("problem", ["world_writable", "symlink", "other_owner"])
def test_xla_cache_others_can_write_is_not_used(device_module, tmp_path, monkeypatch, capsys, problem):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = tmp_path / "xdg" / "rltldr_jax" / "device_xla_cache"
    path.parent.mkdir(parents=True)
    if problem == "world_writable":
        path.mkdir()
        path.chmod(0o777)
    elif problem == "symlink":  # to a directory someone else prepared
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        path.symlink_to(tmp_path / "elsewhere")
    else:
        if os.getuid() != 0:
            pytest.skip("needs root to create a directory owned by another user")
        path.mkdir(mode=0o700)
        os.chown(path, 65534, 65534)
    assert device_module.private_cache_dir("device_xla_cache") is None
    warning = capsys.readouterr().err
    assert f"not using the cache {path}" in warning and warning.count("\n") == 1
