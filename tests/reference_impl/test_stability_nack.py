"""The stability NACK (docs/semantics.md §1.8, docs/wire-lbmc.md §2.1): the ACK's NAK bit as
tshark shows it, the store that NACKs a late copy of a message it declared lost, and the source
that stops retransmitting a NACKed message and takes it out of flight.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from reference_impl.context import control
from reference_impl.events import (
    InputDropped,
    Level,
    LogRecord,
    MessageNacked,
    MessageReclaimed,
    MessageStable,
)
from reference_impl.fastmsg import data_message
from reference_impl.lbtru_session import Lost
from reference_impl.sim import StreamCommand, StreamEvent, StreamEventKind, StreamWrite
from reference_impl.source import SourceCore
from reference_impl.store import StoreCore, TopicPolicy
from tests.reference_impl.test_core_store import SOURCE_CONN, TRANSPORT_CONN, joined_store
from tests.reference_impl.test_source_fastpath import ACK, Harness
from tests.wire.test_lbmc_oracle import Capture, assert_clean, run_oracle
from wire.lbmc import ACK_NAK, AckType, Header, LbmcMessage, MessageType, UmeAck, parse_message
from wire.lbttcp import LbttcpStream

# --- the wire --------------------------------------------------------------------------------


def nack(sqn: int) -> bytes:
    """A store's stability NACK for ``sqn`` (the one shape stores send)."""
    return ACK.pack(flags=ACK_NAK, type=AckType.STABLE, seqnum=sqn)


def nak(ack: Header) -> int:
    """1 when the ACK carries the NAK bit."""
    return int(bool(ack.flags & ACK_NAK))


def test_the_nak_bit_is_a_free_bit_of_the_ack_flags() -> None:
    ack = UmeAck(flags=ACK_NAK, type=AckType.STABLE, seqnum=9)
    assert ACK_NAK == 0x04 and nak(ack) == 1
    named = [ack.o_flag, ack.f_flag, ack.u_flag, ack.e_flag, ack.ignore]
    assert named == [0, 0, 0, 0, 0]  # no named flag shares it
    (back,) = parse_message(LbmcMessage(headers=[ack]).build())[0].headers
    assert isinstance(back, UmeAck) and nak(back) == 1 and back.seqnum == 9
    # tshark has no item for it: we export none either, only the flags value
    assert ("lbmc.ume_ack.flags", ACK_NAK) in ack.tshark_fields(0xFF)


def test_tshark_shows_the_nack_as_meant_and_without_expert(tmp_path: Path) -> None:
    """The flags value 0x04 with every named flag 0, type 1 (stability), the sequence number;
    the message labelled ACK; no malformed frame, no expert item."""
    capture = Capture()
    capture.connect()
    ack = UmeAck(flags=ACK_NAK, type=AckType.STABLE, transport_idx=1, id_2=2, seqnum=77)
    frame = capture.send_messages([LbmcMessage(headers=[ack])])
    result = run_oracle(capture, tmp_path / "nack.pcap")
    assert_clean(result, capture)
    assert result.info[frame].strip() == "ACK"
    (shown,) = result.frames[frame].occurrences("lbmc")
    values = dict(shown)
    assert int(values["lbmc.ume_ack.flags"], 0) == ACK_NAK
    assert all(values[f"lbmc.ume_ack.flags.{f}"] in ("0", "False")
               for f in ("ignore", "o_flag", "f_flag", "u_flag", "e_flag"))
    assert (int(values["lbmc.ume_ack.type"], 0), int(values["lbmc.ume_ack.seqnum"], 0)) == \
        (1, 77)


# --- the source --------------------------------------------------------------------------------


def _resent(h: Harness, seconds: float, step: float = 0.1) -> int:
    before = h.source.stats["proactive_retransmissions"]
    for _ in range(round(seconds / step)):
        h.tick(step)
    return int(h.source.stats["proactive_retransmissions"] - before)


def _of(h: Harness, kind: type) -> list[Any]:
    return [e for e in h.events if isinstance(e, kind)]


def quick(groups: tuple[int, ...] = (0,), **options: Any) -> Harness:
    return Harness.start(SourceCore, groups, ume_message_stability_timeout=200,
                         ume_store_check_interval=100, **options)


def test_a_nacked_message_is_no_longer_resent_and_leaves_the_flight() -> None:
    h = quick(ume_flight_size=2)
    assert h.send([8, 8]) == 2
    assert _resent(h, 0.5) > 0  # unstable: proactively retransmitted
    h.feed(h.store_keys[0], [nack(0)])
    assert _of(h, MessageNacked) == [MessageNacked(0, h.source.links[0].info, True)]
    assert MessageReclaimed(0, True) in _of(h, MessageReclaimed)
    assert 0 not in h.source.retained and h.source.inflight == 1
    assert h.send([8]) == 1  # the flight has room again
    warnings = [e.text for e in _of(h, LogRecord) if e.level == Level.WARNING]
    assert any("NACKed message 0" in t for t in warnings), warnings
    # only 1 and 2 are still resent
    h.written.clear()
    assert _resent(h, 0.5) > 0
    data = bytes(h.written[h.store_keys[0]])
    resent = {item.message.sqn for item in LbttcpStream().feed(data) if item.message}
    assert resent == {1, 2}


def test_a_nack_for_a_message_not_held_is_dropped_and_changes_nothing() -> None:
    h = quick()
    assert h.send([8]) == 1
    before = h.state()
    for sqn in (5, 1000):  # never sent
        h.feed(h.store_keys[0], [nack(sqn)])
    h.feed(h.store_keys[0], [ACK.pack(type=AckType.STABLE, seqnum=0)])  # landed, reclaimed
    h.feed(h.store_keys[0], [nack(0)])
    drops = _of(h, InputDropped)
    assert len(drops) == 3 and all("stability NACK" in d.reason for d in drops)
    assert not _of(h, MessageNacked)
    after = h.state()
    assert after["next_sqn"] == before["next_sqn"] and after["inflight"] == 0
    assert after["stats"]["dropped_inputs"] == before["stats"]["dropped_inputs"] + 3


def test_with_a_quorum_a_nack_from_one_store_leaves_the_others_to_make_it_stable() -> None:
    h = quick((0, 0, 0))  # one group of three: two make a quorum
    assert h.send([8]) == 1
    h.feed(h.store_keys[0], [nack(0)])
    assert _of(h, MessageNacked) == [MessageNacked(0, h.source.links[0].info, False)]
    assert h.source.inflight == 1
    h.written.clear()
    assert _resent(h, 0.5) > 0
    assert not h.written.get(h.store_keys[0])  # no longer to the store that NACKed
    assert h.written.get(h.store_keys[1]) and h.written.get(h.store_keys[2])
    h.feed(h.store_keys[0], [nack(0)])  # said again: nothing new
    assert len(_of(h, MessageNacked)) == 1
    h.feed(h.store_keys[1], [nack(0)])  # now one store is left: no quorum possible
    assert _of(h, MessageNacked)[-1] == MessageNacked(0, h.source.links[1].info, True)
    assert h.source.inflight == 0 and not h.source.retained


def test_a_nack_in_a_run_of_acks_and_in_another_shape_is_read_as_a_nack() -> None:
    h = quick((0,), ume_flight_size=10)
    assert h.send([8] * 4) == 4
    run = ACK.pack(type=AckType.STABLE, seqnum=0) + nack(1) + ACK.pack(type=AckType.STABLE,
                                                                      seqnum=2)
    h.feed(h.store_keys[0], [run])
    odd = LbmcMessage(headers=[UmeAck(flags=ACK_NAK, type=AckType.STABLE, seqnum=3)], version=1)
    h.feed(h.store_keys[0], [odd.build()])
    assert [e.sequence_number for e in _of(h, MessageNacked)] == [1, 3]
    assert [e.sequence_number for e in _of(h, MessageStable)] == [0, 2]
    assert h.source.inflight == 0


# --- the store -----------------------------------------------------------------------------------


def _writes(commands: list[StreamCommand]) -> list[Header]:
    framer = LbttcpStream()
    out: list[Header] = []
    for c in commands:
        if isinstance(c, StreamWrite) and c.conn == SOURCE_CONN:
            for item in framer.feed(c.data):
                assert item.message is not None
                out += [h for h in item.message.headers if isinstance(h, UmeAck)]
    return out


def _feed(store: StoreCore, key: Any, raw: bytes) -> list[StreamCommand]:
    store.stream_event(StreamEvent(StreamEventKind.DATA, key, raw), 1.0)
    return list(store.stream_commands(1.0))


def test_the_store_nacks_a_late_copy_of_what_it_declared_lost_and_does_not_store_it() -> None:
    store = joined_store(TopicPolicy(repository_size_threshold=1 << 30))
    (src,) = store.sources.values()
    _feed(store, TRANSPORT_CONN, data_message(1, 0, b"m0"))
    assert store.declare_lost(src, 1, 2) == 2
    assert store.declare_lost(src, 0, 2) == 0  # 0 is held; 1 and 2 declared already
    prorx = data_message(1, 1, b"m1", MessageType.PRORX)
    acks = _writes(_feed(store, SOURCE_CONN, prorx))
    assert [(a.seqnum, nak(a), a.type) for a in acks] == [(1, 1, AckType.STABLE)]
    assert src.repo is not None and 1 not in src.repo
    assert store.stats["nacks"] == 1 and store.stats["declared_lost"] == 2
    # a message not declared lost is still stored and acknowledged as before
    acks = _writes(_feed(store, SOURCE_CONN, data_message(1, 3, b"m3", MessageType.PRORX)))
    assert [(a.seqnum, nak(a)) for a in acks] == [(3, 0)]


def test_a_transport_loss_declares_the_gap_the_next_live_message_shows() -> None:
    store = joined_store(TopicPolicy(repository_size_threshold=1 << 30))
    (src,) = store.sources.values()
    _feed(store, TRANSPORT_CONN, data_message(1, 0, b"m0"))
    binding: Any = SimpleNamespace(conn=store.connections[TRANSPORT_CONN], group=None)
    store.on_lbtru_event(binding, Lost(10, 12, "ncf"))  # transport sequence numbers
    # a proactive retransmission of 1 first says nothing of the gap: stored
    acks = _writes(_feed(store, SOURCE_CONN, data_message(1, 1, b"m1", MessageType.PRORX)))
    assert [(a.seqnum, nak(a)) for a in acks] == [(1, 0)]
    _feed(store, TRANSPORT_CONN, data_message(1, 4, b"m4"))  # live: 2 and 3 were lost
    assert src.lost == {2, 3}
    acks = _writes(_feed(store, SOURCE_CONN, control(UmeAck(type=AckType.STABLE)))
                   + _feed(store, SOURCE_CONN, data_message(1, 3, b"m3", MessageType.PRORX)))
    assert [(a.seqnum, nak(a)) for a in acks] == [(3, 1)]
    _feed(store, TRANSPORT_CONN, data_message(1, 6, b"m6"))  # no loss since: a gap is a gap
    assert src.lost == {2, 3}


def test_a_nack_for_any_fragment_lets_the_whole_message_go() -> None:
    # a 600-byte payload under 200-byte datagrams: several fragments, one message
    h = quick(transport_tcp_datagram_max_size=200)
    first = h.source.try_send(b"f" * 600)
    assert first == 0 and h.source.next_sqn > 2  # fragments 0, 1, 2, ...
    h.feed(h.store_keys[0], [ACK.pack(type=AckType.STABLE, seqnum=0), nack(2)])
    assert _of(h, MessageNacked) == [MessageNacked(0, h.source.links[0].info, True)]
    assert not _of(h, InputDropped)
    assert h.source.inflight == 0 and not h.source.retained
    assert _resent(h, 0.5) == 0
