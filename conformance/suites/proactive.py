"""Proactive-retransmit suite (``--suite proactive-retransmit``): source and store IUTs.

The guide's "Proactive Retransmissions" covers two losses: message data lost between the
source and a store, and a stability ACK lost between the store and the source.  Either way the
source has no stability ACK for the message after ``ume_message_stability_timeout`` and sends
it again to the stores that have not acknowledged it (0 turns this off); after
``ume_message_stability_lifetime`` it gives up on the message (the application gets a Message
Not Stable event and the message is reclaimed), so retransmissions stop.  A store answers every
copy it receives with a stability ACK, a duplicate of a message it already holds too: the
source resends precisely because it never saw the first ACK.

Source IUT (SRC-PRX-*): the harness store withholds ACKs and watches the proactive
retransmissions (data with the PRORX type on the registration connection).  The Message Not
Stable event reaches the application only, so it is not judged; what is judged is that the
retransmissions stop.  SRC-PRX-004: the harness store answers a proactive retransmission with
a stability NACK (the ACK with the NAK bit, docs/wire-lbmc.md §2.1), as a store that declared
the message unrecoverably lost does (docs/semantics.md §1.8); the source must stop resending it.

Store IUT (PRX-STORE-*): the harness source loses a message on the transport, or sends again a
message already acknowledged, as a retransmission on its registration connection, and waits for
the store's ACK.  There is no store case for the NACK: a store declares a message lost only
when its own transport gave up on it (the reference store: its LBT-RU session's unrecoverable
loss), which a black-box harness cannot bring about in an arbitrary store over LBT-TCP; the
reference store's NACK is tested on its core (tests/reference_impl/test_stability_nack.py).
"""

from __future__ import annotations

from conformance.context import CaseContext
from conformance.model import Role, case
from conformance.peers import HarnessSource
from conformance.store_peer import HarnessStore, Seen
from conformance.suites.source import FAST_REGISTRATION
from wire.lbmc import AckType, LbmcMessage, MessageType, UmeAck

SUITE = "proactive-retransmit"
SECTION = "Proactive Retransmissions"


def _first_seen(store: HarnessStore) -> dict[int, float]:
    """When each sequence number first arrived on the source's transport."""
    first: dict[int, float] = {}
    for seen in store.snapshot(store.data):
        first.setdefault(seen.message.sqn, seen.at)
    return first


def _prorx_by_sqn(store: HarnessStore) -> dict[int, list[Seen]]:
    out: dict[int, list[Seen]] = {}
    for seen in store.snapshot(store.prorx):
        out.setdefault(seen.message.sqn, []).append(seen)
    return out


def _wait_first(h: CaseContext, store: HarnessStore) -> None:
    if not h.wait_until(lambda: bool(store.data_sqns()), 4.0, "the first data message"):
        h.check(False, "the source sent no data message",
                expected="data on the transport after Registration Complete",
                observed=f"{len(store.source_pregs())} PREG(s), no data")


@case("SRC-PRX-001", suite=SUITE, role=Role.SOURCE,
      title="A message without stability ACK is resent after the stability timeout, once it is "
            "acknowledged no more",
      section=SECTION,
      requirement="Proactive Retransmissions address loss of message data between the source "
                  "and a store and loss of stability acknowledgments between the store and the "
                  "source: a message not stable within ume_message_stability_timeout is sent "
                  "again.",
      timeout=12.0)
def resends_after_timeout(h: CaseContext) -> None:
    """Stability timeout 500 ms, checked every 100 ms.  The store does not acknowledge every
    third message (sqn % 3 == 1) as it arrives on the transport - its data or its ACK was lost,
    the source cannot tell - and acknowledges its proactive retransmission.  Each such
    message older than 1.3 s must have come back, not before 0.4 s (the timeout, less a
    margin for timer granularity), with its original payload, and exactly once."""
    store = h.store()
    lost = {sqn for sqn in range(10_000) if sqn % 3 == 1}

    def ack(sqn: int) -> bool:
        return sqn not in lost or sqn in _prorx_by_sqn(store)

    store.ack = ack
    h.start_iut(store, options={**FAST_REGISTRATION,
                                "source ume_message_stability_timeout": 500,
                                "source ume_message_stability_lifetime": 0,
                                "source ume_store_check_interval": 100})
    _wait_first(h, store)
    h.wait_until(lambda: False, 2.2, "proactive retransmissions")
    first = _first_seen(store)
    resent = _prorx_by_sqn(store)
    newest = max(first.values(), default=0.0)
    old = sorted(sqn for sqn, at in first.items()
                 if sqn in lost and newest - at >= h.scaled(1.3))
    h.check(bool(old), "too few messages to judge", expected="lost messages older than 1.3 s",
            observed=sorted(first)[:20])
    missing = [sqn for sqn in old if sqn not in resent]
    h.check(not missing, "messages without a stability ACK were not resent after the timeout",
            expected="every unacknowledged message resent", observed=f"not resent: {missing[:10]}")
    acked = sorted(sqn for sqn in resent if sqn not in lost)
    h.check(not acked, "the source resent messages the store acknowledged",
            expected="no retransmission of a stable message", observed=acked[:10])
    # the IUT's timeout is 500 ms whatever --time-scale says: this bound is not scaled
    early = [sqn for sqn in old if resent[sqn][0].at - first[sqn] < 0.4]
    h.check(not early, "messages were resent before the stability timeout (500 ms)",
            expected="the first retransmission >= 0.4 s after the message",
            observed={sqn: round(resent[sqn][0].at - first[sqn], 3) for sqn in early[:5]})
    twice = [sqn for sqn in old if len(resent[sqn]) > 1]
    h.check(not twice, "the source kept resending messages whose retransmission was "
            "acknowledged", expected="one retransmission each",
            observed={sqn: len(resent[sqn]) for sqn in twice[:5]})
    payloads = {s.message.sqn: bytes(s.message.payload or b"") for s in store.snapshot(store.data)}
    wrong = [sqn for sqn, seen in resent.items()
             if any(bytes(s.message.payload or b"") != payloads.get(sqn) for s in seen)]
    h.check(not wrong, "a retransmission carries another payload than the original",
            expected="the original payloads", observed=wrong[:10])


@case("SRC-PRX-002", suite=SUITE, role=Role.SOURCE,
      title="ume_message_stability_timeout 0 turns proactive retransmission off",
      section=SECTION,
      requirement="ume_message_stability_timeout: the interval after which a message that is "
                  "not yet stable is retransmitted; a value of 0 disables proactive "
                  "retransmission.",
      timeout=12.0)
def timeout_zero_never_resends(h: CaseContext) -> None:
    """No stability ACK at all, stability timeout 0, checked every 100 ms: nothing may come
    back as a proactive retransmission within 1.5 s."""
    store = h.store()
    store.ack = False
    h.start_iut(store, options={**FAST_REGISTRATION,
                                "source ume_message_stability_timeout": 0,
                                "source ume_store_check_interval": 100})
    _wait_first(h, store)
    h.wait_until(lambda: bool(store.snapshot(store.prorx)), 1.5,
                 "a proactive retransmission (must not come)")
    resent = sorted(_prorx_by_sqn(store))
    h.check(not resent, "the source retransmitted with ume_message_stability_timeout 0",
            expected="no proactive retransmission", observed=f"resent {resent[:10]}")


@case("SRC-PRX-003", suite=SUITE, role=Role.SOURCE,
      title="After ume_message_stability_lifetime a message is no longer retransmitted",
      section=SECTION,
      requirement="ume_message_stability_lifetime: once a message has not become stable within "
                  "this time, the source stops retransmitting it, reclaims it and delivers a "
                  "Message Not Stable event to the application.",
      timeout=12.0)
def lifetime_stops_resending(h: CaseContext) -> None:
    """No stability ACK, stability timeout 200 ms, lifetime 800 ms, checked every 100 ms.
    Messages must be resent (the timeout works) but none later than 1.2 s after it was first
    sent (lifetime plus two timeouts of margin).  The Message Not Stable event is the
    application's and is not judged."""
    store = h.store()
    store.ack = False
    h.start_iut(store, options={**FAST_REGISTRATION,
                                "source ume_message_stability_timeout": 200,
                                "source ume_message_stability_lifetime": 800,
                                "source ume_store_check_interval": 100})
    _wait_first(h, store)
    h.wait_until(lambda: False, 2.5, "retransmissions up to and past the lifetime")
    first = _first_seen(store)
    resent = _prorx_by_sqn(store)
    h.check(bool(resent), "the source never retransmitted an unstable message",
            expected="proactive retransmissions every 200 ms until the lifetime",
            observed="none")
    late = {sqn: round(seen[-1].at - first[sqn], 3) for sqn, seen in resent.items()
            if sqn in first and seen[-1].at - first[sqn] > h.scaled(1.2)}
    h.check(not late, "the source retransmitted messages after their stability lifetime",
            expected="no retransmission later than 1.2 s after the first send (lifetime 0.8 s)",
            observed={k: late[k] for k in sorted(late)[:5]})
    # not judged: the event is the application's; the log shows it only if the IUT logs it
    logged = "not stable" in h.client_iut.log_since(0).lower().replace("notstable", "not stable")
    h.note("the IUT log " + ("mentions" if logged else "does not mention")
           + " a Message Not Stable event (informational)")


@case("SRC-PRX-004", suite=SUITE, role=Role.SOURCE,
      title="A message the store NACKs is no longer retransmitted",
      section=SECTION,
      requirement="A store answers a copy of a message it holds as unrecoverably lost with a "
                  "stability ACK carrying the NAK flag, and the source stops re-sending it "
                  "(docs/semantics.md §1.8).",
      timeout=12.0)
def nack_stops_resending(h: CaseContext) -> None:
    """Stability timeout 300 ms, lifetime 0 (never), checked every 100 ms.  The store does not
    acknowledge every third message (sqn % 3 == 1) and answers its first proactive
    retransmission with a stability NACK.  No NACKed message may come back later than 0.15 s
    after its NACK (a retransmission already on its way when the NACK left), although the
    timeout would resend it every 300 ms; the other messages are acknowledged as usual."""
    store = h.store()
    lost = {sqn for sqn in range(10_000) if sqn % 3 == 1}
    store.ack = lambda sqn: sqn not in lost
    store.nack = lambda sqn: sqn in lost
    h.start_iut(store, options={**FAST_REGISTRATION,
                                "source ume_message_stability_timeout": 300,
                                "source ume_message_stability_lifetime": 0,
                                "source ume_store_check_interval": 100})
    _wait_first(h, store)
    h.wait_until(lambda: False, 2.5, "proactive retransmissions and their NACKs")
    nacked = dict((sqn, at) for at, sqn in reversed(list(store.nacked)))  # the first NACK
    h.check(bool(nacked), "the source never retransmitted an unacknowledged message, so "
            "nothing was NACKed", expected="proactive retransmissions after 300 ms",
            observed=f"{len(store.snapshot(store.prorx))} retransmission(s)")
    resent = _prorx_by_sqn(store)
    again = {sqn: [round(s.at - at, 3) for s in resent.get(sqn, [])
                   if s.at - at > h.scaled(0.15)]
             for sqn, at in nacked.items()}
    again = {sqn: times for sqn, times in again.items() if times}
    h.check(not again, "the source kept retransmitting messages the store NACKed",
            expected="no retransmission of a message after its stability NACK",
            observed={k: again[k][:3] for k in sorted(again)[:5]})
    h.note(f"{len(nacked)} message(s) NACKed, {len(store.nacked)} NACK(s) sent")


# --- store IUT ------------------------------------------------------------------------------------


def _stable_acks(src: HarnessSource, sqn: int) -> list[LbmcMessage]:
    assert src.link is not None
    return [m for m in list(src.link.received)
            if any(isinstance(hd, UmeAck) and hd.type == AckType.STABLE and hd.seqnum == sqn
                   for hd in m.headers)]


def _resend(h: CaseContext, src: HarnessSource, sqn: int) -> None:
    """Send ``sqn`` as a proactive retransmission on the registration connection."""
    h.note(f"{src.name}: proactive retransmission of {sqn} on the registration connection")
    src.connect().send(src.data(sqn, kind=MessageType.PRORX))


@case("PRX-STORE-001", suite=SUITE, role=Role.STORE,
      title="A message lost on the transport and proactively retransmitted is acknowledged",
      section=SECTION,
      requirement="Proactive Retransmissions address loss of message data between the source "
                  "and a store: the source sends the message again and the store persists and "
                  "acknowledges it.")
def lost_data_is_acknowledged(h: CaseContext) -> None:
    """The source sends 0..4 on its transport except 2 (lost); 4 is acknowledged, 2 not.
    Then 2 comes as a proactive retransmission on the registration connection: the store
    must acknowledge 2 as stable."""
    src = h.source()
    h.check(not src.register(reg_id=0).e_flag, "the store refused the source")
    src.send(0, 1, 3, 4)
    src.expect_stable(4)
    h.check(not _stable_acks(src, 2), "the store acknowledged a message it never received",
            expected="no stability ACK for 2", observed="an ACK for 2")
    _resend(h, src, 2)
    h.wait_until(lambda: bool(_stable_acks(src, 2)), 3.0, "a stability ACK for 2")
    h.check(bool(_stable_acks(src, 2)), "the store did not acknowledge the retransmitted message",
            expected="a stability ACK for 2", observed="none")


@case("PRX-STORE-002", suite=SUITE, role=Role.STORE,
      title="A store acknowledges again a message it already acknowledged as stable",
      section=SECTION,
      requirement="Proactive Retransmissions address loss of stability acknowledgments between "
                  "the store and the source: the source sends the message again, and only a "
                  "new stability ACK from the store makes it stable - so the store must "
                  "acknowledge the duplicate, even though it already holds it.")
def duplicate_is_acknowledged_again(h: CaseContext) -> None:
    """The source sends 0..2 and gets their ACKs; then it resends 1 (its ACK was "lost") as a
    proactive retransmission: a second stability ACK for 1 must come."""
    src = h.source()
    h.check(not src.register(reg_id=0).e_flag, "the store refused the source")
    src.send(0, 1, 2)
    src.expect_stable(2)
    h.wait_until(lambda: bool(_stable_acks(src, 1)), 1.0, "the stability ACK for 1")
    before = len(_stable_acks(src, 1))
    h.check(before >= 1, "the store never acknowledged message 1",
            expected="a stability ACK for 1", observed="none")
    _resend(h, src, 1)
    h.wait_until(lambda: len(_stable_acks(src, 1)) > before, 3.0, "a second ACK for 1")
    h.check(len(_stable_acks(src, 1)) > before,
            "the store did not acknowledge a duplicate of a stable message",
            expected="another stability ACK for 1", observed=f"{before} ACK(s) for 1")
