"""The quorum suite, source IUT (SRC-QRM-*): registration completion and message stability by the
intragroup and intergroup behaviours with two and three store groups, consensus sequence numbers,
store unresponsive, no sends after quorum loss and sends again after it returns, and the returning
store getting the unstable messages again (guide "Sources Using Quorum/Consensus";
docs/semantics.md §1.2, §1.12).

The harness plays every store (:class:`~conformance.store_peer.HarnessStore`), each in the group
its ``ume_store`` line names, with the ``ume_store_group`` sizes the case gives; every option
that decides a verdict is set by the case.  What the wire shows is judged:

* *registration completion*: a source may send only once Registration Complete (guide "Source
  Events"), so the first data message on the transport marks it; stores that should not count
  yet do not answer the PREG (:attr:`HarnessStore.answer`).
* *stability*: with ``ume_flight_size`` 2 and block, exactly the messages the flight allows go
  out while the stores withhold their stability ACKs (:attr:`HarnessStore.ack`); one more may
  follow once an ACK makes the oldest stable by the rules (as the flight-size suite does).
* *consensus*: the stores answer OLD with chosen high sequence numbers; the first data message
  carries the consensus + 1 (guide "Source Recovery").
* *unresponsive*: a store falls silent (:attr:`HarnessStore.silent`); a source that declared it
  unresponsive registers with it again (a new PREG), and with the quorum gone puts nothing on
  the transport until a store returns.

Choices where the guide is silent (the reference's, docs/semantics.md §1.2): ``all-active``
within a group needs a quorum of acknowledgements too; consensus ``majority`` is per group over
the stores that answered OLD, then the latest of the group majorities.
"""

from __future__ import annotations

import time

from conformance.context import CaseContext
from conformance.model import Role, case
from conformance.store_peer import HarnessStore
from conformance.suites.flight_size import _blocked_at, _settled
from conformance.suites.source import _wait_data

SUITE = "quorum"

SECTION_QC = "Sources Using Quorum/Consensus Store Configuration"
INTRA = ("The intragroup behavior specifies the requirements needed to stabilize a message among "
         "the stores within a group. A message is stable for the group once it is successfully "
         "stored at a quorum (majority) of the group's stores or successfully stored in all the "
         "stores in the group.")
INTER = ("The intergroup behavior specifies the requirements needed to stabilize a message among "
         "groups of stores. A message is stable among the groups if it is successfully stored at "
         "any group, a majority of groups, all groups, or all active groups.")
COMPLETE = ("Store Registration Complete: delivered once a source has completed registration "
            "with the required store(s). This indicates the source may send as it desires.")
CONSENSUS = ("When QC is in use, UMP uses the consensus of the group(s) to determine what "
             "sequence number to use in the first message it will send ... "
             "ume_consensus_sequence_number_behavior to use the lowest sequence number of the "
             "latest group of sequence numbers seen from any store, the highest, or the "
             "majority.")

REGISTRATION: dict[str, str | int] = {"source ume_registration_interval": 500}
"""A short registration round: a source completes one interval after its start at the latest
when some stores never answer."""

FLIGHT: dict[str, str | int] = {"source ume_flight_size": 2, "source ume_flight_size_bytes": 0,
          "source ume_flight_size_behavior": "block",
          "source ume_retention_unique_confirmations": 0,
          "source ume_message_stability_timeout": 60_000}
"""Flight size 2 (block), no confirmations, no proactive retransmission within a case: what is
in flight is what is not stable by the group rules."""


def _rules(intra: str, inter: str) -> dict[str, str | int]:
    return {"source ume_retention_intragroup_stability_behavior": intra,
            "source ume_retention_intergroup_stability_behavior": inter}


def _no_data(h: CaseContext, store: HarnessStore, seconds: float, why: str) -> None:
    """No data on the transport for ``seconds`` (the source must not be complete yet)."""
    h.wait_until(lambda: bool(store.data_sqns()), seconds, f"data {why} (must not come)")
    h.check(not store.data_sqns(), f"the source sent data {why}",
            expected="no data: Registration Complete must wait for the rules",
            observed=f"data messages {store.data_sqns()[:5]}")


def _granted(h: CaseContext, stores: list[HarnessStore], what: str) -> None:
    h.wait_until(lambda: all(s.granted for s in stores), 4.0, what)
    h.check(all(s.granted for s in stores), f"the source did not register with {what}",
            expected="a granted PREG at each", observed=[len(s.granted) for s in stores])


def _data_after(h: CaseContext, store: HarnessStore, what: str, timeout: float = 4.0) -> None:
    """Data must flow within ``timeout`` seconds of now."""
    count = len(store.data_sqns())
    h.wait_until(lambda: len(store.data_sqns()) > count, timeout, what)
    h.check(len(store.data_sqns()) > count, f"the source sent no data {what}",
            expected="data once the rules hold", observed=f"{count} data message(s) before, "
            f"none after")


# --- registration completion --------------------------------------------------------------------

@case("SRC-QRM-001", suite=SUITE, role=Role.SOURCE,
      title="Intergroup any: registration completes with one group of two",
      section="Quorum/Consensus Store Usage",
      requirement="As long as a single group maintains quorum, then UMP allows a source to "
                  "proceed.",
      timeout=12.0)
def any_group_completes(h: CaseContext) -> None:
    """Two groups of one store each, intergroup ``any``: store B (group 1) never answers; A's
    group alone must let the source send (within a few registration intervals)."""
    a, b = h.store(group=0), h.store(group=1)
    b.answer = False
    h.start_iut(a, b, groups=((0, 1), (1, 1)),
                options={**REGISTRATION, **_rules("quorum", "any")})
    _wait_data(h, a, "data with one group of two registered", timeout=5.0)


@case("SRC-QRM-002", suite=SUITE, role=Role.SOURCE,
      title="Intergroup all: no data until every group registered",
      section=SECTION_QC, requirement=f"{INTER} {COMPLETE}", timeout=12.0)
def all_groups_complete(h: CaseContext) -> None:
    """Two groups of one store each, intergroup ``all``: only A (group 0) answers, so nothing
    may go out for three registration intervals; once B (group 1) answers, data must flow."""
    a, b = h.store(group=0), h.store(group=1)
    b.answer = False
    h.start_iut(a, b, groups=((0, 1), (1, 1)),
                options={**REGISTRATION, **_rules("quorum", "all")})
    _granted(h, [a], "store A (group 0)")
    _no_data(h, a, 1.5, "with group 1 of 2 not registered (intergroup all)")
    b.answer = True
    _wait_data(h, a, "data once both groups registered", timeout=4.0)


@case("SRC-QRM-003", suite=SUITE, role=Role.SOURCE,
      title="Intergroup majority of three groups: no data with one group, data with two",
      section=SECTION_QC, requirement=f"{INTER} {COMPLETE}", timeout=12.0)
def majority_of_groups_completes(h: CaseContext) -> None:
    """Three groups of one store each, intergroup ``majority``: with only A (group 0)
    registered, one group of three is no majority; once C (group 2) answers, two are."""
    a, b, c = h.store(group=0), h.store(group=1), h.store(group=2)
    b.answer = c.answer = False
    h.start_iut(a, b, c, groups=((0, 1), (1, 1), (2, 1)),
                options={**REGISTRATION, **_rules("quorum", "majority")})
    _granted(h, [a], "store A (group 0)")
    _no_data(h, a, 1.5, "with one group of three registered (intergroup majority)")
    c.answer = True
    _wait_data(h, a, "data once two groups of three registered", timeout=4.0)


@case("SRC-QRM-004", suite=SUITE, role=Role.SOURCE,
      title="Intergroup all-active: a group with a quorum registered is active and must "
            "complete by the intragroup rule",
      section=SECTION_QC,
      requirement=f"{INTER} A message is considered stable when it has been successfully "
                  f"stored at a quorum of stores in all the active groups. {COMPLETE}",
      timeout=12.0)
def all_active_groups_complete(h: CaseContext) -> None:
    """Intragroup ``all``, intergroup ``all-active``; group 0 is A (size 1), group 1 is B, C,
    D (size 3).  A, B and C answer: group 1 has a quorum registered, so it is active, and under
    intragroup ``all`` it is not complete until D answers too: no data.  Once D answers, data
    must flow.  (A source that judges "active" by the intragroup rule, or takes all-active as
    any, sends with group 0 alone.)"""
    a = h.store(group=0)
    b, c, d = h.store(group=1), h.store(group=1), h.store(group=1)
    d.answer = False
    h.start_iut(a, b, c, d, groups=((0, 1), (1, 3)),
                options={**REGISTRATION, **_rules("all", "all-active")})
    _granted(h, [a, b, c], "stores A, B and C")
    _no_data(h, a, 1.5, "with group 1 active (2 of 3) but not all registered (intragroup all)")
    d.answer = True
    _wait_data(h, a, "data once every store of the active group registered", timeout=4.0)


@case("SRC-QRM-005", suite=SUITE, role=Role.SOURCE,
      title="Intragroup all: no data until every store of the group registered",
      section=SECTION_QC, requirement=f"{INTRA} {COMPLETE}", timeout=12.0)
def intragroup_all_completes(h: CaseContext) -> None:
    """One group of three, intragroup ``all``: A and B answer, a quorum but not all; nothing
    may go out until C answers too."""
    a, b, c = h.store(), h.store(), h.store()
    c.answer = False
    h.start_iut(a, b, c, groups=((0, 3),), options={**REGISTRATION, **_rules("all", "any")})
    _granted(h, [a, b], "stores A and B")
    _no_data(h, a, 1.5, "with 2 of 3 stores registered (intragroup all)")
    c.answer = True
    _wait_data(h, a, "data once all 3 stores registered", timeout=4.0)


@case("SRC-QRM-006", suite=SUITE, role=Role.SOURCE,
      title="Intragroup all-active: registration completes with a quorum of the group",
      section=SECTION_QC,
      requirement="UMP requires a source to have a quorum of stores available in the group in "
                  "order to send messages (intragroup all-active: complete at a quorum "
                  "registered, stable at every registered store).",
      timeout=12.0)
def intragroup_all_active_completes(h: CaseContext) -> None:
    """One group of three, intragroup ``all-active``: C never answers; A and B are a quorum
    and data must flow (within a few registration intervals)."""
    a, b, c = h.store(), h.store(), h.store()
    c.answer = False
    h.start_iut(a, b, c, groups=((0, 3),),
                options={**REGISTRATION, **_rules("all-active", "any")})
    _wait_data(h, a, "data with 2 of 3 stores registered (intragroup all-active)", timeout=5.0)


# --- stability ----------------------------------------------------------------------------------

@case("SRC-QRM-007", suite=SUITE, role=Role.SOURCE,
      title="Intergroup majority: a message is stable once two groups of three have it",
      section=SECTION_QC,
      requirement=f"{INTER} Notice that a message needs to meet intragroup stability "
                  f"requirements before it can meet intergroup stability requirements.",
      timeout=12.0)
def majority_of_groups_stable(h: CaseContext) -> None:
    """Three groups of one store, intergroup ``majority``, flight size 2: A acknowledges
    everything, B and C nothing: one group of three is no majority, so exactly 0 and 1 go out;
    once C acknowledges 0, exactly one more (2) may follow."""
    a, b, c = h.store(group=0), h.store(group=1), h.store(group=2)
    b.ack = c.ack = False
    h.start_iut(a, b, c, groups=((0, 1), (1, 1), (2, 1)),
                options={**REGISTRATION, **FLIGHT, **_rules("quorum", "majority")})
    _settled(h, c, 0.5, 3.0, "sending with one group of three acknowledging")
    _blocked_at(h, c, [0, 1], "the messages sent while one group of three acknowledged")
    c.send_stable(0)
    _blocked_at(h, c, [0, 1, 2], "the messages sent once two groups of three acknowledged 0")


@case("SRC-QRM-008", suite=SUITE, role=Role.SOURCE,
      title="Intergroup all-active: an active group that has not acknowledged keeps the "
            "message in flight",
      section=SECTION_QC,
      requirement=f"{INTER} A message is considered stable when it has been successfully "
                  f"stored at a quorum of stores in all the active groups.",
      timeout=12.0)
def all_active_groups_stable(h: CaseContext) -> None:
    """Intergroup ``all-active``, flight size 2.  Group 0: A, B (size 2), acknowledging
    everything; group 1: C, D, E (size 3), of which C and D register (a quorum: the group is
    active) and acknowledge nothing, E never answers.  Group 0 alone is not enough: exactly 0
    and 1 go out; once C and D acknowledge 0, exactly one more (2) may follow."""
    a, b = h.store(group=0), h.store(group=0)
    c, d, e = h.store(group=1), h.store(group=1), h.store(group=1)
    c.ack = d.ack = False
    e.answer = False
    h.start_iut(a, b, c, d, e, groups=((0, 2), (1, 3)),
                options={**REGISTRATION, **FLIGHT, **_rules("quorum", "all-active")})
    _settled(h, c, 0.5, 3.0, "sending with the active group 1 not acknowledging")
    _blocked_at(h, c, [0, 1], "the messages sent while active group 1 acknowledged nothing")
    c.send_stable(0)
    d.send_stable(0)
    _blocked_at(h, c, [0, 1, 2], "the messages sent once group 1's quorum acknowledged 0")


@case("SRC-QRM-009", suite=SUITE, role=Role.SOURCE,
      title="Intragroup all-active: every registered store of the group must acknowledge",
      section=SECTION_QC,
      requirement=f"{INTRA} (ume_retention_intragroup_stability_behavior all-active: stable "
                  f"once every active, that is registered, store of the group has it.)",
      timeout=12.0)
def intragroup_all_active_stable(h: CaseContext) -> None:
    """One group of three, intragroup ``all-active``, all three registered, flight size 2: A
    and B acknowledge everything (a quorum), C nothing: C is registered, so exactly 0 and 1 go
    out; once C acknowledges 0, exactly one more (2) may follow."""
    a, b, c = h.store(), h.store(), h.store()
    c.ack = False
    h.start_iut(a, b, c, groups=((0, 3),),
                options={**REGISTRATION, **FLIGHT, **_rules("all-active", "any")})
    _settled(h, c, 0.5, 3.0, "sending with a registered store not acknowledging")
    _blocked_at(h, c, [0, 1], "the messages sent while registered store C acknowledged nothing")
    c.send_stable(0)
    _blocked_at(h, c, [0, 1, 2], "the messages sent once every registered store acknowledged 0")


@case("SRC-QRM-010", suite=SUITE, role=Role.SOURCE,
      title="Intragroup all-active: a store that is not registered is not waited for",
      section=SECTION_QC,
      requirement=f"{INTRA} (ume_retention_intragroup_stability_behavior all-active: stable "
                  f"once every active, that is registered, store of the group has it.)",
      timeout=12.0)
def intragroup_all_active_skips_unregistered(h: CaseContext) -> None:
    """One group of three, intragroup ``all-active``, flight size 2: C never answers, A and B
    register and acknowledge everything: every registered store has every message, so the
    source must go on sending well past the flight size (at least 10 messages; a source that
    waits for C as under ``all`` stops at 2)."""
    a, b, c = h.store(), h.store(), h.store()
    c.answer = False
    h.start_iut(a, b, c, groups=((0, 3),),
                options={**REGISTRATION, **FLIGHT, **_rules("all-active", "any")})
    _wait_data(h, a, "the first message", timeout=5.0)
    h.wait_until(lambda: len(a.data_sqns()) >= 10, 3.0, "10 messages")
    h.check(len(a.data_sqns()) >= 10, "the source waited for a store that never registered",
            expected="sends going on: A and B, every registered store, acknowledge each",
            observed=f"messages {sorted(a.data_sqns())}")


@case("SRC-QRM-011", suite=SUITE, role=Role.SOURCE,
      title="Intragroup all: a quorum of acknowledgements is not enough",
      section=SECTION_QC, requirement=INTRA, timeout=12.0)
def intragroup_all_stable(h: CaseContext) -> None:
    """One group of three, intragroup ``all``, flight size 2: A and B acknowledge everything,
    C nothing: exactly 0 and 1 go out; once C acknowledges 0, exactly one more (2) may
    follow."""
    a, b, c = h.store(), h.store(), h.store()
    c.ack = False
    h.start_iut(a, b, c, groups=((0, 3),),
                options={**REGISTRATION, **FLIGHT, **_rules("all", "any")})
    _settled(h, c, 0.5, 3.0, "sending with 2 of 3 stores acknowledging")
    _blocked_at(h, c, [0, 1], "the messages sent while 2 of 3 stores acknowledged")
    c.send_stable(0)
    _blocked_at(h, c, [0, 1, 2], "the messages sent once all 3 stores acknowledged 0")


# --- consensus sequence number ------------------------------------------------------------------

HIGHS = (3, 3, 3, 8, 8, 12)
"""The high sequence numbers the six stores answer OLD with: group 0 (3, 3, 3), group 1
(8, 8, 12).  Lowest 3; per group majority 3 and 8, the latest 8; highest 12; a "majority" over
all six stores (4 of 6 hold 3 or more) would be 3."""


def _resumes_at(h: CaseContext, behaviour: str, expected: int) -> None:
    stores = [h.store(group=0) for _ in range(3)] + [h.store(group=1) for _ in range(3)]
    for store, high in zip(stores, HIGHS, strict=True):
        store.old, store.high_seqnum = True, high
    h.start_iut(*stores, reg_ids={s: 1000 + n for n, s in enumerate(stores)},
                groups=((0, 3), (1, 3)),
                options={**REGISTRATION,
                         "source ume_consensus_sequence_number_behavior": behaviour})
    first = _wait_data(h, stores[0], "the first message after re-registration", timeout=5.0)
    h.check_equal(first, expected, f"the sequence number the source resumed at "
                                   f"(consensus {behaviour} of 3, 3, 3 | 8, 8, 12)")


@case("SRC-QRM-012", suite=SUITE, role=Role.SOURCE,
      title="Consensus majority is per group, then the latest of the group majorities",
      section="Source Recovery", requirement=CONSENSUS, timeout=12.0)
def consensus_majority(h: CaseContext) -> None:
    """Two groups of three answer OLD: 3, 3, 3 and 8, 8, 12; with ``majority`` the groups
    agree on 3 and 8, the latest is 8, so the first message is 9 (a majority over all six
    stores gives 4, the highest 13)."""
    _resumes_at(h, "majority", 9)


@case("SRC-QRM-013", suite=SUITE, role=Role.SOURCE,
      title="Consensus lowest: the lowest answer of any store",
      section="Source Recovery", requirement=CONSENSUS, timeout=12.0)
def consensus_lowest(h: CaseContext) -> None:
    """The stores of SRC-QRM-012 with ``lowest``: the first message is 4."""
    _resumes_at(h, "lowest", 4)


@case("SRC-QRM-014", suite=SUITE, role=Role.SOURCE,
      title="Consensus highest: the highest answer of any store",
      section="Source Recovery", requirement=CONSENSUS, timeout=12.0)
def consensus_highest(h: CaseContext) -> None:
    """The stores of SRC-QRM-012 with ``highest``: the first message is 13."""
    _resumes_at(h, "highest", 13)


# --- store unresponsive, quorum lost, the returning store --------------------------------------

LIVENESS: dict[str, str | int] = {"source ume_registration_interval": 500,
                                  "source ume_store_activity_timeout": 2000,
                                  "source ume_store_check_interval": 100,
                                  "context ume_proactive_keepalive_interval": 1500}
"""A store silent for 2 s is unresponsive (checked every 100 ms); a store not heard for 1.5 s
gets a keepalive (the harness stores answer it unless silent), so a live store that has nothing
to acknowledge stays registered; registrations every 0.5 s."""


def _pregs_after(store: HarnessStore, since: float) -> list[float]:
    return [s.at for s in store.source_pregs() if s.at > since]


def _silence(h: CaseContext, *stores: HarnessStore) -> float:
    """Make ``stores`` fall silent; the time it happened."""
    h.note(f"{', '.join(s.name for s in stores)} fall{'s' if len(stores) == 1 else ''} silent")
    for store in stores:
        store.silent = True
    return time.monotonic()


@case("SRC-QRM-015", suite=SUITE, role=Role.SOURCE,
      title="A store silent for ume_store_activity_timeout is unresponsive: the source "
            "registers with it again, and not before",
      section="Source Events",
      requirement="Store Unresponsive Event: delivered once a store is seen to be unresponsive "
                  "due to failure or network disconnect (ume_store_activity_timeout). If "
                  "stores become unresponsive, or if communication among sources, stores and "
                  "receivers becomes impaired, the source directs re-registration.",
      timeout=12.0)
def silent_store_is_unresponsive(h: CaseContext) -> None:
    """One group of three, activity timeout 2 s: A and B stay heard (their stability ACKs of
    the steady traffic), C falls silent.  A new PREG to C must come after about the activity
    timeout (not before 1.6 s, and within 4 s); none to A or B; data goes on (two of three
    are still a quorum)."""
    a, b, c = h.store(), h.store(), h.store()
    h.start_iut(a, b, c, groups=((0, 3),), options={**LIVENESS, **_rules("quorum", "any")})
    _wait_data(h, a, "the first message", timeout=5.0)
    h.wait_until(lambda: False, 0.3, "steady traffic")
    since = _silence(h, c)
    h.wait_until(lambda: bool(_pregs_after(c, since)), 4.0, "a new PREG to the silent store C")
    again = _pregs_after(c, since)
    h.check(bool(again), "the source never registered again with a store silent for longer "
            "than ume_store_activity_timeout",
            expected="a new PREG to C about 2 s after it fell silent", observed="none in 4 s")
    # a lower bound is the IUT's own timing (its activity timeout): never scaled
    h.check(again[0] - since >= 1.6,
            "the source gave up on the silent store before ume_store_activity_timeout",
            expected="no new PREG within 1.6 s (activity timeout 2 s)",
            observed=f"a PREG {again[0] - since:.2f} s after it fell silent")
    h.check(not _pregs_after(a, since) and not _pregs_after(b, since),
            "the source registered again with a store it kept hearing",
            expected="no new PREG to A or B", observed=f"{len(_pregs_after(a, since))} to A, "
            f"{len(_pregs_after(b, since))} to B")
    _data_after(h, a, "after C became unresponsive (A and B are a quorum)", timeout=2.0)


@case("SRC-QRM-016", suite=SUITE, role=Role.SOURCE,
      title="Quorum lost: no data until a store returns; then data again",
      section="Quorum/Consensus Store Usage",
      requirement="UMP requires a source to have a quorum of stores available in the group in "
                  "order to send messages. (Single Store Fails: a send while not registered "
                  "with enough stores returns an error; the source should wait and send "
                  "again.)",
      timeout=15.0)
def quorum_lost_stops_sends(h: CaseContext) -> None:
    """One group of three, activity timeout 2 s: B and C fall silent, so after about two
    seconds one store of three is left: no quorum.  From 2.6 s after the silence on, nothing
    may go on the transport for a second (A sees it all; it stays registered, answering the
    source's keepalives); then B returns and answers the source's next PREG: data must flow
    again."""
    a, b, c = h.store(), h.store(), h.store()
    h.start_iut(a, b, c, groups=((0, 3),), options={**LIVENESS, **_rules("quorum", "any")})
    _wait_data(h, a, "the first message", timeout=5.0)
    since = _silence(h, b, c)
    h.wait_until(lambda: False, 2.6, "the stores' activity timeout")
    count = len(a.data_sqns())
    h.wait_until(lambda: len(a.data_sqns()) > count, 1.0, "data without a quorum (must not come)")
    h.check(len(a.data_sqns()) == count, "the source sent data with one store of three left",
            expected="no data after the quorum was lost",
            observed=f"{len(a.data_sqns()) - count} message(s) "
                     f"{a.data_sqns()[count:count + 5]}")
    h.check(bool(_pregs_after(b, since)), "the source did not try to register with the silent "
            "stores again", expected="new PREGs to B and C", observed="none")
    grants = len(b.granted)
    h.note("store B returns")
    b.silent = False
    h.wait_until(lambda: len(b.granted) > grants, 2.0, "store B granting again")
    h.check(len(b.granted) > grants, "the source did not register with the returning store",
            expected="a PREG store B grants", observed="none")
    _data_after(h, a, "once the returning store brought the quorum back", timeout=3.0)


@case("SRC-QRM-017", suite=SUITE, role=Role.SOURCE,
      title="A returning store gets the unstable messages at once",
      section="Source Registration Information (SRI)",
      requirement="If stores become unresponsive and the source must re-register when the "
                  "store returns, the source increases the SRI version number ... (Messages "
                  "in flight stay in flight and are retransmitted to the returning store: "
                  "docs/semantics.md §1.12.)",
      timeout=15.0)
def returning_store_gets_unstable(h: CaseContext) -> None:
    """One group of three, ``ume_message_stability_timeout`` 60 s (no timed retransmission
    within the case): A acknowledges everything, B nothing, C falls silent and becomes
    unresponsive (A and B still a quorum of registrations; the messages since are unstable:
    only A has them).  When C returns and the source registers with it again, C must get as
    proactive retransmissions, within 1.5 s, every message it did not acknowledge, and none
    it did."""
    a, b, c = h.store(), h.store(), h.store()
    b.ack = False
    h.start_iut(a, b, c, groups=((0, 3),),
                options={**LIVENESS, **_rules("quorum", "any"),
                         "source ume_message_stability_timeout": 60_000})
    _wait_data(h, c, "the first message", timeout=5.0)
    h.wait_until(lambda: False, 0.3, "steady traffic")
    since = _silence(h, c)
    h.wait_until(lambda: bool(_pregs_after(c, since)), 4.0, "the source re-registering C")
    h.check(bool(_pregs_after(c, since)), "the source did not register with C again",
            expected="a new PREG after the activity timeout", observed="none")
    # C is silent: nothing it had not acknowledged by now is stable (B never acknowledges)
    missing = set(a.data_sqns()) - c.stable_sqns()
    acked = c.stable_sqns()
    h.check(bool(missing), "the source sent nothing while store C was silent",
            expected="steady traffic (A and B are a quorum of registrations)",
            observed=f"{len(a.data_sqns())} messages, all acknowledged by C")
    grants = len(c.granted)
    h.note("store C returns")
    c.silent = False
    h.wait_until(lambda: len(c.granted) > grants, 2.0, "store C granting again")
    h.check(len(c.granted) > grants, "the source did not register with the returning store",
            expected="a PREG store C grants", observed="none")
    granted_at = c.snapshot_granted()[-1][0]

    def resent() -> set[int]:
        return {s.message.sqn for s in c.snapshot(c.prorx) if s.at >= granted_at}
    h.wait_until(lambda: missing <= resent(), 1.5, "the unstable messages at the returning store")
    left = sorted(missing - resent())
    h.check(not left, "the returning store did not get the messages it had not acknowledged",
            expected=f"{len(missing)} proactive retransmission(s) at once",
            observed=f"{len(left)} missing: {left[:8]}")
    h.check(not resent() & acked, "the source resent messages the returning store had "
            "acknowledged", expected="only unacknowledged messages",
            observed=sorted(resent() & acked)[:8])


@case("SRC-QRM-018", suite=SUITE, role=Role.SOURCE,
      title="Intragroup all-active: an unresponsive store is dropped from the stability rule "
            "at once",
      section=SECTION_QC,
      requirement=f"{INTRA} (all-active: stable once every active, that is registered, store "
                  f"has it; a store that became unresponsive is no longer active, so what "
                  f"waited only for it is stable.)",
      timeout=15.0)
def all_active_drops_unresponsive_store(h: CaseContext) -> None:
    """One group of three, intragroup ``all-active``, flight size 2, activity timeout 2 s:
    A and B acknowledge everything, C nothing, so exactly 0 and 1 go out.  Then C falls
    silent: about two seconds later it is unresponsive (A and B, idle too, answer the source's
    keepalives), A and B are every registered store, and 0 and 1 (which they hold) are stable:
    sending must go on (at least 3 more messages within 4.5 s), with no ACK from C."""
    a, b, c = h.store(), h.store(), h.store()
    c.ack = False
    h.start_iut(a, b, c, groups=((0, 3),),
                options={**LIVENESS, **FLIGHT, **_rules("all-active", "any")})
    _settled(h, a, 0.5, 3.0, "sending with a registered store not acknowledging")
    _blocked_at(h, a, [0, 1], "the messages sent while registered store C acknowledged nothing")
    _silence(h, c)
    h.wait_until(lambda: len(a.data_sqns()) >= 5, 4.5,
                 "sends going on once C is unresponsive")
    h.check(len(a.data_sqns()) >= 5, "the source kept waiting for a store that became "
            "unresponsive (it is no longer active under all-active)",
            expected="messages 2, 3, 4 ... once C is unresponsive",
            observed=f"messages {sorted(a.data_sqns())}")


@case("SRC-QRM-019", suite=SUITE, role=Role.SOURCE,
      title="Intergroup all: a message is stable only once every group has it",
      section=SECTION_QC,
      requirement=f"{INTER} Notice that a message needs to meet intragroup stability "
                  f"requirements before it can meet intergroup stability requirements.",
      timeout=12.0)
def all_groups_stable(h: CaseContext) -> None:
    """Three groups of one store, intergroup ``all``, flight size 2: A and B acknowledge
    everything, C nothing: two groups of three (a majority, and more than any one) are not
    all, so exactly 0 and 1 go out; once C acknowledges 0, exactly one more (2) may follow.
    (A source that takes ``all`` as ``any`` or as ``majority`` for stability goes on sending;
    SRC-QRM-002 judges ``all`` for registration only.)"""
    a, b, c = h.store(group=0), h.store(group=1), h.store(group=2)
    c.ack = False
    h.start_iut(a, b, c, groups=((0, 1), (1, 1), (2, 1)),
                options={**REGISTRATION, **FLIGHT, **_rules("quorum", "all")})
    _settled(h, c, 0.5, 3.0, "sending with two groups of three acknowledging")
    _blocked_at(h, c, [0, 1], "the messages sent while group 2 of three acknowledged nothing")
    c.send_stable(0)
    _blocked_at(h, c, [0, 1, 2], "the messages sent once every group acknowledged 0")
