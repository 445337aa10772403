"""What every reference core shares: a UM *context* without I/O.

A UM application owns a context; the context owns the sockets (a topic-resolution UDP port, TCP
listeners for the data transport and for persistence requests, outgoing TCP connections to
stores and sources).  :class:`ContextCore` keeps all of that as plain state and speaks the
sans-IO interface of :mod:`reference_impl.sim` (the same one :mod:`reference_impl.aio` puts on
real sockets):

* ``receive(data, addr, now)`` for UDP datagrams (LBMR topic resolution);
* ``stream_event(event, now)`` / ``stream_commands(now)`` for TCP connections, each framed as
  LBT-TCP (LBMC messages back to back, :class:`wire.lbttcp.LbttcpStream`);
* ``receive_at(local_port, data, addr, now)`` / ``datagrams_from(now)`` for the LBT-RU and
  LBT-RM sessions a core runs on its own UDP ports (:class:`LbtruBinding`); a receiving
  session's payloads enter the same LBMC path as a TCP chunk, through a stand-in
  :class:`Connection`;
* ``get_timer()`` / ``handle_timer(now)`` driven by named deadlines;
* ``next_event()`` for the application events of :mod:`reference_impl.events`.

Subclasses (store, source, receiver, resolver) only see decoded messages and named timers;
:meth:`ContextCore.on_chunk_done` tells them when every message of one received chunk has been
handed over, so work a burst shares (acknowledgements, recovery requests) happens once per
chunk, and consecutive writes to one connection leave as one :class:`StreamWrite`.
Connections to a peer are opened on demand by :meth:`ContextCore.send_to` and keyed by the
peer's address, so a core says "send this PREG to the store at 10.0.0.1:14567" and the base
class connects, queues until connected and reports a lost peer exactly once.

LBT-RM (:mod:`reference_impl.lbtrm_session`): a source's session runs on its unicast (NAK)
port and sends to its group; a receiving session listens on the group's destination port,
which the core asks its driver to bind and join through :attr:`ContextCore.join_group` (the
simulator's ``SimNetwork.join``, :meth:`~reference_impl.aio.AioHost.join_multicast` on real
sockets), once per (group, port), when it opens the first session there.  Every session of
every source on that group shares the port: a datagram goes to the session its header names
(source IP, unicast port, session ID, as tshark keys it); a datagram for no session of ours is
another topic's traffic on a shared group, not bad input, so it is only counted
(``stats["lbtrm_foreign"]``), never logged (our choice: a receiver on a busy group would
otherwise log every datagram of every topic it does not subscribe to).  One exception: a
datagram from the source IP and unicast port of a session we receive, under a session ID that
is neither that session's nor one it had before, may be that source restarted (LBT-RM has no
reset, and a restarted source draws a new ID).  A *provisional* session for it starts at that
datagram and holds what it delivers (at most :data:`PROVISIONAL_HELD` payloads, the oldest
dropped first); once a TIR of our topic names that session (:meth:`ContextCore.promote_lbtrm`)
it replaces the old one on the same stand-in connection, the subclass hears
:class:`~reference_impl.lbtru_session.SessionReset`, then the held payloads.  Waiting for the
TIR before starting would lose what the source sent before it arrived, with nothing after it
to show the gap; delivering before it would hand another application's data to our routes if
an unrelated source took the port.  A provisional session nobody confirms ends with its
activity timeout, or with the session it could have replaced.  Session IDs replaced are kept
(:attr:`ContextCore.lbtrm_retired`), so a stale datagram or advertisement of the old run never
brings it back.  A new run that advertises another group than the old one is joined there
(:meth:`ContextCore.swap_lbtrm_session` with the TIR's group; the old group is not left: a
driver has no "leave", and nothing more arrives there for that source).  An LBT-RU source that
restarts on its old port advertises a new session ID; the receiving session of the old ID is
replaced the same way (:meth:`ContextCore.swap_lbtru_session`), else it would go on asking the
new run to connect under the old ID, which the source ignores.

Malformed input never raises out of a core: it becomes an :class:`~reference_impl.events.
InputDropped` event and a log line, and the state is untouched (issue 3, "Bad input").
"""

from __future__ import annotations

import heapq
import ipaddress
import struct
import zlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from reference_impl.events import Addr, Event, InputDropped, Level, LogRecord
from reference_impl.lbtrm_session import (
    LbtrmReceiverSession,
    LbtrmReceiverSettings,
    LbtrmSourceSession,
    LbtrmSourceSettings,
)
from reference_impl.lbtru_session import (
    Delivered,
    LbtruReceiverSession,
    LbtruReceiverSettings,
    LbtruSourceSession,
    LbtruSourceSettings,
    SessionReset,
    SourceTimedOut,
)
from reference_impl.lbtru_session import Event as LbtruEvent
from reference_impl.sim import (
    Connect,
    ConnKey,
    StreamClose,
    StreamCommand,
    StreamEvent,
    StreamEventKind,
    StreamWrite,
)
from wire import lbmr, lbtrm
from wire.errors import WireError
from wire.lbmc import CONTROL_BASE, NHDR_NONE, Header, LbmcMessage, MessageType, parse_message
from wire.lbttcp import LbttcpStream

EPHEMERAL: Addr = ("0.0.0.0", 0)
_PREFIX = CONTROL_BASE.codec  # the prefix every LBMC message starts with; msglen frames it
_MSGLEN = CONTROL_BASE.names.index("msglen")
_RM_HEADER = lbtrm.COMMON.codec  # LBT-RM's common header: which session a datagram is for
_RM_PORT = lbtrm.COMMON.names.index("ucast_port")
_RM_SID = lbtrm.COMMON.names.index("session_id")
PROVISIONAL_HELD = 10_000
"""Most payloads a provisional LBT-RM session holds until its TIR confirms it (see the module
docstring); beyond that the oldest are dropped (counted in ``stats["lbtrm_held_dropped"]``)."""


@dataclass(eq=False)
class Connection:
    """One TCP connection as a core sees it.

    Attributes:
        key: (local address, remote address).
        outgoing: we opened it (to a store or a source); else a peer connected to us.
        open: established and not closed.
        framer: LBT-TCP framer; it sees the received bytes only once framing is broken (the
            fast path of :meth:`ContextCore._feed` frames the rest itself).
        pending: bytes written before the connection was established.
        tag: what the subclass uses this connection for (free-form).
        partial: received bytes of a message not yet complete.
        datagrams: it stands in for an LBT-RU session (:class:`LbtruBinding`): whole messages
            arrive one datagram at a time and nothing can be written back.
    """

    key: ConnKey
    outgoing: bool
    open: bool = False
    framer: LbttcpStream = field(default_factory=lambda: LbttcpStream(decode=False))
    pending: list[bytes] = field(default_factory=list)
    tag: object = None
    partial: bytearray = field(default_factory=bytearray)
    datagrams: bool = False  # an LBT-RU session's stand-in (see :class:`LbtruBinding`)

    @property
    def unframed(self) -> int:
        """Bytes received that do not yet form a whole message."""
        return len(self.partial) + self.framer.pending

    @property
    def local(self) -> Addr:
        return self.key[0]

    @property
    def remote(self) -> Addr:
        return self.key[1]


@dataclass(eq=False)
class LbtruBinding:
    """One LBT-RU or LBT-RM session a core runs on one of its UDP ports.

    A receiving session (a store or receiver on a source's LBT-RU transport) has a stand-in
    :class:`Connection` (``conn``, ``datagrams`` set, keyed (our LBT-RU address, the source's))
    on which its delivered payloads enter the very LBMC path the LBT-TCP transport uses, so the
    subclasses tell the two transports apart only where they must (opening, closing, writing
    back, which LBT-RU cannot: nothing is ever written on the stand-in).  A source's session
    has none.  An LBT-RM receiving session's ``port`` is the group's destination port and its
    stand-in is keyed (our address on that port, (source IP, source unicast port)); ``group``
    is the (multicast address, destination port) it listens on (None for every other kind).
    """

    port: int
    session: LbtruSourceSession | LbtruReceiverSession | LbtrmSourceSession
    conn: Connection | None = None
    group: Addr | None = None
    held: list[bytes] | None = None  # a provisional LBT-RM session's payloads (see above)


class ContextCore:
    """Sans-IO base of every reference core (see the module docstring).

    Args:
        name: used in log lines and events.
        ip: the address this context binds and advertises.
        lbmr_port: its topic-resolution UDP port (what it sends LBMR from).
        resolver: the unicast resolver daemon's address, or None for no topic resolution.
    """

    component = "context"

    def __init__(self, name: str, ip: str, *, lbmr_port: int = 0,
                 resolver: Addr | None = None) -> None:
        self.name = name
        self.ip = ip
        self.lbmr_addr: Addr = (ip, lbmr_port)
        self.resolver = resolver
        self.now = 0.0
        self._datagrams: list[tuple[bytes, Addr]] = []
        self._commands: list[StreamCommand] = []
        # consecutive writes to one connection become one StreamWrite (one send): the key and
        # the parts of the newest, still open for more
        self._write_key: ConnKey | None = None
        self._write_parts: list[bytes] = []
        self._events: deque[Event] = deque()
        self._deadlines: dict[str, float] = {}
        self._heap: list[tuple[float, str]] = []
        self.connections: dict[ConnKey, Connection] = {}
        self._outgoing: dict[Addr, Connection] = {}  # remote -> our (pending) connection to it
        self._connecting: dict[Addr, list[bytes]] = {}  # remote -> bytes waiting for CONNECTED
        self.stats: dict[str, int] = {"dropped_inputs": 0}
        self.closed = False
        self.lbtru_ports: set[int] = set()  # UDP ports that carry LBT-RU/-RM, not LBMR
        self.lbtru: list[LbtruBinding] = []
        self.lbtrm_receiver_settings = LbtrmReceiverSettings()  # the driver may set its own
        self.groups: set[Addr] = set()  # (group, port) our LBT-RM receiving sessions listen on
        # LBT-RM (source IP, unicast port) or LBT-RU source address -> session IDs of its
        # earlier runs (never rejoined)
        self.lbtrm_retired: dict[Addr, set[int]] = {}
        self.join_group: Callable[[Addr], None] | None = None
        """Set by the driver: bind the destination port of a (group, port) for this core and
        join the group there.  Called once per (group, port), from inside a call into the
        core, before that call's datagrams are collected."""

    # --- the sans-IO interface --------------------------------------------------------------

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        """A UDP datagram arrived (only LBMR in this implementation)."""
        self.now = now
        if self.closed:
            return
        try:
            packet = lbmr.parse_packet(data)
        except WireError as exc:
            self.drop(addr, f"LBMR does not decode: {exc}", len(data))
            return
        self.on_lbmr(packet, addr)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        out, self._datagrams = self._datagrams, []
        return out

    def receive_at(self, local_port: int, data: bytes, addr: Addr, now: float) -> None:
        """A UDP datagram arrived at ``local_port``: LBT-RU on an LBT-RU port (handed to the
        sessions there; a receiving session takes only its source's), LBMR anywhere else."""
        if local_port not in self.lbtru_ports:
            self.receive(data, addr, now)
            return
        self.now = now
        if self.closed:
            return
        taken = False
        rm_key: tuple[str, int, int] | None = None
        for binding in list(self.lbtru):
            session = binding.session
            if binding.port != local_port:
                continue
            if isinstance(session, LbtrmReceiverSession):  # before LBT-RU's: a subclass
                if rm_key is None:
                    if len(data) < _RM_HEADER.size:
                        break
                    head = _RM_HEADER.unpack_from(data)
                    rm_key = (addr[0], head[_RM_PORT], head[_RM_SID])
                if session.key != rm_key:
                    continue
            elif isinstance(session, LbtruReceiverSession) and session.source != addr:
                continue
            taken = True
            session.receive(data, addr, now)
            self._pump_lbtru(binding)
        if taken:
            return
        if rm_key is not None and local_port in self._group_ports():
            restarted = self._lbtrm_restarted(local_port, rm_key)
            if restarted is not None:
                restarted.session.receive(data, addr, now)
                self._pump_lbtru(restarted)
                return
        if local_port in self._group_ports():
            self.stats["lbtrm_foreign"] = self.stats.get("lbtrm_foreign", 0) + 1
        else:
            self.drop(addr, f"LBT-RU datagram for no session on port {local_port}", len(data))

    def _group_ports(self) -> set[int]:
        return {port for _, port in self.groups}

    def _lbtrm_restarted(self, port: int, key: tuple[str, int, int]) -> LbtruBinding | None:
        """A datagram of no session of ours on an LBT-RM port: when it comes from the address
        and unicast port of a source we receive there, a provisional session for it (see the
        module docstring); else None."""
        source = (key[0], key[1])
        if key[2] in self.lbtrm_retired.get(source, ()):
            return None
        old = self.lbtru_receiving(source)
        if old is None or old.port != port or old.group is None:
            return None
        session = self._lbtrm_session(old.group, source, key[2])
        binding = LbtruBinding(port, session, None, old.group, held=[])
        self.lbtru.append(binding)
        return binding

    def _lbtrm_session(self, group: Addr, source: Addr, session_id: int,
                       ) -> LbtrmReceiverSession:
        """A receiving session; its NAK backoff draws are seeded from the addresses, so a run
        stays a function of its seed."""
        seed = zlib.crc32(f"{self.ip}:{group[0]}:{group[1]}/{source[0]}:{source[1]}/"
                          f"{session_id}".encode())
        return LbtrmReceiverSession(source[0], source[1], session_id,
                                    self.lbtrm_receiver_settings, now=self.now, seed=seed)

    def promote_lbtrm(self, source: Addr, session_id: int) -> LbtruBinding | None:
        """A TIR of our topic names session ``session_id`` of the LBT-RM source at ``source``
        (IP, unicast port): if we hold a provisional session for it and still receive that
        source's previous session, the provisional one takes over (see the module docstring)
        and is returned; else None."""
        key = (source[0], source[1], session_id)
        provisional = next((b for b in self.lbtru if b.held is not None and b.conn is None
                            and isinstance(b.session, LbtrmReceiverSession)
                            and b.session.key == key), None)
        old = self.lbtru_receiving(source)
        if provisional is None:
            return None
        if old is None or old.conn is None:  # the old session ended meanwhile: join afresh
            self.lbtru.remove(provisional)
            return None
        self._retire(old)
        provisional.conn = old.conn
        held, provisional.held = provisional.held or [], None
        self.on_lbtru_event(provisional, SessionReset())
        for payload in held:
            if provisional.conn.open:
                self._feed_datagram(provisional.conn, payload)
        return provisional

    def _retire(self, old: LbtruBinding) -> None:
        """Stop an LBT-RM receiving session that a newer run of its source replaces."""
        session = old.session
        assert isinstance(session, LbtrmReceiverSession)
        self.lbtrm_retired.setdefault(session.source, set()).add(session.session_id)
        session.close()
        if old in self.lbtru:
            self.lbtru.remove(old)

    def swap_lbtrm_session(self, old: LbtruBinding, session_id: int,
                           group: Addr | None = None) -> LbtruBinding:
        """Replace the LBT-RM receiving session of ``old`` by session ``session_id`` of the
        same source (it restarted): same stand-in connection, the old ID retired, and
        :meth:`on_lbtru_event` told with a :class:`SessionReset`.  ``group``: where the new
        run sends, when its TIR names another (address, port) than the old one's (joined
        here as :meth:`open_lbtrm_receiver` joins)."""
        session = old.session
        assert isinstance(session, LbtrmReceiverSession) and old.group is not None
        self._retire(old)
        group = group or old.group
        self._listen(group)
        new = self._lbtrm_session(group, session.source, session_id)
        binding = LbtruBinding(group[1], new, old.conn, group)
        self.lbtru.append(binding)
        self.on_lbtru_event(binding, SessionReset())
        return binding

    def swap_lbtru_session(self, old: LbtruBinding, session_id: int) -> LbtruBinding:
        """Replace the LBT-RU receiving session of ``old`` by session ``session_id`` of the
        same source address (it restarted on its port, its TIR says under which ID): same
        port, settings and stand-in connection, the old ID retired, :meth:`on_lbtru_event`
        told with a :class:`SessionReset`."""
        session = old.session
        assert isinstance(session, LbtruReceiverSession) and old.group is None
        self.lbtrm_retired.setdefault(session.source, set()).add(session.session_id)
        self.close_lbtru(old)
        if old.conn is not None:
            old.conn.open = True  # the stand-in lives on with the new session
        new = self._lbtru_session(old.port, session.source, session_id, session.settings)
        binding = LbtruBinding(old.port, new, old.conn)
        self.lbtru.append(binding)
        self.on_lbtru_event(binding, SessionReset())
        return binding

    def datagrams_from(self, now: float) -> list[tuple[int, bytes, Addr]]:
        """What the LBT-RU sessions send, each from its own port."""
        if not self.lbtru:
            return []
        return [(b.port, data, dst) for b in self.lbtru
                for data, dst in b.session.datagrams_to_send(now)]

    def stream_commands(self, now: float) -> list[StreamCommand]:
        self._seal_writes()
        out, self._commands = self._commands, []
        return out

    def get_timer(self) -> float | None:
        heap = self._heap
        first: float | None = None
        while heap:
            at, name = heap[0]
            if self._deadlines.get(name) == at:
                first = at
                break
            heapq.heappop(heap)  # superseded or cancelled
        for binding in self.lbtru:
            due = binding.session.get_timer()
            if due is not None and (first is None or due < first):
                first = due
        return first

    def handle_timer(self, now: float) -> None:
        self.now = now
        if self.closed:
            return
        # only the deadlines due when the call starts: one that a handler re-arms at or before
        # ``now`` fires on the next call, so a timer that never moves on makes the driver spin
        # (the simulator's livelock guard names it) instead of freezing inside this loop
        heap, deadlines = self._heap, self._deadlines
        due = []
        while heap and heap[0][0] <= now:
            due.append(heapq.heappop(heap))
        for at, name in due:
            if deadlines.get(name) != at:
                continue  # superseded or cancelled, possibly by an earlier handler of this call
            del deadlines[name]
            self.on_timer(name)
        for binding in list(self.lbtru):
            session_due = binding.session.get_timer()
            if session_due is not None and session_due <= now and binding in self.lbtru:
                binding.session.handle_timer(now)
                self._pump_lbtru(binding)

    def stream_event(self, event: StreamEvent, now: float) -> None:
        self.now = now
        if self.closed:
            return
        kind, key = event.kind, event.conn
        if kind is StreamEventKind.DATA:
            conn = self.connections.get(key)
            if conn is not None:
                self._feed(conn, event.data)
        elif kind is StreamEventKind.ACCEPTED:
            conn = Connection(key, outgoing=False, open=True)
            self.connections[key] = conn
            self.on_accepted(conn)
        elif kind is StreamEventKind.CONNECTED:
            remote = key[1]
            conn = self._outgoing.get(remote)
            if conn is None or conn.open:
                self._command(StreamClose(key))  # nobody wants it any more
                return
            if conn.key != key:
                self.connections.pop(conn.key, None)
                conn.key = key
            conn.open = True
            self.connections[key] = conn
            data = b"".join(conn.pending)
            conn.pending.clear()
            if data:
                self._stream_write(key, data)
            self.on_connected(conn)
        else:  # CLOSED, RESET, REFUSED
            conn = self.connections.pop(key, None)
            if conn is None and kind is StreamEventKind.REFUSED:
                conn = self._outgoing.get(key[1])
            if conn is None:
                return
            unframed = conn.unframed
            if unframed and conn.framer.broken is None and kind is not StreamEventKind.REFUSED:
                # the peer went away inside a message: those bytes are lost, say so
                self.drop(conn.remote, f"connection {kind.name.lower()} inside a message "
                                       f"({unframed} bytes)", unframed)
            self.connections.pop(conn.key, None)
            if self._outgoing.get(conn.remote) is conn:
                del self._outgoing[conn.remote]
            was_open = conn.open
            conn.open = False
            if kind is StreamEventKind.CLOSED and was_open:
                self._command(StreamClose(conn.key))
            self.on_connection_lost(conn, refused=kind is StreamEventKind.REFUSED)

    def next_event(self) -> Event | None:
        """The next application event, or None."""
        return self._events.popleft() if self._events else None

    def events(self) -> list[Event]:
        """Drain every queued event."""
        out = list(self._events)
        self._events.clear()
        return out

    # --- helpers for subclasses -------------------------------------------------------------

    def emit(self, event: Event) -> None:
        self._events.append(event)

    def log(self, level: Level, text: str) -> None:
        self._events.append(LogRecord(f"{self.component} {self.name}", level, text))

    def drop(self, peer: Addr, reason: str, size: int) -> None:
        """Log and discard bad input; the caller must not have changed any state."""
        self.stats["dropped_inputs"] += 1
        self._events.append(InputDropped(peer, reason, size))
        self.log(Level.WARNING, f"dropped {size} bytes from {peer[0]}:{peer[1]}: {reason}")

    def set_timer(self, name: str, at: float) -> None:
        """(Re)arm the named deadline; one deadline per name."""
        if self._deadlines.get(name) == at:
            return
        self._deadlines[name] = at
        heapq.heappush(self._heap, (at, name))

    def set_timer_if_later(self, name: str, at: float) -> None:
        """Arm the deadline unless an earlier one with that name is already set."""
        current = self._deadlines.get(name)
        if current is None or at < current:
            self.set_timer(name, at)

    def cancel_timer(self, name: str) -> None:
        self._deadlines.pop(name, None)

    def timer_at(self, name: str) -> float | None:
        return self._deadlines.get(name)

    def _stream_write(self, key: ConnKey, data: bytes) -> None:
        if self._write_key != key:
            self._seal_writes()
            self._write_key = key
        self._write_parts.append(data)

    def _seal_writes(self) -> None:
        if self._write_key is not None:
            parts = self._write_parts
            data = parts[0] if len(parts) == 1 else b"".join(parts)
            self._commands.append(StreamWrite(self._write_key, data))
            self._write_key, self._write_parts = None, []

    def _command(self, command: StreamCommand) -> None:
        self._seal_writes()
        self._commands.append(command)

    def send_datagram(self, data: bytes, addr: Addr) -> None:
        self._datagrams.append((data, addr))

    def send_lbmr(self, packet: lbmr.LbmrPacket) -> None:
        """Send a topic-resolution packet to the resolver daemon (no multicast here)."""
        if self.resolver is not None:
            self._datagrams.append((packet.build(), self.resolver))

    def send_to(self, remote: Addr, data: bytes, tag: object = None) -> Connection:
        """Write ``data`` on our connection to ``remote``, opening it first if needed."""
        conn = self._outgoing.get(remote)
        if conn is None:
            conn = Connection((EPHEMERAL, remote), outgoing=True, tag=tag)
            self._outgoing[remote] = conn
            self._command(Connect((self.ip, 0), remote))
        if conn.open:
            self._stream_write(conn.key, data)
        else:
            conn.pending.append(data)
        return conn

    def connection_to(self, remote: Addr) -> Connection | None:
        return self._outgoing.get(remote)

    def write(self, conn: Connection, data: bytes) -> None:
        """Write on an existing connection (either direction); dropped if it is gone (or
        if it stands in for an LBT-RU session, which carries nothing back)."""
        if conn.datagrams:
            return
        if conn.open:
            self._stream_write(conn.key, data)
        elif conn.outgoing and self._outgoing.get(conn.remote) is conn:
            conn.pending.append(data)

    def close_connection(self, conn: Connection) -> None:
        if self._outgoing.get(conn.remote) is conn:
            del self._outgoing[conn.remote]
        self.connections.pop(conn.key, None)
        if conn.open:
            conn.open = False
            self._command(StreamClose(conn.key))

    def close(self) -> None:
        """Close every connection and stop (an orderly application exit)."""
        for conn in list(self.connections.values()):
            self.close_connection(conn)
        self._outgoing.clear()
        self._deadlines.clear()
        self._heap.clear()
        for binding in list(self.lbtru):
            self.close_lbtru(binding)
        self.closed = True

    # --- LBT-RU sessions -----------------------------------------------------------------------

    def open_lbtru_source(self, port: int, settings: LbtruSourceSettings) -> LbtruBinding:
        """Run the source end of an LBT-RU session on our UDP ``port``."""
        binding = LbtruBinding(port, LbtruSourceSession(settings, now=self.now))
        self.lbtru_ports.add(port)
        self.lbtru.append(binding)
        return binding

    def open_lbtru_receiver(self, port: int, source: Addr, session_id: int, *,
                            tag: object = None,
                            settings: LbtruReceiverSettings | None = None) -> LbtruBinding:
        """Connect from our UDP ``port`` to the LBT-RU session ``session_id`` of ``source``;
        its payloads arrive on the binding's stand-in connection (tagged ``tag``).  The NAK
        backoff draws are seeded from both addresses, so a run stays a function of its seed."""
        session = self._lbtru_session(port, source, session_id, settings)
        conn = Connection(((self.ip, port), source), outgoing=True, open=True, tag=tag,
                          datagrams=True)
        binding = LbtruBinding(port, session, conn)
        self.lbtru_ports.add(port)
        self.lbtru.append(binding)
        return binding

    def _lbtru_session(self, port: int, source: Addr, session_id: int,
                       settings: LbtruReceiverSettings | None) -> LbtruReceiverSession:
        seed = zlib.crc32(f"{self.ip}:{port}/{source[0]}:{source[1]}/{session_id}".encode())
        return LbtruReceiverSession(source, session_id, settings, now=self.now, seed=seed)

    def open_lbtrm_source(self, port: int, group: Addr, settings: LbtrmSourceSettings,
                          ) -> LbtruBinding:
        """Run the source end of an LBT-RM session on our UDP ``port`` (its unicast port:
        NAKs arrive there, and everything it sends leaves from there) to ``group``."""
        binding = LbtruBinding(port, LbtrmSourceSession(group, port, settings, now=self.now))
        self.lbtru_ports.add(port)
        self.lbtru.append(binding)
        return binding

    def lbtrm_tir_ok(self, info: lbmr.Record, addr: Addr) -> bool:
        """Whether an LBT-RM TIR's transport can be joined: a multicast group, a destination
        port and a unicast port; else it is dropped (logged) here, since joining a unicast
        address or port 0 would fail in the driver, not in the TIR's sender."""
        group, port = str(getattr(info, "mcast_addr", "")), int(getattr(info, "udp_dest_port", 0))
        ucast = int(getattr(info, "src_ucast_port", 0))
        try:
            multicast = ipaddress.IPv4Address(group).is_multicast
        except ValueError:
            multicast = False
        if multicast and port and ucast:
            return True
        self.drop(addr, f"TIR of an LBT-RM transport to {group}:{port} from unicast port "
                        f"{ucast}: not a multicast group, port and NAK port", 0)
        return False

    def open_lbtrm_receiver(self, group: Addr, source: Addr, session_id: int, *,
                            tag: object = None) -> LbtruBinding:
        """Receive the LBT-RM session ``session_id`` of the source whose IP and unicast port
        are ``source``, sent to ``group`` (address, destination port): joined through
        :attr:`join_group` the first time, then on that port alongside every other session
        there.  Its payloads arrive on the binding's stand-in connection (tagged ``tag``);
        NAK backoff draws are seeded from the addresses, as for LBT-RU."""
        self._listen(group)
        session = self._lbtrm_session(group, source, session_id)
        conn = Connection(((self.ip, group[1]), source), outgoing=True, open=True, tag=tag,
                          datagrams=True)
        binding = LbtruBinding(group[1], session, conn, group)
        self.lbtru.append(binding)
        return binding

    def _listen(self, group: Addr) -> None:
        """Join ``group`` (address, destination port) through :attr:`join_group`, once."""
        if group not in self.groups:
            self.groups.add(group)
            self.lbtru_ports.add(group[1])
            if self.join_group is not None:
                self.join_group(group)

    def lbtru_receiving(self, source: Addr) -> LbtruBinding | None:
        """Our receiving session to the LBT-RU source at ``source``, if any."""
        return next((b for b in self.lbtru if b.conn is not None and b.conn.remote == source),
                    None)

    def close_lbtru(self, binding: LbtruBinding) -> None:
        """Stop a session: no more datagrams, timers or events from it (nor from the
        provisional LBT-RM sessions that could only have replaced it)."""
        session = binding.session
        if isinstance(session, LbtruReceiverSession):
            session.close()
        if binding.conn is not None:
            binding.conn.open = False
        if binding in self.lbtru:
            self.lbtru.remove(binding)
        if isinstance(session, LbtrmReceiverSession) and binding.conn is not None:
            for other in [b for b in self.lbtru if b.held is not None and b.conn is None
                          and isinstance(b.session, LbtrmReceiverSession)
                          and b.session.source == session.source]:
                other.session.close()  # type: ignore[union-attr]
                self.lbtru.remove(other)

    def _pump_lbtru(self, binding: LbtruBinding) -> None:
        """Hand over what one call into a session produced: delivered payloads into the LBMC
        path, every other transport event to :meth:`on_lbtru_event`."""
        session = binding.session
        while (event := session.next_event()) is not None:
            if isinstance(event, Delivered):
                if binding.conn is not None and binding.conn.open:
                    self._feed_datagram(binding.conn, event.payload)
                elif binding.held is not None:  # provisional: until its TIR confirms it
                    binding.held.append(event.payload)
                    if len(binding.held) > PROVISIONAL_HELD:
                        del binding.held[0]
                        self.stats["lbtrm_held_dropped"] = \
                            self.stats.get("lbtrm_held_dropped", 0) + 1
            elif binding.held is not None and binding.conn is None:
                if isinstance(event, SourceTimedOut) and binding in self.lbtru:
                    self.lbtru.remove(binding)  # nobody confirmed it
            else:
                self.on_lbtru_event(binding, event)

    def _feed_datagram(self, conn: Connection, data: bytes) -> None:
        """Every LBMC message of one LBT-RU payload to :meth:`on_raw_message`, as
        :meth:`_feed` does for a TCP chunk; a datagram holds whole messages, so bytes that do
        not frame as one are dropped, not kept for the next."""
        unpack, prefix = _PREFIX.unpack_from, _PREFIX.size
        pos, end = self.on_message_run(conn, data), len(data)
        on_raw_message = self.on_raw_message
        while end - pos >= prefix:
            msglen = unpack(data, pos)[_MSGLEN]
            if msglen < prefix or msglen > end - pos:
                break
            on_raw_message(conn, data[pos:pos + msglen])
            pos += msglen
        if pos:
            self.on_chunk_done(conn)
        if pos != end:
            self.drop(conn.remote, f"LBT-RU payload ends inside an LBMC message "
                                   f"({end - pos} bytes)", end - pos)

    def _feed(self, conn: Connection, data: bytes) -> None:
        """Hand every whole message of a received chunk to :meth:`on_raw_message`.

        The hot path of every core.  Messages are sliced straight out of the chunk: the
        ``msglen`` of the LBMC prefix (read through its derived layout) frames each one, as
        :class:`LbttcpStream` does, but without an object per message.  A message cut by the
        end of the chunk waits in ``conn.partial`` for the next one.  Broken framing (a msglen
        that cannot even cover the prefix) is left to the connection's framer, which raises
        the same error for the rest of the stream."""
        if conn.framer.broken is not None:
            self._feed_framer(conn, data)
            return
        partial = conn.partial
        unpack, prefix = _PREFIX.unpack_from, _PREFIX.size
        if partial:
            partial += data
            if len(partial) < prefix:
                return
            msglen = unpack(partial, 0)[_MSGLEN]
            if prefix <= msglen and len(partial) < msglen:
                return  # still inside that message: nothing to do until it is whole
            data = bytes(partial)
            partial.clear()
        on_raw_message = self.on_raw_message
        pos, end = self.on_message_run(conn, data), len(data)
        broken = False
        while end - pos >= prefix:
            msglen = unpack(data, pos)[_MSGLEN]
            if msglen < prefix:
                broken = True
                break
            if end - pos < msglen or (not conn.open and not conn.outgoing):
                break
            on_raw_message(conn, data[pos:pos + msglen])
            pos += msglen
        if pos:
            self.on_chunk_done(conn)
        if pos == end or self.connections.get(conn.key) is not conn or \
                not (conn.open or conn.outgoing):
            return
        if broken:
            self._feed_framer(conn, data[pos:])  # the framer raises: drop and close
        else:
            partial += data[pos:] if pos else data

    def _feed_framer(self, conn: Connection, data: bytes) -> None:
        framer = conn.framer
        try:
            items = framer.feed(data)
        except WireError as exc:
            self._framing_broken(conn, exc, len(data))
            return
        on_raw_message = self.on_raw_message
        for item in items:
            if not conn.open and not conn.outgoing:
                break
            on_raw_message(conn, item.raw)
        if items:
            self.on_chunk_done(conn)
        broken = framer.broken
        if broken is not None and self.connections.get(conn.key) is conn:
            # the framer hands out the whole messages before the break and only then gives
            # up: the rest of this chunk cannot be framed, so the stream is over
            self._framing_broken(conn, broken, framer.pending)

    def _framing_broken(self, conn: Connection, exc: WireError, size: int) -> None:
        self.drop(conn.remote, f"LBT-TCP framing broken, closing: {exc.reason}", size)
        self.close_connection(conn)
        self.on_connection_lost(conn, refused=False)

    def on_message_run(self, conn: Connection, data: bytes) -> int:
        """Handle whole messages at the start of a received chunk in place; returns how many
        bytes they took (the rest goes through :meth:`on_raw_message` one by one).

        A hook for hot paths that read a run of same-shaped messages straight out of the
        chunk (a source's stability ACKs) instead of slicing each out first; the result must
        be exactly what :meth:`on_raw_message` of each would have done.  The default takes
        none."""
        return 0

    def on_raw_message(self, conn: Connection, raw: bytes) -> None:
        """A framed message; the default decodes it fully (the store overrides for speed)."""
        try:
            message, _ = parse_message(raw)
        except WireError as exc:
            self.drop(conn.remote, f"LBMC does not decode: {exc}", len(raw))
            return
        self.on_message(conn, message, raw)

    # --- hooks -------------------------------------------------------------------------------

    def on_lbmr(self, packet: lbmr.LbmrPacket, addr: Addr) -> None:
        """A topic-resolution packet arrived."""

    def on_message(self, conn: Connection, message: LbmcMessage, raw: bytes) -> None:
        """A decoded LBMC message arrived on ``conn``."""

    def on_chunk_done(self, conn: Connection) -> None:
        """Every message of one received chunk of ``conn`` went through :meth:`on_raw_message`.

        Work that a burst of messages can share (acknowledgements, recovery requests) is done
        here once per chunk instead of once per message."""

    def on_accepted(self, conn: Connection) -> None:
        """A peer connected to one of our listeners."""

    def on_connected(self, conn: Connection) -> None:
        """Our connection to ``conn.remote`` is established (queued bytes already sent)."""

    def on_connection_lost(self, conn: Connection, *, refused: bool) -> None:
        """A connection closed, was reset, or (``refused``) could not be opened."""

    def on_timer(self, name: str) -> None:
        """The named deadline passed."""

    def on_lbtru_event(self, binding: LbtruBinding, event: LbtruEvent) -> None:
        """An LBT-RU session reported something other than a delivery (connected, lost,
        reset, timed out)."""


class FixedControl:
    """A CONTROL message that carries exactly one fixed-size ``header_cls`` header, as one
    :class:`struct.Struct` composed from the derived layouts of :mod:`wire.lbmc` (the LBMC
    control prefix and the header's :class:`wire.fastpath.FastLayout`); no field or offset is
    written here.

    The hot paths use it both ways: :meth:`unpack` recognises that exact shape (what the
    clients' fast encoders and ``LbmcMessage.build()`` make of one request) and returns the
    values, or ``None`` for any other shape, which then takes the full decoder; :meth:`template`
    and :meth:`pack` encode runs of such messages that differ in one or two members (positional
    packing, no keyword handling per message).  Values are the raw members, IPv4 as int.

    Attributes:
        size: the message size.
        at: member name -> its position in the values.
    """

    def __init__(self, header_cls: type[Header]) -> None:
        fast = header_cls.kind.fast
        assert fast is not None and fast.complete, f"{header_cls.__name__} is not fixed-size"
        self.codec = struct.Struct(CONTROL_BASE.codec.format + fast.codec.format.lstrip("<>!="))
        self.size = self.codec.size
        self.head = (int(MessageType.CONTROL), header_cls.kind.code, self.size, NHDR_NONE,
                     fast.size)
        self.at = {name: len(self.head) + i for i, name in enumerate(fast.names[2:])}
        self.pack = self.codec.pack
        """``pack(*values)``: one message from a full values list (see :meth:`template`)."""

    def unpack(self, raw: bytes) -> tuple[int, ...] | None:
        if len(raw) != self.size:
            return None
        values = self.codec.unpack(raw)
        return values if values[:len(self.head)] == self.head else None

    def template(self, **members: int) -> list[int]:
        """A full values list for :meth:`pack`: the head, then ``members`` (others 0)."""
        values = [*self.head, *[0] * len(self.at)]
        for name, value in members.items():
            values[self.at[name]] = value
        return values


def control(*headers: object) -> bytes:
    """A CONTROL message carrying ``headers`` (chain ending 0xFF), as bytes."""
    return LbmcMessage(headers=list(headers)).build()  # type: ignore[arg-type]


def first_header(message: LbmcMessage, cls: type) -> object | None:
    for h in message.headers:
        if isinstance(h, cls):
            return h
    return None


Hook = Callable[[Event], None]
