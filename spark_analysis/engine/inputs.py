"""The tables the analyses read, loaded from the decode's Parquet output: :func:`load`.

The decode (:mod:`spark_analysis.decode`) stores ``packets``, ``messages`` (without its typed
LBMC header columns), one ``lbmc_<header>`` table per header and ``advertisements``.  The
analyses read a narrow part of them, with two columns added:

``capture``
    which capture a row belongs to: every file given is one capture (``all``: the files of a
    rotated capture, ``tcpdump -C``), or with ``per_file`` each file is its own (its name).
``pos``
    the frame's place in capture order: the file's rank in natural name order (``x2`` before
    ``x10``) shifted by :data:`FILE_SHIFT`, plus the record's byte offset.  Sequence analysis
    follows capture order, as tshark does, not timestamps (which may step back).

The typed header columns are not on ``messages``: each analysis of UME headers gets the
*control messages* it reads, the rows that carry its headers, with those header columns
joined back (:data:`CONTROL_TABLES`: ACKs, registrations, RXREQs, and PREG-RESPs with the
malformed messages for the anomalies), and ``messages`` holds the rows with a sequence
number, all that the data analyses read.  A header column is a struct of many fields as long
as its table: on every message it was a null that still cost the struct's width (about
1 GiB of nulls at 10,000,000 frames), and the millions of ACKs of a persistent capture were
carried through the data analyses for nothing.

Rows come in the order of the stored files, which is nearly capture order (LBT-TCP messages,
reassembled apart, are stored apart): a function that walks a table in capture order sorts it
by ``pos`` (and ``msg_index``) itself.  Only the rows of the captures asked for are read (a
filter on ``file`` pushed into the Parquet scan), so a task analysing one capture of many
reads that capture alone.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from spark_analysis.engine.common import frame, plain_table
from spark_analysis.engine.spill import Spill
from spark_analysis.schemas import HEADER_TABLE_PREFIX, MESSAGE_KEY

FILE_SHIFT = 40
"""``pos`` = file rank << FILE_SHIFT | byte offset: files up to 1 TiB, 8 million files."""

HEADER_COLUMNS = ("ume_preg", "ume_preg_resp", "ume_ack", "ume_rxreq", "ume_sid", "ume_storeid")
"""The typed LBMC header columns the analyses read, each from its ``lbmc_<name>`` table,
joined to the control messages that carry it by ``(pos, msg_index)`` (:data:`MESSAGE_KEY`
with the file name made a number)."""

MESSAGE_COLUMNS = ["capture", "pos", "msg_index", "file", "file_offset", "ts_ns", "protocol",
                   "src_ip", "src_port", "dst_ip", "dst_port", "session_id", "transport_sqn",
                   "message_type", "label", "tidx", "sqn", "topic_name", "payload_length",
                   "malformed_reason"]
"""The messages columns the analyses read (the stored table is wide: read what is used)."""

WIDE_MESSAGE_COLUMNS = [*MESSAGE_COLUMNS, *HEADER_COLUMNS]
"""Messages with every header column the analyses read: what an analysis of UME headers
takes (all messages, or only the control messages it reads: the same result)."""

ACK_COLUMNS = ["capture", "pos", "msg_index", "ts_ns", "file", "file_offset", "src_ip",
               "src_port", "dst_ip", "dst_port"]
"""The message columns the ACK analyses read (:func:`spark_analysis.engine.acks._acks`):
ACKs are as many as the messages of a persistent capture, so their table is kept narrow."""


@dataclass(frozen=True)
class ControlTable:
    """Which messages one analysis of UME headers reads, and which of their columns."""

    marked_by: tuple[str, ...]
    """A message carrying one of these headers is in the table."""
    headers: tuple[str, ...]
    """The header columns joined to the rows (null where a row has not that header)."""
    columns: tuple[str, ...] = tuple(MESSAGE_COLUMNS)
    """The message columns kept."""
    malformed: bool = False
    """Malformed messages are in the table too."""


CONTROL_TABLES: dict[str, ControlTable] = {
    "acks": ControlTable(("ume_ack",), ("ume_ack",), tuple(ACK_COLUMNS)),
    "registrations": ControlTable(("ume_preg", "ume_preg_resp"),
                                  ("ume_preg", "ume_preg_resp", "ume_sid", "ume_storeid")),
    "rxreqs": ControlTable(("ume_rxreq",), ("ume_rxreq",)),
    "flagged": ControlTable(("ume_preg_resp",), ("ume_preg_resp",), malformed=True),
}
"""The control messages (module docstring): for the stability and consumption ACKs; the
registrations (PREG and PREG-RESP, with the session ID and store ID that qualify them); the
retransmission requests to stores; the anomalies (unsolicited PREG-RESPs and malformed
messages)."""

PACKET_COLUMNS = ["capture", "pos", "file", "file_offset", "ts_ns", "protocol", "src_ip",
                  "src_port", "dst_ip", "dst_port", "payload_length", "packet_type", "sqn",
                  "session_id", "ucast_port", "retransmission", "nak_sqns", "ncf_sqns",
                  "ncf_reason", "messages", "malformed_reason"]
"""The packets columns the analyses read: about half of the stored table."""

OPTIONAL_PACKET_COLUMNS = ["icmp_type", "icmp_code"]
"""Packets columns the analyses read when the decode wrote them (ICMP-quoted datagrams)."""


DICTIONARY = frozenset({"file", "capture", "protocol", "src_ip", "dst_ip", "packet_type",
                        "message_type", "label"})
"""Columns the analyses get dictionary-encoded: the low-cardinality strings on every row.
``file`` is the capture file's name (often a path): as a plain string it was the widest
column of every big table (190 MiB of the 760 MiB of ``packets`` at 10,000,000 frames, and
as much again in every table made from them).  The capture, protocol, addresses and types
have a handful of values each; plain, they were a third of ``packets`` and of the sequence
verdicts.  The engine spreads its own session keys, topic names and sequence levels encoded
too (:func:`spark_analysis.engine.common.encoded`); a step Arrow has no dictionary kernel
for decodes the few values it needs (:func:`spark_analysis.engine.common.plain`).  The
results hold plain strings again (:func:`spark_analysis.engine.run.to_arrow`)."""


def natural_order(names: Iterable[str]) -> list[str]:
    """File names in natural order (``cap2`` before ``cap10``): how rotated captures sort."""
    def key(name: str) -> list[tuple[int, int | str]]:
        return [(0, int(part)) if part.isdigit() else (1, part)
                for part in re.split(r"(\d+)", name)]
    return sorted(set(names), key=key)


@dataclass
class Inputs:
    """The tables the analyses start from (pandas, Arrow-backed columns)."""

    packets: pd.DataFrame
    """Every UM frame: :data:`PACKET_COLUMNS`."""
    messages: pd.DataFrame
    """Every message with a sequence number: :data:`MESSAGE_COLUMNS`."""
    advertisements: pd.DataFrame
    """Topic resolution records."""
    acks: pd.DataFrame
    """:data:`CONTROL_TABLES` ``acks``: the messages with a UME ACK."""
    registrations: pd.DataFrame
    """:data:`CONTROL_TABLES` ``registrations``: the messages with a PREG or PREG-RESP."""
    rxreqs: pd.DataFrame
    """:data:`CONTROL_TABLES` ``rxreqs``: the messages with an RXREQ."""
    flagged: pd.DataFrame
    """:data:`CONTROL_TABLES` ``flagged``: PREG-RESPs and malformed messages."""


TABLES = ("packets", "messages", "advertisements", *CONTROL_TABLES)
"""The tables of :class:`Inputs`, in its order."""


def _read(path: str, columns: Sequence[str] | None, files: Sequence[str] | None,
          filesystem: Any, encoded: frozenset[str] = DICTIONARY) -> pa.Table:
    """The ``columns`` (all: None) of the stored table at ``path``, rows of ``files`` only
    (all: None).  A partition column or a dictionary page comes as a dictionary: plain values
    here, as Spark reads them (and a join cannot unify the dictionaries of two tables), but
    for the ``encoded`` columns, which no join reads."""
    return plain_table(_dataset(path, filesystem).to_table(
        columns=_wanted(path, columns, filesystem), filter=_only(files)), encoded)


def _scan(path: str, columns: Sequence[str] | None, files: Sequence[str] | None,
          filesystem: Any, encoded: frozenset[str] = DICTIONARY) -> Iterator[pa.Table]:
    """:func:`_read` a record batch at a time (an empty table when there are no rows): a
    caller that keeps part of each batch never holds the whole stored table."""
    dataset = _dataset(path, filesystem)
    scanner = dataset.scanner(columns=_wanted(path, columns, filesystem), filter=_only(files))
    empty = True
    for batch in scanner.to_batches():
        if batch.num_rows:
            empty = False
            yield plain_table(pa.Table.from_batches([batch]), encoded)
    if empty:
        yield plain_table(scanner.projected_schema.empty_table(), encoded)


def _dataset(path: str, filesystem: Any) -> ds.Dataset:
    return ds.dataset(path, format="parquet", filesystem=filesystem)


def _wanted(path: str, columns: Sequence[str] | None, filesystem: Any) -> list[str] | None:
    """``columns`` that the stored table has (all: None)."""
    names = _dataset(path, filesystem).schema.names
    return None if columns is None else [c for c in columns if c in names]


def _only(files: Sequence[str] | None) -> pc.Expression | None:
    return None if files is None else pc.field("file").isin(list(files))


def _positions(table: pa.Table, ranks: dict[str, int]) -> pa.ChunkedArray:
    """``pos`` (module docstring) of every row of ``table`` (``file``, ``file_offset``); a
    file not in ``ranks`` counts as the first.  A dictionary-encoded ``file`` is ranked once
    per distinct name."""
    file = table.column("file")
    if pa.types.is_dictionary(file.type):
        whole = file.combine_chunks()
        by_name = np.array([ranks.get(name, 0) for name in whole.dictionary.to_pylist()]
                           or [0], dtype=np.int64)
        rank = by_name[np.asarray(pc.fill_null(whole.indices, 0), dtype=np.int64)]
        offset = np.asarray(table.column("file_offset").combine_chunks(), dtype=np.int64)
        return pa.chunked_array([pa.array((rank << FILE_SHIFT) + offset)])
    found = pc.index_in(file, value_set=pa.array(list(ranks), pa.string()))
    found = pc.take(pa.array(list(ranks.values()), pa.int64()), found)
    return pc.add(pc.shift_left(pc.coalesce(found, 0), FILE_SHIFT), table.column("file_offset"))


def _add_capture(table: pa.Table, ranks: dict[str, int], per_file: bool) -> pa.Table:
    """``capture`` and ``pos`` (module docstring) after ``table``'s columns."""
    file = table.column("file")
    if per_file:
        capture = file.cast(pa.string()) if pa.types.is_dictionary(file.type) else file
    else:
        capture = pa.array(["all"], pa.string()).take(
            pa.array(np.zeros(table.num_rows, dtype=np.int64)))
    return table.append_column("capture", capture).append_column(
        "pos", _positions(table, ranks))


_KEY = ["pos", "msg_index"]
"""A message's key within the analyses: its frame's place and its index in the frame (the
stored key, :data:`MESSAGE_KEY`, with the file name made a number)."""


def _carriers(messages: pa.Table, header: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The rows of ``messages`` that carry ``header`` (a header table with :data:`_KEY`) and,
    for each, the header's row: one hash join on two integers."""
    left = messages.select(_KEY).append_column(
        "_m", pa.array(np.arange(messages.num_rows, dtype=np.int64)))
    right = header.select(_KEY).append_column(
        "_h", pa.array(np.arange(header.num_rows, dtype=np.int64)))
    pairs = left.join(right, _KEY, join_type="inner")
    return (pairs.column("_m").to_numpy().astype(np.int64, copy=False),
            pairs.column("_h").to_numpy().astype(np.int64, copy=False))


def _control_table(messages: pa.Table, headers: dict[str, pa.Table],
                   carriers: dict[str, tuple[np.ndarray, np.ndarray]],
                   spec: ControlTable) -> pa.Table:
    """The control messages of ``spec`` (:class:`ControlTable`), in the order of
    ``messages``."""
    chosen = np.zeros(messages.num_rows, dtype=bool)
    for name in spec.marked_by:
        chosen[carriers[name][0]] = True
    if spec.malformed:
        chosen |= np.asarray(pc.is_valid(messages.column("malformed_reason")), dtype=bool)
    rows = np.flatnonzero(chosen)
    out = messages.select(list(spec.columns)).take(pa.array(rows))
    row_in_out = np.full(messages.num_rows, -1, dtype=np.int64)
    row_in_out[rows] = np.arange(len(rows), dtype=np.int64)
    for name in spec.headers:
        at, header_row = carriers[name]
        index = np.full(len(rows), -1, dtype=np.int64)
        mine = row_in_out[at]
        index[mine[mine >= 0]] = header_row[mine >= 0]
        out = out.append_column(name, pc.take(headers[name].column(name),
                                              pa.array(index, mask=index < 0)))
    return out


Split = Callable[[str, pa.Table], list[pa.Table]]
"""A batch of ``packets`` or topic ``messages`` (the name) cut into the parts of a capture
analysed in parts (:func:`spark_analysis.engine.owners.split`)."""


class AckBuckets:
    """The ACK control messages of a capture read in parts (:func:`load_tables` with
    :class:`PartSpills`), set aside on disk in ``buckets`` buckets by frame, so that no step
    holds every ACK of the capture at once.

    Why buckets and not the parts: which part an ACK belongs to depends on its registration
    (a consumption ACK goes with the source its receiver registered for,
    :func:`spark_analysis.engine.acks.ack_hosts`), known only once the ACK message (its
    addresses, in ``messages``) and its ``ume_ack`` header (the registration ID, in
    ``lbmc_ume_ack``) are joined, and the two are stored apart and not in one order (LBT-TCP
    messages are reassembled apart).  So both are cut by their frame's ``pos`` into buckets
    as they are read, a bucket's two halves joined when the bucket is read back (iteration),
    and the caller routes each bucket's ACKs to the parts
    (:func:`spark_analysis.engine.run.analyze_in_parts`).  What stays in memory for the
    whole capture is one number per ACK (its frame's ``pos``, to tell the messages that
    carry one), where it was every ACK with its header (about 0.8 GiB at 10,000,000 frames).
    """

    def __init__(self, spill: Spill, buckets: int) -> None:
        self.spill, self.buckets = spill, max(1, buckets)

    def bucket(self, pos: np.ndarray) -> np.ndarray:
        """The bucket of each frame ``pos`` (a multiplicative hash: byte offsets share
        factors, their hash bits do not)."""
        mixed = pos.astype(np.uint64, copy=False) * np.uint64(0x9E3779B97F4A7C15)
        return ((mixed >> np.uint64(32)) % np.uint64(self.buckets)).astype(np.int64)

    def add(self, side: str, table: pa.Table) -> None:
        """``table``'s rows (``headers`` or ``messages``, each with ``pos``) to their
        buckets."""
        table = _normalised(table)
        where = self.bucket(np.asarray(table.column("pos").combine_chunks(), dtype=np.int64))
        for b in range(self.buckets):
            self.spill.add(f"{side}-{b}", table.filter(pa.array(where == b)))

    def close(self) -> None:
        self.spill.close()

    def __iter__(self) -> Iterator[pa.Table]:
        """Each bucket's ACK control messages (:data:`CONTROL_TABLES` ``acks``), a bucket at
        a time; the buckets together hold every row of the table :func:`load_tables` gives
        without parts, in another order."""
        spec = CONTROL_TABLES["acks"]
        for b in range(self.buckets):
            messages = self.spill.read(f"messages-{b}")
            headers = {"ume_ack": self.spill.read(f"headers-{b}")}
            yield _control_table(messages, headers, {"ume_ack": _carriers(messages,
                                                                          headers["ume_ack"])},
                                 spec)


@dataclass(frozen=True)
class PartSpills:
    """Where :func:`load_tables` puts a capture read in parts."""

    split: Split
    """How a batch of ``packets`` or ``messages`` is cut into the parts."""
    spills: Sequence[Spill]
    """Each part's ``packets`` and ``messages``."""
    acks: AckBuckets
    """The ACK control messages, by bucket (routed to the parts once the registrations are
    known)."""


def _split_messages(batches: Iterable[pa.Table], headers: dict[str, pa.Table],
                    ranks: dict[str, int], per_file: bool, parts: _Parts | None = None,
                    ack_pos: np.ndarray | None = None) -> tuple[pa.Table, pa.Table]:
    """The stored messages, a batch at a time, as two tables in stored order: those with a
    sequence number (``messages``) and the *candidates* for the control tables, every
    message in a frame that carries one of the ``headers`` or marked malformed (a superset
    of the control messages: :func:`_control_table` picks them by their exact key).  The
    whole messages table is never held: a persistent capture's ACKs make it nearly twice
    the data messages, and its combined copy was the peak of the load.  With ``parts`` the
    ``messages`` go to the parts' spill files instead, and the messages in a frame at one
    of ``ack_pos`` (the frames that carry a ``ume_ack``, sorted) to the ACK buckets; the
    other candidates are kept."""
    marked = _sorted_positions(headers.values())
    data: list[pa.Table] = []
    control: list[pa.Table] = []
    for batch in batches:
        batch = _add_capture(batch, ranks, per_file)
        sequenced = batch.filter(pc.is_valid(batch.column("sqn"))).select(MESSAGE_COLUMNS)
        if parts is None:
            data.append(sequenced)
        else:
            parts.add("messages", sequenced)
        pos = np.asarray(batch.column("pos").combine_chunks(), dtype=np.int64)
        malformed = np.asarray(pc.is_valid(batch.column("malformed_reason")), dtype=bool)
        control.append(batch.filter(pa.array(_found(marked, pos) | malformed))
                       .select(MESSAGE_COLUMNS))
        if parts is not None and ack_pos is not None:
            parts.acks.add("messages", batch.filter(pa.array(_found(ack_pos, pos)))
                           .select(list(CONTROL_TABLES["acks"].columns)))
    if parts is not None:   # (the batches went to the parts' spills)
        data = [parts.schemas["messages"].empty_table()]
    return _combined(pa.concat_tables(data)), _combined(pa.concat_tables(control))


def _sorted_positions(headers: Iterable[pa.Table]) -> np.ndarray:
    """The frames that carry one of ``headers`` (tables with ``pos``), sorted for a binary
    search (repeats are harmless; nearly in capture order already, which a stable sort is
    quick on)."""
    return np.sort(np.concatenate(
        [np.asarray(h.column("pos").combine_chunks(), dtype=np.int64) for h in headers]
        or [np.empty(0, dtype=np.int64)]), kind="stable")


def _found(marked: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """Which of ``pos`` are in ``marked`` (sorted)."""
    if not len(marked):
        return np.zeros(len(pos), dtype=bool)
    at = np.minimum(np.searchsorted(marked, pos), len(marked) - 1)
    return marked[at] == pos


def load_tables(root: str, files: Sequence[str], per_file: bool, *,
                captures: Sequence[str] | None = None, filesystem: Any = None,
                parts: PartSpills | None = None) -> dict[str, pa.Table]:
    """The analyses' tables (:class:`Inputs`) as Arrow, read from the decode's output ``root``.

    Args:
        files: every capture file name as the ``file`` column holds it; their natural order
            is the capture order (``pos``).
        per_file: each file is its own capture, else all are one (``all``).
        captures: read only the rows of these captures (file names with ``per_file``, else
            ``["all"]``); default all.
        parts: to read a capture analysed in parts (:class:`PartSpills`).  ``packets`` and
            ``messages`` are then written to the parts' spills a batch at a time (each part's
            read back from its spill) and come back without rows; the ACKs go to
            ``parts.acks`` (:class:`AckBuckets`) and are not returned; the other control
            tables and the advertisements, shared by every part, come back whole.
    """
    ordered = natural_order(files)
    ranks = {name: index for index, name in enumerate(ordered)}
    only = _files_of(captures, per_file)

    def table(name: str) -> str:
        return _stored(root, name)

    wanted = PACKET_COLUMNS + OPTIONAL_PACKET_COLUMNS
    stored = [c for c in wanted if c not in ("capture", "pos")]
    spills = None if parts is None else _Parts(parts)
    if spills is None:
        packets = _add_capture(_read(table("packets"), stored, only, filesystem), ranks,
                               per_file)
    else:
        for batch in _scan(table("packets"), stored, only, filesystem):
            batch = _add_capture(batch, ranks, per_file)
            spills.add("packets", batch.select([c for c in wanted if c in batch.schema.names]))
        packets = spills.schemas["packets"].empty_table()
    packets = packets.select([c for c in wanted if c in packets.schema.names])

    def keyed(name: str, header: pa.Table) -> pa.Table:
        return pa.table({"pos": _positions(header, ranks), "msg_index": header.column("msg_index"),
                         name: header.column(name)})

    headers: dict[str, pa.Table] = {}
    ack_pos = None
    for name in HEADER_COLUMNS:
        stored_header = table(f"{HEADER_TABLE_PREFIX}{name}")
        if spills is not None and name in CONTROL_TABLES["acks"].marked_by:
            # (one ume_ack header table: the ACKs are the only control messages in buckets)
            found = []
            for batch in _scan(stored_header, [*MESSAGE_KEY, name], only, filesystem):
                batch = keyed(name, batch)
                spills.acks.add("headers", batch)
                found.append(batch.select(["pos"]))
            ack_pos = _sorted_positions(found)
            del found
            continue
        headers[name] = keyed(name, _read(stored_header, [*MESSAGE_KEY, name], only,
                                          filesystem))
    messages, candidates = _split_messages(_scan(table("messages"), [
        c for c in MESSAGE_COLUMNS if c not in ("capture", "pos")], only, filesystem),
        headers, ranks, per_file, spills, ack_pos)
    if spills is not None:
        spills.close()
    carriers = {name: _carriers(candidates, header) for name, header in headers.items()}
    controls = {name: _control_table(candidates, headers, carriers, spec)
                for name, spec in CONTROL_TABLES.items()
                if all(header in headers for header in (*spec.marked_by, *spec.headers))}
    del headers, carriers, candidates

    # the few advertisements keep plain names (the topic analyses join on them)
    adverts = _add_capture(_read(table("advertisements"), None, only, filesystem,
                                 encoded=frozenset()), ranks, per_file)
    return {"packets": packets, "messages": messages, "advertisements": adverts, **controls}


def count_packets(root: str, files: Sequence[str], per_file: bool, *,
                  captures: Sequence[str] | None = None, filesystem: Any = None) -> int:
    """How many stored packets ``captures`` have (from the Parquet footers when every
    capture is asked for, else a scan of the file names)."""
    return int(_dataset(_stored(root, "packets"), filesystem).count_rows(
        filter=_only(_files_of(captures, per_file))))


def scan_packets(root: str, files: Sequence[str], per_file: bool, columns: Sequence[str], *,
                 captures: Sequence[str] | None = None, filesystem: Any = None
                 ) -> Iterator[pa.Table]:
    """The ``columns`` of the stored packets of ``captures`` (as :func:`load_tables` reads
    them, without ``capture`` and ``pos``), a record batch at a time."""
    return _scan(_stored(root, "packets"), columns, _files_of(captures, per_file), filesystem)


def _stored(root: str, name: str) -> str:
    """Where the decode stored table ``name`` under ``root``."""
    return f"{root.rstrip('/')}/{name}"


def _files_of(captures: Sequence[str] | None, per_file: bool) -> list[str] | None:
    """The file names whose rows ``captures`` hold (None: every row): with ``per_file`` a
    capture is a file, else ``all`` is every file."""
    return None if captures is None or not per_file else list(captures)


def load(root: str, files: Sequence[str], per_file: bool, *,
         captures: Sequence[str] | None = None, filesystem: Any = None) -> Inputs:
    """:func:`load_tables` as pandas (:func:`frame`)."""
    return as_inputs(load_tables(root, files, per_file, captures=captures,
                                 filesystem=filesystem))


def as_inputs(tables: dict[str, pa.Table]) -> Inputs:
    """:func:`load_tables`' tables as pandas (:func:`as_frame`), each let go once converted."""
    return Inputs(*(as_frame(name, tables.pop(name)) for name in TABLES))


def as_frame(name: str, table: pa.Table) -> pd.DataFrame:
    """Input table ``name`` as the analyses take it (:func:`frame`, its chunks combined)."""
    # (the few advertisements keep plain strings: the topic analyses join on them)
    return frame(_combined(table, frozenset() if name == "advertisements" else DICTIONARY))


class _Parts:
    """Batches cut into the parts of a capture (:class:`PartSpills`), each written to its
    part's spill."""

    def __init__(self, out: PartSpills) -> None:
        self.split, self.spills, self.acks = out.split, out.spills, out.acks
        self.schemas: dict[str, pa.Schema] = {}

    def add(self, name: str, batch: pa.Table) -> None:
        batch = _normalised(batch)
        self.schemas.setdefault(name, batch.schema)
        for spill, rows in zip(self.spills, self.split(name, batch), strict=True):
            spill.add(name, rows)

    def close(self) -> None:
        for spill in self.spills:
            spill.close()
        self.acks.close()


def _normalised(batch: pa.Table) -> pa.Table:
    """``batch`` with its :data:`DICTIONARY` columns encoded (a Parquet column chunk may come
    plain): every batch of a spill has one schema."""
    for i, field in enumerate(batch.schema):
        if field.name in DICTIONARY and not pa.types.is_dictionary(field.type):
            batch = batch.set_column(i, field.name,
                                     pc.dictionary_encode(batch.column(i)))
    return batch


def _combined(table: pa.Table, encoded: frozenset[str] = DICTIONARY) -> pa.Table:
    """``table`` with one chunk per column (a table read from many files has one per file and
    row group: pandas' Arrow-backed operations handle chunked columns chunk by chunk or
    combine them again each time; at 10,000,000 frames the data messages took twice as
    long).  Column by column, each chunked original let go once copied (when the caller
    holds no other reference), so the copy costs one column's memory, not the table's."""
    columns: dict[str, pa.Array] = {}
    for name in table.column_names:
        column = table.column(name)
        if name in encoded and not pa.types.is_dictionary(column.type):
            column = pc.dictionary_encode(column)
        # (chunks of a dictionary column read from several files have their own dictionaries:
        # combining them unifies them)
        columns[name] = column.combine_chunks()
        table = table.drop_columns([name])
        del column
    return pa.table(columns)
