"""LBT-RU transport sessions: handshake, in-order exactly-once delivery, NAK/retransmission,
NCF, session messages, liveness, reset, sequence wrap, and tshark agreement on the traffic."""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl.fastmsg import data_message
from reference_impl.lbtru_session import (
    SQN_MASK,
    ClientConnected,
    ClientTimedOut,
    Connected,
    ConnectFailed,
    Delivered,
    Event,
    LbtruReceiverSession,
    LbtruReceiverSettings,
    LbtruSourceSession,
    LbtruSourceSettings,
    Lost,
    SessionReset,
    SourceTimedOut,
    unwrap,
)
from wire import lbtru
from wire.dissect import check_against_tshark, dissect_file
from wire.pcap import udp_frame, write_pcap

SOURCE = ("10.0.0.3", 14380)
RECEIVER = ("10.0.0.4", 14360)
RECEIVER_2 = ("10.0.0.5", 14361)

Drop = Callable[[bytes, tuple[str, int], tuple[str, int]], bool]


def payload(i: int) -> bytes:
    return data_message(tidx=1, sqn=i, payload=i.to_bytes(4, "big") * 4)


@dataclass
class Net:
    """Carries datagrams between sessions after ``delay``; ``drop`` decides losses.  Records
    every delivered datagram (for the pcap) and every event."""

    source: LbtruSourceSession | None
    receivers: dict[tuple[str, int], LbtruReceiverSession] = field(default_factory=dict)
    delay: float = 0.001
    drop: Drop = lambda data, src, dst: False
    now: float = 0.0
    trace: list[tuple[float, tuple[str, int], tuple[str, int], bytes]] = field(
        default_factory=list)
    events: list[tuple[str, Event]] = field(default_factory=list)
    _queue: list[tuple[float, int, tuple[str, int], tuple[str, int], bytes]] = field(
        default_factory=list)
    _order: itertools.count[int] = field(default_factory=itertools.count)

    def nodes(self) -> list[tuple[tuple[str, int], LbtruSourceSession | LbtruReceiverSession]]:
        out: list[tuple[tuple[str, int], LbtruSourceSession | LbtruReceiverSession]] = []
        if self.source is not None:
            out.append((SOURCE, self.source))
        out.extend(self.receivers.items())
        return out

    def collect(self) -> None:
        for addr, node in self.nodes():
            for data, dst in node.datagrams_to_send(self.now):
                if not self.drop(data, addr, dst):
                    heapq.heappush(self._queue,
                                   (self.now + self.delay, next(self._order), addr, dst, data))
            while (event := node.next_event()) is not None:
                self.events.append(("source" if addr == SOURCE else f"r{addr[1]}", event))

    def run_until(self, end: float) -> None:
        self.collect()
        while True:
            timers = [(t, addr) for addr, n in self.nodes() if (t := n.get_timer()) is not None]
            t_timer = min(timers)[0] if timers else None
            t_packet = self._queue[0][0] if self._queue else None
            t_next = min(t for t in (t_timer, t_packet) if t is not None) \
                if (t_timer is not None or t_packet is not None) else None
            if t_next is None or t_next > end:
                self.now = end
                return
            self.now = t_next
            if t_packet is not None and t_packet == t_next:
                _, _, src, dst, data = heapq.heappop(self._queue)
                node = self.source if dst == SOURCE else self.receivers.get(dst)
                if node is not None:
                    self.trace.append((self.now, src, dst, data))
                    node.receive(data, src, self.now)
            else:
                for _, node in self.nodes():
                    timer = node.get_timer()
                    if timer is not None and timer <= self.now:
                        node.handle_timer(self.now)
            self.collect()

    def send(self, data: bytes) -> int:
        assert self.source is not None
        sqn = self.source.send(data, self.now)
        self.collect()
        return sqn

    def of(self, who: str, kind: type) -> list:
        return [e for w, e in self.events if w == who and isinstance(e, kind)]

    def write_pcap(self, path: Path) -> None:
        frames = [udp_frame(s[0], s[1], d[0], d[1], data) for _, s, d, data in self.trace]
        write_pcap(path, frames)


def connected_net(session_id: int = 0x1234, *, source_settings: LbtruSourceSettings | None = None,
                  receiver_settings: LbtruReceiverSettings | None = None,
                  receivers: tuple[tuple[str, int], ...] = (RECEIVER,)) -> Net:
    src = LbtruSourceSession(source_settings or LbtruSourceSettings(session_id=session_id))
    net = Net(src)
    for i, addr in enumerate(receivers):
        net.receivers[addr] = LbtruReceiverSession(SOURCE, session_id, receiver_settings, seed=i)
    net.run_until(0.05)
    return net


def delivered(net: Net, who: str = "r14360") -> list[int]:
    return [e.sqn for e in net.of(who, Delivered)]


def packet_type(data: bytes) -> int:
    return lbtru.VER_TYPE_BITS["type"].get(lbtru.COMMON.unpack_from(data)[0])


def test_handshake_assigns_client_ids_and_starts_at_the_next_sequence_number() -> None:
    net = connected_net(receivers=(RECEIVER, RECEIVER_2))
    assert [e.client_id for e in net.of("source", ClientConnected)] == [1, 2]
    assert net.of("r14360", Connected) == [Connected(client_id=1, next_sqn=0)]
    assert net.of("r14361", Connected) == [Connected(client_id=2, next_sqn=0)]
    first = next(lbtru.parse_packet(d) for _, s, _, d in net.trace if s == RECEIVER)
    assert isinstance(first, lbtru.LbtruCreq) and first.session_id == 0x1234
    syn = [lbtru.parse_packet(d) for _, s, dst, d in net.trace if s == SOURCE and dst == RECEIVER]
    assert isinstance(syn[0], lbtru.LbtruSm) and syn[0].syn and syn[0].client_id == 1
    assert syn[0].lead_sqn == SQN_MASK and syn[0].trail_sqn == 0  # nothing sent yet


def test_a_late_receiver_starts_after_the_lead() -> None:
    net = connected_net()
    for i in range(5):
        net.send(payload(i))
    net.receivers[RECEIVER_2] = LbtruReceiverSession(SOURCE, 0x1234, seed=9, now=net.now)
    net.run_until(net.now + 0.05)
    net.send(payload(5))
    net.run_until(net.now + 0.05)
    assert net.of("r14361", Connected)[0].next_sqn == 5
    assert delivered(net, "r14361") == [5]
    assert delivered(net) == [0, 1, 2, 3, 4, 5]


def test_every_message_arrives_once_in_order_without_loss() -> None:
    net = connected_net()
    for i in range(100):
        net.send(payload(i))
        net.run_until(net.now + 0.0005)
    net.run_until(net.now + 1)
    events = net.of("r14360", Delivered)
    assert [e.sqn for e in events] == list(range(100))
    assert [e.payload for e in events] == [payload(i) for i in range(100)]
    assert not any(e.retransmission for e in events)
    assert net.receivers[RECEIVER].stats["naks"] == 0


def drop_first_data(sqns: set[int]) -> Drop:
    """Lose the first transmission of DATA ``sqns`` to the receiver."""
    def drop(data: bytes, src: tuple[str, int], dst: tuple[str, int]) -> bool:
        if src == SOURCE and packet_type(data) == lbtru.PacketType.DATA:
            _, _, flags, sqn, _ = lbtru.data_header(data)
            return sqn in sqns and not flags & lbtru.FLAG_RX
        return False
    return drop


def test_a_gap_is_naked_and_filled_by_retransmissions() -> None:
    net = connected_net()
    net.drop = drop_first_data({3, 4, 7})
    for i in range(10):
        net.send(payload(i))
    net.run_until(net.now + 1)
    events = net.of("r14360", Delivered)
    assert [e.sqn for e in events] == list(range(10))
    assert {e.sqn for e in events if e.retransmission} == {3, 4, 7}
    naks = [lbtru.parse_packet(d) for _, s, _, d in net.trace
            if s == RECEIVER and packet_type(d) == lbtru.PacketType.NAK]
    assert sorted(n for p in naks for n in p.naks) == [3, 4, 7]
    assert all(p.client_id == 1 and p.session_id == 0x1234 for p in naks)
    assert net.source is not None and net.source.stats["retransmissions"] == 3


def test_a_lost_newest_message_is_found_by_the_session_message() -> None:
    net = connected_net()
    net.drop = drop_first_data({4})
    for i in range(5):
        net.send(payload(i))
    net.run_until(net.now + 0.15)
    assert delivered(net) == [0, 1, 2, 3]  # nothing after 4 tells the receiver yet
    net.run_until(net.now + 1)  # SM at 200 ms reveals lead 4
    assert delivered(net) == [0, 1, 2, 3, 4]


def test_session_messages_back_off_while_idle() -> None:
    net = connected_net()
    net.send(payload(0))
    start = net.now
    net.run_until(start + 45)
    times = [t - start for t, s, _, d in net.trace
             if s == SOURCE and packet_type(d) == lbtru.PacketType.SM and t > start]
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(times)]
    assert round(times[0], 3) == 0.201  # 200 ms after the DATA, plus the link delay
    assert gaps[:6] == [0.4, 0.8, 1.6, 3.2, 6.4, 10.0]
    assert set(gaps[6:]) == {10.0}


def test_a_message_older_than_the_window_gets_ncf_do_not_retry_and_is_lost() -> None:
    size = len(payload(0))
    net = connected_net(source_settings=LbtruSourceSettings(
        session_id=0x1234, transmission_window_size=3 * size))
    net.drop = drop_first_data({1})
    for i in range(8):  # 1 falls out of the 3-message window before the receiver NAKs
        net.send(payload(i))
    net.run_until(net.now + 1)
    lost = net.of("r14360", Lost)
    assert lost and lost[0].first == 1 and lost[0].last == 1
    assert delivered(net) == [0, 2, 3, 4, 5, 6, 7]


def test_ncf_do_not_retry_is_sent_for_a_nak_behind_the_trail() -> None:
    size = len(payload(0))
    src = LbtruSourceSession(LbtruSourceSettings(session_id=7, transmission_window_size=size))
    src.receive(lbtru.LbtruCreq(options=[lbtru.SidOption(session_id=7)]).build(), RECEIVER, 0)
    for i in range(5):
        src.send(payload(i), 0.1)
    src.datagrams_to_send(0.1)
    src.receive(lbtru.LbtruNak(naks=[1, 4], options=[lbtru.SidOption(session_id=7)]).build(),
                RECEIVER, 0.2)
    out = [lbtru.parse_packet(d) for d, _ in src.datagrams_to_send(0.2)]
    ncf = [p for p in out if isinstance(p, lbtru.LbtruNcf)]
    rx = [p for p in out if isinstance(p, lbtru.LbtruData)]
    assert [p.sqn for p in rx] == [4] and rx[0].rx
    assert len(ncf) == 1 and ncf[0].reason == lbtru.NcfReason.NO_RETRY and ncf[0].ncfs == [1]
    assert ncf[0].trail_sqn == 4 and ncf[0].session_id == 7


def test_a_repeated_nak_inside_the_ignore_interval_gets_ncf_ignored() -> None:
    src = LbtruSourceSession(LbtruSourceSettings())
    src.receive(lbtru.LbtruCreq().build(), RECEIVER, 0)
    for i in range(3):
        src.send(payload(i), 0.1)
    src.datagrams_to_send(0.1)
    nak = lbtru.LbtruNak(naks=[1]).build()

    def answer(now: float) -> list[lbtru.LbtruPacket]:
        src.receive(nak, RECEIVER, now)
        return [lbtru.parse_packet(d) for d, _ in src.datagrams_to_send(now)]

    assert isinstance(answer(0.2)[0], lbtru.LbtruData)
    again = answer(0.5)  # 300 ms later: ignored
    assert isinstance(again[0], lbtru.LbtruNcf)
    assert again[0].reason == lbtru.NcfReason.IGNORED
    assert isinstance(answer(0.71)[0], lbtru.LbtruData)  # 510 ms after the retransmission


def test_unrecoverable_gap_is_lost_after_the_nak_generation_interval() -> None:
    net = connected_net(receiver_settings=LbtruReceiverSettings(nak_generation_interval=2.0))

    def drop(data: bytes, src: tuple[str, int], dst: tuple[str, int]) -> bool:
        return drop_first_data({2})(data, src, dst) or packet_type(data) == lbtru.PacketType.NAK

    net.drop = drop
    for i in range(5):
        net.send(payload(i))
    net.run_until(net.now + 1.9)
    assert delivered(net) == [0, 1]
    net.run_until(net.now + 0.3)
    assert net.of("r14360", Lost) == [Lost(2, 2, "timeout")]
    assert delivered(net) == [0, 1, 3, 4]


def test_creq_is_retried_then_the_receiver_gives_up() -> None:
    sent: list[float] = []
    net = Net(None)
    net.drop = lambda data, src, dst: sent.append(net.now) is not None  # nobody answers
    net.receivers[RECEIVER] = LbtruReceiverSession(SOURCE, 0)
    net.run_until(10)
    assert len(sent) == 50
    assert {round(b - a, 3) for a, b in itertools.pairwise(sent)} == {0.1}
    assert net.of("r14360", ConnectFailed) == [ConnectFailed(50)]
    assert net.receivers[RECEIVER].get_timer() is None


def test_creq_retry_gets_an_answer_when_the_first_syn_is_lost() -> None:
    net = connected_net(receivers=())
    lost_syn = [True]

    def drop(data: bytes, src: tuple[str, int], dst: tuple[str, int]) -> bool:
        if src == SOURCE and packet_type(data) == lbtru.PacketType.SM and lost_syn[0]:
            lost_syn[0] = False
            return True
        return False

    net.drop = drop
    net.receivers[RECEIVER] = LbtruReceiverSession(SOURCE, 0x1234, now=net.now)
    net.run_until(net.now + 0.5)
    assert len(net.of("r14360", Connected)) == 1
    assert len(net.of("source", ClientConnected)) == 1  # the second CREQ is the same client


def test_silent_clients_and_sources_time_out() -> None:
    net = connected_net()
    start = net.now
    net.drop = lambda data, src, dst: src == RECEIVER  # the receiver's ACKs stop arriving
    net.run_until(start + 10.5)
    assert [e.client_id for e in net.of("source", ClientTimedOut)] == [1]
    assert net.source is not None and not net.source.clients
    net.drop = lambda data, src, dst: True
    net.run_until(start + 70)
    timed_out = net.of("r14360", SourceTimedOut)
    assert len(timed_out) == 1 and timed_out[0].silent_for >= 60


def test_a_restarted_source_resets_its_receivers_who_reconnect() -> None:
    net = connected_net()
    for i in range(3):
        net.send(payload(i))
    net.run_until(net.now + 0.5)
    net.source = LbtruSourceSession(LbtruSourceSettings(session_id=0x1234), now=net.now)
    net.run_until(net.now + 0.5)  # the next ACK meets a source that does not know it: RST
    assert net.of("r14360", SessionReset) == [SessionReset()]
    assert len(net.of("r14360", Connected)) == 2
    net.send(payload(100))
    net.run_until(net.now + 0.5)
    assert delivered(net) == [0, 1, 2, 0]  # the new session numbers from 0 again


def test_sequence_numbers_wrap_around() -> None:
    src = LbtruSourceSession(LbtruSourceSettings(session_id=1))
    src.next_sqn = SQN_MASK - 2
    net = Net(src)
    net.receivers[RECEIVER] = LbtruReceiverSession(SOURCE, 1)
    net.run_until(0.05)
    net.drop = drop_first_data({SQN_MASK, 1})
    for i in range(6):
        net.send(payload(i))
    net.run_until(net.now + 1)
    assert delivered(net) == [SQN_MASK - 2, SQN_MASK - 1, SQN_MASK, 0, 1, 2]
    assert unwrap(2, SQN_MASK) == SQN_MASK + 3


def test_data_of_another_session_or_from_another_address_is_ignored() -> None:
    net = connected_net()
    rcv = net.receivers[RECEIVER]
    other = lbtru.LbtruData(sqn=0, trail_sqn=0, options=[lbtru.SidOption(session_id=99)],
                            payload=payload(0)).build()
    rcv.receive(other, SOURCE, net.now)
    rcv.receive(lbtru.LbtruData(sqn=0, trail_sqn=0, options=[lbtru.SidOption(session_id=0x1234)],
                                payload=payload(0)).build(), ("10.9.9.9", 14380), net.now)
    rcv.receive(b"\x0f\x00", SOURCE, net.now)  # not LBT-RU at all
    assert rcv.next_event() is None
    assert rcv.stats["delivered"] == 0


def test_duplicates_are_dropped_and_not_kept() -> None:
    net = connected_net()
    for i in range(5):
        net.send(payload(i))
    net.run_until(net.now + 0.1)
    rcv = net.receivers[RECEIVER]
    for _, src, _, data in list(net.trace):
        if src == SOURCE and packet_type(data) == lbtru.PacketType.DATA:
            rcv.receive(data, SOURCE, net.now)  # every DATA again
    net.run_until(net.now + 0.1)
    assert delivered(net) == [0, 1, 2, 3, 4]
    assert rcv.stats["duplicates"] == 5
    assert not rcv.state.buffer and not rcv.state.missing


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), loss=st.floats(0.0, 0.3),
       count=st.integers(1, 120))
def test_lossy_links_deliver_everything_once_in_order(seed: int, loss: float, count: int) -> None:
    """Random loss both ways (the handshake excepted): with the default window every message
    is recovered, delivered once and in order."""
    rng = random.Random(seed)
    net = connected_net()
    net.drop = lambda data, src, dst: rng.random() < loss
    for i in range(count):
        net.send(payload(i))
        net.run_until(net.now + rng.random() * 0.002)
    net.run_until(net.now + 30)
    assert delivered(net) == list(range(count))
    assert net.of("r14360", Lost) == []
    assert not net.receivers[RECEIVER].state.buffer


@pytest.mark.oracle
def test_tshark_agrees_on_every_packet_type(tmp_path: Path) -> None:
    """A lossy session with a restart: CREQ, SM SYN, SM, DATA, DATA(RX), NAK, NCF, ACK and RST
    all appear and tshark decodes each with our values, nothing malformed."""
    size = len(payload(0))
    settings_ = LbtruSourceSettings(session_id=0x1234, transmission_window_size=4 * size)
    net = connected_net(source_settings=settings_, receivers=(RECEIVER, RECEIVER_2))
    net.drop = drop_first_data({2, 9})
    for i in range(12):
        net.send(payload(i))
    net.run_until(net.now + 1)
    net.source = LbtruSourceSession(settings_, now=net.now)  # restart: RST to both
    net.run_until(net.now + 0.5)
    net.send(payload(0))
    net.run_until(net.now + 0.5)
    kinds = {(lbtru.parse_packet(d).info().split(" sqn")[0].split(" ")[0]) for _, _, _, d in
             net.trace}
    assert {"DATA", "DATA(RX)", "SM", "NAK", "NCF", "ACK", "CREQ", "RST"} <= kinds
    path = tmp_path / "lbtru.pcap"
    net.write_pcap(path)
    reports = list(dissect_file(path))
    assert all(r.status == "um" and r.transport == "lbtru" for r in reports)
    assert check_against_tshark(path, reports) == []
