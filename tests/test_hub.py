"""Hub ids (`org/name[@revision]`) where a model or tokenizer path enters (rltldr_jax/models/hub.py): resolved offline
by huggingface_hub itself from a real cache layout built in a temporary directory (refs/<name> holding a commit,
snapshots/<commit>/ files linked to blobs/), through the config keys, a launcher's flags and launch/serve.py; an
existing local path winning over an id; an uncached id failing in one line with its fix."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
from flax import nnx
from helpers import launch, tiny_config

from configs import sapi
from rltldr_jax.analysis.delta_theta import compare
from rltldr_jax.config import ablations, base
from rltldr_jax.models import ModelSpec, get_preset, load_pretrained, save_pretrained
from rltldr_jax.models.hub import HubError, cache_dir, parse_id, resolve
from rltldr_jax.settings import settings_of
from rltldr_jax.tokenization import load_tokenizer, train_chatml_tokenizer

CONFIG = dataclasses.replace(get_preset("tiny"), vocab_size=256)
COMMIT_A = hashlib.sha1(b"first").hexdigest()  # main
COMMIT_B = hashlib.sha1(b"second").hexdigest()  # the tag v1


def _cache_repo(cache: Path, repo: str, commit: str, source: Path, refs: tuple[str, ...]) -> Path:
    """`source`'s files as commit `commit` of the model repository `repo` in the HF cache `cache`, as
    huggingface_hub lays it out (content in blobs/, linked from snapshots/<commit>/); each of `refs` names it."""
    folder = cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (folder / "blobs").mkdir(exist_ok=True)
    for name in sorted(os.listdir(source)):
        data = (source / name).read_bytes()
        blob = folder / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))
    for ref in refs:
        (folder / "refs").mkdir(exist_ok=True)
        (folder / "refs" / ref).write_text(commit)  # no newline, as huggingface_hub writes it
    return snapshot


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    """A cache (HF_HOME/hub) holding org/tiny at two commits (main, v1: two seeds of a tiny Qwen 3.5 with a tokenizer)
    and org/tok (a tokenizer only); and the exported directories they were made from."""
    tmp = tmp_path_factory.mktemp("hub")
    tokenizer = train_chatml_tokenizer(["hello world, the hub resolves ids"] * 8, 300)
    sources = []
    for seed in (0, 1):
        source = tmp / f"export{seed}"
        save_pretrained(ModelSpec(CONFIG).build(seed=seed), source)
        tokenizer.save(str(source))
        sources.append(source)
    tok_source = tmp / "tok"
    tok_source.mkdir()
    tokenizer.save(str(tok_source))
    cache = tmp / "hf_home" / "hub"
    a = _cache_repo(cache, "org/tiny", COMMIT_A, sources[0], ("main",))
    b = _cache_repo(cache, "org/tiny", COMMIT_B, sources[1], ("v1",))
    tok = _cache_repo(cache, "org/tok", COMMIT_A, tok_source, ("main",))
    return {"cache": cache, "a": str(a), "b": str(b), "tok": str(tok), "sources": sources}


@pytest.fixture
def offline(hub, monkeypatch):
    """HF_HUB_CACHE at the test cache, HF_HUB_OFFLINE=1 (set for the launchers this test starts too)."""
    monkeypatch.setenv("HF_HUB_CACHE", str(hub["cache"]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return hub


def _same_weights(a, b) -> None:
    sa, sb = nnx.to_flat_state(nnx.state(a)), nnx.to_flat_state(nnx.state(b))
    assert [k for k, _ in sa] == [k for k, _ in sb]
    for (key, va), (_, vb) in zip(sa, sb, strict=True):
        np.testing.assert_array_equal(np.asarray(va[...]), np.asarray(vb[...]), err_msg=str(key))


def test_what_is_a_hub_id():
    assert parse_id("Qwen/Qwen3.5-9B") == ("Qwen/Qwen3.5-9B", None)
    assert parse_id("Qwen/Qwen3.5-0.8B@main") == ("Qwen/Qwen3.5-0.8B", "main")
    assert parse_id(f"org/tiny@{COMMIT_B}") == ("org/tiny", COMMIT_B)
    assert parse_id("org/tiny@refs/pr/1") == ("org/tiny", "refs/pr/1")
    # Paths, training checkpoints and URLs are never ids: a leading / . ~, two /, a :STEP, a scheme, a bare name.
    for value in (
        "/ckpt/qwen",
        "./org/tiny",
        "../org/tiny",
        "~/org/tiny",
        "runs/x/checkpoints",
        "ckpts/run:3",
        "gs://bucket/x",
        "qwen",
        "org/",
        "org/tiny@",
        "org/ti--ny",
        "org/tiny.",
    ):
        assert parse_id(value) is None, value


def test_an_id_resolves_to_its_cached_snapshot_and_loads(offline):
    assert resolve("org/tiny") == offline["a"]
    assert resolve("org/tiny", what="tokenizer") == offline["a"]
    assert resolve("org/tiny@v1") == offline["b"]  # a named revision (a tag's ref)
    assert resolve(f"org/tiny@{COMMIT_A}") == offline["a"]  # a commit hash
    assert resolve("org/tok", what="tokenizer") == offline["tok"]
    _same_weights(load_pretrained(resolve("org/tiny@v1")), load_pretrained(offline["sources"][1]))
    text = "hello hub"
    assert load_tokenizer(resolve("org/tok", what="tokenizer")).encode(text) == load_tokenizer(
        offline["sources"][0]
    ).encode(text)


def test_the_cache_follows_hf_home(hub, monkeypatch):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    monkeypatch.setenv("HF_HOME", str(hub["cache"].parent))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert cache_dir() == str(hub["cache"])
    assert resolve("org/tiny") == hub["a"]


def test_config_keys_take_hub_ids(offline, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    c = tiny_config(
        {
            "workdir": "w",
            "model.checkpoint": "org/tiny@v1",
            "tokenizer": "org/tok",
            "insight.teacher.checkpoint": "org/tiny",
            "insight.teacher.tokenizer": "org/tiny@v1",
            "sft.rollouts_dir": "org/tiny",  # not a model key: a path, as before
        },
        validate=False,
    )
    settings = ablations.resolve(c)
    assert settings.model.checkpoint == offline["b"]
    assert (settings.tokenizer, settings.insight.teacher.checkpoint) == (offline["tok"], offline["a"])
    assert settings.insight.teacher.tokenizer == offline["b"]
    assert settings.workdir == str(tmp_path / "w") and settings.sft.rollouts_dir == str(tmp_path / "org" / "tiny")
    _same_weights(load_pretrained(settings.model.checkpoint), load_pretrained(offline["sources"][1]))

    # A training checkpoint DIR:STEP and a local directory are paths, made absolute as before.
    (tmp_path / "org" / "tiny").mkdir(parents=True)
    c = tiny_config({"model.checkpoint": "runs/x/checkpoints:3", "tokenizer": "org/tiny"}, validate=False)
    settings = ablations.resolve(c)
    assert settings.model.checkpoint == f"{tmp_path}/runs/x/checkpoints:3"
    assert settings.tokenizer == str(tmp_path / "org" / "tiny")


def test_an_uncached_id_offline_fails_in_one_line_with_the_fix(offline):
    cache = str(offline["cache"])
    with pytest.raises(HubError) as e:
        resolve("org/missing")
    assert str(e.value) == (
        f"hub model org/missing is not in the local HF cache at {cache} and there is no local path 'org/missing' "
        "(HF_HUB_OFFLINE is set): run `hf download org/missing` on a machine with network (into this cache, or one "
        "you then point HF_HOME at), set HF_HOME to a cache holding it, or give a local directory"
    )
    with pytest.raises(HubError, match=r"hub model org/tiny@v2 is not in .*`hf download org/tiny --revision v2`"):
        resolve("org/tiny@v2")
    # A cached snapshot without weights is no model (only a tokenizer).
    with pytest.raises(HubError) as e:
        resolve("org/tok")
    assert str(e.value) == (
        f"the snapshot of hub model org/tok at {offline['tok']} has no config.json (or adapter_config.json) or "
        "*.safetensors: run `hf download org/tok` on a machine with network to complete the cache, or give a local "
        "directory"
    )
    # Through the config: a ConfigError naming the key, which the launchers print as one line.
    c = tiny_config({"insight.teacher.checkpoint": "org/missing"}, validate=False)
    with pytest.raises(base.ConfigError) as e:
        ablations.resolve(c)
    assert "\n" not in str(e.value)
    assert str(e.value).startswith(
        "insight.teacher.checkpoint='org/missing': hub model org/missing is not in the local HF cache at "
    )


def test_an_existing_local_path_wins_and_other_values_pass_through(offline, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "org" / "tiny").mkdir(parents=True)
    assert resolve("org/tiny") == str(tmp_path / "org" / "tiny")
    assert resolve("org/tiny@v1") == offline["b"]  # ./org/tiny@v1 does not exist
    (tmp_path / "org" / "tiny@v1").write_text("")  # a file counts too
    assert resolve("org/tiny@v1") == str(tmp_path / "org" / "tiny@v1")
    for value in ("", "runs/x/checkpoints:3", "/no/such/dir", "gs://bucket/ckpt", "no_such_dir"):
        assert resolve(value) == value


def test_delta_theta_takes_hub_ids_offline(offline, tmp_path):
    out = launch(
        "delta_theta", "--a=org/tiny", "--b=org/tiny@v1", f"--out={tmp_path / 't.json'}", "--quiet", timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert f"base = {offline['a']}\n  checkpoint = {offline['b']}" in out.stdout
    with open(tmp_path / "t.json") as f:
        written = json.load(f)
    assert (written["a"], written["b"]) == (offline["a"], offline["b"])
    expected = compare(*offline["sources"]).rows()
    assert [r["kind"] for r in written["rows"]] == [r["kind"] for r in expected]
    assert [r["l1"] for r in written["rows"]] == pytest.approx([r["l1"] for r in expected], rel=1e-12)

    out = launch("delta_theta", "--a=org/missing", "--b=org/tiny", timeout=600)
    assert out.returncode == 1
    assert (
        out.stderr.strip()
        .splitlines()[-1]
        .startswith("error: flag --base_checkpoint=org/missing: hub model org/missing is not in the local HF cache at ")
    )


def test_serve_checkpoint_takes_a_hub_id(offline):
    from rltldr_jax.cli import serve

    assert serve.parse_args(["--checkpoint=org/tiny@v1"]).checkpoint == offline["b"]
    assert serve.parse_args(["--model_path=org/tiny"]).checkpoint == offline["a"]  # its name before this release
    with pytest.raises(SystemExit) as e:
        serve.parse_args(["--checkpoint=org/missing"])
    assert str(e.value.code).startswith("error: --checkpoint: hub model org/missing is not in the local HF cache")


@pytest.mark.parametrize(
    "preset,expected",
    [
        ("qwen3_5_9b", "--config.model.checkpoint=Qwen/Qwen3.5-9B (the released weights, fetched into the HF cache; "),
        ("qwen3_5_0_8b", "`hf download Qwen/Qwen3.5-0.8B` on a machine with network first"),
        ("replicate_xs", "an HF directory or hub id org/name[@revision] of weights of that architecture"),
    ],
)
def test_a_preset_without_weights_names_its_hub_id(preset, expected):
    from rltldr_jax.train.setup import build_policy

    c = base.override(sapi.get_config("paper"), {"model.preset": preset})
    with pytest.raises(ValueError, match=f"^model.preset={preset} needs model.checkpoint: ") as e:
        build_policy(settings_of(base.validate(c)))
    assert expected in str(e.value)
