"""The reference store's receiver activity timeout and state lifetime, and retransmission
requests naming an unknown RegID (guide "Activity Timeout and State Lifetime Options",
"Registration Identifier"; docs/semantics.md §1.11), driven with real registration bytes.

A receiver's activity timeout is the client's ``ume_activity_timeout`` when it sends one, else
the topic's ``receiver-activity-timeout``; its state lifetime is the shorter of the client's
``ume_state_lifetime`` and the topic's ``receiver-state-lifetime`` (0 on either side: the
other).  After the activity timeout it is inactive (its RegID free for another receiver), its
state is deleted once the lifetime ran out (at the activity timeout without one), and it is a
new receiver when it comes back after that.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from reference_impl.context import control
from reference_impl.events import Level
from reference_impl.sim import ConnKey
from reference_impl.store import StoreCore, TopicPolicy
from tests.reference_impl.test_store_rpp import RECEIVER_IP, Bench
from wire.lbmc import (
    Header,
    PregError,
    Topicname,
    UmeClientLifetime,
    UmePreg,
    UmeRxreq,
)

POLICY = TopicPolicy(receiver_activity_timeout=1000, source_check_interval=100,
                     repository_size_threshold=1 << 20)
"""Receivers time out after 1 s; the store looks every 100 ms; every message is kept."""
RECEIVER_PORT = 14500


def spp_bench(policy: TopicPolicy = POLICY) -> Bench:
    """A store with one SPP source (``hot``) holding messages 0..4."""
    bench = Bench(policy)
    resp = bench.source(w=0)
    assert resp.e_flag == 0, bench.warnings()
    bench.data(0, 1, 2, 3, 4)
    return bench


def register(bench: Bench, *, reg_id: int = 0, activity: int = 0, lifetime: int = 0,
             key: ConnKey | None = None, port: int = RECEIVER_PORT) -> tuple[ConnKey, Header]:
    """A receiver's PREG (with a client-lifetime header when ``activity`` or ``lifetime`` is
    set) on a connection of its own, and the store's answer."""
    key = key or bench.connect(RECEIVER_IP)
    headers: list[object] = [
        UmePreg(s_flag=0, reg_id=reg_id, src_reg_id=bench.src_id, transport_idx=1,
                topic_idx=1, resp_port=port, resp_ip=RECEIVER_IP), Topicname(topic="hot")]
    if activity or lifetime:
        headers.append(UmeClientLifetime(activity_tmo=activity, lifetime=lifetime))
    bench.send(key, control(*headers))
    return key, bench.answer(key)


def rxreq(bench: Bench, key: ConnKey, reg_id: int, sqn: int) -> None:
    bench.send(key, control(UmeRxreq(request_idx=1, transport_idx=1, id_2=reg_id, seqnum=sqn,
                                     rx_port=RECEIVER_PORT, rx_ip=RECEIVER_IP)))


def deleted_at(bench: Bench, reg_id: int, until: float, step: float = 0.05) -> float:
    """When (seconds after now) the store deleted the receiver's state, ``until`` at most."""
    start = bench.now
    while reg_id in bench.store.receivers:
        assert bench.now - start < until, f"receiver {reg_id} still held after {until} s"
        bench.tick(bench.now + step)
    return bench.now - start


@pytest.mark.parametrize(("client", "store", "effective"), [
    (2000, 6000, 2.0),  # the client's is shorter
    (6000, 2000, 2.0),  # the store's is shorter
    (0, 3000, 3.0),  # no client value: the store's
    (3000, 0, 3.0),  # no store value: the client's
    (0, 0, 1.0),  # neither: the state goes at the activity timeout
], ids=["client-shorter", "store-shorter", "store-only", "client-only", "none"])
def test_the_shorter_state_lifetime_ends_the_receivers_state(client: int, store: int,
                                                             effective: float) -> None:
    bench = spp_bench(dataclasses.replace(POLICY, receiver_state_lifetime=store))
    _, resp = register(bench, lifetime=client)
    assert resp.e_flag == 0
    rcv = bench.store.receivers[resp.reg_id]
    assert (rcv.activity_timeout, rcv.state_lifetime) == (1.0, effective if store or client
                                                          else 0.0)
    gone = deleted_at(bench, resp.reg_id, until=10.0)
    # the check runs every 100 ms: deleted within one check of the lifetime's end
    assert effective < gone <= effective + 0.2, gone
    reason = "state lifetime expired" if store or client else "activity timeout"
    assert any(r.level == Level.NOTICE and f"receiver RegID {resp.reg_id} state deleted "
               f"({reason})" in r.text for r in bench.logs)


def test_an_inactive_receiver_keeps_its_state_and_acknowledgement_until_its_lifetime() -> None:
    bench = spp_bench(dataclasses.replace(POLICY, receiver_state_lifetime=5000))
    key, resp = register(bench)
    bench.consume(key, resp.reg_id, 2)
    bench.tick(bench.now + 2.0)  # past the activity timeout, within the lifetime
    rcv = bench.store.receivers[resp.reg_id]
    assert not rcv.active
    assert any(f"receiver RegID {resp.reg_id} inactive (activity timeout)" in r.text
               for r in bench.logs)
    _, again = register(bench, reg_id=resp.reg_id)
    assert (again.e_flag, again.o_flag, again.low_seqnum) == (0, 1, 3)
    assert bench.store.receivers[resp.reg_id].active


def test_a_receiver_back_after_its_state_was_deleted_is_new() -> None:
    bench = spp_bench(dataclasses.replace(POLICY, receiver_new_registration_rollback=2))
    key, resp = register(bench)
    bench.consume(key, resp.reg_id, 1)
    deleted_at(bench, resp.reg_id, until=2.0)
    _, again = register(bench, reg_id=resp.reg_id)
    assert (again.e_flag, again.o_flag, again.reg_id) == (0, 0, resp.reg_id)
    assert again.low_seqnum == 3  # a new receiver's: rollback 2 from 4, not its ACK + 1


@pytest.mark.parametrize(("client", "effective"), [(400, 0.4), (3000, 3.0)],
                         ids=["client-shorter", "client-longer"])
def test_the_clients_activity_timeout_replaces_the_stores(client: int,
                                                          effective: float) -> None:
    bench = spp_bench()
    _, resp = register(bench, activity=client)
    assert bench.store.receivers[resp.reg_id].activity_timeout == effective
    gone = deleted_at(bench, resp.reg_id, until=5.0)
    assert effective < gone <= effective + 0.2, gone


def test_a_lifetime_shorter_than_the_activity_timeout_ends_with_the_timeout() -> None:
    bench = spp_bench()
    _, resp = register(bench, lifetime=300)
    gone = deleted_at(bench, resp.reg_id, until=3.0)
    assert 1.0 < gone <= 1.2, gone


def test_re_registering_keeps_the_first_registrations_values() -> None:
    bench = spp_bench()
    key, resp = register(bench, activity=2000, lifetime=4000)
    _, again = register(bench, reg_id=resp.reg_id, activity=500, lifetime=600, key=key)
    assert again.o_flag == 1
    rcv = bench.store.receivers[resp.reg_id]
    assert (rcv.activity_timeout, rcv.state_lifetime) == (2.0, 4.0)


def test_an_active_receivers_regid_is_refused_to_another_until_its_activity_timeout() -> None:
    bench = spp_bench()
    _, resp = register(bench)
    _, thief = register(bench, reg_id=resp.reg_id, port=RECEIVER_PORT + 1)
    assert (thief.e_flag, thief.error_code) == (1, PregError.EREGID)
    deleted_at(bench, resp.reg_id, until=2.0)
    _, later = register(bench, reg_id=resp.reg_id, port=RECEIVER_PORT + 1)
    assert (later.e_flag, later.o_flag, later.reg_id) == (0, 0, resp.reg_id)


def test_a_receiver_that_keeps_acknowledging_never_times_out() -> None:
    bench = spp_bench()
    key, resp = register(bench)
    for step in range(1, 31):  # 3 s, three activity timeouts
        bench.tick(bench.now + 0.1)
        bench.consume(key, resp.reg_id, step % 5)
    assert bench.store.receivers[resp.reg_id].active


# --- retransmission requests naming an unknown RegID ---------------------------------------------


def test_a_retransmission_request_naming_an_unknown_regid_gets_nothing_and_is_logged() -> None:
    bench = spp_bench()
    key, resp = register(bench)
    unknown = next(r for r in range(1, 1 << 16)
                   if r not in bench.store.receivers and r not in bench.store.sources)
    bench.logs.clear()
    rxreq(bench, key, unknown, 3)
    bench.tick(bench.now + 0.5)
    assert bench.retransmitted.get(key) is None
    warnings = bench.warnings()
    (line,) = [w for w in warnings if "RXREQ" in w]
    assert f"RegID {unknown}" in line and f"{key[1][0]}:{key[1][1]}" in line and "sqn 3" in line
    assert warnings == [line]
    rxreq(bench, key, resp.reg_id, 3)  # the same connection, the receiver's own RegID
    assert bench.retransmitted[key] == [3]


def test_the_source_regid_in_a_retransmission_request_gets_nothing() -> None:
    bench = spp_bench()
    key, _resp = register(bench)
    rxreq(bench, key, bench.src_id, 1)
    assert bench.retransmitted.get(key) is None
    assert [w for w in bench.warnings() if f"unknown receiver RegID {bench.src_id}" in w]


def test_a_deleted_receivers_retransmission_request_gets_nothing() -> None:
    bench = spp_bench()
    key, resp = register(bench)
    rxreq(bench, key, resp.reg_id, 0)
    assert bench.retransmitted[key] == [0]
    deleted_at(bench, resp.reg_id, until=2.0)
    rxreq(bench, key, resp.reg_id, 1)
    bench.tick(bench.now + 0.5)
    assert bench.retransmitted[key] == [0]
    assert [w for w in bench.warnings() if f"unknown receiver RegID {resp.reg_id}" in w]


def test_a_restored_receiver_keeps_its_values_and_its_lifetime_runs_from_the_restart(
        tmp_path: Path) -> None:
    """Disk state: the journal keeps the first registration's values, and restored state
    counts as heard at the restart (the module docstring of reference_impl.store)."""
    policy = dataclasses.replace(POLICY, repository_type="disk", receiver_state_lifetime=6000)
    bench = Bench(policy, tmp_path)
    assert bench.source(w=0).e_flag == 0
    bench.data(0, 1, 2)
    key, resp = register(bench, lifetime=3000)
    bench.consume(key, resp.reg_id, 1)
    bench.tick(bench.now + 0.5)
    bench.store.close()

    again = StoreCore(bench.settings, now=100.0)
    rcv = again.receivers[resp.reg_id]
    assert (rcv.activity_timeout, rcv.state_lifetime, rcv.last_ack) == (1.0, 3.0, 1)
    for t in range(1, 31):  # 100.1 .. 103.0
        now = 100.0 + t / 10
        while (due := again.get_timer()) is not None and due <= now:
            again.handle_timer(due)
        assert (resp.reg_id in again.receivers) == (now <= 103.0), now
    for _ in range(3):
        due = again.get_timer()
        assert due is not None
        again.handle_timer(due)
    assert resp.reg_id not in again.receivers
    again.close()
