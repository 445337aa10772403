"""``ump demo``: the whole reference implementation on loopback, with crashes on purpose
(``--rpp``: receiver-paced persistence, a source paced by its slowest receiver).

It writes a umestored XML file and two UM configuration files into a work directory, starts
``ump resolver``, ``ump store`` (disk repository), ``ump receiver`` and ``ump source`` as
separate processes (the source's data on LBT-TCP, or LBT-RU with ``--transport lbt-ru``, or
LBT-RM with ``--transport lbt-rm``: multicast on loopback, see ``scripts/ensure-multicast``),
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

Every process the demo starts is checked as started: the resolver and the store must say
they listen, the source and the receiver that they registered, each within a start timeout,
and a process that exits before that ends the demo at once with one line naming it (and the
address it could not bind, when that is why).  Exit status: 0 PASS; 1 the deployment came up
and the run failed (a message missing, duplicated or out of order, a process that died during
the run, a restarted process that did not register again); 2 the deployment did not come up
(a port taken, a process that could not start) or a capture could not be taken.

Ports: the resolver and the store take free ports chosen at start unless ``--resolver-port``
or ``--store-port`` name one; with ``--capture`` they default to UM's well-known 15380 and
14567, so the capture decodes with tshark's and Wireshark's defaults.  ``0`` always means a
free port.  The web monitor takes a free port.  The source's and receiver's own ports come
from UM's port ranges (first free), as in the product.

**``--rpp``: receiver-paced persistence** (guide "Receiver-paced Persistence Operations",
docs/semantics.md §1.13).  No crashes; instead the store's topic allows RPP on a *memory*
repository (our choice: it acknowledges on reception, so what paces the source is RPP's
withholding, not the disk), with a repository size limit of :data:`RPP_LIMIT_MESSAGES` messages
and a topic flight-size maximum twice the source's; the source is an RPP source whose
``ume_flight_size_bytes`` (:data:`RPP_FLIGHT_MESSAGES` messages) travels to the store as an
override; two *blocking* RPP receivers register before the first message (the source runs with
``--wait-start`` and gets SIGUSR2 once both registered: an RPP receiver that registers after
the first message gets nothing sent before, semantics §1.14), one consuming at once, one
slow (``ump receiver --consume-rate R``, R = messages / :data:`RPP_SECONDS`).  The source sends
as fast as it may.  The store keeps each message until both consumed it and withholds
stability ACKs while less than one flight size of room is left, so the source's flight size
stops it: the source is paced by the slow receiver.  The demo samples the delivery logs and
the store's web monitor JSON while it runs, and checks

1. both delivery logs: every sequence number 0..N-1 exactly once, in order (nothing lost);
2. the source's rate (the fast receiver's deliveries, which follow the source's sends) is
   at most the slow receiver's rate plus what the repository and one flight can hold, i.e.
   the source took at least ``(N - (limit + flight) / size) / R`` seconds (80 % of it, for
   the sampling), where an unpaced source takes a fraction of a second;
3. the most messages the fast receiver was ahead of the slow one fits the repository size
   limit plus one flight (plus the slow consumer's one-tick ACK lag);
4. the source's own figure (its ``in-flight bytes max`` line) is at most its
   ``ume_flight_size_bytes``;
5. both receivers, sent SIGUSR1 once they consumed everything, deregister ("RPP
   Deregistration") within 10 s;

and prints how the source was paced.  Exit status as above: 1 when a check fails.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from reference_impl.config.store_xml_writer import disk_store_xml
from reference_impl.events import ReceiverRegistrationComplete
from reference_impl.run_frames import RunPorts, Socket, bound_sockets, keep_run_frames

TOPIC = "demo.persistent.topic"
WELL_KNOWN_RESOLVER_PORT = 15380
"""The resolver port UM and tshark assume (``resolver_unicast_daemon``'s usual port)."""
WELL_KNOWN_STORE_PORT = 14567
"""The store port of the product's example configuration (tshark needs it given)."""
START_TIMEOUT = 20.0
"""Seconds the resolver and the store get to say they listen (a loaded 2-core machine starts
a Python process in one or two)."""
TRAFFIC_SECONDS = 6.0
"""How long the source's traffic lasts, whatever ``--messages`` is (the rate follows).  Why a
duration and not a fixed rate: the receiver restarted a third of the way through finds its
source, and through it the store, only while the source still runs; a short run at a high
rate ended before the restarted receiver was back, which then never registered.  The last
two thirds, four seconds, leave a loaded machine time to start a Python process (one to two
seconds) and register (a fraction of one)."""
REGISTER_TIMEOUT = 40.0
"""Seconds a source or receiver gets to say it registered; more than the source's own 30 s
registration limit, so the source's message, not ours, says why when it gives up."""

SOURCE_CFG = """# the demo source: one store, a Session ID so a restart finds its RegID again
context resolver_unicast_daemon 127.0.0.1:{resolver}
source ume_store 127.0.0.1:{port}
source ume_session_id 0x5E55100
source ume_flight_size 2000
source transport {transport}
"""

RECEIVER_CFG = """# the demo receiver: a Session ID so a restart re-registers as the same receiver
context resolver_unicast_daemon 127.0.0.1:{resolver}
receiver ume_session_id 0x5E55200
"""


class DemoError(Exception):
    """The demo cannot go on; the message is one line, ``status`` the exit status."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


def free_port(kind: socket.SocketKind) -> int:
    """A port of ``kind`` nobody has bound on 127.0.0.1 right now (the process given it binds
    it a moment later; if another takes it meanwhile, the started-check reports it)."""
    with socket.socket(socket.AF_INET, kind) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Started:
    """One process the demo started, and the line of output that says it is up.

    Attributes:
        name: resolver, store, source or receiver (also its log's name).
        proc: the process.
        log: its log file, appended to across restarts.
        offset: where this start's output begins in ``log``.
        ready: the text its output shows once it serves (or registered).
        doing: what ``ready`` means, for messages ("listen", "register").
        addresses: what it binds, for the message when it cannot ("127.0.0.1:15380"); the
            one its output names is the one reported.
        option: the ``ump demo`` option that moves the first address ("--resolver-port"),
            named in that message.
        timeout: seconds from its start by which ``ready`` must have appeared.
        status: the exit status the demo ends with if it does not come up.
        started_at: its start, on the monotonic clock.
        is_ready: whether ``ready`` has appeared.
        seen: the output read so far (from ``offset``), until ``ready`` appeared.
        read_to: the log position ``seen`` ends at.
        ports: the ports it had bound once ready (its listening TCP and bound UDP sockets,
            read from ``/proc``), which tell its traffic from other processes' in a capture.
        spawned: wall-clock time (``time.time()``, the clock of capture timestamps) just
            before it was started: it bound nothing before.
        ended: wall-clock time its exit was first seen (``None`` while it runs): it held
            nothing after.  With ``spawned``, when its ports were its own in a capture
            (:class:`reference_impl.run_frames.RunPorts`).
    """

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    offset: int
    ready: str
    doing: str
    addresses: tuple[str, ...]
    timeout: float
    status: int
    started_at: float
    option: str = ""
    is_ready: bool = False
    seen: bytes = b""
    read_to: int = 0
    ports: frozenset[Socket] = frozenset()
    spawned: float = field(default_factory=time.time)
    ended: float | None = None

    def note_exit(self) -> bool:
        """Whether it has exited; the first time it is seen so, :attr:`ended` is set."""
        if self.proc.poll() is None:
            return False
        if self.ended is None:
            self.ended = time.time()
        return True

    def poll_ready(self) -> bool:
        """Whether it came up; :class:`DemoError` when it exited or its time ran out first."""
        if self.is_ready:
            return True
        with self.log.open("rb") as fh:
            fh.seek(max(self.offset, self.read_to))
            self.seen += fh.read()
            self.read_to = fh.tell()
        if self.ready.encode() in self.seen:
            self.is_ready = True
            self.seen = b""
            self.ports = bound_sockets(self.proc.pid)
            return True
        code = self.proc.poll()
        if code is not None:
            raise DemoError(self.failure(f"exited with status {code} before it was ready"),
                            self.status)
        if time.monotonic() > self.started_at + self.timeout:
            raise DemoError(self.failure(f"did not {self.doing} within {self.timeout:.0f} s"),
                            self.status)
        return False

    def failure(self, what: str) -> str:
        """One line: why it did not come up, from its own last words."""
        text = self.log_since_start()
        if os.strerror(errno.EADDRINUSE).lower() in text.lower() and self.addresses:
            said = last_line(text)
            named = [a for a in self.addresses
                     if re.search(rf"\b{a.rsplit(':', 1)[1]}\b", said)]
            where = (named or self.addresses)[0]
            hint = f" ({self.option} 0 takes a free one)" \
                if self.option and where == self.addresses[0] else ""
            return (f"{self.name} could not bind {where}: address in use{hint}; "
                    f"see {self.log}")
        said = f": {last_line(text)}" if text.strip() else " (no output)"
        return f"{self.name} {what}{said}; see {self.log}"

    def log_since_start(self) -> str:
        with self.log.open("rb") as fh:
            fh.seek(self.offset)
            return fh.read().decode("utf-8", "replace")


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


class Demo:
    """One demo run: its work directory, ports and processes (see the module docstring).

    Kept as an object because the capture (:func:`run_demo`) needs the ports before the run
    and the ports the processes bound after it."""

    def __init__(self, messages: int, workdir: Path, store_port: int, profile: str,
                 transport: str = "tcp", resolver_port: int = WELL_KNOWN_RESOLVER_PORT
                 ) -> None:
        self.messages = messages
        self.transport = transport
        # absolute: every process runs in it and gets paths inside it
        self.dir = workdir.absolute()
        self.port = store_port
        self.resolver_port = resolver_port
        self.web_port = 0
        self.prepared = False
        self.profile = profile
        self.procs: dict[str, Started] = {}
        self.history: list[Started] = []
        """Every process started, killed ones included."""
        self.deliveries = self.dir / "deliveries.jsonl"
        self.rate = max(1.0, messages / TRAFFIC_SECONDS)

    def _ump(self, name: str, args: list[str], *, ready: str, doing: str,
             timeout: float, status: int, addresses: tuple[str, ...] = (),
             option: str = "") -> Started:
        path = self.dir / f"{name}.log"
        spawned = time.time()
        with path.open("ab") as log:
            offset = log.tell()
            proc = subprocess.Popen([sys.executable, "-m", "ump", *args, "--profile",
                                     self.profile, "-v"], cwd=self.dir, stdout=log,
                                    stderr=log)
        started = Started(name, proc, path, offset, ready, doing, addresses, timeout, status,
                          time.monotonic(), option, spawned=spawned)
        self.procs[name] = started
        self.history.append(started)
        return started

    def own_ports(self) -> RunPorts:
        """The ports the demo held, and when: its store, resolver and web monitor ports
        (chosen for it) throughout, each process's own ports (:attr:`Started.ports`) while
        it lived."""
        run = RunPorts.always({self.port, self.resolver_port, self.web_port})
        for started in self.history:
            started.note_exit()
            run.add(started.ports, started.spawned, started.ended)
        return run

    def delivered(self) -> list[dict[str, object]]:
        if not self.deliveries.exists():
            return []
        out = []
        for line in self.deliveries.read_text().splitlines():
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
        return out

    def start_receiver(self, *, status: int) -> None:
        self._ump("receiver", ["receiver", "-c", "receiver.cfg", "--topic", TOPIC,
                               "--out", str(self.deliveries), "--dedupe"],
                  ready=ReceiverRegistrationComplete.__name__, doing="register",
                  timeout=REGISTER_TIMEOUT, status=status)

    def start_source(self, *, status: int) -> None:
        self._ump("source", ["source", "-c", "source.cfg", "--topic", TOPIC,
                             "--until-sqn", str(self.messages), "--rate", str(self.rate),
                             "--linger", "5"],
                  ready="ump source: registered", doing="register",
                  timeout=REGISTER_TIMEOUT, status=status)

    def kill(self, name: str) -> None:
        started = self.procs[name]
        started.proc.send_signal(signal.SIGKILL)
        started.proc.wait()
        started.note_exit()

    def stop_all(self) -> None:
        procs = list(self.procs.values())
        for started in procs:
            if not started.note_exit():
                started.proc.send_signal(signal.SIGINT)
        for started in procs:
            try:
                started.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                started.proc.kill()
                started.proc.wait()
            started.note_exit()

    def _choose_ports(self) -> None:
        if not self.resolver_port:
            self.resolver_port = free_port(socket.SOCK_DGRAM)
        if not self.port:
            self.port = free_port(socket.SOCK_STREAM)
        self.web_port = free_port(socket.SOCK_STREAM)
        while self.web_port == self.port:
            self.web_port = free_port(socket.SOCK_STREAM)

    def prepare(self) -> None:
        """Choose the ports and write the configuration files."""
        self.prepared = True
        self._choose_ports()
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        (d / "store.xml").write_text(disk_store_xml(
            "demo-store", self.port, r"demo\..*", web_monitor=f"127.0.0.1:{self.web_port}"))
        (d / "source.cfg").write_text(SOURCE_CFG.format(
            port=self.port, transport=self.transport, resolver=self.resolver_port))
        (d / "receiver.cfg").write_text(RECEIVER_CFG.format(resolver=self.resolver_port))

    def run(self) -> int:
        """Prepare (unless done), run and judge; the exit status (module docstring)."""
        if not self.prepared:
            self.prepare()
        print(f"ump demo: work directory {self.dir}; resolver 127.0.0.1:{self.resolver_port}, "
              f"store 127.0.0.1:{self.port}, web monitor http://127.0.0.1:{self.web_port}/",
              file=sys.stderr)
        try:
            resolver = f"127.0.0.1:{self.resolver_port}"
            self._ump("resolver", ["resolver", "--listen", resolver],
                      ready="resolver listening on", doing="listen", timeout=START_TIMEOUT,
                      status=2, addresses=(resolver,), option="--resolver-port")
            self._ump("store", ["store", "-c", "store.xml", "--resolver", resolver],
                      ready="ready to accept registrations", doing="listen",
                      timeout=START_TIMEOUT, status=2,
                      addresses=(f"127.0.0.1:{self.port}", f"127.0.0.1:{self.web_port}"),
                      option="--store-port")
            self._wait_ready("resolver", "store")
            self._start_clients()
            return self._watch()
        except DemoError as exc:
            print(f"ump demo: {exc}", file=sys.stderr)
            return exc.status
        finally:
            self.stop_all()

    def _start_clients(self) -> None:
        self.start_receiver(status=2)
        self.start_source(status=2)

    def _wait_ready(self, *names: str) -> None:
        # a list, not a generator: every one is polled, so any that exited is seen at once
        while not all([self.procs[name].poll_ready() for name in names]):
            time.sleep(0.05)

    def _check(self) -> None:
        """Every process still up (the source may have finished), every start on time."""
        for started in self.procs.values():
            if not started.poll_ready():
                continue
            started.note_exit()
            code = started.proc.poll()
            if code is None or (started.name == "source" and code == 0):
                continue
            raise DemoError(f"{started.name} exited with status {code} during the run: "
                            f"{last_line(started.log_since_start())}; see {started.log}", 1)

    def _watch(self) -> int:
        n = self.messages
        receiver_killed = source_killed = False
        deadline = time.monotonic() + 60 + n / self.rate
        bar = tqdm(total=n, desc="delivered", unit="msg", disable=not sys.stderr.isatty())
        seen = 0
        while time.monotonic() < deadline:
            self._check()
            count = len(self.delivered())
            bar.update(count - seen)
            seen = count
            if not receiver_killed and count >= n // 3:
                bar.write("ump demo: SIGKILL receiver, restarting it")
                self.kill("receiver")
                receiver_killed = True
                time.sleep(0.5)
                self.start_receiver(status=1)
            elif receiver_killed and not source_killed and count >= 2 * n // 3:
                bar.write("ump demo: SIGKILL source, restarting it")
                self.kill("source")
                source_killed = True
                time.sleep(0.5)
                self.start_source(status=1)
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


RPP_SECONDS = 8.0
"""How long the slow receiver's consumption of all ``--messages`` lasts (its rate follows)."""
RPP_PAYLOAD = 64
"""Payload bytes per message (``ump source --size``); RPP sizes count payload only."""
RPP_FLIGHT_MESSAGES = 50
"""The source's ``ume_flight_size_bytes``, in messages of :data:`RPP_PAYLOAD` bytes."""
RPP_THRESHOLD_MESSAGES = 150
"""The topic's ``repository-size-threshold``, in messages (above the topic's flight-size
maximum of twice the source's flight, as the consistency rule asks)."""
RPP_LIMIT_MESSAGES = 250
"""The topic's ``repository-size-limit``, in messages: how far the source can get ahead of
the slow receiver."""
RPP_MIN_MESSAGES = 2 * (RPP_LIMIT_MESSAGES + RPP_FLIGHT_MESSAGES)
"""Fewer messages would fit the repository and one flight: nothing to pace."""
SAMPLE_INTERVAL = 0.1
"""Seconds between two samples of the store's web monitor."""

RPP_SOURCE_CFG = """# the RPP demo source: receiver-paced, with a flight size in bytes (RPP needs
# one), sent to the store as an override of the topic's maximum
context resolver_unicast_daemon 127.0.0.1:{resolver}
source ume_store 127.0.0.1:{port}
source ume_receiver_paced_persistence 1
source ume_flight_size_bytes {flight}
source transport {transport}
"""

RPP_RECEIVER_CFG = """# an RPP demo receiver: blocking (the store keeps each message until it
# consumed it)
context resolver_unicast_daemon 127.0.0.1:{resolver}
receiver ume_receiver_paced_persistence 1
"""


@dataclass
class Sample:
    """What the RPP demo saw at one moment (seconds since the source was told to send).

    Attributes:
        t: the moment.
        fast: lines in the fast receiver's delivery log.
        slow: lines in the slow receiver's delivery log (it writes a line as it consumes).
        used: payload bytes the store's repository held for the source (web monitor), or
            None when this sample did not read it.
    """

    t: float
    fast: int
    slow: int
    used: int | None = None


class RppDemo(Demo):
    """``ump demo --rpp`` (see the module docstring): an RPP source, a fast and a slow blocking
    receiver, no crashes; checks nothing was lost and the source was paced."""

    def __init__(self, messages: int, workdir: Path, store_port: int, profile: str,
                 transport: str = "tcp", resolver_port: int = WELL_KNOWN_RESOLVER_PORT
                 ) -> None:
        super().__init__(messages, workdir, store_port, profile, transport, resolver_port)
        self.consume_rate = messages / RPP_SECONDS
        self.flight = RPP_FLIGHT_MESSAGES * RPP_PAYLOAD
        self.limit = RPP_LIMIT_MESSAGES * RPP_PAYLOAD
        self.logs = {"fast": self.dir / "deliveries-fast.jsonl",
                     "slow": self.dir / "deliveries-slow.jsonl"}
        self.samples: list[Sample] = []
        self.left: list[str] = []
        """The receivers that deregistered at the end (:meth:`_deregister_receivers`)."""
        self.source_href: str | None = None
        self.t0 = 0.0

    def prepare(self) -> None:
        self.prepared = True
        self._choose_ports()
        d = self.dir
        d.mkdir(parents=True, exist_ok=True)
        (d / "store.xml").write_text(disk_store_xml(
            "demo-store", self.port, r"demo\..*", repository="memory",
            web_monitor=f"127.0.0.1:{self.web_port}",
            topic_options={"repository-allow-receiver-paced-persistence": 1,
                           "source-flight-size-bytes-maximum": 2 * self.flight,
                           "repository-size-threshold": RPP_THRESHOLD_MESSAGES * RPP_PAYLOAD,
                           "repository-size-limit": self.limit}))
        (d / "source.cfg").write_text(RPP_SOURCE_CFG.format(
            port=self.port, transport=self.transport, resolver=self.resolver_port,
            flight=self.flight))
        (d / "receiver.cfg").write_text(RPP_RECEIVER_CFG.format(resolver=self.resolver_port))

    def _receiver(self, which: str, rate: float) -> None:
        args = ["receiver", "-c", "receiver.cfg", "--topic", TOPIC,
                "--out", str(self.logs[which])]
        if rate:
            args += ["--consume-rate", f"{rate:g}"]
        self._ump(f"receiver-{which}", args, ready=ReceiverRegistrationComplete.__name__,
                  doing="register", timeout=REGISTER_TIMEOUT, status=2)

    def _start_clients(self) -> None:
        """Both receivers, then the source; once all registered, SIGUSR2 starts the traffic
        (an RPP receiver registered after the first message would get nothing before it)."""
        self._receiver("fast", 0)
        self._receiver("slow", self.consume_rate)
        self._ump("source", ["source", "-c", "source.cfg", "--topic", TOPIC,
                             "--count", str(self.messages), "--size", str(RPP_PAYLOAD),
                             "--linger", "20", "--wait-start"],
                  ready="ump source: registered", doing="register",
                  timeout=REGISTER_TIMEOUT, status=2)
        self._wait_ready("source", "receiver-fast", "receiver-slow")
        self.procs["source"].proc.send_signal(signal.SIGUSR2)
        self.t0 = time.monotonic()

    def _count(self, which: str) -> int:
        try:
            return self.logs[which].read_bytes().count(b"\n")
        except OSError:
            return 0

    def _store_used(self) -> int | None:
        """The payload bytes the store holds for the source (web monitor JSON), or None."""
        base = f"http://127.0.0.1:{self.web_port}"
        try:
            if self.source_href is None:
                with urllib.request.urlopen(f"{base}/stores/0?format=json", timeout=1) as r:
                    page = json.load(r)
                hrefs = [src["href"] for topic in page["topics"] if topic["topic"] == TOPIC
                         for src in topic["sources"]]
                if not hrefs:
                    return None
                self.source_href = hrefs[-1]
            with urllib.request.urlopen(f"{base}{self.source_href}?format=json",
                                        timeout=1) as r:
                return int(json.load(r)["memory"]["used"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def _watch(self) -> int:
        n = self.messages
        deadline = time.monotonic() + 60 + 2 * RPP_SECONDS
        bar = tqdm(total=n, desc="consumed (slow)", unit="msg",
                   disable=not sys.stderr.isatty())
        next_store = 0.0
        while time.monotonic() < deadline:
            self._check()
            now = time.monotonic()
            fast, slow = self._count("fast"), self._count("slow")
            used = None
            if now >= next_store:
                used = self._store_used()
                next_store = now + SAMPLE_INTERVAL
            self.samples.append(Sample(now - self.t0, fast, slow, used))
            bar.update(slow - bar.n)
            if fast >= n and slow >= n:
                break
            time.sleep(0.05)
        bar.close()
        source = self.procs["source"]
        with contextlib.suppress(subprocess.TimeoutExpired):
            source.proc.wait(timeout=25)  # its last line: the in-flight maximum
        if self._count("fast") >= n and self._count("slow") >= n:
            self.left = self._deregister_receivers()
        return self._verdict()

    def _deregister_receivers(self) -> list[str]:
        """"RPP Deregistration": SIGUSR1 to both receivers, once they consumed everything;
        the receivers that said every store confirmed it within 10 s."""
        names = ["receiver-fast", "receiver-slow"]
        for name in names:
            self.procs[name].proc.send_signal(signal.SIGUSR1)
        deadline, left = time.monotonic() + 10, []
        while names and time.monotonic() < deadline:
            for name in list(names):
                if "ump receiver: deregistered from 1 store" in \
                        self.procs[name].log_since_start():
                    names.remove(name)
                    left.append(name)
            time.sleep(0.05)
        return left

    def _rows(self, which: str) -> list[int]:
        out = []
        if self.logs[which].exists():
            for line in self.logs[which].read_text().splitlines():
                with contextlib.suppress(ValueError, KeyError, TypeError):
                    out.append(int(json.loads(line)["sqn"]))
        return out

    def _done_at(self, attr: str) -> float | None:
        return next((s.t for s in self.samples if getattr(s, attr) >= self.messages), None)

    def _verdict(self) -> int:
        n, size = self.messages, RPP_PAYLOAD
        expected = list(range(n))
        failures = []
        for which in ("fast", "slow"):
            sqns = self._rows(which)
            if sqns != expected:
                missing = sorted(set(expected) - set(sqns))
                dupes = len(sqns) - len(set(sqns))
                failures.append(f"the {which} receiver: {len(missing)} missing (first "
                                f"{missing[:10]}), {dupes} duplicates")
        fast_done, slow_done = self._done_at("fast"), self._done_at("slow")
        needed = (n - (self.limit + self.flight) / size) / self.consume_rate
        ahead = max((s.fast - s.slow for s in self.samples), default=0)
        ahead_bound = (self.limit + self.flight) / size + self.consume_rate * 0.1
        said = self.procs["source"].log_since_start()
        peak = re.search(r"in-flight bytes max (\d+)", said)
        inflight = int(peak.group(1)) if peak else None
        used = [s.used for s in self.samples if s.used is not None]
        low_room = [u for u in used if self.limit - u <= self.flight]
        episodes = sum(1 for a, b in itertools.pairwise(used)
                       if self.limit - a > self.flight >= self.limit - b)
        if fast_done is not None:
            rate = n / fast_done if fast_done else float("inf")
            slow_text = "never" if slow_done is None else f"at {slow_done:.1f} s"
            print(f"ump demo: source paced by the slow receiver: {n} msgs in {fast_done:.1f} s "
                  f"({rate:.0f} msg/s; the slow receiver consumes {self.consume_rate:.0f} "
                  f"msg/s and had every message {slow_text}, the fast one at "
                  f"{fast_done:.1f} s; so paced, it needs at least {needed:.1f} s)")
            if fast_done < 0.8 * needed:
                failures.append(f"the source was not paced: it sent all {n} messages in "
                                f"{fast_done:.1f} s; paced by {self.consume_rate:.0f} msg/s it "
                                f"needs at least {needed:.1f} s")
        print(f"ump demo: in-flight bytes max "
              f"{'(not reported)' if inflight is None else inflight} <= ume_flight_size_bytes "
              f"{self.flight}; the fast receiver was at most {ahead} messages ({ahead * size} "
              f"bytes) ahead of the slow one (repository size limit {self.limit} + one flight "
              f"{self.flight} bytes); the store's room was below one flight size in "
              f"{len(low_room)} of {len(used)} web monitor samples (stability withheld; it "
              f"fell there {episodes} time{'' if episodes == 1 else 's'}), its repository "
              f"held at most {max(used, default=0)} bytes")
        if inflight is None:
            failures.append("the source did not report its in-flight bytes maximum")
        elif inflight > self.flight:
            failures.append(f"in-flight bytes {inflight} exceeded ume_flight_size_bytes "
                            f"{self.flight}")
        if ahead > ahead_bound:
            failures.append(f"the fast receiver got {ahead} messages ahead of the slow one; "
                            f"the repository and one flight hold {ahead_bound:.0f}")
        if used and max(used) > self.limit:
            failures.append(f"the repository held {max(used)} bytes, above its size limit "
                            f"{self.limit}")
        if len(self.left) == 2:
            print("ump demo: both receivers deregistered from the store (RPP Deregistration)")
        else:
            failures.append(f"{2 - len(self.left)} receiver(s) did not deregister within 10 s")
        if failures:
            print(f"ump demo: FAIL: {'; '.join(failures)}; logs in {self.dir}")
            return 1
        print(f"ump demo: PASS: both blocking receivers got every message 0..{n - 1} once and "
              f"in order, and the source was paced by the slow one")
        return 0


#: What a demo run leaves in its work directory that the next run must not inherit: the store's
#: journal and cache (a store restored from them would hold the last run's sources and
#: receivers) and the delivery log the verdict is read from.  Configuration files and logs are
#: rewritten by each run.
PREVIOUS_RUN = ("deliveries.jsonl", "deliveries-fast.jsonl", "deliveries-slow.jsonl", "state",
                "cache")


def clear_previous_run(base: Path) -> None:
    """Remove what an earlier demo run left in ``base`` (:data:`PREVIOUS_RUN`), so
    ``ump demo --workdir DIR`` run twice on one DIR judges the second run alone."""
    for name in PREVIOUS_RUN:
        path = base / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def run_demo(*, messages: int = 3000, workdir: str | None = None,
             store_port: int | None = None, resolver_port: int | None = None,
             capture: str | None = None, profile: str = "current",
             transport: str = "tcp", rpp: bool = False) -> int:
    """Run the demo; ports ``None`` = the default of the module docstring, 0 = a free one."""
    for option, port in (("--store-port", store_port), ("--resolver-port", resolver_port)):
        if port is not None and not 0 <= port <= 65535:
            print(f"ump demo: {option} must be a port number 0-65535, not {port}",
                  file=sys.stderr)
            return 2
    if rpp and messages < RPP_MIN_MESSAGES:
        print(f"ump demo: --rpp needs at least {RPP_MIN_MESSAGES} messages (--messages), "
              f"more than the repository and one flight hold, not {messages}", file=sys.stderr)
        return 2
    if workdir is None:
        base = Path(tempfile.mkdtemp(prefix="ump-demo-"))
    else:
        base = Path(workdir).absolute()
        clear_previous_run(base)
    if store_port is None:
        store_port = WELL_KNOWN_STORE_PORT if capture else 0
    if resolver_port is None:
        resolver_port = WELL_KNOWN_RESOLVER_PORT if capture else 0
    demo = (RppDemo if rpp else Demo)(messages, base, store_port, profile, transport,
                                      resolver_port)
    if capture is None:
        return demo.run()
    from reference_impl.capture import CaptureError, LoopbackCapture
    demo.prepare()  # the capture filter needs the ports
    # LBT-RU 14360-14389 too, and LBT-RM's source ports 14390-14399 and destination port 14400
    ports = [demo.port, demo.resolver_port, *range(14360, 14401)]
    try:
        with LoopbackCapture(Path(capture).resolve(), ports=ports):
            code = demo.run()
    except CaptureError as exc:
        print(f"ump demo: {exc}", file=sys.stderr)
        return 2
    kept, dropped = keep_run_frames(Path(capture), demo.own_ports())
    others = f" ({dropped} frames of other processes on UM's ports left out)" if dropped else ""
    print(f"ump demo: {kept} frames captured to {capture}{others}")
    return code or check_capture(Path(capture), demo.port, demo.resolver_port)


def check_capture(path: Path, store_port: int,
                  resolver_port: int = WELL_KNOWN_RESOLVER_PORT) -> int:
    """Decode the capture with wire/ and with tshark and compare every field (a resolver off
    its well-known port is decoded as LBMR by port, like ``ump dissect --lbmr-port``)."""
    from wire.dissect import check_against_tshark, dissect_file
    from wire.tshark import PortMap

    extra = [] if resolver_port == WELL_KNOWN_RESOLVER_PORT else [resolver_port]
    ports = PortMap(store_ports=[store_port], lbmr_ports=extra)
    reports = list(dissect_file(path, ports))
    um = sum(1 for r in reports if r.status == "um")
    bad = [r for r in reports if r.status not in ("um", "not-um")]
    disagreements = check_against_tshark(path, reports, ports)
    print(f"ump demo: {um} UM frames; {len(bad)} malformed; {len(disagreements)} "
          f"disagreements with tshark (ump dissect {path} --store-port {store_port} "
          + "".join(f"--lbmr-port {p} " for p in extra) + "--check-tshark shows them)")
    return 1 if bad or disagreements else 0
