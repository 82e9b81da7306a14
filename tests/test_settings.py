"""Settings with one source of truth: every key, default, bound and choice declared once (rltldr_jax/settings.py),
the config built from it, validation reading it, library views built from it by name, no ConfigDict below the
entry points."""

from __future__ import annotations

import dataclasses
import inspect
import os
import re

import pytest

from rltldr_jax import settings as st
from rltldr_jax.agent.episode import EpisodeConfig
from rltldr_jax.agent.insight import InsightWriter
from rltldr_jax.agent.schedule import InsightSchedule
from rltldr_jax.config import base
from rltldr_jax.engines.factory import EngineConfig, TeacherConfig
from rltldr_jax.sharding import MeshConfig
from rltldr_jax.train.batching import INSIGHT_ROLLOUTS, ExampleConfig
from rltldr_jax.train.loop import UpdateConfig
from rltldr_jax.train.step import LossConfig, make_optimizer

PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rltldr_jax")


def test_the_config_is_the_settings_defaults_and_round_trips():
    config = base.get_config()
    registered = dict(st.settings_of(config).loss.extra)  # terms other tests of this process registered
    assert st.settings_of(config) == st.Settings(loss=st.Loss(extra=registered))
    assert config.to_dict() == st.as_dict(st.Settings(loss=st.Loss(extra=registered)))
    # A key of a term registered from outside the package lives in Loss.extra and comes back inline.
    config.loss["my_coef"] = 0.25
    s = st.settings_of(config)
    assert s.loss.extra == {**registered, "my_coef": 0.25} and st.as_dict(s) == config.to_dict()
    assert st.value_at(s, "loss.my_coef") == 0.25 and st.value_at(s, "insight.teacher.servers") == ""


def test_a_tree_with_a_missing_or_unknown_key_is_refused_naming_it():
    d = st.as_dict(st.Settings())
    del d["rollout"]["group_size"]
    with pytest.raises(st.SettingsError, match="config key 'rollout.group_size' is missing"):
        st.settings_of(d)
    d = st.as_dict(st.Settings())
    d["insight"]["teacher"]["port"] = 1
    with pytest.raises(st.SettingsError, match=r"unknown config key\(s\) 'insight.teacher.port'"):
        st.settings_of(d)


def _outside(bounds: st.Bounds, default: float) -> float:
    """A value just outside `bounds`, of the default's type (ConfigDict keeps a key's type)."""
    step = 1 if isinstance(default, int) else 0.5
    if bounds.ge is not None:
        return type(default)(bounds.ge - step)
    if bounds.gt is not None:
        return type(default)(bounds.gt)
    if bounds.le is not None:
        return type(default)(bounds.le + step)
    return type(default)(bounds.lt)


@pytest.mark.parametrize("key", [k for k, f in st.declared() if f.metadata["bounds"] is not None])
def test_every_declared_bound_is_validated(key):
    config = base.get_config()
    bounds = dict(st.declared())[key].metadata["bounds"]
    value = _outside(bounds, base.get(config, key))
    base.override(config, {key: value})
    with pytest.raises(base.ConfigError) as info:
        base.validate(config)
    assert f"  - {key}={value!r} is outside {bounds}" in str(info.value).splitlines()


@pytest.mark.parametrize("key", [k for k, f in st.declared() if f.metadata["choices"] is not None])
def test_every_declared_choice_is_validated(key):
    config = base.override(base.get_config(), {key: "no-such-value"})
    with pytest.raises(base.ConfigError, match=f"{key}='no-such-value' is not one of {st.choices(key)[0]!r}"):
        base.validate(config)


def test_bounds_read_as_intervals():
    assert str(st.Bounds(ge=1)) == "[1, inf)" and str(st.Bounds(gt=0.0, le=1.0)) == "(0.0, 1.0]"
    assert 0.5 in st.Bounds(gt=0.0, lt=1.0) and 1.0 not in st.Bounds(gt=0.0, lt=1.0) and 0 in st.Bounds(ge=0)


def test_the_library_choice_lists_are_the_settings():
    assert tuple(INSIGHT_ROLLOUTS) == st.choices("loss.insight_rollouts")  # the rollout modes' registry


# (view, its section, parameters given from elsewhere): what `build` fills by name.
VIEWS = [
    (EpisodeConfig, "rollout", ("max_observation_chars", "seed")),
    (ExampleConfig, "loss", ()),
    (MeshConfig, "mesh", ()),
    (UpdateConfig, "batch", ("max_context_tokens", "max_logprob_gap", "seed", "length_buckets")),
    (EngineConfig, "engine", ("max_context_tokens", "teacher")),
    (TeacherConfig, "insight.teacher", ("dtype", "param_dtype", "allow_nonfinite")),
    (InsightSchedule, "insight", ()),
    (InsightWriter, "insight", ("tokenizer", "engine", "teacher_engine", "teacher_tokenizer")),
    (InsightWriter, "insight", ("max_observation_chars", "temperature")),
    (make_optimizer, "optim", ()),
]


@pytest.mark.parametrize(
    ("view", "section", "given"), VIEWS, ids=[f"{v.__name__}-{i}" for i, (v, _, _) in enumerate(VIEWS)]
)
def test_a_views_defaults_are_the_settings_defaults(view, section, given):
    """A library part's own defaults (used by tests and notebooks that build it directly) are the paper's, as the
    settings declare them: no second truth."""
    defaults = st.value_at(st.Settings(), section)
    if dataclasses.is_dataclass(view):
        params = {f.name: f.default for f in dataclasses.fields(view) if f.default is not dataclasses.MISSING}
    else:
        fn = view.__init__ if isinstance(view, type) else view
        params = {p.name: p.default for p in inspect.signature(fn).parameters.values() if p.default is not p.empty}
    checked = [name for name in params if hasattr(defaults, name) and name not in given and name != "extra"]
    assert checked or view is TeacherConfig or view is UpdateConfig or view is EngineConfig
    for name in checked:
        assert params[name] == getattr(defaults, name), (view, name)


def test_views_of_a_run_read_every_field_from_its_settings():
    s = st.replace(
        st.Settings(),
        {"rollout.max_steps": 7, "env.max_observation_chars": 99, "seed": 5, "loss.lam": 0.25, "mesh.fsdp": 2},
    )
    assert EpisodeConfig.of(s) == dataclasses.replace(EpisodeConfig(), max_steps=7, max_observation_chars=99, seed=5)
    assert ExampleConfig.of(s).lam == 0.25 and st.build(MeshConfig, s.mesh) == MeshConfig(1, 2, 1)
    assert LossConfig.of(s.loss).lam == 0.25
    assert UpdateConfig.of(s).seed == 5 and EngineConfig.of(s).teacher is None
    teacher = st.replace(s, {"insight.source": "teacher", "insight.teacher.servers": "h:1", "model.dtype": "float32"})
    assert EngineConfig.of(teacher).teacher == TeacherConfig("", "h:1", "", "float32", "float32", False)


def test_build_refuses_what_it_cannot_fill():
    with pytest.raises(TypeError, match="EpisodeConfig: max_observation_chars, seed not in the Rollout section"):
        st.build(EpisodeConfig, st.Settings().rollout)
    with pytest.raises(TypeError, match="MeshConfig takes no devices"):
        st.build(MeshConfig, st.Settings().mesh, devices=2)


def test_replace_and_value_at_name_unknown_keys():
    s = st.Settings()
    assert st.replace(s, {"insight.teacher.servers": "h:1"}).insight.teacher.servers == "h:1"
    assert s.insight.teacher.servers == ""  # a copy: settings are frozen
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.seed = 1  # type: ignore[misc]
    assert hash(s) == hash(st.Settings())  # hashable, Loss.extra included (it is not hashed)
    for key in ("loss.nope", "rollout", "seed.x"):
        with pytest.raises(st.SettingsError, match="unknown settings key"):
            st.replace(s, {key: 1})
    with pytest.raises(st.SettingsError, match="unknown settings key 'loss.nope'"):
        st.value_at(s, "loss.nope")


def test_no_library_module_below_the_entry_points_handles_a_config_dict():
    """Only the config package (files, flags, validation) and the launchers import ml_collections."""
    found = []
    for folder, _, files in os.walk(PACKAGE):
        rel = os.path.relpath(folder, PACKAGE)
        if rel.split(os.sep)[0] in ("config", "cli"):
            continue
        for name in files:
            text = open(os.path.join(folder, name), encoding="utf-8").read() if name.endswith(".py") else ""
            if re.search(r"^\s*(import|from) ml_collections", text, re.MULTILINE):
                found.append(os.path.join(rel, name))
    assert found == []


def test_a_config_recorded_by_an_earlier_version_reads_with_todays_defaults():
    """A finished run's recorded config (summary.json) lacks the keys added since (here `model.base_checkpoint` and
    the `logging` section): the analyses read it with those keys at their defaults; `settings_of` stays strict."""
    from rltldr_jax.settings import Settings, SettingsError, as_dict, recorded_settings, settings_of

    old = as_dict(Settings())
    del old["model"]["base_checkpoint"], old["logging"]
    old["loss"]["lam"] = 0.25
    with pytest.raises(SettingsError, match="config key 'model.base_checkpoint' is missing"):
        settings_of(old)
    settings = recorded_settings(old)
    assert settings.loss.lam == 0.25 and settings.model.base_checkpoint == Settings().model.base_checkpoint
    assert settings.logging == Settings().logging
