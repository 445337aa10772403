"""LBT-RU transport sessions, sans-IO: the source side and the receiver side of one session.

LBT-RU is UM's reliable unicast transport over UDP (``docs/wire-transports.md`` §1;
the packet formats are :mod:`wire.lbtru`).  A source context owns a UDP port; each transport
session on it is named by a session ID (the SID option, also in the 10-byte TIR).  Receivers
connect, the source numbers its datagrams, receivers NAK what they miss and the source
retransmits from a window of recent datagrams, or says it cannot (NCF).  Persistence sits on
top: what the transport declares lost a persistent receiver recovers from the stores.

These two classes hold only the transport state machine, in the shape of the other cores
(``receive(data, addr, now)``, ``datagrams_to_send(now)``, ``get_timer()``,
``handle_timer(now)``, ``next_event()``).  They do not parse LBMC: a DATA payload goes in and
comes out as bytes, so a store, source or receiver core can put them on its UDP port as it
does its LBMR traffic.

The fact sheet gives the packet layouts, and infers the handshake only from the names.  What
this module does where it is silent (each choice has a test in
``tests/reference_impl/test_lbtru_session.py``):

* **Handshake.**  A receiver sends CREQ (request SYN) every ``connect_interval`` until the
  source answers with an SM whose SYN flag is set; that SM carries a CID option with the client
  ID the source assigned.  After ``maximum_connect_attempts`` unanswered CREQs the receiver
  gives up (:class:`ConnectFailed`).  A CREQ from a known client is answered with the SYN again
  (its first answer may have been lost).
* **Where a receiver starts.**  At the first sequence number after the SYN's ``lead_sqn`` (or
  at the first DATA, if that arrives first): the transport has no late join; a persistent
  receiver recovers older messages from its stores.
* **Sequence numbers** start at 0 per session.  Before any DATA an SM says ``lead_sqn``
  0xFFFFFFFF (one before 0) and ``trail_sqn`` 0.  Comparisons are modulo 2**32.
* **Retransmission.**  A NAKed sequence number inside the retention window
  (``transmission_window_size`` bytes of payload) is retransmitted (DATA with the RX flag) to the
  client that asked, at most once per ``ignore_interval``; within that interval the source
  answers NCF "NAK Ignored" (the receiver backs off and NAKs again later), and for a sequence
  number older than the window NCF "Do not retry" (the receiver declares it lost at once).
* **Session messages** go to every client ``sm_minimum_interval`` after the last DATA, then at
  doubling intervals up to ``sm_maximum_interval``.  They carry the leading and trailing edges,
  so a receiver that lost the newest DATA finds out.
* **Liveness.**  Receivers send an ACK (the last sequence number delivered in order) every
  ``acknowledgement_interval``; a source forgets a client it has not heard from for
  ``client_activity_timeout`` (:class:`ClientTimedOut`).  A receiver that hears nothing from
  its source for ``activity_timeout`` reports :class:`SourceTimedOut`.  A NAK or ACK from an
  unknown client (the source restarted) is answered with RST; a receiver that gets RST starts
  over with a new CREQ (:class:`SessionReset`).
* **NAK timing** follows the product's options: the first NAK for a gap after a random
  ``nak_initial_backoff_interval`` in [0.5, 1.5) times the value, the next ones after
  ``nak_backoff_interval`` randomized the same way, and a sequence number still missing
  ``nak_generation_interval`` after it went missing is lost (:class:`Lost`).
* **Option placement.**  Every packet of a session with a non-zero session ID carries the SID
  option (tshark keys sessions by it for every type); NAK and ACK also carry the CID.  RST
  carries no option, because tshark mis-reads RST options (see :mod:`wire.lbtru`).

Defaults are the product's (UM Configuration Guide, "Transport LBT-RU Reliability Options" and
"Transport LBT-RU Operation Options"); ``nak_initial_backoff_interval`` is taken to be LBT-RM's
50 ms (our choice: that guide page does not state it for LBT-RU).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from wire import lbtru
from wire.errors import WireError

Addr = tuple[str, int]

SQN_MASK = 0xFFFFFFFF
_HALF = 1 << 31
NAKS_PER_PACKET = 256
"""NAK/NCF list entries per datagram at most (1 KiB of list: far from any MTU problem)."""
MAX_GAP = 1 << 14
"""A jump of more sequence numbers than this is not NAKed number by number: the older part is
declared lost at once.  Each number NAKed costs an entry that every NAK timer walks, so this
bounds what one datagram (perhaps forged: LBT-RU is UDP) can cost the receiver: 16,384 entries,
a few milliseconds.  Our choice; the guide names no such limit.  A real loss that large (a
16,384-message hole, about 1.6 s of a 10,000 msg/s source) is reported as unrecoverable at once
rather than NAKed: OTR or the stores recover it, as they do for a window overrun."""

_DATA = lbtru.DATA_FAST
_OPTION = lbtru.SidOption.fast  # every LBT-RU option: next_hdr, hdr_len, flags, u32 value
_TYPE = lbtru.VER_TYPE_BITS["type"]


def unwrap(value: int, near: int) -> int:
    """The integer congruent to the 32-bit ``value`` that lies closest to ``near``."""
    return near + ((value - near + _HALF) & SQN_MASK) - _HALF


# --- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LbtruSourceSettings:
    """A source's transport options (seconds, bytes).

    Attributes:
        session_id: the SID of this session (0: no SID option, the 6-byte TIR form).
        transmission_window_size: payload bytes kept for retransmission
            (``transport_lbtru_transmission_window_size``, 24 MiB).
        sm_minimum_interval / sm_maximum_interval: session-message pacing when idle
            (``transport_lbtru_sm_minimum_interval`` 200 ms, ``..._maximum_interval`` 10 s).
        ignore_interval: NAKs for a sequence number retransmitted this recently are answered
            "NAK Ignored" (``transport_lbtru_ignore_interval``, 500 ms).
        client_activity_timeout: a client not heard from this long is dropped
            (``transport_lbtru_client_activity_timeout``, 10 s).
    """

    session_id: int = 0
    transmission_window_size: int = 25_165_824
    sm_minimum_interval: float = 0.2
    sm_maximum_interval: float = 10.0
    ignore_interval: float = 0.5
    client_activity_timeout: float = 10.0


@dataclass(frozen=True)
class LbtruReceiverSettings:
    """A receiver's transport options (seconds).

    Attributes:
        connect_interval / maximum_connect_attempts: CREQ pacing
            (``transport_lbtru_connect_interval`` 100 ms, ``..._maximum_connect_attempts`` 50).
        nak_initial_backoff_interval: delay before the first NAK of a gap (randomized).
        nak_backoff_interval: delay between NAKs for one sequence number (randomized;
            ``transport_lbtru_nak_backoff_interval``, 200 ms).
        nak_generation_interval: a sequence number missing this long is lost
            (``transport_lbtru_nak_generation_interval``, 10 s).
        acknowledgement_interval: ACK pacing (``transport_lbtru_acknowledgement_interval``,
            100 ms).
        activity_timeout: silence from the source this long ends the session
            (``transport_lbtru_activity_timeout``, 60 s).
    """

    connect_interval: float = 0.1
    maximum_connect_attempts: int = 50
    nak_initial_backoff_interval: float = 0.05
    nak_backoff_interval: float = 0.2
    nak_generation_interval: float = 10.0
    acknowledgement_interval: float = 0.1
    activity_timeout: float = 60.0


# --- events -------------------------------------------------------------------------------------
# Transport-level outputs of these sessions.  They are not application events (those live in
# reference_impl/events.py): the core that owns a session turns them into its own.


@dataclass(frozen=True, slots=True)
class ClientConnected:
    """Source side: a receiver completed the handshake."""

    addr: Addr  #: the receiver's UDP address
    client_id: int  #: the CID the source assigned it


@dataclass(frozen=True, slots=True)
class ClientTimedOut:
    """Source side: a receiver was silent for ``client_activity_timeout`` and was dropped."""

    addr: Addr  #: the receiver's UDP address
    client_id: int  #: its CID


@dataclass(frozen=True, slots=True)
class Connected:
    """Receiver side: the source answered the CREQ."""

    client_id: int  #: the CID the source assigned us
    next_sqn: int  #: the first transport sequence number this receiver will deliver


@dataclass(frozen=True, slots=True)
class Delivered:
    """Receiver side: one DATA payload, in transport order, exactly once."""

    sqn: int  #: the transport sequence number (32-bit, as on the wire)
    payload: bytes  #: the LBMC message(s) of the datagram
    retransmission: bool  #: it came as a retransmission (RX flag)


@dataclass(frozen=True, slots=True)
class Lost:
    """Receiver side: transport sequence numbers ``first``..``last`` will never arrive."""

    first: int  #: first lost sqn (32-bit)
    last: int  #: last lost sqn (32-bit), inclusive
    reason: str  #: "ncf" (the source said so), "window" (behind its trailing edge), "timeout"


@dataclass(frozen=True, slots=True)
class ConnectFailed:
    """Receiver side: ``maximum_connect_attempts`` CREQs went unanswered."""

    attempts: int  #: CREQs sent


@dataclass(frozen=True, slots=True)
class SessionReset:
    """Receiver side: the source sent RST (it restarted or forgot us); reconnecting."""


@dataclass(frozen=True, slots=True)
class SourceTimedOut:
    """Receiver side: nothing from the source for ``activity_timeout``; the session ended."""

    silent_for: float  #: seconds since the last packet from the source


Event = (ClientConnected | ClientTimedOut | Connected | Delivered | Lost | ConnectFailed
         | SessionReset | SourceTimedOut)


# --- shared plumbing ----------------------------------------------------------------------------


class _Endpoint:
    """What both session ends share: outbox, events and named timers (a heap with lazy
    deletion), as in the other cores.  Subclasses implement :meth:`_on_timer`."""

    def __init__(self, now: float) -> None:
        self.now = now
        self._out: list[tuple[bytes, Addr]] = []
        self._events: deque[Event] = deque()
        self._deadlines: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        self.dropped = 0

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        out, self._out = self._out, []
        return out

    def next_event(self) -> Event | None:
        return self._events.popleft() if self._events else None

    def get_timer(self) -> float | None:
        while self._heap:
            at, name = self._heap[0]
            if self._deadlines.get(name) == at:
                return at
            heapq.heappop(self._heap)
        return None

    def handle_timer(self, now: float) -> None:
        self.now = now
        while self._heap and self._heap[0][0] <= now:
            at, name = heapq.heappop(self._heap)
            if self._deadlines.get(name) == at:
                del self._deadlines[name]
                self._on_timer(name)

    def _set_timer(self, name: str, at: float) -> None:
        if self._deadlines.get(name) != at:
            self._deadlines[name] = at
            heapq.heappush(self._heap, (at, name))

    def _cancel_timer(self, name: str) -> None:
        self._deadlines.pop(name, None)

    def _on_timer(self, name: str) -> None:
        raise NotImplementedError

    def _parse(self, data: bytes) -> lbtru.LbtruPacket | None:
        try:
            return lbtru.parse_packet(data, decode_lbmc=False)
        except WireError:
            self.dropped += 1
            return None


def _sid_options(session_id: int) -> list[lbtru.LbtruOption]:
    return [lbtru.SidOption(session_id=session_id)] if session_id else []


# --- source side --------------------------------------------------------------------------------


@dataclass
class _Client:
    client_id: int
    last_heard: float


class LbtruSourceSession(_Endpoint):
    """The source end of one LBT-RU transport session (see the module docstring).

    Args:
        settings: the session's options, including its session ID.
        now: the current time.
    """

    def __init__(self, settings: LbtruSourceSettings | None = None, *, now: float = 0.0) -> None:
        super().__init__(now)
        self.settings = settings or LbtruSourceSettings()
        self.session_id = self.settings.session_id
        self.clients: dict[Addr, _Client] = {}
        self.next_sqn = 0  # unwrapped
        self._retained: OrderedDict[int, bytes] = OrderedDict()
        self._retained_bytes = 0
        self._last_rx: dict[int, float] = {}
        self._next_cid = 1
        self._sm_sqn = 0
        self._sm_interval = self.settings.sm_minimum_interval
        self.stats = {"data": 0, "retransmissions": 0, "naks": 0, "ncfs": 0, "sms": 0}
        # the DATA header's next_hdr and the option bytes, built once by the wire/ classes
        template = lbtru.LbtruData(sqn=0, trail_sqn=0, options=_sid_options(self.session_id))
        built = template.build()
        self._data_next_hdr = built[1]
        self._data_options = built[_DATA.size:]

    # --- the sans-IO interface ------------------------------------------------------------------

    @property
    def lead_sqn(self) -> int:
        """The newest sequence number sent (32-bit; 0xFFFFFFFF before the first)."""
        return (self.next_sqn - 1) & SQN_MASK

    @property
    def trail_sqn(self) -> int:
        """The oldest sequence number still retransmittable (32-bit)."""
        oldest = next(iter(self._retained), self.next_sqn)
        return oldest & SQN_MASK

    def send(self, payload: bytes, now: float) -> int:
        """Send one DATA datagram carrying ``payload`` (LBMC bytes) to every connected
        receiver; returns its sequence number.  It is retained for retransmission."""
        self.now = now
        sqn = self.next_sqn
        self.next_sqn += 1
        self._retained[sqn] = payload
        self._retained_bytes += len(payload)
        window = self.settings.transmission_window_size
        while self._retained_bytes > window and len(self._retained) > 1:
            _old, dropped = self._retained.popitem(last=False)
            self._retained_bytes -= len(dropped)
            self._last_rx.pop(_old, None)
        if self.clients:
            datagram = self._data(sqn, payload, rx=False)
            out = self._out
            for addr in self.clients:
                out.append((datagram, addr))
        self.stats["data"] += 1
        self._sm_interval = self.settings.sm_minimum_interval
        self._arm_sm()
        return sqn & SQN_MASK

    def forget(self) -> None:
        """Stop holding every datagram sent so far, as a transmission window that moved past
        them does: a NAK for any of them is answered "do not retry" from now on, so the
        receivers' transport gives them up (the conformance harness's source uses it to
        lose datagrams for good)."""
        self._retained.clear()
        self._retained_bytes = 0
        self._last_rx.clear()

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        """A datagram from a receiver (CREQ, NAK or ACK) for this session."""
        self.now = now
        packet = self._parse(data)
        if packet is None:
            return
        if isinstance(packet, lbtru.LbtruCreq):
            self._on_creq(addr)
            return
        client = self.clients.get(addr)
        if not isinstance(packet, lbtru.LbtruNak | lbtru.LbtruAck):
            self.dropped += 1  # DATA/SM/NCF/RST flow the other way
            return
        if client is None:
            self._out.append((lbtru.LbtruRst(reason=lbtru.RST_DEFAULT).build(), addr))
            return
        client.last_heard = now
        if isinstance(packet, lbtru.LbtruNak):
            self.stats["naks"] += 1
            self._on_nak(addr, list(packet.naks))

    # --- internals ------------------------------------------------------------------------------

    def _data(self, sqn: int, payload: bytes, *, rx: bool) -> bytes:
        header = _DATA.pack({"ver_type": lbtru.PacketType.DATA, "next_hdr": self._data_next_hdr,
                             "flags": lbtru.FLAG_RX if rx else 0, "sqn": sqn & SQN_MASK,
                             "trail_sqn": self.trail_sqn})
        return header + self._data_options + payload

    def _on_creq(self, addr: Addr) -> None:
        client = self.clients.get(addr)
        if client is None:
            client = self.clients[addr] = _Client(self._next_cid, self.now)
            self._next_cid += 1
            self._events.append(ClientConnected(addr, client.client_id))
            self._arm_activity()
        client.last_heard = self.now
        self._out.append((self._sm(syn=True, client_id=client.client_id), addr))
        self._arm_sm()

    def _sm(self, *, syn: bool = False, client_id: int | None = None) -> bytes:
        options = _sid_options(self.session_id)
        if client_id is not None:
            options.append(lbtru.CidOption(client_id=client_id))
        self._sm_sqn += 1
        self.stats["sms"] += 1
        return lbtru.LbtruSm(sm_sqn=self._sm_sqn & SQN_MASK, lead_sqn=self.lead_sqn,
                             trail_sqn=self.trail_sqn, syn=int(syn), options=options).build()

    def _on_nak(self, addr: Addr, naks: list[int]) -> None:
        ignored: list[int] = []
        gone: list[int] = []
        near = self.next_sqn
        oldest = next(iter(self._retained), self.next_sqn)
        for raw in naks:
            sqn = unwrap(raw, near)
            if sqn >= self.next_sqn:
                continue  # never sent: nothing to say
            payload = self._retained.get(sqn)
            if payload is None:
                if sqn < oldest:
                    gone.append(raw)
                continue
            last = self._last_rx.get(sqn)
            if last is not None and self.now - last < self.settings.ignore_interval:
                ignored.append(raw)
                continue
            self._last_rx[sqn] = self.now
            self.stats["retransmissions"] += 1
            self._out.append((self._data(sqn, payload, rx=True), addr))
        for reason, sqns in ((lbtru.NcfReason.NO_RETRY, gone),
                             (lbtru.NcfReason.IGNORED, ignored)):
            for i in range(0, len(sqns), NAKS_PER_PACKET):
                self.stats["ncfs"] += 1
                ncf = lbtru.LbtruNcf(trail_sqn=self.trail_sqn, reason=int(reason),
                                     format=lbtru.FORMAT_SELECTIVE,
                                     ncfs=sqns[i:i + NAKS_PER_PACKET],
                                     options=_sid_options(self.session_id))
                self._out.append((ncf.build(), addr))

    def _arm_sm(self) -> None:
        if self.clients:
            self._set_timer("sm", self.now + self._sm_interval)

    def _arm_activity(self) -> None:
        if self.clients:
            oldest = min(c.last_heard for c in self.clients.values())
            self._set_timer("activity", oldest + self.settings.client_activity_timeout)

    def _on_timer(self, name: str) -> None:
        if name == "sm":
            if self.clients:
                for addr in self.clients:
                    self._out.append((self._sm(), addr))
                self._sm_interval = min(self._sm_interval * 2, self.settings.sm_maximum_interval)
                self._arm_sm()
        elif name == "activity":
            limit = self.settings.client_activity_timeout
            for addr, client in list(self.clients.items()):
                if self.now - client.last_heard >= limit:
                    del self.clients[addr]
                    self._events.append(ClientTimedOut(addr, client.client_id))
            self._arm_activity()


# --- receiver side ------------------------------------------------------------------------------


@dataclass
class _Missing:
    since: float
    nak_at: float
    naks: int = 0


@dataclass
class _ReceiverState:
    connected: bool = False
    attempts: int = 0
    client_id: int | None = None
    expected: int | None = None  # unwrapped next sqn to deliver
    high: int | None = None  # unwrapped highest sqn known to exist
    buffer: dict[int, tuple[bytes, bool]] = field(default_factory=dict)
    missing: dict[int, _Missing] = field(default_factory=dict)
    last_heard: float = 0.0


class LbtruReceiverSession(_Endpoint):
    """The receiver end of one LBT-RU transport session (see the module docstring).

    Args:
        source: the source's LBT-RU UDP address (from its TIR).
        session_id: the session ID (from the 10-byte TIR form; 0 for the 6-byte form).
        settings: the receiver's transport options.
        now: the current time; the first CREQ goes out at once.
        seed: seeds the NAK backoff randomization (deterministic runs).
    """

    def __init__(self, source: Addr, session_id: int = 0,
                 settings: LbtruReceiverSettings | None = None, *, now: float = 0.0,
                 seed: int = 0) -> None:
        super().__init__(now)
        self.source = source
        self.session_id = session_id
        self.settings = settings or LbtruReceiverSettings()
        self._rng = random.Random(seed)
        self.state = _ReceiverState(last_heard=now)
        self.closed = False
        self.stats = {"delivered": 0, "duplicates": 0, "naks": 0, "lost": 0, "acks": 0}
        self._connect()

    # --- the sans-IO interface ------------------------------------------------------------------

    @property
    def connected(self) -> bool:
        return self.state.connected

    def get_timer(self) -> float | None:
        return None if self.closed else super().get_timer()

    def handle_timer(self, now: float) -> None:
        if not self.closed:
            super().handle_timer(now)

    @property
    def missing(self) -> list[int]:
        """The 32-bit sequence numbers currently missing (being NAKed), oldest first."""
        return [s & SQN_MASK for s in sorted(self.state.missing)]

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        """A datagram from the source (DATA, SM, NCF or RST) for this session."""
        self.now = now
        if self.closed or addr != self.source:
            self.dropped += 1
            return
        st = self.state
        if len(data) >= _DATA.size:
            fast = self._data_fast(data)
            if fast is not None:
                st.last_heard = now
                self._on_data(*fast)
                return
        packet = self._parse(data)
        if packet is None:
            return
        if packet.session_id != self.session_id and not isinstance(packet, lbtru.LbtruRst):
            self.dropped += 1  # another session on the same source port
            return
        st.last_heard = now
        if isinstance(packet, lbtru.LbtruData):
            payload = packet.payload if isinstance(packet.payload, bytes) else b""
            self._on_data(packet.sqn, packet.trail_sqn, bool(packet.rx), payload)
        elif isinstance(packet, lbtru.LbtruSm):
            self._on_sm(packet)
        elif isinstance(packet, lbtru.LbtruNcf):
            self._on_ncf(packet)
        elif isinstance(packet, lbtru.LbtruRst):
            self._events.append(SessionReset())
            self.state = _ReceiverState(last_heard=now)
            self._connect()
        else:
            self.dropped += 1

    def close(self) -> None:
        """Stop: no more datagrams or timers."""
        self.closed = True

    # --- internals ------------------------------------------------------------------------------

    def _data_fast(self, data: bytes) -> tuple[int, int, bool, bytes] | None:
        """(sqn, trail, rx, payload) of a DATA datagram, walking its options with the derived
        option layout; None for another type or options that do not check out (the full
        parser then decides)."""
        ver_type, next_hdr, flags, sqn, trail = _DATA.unpack_from(data)
        if _TYPE.get(ver_type) != lbtru.PacketType.DATA:
            return None
        offset = _DATA.size
        sid = 0
        while next_hdr:
            if len(data) < offset + _OPTION.size:
                return None
            next_hdr_2, hdr_len, _flags, value = _OPTION.unpack_from(data, offset)
            if hdr_len < _OPTION.size:
                return None
            if next_hdr == lbtru.OptionCode.SID:
                sid = value
            next_hdr = next_hdr_2
            offset += hdr_len
        if sid != self.session_id:
            return None  # the full parser drops it (and counts it)
        return sqn, trail, bool(flags & lbtru.FLAG_RX), bytes(data[offset:])

    def _options(self) -> list[lbtru.LbtruOption]:
        options = _sid_options(self.session_id)
        if self.state.client_id is not None:
            options.append(lbtru.CidOption(client_id=self.state.client_id))
        return options

    def _connect(self) -> None:
        st = self.state
        if st.attempts >= self.settings.maximum_connect_attempts:
            self._events.append(ConnectFailed(st.attempts))
            self.close()
            return
        st.attempts += 1
        creq = lbtru.LbtruCreq(request=lbtru.CREQ_SYN, options=_sid_options(self.session_id))
        self._out.append((creq.build(), self.source))
        self._set_timer("connect", self.now + self.settings.connect_interval)

    def _start(self, next_sqn: int) -> None:
        """Fix where delivery starts (first SYN or first DATA)."""
        st = self.state
        if st.expected is None:
            st.expected = next_sqn
            st.high = next_sqn - 1

    def _on_sm(self, packet: lbtru.LbtruSm) -> None:
        st = self.state
        if packet.syn and not st.connected:
            st.connected = True
            st.client_id = packet.client_id
            self._cancel_timer("connect")
            self._start((packet.lead_sqn + 1) & SQN_MASK)
            assert st.expected is not None
            self._events.append(Connected(st.client_id or 0, st.expected & SQN_MASK))
            self._set_timer("ack", self.now + self.settings.acknowledgement_interval)
            self._arm_activity()
        if st.expected is None:
            return
        lead = unwrap(packet.lead_sqn, st.expected)
        self._note_up_to(lead)
        self._apply_trail(packet.trail_sqn)

    def _on_data(self, raw_sqn: int, raw_trail: int, rx: bool, payload: bytes) -> None:
        st = self.state
        if st.expected is None:
            self._start(raw_sqn)
        assert st.expected is not None
        sqn = unwrap(raw_sqn, st.expected)
        if sqn < st.expected or sqn in st.buffer:
            self.stats["duplicates"] += 1
        elif sqn == st.expected:
            st.missing.pop(sqn, None)
            if st.high is None or sqn > st.high:
                st.high = sqn
            self._deliver(sqn, payload, rx)
            self._advance()
        else:
            st.missing.pop(sqn, None)
            self._note_up_to(sqn - 1)
            st.buffer[sqn] = (payload, rx)
            if st.high is None or sqn > st.high:
                st.high = sqn
        self._apply_trail(raw_trail)

    def _deliver(self, sqn: int, payload: bytes, rx: bool) -> None:
        st = self.state
        self.stats["delivered"] += 1
        self._events.append(Delivered(sqn & SQN_MASK, payload, rx))
        st.expected = sqn + 1

    def _advance(self) -> None:
        """Deliver what waits in order.  A number at or below ``high`` that is neither
        buffered nor missing was declared lost, so delivery steps over it: in one jump to the
        next number that is buffered or missing, however long the lost run (a far trailing
        edge or lead can make it up to 2^31 numbers)."""
        st = self.state
        assert st.expected is not None and st.high is not None
        while st.expected <= st.high and st.expected not in st.missing:
            if st.expected in st.buffer:
                payload, rx = st.buffer.pop(st.expected)
                self._deliver(st.expected, payload, rx)
            else:
                after = st.expected
                st.expected = min((n for n in itertools.chain(st.buffer, st.missing)
                                   if n > after), default=st.high + 1)
                st.expected = min(st.expected, st.high + 1)

    def _note_up_to(self, last: int) -> None:
        """Sequence numbers up to ``last`` exist: the ones not here yet become missing."""
        st = self.state
        assert st.expected is not None and st.high is not None
        first = max(st.high + 1, st.expected)
        if last < first:
            return
        if last - first + 1 > MAX_GAP:
            self._lose(first, last - MAX_GAP, "window")
            first = last - MAX_GAP + 1
        backoff = self.settings.nak_initial_backoff_interval
        for sqn in range(first, last + 1):
            if sqn not in st.buffer and sqn not in st.missing:
                st.missing[sqn] = _Missing(self.now, self.now + backoff * self._jitter())
        st.high = max(st.high, last)
        self._arm_nak()

    def _apply_trail(self, raw_trail: int) -> None:
        """Everything before the source's trailing edge that is still missing is lost."""
        st = self.state
        assert st.expected is not None
        trail = unwrap(raw_trail, st.expected)
        if trail <= st.expected:
            return
        lost = sorted(s for s in st.missing if s < trail)
        for sqn in lost:
            del st.missing[sqn]
        self._report_runs(lost, "window")
        if st.high is not None and trail - 1 > st.high:
            self._lose(st.high + 1, trail - 1, "window")  # never seen, already gone
            st.high = trail - 1
        self._skip_to(trail)

    def _skip_to(self, target: int) -> None:
        """Move delivery past lost numbers up to ``target`` and deliver what is buffered,
        visiting only the buffered numbers (the trail may be 2^31 ahead)."""
        st = self.state
        assert st.expected is not None
        for sqn in sorted(n for n in st.buffer if st.expected <= n < target):
            payload, rx = st.buffer.pop(sqn)
            self._deliver(sqn, payload, rx)
        st.expected = max(st.expected, target)
        self._advance()

    def _lose(self, first: int, last: int, reason: str) -> None:
        self.stats["lost"] += last - first + 1
        self._events.append(Lost(first & SQN_MASK, last & SQN_MASK, reason))

    def _report_runs(self, sqns: list[int], reason: str) -> None:
        if not sqns:
            return
        start = prev = sqns[0]
        for sqn in sqns[1:]:
            if sqn != prev + 1:
                self._lose(start, prev, reason)
                start = sqn
            prev = sqn
        self._lose(start, prev, reason)

    def _on_ncf(self, packet: lbtru.LbtruNcf) -> None:
        st = self.state
        if st.expected is None:
            return
        sqns = [unwrap(s, st.expected) for s in packet.ncfs]
        if packet.reason == lbtru.NcfReason.NO_RETRY:
            gone = sorted(s for s in sqns if s in st.missing)
            for sqn in gone:
                del st.missing[sqn]
            self._report_runs(gone, "ncf")
            self._advance()
        else:  # ignored, delayed or shed: the source is busy with it; ask again later
            later = self.now + self.settings.nak_backoff_interval * self._jitter()
            for sqn in sqns:
                entry = st.missing.get(sqn)
                if entry is not None:
                    entry.nak_at = max(entry.nak_at, later)
            self._arm_nak()
        self._apply_trail(packet.trail_sqn)

    def _jitter(self) -> float:
        return 0.5 + self._rng.random()

    def _arm_nak(self) -> None:
        st = self.state
        if st.missing:
            self._set_timer("nak", min(m.nak_at for m in st.missing.values()))
        else:
            self._cancel_timer("nak")

    def _arm_activity(self) -> None:
        self._set_timer("activity", self.state.last_heard + self.settings.activity_timeout)

    def _on_timer(self, name: str) -> None:
        st = self.state
        if name == "connect":
            if not st.connected:
                self._connect()
        elif name == "ack":
            if st.connected and st.expected is not None:
                self.stats["acks"] += 1
                ack = lbtru.LbtruAck(ack_sqn=(st.expected - 1) & SQN_MASK,
                                     options=self._options())
                self._out.append((ack.build(), self.source))
                self._set_timer("ack", self.now + self.settings.acknowledgement_interval)
        elif name == "nak":
            self._on_nak_timer()
        elif name == "activity":
            silent = self.now - st.last_heard
            if silent >= self.settings.activity_timeout:
                self._events.append(SourceTimedOut(silent))
                self.close()
            else:
                self._arm_activity()

    def _on_nak_timer(self) -> None:
        st = self.state
        give_up = self.settings.nak_generation_interval
        expired = sorted(s for s, m in st.missing.items() if self.now - m.since >= give_up)
        for sqn in expired:
            del st.missing[sqn]
        self._report_runs(expired, "timeout")
        if expired:
            self._advance()
        due = sorted(s for s, m in st.missing.items() if m.nak_at <= self.now)
        for sqn in due:
            entry = st.missing[sqn]
            entry.naks += 1
            entry.nak_at = self.now + self.settings.nak_backoff_interval * self._jitter()
        for i in range(0, len(due), NAKS_PER_PACKET):
            self.stats["naks"] += 1
            nak = lbtru.LbtruNak(format=lbtru.FORMAT_SELECTIVE, options=self._options(),
                                 naks=[s & SQN_MASK for s in due[i:i + NAKS_PER_PACKET]])
            self._out.append((nak.build(), self.source))
        self._arm_nak()
