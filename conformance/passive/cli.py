"""``ump conform --capture FILE [FILE...]``: the passive run's options and main.

The port options are ``ump dissect``'s (:func:`wire.cli.add_port_options`): one port map
decides what is UM in every tool.  Store ports the capture's own TIRs and SRIs name are added
to it (:func:`conformance.passive.observe.observe`).  ``--source-config`` /
``--receiver-config`` give the deployment's UM configuration files and ``--store-config`` its
umestored XML, so configured limits (flight size, stability timeout, retransmission requests,
store keepalives and retransmission rate) are judged rather than reported.

Exit codes as an active run: 0 no MUST case failed, 1 one did, 2 bad options or a file that is
not a capture (one line on stderr, no traceback).
"""

from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from wire.cli import add_port_options, port_map


def add_capture_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("passive run (judge captured traffic; no IUT is started)")
    g.add_argument("--capture", nargs="+", type=Path, metavar="FILE", default=[],
                   help="pcap/pcapng captures to judge: every store, source and receiver in "
                        "them, against the requirements traffic can decide")
    g.add_argument("--source-config", type=Path, metavar="CFG",
                   help="the sources' UM configuration file (flat lbm.cfg): judge their "
                        "configured limits exactly")
    g.add_argument("--receiver-config", type=Path, metavar="CFG",
                   help="the receivers' UM configuration file (flat lbm.cfg)")
    g.add_argument("--store-config", type=Path, metavar="XML",
                   help="the stores' umestored XML: judge their configured limits "
                        "(keepalive-interval, retransmission-request-processing-rate) exactly; "
                        "a store is matched by its TCP port")
    g.add_argument("--no-content-heuristics", action="store_true",
                   help="find UM by port rules only, as tshark does (as on ump dissect)")
    g.add_argument("--decode", choices=DECODERS, default="auto",
                   help="how the capture is read: frames (ump dissect's dissector, frame by "
                        "frame), columnar (ump analyze's decode, in this process), spark "
                        "(ump analyze's decode in Spark); auto: by the captures' size, as "
                        "ump analyze decides (same verdicts every way)")
    g.add_argument("--spark", dest="decode", action="store_const", const="spark",
                   help="same as --decode spark")
    g.add_argument("--spark-master", metavar="URL",
                   help="Spark master for --decode spark (default: as ump analyze)")
    add_port_options(p)


DECODERS = ("auto", "frames", "columnar", "spark")


def choose_decoder(captures: list[Path], asked: str = "auto") -> str:
    """The decode ``--decode auto`` picks for ``captures``: frame by frame up to
    ``spark_analysis.job.DRIVER_DECODE_BYTES`` (where ``ump analyze`` too decodes in its
    own process: about 30,000 frames, a second), the columnar decode in this process up to
    ``spark_analysis.job.QUICK_TIER_BYTES`` (where ``ump analyze`` starts treating a capture
    as big; 1,000,000 frames are 142 MB and take about 2 GiB here), Spark beyond.  Without
    the ``spark`` extra (pyarrow) every capture is read frame by frame."""
    if asked != "auto":
        return asked
    try:
        from spark_analysis.job import DRIVER_DECODE_BYTES, QUICK_TIER_BYTES
    except ImportError:
        return "frames"
    size = sum(p.stat().st_size for p in captures)
    if size <= DRIVER_DECODE_BYTES:
        return "frames"
    return "columnar" if size <= QUICK_TIER_BYTES else "spark"


def main_capture(args: argparse.Namespace) -> int:
    from conformance.passive.evidence import write_pages
    from conformance.passive.judge import ACTIVE_ONLY, PassiveResult, passive_cases, run_passive
    from conformance.passive.observe import observe
    from conformance.report import write_all
    from conformance.runner import select
    from reference_impl.config.client import load_client_config
    from reference_impl.config.profiles import ConfigError
    from wire.errors import WireError

    for path in args.capture:
        if not path.is_file():
            print(f"ump conform: {path}: no such file", file=sys.stderr)
            return 2
    options: dict[str, Any] = {}
    for role in ("source", "receiver"):
        cfg = getattr(args, f"{role}_config")
        if cfg is None:
            continue
        try:
            options[role] = getattr(load_client_config(cfg), role)
        except ConfigError as exc:
            print(f"ump conform: {exc}", file=sys.stderr)
            return 2
    store_config = None
    if args.store_config is not None:
        from reference_impl.config.store_xml import load_store_config

        try:
            store_config = load_store_config(args.store_config)
        except (ConfigError, OSError) as exc:
            print(f"ump conform: {args.store_config}: {exc}", file=sys.stderr)
            return 2
    cases = select(passive_cases(), suites=args.suite, keywords=args.keywords)
    if not cases:
        print("ump conform: no case matches the selection", file=sys.stderr)
        return 2
    if args.list:
        for c in cases:
            how = "passive" if c.passive is not None else "active only"
            print(f"{c.id}  {c.strength.value:6} {how:11} {c.title}")
        return 0
    decoder = choose_decoder(args.capture, args.decode)
    content = not args.no_content_heuristics
    try:
        if decoder == "frames":
            obs = observe(args.capture, port_map(args), content=content)
        else:
            from conformance.passive.tables import observe_columnar

            decode = None
            if decoder == "spark":
                from conformance.passive.spark_tables import decode_tables_spark

                def decode(paths: Any, ports: Any, content: bool) -> Any:
                    return decode_tables_spark(paths, ports, content, master=args.spark_master)
            obs = observe_columnar(args.capture, port_map(args), content=content, decode=decode)
    except WireError as exc:
        print(f"ump conform: {exc.reason}", file=sys.stderr)
        return 2
    except OSError as exc:
        print(f"ump conform: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    # the observation lives until the end: a million objects the collector need not walk
    # again at every collection while the judges run (about a quarter of their time)
    gc.freeze()
    obs.source_options = options.get("source")
    obs.receiver_options = options.get("receiver")
    obs.store_config = store_config
    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    result = run_passive(obs, cases, out.absolute())
    write_pages([r for r in result.results if isinstance(r, PassiveResult)], out.absolute(),
                replace(port_map(args), store_ports=obs.store_ports), content=content,
                alone=decoder != "frames")
    print(f"ump conform: {len(args.capture)} capture(s) read by the {decoder} decode, "
          f"{obs.frames} frames ({obs.um_frames} "
          f"UM): {len(obs.stores)} store(s), {len(obs.clients('source'))} source(s), "
          f"{len(obs.clients('receiver'))} receiver(s)", file=sys.stderr)
    for note in obs.notes + obs.problems[:5]:
        print(f"ump conform: {note}", file=sys.stderr)
    shown = [r for r in result.results if r.message != ACTIVE_ONLY]
    width = max((len(r.spec.id) for r in shown), default=8)
    for r in shown:
        frames = getattr(r, "decided_by", [])
        cited = f" [frames {_frames(frames)}]" if frames else ""
        line = f"{r.spec.id:<{width}}  {r.verdict.value:<13} {r.message}{cited}"
        print(line, flush=True)
    active_only = len(result.results) - len(shown)
    paths = write_all(result)
    counts = ", ".join(f"{n} {k}" for k, n in result.counts().items() if n)
    print(f"ump conform: {counts} ({active_only} case(s) judged only actively); exit code "
          f"{result.exit_code}")
    print(f"ump conform: reports {', '.join(str(out / p.name) for p in paths.values())}")
    return result.exit_code


def _frames(frames: list[int], most: int = 8) -> str:
    shown = ", ".join(str(f) for f in frames[:most])
    return shown + (f" ... ({len(frames)} frames)" if len(frames) > most else "")
