"""What every loopback capture test shares: starting the capture, and the tshark verdict.

A capture test runs real processes on loopback under :class:`LoopbackCapture`, keeps only its
own frames and then asks the oracle (tshark, docs/wire-lbmc.md §1) three things: every frame
our dissector reads is UM or not UM (never malformed), tshark shows every field with the value
we read, and tshark raises no error and no LBM/UME warning.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import pytest

from reference_impl.capture import CaptureError, LoopbackCapture, available_backends
from wire.dissect import FrameReport, check_against_tshark, dissect_file
from wire.tshark import PortMap, expert_summary


def start_capture(cap: LoopbackCapture) -> None:
    """Start ``cap``; skip only where capturing needs privileges this user lacks (under CI a
    skip fails the run, so a machine that cannot capture is noticed)."""
    if not available_backends():
        pytest.skip("no capture backend installed")
    try:
        cap.start()
    except CaptureError as exc:
        said = str(exc).lower()
        if os.geteuid() != 0 and ("permission" in said or "not permitted" in said):
            pytest.skip(f"capturing needs privileges here: {exc}")
        raise


def assert_tshark_agrees(pcap: Path, portmap: PortMap, *, pending: bool = False,
                         warned: Iterable[str] = ("LBM", "UME")) -> list[FrameReport]:
    """The oracle's verdict on ``pcap``; returns our dissector's reports for further checks.

    ``pending`` allows frames that hold only the start of a message another segment completes
    (a TCP segment of a long LBT-TCP fragment); ``warned`` are the words a tshark warning may
    not contain."""
    reports = list(dissect_file(pcap, portmap))
    fine = ("um", "not-um", "pending") if pending else ("um", "not-um")
    assert all(r.status in fine for r in reports), \
        [(r.number, r.status, r.reason) for r in reports if r.status not in fine]
    # this helper is not a test module: pytest does not rewrite its asserts, so each says what
    # it found
    disagreements = check_against_tshark(pcap, reports, portmap)
    assert disagreements == [], disagreements[:20]
    experts = expert_summary(pcap, portmap)
    assert "Errors" not in experts, experts
    words = tuple(warned)
    assert not [w for w in experts.get("Warns", []) if any(x in w for x in words)], experts
    return reports
