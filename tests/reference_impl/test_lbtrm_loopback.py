"""LBT-RM on real sockets: multicast on loopback, captured and checked with tshark (issue 20).

The source session is bound at its unicast port on 127.0.0.1 and sends to a group in the
LBT-RM range on a free destination port, with multicast interface 127.0.0.1 and loop on
(:meth:`~reference_impl.aio.AioHost.join_multicast`; ``scripts/ensure-multicast`` makes the
machine route it, if it needs to).  Three receiver ports share the destination port
(``SO_REUSEADDR``) and join the group on 127.0.0.1.  The first copies of a few DATA datagrams
never reach the socket (loopback loses nothing by itself), so the receivers NAK and the source
retransmits to the group.  What the wire must show: every frame dissects as LBT-RM in tshark and
in our dissector with equal fields, nothing malformed and no error; the data and the
retransmissions leave from the source's own port, the one in their header; the NAKs go to that
unicast port.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from pathlib import Path

import pytest

from reference_impl.aio import AioHost
from reference_impl.capture import LoopbackCapture
from reference_impl.lbtrm_session import (
    MULTICAST_RANGE,
    Delivered,
    Event,
    LbtrmReceiverPort,
    LbtrmSourceSession,
    LbtrmSourceSettings,
    SessionKey,
)
from tests.reference_impl.lbtrm_net import Filtered, first_copies_of, payload
from tests.reference_impl.loopback import IP, free_port
from tests.reference_impl.oracle_capture import assert_tshark_agrees, start_capture
from wire.tshark import PortMap, run

GROUP_IP = MULTICAST_RANGE[0]
SESSION_ID = 0x10BAC
MESSAGES = 60
LOST_FIRST_COPIES = {5, 17, 18, 40}
RECEIVERS = 3


def _note(into: list[int], item: tuple[SessionKey, Event]) -> None:
    if isinstance(item[1], Delivered):
        into.append(item[1].sqn)


def _send(source: LbtrmSourceSession, n: int, now: float) -> int:
    return source.send(payload(n), now)


async def _run(ucast: int, dport: int) -> tuple[list[list[int]], LbtrmSourceSession]:
    delivered: list[list[int]] = [[] for _ in range(RECEIVERS)]
    async with AioHost() as host:
        source = LbtrmSourceSession((GROUP_IP, dport), ucast,
                                    LbtrmSourceSettings(session_id=SESSION_ID), now=host.now())
        lossy = Filtered(source, first_copies_of(LOST_FIRST_COPIES))
        await host.bind_udp(lossy, (IP, ucast), name="lbtrm-source")
        host.join_multicast(lossy, GROUP_IP, interface=IP)  # sends to the group over lo
        ports = []
        for i in range(RECEIVERS):
            port = LbtrmReceiverPort(seed=i, now=host.now())
            port.open(IP, ucast, SESSION_ID, host.now())
            await host.bind_udp(port, ("0.0.0.0", dport), name=f"lbtrm-receiver-{i}",
                                reuse_address=True)
            host.join_multicast(port, GROUP_IP, interface=IP)
            host.on_events(port, functools.partial(_note, delivered[i]))
            ports.append(port)
        sessions = [next(iter(p.sessions.values())) for p in ports]
        # the first session message (200 ms) tells each receiver where to start
        await host.wait_until(lambda: all(s.next_sqn == 0 for s in sessions), timeout=5)
        for n in range(MESSAGES):
            host.call(lossy, functools.partial(_send, source, n))
            await asyncio.sleep(0.002)
        await host.wait_until(lambda: all(len(d) == MESSAGES for d in delivered), timeout=10)
        await asyncio.sleep(0.3)  # a session message after the last DATA
    return delivered, source


@pytest.mark.oracle
def test_lbtrm_multicast_on_loopback_dissects_cleanly_and_goes_port_to_port(
        tmp_path: Path) -> None:
    ucast, dport = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM)
    pcap = tmp_path / "lbtrm-loopback.pcap"
    cap = LoopbackCapture(pcap, ports=[ucast, dport])
    start_capture(cap)
    try:
        delivered, source = asyncio.run(_run(ucast, dport))
    finally:
        cap.stop()
    assert delivered == [list(range(MESSAGES))] * RECEIVERS, \
        "no multicast on loopback? run scripts/ensure-multicast"
    assert source.stats["retransmissions"] >= len(LOST_FIRST_COPIES)

    portmap = PortMap(lbtrm_dport=(dport, dport), lbtrm_sport=(ucast, ucast))
    reports = assert_tshark_agrees(pcap, portmap)
    assert reports and all(r.status == "um" and r.transport == "lbtrm" for r in reports)
    # tshark's own view: every frame is LBT-RM, and the ports are where they belong
    rows = [line.split("\t") for line in run([
        "-r", str(pcap), *portmap.tshark_args(), "-T", "fields", "-E", "separator=/t",
        "-e", "lbtrm.hdr.type", "-e", "ip.src", "-e", "udp.srcport", "-e", "ip.dst",
        "-e", "udp.dstport", "-e", "lbtrm.hdr.ucast_port", "-e", "lbtrm.hdr.session_id",
        "-e", "lbtrm.data.flags_fec_type.rx"]).splitlines()]
    assert len(rows) == len(reports) and all(row[0] for row in rows), rows
    kinds: dict[str, list[list[str]]] = {}
    for row in rows:
        kinds.setdefault(row[0], []).append(row)
        assert int(row[5]) == ucast and int(row[6], 0) == SESSION_ID
    data, sm, nak = kinds.get("0x00", []), kinds.get("0x02", []), kinds.get("0x03", [])
    assert data and sm and nak, sorted(kinds)
    for row in data + sm + kinds.get("0x04", []):  # DATA, RX, SM, NCF: source port to group
        assert (row[1], int(row[2]), row[3], int(row[4])) == (IP, ucast, GROUP_IP, dport)
    for row in nak:  # NAKs: to the unicast port named in the header
        assert (row[3], int(row[4])) == (IP, ucast)
    retransmitted = [row for row in data if row[7] in ("1", "True")]
    assert len(retransmitted) >= len(LOST_FIRST_COPIES)
    assert len(data) - len(retransmitted) == MESSAGES - len(LOST_FIRST_COPIES)
