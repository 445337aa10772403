"""The store core's hot path: what it stores and acknowledges for a stream of data messages in
any chunking, that a disk store never acknowledges a message before it is in its cache file,
that its fast decoders of receivers' requests read what the full decoder reads, and that the
repository's shortcuts (release in sequence order) give what a plain scan gives.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reference_impl.context import FixedControl, control
from reference_impl.events import InputDropped
from reference_impl.fastmsg import ControlTemplate, data_message
from reference_impl.repository import Repository, RetentionLimits
from reference_impl.sim import ConnKey, StreamEvent, StreamEventKind, StreamWrite
from reference_impl.store import (
    _ACK_IN,
    _RXREQ_IN,
    StoreCore,
    StoreSettings,
    TopicPolicy,
    TopicRule,
)
from tests.reference_impl.strategies import chunked
from tests.reference_impl.test_bad_input import (
    RECEIVER_REQUEST,
    STRANGER,
    UNKNOWN_ID,
    assert_store_still_serves,
    store_bench,
)
from tests.wire.strategies import header_of
from wire import lbmr
from wire.fields import ipv4_to_int
from wire.lbmc import (
    AckType,
    Header,
    LbmcMessage,
    MessageType,
    Topicname,
    UmeAck,
    UmeKeepalive,
    UmePreg,
    UmePregResp,
    UmeRxreq,
    parse_message,
)
from wire.lbttcp import LbttcpStream

STORE = ("10.0.0.2", 14567)
REQUEST = ("10.0.0.3", 14391)
TRANSPORT = ("10.0.0.3", 14371)
RESOLVER = ("10.0.0.1", 15380)
SOURCE_CONN: ConnKey = (STORE, (REQUEST[0], 50000))
TRANSPORT_CONN: ConnKey = ((STORE[0], 50001), TRANSPORT)
ACK = ControlTemplate(UmeAck)
SOME = settings(max_examples=max(settings().max_examples, 50), deadline=None,
                suppress_health_check=[HealthCheck.too_slow])


def joined_store(policy: TopicPolicy, tmp: Path | None = None) -> StoreCore:
    """A store with one source registered (real PREG bytes) and its transport joined (a real
    TIR); outboxes emptied."""
    store = StoreCore(StoreSettings(
        "s1", STORE[0], STORE[1], topics=(TopicRule(".*", policy, kind="PCRE"),),
        resolver=RESOLVER, seed=1,
        disk_cache_directory=tmp / "cache" if tmp else None,
        disk_state_directory=tmp / "state" if tmp else None), now=0.0)
    store.stream_event(StreamEvent(StreamEventKind.ACCEPTED, SOURCE_CONN), 1.0)
    store.stream_event(StreamEvent(StreamEventKind.DATA, SOURCE_CONN, control(
        UmePreg(s_flag=1, transport_idx=1, topic_idx=1, resp_port=REQUEST[1],
                resp_ip=REQUEST[0]), Topicname(topic="hot"))), 1.0)
    tir = lbmr.Tir(name="hot", ttl=1, index=1, info=lbmr.TcpInfo(ip=TRANSPORT[0],
                                                                 port=TRANSPORT[1]),
                   options=[lbmr.ToptUme(store=1, src_tcp_port=REQUEST[1],
                                         src_tcp_addr=REQUEST[0], transport_idx=1)])
    store.receive(lbmr.LbmrPacket(tirs=[tir]).build(), RESOLVER, 1.0)
    store.stream_event(StreamEvent(StreamEventKind.CONNECTED, TRANSPORT_CONN), 1.0)
    store.stream_commands(1.0)
    store.datagrams_to_send(1.0)
    store.events()
    return store


def acked(commands: list[object]) -> list[int]:
    """Sequence numbers of the stability ACKs written to the source, in order."""
    framer = LbttcpStream()
    out = []
    for c in commands:
        if isinstance(c, StreamWrite) and c.conn == SOURCE_CONN:
            for item in framer.feed(c.data):
                assert item.message is not None
                (ack,) = item.message.headers
                assert isinstance(ack, UmeAck) and ack.type == AckType.STABLE
                assert (ack.transport_idx, ack.id_2) == (1, 1)
                out.append(ack.seqnum)
    assert framer.pending == 0
    return out


arrivals = st.lists(st.integers(0, 60), min_size=1, max_size=80)
"""Sequence numbers as the transport delivers them: gaps, repeats and late fills included."""


@SOME
@given(sqns=arrivals, data=st.data())
def test_every_message_is_stored_and_acknowledged_once_per_arrival(sqns: list[int],
                                                                   data: st.DataObject) -> None:
    store = joined_store(TopicPolicy(repository_size_threshold=1 << 30))
    stream = b"".join(data_message(1, s, b"m%d" % s) for s in sqns)
    commands: list[object] = []
    for chunk in data.draw(chunked(stream)):
        store.stream_event(StreamEvent(StreamEventKind.DATA, TRANSPORT_CONN, chunk), 1.0)
        commands += store.stream_commands(1.0)
    assert acked(commands) == sqns  # duplicates are acknowledged again
    (src,) = store.sources.values()
    assert src.repo is not None
    assert sorted(src.repo.sqns()) == sorted(set(sqns))
    assert all(parse_message(src.repo.get(s) or b"")[0].payload == b"m%d" % s for s in sqns)
    assert src.repo.trail_sqn == min(sqns) and src.repo.lead_sqn == max(sqns)
    assert not [e for e in store.events() if isinstance(e, InputDropped)]


@SOME
@given(count=st.integers(1, 400), data=st.data())
def test_at_the_size_threshold_the_oldest_go_and_every_message_is_acknowledged(
        count: int, data: st.DataObject) -> None:
    store = joined_store(TopicPolicy())  # the product's 1 KiB threshold: releases all along
    stream = b"".join(data_message(1, s, b"x" * 50) for s in range(count))
    commands: list[object] = []
    for chunk in data.draw(chunked(stream)):
        store.stream_event(StreamEvent(StreamEventKind.DATA, TRANSPORT_CONN, chunk), 1.0)
        commands += store.stream_commands(1.0)
    assert acked(commands) == list(range(count))
    (src,) = store.sources.values()
    assert (src.repo is not None and src.repo.used_bytes <= 1024) or len(src.repo) == 1
    assert src.repo.sqns() == list(range(count - len(src.repo), count))
    assert src.repo.released_total == count - len(src.repo)


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=40), data=st.data())
def test_a_disk_store_acknowledges_only_what_its_cache_file_holds(
        sizes: list[int], data: st.DataObject) -> None:
    """After every chunk, each sequence number the store has called stable is in the cache
    file, read back by an independent framer (a SIGKILL then loses nothing stable)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = joined_store(TopicPolicy(repository_type="disk",
                                         repository_size_threshold=1 << 30), Path(tmp))
        stream = b"".join(data_message(1, s, b"d" * n) for s, n in enumerate(sizes))
        (src,) = store.sources.values()
        assert src.repo is not None and src.repo.cache_file is not None
        stable: list[int] = []
        for chunk in data.draw(chunked(stream)):
            store.stream_event(StreamEvent(StreamEventKind.DATA, TRANSPORT_CONN, chunk), 1.0)
            stable += acked(store.stream_commands(1.0))
            on_disk = LbttcpStream().feed(src.repo.cache_file.read_bytes())
            assert {item.message.sqn for item in on_disk if item.message} >= set(stable)
        assert stable == list(range(len(sizes)))
        store.close()


def fast_equals_full(fixed: FixedControl, header: Header) -> None:
    """Whenever the fast decoder takes a message it reads the full decoder's values, and it
    takes every message that carries the header alone at its fixed length."""
    members = [n for n in fixed.at if n != "rx_ip"]  # an address: int one way, text the other
    for raw in (LbmcMessage(headers=[header]).build(),
                LbmcMessage(headers=[type(header)(**{n: getattr(header, n)
                                                     for n in fixed.at})]).build()):
        values = fixed.unpack(raw)
        (decoded,) = parse_message(raw)[0].headers
        if values is not None:
            assert {n: values[fixed.at[n]] for n in members} == \
                {n: getattr(decoded, n) for n in members}
    assert values is not None  # the canonical form always takes the fast path


@given(header=header_of(UmeRxreq.kind))
def test_the_fast_rxreq_decoder_reads_what_the_full_decoder_reads(header: UmeRxreq) -> None:
    fast_equals_full(_RXREQ_IN, header)


@given(header=header_of(UmeAck.kind))
def test_the_fast_ack_decoder_reads_what_the_full_decoder_reads(header: UmeAck) -> None:
    fast_equals_full(_ACK_IN, header)


@given(header=header_of(UmeAck.kind) | header_of(UmeRxreq.kind))
def test_fixed_control_packs_what_the_message_builder_builds(header: Header) -> None:
    fixed = FixedControl(type(header))
    members = {n: getattr(header, n) for n in fixed.at}
    if "rx_ip" in members:
        members["rx_ip"] = ipv4_to_int(members["rx_ip"])
    canonical = LbmcMessage(headers=[type(header)(**{n: getattr(header, n)
                                                     for n in fixed.at})]).build()
    assert fixed.pack(*fixed.template(**members)) == canonical


@given(raw=st.binary(min_size=_ACK_IN.size, max_size=_ACK_IN.size)
       | st.binary(min_size=_RXREQ_IN.size, max_size=_RXREQ_IN.size))
def test_the_fast_decoders_take_only_their_own_shape(raw: bytes) -> None:
    for fixed, cls in ((_ACK_IN, UmeAck), (_RXREQ_IN, UmeRxreq)):
        if len(raw) != fixed.size or fixed.unpack(raw) is None:
            continue
        message, _ = parse_message(raw)
        assert message.type == MessageType.CONTROL
        assert [type(h) for h in message.headers] == [cls]


def test_single_header_requests_take_the_fast_path_and_are_served() -> None:
    """What the receiver core sends (one RXREQ, one ACK per message) is served; unknown RegIDs
    are dropped exactly as the full decoder's path drops them."""
    bench = store_bench()
    store = bench.store
    rxreq = ControlTemplate(UmeRxreq).pack(request_idx=1, transport_idx=1,
                                           id_2=bench.receiver_reg_id, seqnum=3,
                                           rx_port=RECEIVER_REQUEST[1], rx_ip=0x0A000004)
    ack = ACK.pack(type=AckType.CDELV, transport_idx=1, id_2=bench.receiver_reg_id,
                   rcv_reg_id=bench.receiver_reg_id, seqnum=7)
    store.stream_event(StreamEvent(StreamEventKind.DATA, bench.receiver_conn, rxreq + ack), 1.0)
    resent = [parse_message(c.data)[0] for c in store.stream_commands(1.0)
              if isinstance(c, StreamWrite) and c.conn == bench.receiver_conn]
    assert [(m.type, m.sqn) for m in resent] == [(MessageType.RETRANS, 3)]
    assert store.receivers[bench.receiver_reg_id].last_ack == 7
    stranger: ConnKey = (STORE, STRANGER)
    store.stream_event(StreamEvent(StreamEventKind.ACCEPTED, stranger), 1.0)
    unknown = ACK.pack(type=AckType.CDELV, id_2=5, rcv_reg_id=5, seqnum=9)
    store.stream_event(StreamEvent(StreamEventKind.DATA, stranger, unknown), 1.0)
    assert [d.size for d in store.events() if isinstance(d, InputDropped)] == [len(unknown)]
    assert_store_still_serves(bench)


@given(adds=st.lists(st.integers(0, 40), max_size=60), through=st.integers(-1, 45),
       disk=st.booleans())
def test_release_through_releases_what_a_scan_would(adds: list[int], through: int,
                                                    disk: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        repo = Repository(RetentionLimits(size_threshold=1 << 30, size_limit=1 << 30,
                                          rpp=True),
                          cache_file=Path(tmp) / "c" if disk else None, write_behind=disk)
        for sqn in adds:
            repo.add(sqn, data_message(1, sqn, b"r"), 0.0)
        held = sorted(set(adds))
        released = repo.release_through(through)
        assert sorted(released) == [s for s in held if s <= through]
        assert sorted(repo.sqns()) == [s for s in held if s > through]
        assert repo.trail_sqn == min((s for s in held if s > through), default=None)
        repo.close()


def test_a_second_topic_on_a_joined_transport_is_answered_at_once() -> None:
    """Two topics of one source context share its transport: the store is already connected,
    so the second registration is answered when its advertisement arrives, not after the
    join wait."""
    store = joined_store(TopicPolicy())
    store.stream_event(StreamEvent(StreamEventKind.DATA, SOURCE_CONN, control(
        UmePreg(s_flag=1, transport_idx=1, topic_idx=2, resp_port=REQUEST[1],
                resp_ip=REQUEST[0]), Topicname(topic="hot.two"))), 1.0)
    assert not [c for c in store.stream_commands(1.0) if isinstance(c, StreamWrite)
                and c.conn == SOURCE_CONN]  # waiting for the advertisement
    tir = lbmr.Tir(name="hot.two", ttl=1, index=2,
                   info=lbmr.TcpInfo(ip=TRANSPORT[0], port=TRANSPORT[1]),
                   options=[lbmr.ToptUme(store=1, src_tcp_port=REQUEST[1],
                                         src_tcp_addr=REQUEST[0], transport_idx=1)])
    store.receive(lbmr.LbmrPacket(tirs=[tir]).build(), RESOLVER, 1.1)
    written = [(c.conn, h) for c in store.stream_commands(1.1) if isinstance(c, StreamWrite)
               for h in parse_message(c.data)[0].headers]
    answers = [h for conn, h in written if conn == SOURCE_CONN and isinstance(h, UmePregResp)]
    assert [(a.topic_idx, a.e_flag) for a in answers] == [(2, 0)]
    assert any(conn == TRANSPORT_CONN and isinstance(h, UmeKeepalive) for conn, h in written)
    store.stream_event(StreamEvent(StreamEventKind.DATA, TRANSPORT_CONN,
                                   data_message(2, 0, b"two")), 1.2)
    two = next(s for s in store.sources.values() if s.topic == "hot.two")
    assert two.repo is not None and two.repo.sqns() == [0]


# --- the run of receivers' requests read in place -------------------------------------------------


class PlainStore(StoreCore):
    """The store without its run hook: every message through ``on_raw_message``."""

    def on_message_run(self, conn: object, data: bytes) -> int:  # type: ignore[override]
        return 0


request = st.tuples(st.sampled_from(["rxreq", "rxreq", "ack", "ack-other", "unknown-id",
                                     "keepalive", "data"]),
                    st.integers(0, 14))


@SOME
@given(chunks=st.lists(st.tuples(st.lists(request, min_size=1, max_size=10),
                                 st.integers(0, 300), st.sampled_from([0.0, 0.0, 0.2])),
                       min_size=1, max_size=6),
       rate=st.sampled_from([262_144, 20]))
def test_the_run_of_requests_changes_nothing(
        chunks: list[tuple[list[tuple[str, int]], int, float]], rate: int) -> None:
    """Retransmission requests and consumption ACKs back to back, with other messages among
    them, cut anywhere, at a rate that serves them all or queues them: the same events, bytes
    and state with the in-place run (``on_message_run``) as message by message."""
    def run(kind: type[StoreCore]) -> list[object]:
        bench = store_bench()
        store = bench.store
        store.__class__ = kind
        store._rate = rate
        rid = bench.receiver_reg_id
        rx = ControlTemplate(UmeRxreq)
        now = 1.0
        trace: list[object] = []
        for items, cut, later in chunks:
            parts = []
            for what, sqn in items:
                if what in ("rxreq", "unknown-id"):
                    parts.append(rx.pack(request_idx=sqn, transport_idx=1, seqnum=sqn,
                                         id_2=rid if what == "rxreq" else UNKNOWN_ID,
                                         rx_port=RECEIVER_REQUEST[1], rx_ip=0x0A000004))
                elif what in ("ack", "ack-other"):
                    parts.append(ACK.pack(type=AckType.CDELV if what == "ack" else 9,
                                          transport_idx=1, id_2=rid, rcv_reg_id=rid,
                                          seqnum=sqn))
                elif what == "keepalive":
                    parts.append(control(UmeKeepalive(reg_id=rid, r_flag=1)))
                else:
                    parts.append(data_message(1, sqn, b"x"))
            chunk = b"".join(parts)
            now += later
            for part in (chunk[:cut], chunk[cut:]):
                if part:
                    store.stream_event(StreamEvent(StreamEventKind.DATA, bench.receiver_conn,
                                                   part), now)
            store.handle_timer(now)
            trace.append((store.events(), store.stream_commands(now), dict(store.stats),
                          vars(store.rx), store.receivers[rid].last_ack, len(store._rxq)))
        return trace

    assert run(StoreCore) == run(PlainStore)
