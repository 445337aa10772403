"""``ume-qc-loopback.pcap``: a quorum/consensus deployment of the reference implementation on
loopback, recorded from the kernel (the guide's "Sources Using Quorum/Consensus",
docs/semantics.md §1.2, §1.12).

Unlike the files :mod:`captures.reference` writes from :mod:`wire` messages, this one is the
behavioural reference: real ``ump`` processes, every frame as the kernel saw it
(:class:`reference_impl.capture.LoopbackCapture`).  The deployment:

* ``ump resolver`` and three ``ump store`` processes with memory repositories, each in its own
  directory: store 0 alone in group 0, stores 1 and 2 in group 1 (``ume_store IP:PORT:0:GROUP``,
  ``ume_store_group 0:1`` and ``1:2``; intragroup ``quorum``, intergroup ``any``: group 0
  alone keeps messages stable while group 1 is short of a store);
* one ``ump source`` (LBT-TCP, ``ume_registration_interval`` 500 ms so it registers again
  soon after a store returns) and one ``ump receiver`` of the topic;
* registration of the source and the receiver with every store, SRI with the store-group
  records, data and stability ACKs from every store, consumption ACKs, keepalives;
* store 2 SIGKILLed once the receiver has :data:`KILL_AFTER` messages (the source sees it
  unresponsive), started again on the same port (empty: a memory repository), and the source
  registering with it again and getting its stability ACKs for what it sends afterwards.

``python -m captures.qc_loopback [OUT_DIR]`` rewrites ``OUT_DIR/ume-qc-loopback.pcap``
(default ``captures/reference``) with the resolver on 15380 and the stores on 14567-14569 and
writes the sidecar ``ume-qc-loopback.pcap.meta.json``: the ports (``dissect_args`` for
``ump dissect``), the groups, the killed store and the message count.  A loopback run is not
byte-reproducible; the test (``tests/reference_impl/test_qc_capture.py``) checks the committed
file and a fresh recording on free ports alike: no disagreement between ``ump dissect`` and
tshark, no malformed frame, no LBM/UME expert item, and the exchange above in the frames.

Frames of other processes are left out (:func:`reference_impl.run_frames.keep_run_frames`):
the capture filter names UM's port ranges, which other processes on the machine use too,
before, during and after the run.  The stores' and the resolver's ports (chosen for the run)
are its own throughout; the ports of UM's ranges the run's processes bound, only while the
process that bound them lived.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from reference_impl.config.store_xml_writer import disk_store_xml
from reference_impl.run_frames import RunPorts, Socket, bound_sockets, keep_run_frames

IP = "127.0.0.1"
NAME = "ume-qc-loopback.pcap"
TOPIC = "qc.reference"
GROUPS = (0, 1, 1)
"""The group of store 0, 1 and 2."""
GROUP_SIZES = {0: 1, 1: 2}
KILLED = 2
"""The store that is killed and returns."""
MESSAGES = 160
RATE = 40
"""Messages per second: the run lasts about four seconds, long enough for the killed store to
return and get data again."""
KILL_AFTER = 30
WELL_KNOWN_STORE_PORTS = (14567, 14568, 14569)
WELL_KNOWN_RESOLVER_PORT = 15380
START_TIMEOUT = 20.0
ROOT = Path(__file__).resolve().parents[1]


class QcCaptureError(RuntimeError):
    """The deployment did not do what the capture is meant to show (one line)."""


def free_port(kind: socket.SocketKind = socket.SOCK_STREAM) -> int:
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((IP, 0))
        return int(sock.getsockname()[1])


class _Proc:
    """One ``python -m ump`` process with its stderr in a log file that :meth:`wait_for`
    reads."""

    def __init__(self, args: list[str], cwd: Path, log: Path) -> None:
        self.args = args
        self.log = log
        self.spawned = time.time()
        """Wall-clock start and exit (:class:`~reference_impl.run_frames.RunPorts` windows)."""
        self.ended: float | None = None
        self.sockets: frozenset[Socket] = frozenset()
        self._fh: TextIO = log.open("a")
        self.offset = log.stat().st_size
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ump", *args], cwd=cwd, stdout=subprocess.DEVNULL,
            stderr=self._fh, env={**os.environ, "PYTHONPATH": str(ROOT)})

    def text(self) -> str:
        with self.log.open("rb") as fh:
            fh.seek(self.offset)
            return fh.read().decode("utf-8", "replace")

    def wait_for(self, text: str, timeout: float = START_TIMEOUT, count: int = 1) -> None:
        deadline = time.monotonic() + timeout
        while self.text().count(text) < count:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.text().strip().splitlines()[-1:] or ["(no output)"]
                raise QcCaptureError(f"ump {self.args[0]}: no {text!r} (x{count}) in "
                                     f"{self.log}; last line: {tail[0]}")
            time.sleep(0.05)

    def note_sockets(self) -> None:
        """Remember the ports it holds now: the run's while it lives."""
        self.sockets |= bound_sockets(self.proc.pid)

    def stop(self, sig: signal.Signals = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.ended is None:
            self.ended = time.time()
        self._fh.close()


@dataclass
class QcRun:
    """A recorded QC run: the capture and what its sidecar says."""

    pcap: Path
    store_ports: tuple[int, ...]
    resolver_port: int
    delivered: list[int]
    kept: int
    dropped: int

    def meta(self) -> dict[str, object]:
        ports = ",".join(str(p) for p in self.store_ports)
        return {
            "made_by": "python -m captures.qc_loopback",
            "topic": TOPIC, "messages": MESSAGES, "rate": RATE,
            "store_ports": list(self.store_ports), "resolver_port": self.resolver_port,
            "groups": list(GROUPS), "group_sizes": {str(k): v for k, v in GROUP_SIZES.items()},
            "killed_store": KILLED, "killed_after": KILL_AFTER,
            # the resolver's port as LBMR even when it is lbmrd's well-known one: tshark
            # decodes a client's LBMR to it by content otherwise, and keepalives fail that
            "dissect_args": ["--store-port", ports, "--lbmr-port", str(self.resolver_port)],
        }


def _source_config(resolver_port: int, store_ports: tuple[int, ...]) -> str:
    lines = [f"context resolver_unicast_daemon {IP}:{resolver_port}"]
    lines += [f"source ume_store {IP}:{port}:0:{group}"
              for port, group in zip(store_ports, GROUPS, strict=True)]
    lines += [f"source ume_store_group {index}:{size}" for index, size in GROUP_SIZES.items()]
    lines += ["source ume_registration_interval 500"]
    return "\n".join(lines) + "\n"


def record(pcap: Path, workdir: Path, *, store_ports: tuple[int, ...] | None = None,
           resolver_port: int | None = None) -> QcRun:
    """Run the deployment of the module docstring while capturing to ``pcap``; ports
    ``None`` are free ones.  Raises :class:`QcCaptureError` when a process does not come up
    or the run does not show a store leaving and returning, and
    :class:`reference_impl.capture.CaptureError` when the capture cannot be taken."""
    from reference_impl.capture import LoopbackCapture

    stores = store_ports or tuple(free_port() for _ in GROUPS)
    resolver = resolver_port or free_port(socket.SOCK_DGRAM)
    workdir.mkdir(parents=True, exist_ok=True)
    for index, port in enumerate(stores):
        home = workdir / f"store{index}"
        home.mkdir(exist_ok=True)
        (home / "store.xml").write_text(disk_store_xml(f"qc-store-{index}", port, r"qc\..*",
                                                       repository="memory"))
    (workdir / "source.cfg").write_text(_source_config(resolver, stores))
    (workdir / "receiver.cfg").write_text(f"context resolver_unicast_daemon {IP}:{resolver}\n")
    out = workdir / "receiver.jsonl"
    out.unlink(missing_ok=True)

    def store(index: int) -> _Proc:
        home = workdir / f"store{index}"
        return _Proc(["store", "-c", "store.xml", "--resolver", f"{IP}:{resolver}", "-v"],
                     home, home / "store.log")

    procs: list[_Proc] = []
    cap = LoopbackCapture(pcap, ports=[*stores, resolver, *range(14360, 14396)])
    cap.start()
    try:
        lbmrd = _Proc(["resolver", "--listen", f"{IP}:{resolver}", "-v"], workdir,
                      workdir / "resolver.log")
        procs.append(lbmrd)
        lbmrd.wait_for("listening on")
        running = [store(i) for i in range(len(stores))]
        procs += running
        for proc in running:
            proc.wait_for("ready to accept registrations")
        receiver = _Proc(["receiver", "-c", "receiver.cfg", "--topic", TOPIC, "--out",
                          out.name, "--count", str(MESSAGES), "-v"], workdir,
                         workdir / "receiver.log")
        source = _Proc(["source", "-c", "source.cfg", "--topic", TOPIC, "--count",
                        str(MESSAGES), "--rate", str(RATE), "--wait-start", "-v"], workdir,
                       workdir / "source.log")
        procs += [receiver, source]
        source.wait_for("ump source: registered")
        receiver.wait_for("registration complete")
        for proc in procs:
            proc.note_sockets()
        source.proc.send_signal(signal.SIGUSR2)  # everyone registered: the data may start
        deadline = time.monotonic() + START_TIMEOUT
        while _delivered(out) < KILL_AFTER:
            if time.monotonic() > deadline:
                raise QcCaptureError(f"the receiver got {_delivered(out)} messages, not "
                                     f"{KILL_AFTER}; see {workdir / 'receiver.log'}")
            time.sleep(0.02)
        running[KILLED].stop(signal.SIGKILL)
        source.wait_for(f"store {KILLED} [{IP}:{stores[KILLED]}] unresponsive")
        back = store(KILLED)
        procs.append(back)
        back.wait_for("ready to accept registrations")
        back.note_sockets()
        source.wait_for(f"SourceRegistrationSuccess(store=StoreInfo(index={KILLED},",
                        count=2)
        if source.proc.wait(timeout=60) != 0 or receiver.proc.wait(timeout=60) != 0:
            raise QcCaptureError(f"the source or the receiver failed; see {workdir}")
    finally:
        for proc in reversed(procs):
            proc.stop()
        cap.stop()
    run = RunPorts.always({*stores, resolver})
    for proc in procs:
        run.add(proc.sockets, proc.spawned, proc.ended)
    kept, dropped = keep_run_frames(pcap, run)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return QcRun(pcap, stores, resolver, [int(r["sqn"]) for r in rows], kept, dropped)


def _delivered(path: Path) -> int:
    try:
        return len(path.read_text().splitlines())
    except FileNotFoundError:
        return 0


def write_sidecar(run: QcRun) -> Path:
    path = run.pcap.with_name(run.pcap.name + ".meta.json")
    path.write_text(json.dumps(run.meta(), indent=1) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    import tempfile

    args = sys.argv[1:] if argv is None else argv
    out_dir = Path(args[0]) if args else Path(__file__).parent / "reference"
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ump-qc-") as tmp:
        # recorded aside: a failed run leaves the committed files as they were
        try:
            run = record(Path(tmp) / NAME, Path(tmp) / "work",
                         store_ports=WELL_KNOWN_STORE_PORTS,
                         resolver_port=WELL_KNOWN_RESOLVER_PORT)
        except (QcCaptureError, RuntimeError) as exc:
            print(f"captures.qc_loopback: {exc}", file=sys.stderr)
            return 1
        if run.delivered != list(range(MESSAGES)):
            print(f"captures.qc_loopback: the receiver delivered {len(run.delivered)} "
                  f"messages, not 0..{MESSAGES - 1} once each", file=sys.stderr)
            return 1
        sidecar = write_sidecar(run)
        pcap = out_dir / NAME
        shutil.move(run.pcap, pcap)  # /tmp may be another file system
        shutil.move(sidecar, out_dir / sidecar.name)
    print(f"{pcap} ({run.kept} frames; {run.dropped} of other processes left out), "
          f"{out_dir / sidecar.name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
