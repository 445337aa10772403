"""Message repositories of the reference store: one per source (per topic per RegID).

A repository holds the source's messages exactly as they arrived (the framed LBMC data message,
so a retransmission is the same bytes with the type nibble changed) and applies the retention
rules of the guide's "Repository Thresholds and Limits" (semantics.md §1.15):

* ``repository-size-threshold``: above it the oldest messages are released until below;
* ``repository-size-limit``: a message that would take the repository over it is dropped
  (an *intentional drop*, shown as "Drops" by the web monitor);
* ``repository-age-threshold`` (seconds, 0 = off): older messages are released;
* RPP: messages are kept until every required receiver consumed them (the store decides and
  calls :meth:`Repository.release_through`); sizes then count the payload only.

SPP sizes count the whole message plus :data:`PER_MESSAGE_OVERHEAD` (the guide puts the
store's state per message at about 72 bytes), so ``used_bytes`` compares with the web
monitor's "Memory" figure.

A *disk* repository writes every message to a cache file before the store acknowledges it, so
a store killed with SIGKILL recovers every message it called stable (with ``write_behind`` the
messages of one received chunk go to the file in one write, at :meth:`Repository.sync`, which
the store calls before it sends their stability ACKs): the file is an LBT-TCP
byte stream (LBMC messages back to back), read back with :class:`wire.lbttcp.LbttcpStream`, and
a torn final message from a crash is cut off on restart.  The thresholds above then apply to
the *memory cache* (``mem_trail_sqn``); ``repository-disk-file-size-limit`` bounds the file:
when it is reached the file is compacted to the newest messages that fit in half of it (the
product overwrites a ring; compaction gives the same retention with a simpler file).

Files are the only I/O a core performs, through this class; the store core stays free of
sockets and clocks (semantics of "sans-IO" in this project: no network, no time source).

The store's files are named after its ``<store name>``, which comes from a configuration file
and may hold anything XML allows (``../../x``, ``/etc``, 300 characters, U+2028).
:func:`store_file_stem` turns a name into one safe file name component, and
:func:`state_file` / :func:`cache_file` are the only places that name the store's files.
"""

from __future__ import annotations

import hashlib
import os
import string
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple
from urllib.parse import unquote_to_bytes

from wire.lbmc import DATA_BASE, MessageType
from wire.lbttcp import LbttcpStream

PER_MESSAGE_OVERHEAD = 72


# --- the store's file names ----------------------------------------------------------------------

_KEPT = frozenset(string.ascii_letters + string.digits + "._-")
STEM_MAX = 200
"""Longest file name stem :func:`store_file_stem` returns (ASCII, so also bytes).  NAME_MAX is
255 bytes on Linux and macOS file systems; the longest suffix added is a cache file's
``-<RegID>-cache`` (17 characters), so every file name stays well under it."""
_HASH_CHARS = 32


def store_file_stem(name: str) -> str:
    """A store name as one file name component that stays inside its directory.

    The rule: ASCII letters, digits, ``.``, ``_`` and ``-`` are kept, except a leading ``.``
    (so no ``.``, ``..`` or hidden file); every other character, ``%`` included, becomes the
    ``%XX`` escapes of its UTF-8 bytes, so ``/`` and NUL can never reach the file system and
    the stem decodes back to the name (:func:`store_name_of_stem`).  Names of ordinary
    characters (``store-1``, ``ny4.primary``) keep the file names they always had.  A stem
    longer than :data:`STEM_MAX` is cut and ends in ``~`` and 32 hex digits of the name's
    SHA-256 (``~`` is never kept, so such a stem cannot be another name's escape): a name of
    300 characters still gets a file, distinct from every other name's, only not reversibly.
    """
    parts: list[str] = []
    for index, char in enumerate(name):
        if char in _KEPT and not (index == 0 and char == "."):
            parts.append(char)
        else:
            parts.extend(f"%{byte:02X}" for byte in char.encode("utf-8", "surrogatepass"))
    stem = "".join(parts)
    if len(stem) <= STEM_MAX:
        return stem
    head = stem[: STEM_MAX - _HASH_CHARS - 1]
    cut = head.find("%", len(head) - 2)  # never end inside a %XX escape
    if cut != -1:
        head = head[:cut]
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:_HASH_CHARS]
    return f"{head}~{digest}"


def store_name_of_stem(stem: str) -> str | None:
    """The store name :func:`store_file_stem` made ``stem`` from; ``None`` for a cut (hashed)
    stem, whose name cannot be recovered."""
    if "~" in stem:
        return None
    return unquote_to_bytes(stem).decode("utf-8", "surrogatepass")


def state_file(directory: Path, store_name: str) -> Path:
    """Where a store keeps its state journal: ``<stem>.state`` in ``directory``.

    A journal written before names were encoded (``<name>.state``, for a name with characters
    now escaped, such as a space) is renamed to the new name when it is a plain file directly
    in ``directory`` and nothing is at the new name yet, so an existing deployment restarts with
    its state.
    """
    path = directory / f"{store_file_stem(store_name)}.state"
    _adopt_legacy(directory, f"{store_name}.state", path)
    return path


def cache_file(directory: Path, store_name: str, reg_id: int) -> Path:
    """Where a disk repository keeps a source's messages: ``<stem>-<RegID>-cache`` in
    ``directory`` (a file of the old naming is adopted as :func:`state_file` does)."""
    path = directory / f"{store_file_stem(store_name)}-{reg_id}-cache"
    _adopt_legacy(directory, f"{store_name}-{reg_id}-cache", path)
    return path


def directory_problem(path: Path) -> str | None:
    """Why a store could not keep its files in ``path``, else ``None``; nothing is created.

    Checked before a store starts, so a cache or state directory that is a file, cannot be
    created or is not writable is a one-line configuration error instead of an exception at
    the first registration.  A missing directory is fine when its nearest existing ancestor
    is a writable directory (the store creates the rest).
    """
    existing = path
    while not os.path.lexists(existing) and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        if existing == path:
            return "is not a directory"
        return f"cannot be created: {existing} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        if existing == path:
            return f"is not writable: {exc.strerror or exc}"
        return f"cannot be created: {existing} is not writable: {exc.strerror or exc}"
    return None


def _adopt_legacy(directory: Path, legacy_name: str, path: Path) -> None:
    """Rename ``directory/legacy_name`` to ``path`` if it is an old-style file of this store."""
    if legacy_name == path.name or "/" in legacy_name or "\x00" in legacy_name:
        return
    if os.sep != "/" and os.sep in legacy_name:
        return
    legacy = directory / legacy_name
    try:
        if legacy.is_file() and not legacy.is_symlink() and not os.path.lexists(path):
            os.rename(legacy, path)
    except (OSError, ValueError):
        return  # a name too long for the file system was never a file; nothing to adopt


@dataclass(frozen=True)
class RetentionLimits:
    """The retention options of one repository (bytes, seconds)."""

    size_threshold: int = 1024
    size_limit: int = 50_331_648
    age_threshold: float = 0.0
    disk_file_size_limit: int = 104_857_600
    rpp: bool = False


class AddResult(NamedTuple):
    """What :meth:`Repository.add` did (a named tuple: one is made per message stored).

    Attributes:
        stored: the message is now held (and, on disk, written).
        duplicate: it was already held (the store still re-acknowledges it).
        dropped: refused because of the size limit (an intentional drop).
        released: sequence numbers released to make room or by age, oldest first.
    """

    stored: bool = False
    duplicate: bool = False
    dropped: bool = False
    released: tuple[int, ...] = ()


_STORED = AddResult(stored=True)
_DUPLICATE = AddResult(duplicate=True)
_DATA_SIZE = DATA_BASE.size


class Repository:
    """Messages of one source; memory-only unless ``cache_file`` is given (see module doc)."""

    def __init__(self, limits: RetentionLimits, *, cache_file: Path | None = None,
                 write_behind: bool = False) -> None:
        """``write_behind``: a disk repository gathers the messages :meth:`add` takes and writes
        them at the next :meth:`sync` (one write for a whole chunk of messages); the caller
        must sync before it calls any of them stable.  Otherwise each add writes at once."""
        self.limits = limits
        self.write_behind = write_behind
        self._unwritten: list[bytes] = []  # write_behind: bytes not yet handed to the file
        self.kind = "disk" if cache_file is not None else "memory"
        self._mem: OrderedDict[int, tuple[bytes, float]] = OrderedDict()  # sqn -> (raw, time)
        self._disk: OrderedDict[int, tuple[int, int]] = OrderedDict()  # sqn -> (offset, len)
        self._in_order = True  # every message came after all it followed (the usual case)
        self.used_bytes = 0
        self.lead_sqn: int | None = None
        self.intentional_drops = 0
        self.released_total = 0
        self.cache_file = cache_file
        self._fh: BinaryIO | None = None
        self.file_offset = 0
        if cache_file is not None:
            self._open_cache(cache_file)

    # --- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._disk) if self.kind == "disk" else len(self._mem)

    def __contains__(self, sqn: int) -> bool:
        return sqn in self._disk or sqn in self._mem

    @property
    def trail_sqn(self) -> int | None:
        """Lowest sequence number held (memory or disk)."""
        if self.kind == "disk" and self._disk:
            return next(iter(self._disk)) if self._in_order else min(self._disk)
        return self.mem_trail_sqn

    @property
    def mem_trail_sqn(self) -> int | None:
        """Lowest sequence number in memory."""
        if not self._mem:
            return None
        return next(iter(self._mem)) if self._in_order else min(self._mem)

    def get(self, sqn: int) -> bytes | None:
        """The stored message bytes, or None."""
        hit = self._mem.get(sqn)
        if hit is not None:
            return hit[0]
        loc = self._disk.get(sqn)
        if loc is None or self._fh is None:
            return None
        if self._unwritten:
            self.sync()
        self._fh.seek(loc[0])
        return self._fh.read(loc[1])

    def sqns(self) -> list[int]:
        return sorted(self._disk) if self.kind == "disk" else list(self._mem)

    # --- updates ---------------------------------------------------------------------------

    def _size(self, raw: bytes) -> int:
        if self.limits.rpp:
            return max(0, len(raw) - _DATA_SIZE)
        return len(raw) + PER_MESSAGE_OVERHEAD

    def add(self, sqn: int, raw: bytes, now: float) -> AddResult:
        """Keep one message (the store's hot path: one call per message received)."""
        mem = self._mem
        if sqn in mem or sqn in self._disk:
            return _DUPLICATE
        limits = self.limits
        rpp = limits.rpp
        size = max(0, len(raw) - _DATA_SIZE) if rpp else len(raw) + PER_MESSAGE_OVERHEAD
        released: list[int] | None = None
        if not rpp and limits.age_threshold > 0:
            released = self._release_by_age(now)
        if self.used_bytes + size > limits.size_limit:
            if rpp or self.kind == "memory":
                self.intentional_drops += 1
                return AddResult(dropped=True, released=tuple(released or ()))
            # a disk repository keeps the message on disk and evicts from its memory cache
            self._evict_memory(limits.size_limit - size)
        if self._fh is not None:
            self._append(sqn, raw)
        mem[sqn] = (raw, now)
        self.used_bytes += size
        lead = self.lead_sqn
        if lead is None or sqn > lead:
            self.lead_sqn = sqn
        else:
            self._in_order = False  # a gap filled late (a proactive retransmission)
        if not rpp and self.used_bytes > limits.size_threshold:
            shrunk = self._shrink_to(limits.size_threshold)
            released = released + shrunk if released else shrunk
        if released:
            return AddResult(stored=True, released=tuple(released))
        return _STORED

    def _release_by_age(self, now: float) -> list[int]:
        age = self.limits.age_threshold
        if age <= 0:
            return []
        out = []
        while self._mem:
            _, (_, at) = next(iter(self._mem.items()))
            if now - at <= age:
                break
            out += self._release_oldest()
        return out

    def _shrink_to(self, target: int) -> list[int]:
        """Release the oldest messages until ``used_bytes <= target`` (keeping the newest).

        Called for nearly every message once a repository sits at its size threshold, hence
        the loop written out instead of :meth:`_release_oldest` per message."""
        mem, size_of = self._mem, self._size
        used = self.used_bytes
        out: list[int] = []
        while used > target and len(mem) > 1:
            sqn, (raw, _) = mem.popitem(last=False)
            used -= size_of(raw)
            out.append(sqn)
        self.used_bytes = used
        if self.kind == "disk":
            return []  # still on disk: only the memory cache shrank
        self.released_total += len(out)
        return out

    def _evict_memory(self, target: int) -> None:
        while self.used_bytes > target and self._mem:
            _, (raw, _) = self._mem.popitem(last=False)
            self.used_bytes -= self._size(raw)

    def _release_oldest(self) -> list[int]:
        sqn, (raw, _) = self._mem.popitem(last=False)
        self.used_bytes -= self._size(raw)
        if self.kind == "disk":
            return []  # still on disk: only the memory cache shrank
        self.released_total += 1
        return [sqn]

    def release_through(self, sqn: int) -> list[int]:
        """Release every message up to and including ``sqn`` (RPP consumption, deregistration).

        Called for every consumption ACK of an RPP repository: while the messages are held in
        sequence order only the released ones are visited."""
        if self._in_order:
            out = []
            for s in self._disk if self.kind == "disk" else self._mem:
                if s > sqn:
                    break
                out.append(s)
        else:
            out = [s for s in self.sqns() if s <= sqn]
        for s in out:
            hit = self._mem.pop(s, None)
            if hit is not None:
                self.used_bytes -= self._size(hit[0])
            self._disk.pop(s, None)
        self.released_total += len(out)
        return out

    def clear(self) -> None:
        """Forget everything (state deleted); a disk cache file is removed."""
        self._mem.clear()
        self._disk.clear()
        self._unwritten.clear()
        self._in_order = True
        self.used_bytes = 0
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self.cache_file is not None and self.cache_file.exists():
            self.cache_file.unlink()

    def close(self) -> None:
        if self._fh is not None:
            self.sync()
            self._fh.close()
            self._fh = None

    def sync(self) -> None:
        """Hand every message added so far to the OS (a SIGKILL can no longer lose them)."""
        if not self._unwritten or self._fh is None:
            return
        fh = self._fh
        fh.seek(0, os.SEEK_END)
        fh.write(b"".join(self._unwritten))
        fh.flush()
        self._unwritten.clear()

    # --- disk -----------------------------------------------------------------------------

    def _open_cache(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        good = 0
        if path.exists():
            framer = LbttcpStream(decode=False)
            with path.open("rb") as fh:
                data = fh.read()
            try:
                items = framer.feed(data)
            except Exception:
                items = []
            for item in items:
                _, _, _, _, sqn = DATA_BASE.codec.unpack_from(item.raw, 0)
                self._disk[sqn] = (item.offset, len(item.raw))
                if self.lead_sqn is None or sqn > self.lead_sqn:
                    self.lead_sqn = sqn
                else:
                    self._in_order = False
                good = item.offset + len(item.raw)
            if good != len(data):  # a torn write from a crash: cut it off
                with path.open("r+b") as fh:
                    fh.truncate(good)
        self._fh = path.open("a+b")
        self.file_offset = good

    def _append(self, sqn: int, raw: bytes) -> None:
        assert self._fh is not None
        if self.file_offset + len(raw) > self.limits.disk_file_size_limit:
            self._compact(self.limits.disk_file_size_limit // 2)
        self._unwritten.append(raw)
        if not self.write_behind:
            self.sync()  # in the OS before we acknowledge: a SIGKILL cannot lose it
        self._disk[sqn] = (self.file_offset, len(raw))
        self.file_offset += len(raw)

    def _compact(self, budget: int) -> None:
        assert self._fh is not None and self.cache_file is not None
        self.sync()
        keep: list[tuple[int, bytes]] = []
        total = 0
        for sqn in sorted(self._disk, reverse=True):
            raw = self.get(sqn)
            assert raw is not None
            if total + len(raw) > budget:
                break
            keep.append((sqn, raw))
            total += len(raw)
        keep.reverse()
        gone = len(self._disk) - len(keep)
        tmp = self.cache_file.with_suffix(".compact")
        with tmp.open("wb") as out:
            for _, raw in keep:
                out.write(raw)
        self._fh.close()
        os.replace(tmp, self.cache_file)
        self._disk.clear()
        offset = 0
        for sqn, raw in keep:
            self._disk[sqn] = (offset, len(raw))
            offset += len(raw)
        self.file_offset = offset
        self.released_total += gone
        for sqn in [s for s in self._mem if s not in self._disk]:
            raw_mem, _ = self._mem.pop(sqn)
            self.used_bytes -= self._size(raw_mem)
        self._fh = self.cache_file.open("a+b")


def as_retransmission(raw: bytes) -> bytes:
    """The stored data message re-typed as a RETRANS (type 10), same topic index and sqn.

    The base header is rewritten through the derived LBMC data-header layout, never by offset.
    """
    ver_type, next_hdr, msglen, tidx, sqn = DATA_BASE.codec.unpack_from(raw, 0)
    head = DATA_BASE.codec.pack((ver_type & 0xF0) | MessageType.RETRANS, next_hdr, msglen,
                                tidx, sqn)
    return head + raw[DATA_BASE.size:]
