"""Bad input to the reference cores (issue 3): logged with a reason and dropped, never a crash,
never a change of state, never a lost message.

Four places take bytes from the network, and each is attacked where it listens:

* the **store core alone** (no network): garbage on a fresh connection to its store port and
  as LBMR datagrams, checked against an oracle built from the wire framer and decoder: every
  undecodable frame gives an :class:`InputDropped` and a WARNING, a stream whose framing breaks
  is closed, and a fingerprint of the store's whole state is unchanged unless a well-formed
  registration was among the garbage;
* the **store in a running deployment**: garbage connections and datagrams from a stranger
  while a source sends and a receiver receives; afterwards the receiver has every message once
  and in order, the store holds every message, and a late receiver recovers them all;
* the **receiver**: undecodable frames on its transport and store connections, garbage on a
  connection a stranger opens to it, bad LBMR datagrams; delivery must go on without loss or
  duplicates and its acknowledgements must keep reaching the store;
* the **resolver**: what is not LBMR is dropped and never relayed.

The core bugs these tests found are fixed, and each has a regression test at the end; the
property tests cover those inputs too.  When a new bug turns up, pin it there with an
``xfail(strict=True)`` test and keep the properties clear of it with a ``_hits_*`` predicate
until the core is fixed, then delete both.
"""

from __future__ import annotations

import dataclasses
import enum
import io
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_impl.context import Connection, ContextCore, control
from reference_impl.deployment import LBMR_PORT, SimDeployment
from reference_impl.events import (
    Addr,
    ClientRegistered,
    ClientRejected,
    ClientStateDeleted,
    Event,
    InputDropped,
    Level,
    LogRecord,
    MessageDelivered,
    ReceiverRegistrationSuccess,
    UnrecoverableLoss,
)
from reference_impl.fastmsg import data_message
from reference_impl.receiver import ReceiverConfig, ReceiverCore, StoreReg
from reference_impl.resolver import DEFAULT_PORT, ResolverCore
from reference_impl.sim import (
    CallbackEndpoint,
    Connect,
    ConnKey,
    StreamClose,
    StreamEvent,
    StreamEventKind,
    StreamWrite,
)
from reference_impl.source import SourceCore
from reference_impl.store import StoreCore, StoreSettings, TopicPolicy, TopicRule
from tests.reference_impl.strategies import (
    chunked,
    garbage_from,
    lying,
    mutated,
    noise,
    undecodable_frames,
)
from tests.wire.strategies import header_of
from tests.wire.test_lbmr import packets
from wire import lbmr
from wire.errors import WireError
from wire.lbmc import (
    CONTROL_BASE,
    AckType,
    KeepaliveType,
    LbmcMessage,
    MessageType,
    PregError,
    Sri,
    Topicname,
    UmeAck,
    UmeKeepalive,
    UmePreg,
    UmePregResp,
    UmeRxreq,
    UmeSid,
    UmeStoreExt,
    parse_message,
)
from wire.lbttcp import LbttcpStream

# Example budgets scale with the active profile (30 by default, 3000 under
# HYPOTHESIS_PROFILE=fuzz) and with the cost of one example: a few milliseconds for a core
# alone, ~0.1 s for a receiver in a deployment, ~0.3 s for 200 messages plus a late receiver.
_BASE = settings().max_examples
_QUIET = [HealthCheck.too_slow, HealthCheck.filter_too_much]
FAST = settings(max_examples=max(_BASE, 100), deadline=None, suppress_health_check=_QUIET)
RECEIVING = settings(max_examples=max(_BASE // 5, 40), deadline=None, suppress_health_check=_QUIET)
DEPLOYED = settings(max_examples=max(_BASE // 10, 10), deadline=None, suppress_health_check=_QUIET)

TOPIC = "topic.a"
TOPIC_IDX = TRANSPORT_IDX = 1
NOW = 1.0
STORE_IP = "10.0.0.2"
STORE_ADDR: Addr = (STORE_IP, 14567)
SOURCE_REQUEST: Addr = ("10.0.0.3", 14391)
SOURCE_TRANSPORT: Addr = ("10.0.0.3", 14371)
RECEIVER_REQUEST: Addr = ("10.0.0.4", 14392)
RESOLVER: Addr = ("10.0.0.1", DEFAULT_PORT)
STRANGER_IP = "10.0.0.66"
STRANGER: Addr = (STRANGER_IP, 50000)
GARBAGE_CONN: ConnKey = (STORE_ADDR, STRANGER)
HELD = 10  # messages the bench store holds before garbage arrives
ACKED = 4  # what the bench receiver acknowledged
KEEP_EVERYTHING = (TopicRule(".*", TopicPolicy(repository_size_threshold=10_000_000),
                             kind="PCRE"),)


def payload(sqn: int) -> bytes:
    return b"payload %d" % sqn


# --- helpers shared by every section ------------------------------------------------------------


def stream_event(core: ContextCore, kind: StreamEventKind, conn: ConnKey, data: bytes = b"",
                 now: float = NOW) -> None:
    core.stream_event(StreamEvent(kind, conn, data), now)


def drops_in(events: Iterable[Event]) -> list[InputDropped]:
    return [e for e in events if isinstance(e, InputDropped)]


def assert_each_drop_is_logged(events: list[Event]) -> None:
    """Every InputDropped comes with a WARNING log line naming its reason (issue 3)."""
    for i, event in enumerate(events):
        if isinstance(event, InputDropped):
            assert event.reason, "a drop without a reason"
            log = events[i + 1] if i + 1 < len(events) else None
            assert isinstance(log, LogRecord) and log.level is Level.WARNING, events[i:i + 2]
            assert event.reason in log.text


def is_subsequence(needles: list[int], haystack: list[int]) -> bool:
    it = iter(haystack)
    return all(any(n == h for h in it) for n in needles)


def frames_of(stream: bytes) -> tuple[list[bytes], bool]:
    """The LBT-TCP frames in ``stream`` before any framing error, and whether one occurred
    (a ``msglen`` below 4: nothing after it can be framed)."""
    framer = LbttcpStream(decode=False)
    try:
        items = framer.feed(stream)
    except WireError:
        return [], True
    return [item.raw for item in items], framer.broken is not None


def unframed_tail(stream: bytes) -> int:
    """Bytes at the end of an unbroken ``stream`` that do not complete a message."""
    framer = LbttcpStream(decode=False)
    framer.feed(stream)
    return framer.pending


def decoded(raw: bytes) -> LbmcMessage | None:
    try:
        return parse_message(raw)[0]
    except WireError:
        return None


def state_of(core: ContextCore, *, ignore: Iterable[ConnKey] = ()) -> object:
    """A plain-data fingerprint of everything a core holds (every attribute, recursively), minus
    its outboxes, its clock, the drop counter, and the connections in ``ignore``.

    Read generically so that state added to a core later is covered without editing this test.
    """
    skip = {"_events", "_commands", "_write_key", "_write_parts", "_datagrams", "_heap", "now"}
    ignored = set(ignore)
    out: dict[str, object] = {}
    for name, value in vars(core).items():
        if name in skip:
            continue
        if name == "connections":
            value = {k: v for k, v in value.items() if k not in ignored}
        elif name == "stats":
            value = {k: v for k, v in value.items() if k != "dropped_inputs"}
        out[name] = _plain(value, set())
    return out


def _plain(value: object, active: set[int]) -> object:
    if value is None or isinstance(value, str | bytes | int | float | bool | enum.Enum):
        return value
    if isinstance(value, Connection):
        return ("connection", value.key, value.open, value.outgoing, tuple(value.pending),
                value.unframed, value.framer.broken is not None, type(value.tag).__name__)
    if isinstance(value, random.Random):
        return value.getstate()
    if isinstance(value, io.IOBase | PurePath):
        return repr(value)
    if id(value) in active:
        return ("cycle", type(value).__name__)
    active = active | {id(value)}
    if isinstance(value, Mapping):
        return {k: _plain(v, active) for k, v in value.items()}
    if isinstance(value, list | tuple | deque):
        return [_plain(v, active) for v in value]
    if isinstance(value, set | frozenset):
        return sorted(repr(_plain(v, active)) for v in value)
    if dataclasses.is_dataclass(value):
        return (type(value).__name__,
                {f.name: _plain(getattr(value, f.name), active) for f in dataclasses.fields(value)})
    if hasattr(value, "__dict__"):
        return (type(value).__name__, {k: _plain(v, active) for k, v in vars(value).items()})
    return repr(value)


# --- 1. the store core alone ----------------------------------------------------------------


@dataclass
class StoreBench:
    """A store that holds one source's messages and one receiver's acknowledgement, built by
    feeding it what a real source, resolver and receiver send (no network)."""

    store: StoreCore
    source_conn: ConnKey
    transport_conn: ConnKey
    receiver_conn: ConnKey
    source_reg_id: int
    receiver_reg_id: int


def store_bench() -> StoreBench:
    store = StoreCore(StoreSettings("store1", STORE_IP, STORE_ADDR[1], topics=KEEP_EVERYTHING,
                                    lbmr_port=LBMR_PORT, resolver=RESOLVER, seed=7), now=0.0)
    source_conn: ConnKey = (STORE_ADDR, (SOURCE_REQUEST[0], 50000))
    stream_event(store, StreamEventKind.ACCEPTED, source_conn)
    stream_event(store, StreamEventKind.DATA, source_conn, control(
        UmePreg(s_flag=1, transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX,
                resp_port=SOURCE_REQUEST[1], resp_ip=SOURCE_REQUEST[0]),
        Topicname(topic=TOPIC)))
    (source_reg_id,) = store.sources
    store.receive(lbmr.LbmrPacket(tirs=[source_tir()]).build(), RESOLVER, NOW)
    transport_conn: ConnKey = ((STORE_IP, 50001), SOURCE_TRANSPORT)
    assert store.connection_to(SOURCE_TRANSPORT) is not None, "the store did not join"
    stream_event(store, StreamEventKind.CONNECTED, transport_conn)
    for sqn in range(HELD):
        stream_event(store, StreamEventKind.DATA, transport_conn,
                     data_message(TOPIC_IDX, sqn, payload(sqn)))
    receiver_conn: ConnKey = (STORE_ADDR, (RECEIVER_REQUEST[0], 50000))
    stream_event(store, StreamEventKind.ACCEPTED, receiver_conn)
    stream_event(store, StreamEventKind.DATA, receiver_conn, control(
        UmePreg(s_flag=0, transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX,
                src_reg_id=source_reg_id, resp_port=RECEIVER_REQUEST[1],
                resp_ip=RECEIVER_REQUEST[0]),
        Topicname(topic=TOPIC)))
    (receiver_reg_id,) = store.receivers
    stream_event(store, StreamEventKind.DATA, receiver_conn, control(UmeAck(
        type=AckType.CDELV, transport_idx=TRANSPORT_IDX, id_2=receiver_reg_id,
        rcv_reg_id=receiver_reg_id, seqnum=ACKED)))
    assert not drops_in(store.events())
    store.stream_commands(NOW)
    store.datagrams_to_send(NOW)
    return StoreBench(store, source_conn, transport_conn, receiver_conn, source_reg_id,
                      receiver_reg_id)


def source_tir(request: Addr = SOURCE_REQUEST, transport: Addr = SOURCE_TRANSPORT,
               name: str = TOPIC) -> lbmr.Tir:
    return lbmr.Tir(name=name, ttl=1, index=TOPIC_IDX,
                    info=lbmr.TcpInfo(ip=transport[0], port=transport[1]),
                    options=[lbmr.ToptUme(store=1, src_tcp_port=request[1],
                                          src_tcp_addr=request[0],
                                          transport_idx=TRANSPORT_IDX)])


_IDS = store_bench()  # deterministic (seeded): templates below may name the bench's RegIDs
UNKNOWN_ID = 0x0BAD_F00D
assert UNKNOWN_ID not in (_IDS.source_reg_id, _IDS.receiver_reg_id)

REQUESTS_FROM_STRANGERS = [
    # well-formed store requests naming clients the store does not know: never valid
    LbmcMessage(headers=[UmeAck(type=AckType.CDELV, transport_idx=TRANSPORT_IDX, id_2=UNKNOWN_ID,
                                rcv_reg_id=UNKNOWN_ID, seqnum=3)]),
    LbmcMessage(headers=[UmeRxreq(request_idx=1, transport_idx=TRANSPORT_IDX, id_2=UNKNOWN_ID,
                                  seqnum=2, rx_port=RECEIVER_REQUEST[1], rx_ip=0x0A000004)]),
    LbmcMessage(headers=[UmeKeepalive(type=KeepaliveType.RECEIVER, r_flag=1,
                                      transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX,
                                      reg_id=UNKNOWN_ID)]),
    LbmcMessage(type=MessageType.MESSAGE, tidx=TOPIC_IDX, sqn=HELD, payload=b"not yours"),
    LbmcMessage(type=MessageType.PRORX, tidx=TOPIC_IDX, sqn=1, payload=b"not yours"),
]
REGISTRATIONS = [
    # a new source; the bench source re-registering from elsewhere (refused: it is active);
    # a new receiver of the bench source; a receiver of an unknown source; a deregistration
    LbmcMessage(headers=[UmePreg(s_flag=1, transport_idx=2, topic_idx=2, resp_port=14391,
                                 resp_ip=STRANGER_IP), Topicname(topic="topic.b"),
                         UmeSid(sid=77)]),
    LbmcMessage(headers=[UmePreg(s_flag=1, reg_id=_IDS.source_reg_id,
                                 transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX,
                                 resp_port=14391, resp_ip=STRANGER_IP),
                         Topicname(topic=TOPIC)]),
    LbmcMessage(headers=[UmePreg(s_flag=0, transport_idx=TRANSPORT_IDX, topic_idx=TOPIC_IDX,
                                 src_reg_id=_IDS.source_reg_id, resp_port=14392,
                                 resp_ip=STRANGER_IP), Topicname(topic=TOPIC)]),
    LbmcMessage(headers=[UmePreg(s_flag=0, src_reg_id=UNKNOWN_ID, resp_port=14392,
                                 resp_ip=STRANGER_IP)]),
    LbmcMessage(headers=[UmePreg(s_flag=0, d_flag=1, reg_id=_IDS.receiver_reg_id,
                                 src_reg_id=_IDS.source_reg_id, resp_port=14392,
                                 resp_ip=STRANGER_IP)]),
]


def _framed(head: dict[str, int], tail: bytes) -> bytes:
    return CONTROL_BASE.pack(head) + tail


framing_breakers = st.builds(
    _framed,
    st.fixed_dictionaries({"ver_type": st.integers(0, 0xFF), "next_hdr": st.integers(0, 0xFF),
                           "msglen": st.integers(0, CONTROL_BASE.size - 1)}),
    st.binary(max_size=8))
"""A frame header whose msglen cannot even cover itself: nothing after it can be framed."""

store_garbage = st.one_of(garbage_from(REQUESTS_FROM_STRANGERS), framing_breakers)


def is_registration(message: LbmcMessage | None) -> bool:
    return message is not None and message.header(UmePreg) is not None


BENCH_SOURCES = {_IDS.source_reg_id}
BENCH_RECEIVERS = {_IDS.receiver_reg_id}


def _names_a_bench_client(header: object) -> bool:
    """The store request ``header`` names a client of the bench store the way the store looks
    it up (so the store serves it instead of dropping it)."""
    if isinstance(header, UmeAck):
        return header.type == AckType.CDELV and \
            bool({header.rcv_reg_id, header.id_2} & BENCH_RECEIVERS)
    if isinstance(header, UmeRxreq):
        return header.id_2 in BENCH_RECEIVERS
    if isinstance(header, UmeKeepalive):
        return header.reg_id in BENCH_SOURCES | BENCH_RECEIVERS
    return False


def store_must_drop(raw: bytes) -> bool:
    """Whether the store must answer this frame from a stranger with an InputDropped: anything
    that does not decode, data on a connection that is no source's, control messages with no
    store request, and each request (ACK, RXREQ, keepalive) naming an unknown client."""
    message = decoded(raw)
    if message is None or message.is_data_type:
        return True
    requests = [h for h in message.headers if isinstance(h, UmeAck | UmeRxreq | UmeKeepalive)]
    return not requests or not all(_names_a_bench_client(h) for h in requests)


def feed_stranger(store: StoreCore, chunks: list[bytes]) -> None:
    """A stranger connects to the store port and sends ``chunks``."""
    stream_event(store, StreamEventKind.ACCEPTED, GARBAGE_CONN)
    for chunk in chunks:
        stream_event(store, StreamEventKind.DATA, GARBAGE_CONN, chunk)


@FAST
@given(pieces=st.lists(store_garbage, min_size=1, max_size=6), data=st.data())
def test_store_drops_garbage_on_a_new_connection(pieces: list[bytes], data: st.DataObject) -> None:
    """Random bytes, random well-formed messages, undecodable frames, mutated and lying store
    requests, in any chunking, on a connection a stranger opens to the store port."""
    bench = store_bench()
    store = bench.store
    stream = b"".join(pieces)
    chunks = data.draw(chunked(stream), label="chunks")
    frames, broken = frames_of(stream)
    first_registration = next((i for i, f in enumerate(frames) if is_registration(decoded(f))),
                              len(frames))
    before = state_of(store, ignore=[GARBAGE_CONN])

    feed_stranger(store, chunks)
    events = store.events()
    commands = store.stream_commands(NOW)
    datagrams = store.datagrams_to_send(NOW)

    drops = drops_in(events)
    assert all(d.peer == STRANGER for d in drops)
    assert_each_drop_is_logged(events)
    required = [len(f) for f in frames[:first_registration] if store_must_drop(f)]
    assert is_subsequence(required, [d.size for d in drops]), (required, drops)
    if broken:
        assert StreamClose(GARBAGE_CONN) in commands
        assert GARBAGE_CONN not in store.connections
    if first_registration == len(frames):  # no well-formed registration among the garbage
        assert state_of(store, ignore=[GARBAGE_CONN]) == before
        assert all(c == StreamClose(GARBAGE_CONN) for c in commands), commands
        assert datagrams == []
    assert_store_still_serves(bench)


def assert_store_still_serves(bench: StoreBench) -> None:
    """Nothing lost: the bench source's next message is stored and acknowledged, the bench
    receiver can acknowledge it and ask for a retransmission."""
    store = bench.store
    store.stream_commands(NOW)  # whatever earlier steps left in the outbox
    stream_event(store, StreamEventKind.DATA, bench.transport_conn,
                 data_message(TOPIC_IDX, HELD, payload(HELD)))
    source = store.sources[bench.source_reg_id]
    assert source.repo is not None and source.repo.sqns() == list(range(HELD + 1))
    written = [c for c in store.stream_commands(NOW) if isinstance(c, StreamWrite)]
    stable = [parse_message(c.data)[0].header(UmeAck) for c in written
              if c.conn == bench.source_conn]
    assert [a.seqnum for a in stable if a is not None] == [HELD]
    stream_event(store, StreamEventKind.DATA, bench.receiver_conn, control(
        UmeAck(type=AckType.CDELV, transport_idx=TRANSPORT_IDX, id_2=bench.receiver_reg_id,
               rcv_reg_id=bench.receiver_reg_id, seqnum=HELD),
        UmeRxreq(request_idx=9, transport_idx=TRANSPORT_IDX, id_2=bench.receiver_reg_id,
                 seqnum=0, rx_port=RECEIVER_REQUEST[1], rx_ip=0x0A000004)))
    assert not drops_in(store.events())
    assert store.receivers[bench.receiver_reg_id].last_ack == HELD
    resent = [parse_message(c.data)[0] for c in store.stream_commands(NOW)
              if isinstance(c, StreamWrite) and c.conn == bench.receiver_conn]
    assert [(m.type, m.sqn, m.payload) for m in resent] == \
        [(MessageType.RETRANS, 0, payload(0))]


registration_garbage = st.one_of(
    st.sampled_from([m.build() for m in REGISTRATIONS]).flatmap(mutated),
    st.sampled_from(REGISTRATIONS).flatmap(lying),
    st.builds(lambda preg, name: LbmcMessage(headers=[preg, name]).build(),
              header_of(UmePreg.kind), header_of(Topicname.kind)),
)


@FAST
@given(raw=registration_garbage)
def test_store_answers_or_drops_mutated_registrations(raw: bytes) -> None:
    """Every registration that decodes gets exactly one answer (granted, refused, or a
    deregistration), every other frame is dropped, and a refused registration changes
    nothing."""
    bench = store_bench()
    store = bench.store
    frames, broken = frames_of(raw)
    before = state_of(store, ignore=[GARBAGE_CONN])
    feed_stranger(store, [raw])
    events = store.events()
    commands = store.stream_commands(NOW)
    granted = [e for e in events if isinstance(e, ClientRegistered)]
    if any(e.role == "source" for e in granted):
        # a new source is answered once the store joined its transport, or after a while
        store.handle_timer(NOW + 5)
        events += store.events()
        commands += store.stream_commands(NOW + 5)
    store.datagrams_to_send(NOW)

    assert_each_drop_is_logged(events)
    pregs = [f for f in frames if is_registration(decoded(f))]
    refused = [e for e in events if isinstance(e, ClientRejected)]
    deregistered = [e for e in events
                    if isinstance(e, ClientStateDeleted) and e.reason == "deregistered"]
    assert len(granted) + len(refused) + len(deregistered) == len(pregs), events
    answers = [h for c in commands if isinstance(c, StreamWrite) and c.conn == GARBAGE_CONN
               for h in parse_message(c.data)[0].headers if isinstance(h, UmePregResp)]
    # a new source is answered only once the store joined its transport; when the garbage
    # broke the framing the connection is gone by then and those answers cannot be sent
    unsendable = sum(1 for e in granted if e.role == "source") if broken else 0
    assert len(pregs) - unsendable <= len(answers) <= len(pregs)
    assert sum(1 for a in answers if a.e_flag) == len(refused)
    others = [f for f in frames if not is_registration(decoded(f)) and store_must_drop(f)]
    assert len(drops_in(events)) >= len(others)
    if broken:
        assert StreamClose(GARBAGE_CONN) in commands
    if not granted and not deregistered:
        assert state_of(store, ignore=[GARBAGE_CONN]) == before
    if not deregistered:
        assert_store_still_serves(bench)


VALID_LBMR = [
    lbmr.LbmrPacket(tirs=[source_tir()]),  # the bench source's own advertisement
    lbmr.LbmrPacket(tirs=[source_tir(request=(STRANGER_IP, 14391),
                                     transport=(STRANGER_IP, 14371), name="topic.b")],
                    tqrs=[lbmr.Tqr(name="topic.c")]),
    lbmr.LbmrPacket(tqrs=[lbmr.Tqr(name=TOPIC)]),
]
lbmr_garbage = st.one_of(
    noise,
    st.sampled_from([p.build() for p in VALID_LBMR]).flatmap(mutated),
    packets().map(lambda p: p.build()),
)


@FAST
@given(datagrams=st.lists(lbmr_garbage, min_size=1, max_size=4))
def test_store_drops_bad_topic_resolution_datagrams(datagrams: list[bytes]) -> None:
    """Undecodable LBMR is dropped with one InputDropped each and leaves the store untouched;
    LBMR that decodes may teach it advertisements but never touches a registration or a
    message it holds."""
    bench = store_bench()
    store = bench.store
    for datagram in datagrams:
        before = state_of(store)
        public_before = store.snapshot()
        store.receive(datagram, (STRANGER_IP, LBMR_PORT), NOW)
        events = store.events()
        commands = store.stream_commands(NOW)
        datagrams_out = store.datagrams_to_send(NOW)
        try:
            lbmr.parse_packet(datagram)
        except WireError:
            drops = drops_in(events)
            assert [(d.peer, d.size) for d in drops] == [((STRANGER_IP, LBMR_PORT),
                                                          len(datagram))]
            assert_each_drop_is_logged(events)
            assert state_of(store) == before
            assert commands == [] and datagrams_out == []
        else:
            # a datagram that decodes may still advertise a transport nobody can join (an
            # LBT-RM TIR without a multicast group, port and NAK port): that TIR alone is
            # dropped, and logged
            assert all(d.peer == (STRANGER_IP, LBMR_PORT) and "TIR of an LBT-RM" in d.reason
                       for d in drops_in(events)), drops_in(events)
            assert_each_drop_is_logged(events)
            assert store.snapshot() == public_before
    assert_store_still_serves(bench)


@pytest.mark.parametrize("msglen", range(CONTROL_BASE.size))
def test_store_closes_a_connection_whose_framing_breaks(msglen: int) -> None:
    """A msglen below 4 leaves no way to find the next message: drop, log, close."""
    bench = store_bench()
    store = bench.store
    before = state_of(store, ignore=[GARBAGE_CONN])
    breaker = CONTROL_BASE.pack({"ver_type": MessageType.CONTROL, "next_hdr": 0xFF,
                                 "msglen": msglen})
    stream_event(store, StreamEventKind.ACCEPTED, GARBAGE_CONN)
    stream_event(store, StreamEventKind.DATA, GARBAGE_CONN, breaker + b"more bytes")
    events = store.events()
    assert [d.peer for d in drops_in(events)] == [STRANGER]
    assert "framing" in drops_in(events)[0].reason
    assert_each_drop_is_logged(events)
    assert store.stream_commands(NOW) == [StreamClose(GARBAGE_CONN)]
    assert GARBAGE_CONN not in store.connections
    stream_event(store, StreamEventKind.DATA, GARBAGE_CONN, b"late bytes")  # after our FIN
    assert store.events() == []
    assert state_of(store, ignore=[GARBAGE_CONN]) == before
    assert_store_still_serves(bench)


# --- 2. the store in a running deployment --------------------------------------------------


@dataclass(frozen=True)
class Burst:
    """Garbage a stranger sends when the source is about to send message ``at``: on a new TCP
    connection to the store port (in ``chunks``), or as one datagram to its LBMR port."""

    at: int
    tcp: bool
    chunks: tuple[bytes, ...]


@st.composite
def bursts(draw: st.DrawFn, messages_sent: int) -> Burst:
    at = draw(st.integers(0, messages_sent - 1))
    if draw(st.booleans()):
        stream = b"".join(draw(st.lists(store_garbage, min_size=1, max_size=4)))
        return Burst(at, True, tuple(draw(chunked(stream))))
    return Burst(at, False, (draw(lbmr_garbage),))


class Stranger:
    """A host that connects to the store and sends garbage at scheduled times."""

    PORT = 40000

    def __init__(self, deployment: SimDeployment) -> None:
        self.d = deployment
        self.endpoint = CallbackEndpoint()
        deployment.net.add_node("stranger", STRANGER_IP)
        deployment.net.bind("stranger", self.PORT, self.endpoint)

    def schedule(self, burst: Burst, at: float, store: StoreCore) -> None:
        net = self.d.net
        if not burst.tcp:
            net.call_at(at, lambda: self.endpoint.send(burst.chunks[0],
                                                       (store.ip, LBMR_PORT)))
            return

        def open_connection() -> None:
            key = net.connect((STRANGER_IP, 0), store.addr, owner=self.endpoint)
            for i, chunk in enumerate(burst.chunks):
                net.call_at(at + 0.001 * (i + 1), self._writer(key, chunk))

        net.call_at(at, open_connection)

    def _writer(self, key: ConnKey, chunk: bytes) -> Callable[[], None]:
        return lambda: self.endpoint.write(key, chunk)


def expected_store_drops(burst: Burst) -> int:
    """The InputDropped events the store owes a burst at the least."""
    if not burst.tcp:
        try:
            lbmr.parse_packet(burst.chunks[0])
        except WireError:
            return 1
        return 0
    frames, _ = frames_of(b"".join(burst.chunks))
    first_registration = next((i for i, f in enumerate(frames) if is_registration(decoded(f))),
                              len(frames))
    return sum(1 for f in frames[:first_registration] if store_must_drop(f))


def delivered(d: SimDeployment, name: str) -> list[tuple[int, bytes]]:
    return [(e.sequence_number, e.payload) for e in d.events(name, MessageDelivered)
            if isinstance(e, MessageDelivered)]


def run_store_under_attack(plan: list[Burst], count: int, *, step: float = 0.01,
                           seed: int = 3) -> None:
    d = SimDeployment(seed=seed)
    store = d.add_store("store1", topics=KEEP_EVERYTHING)
    src = d.add_source("src", TOPIC)
    d.add_receiver("rcv", TOPIC)
    stranger = Stranger(d)
    assert d.run_until(lambda: src.complete and d.receivers["rcv"].complete, 10)
    assert src.request_addr == SOURCE_REQUEST and src.transport_addr == SOURCE_TRANSPORT
    (source_reg_id,) = store.sources
    (receiver_reg_id,) = store.receivers
    start = d.now
    for burst in plan:
        stranger.schedule(burst, start + burst.at * step, store)
    for sqn in range(count):
        src.send(payload(sqn))
        d.run(step)
    d.run(3)

    everything = [(sqn, payload(sqn)) for sqn in range(count)]
    assert delivered(d, "rcv") == everything
    assert not d.events("rcv", (UnrecoverableLoss, InputDropped))
    repo = store.sources[source_reg_id].repo
    assert repo is not None and repo.sqns() == list(range(count))
    assert [parse_message(repo.get(s) or b"")[0].payload for s in range(count)] == \
        [p for _, p in everything]
    assert store.receivers[receiver_reg_id].last_ack == count - 1
    store_drops = drops_in(d.events("store1", InputDropped))
    assert len(store_drops) >= sum(expected_store_drops(b) for b in plan)
    assert all(e.peer[0] == STRANGER_IP for e in store_drops)

    late = d.add_receiver("late", TOPIC)
    assert d.run_until(lambda: late.complete, 10)
    d.run(3)
    assert delivered(d, "late") == everything
    assert not d.events("late", UnrecoverableLoss)


@DEPLOYED
@given(plan=st.lists(bursts(200), min_size=1, max_size=8))
def test_store_in_a_deployment_shrugs_off_garbage(plan: list[Burst]) -> None:
    """200 messages flow while a stranger sends garbage connections and datagrams to the store:
    the receiver gets each message once and in order, the store keeps them all, and a late
    receiver recovers everything from it."""
    run_store_under_attack(plan, 200)


@pytest.mark.slow
@settings(max_examples=max(_BASE // 100, 20), deadline=None, suppress_health_check=_QUIET)
@given(plan=st.lists(bursts(2000), min_size=20, max_size=60), seed=st.integers(0, 1000))
def test_store_in_a_deployment_shrugs_off_a_garbage_storm(plan: list[Burst], seed: int) -> None:
    """The same with 2000 messages, 20 to 60 bursts of garbage and any network seed."""
    run_store_under_attack(plan, 2000, step=0.002, seed=seed)


# --- 3. the receiver ----------------------------------------------------------------------------


class ReceiverBench:
    """A deployment whose receiver is registered and receiving; ``inject`` hands it bytes on
    one of its connections (or a datagram) at the current virtual time."""

    def __init__(self, seed: int = 5) -> None:
        d = self.d = SimDeployment(seed=seed)
        self.store = d.add_store("store1", topics=KEEP_EVERYTHING)
        self.src: SourceCore = d.add_source("src", TOPIC)
        self.rcv: ReceiverCore = d.add_receiver("rcv", TOPIC)
        assert d.run_until(lambda: self.src.complete and self.rcv.complete, 10)
        self.transport = self.conn_tagged(lambda tag: tag == "transport")
        self.store_conn = self.conn_tagged(lambda tag: isinstance(tag, StoreReg))
        (self.receiver_reg_id,) = self.store.receivers

    def conn_tagged(self, test: Callable[[object], bool]) -> ConnKey:
        (key,) = [k for k, c in self.rcv.connections.items() if test(c.tag)]
        return key

    def inject(self, where: str, data: bytes) -> None:
        rcv, net = self.rcv, self.d.net
        if where == "lbmr":
            net.call_at(net.now, lambda: rcv.receive(data, (STRANGER_IP, LBMR_PORT), net.now))
            return
        key = self.transport if where == "transport" else self.store_conn
        assert rcv.connections[key].unframed == 0  # between two messages of the peer
        net.call_at(net.now, lambda: rcv.stream_event(
            StreamEvent(StreamEventKind.DATA, key, data), net.now))

    def stranger_says(self, key: ConnKey, *chunks: bytes) -> None:
        """A stranger connects to the receiver (``key`` as the receiver sees it), sends
        ``chunks`` and closes."""
        rcv, net = self.rcv, self.d.net

        def feed() -> None:
            rcv.stream_event(StreamEvent(StreamEventKind.ACCEPTED, key), net.now)
            for chunk in chunks:
                rcv.stream_event(StreamEvent(StreamEventKind.DATA, key, chunk), net.now)
            rcv.stream_event(StreamEvent(StreamEventKind.CLOSED, key), net.now)

        net.call_at(net.now, feed)

    def send(self, count: int, step: float = 0.01,
             before_each: Callable[[int], None] | None = None) -> None:
        for sqn in range(count):
            if before_each is not None:
                before_each(sqn)
            self.src.send(payload(sqn))
            self.d.run(step)
        self.d.run(3)

    def assert_everything_delivered_and_acknowledged(self, count: int) -> None:
        assert delivered(self.d, "rcv") == [(s, payload(s)) for s in range(count)]
        assert not self.d.events("rcv", UnrecoverableLoss)
        assert self.rcv.stats["duplicates"] == 0
        assert self.store.receivers[self.receiver_reg_id].last_ack == count - 1


receiver_lbmr_garbage = st.one_of(
    noise,
    st.sampled_from([lbmr.LbmrPacket(tirs=[source_tir()]).build(),
                     lbmr.LbmrPacket(tqrs=[lbmr.Tqr(name=TOPIC)]).build()]).flatmap(mutated),
)


@RECEIVING
@given(plan=st.lists(st.tuples(st.integers(0, 99), st.sampled_from(["transport", "store"]),
                               undecodable_frames())
                     | st.tuples(st.integers(0, 99), st.just("lbmr"), receiver_lbmr_garbage),
                     min_size=1, max_size=8))
def test_receiver_drops_bad_frames_and_datagrams(plan: list[tuple[int, str, bytes]]) -> None:
    """Undecodable frames between the messages of its source and of its store, and bad LBMR
    datagrams: one InputDropped each, and 100 messages delivered once, in order, acknowledged."""
    bench = ReceiverBench()
    expected = 0
    for _, where, raw in plan:
        if where != "lbmr":
            expected += 1
            continue
        try:
            lbmr.parse_packet(raw)
        except WireError:
            expected += 1

    def inject(sqn: int) -> None:
        for at, where, raw in plan:
            if at == sqn:
                bench.inject(where, raw)

    bench.send(100, before_each=inject)
    bench.assert_everything_delivered_and_acknowledged(100)
    events = [e for _, n, e in bench.d.log if n == "rcv"]
    assert len(drops_in(events)) == expected
    assert_each_drop_is_logged(events)
    assert bench.rcv.connections.keys() >= {bench.transport, bench.store_conn}  # none lost


def test_receiver_recovers_after_a_stray_byte_breaks_its_transport() -> None:
    """One stray byte desynchronises the transport's framing: the receiver drops the stream,
    resolves and reconnects, and recovers what it missed from the store.  (Until the core
    kept ``source`` across a lost transport, the next acknowledgement timer crashed on
    ``assert src is not None``; a source crash right after a delivery did the same.)"""
    bench = ReceiverBench()
    bench.send(200, before_each=lambda sqn: bench.inject("transport", b"\x00")
               if sqn == 10 else None)
    bench.assert_everything_delivered_and_acknowledged(200)
    drops = drops_in(bench.d.events("rcv", InputDropped))
    assert len(drops) == 1 and "framing" in drops[0].reason


RECEIVER_TEMPLATES = [
    LbmcMessage(type=MessageType.MESSAGE, tidx=TOPIC_IDX + 1, sqn=3, payload=b"other topic"),
    LbmcMessage(headers=[UmePregResp(reg_id=UNKNOWN_ID, transport_idx=TRANSPORT_IDX,
                                     topic_idx=TOPIC_IDX, low_seqnum=0, high_seqnum=5)]),
    LbmcMessage(headers=[UmeKeepalive(type=KeepaliveType.STORE, r_flag=1, reg_id=UNKNOWN_ID)]),
    LbmcMessage(headers=[UmeAck(type=AckType.STABLE, transport_idx=TRANSPORT_IDX, seqnum=1)]),
]


@RECEIVING
@given(pieces=st.lists(st.tuples(st.integers(0, 99),
                                 st.one_of(garbage_from(RECEIVER_TEMPLATES), framing_breakers)),
                       min_size=1, max_size=6),
       data=st.data())
def test_receiver_ignores_garbage_from_a_stranger(pieces: list[tuple[int, bytes]],
                                                  data: st.DataObject) -> None:
    """A stranger connects to the receiver's request port (once per piece of garbage) and sends
    anything at all, in any chunking: nothing it says reaches the application, and every frame,
    a broken framing and a message cut short by the close each give one InputDropped (nobody
    has a reason to connect to a receiver and talk first)."""
    bench = ReceiverBench()
    plan = [(at, i, data.draw(chunked(raw))) for i, (at, raw) in enumerate(pieces)]
    owed = 0
    for _, _, chunks in plan:
        stream = b"".join(chunks)
        frames, broken = frames_of(stream)
        owed += len(frames) + int(broken) + int(not broken and unframed_tail(stream) > 0)

    def inject(sqn: int) -> None:
        for at, i, chunks in plan:
            if at != sqn:
                continue
            bench.stranger_says((RECEIVER_REQUEST, (STRANGER_IP, 50000 + i)), *chunks)

    bench.send(100, before_each=inject)
    bench.assert_everything_delivered_and_acknowledged(100)
    events = [e for _, n, e in bench.d.log if n == "rcv"]
    assert all(d.peer[0] == STRANGER_IP for d in drops_in(events))
    assert len(drops_in(events)) == owed
    assert_each_drop_is_logged(events)


# --- 4. the resolver ---------------------------------------------------------------------------


@FAST
@given(datagram=lbmr_garbage)
def test_resolver_relays_lbmr_and_drops_everything_else(datagram: bytes) -> None:
    resolver = ResolverCore(RESOLVER[0])
    clients: list[Addr] = [("10.0.0.2", LBMR_PORT), ("10.0.0.3", LBMR_PORT)]
    hello = lbmr.LbmrPacket(tqrs=[lbmr.Tqr(name=TOPIC)]).build()
    for client in clients:
        resolver.receive(hello, client, NOW)
    resolver.datagrams_to_send(NOW)
    resolver.events()
    known = dict(resolver.clients)
    relayed = resolver.stats["relayed"]

    resolver.receive(datagram, STRANGER, NOW + 1)
    out = resolver.datagrams_to_send(NOW + 1)
    events = resolver.events()
    try:
        lbmr.parse_packet(datagram)
    except WireError:
        assert out == []
        assert [(d.peer, d.size) for d in drops_in(events)] == [(STRANGER, len(datagram))]
        assert_each_drop_is_logged(events)
        assert resolver.clients == known
        assert resolver.stats["relayed"] == relayed
    else:
        assert sorted(out) == sorted((datagram, c) for c in clients)
        assert not drops_in(events)


# --- regressions: core bugs these tests found, each fixed in the core ------------------------


def test_store_refuses_a_source_topic_name_with_a_nul() -> None:
    """A NUL cannot be in a topic-resolution name, so the store could never query or join such
    a source (it used to register it and then raise building the TQR, at once and on every
    'resolve' timer): refused with ETOPICNAME and logged, nothing changed."""
    bench = store_bench()
    store = bench.store
    before = state_of(store, ignore=[GARBAGE_CONN])
    raw = control(UmePreg(s_flag=1, transport_idx=2, topic_idx=2, resp_port=9,
                          resp_ip=STRANGER_IP), Topicname(topic="a\x00b"))
    stream_event(store, StreamEventKind.ACCEPTED, GARBAGE_CONN)
    stream_event(store, StreamEventKind.DATA, GARBAGE_CONN, raw)
    events = store.events()
    refused = [e for e in events if isinstance(e, ClientRejected)]
    assert [e.code for e in refused] == [PregError.ETOPICNAME]
    assert any(isinstance(e, LogRecord) and e.level is Level.WARNING and "NUL" in e.text
               for e in events)
    answers = [h for c in store.stream_commands(NOW) if isinstance(c, StreamWrite)
               for h in parse_message(c.data)[0].headers if isinstance(h, UmePregResp)]
    assert [(a.e_flag, a.error_code) for a in answers] == [(1, PregError.ETOPICNAME)]
    assert state_of(store, ignore=[GARBAGE_CONN]) == before
    store.handle_timer(NOW + 5)  # the resolve timer must not trip over it either
    assert store.timer_at("resolve") is not None


@pytest.mark.parametrize("core", ["store", "receiver"])
def test_queue_records_leave_store_and_receiver_alone(core: str) -> None:
    """A type-6 LBMR packet carries QIRs where TIRs would be; they say nothing about a source
    (both cores used to read ``tir.info`` from them and raise AttributeError)."""
    packet = lbmr.LbmrPacket(type=6, tirs=[lbmr.Qir(qname="q", tname=TOPIC, queue_id=1,
                                                   queue_ver=0, queue_prev_ver=0)])
    target: ContextCore = store_bench().store if core == "store" else \
        ReceiverCore(TOPIC, ReceiverConfig(), ip="10.0.0.4")
    before = state_of(target)
    target.receive(packet.build(), (STRANGER_IP, LBMR_PORT), NOW)
    assert state_of(target) == before
    assert not target.events()


@pytest.mark.parametrize("name, transport", [
    ("topic.b", (STRANGER_IP, SOURCE_TRANSPORT[1])),  # another topic: never this source's
    (TOPIC, (STRANGER_IP, SOURCE_TRANSPORT[1])),  # this topic elsewhere: joined as well
])
def test_store_keeps_its_source_route_after_a_stray_tir(name: str, transport: Addr) -> None:
    """A TIR naming the bench source's request address and indexes used to move the store's
    route to the TIR's transport whatever its topic name, and the data still arriving on the
    real transport was then ignored without a log line."""
    bench = store_bench()
    stray = source_tir(transport=transport, name=name)
    bench.store.receive(lbmr.LbmrPacket(tirs=[stray]).build(), RESOLVER, NOW)
    connects = [c for c in bench.store.stream_commands(NOW) if isinstance(c, Connect)]
    assert [c.remote for c in connects] == ([transport] if name == TOPIC else [])
    bench.store.datagrams_to_send(NOW)
    assert_store_still_serves(bench)


def test_store_falls_back_on_the_working_transport_when_a_stray_one_fails() -> None:
    """After a stray TIR for the source's own topic the store has two routes; when the stray
    transport refuses the connection the store keeps receiving on the real one and still counts
    the source's TIR as seen (no topic query, no "no TIR" flag in its keepalives)."""
    bench = store_bench()
    store = bench.store
    stray = (STRANGER_IP, SOURCE_TRANSPORT[1])
    store.receive(lbmr.LbmrPacket(tirs=[source_tir(transport=stray)]).build(), RESOLVER, NOW)
    stream_event(store, StreamEventKind.REFUSED, ((STORE_IP, 0), stray))
    source = store.sources[bench.source_reg_id]
    assert source.tir_seen and source.transport == SOURCE_TRANSPORT
    store.stream_commands(NOW)
    store.datagrams_to_send(NOW)
    assert_store_still_serves(bench)


def test_framing_error_after_good_messages_in_one_chunk_closes_at_once() -> None:
    """The framer hands out the whole messages before a break and only then gives up; the
    core used to notice only when more bytes arrived."""
    bench = store_bench()
    store = bench.store
    ack = control(UmeAck(type=AckType.CDELV, rcv_reg_id=UNKNOWN_ID, id_2=UNKNOWN_ID))
    breaker = CONTROL_BASE.pack({"ver_type": MessageType.CONTROL, "next_hdr": 0xFF, "msglen": 2})
    stream_event(store, StreamEventKind.ACCEPTED, GARBAGE_CONN)
    stream_event(store, StreamEventKind.DATA, GARBAGE_CONN, ack + breaker)
    events = store.events()
    assert [d.size for d in drops_in(events)] == [len(ack), len(breaker)]
    assert "framing" in drops_in(events)[1].reason
    assert_each_drop_is_logged(events)
    assert store.stream_commands(NOW) == [StreamClose(GARBAGE_CONN)]
    assert GARBAGE_CONN not in store.connections


@pytest.mark.parametrize("kind", [StreamEventKind.CLOSED, StreamEventKind.RESET])
def test_truncated_message_at_close_is_dropped_and_logged(kind: StreamEventKind) -> None:
    """A peer that goes away mid-message loses those bytes: one InputDropped and a log line
    (the partial message used to vanish silently)."""
    store = store_bench().store
    ack = control(UmeAck(type=AckType.CDELV, rcv_reg_id=UNKNOWN_ID, id_2=UNKNOWN_ID))
    stream_event(store, StreamEventKind.ACCEPTED, GARBAGE_CONN)
    stream_event(store, StreamEventKind.DATA, GARBAGE_CONN, ack[:-3])
    stream_event(store, kind, GARBAGE_CONN)
    events = store.events()
    assert [d.size for d in drops_in(events)] == [len(ack) - 3]
    assert_each_drop_is_logged(events)


def test_store_drops_a_keepalive_from_an_unknown_regid() -> None:
    """A keepalive naming a RegID the store does not know is dropped and logged (it used to be
    ignored silently) and changes nothing."""
    bench = store_bench()
    store = bench.store
    before = state_of(store, ignore=[GARBAGE_CONN])
    stream_event(store, StreamEventKind.ACCEPTED, GARBAGE_CONN)
    raw = control(UmeKeepalive(type=KeepaliveType.RECEIVER, r_flag=1, reg_id=UNKNOWN_ID))
    stream_event(store, StreamEventKind.DATA, GARBAGE_CONN, raw)
    events = store.events()
    assert [d.size for d in drops_in(events)] == [len(raw)]
    assert_each_drop_is_logged(events)
    assert not [c for c in store.stream_commands(NOW) if isinstance(c, StreamWrite)]
    assert state_of(store, ignore=[GARBAGE_CONN]) == before


def test_receiver_re_registers_after_losing_its_store_early() -> None:
    """A receiver that loses its store connection within ume_registration_interval of
    registering used to find the 'register' timer due before its retry time and never re-arm
    it, so the store never heard another acknowledgement."""
    bench = ReceiverBench()
    breaker = CONTROL_BASE.pack({"ver_type": MessageType.CONTROL, "next_hdr": 0xFF, "msglen": 2})
    bench.send(200, before_each=lambda sqn: bench.inject("store", breaker)
               if sqn == 10 else None)
    assert len(bench.d.events("rcv", ReceiverRegistrationSuccess)) == 2
    bench.assert_everything_delivered_and_acknowledged(200)


def test_receiver_drops_data_from_a_stranger() -> None:
    """Data for the receiver's topic index on a connection a stranger opened is dropped and
    logged (a forged message 5 used to be delivered and the real one discarded as a
    duplicate)."""
    bench = ReceiverBench()
    key: ConnKey = (RECEIVER_REQUEST, STRANGER)
    forged = data_message(TOPIC_IDX, 5, b"forged")

    def inject(sqn: int) -> None:
        if sqn == 0:
            bench.stranger_says(key, forged)

    bench.send(20, before_each=inject)
    bench.assert_everything_delivered_and_acknowledged(20)
    assert [d.size for d in drops_in(bench.d.events("rcv", InputDropped))] == [len(forged)]


def test_receiver_drops_sri_from_a_stranger() -> None:
    """An SRI is believed only from the source's own connections (a stranger's SRI with a
    higher version used to replace the receiver's store, here with 10.0.0.99:1)."""
    bench = ReceiverBench()
    key: ConnKey = (RECEIVER_REQUEST, STRANGER)
    sri = control(Sri(version=1000), UmeStoreExt(store_idx=0, grp_idx=0,
                                                  store_ip_addr="10.0.0.99", store_tcp_port=1,
                                                  src_reg_id=5, version=9))

    def inject(sqn: int) -> None:
        if sqn == 0:
            bench.stranger_says(key, sri)

    bench.send(20, before_each=inject)
    bench.assert_everything_delivered_and_acknowledged(20)
    assert [d.size for d in drops_in(bench.d.events("rcv", InputDropped))] == [len(sri)]
