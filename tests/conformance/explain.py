"""A failed evidence-against-tshark check that explains itself in a CI log.

The evidence pcaps live in temporary directories that are gone when a CI run is read, so a
disagreement is reported with each frame concerned as both sides see it: our status, ports and
labels, and tshark's protocol stack, TCP analysis flags and summary line."""

from __future__ import annotations

from pathlib import Path

from wire.dissect import Disagreement, FrameReport
from wire.tshark import PortMap
from wire.tshark import run as run_tshark


def explain(pcap: Path, ports: PortMap, reports: list[FrameReport],
            problems: list[Disagreement]) -> str:
    """Every disagreement, then the first five frames concerned, ours and tshark's."""
    numbers = sorted({p.frame for p in problems})[:5]
    ours = {r.number: r for r in reports}
    theirs = run_tshark(["-r", str(pcap), *ports.tshark_args(), "-Y",
                         " || ".join(f"frame.number == {n}" for n in numbers), "-T", "fields",
                         "-e", "frame.number", "-e", "frame.protocols", "-e", "tcp.stream",
                         "-e", "tcp.seq_raw", "-e", "tcp.analysis.flags", "-e", "_ws.col.Info"])
    lines = [f"{pcap.name}: {len(problems)} disagreement(s) with tshark ({ports})"]
    lines += [f"  {p}" for p in problems]
    for n in numbers:
        if n in ours:
            r = ours[n]
            lines.append(f"  ours frame {n}: {r.status} {r.transport} {r.src}:{r.sport} -> "
                         f"{r.dst}:{r.dport} {[o.label for o in r.occurrences]} {r.reason or ''}")
    lines += [f"  tshark: {line}" for line in theirs.splitlines()]
    return "\n".join(lines)
