"""Qwen 3.5 text-model configuration, read from and written to HF `config.json`."""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

LINEAR, FULL = "linear_attention", "full_attention"


@dataclasses.dataclass(frozen=True)
class Qwen35Config:
    """The text part of a Qwen 3.5 checkpoint (HF `Qwen3_5TextConfig`), with the fields the forward pass uses.

    Layer `i` is a Gated DeltaNet layer (`linear_attention`) or gated full attention (`full_attention`) as
    `layer_types[i]` says; Qwen 3.5 repeats (3 × DeltaNet, 1 × attention).
    """

    vocab_size: int = 248_320
    hidden_size: int = 4096
    intermediate_size: int = 12_288
    num_hidden_layers: int = 32
    num_attention_heads: int = 16
    num_key_value_heads: int = 4
    head_dim: int = 256
    linear_num_key_heads: int = 16
    linear_num_value_heads: int = 32
    linear_key_head_dim: int = 128
    linear_value_head_dim: int = 128
    linear_conv_kernel_dim: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000_000.0
    partial_rotary_factor: float = 0.25
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 262_144
    layer_types: tuple[str, ...] = ()
    hidden_act: str = "silu"

    def __post_init__(self):
        if not self.layer_types:  # HF's default: every 4th layer is full attention
            object.__setattr__(
                self, "layer_types", tuple(FULL if (i + 1) % 4 == 0 else LINEAR for i in range(self.num_hidden_layers))
            )
        object.__setattr__(self, "layer_types", tuple(self.layer_types))
        problems = []
        if len(self.layer_types) != self.num_hidden_layers:
            problems.append(f"{len(self.layer_types)} layer_types for num_hidden_layers={self.num_hidden_layers}")
        if set(self.layer_types) - {LINEAR, FULL}:
            problems.append(f"unknown layer types {sorted(set(self.layer_types) - {LINEAR, FULL})}")
        if self.num_attention_heads % self.num_key_value_heads:
            problems.append(f"num_attention_heads={self.num_attention_heads} not a multiple of num_key_value_heads")
        if self.linear_num_value_heads % self.linear_num_key_heads:
            problems.append(
                f"linear_num_value_heads={self.linear_num_value_heads} not a multiple of linear_num_key_heads"
            )
        if self.rotary_dim % 2 or self.rotary_dim > self.head_dim:
            problems.append(f"rotary dim {self.rotary_dim} must be even and <= head_dim={self.head_dim}")
        if self.hidden_act != "silu":
            problems.append(f"hidden_act={self.hidden_act!r}; Qwen 3.5 uses silu")
        problems += self._type_problems()
        if problems:
            raise ValueError("invalid Qwen 3.5 config: " + "; ".join(problems))

    def _type_problems(self) -> list[str]:
        """Fields of the wrong type (e.g. a size given as a string in a hand-edited config.json)."""
        problems = []
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type == "int":
                ok = isinstance(value, int) and not isinstance(value, bool) and value > 0
                want = "a positive integer"
            elif f.type == "float":
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
                want = "a number"
            elif f.type == "bool":
                ok, want = isinstance(value, bool), "true or false"
            else:
                continue
            if not ok:
                problems.append(f"{f.name}={value!r} must be {want}")
        return problems

    # -- derived sizes ----------------------------------------------------------------------------------

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each attention head that RoPE rotates (64 of 256 for Qwen 3.5)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def linear_key_dim(self) -> int:
        return self.linear_num_key_heads * self.linear_key_head_dim

    @property
    def linear_value_dim(self) -> int:
        return self.linear_num_value_heads * self.linear_value_head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the DeltaNet causal conv: [q | k | v]."""
        return 2 * self.linear_key_dim + self.linear_value_dim

    @property
    def block_pattern(self) -> tuple[str, ...]:
        """The shortest repeating unit of `layer_types` (3 × linear + 1 × full for Qwen 3.5).

        The model stacks one set of parameters per repetition and scans over them, so compile time does not
        grow with depth. A non-periodic layout is one block of all layers.
        """
        n = len(self.layer_types)
        for period in range(1, n + 1):
            if n % period == 0 and self.layer_types == self.layer_types[:period] * (n // period):
                return self.layer_types[:period]
        return self.layer_types  # unreachable: period n always matches

    @property
    def block_runs(self) -> tuple[tuple[str, int], ...]:
        """The block pattern as runs of one layer type: ((linear_attention, 3), (full_attention, 1)) for Qwen 3.5.

        Each run's layers share one structure, so their parameters are stacked and scanned too: in the backward
        pass only one layer's intermediates are alive at a time.
        """
        runs: list[tuple[str, int]] = []
        for kind in self.block_pattern:
            if runs and runs[-1][0] == kind:
                runs[-1] = (kind, runs[-1][1] + 1)
            else:
                runs.append((kind, 1))
        return tuple(runs)

    @property
    def num_blocks(self) -> int:
        return self.num_hidden_layers // len(self.block_pattern)

    def num_params(self) -> int:
        """Number of parameters of the text model (8,953,803,264 for the 9B)."""
        d, f = self.hidden_size, self.intermediate_size
        attn = d * self.num_attention_heads * self.head_dim * 2 + 2 * d * self.num_key_value_heads * self.head_dim
        attn += self.num_attention_heads * self.head_dim * d + 2 * self.head_dim
        gdn = d * self.conv_dim + d * self.linear_value_dim + 2 * d * self.linear_num_value_heads
        gdn += self.conv_dim * self.linear_conv_kernel_dim + 2 * self.linear_num_value_heads
        gdn += self.linear_value_head_dim + self.linear_value_dim * d
        per_layer = 3 * d * f + 2 * d
        mixers = sum(attn if t == FULL else gdn for t in self.layer_types)
        embed = self.vocab_size * d * (1 if self.tie_word_embeddings else 2)
        return embed + d + self.num_hidden_layers * per_layer + mixers

    # -- HF config.json --------------------------------------------------------------------------------

    @classmethod
    def from_hf_dict(cls, raw: dict[str, Any]) -> Qwen35Config:
        """From an HF config dict: the VLM layout (`text_config` inside) or a text-only config."""
        text = dict(raw.get("text_config") or raw)
        model_type = text.get("model_type", "qwen3_5_text")
        if model_type not in ("qwen3_5_text", "qwen3_5"):
            raise ValueError(f"not a Qwen 3.5 config: model_type={model_type!r}")
        rope = dict(text.get("rope_parameters") or {})
        if "rope_theta" not in rope and "rope_theta" not in text:
            raise ValueError("config has no rope_theta (rope_parameters.rope_theta); Qwen 3.5 checkpoints use 1e7")
        tie = text.get("tie_word_embeddings", raw.get("tie_word_embeddings", False))
        fields = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in text.items() if k in fields and k not in ("rope_theta", "partial_rotary_factor")}
        kwargs["rope_theta"] = float(rope.get("rope_theta", text.get("rope_theta")))
        kwargs["partial_rotary_factor"] = float(
            rope.get("partial_rotary_factor", text.get("partial_rotary_factor", 0.25))
        )
        kwargs["tie_word_embeddings"] = bool(tie)
        if text.get("layer_types") is not None:
            kwargs["layer_types"] = tuple(text["layer_types"])
        return cls(**kwargs)

    @classmethod
    def from_json_file(cls, file: str | os.PathLike) -> Qwen35Config:
        """Reads an HF `config.json` file (VLM or text layout).

        Raises:
          FileNotFoundError: there is no such file.
          ValueError: the file is not a Qwen 3.5 config (not JSON, another model type, a field of the wrong type);
            the message names the file, what is wrong and the fix.
        """
        file = os.fspath(file)
        if not os.path.isfile(file):
            raise FileNotFoundError(f"no config file {file!r}")
        try:
            with open(file, encoding="utf-8") as f:
                raw = json.load(f)
            if not isinstance(raw, dict):
                raise ValueError(f"it holds a JSON {type(raw).__name__}, not an object")
            return cls.from_hf_dict(raw)
        except (ValueError, TypeError, KeyError) as e:  # (json.JSONDecodeError and UnicodeDecodeError are ValueErrors)
            raise ValueError(
                f"{file} is not a usable Qwen 3.5 config.json ({e}): fix it, or replace it with the config.json of the "
                "checkpoint it belongs to"
            ) from None

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike) -> Qwen35Config:
        """Reads `config.json` from a checkpoint directory (errors as `from_json_file`)."""
        file = os.path.join(path, "config.json")
        if not os.path.isfile(file):
            raise FileNotFoundError(
                f"no config.json in {os.fspath(path)!r}: expected an HF Qwen 3.5 checkpoint directory"
            )
        return cls.from_json_file(file)

    def to_hf_dict(self) -> dict[str, Any]:
        """A text-only HF config (`Qwen3_5ForCausalLM`), which transformers and SGLang load."""
        out = {
            "architectures": ["Qwen3_5ForCausalLM"],
            "model_type": "qwen3_5_text",
            "rope_parameters": {
                "rope_type": "default",
                "rope_theta": self.rope_theta,
                "partial_rotary_factor": self.partial_rotary_factor,
            },
        }
        for f in dataclasses.fields(self):
            if f.name not in ("rope_theta", "partial_rotary_factor"):
                value = getattr(self, f.name)
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out
