"""Issue 22 items 8, 10 and 11 on real sockets: ``ump resolver``, ``ump store``, ``ump source``
and ``ump receiver`` as separate processes on free loopback ports, with short runs.

* a receiver joins every source of its topic (two sources, one store);
* ``ump source`` deregisters on SIGUSR1, says so in one line and exits 0;
* a receiver left running gets the messages of a source that starts after the previous one
  finished (a new source, no Session ID, on the same transport port).
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reference_impl.config.store_xml_writer import disk_store_xml
from tests.reference_impl.loopback import free_port, stop_processes

IP = "127.0.0.1"
TOPIC = "multi.orders"


class Procs:
    """The processes of one test, in one directory; every one is stopped at the end."""

    def __init__(self, workdir: Path) -> None:
        self.dir = workdir
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.resolver_port = free_port(socket.SOCK_DGRAM)
        self.store_port = free_port()

    def start(self, name: str, *args: str) -> subprocess.Popen[bytes]:
        log = (self.dir / f"{name}.log").open("ab")
        proc = subprocess.Popen([sys.executable, "-m", "ump", *args, "-v"], cwd=self.dir,
                                stdout=log, stderr=log)
        self.procs[name] = proc
        return proc

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def wait_for(self, what: Callable[[], bool], timeout: float, why: str) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if what():
                return
            time.sleep(0.05)
        logs = "\n".join(f"--- {n}\n{self.log(n)[-3000:]}" for n in self.procs)
        logs += f"\n--- deliveries: {len(deliveries(self.dir / 'deliveries.jsonl'))}"
        raise AssertionError(f"{why} within {timeout} s\n{logs}")

    def store_and_resolver(self) -> None:
        (self.dir / "store.xml").write_text(disk_store_xml(
            "multi-store", self.store_port, r"multi\..*", repository="memory"))
        self.start("resolver", "resolver", "--listen", f"{IP}:{self.resolver_port}")
        self.start("store", "store", "-c", "store.xml", "--resolver",
                   f"{IP}:{self.resolver_port}")
        self.wait_for(lambda: "ready to accept registrations" in self.log("store"), 20,
                      "the store did not start")

    def config(self, name: str, *lines: str) -> str:
        path = self.dir / name
        path.write_text("\n".join([f"context resolver_unicast_daemon {IP}:"
                                   f"{self.resolver_port}", *lines]) + "\n")
        return name

    def source_cfg(self) -> str:
        return self.config("source.cfg", f"source ume_store {IP}:{self.store_port}")

    def stop(self) -> None:
        stop_processes(self.procs.values())


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Procs]:
    p = Procs(tmp_path)
    try:
        yield p
    finally:
        p.stop()


def deliveries(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


# --- item 10: SIGUSR1 ---------------------------------------------------------------------------


def test_source_deregisters_on_sigusr1_says_so_and_exits_0(procs: Procs) -> None:
    procs.store_and_resolver()
    source = procs.start("source", "source", "-c", procs.source_cfg(), "--topic", TOPIC,
                         "--count", "100000", "--rate", "2000")
    procs.wait_for(lambda: "registered; next sequence number" in procs.log("source"), 20,
                   "the source did not register")
    time.sleep(0.3)
    source.send_signal(signal.SIGUSR1)
    try:
        code = source.wait(timeout=10)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"ump source did not exit after SIGUSR1:\n"
                             f"{procs.log('source')[-3000:]}") from None
    text = procs.log("source")
    assert code == 0, text[-3000:]
    assert "deregistered from 1 store" in text
    assert "unresponsive" not in text


def test_source_with_deregister_does_the_same_at_the_end(procs: Procs) -> None:
    procs.store_and_resolver()
    source = procs.start("source", "source", "-c", procs.source_cfg(), "--topic", TOPIC,
                         "--count", "50", "--deregister")
    code = source.wait(timeout=20)
    text = procs.log("source")
    assert code == 0, text[-3000:]
    assert "sent 50 messages" in text and "deregistered from 1 store" in text
    assert "unresponsive" not in text


# --- items 8 and 11: the receiver and several sources -----------------------------------------


def per_source(rows: list[dict[str, object]]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for row in rows:
        out.setdefault(str(row.get("source", "?")), []).append(int(row["sqn"]))  # type: ignore
    return out


# (each source sends for a second or two: a receiver that joins a source learns its stores
# from its SRI, which the source repeats every ume_sri_inter_sri_interval while it lives)


def start_receiver(procs: Procs, out: Path) -> subprocess.Popen[bytes]:
    cfg = procs.config("receiver.cfg")
    proc = procs.start("receiver", "receiver", "-c", cfg, "--topic", TOPIC, "--out", str(out))
    time.sleep(0.5)  # it logs nothing until a source appears
    assert proc.poll() is None, procs.log("receiver")
    return proc


def test_a_receiver_process_gets_both_source_processes_of_its_topic(procs: Procs) -> None:
    procs.store_and_resolver()
    out = procs.dir / "deliveries.jsonl"
    start_receiver(procs, out)
    for name in ("source-a", "source-b"):
        procs.start(name, "source", "-c", procs.source_cfg(), "--topic", TOPIC,
                    "--count", "200", "--rate", "200", "--linger", "3")
    procs.wait_for(lambda: len(deliveries(out)) >= 400, 30, "400 deliveries did not arrive")
    time.sleep(0.3)
    got = per_source(deliveries(out))
    assert len(got) == 2 and all(name.startswith("TCP:127.0.0.1:") for name in got), got.keys()
    assert [sqns == list(range(200)) for sqns in got.values()] == [True, True]
    for name in ("source-a", "source-b"):
        assert procs.procs[name].wait(timeout=15) == 0, procs.log(name)[-2000:]


def test_a_running_receiver_process_gets_a_later_source_process(procs: Procs) -> None:
    procs.store_and_resolver()
    out = procs.dir / "deliveries.jsonl"
    start_receiver(procs, out)
    first = procs.start("source-1", "source", "-c", procs.source_cfg(), "--topic", TOPIC,
                        "--count", "40", "--rate", "40", "--linger", "1")
    procs.wait_for(lambda: len(deliveries(out)) >= 40, 20, "the first source's 40 messages")
    assert first.wait(timeout=15) == 0, procs.log("source-1")[-2000:]
    time.sleep(1.0)  # the receiver runs on; the first source is gone
    # a new source: no Session ID, so new RegIDs; usually on the same transport port
    procs.start("source-2", "source", "-c", procs.source_cfg(), "--topic", TOPIC,
                "--count", "40", "--rate", "40", "--linger", "1")
    procs.wait_for(lambda: len(deliveries(out)) >= 80, 30,
                   "the running receiver did not get the later source's 40 messages")
    rows = deliveries(out)
    assert [int(r["sqn"]) for r in rows] == [*range(40), *range(40)]  # type: ignore
    assert "refused" not in procs.log("receiver") and "refused" not in procs.log("store")
