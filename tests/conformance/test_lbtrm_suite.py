"""The lbt-rm suite against the reference source and receiver: every case passes on LBT-RM,
the harness's NAKs, NCFs, DATA and SMs really crossed the wire, and every evidence pcap
dissects the same in wire/ and tshark (decode-as for the case's own group port).

Multicast on loopback is set up by ``scripts/ensure-multicast`` first.  The mutants each case
catches are in ``tests/conformance/test_mutants.py``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from scapy.layers.inet import IP, UDP
from scapy.utils import rdpcap

from conformance.model import Role, all_cases
from wire import lbtrm
from wire.dissect import check_against_tshark, dissect_file
from wire.tshark import PortMap

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def multicast() -> None:
    subprocess.run([str(ROOT / "scripts" / "ensure-multicast")], check=True, timeout=60)


def _run(role: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    out = cwd / "out"
    cwd.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-m", "ump", "conform", "--iut", role, "--suite",
                           "lbt-rm", "--out", "out"], capture_output=True, text=True,
                          timeout=300, cwd=cwd)
    return proc, json.loads((out / "results.json").read_text())


def _lbtrm_ports(pcap: Path) -> tuple[list[int], list[str]]:
    """The UDP ports of the case's LBT-RM session (its group's port, the source's unicast
    port) and the types of the datagrams sent to them."""
    frames = [p for p in rdpcap(str(pcap)) if UDP in p]
    ports: set[int] = set()
    for p in frames:
        if p[IP].dst.startswith("239."):  # the case's own group (fresh_group)
            ports.add(p[UDP].dport)
            ports.add(lbtrm.parse_packet(bytes(p[UDP].payload), decode_lbmc=False).ucast_port)
    kinds = [type(lbtrm.parse_packet(bytes(p[UDP].payload), decode_lbmc=False)).__name__
             for p in frames if p[UDP].dport in ports]
    return sorted(ports), kinds


@pytest.mark.parametrize("role", ["source", "receiver"])
def test_every_lbtrm_case_passes_and_its_evidence_agrees_with_tshark(
        role: str, tmp_path: Path) -> None:
    proc, data = _run(role, tmp_path / "fresh")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = {c.id for c in all_cases(Role(role)) if c.suite == "lbt-rm"}
    assert len(expected) >= 3
    got = {c["id"]: (c["verdict"], c["transport"]) for c in data["cases"]}
    assert got == {i: ("pass", "lbt-rm") for i in expected}
    seen: set[str] = set()
    for case_id in sorted(expected):
        pcap = tmp_path / "fresh" / "out" / "cases" / case_id / "evidence.pcap"
        ports, kinds = _lbtrm_ports(pcap)
        assert ports, case_id
        seen |= set(kinds)
        portmap = PortMap(lbtrm_ports=ports)
        reports = list(dissect_file(pcap, portmap))
        assert check_against_tshark(pcap, reports, portmap) == [], case_id
    # the harness NAKed (source IUT) or was NAKed and sent an NCF (receiver IUT)
    assert {"LbtrmData", "LbtrmNak"} <= seen
    assert ("LbtrmSm" if role == "source" else "LbtrmNcf") in seen
