"""``ump captures``: generate UM persistence captures from scripted scenarios.

``ump captures list`` names the scenarios and the backend each gets by default;
``ump captures generate --scenario NAME --out PATH`` writes the capture and ``PATH.meta.json``
(scenario, port map, expected counts).  The capture needs the store port as a decode hint:
``ump dissect PATH --store-port 14567`` (the command prints the exact hint).

``--backend``: ``auto`` (default) plays a scenario with the reference implementation's cores
(``cores``, :mod:`captures.cores`) when they support all of it (LBT-TCP sources, no loss: the
``tcp-*`` presets) and with the scripted ``wire`` backend otherwise (LBT-RM/LBT-RU, loss and
repair, and the huge fast captures: ~20x the cores' frame rate).  ``--backend cores
--lbttcp-fallback`` plays any scenario with the cores, over LBT-TCP and without loss.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from .scenarios import PRESETS, ScenarioError


def _count(minimum: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
        return value
    return parse


def _port(text: str) -> int:
    value = _count(1)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"port {value} out of range")
    return int(value)


def register(sub: Any) -> None:
    p = sub.add_parser(
        "captures", help="generate UM persistence captures from scripted scenarios",
        description="Generate pcap/pcapng captures of persistent UM traffic (topic resolution, "
                    "registrations, data, ACKs, recovery, restarts) with a JSON sidecar of "
                    "the expected analysis results.")
    commands = p.add_subparsers(dest="captures_command", metavar="COMMAND")
    p.set_defaults(handler=lambda _args: _help(p))

    g = commands.add_parser(
        "generate", help="write one scenario as a capture",
        description="Write a scenario as a capture plus OUT.meta.json.  --packets N writes "
                    "exactly N frames (the run is cut like tcpdump -c); --messages N sends "
                    "N messages and ends the run in order.")
    g.add_argument("--scenario", required=True, metavar="NAME",
                   help=f"one of: {', '.join(PRESETS)}")
    size = g.add_mutually_exclusive_group()
    size.add_argument("--packets", type=_count(1), metavar="N",
                      help="exactly N frames (accepts 10_000_000)")
    size.add_argument("--messages", type=_count(0), metavar="N",
                      help="N application messages over all topics")
    g.add_argument("--seed", type=int, default=0, help="same seed, same bytes (default 0)")
    g.add_argument("--format", choices=("pcap", "pcapng"), default=None,
                   help="file format (default: the scenario's, pcap for the presets)")
    g.add_argument("--nanosecond", action="store_true", help="nanosecond timestamps")
    g.add_argument("--big-endian", action="store_true",
                   help="big-endian file headers (packets are network order regardless)")
    g.add_argument("--store-port", type=_port, metavar="PORT",
                   help="TCP port of the stores (default 14567)")
    g.add_argument("--backend", choices=("auto", "cores", "wire"), default="auto",
                   help="who plays the scenario: the reference cores, the scripted wire model, "
                        "or auto (default: cores when they support the whole scenario, i.e. "
                        "LBT-TCP sources without loss, else wire)")
    g.add_argument("--lbttcp-fallback", action="store_true",
                   help="with --backend cores: play LBT-RM/LBT-RU sources over LBT-TCP and "
                        "ignore transport loss instead of refusing the scenario")
    g.add_argument("--no-progress", action="store_true", help="never show a progress bar")
    g.add_argument("--out", required=True, type=Path, metavar="PATH", help="capture to write")
    g.set_defaults(handler=run_generate)

    ls = commands.add_parser("list", help="name and describe the scenarios")
    ls.set_defaults(handler=run_list)


def _help(parser: argparse.ArgumentParser) -> int:
    parser.print_help(sys.stderr)
    return 2


def run_list(args: argparse.Namespace) -> int:
    from .generator import select_backend

    for name, scenario in PRESETS.items():
        transports = "/".join(dict.fromkeys(str(t) for t in scenario.transports))
        backend = select_backend("auto", scenario).name
        print(f"{name:12s} {scenario.sources} src x {scenario.topics_per_source} topics, "
              f"{scenario.receivers} rcv, stores {list(scenario.store_groups)}, {transports}, "
              f"{scenario.messages} msgs, backend {backend}")
        print(f"{'':12s} {scenario.description}")
    return 0


def run_generate(args: argparse.Namespace) -> int:
    import dataclasses

    from .generator import CaptureFormat, generate, select_backend
    from .scenarios import preset

    try:
        scenario = preset(args.scenario)
        if args.store_port is not None:
            scenario = dataclasses.replace(scenario, store_port=args.store_port).validate()
        if args.lbttcp_fallback and args.backend != "cores":
            raise ScenarioError("--lbttcp-fallback only applies to --backend cores")
        backend = select_backend(args.backend, scenario, lbttcp_fallback=args.lbttcp_fallback)
    except ScenarioError as exc:
        print(f"ump captures generate: {exc}", file=sys.stderr)
        return 2
    out: Path = args.out
    if out.is_dir():
        print(f"ump captures generate: {out} is a directory", file=sys.stderr)
        return 2
    if not out.parent.is_dir():
        print(f"ump captures generate: {out.parent}: no such directory", file=sys.stderr)
        return 2
    fmt = CaptureFormat(
        pcapng=scenario.pcapng if args.format is None else args.format == "pcapng",
        nanosecond=args.nanosecond or scenario.nanosecond,
        big_endian=args.big_endian or scenario.big_endian)
    try:
        result = generate(scenario, out, seed=args.seed, packets=args.packets,
                          messages=args.messages, fmt=fmt, backend=backend,
                          progress=False if args.no_progress else None)
    except ScenarioError as exc:
        print(f"ump captures generate: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"ump captures generate: {out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    rate = result.frames / result.seconds if result.seconds > 0 else 0.0
    print(f"{result.path}: {result.frames} frames, {result.messages} messages "
          f"({result.seconds:.2f} s, {rate:,.0f} frames/s, backend {backend.name})")
    for note in [*result.meta.get("substitutions", []), *result.meta.get("notes", [])]:
        print(f"note: {note}")
    print(f"{result.sidecar}: expected counts")
    print(f"decode with: ump dissect {result.path} --store-port {scenario.store_port}")
    return 0
