"""``ump demo``: the whole reference implementation on loopback, with crashes on purpose.

It writes a umestored XML file and two UM configuration files into a work directory, starts
``ump resolver``, ``ump store`` (disk repository), ``ump receiver`` and ``ump source`` as
separate processes (the source's data on LBT-TCP, or LBT-RU with ``--transport lbt-ru``),
then:

1. kills the receiver with SIGKILL a third of the way through and restarts it (it
   re-registers with its Session ID and recovers from the store what it missed);
2. kills the source with SIGKILL two thirds of the way through and restarts it (it
   re-registers with its Session ID and resumes after the sequence number the store holds);
3. checks the receiver's delivery log: every sequence number from 0 to N-1 exactly once and in
   order, and says how many came from recovery.

The receiver de-duplicates at the application level (``--dedupe``: it skips what its own log
already has), as the guide asks applications to do, because a receiver killed between
consuming and acknowledging a message receives it again after its restart.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from reference_impl.config.store_xml_writer import disk_store_xml

TOPIC = "demo.persistent.topic"

SOURCE_CFG = """# the demo source: one store, a Session ID so a restart finds its RegID again
context resolver_unicast_daemon 127.0.0.1:15380
source ume_store 127.0.0.1:{port}
source ume_session_id 0x5E55100
source ume_flight_size 2000
source transport {transport}
"""

RECEIVER_CFG = """# the demo receiver: a Session ID so a restart re-registers as the same receiver
context resolver_unicast_daemon 127.0.0.1:15380
receiver ume_session_id 0x5E55200
"""


class Demo:
    def __init__(self, messages: int, workdir: Path, store_port: int, profile: str,
                 transport: str = "tcp") -> None:
        self.messages = messages
        self.transport = transport
        self.dir = workdir
        self.port = store_port
        self.profile = profile
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.deliveries = workdir / "deliveries.jsonl"

    def _ump(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.dir / f"{name}.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-m", "ump", *args, "--profile", self.profile,
                                 "-v"], cwd=self.dir, stdout=log, stderr=log)
        self.procs[name] = proc
        return proc

    def _wait_log(self, name: str, text: str, timeout: float = 20.0) -> None:
        path = self.dir / f"{name}.log"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if path.exists() and text in path.read_text(errors="replace"):
                return
            if self.procs[name].poll() is not None:
                raise SystemExit(f"ump demo: {name} exited early; see {path}")
            time.sleep(0.05)
        raise SystemExit(f"ump demo: {name} did not say {text!r} within {timeout} s; see {path}")

    def delivered(self) -> list[dict[str, object]]:
        if not self.deliveries.exists():
            return []
        out = []
        for line in self.deliveries.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def start_receiver(self) -> None:
        self._ump("receiver", "receiver", "-c", "receiver.cfg", "--topic", TOPIC,
                  "--out", str(self.deliveries), "--dedupe")

    def start_source(self) -> None:
        self._ump("source", "source", "-c", "source.cfg", "--topic", TOPIC,
                  "--until-sqn", str(self.messages), "--rate", str(self.rate),
                  "--linger", "5")

    def kill(self, name: str) -> None:
        proc = self.procs[name]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
        for proc in self.procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()

    def run(self) -> int:
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        (d / "store.xml").write_text(disk_store_xml(
            "demo-store", self.port, r"demo\..*", web_monitor=f"127.0.0.1:{self.port + 1}"))
        (d / "source.cfg").write_text(SOURCE_CFG.format(port=self.port,
                                                        transport=self.transport))
        (d / "receiver.cfg").write_text(RECEIVER_CFG)
        self.rate = max(200, self.messages // 10)  # about ten seconds of traffic
        print(f"ump demo: work directory {d}", file=sys.stderr)
        try:
            self._ump("resolver", "resolver")
            self._ump("store", "store", "-c", "store.xml")
            self._wait_log("store", "ready to accept registrations")
            self.start_receiver()
            self.start_source()
            return self._watch()
        finally:
            self.stop_all()

    def _watch(self) -> int:
        n = self.messages
        receiver_killed = source_killed = False
        deadline = time.monotonic() + 60 + n / self.rate
        bar = tqdm(total=n, desc="delivered", unit="msg", disable=not sys.stderr.isatty())
        seen = 0
        while time.monotonic() < deadline:
            count = len(self.delivered())
            bar.update(count - seen)
            seen = count
            if not receiver_killed and count >= n // 3:
                bar.write("ump demo: SIGKILL receiver, restarting it")
                self.kill("receiver")
                receiver_killed = True
                time.sleep(0.5)
                self.start_receiver()
            elif receiver_killed and not source_killed and count >= 2 * n // 3:
                bar.write("ump demo: SIGKILL source, restarting it")
                self.kill("source")
                source_killed = True
                time.sleep(0.5)
                self.start_source()
            if count >= n:
                break
            time.sleep(0.05)
        bar.close()
        return self._verdict()

    def _verdict(self) -> int:
        rows = self.delivered()
        sqns = [int(r["sqn"]) for r in rows]  # type: ignore[call-overload]
        recovered = sum(1 for r in rows if r["rx"])
        expected = list(range(self.messages))
        ok = sqns == expected
        print(f"ump demo: {len(sqns)} messages delivered, {len(set(sqns))} distinct, "
              f"{recovered} recovered from the store after the receiver restart")
        if ok:
            print(f"ump demo: PASS: every message 0..{self.messages - 1} arrived once and "
                  f"in order, across a receiver crash and a source crash")
            return 0
        missing = sorted(set(expected) - set(sqns))
        dupes = len(sqns) - len(set(sqns))
        disorder = sum(1 for a, b in itertools.pairwise(sqns) if b <= a)
        print(f"ump demo: FAIL: {len(missing)} missing (first {missing[:10]}), {dupes} "
              f"duplicates, {disorder} out of order; logs in {self.dir}")
        return 1


def run_demo(*, messages: int = 3000, workdir: str | None = None, store_port: int = 14567,
             capture: str | None = None, profile: str = "current",
             transport: str = "tcp") -> int:
    if workdir is None:
        base = Path(tempfile.mkdtemp(prefix="ump-demo-"))
    else:
        base = Path(workdir)
        if (base / "deliveries.jsonl").exists():
            os.remove(base / "deliveries.jsonl")
    demo = Demo(messages, base, store_port, profile, transport)
    if capture is None:
        return demo.run()
    from reference_impl.capture import CaptureError, LoopbackCapture
    ports = [store_port, 15380, *range(14360, 14396)]  # LBT-RU 14360-14389 too
    try:
        with LoopbackCapture(Path(capture).resolve(), ports=ports) as cap:
            code = demo.run()
    except CaptureError as exc:
        print(f"ump demo: {exc}", file=sys.stderr)
        return 2
    print(f"ump demo: {cap.frames} frames captured to {capture}")
    return code or check_capture(Path(capture), store_port)


def check_capture(path: Path, store_port: int) -> int:
    """Decode the capture with wire/ and with tshark and compare every field."""
    from wire.dissect import check_against_tshark, dissect_file
    from wire.tshark import PortMap

    ports = PortMap(store_ports=[store_port])
    reports = list(dissect_file(path, ports))
    um = sum(1 for r in reports if r.status == "um")
    bad = [r for r in reports if r.status not in ("um", "not-um")]
    disagreements = check_against_tshark(path, reports, ports)
    print(f"ump demo: {um} UM frames; {len(bad)} malformed; {len(disagreements)} "
          f"disagreements with tshark (ump dissect {path} --store-port {store_port} "
          f"--check-tshark shows them)")
    return 1 if bad or disagreements else 0
