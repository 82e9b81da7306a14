"""Hugging Face hub ids wherever a model or tokenizer path is expected: `--config.model.checkpoint=Qwen/Qwen3.5-9B`,
as in TRL, verl and tunix.

`resolve(value)` turns what a user gives as a model (or tokenizer) into a local path:

- an existing local path (file or directory; absolute, relative to the current directory, or `~/...`): that path,
  made absolute. **An existing path always wins**: `Qwen/Qwen3.5-9B` names ./Qwen/Qwen3.5-9B when there is one;
- else a hub id, `org/name` or `org/name@revision` (a branch, tag or commit hash): its snapshot directory in the
  local HF cache (`models--org--name/snapshots/<commit>`), downloaded there first when it is missing or the hub has
  a newer commit (`huggingface_hub.snapshot_download`, only the files a Qwen 3.5 checkpoint needs: `config.json`,
  the safetensors weights and the tokenizer files; only the tokenizer files for `what="tokenizer"`). A hub id starts
  with a letter or digit (never `/`, `.` or `~`), has exactly one `/` before the optional `@revision` and holds no
  `:`, so `DIR:STEP` training checkpoints and `gs://` URLs are never taken for one;
- else the value unchanged, for the caller's own "no such file or directory" error.

A missing relative directory shaped like an id (`ckpts/mine`) is therefore looked up on the hub: its error says that
there is neither such a local path nor such a cached (or hub) model.

The cache is huggingface_hub's: `$HF_HUB_CACHE`, else `$HF_HOME/hub`, else ~/.cache/huggingface/hub, read from the
environment when `resolve` is called. With `HF_HUB_OFFLINE=1` only the cache is used (and it is used as a fallback
when the hub cannot be reached); an id that is not cached then is a `HubError` saying how to get it there.

Ids are resolved once, where the path enters: the config's model and tokenizer keys in
`rltldr_jax.config.base.absolute_paths`, launcher flags in `rltldr_jax.cli.common.define_model_path` and
`launch/serve.py --checkpoint`. A run then records the snapshot directory, whose name pins the commit it used.
"""

from __future__ import annotations

import glob
import os
import re
from typing import Literal

from rltldr_jax.tokenization import TOKENIZER_COMPANIONS

#: The tokenizer files of an HF repository (any of them may be absent): fetched with a model and for a tokenizer.
TOKENIZER_FILES = ("tokenizer.json", *TOKENIZER_COMPANIONS, "*.model", "*.tiktoken")

#: What `resolve` fetches of a repository, and what the snapshot must then hold (glob patterns; one match each).
PATTERNS: dict[str, tuple[str, ...]] = {
    "model": (
        "config.json",
        "adapter_config.json",  # (a PEFT LoRA adapter: adapter_config.json + adapter_model.safetensors)
        "generation_config.json",
        "*.safetensors",
        "*.safetensors.index.json",
        *TOKENIZER_FILES,
    ),
    "tokenizer": TOKENIZER_FILES,
}
#: Each entry: patterns of which one must match (a model's or a PEFT adapter's config).
REQUIRED: dict[str, tuple[tuple[str, ...], ...]] = {
    "model": (("config.json", "adapter_config.json"), ("*.safetensors",)),
    "tokenizer": (("tokenizer.json",),),
}

#: `org/name[@revision]`: HF's repository name characters, one `/`, a revision of branch/tag characters or a hash.
_HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w.][\w./-]*))?")
_TRUE = {"1", "ON", "YES", "TRUE"}


class HubError(ValueError):
    """A hub id that cannot be resolved to a local snapshot; the message names the id and the fix."""


def parse_id(value: str) -> tuple[str, str | None] | None:
    """(repository, revision or None) of a hub id `org/name[@revision]`, None for anything else (see the module
    docstring for the rule; `--`, `..` and names over 96 characters are refused as the hub refuses them)."""
    match = _HUB_ID.fullmatch(value)
    if match is None:
        return None
    repo = match["repo"]
    if ".." in repo or "--" in repo or len(repo.split("/")[1]) > 96 or repo.endswith((".", "-")):
        return None
    return repo, match["revision"]


def cache_dir() -> str:
    """The HF hub cache `snapshot_download` uses, from the environment now (huggingface_hub reads it once, at
    import): `$HF_HUB_CACHE` (or the older `$HUGGINGFACE_HUB_CACHE`), else `$HF_HOME/hub`, else
    `$XDG_CACHE_HOME/huggingface/hub` (~/.cache/huggingface/hub)."""
    path = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if not path:
        home = os.environ.get("HF_HOME") or os.path.join(
            os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache"), "huggingface"
        )
        path = os.path.join(home, "hub")
    return os.path.abspath(os.path.expanduser(os.path.expandvars(path)))


def offline() -> bool:
    """Whether `HF_HUB_OFFLINE` (or `TRANSFORMERS_OFFLINE`) is set to 1/on/yes/true now."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.upper() in _TRUE


def resolve(path_or_id: str, *, what: Literal["model", "tokenizer"] = "model") -> str:
    """The local path of a model or tokenizer given as a path or a hub id (the rule: the module docstring).

    Args:
      path_or_id: a file or directory, or `org/name[@revision]`; "" stays "".
      what: "model" fetches config.json, the safetensors weights and the tokenizer files; "tokenizer" only the
        tokenizer files.

    Returns:
      An existing path made absolute; a hub id's snapshot directory; anything else unchanged.

    Raises:
      HubError: a hub id whose snapshot cannot be had (not cached while offline or unreachable, unknown repository
        or revision, no safetensors weights), in one line naming the id and the fix.
    """
    if not path_or_id:
        return path_or_id
    local = os.path.expanduser(path_or_id)
    if os.path.exists(local):
        return os.path.abspath(local)
    parsed = parse_id(path_or_id)
    if parsed is None:
        return path_or_id
    repo, revision = parsed
    folder = _snapshot(path_or_id, repo, revision, what)
    found = lambda pattern: glob.glob(os.path.join(glob.escape(folder), pattern))  # noqa: E731
    missing = [
        alts[0] + "".join(f" (or {a})" for a in alts[1:]) for alts in REQUIRED[what] if not any(found(p) for p in alts)
    ]
    if missing:
        raise HubError(
            f"the snapshot of hub model {path_or_id} at {folder} has no {' or '.join(missing)}: "
            + (
                f"run `{_download_command(repo, revision)}` on a machine with network to complete the cache, or give "
                "a local directory"
                if offline()
                else "it is no HF safetensors checkpoint (config.json, *.safetensors, tokenizer.json): give another "
                "repository or a local directory"
            )
        )
    return folder


def _download_command(repo: str, revision: str | None) -> str:
    return f"hf download {repo}" + (f" --revision {revision}" if revision else "")


def _snapshot(value: str, repo: str, revision: str | None, what: Literal["model", "tokenizer"]) -> str:
    """`snapshot_download` of `repo` into `cache_dir()`, its errors as one-line HubErrors."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    cache = cache_dir()
    try:
        return snapshot_download(
            repo,
            revision=revision,
            cache_dir=cache,
            allow_patterns=list(PATTERNS[what]),
            local_files_only=offline(),
        )
    except RevisionNotFoundError:
        raise HubError(
            f"hub model {repo} has no revision {revision!r}: give a branch, tag or commit hash of it "
            f"({repo}@main, {repo}@<commit>)"
        ) from None
    except GatedRepoError:
        raise HubError(
            f"hub model {repo} is gated: accept its terms on huggingface.co and log in (`hf auth login` or "
            "$HF_TOKEN), or give a local directory"
        ) from None
    except RepositoryNotFoundError:
        raise HubError(
            f"{value!r} is neither an existing local path nor a model on the hub (no repository {repo}, or a "
            "private one: log in with `hf auth login`); give an existing directory or a hub id org/name[@revision]"
        ) from None
    except IncompleteSnapshotError:
        raise HubError(
            f"the cached snapshot of hub model {value} in {cache} is incomplete (an interrupted download?) and "
            f"{'HF_HUB_OFFLINE is set' if offline() else 'the hub could not be reached'}: run "
            f"`{_download_command(repo, revision)}` on a machine with network to complete it, or give a local directory"
        ) from None
    except (LocalEntryNotFoundError, HfHubHTTPError) as e:
        cause = type(e.__cause__ or e).__name__  # (snapshot_download raises the connection error's as the cause)
        reason = "HF_HUB_OFFLINE is set" if offline() else f"the hub could not be reached: {cause}"
        raise HubError(
            f"hub model {value} is not in the local HF cache at {cache} and there is no local path {value!r} "
            f"({reason}): run `{_download_command(repo, revision)}` on a machine with network (into this cache, or "
            "one you then point HF_HOME at), set HF_HOME to a cache holding it, or give a local directory"
        ) from None
    except OSError as e:  # the cache cannot be written (permissions, a full disk), ...
        raise HubError(
            f"could not download hub model {value} into the HF cache at {cache} ({e}): make the cache writable, "
            "point HF_HOME at one that is, or give a local directory"
        ) from None
