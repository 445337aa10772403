"""LBT-RM transport sessions, rule by rule: data to the group from the source's unicast port,
session messages, where a receiver starts, NAK timing and backoff, retransmission at most once
per ignore interval, the three NCFs and what a receiver does with each, the rate limits, loss
after the NAK generation interval, duplicates, activity timeout, session keys, sequence wrap,
a property under random loss, duplication and reordering, and tshark agreement."""

from __future__ import annotations

import functools
import itertools
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl.lbtrm_session import (
    SQN_MASK,
    Delivered,
    Event,
    LbtrmReceiverPort,
    LbtrmReceiverSession,
    LbtrmReceiverSettings,
    LbtrmSourceSession,
    LbtrmSourceSettings,
    Lost,
    SourceTimedOut,
)
from reference_impl.sim import LinkConfig
from tests.reference_impl.lbtrm_net import (
    GROUP,
    SESSION_ID,
    SOURCE_IP,
    UCAST_PORT,
    first_copies_of,
    make_group,
    parse,
    payload,
)
from wire import lbtrm

SOURCE = (SOURCE_IP, UCAST_PORT)
COST = lbtrm.DATA_FAST.size + len(payload(0))
"""Bytes of one test DATA datagram: what the rate limits count."""


def data(sqn: int, trail: int = 0, *, rx: bool = False, sid: int = SESSION_ID,
         port: int = UCAST_PORT) -> bytes:
    return lbtrm.LbtrmData(ucast_port=port, session_id=sid, sqn=sqn, trail_sqn=trail,
                           ucast_naks=1, rx=int(rx), payload=payload(sqn)).build()


def nak(*sqns: int, sid: int = SESSION_ID, port: int = UCAST_PORT) -> bytes:
    return lbtrm.LbtrmNak(ucast_port=port, session_id=sid, naks=list(sqns)).build()


def ncf(reason: lbtrm.NcfReason, *sqns: int, trail: int = 0) -> bytes:
    return lbtrm.LbtrmNcf(ucast_port=UCAST_PORT, session_id=SESSION_ID, trail_sqn=trail,
                          reason=int(reason), ncfs=list(sqns)).build()


def receiver(**options: float | bool) -> LbtrmReceiverSession:
    return LbtrmReceiverSession(SOURCE_IP, UCAST_PORT, SESSION_ID,
                                LbtrmReceiverSettings(**options))  # type: ignore[arg-type]


def events(session: LbtrmReceiverSession) -> list[Event]:
    out: list[Event] = []
    while (event := session.next_event()) is not None:
        out.append(event)
    return out


def run_timers(session: LbtrmReceiverSession | LbtrmSourceSession, until: float
               ) -> list[tuple[float, tuple[str, int], lbtrm.LbtrmPacket]]:
    """Fire the session's timers up to ``until``; what it sent, with the times."""
    sent = []
    while (t := session.get_timer()) is not None and t <= until:
        session.handle_timer(t)
        sent += [(t, dst, parse(d)) for d, dst in session.datagrams_to_send(t)]
    return sent


def answer(src: LbtrmSourceSession, datagram: bytes, now: float
           ) -> list[tuple[tuple[str, int], lbtrm.LbtrmPacket]]:
    src.receive(datagram, ("10.0.0.10", 14400), now)
    return [(dst, parse(d)) for d, dst in src.datagrams_to_send(now)]


def source(**options: int | float) -> LbtrmSourceSession:
    settings_ = LbtrmSourceSettings(session_id=SESSION_ID, **options)  # type: ignore[arg-type]
    return LbtrmSourceSession(GROUP, UCAST_PORT, settings_)


# --- the source ---------------------------------------------------------------------------------


def test_data_goes_to_the_group_from_the_unicast_port_with_it_in_the_header() -> None:
    g = make_group(2)
    assert g.send(3) == [0, 1, 2]
    g.run(0.1)
    sent = g.sent_by(SOURCE_IP, lbtrm.LbtrmData)
    assert len(sent) == 6  # three datagrams, one copy to each member
    for _, src, dst, packet in sent:
        assert src == SOURCE and dst == GROUP
        assert (packet.ucast_port, packet.session_id) == (UCAST_PORT, SESSION_ID)
        assert packet.ucast_naks == 1 and packet.rx == 0 and packet.trail_sqn == 0
    assert sorted({p.sqn for *_, p in sent}) == [0, 1, 2]
    for i in (0, 1):
        assert [e.payload for e in g.of(i, Delivered)] == [payload(n) for n in range(3)]


def test_the_session_id_is_random_unless_configured() -> None:
    first, again = (LbtrmSourceSession(GROUP, 1, seed=5) for _ in range(2))
    other = LbtrmSourceSession(GROUP, 1, seed=6)
    assert first.session_id == again.session_id != other.session_id
    assert LbtrmSourceSession(GROUP, 1, LbtrmSourceSettings(session_id=0)).session_id == 0


def test_session_messages_start_at_once_back_off_while_idle_and_carry_the_edges() -> None:
    g = make_group(1, warm_up=0.0)
    g.run(0.5)
    (first,) = g.sent_by(SOURCE_IP, lbtrm.LbtrmSm)
    assert round(first[0], 3) == 0.201
    assert (first[3].lead_sqn, first[3].trail_sqn, first[3].ucast_naks) == (SQN_MASK, 0, 1)
    g.send(1, gap=0.0)
    start = g.net.now
    g.run(45)
    later = [(t - start, p) for t, _, _, p in g.sent_by(SOURCE_IP, lbtrm.LbtrmSm) if t > start]
    gaps = [round(b[0] - a[0], 3) for a, b in itertools.pairwise(later)]
    assert round(later[0][0], 3) == 0.201  # 200 ms after the DATA, plus the link delay
    assert gaps[:6] == [0.4, 0.8, 1.6, 3.2, 6.4, 10.0] and set(gaps[6:]) == {10.0}
    assert {(p.lead_sqn, p.trail_sqn) for _, p in later} == {(0, 0)}
    assert [p.sm_sqn for _, p in later] == list(range(2, 2 + len(later)))


def test_a_repeated_nak_inside_the_ignore_interval_gets_ncf_ignored_on_the_group() -> None:
    src = source()
    for i in range(3):
        src.send(payload(i), 0.1)
    src.datagrams_to_send(0.1)
    ((dst, rx),) = answer(src, nak(1), 0.2)
    assert dst == GROUP and isinstance(rx, lbtrm.LbtrmData) and rx.rx and rx.sqn == 1
    ((dst, ignored),) = answer(src, nak(1), 0.5)  # 300 ms later
    assert dst == GROUP and isinstance(ignored, lbtrm.LbtrmNcf)
    assert ignored.reason == lbtrm.NcfReason.IGNORED and ignored.ncfs == [1]
    assert (ignored.trail_sqn, ignored.ucast_port, ignored.session_id) == \
        (0, UCAST_PORT, SESSION_ID)
    ((_, again),) = answer(src, nak(1), 0.71)  # 510 ms after the retransmission
    assert isinstance(again, lbtrm.LbtrmData) and again.rx
    assert answer(src, nak(3), 0.8) == []  # never sent: nothing to say
    assert src.stats["retransmissions"] == 2 and src.stats["ignored"] == 1


def test_a_nak_older_than_the_window_gets_ncf_do_not_retry() -> None:
    src = source(transmission_window_size=3 * len(payload(0)))
    for i in range(5):
        src.send(payload(i), 0.1)
    src.datagrams_to_send(0.1)
    assert (src.trail_sqn, src.lead_sqn) == (2, 4)
    out = answer(src, nak(1, 4), 0.2)
    rx = [p for _, p in out if isinstance(p, lbtrm.LbtrmData)]
    (gone,) = [p for _, p in out if isinstance(p, lbtrm.LbtrmNcf)]
    assert [p.sqn for p in rx] == [4] and rx[0].rx and rx[0].trail_sqn == 2
    assert gone.reason == lbtrm.NcfReason.NO_RETRY and gone.ncfs == [1] and gone.trail_sqn == 2
    assert {dst for dst, _ in out} == {GROUP}


def test_a_forgotten_datagram_gets_ncf_do_not_retry_and_the_edge_moves_past_it() -> None:
    """``forget`` (the conformance harness losing datagrams for good): what was sent is no
    longer retransmitted, and the next DATA's trailing edge says so."""
    src = source()
    for i in range(3):
        src.send(payload(i), 0.1)
    src.datagrams_to_send(0.1)
    src.forget()
    out = answer(src, nak(1), 0.2)
    (gone,) = [p for _, p in out if isinstance(p, lbtrm.LbtrmNcf)]
    assert gone.reason == lbtrm.NcfReason.NO_RETRY and gone.ncfs == [1]
    assert not [p for _, p in out if isinstance(p, lbtrm.LbtrmData)]
    src.send(payload(3), 0.3)
    (nxt,) = [p for d, _ in src.datagrams_to_send(0.3)
              if isinstance(p := parse(d), lbtrm.LbtrmData)]
    assert (nxt.sqn, nxt.trail_sqn) == (3, 3)


def test_retransmissions_past_the_retransmit_rate_limit_are_shed() -> None:
    # one retransmission per 100 ms interval (the first of an interval always goes)
    src = source(retransmit_rate_limit=int(COST * 8 / 0.1))
    for i in range(4):
        src.send(payload(i), 0.0)
    src.datagrams_to_send(0.0)
    out = answer(src, nak(0, 1, 2), 1.0)
    assert [p.sqn for _, p in out if isinstance(p, lbtrm.LbtrmData)] == [0]
    (shed,) = [p for _, p in out if isinstance(p, lbtrm.LbtrmNcf)]
    assert shed.reason == lbtrm.NcfReason.SHED and shed.ncfs == [1, 2]
    out = answer(src, nak(1), 1.11)  # the next interval
    assert [p.sqn for _, p in out if isinstance(p, lbtrm.LbtrmData)] == [1]
    assert src.stats["shed"] == 2


def test_the_data_rate_limit_holds_data_back_to_later_intervals() -> None:
    # three datagrams per 100 ms interval
    src = source(data_rate_limit=int(3 * COST * 8 / 0.1))
    assert [src.send(payload(i), 0.0) for i in range(10)] == list(range(10))
    first = [parse(d).sqn for d, _ in src.datagrams_to_send(0.0)]
    assert first == [0, 1, 2] and src.backlog == 7 and src.lead_sqn == 2
    assert src.stats["rate_limited"] == 7
    times = {round(t, 3): [] for t in (0.1, 0.2, 0.3)}  # type: dict[float, list[int]]
    for t, _, packet in run_timers(src, 0.35):
        if isinstance(packet, lbtrm.LbtrmData):
            times[round(t, 3)].append(packet.sqn)
    assert times == {0.1: [3, 4, 5], 0.2: [6, 7, 8], 0.3: [9]}
    assert src.backlog == 0 and src.lead_sqn == 9


def test_retransmissions_count_toward_the_data_rate_limit() -> None:
    src = source(data_rate_limit=int(3 * COST * 8 / 0.1))
    src.send(payload(0), 0.0)
    src.send(payload(1), 0.0)
    src.datagrams_to_send(0.0)
    answer(src, nak(0), 0.01)  # the interval's third datagram
    src.send(payload(2), 0.02)
    assert src.datagrams_to_send(0.02) == [] and src.backlog == 1


def test_the_source_drops_what_is_not_a_nak_for_its_session() -> None:
    src = source()
    src.send(payload(0), 0.0)
    src.datagrams_to_send(0.0)
    parity = lbtrm.LbtrmNak(ucast_port=UCAST_PORT, session_id=SESSION_ID,
                            format=lbtrm.FORMAT_PARITY, naks=[0]).build()
    for datagram in (nak(0, sid=SESSION_ID + 1), nak(0, port=UCAST_PORT + 1), parity, data(0),
                     b"\x03\x00"):
        assert answer(src, datagram, 0.1) == []
    assert src.dropped == 5 and src.stats["retransmissions"] == 0


# --- the receiver -------------------------------------------------------------------------------


def test_a_receiver_starts_after_the_lead_of_its_first_session_message() -> None:
    rcv = receiver()
    sm = lbtrm.LbtrmSm(ucast_port=UCAST_PORT, session_id=SESSION_ID, sm_sqn=1, lead_sqn=4,
                       trail_sqn=0).build()
    rcv.receive(sm, SOURCE, 0.0)
    assert rcv.next_sqn == 5 and rcv.connected
    rcv.receive(data(5), SOURCE, 0.1)
    assert [e.sqn for e in events(rcv) if isinstance(e, Delivered)] == [5]
    assert rcv.missing == []


def test_a_receiver_starts_at_its_first_original_data_never_at_a_retransmission() -> None:
    rcv = receiver()
    rcv.receive(data(3, rx=True), SOURCE, 0.0)
    assert rcv.next_sqn is None and rcv.dropped == 1
    rcv.receive(data(7), SOURCE, 0.0)
    rcv.receive(data(8), SOURCE, 0.0)
    assert [e.sqn for e in events(rcv) if isinstance(e, Delivered)] == [7, 8]


def test_reordered_data_is_delivered_in_order_and_duplicates_are_dropped() -> None:
    rcv = receiver()
    for sqn in (0, 3, 2, 3, 1, 0):
        rcv.receive(data(sqn), SOURCE, 0.0)
    rcv.receive(data(2, rx=True), SOURCE, 0.0)
    got = [e for e in events(rcv) if isinstance(e, Delivered)]
    assert [e.sqn for e in got] == [0, 1, 2, 3] and not any(e.retransmission for e in got)
    assert [e.payload for e in got] == [payload(i) for i in range(4)]
    assert rcv.stats["duplicates"] == 3
    assert rcv.datagrams_to_send(0.0) == [] and not rcv.state.buffer


def test_a_gap_is_naked_after_the_initial_backoff_then_backed_off_then_lost() -> None:
    rcv = receiver(nak_generation_interval=2.0)
    rcv.receive(data(0), SOURCE, 0.0)
    rcv.receive(data(3), SOURCE, 0.0)
    sent = run_timers(rcv, 5.0)
    assert sent and all(dst == SOURCE for _, dst, _ in sent)
    for _, _, packet in sent:
        assert isinstance(packet, lbtrm.LbtrmNak) and packet.naks == [1, 2]  # one NAK a gap
        assert (packet.ucast_port, packet.session_id, packet.format) == \
            (UCAST_PORT, SESSION_ID, lbtrm.FORMAT_SELECTIVE)
    times = [t for t, _, _ in sent]
    assert 0.025 <= times[0] < 0.075
    assert all(0.1 <= b - a < 0.3 for a, b in itertools.pairwise(times))
    assert times[-1] < 2.0 and len(times) >= 7
    assert events(rcv) == [Delivered(0, payload(0), False), Lost(1, 2, "timeout"),
                           Delivered(3, payload(3), False)]
    assert rcv.stats["naks"] == len(times) and rcv.stats["nak_entries"] == 2 * len(times)


def test_receivers_draw_their_backoff_apart() -> None:
    firsts = set()
    for seed in range(5):
        rcv = LbtrmReceiverSession(SOURCE_IP, UCAST_PORT, SESSION_ID, seed=seed)
        rcv.receive(data(0), SOURCE, 0.0)
        rcv.receive(data(2), SOURCE, 0.0)
        firsts.add(run_timers(rcv, 0.1)[0][0])
    assert len(firsts) == 5


def test_ncf_do_not_retry_declares_the_numbers_lost_at_once() -> None:
    rcv = receiver()
    for sqn in (0, 3):
        rcv.receive(data(sqn), SOURCE, 0.0)
    rcv.receive(ncf(lbtrm.NcfReason.NO_RETRY, 1, 2, 9), SOURCE, 0.05)
    assert events(rcv) == [Delivered(0, payload(0), False), Lost(1, 2, "ncf"),
                           Delivered(3, payload(3), False)]
    assert rcv.missing == [] and run_timers(rcv, 5.0) == []


@pytest.mark.parametrize("reason", [lbtrm.NcfReason.IGNORED, lbtrm.NcfReason.SHED,
                                    lbtrm.NcfReason.RX_DELAY])
def test_other_ncfs_suppress_the_next_nak_for_half_to_all_of_the_suppress_interval(
        reason: lbtrm.NcfReason) -> None:
    for seed in range(5):
        rcv = LbtrmReceiverSession(SOURCE_IP, UCAST_PORT, SESSION_ID, seed=seed)
        rcv.receive(data(0), SOURCE, 0.0)
        rcv.receive(data(2), SOURCE, 0.0)
        (first,) = run_timers(rcv, 0.08)
        rcv.receive(ncf(reason, 1), SOURCE, first[0] + 0.01)
        (second, *_) = run_timers(rcv, 5.0)
        assert 0.5 <= second[0] - (first[0] + 0.01) <= 1.0
        assert isinstance(second[2], lbtrm.LbtrmNak) and second[2].naks == [1]
        assert not [e for e in events(rcv) if isinstance(e, Lost)]


def test_a_trailing_edge_past_a_missing_number_loses_it() -> None:
    rcv = receiver()
    rcv.receive(data(0), SOURCE, 0.0)
    rcv.receive(data(2), SOURCE, 0.0)
    rcv.receive(data(5, trail=2), SOURCE, 0.01)
    assert [e for e in events(rcv) if isinstance(e, Lost)] == [Lost(1, 1, "window")]
    assert rcv.missing == [3, 4]


def test_with_send_naks_off_nothing_is_naked_and_gaps_are_lost_in_time() -> None:
    rcv = receiver(send_naks=False, nak_generation_interval=2.0)
    rcv.receive(data(0), SOURCE, 0.0)
    rcv.receive(data(2), SOURCE, 0.0)
    assert run_timers(rcv, 1.99) == []
    assert not [e for e in events(rcv) if isinstance(e, Lost)]
    assert run_timers(rcv, 2.01) == []
    assert [e for e in events(rcv) if isinstance(e, Lost)] == [Lost(1, 1, "timeout")]


def test_data_with_options_takes_the_full_parser_to_the_same_result() -> None:
    rcv = receiver()
    with_option = lbtrm.LbtrmData(ucast_port=UCAST_PORT, session_id=SESSION_ID, sqn=4,
                                  trail_sqn=0, options=[lbtrm.LbtrmOption(code=1, data=b"ab")],
                                  payload=payload(4)).build()
    assert with_option[1] != 0
    rcv.receive(with_option, SOURCE, 0.0)
    rcv.receive(data(5), SOURCE, 0.0)
    assert events(rcv) == [Delivered(4, payload(4), False), Delivered(5, payload(5), False)]


def test_datagrams_of_another_session_port_or_source_are_dropped() -> None:
    rcv = receiver()
    rcv.receive(data(0, sid=SESSION_ID + 1), SOURCE, 0.0)
    rcv.receive(data(0, port=UCAST_PORT + 1), SOURCE, 0.0)
    rcv.receive(data(0), ("10.9.9.9", UCAST_PORT), 0.0)
    rcv.receive(b"\x00\x00", SOURCE, 0.0)
    rcv.receive(nak(0), SOURCE, 0.0)  # another receiver's NAK, were NAKs multicast
    assert rcv.dropped == 5 and events(rcv) == [] and rcv.next_sqn is None
    rcv.receive(data(0), (SOURCE_IP, 40000), 0.0)  # the UDP source port is not in the key
    assert events(rcv) == [Delivered(0, payload(0), False)]


def test_a_silent_session_times_out() -> None:
    g = make_group(1)
    g.send(2)
    g.src_filter.drop = lambda d, dst: True  # the source goes silent
    start = g.net.now
    g.run(59)
    assert g.of(0, SourceTimedOut) == []
    g.run(2)
    (timed_out,) = g.of(0, SourceTimedOut)
    assert timed_out.silent_for >= 60
    (session,) = g.ports[0].sessions.values()
    assert session.closed and session.get_timer() is None
    assert g.net.now - start >= 60


def test_sequence_numbers_wrap_around() -> None:
    g = make_group(1, warm_up=0.0)
    g.source.next_sqn = g.source._transmitted = SQN_MASK - 2
    g.run(0.5)  # the first SM says lead SQN_MASK - 3
    g.src_filter.drop = first_copies_of({SQN_MASK, 1})
    assert g.send(6) == [SQN_MASK - 2, SQN_MASK - 1, SQN_MASK, 0, 1, 2]
    g.run(1)
    assert g.delivered() == [SQN_MASK - 2, SQN_MASK - 1, SQN_MASK, 0, 1, 2]
    assert {e.sqn for e in g.of(0, Delivered) if e.retransmission} == {SQN_MASK, 1}


# --- the port -----------------------------------------------------------------------------------


def test_a_port_keeps_one_session_per_source_unicast_port_and_session_id() -> None:
    port = LbtrmReceiverPort()
    port.receive(data(0), SOURCE, 0.0)
    assert port.dropped == 1 and port.sessions == {}  # not opened: nobody asked for it
    port.open(SOURCE_IP, UCAST_PORT, SESSION_ID, 0.0)
    port.receive(data(0), SOURCE, 0.0)
    port.receive(b"\x00", SOURCE, 0.0)
    assert port.next_event() == ((SOURCE_IP, UCAST_PORT, SESSION_ID),
                                 Delivered(0, payload(0), False))
    assert port.dropped == 2
    auto = LbtrmReceiverPort(accept_new=True)
    for sqn in (0, 1):
        for sid in (1, 2):
            auto.receive(data(sqn, sid=sid), SOURCE, 0.0)
        auto.receive(data(sqn, port=UCAST_PORT + 1), SOURCE, 0.0)
    assert set(auto.sessions) == {(SOURCE_IP, UCAST_PORT, 1), (SOURCE_IP, UCAST_PORT, 2),
                                  (SOURCE_IP, UCAST_PORT + 1, SESSION_ID)}
    seen: dict[object, list[int]] = {}
    while (item := auto.next_event()) is not None:
        assert isinstance(item[1], Delivered)
        seen.setdefault(item[0], []).append(item[1].sqn)
    assert list(seen.values()) == [[0, 1]] * 3


def test_settings_are_checked_in_one_line() -> None:
    with pytest.raises(ValueError, match=r"^LBT-RM source: data_rate_limit must be positive"):
        LbtrmSourceSettings(data_rate_limit=0)
    with pytest.raises(ValueError, match="sm_maximum_interval is below"):
        LbtrmSourceSettings(sm_minimum_interval=2.0, sm_maximum_interval=1.0)
    with pytest.raises(ValueError, match="is not 32-bit"):
        LbtrmSourceSettings(session_id=1 << 32)
    with pytest.raises(ValueError, match=r"^LBT-RM receiver: nak_initial_backoff_interval"):
        LbtrmReceiverSettings(nak_initial_backoff_interval=-1)


# --- together -----------------------------------------------------------------------------------


def test_one_retransmission_repairs_every_receiver_that_lost_the_datagram() -> None:
    g = make_group(3)
    g.src_filter.drop = first_copies_of({3, 4, 7})
    g.send(10)
    g.run(2)
    for i in range(3):
        assert g.delivered(i) == list(range(10))
        assert {e.sqn for e in g.of(i, Delivered) if e.retransmission} == {3, 4, 7}
    naks = g.sent_by("10.0.0.10", lbtrm.LbtrmNak)
    assert naks and {(dst, p.ucast_port, p.session_id) for _, _, dst, p in naks} == \
        {(SOURCE, UCAST_PORT, SESSION_ID)}
    # the three NAK nearly together; the source retransmits each number once (to the group)
    # and answers the later NAKs inside the ignore interval with NCF "NAK Ignored"
    assert g.source.stats["retransmissions"] == 3
    rx = g.sent_by(SOURCE_IP, lbtrm.LbtrmData)
    assert {dst for *_, dst, p in rx if p.rx} == {GROUP}


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), loss=st.floats(0.0, 0.3), duplicate=st.floats(0.0, 0.2),
       reorder=st.floats(0.0, 0.3), count=st.integers(1, 150), small_window=st.booleans())
def test_random_loss_duplication_and_reordering_deliver_once_in_order_or_report_lost(
        seed: int, loss: float, duplicate: float, reorder: float, count: int,
        small_window: bool) -> None:
    """Every message reaches each receiver once and in order, or is reported lost (never
    both, never neither); with the default window nothing is lost."""
    window = 5 * len(payload(0)) if small_window else 25_165_824
    g = make_group(2, seed=seed % 1000, source_settings=LbtrmSourceSettings(
        session_id=SESSION_ID, transmission_window_size=window))
    impaired = LinkConfig(delay=0.001, jitter=0.002, loss=loss, duplicate=duplicate,
                          reorder=reorder)
    for i in range(2):
        g.net.set_link("src", f"r{i}", impaired)  # both ways
    g.send(count, gap=0.0005)
    g.run(40)
    for i in range(2):
        delivered, lost = g.delivered(i), g.lost(i)
        assert delivered == sorted(set(delivered))
        assert not set(delivered) & set(lost)
        assert sorted(delivered + lost) == list(range(count))
        assert [e.payload for e in g.of(i, Delivered)] == [payload(n) for n in delivered]
        if not small_window:
            assert lost == []


@pytest.mark.oracle
def test_tshark_agrees_on_every_packet_type(tmp_path: Path) -> None:
    """DATA, DATA(RX), SM, NAK and all three NCF reasons, as the simulator carried them:
    tshark decodes each as LBT-RM with our values, nothing malformed, no error."""
    from wire.dissect import check_against_tshark, dissect_file
    from wire.tshark import expert_summary

    g = make_group(2, source_settings=LbtrmSourceSettings(
        session_id=SESSION_ID, transmission_window_size=8 * len(payload(0)),
        retransmit_rate_limit=int(COST * 8 / 0.1)))
    g.src_filter.drop = first_copies_of({2, 3})
    g.send(6)  # NAK [2, 3]: 2 is retransmitted, 3 shed (one retransmission an interval)
    g.run(1.5)
    g.send(10, start=6)  # the window moves on to 8..15
    r1 = ("10.0.0.11", 14400)

    def inject(sqn: int) -> None:
        g.net.send_datagram(r1, SOURCE, nak(sqn))

    for at, sqn in ((0.0, 14), (0.01, 14), (0.02, 0)):  # RX, "NAK Ignored", "Do not retry"
        g.net.call_at(g.net.now + at, functools.partial(inject, sqn))
    g.run(0.5)
    assert g.delivered(0) == g.delivered(1) == list(range(16))
    kinds = {(type(p).__name__, getattr(p, "rx", 0), getattr(p, "reason", None))
             for p in map(parse, (c.data for c in g.net.trace))}
    assert {("LbtrmData", 0, None), ("LbtrmData", 1, None), ("LbtrmSm", 0, None),
            ("LbtrmNak", 0, None)} <= kinds
    assert {r for name, _, r in kinds if name == "LbtrmNcf"} == {
        lbtrm.NcfReason.NO_RETRY, lbtrm.NcfReason.IGNORED, lbtrm.NcfReason.SHED}
    path = tmp_path / "lbtrm.pcap"
    g.net.write_pcap(path)
    reports = list(dissect_file(path))
    assert reports and all(r.status == "um" and r.transport == "lbtrm" for r in reports)
    assert check_against_tshark(path, reports) == []
    assert "Errors" not in expert_summary(path)
