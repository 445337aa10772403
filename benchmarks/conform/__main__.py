from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from conformance.profile import BUILTIN_PROFILES, ProfileError, resolve_profile
from conformance.runner import run

TARGET_SECONDS = 60.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.conform")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--time-scale", type=float, default=1.0)
    parser.add_argument("--iut", default="store", choices=sorted(BUILTIN_PROFILES),
                        help="the built-in profile to time (default: the reference store)")
    args = parser.parse_args(argv)
    try:
        profile = resolve_profile(args.iut)
    except ProfileError as exc:
        parser.error(str(exc))
    best = float("inf")
    for i in range(args.repeat):
        with tempfile.TemporaryDirectory() as tmp:
            result = run(profile, Path(tmp), suites=["registration", "recovery"],
                         time_scale=args.time_scale)
        counts = ", ".join(f"{n} {k}" for k, n in result.counts().items() if n)
        print(f"run {i + 1}: {len(result.results)} cases in {result.seconds:.1f} s ({counts})")
        if result.exit_code != 0:
            print(f"the {profile.name} failed a case: the figure is not valid",
                  file=sys.stderr)
            return 1
        best = min(best, result.seconds)
    print(f"{profile.role.value} registration+recovery: best {best:.1f} s; "
          f"target {TARGET_SECONDS:.0f} s; ratio {best / TARGET_SECONDS:.2f} "
          f"(below 1 meets the target)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
