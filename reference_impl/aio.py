"""Run the sans-IO cores on real sockets with asyncio, behaving as :mod:`reference_impl.sim` does.

The cores (store, source, receiver, resolver) never touch a socket or a clock: they implement
:class:`~reference_impl.sim.Endpoint` / :class:`~reference_impl.sim.StreamEndpoint`.  The
simulator drives them in virtual time; :class:`AioHost` drives the *same* objects on real UDP and
TCP sockets, so a scenario proven in simulation can be run against a real UM peer or captured on
the wire.  A core must not be able to tell the two apart, so the host copies the simulator's
conventions wherever the kernel allows:

* **After every call into an endpoint** (a datagram batch, a stream event, a timer) the host
  collects :meth:`datagrams_to_send`, then :meth:`stream_commands`, then re-reads
  :meth:`get_timer`.  ``now`` is :meth:`AioHost.now` (``loop.time()`` unless a ``clock`` is
  given); timers are absolute times on that clock.  A batch of datagrams that arrived in one
  wake-up is delivered with one ``now`` and collected once after the batch: the outputs are the
  same queues in the same order, only fewer method calls.
* **Connect keys.**  ``Connect(local, remote)`` binds a socket at ``local`` (port 0: the kernel
  picks an ephemeral port, right away) and the stream's key is ``((local ip, actual port),
  remote)`` with ``remote`` exactly as the core wrote it.  The core learns the key from the
  ``CONNECTED`` or ``REFUSED`` event's ``conn``, as in the simulator.  With an explicit local
  port the key is known up front and writes or a close issued before ``CONNECTED`` are held
  and applied once connected (the simulator queues them too).  A wildcard local IP
  (``0.0.0.0``) is replaced by the address the kernel chose once connected.
* **Accepted keys** are ``(our address, peer address)`` from the socket.
* **Events.**  ``CONNECTED``/``ACCEPTED`` when a stream opens; ``DATA`` per read (any chunking);
  ``CLOSED`` on the peer's FIN; ``RESET`` when the stream dies any other way (RST, broken pipe,
  timeout); ``REFUSED`` when a connect fails (refused, unreachable, bind error, or no answer
  within ``connect_timeout``, 3 s by default like the simulator).  After ``CLOSED`` the core may
  keep writing (half-close), as in the simulator.
* **StreamClose** is a graceful half-close: the host sends FIN after every queued byte
  (``write_eof``), then keeps reading and *discards* what the peer still sends until the peer's
  FIN (or ``close_linger`` seconds), and the core hears nothing more of that stream.  That is the
  simulator's rule, and it avoids the kernel answering late peer data with an RST that could
  destroy our own unread final bytes at the peer.
* **Writes to a stream the host does not know** (never opened, already reset, closed by the
  core) are dropped and counted in ``stats["stream_writes_dropped"]``, as the simulator does; a
  core that writes after ``RESET`` is racing the network, not misbehaving.
* **Datagram source.**  Datagrams carry no source address in the interface, so an endpoint sends
  from its *first* bound UDP socket (the simulator sends from the endpoint's first bound port).
  An endpoint with no UDP socket that sends a datagram gets an ephemeral one on ``0.0.0.0``,
  which then also receives replies.  Datagrams from a socket's own address are dropped on
  receipt when it has joined a multicast group (the simulator never delivers a sender its own
  multicast), unless the port is shared (``reuse_address``), where "own" cannot be told apart
  from a neighbour on the same address (see :meth:`AioHost.join_multicast`).

Failures.  An exception raised inside a core is logged with the endpoint's name and where it
happened, then the *whole host stops* (all sockets closed, no further calls into any core) and
:meth:`AioHost.wait_closed`, ``async with`` and :func:`serve` raise :class:`CoreError` with the
original exception as ``__cause__``.  A harness must fail loudly, and a core that raised is in an
unknown state, so carrying on with it would produce traffic nobody can reason about.  The same
applies to malformed output (an unknown stream command) and to a timer that never moves on (the
real-time counterpart of the simulator's livelock guard).

Backpressure and memory.  ``transport.write`` never drops bytes: whatever the kernel does not
take is buffered in user space.  When a stream's buffer passes ``high_water`` bytes, the host
stops *reading* from every stream of that endpoint (``backpressure="endpoint"``, the default), or
only from that stream (``"connection"``), until the buffer drains below ``low_water``.  Readers
that stop reading make the peer's kernel buffers fill and TCP flow control slows the peer, so
memory per stream stays below ``high_water`` plus what the core writes in reaction to one input
(one read is at most 256 KiB).  Datagram input and timers are never paused (UDP has no flow
control; the kernel drops instead), so a core that turns datagrams into stream writes to a slow
consumer is bounded only by its own logic.  ``"none"`` disables the pausing (memory then grows
with the backlog; tests use it as the control case).

Performance.  UDP uses non-blocking sockets registered with ``loop.add_reader`` and drains up to
``RECV_BATCH`` datagrams per wake-up (asyncio's datagram transport reads one per loop iteration),
and TCP uses plain :class:`asyncio.Protocol` transports.  Consecutive writes to one stream in a
flush go out as one ``writelines`` call.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import functools
import logging
import signal
import socket
import sys
import threading
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, Literal, TypeVar, cast

from .sim import (
    Addr,
    Connect,
    ConnKey,
    Endpoint,
    StreamClose,
    StreamCommand,
    StreamEndpoint,
    StreamEvent,
    StreamEventKind,
    StreamWrite,
)

__all__ = [
    "AioHost",
    "Backpressure",
    "CoreError",
    "HostError",
    "TaskError",
    "run_forever",
    "serve",
]

log = logging.getLogger(__name__)

T = TypeVar("T")
Backpressure = Literal["endpoint", "connection", "none"]

RECV_BATCH = 128
"""Datagrams read per wake-up of one UDP socket before the loop gets a turn to do other work."""

MAX_DATAGRAM = 65535
TIMER_STUCK_LIMIT = 10_000
"""Timer firings in a row after which a deadline that never moves is declared a livelock."""

_DATA, _CLOSED, _RESET = StreamEventKind.DATA, StreamEventKind.CLOSED, StreamEventKind.RESET
_WILDCARD = ("", "0.0.0.0")


class HostError(RuntimeError):
    """The host was misused (bad address, endpoint without the needed methods, closed host)."""


class CoreError(HostError):
    """A core raised, or produced output the host cannot carry out; the host has stopped.

    ``endpoint`` names the core, ``where`` says which call failed; the core's own exception, if
    any, is ``__cause__``.
    """

    def __init__(self, endpoint: str, where: str, detail: str) -> None:
        super().__init__(f"endpoint {endpoint!r} failed in {where}: {detail}")
        self.endpoint, self.where = endpoint, where


class TaskError(CoreError):
    """An application task started with :meth:`AioHost.spawn` raised; the host has stopped.

    ``endpoint`` is the task's name and ``where`` is ``"task"``; the exception is ``__cause__``.
    """

    def __init__(self, task: str, detail: str) -> None:
        HostError.__init__(self, f"task {task!r} failed: {detail}")
        self.endpoint, self.where = task, "task"


def _speaks_streams(ep: object) -> bool:
    return callable(getattr(ep, "stream_event", None)) and \
        callable(getattr(ep, "stream_commands", None))


class _EndpointState:
    """Everything the host keeps for one core: its sockets, streams and timer."""

    __slots__ = ("congested", "drain_events", "endpoint", "event_handler", "flush_scheduled",
                 "held", "name", "servers", "streams", "streams_capable", "timer_handle",
                 "timer_stuck", "timer_when", "udp", "udp_out")

    def __init__(self, endpoint: Endpoint, name: str) -> None:
        self.endpoint = endpoint
        self.name = name
        self.streams_capable = _speaks_streams(endpoint)
        self.udp: list[_UdpSocket] = []
        self.udp_out: _UdpSocket | None = None  # where datagrams leave from: the first bound
        self.streams: dict[ConnKey, _Stream] = {}
        self.servers: list[asyncio.Server] = []  # its TCP listeners
        self.congested: set[_Stream] = set()
        self.timer_handle: asyncio.TimerHandle | None = None
        self.timer_when: float | None = None  # the deadline (our clock) timer_handle is for
        self.timer_stuck = 0
        self.flush_scheduled = False
        self.held = False  # inside AioHost.starting(): no output, no timers yet
        self.event_handler: Callable[[Any], None] | None = None
        # the endpoint's events(): every queued event at once (next_event() otherwise)
        self.drain_events: Callable[[], list[Any]] | None = None


class _UdpSocket:
    """A non-blocking UDP socket read in batches through ``loop.add_reader``.

    Sends go straight to ``sendto``; if the kernel's send buffer is full the datagram waits in
    :attr:`backlog` (never dropped by us) and the socket is watched for writability.
    """

    __slots__ = ("addr", "backlog", "host", "own", "shared", "sock", "state")

    def __init__(self, host: AioHost, state: _EndpointState, sock: socket.socket,
                 shared: bool) -> None:
        self.host, self.state, self.sock, self.shared = host, state, sock, shared
        self.addr: Addr = sock.getsockname()[:2]
        self.backlog: deque[tuple[bytes, Addr]] = deque()
        self.own: frozenset[Addr] = frozenset()  # set on multicast join: our own echoes

    def read_ready(self) -> None:
        host = self.host
        if host._closed:
            return
        state = self.state
        receive_at = getattr(state.endpoint, "receive_at", None)
        # a core on several UDP ports (LBMR and LBT-RU) learns which one a datagram hit
        receive = functools.partial(receive_at, self.addr[1]) if receive_at is not None \
            else state.endpoint.receive
        recvfrom = self.sock.recvfrom
        own = self.own
        now = host._clock()
        count = 0
        try:
            for _ in range(RECV_BATCH):
                try:
                    data, addr = recvfrom(MAX_DATAGRAM)
                except (BlockingIOError, InterruptedError):
                    break
                except OSError as exc:  # an ICMP error queued on the socket: not fatal for UDP
                    host.stats["udp_errors"] += 1
                    log.debug("%s: UDP receive on %s: %s", state.name, self.addr, exc)
                    continue
                count += 1
                if own and addr in own:
                    continue
                receive(data, addr, now)
        except Exception as exc:
            host.stats["datagrams_received"] += count
            host._core_failed(state, "receive", exc)
            return
        if count:
            host.stats["datagrams_received"] += count
            host._flush(state)

    def send(self, datagrams: list[tuple[bytes, Addr]]) -> None:
        host = self.host
        if self.backlog:
            self.backlog.extend(datagrams)
            return
        sendto = self.sock.sendto
        sent = 0
        for i, (data, dst) in enumerate(datagrams):
            try:
                sendto(data, dst)
                sent += 1
            except (BlockingIOError, InterruptedError):
                self.backlog.extend(datagrams[i:])
                host._loop.add_writer(self.sock.fileno(), self.write_ready)
                break
            except OSError as exc:
                self._send_error(exc, data, dst)
        host.stats["datagrams_sent"] += sent

    def write_ready(self) -> None:
        backlog, sendto = self.backlog, self.sock.sendto
        sent = 0
        while backlog:
            data, dst = backlog[0]
            try:
                sendto(data, dst)
                sent += 1
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                self._send_error(exc, data, dst)
            backlog.popleft()
        self.host.stats["datagrams_sent"] += sent
        if not backlog:
            self.host._loop.remove_writer(self.sock.fileno())

    def _send_error(self, exc: OSError, data: bytes, dst: Addr) -> None:
        """A datagram the kernel refused (too big, no route): count it and say so, loudly."""
        self.host.stats["udp_errors"] += 1
        level = logging.ERROR if exc.errno == errno.EMSGSIZE else logging.WARNING
        log.log(level, "%s: UDP send of %d bytes from %s to %s failed: %s",
                self.state.name, len(data), self.addr, dst, exc)

    def close(self) -> None:
        fd = self.sock.fileno()
        if fd >= 0:
            self.host._loop.remove_reader(fd)
            self.host._loop.remove_writer(fd)
        self.sock.close()


class _Stream(asyncio.Protocol):
    """One TCP stream of one endpoint; also the asyncio protocol of its transport."""

    def __init__(self, host: AioHost, state: _EndpointState, key: ConnKey | None,
                 outgoing: bool) -> None:
        self.host, self.state, self.key, self.outgoing = host, state, key, outgoing
        self.transport: asyncio.Transport | None = None
        self.pending: list[bytes] = []  # writes issued before an outgoing stream connected
        self.peer_eof = False
        self.closed_by_us = False
        self.paused_by_us = False
        self.lost = False
        self.linger: asyncio.TimerHandle | None = None

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        tr = cast(asyncio.Transport, transport)
        self.transport = tr
        host, state = self.host, self.state
        tr.set_write_buffer_limits(high=host.high_water, low=host.low_water)
        host._transports.add(tr)
        if host._closed:
            tr.abort()
            return
        if self.outgoing:
            assert self.key is not None
            local, remote = self.key
            if local[0] in _WILDCARD:  # the kernel has chosen our address now: re-key
                if state.streams.get(self.key) is self:
                    del state.streams[self.key]
                self.key = (tr.get_extra_info("sockname")[:2], remote)
                state.streams[self.key] = self
            kind = StreamEventKind.CONNECTED
        else:
            self.key = (tr.get_extra_info("sockname")[:2], tr.get_extra_info("peername")[:2])
            state.streams[self.key] = self
            kind = StreamEventKind.ACCEPTED
        if state.congested and host.backpressure == "endpoint":
            self.pause()
        # bytes the core wrote before the connect completed go first, then its close
        if self.pending:
            data, self.pending = self.pending, []
            host._write(self, data)
        if self.closed_by_us:
            self.shutdown()
        host._stream_event(state, StreamEvent(kind, self.key))

    def data_received(self, data: bytes) -> None:
        if self.closed_by_us:
            self.host.stats["stream_bytes_discarded"] += len(data)
            return
        self.host.stats["stream_bytes_received"] += len(data)
        assert self.key is not None
        self.host._stream_event(self.state, StreamEvent(_DATA, self.key, data))

    def eof_received(self) -> bool:
        if self.peer_eof:
            return True
        self.peer_eof = True
        self.paused_by_us = False  # the transport stopped reading for good
        if self.closed_by_us:
            return False  # both directions done: let the transport close
        assert self.key is not None
        self.host._stream_event(self.state, StreamEvent(_CLOSED, self.key))
        return True  # stay open: the core may still write (half-close)

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        host, state = self.host, self.state
        if self.transport is not None:
            host._transports.discard(self.transport)
        if self.linger is not None:
            self.linger.cancel()
        if self.key is not None and state.streams.get(self.key) is self:
            del state.streams[self.key]
        if self in state.congested:
            self.resume_writing()
        if host._closed or self.closed_by_us or (exc is None and self.peer_eof):
            return
        if exc is not None:
            log.debug("%s: stream %s lost: %s", state.name, self.key, exc)
        assert self.key is not None
        host._stream_event(state, StreamEvent(_RESET, self.key))

    def pause_writing(self) -> None:
        self.host._congestion(self, True)

    def resume_writing(self) -> None:
        self.host._congestion(self, False)

    # --- host side ----------------------------------------------------------------------------

    def pause(self) -> None:
        if self.transport is not None and not (self.paused_by_us or self.peer_eof
                                               or self.closed_by_us or self.lost):
            self.paused_by_us = True
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.paused_by_us and self.transport is not None and not self.lost:
            self.paused_by_us = False
            self.transport.resume_reading()

    def shutdown(self) -> None:
        """The core's StreamClose: FIN after the queued bytes, drain the peer, forget."""
        tr = self.transport
        if tr is None or self.lost:
            return
        self.resume()  # keep draining what the peer still sends so it never sees our RST
        if self.peer_eof:
            tr.close()
        else:
            tr.write_eof()
            self.linger = self.host._loop.call_later(self.host.close_linger, tr.close)


class AioHost:
    """Drives any number of sans-IO endpoints on real sockets in the running asyncio loop.

    Create it inside a coroutine (it binds to the running loop), bind endpoints, then let the
    loop run.  ``clock`` replaces ``loop.time()`` as the time the cores see; it must advance at
    real-time rate (timers are mapped onto the loop's clock by their distance from now).
    """

    def __init__(self, *, clock: Callable[[], float] | None = None,
                 connect_timeout: float = 3.0, high_water: int = 1 << 20,
                 low_water: int | None = None, backpressure: Backpressure = "endpoint",
                 close_linger: float = 30.0, udp_rcvbuf: int | None = 4 << 20) -> None:
        if backpressure not in ("endpoint", "connection", "none"):
            raise ValueError(f"backpressure must be endpoint, connection or none, "
                             f"not {backpressure!r}")
        if high_water < 1 or (low_water is not None and not 0 <= low_water <= high_water):
            raise ValueError("need 0 <= low_water <= high_water and high_water >= 1")
        self._loop = asyncio.get_running_loop()
        self._clock = clock if clock is not None else self._loop.time
        self._clock_is_loop = clock is None
        self.connect_timeout = connect_timeout
        self.backpressure: Backpressure = backpressure
        # "none" still needs a limit for asyncio's bookkeeping; make it unreachable
        self.high_water = high_water if backpressure != "none" else 1 << 62
        self.low_water = (low_water if low_water is not None else high_water // 4) \
            if backpressure != "none" else (1 << 62) - 1
        self.close_linger = close_linger
        self.udp_rcvbuf = udp_rcvbuf
        self.stats: dict[str, int] = dict.fromkeys(
            ("datagrams_received", "datagrams_sent", "udp_errors", "stream_writes",
             "stream_writes_dropped", "stream_bytes_sent", "stream_bytes_received",
             "stream_bytes_discarded", "write_buffer_peak", "connects", "refused"), 0)
        self.failure: CoreError | None = None
        self._failure_seen = False  # raised to the caller already: do not raise it again
        self._states: dict[int, _EndpointState] = {}
        self._servers: list[asyncio.Server] = []
        self._transports: set[asyncio.Transport] = set()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._hurry = False  # aclose: stop waiting for streams to flush (a second Ctrl-C)
        self._closed = False
        self._closed_future: asyncio.Future[None] = self._loop.create_future()

    # --- time ---------------------------------------------------------------------------------

    def now(self) -> float:
        """The time the cores see."""
        return self._clock()

    # --- endpoints and sockets ----------------------------------------------------------------

    def register(self, endpoint: Endpoint, name: str | None = None) -> str:
        """Make ``endpoint`` known (binding does it too); returns its name for logs and errors.

        Its first output is collected soon after, so a core that connects or sends at start-up
        needs nothing more than this.
        """
        self._check_open()
        state = self._states.get(id(endpoint))
        if state is None:
            for method in ("receive", "datagrams_to_send", "get_timer", "handle_timer"):
                if not callable(getattr(endpoint, method, None)):
                    raise HostError(f"{endpoint!r} is not an Endpoint: no {method}()")
            name = name or getattr(endpoint, "name", None) or type(endpoint).__name__
            state = self._states[id(endpoint)] = _EndpointState(endpoint, str(name))
            self._schedule_flush(state)
        elif name is not None:
            state.name = name
        return state.name

    @contextlib.contextmanager
    def starting(self, endpoint: Endpoint, name: str | None = None) -> Iterator[None]:
        """Bind every socket of ``endpoint`` inside this block before it runs.

        A core's first flush fires the timers due at its start, and a source's first timer
        advertises its transport and request ports.  Binding them one ``await`` at a time
        would let that advertisement (and the registrations) out before the later ports
        accept connections, so a peer that answers at once is refused.  Inside the block the
        core gets input but neither sends nor runs timers; it starts when the block ends.

        When the block raises (a port another process took between a check and the bind),
        the endpoint never starts: it is forgotten (:meth:`forget`), so the caller can try
        again with a new core on other ports.
        """
        self.register(endpoint, name)
        state = self._state(endpoint)
        state.held = True
        try:
            yield
        except BaseException:
            self.forget(endpoint)
            raise
        state.held = False
        if not self._closed:
            self._schedule_flush(state)

    def forget(self, endpoint: Endpoint) -> None:
        """Stop driving ``endpoint``: close its sockets, listeners and streams, cancel its
        timer, and make it unknown to the host (for a core that could not start; the host
        and its other endpoints go on).  Nothing more is collected from it."""
        state = self._states.pop(id(endpoint), None)
        if state is None:
            return
        if state.timer_handle is not None:
            state.timer_handle.cancel()
            state.timer_handle = None
        for udp in state.udp:
            udp.close()
        state.udp.clear()
        state.udp_out = None
        for server in state.servers:
            server.close()
            if server in self._servers:
                self._servers.remove(server)
        state.servers.clear()
        for stream in list(state.streams.values()):
            if stream.linger is not None:
                stream.linger.cancel()
            if stream.transport is not None:
                stream.transport.abort()
        state.streams.clear()

    async def bind_udp(self, endpoint: Endpoint, addr: Addr, *, name: str | None = None,
                       reuse_address: bool = False) -> Addr:
        """Receive the datagrams sent to ``addr`` (port 0: any free port); returns the address.

        ``reuse_address`` sets SO_REUSEADDR, which several processes listening on one multicast
        port (LBMR topic resolution) need.
        """
        self.register(endpoint, name)
        return self._bind_udp_now(self._state(endpoint), addr, reuse_address).addr

    def _bind_udp_now(self, state: _EndpointState, addr: Addr, reuse: bool) -> _UdpSocket:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            sock.setblocking(False)
            if reuse:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.udp_rcvbuf:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.udp_rcvbuf)
            sock.bind(addr)
        except OSError as exc:
            sock.close()
            raise HostError(f"{state.name}: cannot bind UDP {addr}: {exc.strerror or exc}") \
                from exc
        udp = _UdpSocket(self, state, sock, reuse)
        state.udp.append(udp)
        if state.udp_out is None:
            state.udp_out = udp
        self._loop.add_reader(sock.fileno(), udp.read_ready)
        return udp

    async def listen_tcp(self, endpoint: StreamEndpoint, addr: Addr, *, name: str | None = None,
                         backlog: int = 128) -> Addr:
        """Accept TCP streams at ``addr`` (port 0: any free port) for ``endpoint``."""
        if not _speaks_streams(endpoint):
            raise HostError(f"{endpoint!r} listens for streams but has no stream_event() "
                            "and stream_commands()")
        self.register(endpoint, name)
        state = self._state(endpoint)
        try:
            server = await self._loop.create_server(
                lambda: _Stream(self, state, None, outgoing=False), addr[0], addr[1],
                family=socket.AF_INET, reuse_address=True, backlog=backlog)
        except OSError as exc:
            raise HostError(f"{state.name}: cannot listen on TCP {addr}: "
                            f"{exc.strerror or exc}") from exc
        self._servers.append(server)
        state.servers.append(server)
        bound: Addr = server.sockets[0].getsockname()[:2]
        return bound

    def join_multicast(self, endpoint: Endpoint, group: str, *, interface: str = "0.0.0.0",
                       local: Addr | None = None, ttl: int = 1) -> None:
        """Join ``group`` on the endpoint's UDP socket bound at ``local`` (default: its first).

        ``interface`` is the local address of the interface to join on and to send multicast
        from (``127.0.0.1`` keeps a test on loopback).  Datagrams the socket receives from its
        own address are dropped from then on, as the simulator never gives a sender its own
        multicast.  The host can only do that when the address is its own alone: a specific
        IP (the socket's or ``interface``) and a port bound without ``reuse_address``.  On a
        shared port a neighbour on the same IP has the same address, so nothing is dropped
        and the core sees its own multicast (cores must tolerate that on real networks).
        """
        state = self._state(endpoint)
        candidates = [u for u in state.udp if local is None or u.addr == local]
        if not candidates:
            raise HostError(f"{state.name} has no UDP socket bound at {local}")
        udp = candidates[0]
        try:
            mreq = socket.inet_aton(group) + socket.inet_aton(interface)
            udp.sock.setsockopt(socket.IPPROTO_IP, socket.IP_ADD_MEMBERSHIP, mreq)
            udp.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_TTL, ttl)
            # loop on (the kernel's default, said here): receivers on this host, LBT-RM's on
            # loopback among them, get what this socket sends to the group
            udp.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_LOOP, 1)
            if interface not in _WILDCARD:
                udp.sock.setsockopt(socket.IPPROTO_IP, socket.IP_MULTICAST_IF,
                                    socket.inet_aton(interface))
        except OSError as exc:
            raise HostError(f"{state.name}: cannot join {group} on {interface}: "
                            f"{exc.strerror or exc}") from exc
        if not udp.shared:
            own = {(ip, udp.addr[1]) for ip in (udp.addr[0], interface) if ip not in _WILDCARD}
            udp.own = frozenset(own | udp.own)

    def _state(self, endpoint: object) -> _EndpointState:
        state = self._states.get(id(endpoint))
        if state is None:
            raise HostError(f"{endpoint!r} is not registered with this host")
        return state

    def _check_open(self) -> None:
        if self._closed:
            raise HostError("the host is closed") from self.failure

    # --- calling into cores -------------------------------------------------------------------

    def flush(self, endpoint: Endpoint | None = None) -> None:
        """Collect output queued outside a call into the core (by a test or a scenario)."""
        if self._closed:
            return
        states = self._states.values() if endpoint is None else [self._state(endpoint)]
        for state in list(states):
            self._flush(state)

    def call(self, endpoint: Endpoint, action: Callable[[float], T]) -> T:
        """Run ``action(now)`` against a core (a scenario step) and collect its output after.

        An exception from ``action`` stops the host like any core failure and is raised here.
        """
        self._check_open()
        state = self._state(endpoint)
        try:
            result = action(self._clock())
        except Exception as exc:
            self._core_failed(state, "call", exc)
            raise self._raise_failure() from exc
        self._flush(state)
        return result

    def on_events(self, endpoint: Endpoint, handler: Callable[[Any], None]) -> None:
        """Hand every application event of ``endpoint`` to ``handler``, inside the call into the
        core that produced it and *before* that call's output goes out.

        This is what makes a receiver's consumption acknowledgement honest: UM acknowledges a
        message once the application's callback has returned, so an ACK the core queued while
        delivering a message leaves only after ``handler`` saw the message.  Polling
        ``next_event()`` from a task instead leaves a window in which the store already holds
        the ACK and a crash loses the message for good.  ``endpoint`` must have
        ``next_event()``; when it also has ``events()`` (every queued event at once, as the
        reference cores do), the host drains with that, a batch per call instead of a method
        call per event.  An exception from ``handler`` stops the host like a core failure.
        """
        if not callable(getattr(endpoint, "next_event", None)):
            raise HostError(f"{endpoint!r} has no next_event()")
        self.register(endpoint)
        state = self._state(endpoint)
        state.event_handler = handler
        drain = getattr(endpoint, "events", None)
        state.drain_events = drain if callable(drain) else None
        self._schedule_flush(state)

    def spawn(self, coro: Coroutine[Any, Any, T], name: str | None = None) -> asyncio.Task[T]:
        """Run an application coroutine (a scenario, the ``ump source`` send loop) as a task the
        host owns, so that shutdown stays orderly whatever the moment.

        :meth:`close` cancels it and :meth:`aclose` waits for it, so no task outlives the
        host.  Its outcome is always consumed, never left to asyncio's "Task exception was
        never retrieved": a :class:`HostError` raised because the host closed under it (a
        signal stopped the process between two of its steps) is the shutdown, not a failure;
        any other exception stops the host like a core failure (:class:`TaskError`, raised by
        :meth:`wait_closed` and :func:`serve`).
        """
        self._check_open()
        task = self._loop.create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()  # retrieved here, whatever happens next
        if exc is None or isinstance(exc, CoreError):
            return  # a CoreError is the host's own failure, already reported by it
        if isinstance(exc, HostError) and self._closed:
            log.debug("task %r ended by the shutdown: %s", task.get_name(), exc)
            return
        if self.failure is not None:
            return
        log.error("task %r raised; stopping the host", task.get_name(),
                  exc_info=(type(exc), exc, exc.__traceback__))
        failure = TaskError(task.get_name(), f"{type(exc).__name__}: {exc}")
        failure.__cause__ = exc
        self.failure = failure
        self.close()

    def write_buffer_size(self, endpoint: Endpoint, conn: ConnKey) -> int:
        """Bytes written to ``conn`` and not yet taken by the kernel (0 for an unknown stream)."""
        stream = self._state(endpoint).streams.get(conn)
        if stream is None or stream.transport is None:
            return sum(map(len, stream.pending)) if stream is not None else 0
        return stream.transport.get_write_buffer_size()

    def _schedule_flush(self, state: _EndpointState) -> None:
        if not state.flush_scheduled:
            state.flush_scheduled = True

            def run() -> None:
                state.flush_scheduled = False
                if not self._closed:
                    self._flush(state)

            self._loop.call_soon(run)

    def _stream_event(self, state: _EndpointState, event: StreamEvent) -> None:
        if self._closed:
            return
        try:
            cast(StreamEndpoint, state.endpoint).stream_event(event, self._clock())
        except Exception as exc:
            self._core_failed(state, f"stream_event({event.kind.value})", exc)
            return
        self._flush(state)

    def _flush(self, state: _EndpointState) -> None:
        """Collect datagrams, stream commands and the timer: after every call into a core."""
        if state.held:
            return  # collected when AioHost.starting() ends
        ep = state.endpoint
        handler = state.event_handler
        if handler is not None:
            try:
                drain = state.drain_events
                if drain is not None:  # a batch at a time: a core queues one or two per message
                    while events := drain():
                        for event in events:
                            handler(event)
                else:
                    next_event = cast(Any, ep).next_event
                    while (event := next_event()) is not None:
                        handler(event)
            except Exception as exc:
                self._core_failed(state, "event handler", exc)
                return
        now = self._clock()
        where = "datagrams_to_send"
        try:
            datagrams = ep.datagrams_to_send(now)
            where = "datagrams_from"
            sourced = from_ports(now) if (from_ports := getattr(ep, "datagrams_from", None)) \
                else None
            where = "stream_commands"
            commands = cast(StreamEndpoint, ep).stream_commands(now) \
                if state.streams_capable else None
            where = "get_timer"
            deadline = ep.get_timer()
        except Exception as exc:
            self._core_failed(state, where, exc)
            return
        if datagrams:
            out = state.udp_out
            if out is None:
                out = self._bind_udp_now(state, ("0.0.0.0", 0), False)
                log.info("%s sends datagrams without a bound UDP socket: sending from %s",
                         state.name, out.addr)
            out.send(datagrams)
        if sourced:
            self._send_from_ports(state, sourced)
        if commands:
            self._apply(state, commands)
        if deadline is not None and not self._closed and (
                state.timer_handle is None or deadline < cast(float, state.timer_when)):
            self._arm(state, deadline)

    def _send_from_ports(self, state: _EndpointState,
                         sourced: list[tuple[int, bytes, Addr]]) -> None:
        """Datagrams a core sends from a given local port (``datagrams_from``: its LBT-RU
        ports), each from the socket bound at that port."""
        by_port = {u.addr[1]: u for u in state.udp}
        batches: dict[int, list[tuple[bytes, Addr]]] = {}
        for port, data, dst in sourced:
            batches.setdefault(port, []).append((data, dst))
        for port, batch in batches.items():
            udp = by_port.get(port)
            if udp is None:
                self._core_failed(state, "datagrams_from",
                                  HostError(f"no UDP socket bound at port {port}"))
                return
            udp.send(batch)

    def _apply(self, state: _EndpointState, commands: list[StreamCommand]) -> None:
        """Carry out stream commands in order; runs of writes to one stream become one write."""
        run: list[bytes] = []
        run_key: ConnKey | None = None
        for cmd in commands:
            if isinstance(cmd, StreamWrite):
                if cmd.conn != run_key:
                    if run:
                        self._write_to(state, cast(ConnKey, run_key), run)
                    run, run_key = [], cmd.conn
                if cmd.data:
                    run.append(cmd.data)
                continue
            if run:
                self._write_to(state, cast(ConnKey, run_key), run)
            run, run_key = [], None
            if isinstance(cmd, Connect):
                self._connect(state, cmd)
            elif isinstance(cmd, StreamClose):
                stream = state.streams.get(cmd.conn)
                if stream is not None and not stream.closed_by_us:
                    stream.closed_by_us = True
                    stream.shutdown()
            else:
                self._core_failed(state, "stream_commands",
                                  TypeError(f"not a stream command: {cmd!r}"))
                return
            if self._closed:
                return
        if run:
            self._write_to(state, cast(ConnKey, run_key), run)

    def _write_to(self, state: _EndpointState, key: ConnKey, chunks: list[bytes]) -> None:
        stream = state.streams.get(key)
        if stream is None or stream.closed_by_us or stream.lost:
            self.stats["stream_writes_dropped"] += len(chunks)
            log.debug("%s: %d write(s) to unknown or closed stream %s dropped",
                      state.name, len(chunks), key)
            return
        if stream.transport is None:  # connect still in flight (explicit local port)
            stream.pending.extend(chunks)
            return
        self._write(stream, chunks)

    def _write(self, stream: _Stream, chunks: list[bytes]) -> None:
        tr = cast(asyncio.Transport, stream.transport)
        self.stats["stream_writes"] += len(chunks)
        if len(chunks) == 1:
            self.stats["stream_bytes_sent"] += len(chunks[0])
            tr.write(chunks[0])
        else:
            self.stats["stream_bytes_sent"] += sum(map(len, chunks))
            tr.writelines(chunks)
        size = tr.get_write_buffer_size()
        if size > self.stats["write_buffer_peak"]:
            self.stats["write_buffer_peak"] = size

    def _congestion(self, stream: _Stream, congested: bool) -> None:
        state, scope = stream.state, self.backpressure
        if congested:
            first = not state.congested
            state.congested.add(stream)
            if scope == "connection":
                stream.pause()
            elif scope == "endpoint" and first:
                for other in state.streams.values():
                    other.pause()
        elif stream in state.congested:
            state.congested.discard(stream)
            if scope == "connection":
                stream.resume()
            elif scope == "endpoint" and not state.congested:
                for other in list(state.streams.values()):
                    other.resume()

    # --- connecting ---------------------------------------------------------------------------

    def _connect(self, state: _EndpointState, cmd: Connect) -> None:
        local, remote = cmd.local, cmd.remote
        self.stats["connects"] += 1
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        try:
            if local[1]:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(local)
        except OSError as exc:
            sock.close()
            log.warning("%s: cannot bind %s to connect to %s: %s", state.name, local, remote,
                        exc)
            self._refuse_soon(state, (local, remote))
            return
        except (TypeError, ValueError) as exc:
            sock.close()
            self._core_failed(state, "stream_commands", exc)
            return
        key: ConnKey = ((local[0], sock.getsockname()[1]), remote)
        if key in state.streams:
            sock.close()
            self._core_failed(state, "stream_commands",
                              ValueError(f"Connect: stream {key} already exists"))
            return
        stream = _Stream(self, state, key, outgoing=True)
        state.streams[key] = stream
        task = self._loop.create_task(self._complete_connect(stream, sock, remote))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _complete_connect(self, stream: _Stream, sock: socket.socket, remote: Addr) -> None:
        state = stream.state
        try:
            await asyncio.wait_for(self._loop.sock_connect(sock, remote), self.connect_timeout)
            await self._loop.create_connection(lambda: stream, sock=sock)
        except asyncio.CancelledError:
            sock.close()
            raise
        except (OSError, TimeoutError) as exc:
            sock.close()
            key = cast(ConnKey, stream.key)
            log.debug("%s: connect %s failed: %s", state.name, key, exc)
            if state.streams.get(key) is stream:
                del state.streams[key]
            self.stats["refused"] += 1
            self._stream_event(state, StreamEvent(StreamEventKind.REFUSED, key))
        except Exception as exc:  # a malformed remote address: the core's mistake
            sock.close()
            self._core_failed(state, "stream_commands (Connect)", exc)

    def _refuse_soon(self, state: _EndpointState, key: ConnKey) -> None:
        self.stats["refused"] += 1
        self._loop.call_soon(self._stream_event, state,
                             StreamEvent(StreamEventKind.REFUSED, key))

    # --- timers -------------------------------------------------------------------------------

    def _arm(self, state: _EndpointState, deadline: float) -> None:
        if state.timer_handle is not None:
            state.timer_handle.cancel()
        state.timer_when = deadline
        when = deadline if self._clock_is_loop else \
            self._loop.time() + (deadline - self._clock())
        state.timer_handle = self._loop.call_at(when, self._fire, state)

    def _fire(self, state: _EndpointState) -> None:
        """A timer is due.  Deadlines that moved later are re-armed lazily, here."""
        state.timer_handle = None
        state.timer_when = None
        if self._closed:
            return
        ep = state.endpoint
        try:
            deadline = ep.get_timer()
        except Exception as exc:
            self._core_failed(state, "get_timer", exc)
            return
        if deadline is None:
            return
        now = self._clock()
        if deadline > now:
            if deadline - now > 1e-3:  # moved later since it was armed
                self._arm(state, deadline)
                return
            now = deadline  # asyncio fires up to one clock tick early; never show that
        try:
            ep.handle_timer(now)
        except Exception as exc:
            self._core_failed(state, "handle_timer", exc)
            return
        self._flush(state)
        if self._closed:
            return
        try:
            after = ep.get_timer()
        except Exception as exc:
            self._core_failed(state, "get_timer", exc)
            return
        state.timer_stuck = state.timer_stuck + 1 if after == deadline else 0
        if state.timer_stuck > TIMER_STUCK_LIMIT:
            self._core_failed(state, "handle_timer", RuntimeError(
                f"get_timer() still returns {deadline} after {TIMER_STUCK_LIMIT} firings "
                "(a timer that never moves on)"))

    # --- failure and shutdown -----------------------------------------------------------------

    def _core_failed(self, state: _EndpointState, where: str, exc: BaseException) -> None:
        if self.failure is not None:
            return
        log.error("endpoint %r raised in %s; stopping the host", state.name, where,
                  exc_info=(type(exc), exc, exc.__traceback__))
        failure = CoreError(state.name, where, f"{type(exc).__name__}: {exc}")
        failure.__cause__ = exc
        self.failure = failure
        self.close()

    def close(self) -> None:
        """Stop now: no more calls into cores; sockets closed (streams flush what they can).

        Use :meth:`aclose` to also wait for the streams to finish flushing.
        """
        if self._closed:
            return
        self._closed = True
        for state in self._states.values():
            if state.timer_handle is not None:
                state.timer_handle.cancel()
                state.timer_handle = None
            for udp in state.udp:
                udp.close()
            for stream in state.streams.values():
                if stream.linger is not None:
                    stream.linger.cancel()
        for server in self._servers:
            server.close()
        for task in list(self._tasks):
            task.cancel()
        for tr in list(self._transports):
            tr.close()
        if not self._closed_future.done():
            if self.failure is not None:
                self._closed_future.set_exception(self.failure)
                self._closed_future.exception()  # retrieved: no "never retrieved" warning
            else:
                self._closed_future.set_result(None)

    async def aclose(self, timeout: float = 5.0) -> None:
        """Close, then give streams up to ``timeout`` s to flush; abort what is left.

        Waits for every task of the host (:meth:`spawn`, connects) to end first, except the
        one calling, which cannot wait for itself.  :meth:`hurry` cuts the wait short."""
        self.close()
        tasks = self._tasks - {asyncio.current_task()}
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        deadline = self._loop.time() + timeout
        while self._transports and self._loop.time() < deadline and not self._hurry:
            await asyncio.sleep(0.005)
        for tr in list(self._transports):
            tr.abort()
        for server in self._servers:
            left = 0.0 if self._hurry else max(0.0, deadline - self._loop.time())
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), left)
        await asyncio.sleep(0)  # let abort()'s connection_lost callbacks run

    def hurry(self) -> None:
        """Close, and make :meth:`aclose` abort the streams now instead of letting them flush
        (what a second Ctrl-C asks for)."""
        self._hurry = True
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def wait_closed(self) -> None:
        """Wait until the host stops; raises :class:`CoreError` if a core made it stop.

        ``async with`` raises the failure on exit too, unless it was already raised to the
        caller (by this, :meth:`wait_until` or :meth:`call`).
        """
        try:
            await asyncio.shield(self._closed_future)
        except CoreError:
            self._failure_seen = True
            raise

    def _raise_failure(self) -> CoreError:
        failure = self.failure
        assert failure is not None
        self._failure_seen = True
        return failure

    async def wait_until(self, predicate: Callable[[], bool], timeout: float,
                         poll: float = 0.001) -> None:
        """Let the loop run until ``predicate()`` holds (for tests and scenario scripts).

        Raises :class:`CoreError` as soon as a core fails, :class:`TimeoutError` on timeout.
        """
        deadline = self._loop.time() + timeout
        while not predicate():
            if self.failure is not None:
                raise self._raise_failure()
            if self._loop.time() >= deadline:
                raise TimeoutError(f"condition not met within {timeout} s")
            await asyncio.sleep(poll)
        if self.failure is not None:
            raise self._raise_failure()

    async def __aenter__(self) -> AioHost:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: object) -> None:
        await self.aclose()
        if exc is None and self.failure is not None and not self._failure_seen:
            raise self._raise_failure()


# --- daemons ------------------------------------------------------------------------------------


async def serve(setup: Callable[[AioHost], Awaitable[object]], *,
                shutdown_timeout: float = 5.0, handle_signals: bool = True,
                **host_options: Any) -> signal.Signals | None:
    """Run a daemon: ``await setup(host)`` binds the cores, then serve until told to stop.

    The first SIGINT or SIGTERM shuts down cleanly (streams get ``shutdown_timeout`` s to
    flush, tasks of :meth:`AioHost.spawn` are cancelled and awaited); a second one aborts the
    streams at once.  After that second one the signals are back to their defaults, so a
    third Ctrl-C raises ``KeyboardInterrupt`` wherever the process is stuck.

    The handlers stay installed until the loop closes, not just until this returns: a Ctrl-C
    during asyncio's own teardown must not become a ``KeyboardInterrupt`` inside a task,
    which asyncio would print as a traceback.  A signal that arrives while ``setup`` is still
    binding makes the next bind fail with "the host is closed"; that is the shutdown too.

    Returns the signal that stopped the daemon (``None``: it stopped by itself, e.g. a
    ``host.close()``); raises :class:`CoreError` if a core failed.
    """
    loop = asyncio.get_running_loop()
    stopped_by: list[signal.Signals] = []
    async with AioHost(**host_options) as host:
        installed: list[signal.Signals] = []

        def on_signal(signum: signal.Signals) -> None:
            stopped_by.append(signum)
            if len(stopped_by) == 1:
                log.warning("%s received: shutting down (Ctrl-C again to exit at once)",
                            signum.name)
                host.close()
                return
            if len(stopped_by) == 2:
                log.warning("%s received again: exiting at once", signum.name)
            for sig in installed:  # defaults from now on: the next Ctrl-C is the hard way
                loop.remove_signal_handler(sig)
            installed.clear()
            host.hurry()

        if handle_signals:
            for sig in (signal.SIGINT, signal.SIGTERM):
                try:
                    loop.add_signal_handler(sig, on_signal, sig)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError, ValueError):
                    pass  # not the main thread, or no signal support: stop via host.close()
        try:
            await setup(host)
            await host.wait_closed()
        except HostError:
            if not (stopped_by and host.failure is None):
                raise
            # setup was still binding when the signal closed the host: an orderly stop
        finally:
            await host.aclose(shutdown_timeout)
    return stopped_by[0] if stopped_by else None


def run_forever(setup: Callable[[AioHost], Awaitable[object]], *, sigint_status: int = 0,
                **options: Any) -> int:
    """:func:`serve` for a CLI command; returns the exit status (0, 1 core failure, 130 ^C).

    A daemon stopped by SIGINT or SIGTERM exits 0 after its orderly shutdown; a command for
    which a Ctrl-C means "cut short" (``ump source``) passes ``sigint_status=130``, the shell's
    convention for a process ended by SIGINT.  A ``KeyboardInterrupt`` (the third Ctrl-C, or
    one before the handlers are in place) is 130 too.  Errors are reported on stderr in one
    line (the log has the traceback of a core failure).

    Once :func:`serve` returns, a further SIGINT or SIGTERM is only noted until asyncio has
    torn the loop down: the loop's own handlers write to a wakeup pipe that the loop closes
    (CPython then prints "Exception ignored ... Bad file descriptor" with a traceback), and a
    ``KeyboardInterrupt`` inside asyncio's teardown tasks is printed as a traceback too.
    """
    late: list[int] = []
    previous = _handlers()

    def note_late(signum: int, frame: object) -> None:
        late.append(signum)  # already stopping: nothing more to do

    async def main() -> signal.Signals | None:
        try:
            return await serve(setup, **options)
        finally:
            if previous:
                for sig in previous:
                    signal.signal(sig, note_late)
                signal.set_wakeup_fd(-1)  # before the loop closes the pipe behind it

    try:
        stopped_by = asyncio.run(main())
    except CoreError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except HostError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return sigint_status if stopped_by is signal.SIGINT else 0


def _handlers() -> dict[signal.Signals, Any]:
    """SIGINT's and SIGTERM's handlers now (empty off the main thread, where they cannot be
    set), to be put back when :func:`run_forever` returns."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    return {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
