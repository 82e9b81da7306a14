"""Every setting of a run, once: one frozen dataclass per config section, each field a config key with its default
(the paper's, Table 4 and §3–A.4 of arXiv 2609.37633), its documentation, and its bounds or choices.

    settings = settings_of(config)        # a validated ConfigDict (rltldr_jax/config: files, flags, ablations) ->
    settings.rollout.group_size           #   the typed, frozen tree every library part takes
    episode = build(EpisodeConfig, settings.rollout, max_observation_chars=..., seed=settings.seed)

The experiment configs (`configs/*.py`, `--config.KEY=VALUE`) are ml_collections ConfigDicts built from these
defaults (`rltldr_jax.config.base.get_config`); their validation reads the bounds and choices declared here
(`setting(..., ge=1)`, `setting(..., choices=(...))`); `settings_of` turns a validated one into `Settings`. Below the
entry points nothing handles a ConfigDict: a library part takes `Settings`, one of its sections, or a small typed view
of its own that `build` fills from a section by field name (`EpisodeConfig`, `UpdateConfig`, ...).

Values the paper does not give are marked "not in the paper" with the choice made here. The choices of
`model.preset` are `models.presets.PRESETS`; three keys name registries that grow at run time, and the config's
validation checks them against those: `env.name` (`envs.spec`), `engine.kind` (`engines.factory.ENGINES`) and
`loss.terms` (`loss_terms.LOSS_TERMS`; a term registered from outside the package adds its coefficient keys to `loss`,
held in `Loss.extra`). The cross-checks of combinations live in `rltldr_jax/config/base.py`.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import typing
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from rltldr_jax.compile_cache import default_cache_dir
from rltldr_jax.loss_terms import DEFAULT_TERMS
from rltldr_jax.models.presets import PRESETS

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Bounds:
    """The interval a numeric setting must lie in: `ge`/`gt` below, `le`/`lt` above (None: unbounded)."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def __contains__(self, value: float) -> bool:
        return not (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        )

    def __str__(self) -> str:
        low = f"[{self.ge}" if self.ge is not None else f"({self.gt}" if self.gt is not None else "(-inf"
        high = f"{self.le}]" if self.le is not None else f"{self.lt})" if self.lt is not None else "inf)"
        return f"{low}, {high}"


def setting(
    default: Any = dataclasses.MISSING,
    *,
    factory: Any = dataclasses.MISSING,
    choices: tuple[Any, ...] | None = None,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
) -> Any:
    """A config key: its default (or a `factory` of it), and the choices or the bounds its value must respect."""
    bounds = Bounds(ge, gt, le, lt) if (ge, gt, le, lt) != (None,) * 4 else None
    return dataclasses.field(default=default, default_factory=factory, metadata={"choices": choices, "bounds": bounds})


def section(cls: type[T]) -> T:
    """A nested config section (`insight.teacher`): its own dataclass, its defaults."""
    return dataclasses.field(default_factory=cls, metadata={"section": True})


def extra() -> Any:
    """The field of a section that holds its keys not declared as fields ({key: value}): `Loss.extra`, the
    coefficients of loss terms registered from outside the package."""
    return dataclasses.field(default_factory=dict, hash=False, metadata={"extra": True})  # (settings stay hashable)


_frozen = dataclasses.dataclass(frozen=True, kw_only=True)


# --- Policy model --------------------------------------------------------------------------------------
@_frozen
class Lora:
    """`model.lora.*`: LoRA adapters on the policy (not in the paper, which fine-tunes every weight): with rank > 0
    only the adapters train (gradients, optimizer state), the base stays as loaded (`rltldr_jax/models/lora.py`)."""

    rank: int = setting(0, ge=0)  # r; 0 = no adapters (full fine-tuning)
    alpha: float = setting(16.0, gt=0.0)  # α: the update is scaled by α / r (PEFT's convention)
    # Comma-separated regular expressions searched in each linear layer's path (blocks/runs/1/self_attn/q_proj,
    # .../linear_attn/in_proj_qkv, .../mlp/down_proj); "" = every attention, DeltaNet and MLP projection. Use
    # alternation (q_proj|v_proj), not a comma, inside one expression.
    targets: str = setting("")
    # PEFT's lora_dropout: p of zeroing each element of an adapter's input in the train step's loss (the rest scaled
    # by 1/(1-p)); never in generation, evaluation or the reference policy.
    dropout: float = setting(0.0, ge=0.0, lt=1.0)


@_frozen
class Model:
    """`model.*`: the policy's architecture, weights and numerics."""

    # architecture: qwen3_5_9b | qwen3_5_4b | qwen3_5_2b | qwen3_5_0_8b | tiny | replicate_xs | replicate_s
    # | replicate_m
    preset: str = setting("qwen3_5_9b", choices=tuple(PRESETS))
    # HF checkpoint directory (safetensors + config.json) to start from, or a hub id org/name[@revision] (e.g.
    # Qwen/Qwen3.5-9B, fetched into the local HF cache: rltldr_jax/models/hub.py); "" = random init (tiny), or the
    # pretrained checkpoint of `pretrain.*` when pretrain.steps > 0
    checkpoint: str = setting("")
    # When model.checkpoint is a PEFT LoRA adapter directory: the base model it adapts (HF directory or hub id);
    # "" = the adapter's own base_model_name_or_path
    base_checkpoint: str = setting("")
    # compute dtype: bfloat16 | float32 (norms, delta rule, softmax, loss stay fp32)
    dtype: str = setting("bfloat16", choices=("bfloat16", "float32"))
    # Parameter and optimizer-state dtype. Not in the paper. float32 master weights: at lr 3e-6 most
    # updates are below bf16 resolution (Table 7: only ~2 % of entries move by more than bf16 precision).
    param_dtype: str = setting("float32", choices=("bfloat16", "float32"))
    remat: bool = setting(True)  # rematerialise activations per layer in the backward pass
    # Load checkpoints (model.checkpoint, the teacher's, a resumed run's) even if their weights hold NaN/inf; by
    # default such a checkpoint is refused as corrupt. Not in the paper.
    allow_nonfinite: bool = setting(False)
    lora: Lora = section(Lora)


# --- Environment ---------------------------------------------------------------------------------------
@_frozen
class Env:
    """`env.*`: the tasks and the sandbox."""

    # sapi | appworld | leetcode | craft, forge (the small-scale replication's worlds) | package.module:SPEC
    name: str = setting("sapi")
    train_split: str = setting("train")  # task split trained on (the paper uses Pass@128 = 0 "hard" splits, §4.1)
    eval_split: str = setting("eval")  # held-out split for evaluation
    seed: int = setting(0)  # seed of the task generator (SAPI-like world) and of the task order
    # longer observations are shortened (middle elided) in the context
    max_observation_chars: int = setting(4000, ge=1)
    step_timeout_s: float = setting(30.0, gt=0.0)  # wall-time limit of one code execution in the sandbox
    memory_limit_mb: int = setting(1024, ge=1)  # address-space limit of the sandbox process


# --- Rollout collection phase (Table 4, top) -------------------------------------------------------------
@_frozen
class Rollout:
    """`rollout.*`: a collection phase, and the budgets and sampling of an attempt."""

    tasks_per_phase: int = setting(8, ge=1)  # unique tasks per rollout collection phase
    # K: minimum attempts per task = GRPO group size (one task = one group). At least 2 for RL (validated), also
    # with loss.grpo_coef=0: a lone attempt has advantage 0, and insights reach only later attempts of the task.
    group_size: int = setting(8, ge=1)
    workers_per_task: int = setting(1, ge=1)  # concurrent sequential attempt chains per task (not in the paper)
    max_steps: int = setting(50, ge=1)  # maximum environment steps (actions) per attempt
    thinking: bool = setting(True)  # Qwen thinking mode (off for LeetCode, A.4)
    max_think_tokens: int = setting(768, ge=0)  # think budget per step; then `</think>` is forced
    max_action_tokens: int = setting(512, ge=1)  # action budget per step, after the think block
    max_context_tokens: int = setting(32768, ge=1)  # an attempt ends when its context would exceed this
    temperature: float = setting(1.0, gt=0.0)  # sampling temperature (1: logprobs are those of the policy)
    top_p: float = setting(1.0, gt=0.0, le=1.0)  # nucleus sampling (1 = off; <1 biases the importance ratios)
    top_k: int = setting(-1)  # top-k sampling (-1 = off)
    save_rollouts: bool = setting(True)  # write every phase's attempts and insights to {workdir}/rollouts
    # Not in the paper: every task gets exactly K attempts (instead of "at least K, faster tasks get more"). With
    # workers_per_task=1 a phase is then a deterministic function of the weights and seeds (bit for bit with the
    # embedded engine's engine.batch_invariant), which is what the resume == uninterrupted test relies on.
    exact_group_size: bool = setting(False)


# --- Insights: when they are inserted, who writes them, what they contain (§3, A.1–A.2, Table 3) -------
@_frozen
class Teacher:
    """`insight.teacher.*`: the frozen writer of insight.source=teacher (GLM 5.2 in Table 3); it never receives
    weight pushes."""

    checkpoint: str = setting("")  # HF checkpoint (dir or hub id) of the teacher, Qwen 3.5 family: embedded JaxEngine
    servers: str = setting("")  # or: comma-separated host:port of gRPC generation servers already hosting it
    tokenizer: str = setting("")  # tokenizer.json, checkpoint dir or hub id if it differs ("" = checkpoint's/policy's)


@_frozen
class Insight:
    """`insight.*`: when insights enter a later attempt's context, who writes them, what they contain."""

    # When a later attempt gets the task's insights of this phase in context:
    #   threshold: the task's running success rate in this phase <= `threshold` (and >= 1 insight exists)
    #   first_k:   at most `first_k_max_successes` successes among the task's first `first_k` attempts
    #   never:     no insights (the GRPO baseline);  always: whenever an insight exists
    schedule: str = setting("threshold", choices=("threshold", "first_k", "never", "always"))
    threshold: float = setting(0.5, ge=0.0, le=1.0)  # running success-rate threshold (A.2)
    first_k: int = setting(10, ge=1)  # window of the "<= 3 of the first 10" rule (Table 9)
    first_k_max_successes: int = setting(3, ge=0)
    max_insights: int = setting(16, ge=1)  # n_fb: at most this many insights in context, the most recent kept (§6)
    # Which attempts get an insight written: failure (RLTL;DR) | any (SGE summarises successes too)
    after: str = setting("failure", choices=("failure", "any"))
    # Who writes them: policy (the current policy in a fresh chat, A.1) | teacher (a separate model, Table 3)
    #   | rule (the verifier's first failed requirement turned into a sentence by rule; for untrained tiny models)
    #   | uninformative (a control, not in the paper: the verifier's sentence replaced by one of the same form and
    #     token length that says nothing about the failure; environments with such a control only: craft, forge)
    #   | shuffled (a control, not in the paper: a real insight of another task's failure, true of the world but not
    #     about this one's; forge only)
    source: str = setting("policy", choices=("policy", "teacher", "rule", "uninformative", "shuffled"))
    # What goes into the context, from the writer's JSON (Table 3, §6):
    #   hint (the TL;DR sentence) | feedback (diagnostic paragraph) | summary_feedback
    #   | summary_feedback_code (+ corrected step) | strategy (SGE: summary of the attempt, try something else)
    content: str = setting(
        "hint", choices=("hint", "feedback", "summary_feedback", "summary_feedback_code", "strategy")
    )
    thinking: bool = setting(True)  # the insight writer thinks before answering (Table 3 "thinking")
    show_failed_tests: bool = setting(True)  # the writer prompt includes the verifier's failed tests (Table 3)
    max_think_tokens: int = setting(4096, ge=0)  # insight writer's think budget (A.1)
    max_action_tokens: int = setting(4096, ge=1)  # insight writer's answer budget (A.1)
    max_rollout_chars: int = setting(20000, ge=1)  # the failed rollout is shortened to this in the writer prompt
    teacher: Teacher = section(Teacher)


# --- Loss: L = grpo_coef·L_GRPO + λ·L_SFT (§3.3, A.3) ----------------------------------------------------
@_frozen
class Loss:
    """`loss.*`: the objective's terms and coefficients, and how a phase's attempts become examples."""

    lam: float = setting(0.5, ge=0.0)  # λ, insight internalisation strength (0.5 in the paper; Fig. 4 sweeps 1/λ)
    grpo_coef: float = setting(1.0, ge=0.0)  # weight of L_GRPO (0 = "no GRPO loss, only L_SFT", Table 2)
    clip_eps: float = setting(0.2, gt=0.0, lt=1.0)  # PPO clip ε
    std_normalize: bool = setting(False)  # divide advantages by the group std (GRPO-style ablation, Table 9)
    filter_zero_advantage: bool = setting(True)  # drop groups whose advantages are all zero (A.3.2)
    positive_ratio: float = setting(0.75, ge=0.0, lt=1.0)  # keep rollouts so that >= 75 % have positive advantage
    # (A.3.2); 0 = off
    # Not in the paper: keep attempts the filters dropped as SFT-only examples when insights were in their context
    # (L_SFT otherwise rides only on kept GRPO examples, so all-failure groups teach nothing). On when grpo_coef=0.
    sft_on_filtered: bool = setting(False)
    split_advantages: bool = setting(False)  # insight-conditioned and unconditioned attempts as separate groups (T. 9)
    # How insight-conditioned attempts enter the update:
    #   in_context:   with the insights in context, as sampled (RLTL;DR)
    #   off_policy:   insights removed from the context, importance ratio π_θ(y|task)/π_old(y|task+insights) (Table 9)
    #   self_distill: insights removed, advantage-weighted likelihood without ratio (RLTF-SD, Song et al. 2026)
    insight_rollouts: str = setting("in_context", choices=("in_context", "off_policy", "self_distill"))
    # RLTF-FM / self-play insight SFT (Table 8): NLL of the insight given the failed rollout, π(f | τ), on the
    # insight-writer's context. Weight 0 = off.
    writer_sft_coef: float = setting(0.0, ge=0.0)
    # all | next_success (only insights after which the next attempt succeeded)
    writer_sft_filter: str = setting("all", choices=("all", "next_success"))
    # Weight of the KL-to-reference term `kl` (KL(π_θ || π_ref) over the action tokens, Schulman's k3 estimator; the
    # reference is the frozen initial policy, model.checkpoint's weights, also after a resume). Not in the paper
    # (Dr. GRPO without KL); the second replication round's stabiliser. Used only when loss.terms lists kl, which
    # doubles the trainer's parameter memory (the reference's copy) and adds a forward pass per micro-batch.
    kl_coef: float = setting(0.0, ge=0.0)
    # The terms the loss sums (§3), comma-separated names of rltldr_jax/loss_terms.py's registry: each is
    # coef * (sum over its mask's tokens) / (its token count over the whole update batch). Built in: grpo
    # (coefficient loss.grpo_coef), insight_sft (loss.lam), writer_sft (loss.writer_sft_coef); built in but not listed
    # by default: kl (loss.kl_coef; loss.terms=grpo,insight_sft,writer_sft,kl). A term registered from outside the
    # package (examples/entropy_bonus.py) adds its coefficient key here with its default value, when the module that
    # registers it is imported before the config is built.
    terms: str = setting(",".join(DEFAULT_TERMS))
    # {loss.KEY: value}: the coefficients and parameters of terms registered from outside the package.
    extra: dict[str, float] = extra()


# --- Optimizer (A.4, Table 4) ----------------------------------------------------------------------------
@_frozen
class Optim:
    """`optim.*`: update = clip (grad_clip_norm) -> rule (name) scaled by lr(t), t = optimizer steps taken (skipped
    non-finite steps do not count). The same keys build the offline SFT baselines' optimizer, with sft.learning_rate
    as lr."""

    # not in the paper: AdamW, as in the GRPO stacks it builds on. adamw | adam (no weight decay) | sgd (plain, no
    # momentum; b1/b2/eps unused). weight_decay != 0 is accepted only with adamw.
    name: str = setting("adamw", choices=("adamw", "adam", "sgd"))
    learning_rate: float = setting(3e-6, gt=0.0)  # constant, no warmup (Table 4)
    # lr(t) = learning_rate * min(t, warmup_steps) / warmup_steps: linear from 0 at step 0 to learning_rate at step
    # warmup_steps, constant after (not in the paper); 0 = constant learning_rate from the first step.
    warmup_steps: int = setting(0, ge=0)
    # Not in the paper (the second replication round): after warmup_steps, cosine decay from learning_rate to
    # end_learning_rate over decay_steps optimizer steps, lr(warmup_steps + s) = end_learning_rate + (learning_rate
    # - end_learning_rate) * (1 + cos(pi * min(s, decay_steps) / decay_steps)) / 2, constant end_learning_rate after;
    # 0 = no decay (constant learning_rate after the warmup).
    decay_steps: int = setting(0, ge=0)
    end_learning_rate: float = setting(0.0, ge=0.0)  # where the decay ends; at most learning_rate
    b1: float = setting(0.9, ge=0.0, lt=1.0)  # not in the paper (Adam's first-moment decay)
    b2: float = setting(0.999, ge=0.0, lt=1.0)  # not in the paper (Adam's second-moment decay)
    eps: float = setting(1e-8, gt=0.0)  # not in the paper
    weight_decay: float = setting(0.0, ge=0.0)  # not in the paper; decoupled (AdamW), only with optim.name=adamw
    # global-norm clip (Fig. 4 caption: fires on nearly every update); 0 = no clipping
    grad_clip_norm: float = setting(1.0, ge=0.0)


# --- Update phase (Table 4, bottom) ----------------------------------------------------------------------
@_frozen
class Batch:
    """`batch.*`: the update phase's batches."""

    ppo_epochs: int = setting(2, ge=1)  # passes over the phase's examples
    micro_batch_size: int = setting(4, ge=1)  # examples (steps) per device per micro-batch; one example = one step
    # micro-batches per optimizer step; global batch = micro × accum × (data × fsdp)
    grad_accum_steps: int = setting(8, ge=1)
    pad_to_multiple: int = setting(256, ge=1)  # the rounding unit of the padded example lengths (length_buckets)
    # Not in the paper: the padded lengths T of an optimizer step's [grad_accum, micro_batch, T] batch: the smallest
    # bucket holding its longest example (the last batch of a phase keeps all its rows, empty ones padding). Each T
    # compiles the train step once (then the compilation cache keeps it), so few buckets = few compilations:
    #   geometric: pad_to_multiple x 1, 2, 3, 4, 6, 8, 12, ... up to rollout.max_context_tokens (2 shapes per doubling;
    #     T < 1.5x the longest example beyond 2 x pad_to_multiple). Quick replication: T = 256, 384 where multiples
    #     give 256, 320, 384 (one compilation fewer; 14 of 30 steps padded 320 -> 384, ~8 % slower each): batching.py
    #   multiples: every multiple of pad_to_multiple (the least padding; one compilation per multiple)
    #   or an increasing comma-separated list, e.g. "256,512,1024" (the last >= rollout.max_context_tokens)
    length_buckets: str = setting("geometric")
    # Not in the paper: sequence packing. 0 = one example per row (the layout above). R > 0 = each optimizer step's
    # micro_batch_size x grad_accum_steps examples (the same steps and loss) are packed several to a row of the longest
    # bucket, R rows per micro-batch (a multiple of data x fsdp), and the rows left empty are skipped at run time: one
    # compiled train step for every phase, and little padding (batching.pack). The replication's configs use it.
    pack_rows: int = setting(0, ge=0)


# --- Compilation (not in the paper) ----------------------------------------------------------------------
@_frozen
class Compile:
    """`compile.*`: JAX's persistent compilation cache (rltldr_jax/compile_cache.py)."""

    # Every launcher and every run of a replication grid reads compiled programs from this directory and writes the
    # new ones, so a rerun, a resumed run or another arm of a grid (the loss coefficients are traced, not compiled in)
    # compiles nothing compiled before. Private: created 0700; another user's directory, or one others can write to,
    # is refused. The default is $JAX_COMPILATION_CACHE_DIR if set, else ~/.cache/rltldr_jax/xla
    # ($XDG_CACHE_HOME/rltldr_jax/xla); "" = no cache.
    cache_dir: str = setting(factory=default_cache_dir)


# --- Device mesh (axes data, fsdp, tensor; -1 = all remaining devices) -----------------------------------
@_frozen
class Mesh:
    """`mesh.*`: the device mesh's axis sizes (-1: all remaining devices)."""

    data: int = setting(1)
    fsdp: int = setting(-1)
    tensor: int = setting(1)


# --- Generation engine -----------------------------------------------------------------------------------
@_frozen
class Engine:
    """`engine.*`: the generation backend and its servers."""

    # A registered backend (rltldr_jax/engines/factory.py): jax (embedded, CPU/Colab/tests) | sglang (SGLang
    # servers over gRPC) | jax_grpc (launch/serve.py; "grpc" is an alias) | package.module:name (a backend its
    # module registers on import).
    kind: str = setting("sglang")
    servers: str = setting("")  # comma-separated host:port of the servers' gRPC listeners (sglang | jax_grpc)
    # SGLang's HTTP base URLs (http://host:port, same order as servers): weight pushes with version labels go to
    # POST /update_weights_from_disk there (SGLang's gRPC update has no version field). launch/serve_sglang.py
    # prints both lists. Empty for kind=jax_grpc (launch/serve.py takes the version over gRPC).
    http_servers: str = setting("")
    # Per-attempt deadline (s) of one generation request on a server (kind=sglang | jax_grpc); then it is retried on
    # another. 1 h leaves room for the longest completions on a loaded server; 0 = none. A stopped or hung server is
    # found sooner by the client's health checks (every 10 s) and its requests sent elsewhere; a server healthy again
    # returns to rotation, given the current weights first. Servers started with an API key (launch/serve.py on a
    # cluster) need it in $RLTLDR_ENGINE_API_KEY where the trainer runs: never in this config (it is saved and logged).
    request_timeout_s: float = setting(3600.0, ge=0)
    weight_sync_dir: str = setting("")  # shared directory for HF-format weight pushes; "" = {workdir}/weights
    max_batch: int = setting(64, ge=1)  # concurrent sequences of the embedded engine
    # Embedded engine: prefill each request alone, so that tokens and logprobs do not depend on which requests thread
    # timing admits together (bit-reproducible runs); False prefills them as one padded batch (faster on accelerators
    # with many concurrent prompts; results then vary at float rounding from run to run).
    batch_invariant: bool = setting(True)
    # Embedded engine: byte budget (MiB) of its prefix cache, the decode states at prefill_chunk boundaries of prompts
    # and after whole prompts (with their next-token logits), so that requests sharing a prompt prefix (the steps of
    # an attempt) skip prefilling it, and a prompt seen whole (a task's K attempts) is not prefilled again; results
    # are bit-identical with or without it. Only with batch_invariant. 0 = off. Not in the paper.
    prefix_cache_mb: int = setting(1024, ge=0)
    # Embedded engine, batch_invariant: prompts are prefilled in calls of this many tokens (a power of two >= 16),
    # aligned from position 0; 128 measured best on CPU with the prefix cache; an accelerator may prefer larger calls.
    prefill_chunk: int = setting(128, ge=16)
    # Embedded engine: dtype of its copy of the weight matrices; "" = the model's. "bfloat16" halves the bytes a decode
    # step reads (~2x faster decode on CPU), with float32 accumulation; its logprobs then differ slightly from the
    # trainer's (update/first_minibatch/logprob_gap). Not in the paper.
    weights_dtype: str = setting("", choices=("", "float32", "bfloat16"))
    # Embedded engine: up to decode_steps tokens per device call (a loop on the device that returns as soon as a request
    # stops or reaches its budget; admission, aborts, pauses and weight swaps happen between calls), and decode_group
    # slots per call (only the groups holding requests are decoded; it must divide max_batch, or be >= it). Any
    # decode_steps gives the same bits. 32 x 8 measured ~5x the tokens/s of 1 x 64 end to end (~8x the decode alone)
    # at configs/replicate.py's shapes on a 2-core CPU (benchmarks/engine.py); an accelerator serving many concurrent
    # requests may prefer decode_group = max_batch.
    decode_steps: int = setting(32, ge=1)
    decode_group: int = setting(8, ge=1)
    # Servers (kind=jax_grpc | sglang) must sample from the trainer's weights from the first phase on. At start (fresh
    # or resumed) the trainer pushes its weights as its current version unless every server proves it serves them
    # (launch/serve.py reports a weights fingerprint). SGLang reports none, so it gets the push, unless this is True:
    # the fast path when the servers were started from model.checkpoint (fresh run) at the trainer's weight version.
    assume_initial_weights: bool = setting(False)


# --- Training loop ---------------------------------------------------------------------------------------
@_frozen
class Train:
    """`train.*`: the loop's budget, checkpoints and guards."""

    # stop after this many environment steps (SAPI's budget, §4.2, E.3); 0 = no limit
    env_step_budget: int = setting(170_000, ge=0)
    max_phases: int = setting(0, ge=0)  # also stop after this many collection+update phases; 0 = no limit
    checkpoint_every: int = setting(1, ge=1)  # phases between checkpoints
    keep_checkpoints: int = setting(3, ge=1)  # most recent checkpoints kept
    # Not in the paper: collect phase n + 1 in the background with the weights of version n while the trainer updates
    # on phase n (one version of lag, corrected by the importance ratio; logged as rollout/weight_version_gap). A
    # resumed run collects its first phase synchronously, so resume == uninterrupted holds only without it.
    overlap_phases: bool = setting(False)
    # An optimizer step whose loss or gradient norm is NaN/inf is skipped (parameters and optimizer state
    # unchanged, counted as update/skipped_nonfinite); after this many skipped steps in a row the run stops with an
    # error, its last checkpoint intact. 0 = never stop. Not in the paper.
    max_nonfinite_skips: int = setting(5, ge=0)
    # Before a phase's update changes anything, its first minibatch compares the sampler's logprobs with the trainer's
    # (update/first_minibatch/logprob_gap: the mean of trainer - sampler over the GRPO tokens, about -KL(sampler ||
    # trainer)). Beyond this many nats per token the engine is not sampling from the trainer's policy (other weights,
    # a tokenizer or chat-template mismatch, top-p/top-k truncation) and the run stops before saving anything. The
    # fp32 engines sit at ~1e-6. 0 = never stop. Checked only with loss.insight_rollouts=in_context (off_policy and
    # self_distill train on other contexts than were sampled). With adapter dropout (model.lora.dropout) the trainer's
    # logprobs are those of one step's masks, which adds the dropout's own gap. Not in the paper.
    max_logprob_gap: float = setting(0.1, ge=0.0)


# --- Evaluation: held-out tasks, fixed attempts, no insights (§4.1, D.1) -------------------------------
@_frozen
class Eval:
    """`eval.*`: held-out evaluation (and optionally held-in)."""

    every: int = setting(10, ge=0)  # phases between evaluations; 0 = only at the end
    num_tasks: int = setting(256, ge=0)  # held-out tasks evaluated (256 in §5); 0 = the whole split
    attempts_per_task: int = setting(8, ge=1)  # attempts per task, for macro Pass@1 and Pass@8
    # Not in the paper: also evaluate this many tasks of env.train_split the same way (no insights), logged under
    # eval_train/ (the "train no-insight Pass@1" of Table 2, measured as a test rather than from the training
    # attempts); 0 = off.
    train_num_tasks: int = setting(0, ge=0)
    # Not in the paper: more evaluation sets, comma-separated split names of the environment (e.g. a world's
    # evaluation tiers, "valid,tier1,tier2,tier3,tier4"), each evaluated the same way and logged under
    # eval_<split>/. Each set is fixed by the world, not by the run: the first split_tasks tasks of the split in an
    # order seeded by env.seed (all of them when 0), so every seed of a grid evaluates the same tasks.
    splits: str = setting("")
    split_tasks: int = setting(0, ge=0)
    # Not in the paper: the set of eval.splits (a held-in validation set, never a held-out one) whose no-insight
    # Pass@1 chooses the evaluation a replication reports besides the final one (replication/measures.py); "" = none.
    select_on: str = setting("")


# --- Offline SFT baselines (Table 2; mode = "sft") -----------------------------------------------------
@_frozen
class Sft:
    """`sft.*`: the offline SFT baselines of Table 2 (mode = "sft")."""

    rollouts_dir: str = setting("")  # saved rollouts of an RLTL;DR run (its {workdir}/rollouts)
    # rollouts: NLL of the actions of successful attempts (insights in context, not trained on)
    # insights: SFTL;DR, NLL of the insights given the task alone, π(f_1..f_I | task)
    data: str = setting("rollouts", choices=("rollouts", "insights"))
    num_rollouts: int = setting(0, ge=0)  # successful rollouts used; 0 = all (3.5k in Table 2)
    deduplicate: bool = setting(False)  # SFTL;DR on unique (task, insight) pairs, one by one (Table 2)
    epochs: int = setting(10, ge=1)  # (§5.1)
    learning_rate: float = setting(3e-6, gt=0.0)  # not in the paper


# --- Pretraining from scratch (the small-scale replication; not in the paper) ---------------------------
@_frozen
class Pretrain:
    """`pretrain.*`: with steps > 0 and no model.checkpoint, launchers first pretrain model.preset from random weights
    on the environment's demonstrations (envs.registry.demonstrations: public-rule plans, some obeying insights in
    context) and train from that checkpoint. The result (HF safetensors + tokenizer.json) is cached under cache_dir by
    a hash of everything it depends on, so reruns and other arms with the same settings reuse it."""

    steps: int = setting(0, ge=0)  # optimizer steps; 0 = no pretraining
    batch_size: int = setting(32, ge=1)  # demonstrations per step
    learning_rate: float = setting(3e-3, gt=0.0)  # peak of a warmup + cosine schedule (AdamW)
    warmup_steps: int = setting(50, ge=0)
    weight_decay: float = setting(0.01, ge=0.0)
    # the byte-level BPE tokenizer trained on the demonstrations' texts (<= the model's)
    vocab_size: int = setting(512, ge=262)
    insight_prob: float = setting(0.6, ge=0.0, le=1.0)  # share of demonstrations with (made-up) requirements in
    # context as insights
    # The declarative-pretraining experiment: this share of demonstrations instead has insights that state true
    # public rules of the plan (task -> rule statement), trained as targets next to the action.
    statement_prob: float = setting(0.0, ge=0.0, le=1.0)
    # Insight writing (replication round two): this share of the demonstrations with made-up insights also trains
    # their insight sentences as targets, given the task (as L_SFT will): the base policy learns to write insights,
    # so L_SFT starts from a policy for which insight tokens are a learnt output. Their content is made up, never
    # a hidden rule: what is learnt is the form.
    write_prob: float = setting(0.0, ge=0.0, le=1.0)
    # this share of insight and statement sentences is phrased in another wording than the verifier's
    # (envs/crafting.py WORDINGS), so that insights are read and written in more than one form
    reword_prob: float = setting(0.0, ge=0.0, le=1.0)
    cache_dir: str = setting("")  # "" = runs/pretrained
    # Use a base policy shipped with the package (rltldr_jax/replication/base_policies) when one has this config's
    # pretraining key, instead of pretraining it again (the replication's seeds 0-2: about 10-20 CPU minutes each).
    shipped: bool = setting(True)


# --- Logging (not in the paper) ------------------------------------------------------------------------
@_frozen
class Logging:
    """`logging.*`: where a run's metrics go besides the two records every run writes: `{workdir}/metrics.jsonl` (one
    JSON object per phase and evaluation, the source of truth the replication and the analyses read) and TensorBoard
    (`{workdir}/tb`: every metric at three x-axes, the config under HPARAMS). Every run also saves its config as
    `{workdir}/config.json` (rewritten when a resumed run changes keys). rltldr_jax/train/loggers.py writes them."""

    # Weights & Biases: the run's config as the W&B run's config, and every metric under its TensorBoard name with
    # the x-axes env_steps (default), tokens and walltime_s to choose from (an offline SFT run: optimizer_steps,
    # walltime_s). A resumed run continues the same W&B run (its id is kept in {workdir}/wandb_run.json); phases a
    # stopped run logged after its checkpoint are logged again there (W&B keeps both, TensorBoard the new ones).
    # Only process 0 of a multi-process job logs. Needs the wandb package: pip install -e '.[wandb]'.
    wandb: bool = setting(False)
    wandb_project: str = setting("")  # W&B project; "" = $WANDB_PROJECT if set, else rltldr
    wandb_entity: str = setting("")  # W&B entity (user or team); "" = wandb's default ($WANDB_ENTITY, your account)
    wandb_group: str = setting("")  # W&B run group (e.g. one per grid, so that its seeds plot together); "" = none
    # online: streamed to the W&B server (after `wandb login`, or with $WANDB_API_KEY) | offline: written on disk
    # only, uploaded later with `wandb sync DIR` (a resumed run adds a directory with the same run id: sync them in
    # order) | disabled: nothing is written | "" = wandb's default ($WANDB_MODE, else online)
    wandb_mode: str = setting("", choices=("", "online", "offline", "disabled"))
    # where wandb writes its files (a wandb/ directory below it: offline runs, logs); "" = $WANDB_DIR if set, else
    # the run's workdir
    wandb_dir: str = setting("")


@_frozen
class Settings:
    """A run's settings, the paper's RLTL;DR by default (SAPI/AppWorld column of Table 4)."""

    name: str = setting("rltldr")  # run name; used in the default workdir and in TensorBoard
    workdir: str = setting("")  # where checkpoints, event files and rollouts go; "" = runs/{env.name}-{name}
    seed: int = setting(0)  # seeds parameters (for random init), sampling, task order and filters
    # "rl": RL training (launch/train.py); "sft": offline SFT baselines of Table 2 (launch/sft.py)
    mode: str = setting("rl", choices=("rl", "sft"))
    model: Model = section(Model)
    tokenizer: str = setting("")  # tokenizer.json, checkpoint dir or hub id; "" = model.checkpoint's, else built-in
    env: Env = section(Env)
    rollout: Rollout = section(Rollout)
    insight: Insight = section(Insight)
    loss: Loss = section(Loss)
    optim: Optim = section(Optim)
    batch: Batch = section(Batch)
    compile: Compile = section(Compile)
    mesh: Mesh = section(Mesh)
    engine: Engine = section(Engine)
    train: Train = section(Train)
    eval: Eval = section(Eval)
    sft: Sft = section(Sft)
    pretrain: Pretrain = section(Pretrain)
    logging: Logging = section(Logging)


# ----------------------------------------------------------------------------------------------------------
# From and to config trees
# ----------------------------------------------------------------------------------------------------------


class SettingsError(ValueError):
    """A config tree that does not match the settings' keys; the message names the key."""


def _section_type(cls: type, f: dataclasses.Field) -> type:
    return typing.get_type_hints(cls)[f.name]


def _keys(node: Any) -> list[str]:
    """The keys of a config node: a ConfigDict, a dict, or any mapping with `keys()`."""
    return list(node.keys())


def from_tree(cls: type[T], node: Any, *, where: str = "") -> T:
    """The section dataclass `cls` from a config node holding exactly its keys (nested sections recursively; keys not
    declared go into its `extra()` field when it has one). A ConfigDict, a dict (`as_dict`'s), any mapping."""
    values: dict[str, Any] = {}
    unknown = set(_keys(node))
    extra_field = None
    for f in dataclasses.fields(cls):
        if f.metadata.get("extra"):
            extra_field = f.name
            continue
        key = f"{where}{f.name}"
        if f.name not in unknown:
            raise SettingsError(f"config key {key!r} is missing")
        unknown.discard(f.name)
        value = node[f.name]
        values[f.name] = (
            from_tree(_section_type(cls, f), value, where=f"{key}.") if f.metadata.get("section") else value
        )
    if extra_field is not None:
        values[extra_field] = {k: node[k] for k in _keys(node) if k in unknown}
    elif unknown:
        raise SettingsError(f"unknown config key(s) {', '.join(repr(where + k) for k in sorted(unknown))}")
    return cls(**values)


def settings_of(config: Any) -> Settings:
    """The `Settings` of a config tree (a validated ConfigDict: `rltldr_jax.config.ablations.resolve` returns it
    already). Checks keys only: validate a config (`rltldr_jax.config.base.validate`) before running it."""
    return from_tree(Settings, config)


def recorded_settings(tree: Mapping[str, Any]) -> Settings:
    """The `Settings` of a config recorded by an earlier version of this package (a finished run's summary.json, a
    checkpoint's metadata): keys added since then take this version's defaults (what that version did before the
    key existed), so earlier runs stay readable by the analyses; anything else as `settings_of`."""

    def filled(defaults: Mapping[str, Any], node: Mapping[str, Any]) -> dict[str, Any]:
        out = dict(node)
        for key, value in defaults.items():
            if key not in out:
                out[key] = value
            elif isinstance(value, Mapping) and isinstance(out[key], Mapping):
                out[key] = filled(value, out[key])
        return out

    return settings_of(filled(as_dict(Settings()), tree))


def as_dict(obj: Any) -> dict[str, Any]:
    """A settings dataclass (any section) as nested plain dicts keyed like its config (`extra()` keys inline): what
    `ConfigDict.to_dict()` gives for the same config, saved with checkpoints and compared on resume."""
    out: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if f.metadata.get("extra"):
            out.update(value)
        elif f.metadata.get("section"):
            out[f.name] = as_dict(value)
        else:
            out[f.name] = value
    return out


def value_at(obj: Any, key: str) -> Any:
    """The value of a dotted key of a settings dataclass (`value_at(s, "loss.lam")`; an `extra()` key too); an
    unknown key is a SettingsError."""
    node = obj
    for part in key.split("."):
        names = {f.name: f for f in dataclasses.fields(node)} if dataclasses.is_dataclass(node) else {}
        extras = [getattr(node, n) for n, f in names.items() if f.metadata.get("extra")]
        if part in names and not names[part].metadata.get("extra"):
            node = getattr(node, part)
        elif extras and part in extras[0]:
            node = extras[0][part]
        else:
            raise SettingsError(f"unknown settings key {key!r}")
    return node


def replace(obj: T, changes: Mapping[str, Any]) -> T:
    """A copy of a settings dataclass with dotted keys changed (`replace(s, {"model.checkpoint": path})`); an unknown
    key is a SettingsError."""
    nested: dict[str, dict[str, Any]] = {}
    direct: dict[str, Any] = {}
    names = {f.name: f for f in dataclasses.fields(obj)}
    for key, value in changes.items():
        head, dot, rest = key.partition(".")
        f = names.get(head)
        if f is None or f.metadata.get("extra") or bool(dot) != bool(f.metadata.get("section")):
            raise SettingsError(f"unknown settings key {key!r}")
        if dot:
            nested.setdefault(head, {})[rest] = value
        else:
            direct[head] = value
    for head, sub in nested.items():
        direct[head] = replace(getattr(obj, head), sub)
    return dataclasses.replace(obj, **direct)


# ----------------------------------------------------------------------------------------------------------
# Declared bounds and choices
# ----------------------------------------------------------------------------------------------------------


def declared(cls: type = Settings, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field]]:
    """(dotted config key, field) of every setting of `cls` and its sections."""
    for f in dataclasses.fields(cls):
        if f.metadata.get("section"):
            yield from declared(_section_type(cls, f), f"{prefix}{f.name}.")
        elif not f.metadata.get("extra"):
            yield f"{prefix}{f.name}", f


def choices(key: str) -> tuple[Any, ...]:
    """The allowed values of a choice setting (`choices("insight.schedule")`)."""
    for name, f in declared():
        if name == key and f.metadata["choices"] is not None:
            return f.metadata["choices"]
    raise KeyError(f"{key!r} is not a choice setting")


def value_errors(get: Any) -> list[str]:
    """What violates a declared choice or bound, one line each; `get(key)` reads a dotted key of the config checked.
    Non-finite floats are reported, and their bounds then skipped."""
    errors = []
    for key, f in declared():
        value = get(key)
        if isinstance(value, float) and not math.isfinite(value):
            errors.append(f"{key}={value!r} is not a finite number")
            continue
        allowed, bounds = f.metadata["choices"], f.metadata["bounds"]
        if allowed is not None and value not in allowed:
            errors.append(f"{key}={value!r} is not one of {', '.join(map(repr, allowed))}")
        if bounds is not None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                errors.append(f"{key}={value!r} must be a number in {bounds}")
            elif value not in bounds:
                errors.append(f"{key}={value!r} is outside {bounds}")
    return errors


# ----------------------------------------------------------------------------------------------------------
# Library views
# ----------------------------------------------------------------------------------------------------------


def _parameters(fn: Callable[..., Any]) -> list[str]:
    """The parameters `fn(...)` takes by name: a dataclass's init fields, a class's `__init__` parameters (but self),
    a function's."""
    if isinstance(fn, type) and dataclasses.is_dataclass(fn):
        return [f.name for f in dataclasses.fields(fn) if f.init]
    params = list(inspect.signature(fn.__init__ if isinstance(fn, type) else fn).parameters.values())
    params = params[1:] if isinstance(fn, type) else params
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def build(fn: Callable[..., T], section_: Any, **given: Any) -> T:
    """`fn(...)` (a library part's typed settings, a class or a function taking settings by name) with every
    parameter named like a key of `section_` (a settings section) read from it, and the others from `given` (which
    wins: settings of other sections, objects). A parameter in neither is an error, so no setting silently keeps a
    default of `fn`.

    Example: `build(EpisodeConfig, s.rollout, max_observation_chars=s.env.max_observation_chars, seed=s.seed)`.
    """
    names = {f.name for f in dataclasses.fields(section_) if not f.metadata.get("extra")}
    params = _parameters(fn)
    unknown = set(given) - set(params)
    if unknown:
        raise TypeError(f"{fn.__name__} takes no {', '.join(sorted(unknown))}")
    missing = [p for p in params if p not in given and p not in names]
    if missing:
        raise TypeError(
            f"{fn.__name__}: {', '.join(missing)} not in the {type(section_).__name__} section: pass "
            f"{'it' if len(missing) == 1 else 'them'} to build(...)"
        )
    return fn(**{p: given[p] if p in given else getattr(section_, p) for p in params})
