"""Fragmented traffic on loopback, captured and checked with tshark with reassembly on.

Real ``ump`` processes (resolver, a memory store, a source sending messages longer than its
transport's maximum datagram, a receiver joined before the first message and one that joins
after it, so fragments travel live on the transport and as retransmissions from the store):
every frame captured, then read by our dissector and by tshark with
``-2 -o lbmc.reassemble_fragments:TRUE`` (docs/wire-lbmc.md §3.1).  No field may differ, no
frame may be malformed, no LBMC expert may complain (an overrun or an invalid fragment is one),
and tshark must show the FRAG headers we sent.
"""

from __future__ import annotations

import json
import signal
import socket
import time
from pathlib import Path

import pytest

from reference_impl.capture import LoopbackCapture
from reference_impl.config.store_xml_writer import disk_store_xml
from reference_impl.run_frames import keep_run_frames
from tests.reference_impl.loopback import IP, Proc, free_port, run_ports
from tests.reference_impl.oracle_capture import assert_tshark_agrees, start_capture
from wire.tshark import PortMap, read_frames

MESSAGES = 6
SIZE = 30_000
"""Payload bytes per message: 4 fragments of an 8192-byte datagram on either transport.

LBT-TCP runs with ``transport_tcp_datagram_max_size 8192`` rather than its 65535 default: a
burst of 64 KiB fragments fills the loopback receive window, and tshark 4.0 then shows the
segments after a "TCP Window Full" one as bare TCP data without reassembling the LBT-TCP
messages in them (ours are whole; it is tshark's TCP reassembly, not LBMC), which would hide
exactly the frames this test is about."""


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.oracle
@pytest.mark.parametrize("transport", ["tcp", "lbt-ru"])
def test_captured_fragments_reassemble_in_tshark_without_a_disagreement(
        tmp_path: Path, transport: str) -> None:
    topic = f"frag.{transport.replace('-', '')}"
    size = SIZE
    store_port, resolver_port = free_port(), free_port(socket.SOCK_DGRAM)
    (tmp_path / "store.xml").write_text(disk_store_xml("frag-store", store_port, r"frag\..*",
                                                       repository="memory"))
    context = f"context resolver_unicast_daemon {IP}:{resolver_port}\n"
    (tmp_path / "source.cfg").write_text(
        context + f"source ume_store {IP}:{store_port}\n"
        + ("source transport lbt-ru\n" if transport == "lbt-ru" else
           "source transport_tcp_datagram_max_size 8192\n"))
    (tmp_path / "receiver.cfg").write_text(context)
    pcap = tmp_path / "frag.pcap"
    cap = LoopbackCapture(pcap, ports=[store_port, resolver_port, *range(14360, 14396)])
    start_capture(cap)
    procs: list[Proc] = []
    always: set[int] = {store_port, resolver_port}
    try:
        procs.append(Proc(["resolver", "--listen", f"{IP}:{resolver_port}"], tmp_path))
        store = Proc(["store", "-c", "store.xml", "--resolver", f"{IP}:{resolver_port}", "-v"],
                     tmp_path)
        procs.append(store)
        store.wait_for("ready to accept registrations")
        live = Proc(["receiver", "-c", "receiver.cfg", "--topic", topic, "--out", "live.jsonl",
                     "--count", str(MESSAGES), "-v"], tmp_path)
        source = Proc(["source", "-c", "source.cfg", "--topic", topic, "--count",
                       str(MESSAGES), "--size", str(size), "--rate", "1", "--linger", "2",
                       "--wait-start", "-v"], tmp_path)
        procs += [live, source]
        source.wait_for("ump source: registered")
        live.wait_for("ReceiverRegistrationComplete")
        for proc in procs:
            proc.note_ports()
        source.proc.send_signal(signal.SIGUSR2)
        # once the first message is out, a late receiver recovers it (and whatever else was
        # sent before it joined) from the store: RXREQ, RX-DATA with FRAG headers
        deadline = time.monotonic() + 30
        while not _rows(tmp_path / "live.jsonl") and time.monotonic() < deadline:
            time.sleep(0.05)
        late = Proc(["receiver", "-c", "receiver.cfg", "--topic", topic, "--out", "late.jsonl",
                     "--count", str(MESSAGES), "-v"], tmp_path)
        procs.append(late)
        late.wait_for("ReceiverRegistrationComplete")
        late.note_ports()
        assert live.finish(timeout=60) == 0, live.stderr
        assert late.finish(timeout=60) == 0, late.stderr
        assert source.finish(timeout=60) == 0, source.stderr
    finally:
        for proc in reversed(procs):
            proc.stop()
        cap.stop()
    keep_run_frames(pcap, run_ports(procs, always))
    for name in ("live", "late"):
        rows = _rows(tmp_path / f"{name}.jsonl")
        assert [row["payload"] for row in rows] == \
            [f"{n}:".ljust(size, ".") for n in range(MESSAGES)], name
    late_rows = _rows(tmp_path / "late.jsonl")
    assert late_rows[0]["rx"]

    portmap = PortMap(store_ports=[store_port], lbmr_ports=[resolver_port],
                      reassemble_fragments=True)
    assert_tshark_agrees(pcap, portmap, pending=True, warned=("LBM", "UME", "ragment"))
    frags = [dict(fields) for frame in read_frames(pcap, portmap)
             for fields in frame.occurrences("lbmc")
             if any(k == "lbmc.frag.first_sqn" for k, _ in fields)]
    per = len({d["lbmc.sqn"] for d in frags if d.get("lbmc.frag.first_sqn") == "0"})
    assert per == 4
    firsts = {int(d["lbmc.frag.first_sqn"]) for d in frags}
    assert firsts == {n * per for n in range(MESSAGES)}
    assert {d["lbmc.frag.len"] for d in frags} == {str(size)}
