"""``ump conform --transport``: store cases keep their IDs on LBT-RU and LBT-RM, the harness
source really sends there, and every report names the transport of each case.

The runs use the reference store and a couple of quick cases; multicast on loopback is set up
by ``scripts/ensure-multicast`` first (the LBT-RM source sends to a group of its own).
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from scapy.layers.inet import IP, UDP
from scapy.utils import rdpcap

from conformance.model import CaseSpec, Role, Strength
from conformance.profile import ProfileError, parse_profile
from conformance.runner import case_transport, transport_unsupported
from conformance.udp_transport import group_members
from wire import lbtrm, lbtru
from wire.dissect import check_against_tshark, dissect_file
from wire.tshark import PortMap

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def multicast() -> None:
    subprocess.run([str(ROOT / "scripts" / "ensure-multicast")], check=True, timeout=60)


def _conform(out: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    proc = subprocess.run([sys.executable, "-m", "ump", "conform", "--out", str(out), *args],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    data = json.loads((out / "results.json").read_text())
    return proc, data


def _udp_payloads(pcap: Path) -> list[tuple[str, int, bytes]]:
    return [(p[IP].dst, p[UDP].dport, bytes(p[UDP].payload))
            for p in rdpcap(str(pcap)) if UDP in p]


def test_every_transport_runs_a_store_case_under_its_own_id(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc, data = _conform(out, "--transport", "all", "-k", "REC-STORE-002")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    got = [(c["id"], c["transport"], c["verdict"]) for c in data["cases"]]
    assert got == [("REC-STORE-002", t, "pass") for t in ("tcp", "lbt-ru", "lbt-rm")]
    # the evidence of each run is its own
    for name in ("REC-STORE-002", "REC-STORE-002.lbt-ru", "REC-STORE-002.lbt-rm"):
        assert (out / "cases" / name / "evidence.pcap").exists(), name
    names = [tc.get("name") for tc in ET.parse(out / "junit.xml").getroot().iter("testcase")]
    assert [n.rsplit("]", 1)[0].rsplit("[", 1)[-1] if n and n.endswith("]") else "tcp"
            for n in names] == ["tcp", "LBT-RU", "LBT-RM"]
    props = [p.get("value") for p in ET.parse(out / "junit.xml").getroot().iter("property")
             if p.get("name") == "transport"]
    assert props == ["tcp", "lbt-ru", "lbt-rm"]
    page = (out / "report.html").read_text()
    assert "<td>LBT-RM</td>" in page and "<td>LBT-RU</td>" in page and "<td>LBT-TCP</td>" in page


def _agrees_with_tshark(out: Path, case: dict[str, Any]) -> None:
    """The case's evidence dissects the same in wire/ and tshark, with the UDP ports the
    result says carried its transport decoded as such (as the HTML report's command does)."""
    ports = case["transport_ports"]
    assert list(ports) == [case["transport"]] and ports[case["transport"]]
    portmap = PortMap(store_ports=[case["store_port"]], lbtru_ports=ports.get("lbt-ru", []),
                      lbtrm_ports=ports.get("lbt-rm", []))
    pcap = out / case["pcap"]
    reports = list(dissect_file(pcap, portmap))
    assert any(r.status == "um" for r in reports)
    assert check_against_tshark(pcap, reports, portmap) == [], case["id"]
    assert f"--{case['transport'].replace('-', '')}-port" in (out / "report.html").read_text()


def test_the_lbtrm_source_sends_data_to_its_group_and_the_store_nak_port_is_the_header_s(
        tmp_path: Path) -> None:
    """The store's data came over LBT-RM: DATA datagrams to a multicast group, from the port
    the header names; the TIR the harness served names that group and port."""
    out = tmp_path / "out"
    proc, data = _conform(out, "--transport", "lbt-rm", "-k", "REC-STORE-001")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [c["transport"] for c in data["cases"]] == ["lbt-rm"]
    pcap = out / "cases" / "REC-STORE-001.lbt-rm" / "evidence.pcap"
    datas = []
    for dst, dport, payload in _udp_payloads(pcap):
        if dst.startswith("239."):
            packet = lbtrm.parse_packet(payload)
            if isinstance(packet, lbtrm.LbtrmData):
                datas.append((dst, dport, packet.sqn))
    assert len(datas) >= 10 and len({(d, p) for d, p, _ in datas}) == 1
    assert [s for _, _, s in datas][:10] == list(range(10))
    _agrees_with_tshark(out, data["cases"][0])


def test_the_lbtru_source_answers_the_store_s_connect_and_sends_it_data(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc, data = _conform(out, "--transport", "lbt-ru", "-k", "REC-STORE-001")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pcap = out / "cases" / "REC-STORE-001.lbt-ru" / "evidence.pcap"
    kinds = []
    for _, _, payload in _udp_payloads(pcap):
        try:
            kinds.append(type(lbtru.parse_packet(payload)).__name__)
        except Exception:  # LBMR to the resolver
            continue
    assert "LbtruCreq" in kinds and kinds.count("LbtruData") >= 10
    _agrees_with_tshark(out, data["cases"][0])


def test_the_profile_names_a_store_s_transport() -> None:
    base = {"role": "store", "launch": "x {config}"}
    assert parse_profile({"iut": base}).transport == "tcp"
    assert parse_profile({"iut": {**base, "transport": "lbt-rm"}}).transport == "lbt-rm"
    assert parse_profile({"iut": {**base, "transport": "all"}}).transport == "all"
    with pytest.raises(ProfileError, match="transport must be one of"):
        parse_profile({"iut": {**base, "transport": "pgm"}})
    with pytest.raises(ProfileError, match="transport is for a store"):
        parse_profile({"iut": {"role": "source", "launch": "x", "transport": "lbt-ru"}})


def _spec(role: Role, transport: str | None = None) -> CaseSpec:
    return CaseSpec(id="X-1", title="t", suite="s", role=role, section="s", requirement="r",
                    strength=Strength.MUST, run=lambda h: None, transport=transport)


def test_which_transport_a_case_runs_on() -> None:
    assert case_transport(_spec(Role.STORE), "lbt-ru") == "lbt-ru"
    assert case_transport(_spec(Role.SOURCE), "lbt-ru") == "tcp"
    assert case_transport(_spec(Role.RECEIVER, "lbt-rm"), "tcp") == "lbt-rm"
    assert transport_unsupported(_spec(Role.STORE), "lbt-rm") is None
    assert transport_unsupported(_spec(Role.SOURCE, "lbt-rm"), "lbt-ru") is None
    assert "LBT-TCP only" in (transport_unsupported(_spec(Role.RECEIVER), "lbt-rm") or "")


def test_group_members_reads_a_join_on_loopback() -> None:
    import socket

    group = "239.195.77.77"
    before = group_members(group)
    assert before is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP,
                        socket.inet_aton(group) + socket.inet_aton("127.0.0.1"))
        assert group_members(group) == before + 1
    finally:
        sock.close()
    assert group_members(group) == before


def test_the_pytest_plugin_runs_store_cases_on_a_transport(tmp_path: Path) -> None:
    cwd = tmp_path / "fresh"
    cwd.mkdir()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "conformance.pytest_plugin",
                           "--iut", "store", "--conform-transport", "lbt-ru", "-k",
                           "REC-STORE-001", "-q", "-p", "no:cacheprovider"],
                          capture_output=True, text=True, timeout=300, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((cwd / "conform-out" / "results.json").read_text())
    assert [(c["id"], c["transport"], c["verdict"]) for c in data["cases"]] == [
        ("REC-STORE-001", "lbt-ru", "pass")]
