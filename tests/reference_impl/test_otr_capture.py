"""Off-transport recovery on loopback, captured and checked with tshark (issue 20).

A real resolver and a real memory store (``ump`` processes); the reference source (LBT-RU,
a 64-message transmission window) and a receiver with ``use_otr 1`` on real sockets in this
process.  The only thing the test changes is the network at the receiver: the first copy of
some of the source's LBT-RU DATA datagrams never reaches it (loopback itself never loses
anything; the store gets every one).  The source sends in bursts longer than its window, so
by the time the receiver's NAK for such a message arrives it answers "do not retry": the
receiver's session gives the message up and OTR asks the store for it
(docs/semantics.md §1.9).  Every message must be delivered once, in order, those OTR brought
with the OTR flag; every frame must read the same in our dissector and in tshark, and tshark
must show an RXREQ for every number OTR recovered.
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
from reference_impl.events import MessageDelivered, OtrRequested
from reference_impl.receiver import ReceiverCore
from reference_impl.run_frames import keep_run_frames
from tests.reference_impl.loopback import IP, Proc, free_port, run_ports
from tests.reference_impl.oracle_capture import assert_tshark_agrees, start_capture
from wire import lbtru
from wire.tshark import PortMap, read_frames

TOPIC = "otr.loopback"
MESSAGES = 300
BURST = 100
"""Messages sent in one call into the source core: more than its 64-message window."""
DROP_EVERY = 7


def _lossy_receivers(monkeypatch: pytest.MonkeyPatch, dropped: set[int]) -> None:
    """Every receiver core started from now on misses the first copy of every ``DROP_EVERY``
    -th LBT-RU DATA sequence number (after the first ten); retransmissions pass.  Patched on
    the class: the host binds ``receive_at`` when the core's sockets open."""
    original = ReceiverCore.receive_at
    seen: set[int] = set()

    def lossy(self: ReceiverCore, local_port: int, data: bytes, addr: Any, now: float) -> None:
        if local_port in self.lbtru_ports:
            packet = lbtru.parse_packet(data, decode_lbmc=False)
            if isinstance(packet, lbtru.LbtruData) and not packet.rx \
                    and packet.sqn not in seen:
                seen.add(packet.sqn)
                if packet.sqn > 10 and packet.sqn % DROP_EVERY == 0:
                    dropped.add(packet.sqn)
                    return
        original(self, local_port, data, addr, now)
    monkeypatch.setattr(ReceiverCore, "receive_at", lossy)


async def _run_clients(tmp_path: Path, resolver_port: int, store_port: int,
                       lbtru_port: int) -> tuple[ReceiverCore, list[Any], set[int]]:
    (tmp_path / "source.cfg").write_text(
        f"context resolver_unicast_daemon {IP}:{resolver_port}\n"
        f"source ume_store {IP}:{store_port}\n"
        "source transport lbt-ru\n"
        f"source transport_lbtru_port {lbtru_port}\n"
        "source transport_lbtru_transmission_window_size 64\n")
    (tmp_path / "receiver.cfg").write_text(
        f"context resolver_unicast_daemon {IP}:{resolver_port}\n"
        "receiver use_otr 1\n"
        "receiver otr_request_initial_delay 300\n"
        "receiver otr_request_minimum_interval 200\n"
        "receiver otr_request_maximum_interval 1000\n")
    events: list[Any] = []
    async with AioHost() as host:
        source = await runtime.start_source(
            host, TOPIC, runtime.load_client(str(tmp_path / "source.cfg"), "current"), ip=IP)
        rcv = await runtime.start_receiver(
            host, TOPIC, runtime.load_client(str(tmp_path / "receiver.cfg"), "current"), ip=IP)
        host.on_events(rcv, events.append)
        await host.wait_until(lambda: source.complete and rcv.complete, timeout=20)
        for _ in range(MESSAGES // BURST):  # a burst outruns the window before a NAK comes
            host.call(source, lambda now: [source.send(b"o%04d" % source.next_sqn)
                                           for _ in range(BURST)])
            await asyncio.sleep(0.01)
        await host.wait_until(
            lambda: sum(isinstance(e, MessageDelivered) for e in events) >= MESSAGES,
            timeout=30)
        await asyncio.sleep(0.5)  # nothing more may be delivered
    return rcv, events, {source.transport_addr[1], source.request_addr[1]}


@pytest.mark.oracle
def test_otr_on_loopback_recovers_what_the_transport_gave_up_and_agrees_with_tshark(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store_port, resolver_port = free_port(), free_port(socket.SOCK_DGRAM)
    lbtru_port = free_port(socket.SOCK_DGRAM)
    (tmp_path / "store.xml").write_text(disk_store_xml("otr-store", store_port, r"otr\..*",
                                                       repository="memory"))
    dropped: set[int] = set()
    _lossy_receivers(monkeypatch, dropped)
    pcap = tmp_path / "otr.pcap"
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
        rcv, events, source_ports = asyncio.run(
            _run_clients(tmp_path, resolver_port, store_port, lbtru_port))
        assert time.monotonic() - started < 60
    finally:
        for proc in reversed(procs):
            proc.stop()
        cap.stop()
    always |= source_ports | {rcv.request_addr[1], *rcv.lbtru_ports}
    keep_run_frames(pcap, run_ports(procs, always))

    got = [e for e in events if isinstance(e, MessageDelivered)]
    assert [e.sequence_number for e in got] == list(range(MESSAGES))
    by_otr = {e.sequence_number for e in got if e.otr}
    asked = {n for e in events if isinstance(e, OtrRequested)
             for n in range(e.first, e.last + 1)}
    assert dropped and by_otr, (sorted(dropped), sorted(by_otr))
    # (``dropped`` holds LBT-RU sequence numbers, which are not the topic's)
    assert len(by_otr) <= len(dropped) and by_otr <= asked
    assert all(e.retransmission for e in got if e.otr)

    portmap = PortMap(store_ports=[store_port], lbmr_ports=[resolver_port],
                      lbtru_ports=[lbtru_port])
    assert_tshark_agrees(pcap, portmap)
    shown = {int(dict(fields)["lbmc.ume_rxreq.seqnum"], 0)
             for frame in read_frames(pcap, portmap) for fields in frame.occurrences("lbmc")
             if any(k == "lbmc.ume_rxreq.seqnum" for k, _ in fields)}
    assert by_otr <= shown
