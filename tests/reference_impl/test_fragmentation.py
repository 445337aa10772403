"""Fragmentation of large messages (issue 17; reference_impl/fragments.py).

A message longer than the transport's maximum datagram goes out as fragments, each a data
message with its own topic sequence number and a FRAG header; the store keeps and retransmits
each like any message; the receiver delivers the message once, with its first fragment's
sequence number, and its consumption ACK covers every fragment; the source counts the message
once against its flight size (guide "UMP Flight Size": "per message basis, not a per fragment
basis") and calls it stable when every fragment is.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from reference_impl import events as ev
from reference_impl import fragments
from reference_impl.config.client import SourceOptions
from reference_impl.config.profiles import ConfigError
from reference_impl.deployment import SimDeployment
from reference_impl.fragments import FRAGMENT_OVERHEAD, Reassembly
from reference_impl.source import SendError, SendErrorCode, SourceConfig
from reference_impl.store import TopicPolicy, TopicRule
from tests.reference_impl.test_multi_source_runtime import IP, Procs, deliveries
from wire.lbmc import Frag, MessageType, UmeRxreq, parse_message
from wire.lbttcp import LbttcpStream

TOPIC = "big.orders"
RULES = (TopicRule(".*", TopicPolicy(repository_size_threshold=50_000_000), kind="PCRE"),)
DATAGRAM = 200
PIECE = DATAGRAM - FRAGMENT_OVERHEAD  # 172 payload bytes per LBT-TCP fragment


def deployment(transport: str = "tcp", *, receiver: bool = True, seed: int = 1,
               **options: Any) -> SimDeployment:
    d = SimDeployment(seed=seed)
    d.add_store("store", topics=RULES, seed=100)
    key = "transport_tcp_datagram_max_size" if transport == "tcp" else \
        "transport_lbtru_datagram_max_size"
    options.setdefault(key, DATAGRAM if transport == "tcp" else 8192)
    d.add_source("src", TOPIC, transport=transport, **options)
    if receiver:
        d.add_receiver("rcv", TOPIC)
    assert d.run_until(lambda: d.sources["src"].complete
                       and (not receiver or d.receivers["rcv"].complete), 20)
    return d


def payload(n: int, size: int) -> bytes:
    return f"{n}:".encode().ljust(size, b"%c" % (65 + n % 26))


def delivered(d: SimDeployment, name: str = "rcv") -> list[ev.MessageDelivered]:
    return [e for e in d.events(name) if isinstance(e, ev.MessageDelivered)]


def test_a_long_message_goes_out_as_numbered_fragments_and_is_delivered_once() -> None:
    d = deployment()
    src = d.sources["src"]
    big = payload(0, 1000)  # 6 fragments of 172 bytes (the last 140)
    assert src.send(big) == 0
    assert src.send(b"small") == 6  # the next message after the fragments
    d.run(2)
    got = delivered(d)
    assert [(e.sequence_number, e.payload) for e in got] == [(0, big), (6, b"small")]
    # on the wire: sqns 0..5 with FRAG headers naming first sqn 0, at their offsets
    frames = []
    for p in d.net.trace:
        if p.src == src.transport_addr and p.dst[0] == d.ips["rcv"] and p.data:
            frames.append(p.data)
    stream = LbttcpStream(decode=False)
    msgs = [parse_message(item.raw)[0] for chunk in frames for item in stream.feed(chunk)]
    data = [m for m in msgs if m.type == MessageType.MESSAGE]
    frags = [(m.sqn, m.header(Frag)) for m in data]
    assert [sqn for sqn, _ in frags] == list(range(7))
    assert all(f is not None and (f.first_sqn, f.offset, f.len) == (0, i * PIECE, 1000)
               for i, (_, f) in enumerate(frags[:6]))
    assert frags[6][1] is None
    assert all(len(m.build()) <= DATAGRAM for m in data)
    # the store holds every fragment, per sequence number
    repo = next(iter(d.stores["store"].sources.values())).repo
    assert repo is not None and all(repo.get(sqn) is not None for sqn in range(7))


def test_the_flight_size_counts_a_fragmented_message_once() -> None:
    d = deployment(ume_flight_size=2)
    src = d.sources["src"]
    src.send(payload(0, 1000))
    assert (src.inflight, src.inflight_bytes) == (1, 1000)
    src.send(payload(1, 1000))  # 12 fragments out, 2 messages in flight: at the limit
    assert (src.inflight, src.inflight_bytes, src.next_sqn) == (2, 2000, 12)
    with pytest.raises(SendError) as refused:
        src.send(payload(2, 1000))
    assert refused.value.code == SendErrorCode.WOULD_BLOCK
    d.run(2)  # every fragment acknowledged: both land, room again
    assert (src.inflight, src.inflight_bytes) == (0, 0)
    assert src.send(payload(2, 1000)) == 12
    d.run(2)
    assert [e.sequence_number for e in delivered(d)] == [0, 6, 12]


def test_stable_only_when_every_fragment_is_and_reclaimed_per_fragment() -> None:
    d = deployment()
    src = d.sources["src"]
    src.send(payload(0, 1000))
    msg = src.retained[0]
    store_link = src.links[0]
    src._on_stable(store_link, 0)
    src._on_stable(store_link, 4)
    assert not msg.stable and src.inflight == 1
    for sqn in (1, 2, 3, 5):
        src._on_stable(store_link, sqn)
    assert msg.stable and src.inflight == 0
    reclaimed = [e.sequence_number for e in src.events()
                 if isinstance(e, ev.MessageReclaimed)]
    assert reclaimed == list(range(6))
    assert src.retained == {} and src._fragment_of == {}


def test_proactive_retransmission_resends_only_the_unstable_fragments() -> None:
    d = deployment(ume_message_stability_timeout=1000)
    src = d.sources["src"]
    store = d.stores["store"]
    held = store.on_raw_message
    ignore = {2, 4}

    def lossy(conn: Any, raw: bytes) -> None:  # the store misses two live fragments
        if raw[0] & 0x0F == MessageType.MESSAGE and len(raw) >= 12 and \
                int.from_bytes(raw[8:12], "big") in ignore and conn.tag == "transport":
            ignore.discard(int.from_bytes(raw[8:12], "big"))
            return
        held(conn, raw)

    store.on_raw_message = lossy  # type: ignore[method-assign]
    src.send(payload(0, 1000))
    d.run(0.5)
    assert src.inflight == 1 and src.stats["proactive_retransmissions"] == 0
    d.run(2)
    assert src.stats["proactive_retransmissions"] == 2  # fragments 2 and 4, once each
    assert src.inflight == 0


def test_a_lost_fragment_is_asked_for_once_and_the_message_is_delivered_once() -> None:
    d = deployment()
    rcv = d.receivers["rcv"]
    store = d.stores["store"]
    inner = rcv.on_message
    lost: list[int] = []

    def lossy(conn: Any, message: Any, raw: bytes) -> None:
        if message.type == MessageType.MESSAGE and message.sqn == 3 and not lost:
            lost.append(3)
            return
        inner(conn, message, raw)

    rcv.on_message = lossy  # type: ignore[method-assign]
    requests = store._on_rxreq
    asked: list[int] = []

    def on_rxreq(conn: Any, id_2: int, seqnum: int, size: int) -> None:
        asked.append(seqnum)
        requests(conn, id_2, seqnum, size)

    store._on_rxreq = on_rxreq  # type: ignore[method-assign]
    big = payload(7, 1000)
    d.sources["src"].send(big)
    d.sources["src"].send(b"after")
    d.run(3)
    assert lost == [3] and asked == [3]
    got = delivered(d)
    assert [(e.sequence_number, e.payload) for e in got] == [(0, big), (6, b"after")]
    assert got[0].retransmission  # a fragment of it came from the store
    assert rcv.stats["retransmissions"] == 1
    assert UmeRxreq is not None


def test_consumption_acks_cover_every_fragment() -> None:
    d = deployment()
    d.sources["src"].send(payload(0, 1000))
    d.run(2)
    rcv = d.receivers["rcv"]
    assert rcv.consumed == 5 and rcv.acked == 5  # the last fragment
    src_state = next(iter(d.stores["store"].sources.values()))
    receivers = [r for r in d.stores["store"].receivers.values()
                 if r.source_reg_id == src_state.reg_id]
    assert receivers and receivers[0].last_ack == 5


def test_explicit_ack_of_a_fragmented_message_acknowledges_its_last_fragment() -> None:
    d = SimDeployment(seed=2)
    d.add_store("store", topics=RULES, seed=100)
    d.add_source("src", TOPIC, transport_tcp_datagram_max_size=DATAGRAM)
    d.add_receiver("rcv", TOPIC, ume_explicit_ack_only=1)
    assert d.run_until(lambda: d.receivers["rcv"].complete, 20)
    d.sources["src"].send(payload(0, 1000))
    d.run(1)
    rcv = d.receivers["rcv"]
    assert [e.sequence_number for e in delivered(d)] == [0]
    assert rcv.consumed is None
    rcv.ack(0)
    assert rcv.consumed == 5


def test_a_receiver_that_joins_late_reassembles_retransmitted_fragments() -> None:
    d = deployment(receiver=False)
    src = d.sources["src"]
    sent = [payload(i, 700) for i in range(3)]
    for body in sent:
        src.send(body)
    d.run(1)
    d.add_receiver("late", TOPIC)
    d.run(5)
    got = delivered(d, "late")
    assert [e.payload for e in got] == sent
    assert [e.sequence_number for e in got] == [0, 5, 10]
    assert all(e.retransmission for e in got)


def test_lbtru_fragments_fit_the_datagram_maximum() -> None:
    d = deployment("lbt-ru", transport_lbtru_datagram_max_size=1000)
    src = d.sources["src"]
    big = payload(1, 20_000)
    src.send(big)
    d.run(2)
    assert [(e.sequence_number, e.payload) for e in delivered(d)] == [(0, big)]
    sizes = [len(p.data) for p in d.net.trace if p.src == src.transport_addr]
    assert sizes and max(sizes) <= 1000
    piece = fragments.piece_size("lbt-ru", 1000)
    assert src.next_sqn == fragments.fragment_count(20_000, piece) > 20


def test_a_message_that_fits_is_not_fragmented() -> None:
    d = deployment()
    src = d.sources["src"]
    fits = payload(0, DATAGRAM - 12)
    src.send(fits)
    d.run(1)
    assert src.next_sqn == 1 and src.stats["fragments"] == 0
    assert [e.payload for e in delivered(d)] == [fits]


@pytest.mark.parametrize("option, value", [
    ("transport_tcp_datagram_max_size", "0"),
    ("transport_tcp_datagram_max_size", "-5"),
    ("transport_tcp_datagram_max_size", str(FRAGMENT_OVERHEAD)),
    ("transport_tcp_datagram_max_size", "65536"),
    ("transport_lbtru_datagram_max_size", str(FRAGMENT_OVERHEAD + 1)),
    ("transport_lbtru_datagram_max_size", "65508"),
])
def test_a_datagram_maximum_out_of_range_is_a_one_line_error(option: str, value: str) -> None:
    with pytest.raises(ConfigError) as refused:
        SourceOptions.from_mapping({option: value})
    text = str(refused.value)
    assert option in text and "\n" not in text


def test_the_profiles_default_to_64k_for_tcp_and_8k_for_lbtru() -> None:
    for profile in ("current", "guide-5.3", "pre-5.3"):
        opts = SourceOptions.from_mapping({}, profile=profile)
        assert (opts.transport_tcp_datagram_max_size,
                opts.transport_lbtru_datagram_max_size) == (65535, 8192)


def test_the_core_refuses_a_bad_maximum_too() -> None:
    with pytest.raises(ValueError, match="transport_tcp_datagram_max_size 10"):
        SourceConfig(transport_tcp_datagram_max_size=10)
    SourceConfig(transport="lbt-ru", transport_tcp_datagram_max_size=65535)


def test_reassembly_ignores_duplicates_and_overruns() -> None:
    work = Reassembly(first_sqn=4, total=10)
    assert work.add(5, b"fghij") and not work.complete
    assert work.add(5, b"FGHIJ")  # a duplicate offset: ignored
    assert not work.add(8, b"xyz")  # overruns the total
    assert work.add(0, b"abcde") and work.complete
    assert work.payload() == b"abcdefghij"


# --- loopback: real processes, real sockets --------------------------------------------------

MESSAGES = 5
BIG = 200_000


@pytest.mark.parametrize("transport", ["tcp", "lbt-ru"])
def test_ump_source_size_200000_reaches_a_real_store_and_receiver_intact(
        tmp_path: Path, transport: str) -> None:
    """``ump source --size 200000`` (4 LBT-TCP fragments, 25 LBT-RU ones per message) through
    a real store to a real receiver: every message delivered once, payload intact, numbered
    by its first fragment; the store holds every fragment."""
    procs = Procs(tmp_path)
    try:
        procs.store_and_resolver()
        topic = f"multi.big.{transport.replace('-', '')}"
        out = tmp_path / "deliveries.jsonl"
        procs.start("receiver", "receiver", "-c", procs.config("receiver.cfg"), "--topic",
                    topic, "--out", str(out))
        lines = [f"source ume_store {IP}:{procs.store_port}"]
        if transport == "lbt-ru":
            lines.append("source transport lbt-ru")
        procs.start("source", "source", "-c", procs.config("source.cfg", *lines), "--topic",
                    topic, "--count", str(MESSAGES), "--size", str(BIG), "--rate", "10",
                    "--linger", "3")
        procs.wait_for(lambda: len(deliveries(out)) >= MESSAGES, 60,
                       f"{MESSAGES} large messages were not delivered")
        time.sleep(0.5)  # nothing more may come
        rows = deliveries(out)
        kind = "tcp" if transport == "tcp" else "lbt-ru"
        per = fragments.fragment_count(
            BIG, fragments.piece_size(kind, fragments.DATAGRAM_DEFAULTS[kind]))
        assert per == (4 if transport == "tcp" else 25)
        assert [row["sqn"] for row in rows] == [i * per for i in range(MESSAGES)]
        for number, row in enumerate(rows):
            assert row["payload"] == f"{number}:".ljust(BIG, "."), f"message {number} garbled"
        assert procs.procs["source"].wait(timeout=30) == 0, procs.log("source")[-3000:]
    finally:
        procs.stop()


def test_a_store_keeps_fragments_in_its_disk_cache_and_counts_rpp_payload_only(
        tmp_path: Path) -> None:
    """Every fragment is a stored data message of its own: a disk cache file holding
    fragments is read back at a restart, and an RPP repository counts a fragment's payload
    without its FRAG header (sizes count payload only)."""
    from reference_impl.repository import Repository, RetentionLimits

    raws = [fragments.fragment(1, 10, b"x" * 100, 40, i) for i in range(3)]
    repo = Repository(RetentionLimits(), cache_file=tmp_path / "c.cache")
    for i, raw in enumerate(raws):
        repo.add(10 + i, raw, 0.0)
    repo.sync()
    repo.close()
    again = Repository(RetentionLimits(), cache_file=tmp_path / "c.cache")
    assert [again.get(10 + i) for i in range(3)] == raws
    again.close()
    rpp = Repository(RetentionLimits(rpp=True))
    for i, raw in enumerate(raws):
        rpp.add(10 + i, raw, 0.0)
    assert rpp.used_bytes == 100
