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
    # one after the other in one test: both demos use the resolver's fixed port 15380
    for transport in ("tcp", "lbt-ru"):
        _demo(tmp_path / transport, transport)


def _demo(tmp_path: Path, transport: str) -> None:
    tmp_path.mkdir()
    work = tmp_path / "demo"
    pcap = tmp_path / "demo.pcap"
    result = subprocess.run(
        [sys.executable, "-m", "ump", "demo", "--messages", "900", "--workdir", str(work),
         "--store-port", str(STORE_PORT), "--capture", str(pcap), "--transport", transport],
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
    lbtru_frames = [r for r in reports if r.transport == "lbtru"]
    if transport == "lbt-ru":  # the data went over LBT-RU, including the RST after the restart
        kinds = {o.label.split()[0] for r in lbtru_frames for o in r.occurrences
                 if o.protocol == "lbtru"}
        assert {"DATA", "CREQ", "ACK", "RST"} <= kinds, kinds
    else:
        assert lbtru_frames == []


def test_a_capture_path_in_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ump", "demo", "--messages", "10", "--workdir",
         str(tmp_path / "w"), "--capture", str(tmp_path / "nowhere" / "demo.pcap")],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "no directory" in result.stderr
