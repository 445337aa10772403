"""The source's fast paths change nothing a peer or an application can see.

The source takes shortcuts on its hot paths (see :mod:`reference_impl.source`): ACKs read
through the layout derived from ``UmeAck`` instead of the full LBMC decoder (a run of them in
place, straight out of the chunk), a memo of the group stability rules, a retention pass that
returns at once when nothing has landed, and :meth:`SourceCore.send_many` writing a batch of
messages as one stream write through its own loop.  Each property
below runs the same random program against the source as it is and against a *reference*
source that takes none of the shortcuts (full decode, no memo, the plain retention loop,
one :meth:`SourceCore.send` at a time) and requires the same events, the same bytes on every
connection and the same state after every step.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from reference_impl.context import ContextCore, control
from reference_impl.events import Event, InputDropped, MessageStable, StableFlags
from reference_impl.fastmsg import ControlTemplate
from reference_impl.sim import (
    Connect,
    ConnKey,
    StreamCommand,
    StreamEvent,
    StreamEventKind,
    StreamWrite,
)
from reference_impl.source import SendError, SendErrorCode, SourceConfig, SourceCore, StoreSpec
from wire.errors import WireError
from wire.lbmc import (
    AckType,
    KeepaliveType,
    LbmcMessage,
    UmeAck,
    UmeKeepalive,
    UmePregResp,
    UmeRxreq,
    parse_message,
)

IP = "127.0.0.1"
TRANSPORT_PORT, REQUEST_PORT = 14371, 14391
ACK = ControlTemplate(UmeAck)


class ReferenceSource(SourceCore):
    """The source without its shortcuts: what the fast paths must be equivalent to."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stability_memo = None  # evaluate the group rules on every ACK

    def on_message_run(self, conn: Any, data: bytes) -> int:
        return 0  # every message through on_raw_message

    def on_raw_message(self, conn: Any, raw: bytes) -> None:
        ContextCore.on_raw_message(self, conn, raw)  # full LBMC decode, then on_message

    def send_many(self, payloads: Any) -> int:
        sent = 0
        for payload in payloads:
            try:
                self.send(payload)
            except SendError:
                if not sent:
                    raise
                break
            sent += 1
        return sent

    def _apply_retention(self) -> None:
        # the loop as it was before the shortcut, on every call
        cfg = self.config
        while self.retained:
            sqn, msg = next(iter(self.retained.items()))
            if self.retained_bytes > cfg.retransmit_retention_size_limit \
                    and len(self.retained) > 1:
                self._reclaim(sqn, msg, forced=True)
                continue
            if msg.inflight or self.retained_bytes <= cfg.retransmit_retention_size_threshold:
                break
            self._reclaim(sqn, msg, forced=False)


@dataclass
class Harness:
    """A source registered with its stores through hand-fed stream events (no network)."""

    source: SourceCore
    store_keys: list[ConnKey]
    transport_key: ConnKey
    request_key: ConnKey
    now: float = 1.0
    events: list[Event] = field(default_factory=list)
    written: dict[ConnKey, bytearray] = field(default_factory=lambda: defaultdict(bytearray))
    other_commands: list[StreamCommand] = field(default_factory=list)

    @classmethod
    def start(cls, kind: type[SourceCore], groups: tuple[int, ...], **options: Any) -> Harness:
        specs = tuple(StoreSpec(IP, 15000 + i, group=g) for i, g in enumerate(groups))
        source = kind("bench.t", SourceConfig(ume_store=specs, **options), ip=IP,
                      transport_port=TRANSPORT_PORT, request_port=REQUEST_PORT, now=0.0)
        connects = [c for c in source.stream_commands(0.0) if isinstance(c, Connect)]
        store_keys = [((IP, 40000 + i), c.remote) for i, c in enumerate(connects)]
        transport_key: ConnKey = ((IP, TRANSPORT_PORT), (IP, 41000))
        request_key: ConnKey = ((IP, REQUEST_PORT), (IP, 41001))
        for key in store_keys:
            source.stream_event(StreamEvent(StreamEventKind.CONNECTED, key), 0.0)
        for key in (transport_key, request_key):
            source.stream_event(StreamEvent(StreamEventKind.ACCEPTED, key), 0.0)
        for i, key in enumerate(store_keys):
            source.stream_event(StreamEvent(StreamEventKind.DATA, key, control(
                UmePregResp(reg_id=100 + i))), 0.0)
            source.stream_event(StreamEvent(StreamEventKind.DATA, transport_key, control(
                UmeKeepalive(type=KeepaliveType.STORE, reg_id=100 + i))), 0.0)
        assert source.complete
        source.stream_commands(0.0)
        source.events()
        return cls(source, store_keys, transport_key, request_key)

    def collect(self) -> None:
        for cmd in self.source.stream_commands(self.now):
            if isinstance(cmd, StreamWrite):
                self.written[cmd.conn] += cmd.data
            else:
                self.other_commands.append(cmd)
        self.events += self.source.events()

    def send(self, sizes: list[int]) -> int | SendErrorCode:
        self.source.now = self.now
        payloads = [bytes([len(self.events) % 251]) * size for size in sizes]
        try:
            result: int | SendErrorCode = self.source.send_many(payloads)
        except SendError as exc:
            result = exc.code
        self.collect()
        return result

    def feed(self, key: ConnKey, chunks: list[bytes]) -> None:
        for chunk in chunks:
            self.source.stream_event(StreamEvent(StreamEventKind.DATA, key, chunk), self.now)
        self.collect()

    def tick(self, seconds: float) -> None:
        self.now += seconds
        self.source.handle_timer(self.now)
        self.collect()

    def state(self) -> dict[str, Any]:
        src = self.source
        return {"retained": [(sqn, m.stable, m.inflight, sorted(m.stable_at),
                              sorted(m.confirmed_by)) for sqn, m in src.retained.items()],
                "retained_bytes": src.retained_bytes, "inflight": src.inflight,
                "inflight_bytes": src.inflight_bytes, "stats": dict(src.stats),
                "next_sqn": src.next_sqn, "complete": src.complete,
                "last_heard": [link.last_heard for link in src.links],
                "confirmed": dict(src._confirmed)}

    def observed(self) -> tuple[Any, ...]:
        return (self.events, dict(self.written), self.other_commands, self.state())


# --- random programs ------------------------------------------------------------------------

def ack_bytes(kind: int, seqnum: int, flags: int, rcv: int, id_2: int, odd: int) -> bytes:
    """An ACK as a store or receiver sends it, or (``odd``) one of the other shapes a peer may
    send: a second header, a nonzero version nibble, a header with trailing bytes."""
    if odd == 0:
        return ACK.pack(flags=flags, type=kind, seqnum=seqnum, rcv_reg_id=rcv, id_2=id_2)
    ack = UmeAck(flags=flags, type=kind, seqnum=seqnum, rcv_reg_id=rcv, id_2=id_2)
    if odd == 1:
        return LbmcMessage(headers=[ack, UmeKeepalive(type=KeepaliveType.STORE)]).build()
    if odd == 2:
        return LbmcMessage(headers=[ack], version=1).build()
    ack.trailing = b"\x00\x00"
    return LbmcMessage(headers=[ack]).build()


ack_spec = st.tuples(
    st.integers(0, 3),  # where: store 0..2 (modulo the store count) or the request connection
    st.sampled_from([AckType.STABLE, AckType.CDELV, 7]),
    st.integers(-1, 12),  # seqnum relative to what was sent (-1: nothing)
    st.sampled_from([0, 0x08, 0x40, 0xFF]),
    st.integers(0, 3), st.integers(0, 3),
    st.sampled_from([0, 0, 0, 1, 2, 3]))

step = st.one_of(
    st.tuples(st.just("send"), st.lists(st.integers(0, 120), min_size=1, max_size=12)),
    st.tuples(st.just("acks"), st.lists(ack_spec, min_size=1, max_size=16), st.booleans()),
    st.tuples(st.just("tick"), st.sampled_from([0.3, 0.6, 2.5, 6.0])))

configs = st.fixed_dictionaries({
    "ume_flight_size": st.integers(1, 12),
    "ume_flight_size_bytes": st.sampled_from([0, 0, 150, 400]),
    "ume_flight_size_behavior": st.sampled_from(["block", "notify"]),
    "retransmit_retention_size_threshold": st.sampled_from([0, 0, 100, 500]),
    "retransmit_retention_size_limit": st.sampled_from([25_165_824, 300, 1000]),
    "ume_retention_unique_confirmations": st.sampled_from([0, 0, 1, 2]),
    "ume_retention_intragroup_stability_behavior": st.sampled_from(
        ["quorum", "all", "all-active"]),
    "ume_retention_intergroup_stability_behavior": st.sampled_from(
        ["any", "majority", "all", "all-active"]),
    "ume_message_stability_timeout": st.sampled_from([0, 1000, 5000]),
    "ume_message_stability_lifetime": st.sampled_from([2000, 1_200_000]),
})


def run_program(kind: type[SourceCore], groups: tuple[int, ...], options: dict[str, Any],
                program: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    h = Harness.start(kind, groups, **options)
    trace: list[tuple[Any, ...]] = []
    for op in program:
        if op[0] == "send":
            result: object = h.send(op[1])
        elif op[0] == "acks":
            runs: list[tuple[ConnKey, list[bytes]]] = []
            top = h.source.next_sqn
            for where, kind_, rel, flags, rcv, id_2, odd in op[1]:
                key = h.request_key if where == 3 else h.store_keys[where % len(h.store_keys)]
                seqnum = max(0, top - 1 - rel) if rel >= 0 else top + 5
                if not runs or runs[-1][0] != key:
                    runs.append((key, []))
                runs[-1][1].append(ack_bytes(int(kind_), seqnum, flags, rcv, id_2, odd))
            for key, raws in runs:
                # one chunk with the ACKs in a row (as a busy store sends them) or one per read
                h.feed(key, [b"".join(raws)] if op[2] else raws)
            result = None
        else:
            h.tick(op[1])
            result = None
        trace.append((op, result, *h.observed()))
    return trace


@given(groups=st.sampled_from([(0,), (0, 0), (0, 0, 0), (0, 1), (0, 0, 1)]),
       options=configs, program=st.lists(step, min_size=1, max_size=14))
def test_the_fast_source_behaves_exactly_as_the_reference(
        groups: tuple[int, ...], options: dict[str, Any], program: list[tuple[Any, ...]]) -> None:
    fast = run_program(SourceCore, groups, options, program)
    reference = run_program(ReferenceSource, groups, options, program)
    for got, want in zip(fast, reference, strict=True):
        assert got == want, f"after {got[0]}"


# --- the pieces, one by one ---------------------------------------------------------------------

@given(values=st.tuples(*(st.integers(0, 0xFF) for _ in range(2)),
                        *(st.integers(0, 0xFFFFFFFF) for _ in range(4))))
def test_template_unpack_reads_back_what_pack_and_the_full_decoder_agree_on(
        values: tuple[int, ...]) -> None:
    named = dict(zip(ACK.names, values, strict=True))
    raw = ACK.pack(**named)
    assert ACK.unpack(raw) == values
    (header,) = parse_message(raw)[0].headers
    assert isinstance(header, UmeAck)
    assert {name: getattr(header, name) for name in ACK.names} == named
    position, bit = ACK.view("e_flag")
    assert bit.get(values[position]) == header.e_flag


@given(raw=st.binary(min_size=ACK.size, max_size=ACK.size))
def test_template_unpack_takes_only_what_the_full_decoder_reads_as_that_one_header(
        raw: bytes) -> None:
    values = ACK.unpack(raw)
    try:
        message, _ = parse_message(raw)
    except WireError:
        assert values is None
        return
    one_ack = (message.version == 0 and len(message.headers) == 1
               and isinstance(message.headers[0], UmeAck) and not message.headers[0].trailing
               and not message.trailer and not message.payload)
    if values is not None:
        assert one_ack
        assert tuple(getattr(message.headers[0], n) for n in ACK.names) == values


def test_template_unpack_refuses_other_shapes_and_other_headers() -> None:
    raw = ACK.pack(type=1, seqnum=9)
    assert ACK.unpack(raw + b"\x00") is None
    assert ACK.unpack(raw[:-1]) is None
    for odd in (1, 2, 3):
        assert ACK.unpack(ack_bytes(1, 9, 0, 0, 0, odd)) is None
    rxreq = ControlTemplate(UmeRxreq)
    assert ACK.unpack(rxreq.pack(seqnum=9)[:ACK.size]) is None
    values = rxreq.unpack(rxreq.pack(seqnum=9, rx_ip=0x7F000001))
    assert values is not None and values[rxreq.index("rx_ip")] == 0x7F000001  # IPv4 as int


def test_send_many_writes_one_stream_write_and_stops_at_the_flight_size() -> None:
    h = Harness.start(SourceCore, (0,), ume_flight_size=5)
    assert h.source.send_many([b"a" * 10] * 8) == 5
    (write,) = h.source.stream_commands(h.now)
    assert isinstance(write, StreamWrite) and write.conn == h.transport_key
    assert [m.sqn for m in _messages(write.data)] == [0, 1, 2, 3, 4]
    with pytest.raises(SendError) as refused:
        h.source.send_many([b"b"])
    assert refused.value.code is SendErrorCode.WOULD_BLOCK
    assert h.source.stream_commands(h.now) == []
    assert h.source.send_many([]) == 0


def test_send_many_writes_what_it_took_even_when_the_payloads_fail_midway() -> None:
    h = Harness.start(SourceCore, (0,))

    def payloads() -> Any:
        yield b"x"
        yield b"y"
        raise RuntimeError("the application's generator broke")

    with pytest.raises(RuntimeError):
        h.source.send_many(payloads())
    (write,) = h.source.stream_commands(h.now)
    assert isinstance(write, StreamWrite)
    assert [m.payload for m in _messages(write.data)] == [b"x", b"y"]
    assert h.source.stats["sent"] == 2 and h.source.inflight == 2


def test_stability_events_carry_the_group_flags_from_the_memo_too() -> None:
    # two groups of two, any group: the first ACK is store-only, the second makes group 0
    # stable and so the message; a store of group 1 then adds only its own store flag (the
    # threshold keeps the message retained: a reclaimed message takes no more ACKs)
    h = Harness.start(SourceCore, (0, 0, 1, 1), retransmit_retention_size_threshold=10_000)
    for _ in range(2):  # the second message goes through the memo filled by the first
        sqn = h.source.next_sqn
        h.send([8])
        for store in (0, 1, 2):
            h.feed(h.store_keys[store], [ACK.pack(type=AckType.STABLE, seqnum=sqn)])
        flags = [e.flags for e in h.events if isinstance(e, MessageStable)
                 and e.sequence_number == sqn]
        assert flags == [StableFlags.STORE,
                         StableFlags.STORE | StableFlags.INTRAGROUP | StableFlags.INTERGROUP
                         | StableFlags.STABLE,
                         StableFlags.STORE | StableFlags.INTERGROUP]


@pytest.mark.parametrize("kind", [SourceCore, ReferenceSource])
def test_the_intragroup_flag_follows_the_acknowledging_store_whatever_came_before(
        kind: type[SourceCore]) -> None:
    # groups {0, 1} and {2}, any group: stores 0 and 2 hold the message either way, but only
    # when store 2 (whose group it completes) acknowledges last is the last event intragroup
    # (and the one that makes the message stable)
    h = Harness.start(kind, (0, 0, 1), retransmit_retention_size_threshold=10_000)
    h.send([8, 8, 8, 8])
    last: dict[int, StableFlags] = {}
    for sqn, order in enumerate([(0, 2), (2, 0), (0, 2), (2, 0)]):
        for store in order:
            h.feed(h.store_keys[store], [ACK.pack(type=AckType.STABLE, seqnum=sqn)])
            last[sqn] = [e for e in h.events if isinstance(e, MessageStable)][-1].flags
    completing = StableFlags.STORE | StableFlags.INTRAGROUP | StableFlags.INTERGROUP \
        | StableFlags.STABLE
    assert last == {0: completing, 1: StableFlags.STORE | StableFlags.INTERGROUP,
                    2: completing, 3: StableFlags.STORE | StableFlags.INTERGROUP}


def test_a_stability_ack_on_a_connection_that_is_no_store_is_dropped_as_before() -> None:
    h = Harness.start(SourceCore, (0,))
    h.send([4])
    h.feed(h.request_key, [ACK.pack(type=AckType.STABLE, seqnum=0)])
    assert any(isinstance(e, InputDropped) for e in h.events)
    assert h.source.stats["stable"] == 0


def _messages(data: bytes) -> list[LbmcMessage]:
    out, pos = [], 0
    while pos < len(data):
        message, used = parse_message(data, pos)
        out.append(message)
        pos += used
    return out
