"""Progress bars of long steps (pretraining, a collection phase, an update, a training run), drawn by this process or
by the process that started it.

    b = progress.bar(total, progress.phase_label(phase), unit="attempt")   # update(n), set_description(s), close()

Labels are the log's (`phase_label`): "phase 4" for the collection whose line the trainer logs as "phase 4: ...",
"eval after phase 3", "evaluation" (before any training), "base checks".

Where the bars go:
- In a process on its own (a launcher on a terminal): tqdm bars on stderr, closed when their step ends. While a
  `Trainer` runs with bars, the package's log lines are written through them (`lines_through_bars`).
- In a worker process of a replication grid (`replication.driver.isolated` in a `Board.task`): the worker draws
  nothing. Its bars are sent as small messages over a pipe to the parent, which draws one line per worker: the
  worker's outermost open bar gives the count and the ETA (a training run's environment steps against its budget),
  its innermost the label, e.g. `grpo seed 0 · phase 4 update 2/8:  15%|▌  | 192/1920 [00:49<07:20, 3.9env step/s]`.
  The worker's stdout and stderr (log lines, warnings, whatever a library prints, a crash's last words) go through a
  second pipe to the parent, which prints each line above the bars (`tqdm.write`), prefixed by the worker's name.
  The parent's own lines (`Board.through`, and its console log handlers while the board is open) go the same way.

Why the parent draws: tqdm bars of several processes on one terminal overwrite each other (each process moves the
cursor by itself, not knowing where the others are), and a line printed by one process lands inside another's bar.
Fixed rows per job would still let one process's lines tear another's bar. One process owning the terminal, the
others reporting to it, stays readable with any number of jobs, and a worker that dies still has its output printed
(the parent reads the pipe until it closes).

Reporting never changes what a run computes: it counts, sends messages (nothing more once the parent is gone) and
draws; nothing is seeded, ordered or waited for by it.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import logging
import os
import selectors
import sys
import threading
import time
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from typing import IO, Any, Protocol

#: Seconds between two count messages of one of a worker's bars (its last count, and reaching its total, are always
#: sent).
REPORT_INTERVAL_S = 0.5
#: Seconds between two redraws of a worker's line while no message arrives (its elapsed time goes on).
REDRAW_S = 1.0
#: Seconds a worker's line waits, after the worker ended, for the rest of its output (a process it started may still
#: hold the pipe).
DRAIN_S = 5.0
#: Between a worker's name and its label or its output lines.
SEP = " · "


def phase_label(phase: int) -> str:
    """The label of a collection with phase tag `phase` (`Collector.collect`), as the log names it: training phase
    tags are 0-based and the trainer logs the phase after it as "phase {tag + 1}"; an evaluation's tag is
    `-1 - phase` ("eval after phase N", as its log line; "evaluation" before any training); the base checks' curves
    use `analysis.insight_curves.CURVE_PHASE`."""
    from rltldr_jax.analysis.insight_curves import CURVE_PHASE  # (not at import: the collector imports this module)

    if phase == CURVE_PHASE:
        return "base checks"
    if phase >= 0:
        return f"phase {phase + 1}"
    after = -1 - phase
    return f"eval after phase {after}" if after else "evaluation"


class Bar(Protocol):
    """What callers use of a bar (a tqdm bar has it)."""

    def update(self, n: int = 1) -> Any: ...

    def set_description(self, desc: str) -> Any: ...

    def close(self) -> Any: ...


def bar(total: int | None, desc: str, *, unit: str = "it", initial: int = 0) -> Bar:
    """A bar of `total` `unit`s (None: unknown) starting at `initial`: a tqdm bar on stderr (closed: gone), or in a
    grid's worker process (`attach`) a bar drawn by the parent."""
    if _SINK is not None:
        return _ReportedBar(_SINK, total, desc, unit, initial)
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit=unit, initial=initial, leave=False)


@contextlib.contextmanager
def lines_through_bars() -> Iterator[None]:
    """For the block, the console log handlers (those writing to stdout or stderr) write their lines through the
    tqdm bars of this process (`tqdm.write`), so a line never lands inside a bar. Nothing to do in a worker whose
    output goes to its parent (`attach`)."""
    if _SINK is not None:
        yield
        return
    with _through_bars((sys.stdout, sys.stderr)):
        yield


# -- the worker's side ---------------------------------------------------------------------------------------------


class _Sink:
    """A worker's messages to its parent's line (`ChildLine`): one connection, shared by every thread."""

    def __init__(self, connection: Connection):
        self._connection: Connection | None = connection
        self._lock = threading.Lock()
        self._ids = itertools.count()

    def new_id(self) -> int:
        with self._lock:
            return next(self._ids)

    def send(self, message: tuple) -> None:
        with self._lock:
            if self._connection is None:
                return
            try:
                self._connection.send(message)
            except OSError:  # the parent is gone: nothing more is reported (the run goes on)
                self._connection = None


#: Set in a worker process by `attach`: where its bars go.
_SINK: _Sink | None = None


def attach(events: Connection, output: Connection) -> None:
    """Called first in a worker process started for a `ChildLine` (`ChildLine.open` made the connections): its bars
    are reported on `events`, and its stdout and stderr (file descriptors 1 and 2: everything the process and the
    libraries it runs print) go to `output`."""
    global _SINK
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:
            stream.flush()
    os.dup2(output.fileno(), 1)
    os.dup2(output.fileno(), 2)
    output.close()
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(line_buffering=True)  # (a pipe is block-buffered: lines reach the parent as written)
    _SINK = _Sink(events)


class _ReportedBar:
    """A bar of a worker process: its changes are sent to the parent (at most every REPORT_INTERVAL_S for counts)."""

    def __init__(self, sink: _Sink, total: int | None, desc: str, unit: str, initial: int):
        self._sink, self._id = sink, sink.new_id()
        self.total, self.n = total, initial
        self._sent_n, self._sent_at, self._closed = initial, time.monotonic(), False
        sink.send(("open", self._id, desc, total, unit, initial))

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        reached = self.total is not None and self._sent_n < self.total <= self.n
        if reached or now - self._sent_at >= REPORT_INTERVAL_S:
            self._report(now)

    def _report(self, now: float) -> None:
        if self.n != self._sent_n:
            self._sink.send(("count", self._id, self.n))
            self._sent_n, self._sent_at = self.n, now

    def set_description(self, desc: str) -> None:
        self._sink.send(("label", self._id, desc))

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._report(time.monotonic())
            self._sink.send(("close", self._id))

    def __enter__(self) -> _ReportedBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- the parent's side ---------------------------------------------------------------------------------------------


class _ThroughBars(io.TextIOBase):
    """A text stream whose complete lines are written to `stream` through the tqdm bars (`tqdm.write`)."""

    def __init__(self, stream: IO[str]):
        self._stream, self._partial = stream, ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        from tqdm import tqdm

        *lines, self._partial = (self._partial + s).split("\n")
        for line in lines:
            tqdm.write(line, file=self._stream)
        return len(s)

    def flush(self) -> None:
        self._stream.flush()


@contextlib.contextmanager
def _through_bars(streams: tuple[IO[str] | None, ...]) -> Iterator[None]:
    """For the block, every log handler of this process that writes to one of `streams` writes through the bars."""
    loggers = [logging.getLogger()] + [
        logger for logger in list(logging.Logger.manager.loggerDict.values()) if isinstance(logger, logging.Logger)
    ]
    handlers = {
        id(h): h
        for logger in loggers
        for h in logger.handlers
        if isinstance(h, logging.StreamHandler)
        and not isinstance(h, logging.FileHandler)
        and any(h.stream is s for s in streams if s is not None)
    }
    swapped = [(h, h.stream) for h in handlers.values()]
    for h, stream in swapped:
        h.setStream(_ThroughBars(stream))
    try:
        yield
    finally:
        for h, stream in swapped:
            h.setStream(stream)


#: The thread's current `Board.task`: (board, name), or None.
_CURRENT = threading.local()


class Board:
    """The bars of a grid, drawn by the launcher: one of the whole (`total` pieces, e.g. runs; none if None) and one
    line per worker process running in a `task` (`ChildLine`), on `file` (default stderr; in a notebook, widgets:
    `tqdm.auto`), with every line written above them. A context manager: while it is open, this process's console
    log handlers write through the bars."""

    def __init__(self, file: IO[str] | None = None, *, total: int | None = None, desc: str = "grid", unit: str = "run"):
        if file is None:
            from tqdm.auto import tqdm
        else:
            from tqdm import tqdm

        self.tqdm_class: Any = tqdm
        self.file = file if file is not None else sys.stderr
        self._overall = None
        if total is not None:
            self._overall = tqdm(
                total=total, desc=desc, unit=unit, file=self.file, dynamic_ncols=True, miniters=1, mininterval=0
            )
        self._redirect: contextlib.ExitStack | None = None

    def __enter__(self) -> Board:
        self._redirect = contextlib.ExitStack()
        self._redirect.enter_context(_through_bars((sys.stdout, sys.stderr, self.file)))
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Leaves the whole's bar as it ended and puts the log handlers back."""
        if self._overall is not None:
            self._overall.close()
            self._overall = None
        if self._redirect is not None:
            self._redirect.close()
            self._redirect = None

    def write(self, line: str) -> None:
        """`line` above the bars."""
        from tqdm import tqdm

        tqdm.write(line, file=self.file)

    def through(self, echo: Callable[[str], None]) -> Callable[[str], None]:
        """`echo` (e.g. print) made to clear the bars before it writes and draw them again after."""
        from tqdm import tqdm

        def say(line: str) -> None:
            with tqdm.external_write_mode(file=self.file):
                echo(line)

        return say

    def advance(self, n: int = 1, note: str | None = None) -> None:
        """`n` more pieces of the whole done; `note` (e.g. "1 failed") shown after its count."""
        from tqdm import tqdm

        with tqdm.get_lock():
            if self._overall is not None:
                if note is not None:
                    self._overall.set_postfix_str(note, refresh=False)
                self._overall.update(n)

    @contextlib.contextmanager
    def task(self, name: str) -> Iterator[None]:
        """In the block, a worker process started by this thread (`child_line`) gets a line labelled `name`."""
        before = getattr(_CURRENT, "task", None)
        _CURRENT.task = (self, name)
        try:
            yield
        finally:
            _CURRENT.task = before


def child_line() -> ChildLine | None:
    """A line for a worker process this thread is about to start, inside a `Board.task`; None outside one."""
    current = getattr(_CURRENT, "task", None)
    return None if current is None else ChildLine(*current)


class ChildLine:
    """One worker process's line on a `Board`: `open` makes the worker's connections (give them to `attach` in the
    worker), `started` once the worker has them, `finish` when it has ended.

    Drawn: the worker's outermost open bar (count, total, rate, ETA) labelled with its innermost one; its output lines
    above the bars, prefixed by `name`."""

    _WAITING = "{desc} [{elapsed}]"
    _UNSIZED = "{desc}: {n_fmt} {unit} [{elapsed}, {rate_fmt}]"

    def __init__(self, board: Board, name: str):
        self.board, self.name = board, name
        self._bars: dict[int, list[Any]] = {}  # the worker's open bars by id, in opening order: [label, total, unit, n]
        self._outer: int | None = None
        self._seen = False
        self._closed = False
        self._broken = False  # (drawing failed: output lines are printed plainly)
        self._bar: Any = None
        self._ends: tuple[Connection, ...] = ()
        self._thread: threading.Thread | None = None

    def open(self, context: Any) -> tuple[Connection, Connection]:
        """Draws the line and starts reading; returns the worker's ends (events, output), made by the
        multiprocessing `context` (so that its processes can receive them)."""
        events, events_end = context.Pipe(duplex=False)
        output, output_end = context.Pipe(duplex=False)
        self._ends = (events_end, output_end)
        self._bar = self.board.tqdm_class(
            total=None,
            desc=f"{self.name}{SEP}starting",
            file=self.board.file,
            leave=False,
            dynamic_ncols=True,
            miniters=1,
            mininterval=0,
            bar_format=self._WAITING,
        )
        self._thread = threading.Thread(
            target=self._read, args=(events, output), name=f"progress of {self.name}", daemon=True
        )
        self._thread.start()
        return events_end, output_end

    def started(self) -> None:
        """The worker holds its ends: this process closes its copies (the line sees the end of the worker's output
        when the worker ends)."""
        for end in self._ends:
            end.close()
        self._ends = ()

    def finish(self) -> None:
        """After the worker ended: prints the rest of its output (waiting at most DRAIN_S) and removes the line."""
        self.started()
        if self._thread is not None:
            self._thread.join(DRAIN_S)
        from tqdm import tqdm

        with tqdm.get_lock():
            self._closed = True
            if self._bar is not None:
                self._bar.close()

    def _read(self, events: Connection, output: Connection) -> None:
        """Reads the worker's messages and output until it ends (both pipes closed), drawing as they come. A failure
        to draw stops the drawing, never the reading: a worker never waits on a full pipe."""
        selector = selectors.DefaultSelector()
        selector.register(events, selectors.EVENT_READ, "events")
        selector.register(output, selectors.EVENT_READ, "output")
        partial = b""
        try:
            while selector.get_map():
                ready = selector.select(timeout=REDRAW_S)
                if not ready:
                    self._drawing(self._draw)
                for key, _ in ready:
                    if key.data == "events":
                        try:
                            message = events.recv()
                        except (EOFError, OSError):
                            selector.unregister(events)
                            continue
                        self._drawing(self._on, message)
                    else:
                        try:
                            chunk = os.read(output.fileno(), 1 << 16)
                        except OSError:
                            chunk = b""
                        if not chunk:
                            selector.unregister(output)
                        *lines, partial = (partial + chunk).split(b"\n")
                        for line in lines:
                            self._print(line)
        finally:
            if partial:
                self._print(partial)
            selector.close()
            events.close()
            output.close()

    def _drawing(self, fn: Callable[..., None], *args: Any) -> None:
        """`fn(*args)`, a drawing step: the first failure stops the drawing (said in one warning)."""
        if self._broken:
            return
        try:
            fn(*args)
        except Exception as e:  # (drawing is not worth a stalled worker)
            self._stop_drawing(e)

    def _stop_drawing(self, error: Exception) -> None:
        self._broken = True
        logging.getLogger(__name__).warning(
            "the progress line of %s stopped drawing (%s: %s)", self.name, type(error).__name__, error
        )

    def _print(self, raw: bytes) -> None:
        """One line of the worker's output, as a terminal would have shown it (after its last carriage return)."""
        text = raw.decode("utf-8", errors="replace").rstrip().rsplit("\r", 1)[-1]
        if not text:
            return
        line = f"{self.name}{SEP}{text}"
        if not self._broken:
            try:
                self.board.write(line)
                return
            except Exception as e:
                self._stop_drawing(e)
        with contextlib.suppress(Exception):
            print(line, file=self.board.file, flush=True)

    def _on(self, message: tuple) -> None:
        kind, bar_id, *rest = message
        if kind == "open":
            self._bars[bar_id] = list(rest)
            self._seen = True
        elif kind == "count" and bar_id in self._bars:
            self._bars[bar_id][3] = rest[0]
        elif kind == "label" and bar_id in self._bars:
            self._bars[bar_id][0] = rest[0]
        elif kind == "close":
            self._bars.pop(bar_id, None)
        self._draw()

    def _draw(self) -> None:
        from tqdm import tqdm

        with tqdm.get_lock():
            if self._closed or self._bar is None:
                return
            b = self._bar
            if not self._bars:  # before the first step ("starting"), or between two (the time since one ended)
                b.bar_format = self._WAITING
                b.set_description_str(self.name if self._seen else f"{self.name}{SEP}starting", refresh=False)
                if self._outer is None:
                    b.refresh()
                else:
                    self._outer = None
                    b.reset()  # (draws)
                return
            bars = list(self._bars.items())
            (outer_id, (label, total, unit, n)), (inner_id, inner) = bars[0], bars[-1]
            if inner_id != outer_id:
                label = f"{inner[0]} {inner[3]}" + (f"/{inner[1]}" if inner[1] is not None else "")
            b.bar_format = None if total else self._UNSIZED
            b.set_description_str(f"{self.name}{SEP}{label}", refresh=False)
            if outer_id != self._outer:  # another step: its own count, rate and ETA
                self._outer = outer_id
                b.total, b.unit = total, unit
                b.reset(total)  # (draws: at 0 of the new total)
                b.n = b.last_print_n = b.initial = n
            elif n > b.n:
                b.update(n - b.n)  # (the rate, hence the ETA, follows the counts)
            b.refresh()
