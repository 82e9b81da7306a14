"""An HF export round-trips (issue 27 item 1): `launch/export_hf.py` writes a complete HF model directory.

- transformers loads it as is: `AutoTokenizer` gives our ids for the world's real texts (a crafting task, its plan,
  the insight messages) and the chat template renders our contexts; `GenerationConfig` has the stop, padding and BOS
  ids of the tokenizer and the run's sampling; `AutoModelForCausalLM` gives our logits (fp32).
- Our own launchers take it: launch/eval.py's policy finds its tokenizer (and the config's pretrained base accepts
  it as the same policy), training from it (`model.checkpoint`) loads the tokenizer and the weights.
- Files are 0644 and a new directory 0755 whatever the umask (servers read them as another user), also for the
  weight pushes into `engine.weight_sync_dir`.
- The tokenizer is the run's: the world's small one (craft), the built-in Qwen 3.5 one, or a hub-style tokenizer
  directory whose own tokenizer_config.json (chat template) is kept; a LoRA run's `--merge` export is as complete, its
  `--adapter` export ships the tokenizer files beside the PEFT adapter.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from helpers import tiny_config

from rltldr_jax.agent.episode import task_text
from rltldr_jax.checkpoint import Checkpointer, restore_model
from rltldr_jax.cli import export_hf
from rltldr_jax.config import replicate
from rltldr_jax.envs.registry import demonstrations
from rltldr_jax.models import ModelSpec, get_preset, load_pretrained, lora, save_pretrained
from rltldr_jax.models.lora import LoraSpec
from rltldr_jax.settings import as_dict, replace
from rltldr_jax.tokenization import (
    INSIGHT_SCAFFOLD,
    ContextBuilder,
    Insight,
    Step,
    chat_template,
    load_tokenizer,
    render_context,
    write_hf_tokenizer,
)
from rltldr_jax.train.evaluation import eval_policy
from rltldr_jax.train.pretrain import find_pretrained
from rltldr_jax.train.setup import build_policy, policy_tokenizer

#: What a full-weights export holds (one safetensors file below 5 GiB).
COMPLETE = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
OBSERVATION = 'The verifier failed: craft("drill") needs "iron" in the inventory.'


@contextlib.contextmanager
def umask(mask: int):
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def modes(directory) -> dict[str, str]:
    """name -> octal permission bits of every entry of `directory`, and "." for the directory itself."""
    out = {".": oct(stat.S_IMODE(os.stat(directory).st_mode))}
    for name in os.listdir(directory):
        out[name] = oct(stat.S_IMODE(os.stat(os.path.join(directory, name)).st_mode))
    return out


def world_texts(seed: int = 3) -> tuple[str, list[tuple[str, int]], str]:
    """A real crafting task (its message), the insights in its context and the plan that solves it."""
    task, insights, act, _ = demonstrations("craft", insight_prob=1.0)(np.random.default_rng(seed))
    assert insights and 'craft("' in act
    return task_text(task), list(insights), act


def export(*flags: str) -> int:
    return export_hf.main(list(flags))


@pytest.fixture(scope="module")
def craft_run(tmp_path_factory):
    """A training checkpoint (step 7) of a replication run (`rltldr`, seed 0) as its trainer records it: the run's
    config with `model.checkpoint` its pretrained base (the shipped one: the world's own small tokenizer), the
    base's weights slightly moved; plus the same run with LoRA adapters (rank 4, B ≠ 0)."""
    tmp = tmp_path_factory.mktemp("craft_run")
    config = replicate.arm_config(None, "rltldr", 0)
    base = find_pretrained(config)
    assert base is not None, "the shipped base policy of configs/replicate.py seed 0"
    config = replace(config, {"model.checkpoint": base})
    model = load_pretrained(base, compute_dtype=jnp.float32)
    graphdef, state = nnx.split(model)
    keys = iter(jax.random.split(jax.random.key(0), len(jax.tree.leaves(state))))
    state = jax.tree.map(lambda x: x + 0.01 * jax.random.normal(next(keys), x.shape, x.dtype), state)
    with Checkpointer(tmp / "full", keep=None, async_save=False) as ckpt:
        ckpt.save(
            7, params=state, opt_state=None, rng=None, meta={"config": as_dict(config)}, model_config=model.config
        )
    lora_config = replace(config, {"model.lora.rank": 4, "model.lora.alpha": 8.0})
    adapted = lora.attach(nnx.merge(graphdef, state), LoraSpec(rank=4, alpha=8.0))
    adapters = lora.adapter_state(adapted)
    keys = iter(jax.random.split(jax.random.key(1), len(jax.tree.leaves(adapters))))
    nnx.update(adapted, jax.tree.map(lambda x: x + 0.1 * jax.random.normal(next(keys), x.shape, x.dtype), adapters))
    with Checkpointer(tmp / "lora", keep=None, async_save=False) as ckpt:
        ckpt.save(
            7,
            params=nnx.split(adapted)[1],
            opt_state=None,
            rng=None,
            meta={"config": as_dict(lora_config)},
            model_config=model.config,
        )
    return {"config": config, "base": base, "full": str(tmp / "full"), "lora": str(tmp / "lora")}


def _hf_logits(directory, ids: np.ndarray) -> np.ndarray:
    import torch
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor(ids, dtype=torch.long)).logits.numpy()


def test_an_export_is_a_complete_hf_directory_that_transformers_loads(craft_run, tmp_path):
    import transformers

    out = tmp_path / "hf"
    with umask(0o077):  # modes are the export's, not the umask's
        assert export(f"--checkpoint={craft_run['full']}", f"--out={out}", "--dtype=float32") == 0
    assert sorted(os.listdir(out)) == COMPLETE
    assert modes(out) == {".": "0o755", **{name: "0o644" for name in COMPLETE}}

    ours = load_tokenizer(craft_run["base"])  # the world's tokenizer, which the run trained with
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert len(theirs) == ours.vocab_size == 500
    task, insights, plan = world_texts()
    for text in (task, plan, *(INSIGHT_SCAFFOLD.format(n=n) + t for t, n in insights), OBSERVATION):
        assert theirs.encode(text) == ours.encode(text), text
        assert theirs.decode(theirs.encode(text)) == text
    assert theirs.eos_token == "<|im_end|>" and theirs.pad_token_id == ours.token_to_id("<|endoftext|>")

    # The chat template renders our contexts (the run's thinking mode, off here, is its default).
    builder = ContextBuilder(ours, thinking=False)
    messages = [{"role": "user", "content": task}]
    prompt = builder.build(task)
    assert theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False) == (
        prompt.ids.tolist()
    )
    messages += [{"role": "user", "content": INSIGHT_SCAFFOLD.format(n=n) + t} for t, n in insights]
    messages += [{"role": "assistant", "content": f"<think>\nplan it\n</think>\n\n{plan}"}]
    messages += [{"role": "user", "content": OBSERVATION}]
    steps = [Step((*ours.encode(plan), ours.im_end_id), OBSERVATION)]
    context = builder.build(task, [Insight(t, n) for t, n in insights], steps)
    rendered = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert rendered == render_context(context, ours)
    assert rendered.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    thinking = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, enable_thinking=True)
    assert thinking == render_context(
        ContextBuilder(ours).build(task, [Insight(t, n) for t, n in insights], steps), ours
    )
    # The step being sampled (after the last user message) keeps its think trace, as in our training examples.
    sampled = f"retry\n</think>\n\n{plan}"  # (after the generation prompt's "<think>\n")
    current = (*ours.encode(sampled, special=True), ours.im_end_id)
    example = ContextBuilder(ours).build(task, [Insight(t, n) for t, n in insights], steps, current)
    last = {"role": "assistant", "content": f"<think>\n{sampled}"}
    assert theirs.apply_chat_template([*messages, last], tokenize=False) == render_context(example, ours) + "\n"

    # The generation config and config.json: the tokenizer's ids, the run's sampling.
    generation = transformers.GenerationConfig.from_pretrained(out)
    eot, im_end = ours.token_to_id("<|endoftext|>"), ours.im_end_id
    assert (generation.eos_token_id, generation.pad_token_id, generation.bos_token_id) == ([im_end, eot], eot, eot)
    assert generation.do_sample and generation.temperature == craft_run["config"].rollout.temperature == 1.0
    assert generation.top_k is None  # (the run sampled without top-k)
    config = json.loads((out / "config.json").read_text())
    assert (config["eos_token_id"], config["bos_token_id"], config["dtype"]) == (im_end, eot, "float32")

    # The logits of transformers' model are ours.
    _, model = restore_model(craft_run["full"], compute_dtype=jnp.float32)
    ids = context.ids[None, :]
    np.testing.assert_allclose(_hf_logits(out, ids), np.asarray(model(jnp.asarray(ids))), atol=1e-4, rtol=1e-4)


def test_our_launchers_take_an_export_as_a_checkpoint(craft_run, tmp_path):
    """launch/eval.py --checkpoint=EXPORT (with the run's own config, whose pretrained base is the same policy's
    tokenizer) and training from it (model.checkpoint=EXPORT): the tokenizer is found, the weights are the run's."""
    out = tmp_path / "hf"
    assert export(f"--checkpoint={craft_run['full']}", f"--out={out}", "--dtype=float32") == 0
    task, _, plan = world_texts()
    ours = load_tokenizer(craft_run["base"])
    _, trained = restore_model(craft_run["full"], compute_dtype=jnp.float32)
    ids = jnp.asarray([ours.encode(task + plan)])
    config = replace(craft_run["config"], {"model.checkpoint": "", "model.dtype": "float32"})
    policy = eval_policy(config, str(out))
    assert policy.what == f"HF checkpoint {out}" and policy.tokenizer.path == str(out / "tokenizer.json")
    assert policy.tokenizer.encode(task + plan) == ours.encode(task + plan)
    np.testing.assert_allclose(np.asarray(policy.model(ids)), np.asarray(trained(ids)), atol=1e-5)
    again = replace(config, {"model.checkpoint": str(out)})
    assert policy_tokenizer(again).encode(plan) == ours.encode(plan)
    np.testing.assert_allclose(np.asarray(build_policy(again)(ids)), np.asarray(trained(ids)), atol=1e-5)


def test_a_lora_runs_merged_and_adapter_exports_are_complete(craft_run, tmp_path):
    import peft
    import torch
    import transformers

    _, adapted = restore_model(craft_run["lora"], compute_dtype=jnp.float32)
    task, _, plan = world_texts()
    ours = load_tokenizer(craft_run["base"])
    ids = np.asarray([ours.encode(task + plan)])
    logits = np.asarray(adapted(jnp.asarray(ids)))
    with umask(0o077):
        assert (
            export(f"--checkpoint={craft_run['lora']}", f"--out={tmp_path / 'merged'}", "--merge", "--dtype=float32")
            == 0
        )
        assert export(f"--checkpoint={craft_run['lora']}", f"--out={tmp_path / 'adapter'}", "--adapter") == 0
    assert sorted(os.listdir(tmp_path / "merged")) == COMPLETE
    np.testing.assert_allclose(_hf_logits(tmp_path / "merged", ids), logits, atol=1e-4, rtol=1e-4)
    adapter_files = [lora.ADAPTER_CONFIG, lora.ADAPTER_WEIGHTS, "tokenizer.json", "tokenizer_config.json"]
    assert sorted(os.listdir(tmp_path / "adapter")) == sorted(adapter_files)
    assert modes(tmp_path / "adapter") == {".": "0o755", **{name: "0o644" for name in adapter_files}}
    # peft puts the adapter on the run's base weights with our logits; its tokenizer is the run's.
    save_pretrained(lora.without_adapters(adapted), tmp_path / "base", dtype=jnp.float32)
    base = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "base", dtype=torch.float32)
    with torch.no_grad():
        theirs = peft.PeftModel.from_pretrained(base, tmp_path / "adapter").eval()(torch.tensor(ids)).logits.numpy()
    np.testing.assert_allclose(theirs, logits, atol=1e-4, rtol=1e-4)
    assert transformers.AutoTokenizer.from_pretrained(tmp_path / "adapter").encode(plan) == ours.encode(plan)
    # Our trainer takes the adapter as model.checkpoint (over its base): the adapter's own tokenizer is found.
    config = replace(craft_run["config"], {"model.checkpoint": str(tmp_path / "adapter")})
    assert policy_tokenizer(config).path == str(tmp_path / "adapter" / "tokenizer.json")


def test_the_builtin_qwen_tokenizer_round_trips(tmp_path):
    """A tiny-preset run without a tokenizer of its own trains with the built-in Qwen 3.5 tokenizer (248,077 ids):
    the export ships it, transformers gives the same ids on text of any script, thinking on by default."""
    import transformers

    spec = ModelSpec(get_preset("tiny"))
    rs = np.random.default_rng(0)
    graphdef, abstract = nnx.split(spec.abstract())
    state = jax.tree.map(lambda a: np.asarray(0.02 * rs.standard_normal(a.shape), a.dtype), abstract)
    with Checkpointer(tmp_path / "ckpt", keep=None, async_save=False) as ckpt:
        run = tiny_config({"workdir": str(tmp_path / "w")}).to_dict()
        ckpt.save(1, params=state, opt_state=None, rng=None, meta={"config": run}, model_config=spec.config)
    out = tmp_path / "hf"
    assert export(f"--checkpoint={tmp_path / 'ckpt'}", f"--out={out}") == 0
    assert sorted(os.listdir(out)) == COMPLETE
    ours = load_tokenizer()
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert len(theirs) == ours.vocab_size == 248_077
    text = 'Craft "drill" 12345: 你好，世界！ Ünïcödé 🙂\n\n  def f(x):\n\treturn x**2  '
    assert theirs.encode(text) == ours.encode(text) and theirs.decode(ours.encode(text)) == text
    prompt = ContextBuilder(ours).build(text)
    messages = [{"role": "user", "content": text}]
    assert theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False) == (
        prompt.ids.tolist()
    )
    generation = transformers.GenerationConfig.from_pretrained(out)
    assert generation.eos_token_id == [248046, 248044] and generation.pad_token_id == 248044


def test_a_hub_style_tokenizer_keeps_its_own_files_and_a_checkpoint_without_a_config_needs_one(
    craft_run, tmp_path, capsys
):
    """A tokenizer directory with its own tokenizer_config.json (a hub model's: its chat template) is copied as it is;
    a checkpoint that records no run config is exported without tokenizer files (with a warning) unless given
    --tokenizer; re-exporting replaces the tokenizer files as a set, other files stay; a tokenizer with more ids than
    the model is refused in one line, before anything is written."""
    import transformers

    hub = tmp_path / "hub"
    hub.mkdir()
    (hub / "tokenizer.json").write_bytes(open(os.path.join(craft_run["base"], "tokenizer.json"), "rb").read())
    template = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"
    own = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "chat_template": template}
    (hub / "tokenizer_config.json").write_text(json.dumps(own))
    (hub / "vocab.json").write_text("{}")  # (a companion file, shipped along)
    _, state = nnx.split(load_pretrained(craft_run["base"]))
    bare = tmp_path / "bare"
    with Checkpointer(bare, keep=None, async_save=False) as ckpt:  # no run config recorded
        ckpt.save(2, params=state, opt_state=None, rng=None, model_config=load_pretrained(craft_run["base"]).config)
    out = tmp_path / "hf"
    assert export(f"--checkpoint={bare}", f"--out={out}") == 0
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "records no run config" in err and "--tokenizer=" in err

    (out / "README.md").write_text("mine")
    assert export(f"--checkpoint={bare}", f"--out={out}", f"--tokenizer={hub}") == 0
    assert sorted(os.listdir(out)) == sorted([*COMPLETE, "README.md", "vocab.json"])
    assert json.loads((out / "tokenizer_config.json").read_text()) == own
    theirs = transformers.AutoTokenizer.from_pretrained(out)
    assert theirs.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "[user] hi\n"
    # The run's own (craft's) tokenizer over it: the hub directory's files go, the README stays.
    assert export(f"--checkpoint={craft_run['full']}", f"--out={out}") == 0
    assert sorted(os.listdir(out)) == sorted([*COMPLETE, "README.md"])
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == chat_template(thinking=False)
    # An export as the tokenizer of a run in the other thinking mode (trained from it): our template, its default.
    (tmp_path / "again").mkdir()
    assert write_hf_tokenizer(tmp_path / "again", out, thinking=True) == ["tokenizer.json", "tokenizer_config.json"]
    assert json.loads((tmp_path / "again" / "tokenizer_config.json").read_text())["chat_template"] == chat_template()

    # A run that trained with the built-in Qwen tokenizer on a 512-id model: refused, nothing written.
    wrong = tmp_path / "wrong"
    run = as_dict(replace(craft_run["config"], {"model.checkpoint": ""}))
    with Checkpointer(wrong, keep=None, async_save=False) as ckpt:
        ckpt.save(
            2,
            params=state,
            opt_state=None,
            rng=None,
            meta={"config": run},
            model_config=load_pretrained(craft_run["base"]).config,
        )
    assert export(f"--checkpoint={wrong}", f"--out={tmp_path / 'nothing'}") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "has 248077 ids but the model only 512" in err and "--tokenizer" in err
    assert not os.path.exists(tmp_path / "nothing") and sorted(os.listdir(tmp_path)) == sorted(
        ["hub", "bare", "hf", "again", "wrong"]
    )


def test_weight_pushes_are_readable_by_the_servers(tmp_path):
    """The weight sync into `engine.weight_sync_dir` writes each pushed version with the export's writer: 0644 files
    and a 0755 directory whatever the umask (servers may run as another user)."""
    from rltldr_jax.engines.weight_push import WeightPusher

    config = dataclasses.replace(get_preset("tiny"), vocab_size=256, num_hidden_layers=4, layer_types=())
    with umask(0o077):
        path = WeightPusher(weight_dir=tmp_path / "weights").export(ModelSpec(config).build(seed=0), 3)
    assert os.path.basename(path) == "v000003"
    assert modes(path) == {".": "0o755", "config.json": "0o644", "model.safetensors": "0o644"}
