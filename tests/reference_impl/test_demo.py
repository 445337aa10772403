"""``ump demo`` end to end: real processes on loopback, SIGKILLed and restarted mid-stream,
with the traffic captured and cross-checked with tshark (issue 3: "the key scenarios again over
real sockets on loopback ... zero disagreements")."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from wire.dissect import check_against_tshark, dissect_file
from wire.tshark import PortMap

STORE_PORT = 14667  # not the product default, so a store left running elsewhere cannot clash


@pytest.mark.oracle
def test_demo_delivers_everything_once_in_order_and_tshark_agrees(tmp_path: Path) -> None:
    work = tmp_path / "demo"
    pcap = tmp_path / "demo.pcap"
    result = subprocess.run(
        [sys.executable, "-m", "ump", "demo", "--messages", "900", "--workdir", str(work),
         "--store-port", str(STORE_PORT), "--capture", str(pcap)],
        capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS" in result.stdout
    rows = [json.loads(line) for line in (work / "deliveries.jsonl").read_text().splitlines()]
    assert [r["sqn"] for r in rows] == list(range(900))
    assert any(r["rx"] for r in rows)  # the restarted receiver recovered from the store
    ports = PortMap(store_ports=[STORE_PORT])
    reports = list(dissect_file(pcap, ports))
    labels = {o.label for r in reports for o in r.occurrences}
    assert {"PREG", "PREG-RESP", "SRI", "ACK", "RXREQ", "DATA"} <= labels
    assert all(r.status in ("um", "not-um") for r in reports)
    assert check_against_tshark(pcap, reports, ports) == []
