"""A receiver and several sources of its topic, in the simulator (issue 22 items 8 and 11).

Guide "Receiver Registration": a receiver registers after receiving the SRI of the source
sending on its topic; "Registration Identifier": a receiver RegID identifies it to one store
for one source.  So a receiver joins every source of its topic, each with its own
registrations, delivery order, recovery and consumption ACKs (item 8); and a source that
starts while the receiver runs, after the previous one on the same transport address is gone
(a new source: no Session ID, so a new source RegID), gets registered with afresh (item 11).
"""

from __future__ import annotations

import json
from pathlib import Path

from reference_impl import events as ev
from reference_impl.context import control
from reference_impl.deployment import SimDeployment
from reference_impl.fastmsg import data_message
from reference_impl.receiver import DORMANT_LIFETIME, MAX_SOURCES, ReceiverConfig, ReceiverCore
from reference_impl.runtime import DeliveryFloors, DeliveryLog
from reference_impl.sim import ConnKey, StreamEvent, StreamEventKind, StreamWrite
from reference_impl.source import SourceCore
from reference_impl.store import TopicPolicy, TopicRule
from wire import lbmr
from wire.lbmc import (
    LbmcMessage,
    MessageType,
    Sri,
    TopicIdx,
    UmePreg,
    UmePregResp,
    UmeRxreq,
    UmeStoreExt,
)
from wire.lbttcp import LbttcpStream

TOPIC = "multi.orders"
RULES = (TopicRule(".*", TopicPolicy(repository_size_threshold=50_000_000), kind="PCRE"),)


def deployment(stores: int = 1, seed: int = 1) -> SimDeployment:
    d = SimDeployment(seed=seed)
    for i in range(stores):
        d.add_store(f"store{i}", topics=RULES, seed=100 + i)
    return d


def send(d: SimDeployment, names: list[str], n: int) -> None:
    """``n`` messages from each source, interleaved; payload ``<source>:<sqn>``."""
    for _ in range(n):
        for name in names:
            src = d.sources[name]
            src.send(b"%s:%d" % (name.encode(), src.next_sqn))
        d.run(0.001)


def by_source(d: SimDeployment, name: str = "rcv") -> dict[str, list[tuple[int, bytes]]]:
    """What the receiver delivered, per source string, in delivery order."""
    out: dict[str, list[tuple[int, bytes]]] = {}
    for e in d.events(name, ev.MessageDelivered):
        assert isinstance(e, ev.MessageDelivered)
        # (read with getattr so that a receiver without the field fails on what it delivers)
        out.setdefault(getattr(e, "source", "?"), []).append((e.sequence_number, e.payload))
    return out


def source_string(d: SimDeployment, name: str) -> str:
    src = d.sources[name]
    return f"TCP:{src.transport_addr[0]}:{src.transport_addr[1]}"


def expected(d: SimDeployment, name: str, n: int) -> list[tuple[int, bytes]]:
    return [(i, b"%s:%d" % (name.encode(), i)) for i in range(n)]


def registered(d: SimDeployment, names: list[str]) -> bool:
    return all(d.sources[n].complete for n in names)


def completions(d: SimDeployment, name: str = "rcv") -> int:
    """The receiver's Registration Complete events (one per source it registered for)."""
    return len(d.events(name, ev.ReceiverRegistrationComplete))


# --- item 8: every source of the topic ---------------------------------------------------------


def test_a_receiver_joins_both_sources_of_its_topic_and_delivers_each_in_order() -> None:
    d = deployment()
    d.add_source("a", TOPIC)
    d.add_source("b", TOPIC)
    d.add_receiver("rcv", TOPIC)
    assert d.run_until(lambda: registered(d, ["a", "b"]) and completions(d) == 2, 15)
    send(d, ["a", "b"], 50)
    d.run(2)
    got = by_source(d)
    assert got == {source_string(d, "a"): expected(d, "a", 50),
                   source_string(d, "b"): expected(d, "b", 50)}
    # a registration per source at the store, each with a RegID of its own, each acknowledged
    store = d.stores["store0"]
    assert len(store.receivers) == 2
    assert {r.source_reg_id for r in store.receivers.values()} == set(store.sources)
    assert [r.last_ack for r in store.receivers.values()] == [49, 49]
    successes = d.events("rcv", ev.ReceiverRegistrationSuccess)
    assert len(successes) == 2 and len({s.reg_id for s in successes}) == 2  # type: ignore
    assert len(d.events("rcv", ev.ReceiverRegistrationComplete)) == 2


def test_a_late_receiver_recovers_both_sources_from_one_store() -> None:
    # both sources use topic index 1 and the same store: the retransmissions on the one
    # connection to the store must each reach the session that asked for them
    d = deployment()
    d.add_source("a", TOPIC)
    d.add_source("b", TOPIC)
    assert d.run_until(lambda: registered(d, ["a", "b"]), 10)
    assert d.sources["a"].topic_idx == d.sources["b"].topic_idx
    send(d, ["a", "b"], 120)
    d.run(1)
    rcv: ReceiverCore = d.add_receiver("rcv", TOPIC,
                                       retransmit_request_outstanding_maximum=7)
    assert d.run_until(lambda: sum(len(v) for v in by_source(d).values()) >= 240, 30)
    send(d, ["a", "b"], 10)
    d.run(2)
    got = by_source(d)
    assert got == {source_string(d, "a"): expected(d, "a", 130),
                   source_string(d, "b"): expected(d, "b", 130)}
    assert rcv.stats["retransmissions"] >= 240
    assert not d.events("rcv", ev.UnrecoverableLoss)


def test_each_source_with_its_own_store() -> None:
    d = deployment(stores=2)
    d.add_source("a", TOPIC, stores=["store0"])
    d.add_source("b", TOPIC, stores=["store1"])
    assert d.run_until(lambda: registered(d, ["a", "b"]), 10)
    send(d, ["a", "b"], 30)
    d.run(1)
    d.add_receiver("rcv", TOPIC)
    assert d.run_until(lambda: sum(len(v) for v in by_source(d).values()) >= 60, 20)
    assert by_source(d) == {source_string(d, "a"): expected(d, "a", 30),
                            source_string(d, "b"): expected(d, "b", 30)}
    assert [len(d.stores[s].receivers) for s in ("store0", "store1")] == [1, 1]


def test_explicit_acks_name_their_source() -> None:
    d = deployment()
    d.add_source("a", TOPIC)
    d.add_source("b", TOPIC)
    rcv: ReceiverCore = d.add_receiver("rcv", TOPIC, ume_explicit_ack_only=1)
    assert d.run_until(lambda: completions(d) == 2, 15)
    send(d, ["a", "b"], 10)
    d.run(1)
    rcv.ack(6, source=source_string(d, "b"))
    d.run(1)
    store = d.stores["store0"]
    acks = {store.sources[r.source_reg_id].request_addr: r.last_ack
            for r in store.receivers.values()}
    assert acks == {d.sources["a"].request_addr: None, d.sources["b"].request_addr: 6}


# --- item 11: a source that starts while the receiver runs -----------------------------------


def test_a_running_receiver_gets_a_new_source_on_the_transport_of_a_finished_one() -> None:
    d = deployment()
    d.add_source("src", TOPIC)
    rcv: ReceiverCore = d.add_receiver("rcv", TOPIC)
    assert d.run_until(lambda: rcv.complete and d.sources["src"].complete, 10)
    send(d, ["src"], 20)
    d.run(1)
    first_reg = {r.reg_id for r in d.stores["store0"].receivers.values()}
    d.kill("src")
    d.run(2)
    # a new source on the same address and port, without Session ID or saved RegID
    new: SourceCore = d.restart("src")  # type: ignore[assignment]
    assert d.run_until(lambda: new.complete, 10)
    assert new.next_sqn == 0
    assert d.run_until(lambda: completions(d) == 2, 10)
    send(d, ["src"], 15)
    d.run(2)
    name = source_string(d, "src")
    assert by_source(d)[name] == expected(d, "src", 20) + expected(d, "src", 15)
    assert not d.events("rcv", ev.ReceiverRegistrationError)
    assert not d.events("store0", ev.ClientRejected)
    store = d.stores["store0"]
    (new_reg,) = [r for r in store.receivers.values() if r.reg_id not in first_reg]
    assert new_reg.last_ack == 14


def test_a_running_receiver_joins_a_second_source_that_starts_later() -> None:
    d = deployment()
    d.add_source("a", TOPIC)
    rcv: ReceiverCore = d.add_receiver("rcv", TOPIC)
    assert d.run_until(lambda: rcv.complete and d.sources["a"].complete, 10)
    send(d, ["a"], 10)
    d.run(15)  # long after the receiver resolved its topic
    d.add_source("b", TOPIC)
    assert d.run_until(lambda: registered(d, ["a", "b"]) and completions(d) == 2, 15)
    send(d, ["a", "b"], 10)
    d.run(2)
    got = by_source(d)
    assert got[source_string(d, "a")] == expected(d, "a", 20)
    assert got[source_string(d, "b")] == expected(d, "b", 10)


def test_a_source_restarted_on_another_transport_goes_on_in_the_same_order() -> None:
    # the same source (its Session ID gets it its RegID back) comes back on another address:
    # the receiver's registrations and delivery order go on, nothing twice, nothing missing
    d = deployment()
    # the store frees the RegID 2 s after the source fell silent and keeps its state
    keep = {"ume_session_id": 0x77, "ume_activity_timeout": 2000, "ume_state_lifetime": 600_000}
    d.add_source("a", TOPIC, **keep)  # type: ignore[arg-type]
    d.add_receiver("rcv", TOPIC)
    assert d.run_until(lambda: completions(d) == 1 and d.sources["a"].complete, 10)
    send(d, ["a"], 20)
    d.run(1)
    d.kill("a")
    d.run(1)
    moved = d.add_source("a2", TOPIC, **keep)  # type: ignore[arg-type]
    assert d.run_until(lambda: moved.complete, 20)
    assert moved.next_sqn == 20
    for _ in range(15):
        moved.send(b"a2:%d" % moved.next_sqn)
        d.run(0.001)
    d.run(2)
    got = by_source(d)
    assert got[source_string(d, "a")] == expected(d, "a", 20)
    assert got[source_string(d, "a2")] == [(i, b"a2:%d" % i) for i in range(20, 35)]
    assert len(d.stores["store0"].receivers) == 1  # the same receiver registration


# --- the delivery log of ump receiver --out ----------------------------------------------------


def test_the_delivery_log_names_the_source_and_dedupe_floors_are_per_source(
        tmp_path: Path) -> None:
    path = tmp_path / "deliveries.jsonl"
    with path.open("w") as out:
        log = DeliveryLog(out)
        for sqn, source in [(0, "TCP:10.0.0.5:14371"), (1, "TCP:10.0.0.5:14371"),
                            (0, "TCP:10.0.0.6:14371")]:
            log(None, ev.MessageDelivered(sqn, b"p%d" % sqn, False, source))  # type: ignore
        out.write('{"sqn": 7, "rx"')  # a line cut by a crash
    rows = [json.loads(line) for line in path.read_text().splitlines()[:3]]
    assert rows[0] == {"sqn": 0, "rx": False, "payload": "p0", "source": "TCP:10.0.0.5:14371"}
    floors = DeliveryFloors.read(path)
    assert floors.highest == {"TCP:10.0.0.5:14371": 1, "TCP:10.0.0.6:14371": 0}
    assert floors.seen(ev.MessageDelivered(1, b"", False, "TCP:10.0.0.5:14371"))
    # the second source's 1 is new, though the first source's log is past it
    assert not floors.seen(ev.MessageDelivered(1, b"", False, "TCP:10.0.0.6:14371"))
    assert not floors.seen(ev.MessageDelivered(0, b"", False, "TCP:10.0.0.7:14371"))
    # an older log without sources: its floor holds for every source
    path.write_text('{"sqn": 5, "rx": false}\n')
    assert DeliveryFloors.read(path).seen(ev.MessageDelivered(5, b"", False, "TCP:1.2.3.4:1"))
    assert not DeliveryFloors.read(tmp_path / "none.jsonl").seen(ev.MessageDelivered(0, b""))


# --- the receiver core alone: two sources, one store, the same topic index ---------------------


class TwoSources:
    """A receiver core fed by hand: two sources (both topic index 1) registered at one store
    over the receiver's one connection to it; the test answers its RXREQs as a store would,
    in order, leaving out what ``silent`` names."""

    STORE: tuple[str, int] = ("10.0.0.2", 14567)
    SOURCES = [(("10.0.0.3", 14371), ("10.0.0.3", 14391)),
               (("10.0.0.4", 14371), ("10.0.0.4", 14391))]

    def __init__(self, high: int, **options: int) -> None:
        self.rcv = ReceiverCore(TOPIC, ReceiverConfig(**options),  # type: ignore[arg-type]
                                ip="10.0.0.9",
                                request_port=14392)
        self.now = 0.0
        self.framer = LbttcpStream()
        self.store_key: ConnKey = (("10.0.0.9", 50002), self.STORE)
        tirs: list[lbmr.Record] = [lbmr.Tir(name=TOPIC, ttl=1, index=1,
                         info=lbmr.TcpInfo(ip=t[0], port=t[1]),
                         options=[lbmr.ToptUme(store=1, src_tcp_port=r[1], src_tcp_addr=r[0],
                                               transport_idx=1)])
                 for t, r in self.SOURCES]
        self.rcv.receive(lbmr.LbmrPacket(tirs=tirs).build(), ("10.0.0.1", 15380), 0.0)
        for i, (transport, _) in enumerate(self.SOURCES):
            key: ConnKey = (("10.0.0.9", 50010 + i), transport)
            self.event(StreamEventKind.CONNECTED, key)
            self.event(StreamEventKind.DATA, key, control(
                Sri(version=1, low_sqn=0, high_sqn=high, initial_sqn_known=1), TopicIdx(tidx=1),
                UmeStoreExt(grp_idx=0, store_tcp_port=self.STORE[1], store_idx=0,
                            store_ip_addr=self.STORE[0], src_reg_id=70 + i, version=0)))
        self.event(StreamEventKind.CONNECTED, self.store_key)
        pregs = self.written()
        assert len(pregs) == 2
        for preg in pregs:  # the store answers each PREG, echoing its marker
            header = preg.header(UmePreg)
            assert header is not None
            self.event(StreamEventKind.DATA, self.store_key, control(UmePregResp(
                marker=header.marker, reg_id=900 + header.src_reg_id, transport_idx=1,
                topic_idx=1, low_seqnum=0, high_seqnum=high)))
        self.payloads = {900 + 70 + i: [b"src%d:%d" % (i, s) for s in range(high + 1)]
                         for i in range(2)}

    def event(self, kind: StreamEventKind, key: ConnKey, data: bytes = b"") -> None:
        self.rcv.stream_event(StreamEvent(kind, key, data), self.now)

    def written(self) -> list[LbmcMessage]:
        """The messages the receiver wrote to the store since the last call."""
        out = []
        for c in self.rcv.stream_commands(self.now):
            if isinstance(c, StreamWrite) and c.conn == self.store_key:
                out += [i.message for i in self.framer.feed(c.data) if i.message is not None]
        return out

    def answer(self, silent: set[tuple[int, int]]) -> int:
        """Answer every RXREQ written so far, in order, as one chunk; returns how many."""
        parts = []
        asked = 0
        for message in self.written():
            rx = message.header(UmeRxreq)
            if rx is None:
                continue
            asked += 1
            if (rx.id_2, rx.seqnum) not in silent:
                parts.append(data_message(1, rx.seqnum, self.payloads[rx.id_2][rx.seqnum],
                                          MessageType.RETRANS))
        if parts:
            self.event(StreamEventKind.DATA, self.store_key, b"".join(parts))
        return asked


def test_retransmissions_of_two_sources_on_one_store_connection_reach_their_session() -> None:
    high = 60
    rig = TwoSources(high, retransmit_request_outstanding_maximum=5,
                     retransmit_request_interval=100, retransmit_request_message_timeout=1000)
    silent = {(971, 7), (971, 8), (970, 30)}  # no store has these
    for _ in range(400):
        if not rig.answer(silent):
            rig.now += 0.1
            rig.rcv.handle_timer(rig.now)
        if not any(s.requests or s.missing for s in rig.rcv.sessions.values()):
            break
    events = rig.rcv.events()
    got: dict[str, list[tuple[int, bytes]]] = {}
    for e in events:
        if isinstance(e, ev.MessageDelivered):
            got.setdefault(e.source, []).append((e.sequence_number, e.payload))
    for i, (transport, _) in enumerate(rig.SOURCES):
        missing = {s for reg, s in silent if reg == 970 + i}
        assert got[f"TCP:{transport[0]}:{transport[1]}"] == [
            (s, b"src%d:%d" % (i, s)) for s in range(high + 1) if s not in missing]
    assert sorted((e.first, e.last) for e in events if isinstance(e, ev.UnrecoverableLoss)) \
        == [(7, 8), (30, 30)]
    assert rig.rcv._owed == {}  # nothing left waiting for a store that never answers


def test_advertisements_of_more_sources_than_a_receiver_joins_are_dropped() -> None:
    rcv = ReceiverCore(TOPIC, ReceiverConfig(), ip="10.0.0.9", request_port=14392)
    tirs: list[lbmr.Record] = [
        lbmr.Tir(name=TOPIC, ttl=1, index=1, info=lbmr.TcpInfo(ip=f"10.1.{i // 200}.{i % 200}",
                                                              port=14371))
        for i in range(MAX_SOURCES + 5)]
    rcv.receive(lbmr.LbmrPacket(tirs=tirs).build(), ("10.0.0.1", 15380), 0.0)
    assert len(rcv.sessions) == MAX_SOURCES
    dropped = [e for e in rcv.events() if isinstance(e, ev.InputDropped)]
    assert len(dropped) == 5 and "already 127 sources" in dropped[0].reason


def test_a_source_gone_for_good_is_forgotten_and_its_keepalives_stop() -> None:
    d = deployment()
    d.add_source("a", TOPIC)
    rcv: ReceiverCore = d.add_receiver("rcv", TOPIC)
    assert d.run_until(lambda: completions(d) == 1 and d.sources["a"].complete, 10)
    send(d, ["a"], 5)
    d.run(1)
    d.kill("a")
    d.run(DORMANT_LIFETIME - 10)
    assert len(rcv.sessions) == 1  # kept a while: the source may come back
    d.run(20)
    assert rcv.sessions == {} and rcv._deadlines.keys() == {"resolve"}
    assert any("source gone" in getattr(e, "text", "") for e in d.events("rcv"))


def test_at_the_source_limit_the_session_down_longest_gives_way() -> None:
    rcv = ReceiverCore(TOPIC, ReceiverConfig(), ip="10.0.0.9", request_port=14392)

    def advertise(i: int) -> None:
        tir = lbmr.Tir(name=TOPIC, ttl=1, index=1,
                       info=lbmr.TcpInfo(ip=f"10.1.{i // 200}.{i % 200}", port=14371))
        rcv.receive(lbmr.LbmrPacket(tirs=[tir]).build(), ("10.0.0.1", 15380), 0.0)

    for i in range(MAX_SOURCES):
        advertise(i)
    # one source's transport refuses the connection: that session is down from then on
    first = rcv.sessions[(("10.1.0.3", 14371), 1)]
    conn = rcv.connection_to(("10.1.0.3", 14371))
    assert conn is not None
    rcv.stream_event(StreamEvent(StreamEventKind.REFUSED, conn.key), 1.0)
    assert first.down_since == 1.0
    advertise(MAX_SOURCES)
    assert len(rcv.sessions) == MAX_SOURCES and first.key not in rcv.sessions
    assert (("10.1.0.127", 14371), 1) in rcv.sessions


def test_messages_sent_before_the_receiver_joined_the_transport_are_recovered() -> None:
    # registration completes before the source sent anything the store holds (high -1); the
    # first live message the receiver sees is 3: 0..2 (sent before it joined the transport)
    # must be asked of the store, not waited for
    rcv = ReceiverCore(TOPIC, ReceiverConfig(), ip="10.0.0.9", request_port=14392)
    transport, request, store = ("10.0.0.3", 14371), ("10.0.0.3", 14391), ("10.0.0.2", 14567)
    tir = lbmr.Tir(name=TOPIC, ttl=1, index=1, info=lbmr.TcpInfo(ip=transport[0],
                                                                port=transport[1]),
                   options=[lbmr.ToptUme(store=1, src_tcp_port=request[1],
                                         src_tcp_addr=request[0], transport_idx=1)])
    rcv.receive(lbmr.LbmrPacket(tirs=[tir]).build(), ("10.0.0.1", 15380), 0.0)
    tkey: ConnKey = (("10.0.0.9", 50001), transport)
    skey: ConnKey = (("10.0.0.9", 50002), store)
    rcv.stream_event(StreamEvent(StreamEventKind.CONNECTED, tkey), 0.0)
    rcv.stream_event(StreamEvent(StreamEventKind.DATA, tkey, control(
        Sri(version=1, low_sqn=0, high_sqn=0, initial_sqn_known=1), TopicIdx(tidx=1),
        UmeStoreExt(grp_idx=0, store_tcp_port=store[1], store_idx=0, store_ip_addr=store[0],
                    src_reg_id=70, version=0))), 0.0)
    rcv.stream_event(StreamEvent(StreamEventKind.CONNECTED, skey), 0.0)
    rcv.stream_event(StreamEvent(StreamEventKind.DATA, skey, control(UmePregResp(
        marker=1, reg_id=90, transport_idx=1, topic_idx=1, low_seqnum=0, high_seqnum=0))), 0.0)
    assert rcv.complete
    rcv.stream_commands(0.0)
    rcv.stream_event(StreamEvent(StreamEventKind.DATA, tkey, b"".join(
        data_message(1, s, b"live %d" % s, MessageType.MESSAGE) for s in range(3, 6))), 0.1)
    framer = LbttcpStream()
    asked = [i.message.header(UmeRxreq).seqnum  # type: ignore[union-attr]
             for c in rcv.stream_commands(0.1) if isinstance(c, StreamWrite) and c.conn == skey
             for i in framer.feed(c.data)
             if i.message is not None and i.message.header(UmeRxreq) is not None]
    assert asked == [0, 1, 2]
    rcv.stream_event(StreamEvent(StreamEventKind.DATA, skey, b"".join(
        data_message(1, s, b"stored %d" % s, MessageType.RETRANS) for s in asked)), 0.2)
    assert [e.sequence_number for e in rcv.events() if isinstance(e, ev.MessageDelivered)] \
        == list(range(6))
