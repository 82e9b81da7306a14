"""Stopping a run cleanly on SIGTERM and SIGINT (cluster preemption, a scheduler's time limit, Ctrl-C).

    with StopSignals(defer=True) as signals:   # main thread; the previous handlers come back on exit
        while ...:
            ...                                 # one unit of work (a phase)
            if signals.requested:               # a safe point: save, then stop
                save()
                raise RunStopped(signals.requested, "stopped by SIGTERM at phase 3; checkpoint saved; ...")

SIGTERM is how SLURM (at the time limit, on preemption, and with `--signal=TERM@<seconds>`), Kubernetes and most batch
schedulers ask a job to end before they kill it; SIGINT is Ctrl-C. Under `StopSignals(defer=True)` the first signal
is recorded (`requested`, with one warning line) and the work in progress goes on to the next safe point; a second
signal raises `Interrupted` at once. Under `StopSignals(defer=False)` (the launchers, around everything else) the
first signal raises `Interrupted` at once. Python drops an exception raised where it cannot propagate (a garbage
collector callback, such as JAX's, or a `__del__`: "Exception ignored in ..."): there the signal is sent again, so
it is never lost. Signals the process ignores (e.g. SIGINT of a job started with `&` by a
shell) stay ignored, and outside the main thread nothing is installed (Python delivers signals there only).

`Interrupted` derives from KeyboardInterrupt, so `except Exception` blocks do not swallow it. Its `exit_status` is
128 + the signal's number (143 for SIGTERM, 130 for SIGINT), the shell's convention for a process ended by a
signal, so a scheduler sees that the run was interrupted (and may requeue it).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)

#: The signals that stop a run.
SIGNALS = (signal.SIGTERM, signal.SIGINT)


def signal_name(signum: int) -> str:
    """The signal's name: SIGTERM, SIGINT, ... (or "signal N")."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Interrupted(KeyboardInterrupt):
    """The process was asked to stop by signal `signum`; `str()` is the one line to show, `exit_status` 128 + signum.

    Raised at once by a signal handler (`StopSignals`): nothing is saved beyond what already was.
    """

    def __init__(self, signum: int, message: str = ""):
        super().__init__(signum, message)
        self.signum = signum
        self.message = message or f"interrupted by {signal_name(signum)}"

    @property
    def exit_status(self) -> int:
        return 128 + self.signum

    def __str__(self) -> str:
        return self.message


class RunStopped(Interrupted):
    """A run stopped at a safe point on signal `signum`, after writing a checkpoint (the message says which)."""


class StopSignals:
    """Handles SIGTERM and SIGINT while active (a context manager; see the module docstring).

    Args:
      defer: record the first signal for the caller's next safe point (`requested`) instead of raising at once.
      quiet_abort: when a signal raises `Interrupted`, silence logging below CRITICAL first, so that what the
        interrupted threads (engines, collection) report as they are torn down does not bury the one line the
        launcher prints. A nested `StopSignals` inherits it from the one it replaces. Launchers only: it is a
        process-wide setting.
    """

    def __init__(self, *, defer: bool, quiet_abort: bool = False):
        self.defer = defer
        self.quiet_abort = quiet_abort
        self.requested: int | None = None  # the first signal's number once one arrived (defer=True)
        self._previous: dict[int, Any] = {}
        self._unraisablehook: Any = None
        self._resending = False  # `_unraisable` is sending a dropped signal again
        self._resent: int | None = None

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        for signum in SIGNALS:
            previous = signal.getsignal(signum)
            if previous is signal.SIG_IGN:
                continue
            outer = getattr(previous, "__self__", None)
            if isinstance(outer, StopSignals):
                self.quiet_abort = self.quiet_abort or outer.quiet_abort
            self._previous[signum] = previous
            signal.signal(signum, self._handle)
        self._unraisablehook, sys.unraisablehook = sys.unraisablehook, self._unraisable
        return self

    def __exit__(self, *exc: object) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        self._previous.clear()
        if self._unraisablehook is not None:
            sys.unraisablehook, self._unraisablehook = self._unraisablehook, None

    def _unraisable(self, unraisable: Any) -> None:
        """`sys.unraisablehook`: an `Interrupted` Python had to drop is raised again (its signal is sent to the main
        thread again, from another thread, once this hook has returned); anything else goes to the previous hook."""
        error = unraisable.exc_value
        if not isinstance(error, Interrupted):
            self._unraisablehook(unraisable)
            return
        main = threading.main_thread().ident
        while True:
            self._resent = None
            self._resending = True
            try:
                threading.Timer(0.01, signal.pthread_kill, (main, error.signum)).start()
            finally:
                self._resending = False
            if self._resent is None:
                return
            # (the signal came back before this hook returned: send it once more)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._resending:  # an exception raised now would be dropped again: `_unraisable` sends it once more
            self._resent = signum
            return
        if self.defer and self.requested is None:
            self.requested = signum
            log.warning(
                "%s received: stopping at the next safe point, with a checkpoint (send it again to stop at once)",
                signal_name(signum),
            )
            return
        if self.quiet_abort:
            logging.disable(logging.ERROR)
        raise Interrupted(signum)
