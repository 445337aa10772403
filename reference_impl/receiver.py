"""The reference persistent receiver: a sans-IO state machine for one topic, from every source.

Flow (guide "Receiver Registration", "Persistent Receiver Recovery"; docs/semantics.md §1.4, §1.9):

1. Resolve the topic (TQR through the resolver until a TIR answers), connect to the source's
   LBT-TCP transport.  A TIR without the UME option is a streaming source: messages are
   delivered as they come, nothing is registered.
2. Wait for SRI on the transport; without one for ``ume_sri_request_interval`` send an SRI
   request to the source's request port, up to ``ume_sri_request_maximum`` times, after which
   registration fails (:class:`~reference_impl.events.ReceiverRegistrationError`).
3. Register with every store in the SRI (PREG with the source's RegID at that store, our
   RegID or Session ID, RPP mode); one success event per store; registration completes when
   the stores that answered meet the intragroup and intergroup rules
   (:mod:`reference_impl.quorum`; the receiver reads ``ume_retention_*_stability_behavior``
   in its own scope, a choice: see :meth:`ReceiverCore._check_complete`), at the consensus
   low sequence number (``ume_consensus_sequence_number_behavior``, default majority: per
   group, then the latest of the groups), adjusted by ``retransmit_request_maximum`` and the
   recovery callback (:meth:`ReceiverCore._low_sqn`), clamped to high + 1 (UM 6.13).  Every
   PREG names the receiver's request address (``resp_ip``/``resp_port``: its context's
   request port, which ``ump receiver`` listens on); with the Session ID it is what proves
   to a store that a restarted receiver is the owner of its RegID.  A "RegID in use"
   refusal (code 3, or 5) is asked again every ``ume_registration_interval``, as the source
   does: it clears when the holder's activity timeout at the store has run out.  Every other
   refusal is final.
4. Recover: retransmission requests to the stores, at most
   ``retransmit_request_outstanding_maximum`` outstanding, re-requested (from another store
   when there is one) every ``retransmit_request_interval``, abandoned after
   ``retransmit_request_message_timeout`` with :class:`~reference_impl.events.UnrecoverableLoss`.
   Live messages that arrive meanwhile wait, so the application sees every sequence number
   once and in order (:class:`~reference_impl.events.MessageDelivered`).
   Fragments of a large message (a FRAG header, :mod:`reference_impl.fragments`) are ordered,
   recovered and de-duplicated per sequence number like any message and delivered as one
   message, once complete (see :meth:`ReceiverCore._fragment_delivered`).
5. Acknowledge consumption to every store (cumulative; batched every
   ``ume_ack_batching_interval``, or at once, or only through :meth:`ReceiverCore.ack` with
   ``ume_explicit_ack_only``), and to the source when its SRI asks for delivery confirmation
   (and ``ume_allow_confirmed_delivery`` allows).  Delivery is consumption, unless the
   application retains messages (:meth:`ReceiverCore.retain_messages`) and consumes them in
   any order (:meth:`ReceiverCore.consume`): then only the contiguous run consumed is
   acknowledged.
   Every ``ume_proactive_keepalive_interval`` the latest ACK is re-sent as a keepalive.

Receiver-paced persistence (guide "RPP Registration", "RPP Deregistration"; docs/semantics.md
§1.13, §2.1): a blocking RPP receiver (``ume_receiver_paced_persistence`` 1) sets the PREG's
RPP flag, a non-blocking one (2) also follows the PREG with the option
``ume_receiver_paced_persistence 2`` (:func:`reference_impl.rpp.receiver_options`,
docs/wire-lbmc.md §2.3).  A code 6 refusal of an RPP registration is "RPP Receiver
Registration Failure" (:class:`~reference_impl.events.ReceiverRegistrationError` with
``rpp``); a grant whose RPP flag is clear is "Granted - Receiver Error"
(:class:`~reference_impl.events.RppNotAcknowledged`, an ERROR line; the registration is kept
and counted).  A non-blocking receiver never holds its source back: what the store released
before the receiver asked for it is simply not answered, and the request's
``retransmit_request_message_timeout`` turns it into an
:class:`~reference_impl.events.UnrecoverableLoss`, after which delivery goes on.  Under a
profile without RPP (``pre-5.3``) nothing of RPP is sent or read.
:meth:`ReceiverCore.deregister` leaves every store (see there).

An LBT-RU source (its TIR carries an LBT-RU transport, and the receiver has an ``lbtru_port``)
is received through an :class:`~reference_impl.lbtru_session.LbtruReceiverSession` from that
port; its payloads enter the LBMC path the LBT-TCP transport uses (the session's stand-in
connection, :class:`~reference_impl.context.LbtruBinding`).  What the transport declares lost
shows as a gap in the topic sequence numbers once the next message is delivered: off-transport
recovery (:mod:`reference_impl.otr`) asks the stores for it, after ``otr_request_initial_delay``
and paced, and delivers it with the OTR flag; without ``use_otr`` it is lost at once
(:meth:`ReceiverCore._transport_gap`).  A session that times out (or never connects)
counts as a transport connection lost (resolve again); a reset (the source restarted) only
restarts the SRI version count, the session reconnects by itself.
An LBT-RM source (TIR with the 16-byte LBT-RM form) is received the same way through an
:class:`~reference_impl.lbtrm_session.LbtrmReceiverSession` on the group's destination port
(:meth:`~reference_impl.context.ContextCore.open_lbtrm_receiver`); a TIR of a known source
with another session ID is that source restarted (LBT-RM has no reset): its new session takes
over (:meth:`~reference_impl.context.ContextCore.promote_lbtrm`) and, as for an LBT-RU reset,
only the SRI version count restarts.  *Choice*: the source string (``LBTRM:ip:port:session:
group:port``) keeps the first session's ID for the whole per-source flow, so deliveries before
and after a restart name one source, as they do over LBT-TCP and LBT-RU.

Data is taken only from the source's connections (its transport) and retransmissions only
from the stores the receiver registered with; SRI only from the source.  Anything else (a
stranger connecting to the request port and talking first) is dropped with an
:class:`~reference_impl.events.InputDropped`, so nobody but the source can inject messages or
redirect the receiver's registrations.  Recovery costs O(1) per message whatever is missing
(:class:`Gaps`), and what a received chunk makes due (delivery, requests, immediate ACKs) is
done once per chunk; a run of data messages (a store's retransmissions, the source's live
data) is read straight out of the chunk (:meth:`ReceiverCore.on_message_run`), each as the
message-by-message path reads it.

Every source of the topic (issue 22 item 8; guide "Receiver Registration": receivers register
after receiving the SRI of *the source sending on the receiver's topic*, and a receiver RegID
belongs to one source at one store, "Registration Identifier"): each TIR names a source by its
transport address and topic index, and each source gets a :class:`SourceSession` of its own:
its SRI, its registrations (a RegID per store of *its* SRI), its delivery order, its recovery
and its consumption ACKs.  Deliveries say which source they came from
(:attr:`~reference_impl.events.MessageDelivered.source`, the product's source string such as
``TCP:10.0.0.5:14371``).  The per-source flow above runs unchanged on the session being
handled (:attr:`ReceiverCore._cur`); the attributes of that flow (``next_sqn``, ``stores``,
``complete``, ...) read and write the current session, which outside a call into the core is
the first source joined, so code written for one source keeps working.  The receiver keeps
querying (every ``resolver_query_interval``, the product's sustaining query phase) so that a
source that starts later is found too, and so that the resolver daemon keeps relaying to it.

Choices where the fact sheets are silent:

* A PREG names its session in its ``marker`` (1-127), which the store echoes in the PREG_RESP:
  with several sources on one store the receiver shares one connection to it, and the
  response carries no source RegID.  A response whose marker names no session goes to the
  only session registering with that store, or else to the first not yet registered.
* Retransmissions carry only the source's topic index, which two sources may share: on a
  connection shared by several sessions, a retransmission goes to the session that asked that
  store for that sequence number first (a store answers in order), and no two sessions that
  share a store have a request for the same sequence number outstanding at once (the later
  one waits).  Requests a store never answers stop counting after
  ``retransmit_request_message_timeout``.
* A source that comes back on a known transport (after its connection was lost or its LBT-RU
  session reset) is not trusted until its SRI arrives: live data until then is dropped (the
  gap it leaves is recovered from the stores).  An SRI that names none of the (store, source
  RegID) pairs the receiver registered for is a *new* source on that transport (guide "How
  Stores Associate Session IDs and RegIDs": a source without a Session ID or saved RegIDs
  registers anew): the session starts afresh, asking every store for a new RegID (0, or the
  configured one), with its own sequence numbers (issue 22 item 11).  A receiver RegID is
  only asked for again at a store whose source RegID is unchanged.
"""

from __future__ import annotations

import sys
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from reference_impl import quorum
from reference_impl.context import Connection, ContextCore, FixedControl, LbtruBinding, control
from reference_impl.events import (
    Addr,
    Level,
    MessageDelivered,
    OtrRequested,
    ReceiverDeregistered,
    ReceiverRegistrationComplete,
    ReceiverRegistrationError,
    ReceiverRegistrationSuccess,
    RegistrationChange,
    RppNotAcknowledged,
    StoreInfo,
    UnrecoverableLoss,
)
from reference_impl.fastmsg import ControlTemplate, data_fields
from reference_impl.fragments import FragmentPiece, Reassembly
from reference_impl.lbtru_session import (
    Connected,
    ConnectFailed,
    Lost,
    SessionReset,
    SourceTimedOut,
)
from reference_impl.lbtru_session import Event as LbtruEvent
from reference_impl.otr import OtrCore, OtrLost, OtrSettings, otr_applies
from reference_impl.rpp import SPP, check_mode, receiver_options
from wire import lbmr
from wire.fields import ipv4_to_int
from wire.lbmc import (
    DATA_BASE,
    VER_TYPE_BITS,
    AckType,
    Frag,
    Header,
    KeepaliveType,
    LbmcMessage,
    MessageType,
    PregError,
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
_IN_USE = {PregError.EREGID: "RegID is in use by a receiver",
           PregError.EACTIVE: "RegID is in use by a different source"}
"""The refusals that clear when the holder's activity timeout at the store runs out."""
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
    """The receiver options the core uses; names are the UM option names, times in ms.

    ``ume_receiver_paced_persistence``: 0 SPP, 1 blocking RPP, 2 non-blocking RPP (the guide's
    receivers know 0 and 1: the configuration layer checks a profile's modes).
    ``rpp_supported`` is the profile's
    :attr:`~reference_impl.config.profiles.Profile.rpp_supported`: False (profile
    ``pre-5.3``) makes a receiver that never sets, sends or reads anything of RPP, and
    refuses a non-zero mode.
    """

    ume_session_id: int = 0
    reg_id: int = 0  # what the registration callback would return: 0 = let the store assign
    ume_registration_interval: int = 3000
    ume_sri_request_interval: int = 1000
    ume_sri_request_maximum: int = 60
    ume_consensus_sequence_number_behavior: str = "majority"
    ume_retention_intragroup_stability_behavior: str = "quorum"
    ume_retention_intergroup_stability_behavior: str = "any"
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
    rpp_supported: bool = True
    use_otr: int = 2  # off-transport recovery (reference_impl.otr): 2 = persistent only
    otr_request_initial_delay: int = 2000
    otr_request_minimum_interval: int = 1000
    otr_request_maximum_interval: int = 10000
    otr_message_caching_threshold: int = 10000

    def __post_init__(self) -> None:
        check_mode("receiver", self.ume_receiver_paced_persistence, self.rpp_supported)
        for option, canonical in (
                ("ume_consensus_sequence_number_behavior", quorum.consensus_behaviour),
                ("ume_retention_intragroup_stability_behavior", quorum.intragroup),
                ("ume_retention_intergroup_stability_behavior", quorum.intergroup)):
            object.__setattr__(self, option, canonical(getattr(self, option)))
        for option in ("retransmit_request_interval", "retransmit_request_message_timeout",
                       "ume_ack_batching_interval", "ume_registration_interval"):
            if getattr(self, option) <= 0:
                raise ValueError(f"{option} must be a positive number of ms, not "
                                 f"{getattr(self, option)}")
        if self.retransmit_request_maximum < 0:
            raise ValueError(f"retransmit_request_maximum must be 0 (no cap) or a positive "
                             f"number of messages, not {self.retransmit_request_maximum}")
        self.otr_settings  # noqa: B018 - validates the OTR timers

    @property
    def rpp_mode(self) -> int:
        """The RPP mode the receiver registers with (0 SPP, 1 blocking, 2 non-blocking)."""
        return self.ume_receiver_paced_persistence if self.rpp_supported else SPP

    @property
    def otr_settings(self) -> OtrSettings:
        """The OTR pacing (:mod:`reference_impl.otr`); a gap is given up
        ``retransmit_request_message_timeout`` after its first OTR request."""
        return OtrSettings.from_ms(self.otr_request_initial_delay,
                                   self.otr_request_minimum_interval,
                                   self.otr_request_maximum_interval,
                                   self.retransmit_request_message_timeout)


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
    leaving: bool = False  # a deregistration is owed to this store until it confirms


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
    lbtru_session_id: int | None = None  # None: LBT-TCP; else the LBT-RU/-RM session's ID
    lbtrm_group: Addr | None = None  # LBT-RM: (group, destination port); transport is then
    # (source IP, unicast port), what its datagrams come from


@dataclass
class _Held:
    payload: bytes
    retransmission: bool
    otr: bool = False


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


@dataclass(eq=False)
class SourceSession:
    """What the receiver knows and does for one source of its topic (see the module
    docstring): the per-source state that :class:`ReceiverCore` works on.

    Attributes:
        sid: small number naming the session in its timers and in the PREG ``marker``.
        key: (transport address, topic index): the source as topic resolution names it.
        name: the product's source string (``TCP:IP:PORT``, ``LBT-RU:IP:PORT``), put into
            every delivery.
        source: what the source's TIR said.
        transport_up: we hold a connection (or an LBT-RU session) to its transport.
        down_since: when the transport went away (None while it is up); a session down for
            :data:`DORMANT_LIFETIME` is forgotten.
        confirmed: its SRI vouched for it since the transport came back (live data counts).
        unconfirmed: live data that came before that SRI (up to :data:`UNCONFIRMED_MAXIMUM`
            messages): delivered in order once the SRI says which source sent it.
        The other attributes are the per-source flow of the module docstring.
    """

    sid: int
    key: tuple[Addr, int]
    name: str
    source: Source | None = None
    transport_up: bool = False
    down_since: float | None = None  # when its transport went away (None: it is up)
    confirmed: bool = True
    unconfirmed: list[tuple[int, bytes]] = field(default_factory=list)  # live data meanwhile
    sri_version: int = 0
    acktosrc: bool = False
    stores: dict[int, StoreReg] = field(default_factory=dict)
    group_sizes: dict[int, int] = field(default_factory=dict)
    complete: bool = False
    failed: bool = False
    next_sqn: int | None = None  # next sequence number to deliver
    high_seen: int | None = None
    held: dict[int, _Held] = field(default_factory=dict)
    missing: Gaps = field(default_factory=Gaps)  # to request, lowest first
    requests: dict[int, Request] = field(default_factory=dict)
    abandoned: set[int] = field(default_factory=set)  # given up, not yet stepped over
    consumed: int | None = None  # highest sequence number consumed in order
    consumed_out: set[int] = field(default_factory=set)  # consumed above it, out of order
    acked: int | None = None  # highest acknowledged to the stores
    _sri_requests: int = 0
    _rr: int = 0
    _chunk_work: bool = False  # messages of the current chunk await on_chunk_done
    assembling: Reassembly | None = None  # the fragmented message being delivered
    frag_ends: dict[int, int] = field(default_factory=dict)  # delivered: first -> last sqn
    otr: OtrCore | None = None  # the transport's gaps OTR waits for (reference_impl.otr)

    def store_at(self, addr: Addr) -> StoreReg | None:
        """Our registration with the store at ``addr``, if its SRI names it."""
        for reg in self.stores.values():
            if reg.info.addr == addr:
                return reg
        return None


MAX_SOURCES = 127
"""Most sources a receiver joins on its topic (each session's number is a 7-bit PREG
marker); the advertisements of more are dropped."""

DORMANT_LIFETIME = 300.0
"""Seconds a session whose source's transport went away is kept (so that the source, back on
the same or another transport, goes on in it); then it is forgotten, its timers (keepalives
to the stores) stop, and the stores' receiver activity timeout frees its RegIDs.  At
:data:`MAX_SOURCES` the session down longest gives way to a new source at once."""

MAX_FRAGMENT_ENDS = 10_000
"""Most delivered fragmented messages whose last fragment a receiver remembers for
:meth:`ReceiverCore.ack` (the oldest is forgotten first)."""

UNCONFIRMED_MAXIMUM = 10_000
"""Most live messages a session keeps while its source is not vouched for; more are dropped
(and recovered from the stores once the gap they leave is seen)."""

_T = TypeVar("_T")


class _PerSource(Generic[_T]):
    """An attribute of :class:`ReceiverCore` that is the current session's (``core._cur``):
    the single-source flow reads and writes it as before, on whichever source is handled."""

    name = ""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: ReceiverCore, owner: type | None = None) -> _T:
        value: _T = getattr(obj._cur, self.name)
        return value

    def __set__(self, obj: ReceiverCore, value: _T) -> None:
        setattr(obj._cur, self.name, value)


def source_name(source: Source) -> str:
    """The product's source string of a transport (``TCP:IP:PORT`` or ``LBT-RU:IP:PORT``)."""
    if source.lbtrm_group is not None:  # docs/wire-transports.md's LBTRM source string
        return (f"LBTRM:{source.transport[0]}:{source.transport[1]}:"
                f"{source.lbtru_session_id or 0:08x}:{source.lbtrm_group[0]}:"
                f"{source.lbtrm_group[1]}")
    kind = "TCP" if source.lbtru_session_id is None else "LBT-RU"
    return f"{kind}:{source.transport[0]}:{source.transport[1]}"


class ReceiverCore(ContextCore):
    """A persistent receiver of every source of one topic (see the module docstring).

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

    # the per-source flow's state: the current session's (see _PerSource)
    source: _PerSource[Source | None] = _PerSource()
    transport_up: _PerSource[bool] = _PerSource()
    sri_version: _PerSource[int] = _PerSource()
    acktosrc: _PerSource[bool] = _PerSource()
    stores: _PerSource[dict[int, StoreReg]] = _PerSource()
    group_sizes: _PerSource[dict[int, int]] = _PerSource()
    complete: _PerSource[bool] = _PerSource()
    failed: _PerSource[bool] = _PerSource()
    next_sqn: _PerSource[int | None] = _PerSource()
    high_seen: _PerSource[int | None] = _PerSource()
    held: _PerSource[dict[int, _Held]] = _PerSource()
    missing: _PerSource[Gaps] = _PerSource()
    requests: _PerSource[dict[int, Request]] = _PerSource()
    abandoned: _PerSource[set[int]] = _PerSource()
    consumed: _PerSource[int | None] = _PerSource()
    acked: _PerSource[int | None] = _PerSource()
    _sri_requests: _PerSource[int] = _PerSource()
    _rr: _PerSource[int] = _PerSource()
    _chunk_work: _PerSource[bool] = _PerSource()

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
        self.sessions: dict[tuple[Addr, int], SourceSession] = {}
        """Every source joined, by (transport address, topic index), the first joined first."""
        self._by_sid: dict[int, SourceSession] = {}
        self._by_addr: dict[Addr, list[SourceSession]] = {}  # transport/request address
        self._next_sid = 0
        # (store address, sequence number) -> the sessions that asked that store for it, in
        # order, with when (kept only while several sessions share a store: see _route_rx)
        self._owed: dict[tuple[Addr, int], deque[tuple[SourceSession, float]]] = {}
        self._idle = SourceSession(0, (("0.0.0.0", 0), 0), "")  # before any source is joined
        self._cur = self._idle
        self._request_idx = 0
        self.deregistering = False  # deregister() was called; not every store confirmed yet
        self.retains = False  # the application consumes deliveries itself (retain_messages)
        # delivery is consumption (the default), unless ACKs are explicit or it retains
        self._consume_on_delivery = not config.ume_explicit_ack_only
        self.deregistered = False  # every store confirmed the deregistration
        self.stats.update(delivered=0, retransmissions=0, duplicates=0, requests=0, lost=0,
                          unconfirmed=0, otr_requests=0)
        self.set_timer("resolve", now)

    # --- sessions -----------------------------------------------------------------------------

    @property
    def primary(self) -> SourceSession:
        """The first source joined (what the single-source attributes show between calls)."""
        return next(iter(self.sessions.values()), self._idle)

    def session(self, name: str) -> SourceSession | None:
        """The session of the source called ``name`` (its source string), if joined."""
        return next((s for s in self.sessions.values() if s.name == name), None)

    def _use(self, st: SourceSession) -> None:
        self._cur = st

    def _rest(self) -> None:
        """Back to the primary session once a call into the core is done."""
        self._cur = self.primary

    def _new_sid(self) -> int:
        """A session number no live session has (1-127: it is the PREG marker); the caller
        checks that one is left (:data:`MAX_SOURCES`)."""
        while True:
            self._next_sid = self._next_sid % MAX_SOURCES + 1
            if self._next_sid not in self._by_sid:
                return self._next_sid

    def _index(self) -> None:
        """Rebuild the address index of the sessions (their addresses changed)."""
        by_addr: dict[Addr, list[SourceSession]] = {}
        for st in self.sessions.values():
            src = st.source
            if src is None:
                continue
            by_addr.setdefault(src.transport, []).append(st)
            if src.request_addr is not None and src.request_addr != src.transport:
                by_addr.setdefault(src.request_addr, []).append(st)
        self._by_addr = by_addr

    def _add_session(self, key: tuple[Addr, int], source: Source) -> SourceSession:
        st = SourceSession(self._new_sid(), key, source_name(source), source)
        old = self.sessions.get(key)
        if old is not None:
            self._drop_session(old)
        self.sessions[key] = st  # a replaced session keeps its place in the order
        self._by_sid[st.sid] = st
        self._index()
        return st

    def _drop_session(self, st: SourceSession) -> None:
        for name in ("sri-request", "register", "rx", "ack", "keepalive", "otr"):
            self.cancel_timer(f"{name} {st.sid}")
        self._by_sid.pop(st.sid, None)

    def _forget(self, st: SourceSession) -> None:
        """Forget a session (its source is gone): timers, indexes, what it waited for."""
        self._drop_session(st)
        if self.sessions.get(st.key) is st:
            del self.sessions[st.key]
        self._index()
        if self._owed:
            for key in [k for k, owed in self._owed.items() if any(x[0] is st for x in owed)]:
                kept = deque(x for x in self._owed[key] if x[0] is not st)
                if kept:
                    self._owed[key] = kept
                else:
                    del self._owed[key]
        self.log(Level.INFO, f"{st.name}: source gone; forgetting it")

    def _evict(self) -> bool:
        """Make room for a new source: forget the session down longest, if any is down."""
        down = [st for st in self.sessions.values() if st.down_since is not None]
        if not down:
            return False
        self._forget(min(down, key=lambda st: st.down_since or 0.0))
        return True

    def _forget_dormant(self) -> None:
        """Forget the sessions down for :data:`DORMANT_LIFETIME`."""
        for st in [st for st in self.sessions.values() if st.down_since is not None and
                   self.now - st.down_since >= DORMANT_LIFETIME]:
            self._forget(st)
        self._rest()

    def _t(self, name: str) -> str:
        """The current session's timer called ``name``."""
        return f"{name} {self._cur.sid}"

    def _sessions_at(self, conn: Connection) -> list[SourceSession]:
        """The sessions whose source ``conn`` is our connection to (its transport or its
        request port): the only place their data and SRI may come from."""
        if not conn.outgoing:
            return []
        return self._by_addr.get(conn.remote, [])

    # --- application API ---------------------------------------------------------------------

    def ack(self, sqn: int, source: str | None = None) -> None:
        """Explicitly acknowledge consumption of everything up to ``sqn`` (in order) of the
        source called ``source`` (its source string; None: the first source joined): the
        application's ``lbm_msg_ume_send_explicit_ack`` (guide "Explicit Acknowledgments";
        with ``ume_explicit_ack_only`` 1 nothing else is acknowledged).

        One explicit ACK covers every earlier message (a store ACK is cumulative), so ACKs
        go out in ascending order only: an ``ack`` at or below what was acknowledged already
        sends nothing.  *Choice* (the guide is silent): a sequence number not delivered yet
        cannot have been consumed, so it is refused with a ValueError (one line)."""
        st = self._delivered_in(sqn, source, "acknowledge")
        self._use(st)
        try:
            sqn = self._fragments_consumed(sqn)
            if self.consumed is None or sqn > self.consumed:
                self.consumed = sqn
            self._send_acks()
        finally:
            self._rest()

    def _delivered_in(self, sqn: int, source: str | None, verb: str) -> SourceSession:
        """The session of ``source`` (None: the first), which delivered ``sqn`` already; a
        one-line ValueError otherwise."""
        st = self.primary if source is None else self.session(source)
        if st is None:
            raise ValueError(f"no source {source!r} on topic {self.topic!r}")
        if st.next_sqn is None or sqn >= st.next_sqn:
            upto = "nothing delivered yet" if st.next_sqn is None else \
                f"delivered up to {st.next_sqn - 1}"
            who = st.name or "the source"
            raise ValueError(f"cannot {verb} sequence number {sqn} of {who}: not "
                             f"delivered ({upto})")
        return st

    def retain_messages(self) -> None:
        """From now on the application consumes what is delivered itself, in any order, with
        :meth:`consume` (the C API's ``lbm_msg_retain`` of every message, then
        ``lbm_msg_delete``; Java/.NET ``dispose()``; guide "Message Consumption").  With
        ``ume_explicit_ack_only`` 1 consumption acknowledges nothing anyway."""
        self.retains = True
        self._consume_on_delivery = False

    def consume(self, sqn: int, source: str | None = None) -> None:
        """The application is done with delivered message ``sqn`` of ``source`` (see
        :meth:`retain_messages`; a fragmented message by its first sequence number).

        Consumption may come in any order; what is acknowledged is only the contiguous run
        consumed (guide "Batching Acknowledgments": consumed 1, 2, then 4, 5, 7, 8, 6, 10, 3
        - the next batch acknowledges 3 to 8), at the next ``ume_ack_batching_interval``, or
        at once without batching.  A number given up as lost counts as consumed (it will
        never be delivered; the ACK covers it, as it does when delivery is consumption).
        Without :meth:`retain_messages`, with ``ume_explicit_ack_only`` 1 or for a
        streaming source, it changes nothing.  A sequence number not delivered yet is a
        ValueError (one line)."""
        st = self._delivered_in(sqn, source, "consume")
        if not self.retains or self.config.ume_explicit_ack_only or not st.stores:
            return  # (a streaming source: nothing is acknowledged)
        self._use(st)
        try:
            last = self._fragments_consumed(sqn)
            if st.consumed is not None and last <= st.consumed:
                return
            st.consumed_out.update(range(sqn, last + 1))
            self._advance_consumed()
            if not self.config.ume_use_ack_batching:
                self._send_acks()
        finally:
            self._rest()

    def _advance_consumed(self) -> None:
        """Move the current session's consumption point over the contiguous run consumed."""
        st = self._cur
        out = st.consumed_out
        # nothing consumed yet: registration started delivery at 0 (see _check_complete)
        nxt = st.consumed + 1 if st.consumed is not None else 0
        while nxt in out:
            out.discard(nxt)
            nxt += 1
        if nxt > 0:
            st.consumed = nxt - 1

    @property
    def left(self) -> bool:
        """:meth:`deregister` was called (whether or not every store confirmed it yet)."""
        return self.deregistering or self.deregistered

    def deregister(self) -> None:
        """Deregister from every store of every source (``lbm_rcv_ume_deregister``; guide
        "RPP Deregistration").

        A PREG with the deregister flag goes to every store a registration was granted by;
        each confirmation (a PREG_RESP with the deregister flag) gives a
        :class:`~reference_impl.events.ReceiverDeregistered` for that store, and the last one
        a final ``ReceiverDeregistered(None)`` ("Deregistration Complete"), each with a log
        line.  From the call on, as the guide says, the receiver still receives (and
        delivers) what its sources send, but it no longer acknowledges consumption (no ACKs
        to the stores, none to the source, no keepalives) and never registers again (a
        restarted receiver does); what it still missed is unrecoverable at once
        (:class:`~reference_impl.events.UnrecoverableLoss`), and so is any gap after that.

        Choices where the guide is silent: an unconfirmed deregistration is repeated every
        ``ume_registration_interval`` (as the source does); a store that refuses it (it no
        longer knows us) counts as left, with a warning and no success event; a registration
        granted after the call is undone at once (a deregistration follows); a source first
        seen after the call is received without persistence, from its first message, like a
        streaming source.  With no registration granted at all there is nothing to wait for:
        deregistered at once."""
        if self.left:
            return
        self.deregistering = True
        try:
            for st in list(self.sessions.values()):
                self._use(st)
                for timer in ("ack", "keepalive", "sri-request"):
                    self.cancel_timer(self._t(timer))
                for reg in st.stores.values():
                    if reg.registered:
                        self._send_deregistration(reg)
                self._lose_unrecovered()
                self._stream_unregistered()
        finally:
            self._rest()
        owed = sum(1 for st in self.sessions.values() for r in st.stores.values() if r.leaving)
        self.log(Level.INFO, f"deregistering from {owed} store registration"
                             f"{'' if owed == 1 else 's'}")
        self._check_deregistered()

    def _send_deregistration(self, reg: StoreReg) -> None:
        """The current session's deregistration PREG to ``reg``'s store (repeated by the
        register timer until confirmed)."""
        reg.leaving = True
        reg.next_attempt = self.now + self.config.ume_registration_interval / 1000
        self.set_timer_if_later(self._t("register"), reg.next_attempt)
        self._to_store(reg, control(self._preg(reg, deregister=True)))

    def _check_deregistered(self) -> None:
        """"Deregistration Complete" once no store owes a confirmation."""
        if not self.deregistering or any(
                reg.leaving for st in self.sessions.values() for reg in st.stores.values()):
            return
        self.deregistering, self.deregistered = False, True
        self.emit(ReceiverDeregistered(None))
        self.log(Level.INFO, "deregistration complete: every store confirmed")

    def _lose_unrecovered(self) -> None:
        """After :meth:`deregister` nothing is recovered (guide: "Any messages not yet
        confirmed for that receiver are unrecoverable"): what the current session still
        asks for or misses is lost at once, and delivery steps over it."""
        st = self._cur
        nxt = st.next_sqn
        wanted = set(st.requests)
        for lo, hi in st.missing.ranges:
            wanted.update(range(lo, hi))
        st.requests.clear()
        st.missing = Gaps()
        lost = sorted(sqn for sqn in wanted
                      if sqn not in st.held and (nxt is None or sqn >= nxt))
        if lost:
            self._give_up(lost)

    def _stream_unregistered(self) -> None:
        """A session that never completed registration when the receiver deregistered is
        received without persistence from here on (see :meth:`deregister`): what it holds is
        delivered in order from its lowest sequence number."""
        st = self._cur
        if st.complete:
            return
        st.complete = True
        st.next_sqn = min(st.held) if st.held else None
        self._drain()

    @property
    def registered_stores(self) -> list[StoreReg]:
        """The current session's registered stores (the first source's between calls)."""
        return [s for s in self.stores.values() if s.registered]

    # --- resolution ---------------------------------------------------------------------------

    def on_lbmr(self, packet: lbmr.LbmrPacket, addr: Addr) -> None:
        for tir in packet.tirs:
            if not isinstance(tir, lbmr.Tir):
                continue  # queue records (QIR, type 6 packets) say nothing about sources
            if tir.name != self.topic:
                continue
            info = tir.info
            if isinstance(info, lbmr.LbtrmInfo):  # joined through self.join_group
                if not self.lbtrm_tir_ok(info, addr):
                    continue
                sid: int | None = info.session_id
                key = ((info.src_addr, info.src_ucast_port), tir.index)
            else:
                if isinstance(info, lbmr.LbtruInfo | lbmr.LbtruSidInfo) and self.lbtru_port:
                    sid = getattr(info, "session_id", 0)
                elif isinstance(info, lbmr.TcpInfo | lbmr.TcpSidInfo):
                    sid = None
                else:
                    continue
                key = ((info.ip, info.port), tir.index)
            known = self.sessions.get(key)
            if isinstance(info, lbmr.LbtrmInfo) and sid is not None and \
                    self._lbtrm_rerun(key[0], sid, (info.mcast_addr, info.udp_dest_port)):
                continue
            if isinstance(info, lbmr.LbtruInfo | lbmr.LbtruSidInfo) and sid is not None and \
                    self._lbtru_rerun(key[0], sid):
                continue
            if known is not None and known.transport_up:
                continue
            if known is None and len(self._by_sid) >= MAX_SOURCES and not self._evict():
                self.drop(addr, f"TIR of a source at {info.ip}:{info.port}: already "
                                f"{MAX_SOURCES} sources on topic {self.topic!r}", 0)
                continue
            try:
                self._join(key, tir, info, sid, known)
            finally:
                self._rest()

    def _lbtrm_rerun(self, transport: Addr, sid: int, group: Addr) -> bool:
        """True when an LBT-RM TIR of our topic needs no join: it names a run of the source
        already replaced (stale).  A new run of a source we receive takes over here, from the
        provisional session that started at its first datagram, else from now, on the group
        its TIR names (SessionReset follows: see
        :meth:`~reference_impl.context.ContextCore.promote_lbtrm`)."""
        if sid in self.lbtrm_retired.get(transport, ()):
            return True
        binding = self.lbtru_receiving(transport)
        if binding is None or binding.group is None:
            return False
        if getattr(binding.session, "session_id", None) != sid \
                and self.promote_lbtrm(transport, sid) is None:
            self.swap_lbtrm_session(binding, sid, group)
        return False

    def _lbtru_rerun(self, transport: Addr, sid: int) -> bool:
        """:meth:`_lbtrm_rerun` for LBT-RU: True for a TIR of a run already replaced; a TIR
        of our source's address under another session ID is its new run on the old port, and
        our session moves to it (SessionReset follows), else it would go on asking the new run
        to connect under the old ID."""
        if sid in self.lbtrm_retired.get(transport, ()):
            return True
        binding = self.lbtru_receiving(transport)
        if binding is not None and binding.group is None \
                and getattr(binding.session, "session_id", sid) != sid:
            self.swap_lbtru_session(binding, sid)
        return False

    def _join(self, key: tuple[Addr, int], tir: lbmr.Tir, info: lbmr.Record, sid: int | None,
              known: SourceSession | None) -> None:
        """Connect to a source's transport: a new source, or a known one coming back."""
        ume = next((o for o in (tir.options or []) if isinstance(o, lbmr.ToptUme)), None)
        persistent = ume is not None and bool(ume.store) and bool(self.config.ume_use_store)
        request = (ume.src_tcp_addr, ume.src_tcp_port) if ume is not None else None
        if request is None:  # a streaming source's request port: off-transport recovery asks
            exfunc = next((o for o in (tir.options or []) if isinstance(o, lbmr.ToptExfunc)),
                          None)  # its retention there (reference_impl/otr.py)
            if exfunc is not None and exfunc.src_tcp_port:
                request = (exfunc.src_ip_addr, exfunc.src_tcp_port)
        group = (info.mcast_addr, info.udp_dest_port) \
            if isinstance(info, lbmr.LbtrmInfo) else None
        source = Source(key[0], request, tir.index,
                        ume.transport_idx if ume is not None else 0, persistent, sid, group)
        if known is None:
            st = self._add_session(key, source)
        else:
            st = known
            st.source = source
            self._index()
        self._use(st)
        self.transport_up = True
        st.down_since = None
        if sid is None:
            self.send_to(source.transport, b"", tag="transport")
        else:
            old = self.lbtru_receiving(source.transport)
            if old is not None:
                self.close_lbtru(old)
            if group is not None:
                self.open_lbtrm_receiver(group, source.transport, sid, tag="transport")
            else:
                self.open_lbtru_receiver(self.lbtru_port, source.transport, sid,
                                         tag="transport")
        if known is not None:
            # a restarted source numbers its SRI versions afresh; our registrations stand
            # until its SRI says whether it is the same source (see _on_sri)
            self._source_back()
            self.log(Level.INFO, f"{st.name}: source back: transport "
                                 f"{source.transport[0]}:{source.transport[1]}")
            return
        if persistent:
            self.set_timer(self._t("sri-request"),
                           self.now + self.config.ume_sri_request_interval / 1000)
        else:
            self.complete = True  # streaming: deliver from the first message seen
        kind = "LBT-TCP" if sid is None else \
            f"{'LBT-RM' if group else 'LBT-RU'} session {sid:#x}"
        self.log(Level.INFO, f"topic resolved: {kind} transport "
                             f"{source.transport[0]}:{source.transport[1]} ({st.name})")

    def _source_back(self) -> None:
        """The current session's source is back (reconnected, or its LBT-RU session reset):
        its SRI versions count afresh, and until an SRI vouches for it its live data waits
        (see the module docstring)."""
        self.sri_version = 0
        src = self.source
        if self.stores and src is not None and src.persistent:
            self._cur.confirmed = False
            self._sri_requests = 0
            self.set_timer(self._t("sri-request"),
                           self.now + self.config.ume_sri_request_interval / 1000)

    # --- messages -----------------------------------------------------------------------------

    def _transport_session(self, conn: Connection, tidx: int) -> SourceSession | None:
        """The session whose source sends topic index ``tidx`` on ``conn``."""
        for st in self._sessions_at(conn):
            if st.source is not None and st.source.topic_idx == tidx:
                return st
        return None

    def _route_rx(self, store: Addr, sqn: int) -> SourceSession | None:
        """The session a retransmission of ``sqn`` from the store at ``store`` is for (see
        the module docstring); None: nobody asked for it (a late duplicate)."""
        sessions = self.sessions
        if len(sessions) == 1:
            return next(iter(sessions.values()))
        owed = self._owed.get((store, sqn))
        if owed:
            self._expire(owed)
            if owed:
                st = owed.popleft()[0]
                if not owed:
                    del self._owed[(store, sqn)]
                if st.sid in self._by_sid:
                    return st
        here = [st for st in sessions.values() if st.store_at(store) is not None]
        if len(here) == 1:
            return here[0]
        asked = [st for st in here if sqn in st.requests]
        return asked[0] if len(asked) == 1 else None

    def _expire(self, owed: deque[tuple[SourceSession, float]]) -> None:
        """Forget requests no store answered within ``retransmit_request_message_timeout``."""
        horizon = self.now - self.config.retransmit_request_message_timeout / 1000
        while owed and owed[0][1] < horizon:
            owed.popleft()

    def _shared(self, store: Addr, sqn: int) -> bool:
        """Another session asked the store at ``store`` for ``sqn`` and may still get it."""
        owed = self._owed.get((store, sqn))
        if not owed:
            return False
        self._expire(owed)
        cur = self._cur
        return any(st is not cur for st, _ in owed)

    def on_message_run(self, conn: Connection, data: bytes) -> int:
        # the recovery hot path: a store's retransmissions (or the source's data) back to back
        # in a chunk, read in place; exactly what on_raw_message does with each of them that
        # it takes (data of our topic from a peer allowed to send that type), and the first
        # message that is anything else ends the run
        if isinstance(conn.tag, StoreReg):
            allowed: tuple[int, ...] = (_RETRANS,)
            if len(self.sessions) != 1:
                return self._store_run(conn, data)
            st = self.primary
        else:
            sessions = self._sessions_at(conn)
            if len(sessions) != 1 or not sessions[0].confirmed:
                return 0  # message by message (a shared transport, or not vouched for yet)
            st = sessions[0]
            allowed = (_MESSAGE, _RETRANS)
        src = st.source
        if src is None:
            return 0
        self._use(st)
        try:
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
                    on_data(sqn, data[pos + size:pos + msglen],
                            retransmission=mtype == _RETRANS)
                pos += msglen
            return pos
        finally:
            self._rest()

    def _store_run(self, conn: Connection, data: bytes) -> int:
        """:meth:`on_message_run` for a store several sessions share: each retransmission
        to the session it is for."""
        unpack, size = _DATA_UNPACK, _DATA_SIZE
        store = conn.remote
        pos, end = 0, len(data)
        try:
            while end - pos >= size:
                ver_type, next_hdr, msglen, topic_idx, sqn = unpack(data, pos)
                if next_hdr or ver_type & _TYPE_MASK != _RETRANS or msglen < size or \
                        msglen > end - pos:
                    break
                self._retransmission(store, topic_idx, sqn, data[pos + size:pos + msglen])
                pos += msglen
            return pos
        finally:
            self._rest()

    def _retransmission(self, store: Addr, tidx: int, sqn: int, payload: bytes) -> None:
        st = self._route_rx(store, sqn)
        if st is None:
            self.stats["duplicates"] += 1  # nobody is waiting for it
            return
        if st.source is None or st.source.topic_idx != tidx:
            return  # another topic's
        self._use(st)
        self._on_data(sqn, payload, retransmission=True)

    def on_raw_message(self, conn: Connection, raw: bytes) -> None:
        if len(raw) >= _DATA_SIZE:
            mtype, next_hdr, tidx, sqn = data_fields(raw)
            if mtype in (MessageType.MESSAGE, MessageType.RETRANS) and next_hdr == 0:
                self._data(conn, int(mtype), tidx, sqn, raw[_DATA_SIZE:], len(raw))
                return
        super().on_raw_message(conn, raw)

    def _data(self, conn: Connection, mtype: int, tidx: int, sqn: int, payload: bytes,
              size: int) -> None:
        """One data message, to the session it is for."""
        if isinstance(conn.tag, StoreReg):
            if mtype != MessageType.RETRANS:
                self.drop(conn.remote, f"data message (sqn {sqn}) from a peer that is "
                                       f"neither the source nor a store", size)
                return
            try:
                self._retransmission(conn.remote, tidx, sqn, payload)
            finally:
                self._rest()
            return
        sessions = self._sessions_at(conn)
        if not sessions:
            if conn.outgoing and self._otr_from_source(conn, mtype, tidx, sqn, payload):
                return
            self.drop(conn.remote, f"data message (sqn {sqn}) from a peer that is "
                                   f"neither the source nor a store", size)
            return
        st = self._transport_session(conn, tidx)
        if st is None:
            return  # another topic of the source's transport session
        self._use(st)
        try:
            self._on_data(sqn, payload, retransmission=mtype == MessageType.RETRANS)
        finally:
            self._rest()

    def on_message(self, conn: Connection, message: LbmcMessage, raw: bytes) -> None:
        if message.is_data_type:
            payload = message.payload
            frag = message.header(Frag)
            if frag is not None:  # one fragment of a large message (reference_impl/fragments)
                payload = FragmentPiece(payload, frag.first_sqn, frag.offset, frag.len)
            self._data(conn, int(message.type), message.tidx, message.sqn, payload, len(raw))
            return
        sri = message.header(Sri)
        if sri is not None:
            sessions = self._sessions_at(conn)
            if not sessions:
                self.drop(conn.remote, "SRI from a peer that is not the source", len(raw))
                return
            tidx = message.header(TopicIdx)
            st = next((s for s in sessions if s.source is not None and
                       (tidx is None or tidx.tidx == s.source.topic_idx)), None)
            if st is not None:
                self._use(st)
                try:
                    self._on_sri(sri, message)
                finally:
                    self._rest()
            return
        if not isinstance(conn.tag, StoreReg):
            if not conn.outgoing:
                # nobody has a reason to connect to a receiver and talk first
                self.drop(conn.remote, f"unexpected message from a stranger "
                                       f"({message.label()})", len(raw))
            return
        regs = [(st, reg) for st in self.sessions.values()
                if (reg := st.store_at(conn.remote)) is not None]
        for _, reg in regs:
            reg.last_heard = self.now
        try:
            for header in message.headers:
                if isinstance(header, UmePregResp):
                    found = self._response_for(header, regs)
                    if found is not None:
                        self._use(found[0])
                        self._on_preg_resp(found[1], header)
                elif isinstance(header, UmeKeepalive) and header.r_flag:
                    asked = [x for x in regs if x[1].reg_id == header.reg_id] or regs
                    for st, reg in asked:
                        self._use(st)
                        self._keepalive(reg)
        finally:
            self._rest()

    @staticmethod
    def _response_for(resp: Header, regs: list[tuple[SourceSession, StoreReg]]
                      ) -> tuple[SourceSession, StoreReg] | None:
        """The registration a PREG_RESP answers: the session its marker names, else the only
        one registering there, else the first not registered yet (module docstring)."""
        for st, reg in regs:
            if st.sid == resp.marker:
                return st, reg
        if len(regs) == 1:
            return regs[0]
        return next(((st, reg) for st, reg in regs if not reg.registered), None)

    def on_connection_lost(self, conn: Connection, *, refused: bool) -> None:
        try:
            if isinstance(conn.tag, StoreReg):
                for st in list(self.sessions.values()):
                    store = st.store_at(conn.remote)
                    if store is not None and store.registered:
                        self._use(st)
                        store.registered = False
                        store.next_attempt = self.now + \
                            self.config.ume_registration_interval / 1000
                        self.set_timer_if_later(self._t("register"), store.next_attempt)
                        self.log(Level.WARNING, f"{st.name}: lost store {store.info.index} "
                                                f"{store.info.addr}")
            elif conn.tag == "transport":
                for st in self._sessions_at(conn):
                    if st.source is not None and st.source.transport == conn.remote:
                        self._use(st)
                        self.log(Level.WARNING, f"{st.name}: source transport connection "
                                                f"lost; resolving again")
                        self.transport_up = False
                        st.down_since = self.now
                self.set_timer_if_later(
                    "resolve", self.now + self.config.resolver_query_interval / 1000)
        finally:
            self._rest()

    def on_lbtru_event(self, binding: LbtruBinding, event: LbtruEvent) -> None:
        # Lost needs nothing here: the session then delivers what follows the loss, whose
        # LBMC sequence numbers open the gap that OTR fills from the stores (_transport_gap)
        conn = binding.conn
        if isinstance(event, Lost):
            kind = "LBT-RU" if binding.group is None else "LBT-RM"
            self.log(Level.INFO, f"{kind} transport lost sqn {event.first}..{event.last} "
                                 f"({event.reason}); off-transport recovery")
        elif isinstance(event, Connected):
            self.log(Level.INFO, f"LBT-RU session connected (client ID {event.client_id})")
        elif isinstance(event, SessionReset):
            # the source restarted: a restarted source numbers its SRI versions afresh
            for st in self._sessions_at(conn) if conn is not None else []:
                self._use(st)
                self._source_back()
            self._rest()
            self.log(Level.INFO, "LBT-RU session reset by the source; reconnecting"
                     if binding.group is None else "LBT-RM: the source restarted (a new "
                     f"session {getattr(binding.session, 'session_id', 0):#x}); receiving it")
        elif isinstance(event, SourceTimedOut | ConnectFailed) and conn is not None:
            self.close_lbtru(binding)  # like a transport connection that went away
            self.on_connection_lost(conn, refused=isinstance(event, ConnectFailed))

    # --- SRI and registration ----------------------------------------------------------------

    @staticmethod
    def _pairs(message: LbmcMessage) -> set[tuple[Addr, int]]:
        """The (store address, source RegID) pairs an SRI names."""
        return {((h.store_ip_addr, h.store_tcp_port), h.src_reg_id) for h in message.headers
                if isinstance(h, UmeStoreExt | UmeStore)}

    @staticmethod
    def _known(st: SourceSession) -> set[tuple[Addr, int]]:
        """The (store address, source RegID) pairs a session registered for."""
        return {(r.info.addr, r.source_reg_id) for r in st.stores.values()}

    def _same_source(self, message: LbmcMessage) -> bool:
        """The SRI names one of the (store, source RegID) pairs we registered for (or we
        registered for none): it is the source we know, not a new one on its transport."""
        if not self.stores:
            return True
        named = self._pairs(message)
        return not named or bool(named & self._known(self._cur))

    def _adopt_moved(self, message: LbmcMessage) -> None:
        """A new transport's first SRI names the source RegIDs of a session whose transport
        went away: the same source, restarted on another port.  That session goes on here
        (its registrations, order and ACKs), as it would have on the old port."""
        cur = self._cur
        if cur.stores:
            return
        named = self._pairs(message)
        old = next((st for st in self.sessions.values() if st is not cur and
                    not st.transport_up and named & self._known(st)), None)
        if old is None or cur.source is None:
            return
        self.log(Level.NOTICE, f"{cur.name}: the source of {old.name} is back on this "
                               f"transport; its registrations and delivery order go on")
        del self.sessions[old.key]
        self._drop_session(cur)
        old.key, old.source, old.name = cur.key, cur.source, cur.name
        old.transport_up, old.sri_version, old.confirmed = True, 0, True
        old.down_since = None
        self.sessions[cur.key] = old
        self._index()
        self._use(old)
        for sqn in sorted(cur.held):  # its live data so far, held by the new session
            item = cur.held[sqn]
            self._on_data(sqn, item.payload, retransmission=item.retransmission)

    def _on_sri(self, sri: Header, message: LbmcMessage) -> None:
        self._adopt_moved(message)
        cur = self._cur
        waiting, cur.unconfirmed = cur.unconfirmed, []
        if not self._same_source(message):
            assert cur.source is not None
            self.log(Level.NOTICE, f"{cur.name}: a new source on this transport (its SRI names "
                                   f"none of the source RegIDs we registered for): "
                                   f"registering afresh")
            st = self._add_session(cur.key, cur.source)
            st.transport_up = cur.transport_up
            self._use(st)
        self._cur.confirmed = True
        for sqn, payload in waiting:  # the source's live data since it came back, in order
            self._on_data(sqn, payload, retransmission=False)
        if self.failed or (sri.version <= self.sri_version and self.stores):
            return
        self.cancel_timer(self._t("sri-request"))
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
                    # our RegID at that store is ours for that source RegID only
                    same = known is not None and known.source_reg_id == header.src_reg_id \
                        and known.info.addr == info.addr
                    reg = StoreReg(info, header.src_reg_id, version,
                                   reg_id=known.reg_id if known is not None and same else 0)
                    self.stores[header.store_idx] = reg
                    changed.append(reg)
        if self.left:
            self._stream_unregistered()  # a new source after deregister(): see there
            return
        if changed and self.complete:
            self.emit(RegistrationChange(
                f"SRI version {sri.version}: re-registering with stores "
                f"{[r.info.index for r in changed]}"))
        for reg in changed:
            self._register(reg)

    def _to_store(self, reg: StoreReg, data: bytes) -> None:
        """Write to a store on our connection to it: one per store, shared by every session
        registered there, tagged with the first registration it was opened for (the tag
        says "a store"; which session a message from it is for is decided per message)."""
        self.send_to(reg.info.addr, data, tag=reg)

    def _preg(self, reg: StoreReg, deregister: bool = False) -> Header:
        """The PREG for ``reg``: the RPP flag for a blocking or non-blocking RPP receiver
        (never under a profile without RPP), the deregister flag when leaving."""
        cfg = self.config
        src = self.source
        assert src is not None
        reg_id = reg.reg_id or cfg.reg_id
        return UmePreg(s_flag=0, w_flag=int(cfg.rpp_mode != SPP), d_flag=int(deregister),
                       marker=self._cur.sid,
                       reg_id=0 if cfg.ume_session_id and not reg.reg_id else reg_id,
                       transport_idx=src.transport_idx, topic_idx=src.topic_idx,
                       src_reg_id=reg.source_reg_id, resp_port=self.request_addr[1],
                       resp_ip=self.request_addr[0])

    def _register(self, reg: StoreReg) -> None:
        if self.left:
            return  # a deregistered receiver never registers again (see deregister)
        cfg = self.config
        headers: list[object] = [self._preg(reg), Topicname(topic=self.topic)]
        if cfg.ume_session_id:
            headers.append(UmeSid(sid=cfg.ume_session_id))
        if cfg.ume_activity_timeout or cfg.ume_state_lifetime:
            headers.append(UmeClientLifetime(activity_tmo=cfg.ume_activity_timeout,
                                             lifetime=cfg.ume_state_lifetime))
        # a non-blocking receiver says so with an option after the PREG (docs/wire-lbmc.md
        # §2.3); a blocking one needs none
        headers.extend(option.header() for option in receiver_options(cfg.rpp_mode))
        reg.next_attempt = self.now + cfg.ume_registration_interval / 1000
        self.set_timer_if_later(self._t("register"), reg.next_attempt)
        self._to_store(reg, control(*headers))

    def _on_preg_resp(self, reg: StoreReg, resp: Header) -> None:
        if resp.d_flag and not resp.e_flag:
            self._left_store(reg, confirmed=True)
            return
        if resp.e_flag and reg.leaving:
            self._left_store(reg, confirmed=False)
            return
        if resp.e_flag:
            code = resp.error_code
            # "RegID in use" passes once the holder's activity timeout at the store ran out
            # (strong RegIDs: a restarted receiver that cannot prove it is the holder waits
            # for that), so it is retried every ume_registration_interval, as the source
            # retries it; every other refusal is final
            retried = code in _IN_USE
            reg.failed = not retried
            text = f"{self._cur.name}: store {reg.info.index} refused registration " \
                   f"(code {code}" + (f", {_IN_USE[code]}: asking again every "
                                      f"{self.config.ume_registration_interval} ms)"
                                      if retried else ")")
            about_rpp = self.config.rpp_mode != SPP and code == PregError.ECONFIG
            if about_rpp:
                text = (f"RPP Receiver Registration Failure: {text}: source and store "
                        f"configuration incompatible (the source's repository is not RPP, or "
                        f"this receiver's mode differs from its first registration's; the "
                        f"store's log says which)")
            self.emit(ReceiverRegistrationError(reg.info, code, text, rpp=about_rpp))
            self.log(Level.ERROR, text)
            return
        if reg.registered:
            return
        reg.registered, reg.old = True, bool(resp.o_flag)
        reg.reg_id, reg.low, reg.high = resp.reg_id, resp.low_seqnum, resp.high_seqnum
        reg.last_heard = self.now
        # a pre-5.3 receiver does not know the flag: whatever the bit says, it is not read
        acknowledged = self.config.rpp_supported and bool(resp.w_flag)
        self.emit(ReceiverRegistrationSuccess(reg.info, resp.reg_id, reg.source_reg_id,
                                              reg.old, resp.low_seqnum, acknowledged))
        if self.config.rpp_mode != SPP and not acknowledged:
            self._rpp_not_acknowledged(reg)
        if self.left:
            # granted after deregister(): undone at once (see deregister)
            self.deregistering, self.deregistered = True, False
            self._send_deregistration(reg)
            return
        if not self.complete:
            self._check_complete()
        elif self.acked is not None:
            self._send_ack_to(reg, self.acked)

    def _rpp_not_acknowledged(self, reg: StoreReg) -> None:
        """The matrix's "Granted - Receiver Error" (docs/semantics.md §2.1): the store granted
        without acknowledging RPP.  *Choice*, as for the source: the registration is kept and
        counted (the guide calls the cell "Granted"), and the application is told, once per
        registration, with an event and an ERROR line."""
        text = (f"Granted - Receiver Error: {self._cur.name}: store {reg.info.index} "
                f"{reg.info.addr} granted the RPP registration without acknowledging RPP "
                f"(its repository is not receiver-paced; a store before 5.3?)")
        self.emit(RppNotAcknowledged("receiver", reg.info, text, self._cur.name))
        self.log(Level.ERROR, text)

    def _left_store(self, reg: StoreReg, *, confirmed: bool) -> None:
        """A store answered our deregistration: confirmed ("Deregistration Success"), or
        refused because it no longer knows us (counted as left, see :meth:`deregister`)."""
        if not reg.leaving:
            return  # an answer to a repeated deregistration, or one we never sent
        reg.leaving = reg.registered = False
        where = f"{self._cur.name}: store {reg.info.index} {reg.info.addr}"
        if confirmed:
            self.emit(ReceiverDeregistered(reg.info, self._cur.name))
            self.log(Level.INFO, f"{where}: deregistration confirmed")
        else:
            self.log(Level.WARNING, f"{where} refused the deregistration (it holds no "
                                    f"registration of ours); counted as left")
        self._check_deregistered()

    def _check_complete(self) -> None:
        """Registration completes once the stores that answered satisfy the intragroup and
        intergroup rules (:mod:`reference_impl.quorum`), at the consensus low sequence number
        of their answers (per group, then across groups), adjusted by :meth:`_low_sqn`.

        *Choice* (the product documents the two stability behaviours for sources only, and
        the SRI does not carry them): a receiver reads the same two options in its own scope,
        with the source's defaults (``quorum`` / ``any``), so a receiver configured like its
        source completes registration by the same rule."""
        cfg = self.config
        sizes = self._group_sizes()
        registered = self.registered_stores
        counts: dict[int, int] = {}
        for reg in registered:
            counts[reg.info.group] = counts.get(reg.info.group, 0) + 1
        complete, _ = quorum.registration_complete(
            cfg.ume_retention_intragroup_stability_behavior,
            cfg.ume_retention_intergroup_stability_behavior, sizes, counts)
        if not complete:
            return
        answers: dict[int, list[int]] = {}
        for reg in registered:
            answers.setdefault(reg.info.group, []).append(reg.low)
        consensus = quorum.consensus(answers, cfg.ume_consensus_sequence_number_behavior)
        high_candidates = [r.high for r in registered if r.high or r.old]
        if self.high_seen is not None:
            high_candidates.append(self.high_seen)
        high = max(high_candidates) if high_candidates else consensus - 1
        low = self._low_sqn(consensus, high)
        self.complete = True
        self.next_sqn = low
        if self.consumed is None or self.consumed < low - 1:
            self.consumed = low - 1 if low > 0 else None
        self.acked = self.consumed
        self.emit(ReceiverRegistrationComplete(low, high))
        self.log(Level.INFO, f"{self._cur.name}: registration complete: low {low}, "
                             f"high {high}")
        self.missing = Gaps()
        self.missing.add(low, high + 1)
        self._forget_below(low)
        self._drain()
        self._request_more()
        self._arm_ack_timers()

    def _group_sizes(self) -> dict[int, int]:
        """Group index -> configured size, as the SRI's store groups say; a group the SRI
        names stores of but no size for has the size of the stores it names."""
        sizes = dict(self.group_sizes)
        for reg in self.stores.values():
            if reg.info.group not in self.group_sizes:
                sizes[reg.info.group] = sizes.get(reg.info.group, 0) + 1
        return sizes

    def _low_sqn(self, consensus: int, high: int) -> int:
        """Where delivery starts (guide "Recovery Management"; docs/semantics.md §1.9): the
        consensus low sequence number, no earlier than ``high - retransmit_request_maximum``
        when that is set; the recovery callback may choose any other number, and a callback
        that returns the consensus number unchanged leaves the maximum in force (the guide's
        example: consumed 0, high 6, maximum 2 -> 4; the callback reaches 0, 2, 3, 5 or 6,
        but 1 only with the maximum 0).  Never beyond ``high + 1`` (UM 6.13)."""
        maximum = self.config.retransmit_request_maximum
        low = max(consensus, high - maximum) if maximum else consensus
        if self.recovery_callback is not None:
            chosen = self.recovery_callback(consensus, high)
            if chosen != consensus:
                low = chosen
        return min(low, high + 1)

    def _arm_ack_timers(self) -> None:
        cfg = self.config
        if self.left:
            return
        if cfg.ume_use_ack_batching and not cfg.ume_explicit_ack_only:
            self.set_timer(self._t("ack"), self.now + cfg.ume_ack_batching_interval / 1000)
        if cfg.ume_proactive_keepalive_interval:
            self.set_timer(self._t("keepalive"),
                           self.now + cfg.ume_proactive_keepalive_interval / 1000)

    # --- data and recovery ------------------------------------------------------------------

    def _on_data(self, sqn: int, payload: bytes, *, retransmission: bool) -> None:
        st = self._cur  # the hot path: the session's attributes, not the forwarding ones
        if retransmission:
            self.stats["retransmissions"] += 1
        elif not st.confirmed:
            # a source back, not vouched for by its SRI yet: kept until it is
            self.stats["unconfirmed"] += 1
            if len(st.unconfirmed) < UNCONFIRMED_MAXIMUM:
                st.unconfirmed.append((sqn, payload))
            return
        st.requests.pop(sqn, None)  # live or retransmitted, it is here: stop asking for it
        otr = st.otr is not None and st.otr.received(sqn) and retransmission
        high = st.high_seen
        if high is None or sqn > high:
            nxt = st.next_sqn
            if st.complete and nxt is not None:
                # a gap above everything seen (or, before anything was seen, above where
                # delivery starts: a source that sent before we joined its transport)
                base = nxt if high is None or high + 1 < nxt else high + 1
                if sqn > base and high is not None:
                    self._transport_gap(st, base, sqn)  # off-transport recovery's
                elif sqn > base:
                    st.missing.add(base, sqn)
            st.high_seen = sqn
        if st.next_sqn is None:
            if not st.complete:
                st.held[sqn] = _Held(payload, retransmission)
                return
            st.next_sqn = sqn  # streaming source: start at the first message seen
        nxt = st.next_sqn
        if sqn < nxt or sqn in st.held:
            self.stats["duplicates"] += 1
            return
        if st.complete:
            st._chunk_work = True  # drain, acknowledge and ask for more once per chunk
            if sqn == nxt:  # the common case: in order, deliver at once
                if isinstance(payload, FragmentPiece):
                    st.next_sqn = sqn + 1
                    self._fragment_delivered(st, sqn, payload, retransmission)
                    return
                self.emit(MessageDelivered(sqn, payload, retransmission, st.name, otr))
                self.stats["delivered"] += 1
                st.next_sqn = sqn + 1
                if self._consume_on_delivery:
                    st.consumed = sqn
                return
        st.held[sqn] = _Held(payload, retransmission, otr)

    def on_chunk_done(self, conn: Connection) -> None:
        shared = isinstance(conn.tag, StoreReg) and len(self.sessions) > 1
        try:
            for st in self.sessions.values():
                if st._chunk_work:
                    st._chunk_work = False
                    self._use(st)
                    self._drain()
                    if st.otr is not None and len(st.held) > \
                            self.config.otr_message_caching_threshold and len(st.otr):
                        self._otr_overflow(st)
                    cfg = self.config
                    if not cfg.ume_use_ack_batching and not cfg.ume_explicit_ack_only:
                        self._send_acks()
                    self._request_more()
                elif shared and st.missing.ranges:
                    # a shared store answered: requests another session waited for may go now
                    self._use(st)
                    self._request_more()
        finally:
            self._rest()

    def _drain(self) -> None:
        """Deliver what is held from ``next_sqn`` on, stepping over abandoned numbers."""
        held, abandoned = self.held, self.abandoned
        nxt = self.next_sqn
        if nxt is None or (nxt not in held and nxt not in abandoned):
            return
        requests = self.requests
        emit = self.emit
        name = self._cur.name
        delivered, last = 0, None
        while True:
            item = held.pop(nxt, None)
            if item is not None and isinstance(item.payload, FragmentPiece):
                requests.pop(nxt, None)
                abandoned.discard(nxt)
                if self._fragment_delivered(self._cur, nxt, item.payload, item.retransmission,
                                            count=False):
                    delivered += 1
                    last = nxt
            elif item is not None:
                emit(MessageDelivered(nxt, item.payload, item.retransmission, name, item.otr))
                requests.pop(nxt, None)
                delivered += 1
                last = nxt
                if abandoned:
                    abandoned.discard(nxt)  # it came after all
            elif nxt in abandoned:
                abandoned.discard(nxt)
                if self.retains and self._cur.stores:  # never delivered, never consumed:
                    self._cur.consumed_out.add(nxt)  # counted as consumed (see consume)
            else:
                break
            nxt += 1
        if self.retains and self._cur.consumed_out:
            self._advance_consumed()
        self.stats["delivered"] += delivered
        if last is not None and self._consume_on_delivery:
            self.consumed = last
        self.next_sqn = nxt
        cfg = self.config
        if not cfg.ume_use_ack_batching and not cfg.ume_explicit_ack_only:
            self._send_acks()

    def _fragment_delivered(self, st: SourceSession, sqn: int, piece: FragmentPiece,
                            retransmission: bool, *, count: bool = True) -> bool:
        """Fragment ``sqn`` reached delivery (in sequence-number order, like every message):
        it joins its message, which is delivered once, when complete; returns whether it was.

        Choices (issue 17; docs where the guide is silent): the message is delivered with
        its *first* fragment's sequence number (as the product numbers a reassembled
        message), as a retransmission when any of its fragments was one; the consumption
        point moves to its *last* fragment, so the ACK covers every fragment (and
        :meth:`ack` of the delivered sequence number does the same).  A message one of whose
        fragments was lost for good, or whose start came before this receiver's first
        sequence number, cannot be completed: it is dropped, with a WARNING, when the next
        message begins; the loss itself was reported (:class:`UnrecoverableLoss`)."""
        work = st.assembling
        if work is None or work.first_sqn != piece.first_sqn or work.total != piece.total:
            if work is not None and not work.complete:
                self.log(Level.WARNING, f"{st.name}: fragmented message {work.first_sqn} "
                                        f"incomplete ({work.have} of {work.total} bytes: a "
                                        f"fragment was lost), not delivered")
            work = st.assembling = Reassembly(piece.first_sqn, piece.total)
        if not work.add(piece.offset, bytes(piece)):
            self.log(Level.WARNING, f"{st.name}: fragment {sqn} of message {piece.first_sqn} "
                                    f"overruns its {piece.total}-byte total: dropped")
            return False
        work.retransmission = work.retransmission or retransmission
        if not work.complete:
            return False
        st.assembling = None
        self.emit(MessageDelivered(work.first_sqn, work.payload(), work.retransmission,
                                   st.name))
        if count:
            self.stats["delivered"] += 1
        if work.first_sqn != sqn:
            ends = st.frag_ends
            ends[work.first_sqn] = sqn
            if len(ends) > MAX_FRAGMENT_ENDS:
                ends.pop(next(iter(ends)))
        if self._consume_on_delivery:
            st.consumed = sqn
        return True

    def _fragments_consumed(self, sqn: int) -> int:
        """What the application's :meth:`ack` of ``sqn`` consumes: a delivered fragmented
        message's last fragment when ``sqn`` is its (first) sequence number."""
        return self._cur.frag_ends.get(sqn, sqn)

    def _request_more(self) -> None:
        """Ask for the lowest missing sequence numbers, up to the outstanding maximum.

        Called for every message while recovering, so it returns at once when nothing can be
        asked for (whenever a request is outstanding the "rx" timer is armed already)."""
        missing, requests = self.missing, self.requests
        if not missing.ranges or self.next_sqn is None:
            return
        if self.deregistering or self.deregistered:
            self._lose_unrecovered()  # nothing is recovered any more (see deregister)
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
        shared = len(self.sessions) > 1
        waiting = False
        while len(requests) < limit:
            sqn = missing.take(floor)
            if sqn is None:
                break
            floor = sqn + 1
            if sqn in held or sqn in requests:
                continue  # arrived meanwhile, or asked for already
            store = stores[self._rr % len(stores)]
            self._rr += 1
            if shared and self._shared(store.info.addr, sqn):
                free = [s for s in stores if not self._shared(s.info.addr, sqn)]
                if not free:
                    missing.add(sqn, sqn + 1)  # another session's request first
                    waiting = True
                    break
                store = free[0]
            requests[sqn] = Request(now, now, store.info.index)
            batches.setdefault(store.info.index, []).append(sqn)
        for store in stores:
            sqns = batches.get(store.info.index)
            if sqns:
                self._send_rxreqs(store, sqns)
        if requests or waiting:
            self.set_timer_if_later(
                self._t("rx"), now + self.config.retransmit_request_interval / 1000)

    # --- off-transport recovery (reference_impl.otr) ---------------------------------------

    def _transport_gap(self, st: SourceSession, base: int, sqn: int) -> None:
        """The transport skipped ``[base, sqn)`` after registration: with ``use_otr`` for
        this (persistent) source it is asked for by OTR, paced; without, or from a streaming
        source, it is lost at once (stores take no part in transport recovery: guide
        "Receiver Recovery"), and delivery goes on.  Numbers the registration recovery still
        asks for stay its own."""
        if st.missing.ranges:
            base = max(base, st.missing.ranges[-1][1])
        if st.requests:
            base = max(base, max(st.requests) + 1)
        if sqn <= base:
            return
        persistent = bool(st.stores)
        asks = persistent or (st.source is not None and st.source.request_addr is not None)
        if not asks or not otr_applies(self.config.use_otr, persistent):
            # without OTR (or a streaming source that names no request port) nothing is
            # asked: lost, and delivery goes on
            why = f"use_otr is {self.config.use_otr}" if asks else "no request port"
            self.log(Level.WARNING, f"{st.name}: transport lost sqn {base}..{sqn - 1} and "
                                    f"{why}: not recovered")
            self._give_up(list(range(base, sqn)))
            return
        if st.otr is None:
            st.otr = OtrCore(self.config.otr_settings)
        st.otr.gap(base, sqn, self.now)
        self._arm_otr(st)

    def _arm_otr(self, st: SourceSession) -> None:
        due = st.otr.deadline() if st.otr is not None else None
        name = f"otr {st.sid}"
        if due is None:
            self.cancel_timer(name)
        else:
            self.set_timer(name, due)

    def _otr_overflow(self, st: SourceSession) -> None:
        """More messages held behind OTR gaps than ``otr_message_caching_threshold``: the
        gaps are given up (lost), and what is held is delivered (reference_impl/otr.py)."""
        assert st.otr is not None
        lost = st.otr.give_up_all()
        self.log(Level.WARNING, f"{st.name}: {len(st.held)} messages held behind off-transport "
                                f"recovery exceed otr_message_caching_threshold "
                                f"{self.config.otr_message_caching_threshold}: "
                                f"{len(lost)} messages given up")
        self._arm_otr(st)
        self._give_up(list(lost))

    def _otr_due(self) -> None:
        """Send the OTR requests due now (each attempt of a gap to the next registered
        store), give up what timed out."""
        st = self._cur
        otr = st.otr
        if otr is None:
            return
        otr.forget_below(st.next_sqn or 0)
        stores = self.registered_stores
        for action in otr.due(self.now):
            if isinstance(action, OtrLost):
                self._give_up(list(action.sequence_numbers))
                continue
            sqns = [s for s in action.sequence_numbers if s not in st.held]
            src = self.source
            if sqns and not st.stores and src is not None and src.request_addr is not None:
                # a streaming source: its retention, on its request port
                self.stats["otr_requests"] += len(sqns)
                self._send_source_rxreqs(src, sqns)
                self.emit(OtrRequested(sqns[0], sqns[-1], len(sqns), action.attempt,
                                       src.request_addr, st.name))
                continue
            if not sqns or not stores or src is None:
                continue  # no store to ask now: asked again at the next interval
            store = stores[(action.attempt - 1 + st.sid) % len(stores)]
            self.stats["otr_requests"] += len(sqns)
            self._send_rxreqs(store, sqns)
            self.emit(OtrRequested(sqns[0], sqns[-1], len(sqns), action.attempt,
                                   store.info.addr, st.name))
        self._arm_otr(st)

    def _send_source_rxreqs(self, src: Source, sqns: list[int]) -> None:
        """OTR requests to a streaming source's request port (no RegID: ``id_2`` 0)."""
        assert src.request_addr is not None
        self.send_to(src.request_addr, self._rxreqs(src.transport_idx, 0, sqns))

    def _rxreqs(self, transport_idx: int, id_2: int, sqns: list[int]) -> bytes:
        """One RXREQ per sequence number, each with the next request index."""
        values = _RXREQ.template(transport_idx=transport_idx, id_2=id_2,
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
        return b"".join(out)

    def _otr_from_source(self, conn: Connection, mtype: int, tidx: int, sqn: int,
                         payload: bytes) -> bool:
        """A retransmission on our connection to a streaming source's request port, of a
        number OTR asked it for: taken (True).  Anything else there is not."""
        if mtype != MessageType.RETRANS:
            return False
        for st in self.sessions.values():
            src = st.source
            if src is not None and src.request_addr == conn.remote and not st.stores \
                    and src.topic_idx == tidx and st.otr is not None and sqn in st.otr:
                self._use(st)
                try:
                    self._on_data(sqn, payload, retransmission=True)
                finally:
                    self._rest()
                return True
        return False

    def _send_rxreqs(self, store: StoreReg, sqns: list[int]) -> None:
        """One RXREQ per sequence number, written to the store in one go."""
        src = self.source
        assert src is not None
        data = self._rxreqs(src.transport_idx, store.reg_id, sqns)
        self.stats["requests"] += len(sqns)
        if len(self.sessions) > 1:  # who asked, for _route_rx
            owed, cur, now = self._owed, self._cur, self.now
            for sqn in sqns:
                owed.setdefault((store.info.addr, sqn), deque()).append((cur, now))
        self._to_store(store, data)

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
                if len(self.sessions) > 1:
                    others = [s for s in others if not self._shared(s.info.addr, sqn)]
                    if not others:
                        continue  # another session's request for it first
                store = others[req.tries % len(others)]
                req.last, req.store, req.tries = self.now, store.info.index, req.tries + 1
                self._send_rxreqs(store, [sqn])
        if lost:
            self._give_up(sorted(lost))
        self._request_more()
        if self.requests:
            self.set_timer(self._t("rx"), self.now + interval)

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
        if self._owed:
            self._forget_owed(lost)
        self._drain()

    def _forget_owed(self, sqns: list[int]) -> None:
        """This session no longer waits for ``sqns``: its requests for them stop counting in
        :attr:`_owed` (so that they do not pile up when no store ever answers)."""
        cur = self._cur
        for sqn in sqns:
            for reg in self.stores.values():
                key = (reg.info.addr, sqn)
                owed = self._owed.get(key)
                if owed is None:
                    continue
                kept = deque(x for x in owed if x[0] is not cur)
                if kept:
                    self._owed[key] = kept
                else:
                    del self._owed[key]

    def _forget_below(self, sqn: int) -> None:
        """Drop held messages below ``sqn`` (the delivery point jumped over them)."""
        held = self.held
        for stale in [s for s in held if s < sqn]:
            del held[stale]

    # --- acknowledgements -------------------------------------------------------------------

    def _send_acks(self) -> None:
        if self.consumed is None or (self.acked is not None and self.consumed <= self.acked) \
                or self.left:
            return  # (a deregistered receiver acknowledges nothing: see deregister)
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
        if self.left:
            return
        src = self.source
        assert src is not None
        self._to_store(store, _ACK.pack(
            type=AckType.CDELV, transport_idx=src.transport_idx, id_2=store.reg_id,
            rcv_reg_id=store.reg_id, seqnum=sqn))

    def _keepalive(self, store: StoreReg) -> None:
        src = self.source
        if src is None or self.left:
            return  # a deregistered receiver keeps no store alive (not even when asked)
        if self.acked is not None:
            self._send_ack_to(store, self.acked)
        else:
            self._to_store(store, control(UmeKeepalive(
                type=KeepaliveType.RECEIVER, transport_idx=src.transport_idx,
                topic_idx=src.topic_idx, reg_id=store.reg_id)))

    # --- timers -------------------------------------------------------------------------------

    def on_timer(self, name: str) -> None:
        cfg = self.config
        if name == "resolve":
            # the sustaining query phase: a source that starts later is found too, and the
            # resolver daemon keeps relaying to a context it hears from
            self.send_lbmr(lbmr.LbmrPacket(tqrs=[lbmr.Tqr(name=self.topic)]))
            self.set_timer("resolve", self.now + cfg.resolver_query_interval / 1000)
            self._forget_dormant()
            return
        kind, _, sid = name.partition(" ")
        st = self._by_sid.get(int(sid)) if sid.isdigit() else None
        if st is None:
            return
        self._use(st)
        try:
            self._session_timer(kind)
        finally:
            self._rest()

    def _session_timer(self, kind: str) -> None:
        """The current session's timer called ``kind`` passed."""
        cfg = self.config
        if kind == "sri-request":
            self._sri_request()
        elif kind == "register" and self.left:
            # only unconfirmed deregistrations repeat (see deregister)
            owed = [reg for reg in self.stores.values() if reg.leaving]
            for reg in owed:
                if self.now >= reg.next_attempt:
                    self._send_deregistration(reg)
            if owed:
                self.set_timer_if_later(self._t("register"),
                                        min(r.next_attempt for r in owed))
        elif kind == "register":
            waiting = [reg for reg in self.stores.values()
                       if not reg.registered and not reg.failed]
            for reg in waiting:
                if self.now >= reg.next_attempt:
                    self._register(reg)
            if waiting:
                # a store lost before its retry time is due still needs a timer of its own
                self.set_timer_if_later(self._t("register"),
                                        min(r.next_attempt for r in waiting))
        elif kind == "rx":
            self._retry_requests()
        elif kind == "otr":
            self._otr_due()
        elif kind == "ack":
            self._send_acks()
            self.set_timer(self._t("ack"), self.now + cfg.ume_ack_batching_interval / 1000)
        elif kind == "keepalive":
            for store in self.registered_stores:
                self._keepalive(store)
            self.set_timer(self._t("keepalive"),
                           self.now + cfg.ume_proactive_keepalive_interval / 1000)

    def _sri_request(self) -> None:
        cfg = self.config
        src = self.source
        if src is None or (self.stores and self._cur.confirmed) or src.request_addr is None \
                or self.left:
            return
        if self._sri_requests >= cfg.ume_sri_request_maximum:
            self.failed = True
            text = f"{self._cur.name}: no SRI after {self._sri_requests} SRI requests: " \
                   f"registration failed"
            self.emit(ReceiverRegistrationError(None, -1, text))
            self.log(Level.ERROR, text)
            return
        self._sri_requests += 1
        self.send_to(src.request_addr, control(SriReq(transport_idx=src.transport_idx,
                                                      topic_idx=src.topic_idx)))
        self.set_timer(self._t("sri-request"), self.now + cfg.ume_sri_request_interval / 1000)
