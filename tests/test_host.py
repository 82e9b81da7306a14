"""host.py: the machine of each start of a run (hosts.jsonl), and the warning when a run resumes on another kind."""

from __future__ import annotations

import json
import logging
import os

import jax
import jaxlib
from helpers import tiny_run_settings

from rltldr_jax import host
from rltldr_jax.train.loggers import open_loggers

X86 = """processor\t: 0
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse sse2 sse4_2 avx avx2 fma f16c avx512f avx512bw avx512_bf16 hypervisor
processor\t: 1
model name\t: AMD EPYC 9B14
flags\t\t: fpu sse sse2 sse4_2 avx avx2 fma f16c avx512f avx512bw avx512_bf16 hypervisor
"""
ARM = """processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes asimdhp sve sve2 bf16 i8mm
CPU implementer\t: 0x41
"""


def _cpuinfo(tmp_path, text: str) -> str:
    path = str(tmp_path / "cpuinfo")
    with open(path, "w") as f:
        f.write(text)
    return path


def test_the_vector_features_are_read_from_cpuinfo_on_x86_and_arm(tmp_path):
    x86 = _cpuinfo(tmp_path, X86)
    assert host.cpu_features(x86) == ["sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16"]
    assert host.cpu_name(x86) == "AMD EPYC 9B14"
    assert host.cpu_features(_cpuinfo(tmp_path, ARM)) == ["asimd", "asimdhp", "sve", "sve2", "bf16", "i8mm"]
    assert host.cpu_features(str(tmp_path / "missing")) == []


def test_this_machine_is_described_with_what_its_numbers_depend_on():
    record = host.describe()
    assert set(host.NUMERIC_KEYS) <= set(record) and {"cpu", "cores"} <= set(record)
    assert record["backend"] == "cpu" and record["devices"] == ["cpu"]
    assert (record["jax"], record["jaxlib"]) == (jax.__version__, jaxlib.__version__)
    assert json.loads(json.dumps(record)) == record


def test_only_what_changes_the_numbers_counts_as_another_kind_of_machine():
    a = {"cpu": "EPYC A", "cores": 2, "machine": "x86_64", "cpu_isa": ["avx", "avx2", "avx512f"], "jax": "0.10.2"}
    assert host.numeric_differences(a, {**a, "cpu": "EPYC B", "cores": 64}) == []
    assert host.numeric_differences(a, {**a, "cpu_isa": ["avx", "avx2"], "jax": "0.10.3"}) == [
        "cpu_isa: without avx512f",
        "jax: '0.10.2' -> '0.10.3'",
    ]
    assert host.numeric_differences(a, {**a, "cpu_isa": ["avx", "avx2", "avx512f", "amx_bf16"]}) == [
        "cpu_isa: with amx_bf16"
    ]


def test_each_start_is_appended_and_a_change_of_machine_is_returned(tmp_path):
    workdir = str(tmp_path)
    a = {"machine": "x86_64", "cpu_isa": ["avx2", "avx512f"], "jaxlib": "0.10.2"}
    assert host.record_start(workdir, from_step=0, record=a) == []
    assert host.record_start(workdir, from_step=64, record=a) == []
    assert host.record_start(workdir, from_step=128, record={**a, "cpu_isa": ["avx2"]}) == ["cpu_isa: without avx512f"]
    assert [r["from_step"] for r in host.read_hosts(workdir)] == [0, 64, 128]
    assert host.read_hosts(str(tmp_path / "none")) == []


def test_a_run_records_its_machine_and_a_resume_elsewhere_warns(tmp_path, monkeypatch, caplog):
    workdir = str(tmp_path / "run")
    os.makedirs(workdir)
    settings = tiny_run_settings(workdir, 1)
    open_loggers(settings, workdir).close()
    (first,) = host.read_hosts(workdir)
    assert first == {"from_step": 0, **host.describe()}
    with caplog.at_level(logging.WARNING, logger="rltldr_jax"):
        open_loggers(settings, workdir, resume=True, resumed_at=(64, 10, 1.0)).close()
    assert not [r for r in caplog.records if "another kind of machine" in r.getMessage()]
    elsewhere = {**first, "cpu_isa": [*first["cpu_isa"], "fake_isa"]}
    elsewhere.pop("from_step")
    monkeypatch.setattr(host, "describe", lambda: elsewhere)
    with caplog.at_level(logging.WARNING, logger="rltldr_jax"):
        open_loggers(settings, workdir, resume=True, resumed_at=(128, 20, 2.0)).close()
    (warning,) = [r.getMessage() for r in caplog.records if "another kind of machine" in r.getMessage()]
    assert "cpu_isa: with fake_isa" in warning and host.HOSTS_FILE in warning
    assert [r["from_step"] for r in host.read_hosts(workdir)] == [0, 64, 128]
