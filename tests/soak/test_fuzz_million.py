"""A million fuzzed frames through ``ump dissect`` and through the store and receiver cores
(over LBT-TCP and LBT-RU): 0 crashes, 0 hangs (issue 22 "Must show").  The engine is
:mod:`tests.soak.fuzzing`.

* ``test_fuzz_smoke`` (default run, a few seconds): 2,000 frames per target
  (``UMP_FUZZ_SMOKE_FRAMES``), one pcap of them also through the real ``ump dissect``
  command, so CI keeps the whole path working;
* ``test_fuzz_million`` (``soak``, ``slow``; ``tox -e soak``): ``UMP_FUZZ_FRAMES`` per target
  (default 1,000,000), every 20th dissect chunk also through the real command.  Run it in
  pieces with ``UMP_FUZZ_FIRST_CHUNK`` (chunks are :data:`~tests.soak.fuzzing.CHUNK` frames):
  piece *k* of *n* covers other chunks than the others, with the same seed;
* the detector tests prove that a core exception, a hang and a dissect crash are caught,
  reported with their seed and saved, i.e. that the 0 above can be something else;
* the bugs the fuzz found are pinned at the end as regression tests (LBT-RU sequence numbers
  far ahead once held a core for seconds to minutes).

``UMP_FUZZ_SEED`` (default 22) seeds everything; ``UMP_FUZZ_OUT`` is where crashing inputs go
(default: the test's temporary directory, printed), ``UMP_FUZZ_REPORT`` a JSON file for the
figures.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reference_impl.context import ContextCore
from reference_impl.deployment import LBTRU_RECEIVER_PORT
from reference_impl.events import Addr
from reference_impl.lbtru_session import LbtruReceiverSession
from reference_impl.receiver import ReceiverCore
from reference_impl.store import StoreCore
from tests.reference_impl.test_bad_input import STRANGER_IP
from tests.soak import fuzzing
from tests.soak.fuzzing import FuzzRun, fuzz
from wire import dissect, lbtru

SEED = int(os.environ.get("UMP_FUZZ_SEED", "22"))


@pytest.fixture
def crash_dir(tmp_path: Path) -> Iterator[Path]:
    out = Path(os.environ.get("UMP_FUZZ_OUT", tmp_path / "crashes"))
    yield out


def _check(run: FuzzRun, out: Path) -> None:
    lines = "\n".join(crash.line() for crash in run.crashes[:20])
    assert not run.crashes, (f"{len(run.crashes)} crash(es) in {run.frames} frames "
                             f"(UMP_FUZZ_SEED={run.seed}; inputs in {out}):\n{lines}")
    if run.target == "dissect":  # every generated capture is well-formed: read to its end
        assert {k for k in run.counts if k.startswith("exit")} == {"exit 0"}, run.counts
    else:  # the cores swallow bad input and log why
        assert run.counts["drops without a log line"] == 0, run.counts


@pytest.mark.parametrize("target", fuzzing.TARGETS)
def test_fuzz_smoke(target: str, crash_dir: Path, tmp_path: Path) -> None:
    frames = int(os.environ.get("UMP_FUZZ_SMOKE_FRAMES", "2000"))
    run = fuzz(target, frames=frames, seed=SEED, out=crash_dir, work=tmp_path,
               chunk_size=frames, cli_every=1)
    _check(run, crash_dir)
    assert run.frames == frames
    if target == "dissect":
        # the frames reach the UM decoders, and some of them decode
        assert run.counts["real CLI runs"] == 1
        assert run.counts["UM"] > 0 and run.counts["malformed"] > 0
    else:
        # the garbage is dropped with a reason, and the valid traffic between it is served
        assert run.counts["InputDropped"] > frames // 20
        served = {"receiver": "MessageDelivered", "store": "ClientRegistered",
                  "lbtru": "channel lbtru"}[target]
        assert run.counts[served] > 0, run.counts


@pytest.mark.soak
@pytest.mark.slow
@pytest.mark.parametrize("target", fuzzing.TARGETS)
def test_fuzz_million(target: str, crash_dir: Path, tmp_path: Path) -> None:
    frames = int(os.environ.get("UMP_FUZZ_FRAMES", "1000000"))
    first = int(os.environ.get("UMP_FUZZ_FIRST_CHUNK", "0"))
    started = time.monotonic()

    def progress(run: FuzzRun) -> None:
        if run.chunks % 20 == 0:
            print(f"  {target}: {run.frames} frames, {len(run.crashes)} crashes, "
                  f"{time.monotonic() - started:.0f} s", flush=True)

    run = fuzz(target, frames=frames, seed=SEED, out=crash_dir, work=tmp_path,
               first_chunk=first, cli_every=20, progress=progress)
    summary = {**run.summary(), "first_chunk": first}
    print(f"\nfuzz {target}: {json.dumps(summary)}")
    if os.environ.get("UMP_FUZZ_REPORT"):
        report = Path(os.environ["UMP_FUZZ_REPORT"])
        known = json.loads(report.read_text()) if report.exists() else []
        report.write_text(json.dumps([*known, summary], indent=1))
    _check(run, crash_dir)


# --- the detectors can fire -------------------------------------------------------------------


def test_a_core_exception_is_reported_with_its_seed_and_saved(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    original = StoreCore.on_message

    def fragile(self: StoreCore, conn: object, message: object, raw: bytes) -> None:
        if len(raw) % 7 == 3:
            raise KeyError("planted")
        original(self, conn, message, raw)  # type: ignore[arg-type]

    monkeypatch.setattr(StoreCore, "on_message", fragile)
    run = fuzz("store", frames=300, seed=5, out=tmp_path, work=tmp_path, chunk_size=300)
    assert run.crashes, "the planted exception was not seen"
    crash = run.crashes[0]
    assert "KeyError: 'planted'" in crash.error and crash.seed == 5 and crash.chunk == 0
    saved, note = (Path(p) for p in crash.saved)
    assert saved.read_bytes().hex() == json.loads(note.read_text())["hex"]  # the frame as fed
    assert json.loads(note.read_text())["replay"] == \
        "python -m tests.soak.fuzzing --target store --seed 5 --chunk 0 --frames 300"
    # replaying the chunk meets the same crash at the same frame
    again = fuzz("store", frames=300, seed=5, out=tmp_path / "again", work=tmp_path,
                 chunk_size=300)
    assert [(c.index, c.error) for c in again.crashes] == \
        [(c.index, c.error) for c in run.crashes]


def test_a_hang_is_reported(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    original = ReceiverCore.on_lbmr

    def stuck(self: ReceiverCore, packet: object, addr: tuple[str, int]) -> None:
        if addr[0] == STRANGER_IP:  # the fuzzer's datagrams, not the bench's own resolution
            time.sleep(2)
        original(self, packet, addr)  # type: ignore[arg-type]

    monkeypatch.setattr(ReceiverCore, "on_lbmr", stuck)
    monkeypatch.setattr(fuzzing, "HANG_SECONDS", 0.2)
    run = fuzz("receiver", frames=30, seed=1, out=tmp_path, work=tmp_path, chunk_size=30)
    assert run.crashes and all(c.error.startswith("Hang") for c in run.crashes), run.crashes


def test_a_dissect_crash_names_its_frame(monkeypatch: pytest.MonkeyPatch,
                                         tmp_path: Path) -> None:
    original = dissect.Dissector._udp

    def fragile(self: dissect.Dissector, seg: object, report: object) -> object:
        if getattr(seg, "payload", b"")[:1] == b"\x00":
            raise IndexError("planted")
        return original(self, seg, report)  # type: ignore[arg-type]

    monkeypatch.setattr(dissect.Dissector, "_udp", fragile)
    run = fuzz("dissect", frames=500, seed=3, out=tmp_path, work=tmp_path, chunk_size=500)
    assert len(run.crashes) == 1
    crash = run.crashes[0]
    assert "IndexError: planted" in crash.error and crash.index > 0
    pcap = Path(crash.saved[0])
    assert pcap.suffix == ".pcap" and pcap.stat().st_size > 500 * 40


# --- bugs the fuzz found, pinned as regressions ------------------------------------------------


def _lbtru_session_at_zero() -> tuple[ContextCore, Addr]:
    """A core with an LBT-RU receiving session that has delivered sequence number 0."""
    source: Addr = ("10.0.0.2", 14380)
    core = ContextCore("c", "10.0.0.1")
    core.open_lbtru_receiver(LBTRU_RECEIVER_PORT, source, 7)
    core.receive_at(LBTRU_RECEIVER_PORT, lbtru.LbtruData(
        sqn=0, trail_sqn=0, options=[lbtru.SidOption(session_id=7)], payload=b"").build(),
        source, 0.0)
    return core, source


def _receiving_session(core: ContextCore) -> LbtruReceiverSession:
    sessions = [b.session for b in core.lbtru if isinstance(b.session, LbtruReceiverSession)]
    assert len(sessions) == 1
    return sessions[0]


def _held(action: Callable[[], object], seconds: float) -> bool:
    """Whether ``action`` was still running after ``seconds`` (it is then interrupted)."""
    try:
        with fuzzing.watchdog(seconds):
            action()
    except fuzzing.Hang:
        return True
    return False


@pytest.mark.parametrize("kind", ["DATA", "SM", "NCF"])
def test_an_lbtru_trail_far_ahead_does_not_hold_the_core(kind: str) -> None:
    """One small datagram from the source's address whose trailing edge is 2^31 - 1 ahead
    (the most an unwrapped number can be) moves delivery there in one step, reporting the run
    as lost; it held the core for minutes when delivery stepped one number at a time (the fuzz
    met it through NCFs 12 times in 10^6 frames)."""
    core, source = _lbtru_session_at_zero()
    sid = [lbtru.SidOption(session_id=7)]
    far = (1 << 31) - 1
    packet = {"DATA": lbtru.LbtruData(sqn=1, trail_sqn=far, options=sid, payload=b""),
              "SM": lbtru.LbtruSm(sm_sqn=1, lead_sqn=0, trail_sqn=far, options=sid),
              "NCF": lbtru.LbtruNcf(trail_sqn=far, ncfs=[1], options=sid)}[kind]
    datagram = packet.build()
    assert not _held(lambda: core.receive_at(LBTRU_RECEIVER_PORT, datagram, source, 0.1), 5.0)
    session = _receiving_session(core)
    assert session.state.expected is not None and session.state.expected >= far
    assert not session.state.missing


def test_an_lbtru_sequence_number_far_ahead_is_naked_within_a_bounded_window() -> None:
    """A DATA datagram 2^20 - 1 numbers ahead made a million NAK entries that every later NAK
    timer walked again (about 1.3 s each); only the last MAX_GAP numbers are NAKed now and the
    older part is reported lost at once."""
    from reference_impl.lbtru_session import MAX_GAP, Lost
    core, source = _lbtru_session_at_zero()
    reported: list[object] = []
    core.on_lbtru_event = lambda binding, event: reported.append(event)  # type: ignore[method-assign]
    far = (1 << 20) - 1
    datagram = lbtru.LbtruData(sqn=far, trail_sqn=0,
                               options=[lbtru.SidOption(session_id=7)], payload=b"").build()
    assert not _held(lambda: core.receive_at(LBTRU_RECEIVER_PORT, datagram, source, 0.1), 5.0)
    session = _receiving_session(core)
    assert len(session.state.missing) == MAX_GAP
    assert min(session.state.missing) == far - MAX_GAP
    lost = [e for e in reported if isinstance(e, Lost)]
    assert [(e.first, e.last, e.reason) for e in lost] == [(1, far - MAX_GAP - 1, "window")]
    assert not _held(lambda: core.handle_timer(5.0), 5.0)
