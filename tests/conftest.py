"""Shared fixtures: building the Qwen 3.5 tokenizer takes ~3 s, so it is built once per session."""

import pytest

from rltldr_jax.tokenization import ContextBuilder, Tokenizer, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer() -> Tokenizer:
    return load_tokenizer()


@pytest.fixture(scope="session")
def builder(tokenizer) -> ContextBuilder:
    return ContextBuilder(tokenizer)
