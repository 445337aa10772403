"""Starting, stopping and restarting the implementation under test.

For a store IUT the harness writes, per configuration, a umestored XML file (the product's
format, so any umestored-compatible store reads it) naming an ``<lbm-config>`` file that points
topic resolution at the harness's resolver daemon; the profile's ``launch`` command is then
run with the placeholders filled (:data:`conformance.profile.PLACEHOLDERS`).  The IUT is ready
when its output shows the profile's ``ready`` text, or, without one, when its store port
accepts a connection.  Its output goes to ``iut.log`` in the work directory; the reports keep
the part written during each case.

Consecutive cases that need the same configuration share one IUT process (they use different
topics), which keeps a full run short; a case that restarts or kills the IUT gets a fresh one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from conformance.evidence import Addr
from conformance.model import HarnessError, Unsupported
from conformance.profile import IutProfile
from reference_impl.config.store_xml_writer import StoreXml, TopicXml, store_daemon_xml

TOPIC_PATTERN = r"conform\..*"
"""Every case's topic matches this pattern (``conform.<case id>.<n>``)."""

BASE_STORE_OPTIONS: dict[str, str | int] = {
    "context-name": "conformance-store",
    "disk-cache-directory": "cache",
    "disk-state-directory": "state",
}
BASE_TOPIC_OPTIONS: dict[str, str | int] = {
    "repository-type": "memory",
    # far above what any case sends: a case decides itself when messages may be released
    "repository-size-threshold": 64 << 20,
    "repository-size-limit": 128 << 20,
}


@dataclass(frozen=True)
class StoreSetup:
    """The options one IUT process runs with; equal setups can share a process."""

    store_options: tuple[tuple[str, str | int], ...] = ()
    topic_options: tuple[tuple[str, str | int], ...] = ()

    @classmethod
    def of(cls, store: dict[str, str | int], topic: dict[str, str | int]) -> StoreSetup:
        return cls(tuple(sorted(store.items())), tuple(sorted(topic.items())))

    @property
    def custom(self) -> bool:
        return bool(self.store_options or self.topic_options)


def free_port(ip: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


class StoreUnderTest:
    """One store IUT: launched by the harness, or reached at the profile's address."""

    def __init__(self, profile: IutProfile, workdir: Path, resolver: Addr, setup: StoreSetup,
                 *, time_scale: float = 1.0) -> None:
        self.profile = profile
        self.workdir = workdir
        self.resolver = resolver
        self.setup = setup
        self.time_scale = time_scale
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = workdir / "iut.log"
        if profile.address is not None:
            self.addr: Addr = profile.address
        else:
            self.addr = ("127.0.0.1", free_port())
        self.starts = 0

    # --- configuration ------------------------------------------------------------------------

    def write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        lbm = self.workdir / "lbm.cfg"
        lbm.write_text("# written by ump conform: topic resolution through the harness\n"
                       f"context resolver_unicast_daemon {self.resolver[0]}:{self.resolver[1]}\n")
        store = dict(BASE_STORE_OPTIONS)
        store.update(dict(self.setup.store_options))
        topic = dict(BASE_TOPIC_OPTIONS)
        topic.update(dict(self.setup.topic_options))
        xml = store_daemon_xml([StoreXml("conformance-store", self.addr[1], self.addr[0],
                                         options=store,
                                         topics=[TopicXml(TOPIC_PATTERN, topic)])],
                               lbm_config="lbm.cfg")
        path = self.workdir / "store.xml"
        path.write_text(xml)
        return path

    def argv(self, config: Path) -> list[str]:
        assert self.profile.launch is not None
        values = {"python": sys.executable, "config": str(config),
                  "lbm_config": str(self.workdir / "lbm.cfg"), "workdir": str(self.workdir),
                  "port": str(self.addr[1]), "resolver": f"{self.resolver[0]}:{self.resolver[1]}",
                  "topic": "conform.any", "version": self.profile.version}
        return [arg.format(**values) for arg in self.profile.launch]

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self.profile.address is not None:
            if self.setup.custom:
                raise Unsupported("the case needs store options the harness cannot set on a "
                                  "running IUT (give a launch command in the profile)")
            self._wait_port(self.profile.start_timeout * self.time_scale)
            return
        config = self.write_config()
        argv = self.argv(config)
        self.starts += 1
        with self.log_path.open("ab") as log:
            log.write(f"\n=== ump conform: start #{self.starts}: {' '.join(argv)}\n".encode())
            log.flush()
            try:
                self.proc = subprocess.Popen(argv, cwd=self.workdir, stdout=log,
                                             stderr=subprocess.STDOUT,
                                             env={**os.environ, "PYTHONUNBUFFERED": "1"})
            except OSError as exc:
                raise HarnessError(f"cannot start the IUT ({argv[0]}): "
                                   f"{exc.strerror or exc}") from None
        self._wait_ready(self.profile.start_timeout * self.time_scale)

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        marker = (self.profile.ready or "").encode()
        start_offset = self._start_offset()
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise HarnessError(f"the IUT exited with code {self.proc.returncode} before it "
                                   f"was ready:\n{self.log_tail()}")
            if marker:
                with self.log_path.open("rb") as fh:
                    fh.seek(start_offset)
                    if marker in fh.read():
                        return
            elif self._port_open():
                return
            time.sleep(0.02)
        raise HarnessError(f"the IUT was not ready within {timeout:.1f} s "
                           f"(waiting for {self.profile.ready or 'its port'}):\n{self.log_tail()}")

    def _start_offset(self) -> int:
        data = self.log_path.read_bytes()
        return data.rfind(b"\n=== ump conform: start #")

    def _port_open(self) -> bool:
        try:
            with socket.create_connection(self.addr, timeout=0.2):
                return True
        except OSError:
            return False

    def _wait_port(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._port_open():
                return
            time.sleep(0.05)
        raise HarnessError(f"nothing accepts connections at {self.addr[0]}:{self.addr[1]}")

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, *, kill: bool = False) -> None:
        """Stop the IUT (the profile's stop signal, SIGKILL after 5 s or when ``kill``)."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL if kill else self.profile.stop_signal)
            try:
                proc.wait(timeout=5 * self.time_scale)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.proc = None

    def restart(self, *, kill: bool = False) -> None:
        """Stop (or SIGKILL) and start again on the same files: disk state survives."""
        if self.profile.address is not None:
            raise Unsupported("the case restarts the IUT, which needs a launch command")
        self.stop(kill=kill)
        self.start()

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, offset: int) -> str:
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace")

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_since(0)
        return "\n".join(text.splitlines()[-lines:])

    def wipe(self) -> None:
        """Remove disk state and cache (a fresh IUT for the next case)."""
        for name in ("cache", "state"):
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(self.workdir / name)
