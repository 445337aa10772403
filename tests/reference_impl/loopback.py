"""``ump`` processes on loopback for tests: a resolver daemon and a store on free ports, and
sources or receivers started against them, each a real subprocess whose stderr is collected
as it comes (so a test can wait for a line, then signal the process at that moment)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from reference_impl.config.store_xml_writer import disk_store_xml
from reference_impl.run_frames import RunPorts, Socket, bound_sockets

ROOT = Path(__file__).resolve().parents[2]
IP = "127.0.0.1"


def free_port(kind: int = socket.SOCK_STREAM) -> int:
    """A port the kernel just handed out (closed again: good enough on a test machine)."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind((IP, 0))
        port: int = sock.getsockname()[1]
        return port


def stop_processes(procs: Iterable[subprocess.Popen[bytes]], timeout: float = 5.0) -> None:
    """Ctrl-C every process still running, then wait for each; one that does not stop within
    ``timeout`` is killed (a test never leaves a daemon behind)."""
    procs = list(procs)
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class Proc:
    """One ``python -m ump ...`` process; its stderr is read by a thread into :attr:`lines`."""

    def __init__(self, args: Sequence[str], cwd: Path) -> None:
        self.args = list(args)
        self.spawned = time.time()
        """Wall-clock time (the clock of capture timestamps) before the start."""
        self.ended: float | None = None
        """Wall-clock time its stderr ended (it exited), ``None`` before."""
        self.ports: set[Socket] = set()
        """The ports :meth:`note_ports` saw it hold."""
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ump", *args], cwd=cwd, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, env={**os.environ, "PYTHONPATH": str(ROOT)})
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for raw in self.proc.stderr:
            with self._changed:
                self.lines.append(raw.decode("utf-8", "backslashreplace"))
                self._changed.notify_all()
        with self._changed:
            self.ended = time.time()
            self._changed.notify_all()

    def note_ports(self) -> None:
        """Remember the ports it holds now (its own in a capture while it lives)."""
        self.ports |= bound_sockets(self.proc.pid)

    @property
    def stderr(self) -> str:
        with self._changed:
            return "".join(self.lines)

    def wait_for(self, text: str, timeout: float = 20.0) -> None:
        """Block until a stderr line contains ``text``; AssertionError (with stderr) if the
        process exits or ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while not any(text in line for line in self.lines):
                left = deadline - time.monotonic()
                if left <= 0 or (self.proc.poll() is not None and not self._reader.is_alive()):
                    raise AssertionError(f"ump {' '.join(self.args)}: no {text!r} on stderr:\n"
                                         + "".join(self.lines))
                self._changed.wait(min(left, 0.1))

    def finish(self, timeout: float = 20.0) -> int:
        """Wait for the exit (SIGKILL after ``timeout``) and the end of its stderr."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"ump {' '.join(self.args)} did not exit within {timeout} s:\n"
                                 + self.stderr) from None
        self._reader.join(5)
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def run_ports(procs: Iterable[Proc], always: Iterable[int] = ()) -> RunPorts:
    """The ports a captured run held, and when (:func:`reference_impl.run_frames.
    keep_run_frames`): ``always`` (ports chosen for it, and the test process's own) for the
    whole capture, each process's :attr:`Proc.ports` from its start to its exit."""
    run = RunPorts.always(always)
    for proc in procs:
        run.add(proc.ports, proc.spawned, proc.ended)
    return run


@dataclass
class Loopback:
    """A resolver and a store running; :meth:`client_config` points a client at them."""

    workdir: Path
    resolver_port: int
    store_port: int
    store: Proc

    def client_config(self, name: str, *lines: str) -> Path:
        path = self.workdir / name
        path.write_text("\n".join([f"context resolver_unicast_daemon {IP}:{self.resolver_port}",
                                   f"source ume_store {IP}:{self.store_port}", *lines]) + "\n")
        return path

    def start(self, *args: str) -> Proc:
        return Proc(args, self.workdir)


@contextmanager
def loopback(workdir: Path, pattern: str = ".*") -> Iterator[Loopback]:
    """A resolver daemon and a disk store (topics matching ``pattern``) on free ports."""
    resolver_port, store_port = free_port(socket.SOCK_DGRAM), free_port()
    (workdir / "store.xml").write_text(disk_store_xml("test-store", store_port, pattern))
    procs = [Proc(["resolver", "--listen", f"{IP}:{resolver_port}"], workdir)]
    try:
        store = Proc(["store", "-c", "store.xml", "--resolver", f"{IP}:{resolver_port}"],
                     workdir)
        procs.append(store)
        store.wait_for("ready to accept registrations")
        yield Loopback(workdir, resolver_port, store_port, store)
    finally:
        for proc in procs:
            proc.stop()
