"""Wall time of the whole conformance run, every suite, for every role, against 60 s.

Issue 5 asked for the registration + recovery run in under 60 seconds; issue 17 widens it to
the whole run (every suite) of every role - the reference store, source and receiver - and,
where that is over, runs cases in parallel (``ump conform --jobs N``) rather than shortening
timeouts.  Run::

    python -m benchmarks.conform [--jobs 2 --jobs 4] [--iut store --iut source ...]
                                 [--suite S ...] [--time-scale 1]

For every role it runs the selected cases serially and then with ``--jobs N`` (default: 2 and 4;
repeat ``--jobs`` to choose), each in a fresh temporary directory, and prints every wall time as
a ratio to the 60 s target (below 1 meets it), the speed-up over the serial run, and the sums
over the roles (the whole run of every role). It fails (exit code 1) when a run fails a case, or
when the parallel run's verdicts and messages differ from the serial run's: a figure for a
different result is no figure.

Why 4 on a two-core machine: a case spends most of its time waiting on protocol timers
(registration intervals, activity timeouts, stability lifetimes), not on the CPU, so four cases
at a time still finish inside their timeouts; the parallel run's results are checked to equal the
serial run's above.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from conformance.model import SUITES
from conformance.profile import BUILTIN_PROFILES, IutProfile, ProfileError, resolve_profile
from conformance.runner import RunResult, run

TARGET_SECONDS = 60.0
ROLES = ("store", "source", "receiver")
"""The built-in profiles timed by default: the reference implementation in every role."""


def _timed(profile: IutProfile, suites: list[str], time_scale: float, jobs: int) -> RunResult:
    with tempfile.TemporaryDirectory(prefix="conform-bench-") as tmp:
        return run(profile, Path(tmp), suites=suites, time_scale=time_scale, jobs=jobs)


def _outcome(result: RunResult) -> list[tuple[str, str, str]]:
    """What must not depend on ``--jobs``: each case's ID, verdict and message, in order."""
    return [(r.spec.id, r.verdict.value, r.message) for r in result.results]


def _cells(seconds: float, serial: float | None = None) -> str:
    cell = f"{seconds:7.1f} s  {seconds / TARGET_SECONDS:5.2f}"
    return cell + (f"  {serial / seconds if seconds else 0.0:5.2f}x" if serial else "")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.conform",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, action="append",
                        help="cases at a time for a parallel run (repeatable: one run per "
                             "value; default 2)")
    parser.add_argument("--iut", action="append", choices=sorted(BUILTIN_PROFILES),
                        help="a built-in profile to time (repeatable; default: store, source "
                             "and receiver)")
    parser.add_argument("--suite", action="append", choices=SUITES, default=[],
                        help="time only this suite (repeatable; default: every suite)")
    parser.add_argument("--time-scale", type=float, default=1.0)
    args = parser.parse_args(argv)
    jobs: list[int] = args.jobs or [2, 4]
    if any(j < 2 for j in jobs):
        parser.error("--jobs must be at least 2 (the serial run is always timed)")
    names = args.iut or list(ROLES)
    try:
        profiles = [resolve_profile(name) for name in names]
    except ProfileError as exc:
        parser.error(str(exc))
    rows: list[tuple[str, int, list[float]]] = []
    for profile in profiles:
        role = profile.role.value
        results: list[RunResult] = []
        for at_a_time in [1, *jobs]:
            result = _timed(profile, args.suite, args.time_scale, at_a_time)
            label = "serial" if at_a_time == 1 else f"--jobs {at_a_time}"
            counts = ", ".join(f"{n} {k}" for k, n in result.counts().items() if n)
            print(f"{role} {label}: {len(result.results)} cases in {result.seconds:.1f} s "
                  f"({counts})", flush=True)
            if result.exit_code != 0:
                print(f"the {profile.name} failed a case ({label}): the figure is not valid",
                      file=sys.stderr)
                return 1
            if results and _outcome(result) != _outcome(results[0]):
                differ = [a[0] for a, b in zip(_outcome(results[0]), _outcome(result),
                                               strict=True) if a != b]
                print(f"{role}: the {label} run's results differ from the serial run's "
                      f"({', '.join(differ[:5])}): the figure is not valid", file=sys.stderr)
                return 1
            results.append(result)
        rows.append((role, len(results[0].results), [r.seconds for r in results]))
    print()
    head = f"{'role':<9} {'cases':>5}  {'serial':>9}  {'ratio':>5}"
    for n in jobs:
        head += f"  {f'--jobs {n}':>9}  {'ratio':>5}  speed-up"
    print(f"{head}   (target {TARGET_SECONDS:.0f} s: a ratio below 1 meets it)")
    if len(rows) > 1:
        rows.append(("all roles", sum(r[1] for r in rows),
                     [sum(r[2][i] for r in rows) for i in range(len(jobs) + 1)]))
    for role, cases, times in rows:
        print(f"{role:<9} {cases:>5}  " + _cells(times[0])
              + "".join("  " + _cells(t, times[0]) for t in times[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
