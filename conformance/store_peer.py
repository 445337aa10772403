"""The parts the harness plays around a source or receiver IUT: stores, and a receiver's tap
on a source IUT's transport.

:class:`HarnessStore` is a scripted store on a TCP store port.  It is not a store
implementation: it does what a source or receiver needs to get on with a case, by rules a
case sets (and may change at any moment), and records everything it sees with the time it saw
it:

* a source's PREG gets a PREG_RESP (a RegID it assigns or the one asked for, the OLD flag and
  the high sequence number the case chose, or an error code); before answering, the store
  joins the source's LBT-TCP transport from the TIR the source advertised through the
  harness resolver and says so there with a store keepalive naming the source's RegID;
* data on that transport (and proactive retransmissions on the registration connection) go
  into its repository and, unless the case withholds them, are acknowledged as stable;
* a receiver's PREG gets its RegID and the low/high sequence numbers (by default the oldest
  and newest messages held); RXREQs are recorded and served from the repository as
  retransmissions; consumption ACKs are recorded;
* keepalives from clients are answered, so an IUT's store activity timeout sees a live store;
* receiver-paced persistence (RPP): the store plays one of the guide's store kinds of the "UMP
  Version RPP Compatibility Matrix" (:attr:`HarnessStore.kind`, one of
  :data:`reference_impl.rpp.STORE_KINDS`), with the rules of :mod:`reference_impl.rpp`: a
  *pre-5.3 store* grants everything and never sets the RPP (W) flag in its answers; a *5.3
  RPP store* is a topic that allows RPP, a *5.3 non-RPP store* one that does not (without a
  kind, the default, it grants everything).  A 5.3 store echoes the W flag of what it grants,
  refuses (code 6) an RPP source where RPP is not allowed, a re-registration that switches a
  repository between SPP and RPP (:func:`~reference_impl.rpp.reregistration_refusal`), a
  receiver whose mode does not fit its source's repository (the matrix's receiver rows) and
  garbled RPP options; the RPP values an RPP source asks for are not checked against a topic
  (the harness store has no topic limits).  The W flag and configuration options of every PREG
  are recorded with it (:meth:`HarnessStore.preg_rpp`).

Every packet it sends is built from the :mod:`wire.scapy_layers` layers (through
:mod:`conformance.packets`), so a case can also send anything else on the same links.

:class:`SourceTap` is a scripted receiver of a source IUT: it joins the transport the TIR
names, asks for SRI on the request port and keeps what arrives.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from scapy.packet import Packet

from conformance.evidence import Addr
from conformance.net import Listener, NoAnswer, TcpLink, connect
from conformance.packets import (
    LBMC,
    LBMC_SriReq,
    LBMC_UmeAck,
    LBMC_UmeKeepalive,
    LBMC_UmePregResp,
    LBMC_UmeStoreid,
)
from conformance.peer_env import PeerEnv
from reference_impl import rpp
from wire import lbmr
from wire.lbmc import (
    ACK_NAK,
    AckType,
    CfgOpt,
    Header,
    KeepaliveType,
    LbmcMessage,
    MessageType,
    PregError,
    Sri,
    Topicname,
    UmeAck,
    UmeKeepalive,
    UmePreg,
    UmeRxreq,
    UmeSid,
)


@dataclass(frozen=True)
class Seen:
    """One message a harness peer received, with the time (``time.monotonic``) it arrived."""

    at: float
    message: LbmcMessage
    link: TcpLink


@dataclass
class StoreSource:
    """A source registered with a harness store."""

    reg_id: int
    topic: str
    transport_idx: int
    topic_idx: int
    link: TcpLink
    transport: TcpLink | None = None


@dataclass
class StoreReceiver:
    """A receiver registered with a harness store."""

    reg_id: int
    source_reg_id: int
    topic: str
    transport_idx: int
    topic_idx: int
    link: TcpLink
    session_id: int | None = None


def random_reg_id() -> int:
    return secrets.randbelow((1 << 31) - 1000) + 1000


class HarnessStore:
    """A scripted store (see the module docstring).

    Rules a case may set at any time:

    Attributes:
        answer: answer PREGs at all (False: record them, say nothing, as a store that is slow
            to answer).
        silent: say nothing to anyone (no PREG_RESP, stability ACK, keepalive or
            retransmission), as an unresponsive store; messages are still recorded.
        refuse: the error code every PREG is answered with (0: grant).
        assign_reg_id: the RegID a PREG asking for 0 gets (0: a random one).
        old, high_seqnum: the OLD flag and high sequence number a source's PREG_RESP carries
            (``None``: OLD for a RegID already registered here, the highest message held).
        ack: whether a message that arrives is acknowledged as stable; a function of the
            sequence number chooses per message.
        nack: a function of the sequence number, or None: a proactive retransmission it says
            True for is answered with a stability NACK (the ACK with the NAK bit,
            ``wire.lbmc.ACK_NAK``) instead of :attr:`ack`'s answer, as a store that declared
            the message lost does (docs/semantics.md §1.8); :attr:`nacked` records each.
        receiver_low, receiver_high: the low/high sequence numbers a receiver's PREG_RESP
            carries (``None``: the oldest / newest message held).
        serve_rxreq: answer RXREQs with retransmissions from the repository.
        source_reg_id: the RegID this store holds for the harness's source (receiver IUTs:
            the SRI names it, and the receiver's PREG must carry it).
        confirm_rpp: a granted PREG_RESP echoes the PREG's RPP flag, as an RPP store
            acknowledges RPP mode (guide "RPP Registration"; False: a store that does not).
        kind: the store kind of the guide's RPP compatibility matrix it plays (one of
            :data:`reference_impl.rpp.STORE_KINDS`; module docstring), or None: no RPP rules
            (every PREG is granted, the W flag echoed as :attr:`confirm_rpp` says).
        repositories: the mode (:data:`~reference_impl.rpp.SPP` or
            :data:`~reference_impl.rpp.BLOCKING` = RPP) of every source repository a 5.3 store
            holds, by the source's RegID: a case puts one here to make a source's PREG a
            re-registration onto an existing repository (with :attr:`old`), or to give the
            harness's own source (:attr:`source_reg_id`) an RPP or SPP repository for a
            receiver IUT; a granted source registration adds its own.
    """

    def __init__(self, env: PeerEnv, name: str, *, index: int, group: int = 0) -> None:
        self.env = env
        self.name = name
        self.index = index
        self.group = group
        self.listener = Listener("127.0.0.1", env.recorder, name,
                                 on_message=self._on_message)
        self.addr: Addr = self.listener.addr
        self.answer = True
        self.silent = False
        self.refuse = 0
        self.assign_reg_id = 0
        self.old: bool | None = None
        self.high_seqnum: int | None = None
        self.ack: bool | Callable[[int], bool] = True
        self.nack: Callable[[int], bool] | None = None
        self.nacked: list[tuple[float, int]] = []  # (when, sqn) of every NACK sent
        self.receiver_low: int | None = None
        self.receiver_high: int | None = None
        self.serve_rxreq = True
        self.confirm_rpp = True
        self.source_reg_id = random_reg_id()
        self.kind: str | None = None
        self.repositories: dict[int, int] = {}
        self.refusals: list[tuple[float, int, str]] = []  # (when, error code, why) of each
        self.repository: dict[int, bytes] = {}
        self.sources: dict[int, StoreSource] = {}
        self.receivers: dict[int, StoreReceiver] = {}
        self.pregs: list[Seen] = []
        self.granted: list[tuple[float, int]] = []  # (when, RegID) of every granted PREG
        self.data: list[Seen] = []  # data messages on a source's transport
        self.prorx: list[Seen] = []  # proactive retransmissions from a source
        self.rxreqs: list[Seen] = []
        self.acks: list[Seen] = []  # consumption ACKs from receivers
        self.sris: list[Seen] = []  # SRI a source sent on its transport
        self.stable_sent: set[int] = set()
        self._transports: dict[TcpLink, StoreSource] = {}
        self._lock = threading.RLock()
        env.on_close(self.close)

    # --- what a case reads ----------------------------------------------------------------------

    def snapshot(self, seen: list[Seen]) -> list[Seen]:
        with self._lock:
            return list(seen)

    def data_sqns(self) -> list[int]:
        """Sequence numbers of the data messages seen on sources' transports, in arrival order."""
        return [s.message.sqn for s in self.snapshot(self.data)]

    def snapshot_granted(self) -> list[tuple[float, int]]:
        """(when, RegID) of every PREG this store granted so far."""
        with self._lock:
            return list(self.granted)

    def source_pregs(self) -> list[Seen]:
        return [s for s in self.snapshot(self.pregs) if _preg(s.message).s_flag]

    def receiver_pregs(self) -> list[Seen]:
        return [s for s in self.snapshot(self.pregs) if not _preg(s.message).s_flag]

    def preg_rpp(self, seen: Seen) -> tuple[int, list[CfgOpt] | str]:
        """A recorded PREG's RPP (W) flag and its configuration options (docs/wire-lbmc.md
        §2.3), or the reason they cannot be read (garbled options)."""
        try:
            options: list[CfgOpt] | str = rpp.parse_options(seen.message)
        except rpp.RppRefused as exc:
            options = str(exc)
        return int(_preg(seen.message).w_flag), options

    def snapshot_refusals(self) -> list[tuple[float, int, str]]:
        """(when, error code, why) of every PREG this store refused so far."""
        with self._lock:
            return list(self.refusals)

    def stable_sqns(self) -> set[int]:
        """The sequence numbers this store acknowledged as stable so far."""
        with self._lock:
            return set(self.stable_sent)

    def rxreq_sqns(self) -> list[int]:
        return [_rxreq(s.message).seqnum for s in self.snapshot(self.rxreqs)]

    def acked_up_to(self) -> int | None:
        """The highest sequence number receivers acknowledged consumption of."""
        acks = [_ack(s.message).seqnum for s in self.snapshot(self.acks)]
        return max(acks) if acks else None

    # --- what a case does -----------------------------------------------------------------------

    def hold(self, sqn: int, payload: bytes) -> None:
        """Put a message into the repository (as if the source had sent it here)."""
        with self._lock:
            self.repository[sqn] = payload

    def send_stable(self, *sqns: int, source: StoreSource | None = None) -> None:
        """Acknowledge ``sqns`` as stable to ``source`` (the only registered source if None)."""
        src = source or self.only_source()
        for sqn in sqns:
            self._stable(src, sqn)

    def only_source(self) -> StoreSource:
        with self._lock:
            sources = list(self.sources.values())
        if len(sources) != 1:
            raise NoAnswer(f"{self.name}: expected one registered source, have {len(sources)}")
        return sources[0]

    def only_receiver(self) -> StoreReceiver:
        """The one receiver registered here (a case that sends it something of its own)."""
        with self._lock:
            receivers = list(self.receivers.values())
        if len(receivers) != 1:
            raise NoAnswer(f"{self.name}: expected one registered receiver, have "
                           f"{len(receivers)}")
        return receivers[0]

    def packet_preg_resp(self, preg: Header, *, reg_id: int, error: int = 0, old: bool = False,
                         low: int = 0, high: int = 0) -> Packet:
        """The PREG_RESP this store sends for ``preg`` (change any field to craft variants)."""
        resp = LBMC_UmePregResp(
            e_flag=int(bool(error)), o_flag=int(old and not error), s_flag=preg.s_flag,
            d_flag=preg.d_flag if not error else 0,
            w_flag=int(self._echoes_rpp(preg) and not error), reg_id=reg_id,
            transport_idx=preg.transport_idx, topic_idx=preg.topic_idx,
            low_seqnum=0 if error else low, high_seqnum=0 if error else high)
        if error:
            resp.error_code = error
        pkt: Packet = LBMC() / resp / LBMC_UmeStoreid(store_id=self.addr[1] & 0x7FFF)
        return pkt

    # --- what the store does by itself ----------------------------------------------------------

    def _on_message(self, link: TcpLink, message: LbmcMessage) -> None:
        now = time.monotonic()
        seen = Seen(now, message, link)
        if message.is_data_type:
            self._on_data(seen)
            return
        for header in message.headers:
            if isinstance(header, UmePreg):
                with self._lock:
                    self.pregs.append(seen)
                if header.s_flag:
                    self._on_source_preg(link, message, header)
                else:
                    self._on_receiver_preg(link, message, header)
                return
            if isinstance(header, UmeRxreq):
                with self._lock:
                    self.rxreqs.append(seen)
                self._on_rxreq(link, header)
            elif isinstance(header, UmeAck) and header.type == AckType.CDELV:
                with self._lock:
                    self.acks.append(seen)
            elif isinstance(header, UmeKeepalive) and header.type in (KeepaliveType.SOURCE,
                                                                      KeepaliveType.RECEIVER):
                if not self.silent:
                    link.send(LBMC() / LBMC_UmeKeepalive(
                        type=int(KeepaliveType.STORE), transport_idx=header.transport_idx,
                        topic_idx=header.topic_idx, reg_id=header.reg_id))
            elif isinstance(header, Sri):
                with self._lock:
                    self.sris.append(seen)

    def _on_data(self, seen: Seen) -> None:
        message = seen.message
        with self._lock:
            src = self._transports.get(seen.link)
            if message.type == MessageType.PRORX:
                self.prorx.append(seen)
                src = src or self._source_of_link(seen.link)
            elif src is not None:
                self.data.append(seen)
            else:
                return  # data from elsewhere (a receiver has no reason to send any)
            self.repository.setdefault(message.sqn, bytes(message.payload or b""))
        if src is None or self.silent:
            return
        if message.type == MessageType.PRORX and self.nack is not None and \
                self.nack(message.sqn):
            with self._lock:
                self.nacked.append((seen.at, message.sqn))
            src.link.send(LBMC() / LBMC_UmeAck(flags=ACK_NAK, type=int(AckType.STABLE),
                                              transport_idx=src.transport_idx,
                                              id_2=src.topic_idx, seqnum=message.sqn))
            return
        wanted = self.ack(message.sqn) if callable(self.ack) else self.ack
        if wanted:
            self._stable(src, message.sqn)

    def _source_of_link(self, link: TcpLink) -> StoreSource | None:
        return next((s for s in self.sources.values() if s.link is link), None)

    def _stable(self, src: StoreSource, sqn: int) -> None:
        with self._lock:
            self.stable_sent.add(sqn)
        src.link.send(LBMC() / LBMC_UmeAck(type=int(AckType.STABLE),
                                          transport_idx=src.transport_idx,
                                          id_2=src.topic_idx, seqnum=sqn))

    def _echoes_rpp(self, preg: Header) -> bool:
        """Whether a grant of ``preg`` confirms RPP (W flag): the PREG asks for it, the store
        confirms (:attr:`confirm_rpp`) and it is not a pre-5.3 store."""
        return bool(preg.w_flag) and self.confirm_rpp and self.kind != rpp.STORE_KINDS[0]

    def _refuse(self, link: TcpLink, preg: Header, code: int, why: str) -> None:
        who = "source" if preg.s_flag else "receiver"
        self.env.note(f"{self.name}: refusing the {who}'s PREG with error code {code}: {why}")
        with self._lock:
            self.refusals.append((time.monotonic(), code, why))
        link.send(self.packet_preg_resp(preg, reg_id=preg.reg_id, error=code))

    def _source_rpp_refusal(self, message: LbmcMessage, preg: Header) -> str | None:
        """Why a 5.3 store refuses this source PREG by the RPP rules (module docstring), or
        None; a pre-5.3 store refuses nothing (it reads neither the flag nor the options)."""
        if self.kind not in rpp.STORE_KINDS[1:]:
            return None
        try:
            options = rpp.parse_options(message)
            rpp.requested_overrides(options)
        except rpp.RppRefused as exc:
            return str(exc)
        if options and not preg.w_flag:
            return "contradictory RPP registration: RPP options without the RPP flag"
        mode = rpp.BLOCKING if preg.w_flag else rpp.SPP
        if mode and self.kind != "5.3 RPP store":
            return "registering as an RPP source but RPP is not allowed"
        with self._lock:
            old_mode = self.repositories.get(preg.reg_id) if preg.reg_id else None
        if old_mode is None:
            return None
        return rpp.reregistration_refusal(role="source", old_mode=old_mode, new_mode=mode)

    def _receiver_rpp_refusal(self, message: LbmcMessage, preg: Header) -> str | None:
        """Why a 5.3 store refuses this receiver PREG: its mode against its source's
        repository, as the guide's matrix says (an SPP repository is a "5.3 non-RPP store" to a
        receiver, an RPP one a "5.3 RPP store"), or garbled options."""
        if self.kind not in rpp.STORE_KINDS[1:]:
            return None
        try:
            mode = rpp.receiver_mode(preg.w_flag, rpp.parse_options(message))
        except rpp.RppRefused as exc:
            return str(exc)
        with self._lock:
            repo = self.repositories.get(preg.src_reg_id, rpp.SPP)
        column = "5.3 RPP store" if repo else "5.3 non-RPP store"
        row = "5.3 RPP receiver" if mode else "5.3 non-RPP receiver"
        if rpp.cell(row, column).outcome is rpp.Outcome.REJECTED:
            return f"{'an RPP' if mode else 'a non-RPP'} receiver on " \
                   f"{'an RPP' if repo else 'an SPP'} repository"
        return None

    def _on_source_preg(self, link: TcpLink, message: LbmcMessage, preg: Header) -> None:
        if self.silent or not self.answer:
            return
        if self.refuse:
            self._refuse(link, preg, self.refuse, "the case's rule")
            return
        why = self._source_rpp_refusal(message, preg)
        if why is not None:
            self._refuse(link, preg, int(PregError.ECONFIG), why)
            return
        topic = message.header(Topicname)
        reg_id = preg.reg_id or self.assign_reg_id or random_reg_id()
        if self.kind in rpp.STORE_KINDS[1:]:
            with self._lock:
                self.repositories.setdefault(reg_id, rpp.BLOCKING if preg.w_flag else rpp.SPP)
        with self._lock:
            known = self.sources.get(reg_id)
            src = known or StoreSource(reg_id, topic.topic if topic else "", preg.transport_idx,
                                       preg.topic_idx, link)
            src.link = link
            self.sources[reg_id] = src
        old = self.old if self.old is not None else known is not None
        high = self.high_seqnum if self.high_seqnum is not None else \
            max(self.repository, default=0)
        # join the source's transport before answering, as a store does, so the source
        # sees the store receive it; on a worker thread: the TIR may still be on its way
        threading.Thread(target=self._join_and_answer, args=(src, link, preg, old, high),
                         name=f"harness {self.name} join", daemon=True).start()

    def _join_and_answer(self, src: StoreSource, link: TcpLink, preg: Header, old: bool,
                         high: int) -> None:
        try:
            self._join(src)
            if link.closed or self.silent:
                return
            self.env.note(f"{self.name}: granting source RegID {src.reg_id}"
                          f"{f' OLD, high sqn {high}' if old else ''}"
                          f"{' with the RPP flag' if self._echoes_rpp(preg) else ''}")
            # recorded before it is sent: the IUT may act on the grant (and a case look at
            # the grants) before this thread runs again
            with self._lock:
                self.granted.append((time.monotonic(), src.reg_id))
            link.send(self.packet_preg_resp(preg, reg_id=src.reg_id, old=old, high=high))
        except NoAnswer as exc:
            self.env.note(f"{self.name}: {exc}")

    def _join(self, src: StoreSource) -> None:
        """Connect to the source's transport (once) and say hello there."""
        if src.transport is None or src.transport.closed:
            tir = self.env.wait_tir(src.topic, self.env.scaled(3.0))
            if tir is None or not isinstance(tir.info, lbmr.TcpInfo | lbmr.TcpSidInfo):
                self.env.note(f"{self.name}: no LBT-TCP TIR for {src.topic!r}: not joining its "
                            f"transport")
                return
            transport = connect((tir.info.ip, tir.info.port), self.env.recorder,
                                f"{self.name} -> source transport", self.env.scaled(2.0),
                                on_message=self._on_message)
            self.env.on_close(transport.close)
            with self._lock:
                src.transport = transport
                self._transports[transport] = src
        assert src.transport is not None
        src.transport.send(LBMC() / LBMC_UmeKeepalive(
            type=int(KeepaliveType.STORE), transport_idx=src.transport_idx,
            topic_idx=src.topic_idx, reg_id=src.reg_id))

    def _on_receiver_preg(self, link: TcpLink, message: LbmcMessage, preg: Header) -> None:
        if self.silent or not self.answer:
            return
        if self.refuse:
            self._refuse(link, preg, self.refuse, "the case's rule")
            return
        why = self._receiver_rpp_refusal(message, preg)
        if why is not None:
            self._refuse(link, preg, int(PregError.ECONFIG), why)
            return
        topic = message.header(Topicname)
        sid = message.header(UmeSid)
        reg_id = preg.reg_id or self.assign_reg_id or random_reg_id()
        with self._lock:
            known = reg_id in self.receivers
            self.receivers[reg_id] = StoreReceiver(
                reg_id, preg.src_reg_id, topic.topic if topic else "", preg.transport_idx,
                preg.topic_idx, link, sid.sid if sid is not None else None)
            low = self.receiver_low if self.receiver_low is not None else \
                min(self.repository, default=0)
            high = self.receiver_high if self.receiver_high is not None else \
                max(self.repository, default=0)
            self.granted.append((time.monotonic(), reg_id))
        self.env.note(f"{self.name}: granting receiver RegID {reg_id}, low {low}, high {high}"
                      f"{' with the RPP flag' if self._echoes_rpp(preg) else ''}")
        link.send(self.packet_preg_resp(preg, reg_id=reg_id, old=known, low=low, high=high))

    def _on_rxreq(self, link: TcpLink, rxreq: Header) -> None:
        if self.silent or not self.serve_rxreq:
            return
        with self._lock:
            rcv = self.receivers.get(rxreq.id_2) or next(
                (r for r in self.receivers.values() if r.link is link), None)
            payload = self.repository.get(rxreq.seqnum)
        if rcv is None or payload is None:
            return
        link.send(LBMC(ver_type=int(MessageType.RETRANS), tidx=rcv.topic_idx,
                       sqn=rxreq.seqnum) / payload)

    def links(self) -> list[TcpLink]:
        """Every connection of this store: clients' registrations and sources' transports."""
        with self._lock:
            return [*self.listener.links, *self._transports]

    def close(self) -> None:
        self.listener.close()


def _preg(message: LbmcMessage) -> Header:
    header = message.header(UmePreg)
    assert header is not None
    return header


def _rxreq(message: LbmcMessage) -> Header:
    header = message.header(UmeRxreq)
    assert header is not None
    return header


def _ack(message: LbmcMessage) -> Header:
    header = message.header(UmeAck)
    assert header is not None
    return header


class SourceTap:
    """A scripted receiver of a source IUT: on its transport, asking for SRI."""

    def __init__(self, env: PeerEnv, tir: lbmr.Tir, name: str = "receiver") -> None:
        if not isinstance(tir.info, lbmr.TcpInfo | lbmr.TcpSidInfo):
            raise NoAnswer(f"the source advertised a {type(tir.info).__name__} transport; the "
                           f"harness plays receivers of LBT-TCP only")
        self.env = env
        self.name = name
        self.tir = tir
        ume = next((o for o in tir.options or [] if isinstance(o, lbmr.ToptUme)), None)
        self.request_addr: Addr | None = \
            (ume.src_tcp_addr, ume.src_tcp_port) if ume is not None else None
        self.transport_idx = ume.transport_idx if ume is not None else 0
        self.topic_idx = tir.index
        self.link = connect((tir.info.ip, tir.info.port), env.recorder,
                            f"{name} -> source transport", env.scaled(2.0))
        self.request: TcpLink | None = None
        env.on_close(self.close)

    def sri_request(self) -> None:
        """Send an SRI request to the source's request port (from its TIR)."""
        if self.request_addr is None:
            raise NoAnswer("the source's TIR has no UME option naming its request port")
        if self.request is None or self.request.closed:
            self.request = connect(self.request_addr, self.env.recorder,
                                   f"{self.name} -> source request port", self.env.scaled(2.0))
        self.request.send(LBMC() / LBMC_SriReq(transport_idx=self.transport_idx,
                                              topic_idx=self.topic_idx))

    def sris(self) -> list[LbmcMessage]:
        """Every SRI received on the transport so far."""
        return [m for m in list(self.link.received) if m.header(Sri) is not None]

    def expect_sri(self, timeout: float, what: str = "an SRI") -> LbmcMessage:
        return self.link.expect(lambda m: m.header(Sri) is not None, self.env.scaled(timeout),
                                what)

    def data_sqns(self) -> list[int]:
        return [m.sqn for m in list(self.link.received) if m.is_data_type]

    def close(self) -> None:
        self.link.close()
        if self.request is not None:
            self.request.close()
