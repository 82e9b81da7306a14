"""Where one RLTL;DR run of the small-scale replication spends its time, against the compute it needs.

    python benchmarks/replication.py                       # the quick preset's RLTL;DR run (30 phases) + base checks
    python benchmarks/replication.py --phases=10 --no_checks
    python benchmarks/replication.py --xla_cache=/tmp/xla  # twice: the second run reads its programs from the cache

The run is the README's first command's RLTL;DR arm, in this process, on the shipped base policy, with timers
around the engine's jitted calls (prefill, decode, ...), the update's optimizer steps, the evaluation, the
checkpoints and the weight pushes, and a JAX monitoring listener that charges XLA compilation (tracing, lowering,
compiling, or reading a program from the on-disk cache) to whichever of them it happened in. It prints:

- the breakdown: base checks and collection (prefill, decode, compile, host each); update (compile, device, host);
  evaluation (prefill, decode, compile, host); checkpoints; weight pushes; the rest;
- tokens generated per second in collection and evaluation, and tokens trained;
- model FLOPs per phase (an analytic count, below) and the floor: the run's FLOPs over this CPU's matmul FLOP/s,
  measured in the same run (a 1024² float32 matmul, best of 5), and the ratio of the run's time to that floor.

FLOPs are counted as the run *needs* them, not as it computes them (padding rows, idle decode slots and prefix reuse
do not count): a token's forward pass costs 2 FLOPs per weight-matrix parameter (the LM head included, the embedding
lookup not), plus 4·heads·head_dim·context for each attention layer and 4·Hv·Dk·Dv for each DeltaNet layer's
recurrent state (read and update); every prompt and generated token of a request is one forward pass, and every
token of a trained example (up to its last loss target) costs 3 (forward and backward) per optimizer step it is in.
The context length of a token is taken as half its sequence's length.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import functools
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from common import best_of

#: Compilation events of jax.monitoring (seconds each): tracing, lowering, XLA compiling, reading the disk cache.
COMPILE_EVENTS = (
    "/jax/core/compile/jaxpr_trace_duration",
    "/jax/core/compile/jaxpr_to_mlir_module_duration",
    "/jax/core/compile/backend_compile_duration",
    "/jax/compilation_cache/cache_retrieval_time_sec",
)


class Profile:
    """Seconds per (activity, part), counted across threads.

    The main thread's activity (collection, update, evaluation, ...) is set by `activity`; a timed call (`timed`)
    in any thread adds its wall time to (current activity, its part), less the compilation that happened inside
    it, which goes to (activity, "compile"). Token and FLOP counters are kept per activity too.
    """

    def __init__(self) -> None:
        self.seconds: dict[tuple[str, str], float] = collections.defaultdict(float)
        self.counts: dict[tuple[str, str], float] = collections.defaultdict(float)
        self.current = "other"
        self._local = threading.local()
        self._lock = threading.Lock()
        jax.monitoring.register_event_duration_secs_listener(self._on_event)

    def _on_event(self, event: str, duration: float, **_: Any) -> None:
        if event not in COMPILE_EVENTS:
            return
        stack = getattr(self._local, "stack", None)
        if stack:
            stack[-1][1] += duration  # the compile time inside the innermost timed call of this thread
        self.add(self.current, "compile", duration)

    def add(self, activity: str, part: str, seconds: float) -> None:
        with self._lock:
            self.seconds[(activity, part)] += seconds

    def count(self, activity: str, what: str, n: float) -> None:
        with self._lock:
            self.counts[(activity, what)] += n

    @contextlib.contextmanager
    def activity(self, name: str) -> Iterator[None]:
        """Everything until the end of the block belongs to `name` (its wall time is `(name, "total")`)."""
        outer, self.current = self.current, name
        start = time.perf_counter()
        try:
            yield
        finally:
            self.add(name, "total", time.perf_counter() - start)
            self.current = outer

    def timed(self, part: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        """`fn` with its wall time (results ready) charged to (current activity, `part`), compilation excluded."""

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            stack = self._local.__dict__.setdefault("stack", [])
            stack.append([part, 0.0])
            start = time.perf_counter()
            try:
                out = jax.block_until_ready(fn(*args, **kwargs))
            finally:
                _, compiled = stack.pop()
                elapsed = time.perf_counter() - start
                self.add(self.current, part, elapsed - compiled)
                if stack:  # an outer timed call: its own compile share includes this one's
                    stack[-1][1] += compiled
            return out

        return wrapper


def matmul_flops_per_s(n: int = 1024) -> float:
    """This CPU's float32 matmul FLOP/s: a jitted [n, n] @ [n, n], best of 5."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
    f = jax.jit(lambda x: x @ x)
    (seconds,) = best_of([lambda: f(a).block_until_ready()], repeat=5)
    return 2 * n**3 / seconds


def forward_flops(config: Any, params: Any, tokens: float, context: float) -> float:
    """Analytic FLOPs of `tokens` forward tokens at mean context `context` (module doc)."""
    matrix = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(params) if getattr(x, "ndim", 0) >= 2)
    if not config.tie_word_embeddings:
        matrix -= config.vocab_size * config.hidden_size  # the embedding table is looked up, not multiplied
    kinds = list(config.layer_types)
    attention = kinds.count("full_attention") * 4 * config.num_attention_heads * config.head_dim * context
    delta = (
        kinds.count("linear_attention")
        * 4
        * config.linear_num_value_heads
        * config.linear_key_head_dim
        * config.linear_value_head_dim
    )
    return tokens * (2 * matrix + attention + delta)


def instrument(trainer: Any, profile: Profile) -> None:
    """Timers around the trainer's engine calls, optimizer steps, evaluation, checkpoints and weight pushes, and
    token counters on the engine's requests and the trained batches."""
    import rltldr_jax.train.loop as loop

    engine = instrument_engine(trainer.engine, profile)
    step = trainer.update.step

    def counted_step(batch):
        targets = np.asarray(batch.action_mask | batch.insight_mask | batch.writer_mask)  # [A, M, T]
        t = targets.shape[-1]
        rows = targets.reshape(-1, t)
        # Each example's tokens up to its last target (a packed row holds several: its segments).
        packed = batch.segments is not None
        segments = np.asarray(batch.segments).reshape(-1, t) if packed else np.ones(rows.shape, np.int32)
        used = []
        for row, seg in zip(rows, segments, strict=True):
            for s in np.unique(seg[row]):
                where = np.flatnonzero(seg == s)
                used.append(where[row[where]].max() - where[0] + 1)
        used = np.asarray(used, np.float64)
        profile.count("update", "trained tokens", float(used.sum()))
        # Micro-batches without a target are skipped by the train step.
        profile.count("update", "computed tokens", float(targets.any(axis=(1, 2)).sum() * targets[0].size))
        profile.count("update", "trained token-contexts", float((used * used / 2).sum()))
        metrics = profile.timed("device", step)(batch)
        jax.block_until_ready((trainer.update.params, trainer.update.opt_state))
        return metrics

    trainer.update.step = counted_step

    real_update_phase = loop.update_phase

    def update_phase(*args, **kwargs):
        with profile.activity("update"):
            return real_update_phase(*args, **kwargs)

    loop.update_phase = update_phase
    collect = trainer.collector.collect

    def timed_collect(*args, **kwargs):
        with profile.activity("collection"):
            return collect(*args, **kwargs)

    trainer.collector.collect = timed_collect
    for method, activity in (("evaluate", "evaluation"), ("save", "checkpoints")):
        real = getattr(trainer, method)
        setattr(trainer, method, _in_activity(profile, activity, real))
    engine.update_weights = _in_activity(profile, "weight push", engine.update_weights)


def instrument_engine(engine: Any, profile: Profile) -> Any:
    """`engine` with timers around its jitted functions and token counters on its requests (returned)."""
    for name, value in list(vars(engine).items()):  # the engine's jitted functions
        if callable(value) and hasattr(value, "lower"):
            part = "prefill" if "prefill" in name else "decode" if "decode" in name else "engine other"
            setattr(engine, name, profile.timed(part, value))
    submit = engine.submit

    def counted_submit(request, done):
        activity = profile.current
        profile.count(activity, "requests", 1)
        profile.count(activity, "prompt tokens", len(request.prompt_ids))

        def counted_done(result):
            profile.count(activity, "generated tokens", len(result.token_ids))
            n = len(request.prompt_ids) + len(result.token_ids)
            profile.count(activity, "forward token-contexts", n * n / 2)
            done(result)

        submit(request, counted_done)

    engine.submit = counted_submit

    return engine


def _in_activity(profile: Profile, activity: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with profile.activity(activity):
            return fn(*args, **kwargs)

    return wrapper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--phases", type=int, default=0, help="RL phases (0 = the quick preset's 30)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no_checks", action="store_true", help="skip the base checks")
    parser.add_argument(
        "--xla_cache", default="", help="the on-disk compilation cache to use ('' = a new empty one: a cold run)"
    )
    args = parser.parse_args()

    import logging

    logging.getLogger("rltldr_jax").setLevel(logging.WARNING)
    from rltldr_jax.config import replicate
    from rltldr_jax.replication.checks import base_checks
    from rltldr_jax.replication.driver import base_policy
    from rltldr_jax.settings import replace
    from rltldr_jax.train.loop import Trainer

    tmp = tempfile.mkdtemp(prefix="rltldr_bench_replication_")
    cache = args.xla_cache or os.path.join(tmp, "xla-cache")
    jax.config.update("jax_compilation_cache_dir", cache)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

    peak = matmul_flops_per_s()
    overrides: dict[str, Any] = {"workdir": os.path.join(tmp, "rltldr")}
    if args.phases:
        overrides["train.env_step_budget"] = 64 * args.phases
    config = replicate.arm_config("quick", "rltldr", args.seed, overrides)
    config = replace(config, {"model.checkpoint": base_policy(config)})
    profile = Profile()
    wall = time.perf_counter()
    if not args.no_checks:
        c = replace(config, {"workdir": os.path.join(tmp, "checks")})
        import rltldr_jax.replication.checks as checks_module

        make_engine = checks_module.policy_engine
        checks_module.policy_engine = lambda *a, **k: instrument_engine(make_engine(*a, **k), profile)
        with profile.activity("base checks"):
            base_checks(c, max_k=config.rollout.group_size, **replicate.CHECKS["quick"])
    with profile.activity("trainer set-up"):
        trainer = Trainer(config)
    instrument(trainer, profile)
    with profile.activity("training"):
        trainer.run()
    phases = trainer.phase
    params = trainer.update.params
    model_config = trainer.update.model().config
    trainer.close()
    total = time.perf_counter() - wall
    report(profile, total, phases, peak, lambda tokens, ctx: forward_flops(model_config, params, tokens, ctx))


def report(profile: Profile, total: float, phases: int, peak: float, flops: Callable[[float, float], float]) -> None:
    s, n = profile.seconds, profile.counts
    rows: list[tuple[str, float]] = []
    for activity, parts in (
        ("base checks", ("prefill", "decode", "engine other", "compile")),
        ("collection", ("prefill", "decode", "engine other", "compile")),
        ("update", ("compile", "device")),
        ("evaluation", ("prefill", "decode", "engine other", "compile")),
    ):
        whole = s[activity, "total"]
        rows.append((activity, whole))
        for part in parts:
            rows.append((f"  {part}", s[activity, part]))
        rows.append(("  host", whole - sum(s[activity, p] for p in parts)))
    for activity in ("checkpoints", "weight push", "trainer set-up"):
        rows.append((activity, s[activity, "total"]))
    accounted = sum(s[a, "total"] for a in ("base checks", "trainer set-up", "training"))
    nested = sum(s[a, "total"] for a in ("collection", "update", "evaluation", "checkpoints", "weight push"))
    rows.append(("rest of the trainer", s["training", "total"] - nested))
    rows.append(("outside all of these", total - accounted))
    print(f"\nwhere the time went ({phases} phases, {total:.1f} s in all)")
    print(f"{'':28s} {'seconds':>9s} {'share':>7s}")
    for name, seconds in rows:
        print(f"{name:28s} {seconds:9.2f} {seconds / total:7.1%}")

    gen_flops = 0.0
    print("\ntokens")
    for activity in ("base checks", "collection", "evaluation"):
        generated, prompt = n[activity, "generated tokens"], n[activity, "prompt tokens"]
        seconds = s[activity, "total"]
        tokens = generated + prompt
        f = flops(tokens, n[activity, "forward token-contexts"] / max(tokens, 1))
        gen_flops += f
        print(
            f"  {activity:12s} {int(n[activity, 'requests']):6d} requests, {int(prompt):8d} prompt + "
            f"{int(generated):7d} generated tokens: {generated / max(seconds, 1e-9):8.0f} generated tokens/s, "
            f"{f / 1e9:7.2f} GFLOP"
        )
    trained, computed = n["update", "trained tokens"], n["update", "computed tokens"]
    train_flops = 3 * flops(trained, n["update", "trained token-contexts"] / max(trained, 1))
    print(
        f"  update       {int(trained):8d} trained tokens ({int(computed)} computed with padding: "
        f"{trained / max(computed, 1):.0%} used), {train_flops / 1e9:.2f} GFLOP"
    )
    needed = gen_flops + train_flops
    floor = needed / peak
    print(
        f"\nmodel FLOPs: {needed / 1e9:.1f} GFLOP in all, {needed / max(phases, 1) / 1e9:.2f} GFLOP "
        f"per phase (generation and update, evaluation and checks included)"
    )
    print(f"this CPU's matmul: {peak / 1e9:.1f} GFLOP/s; floor = {floor:.2f} s; the run took {total / floor:.0f}x it")


if __name__ == "__main__":
    main()
