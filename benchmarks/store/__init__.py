"""Store throughput (SPP and RPP) and recovery rate:
``python -m benchmarks.store [--quick] [--json PATH]``.

Six figures (**rpp** and the transports below), each on real loopback sockets, with the store
daemon in its own process (``python -m ump store -c store.xml``, a generated XML) so that the
store and the application do not share one interpreter's core:

* **memory** and **disk** throughput: one source (in this process) sends N 64-byte messages
  to one store, ``ume_flight_size`` large enough never to block; the clock runs from the first
  send until the source has seen every message stable (``stats["stable"] == N`` and nothing
  in flight), so the figure includes the stability ACK round trip and, for the disk
  repository, the store's write-before-ACK;
* **recovery**: N messages are sent with no receiver; then a new receiver (in this process,
  ``retransmit_request_outstanding_maximum`` 4000) registers and recovers them all from a
  memory-repository store; the figure is N over the time from the receiver's start until the
  last delivery.  Recovery is a request/response pipeline, so its rate is at most the
  outstanding maximum over the round trip: with 1000 outstanding, a round trip of 10 ms (two
  processes that the scheduler takes turns on, on a shared machine) already caps it at the
  target; 4000 keeps the figure about the processes' speed.

* **memory-lbtru** and **memory-lbtrm**: the memory figure with the source on LBT-RU
  (``source transport lbt-ru``) and on LBT-RM (``source transport lbt-rm``: multicast on
  loopback, ``scripts/ensure-multicast``) instead of LBT-TCP, in the same run, so a store is
  measured on each transport it receives.  Choices: the LBT-RM source's
  ``transport_lbtrm_data_rate_limit`` is raised to :data:`LBTRM_RATE_LIMIT` (the product's
  default, 10 Mbit/s, caps 64-byte messages near 10,000 msg/s: the figure would be the
  limit's, not the store's) and its destination port is a free one, so that no other LBT-RM
  user of the machine shares its group.  The store's UDP receive buffer is the kernel's
  default: what a burst overflows, the transport repairs (NAKs), and that is in the figure.

Each figure is printed with its ratio to the issue's target (100,000 msg/s memory, 50,000 disk,
recovery 100,000 msg/s of 1,000,000 messages) and with the CPU time per message of this
process (source, or receiver for recovery) and of the store process (from ``/proc``, Linux
only).  On a shared machine the rate follows the other load; the CPU per message hardly does,
so it is the figure to compare runs by.  The benchmark reports; it never fails the process
because a target is missed.  A run that does not finish within its time limit is reported as
such, with the rate of what did finish.

Ports: store 14767, resolver 15480 by default (not the product defaults, so a running demo
does not interfere); ``--store-port`` and ``--resolver-port`` move them, so the benchmark can run
beside tests that use fixed ports.  The source takes its ports from the reference runtime's
ranges (the first free ones).  ``--only memory,disk`` measures some of the figures.

**rpp** (receiver-paced persistence, guide "RPP Normal Operations", docs/semantics.md §1.13),
measured in the same run beside the SPP **memory** figure: a memory repository whose topic
allows RPP, an RPP source (``ume_flight_size_bytes`` :data:`RPP_FLIGHT_BYTES`, the topic
allowing as much, size threshold twice and size limit four times that) and two *blocking* RPP
receivers that consume and acknowledge as fast as they can (default ACK batching).  The
receivers register before the first message (an RPP receiver registering later gets nothing
sent before it) and run in this process, beside the source, so the figure includes their work
in the client's CPU; the clock runs until every message is stable *and* both receivers have
it.  The store keeps each message until both receivers consumed it, so it holds more and
acknowledges only while a flight's room is left; the printed RPP/SPP ratio is what that costs.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from reference_impl import runtime
from reference_impl.aio import AioHost, HostError
from reference_impl.config import ClientConfig
from reference_impl.config.store_xml_writer import disk_store_xml
from reference_impl.events import Event, MessageDelivered
from reference_impl.source import SourceCore

STORE_PORT = 14767
RESOLVER_PORT = 15480
PAYLOAD_SIZE = 64
FLIGHT_SIZE = 100_000
OUTSTANDING_REQUESTS = 4000

TARGETS = {"memory": 100_000.0, "memory-lbtru": 100_000.0, "memory-lbtrm": 100_000.0,
           "disk": 50_000.0, "recovery": 100_000.0, "rpp": 100_000.0}
"""Messages per second the issue asks for, per figure (RPP and the UDP transports: the memory
figure's)."""

DEFAULT_COUNTS = {"throughput": 200_000, "recovery": 1_000_000}
QUICK_COUNTS = {"throughput": 20_000, "recovery": 50_000}
FIGURES = ("memory", "memory-lbtru", "memory-lbtrm", "disk", "recovery", "rpp")
TRANSPORTS = {"memory-lbtru": "lbt-ru", "memory-lbtrm": "lbt-rm"}
"""The source's data transport per figure (LBT-TCP for the others)."""
LBTRM_RATE_LIMIT = 1_000_000_000
"""The LBT-RM benchmark source's ``transport_lbtrm_data_rate_limit`` (bits per second; see
the module docstring)."""
RPP_FLIGHT_BYTES = FLIGHT_SIZE * PAYLOAD_SIZE
"""The RPP source's ``ume_flight_size_bytes``: as many messages as the SPP source's flight."""
RPP_RECEIVERS = 2


@dataclass(frozen=True)
class Ports:
    """Where the store listens (TCP) and the resolver daemon runs (UDP)."""

    store: int = STORE_PORT
    resolver: int = RESOLVER_PORT


class BenchError(Exception):
    """The store process could not be started; printed without a traceback."""


def store_xml(repository: str, port: int = STORE_PORT, *, rpp: bool = False) -> str:
    """The umestored configuration of one store whose ``bench.*`` topics use ``repository``
    (``rpp``: allowing receiver-paced persistence, sized for :data:`RPP_FLIGHT_BYTES`)."""
    topic: dict[str, str | int] = {} if not rpp else {
        "repository-allow-receiver-paced-persistence": 1,
        "source-flight-size-bytes-maximum": RPP_FLIGHT_BYTES,
        "repository-size-threshold": 2 * RPP_FLIGHT_BYTES,
        "repository-size-limit": 4 * RPP_FLIGHT_BYTES}
    return disk_store_xml("bench-store", port, r"bench\..*", repository=repository,
                          store_options={"retransmission-request-processing-rate": 10_000_000},
                          topic_options=topic)


@contextlib.contextmanager
def store_process(workdir: Path, repository: str, *, port: int = STORE_PORT,
                  resolver_port: int = RESOLVER_PORT, timeout: float = 20.0,
                  rpp: bool = False) -> Iterator[subprocess.Popen[bytes]]:
    """Run ``ump store`` in ``workdir`` until the block ends; wait for its ready line first."""
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "store.xml").write_text(store_xml(repository, port, rpp=rpp))
    log_path = workdir / "store.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "ump", "store", "-c", "store.xml",
             "--resolver", f"127.0.0.1:{resolver_port}"],
            cwd=workdir, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + timeout
        while b"ready to accept registrations" not in log_path.read_bytes():
            if proc.poll() is not None:
                raise BenchError(f"the store exited early: {log_path.read_text(errors='replace')}")
            if time.monotonic() > deadline:
                raise BenchError(f"the store was not ready within {timeout} s; see {log_path}")
            time.sleep(0.02)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


@dataclass(frozen=True)
class Figure:
    """One measured rate; ``completed < count`` means the run hit its time limit."""

    name: str
    count: int
    completed: int
    seconds: float
    target: float
    client_cpu: float | None = None
    """CPU seconds this process (source, or receiver for recovery) used in ``seconds``."""
    store_cpu: float | None = None
    """CPU seconds the store process used in ``seconds`` (None where /proc cannot tell)."""

    def cpu_per_message(self, which: str) -> float | None:
        """Microseconds of CPU per completed message of ``"client"`` or ``"store"``: on a
        shared machine the rate depends on the other load, this much less."""
        cpu = self.client_cpu if which == "client" else self.store_cpu
        if cpu is None or not self.completed:
            return None
        return cpu / self.completed * 1e6

    @property
    def per_second(self) -> float:
        return self.completed / self.seconds if self.seconds > 0 else 0.0

    @property
    def ratio(self) -> float:
        return self.per_second / self.target

    @property
    def finished(self) -> bool:
        return self.completed == self.count

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "per_second": self.per_second, "ratio": self.ratio,
                "finished": self.finished,
                "client_cpu_us_per_message": self.cpu_per_message("client"),
                "store_cpu_us_per_message": self.cpu_per_message("store")}


def process_cpu(pid: int) -> float | None:
    """CPU seconds (user + system) process ``pid`` has used, from ``/proc`` (Linux); None
    elsewhere or once the process is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # fields after the parenthesised command name; utime and stime are the 14th and 15th
    fields = stat.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _CpuMeter:
    """CPU used by this process and the store process between :meth:`start` and :meth:`stop`."""

    def __init__(self, store_pid: int | None) -> None:
        self.store_pid = store_pid
        self._client = 0.0
        self._store: float | None = None

    def start(self) -> None:
        self._client = time.process_time()
        self._store = process_cpu(self.store_pid) if self.store_pid is not None else None

    def stop(self) -> tuple[float, float | None]:
        client = time.process_time() - self._client
        store_now = process_cpu(self.store_pid) if self.store_pid is not None else None
        store = None if store_now is None or self._store is None else store_now - self._store
        return client, store


def _client(ports: Ports, **sections: dict[str, object]) -> ClientConfig:
    mapping: dict[str, dict[str, object]] = {
        "context": {"resolver_unicast_daemon": f"127.0.0.1:{ports.resolver}"}}
    for scope, values in sections.items():
        mapping.setdefault(scope, {}).update(values)
    return ClientConfig.from_mapping(mapping)


def _transport_options(transport: str) -> dict[str, dict[str, object]]:
    """The source's options for ``transport`` (see the module docstring for LBT-RM's)."""
    if transport == "tcp":
        return {}
    source: dict[str, object] = {"transport": transport}
    sections: dict[str, dict[str, object]] = {"source": source}
    if transport == "lbt-rm":
        source["transport_lbtrm_destination_port"] = runtime.any_free_udp_port("127.0.0.1")
        sections["context"] = {"transport_lbtrm_data_rate_limit": LBTRM_RATE_LIMIT}
    return sections


async def _registered_source(host: AioHost, topic: str, ports: Ports,
                             transport: str = "tcp") -> SourceCore:
    sections = _transport_options(transport)
    source_options = {"ume_store": [f"127.0.0.1:{ports.store}"], "ume_flight_size": FLIGHT_SIZE,
                      **sections.pop("source", {})}
    source = await runtime.start_source(host, topic, _client(ports, source=source_options,
                                                             **sections))
    try:
        await host.wait_until(lambda: source.complete, timeout=20)
    except TimeoutError:
        raise BenchError(f"{topic}: the source did not register with the store on port "
                         f"{ports.store} within 20 s") from None
    return source


def _fully_stable(source: SourceCore, count: int) -> bool:
    return source.stats["stable"] >= count and source.inflight == 0


async def _throughput(name: str, count: int, limit: float, ports: Ports = Ports(),
                      store_pid: int | None = None) -> Figure:
    meter = _CpuMeter(store_pid)
    async with AioHost() as host:
        await runtime.run_resolver(host, ("127.0.0.1", ports.resolver))
        source = await _registered_source(host, f"bench.{name}", ports,
                                          TRANSPORTS.get(name, "tcp"))
        runtime.handle_events(host, [source], lambda core, event: None)
        meter.start()
        start = time.perf_counter()
        await runtime.send_messages(host, source, count, size=PAYLOAD_SIZE, timeout=limit)
        with contextlib.suppress(TimeoutError):
            await host.wait_until(lambda: _fully_stable(source, count),
                                  timeout=max(0.1, limit - (time.perf_counter() - start)))
        seconds = time.perf_counter() - start
        client_cpu, store_cpu = meter.stop()
        completed = min(count, source.stats["stable"])
    return Figure(name, count, completed, seconds, TARGETS[name], client_cpu, store_cpu)


async def _rpp_throughput(count: int, limit: float, ports: Ports = Ports(),
                          store_pid: int | None = None) -> Figure:
    """The **rpp** figure (module docstring)."""
    meter = _CpuMeter(store_pid)
    topic = "bench.rpp"
    async with AioHost() as host:
        await runtime.run_resolver(host, ("127.0.0.1", ports.resolver))
        delivered = [0] * RPP_RECEIVERS
        receivers = []
        for i in range(RPP_RECEIVERS):
            receiver = await runtime.start_receiver(host, topic, _client(ports, receiver={
                "ume_receiver_paced_persistence": 1}))

            def tally(core: Any, event: Event, i: int = i) -> None:
                if isinstance(event, MessageDelivered):
                    delivered[i] += 1
            runtime.handle_events(host, [receiver], tally)
            receivers.append(receiver)
        source = await runtime.start_source(host, topic, _client(ports, source={
            "ume_store": [f"127.0.0.1:{ports.store}"], "ume_flight_size": FLIGHT_SIZE,
            "ume_receiver_paced_persistence": 1, "ume_flight_size_bytes": RPP_FLIGHT_BYTES}))
        runtime.handle_events(host, [source], lambda core, event: None)
        try:
            await host.wait_until(lambda: source.complete and all(r.complete for r in receivers),
                                  timeout=20)
        except TimeoutError:
            raise BenchError(f"rpp: the source and {RPP_RECEIVERS} RPP receivers did not all "
                             f"register with the store on port {ports.store} within 20 s") \
                from None
        meter.start()
        start = time.perf_counter()
        await runtime.send_messages(host, source, count, size=PAYLOAD_SIZE, timeout=limit)
        with contextlib.suppress(TimeoutError):
            await host.wait_until(lambda: _fully_stable(source, count)
                                  and min(delivered) >= count,
                                  timeout=max(0.1, limit - (time.perf_counter() - start)))
        seconds = time.perf_counter() - start
        client_cpu, store_cpu = meter.stop()
        completed = min(count, source.stats["stable"], *delivered)
    return Figure("rpp", count, completed, seconds, TARGETS["rpp"], client_cpu, store_cpu)


async def _recovery(count: int, limit: float, ports: Ports = Ports(),
                    store_pid: int | None = None) -> Figure:
    meter = _CpuMeter(store_pid)
    async with AioHost() as host:
        await runtime.run_resolver(host, ("127.0.0.1", ports.resolver))
        source = await _registered_source(host, "bench.recovery", ports)
        delivered = {"n": 0}

        def count_deliveries(core: Any, event: Event) -> None:
            if isinstance(event, MessageDelivered):
                delivered["n"] += 1
        runtime.handle_events(host, [source], lambda core, event: None)
        await runtime.send_messages(host, source, count, size=PAYLOAD_SIZE, timeout=limit)
        try:
            await host.wait_until(lambda: _fully_stable(source, count), timeout=limit)
        except TimeoutError:
            raise BenchError(f"recovery: only {source.stats['stable']:,} of {count:,} messages "
                             f"became stable within {limit} s; nothing to recover") from None
        meter.start()
        start = time.perf_counter()
        receiver = await runtime.start_receiver(host, "bench.recovery", _client(ports, receiver={
            "retransmit_request_outstanding_maximum": OUTSTANDING_REQUESTS}))
        runtime.handle_events(host, [receiver], count_deliveries)
        with contextlib.suppress(TimeoutError):
            await host.wait_until(lambda: delivered["n"] >= count, timeout=limit, poll=0.01)
        seconds = time.perf_counter() - start
        client_cpu, store_cpu = meter.stop()
    return Figure("recovery", count, min(count, delivered["n"]), seconds, TARGETS["recovery"],
                  client_cpu, store_cpu)


def run(*, quick: bool = False, throughput_count: int | None = None,
        recovery_count: int | None = None, limit: float = 300.0, ports: Ports = Ports(),
        only: tuple[str, ...] = FIGURES) -> list[Figure]:
    """Measure the figures named in ``only`` (each with a fresh store process and directory),
    printing each as it is measured."""
    unknown = sorted(set(only) - set(FIGURES))
    if unknown:
        raise BenchError(f"unknown figure(s) {', '.join(unknown)}; known: {', '.join(FIGURES)}")
    counts = QUICK_COUNTS if quick else DEFAULT_COUNTS
    n = throughput_count or counts["throughput"]
    m = recovery_count or counts["recovery"]
    figures = []
    with tempfile.TemporaryDirectory(prefix="ump-bench-store-") as tmp:
        for name in FIGURES:
            if name not in only:
                continue
            repository = "disk" if name == "disk" else "memory"  # memory-lbtru/-lbtrm too
            with store_process(Path(tmp) / name, repository, port=ports.store,
                               resolver_port=ports.resolver, rpp=name == "rpp") as proc:
                measure = _recovery(m, limit, ports, proc.pid) if name == "recovery" else \
                    _rpp_throughput(n, limit, ports, proc.pid) if name == "rpp" else \
                    _throughput(name, n, limit, ports, proc.pid)
                try:
                    figures.append(asyncio.run(measure))
                except HostError as exc:  # the resolver port is taken, typically
                    raise BenchError(str(exc)) from None
            print(_line(figures[-1]), flush=True)
    by_name = {f.name: f for f in figures}
    if "rpp" in by_name and "memory" in by_name and by_name["memory"].per_second:
        spp, rpp = by_name["memory"], by_name["rpp"]
        print(f"{'RPP / SPP, memory repository':<38} {rpp.per_second:,.0f} / "
              f"{spp.per_second:,.0f} msg/s = ratio {rpp.per_second / spp.per_second:.2f} "
              f"(RPP: {RPP_RECEIVERS} blocking receivers in the client process)", flush=True)
    return figures


def _line(fig: Figure) -> str:
    label = {"memory": "source -> store, memory repository",
             "memory-lbtru": "  same, source on LBT-RU",
             "memory-lbtrm": "  same, source on LBT-RM",
             "disk": "source -> store, disk repository",
             "recovery": "receiver recovery from the store",
             "rpp": f"RPP source -> store, {RPP_RECEIVERS} blocking rcvs"}[fig.name]
    done = "" if fig.finished else f"  (time limit: {fig.completed:,}/{fig.count:,} done)"
    client, store = fig.cpu_per_message("client"), fig.cpu_per_message("store")
    cpu = "" if client is None else \
        f"  cpu/msg {'source' if fig.name != 'recovery' else 'receiver'} {client:.1f} us" + \
        ("" if store is None else f", store {store:.1f} us")
    return (f"{label:<38} {fig.count:>9,} msgs {fig.seconds:8.2f} s "
            f"{fig.per_second:>11,.0f} msg/s  target {fig.target:>9,.0f}  "
            f"ratio {fig.ratio:5.2f}{cpu}{done}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.store",
                                     description="Store throughput (SPP and RPP) and recovery "
                                                 "rate.")
    parser.add_argument("--quick", action="store_true",
                        help="20,000 messages for throughput, 50,000 for recovery")
    parser.add_argument("--json", metavar="PATH", help="also write the figures as JSON here")
    parser.add_argument("--count", type=int, help="messages for the throughput runs")
    parser.add_argument("--recovery-count", type=int, help="messages for the recovery run")
    parser.add_argument("--limit", type=float, default=300.0,
                        help="seconds each run may take before it is cut short (default 300)")
    parser.add_argument("--store-port", type=int, default=STORE_PORT,
                        help=f"TCP port of the store process (default {STORE_PORT})")
    parser.add_argument("--resolver-port", type=int, default=RESOLVER_PORT,
                        help=f"UDP port of the resolver daemon (default {RESOLVER_PORT})")
    parser.add_argument("--only", metavar="NAMES", default=",".join(FIGURES),
                        help=f"comma-separated figures to measure (default {','.join(FIGURES)})")
    args = parser.parse_args(argv)
    for name in ("count", "recovery_count"):
        value = getattr(args, name)
        if value is not None and value <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive")
    if args.limit <= 0:
        parser.error("--limit must be positive")
    for name in ("store_port", "resolver_port"):
        if not 1 <= getattr(args, name) <= 65535:
            parser.error(f"--{name.replace('_', '-')} must be a port number (1-65535)")
    only = tuple(dict.fromkeys(x.strip() for x in args.only.split(",") if x.strip()))
    unknown = sorted(set(only) - set(FIGURES))
    if not only or unknown:
        parser.error(f"--only takes figure names among {', '.join(FIGURES)}"
                     + (f"; not {', '.join(unknown)}" if unknown else ""))
    ports = Ports(args.store_port, args.resolver_port)
    print(f"benchmarks.store: {PAYLOAD_SIZE}-byte payloads, store process on port {ports.store}, "
          f"resolver on {ports.resolver}, {os.cpu_count()} CPUs", flush=True)
    try:
        figures = run(quick=args.quick, throughput_count=args.count,
                      recovery_count=args.recovery_count, limit=args.limit, ports=ports,
                      only=only)
    except BenchError as exc:
        print(f"benchmarks.store: {exc}", file=sys.stderr)
        return 2
    if args.json:
        record = {
            "benchmark": "benchmarks.store",
            "settings": {"quick": args.quick, "payload_size": PAYLOAD_SIZE,
                         "store_port": ports.store, "resolver_port": ports.resolver,
                         "flight_size": FLIGHT_SIZE, "limit": args.limit,
                         "outstanding_requests": OUTSTANDING_REQUESTS},
            "meta": {"python": platform.python_version(), "platform": platform.platform(),
                     "cpus": os.cpu_count(),
                     "when": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")},
            "figures": [f.to_json() for f in figures],
        }
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    return 0


__all__ = ["FIGURES", "Figure", "Ports", "main", "run", "store_process", "store_xml"]
