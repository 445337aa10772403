"""Passive judging at scale, end to end, against tshark's lightest pass:
``python -m benchmarks.judge [--frames N ...] [--decode D ...] [--no-tshark] [--json PATH]``.

Issue 21 asks for a 1,000,000-frame capture judged in at most 30 s on the 2-core machine, and
for the same verdicts in this process and in Spark.  Each capture is judged by ``ump conform
--capture CAPTURE --decode D`` started as a subprocess, as a user runs it (a new interpreter;
for ``spark`` a new JVM and its Python workers; results.json, JUnit, HTML and the evidence
pages written), the clock running from its start to its exit, with the process tree's peak
memory sampled as :mod:`benchmarks.analyze` does (RSS and PSS).  Decoders, by default:

* ``columnar``: ump analyze's columnar decode in the ``ump conform`` process (what ``--decode
  auto`` picks for these sizes);
* ``spark``: the same decode in Spark (a local session), the judges' tables collected.

In the same run tshark makes its lightest pass over the same file (``tshark -r CAPTURE -n
-T fields -e frame.number`` with the capture's port map), the cheapest thing it does with
every frame; the ratio is ours over tshark's.  The captures are 100,000 and 1,000,000 frames
of the generator's ``big`` scenario (cached with ``benchmarks.spark``'s, ``--cache``), the
100,000 the first frames of the 1,000,000.

The verdicts of every decoder on a capture are compared (case, verdict, message): a figure
for a different result is no figure, and the run fails (exit status 1).  The target is
reported, never enforced.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks.analyze import Capture, Measured, _capture, measure, run_tshark
from benchmarks.spark import default_cache, ensure_capture, first_frames

DEFAULT_FRAMES = (100_000, 1_000_000)
DEFAULT_DECODERS = ("columnar", "spark")
TARGETS = {1_000_000: 30.0}
"""Issue 21's target on the 2-core machine: frames -> wall seconds of the in-process run."""


def judge(capture: Path, port_args: list[str], decoder: str, out: Path) -> Measured:
    argv = [sys.executable, "-m", "ump", "conform", "--capture", str(capture), *port_args,
            "--decode", decoder, "--out", str(out)]
    return measure(argv, cwd=Path(__file__).resolve().parents[2])


def _verdicts(out: Path) -> list[tuple[str, str, str]]:
    doc = json.loads((out / "results.json").read_text())
    return [(c["id"], c["verdict"], c["message"]) for c in doc["cases"]]


def _mib(n: int) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def bench(frames: int, decoders: list[str], tshark: bool, cache: Path,
          seed: int) -> dict[str, Any]:
    big, _ = ensure_capture(cache, max(frames, 1_000_000), seed)
    path = big if frames >= 1_000_000 else first_frames(big, frames)
    meta = _capture("", big)  # the port options of the generator's sidecar
    row: dict[str, Any] = {"frames": frames, "capture": str(path)}
    verdicts: dict[str, list[tuple[str, str, str]]] = {}
    with tempfile.TemporaryDirectory(prefix="judge-bench-") as tmp:
        for decoder in decoders:
            out = Path(tmp) / decoder
            run = judge(path, meta.analyze_args, decoder, out)
            if run.returncode not in (0, 1):
                raise RuntimeError(f"ump conform --decode {decoder} exited with "
                                   f"{run.returncode}: {run.stderr.strip()[-500:]}")
            verdicts[decoder] = _verdicts(out)
            row[decoder] = {"seconds": run.seconds, "cpu_seconds": run.cpu_seconds,
                            "peak_rss": run.peak_rss, "peak_pss": run.peak_pss,
                            "verdicts": len(verdicts[decoder])}
    if tshark:
        shark = run_tshark(Capture("", path, meta.analyze_args, meta.tshark_args))
        if shark.returncode != 0:
            raise RuntimeError(f"tshark exited with {shark.returncode}: {shark.stderr[-500:]}")
        row["tshark"] = {"seconds": shark.seconds, "peak_rss": shark.peak_rss,
                         "frames": int(shark.stdout)}
    first = next(iter(verdicts.values()), [])
    row["same_verdicts"] = all(v == first for v in verdicts.values())
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.judge",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--frames", type=int, action="append",
                        help="capture sizes (repeatable; default 100,000 and 1,000,000)")
    parser.add_argument("--decode", action="append", choices=("frames", "columnar", "spark"),
                        help="decoders to time (repeatable; default columnar and spark)")
    parser.add_argument("--no-tshark", action="store_true", help="skip tshark's pass")
    parser.add_argument("--cache", type=Path, default=default_cache(),
                        help="where generated captures are kept (default %(default)s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    decoders = args.decode or list(DEFAULT_DECODERS)
    rows = []
    print(f"{'frames':>10}  {'decode':8} {'wall':>8} {'CPU':>8} {'peak RSS':>10} "
          f"{'peak PSS':>10} {'tshark':>8} {'ratio':>6}  target")
    failed = False
    for frames in args.frames or list(DEFAULT_FRAMES):
        try:
            row = bench(frames, decoders, not args.no_tshark, args.cache, args.seed)
        except (RuntimeError, OSError) as exc:
            print(f"benchmarks.judge: {exc}", file=sys.stderr)
            return 1
        rows.append(row)
        shark = row.get("tshark", {}).get("seconds")
        for decoder in decoders:
            r = row[decoder]
            ratio = f"{r['seconds'] / shark:6.2f}" if shark else "     -"
            target = TARGETS.get(frames) if decoder == "columnar" else None
            print(f"{frames:>10,}  {decoder:8} {r['seconds']:7.1f}s {r['cpu_seconds']:7.1f}s "
                  f"{_mib(r['peak_rss']):>10} {_mib(r['peak_pss']):>10} "
                  f"{(f'{shark:7.1f}s' if shark else '-'):>8} {ratio}  "
                  + (f"{target:.0f} s ({'met' if r['seconds'] <= target else 'missed'})"
                     if target else ""))
        if not row["same_verdicts"]:
            failed = True
            print(f"benchmarks.judge: {frames} frames: the decoders' verdicts differ",
                  file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 1 if failed else 0
