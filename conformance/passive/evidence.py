"""The evidence pages of a passive run: for every verdict that cites frames, a text page with
those frames dissected (``frames/<n>-<case>.txt`` in the run's output directory), which the
HTML report links to (:attr:`conformance.passive.judge.PassiveResult.page`).

Each page starts with the ``ump dissect --frames`` command that shows the same frames, so a
reader can go on from there (more fields, ``--json``, ``--check-tshark``).  The captures are
dissected once more here with the run's port map, keeping only the cited frames: the
observation (:mod:`conformance.passive.observe`) keeps the persistence exchange, not the
dissected frames.
"""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

from conformance.passive.judge import PassiveResult
from wire.dissect import Dissector, FrameReport, dissect_file, print_report
from wire.errors import WireError
from wire.pcap import read_capture
from wire.tshark import PortMap

PAGES = "frames"
"""The pages' directory inside the run's output directory."""


def frames_arg(frames: list[int]) -> str:
    """``[3, 4, 5, 9]`` -> ``"3-5,9"`` (``ump dissect --frames``'s syntax)."""
    runs: list[list[int]] = []
    for f in sorted(set(frames)):
        if runs and runs[-1][1] == f - 1:
            runs[-1][1] = f
        else:
            runs.append([f, f])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def dissect_command(captures: list[Path], frames: list[int], store_ports: list[int]) -> str:
    """The ``ump dissect`` command that shows ``frames`` of the (first) capture."""
    ports = f" --store-port {','.join(map(str, store_ports))}" if store_ports else ""
    name = shlex.quote(str(captures[0])) if captures else "CAPTURE"
    return f"ump dissect {name}{ports} --frames {frames_arg(frames)}"


ALONE_NOTE = ("# (a big capture: each frame dissected on its own, so an LBT-TCP segment shows "
              "the messages that start in it; the command above dissects the stream)\n")
"""What a page of frames dissected one by one says about LBT-TCP segments."""


def _cited_alone(path: Path, wanted: set[int], ports: PortMap,
                 content: bool) -> dict[int, FrameReport]:
    """The ``wanted`` frames of ``path``, each dissected by a fresh dissector: only those
    frames are decoded (dissecting every frame up to the last cited one took minutes on a
    million frames)."""
    kept: dict[int, FrameReport] = {}
    last = max(wanted)
    for record in read_capture(path):
        if record.number in wanted:
            kept[record.number] = Dissector(ports, content).frame(record)
        if record.number >= last:
            break
    return kept


def write_pages(results: list[PassiveResult], out: Path, ports: PortMap,
                content: bool = True, alone: bool = False) -> int:
    """Write a page per result that cites frames and set its :attr:`page`; returns how many.

    Several captures judged together are numbered each from 1 (:func:`~conformance.passive.
    observe.observe`), so a page shows each capture's frames of those numbers under its name.
    With ``alone`` (big captures) only the cited frames are dissected, each on its own
    (:data:`ALONE_NOTE`); else the captures are dissected in order up to the last cited frame,
    so LBT-TCP segments show their stream's messages.
    """
    cited = [r for r in results if r.decided_by]
    if not cited:
        return 0
    wanted = {f for r in cited for f in r.decided_by}
    frames: dict[Path, dict[int, FrameReport]] = {}
    for path in cited[0].captures:
        kept: dict[int, FrameReport] = {}
        try:
            if alone:
                kept = _cited_alone(path, wanted, ports, content)
            else:
                for report in dissect_file(path, ports, content):
                    if report.number in wanted:
                        kept[report.number] = report
                    if report.number >= max(wanted):
                        break
        except (WireError, OSError):
            pass  # a damaged end: what was read is shown (the run says so already)
        frames[path] = kept
    pages = out / PAGES
    pages.mkdir(parents=True, exist_ok=True)
    for i, r in enumerate(results):
        if not r.decided_by:
            continue
        name = f"{i}-{re.sub(r'[^A-Za-z0-9-]', '_', r.spec.id)}.txt"
        text = io.StringIO()
        text.write(f"# {r.spec.id} {r.verdict.value}: {r.message}\n")
        text.write(f"# {dissect_command(r.captures, r.decided_by, r.store_ports)}\n")
        if alone:
            text.write(ALONE_NOTE)
        for path, kept in frames.items():
            if len(frames) > 1:
                text.write(f"\n## {path}\n")
            for number in r.decided_by:
                found = kept.get(number)
                if found is None:
                    text.write(f"{number:>6} (not in the capture)\n")
                else:
                    print_report(found, text, verbose=True)
        (pages / name).write_text(text.getvalue())
        r.page = f"{PAGES}/{name}"
    return len(cited)
