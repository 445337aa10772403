"""Off-transport recovery (issue 20): the pacing core (:mod:`reference_impl.otr`) and the
receiver that uses it (a gap its transport gave up on is asked of the store after
``otr_request_initial_delay``, again at growing intervals, and delivered with the OTR flag)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from reference_impl.config.profiles import DEFAULT_PROFILE
from reference_impl.events import MessageDelivered, OtrRequested, UnrecoverableLoss
from reference_impl.otr import OtrCore, OtrLost, OtrRequest, OtrSettings, otr_applies
from reference_impl.receiver import ReceiverConfig
from reference_impl.runtime import load_client, receiver_config
from tests.reference_impl.test_quorum_receiver import Rig


def test_use_otr_modes() -> None:
    assert [otr_applies(mode, persistent=True) for mode in (0, 1, 2)] == [False, True, True]
    assert [otr_applies(mode, persistent=False) for mode in (0, 1, 2)] == [False, True, False]


def run_core(core: OtrCore, until: float, step: float = 0.01) -> list[tuple[float, object]]:
    """Call ``due`` at every deadline up to ``until``; what it returned, with the time."""
    out: list[tuple[float, object]] = []
    now = 0.0
    while now <= until:
        deadline = core.deadline()
        if deadline is None or deadline > until:
            break
        now = max(now, deadline)
        out += [(now, action) for action in core.due(now)]
        now += step / 10
    return out


def test_first_request_after_the_initial_delay_then_doubling_to_the_maximum() -> None:
    core = OtrCore(OtrSettings(initial_delay=2.0, minimum_interval=1.0, maximum_interval=4.0,
                               message_timeout=20.0))
    core.gap(5, 8, now=0.0)
    assert core.deadline() == 2.0 and core.due(1.99) == []
    actions = run_core(core, 30.0)
    requests = [(t, a) for t, a in actions if isinstance(a, OtrRequest)]
    assert [round(t, 6) for t, _ in requests] == [2.0, 3.0, 5.0, 9.0, 13.0, 17.0, 21.0]
    assert [a.attempt for _, a in requests] == list(range(1, 8))
    assert all(a.sequence_numbers == (5, 6, 7) for _, a in requests)
    # given up retransmit_request_message_timeout (20 s) after the first request
    (lost,) = [(t, a) for t, a in actions if isinstance(a, OtrLost)]
    assert lost[0] == pytest.approx(22.0) and lost[1] == OtrLost((5, 6, 7))
    assert core.deadline() is None and len(core) == 0


def test_what_arrives_is_not_asked_for_and_a_full_gap_is_done() -> None:
    core = OtrCore(OtrSettings(initial_delay=1.0, minimum_interval=0.5, maximum_interval=1.0))
    core.gap(10, 14, now=0.0)
    assert core.received(11) and not core.received(11) and not core.received(99)
    assert core.due(1.0) == [OtrRequest((10, 12, 13), 1)]
    for sqn in (10, 12, 13):
        assert sqn in core
        core.received(sqn)
    assert core.deadline() is None and core.due(5.0) == []


def test_bad_pacing_is_refused() -> None:
    with pytest.raises(ValueError, match="minimum_interval exceeds"):
        OtrSettings(minimum_interval=5.0, maximum_interval=1.0)
    with pytest.raises(ValueError, match="otr_request_minimum_interval"):
        ReceiverConfig(otr_request_minimum_interval=3000, otr_request_maximum_interval=2000)


def test_the_profiles_defaults_reach_the_receiver() -> None:
    current = receiver_config(load_client(None, profile=DEFAULT_PROFILE))
    assert (current.use_otr, current.otr_request_initial_delay,
            current.otr_request_minimum_interval, current.otr_request_maximum_interval) == \
        (2, 2000, 1000, 10000)
    assert current.otr_message_caching_threshold == 10000
    guide = receiver_config(load_client(None, profile="guide-5.3"))
    assert guide.use_otr == 0


# --- the receiver ----------------------------------------------------------------------------


def otr_rig(**options: int) -> Rig:
    pacing: dict[str, Any] = {"otr_request_initial_delay": 600,
                              "otr_request_minimum_interval": 200,
                              "otr_request_maximum_interval": 500}
    rig = Rig(1, high=4, **(pacing | options))
    rig.grant(0, low=5)  # registered, nothing to recover
    return rig


def delivered(rig: Rig) -> list[MessageDelivered]:
    return [e for e in rig.events if isinstance(e, MessageDelivered)]


def test_a_transport_gap_is_asked_for_after_the_initial_delay_and_delivered_flagged() -> None:
    rig = otr_rig()
    rig.live(5, 6, 9, 10)  # 7 and 8: the transport gave up on them
    rig.tick(0.55)
    assert [d.sequence_number for d in delivered(rig)] == [5, 6]
    assert rig.rxreqs(0) == []  # not before otr_request_initial_delay
    rig.tick(0.1)
    assert sorted(rig.rxreqs(0)) == [7, 8]
    (asked,) = [e for e in rig.events if isinstance(e, OtrRequested)]
    assert (asked.first, asked.last, asked.count, asked.attempt) == (7, 8, 2, 1)
    rig.retransmit(0, 7, 8)
    got = delivered(rig)
    assert [d.sequence_number for d in got] == [5, 6, 7, 8, 9, 10]
    assert [d.sequence_number for d in got if d.otr] == [7, 8]
    assert all(d.retransmission for d in got if d.otr)
    rig.tick(2.0)
    assert sorted(rig.rxreqs(0)) == [7, 8]  # nothing asked again once it came


def test_a_gap_the_transport_fills_late_is_never_asked_for() -> None:
    rig = otr_rig()
    rig.live(5, 7)
    rig.tick(0.3)
    rig.live(6)  # the transport's own repair, within the initial delay
    rig.tick(2.0)
    assert rig.rxreqs(0) == []
    assert [d.sequence_number for d in delivered(rig)] == [5, 6, 7]
    assert not any(d.otr for d in delivered(rig))


def test_unanswered_requests_back_off_then_the_gap_is_lost() -> None:
    rig = otr_rig(retransmit_request_message_timeout=3000)
    rig.live(5, 7)
    times: list[float] = []
    for _ in range(int(4.0 / 0.01)):
        before = len(rig.rxreqs(0))
        rig.tick(0.01, step=0.01)
        if len(rig.rxreqs(0)) > before:
            times.append(rig.now)
    assert times[0] == pytest.approx(0.6, abs=0.011)
    waits = [round(b - a, 2) for a, b in itertools.pairwise(times)]
    assert waits[:2] == [0.2, 0.4]  # from the minimum interval, doubling ...
    assert all(0.5 <= w <= 0.52 for w in waits[2:]) and len(waits) >= 5  # ... to the maximum
    assert times[-1] < 0.6 + 3.0
    losses = [(e.first, e.last) for e in rig.events if isinstance(e, UnrecoverableLoss)]
    assert losses == [(6, 6)]
    assert [d.sequence_number for d in delivered(rig)] == [5, 7]


def test_without_use_otr_a_transport_gap_is_lost_at_once_and_never_asked_for() -> None:
    rig = otr_rig(use_otr=0)
    rig.live(5, 8, 9)
    rig.tick(5.0)
    assert rig.rxreqs(0) == []
    losses = [(e.first, e.last) for e in rig.events if isinstance(e, UnrecoverableLoss)]
    assert losses == [(6, 7)]
    assert [d.sequence_number for d in delivered(rig)] == [5, 8, 9]


def test_registration_recovery_is_not_otr() -> None:
    """What the store holds below the first live message is recovered at once, unflagged."""
    rig = Rig(1, high=9, otr_request_initial_delay=5000)
    rig.grant(0, low=5)
    rig.tick(0.05)
    assert sorted(rig.rxreqs(0)) == [5, 6, 7, 8, 9]
    rig.retransmit(0, 5, 6, 7, 8, 9)
    rig.live(10)
    assert [d.sequence_number for d in delivered(rig)] == list(range(5, 11))
    assert not any(d.otr for d in delivered(rig))


def test_more_held_than_the_caching_threshold_gives_the_gaps_up() -> None:
    rig = otr_rig(otr_message_caching_threshold=5)
    rig.live(5, 7, 8, 9, 10, 11)  # 6 missing, five held behind it: at the threshold
    assert [d.sequence_number for d in delivered(rig)] == [5]
    rig.live(12)  # six held: past it
    losses = [(e.first, e.last) for e in rig.events if isinstance(e, UnrecoverableLoss)]
    assert losses == [(6, 6)]
    assert [d.sequence_number for d in delivered(rig)] == [5, 7, 8, 9, 10, 11, 12]
    rig.tick(2.0)
    assert rig.rxreqs(0) == []  # given up before its first request: never asked
