"""Receiver-paced persistence (RPP) in whole deployments, one scenario per flow of the guide's
"Receiver-paced Persistence Operations" (docs/semantics.md §1.13, §1.14, §2.1, §2.2).

Each test builds a :class:`SimDeployment` (resolver, stores, an RPP source, blocking and
non-blocking RPP receivers on a simulated network with a virtual clock), drives it through the
flow and checks the application events and the store's state; wherever a blocking receiver is
involved it checks that nothing was lost for it.  The RPP rules themselves (override table,
consistency, refusals) are :mod:`reference_impl.rpp`'s; these tests only use its names.  The
last test runs, for each RPP store mutant of ``tests/conformance/mutant_store.py`` the simulator
can play, the scenario that must catch it, and checks that it does.

Sizes (payload bytes; RPP counts payload only): 100-byte messages, the source's
``ume_flight_size_bytes`` 10 messages, the topic's maximum 20, size threshold 30 and size limit
50 messages, so the source can run at most about 50 + 10 messages ahead of its slowest blocking
receiver.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import pytest

from reference_impl import events as ev
from reference_impl import rpp
from reference_impl.deployment import SimDeployment
from reference_impl.receiver import ReceiverCore
from reference_impl.source import SendError, SendErrorCode, SourceCore
from reference_impl.store import SourceState, StoreCore, TopicPolicy, TopicRule
from wire.lbmc import PregError

E = TypeVar("E")
TOPIC = "rpp.orders"
PAYLOAD = 100
FLIGHT = 10 * PAYLOAD
"""The RPP source's ``ume_flight_size_bytes`` (an override: the topic allows twice that)."""
LIMIT = 50 * PAYLOAD
RPP_TOPIC = TopicPolicy(repository_allow_receiver_paced_persistence=1,
                        source_flight_size_bytes_maximum=2 * FLIGHT,
                        repository_size_threshold=30 * PAYLOAD, repository_size_limit=LIMIT,
                        receiver_activity_timeout=4000, receiver_state_lifetime=10_000)
"""A memory topic that allows RPP, sized as the module docstring says; a receiver is inactive
4 s after it was last heard of and forgotten 10 s after."""
DISK_TOPIC = replace(RPP_TOPIC, repository_type="disk", repository_allow_ack_on_reception=1,
                     repository_disk_write_delay=2000,
                     repository_disk_file_size_limit=100 * LIMIT)
"""A disk topic that also allows ack on reception and delays writes by 2 s."""
RECEIVER_KEEPALIVE = 1000
"""Receivers' ``ume_proactive_keepalive_interval``: well inside the 4 s activity timeout."""


def deployment(stores: int = 1, policy: TopicPolicy = RPP_TOPIC, seed: int = 1,
               **settings: Any) -> SimDeployment:
    d = SimDeployment(seed=seed)
    for i in range(stores):
        d.add_store(f"store{i}", topics=(TopicRule(".*", policy, kind="PCRE"),),
                    seed=300 + i, **settings)
    return d


def rpp_source(d: SimDeployment, name: str = "src", **options: Any) -> SourceCore:
    """An RPP source (``ume_receiver_paced_persistence 1``) with its flight size in bytes."""
    options.setdefault("ume_flight_size_bytes", FLIGHT)
    return d.add_source(name, TOPIC, ume_receiver_paced_persistence=rpp.BLOCKING, **options)


def rpp_receiver(d: SimDeployment, name: str, mode: int = rpp.BLOCKING, *, slow: bool = False,
                 **options: Any) -> ReceiverCore:
    """An RPP receiver; ``slow``: its application acknowledges explicitly
    (``ume_explicit_ack_only 1``), see :func:`pump`."""
    if slow:
        options["ume_explicit_ack_only"] = 1
    options.setdefault("ume_proactive_keepalive_interval", RECEIVER_KEEPALIVE)
    return d.add_receiver(name, TOPIC, ume_receiver_paced_persistence=mode, **options)


def payload(number: int) -> bytes:
    return b"%d:" % number + b"." * (PAYLOAD - len(b"%d:" % number))


def of(d: SimDeployment, name: str, kind: type[E]) -> list[E]:
    """The events of class ``kind`` that ``name`` produced so far, oldest first."""
    return [e for e in d.events(name, kind) if isinstance(e, kind)]


def sqns(d: SimDeployment, name: str) -> list[int]:
    return [e.sequence_number for e in of(d, name, ev.MessageDelivered)]


def registered(d: SimDeployment, *names: str) -> bool:
    return all(getattr(d.sources.get(n) or d.receivers[n], "complete", False) for n in names)


def only_source(store: StoreCore) -> SourceState:
    (state,) = store.sources.values()
    return state


def held(state: SourceState) -> int:
    """How many messages the source's repository holds."""
    assert state.repo is not None
    return len(state.repo)


def values(state: SourceState) -> rpp.RppValues:
    """The effective RPP values the store runs the source's repository with."""
    assert state.rpp_values is not None
    return state.rpp_values


def send_some(src: SourceCore, n: int) -> int:
    """Send up to ``n`` messages now, as many as the flight size lets through."""
    sent = 0
    for _ in range(n):
        try:
            src.send(payload(src.next_sqn))
        except SendError as exc:
            assert exc.code is SendErrorCode.WOULD_BLOCK, exc
            break
        sent += 1
    return sent


def send_all(d: SimDeployment, src: SourceCore, n: int, limit: float = 10.0) -> int:
    """Send ``n`` messages, a flight at a time, running the network in between; returns how
    many went out before ``limit`` virtual seconds (fewer: the source was held back)."""
    sent, end = 0, d.now + limit
    while sent < n and d.now < end:
        sent += send_some(src, n - sent)
        d.run(0.05)
    return sent


@dataclass
class Paced:
    """What :func:`pump` saw.

    Attributes:
        seconds: virtual seconds from the first send until the slow application consumed
            the last message.
        sent_by: virtual second (from the start) at which the source had sent everything.
        max_inflight_bytes: the source's in-flight payload bytes at their highest.
        max_ahead: how many messages the fastest receiver was ahead of the slow
            application's consumption at most.
        max_used: the most payload bytes any store's repository held for the source.
        withheld: steps in which a store held back stability ACKs of the source.
        drops: messages a store dropped because its repository was full.
    """

    seconds: float
    sent_by: float
    max_inflight_bytes: int
    max_ahead: int
    max_used: int
    withheld: int
    drops: int


def pump(d: SimDeployment, n: int, *, slow: str, rate: float, src: str = "src",
         step: float = 0.01, limit: float = 120.0) -> Paced:
    """Send ``n`` messages as fast as the source may while the application of receiver
    ``slow`` consumes at most ``rate`` a second (it acknowledges each consumed one through
    :meth:`ReceiverCore.ack`); every other receiver consumes at once.  Runs until ``slow``
    consumed all ``n`` (or ``limit`` virtual seconds)."""
    source, late = d.sources[src], d.receivers[slow]
    fast = [r for name, r in d.receivers.items() if name != slow]
    base = {id(r): r.stats["delivered"] for r in [late, *fast]}  # delivered before the pump
    start, end = d.now, d.now + limit
    sent = consumed = 0
    budget = 0.0
    seen = Paced(0.0, 0.0, 0, 0, 0, 0, 0)
    first = source.next_sqn
    while d.now < end and consumed < n:
        if sent < n:
            sent += send_some(source, n - sent)
            if sent == n and not seen.sent_by:
                seen.sent_by = d.now - start
        seen.max_inflight_bytes = max(seen.max_inflight_bytes, source.inflight_bytes)
        budget = min(budget + rate * step, max(1.0, rate * 0.05))
        have = late.stats["delivered"] - base[id(late)] - consumed
        take = min(int(budget), have)
        if take:
            consumed += take
            budget -= take
            late.ack(first + consumed - 1)
        d.run(step)
        ahead = max((r.stats["delivered"] - base[id(r)] for r in fast), default=0) - consumed
        seen.max_ahead = max(seen.max_ahead, ahead)
        for store in d.stores.values():
            for state in store.sources.values():
                if state.repo is not None:
                    seen.max_used = max(seen.max_used, state.repo.used_bytes)
                    seen.drops = max(seen.drops, state.repo.intentional_drops)
                if state.unacked:
                    seen.withheld += 1
    seen.seconds = d.now - start
    return seen


# --- "RPP Registration" ------------------------------------------------------------------------


def test_rpp_registration_source_and_both_receiver_modes_are_confirmed() -> None:
    """"RPP Registration": the source decides RPP on its first registration and its overrides
    travel with its PREG; the store confirms RPP to it and to blocking and non-blocking
    receivers, and runs the repository with the effective values (§2.2)."""
    d = deployment()
    src = rpp_source(d)
    rpp_receiver(d, "blocking")
    rpp_receiver(d, "nonblocking", rpp.NON_BLOCKING)
    assert d.run_until(lambda: registered(d, "src", "blocking", "nonblocking"), 15)
    (success,) = of(d, "src", ev.SourceRegistrationSuccess)
    assert success.rpp
    for name in ("blocking", "nonblocking"):
        assert [e.rpp for e in of(d, name, ev.ReceiverRegistrationSuccess)] == [True]
    state = only_source(d.stores["store0"])
    assert state.rpp
    # the source's flight size override, the topic's own values for the rest
    assert state.rpp_values == replace(rpp.store_values(RPP_TOPIC), flight_size_bytes=FLIGHT)
    modes = sorted(r.rpp for r in state.receivers.values())
    assert modes == [rpp.BLOCKING, rpp.NON_BLOCKING]
    assert src.send(payload(0)) == 0


def test_an_override_above_the_topic_maximum_is_refused_and_others_are_served() -> None:
    """"RPP Registration" / §2.2: a source may only lower the store's values; above the
    maximum the store refuses it (ECONFIG) with a log line naming the option and both values,
    and an RPP source already registered goes on being served."""
    d = deployment()
    good = rpp_source(d, "good")
    rpp_receiver(d, "rcv")
    assert d.run_until(lambda: registered(d, "good", "rcv"), 15)
    greedy = rpp_source(d, "greedy", ume_flight_size_bytes=2 * FLIGHT + 1)
    d.run(3)
    errors = of(d, "greedy", ev.SourceRegistrationError)
    assert errors and {e.code for e in errors} == {PregError.ECONFIG}
    assert all(e.rpp for e in errors)
    assert not greedy.complete
    warnings = [e.text for e in of(d, "store0", ev.LogRecord)
                if e.level is ev.Level.WARNING and "ume_flight_size_bytes" in e.text]
    assert warnings and f"{2 * FLIGHT + 1}" in warnings[0] and f"{2 * FLIGHT}" in warnings[0]
    assert len(d.stores["store0"].sources) == 1  # nothing of the refused source was kept
    send_some(good, 5)
    d.run(1)
    assert good.stats["stable"] == 5
    assert sqns(d, "rcv") == list(range(5))


def test_an_rpp_source_is_refused_where_rpp_is_not_allowed() -> None:
    """"RPP Registration" / §2.1: a topic without ``repository-allow-receiver-paced-persistence``
    refuses an RPP source (ECONFIG), and keeps nothing of it."""
    d = deployment(policy=replace(RPP_TOPIC, repository_allow_receiver_paced_persistence=0))
    src = rpp_source(d)
    d.run(3)
    errors = of(d, "src", ev.SourceRegistrationError)
    assert errors and {e.code for e in errors} == {PregError.ECONFIG} and errors[0].rpp
    assert not src.complete and d.stores["store0"].sources == {}


def test_inconsistent_effective_values_are_refused() -> None:
    """§2.2: the effective values must be consistent; a size threshold (lowered by the source)
    that is not above the flight size in bytes is refused, with a log line naming it."""
    d = deployment()
    src = rpp_source(d, ume_repository_size_threshold=FLIGHT)
    d.run(3)
    assert {e.code for e in of(d, "src", ev.SourceRegistrationError)} == {PregError.ECONFIG}
    assert not src.complete and d.stores["store0"].sources == {}
    assert any("not above the flight size" in e.text for e in of(d, "store0", ev.LogRecord)
               if e.level is ev.Level.WARNING)


def test_a_restarted_rpp_source_must_present_the_same_values() -> None:
    """§2.1, last paragraph: an RPP source re-registering on its repository (same Session ID)
    with another flight size is refused; with the same values it is granted as old and
    resumes its sequence numbers."""
    d = deployment()
    src = rpp_source(d, ume_session_id=0x5E)
    rpp_receiver(d, "rcv")
    assert d.run_until(lambda: registered(d, "src", "rcv"), 15)
    assert send_all(d, src, 5) == 5
    d.run(1)
    changed = d.restart("src", ume_flight_size_bytes=FLIGHT // 2)
    assert isinstance(changed, SourceCore)
    d.run(3)
    assert not changed.complete
    assert {e.code for e in of(d, "src", ev.SourceRegistrationError)} == {PregError.ECONFIG}
    same = d.restart("src", ume_flight_size_bytes=FLIGHT)
    assert isinstance(same, SourceCore)
    assert d.run_until(lambda: same.complete, 15)
    assert of(d, "src", ev.SourceRegistrationSuccess)[-1].old
    assert send_all(d, same, 5) == 5
    d.run(1)
    assert sqns(d, "rcv") == list(range(10))


# --- "RPP Normal Operations" -------------------------------------------------------------------


def test_the_slowest_blocking_receiver_paces_the_source_and_loses_nothing() -> None:
    """"RPP Normal Operations": the store keeps every message until every blocking receiver
    consumed it and withholds stability ACKs while less than one flight size of room is left,
    so the source's flight size (bytes) stops it: it sends at the slow application's rate,
    never more than one flight in flight, and both receivers get everything in order."""
    d = deployment()
    src = rpp_source(d)
    rpp_receiver(d, "fast")
    rpp_receiver(d, "slow", slow=True)
    assert d.run_until(lambda: registered(d, "src", "fast", "slow"), 15)
    n, rate = 300, 100.0
    seen = pump(d, n, slow="slow", rate=rate)
    assert sqns(d, "fast") == list(range(n))
    assert sqns(d, "slow") == list(range(n))
    # paced: all but what the repository and one flight hold went out at the slow rate
    assert seen.sent_by >= 0.9 * (n - (LIMIT + FLIGHT) // PAYLOAD) / rate, seen
    assert seen.seconds >= 0.9 * n / rate, seen
    assert 0 < seen.max_inflight_bytes <= FLIGHT, seen
    assert seen.max_ahead <= (LIMIT + FLIGHT) // PAYLOAD, seen
    assert seen.max_used <= LIMIT and seen.drops == 0, seen
    assert seen.withheld > 0, seen  # the store did hold stability back
    d.run(2)
    assert src.inflight == 0 and src.stats["stable"] == n
    state = only_source(d.stores["store0"])
    assert state.repo is not None and len(state.repo) == 0  # released once both consumed


def test_without_a_slow_receiver_the_source_is_not_held_back() -> None:
    """The counterpart of the pacing test: both blocking receivers consume at once, so the
    store always has room and the same 300 messages go out in a fraction of the time."""
    d = deployment()
    rpp_receiver(d, "a")
    rpp_receiver(d, "b", slow=True)
    rpp_source(d)
    assert d.run_until(lambda: registered(d, "src", "a", "b"), 15)
    seen = pump(d, 300, slow="b", rate=100_000.0)
    assert seen.sent_by < 1.0, seen
    assert sqns(d, "a") == sqns(d, "b") == list(range(300))


def test_a_non_blocking_receiver_never_holds_the_source_back() -> None:
    """"RPP Normal Operations" (current docs, receiver mode 2): a non-blocking receiver does not
    count for release; the blocking one paces the source alone, and the non-blocking one
    that never acknowledges is simply left behind."""
    d = deployment()
    src = rpp_source(d)
    rpp_receiver(d, "blocking", slow=True)
    rpp_receiver(d, "idle", rpp.NON_BLOCKING, slow=True)  # receives, never acknowledges
    assert d.run_until(lambda: registered(d, "src", "blocking", "idle"), 15)
    seen = pump(d, 200, slow="blocking", rate=100_000.0)
    assert seen.sent_by < 1.0 and seen.drops == 0, seen
    d.run(2)
    assert src.stats["stable"] == 200
    state = only_source(d.stores["store0"])
    assert state.repo is not None and len(state.repo) < 200  # released past the idle one
    assert sqns(d, "blocking") == list(range(200))


def test_ack_on_reception_and_write_delay_on_a_disk_repository(tmp_path: Path) -> None:
    """"RPP Normal Operations": a disk repository acknowledges a message once written, unless
    ack on reception is in effect (the topic allows it and the source asks for it); with a
    write delay a message waits in memory, and one that every receiver consumed before the
    delay ended is never written (and acknowledged at once)."""
    def disk(sub: str) -> SimDeployment:
        return deployment(policy=DISK_TOPIC, disk_cache_directory=tmp_path / sub / "cache",
                          disk_state_directory=tmp_path / sub / "state")

    # ack on reception: stable at once, though the write is 2 s away
    d = disk("aor")
    src = rpp_source(d, ume_repository_ack_on_reception=1)
    rpp_receiver(d, "rcv", slow=True)
    assert d.run_until(lambda: registered(d, "src", "rcv"), 15)
    assert values(only_source(d.stores["store0"])).ack_on_reception == 1
    send_some(src, 5)
    d.run(0.2)
    assert src.stats["stable"] == 5

    # after the write: nothing stable before the delay ends, then all
    d = disk("write")
    src = rpp_source(d)
    rpp_receiver(d, "rcv", slow=True)
    assert d.run_until(lambda: registered(d, "src", "rcv"), 15)
    send_some(src, 5)
    d.run(1.0)
    assert src.stats["stable"] == 0
    d.run(1.5)
    assert src.stats["stable"] == 5
    repo = only_source(d.stores["store0"]).repo
    assert repo is not None and repo.disk_writes_skipped == 0

    # consumed within the delay: acknowledged then, never written
    d = disk("skip")
    src = rpp_source(d)
    rcv = rpp_receiver(d, "rcv", slow=True)
    assert d.run_until(lambda: registered(d, "src", "rcv"), 15)
    send_some(src, 5)
    d.run(0.3)
    rcv.ack(4)
    d.run(0.3)
    assert src.stats["stable"] == 5
    d.run(3)
    repo = only_source(d.stores["store0"]).repo
    assert repo is not None and repo.disk_writes_skipped == 5
    assert sqns(d, "rcv") == list(range(5))


# --- "Late Registering Receiver" ---------------------------------------------------------------


@pytest.mark.parametrize("guide", [False, True], ids=["current", "guide-5.3"])
def test_late_registering_receiver(guide: bool) -> None:
    """"Late Registering Receiver" (§1.14): current docs - a receiver whose first registration
    comes after the first message gets nothing sent before it; the guide - it starts at the
    oldest message not yet consumed by every RPP receiver.  The early receiver loses nothing
    either way."""
    d = deployment(rpp_late_join_unconsumed=guide)
    src = rpp_source(d)
    early = rpp_receiver(d, "early", slow=True)
    assert d.run_until(lambda: registered(d, "src", "early"), 15)
    send_some(src, 10)
    d.run(0.5)
    early.ack(4)  # consumed 0..4; 5..9 still held for it
    d.run(0.5)
    rpp_receiver(d, "late")
    assert d.run_until(lambda: registered(d, "late"), 15)
    d.run(1)
    send_some(src, 5)
    d.run(2)
    first = 5 if guide else 10
    assert sqns(d, "late") == list(range(first, 15))
    assert sqns(d, "early") == list(range(15))
    (success,) = of(d, "late", ev.ReceiverRegistrationSuccess)
    assert success.low_sequence_number == first


# --- "Early Exiting Receiver" ------------------------------------------------------------------


def test_early_exiting_receiver_holds_messages_until_its_state_lifetime_ends() -> None:
    """"Early Exiting Receiver": a blocking receiver that goes away keeps its messages in the
    repository past its activity timeout (4 s) until its state lifetime (10 s) ends; then its
    state goes and what was held only for it is released, so the source runs again."""
    d = deployment()
    src = rpp_source(d)
    rpp_receiver(d, "stays")
    rpp_receiver(d, "quits", ume_session_id=0x0E)
    assert d.run_until(lambda: registered(d, "src", "stays", "quits"), 15)
    assert send_all(d, src, 20) == 20
    d.run(1)
    d.kill("quits")
    d.run(0.5)
    for _ in range(20):  # the flight size lets part through; the rest waits for room
        send_some(src, 10)
        d.run(0.1)
    store = d.stores["store0"]
    state = only_source(store)
    kept = held(state)
    assert kept > 0
    d.run(4)  # past the activity timeout: inactive, still holding
    quitter = [r for r in state.receivers.values() if r.session_id == 0x0E]
    assert quitter and not quitter[0].active
    assert held(state) >= kept
    d.run(7)  # past the state lifetime: forgotten, released
    assert not [r for r in state.receivers.values() if r.session_id == 0x0E]
    assert held(state) == 0
    sent = src.next_sqn
    assert send_some(src, 5) == 5
    d.run(1)
    assert sqns(d, "stays") == list(range(sent + 5))


def test_early_exiting_receiver_that_returns_in_time_recovers_what_it_missed() -> None:
    """"Early Exiting Receiver": back before its state lifetime ends, the receiver registers
    again (same Session ID) and recovers every message since its last acknowledgement."""
    d = deployment()
    src = rpp_source(d)
    rpp_receiver(d, "stays")
    rpp_receiver(d, "quits", ume_session_id=0x0E)
    assert d.run_until(lambda: registered(d, "src", "stays", "quits"), 15)
    send_some(src, 10)
    d.run(1)
    d.kill("quits")
    d.run(0.5)
    for _ in range(5):
        send_some(src, 10)
        d.run(0.1)
    sent = src.next_sqn
    assert sent > 10
    d.run(5)  # past the activity timeout, well before the state lifetime
    before = len(sqns(d, "quits"))
    assert sqns(d, "quits") == list(range(10))
    d.restart("quits")
    assert d.run_until(lambda: registered(d, "quits"), 15)
    d.run(3)
    assert sqns(d, "quits")[before:] == list(range(10, sent))  # all it missed, once
    state = only_source(d.stores["store0"])
    d.run(2)
    assert held(state) == 0


# --- "RPP Deregistration" ----------------------------------------------------------------------


def test_receiver_deregistration_stops_it_holding_messages() -> None:
    """"RPP Deregistration": a deregistered receiver's state is dropped at once and the
    messages only it still needed are released; it goes on receiving but acknowledges
    nothing, and the source is not held back by it any more."""
    d = deployment()
    src = rpp_source(d)
    rpp_receiver(d, "stays")
    leaver = rpp_receiver(d, "leaves", slow=True)  # never acknowledges
    assert d.run_until(lambda: registered(d, "src", "stays", "leaves"), 15)
    assert send_all(d, src, 30) == 30
    d.run(1)
    state = only_source(d.stores["store0"])
    assert held(state) == 30
    leaver.deregister()
    d.run(1)
    done = of(d, "leaves", ev.ReceiverDeregistered)
    assert [e.store is None for e in done] == [False, True]
    assert len(state.receivers) == 1
    assert held(state) == 0
    seen = pump(d, 200, slow="stays", rate=100_000.0)
    assert seen.sent_by < 1.0, seen  # nothing waits for the one that left
    d.run(1)
    assert sqns(d, "leaves") == list(range(230))  # still receives
    assert sqns(d, "stays") == list(range(230))


def test_source_deregistration_deletes_its_retained_messages() -> None:
    """"RPP Deregistration": a deregistering source's retained RPP messages are deleted at
    once and its state with them; the source then cannot send."""
    d = deployment()
    src = rpp_source(d)
    rpp_receiver(d, "slow", slow=True)
    assert d.run_until(lambda: registered(d, "src", "slow"), 15)
    assert send_all(d, src, 20) == 20
    d.run(1)
    store = d.stores["store0"]
    assert held(only_source(store)) == 20
    src.deregister()
    d.run(1)
    assert [e.store is None for e in of(d, "src", ev.SourceDeregistered)] == [False, True]
    assert store.sources == {}
    with pytest.raises(SendError) as info:
        src.send(b"after")
    assert info.value.code is SendErrorCode.DEREGISTERED
    assert sqns(d, "slow") == list(range(20))  # delivered before; nothing more owed


# --- two stores --------------------------------------------------------------------------------


def test_two_store_rpp_deployment_paced_by_the_slow_receiver() -> None:
    """RPP with two stores (the guide's RPP works per store): both grant RPP with the same
    effective values, both hold each message until every blocking receiver consumed it and
    withhold stability when full; the source is paced, nothing is lost, both empty at the
    end."""
    d = deployment(stores=2)
    src = rpp_source(d)
    rpp_receiver(d, "fast")
    rpp_receiver(d, "slow", slow=True)
    assert d.run_until(lambda: registered(d, "src", "fast", "slow"), 15)
    assert [e.rpp for e in of(d, "src", ev.SourceRegistrationSuccess)] == [True, True]
    for store in d.stores.values():
        state = only_source(store)
        assert state.rpp and values(state).flight_size_bytes == FLIGHT
        assert len(state.receivers) == 2
    n, rate = 200, 100.0
    seen = pump(d, n, slow="slow", rate=rate)
    assert sqns(d, "fast") == sqns(d, "slow") == list(range(n))
    assert seen.sent_by >= 0.9 * (n - (LIMIT + FLIGHT) // PAYLOAD) / rate, seen
    assert seen.max_inflight_bytes <= FLIGHT and seen.max_used <= LIMIT, seen
    assert seen.drops == 0 and seen.withheld > 0, seen
    d.run(2)
    assert src.inflight == 0
    for store in d.stores.values():
        assert held(only_source(store)) == 0


# --- each RPP store mutant breaks a scenario ---------------------------------------------------

CAUGHT_BY = {
    "grants-rpp-not-allowed": "test_an_rpp_source_is_refused_where_rpp_is_not_allowed",
    "releases-on-any-ack": "test_the_slowest_blocking_receiver_paces_the_source_and_loses_nothing",
    "ignores-override-maximum":
        "test_an_override_above_the_topic_maximum_is_refused_and_others_are_served",
    "ignores-consistency": "test_inconsistent_effective_values_are_refused",
    "accepts-changed-rpp-values": "test_a_restarted_rpp_source_must_present_the_same_values",
    "acks-rpp-without-room":
        "test_the_slowest_blocking_receiver_paces_the_source_and_loses_nothing",
    "writes-despite-consumed": "test_ack_on_reception_and_write_delay_on_a_disk_repository",
    "blocking-is-non-blocking": "test_a_non_blocking_receiver_never_holds_the_source_back",
    "forgets-early-exiter":
        "test_early_exiting_receiver_holds_messages_until_its_state_lifetime_ends",
    "keeps-deregistered-receiver": "test_receiver_deregistration_stops_it_holding_messages",
    "keeps-deregistered-source-messages":
        "test_source_deregistration_deletes_its_retained_messages",
}
"""The store mutants of ``tests/conformance/mutant_store.py`` that the simulator can play (the
late-receiver one patches the daemon's settings, which the simulator does not use), and the
scenario that must fail under each."""

RUN_UNDER_MUTANT = """
import inspect, sys, tempfile
from pathlib import Path
from tests.conformance import mutant_store
from tests.reference_impl import test_rpp_scenarios as scenarios
mutant_store.MUTANTS[sys.argv[1]]()
test = getattr(scenarios, sys.argv[2])
try:
    test(*[Path(tempfile.mkdtemp())] if inspect.signature(test).parameters else [])
except AssertionError:
    sys.exit(3)
"""


@pytest.mark.parametrize("mutant", sorted(CAUGHT_BY))
def test_the_scenario_fails_under_each_rpp_store_mutant(mutant: str) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    result = subprocess.run([sys.executable, "-c", RUN_UNDER_MUTANT, mutant, CAUGHT_BY[mutant]],
                            cwd=root, capture_output=True, text=True, timeout=120)
    assert result.returncode == 3, result.stdout + result.stderr  # an assertion, not a crash
