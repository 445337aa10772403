"""The asyncio driver: real sockets on 127.0.0.1 behave like the simulator for the cores.

Small cores written here (an echo server, a chatty client, an alarm clock) implement the
sans-IO interface; the same ``Chatter``/``EchoCore`` pair also runs in
:class:`~reference_impl.sim.SimNetwork` and must reach the same logical result (parity).
Peers that must misbehave (reset, half-close, read slowly) are raw sockets.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from reference_impl.aio import AioHost, CoreError, HostError, run_forever
from reference_impl.sim import (
    Addr,
    CallbackEndpoint,
    Chunking,
    Connect,
    ConnKey,
    SimNetwork,
    StreamClose,
    StreamCommand,
    StreamEvent,
    StreamEventKind,
    StreamWrite,
)
from tests.reference_impl.loopback import free_port

K = StreamEventKind
LO = "127.0.0.1"
ROOT = Path(__file__).resolve().parents[2]
R = TypeVar("R")


def async_test(timeout: float = 30.0) -> Callable[[Callable[..., Coroutine[Any, Any, R]]],
                                                  Callable[..., R]]:
    """Run an async test in a fresh loop, failing it (not hanging) after ``timeout`` s."""
    def wrap(fn: Callable[..., Coroutine[Any, Any, R]]) -> Callable[..., R]:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> R:
            return asyncio.run(asyncio.wait_for(fn(*args, **kwargs), timeout))
        return run
    return wrap


def kinds(events: list[tuple[float, StreamEvent]], conn: ConnKey | None = None) -> list[K]:
    """Event kinds in order, consecutive DATA merged (chunking is not part of the logic)."""
    out: list[K] = []
    for _, ev in events:
        if conn is not None and ev.conn != conn:
            continue
        if not (ev.kind is K.DATA and out and out[-1] is K.DATA):
            out.append(ev.kind)
    return out


# --- test cores ---------------------------------------------------------------------------------


class EchoCore:
    """Echoes datagrams to their sender and stream bytes down their own stream, upper-cased (so
    an echo is told from a loop-back), and closes a stream once the peer has closed it."""

    def __init__(self, name: str = "echo", record: bool = True) -> None:
        self.name, self.record = name, record
        self.events: list[tuple[float, StreamEvent]] = []
        self.datagrams: list[tuple[bytes, Addr]] = []
        self.stream_data: dict[ConnKey, bytearray] = {}
        self._out: list[tuple[bytes, Addr]] = []
        self._cmds: list[StreamCommand] = []

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        if self.record:
            self.datagrams.append((data, addr))
        self._out.append((data.upper(), addr))

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        return None

    def handle_timer(self, now: float) -> None:
        pass

    def stream_event(self, event: StreamEvent, now: float) -> None:
        if event.kind is not K.DATA or self.record:
            self.events.append((now, event))
        if event.kind is K.DATA:
            if self.record:
                self.stream_data.setdefault(event.conn, bytearray()).extend(event.data)
            self._cmds.append(StreamWrite(event.conn, event.data.upper()))
        elif event.kind is K.CLOSED:
            self._cmds.append(StreamClose(event.conn))

    def stream_commands(self, now: float) -> list[StreamCommand]:
        out, self._cmds = self._cmds, []
        return out


class Chatter:
    """A client that exercises everything once: UDP pings, a stream of lines, a timer that adds
    a datagram and a line 20 ms after connecting, a connect that is refused, and a close once
    every echoed line is back.  :meth:`result` is what it learnt, free of addresses and timing.
    """

    def __init__(self, local_ip: str, udp_server: Addr, tcp_server: Addr, refused: Addr,
                 lines: int = 40) -> None:
        self.local_ip, self.udp_server, self.lines = local_ip, udp_server, lines
        self.events: list[tuple[float, StreamEvent]] = []
        self.replies: list[bytes] = []
        self.echoed = bytearray()
        self.timer: float | None = None
        self.conn: ConnKey | None = None
        self.refused: list[ConnKey] = []
        self._out: list[tuple[bytes, Addr]] = [(b"ping-%d" % i, udp_server) for i in range(3)]
        self._cmds: list[StreamCommand] = [Connect((local_ip, 0), tcp_server),
                                           Connect((local_ip, 0), refused)]

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        self.replies.append(data)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        return self.timer

    def handle_timer(self, now: float) -> None:
        self.timer = None
        self._out.append((b"tick", self.udp_server))
        assert self.conn is not None
        self._cmds.append(StreamWrite(self.conn, b"after-timer\n"))

    def stream_event(self, event: StreamEvent, now: float) -> None:
        self.events.append((now, event))
        if event.kind is K.CONNECTED:
            self.conn = event.conn
            self._cmds += [StreamWrite(event.conn, b"line %d\n" % i) for i in range(self.lines)]
            self.timer = now + 0.02
        elif event.kind is K.REFUSED:
            self.refused.append(event.conn)
        elif event.kind is K.DATA:
            self.echoed += event.data
            if self.echoed.count(b"\n") == self.lines + 1:
                self._cmds.append(StreamClose(event.conn))

    def stream_commands(self, now: float) -> list[StreamCommand]:
        out, self._cmds = self._cmds, []
        return out

    @property
    def done(self) -> bool:
        return len(self.replies) == 4 and self.echoed.count(b"\n") == self.lines + 1 \
            and bool(self.refused)

    def result(self) -> dict[str, object]:
        assert self.conn is not None
        return {
            "replies": sorted(self.replies),
            "echoed": bytes(self.echoed),
            "events": kinds(self.events, self.conn),
            "refused": [(c[0][0] == self.local_ip, c[0][1] != 0, c[1] == self.refused_target)
                        for c in self.refused],
        }

    refused_target: Addr = ("", 0)


def echo_result(echo: EchoCore) -> dict[str, object]:
    return {"datagrams": sorted(d for d, _ in echo.datagrams),
            "stream": sorted(bytes(b) for b in echo.stream_data.values()),
            "events": kinds(echo.events)}


# --- parity with the simulator ------------------------------------------------------------------


def run_in_sim() -> tuple[dict[str, object], dict[str, object]]:
    net = SimNetwork(seed=7, chunking=Chunking(1, 7))
    net.add_node("client", "10.0.0.1")
    net.add_node("server", "10.0.0.2")
    server: Addr = ("10.0.0.2", 7000)
    refused: Addr = ("10.0.0.2", 7001)
    echo = EchoCore()
    chatter = Chatter("10.0.0.1", server, server, refused)
    chatter.refused_target = refused
    net.bind("server", 7000, echo)
    net.bind("client", 6000, chatter)
    assert net.run_until_idle(30.0)
    assert chatter.done
    return chatter.result(), echo_result(echo)


async def run_on_sockets() -> tuple[dict[str, object], dict[str, object]]:
    async with AioHost() as host:
        echo = EchoCore()
        udp = await host.bind_udp(echo, (LO, 0))
        tcp = await host.listen_tcp(echo, (LO, 0))
        refused: Addr = (LO, free_port())
        chatter = Chatter(LO, udp, tcp, refused)
        chatter.refused_target = refused
        await host.bind_udp(chatter, (LO, 0), name="chatter")
        await host.wait_until(lambda: chatter.done and K.CLOSED in kinds(echo.events), 10)
        return chatter.result(), echo_result(echo)


def test_same_core_same_result_in_sim_and_on_sockets() -> None:
    sim_client, sim_server = run_in_sim()
    real_client, real_server = asyncio.run(asyncio.wait_for(run_on_sockets(), 30))
    assert real_client == sim_client
    assert real_server == sim_server
    # and the result is the exchange we meant, not two equally empty runs
    lines = b"".join(b"line %d\n" % i for i in range(40)) + b"after-timer\n"
    assert sim_client["echoed"] == lines.upper()
    assert sim_client["replies"] == [b"PING-0", b"PING-1", b"PING-2", b"TICK"]
    assert sim_client["events"] == [K.CONNECTED, K.DATA]  # we closed first: no CLOSED for us
    assert sim_server["events"] == [K.ACCEPTED, K.DATA, K.CLOSED]
    assert sim_client["refused"] == [(True, True, True)]


# --- datagrams ----------------------------------------------------------------------------------


@async_test()
async def test_udp_port_zero_binds_a_real_port_and_echoes() -> None:
    async with AioHost() as host:
        echo = EchoCore()
        addr = await host.bind_udp(echo, (LO, 0))
        assert addr[0] == LO and addr[1] != 0
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
            raw.setblocking(False)
            raw.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
            raw.bind((LO, 0))
            payloads = [b"d%04d" % i for i in range(200)]
            for p in payloads:
                raw.sendto(p, addr)
            got = [await asyncio.wait_for(loop.sock_recv(raw, 100), 5) for _ in payloads]
            raw_addr = raw.getsockname()
        assert sorted(got) == sorted(p.upper() for p in payloads)
        assert [d for d, _ in echo.datagrams] == payloads  # loopback keeps order
        assert {a for _, a in echo.datagrams} == {raw_addr}
        assert host.stats["datagrams_received"] == host.stats["datagrams_sent"] == 200


@async_test()
async def test_a_starting_core_sends_nothing_until_all_its_sockets_are_bound() -> None:
    """Inside ``AioHost.starting`` a core that wants to talk at once (a source advertising
    its ports) is held back; it speaks, from the socket bound in the block, when it ends."""
    async with AioHost() as host:
        echo = EchoCore()
        echo_addr = await host.bind_udp(echo, (LO, 0))
        eager = CallbackEndpoint()
        eager.timer = host.now()  # due at once, like a source's first advertisement
        eager.on_timer = lambda now: eager.send(b"hello", echo_addr)
        with host.starting(eager, "eager"):
            await asyncio.sleep(0.05)  # the loop runs: an unheld core would have sent by now
            assert echo.datagrams == []
            bound = await host.bind_udp(eager, (LO, 0))
            await asyncio.sleep(0.05)
            assert echo.datagrams == []
        await host.wait_until(lambda: bool(echo.datagrams), 5)
        assert echo.datagrams == [(b"hello", bound)]


class TwoPortCore(CallbackEndpoint):
    """Answers on the port a datagram arrived at (``receive_at`` / ``datagrams_from``)."""

    def __init__(self) -> None:
        super().__init__()
        self.hits: list[tuple[int, bytes]] = []
        self.sourced: list[tuple[int, bytes, Addr]] = []

    def receive_at(self, local_port: int, data: bytes, addr: Addr, now: float) -> None:
        self.hits.append((local_port, data))
        self.sourced.append((local_port, data.upper(), addr))

    def datagrams_from(self, now: float) -> list[tuple[int, bytes, Addr]]:
        out, self.sourced = self.sourced, []
        return out


@async_test()
async def test_a_core_on_two_udp_ports_hears_and_answers_on_each() -> None:
    async with AioHost() as host:
        core = TwoPortCore()
        first = await host.bind_udp(core, (LO, 0))
        second = await host.bind_udp(core, (LO, 0))
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
            raw.setblocking(False)
            raw.bind((LO, 0))
            raw.sendto(b"one", first)
            raw.sendto(b"two", second)
            answers = {}
            for _ in range(2):
                data, addr = await asyncio.wait_for(loop.sock_recvfrom(raw, 100), 5)
                answers[data] = addr
        assert sorted(core.hits) == sorted([(first[1], b"one"), (second[1], b"two")])
        assert answers == {b"ONE": first, b"TWO": second}


@async_test()
async def test_datagrams_leave_from_the_first_bound_socket_or_an_ephemeral_one() -> None:
    async with AioHost() as host:
        echo = EchoCore()
        echo_addr = await host.bind_udp(echo, (LO, 0))
        two = CallbackEndpoint()
        first = await host.bind_udp(two, (LO, 0), name="two")
        await host.bind_udp(two, (LO, 0))
        lone = CallbackEndpoint()
        host.register(lone, "lone")  # no socket at all: the host gives it one on first send
        two.send(b"a", echo_addr)
        lone.send(b"b", echo_addr)
        host.flush()
        await host.wait_until(lambda: bool(two.received and lone.received), 5)
        sources = dict(echo.datagrams)
        assert sources[b"a"] == first
        assert sources[b"b"][1] != 0
        assert lone.received[0][2] == b"B"  # the reply reached the ephemeral socket


@async_test()
async def test_multicast_on_loopback_drops_own_echo_unless_port_shared() -> None:
    group = "239.192.77.1"
    async with AioHost() as host:
        alone = CallbackEndpoint()
        port = (await host.bind_udp(alone, ("0.0.0.0", 0), name="alone"))[1]
        host.join_multicast(alone, group, interface=LO)
        a, b = CallbackEndpoint(), CallbackEndpoint()
        shared = (await host.bind_udp(a, ("0.0.0.0", 0), reuse_address=True))[1]
        await host.bind_udp(b, ("0.0.0.0", shared), reuse_address=True)
        for ep in (a, b):
            host.join_multicast(ep, group, interface=LO)
        alone.send(b"to-self", (group, port))
        a.send(b"to-both", (group, shared))
        host.flush()
        try:
            await host.wait_until(lambda: bool(b.received), 2)
        except TimeoutError:
            pytest.skip("multicast does not loop back on this host")
        await asyncio.sleep(0.05)
        assert [d for _, _, d in b.received] == [b"to-both"]
        assert [d for _, _, d in a.received] == [b"to-both"]  # shared port: cannot tell "own"
        assert alone.received == []  # the sim's rule: no sender hears its own multicast


# --- streams ------------------------------------------------------------------------------------


@async_test()
async def test_refused_connect_reports_the_assigned_key() -> None:
    async with AioHost() as host:
        client = CallbackEndpoint()
        host.register(client, "client")
        remote: Addr = (LO, free_port())
        client.connect((LO, 0), remote)
        host.flush(client)
        await host.wait_until(lambda: bool(client.events), 5)
        [(_, event)] = client.events
        assert event.kind is K.REFUSED
        (lip, lport), got_remote = event.conn
        assert (lip, got_remote) == (LO, remote) and lport != 0


@async_test()
async def test_unanswered_connect_is_refused_after_the_connect_timeout() -> None:
    # a listener that never accepts, its queue full: Linux drops further SYNs, a black hole
    listener = socket.socket()
    listener.bind((LO, 0))
    listener.listen(0)
    fillers = []
    for _ in range(4):
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(listener.getsockname())
        fillers.append(s)
    try:
        async with AioHost(connect_timeout=0.3) as host:
            client = CallbackEndpoint()
            host.register(client, "client")
            start = time.monotonic()
            client.connect(("0.0.0.0", 0), listener.getsockname())
            host.flush(client)
            await host.wait_until(lambda: bool(client.events), 5)
            elapsed = time.monotonic() - start
            assert [e.kind for _, e in client.events] == [K.REFUSED]
            assert 0.25 <= elapsed < 2.0
    finally:
        for s in [*fillers, listener]:
            s.close()


@async_test()
async def test_connect_accept_and_half_close_from_a_raw_peer() -> None:
    async with AioHost() as host:
        echo = EchoCore()
        addr = await host.listen_tcp(echo, (LO, 0))
        loop = asyncio.get_running_loop()
        raw = socket.socket()
        raw.setblocking(False)
        await loop.sock_connect(raw, addr)
        await loop.sock_sendall(raw, b"hello, ")
        await loop.sock_sendall(raw, b"world")
        raw.shutdown(socket.SHUT_WR)  # our FIN: the core sees CLOSED, may still write
        got = bytearray()
        while chunk := await asyncio.wait_for(loop.sock_recv(raw, 65536), 5):
            got += chunk
        raw.close()
        assert bytes(got) == b"HELLO, WORLD"  # written after CLOSED, then the core's FIN
        conn = (raw_local := echo.events[0][1].conn)
        assert raw_local[0] == addr
        assert kinds(echo.events, conn) == [K.ACCEPTED, K.DATA, K.CLOSED]


@async_test()
async def test_reset_by_peer_on_accepted_and_on_outgoing_streams() -> None:
    linger0 = (socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    async with AioHost() as host:
        loop = asyncio.get_running_loop()
        echo = EchoCore()
        addr = await host.listen_tcp(echo, (LO, 0))
        raw = socket.socket()
        raw.setblocking(False)
        await loop.sock_connect(raw, addr)
        await loop.sock_sendall(raw, b"x")
        await host.wait_until(lambda: K.DATA in kinds(echo.events), 5)
        raw.setsockopt(*linger0)
        raw.close()  # RST
        await host.wait_until(lambda: kinds(echo.events)[-1] is K.RESET, 5)
        assert kinds(echo.events) == [K.ACCEPTED, K.DATA, K.RESET]

        listener = socket.socket()
        listener.bind((LO, 0))
        listener.listen()
        listener.setblocking(False)
        client = CallbackEndpoint()
        host.register(client, "client")
        client.connect((LO, 0), listener.getsockname())
        host.flush(client)
        peer, _ = await asyncio.wait_for(loop.sock_accept(listener), 5)
        await host.wait_until(lambda: bool(client.events), 5)
        peer.setsockopt(*linger0)
        peer.close()
        listener.close()
        await host.wait_until(lambda: len(client.events) == 2, 5)
        assert [e.kind for _, e in client.events] == [K.CONNECTED, K.RESET]
        assert client.events[0][1].conn == client.events[1][1].conn


@async_test()
async def test_stream_close_sends_fin_then_discards_what_the_peer_still_sends() -> None:
    async with AioHost() as host:
        loop = asyncio.get_running_loop()
        server = CallbackEndpoint()
        addr = await host.listen_tcp(server, (LO, 0), name="server")
        raw = socket.socket()
        raw.setblocking(False)
        await loop.sock_connect(raw, addr)
        await host.wait_until(lambda: bool(server.events), 5)
        conn = server.events[0][1].conn
        server.write(conn, b"bye")
        server.close(conn)
        server.write(conn, b"too late")  # after its own close: dropped, as in the simulator
        host.flush(server)
        got = bytearray()
        while chunk := await asyncio.wait_for(loop.sock_recv(raw, 100), 5):
            got += chunk
        assert bytes(got) == b"bye"
        await loop.sock_sendall(raw, b"ignored" * 100)  # no RST: the host still drains
        await host.wait_until(lambda: host.stats["stream_bytes_discarded"] == 700, 5)
        raw.close()
        await host.wait_until(lambda: not host._transports, 5)
        assert [e.kind for _, e in server.events] == [K.ACCEPTED]
        assert host.stats["stream_writes_dropped"] == 1


@async_test()
async def test_explicit_local_port_allows_writes_and_close_before_connected() -> None:
    async with AioHost() as host:
        echo = EchoCore()
        addr = await host.listen_tcp(echo, (LO, 0))
        client = CallbackEndpoint()
        host.register(client, "client")
        local: Addr = (LO, free_port())
        key: ConnKey = (local, addr)
        client.connect(local, addr)
        client.write(key, b"early ")
        client.write(key, b"bird")
        client.close(key)
        host.flush(client)
        await host.wait_until(lambda: K.CLOSED in kinds(echo.events), 5)
        assert bytes(echo.stream_data[(addr, local)]) == b"early bird"
        assert client.events[0][1] == StreamEvent(K.CONNECTED, key)


@async_test()
async def test_write_to_an_unknown_stream_is_dropped_and_counted() -> None:
    async with AioHost() as host:
        client = CallbackEndpoint()
        host.register(client, "client")
        client.write(((LO, 1), (LO, 2)), b"nobody")
        host.flush(client)
        assert host.stats["stream_writes_dropped"] == 1
        assert not host.closed


@async_test(timeout=60)
async def test_ten_megabytes_arrive_intact_and_in_order_whatever_the_chunking() -> None:
    rng = random.Random(3)
    payload = rng.randbytes(10 * 1024 * 1024)
    async with AioHost() as host:
        echo = EchoCore()
        addr = await host.listen_tcp(echo, (LO, 0))
        client = CallbackEndpoint()
        host.register(client, "client")
        client.connect((LO, 0), addr)
        host.flush(client)
        await host.wait_until(lambda: bool(client.events), 5)
        conn = client.events[0][1].conn
        pos = 0
        while pos < len(payload):  # many writes of random sizes, several per flush
            for _ in range(rng.randint(1, 8)):
                size = rng.choice((1, 7, 1000, 65536, 300_000))
                client.write(conn, payload[pos:pos + size])
                pos += size
            host.flush(client)
            await asyncio.sleep(0)
        await host.wait_until(
            lambda: sum(len(e.data) for _, e in client.events) >= len(payload), 30)
        assert client.stream_bytes(conn) == payload.upper()
        server_conn = (conn[1], conn[0])
        assert bytes(echo.stream_data[server_conn]) == payload
        assert sum(1 for _, e in echo.events if e.kind is K.DATA) > 1


def slow_reader_run(addr: Addr, total: int, hold: float) -> bytes:
    """A raw peer that writes ``total`` bytes at full speed but reads nothing for ``hold`` s:
    a slow consumer.  Returns everything it read back."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sock.connect(addr)
    data = random.Random(5).randbytes(total)
    writer = threading.Thread(target=sock.sendall, args=(data,))
    writer.start()
    time.sleep(hold)
    got = bytearray()
    while len(got) < total:
        chunk = sock.recv(1 << 20)
        if not chunk:
            break
        got += chunk
    writer.join()
    sock.close()
    assert bytes(got) == data.upper()
    return bytes(got)


@pytest.mark.parametrize("scope", ["endpoint", "connection", "none"])
@async_test(timeout=60)
async def test_backpressure_bounds_the_write_buffer_without_losing_bytes(scope: str) -> None:
    high_water, max_read = 256 * 1024, 256 * 1024
    total = 16 * 1024 * 1024
    async with AioHost(high_water=high_water, backpressure=scope) as host:  # type: ignore[arg-type]
        echo = EchoCore()
        addr = await host.listen_tcp(echo, (LO, 0))
        got = await asyncio.to_thread(slow_reader_run, addr, total, 0.4)
        assert len(got) == total
        peak = host.stats["write_buffer_peak"]
        if scope == "none":  # the control: without pausing, the backlog lands in our buffer
            assert peak > 4 * (high_water + max_read)
        else:  # bounded by the high-water mark plus the echo of one read
            assert 0 < peak <= high_water + max_read


# --- timers -------------------------------------------------------------------------------------


class Alarm:
    """Keeps a set of deadlines; ``get_timer`` is the earliest; firings are recorded."""

    def __init__(self) -> None:
        self.deadlines: list[float] = []
        self.fired: list[tuple[float, float]] = []  # (deadline, now)
        self.calls: list[float] = []

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        pass

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        return []

    def get_timer(self) -> float | None:
        return min(self.deadlines, default=None)

    def handle_timer(self, now: float) -> None:
        self.calls.append(now)
        for d in sorted(self.deadlines):
            if d <= now:
                self.fired.append((d, now))
                self.deadlines.remove(d)


@async_test()
async def test_timers_fire_in_order_never_early_and_follow_moves() -> None:
    async with AioHost() as host:
        alarm = Alarm()
        host.register(alarm, "alarm")
        def arm(now: float) -> float:
            alarm.deadlines.extend([now + 0.5, now + 0.03, now + 0.01, now + 0.02])
            return now

        start = host.call(alarm, arm)
        # earlier than the armed 0.01 s: must fire first even though a later handle exists
        host.call(alarm, lambda now: alarm.deadlines.append(start + 0.005))
        # remove the 0.5 s deadline: the armed handle must not make the core fire early
        host.call(alarm, lambda now: alarm.deadlines.remove(start + 0.5))
        host.call(alarm, lambda now: alarm.deadlines.append(start + 0.06))
        await host.wait_until(lambda: not alarm.deadlines, 5)
        assert [d - start for d, _ in alarm.fired] == pytest.approx([0.005, 0.01, 0.02, 0.03,
                                                                     0.06])
        assert all(now >= d for d, now in alarm.fired)
        assert all(now - d < 0.25 for d, now in alarm.fired)
        assert all(now >= min(d for d, _ in alarm.fired) for now in alarm.calls)
        await asyncio.sleep(0.1)
        assert len(alarm.fired) == 5


@async_test()
async def test_custom_clock_is_what_cores_see_and_timers_follow_it() -> None:
    offset = 1_000_000.0
    async with AioHost(clock=lambda: time.monotonic() + offset) as host:
        alarm = Alarm()
        host.register(alarm, "alarm")
        t0 = time.monotonic()
        def arm(now: float) -> float:
            alarm.deadlines.append(now + 0.05)
            return now

        start = host.call(alarm, arm)
        assert start > offset
        await host.wait_until(lambda: bool(alarm.fired), 5)
        elapsed = time.monotonic() - t0
        (deadline, now), = alarm.fired
        assert now >= deadline and 0.04 <= elapsed < 1.0


# --- failures -----------------------------------------------------------------------------------


class Boom(Exception):
    pass


class Exploding(EchoCore):
    """An echo core that raises in one chosen method once provoked."""

    def __init__(self, where: str) -> None:
        super().__init__("exploder")
        self.where = where
        self.provoked = False

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        super().receive(data, addr, now)
        self.provoked = True
        if self.where == "receive":
            raise Boom("bad datagram")

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        if self.where == "datagrams_to_send" and self.provoked:
            raise Boom("bad output")
        return super().datagrams_to_send(now)

    def stream_event(self, event: StreamEvent, now: float) -> None:
        if self.where == "stream_event":
            raise Boom("bad event")
        super().stream_event(event, now)

    def get_timer(self) -> float | None:
        return 0.0 if self.where == "handle_timer" else None

    def handle_timer(self, now: float) -> None:
        raise Boom("bad timer")


@pytest.mark.parametrize("where", ["receive", "datagrams_to_send", "stream_event",
                                   "handle_timer"])
@async_test()
async def test_an_exception_in_a_core_stops_the_host_and_names_the_core(
        where: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR, "reference_impl.aio")
    host = AioHost()
    core = Exploding(where)
    udp = await host.bind_udp(core, (LO, 0))
    tcp = await host.listen_tcp(core, (LO, 0))
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.sendto(b"x", udp)
    with socket.create_connection(tcp):
        pass
    with pytest.raises(CoreError) as info:
        await asyncio.wait_for(host.wait_closed(), 5)
    err = info.value
    assert err.endpoint == "exploder" and err.where.startswith(where)
    assert isinstance(err.__cause__, Boom)
    assert "exploder" in str(err) and "Boom" in str(err)
    assert any("exploder" in r.getMessage() and r.exc_info for r in caplog.records)
    assert host.closed
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as again:
        again.bind(udp)  # the host released its socket
    with pytest.raises(HostError, match="closed"):
        await host.bind_udp(EchoCore(), (LO, 0))


class Announcer(EchoCore):
    """An echo core that also queues one application event per datagram (like a receiver core
    delivering a message and queueing its ACK in the same call)."""

    def __init__(self) -> None:
        super().__init__("announcer")
        self.queue: list[bytes] = []

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        super().receive(data, addr, now)
        self.queue.append(data)

    def next_event(self) -> bytes | None:
        return self.queue.pop(0) if self.queue else None


@async_test()
async def test_events_reach_the_handler_before_the_output_of_the_same_call_leaves() -> None:
    async with AioHost() as host:
        core = Announcer()
        addr = await host.bind_udp(core, (LO, 0))
        seen: list[tuple[bytes, int]] = []
        host.on_events(core, lambda event: seen.append((event, host.stats["datagrams_sent"])))
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
            raw.setblocking(False)
            raw.bind((LO, 0))
            for i in range(5):
                raw.sendto(b"m%d" % i, addr)
                assert await asyncio.wait_for(loop.sock_recv(raw, 100), 5) == b"M%d" % i
        # each event was handled while its echo had not been sent yet
        assert seen == [(b"m%d" % i, i) for i in range(5)]
        assert core.queue == []


class BatchAnnouncer:
    """Echoes datagrams upper-cased and queues two events per datagram, which it can hand over
    all at once (``events()``, as the reference cores can): the host must take them that way."""

    def __init__(self) -> None:
        self.queue: list[bytes] = []
        self.drains = 0
        self._out: list[tuple[bytes, Addr]] = []

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        self._out.append((data.upper(), addr))
        self.queue += [data, data + b"+"]

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        return None

    def handle_timer(self, now: float) -> None:
        pass

    def next_event(self) -> bytes | None:
        raise AssertionError("the host should drain with events()")

    def events(self) -> list[bytes]:
        self.drains += 1
        out, self.queue = self.queue, []
        return out


@async_test()
async def test_a_core_with_events_is_drained_a_batch_at_a_time_in_order() -> None:
    async with AioHost() as host:
        core = BatchAnnouncer()
        addr = await host.bind_udp(core, (LO, 0))
        seen: list[tuple[bytes, int]] = []

        def handler(event: bytes) -> None:
            seen.append((event, host.stats["datagrams_sent"]))
            if event == b"m1":  # an event handled while handling one: after the batch
                core.queue.append(b"late")

        host.on_events(core, handler)
        loop = asyncio.get_running_loop()
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
            raw.setblocking(False)
            raw.bind((LO, 0))
            for i in range(3):
                raw.sendto(b"m%d" % i, addr)
                assert await asyncio.wait_for(loop.sock_recv(raw, 100), 5) == b"M%d" % i
        assert seen == [(b"m0", 0), (b"m0+", 0), (b"m1", 1), (b"m1+", 1), (b"late", 1),
                        (b"m2", 2), (b"m2+", 2)]
        assert core.drains >= 3 and core.queue == []


@async_test()
async def test_an_exception_in_an_event_handler_stops_the_host_before_the_output() -> None:
    host = AioHost()
    core = Announcer()
    addr = await host.bind_udp(core, (LO, 0))

    def handler(event: object) -> None:
        raise Boom("application bug")
    host.on_events(core, handler)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
        raw.sendto(b"x", addr)
    with pytest.raises(CoreError) as info:
        await asyncio.wait_for(host.wait_closed(), 5)
    assert info.value.where == "event handler" and isinstance(info.value.__cause__, Boom)
    assert host.stats["datagrams_sent"] == 0
    with pytest.raises(HostError, match="no next_event"):
        AioHost.on_events(host, EchoCore(), handler)


@async_test()
async def test_async_with_raises_a_failure_nobody_waited_for() -> None:
    with pytest.raises(CoreError, match="'quiet' failed in handle_timer"):
        async with AioHost() as host:
            host.register(Exploding("handle_timer"), "quiet")
            await asyncio.sleep(0.1)  # the failure happens here, unobserved


@async_test()
async def test_a_timer_that_never_moves_on_is_reported_not_spun_forever() -> None:
    class Stuck(Alarm):
        def get_timer(self) -> float | None:
            return 0.0

    async with AioHost() as host:
        host.register(Stuck(), "stuck")
        with pytest.raises(CoreError, match="never moves on"):
            await host.wait_until(lambda: False, 10)


@async_test()
async def test_bad_stream_command_and_bad_addresses_are_clear_errors() -> None:
    class Weird(CallbackEndpoint):
        def stream_commands(self, now: float) -> list[StreamCommand]:
            return ["not a command"]  # type: ignore[list-item]

    async with AioHost() as host:
        taken = await host.bind_udp(EchoCore(), (LO, 0))
        with pytest.raises(HostError, match="cannot bind UDP"):
            await host.bind_udp(EchoCore(), taken)
        with pytest.raises(HostError, match="no stream_event"):
            await host.listen_tcp(Alarm(), (LO, 0))  # type: ignore[arg-type]
        with pytest.raises(HostError, match="not an Endpoint"):
            host.register(object())  # type: ignore[arg-type]
        host.register(Weird(), "weird")
        with pytest.raises(CoreError, match=r"weird.*stream_commands.*not a command"):
            await host.wait_until(lambda: False, 5)


# --- daemons ------------------------------------------------------------------------------------


DAEMON = """
import sys
from reference_impl.aio import run_forever
from tests.reference_impl.test_aio import EchoCore, Exploding

async def setup(host):
    core = Exploding("receive") if sys.argv[1] == "explode" else EchoCore()
    udp = await host.bind_udp(core, ("127.0.0.1", 0))
    tcp = await host.listen_tcp(core, ("127.0.0.1", 0))
    print(udp[1], tcp[1], flush=True)

sys.exit(run_forever(setup))
"""


def start_daemon(mode: str) -> tuple[subprocess.Popen[str], int, int]:
    proc = subprocess.Popen([sys.executable, "-c", DAEMON, mode], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.stdout is not None
    udp, tcp = map(int, proc.stdout.readline().split())
    return proc, udp, tcp


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_daemon_serves_until_a_signal_then_exits_cleanly(sig: signal.Signals) -> None:
    proc, _, tcp = start_daemon("echo")
    try:
        with socket.create_connection((LO, tcp), timeout=5) as s:
            s.sendall(b"ping")
            assert s.recv(10) == b"PING"
            proc.send_signal(sig)
            s.settimeout(5)
            assert s.recv(10) == b""  # the host closed our stream on the way out
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()


def test_daemon_exits_with_a_one_line_error_when_a_core_fails() -> None:
    proc, udp, _ = start_daemon("explode")
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"x", (LO, udp))
        assert proc.wait(timeout=10) == 1
        assert proc.stderr is not None
        err = proc.stderr.read()
        assert "error: endpoint 'exploder' failed in receive: Boom: bad datagram" in err
    finally:
        proc.kill()
        proc.wait()


def test_run_forever_reports_a_setup_error_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
        taken.bind((LO, 0))

        async def setup(host: AioHost) -> None:
            await host.bind_udp(EchoCore(), taken.getsockname())

        assert run_forever(setup) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: echo: cannot bind UDP") and err.count("\n") == 1


# --- throughput (figures for the report) --------------------------------------------------------


class Pinger:
    """Keeps ``window`` datagrams in flight to an echo until ``count`` echoes are back."""

    def __init__(self, dst: Addr, count: int, window: int, size: int) -> None:
        self.dst, self.count, self.size = dst, count, size
        self.payload = b"x" * size
        self.sent = window
        self.back = 0
        self._out = [(self.payload, dst)] * window

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        self.back += 1
        if self.sent < self.count:
            self.sent += 1
            self._out.append((self.payload, self.dst))

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        out, self._out = self._out, []
        return out

    def get_timer(self) -> float | None:
        return None

    def handle_timer(self, now: float) -> None:
        pass


async def udp_echo_rate(count: int = 200_000, window: int = 64, size: int = 64) -> float:
    """Echoed datagrams per second (each counts once; twice as many crossed the host)."""
    async with AioHost() as host:
        echo = EchoCore(record=False)
        addr = await host.bind_udp(echo, (LO, 0))
        pinger = Pinger(addr, count, window, size)
        start = time.perf_counter()
        await host.bind_udp(pinger, (LO, 0), name="pinger")
        await host.wait_until(lambda: pinger.back >= count - window, 120, poll=0.01)
        return pinger.back / (time.perf_counter() - start)


class Blaster:
    """Streams ``total`` bytes in ``chunk`` writes, keeping at most ``window`` bytes unechoed,
    and counts the echo; keeps nothing else, so the host is what gets measured."""

    def __init__(self, server: Addr, total: int, chunk: int, window: int) -> None:
        self.total, self.window = total, window
        self.block = b"y" * chunk
        self.sent = self.received = 0
        self.conn: ConnKey | None = None
        self._cmds: list[StreamCommand] = [Connect((LO, 0), server)]

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        pass

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        return []

    def get_timer(self) -> float | None:
        return None

    def handle_timer(self, now: float) -> None:
        pass

    def stream_event(self, event: StreamEvent, now: float) -> None:
        if event.kind is K.CONNECTED:
            self.conn = event.conn
        self.received += len(event.data)
        assert self.conn is not None
        while self.sent < self.total and self.sent - self.received < self.window:
            self._cmds.append(StreamWrite(self.conn, self.block))
            self.sent += len(self.block)

    def stream_commands(self, now: float) -> list[StreamCommand]:
        out, self._cmds = self._cmds, []
        return out


async def tcp_echo_rate(total: int = 400 * 1024 * 1024, chunk: int = 64 * 1024) -> float:
    """MB/s of payload echoed (sent and received back) over one stream."""
    async with AioHost() as host:
        addr = await host.listen_tcp(EchoCore(record=False), (LO, 0))
        blaster = Blaster(addr, total, chunk, window=4 * 1024 * 1024)
        start = time.perf_counter()
        host.register(blaster, "blaster")
        await host.wait_until(lambda: blaster.received >= total, 120, poll=0.01)
        return total / (time.perf_counter() - start) / 1e6


@pytest.mark.slow
def test_throughput_figures() -> None:
    udp = asyncio.run(udp_echo_rate())
    tcp = asyncio.run(tcp_echo_rate())
    print(f"\nUDP echo: {udp:,.0f} round trips/s ({2 * udp:,.0f} datagrams/s through the host)")
    print(f"TCP echo: {tcp:,.0f} MB/s (each byte written, echoed and read back)")
    assert udp > 10_000 and tcp > 20


if __name__ == "__main__":
    udp_rate = asyncio.run(udp_echo_rate())
    tcp_rate = asyncio.run(tcp_echo_rate())
    print(f"UDP echo: {udp_rate:,.0f} round trips/s; TCP echo: {tcp_rate:,.0f} MB/s")
