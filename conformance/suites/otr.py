"""OTR suite: off-transport recovery (guide "Receiver Recovery"; docs/semantics.md §1.9).

Receiver IUT (RCV-OTR-*): the harness plays the source and a store, as in the receiver suites
(:mod:`.receiver`).  The transport "gives up" on a gap the way a real one does after its NAKs
fail: the source's transport carries 0..4 and then 7..9, and only the store holds 5 and 6.  A
receiver with ``use_otr`` must ask the store for them over its connection to the store's
request port (an RXREQ: docs/wire-lbmc.md, "Off-transport recovery"), not before
``otr_request_initial_delay``, again no sooner than ``otr_request_minimum_interval`` while they
do not come, and deliver them in order with the OTR flag (``LBM_MSG_FLAG_OTR``: ``"otr": true``
in the ``{deliveries}`` file); with ``use_otr`` 0 it must not ask.  Every OTR option is set
explicitly, so the verdict does not depend on the IUT's version (``use_otr`` defaults to 2
since UM 6.8, 0 before).  RCV-OTR-004: the source is a streaming one (no stores, its TIR names
only its request port); with ``use_otr`` 1 the receiver must ask the source itself, whose
request port answers from what it sent (the source's retention).  RCV-OTR-005 is that on LBT-RM
(whatever ``--transport`` says): the gap is one the transport really gives up on, the source
answering the receiver's NAK with NCF "Do not retry".

Store IUT (OTR-STORE-*): an OTR request reaches a store as a retransmission request: one for a
message sent after the receiver registered (a gap its transport lost) is served (002); one for a
sequence number the store does not hold, or naming a RegID it does not know, is dropped
without an answer and the store goes on serving the requests it can.  And the store as a
requester (003 and 004): with ``use_otr`` 1 in its ``<lbm-config>`` (the case's
``lbm_options``) a gap its own transport gave up on is asked of the source's request port,
where the harness source answers from what it sent.  *Choice*: a transport that gives a gap up
is LBT-RU or LBT-RM (LBT-TCP never does), so the requester is judged on each by a case of its
own, whatever ``--transport`` says: 003 on LBT-RU, 004 on LBT-RM.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping

from conformance.context import CaseContext
from conformance.lbtrm_peers import LbtrmScriptedSource
from conformance.model import Role, Strength, case
from conformance.net import DEFAULT_PORTS, Listener, TcpLink
from conformance.packets import LBMC
from conformance.peers import HarnessSource
from conformance.store_peer import HarnessStore
from conformance.udp_transport import LBT_RM, group_members
from wire import lbmc, lbtrm
from wire.lbmc import ACK_NAK, AckType, MessageType, UmeAck, UmeRxreq

SUITE = "otr"

PACING = {"receiver otr_request_initial_delay": 300,
          "receiver otr_request_minimum_interval": 300,
          "receiver otr_request_maximum_interval": 1000,
          "receiver retransmit_request_message_timeout": 30000}


def _otr_setup(h: CaseContext, options: Mapping[str, str | int]) -> tuple[HarnessSource,
                                                                          HarnessStore]:
    """A source registered with one harness store, the receiver started with ``options``
    and registered, live 0..4 delivered."""
    store = h.store()
    src = h.source(topic=h.iut_topic, stores=(store,))
    src.answer_sri_requests = True
    h.start_iut(options=dict(options))
    src.transport.expect_link(h.scaled(4.0), "the receiver joining the source's transport")
    src.send_sri(src.sri(high=src.high_sent()))
    h.wait_until(lambda: bool(store.granted), 3.0, "the receiver's registration")
    h.check(bool(store.granted), "the receiver did not register with the store",
            expected="a receiver PREG", observed=len(store.receiver_pregs()))
    src.publish(*range(5))
    h.wait_until(lambda: len(h.deliveries()) >= 5, 3.0, "live 0..4 delivered")
    return src, store


def _gap(src: HarnessSource) -> float:
    """The transport skips 5 and 6 (only the store has them); returns when 7 was sent."""
    src.publish(5, 6, live=False)
    sent = time.monotonic()
    src.publish(7, 8, 9)
    return sent


def _asked_of_source(h: CaseContext, src: HarnessSource, who: str, what: str,
                     sent: float) -> dict[int, list[float]]:
    """When ``who`` (the receiver, the store) asked the harness source's request port for 5 and
    6, which its transport ``what`` (skipped, gave up on) after ``sent``: both must be asked,
    neither before ``otr_request_initial_delay`` (300 ms in :data:`PACING`, checked at 200)."""
    asked: dict[int, list[float]] = {}
    for at, message in src.rxreqs():
        header = message.header(UmeRxreq)
        if header is not None:
            asked.setdefault(header.seqnum, []).append(at)
    h.check({5, 6} <= set(asked), f"the {who} did not ask the source for what its transport "
            f"{what}", expected="RXREQs for 5 and 6 on the source's request port",
            observed=sorted(asked))
    first = min(min(asked[5]), min(asked[6])) - sent
    h.check(first >= h.scaled(0.2), f"the {who} asked before otr_request_initial_delay",
            expected="no request within 300 ms of the gap", observed=f"{first * 1000:.0f} ms")
    h.note(f"first OTR request {first * 1000:.0f} ms after the gap; asked for {sorted(asked)}")
    return asked


def _request_times(store: HarnessStore, sqns: set[int]) -> dict[int, list[float]]:
    times: dict[int, list[float]] = {}
    for seen in store.snapshot(store.rxreqs):
        header = seen.message.header(UmeRxreq)
        if header is not None and header.seqnum in sqns:
            times.setdefault(header.seqnum, []).append(seen.at)
    return times


@case("RCV-OTR-001", suite=SUITE, role=Role.RECEIVER, timeout=20.0,
      title="A gap the transport cannot repair is asked of the store and delivered with the "
            "OTR flag",
      section="Receiver Recovery",
      requirement="Off Transport Recovery (OTR) does not require the receiver to restart if it "
                  "detects a gap in the topic message sequence numbers it has received: when "
                  "the transport gives up, OTR asks the store for the missing sequence "
                  "numbers; recovered messages carry the OTR flag.")
def gap_recovered_with_flag(h: CaseContext) -> None:
    """``use_otr 2`` (persistent receivers): 5 and 6 must be requested from the store and
    0..9 delivered once, in order, 5 and 6 as retransmissions carrying the OTR flag."""
    src, store = _otr_setup(h, {"receiver use_otr": 2, **PACING})
    _gap(src)
    h.wait_until(lambda: {5, 6} <= set(store.rxreq_sqns()), 3.0, "OTR requests for 5 and 6")
    h.check({5, 6} <= set(store.rxreq_sqns()), "the receiver did not ask the store for the "
            "messages its transport skipped", expected="RXREQs for 5 and 6 (OTR)",
            observed=sorted(set(store.rxreq_sqns())))
    h.check_delivered(list(range(10)), retransmitted={5, 6})
    flagged = sorted(int(str(d["sqn"])) for d in h.deliveries() if d.get("otr"))
    h.check(flagged == [5, 6], "the OTR flag of the delivered messages is wrong",
            expected=[5, 6], observed=flagged)


@case("RCV-OTR-002", suite=SUITE, role=Role.RECEIVER, timeout=20.0,
      title="OTR requests wait otr_request_initial_delay and repeat no sooner than "
            "otr_request_minimum_interval",
      section="Receiver Recovery",
      requirement="OTR requests are paced by otr_request_initial_delay (the wait before the "
                  "first request for a gap), otr_request_minimum_interval and "
                  "otr_request_maximum_interval (the wait between repeated requests).")
def pacing(h: CaseContext) -> None:
    """Initial delay 800 ms, intervals 400..800 ms, a store that does not answer for 3 s: the
    first request for 5 or 6 must come no sooner than 600 ms (a 25 % margin) after 7 revealed
    the gap, the requests must be repeated, never twice within 300 ms, and then (the store
    answering) 0..9 delivered."""
    options = {"receiver use_otr": 2, **PACING,
               "receiver otr_request_initial_delay": 800,
               "receiver otr_request_minimum_interval": 400,
               "receiver otr_request_maximum_interval": 800}
    src, store = _otr_setup(h, options)
    store.serve_rxreq = False
    sent = _gap(src)
    h.wait_until(lambda: False, 3.0, "three seconds of unanswered OTR requests")
    times = _request_times(store, {5, 6})
    h.check(bool(times), "the receiver never asked for the gap", expected="OTR requests",
            observed="none")
    first = min(t for ts in times.values() for t in ts) - sent
    h.check(first >= h.scaled(0.6), "the first OTR request came before "
            "otr_request_initial_delay", expected="no request within 800 ms of the gap",
            observed=f"{first * 1000:.0f} ms")
    repeats = {sqn: ts for sqn, ts in times.items() if len(ts) >= 2}
    h.check(bool(repeats), "an unanswered OTR request was not repeated",
            expected="a repeat within 3 s", observed={k: len(v) for k, v in times.items()})
    gaps = sorted(b - a for ts in times.values() for a, b in itertools.pairwise(ts))
    h.check(gaps[0] >= h.scaled(0.3), "an OTR request was repeated sooner than "
            "otr_request_minimum_interval", expected="repeats at least 400 ms apart",
            observed=f"shortest {gaps[0] * 1000:.0f} ms")
    h.note(f"first request after {first * 1000:.0f} ms, repeats "
           f"{', '.join(f'{g * 1000:.0f}' for g in gaps)} ms apart")
    store.serve_rxreq = True
    h.check_delivered(list(range(10)), timeout=5.0, retransmitted={5, 6})


@case("RCV-OTR-003", suite=SUITE, role=Role.RECEIVER, timeout=20.0,
      strength=Strength.SHOULD,
      title="With use_otr 0 the receiver does not ask the store for a gap of the transport",
      section="Receiver Recovery",
      requirement="Normal loss retransmission over the UM transport operates identically in "
                  "UMP; stores do not participate in transport-level loss retransmission. "
                  "use_otr 0 turns off-transport recovery off.")
def no_otr_when_off(h: CaseContext) -> None:
    """``use_otr 0``: nothing may be asked for 5 and 6 within 2 s, and delivery must go on
    with 7..9 (the loss reported, not waited on forever)."""
    src, store = _otr_setup(h, {"receiver use_otr": 0, **PACING})
    _gap(src)
    h.wait_until(lambda: len(h.deliveries()) >= 8, 4.0, "7..9 delivered")
    h.wait_until(lambda: False, 1.0, "OTR requests (must not come)")
    asked = sorted({s for s in store.rxreq_sqns() if s in (5, 6)})
    h.check(not asked, "the receiver asked the store for a transport gap with use_otr 0",
            expected="no RXREQ for 5 or 6", observed=asked)
    got = [int(str(d["sqn"])) for d in h.deliveries()]
    h.check(got == [0, 1, 2, 3, 4, 7, 8, 9], "delivery did not go on past the lost messages",
            expected=[0, 1, 2, 3, 4, 7, 8, 9], observed=got)


@case("RCV-OTR-004", suite=SUITE, role=Role.RECEIVER, timeout=20.0,
      title="With use_otr 1 a gap of a streaming source's transport is asked of the source and "
            "delivered with the OTR flag",
      section="Receiver Recovery",
      requirement="When the transport gives up, OTR asks the store (persistent sources) or the "
                  "source's retention (streaming sources) for the missing topic sequence "
                  "numbers, without restarting the receiver; use_otr 1 turns OTR on for every "
                  "source, 2 for persistent ones only; recovered messages carry the OTR flag.")
def streaming_gap_from_source(h: CaseContext) -> None:
    """A streaming source (no stores: its TIR carries no UME option and names its request
    port in the EXFUNC option) sends 0..4, its transport skips 5 and 6, then 7..9.  The
    receiver (``use_otr 1``, initial delay 300 ms) must ask the source's request port for 5
    and 6 (RXREQs), no sooner than 200 ms after 7 revealed the gap, and deliver 0..9 once, in
    order, 5 and 6 as retransmissions with the OTR flag."""
    store = h.store()  # (the harness source needs one; a streaming TIR does not name it)
    src = h.source(topic=h.iut_topic, stores=(store,))
    src.streaming = True
    src.answer_rxreqs = True
    h.start_iut(options={"receiver use_otr": 1, **PACING})
    src.transport.expect_link(h.scaled(4.0), "the receiver joining the source's transport")
    src.publish(*range(5))
    h.wait_until(lambda: len(h.deliveries()) >= 5, 3.0, "live 0..4 delivered")
    sent = _gap(src)
    h.wait_until(lambda: len(h.deliveries()) >= 10, 4.0, "0..9 delivered")
    _asked_of_source(h, src, "receiver", "skipped", sent)
    h.check(not store.rxreq_sqns(), "the receiver asked a store of a streaming source",
            expected="no RXREQ at the store", observed=sorted(store.rxreq_sqns()))
    h.check_delivered(list(range(10)), retransmitted={5, 6})
    flagged = sorted(int(str(d["sqn"])) for d in h.deliveries() if d.get("otr"))
    h.check(flagged == [5, 6], "the OTR flag of the delivered messages is wrong",
            expected=[5, 6], observed=flagged)


@case("RCV-OTR-005", suite=SUITE, role=Role.RECEIVER, transport=LBT_RM, timeout=20.0,
      title="With use_otr 1 a number an LBT-RM source will not retransmit is asked of the "
            "source's request port",
      section="Receiver Recovery",
      requirement="Transport loss recovery (NAKs to the source) works as without persistence; "
                  "when the transport gives up on a gap (an NCF 'Do not retry': the number "
                  "left the source's transmission window), OTR asks the source's retention "
                  "(streaming) for it, without restarting the receiver, and delivers it with "
                  "the OTR flag.")
def lbtrm_gap_from_source(h: CaseContext) -> None:
    """A streaming LBT-RM source (its TIR names its request port in the EXFUNC option) sends
    DATA 0..2 and 4; the receiver NAKs 3 and the source answers NCF 'Do not retry', so its
    transport gives 3 up.  With ``use_otr 1`` (initial delay 300 ms) the receiver must ask the
    request port for 3 (an RXREQ), no sooner than 200 ms after the NCF, and deliver 0..4 once,
    in order, 3 as a retransmission with the OTR flag."""
    src = LbtrmScriptedSource(h.iut_topic, h.recorder)
    h.closers.append(src.close)
    asked: list[tuple[float, int]] = []

    def on_request(link: TcpLink, message: lbmc.LbmcMessage) -> None:
        rxreq = message.header(UmeRxreq)
        if rxreq is not None:  # answered from the source's retention
            asked.append((time.monotonic(), rxreq.seqnum))
            link.send(LBMC(ver_type=int(MessageType.RETRANS), tidx=src.topic_idx,
                           sqn=rxreq.seqnum) / f"{src.topic} #{rxreq.seqnum}".encode())
    request = Listener("127.0.0.1", h.recorder, "LBT-RM source request port",
                       on_message=on_request,  # tshark's request ports, so RXREQs decode
                       ports=DEFAULT_PORTS.rotated(DEFAULT_PORTS.request))
    h.closers.append(request.close)
    src.request = request.addr
    h.resolver.serve(src)
    before = group_members(src.group[0]) or 0
    h.start_iut(options={"receiver use_otr": 1, **PACING,
                         "receiver transport_lbtrm_nak_initial_backoff_interval": 50,
                         "receiver transport_lbtrm_nak_backoff_interval": 200})
    joined = h.wait_until(lambda: (group_members(src.group[0]) or 0) > before, 6.0,
                          "the receiver joining the group")
    h.check(joined, "the receiver did not join the source's LBT-RM group",
            expected=f"a membership of {src.group[0]} on loopback", observed="none")
    for sqn in (0, 1, 2, 4):
        src.data(sqn)
        time.sleep(0.005)
    h.check(src.wait(lambda: bool(src.naks_of(3)), h.scaled(2.0)),
            "the receiver never NAKed 3", expected="a NAK for 3", observed=src.naks())
    ncf = src.ncf(lbtrm.NcfReason.NO_RETRY, 3)
    h.note("NCF 'Do not retry' for 3")
    deadline = ncf + h.scaled(3.0)
    while time.monotonic() < deadline and len(h.deliveries()) < 5:
        src.sm(4)  # the session stays alive while OTR runs
        time.sleep(0.1)
    first = [t for t, sqn in asked if sqn == 3]
    h.check(bool(first), "the receiver did not ask the source's request port for what its "
            "transport gave up on", expected="an RXREQ for 3 on the request port",
            observed=sorted({sqn for _, sqn in asked}))
    delay = first[0] - ncf
    h.check(delay >= h.scaled(0.2), "the receiver asked before otr_request_initial_delay",
            expected="no request within 300 ms of the NCF", observed=f"{delay * 1000:.0f} ms")
    h.note(f"first OTR request {delay * 1000:.0f} ms after the NCF")
    h.check_delivered(list(range(5)), retransmitted={3})
    flagged = sorted(int(str(d["sqn"])) for d in h.deliveries() if d.get("otr"))
    h.check(flagged == [3], "the OTR flag of the delivered messages is wrong",
            expected=[3], observed=flagged)


@case("OTR-STORE-001", suite=SUITE, role=Role.STORE, timeout=15.0,
      title="An OTR request for a number the store does not hold, or for an unknown RegID, is "
            "dropped; the store goes on serving",
      section="Receiver Recovery",
      requirement="Receivers request missed messages from the store, which retransmits them "
                  "if it has them; a request the store cannot serve gets no answer and "
                  "changes nothing.",
      topic_options={"receiver-new-registration-rollback": 2147483647})
def out_of_range_requests_dropped(h: CaseContext) -> None:
    """Source with 0..9 stable, a registered receiver: requests for 50 and 2**31 + 7 (never
    sent) get nothing back within a second, nor does one naming a RegID the store never gave;
    a request for 3 then still gets 3, as a retransmission."""
    src = h.source()
    h.check(not src.register(reg_id=0).e_flag, "the store refused the source")
    src.send(*range(10))
    src.expect_stable(9)
    rcv = h.receiver(src)
    h.check(not rcv.register(reg_id=0).e_flag, "the store refused the receiver")
    link = rcv.connect()
    for sqn in (50, 2**31 + 7):
        rcv.rxreq(sqn)
    own = rcv.reg_id
    rcv.reg_id = (own + 7919) & 0xFFFFFFFF or 1
    rcv.rxreq(4)
    rcv.reg_id = own
    h.wait_until(lambda: False, 1.0, "answers to the bad requests (must not come)")
    answered = sorted(m.sqn for m in link.received if m.is_data_type)
    h.check(not answered, "the store answered a request it could not serve",
            expected="no data for 50, 2**31+7 or an unknown RegID", observed=answered)
    rcv.rxreq(3)
    got = rcv.expect_data(3)
    h.check_equal(got.payload, bytes(src.data(3).payload), "the payload retransmitted for 3")
    h.check(got.type == MessageType.RETRANS, "3 did not come back as a retransmission",
            expected="LBMC type RETRANS", observed=got.label())


@case("OTR-STORE-002", suite=SUITE, role=Role.STORE, timeout=15.0,
      title="A gap in the live stream is served to a receiver registered before it was sent",
      section="Receiver Recovery",
      requirement="When the transport gives up, OTR asks the store for the missing topic "
                  "sequence numbers, without restarting the receiver: the store retransmits "
                  "what it received after the receiver registered.",
      topic_options={"receiver-new-registration-rollback": 0})
def live_gap_served(h: CaseContext) -> None:
    """A source with 0..4 stable; a new receiver registers (rollback 0: it starts at the next
    message, 5); the source sends 5..19.  OTR requests for 7, 12 and 19 (messages its
    transport lost) must each get the message back as a retransmission."""
    src = h.source()
    h.check(not src.register(reg_id=0).e_flag, "the store refused the source")
    src.send(*range(5))
    src.expect_stable(4)
    rcv = h.receiver(src)
    resp = rcv.register(reg_id=0)
    h.check(not resp.e_flag, "the store refused the receiver")
    src.send(*range(5, 20))
    src.expect_stable(19)
    for sqn in (7, 12, 19):
        rcv.rxreq(sqn)
        got = rcv.expect_data(sqn)
        h.check_equal(got.payload, bytes(src.data(sqn).payload),
                      f"the payload retransmitted for {sqn}")
        h.check(got.type == MessageType.RETRANS, f"{sqn} did not come back as a "
                "retransmission", expected="LBMC type RETRANS", observed=got.label())


STORE_OTR: dict[str, str | int] = {
    "receiver use_otr": 1,
    "receiver otr_request_initial_delay": 300,
    "receiver otr_request_minimum_interval": 300,
    "receiver otr_request_maximum_interval": 1000,
    "receiver retransmit_request_message_timeout": 30000}
"""The store's own OTR (its ``<lbm-config>``): ``use_otr`` 1, since 2 (the default) covers
persistent receivers only and the store is none; short timers so the case is quick."""


def _stable_acks(src: HarnessSource) -> set[int]:
    """The sequence numbers the store acknowledged as stable to ``src``, NAK bit clear."""
    link = src.connect()
    return {h.seqnum for m in list(link.received) for h in m.headers
            if isinstance(h, UmeAck) and h.type == AckType.STABLE and not h.flags & ACK_NAK}


STORE_OTR_REQUIREMENT = (
    "When the transport gives up, OTR asks for the missing topic sequence numbers; use_otr 2 "
    "(the default) covers persistent receivers only, so a store recovers its own transport's "
    "losses by OTR with use_otr 1 in its LBM configuration.")


@case("OTR-STORE-003", suite=SUITE, role=Role.STORE, timeout=20.0, transport="lbt-ru",
      lbm_options=STORE_OTR,
      title="A store with use_otr 1 recovers a gap its transport gave up on from the source",
      section="Receiver Recovery", requirement=STORE_OTR_REQUIREMENT)
def store_recovers_from_source(h: CaseContext) -> None:
    """The store's ``<lbm-config>`` says ``receiver use_otr 1`` (initial delay 300 ms); the
    source, on LBT-RU, sends 0..4, loses 5 and 6 for good (its session no longer holds them:
    the store's NAKs get "do not retry") and sends 7..9.  The store must ask the source's
    request port for 5 and 6 (RXREQs), no sooner than 200 ms after 7 revealed the gap, and
    persist what the source retransmits: it acknowledges 5 and 6 as stable, and a receiver
    that asks for 5 gets it from the store."""
    _store_recovers_from_source(h)


@case("OTR-STORE-004", suite=SUITE, role=Role.STORE, timeout=20.0, transport="lbt-rm",
      lbm_options=STORE_OTR,
      title="A store with use_otr 1 recovers a gap its LBT-RM transport gave up on from the "
            "source",
      section="Receiver Recovery", requirement=STORE_OTR_REQUIREMENT)
def store_recovers_from_source_lbtrm(h: CaseContext) -> None:
    """OTR-STORE-003 on LBT-RM: the source's session no longer holds 5 and 6 (a NAK for them
    gets NCF "do not retry", and the next DATA's trailing edge is past them), so the store's
    transport gives them up; the store must ask the source's request port for them, no sooner
    than 200 ms after 7 revealed the gap, acknowledge them as stable and serve 5 to a
    receiver."""
    _store_recovers_from_source(h)


def _store_recovers_from_source(h: CaseContext) -> None:
    """OTR-STORE-003 and -004 (their docstrings), on the case's transport."""
    src = h.source()
    src.answer_rxreqs = True
    h.check(not src.register(reg_id=0).e_flag, "the store refused the source")
    rcv = h.receiver(src)
    h.check(not rcv.register(reg_id=0).e_flag, "the store refused the receiver")
    src.send(*range(5))
    src.expect_stable(4)
    src.send_lost(5, 6)
    sent = time.monotonic()
    src.send(7, 8, 9)
    src.expect_stable(9)
    h.wait_until(lambda: {5, 6} <= _stable_acks(src), 5.0, "stability ACKs for 5 and 6")
    _asked_of_source(h, src, "store", "gave up on", sent)
    stable = _stable_acks(src)
    h.check({5, 6} <= stable, "the store did not acknowledge what it recovered by OTR",
            expected="stability ACKs for 5 and 6", observed=sorted(stable))
    rcv.connect()
    rcv.rxreq(5)
    got = rcv.expect_data(5)
    h.check_equal(got.payload, bytes(src.data(5).payload), "the payload the store holds for 5")
