"""A loopback capture of a persistent deployment over LBT-RM, checked with tshark (issue 20).

The resolver, the store and the receiver are ``ump`` processes; the source is the same
runtime (:func:`reference_impl.runtime.start_source`) in this process, so that the first
copies of a few of its DATA datagrams can be held back on their way out, which loopback never
loses by itself: the store and the receiver, both on the group's destination port, NAK them
to the unicast port in the header and the source retransmits to the group.  The source uses
a free unicast port and destination port (``transport_lbtrm_source_port``,
``transport_lbtrm_destination_port``) so that no other run on the machine shares its group;
the port map tells tshark about them.

What the wire must show: every frame is UM or not UM in our dissector, tshark shows every
field as we read it and raises no error and no LBM/UME warning; data, session messages and
retransmissions leave the source's own port (the one in every header) for the group; NAKs go
to that unicast port; the receiver gets every message once and in order.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from reference_impl import runtime
from reference_impl.aio import AioHost, HostError
from reference_impl.capture import LoopbackCapture
from reference_impl.config import parse_client_config
from reference_impl.context import ContextCore
from reference_impl.source import SourceCore
from tests.reference_impl.loopback import IP, free_port, loopback
from tests.reference_impl.oracle_capture import assert_tshark_agrees, start_capture
from wire import lbtrm
from wire.tshark import PortMap, run

TOPIC = "capture.lbtrm"
GROUP = "224.10.10.13"
MESSAGES = 80
LOST_FIRST_COPIES = {12, 13, 30, 55}  # transport sequence numbers (SRIs take some too)


def _lossy(core: SourceCore, ucast: int, lost: set[int]) -> None:
    """Hold back the first copy of the DATA datagrams ``lost`` names, on their way out."""
    inner: Callable[[float], list[tuple[int, bytes, tuple[str, int]]]] = core.datagrams_from
    held: set[int] = set()

    def datagrams_from(now: float) -> list[tuple[int, bytes, tuple[str, int]]]:
        out = []
        for port, data, dst in inner(now):
            packet = lbtrm.parse_packet(data, decode_lbmc=False) if port == ucast else None
            if isinstance(packet, lbtrm.LbtrmData) and not packet.rx \
                    and packet.sqn in lost and packet.sqn not in held:
                held.add(packet.sqn)
                continue
            out.append((port, data, dst))
        return out

    core.datagrams_from = datagrams_from  # type: ignore[method-assign]


async def _source(config_text: str, ucast: int, ready: Callable[[], bool]) -> SourceCore:
    """Run the source until everything is stable; it sends once ``ready()`` (the receiver
    registered, so every message reaches it over LBT-RM rather than from the store)."""
    client = parse_client_config(config_text, "source.cfg")
    async with AioHost() as host:
        source = await runtime.start_source(host, TOPIC, client)
        _lossy(source, ucast, LOST_FIRST_COPIES)
        runtime.handle_events(host, [source], lambda core, event: None)
        await host.wait_until(lambda: source.complete and ready(), timeout=30, poll=0.05)
        sent = await runtime.send_messages(host, source, MESSAGES, rate=200)
        assert sent == MESSAGES
        await host.wait_until(lambda: source.inflight == 0, timeout=20)
        await asyncio.sleep(1.0)  # session messages after the last DATA
    return source


def _deliveries(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [json.loads(line)["sqn"] for line in path.read_text().splitlines() if line]


@pytest.mark.oracle
def test_an_lbtrm_deployment_of_ump_processes_dissects_cleanly_port_to_port(
        tmp_path: Path) -> None:
    ucast, dport = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM)
    src_request, rcv_request = free_port(), free_port()
    with loopback(tmp_path, pattern="capture\\..*") as lb:
        pcap = tmp_path / "lbtrm.pcap"
        cap = LoopbackCapture(pcap, ports=[lb.resolver_port, lb.store_port, ucast, dport,
                                           src_request, rcv_request])
        start_capture(cap)
        receiver = None
        try:
            rcv_cfg = lb.client_config(
                "receiver.cfg", f"context request_tcp_port_low {rcv_request}",
                f"context request_tcp_port_high {rcv_request}")
            out = tmp_path / "deliveries.jsonl"
            receiver = lb.start("receiver", "-v", "-c", str(rcv_cfg), "--topic", TOPIC,
                                "--out", str(out))
            source_cfg = "\n".join([
                f"context resolver_unicast_daemon {IP}:{lb.resolver_port}",
                f"context request_tcp_port_low {src_request}",
                f"context request_tcp_port_high {src_request}",
                f"source ume_store {IP}:{lb.store_port}",
                "source transport lbt-rm",
                f"source transport_lbtrm_multicast_address {GROUP}",
                f"source transport_lbtrm_source_port {ucast}",
                f"source transport_lbtrm_destination_port {dport}"]) + "\n"
            rcv = receiver
            source = asyncio.run(_source(source_cfg, ucast,
                                         lambda: "registration complete" in rcv.stderr))
            deadline = time.monotonic() + 20
            while len(_deliveries(out)) < MESSAGES and time.monotonic() < deadline:
                time.sleep(0.1)
        finally:
            if receiver is not None:
                receiver.stop()
            cap.stop()
        assert _deliveries(out) == list(range(MESSAGES)), receiver.stderr
    rm = source.lbtrm_session
    assert rm is not None and rm.stats["retransmissions"] >= len(LOST_FIRST_COPIES)

    portmap = PortMap(store_ports=[lb.store_port], lbmr_ports=[lb.resolver_port],
                      lbtrm_dport=(dport, dport), lbtrm_sport=(ucast, ucast),
                      lbttcp_request=(min(src_request, rcv_request),
                                      max(src_request, rcv_request)))
    reports = assert_tshark_agrees(pcap, portmap)
    assert {r.transport for r in reports if r.status == "um"} >= {"lbtrm", "lbmr"}
    # tshark's own view of the LBT-RM frames: who sent what to where
    rows = [line.split("\t") for line in run([
        "-r", str(pcap), *portmap.tshark_args(), "-Y", "lbtrm", "-T", "fields",
        "-E", "separator=/t", "-e", "lbtrm.hdr.type", "-e", "ip.src", "-e", "udp.srcport",
        "-e", "ip.dst", "-e", "udp.dstport", "-e", "lbtrm.hdr.ucast_port",
        "-e", "lbtrm.hdr.session_id", "-e", "lbtrm.data.flags_fec_type.rx"]).splitlines()]
    kinds: dict[str, list[list[str]]] = {}
    for row in rows:
        kinds.setdefault(row[0], []).append(row)
        assert int(row[5]) == ucast and int(row[6], 0) == rm.session_id, row
    data, sm, nak = kinds.get("0x00", []), kinds.get("0x02", []), kinds.get("0x03", [])
    assert data and sm and nak, sorted(kinds)
    for row in data + sm + kinds.get("0x04", []):  # DATA, RX, SM, NCF: source port to group
        assert (row[1], int(row[2]), row[3], int(row[4])) == (IP, ucast, GROUP, dport), row
    for row in nak:  # NAKs: to the unicast port named in the header, from the group's port
        assert (row[3], int(row[4])) == (IP, ucast) and int(row[2]) == dport, row
    retransmitted = [row for row in data if row[7] in ("1", "True")]
    assert len(retransmitted) >= len(LOST_FIRST_COPIES)


def test_a_source_that_cannot_send_multicast_says_so_in_one_line(
        monkeypatch: pytest.MonkeyPatch) -> None:
    port = free_port(socket.SOCK_DGRAM)
    client = parse_client_config(f"source transport lbt-rm\n"
                                 f"source transport_lbtrm_source_port {port}\n")

    def refuse(*args: object, **kwargs: object) -> None:
        raise HostError("cannot join 224.10.10.10 on 127.0.0.1: No such device")

    async def start() -> None:
        async with AioHost() as host:
            monkeypatch.setattr(host, "join_multicast", refuse)
            await runtime.start_source(host, TOPIC, client)

    with pytest.raises(runtime.RuntimeError_, match=r"cannot send LBT-RM to 224\.10\.10\.1.* "
                                                    r"scripts/ensure-multicast"):
        asyncio.run(start())


def test_a_group_a_receiver_cannot_bind_is_logged_not_fatal(
        caplog: pytest.LogCaptureFixture) -> None:
    async def join() -> bool:
        async with AioHost() as host:
            core = ContextCore("c", IP)
            await host.bind_udp(core, (IP, 0))
            join = runtime.group_joiner(host, core, IP)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as taken:
                taken.bind(("0.0.0.0", 0))  # without SO_REUSEADDR: nobody can share it
                join((GROUP, taken.getsockname()[1]))
            return host.closed

    with caplog.at_level("ERROR", logger="ump"):
        assert asyncio.run(join()) is False  # the host (and the process) goes on
    assert any("cannot receive LBT-RM group 224.10.10.13" in r.message for r in caplog.records)
