"""A deterministic in-memory network with a virtual clock, for testing sans-IO protocol cores.

The store, source and receiver cores are plain objects in the shape of aioquic's
``QuicConnection``: no sockets, threads or clocks inside, only methods that take ``now``.  That
makes them testable without a network, but a scenario still needs *something* to carry bytes
between them, decide when timers fire and break the network on purpose.  This module is that
something, and it runs a whole scenario (minutes of virtual time, lossy links, a store crash)
in milliseconds of real time, because time only moves when :class:`SimNetwork` says so.

Everything random (jitter, loss, duplication, reordering, stream chunking) is drawn from
generators seeded from the network seed and the link or connection name, never from global
state, so the same seed and scenario give byte-identical traces.  Per-link generators keep a
change on one link (more traffic, a new impairment) from reshuffling the draws on every other.

Model, in brief:

* **Nodes** are named hosts with one IPv4 address; **endpoints** (the cores) bind to ports on
  them.  Killing a node silences its endpoints, drops traffic to it and resets its streams;
  restarting it may bind fresh endpoints (a restarted process has lost its state).
* **Datagrams** (UDP-like) go to one address, or to every member of a multicast group (any
  224.0.0.0/4 address; the sender itself is never a receiver).  Links are one-way (node to
  node) and may delay (fixed + jitter), lose, duplicate and reorder them.
* **Streams** (TCP-like) are reliable and ordered, but their chunking is not: a delivery may
  split a write or merge several (:class:`Chunking`), because LBT-TCP framing must cope with
  any chunking.  Streams are never lost or reordered; they stall across a partition (TCP
  retransmits) and carry on after a heal, unless the partition severs them.
* **Capture**: every *delivered* datagram, stream chunk and stream SYN/FIN/RST is recorded as
  a :class:`CapturedPacket` and can be written as a pcap that ``ump dissect`` reads.
"""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from wire.pcap import TCP_ACK, TCP_FIN, TCP_PSH, TCP_RST, TCP_SYN, PcapWriter, tcp_frame, udp_frame

Addr = tuple[str, int]
"""An (IPv4 address, port) pair."""

ConnKey = tuple[Addr, Addr]
"""A stream as one end sees it: (local address, remote address)."""

EPHEMERAL_PORTS = (50000, 60999)
LIVELOCK_STEPS = 100_000


class SimulationError(Exception):
    """A scenario or endpoint misused the network (a bug in the test or the core)."""


def is_multicast(ip: str) -> bool:
    """True for 224.0.0.0/4."""
    return 224 <= int(ip.split(".", 1)[0]) <= 239


# --- the interface cores implement --------------------------------------------------------------


class StreamEventKind(StrEnum):
    CONNECTED = "connected"  # our connect completed
    ACCEPTED = "accepted"  # a peer connected to us
    DATA = "data"  # bytes arrived (any chunking)
    CLOSED = "closed"  # the peer closed after all its bytes (FIN)
    RESET = "reset"  # the stream died: peer killed, severed; undelivered bytes are lost
    REFUSED = "refused"  # our connect failed: nobody listening, or unreachable


@dataclass(frozen=True)
class StreamEvent:
    kind: StreamEventKind
    conn: ConnKey
    data: bytes = b""


@dataclass(frozen=True)
class Connect:
    """Open a stream from ``local`` (port 0: the network picks an ephemeral port) to ``remote``."""

    local: Addr
    remote: Addr


@dataclass(frozen=True)
class StreamWrite:
    conn: ConnKey
    data: bytes


@dataclass(frozen=True)
class StreamClose:
    conn: ConnKey


StreamCommand = Connect | StreamWrite | StreamClose


@runtime_checkable
class Endpoint(Protocol):
    """What a sans-IO core implements to be driven by :class:`SimNetwork` (datagrams + timer).

    ``addr`` in :meth:`receive` is the sender's address.  After *every* call into the endpoint
    the network collects :meth:`datagrams_to_send` (and :meth:`StreamEndpoint.stream_commands`)
    and then asks :meth:`get_timer` again, so a core never needs to be told to flush.  Those are
    the only times it asks (and when :meth:`SimNetwork.step`, ``run_until`` or
    ``run_until_idle`` starts, or a scheduled action ran): a deadline that something else moves
    meanwhile, another endpoint's callback say, is seen from the next of those on.
    """

    def receive(self, data: bytes, addr: Addr, now: float) -> None: ...

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]: ...

    def get_timer(self) -> float | None: ...

    def handle_timer(self, now: float) -> None: ...


class MultiPortEndpoint(Endpoint, Protocol):
    """Optional extras of an endpoint bound on several UDP ports (a core with an LBT-RU
    port besides its LBMR port), which must know which port a datagram hit and send from a
    chosen port.  Both are optional and looked up by name, so plain endpoints stay as they are:

    * ``receive_at(local_port, data, addr, now)`` is called *instead of*
      :meth:`Endpoint.receive` when the endpoint has it;
    * ``datagrams_from(now)`` returns ``(local port, data, destination)`` triples, collected
      after :meth:`Endpoint.datagrams_to_send` (which sends from the endpoint's first port).
    """

    def receive_at(self, local_port: int, data: bytes, addr: Addr, now: float) -> None: ...

    def datagrams_from(self, now: float) -> list[tuple[int, bytes, Addr]]: ...


@runtime_checkable
class StreamEndpoint(Endpoint, Protocol):
    """An endpoint that also uses streams; it accepts every connection to its address.

    Stream events are kept apart from :meth:`Endpoint.receive` so a core that speaks UDP and
    TCP never has to guess which one a remote address meant.
    """

    def stream_event(self, event: StreamEvent, now: float) -> None: ...

    def stream_commands(self, now: float) -> list[StreamCommand]: ...


class CallbackEndpoint:
    """An :class:`StreamEndpoint` made of plain callbacks and an outbox, for tests.

    It records everything it gets in :attr:`received` and :attr:`events`; ``send``, ``connect``,
    ``write`` and ``close`` queue output that the network collects on its next step (or right
    after the callback that queued it returns).
    """

    def __init__(
        self,
        on_datagram: Callable[[bytes, Addr, float], None] | None = None,
        on_stream: Callable[[StreamEvent, float], None] | None = None,
        on_timer: Callable[[float], None] | None = None,
    ) -> None:
        self.on_datagram, self.on_stream, self.on_timer = on_datagram, on_stream, on_timer
        self.received: list[tuple[float, Addr, bytes]] = []
        self.events: list[tuple[float, StreamEvent]] = []
        self.timer: float | None = None
        self._datagrams: list[tuple[bytes, Addr]] = []
        self._commands: list[StreamCommand] = []

    def send(self, data: bytes, dst: Addr) -> None:
        self._datagrams.append((bytes(data), dst))

    def connect(self, local: Addr, remote: Addr) -> None:
        self._commands.append(Connect(local, remote))

    def write(self, conn: ConnKey, data: bytes) -> None:
        self._commands.append(StreamWrite(conn, bytes(data)))

    def close(self, conn: ConnKey) -> None:
        self._commands.append(StreamClose(conn))

    def stream_bytes(self, conn: ConnKey) -> bytes:
        """Every DATA byte received on ``conn`` so far, in order."""
        return b"".join(e.data for _, e in self.events
                        if e.conn == conn and e.kind is StreamEventKind.DATA)

    # Endpoint / StreamEndpoint
    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        self.received.append((now, addr, data))
        if self.on_datagram is not None:
            self.on_datagram(data, addr, now)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        out, self._datagrams = self._datagrams, []
        return out

    def get_timer(self) -> float | None:
        return self.timer

    def handle_timer(self, now: float) -> None:
        self.timer = None
        if self.on_timer is not None:
            self.on_timer(now)

    def stream_event(self, event: StreamEvent, now: float) -> None:
        self.events.append((now, event))
        if self.on_stream is not None:
            self.on_stream(event, now)

    def stream_commands(self, now: float) -> list[StreamCommand]:
        out, self._commands = self._commands, []
        return out


def _speaks_streams(ep: object) -> bool:
    """``isinstance(ep, StreamEndpoint)`` without the cost of a runtime protocol check."""
    return callable(getattr(ep, "stream_event", None)) and \
        callable(getattr(ep, "stream_commands", None))


# --- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LinkConfig:
    """Impairments of the one-way link from one node to another.

    ``delay`` + uniform ``[0, jitter)`` applies to everything; jitter alone can reorder
    datagrams.  ``loss``, ``duplicate`` and ``reorder`` are per-datagram probabilities (streams
    ignore them): a reordered datagram is held ``reorder_delay`` longer, a duplicate arrives
    again up to ``reorder_delay`` after the original.
    """

    delay: float = 0.0001
    jitter: float = 0.0
    loss: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    reorder_delay: float = 0.005

    def __post_init__(self) -> None:
        for name in ("loss", "duplicate", "reorder"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be a probability, not {getattr(self, name)}")
        if min(self.delay, self.jitter, self.reorder_delay) < 0:
            raise ValueError("delays must not be negative")


@dataclass(frozen=True)
class Chunking:
    """How stream bytes are cut into deliveries.

    Each delivery hands over ``randint(min_size, max_size)`` bytes (capped by what has
    arrived; ``max_size=None`` means everything that has arrived).  ``merge_window`` holds the
    first delivery after an idle period that long, so writes made close together arrive
    merged.  The defaults deliver each write as it comes, which is what a loopback socket
    usually does and what tests that do not care about chunking want.
    """

    min_size: int = 1
    max_size: int | None = None
    merge_window: float = 0.0

    def __post_init__(self) -> None:
        if self.min_size < 1 or (self.max_size is not None and self.max_size < self.min_size):
            raise ValueError("need 1 <= min_size <= max_size")
        if self.merge_window < 0:
            raise ValueError("merge_window must not be negative")


# --- the record of what happened ----------------------------------------------------------------


@dataclass(frozen=True)
class CapturedPacket:
    """One delivery, as seen at the receiver.

    ``kind`` is ``"data"`` for datagrams and stream chunks, ``"syn"``, ``"fin"`` or ``"rst"``
    for stream control (so the pcap shows whole TCP conversations).  ``dst`` is the address the
    sender used, a group address for multicast; ``node`` names the receiving node, which tells
    the copies of one multicast datagram apart.
    """

    time: float
    src: Addr
    dst: Addr
    proto: Literal["udp", "tcp"]
    data: bytes
    kind: Literal["data", "syn", "fin", "rst"] = "data"
    node: str = ""


def write_pcap(packets: Iterable[CapturedPacket], path: str | Path,
               epoch: float = 1_700_000_000.0) -> int:
    """Write captured packets as an Ethernet pcap at ``epoch + time``; returns the frame count.

    Each stream becomes a TCP conversation with consistent sequence numbers (handshake on
    ``syn``, FIN and RST on ``fin``/``rst``) so tshark and ``ump dissect`` reassemble it.
    """
    convs: dict[frozenset[Addr], _TcpTrack] = {}
    count = 0
    with PcapWriter(path) as writer:
        for p in packets:
            ts = epoch + p.time
            if p.proto == "udp":
                frames = [udp_frame(p.src[0], p.src[1], p.dst[0], p.dst[1], p.data)]
            else:
                pair = frozenset((p.src, p.dst))
                if p.kind == "syn" or pair not in convs:
                    convs[pair] = _TcpTrack(p.src, p.dst)
                frames = convs[pair].frames(p)
            for frame in frames:
                writer.write(ts, frame)
                count += 1
    return count


class _TcpTrack:
    def __init__(self, client: Addr, server: Addr) -> None:
        self.seq = {client: 1000, server: 5000}

    def _frame(self, src: Addr, dst: Addr, flags: int, payload: bytes = b"") -> bytes:
        seq = self.seq[src]
        ack = self.seq[dst] if flags & TCP_ACK else 0
        self.seq[src] = (seq + len(payload) + (1 if flags & (TCP_SYN | TCP_FIN) else 0))
        return tcp_frame(src[0], src[1], dst[0], dst[1], seq, ack, flags, payload)

    def frames(self, p: CapturedPacket) -> list[bytes]:
        if p.kind == "syn":
            return [self._frame(p.src, p.dst, TCP_SYN),
                    self._frame(p.dst, p.src, TCP_SYN | TCP_ACK),
                    self._frame(p.src, p.dst, TCP_ACK)]
        if p.kind == "fin":
            return [self._frame(p.src, p.dst, TCP_FIN | TCP_ACK)]
        if p.kind == "rst":
            return [self._frame(p.src, p.dst, TCP_RST | TCP_ACK)]
        return [self._frame(p.src, p.dst, TCP_PSH | TCP_ACK, p.data)]


# --- the network --------------------------------------------------------------------------------


class VirtualClock:
    """Simulated time in seconds; it moves only when the simulator advances it, never back."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    @property
    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        if t < self._now:
            raise SimulationError(f"time cannot go back from {self._now} to {t}")
        self._now = t


@dataclass
class _Node:
    name: str
    ip: str
    alive: bool = True
    endpoints: dict[int, Endpoint] = field(default_factory=dict)


@dataclass
class _Pipe:
    """One direction of a stream: written bytes in flight, then arrived but undelivered."""

    src: _Node
    dst: _Node
    rng: random.Random
    inflight: deque[tuple[float, bytes | None]] = field(default_factory=deque)  # None: FIN
    ready: bytearray = field(default_factory=bytearray)
    fin_ready: bool = False
    last_arrival: float = 0.0
    scheduled: bool = False
    held: bool = False  # a delivery found the link cut; waits for heal


@dataclass
class _Conn:
    """A stream between two endpoints; side 0 connected, side 1 accepted."""

    ident: int
    keys: tuple[ConnKey, ConnKey]
    owners: tuple[Endpoint, Endpoint]
    nodes: tuple[_Node, _Node]
    pipes: tuple[_Pipe, _Pipe]  # pipes[i] carries side i's writes to side 1 - i
    accepted: bool = False
    established: bool = False
    closed: list[bool] = field(default_factory=lambda: [False, False])
    dead: bool = False


class SimNetwork:
    """Nodes, links, streams and a discrete-event loop over a :class:`VirtualClock`.

    Drive it with :meth:`step`, :meth:`run_until` or :meth:`run_until_idle`.  Each step does
    one thing at the earliest virtual time: deliver one due event (a datagram, a stream chunk,
    a stream event), or fire one due endpoint timer.  Events go before timers at equal times,
    then by the order they were scheduled, then endpoints in bind order, which makes a run a
    pure function of the seed and the scenario.

    Every delivery goes to the ``capture_hooks`` and, unless ``keep_trace`` is False, into
    :attr:`trace`; a long run (a capture of millions of messages) streams from a hook and keeps
    nothing, since the trace grows with every packet.
    """

    def __init__(self, seed: int = 0, *, clock: VirtualClock | None = None,
                 link: LinkConfig | None = None, chunking: Chunking | None = None,
                 connect_timeout: float = 3.0, keep_trace: bool = True) -> None:
        self.seed = seed
        self.keep_trace = keep_trace
        self.clock = clock or VirtualClock()
        self.default_link = link or LinkConfig()
        self.chunking = chunking or Chunking()
        self.connect_timeout = connect_timeout
        self.trace: list[CapturedPacket] = []
        self.capture_hooks: list[Callable[[CapturedPacket], None]] = []
        self.stats: dict[str, int] = dict.fromkeys(
            ("sent", "delivered", "lost", "duplicated", "reordered", "partitioned", "unreachable",
             "stream_writes", "stream_chunks", "stream_writes_dropped"), 0)
        self._nodes: dict[str, _Node] = {}
        self._by_ip: dict[str, _Node] = {}
        self._bound: list[tuple[_Node, int]] = []  # bind order: timer tie-break order
        # endpoint timers: (deadline, bind rank, id(endpoint)) entries, valid while the
        # endpoint's last read deadline (``_timer_of``) is that deadline; stale ones are
        # skipped when they reach the top (see ``_next_timer``)
        self._timer_heap: list[tuple[float, int, int]] = []
        self._timer_of: dict[int, float] = {}
        self._placement: dict[int, tuple[int, _Node, Endpoint]] | None = None
        self._groups: dict[Addr, list[Addr]] = {}
        self._links: dict[tuple[str, str], LinkConfig] = {}
        self._rngs: dict[str, random.Random] = {}
        self._cut: set[tuple[str, str]] = set()
        self._conns: dict[ConnKey, tuple[_Conn, int]] = {}
        self._conn_ids = itertools.count(1)
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._ephemeral: dict[str, int] = {}
        self._last_t, self._same_t_steps = -math.inf, 0  # livelock guard

    @property
    def now(self) -> float:
        return self.clock.now

    # --- topology -------------------------------------------------------------------------------

    def add_node(self, name: str, ip: str) -> None:
        if name in self._nodes or ip in self._by_ip:
            raise SimulationError(f"node {name!r} or address {ip} already exists")
        if is_multicast(ip):
            raise SimulationError(f"{ip} is a multicast address")
        self._nodes[name] = self._by_ip[ip] = _Node(name, ip)

    def bind(self, node: str, port: int, endpoint: Endpoint) -> Addr:
        """Attach ``endpoint`` to ``node``'s address at ``port``; returns the address."""
        n = self._node(node)
        if port in n.endpoints:
            raise SimulationError(f"{n.ip}:{port} is already bound")
        n.endpoints[port] = endpoint
        self._bound.append((n, port))
        self._placement = None
        self._timer_of.pop(id(endpoint), None)  # read afresh (an id may be a dead one's)
        return (n.ip, port)

    def join(self, addr: Addr, group: Addr) -> None:
        """Deliver datagrams sent to the multicast ``group`` to the endpoint at ``addr`` too."""
        if not is_multicast(group[0]):
            raise SimulationError(f"{group[0]} is not a multicast address")
        members = self._groups.setdefault(group, [])
        if addr not in members:
            members.append(addr)

    def leave(self, addr: Addr, group: Addr) -> None:
        if addr in self._groups.get(group, []):
            self._groups[group].remove(addr)

    def endpoint(self, addr: Addr) -> Endpoint | None:
        node = self._by_ip.get(addr[0])
        return node.endpoints.get(addr[1]) if node else None

    def _node(self, name: str) -> _Node:
        try:
            return self._nodes[name]
        except KeyError:
            raise SimulationError(f"no node {name!r}") from None

    # --- impairments ----------------------------------------------------------------------------

    def set_link(self, src: str, dst: str, config: LinkConfig, *, both_ways: bool = True) -> None:
        """Impair the link from node ``src`` to node ``dst`` (and back, unless ``both_ways``)."""
        self._node(src), self._node(dst)
        self._links[(src, dst)] = config
        if both_ways:
            self._links[(dst, src)] = config

    def link(self, src: str, dst: str) -> LinkConfig:
        return self._links.get((src, dst), self.default_link)

    def partition(self, side_a: Iterable[str], side_b: Iterable[str], *,
                  sever_streams: bool = False, both_ways: bool = True) -> None:
        """Cut every link from ``side_a`` to ``side_b`` (and back, unless ``both_ways``).

        Datagrams crossing a cut are dropped, including ones already in flight.  Streams stall
        and resume after :meth:`heal`, as TCP retransmission would; ``sever_streams`` resets
        the ones crossing the cut instead (both ends told, like a keepalive timeout).
        """
        a, b = list(side_a), list(side_b)
        for x in a:
            for y in b:
                self._node(x), self._node(y)
                self._cut.add((x, y))
                if both_ways:
                    self._cut.add((y, x))
        if sever_streams:
            for conn, _ in list(self._conns.values()):
                if not conn.dead and self._crosses_cut(conn):
                    self._reset(conn, notify=(0, 1))

    def heal(self, side_a: Iterable[str] | None = None,
             side_b: Iterable[str] | None = None) -> None:
        """Restore links between the two sides (both ways), or every link if no sides given."""
        if side_a is None or side_b is None:
            self._cut.clear()
        else:
            b = list(side_b)
            self._cut -= {p for x in side_a for y in b for p in ((x, y), (y, x))}
        for conn, _ in self._conns.values():
            for pipe in conn.pipes:
                if pipe.held and not self._is_cut(pipe.src, pipe.dst):
                    pipe.held = False
                    self._schedule_pipe(conn, pipe, self.now + self._delay(pipe.src, pipe.dst))

    def _is_cut(self, src: _Node, dst: _Node) -> bool:
        return (src.name, dst.name) in self._cut

    def _crosses_cut(self, conn: _Conn) -> bool:
        a, b = conn.nodes
        return self._is_cut(a, b) or self._is_cut(b, a)

    def kill(self, node: str) -> None:
        """Crash ``node``: its endpoints go silent, traffic to it is dropped, and every stream
        it has is reset (peers get RESET after one link delay).  Datagrams it already sent are
        still in flight and arrive."""
        n = self._node(node)
        n.alive = False
        for conn, side in list(self._conns.values()):
            if conn.nodes[side] is n and not conn.dead:
                self._reset(conn, notify=(1 - side,))

    def restart(self, node: str, endpoints: Mapping[int, Endpoint] | None = None) -> None:
        """Bring ``node`` back; ``endpoints`` replaces the ones on those ports (fresh state)."""
        n = self._node(node)
        n.alive = True
        for port, ep in (endpoints or {}).items():
            if port not in n.endpoints:
                self._bound.append((n, port))
            else:
                self._timer_of.pop(id(n.endpoints[port]), None)  # replaced: forget its timer
            n.endpoints[port] = ep
        self._placement = None
        for ep in {id(e): e for e in n.endpoints.values()}.values():  # timers count again
            self._timer_of.pop(id(ep), None)
            self._read_timer(ep)

    def sever(self, conn: ConnKey) -> None:
        """Reset one stream; both ends get RESET after one link delay."""
        entry = self._conns.get(conn)
        if entry is None:
            raise SimulationError(f"no stream {conn}")
        self._reset(entry[0], notify=(0, 1))

    # --- random draws ---------------------------------------------------------------------------

    def _rng(self, name: str) -> random.Random:
        rng = self._rngs.get(name)
        if rng is None:
            rng = self._rngs[name] = random.Random(f"{self.seed}/{name}")
        return rng

    def _delay(self, src: _Node, dst: _Node) -> float:
        cfg = self.link(src.name, dst.name)
        jitter = self._rng(f"link/{src.name}/{dst.name}").random() * cfg.jitter if cfg.jitter else 0
        return cfg.delay + jitter

    # --- scheduling -----------------------------------------------------------------------------

    def _at(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._queue, (max(t, self.now), next(self._seq), action))

    def call_at(self, t: float, action: Callable[[], None]) -> None:
        """Run a scenario action (kill, partition, inject) at virtual time ``t``.

        Output the action queues on endpoints (``CallbackEndpoint.send``) leaves right after it.
        """
        def run() -> None:
            action()
            self._flush_all()

        self._at(t, run)

    # --- datagrams ------------------------------------------------------------------------------

    def send_datagram(self, src: Addr, dst: Addr, data: bytes) -> None:
        """Send one datagram now from ``src`` (which must be on a node) to ``dst``."""
        node = self._by_ip.get(src[0])
        if node is None:
            raise SimulationError(f"no node has address {src[0]}")
        if not node.alive:
            return
        self.stats["sent"] += 1
        targets = list(self._groups.get(dst, [])) if is_multicast(dst[0]) else [dst]
        for target in targets:
            if target == src:
                continue
            dnode = self._by_ip.get(target[0])
            if dnode is None:
                self.stats["unreachable"] += 1
                continue
            self._send_copy(node, dnode, src, dst, target, bytes(data))

    def _send_copy(self, snode: _Node, dnode: _Node, src: Addr, dst: Addr, target: Addr,
                   data: bytes) -> None:
        cfg = self.link(snode.name, dnode.name)
        rng = self._rng(f"link/{snode.name}/{dnode.name}")
        if cfg.loss and rng.random() < cfg.loss:
            self.stats["lost"] += 1
            return
        delay = cfg.delay + (rng.random() * cfg.jitter if cfg.jitter else 0.0)
        if cfg.reorder and rng.random() < cfg.reorder:
            self.stats["reordered"] += 1
            delay += cfg.reorder_delay
        arrivals = [delay]
        if cfg.duplicate and rng.random() < cfg.duplicate:
            self.stats["duplicated"] += 1
            arrivals.append(delay + rng.random() * cfg.reorder_delay)
        for d in arrivals:
            self._at(self.now + d,
                     lambda: self._deliver_datagram(snode, dnode, src, dst, target, data))

    def _deliver_datagram(self, snode: _Node, dnode: _Node, src: Addr, dst: Addr, target: Addr,
                          data: bytes) -> None:
        if self._is_cut(snode, dnode):
            self.stats["partitioned"] += 1
            return
        ep = dnode.endpoints.get(target[1])
        if not dnode.alive or ep is None:
            self.stats["unreachable"] += 1
            return
        self.stats["delivered"] += 1
        self._capture(CapturedPacket(self.now, src, dst, "udp", data, "data", dnode.name))
        receive_at = getattr(ep, "receive_at", None)
        if receive_at is not None:  # a core bound on several ports learns which one was hit
            receive_at(target[1], data, src, self.now)
        else:
            ep.receive(data, src, self.now)
        self._collect(dnode, ep)

    # --- streams --------------------------------------------------------------------------------

    def connect(self, local: Addr, remote: Addr, owner: Endpoint | None = None) -> ConnKey:
        """Open a stream now; ``owner`` (default: the endpoint bound at ``local``) gets its
        events.  Port 0 in ``local`` picks an ephemeral port.  Returns the local key."""
        node = self._by_ip.get(local[0])
        if node is None:
            raise SimulationError(f"no node has address {local[0]}")
        owner = owner if owner is not None else node.endpoints.get(local[1])
        if owner is None:
            raise SimulationError(f"nothing bound at {local} to own the stream")
        if local[1] == 0:
            local = (local[0], self._ephemeral_port(node))
        key: ConnKey = (local, remote)
        if key in self._conns or (remote, local) in self._conns:
            raise SimulationError(f"stream {key} already exists")
        rnode = self._by_ip.get(remote[0])
        if not node.alive:
            return key
        if rnode is None:
            self._at(self.now + self.connect_timeout, lambda: self._event(
                node, owner, StreamEvent(StreamEventKind.REFUSED, key)))
            return key
        conn = _Conn(next(self._conn_ids), (key, (remote, local)), (owner, owner), (node, rnode),
                     (_Pipe(node, rnode, self._rng(f"conn/{key}/0")),
                      _Pipe(rnode, node, self._rng(f"conn/{key}/1"))))
        self._conns[key] = (conn, 0)
        syn = self.now + self._delay(node, rnode)
        conn.pipes[0].last_arrival = syn
        self._at(syn, lambda: self._syn_arrives(conn))
        return key

    def _ephemeral_port(self, node: _Node) -> int:
        lo, hi = EPHEMERAL_PORTS
        port = self._ephemeral.get(node.ip, lo)
        for _ in range(hi - lo + 1):
            taken = port in node.endpoints or any(
                k[0] == (node.ip, port) for k in self._conns)
            if not taken:
                self._ephemeral[node.ip] = port + 1 if port < hi else lo
                return port
            port = port + 1 if port < hi else lo
        raise SimulationError(f"no free ephemeral port on {node.ip}")

    def _syn_arrives(self, conn: _Conn) -> None:
        node, rnode = conn.nodes
        key = conn.keys[0]
        server = rnode.endpoints.get(key[1][1])
        if conn.dead:
            return
        if self._is_cut(node, rnode) or not rnode.alive or server is None \
                or not _speaks_streams(server):
            unreachable = self._is_cut(node, rnode) or not rnode.alive
            conn.dead = True
            del self._conns[key]
            back = self.connect_timeout if unreachable else self._delay(rnode, node)
            self._at(self.now + back, lambda: self._event(
                node, conn.owners[0], StreamEvent(StreamEventKind.REFUSED, key)))
            return
        conn.owners = (conn.owners[0], server)
        conn.accepted = True
        self._conns[conn.keys[1]] = (conn, 1)
        conn.pipes[1].last_arrival = self.now
        self._capture(CapturedPacket(self.now, key[0], key[1], "tcp", b"", "syn", rnode.name))
        synack = self.now + self._delay(rnode, node)
        conn.pipes[1].last_arrival = synack
        self._event(rnode, server, StreamEvent(StreamEventKind.ACCEPTED, conn.keys[1]))
        self._at(synack, lambda: self._established(conn))

    def _established(self, conn: _Conn) -> None:
        if conn.dead:
            return
        conn.established = True
        self._event(conn.nodes[0], conn.owners[0],
                    StreamEvent(StreamEventKind.CONNECTED, conn.keys[0]))

    def stream_send(self, conn: ConnKey, data: bytes) -> None:
        """Write ``data`` on the stream ``conn`` (a local key) now."""
        entry = self._conns.get(conn)
        if entry is None or entry[0].dead or entry[0].closed[entry[1]] or not data:
            self.stats["stream_writes_dropped"] += 1 if data else 0
            return
        c, side = entry
        self.stats["stream_writes"] += 1
        self._pipe_write(c, c.pipes[side], bytes(data))

    def stream_close(self, conn: ConnKey) -> None:
        """Close our end: the peer gets CLOSED after every byte written before it."""
        entry = self._conns.get(conn)
        if entry is None or entry[0].dead or entry[0].closed[entry[1]]:
            return
        c, side = entry
        c.closed[side] = True
        self._pipe_write(c, c.pipes[side], None)

    def _pipe_write(self, conn: _Conn, pipe: _Pipe, data: bytes | None) -> None:
        arrival = max(self.now + self._delay(pipe.src, pipe.dst), pipe.last_arrival)
        pipe.last_arrival = arrival
        pipe.inflight.append((arrival, data))
        if not pipe.scheduled and not pipe.held:
            self._schedule_pipe(conn, pipe, arrival + self.chunking.merge_window)

    def _schedule_pipe(self, conn: _Conn, pipe: _Pipe, t: float) -> None:
        pipe.scheduled = True
        self._at(t, lambda: self._pipe_deliver(conn, pipe))

    def _pipe_deliver(self, conn: _Conn, pipe: _Pipe) -> None:
        pipe.scheduled = False
        if conn.dead:
            return
        if self._is_cut(pipe.src, pipe.dst):
            pipe.held = True
            return
        while pipe.inflight and pipe.inflight[0][0] <= self.now and not pipe.fin_ready:
            _, data = pipe.inflight.popleft()
            if data is None:
                pipe.fin_ready = True
            else:
                pipe.ready += data
        side = conn.pipes.index(pipe)
        dst_side = 1 - side
        src_key = conn.keys[side]
        if pipe.ready:
            cfg = self.chunking
            if cfg.max_size is None:
                size = len(pipe.ready)
            else:
                size = min(len(pipe.ready), pipe.rng.randint(cfg.min_size, cfg.max_size))
            chunk = bytes(pipe.ready[:size])
            del pipe.ready[:size]
            self.stats["stream_chunks"] += 1
            if not conn.closed[dst_side]:
                self._capture(CapturedPacket(self.now, src_key[0], src_key[1], "tcp", chunk,
                                             "data", pipe.dst.name))
                self._event(pipe.dst, conn.owners[dst_side],
                            StreamEvent(StreamEventKind.DATA, conn.keys[dst_side], chunk))
        elif pipe.fin_ready:
            self._capture(CapturedPacket(self.now, src_key[0], src_key[1], "tcp", b"", "fin",
                                         pipe.dst.name))
            if conn.closed[dst_side]:
                self._forget(conn)
            else:
                self._event(pipe.dst, conn.owners[dst_side],
                            StreamEvent(StreamEventKind.CLOSED, conn.keys[dst_side]))
                # the peer may keep writing: a half-closed stream still carries its bytes
            return
        if conn.dead:
            return
        if pipe.ready or pipe.fin_ready:
            self._schedule_pipe(conn, pipe, self.now)
        elif pipe.inflight:
            self._schedule_pipe(conn, pipe, pipe.inflight[0][0] + self.chunking.merge_window)

    def _forget(self, conn: _Conn) -> None:
        conn.dead = True
        for key in conn.keys:
            if self._conns.get(key, (None,))[0] is conn:
                del self._conns[key]

    def _reset(self, conn: _Conn, notify: tuple[int, ...]) -> None:
        self._forget(conn)
        for side in notify:
            if conn.closed[side] or (side == 1 and not conn.accepted):
                continue
            node, other = conn.nodes[side], conn.nodes[1 - side]
            key, owner = conn.keys[side], conn.owners[side]
            kind = StreamEventKind.RESET if conn.established or side == 1 \
                else StreamEventKind.REFUSED

            def deliver(node: _Node = node, key: ConnKey = key, owner: Endpoint = owner,
                        kind: StreamEventKind = kind) -> None:
                self._capture(CapturedPacket(self.now, key[1], key[0], "tcp", b"", "rst",
                                             node.name))
                self._event(node, owner, StreamEvent(kind, key))

            self._at(self.now + self._delay(other, node), deliver)

    def _event(self, node: _Node, owner: Endpoint, event: StreamEvent) -> None:
        if not node.alive or not any(e is owner for e in node.endpoints.values()):
            return
        if not _speaks_streams(owner):
            raise SimulationError(f"{owner!r} uses streams but has no stream_event()")
        owner.stream_event(event, self.now)  # type: ignore[attr-defined]
        self._collect(node, owner)

    # --- the loop -------------------------------------------------------------------------------

    def _collect(self, node: _Node, ep: Endpoint) -> None:
        """Take everything ``ep`` wants to send, right after a call into it."""
        if not node.alive:
            return
        port = next((p for p, e in node.endpoints.items() if e is ep), 0)
        for data, dst in ep.datagrams_to_send(self.now):
            self.send_datagram((node.ip, port), dst, data)
        datagrams_from = getattr(ep, "datagrams_from", None)
        if datagrams_from is not None:  # a core on several UDP ports says which one
            for local_port, data, dst in datagrams_from(self.now):
                self.send_datagram((node.ip, local_port), dst, data)
        if _speaks_streams(ep):
            for cmd in ep.stream_commands(self.now):  # type: ignore[attr-defined]
                if isinstance(cmd, Connect):
                    self.connect(cmd.local, cmd.remote, owner=ep)
                elif isinstance(cmd, StreamWrite):
                    self.stream_send(cmd.conn, cmd.data)
                else:
                    self.stream_close(cmd.conn)
        self._read_timer(ep)

    def _read_timer(self, ep: Endpoint) -> None:
        """Take note of ``ep``'s deadline (after a call into it, which may have moved it)."""
        t = ep.get_timer()
        key = id(ep)
        if t is None:
            self._timer_of.pop(key, None)
        elif self._timer_of.get(key) != t:
            self._timer_of[key] = t
            placed = self._placements().get(key)
            if placed is not None:
                heapq.heappush(self._timer_heap, (t, placed[0], key))

    def _placements(self) -> dict[int, tuple[int, _Node, Endpoint]]:
        """id(endpoint) -> (bind rank, node, endpoint), the rank being the position of its
        first binding in :attr:`_bound`; rebuilt after a bind or a restart."""
        if self._placement is None:
            placement: dict[int, tuple[int, _Node, Endpoint]] = {}
            for rank, (node, port) in enumerate(self._bound):
                ep = node.endpoints.get(port)
                if ep is not None and id(ep) not in placement:
                    placement[id(ep)] = (rank, node, ep)
            self._placement = placement
        return self._placement

    def _capture(self, packet: CapturedPacket) -> None:
        if self.keep_trace:
            self.trace.append(packet)
        for hook in self.capture_hooks:
            hook(packet)

    def _flush_all(self) -> None:
        """Collect output queued outside a network call (by a test or a scenario action)."""
        for node, port in self._bound:
            ep = node.endpoints.get(port)
            if ep is not None and node.alive:
                self._collect(node, ep)

    def _next(self) -> tuple[float, tuple[_Node, Endpoint] | None] | None:
        """The next step: its time and, for a timer, whose; ``None`` if nothing is pending.

        An event goes first when it is due no later than the earliest timer."""
        timer = self._next_timer()
        if self._queue and (timer is None or self._queue[0][0] <= timer[0]):
            return (self._queue[0][0], None)
        return timer

    def _next_timer(self) -> tuple[float, tuple[_Node, Endpoint]] | None:
        """The endpoint timer that fires next, at ``max(deadline, now)``.

        Deadlines are read after every call into an endpoint (:meth:`_collect`) and kept in a
        heap, so a step costs O(log timers), not a poll of every endpoint.  Ties go to the
        endpoint bound first; deadlines already past all fire "now", so among those the bind
        order decides, not the deadline.
        """
        heap, timer_of, placements = self._timer_heap, self._timer_of, self._placements()
        now = self.now
        due: list[tuple[float, int, int]] = []
        while heap:
            entry = heap[0]
            t, _, key = entry
            placed = placements.get(key)
            if timer_of.get(key) != t or placed is None or not placed[1].alive:
                heapq.heappop(heap)  # superseded, unbound, or on a dead node (re-read on
                if timer_of.get(key) == t:  # restart)
                    del timer_of[key]
                continue
            if t > now and due:
                break
            if t > now:
                return (t, (placed[1], placed[2]))
            due.append(heapq.heappop(heap))  # past or now: the bind order decides
        if not due:
            return None
        for entry in due:
            heapq.heappush(heap, entry)
        first = min(due, key=lambda e: e[1])
        _, node, ep = placements[first[2]]
        return (now, (node, ep))

    def _do(self, nxt: tuple[float, tuple[_Node, Endpoint] | None]) -> None:
        t, timer = nxt
        if timer is None:
            t, _, action = heapq.heappop(self._queue)
            self.clock.advance_to(t)
            action()
        else:
            node, ep = timer
            self.clock.advance_to(t)
            ep.handle_timer(self.now)
            self._collect(node, ep)
        if self.now != self._last_t:
            self._last_t, self._same_t_steps = self.now, 0
            return
        self._same_t_steps += 1
        if self._same_t_steps > LIVELOCK_STEPS:
            raise SimulationError(
                f"{LIVELOCK_STEPS} steps without time advancing at t={self.now} "
                "(a timer that never moves on?)")

    def next_time(self) -> float | None:
        """When the next step would happen, or ``None`` if nothing is pending."""
        self._flush_all()
        nxt = self._next()
        return None if nxt is None else nxt[0]

    def step(self) -> bool:
        """Do the next thing (one event, or one timer); ``False`` if there is nothing to do."""
        self._flush_all()
        nxt = self._next()
        if nxt is None:
            return False
        self._do(nxt)
        return True

    def run_until(self, t: float) -> None:
        """Do everything due up to and including virtual time ``t``; the clock ends at ``t``."""
        self._flush_all()
        while (nxt := self._next()) is not None and nxt[0] <= t:
            self._do(nxt)
        self.clock.advance_to(max(t, self.now))

    def run_until_idle(self, max_time: float) -> bool:
        """Run until nothing is pending (``True``) or the next thing is after ``max_time``
        (``False``; the clock then ends at ``max_time``)."""
        self._flush_all()
        while (nxt := self._next()) is not None:
            if nxt[0] > max_time:
                self.clock.advance_to(max(max_time, self.now))
                return False
            self._do(nxt)
        return True

    def write_pcap(self, path: str | Path, epoch: float = 1_700_000_000.0) -> int:
        """The trace so far as a pcap (see :func:`write_pcap`)."""
        if not self.keep_trace:
            raise SimulationError("this network keeps no trace (keep_trace=False): "
                                  "take the deliveries from a capture hook instead")
        return write_pcap(self.trace, path, epoch)
