"""Stability NACKs on loopback, captured and checked with tshark.

A real resolver and a real memory store (``ump`` processes) and the reference source on real
sockets in this process, over LBT-RU with a 64-message transmission window.  The only thing the
test changes is the network: the first transmission of some of the source's LBT-RU DATA
datagrams is dropped before it reaches the socket (loopback itself never loses anything).  By
the time the store's NAK for one arrives, the source's window has moved on, so the source
answers "do not retry", the store's session gives the message up and the store declares it
lost (docs/semantics.md §1.8).  The source's proactive retransmission of it is then answered
with a stability NACK (the ACK with the NAK bit, ``wire.lbmc.ACK_NAK``, docs/wire-lbmc.md
§2.1), and the source lets it go (``MessageNacked``).  Every frame is read by our dissector and
by tshark: no field may differ, no frame may be malformed, no LBM expert item, and tshark must
show the NACKs with the flag value we meant.
"""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from reference_impl import runtime
from reference_impl.aio import AioHost
from reference_impl.capture import LoopbackCapture
from reference_impl.config.store_xml_writer import disk_store_xml
from reference_impl.events import MessageNacked, MessageStable
from reference_impl.run_frames import keep_run_frames
from reference_impl.source import SourceCore
from tests.reference_impl.loopback import IP, Proc, free_port, run_ports
from tests.reference_impl.oracle_capture import assert_tshark_agrees, start_capture
from wire import lbtru
from wire.lbmc import ACK_NAK
from wire.tshark import PortMap, read_frames

TOPIC = "nack.loopback"
MESSAGES = 300
BURST = 100
"""Messages sent in one call into the core: more than the 64-message window."""
DROP_EVERY = 7
"""Every 7th DATA datagram of the burst loses its first transmission (about 40 of 300)."""


def _drop_first_copies(core: SourceCore, lbtru_port: int, dropped: set[int]) -> None:
    """Wrap the core's LBT-RU output so the first transmission of every ``DROP_EVERY``-th DATA
    sequence number (after the first ten) never reaches the socket; retransmissions pass."""
    original = core.datagrams_from
    seen: set[int] = set()

    def lossy(now: float) -> list[tuple[int, bytes, Any]]:
        kept = []
        for port, data, dst in original(now):
            if port == lbtru_port:
                packet = lbtru.parse_packet(data, decode_lbmc=False)
                if isinstance(packet, lbtru.LbtruData) and not packet.rx \
                        and packet.sqn not in seen:
                    seen.add(packet.sqn)
                    if packet.sqn > 10 and packet.sqn % DROP_EVERY == 0:
                        dropped.add(packet.sqn)
                        continue
            kept.append((port, data, dst))
        return kept
    core.datagrams_from = lossy  # type: ignore[method-assign]


async def _run_source(tmp_path: Path, resolver_port: int, store_port: int,
                      lbtru_port: int) -> tuple[SourceCore, list[Any], set[int]]:
    (tmp_path / "source.cfg").write_text(
        f"context resolver_unicast_daemon {IP}:{resolver_port}\n"
        f"source ume_store {IP}:{store_port}\n"
        "source transport lbt-ru\n"
        f"source transport_lbtru_port {lbtru_port}\n"
        "source transport_lbtru_transmission_window_size 64\n"
        "source ume_message_stability_timeout 500\n"
        "source ume_store_check_interval 100\n")
    client = runtime.load_client(str(tmp_path / "source.cfg"), "current")
    events: list[Any] = []
    dropped: set[int] = set()
    async with AioHost() as host:
        source = await runtime.start_source(host, TOPIC, client, ip=IP)
        _drop_first_copies(source, lbtru_port, dropped)
        host.on_events(source, events.append)
        await host.wait_until(lambda: source.complete, timeout=20)
        for _ in range(MESSAGES // BURST):  # a burst outruns the window before a NAK comes
            host.call(source, lambda now: [source.send(b"n%04d" % source.next_sqn)
                                           for _ in range(BURST)])
            await asyncio.sleep(0.01)
        await host.wait_until(lambda: source.inflight == 0, timeout=30)
        await asyncio.sleep(1.5)  # nothing more may be resent or NACKed
    return source, events, dropped


@pytest.mark.oracle
def test_captured_nacks_agree_with_tshark_and_the_source_lets_the_messages_go(
        tmp_path: Path) -> None:
    store_port, resolver_port = free_port(), free_port(socket.SOCK_DGRAM)
    lbtru_port = free_port(socket.SOCK_DGRAM)
    (tmp_path / "store.xml").write_text(disk_store_xml("nack-store", store_port, r"nack\..*",
                                                       repository="memory"))
    pcap = tmp_path / "nack.pcap"
    cap = LoopbackCapture(pcap, ports=[store_port, resolver_port, lbtru_port])
    start_capture(cap)
    procs: list[Proc] = []
    always: set[int] = {store_port, resolver_port, lbtru_port}
    try:
        procs.append(Proc(["resolver", "--listen", f"{IP}:{resolver_port}"], tmp_path))
        store = Proc(["store", "-c", "store.xml", "--resolver", f"{IP}:{resolver_port}", "-v"],
                     tmp_path)
        procs.append(store)
        store.wait_for("ready to accept registrations")
        for proc in procs:
            proc.note_ports()
        started = time.monotonic()
        source, events, dropped = asyncio.run(
            _run_source(tmp_path, resolver_port, store_port, lbtru_port))
        assert time.monotonic() - started < 60
    finally:
        for proc in reversed(procs):
            proc.stop()
        cap.stop()
    always |= {source.transport_addr[1], source.request_addr[1]}
    keep_run_frames(pcap, run_ports(procs, always))

    # the scenario happened: the store NACKed some messages, the source let exactly those go
    nacked = sorted(e.sequence_number for e in events if isinstance(e, MessageNacked))
    stable = {e.sequence_number for e in events if isinstance(e, MessageStable)}
    assert dropped and nacked, (sorted(dropped), nacked)
    assert len(set(nacked)) == len(nacked)  # once each
    assert stable.isdisjoint(nacked) and stable | set(nacked) == set(range(MESSAGES))
    assert "declared" in store.stderr or "lost" in store.stderr

    portmap = PortMap(store_ports=[store_port], lbmr_ports=[resolver_port],
                      lbtru_ports=[lbtru_port])
    assert_tshark_agrees(pcap, portmap)
    shown = [dict(fields) for frame in read_frames(pcap, portmap)
             for fields in frame.occurrences("lbmc")
             if any(k == "lbmc.ume_ack.flags" for k, _ in fields)]
    nacks = sorted(int(d["lbmc.ume_ack.seqnum"], 0) for d in shown
                   if int(d["lbmc.ume_ack.flags"], 0) & ACK_NAK)
    assert nacks and set(nacks) == set(nacked)
    assert all(int(d["lbmc.ume_ack.flags"], 0) == 0 for d in shown
               if not int(d["lbmc.ume_ack.flags"], 0) & ACK_NAK)
