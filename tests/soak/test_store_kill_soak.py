"""Soak: a disk store SIGKILLed and restarted 100 times under load loses no stable message.

This is the long form of :mod:`tests.reference_impl.test_crash_safety` (whose process
machinery it reuses), with every party a process of its own:

1. a resolver (``ump resolver``), a disk-repository store (``ump store -c store.xml``), a live
   receiver (``ump receiver --out live.jsonl``) and a source (:mod:`tests.soak.soak_source`)
   that sends continuously and appends every sequence number it is told is stable to a file;
2. ``UMP_SOAK_CYCLES`` times (default 100): wait (bounded) until the source sees stability
   again after the previous restart, then a random moment (the source keeps sending), SIGKILL
   the store and restart it on the same XML (same cache and state directories); the time from
   the restarted store's ready line to the first new stable message is that restart's
   recovery time.  One kill in five (:data:`EARLY_KILLS`) does not wait for stability: it
   comes at a random moment of the second after the restart, while the source re-registers
   and the store catches up;
3. the source stops sending (SIGUSR1) but stays up (receivers find the topic through its
   advertisement), and a fresh receiver registers with the store, which recovers everything
   it holds: every sequence number the source saw as stable must be delivered to it, with
   the payload it was sent with (0 lost, 0 corrupt).

Duplicates (a sequence number delivered again) and reorderings (a sequence number delivered
after a higher one) are counted for both receivers, with the store's dropped inputs and each
process's warnings, but not asserted: the guide expects a receiver to see again, after a
failure, messages it may already have processed (they carry the retransmit flag, and the
application checks them; section "Recovery Management").  The figures are printed and
written to ``soak-figures.json`` in the test's directory (and to ``UMP_SOAK_REPORT`` when
set).

Knobs (environment): ``UMP_SOAK_CYCLES`` (100), ``UMP_SOAK_RATE`` (messages/s, 1000),
``UMP_SOAK_SEED`` (kill moments; random when unset, printed), ``UMP_SOAK_RECOVERY_TIMEOUT``
(s a cycle waits for stability to resume before the soak fails, 60).  ``tox -e soak`` runs it.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest

from reference_impl.config.store_xml_writer import disk_store_xml
from tests.reference_impl.test_crash_safety import Processes

pytestmark = [pytest.mark.soak, pytest.mark.slow]

TOPIC = "soak.store.kill"
SOURCE_SCRIPT = Path(__file__).with_name("soak_source.py")
EARLY_KILLS = 0.2
"""The share of kills that do not wait for stability to resume after the previous restart."""


def _env_int(name: str, default: int) -> int:
    return int(os.environ.get(name, default))


def _env_float(name: str, default: float) -> float:
    return float(os.environ.get(name, default))


class SoakProcesses(Processes):
    """:class:`Processes` (free ports, daemons checked as started), plus a process that runs a
    Python script: the soak's source."""

    def start_script(self, name: str, script: Path, *args: str) -> subprocess.Popen[bytes]:
        """A process running a Python script (not an ``ump`` command)."""
        with (self.dir / f"{name}.log").open("ab") as log:
            proc = subprocess.Popen([sys.executable, str(script), *args], cwd=self.dir,
                                    stdout=log, stderr=log)
        self.procs[name] = proc
        return proc


class LineTail:
    """Reads the whole lines appended to a file since the last call (a writer in another
    process may be in the middle of a line)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = 0
        self.rest = b""

    def new_lines(self) -> list[str]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as fh:
            fh.seek(self.offset)
            data = fh.read()
        self.offset += len(data)
        *lines, self.rest = (self.rest + data).split(b"\n")
        return [line.decode() for line in lines if line]


class StableLog:
    """The source's stable sequence numbers, as the file grows."""

    def __init__(self, path: Path) -> None:
        self.tail = LineTail(path)
        self.sqns: set[int] = set()

    def poll(self) -> int:
        self.sqns.update(int(line) for line in self.tail.new_lines())
        return len(self.sqns)


@dataclass
class DeliveryStream:
    """One receiver's delivery log read as it grows, with the anomalies counted on the way.

    Attributes:
        delivered: deliveries read so far (duplicates included).
        distinct: sequence numbers delivered at least once.
        duplicates: deliveries of a sequence number delivered before.
        reorderings: first deliveries of a sequence number below the highest one delivered
            before it.
        corrupt: deliveries whose payload does not start with ``"<sequence number>:"``.
        retransmissions: deliveries the receiver marked as retransmitted (recovered).
    """

    path: Path
    delivered: int = 0
    distinct: set[int] = field(default_factory=set)
    duplicates: int = 0
    reorderings: int = 0
    corrupt: int = 0
    retransmissions: int = 0
    highest: int = -1

    def __post_init__(self) -> None:
        self._tail = LineTail(self.path)

    def poll(self) -> int:
        for line in self._tail.new_lines():
            record = json.loads(line)
            sqn = record["sqn"]
            self.delivered += 1
            self.retransmissions += bool(record.get("rx"))
            if not str(record.get("payload", "")).startswith(f"{sqn}:"):
                self.corrupt += 1
            if sqn in self.distinct:
                self.duplicates += 1
                continue
            if sqn < self.highest:
                self.reorderings += 1
            self.distinct.add(sqn)
            self.highest = max(self.highest, sqn)
        return len(self.distinct)

    def figures(self) -> dict[str, int]:
        return {"delivered": self.delivered, "distinct": len(self.distinct),
                "duplicates": self.duplicates, "reorderings": self.reorderings,
                "corrupt": self.corrupt, "retransmissions": self.retransmissions}


@dataclass
class Cycle:
    """One kill and restart.

    Attributes:
        stable_at_kill: stable messages the source had seen when the store was killed.
        restart_s: SIGKILL to the restarted store's ready line.
        recovery_s: ready line to the first new stable message (None: the store was killed
            again first, or stability did not resume within the bound).
        early: the kill came at a random moment after the previous restart, without waiting
            for stability to resume (during re-registration and catch-up).
    """

    stable_at_kill: int
    restart_s: float
    recovery_s: float | None
    early: bool = False


@dataclass
class SoakResult:
    seed: int
    cycles: list[Cycle] = field(default_factory=list)
    sent: int = 0
    stable: int = 0
    lost: list[int] = field(default_factory=list)
    final: dict[str, int] = field(default_factory=dict)
    live: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0
    stalled: bool = False
    final_recovery_s: float | None = None
    error: str | None = None
    warnings: dict[str, int] = field(default_factory=dict)
    store_drops: int = 0

    def summary(self) -> dict[str, object]:
        recovered = [c.recovery_s for c in self.cycles if c.recovery_s is not None]
        restarts = [c.restart_s for c in self.cycles]

        def spread(values: list[float]) -> dict[str, float]:
            if not values:
                return {}
            ordered = sorted(values)
            return {"min": round(ordered[0], 3), "median": round(statistics.median(ordered), 3),
                    "p90": round(ordered[math.ceil(0.9 * len(ordered)) - 1], 3),  # nearest rank
                    "max": round(ordered[-1], 3)}

        return {"seed": self.seed, "cycles": len(self.cycles), "sent": self.sent,
                "stable": self.stable, "lost": len(self.lost), "first_lost": self.lost[:10],
                "final_receiver": self.final, "final_recovery_s": self.final_recovery_s,
                "live_receiver": self.live,
                "early_kills": sum(c.early for c in self.cycles),
                "restart_s": spread(restarts), "recovery_s": spread(recovered),
                "store_drops": self.store_drops, "warnings": self.warnings,
                "stalled": self.stalled, "error": self.error, "wall_s": round(self.wall_s, 1),
                "per_cycle": [asdict(c) for c in self.cycles]}


def _write_configs(workdir: Path, store_port: int, resolver_port: int) -> None:
    (workdir / "store.xml").write_text(disk_store_xml("soak-store", store_port, r"soak\..*"))
    resolver = f"context resolver_unicast_daemon 127.0.0.1:{resolver_port}\n"
    (workdir / "source.cfg").write_text(
        f"{resolver}source ume_store 127.0.0.1:{store_port}\nsource ume_flight_size 500\n")
    (workdir / "receiver.cfg").write_text(
        f"{resolver}receiver retransmit_request_outstanding_maximum 200\n")


def _wait(predicate: Callable[[], bool], timeout: float, poll: float = 0.02) -> float | None:
    """Seconds until ``predicate()`` held, or None after ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if predicate():
            return time.monotonic() - start
        time.sleep(poll)
    return None


def _resumed(stable: StableLog, base: int, timeout: float) -> float | None:
    """Seconds until the source saw a message stable beyond the ``base`` it had seen when the
    store was ready again (None: not within ``timeout``)."""
    waited = _wait(lambda: stable.poll() > base, timeout)
    return None if waited is None else round(waited, 3)


def _stopped(proc: subprocess.Popen[bytes], sig: signal.Signals, timeout: float = 10) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def run_soak(workdir: Path, *, cycles: int, rate: float, seed: int,
             recovery_timeout: float) -> SoakResult:
    """The soak of the module docstring; returns its figures (the caller asserts)."""
    rng = random.Random(seed)
    result = SoakResult(seed)
    procs = SoakProcesses(workdir)
    _write_configs(workdir, procs.store_port, procs.resolver_port)
    stable = StableLog(workdir / "stable.txt")
    live = DeliveryStream(workdir / "live.jsonl")
    final = DeliveryStream(workdir / "final.jsonl")
    started = time.monotonic()
    try:
        procs.start_resolver()
        procs.start_store()
        procs.start("live", "receiver", "-c", "receiver.cfg", "--topic", TOPIC,
                    "--out", "live.jsonl")
        source = procs.start_script("source", SOURCE_SCRIPT, "-c", "source.cfg",
                                    "--topic", TOPIC, "--rate", str(rate),
                                    "--stable-log", "stable.txt", "-v")
        assert _wait(lambda: stable.poll() > 0 or source.poll() is not None, 60) and \
            source.poll() is None, \
            f"nothing became stable:\n{procs.log('source')[-3000:]}"
        restarted: Cycle | None = None  # the last restart, its recovery not yet seen
        base = stable.poll()
        for _ in range(cycles):
            early = rng.random() < EARLY_KILLS
            if early:
                # a kill while the restarted store is still being re-registered and catching up
                time.sleep(rng.uniform(0.0, 1.0))
            else:
                if restarted is not None:
                    restarted.recovery_s = _resumed(stable, base, recovery_timeout)
                    if restarted.recovery_s is None:
                        result.stalled = True
                        break
                time.sleep(rng.uniform(0.0, 1.5))  # the store under load for a random moment
            assert source.poll() is None, f"source died:\n{procs.log('source')[-3000:]}"
            store = procs.procs["store"]
            store.send_signal(signal.SIGKILL)
            killed = time.monotonic()
            store.wait()
            at_kill = stable.poll()
            procs.start_store()
            restarted = Cycle(at_kill, round(time.monotonic() - killed, 3), None, early)
            result.cycles.append(restarted)
            base = stable.poll()
        if restarted is not None and not result.stalled:
            restarted.recovery_s = _resumed(stable, base, recovery_timeout)
            result.stalled = restarted.recovery_s is None
        # the end: the source stops sending but stays up; the live receiver catches up
        source.send_signal(signal.SIGUSR1)
        assert _wait(lambda: "stopped sending" in procs.log("source"), 30) is not None
        time.sleep(2.0)
        stable.poll()
        _stopped(procs.procs["live"], signal.SIGINT)
        live.poll()
        # a fresh receiver recovers every message the store holds
        procs.start("final", "receiver", "-c", "receiver.cfg", "--topic", TOPIC,
                    "--out", "final.jsonl")
        wanted = set(stable.sqns)
        budget = 60 + len(wanted) / 2000
        took = _wait(lambda: final.poll() >= len(wanted) and wanted <= final.distinct, budget,
                     0.2)
        result.final_recovery_s = None if took is None else round(took, 1)
        final.poll()
        _stopped(procs.procs["final"], signal.SIGINT)
        final.poll()
        _stopped(source, signal.SIGINT)
        for line in procs.log("source").splitlines():
            if line.startswith("soak source: stopped sending after"):
                result.sent = int(line.split()[5])
        result.stable = len(wanted)
        result.lost = sorted(wanted - final.distinct)
    except AssertionError as exc:  # a process died or never got going: report what was seen
        result.error = str(exc)
    finally:
        procs.stop_all()
        result.wall_s = time.monotonic() - started
        result.final, result.live = final.figures(), live.figures()
        for name in procs.procs:
            lines = procs.log(name).splitlines()
            result.warnings[name] = sum(" WARNING " in line and "SIGINT received" not in line
                                        for line in lines)
            if name == "store":
                result.store_drops = sum(" dropped " in line for line in lines)
    return result


def report(result: SoakResult, workdir: Path) -> dict[str, object]:
    """Print the figures and write them to ``soak-figures.json`` (and ``UMP_SOAK_REPORT``)."""
    summary = result.summary()
    text = json.dumps(summary, indent=1)
    (workdir / "soak-figures.json").write_text(text)
    if os.environ.get("UMP_SOAK_REPORT"):
        Path(os.environ["UMP_SOAK_REPORT"]).write_text(text)
    brief = {k: v for k, v in summary.items() if k != "per_cycle"}
    print(f"\nstore kill soak ({workdir}):\n{json.dumps(brief, indent=1)}")
    return summary


@pytest.fixture
def soak_dir(tmp_path: Path) -> Iterator[Path]:
    yield tmp_path


def test_store_sigkill_soak_loses_no_stable_message(soak_dir: Path) -> None:
    cycles = _env_int("UMP_SOAK_CYCLES", 100)
    seed = _env_int("UMP_SOAK_SEED", random.randrange(1 << 32))
    result = run_soak(soak_dir, cycles=cycles, rate=_env_float("UMP_SOAK_RATE", 1000.0),
                      seed=seed,
                      recovery_timeout=_env_float("UMP_SOAK_RECOVERY_TIMEOUT", 60.0))
    summary = report(result, soak_dir)
    assert result.error is None, f"{result.error}\n(UMP_SOAK_SEED={seed}; figures: {summary})"
    assert not result.stalled, (
        f"stability did not resume within the bound after restart {len(result.cycles)} "
        f"(UMP_SOAK_SEED={seed}); figures in {soak_dir / 'soak-figures.json'}")
    assert len(result.cycles) == cycles
    assert result.stable > 0
    assert not result.lost, (
        f"{len(result.lost)} of {result.stable} messages the source saw stable were not "
        f"recovered (first {result.lost[:10]}; UMP_SOAK_SEED={seed}); work directory "
        f"{soak_dir}; figures: {summary}")
    assert result.final["corrupt"] == 0 and result.live["corrupt"] == 0, summary
