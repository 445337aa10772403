"""Recovery suite: what a store IUT keeps and gives back.

Stability ACKs, low sequence numbers for new and returning receivers, retransmission
requests and their pacing, a store restart on a disk repository, activity timeouts and state
lifetimes.  Version-dependent defaults (``receiver-new-registration-rollback``) are set
explicitly in the case's store options, so the verdict does not depend on the IUT's version.
"""

from __future__ import annotations

import time

from conformance.context import CaseContext
from conformance.model import Role, case
from conformance.peers import HarnessSource
from wire.lbmc import AckType, MessageType, UmeAck

SUITE = "recovery"


def _register_with_messages(h: CaseContext, count: int) -> HarnessSource:
    src = h.source()
    resp = src.register(reg_id=0)
    h.check(not resp.e_flag, "the store refused the source", observed=repr(resp))
    if count:
        src.send(*range(count))
        src.expect_stable(count - 1)
    return src


@case("REC-STORE-001", suite=SUITE, role=Role.STORE,
      title="Every message the source sends on its transport is acknowledged as stable",
      section="Persistent Store",
      requirement="The store persists the source's messages and acknowledges each to the "
                  "source once it is stable (stability ACK).")
def messages_become_stable(h: CaseContext) -> None:
    src = h.source()
    h.check(not src.register(reg_id=0).e_flag, "the store refused the source")
    src.send(*range(20))
    src.expect_stable(19)
    assert src.link is not None
    acked = {hd.seqnum for m in src.link.received for hd in m.headers
             if isinstance(hd, UmeAck) and hd.type == AckType.STABLE}
    h.check(max(acked, default=-1) >= 19, "no stability ACK reached sequence number 19",
            expected="stability ACKs up to 19", observed=sorted(acked))


@case("REC-STORE-002", suite=SUITE, role=Role.STORE,
      title="A retransmission request gets the stored message back, marked as retransmission",
      section="Receiver Recovery",
      requirement="Receivers request missed messages from the store, which retransmits them.",
      store_options={}, topic_options={"receiver-new-registration-rollback": 2147483647})
def retransmission_returns_the_payload(h: CaseContext) -> None:
    src = _register_with_messages(h, 10)
    rcv = h.receiver(src)
    h.check(not rcv.register(reg_id=0).e_flag, "the store refused the receiver")
    for sqn in (0, 5, 9):
        rcv.rxreq(sqn)
        got = rcv.expect_data(sqn)
        want = bytes(src.data(sqn).payload)
        h.check_equal(got.payload, want, f"the payload retransmitted for sqn {sqn}")
        h.check(got.type == MessageType.RETRANS,
                f"sqn {sqn} came back as {got.label()}, not as a retransmission",
                expected="LBMC type RETRANS", observed=got.label())


@case("REC-STORE-003", suite=SUITE, role=Role.STORE,
      title="A new receiver starts at the oldest message held when rollback is unlimited",
      section="Late Registering Receiver",
      requirement="receiver-new-registration-rollback 2147483647: a new receiver recovers "
                  "everything the store still holds.",
      topic_options={"receiver-new-registration-rollback": 2147483647})
def new_receiver_low_sqn_unlimited(h: CaseContext) -> None:
    src = _register_with_messages(h, 10)
    resp = h.receiver(src).register(reg_id=0)
    h.check(not resp.e_flag, "the store refused the receiver")
    h.check_equal(resp.low_seqnum, 0, "low_seqnum for a new receiver")


@case("REC-STORE-004", suite=SUITE, role=Role.STORE,
      title="A new receiver starts N messages back with rollback N",
      section="Late Registering Receiver",
      requirement="Setting receiver-new-registration-rollback to N rolls a new receiver back N "
                  "stabilised messages.",
      topic_options={"receiver-new-registration-rollback": 3})
def new_receiver_low_sqn_rollback(h: CaseContext) -> None:
    src = _register_with_messages(h, 10)
    resp = h.receiver(src).register(reg_id=0)
    h.check(not resp.e_flag, "the store refused the receiver")
    h.check_equal(resp.low_seqnum, 7, "low_seqnum with rollback 3 after messages 0..9")


RATE = 40


@case("REC-STORE-005", suite=SUITE, role=Role.STORE,
      title="Retransmissions are paced at retransmission-request-processing-rate",
      section="Options for a Store's ume-attributes Element",
      requirement="retransmission-request-processing-rate is the maximum number of "
                  "retransmission requests the store processes per second.",
      store_options={"retransmission-request-processing-rate": RATE},
      topic_options={"receiver-new-registration-rollback": 2147483647}, timeout=15.0)
def retransmission_rate_limit(h: CaseContext) -> None:
    """Ask for 100 messages at once with the rate at 40/s: within the first second no more
    than the rate (plus one burst interval of slack) may come back, and some must."""
    src = _register_with_messages(h, 100)
    rcv = h.receiver(src)
    h.check(not rcv.register(reg_id=0).e_flag, "the store refused the receiver")
    start = time.monotonic()
    for sqn in range(100):
        rcv.rxreq(sqn)
    link = rcv.connect()
    h.wait_until(lambda: False, 1.0, "one second of retransmissions")
    served = [m for m in link.received if m.is_data_type]
    elapsed = time.monotonic() - start
    h.note(f"{len(served)} retransmissions in {elapsed:.2f} s at a configured rate of {RATE}/s")
    h.check(len(served) <= RATE * elapsed * 1.25 + 5,
            f"{len(served)} retransmissions in {elapsed:.2f} s exceed the configured rate",
            expected=f"at most about {RATE * elapsed:.0f}", observed=len(served))
    h.check(len(served) > 0, "no retransmission at all within a second",
            expected="some retransmissions", observed=0)


@case("REC-STORE-006", suite=SUITE, role=Role.STORE, needs_restart=True, timeout=30.0,
      title="A store restarted on its disk repository still knows the source and its messages",
      section="Persistent Store Fault Tolerance",
      requirement="A disk store keeps its repositories and registrations across a restart: a "
                  "re-registering source is an old client with its highest sequence number, "
                  "and receivers can recover the messages.",
      topic_options={"repository-type": "disk",
                     "receiver-new-registration-rollback": 2147483647})
def restart_keeps_state(h: CaseContext) -> None:
    src = _register_with_messages(h, 10)
    reg_id = src.reg_id
    h.restart_iut()
    resp = src.register(reg_id=reg_id)
    h.check(not resp.e_flag, "the restarted store refused the source", observed=repr(resp))
    h.check(bool(resp.o_flag), "the restarted store forgot the source",
            expected="O flag set", observed=repr(resp))
    h.check_equal(resp.high_seqnum, 9, "high_seqnum after the restart")
    rcv = h.receiver(src)
    h.check(not rcv.register(reg_id=0).e_flag, "the restarted store refused a receiver")
    rcv.rxreq(3)
    got = rcv.expect_data(3, timeout=5.0)
    h.check_equal(got.payload, bytes(src.data(3).payload), "the payload of sqn 3 after restart")


@case("REC-STORE-007", suite=SUITE, role=Role.STORE, timeout=15.0,
      title="A source silent past its activity timeout loses its state when no lifetime is set",
      section="Activity Timeout and State Lifetime Options",
      requirement="When a source is inactive for longer than source-activity-timeout, the "
                  "store considers it gone; without a state lifetime its state is deleted.",
      topic_options={"source-activity-timeout": 1000, "source-check-interval": 100})
def activity_timeout_deletes_state(h: CaseContext) -> None:
    src = _register_with_messages(h, 3)
    reg_id = src.reg_id
    assert src.link is not None
    src.link.close()
    h.wait_until(lambda: False, 2.0, "two activity timeouts")
    resp = src.register(reg_id=reg_id)
    h.check(not resp.e_flag, "the RegID of a timed-out source cannot be used again",
            observed=repr(resp))
    h.check(not resp.o_flag, "the state of a timed-out source was kept without a lifetime",
            expected="O flag clear (a new registration)", observed=repr(resp))


@case("REC-STORE-008", suite=SUITE, role=Role.STORE, timeout=15.0,
      title="A source's state outlives its activity timeout until its state lifetime",
      section="Activity Timeout and State Lifetime Options",
      requirement="source-state-lifetime keeps an inactive source's state (its RegID and "
                  "messages) until the lifetime runs out.",
      topic_options={"source-activity-timeout": 500, "source-state-lifetime": 30000,
                     "source-check-interval": 100})
def state_lifetime_keeps_state(h: CaseContext) -> None:
    src = _register_with_messages(h, 3)
    reg_id = src.reg_id
    assert src.link is not None
    src.link.close()
    h.wait_until(lambda: False, 1.2, "past the activity timeout")
    resp = src.register(reg_id=reg_id)
    h.check(not resp.e_flag, "the store refused the returning source", observed=repr(resp))
    h.check(bool(resp.o_flag), "the state was deleted before its lifetime ran out",
            expected="O flag set", observed=repr(resp))
    h.check_equal(resp.high_seqnum, 2, "high_seqnum after the activity timeout")
