"""Receiver suites: how a receiver IUT finds and registers with the stores, and how it
recovers what it missed.

The harness plays the resolver daemon (answering the receiver's TQR with the TIR of its
source), the source (:class:`~conformance.peers.HarnessSource`: a transport the receiver joins,
a request port for SRI requests, SRI naming the case's stores) and the stores
(:class:`~conformance.store_peer.HarnessStore`: PREG_RESP with the low/high sequence numbers
the case chooses, retransmissions from their repositories, recorded RXREQs and ACKs).  The
IUT is started by each case; options that decide a verdict are set explicitly.

What the application got is read from the ``{deliveries}`` file of the profile's launch
command (one JSON line per delivered message); a profile without it makes the cases that judge
delivery order ``unsupported``.
"""

from __future__ import annotations

import itertools

from conformance.context import CaseContext
from conformance.model import Role, case
from conformance.peers import HarnessSource
from conformance.store_peer import HarnessStore
from wire.lbmc import SriReq, Topicname, UmeAck, UmePreg, UmeRxreq, UmeSid

SUITE_REG = "registration"
SUITE_REC = "recovery"


def _peers(h: CaseContext, stores: int = 1) -> tuple[HarnessSource, list[HarnessStore]]:
    """Stores, and a source of the IUT's topic registered with them."""
    peers = [h.store() for _ in range(stores)]
    return h.source(topic=h.iut_topic, stores=tuple(peers)), peers


def _start(h: CaseContext, src: HarnessSource, *, sri: bool = True,
           options: dict[str, str | int] | None = None) -> None:
    """Start the receiver; with ``sri`` the source sends its SRI as soon as the receiver
    joins the transport, and answers SRI requests."""
    src.answer_sri_requests = sri
    h.start_iut(options=options)
    src.transport.expect_link(h.scaled(4.0), "the receiver joining the source's transport")
    if sri:
        src.send_sri(src.sri(high=src.high_sent()))


def _setup(h: CaseContext, stores: int = 1, *, sri: bool = True,
           options: dict[str, str | int] | None = None) -> tuple[HarnessSource, list[HarnessStore]]:
    src, peers = _peers(h, stores)
    _start(h, src, sri=sri, options=options)
    return src, peers


def _registered(h: CaseContext, *stores: HarnessStore, timeout: float = 3.0) -> None:
    h.wait_until(lambda: all(s.granted for s in stores), timeout, "the receiver's registrations")
    h.check(all(s.granted for s in stores), "the receiver did not register with every store",
            expected=f"a receiver PREG at {', '.join(s.name for s in stores)}",
            observed={s.name: len(s.receiver_pregs()) for s in stores})


@case("RCV-REG-001", suite=SUITE_REG, role=Role.RECEIVER,
      title="Without SRI, the receiver asks the source for it every ume_sri_request_interval",
      section="Receiver Registration",
      requirement="If source is not sending SRIs, receiver sends SRI request by unicast ... "
                  "Receivers joining the transport session when the source is not sending SRIs "
                  "can request an SRI from the source if they find that the UMP flag is set in "
                  "the source's TIR.",
      timeout=15.0)
def sri_request_without_sri(h: CaseContext) -> None:
    """The source sends no SRI: SRI requests naming its transport and topic indexes must
    come, about 300 ms apart (the interval set); once an SRI arrives they must stop and the
    receiver must register."""
    src, (store,) = _setup(h, sri=False, options={"receiver ume_sri_request_interval": 300,
                                                  "receiver ume_sri_request_maximum": 100})
    h.wait_until(lambda: len(src.sri_requests()) >= 2, 2.0, "two SRI requests")
    requests = src.sri_requests()
    h.check(len(requests) >= 2, "the receiver did not keep asking for SRI",
            expected="an SRI request every 300 ms", observed=f"{len(requests)} request(s)")
    first = requests[0][1].header(SriReq)
    assert first is not None
    h.check_equal((first.transport_idx, first.topic_idx), (src.transport_idx, src.topic_idx),
                  "the transport and topic indexes of the SRI request")
    gap = requests[1][0] - requests[0][0]
    h.check(gap >= h.scaled(0.2), f"SRI requests {gap * 1000:.0f} ms apart",
            expected="about ume_sri_request_interval (300 ms) apart",
            observed=f"{gap * 1000:.0f} ms")
    src.send_sri(src.sri())
    _registered(h, store)
    asked = len(src.sri_requests())
    h.wait_until(lambda: len(src.sri_requests()) > asked, 0.8, "SRI requests (must stop)")
    h.check(len(src.sri_requests()) == asked, "the receiver asked for SRI after it got one",
            expected=f"{asked} SRI requests", observed=len(src.sri_requests()))


@case("RCV-REG-002", suite=SUITE_REG, role=Role.RECEIVER,
      title="The receiver registers with every store the SRI names, with the source's RegID there",
      section="Receiver Registration",
      requirement="Receivers register with a store or stores after receiving a SRI packet ... "
                  "for each store in the SRI the receiver unicasts a registration carrying the "
                  "source's RegID for that store.")
def registers_with_sri_stores(h: CaseContext) -> None:
    src, stores = _setup(h, stores=2)
    _registered(h, *stores)
    for store in stores:
        message = store.receiver_pregs()[0].message
        preg = message.header(UmePreg)
        assert preg is not None
        topic = message.header(Topicname)
        h.check(topic is not None and topic.topic == src.topic,
                f"the PREG to {store.name} does not name the topic",
                expected=src.topic, observed=getattr(topic, "topic", None))
        h.check_equal(preg.src_reg_id, store.source_reg_id,
                      f"the source RegID in the PREG to {store.name}")
        h.check_equal((preg.transport_idx, preg.topic_idx), (src.transport_idx, src.topic_idx),
                      f"the transport and topic indexes in the PREG to {store.name}")
        h.check_equal(preg.reg_id, 0, f"the RegID a new receiver asks {store.name} for")


@case("RCV-REG-003", suite=SUITE_REG, role=Role.RECEIVER,
      title="A receiver with a Session ID sends it in its PREG and asks for RegID 0",
      section="How Stores Associate Session IDs and RegIDs",
      requirement="When a store receives a registration request from a source or receiver "
                  "with a particular Session ID, it checks to see if it already has a source "
                  "or receiver for that topic/Session ID: the receiver sends its Session ID "
                  "and lets the store find its RegID.")
def receiver_session_id(h: CaseContext) -> None:
    sid = h.random.randrange(1, 1 << 48)
    _, (store,) = _setup(h, options={"receiver ume_session_id": sid})
    _registered(h, store)
    message = store.receiver_pregs()[0].message
    header = message.header(UmeSid)
    h.check(header is not None, "the receiver's PREG carries no Session ID",
            expected=f"UME Session ID {sid:#x}", observed=message.label())
    assert header is not None
    h.check_equal(header.sid, sid, "the Session ID in the receiver's PREG")
    preg = message.header(UmePreg)
    assert preg is not None
    h.check_equal(preg.reg_id, 0, "the RegID a Session ID receiver asks for")


@case("RCV-REG-004", suite=SUITE_REG, role=Role.RECEIVER,
      title="The receiver starts at the low sequence number the store answers",
      section="Receiver Recovery",
      requirement="Re-register with the store. Determine the low sequence number. Request "
                  "retransmission of messages starting with the low sequence number.",
      timeout=15.0)
def starts_at_store_low_sqn(h: CaseContext) -> None:
    """The store holds 0..9 and answers low 6: the receiver must ask for nothing below 6 and
    deliver 6..9 (retransmitted), then the live 10 and 11."""
    src, (store,) = _peers(h)
    src.publish(*range(10), live=False)
    store.receiver_low = 6
    _start(h, src)
    _registered(h, store)
    h.wait_until(lambda: {6, 7, 8, 9} <= set(store.rxreq_sqns()), 2.0, "RXREQs for 6..9")
    src.publish(10, 11)
    h.check_delivered(list(range(6, 12)), retransmitted={6, 7, 8, 9})
    below = sorted({sqn for sqn in store.rxreq_sqns() if sqn < 6})
    h.check(not below, "the receiver asked for messages below the low sequence number",
            expected="no RXREQ below 6", observed=below)


@case("RCV-REC-001", suite=SUITE_REC, role=Role.RECEIVER,
      title="A gap in the live stream is requested from the store and delivered in order",
      section="UMP Message Loss Recovery",
      requirement="Off Transport Recovery: the receiver detects a lost sequence number and "
                  "requests retransmission from the persistent stores; UM unicasts "
                  "retransmissions.",
      timeout=15.0)
def gap_is_recovered(h: CaseContext) -> None:
    """Live 0..4, then 7..9: 5 and 6 (held by the store, never sent live) must be requested
    and everything delivered once, in order, 5 and 6 as retransmissions.  The gap is the
    transport's, so off-transport recovery asks for it (conformance/suites/otr.py): set on,
    with a short initial delay, whatever the IUT's version defaults to."""
    src, (store,) = _setup(h, options={"receiver use_otr": 2,
                                       "receiver otr_request_initial_delay": 200})
    _registered(h, store)
    src.publish(*range(5))
    src.publish(5, 6, live=False)
    src.publish(7, 8, 9)
    h.wait_until(lambda: {5, 6} <= set(store.rxreq_sqns()), 3.0, "RXREQs for 5 and 6")
    h.check({5, 6} <= set(store.rxreq_sqns()), "the receiver did not request the gap",
            expected="RXREQs for 5 and 6", observed=store.rxreq_sqns())
    h.check_delivered(list(range(10)), retransmitted={5, 6})


def _unanswered_requests(h: CaseContext, interval: int, outstanding: int,
                         held: int = 30) -> tuple[HarnessSource, HarnessStore]:
    """A store holding 0..held-1 that does not serve RXREQs yet, a receiver recovering them."""
    src, (store,) = _peers(h)
    src.publish(*range(held), live=False)
    store.serve_rxreq = False
    _start(h, src, options={"receiver retransmit_request_interval": interval,
                            "receiver retransmit_request_outstanding_maximum": outstanding,
                            "receiver retransmit_request_message_timeout": 30000})
    _registered(h, store)
    h.wait_until(lambda: bool(store.rxreqs), 2.0, "the first RXREQ")
    return src, store


@case("RCV-REC-002", suite=SUITE_REC, role=Role.RECEIVER,
      title="No more RXREQs outstanding than retransmit_request_outstanding_maximum",
      section="Controlling Retransmission",
      requirement="A receiver only sends a certain number of retransmission requests at a "
                  "time ... retransmit_request_outstanding_maximum.",
      timeout=15.0)
def outstanding_maximum(h: CaseContext) -> None:
    """30 messages to recover, maximum 4 outstanding, no answer from the store for a second:
    at most 4 different sequence numbers may be requested.  Then the store answers and all 30
    must be delivered in order."""
    _, store = _unanswered_requests(h, interval=400, outstanding=4)
    h.wait_until(lambda: False, 1.0, "a second of unanswered RXREQs")
    asked = sorted(set(store.rxreq_sqns()))
    h.check(0 < len(asked) <= 4,
            f"{len(asked)} different messages requested with an outstanding maximum of 4",
            expected="at most 4 (the lowest missing: 0..3)", observed=asked)
    store.serve_rxreq = True
    h.check_delivered(list(range(30)), timeout=6.0, retransmitted=set(range(30)))


@case("RCV-REC-003", suite=SUITE_REC, role=Role.RECEIVER,
      title="An unanswered RXREQ is repeated after retransmit_request_interval, not sooner",
      section="Controlling Retransmission",
      requirement="The timeout used between requests, if the retransmission does not arrive, "
                  "is totally controllable with retransmit_request_interval.",
      timeout=15.0)
def rerequest_interval(h: CaseContext) -> None:
    """Interval 400 ms, the store silent: the same sequence number must be asked again, and
    never twice within 300 ms (a 25% margin for timer granularity)."""
    _, store = _unanswered_requests(h, interval=400, outstanding=2)
    h.wait_until(lambda: False, 1.3, "re-requests")
    times: dict[int, list[float]] = {}
    for seen in store.snapshot(store.rxreqs):
        header = seen.message.header(UmeRxreq)
        assert header is not None
        times.setdefault(header.seqnum, []).append(seen.at)
    repeated = {sqn: ts for sqn, ts in times.items() if len(ts) >= 2}
    h.check(bool(repeated), "no unanswered RXREQ was repeated within 1.3 s",
            expected="a repeat every 400 ms", observed={k: len(v) for k, v in times.items()})
    gaps = sorted(b - a for ts in times.values() for a, b in itertools.pairwise(ts))
    h.check(gaps[0] >= h.scaled(0.3), "an RXREQ was repeated sooner than the interval",
            expected="repeats at least 300 ms apart (interval 400 ms)",
            observed=f"shortest gap {gaps[0] * 1000:.0f} ms")


@case("RCV-REC-004", suite=SUITE_REC, role=Role.RECEIVER,
      title="A late receiver recovers what the store holds; live messages wait for recovery",
      section="Late Registering Receiver",
      requirement="Live messages arriving during recovery are buffered until recovery is "
                  "complete and then handed to the application: every message once, in "
                  "sequence order.",
      timeout=15.0)
def late_receiver_recovers_in_order(h: CaseContext) -> None:
    """The store holds 0..9 sent before the receiver existed and delays its retransmissions
    until live 10..14 have arrived: the application must still see 0..14 once, in order."""
    src, store = _unanswered_requests(h, interval=300, outstanding=10, held=10)
    src.publish(*range(10, 15))
    h.wait_until(lambda: False, 0.2, "the live messages reaching the receiver")
    h.check(not h.deliveries(), "messages were delivered before the recovery",
            expected="nothing before 0..9 are recovered",
            observed=[d["sqn"] for d in h.deliveries()])
    store.serve_rxreq = True
    h.check_delivered(list(range(15)), timeout=5.0, retransmitted=set(range(10)))


@case("RCV-REC-005", suite=SUITE_REC, role=Role.RECEIVER,
      title="Consumption is acknowledged to every store, with the RegID each store assigned",
      section="Normal Operation",
      requirement="As receivers process and consume messages they unicast acknowledgments to "
                  "the store letting the store know of successful consumption of data.")
def consumption_acks(h: CaseContext) -> None:
    src, stores = _peers(h, 2)
    a, b = stores
    a.assign_reg_id = h.random.randrange(10_000, 1 << 30)
    b.assign_reg_id = a.assign_reg_id + 31
    _start(h, src)
    _registered(h, a, b)
    src.publish(*range(5))
    h.wait_until(lambda: all(s.acked_up_to() == 4 for s in stores), 2.0,
                 "consumption ACKs for 0..4 at both stores")
    for store in stores:
        h.check_equal(store.acked_up_to(), 4, f"the consumption ACKed to {store.name}")
        for seen in store.snapshot(store.acks):
            ack = seen.message.header(UmeAck)
            assert ack is not None
            ids = {ack.id_2, ack.rcv_reg_id} - {0}
            h.check(ids == {store.assign_reg_id},
                    f"an ACK to {store.name} names another receiver RegID",
                    expected=store.assign_reg_id, observed=sorted(ids))
