"""A quorum/consensus deployment on loopback, captured and checked with tshark
(:mod:`captures.qc_loopback`): three reference stores in two groups, a source, a receiver, one
store SIGKILLed and started again.

Both the committed ``captures/reference/ume-qc-loopback.pcap`` and a fresh recording (on free
ports) must show: no field where ``ump dissect`` and tshark disagree, no malformed frame, no
LBM/UME expert item; the source and the receiver registering with every store; SRI carrying
both store groups and every store with its group; the messages on the transport; stability
ACKs from every store; and the killed store registered again by the source and acknowledging
messages after its return (docs/semantics.md §1.2, §1.12).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from captures import qc_loopback as qc
from reference_impl.capture import CaptureError, available_backends
from wire.dissect import FrameReport, Occurrence, check_against_tshark, dissect_file
from wire.lbmc import AckType
from wire.tshark import PortMap, expert_summary

COMMITTED = Path(__file__).resolve().parents[2] / "captures" / "reference" / qc.NAME


def _field(o: Occurrence, name: str) -> Any:
    return next((v for k, v in o.fields if k == name), None)


def _fields(o: Occurrence, name: str) -> list[Any]:
    return [v for k, v in o.fields if k == name]


def _portmap(meta: dict[str, Any]) -> PortMap:
    return PortMap(store_ports=list(meta["store_ports"]), lbmr_ports=[meta["resolver_port"]])


def _messages(reports: Sequence[FrameReport], label: str) -> list[tuple[FrameReport, Occurrence]]:
    return [(r, o) for r in reports for o in r.occurrences
            if o.protocol == "lbmc" and o.label == label]


def check_qc_capture(pcap: Path, meta: dict[str, Any]) -> None:
    """Everything the module docstring says a QC capture must show."""
    ports = _portmap(meta)
    reports = list(dissect_file(pcap, ports))
    assert all(r.status in ("um", "not-um") for r in reports), \
        [(r.number, r.status, r.reason) for r in reports if r.status not in ("um", "not-um")]
    assert check_against_tshark(pcap, reports, ports) == []
    experts = expert_summary(pcap, ports)
    assert "Errors" not in experts, experts
    assert not [w for w in experts.get("Warns", []) if "LBM" in w or "UME" in w], experts

    stores: list[int] = list(meta["store_ports"])
    killed = stores[meta["killed_store"]]
    pregs = _messages(reports, "PREG")
    grants = [(r, o) for r, o in _messages(reports, "PREG-RESP")
              if not _field(o, "lbmc.ume_preg_resp.code.e_flag")]
    for port in stores:
        to_store = [(r, o) for r, o in pregs if r.dport == port]
        sources = [r for r, o in to_store if _field(o, "lbmc.ume_preg.s_flag") == 1]
        receivers = [r for r, o in to_store if _field(o, "lbmc.ume_preg.s_flag") == 0]
        assert sources and receivers, f"store port {port}: no source or no receiver PREG"
        granted = [r for r, o in grants if r.sport == port
                   and _field(o, "lbmc.ume_preg_resp.s_flag") == 1]
        want = 2 if port == killed else 1  # the killed store: again after its return
        assert len({r.dport for r in granted}) >= want, (port, [r.number for r in granted])

    groups = {(int(g), int(n)) for _, o in _messages(reports, "SRI")
              for g, n in zip(_fields(o, "lbmc.ume_store_group.grp_idx"),
                              _fields(o, "lbmc.ume_store_group.grp_sz"), strict=True)}
    assert groups == {(int(k), v) for k, v in meta["group_sizes"].items()}
    members = {(int(g), int(p)) for _, o in _messages(reports, "SRI")
               for g, p in zip(_fields(o, "lbmc.ume_store_ext.grp_idx"),
                               _fields(o, "lbmc.ume_store_ext.store_tcp_port"), strict=True)}
    assert members == set(zip(meta["groups"], stores, strict=True))

    transport = {int(_field(o, "lbmc.sqn")) for _, o in _messages(reports, "DATA")}
    assert transport == set(range(meta["messages"]))
    stable = [(r, o) for r, o in _messages(reports, "ACK")
              if int(_field(o, "lbmc.ume_ack.type")) == AckType.STABLE]
    assert {r.sport for r, _ in stable} == set(stores)
    returned = max(r.time for r, o in grants if r.sport == killed
                   and _field(o, "lbmc.ume_preg_resp.s_flag") == 1)
    after = {int(_field(o, "lbmc.ume_ack.seqnum")) for r, o in stable
             if r.sport == killed and r.time > returned}
    assert after, "the returned store acknowledged nothing after its new registration"
    cut = [r.time for r in reports if killed in (r.sport, r.dport)]
    gaps = [b - a for a, b in itertools.pairwise(cut)]
    assert max(gaps) > 0.1, "no pause in the killed store's traffic"


@pytest.mark.oracle
def test_the_committed_qc_capture_agrees_with_tshark_and_shows_the_qc_exchange() -> None:
    meta = json.loads(COMMITTED.with_name(COMMITTED.name + ".meta.json").read_text())
    assert meta["store_ports"] == list(qc.WELL_KNOWN_STORE_PORTS)
    check_qc_capture(COMMITTED, meta)


@pytest.mark.oracle
def test_a_fresh_qc_recording_agrees_with_tshark_and_shows_the_qc_exchange(
        tmp_path: Path) -> None:
    assert available_backends(), "no capture backend (tcpdump, dumpcap or scapy) installed"
    try:
        run = qc.record(tmp_path / qc.NAME, tmp_path / "work")
    except CaptureError as exc:
        raise AssertionError(f"capturing failed: {exc}") from None
    assert run.delivered == list(range(qc.MESSAGES))
    sidecar = json.loads(qc.write_sidecar(run).read_text())
    assert sidecar["dissect_args"] == [
        "--store-port", ",".join(map(str, run.store_ports)), "--lbmr-port",
        str(run.resolver_port)]
    check_qc_capture(run.pcap, sidecar)


def test_the_source_configuration_names_every_store_with_its_group() -> None:
    text = qc._source_config(15380, (1, 2, 3))
    assert "source ume_store 127.0.0.1:1:0:0\n" in text
    assert "source ume_store 127.0.0.1:3:0:1\n" in text
    assert "source ume_store_group 0:1\nsource ume_store_group 1:2\n" in text
    # the group sizes fit the stores placed in them
    assert {g: qc.GROUPS.count(g) for g in set(qc.GROUPS)} == qc.GROUP_SIZES
