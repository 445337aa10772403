"""Robustness suite for source and receiver IUTs: malformed and hostile input from the peers
the harness plays must not crash or corrupt the IUT.

Each case sends something wrong from a place the IUT has to listen to (its stores, the source
it receives, a stranger on its own ports or on the resolver) and then proves that the IUT still
works: a source registers and sends data, a receiver registers and delivers every message
once and in order.  The runner also fails any case during which the IUT process exits.

Two kinds of bad input are used on TCP, on purpose:

* a *malformed message*: LBT-TCP framing intact (``msglen`` right), but an LBMC header with an
  impossible ``hdr_len``; a peer can skip it and carry on with the same connection;
* *garbage*: random bytes whose first ``msglen`` is below the 4-byte minimum, so the stream
  cannot be framed any further and a peer has to close the connection.  (Random bytes with a
  plausible ``msglen`` would only stall the stream until more bytes come, which proves nothing
  about robustness and leaves the verdict to chance.)

In the evidence pcaps both are reported as ``malformed`` frames, which the tshark cross-check
leaves aside (it compares frames that decode as UM); every other frame must still agree.
"""

from __future__ import annotations

from collections.abc import Callable

from scapy.packet import Packet, raw

from conformance.context import CaseContext
from conformance.model import Role, case
from conformance.net import NoAnswer, TcpLink, connect
from conformance.packets import (
    LBMC,
    LBMC_Sri,
    LBMC_TopicIdx,
    LBMC_UmePregResp,
    LBMC_UmeStoreExt,
    LBMC_UmeStoreGroup,
)
from conformance.peers import HarnessSource
from conformance.store_peer import HarnessStore, Seen
from wire.lbmc import LbmcMessage, MessageType, UmePreg, UmeStoreExt

SUITE = "robustness"

FAST_REGISTRATION = {"source ume_registration_interval": 1000}
"""A registration round short enough for a case (the default is 3 s)."""

ROBUSTNESS = ("A persistent application must survive malformed input from the network: bad "
              "input is dropped, never delivered or acted upon, and the application keeps "
              "serving its peers (issue 5: malformed and hostile packets must not crash or "
              "corrupt the IUT).")


# --- hostile input ------------------------------------------------------------------------------


def garbage(h: CaseContext, size: int = 60) -> bytes:
    """Random bytes (from the case's seeded generator) that cannot be framed as LBT-TCP: they
    start with an LBMC base header whose ``msglen`` (2) is below the minimum."""
    head = raw(LBMC(ver_type=int(MessageType.CONTROL), next_hdr=h.random.randrange(256),
                    msglen=2))
    return head + h.random.randbytes(size)


def bad_preg_resp(store: HarnessStore, seen: Seen) -> Packet:
    """The PREG_RESP ``store`` would grant ``seen``'s PREG with, but with a header length
    (7) shorter than any LBMC header: the message frames, its headers do not decode."""
    preg = seen.message.header(UmePreg)
    assert preg is not None
    pkt = store.packet_preg_resp(preg, reg_id=preg.reg_id or 4242, low=0, high=0)
    pkt[LBMC_UmePregResp].hdr_len = 7
    return pkt


def _nth_preg(h: CaseContext, get: Callable[[], list[Seen]], count: int, what: str,
              timeout: float = 4.0) -> Seen:
    """The ``count``-th PREG ``get`` returns (waits for it)."""
    h.wait_until(lambda: len(get()) >= count, timeout, what)
    pregs = get()
    h.check(len(pregs) >= count, f"the IUT stopped registering: {what} never came",
            expected=f"{count} PREG(s) (registration is retried every interval)",
            observed=f"{len(pregs)} PREG(s)")
    return pregs[count - 1]


def _answer_badly_then_grant(h: CaseContext, store: HarnessStore,
                             get: Callable[[], list[Seen]]) -> None:
    """``store`` (answering nothing) meets the IUT's first PREG with garbage and its next one
    with a malformed PREG_RESP; then it grants the next as usual."""
    first = _nth_preg(h, get, 1, "the first PREG")
    h.note(f"{store.name}: answering the first PREG with garbage")
    _send(first.link, garbage(h))
    second = _nth_preg(h, get, 2, "a PREG after the garbage", timeout=5.0)
    h.note(f"{store.name}: answering the next PREG with a PREG_RESP with hdr_len 7")
    _send(second.link, bad_preg_resp(store, second))
    store.answer = True


def _send(link: TcpLink, item: Packet | bytes) -> None:
    """Send, accepting that the IUT may close the link at once (that is its right)."""
    try:
        link.send(item)
    except NoAnswer as exc:
        link.recorder.note(str(exc))


def resolver_addrs(h: CaseContext) -> set[tuple[str, int]]:
    """Where the IUT speaks topic resolution from in this case (it advertised or queried the
    case's topic from there)."""
    addrs: set[tuple[str, int]] = set()
    for dgram in list(h.resolver.port.received):
        packet = dgram.packet
        if packet is None:
            continue
        names = [getattr(r, "name", None) for r in [*packet.tirs, *packet.tqrs]]
        if h.iut_topic in names:
            addrs.add(dgram.addr)
    return addrs


def lbmr_garbage(h: CaseContext) -> list[bytes]:
    """Datagrams a resolver socket may get from a stranger: random bytes of several sizes
    (too short for an LBMR header, about one, and long)."""
    return [h.random.randbytes(size) for size in (1, 7, 24, 300)]


# --- source IUT ---------------------------------------------------------------------------------


def _sri_stores(message: LbmcMessage) -> list[tuple[str, int]]:
    """The store addresses an SRI names, in its order."""
    return [(e.store_ip_addr, e.store_tcp_port) for e in message.headers
            if isinstance(e, UmeStoreExt)]


def _source_data(h: CaseContext, store: HarnessStore, what: str, timeout: float = 4.0) -> None:
    h.wait_until(lambda: bool(store.data_sqns()), timeout, what)
    h.check(bool(store.data_sqns()), f"{what}: the source sent no data after the bad input",
            expected="data on the transport once registration completes",
            observed=f"{len(store.source_pregs())} PREG(s), {len(store.granted)} granted, "
                     f"no data")


@case("SRC-ROB-001", suite=SUITE, role=Role.SOURCE,
      title="Garbage and a malformed PREG_RESP from a store do not count as registration, and "
            "the source registers once the store answers properly",
      section="Source Registration",
      requirement="Sources unicast registrations to the store. The store unicasts responses "
                  "back to the sources ... After registration sources may send data. "
                  + ROBUSTNESS,
      timeout=15.0)
def source_survives_bad_preg_answers(h: CaseContext) -> None:
    """The only store answers the source's first PREG with unframeable garbage and the next
    one with a PREG_RESP whose header length is 7.  Neither is a registration: a receiver on
    the transport must see no data until the store grants the third PREG; after that grant,
    data must flow to the store."""
    store = h.store()
    store.answer = False
    h.start_iut(store, options=FAST_REGISTRATION)
    tap = h.tap()
    _answer_badly_then_grant(h, store, store.source_pregs)
    h.check(not tap.data_sqns(), "the source sent data before any store granted it",
            expected="no data before a valid PREG_RESP", observed=tap.data_sqns()[:10])
    h.wait_until(lambda: bool(store.granted), 4.0, "a PREG the store can grant")
    h.check(bool(store.granted), "the source did not register again after the bad answers",
            expected="a third PREG, granted", observed=f"{len(store.source_pregs())} PREG(s)")
    _source_data(h, store, "data after the valid grant")


@case("SRC-ROB-002", suite=SUITE, role=Role.SOURCE,
      title="A refusal with an unknown error code is a refusal: that store is not counted and "
            "not named in the SRI",
      section="Source Registration",
      requirement="Errors go back as an error-coded registration response (the E flag); the "
                  "SRI names the stores with which the source registered. " + ROBUSTNESS,
      timeout=15.0)
def source_unknown_error_code(h: CaseContext) -> None:
    """Three stores in one group (quorum 2): A refuses with error code 13, which no version
    of the guide defines; B and C grant.  The source must keep running, complete with B and C
    (data flows), and its SRI must name B and C but not A."""
    a, b, c = h.store(), h.store(), h.store()
    a.refuse = 13
    h.start_iut(a, b, c, groups=((0, 3),), options={
        **FAST_REGISTRATION, "source ume_retention_intragroup_stability_behavior": "quorum"})
    h.wait_until(lambda: bool(a.source_pregs()), 4.0, "the PREG store A refuses")
    _source_data(h, b, "data with B and C registered")
    tap = h.tap()
    tap.sri_request()
    message = tap.expect_sri(2.0, "an SRI answering the SRI request")
    named = set(_sri_stores(message))
    h.check(named == {b.addr, c.addr}, "the SRI does not name exactly the stores that granted",
            expected=sorted([b.addr, c.addr]), observed=sorted(named))


@case("SRC-ROB-003", suite=SUITE, role=Role.SOURCE,
      title="Stability ACKs for sequence numbers never sent release nothing",
      section="UMP Flight Size",
      requirement="A message is in flight until the source receives the configured stability "
                  "acknowledgements for it; a stability ACK can only be for a message the "
                  "source sent. " + ROBUSTNESS,
      timeout=15.0)
def source_ignores_acks_for_unsent(h: CaseContext) -> None:
    """Flight size 4 (block), no genuine ACK: 0..3 are sent.  The store then acknowledges
    4..7 (not sent yet), 1000 and 2^32-1: the flight stays full, so nothing more may be sent;
    and when genuine ACKs for 0 and 1 free two places, exactly 4 and 5 may follow (an IUT that
    remembered the early ACKs would treat 4 and 5 as stable at once and send 6 and 7 too)."""
    store = h.store()
    store.ack = False
    h.start_iut(store, options={**FAST_REGISTRATION, "source ume_flight_size": 4,
                                "source ume_flight_size_behavior": "block"})
    h.wait_until(lambda: len(store.data_sqns()) >= 4, 4.0, "the first 4 messages")
    h.check_equal(sorted(store.data_sqns()), [0, 1, 2, 3], "the messages in flight")
    store.send_stable(4, 5, 6, 7, 1000, 0xFFFFFFFF)
    h.wait_until(lambda: len(store.data_sqns()) > 4, 0.8, "a fifth message (must not come)")
    h.check_equal(sorted(store.data_sqns()), [0, 1, 2, 3],
                  "the messages sent after ACKs for sequence numbers never sent")
    store.send_stable(0, 1)
    h.wait_until(lambda: len(store.data_sqns()) >= 6, 2.0, "two more messages")
    h.wait_until(lambda: len(store.data_sqns()) > 6, 0.6, "a seventh message (must not come)")
    h.check_equal(sorted(store.data_sqns()), list(range(6)),
                  "the messages sent after genuine ACKs for 0 and 1")


@case("SRC-ROB-004", suite=SUITE, role=Role.SOURCE,
      title="Garbage on the source's transport, request port and resolver path does not stop it",
      section="Source Registration",
      requirement="Source advertises topic over topic resolution transport ... Any receivers "
                  "joining the transport session ... can request an SRI from the source. "
                  + ROBUSTNESS,
      timeout=15.0)
def source_survives_strangers(h: CaseContext) -> None:
    """Once data flows, a receiver on the transport and a stranger on the request port send
    unframeable garbage, and random datagrams reach the source's resolver socket.  The source
    must keep sending to its store without a gap, and serve a new receiver: an SRI request on
    the request port gets an SRI on the transport."""
    store = h.store()
    h.start_iut(store, options={**FAST_REGISTRATION,
                                "source ume_sri_max_number_of_sri_per_update": 1})
    _source_data(h, store, "data before the bad input")
    bad = h.tap("hostile receiver")
    _send(bad.link, garbage(h))
    if bad.request_addr is not None:
        stranger = connect(bad.request_addr, h.recorder, "stranger -> source request port",
                           h.scaled(2.0))
        h.closers.append(stranger.close)
        _send(stranger, garbage(h))
    addrs = resolver_addrs(h)
    h.check(bool(addrs), "the source spoke no topic resolution for its topic",
            expected="a TIR at the harness resolver", observed="none")
    for addr in addrs:
        for item in lbmr_garbage(h):
            h.resolver.port.send(item, addr)
    count = len(store.data_sqns())
    h.wait_until(lambda: len(store.data_sqns()) >= count + 10, 2.0, "10 more messages")
    sqns = store.data_sqns()
    h.check(len(sqns) >= count + 10, "the source stopped sending after the bad input",
            expected="data keeps flowing (50 a second)", observed=f"{len(sqns) - count} more")
    h.check(sqns == list(range(sqns[0], sqns[0] + len(sqns))),
            "the messages to the store have a gap or are out of order",
            expected="consecutive sequence numbers", observed=sqns[:40])
    fresh = h.tap("new receiver")
    fresh.sri_request()
    message = fresh.expect_sri(2.0, "an SRI answering the new receiver's request")
    named = _sri_stores(message)
    h.check_equal(named, [store.addr], "the stores the SRI names after the bad input")


# --- receiver IUT -------------------------------------------------------------------------------


def _receiver_setup(h: CaseContext, *, sri: bool = True) -> tuple[HarnessSource, HarnessStore]:
    store = h.store()
    src = h.source(topic=h.iut_topic, stores=(store,))
    src.answer_sri_requests = sri
    h.start_iut(options={"receiver ume_registration_interval": 500})
    src.transport.expect_link(h.scaled(4.0), "the receiver joining the source's transport")
    return src, store


def _registered(h: CaseContext, store: HarnessStore, timeout: float = 3.0) -> None:
    h.wait_until(lambda: bool(store.granted), timeout, "the receiver's registration")
    h.check(bool(store.granted), "the receiver did not register after the bad input",
            expected=f"a receiver PREG at {store.name}, granted",
            observed=f"{len(store.receiver_pregs())} PREG(s)")


def _live(src: HarnessSource) -> list[TcpLink]:
    return [x for x in src.transport.links if not x.closed]


@case("RCV-ROB-001", suite=SUITE, role=Role.RECEIVER,
      title="A malformed data message and garbage on the transport are dropped; everything is "
            "recovered and delivered once, in order",
      section="UMP Message Loss Recovery",
      requirement="The receiver detects a lost sequence number and requests retransmission "
                  "from the persistent stores; every message is delivered once, in sequence "
                  "order. " + ROBUSTNESS,
      timeout=20.0)
def receiver_drops_malformed_data(h: CaseContext) -> None:
    """Live 0..4; then sqn 5 with an LBMC header of length 3 (the store holds the good 5);
    live 6..9.  Then unframeable garbage on the transport, which the receiver must survive
    (closing that connection and joining again is its right); 10 and 11 are published while
    the transport is broken, 12..14 once the receiver listens again.  The application must
    see 0..14 once and in order, 5 and every message missed as retransmissions, never the
    malformed 5."""
    src, store = _receiver_setup(h)
    src.send_sri()
    _registered(h, store)
    src.publish(*range(5))
    src.publish(5, live=False)
    for link in _live(src):
        link.send(LBMC(ver_type=int(MessageType.MESSAGE), tidx=src.topic_idx, sqn=5)
                  / LBMC_TopicIdx(hdr_len=3, tidx=src.topic_idx) / b"malformed copy of 5")
    src.publish(6, 7, 8, 9)
    h.check_delivered(list(range(10)), retransmitted={5})
    joined = len(src.transport.links)
    for link in _live(src):
        _send(link, garbage(h))
    src.publish(10, 11, live=False)
    h.wait_until(lambda: len(src.transport.links) > joined, 4.0,
                 "the receiver joining the transport again")
    src.publish(12, 13, 14)
    h.check_delivered(list(range(15)), timeout=6.0, retransmitted={5, 10, 11})


@case("RCV-ROB-002", suite=SUITE, role=Role.RECEIVER,
      title="Malformed SRIs are ignored: the receiver registers with the stores a valid SRI "
            "names",
      section="Receiver Registration",
      requirement="Receivers register with a store or stores after receiving a SRI packet "
                  "from the source sending on the receiver's topic. " + ROBUSTNESS,
      timeout=15.0)
def receiver_ignores_malformed_sri(h: CaseContext) -> None:
    """Before any valid SRI, the source sends two malformed ones with version 50, naming a
    store that does not exist: one whose SRI header length is 5, one whose store record's
    header length is 6.  Then a valid SRI with version 1 names the real store.  A receiver
    that took anything from the malformed SRIs would ignore version 1 as older; it must
    register with the real store (with the source's RegID there) and deliver 0..4."""
    src, store = _receiver_setup(h, sri=False)
    bogus = (LBMC_UmeStoreGroup(grp_idx=0, grp_sz=1)
             / LBMC_UmeStoreExt(grp_idx=0, store_tcp_port=9, store_idx=0,
                                store_ip_addr="127.0.0.1", src_reg_id=77, version=1))
    first = LBMC() / LBMC_Sri(hdr_len=5, version=50, initial_sqn_known=1) \
        / LBMC_TopicIdx(tidx=src.topic_idx) / bogus
    second = LBMC() / LBMC_Sri(version=50, initial_sqn_known=1) \
        / LBMC_TopicIdx(tidx=src.topic_idx) / bogus
    second[LBMC_UmeStoreExt].hdr_len = 6
    src.send_sri(first)
    src.send_sri(second)
    src.send_sri(src.sri(version=1))
    _registered(h, store)
    pregs = store.receiver_pregs()
    preg = pregs[0].message.header(UmePreg)
    assert preg is not None
    h.check_equal(preg.src_reg_id, store.source_reg_id,
                  "the source RegID in the receiver's PREG (from the valid SRI)")
    src.publish(*range(5))
    h.check_delivered(list(range(5)))


@case("RCV-ROB-003", suite=SUITE, role=Role.RECEIVER,
      title="Garbage answers to its PREG and unrequested retransmissions from a store do not "
            "corrupt the receiver",
      section="Receiver Registration",
      requirement="Receivers unicast registrations to the store. The store unicasts responses "
                  "back to the receivers ... After registration, receivers may handle recovery. "
                  + ROBUSTNESS,
      timeout=20.0)
def receiver_survives_bad_store(h: CaseContext) -> None:
    """The store answers the receiver's first PREG with unframeable garbage and the next one
    with a PREG_RESP whose header length is 7; it grants the third, with low 3 of the 0..5 it
    holds.  Once 3..5 are delivered it sends retransmissions nobody asked for: 1 (below the
    low sequence number) and 4 (delivered already).  The application must see 3..9 once and in
    order: neither 1 nor a second 4."""
    store = h.store()
    src = h.source(topic=h.iut_topic, stores=(store,))
    src.publish(*range(6), live=False)
    store.receiver_low = 3
    store.answer = False
    src.answer_sri_requests = True
    h.start_iut(options={"receiver ume_registration_interval": 500})
    src.transport.expect_link(h.scaled(4.0), "the receiver joining the source's transport")
    src.send_sri()
    _answer_badly_then_grant(h, store, store.receiver_pregs)
    _registered(h, store)
    h.check_delivered([3, 4, 5], retransmitted={3, 4, 5})
    receiver = store.only_receiver()
    for sqn in (1, 4):
        receiver.link.send(LBMC(ver_type=int(MessageType.RETRANS), tidx=receiver.topic_idx,
                                sqn=sqn) / store.repository[sqn])
    src.publish(6, 7, 8, 9)
    h.check_delivered(list(range(3, 10)), retransmitted={3, 4, 5})
