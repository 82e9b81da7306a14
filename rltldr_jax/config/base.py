"""Every knob of RLTL;DR in one documented ConfigDict, with the paper's values as defaults.

The defaults are the paper's SAPI/AppWorld setting (Table 4 and §3–A.4 of arXiv 2609.37633). Environment files
(`sapi.py`, `appworld.py`, `leetcode.py`) start from `get_config()` and change what differs; `ablations.py` holds
every table row as named overrides.

Values the paper does not give are marked "not in the paper" with the choice made here.

Validation (`validate`) runs in every launcher after all overrides: an unknown key, a value of the wrong
type, a value outside its choices or range, or an inconsistent combination is a `ConfigError` that names the
key and says how to fix it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator
from typing import Any

import ml_collections

from rltldr_jax.agent.collector import INSIGHT_AFTER, exact_group_size_error
from rltldr_jax.agent.insight import SOURCES
from rltldr_jax.agent.schedule import POLICIES
from rltldr_jax.agent.writer_json import CONTENTS
from rltldr_jax.compile_cache import default_cache_dir
from rltldr_jax.engines.engine import top_k_error
from rltldr_jax.engines.factory import engine_kind_error
from rltldr_jax.engines.jax_engine import WEIGHTS_DTYPES, decode_group_error
from rltldr_jax.envs.registry import uninformative_insight
from rltldr_jax.envs.spec import env_name_error
from rltldr_jax.loss_terms import DEFAULT_TERMS, LOSS_TERMS, terms_error
from rltldr_jax.models.presets import PRESETS
from rltldr_jax.sharding import mesh_sizes_error
from rltldr_jax.train.batching import INSIGHT_ROLLOUTS, WRITER_SFT_FILTERS, length_buckets_error
from rltldr_jax.train.sft import SFT_DATA
from rltldr_jax.train.step import OPTIMIZERS, weight_decay_error

MODEL_PRESETS = tuple(PRESETS)


def get_config() -> ml_collections.ConfigDict:
    """The paper's RLTL;DR configuration (SAPI/AppWorld column of Table 4)."""
    c = ml_collections.ConfigDict()

    c.name = "rltldr"  # run name; used in the default workdir and in TensorBoard
    c.workdir = ""  # where checkpoints, event files and rollouts go; "" = runs/{env.name}-{name}
    c.seed = 0  # seeds parameters (for random init), sampling, task order and filters
    c.mode = "rl"  # "rl": RL training (launch/train.py); "sft": offline SFT baselines of Table 2 (launch/sft.py)

    # --- Policy model --------------------------------------------------------------------------------
    c.model = ml_collections.ConfigDict()
    # architecture: qwen3_5_9b | qwen3_5_4b | qwen3_5_2b | qwen3_5_0_8b | tiny | replicate_xs | replicate_s
    # | replicate_m
    c.model.preset = "qwen3_5_9b"
    # HF checkpoint directory (safetensors + config.json) to start from; "" = random init (tiny), or the pretrained
    # checkpoint of `pretrain.*` when pretrain.steps > 0
    c.model.checkpoint = ""
    c.model.dtype = "bfloat16"  # compute dtype: bfloat16 | float32 (norms, delta rule, softmax, loss stay fp32)
    # Parameter and optimizer-state dtype. Not in the paper. float32 master weights: at lr 3e-6 most
    # updates are below bf16 resolution (Table 7: only ~2 % of entries move by more than bf16 precision).
    c.model.param_dtype = "float32"
    c.model.remat = True  # rematerialise activations per layer in the backward pass
    # Load checkpoints (model.checkpoint, the teacher's, a resumed run's) even if their weights hold NaN/inf; by
    # default such a checkpoint is refused as corrupt. Not in the paper.
    c.model.allow_nonfinite = False

    c.tokenizer = ""  # tokenizer.json or checkpoint dir; "" = model.checkpoint's, else the built-in Qwen 3.5 one

    # --- Environment ---------------------------------------------------------------------------------
    c.env = ml_collections.ConfigDict()
    c.env.name = (
        "sapi"  # sapi | appworld | leetcode | craft (the small-scale replication's world) | package.module:SPEC
    )
    c.env.train_split = "train"  # task split trained on (the paper uses Pass@128 = 0 "hard" splits, §4.1)
    c.env.eval_split = "eval"  # held-out split for evaluation
    c.env.seed = 0  # seed of the task generator (SAPI-like world) and of the task order
    c.env.max_observation_chars = 4000  # longer observations are shortened (middle elided) in the context
    c.env.step_timeout_s = 30.0  # wall-time limit of one code execution in the sandbox
    c.env.memory_limit_mb = 1024  # address-space limit of the sandbox process

    # --- Rollout collection phase (Table 4, top) -----------------------------------------------------
    c.rollout = ml_collections.ConfigDict()
    c.rollout.tasks_per_phase = 8  # unique tasks per rollout collection phase
    # K: minimum attempts per task = GRPO group size (one task = one group). At least 2 for RL (validated), also
    # with loss.grpo_coef=0: a lone attempt has advantage 0, and insights reach only later attempts of the task.
    c.rollout.group_size = 8
    c.rollout.workers_per_task = 1  # concurrent sequential attempt chains per task (not in the paper)
    c.rollout.max_steps = 50  # maximum environment steps (actions) per attempt
    c.rollout.thinking = True  # Qwen thinking mode (off for LeetCode, A.4)
    c.rollout.max_think_tokens = 768  # think budget per step; then `</think>` is forced
    c.rollout.max_action_tokens = 512  # action budget per step, after the think block
    c.rollout.max_context_tokens = 32768  # an attempt ends when its context would exceed this
    c.rollout.temperature = 1.0  # sampling temperature (1: logprobs are those of the policy)
    c.rollout.top_p = 1.0  # nucleus sampling (1 = off; <1 biases the importance ratios)
    c.rollout.top_k = -1  # top-k sampling (-1 = off)
    c.rollout.save_rollouts = True  # write every phase's attempts and insights to {workdir}/rollouts
    # Not in the paper: every task gets exactly K attempts (instead of "at least K, faster tasks get more"). With
    # workers_per_task=1 a phase is then a deterministic function of the weights and seeds (bit for bit with the
    # embedded engine's engine.batch_invariant), which is what the resume == uninterrupted test relies on.
    c.rollout.exact_group_size = False

    # --- Insights: when they are inserted, who writes them, what they contain (§3, A.1–A.2, Table 3) ---
    c.insight = ml_collections.ConfigDict()
    # When a later attempt gets the task's insights of this phase in context:
    #   threshold: the task's running success rate in this phase <= `threshold` (and >= 1 insight exists)
    #   first_k:   at most `first_k_max_successes` successes among the task's first `first_k` attempts
    #   never:     no insights (the GRPO baseline);  always: whenever an insight exists
    c.insight.schedule = "threshold"
    c.insight.threshold = 0.5  # running success-rate threshold (A.2)
    c.insight.first_k = 10  # window of the "<= 3 of the first 10" rule (Table 9)
    c.insight.first_k_max_successes = 3
    c.insight.max_insights = 16  # n_fb: at most this many insights in context, the most recent kept (§6)
    # Which attempts get an insight written: failure (RLTL;DR) | any (SGE summarises successes too)
    c.insight.after = "failure"
    # Who writes them: policy (the current policy in a fresh chat, A.1) | teacher (a separate model, Table 3)
    #   | rule (the verifier's first failed requirement turned into a sentence by rule; for untrained tiny models)
    #   | uninformative (a control, not in the paper: the verifier's sentence replaced by one of the same form and
    #     token length that says nothing about the failure; environments with such a control only: craft)
    c.insight.source = "policy"
    # What goes into the context, from the writer's JSON (Table 3, §6):
    #   hint (the TL;DR sentence) | feedback (diagnostic paragraph) | summary_feedback
    #   | summary_feedback_code (+ corrected step) | strategy (SGE: summary of the attempt, try something else)
    c.insight.content = "hint"
    c.insight.thinking = True  # the insight writer thinks before answering (Table 3 "thinking")
    c.insight.show_failed_tests = True  # the writer prompt includes the verifier's failed tests (Table 3)
    c.insight.max_think_tokens = 4096  # insight writer's think budget (A.1)
    c.insight.max_action_tokens = 4096  # insight writer's answer budget (A.1)
    c.insight.max_rollout_chars = 20000  # the failed rollout is shortened to this in the writer prompt
    c.insight.teacher = ml_collections.ConfigDict()
    # The teacher of insight.source=teacher (GLM 5.2 in Table 3) is frozen: it never receives weight pushes.
    c.insight.teacher.checkpoint = ""  # HF checkpoint of the teacher: run on an embedded JaxEngine (Qwen 3.5 family)
    c.insight.teacher.servers = ""  # or: comma-separated host:port of gRPC generation servers already hosting it
    c.insight.teacher.tokenizer = (
        ""  # its tokenizer.json or checkpoint dir if it differs ("" = the checkpoint's/policy's)
    )

    # --- Loss: L = grpo_coef·L_GRPO + λ·L_SFT (§3.3, A.3) ----------------------------------------------
    c.loss = ml_collections.ConfigDict()
    c.loss.lam = 0.5  # λ, insight internalisation strength (0.5 in the paper; Fig. 4 sweeps 1/λ)
    c.loss.grpo_coef = 1.0  # weight of L_GRPO (0 = "no GRPO loss, only L_SFT", Table 2)
    c.loss.clip_eps = 0.2  # PPO clip ε
    c.loss.std_normalize = False  # divide advantages by the group std (GRPO-style ablation, Table 9)
    c.loss.filter_zero_advantage = True  # drop groups whose advantages are all zero (A.3.2)
    c.loss.positive_ratio = 0.75  # keep rollouts so that >= 75 % have positive advantage (A.3.2); 0 = off
    # Not in the paper: keep attempts the filters dropped as SFT-only examples when insights were in their context
    # (L_SFT otherwise rides only on kept GRPO examples, so all-failure groups teach nothing). On when grpo_coef=0.
    c.loss.sft_on_filtered = False
    c.loss.split_advantages = False  # insight-conditioned and unconditioned attempts as separate groups (Table 9)
    # How insight-conditioned attempts enter the update:
    #   in_context:   with the insights in context, as sampled (RLTL;DR)
    #   off_policy:   insights removed from the context, importance ratio π_θ(y|task)/π_old(y|task+insights) (Table 9)
    #   self_distill: insights removed, advantage-weighted likelihood without ratio (RLTF-SD, Song et al. 2026)
    c.loss.insight_rollouts = "in_context"
    # RLTF-FM / self-play insight SFT (Table 8): NLL of the insight given the failed rollout, π(f | τ), on the
    # insight-writer's context. Weight 0 = off.
    c.loss.writer_sft_coef = 0.0
    c.loss.writer_sft_filter = "all"  # all | next_success (only insights after which the next attempt succeeded)
    # The terms the loss sums (§3), comma-separated names of rltldr_jax/loss_terms.py's registry: each is
    # coef * (sum over its mask's tokens) / (its token count over the whole update batch). Built in: grpo
    # (coefficient loss.grpo_coef), insight_sft (loss.lam), writer_sft (loss.writer_sft_coef). A term registered
    # from outside the package (examples/entropy_bonus.py) adds its coefficient key here with its default value,
    # when the module that registers it is imported before this config is built.
    c.loss.terms = ",".join(DEFAULT_TERMS)
    for term in LOSS_TERMS.values():
        for key, default in ((term.coef, term.default_coef), *((k, 0.0) for k in term.params)):
            if key not in c.loss:
                c.loss[key] = float(default)

    # --- Optimizer (A.4, Table 4) ----------------------------------------------------------------------
    # Update = clip (grad_clip_norm) -> rule (name) scaled by lr(t), t = optimizer steps taken (skipped non-finite
    # steps do not count). The same keys build the offline SFT baselines' optimizer, with sft.learning_rate as lr.
    c.optim = ml_collections.ConfigDict()
    # not in the paper: AdamW, as in the GRPO stacks it builds on. adamw | adam (no weight decay) | sgd (plain, no
    # momentum; b1/b2/eps unused). weight_decay != 0 is accepted only with adamw.
    c.optim.name = "adamw"
    c.optim.learning_rate = 3e-6  # constant, no warmup (Table 4)
    # lr(t) = learning_rate * min(t, warmup_steps) / warmup_steps: linear from 0 at step 0 to learning_rate at step
    # warmup_steps, constant after (not in the paper); 0 = constant learning_rate from the first step.
    c.optim.warmup_steps = 0
    c.optim.b1 = 0.9  # not in the paper (Adam's first-moment decay)
    c.optim.b2 = 0.999  # not in the paper (Adam's second-moment decay)
    c.optim.eps = 1e-8  # not in the paper
    c.optim.weight_decay = 0.0  # not in the paper; decoupled (AdamW), only with optim.name=adamw
    c.optim.grad_clip_norm = 1.0  # global-norm clip (Fig. 4 caption: fires on nearly every update); 0 = no clipping

    # --- Update phase (Table 4, bottom) ----------------------------------------------------------------
    c.batch = ml_collections.ConfigDict()
    c.batch.ppo_epochs = 2  # passes over the phase's examples
    c.batch.micro_batch_size = 4  # examples (steps) per device per micro-batch; one example = one step
    c.batch.grad_accum_steps = 8  # micro-batches per optimizer step; global batch = micro × accum × (data × fsdp)
    c.batch.pad_to_multiple = 256  # the rounding unit of the padded example lengths (length_buckets)
    # Not in the paper: the padded lengths T of an optimizer step's [grad_accum, micro_batch, T] batch: the smallest
    # bucket holding its longest example (the last batch of a phase keeps all its rows, empty ones padding). Each T
    # compiles the train step once (then the compilation cache keeps it), so few buckets = few compilations:
    #   geometric: pad_to_multiple x 1, 2, 3, 4, 6, 8, 12, ... up to rollout.max_context_tokens (2 shapes per doubling;
    #     T < 1.5x the longest example beyond 2 x pad_to_multiple). Quick replication: T = 256, 384 where multiples
    #     give 256, 320, 384 (one compilation fewer; 14 of 30 steps padded 320 -> 384, ~8 % slower each): batching.py
    #   multiples: every multiple of pad_to_multiple (the least padding; one compilation per multiple)
    #   or an increasing comma-separated list, e.g. "256,512,1024" (the last >= rollout.max_context_tokens)
    c.batch.length_buckets = "geometric"
    # Not in the paper: sequence packing. 0 = one example per row (the layout above). R > 0 = each optimizer step's
    # micro_batch_size x grad_accum_steps examples (the same steps and loss) are packed several to a row of the longest
    # bucket, R rows per micro-batch (a multiple of data x fsdp), and the rows left empty are skipped at run time: one
    # compiled train step for every phase, and little padding (batching.pack). The replication's configs use it.
    c.batch.pack_rows = 0

    # --- Compilation (not in the paper) -----------------------------------------------------------------------
    c.compile = ml_collections.ConfigDict()
    # JAX's persistent compilation cache (rltldr_jax/compile_cache.py): every launcher and every run of a replication
    # grid reads compiled programs from this directory and writes the new ones, so a rerun, a resumed run or another
    # arm of a grid (the loss coefficients are traced, not compiled in) compiles nothing compiled before. Private:
    # created 0700; another user's directory, or one others can write to, is refused. The default is
    # $JAX_COMPILATION_CACHE_DIR if set, else ~/.cache/rltldr_jax/xla ($XDG_CACHE_HOME/rltldr_jax/xla); "" = no cache.
    c.compile.cache_dir = default_cache_dir()

    # --- Device mesh (axes data, fsdp, tensor; -1 = all remaining devices) ---------------------------
    c.mesh = ml_collections.ConfigDict()
    c.mesh.data = 1
    c.mesh.fsdp = -1
    c.mesh.tensor = 1

    # --- Generation engine -----------------------------------------------------------------------------
    c.engine = ml_collections.ConfigDict()
    # A registered backend (rltldr_jax/engines/factory.py): jax (embedded, CPU/Colab/tests) | sglang (SGLang
    # servers over gRPC) | jax_grpc (launch/serve.py; "grpc" is an alias) | package.module:name (a backend its
    # module registers on import).
    c.engine.kind = "sglang"
    c.engine.servers = ""  # comma-separated host:port of the servers' gRPC listeners (sglang | jax_grpc)
    # SGLang's HTTP base URLs (http://host:port, same order as servers): weight pushes with version labels go to
    # POST /update_weights_from_disk there (SGLang's gRPC update has no version field). launch/serve_sglang.py
    # prints both lists. Empty for kind=jax_grpc (launch/serve.py takes the version over gRPC).
    c.engine.http_servers = ""
    # Per-attempt deadline (s) of one generation request on a server (kind=sglang | jax_grpc); then it is retried on
    # another. 1 h leaves room for the longest completions on a loaded server; 0 = none. A stopped or hung server is
    # found sooner by the client's health checks (every 10 s) and its requests sent elsewhere; a server healthy again
    # returns to rotation, given the current weights first. Servers started with an API key (launch/serve.py on a
    # cluster) need it in $RLTLDR_ENGINE_API_KEY where the trainer runs: never in this config (it is saved and logged).
    c.engine.request_timeout_s = 3600.0
    c.engine.weight_sync_dir = ""  # shared directory for HF-format weight pushes; "" = {workdir}/weights
    c.engine.max_batch = 64  # concurrent sequences of the embedded engine
    # Embedded engine: prefill each request alone, so that tokens and logprobs do not depend on which requests thread
    # timing admits together (bit-reproducible runs); False prefills them as one padded batch (faster on accelerators
    # with many concurrent prompts; results then vary at float rounding from run to run).
    c.engine.batch_invariant = True
    # Embedded engine: byte budget (MiB) of its prefix cache, the decode states at prefill_chunk boundaries of prompts
    # and after whole prompts (with their next-token logits), so that requests sharing a prompt prefix (the steps of
    # an attempt) skip prefilling it, and a prompt seen whole (a task's K attempts) is not prefilled again; results
    # are bit-identical with or without it. Only with batch_invariant. 0 = off. Not in the paper.
    c.engine.prefix_cache_mb = 1024
    # Embedded engine, batch_invariant: prompts are prefilled in calls of this many tokens (a power of two >= 16),
    # aligned from position 0; 128 measured best on CPU with the prefix cache; an accelerator may prefer larger calls.
    c.engine.prefill_chunk = 128
    # Embedded engine: dtype of its copy of the weight matrices; "" = the model's. "bfloat16" halves the bytes a decode
    # step reads (~2x faster decode on CPU), with float32 accumulation; its logprobs then differ slightly from the
    # trainer's (update/first_minibatch/logprob_gap). Not in the paper.
    c.engine.weights_dtype = ""
    # Embedded engine: up to decode_steps tokens per device call (a loop on the device that returns as soon as a request
    # stops or reaches its budget; admission, aborts, pauses and weight swaps happen between calls), and decode_group
    # slots per call (only the groups holding requests are decoded; it must divide max_batch, or be >= it). Any
    # decode_steps gives the same bits. 32 x 8 measured ~5x the tokens/s of 1 x 64 end to end (~8x the decode alone)
    # at configs/replicate.py's shapes on a 2-core CPU (benchmarks/engine.py); an accelerator serving many concurrent
    # requests may prefer decode_group = max_batch.
    c.engine.decode_steps = 32
    c.engine.decode_group = 8
    # Servers (kind=jax_grpc | sglang) must sample from the trainer's weights from the first phase on. At start (fresh
    # or resumed) the trainer pushes its weights as its current version unless every server proves it serves them
    # (launch/serve.py reports a weights fingerprint). SGLang reports none, so it gets the push, unless this is True:
    # the fast path when the servers were started from model.checkpoint (fresh run) at the trainer's weight version.
    c.engine.assume_initial_weights = False

    # --- Training loop ---------------------------------------------------------------------------------
    c.train = ml_collections.ConfigDict()
    c.train.env_step_budget = 170_000  # stop after this many environment steps (SAPI's budget, §4.2, E.3); 0 = no limit
    c.train.max_phases = 0  # also stop after this many collection+update phases; 0 = no limit
    c.train.checkpoint_every = 1  # phases between checkpoints
    c.train.keep_checkpoints = 3  # most recent checkpoints kept
    # Not in the paper: collect phase n + 1 in the background with the weights of version n while the trainer updates
    # on phase n (one version of lag, corrected by the importance ratio; logged as rollout/weight_version_gap). A
    # resumed run collects its first phase synchronously, so resume == uninterrupted holds only without it.
    c.train.overlap_phases = False
    # An optimizer step whose loss or gradient norm is NaN/inf is skipped (parameters and optimizer state
    # unchanged, counted as update/skipped_nonfinite); after this many skipped steps in a row the run stops with an
    # error, its last checkpoint intact. 0 = never stop. Not in the paper.
    c.train.max_nonfinite_skips = 5
    # Before a phase's update changes anything, its first minibatch compares the sampler's logprobs with the trainer's
    # (update/first_minibatch/logprob_gap: the mean of trainer - sampler over the GRPO tokens, about -KL(sampler ||
    # trainer)). Beyond this many nats per token the engine is not sampling from the trainer's policy (other weights,
    # a tokenizer or chat-template mismatch, top-p/top-k truncation) and the run stops before saving anything. The
    # fp32 engines sit at ~1e-6. 0 = never stop. Checked only with loss.insight_rollouts=in_context (off_policy and
    # self_distill train on other contexts than were sampled). Not in the paper.
    c.train.max_logprob_gap = 0.1

    # --- Evaluation: held-out tasks, fixed attempts, no insights (§4.1, D.1) -------------------------
    c.eval = ml_collections.ConfigDict()
    c.eval.every = 10  # phases between evaluations; 0 = only at the end
    c.eval.num_tasks = 256  # held-out tasks evaluated (256 in §5); 0 = the whole split
    c.eval.attempts_per_task = 8  # attempts per task, for macro Pass@1 and Pass@8
    # Not in the paper: also evaluate this many tasks of env.train_split the same way (no insights), logged under
    # eval_train/ (the "train no-insight Pass@1" of Table 2, measured as a test rather than from the training
    # attempts); 0 = off.
    c.eval.train_num_tasks = 0

    # --- Offline SFT baselines (Table 2; mode = "sft") ------------------------------------------------
    c.sft = ml_collections.ConfigDict()
    c.sft.rollouts_dir = ""  # saved rollouts of an RLTL;DR run (its {workdir}/rollouts)
    # rollouts: NLL of the actions of successful attempts (insights in context, not trained on)
    # insights: SFTL;DR, NLL of the insights given the task alone, π(f_1..f_I | task)
    c.sft.data = "rollouts"
    c.sft.num_rollouts = 0  # successful rollouts used; 0 = all (3.5k in Table 2)
    c.sft.deduplicate = False  # SFTL;DR on unique (task, insight) pairs, one by one (Table 2)
    c.sft.epochs = 10  # (§5.1)
    c.sft.learning_rate = 3e-6  # not in the paper

    # --- Pretraining from scratch (the small-scale replication; not in the paper) ---------------------------
    # With steps > 0 and no model.checkpoint, launchers first pretrain model.preset from random weights on the
    # environment's demonstrations (envs.registry.demonstrations: public-rule plans, some obeying insights in
    # context) and train from that checkpoint. The result (HF safetensors + tokenizer.json) is cached under
    # cache_dir by a hash of everything it depends on, so reruns and other arms with the same settings reuse it.
    c.pretrain = ml_collections.ConfigDict()
    c.pretrain.steps = 0  # optimizer steps; 0 = no pretraining
    c.pretrain.batch_size = 32  # demonstrations per step
    c.pretrain.learning_rate = 3e-3  # peak of a warmup + cosine schedule (AdamW)
    c.pretrain.warmup_steps = 50
    c.pretrain.weight_decay = 0.01
    c.pretrain.vocab_size = 512  # the byte-level BPE tokenizer trained on the demonstrations' texts (<= the model's)
    c.pretrain.insight_prob = 0.6  # share of demonstrations with (made-up) requirements in context as insights
    # The declarative-pretraining experiment: this share of demonstrations instead has insights that state true
    # public rules of the plan (task -> rule statement), trained as targets next to the action.
    c.pretrain.statement_prob = 0.0
    c.pretrain.cache_dir = ""  # "" = runs/pretrained
    # Use a base policy shipped with the package (rltldr_jax/replication/base_policies) when one has this config's
    # pretraining key, instead of pretraining it again (the replication's seeds 0-2: about 10-20 CPU minutes each).
    c.pretrain.shipped = True

    return c


# ----------------------------------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------------------------------


class ConfigError(ValueError):
    """An invalid configuration; the message names the key and the fix."""


#: The allowed values of each choice key: `mode` and the model dtypes are this file's; every other list lives in the
#: module that implements it. `engine.kind` is checked against the engine registry (`engine_kind_error`).
CHOICES: dict[str, tuple[Any, ...]] = {
    "mode": ("rl", "sft"),
    "model.preset": MODEL_PRESETS,
    "model.dtype": ("bfloat16", "float32"),
    "model.param_dtype": ("bfloat16", "float32"),
    "insight.schedule": POLICIES,
    "insight.after": INSIGHT_AFTER,
    "insight.source": SOURCES,
    "insight.content": CONTENTS,
    "loss.insight_rollouts": tuple(INSIGHT_ROLLOUTS),
    "loss.writer_sft_filter": WRITER_SFT_FILTERS,
    "optim.name": OPTIMIZERS,
    "engine.weights_dtype": WEIGHTS_DTYPES,
    "sft.data": SFT_DATA,
}

# key -> (low, high, low inclusive, high inclusive); None = unbounded.
RANGES: dict[str, tuple[float | None, float | None, bool, bool]] = {
    "rollout.tasks_per_phase": (1, None, True, True),
    "rollout.group_size": (1, None, True, True),
    "rollout.workers_per_task": (1, None, True, True),
    "rollout.max_steps": (1, None, True, True),
    "rollout.max_think_tokens": (0, None, True, True),
    "rollout.max_action_tokens": (1, None, True, True),
    "rollout.max_context_tokens": (1, None, True, True),
    "rollout.temperature": (0.0, None, False, True),
    "rollout.top_p": (0.0, 1.0, False, True),
    "insight.threshold": (0.0, 1.0, True, True),
    "insight.first_k": (1, None, True, True),
    "insight.first_k_max_successes": (0, None, True, True),
    "insight.max_insights": (1, None, True, True),
    "insight.max_think_tokens": (0, None, True, True),
    "insight.max_action_tokens": (1, None, True, True),
    "insight.max_rollout_chars": (1, None, True, True),
    "env.max_observation_chars": (1, None, True, True),
    "env.step_timeout_s": (0.0, None, False, True),
    "env.memory_limit_mb": (1, None, True, True),
    "loss.lam": (0.0, None, True, True),
    "loss.grpo_coef": (0.0, None, True, True),
    "loss.clip_eps": (0.0, 1.0, False, False),
    "loss.positive_ratio": (0.0, 1.0, True, False),
    "loss.writer_sft_coef": (0.0, None, True, True),
    "optim.learning_rate": (0.0, None, False, True),
    "optim.warmup_steps": (0, None, True, True),
    "optim.b1": (0.0, 1.0, True, False),
    "optim.b2": (0.0, 1.0, True, False),
    "optim.eps": (0.0, None, False, True),
    "optim.weight_decay": (0.0, None, True, True),
    "optim.grad_clip_norm": (0.0, None, True, True),
    "batch.ppo_epochs": (1, None, True, True),
    "batch.micro_batch_size": (1, None, True, True),
    "batch.grad_accum_steps": (1, None, True, True),
    "batch.pad_to_multiple": (1, None, True, True),
    "batch.pack_rows": (0, None, True, True),
    "engine.max_batch": (1, None, True, True),
    "engine.prefix_cache_mb": (0, None, True, True),
    "engine.prefill_chunk": (16, None, True, True),
    "engine.decode_steps": (1, None, True, True),
    "engine.decode_group": (1, None, True, True),
    "engine.request_timeout_s": (0, None, True, True),
    "train.env_step_budget": (0, None, True, True),
    "train.max_phases": (0, None, True, True),
    "train.checkpoint_every": (1, None, True, True),
    "train.keep_checkpoints": (1, None, True, True),
    "train.max_nonfinite_skips": (0, None, True, True),
    "train.max_logprob_gap": (0.0, None, True, True),
    "eval.every": (0, None, True, True),
    "eval.num_tasks": (0, None, True, True),
    "eval.attempts_per_task": (1, None, True, True),
    "eval.train_num_tasks": (0, None, True, True),
    "pretrain.steps": (0, None, True, True),
    "pretrain.batch_size": (1, None, True, True),
    "pretrain.learning_rate": (0.0, None, False, True),
    "pretrain.warmup_steps": (0, None, True, True),
    "pretrain.weight_decay": (0.0, None, True, True),
    "pretrain.vocab_size": (262, None, True, True),
    "pretrain.insight_prob": (0.0, 1.0, True, True),
    "pretrain.statement_prob": (0.0, 1.0, True, True),
    "sft.num_rollouts": (0, None, True, True),
    "sft.epochs": (1, None, True, True),
    "sft.learning_rate": (0.0, None, False, True),
}


def get(config: ml_collections.ConfigDict, key: str) -> Any:
    """The value at a dotted key; ConfigError naming the first missing part."""
    node: Any = config
    for i, part in enumerate(key.split(".")):
        if not isinstance(node, ml_collections.ConfigDict) or part not in node:
            raise ConfigError(f"unknown config key {'.'.join(key.split('.')[: i + 1])!r} (in {key!r})")
        node = node[part]
    return node


def _in_range(value: float, spec: tuple[float | None, float | None, bool, bool]) -> bool:
    low, high, low_incl, high_incl = spec
    if low is not None and (value < low or (value == low and not low_incl)):
        return False
    if high is not None and (value > high or (value == high and not high_incl)):
        return False
    return True


def _describe(spec: tuple[float | None, float | None, bool, bool]) -> str:
    low, high, low_incl, high_incl = spec
    left = "(-inf" if low is None else ("[" if low_incl else "(") + f"{low}"
    right = "inf)" if high is None else f"{high}" + ("]" if high_incl else ")")
    return f"{left}, {right}"


def _loss_terms_errors(c: ml_collections.ConfigDict) -> list[str]:
    """What is wrong with `loss.terms` and its coefficients: an unregistered term, a missing coefficient key, or every
    coefficient 0 in an RL run."""
    problem = terms_error(c.loss.terms)
    if problem:
        return [problem]
    coefs = [LOSS_TERMS[name.strip()].coef for name in c.loss.terms.split(",") if name.strip()]
    missing = [key for key in coefs if key not in c.loss]
    if missing:
        return [
            f"loss.terms={c.loss.terms!r} needs the key(s) {', '.join('loss.' + k for k in missing)}: import the "
            "module that registers the term before building the config"
        ]
    if c.mode == "rl" and all(c.loss[key] == 0 for key in coefs):
        names = ", ".join(f"loss.{key}" for key in coefs)
        return [f"the coefficients of every term of loss.terms ({names}) are 0: nothing would be trained"]
    return []


def _cross_checks(c: ml_collections.ConfigDict) -> list[str]:
    """Combinations that are individually valid but inconsistent."""
    errors = []
    if c.mode == "rl" and c.rollout.group_size < 2:
        errors.append(
            f"rollout.group_size={c.rollout.group_size}: nothing can be learned from one attempt per task (its GRPO "
            "advantage is 0, and insights only reach later attempts of the same task); use rollout.group_size >= 2"
        )
    errors += _loss_terms_errors(c)
    if c.rollout.thinking and c.rollout.max_think_tokens == 0:
        errors.append("rollout.thinking=True needs rollout.max_think_tokens > 0 (or set rollout.thinking=False)")
    if c.insight.first_k_max_successes > c.insight.first_k:
        errors.append(
            f"insight.first_k_max_successes={c.insight.first_k_max_successes} exceeds insight.first_k="
            f"{c.insight.first_k}: the rule would always insert"
        )
    servers = [a for a in c.engine.servers.split(",") if a.strip()]
    http_servers = [a for a in c.engine.http_servers.split(",") if a.strip()]
    if http_servers and len(http_servers) != len(servers):
        errors.append(
            f"engine.http_servers lists {len(http_servers)} URLs for {len(servers)} engine.servers; "
            "give one per server, same order"
        )
    if c.insight.source == "teacher" and not (c.insight.teacher.checkpoint or c.insight.teacher.servers):
        errors.append(
            "insight.source='teacher' needs insight.teacher.checkpoint (an HF directory, run embedded) or "
            "insight.teacher.servers (host:port of gRPC servers hosting the teacher)"
        )
    if c.insight.source == "uninformative":
        try:
            uninformative_insight(c.env.name)
        except ValueError as e:
            errors.append(str(e))
    if c.insight.teacher.checkpoint and c.insight.teacher.servers:
        errors.append("give insight.teacher.checkpoint or insight.teacher.servers, not both")
    # Rules that the library parts also enforce: each lives once, in the module that needs it.
    errors += filter(
        None,
        [
            exact_group_size_error(c.rollout.exact_group_size, c.rollout.workers_per_task, prefix="rollout."),
            weight_decay_error(c.optim.name, c.optim.weight_decay),
            top_k_error(c.rollout.top_k, prefix="rollout."),
            mesh_sizes_error(c.mesh.data, c.mesh.fsdp, c.mesh.tensor),
            decode_group_error(c.engine.max_batch, c.engine.decode_group, prefix="engine."),
            length_buckets_error(c.batch.length_buckets, c.batch.pad_to_multiple, c.rollout.max_context_tokens),
        ],
    )
    if c.loss.insight_rollouts != "in_context" and c.insight.schedule == "never":
        errors.append(
            f"loss.insight_rollouts={c.loss.insight_rollouts!r} needs insight-conditioned attempts, but "
            "insight.schedule='never' inserts none"
        )
    if c.insight.content == "strategy" and c.loss.lam > 0:
        errors.append(
            "insight.content='strategy' (SGE) inserts attempt summaries, not insights: set loss.lam=0 (SGE has no "
            "insight SFT)"
        )
    return errors


def _leaves(config: ml_collections.ConfigDict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, value) of every non-dict entry."""
    for name, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            yield from _leaves(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def validate(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Checks every choice, range and combination, and that every float is finite; raises one ConfigError listing
    all problems.

    Returns the config unchanged, so `validate(get_config())` can be chained.
    """
    nonfinite = {k: v for k, v in _leaves(config) if isinstance(v, float) and not math.isfinite(v)}
    errors = [f"{key}={value!r} is not a finite number" for key, value in nonfinite.items()]
    for key, choices in CHOICES.items():
        value = get(config, key)
        if value not in choices:
            errors.append(f"{key}={value!r} is not one of {', '.join(map(repr, choices))}")
    # engine.kind follows the engine registry (a package.module:name value imports the module that registers it).
    if problem := engine_kind_error(config.engine.kind):
        errors.append(problem)
    # env.name: a built-in environment or package.module:SPEC (an EnvSpec defined elsewhere): envs/spec.py checks it
    if (env_error := env_name_error(get(config, "env.name"))) is not None:
        errors.append(env_error)
    for key, spec in RANGES.items():
        value = get(config, key)
        if key in nonfinite:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            errors.append(f"{key}={value!r} must be a number in {_describe(spec)}")
        elif not _in_range(value, spec):
            errors.append(f"{key}={value!r} is outside {_describe(spec)}")
    if not errors:
        errors += _cross_checks(config)
    if errors:
        raise ConfigError(
            "invalid config:\n  - " + "\n  - ".join(errors) + "\n(set values with --config.KEY=VALUE; every key is "
            "documented in rltldr_jax/config/base.py)"
        )
    return config


def override(config: ml_collections.ConfigDict, values: dict[str, Any]) -> ml_collections.ConfigDict:
    """Sets dotted keys in place; an unknown key is a ConfigError. Returns the config."""
    for key, value in values.items():
        parent, _, leaf = key.rpartition(".")
        node = get(config, parent) if parent else config
        if not isinstance(node, ml_collections.ConfigDict) or leaf not in node:
            raise ConfigError(f"unknown config key {key!r}; every key is documented in rltldr_jax/config/base.py")
        try:
            node[leaf] = value
        except TypeError as e:
            raise ConfigError(f"{key}={value!r}: {e}") from e
    return config


#: Config keys holding a file or directory: made absolute by `absolute_paths` when the config is resolved.
PATH_KEYS = (
    "workdir",
    "tokenizer",
    "model.checkpoint",
    "insight.teacher.checkpoint",
    "insight.teacher.tokenizer",
    "engine.weight_sync_dir",
    "sft.rollouts_dir",
    "pretrain.cache_dir",
    "compile.cache_dir",
)


def absolute_path(path: str) -> str:
    """`path` made absolute against the current working directory (`~` expanded), so that it means the same from
    any directory and to libraries that need absolute paths (orbax). "" and URLs (gs://...) stay as they are; a
    trailing `:STEP` of a training checkpoint (`DIR:3`) is kept."""
    if not path or "://" in path:
        return path
    head, sep, tail = path.rpartition(":")
    if sep and head and tail.isdigit():
        return f"{os.path.abspath(os.path.expanduser(head))}:{tail}"
    return os.path.abspath(os.path.expanduser(path))


def absolute_paths(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """Makes every non-empty `PATH_KEYS` value absolute (relative to the current directory), in place; returns the
    config. Launchers call it once, where the config enters (`ablations.resolve`)."""
    for key in PATH_KEYS:
        parent, _, leaf = key.rpartition(".")
        node = get(config, parent) if parent else config
        node[leaf] = absolute_path(node[leaf])
    return config


def apply_tiny(c: ml_collections.ConfigDict) -> None:
    """Shrinks any paper config to a tiny random Qwen 3.5 on the embedded engine: a few phases in CPU minutes.

    The insight source is `rule` (insights by rule from the verifier's report), so an untrained model still exercises
    insertion and the SFT mask.
    """
    override(
        c,
        {
            "name": "tiny",
            "model.preset": "tiny",
            "model.dtype": "float32",
            "model.param_dtype": "float32",
            "model.remat": False,
            "env.max_observation_chars": 600,
            "env.step_timeout_s": 5.0,
            "rollout.tasks_per_phase": 2,
            "rollout.group_size": 4,
            "rollout.max_steps": 3,
            "rollout.max_think_tokens": 16,
            "rollout.max_action_tokens": 48,
            "rollout.max_context_tokens": 2048,
            "insight.source": "rule",
            "loss.sft_on_filtered": True,  # a random policy never succeeds: only L_SFT can move it
            "insight.thinking": False,
            "insight.max_think_tokens": 0,
            "insight.max_action_tokens": 64,
            "optim.learning_rate": 1e-4,
            "batch.micro_batch_size": 4,
            "batch.grad_accum_steps": 1,
            "batch.pad_to_multiple": 1024,  # one example length: train_step compiles once
            "mesh.data": -1,
            "mesh.fsdp": 1,
            "engine.kind": "jax",
            "engine.max_batch": 8,
            "train.env_step_budget": 0,
            "train.max_phases": 3,
            "eval.every": 0,
            "eval.num_tasks": 4,
            "eval.attempts_per_task": 2,
        },
    )


PresetFn = Callable[[ml_collections.ConfigDict], None]


def from_presets(presets: dict[str, PresetFn], preset: str | None, default: str = "paper") -> ml_collections.ConfigDict:
    """`get_config()` with one named preset applied (the `:preset` of `--config=configs/X.py:preset`)."""
    name = preset or default
    if name not in presets:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(presets)}")
    config = get_config()
    presets[name](config)
    return config
