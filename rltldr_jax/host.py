"""The machine a run's numbers came from: `{workdir}/hosts.jsonl`, one line per start of the run.

A seed fixes a run only on one kind of machine. XLA compiles for the processor it runs on (on a CPU, for its vector
instructions: AVX2 or AVX-512 sum a reduction in another order), so the same code, config and seed give updates that
differ in the last bits on another processor, another jaxlib or another accelerator, and an RL run amplifies them
(seen on the replication's 2-core CPUs: equal sampled attempts for 14 phases, then apart). A resumed run equals an
uninterrupted one bit for bit only when it resumes on the same kind of machine. So each start of a run appends what
its numbers depend on, and a resume on another kind of machine says so in one warning line (the run goes on: it is a
valid run, not a reproducible one).

    record = describe()                            # {"cpu": ..., "cpu_isa": [...], "jax": ..., "devices": [...], ...}
    changed = record_start(workdir, from_step=0)   # appends to hosts.jsonl; what differs from the previous start
"""

from __future__ import annotations

import json
import os
import platform
from collections.abc import Mapping
from typing import Any

HOSTS_FILE = "hosts.jsonl"

#: The processor features XLA's CPU code generation reads that change the order of floating-point sums (x86 vector
#: widths and fused multiply-add, AVX-512/AMX extensions; Arm's NEON and SVE).
ISA_FEATURES = (
    "sse4_2",
    "avx",
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "asimd",
    "asimdhp",
    "sve",
    "sve2",
    "bf16",
    "i8mm",
)

#: The keys of a record that change what a run computes (`cpu` and `cores` only name the machine).
NUMERIC_KEYS = ("machine", "cpu_isa", "backend", "devices", "jax", "jaxlib", "xla_flags")


def _cpuinfo_fields(cpuinfo: str) -> dict[str, str]:
    """The first value of each field of Linux's `cpuinfo` (keys lower-cased); {} where it cannot be read."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in lines:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip().lower(), value.strip())
    return fields


def cpu_features(cpuinfo: str = "/proc/cpuinfo") -> list[str]:
    """The `ISA_FEATURES` the processor has, from Linux's `cpuinfo` ("flags" on x86, "Features" on Arm); [] where it
    cannot be read (another OS)."""
    fields = _cpuinfo_fields(cpuinfo)
    have = set((fields.get("flags") or fields.get("features") or "").split())
    return [feature for feature in ISA_FEATURES if feature in have]


def cpu_name(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The processor's model name ("AMD EPYC ..."), or `platform.processor()` where cpuinfo has none."""
    fields = _cpuinfo_fields(cpuinfo)
    for key in ("model name", "cpu model", "hardware"):
        if fields.get(key):
            return fields[key]
    return platform.processor() or platform.machine()


def describe() -> dict[str, Any]:
    """What this process's numbers depend on besides code, config and seed: the processor (name, architecture, the
    `ISA_FEATURES` it has, cores), JAX's backend and device kinds, the jax and jaxlib versions, and `XLA_FLAGS`."""
    import jax
    import jaxlib

    return {
        "cpu": cpu_name(),
        "machine": platform.machine(),
        "cpu_isa": cpu_features(),
        "cores": os.cpu_count(),
        "backend": jax.default_backend(),
        "devices": sorted({d.device_kind for d in jax.devices()}),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
    }


def numeric_differences(before: Mapping[str, Any], now: Mapping[str, Any]) -> list[str]:
    """The `NUMERIC_KEYS` on which two records differ, as "key: before -> now" (for a list, what it lost and
    gained); [] when a run started on `now` computes as one started on `before`."""
    out = []
    for key in NUMERIC_KEYS:
        a, b = before.get(key), now.get(key)
        if a == b:
            continue
        if isinstance(a, list) and isinstance(b, list):
            lost, gained = [x for x in a if x not in b], [x for x in b if x not in a]
            parts = ([f"without {', '.join(lost)}"] if lost else []) + ([f"with {', '.join(gained)}"] if gained else [])
            out.append(f"{key}: {'; '.join(parts)}")
        else:
            out.append(f"{key}: {a!r} -> {b!r}")
    return out


def read_hosts(workdir: str) -> list[dict[str, Any]]:
    """The records of `{workdir}/hosts.jsonl`, oldest first ([] when the run has none, e.g. one trained before it
    existed)."""
    path = os.path.join(workdir, HOSTS_FILE)
    if not os.path.isfile(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def record_start(workdir: str, *, from_step: int, record: Mapping[str, Any] | None = None) -> list[str]:
    """Appends this start of the run in `workdir` (from environment step `from_step`; `record`: `describe()` by
    default) to `hosts.jsonl`, and returns how it differs from the previous start (`numeric_differences`; [] for
    the first start or the same kind of machine)."""
    record = dict(describe() if record is None else record)
    previous = read_hosts(workdir)
    with open(os.path.join(workdir, HOSTS_FILE), "a", encoding="utf-8") as f:
        f.write(json.dumps({"from_step": from_step, **record}) + "\n")
    return numeric_differences(previous[-1], record) if previous else []
