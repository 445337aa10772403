"""Receiver recovery bookkeeping: :class:`reference_impl.receiver.Gaps` against a set model, and
the receiver core alone recovering from a store played by the test (every RXREQ it writes is
answered, late, or never), checked for what recovery promises: never more requests outstanding
than ``retransmit_request_outstanding_maximum``, every sequence number delivered once and in
order, unanswered ones reported as :class:`UnrecoverableLoss` after the message timeout, and a
cost per message that does not grow with the number missing.
"""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_impl.context import control
from reference_impl.events import MessageDelivered, UnrecoverableLoss
from reference_impl.fastmsg import data_message
from reference_impl.receiver import Gaps, ReceiverConfig, ReceiverCore
from reference_impl.sim import ConnKey, StreamEvent, StreamEventKind, StreamWrite
from wire import lbmr
from wire.lbmc import (
    MessageType,
    Sri,
    TopicIdx,
    UmePregResp,
    UmeRxreq,
    UmeStoreExt,
)
from wire.lbttcp import LbttcpStream

TOPIC = "recover.me"
TRANSPORT = ("10.0.0.3", 14371)
REQUEST = ("10.0.0.3", 14391)
STORES = [("10.0.0.2", 14567), ("10.0.0.5", 14567)]
TRANSPORT_CONN: ConnKey = (("10.0.0.4", 50001), TRANSPORT)


# --- Gaps -------------------------------------------------------------------------------------


ops = st.lists(st.one_of(
    st.tuples(st.just("add"), st.integers(0, 50), st.integers(0, 20)),
    st.tuples(st.just("take"), st.integers(0, 80), st.just(0)),
), max_size=60)


@given(ops=ops)
def test_gaps_behave_like_a_sorted_set(ops: list[tuple[str, int, int]]) -> None:
    gaps, model = Gaps(), set[int]()
    for op, a, b in ops:
        if op == "add":
            gaps.add(a, a + b)
            model.update(range(a, a + b))
        else:
            model = {s for s in model if s >= a}
            expected = min(model, default=None)
            assert gaps.take(a) == expected
            model.discard(expected)  # type: ignore[arg-type]
        assert len(gaps) == len(model)
        assert bool(gaps) == bool(model)
        assert all(lo < hi for lo, hi in gaps.ranges)
        assert all(x[1] < y[0] for x, y in zip(gaps.ranges, list(gaps.ranges)[1:], strict=False))


# --- the receiver core alone ------------------------------------------------------------------


class Recovery:
    """A receiver registered with ``stores`` stores (one group) whose source has sent ``high``
    + 1 messages it never saw; the test answers its RXREQs."""

    def __init__(self, high: int, *, stores: int = 1, kind: type[ReceiverCore] = ReceiverCore,
                 **options: int) -> None:
        self.rcv = kind(TOPIC, ReceiverConfig(**options), ip="10.0.0.4", request_port=14392)
        self.now = 0.0
        self.payloads = [b"payload %d" % s for s in range(high + 1)]
        self.framers: dict[ConnKey, LbttcpStream] = {}
        self.max_outstanding = 0
        self.lost: list[int] = []
        rcv = self.rcv
        tir = lbmr.Tir(name=TOPIC, ttl=1, index=1,
                       info=lbmr.TcpInfo(ip=TRANSPORT[0], port=TRANSPORT[1]),
                       options=[lbmr.ToptUme(store=1, src_tcp_port=REQUEST[1],
                                             src_tcp_addr=REQUEST[0], transport_idx=1)])
        rcv.receive(lbmr.LbmrPacket(tirs=[tir]).build(), ("10.0.0.1", 15380), 0.0)
        self.event(StreamEventKind.CONNECTED, TRANSPORT_CONN)
        sri = control(Sri(version=1, low_sqn=0, high_sqn=high, initial_sqn_known=1),
                      TopicIdx(tidx=1),
                      *[UmeStoreExt(grp_idx=0, store_tcp_port=addr[1], store_idx=i,
                                    store_ip_addr=addr[0], src_reg_id=70 + i, version=0)
                        for i, addr in enumerate(STORES[:stores])])
        self.event(StreamEventKind.DATA, TRANSPORT_CONN, sri)
        self.store_conns = [(("10.0.0.4", 50002 + i), addr)
                            for i, addr in enumerate(STORES[:stores])]
        for i, key in enumerate(self.store_conns):
            self.event(StreamEventKind.CONNECTED, key)
            self.event(StreamEventKind.DATA, key, control(UmePregResp(
                reg_id=90 + i, transport_idx=1, topic_idx=1, low_seqnum=0, high_seqnum=high)))

    def event(self, kind: StreamEventKind, key: ConnKey, data: bytes = b"") -> None:
        self.rcv.stream_event(StreamEvent(kind, key, data), self.now)
        self.max_outstanding = max(self.max_outstanding, len(self.rcv.requests))

    def requests(self) -> list[tuple[ConnKey, int]]:
        """The RXREQs the receiver wrote since the last call: (store connection, sqn)."""
        out = []
        for c in self.rcv.stream_commands(self.now):
            if isinstance(c, StreamWrite) and c.conn in self.store_conns:
                framer = self.framers.setdefault(c.conn, LbttcpStream())
                for item in framer.feed(c.data):
                    assert item.message is not None
                    rx = item.message.header(UmeRxreq)
                    if rx is not None:
                        out.append((c.conn, rx.seqnum))
        return out

    def answer(self, key: ConnKey, sqns: list[int]) -> None:
        if sqns:
            self.event(StreamEventKind.DATA, key, b"".join(
                data_message(1, s, self.payloads[s], MessageType.RETRANS) for s in sqns))

    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.rcv.handle_timer(self.now)

    def delivered(self) -> list[int]:
        """Sequence numbers delivered since the last call (losses go to ``self.lost``)."""
        events = self.rcv.events()
        self.lost += [s for e in events if isinstance(e, UnrecoverableLoss)
                      for s in range(e.first, e.last + 1)]
        return [e.sequence_number for e in events if isinstance(e, MessageDelivered)]


RECOVERING = settings(max_examples=max(settings().max_examples, 40), deadline=None,
                      suppress_health_check=[HealthCheck.too_slow])


@RECOVERING
@given(high=st.integers(1, 300), outstanding=st.integers(0, 40), stores=st.integers(1, 2),
       silent=st.sets(st.integers(0, 300), max_size=10), data=st.data())
def test_recovery_delivers_in_order_within_the_outstanding_maximum(
        high: int, outstanding: int, stores: int, silent: set[int], data: st.DataObject) -> None:
    """Stores answer every request except those for ``silent`` sequence numbers (a message
    no store has), some at once and some a round later; the receiver re-requests, gives the
    silent ones up after the message timeout and delivers everything else once, in order."""
    rec = Recovery(high, stores=stores, retransmit_request_outstanding_maximum=outstanding,
                   retransmit_request_interval=100, retransmit_request_message_timeout=1000)
    silent = {s for s in silent if s <= high}
    delivered: list[int] = []
    late: list[tuple[ConnKey, int]] = []
    for _ in range(2000):
        asked = rec.requests() + late
        late = []
        by_conn: dict[ConnKey, list[int]] = {}
        for key, sqn in asked:
            if sqn in silent:
                continue
            if data.draw(st.booleans(), label="late"):
                late.append((key, sqn))
            else:
                by_conn.setdefault(key, []).append(sqn)
        for key, sqns in by_conn.items():
            rec.answer(key, sqns)
        delivered += rec.delivered()
        if not asked and not late:
            rec.tick(0.1)
            delivered += rec.delivered()
            if not rec.rcv.requests and not rec.rcv.missing:
                break
    if outstanding:
        assert rec.max_outstanding <= outstanding
    assert delivered == sorted(set(range(high + 1)) - silent)
    assert sorted(rec.lost) == sorted(silent)
    assert rec.rcv.stats["lost"] == len(silent)


def test_recovery_cost_does_not_grow_with_what_is_missing() -> None:
    """30,000 missing messages recover in a few seconds (the list-based bookkeeping this
    replaced took minutes: every message re-filtered and re-sorted everything missing)."""
    count = 30_000
    rec = Recovery(count - 1)
    start = time.perf_counter()
    delivered = 0
    while delivered < count:
        asked = rec.requests()
        assert asked, "recovery stalled"
        for key in rec.store_conns:
            rec.answer(key, [s for k, s in asked if k == key])
        delivered += len(rec.delivered())
    assert time.perf_counter() - start < 20
    assert rec.rcv.stats["duplicates"] == 0
    assert rec.max_outstanding <= ReceiverConfig().retransmit_request_outstanding_maximum


# --- the receiver's in-place run of data messages ------------------------------------------------


class PlainReceiver(ReceiverCore):
    """The receiver without its run hook: every message through ``on_raw_message``."""

    def on_message_run(self, conn: object, data: bytes) -> int:  # type: ignore[override]
        return 0


class CountingReceiver(ReceiverCore):
    """Counts the bytes its run hook takes."""

    taken = 0

    def on_message_run(self, conn: object, data: bytes) -> int:  # type: ignore[override]
        used = super().on_message_run(conn, data)  # type: ignore[arg-type]
        self.taken += used
        return used


def test_retransmissions_in_a_chunk_are_taken_as_one_run() -> None:
    rec = Recovery(9, kind=CountingReceiver)
    rec.requests()
    chunk = b"".join(data_message(1, s, rec.payloads[s], MessageType.RETRANS) for s in range(10))
    rec.answer(rec.store_conns[0], list(range(10)))
    assert rec.delivered() == list(range(10))
    assert isinstance(rec.rcv, CountingReceiver) and rec.rcv.taken == len(chunk)


piece = st.tuples(
    st.sampled_from(["retrans", "retrans", "message", "other-topic", "keepalive", "empty"]),
    st.integers(0, 40))


@given(pieces=st.lists(st.tuples(st.sampled_from(["store", "transport"]),
                                 st.lists(piece, min_size=1, max_size=12),
                                 st.integers(0, 200)), min_size=1, max_size=8))
def test_the_run_of_data_messages_changes_nothing(
        pieces: list[tuple[str, list[tuple[str, int]], int]]) -> None:
    """Chunks of retransmissions, live data, data of another topic, data of a type the peer
    may not send and other messages, cut at any point, give the same events, bytes and state
    with the in-place run (``on_message_run``) as message by message."""
    def run(kind: type[ReceiverCore]) -> list[object]:
        rec = Recovery(40, kind=kind)
        trace: list[object] = []
        for where, items, cut in pieces:
            key = rec.store_conns[0] if where == "store" else TRANSPORT_CONN
            parts = []
            for what, sqn in items:
                if what == "keepalive":
                    parts.append(control(UmePregResp(reg_id=90, transport_idx=1, topic_idx=1)))
                elif what == "empty":
                    parts.append(data_message(1, sqn, b"", MessageType.RETRANS))
                else:
                    mtype = MessageType.MESSAGE if what == "message" else MessageType.RETRANS
                    parts.append(data_message(2 if what == "other-topic" else 1, sqn,
                                              b"p%d" % sqn, mtype))
            chunk = b"".join(parts)
            cut = min(cut, len(chunk))
            for part in (chunk[:cut], chunk[cut:]):
                if part:
                    rec.event(StreamEventKind.DATA, key, part)
            trace.append((rec.rcv.events(), rec.rcv.stream_commands(rec.now),
                          dict(rec.rcv.stats), rec.rcv.next_sqn, sorted(rec.rcv.held),
                          sorted(rec.rcv.requests)))
        return trace

    assert run(ReceiverCore) == run(PlainReceiver)
