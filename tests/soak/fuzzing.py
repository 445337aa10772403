"""Seeded fuzzing of ``ump dissect`` and the store and receiver cores, a million frames at a time.

The Hypothesis tests of :mod:`tests.reference_impl.test_bad_input` find *kinds* of bad input
with shrinking; this module pushes *volume* through the same entry points, cheaply enough for
10^6 frames per target on a 2-core machine, and reproducibly: every chunk of
:data:`CHUNK` frames is generated from ``random.Random(f"{seed}:{target}:{chunk}")`` and runs
against a fresh bench, so ``seed`` and ``chunk`` replay it exactly.

Seeds (valid input the mutations start from):

* the frames of ``captures/reference`` and ``captures/corpus`` (every transport, LBMR, store
  traffic), and the LBMC messages framed out of their TCP streams;
* the messages the benches of ``test_bad_input`` are built from (the store bench's
  registrations, data and requests naming its clients, the receiver bench's templates), and
  what a live source and store send a receiver in the simulator (recorded once).

Mutations: bit flips, overwritten bytes and 16/32-bit words (0, 1, all ones, sign bits, the
length itself), inserted, deleted and duplicated ranges, truncations, random extensions,
splices of two seeds, a lying ``msglen``, and random bytes of random length; one to three at a
time, and 3% of the frames go through unmutated so the benches' state keeps moving.

Targets:

* ``dissect``: each chunk is written as a pcap (UDP and TCP frames rebuilt around mutated
  payloads with consistent TCP sequence numbers, plus gaps, overlaps and mutated link/IP
  headers) and run through ``ump dissect``'s entry point in this process
  (:func:`ump.cli.main`) in a rotating output mode; one chunk in ten is also damaged at the
  file level (header, record lengths, truncation).  Only :class:`wire.WireError` may escape.
* ``store`` / ``receiver``: each frame is handed to the core on one of its connections (the
  bench source's request and transport connections, the bench receiver's, a stranger's), as
  a topic-resolution datagram, or in pieces; timers fire as the virtual clock moves;
* ``lbtru``: the same for a store (even chunks) or a receiver (odd chunks) joined to an LBT-RU
  source, most frames being datagrams on its LBT-RU session from the source's address (the
  session code both cores share).  The
  cores promise that bad input never raises (``reference_impl.context``), so *any* exception
  is a crash there; each ``InputDropped`` must come with its WARNING line (counted as
  ``drops without a log line``, which the tests require to be 0).

A crash, or a hang (one frame held longer than :data:`HANG_SECONDS`, or a dissect chunk longer
than :data:`CHUNK_HANG_SECONDS`), is recorded with its seed, chunk and frame index; the input
(the frame, or the chunk's pcap) and a JSON note with the traceback and the replay command
are saved in the output directory.  Replay one chunk::

    python -m tests.soak.fuzzing --target store --seed 22 --chunk 17 --frames 5000
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import signal
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import FrameType
from typing import Any

from reference_impl.context import ContextCore, control
from reference_impl.events import (
    Addr,
    InputDropped,
    Level,
    LogRecord,
    MessageDelivered,
    UnrecoverableLoss,
)
from reference_impl.fastmsg import data_message
from reference_impl.sim import ConnKey, StreamEvent, StreamEventKind
from tests.reference_impl.strategies import with_prefix
from wire.errors import WireError
from wire.lbmc import AckType, KeepaliveType, MessageType, UmeAck, UmeKeepalive, UmeRxreq
from wire.lbttcp import LbttcpStream
from wire.pcap import (
    TCP_SYN,
    PcapWriter,
    decode_frame,
    read_capture,
    tcp_frame,
    udp_frame,
)

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = [*sorted((ROOT / "captures" / "reference").glob("*.pcap")),
            *sorted((ROOT / "captures" / "corpus").glob("*.pcap"))]
STORE_PORT = 14567
"""Every capture of the corpus puts its stores there (``captures/corpus/README.md``)."""
CHUNK = 5000
HANG_SECONDS = 5.0
CHUNK_HANG_SECONDS = 300.0
TARGETS = ("dissect", "store", "receiver", "lbtru")
DISSECT_MODES: list[list[str]] = [[], ["--brief"], ["--json"], ["--um-only"],
                                  ["--brief", "--lbtru-port", "14567"]]
INTERESTING = (0, 1, 2, 3, 4, 0x7F, 0x80, 0xFF, 0x7FFF, 0x8000, 0xFFFF, 0x7FFFFFFF,
               0x80000000, 0xFFFFFFFF)


class Hang(BaseException):
    """Raised by the watchdog's SIGALRM in the middle of a frame that took too long (a
    BaseException, so that no ``except Exception`` in the code under test swallows it)."""


@dataclass
class Crash:
    """One input that made the target raise or hang.

    Attributes:
        target: ``dissect``, ``store`` or ``receiver``.
        seed / chunk / index: where it is in the run (``index`` within the chunk; for a
            dissect crash, the frame number of the pcap if the frame could be located).
        error: the exception, one line.
        saved: the files written for it (input and JSON note).
    """

    target: str
    seed: int
    chunk: int
    size: int
    index: int
    error: str
    saved: list[str] = field(default_factory=list)

    @property
    def replay(self) -> str:
        return (f"python -m tests.soak.fuzzing --target {self.target} --seed {self.seed} "
                f"--chunk {self.chunk} --frames {self.size}")

    def line(self) -> str:
        return (f"{self.target} crash: seed {self.seed} chunk {self.chunk} frame {self.index}: "
                f"{self.error} (replay: {self.replay}; input {', '.join(self.saved)})")


@dataclass
class FuzzRun:
    """The figures of one run over one target."""

    target: str
    seed: int
    frames: int = 0
    chunks: int = 0
    seconds: float = 0.0
    crashes: list[Crash] = field(default_factory=list)
    counts: Counter[str] = field(default_factory=Counter)

    def summary(self) -> dict[str, object]:
        return {"target": self.target, "seed": self.seed, "frames": self.frames,
                "chunks": self.chunks, "crashes": len(self.crashes),
                "seconds": round(self.seconds, 1),
                "frames_per_s": round(self.frames / self.seconds) if self.seconds else 0,
                "counts": dict(sorted(self.counts.items()))}


# --- seeds ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SeedSegment:
    """One captured UDP or TCP segment of the corpus, as the pcap generator rebuilds it."""

    proto: str
    src: str
    sport: int
    dst: str
    dport: int
    payload: bytes
    flags: int


def lbmc_frames(stream: bytes) -> list[bytes]:
    """The whole LBMC messages at the start of a TCP byte stream (up to a framing error)."""
    framer = LbttcpStream(decode=False)
    try:
        return [item.raw for item in framer.feed(stream) if item.raw]
    except WireError:
        return []


@cache
def corpus() -> tuple[list[SeedSegment], list[bytes], list[bytes]]:
    """(every decodable segment, the LBMC messages of every TCP stream, every UDP payload)."""
    segments: list[SeedSegment] = []
    streams: dict[tuple[str, int, str, int], bytearray] = {}
    udp: list[bytes] = []
    for path in CAPTURES:
        for record in read_capture(path):
            try:
                seg = decode_frame(record.linktype, record.data)
            except WireError:
                continue
            segments.append(SeedSegment(seg.proto, seg.src, seg.sport, seg.dst, seg.dport,
                                        seg.payload, seg.flags))
            if seg.proto == "tcp":
                streams.setdefault((seg.src, seg.sport, seg.dst, seg.dport),
                                   bytearray()).extend(seg.payload)
            elif seg.payload:
                udp.append(seg.payload)
    messages = [m for s in streams.values() for m in lbmc_frames(bytes(s))]
    return segments, messages, udp


# --- mutations --------------------------------------------------------------------------------


class Mutator:
    """Mutations of seed inputs, all drawn from one ``random.Random`` (through ``random()``
    only: ``randrange`` and ``choice`` cost several times more, and a million frames draw
    some twenty million numbers)."""

    def __init__(self, rng: random.Random, splice_pool: list[bytes]) -> None:
        self.rng = rng
        self.random = rng.random
        self.pool = splice_pool
        self.ops: list[Callable[[bytearray], bytearray]] = [
            self._flip, self._flip, self._set, self._word, self._word, self._insert,
            self._delete, self._truncate, self._truncate, self._extend, self._splice,
            self._splice, self._repeat, self._msglen]

    def below(self, n: int) -> int:
        """A number in ``range(n)`` (0 when ``n`` is 0)."""
        return int(self.random() * n)

    def pick(self, items: Any) -> Any:
        return items[int(self.random() * len(items))]

    def mutate(self, raw: bytes) -> bytes:
        roll = self.random()
        if roll < 0.03:
            return raw
        if roll < 0.08:
            return self.rng.randbytes(self.below(300))
        out = bytearray(raw)
        for _ in range(self.pick((1, 1, 1, 2, 2, 3))):
            out = self.pick(self.ops)(out)
        return bytes(out)

    def framed(self, raw: bytes) -> bytes:
        """A mutation of the LBMC message ``raw`` that still frames as one message (its
        ``msglen`` says its new length), so it reaches the core's handlers and leaves the
        stream usable; ``raw`` itself when the mutation is too short to frame."""
        out = self.mutate(raw)
        if not 4 <= len(out) <= 0xFFFF:
            return raw
        return with_prefix(out, msglen=len(out))

    def _flip(self, out: bytearray) -> bytearray:
        for _ in range(1 + self.below(8)):
            if out:
                out[self.below(len(out))] ^= 1 << self.below(8)
        return out

    def _set(self, out: bytearray) -> bytearray:
        for _ in range(1 + self.below(4)):
            if out:
                out[self.below(len(out))] = self.pick((0, 0xFF, 0x7F, 0x80, self.below(256)))
        return out

    def _word(self, out: bytearray) -> bytearray:
        size = self.pick((2, 4))
        if len(out) < size:
            return out
        pos = self.below(len(out) - size + 1)
        value = self.pick((*INTERESTING, len(out), len(out) + 1, len(out) - 1,
                           self.below(1 << 32))) & ((1 << (8 * size)) - 1)
        out[pos:pos + size] = value.to_bytes(size, self.pick(("big", "little")))
        return out

    def _insert(self, out: bytearray) -> bytearray:
        pos = self.below(len(out))
        out[pos:pos] = self.rng.randbytes(1 + self.below(16))
        return out

    def _delete(self, out: bytearray) -> bytearray:
        pos = self.below(len(out))
        del out[pos:pos + 1 + self.below(16)]
        return out

    def _truncate(self, out: bytearray) -> bytearray:
        return out[:self.below(len(out) + 1)]

    def _extend(self, out: bytearray) -> bytearray:
        return out + self.rng.randbytes(1 + self.below(64))

    def _splice(self, out: bytearray) -> bytearray:
        other = self.pick(self.pool)
        return out[:self.below(len(out) + 1)] + other[self.below(len(other) + 1):]

    def _repeat(self, out: bytearray) -> bytearray:
        if not out:
            return out
        a = self.below(len(out))
        piece = out[a:a + 1 + self.below(32)]
        b = self.below(len(out))
        out[b:b] = piece
        return out

    def _msglen(self, out: bytearray) -> bytearray:
        if len(out) < 4:
            return out
        lie = self.pick((0, 1, 3, 4, len(out) - 1, len(out) + 1, 0xFFFF, self.below(0x10000)))
        return bytearray(with_prefix(bytes(out), msglen=lie))


# --- the watchdog -----------------------------------------------------------------------------


@contextlib.contextmanager
def watchdog(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` inside the block after ``seconds`` (main thread only; elsewhere the
    block runs unguarded)."""
    def on_alarm(signum: int, frame: FrameType | None) -> None:
        raise Hang(f"no progress within {seconds} s")

    try:
        previous = signal.signal(signal.SIGALRM, on_alarm)
    except ValueError:  # not the main thread
        yield
        return
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class FrameGuard:
    """A per-frame watchdog that costs one ``setitimer`` per frame: the handler stays
    installed for the whole chunk."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.armed = False

    def __enter__(self) -> FrameGuard:
        def on_alarm(signum: int, frame: FrameType | None) -> None:
            raise Hang(f"one frame took more than {self.seconds} s")

        try:
            self.previous = signal.signal(signal.SIGALRM, on_alarm)
            self.armed = True
        except ValueError:  # not the main thread
            self.armed = False
        return self

    def arm(self) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc: object) -> None:
        if self.armed:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self.previous)


# --- saving a crash ---------------------------------------------------------------------------


def save_crash(out: Path, crash: Crash, data: bytes, suffix: str, detail: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{crash.target}-seed{crash.seed}-chunk{crash.chunk}-frame{crash.index}"
    input_path = stem.with_suffix(suffix)
    input_path.write_bytes(data)
    note = stem.with_suffix(".json")
    note.write_text(json.dumps({
        "target": crash.target, "seed": crash.seed, "chunk": crash.chunk,
        "index": crash.index, "error": crash.error, "input": str(input_path),
        "replay": crash.replay, **detail}, indent=1))
    crash.saved = [str(input_path), str(note)]


# --- target: ump dissect ----------------------------------------------------------------------


class _Sink(io.TextIOBase):
    """A text stream that keeps only what ``ump dissect`` says about the frames in all: its
    summary line, or (``--json``, which has none) the status of every frame object."""

    STATUS = '"status": "'
    NAMES = {"um": "UM", "not-um": "not UM", "malformed": "malformed", "pending": "partial"}

    def __init__(self) -> None:
        self.summary = ""
        self.statuses: Counter[str] = Counter()

    def write(self, text: str) -> int:
        if text.startswith("# ") and " frames: " in text:  # (not the content-found note)
            self.summary = text
        elif text.startswith('{"frame"'):
            at = text.find(self.STATUS) + len(self.STATUS)
            self.statuses[text[at:text.index('"', at)]] += 1
        return len(text)

    def counts(self) -> Counter[str]:
        """Frames per status, named as in the summary line."""
        out: Counter[str] = Counter()
        for part in self.summary.split(":", 1)[-1].split(";")[0].split(","):
            words = part.split()
            if len(words) >= 2 and words[0].isdigit():
                out[" ".join(words[1:])] += int(words[0])
        for status, n in self.statuses.items():
            out[self.NAMES.get(status, status)] += n
        return out

    def writable(self) -> bool:
        return True


def dissect_frames(rng: random.Random, count: int) -> list[bytes]:
    """``count`` Ethernet frames: corpus segments with mutated payloads, rebuilt with correct
    lengths and (mostly) consistent TCP sequence numbers per flow; 5% with mutated link and
    IP headers instead.  A TCP segment now and then overlaps the bytes before it, leaves a
    gap or carries a SYN: a gap or a SYN restarts the flow's reassembly, which a lying
    ``msglen`` would otherwise hold for up to 64 KiB."""
    segments, messages, _ = corpus()
    mutator = Mutator(rng, [s.payload for s in segments if s.payload] + messages)
    chance = mutator.random
    udp = [s for s in segments if s.proto == "udp"]
    flows: dict[tuple[str, int, str, int], list[SeedSegment]] = {}
    for s in segments:
        if s.proto == "tcp":
            flows.setdefault((s.src, s.sport, s.dst, s.dport), []).append(s)
    streams = list(flows.values())
    cursor = [0] * len(streams)  # a flow's segments are replayed in their order
    next_seq: dict[tuple[str, int, str, int], int] = {}
    frames = []
    for _ in range(count):
        if chance() < 0.4:
            seg = mutator.pick(udp)
        else:
            which = mutator.below(len(streams))
            stream = streams[which]
            seg = stream[cursor[which] % len(stream)]
            cursor[which] += 1
        payload = mutator.mutate(seg.payload) if seg.payload else seg.payload
        if seg.proto == "udp":
            frame = udp_frame(seg.src, seg.sport, seg.dst, seg.dport, payload)
        else:
            key = (seg.src, seg.sport, seg.dst, seg.dport)
            seq = next_seq.get(key, mutator.below(1 << 32))
            flags = seg.flags
            roll = chance()
            if roll < 0.02:
                seq -= 1 + mutator.below(200)  # overlaps what was sent: a retransmission
            elif roll < 0.06:
                seq += 1 + mutator.below(2000)  # bytes missing from the capture
            elif roll < 0.08:
                flags |= TCP_SYN  # a new connection on the same ports
            frame = tcp_frame(seg.src, seg.sport, seg.dst, seg.dport, seq, 0, flags, payload)
            next_seq[key] = (seq + len(payload) + (1 if flags & TCP_SYN else 0)) & 0xFFFFFFFF
        if chance() < 0.05:
            frame = mutator.mutate(frame)
        frames.append(frame)
    return frames


def damaged(rng: random.Random, data: bytes) -> bytes:
    """A pcap file damaged at the file level: its header, a record length, or its end."""
    out = bytearray(data)
    roll = rng.random()
    if roll < 0.3:
        out[rng.randrange(24)] = rng.randrange(256)
    elif roll < 0.6 and len(out) > 40:
        pos = rng.randrange(24, len(out) - 16)
        out[pos:pos + 4] = rng.choice((0xFFFFFFFF, 0x7FFFFFFF, 0, rng.randrange(1 << 32))
                                      ).to_bytes(4, "little")
    else:
        del out[rng.randrange(len(out) + 1):]
    return bytes(out)


def run_dissect(path: Path, mode: list[str]) -> tuple[int, _Sink]:
    """``ump dissect PATH --store-port 14567 MODE`` in this process: (exit status, what it
    wrote; -1 for a :class:`WireError`, the one exception bad input may raise).  Any other
    exception propagates to the caller."""
    from ump.cli import main

    sink = _Sink()
    with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(io.StringIO()):
        try:
            code = main(["dissect", str(path), "--store-port", str(STORE_PORT), *mode])
        except WireError:
            return -1, sink
    return code, sink


def locate_dissect_crash(path: Path) -> int:
    """The number of the first frame whose report cannot be built or printed (0: none)."""
    from wire.dissect import Dissector, print_report

    dissector = Dissector()
    dissector.ports.store_ports = [STORE_PORT]
    try:
        for record in read_capture(path):
            try:
                report = dissector.frame(record)
                print_report(report, io.StringIO())
                json.dumps(report.to_json())
            except WireError:
                continue
            except Exception:
                return record.number
    except WireError:
        pass
    return 0


def run_cli(path: Path, mode: list[str]) -> tuple[int, str, str]:
    """The real ``ump dissect`` command on ``path``: (exit status, summary line, stderr)."""
    proc = subprocess.run([sys.executable, "-m", "ump", "dissect", str(path), "--store-port",
                           str(STORE_PORT), *mode], capture_output=True, text=True,
                          timeout=CHUNK_HANG_SECONDS, check=False)
    lines = [line for line in proc.stdout.splitlines()
             if line.startswith("# ") and " frames: " in line]
    return proc.returncode, lines[-1] + "\n" if lines else "", proc.stderr


def dissect_chunk(seed: int, chunk: int, frames: int, work: Path, out: Path,
                  run: FuzzRun, cli_every: int = 0) -> None:
    """One chunk through ``ump dissect`` in this process; every ``cli_every``-th chunk also
    through the real command, which must print the same summary and no traceback."""
    rng = random.Random(f"{seed}:dissect:{chunk}")
    pcap = work / f"dissect-{seed}-{chunk}.pcap"
    with PcapWriter(pcap) as writer:
        for i, frame in enumerate(dissect_frames(rng, frames)):
            writer.write(1_700_000_000 + i * 0.001, frame)
    mode = DISSECT_MODES[chunk % len(DISSECT_MODES)]
    inputs = [(pcap, mode)]
    if rng.random() < 0.1:
        broken = work / f"dissect-{seed}-{chunk}-damaged.pcap"
        broken.write_bytes(damaged(rng, pcap.read_bytes()))
        inputs.append((broken, ["--brief"]))
    for path, args in inputs:
        try:
            with watchdog(CHUNK_HANG_SECONDS):
                code, sink = run_dissect(path, args)
        except (Exception, Hang) as exc:
            number = locate_dissect_crash(path)
            crash = Crash("dissect", seed, chunk, frames, number, f"{type(exc).__name__}: {exc}")
            save_crash(out, crash, path.read_bytes(), ".pcap",
                       {"mode": args, "traceback": traceback.format_exc()})
            run.crashes.append(crash)
            continue
        # a well-formed capture must be read to the end (exit 0); a damaged one may not be
        run.counts[f"exit {code}" if path is pcap else f"damaged: exit {code}"] += 1
        summary = sink.summary
        if cli_every and chunk % cli_every == 0:
            run.counts["real CLI runs"] += 1
            cli_code, cli_summary, stderr = run_cli(path, args)
            if "Traceback" in stderr or cli_code != code or cli_summary != summary:
                crash = Crash("dissect", seed, chunk, frames, 0,
                              f"the real CLI differs: exit {cli_code} (in-process {code}), "
                              f"summary {cli_summary.strip()!r} (in-process "
                              f"{summary.strip()!r}); stderr {stderr[-500:]!r}")
                save_crash(out, crash, path.read_bytes(), ".pcap", {"mode": args})
                run.crashes.append(crash)
        if path is pcap:
            run.counts.update(sink.counts())
    for path, _ in inputs:
        path.unlink()
    run.frames += frames


# --- targets: the store and receiver cores ----------------------------------------------------


@dataclass
class CoreBench:
    """A core with live state and the connections the fuzzer writes to.

    Attributes:
        core: the store or receiver core.
        conns: channel name -> connection key (the bench's own peers).
        seeds: channel name -> valid messages for that channel (``lbmr``: datagrams).
        stranger_ip: where stranger connections come from.
        live: the bench source's data message with a given sequence number (valid): a fifth
            of the transport frames are the next one, so the core keeps storing or delivering
            between the garbage.
        first_live: the first of them (the one after what the bench holds).
        lbtru: (the core's LBT-RU port, the source's LBT-RU address) when the bench source
            sends on LBT-RU: frames of the ``lbtru`` channel are its datagrams.
    """

    core: ContextCore
    conns: dict[str, ConnKey]
    seeds: dict[str, list[bytes]]
    stranger_ip: str
    live: Callable[[int], bytes]
    first_live: int
    lbtru: tuple[int, Addr] | None = None

    def intact(self) -> bool:
        if self.lbtru is not None and not self.core.lbtru:
            return False  # the LBT-RU session is gone (the fuzz reset or timed it out)
        return all(key in self.core.connections for key in self.conns.values())


def store_bench() -> CoreBench:
    """The store bench of ``test_bad_input`` (a source with ten messages and a receiver that
    acknowledged four), with seed messages that name its clients."""
    from tests.reference_impl import test_bad_input as bad

    bench = bad.store_bench()
    src, rcv = bench.source_reg_id, bench.receiver_reg_id
    tidx, xidx = bad.TOPIC_IDX, bad.TRANSPORT_IDX
    _, messages, udp = corpus()
    data = [data_message(tidx, sqn, bad.payload(sqn)) for sqn in range(bad.HELD, bad.HELD + 40)]
    data += [data_message(tidx, sqn, b"x", mtype=MessageType.PRORX) for sqn in range(3)]
    requests = [control(UmeAck(type=AckType.CDELV, transport_idx=xidx, id_2=rcv,
                               rcv_reg_id=rcv, seqnum=n)) for n in range(0, bad.HELD + 5, 3)]
    requests += [control(UmeRxreq(request_idx=n, transport_idx=xidx, id_2=rcv, seqnum=n,
                                  rx_port=bad.RECEIVER_REQUEST[1], rx_ip=0x0A000004))
                 for n in range(0, bad.HELD + 5, 4)]
    requests.append(control(UmeKeepalive(type=KeepaliveType.RECEIVER, r_flag=1,
                                         transport_idx=xidx, topic_idx=tidx, reg_id=rcv)))
    source_side = [control(UmeKeepalive(type=KeepaliveType.SOURCE, r_flag=1,
                                        transport_idx=xidx, topic_idx=tidx, reg_id=src))]
    registrations = [m.build() for m in bad.REGISTRATIONS + bad.REQUESTS_FROM_STRANGERS]
    return CoreBench(
        bench.store,
        {"source": bench.source_conn, "transport": bench.transport_conn,
         "receiver": bench.receiver_conn},
        {"transport": data + messages[:200], "receiver": requests + messages[:200],
         # registrations weighted up: two seeds among 200 corpus messages left a 2000-frame
         # smoke run with no registration at all whenever the corpus changed
         "source": source_side + registrations[:2] * 10 + messages[:200],
         "stranger": registrations + requests + messages,
         "lbmr": [p.build() for p in bad.VALID_LBMR] + udp},
        bad.STRANGER_IP,
        lambda sqn: data_message(tidx, sqn, bad.payload(sqn)), bad.HELD)


RECEIVER_SEED = 5


def _receiver_deployment(seed: int) -> tuple[Any, Any, ContextCore, ConnKey, ConnKey]:
    """A simulated store, source and receiver on the bench topic of ``test_bad_input``, the
    receiver registered: (deployment, source, receiver, the receiver's transport connection,
    its store connection), the connections told apart by their peers' addresses."""
    from reference_impl.deployment import SimDeployment
    from tests.reference_impl import test_bad_input as bad

    d = SimDeployment(seed=seed)
    store = d.add_store("store1", topics=bad.KEEP_EVERYTHING)
    src = d.add_source("src", bad.TOPIC)
    rcv = d.add_receiver("rcv", bad.TOPIC)
    assert d.run_until(lambda: src.complete and rcv.complete, 10), "the bench did not register"
    (store_conn,) = [k for k in rcv.connections if k[1] == store.addr]
    (transport,) = [k for k in rcv.connections if k != store_conn]
    return d, src, rcv, transport, store_conn


@cache
def _receiver_traffic(seed: int) -> dict[str, list[bytes]]:
    """What a live source and store send a receiver (recorded from a simulated deployment:
    data, SRIs, keepalives, retransmissions), by connection."""
    from tests.reference_impl import test_bad_input as bad

    d, src, rcv, transport, store_conn = _receiver_deployment(seed)
    seen: dict[ConnKey, bytearray] = {transport: bytearray(), store_conn: bytearray()}
    original = rcv.stream_event

    def record(event: StreamEvent, now: float) -> None:
        if event.kind is StreamEventKind.DATA and event.conn in seen:
            seen[event.conn].extend(event.data)
        original(event, now)

    rcv.stream_event = record  # type: ignore[method-assign]
    for sqn in range(60):
        src.send(bad.payload(sqn))
        d.run(0.05)
    d.run(3)
    return {"transport": lbmc_frames(bytes(seen[transport])),
            "store": lbmc_frames(bytes(seen[store_conn]))}


def receiver_bench() -> CoreBench:
    """A registered receiver of the bench topic of ``test_bad_input``, receiving over
    LBT-TCP, taken out of its simulator: the fuzzer is its only peer from here on."""
    from tests.reference_impl import test_bad_input as bad

    _, src, rcv, transport, store_conn = _receiver_deployment(RECEIVER_SEED)
    traffic = _receiver_traffic(RECEIVER_SEED)
    _, messages, udp = corpus()
    templates = [t.build() for t in bad.RECEIVER_TEMPLATES]
    tir = bad.lbmr.LbmrPacket(tirs=[bad.source_tir()]).build()
    return CoreBench(
        rcv, {"transport": transport, "store": store_conn},
        {"transport": traffic["transport"] + messages[:200],
         "store": traffic["store"] + templates + messages[:200],
         "stranger": templates + traffic["store"] + messages,
         "lbmr": [tir, *udp]},
        bad.STRANGER_IP,
        lambda sqn: data_message(src.topic_idx, sqn, bad.payload(sqn)), 0)


@cache
def _lbtru_traffic(seed: int) -> dict[str, list[bytes]]:
    """The LBT-RU datagrams a store and a receiver get from a live LBT-RU source (session
    setup, data, SRIs, session messages), recorded from a simulated deployment."""
    from tests.reference_impl import test_bad_input as bad

    d, src, store, rcv = _lbtru_deployment(seed)
    seen: dict[str, list[bytes]] = {"store": [], "receiver": []}
    for name, core in (("store", store), ("receiver", rcv)):
        original = core.receive_at

        def record(port: int, data: bytes, addr: Addr, now: float, name: str = name,
                   core: ContextCore = core, original: Any = original) -> None:
            if port in core.lbtru_ports:
                seen[name].append(data)
            original(port, data, addr, now)

        core.receive_at = record
    for sqn in range(60):
        src.send(bad.payload(sqn))
        d.run(0.05)
    d.run(3)
    return seen


def _lbtru_deployment(seed: int) -> tuple[Any, Any, Any, Any]:
    """A simulated store, LBT-RU source and receiver on the bench topic, all registered and
    joined: (deployment, source, store, receiver)."""
    from reference_impl.deployment import SimDeployment
    from tests.reference_impl import test_bad_input as bad

    d = SimDeployment(seed=seed)
    store = d.add_store("store1", topics=bad.KEEP_EVERYTHING)
    src = d.add_source("src", bad.TOPIC, transport="lbt-ru")
    rcv = d.add_receiver("rcv", bad.TOPIC)
    assert d.run_until(lambda: src.complete and rcv.complete and bool(store.lbtru)
                       and bool(rcv.lbtru), 10), "the LBT-RU bench did not join"
    return d, src, store, rcv


def lbtru_bench(which: str) -> CoreBench:
    """The store (``which`` = ``store``) or the receiver of an LBT-RU deployment, taken out of
    its simulator; the ``lbtru`` channel feeds its LBT-RU port as if from the source."""
    from tests.reference_impl import test_bad_input as bad

    _, src, store, rcv = _lbtru_deployment(RECEIVER_SEED)
    traffic = _lbtru_traffic(RECEIVER_SEED)
    _, messages, udp = corpus()
    core = store if which == "store" else rcv
    (binding,) = core.lbtru
    source_addr = binding.session.source
    conns: dict[str, ConnKey]
    if which == "receiver":
        conns = {"store": next(k for k in rcv.connections if k[1] == store.addr)}
    else:
        conns = {"source": next(k for k in store.connections if k[1][0] == src.ip),
                 "receiver": next(k for k in store.connections if k[1][0] == rcv.ip)}
    return CoreBench(
        core, conns,
        # the session's own traffic two times in three, the corpus's datagrams otherwise
        {"lbtru": traffic[which] * max(1, 2 * len(udp) // max(1, len(traffic[which]))) + udp,
         "store": messages[:200], "source": messages[:200],
         "receiver": messages[:200], "stranger": messages,
         "lbmr": [bad.lbmr.LbmrPacket(tirs=[bad.source_tir()]).build(), *udp]},
        bad.STRANGER_IP,
        lambda sqn: b"", 0, (binding.port, source_addr))


BENCHES: dict[str, Callable[[int], CoreBench]] = {
    "store": lambda chunk: store_bench(),
    "receiver": lambda chunk: receiver_bench(),
    # even chunks fuzz the store's LBT-RU port, odd ones the receiver's
    "lbtru": lambda chunk: lbtru_bench("receiver" if chunk % 2 else "store"),
}
CHANNEL_WEIGHTS = {"transport": 30, "receiver": 20, "store": 20, "source": 15, "stranger": 20,
                   "lbmr": 15, "lbtru": 60}
REBUILD_EVERY = 1000
"""Frames after which a bench is rebuilt even if intact: state stays small and the garbage
meets a known state often."""


class CoreFeeder:
    """Feeds one chunk's frames to a core bench, rebuilding it when the fuzz broke one of its
    connections (a framing error closes it) and every :data:`REBUILD_EVERY` frames."""

    def __init__(self, target: str, rng: random.Random, run: FuzzRun, chunk: int = 0) -> None:
        self.target, self.rng, self.run, self.chunk = target, rng, run, chunk
        self.bench = BENCHES[target](chunk)
        lbtru = ["lbtru"] if self.bench.lbtru is not None else []
        self.channels = ["stranger", "lbmr", *lbtru, *self.bench.conns]
        self.weights = [CHANNEL_WEIGHTS[c] for c in self.channels]
        pool = [m for seeds in self.bench.seeds.values() for m in seeds]
        self.mutator = Mutator(rng, pool)
        self.now = 2.0
        self.fed = 0
        self.live = self.bench.first_live
        self.stranger: ConnKey | None = None
        self.stranger_port = 40000

    def rebuild(self) -> None:
        self.bench = BENCHES[self.target](self.chunk)
        self.stranger, self.fed, self.live = None, 0, self.bench.first_live
        self.now = 2.0
        self.run.counts["bench rebuilds"] += 1

    def next_frame(self) -> tuple[str, bytes]:
        """A channel and a frame for it: on the bench's own connections most mutations keep
        the framing (a broken stream is closed, and the bench must be rebuilt)."""
        mutator = self.mutator
        channel = self.rng.choices(self.channels, self.weights)[0]
        if channel == "transport" and mutator.random() < 0.2:
            self.live = (self.live + 1) & 0xFFFFFFFF
            return channel, self.bench.live(self.live - 1)
        seed = mutator.pick(self.bench.seeds[channel])
        if channel in self.bench.conns and mutator.random() < 0.97:
            return channel, mutator.framed(seed)
        return channel, mutator.mutate(seed)

    def feed(self, channel: str, raw: bytes) -> None:
        """Hand ``raw`` to the core on ``channel`` and drain everything it produced."""
        core, rng = self.bench.core, self.rng
        self.now += rng.choice((0.0005, 0.001, 0.01)) if rng.random() < 0.99 else \
            rng.uniform(1, 30)
        now = self.now
        if channel == "lbmr":
            core.receive(raw, (self.bench.stranger_ip, 12965), now)
        elif channel == "lbtru" and self.bench.lbtru is not None:
            port, source = self.bench.lbtru
            core.receive_at(port, raw, source, now)
        else:
            if channel == "stranger":
                if self.stranger is None or self.stranger not in core.connections:
                    self.stranger_port += 1
                    local = next(iter(self.bench.conns.values()))[0]
                    self.stranger = (local, (self.bench.stranger_ip, self.stranger_port))
                    core.stream_event(StreamEvent(StreamEventKind.ACCEPTED, self.stranger), now)
                key = self.stranger
            else:
                key = self.bench.conns[channel]
            pieces = [raw]
            if len(raw) > 1 and rng.random() < 0.2:
                cut = rng.randrange(1, len(raw))
                pieces = [raw[:cut], raw[cut:]]
            for piece in pieces:
                core.stream_event(StreamEvent(StreamEventKind.DATA, key, piece), now)
            if channel == "stranger" and rng.random() < 0.1:
                kind = rng.choice((StreamEventKind.CLOSED, StreamEventKind.RESET))
                core.stream_event(StreamEvent(kind, key), now)
        due = core.get_timer()
        if due is not None and due <= now:
            core.handle_timer(now)
        events = core.events()
        for i, event in enumerate(events):
            self.run.counts[type(event).__name__] += 1
            # the receiver skipped ahead (a mutated sequence number, a loss given up): the
            # live stream follows, or it would only ever be old news
            if isinstance(event, MessageDelivered):
                self.live = max(self.live, (event.sequence_number + 1) & 0xFFFFFFFF)
            elif isinstance(event, UnrecoverableLoss):
                self.live = max(self.live, (event.last + 1) & 0xFFFFFFFF)
            elif isinstance(event, InputDropped):
                # swallowed, and said so: a WARNING naming the reason follows each drop
                log = events[i + 1] if i + 1 < len(events) else None
                if not (isinstance(log, LogRecord) and log.level is Level.WARNING
                        and event.reason in log.text):
                    self.run.counts["drops without a log line"] += 1
        core.stream_commands(now)
        core.datagrams_to_send(now)
        core.datagrams_from(now)


def core_chunk(target: str, seed: int, chunk: int, frames: int, out: Path, run: FuzzRun) -> None:
    rng = random.Random(f"{seed}:{target}:{chunk}")
    feeder = CoreFeeder(target, rng, run, chunk)
    with FrameGuard(HANG_SECONDS) as guard:
        for index in range(frames):
            if feeder.fed >= REBUILD_EVERY or not feeder.bench.intact():
                feeder.rebuild()
            channel, raw = feeder.next_frame()
            guard.arm()
            try:
                feeder.feed(channel, raw)
            except (Exception, Hang) as exc:
                crash = Crash(target, seed, chunk, frames, index, f"{type(exc).__name__}: {exc}")
                save_crash(out, crash, raw, ".bin",
                           {"channel": channel, "hex": raw.hex(),
                            "traceback": traceback.format_exc()})
                run.crashes.append(crash)
                feeder.rebuild()
            feeder.fed += 1
            run.counts[f"channel {channel}"] += 1
    run.frames += frames


# --- runs -------------------------------------------------------------------------------------


def fuzz(target: str, *, frames: int, seed: int, out: Path, work: Path, first_chunk: int = 0,
         chunk_size: int = CHUNK, cli_every: int = 0,
         progress: Callable[[FuzzRun], None] | None = None) -> FuzzRun:
    """``frames`` fuzzed frames through ``target``, in chunks of ``chunk_size`` from
    ``first_chunk`` on (``cli_every``: see :func:`dissect_chunk`)."""
    run = FuzzRun(target, seed)
    started = time.monotonic()
    chunk = first_chunk
    left = frames
    while left > 0:
        size = min(chunk_size, left)
        if target == "dissect":
            dissect_chunk(seed, chunk, size, work, out, run, cli_every)
        else:
            core_chunk(target, seed, chunk, size, out, run)
        left -= size
        chunk += 1
        run.chunks += 1
        run.seconds = time.monotonic() - started
        if progress is not None:
            progress(run)
    run.seconds = time.monotonic() - started
    return run


def main(argv: list[str] | None = None) -> int:
    """Replay one chunk (``--chunk``) or run a whole campaign from the command line."""
    parser = argparse.ArgumentParser(prog="python -m tests.soak.fuzzing",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--target", choices=TARGETS, required=True)
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--chunk", type=int, default=0, help="first chunk")
    parser.add_argument("--frames", type=int, default=CHUNK,
                        help=f"frames per chunk and in all (default {CHUNK}: one chunk)")
    parser.add_argument("--total", type=int, default=0, help="frames in all (default --frames)")
    parser.add_argument("--cli-every", type=int, default=0,
                        help="dissect: every N-th chunk also through the real command")
    parser.add_argument("--out", type=Path, default=Path("fuzz-crashes"),
                        help="where crashing inputs go (default ./fuzz-crashes)")
    args = parser.parse_args(argv)
    work = args.out / "work"
    work.mkdir(parents=True, exist_ok=True)
    run = fuzz(args.target, frames=args.total or args.frames, seed=args.seed, out=args.out,
               work=work, first_chunk=args.chunk, chunk_size=args.frames,
               cli_every=args.cli_every)
    for crash in run.crashes:
        print(crash.line())
    print(json.dumps(run.summary(), indent=1))
    return 1 if run.crashes else 0


if __name__ == "__main__":
    sys.exit(main())
