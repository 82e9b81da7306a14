"""Where a run's metrics go besides `metrics.jsonl`: TensorBoard (always) and Weights & Biases (`logging.wandb`),
behind one small interface, and the run's config saved as `{workdir}/config.json`.

    loggers = open_loggers(settings, workdir, resume=False)   # config.json, W&B (if on), TensorBoard with hparams
    loggers.scalars(metrics, env_steps, tokens=tokens, walltime=seconds)
    loggers.close()                                           # (close(error=e) marks the W&B run failed)

`metrics.jsonl` (train/report.py) stays the source of truth: the trainers write it themselves, with `null` for a
non-finite value; the loggers get the same metrics by the same names.

- TensorBoard (`{workdir}/tb`, train/summary.py): every metric at three x-axes (environment steps, tokens, walltime),
  purged past the checkpoint on resume, and the run's config, flattened to dotted keys, as its hyperparameters in the
  HPARAMS tab (the hparams plugin rather than a text summary: the tab puts every run of a log directory in one
  table, filterable and sortable by any key next to the runs' metrics, which is how arms and seeds are compared; the
  full config, readable, is config.json).
- Weights & Biases (`logging.wandb*`, documented in rltldr_jax/settings.py): the config (nested as in config.json) as
  the W&B run's config; each metric under the same name, plotted against `env_steps` by default, with `tokens` and
  `walltime_s` logged beside it as the other x-axes (`define_metric`). A resumed run continues the same W&B run: its
  id is kept in `{workdir}/wandb_run.json`. `wandb` is imported only when it is on; validation checks it is installed.
- `{workdir}/config.json`: every key of the run's config, written at the start and rewritten when a resumed run's
  config differs (the trainer logs the changed keys).
- `{workdir}/hosts.jsonl` (rltldr_jax/host.py): the machine of each start (processor features, device kinds, jax and
  jaxlib), with a warning when a run resumes on another kind of machine (it is then not bit-identical to an
  uninterrupted run).

Only process 0 of a multi-process job writes any of them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from rltldr_jax import strict_json
from rltldr_jax.distributed import is_main_process
from rltldr_jax.host import HOSTS_FILE, record_start
from rltldr_jax.settings import Logging, Settings, as_dict
from rltldr_jax.train.summary import SummaryWriter

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
#: `{workdir}/wandb_run.json`: {"id": the W&B run id, "project": its project}, read back by a resumed run.
WANDB_RUN_FILE = "wandb_run.json"
#: The W&B names of the x-axes: (step, token count, walltime seconds); None = not logged.
RL_AXES: tuple[str | None, ...] = ("env_steps", "tokens", "walltime_s")
SFT_AXES: tuple[str | None, ...] = ("optimizer_steps", None, "walltime_s")
WANDB_MISSING = (
    "logging.wandb=True needs the wandb package, which is not installed: pip install -e '.[wandb]' "
    "(or set logging.wandb=False)"
)


class Logger(Protocol):
    """A destination of a run's scalars."""

    def scalars(self, values: Mapping[str, float], step: int, *, tokens: int, walltime: float) -> None:
        """Logs `values` (metric name → number) at `step` (environment steps; optimizer steps for SFT), `tokens`
        generated so far and `walltime` seconds since the run started."""
        ...

    def close(self, error: BaseException | None = None) -> None:
        """Flushes and closes; `error`: what ended the run, if it did not finish."""
        ...


def wandb_error(enabled: bool) -> str | None:
    """What is wrong with `logging.wandb=enabled`, None if nothing: the wandb package must be installed (checked
    without importing it)."""
    return WANDB_MISSING if enabled and importlib.util.find_spec("wandb") is None else None


def flat_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, bool | int | float | str]:
    """A nested config (`as_dict`) as dotted keys → bool, int, float or str (what TensorBoard's hparams take; any
    other value as its `str`)."""
    out: dict[str, bool | int | float | str] = {}
    for key, value in config.items():
        if isinstance(value, Mapping):
            out.update(flat_config(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value if isinstance(value, bool | int | float | str) else str(value)
    return out


def save_config(config: Settings, workdir: str) -> bool:
    """Writes every key of `config` to `{workdir}/config.json` (nested like the config, indented, strict JSON) unless
    the file already holds exactly that; returns whether it wrote. The file is replaced in one step."""
    text = strict_json.dumps(as_dict(config), indent=2, default=str) + "\n"
    path = os.path.join(workdir, CONFIG_FILE)
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            if f.read() == text:
                return False
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)
    return True


class TensorBoardLogger:
    """TensorBoard event files in `logdir` (train/summary.py's three x-axes), with `hparams` (flat key → value) as the
    run's hyperparameters. `resumed_at=(step, tokens, walltime)` of a resumed run purges what the stopped run logged
    after them."""

    def __init__(
        self,
        logdir: str,
        *,
        hparams: Mapping[str, bool | int | float | str] | None = None,
        resumed_at: tuple[int, int, float] | None = None,
        start_time: float | None = None,
        enabled: bool | None = None,
    ):
        self.writer = SummaryWriter(logdir, resumed_at=resumed_at, enabled=enabled)
        if hparams:
            self.writer.hparams(hparams, start_time=time.time() if start_time is None else start_time)

    def scalars(self, values: Mapping[str, float], step: int, *, tokens: int, walltime: float) -> None:
        self.writer.scalars(dict(values), step, tokens=tokens, walltime=walltime)

    def close(self, error: BaseException | None = None) -> None:
        self.writer.close()


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError:
        raise ImportError(WANDB_MISSING) from None
    return wandb


class WandbLogger:
    """One W&B run (module docstring), on process 0 only (elsewhere, or with `enabled=False`, nothing is imported
    and nothing logged).

    Args:
      settings: the `logging.*` settings.
      workdir: the run's workdir: the W&B run's name (its last component), where its id is kept, and where wandb
        writes its files unless `logging.wandb_dir` or $WANDB_DIR says otherwise.
      config: the run's config (nested), the W&B run's config.
      resume: continue the W&B run whose id `{workdir}/wandb_run.json` holds (a new run when there is none).
      axes: the W&B names of the step, token and walltime axes (`RL_AXES`, `SFT_AXES`); metrics are plotted against
        the first by default.
      job_type: W&B's job type ("rl", "sft").
    """

    def __init__(
        self,
        settings: Logging,
        workdir: str,
        config: Mapping[str, Any],
        *,
        resume: bool = False,
        axes: Sequence[str | None] = RL_AXES,
        job_type: str = "rl",
        enabled: bool | None = None,
    ):
        self._run: Any = None
        self._axes = tuple(axes)
        if not (is_main_process() if enabled is None else enabled):
            return
        wandb = _import_wandb()
        id_file = os.path.join(workdir, WANDB_RUN_FILE)
        run_id = None
        if resume and os.path.isfile(id_file):
            with open(id_file, encoding="utf-8") as f:
                run_id = json.load(f)["id"]
        directory = settings.wandb_dir or (None if os.environ.get("WANDB_DIR") else workdir)
        if directory:
            os.makedirs(directory, exist_ok=True)
        self._run = wandb.init(
            project=settings.wandb_project or os.environ.get("WANDB_PROJECT") or "rltldr",
            entity=settings.wandb_entity or None,
            group=settings.wandb_group or None,
            mode=settings.wandb_mode or None,
            dir=directory,
            id=run_id,
            resume="allow" if run_id else None,
            name=os.path.basename(os.path.normpath(workdir)),
            job_type=job_type,
            config=dict(config),
            allow_val_change=True,  # a resumed run's config may have changed keys (the trainer logs them)
            reinit="create_new",  # its own run, even if the calling program has one open
        )
        names = [a for a in self._axes if a is not None]
        for name in names:
            self._run.define_metric(name)
        self._run.define_metric("*", step_metric=names[0])
        with open(id_file, "w", encoding="utf-8") as f:
            f.write(strict_json.dumps({"id": self._run.id, "project": self._run.project}) + "\n")

    def scalars(self, values: Mapping[str, float], step: int, *, tokens: int, walltime: float) -> None:
        if self._run is None:
            return
        row = {k: float(v) for k, v in values.items()}
        for name, value in zip(self._axes, (step, tokens, walltime), strict=True):
            if name is not None:
                row[name] = value
        self._run.log(row)

    def close(self, error: BaseException | None = None) -> None:
        """Finishes the W&B run: finished, or failed when `error` ended it (a stop too: a resume continues it)."""
        if self._run is not None:
            run, self._run = self._run, None
            run.finish(exit_code=0 if error is None else 1)


class Loggers:
    """Several loggers as one: each gets every call; `close` closes them all, then raises the first error."""

    def __init__(self, loggers: Sequence[Logger]):
        self.loggers = list(loggers)

    def scalars(self, values: Mapping[str, float], step: int, *, tokens: int, walltime: float) -> None:
        for logger in self.loggers:
            logger.scalars(values, step, tokens=tokens, walltime=walltime)

    def close(self, error: BaseException | None = None) -> None:
        failure: BaseException | None = None
        for logger in self.loggers:
            try:
                logger.close(error)
            except Exception as e:  # noqa: BLE001 (the others are closed first)
                failure = failure or e
        if failure is not None:
            raise failure


def open_loggers(
    config: Settings,
    workdir: str,
    *,
    resume: bool = False,
    resumed_at: tuple[int, int, float] | None = None,
    start_time: float | None = None,
    axes: Sequence[str | None] = RL_AXES,
    enabled: bool | None = None,
) -> Loggers:
    """The run's loggers (module docstring): W&B when `config.logging.wandb` (opened first: if it fails, no event
    file is left behind), TensorBoard in `{workdir}/tb` with the config as hparams, then `{workdir}/config.json`
    saved and this start's machine appended to `{workdir}/hosts.jsonl`. Only process 0 writes, unless `enabled`
    says otherwise.

    Args:
      resume: a resumed run (continues its W&B run).
      resumed_at: (step, tokens, walltime) the resumed run restarts from: TensorBoard purges what came after.
      start_time: when the run started (seconds since the epoch; the hparams' start time).
      axes: `RL_AXES` or `SFT_AXES` (W&B's x-axes).
    """
    enabled = is_main_process() if enabled is None else enabled
    loggers: list[Logger] = []
    nested = as_dict(config)
    try:
        if config.logging.wandb:
            loggers.append(
                WandbLogger(
                    config.logging,
                    workdir,
                    strict_json.finite(nested),
                    resume=resume,
                    axes=axes,
                    job_type=config.mode,
                    enabled=enabled,
                )
            )
        loggers.append(
            TensorBoardLogger(
                os.path.join(workdir, "tb"),
                hparams=flat_config(nested),
                resumed_at=resumed_at,
                start_time=start_time,
                enabled=enabled,
            )
        )
        if enabled and save_config(config, workdir) and resume:
            log.info("%s rewritten with the resumed run's config", os.path.join(workdir, CONFIG_FILE))
        if enabled:
            changed = record_start(workdir, from_step=resumed_at[0] if resumed_at else 0)
            if changed and resume:
                log.warning(
                    "resumed on another kind of machine (%s): the run goes on, but from here it is not bit for bit "
                    "what an uninterrupted run would have computed (%s)",
                    "; ".join(changed),
                    os.path.join(workdir, HOSTS_FILE),
                )
    except BaseException as e:
        with contextlib.suppress(Exception):  # (the error that stopped the start is the one to see)
            Loggers(loggers).close(e)
        raise
    return Loggers(loggers)
