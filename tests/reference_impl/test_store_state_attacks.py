"""Hostile and damaged files in a disk store's state and cache directories (issue 22 item 3).

A restarted disk store reads two kinds of files: its state journal (one JSON record per line:
registrations, consumption ACKs, deletions) and one cache file per source (the source's data
messages back to back, as LBT-TCP frames them).  The policy these tests pin:

* **A torn tail is tolerated.**  A SIGKILL can leave the last journal line or the last cached
  message half written (and a power loss a run of NUL bytes at a file's end).  The store cuts
  it off, says so in one warning naming the file, and restores everything before it.
* **Damage anywhere else refuses the start.**  A journal line in the middle that is not JSON,
  not UTF-8 or not a record of the right shape, a cache file with bytes that are not stored
  data messages before its end: ``ump store`` exits with status 2 and one line
  ``FILE:LINE: what is wrong`` (``FILE: at byte N: ...`` for a cache file) and leaves the file
  as it was, because restoring around the damage would silently lose whatever it held.  The
  operator decides (the guide's "Persistent Store Fault Tolerance": redundant stores carry
  the sources meanwhile).
* **The store opens only regular files of its own.**  A state or cache file that is a symbolic
  link (possibly to a file outside the store's directories), a directory or a FIFO is refused
  at start-up, never followed, read or blocked on; at a new registration such a cache file
  refuses that registration (code 6) with the reason logged and the store keeps serving.
* A cache file a new registration finds in its place (an orphan: no state names its RegID)
  is not that source's: its bytes are discarded, with a warning, instead of being served as
  the new source's messages.

Each start-up case runs ``ump store -c store.xml`` through ``ump.cli.main`` in this process
(the real configuration reader, asyncio host and error path); a store that starts is stopped
once it is bound, and its restored state read off its core.  The state directory is written
by a store that really ran (in the simulator), then damaged.  The FIFO cases run as a
subprocess, since before the fix the store blocked forever opening a FIFO.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from reference_impl import runtime
from reference_impl.config.store_xml_writer import disk_store_xml
from reference_impl.deployment import SimDeployment
from reference_impl.events import ClientRejected, SourceRegistrationComplete
from reference_impl.fastmsg import data_message
from reference_impl.repository import cache_file, lock_file, state_file
from reference_impl.source import StoreSpec
from reference_impl.store import StoreCore, TopicPolicy, TopicRule
from ump.cli import main

STORE = "s"
TOPIC = "orders"
MESSAGES = 5
DISK = TopicPolicy(repository_type="disk", repository_size_threshold=50_000_000)


@dataclass
class Template:
    """A state and cache directory written by a store that really ran: one source with
    :data:`MESSAGES` messages, one receiver that acknowledged them all."""

    root: Path
    source_reg_id: int
    receiver_reg_id: int


@pytest.fixture(scope="module")
def template(tmp_path_factory: pytest.TempPathFactory) -> Template:
    root = tmp_path_factory.mktemp("template")
    d = SimDeployment(seed=1)
    d.add_store(STORE, topics=(TopicRule(".*", DISK, kind="PCRE"),), seed=100,
                disk_cache_directory=root / "cache", disk_state_directory=root / "state")
    src = d.add_source("src", TOPIC, ume_session_id=7)
    assert d.run_until(lambda: src.complete, 10)
    d.add_receiver("rcv", TOPIC)
    for _ in range(MESSAGES):
        src.send(b"m%d" % src.next_sqn)
        d.run(0.01)
    d.run(2)
    d.kill(STORE)
    store = d.stores[STORE]
    (source_reg_id,) = store.sources
    (receiver_reg_id,) = store.receivers
    assert store.receivers[receiver_reg_id].last_ack == MESSAGES - 1
    return Template(root, source_reg_id, receiver_reg_id)


@dataclass
class Workdir:
    """A copy of the template with its ``store.xml``; the paths the cases damage."""

    root: Path
    xml: Path
    journal: Path
    cache: Path
    source_reg_id: int
    receiver_reg_id: int

    def journal_lines(self) -> list[bytes]:
        return self.journal.read_bytes().splitlines(keepends=True)


@pytest.fixture
def work(template: Template, tmp_path: Path) -> Workdir:
    root = tmp_path / "store"
    shutil.copytree(template.root, root)
    xml = root / "store.xml"
    xml.write_text(disk_store_xml(STORE, 0, ".*"))
    work = Workdir(root, xml, state_file(root / "state", STORE),
                   cache_file(root / "cache", STORE, template.source_reg_id),
                   template.source_reg_id, template.receiver_reg_id)
    assert len(work.journal_lines()) == 3 and work.cache.stat().st_size > 0
    return work


@dataclass
class Run:
    """What one ``ump store`` run did."""

    code: int
    err: str
    cores: list[StoreCore]
    log: str = ""


StoreRun = Callable[[Workdir], Run]


@pytest.fixture
def resolver() -> Iterator[int]:
    """A UDP port nobody answers on, for the store's topic resolution."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        yield int(sock.getsockname()[1])


@pytest.fixture
def ump_store(capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture,
              monkeypatch: pytest.MonkeyPatch, resolver: int) -> StoreRun:
    """``ump store -c store.xml`` in this process; a store that starts is stopped once it is
    bound and ran a moment (exit status 0), its cores kept for the test to read.  What the
    daemon logs (to stderr when run as a command) is :attr:`Run.log`."""
    caplog.set_level(logging.WARNING, logger="ump")
    started: list[StoreCore] = []
    real_start = runtime.start_stores

    async def start_then_stop(host: Any, *args: Any, **kwargs: Any) -> list[StoreCore]:
        cores = await real_start(host, *args, **kwargs)
        started.extend(cores)
        # stopped a moment later, once the store ran its first step (and logged its restore)
        asyncio.get_running_loop().call_later(0.1, host.close)
        return cores

    monkeypatch.setattr(runtime, "start_stores", start_then_stop)

    def run(work: Workdir) -> Run:
        started.clear()
        capsys.readouterr()
        caplog.clear()
        code = main(["store", "-c", str(work.xml), "--resolver", f"127.0.0.1:{resolver}"])
        log = "".join(f"{r.levelname} {r.getMessage()}\n" for r in caplog.records)
        return Run(code, capsys.readouterr().err, list(started), log)

    return run


def assert_refused(run: Run, path: Path, line: int | None = None) -> str:
    """Exit 2 and one line naming ``path`` (and ``path:line``); the store did not start."""
    assert run.code == 2, run.err
    assert "Traceback" not in run.err
    assert run.err.endswith("\n") and run.err.splitlines() == [run.err[:-1]], run.err[:600]
    assert len(run.err) < 600, run.err
    where = f"{path}:{line}:" if line is not None else f"{path}:"
    assert where in run.err, run.err
    assert not run.cores
    return run.err


def assert_restored(run: Run, work: Workdir, sqns: list[int]) -> StoreCore:
    """The store started and restored the source (with ``sqns``) and the receiver."""
    assert run.code == 0, run.err
    assert "Traceback" not in run.err
    (core,) = run.cores
    assert list(core.sources) == [work.source_reg_id]
    repo = core.sources[work.source_reg_id].repo
    assert repo is not None and repo.sqns() == sqns
    assert list(core.receivers) == [work.receiver_reg_id]
    assert core.receivers[work.receiver_reg_id].last_ack == MESSAGES - 1
    return core


# --- the state journal ---------------------------------------------------------------------


def damage_journal(work: Workdir, line: bytes, at: int) -> bytes:
    """Insert ``line`` as line ``at`` (1-based) of the journal; returns the damaged bytes."""
    lines = work.journal_lines()
    lines.insert(at - 1, line)
    data = b"".join(lines)
    work.journal.write_bytes(data)
    return data


def client_record(work: Workdir, role: str) -> dict[str, Any]:
    for line in work.journal_lines():
        record = json.loads(line)
        if record.get("client", {}).get("role") == role:
            return dict(record["client"])
    raise AssertionError(f"no {role} record")


BAD_LINES: dict[str, tuple[bytes, str]] = {
    # id: (the line put in the middle of the journal, what the message must say)
    "json-array": (b"[1, 2]\n", "record"),
    "json-number": (b"42\n", "record"),
    "unknown-record": (b'{"checkpoint": 1}\n', "checkpoint"),
    "client-without-role": (b'{"client": {"reg_id": 5}}\n', "role"),
    "client-not-an-object": (b'{"client": [1, 2, 3]}\n', "client"),
    "ack-without-sqn": (b'{"ack": 5}\n', "sqn"),
    "ack-sqn-a-string": (b'{"ack": 5, "sqn": "12"}\n', "sqn"),
    "ack-sqn-negative": (b'{"ack": 5, "sqn": -1}\n', "sqn"),
    "ack-sqn-a-boolean": (b'{"ack": 5, "sqn": true}\n', "sqn"),
    "delete-regid-too-big": (b'{"delete": 4294967296}\n', "delete"),
    "not-utf8": (b'{"delete": 5}\xff\xfe\n', "UTF-8"),
    "torn-in-the-middle": (b'{"ack": 5, "sq\n', "JSON"),
    "nul-bytes-in-the-middle": (b"\0" * 40 + b"\n", "JSON"),
    "huge-integer": (b'{"delete": ' + b"9" * 5000 + b"}\n", "number"),
    "deep-nesting": (b"[" * 100_000 + b"\n", "nested"),
    "nan": (b'{"ack": 5, "sqn": NaN}\n', "NaN"),
    "float-overflow": (b'{"ack": 5, "sqn": 1e400}\n', "sqn"),
    "line-over-the-cap": (b'{"delete": 5}' + b" " * (2 << 20) + b"\n", "longer"),
}


@pytest.mark.parametrize("case", list(BAD_LINES))
def test_a_damaged_journal_line_in_the_middle_refuses_the_start(
        ump_store: StoreRun, work: Workdir, case: str) -> None:
    """Before: a JSON line of the wrong shape was a TypeError/KeyError traceback (or, for
    ``[1, 2]``, silently skipped), bytes that are not UTF-8 a UnicodeDecodeError, and a line
    that is not JSON was skipped as "torn" wherever it was, losing what it held."""
    line, says = BAD_LINES[case]
    damaged = damage_journal(work, line, 2)
    err = assert_refused(ump_store(work), work.journal, 2)
    assert says in err
    assert work.journal.read_bytes() == damaged  # left for the operator as it was


def bad_client(work: Workdir, role: str, changes: dict[str, Any]) -> bytes:
    record = client_record(work, role)
    for key, value in changes.items():
        if value is ...:
            del record[key]
        else:
            record[key] = value
    return json.dumps({"client": record}).encode() + b"\n"


BAD_CLIENTS: dict[str, tuple[str, dict[str, Any], str]] = {
    # id: (role, fields changed (... = removed), what the message must say)
    "role-unknown": ("source", {"role": "proxy"}, "role"),
    "topic-a-number": ("source", {"topic": 7}, "topic"),
    "topic-with-a-nul": ("source", {"topic": "ord\0ers"}, "NUL"),
    "topic-empty": ("receiver", {"topic": ""}, "topic"),
    "activity-timeout-negative": ("source", {"activity_timeout": -1}, "activity_timeout"),
    "request-addr-not-an-ip": ("source", {"request_addr": ["no.such.host", 1]}, "request_addr"),
    "request-addr-port-too-big": ("source", {"request_addr": ["10.0.0.3", 70000]},
                                  "request_addr"),
    "policy-unknown-option": ("source", {"policy": {"repository_type": "disk", "bogus": 1}},
                              "bogus"),
    "policy-option-a-string": ("source", {"policy": {"keepalive_interval": "3000"}},
                               "keepalive_interval"),
    "policy-missing": ("source", {"policy": ...}, "policy"),
    "policy-check-interval-zero": ("source", {"policy": {"source_check_interval": 0}},
                                   "source_check_interval"),
    "unknown-field": ("receiver", {"colour": "blue"}, "colour"),
    "receiver-without-source": ("receiver", {"source_reg_id": ...}, "source_reg_id"),
}


@pytest.mark.parametrize("case", list(BAD_CLIENTS))
def test_a_client_record_of_the_wrong_shape_refuses_the_start(
        ump_store: StoreRun, work: Workdir, case: str) -> None:
    """Every field a record restores is checked before any state is built: before, these
    were tracebacks (TypeError for an unknown policy option) or, worse, restored (a topic
    that is a number, an infinite timeout, an address the store later sends to)."""
    role, changes, says = BAD_CLIENTS[case]
    damaged = damage_journal(work, bad_client(work, role, changes), 3)
    err = assert_refused(ump_store(work), work.journal, 3)
    assert says in err
    assert work.journal.read_bytes() == damaged


@pytest.mark.parametrize("tail", [b'{"ack": 17, "sq', b'{"client": {"role": "sou\xc3',
                                  b"\0" * 100], ids=["cut-json", "cut-utf8", "nul-fill"])
def test_a_torn_last_journal_line_is_cut_with_a_warning(
        ump_store: StoreRun, work: Workdir, tail: bytes) -> None:
    """A crash mid-write leaves a last line without its newline: the store warns, naming the
    file and line, restores the rest and rewrites the journal without it."""
    damage_journal(work, tail, 4)
    run = ump_store(work)
    assert_restored(run, work, list(range(MESSAGES)))
    assert f"{work.journal}:4: " in run.log and "torn" in run.log
    assert all(line.endswith(b"\n") and json.loads(line) for line in work.journal_lines())


def test_a_well_formed_last_line_without_its_newline_is_kept(ump_store: StoreRun,
                                                            work: Workdir) -> None:
    """Only a record's newline was lost: the record is whole, so it counts (here: a later
    consumption ACK), and nothing is said about it."""
    damage_journal(work, b'{"ack": %d, "sqn": 9}' % work.receiver_reg_id, 4)
    run = ump_store(work)
    assert run.code == 0 and "torn" not in run.log, run.log
    (core,) = run.cores
    assert core.receivers[work.receiver_reg_id].last_ack == 9


def test_a_journal_that_is_not_a_journal_is_refused_at_line_1(ump_store: StoreRun,
                                                              work: Workdir) -> None:
    work.journal.write_bytes(b"root:x:0:0:root:/root:/bin/bash\ndaemon:x:1:1::/:/bin/sh\n")
    assert_refused(ump_store(work), work.journal, 1)


def test_an_empty_journal_starts_an_empty_store(ump_store: StoreRun, work: Workdir) -> None:
    work.journal.write_bytes(b"")
    run = ump_store(work)
    assert run.code == 0, run.err
    (core,) = run.cores
    assert not core.sources and not core.receivers


def test_a_journal_that_is_a_symlink_is_refused_and_its_target_untouched(
        ump_store: StoreRun, work: Workdir, tmp_path: Path) -> None:
    """Before, the store read the link's target and then rewrote it (as root: any file)."""
    outside = tmp_path / "elsewhere.state"
    outside.write_bytes(work.journal.read_bytes() + b'{"ack": 1, "sq')
    before = outside.read_bytes()
    work.journal.unlink()
    work.journal.symlink_to(outside)
    err = assert_refused(ump_store(work), work.journal)
    assert "symbolic link" in err
    assert outside.read_bytes() == before and work.journal.is_symlink()


def test_the_journal_is_replaced_whole_when_it_is_compacted(ump_store: StoreRun,
                                                            work: Workdir) -> None:
    """The start-up rewrite goes to a new file renamed over the old one: a crash during it
    leaves the old journal, never an empty one (before: truncated, then rewritten)."""
    work.journal.chmod(0o640)
    inode = work.journal.stat().st_ino
    assert_restored(ump_store(work), work, list(range(MESSAGES)))
    assert work.journal.stat().st_ino != inode
    assert work.journal.stat().st_mode & 0o777 == 0o640  # the journal's permissions kept
    assert len(work.journal_lines()) == 3
    assert sorted(p.name for p in work.journal.parent.iterdir()) == [
        lock_file(work.journal.parent, STORE).name, work.journal.name]


# --- cache files at restore ------------------------------------------------------------------


def frames(work: Workdir) -> list[bytes]:
    """The template's cache file as its messages."""
    data = work.cache.read_bytes()
    out = []
    while data:
        size = int.from_bytes(data[2:4], "big")
        out.append(data[:size])
        data = data[size:]
    assert len(out) == MESSAGES
    return out


def test_garbage_between_cached_messages_refuses_the_start(ump_store: StoreRun,
                                                           work: Workdir) -> None:
    """Before: everything from the garbage on was cut off without a word (messages the store
    had called stable), or the store crashed on a frame too short for a data header."""
    msgs = frames(work)
    damaged = b"".join(msgs[:2]) + b"GARBAGE!" + b"".join(msgs[2:])
    work.cache.write_bytes(damaged)
    err = assert_refused(ump_store(work), work.cache)
    assert f"at byte {len(msgs[0]) + len(msgs[1])}" in err
    assert work.cache.read_bytes() == damaged


@pytest.mark.parametrize("frame", [b"\x00\x00\x00\x06ab", b"\x08\xff\x00\x10" + b"x" * 12],
                         ids=["shorter-than-a-data-header", "not-a-data-message"])
def test_a_frame_that_is_not_a_stored_message_refuses_the_start(
        ump_store: StoreRun, work: Workdir, frame: bytes) -> None:
    msgs = frames(work)
    work.cache.write_bytes(msgs[0] + frame + b"".join(msgs[1:]))
    err = assert_refused(ump_store(work), work.cache)
    assert f"at byte {len(msgs[0])}" in err


def test_a_cache_file_of_text_refuses_the_start(ump_store: StoreRun, work: Workdir) -> None:
    """Text reads as one long frame that never ends: before, it was taken for a torn write
    and the file truncated to nothing."""
    text = b"root:x:0:0:root:/root:/bin/bash\n" * 4
    work.cache.write_bytes(text)
    assert_refused(ump_store(work), work.cache)
    assert work.cache.read_bytes() == text


@pytest.mark.parametrize("cut", [1, 3, 10])
def test_a_torn_last_cached_message_is_cut_with_a_warning(ump_store: StoreRun, work: Workdir,
                                                          cut: int) -> None:
    """A crash in the middle of the last write: the messages before it are restored, the
    torn one is cut off and the warning names the file and what was cut."""
    msgs = frames(work)
    work.cache.write_bytes(b"".join(msgs[:-1]) + msgs[-1][:cut])
    run = ump_store(work)
    assert_restored(run, work, list(range(MESSAGES - 1)))
    assert str(work.cache) in run.log and "torn" in run.log, run.log
    assert work.cache.read_bytes() == b"".join(msgs[:-1])


def test_nul_bytes_at_the_end_of_a_cache_file_are_cut_with_a_warning(
        ump_store: StoreRun, work: Workdir) -> None:
    """A power loss can leave a file longer than what was written, the rest zeros."""
    data = work.cache.read_bytes()
    work.cache.write_bytes(data + b"\0" * 4096)
    run = ump_store(work)
    assert_restored(run, work, list(range(MESSAGES)))
    assert str(work.cache) in run.log and "NUL" in run.log, run.log
    assert work.cache.read_bytes() == data


def test_a_missing_cache_file_is_a_warning(ump_store: StoreRun, work: Workdir) -> None:
    """The registrations are restored (the guide lets an operator clear a cache), the loss
    of the messages is said."""
    work.cache.unlink()
    run = ump_store(work)
    assert_restored(run, work, [])
    assert str(work.cache) in run.log and "missing" in run.log, run.log


def test_an_empty_cache_file_restores_no_messages(ump_store: StoreRun, work: Workdir) -> None:
    work.cache.write_bytes(b"")
    run = ump_store(work)
    assert_restored(run, work, [])
    assert "Traceback" not in run.err


def test_a_cache_file_that_is_a_directory_refuses_the_start(ump_store: StoreRun,
                                                            work: Workdir) -> None:
    """Before: IsADirectoryError, a traceback and exit status 1."""
    work.cache.unlink()
    work.cache.mkdir()
    err = assert_refused(ump_store(work), work.cache)
    assert "directory" in err


def test_a_cache_file_that_is_a_symlink_is_refused_and_its_target_untouched(
        ump_store: StoreRun, work: Workdir, tmp_path: Path) -> None:
    """A link to a file outside the cache directory: before, read, cut and appended to."""
    outside = tmp_path / "elsewhere"
    outside.write_bytes(work.cache.read_bytes() + b"\x00\x00\x00")
    before = outside.read_bytes()
    work.cache.unlink()
    work.cache.symlink_to(outside)
    err = assert_refused(ump_store(work), work.cache)
    assert "symbolic link" in err
    assert outside.read_bytes() == before


@pytest.mark.parametrize("which", ["cache", "journal"])
def test_a_fifo_is_refused_not_waited_on(work: Workdir, which: str, resolver: int) -> None:
    """A FIFO in a file's place: before, the store blocked forever opening the cache file (a
    state file that is a FIFO was already refused by ``ump store``'s directory check)."""
    path = work.cache if which == "cache" else work.journal
    path.unlink()
    os.mkfifo(path)
    done = subprocess.run(
        [sys.executable, "-m", "ump", "store", "-c", str(work.xml), "--resolver",
         f"127.0.0.1:{resolver}"], capture_output=True, text=True, timeout=30, check=False)
    assert_refused(Run(done.returncode, done.stderr, []), path if which == "cache" else work.xml)
    assert re.search(r"FIFO|not a regular file", done.stderr), done.stderr


# --- cache files at a new registration ---------------------------------------------------------


STATIC_REGID = 4242


def sim_store(tmp_path: Path) -> tuple[SimDeployment, StoreCore]:
    d = SimDeployment(seed=3)
    store = d.add_store(STORE, topics=(TopicRule(".*", DISK, kind="PCRE"),), seed=100,
                        disk_cache_directory=tmp_path / "cache",
                        disk_state_directory=tmp_path / "state")
    return d, store


def test_a_registration_whose_cache_file_is_a_directory_is_refused_and_others_served(
        tmp_path: Path) -> None:
    """Before: IsADirectoryError inside the running store (the daemon died)."""
    d, store = sim_store(tmp_path)
    cache_file(tmp_path / "cache", STORE, STATIC_REGID).mkdir(parents=True)
    spec = StoreSpec(store.addr[0], store.addr[1], reg_id=STATIC_REGID)
    d.add_source("bad", "one", ume_store=(spec,))
    d.run(3)
    (rejected,) = d.events(STORE, ClientRejected)
    assert isinstance(rejected, ClientRejected)
    assert rejected.reg_id == STATIC_REGID and rejected.code == 6
    assert "directory" in rejected.text
    assert STATIC_REGID not in store.sources
    good = d.add_source("good", "two")
    assert d.run_until(lambda: good.complete, 10)
    assert d.events("good", SourceRegistrationComplete)
    assert [s.topic for s in store.sources.values()] == ["two"]


def test_a_registration_does_not_adopt_an_orphan_cache_file(tmp_path: Path) -> None:
    """Messages in a cache file no state names (a journal removed, a file planted) are not
    the new source's: before, they were loaded as its repository and served to its
    receivers as its messages."""
    d, store = sim_store(tmp_path)
    orphan = cache_file(tmp_path / "cache", STORE, STATIC_REGID)
    orphan.parent.mkdir(parents=True)
    orphan.write_bytes(data_message(1, 0, b"OLD") + data_message(1, 1, b"DATA"))
    spec = StoreSpec(store.addr[0], store.addr[1], reg_id=STATIC_REGID)
    src = d.add_source("src", TOPIC, ume_store=(spec,))
    assert d.run_until(lambda: src.complete, 10)
    repo = store.sources[STATIC_REGID].repo
    assert repo is not None and repo.sqns() == []
    assert orphan.stat().st_size == 0
    logs = [str(e) for e in d.events(STORE) if "orphan" in str(e) or "discard" in str(e)]
    assert logs, "the discarded file is not mentioned"


def test_a_state_directory_removed_while_the_store_runs_fails_no_registration(
        tmp_path: Path) -> None:
    """The journal is opened at start-up and kept open: before, it was opened at the first
    record, so a state directory removed (or a directory put at the journal's name) while
    the store ran failed the first registration with FileNotFoundError, and the daemon died."""
    d, store = sim_store(tmp_path)
    shutil.rmtree(tmp_path / "state")
    src = d.add_source("src", TOPIC)
    assert d.run_until(lambda: src.complete, 10)
    (tmp_path / "state").mkdir()
    state_file(tmp_path / "state", STORE).mkdir()
    d.add_receiver("rcv", TOPIC)
    for _ in range(3):
        src.send(b"m")
        d.run(0.01)
    d.run(2)
    assert len(store.receivers) == 1


def test_a_second_store_on_the_same_state_is_refused(work: Workdir, resolver: int) -> None:
    """Two processes running store ``s`` on one state directory: before, the second compacted
    the journal under the first, which went on appending to a file no longer in the
    directory (everything it journalled from then on was lost at its next start).  Now the
    second one is refused, naming the lock file and the first one's pid; the first runs on."""
    argv = [sys.executable, "-m", "ump", "store", "-c", str(work.xml), "--resolver",
            f"127.0.0.1:{resolver}"]
    first = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        assert first.stderr is not None
        assert "ready to accept registrations" in first.stderr.readline()
        journal = work.journal.read_bytes()
        second = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        lock = lock_file(work.journal.parent, STORE)
        err = assert_refused(Run(second.returncode, second.stderr, []), lock)
        assert f"pid {first.pid}" in err
        assert first.poll() is None
        assert work.journal.read_bytes() == journal
    finally:
        first.terminate()
        first.wait(timeout=30)
    assert first.returncode == 0
    # the lock went with the process: the store starts again at once
    again = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        assert again.stderr is not None
        assert "ready to accept registrations" in again.stderr.readline()
    finally:
        again.terminate()
        again.wait(timeout=30)
