"""Architecture presets: the Qwen 3.5 sizes and a tiny one for tests and CPU runs.

Values from the Qwen 3.5 model cards and config.json files. Confirmation status:
- 9B: confirmed against a fixture of the real config and the parameter count (8,953,803,264 text params).
- 4B, 2B, 0.8B: from third-party ports, not read from the official config.json. Unconfirmed: whether 2B
  and 4B tie their embeddings (taken as untied for 4B, tied for 2B like 0.8B, which is "reported" tied).
Load a real checkpoint with `load_pretrained`, which reads its own config.json, to be independent of these.
"""

from __future__ import annotations

from rltldr_jax.models.config import Qwen35Config

PRESETS: dict[str, Qwen35Config] = {
    "qwen3_5_9b": Qwen35Config(
        hidden_size=4096,
        intermediate_size=12288,
        num_hidden_layers=32,
        num_attention_heads=16,
        num_key_value_heads=4,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        tie_word_embeddings=False,
    ),
    "qwen3_5_4b": Qwen35Config(  # unconfirmed (third-party port); tie_word_embeddings unknown
        hidden_size=2560,
        intermediate_size=9216,
        num_hidden_layers=32,
        num_attention_heads=16,
        num_key_value_heads=4,
        linear_num_key_heads=16,
        linear_num_value_heads=32,
        tie_word_embeddings=False,
    ),
    "qwen3_5_2b": Qwen35Config(  # unconfirmed (third-party port); tie_word_embeddings unknown
        hidden_size=2048,
        intermediate_size=6144,
        num_hidden_layers=24,
        num_attention_heads=8,
        num_key_value_heads=2,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        tie_word_embeddings=True,
    ),
    "qwen3_5_0_8b": Qwen35Config(  # unconfirmed (third-party port); tied embeddings reported
        hidden_size=1024,
        intermediate_size=3584,
        num_hidden_layers=24,
        num_attention_heads=8,
        num_key_value_heads=2,
        linear_num_key_heads=16,
        linear_num_value_heads=16,
        tie_word_embeddings=True,
    ),
    # Tiny random model for tests and the `:tiny` run: the real vocabulary (so the real tokenizer works), two
    # blocks of (3 × DeltaNet, 1 × attention), GQA and grouped value heads, tied embeddings.
    "tiny": Qwen35Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        tie_word_embeddings=True,
        max_position_embeddings=32768,
    ),
    # From-scratch policies of the small-scale replication (configs/replicate.py): the same 3:1 pattern of DeltaNet and
    # gated attention, GQA and grouped value heads, with the 512-id vocabulary of the replication's own tokenizer.
    "replicate_xs": Qwen35Config(  # 0.25M parameters: configs/replicate.py (CPU presets) and the tests
        vocab_size=512,
        hidden_size=64,
        intermediate_size=192,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=16,
        linear_value_head_dim=16,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    ),
    "replicate_s": Qwen35Config(  # 0.9M parameters: a larger CPU policy
        vocab_size=512,
        hidden_size=128,
        intermediate_size=384,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=32,
        linear_value_head_dim=32,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    ),
    "replicate_m": Qwen35Config(  # 14M parameters: the `gpu` preset
        vocab_size=512,
        hidden_size=384,
        intermediate_size=1024,
        num_hidden_layers=8,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=64,
        linear_num_key_heads=4,
        linear_num_value_heads=8,
        linear_key_head_dim=48,
        linear_value_head_dim=48,
        tie_word_embeddings=True,
        max_position_embeddings=2048,
    ),
}

#: The Hugging Face hub id of the released weights of a Qwen 3.5 preset, for `model.checkpoint` (a hub id is fetched
#: into the local HF cache: rltldr_jax/models/hub.py). The paper trains Qwen/Qwen3.5-9B.
HUB_IDS: dict[str, str] = {
    "qwen3_5_9b": "Qwen/Qwen3.5-9B",
    "qwen3_5_2b": "Qwen/Qwen3.5-2B",
    "qwen3_5_0_8b": "Qwen/Qwen3.5-0.8B",
}


def get_preset(name: str) -> Qwen35Config:
    """The architecture `name` (a key of PRESETS); unknown names list the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown model preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def preset_error(name: str, checkpoint: str) -> str | None:
    """What contradicts `model.preset=name` in the HF checkpoint directory `checkpoint`'s config.json, in one line,
    None if nothing (or if `checkpoint` is no HF directory here: a training checkpoint `DIR[:STEP]`, a PEFT adapter,
    an absent path, which are checked where they load).

    The architecture of a loaded checkpoint is always its config.json's; the preset is what the run's plans and
    records say it is. A checkpoint whose architecture is another preset's is refused, naming that preset; one that
    is no preset's (a model of your own, or a real size whose preset here is unconfirmed) is accepted with a warning
    naming the fields that differ.
    """
    import dataclasses
    import logging
    import os

    if not checkpoint or name not in PRESETS or not os.path.isfile(os.path.join(checkpoint, "config.json")):
        return None
    try:
        arch = Qwen35Config.from_pretrained(checkpoint)
    except ValueError as e:
        return f"model.checkpoint: {e}"
    preset = PRESETS[name]
    if arch == preset:
        return None
    differ = [
        f"{f.name} {getattr(arch, f.name)} vs {getattr(preset, f.name)}"
        for f in dataclasses.fields(Qwen35Config)
        if getattr(arch, f.name) != getattr(preset, f.name)
    ]
    shown = "; ".join(differ[:4]) + ("; ..." if len(differ) > 4 else "")
    match = next((other for other, p in PRESETS.items() if p == arch), None)
    if match is not None:
        return (
            f"model.preset={name} but model.checkpoint={checkpoint} is the {match} architecture ({shown}): set "
            f"--config.model.preset={match}"
        )
    logging.getLogger(__name__).warning(
        "model.checkpoint=%s is not the architecture of model.preset=%s (%s); its config.json is used",
        checkpoint,
        name,
        shown,
    )
    return None


def checkpoint_needed_error(preset: str, checkpoint: str, pretrain_steps: int) -> str | None:
    """Why a policy of `model.preset=preset` cannot be built without weights, in one line (None when it can: a
    checkpoint is given, the preset is the tiny test one, or `pretrain.steps` > 0 pretrains it first)."""
    if checkpoint or preset == "tiny" or pretrain_steps > 0:
        return None
    hub_id = HUB_IDS.get(preset)
    weights = (
        f"--config.model.checkpoint={hub_id} (the released weights, fetched into the HF cache; offline, run "
        f"`hf download {hub_id}` on a machine with network first) or an HF directory of them"
        if hub_id
        else "an HF directory or hub id org/name[@revision] of weights of that architecture (or pretrain.steps > "
        "0 to pretrain them)"
    )
    return f"model.preset={preset} needs model.checkpoint: {weights}; only the tiny preset starts from random weights"
