"""Starting, stopping and restarting the implementation under test.

For a store IUT the harness writes, per configuration, a umestored XML file (the product's
format, so any umestored-compatible store reads it) naming an ``<lbm-config>`` file that points
topic resolution at the harness's resolver daemon; the profile's ``launch`` command is then
run with the placeholders filled (:data:`conformance.profile.PLACEHOLDERS`).  The IUT is ready
when its output shows the profile's ``ready`` text, or, without one, when its store port
accepts a connection.  Its output goes to ``iut.log`` in the work directory; the reports keep
the part written during each case.  The harness picks the store's port free; when a fresh IUT
exits before it is ready and its output says the address is in use (another process took the
port first), it is started again on another free port (:data:`PORT_ATTEMPTS` starts in all).

Consecutive cases that need the same configuration share one IUT process (they use different
topics), which keeps a full run short; a case that restarts or kills the IUT gets a fresh one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from conformance.evidence import Addr
from conformance.profile import PLACEHOLDERS, IutProfile
from conformance.verdicts import HarnessError, Unsupported
from reference_impl import rpp
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


RPP_ALLOW = "repository-allow-receiver-paced-persistence"
RPP_TOPIC_OPTIONS = frozenset([RPP_ALLOW, *(o.store_option for o in rpp.OVERRIDES)])
"""The topic options of receiver-paced persistence: whether a topic allows it, and the RPP
limits a source may lower (docs/semantics.md §2.2)."""


@dataclass(frozen=True)
class StoreSetup:
    """The options one IUT process runs with; equal setups can share a process."""

    store_options: tuple[tuple[str, str | int], ...] = ()
    topic_options: tuple[tuple[str, str | int], ...] = ()
    lbm_options: tuple[tuple[str, str | int], ...] = ()  # "scope option" lines of lbm.cfg

    @classmethod
    def of(cls, store: dict[str, str | int], topic: dict[str, str | int],
           lbm: dict[str, str | int] | None = None) -> StoreSetup:
        return cls(tuple(sorted(store.items())), tuple(sorted(topic.items())),
                   tuple(sorted((lbm or {}).items())))

    @property
    def custom(self) -> bool:
        return bool(self.store_options or self.topic_options or self.lbm_options)

    @property
    def rpp_only(self) -> bool:
        """The setup only says whether the topic allows RPP (and with which RPP limits,
        :data:`RPP_TOPIC_OPTIONS`): a store at an address offers such topics by name (profile
        ``rpp_topic``/``spp_topic``), and a pre-5.3 store has none."""
        names = {name for name, _ in self.topic_options}
        return not self.store_options and RPP_ALLOW in names and names <= RPP_TOPIC_OPTIONS


PORT_ATTEMPTS = 3
"""How often a fresh store IUT is started on another free port when the one the harness
picked was taken before the IUT could bind it (see :meth:`StoreUnderTest.start`)."""


def free_port(ip: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((ip, 0))
        return int(s.getsockname()[1])


class IutProcess:
    """What every IUT the harness launches shares: the launch command, the wait until it is
    ready, stopping it, and its log (``iut.log`` in the work directory)."""

    def __init__(self, profile: IutProfile, workdir: Path, resolver: Addr, *,
                 time_scale: float = 1.0) -> None:
        self.profile = profile
        # the IUT runs in this directory and gets paths inside it: they must not depend on
        # the harness's own working directory (the Runner already passes an absolute one)
        self.workdir = workdir.absolute()
        self.resolver = resolver
        self.time_scale = time_scale
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = self.workdir / "iut.log"
        self.starts = 0

    def placeholders(self) -> dict[str, str]:
        """The values of the launch placeholders (:data:`conformance.profile.PLACEHOLDERS`)."""
        return {name: "" for name in PLACEHOLDERS} | {
            "python": sys.executable, "workdir": str(self.workdir),
            "lbm_config": str(self.workdir / "lbm.cfg"),
            "resolver": f"{self.resolver[0]}:{self.resolver[1]}",
            "version": self.profile.version}

    def _launch(self, argv: list[str]) -> None:
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

    def _ready_without_marker(self) -> bool:
        """Whether the IUT counts as ready when the profile gives no ``ready`` text."""
        return True

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
            elif self._ready_without_marker():
                return
            time.sleep(0.02)
        raise HarnessError(f"the IUT was not ready within {timeout:.1f} s "
                           f"(waiting for {self.profile.ready or 'its port'}):\n{self.log_tail()}")

    def _start_offset(self) -> int:
        data = self.log_path.read_bytes()
        return data.rfind(b"\n=== ump conform: start #")

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

    def signal(self, sig: signal.Signals) -> None:
        """Send ``sig`` to the running IUT (a case's request, such as deregistering)."""
        if self.proc is None or self.proc.poll() is not None:
            raise HarnessError(f"the IUT is not running, so it cannot get {sig.name}")
        self.proc.send_signal(sig)

    def log_size(self) -> int:
        return self.log_path.stat().st_size if self.log_path.exists() else 0

    def log_since(self, offset: int) -> str:
        if not self.log_path.exists():
            return ""
        with self.log_path.open("rb") as fh:
            fh.seek(offset)
            return fh.read().decode("utf-8", "replace")

    def output(self) -> str:
        """What the IUT printed since its latest start (its log from the start marker on)."""
        return self.log_since(max(0, self._start_offset()))

    def log_tail(self, lines: int = 20) -> str:
        text = self.log_since(0)
        return "\n".join(text.splitlines()[-lines:])


class StoreUnderTest(IutProcess):
    """One store IUT: launched by the harness, or reached at the profile's address."""

    def __init__(self, profile: IutProfile, workdir: Path, resolver: Addr, setup: StoreSetup,
                 *, time_scale: float = 1.0) -> None:
        super().__init__(profile, workdir, resolver, time_scale=time_scale)
        self.setup = setup
        if profile.address is not None:
            self.addr: Addr = profile.address
        else:
            self.addr = ("127.0.0.1", free_port())
        self.web_monitor: Addr | None = \
            ("127.0.0.1", free_port()) if profile.web_monitor and profile.launches else None
        """Where the store's web monitor listens (profile ``web_monitor``), else None."""
        self.name = "conformance-store"
        """The ``<store>`` name and ``context-name`` in its XML: each instance of a group has
        its own (``conformance-store-<n>``, as its work directory), so its log lines, web
        monitor and ``ume_store_name`` resolution tell the instances apart."""
        self.group: tuple[Addr, ...] = ()
        """The Quorum/Consensus group this store is an instance of (profile ``instances``):
        its ``<lbm-config>`` file names them in ``source ume_store`` lines (group 0, RegID 0),
        the configuration the product creates its proxy sources from."""

    # --- configuration ------------------------------------------------------------------------

    def write_config(self) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        lbm = self.workdir / "lbm.cfg"
        lbm.write_text("# written by ump conform: topic resolution through the harness\n"
                       f"context resolver_unicast_daemon {self.resolver[0]}:{self.resolver[1]}\n"
                       + "".join(StoreEntry(addr).line() + "\n" for addr in self.group)
                       + "".join(f"{name} {value}\n" for name, value in self.setup.lbm_options))
        store = dict(BASE_STORE_OPTIONS)
        store["context-name"] = self.name
        store.update(dict(self.setup.store_options))
        topic = dict(BASE_TOPIC_OPTIONS)
        topic.update(dict(self.setup.topic_options))
        xml = store_daemon_xml([StoreXml(self.name, self.addr[1], self.addr[0],
                                         options=store,
                                         topics=[TopicXml(TOPIC_PATTERN, topic)])],
                               lbm_config="lbm.cfg",
                               web_monitor=None if self.web_monitor is None else
                               f"{self.web_monitor[0]}:{self.web_monitor[1]}")
        path = self.workdir / "store.xml"
        path.write_text(xml)
        return path

    def argv(self, config: Path) -> list[str]:
        assert self.profile.launch is not None
        values = self.placeholders() | {"config": str(config), "port": str(self.addr[1]),
                                        "topic": "conform.any"}
        return [arg.format(**values) for arg in self.profile.launch]

    # --- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        if self.setup.rpp_only and self.profile.version == "pre-5.3":
            raise Unsupported("the case needs a topic with an RPP option, which a pre-5.3 store "
                              "does not know (the profile's version is pre-5.3)")
        if self.profile.address is not None:
            if self.setup.custom and not self.setup.rpp_only:
                raise Unsupported("the case needs store options the harness cannot set on a "
                                  "running IUT (give a launch command in the profile)")
            # RPP-only topic options: the case uses the profile's rpp_topic / spp_topic
            # instead (or is unsupported without them; conformance.suites.rpp_matrix)
            self._wait_port(self.profile.start_timeout * self.time_scale)
            return
        fresh = self.starts == 0  # a restart keeps its port: the clients come back to it
        for attempt in range(1, PORT_ATTEMPTS + 1):
            config = self.write_config()
            try:
                self._launch(self.argv(config))
                return
            except HarnessError:
                if not (fresh and attempt < PORT_ATTEMPTS and self._port_was_taken()):
                    raise
            self.addr = (self.addr[0], free_port(self.addr[0]))

    def _port_was_taken(self) -> bool:
        """Whether the IUT exited because its port was in use (its output says so): another
        process took the port between :func:`free_port` and the IUT's bind."""
        if self.proc is None or self.proc.poll() is None:
            return False
        said = self.log_since(max(0, self._start_offset())).lower()
        return os.strerror(errno.EADDRINUSE).lower() in said

    def _ready_without_marker(self) -> bool:
        return self._port_open()

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

    def restart(self, *, kill: bool = False) -> None:
        """Stop (or SIGKILL) and start again on the same files: disk state survives."""
        if self.profile.address is not None:
            raise Unsupported("the case restarts the IUT, which needs a launch command")
        self.stop(kill=kill)
        self.start()

    def wipe(self) -> None:
        """Remove disk state and cache (a fresh IUT for the next case)."""
        for name in ("cache", "state"):
            with contextlib.suppress(FileNotFoundError):
                shutil.rmtree(self.workdir / name)


@dataclass(frozen=True)
class StoreEntry:
    """One ``ume_store`` line of a source IUT's configuration: a harness store's address, the
    RegID the source asks it for (0: let the store assign one) and its group index."""

    addr: Addr
    reg_id: int = 0
    group: int = 0

    def line(self) -> str:
        return f"source ume_store {self.addr[0]}:{self.addr[1]}:{self.reg_id}:{self.group}"


UmOptions = Mapping[str, str | int]
"""UM configuration options for a source or receiver IUT, keyed ``"<scope> <option>"`` (as
the flat file writes them: ``{"source ume_flight_size": 4}``)."""


def _holds_a_socket(pid: int) -> bool:
    """Whether process ``pid`` or one of its descendants has a socket open (Linux ``/proc``;
    True where there is no ``/proc`` to ask)."""
    if not Path("/proc/self/fd").is_dir():
        return True
    todo, seen = [pid], set()
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        try:
            if any(os.readlink(fd).startswith("socket:[")
                   for fd in Path(f"/proc/{current}/fd").iterdir()):
                return True
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except OSError:  # gone meanwhile, or a descriptor closed while we looked
            continue
    return False


class ClientUnderTest(IutProcess):
    """A source or receiver IUT, started by its case once the harness's peers listen.

    Its UM configuration file (``lbm.cfg``, the ``{config}`` and ``{lbm_config}``
    placeholders) points topic resolution at the harness's resolver daemon and, for a source,
    names the case's harness stores in ``ume_store`` lines; the case adds the options it needs.
    A receiver whose launch command uses ``{deliveries}`` appends every delivered message to
    that file as a JSON line with at least ``"sqn"`` (and ``"rx"``, true for a
    retransmission), which is how the delivery-order checks see what the application got.
    """

    addr: Addr | None = None

    def __init__(self, profile: IutProfile, workdir: Path, resolver: Addr, *,
                 time_scale: float = 1.0) -> None:
        super().__init__(profile, workdir, resolver, time_scale=time_scale)
        self.topic = ""
        self.stores: tuple[StoreEntry, ...] = ()
        self.deliveries_path = self.workdir / "deliveries.jsonl"
        self.acks_path = self.workdir / "acks.txt"  # the {acks} file (explicit ACKs)

    @property
    def reports_deliveries(self) -> bool:
        return any("{deliveries}" in arg for arg in self.profile.launch or ())

    def _ready_without_marker(self) -> bool:
        """A client IUT counts as started once its process (or a child of it: a launch
        command may be a wrapper script) holds a socket, its first sign of life on the network.

        Why: a case's deadlines (a PREG within 4 s, ...) judge the protocol, not how long an
        interpreter takes to load on a busy machine; a case once failed because the IUT's
        first packet came 4.03 s after the launch, with the next one a millisecond later.
        Without ``/proc`` (not Linux) the IUT counts as started at once, as before."""
        assert self.proc is not None
        return _holds_a_socket(self.proc.pid)

    def write_config(self, stores: tuple[StoreEntry, ...], groups: tuple[tuple[int, int], ...],
                     options: UmOptions) -> Path:
        self.workdir.mkdir(parents=True, exist_ok=True)
        lines = ["# written by ump conform: topic resolution through the harness, the "
                 "harness's stores",
                 f"context resolver_unicast_daemon {self.resolver[0]}:{self.resolver[1]}"]
        lines += [entry.line() for entry in stores]
        lines += [f"source ume_store_group {index}:{size}" for index, size in groups]
        for key, value in options.items():
            if len(key.split()) != 2:
                raise ValueError(f"UM option {key!r} must be written '<scope> <option>'")
            lines.append(f"{key} {value}")
        path = self.workdir / "lbm.cfg"
        path.write_text("\n".join(lines) + "\n")
        return path

    def argv(self, config: Path, extra: tuple[str, ...] = ()) -> list[str]:
        """The launch command with its placeholders filled, then ``extra`` (filled too)."""
        assert self.profile.launch is not None
        values = self.placeholders() | {
            "config": str(config), "topic": self.topic,
            "stores": ",".join(f"{s.addr[0]}:{s.addr[1]}" for s in self.stores),
            "deliveries": str(self.deliveries_path), "acks": str(self.acks_path)}
        return [arg.format(**values) for arg in (*self.profile.launch, *extra)]

    def start(self, topic: str, *, stores: tuple[StoreEntry, ...] = (),
              groups: tuple[tuple[int, int], ...] = (), options: UmOptions | None = None,
              nonblocking: bool = False, explicit_ack: bool = False,
              consume: bool = False) -> None:
        """Write the configuration and launch the IUT for ``topic``; with ``nonblocking``,
        with the profile's ``nonblocking_args`` after the launch command (unsupported
        without them); with ``explicit_ack``, with its ``explicit_ack_args`` (the
        application acknowledges what :meth:`ack` writes; unsupported without them); with
        ``consume``, with its ``consume_args`` (the application consumes what :meth:`ack`
        writes, in that order)."""
        extra: tuple[str, ...] = ()
        if explicit_ack:
            if self.profile.explicit_ack_args is None:
                raise Unsupported("the case needs a receiver that acknowledges explicitly, and "
                                  "the profile names no explicit_ack_args (the words that make "
                                  "it acknowledge what the {acks} file lists)")
            extra = self.profile.explicit_ack_args
        if consume:
            if self.profile.consume_args is None:
                raise Unsupported("the case needs a receiver whose application consumes out of "
                                  "order, and the profile names no consume_args (the words "
                                  "that make it consume what the {acks} file lists)")
            extra = self.profile.consume_args
        if nonblocking:
            if self.profile.nonblocking_args is None or self.profile.would_block_text is None:
                raise Unsupported("the case needs non-blocking sends, and the profile names "
                                  "no nonblocking_args and would_block_text (how to run the "
                                  "IUT with non-blocking sends, what it prints on \"would "
                                  "block\")")
            extra = self.profile.nonblocking_args
        if self.profile.launch is None:
            raise Unsupported(f"a {self.profile.role.value} IUT must be started by the harness "
                              f"(its configuration names the harness's peers): give a launch "
                              f"command in the profile")
        if self.running:
            raise HarnessError("the case started the IUT twice")
        self.topic, self.stores = topic, stores
        self.deliveries_path.unlink(missing_ok=True)
        self.acks_path.unlink(missing_ok=True)
        config = self.write_config(stores, groups, dict(options or {}))
        self._launch(self.argv(config, extra))

    def ack(self, sqn: int) -> None:
        """The application acknowledges (or consumes) ``sqn``: a line of the ``{acks}``
        file."""
        with self.acks_path.open("a") as f:
            f.write(f"{sqn}\n")

    def deliveries(self) -> list[dict[str, object]]:
        """What the IUT reported delivering so far (see the class docstring), oldest first."""
        if not self.deliveries_path.exists():
            return []
        out: list[dict[str, object]] = []
        for line in self.deliveries_path.read_text(errors="replace").splitlines():
            try:
                row = json.loads(line)
            except ValueError:
                continue  # a line the IUT is still writing
            if isinstance(row, dict) and isinstance(row.get("sqn"), int):
                out.append(row)
        return out
