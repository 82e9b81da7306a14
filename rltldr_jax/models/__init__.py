"""Qwen 3.5 in Flax NNX: config and presets, the model with its decode state, HF safetensors in and out."""

from rltldr_jax.models.config import Qwen35Config
from rltldr_jax.models.hf import CheckpointError, CorruptCheckpointError, load_pretrained, save_pretrained
from rltldr_jax.models.presets import PRESETS, get_preset
from rltldr_jax.models.qwen3_5 import DecodeState, ModelSpec, Qwen35, init_decode_state, sequence_logprobs

__all__ = [
    "CheckpointError",
    "CorruptCheckpointError",
    "DecodeState",
    "ModelSpec",
    "PRESETS",
    "Qwen35",
    "Qwen35Config",
    "get_preset",
    "init_decode_state",
    "load_pretrained",
    "save_pretrained",
    "sequence_logprobs",
]
