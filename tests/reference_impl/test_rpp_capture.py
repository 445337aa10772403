"""A receiver-paced persistence run on loopback, captured and checked with tshark.

Real ``ump`` processes (resolver, a memory store whose topic allows RPP, an RPP source with two
overrides, a blocking and a non-blocking RPP receiver), every frame captured; the capture must
show the RPP exchange of the guide's "RPP Registration", "RPP Normal Operations" and "RPP
Deregistration": the source's PREG with the RPP flag and its overrides as EXTOPT configuration
options (docs/wire-lbmc.md §2.3), the non-blocking receiver's mode the same way, PREG-RESPs
confirming RPP, stability and consumption ACKs, and the blocking receiver's deregistration
(PREG and PREG-RESP with the D flag) - with no field where our dissector and tshark disagree and
no malformed frame or LBMC expert error.
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path
from typing import Any

import pytest

from reference_impl.capture import LoopbackCapture
from reference_impl.config.store_xml_writer import disk_store_xml
from reference_impl.run_frames import keep_run_frames
from tests.reference_impl.loopback import IP, Proc, free_port, run_ports
from tests.reference_impl.oracle_capture import assert_tshark_agrees, start_capture
from wire.dissect import Occurrence
from wire.lbmc import AckType
from wire.tshark import PortMap, read_frames

TOPIC = "rpp.captured"
MESSAGES = 200
FLIGHT = 3200
"""The source's ``ume_flight_size_bytes`` (the topic allows twice that)."""
SIZE_LIMIT = 64_000
"""The source's ``ume_repository_size_limit`` (the topic allows twice that)."""


def _field(o: Occurrence, name: str) -> Any:
    return next((v for k, v in o.fields if k == name), None)


def _cfgopts(shown: list[tuple[str, str]]) -> list[tuple[int, str, str]]:
    """(scope, name, value) of every configuration option of one LBMC message, as tshark
    shows it (our dissector stops at the EXTOPT header and does not show the options)."""
    scopes = [int(v) for k, v in shown if k == "lbmc.extopt.cfgopt.scope"]
    names = [v for k, v in shown if k == "lbmc.extopt.cfgopt.name"]
    values = [v for k, v in shown if k == "lbmc.extopt.cfgopt.value"]
    return list(zip(scopes, names, values, strict=True))


@pytest.mark.oracle
def test_a_captured_rpp_run_shows_the_rpp_exchange_and_tshark_agrees(tmp_path: Path) -> None:
    store_port, resolver_port = free_port(), free_port(socket.SOCK_DGRAM)
    (tmp_path / "store.xml").write_text(disk_store_xml(
        "rpp-store", store_port, r"rpp\..*", repository="memory",
        topic_options={"repository-allow-receiver-paced-persistence": 1,
                       "source-flight-size-bytes-maximum": 2 * FLIGHT,
                       "repository-size-threshold": 4 * FLIGHT,
                       "repository-size-limit": 2 * SIZE_LIMIT}))
    context = f"context resolver_unicast_daemon {IP}:{resolver_port}\n"
    (tmp_path / "source.cfg").write_text(
        context + f"source ume_store {IP}:{store_port}\nsource ume_receiver_paced_persistence 1\n"
        f"source ume_flight_size_bytes {FLIGHT}\nsource ume_repository_size_limit {SIZE_LIMIT}\n")
    for name, mode in (("blocking", 1), ("nonblocking", 2)):
        (tmp_path / f"{name}.cfg").write_text(
            context + f"receiver ume_receiver_paced_persistence {mode}\n")
    pcap = tmp_path / "rpp.pcap"
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
        blocking = Proc(["receiver", "-c", "blocking.cfg", "--topic", TOPIC, "--out",
                         "blocking.jsonl", "--count", str(MESSAGES), "--deregister", "-v"],
                        tmp_path)
        nonblocking = Proc(["receiver", "-c", "nonblocking.cfg", "--topic", TOPIC, "--out",
                            "nonblocking.jsonl", "-v"], tmp_path)
        source = Proc(["source", "-c", "source.cfg", "--topic", TOPIC, "--count",
                       str(MESSAGES), "--rate", "400", "--wait-start", "-v"], tmp_path)
        procs += [blocking, nonblocking, source]
        source.wait_for("ump source: registered")
        for receiver in (blocking, nonblocking):
            receiver.wait_for("ReceiverRegistrationComplete")
        for proc in procs:
            proc.note_ports()
        source.proc.send_signal(signal.SIGUSR2)  # both registered: the traffic may start
        assert blocking.finish(timeout=60) == 0, blocking.stderr
        assert "ump receiver: deregistered from 1 store" in blocking.stderr
        assert source.finish(timeout=60) == 0, source.stderr
    finally:
        for proc in reversed(procs):
            proc.stop()
        cap.stop()
    keep_run_frames(pcap, run_ports(procs, always))
    for name in ("blocking", "nonblocking"):
        rows = [json.loads(line) for line in (tmp_path / f"{name}.jsonl").read_text().splitlines()]
        assert [r["sqn"] for r in rows] == list(range(MESSAGES)), name

    portmap = PortMap(store_ports=[store_port], lbmr_ports=[resolver_port])
    reports = assert_tshark_agrees(pcap, portmap)

    theirs = {f.number: f for f in read_frames(pcap, portmap)}
    shown: dict[int, list[tuple[str, str]]] = {}  # id(our occurrence) -> tshark's fields
    lbmc = []
    for report in reports:
        ours = [o for o in report.occurrences if o.protocol == "lbmc"]
        for o, t in zip(ours, theirs[report.number].occurrences("lbmc"), strict=True):
            lbmc.append(o)
            shown[id(o)] = t
    pregs = [o for o in lbmc if o.label.startswith("PREG") and not o.label.startswith("PREG-")]
    source_pregs = [o for o in pregs if _field(o, "lbmc.ume_preg.s_flag") == 1]
    assert source_pregs and all(_field(o, "lbmc.ume_preg.flags.w_flag") == 1
                                for o in source_pregs)
    assert _cfgopts(shown[id(source_pregs[0])]) == [(1, "ume_flight_size_bytes", str(FLIGHT)),
                                         (1, "ume_repository_size_limit", str(SIZE_LIMIT))]
    receiver_pregs = [o for o in pregs if _field(o, "lbmc.ume_preg.s_flag") == 0
                      and not _field(o, "lbmc.ume_preg.flags.d_flag")]
    assert len(receiver_pregs) >= 2
    assert all(_field(o, "lbmc.ume_preg.flags.w_flag") == 1 for o in receiver_pregs)
    modes = sorted(tuple(_cfgopts(shown[id(o)])) for o in receiver_pregs)
    assert modes[0] == () and ((2, "ume_receiver_paced_persistence", "2"),) in modes
    responses = [o for o in lbmc if o.label.startswith("PREG-RESP")]
    granted = [o for o in responses if not _field(o, "lbmc.ume_preg_resp.code.e_flag")
               and not _field(o, "lbmc.ume_preg_resp.code.d_flag")]
    assert len(granted) >= 3 and all(_field(o, "lbmc.ume_preg_resp.code.w_flag") == 1
                                     for o in granted)
    acks = [_field(o, "lbmc.ume_ack.type") for o in lbmc if _field(o, "lbmc.ume_ack.type")
            is not None]
    assert AckType.STABLE in acks and AckType.CDELV in acks
    leaving = [o for o in pregs if _field(o, "lbmc.ume_preg.flags.d_flag") == 1]
    assert leaving and all(_field(o, "lbmc.ume_preg.s_flag") == 0 for o in leaving)
    assert any(_field(o, "lbmc.ume_preg_resp.code.d_flag") == 1 for o in responses)


@pytest.mark.oracle
def test_the_rpp_reference_capture_shows_registration_options_and_deregistration() -> None:
    """``captures/reference/ume-rpp.pcap`` (``captures.reference.rpp_exchange``): what tshark
    shows of its RPP registrations and deregistrations."""
    from captures.reference import RPP_OVERRIDES, STORE_PORT

    path = Path(__file__).resolve().parents[2] / "captures" / "reference" / "ume-rpp.pcap"
    frames = read_frames(path, PortMap(store_ports=[STORE_PORT]))
    messages = [m for f in frames for m in f.occurrences("lbmc")]

    def flag(m: list[tuple[str, str]], name: str) -> str | None:
        return next((v for k, v in m if k == name), None)
    pregs = [m for m in messages if flag(m, "lbmc.ume_preg.s_flag") is not None]
    responses = [m for m in messages if flag(m, "lbmc.ume_preg_resp.s_flag") is not None]
    assert all(flag(m, "lbmc.ume_preg.flags.w_flag") == "1" for m in pregs)
    assert all(flag(m, "lbmc.ume_preg_resp.code.w_flag") == "1" for m in responses)
    source = [m for m in pregs if flag(m, "lbmc.ume_preg.s_flag") == "1"]
    overrides = [(1, "ume_flight_size_bytes", str(RPP_OVERRIDES.ume_flight_size_bytes)),
                 (1, "ume_repository_size_limit", str(RPP_OVERRIDES.ume_repository_size_limit))]
    assert [_cfgopts(m) for m in source] == [overrides, overrides]  # register, deregister
    receivers = [_cfgopts(m) for m in pregs if flag(m, "lbmc.ume_preg.s_flag") == "0"]
    assert [(2, "ume_receiver_paced_persistence", "2")] in receivers
    leaving = [m for m in pregs if flag(m, "lbmc.ume_preg.flags.d_flag") == "1"]
    assert len(leaving) == 3  # both receivers, then the source
    assert sum(flag(m, "lbmc.ume_preg_resp.code.d_flag") == "1" for m in responses) == 3
