"""The harness's sockets: blocking, recorded, and easy to wait on from a case.

Cases read like a script ("send this PREG, expect a PREG_RESP within 2 s"), so the harness
uses plain sockets with one reader thread each rather than an event loop: every received
LBMC message is decoded, recorded in the case's :class:`~conformance.evidence.Recorder` and
queued; :meth:`TcpLink.expect` waits on the queue with a deadline.  Nothing here sleeps for a
fixed time: every wait ends as soon as what it waits for arrives.

Everything sent goes through :meth:`TcpLink.send`, which takes Scapy packets (built from the
:mod:`wire.scapy_layers` layers, valid or deliberately not), :mod:`wire` messages or raw bytes.
"""

from __future__ import annotations

import contextlib
import itertools
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from scapy.packet import Packet, raw

from conformance.evidence import Addr, Recorder
from wire import lbmc, lbmr
from wire.errors import WireError
from wire.lbttcp import LbttcpStream


class NoAnswer(Exception):
    """What a case waited for did not come in time."""


def to_bytes(item: Packet | lbmc.LbmcMessage | lbmr.LbmrPacket | bytes) -> bytes:
    if isinstance(item, bytes | bytearray):
        return bytes(item)
    if isinstance(item, Packet):
        return raw(item)
    return item.build()


Match = Callable[[lbmc.LbmcMessage], bool]


def has(header: type[lbmc.Header], **fields: Any) -> Match:
    """A matcher: the message has a ``header`` whose fields equal ``fields``."""
    def match(message: lbmc.LbmcMessage) -> bool:
        return any(isinstance(h, header) and all(getattr(h, k) == v for k, v in fields.items())
                   for h in message.headers)
    match.__name__ = header.__name__ + "".join(f" {k}={v}" for k, v in fields.items())
    return match


class TcpLink:
    """One TCP connection with the IUT, LBT-TCP framed in both directions."""

    def __init__(self, sock: socket.socket, recorder: Recorder, *, iut_is_client: bool,
                 name: str, on_message: Callable[[TcpLink, lbmc.LbmcMessage], None] | None = None
                 ) -> None:
        self.sock = sock
        # given to the constructor, not set afterwards: the reader thread starts here and a
        # message arriving before a later assignment would never reach the handler
        self.on_message = on_message
        self.name = name
        self.recorder = recorder
        self.local: Addr = sock.getsockname()[:2]
        self.remote: Addr = sock.getpeername()[:2]
        client, server = (self.remote, self.local) if iut_is_client else (self.local, self.remote)
        self.conn = recorder.open(client, server, iut_is_client=iut_is_client)
        self.received: list[lbmc.LbmcMessage] = []
        self.errors: list[str] = []
        self._unread: list[lbmc.LbmcMessage] = []
        self._cond = threading.Condition()
        self._closed = False
        self.closed_by_peer = False
        self._reader = threading.Thread(target=self._read, name=f"harness {name}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        framer = LbttcpStream(decode=False)
        while True:
            try:
                chunk = self.sock.recv(65536)
            except OSError:
                chunk = b""
            if not chunk:
                break
            try:
                frames = framer.feed(chunk)
            except WireError as exc:
                self.recorder.tcp(self.conn, self.remote, self.local, chunk, from_iut=True)
                with self._cond:
                    self.errors.append(f"unframeable bytes from the IUT: {exc}")
                    self._cond.notify_all()
                break
            for frame in frames:
                data = bytes(frame.raw)
                self.recorder.tcp(self.conn, self.remote, self.local, data, from_iut=True)
                try:
                    message, _ = lbmc.parse_message(data)
                except WireError as exc:
                    with self._cond:
                        self.errors.append(f"undecodable message from the IUT: {exc}")
                        self._cond.notify_all()
                    continue
                with self._cond:
                    self.received.append(message)
                    self._unread.append(message)
                    self._cond.notify_all()
                if self.on_message is not None:
                    self._dispatch(message)
        with self._cond:
            if not self._closed:
                self.closed_by_peer = True
                self.recorder.close(self.conn, by_iut=True)
            self._closed = True
            self._cond.notify_all()

    def _dispatch(self, message: lbmc.LbmcMessage) -> None:
        """Give ``message`` to the scripted peer that owns the link (on the reader thread).

        A peer that fails must not end the reader (the case would then wait for answers that
        can no longer be read): its error is kept in :attr:`errors` for the case to report."""
        assert self.on_message is not None
        try:
            self.on_message(self, message)
        except NoAnswer:
            return  # the IUT closed the link while the peer answered: the reader sees it
        except Exception as exc:
            with self._cond:
                self.errors.append(f"harness peer failed on {message.label()}: {exc!r}")
                self._cond.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def send(self, *items: Packet | lbmc.LbmcMessage | bytes) -> None:
        """Send each item as it is (one recorded message per item)."""
        for item in items:
            data = to_bytes(item)
            self.recorder.tcp(self.conn, self.local, self.remote, data, from_iut=False)
            try:
                self.sock.sendall(data)
            except OSError as exc:
                raise NoAnswer(f"{self.name}: the IUT closed the connection ({exc})") from None

    def expect(self, match: Match, timeout: float, what: str = "") -> lbmc.LbmcMessage:
        """The first unread message ``match`` accepts, waiting up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for i, message in enumerate(self._unread):
                    if match(message):
                        del self._unread[i]
                        return message
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    why = "the IUT closed the connection" if self._closed else \
                        f"nothing within {timeout:.2f} s"
                    raise NoAnswer(f"{self.name}: expected {what or match.__name__}: {why}")
                self._cond.wait(left)

    def poll(self, match: Match) -> list[lbmc.LbmcMessage]:
        """Every unread message ``match`` accepts, taken now without waiting."""
        with self._cond:
            hits = [m for m in self._unread if match(m)]
            self._unread = [m for m in self._unread if not match(m)]
        return hits

    def wait_closed(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._closed:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
        return True

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self.recorder.close(self.conn, by_iut=False)
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def connect(addr: Addr, recorder: Recorder, name: str, timeout: float,
            on_message: Callable[[TcpLink, lbmc.LbmcMessage], None] | None = None) -> TcpLink:
    """A recorded link to ``addr``; a refused connection is retried until ``timeout`` (a
    peer may advertise its port a moment before it listens there)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            sock = socket.create_connection(addr, timeout=timeout)
            break
        except ConnectionRefusedError as exc:
            if time.monotonic() + 0.02 < deadline:
                time.sleep(0.02)
                continue
            raise NoAnswer(f"{name}: cannot connect to {addr[0]}:{addr[1]}: "
                           f"{exc.strerror or exc}") from None
        except OSError as exc:
            raise NoAnswer(f"{name}: cannot connect to {addr[0]}:{addr[1]}: "
                           f"{exc.strerror or exc}") from None
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return TcpLink(sock, recorder, iut_is_client=False, name=name, on_message=on_message)


def _wake_and_close(sock: socket.socket) -> None:
    """Close a socket another thread blocks on: ``shutdown`` wakes that ``accept`` or
    ``recvfrom`` (a bare ``close`` would leave the port bound until the thread returned)."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def _bind_first(kind: int, ip: str, ports: Sequence[int] | None) -> socket.socket:
    """A socket bound to the first free port of ``ports`` (then any port).

    The harness prefers the ports tshark decodes by default (LBT-TCP transport 14371-14390,
    request ports 14391-14395, resolver 15380), so its evidence pcaps dissect without
    preferences; any free port still works when those are taken.
    """
    for port in [*(ports or ()), 0]:
        sock = socket.socket(socket.AF_INET, kind)
        if kind == socket.SOCK_STREAM:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError:
            sock.close()
            continue
        return sock
    raise OSError(f"no free port on {ip}")


class PortPlan:
    """The ports one run (or one worker of a parallel run) prefers for its harness peers.

    The defaults are tshark's default LBT-TCP transport ports (14371-14390), request ports
    (14391-14395) and lbmrd port (15380), so the evidence pcaps dissect without preferences
    (:func:`_bind_first` takes any free port when every preferred one is taken).

    A parallel run (``ump conform --jobs N``) gives worker ``k`` of ``N`` the ports
    ``range[k::N]`` of each range (:meth:`share`): workers never prefer the same port, so a
    port one worker's case just closed (and its IUT may still hold a closing connection to, or
    connect to again) is not taken at once by another worker's source.  Worker 0 (the run's
    ``w1``) keeps the lowest of each range, so the lbmrd port 15380 is its own and the other
    workers' resolvers take a free port (their LBMR decodes with ``ump dissect
    --lbmr-resolver-port``).  A share with no port left (more workers than ports) means "any
    free port".
    """

    def __init__(self, transport: range = range(14371, 14391),
                 request: range = range(14391, 14396),
                 resolver: range = range(15380, 15381)) -> None:
        self.transport = transport
        self.request = request
        self.resolver = resolver
        self._turns = itertools.count()

    def share(self, worker: int, workers: int) -> PortPlan:
        """Worker ``worker``'s share (of ``workers``): every ``workers``-th port of each range."""
        if not 0 <= worker < workers:
            raise ValueError(f"worker {worker} of {workers}")
        return PortPlan(self.transport[worker::workers], self.request[worker::workers],
                        self.resolver[worker::workers])

    def rotated(self, ports: range) -> list[int]:
        """``ports`` starting at a different place each call (a counter of this plan's own),
        so consecutive sources (and cases) do not reuse a port the IUT may still hold a
        closing connection to."""
        if not ports:
            return []
        start = next(self._turns) % len(ports)
        return [*ports[start:], *ports[:start]]

    def __repr__(self) -> str:
        return f"PortPlan(transport={self.transport}, request={self.request}, " \
               f"resolver={self.resolver})"


DEFAULT_PORTS = PortPlan()
"""The whole of each range: a serial run's plan."""


class Listener:
    """A TCP port the IUT connects to (a source's transport or request port)."""

    def __init__(self, ip: str, recorder: Recorder, name: str,
                 on_link: Callable[[TcpLink], None] | None = None,
                 ports: Sequence[int] | None = None,
                 on_message: Callable[[TcpLink, lbmc.LbmcMessage], None] | None = None) -> None:
        self.sock = _bind_first(socket.SOCK_STREAM, ip, ports)
        self.on_message = on_message
        self.sock.listen(16)
        self.addr: Addr = self.sock.getsockname()[:2]
        self.name = name
        self.recorder = recorder
        self.links: list[TcpLink] = []
        self.on_link = on_link
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name=f"harness {name}",
                                        daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.sock.accept()
            except OSError:
                return
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = TcpLink(sock, self.recorder, iut_is_client=True,
                           name=f"{self.name} #{len(self.links) + 1}",
                           on_message=self.on_message)
            with self._cond:
                if self._closed:  # accepted while closing: never leave it open behind us
                    link.close()
                    return
                self.links.append(link)
                self._cond.notify_all()
            if self.on_link is not None:
                self.on_link(link)

    def expect_link(self, timeout: float, what: str) -> TcpLink:
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self.links:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise NoAnswer(f"{self.name}: expected {what}: no connection within "
                                   f"{timeout:.2f} s")
                self._cond.wait(left)
            return self.links[-1]

    def close(self) -> None:
        """Stop accepting and close every connection, including one the accept thread takes
        while we close (a leaked one would keep the IUT's connection to this port alive, and
        a later case reusing the port would find the IUT believing it is still connected)."""
        with self._cond:
            self._closed = True
        _wake_and_close(self.sock)
        self._thread.join(timeout=2.0)
        with self._cond:
            links = list(self.links)
        for link in links:
            link.close()


@dataclass(frozen=True)
class Datagram:
    data: bytes
    addr: Addr
    packet: lbmr.LbmrPacket | None


class UdpPort:
    """A UDP socket whose datagrams are recorded, decoded as LBMR and handed to ``handler``."""

    def __init__(self, addr: Addr, recorder: Recorder, name: str,
                 handler: Callable[[Datagram], None] | None = None,
                 ports: range | None = None) -> None:
        self.sock = _bind_first(socket.SOCK_DGRAM, addr[0], ports or range(addr[1], addr[1] + 1))
        self.addr: Addr = self.sock.getsockname()[:2]
        self.recorder = recorder
        self.name = name
        self.handler = handler
        self.received: list[Datagram] = []
        self._cond = threading.Condition()
        threading.Thread(target=self._read, name=f"harness {name}", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                data, addr = self.sock.recvfrom(65536)
            except OSError:
                return
            if addr is None:  # woken by close()
                return
            self.recorder.udp(addr[:2], self.addr, data, from_iut=True)
            try:
                packet: lbmr.LbmrPacket | None = lbmr.parse_packet(data)
            except WireError:
                packet = None
            dgram = Datagram(data, addr[:2], packet)
            with self._cond:
                self.received.append(dgram)
                self._cond.notify_all()
            if self.handler is not None:
                self.handler(dgram)

    def send(self, item: lbmr.LbmrPacket | Packet | bytes, addr: Addr) -> None:
        data = to_bytes(item)
        self.recorder.udp(self.addr, addr, data, from_iut=False)
        with contextlib.suppress(OSError):
            self.sock.sendto(data, addr)

    def close(self) -> None:
        _wake_and_close(self.sock)
