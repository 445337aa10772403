"""Message repositories of the reference store: one per source (per topic per RegID).

A repository holds the source's messages exactly as they arrived (the framed LBMC data message,
so a retransmission is the same bytes with the type nibble changed) and applies the retention
rules of the guide's "Repository Thresholds and Limits" (docs/semantics.md §1.15):

* ``repository-size-threshold``: above it the oldest messages are released until below;
* ``repository-size-limit``: a message that would take the repository over it is dropped
  (an *intentional drop*, shown as "Drops" by the web monitor);
* ``repository-age-threshold`` (seconds, 0 = off): older messages are released;
* RPP: messages are kept until every required receiver consumed them (the store decides and
  calls :meth:`Repository.release_through`); sizes then count the payload only.  A store
  whose RPP repository has no blocking receiver calls :meth:`Repository.release_to_threshold`
  instead (the size threshold, as SPP).  ``write_delay`` (RPP, disk only: the source's
  effective ``ume_write_delay``) keeps each message in memory that long before it goes to the
  cache file (:meth:`Repository.write_due`); a message released meanwhile is never written
  (counted in :attr:`Repository.disk_writes_skipped`, "Implementing RPP").

SPP sizes count the whole message plus :data:`PER_MESSAGE_OVERHEAD` (the guide puts the
store's state per message at about 72 bytes), so ``used_bytes`` compares with the web
monitor's "Memory" figure.

A *disk* repository writes every message to a cache file before the store acknowledges it, so
a store killed with SIGKILL recovers every message it called stable (with ``write_behind`` the
messages of one received chunk go to the file in one write, at :meth:`Repository.sync`, which
the store calls before it sends their stability ACKs): the file is an LBT-TCP
byte stream (LBMC messages back to back), read back with :class:`wire.lbttcp.LbttcpStream`, and
a torn final message from a crash is cut off on restart (see "Damaged files" below).  The
thresholds above then apply to
the *memory cache* (``mem_trail_sqn``); ``repository-disk-file-size-limit`` bounds the file:
when it is reached the file is compacted to the newest messages that fit in half of it (the
product overwrites a ring; compaction gives the same retention with a simpler file).

**Durable before acknowledged** (issue 17).  A disk store never sends a stability ACK for a
message whose bytes it has not handed to the cache file, whatever the ACK batching
(``stability-ack-minimum-number``/``-interval``) and however the messages were split into
received chunks: every path of the store that writes stability ACKs calls :meth:`Repository
.sync` first (:meth:`StoreCore.on_chunk_done` for the per-chunk ACKs, ``_flush_acks`` for
batched and withheld ones), and the asyncio driver only writes what the core queued after the
core returned, so the file write always comes first.  "Handed to the file" means written with
``write(2)`` into the kernel: a process killed with SIGKILL loses nothing it acknowledged (the
page cache belongs to the kernel), which is the crash the guide's "Persistent Store Fault
Tolerance" and the conformance case DUR-STORE-001 are about.  A power loss or kernel crash can
still lose the page cache; ``Repository(fsync=True)`` adds an ``fsync`` to every write-out (and
to the compacted file before it replaces the old one) for that, at the price of one device
flush per received chunk, so it is off by default.  The one exception is deliberate: an RPP
source with *ack on reception* (the topic allows it and the source asked, the guide's
"Acknowledge on Reception") is acknowledged before its messages are written (their write
delay may still be running).  ``tests/reference_impl/test_durable_ack.py``
checks the rule at the moment each ACK is written.

Files are the only I/O a core performs, through this class; the store core stays free of
sockets and clocks (semantics of "sans-IO" in this project: no network, no time source).

**Damaged files** (issue 22 item 3; :class:`StoreFileError`).  A restart must neither crash
on a damaged file nor silently lose what it held:

* a *torn tail* - the last message cut short by a crash mid-write, or NUL bytes a power loss
  left at the end of the file - is cut off and reported in :attr:`Repository.notes` (the
  store logs them as warnings);
* anything else that is not a stored data message (too short for the data header, not a data
  message, a length that cannot frame one) raises :class:`StoreFileError` with the byte offset,
  and the file is left as it was: restoring up to the damage would drop every message after it;
* the store opens only regular files, never through a symbolic link (:func:`open_store_file`):
  a link could point anywhere, a FIFO would block the store forever, a directory cannot hold
  messages.  Temporary files (compaction) are created exclusively, so nothing planted at their
  name is written through.
* a cache file found in place of a *new* registration's (no state names its RegID: an orphan
  of a removed journal, or planted) is not that source's; its bytes are discarded with a note
  instead of being served as the new source's messages.

The store's files are named after its ``<store name>``, which comes from a configuration file
and may hold anything XML allows (``../../x``, ``/etc``, 300 characters, U+2028).
:func:`store_file_stem` turns a name into one safe file name component, and
:func:`state_file` / :func:`cache_file` / :func:`lock_file` are the only places that name the
store's files.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import string
import tempfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple
from urllib.parse import unquote_to_bytes

from wire.errors import WireError
from wire.lbmc import (
    CONTROL_BASE,
    DATA_BASE,
    DATA_TYPES,
    NHDR_DATA,
    VER_TYPE_BITS,
    Frag,
    MessageType,
)
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


def lock_file(directory: Path, store_name: str) -> Path:
    """The file a store locks while it runs on the state in ``directory``: ``<stem>.lock``
    (see :func:`lock_state`)."""
    return directory / f"{store_file_stem(store_name)}.lock"


def lock_state(path: Path) -> int:
    """Lock a store's state for this process; the descriptor to keep open while it runs.

    Two processes running a store of one name on one state directory would each compact the
    journal at start-up and then append to their own copy: one loses everything it journals.
    The second one is refused instead (:class:`StoreFileError` naming the holder's pid).  The
    lock is a POSIX record lock (``lockf``): the kernel drops it when the process dies, so a
    SIGKILLed store never leaves a stale lock; it is per process, so cores of one process (a
    simulated restart) never conflict.
    """
    fd = open_store_file(path, os.O_RDWR, create=True)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
        os.close(fd)
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            pid = f" (pid {holder})" if holder.isdigit() else ""
            raise StoreFileError(path, f"is locked by another process{pid}: a store of this "
                                       "name already runs on this state directory, and two "
                                       "would overwrite each other's state") from None
        raise StoreFileError(path, f"cannot be locked: {exc.strerror or exc}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    return fd


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


class StoreFileError(Exception):
    """A file of the store's (its state journal or a cache file) it will not use as it is.

    Raised where restoring around the problem would lose data or touch a file that is not the
    store's own; the caller refuses to start (or, for a new registration, refuses that
    registration).  ``str()`` is one line: ``PATH:LINE: reason`` for a journal line,
    ``PATH: at byte N: reason`` for a place in a cache file, else ``PATH: reason``.

    Attributes:
        path: the file.
        line: 1-based journal line, or ``None``.
        offset: byte offset in a cache file, or ``None``.
        reason: what is wrong (with the offset, when there is one).
    """

    def __init__(self, path: Path, reason: str, *, line: int | None = None,
                 offset: int | None = None) -> None:
        self.path = path
        self.line = line
        self.offset = offset
        self.reason = reason if offset is None else f"at byte {offset}: {reason}"
        where = str(path) if line is None else f"{path}:{line}"
        super().__init__(f"{where}: {self.reason}")


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISLNK, "a symbolic link")):
        if test(mode):
            return name
    return "not a regular file"


def open_store_file(path: Path, flags: int, *, create: bool = False) -> int:
    """Open one of the store's own files; a file descriptor of a regular file.

    Never through a symbolic link (it could name any file, outside the store's directories:
    the store would read it as its state and then rewrite it), never blocking (a FIFO in the
    file's place would hang the store at start-up), never a directory or device.  Raises
    ``FileNotFoundError`` when ``path`` does not exist and ``create`` is false, else
    :class:`StoreFileError` saying what is in the file's place.
    """
    extra = os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_CREAT if create else 0)
    try:
        fd = os.open(path, flags | extra, 0o644)
    except FileNotFoundError:
        if create:
            raise StoreFileError(path, "its directory does not exist") from None
        raise
    except OSError as exc:
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            mode = 0
        if stat.S_ISLNK(mode):
            with contextlib.suppress(OSError):
                target = os.readlink(path)
                raise StoreFileError(path, f"is a symbolic link (to {target[:200]!r}); the "
                                           "store does not follow links to its files") from None
            raise StoreFileError(path, "is a symbolic link; the store does not follow links "
                                       "to its files") from None
        if mode and not stat.S_ISREG(mode):
            raise StoreFileError(path, f"is {_kind(mode)}, not a regular file") from None
        raise StoreFileError(path, f"cannot be opened: {exc.strerror or exc}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise StoreFileError(path, f"is {_kind(mode)}, not a regular file")
    return fd


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
    write_delay: float = 0.0  # seconds a disk message waits in memory before it is written


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
                 write_behind: bool = False, new: bool = False, fsync: bool = False) -> None:
        """``write_behind``: a disk repository gathers the messages :meth:`add` takes and writes
        them at the next :meth:`sync` (one write for a whole chunk of messages); the caller
        must sync before it calls any of them stable.  Otherwise each add writes at once.

        ``fsync``: every write-out also waits for the device (``os.fsync``), so what the store
        acknowledged survives a power loss, not only a killed process (see "Durable before
        acknowledged" in the module docstring); off by default, as it costs a device flush
        per received chunk.

        ``new``: the repository of a new registration; whatever is already in its cache file
        is an orphan and is discarded (see "Damaged files" in the module docstring).  Without
        it the cache file is read back (a restart).  Raises :class:`StoreFileError` for a cache
        file that cannot be used."""
        self.limits = limits
        self.write_behind = write_behind
        self.fsync = fsync
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
        self.found_file = False  # the cache file existed when the repository was opened
        self.notes: list[str] = []  # what opening the cache file cut or discarded, for the log
        # write_delay: messages held in memory, not yet given to the cache file (sqn -> time)
        self._delayed: OrderedDict[int, float] = OrderedDict()
        self.disk_writes_skipped = 0  # delayed messages released before they were written
        if cache_file is not None:
            self._open_cache(cache_file, new=new)

    # --- queries ---------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._disk) + len(self._delayed) if self.kind == "disk" else len(self._mem)

    def __contains__(self, sqn: int) -> bool:
        return sqn in self._disk or sqn in self._mem

    @property
    def trail_sqn(self) -> int | None:
        """Lowest sequence number held (memory or disk)."""
        if self.kind == "disk" and self._disk:
            trail = next(iter(self._disk)) if self._in_order else min(self._disk)
            if self._delayed:
                trail = min(trail, min(self._delayed))
            return trail
        return self.mem_trail_sqn

    @property
    def delayed(self) -> int:
        """How many messages wait for their write delay to end (not yet in the cache file)."""
        return len(self._delayed)

    def next_write_at(self) -> float | None:
        """When the oldest delayed message is due to be written (``None``: none waits)."""
        if not self._delayed:
            return None
        return min(self._delayed.values()) + self.limits.write_delay

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
        if self.kind == "disk":
            return sorted([*self._disk, *self._delayed]) if self._delayed else sorted(self._disk)
        return list(self._mem)

    # --- updates ---------------------------------------------------------------------------

    def _size(self, raw: bytes) -> int:
        if self.limits.rpp:
            return _payload_size(raw)
        return len(raw) + PER_MESSAGE_OVERHEAD

    def add(self, sqn: int, raw: bytes, now: float) -> AddResult:
        """Keep one message (the store's hot path: one call per message received)."""
        mem = self._mem
        if sqn in mem or sqn in self._disk:
            return _DUPLICATE
        limits = self.limits
        rpp = limits.rpp
        size = _payload_size(raw) if rpp else len(raw) + PER_MESSAGE_OVERHEAD
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
            if limits.write_delay > 0:
                self._delayed[sqn] = now  # written by write_due, unless released first
            else:
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
        sequence order only the released ones are visited.  A message still waiting for its
        write delay is never written (counted in :attr:`disk_writes_skipped`)."""
        if self._in_order and not self._delayed:
            out = []
            for s in self._disk if self.kind == "disk" else self._mem:
                if s > sqn:
                    break
                out.append(s)
        else:
            out = [s for s in self.sqns() if s <= sqn]
        delayed = self._delayed
        for s in out:
            hit = self._mem.pop(s, None)
            if hit is not None:
                self.used_bytes -= self._size(hit[0])
            self._disk.pop(s, None)
            if delayed and delayed.pop(s, None) is not None:
                self.disk_writes_skipped += 1
        self.released_total += len(out)
        return out

    def release_to_threshold(self) -> list[int]:
        """RPP without a blocking receiver: release the oldest messages until the repository
        is at or below its size threshold, as SPP does (the newest is always kept, and a
        message still waiting for its write delay is not released: it is written first)."""
        out: list[int] = []
        mem = self._mem
        while self.used_bytes > self.limits.size_threshold and len(mem) > 1:
            sqn = next(iter(mem)) if self._in_order else min(mem)
            if sqn in self._delayed:
                break
            raw, _ = mem.pop(sqn)
            self.used_bytes -= self._size(raw)
            self._disk.pop(sqn, None)
            out.append(sqn)
        self.released_total += len(out)
        return out

    def write_due(self, now: float) -> list[int]:
        """Give the cache file every delayed message whose write delay has ended by ``now``
        (the caller syncs before it calls them stable); their sequence numbers."""
        due_before = now - self.limits.write_delay + 1e-9
        out = [s for s, at in self._delayed.items() if at <= due_before]
        for s in out:
            del self._delayed[s]
            hit = self._mem.get(s)
            if hit is not None and self._fh is not None:
                self._append(s, hit[0])
        return out

    def clear(self) -> None:
        """Forget everything (state deleted); a disk cache file is removed."""
        self._mem.clear()
        self._disk.clear()
        self._delayed.clear()
        self._unwritten.clear()
        self._in_order = True
        self.used_bytes = 0
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        if self.cache_file is not None:
            with contextlib.suppress(FileNotFoundError):
                self.cache_file.unlink()

    def close(self) -> None:
        """Write what is still unwritten (delayed messages too: a clean shutdown keeps them)
        and close the cache file."""
        if self._fh is not None:
            if self._delayed:
                self.write_due(float("inf"))
            self.sync()
            self._fh.close()
            self._fh = None

    def sync(self) -> None:
        """Hand every message added so far to the OS (a SIGKILL can no longer lose them);
        with ``fsync``, to the device as well (nor can a power loss)."""
        if not self._unwritten or self._fh is None:
            return
        fh = self._fh
        fh.seek(0, os.SEEK_END)
        fh.write(b"".join(self._unwritten))
        fh.flush()
        if self.fsync:
            os.fsync(fh.fileno())
        self._unwritten.clear()

    # --- disk -----------------------------------------------------------------------------

    def _open_cache(self, path: Path, *, new: bool) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            self.found_file = os.path.lexists(path)
        except OSError as exc:
            raise StoreFileError(path, f"its directory cannot be created: "
                                       f"{exc.strerror or exc}") from None
        fd = open_store_file(path, os.O_RDWR | os.O_APPEND, create=True)
        fh = os.fdopen(fd, "a+b")
        try:
            size = os.fstat(fd).st_size
            if new:
                if size:
                    fh.truncate(0)
                    self.notes.append(f"{path}: discarded the {size} bytes found there: no "
                                      "state names this RegID, so they are not this source's "
                                      "messages (an orphan of an earlier store)")
                good = 0
            else:
                good = self._read_cache(fh, path, size)
                if good != size:
                    fh.truncate(good)
        except BaseException:
            fh.close()
            raise
        self._fh = fh
        self.file_offset = good

    def _read_cache(self, fh: BinaryIO, path: Path, size: int) -> int:
        """Index the messages of a cache file; the length of its good part.

        Reads in chunks (the file may be large); raises :class:`StoreFileError` at the first
        frame that is not a stored data message, and for bytes after the last whole message
        that are not a torn tail (see "Damaged files" in the module docstring).
        """
        framer = LbttcpStream(decode=False)
        disk = self._disk
        good = 0
        fh.seek(0)
        while framer.broken is None:
            chunk = fh.read(_READ_CHUNK)
            if not chunk:
                break
            try:
                items = framer.feed(chunk)
            except WireError:
                items = []  # the bytes at ``good`` cannot frame a message: judged below
            for item in items:
                raw = item.raw
                # the usual case checked inline (a million messages read at a restart)
                if len(raw) < _DATA_SIZE:
                    raise StoreFileError(path, str(stored_message_problem(raw)),
                                         offset=item.offset)
                ver_type, next_hdr, _, _, sqn = _DATA_UNPACK(raw, 0)
                if next_hdr not in _STORED_CHAINS or ver_type & _TYPE_MASK not in _STORED_TYPES:
                    raise StoreFileError(path, str(stored_message_problem(raw)),
                                         offset=item.offset)
                disk[sqn] = (item.offset, len(raw))
                if self.lead_sqn is None or sqn > self.lead_sqn:
                    self.lead_sqn = sqn
                else:
                    self._in_order = False
                good = item.offset + len(raw)
        if good == size:
            return good
        fh.seek(good)
        head = fh.read(CONTROL_BASE.size)
        if _all_nul(fh, head):
            self.notes.append(f"{path}: cut {size - good} NUL bytes after the last whole "
                              f"message at byte {good} (a file extended but not written "
                              "before a power loss)")
            return good
        if len(head) == CONTROL_BASE.size:
            ver_type, next_hdr, msglen = CONTROL_BASE.codec.unpack_from(head, 0)
            problem = _header_problem(ver_type, next_hdr, msglen)
            if problem is not None:
                raise StoreFileError(path, problem, offset=good)
        self.notes.append(f"{path}: cut a message torn at its end ({size - good} bytes at byte "
                          f"{good}: a crash while it was written); the {len(disk)} messages "
                          "before it are restored")
        return good

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
        # a new file of our own (never a name something could be planted at), renamed over
        # the cache file
        fd, tmp = tempfile.mkstemp(dir=self.cache_file.parent,
                                   prefix=f".{self.cache_file.name}.", suffix=".compact")
        try:
            os.fchmod(fd, stat.S_IMODE(os.fstat(self._fh.fileno()).st_mode))  # the file's own
            with os.fdopen(fd, "wb") as out:
                for _, raw in keep:
                    out.write(raw)
                if self.fsync:
                    out.flush()
                    os.fsync(out.fileno())
            self._fh.close()
            os.replace(tmp, self.cache_file)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        self._disk.clear()
        offset = 0
        for sqn, raw in keep:
            self._disk[sqn] = (offset, len(raw))
            offset += len(raw)
        self.file_offset = offset
        self.released_total += gone
        for sqn in [s for s in self._mem if s not in self._disk and s not in self._delayed]:
            raw_mem, _ = self._mem.pop(sqn)
            self.used_bytes -= self._size(raw_mem)
        self._fh = self.cache_file.open("a+b")


_READ_CHUNK = 1 << 20
_DATA_UNPACK = DATA_BASE.codec.unpack_from
_TYPE_MASK = VER_TYPE_BITS["type"].mask
_STORED_TYPES = frozenset(int(t) for t in DATA_TYPES)
_FRAG_CODE = Frag.kind.code
_FRAG_SIZE = Frag.kind.fast.size if Frag.kind.fast is not None else 16
_STORED_CHAINS = frozenset((NHDR_DATA, _FRAG_CODE))
"""How a stored data message's header chain starts: in DATA, or with the FRAG header of a
fragment of a large message (each fragment is stored as a message of its own)."""


def _payload_size(raw: bytes) -> int:
    """The payload bytes of a stored data message (what RPP sizes count): without the data
    header, and without the FRAG header of a fragment (issue 17: the source's
    ``ume_flight_size_bytes`` counts a fragmented message's payload once, headers never)."""
    if len(raw) > 1 and raw[1] == _FRAG_CODE:
        return max(0, len(raw) - _DATA_SIZE - _FRAG_SIZE)
    return max(0, len(raw) - _DATA_SIZE)


def _header_problem(ver_type: int, next_hdr: int, msglen: int) -> str | None:
    """Why a message with this base header is not one a store keeps, else ``None`` (the
    store keeps data messages, whose header chain starts in DATA, exactly as received)."""
    mtype = ver_type & _TYPE_MASK
    if mtype not in _STORED_TYPES or next_hdr not in _STORED_CHAINS:
        return f"not a stored data message (type {mtype:#x}, next header {next_hdr:#04x})"
    if msglen < _DATA_SIZE:
        return (f"a {msglen}-byte message is shorter than the {_DATA_SIZE}-byte data "
                "header")
    return None


def stored_message_problem(raw: bytes) -> str | None:
    """Why ``raw`` (one framed message) is not a message a store keeps, else ``None``."""
    if len(raw) < CONTROL_BASE.size:
        return f"a {len(raw)}-byte message is shorter than the {_DATA_SIZE}-byte data header"
    ver_type, next_hdr, msglen = CONTROL_BASE.codec.unpack_from(raw, 0)
    return _header_problem(ver_type, next_hdr, msglen)


def _all_nul(fh: BinaryIO, head: bytes) -> bool:
    """Whether ``head`` and the rest of ``fh`` are NUL bytes (read in chunks)."""
    chunk = head
    while chunk:
        if chunk.count(0) != len(chunk):
            return False
        chunk = fh.read(_READ_CHUNK)
    return True


def as_retransmission(raw: bytes) -> bytes:
    """The stored data message re-typed as a RETRANS (type 10), same topic index and sqn.

    The base header is rewritten through the derived LBMC data-header layout, never by offset.
    """
    ver_type, next_hdr, msglen, tidx, sqn = DATA_BASE.codec.unpack_from(raw, 0)
    head = DATA_BASE.codec.pack((ver_type & 0xF0) | MessageType.RETRANS, next_hdr, msglen,
                                tidx, sqn)
    return head + raw[DATA_BASE.size:]
