"""Whole deployments whose source sends on LBT-RU instead of LBT-TCP (issue 3).

The source advertises an LBT-RU transport (the 10-byte TIR form, with its session ID) and puts
every data message and SRI on its :class:`~reference_impl.lbtru_session.LbtruSourceSession`;
stores and receivers connect to it from their LBT-RU port and take the delivered payloads
through the same LBMC path as LBT-TCP.  What the transport cannot recover (a NAK behind the
source's window) the receiver recovers from the store, as for any gap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reference_impl import events as ev
from reference_impl.context import ContextCore, control
from reference_impl.deployment import LBTRU_RECEIVER_PORT, LBTRU_SOURCE_PORT, SimDeployment
from reference_impl.lbtru_session import (
    LbtruReceiverSession,
    LbtruSourceSession,
    LbtruSourceSettings,
)
from reference_impl.sim import LinkConfig
from reference_impl.source import SourceConfig, SourceCore, lbtru_session_id
from reference_impl.store import TopicPolicy, TopicRule
from wire import lbmr, lbtru
from wire.lbmc import SriReq

TOPIC = "orders.ru"
RULES = (TopicRule(".*", TopicPolicy(repository_size_threshold=50_000_000), kind="PCRE"),)


def deployment(seed: int = 1, link: LinkConfig | None = None,
               **source_options: Any) -> SimDeployment:
    d = SimDeployment(seed=seed, link=link)
    d.add_store("store", topics=RULES, seed=100)
    d.add_source("src", TOPIC, transport="lbt-ru", **source_options)
    d.add_receiver("rcv", TOPIC)
    assert d.run_until(lambda: d.sources["src"].complete and d.receivers["rcv"].complete, 20)
    return d


def send(d: SimDeployment, n: int, gap: float = 0.001) -> list[int]:
    src = d.sources["src"]
    sqns = []
    for _ in range(n):
        sqns.append(src.send(b"m%d" % src.next_sqn))
        d.run(gap)
    return sqns


def deliveries(d: SimDeployment, name: str = "rcv") -> list[ev.MessageDelivered]:
    return [e for e in d.events(name) if isinstance(e, ev.MessageDelivered)]


def delivered(d: SimDeployment, name: str = "rcv") -> list[int]:
    return [e.sequence_number for e in deliveries(d, name)]


def stable(d: SimDeployment) -> set[int]:
    return {e.sequence_number for e in d.events("src") if isinstance(e, ev.MessageStable)}


def logs(d: SimDeployment, name: str) -> list[str]:
    return [e.text for e in d.events(name) if isinstance(e, ev.LogRecord)]


def test_the_source_advertises_lbtru_and_every_message_is_stable_and_delivered_once() -> None:
    d = deployment()
    src = d.sources["src"]
    tir = src._tir()
    assert isinstance(tir.info, lbmr.LbtruSidInfo)
    assert (tir.info.ip, tir.info.port) == (src.ip, LBTRU_SOURCE_PORT)
    assert tir.info.session_id == lbtru_session_id(src.ip, LBTRU_SOURCE_PORT, 1) != 0
    sqns = send(d, 200)
    d.run(2)
    assert delivered(d) == sqns == list(range(200))
    assert stable(d) == set(sqns)
    # the data went on LBT-RU, nothing on an LBT-TCP transport connection
    assert src._transport_conns == []
    data_from_source = [p for p in d.net.trace if p.src == (src.ip, LBTRU_SOURCE_PORT)]
    assert data_from_source and all(p.proto == "udp" for p in data_from_source)
    assert src.lbtru_session is not None and src.lbtru_session.stats["data"] >= 200
    assert not d.events("rcv", ev.UnrecoverableLoss)
    assert d.events("rcv", ev.InputDropped) == d.events("store", ev.InputDropped) == []


def test_a_configured_session_id_goes_in_the_tir_and_in_every_datagram() -> None:
    d = deployment(transport_lbtru_session_id=0xC0FFEE)
    send(d, 5)
    d.run(1)
    src = d.sources["src"]
    assert src._tir().info.session_id == 0xC0FFEE
    sent = [lbtru.parse_packet(p.data, decode_lbmc=False) for p in d.net.trace
            if p.src == (src.ip, LBTRU_SOURCE_PORT)]
    assert sent and all(p.session_id == 0xC0FFEE for p in sent)
    assert delivered(d) == list(range(5))


def test_an_unknown_transport_is_refused_and_lbtru_needs_a_port() -> None:
    with pytest.raises(ValueError, match="tcp, lbt-ru or lbt-rm"):
        SourceConfig(transport="lbt-ipc")
    with pytest.raises(ValueError, match="UDP port"):
        SourceCore(TOPIC, SourceConfig(transport="lbtru"), ip="10.0.0.9", transport_port=1,
                   request_port=2)


def test_with_link_loss_every_message_still_arrives_once_in_order() -> None:
    d = deployment(seed=3, link=LinkConfig(loss=0.1))
    sqns = send(d, 300)
    d.run(15)
    assert delivered(d) == sqns
    rcv_sessions = [b.session for b in d.receivers["rcv"].lbtru]
    assert rcv_sessions and isinstance(rcv_sessions[0], LbtruReceiverSession)
    assert rcv_sessions[0].stats["naks"] > 0  # the transport repaired the loss
    assert stable(d) == set(sqns)


def test_what_the_transport_cannot_repair_is_recovered_from_the_store() -> None:
    # a window of a few messages: a NAK for an older one gets "do not retry", the session
    # declares it lost, and the receiver asks the store (which got it on its lossless link)
    d = deployment(seed=5, transport_lbtru_transmission_window_size=64)
    d.net.set_link("src", "rcv", LinkConfig(loss=0.2), both_ways=False)
    sqns = send(d, 200, gap=0.0005)
    d.run(15)
    assert delivered(d) == sqns
    retransmitted = [e for e in deliveries(d) if e.retransmission]
    assert retransmitted, "nothing came from the store"
    assert d.receivers["rcv"].stats["requests"] > 0
    assert any("LBT-RU transport lost" in text for text in logs(d, "rcv"))
    assert not d.events("rcv", ev.UnrecoverableLoss)


def test_a_restarted_receiver_recovers_what_it_missed_from_the_store() -> None:
    d = deployment()
    send(d, 20)
    d.run(1)
    first = delivered(d)
    assert first == list(range(20))
    d.kill("rcv")
    send(d, 30)
    d.restart("rcv")
    assert d.run_until(lambda: d.receivers["rcv"].complete, 10)
    send(d, 10)
    d.run(5)
    after = delivered(d)[20:]
    # the new incarnation resumes after what the old one acknowledged, nothing twice
    assert after == list(range(after[0], 60))
    assert after[0] <= 20
    assert not d.events("rcv", ev.UnrecoverableLoss)


def test_a_source_that_goes_silent_times_the_session_out_and_is_resolved_again() -> None:
    d = deployment()
    send(d, 3)
    rcv = d.receivers["rcv"]
    assert rcv.lbtru and rcv.transport_up
    d.kill("src")
    d.run(61)  # the LBT-RU activity timeout is 60 s
    assert rcv.lbtru == [] and not rcv.transport_up
    assert rcv.timer_at("resolve") is not None
    assert any("transport connection lost" in text for text in logs(d, "rcv"))


def test_a_truncated_message_in_a_payload_is_dropped_and_said() -> None:
    core = ContextCore("c", "10.0.0.1")
    seen: list[bytes] = []
    core.on_raw_message = lambda conn, raw: seen.append(raw)  # type: ignore[method-assign]
    binding = core.open_lbtru_receiver(LBTRU_RECEIVER_PORT, ("10.0.0.2", LBTRU_SOURCE_PORT), 7)
    assert binding.conn is not None
    whole = control(SriReq(transport_idx=1, topic_idx=1))
    core._feed_datagram(binding.conn, whole + whole[:5])
    assert seen == [whole]
    dropped = [e for e in core.events() if isinstance(e, ev.InputDropped)]
    assert len(dropped) == 1 and "inside an LBMC message" in dropped[0].reason
    # nothing is ever written on the stand-in connection
    core.write(binding.conn, whole)
    assert core.stream_commands(0.0) == []


def test_a_datagram_for_no_session_on_an_lbtru_port_is_dropped() -> None:
    core = ContextCore("c", "10.0.0.1")
    core.lbtru_ports.add(LBTRU_RECEIVER_PORT)
    core.receive_at(LBTRU_RECEIVER_PORT, b"\x00" * 20, ("10.0.0.2", 14380), 0.0)
    dropped = [e for e in core.events() if isinstance(e, ev.InputDropped)]
    assert len(dropped) == 1 and "no session" in dropped[0].reason
    source = core.open_lbtru_source(14381, LbtruSourceSettings())
    assert isinstance(source.session, LbtruSourceSession) and source.conn is None


@pytest.mark.oracle
def test_an_lbtru_deployment_dissects_identically_in_tshark(tmp_path: Path) -> None:
    from reference_impl.deployment import STORE_PORT
    from wire.dissect import check_against_tshark, dissect_file
    from wire.tshark import PortMap

    d = deployment(seed=4, transport_lbtru_transmission_window_size=64)
    d.net.set_link("src", "rcv", LinkConfig(loss=0.1), both_ways=False)
    send(d, 60)
    d.kill("rcv")
    send(d, 10)
    d.restart("rcv")
    d.run(8)
    path = tmp_path / "lbtru-deployment.pcap"
    d.write_pcap(path)
    ports = PortMap(store_ports=[STORE_PORT])
    reports = list(dissect_file(path, ports))
    assert {r.transport for r in reports} >= {"lbtru", "lbmr"}
    labels = {o.label for r in reports for o in r.occurrences}
    assert {"PREG", "SRI", "RXREQ"} <= labels
    assert check_against_tshark(path, reports, ports) == []


def test_a_restarted_source_resets_the_sessions_and_its_receivers_go_on_in_order() -> None:
    # the restarted source has the same (derived) session ID on the same port: its RST makes
    # the receiver and the store reconnect at once, and the source (its UMP Session ID gets
    # it its RegID back) resumes its numbering
    d = deployment(ume_session_id=11)
    send(d, 30)
    d.run(1)
    d.kill("src")
    d.run(1)
    src = d.restart("src")
    assert d.run_until(lambda: src.complete, 15)  # type: ignore[attr-defined]
    assert src.next_sqn == 30  # type: ignore[attr-defined]
    send(d, 30)
    d.run(3)
    assert delivered(d) == list(range(60))
    assert stable(d) >= set(range(30, 60))
    assert any("reset by the source" in text for text in logs(d, "rcv"))


def test_a_receiver_without_an_lbtru_port_ignores_lbtru_sources() -> None:
    from reference_impl.receiver import ReceiverConfig, ReceiverCore

    d = deployment()
    tir = d.sources["src"]._tir()
    packet = lbmr.LbmrPacket(tirs=[tir])
    deaf = ReceiverCore(TOPIC, ReceiverConfig(), ip="10.0.0.99", request_port=14392)
    deaf.on_lbmr(packet, d.resolver_addr)
    assert deaf.source is None and deaf.lbtru == []
    hearing = ReceiverCore(TOPIC, ReceiverConfig(), ip="10.0.0.99", request_port=14392,
                           lbtru_port=LBTRU_RECEIVER_PORT)
    hearing.on_lbmr(packet, d.resolver_addr)
    assert hearing.source is not None and hearing.source.lbtru_session_id == tir.info.session_id
    (binding,) = hearing.lbtru
    assert binding.port == LBTRU_RECEIVER_PORT
    assert binding.session.source == (d.ips["src"], LBTRU_SOURCE_PORT)  # type: ignore[union-attr]
    assert hearing.datagrams_from(0.0)[0][0] == LBTRU_RECEIVER_PORT  # its first CREQ
