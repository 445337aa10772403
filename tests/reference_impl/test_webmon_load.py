"""The store web monitor under load: slow and flooding clients must not lock out an operator.

The attack runs in a thread of its own with its own event loop (so the monitor's loop is not
the one driving the attackers): ``slow`` slowloris clients each send a request line and then
one header byte every couple of seconds, reconnecting at once when the monitor drops them;
``fast`` clients fetch ``/`` back to back, each on a new connection.  Meanwhile the "operator"
fetches pages with urllib from yet another thread and must get every page, quickly.  Everything
is real sockets on loopback; every loop is bounded in count and in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from dataclasses import dataclass, field

from reference_impl.webmon import HttpLimits, WebMonitor
from tests.reference_impl.test_webmon import World, async_test, parse_response, post

ATTACK_SECONDS = 20.0  # hard stop for the attack thread, whatever happens to the test
TRICKLE_SECONDS = 2.0  # a slowloris client sends one header byte this often


@dataclass
class Counts:
    slow_connects: int = 0
    slow_dropped: int = 0
    fast_ok: int = 0
    fast_other: dict[str, int] = field(default_factory=dict)


class Attack:
    """Slowloris and flooding clients against ``port``, in a thread with its own loop."""

    def __init__(self, port: int, *, slow: int = 200, fast: int = 200,
                 slow_ip: str = "127.0.0.1", fast_ip: str = "127.0.0.1") -> None:
        self.port, self.slow, self.fast = port, slow, fast
        self.slow_ip, self.fast_ip = slow_ip, fast_ip
        self.counts = Counts()
        self.open_slow = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="webmon-attack", daemon=True)

    async def __aenter__(self) -> Attack:
        self._thread.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._stop.set()
        await asyncio.to_thread(self._thread.join, 10)  # the monitor's loop keeps running
        assert not self._thread.is_alive(), "the attack thread did not stop"

    @property
    def fast_done(self) -> int:
        """Requests the flooding clients finished, answered or not."""
        return self.counts.fast_ok + sum(self.counts.fast_other.values())

    def _run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        deadline = time.monotonic() + ATTACK_SECONDS
        tasks = [asyncio.create_task(self._slow_client(deadline)) for _ in range(self.slow)]
        tasks += [asyncio.create_task(self._fast_client(deadline)) for _ in range(self.fast)]
        while not self._stop.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _slow_client(self, deadline: float) -> None:
        while time.monotonic() < deadline and not self._stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", self.port, local_addr=(self.slow_ip, 0))
            except OSError:
                await asyncio.sleep(0.05)
                continue
            self.counts.slow_connects += 1
            self.open_slow += 1
            try:
                writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n")
                for _ in range(100):  # one byte of an endless header line per trickle period
                    if self._stop.is_set():
                        return
                    writer.write(b"a")
                    await writer.drain()
                    # an answer or EOF means the monitor gave up on us: reconnect at once
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(TRICKLE_SECONDS):
                            await reader.read(1)
                        break
            except OSError:
                pass
            finally:
                self.open_slow -= 1
                self.counts.slow_dropped += 1
                writer.close()

    async def _fast_client(self, deadline: float) -> None:
        request = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        while time.monotonic() < deadline and not self._stop.is_set():
            try:
                reader, writer = await asyncio.open_connection(
                    "127.0.0.1", self.port, local_addr=(self.fast_ip, 0))
            except OSError as exc:
                self._other(type(exc).__name__)
                await asyncio.sleep(0.01)
                continue
            try:
                writer.write(request)
                async with asyncio.timeout(10):
                    data = await reader.read()
                if data.startswith(b"HTTP/1.1 200 "):
                    self.counts.fast_ok += 1
                else:
                    self._other(data[:12].decode("latin-1") or "EOF")
            except (OSError, TimeoutError) as exc:
                self._other(type(exc).__name__)
            finally:
                writer.close()

    def _other(self, what: str) -> None:
        self.counts.fast_other[what] = self.counts.fast_other.get(what, 0) + 1


def operator_get(port: int, path: str) -> tuple[int, float]:
    """(status, seconds) of one page as a browser would fetch it (from 127.0.0.1)."""
    started = time.monotonic()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as response:
        response.read()
        return response.status, time.monotonic() - started


async def wait_for(predicate: object, timeout: float) -> None:
    assert callable(predicate)
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the attack did not get going"
        await asyncio.sleep(0.05)


async def operator_session(port: int, paths: list[str]) -> list[tuple[str, int, float]]:
    """Fetch every path (in a thread: the monitor's loop keeps running); each must be 200."""
    seen = []
    for path in paths:
        status, seconds = await asyncio.to_thread(operator_get, port, path)
        seen.append((path, status, seconds))
        await asyncio.sleep(0.2)
    return seen


PAGES = ["/", "/stores", "/stores/0", "/", "/stores/0", "/"]


@async_test(60)
async def test_operator_is_served_while_slow_and_flooding_clients_hammer() -> None:
    """200 slowloris and 200 flooding clients, all from 127.0.0.1 like the operator, against
    the default limits: every page the operator asks for comes back within 2 s."""
    w = World()
    async with w.monitor() as mon:
        async with Attack(mon.port) as attack:
            await wait_for(lambda: attack.counts.slow_connects >= 200
                           and attack.fast_done >= 200, 10)
            seen = await operator_session(mon.port, PAGES)
            counts = attack.counts
        print(f"operator {seen}; attack {counts}; monitor {mon.stats}")
        assert all(status == 200 for _, status, _ in seen), seen
        assert max(seconds for _, _, seconds in seen) < 2.0, seen


@async_test(60)
async def test_eviction_keeps_room_for_other_clients_at_small_caps() -> None:
    """With room for only 64 connections and 16 per client address, 200 slowloris clients
    (from 127.0.0.2) and 200 flooding clients (from 127.0.0.3) cannot hold the monitor: their
    own oldest connections make room, and the operator (127.0.0.1) is served."""
    w = World()
    limits = HttpLimits(max_connections=64, max_per_client=16)
    async with w.monitor(limits=limits) as mon:
        async with Attack(mon.port, slow_ip="127.0.0.2", fast_ip="127.0.0.3") as attack:
            await wait_for(lambda: attack.counts.slow_connects >= 200
                           and attack.fast_done >= 200, 10)
            seen = await operator_session(mon.port, PAGES)
            counts = attack.counts
        print(f"operator {seen}; attack {counts}; monitor {mon.stats}")
        assert all(status == 200 for _, status, _ in seen), seen
        assert max(seconds for _, _, seconds in seen) < 2.0, seen
        assert mon.stats["evicted"] > 0


async def _slow_connection(port: int, ip: str = "127.0.0.1"
                           ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(ip, 0))
    writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: a")  # an unfinished head
    await writer.drain()
    await asyncio.sleep(0.05)  # let the monitor take it in
    return reader, writer


async def _dropped(reader: asyncio.StreamReader) -> bool:
    """Whether the monitor closed or reset this connection (waits at most 0.3 s)."""
    try:
        return await asyncio.wait_for(reader.read(), 0.3) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


@async_test()
async def test_at_the_cap_the_oldest_unfinished_request_makes_room() -> None:
    """A new client is served and the connection that has waited longest for its request head
    goes, rather than the new client being refused (it used to get 503)."""
    mon = WebMonitor([], version="1", limits=HttpLimits(max_connections=2))
    async with mon:
        first, first_w = await _slow_connection(mon.port)
        second, second_w = await _slow_connection(mon.port)
        reader, writer = await asyncio.open_connection("127.0.0.1", mon.port)
        writer.write(b"GET / HTTP/1.0\r\n\r\n")
        status, _, body = parse_response(await asyncio.wait_for(reader.read(), 5))
        assert status == 200 and b"Persistent Store" in body
        assert await _dropped(first)
        assert not await _dropped(second)
        assert mon.stats["evicted"] == 1
        for w in (first_w, second_w, writer):
            w.close()


@async_test()
async def test_one_client_address_cannot_take_more_than_its_share() -> None:
    """Past ``max_per_client`` a client address loses its own oldest connection; other
    addresses keep theirs even though the monitor as a whole has room."""
    mon = WebMonitor([], version="1", limits=HttpLimits(max_connections=100,
                                                        max_per_client=2))
    async with mon:
        other, other_w = await _slow_connection(mon.port, "127.0.0.1")
        first, first_w = await _slow_connection(mon.port, "127.0.0.2")
        second, second_w = await _slow_connection(mon.port, "127.0.0.2")
        third, third_w = await _slow_connection(mon.port, "127.0.0.2")
        assert await _dropped(first)
        assert not any([await _dropped(second), await _dropped(third),
                        await _dropped(other)])
        for w in (other_w, first_w, second_w, third_w):
            w.close()


@async_test()
async def test_pages_come_from_a_snapshot_at_most_max_age_old() -> None:
    """However many requests arrive, a store is snapshotted at most once per ``max_age`` (a
    snapshot walks every source and receiver: about 20 ms for 2,000 sources), pages are
    answered from it, and a reset makes the next page fresh."""
    w = World()
    calls = 0
    snapshot = w.store.snapshot

    def counting() -> dict[str, object]:
        nonlocal calls
        calls += 1
        return snapshot()

    w.store.snapshot = counting  # type: ignore[method-assign]
    async with w.monitor(max_age=60.0) as mon:
        base = f"http://127.0.0.1:{mon.port}"
        pages = ["/stores/0", f"/stores/0/{w.src_id}", f"/stores/0/{w.src_id}/{w.rcv_id}"]
        first = {p: await asyncio.to_thread(operator_get_body, base + p) for p in pages}
        w.src.send(b"more")
        w.d.run(1)
        for _ in range(10):
            for p in pages:
                assert await asyncio.to_thread(operator_get_body, base + p) == first[p]
        assert calls == 1
        store = (await asyncio.to_thread(operator_get_body, base + "/stores/0?format=json"))
        token = json.loads(store)["reset"]["token"]
        status, _, _ = await post(mon.port, "/stores/0/reset", f"token={token}".encode())
        assert status == 200
        after = await asyncio.to_thread(operator_get_body, base + f"/stores/0/{w.src_id}")
        assert after != first[f"/stores/0/{w.src_id}"]  # the new message is in the window
        assert calls == 2

    calls = 0
    async with w.monitor(max_age=0.0) as mon:
        base = f"http://127.0.0.1:{mon.port}"
        for _ in range(3):
            await asyncio.to_thread(operator_get_body, base + "/stores/0")
        assert calls == 3


def operator_get_body(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read())


@async_test()
async def test_a_connection_writing_a_response_is_never_evicted() -> None:
    """At the cap, a connection still draining a response to its reader is kept and the new
    connection is answered 503 instead (the one refusal left)."""
    mon = WebMonitor([], version="1", limits=HttpLimits(max_connections=1))
    async with mon:
        first, first_w = await _slow_connection(mon.port)
        (conn,) = mon._connections.values()
        conn.enter("write")  # as if its response were stuck in a full socket buffer
        status, _, _ = await raw_request(mon.port, b"GET / HTTP/1.0\r\n\r\n")
        assert status == 503
        assert not await _dropped(first)
        assert mon.stats["refused"] == 1 and mon.stats["evicted"] == 0
        first_w.close()


async def raw_request(port: int, request: bytes) -> tuple[int, dict[str, str], bytes]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return parse_response(data)


@async_test()
async def test_a_page_from_an_older_snapshot_stays_consistent() -> None:
    """A source page built from a snapshot taken before new messages arrived reads the live
    repository for its contiguous run, and cuts it at the snapshot's lead: the page never
    shows a contig_sqn past its own window."""
    w = World()
    async with w.monitor(max_age=60.0) as mon:
        base = f"http://127.0.0.1:{mon.port}"
        await asyncio.to_thread(operator_get_body, base + "/stores/0")  # takes the snapshot
        more = [w.src.send(b"later") for _ in range(3)]
        w.d.run(1)
        repo = w.store.sources[w.src_id].repo
        assert repo is not None and repo.lead_sqn == more[-1]
        data = json.loads(await asyncio.to_thread(
            operator_get_body, base + f"/stores/0/{w.src_id}?format=json"))
        assert data["window"]["lead_sqn"] == w.sent[-1]  # from the snapshot
        assert data["sync"]["contig_sqn"] == w.sent[-1]


@async_test()
async def test_at_the_total_cap_the_address_holding_most_gives_way() -> None:
    """Over the total cap the victim comes from the address with the most connections, even
    when another address holds the oldest one."""
    mon = WebMonitor([], version="1", limits=HttpLimits(max_connections=3,
                                                        max_per_client=100))
    async with mon:
        oldest, oldest_w = await _slow_connection(mon.port, "127.0.0.1")
        first, first_w = await _slow_connection(mon.port, "127.0.0.2")
        second, second_w = await _slow_connection(mon.port, "127.0.0.2")
        newest, newest_w = await _slow_connection(mon.port, "127.0.0.3")
        assert await _dropped(first)
        assert not any([await _dropped(oldest), await _dropped(second),
                        await _dropped(newest)])
        for w in (oldest_w, first_w, second_w, newest_w):
            w.close()
