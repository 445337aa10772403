"""The reference persistent receiver: a sans-IO state machine for one topic from one source.

Flow (guide "Receiver Registration", "Persistent Receiver Recovery"; semantics.md §1.4, §1.9):

1. Resolve the topic (TQR through the resolver until a TIR answers), connect to the source's
   LBT-TCP transport.  A TIR without the UME option is a streaming source: messages are
   delivered as they come, nothing is registered.
2. Wait for SRI on the transport; without one for ``ume_sri_request_interval`` send an SRI
   request to the source's request port, up to ``ume_sri_request_maximum`` times, after which
   registration fails (:class:`~reference_impl.events.ReceiverRegistrationError`).
3. Register with every store in the SRI (PREG with the source's RegID at that store, our
   RegID or Session ID, RPP mode); one success event per store; registration completes when
   a majority of every group answered, at the consensus low sequence number
   (``ume_consensus_sequence_number_behavior``, default majority), adjusted by the recovery
   callback and by ``retransmit_request_maximum``, clamped to high + 1 (UM 6.13 rule).
4. Recover: retransmission requests to the stores, at most
   ``retransmit_request_outstanding_maximum`` outstanding, re-requested (from another store
   when there is one) every ``retransmit_request_interval``, abandoned after
   ``retransmit_request_message_timeout`` with :class:`~reference_impl.events.UnrecoverableLoss`.
   Live messages that arrive meanwhile wait, so the application sees every sequence number
   once and in order (:class:`~reference_impl.events.MessageDelivered`).
5. Acknowledge consumption to every store (cumulative; batched every
   ``ume_ack_batching_interval``, or at once, or only through :meth:`ReceiverCore.ack` with
   ``ume_explicit_ack_only``), and to the source when its SRI asks for delivery confirmation.
   Every ``ume_proactive_keepalive_interval`` the latest ACK is re-sent as a keepalive.

An LBT-RU source (its TIR carries an LBT-RU transport, and the receiver has an ``lbtru_port``)
is received through an :class:`~reference_impl.lbtru_session.LbtruReceiverSession` from that
port; its payloads enter the LBMC path the LBT-TCP transport uses (the session's stand-in
connection, :class:`~reference_impl.context.LbtruBinding`).  What the transport declares lost
needs nothing special: the next message delivered opens the gap in the topic sequence numbers
and recovery asks the stores, as for any gap.  A session that times out (or never connects)
counts as a transport connection lost (resolve again); a reset (the source restarted) only
restarts the SRI version count, the session reconnects by itself.

Data is taken only from the source's connections (its transport) and retransmissions only
from the stores the receiver registered with; SRI only from the source.  Anything else (a
stranger connecting to the request port and talking first) is dropped with an
:class:`~reference_impl.events.InputDropped`, so nobody but the source can inject messages or
redirect the receiver's registrations.  Recovery costs O(1) per message whatever is missing
(:class:`Gaps`), and what a received chunk makes due (delivery, requests, immediate ACKs) is
done once per chunk; a run of data messages (a store's retransmissions, the source's live
data) is read straight out of the chunk (:meth:`ReceiverCore.on_message_run`), each as the
message-by-message path reads it.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from reference_impl.context import Connection, ContextCore, FixedControl, LbtruBinding, control
from reference_impl.events import (
    Addr,
    Level,
    MessageDelivered,
    ReceiverRegistrationComplete,
    ReceiverRegistrationError,
    ReceiverRegistrationSuccess,
    RegistrationChange,
    StoreInfo,
    UnrecoverableLoss,
)
from reference_impl.fastmsg import ControlTemplate, data_fields
from reference_impl.lbtru_session import (
    Connected,
    ConnectFailed,
    Lost,
    SessionReset,
    SourceTimedOut,
)
from reference_impl.lbtru_session import Event as LbtruEvent
from reference_impl.source import _consensus
from wire import lbmr
from wire.fields import ipv4_to_int
from wire.lbmc import (
    DATA_BASE,
    VER_TYPE_BITS,
    AckType,
    Header,
    KeepaliveType,
    LbmcMessage,
    MessageType,
    Sri,
    SriReq,
    TopicIdx,
    Topicname,
    UmeAck,
    UmeClientLifetime,
    UmeKeepalive,
    UmePreg,
    UmePregResp,
    UmeRxreq,
    UmeSid,
    UmeStore,
    UmeStoreExt,
    UmeStoreGroup,
)

_ACK = ControlTemplate(UmeAck)
_DATA_SIZE = DATA_BASE.size
_DATA_UNPACK = DATA_BASE.codec.unpack_from
_MESSAGE, _RETRANS = int(MessageType.MESSAGE), int(MessageType.RETRANS)
_TYPE_MASK = VER_TYPE_BITS["type"].mask  # the message type nibble of ver_type (shift 0)
_RXREQ = FixedControl(UmeRxreq)
_RXREQ_IDX, _RXREQ_SQN = _RXREQ.at["request_idx"], _RXREQ.at["seqnum"]
RecoveryCallback = Callable[[int, int], int]
"""``(consensus low sequence number, high sequence number) -> low sequence number to use``
(the ``ume_recovery_sequence_number_info_function`` of the product)."""


@dataclass(frozen=True)
class ReceiverConfig:
    """The receiver options the core uses; names are the UM option names, times in ms."""

    ume_session_id: int = 0
    reg_id: int = 0  # what the registration callback would return: 0 = let the store assign
    ume_registration_interval: int = 3000
    ume_sri_request_interval: int = 1000
    ume_sri_request_maximum: int = 60
    ume_consensus_sequence_number_behavior: str = "majority"
    ume_explicit_ack_only: int = 0
    ume_use_ack_batching: int = 1
    ume_ack_batching_interval: int = 100
    ume_allow_confirmed_delivery: int = 1
    ume_receiver_paced_persistence: int = 0
    ume_activity_timeout: int = 0
    ume_state_lifetime: int = 0
    ume_proactive_keepalive_interval: int = 3000
    ume_use_store: int = 1
    retransmit_request_outstanding_maximum: int = 10
    retransmit_request_interval: int = 500
    retransmit_request_maximum: int = 0
    retransmit_request_message_timeout: int = 10_000
    resolver_query_interval: int = 1000


@dataclass(eq=False)
class StoreReg:
    """The receiver's registration with one store named by the SRI."""

    info: StoreInfo
    source_reg_id: int
    version: int
    reg_id: int = 0
    registered: bool = False
    old: bool = False
    low: int = 0
    high: int = 0
    next_attempt: float = 0.0
    failed: bool = False
    last_heard: float = 0.0


@dataclass
class Request:
    first: float
    last: float
    store: int
    tries: int = 1


@dataclass
class Source:
    """What topic resolution told us about the source."""

    transport: Addr
    request_addr: Addr | None
    topic_idx: int
    transport_idx: int
    persistent: bool
    lbtru_session_id: int | None = None  # None: LBT-TCP; else the LBT-RU session's ID


@dataclass
class _Held:
    payload: bytes
    retransmission: bool


@dataclass
class Gaps:
    """Sequence numbers still to request, as ascending half-open ``[start, end)`` ranges.

    Recovery asks for the lowest missing sequence numbers first and new gaps only ever open
    above everything seen, so ranges are appended at the back and consumed at the front: each
    sequence number costs O(1) however many are missing (a list of single numbers, filtered
    and sorted on every call, made a 100,000-message recovery quadratic).  Whether a number is
    still wanted (not received meanwhile, not already requested) is decided when it is taken.
    """

    ranges: deque[list[int]] = field(default_factory=deque)

    def add(self, start: int, end: int) -> None:
        """Add ``[start, end)``."""
        if start >= end:
            return
        ranges = self.ranges
        if not ranges or start > ranges[-1][1]:
            ranges.append([start, end])
        elif start >= ranges[-1][0]:
            ranges[-1][1] = max(ranges[-1][1], end)  # touches or overlaps the last range
        else:  # below the newest gap: never happens in recovery, kept correct anyway
            merged: list[list[int]] = []
            for lo, hi in sorted([*([r[0], r[1]] for r in ranges), [start, end]]):
                if merged and lo <= merged[-1][1]:
                    merged[-1][1] = max(merged[-1][1], hi)
                else:
                    merged.append([lo, hi])
            self.ranges = deque(merged)

    def take(self, floor: int) -> int | None:
        """Remove and return the lowest number not below ``floor``; numbers below it go."""
        ranges = self.ranges
        while ranges:
            first = ranges[0]
            start = first[0] if first[0] > floor else floor
            if start + 1 < first[1]:
                first[0] = start + 1
                return start
            ranges.popleft()
            if start < first[1]:
                return start
        return None

    def __len__(self) -> int:
        return sum(hi - lo for lo, hi in self.ranges)

    def __bool__(self) -> bool:
        return bool(self.ranges)


class ReceiverCore(ContextCore):
    """A persistent receiver (see the module docstring).

    Args:
        topic: the topic to receive.
        config: its options.
        ip: its address; ``request_port`` is what it names as its reply port in PREG/RXREQ.
        lbtru_port: the UDP port it receives LBT-RU transports on (0: it takes only LBT-TCP
            sources, and ignores advertisements of LBT-RU ones).
        lbmr_port, resolver: topic resolution.
        recovery_callback: optional pure function choosing the low sequence number.
        now: the time it starts.
    """

    component = "receiver"

    def __init__(self, topic: str, config: ReceiverConfig, *, ip: str, request_port: int = 0,
                 lbmr_port: int = 0, resolver: Addr | None = None,
                 recovery_callback: RecoveryCallback | None = None, now: float = 0.0,
                 lbtru_port: int = 0) -> None:
        super().__init__(topic, ip, lbmr_port=lbmr_port, resolver=resolver)
        self.topic = topic
        self.config = config
        self.lbtru_port = lbtru_port
        if lbtru_port:
            self.lbtru_ports.add(lbtru_port)
        self.request_addr: Addr = (ip, request_port)
        self.recovery_callback = recovery_callback
        self.now = now
        self.source: Source | None = None
        self.transport_up = False
        self.sri_version = 0
        self.acktosrc = False
        self.stores: dict[int, StoreReg] = {}
        self.group_sizes: dict[int, int] = {}
        self.complete = False
        self.failed = False
        self.next_sqn: int | None = None  # next sequence number to deliver
        self.high_seen: int | None = None
        self.held: dict[int, _Held] = {}
        self.missing = Gaps()  # to request, lowest first
        self.requests: dict[int, Request] = {}
        self.abandoned: set[int] = set()  # given up (UnrecoverableLoss), not yet stepped over
        self.consumed: int | None = None  # highest sequence number consumed in order
        self.acked: int | None = None  # highest acknowledged to the stores
        self._sri_requests = 0
        self._request_idx = 0
        self._chunk_work = False  # messages of the current chunk await on_chunk_done
        self._rr = 0
        self.stats.update(delivered=0, retransmissions=0, duplicates=0, requests=0, lost=0)
        self.set_timer("resolve", now)

    # --- application API ---------------------------------------------------------------------

    def ack(self, sqn: int) -> None:
        """Explicitly acknowledge consumption of everything up to ``sqn`` (in order)."""
        if self.consumed is None or sqn > self.consumed:
            self.consumed = sqn
        self._send_acks()

    @property
    def registered_stores(self) -> list[StoreReg]:
        return [s for s in self.stores.values() if s.registered]

    # --- resolution ---------------------------------------------------------------------------

    def on_lbmr(self, packet: lbmr.LbmrPacket, addr: Addr) -> None:
        if self.source is not None and self.transport_up:
            return
        for tir in packet.tirs:
            if not isinstance(tir, lbmr.Tir):
                continue  # queue records (QIR, type 6 packets) say nothing about sources
            if tir.name != self.topic:
                continue
            info = tir.info
            if isinstance(info, lbmr.LbtruInfo | lbmr.LbtruSidInfo) and self.lbtru_port:
                sid: int | None = getattr(info, "session_id", 0)
            elif isinstance(info, lbmr.TcpInfo | lbmr.TcpSidInfo):
                sid = None
            else:
                continue
            ume = next((o for o in (tir.options or []) if isinstance(o, lbmr.ToptUme)), None)
            persistent = ume is not None and bool(ume.store) and bool(self.config.ume_use_store)
            request = (ume.src_tcp_addr, ume.src_tcp_port) if ume is not None else None
            again = self.source is not None
            self.source = Source((info.ip, info.port), request, tir.index,
                                 ume.transport_idx if ume is not None else 0, persistent, sid)
            self.transport_up = True
            self.cancel_timer("resolve")
            if sid is None:
                self.send_to(self.source.transport, b"", tag="transport")
            else:
                old = self.lbtru_receiving(self.source.transport)
                if old is not None:
                    self.close_lbtru(old)
                self.open_lbtru_receiver(self.lbtru_port, self.source.transport, sid,
                                         tag="transport")
            if again:
                # a restarted source numbers its SRI versions afresh; our registrations stand
                self.sri_version = 0
                self.log(Level.INFO, f"source back: transport {info.ip}:{info.port}")
                return
            if persistent:
                self.set_timer("sri-request",
                               self.now + self.config.ume_sri_request_interval / 1000)
            else:
                self.complete = True  # streaming: deliver from the first message seen
            kind = "LBT-TCP" if sid is None else f"LBT-RU session {sid:#x}"
            self.log(Level.INFO, f"topic resolved: {kind} transport {info.ip}:{info.port}")
            return

    # --- messages -----------------------------------------------------------------------------

    def _from_source(self, conn: Connection) -> bool:
        """``conn`` is our connection to the source we resolved (its transport or its request
        port): the only place its data and SRI may come from."""
        src = self.source
        return conn.outgoing and src is not None and \
            (conn.remote == src.transport or conn.remote == src.request_addr)

    def _data_allowed(self, conn: Connection, mtype: int) -> bool:
        """Data comes from the source's transport; a store sends retransmissions only."""
        if isinstance(conn.tag, StoreReg):
            return mtype == MessageType.RETRANS
        return self._from_source(conn)

    def on_message_run(self, conn: Connection, data: bytes) -> int:
        # the recovery hot path: a store's retransmissions (or the source's data) back to back
        # in a chunk, read in place; exactly what on_raw_message does with each of them that
        # it takes (data of our topic from a peer allowed to send that type), and the first
        # message that is anything else ends the run
        src = self.source
        if src is None:
            return 0
        if isinstance(conn.tag, StoreReg):
            allowed: tuple[int, ...] = (_RETRANS,)
        elif self._from_source(conn):
            allowed = (_MESSAGE, _RETRANS)
        else:
            return 0
        tidx = src.topic_idx
        unpack, size = _DATA_UNPACK, _DATA_SIZE
        on_data = self._on_data
        pos, end = 0, len(data)
        while end - pos >= size:
            ver_type, next_hdr, msglen, topic_idx, sqn = unpack(data, pos)
            mtype = ver_type & _TYPE_MASK
            if next_hdr or mtype not in allowed or msglen < size or msglen > end - pos:
                break
            if topic_idx == tidx:
                on_data(sqn, data[pos + size:pos + msglen], retransmission=mtype == _RETRANS)
            pos += msglen
        return pos

    def on_raw_message(self, conn: Connection, raw: bytes) -> None:
        if len(raw) >= _DATA_SIZE:
            mtype, next_hdr, tidx, sqn = data_fields(raw)
            if mtype in (MessageType.MESSAGE, MessageType.RETRANS) and next_hdr == 0:
                if not self._data_allowed(conn, mtype):
                    self.drop(conn.remote, f"data message (sqn {sqn}) from a peer that is "
                                           f"neither the source nor a store", len(raw))
                elif self.source is not None and tidx == self.source.topic_idx:
                    self._on_data(sqn, raw[_DATA_SIZE:],
                                  retransmission=mtype == MessageType.RETRANS)
                return
        super().on_raw_message(conn, raw)

    def on_message(self, conn: Connection, message: LbmcMessage, raw: bytes) -> None:
        if message.is_data_type:
            if not self._data_allowed(conn, message.type):
                self.drop(conn.remote, f"data message (sqn {message.sqn}) from a peer that is "
                                       f"neither the source nor a store", len(raw))
            elif self.source is not None and message.tidx == self.source.topic_idx:
                self._on_data(message.sqn, message.payload,
                              retransmission=message.type == MessageType.RETRANS)
            return
        sri = message.header(Sri)
        if sri is not None:
            if not self._from_source(conn):
                self.drop(conn.remote, "SRI from a peer that is not the source", len(raw))
                return
            tidx = message.header(TopicIdx)
            if self.source is not None and (tidx is None or tidx.tidx == self.source.topic_idx):
                self._on_sri(sri, message)
            return
        store = conn.tag if isinstance(conn.tag, StoreReg) else None
        if store is None:
            if not conn.outgoing:
                # nobody has a reason to connect to a receiver and talk first
                self.drop(conn.remote, f"unexpected message from a stranger "
                                       f"({message.label()})", len(raw))
            return
        store.last_heard = self.now
        for header in message.headers:
            if isinstance(header, UmePregResp):
                self._on_preg_resp(store, header)
            elif isinstance(header, UmeKeepalive) and header.r_flag:
                self._keepalive(store)

    def on_connection_lost(self, conn: Connection, *, refused: bool) -> None:
        store = conn.tag if isinstance(conn.tag, StoreReg) else None
        if store is not None and store.registered:
            store.registered = False
            store.next_attempt = self.now + self.config.ume_registration_interval / 1000
            self.set_timer_if_later("register", store.next_attempt)
            self.log(Level.WARNING, f"lost store {store.info.index} {store.info.addr}")
        elif conn.tag == "transport" and self.source is not None:
            self.log(Level.WARNING, "source transport connection lost; resolving again")
            self.transport_up = False
            self.set_timer("resolve", self.now + self.config.resolver_query_interval / 1000)

    def on_lbtru_event(self, binding: LbtruBinding, event: LbtruEvent) -> None:
        # Lost needs nothing here: the session then delivers what follows the loss, whose
        # LBMC sequence numbers open the gap that recovery from the stores fills (_on_data)
        conn = binding.conn
        if isinstance(event, Lost):
            self.log(Level.INFO, f"LBT-RU transport lost sqn {event.first}..{event.last} "
                                 f"({event.reason}); recovering from the stores")
        elif isinstance(event, Connected):
            self.log(Level.INFO, f"LBT-RU session connected (client ID {event.client_id})")
        elif isinstance(event, SessionReset):
            # the source restarted: a restarted source numbers its SRI versions afresh
            self.sri_version = 0
            self.log(Level.INFO, "LBT-RU session reset by the source; reconnecting")
        elif isinstance(event, SourceTimedOut | ConnectFailed) and conn is not None:
            self.close_lbtru(binding)  # like a transport connection that went away
            self.on_connection_lost(conn, refused=isinstance(event, ConnectFailed))

    # --- SRI and registration ----------------------------------------------------------------

    def _on_sri(self, sri: Header, message: LbmcMessage) -> None:
        if self.failed or (sri.version <= self.sri_version and self.stores):
            return
        self.cancel_timer("sri-request")
        self.acktosrc = bool(sri.acktosrc)
        self.sri_version = sri.version
        changed = []
        for header in message.headers:
            if isinstance(header, UmeStoreGroup):
                self.group_sizes[header.grp_idx] = header.grp_sz
            elif isinstance(header, UmeStoreExt | UmeStore):
                version = getattr(header, "version", 0)
                info = StoreInfo(header.store_idx, header.grp_idx,
                                 (header.store_ip_addr, header.store_tcp_port))
                known = self.stores.get(header.store_idx)
                if known is None or version > known.version or \
                        known.source_reg_id != header.src_reg_id:
                    reg = StoreReg(info, header.src_reg_id, version,
                                   reg_id=known.reg_id if known else 0)
                    self.stores[header.store_idx] = reg
                    changed.append(reg)
        if changed and self.complete:
            self.emit(RegistrationChange(
                f"SRI version {sri.version}: re-registering with stores "
                f"{[r.info.index for r in changed]}"))
        for reg in changed:
            self._register(reg)

    def _register(self, reg: StoreReg) -> None:
        cfg = self.config
        src = self.source
        assert src is not None
        reg_id = reg.reg_id or cfg.reg_id
        headers: list[object] = [
            UmePreg(s_flag=0, w_flag=int(bool(cfg.ume_receiver_paced_persistence)),
                    reg_id=0 if cfg.ume_session_id and not reg.reg_id else reg_id,
                    transport_idx=src.transport_idx, topic_idx=src.topic_idx,
                    src_reg_id=reg.source_reg_id, resp_port=self.request_addr[1],
                    resp_ip=self.request_addr[0]),
            Topicname(topic=self.topic)]
        if cfg.ume_session_id:
            headers.append(UmeSid(sid=cfg.ume_session_id))
        if cfg.ume_activity_timeout or cfg.ume_state_lifetime:
            headers.append(UmeClientLifetime(activity_tmo=cfg.ume_activity_timeout,
                                             lifetime=cfg.ume_state_lifetime))
        reg.next_attempt = self.now + cfg.ume_registration_interval / 1000
        self.set_timer_if_later("register", reg.next_attempt)
        self.send_to(reg.info.addr, control(*headers), tag=reg)

    def _on_preg_resp(self, reg: StoreReg, resp: Header) -> None:
        if resp.e_flag:
            reg.failed = True
            text = f"store {reg.info.index} refused registration (code {resp.error_code})"
            self.emit(ReceiverRegistrationError(reg.info, resp.error_code, text))
            self.log(Level.ERROR, text)
            return
        if reg.registered:
            return
        reg.registered, reg.old = True, bool(resp.o_flag)
        reg.reg_id, reg.low, reg.high = resp.reg_id, resp.low_seqnum, resp.high_seqnum
        reg.last_heard = self.now
        self.emit(ReceiverRegistrationSuccess(reg.info, resp.reg_id, reg.source_reg_id,
                                              reg.old, resp.low_seqnum, bool(resp.w_flag)))
        if not self.complete:
            self._check_complete()
        elif self.acked is not None:
            self._send_ack_to(reg, self.acked)

    def _check_complete(self) -> None:
        groups = self.group_sizes or {0: len(self.stores)}
        registered = self.registered_stores
        ok = any(sum(1 for r in registered if r.info.group == g) >= size // 2 + 1
                 for g, size in groups.items())
        if not ok:
            return
        lows = [r.low for r in registered]
        low = _consensus(lows, self.config.ume_consensus_sequence_number_behavior)
        high_candidates = [r.high for r in registered if r.high or r.old]
        if self.high_seen is not None:
            high_candidates.append(self.high_seen)
        high = max(high_candidates) if high_candidates else low - 1
        if self.recovery_callback is not None:
            low = self.recovery_callback(low, high)
        if self.config.retransmit_request_maximum:
            low = max(low, high - self.config.retransmit_request_maximum)
        low = min(low, high + 1)  # UM 6.13: never beyond what the source has sent
        self.complete = True
        self.next_sqn = low
        if self.consumed is None or self.consumed < low - 1:
            self.consumed = low - 1 if low > 0 else None
        self.acked = self.consumed
        self.emit(ReceiverRegistrationComplete(low, high))
        self.log(Level.INFO, f"registration complete: low {low}, high {high}")
        self.missing = Gaps()
        self.missing.add(low, high + 1)
        self._forget_below(low)
        self._drain()
        self._request_more()
        self._arm_ack_timers()

    def _arm_ack_timers(self) -> None:
        cfg = self.config
        if cfg.ume_use_ack_batching and not cfg.ume_explicit_ack_only:
            self.set_timer("ack", self.now + cfg.ume_ack_batching_interval / 1000)
        if cfg.ume_proactive_keepalive_interval:
            self.set_timer("keepalive", self.now + cfg.ume_proactive_keepalive_interval / 1000)

    # --- data and recovery ------------------------------------------------------------------

    def _on_data(self, sqn: int, payload: bytes, *, retransmission: bool) -> None:
        if retransmission:
            self.stats["retransmissions"] += 1
        self.requests.pop(sqn, None)  # live or retransmitted, it is here: stop asking for it
        if self.high_seen is None or sqn > self.high_seen:
            if self.complete and self.high_seen is not None and \
                    self.next_sqn is not None and sqn > self.high_seen + 1:
                self.missing.add(max(self.high_seen + 1, self.next_sqn), sqn)
            self.high_seen = sqn
        if self.next_sqn is None:
            if not self.complete:
                self.held[sqn] = _Held(payload, retransmission)
                return
            self.next_sqn = sqn  # streaming source: start at the first message seen
        nxt = self.next_sqn
        if sqn < nxt or sqn in self.held:
            self.stats["duplicates"] += 1
            return
        if self.complete:
            self._chunk_work = True  # drain, acknowledge and ask for more once per chunk
            if sqn == nxt:  # the common case: in order, deliver at once
                self.emit(MessageDelivered(sqn, payload, retransmission))
                self.stats["delivered"] += 1
                self.next_sqn = sqn + 1
                if not self.config.ume_explicit_ack_only:
                    self.consumed = sqn
                return
        self.held[sqn] = _Held(payload, retransmission)

    def on_chunk_done(self, conn: Connection) -> None:
        if self._chunk_work:
            self._chunk_work = False
            self._drain()
            cfg = self.config
            if not cfg.ume_use_ack_batching and not cfg.ume_explicit_ack_only:
                self._send_acks()
            self._request_more()

    def _drain(self) -> None:
        """Deliver what is held from ``next_sqn`` on, stepping over abandoned numbers."""
        held, abandoned = self.held, self.abandoned
        nxt = self.next_sqn
        if nxt is None or (nxt not in held and nxt not in abandoned):
            return
        requests = self.requests
        emit = self.emit
        delivered, last = 0, None
        while True:
            item = held.pop(nxt, None)
            if item is not None:
                emit(MessageDelivered(nxt, item.payload, item.retransmission))
                requests.pop(nxt, None)
                delivered += 1
                last = nxt
                if abandoned:
                    abandoned.discard(nxt)  # it came after all
            elif nxt in abandoned:
                abandoned.discard(nxt)
            else:
                break
            nxt += 1
        self.stats["delivered"] += delivered
        if last is not None and not self.config.ume_explicit_ack_only:
            self.consumed = last
        self.next_sqn = nxt
        cfg = self.config
        if not cfg.ume_use_ack_batching and not cfg.ume_explicit_ack_only:
            self._send_acks()

    def _request_more(self) -> None:
        """Ask for the lowest missing sequence numbers, up to the outstanding maximum.

        Called for every message while recovering, so it returns at once when nothing can be
        asked for (whenever a request is outstanding the "rx" timer is armed already)."""
        missing, requests = self.missing, self.requests
        if not missing.ranges or self.next_sqn is None:
            return
        limit = self.config.retransmit_request_outstanding_maximum or sys.maxsize
        if len(requests) >= limit:
            return
        stores = self.registered_stores
        if not stores or self.source is None:
            return
        held, now = self.held, self.now
        floor = self.next_sqn
        batches: dict[int, list[int]] = {}
        while len(requests) < limit:
            sqn = missing.take(floor)
            if sqn is None:
                break
            floor = sqn + 1
            if sqn in held or sqn in requests:
                continue  # arrived meanwhile, or asked for already
            store = stores[self._rr % len(stores)]
            self._rr += 1
            requests[sqn] = Request(now, now, store.info.index)
            batches.setdefault(store.info.index, []).append(sqn)
        for store in stores:
            sqns = batches.get(store.info.index)
            if sqns:
                self._send_rxreqs(store, sqns)
        if requests:
            self.set_timer_if_later(
                "rx", now + self.config.retransmit_request_interval / 1000)

    def _send_rxreqs(self, store: StoreReg, sqns: list[int]) -> None:
        """One RXREQ per sequence number, written to the store in one go."""
        src = self.source
        assert src is not None
        values = _RXREQ.template(transport_idx=src.transport_idx, id_2=store.reg_id,
                                 rx_port=self.request_addr[1],
                                 rx_ip=ipv4_to_int(self.request_addr[0]))
        pack, idx = _RXREQ.pack, self._request_idx
        out = []
        for sqn in sqns:
            idx = (idx + 1) & 0xFFFFFFFF
            values[_RXREQ_IDX] = idx
            values[_RXREQ_SQN] = sqn
            out.append(pack(*values))
        self._request_idx = idx
        self.stats["requests"] += len(sqns)
        self.send_to(store.info.addr, b"".join(out))

    def _retry_requests(self) -> None:
        cfg = self.config
        timeout = cfg.retransmit_request_message_timeout / 1000
        interval = cfg.retransmit_request_interval / 1000
        stores = self.registered_stores
        lost = []
        for sqn, req in list(self.requests.items()):
            # deadlines compared as the timer computes them (``now - last >= interval`` can
            # miss its own deadline by float rounding and wait one more interval)
            if self.now >= req.first + timeout:
                del self.requests[sqn]
                lost.append(sqn)
            elif self.now >= req.last + interval and stores:
                others = [s for s in stores if s.info.index != req.store] or stores
                store = others[req.tries % len(others)]
                req.last, req.store, req.tries = self.now, store.info.index, req.tries + 1
                self._send_rxreqs(store, [sqn])
        if lost:
            self._give_up(sorted(lost))
        self._request_more()
        if self.requests:
            self.set_timer("rx", self.now + interval)

    def _give_up(self, lost: list[int]) -> None:
        start = prev = lost[0]
        for sqn in [*lost[1:], None]:
            if sqn is not None and sqn == prev + 1:
                prev = sqn
                continue
            self.emit(UnrecoverableLoss(start, prev))
            self.stats["lost"] += prev - start + 1
            if sqn is not None:
                start = prev = sqn
        # skip what cannot be recovered, wherever it lies: what follows is delivered in order
        # (a lost number behind a held message is stepped over once delivery reaches it)
        self.abandoned.update(lost)
        self._drain()

    def _forget_below(self, sqn: int) -> None:
        """Drop held messages below ``sqn`` (the delivery point jumped over them)."""
        held = self.held
        for stale in [s for s in held if s < sqn]:
            del held[stale]

    # --- acknowledgements -------------------------------------------------------------------

    def _send_acks(self) -> None:
        if self.consumed is None or (self.acked is not None and self.consumed <= self.acked):
            return
        self.acked = self.consumed
        for store in self.registered_stores:
            self._send_ack_to(store, self.consumed)
        src = self.source
        if self.acktosrc and self.config.ume_allow_confirmed_delivery and src and \
                src.request_addr is not None and self.registered_stores:
            reg_id = self.registered_stores[0].reg_id
            self.send_to(src.request_addr, _ACK.pack(
                type=AckType.CDELV, transport_idx=src.transport_idx, id_2=reg_id,
                rcv_reg_id=reg_id, seqnum=self.consumed,
                flags=0x08 if self.config.ume_explicit_ack_only else 0))

    def _send_ack_to(self, store: StoreReg, sqn: int) -> None:
        src = self.source
        assert src is not None
        self.send_to(store.info.addr, _ACK.pack(
            type=AckType.CDELV, transport_idx=src.transport_idx, id_2=store.reg_id,
            rcv_reg_id=store.reg_id, seqnum=sqn))

    def _keepalive(self, store: StoreReg) -> None:
        src = self.source
        if src is None:
            return
        if self.acked is not None:
            self._send_ack_to(store, self.acked)
        else:
            self.send_to(store.info.addr, control(UmeKeepalive(
                type=KeepaliveType.RECEIVER, transport_idx=src.transport_idx,
                topic_idx=src.topic_idx, reg_id=store.reg_id)))

    # --- timers -------------------------------------------------------------------------------

    def on_timer(self, name: str) -> None:
        cfg = self.config
        if name == "resolve":
            if self.source is None or not self.transport_up:
                self.send_lbmr(lbmr.LbmrPacket(tqrs=[lbmr.Tqr(name=self.topic)]))
                self.set_timer("resolve", self.now + cfg.resolver_query_interval / 1000)
        elif name == "sri-request":
            self._sri_request()
        elif name == "register":
            waiting = [reg for reg in self.stores.values()
                       if not reg.registered and not reg.failed]
            for reg in waiting:
                if self.now >= reg.next_attempt:
                    self._register(reg)
            if waiting:
                # a store lost before its retry time is due still needs a timer of its own
                self.set_timer_if_later("register", min(r.next_attempt for r in waiting))
        elif name == "rx":
            self._retry_requests()
        elif name == "ack":
            self._send_acks()
            self.set_timer("ack", self.now + cfg.ume_ack_batching_interval / 1000)
        elif name == "keepalive":
            for store in self.registered_stores:
                self._keepalive(store)
            self.set_timer("keepalive", self.now + cfg.ume_proactive_keepalive_interval / 1000)

    def _sri_request(self) -> None:
        cfg = self.config
        src = self.source
        if src is None or self.stores or src.request_addr is None:
            return
        if self._sri_requests >= cfg.ume_sri_request_maximum:
            self.failed = True
            text = f"no SRI after {self._sri_requests} SRI requests: registration failed"
            self.emit(ReceiverRegistrationError(None, -1, text))
            self.log(Level.ERROR, text)
            return
        self._sri_requests += 1
        self.send_to(src.request_addr, control(SriReq(transport_idx=src.transport_idx,
                                                      topic_idx=src.topic_idx)))
        self.set_timer("sri-request", self.now + cfg.ume_sri_request_interval / 1000)




