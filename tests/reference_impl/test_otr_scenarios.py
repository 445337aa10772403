"""Off-transport recovery in the simulator (issue 20): an LBT-RM source whose retention is a
few messages, 20 % loss on its link to the receiver (the store's link is clean), so the
transport gives up on many gaps ("do not retry"); the receiver's OTR asks the store for them,
paced, and every message is delivered once, in order, those from OTR flagged.  And the store's
side: OTR requests for numbers never sent, or naming an unknown RegID, are logged and dropped.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import TypeVar

import pytest

from reference_impl import events as ev
from reference_impl.deployment import STORE_PORT, SimDeployment
from reference_impl.receiver import ReceiverCore
from reference_impl.sim import LinkConfig
from reference_impl.store import StoreCore, TopicPolicy, TopicRule
from tests.reference_impl.oracle_capture import assert_tshark_agrees
from wire.lbmc import UmeRxreq
from wire.lbttcp import LbttcpStream
from wire.tshark import PortMap, read_frames

TOPIC = "orders.otr"
RULES = (TopicRule(".*", TopicPolicy(repository_size_threshold=50_000_000), kind="PCRE"),)
MESSAGES = 300
T = TypeVar("T")


def of(d: SimDeployment, name: str, kind: type[T]) -> list[T]:
    """The events of ``kind`` that ``name`` produced."""
    return [e for e in d.events(name) if isinstance(e, kind)]
INITIAL_DELAY = 2.0  # the current profile's otr_request_initial_delay (ms in the options)


def deployment(seed: int, *, use_otr: int = 2) -> SimDeployment:
    d = SimDeployment(seed=seed)
    d.add_store("store", topics=RULES, seed=100)
    d.add_source("src", TOPIC, transport="lbt-rm", transport_lbtrm_transmission_window_size=64)
    d.add_receiver("rcv", TOPIC, use_otr=use_otr)
    assert d.run_until(lambda: d.sources["src"].complete and d.receivers["rcv"].complete, 20)
    return d


def send(d: SimDeployment, n: int, gap: float = 0.002) -> dict[int, float]:
    """Send ``n`` messages; when each was sent."""
    src = d.sources["src"]
    sent = {}
    for _ in range(n):
        sent[src.send(b"m%d" % src.next_sqn)] = d.net.now
        d.run(gap)
    return sent


def rxreq_times(d: SimDeployment) -> dict[int, list[float]]:
    """When the store got each receiver RXREQ, by sequence number (from the trace: each TCP
    connection to the store reframed, as chunks may split messages)."""
    framers: dict[tuple[object, object], LbttcpStream] = {}
    out: dict[int, list[float]] = {}
    for p in d.net.trace:
        if p.node != "store" or p.proto != "tcp" or p.kind != "data" or \
                p.dst != (d.ips["store"], STORE_PORT) or p.src[0] != d.ips["rcv"]:
            continue
        framer = framers.setdefault((p.src, p.dst), LbttcpStream())
        for item in framer.feed(p.data):
            rx = item.message.header(UmeRxreq) if item.message is not None else None
            if rx is not None:
                out.setdefault(rx.seqnum, []).append(p.time)
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_otr_under_20_percent_loss_delivers_every_message_once_in_order(seed: int) -> None:
    d = deployment(seed)
    d.net.set_link("src", "rcv", LinkConfig(loss=0.2), both_ways=False)
    sent = send(d, MESSAGES)
    d.run(30)
    rcv = d.receivers["rcv"]
    got = of(d, "rcv", ev.MessageDelivered)
    assert [e.sequence_number for e in got] == sorted(sent)  # once each, in order
    assert [e.payload for e in got] == [b"m%d" % s for s in sorted(sent)]
    assert not of(d, "rcv", ev.UnrecoverableLoss)
    by_otr = {e.sequence_number for e in got if e.otr}
    asked = {n for e in of(d, "rcv", ev.OtrRequested) for n in range(e.first, e.last + 1)}
    assert len(by_otr) >= 5, "the transport gave up on too little to test OTR"
    assert by_otr <= asked and all(e.retransmission for e in got if e.otr)
    assert rcv.stats["otr_requests"] >= len(by_otr)
    # pacing: nothing was asked of the store sooner than the initial delay after it was sent
    # (the gap cannot be seen before), and no number twice within the minimum interval
    times = rxreq_times(d)
    for sqn in by_otr:
        assert times[sqn][0] - sent[sqn] >= INITIAL_DELAY
        assert all(b - a >= 1.0 - 1e-6 for a, b in itertools.pairwise(times[sqn]))


def test_the_same_loss_without_otr_is_reported_lost() -> None:
    d = deployment(1, use_otr=0)
    d.net.set_link("src", "rcv", LinkConfig(loss=0.2), both_ways=False)
    sent = send(d, MESSAGES)
    d.run(30)
    got = [e.sequence_number for e in d.events("rcv") if isinstance(e, ev.MessageDelivered)]
    lost = {n for e in of(d, "rcv", ev.UnrecoverableLoss) for n in range(e.first, e.last + 1)}
    assert lost and not of(d, "rcv", ev.OtrRequested)
    assert got == sorted(set(sent) - lost)  # the rest in order, once


def store_state(store: StoreCore) -> object:
    return {reg: (r.last_activity, r.conn is not None) for reg, r in store.receivers.items()}


def test_otr_requests_out_of_range_or_for_unknown_regids_are_logged_and_dropped() -> None:
    d = deployment(4)
    send(d, 10)
    d.run(1)
    rcv: ReceiverCore = d.receivers["rcv"]
    store: StoreCore = d.stores["store"]
    (reg,) = rcv.registered_stores
    before_state = store_state(store)
    before_events = len(d.events("store"))
    delivered = len(of(d, "rcv", ev.MessageDelivered))
    rcv._use(rcv.primary)
    try:  # forged requests on the receiver's own connection to the store
        rcv._send_rxreqs(reg, [10_000, 2**31 + 5])
        rcv._send_rxreqs(dataclasses.replace(reg, reg_id=reg.reg_id ^ 0x5A5A), [3])
    finally:
        rcv._rest()
    d.run(1)
    drops = [e for e in d.events("store")[before_events:] if isinstance(e, ev.InputDropped)]
    reasons = [e.reason for e in drops]
    assert len(drops) == 3, reasons
    assert sum("beyond the newest" in r for r in reasons) == 2
    assert sum("unknown receiver RegID" in r for r in reasons) == 1
    logged = [e.text for e in d.events("store")[before_events:] if isinstance(e, ev.LogRecord)]
    assert sum("dropped" in t for t in logged) == 3
    assert store_state(store) == before_state  # not even the receiver's activity
    assert len(of(d, "rcv", ev.MessageDelivered)) == delivered  # nothing came back


@pytest.mark.oracle
def test_otr_traffic_agrees_with_tshark(tmp_path: Path) -> None:
    """The OTR requests are UME RXREQs to the store's port and its answers RETRANS data
    (docs/wire-lbmc.md, "Off-transport recovery"): tshark reads every frame of the run as we
    do, with no LBM/UME warning, and shows the RXREQ for each number OTR recovered."""
    d = deployment(5)
    d.net.set_link("src", "rcv", LinkConfig(loss=0.2), both_ways=False)
    send(d, 100)
    d.run(20)
    by_otr = {e.sequence_number for e in of(d, "rcv", ev.MessageDelivered) if e.otr}
    assert by_otr
    pcap = tmp_path / "otr.pcap"
    d.write_pcap(pcap)
    portmap = PortMap(store_ports=[STORE_PORT])
    reports = assert_tshark_agrees(pcap, portmap)
    assert {"RXREQ", "RX-DATA"} <= {o.label for r in reports for o in r.occurrences}
    shown = {int(dict(fields)["lbmc.ume_rxreq.seqnum"], 0)
             for frame in read_frames(pcap, portmap) for fields in frame.occurrences("lbmc")
             if any(k == "lbmc.ume_rxreq.seqnum" for k, _ in fields)}
    assert by_otr <= shown


@pytest.mark.parametrize("use_otr", [0, 2])
def test_a_streaming_receiver_reports_the_transports_losses_and_goes_on(use_otr: int) -> None:
    """A source without stores and a receiver without ``use_otr`` 1 (2 is for persistent
    receivers only): what the transport gives up on is lost at once, and delivery goes on (it
    used to stall for good)."""
    d = SimDeployment(seed=3)
    d.add_source("src", TOPIC, transport="lbt-rm", transport_lbtrm_transmission_window_size=64,
                  ume_store=())
    d.add_receiver("rcv", TOPIC, use_otr=use_otr)
    assert d.run_until(lambda: d.receivers["rcv"].primary.source is not None, 20)
    d.run(2)
    d.net.set_link("src", "rcv", LinkConfig(loss=0.2), both_ways=False)
    sent = send(d, 200)
    d.run(20)
    got = [e.sequence_number for e in of(d, "rcv", ev.MessageDelivered)]
    lost = [n for e in of(d, "rcv", ev.UnrecoverableLoss) for n in range(e.first, e.last + 1)]
    assert lost and not of(d, "rcv", ev.OtrRequested)
    assert got == sorted(got) and sorted(got + lost) == sorted(sent)
    assert not d.receivers["rcv"].primary.held


def streaming(seed: int, *, late_join: int, use_otr: int) -> tuple[SimDeployment, list[int]]:
    """A streaming LBT-RM source (no stores, a 64-byte window) and a receiver, 20 % loss on
    the source's link to it; 200 messages sent."""
    d = SimDeployment(seed=seed)
    d.add_source("src", TOPIC, transport="lbt-rm", transport_lbtrm_transmission_window_size=64,
                 ume_store=(), late_join=late_join)
    d.add_receiver("rcv", TOPIC, use_otr=use_otr, otr_request_initial_delay=500)
    assert d.run_until(lambda: d.receivers["rcv"].primary.source is not None, 20)
    d.run(2)
    d.net.set_link("src", "rcv", LinkConfig(loss=0.2), both_ways=False)
    sent = sorted(send(d, 200))
    d.run(20)
    return d, sent


@pytest.mark.parametrize("seed", [3, 4])
def test_a_streaming_receiver_with_use_otr_1_recovers_from_the_sources_retention(
        seed: int) -> None:
    d, sent = streaming(seed, late_join=1, use_otr=1)
    got = of(d, "rcv", ev.MessageDelivered)
    first = got[0].sequence_number  # a streaming receiver starts at the first message seen
    assert [e.sequence_number for e in got] == [s for s in sent if s >= first]
    assert not of(d, "rcv", ev.UnrecoverableLoss)
    by_otr = {e.sequence_number for e in got if e.otr}
    asked = of(d, "rcv", ev.OtrRequested)
    assert by_otr and all(e.store == d.sources["src"].request_addr for e in asked)
    assert d.sources["src"].stats["otr_retransmissions"] >= len(by_otr)


def test_a_source_without_retention_drops_otr_requests_and_the_receiver_goes_on() -> None:
    d, sent = streaming(3, late_join=0, use_otr=1)
    got = [e.sequence_number for e in of(d, "rcv", ev.MessageDelivered)]
    lost = [n for e in of(d, "rcv", ev.UnrecoverableLoss) for n in range(e.first, e.last + 1)]
    asked = of(d, "rcv", ev.OtrRequested)
    assert lost and asked  # asked, never answered: given up
    assert got == sorted(got) and sorted(got + lost) == [s for s in sent if s >= got[0]]
    drops = [e for e in d.events("src") if isinstance(e, ev.InputDropped)]
    assert drops and all("not in the retention buffer" in e.reason for e in drops)
