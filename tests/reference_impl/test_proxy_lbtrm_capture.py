"""A proxy-source election and its proxy, after an LBT-RM source, on loopback, checked with
tshark (issue 20).

Every party is an ``ump`` process: a resolver daemon; three stores (three ``ump store``
daemons, each with ``allow-proxy-source`` 1 and an ``<lbm-config>`` naming the three as the
Quorum/Consensus group, docs/semantics.md §1.11); a QC source with ``ume_proxy_source`` 1 and a
Session ID that sends on LBT-RM (multicast on loopback, a free unicast NAK port and destination
port, so no other run shares its group) and ends without deregistering (SIGKILLed once every
message is stable, if it has not exited by itself) so its activity times out at the stores and
they elect; then a late receiver that finds the topic through the proxy's advertisement,
registers with the proxy's store and recovers every message from it (guide "Proxy Sources",
"How Proxy Sources Operate").

The capture filter names only ports chosen for this run (free ones, each held by one of its
processes from before its first frame: the stores' and the proxies' ports are read once the
stores are up, and the capture starts before the source), so it holds no other run's frames.

What the wire must show: every frame is UM or not UM in our dissector, tshark shows every
field as we read it and raises no error and no LBM/UME warning (the port map names the
stores' ports, the resolver, the LBT-RM ports and each store's proxy port); and, read by
tshark itself: the source's PREGs carry the proxy request (``ume_proxy_src``) to each store;
the LBT-RM data leaves the source's unicast port for the group; election claims (PREG + PSER +
PSRC-ETOK) go from store to store port; the proxy's TIR advertises the topic at its store's
proxy port; and the late receiver asks the proxy's store for the messages (RXREQ).  Exactly
one store says it created the proxy (or the others say they lost the election).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest

from reference_impl.capture import LoopbackCapture
from reference_impl.config.store_xml_writer import StoreXml, TopicXml, store_daemon_xml
from reference_impl.run_frames import bound_sockets
from tests.reference_impl.loopback import IP, Proc, free_port, stop_processes
from tests.reference_impl.oracle_capture import assert_tshark_agrees, start_capture
from wire.tshark import PortMap, run

GROUP = "224.10.10.12"
MESSAGES = 20
STORES = 3
CREATED = "proxy source created for topic"
TOPIC_OPTIONS: dict[str, str | int] = {
    "repository-type": "memory", "repository-size-threshold": 1 << 20,
    "repository-size-limit": 2 << 20, "source-activity-timeout": 1000, "source-check-interval": 100,
    "keepalive-interval": 300, "proxy-election-interval": 200}
"""The source is timed out 1 s after it was last heard; the election waits 0.1 .. 0.3 s; the
repository keeps every message (the product's 1 KiB size threshold would keep the last few)."""


def listening_tcp_ports(pid: int) -> frozenset[int]:
    """The TCP ports process ``pid`` listens on: a store's own port and the port its proxy
    sources advertise (any free one, chosen when the store starts)."""
    return frozenset(port for proto, port in bound_sockets(pid) if proto == "tcp")


def two_free_tcp_ports() -> tuple[int, int]:
    """Two adjacent free TCP ports: the source's and the receiver's request ports, so that the
    request port range tshark is given holds no other port of the run."""
    for _ in range(50):
        low = free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((IP, low + 1))
            except OSError:
                continue
        return low, low + 1
    raise AssertionError("no two adjacent free TCP ports")


def _deliveries(path: Path) -> list[int]:
    if not path.exists():
        return []
    return [json.loads(line)["sqn"] for line in path.read_text().splitlines() if line]


def _fields(pcap: Path, portmap: PortMap, where: str, *names: str) -> list[list[str]]:
    """tshark's own reading: ``names`` of every frame matching display filter ``where``."""
    out = run(["-r", str(pcap), *portmap.tshark_args(), "-Y", where, "-T", "fields",
               "-E", "separator=/t", "-E", "occurrence=a", "-E", "aggregator=,",
               *[a for n in names for a in ("-e", n)]])
    return [line.split("\t") for line in out.splitlines()]


@pytest.mark.oracle
def test_proxy_election_and_a_late_receiver_after_an_lbtrm_source_agree_with_tshark(
        tmp_path: Path) -> None:
    started = time.monotonic()
    topic = f"proxy.rm.{uuid.uuid4().hex[:10]}"  # no other run's store answers for it
    resolver_port = free_port(socket.SOCK_DGRAM)
    ucast, dport = free_port(socket.SOCK_DGRAM), free_port(socket.SOCK_DGRAM)
    src_request, rcv_request = two_free_tcp_ports()
    tcp_port = free_port()
    store_ports = [free_port() for _ in range(STORES)]
    resolver_line = f"context resolver_unicast_daemon {IP}:{resolver_port}"
    group_lines = [f"source ume_store {IP}:{p}" for p in store_ports]
    procs: list[Proc] = []
    cap: LoopbackCapture | None = None
    receiver: Proc | None = None
    try:
        procs.append(Proc(["resolver", "--listen", f"{IP}:{resolver_port}"], tmp_path))
        stores: list[Proc] = []
        for i, port in enumerate(store_ports):
            home = tmp_path / f"store{i}"
            home.mkdir()
            (home / "lbm.cfg").write_text("\n".join([resolver_line, *group_lines]) + "\n")
            (home / "store.xml").write_text(store_daemon_xml(
                [StoreXml(f"pxy{i}", port, options={"allow-proxy-source": 1},
                          topics=[TopicXml(r"proxy\..*", TOPIC_OPTIONS)])],
                lbm_config="lbm.cfg"))
            stores.append(Proc(["store", "-v", "-c", "store.xml", "--resolver",
                                f"{IP}:{resolver_port}"], home))
        procs += stores
        for store in stores:
            store.wait_for("ready to accept registrations")
        proxy_of = []  # each store's proxy port
        for store, port in zip(stores, store_ports, strict=True):
            (proxy,) = listening_tcp_ports(store.proc.pid) - {port}
            proxy_of.append(proxy)
        proxy_ports = sorted(proxy_of)
        ports = {resolver_port, ucast, dport, src_request, rcv_request, *store_ports,
                 *proxy_ports}
        pcap = tmp_path / "proxy-lbtrm.pcap"
        cap = LoopbackCapture(pcap, ports=sorted(ports))
        start_capture(cap)

        (tmp_path / "source.cfg").write_text("\n".join([
            resolver_line, *group_lines,
            f"context request_tcp_port_low {src_request}",
            f"context request_tcp_port_high {src_request}",
            # (a source listens on an LBT-TCP port whatever its transport: a free one, not
            # the first free one of a range other runs on the machine take too)
            f"context transport_tcp_port_low {tcp_port}",
            f"context transport_tcp_port_high {tcp_port}",
            f"source ume_session_id {int(uuid.uuid4().hex[:8], 16) | 1}",
            "source ume_proxy_source 1",
            "source transport lbt-rm",
            f"source transport_lbtrm_multicast_address {GROUP}",
            f"source transport_lbtrm_source_port {ucast}",
            f"source transport_lbtrm_destination_port {dport}"]) + "\n")
        source = Proc(["source", "-v", "-c", "source.cfg", "--topic", topic, "--count",
                       str(MESSAGES), "--rate", "100", "--linger", "20"], tmp_path)
        procs.append(source)
        source.wait_for("registered; next sequence number", timeout=30)
        source.wait_for(f"sent {MESSAGES} messages, 0 still in flight", timeout=30)
        if source.proc.poll() is None:
            os.kill(source.proc.pid, signal.SIGKILL)  # gone without deregistering
        source.finish()

        # the source's activity times out (1 s), the stores wait and claim (0.1 .. 0.3 s)
        deadline = time.monotonic() + 15
        while not any(CREATED in s.stderr for s in stores) and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # a second proxy, had two stores raced, has lost the tie by now
        (tmp_path / "receiver.cfg").write_text("\n".join([
            resolver_line, f"context request_tcp_port_low {rcv_request}",
            f"context request_tcp_port_high {rcv_request}"]) + "\n")
        out = tmp_path / "deliveries.jsonl"
        receiver = Proc(["receiver", "-v", "-c", "receiver.cfg", "--topic", topic, "--out",
                         str(out)], tmp_path)
        procs.append(receiver)
        deadline = time.monotonic() + 20
        while len(_deliveries(out)) < MESSAGES and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(0.5)  # nothing more may come
    finally:
        stop_processes([p.proc for p in reversed(procs)])
        if cap is not None:
            cap.stop()
    assert receiver is not None
    assert _deliveries(out) == list(range(MESSAGES)), \
        "\n".join(p.stderr[-3000:] for p in [receiver, source, *stores])
    holders = [i for i, s in enumerate(stores) if CREATED in s.stderr]
    lost = [i for i, s in enumerate(stores) if "election lost" in s.stderr]
    assert len(holders) - len(lost) == 1, [s.stderr[-2000:] for s in stores]
    (holder,) = [i for i in holders if i not in lost]

    portmap = PortMap(store_ports=store_ports, lbmr_ports=[resolver_port],
                      lbttcp_ports=proxy_ports, lbtrm_dport=(dport, dport),
                      lbtrm_sport=(ucast, ucast), lbttcp_request=(src_request, rcv_request))
    reports = assert_tshark_agrees(pcap, portmap)
    assert {r.transport for r in reports if r.status == "um"} >= {"lbtrm", "lbmr"}

    # the source asked each store for a proxy in its registration
    asked = _fields(pcap, portmap, "lbmc.ume_proxy_src && lbmc.ume_preg", "tcp.dstport",
                    "lbmc.ume_proxy_src.flags.enable")
    assert {int(r[0]) for r in asked} == set(store_ports), asked
    assert all(set(r[1].split(",")) <= {"1", "True"} for r in asked), asked
    # LBT-RM data from the source's unicast port to the group
    data = _fields(pcap, portmap, "lbtrm.hdr.type == 0", "ip.src", "udp.srcport", "ip.dst",
                   "udp.dstport")
    assert len(data) >= MESSAGES and all(
        (r[0], int(r[1]), r[2], int(r[3])) == (IP, ucast, GROUP, dport) for r in data), data[:5]
    # election claims: store port to store port, PREG + PSER + election token
    claims = _fields(pcap, portmap, "lbmc.ume_psrc_election_token", "tcp.dstport",
                     "lbmc.ume_psrc_election_token.store_index")
    assert claims and {int(r[0]) for r in claims} <= set(store_ports), claims
    assert _fields(pcap, portmap, "lbmc.ume_psrc_election_token && !lbmc.ume_pser",
                   "frame.number") == []
    # the proxy's advertisement: the topic at the holder's proxy port
    tirs = _fields(pcap, portmap, f'lbmr.tir.name == "{topic}"', "lbmr.tir.tcp.port")
    advertised = {int(p) for r in tirs for p in r[0].split(",") if p}
    # (a store that created a proxy and then lost the tie advertised it once too)
    assert proxy_of[holder] in advertised and advertised <= set(proxy_ports), tirs
    if not lost:
        assert advertised == {proxy_of[holder]}, tirs
    # the late receiver asked the proxy's store for the messages
    rxreqs = _fields(pcap, portmap, "lbmc.ume_rxreq", "tcp.dstport")
    assert store_ports[holder] in {int(r[0]) for r in rxreqs}, rxreqs
    assert time.monotonic() - started < 60
