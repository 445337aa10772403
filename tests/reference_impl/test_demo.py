"""``ump demo`` end to end: real processes on loopback, SIGKILLed and restarted mid-stream,
with the traffic captured and cross-checked with tshark (issue 3: "the key scenarios again over
real sockets on loopback ... zero disagreements").

Every demo here runs on free ports (``--resolver-port 0 --store-port 0``, or the default
without ``--capture``), so two test runs on one machine, or a product daemon on UM's
well-known ports, do not collide with it.
"""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from wire.dissect import check_against_tshark, dissect_file
from wire.pcap import decode_frame, read_capture
from wire.tshark import PortMap


def _ump() -> list[str]:
    """The ``ump`` command the README types (the console script next to this interpreter)."""
    script = Path(sys.executable).with_name("ump")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ump"]


@pytest.mark.oracle
def test_demo_delivers_everything_once_in_order_and_tshark_agrees(tmp_path: Path) -> None:
    for transport in ("tcp", "lbt-ru"):
        _demo(tmp_path / transport, transport)


@pytest.mark.oracle
def test_demo_over_lbt_rm_passes_and_its_capture_agrees_with_tshark(tmp_path: Path) -> None:
    # issue 20: multicast on loopback (scripts/ensure-multicast), a source restart included
    _demo(tmp_path / "lbt-rm", "lbt-rm")


class Chatter:
    """Another process's traffic on a port of UM's ranges the capture filter names (LBT-RU
    source ports 14380-14389, which an LBT-TCP demo does not use), for the whole run."""

    def __init__(self) -> None:
        self.rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for port in range(14389, 14379, -1):
            try:
                self.rx.bind(("127.0.0.1", port))
                break
            except OSError:
                continue
        else:
            pytest.skip("every port of 14380-14389 is taken")
        self.port = self.rx.getsockname()[1]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as tx:
            while not self.stop.wait(0.05):
                tx.sendto(b"not the demo's", ("127.0.0.1", self.port))

    def close(self) -> None:
        self.stop.set()
        self.thread.join()
        self.rx.close()


def _demo(tmp_path: Path, transport: str) -> None:
    # README: ump demo --capture demo.pcap, from a fresh directory, with relative paths
    tmp_path.mkdir()
    work = tmp_path / "demo"
    pcap = tmp_path / "demo.pcap"
    chatter = Chatter() if transport == "tcp" else None
    try:
        result = subprocess.run(
            [*_ump(), "demo", "--messages", "900", "--workdir", "demo", "--store-port", "0",
             "--resolver-port", "0", "--capture", "demo.pcap", "--transport", transport],
            cwd=tmp_path, capture_output=True, text=True, timeout=240)
    finally:
        if chatter is not None:
            chatter.close()
    assert result.returncode == 0, result.stdout + result.stderr
    if chatter is not None:  # the other process's frames are not the demo's capture
        assert "frames of other processes on UM's ports left out" in result.stdout
        frames = [decode_frame(r.linktype, r.data) for r in read_capture(pcap)]
        assert frames and all(chatter.port not in (f.sport, f.dport) for f in frames)
    assert "PASS" in result.stdout
    rows = [json.loads(line) for line in (work / "deliveries.jsonl").read_text().splitlines()]
    assert [r["sqn"] for r in rows] == list(range(900))
    assert any(r["rx"] for r in rows)  # the restarted receiver recovered from the store
    store_port, resolver_port = _ports(work)
    assert f"--store-port {store_port} --lbmr-port {resolver_port} " in result.stdout
    ports = PortMap(store_ports=[store_port], lbmr_ports=[resolver_port])
    reports = list(dissect_file(pcap, ports))
    labels = {o.label for r in reports for o in r.occurrences}
    assert {"PREG", "PREG-RESP", "SRI", "ACK", "RXREQ", "DATA"} <= labels
    assert any(r.transport == "lbmr" for r in reports)  # the resolver's traffic, on its port
    assert all(r.status in ("um", "not-um") for r in reports)
    assert check_against_tshark(pcap, reports, ports) == []
    lbtru_frames = [r for r in reports if r.transport == "lbtru"]
    if transport == "lbt-ru":  # the data went over LBT-RU, including the RST after the restart
        kinds = {o.label.split()[0] for r in lbtru_frames for o in r.occurrences
                 if o.protocol == "lbtru"}
        assert {"DATA", "CREQ", "ACK", "RST"} <= kinds, kinds
    else:
        assert lbtru_frames == []
    lbtrm_labels = [o.label for r in reports if r.transport == "lbtrm"
                    for o in r.occurrences if o.protocol == "lbtrm"]
    if transport == "lbt-rm":  # the data went over LBT-RM; the restarted source is a new session
        assert "DATA" in {label.split()[0] for label in lbtrm_labels}
        sessions = {label.split(" ID ")[1].split()[0] for label in lbtrm_labels
                    if " ID " in label}
        assert len(sessions) == 2, sessions
    else:
        assert lbtrm_labels == []


def _ports(work: Path) -> tuple[int, int]:
    """The store and resolver ports the demo chose, read back from the files it wrote."""
    cfg = (work / "source.cfg").read_text().splitlines()
    store = next(line for line in cfg if line.startswith("source ume_store "))
    resolver = next(line for line in cfg if line.startswith("context resolver_unicast_daemon"))
    return int(store.rsplit(":", 1)[1]), int(resolver.rsplit(":", 1)[1])


def test_demo_with_a_relative_workdir_from_a_fresh_directory_twice(tmp_path: Path) -> None:
    # README: ump demo --workdir DIR (DIR relative to where the user is)
    cwd = tmp_path / "fresh"
    cwd.mkdir()
    result = subprocess.run([*_ump(), "demo", "--workdir", "demo-dir", "--messages", "150"],
                            cwd=cwd, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "PASS: every message 0..149 arrived once and in order" in result.stdout
    rows = (cwd / "demo-dir" / "deliveries.jsonl").read_text().splitlines()
    assert [json.loads(line)["sqn"] for line in rows] == list(range(150))
    for name in ("resolver", "store", "source", "receiver"):
        assert (cwd / "demo-dir" / f"{name}.log").exists()
    # the same DIR again: the second run must not inherit the first run's store state
    again = subprocess.run([*_ump(), "demo", "--workdir", "demo-dir", "--messages", "150"],
                           cwd=cwd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "PASS: every message 0..149 arrived once and in order" in again.stdout


@pytest.mark.parametrize("daemon", ["resolver", "store"])
def test_a_taken_port_ends_the_demo_at_once_naming_the_daemon(tmp_path: Path,
                                                             daemon: str) -> None:
    kind = socket.SOCK_DGRAM if daemon == "resolver" else socket.SOCK_STREAM
    with socket.socket(socket.AF_INET, kind) as taken:
        taken.bind(("127.0.0.1", 0))
        if kind == socket.SOCK_STREAM:
            taken.listen()
        port = taken.getsockname()[1]
        began = time.monotonic()
        result = subprocess.run(
            [*_ump(), "demo", "--workdir", str(tmp_path / "w"), "--messages", "30",
             f"--{daemon}-port", str(port)],
            capture_output=True, text=True, timeout=120)
        took = time.monotonic() - began
    assert result.returncode == 2, result.stdout + result.stderr
    assert f"ump demo: {daemon} could not bind 127.0.0.1:{port}: address in use " \
           f"(--{daemon}-port 0 takes a free one); see " in result.stderr
    assert "Traceback" not in result.stderr
    assert "messages delivered" not in result.stdout  # no run on a half-started deployment
    assert took < 15, took


@pytest.mark.parametrize("option", ["--store-port", "--resolver-port"])
def test_a_port_out_of_range_is_a_clear_error(tmp_path: Path, option: str) -> None:
    result = subprocess.run([*_ump(), "demo", "--workdir", str(tmp_path / "w"), option,
                             "70000"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert f"ump demo: {option} must be a port number 0-65535, not 70000" in result.stderr


def test_a_capture_path_in_a_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "ump", "demo", "--messages", "10", "--workdir",
         str(tmp_path / "w"), "--store-port", "0", "--resolver-port", "0",
         "--capture", str(tmp_path / "nowhere" / "demo.pcap")],
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "no directory" in result.stderr


# --- ump demo --rpp ----------------------------------------------------------------------------


def test_rpp_demo_paces_the_source_by_the_slow_blocking_receiver(tmp_path: Path) -> None:
    # README: ump demo --rpp, from a fresh directory, with a relative work directory
    cwd = tmp_path / "fresh"
    cwd.mkdir()
    result = subprocess.run([*_ump(), "demo", "--rpp", "--workdir", "rpp", "--messages", "600"],
                            cwd=cwd, capture_output=True, text=True, timeout=180)
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    assert "PASS: both blocking receivers got every message 0..599 once and in order, and " \
           "the source was paced by the slow one" in out
    work = cwd / "rpp"
    for which in ("fast", "slow"):
        rows = [json.loads(line) for line in
                (work / f"deliveries-{which}.jsonl").read_text().splitlines()]
        assert [r["sqn"] for r in rows] == list(range(600))
    # paced: 600 messages at the slow receiver's 75 msg/s, of which the repository (250) and
    # one flight (50) may run ahead, take at least 4 s; unpaced they take a fraction of one
    paced = re.search(r"source paced by the slow receiver: 600 msgs in ([\d.]+) s .*slow "
                      r"receiver consumes 75 msg/s", out)
    assert paced is not None, out
    assert float(paced.group(1)) >= 3.2
    source_log = (work / "source.log").read_text()
    peak = re.search(r"in-flight bytes max (\d+) \(ume_flight_size_bytes 3200\)", source_log)
    assert peak is not None and 0 < int(peak.group(1)) <= 3200, source_log
    ahead = re.search(r"at most (\d+) messages \(\d+ bytes\) ahead of the slow one", out)
    assert ahead is not None and int(ahead.group(1)) <= 300 + 8
    # the slow application consumed at its rate: 600 messages at 75 msg/s take 8 s
    slow = re.search(r"had every message at ([\d.]+) s", out)
    assert slow is not None and float(slow.group(1)) >= 6.4, out
    assert "ume_receiver_paced_persistence 1" in (work / "receiver.cfg").read_text()
    assert "repository-allow-receiver-paced-persistence" in (work / "store.xml").read_text()
    assert "both receivers deregistered from the store (RPP Deregistration)" in out


def test_rpp_demo_needs_more_messages_than_the_repository_holds(tmp_path: Path) -> None:
    result = subprocess.run([*_ump(), "demo", "--rpp", "--workdir", str(tmp_path / "w"),
                             "--messages", "100"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "ump demo: --rpp needs at least 600 messages (--messages)" in result.stderr
    assert "Traceback" not in result.stderr


def _judged(tmp_path: Path, fast_done: float, *, inflight: int = 3200,
            lost: int | None = None) -> tuple[int, str]:
    """The RPP demo's verdict on made-up observations (no processes): the fast receiver had
    all 600 messages at ``fast_done`` s, the slow one 8 s in; ``lost`` is left out of the
    slow receiver's log."""
    import contextlib
    import io
    from types import SimpleNamespace

    from reference_impl.demo import RppDemo, Sample

    demo = RppDemo(600, tmp_path, 1, "current")
    tmp_path.mkdir(exist_ok=True)
    for which in ("fast", "slow"):
        sqns = [s for s in range(600) if not (which == "slow" and s == lost)]
        demo.logs[which].write_text("".join(json.dumps({"sqn": s}) + "\n" for s in sqns))
    demo.samples = [Sample(fast_done * i / 10, 60 * i, min(60 * i, 45 * i), 6400)
                    for i in range(11)] + [Sample(8.0, 600, 600, 0)]
    demo.left = ["receiver-fast", "receiver-slow"]
    demo.procs["source"] = SimpleNamespace(  # type: ignore[assignment]
        log_since_start=lambda: f"ump source: in-flight bytes max {inflight} "
                                f"(ume_flight_size_bytes 3200)\n")
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        status = demo._verdict()
    return status, printed.getvalue()


def test_rpp_verdict_fails_an_unpaced_source_a_loss_and_an_overfull_flight(
        tmp_path: Path) -> None:
    status, out = _judged(tmp_path / "paced", 5.0)
    assert status == 0, out
    status, out = _judged(tmp_path / "unpaced", 0.5)
    assert status == 1 and "the source was not paced: it sent all 600 messages in 0.5 s" in out
    status, out = _judged(tmp_path / "lost", 5.0, lost=17)
    assert status == 1 and "the slow receiver: 1 missing (first [17])" in out
    status, out = _judged(tmp_path / "flight", 5.0, inflight=3264)
    assert status == 1 and "in-flight bytes 3264 exceeded ume_flight_size_bytes 3200" in out


def test_a_negative_consume_rate_is_a_clear_error(tmp_path: Path) -> None:
    # ump receiver --consume-rate R (the slow application of ump demo --rpp)
    result = subprocess.run([*_ump(), "receiver", "--topic", "demo.x", "--consume-rate", "-5"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "ump receiver: --consume-rate must be positive (0: at once), not -5.0" in result.stderr
    assert "Traceback" not in result.stderr
