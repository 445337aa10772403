"""``ump conform``: run the conformance suites against an IUT and write the reports.

Examples::

    ump conform                                   # the reference store, every suite
    ump conform --iut source                      # the reference source (or: receiver)
    ump conform --iut acme-store.toml --suite registration --out conform-out
    ump conform --iut acme-store.toml -k "REG-STORE-00 and not collision" --time-scale 3
    ump conform --jobs 2                          # two cases at a time (same reports)
    ump conform --transport lbt-rm                # the harness's sources send on LBT-RM
    ump conform --transport all --suite recovery  # each store case on LBT-TCP, -RU and -RM
    ump conform --list                            # the cases, with their requirements
    ump conform --capture prod.pcap --store-port 14567   # judge a capture (passive)

``--jobs N`` runs N cases at a time, each with its own IUT process, resolver and share of the
preferred ports; the reports and printed lines are those of a serial run, in case order.  The
default is 1 (serial: what a slow or single-instance IUT expects); 2 suits a two-core machine.

``--capture FILE [FILE...]`` judges captured traffic instead of an IUT: every store, source and
receiver in the captures against the requirements traffic can decide (the same cases, judged
passively; see :mod:`conformance.passive`), with ``ump dissect``'s port options.

``--transport {tcp,lbt-ru,lbt-rm,all}`` (default: the profile's ``transport``, else ``tcp``): the
transport the harness's sources send their data on to a store IUT; ``all`` runs every store
case on each of the three in turn (one report, each case's transport shown; the evidence of
LBT-RU and LBT-RM runs is ``<out>/cases/<ID>.<transport>/``).  Source and receiver cases run
on LBT-TCP (on another transport they are ``unsupported``); the ``lbt-rm`` suite's cases are
about LBT-RM and run on it whatever the option says.

Exit code 0 when no MUST case failed or errored (and no known failure passed), 1 otherwise,
2 for a bad profile or bad options.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from conformance.model import SUITES, CaseSpec, Role, Verdict, all_cases
from conformance.udp_transport import LABELS, TRANSPORTS


def _scale(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.1 <= value <= 100:
        raise argparse.ArgumentTypeError("the time scale must be between 0.1 and 100")
    return value


def _jobs(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= 64:
        raise argparse.ArgumentTypeError("the number of jobs must be between 1 and 64")
    return value


def register(sub: Any) -> None:
    p = sub.add_parser("conform", help="run conformance suites against a store, source or "
                                       "receiver and report a verdict per case",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iut", metavar="PROFILE.toml",
                   help="IUT profile file, or a built-in name: default/store, source, "
                        "receiver (the reference implementation); default: the reference "
                        "store")
    p.add_argument("--suite", action="append", choices=SUITES, default=[],
                   help="run only this suite (repeatable)")
    p.add_argument("-k", dest="keywords", action="append", default=[], metavar="EXPR",
                   help="only cases whose ID/title/suite match (words, 'not', 'and', 'or')")
    p.add_argument("--out", type=Path, default=Path("conform-out"),
                   help="directory for reports and evidence (default ./conform-out)")
    p.add_argument("--time-scale", type=_scale, default=1.0, metavar="X",
                   help="multiply every timeout by X for slow IUTs or machines (default 1)")
    p.add_argument("--jobs", "-j", type=_jobs, default=1, metavar="N",
                   help="run N cases at a time, each with its own IUT and ports; same "
                        "reports, in case order (default 1; 2 suits a two-core machine)")
    p.add_argument("--transport", choices=(*TRANSPORTS, "all"), default=None,
                   help="what the harness's sources send on to a store IUT: tcp (LBT-TCP), "
                        "lbt-ru, lbt-rm, or all three in turn (default: the profile's "
                        "transport, else tcp)")
    p.add_argument("--list", action="store_true", help="list the selected cases and exit")
    from conformance.passive.cli import add_capture_options

    add_capture_options(p)
    p.set_defaults(handler=main)


def _run_transports(run: Any, profile: Any, args: argparse.Namespace, cases: list[CaseSpec],
                    transport: str, progress: Any) -> Any:
    """Run ``cases`` on ``transport``, or (``all``) every case on LBT-TCP and then the store
    cases that are not about one transport on LBT-RU and on LBT-RM: one result, in that
    order."""
    if transport != "all":
        return run(profile, args.out, cases=cases, time_scale=args.time_scale,
                   progress=progress, jobs=args.jobs, transport=transport)
    total = None
    for kind in TRANSPORTS:
        chosen = cases if kind == "tcp" else \
            [c for c in cases if c.role is Role.STORE and c.transport is None]
        if not chosen:
            continue
        print(f"ump conform: {len(chosen)} cases on {LABELS[kind]}", file=sys.stderr)
        part = run(profile, args.out, cases=chosen, time_scale=args.time_scale,
                   progress=progress, jobs=args.jobs, transport=kind)
        if total is None:
            total = part
        else:
            total.results.extend(part.results)
            total.seconds += part.seconds
    return total


def main(args: argparse.Namespace) -> int:
    from conformance.profile import ProfileError, resolve_profile
    from conformance.runner import run, select

    if args.capture:  # passive: judge the captures, no IUT
        from conformance.passive.cli import main_capture

        return main_capture(args)
    try:
        profile = resolve_profile(args.iut)
    except ProfileError as exc:
        print(f"ump conform: {exc}", file=sys.stderr)
        return 2
    # the cases of the IUT's role: the others could only end "unsupported"
    cases = select(all_cases(profile.role), suites=args.suite, keywords=args.keywords)
    if not cases:
        print("ump conform: no case matches the selection", file=sys.stderr)
        return 2
    if args.list:
        for c in cases:
            print(f"{c.id}  {c.strength.value:6} {c.suite:12} {c.title}\n"
                  f"    [{c.section}] {c.requirement}")
        return 0
    width = max(len(c.id) for c in cases)
    print(f"ump conform: {len(cases)} cases against {profile.name} ({profile.role.value}); "
          f"evidence in {args.out}"
          + (f"; {args.jobs} at a time" if args.jobs > 1 and profile.address is None
             else ""), file=sys.stderr)
    if args.jobs > 1 and profile.address is not None:
        print("ump conform: --jobs ignored: the store IUT is reached at an address (one "
              "process, one resolver), so its cases run one at a time", file=sys.stderr)

    def progress(r: Any) -> None:
        mark = "" if not r.known_failure else f" (known failure {r.known_failure})"
        line = f"{r.spec.id:<{width}}  {r.verdict.value:<13} {r.seconds:6.2f} s  {r.spec.title}"
        if r.verdict is not Verdict.PASS and r.message:
            line += f"\n{'':<{width}}  └ {r.message}"
        print(line + mark, flush=True)

    from conformance.report import write_all

    chosen = args.transport or profile.transport
    try:
        result = _run_transports(run, profile, args, cases, chosen, progress)
    except OSError as exc:
        print(f"ump conform: {exc}", file=sys.stderr)
        return 2
    paths = write_all(result)
    counts = ", ".join(f"{n} {k}" for k, n in result.counts().items() if n)
    print(f"ump conform: {counts} in {result.seconds:.1f} s; exit code {result.exit_code}")
    # named as the user named the directory (the run itself works with its absolute path)
    shown = {k: args.out / p.relative_to(result.out) for k, p in paths.items()}
    print(f"ump conform: reports {shown['html']}, {shown['junit']}, {shown['json']}")
    return result.exit_code
