"""The source on real sockets: ``runtime.send_messages`` batches, paces and gives up as documented,
and ``benchmarks.store`` runs on the ports it is given."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import pytest

import benchmarks.store as bench
from reference_impl import runtime
from reference_impl.aio import AioHost
from reference_impl.source import SourceConfig, SourceCore, StoreSpec
from tests.reference_impl.loopback import free_port
from wire.lbmc import LbmcMessage, parse_message

IP = "127.0.0.1"


async def _source(host: AioHost, config: SourceConfig) -> SourceCore:
    transport, request = free_port(), free_port()
    source = SourceCore("runtime.t", config, ip=IP, transport_port=transport,
                        request_port=request, resolver=None, now=host.now())
    await host.bind_udp(source, (IP, 0))
    await host.listen_tcp(source, (IP, transport))
    await host.listen_tcp(source, (IP, request))
    return source


async def _send_and_read(count: int, rate: float) -> tuple[list[LbmcMessage], int, float, int]:
    """A receiver-less source (no stores: never blocks) sends to one raw TCP reader; returns
    the messages read, the host's stream writes, the seconds sending took, the progress sum."""
    async with AioHost() as host:
        source = await _source(host, SourceConfig())
        reader, writer = await asyncio.open_connection(*source.transport_addr)
        await host.wait_until(lambda: bool(source._transport_conns), timeout=5)
        done = {"n": 0}

        def progress(n: int) -> None:
            done["n"] += n
        started = time.monotonic()
        sent = await runtime.send_messages(host, source, count, rate=rate, size=40, start=7,
                                           progress=progress)
        took = time.monotonic() - started
        assert sent == count
        data = b""
        expected = count * (12 + 40)
        while len(data) < expected:
            data += await asyncio.wait_for(reader.read(1 << 16), 5)
        writer.close()
        messages, pos = [], 0
        while pos < len(data):
            message, used = parse_message(data, pos)
            messages.append(message)
            pos += used
        return messages, host.stats["stream_writes"], took, done["n"]


def test_send_messages_batches_writes_and_keeps_order_and_payloads() -> None:
    count = 5000
    messages, writes, _, progressed = asyncio.run(_send_and_read(count, 0.0))
    assert [m.sqn for m in messages] == list(range(count))
    assert [m.payload for m in messages] == [f"{7 + i}:".encode().ljust(40, b".")
                                             for i in range(count)]
    assert progressed == count
    # one stream write per batch, not per message (plus the odd write of the start-up)
    assert writes <= count // runtime.SEND_BATCH + 5


def test_send_messages_with_a_rate_spreads_the_messages_over_time() -> None:
    count, rate = 300, 3000.0
    messages, _, took, progressed = asyncio.run(_send_and_read(count, rate))
    assert [m.sqn for m in messages] == list(range(count))
    assert progressed == count
    assert took >= (count - 1) / rate * 0.9


def test_send_messages_gives_up_after_the_timeout_when_the_source_never_registers() -> None:
    async def run() -> tuple[int, float]:
        async with AioHost() as host:
            # a store nobody runs: registration never completes, every send is refused
            source = await _source(host, SourceConfig(ume_store=(StoreSpec(IP, free_port()),)))
            started = time.monotonic()
            sent = await runtime.send_messages(host, source, 10, timeout=0.3)
            return sent, time.monotonic() - started
    sent, took = asyncio.run(run())
    assert sent == 0
    assert 0.3 <= took < 5


def test_benchmark_runs_on_the_ports_it_is_given_and_reports_cpu(tmp_path: Path) -> None:
    out = tmp_path / "figures.json"
    store_port, resolver_port = free_port(), free_port(socket.SOCK_DGRAM)
    code = bench.main(["--only", "memory", "--count", "2000", "--limit", "60",
                       "--store-port", str(store_port), "--resolver-port", str(resolver_port),
                       "--json", str(out)])
    assert code == 0
    record = json.loads(out.read_text())
    assert record["settings"]["store_port"] == store_port
    assert record["settings"]["resolver_port"] == resolver_port
    (figure,) = record["figures"]
    assert figure["name"] == "memory" and figure["completed"] == figure["count"] == 2000
    assert figure["per_second"] > 0
    assert figure["client_cpu_us_per_message"] > 0


@pytest.mark.parametrize("args, complaint", [
    (["--only", "memory,bogus"], "not bogus"),
    (["--only", ","], "--only takes figure names"),
    (["--store-port", "0"], "--store-port must be a port number"),
    (["--resolver-port", "65536"], "--resolver-port must be a port number"),
    (["--count", "0"], "--count must be positive"),
    (["--limit", "-1"], "--limit must be positive"),
])
def test_benchmark_refuses_bad_arguments_in_one_line(
        args: list[str], complaint: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        bench.main(args)
    assert exited.value.code == 2
    assert complaint in capsys.readouterr().err


def test_benchmark_reports_a_taken_store_port_without_a_traceback(
        capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as taken:
        taken.bind((IP, 0))
        taken.listen()
        port = taken.getsockname()[1]
        code = bench.main(["--only", "memory", "--count", "10", "--store-port", str(port),
                           "--resolver-port", str(free_port(socket.SOCK_DGRAM))])
    assert code == 2
    err = capsys.readouterr().err
    assert "the store exited early" in err and "Traceback" not in err
