"""Issue 22 items 1 and 2 on real sockets: a store process SIGKILLed and restarted under a live
source.

* **Theft**: an impostor that asks for the live source's RegID right after the store restarted
  (before the real source re-registers) is refused with "RegID in use"; the real source
  re-registers, resumes and gets stability again; a fresh receiver recovers from the store
  exactly the real source's payloads.
* **Restart stall**: stability resumes within a few seconds of the restart (the source sees
  the closed connection at once instead of waiting ``ume_store_activity_timeout``, 10 s, and
  re-registers; the restarted store rejoins the sources it restored), and the restarted store
  drops none of the source's data.

The first store is a ``ump store`` process (so it can be SIGKILLed); the resolver, sources and
receiver run in this process on :class:`~reference_impl.aio.AioHost`, every port a free one.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from reference_impl import runtime
from reference_impl.aio import AioHost
from reference_impl.config import ClientConfig
from reference_impl.config.store_xml_writer import disk_store_xml
from reference_impl.events import (
    Event,
    MessageDelivered,
    MessageStable,
    SourceRegistrationComplete,
    SourceRegistrationError,
    SourceRegistrationSuccess,
    StableFlags,
)
from reference_impl.source import SendError, SourceConfig, SourceCore, StoreSpec
from tests.reference_impl.loopback import free_port
from wire.lbmc import PregError

IP = "127.0.0.1"
TOPIC = "theft.orders"


class Rig:
    """A store configuration in ``tmp``, the resolver, and the store process's life."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.store_port = free_port()
        self.resolver = (IP, free_port(socket.SOCK_DGRAM))
        (tmp / "store.xml").write_text(disk_store_xml("theft", self.store_port, r"theft\..*"))
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = tmp / "store.log"

    async def start_store_process(self, timeout: float = 30.0) -> None:
        """``ump store`` as its own process; returns once it says it is ready."""
        start = self.log.stat().st_size if self.log.exists() else 0
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "ump", "store", "-c", "store.xml", "-v",
                 "--resolver", f"{IP}:{self.resolver[1]}"],
                cwd=self.tmp, stdout=log, stderr=log, env={**os.environ})
        deadline = time.monotonic() + timeout
        while "ready to accept registrations" not in self.log.read_bytes()[start:].decode(
                errors="replace"):
            assert self.proc.poll() is None, self.log.read_text(errors="replace")
            assert time.monotonic() < deadline, "the store process did not start"
            await asyncio.sleep(0.02)

    def kill_store_process(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()

    def client(self) -> ClientConfig:
        return ClientConfig.from_mapping(
            {"context": {"resolver_unicast_daemon": f"{IP}:{self.resolver[1]}"}})

    async def source(self, host: AioHost, name: str, reg_id: int = 0,
                     **options: Any) -> SourceCore:
        """A source of :data:`TOPIC` on free transport and request ports."""
        transport, request = free_port(), free_port()
        config = SourceConfig(ume_store=(StoreSpec(IP, self.store_port, reg_id=reg_id),),
                              **options)
        core = SourceCore(TOPIC, config, ip=IP, transport_port=transport, request_port=request,
                          resolver=self.resolver, now=host.now())
        with host.starting(core, name=name):
            await host.listen_tcp(core, (IP, transport))
            await host.listen_tcp(core, (IP, request))
            await host.bind_udp(core, (IP, 0))
        return core


def recorder(host: AioHost, core: Any) -> list[tuple[float, Event]]:
    """Every event of ``core`` with the host time it happened at."""
    seen: list[tuple[float, Event]] = []
    runtime.handle_events(host, [core], lambda _core, event: seen.append((host.now(), event)))
    return seen


def of(seen: list[tuple[float, Event]], kind: type, since: float = 0.0) -> list[Any]:
    return [e for t, e in seen if isinstance(e, kind) and t >= since]


async def send_all(host: AioHost, source: SourceCore, payloads: list[bytes]) -> None:
    """Send ``payloads`` in order, waiting out registration and flight size."""
    left = list(payloads)

    def step(now: float) -> int:
        try:
            return source.send_many(left[:256])
        except SendError:  # not registered / would block: try again soon
            return 0
    while left:
        sent = host.call(source, step)
        del left[:sent]
        await asyncio.sleep(0 if sent else 0.01)


async def wait(host: AioHost, predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


# --- theft -------------------------------------------------------------------------------------


async def theft_run(tmp: Path) -> None:
    rig = Rig(tmp)
    try:
        async with AioHost() as host:
            await runtime.run_resolver(host, rig.resolver)
            await rig.start_store_process()
            # after the kill the real source's first attempt is refused (the store is down)
            # and its next one comes 5 s later, after the impostor's
            real = await rig.source(host, "real", ume_registration_interval=5000)
            real_events = recorder(host, real)
            await wait(host, lambda: real.complete, 15, "the real source's registration")
            (granted,) = of(real_events, SourceRegistrationSuccess)
            await send_all(host, real, [b"real:%d" % i for i in range(50)])
            await wait(host, lambda: real.inflight == 0, 10, "stability of 0..49")

            rig.kill_store_process()
            killed = host.now()
            # the impostor knocks every 0.5 s from the moment the store died, so it is first
            # at the restarted store however long the restart takes (up to about 5 s)
            impostor = await rig.source(host, "impostor", reg_id=granted.reg_id,
                                        ume_registration_interval=500)
            impostor_events = recorder(host, impostor)
            await rig.start_store_process()
            await wait(host, lambda: bool(of(impostor_events, SourceRegistrationError))
                       or bool(of(impostor_events, SourceRegistrationSuccess)), 10,
                       "the store's answer to the impostor")
            back = of(real_events, SourceRegistrationSuccess, since=killed)
            assert not back, "the race was not run: the real source re-registered first"
            assert not of(impostor_events, SourceRegistrationSuccess), \
                "the impostor was granted the live source's RegID"
            (refusal, *_) = of(impostor_events, SourceRegistrationError)
            assert refusal.code == PregError.EACTIVE

            # the real source comes back as the old registration and resumes where it was
            await wait(host, lambda: bool(of(real_events, SourceRegistrationComplete,
                                             since=killed)), 20, "the real source's return")
            (again,) = of(real_events, SourceRegistrationSuccess, since=killed)
            assert again.old and again.reg_id == granted.reg_id
            assert again.sequence_number == 49
            await send_all(host, real, [b"real:%d" % i for i in range(50, 100)])
            await wait(host, lambda: real.inflight == 0, 10, "stability of 50..99")
            assert not impostor.complete
            assert not of(impostor_events, SourceRegistrationSuccess)
            host.call(impostor, lambda now: impostor.close())

            # a fresh receiver recovers exactly the real source's messages from the store
            receiver = await runtime.start_receiver(host, TOPIC, rig.client())
            got: list[MessageDelivered] = []
            runtime.handle_events(host, [receiver], lambda _c, e: got.append(e)
                                  if isinstance(e, MessageDelivered) else None)
            await wait(host, lambda: len(got) >= 100, 20, "the fresh receiver's recovery")
            assert [m.sequence_number for m in got] == list(range(100))
            assert [m.payload.rstrip(b".") for m in got] == [b"real:%d" % i for i in range(100)]
    finally:
        rig.stop()


def test_an_impostor_racing_a_live_source_after_a_store_restart_is_refused(
        tmp_path: Path) -> None:
    asyncio.run(asyncio.wait_for(theft_run(tmp_path), 90))


# --- the restart stall -------------------------------------------------------------------------


async def restart_run(tmp: Path, **source_options: Any) -> dict[str, float]:
    """A source sending 4000 messages at 1000/s; the store process SIGKILLed after about a
    second and started again at once (a new ``ump store`` process on the same disk state).
    Returns the figures: seconds from the kill to the restarted store's readiness and to the
    first message stable after it, and the data the restarted store dropped (its log)."""
    rig = Rig(tmp)
    try:
        async with AioHost() as host:
            await runtime.run_resolver(host, rig.resolver)
            await rig.start_store_process()
            src = await rig.source(host, "src", **source_options)
            events = recorder(host, src)
            await wait(host, lambda: src.complete, 15, "registration")
            sending = asyncio.ensure_future(runtime.send_messages(host, src, 4000, rate=1000))
            await wait(host, lambda: src.stats["stable"] >= 800, 10, "stability before the kill")
            rig.kill_store_process()
            killed = host.now()
            logged = rig.log.stat().st_size
            await rig.start_store_process()
            ready = host.now()
            await sending
            await wait(host, lambda: src.inflight == 0 and src.stats["sent"] == 4000, 40,
                       "stability of every message")
            stable_after = [t for t, e in events if t > ready and isinstance(e, MessageStable)
                            and e.flags & StableFlags.STABLE]
            second_life = rig.log.read_bytes()[logged:].decode(errors="replace")
            return {"kill_to_ready": ready - killed,
                    "kill_to_stable": stable_after[0] - killed,
                    "ready_to_stable": stable_after[0] - ready,
                    "drops": second_life.count("InputDropped"),
                    "unknown_topic_index_drops": second_life.count("unknown topic index")}
    finally:
        rig.stop()


def test_stability_resumes_within_seconds_of_a_store_restart_without_drops(
        tmp_path: Path) -> None:
    figures = asyncio.run(asyncio.wait_for(restart_run(tmp_path), 90))
    print(f"store restart figures: {figures}")
    # the source's next registration attempt comes one ume_registration_interval (3 s) after
    # the one refused while the store was down (measured: about 3.2 s from the kill); before,
    # the source noticed nothing for ume_store_activity_timeout (10 s; measured: 15 s from the
    # kill to stability, 1000 messages dropped by the restarted store)
    assert figures["kill_to_stable"] < 10.0, figures
    assert figures["ready_to_stable"] < 6.5, figures
    assert figures["drops"] == 0, figures  # and every message is stable: the store holds all
