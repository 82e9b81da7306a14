"""Shared fixtures: the Qwen 3.5 tokenizer (~3 s to build) and a tiny policy engine (compiling is the cost)."""

import dataclasses
import os

import jax
import pytest

# Compiled XLA programs are cached on disk, so the many Trainers/engines the tests build with the same shapes
# compile once per session (and once per machine across sessions); tracing still runs every time.
jax.config.update(
    "jax_compilation_cache_dir",
    os.environ.get("RLTLDR_TEST_XLA_CACHE", os.path.join(os.path.dirname(os.path.dirname(__file__)), ".pytest_cache", "xla")),
)
jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.5)

from rltldr_jax.tokenization import ContextBuilder, Tokenizer, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return load_tokenizer()


@pytest.fixture(scope="session")
def builder(tokenizer) -> ContextBuilder:
    return ContextBuilder(tokenizer)


@pytest.fixture(scope="session")
def tiny_policy():
    """(model, JaxEngine): a tiny random Qwen 3.5 (4 layers) with the real 248,320-token vocabulary."""
    from rltldr_jax.engines import JaxEngine
    from rltldr_jax.models import ModelSpec, get_preset

    config = dataclasses.replace(get_preset("tiny"), num_hidden_layers=4, layer_types=())
    model = ModelSpec(config).build(seed=0)
    with JaxEngine(model, max_batch=2, max_len=2048) as engine:
        yield model, engine
