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

``messages`` is given twice (:class:`Inputs`): every message the analyses read, without
the typed header columns, and the *control* messages, the few that carry a UME header the
analyses read (registrations, ACKs, RXREQs) or are malformed, with the header columns joined
back.  A header column is a struct of many fields as long as its table: on every data message
it was a null that still cost the struct's width (about 1 GiB of nulls at 10,000,000 frames);
every analysis that reads a header reads the rows that carry it and nothing else.

Rows come in the order of the stored files, which is nearly capture order (LBT-TCP messages,
reassembled apart, are stored apart): a function that walks a table in capture order sorts it
by ``pos`` (and ``msg_index``) itself.  Only the rows of the captures asked for are read (a
filter on ``file`` pushed into the Parquet scan), so a task analysing one capture of many
reads that capture alone.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds

from spark_analysis.engine.common import frame
from spark_analysis.schemas import HEADER_TABLE_PREFIX, MESSAGE_KEY

FILE_SHIFT = 40
"""``pos`` = file rank << FILE_SHIFT | byte offset: files up to 1 TiB, 8 million files."""

HEADER_COLUMNS = ("ume_preg", "ume_preg_resp", "ume_ack", "ume_rxreq", "ume_sid", "ume_storeid")
"""The typed LBMC header columns of ``messages`` the analyses read, each joined back from its
``lbmc_<name>`` table by the message key (file, record offset, index in the frame)."""

MESSAGE_COLUMNS = ["capture", "pos", "msg_index", "file", "file_offset", "ts_ns", "protocol",
                   "src_ip", "src_port", "dst_ip", "dst_port", "session_id", "transport_sqn",
                   "message_type", "label", "tidx", "sqn", "topic_name", "payload_length",
                   "malformed_reason"]
"""The messages columns the analyses read (the stored table is wide: read what is used)."""

CONTROL_COLUMNS = [*MESSAGE_COLUMNS, *HEADER_COLUMNS]
"""The columns of the control messages: the message columns and the typed headers."""

CONTROL_HEADERS = ("ume_preg", "ume_preg_resp", "ume_ack", "ume_rxreq")
"""The headers that make a message a control message (``ume_sid`` and ``ume_storeid`` only
qualify a registration)."""

PACKET_COLUMNS = ["capture", "pos", "file", "file_offset", "ts_ns", "protocol", "src_ip",
                  "src_port", "dst_ip", "dst_port", "payload_length", "packet_type", "sqn",
                  "session_id", "ucast_port", "retransmission", "nak_sqns", "ncf_sqns",
                  "ncf_reason", "messages", "malformed_reason"]
"""The packets columns the analyses read: about half of the stored table."""

OPTIONAL_PACKET_COLUMNS = ["icmp_type", "icmp_code"]
"""Packets columns the analyses read when the decode wrote them (ICMP-quoted datagrams)."""


DICTIONARY = frozenset({"file"})
"""Columns the analyses get dictionary-encoded: ``file`` is the capture file's name (often a
path) on every row, which the analyses only carry to their detail rows; as a plain string it
was the widest column of every big table (a 40-character path: 190 MiB of the 760 MiB of
``packets`` at 10,000,000 frames, and as much again in every table made from them).  The
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
    """Every message with a sequence number, a control header or a malformation:
    :data:`MESSAGE_COLUMNS`."""
    advertisements: pd.DataFrame
    """Topic resolution records."""
    controls: pd.DataFrame
    """The messages carrying one of :data:`CONTROL_HEADERS` or malformed:
    :data:`CONTROL_COLUMNS` (module docstring)."""


def _read(path: str, columns: Sequence[str] | None, files: Sequence[str] | None,
          filesystem: Any, where: Any = None) -> pa.Table:
    dataset = ds.dataset(path, format="parquet", filesystem=filesystem)
    names = dataset.schema.names
    wanted = None if columns is None else [c for c in columns if c in names]
    condition = None if files is None else pc.field("file").isin(list(files))
    if where is not None:
        condition = where if condition is None else condition & where
    out = dataset.to_table(columns=wanted, filter=condition)
    # a partition column or a dictionary page comes as a dictionary: plain values, as Spark
    # reads them (and a join cannot unify the dictionaries of two tables)
    for i, field in enumerate(out.schema):
        if pa.types.is_dictionary(field.type):
            out = out.set_column(i, field.name, out.column(i).cast(field.type.value_type))
    return out


def _add_capture(table: pa.Table, ranks: dict[str, int], per_file: bool) -> pa.Table:
    """``capture`` and ``pos`` (module docstring) in front of ``table``'s columns."""
    file = table.column("file")
    rank = pc.index_in(file, value_set=pa.array(list(ranks), pa.string()))
    rank = pc.take(pa.array(list(ranks.values()), pa.int64()), rank)
    pos = pc.add(pc.shift_left(pc.coalesce(rank, 0), FILE_SHIFT), table.column("file_offset"))
    capture = file if per_file else pa.array(["all"], pa.string()).take(
        pa.array(np.zeros(table.num_rows, dtype=np.int64)))
    return table.append_column("capture", capture).append_column("pos", pos)


def _key_rows(messages: pa.Table, keys: pa.Table) -> np.ndarray:
    """The rows of ``messages`` whose message key (:data:`MESSAGE_KEY`) is one of ``keys``'s
    rows, ascending."""
    left = messages.select(MESSAGE_KEY).append_column(
        "_m", pa.array(np.arange(messages.num_rows, dtype=np.int64)))
    pairs = left.join(keys.select(MESSAGE_KEY), MESSAGE_KEY, join_type="left semi")
    return np.sort(pairs.column("_m").to_numpy())


def _joined(messages: pa.Table, header: pa.Table, name: str) -> pa.ChunkedArray:
    """``header``'s column ``name`` aligned with the rows of ``messages`` by the message key
    (null where a message has no such header).  Arrow's join carries no struct columns, so
    it joins row numbers, and the struct column is taken by them."""
    left = messages.select(MESSAGE_KEY).append_column(
        "_m", pa.array(np.arange(messages.num_rows, dtype=np.int64)))
    right = header.select(MESSAGE_KEY).append_column(
        "_h", pa.array(np.arange(header.num_rows, dtype=np.int64)))
    pairs = left.join(right, MESSAGE_KEY, join_type="inner")
    index = np.full(messages.num_rows, -1, dtype=np.int64)
    index[pairs.column("_m").to_numpy()] = pairs.column("_h").to_numpy()
    return pc.take(header.column(name), pa.array(index, mask=index < 0))


def load_tables(root: str, files: Sequence[str], per_file: bool, *,
                captures: Sequence[str] | None = None, filesystem: Any = None,
                ) -> dict[str, pa.Table]:
    """The analyses' tables (:class:`Inputs`) as Arrow, read from the decode's output ``root``.

    Args:
        files: every capture file name as the ``file`` column holds it; their natural order
            is the capture order (``pos``).
        per_file: each file is its own capture, else all are one (``all``).
        captures: read only the rows of these captures (file names with ``per_file``, else
            ``["all"]``); default all.
    """
    ordered = natural_order(files)
    ranks = {name: index for index, name in enumerate(ordered)}
    only = None if captures is None or not per_file else list(captures)

    def table(name: str) -> str:
        return f"{root.rstrip('/')}/{name}"

    packets = _read(table("packets"), [c for c in PACKET_COLUMNS + OPTIONAL_PACKET_COLUMNS
                                       if c not in ("capture", "pos")], only, filesystem)
    packets = _add_capture(packets, ranks, per_file)
    packets = packets.select([c for c in PACKET_COLUMNS + OPTIONAL_PACKET_COLUMNS
                              if c in packets.schema.names])

    core = [c for c in MESSAGE_COLUMNS if c not in ("capture", "pos")]
    messages = _read(table("messages"), core, only, filesystem)
    headers = {name: _read(table(f"{HEADER_TABLE_PREFIX}{name}"), [*MESSAGE_KEY, name], only,
                           filesystem) for name in HEADER_COLUMNS}
    # the control messages: the rows named by a control header's table, and the malformed
    marked = pa.concat_tables([headers[name].select(MESSAGE_KEY) for name in CONTROL_HEADERS])
    control = np.zeros(messages.num_rows, dtype=bool)
    control[_key_rows(messages, marked)] = True
    malformed = pc.is_valid(messages.column("malformed_reason"))
    control |= malformed.to_numpy(zero_copy_only=False)
    controls = messages.filter(pa.array(control))
    for name in HEADER_COLUMNS:
        controls = controls.append_column(name, _joined(controls, headers[name], name))
    controls = _add_capture(controls, ranks, per_file).select(CONTROL_COLUMNS)
    keep = pc.or_(pc.is_valid(messages.column("sqn")), pa.array(control))
    messages = _add_capture(messages.filter(keep), ranks, per_file).select(MESSAGE_COLUMNS)

    adverts = _read(table("advertisements"), None, only, filesystem)
    adverts = _add_capture(adverts, ranks, per_file)
    return {"packets": packets, "messages": messages, "advertisements": adverts,
            "controls": controls}


def load(root: str, files: Sequence[str], per_file: bool, *,
         captures: Sequence[str] | None = None, filesystem: Any = None) -> Inputs:
    """:func:`load_tables` as pandas (:func:`frame`)."""
    tables = load_tables(root, files, per_file, captures=captures, filesystem=filesystem)
    return Inputs(*(frame(_combined(tables.pop(name)))
                    for name in ("packets", "messages", "advertisements", "controls")))


def _combined(table: pa.Table) -> pa.Table:
    """``table`` with one chunk per column (a table read from many files has one per file and
    row group: pandas' Arrow-backed operations handle chunked columns chunk by chunk or
    combine them again each time; at 10,000,000 frames the data messages took twice as
    long).  Column by column, each chunked original let go once copied (when the caller
    holds no other reference), so the copy costs one column's memory, not the table's."""
    columns: dict[str, pa.Array] = {}
    for name in table.column_names:
        column = table.column(name)
        columns[name] = (pc.dictionary_encode(column).combine_chunks() if name in DICTIONARY
                         else column.combine_chunks())
        table = table.drop_columns([name])
        del column
    return pa.table(columns)
