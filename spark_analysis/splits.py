"""Byte-range splits of pcap and pcapng captures, and the reader of one split.

Spark reads a large capture in parallel only if each task can start in the middle of the file.
Neither format has sync markers, so a task that starts at an arbitrary byte must *find* the
next record boundary.  This module does that without Spark (pure Python + numpy + pyarrow), so
the boundary logic is tested on its own and the data source (:mod:`spark_analysis.pcap_source`)
stays a thin wrapper.  The files themselves (paths and globs, what the driver reads of their
headers, the pcapng section index) are :mod:`spark_analysis.capture_files`, the layer below:
a split carries its :class:`~spark_analysis.capture_files.CaptureFile`, and the names of that
module are importable from here too.

Ownership.  A split ``[start, end)`` owns the records whose header starts at or after
``sync(start)`` and before ``sync(end)``, where ``sync(x)`` (:func:`sync`) is the first record
boundary at or after ``x`` as found by the heuristics below.  When ``sync`` is exact (what the
heuristics are built and tested for) that is exactly "the records whose header starts in
``[start, end)``".  Because the reader of the *previous* split walks the true record chain
and stops at the same ``sync(end)``, a boundary that the heuristics pass over is not lost (the
previous split reads a little further), and a boundary they invent inside a record is caught: the
previous split sees its last record straddle ``sync(end)`` and raises :class:`CaptureError`
instead of letting two tasks disagree.  Nothing is ever dropped or duplicated silently.

Classic pcap resync (:func:`sync` for pcap).  A candidate offset must hold a *plausible*
record header (all thresholds are module constants):

* ``caplen <= snaplen`` (``snaplen`` from the file header; 262144 when it is 0 or larger),
  ``caplen <= origlen <= max(262144, snaplen bound)``;
* the fraction below 10^6 (microsecond magic) or 10^9 (nanosecond magic);
* the seconds within ``[first - TS_BEFORE_FIRST, first + TS_AFTER_FIRST]`` of the file's first
  record (1 day before, 366 days after).

and a *chain*: the ``SYNC_CHAIN`` (4) headers that follow, each placed exactly after the
previous record's data, must also be plausible and within ``TS_NEIGHBOUR`` (1 day) of their
predecessor; a chain may also end exactly at end of file, in a partial header or in a final
record whose data runs past end of file.  A single fake header inside a payload whose length
points exactly at the next real record passes any forward test, so the search also *looks
back* one maximal record (``16 + caplen bound`` bytes): it follows the chains of every candidate
in ``[x - W, x)`` to their first offset at or after ``x`` and takes the answer most of them agree
on (ties: the later offset, the safe side).  All real boundaries in the window vote for the true
answer and a fake inside a payload converges onto it, so only an adversarial nest of fakes can
win the vote, and then the straddle check above raises.  Near the start of the file the walk
simply follows the real chain from the first record.  With no vote (no plausible chain behind
``x``) ``sync`` takes the first candidate at or after ``x`` whose chain holds, and when there is
none up to the end of the file (say, every later record is implausible, like a clock that jumped
by years) it returns the file size: the previous split reads on, which is slow but correct.
The window is what the search reads: ``2 W`` bytes, about 512 KiB for a 262144 snaplen.

pcapng resync.  Blocks start at multiples of 4 and end with a copy of their length, which makes a
fake block that merges into the real chain impossible (its trailer would have to equal the real
block's length).  A candidate needs a block type of the specification (1-10, SHB, custom), a
total length that is a multiple of 4, ``>= 12`` and ``<= PCAPNG_SYNC_MAX_BLOCK`` (16 MiB), the
trailing copy of that length, for an EPB a captured length that fits and an interface id the
section declares, and ``SYNC_CHAIN`` following blocks that pass the same test (any non-zero
type) or end the file.  No look-back is needed.

Reading.  Files are opened through a pyarrow filesystem (local paths, ``file://``, ``hdfs://``,
``s3://``...), read in chunks of ``DEFAULT_CHUNK_SIZE`` (16 MiB); the next chunk starts at the
record the last one cut, so a task holds one chunk plus one record whatever the split size.
Records are found by a walk that reads each record's length (the sequential dependency leaves
nothing to vectorise: compiled, ``_recordwalk.c``, or in Python where that is not built); their
headers are then gathered with numpy through the derived dtypes and the packet bytes are cut
out with one mask, into batches of at most ``DEFAULT_MAX_ROWS`` rows.  A pcapng walk takes the
interfaces of its packets from the driver's section index (see "pcapng context" in
:mod:`spark_analysis.capture_files`) and those its own blocks declare, and refuses, naming
``"scan"``, a section header or interface description that a ``"head"`` index did not list.

Truncated last record.  A capture cut short (tcpdump killed, disk full) ends inside a record.
Like tshark ("cut short in the middle of a packet") the complete records are all returned and
the partial one is dropped and *reported*: :attr:`SplitReader.truncated` names it, and the
reader logs a warning (``on_truncated="warn"``, the default), raises (``on_truncated="error"``)
or leaves the saying to its caller (``"quiet"``).

Damaged record.  A record whose header declares more than a captured packet can hold (a pcap
record over 262,144 bytes, which tshark refuses as "damaged or corrupt"; a pcapng block over
``PCAPNG_MAX_BLOCK``) is damage, not a capture cut short: the split's walk ends there and
reports it the same way (:class:`TruncatedRecord` with ``damaged``), naming the bytes not
read; the next split, if any, finds records again by the boundary search and reads on.

Timestamps are integer nanoseconds since the epoch, exact for every decimal and binary
``if_tsresol`` up to 2^-34; finer binary resolutions are truncated to the nanosecond.  Simple
Packet Blocks carry no time: their ``ts_ns`` is null.  The pcap link type keeps the 16 bits of
the link-layer type (the FCS bits some writers set above them are dropped).
"""

from __future__ import annotations

import logging
import math
import struct
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import pyarrow as pa

from wire import pcap as wpcap
from wire.fastpath import FastLayout

from .capture_files import (
    BLOCK_EPB,
    BLOCK_IDB,
    BLOCK_OLD_PACKET,
    BLOCK_SPB,
    DEFAULT_CAPLEN_BOUND,
    DEFAULT_CHUNK_SIZE,
    NG,
    PCAP_HEADER_SIZE,
    PCAP_RECORD,
    SHB,
    U32,
    Bytes,
    CaptureError,
    CaptureFile,
    FileRef,
    Interface,
    MiB,
    PcapInfo,
    PcapngIndex,
    PcapngIndexMode,
    Section,
    expand_paths,
    open_capture,
    parse_idb,
    shb_order,
)

__all__ = [  # with the names of spark_analysis.capture_files that modules import from here
    "CAPTURE_SCHEMA", "DAY", "DEFAULT_CAPLEN_BOUND", "DEFAULT_CHUNK_SIZE", "DEFAULT_MAX_ROWS",
    "DEFAULT_SPLIT_SIZE", "PCAPNG_MAX_BLOCK", "PCAPNG_SYNC_MAX_BLOCK", "RECORD_WALK",
    "SYNC_CHAIN", "TS_AFTER_FIRST", "TS_BEFORE_FIRST", "TS_NEIGHBOUR", "CaptureError",
    "CaptureFile", "FileRef", "Interface", "MiB", "OnTruncated", "PcapInfo", "PcapngIndex",
    "PcapngIndexMode", "RecordChunk", "Section", "Split", "SplitReader", "TruncatedRecord",
    "expand_paths", "open_capture", "plan", "plan_splits", "read_split", "read_table", "sync",
]

log = logging.getLogger(__name__)

# --- the output ----------------------------------------------------------------------------------

CAPTURE_SCHEMA = pa.schema([
    pa.field("file", pa.string(), nullable=False),
    pa.field("file_offset", pa.int64(), nullable=False),  # offset of the record header
    pa.field("ts_ns", pa.int64()),  # null for pcapng Simple Packet Blocks (no timestamp)
    pa.field("caplen", pa.int32(), nullable=False),
    pa.field("origlen", pa.int32(), nullable=False),
    pa.field("linktype", pa.int32(), nullable=False),
    pa.field("interface_id", pa.int32(), nullable=False),  # 0 for classic pcap
    pa.field("data", pa.binary(), nullable=False),
])
"""One row per captured frame; ``(file, file_offset)`` identifies a row across runs and split
sizes (a frame number would need the whole file read from the start)."""

# --- tuning (documented in the module docstring; tests refer to them by name) --------------------
# (MiB, DEFAULT_CHUNK_SIZE and DEFAULT_CAPLEN_BOUND are defined in spark_analysis.capture_files,
# whose header reading uses them too)

DEFAULT_SPLIT_SIZE = 64 * MiB
DEFAULT_MAX_ROWS = 65536
SYNC_CHAIN = 4
DAY = 86400
TS_BEFORE_FIRST = DAY
TS_AFTER_FIRST = 366 * DAY
TS_NEIGHBOUR = DAY
PCAPNG_SYNC_MAX_BLOCK = 16 * MiB
PCAPNG_MAX_BLOCK = 128 * MiB + 32
"""The longest pcapng block a capture may hold: an enhanced packet block (32 bytes of its
own) around the largest packet tshark reads in any link type (D-Bus's, 128 MiB).  A block
declaring more is damage (:class:`TruncatedRecord`)."""
_PCAPNG_SYNC_REGION = 64 * 1024  # bytes scanned per step of the pcapng boundary search
_INT32_MAX = 2**31 - 1

# --- what the boundary search and the walks add to the layouts of capture_files ------------------

# the block types of the pcapng specification (1-10, SHB, the two custom types)
_SYNC_BLOCK_TYPES = np.array([*range(1, 11), SHB, 0x00000BAD, 0x40000BAD], np.int64)


def _field_offset(layout: FastLayout, name: str) -> int:
    fields = layout.dtype().fields
    assert fields is not None
    return int(fields[name][1])


_INCL_AT = _field_offset(PCAP_RECORD["<"], "incl_len")

_compiled_walk: Callable[..., tuple[int, int]] | None
try:  # the walk in C (built by ``pip install``, optional: see setup.py)
    from ._recordwalk import walk as _compiled_walk
except ImportError:  # no C compiler at install time, or the sources run from a zip
    _compiled_walk = None

RECORD_WALK = "compiled" if _compiled_walk is not None else "python"
"""Which pcap record walk this process uses: ``"compiled"`` (``_recordwalk.c``) or
``"python"`` (the same loop in Python, about 20% of a stage-1 task's CPU on the benchmark
capture)."""


# --- planning ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Split:
    """Bytes ``[start, end)`` of one capture; see "Ownership" in the module docstring."""

    capture: CaptureFile
    start: int
    end: int


def plan_splits(capture: CaptureFile, split_size: int = DEFAULT_SPLIT_SIZE) -> list[Split]:
    """Equal byte ranges covering the file (at least one, even for an empty capture)."""
    if split_size <= 0:
        raise CaptureError(f"splitSize must be a positive number of bytes, not {split_size}")
    count = max(1, math.ceil(capture.size / split_size))
    return [Split(capture, i * split_size, min(capture.size, (i + 1) * split_size))
            for i in range(count)]


def plan(paths: str | Sequence[str], split_size: int = DEFAULT_SPLIT_SIZE,
         pcapng_index: PcapngIndexMode = "head") -> list[Split]:
    """Expand, open and split every file: what the Spark source does on the driver."""
    splits: list[Split] = []
    for ref in expand_paths(paths):
        splits.extend(plan_splits(open_capture(ref, pcapng_index), split_size))
    return splits


# --- reading -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class TruncatedRecord:
    """The record a capture ends inside: where it starts, what it declares, what is there.

    Or, ``damaged``, a record whose header declares more than any captured packet can hold
    (:data:`DEFAULT_CAPLEN_BOUND` for a pcap record, as tshark refuses it: "File has
    N-byte packet, bigger than maximum of 262144"; :data:`PCAPNG_MAX_BLOCK` for a pcapng
    block): the file is damaged there, and the ``available`` bytes from it to the end
    of its piece (the file's end, or where the next split finds records again) are not
    read.  A capture cut short loses its partial last record only; a damaged one loses
    readable packets."""

    file: str
    offset: int
    declared: int | None  # bytes the header announces (header included); None: header cut
    available: int
    damaged: bool = False
    bound: int = 0  # (damaged) the most a record may declare
    header: int = 0  # (damaged) the bytes of ``declared`` before the packet (a pcap record's)

    def __str__(self) -> str:
        if self.damaged:
            what = "packet" if self.header else "block"
            return (f"{self.file}: damaged at offset {self.offset}: a record declares a "
                    f"{(self.declared or 0) - self.header:,}-byte {what}, bigger than the "
                    f"most a capture holds ({self.bound - self.header:,}); the "
                    f"{self.available:,} bytes from there to offset "
                    f"{self.offset + self.available:,} are not read")
        wanted = "a record header" if self.declared is None else f"{self.declared} bytes"
        return (f"{self.file}: the capture is cut short at offset {self.offset} "
                f"({self.available} of {wanted}); the partial record is dropped")


class _Source:
    """An open capture: the boundary search and the chunked record walks."""

    def __init__(self, capture: CaptureFile, chunk_size: int = DEFAULT_CHUNK_SIZE) -> None:
        self.capture, self.size, self.chunk_size = capture, capture.size, chunk_size
        ref = capture.ref
        try:
            self.handle = ref.filesystem.open_input_file(ref.path)
        except OSError as exc:
            raise CaptureError(f"{ref.name}: cannot open ({exc})") from None
        if self.handle.size() != self.size:
            raise CaptureError(f"{ref.name}: the file changed size since it was planned "
                               f"({self.size} -> {self.handle.size()} bytes)")

    def __enter__(self) -> _Source:
        return self

    def __exit__(self, *exc: object) -> None:
        self.handle.close()

    def error(self, offset: int, reason: str) -> CaptureError:
        return CaptureError(f"{self.capture.name}: offset {offset}: {reason}")

    def sync(self, x: int) -> int:
        first = self.capture.first_record
        if x <= first:
            return min(first, self.size)
        if x >= self.size:
            return self.size
        if isinstance(self.capture.info, PcapInfo):
            return _PcapSync(self, self.capture.info).find(x)
        return _PcapngSync(self, self.capture.info).find(x)


def sync(capture: CaptureFile, offset: int) -> int:
    """The first record boundary at or after ``offset`` (file size when there is none): where
    a split starting or ending at ``offset`` starts or ends (see "Ownership" in the module
    docstring)."""
    with _Source(capture) as source:
        return source.sync(offset)


# --- pcap resync ---------------------------------------------------------------------------------


class _PcapSync:
    def __init__(self, source: _Source, info: PcapInfo) -> None:
        self.source, self.info, self.size = source, info, source.size
        self.layout = PCAP_RECORD[info.order]
        self.bound = info.caplen_bound
        self.orig_bound = max(DEFAULT_CAPLEN_BOUND, self.bound)
        first = info.first_ts_sec or 0
        self.sec_lo, self.sec_hi = first - TS_BEFORE_FIRST, first + TS_AFTER_FIRST
        self.window = self.layout.size + self.bound
        # one read covers the look-back and look-ahead windows; chain hops past it are peeks
        self.bytes = Bytes(source.handle, self.size, 2 * self.window + self.layout.size)

    def plausible(self, sec: int, frac: int, incl: int, orig: int) -> bool:
        return (incl <= self.bound and incl <= orig <= self.orig_bound
                and frac < self.info.frac_limit and self.sec_lo <= sec <= self.sec_hi)

    def header(self, offset: int) -> tuple[int, int, int, int]:
        return self.layout.unpack_from(self.bytes.peek(offset, self.layout.size))

    def terminal(self, offset: int) -> bool:
        """End of file exactly, a partial header, or past the end (a truncated record)."""
        return offset > self.size - self.layout.size

    def chain_ok(self, offset: int) -> bool:
        """``offset`` and the SYNC_CHAIN records after it are plausible and adjacent."""
        if self.terminal(offset):
            return True
        head = self.header(offset)
        if not self.plausible(*head):
            return False
        for _ in range(SYNC_CHAIN):
            nxt = offset + self.layout.size + head[2]
            if self.terminal(nxt):
                return True
            following = self.header(nxt)
            if not self.plausible(*following) or abs(following[0] - head[0]) > TS_NEIGHBOUR:
                return False
            offset, head = nxt, following
        return True

    def candidates(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Offsets in ``[lo, hi)`` holding a plausible header, with their caplen and seconds.

        Vectorised: the four u32 members are read at *every* byte offset at once, and compared
        as they are (u32 against Python ints, exact for any bound): widening all of them to
        int64 first cost six times as much (about 3.4 against 0.5 ms a search)."""
        raw = self.bytes.get(lo, hi - lo + self.layout.size - 1)
        count = len(raw) - self.layout.size + 1
        if count <= 0:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        u32 = _at_every_byte(raw, np.dtype(self.info.order + "u4"))
        sec, frac, incl, orig = (u32[_field_offset(self.layout, name) :][:count]
                                 for name in self.layout.names)
        ok = ((incl <= self.bound) & (incl <= orig) & (orig <= self.orig_bound)
              & (frac < self.info.frac_limit) & (sec >= self.sec_lo) & (sec <= self.sec_hi))
        where = np.flatnonzero(ok)
        return where + lo, incl[where].astype(np.int64), sec[where].astype(np.int64)

    def find(self, x: int) -> int:
        first = PCAP_HEADER_SIZE
        rec = self.layout.size
        lo = max(first, x - self.window)
        if lo == first:
            # the real chain from the first record reaches x within one window: just walk it
            self.bytes.get(first, x - first + rec)
            pos = first
            while pos < x:
                if self.terminal(pos):
                    return self.size
                pos += rec + self.header(pos)[2]
            return min(pos, self.size)
        found, incls, secs = self.candidates(lo, x + self.window)
        before_x = int(np.searchsorted(found, x))
        # Python ints from here: the loop below runs once per record in the look-back window
        offsets, lengths, seconds = found.tolist(), incls.tolist(), secs.tolist()
        by_offset = dict(zip(offsets, seconds, strict=True))
        last_header = self.size - rec  # a record starting after this is terminal()
        answers: dict[int, int | None] = {}
        votes: Counter[int] = Counter()
        for i in range(before_x - 1, -1, -1):
            p = offsets[i]
            nxt = p + rec + lengths[i]
            answer: int | None
            if nxt > last_header:
                # p is the last record: a partial header at or after x is the answer, else
                # the file ends before x (or inside p's data) and nothing follows x
                answer = nxt if x <= nxt < self.size else self.size
            else:
                nxt_sec = by_offset.get(nxt)
                if nxt_sec is None or abs(nxt_sec - seconds[i]) > TS_NEIGHBOUR:
                    answer = None
                else:
                    answer = nxt if nxt >= x else answers.get(nxt)
            answers[p] = answer
            if answer is not None:
                votes[answer] += 1
        valid = {a: n for a, n in votes.items() if a >= self.size or self.chain_ok(a)}
        if valid:
            return max(valid, key=lambda a: (valid[a], a))
        return self.forward(x)

    def forward(self, x: int) -> int:
        """The first candidate at or after ``x`` with a chain (no look-back answer exists)."""
        lo = x
        while lo < self.size:
            hi = min(self.size, lo + self.window * 4)
            offsets, _, _ = self.candidates(lo, hi)
            for p in offsets:
                if self.chain_ok(int(p)):
                    return int(p)
            lo = hi
        return self.size


# --- pcapng resync -------------------------------------------------------------------------------


class _PcapngSync:
    def __init__(self, source: _Source, index: PcapngIndex) -> None:
        self.source, self.index, self.size = source, index, source.size
        self.bytes = Bytes(source.handle, self.size, _PCAPNG_SYNC_REGION)

    def block(self, offset: int, order: str, interfaces: int | None
              ) -> tuple[Literal["ok", "bad", "end"], int, str]:
        """Is there a plausible block at ``offset``?  (verdict, next offset, byte order after).

        ``"end"``: end of file, a partial block header, or a plausible block cut by the end of
        the file (so its trailer cannot be checked)."""
        if offset > self.size - 8:
            return "end", self.size, order
        btype = self.bytes.u32(offset, order, peek=True)
        if btype == SHB:
            section_order = shb_order(self.bytes, offset, peek=True)
            if section_order is None:
                return "bad", offset, order
            order, interfaces = section_order, None
        length = self.bytes.u32(offset + 4, order, peek=True)
        if not btype or length is None or length < 12 or length % 4 or \
                length > PCAPNG_SYNC_MAX_BLOCK:
            return "bad", offset, order
        if offset + length > self.size:
            return "end", self.size, order
        if self.bytes.u32(offset + length - 4, order, peek=True) != length:
            return "bad", offset, order
        if btype == BLOCK_EPB:
            lay = NG[order]
            if length < lay.epb_data + 4:
                return "bad", offset, order
            iface, _, _, cap, _ = lay.epb.unpack_from(self.bytes.peek(offset + 8, lay.epb.size))
            if cap > length - lay.epb_data - 4 or (interfaces is not None
                                                   and iface >= interfaces):
                return "bad", offset, order
        return "ok", offset + length, order

    def chain_ok(self, offset: int, order: str, interfaces: int | None) -> bool:
        """The block at ``offset`` is complete (trailer checked) and so are the SYNC_CHAIN
        blocks after it; only those may end the chain at end of file or in a cut block."""
        for hop in range(SYNC_CHAIN + 1):
            verdict, offset, new_order = self.block(offset, order, interfaces)
            if verdict == "bad" or (verdict == "end" and hop == 0):
                return False
            if verdict == "end":
                return True
            if new_order != order:
                order, interfaces = new_order, None
        return True

    def find(self, x: int) -> int:
        pos = (x + 3) & ~3
        section = self.index.section_at(pos)
        interfaces, order = len(section.interfaces), section.order
        region = _PCAPNG_SYNC_REGION
        while pos < self.size:
            raw = self.bytes.get(pos, region)
            words = np.frombuffer(raw[: len(raw) & ~3], np.dtype(order + "u4"))
            if len(words) >= 2:
                types, lengths = words[:-1].astype(np.int64), words[1:].astype(np.int64)
                # a boundary is only looked for at a standard block type; a chain may pass
                # through any type (see the module docstring)
                ok = np.isin(types, _SYNC_BLOCK_TYPES) & (lengths >= 12) & (
                    lengths % 4 == 0) & (lengths <= PCAPNG_SYNC_MAX_BLOCK)
                idx = np.arange(len(types))
                trailer_at = idx + lengths // 4 - 1
                inside = trailer_at < len(words)
                trailer = np.where(inside, words[np.minimum(trailer_at, len(words) - 1)], -1)
                ok &= (~inside) | (trailer == lengths) | (types == SHB)
                for i in np.flatnonzero(ok | (types == SHB)):
                    offset = pos + 4 * int(i)
                    if self.chain_ok(offset, order, interfaces):
                        return offset
            pos += max(4, len(words) * 4 - 4)
        return self.size


# --- the split reader ----------------------------------------------------------------------------


OnTruncated = Literal["warn", "error", "quiet"]
"""What a reader does with a :class:`TruncatedRecord`: log a warning, raise, or nothing (its
caller says it: ``ump analyze``)."""


@dataclass
class SplitReader:
    """Iterate the records of one split as Arrow record batches (:data:`CAPTURE_SCHEMA`).

    Memory stays bounded by ``chunk_size`` plus one record: the file is read in chunks with the
    incomplete tail of each chunk carried over.  After iteration :attr:`truncated` names the
    partial last record, if this split owns one."""

    split: Split
    max_rows: int = DEFAULT_MAX_ROWS
    chunk_size: int = DEFAULT_CHUNK_SIZE
    on_truncated: OnTruncated | Callable[[TruncatedRecord], None] = "warn"
    truncated: TruncatedRecord | None = field(default=None, init=False)
    start: int = field(default=-1, init=False)
    stop: int = field(default=-1, init=False)

    def __post_init__(self) -> None:
        if self.max_rows <= 0:
            raise CaptureError(f"maxRecordsPerBatch must be positive, not {self.max_rows}")
        if self.chunk_size < 64:
            raise CaptureError(f"chunk size {self.chunk_size} is too small")

    def __iter__(self) -> Iterator[pa.RecordBatch]:
        for chunk in self.chunks():
            yield from _batches(self.split.capture.name, chunk, self.max_rows)

    def chunks(self) -> Iterator[RecordChunk]:
        """The split's records chunk by chunk, bytes left in the read buffers (no Arrow
        batches, no copy of the packet bytes): what the fused decode reads."""
        capture = self.split.capture
        with _Source(capture, self.chunk_size) as source:
            self.start = source.sync(self.split.start)
            self.stop = source.sync(self.split.end)
            if self.start >= self.stop:
                return
            if isinstance(capture.info, PcapInfo):
                yield from _walk_pcap(source, capture.info, self.start, self.stop,
                                      self._truncate)
            else:
                yield from _walk_pcapng(source, capture.info, self.start, self.stop,
                                        self._truncate)

    def _truncate(self, record: TruncatedRecord) -> None:
        self.truncated = record
        if callable(self.on_truncated):
            self.on_truncated(record)
        elif self.on_truncated == "error":
            raise CaptureError(str(record))
        elif self.on_truncated == "warn":
            log.warning("%s", record)


def read_split(split: Split, max_rows: int = DEFAULT_MAX_ROWS,
               chunk_size: int = DEFAULT_CHUNK_SIZE,
               on_truncated: OnTruncated | Callable[[TruncatedRecord], None] = "warn",
               ) -> Iterator[pa.RecordBatch]:
    """The record batches of one split (see :class:`SplitReader` for the report)."""
    return iter(SplitReader(split, max_rows, chunk_size, on_truncated))


@dataclass
class RecordChunk:
    """The records of one chunk of a split: numpy columns plus where each record's bytes are.

    The bytes stay in the chunk buffer they were read into (``buf[data_at[i]:data_at[i] +
    caplen[i]]``): :func:`_batches` packs them into an Arrow ``data`` column for the data
    source, while the fused decode (:mod:`spark_analysis.decode`) reads them in place and
    never copies the capture.  ``buf`` may be any object with the buffer protocol."""

    offset: np.ndarray
    ts_ns: np.ndarray
    ts_valid: np.ndarray | None
    caplen: np.ndarray
    origlen: np.ndarray
    linktype: np.ndarray
    interface_id: np.ndarray
    buf: bytes
    data_at: np.ndarray  # position of each record's bytes in ``buf``, increasing

    def __len__(self) -> int:
        return len(self.offset)

    @property
    def data_bytes(self) -> int:
        return int(self.caplen.sum())

    def packed(self) -> bytes:
        """Every record's bytes back to back, in record order."""
        return _pack(self.buf, self.data_at, self.caplen)



def _batches(name: str, cols: RecordChunk, max_rows: int) -> Iterator[pa.RecordBatch]:
    total = len(cols.offset)
    if not total:
        return
    ends = np.zeros(total + 1, np.int64)
    np.cumsum(cols.caplen, out=ends[1:])
    values = pa.py_buffer(cols.packed())
    for lo in range(0, total, max_rows):
        hi = min(total, lo + max_rows)
        rel = (ends[lo : hi + 1] - ends[lo]).astype(np.int32)
        data = pa.Array.from_buffers(pa.binary(), hi - lo, [
            None, pa.py_buffer(rel), values.slice(int(ends[lo]), int(ends[hi] - ends[lo]))])
        mask = None if cols.ts_valid is None else ~cols.ts_valid[lo:hi]
        yield pa.RecordBatch.from_arrays([
            pa.repeat(pa.scalar(name, pa.string()), hi - lo),
            pa.array(cols.offset[lo:hi], pa.int64()),
            pa.array(cols.ts_ns[lo:hi], pa.int64(), mask=mask),
            pa.array(cols.caplen[lo:hi], pa.int32()),
            pa.array(cols.origlen[lo:hi], pa.int32()),
            pa.array(cols.linktype[lo:hi], pa.int32()),
            pa.array(cols.interface_id[lo:hi], pa.int32()),
            data,
        ], schema=CAPTURE_SCHEMA)


def _at_every_byte(buf: bytes, dtype: np.dtype) -> np.ndarray:
    """A read-only view of ``buf`` as ``dtype`` items starting at *every* byte offset.

    Indexing it with record offsets gathers unaligned headers in one numpy call; the view
    itself copies nothing."""
    count = max(0, len(buf) - dtype.itemsize + 1)
    return np.ndarray(shape=(count,), dtype=dtype, buffer=buf, strides=(1,))


def _pack(buf: bytes, starts: np.ndarray, lengths: np.ndarray) -> bytes:
    """The byte ranges ``[start, start + length)`` of ``buf`` (in increasing, disjoint order)
    back to back: one boolean mask over the span they cover, built with ``np.repeat``."""
    if not len(starts):
        return b""
    first, end = int(starts[0]), int(starts[-1] + lengths[-1])
    counts = np.empty(2 * len(starts) - 1, np.int64)
    counts[0::2] = lengths
    counts[1::2] = np.diff(starts) - lengths[:-1]  # the headers and padding in between
    alternate = np.zeros(len(counts), bool)
    alternate[0::2] = True
    keep = np.repeat(alternate, counts)
    return np.frombuffer(buf, np.uint8, count=end - first, offset=first)[keep].tobytes()


def _check_int32(source: _Source, offsets: np.ndarray, values: np.ndarray, what: str) -> None:
    bad = np.flatnonzero(values > _INT32_MAX)
    if len(bad):
        raise source.error(int(offsets[bad[0]]), f"{what} {int(values[bad[0]])} is not a "
                           "plausible length (damaged file?)")


class _Chunk:
    """The bytes ``[base, base + len(buf))`` of the file, refilled with carry-over."""

    def __init__(self, source: _Source, start: int) -> None:
        self.source, self.base, self.buf = source, start, b""

    @property
    def end(self) -> int:
        return self.base + len(self.buf)

    @property
    def at_eof(self) -> bool:
        return self.end >= self.source.size

    def refill(self, pos: int, need: int) -> None:
        """Make the chunk start at ``pos`` with at least ``need`` bytes (file size allowing).

        The partial record at the old chunk's end is read again with the new chunk rather
        than carried over: ``carry + read`` copied every whole chunk once more (about 4% of
        the stage-1 CPU), re-reading costs a few hundred bytes."""
        # never shorter than what the old chunk held from ``pos`` (a grown chunk stays grown)
        length = max(need, self.source.chunk_size, self.end - pos)
        self.buf = self.source.handle.read_at(max(0, min(length, self.source.size - pos)), pos)
        self.base = pos


def _walk_pcap(source: _Source, info: PcapInfo, start: int, stop: int,
               truncate: Callable[[TruncatedRecord], None]) -> Iterator[RecordChunk]:
    order = info.order
    layout = PCAP_RECORD[order]
    rec = layout.size
    incl_of = U32[order].unpack_from
    dtype = layout.dtype()
    chunk = _Chunk(source, start)
    pos = start
    while pos < stop:
        chunk.refill(pos, rec)
        buf, base = chunk.buf, chunk.base
        n, p, limit = len(buf), pos - base, stop - base
        found: list[int] | np.ndarray
        # the hot loop: one read of incl_len per record, stopping at a record the chunk cuts
        if _compiled_walk is not None:
            slots = np.empty((n - p) // rec + 1, np.int64)
            count, p = _compiled_walk(buf, p, limit, rec, _INCL_AT, order == ">", slots)
            found = slots[:count]
        else:  # the fallback without a C compiler; a header cut by the chunk end raises
            found = []
            append = found.append
            try:
                while p < limit:
                    end = p + rec + incl_of(buf, p + _INCL_AT)[0]
                    if end > n:
                        break
                    append(p)
                    p = end
            except struct.error:
                pass
        if len(found):
            yield _pcap_columns(source, info, buf, base, np.asarray(found, np.int64), dtype)
        last = int(found[-1]) if len(found) else None
        pos = base + p
        if pos >= stop:
            if last is not None and pos > stop and base + last < stop:
                raise _straddle(source, base + last, stop)
            return
        # the record at pos does not fit in the chunk
        declared = rec + incl_of(buf, p + _INCL_AT)[0] if n - p >= rec else None
        if declared is not None and declared <= n - p:  # else the chunk is read again forever
            raise RuntimeError(f"record walk bug: the record at offset {pos} of "
                               f"{source.capture.name} fits in the chunk but was not taken")
        if not _grow(source, chunk, pos, stop, declared, truncate,
                     rec + DEFAULT_CAPLEN_BOUND, rec):
            return


def _grow(source: _Source, chunk: _Chunk, pos: int, stop: int, declared: int | None,
          truncate: Callable[[TruncatedRecord], None], bound: int, header: int = 0) -> bool:
    """The record at ``pos`` does not fit in the chunk: end of file, damage, or read on
    (False: done).

    ``declared`` is the record's whole length, None when even its header is incomplete;
    ``bound`` the most it may be (more: the file is damaged here, and this piece of it ends:
    :class:`TruncatedRecord`), ``header`` the record header's part of both."""
    size = source.size
    if declared is not None and declared > bound:
        truncate(TruncatedRecord(source.capture.name, pos, declared, min(stop, size) - pos,
                                 damaged=True, bound=bound, header=header))
        return False
    if (declared is None and chunk.at_eof) or (declared is not None and pos + declared > size):
        if stop < size:
            raise _straddle(source, pos, stop)
        truncate(TruncatedRecord(source.capture.name, pos, declared, size - pos))
        return False
    if declared is not None and declared > source.chunk_size:
        chunk.refill(pos, declared)
    return True


def _straddle(source: _Source, record: int, stop: int) -> CaptureError:
    return source.error(record, f"the record here runs over the split boundary {stop} that "
                        "the boundary search chose: the data near it looks like record "
                        "headers; read with a different splitSize")


def _pcap_columns(source: _Source, info: PcapInfo, buf: bytes, base: int, found: np.ndarray,
                  dtype: np.dtype) -> RecordChunk:
    rec = dtype.itemsize
    heads = _at_every_byte(buf, dtype)[found]
    sec, frac, incl, orig = (heads[name].astype(np.int64) for name in dtype.names or ())
    offsets = found + base
    _check_int32(source, offsets, orig, "original length")
    count = len(found)
    return RecordChunk(offsets, sec * 1_000_000_000 + frac * info.tick_ns, None, incl, orig,
                       np.full(count, info.linktype, np.int64), np.zeros(count, np.int64), buf,
                       found + rec)


# --- pcapng walk ---------------------------------------------------------------------------------


@dataclass
class _Context:
    """The section a pcapng walk is in: byte order and the interfaces declared so far."""

    order: str
    interfaces: list[Interface]


def _context_at(index: PcapngIndex, offset: int) -> _Context:
    section = index.section_at(offset)
    return _Context(section.order, [i for i in section.interfaces if i.offset < offset])


def _walk_pcapng(source: _Source, index: PcapngIndex, start: int, stop: int,
                 truncate: Callable[[TruncatedRecord], None]) -> Iterator[RecordChunk]:
    ctx = _context_at(index, start)
    chunk = _Chunk(source, start)
    pos = start
    while pos < stop:
        chunk.refill(pos, 12)
        buf, base = chunk.buf, chunk.base
        n, p, limit = len(buf), pos - base, stop - base
        # packet blocks are grouped by the interface table they were read under
        groups: list[_Group] = []
        epbs: list[int] = []
        spbs: list[int] = []
        header = NG[ctx.order].block.codec.unpack_from
        last = -1
        while p < limit and p + 12 <= n:
            btype, length = header(buf, p)
            if btype == BLOCK_EPB and length >= 12 and not length & 3 and p + length <= n:
                epbs.append(p)  # the common case, kept short: the checks are vectorised later
                last = p
                p += length
                continue
            if btype in (SHB, BLOCK_IDB):
                groups.append(_Group(ctx.order, tuple(ctx.interfaces), epbs, spbs))
                epbs, spbs = [], []
                ctx = _context_change(source, index, ctx, buf, p, base)
                header = NG[ctx.order].block.codec.unpack_from
                btype, length = header(buf, p)
            if length < 12 or length % 4:
                raise source.error(base + p, f"damaged pcapng block (length {length})")
            if p + length > n:
                break
            if btype == BLOCK_EPB:
                epbs.append(p)
            elif btype == BLOCK_SPB:
                spbs.append(p)
            elif btype == BLOCK_IDB:
                ctx.interfaces.append(parse_idb(base + p, buf[p : p + length], ctx.order))
            elif btype == BLOCK_OLD_PACKET:
                raise source.error(base + p, "obsolete Packet Block (type 2) is not supported; "
                                   "convert the file with editcap first")
            last = p
            p += length
        groups.append(_Group(ctx.order, tuple(ctx.interfaces), epbs, spbs))
        cols = [_pcapng_columns(source, g, buf, base) for g in groups if g.epbs or g.spbs]
        if cols:
            yield _concat(cols)
        pos = base + p
        if pos >= stop:
            if pos > stop and last >= 0 and base + last < stop:
                raise _straddle(source, base + last, stop)
            return
        declared = _declared_block_length(buf, p, ctx.order)
        if declared is not None and (declared < 12 or declared % 4):
            raise source.error(pos, f"damaged pcapng block (length {declared})")
        if not _grow(source, chunk, pos, stop, declared, truncate, PCAPNG_MAX_BLOCK):
            return


def _declared_block_length(buf: bytes, p: int, order: str) -> int | None:
    """The length of the block at ``p`` (None: not enough bytes to know it yet).

    A section header's length is in the byte order its own byte-order mark gives."""
    if len(buf) - p < 8:
        return None
    btype, length = NG[order].block.unpack_from(buf, p)
    if btype != SHB:
        return int(length)
    if len(buf) - p < 12:
        return None
    for section_order in "<>":
        if U32[section_order].unpack_from(buf, p + 8)[0] == wpcap.PCAPNG_BOM:
            return int(NG[section_order].block.unpack_from(buf, p)[1])
    return int(length)  # no valid mark: the walk reports it when the block is complete


@dataclass(frozen=True)
class _Group:
    order: str
    interfaces: tuple[Interface, ...]
    epbs: list[int]
    spbs: list[int]


def _context_change(source: _Source, index: PcapngIndex, ctx: _Context, buf: bytes, p: int,
                    base: int) -> _Context:
    """A new section starts or (for an IDB) the same one goes on; refuse what "head" missed."""
    offset = base + p
    btype = NG[ctx.order].block.unpack_from(buf, p)[0]
    if not index.complete and ((btype == SHB and offset > 0)
                               or (btype == BLOCK_IDB and offset > index.head_end)):
        what = "section header" if btype == SHB else "interface description"
        raise source.error(offset, f"a {what} after the first packet: this file needs "
                           "the driver to index it first, read it with option "
                           "pcapngIndex=scan")
    if btype != SHB:
        return ctx
    bom = U32["<"].unpack_from(buf, p + 8)[0] if p + 12 <= len(buf) else None
    if bom == wpcap.PCAPNG_BOM:
        return _Context("<", [])
    if bom is not None and U32[">"].unpack_from(buf, p + 8)[0] == wpcap.PCAPNG_BOM:
        return _Context(">", [])
    raise source.error(offset, "section header without a valid byte-order mark")


def _concat(cols: list[RecordChunk]) -> RecordChunk:
    if len(cols) == 1:
        return cols[0]

    def cat(name: str) -> np.ndarray:
        return np.concatenate([getattr(c, name) for c in cols])

    valid = np.concatenate([np.ones(len(c.offset), bool) if c.ts_valid is None else c.ts_valid
                            for c in cols])
    if any(c.buf is not cols[0].buf for c in cols):
        raise AssertionError("record chunks of different buffers cannot be merged")
    return RecordChunk(cat("offset"), cat("ts_ns"), valid, cat("caplen"), cat("origlen"),
                       cat("linktype"), cat("interface_id"), cols[0].buf, cat("data_at"))


def _gather(buf: bytes, at: np.ndarray, layout: FastLayout) -> np.ndarray:
    return _at_every_byte(buf, layout.dtype())[at]


def _ticks_to_ns(ticks: np.ndarray, tsresol: int, tsoffset: int) -> np.ndarray:
    """Exact integer nanoseconds (floor) for a decimal or binary if_tsresol."""
    ticks = ticks.astype(np.uint64)
    if tsresol & 0x80:
        shift = tsresol & 0x7F
        if shift >= 64:
            whole, part = np.zeros_like(ticks), ticks
        else:
            whole, part = ticks >> np.uint64(shift), ticks & np.uint64((1 << shift) - 1)
        if shift > 34:  # keep part * 10^9 inside 64 bits; below a nanosecond is dropped
            part, shift_part = part >> np.uint64(shift - 34), 34
        else:
            shift_part = shift
        frac = (part * np.uint64(10**9)) >> np.uint64(shift_part)
        ns = whole.astype(np.int64) * 1_000_000_000 + frac.astype(np.int64)
    elif tsresol <= 9:
        ns = (ticks * np.uint64(10 ** (9 - tsresol))).astype(np.int64)
    else:
        divisor = 10 ** (tsresol - 9)
        ns = (ticks // np.uint64(divisor)).astype(np.int64) if divisor < 2**64 else \
            np.zeros(len(ticks), np.int64)
    return ns + tsoffset * 1_000_000_000


def _pcapng_columns(source: _Source, group: _Group, buf: bytes, base: int) -> RecordChunk:
    epbs, spbs, ifaces = group.epbs, group.spbs, group.interfaces
    lay = NG[group.order]
    parts: list[tuple[np.ndarray, ...]] = []  # offset, ts, valid, cap, orig, link, iface, start
    if epbs:
        at = np.array(epbs, np.int64)
        blocks = _gather(buf, at, lay.block)
        epb = _gather(buf, at + lay.block.size, lay.epb)
        length = blocks["block_length"].astype(np.int64)
        iface = epb["interface_id"].astype(np.int64)
        cap = epb["captured_len"].astype(np.int64)
        orig = epb["orig_len"].astype(np.int64)
        bad = np.flatnonzero((length < lay.epb_data + 4) | (iface >= len(ifaces))
                             | (cap > length - lay.epb_data - 4))
        if len(bad):
            i = int(bad[0])
            reason = ("packet block too short" if length[i] < lay.epb_data + 4 else
                      f"unknown interface {iface[i]}" if iface[i] >= len(ifaces) else
                      f"captured length {cap[i]} runs past the end of the block")
            raise source.error(base + epbs[i], reason)
        ticks = (epb["ts_high"].astype(np.uint64) << np.uint64(32)) | epb["ts_low"].astype(
            np.uint64)
        ts = np.zeros(len(at), np.int64)
        link = np.zeros(len(at), np.int64)
        for number in np.unique(iface):
            desc = ifaces[int(number)]
            sel = iface == number
            ts[sel] = _ticks_to_ns(ticks[sel], desc.tsresol, desc.tsoffset)
            link[sel] = desc.linktype
        parts.append((at, ts, np.ones(len(at), bool), cap, orig, link, iface,
                      at + lay.epb_data))
    if spbs:
        at = np.array(spbs, np.int64)
        if not ifaces:
            raise source.error(base + spbs[0], "simple packet before any interface")
        length = _gather(buf, at, lay.block)["block_length"].astype(np.int64)
        orig = _gather(buf, at + lay.block.size, lay.spb)["orig_len"].astype(np.int64)
        snaplen = ifaces[0].snaplen
        cap = np.minimum(orig, snaplen) if snaplen else orig
        bad = np.flatnonzero((length < lay.spb_data + 4) | (cap > length - lay.spb_data - 4))
        if len(bad):
            i = int(bad[0])
            raise source.error(base + spbs[i], f"packet length {cap[i]} runs past the end of "
                               "the block")
        zeros = np.zeros(len(at), np.int64)
        parts.append((at, zeros, np.zeros(len(at), bool), cap, orig,
                      np.full(len(at), ifaces[0].linktype, np.int64), zeros,
                      at + lay.spb_data))
    at, ts, valid, cap, orig, link, iface, data_at = (np.concatenate(c) for c in zip(*parts,
                                                                                   strict=True))
    order = np.argsort(at, kind="stable")
    at, ts, valid, cap, orig, link, iface, data_at = (
        a[order] for a in (at, ts, valid, cap, orig, link, iface, data_at))
    _check_int32(source, at + base, orig, "original length")
    return RecordChunk(at + base, ts, valid, cap, orig, link, iface, buf, data_at)


# --- convenience ---------------------------------------------------------------------------------


def read_table(paths: str | Sequence[str], split_size: int = DEFAULT_SPLIT_SIZE,
               pcapng_index: PcapngIndexMode = "head", max_rows: int = DEFAULT_MAX_ROWS,
               on_truncated: OnTruncated | Callable[[TruncatedRecord], None] = "warn",
               ) -> pa.Table:
    """Every record of the files as one Arrow table, split by split (no Spark needed)."""
    batches = [batch for split in plan(paths, split_size, pcapng_index)
               for batch in read_split(split, max_rows, on_truncated=on_truncated)]
    return pa.Table.from_batches(batches, schema=CAPTURE_SCHEMA)
