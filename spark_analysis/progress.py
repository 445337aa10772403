"""Progress of ``ump analyze`` on stderr: a bar with percentage and ETA while Spark tasks run.

The decode is the one long step whose amount of work is known up front (one Spark task per
byte range of the capture), so it gets a bar; the analyses are one line each (printed by
:class:`spark_analysis.job.Progress`).  The bar is drawn only on a terminal: redrawn lines
(``\\r``) in a log file or a CI log are noise, so elsewhere the plain lines stay.

Where the numbers come from: the SparkContext's status tracker (``statusTracker()``), polled
from a thread every :data:`POLL_SECONDS`: tasks completed and running of every stage that ran
since the bar started.  A running task counts as half done (a task's own progress is not
known), which keeps the bar moving on a capture of a few tasks.  The ETA is the elapsed time
scaled by what is left (``elapsed * (1 - f) / f``), shown once a task has finished.  The
fraction never goes back: a later stage adds tasks, the bar then holds until it catches up.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO

POLL_SECONDS = 0.25
"""How often the bar asks Spark for task counts and redraws."""

BAR_WIDTH = 30
"""Characters of the bar itself."""

TaskCounter = Callable[[], tuple[float, int]]
"""Returns (tasks done, tasks known) so far; running tasks may count as fractions."""


def spark_task_counter(sc: Any) -> TaskCounter:
    """A :data:`TaskCounter` over the stages that run from now on (those already known to
    the tracker are left out: they belong to an earlier step)."""
    tracker = sc.statusTracker()
    before = set(tracker.getActiveStageIds())
    stages: dict[int, tuple[float, int]] = {}

    def count() -> tuple[float, int]:
        for stage in tracker.getActiveStageIds():
            if stage not in before:
                stages.setdefault(stage, (0.0, 0))
        for stage in list(stages):
            info = tracker.getStageInfo(stage)
            if info is not None:
                stages[stage] = (info.numCompletedTasks + 0.5 * info.numActiveTasks,
                                 info.numTasks)
        return (sum(done for done, _ in stages.values()),
                sum(total for _, total in stages.values()))

    return count


def _clock(seconds: float) -> str:
    whole = max(0, round(seconds))
    return f"{whole // 60}:{whole % 60:02d}"


def render_bar(prefix: str, fraction: float, elapsed: float) -> str:
    """One line of the bar: ``prefix [#####-----]  50%  ETA 0:07``."""
    fraction = min(max(fraction, 0.0), 1.0)
    filled = round(BAR_WIDTH * fraction)
    eta = (f"ETA {_clock(elapsed * (1 - fraction) / fraction)}" if 0 < fraction < 1
           else f"in {elapsed:.1f}s" if fraction >= 1 else "ETA ?")
    return f"{prefix} [{'#' * filled}{'-' * (BAR_WIDTH - filled)}] {fraction * 100:3.0f}%  {eta}"


@dataclass
class TaskBar:
    """A progress bar for a block of Spark work, redrawn in place on ``stream``.

    Use as a context manager; on exit the bar is drawn full (the block is done, whatever the
    last poll saw) and the line ended, so the next message starts on a line of its own."""

    prefix: str
    counter: TaskCounter
    stream: TextIO = field(default_factory=lambda: sys.stderr)
    poll: float = POLL_SECONDS
    clock: Callable[[], float] = time.monotonic
    fraction: float = 0.0
    _started: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _width: int = 0

    def update(self) -> None:
        """Ask for the task counts and redraw (the fraction only ever grows)."""
        try:
            done, total = self.counter()
        except Exception:  # the tracker is advisory: a failed poll keeps the last value
            return
        if total:
            self.fraction = max(self.fraction, min(done / total, 0.999))
        self._draw(render_bar(self.prefix, self.fraction, self.clock() - self._started))

    def _draw(self, line: str) -> None:
        pad = " " * max(0, self._width - len(line))
        self._width = len(line)
        self.stream.write("\r" + line + pad)
        self.stream.flush()

    def _run(self) -> None:
        while not self._stop.wait(self.poll):
            self.update()

    def __enter__(self) -> TaskBar:
        self._started = self.clock()
        self._draw(render_bar(self.prefix, 0.0, 0.0))
        self._thread = threading.Thread(target=self._run, name="ump-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc_type is None:
            self.fraction = 1.0
            self._draw(render_bar(self.prefix, 1.0, self.clock() - self._started))
        self.stream.write("\n")
        self.stream.flush()
