"""Capture files as the driver finds and opens them: paths and globs, and what the headers say.

This is the bottom layer of reading captures: :mod:`spark_analysis.splits` cuts the files it
describes into byte ranges and reads them, :mod:`spark_analysis.pcap_source` wraps that for
Spark.  It holds what the driver does before any split is read (expand the paths, read each
file's header and, for pcapng, its section index) and what that yields, :class:`CaptureFile`:
plain data, picklable, shipped inside every split.  The pcap and pcapng layouts are derived here
once, from the Construct structs in :mod:`wire.pcap`, and the reader imports them, so the
header reading, the boundary search and the record walks all read the same bytes the same way.
Nothing here reads packets, and nothing imports the reader.

Files and globs.  Files are named by local paths or by URIs (``file://``, ``hdfs://``,
``s3://``...) and opened through a pyarrow filesystem; the ``file`` column shows a URI as
given and a local path made absolute.  A directory means its visible files (a name starting
with ``.`` or ``_`` is not data, the convention of Spark's file sources) that begin as a capture
does, with a pcap or pcapng magic number; it is not recursive, and the sidecars, notes and
scripts kept beside captures are passed over and can be named to the user.  Glob characters
(``* ? [``) may appear in any component and ``**`` spans directories; a file a glob or a name
picks is taken whatever it holds (reading it says what is wrong).  Every pattern must match at
least one file and every directory hold at least one capture: a typo is an error, not an empty
DataFrame.

Header reading.  :func:`open_capture` reads the first bytes of the file.  A pcapng section
header block's type makes it pcapng (below); a pcap magic, either byte order, micro- or
nanosecond, makes it pcap, and :class:`PcapInfo` keeps the global header (byte order, tick,
snaplen, the 16 bits of the link-layer type) and the first record's seconds, the reference
the pcap boundary search checks timestamps against.  Anything else (too short, another magic, a
truncated header) is a :class:`CaptureError` naming the file; a gzip-compressed capture's
says to decompress it first, since a split is a byte range of the file as stored (``ump
dissect`` and the frame-by-frame tools read one compressed, as tshark does).

pcapng context.  An EPB names its interface by number; the interface descriptions (link type,
``if_tsresol``, ``if_tsoffset``) live in IDBs at the start of the section, possibly far before a
split, so the driver collects them into a :class:`PcapngIndex`.  ``pcapng_index="head"`` (the
default) reads only the first section's head (SHB and the IDBs before the first packet); a
reader that meets a later SHB or IDB raises :class:`CaptureError` naming ``"scan"``, so a
multi-section file fails loudly instead of being misread.  ``pcapng_index="scan"`` walks every
block header of the file once (headers only; bodies of blocks larger than a chunk are skipped)
and handles any number of sections and interfaces.
"""

from __future__ import annotations

import fnmatch
import posixpath
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pyarrow.fs as pafs

from wire import pcap as wpcap
from wire.fastpath import FastLayout, derive

# --- sizes (spark_analysis.splits reads with them too, and documents them) --------------------

MiB = 1 << 20
DEFAULT_CHUNK_SIZE = 16 * MiB
"""Bytes a split reader reads at once (and the driver, scanning a pcapng index).  Each chunk
is decoded in one call whose fixed costs (Arrow tables, a write per flow bucket and table) are
spread over its frames: 16 MiB (about 110,000 benchmark frames) against 8 MiB took 5-10% less
task CPU in ``python -m benchmarks.spark`` (three alternating runs each), for 20-40 MB more
peak memory per worker."""
DEFAULT_CAPLEN_BOUND = 262144
"""The longest packet a pcap record may hold, tshark's limit (a record declaring more is
damage); the largest caplen the pcap boundary search believes when the snaplen is 0 or
larger."""
_PCAPNG_HEAD_CHUNK = 64 * 1024  # the head of a pcapng file is read in reads this small

# --- layouts, derived once from the Construct structs in wire.pcap -------------------------------

PCAP_HEADER = {"<": derive(wpcap.PcapHeaderLE), ">": derive(wpcap.PcapHeaderBE)}
PCAP_RECORD = {"<": derive(wpcap.PcapRecordLE), ">": derive(wpcap.PcapRecordBE)}
PCAP_HEADER_SIZE = PCAP_HEADER["<"].size
PCAP_RECORD_SIZE = PCAP_RECORD["<"].size


@dataclass(frozen=True)
class NgLayouts:
    block: FastLayout
    idb: FastLayout
    epb: FastLayout
    spb: FastLayout
    shb: FastLayout

    @property
    def epb_data(self) -> int:
        """Offset of an EPB's packet data from the block start."""
        return self.block.size + self.epb.size

    @property
    def spb_data(self) -> int:
        return self.block.size + self.spb.size


NG = {order: NgLayouts(*wpcap.pcapng_layouts(order)) for order in "<>"}
SHB = wpcap.PCAPNG_SHB
BLOCK_IDB, BLOCK_OLD_PACKET, BLOCK_SPB, BLOCK_EPB = 1, 2, 3, 6
_OPT_TSRESOL, _OPT_TSOFFSET = 9, 14


def _u32_format(order: str) -> struct.Struct:
    """The struct of one u32 member, read off a derived layout (all pcap members are u32)."""
    return struct.Struct(order + PCAP_RECORD[order].format[1])


U32 = {order: _u32_format(order) for order in "<>"}


class CaptureError(ValueError):
    """A capture that cannot be read as asked: missing, not a capture, damaged, or ambiguous.

    The message names the file and, where it applies, the byte offset; it is meant for the
    person who gave the path, so no traceback is needed to understand it."""


# --- files and globs -----------------------------------------------------------------------------


@dataclass(frozen=True)
class FileRef:
    """A file to read: how to show it (the ``file`` column), its filesystem and path there."""

    name: str
    filesystem: pafs.FileSystem
    path: str


_GLOB_CHARS = frozenset("*?[")


def _has_glob(component: str) -> bool:
    return any(ch in _GLOB_CHARS for ch in component)


def resolve(uri: str) -> tuple[pafs.FileSystem, str]:
    """The pyarrow filesystem of a path or URI, and the path there (a local path made
    absolute)."""
    if "://" in uri:
        try:
            return pafs.FileSystem.from_uri(uri)
        except Exception as exc:  # pyarrow raises ArrowInvalid/OSError with its own wording
            raise CaptureError(f"{uri}: cannot open this location ({exc})") from None
    return pafs.LocalFileSystem(), str(Path(uri).expanduser().absolute())


def _glob_match(parts: Sequence[str], pattern: Sequence[str]) -> bool:
    """fnmatch per path component; ``**`` matches any number of components."""
    if not pattern:
        return not parts
    if pattern[0] == "**":
        return any(_glob_match(parts[i:], pattern[1:]) for i in range(len(parts) + 1))
    return bool(parts) and fnmatch.fnmatchcase(parts[0], pattern[0]) and _glob_match(
        parts[1:], pattern[1:])


def _visible(name: str) -> bool:
    # the convention of Spark's file sources: _SUCCESS, .crc files and the like are not data
    return not name.startswith((".", "_"))


def expand_paths(paths: str | Sequence[str], skipped: list[str] | None = None
                 ) -> list[FileRef]:
    """Local paths, URIs (``s3://``, ``hdfs://``, ``file://``), directories and globs.

    A directory means its visible files that begin as a capture does (a pcap or pcapng
    magic number; not recursive): the sidecars, notes and scripts kept beside captures are
    passed over, their names added to ``skipped`` when given.  Glob characters (``* ? [``)
    may appear in any component and ``**`` spans directories; a file a glob or a name picks
    is taken whatever it holds (reading it says what is wrong).  Every pattern must match at
    least one file, a directory hold at least one capture: a typo is an error, not an empty
    DataFrame."""
    if isinstance(paths, str):
        paths = [paths]
    out: list[FileRef] = []
    for spec in paths:
        found = _expand_one(spec, skipped)
        if not found:
            raise CaptureError(f"{spec}: no file matches")
        out.extend(found)
    return out


_CAPTURE_MAGICS = frozenset(
    {magic.to_bytes(4, end) for magic in (wpcap.PCAP_MAGIC_US, wpcap.PCAP_MAGIC_NS,
                                          wpcap.PCAPNG_SHB)
     for end in ("little", "big")})
"""The first four bytes of a capture file: a pcap magic (either byte order, micro- or
nanosecond) or a pcapng section header block's type."""


def _begins_as_capture(filesystem: pafs.FileSystem, path: str) -> bool:
    """Whether the file begins as a capture does, or as a gzip file (then taken, so that
    reading it says it must be decompressed first)."""
    try:
        with filesystem.open_input_file(path) as handle:
            head = bytes(handle.read(4))
    except OSError:
        return True   # (opening it again says what is wrong)
    return head in _CAPTURE_MAGICS or head.startswith(wpcap.GZIP_MAGIC)


def _expand_one(spec: str, skipped: list[str] | None = None) -> list[FileRef]:
    scheme, sep, rest = spec.partition("://")
    prefix, body = (scheme + sep, rest) if sep else ("", spec)
    components = body.split("/")
    first_glob = next((i for i, c in enumerate(components) if _has_glob(c)), None)
    if first_glob is None:
        filesystem, path = resolve(spec)
        info = filesystem.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise CaptureError(f"{spec}: no such file")
        if info.type == pafs.FileType.Directory:
            entries = filesystem.get_file_info(pafs.FileSelector(path))
            files = sorted(e.path for e in entries
                           if e.type == pafs.FileType.File and _visible(e.base_name))
            shown = spec.rstrip("/") if sep else path
            captures = [f for f in files if _begins_as_capture(filesystem, f)]
            if files and not captures:
                raise CaptureError(f"{spec}: no capture file in the directory ({len(files)} "
                                   f"other file(s))")
            if skipped is not None:
                skipped += [f"{shown}/{posixpath.basename(f)}" for f in files
                            if f not in captures]
            return [FileRef(f"{shown}/{posixpath.basename(f)}", filesystem, f)
                    for f in captures]
        return [FileRef(spec if sep else path, filesystem, path)]
    base = "/".join(components[:first_glob]) or ("/" if body.startswith("/") else ".")
    pattern = components[first_glob:]
    filesystem, base_path = resolve(prefix + base)
    if filesystem.get_file_info(base_path).type != pafs.FileType.Directory:
        raise CaptureError(f"{spec}: no such directory {prefix + base}")
    recursive = len(pattern) > 1 or "**" in pattern
    entries = filesystem.get_file_info(pafs.FileSelector(base_path, recursive=recursive))
    shown_base = (prefix + base).rstrip("/") if sep else base_path.rstrip("/")
    refs = []
    for entry in entries:
        if entry.type != pafs.FileType.File:
            continue
        rel = posixpath.relpath(entry.path, base_path)
        parts = rel.split("/")
        if all(_visible(p) for p in parts) and _glob_match(parts, pattern):
            refs.append(FileRef(f"{shown_base}/{rel}", filesystem, entry.path))
    return sorted(refs, key=lambda r: r.name)


# --- what the driver learns about a file ---------------------------------------------------------


@dataclass(frozen=True)
class PcapInfo:
    """The global header of a classic pcap, and the first record's seconds (for sync)."""

    order: str
    tick_ns: int  # 1000 (microsecond magic) or 1 (nanosecond magic)
    snaplen: int
    linktype: int
    first_ts_sec: int | None  # None: no complete first record header

    @property
    def frac_limit(self) -> int:
        return 10**9 // self.tick_ns

    @property
    def caplen_bound(self) -> int:
        """The largest caplen the pcap boundary search believes (see "Classic pcap resync"
        in :mod:`spark_analysis.splits`)."""
        return self.snaplen if 0 < self.snaplen <= DEFAULT_CAPLEN_BOUND else DEFAULT_CAPLEN_BOUND


@dataclass(frozen=True)
class Interface:
    """One pcapng IDB: where it is, and what its packets need (link type, clock)."""

    offset: int
    linktype: int
    snaplen: int
    tsresol: int = 6  # the raw if_tsresol byte: 10^-n, or 2^-(n & 0x7F) when bit 7 is set
    tsoffset: int = 0  # if_tsoffset, seconds added to every timestamp


@dataclass(frozen=True)
class Section:
    offset: int
    order: str
    interfaces: tuple[Interface, ...]


@dataclass(frozen=True)
class PcapngIndex:
    """Sections and interfaces known on the driver (see "pcapng context" above).

    ``complete``: every SHB and IDB of the file is listed (``"scan"``).  Otherwise only those
    before ``head_end`` (the first packet block) are, and a reader that meets another one raises.
    """

    sections: tuple[Section, ...]
    complete: bool
    head_end: int

    def section_at(self, offset: int) -> Section:
        current = self.sections[0]
        for section in self.sections:
            if section.offset > offset:
                break
            current = section
        return current


@dataclass(frozen=True)
class CaptureFile:
    """A capture as planned on the driver; picklable, shipped inside every split.

    Plain data: the reader opens it (:func:`spark_analysis.splits.sync`,
    :class:`spark_analysis.splits.SplitReader`)."""

    ref: FileRef
    size: int
    info: PcapInfo | PcapngIndex

    @property
    def name(self) -> str:
        return self.ref.name

    @property
    def format(self) -> Literal["pcap", "pcapng"]:
        return "pcap" if isinstance(self.info, PcapInfo) else "pcapng"

    @property
    def first_record(self) -> int:
        return PCAP_HEADER_SIZE if isinstance(self.info, PcapInfo) else 0


PcapngIndexMode = Literal["head", "scan"]


def open_capture(ref: FileRef | str, pcapng_index: PcapngIndexMode = "head",
                 chunk_size: int = DEFAULT_CHUNK_SIZE) -> CaptureFile:
    """Read a capture's header (and, for pcapng, its section index) on the driver."""
    if pcapng_index not in ("head", "scan"):
        raise CaptureError(f"pcapngIndex must be 'head' or 'scan', not {pcapng_index!r}")
    if isinstance(ref, str):
        refs = expand_paths(ref)
        if len(refs) != 1:
            raise CaptureError(f"{ref}: {len(refs)} files; open_capture takes one")
        ref = refs[0]
    try:
        handle = ref.filesystem.open_input_file(ref.path)
    except FileNotFoundError:
        raise CaptureError(f"{ref.name}: no such file") from None
    except OSError as exc:
        raise CaptureError(f"{ref.name}: cannot open ({exc})") from None
    with handle:
        size = handle.size()
        head = handle.read_at(PCAP_HEADER_SIZE + PCAP_RECORD_SIZE, 0)
        if len(head) < 4:
            raise CaptureError(f"{ref.name}: {size} bytes, too short to be a capture")
        if U32["<"].unpack_from(head)[0] == SHB:
            scan = pcapng_index == "scan"
            index = _pcapng_index(ref, handle, size, complete=scan,
                                  chunk_size=chunk_size if scan else _PCAPNG_HEAD_CHUNK)
            return CaptureFile(ref, size, index)
        return CaptureFile(ref, size, _pcap_info(ref, head))


def _pcap_info(ref: FileRef, head: bytes) -> PcapInfo:
    for order in "<>":
        layout = PCAP_HEADER[order]
        if len(head) >= layout.size:
            header = layout.decode(head)
            if header["magic"] in (wpcap.PCAP_MAGIC_US, wpcap.PCAP_MAGIC_NS):
                break
    else:
        magics = {magic.to_bytes(4, end) for magic in (wpcap.PCAP_MAGIC_US, wpcap.PCAP_MAGIC_NS)
                  for end in ("little", "big")}
        what = ("truncated pcap header" if head[:4] in magics
                else "a gzip-compressed capture: decompress it first (gunzip -k), as the "
                     "analysis reads captures by byte ranges (ump dissect reads it as it is)"
                if head.startswith(wpcap.GZIP_MAGIC)
                else f"not a pcap or pcapng file (magic {head[:4].hex()})")
        raise CaptureError(f"{ref.name}: {what}")
    first_sec = None
    if len(head) >= PCAP_HEADER_SIZE + PCAP_RECORD_SIZE:
        first_sec = PCAP_RECORD[order].unpack_from(head, PCAP_HEADER_SIZE)[0]
    return PcapInfo(order, 1 if header["magic"] == wpcap.PCAP_MAGIC_NS else 1000,
                    header["snaplen"], header["linktype"] & 0xFFFF, first_sec)


# --- pcapng block headers ------------------------------------------------------------------------


class Bytes:
    """Random access to a file through one cached window: a chunk read serves many small reads."""

    def __init__(self, handle: Any, size: int, chunk_size: int) -> None:
        self.handle, self.size, self.chunk_size = handle, size, chunk_size
        self.base, self.buf = 0, b""

    def get(self, offset: int, length: int) -> bytes:
        """Up to ``length`` bytes at ``offset`` (fewer only at end of file)."""
        rel = offset - self.base
        if rel < 0 or rel + length > len(self.buf):
            want = max(length, self.chunk_size)
            self.buf = self.handle.read_at(max(0, min(want, self.size - offset)), offset)
            self.base, rel = offset, 0
        return self.buf[rel : rel + length]

    def peek(self, offset: int, length: int) -> bytes:
        """Like :meth:`get`, but a read outside the window does not move it.

        The boundary search checks a few far-away headers (the next hop of a chain, a block's
        trailing length) while it scans one region; re-reading a whole chunk for each of them
        would cost a chunk per candidate."""
        rel = offset - self.base
        if rel >= 0 and rel + length <= len(self.buf):
            return self.buf[rel : rel + length]
        return bytes(self.handle.read_at(max(0, min(length, self.size - offset)), offset))

    def u32(self, offset: int, order: str, peek: bool = False) -> int | None:
        raw = self.peek(offset, 4) if peek else self.get(offset, 4)
        return U32[order].unpack_from(raw)[0] if len(raw) == 4 else None


def shb_order(source: Bytes, offset: int, peek: bool = False) -> str | None:
    bom = source.u32(offset + NG["<"].block.size, "<", peek)
    if bom == wpcap.PCAPNG_BOM:
        return "<"
    if bom is not None and bom.to_bytes(4, "little") == wpcap.PCAPNG_BOM.to_bytes(4, "big"):
        return ">"
    return None


def parse_idb(offset: int, block: bytes, order: str) -> Interface:
    lay = NG[order]
    body = block[lay.block.size : len(block) - 4]
    if len(body) < lay.idb.size:
        raise CaptureError(f"interface block at offset {offset} is too short")
    linktype, _, snaplen = lay.idb.unpack_from(body)
    tsresol, tsoffset = 6, 0
    for code, value in wpcap.pcapng_options(body[lay.idb.size :], order):
        if code == _OPT_TSRESOL and value:
            tsresol = value[0]
        elif code == _OPT_TSOFFSET and len(value) == 8:
            tsoffset = int.from_bytes(value, "little" if order == "<" else "big", signed=True)
    return Interface(offset, linktype, snaplen, tsresol, tsoffset)


def _pcapng_index(ref: FileRef, handle: Any, size: int, *, complete: bool,
                  chunk_size: int) -> PcapngIndex:
    source = Bytes(handle, size, chunk_size)
    order = shb_order(source, 0)
    if order is None:
        raise CaptureError(f"{ref.name}: pcapng section header without a valid byte-order mark")
    sections: list[Section] = []
    interfaces: list[Interface] = []
    section_start = 0
    pos, head_end = 0, size
    stop_at = {SHB, BLOCK_IDB} | (set() if complete else {BLOCK_EPB, BLOCK_SPB,
                                                             BLOCK_OLD_PACKET})
    while pos + 8 <= size:
        # fast path: step over the ordinary blocks inside the cached chunk
        source.get(pos, 8)
        buf, base = source.buf, source.base
        unpack, p, n = NG[order].block.codec.unpack_from, pos - base, len(source.buf)
        while p + 8 <= n:
            btype, length = unpack(buf, p)
            if btype in stop_at or length < 12 or length & 3 or base + p + length > size:
                break
            p += length
        pos = base + p
        if pos + 8 > size or p + 8 > n:
            continue  # end of file, or the next header lies past the chunk: read on
        btype = source.u32(pos, order)
        if btype == SHB:
            new_order = shb_order(source, pos)
            if new_order is None:
                raise CaptureError(f"{ref.name}: section header at offset {pos} has no "
                                   "valid byte-order mark")
            if pos:
                sections.append(Section(section_start, order, tuple(interfaces)))
            order, section_start, interfaces = new_order, pos, []
        length = source.u32(pos + 4, order)
        assert length is not None
        if length < 12 or length % 4:
            raise CaptureError(f"{ref.name}: damaged pcapng block at offset {pos} "
                               f"(length {length})")
        if pos + length > size:
            break  # a truncated last block: the reader of its split reports it
        if btype == BLOCK_IDB:
            interfaces.append(parse_idb(pos, source.get(pos, length), order))
        elif btype in (BLOCK_EPB, BLOCK_SPB, BLOCK_OLD_PACKET) and not complete:
            head_end = pos
            break
        pos += length
    sections.append(Section(section_start, order, tuple(interfaces)))
    return PcapngIndex(tuple(sections), complete, size if complete else head_end)


