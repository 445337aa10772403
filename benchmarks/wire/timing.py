"""Single-core throughput measurement with :func:`time.perf_counter`.

A measurement calls one function in a tight loop, the way a hot loop would (the callable and
its arguments are bound to locals, iteration uses :func:`itertools.repeat` like :mod:`timeit`).
The iteration count is calibrated so that one run lasts about ``duration`` seconds; the run is
repeated ``repeat`` times and the best (fastest) run is kept, because slower runs only measure
interference from the rest of the machine.  The garbage collector is off while a run is timed,
as in :mod:`timeit`; loop overhead is *not* subtracted, so the figures are what a Python caller
really gets per call.
"""

from __future__ import annotations

import gc
import math
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat as _repeat
from time import perf_counter
from typing import Any

Runner = Callable[[int], float]


@dataclass(frozen=True)
class Rate:
    """The result of one measurement.

    Attributes:
        per_second: best observed calls per second (``iterations / fastest run``).
        iterations: calls per timed run.
        runs: the duration in seconds of every timed run.
    """

    per_second: float
    iterations: int
    runs: tuple[float, ...]

    @property
    def ns_per_call(self) -> float:
        return 1e9 / self.per_second

    def to_json(self) -> dict[str, Any]:
        return {
            "per_second": self.per_second,
            "ns_per_call": self.ns_per_call,
            "iterations": self.iterations,
            "runs_s": list(self.runs),
        }


def _runner(fn: Callable[..., Any], args: tuple[Any, ...]) -> Runner:
    """A function timing ``n`` calls of ``fn(*args)``, specialised by arity to keep the
    per-call overhead that of a plain call in a loop."""
    if len(args) == 0:
        def run(n: int) -> float:
            it = _repeat(None, n)
            t0 = perf_counter()
            for _ in it:
                fn()
            return perf_counter() - t0
    elif len(args) == 1:
        (a,) = args

        def run(n: int) -> float:
            it = _repeat(None, n)
            t0 = perf_counter()
            for _ in it:
                fn(a)
            return perf_counter() - t0
    elif len(args) == 2:
        a, b = args

        def run(n: int) -> float:
            it = _repeat(None, n)
            t0 = perf_counter()
            for _ in it:
                fn(a, b)
            return perf_counter() - t0
    else:
        def run(n: int) -> float:
            it = _repeat(None, n)
            t0 = perf_counter()
            for _ in it:
                fn(*args)
            return perf_counter() - t0
    return run


def _timed(run: Runner, n: int) -> float:
    enabled = gc.isenabled()
    gc.disable()
    try:
        return run(n)
    finally:
        if enabled:
            gc.enable()


def calibrate(run: Runner, duration: float) -> int:
    """The number of calls that makes one run last about ``duration`` seconds.

    Grows the count until a run takes at least a fifth of ``duration`` (and at least 1 ms or
    ``duration`` when that is shorter), then extrapolates.  This also warms up the code.
    """
    floor = min(max(duration / 5, 1e-3), duration)
    n = 1
    while True:
        elapsed = _timed(run, n)
        if elapsed >= floor or n >= 1 << 32:
            break
        if elapsed <= 0:
            n *= 10
        else:
            n = max(n * 2, math.ceil(n * floor * 1.5 / elapsed))
    return max(1, round(n * duration / max(elapsed, 1e-9)))


def measure(fn: Callable[..., Any], *args: Any, duration: float = 0.1, repeat: int = 3) -> Rate:
    """Calls per second of ``fn(*args)`` on one core: calibrated, repeated, best run kept."""
    run = _runner(fn, args)
    n = calibrate(run, duration)
    runs = tuple(_timed(run, n) for _ in range(max(1, repeat)))
    best = max(min(runs), 1e-12)
    return Rate(per_second=n / best, iterations=n, runs=runs)
