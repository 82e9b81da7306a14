"""Silent wrong weights, closed (issue 22 item 4) and the small export/eval failures of item 8.

- An HF export replaces the directory's weights as a whole: a single-file export over a sharded one loads the new
  weights (a stale model.safetensors.index.json used to win); the directory's other files stay.
- Checkpoints carry checksums of what was written: flipped bytes are reported as corrupt (step and files named) by
  restore, load_model and launch/eval.py (one line, non-zero exit); `--resume` falls back to the newest intact step.
- launch/eval.py evaluates a checkpoint with its own tokenizer, refuses one that is not the policy the config names
  (one line naming both), and does not pretrain (or look up) a base policy when given a checkpoint.
- A bad config.json names the file; an export into a read-only directory, or of a truncated checkpoint, prints one
  line (no OSError traceback, no "Event loop is closed" tracebacks).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import re
import subprocess
import sys
import textwrap
import time
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import tiny_config, tiny_run_settings, tiny_settings
from test_checkpoint import _load_cli, _orbax_data_files

from rltldr_jax import checkpoint as ckpt_module
from rltldr_jax.checkpoint import Checkpointer, CorruptCheckpointError, export_hf, inspect_arrays, load_model
from rltldr_jax.config import replicate
from rltldr_jax.models import ModelSpec, Qwen35Config, get_preset, load_pretrained, save_pretrained
from rltldr_jax.tokenization import load_tokenizer, train_chatml_tokenizer
from rltldr_jax.train.evaluation import eval_policy
from rltldr_jax.train.loop import Trainer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG = dataclasses.replace(get_preset("tiny"), vocab_size=512)
SPEC = ModelSpec(CONFIG)


def random_params(seed: int):
    """(graphdef, the tiny model's state with random values), numpy-built (no per-op compiles)."""
    rs = np.random.default_rng(seed)
    graphdef, abstract = nnx.split(SPEC.abstract())
    return graphdef, jax.tree.map(lambda a: np.asarray(0.05 * rs.standard_normal(a.shape), a.dtype), abstract)


def flip_bytes(step_dir, n: int = 3) -> str:
    """Flips one bit in each of `n` bytes spread over the largest data file of a checkpoint step's params (as a
    failing disk would); returns the file."""
    data = _orbax_data_files(step_dir)[0]
    size = os.path.getsize(data)
    with open(data, "r+b") as f:
        for i in range(1, n + 1):
            f.seek(size * i // (n + 1))
            byte = f.read(1)[0]
            f.seek(size * i // (n + 1))
            f.write(bytes([byte ^ 0x10]))
    return data


def assert_states_equal(a, b):
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@contextlib.contextmanager
def read_only(path):
    """`path` (a directory) read-only for this process: chmod for a user, the immutable attribute for root (whom
    permissions do not stop)."""
    if os.geteuid() != 0:
        os.chmod(path, 0o555)
        try:
            yield
        finally:
            os.chmod(path, 0o755)
        return
    if subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode != 0:
        pytest.skip("running as root on a file system without chattr +i: no way to make a directory read-only")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", str(path)], check=True)


# ----------------------------------------------------------------------------------------------------
# HF export: the whole directory's weights are replaced
# ----------------------------------------------------------------------------------------------------


def test_export_replaces_every_weight_file(tmp_path):
    graphdef, old = random_params(0)
    _, new = random_params(1)
    out = tmp_path / "hf"
    save_pretrained(nnx.merge(graphdef, old), out, max_shard_bytes=100_000)  # sharded: 17 files and an index
    assert os.path.isfile(out / "model.safetensors.index.json")
    (out / "tokenizer.json").write_text("{}")  # the directory's own files stay
    save_pretrained(nnx.merge(graphdef, new), out)  # one file
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors", "tokenizer.json"]
    assert_states_equal(nnx.split(load_pretrained(out))[1], new)
    assert (out / "tokenizer.json").read_text() == "{}"
    # And back to shards: no stale single file either; nothing left next to the directory.
    save_pretrained(nnx.merge(graphdef, old), out, max_shard_bytes=100_000)
    assert "model.safetensors" not in os.listdir(out) and "tokenizer.json" in os.listdir(out)
    assert_states_equal(nnx.split(load_pretrained(out))[1], old)
    assert os.listdir(tmp_path) == ["hf"]
    # Through the checkpoint export too (a symbolic link to the directory: the directory is replaced).
    with Checkpointer(tmp_path / "ckpt", keep=None, async_save=False) as ckpt:
        ckpt.save(1, params=new, opt_state=None, rng=None, model_config=CONFIG)
    os.symlink(out, tmp_path / "link")
    export_hf(tmp_path / "ckpt", 1, tmp_path / "link", dtype=jnp.float32)
    assert os.path.islink(tmp_path / "link") and "model.safetensors.index.json" not in os.listdir(out)
    assert_states_equal(nnx.split(load_pretrained(out))[1], new)


def test_export_into_a_read_only_directory_is_one_line(tmp_path, capsys):
    _, params = random_params(0)
    with Checkpointer(tmp_path / "ckpt", keep=None, async_save=False) as ckpt:
        ckpt.save(1, params=params, opt_state=None, rng=None, model_config=CONFIG)
    cli = _load_cli()
    (tmp_path / "ro").mkdir()
    (tmp_path / "done").mkdir()
    assert cli.main([f"--checkpoint={tmp_path / 'ckpt'}", f"--out={tmp_path / 'done'}"]) == 0
    capsys.readouterr()
    with read_only(tmp_path / "ro"), read_only(tmp_path / "done"):
        for out in (tmp_path / "ro" / "hf", tmp_path / "done"):  # a new directory in a read-only one; a read-only one
            assert cli.main([f"--checkpoint={tmp_path / 'ckpt'}", f"--out={out}"]) == 2
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and err.startswith(f"export_hf: error: cannot write the export to {out} ("), err
            assert "writable" in err
    assert os.listdir(tmp_path / "ro") == [] and sorted(os.listdir(tmp_path / "done")) == [
        "config.json",
        "model.safetensors",
    ]


def _closed_loop_report() -> RuntimeError:
    """The error a TensorStore completion raises on a read whose event loop orbax has closed (with its traceback)."""
    loop = asyncio.new_event_loop()
    loop.close()
    try:
        loop.call_soon_threadsafe(lambda: None)
    except RuntimeError as e:
        return e
    raise AssertionError("a closed loop accepted a callback")


def test_only_the_reports_of_a_failed_reads_orphans_are_dropped(monkeypatch):
    """The filters of a failed read's orphaned reads (`checkpoint._OrphanedReads`): asyncio's "never retrieved"
    reports are dropped only when they name a directory whose read is in flight or failed within the grace period
    (a whole path component: not a sibling with a longer name); the unraisable "Event loop is closed" only while some
    read is in scope; anything else, and everything once the grace period is over, is shown."""
    shown = []
    monkeypatch.setattr(sys, "unraisablehook", shown.append)
    monkeypatch.setattr(logging.getLogger("asyncio"), "filters", [])  # (restored after the test, with its filters)
    reads = ckpt_module._OrphanedReads()
    reads._install()
    reports = ckpt_module._OrphanedReadReports(reads)

    def record(message: str, exc: BaseException) -> logging.LogRecord:
        return logging.LogRecord("asyncio", logging.ERROR, "", 0, message, (), (type(exc), exc, None))

    closed = _closed_loop_report()
    unraisable = SimpleNamespace(
        exc_type=RuntimeError, exc_value=closed, exc_traceback=closed.__traceback__, err_msg=None, object=None
    )
    damaged = ValueError('OUT_OF_RANGE: Error reading "/data/run/ckpt/1/params/": Requested byte range')
    sibling = ValueError('OUT_OF_RANGE: Error reading "/data/run/ckpt_old/1/params/": Requested byte range')
    wrapped = Exception("Encountered error while reading array index")
    wrapped.__cause__ = damaged
    never = "_GatheringFuture exception was never retrieved\nfuture: <_GatheringFuture finished>"

    assert reports.filter(record(never, damaged))  # nothing in scope: shown
    sys.unraisablehook(unraisable)
    assert shown == [unraisable]
    reads.begin("/data/run/ckpt")
    reads.end("/data/run/ckpt", failed=True)
    assert not reports.filter(record(never, damaged)) and not reports.filter(record(never, wrapped))
    assert not reports.filter(record("Task exception was never retrieved", damaged))
    assert reports.filter(record(never, sibling))  # another directory
    assert reports.filter(record("Unclosed client session", damaged))  # another report
    sys.unraisablehook(unraisable)
    other = SimpleNamespace(exc_type=ValueError, exc_value=damaged, exc_traceback=None, err_msg=None, object=None)
    sys.unraisablehook(other)
    assert shown == [unraisable, other]  # the closed-loop report dropped, the other shown
    monkeypatch.setattr(ckpt_module, "ORPHAN_GRACE_S", 0.0)
    time.sleep(0.01)
    assert reads.scopes() == () and reports.filter(record(never, damaged))
    sys.unraisablehook(unraisable)
    assert shown == [unraisable, other, unraisable]
    reads.begin("/data/run/ckpt")  # a read in flight is in scope until it ends
    assert reads.scopes() == ("/data/run/ckpt",)
    reads.end("/data/run/ckpt", failed=False)
    assert reads.scopes() == ()


TRUNCATED_EXPORTS = textwrap.dedent(
    """
    import gc, sys, time
    sys.path.insert(0, sys.argv[3])
    from rltldr_jax.cli.export_hf import main
    for i in range(20):  # orbax's orphaned reads race the error: many tries make their tracebacks show
        assert main([f"--checkpoint={sys.argv[1]}", f"--out={sys.argv[2]}"]) == 2
        gc.collect()
        time.sleep(0.3 if i % 4 == 0 else 0.02)
    """
)


def test_export_of_a_truncated_checkpoint_prints_only_its_error(tmp_path):
    """Damaged array metadata fails one of orbax's concurrent reads; the others, orphaned when its event loop closes,
    used to print "RuntimeError: Event loop is closed" tracebacks after the error line, and asyncio's "Future (Task)
    exception was never retrieved" for the failed reads nobody awaited (CI saw the second once the first was gone)."""
    _, params = random_params(0)
    with Checkpointer(tmp_path / "ckpt", keep=None, async_save=False) as ckpt:
        ckpt.save(1, params=params, opt_state=None, rng=None, model_config=CONFIG)
    [metadata] = [
        os.path.join(tmp_path / "ckpt" / "1" / "params" / "d", f)
        for f in os.listdir(tmp_path / "ckpt" / "1" / "params" / "d")
    ]
    with open(metadata, "r+b") as f:
        f.truncate(os.path.getsize(metadata) // 2)
    script = tmp_path / "exports.py"
    script.write_text(TRUNCATED_EXPORTS)
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt"), str(tmp_path / "hf"), ROOT],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stderr.splitlines()
    assert len(lines) == 20 and all(
        re.match(r"export_hf: error: checkpoint step 1 in .*: cannot read its metadata", line) for line in lines
    ), out.stderr[-3000:]
    assert not os.path.exists(tmp_path / "hf")


# ----------------------------------------------------------------------------------------------------
# A bad config.json names the file
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, why",
    [
        ('{"vocab_size": 512,', "Expecting property name"),
        ("[1, 2]", "a JSON list, not an object"),
        ('{"model_type": "llama", "rope_theta": 1e7}', "model_type='llama'"),
        ('{"rope_theta": 1e7, "hidden_size": "64"}', "hidden_size='64' must be a positive integer"),
    ],
)
def test_a_bad_config_json_names_the_file(tmp_path, capsys, text, why):
    graphdef, params = random_params(0)
    save_pretrained(nnx.merge(graphdef, params), tmp_path / "hf")
    (tmp_path / "hf" / "config.json").write_text(text)
    file = re.escape(str(tmp_path / "hf" / "config.json"))
    with pytest.raises(ValueError, match=rf"^{file} is not a usable Qwen 3\.5 config\.json \(.*{re.escape(why)}"):
        load_model(str(tmp_path / "hf"))
    with pytest.raises(ValueError, match=rf"^{file} is not a usable"):
        Qwen35Config.from_pretrained(tmp_path / "hf")
    cli = _load_cli()  # --config_json of the export
    assert cli.main(["--checkpoint=/nonexistent", f"--config_json={tmp_path / 'hf'}", "--out=/tmp/x"]) == 2
    assert re.match(rf"export_hf: error: {file} is not a usable .*{re.escape(why)}", capsys.readouterr().err)


# ----------------------------------------------------------------------------------------------------
# Checksums: a damaged step is corrupt, named; resume falls back past it
# ----------------------------------------------------------------------------------------------------


def test_checksums_are_the_same_on_host_and_device():
    """Arrays in host memory are checksummed with numpy, the others by a jitted pass on their devices (a GPU save,
    restored on the CPU by export_hf): both give the same numbers, for every dtype a checkpoint holds."""
    rs = np.random.default_rng(0)
    arrays = {
        "f32": rs.standard_normal((3, 5, 7)).astype(np.float32),
        "bf16": rs.standard_normal((4, 33)).astype(jnp.bfloat16),
        "i32": rs.integers(-5, 5, (10,)).astype(np.int32),
        "u8": rs.integers(0, 255, (3, 3)).astype(np.uint8),
        "bool": rs.integers(0, 2, (17,)).astype(bool),
        "scalar": np.float32(3.5),
        "nan": np.array([1.0, np.nan], np.float32),
        "long": rs.standard_normal((70_001,)).astype(np.float32),  # over one numpy chunk
    }
    host = inspect_arrays(arrays)
    device = jax.device_get(ckpt_module._inspect_device([jnp.asarray(a) for a in arrays.values()]))
    assert host == {
        name: (bool(f), f"{int(a):08x}{int(b):08x}") for name, (f, a, b) in zip(arrays, device, strict=True)
    }
    assert [name for name, (finite, _) in host.items() if not finite] == ["nan"]
    # One changed bit, or two swapped elements, change the checksum.
    changed = arrays["f32"].copy()
    changed.view(np.uint32)[1, 2, 3] ^= 1 << 30
    swapped = arrays["f32"].copy()
    swapped[0, 0, :2] = swapped[0, 0, 1::-1]
    checksums = {inspect_arrays({"x": x})["x"][1] for x in (arrays["f32"], changed, swapped)}
    assert len(checksums) == 3


def test_flipped_bytes_are_reported_as_corrupt(tmp_path):
    _, params = random_params(0)
    _, params2 = random_params(2)
    with Checkpointer(tmp_path, keep=None, async_save=True) as ckpt:  # (asynchronous, as the trainer saves)
        ckpt.save(1, params=params, opt_state=None, rng=None, meta={"phase": 1}, model_config=CONFIG)
        ckpt.save(2, params=params2, opt_state=None, rng=None, meta={"phase": 2}, model_config=CONFIG)
    data = flip_bytes(tmp_path / "2")
    abstract = nnx.split(SPEC.abstract())[1]
    corrupt = (
        rf"checkpoint step 2 in '{re.escape(str(tmp_path))}' is corrupt: [1-3] of its \d+ params arrays differ from "
        r"the checksums recorded when it was saved \(.*\): the files under "
        rf"{re.escape(str(tmp_path / '2' / 'params'))} are damaged; use another step"
    )
    assert data.startswith(str(tmp_path / "2" / "params"))
    with Checkpointer(tmp_path, keep=None, create=False) as ckpt:
        with pytest.raises(CorruptCheckpointError, match=corrupt):
            ckpt.restore(2, abstract_params=abstract, allow_nonfinite=True)  # (checked whether or not NaN is allowed)
        assert_states_equal(ckpt.restore(1, abstract_params=abstract).params, params)
    with pytest.raises(CorruptCheckpointError, match=corrupt):
        load_model(str(tmp_path))  # the latest step: what launch/eval.py and export_hf load
    assert_states_equal(nnx.split(load_model(f"{tmp_path}:1")[0])[1], params)
    # The JSON items are checked too: a digit changed in the meta (same length, still valid JSON).
    meta = tmp_path / "1" / "meta" / "metadata"
    meta.write_text(meta.read_text().replace('"phase": 1', '"phase": 7'))
    with Checkpointer(tmp_path, keep=None, create=False) as ckpt:
        with pytest.raises(CorruptCheckpointError, match=r"step 1 .* is corrupt: its meta \(.*1/meta\) differs from"):
            ckpt.read_state(1)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax's reads orphaned by the error
def test_resume_falls_back_past_a_step_with_flipped_bytes(tmp_path, caplog):
    workdir = str(tmp_path / "run")
    stopped = Trainer(tiny_run_settings(workdir, 2))
    try:
        stopped.save()  # step 0: the initial policy
        stopped.phase = 1  # step 1: other weights (as after an update)
        stopped.update.params = jax.tree.map(lambda x: x * 0.5, stopped.update.params)
        stopped.save()
    finally:
        stopped.close()
    flip_bytes(tmp_path / "run" / "checkpoints" / "1")
    with caplog.at_level(logging.WARNING, logger="rltldr_jax"):
        resumed = Trainer(tiny_run_settings(workdir, 2), resume=True)
    try:
        assert resumed.phase == 0
        assert re.search(r"checkpoint step 1 in .* is corrupt: .*falling back to step 0", caplog.text), caplog.text
        assert os.listdir(os.path.join(workdir, "checkpoints")) == ["0"]  # step 1 moved aside, not deleted
    finally:
        resumed.close()


# ----------------------------------------------------------------------------------------------------
# launch/eval.py: the checkpoint's own tokenizer, a mismatch is one line, no pretraining first
# ----------------------------------------------------------------------------------------------------


def _training_checkpoint(path, run_config) -> str:
    """A training checkpoint (step 3) of the tiny architecture, recording `run_config` as a trainer does."""
    _, params = random_params(0)
    with Checkpointer(path, keep=None, async_save=False) as ckpt:
        ckpt.save(
            3, params=params, opt_state=None, rng=None, meta={"config": run_config.to_dict()}, model_config=CONFIG
        )
    return str(path)


def same_tokenizer(a, b) -> bool:
    text = "the quick brown fox, the lazy dog <|im_end|>"
    return a.vocab_size == b.vocab_size and a.encode(text, special=True) == b.encode(text, special=True)


def _small_tokenizer():
    return train_chatml_tokenizer(["the quick brown fox jumps over the lazy dog"] * 20, 300)


def test_eval_uses_the_checkpoints_own_tokenizer(tmp_path):
    graphdef, params = random_params(0)
    hf = tmp_path / "hf"
    save_pretrained(nnx.merge(graphdef, params), hf)
    _small_tokenizer().save(str(hf))
    policy = eval_policy(tiny_settings({"workdir": str(tmp_path / "w")}), str(hf))
    assert same_tokenizer(policy.tokenizer, load_tokenizer(hf)) and policy.tokenizer.vocab_size < 512  # not Qwen's
    assert policy.step is None and policy.what == f"HF checkpoint {hf}"
    # A training checkpoint: the tokenizer its run recorded (here the HF directory's, given as config.tokenizer).
    ckpt = _training_checkpoint(tmp_path / "ckpt", tiny_config({"tokenizer": str(hf)}))
    policy = eval_policy(tiny_settings({"workdir": str(tmp_path / "w")}), ckpt)
    assert same_tokenizer(policy.tokenizer, load_tokenizer(hf)) and policy.step == 3
    # The config naming another tokenizer: refused, naming both.
    other = tmp_path / "other"
    other.mkdir()
    train_chatml_tokenizer(["an entirely different corpus of words"] * 20, 290).save(str(other))
    with pytest.raises(
        ValueError, match=rf"^{re.escape(str(hf))} does not match the policy the config names \(tokenizer="
    ):
        eval_policy(tiny_settings({"tokenizer": str(other)}), str(hf))
    # Without a tokenizer of its own, the config's; one with more ids than the model's vocabulary is refused.
    os.remove(hf / "tokenizer.json")
    with pytest.raises(ValueError, match=r"its tokenizer has 248077 ids but the model only 512"):
        eval_policy(tiny_settings(), str(hf))


def test_eval_of_another_runs_checkpoint_is_one_line_and_pretrains_nothing(tmp_path):
    """The probe: a craft replication config evaluating a SAPI run's checkpoint (another architecture and tokenizer)
    used to pretrain (or look up) the config's base policy, then print Pass@1 = 0.0 with exit 0."""
    ckpt = _training_checkpoint(tmp_path / "ckpt", tiny_config({"workdir": str(tmp_path / "sapi-run")}))
    cache = tmp_path / "cache"
    out = subprocess.run(
        [
            sys.executable,
            os.path.join(ROOT, "launch", "eval.py"),
            "--config=configs/replicate.py:smoke",
            f"--config.pretrain.cache_dir={cache}",
            f"--config.workdir={tmp_path / 'w'}",
            f"--checkpoint={ckpt}:3",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 1, out.stderr[-3000:]
    assert out.stderr.count("\n") == 1, out.stderr[-3000:]
    assert re.match(
        rf"error: {re.escape(ckpt)}:3 does not match the policy the config names \(model\.preset=replicate_xs "
        rf"pretrained by pretrain\.\*, steps={replicate.get_config('smoke').pretrain.steps}\): the checkpoint's vs the "
        r"config's intermediate_size 128 vs 192, .*; "
        r"evaluate it with a config that matches it \(its run: env\.name=sapi, model\.preset=tiny",
        out.stderr,
    ), out.stderr
    assert not os.path.exists(cache) and not os.path.exists(tmp_path / "w" / "eval")  # nothing pretrained or written
    assert replicate.get_config("smoke").pretrain.steps > 0  # (the config does pretrain when it needs its policy)
    # A damaged checkpoint: one line too.
    flip_bytes(tmp_path / "ckpt" / "3")
    with pytest.raises(CorruptCheckpointError, match=r"checkpoint step 3 in .* is corrupt"):
        eval_policy(tiny_settings({"workdir": str(tmp_path / "w")}), f"{ckpt}:3")
