"""The proxy suite, store IUT (PXY-STORE-*): proxy sources (guide "Proxy Sources": "How Proxy
Sources Operate", "Proxy Source Elections", "Enabling the Proxy Source Option"; docs/semantics.md
§1.11).

Every case runs the store as a Quorum/Consensus group of two or three instances
(:meth:`~conformance.context.CaseContext.store_group`, the profile's ``instances``).  A scripted
source (:class:`ProxiedSource`) registers with every instance with a Session ID and the
``ume_proxy_src`` header (enable flag: the source's ``ume_proxy_source`` 1), sends ten messages
that every store acknowledges as stable, answers the stores' keepalives while it lives, and then
dies: its connections close and it sends nothing more.

What the harness sees of a proxy source is what a receiver sees (guide: the elected store
"creates a proxy source and sends topic advertisements"): a TIR for the source's topic sent to
the resolver by a store of the group, naming that store in its UME option (store port).  The
harness also asks every instance for the topic (a TQR from the resolver daemon, as lbmrd relays
one) so it learns which stores answer for the topic *now*: exactly one must, once an election
settled.  A late receiver joins the advertised transport, asks for SRI at the advertised request
port and registers with the store the SRI names (the guide: the proxy lets "new receivers join
the source's transport session and request Source Registration Information (SRI) to register
with the store and request retransmissions").

Timing: the topic's ``source-activity-timeout`` is :data:`ACTIVITY_MS` and its
``proxy-election-interval`` :data:`INTERVAL_MS`, so a proxy is due between ``ACTIVITY + 0.5 x
INTERVAL`` and ``ACTIVITY + 1.5 x INTERVAL`` after the source went silent; the harness allows
:data:`SLACK` scaled seconds on top.  The options are in milliseconds and are not scaled by
``--time-scale``; the harness's waits are.
"""

from __future__ import annotations

import threading
import time

from conformance.context import CaseContext
from conformance.iut import StoreUnderTest
from conformance.model import Unsupported, case
from conformance.net import NoAnswer, TcpLink, connect, has
from conformance.peers import HarnessSource
from wire import lbmr
from wire.errors import WireError
from wire.lbmc import (
    AckType,
    LbmcMessage,
    Sri,
    SriReq,
    Topicname,
    UmeAck,
    UmeKeepalive,
    UmePreg,
    UmePregResp,
    UmeProxySrc,
    UmePser,
    UmePsrcElectionToken,
    UmeRxreq,
    UmeSid,
    UmeStoreExt,
)

SUITE = "proxy"
S_OPERATE = "How Proxy Sources Operate"
S_ELECTIONS = "Proxy Source Elections"
S_ENABLE = "Enabling the Proxy Source Option"

ACTIVITY_MS = 1000
"""The topic's ``source-activity-timeout``: the source counts as gone after this silence."""
INTERVAL_MS = 400
"""The topic's ``proxy-election-interval``: each store waits [0.5, 1.5] x this after the
timeout."""
SLACK = 3.0
"""Scaled seconds a proxy may come after its latest due time (process scheduling, claims on the
way)."""
MESSAGES = 10
"""Messages the source sends before it dies (sqn 0 .. 9), stable at every store."""
SESSION_ID = 0x50C5
"""The source's Session ID (a proxy source needs it, or an explicit RegID)."""

TOPIC_OPTIONS: dict[str, str | int] = {
    "source-activity-timeout": ACTIVITY_MS, "source-check-interval": 100,
    "keepalive-interval": 300, "proxy-election-interval": INTERVAL_MS}
ALLOW: dict[str, str | int] = {"allow-proxy-source": 1}

DUE = (ACTIVITY_MS + 1.5 * INTERVAL_MS) / 1000
"""Seconds after the source's death by which a proxy is due (before :data:`SLACK`)."""
SETTLE = 3 * INTERVAL_MS / 1000 + 1.0
"""Seconds an election is given to settle after the first proxy appeared (a second claimant's
claim reaching the first, the loser deleting its proxy)."""


class ProxiedSource:
    """A scripted source asking the group's stores for a proxy source (module docstring).

    It reuses a :class:`~conformance.peers.HarnessSource` for its transport, request port and
    advertisement (the harness resolver answers TQRs for its topic with it), and holds a
    registration connection of its own to every store of the group."""

    def __init__(self, h: CaseContext, members: list[StoreUnderTest], *, topic: str | None = None,
                 name: str = "source") -> None:
        """A source of ``topic`` (default: a fresh one) that registers with ``members``."""
        self.h = h
        self.members = members
        self.name = name
        self.source: HarnessSource = h.source(name, topic=topic)
        self.topic = self.source.topic
        self.links: dict[int, TcpLink] = {}
        self.reg_ids: dict[int, int] = {}
        self.alive = False

    def register(self) -> None:
        """Register with every store (Session ID, ``ume_proxy_src`` enable) and check each
        granted it."""
        src = self.source
        for i, member in enumerate(self.members):
            link = connect(member.addr, self.h.recorder, f"{self.name} -> store {i}",
                           self.h.scaled(2.0), on_message=self._on_message)
            self.links[i] = link
            preg = LbmcMessage(headers=[
                UmePreg(s_flag=1, reg_id=0, transport_idx=src.transport_idx,
                        topic_idx=src.topic_idx, resp_port=src.request.addr[1],
                        resp_ip=src.request.addr[0]),
                Topicname(topic=self.topic), UmeSid(sid=SESSION_ID), UmeProxySrc(enable=1)])
            self.h.note(f"{self.name}: PREG to store {i} ({member.addr[0]}:{member.addr[1]}) "
                        f"with Session ID {SESSION_ID:#x} and ume_proxy_src enable")
            link.send(preg)
            message = link.expect(has(UmePregResp), self.h.scaled(5.0), "PREG_RESP")
            resp = message.header(UmePregResp)
            assert resp is not None
            self.h.check(not resp.e_flag, f"store {i} granted the source's registration",
                         observed=repr(resp))
            self.reg_ids[i] = resp.reg_id
        self.alive = True

    def _on_message(self, link: TcpLink, message: LbmcMessage) -> None:
        """Answer a store's keepalive while alive (a live source that sends nothing must not
        look gone)."""
        if not self.alive or message.header(UmeKeepalive) is None:
            return
        self._keepalive(link)

    def _keepalive(self, link: TcpLink) -> None:
        index = next((i for i, x in self.links.items() if x is link), None)
        if index is None or link.closed:
            return
        src = self.source
        link.send(LbmcMessage(headers=[UmeKeepalive(
            type=2, transport_idx=src.transport_idx, topic_idx=src.topic_idx,
            reg_id=self.reg_ids.get(index, 0))]))

    def publish(self, sqns: range) -> None:
        """Send ``sqns`` on the source's transport (the run's: LBT-TCP, LBT-RU or LBT-RM) once
        every store listens to it; every store must acknowledge the last as stable."""
        src = self.source
        joined = self.h.wait_until(lambda: src.listeners() >= len(self.members)
                                   or src.listeners() < 0, 5.0,
                                   "every store joining the source's transport")
        self.h.check(joined, "every store of the group joined the source's transport",
                     observed=src.listeners())
        src.send(*sqns)
        last = sqns[-1]
        for i, link in self.links.items():
            link.expect(lambda m: any(isinstance(x, UmeAck) and x.type == AckType.STABLE
                                      and x.seqnum >= last for x in m.headers),
                        self.h.scaled(5.0), f"store {i}'s stability ACK for sqn {last}")

    def touch(self) -> None:
        """A keepalive to every store now (the last activity before a death is now)."""
        for link in list(self.links.values()):
            try:
                self._keepalive(link)
            except NoAnswer:
                continue

    def die(self) -> float:
        """The source fails: every connection closes and it sends nothing more.  The time of
        its last activity."""
        self.touch()
        at = time.monotonic()
        self.alive = False
        for link in self.links.values():
            link.close()
        self.source.close()
        if self.source.udp is not None:  # its LBT-RU/LBT-RM session ends with it
            self.source.udp.close()
        self.h.note(f"{self.name} died (its connections closed)")
        return at


# --- what the harness sees of proxies -----------------------------------------------------------


def proxy_tirs(h: CaseContext, topic: str, since: float = 0.0) -> list[tuple[float, int]]:
    """(monotonic time, store port) of every TIR for ``topic`` a store sent since ``since``
    (the store port from the TIR's UME option: the store the advertisement names)."""
    offset = time.monotonic() - time.time()  # recorder times are wall-clock
    out = []
    for entry in h.recorder.snapshot():
        if entry.kind != "udp" or not entry.from_iut or entry.at + offset < since:
            continue
        try:
            packet = lbmr.LbmrPacket.parse(entry.data)
        except (WireError, ValueError):
            continue
        for tir in packet.tirs:
            if not isinstance(tir, lbmr.Tir) or tir.name != topic:
                continue
            ume = next((o for o in tir.options or [] if isinstance(o, lbmr.ToptUme)), None)
            if ume is not None:
                out.append((entry.at + offset, ume.store_tcp_port))
    return out


def store_lbmr_addrs(h: CaseContext) -> set[tuple[str, int]]:
    """Where the case's store instances send topic resolution from (where a TQR reaches
    them): the senders of what reached the resolver (not the stores' LBT-RU/LBT-RM sockets)."""
    resolver = h.resolver.port.addr
    return {e.src for e in h.recorder.snapshot()
            if e.kind == "udp" and e.from_iut and e.src is not None and e.dst == resolver}


def answering(h: CaseContext, topic: str, wait: float = 1.0) -> set[int]:
    """The store ports of the stores that answer a TQR for ``topic`` now (asked twice, as
    lbmrd would relay a receiver's queries)."""
    asked = time.monotonic()
    addrs = store_lbmr_addrs(h)
    h.check(bool(addrs), "the stores' topic resolution addresses are known (they queried the "
            "resolver)", expected="at least one store address", observed="none")
    for _ in range(2):
        for addr in addrs:
            h.resolver.port.send(lbmr.LbmrPacket(tqrs=[lbmr.Tqr(name=topic)]), addr)
        time.sleep(h.scaled(wait) / 2)
    ports = {port for _, port in proxy_tirs(h, topic, asked)}
    h.note(f"stores answering a TQR for {topic!r}: {sorted(ports) or 'none'}")
    return ports


def wait_proxy(h: CaseContext, topic: str, since: float, timeout: float,
               exclude: frozenset[int] = frozenset()) -> tuple[float, int] | None:
    """The first proxy TIR for ``topic`` since ``since`` from a store not in ``exclude``,
    waiting up to ``timeout`` (scaled) seconds."""
    def first() -> tuple[float, int] | None:
        return next((t for t in proxy_tirs(h, topic, since) if t[1] not in exclude), None)
    h.wait_until(lambda: first() is not None, timeout, "a proxy source's advertisement")
    return first()


def _group(h: CaseContext, size: int) -> tuple[list[StoreUnderTest], ProxiedSource]:
    members = h.store_group(size)
    src = ProxiedSource(h, members)
    src.register()
    src.publish(range(MESSAGES))
    return members, src


def _elected(h: CaseContext, src: ProxiedSource) -> tuple[float, float, int]:
    """Kill the source and wait for the proxy: (death, proxy's first TIR, its store port)."""
    died = src.die()
    found = wait_proxy(h, src.topic, died, DUE + SLACK)
    h.check(found is not None, "a store of the group advertised a proxy source for the topic "
            "after the source's activity timeout",
            expected=f"a TIR naming a store within {DUE:.1f} s (+ slack) of the source's death",
            observed="no store advertised the topic")
    assert found is not None
    h.note(f"proxy advertised by the store on port {found[1]} "
           f"{found[0] - died:.2f} s after the source died")
    return died, found[0], found[1]


# --- cases ------------------------------------------------------------------------------------


@case("PXY-STORE-001", title="A proxy source is elected after the source's activity timeout, "
      "not while the source lives", suite=SUITE, section=S_OPERATE,
      requirement="The source fails. The source's ume_activity_timeout or the store's "
      "source-activity-timeout expires. The Quorum/Consensus stores elect a single store to "
      "run the proxy source. The elected store creates a proxy source and sends topic "
      "advertisements.", store_options=ALLOW, topic_options=TOPIC_OPTIONS, timeout=45.0)
def elected_after_timeout(h: CaseContext) -> None:
    """Three stores; the source lives (answering keepalives, sending nothing) for two activity
    timeouts: no store advertises its topic.  Then it dies: a store advertises a proxy, no
    sooner than the activity timeout after the source's last activity and by the latest due
    time (timeout + 1.5 x proxy-election-interval, + slack)."""
    _, src = _group(h, 3)
    quiet = time.monotonic()
    live = 2 * ACTIVITY_MS / 1000
    deadline = quiet + h.scaled(live)
    while time.monotonic() < deadline:
        src.touch()
        time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
    early = proxy_tirs(h, src.topic, quiet)
    h.check(not early, "no store created a proxy source while the source was alive",
            expected="no TIR for the topic from a store", observed=early)
    died, at, _ = _elected(h, src)
    h.check(at - died >= ACTIVITY_MS / 1000 - 0.05,
            "the proxy source came after the source's activity timeout",
            expected=f">= {ACTIVITY_MS} ms after the source's last activity",
            observed=f"{(at - died) * 1000:.0f} ms")


@case("PXY-STORE-002", title="Exactly one store of the group keeps a proxy source",
      suite=SUITE, section=S_ELECTIONS,
      requirement="The nature of the random values ensures that only one store within the Q/C "
      "group or configuration of groups keeps its proxy source.",
      store_options=ALLOW, topic_options=TOPIC_OPTIONS, timeout=45.0)
def exactly_one_proxy(h: CaseContext) -> None:
    """Three stores; the source dies; once the first proxy appeared and the election had time
    to settle, the harness asks every instance for the topic: exactly one store answers."""
    _, src = _group(h, 3)
    _elected(h, src)
    time.sleep(h.scaled(SETTLE))
    ports = answering(h, src.topic)
    h.check(len(ports) == 1, "exactly one store answers for the topic as its proxy source",
            expected="one store port", observed=sorted(ports))


@case("PXY-STORE-003", title="A late receiver registers through the proxy source and recovers "
      "the source's messages", suite=SUITE, section="Proxy Sources",
      requirement="The Proxy Source capability allows you to configure stores to automatically "
      "continue sending the source's topic advertisements which allow new receivers to join "
      "the source's transport session and request Source Registration Information (SRI) to "
      "register with the store and request retransmissions.",
      store_options=ALLOW, topic_options=TOPIC_OPTIONS, timeout=45.0)
def late_receiver_recovers(h: CaseContext) -> None:
    """Three stores; the source sent ten stable messages and died; a receiver that starts only
    now finds the proxy's advertisement, joins its transport, asks for SRI at its request port,
    registers with the store the SRI names and gets every message it asks for."""
    _, src = _group(h, 3)
    _elected(h, src)
    time.sleep(h.scaled(SETTLE))
    tir = h.resolver.wait_tir(src.topic, h.scaled(1.0))
    h.check(tir is not None, "the proxy's advertisement reached the resolver")
    assert tir is not None
    sqns = _late_receiver(h, tir)
    h.check(sqns == list(range(MESSAGES)), "the late receiver recovered every message through "
            "the proxy source", expected=list(range(MESSAGES)), observed=sqns)


def _late_receiver(h: CaseContext, tir: lbmr.Tir) -> list[int]:
    """A receiver of ``tir``'s source (module docstring): the sequence numbers it recovered."""
    ume = next((o for o in tir.options or [] if isinstance(o, lbmr.ToptUme)), None)
    h.check(isinstance(tir.info, lbmr.TcpInfo | lbmr.TcpSidInfo) and ume is not None,
            "the proxy advertises an LBT-TCP transport with a UME option",
            observed=repr(tir))
    assert ume is not None and isinstance(tir.info, lbmr.TcpInfo | lbmr.TcpSidInfo)
    transport = connect((tir.info.ip, tir.info.port), h.recorder, "late receiver -> proxy "
                        "transport", h.scaled(2.0))
    request = connect((ume.src_tcp_addr, ume.src_tcp_port), h.recorder,
                      "late receiver -> proxy request port", h.scaled(2.0))
    h.closers += [transport.close, request.close]
    got: list[LbmcMessage] = []
    asked = [0.0]

    def sri_arrived() -> bool:
        got.extend(transport.poll(has(Sri)) + request.poll(has(Sri)))
        # as a receiver does, ask again every ume_sri_request_interval (1000 ms by default)
        # until answered: a request that reached the proxy before it took the transport
        # connection was answered to no one
        if not got and time.monotonic() - asked[0] >= h.scaled(1.0):
            request.send(LbmcMessage(headers=[SriReq(transport_idx=ume.transport_idx,
                                                     topic_idx=tir.index)]))
            asked[0] = time.monotonic()
        return bool(got)
    h.wait_until(sri_arrived, 5.0, "an SRI")
    h.check(bool(got), "the proxy source answered the SRI request with an SRI",
            expected="an SRI on the transport or the request connection", observed="none")
    ext = got[0].header(UmeStoreExt)
    h.check(ext is not None, "the SRI names a store", observed=got[0].label())
    assert ext is not None
    store = (ext.store_ip_addr, ext.store_tcp_port)
    link = connect(store, h.recorder, "late receiver -> store", h.scaled(2.0))
    h.closers.append(link.close)
    link.send(LbmcMessage(headers=[
        UmePreg(s_flag=0, reg_id=0, transport_idx=ume.transport_idx, topic_idx=tir.index,
                src_reg_id=ext.src_reg_id, resp_port=link.local[1], resp_ip=link.local[0]),
        Topicname(topic=tir.name)]))
    message = link.expect(has(UmePregResp), h.scaled(5.0), "the receiver's PREG_RESP")
    resp = message.header(UmePregResp)
    assert resp is not None
    h.check(not resp.e_flag, "the store the SRI names registered the late receiver",
            observed=repr(resp))
    sqns = []
    for sqn in range(MESSAGES):
        link.send(LbmcMessage(headers=[UmeRxreq(
            request_idx=sqn + 1, transport_idx=ume.transport_idx, id_2=resp.reg_id, seqnum=sqn,
            rx_port=link.local[1], rx_ip=link.local[0])]))
        try:
            data = link.expect(lambda m, s=sqn: m.is_data_type and m.sqn == s,  # type: ignore
                               h.scaled(3.0), f"a retransmission of sqn {sqn}")
        except NoAnswer:
            break
        sqns.append(data.sqn)
    return sqns


@case("PXY-STORE-004", title="The source's return deletes the proxy source", suite=SUITE,
      section=S_OPERATE, requirement="The failed source reappears. The store deletes the proxy "
      "source and the original source resumes activity.",
      store_options=ALLOW, topic_options=TOPIC_OPTIONS, timeout=45.0)
def return_deletes_proxy(h: CaseContext) -> None:
    """Two stores; the source dies and a proxy is elected; the source comes back (registers
    again with its Session ID at every store): afterwards no store answers for the topic as
    its proxy, and the returned source's registration is granted."""
    members, src = _group(h, 2)
    _elected(h, src)
    time.sleep(h.scaled(SETTLE))
    back = ProxiedSource(h, members, topic=src.topic, name="returned source")
    back.register()
    time.sleep(h.scaled(2 * INTERVAL_MS / 1000))
    ports = answering(h, src.topic)
    h.check(not ports, "no store answers for the topic as a proxy after the source returned",
            expected="no store", observed=sorted(ports))


@case("PXY-STORE-005", title="A new proxy source is elected when the proxy's store dies",
      suite=SUITE, section=S_OPERATE,
      requirement="If the store running the proxy source fails, the other stores in the "
      "Quorum/Consensus group detect a source failure again and elect a new store to initiate "
      "a proxy source.", store_options=ALLOW, topic_options=TOPIC_OPTIONS, timeout=60.0)
def reelected_when_proxy_store_dies(h: CaseContext) -> None:
    """Three stores; the source dies and a proxy is elected; the proxy's store is killed
    (SIGKILL): another store of the group advertises a proxy for the topic (within three
    election intervals of silence plus the election's due time)."""
    members, src = _group(h, 3)
    _elected(h, src)
    time.sleep(h.scaled(SETTLE))
    ports = answering(h, src.topic)
    h.check(len(ports) == 1, "one store answers for the topic as its proxy",
            observed=sorted(ports))
    (port,) = ports
    holder = next(m for m in members if m.addr[1] == port)
    killed = time.monotonic()
    h.note(f"SIGKILL to the proxy's store (port {port})")
    holder.stop(kill=True)
    limit = (3 * INTERVAL_MS + 1.5 * INTERVAL_MS) / 1000 + SLACK
    found = wait_proxy(h, src.topic, killed, limit, exclude=frozenset({port}))
    h.check(found is not None, "another store elected a new proxy source after the proxy's "
            "store died", expected=f"a TIR from another store within {limit:.1f} s (scaled)",
            observed="none")


@case("PXY-STORE-006", title="A proxy source without quorum sends no messages", suite=SUITE,
      section=S_OPERATE, requirement="If a loss of quorum occurs, the proxy source can continue "
      "to send advertisements, but cannot send messages until a quorum is re-established.",
      store_options=ALLOW, topic_options=TOPIC_OPTIONS, timeout=45.0)
def no_send_without_quorum(h: CaseContext) -> None:
    """Three stores; the source dies and a proxy is elected; a receiver joins the proxy's
    transport; the two other stores are killed (one of three: no quorum); the receiver asks for
    SRI on the transport; for four election intervals the proxy sends no data message on
    it."""
    members, src = _group(h, 3)
    _elected(h, src)
    time.sleep(h.scaled(SETTLE))
    ports = answering(h, src.topic)
    h.check(len(ports) == 1, "one store answers for the topic as its proxy",
            observed=sorted(ports))
    tir = h.resolver.wait_tir(src.topic, h.scaled(1.0))
    assert tir is not None and isinstance(tir.info, lbmr.TcpInfo | lbmr.TcpSidInfo)
    transport = connect((tir.info.ip, tir.info.port), h.recorder,
                        "receiver -> proxy transport", h.scaled(2.0))
    h.closers.append(transport.close)
    for member in members:
        if member.addr[1] not in ports:
            h.note(f"SIGKILL to store {member.addr[0]}:{member.addr[1]} (quorum lost)")
            member.stop(kill=True)
    ume = next((o for o in tir.options or [] if isinstance(o, lbmr.ToptUme)), None)
    if ume is not None:  # as a receiver joining does: what the proxy answers is no data
        transport.send(LbmcMessage(headers=[SriReq(transport_idx=ume.transport_idx,
                                                   topic_idx=tir.index)]))
    time.sleep(h.scaled(4 * INTERVAL_MS / 1000))
    data = [m.sqn for m in list(transport.received) if m.is_data_type]
    h.check(not data, "the proxy source sent no message without quorum",
            expected="no data message on the proxy's transport", observed=data)


@case("PXY-STORE-007", title="No proxy source when allow-proxy-source is 0", suite=SUITE,
      section=S_ENABLE, requirement="You must configure both the source and the stores to "
      "enable the Proxy Source option. Configure the stores in the umestored XML configuration "
      "file with the Store Element Option, allow-proxy-source.",
      store_options={"allow-proxy-source": 0}, topic_options=TOPIC_OPTIONS, timeout=45.0)
def no_proxy_without_allow(h: CaseContext) -> None:
    """Three stores with ``allow-proxy-source`` 0; a source asking for a proxy dies: no store
    advertises its topic by the time a proxy would have been due (plus slack), and none
    answers for it."""
    _, src = _group(h, 3)
    died = src.die()
    time.sleep(h.scaled(DUE + SLACK / 2))
    ports = answering(h, src.topic)
    early = proxy_tirs(h, src.topic, died)
    h.check(not early and not ports, "no store created a proxy source",
            expected="no TIR for the topic from a store",
            observed={"advertised": sorted({p for _, p in early}), "answering": sorted(ports)})


@case("PXY-STORE-008", title="Forged election claims and a PSER for an unknown source are "
      "dropped: no proxy, no change to the election", suite=SUITE, section=S_ELECTIONS,
      requirement="The store creates a proxy source if it has not received a persistent "
      "registration request (PREG) from a proxy on a different store. The proxy source then "
      "sends a PREG containing a unique random value to the other stores.",
      store_options=ALLOW, topic_options=TOPIC_OPTIONS, timeout=60.0)
def forged_claims_dropped(h: CaseContext) -> None:
    """Three stores; from while the source lives to the end of the case, the harness sends
    every store, once per election interval (as a running proxy repeats its claim), claims no
    store of the group could have sent - a token of 0, a store index outside the group, a
    store index naming another store than the one in the PSER - and a valid-looking claim
    whose PSER names a source nobody registered.  No store creates a proxy while the source
    lives, every store still acknowledges the source's next message, and when the source dies
    the group still elects exactly one proxy in time (a store that followed a forged claim
    would wait for a proxy that is not there, for as long as the forger goes on)."""
    members, src = _group(h, 3)
    s = src.source
    forged = [
        ("token 0", (s.request.addr, s.transport_idx, s.topic_idx), 1, 0, members[1].addr),
        ("store index 9", (s.request.addr, s.transport_idx, s.topic_idx), 9, 0x7FFFFFFF,
         members[1].addr),
        ("index of another store", (s.request.addr, s.transport_idx, s.topic_idx), 2,
         0x7FFFFFFF, members[1].addr),
        ("unknown source", (("127.0.0.1", 1), s.transport_idx + 1, 77), 1, 0x7FFFFFFF,
         members[1].addr),
    ]
    links = [connect(m.addr, h.recorder, f"forger -> store {i}", h.scaled(2.0))
             for i, m in enumerate(members)]
    h.closers += [link.close for link in links]
    for what, *_ in forged:
        h.note(f"forged claims to every store, once per interval: {what}")

    def forge() -> None:
        for i, link in enumerate(links):
            for _, (addr, tidx, topic_idx), index, token, store in forged:
                link.send(LbmcMessage(headers=[
                    UmePreg(s_flag=1, p_flag=1, reg_id=src.reg_ids.get(i, 0),
                            transport_idx=tidx, topic_idx=topic_idx, resp_port=store[1],
                            resp_ip=store[0]),
                    UmePser(source_ip=addr[0], store_ip=store[0], transport_idx=tidx,
                            topic_idx=topic_idx, source_port=addr[1], store_port=store[1],
                            source_ctxinst=bytes(8), store_ctxinst=bytes(8)),
                    UmePsrcElectionToken(store_index=index, token=token)]))
    stop = threading.Event()
    h.closers.append(stop.set)  # closers run last first: the forger stops before its links

    def forger() -> None:
        while not stop.wait(h.scaled(INTERVAL_MS / 1000)):
            try:
                forge()
            except NoAnswer:
                return  # a store closed the connection: its claims are dropped either way
    sent = time.monotonic()
    forge()
    threading.Thread(target=forger, name="forger", daemon=True).start()
    deadline = sent + h.scaled(4 * INTERVAL_MS / 1000)
    while time.monotonic() < deadline:
        src.touch()
        time.sleep(0.2)
    early = proxy_tirs(h, src.topic, sent)
    h.check(not early, "no store created a proxy source for forged claims",
            expected="no TIR for the topic from a store", observed=early)
    src.publish(range(MESSAGES, MESSAGES + 1))
    _elected(h, src)
    time.sleep(h.scaled(SETTLE))
    ports = answering(h, src.topic)
    h.check(len(ports) == 1, "the election after the forged claims left exactly one proxy",
            expected="one store port", observed=sorted(ports))



QUORUM_REQUIRED: dict[str, str | int] = {"allow-proxy-source": 1,
                                         "proxy-source-repo-quorum-required": 1}


@case("PXY-STORE-009", title="With proxy-source-repo-quorum-required a proxy needs a quorum of "
      "the stores that hold the source's state", suite=SUITE, section="Proxy Sources",
      requirement="proxy-source-repo-quorum-required (store, UM 6.15): only stores that hold "
      "state for that topic/RegID participate in the proxy source election, and a quorum of "
      "them is required.", store_options=QUORUM_REQUIRED, topic_options=TOPIC_OPTIONS,
      timeout=45.0)
def proxy_needs_quorum_of_state_holders(h: CaseContext) -> None:
    """Three stores with the option (a UM 6.15 store option: unsupported for an IUT of an older
    version profile).  Source A registers with one store only, source B with two; both die.
    B gets exactly one proxy, on one of its two stores; A gets none (one store of three holds
    its state: no quorum)."""
    if h.iut_version != "current":
        raise Unsupported(f"proxy-source-repo-quorum-required is a UM 6.15 store option; the "
                          f"profile's version is {h.iut_version}")
    members = h.store_group(3)
    lone = ProxiedSource(h, members[:1], name="source A")
    pair = ProxiedSource(h, members[:2], name="source B")
    for src in (lone, pair):
        src.register()
        src.publish(range(MESSAGES))
    died = min(lone.die(), pair.die())
    found = wait_proxy(h, pair.topic, died, DUE + SLACK)
    h.check(found is not None, "two stores of three holding source B's state elected a proxy",
            expected="a TIR for source B's topic from a store", observed="none")
    time.sleep(h.scaled(SETTLE))
    ports = answering(h, pair.topic)
    h.check(len(ports) == 1 and ports <= {m.addr[1] for m in members[:2]},
            "exactly one of the two stores holding source B's state runs its proxy",
            expected=f"one of {[m.addr[1] for m in members[:2]]}", observed=sorted(ports))
    alone = proxy_tirs(h, lone.topic, died) + [(0.0, p) for p in answering(h, lone.topic)]
    h.check(not alone, "no proxy for source A, whose state only one store of three holds",
            expected="no TIR for source A's topic", observed=sorted({p for _, p in alone}))
