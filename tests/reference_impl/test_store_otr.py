"""The store as an off-transport recovery requester (issue 20; docs/semantics.md §1.9, "The
store as an OTR requester"): a store whose ``<lbm-config>`` sets ``use_otr 1`` asks the
source's request port for what its LBT-RU transport gave up on, paced by the ``otr_request_*``
timers, and persists what comes back (the source then has it stable); with ``use_otr`` 0 or 2
it asks nothing and declares the loss, as before.  In the simulator (loss on the source's link
to the store only, a source window of a few messages so the transport gives up, no proactive
retransmissions to fill the gaps) and on the configuration's way in.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from reference_impl import events as ev
from reference_impl import runtime
from reference_impl.config import load_client_config
from reference_impl.deployment import STORE_PORT, SimDeployment
from reference_impl.otr import OtrSettings
from reference_impl.sim import LinkConfig
from reference_impl.store import StoreCore, TopicPolicy, TopicRule, _runs
from tests.reference_impl.oracle_capture import assert_tshark_agrees
from wire.lbmc import UmeRxreq
from wire.lbttcp import LbttcpStream
from wire.tshark import PortMap, read_frames

TOPIC = "orders.store-otr"
RULES = (TopicRule(".*", TopicPolicy(repository_size_threshold=50_000_000), kind="PCRE"),)
PACING = OtrSettings(initial_delay=0.5, minimum_interval=0.25, maximum_interval=1.0,
                     message_timeout=5.0)


def deployment(seed: int, otr: OtrSettings | None, transport: str = "lbt-ru"
               ) -> SimDeployment:
    """A store (with ``otr``) and a persistent LBT-RU (or LBT-RM) source whose window holds
    64 bytes' worth of datagrams and that never retransmits proactively."""
    d = SimDeployment(seed=seed)
    d.add_store("store", topics=RULES, seed=100, otr=otr)
    if transport == "lbt-rm":
        src = d.add_source("src", TOPIC, transport=transport, ume_message_stability_timeout=0,
                           transport_lbtrm_transmission_window_size=64)
    else:
        src = d.add_source("src", TOPIC, transport=transport, ume_message_stability_timeout=0,
                           transport_lbtru_transmission_window_size=64)
    assert d.run_until(lambda: src.complete, 20)
    return d


def send_lossy(d: SimDeployment, n: int = 300) -> dict[int, float]:
    """``n`` messages with 20 % loss from the source to the store (the link back is clean),
    then 5 on a clean link (a gap shows only at the next live message); when each was sent."""
    src = d.sources["src"]
    d.net.set_link("src", "store", LinkConfig(loss=0.2), both_ways=False)
    sent = {}
    for i in range(n + 5):
        if i == n:
            d.net.set_link("src", "store", LinkConfig(), both_ways=False)
        sent[src.send(b"m%d" % src.next_sqn)] = d.net.now
        d.run(0.002)
    return sent


def rxreqs_at_source(d: SimDeployment) -> dict[int, list[float]]:
    """When the source's request port got each RXREQ from the store, by sequence number."""
    src = d.sources["src"]
    framers: dict[tuple[object, object], LbttcpStream] = {}
    out: dict[int, list[float]] = {}
    for p in d.net.trace:
        if p.node != "src" or p.proto != "tcp" or p.kind != "data" or \
                p.dst != src.request_addr or p.src[0] != d.ips["store"]:
            continue
        framer = framers.setdefault((p.src, p.dst), LbttcpStream())
        for item in framer.feed(p.data):
            rx = item.message.header(UmeRxreq) if item.message is not None else None
            if rx is not None:
                out.setdefault(rx.seqnum, []).append(p.time)
    return out


def held(store: StoreCore) -> set[int]:
    (state,) = store.sources.values()
    assert state.repo is not None
    return {sqn for sqn in range(0, 1000) if sqn in state.repo}


@pytest.mark.parametrize(("seed", "transport"),
                         [(1, "lbt-ru"), (2, "lbt-ru"), (3, "lbt-ru"), (1, "lbt-rm")])
def test_a_store_with_use_otr_1_recovers_what_its_transport_gave_up_from_the_source(
        seed: int, transport: str) -> None:
    d = deployment(seed, PACING, transport)
    sent = send_lossy(d)
    d.run(10.0)
    store, src = d.stores["store"], d.sources["src"]
    assert store.stats.get("lbtru_lost", 0) > 0, "the transport gave up on nothing"  # RU/RM
    recovered = store.stats.get("otr_recovered", 0)
    assert recovered >= 5
    assert held(store) == set(sent)  # every message persisted, none declared lost
    (state,) = store.sources.values()
    assert not state.lost and not store.stats.get("declared_lost")
    assert src.stats["otr_retransmissions"] >= recovered
    stable = {e.sequence_number for e in d.events("src") if isinstance(e, ev.MessageStable)}
    assert stable == set(sent)  # the store acknowledged what it recovered too
    # paced: nothing asked sooner than the initial delay after it was sent, no number twice
    # within the minimum interval, and only what the transport lost
    times = rxreqs_at_source(d)
    assert len(times) >= recovered
    for sqn, ts in times.items():
        assert ts[0] - sent[sqn] >= PACING.initial_delay - 1e-6
        assert all(b - a >= PACING.minimum_interval - 1e-6 for a, b in itertools.pairwise(ts))


def test_without_otr_the_store_asks_nothing_and_declares_the_loss() -> None:
    d = deployment(1, None)
    sent = send_lossy(d)
    d.run(10.0)
    store = d.stores["store"]
    (state,) = store.sources.values()
    assert state.lost and store.stats["declared_lost"] == len(state.lost)
    assert held(store) == set(sent) - state.lost
    assert not rxreqs_at_source(d) and not store.stats.get("otr_requests")
    assert not d.sources["src"].stats.get("otr_retransmissions")


def test_what_the_source_no_longer_holds_is_declared_lost_after_the_message_timeout() -> None:
    # the source let every message go at once (no retention): each request is dropped there,
    # repeated at the doubling interval, and the gap declared lost at the message timeout
    d = deployment(2, PACING)
    src = d.sources["src"]
    src.retained.clear()
    src.retained_bytes = 0
    original = src._on_otr_request
    src._on_otr_request = lambda conn, rx, size: src.drop(  # type: ignore[method-assign]
        conn.remote, "test: nothing retained", size)
    sent = send_lossy(d, 200)
    d.run(3.0)
    store = d.stores["store"]
    (state,) = store.sources.values()
    assert not state.lost and store.stats["otr_requests"] > 0  # still asking
    d.run(PACING.message_timeout + 1.0)
    assert state.lost and set(sent) == held(store) | state.lost
    asked = store.stats["otr_requests"]
    d.run(3.0)
    assert store.stats["otr_requests"] == asked  # given up: asked no more
    src._on_otr_request = original  # type: ignore[method-assign]
    lines = [e.text for e in d.events("store") if isinstance(e, ev.LogRecord)]
    assert any("off-transport recovery asks" in t and "attempt 3" in t for t in lines)
    assert any("declared unrecoverably lost" in t for t in lines)


def test_runs_of_consecutive_numbers() -> None:
    assert _runs(()) == []
    assert _runs((3, 4, 5, 9, 11, 12)) == [(3, 5), (9, 9), (11, 12)]


@pytest.mark.parametrize(("use_otr", "asks"), [(0, False), (1, True), (2, False)])
def test_the_store_reads_use_otr_and_the_timers_from_its_lbm_config(
        tmp_path: Path, use_otr: int, asks: bool) -> None:
    cfg = tmp_path / "lbm.cfg"
    cfg.write_text(f"receiver use_otr {use_otr}\n"
                   "receiver otr_request_initial_delay 700\n"
                   "receiver otr_request_minimum_interval 300\n"
                   "receiver otr_request_maximum_interval 2400\n"
                   "receiver retransmit_request_message_timeout 9000\n")
    got = runtime.store_otr(load_client_config(str(cfg)))
    if asks:
        assert got == OtrSettings(0.7, 0.3, 2.4, 9.0)
    else:
        assert got is None
    assert runtime.store_otr(None) is None


@pytest.mark.oracle
def test_the_stores_otr_traffic_agrees_with_tshark(tmp_path: Path) -> None:
    """The store's OTR requests are UME RXREQs to the source's request port, the source's
    answers RETRANS data (docs/wire-lbmc.md §5): tshark reads every frame of the run as we
    do and shows an RXREQ for each number the store recovered."""
    d = deployment(1, PACING)
    sent = send_lossy(d, 150)
    d.run(10.0)
    store = d.stores["store"]
    assert held(store) == set(sent) and store.stats.get("otr_recovered", 0) >= 3
    pcap = tmp_path / "store-otr.pcap"
    d.write_pcap(pcap)
    portmap = PortMap(store_ports=[STORE_PORT])
    reports = assert_tshark_agrees(pcap, portmap)
    assert {"RXREQ", "RX-DATA"} <= {o.label for r in reports for o in r.occurrences}
    shown = {int(dict(fields)["lbmc.ume_rxreq.seqnum"], 0)
             for frame in read_frames(pcap, portmap) for fields in frame.occurrences("lbmc")
             if any(k == "lbmc.ume_rxreq.seqnum" for k, _ in fields)}
    assert set(rxreqs_at_source(d)) <= shown
