"""The quorum suite, receiver IUT (RCV-QRM-*): the receiver's consensus low sequence number and
registration completion with store groups, re-registration only with stores whose SRI version went
up, recovery that retries another store when a request goes unanswered for
``retransmit_request_interval`` and gives a message up after ``retransmit_request_message_timeout``,
``retransmit_request_maximum``, explicit-ACK-only mode, delivery confirmation and ACK batching
(guide "Sources Using Quorum/Consensus", "Receiver Recovery", "Acknowledgement Generation",
"Batching Acknowledgments"; docs/semantics.md §1.4, §1.5, §1.9).

The harness plays the source and two or three groups of stores as in :mod:`.receiver` (each
:class:`~conformance.store_peer.HarnessStore` has a group; the source's SRI names every store
with its group and each group's size).  What the application got is read from the
``{deliveries}`` file; the explicit-ACK cases start the IUT with the profile's
``explicit_ack_args`` and say what the application acknowledges through the ``{acks}`` file
(:meth:`~conformance.context.CaseContext.ack_iut`), and are unsupported without them; the
out-of-order consumption case (RCV-QRM-016) likewise with ``consume_args``.

*Choice* (the product documents the intragroup and intergroup behaviours for sources only; the
SRI does not carry them): the reference receiver reads the same two options in its own scope
for its registration completion, and the cases that need a receiver to wait for more than the
first group's quorum set them (``receiver ume_retention_intergroup_stability_behavior``).
Those cases (RCV-QRM-004, RCV-QRM-005) are SHOULD: a product receiver that has no such
receiver-scoped option is not in breach of a sentence of the guide, and a SHOULD failure does
not fail the run.
"""

from __future__ import annotations

import itertools

from conformance.context import CaseContext
from conformance.model import Role, Strength, case
from conformance.peers import HarnessSource
from conformance.store_peer import HarnessStore
from wire.lbmc import UmeAck, UmeRxreq

SUITE = "quorum"

WAIT_FOR_EVERY_STORE: dict[str, str | int] = {
    "receiver ume_retention_intragroup_stability_behavior": "all",
    "receiver ume_retention_intergroup_stability_behavior": "all"}
"""Registration completes only once every store answered (so that a consensus is formed from
every store's answer, whatever order they come in)."""


def _groups(h: CaseContext, *sizes: int) -> tuple[HarnessSource, list[HarnessStore]]:
    """Stores in groups of ``sizes`` (group 0, 1, ...), and a source registered with them."""
    stores = [h.store(f"store {g}.{i}", group=g) for g, size in enumerate(sizes)
              for i in range(size)]
    return h.source(topic=h.iut_topic, stores=tuple(stores)), stores


def _start(h: CaseContext, src: HarnessSource, options: dict[str, str | int] | None = None,
           *, explicit_ack: bool = False, consume: bool = False) -> None:
    """Start the receiver; the source answers SRI requests and sends its SRI once joined."""
    src.answer_sri_requests = True
    h.start_iut(options=options, explicit_ack=explicit_ack, consume=consume)
    src.transport.expect_link(h.scaled(4.0), "the receiver joining the source's transport")
    src.send_sri(src.sri(high=src.high_sent()))


def _registered(h: CaseContext, *stores: HarnessStore, timeout: float = 3.0) -> None:
    h.wait_until(lambda: all(s.granted for s in stores), timeout, "the receiver's registrations")
    h.check(all(s.granted for s in stores), "the receiver did not register with every store",
            expected=f"a receiver PREG granted at {', '.join(s.name for s in stores)}",
            observed={s.name: len(s.receiver_pregs()) for s in stores})


def _rxreqs(stores: list[HarnessStore]) -> list[int]:
    return sorted({sqn for s in stores for sqn in s.rxreq_sqns()})


def _consensus_case(h: CaseContext, lows: list[list[int]], expected: int,
                    options: dict[str, str | int]) -> None:
    """Groups whose stores answer the low sequence numbers ``lows`` (per group), holding
    0..11: the receiver must ask for nothing below ``expected`` and deliver ``expected``..11
    (retransmitted), then the live 12 and 13."""
    src, stores = _groups(h, *(len(g) for g in lows))
    src.publish(*range(12), live=False)
    for store, low in zip(stores, [low for group in lows for low in group], strict=True):
        store.receiver_low = low
    h.note(f"the stores answer low sequence numbers {lows} (per group)")
    _start(h, src, WAIT_FOR_EVERY_STORE | options)
    _registered(h, *stores)
    h.wait_until(lambda: set(range(expected, 12)) <= set(_rxreqs(stores)), 3.0,
                 f"RXREQs for {expected}..11")
    src.publish(12, 13)
    h.check_delivered(list(range(expected, 14)), retransmitted=set(range(expected, 12)))
    below = [sqn for sqn in _rxreqs(stores) if sqn < expected]
    h.check(not below, "the receiver asked for messages below the consensus low sequence "
            "number", expected=f"no RXREQ below {expected}", observed=below)


@case("RCV-QRM-001", suite=SUITE, role=Role.RECEIVER,
      title="Consensus low sequence number 'majority': per group, then the latest of the groups",
      section="Receiver Recovery",
      requirement="Like sources, when QC is in use, UMP uses the consensus of the group(s) to "
                  "determine the low sequence number ... ume_consensus_sequence_number_behavior "
                  "... the majority, which is the default",
      timeout=20.0)
def consensus_majority(h: CaseContext) -> None:
    """Two groups of three answer lows 4, 6, 9 and 2, 3, 7: the majority of group 0 is 6, of
    group 1 is 3, so delivery starts at 6 (the latest of the group majorities; a majority
    over all six stores would be 4)."""
    _consensus_case(h, [[4, 6, 9], [2, 3, 7]], 6, {})


@case("RCV-QRM-002", suite=SUITE, role=Role.RECEIVER,
      title="Consensus low sequence number 'lowest': the lowest answer of any store",
      section="Receiver Recovery",
      requirement="The application can configure the receiver with "
                  "ume_consensus_sequence_number_behavior to use the lowest sequence number of "
                  "the latest group of sequence numbers seen from any store, the highest, or "
                  "the majority.",
      timeout=20.0)
def consensus_lowest(h: CaseContext) -> None:
    """Two groups of three answer lows 4, 6, 9 and 2, 3, 7, the receiver configured for
    'lowest': delivery starts at 2."""
    _consensus_case(h, [[4, 6, 9], [2, 3, 7]], 2,
                    {"receiver ume_consensus_sequence_number_behavior": "lowest"})


@case("RCV-QRM-003", suite=SUITE, role=Role.RECEIVER,
      title="Consensus low sequence number 'highest' over three groups",
      section="Receiver Recovery",
      requirement="The application can configure the receiver with "
                  "ume_consensus_sequence_number_behavior to use the lowest sequence number of "
                  "the latest group of sequence numbers seen from any store, the highest, or "
                  "the majority.",
      timeout=20.0)
def consensus_highest(h: CaseContext) -> None:
    """Three groups (3, 1 and 1 stores) answer lows 2, 3, 4 / 8 / 5, the receiver configured
    for 'highest': delivery starts at 8."""
    _consensus_case(h, [[2, 3, 4], [8], [5]], 8,
                    {"receiver ume_consensus_sequence_number_behavior": "highest"})


def _held_back(h: CaseContext, src: HarnessSource, stores: list[HarnessStore],
               silent: list[HarnessStore], why: str) -> None:
    """Registration must not complete while ``silent`` stores say nothing: live 0..4 are not
    delivered and nothing is requested."""
    h.wait_until(lambda: all(s.granted for s in stores if s not in silent), 3.0,
                 "the answering stores' registrations")
    src.publish(*range(5))
    h.wait_until(lambda: bool(h.deliveries()), 1.0, "deliveries (must not come)")
    h.check(not h.deliveries(), f"the receiver completed registration although {why}",
            expected="no delivery before registration is complete",
            observed=[d["sqn"] for d in h.deliveries()])


@case("RCV-QRM-004", suite=SUITE, role=Role.RECEIVER,
      title="Intergroup 'all': registration completes only when every group has its quorum",
      section="Sources Using Quorum/Consensus Store Configuration",
      requirement="The intergroup behavior specifies the requirements needed to stabilize a "
                  "message among groups of stores ... successfully stored at any group, a "
                  "majority of groups, all groups, or all active groups (and registration is "
                  "complete when the intragroup/intergroup rule is met, docs/semantics.md "
                  "§1.2).",
      strength=Strength.SHOULD,  # the receiver-scoped options are the reference's reading
      timeout=20.0)
def intergroup_all(h: CaseContext) -> None:
    """Two groups of two, intergroup 'all': while group 1 does not answer, the receiver must
    not complete (live 0..4 not delivered); once group 1 answers a retried PREG, 0..4 must be
    delivered in order."""
    src, stores = _groups(h, 2, 2)
    late = [s for s in stores if s.group == 1]
    for store in late:
        store.answer = False
    _start(h, src, {"receiver ume_retention_intergroup_stability_behavior": "all",
                    "receiver ume_registration_interval": 500})
    _held_back(h, src, stores, late, "group 1 (of 2, intergroup 'all') never answered")
    for store in late:
        store.answer = True
    _registered(h, *stores)
    h.check_delivered(list(range(5)), timeout=4.0)


@case("RCV-QRM-005", suite=SUITE, role=Role.RECEIVER,
      title="Intergroup 'majority' over three groups: two complete groups, not one, not three",
      section="Sources Using Quorum/Consensus Store Configuration",
      requirement="A message is stable among the groups if it is successfully stored at any "
                  "group, a majority of groups, all groups, or all active groups (and "
                  "registration is complete when the intragroup/intergroup rule is met, "
                  "docs/semantics.md §1.2).",
      strength=Strength.SHOULD,  # the receiver-scoped options are the reference's reading
      timeout=20.0)
def intergroup_majority(h: CaseContext) -> None:
    """Three groups of one store, intergroup 'majority': with only group 0 answering the
    receiver must not complete; once group 1 answers too it must (group 2 stays silent) and
    deliver 0..4."""
    src, stores = _groups(h, 1, 1, 1)
    for store in stores[1:]:
        store.answer = False
    _start(h, src, {"receiver ume_retention_intergroup_stability_behavior": "majority",
                    "receiver ume_registration_interval": 500})
    _held_back(h, src, stores, stores[1:], "only one group of three answered")
    stores[1].answer = True
    _registered(h, stores[0], stores[1])
    h.check_delivered(list(range(5)), timeout=4.0)


@case("RCV-QRM-006", suite=SUITE, role=Role.RECEIVER,
      title="A new SRI version: the receiver re-registers only with the stores whose version "
            "went up",
      section="Source Registration Information (SRI)",
      requirement="If a receiver gets an SRI with a higher version number than the version "
                  "number it has, the receiver examines the individual store version numbers "
                  "and re-registers with the those stores that have higher individual version "
                  "numbers.",
      timeout=15.0)
def reregisters_changed_only(h: CaseContext) -> None:
    """Three stores (one group), all registered; then SRI version 2 with store 1's version
    2: exactly one new PREG must come, at store 1."""
    src, stores = _groups(h, 3)
    _start(h, src)
    _registered(h, *stores)
    h.wait_until(lambda: False, 0.3, "the registrations settling")
    before = {s.name: len(s.receiver_pregs()) for s in stores}
    changed = stores[1]
    src.send_sri(src.sri(high=src.high_sent(), store_versions={changed: 2}))
    h.wait_until(lambda: len(changed.receiver_pregs()) > before[changed.name], 2.0,
                 f"a new PREG at {changed.name}")
    h.wait_until(lambda: False, 1.0, "PREGs at the unchanged stores (must not come)")
    after = {s.name: len(s.receiver_pregs()) for s in stores}
    h.check(after[changed.name] > before[changed.name],
            f"the receiver did not re-register with {changed.name}, whose version went up",
            expected=f"a new PREG at {changed.name}", observed=after)
    extra = {s.name: after[s.name] - before[s.name] for s in stores
             if s is not changed and after[s.name] != before[s.name]}
    h.check(not extra, "the receiver re-registered with stores whose version did not change",
            expected=f"new PREGs at {changed.name} only", observed=extra)


@case("RCV-QRM-007", suite=SUITE, role=Role.RECEIVER,
      title="An unanswered retransmission request is retried at another store",
      section="Receiver Recovery",
      requirement="For QC, UMP load balances receiver retransmission requests among the "
                  "available stores. In addition, if requests are unanswered, retransmissions "
                  "of the actual requests will use different stores. This means that as long "
                  "as a single store has a message, then it is possible for that message to "
                  "be retransmitted to a requesting receiver.",
      timeout=20.0)
def retries_other_store(h: CaseContext) -> None:
    """Two stores hold 0..9; store 0 never answers RXREQs: whatever was asked of it must be
    asked again of store 1, and 0..9 delivered in order (the message timeout is long, so only
    another store can save them)."""
    src, stores = _groups(h, 2)
    mute, good = stores
    src.publish(*range(10), live=False)
    mute.serve_rxreq = False
    _start(h, src, {"receiver retransmit_request_interval": 300,
                    "receiver retransmit_request_message_timeout": 60000})
    _registered(h, *stores)
    h.check_delivered(list(range(10)), timeout=6.0, retransmitted=set(range(10)))
    asked_mute = set(mute.rxreq_sqns())
    missing = sorted(asked_mute - set(good.rxreq_sqns()))
    h.check(not missing, "requests the silent store left unanswered were not retried at the "
            "other store", expected="every sqn asked of store 0 asked of store 1 too",
            observed=missing)
    h.prefer(bool(asked_mute), "the receiver sent every request to one store",
             expected="requests balanced among the stores", observed={
                 s.name: len(s.rxreq_sqns()) for s in stores})


@case("RCV-QRM-008", suite=SUITE, role=Role.RECEIVER,
      title="A message no store retransmits is given up after "
            "retransmit_request_message_timeout; delivery goes on",
      section="Controlling Retransmission",
      requirement="The timeout used between requests, if the retransmission does not arrive, "
                  "is totally controllable with retransmit_request_interval. And the total "
                  "time given to recover all messages is also controllable "
                  "(retransmit_request_message_timeout, docs/semantics.md §1.9).",
      timeout=20.0)
def message_timeout(h: CaseContext) -> None:
    """Live 0..4 and 6..9, and 5 that no store will retransmit; message timeout 1500 ms,
    interval 300 ms: 5 must be asked for, given up within about 1.5 s (no request for it
    after that) and 6..9 delivered after it."""
    src, (store,) = _groups(h, 1)
    store.serve_rxreq = False
    _start(h, src, {"receiver retransmit_request_interval": 300,
                    "receiver retransmit_request_message_timeout": 1500})
    _registered(h, store)
    src.publish(*range(5))
    src.publish(5, live=False)
    src.publish(*range(6, 10))
    h.wait_until(lambda: 5 in store.rxreq_sqns(), 2.0, "an RXREQ for 5")
    h.check_delivered([0, 1, 2, 3, 4, 6, 7, 8, 9], timeout=5.0)
    times = [seen.at for seen in store.snapshot(store.rxreqs)
             if (x := seen.message.header(UmeRxreq)) is not None and x.seqnum == 5]
    h.check(bool(times), "the receiver never asked for the missing 5",
            expected="RXREQs for 5", observed=store.rxreq_sqns())
    h.wait_until(lambda: False, 0.6, "RXREQs for 5 after the timeout (must not come)")
    times = [seen.at for seen in store.snapshot(store.rxreqs)
             if (x := seen.message.header(UmeRxreq)) is not None and x.seqnum == 5]
    span = times[-1] - times[0]
    h.check(span <= h.scaled(1.5 + 0.5),
            f"5 was asked for over {span * 1000:.0f} ms, beyond the 1500 ms message timeout",
            expected="no RXREQ for 5 more than 1500 ms (plus one interval) after the first",
            observed=f"{len(times)} RXREQs over {span * 1000:.0f} ms")


@case("RCV-QRM-009", suite=SUITE, role=Role.RECEIVER,
      title="retransmit_request_maximum: recovery starts no earlier than high minus the maximum",
      section="Recovery Management",
      requirement="low rxreq max sequence number = high sequence number - retransmit request "
                  "maximum ... UMP obeys the retransmit_request_maximum configuration option "
                  "and restarts with message 4. This is the default.",
      timeout=15.0)
def rx_maximum(h: CaseContext) -> None:
    """The store holds 0..9 and answers low 1 (the receiver consumed 0), maximum 3: delivery
    starts at 9 - 3 = 6: 6..9 retransmitted, nothing below 6 asked for, then live 10, 11."""
    src, (store,) = _groups(h, 1)
    src.publish(*range(10), live=False)
    store.receiver_low = 1
    _start(h, src, {"receiver retransmit_request_maximum": 3})
    _registered(h, store)
    h.wait_until(lambda: {6, 7, 8, 9} <= set(store.rxreq_sqns()), 2.0, "RXREQs for 6..9")
    src.publish(10, 11)
    h.check_delivered(list(range(6, 12)), retransmitted={6, 7, 8, 9})
    below = sorted({sqn for sqn in store.rxreq_sqns() if sqn < 6})
    h.check(not below, "the receiver asked for messages below high - "
            "retransmit_request_maximum", expected="no RXREQ below 6", observed=below)


def _acks(store: HarnessStore) -> list[int]:
    """The consumption ACKs a store received, in order."""
    out = []
    for seen in store.snapshot(store.acks):
        ack = seen.message.header(UmeAck)
        if ack is not None:
            out.append(ack.seqnum)
    return out


@case("RCV-QRM-010", suite=SUITE, role=Role.RECEIVER,
      title="Explicit-ACK-only: nothing is acknowledged before the application acknowledges",
      section="Acknowledgement Generation",
      requirement="Some applications may want to control this acknowledgement explicitly "
                  "themselves. In this case, ume_explicit_ack_only can be used ... which "
                  "silences UMP's acknowledgement behavior, allowing your application control "
                  "of message consumption notification.",
      timeout=15.0)
def explicit_ack_waits_for_app(h: CaseContext) -> None:
    """Live 0..9 delivered, the application acknowledges nothing for a second: the stores
    must get no consumption ACK.  Then it acknowledges 4: ACKs up to 4, none above."""
    src, stores = _groups(h, 2)
    _start(h, src, explicit_ack=True)
    _registered(h, *stores)
    src.publish(*range(10))
    h.check_delivered(list(range(10)))
    h.wait_until(lambda: any(_acks(s) for s in stores), 1.0, "ACKs (must not come)")
    early = {s.name: _acks(s) for s in stores if _acks(s)}
    h.check(not early, "the receiver acknowledged consumption the application did not "
            "acknowledge", expected="no consumption ACK", observed=early)
    h.ack_iut(4)
    h.wait_until(lambda: all(s.acked_up_to() == 4 for s in stores), 2.0,
                 "consumption ACKs for 4 at both stores")
    h.wait_until(lambda: False, 0.3, "ACKs above 4 (must not come)")
    for store in stores:
        h.check_equal(store.acked_up_to(), 4, f"the consumption acknowledged to {store.name}")


@case("RCV-QRM-011", suite=SUITE, role=Role.RECEIVER,
      title="Explicit ACKs go out in ascending order: a lower one after a higher is not sent",
      section="Explicit Acknowledgments",
      requirement="The explicit ACK sending function/method automatically supplies "
                  "additional ACKs for missing messages in sequence number gaps ... to "
                  "acknowledge each message consumption individually, you must issue their "
                  "ACKs in ascending sequence-number order.",
      timeout=15.0)
def explicit_ack_ascending(h: CaseContext) -> None:
    """The application acknowledges 6, then 3 (already covered by 6), then 8: the store must
    see 6 and 8, never an ACK going back below an earlier one."""
    src, (store,) = _groups(h, 1)
    _start(h, src, explicit_ack=True)
    _registered(h, store)
    src.publish(*range(10))
    h.check_delivered(list(range(10)))
    h.ack_iut(6)
    h.wait_until(lambda: store.acked_up_to() == 6, 2.0, "the ACK for 6")
    h.ack_iut(3)
    h.ack_iut(8)
    h.wait_until(lambda: store.acked_up_to() == 8, 2.0, "the ACK for 8")
    h.wait_until(lambda: False, 0.3, "more ACKs")
    acks = _acks(store)
    backwards = [(a, b) for a, b in itertools.pairwise(acks) if b < a]
    h.check(bool(acks) and not backwards, "an ACK went back below an earlier one",
            expected="ascending consumption ACKs (6, 8)", observed=acks)
    h.check_equal(store.acked_up_to(), 8, "the consumption acknowledged")


def _confirmation_case(h: CaseContext, *, asked: bool,
                       options: dict[str, str | int] | None = None) -> list[int]:
    """A receiver of 0..4 from a source whose SRI does (``asked``) or does not ask for
    delivery confirmation; the confirmations the source got (sequence numbers)."""
    src, (store,) = _groups(h, 1)
    src.answer_sri_requests = True
    h.start_iut(options=options)
    src.transport.expect_link(h.scaled(4.0), "the receiver joining the source's transport")
    src.send_sri(src.sri(high=src.high_sent(), acktosrc=asked))
    _registered(h, store)
    src.publish(*range(5))
    h.check_delivered(list(range(5)))
    h.wait_until(lambda: store.acked_up_to() == 4, 2.0, "the consumption ACK for 4")
    if asked:
        h.wait_until(lambda: 4 in _confirmed(src), 1.0, "a delivery confirmation for 4")
    else:
        h.wait_until(lambda: bool(_confirmed(src)), 1.0, "delivery confirmations (must not "
                     "come)")
    return _confirmed(src)


def _confirmed(src: HarnessSource) -> list[int]:
    """The sequence numbers of the delivery confirmations the source got."""
    acks = [m.header(UmeAck) for _, m in src.confirmations()]
    return [int(a.seqnum) for a in acks if a is not None]


@case("RCV-QRM-012", suite=SUITE, role=Role.RECEIVER,
      title="Delivery confirmation goes to the source only when its SRI asks for it",
      section="Message Consumption",
      requirement="This notification takes the form of an acknowledgement, or ACK, to the "
                  "store(s) in use as well as to the source if you configured the source for "
                  "delivery confirmation.",
      timeout=20.0)
def confirms_only_when_asked(h: CaseContext) -> None:
    """The SRI's "ACK to source" flag clear: the source's request port must get no delivery
    confirmation while the store gets its consumption ACKs."""
    got = _confirmation_case(h, asked=False)
    h.check(not got, "the receiver sent delivery confirmations the source did not ask for",
            expected="none (the SRI's ACK-to-source flag is clear)", observed=got)


@case("RCV-QRM-013", suite=SUITE, role=Role.RECEIVER,
      title="ume_allow_confirmed_delivery 0: no delivery confirmation even when the source asks",
      section="Message Consumption",
      requirement="ume_allow_confirmed_delivery (receiver) 1; 0 = refuse to send delivery "
                  "confirmations to the source (docs/semantics.md §1.5).",
      timeout=20.0)
def confirmations_not_allowed(h: CaseContext) -> None:
    """The SRI asks for delivery confirmation, the receiver has ume_allow_confirmed_delivery
    0: the source must get none.  (RCV-QRM-014 checks the same receiver confirms by default.)"""
    got = _confirmation_case(h, asked=True,
                             options={"receiver ume_allow_confirmed_delivery": 0})
    h.check(not got, "the receiver confirmed delivery with ume_allow_confirmed_delivery 0",
            expected="no delivery confirmation", observed=got)


@case("RCV-QRM-014", suite=SUITE, role=Role.RECEIVER,
      title="When the source asks (SRI ACK-to-source), the receiver confirms delivery to it",
      section="Message Consumption",
      requirement="This notification takes the form of an acknowledgement, or ACK, to the "
                  "store(s) in use as well as to the source if you configured the source for "
                  "delivery confirmation.",
      timeout=20.0)
def confirms_when_asked(h: CaseContext) -> None:
    """The SRI asks for delivery confirmation: the source's request port must get
    confirmations up to 4."""
    got = _confirmation_case(h, asked=True)
    h.check(4 in got, "the receiver did not confirm delivery to the source that asked",
            expected="a delivery confirmation for 4", observed=got)


@case("RCV-QRM-015", suite=SUITE, role=Role.RECEIVER,
      title="ACK batching: consumption is acknowledged once per ume_ack_batching_interval",
      section="Batching Acknowledgments",
      requirement="If you set ume_use_ack_batching to 1, UMP does not acknowledge individual "
                  "messages as the application consumes them. Instead, UMP checks the "
                  "consumed, but unacknowledged messages at the interval configured with "
                  "ume_ack_batching_interval ... it sends acknowledgments to the store(s) for "
                  "all the contiguous messages.",
      timeout=15.0)
def ack_batching(h: CaseContext) -> None:
    """Batching on, interval 1000 ms; a message every 100 ms for 2 s: the store must get
    cumulative ACKs for at most a few distinct sequence numbers (one per interval, plus one
    at each end), not one per message, and in the end one covering the last message."""
    src, (store,) = _groups(h, 1)
    _start(h, src, {"receiver ume_use_ack_batching": 1,
                    "context ume_ack_batching_interval": 1000})
    _registered(h, store)
    for sqn in range(20):
        src.publish(sqn)
        h.wait_until(lambda: False, 0.1, "the next message's time")
    h.check_delivered(list(range(20)))
    h.wait_until(lambda: store.acked_up_to() == 19, 2.0, "the ACK covering 19")
    acks = _acks(store)
    distinct = sorted(set(acks))
    h.check(0 < len(distinct) <= 5, f"{len(distinct)} different ACKs for 20 messages "
            f"consumed over 2 s with a 1000 ms batching interval",
            expected="at most 5 (one per interval, plus the ends)", observed=distinct)
    h.check_equal(max(acks, default=None), 19, "the consumption acknowledged at the end")


@case("RCV-QRM-016", suite=SUITE, role=Role.RECEIVER,
      title="ACK batching with consumption out of order: only the contiguous run consumed is "
            "acknowledged",
      section="Batching Acknowledgments",
      requirement="When UMP discovers a contiguous series of consumed message sequence numbers "
                  "(sqn), it sends acknowledgments to the store(s) for all the contiguous "
                  "messages. For example, assume your application consumes and acknowledges "
                  "messages 1 and 2, then consumes subsequent messages in the following order: "
                  "4, 5, 7, 8, 6, 10, 3. At the next ume_ack_batching_interval, UMP sends "
                  "consumption acknowledgments to the store(s) for messages 3 - 8.",
      timeout=15.0)
def batching_out_of_order(h: CaseContext) -> None:
    """The guide's example: 1..10 delivered (the store answered low 1), the application
    consumes 1, 2 (ACK 2), then 4, 5, 7, 8, 6, 10, 3: the next ACK must be 8, and no ACK
    may cover 3..7, 9 or 10 on its own (3 was consumed last; 9 never)."""
    src, (store,) = _groups(h, 1)
    src.publish(0, live=False)  # consumed before (the store's low is 1)
    store.receiver_low = 1
    _start(h, src, {"receiver ume_use_ack_batching": 1,
                    "context ume_ack_batching_interval": 200}, consume=True)
    _registered(h, store)
    src.publish(*range(1, 11))
    h.check_delivered(list(range(1, 11)))
    for sqn in (1, 2):
        h.ack_iut(sqn)
    h.wait_until(lambda: store.acked_up_to() == 2, 2.0, "the ACK for 2")
    h.check_equal(store.acked_up_to(), 2, "the consumption acknowledged after 1, 2")
    for sqn in (4, 5, 7, 8, 6, 10):
        h.ack_iut(sqn)
    h.wait_until(lambda: False, 0.6, "ACKs (only 2 may come: 3 is not consumed)")
    early = sorted({a for a in _acks(store) if a > 2})
    h.check(not early, "the receiver acknowledged past a message not consumed yet (3)",
            expected="no ACK above 2 before 3 is consumed", observed=early)
    h.ack_iut(3)
    h.wait_until(lambda: (store.acked_up_to() or 0) >= 8, 2.0, "the ACK for 8")
    h.wait_until(lambda: False, 0.5, "more ACKs (must not go past 8)")
    h.check_equal(store.acked_up_to(), 8, "the consumption acknowledged after 3 (3 - 8)")
