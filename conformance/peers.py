"""The parts the harness plays around a store IUT: resolver daemon, sources and receivers.

They are scripted peers, not implementations: every packet they send is a Scapy packet built
from the :mod:`wire.scapy_layers` layers (``LBMC() / LBMC_UmePreg(...) / LBMC_Topicname(...)``)
and a case may change any field, or send something else entirely, through the same links.
What they do by themselves is only what the IUT needs to get on with the case:

* :class:`HarnessResolver` is the unicast resolver daemon the IUT's ``lbm.cfg`` names; it
  answers a TQR for a harness source's topic with that source's TIR (what lbmrd relaying the
  source's advertisement would give), keeps the TIRs a source IUT advertises (the harness's
  stores and receivers find its transport there) and records every datagram;
* :class:`HarnessSource` listens on a transport port and a request port (a store or receiver
  IUT joins the first and asks for SRI on the second), registers on its own TCP connection to
  a store IUT and sends data messages to every connection on its transport; in front of a
  receiver IUT it is "registered" with the case's harness stores
  (:class:`~conformance.store_peer.HarnessStore`) instead, names them in its SRI and puts
  what it publishes into their repositories;
* :class:`HarnessReceiver` registers naming the source's RegID, acknowledges and requests
  retransmissions on its connection to the store.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from scapy.packet import Packet

from conformance.net import (
    DEFAULT_PORTS,
    Datagram,
    Listener,
    NoAnswer,
    TcpLink,
    UdpPort,
    connect,
    has,
)
from conformance.packets import (
    LBMC,
    LBMC_Extopt,
    LBMC_Sri,
    LBMC_TopicIdx,
    LBMC_Topicname,
    LBMC_UmeAck,
    LBMC_UmeClientLifetime,
    LBMC_UmeKeepalive,
    LBMC_UmePreg,
    LBMC_UmeRxreq,
    LBMC_UmeSid,
    LBMC_UmeStoreExt,
    LBMC_UmeStoreGroup,
)
from conformance.peer_env import PeerEnv
from conformance.udp_transport import TCP, DataLink, UdpTransport
from wire import lbmr
from wire.lbmc import (
    AckType,
    CfgOpt,
    LbmcMessage,
    MessageType,
    SriReq,
    UmeAck,
    UmePregResp,
    UmeRxreq,
)

if TYPE_CHECKING:
    from conformance.store_peer import HarnessStore


TRANSPORT_PORTS = DEFAULT_PORTS.transport
REQUEST_PORTS = DEFAULT_PORTS.request
RESOLVER_PORTS = DEFAULT_PORTS.resolver
"""tshark's default LBT-TCP transport, request and lbmrd ports (:class:`net.PortPlan`; a
parallel run gives each worker a share of them through :attr:`PeerEnv.ports`)."""


def with_options(pkt: Packet, options: Sequence[CfgOpt]) -> Packet:
    """``pkt`` followed by one EXTOPT configuration option per entry, field by field through
    the Scapy layer (docs/wire-lbmc.md §2.3)."""
    for option in options:
        header = option.header()
        pkt = pkt / LBMC_Extopt(subtype=header.subtype, data=header.data)
    return pkt


class Advertised(Protocol):
    """What the harness resolver serves: a harness source of a topic, or a scripted source of
    another transport (:class:`conformance.lbtrm_peers.LbtrmScriptedSource`)."""

    topic: str
    advertise_on_query: bool

    def tir(self) -> lbmr.Tir: ...


class HarnessResolver:
    """The resolver daemon of the IUT: answers TQRs for the harness's sources' topics."""

    def __init__(self, port: UdpPort) -> None:
        self.port = port
        self.sources: dict[str, Advertised] = {}
        self.tirs: dict[str, lbmr.Tir] = {}  # the newest TIR an IUT advertised, per topic
        self.iut_addrs: set[tuple[str, int]] = set()
        self._lock = threading.Condition()
        port.handler = self._on_datagram

    def reset(self) -> None:
        """Forget the previous case's sources and advertisements."""
        with self._lock:
            self.sources.clear()
            self.tirs.clear()

    def wait_tir(self, topic: str, timeout: float) -> lbmr.Tir | None:
        """The TIR an IUT advertised for ``topic``, waiting up to ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
        with self._lock:
            while topic not in self.tirs:
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._lock.wait(left)
            return self.tirs[topic]

    def _on_datagram(self, dgram: Datagram) -> None:
        with self._lock:
            self.iut_addrs.add(dgram.addr)
            sources = dict(self.sources)
            if dgram.packet is not None:
                for tir in dgram.packet.tirs:
                    if isinstance(tir, lbmr.Tir):
                        self.tirs[tir.name] = tir
                self._lock.notify_all()
        if dgram.packet is None:
            return
        for tqr in dgram.packet.tqrs:
            src = sources.get(tqr.name)
            if src is not None and src.advertise_on_query:
                self.port.send(lbmr.LbmrPacket(tirs=[src.tir()]), dgram.addr)

    def serve(self, source: Advertised) -> None:
        with self._lock:
            self.sources[source.topic] = source

    def advertise(self, source: Advertised) -> None:
        """Send the source's TIR to every IUT address heard from (an unsolicited advert)."""
        with self._lock:
            addrs = list(self.iut_addrs)
        for addr in addrs:
            self.port.send(lbmr.LbmrPacket(tirs=[source.tir()]), addr)


class _Client:
    """What scripted sources and receivers share: a TCP connection to the store (opened on
    first use, again after a close) and registration over it."""

    env: PeerEnv
    name: str
    link: TcpLink | None
    reg_id: int
    preg: Callable[..., Packet]  # the subclass's PREG builder

    def connect(self) -> TcpLink:
        if self.link is None or self.link.closed:
            self.link = connect(self.env.store_addr(), self.env.recorder, f"{self.name} -> store",
                                self.env.scaled(2.0))
        return self.link

    def register(self, timeout: float = 5.0, **preg: Any) -> Any:
        """Send a PREG and return the store's UME PREG_RESP header (granted or refused)."""
        link = self.connect()
        self.env.note(f"{self.name}: PREG {', '.join(f'{k}={v}' for k, v in preg.items())}")
        link.send(self.preg(**preg))
        message = link.expect(has(UmePregResp), self.env.scaled(timeout), "PREG_RESP")
        resp = message.header(UmePregResp)
        assert resp is not None
        if not resp.e_flag:
            self.reg_id = resp.reg_id
        return resp


class HarnessSource(_Client):
    """A scripted source of one topic (see the module docstring)."""

    def __init__(self, env: PeerEnv, topic: str, *, transport_idx: int,
                 topic_idx: int = 0, name: str = "source",
                 stores: Sequence[HarnessStore] = ()) -> None:
        """A source of ``topic``; the caller has the harness resolver serve its TIR."""
        self.env = env
        self.topic = topic
        self.name = name
        self.transport_idx = transport_idx
        self.topic_idx = topic_idx
        self.stores = list(stores)
        self.sri_version = 0
        self.answer_sri_requests = False
        self._sri_lock = threading.Lock()
        self._sri_requests: list[tuple[float, LbmcMessage]] = []
        self._confirmations: list[tuple[float, LbmcMessage]] = []
        self.answer_rxreqs = False
        """Answer retransmission requests on the request port (a store's off-transport
        recovery, docs/semantics.md §1.9) with the message as a retransmission, as a
        persistent source does from its retention."""
        self._rxreqs: list[tuple[float, LbmcMessage]] = []
        self.transport = Listener("127.0.0.1", env.recorder, f"{name} transport",
                                  ports=env.ports.rotated(env.ports.transport))
        self.udp: UdpTransport | None = None
        """The LBT-RU or LBT-RM session the source's data goes on in front of a store IUT
        (``env.transport``; None: LBT-TCP, :attr:`transport`)."""
        if env.transport != TCP and not self.stores:
            self.udp = UdpTransport(env.transport, env.recorder, f"{name} transport")
            env.on_close(self.udp.close)
            env.note(f"{name}: {self.udp.describe()}")
        self.request = Listener("127.0.0.1", env.recorder, f"{name} request port",
                                ports=env.ports.rotated(env.ports.request),
                                on_message=self._on_request)
        self.link: TcpLink | None = None
        # in front of harness stores the source is "registered" with them already
        self.reg_id = self.stores[0].source_reg_id if self.stores else 0
        self.store_addr = self.stores[0].addr if self.stores else env.store_addr()
        self.advertise_on_query = True
        self.streaming = False
        """Advertise as a streaming source: no UME option, the request port only in the
        EXFUNC option (where a streaming receiver's off-transport recovery asks)."""
        env.on_close(self.close)

    # --- resolution ---------------------------------------------------------------------------

    def tir(self) -> lbmr.Tir:
        store = self.store_addr
        request = self.request.addr
        if self.streaming:
            return lbmr.Tir(name=self.topic, ttl=1, index=self.topic_idx,
                            info=lbmr.TcpInfo(ip=self.transport.addr[0],
                                              port=self.transport.addr[1]),
                            options=[lbmr.ToptExfunc(src_tcp_port=request[1],
                                                     src_ip_addr=request[0], ume=0, lj=1)])
        return lbmr.Tir(
            name=self.topic, ttl=1, index=self.topic_idx,
            info=self.udp.info() if self.udp is not None else
            lbmr.TcpInfo(ip=self.transport.addr[0], port=self.transport.addr[1]),
            options=[
                lbmr.ToptUme(store=1, latejoin=1, qccap=1, store_tcp_port=store[1],
                             store_tcp_addr=store[0], src_tcp_port=request[1],
                             src_tcp_addr=request[0], src_reg_id=self.reg_id,
                             transport_idx=self.transport_idx, high_seqnum=0, low_seqnum=0),
                lbmr.ToptExfunc(src_tcp_port=request[1], src_ip_addr=request[0], ume=1, lj=1)])

    # --- registration -------------------------------------------------------------------------

    def preg(self, *, reg_id: int = 0, session_id: int | None = None, rpp: bool = False,
             deregister: bool = False, activity_timeout: int = 0, state_lifetime: int = 0,
             topic: str | None = None, options: Sequence[CfgOpt] = ()) -> Packet:
        """The PREG this source sends (change any field of the result to craft variants);
        ``options`` follow it as EXTOPT configuration options (an RPP source's overrides,
        docs/wire-lbmc.md §2.3)."""
        request = self.request.addr
        pkt: Packet = LBMC() / LBMC_UmePreg(
            s_flag=1, d_flag=int(deregister), w_flag=int(rpp), reg_id=reg_id,
            transport_idx=self.transport_idx, topic_idx=self.topic_idx,
            resp_port=request[1], resp_ip=request[0]) / LBMC_Topicname(
            topic=self.topic if topic is None else topic)
        if session_id is not None:
            pkt = pkt / LBMC_UmeSid(sid=session_id)
        if activity_timeout or state_lifetime:
            pkt = pkt / LBMC_UmeClientLifetime(activity_tmo=activity_timeout,
                                               lifetime=state_lifetime)
        return with_options(pkt, options)

    # --- data and stability -------------------------------------------------------------------

    def store_links(self, timeout: float = 3.0) -> list[DataLink]:
        """The store's connections to this source's transport (waits for the first); on
        LBT-RU and LBT-RM the transport session itself, once the store listens to it."""
        if self.udp is not None:
            if not self.udp.wait_receiver(self.env.scaled(timeout)):
                raise NoAnswer(f"{self.name}: expected the store joining the transport: "
                               f"nothing within {self.env.scaled(timeout):.2f} s "
                               f"({self.udp.describe()})")
            return [self.udp]
        self.transport.expect_link(self.env.scaled(timeout), "the store joining the transport")
        return [x for x in self.transport.links if not x.closed]

    def listeners(self) -> int:
        """How many stores listen to this source's transport now: open connections on LBT-TCP,
        connected clients on LBT-RU, memberships of the group on this host on LBT-RM (a case
        waiting for every store of a group counts them here, on any transport; -1 when LBT-RM
        memberships cannot be read)."""
        if self.udp is not None:
            return self.udp.receivers()
        return len([x for x in self.transport.links if not x.closed])

    def data(self, sqn: int, payload: bytes = b"", *, kind: MessageType = MessageType.MESSAGE
             ) -> Packet:
        body = payload or f"{self.topic} #{sqn}".encode()
        return LBMC(ver_type=int(kind), tidx=self.topic_idx, sqn=sqn) / body

    def send(self, *sqns: int, kind: MessageType = MessageType.MESSAGE) -> None:
        """Send data messages on the transport to every connected store."""
        links = self.store_links()
        for sqn in sqns:
            for link in links:
                link.send(self.data(sqn, kind=kind))

    def expect_stable(self, sqn: int, timeout: float = 3.0) -> LbmcMessage:
        """Wait for a stability ACK covering ``sqn`` on the registration connection."""
        link = self.connect()
        return link.expect(
            lambda m: any(isinstance(h, UmeAck) and h.type == AckType.STABLE
                          and h.seqnum >= sqn for h in m.headers),
            self.env.scaled(timeout), f"a stability ACK for sqn {sqn}")

    # --- SRI and publishing (in front of a receiver IUT) -------------------------------------

    def sri(self, *, version: int | None = None, stores: Sequence[HarnessStore] | None = None,
            low: int = 0, high: int = 0, acktosrc: bool = False,
            store_versions: Mapping[HarnessStore, int] | None = None,
            group_sizes: Mapping[int, int] | None = None) -> Packet:
        """An SRI naming ``stores`` (default: this source's), each with the RegID it holds for
        the source and store version 1 (or its ``store_versions`` entry: a source raises the
        version of a store it re-registered with); each group's size is the number of stores
        named in it unless ``group_sizes`` says otherwise; the overall version is the next
        one unless given."""
        if version is None:
            self.sri_version += 1
            version = self.sri_version
        named = self.stores if stores is None else list(stores)
        pkt: Packet = LBMC() / LBMC_Sri(version=version, low_sqn=low, high_sqn=high,
                                        initial_sqn_known=1, acktosrc=int(acktosrc)) \
            / LBMC_TopicIdx(tidx=self.topic_idx)
        for group in sorted({s.group for s in named}):
            size = sum(1 for s in named if s.group == group)
            size = (group_sizes or {}).get(group, size)
            pkt = pkt / LBMC_UmeStoreGroup(grp_idx=group, grp_sz=size)
        for store in named:
            pkt = pkt / LBMC_UmeStoreExt(
                grp_idx=store.group, store_tcp_port=store.addr[1], store_idx=store.index,
                store_ip_addr=store.addr[0], src_reg_id=store.source_reg_id,
                version=(store_versions or {}).get(store, 1))
        return pkt

    def send_sri(self, sri: Packet | None = None) -> None:
        """Send an SRI (default: :meth:`sri`) to every connection on the transport."""
        pkt = sri if sri is not None else self.sri(high=self.high_sent())
        for link in [x for x in self.transport.links if not x.closed]:
            link.send(pkt)

    def high_sent(self) -> int:
        held = [sqn for store in self.stores for sqn in store.repository]
        return max(held, default=0)

    def publish(self, *sqns: int, live: bool = True) -> None:
        """Put messages into every harness store's repository and, when ``live``, send them on
        the transport (``live=False``: sent before anyone listened, or lost on the way)."""
        for sqn in sqns:
            payload = bytes(self.data(sqn).payload)
            for store in self.stores:
                store.hold(sqn, payload)
            if live:
                for link in [x for x in self.transport.links if not x.closed]:
                    link.send(self.data(sqn))

    def send_lost(self, *sqns: int) -> None:
        """Messages the transport loses for good: on LBT-RU or LBT-RM datagrams never sent
        that the session then no longer holds, so the store's NAK gets "do not retry"
        (:meth:`UdpTransport.send_lost`)."""
        if self.udp is None:
            raise ValueError("send_lost needs the source on LBT-RU or LBT-RM")
        self.store_links()
        self.udp.send_lost(*(self.data(sqn) for sqn in sqns))

    def rxreqs(self) -> list[tuple[float, LbmcMessage]]:
        """(arrival time, message) of every retransmission request on the request port."""
        with self._sri_lock:
            return list(self._rxreqs)

    def sri_requests(self) -> list[tuple[float, LbmcMessage]]:
        """(arrival time, message) of every SRI request on the request port so far."""
        with self._sri_lock:
            return list(self._sri_requests)

    def confirmations(self) -> list[tuple[float, LbmcMessage]]:
        """(arrival time, message) of every ACK on the request port so far: receivers'
        delivery confirmations (docs/semantics.md §1.5)."""
        with self._sri_lock:
            return list(self._confirmations)

    def _on_request(self, link: TcpLink, message: LbmcMessage) -> None:
        rxreq = message.header(UmeRxreq)
        if rxreq is not None:
            with self._sri_lock:
                self._rxreqs.append((time.monotonic(), message))
            if self.answer_rxreqs:
                link.send(self.data(rxreq.seqnum, kind=MessageType.RETRANS))
            return
        if message.header(UmeAck) is not None:
            with self._sri_lock:
                self._confirmations.append((time.monotonic(), message))
            return
        if message.header(SriReq) is None:
            return
        with self._sri_lock:
            self._sri_requests.append((time.monotonic(), message))
        if self.answer_sri_requests:
            self.send_sri()

    def keepalive(self) -> None:
        self.connect().send(LBMC() / LBMC_UmeKeepalive(
            type=2, transport_idx=self.transport_idx, topic_idx=self.topic_idx,
            reg_id=self.reg_id))

    def close(self) -> None:
        if self.link is not None:
            self.link.close()
        self.transport.close()
        self.request.close()


class HarnessReceiver(_Client):
    """A scripted receiver of a harness source's topic."""

    def __init__(self, env: PeerEnv, source: HarnessSource, *, name: str = "receiver",
                 request_port: int = 14391) -> None:
        self.env = env
        self.source = source
        self.name = name
        self.link: TcpLink | None = None
        self.reg_id = 0
        self.request_port = request_port
        self._request_idx = 0
        env.on_close(self.close)

    def preg(self, *, reg_id: int = 0, source_reg_id: int | None = None,
             session_id: int | None = None, rpp: bool = False, deregister: bool = False,
             activity_timeout: int = 0, state_lifetime: int = 0,
             options: Sequence[CfgOpt] = ()) -> Packet:
        """The PREG this receiver sends; ``options`` as for :meth:`HarnessSource.preg` (a
        non-blocking RPP receiver's mode)."""
        src = self.source
        local = self.connect().local
        pkt: Packet = LBMC() / LBMC_UmePreg(
            s_flag=0, d_flag=int(deregister), w_flag=int(rpp), reg_id=reg_id,
            transport_idx=src.transport_idx, topic_idx=src.topic_idx,
            src_reg_id=src.reg_id if source_reg_id is None else source_reg_id,
            resp_port=self.request_port, resp_ip=local[0]) / LBMC_Topicname(topic=src.topic)
        if session_id is not None:
            pkt = pkt / LBMC_UmeSid(sid=session_id)
        if activity_timeout or state_lifetime:
            pkt = pkt / LBMC_UmeClientLifetime(activity_tmo=activity_timeout,
                                               lifetime=state_lifetime)
        return with_options(pkt, options)

    def ack(self, sqn: int) -> None:
        """A consumption ACK (cumulative: everything up to ``sqn``)."""
        src = self.source
        self.connect().send(LBMC() / LBMC_UmeAck(
            type=int(AckType.CDELV), transport_idx=src.transport_idx, id_2=self.reg_id,
            rcv_reg_id=self.reg_id, seqnum=sqn))

    def rxreq(self, sqn: int) -> None:
        """Ask the store to retransmit ``sqn``."""
        self._request_idx += 1
        local = self.connect().local
        self.connect().send(LBMC() / LBMC_UmeRxreq(
            request_idx=self._request_idx, transport_idx=self.source.transport_idx,
            id_2=self.reg_id, seqnum=sqn, rx_port=self.request_port, rx_ip=local[0]))

    def expect_data(self, sqn: int, timeout: float = 3.0) -> LbmcMessage:
        """Wait for a retransmission (or any data message) of ``sqn`` from the store."""
        return self.connect().expect(lambda m: m.is_data_type and m.sqn == sqn,
                                     self.env.scaled(timeout), f"data sqn {sqn} from the store")

    def close(self) -> None:
        if self.link is not None:
            self.link.close()


