"""A disk-repository store killed with SIGKILL mid-load loses nothing it acknowledged as stable.

Stability is the store's promise: once the source sees a message stable, a receiver that
joins later must be able to recover it, even if the store process dies without warning right
after the acknowledgement.  The reference store writes each message to its repository file
before it sends the stability ACK, so the kernel holds the bytes when the process is killed;
this test checks that promise end to end, with real processes and sockets:

1. resolver and store (``python -m ump resolver|store``) as subprocesses, the store with a disk
   repository in a temp directory;
2. a source in this process sends continuously and records every sequence number it is told
   is stable (:class:`MessageStable` with :attr:`StableFlags.STABLE`);
3. the store is SIGKILLed while messages are still flowing, then restarted on the same XML
   (same cache and state directories);
4. a new receiver registers (a new receiver recovers everything the store holds) and must be
   delivered every sequence number the source saw stable.

The store and the resolver take free ports chosen per test, so two test runs on one machine
(or a product daemon on UM's well-known ports) do not collide; both are checked as started
(their ready line) before the test goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from reference_impl import runtime
from reference_impl.aio import AioHost
from reference_impl.config import ClientConfig
from reference_impl.config.store_xml_writer import disk_store_xml
from reference_impl.events import Event, MessageDelivered, MessageStable, StableFlags
from tests.reference_impl.loopback import free_port, stop_processes

TOPIC = "crash.safety"
STABLE_BEFORE_KILL = 2000  # the kill happens once this many are stable, with more in flight


class Processes:
    """The subprocesses of one test; each logs to its own file in the work directory."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.resolver_port = free_port(socket.SOCK_DGRAM)
        self.store_port = free_port(socket.SOCK_STREAM)

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        with (self.dir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen([sys.executable, "-m", "ump", *args, "-v"], cwd=self.dir,
                                    stdout=log, stderr=log)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        return (self.dir / f"{name}.log").read_text(errors="replace")

    def start_resolver(self) -> None:
        self.start("resolver", "resolver", "--listen", f"127.0.0.1:{self.resolver_port}")
        self.wait_ready("resolver", "resolver listening on", 0)

    def start_store(self) -> None:
        """Start the store and wait until it accepts registrations (its log is appended to, so
        the ready line is counted, not just searched for)."""
        before = self.log("store").count("ready to accept registrations") \
            if (self.dir / "store.log").exists() else 0
        self.start("store", "store", "-c", "store.xml",
                   "--resolver", f"127.0.0.1:{self.resolver_port}")
        self.wait_ready("store", "ready to accept registrations", before)

    def wait_ready(self, name: str, text: str, before: int) -> None:
        """Until ``name``'s log shows ``text`` more than ``before`` times; a process that
        exits first, or is not ready within 15 s, fails the test with its log."""
        proc = self.procs[name]
        deadline = time.monotonic() + 15
        while self.log(name).count(text) <= before:
            assert proc.poll() is None, f"{name} exited early:\n{self.log(name)}"
            assert time.monotonic() < deadline, f"{name} not ready:\n{self.log(name)}"
            time.sleep(0.02)

    def stop_all(self) -> None:
        stop_processes(self.procs.values())


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    procs = Processes(tmp_path)
    (tmp_path / "store.xml").write_text(
        disk_store_xml("crash-store", procs.store_port, r"crash\..*"))
    try:
        procs.start_resolver()
        procs.start_store()
        yield procs
    finally:
        procs.stop_all()


def _client(resolver_port: int, **sections: dict[str, object]) -> ClientConfig:
    mapping: dict[str, dict[str, object]] = {
        "context": {"resolver_unicast_daemon": f"127.0.0.1:{resolver_port}"}}
    mapping.update(sections)
    return ClientConfig.from_mapping(mapping)


async def _crash_and_recover(procs: Processes) -> tuple[set[int], set[int], bool]:
    """Returns (stable seen by the source, delivered to the receiver, whether the sender was
    still sending when the store was killed)."""
    stable: set[int] = set()
    delivered: set[int] = set()

    def on_event(core: object, event: Event) -> None:
        if isinstance(event, MessageStable) and event.flags & StableFlags.STABLE:
            stable.add(event.sequence_number)
        elif isinstance(event, MessageDelivered):
            delivered.add(event.sequence_number)

    async with AioHost() as host:
        source = await runtime.start_source(host, TOPIC, _client(procs.resolver_port, source={
            "ume_store": [f"127.0.0.1:{procs.store_port}"], "ume_flight_size": 500}))
        loop = asyncio.get_running_loop()
        runtime.handle_events(host, [source], on_event)
        await host.wait_until(lambda: source.complete, timeout=15)
        sender = loop.create_task(runtime.send_messages(host, source, 1_000_000, timeout=30))
        await host.wait_until(lambda: len(stable) >= STABLE_BEFORE_KILL, timeout=20)
        mid_load = not sender.done()
        procs.procs["store"].send_signal(signal.SIGKILL)
        procs.procs["store"].wait()
        sender.cancel()
        await asyncio.sleep(0.2)  # stability events already on their way are still recorded
        stable_at_kill = set(stable)

        await asyncio.to_thread(procs.start_store)
        receiver = await runtime.start_receiver(host, TOPIC, _client(procs.resolver_port, receiver={
            "retransmit_request_outstanding_maximum": 200}))
        runtime.handle_events(host, [receiver], on_event)
        with contextlib.suppress(TimeoutError):  # the assertion below says what is missing
            await host.wait_until(lambda: stable_at_kill <= delivered, timeout=20, poll=0.01)
    return stable_at_kill, delivered, mid_load


def test_stable_messages_survive_store_sigkill(processes: Processes) -> None:
    stable, delivered, mid_load = asyncio.run(_crash_and_recover(processes))
    assert mid_load, "the kill should land while the source is still sending"
    assert len(stable) >= STABLE_BEFORE_KILL
    missing = sorted(stable - delivered)
    assert not missing, (
        f"{len(missing)} of {len(stable)} messages the source saw stable were not recovered "
        f"after the store's SIGKILL and restart (first {missing[:10]}); store log:\n"
        f"{processes.log('store')[-3000:]}")
