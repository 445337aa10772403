"""LBT-RM transport sessions, sans-IO: the source side and the receiver side of one session.

LBT-RM is UM's reliable multicast transport over UDP (``docs/wire-transports.md`` §2; the
packet formats are :mod:`wire.lbtrm`).  A source sends numbered DATA datagrams to a multicast
group and port from its own unicast UDP port; that port is written in every packet's header
(``ucast_port``) and is where receivers send their NAKs.  Retransmissions and NCFs go to the
group, so one retransmission repairs every receiver that lost the datagram and one NCF quiets
every receiver that asked.  A transport session is named by (source IP, header unicast port,
session ID, group, destination port): tshark's key (``docs/wire-transports.md`` §2.4).  What the
transport gives up on, a persistent receiver recovers from its stores (or OTR).

The classes have the shape of the other cores and of :mod:`reference_impl.lbtru_session`
(``receive(data, addr, now)``, ``datagrams_to_send(now)``, ``get_timer()``,
``handle_timer(now)``, ``next_event()``), so each can be bound in :mod:`reference_impl.sim` or on
an :class:`~reference_impl.aio.AioHost` as it is.  They do not parse LBMC: a DATA payload goes in
and comes out as bytes.  The receiver shares LBT-RU's receiver machinery (gap tracking, NAK
timing, in-order delivery, loss reports, the events :class:`Delivered`, :class:`Lost` and
:class:`SourceTimedOut`) by subclassing :class:`LbtruReceiverSession`: one definition of those
rules.  A core that tells sessions apart with ``isinstance`` must test for
:class:`LbtrmReceiverSession` before :class:`LbtruReceiverSession`.

Rules (summed up in ``docs/wire-transports.md`` §2.6; each has a test in
``tests/reference_impl/test_lbtrm_session.py``):

* **Source.**  DATA goes to ``group`` with the unicast-NAKs flag set, numbered from 0 per
  session (modulo 2**32), and is retained for retransmission while the retained payload fits
  ``transmission_window_size``; its trailing edge (``trail_sqn``) is the oldest retained number.
* **Session messages** (SM, to the group) carry the leading and trailing edges:
  ``sm_minimum_interval`` after the last DATA, then at doubling intervals up to
  ``sm_maximum_interval``.  A new session sends them from the start (before any DATA they say
  lead 0xFFFFFFFF, trail 0), so a receiver learns of an idle session and where to start.
* **NAKs** are accepted on the source's unicast port when their header names this session
  (unicast port and session ID); a parity NAK is dropped (no FEC here).  A NAKed number inside the
  window is retransmitted (DATA with the RX flag, to the group) at most once per
  ``ignore_interval``; within it the answer is NCF "NAK Ignored".  A number older than the window
  gets NCF "Do not retry".  A retransmission beyond ``retransmit_rate_limit`` gets NCF "NAK
  Shed".  A number never sent gets nothing.
* **Rate limits** (bits per second, per ``rate_interval``): original DATA beyond
  ``data_rate_limit`` waits in :attr:`LbtrmSourceSession.backlog` and goes out in the next rate
  interval (``send`` returns its sequence number at once; nothing is dropped, and a datagram
  larger than a whole interval's budget goes out alone in a fresh interval).  Retransmissions
  are limited by ``retransmit_rate_limit`` and also count toward ``data_rate_limit`` ("original
  data plus retransmissions"); they are never held back, only shed.  Costs are UDP payload
  bytes (the 20-byte DATA header included): our choice.
* **Receiver start.**  At the first original DATA seen (at its number) or after the lead of the
  first SM, whichever comes first: the transport has no late join.  A retransmission seen before
  the start is dropped, since starting there would NAK a window the receiver never had.
* **Receiver NAKs** go to (source IP, header unicast port), selective format, at most
  ``NAKS_PER_PACKET`` numbers each: the first for a gap after ``nak_initial_backoff_interval``,
  the next after ``nak_backoff_interval``, both randomized in [0.5, 1.5) times the value (so
  receivers that lost the same datagram do not NAK together), one draw per instant, so the
  numbers of one gap keep being NAKed together in one NAK; a number still missing
  ``nak_generation_interval`` after it went missing is :class:`Lost` ("timeout").  With
  ``send_naks`` off nothing is NAKed and gaps are lost after that interval.
* **NCF at the receiver.**  "Do not retry" makes the numbers :class:`Lost` ("ncf") at once;
  "NAK Ignored", "NAK Shed" and "Retransmit Delay" postpone the next NAK of those numbers to a
  random point in [0.5, 1.0] times ``nak_suppress_interval`` (the product calls it the maximum
  suppression; the lower half is our choice, and it is at least the default ignore interval).
  Numbers behind the trailing edge of any DATA, SM or NCF that are still missing are lost
  ("window").
* **Duplicates** (network copies, retransmissions of what arrived) are dropped and counted;
  delivery is in sequence order, exactly once (:class:`Delivered`).
* **Activity.**  Nothing from the session for ``activity_timeout`` ends it
  (:class:`SourceTimedOut`).  A restarted source is a new session: it draws a new random session
  ID (unless configured), so its receivers start a new session from its first packets
  (:class:`LbtrmReceiverPort` opens one per key) and the old one times out.  LBT-RM has no
  RST, and sequence numbers cannot tell a restart under the same session ID from old
  duplicates (a restarted source that at once sends more than its old incarnation did would
  look like its continuation), so a source must never reuse a session ID across restarts:
  a core that configures one must derive it from something that changes with each start.

Defaults.  Each settings field is the UM option's name without ``transport_lbtrm_``.  The
guide's sample configuration file ("Configuring for Persistence and Recovery") sets the rate
limits to 10,000,000 and 5,000,000 and its store example the rate interval to 100; ports and
groups are in ``docs/semantics.md`` §1.0.  The other values are those of the UM Configuration
Guide ("Transport LBT-RM Reliability Options", "... Operation Options"), which is not among
the repository's sources: where it might differ, read them as our choice.

================================================  ========  ======================================
UM option                                         scope     default
================================================  ========  ======================================
``transport_lbtrm_transmission_window_size``      source    24 MiB
``transport_lbtrm_sm_minimum_interval``           source    200 ms
``transport_lbtrm_sm_maximum_interval``           source    10 s
``transport_lbtrm_ignore_interval``               source    500 ms
``transport_lbtrm_data_rate_limit``               context   10,000,000 b/s
``transport_lbtrm_retransmit_rate_limit``         context   5,000,000 b/s
``transport_lbtrm_rate_interval``                 context   100 ms
``transport_lbtrm_nak_initial_backoff_interval``  receiver  50 ms
``transport_lbtrm_nak_backoff_interval``          receiver  200 ms
``transport_lbtrm_nak_suppress_interval``         receiver  1 s
``transport_lbtrm_nak_generation_interval``       receiver  10 s
``transport_lbtrm_activity_timeout``              receiver  60 s
``transport_lbtrm_send_naks``                     receiver  1
``transport_lbtrm_destination_port``              source    14400 (``DESTINATION_PORT``)
``transport_lbtrm_multicast_address_low/high``    context   224.10.10.10-.14 (``MULTICAST_RANGE``)
``transport_lbtrm_source_port_low/high``          context   14390-14399 (``SOURCE_PORTS``)
================================================  ========  ======================================

The rate limits are per context in the product; here each session applies them alone (a core
that runs several LBT-RM sessions shares nothing yet: our choice until one does).
"""

from __future__ import annotations

import random
from collections import OrderedDict, deque
from dataclasses import dataclass

from reference_impl.lbtru_session import (
    NAKS_PER_PACKET,
    SQN_MASK,
    Addr,
    Delivered,
    Event,
    LbtruReceiverSession,
    Lost,
    SourceTimedOut,
    _Endpoint,
    _ReceiverState,
    unwrap,
)
from wire import lbtrm
from wire.errors import WireError

__all__ = [
    "DESTINATION_PORT",
    "MULTICAST_RANGE",
    "SOURCE_PORTS",
    "Delivered",
    "Event",
    "LbtrmReceiverPort",
    "LbtrmReceiverSession",
    "LbtrmReceiverSettings",
    "LbtrmSourceSession",
    "LbtrmSourceSettings",
    "Lost",
    "SessionKey",
    "SourceTimedOut",
]

DESTINATION_PORT = 14400
"""``transport_lbtrm_destination_port``: the UDP port of the multicast data."""
MULTICAST_RANGE = ("224.10.10.10", "224.10.10.14")
"""``transport_lbtrm_multicast_address_low`` / ``_high``: the groups sources pick from."""
SOURCE_PORTS = (14390, 14399)
"""``transport_lbtrm_source_port_low`` / ``_high``: a source's unicast (NAK) port range."""

SessionKey = tuple[str, int, int]
"""(source IP, header unicast port, session ID): a transport session on one group and port."""

_DATA = lbtrm.DATA_FAST
_HEADER = lbtrm.COMMON


def _positive(owner: str, **values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{owner}: {name} must be positive, not {value}")


# --- settings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LbtrmSourceSettings:
    """A source's LBT-RM options (seconds, bytes, bits per second; see the module docstring).

    Attributes:
        session_id: the session ID in every header; None draws a random 32-bit one.
        transmission_window_size: payload bytes retained for retransmission.
        sm_minimum_interval / sm_maximum_interval: session-message pacing when idle.
        ignore_interval: a number retransmitted this recently is answered "NAK Ignored".
        data_rate_limit: original data plus retransmissions, bits per second.
        retransmit_rate_limit: retransmissions alone, bits per second.
        rate_interval: the period over which both limits are enforced.
    """

    session_id: int | None = None
    transmission_window_size: int = 25_165_824
    sm_minimum_interval: float = 0.2
    sm_maximum_interval: float = 10.0
    ignore_interval: float = 0.5
    data_rate_limit: int = 10_000_000
    retransmit_rate_limit: int = 5_000_000
    rate_interval: float = 0.1

    def __post_init__(self) -> None:
        _positive("LBT-RM source", transmission_window_size=self.transmission_window_size,
                  sm_minimum_interval=self.sm_minimum_interval,
                  data_rate_limit=self.data_rate_limit,
                  retransmit_rate_limit=self.retransmit_rate_limit,
                  rate_interval=self.rate_interval)
        if self.sm_maximum_interval < self.sm_minimum_interval:
            raise ValueError("LBT-RM source: sm_maximum_interval is below sm_minimum_interval")
        if self.ignore_interval < 0:
            raise ValueError("LBT-RM source: ignore_interval must not be negative")
        if self.session_id is not None and not 0 <= self.session_id <= SQN_MASK:
            raise ValueError(f"LBT-RM source: session_id {self.session_id} is not 32-bit")


@dataclass(frozen=True)
class LbtrmReceiverSettings:
    """A receiver's LBT-RM options (seconds; see the module docstring).

    The first five names are the ones :class:`LbtruReceiverSession`'s shared machinery reads.

    Attributes:
        nak_initial_backoff_interval: delay before the first NAK of a gap (randomized).
        nak_backoff_interval: delay between NAKs of one number (randomized).
        nak_generation_interval: a number missing this long is lost.
        activity_timeout: silence from the session this long ends it.
        nak_suppress_interval: after an NCF other than "Do not retry", the longest wait before
            NAKing those numbers again.
        send_naks: NAK at all (``transport_lbtrm_send_naks``).
    """

    nak_initial_backoff_interval: float = 0.05
    nak_backoff_interval: float = 0.2
    nak_generation_interval: float = 10.0
    activity_timeout: float = 60.0
    nak_suppress_interval: float = 1.0
    send_naks: bool = True

    def __post_init__(self) -> None:
        _positive("LBT-RM receiver", nak_backoff_interval=self.nak_backoff_interval,
                  nak_generation_interval=self.nak_generation_interval,
                  activity_timeout=self.activity_timeout,
                  nak_suppress_interval=self.nak_suppress_interval)
        if self.nak_initial_backoff_interval < 0:
            raise ValueError("LBT-RM receiver: nak_initial_backoff_interval must not be "
                             "negative")


# --- source side --------------------------------------------------------------------------------


class LbtrmSourceSession(_Endpoint):
    """The source end of one LBT-RM transport session (see the module docstring).

    Bind it at its unicast port: DATA, SM, retransmissions and NCFs leave from there to
    ``group`` (so the UDP source port equals the header's ``ucast_port``), and NAKs arrive there.

    Args:
        group: the multicast group and destination port of the data.
        ucast_port: the source's own UDP port, written in every header (where NAKs go).
        settings: the session's options.
        now: the current time.
        seed: seeds the random session ID (when ``settings.session_id`` is None).
    """

    def __init__(self, group: Addr, ucast_port: int, settings: LbtrmSourceSettings | None = None,
                 *, now: float = 0.0, seed: int | None = None) -> None:
        super().__init__(now)
        self.group = group
        self.ucast_port = ucast_port
        self.settings = settings or LbtrmSourceSettings()
        sid = self.settings.session_id
        self.session_id = sid if sid is not None else random.Random(seed).getrandbits(32)
        self.next_sqn = 0  # unwrapped: the next number send() hands out
        self._transmitted = 0  # unwrapped: the next number to go on the wire
        self._pending: deque[tuple[int, bytes]] = deque()
        self._retained: OrderedDict[int, bytes] = OrderedDict()
        self._retained_bytes = 0
        self._last_rx: dict[int, float] = {}
        self._sm_sqn = 0
        self._sm_interval = self.settings.sm_minimum_interval
        self._slot_end = now  # the current rate interval ends here
        self._data_used = 0
        self._rx_used = 0
        self.stats = {"data": 0, "retransmissions": 0, "naks": 0, "ncfs": 0, "sms": 0,
                      "ignored": 0, "shed": 0, "do_not_retry": 0, "rate_limited": 0}
        self._arm_sm()

    # --- the sans-IO interface ------------------------------------------------------------------

    @property
    def lead_sqn(self) -> int:
        """The newest sequence number transmitted (32-bit; 0xFFFFFFFF before the first)."""
        return (self._transmitted - 1) & SQN_MASK

    @property
    def trail_sqn(self) -> int:
        """The oldest sequence number still retransmittable (32-bit)."""
        return next(iter(self._retained), self._transmitted) & SQN_MASK

    @property
    def backlog(self) -> int:
        """Messages accepted by :meth:`send` and held back by the data rate limit."""
        return len(self._pending)

    def send(self, payload: bytes, now: float) -> int:
        """Send ``payload`` (LBMC bytes) as one DATA datagram to the group, now or, past the
        data rate limit, in a later rate interval; returns its sequence number (32-bit)."""
        self.now = now
        sqn = self.next_sqn
        self.next_sqn += 1
        self._pending.append((sqn, payload))
        if len(self._pending) == 1:
            self._pump()
        if self._pending and self._pending[-1][0] == sqn:
            self.stats["rate_limited"] += 1  # held back
        return sqn & SQN_MASK

    def forget(self) -> None:
        """Stop holding every datagram sent so far, as a transmission window that moved past
        them does: a NAK for any of them is answered "do not retry" and the trailing edge is
        the next number, so the receivers' transport gives them up (the conformance harness's
        source loses datagrams for good with it, as :meth:`LbtruSourceSession.forget`)."""
        self._retained.clear()
        self._retained_bytes = 0
        self._last_rx.clear()

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        """A datagram on the source's unicast port: NAKs for this session count."""
        self.now = now
        packet = self._parse_rm(data)
        if packet is None:
            return
        if not isinstance(packet, lbtrm.LbtrmNak) or packet.format != lbtrm.FORMAT_SELECTIVE \
                or packet.session_id != self.session_id or packet.ucast_port != self.ucast_port:
            self.dropped += 1  # another session's, a parity NAK, or a type that flows outward
            return
        self.stats["naks"] += 1
        self._on_nak(list(packet.naks))

    # --- internals ------------------------------------------------------------------------------

    def _parse_rm(self, data: bytes) -> lbtrm.LbtrmPacket | None:
        try:
            return lbtrm.parse_packet(data, decode_lbmc=False)
        except WireError:
            self.dropped += 1
            return None

    def _data(self, sqn: int, payload: bytes, *, rx: bool) -> bytes:
        flags = lbtrm.FLAG_UCAST_NAKS | (lbtrm.FLAG_RX if rx else 0)
        header = _DATA.pack({"ver_type": lbtrm.PacketType.DATA, "next_hdr": 0,
                             "ucast_port": self.ucast_port, "session_id": self.session_id,
                             "sqn": sqn & SQN_MASK, "trail_sqn": self.trail_sqn,
                             "flags_fec_type": flags, "flags_tgsz": 0, "fec_symbol": 0})
        return header + payload

    def _roll(self) -> None:
        """Start a new rate interval if the current one is over."""
        if self.now >= self._slot_end:
            self._slot_end = self.now + self.settings.rate_interval
            self._data_used = self._rx_used = 0

    def _budget(self, limit: int) -> float:
        return limit / 8 * self.settings.rate_interval

    def _pump(self) -> None:
        """Transmit pending DATA while the data rate budget of this interval allows."""
        self._roll()
        budget = self._budget(self.settings.data_rate_limit)
        window = self.settings.transmission_window_size
        sent = False
        while self._pending:
            sqn, payload = self._pending[0]
            cost = _DATA.size + len(payload)
            if self._data_used and self._data_used + cost > budget:
                self._set_timer("rate", self._slot_end)
                break
            self._pending.popleft()
            self._retained[sqn] = payload
            self._retained_bytes += len(payload)
            while self._retained_bytes > window and len(self._retained) > 1:
                old, dropped = self._retained.popitem(last=False)
                self._retained_bytes -= len(dropped)
                self._last_rx.pop(old, None)
            self._transmitted = sqn + 1
            self._data_used += cost
            self._out.append((self._data(sqn, payload, rx=False), self.group))
            self.stats["data"] += 1
            sent = True
        if sent:
            self._sm_interval = self.settings.sm_minimum_interval
            self._arm_sm()

    def _sm(self) -> bytes:
        self._sm_sqn += 1
        self.stats["sms"] += 1
        return lbtrm.LbtrmSm(ucast_port=self.ucast_port, session_id=self.session_id,
                             sm_sqn=self._sm_sqn & SQN_MASK, lead_sqn=self.lead_sqn,
                             trail_sqn=self.trail_sqn, ucast_naks=1).build()

    def _on_nak(self, naks: list[int]) -> None:
        self._roll()
        ignored: list[int] = []
        shed: list[int] = []
        gone: list[int] = []
        oldest = next(iter(self._retained), self._transmitted)
        rx_budget = self._budget(self.settings.retransmit_rate_limit)
        for raw in naks:
            sqn = unwrap(raw, self._transmitted)
            if sqn >= self._transmitted:
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
            cost = _DATA.size + len(payload)
            if self._rx_used and self._rx_used + cost > rx_budget:
                shed.append(raw)
                continue
            self._rx_used += cost
            self._data_used += cost
            self._last_rx[sqn] = self.now
            self.stats["retransmissions"] += 1
            self._out.append((self._data(sqn, payload, rx=True), self.group))
        for reason, sqns, stat in ((lbtrm.NcfReason.NO_RETRY, gone, "do_not_retry"),
                                   (lbtrm.NcfReason.IGNORED, ignored, "ignored"),
                                   (lbtrm.NcfReason.SHED, shed, "shed")):
            self.stats[stat] += len(sqns)
            for i in range(0, len(sqns), NAKS_PER_PACKET):
                self.stats["ncfs"] += 1
                ncf = lbtrm.LbtrmNcf(ucast_port=self.ucast_port, session_id=self.session_id,
                                     trail_sqn=self.trail_sqn, reason=int(reason),
                                     format=lbtrm.FORMAT_SELECTIVE,
                                     ncfs=sqns[i:i + NAKS_PER_PACKET])
                self._out.append((ncf.build(), self.group))

    def _arm_sm(self) -> None:
        self._set_timer("sm", self.now + self._sm_interval)

    def _on_timer(self, name: str) -> None:
        if name == "sm":
            self._out.append((self._sm(), self.group))
            self._sm_interval = min(self._sm_interval * 2, self.settings.sm_maximum_interval)
            self._arm_sm()
        elif name == "rate":
            self._pump()


# --- receiver side ------------------------------------------------------------------------------


class LbtrmReceiverSession(LbtruReceiverSession):
    """The receiver end of one LBT-RM transport session (see the module docstring).

    The owner joins the group on its socket and hands this session the datagrams of its key
    (:class:`LbtrmReceiverPort` does that for a port); NAKs leave for
    ``(source_ip, ucast_port)``.

    Args:
        source_ip: the source's IP address (the IP source of its datagrams).
        ucast_port: the source's unicast port, as in the header (and the TIR).
        session_id: the session ID, as in the header (and the TIR).
        settings: the receiver's options.
        now: the current time.
        seed: seeds the NAK randomization (deterministic runs).
    """

    settings: LbtrmReceiverSettings  # type: ignore[assignment]

    def __init__(self, source_ip: str, ucast_port: int, session_id: int,
                 settings: LbtrmReceiverSettings | None = None, *, now: float = 0.0,
                 seed: int = 0) -> None:
        _Endpoint.__init__(self, now)  # not LBT-RU's: there is no handshake to start
        self.source = (source_ip, ucast_port)
        self.session_id = session_id
        self.settings = settings or LbtrmReceiverSettings()
        self._rng = random.Random(seed)
        self.state = _ReceiverState(last_heard=now)
        self.closed = False
        self.stats = {"delivered": 0, "duplicates": 0, "naks": 0, "nak_entries": 0, "lost": 0,
                      "ncfs": 0, "acks": 0}
        self._jitter_at: float | None = None
        self._jitter_value = 1.0
        self._arm_activity()

    @property
    def key(self) -> SessionKey:
        return (self.source[0], self.source[1], self.session_id)

    @property
    def next_sqn(self) -> int | None:
        """The next sequence number to deliver (32-bit), None before the session started."""
        expected = self.state.expected
        return None if expected is None else expected & SQN_MASK

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        """A datagram from the group (DATA, SM, NCF) for this session; others are dropped."""
        self.now = now
        if self.closed or addr[0] != self.source[0]:
            self.dropped += 1
            return
        if len(data) >= _DATA.size and data[0] == lbtrm.PacketType.DATA and data[1] == 0:
            self._fast_data(data)  # version 0, DATA, no options: the hot path
            return
        try:
            packet = lbtrm.parse_packet(data, decode_lbmc=False)
        except WireError:
            self.dropped += 1
            return
        if packet.ucast_port != self.source[1] or packet.session_id != self.session_id:
            self.dropped += 1  # another session of this source, or of another one
            return
        st = self.state
        if isinstance(packet, lbtrm.LbtrmData):
            payload = packet.payload if isinstance(packet.payload, bytes) else b""
            self._take_data(packet.sqn, packet.trail_sqn, bool(packet.rx), payload)
        elif isinstance(packet, lbtrm.LbtrmSm):
            st.last_heard = now
            self._on_rm_sm(packet)
        elif isinstance(packet, lbtrm.LbtrmNcf):
            st.last_heard = now
            self._on_rm_ncf(packet)
        else:
            self.dropped += 1  # a NAK: receivers NAK to the source, never to the group

    def _fast_data(self, data: bytes) -> None:
        """A DATA datagram without options, read through the derived header layout (what the
        full parser would conclude, without building a packet object)."""
        _vt, _nh, port, sid, sqn, trail, flags, _tgsz, _fec = _DATA.unpack_from(data)
        if port != self.source[1] or sid != self.session_id:
            self.dropped += 1
            return
        self._take_data(sqn, trail, bool(flags & lbtrm.FLAG_RX), bytes(data[_DATA.size:]))

    def _take_data(self, sqn: int, trail: int, rx: bool, payload: bytes) -> None:
        st = self.state
        if st.expected is None and rx:
            self.dropped += 1  # not a place to start (see the module docstring)
            return
        st.last_heard = self.now
        self._on_data(sqn, trail, rx, payload)

    def _jitter(self) -> float:
        """The backoff factor in [0.5, 1.5): one draw per instant, so every number that goes
        missing (or is NAKed) at one moment keeps one schedule and one NAK datagram."""
        if self._jitter_at != self.now:
            self._jitter_at = self.now
            self._jitter_value = 0.5 + self._rng.random()
        return self._jitter_value

    def _start(self, next_sqn: int) -> None:
        super()._start(next_sqn)
        self.state.connected = True

    def _on_rm_sm(self, packet: lbtrm.LbtrmSm) -> None:
        st = self.state
        if st.expected is None:
            self._start((packet.lead_sqn + 1) & SQN_MASK)
        assert st.expected is not None
        self._note_up_to(unwrap(packet.lead_sqn, st.expected))
        self._apply_trail(packet.trail_sqn)

    def _on_rm_ncf(self, packet: lbtrm.LbtrmNcf) -> None:
        st = self.state
        if st.expected is None:
            return
        self.stats["ncfs"] += 1
        sqns = [unwrap(s, st.expected) for s in packet.ncfs]
        if packet.reason == lbtrm.NcfReason.NO_RETRY:
            gone = sorted(s for s in sqns if s in st.missing)
            for sqn in gone:
                del st.missing[sqn]
            self._report_runs(gone, "ncf")
            self._advance()
        else:  # ignored, shed or delayed: the source has it, ask again later
            suppress = self.settings.nak_suppress_interval
            later = self.now + suppress * (0.5 + 0.5 * self._rng.random())
            for sqn in sqns:
                entry = st.missing.get(sqn)
                if entry is not None:
                    entry.nak_at = max(entry.nak_at, later)
            self._arm_nak()
        self._apply_trail(packet.trail_sqn)

    def _on_timer(self, name: str) -> None:
        if name == "nak":
            self._on_nak_timer()
        elif name == "activity":
            silent = self.now - self.state.last_heard
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
        if not self.settings.send_naks:
            for sqn in due:
                entry = st.missing[sqn]
                entry.nak_at = entry.since + give_up
            self._arm_nak()
            return
        for sqn in due:
            entry = st.missing[sqn]
            entry.naks += 1
            entry.nak_at = self.now + self.settings.nak_backoff_interval * self._jitter()
        self.stats["nak_entries"] += len(due)
        for i in range(0, len(due), NAKS_PER_PACKET):
            self.stats["naks"] += 1
            nak = lbtrm.LbtrmNak(ucast_port=self.source[1], session_id=self.session_id,
                                 format=lbtrm.FORMAT_SELECTIVE,
                                 naks=[s & SQN_MASK for s in due[i:i + NAKS_PER_PACKET]])
            self._out.append((nak.build(), self.source))
        self._arm_nak()


# --- a receiver's port --------------------------------------------------------------------------


class LbtrmReceiverPort:
    """What a context does on its LBT-RM destination port: one receiver session per transport
    session, keyed by (source IP, header unicast port, session ID) as tshark keys them (the
    group and port are the socket's).  The UDP source port of the data is not part of the key.

    Sessions are opened by :meth:`open` (a core does that from a TIR) or, with ``accept_new``,
    by the first datagram of an unknown key (tests, and a receiver of every source on the
    group).  A session that timed out is replaced by a new one when its key is heard again.

    Args:
        settings: options of every session opened here.
        now: the current time.
        seed: seeds each session's randomization (with its order of opening).
        accept_new: open a session for the first datagram of an unknown key.
    """

    def __init__(self, settings: LbtrmReceiverSettings | None = None, *, now: float = 0.0,
                 seed: int = 0, accept_new: bool = False) -> None:
        self.settings = settings or LbtrmReceiverSettings()
        self.now = now
        self.accept_new = accept_new
        self.sessions: dict[SessionKey, LbtrmReceiverSession] = {}
        self.dropped = 0
        self._seed = seed
        self._opened = 0

    def open(self, source_ip: str, ucast_port: int, session_id: int,
             now: float) -> LbtrmReceiverSession:
        """The session of this key, opened now if there is none (or only a closed one)."""
        key = (source_ip, ucast_port, session_id)
        session = self.sessions.get(key)
        if session is None or session.closed:
            self._opened += 1
            session = LbtrmReceiverSession(source_ip, ucast_port, session_id, self.settings,
                                           now=now, seed=self._seed * 1_000_003 + self._opened)
            self.sessions[key] = session
        return session

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        self.now = now
        if len(data) < _HEADER.size:
            self.dropped += 1
            return
        values = _HEADER.decode(data)
        key = (addr[0], int(values["ucast_port"]), int(values["session_id"]))
        session = self.sessions.get(key)
        if session is None or session.closed:
            if not self.accept_new:
                self.dropped += 1
                return
            session = self.open(*key, now)
        session.receive(data, addr, now)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        out: list[tuple[bytes, Addr]] = []
        for session in self.sessions.values():
            out.extend(session.datagrams_to_send(now))
        return out

    def next_event(self) -> tuple[SessionKey, Event] | None:
        """The next event of any session, with the session's key."""
        for key, session in self.sessions.items():
            event = session.next_event()
            if event is not None:
                return key, event
        return None

    def get_timer(self) -> float | None:
        timers = [t for s in self.sessions.values() if (t := s.get_timer()) is not None]
        return min(timers, default=None)

    def handle_timer(self, now: float) -> None:
        self.now = now
        for session in list(self.sessions.values()):
            timer = session.get_timer()
            if timer is not None and timer <= now:
                session.handle_timer(now)
