"""Loopback capture: a real UDP + TCP exchange through AioHost, recorded and read back.

Each installed backend records the same exchange; the file is read with the project's own
pcap reader, and the payloads, the TCP handshake and FIN, and the absence of the capture's own
probe frames are checked.  A burst right before stopping must be recorded whole (the stop
sentinel's job).  Capturing needs privileges: as non-root, a permission refusal skips.
"""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest

import reference_impl.capture as capture_mod
from reference_impl.aio import AioHost
from reference_impl.capture import CaptureError, LoopbackCapture, available_backends
from reference_impl.sim import CallbackEndpoint, StreamEventKind
from tests.reference_impl.test_aio import LO, EchoCore
from wire.pcap import TCP_FIN, TCP_SYN, Segment, decode_frame, read_capture

BURST = 500


def start_or_skip(cap: LoopbackCapture) -> None:
    try:
        cap.start()
    except CaptureError as exc:
        said = str(exc).lower()
        if os.geteuid() != 0 and ("permission" in said or "not permitted" in said):
            pytest.skip(f"capturing needs privileges here: {exc}")
        raise


async def exchange(path: Path, backend: str) -> tuple[LoopbackCapture, bytes, list[bytes]]:
    """Echo a stream and datagrams through AioHost under capture; returns what was sent."""
    async with AioHost() as host:
        echo = EchoCore()
        udp = await host.bind_udp(echo, (LO, 0))
        tcp = await host.listen_tcp(echo, (LO, 0))
        client = CallbackEndpoint()
        await host.bind_udp(client, (LO, 0), name="client")
        cap = LoopbackCapture(path, ports=[udp[1], tcp[1]], backend=backend)  # type: ignore[arg-type]
        await asyncio.to_thread(start_or_skip, cap)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as other:
            other.sendto(b"not captured", (LO, free_udp_port()))
        client.connect((LO, 0), tcp)
        datagrams = [b"dgram %d" % i for i in range(3)]
        for d in datagrams:
            client.send(d, udp)
        host.flush(client)
        await host.wait_until(lambda: bool(client.events), 5)
        conn = client.events[0][1].conn
        stream = b"".join(b"line %d\n" % i for i in range(2000))
        for i in range(0, len(stream), 1000):
            client.write(conn, stream[i:i + 1000])
        host.flush(client)
        await host.wait_until(lambda: client.stream_bytes(conn) == stream.upper(), 10)
        client.close(conn)
        host.flush(client)
        await host.wait_until(
            lambda: any(e.kind is StreamEventKind.CLOSED for _, e in echo.events), 5)
        burst = [b"burst %d" % i for i in range(BURST)]
        for d in burst:
            client.send(d, udp)
        host.flush(client)
        await host.wait_until(lambda: len(client.received) == 3 + BURST, 10)
    await asyncio.to_thread(cap.stop)
    return cap, stream, datagrams + burst


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((LO, 0))
        return int(s.getsockname()[1])


def tcp_bytes(segments: list[Segment], dport: int) -> bytes:
    """One direction of the stream, reassembled by sequence number (retransmits dropped)."""
    by_seq = {s.seq: s.payload for s in segments if s.proto == "tcp" and s.dport == dport
              and s.payload}
    return b"".join(by_seq[k] for k in sorted(by_seq))


@pytest.mark.parametrize("backend", ["tcpdump", "dumpcap", "scapy"])
def test_capture_records_a_real_exchange_completely(backend: str, tmp_path: Path) -> None:
    if backend not in available_backends():
        pytest.skip(f"{backend} is not installed")
    path = tmp_path / f"{backend}.pcap"
    cap, stream, datagrams = asyncio.run(asyncio.wait_for(exchange(path, backend), 60))
    assert cap.backend == backend
    records = list(read_capture(path))
    assert len(records) == cap.frames
    segments = [decode_frame(r.linktype, r.data) for r in records]
    assert not any(b"ump-capture" in s.payload for s in segments)  # probes stripped
    assert not any(s.payload == b"not captured" for s in segments)  # the filter held
    tcp_port = next(s.dport for s in segments if s.proto == "tcp" and s.flags & TCP_SYN)
    udp_out = [s.payload for s in segments if s.proto == "udp" and s.payload in datagrams]
    udp_back = {s.payload for s in segments if s.proto == "udp" and s.payload.isupper()}
    assert udp_out == datagrams  # every one, the burst before stop() included, in order
    assert udp_back == {d.upper() for d in datagrams}
    assert tcp_bytes(segments, tcp_port) == stream
    assert tcp_bytes(segments, next(s.sport for s in segments if s.dport == tcp_port)) \
        == stream.upper()
    fins = [s for s in segments if s.proto == "tcp" and s.flags & TCP_FIN]
    assert {s.dport == tcp_port for s in fins} == {True, False}  # both sides closed
    assert not path.with_name(path.name + ".partial").exists()
    if cap.dropped is not None:
        assert cap.dropped == 0


def test_capture_of_everything_without_ports(tmp_path: Path) -> None:
    if not available_backends():
        pytest.skip("no capture backend installed")
    path = tmp_path / "all.pcap"
    port = free_udp_port()
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as rx:
        rx.bind((LO, port))
        cap = LoopbackCapture(path)
        start_or_skip(cap)
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            tx.sendto(b"anything goes", (LO, port))
        cap.stop()
    payloads = [decode_frame(r.linktype, r.data).payload for r in read_capture(path)
                if r.data.endswith(b"anything goes")]
    assert payloads == [b"anything goes"]


@pytest.mark.parametrize("backend", ["auto", "tcpdump", "dumpcap", "scapy"])
def test_a_device_that_does_not_exist_is_a_clear_error(backend: str, tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="no network interface 'nosuch0'"):
        LoopbackCapture(tmp_path / "x.pcap", iface="nosuch0",
                        backend=backend).start()  # type: ignore[arg-type]
    assert not list(tmp_path.iterdir())  # nothing left behind


def test_a_tool_that_refuses_to_capture_is_reported_with_its_own_words(tmp_path: Path) -> None:
    if "tcpdump" not in available_backends():
        pytest.skip("tcpdump is not installed")
    cap = LoopbackCapture(tmp_path / "x.pcap", ports=[15380], backend="tcpdump")
    cap.bpf_filter = lambda sentinel_port=None: "this is not bpf"  # type: ignore[method-assign]
    with pytest.raises(CaptureError, match=r"tcpdump: tcpdump exited: .*syntax error"):
        cap.start()
    assert not list(tmp_path.iterdir())


def test_no_backend_and_bad_arguments_are_clear_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(capture_mod, "available_backends", lambda: [])
    with pytest.raises(CaptureError, match="install tcpdump"):
        LoopbackCapture(tmp_path / "x.pcap").start()
    monkeypatch.setattr(capture_mod.shutil, "which", lambda name: None)
    with pytest.raises(CaptureError, match="tcpdump is not installed"):
        LoopbackCapture(tmp_path / "x.pcap", backend="tcpdump").start()
    with pytest.raises(ValueError, match=r"1\.\.65535"):
        LoopbackCapture(tmp_path / "x.pcap", ports=[0])
    with pytest.raises(ValueError, match="unknown capture backend"):
        LoopbackCapture(tmp_path / "x.pcap", backend="wireshark")  # type: ignore[arg-type]
    with pytest.raises(CaptureError, match="no directory"):
        LoopbackCapture(tmp_path / "missing" / "x.pcap").start()
    with pytest.raises(CaptureError, match="not started"):
        LoopbackCapture(tmp_path / "x.pcap").stop()


def test_bpf_filter_names_every_port_and_the_sentinel(tmp_path: Path) -> None:
    cap = LoopbackCapture(tmp_path / "x.pcap", ports=[15380, 14400])
    assert cap.bpf_filter(40000) == "(port 15380 or port 14400) or udp port 40000"
    assert LoopbackCapture(tmp_path / "x.pcap").bpf_filter(40000) == ""
