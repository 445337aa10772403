"""Source suites: how a source IUT registers with its stores, and what it retains and resends.

The harness plays the resolver daemon, the stores (:class:`~conformance.store_peer
.HarnessStore`: every PREG_RESP, stability ACK and keepalive crafted with the Scapy layers) and
a receiver on the source's transport (:class:`~conformance.store_peer.SourceTap`).  The IUT is
started by each case with a UM configuration naming the case's stores in ``ume_store`` lines;
options that decide a verdict (registration interval, flight size, stability timeout ...) are
set explicitly, so the verdict does not depend on the IUT's version defaults.  Section names are
the product guide's (the UM Guide for Persistence).

Registration Complete is observed on the wire: a source may send data only once it is
complete, so the first data message a harness store receives on the source's transport marks
it.  The reference profile launches the source sending steadily (50 messages a second).
"""

from __future__ import annotations

import time

from conformance.context import CaseContext
from conformance.model import Role, case
from conformance.store_peer import HarnessStore
from wire.lbmc import (
    Header,
    LbmcMessage,
    PregError,
    Sri,
    TopicIdx,
    Topicname,
    UmePreg,
    UmeSid,
    UmeStoreExt,
)

SUITE_REG = "registration"
SUITE_REC = "recovery"

FAST_REGISTRATION = {"source ume_registration_interval": 1000}
"""A registration round short enough for a case (the default is 3 s)."""


def _preg(seen_message: LbmcMessage) -> Header:
    header = seen_message.header(UmePreg)
    assert header is not None
    return header


def _wait_data(h: CaseContext, store: HarnessStore, what: str, timeout: float = 4.0) -> int:
    """Wait for the first data message on the source's transport; its sequence number."""
    if not h.wait_until(lambda: bool(store.data_sqns()), timeout, what):
        h.check(False, f"{what}: the source sent no data message",
                expected="data on the transport after Registration Complete",
                observed=f"{len(store.source_pregs())} PREG(s), no data")
    return store.data_sqns()[0]


@case("SRC-REG-001", suite=SUITE_REG, role=Role.SOURCE,
      title="The source registers with every configured store, naming its topic and indexes",
      section="Source Registration",
      requirement="Sources unicast registrations to the store ... Registrations are on a per "
                  "topic per source basis; the configuration option ume_store contains the IP "
                  "address, TCP port, registration ID, and group index for the store(s) to be "
                  "used by the source.")
def registers_with_every_store(h: CaseContext) -> None:
    """Two stores, the second with a static RegID: each must get a source PREG (S flag) for
    the topic, with the RegID its ``ume_store`` line gives and the transport/topic indexes and
    request port the source advertises in its TIR."""
    a, b = h.store(), h.store()
    static = h.random.randrange(100_000, 1 << 30)
    h.start_iut(a, b, reg_ids={b: static}, options=FAST_REGISTRATION)
    h.wait_until(lambda: bool(a.source_pregs() and b.source_pregs()), 4.0, "a PREG at each store")
    h.check(bool(a.source_pregs()) and bool(b.source_pregs()),
            "the source did not register with every configured store",
            expected="a source PREG at store A and at store B",
            observed=f"{len(a.source_pregs())} at A, {len(b.source_pregs())} at B")
    tir = h.wait_tir()
    ume = next((o for o in tir.options or [] if type(o).__name__ == "ToptUme"), None)
    for store, wanted in ((a, 0), (b, static)):
        message = store.source_pregs()[0].message
        preg = _preg(message)
        topic = message.header(Topicname)
        h.check(topic is not None and topic.topic == h.iut_topic,
                f"the PREG to {store.name} does not name the topic",
                expected=h.iut_topic, observed=getattr(topic, "topic", None))
        h.check_equal(preg.reg_id, wanted, f"the RegID the PREG to {store.name} asks for")
        h.check_equal(preg.topic_idx, tir.index, f"topic_idx of the PREG to {store.name}")
        if ume is not None:
            h.check_equal(preg.transport_idx, ume.transport_idx,
                          f"transport_idx of the PREG to {store.name} (TIR's UME option)")
            h.check_equal((preg.resp_ip, preg.resp_port), (ume.src_tcp_addr, ume.src_tcp_port),
                          f"the response address in the PREG to {store.name}")


@case("SRC-REG-002", suite=SUITE_REG, role=Role.SOURCE,
      title="A source with a Session ID sends it in its PREG and asks for RegID 0",
      section="Managing RegIDs with Session IDs",
      requirement="When a store receives a registration request from a source or receiver "
                  "with a particular Session ID, it checks to see if it already has a source "
                  "or receiver for that topic/Session ID: the source sends its Session ID with "
                  "every registration and lets the store find its RegID.")
def session_id_in_preg(h: CaseContext) -> None:
    store = h.store()
    sid = h.random.randrange(1, 1 << 48)
    h.start_iut(store, options={**FAST_REGISTRATION, "source ume_session_id": sid})
    h.wait_until(lambda: bool(store.source_pregs()), 4.0, "the source's PREG")
    h.check(bool(store.source_pregs()), "the source sent no PREG",
            expected="a source PREG", observed="none")
    message = store.source_pregs()[0].message
    header = message.header(UmeSid)
    h.check(header is not None, "the PREG carries no Session ID header",
            expected=f"UME Session ID {sid:#x}", observed=message.label())
    assert header is not None
    h.check_equal(header.sid, sid, "the Session ID in the PREG")
    h.check_equal(_preg(message).reg_id, 0, "the RegID a Session ID source asks for")


@case("SRC-REG-003", suite=SUITE_REG, role=Role.SOURCE,
      title="A re-registering source resumes after the consensus sequence number of its stores",
      section="Source Recovery",
      requirement="When a source re-registers with a store during recovery, the store tells "
                  "the source what sequence number it has as the most recent from the source "
                  "... Resume sending with the next sequence number; with QC the source uses "
                  "the consensus (ume_consensus_sequence_number_behavior) of the stores.",
      timeout=15.0)
def resumes_after_store_sqn(h: CaseContext) -> None:
    """Three stores answer OLD with high sequence numbers 10, 20 and 30; with the consensus
    behaviour ``majority`` (set explicitly) the first message must be 21 - neither the lowest
    (11), the highest (31) nor a fresh start (0)."""
    stores = [h.store() for _ in range(3)]
    for store, high in zip(stores, (10, 20, 30), strict=True):
        store.old, store.high_seqnum = True, high
    h.start_iut(*stores, reg_ids={s: 1000 + s.index for s in stores},
                options={**FAST_REGISTRATION,
                         "source ume_consensus_sequence_number_behavior": "majority"})
    first = _wait_data(h, stores[0], "the first message after re-registration")
    h.check_equal(first, 21, "the sequence number the source resumed at (majority of 10/20/30)")


@case("SRC-REG-004", suite=SUITE_REG, role=Role.SOURCE,
      title="No data before a quorum of the store group has registered the source",
      section="Source Registration",
      requirement="For multiple stores, the source determines when to issue a Registration "
                  "Complete event based on ume_retention_intragroup_stability_behavior (quorum: "
                  "a majority of the group); after registration sources may send data.",
      timeout=15.0)
def no_data_before_quorum(h: CaseContext) -> None:
    """Three stores in one group: only A answers at first.  One registration of three is no
    quorum, so nothing may be sent on the transport (A has joined it) for two registration
    intervals; once B answers too, data must flow."""
    a, b, c = h.store(), h.store(), h.store()
    b.answer = c.answer = False
    h.start_iut(a, b, c, groups=((0, 3),),
                options={**FAST_REGISTRATION,
                         "source ume_retention_intragroup_stability_behavior": "quorum"})
    h.wait_until(lambda: bool(a.granted), 4.0, "store A granting the registration")
    h.check(bool(a.granted), "store A never got a PREG to grant",
            expected="a source PREG at A", observed="none")
    h.wait_until(lambda: bool(a.data_sqns()), 2.2, "data with one store of three (must not come)")
    h.check(not a.data_sqns(), "the source sent data registered with one store of a group of 3",
            expected="no data before a quorum (2 of 3) registered",
            observed=f"data messages {a.data_sqns()[:5]}")
    b.answer = True
    _wait_data(h, a, "data once a quorum registered", timeout=5.0)


@case("SRC-REG-005", suite=SUITE_REG, role=Role.SOURCE,
      title="A store that refuses the registration does not count towards Registration Complete",
      section="Source Registration",
      requirement="Errors go back as an error-coded registration response; the source issues "
                  "Registration Complete only when the configured stability behaviour is met "
                  "by stores that registered it, and only then may it send.",
      timeout=15.0)
def refused_store_does_not_count(h: CaseContext) -> None:
    """Two stores in one group (quorum: both).  A refuses with "RegID in use by a different
    source", B grants: the source has no quorum and must not send, however long it waits."""
    a, b = h.store(), h.store()
    a.refuse = int(PregError.EACTIVE)
    h.start_iut(a, b, groups=((0, 2),), options=FAST_REGISTRATION)
    h.wait_until(lambda: bool(b.granted) and bool(a.source_pregs()), 4.0, "both PREGs")
    h.check(bool(b.granted) and bool(a.source_pregs()), "the source did not register with both",
            expected="a PREG at A (refused) and at B (granted)",
            observed=f"{len(a.source_pregs())} at A, {len(b.granted)} granted at B")
    h.wait_until(lambda: bool(b.data_sqns()), 2.5, "data without a quorum (must not come)")
    h.check(not b.data_sqns(), "the source sent data although one of its two stores refused it",
            expected="no data: 1 of 2 stores registered is no quorum",
            observed=f"data messages {b.data_sqns()[:5]}")


def _store_exts(message: LbmcMessage) -> list[Header]:
    exts: list[Header] = [hd for hd in message.headers if isinstance(hd, UmeStoreExt)]
    return exts


def _sri(message: LbmcMessage) -> Header:
    header = message.header(Sri)
    assert header is not None
    return header


@case("SRC-REG-006", suite=SUITE_REG, role=Role.SOURCE,
      title="The SRI names every registered store with the source's RegID at that store",
      section="Source Registration Information (SRI)",
      requirement="An SRI contains ... IP address, TCP port, store index and group index for "
                  "all the stores with which the source registered, the source's Registration "
                  "ID, and an overall version number and a separate version number per store.")
def sri_names_registered_stores(h: CaseContext) -> None:
    a, b = h.store(), h.store()
    a.assign_reg_id = h.random.randrange(10_000, 1 << 30)
    b.assign_reg_id = a.assign_reg_id + 17
    h.start_iut(a, b, options=FAST_REGISTRATION)
    tap = h.tap()
    message = tap.expect_sri(5.0, "the SRI after Registration Complete")
    sri = _sri(message)
    h.check(sri.version >= 1, "the SRI version is 0", expected="version >= 1",
            observed=sri.version)
    tidx = message.header(TopicIdx)
    h.check(tidx is not None and tidx.tidx == tap.topic_idx,
            "the SRI does not name the topic index the TIR advertises",
            expected=tap.topic_idx, observed=getattr(tidx, "tidx", None))
    exts = {(e.store_ip_addr, e.store_tcp_port): e for e in _store_exts(message)}
    for store in (a, b):
        ext = exts.get(store.addr)
        h.check(ext is not None, f"the SRI does not name {store.name} {store.addr}",
                expected=f"a store record for {store.addr[0]}:{store.addr[1]}",
                observed=sorted(exts))
        assert ext is not None
        h.check_equal(ext.src_reg_id, store.assign_reg_id,
                      f"the source's RegID at {store.name} in the SRI")
        h.check_equal(ext.grp_idx, 0, f"the group index of {store.name} in the SRI")
        h.check(ext.version >= 1, f"the store version of {store.name} in the SRI is 0",
                expected=">= 1", observed=ext.version)
    h.check(len({e.store_idx for e in exts.values()}) == len(exts),
            "two store records of the SRI share a store index",
            expected="distinct store indexes", observed=[e.store_idx for e in exts.values()])


@case("SRC-REG-007", suite=SUITE_REG, role=Role.SOURCE,
      title="An SRI request after the SRI burst is answered with an SRI on the transport",
      section="Receiver Registration",
      requirement="Any receivers joining the transport session when the source is not sending "
                  "SRIs can request an SRI from the source if they find that the UMP flag is "
                  "set in the source's TIR during topic resolution. The source responds with a "
                  "SRI record.")
def sri_request_is_answered(h: CaseContext) -> None:
    """The burst is one SRI (ume_sri_max_number_of_sri_per_update 1), over before the
    harness's receiver joins; its SRI request must still get an SRI naming the store."""
    store = h.store()
    h.start_iut(store, options={**FAST_REGISTRATION,
                                "source ume_sri_max_number_of_sri_per_update": 1,
                                "source ume_sri_inter_sri_interval": 100})
    _wait_data(h, store, "data after Registration Complete")
    tap = h.tap()
    h.wait_until(lambda: False, 0.3, "the transport settling")
    h.check(not tap.sris(), "the source kept sending SRI after a burst of one",
            expected="no SRI before the request", observed=len(tap.sris()))
    tap.sri_request()
    message = tap.expect_sri(2.0, "an SRI answering the SRI request")
    exts = _store_exts(message)
    h.check([(e.store_ip_addr, e.store_tcp_port) for e in exts] == [store.addr],
            "the SRI answering the request does not name the one store",
            expected=[store.addr], observed=[(e.store_ip_addr, e.store_tcp_port) for e in exts])


@case("SRC-REG-008", suite=SUITE_REG, role=Role.SOURCE,
      title="After a store returns, the SRI version and that store's version go up, no other",
      section="Source Registration Information (SRI)",
      requirement="If stores become unresponsive and the source must re-register when the "
                  "store returns, the source increases the SRI version number and the version "
                  "numbers for the stores it re-registered with.",
      timeout=20.0)
def sri_versions_after_store_returns(h: CaseContext) -> None:
    """Three stores; C goes silent until the source declares it unresponsive (activity
    timeout 1 s; A and B stay heard through their stability ACKs of the steady traffic) and
    registers again, which C then grants.  The newest SRI must have a
    higher overall version than the first, a higher version for C and the same for A, B."""
    stores = [h.store() for _ in range(3)]
    a, b, c = stores
    h.start_iut(*stores, groups=((0, 3),), options={
        "source ume_registration_interval": 500, "source ume_store_activity_timeout": 1000,
        "source ume_store_check_interval": 100,
        "source ume_sri_max_number_of_sri_per_update": 2,
        "source ume_sri_inter_sri_interval": 100})
    tap = h.tap()
    first = tap.expect_sri(5.0, "the first SRI")
    before = {(e.store_ip_addr, e.store_tcp_port): e.version for e in _store_exts(first)}
    h.check(set(before) == {s.addr for s in stores}, "the first SRI does not name all 3 stores",
            expected=sorted(s.addr for s in stores), observed=sorted(before))
    pregs_before = len(c.source_pregs())
    c.silent = True
    h.note("store C goes silent")
    h.wait_until(lambda: len(c.source_pregs()) > pregs_before, 6.0,
                 "the source registering with store C again")
    h.check(len(c.source_pregs()) > pregs_before,
            "the source never re-registered with the silent store",
            expected="a new PREG after the store activity timeout", observed="none")
    count = len(tap.sris())
    c.silent = False
    grants = len(c.granted)
    h.wait_until(lambda: len(c.granted) > grants, 3.0, "store C granting again")
    h.check(len(c.granted) > grants, "the source did not register with the returning store",
            expected="a PREG store C grants", observed="none")
    # the SRI burst after the change is 2 SRIs 100 ms apart: judge the newest one after it
    h.wait_until(lambda: len(tap.sris()) >= count + 2, 2.0, "the SRI burst after the change")
    h.wait_until(lambda: False, 0.3, "the end of the burst")
    newest = tap.sris()[-1]
    after = {(e.store_ip_addr, e.store_tcp_port): e.version for e in _store_exts(newest)}
    h.check(_sri(newest).version > _sri(first).version,
            "the SRI version did not increase after the store returned",
            expected=f"> {_sri(first).version}", observed=_sri(newest).version)
    h.check(after.get(c.addr, 0) > before[c.addr],
            "the returning store's version did not increase in the SRI",
            expected=f"> {before[c.addr]}", observed=after.get(c.addr))
    for store in (a, b):
        h.check_equal(after.get(store.addr), before[store.addr],
                      f"the SRI version of {store.name}, which stayed registered")


@case("SRC-REG-009", suite=SUITE_REG, role=Role.SOURCE,
      title="A deregistering source sends a deregistration with its RegID to every store, "
            "then no data",
      section="RPP Deregistration",
      requirement="You can deregister either sources or receivers using deregistration APIs "
                  "(lbm_src_ume_deregistration() ...). UM deletes the state of deregistered "
                  "objects ... The source is blocked after deregistering.",
      timeout=15.0)
def deregisters_from_every_store(h: CaseContext) -> None:
    """Two stores grant the source (each its own RegID); once data flows the harness asks the
    IUT to deregister (the profile's ``deregister_signal``).  Each store must get a source
    PREG with the D flag and the RegID it granted, and no data message may follow the
    deregistration at either store."""
    a, b = h.store(), h.store()
    h.start_iut(a, b, options=FAST_REGISTRATION)
    _wait_data(h, a, "registration with both stores")
    granted = {store: {reg_id for _when, reg_id in store.snapshot_granted()} for store in (a, b)}
    h.deregister_iut()

    def deregistrations(store: HarnessStore) -> list[Header]:
        return [p for p in (_preg(s.message) for s in store.source_pregs()) if p.d_flag]

    h.wait_until(lambda: bool(deregistrations(a) and deregistrations(b)), 4.0,
                 "a deregistration at each store")
    for store in (a, b):
        seen = deregistrations(store)
        h.check(bool(seen), f"the source did not deregister from {store.name}",
                expected="a source PREG with the D flag", observed="none")
        h.check(seen[0].reg_id in granted[store],
                f"the deregistration sent to {store.name} names another RegID",
                expected=f"one of {sorted(granted[store])}", observed=seen[0].reg_id)
    cut = {store: len(store.data_sqns()) for store in (a, b)}
    h.wait_until(lambda: False, 0.5, "data after the deregistration, if any")
    for store in (a, b):
        late = store.data_sqns()[cut[store]:]
        h.check(not late, f"the source kept sending to {store.name} after deregistering",
                expected="no data message", observed=f"sequence numbers {late[:10]}")


@case("SRC-REC-001", suite=SUITE_REC, role=Role.SOURCE,
      title="Unstable messages are retained and proactively retransmitted; stable ones are not",
      section="Source Message Retention and Release",
      requirement="Sources retain all messages until notified by the active store(s) that they "
                  "are stable; a message not stable within ume_message_stability_timeout is "
                  "re-sent to the store (proactive retransmission).",
      timeout=15.0)
def retains_until_stable(h: CaseContext) -> None:
    """The store acknowledges only even sequence numbers.  With a stability timeout of 500 ms,
    every odd message must come back as a proactive retransmission with its original payload,
    and no even one."""
    store = h.store()
    store.ack = lambda sqn: sqn % 2 == 0
    h.start_iut(store, options={**FAST_REGISTRATION,
                                "source ume_message_stability_timeout": 500,
                                "source ume_store_check_interval": 100})
    _wait_data(h, store, "the first messages")
    h.wait_until(lambda: False, 1.5, "proactive retransmissions")
    sent = {s.message.sqn: bytes(s.message.payload or b"") for s in store.snapshot(store.data)}
    resent = store.snapshot(store.prorx)
    old_enough = [s.message.sqn for s in store.snapshot(store.data)
                  if time.monotonic() - s.at > h.scaled(1.2)]
    resent_sqns = {s.message.sqn for s in resent}
    stable_resent = sorted(sqn for sqn in resent_sqns if sqn % 2 == 0)
    h.check(not stable_resent, "the source retransmitted messages the store acknowledged",
            expected="no proactive retransmission of a stable message",
            observed=stable_resent[:10])
    missing = sorted(sqn for sqn in old_enough if sqn % 2 and sqn not in resent_sqns)
    h.check(bool(old_enough) and not missing,
            "unstable messages were not retransmitted after the stability timeout",
            expected="every odd (unacknowledged) message older than 1.2 s retransmitted",
            observed=f"not retransmitted: {missing[:10]}")
    wrong = [s.message.sqn for s in resent
             if s.message.sqn in sent and bytes(s.message.payload or b"") != sent[s.message.sqn]]
    h.check(not wrong, "a retransmission carries another payload than the original",
            expected="the original payloads", observed=wrong[:10])


@case("SRC-REC-002", suite=SUITE_REC, role=Role.SOURCE,
      title="With ume_flight_size N and behaviour block, at most N messages are unstable",
      section="UMP Flight Size",
      requirement="By default, when a source sends a message that exceeds its flight size, the "
                  "call to send blocks ... until the first message stabilizes; a message is in "
                  "flight until the source receives the configured stability acknowledgements.",
      timeout=15.0)
def flight_size_blocks(h: CaseContext) -> None:
    """Flight size 4, no stability ACK: exactly sequence numbers 0..3 may be sent; after the
    store acknowledges 0 and 1, exactly 4 and 5 may follow."""
    store = h.store()
    store.ack = False
    h.start_iut(store, options={**FAST_REGISTRATION, "source ume_flight_size": 4,
                                "source ume_flight_size_behavior": "block"})
    _wait_data(h, store, "the first messages")
    h.wait_until(lambda: len(store.data_sqns()) > 4, 1.0, "a fifth message (must not come)")
    h.check_equal(sorted(store.data_sqns()), [0, 1, 2, 3],
                  "the messages sent with flight size 4 and no stability ACK")
    store.send_stable(0, 1)
    h.wait_until(lambda: len(store.data_sqns()) >= 6, 2.0, "two more messages")
    h.wait_until(lambda: len(store.data_sqns()) > 6, 0.6, "a seventh message (must not come)")
    h.check_equal(sorted(store.data_sqns()), list(range(6)),
                  "the messages sent after two of them became stable")
