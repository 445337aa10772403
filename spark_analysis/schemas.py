"""The UM tables the columnar decode makes: options, Arrow schemas and the stored form.

What a decode produces and how it is stored, apart from how it is made: :class:`DecodeOptions`
(what counts as UM), the column types read off :mod:`wire`'s Construct structs
(:class:`ColumnPart`, the typed LBMC header columns of ``messages`` and the TIR option
columns of ``advertisements``), the output schemas (``packets``, ``messages``,
``advertisements``, ``skipped``, ``tcp_segments``), the stored form (dictionary-typed
categorical columns, ``messages`` split into a core table and one table per header) and
:class:`DecodedTables`, which holds one decode's tables in either form.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import construct as cs
import numpy as np
import pyarrow as pa

from wire import lbmc, lbmr
from wire.fields import (
    Bit,
    bit_views,
    fixed_format,
    members,
    qualify,
    tshark_name,
    value_kind,
)
from wire.tshark import PortMap

from .arrow_build import (
    arrow_array,
    empty_table,
    python_table,
)
from .splits import CAPTURE_SCHEMA

# =============================================================================================
# Input contract and options
# =============================================================================================

FRAME_SCHEMA = CAPTURE_SCHEMA
"""The frame batches this module reads: :data:`spark_analysis.splits.CAPTURE_SCHEMA`, what
``spark.read.format("pcap")`` produces.  Only ``file``, ``file_offset``, ``ts_ns``,
``linktype`` and ``data`` are read; ``data`` may also be ``large_binary`` and ``file``
``large_string`` (Spark's large Arrow types)."""


@dataclass(frozen=True)
class DecodeOptions:
    """How to recognise UM traffic.

    Attributes:
        ports: tshark-style port preferences (store ports, decode-as ports, ranges); the
            defaults are tshark's.  Store connections need ``PortMap(store_ports=[...])``.
        content_heuristics: also claim UDP datagrams that no port rule claims when their
            content decodes cleanly as LBT-RM, LBT-RU or LBMR (see the module docstring).
        separate_files: every capture file is a capture of its own, so a TCP connection
            direction is the file *and* the 4-tuple (:func:`flow_key_columns`): separate
            captures that reuse a 4-tuple (a test rig rerun, the same client port) must not
            have their segments reassembled together.  Off (the default), the files are
            pieces of one capture (``tcpdump -C``) and a stream continues from one file to the
            next.
    """

    ports: PortMap = field(default_factory=PortMap)
    content_heuristics: bool = True
    separate_files: bool = False


# =============================================================================================
# Arrow types read off the Construct structs
# =============================================================================================


_SIGNED_BY_SIZE = {1: pa.int16(), 2: pa.int32(), 4: pa.int64(), 8: pa.decimal128(20, 0)}


def _arrow_type(member: cs.Construct) -> pa.DataType:
    """Spark-compatible Arrow type of a struct member, as narrow as exact: Spark has no
    unsigned integers, so an unsigned member gets the next wider signed type (u8 int16, u16
    int32, u32 int64, u64 decimal(20,0)).  Narrow matters: every field of a header column is
    shipped for every message row, present or not."""
    kind = value_kind(member)
    if kind in ("ipv4", "text"):
        return pa.string()
    if kind == "bytes":
        return pa.binary()
    letter = fixed_format(member)
    if letter is None:
        raise TypeError(f"{member} has no fixed integer format")
    size = struct.calcsize(">" + letter)
    if letter.islower():  # signed
        return {1: pa.int8(), 2: pa.int16(), 4: pa.int32(), 8: pa.int64()}[size]
    return _SIGNED_BY_SIZE[size]


def _view_type(bit: Bit) -> pa.DataType:
    """A one-bit flag is a boolean; wider bit fields the narrowest signed type."""
    width = (bit.mask >> bit.shift).bit_length()
    if width == 1:
        return pa.bool_()
    return pa.int16() if width < 16 else pa.int32() if width < 32 else pa.int64()


@dataclass(frozen=True)
class ColumnPart:
    """One field of a struct column: a struct member, or a named bit view of one.

    Attributes:
        name: the field name (the member or bit-view name in :mod:`wire`).
        member: the member holding the value.
        bit: the bit view, or None for the member itself.
        type: the Arrow type.
        kind: ``int``, ``ipv4``, ``bytes`` or ``text`` (how the raw value converts).
        tshark: the tshark display-filter name (also kept as Arrow field metadata).
    """

    name: str
    member: str
    bit: Bit | None
    type: pa.DataType
    kind: str
    tshark: str | None


def struct_parts(struct_def: cs.Struct, prefix: str,
                 skip: Sequence[str] = ("next_hdr", "trailing")) -> tuple[ColumnPart, ...]:
    """The fields of a struct column for ``struct_def``: every member (except ``skip``), each
    followed by its bit views, named as in :mod:`wire` and annotated with tshark's names the
    same way :func:`wire.fields.export_struct` names them."""
    parts: list[ColumnPart] = []
    seen: set[str] = set()
    for member in members(struct_def):
        if member.name in skip:
            continue
        shown = tshark_name(member)
        parts.append(ColumnPart(member.name, member.name, None, _arrow_type(member),
                                value_kind(member),
                                qualify(prefix, shown) if shown is not None else None))
        seen.add(member.name)
        for view, bit in bit_views(member).items():
            if view in seen:
                continue
            seen.add(view)
            tshark = qualify(prefix, bit.tshark or f"{shown or member.name}.{view}")
            parts.append(ColumnPart(view, member.name, bit, _view_type(bit), "int", tshark))
    return tuple(parts)


def parts_struct_type(parts: Sequence[ColumnPart]) -> pa.StructType:
    return _struct_type_of(tuple(parts))


@functools.cache
def _struct_type_of(parts: tuple[ColumnPart, ...]) -> pa.StructType:
    return pa.struct([pa.field(p.name, p.type,
                               metadata={"tshark": p.tshark} if p.tshark else None)
                      for p in parts])


def struct_pyvalue(parts: Sequence[ColumnPart], values: Mapping[str, Any]) -> dict[str, Any]:
    """One struct column value from a record's Python values (the LBMR path)."""
    out: dict[str, Any] = {}
    for part in parts:
        raw = values.get(part.member)
        if part.bit is None:
            out[part.name] = raw
        else:
            raw_int = int(raw or 0)
            when = part.bit.when
            value = part.bit.get(raw_int) if when is None or when(raw_int) else None
            out[part.name] = bool(value) if value is not None and pa.types.is_boolean(
                part.type) else value
    return out


# --- LBMC header columns -------------------------------------------------------------------------


@dataclass(frozen=True)
class HeaderColumn:
    """A typed column of the messages table for one LBMC extended-header kind.

    Attributes:
        kind: the :class:`wire.lbmc.HeaderKind` (its derived fixed layout is what is read).
        repeated: a message may carry several (store entries): a list column in chain order;
            otherwise the first occurrence is shown (``header_codes`` lists them all).
        parts: the struct fields (members except ``next_hdr``/``trailing``, with bit views).
    """

    kind: lbmc.HeaderKind
    repeated: bool
    parts: tuple[ColumnPart, ...]

    @property
    def name(self) -> str:
        return self.kind.name

    @property
    def struct_type(self) -> pa.StructType:
        return parts_struct_type(self.parts)

    @property
    def arrow_type(self) -> pa.DataType:
        return pa.list_(self.struct_type) if self.repeated else self.struct_type


def _header_column(cls: type[lbmc.Header], repeated: bool = False) -> HeaderColumn:
    kind = cls.kind
    if not kind.fixed or kind.struct is None:
        raise TypeError(f"{kind.name} has no fixed layout to read column-wise")
    return HeaderColumn(kind, repeated, struct_parts(kind.struct, kind.field_prefix))


MESSAGE_HEADER_COLUMNS: tuple[HeaderColumn, ...] = (
    _header_column(lbmc.UmePreg),
    _header_column(lbmc.UmePregResp),
    _header_column(lbmc.UmeAck),
    _header_column(lbmc.UmeRxreq),
    _header_column(lbmc.UmeKeepalive),
    _header_column(lbmc.UmeStoreid),
    _header_column(lbmc.UmeCapability),
    _header_column(lbmc.UmeStoreGroup, repeated=True),
    _header_column(lbmc.UmeStore, repeated=True),
    _header_column(lbmc.UmeClientLifetime),
    _header_column(lbmc.UmeSid),
    _header_column(lbmc.SriReq),
    _header_column(lbmc.Sri),
    _header_column(lbmc.TcpSid),
    _header_column(lbmc.Srcidx),
    _header_column(lbmc.Frag),
    _header_column(lbmc.UmeStoreExt, repeated=True),
    _header_column(lbmc.TopicIdx),
)
"""The LBMC headers decoded into typed columns of ``messages`` (named ``kind.name``).

``sri`` comes with its store entries in the ``ume_store``/``ume_store_group`` list columns of
the same message.  Add a header here to get a column; its layout is read off the struct.  Each
column costs width on *every* message row (Arrow ships the fields of absent structs too), so
the list holds what persistence analyses need; ``header_codes`` names every header anyway."""

# --- LBMR advertisement option columns ---------------------------------------------------------


@dataclass(frozen=True)
class OptionColumn:
    """A typed column of ``advertisements`` for one TIR topic option (``lbmr.topt.*``)."""

    name: str
    cls: type[lbmr.Record]
    repeated: bool
    parts: tuple[ColumnPart, ...]

    @property
    def arrow_type(self) -> pa.DataType:
        st = parts_struct_type(self.parts)
        return pa.list_(st) if self.repeated else st


def _option_column(name: str, cls: type[lbmr.Record], repeated: bool = False) -> OptionColumn:
    kind = cls.kind
    return OptionColumn(name, cls, repeated,
                        struct_parts(kind.struct, kind.tshark, skip=("type", "len", "trailing")))


ADVERTISEMENT_OPTION_COLUMNS: tuple[OptionColumn, ...] = (
    _option_column("topt_ume", lbmr.ToptUme),
    _option_column("topt_ume_store", lbmr.ToptUmeStore, repeated=True),
    _option_column("topt_ume_store_group", lbmr.ToptUmeStoreGroup, repeated=True),
    _option_column("topt_latejoin", lbmr.ToptLatejoin),
    _option_column("topt_exfunc", lbmr.ToptExfunc),
)
"""TIR options decoded into typed columns (first occurrence, or every one for list columns)."""

# =============================================================================================
# Output schemas
# =============================================================================================


def _f(name: str, dtype: pa.DataType, doc: str) -> pa.Field:
    return pa.field(name, dtype, metadata={"doc": doc})


_IDENTITY = [
    _f("file", pa.string(), "capture file the frame came from"),
    _f("file_offset", pa.int64(), "byte offset of the frame's record in the file; with `file`, "
       "the frame's identity"),
    _f("ts_ns", pa.int64(), "capture time, nanoseconds since the Unix epoch"),
    _f("protocol", pa.string(), "lbtrm, lbtru, lbttcp or lbmr"),
    _f("src_ip", pa.string(), "IPv4 source, dotted"),
    _f("src_port", pa.int32(), "UDP/TCP source port"),
    _f("dst_ip", pa.string(), "IPv4 destination, dotted"),
    _f("dst_port", pa.int32(), "UDP/TCP destination port"),
]

PACKETS_SCHEMA = pa.schema([
    *_IDENTITY,
    _f("src_ip_int", pa.int64(), "IPv4 source as an unsigned 32-bit number"),
    _f("dst_ip_int", pa.int64(), "IPv4 destination as an unsigned 32-bit number"),
    _f("classified_by", pa.string(), "`port` (a tshark-style port rule) or `content` (a "
       "content heuristic, UDP only)"),
    _f("payload_length", pa.int32(), "UDP/TCP payload bytes of the frame"),
    _f("packet_type", pa.string(), "LBT-RM/LBT-RU: data, sm, nak, ncf, ack, creq, rst; LBMR: "
       "normal, wc_tqr, rcv_alive, src_alive, topic_mgmt, umq, ext; LBT-TCP: null"),
    _f("flags", pa.int32(), "raw transport flags (LBT-RU `flags`, LBT-RM `flags_fec_type`)"),
    _f("sqn", pa.int64(), "transport sequence number: DATA `sqn`, SM `sm_sqn`, ACK `ack_sqn`"),
    _f("trail_sqn", pa.int64(), "trailing edge (DATA, SM, NCF)"),
    _f("lead_sqn", pa.int64(), "leading edge (SM)"),
    _f("session_id", pa.int64(), "LBT-RM header session ID; LBT-RU SID option (last one)"),
    _f("client_id", pa.int64(), "LBT-RU CID option (last one)"),
    _f("ucast_port", pa.int32(), "LBT-RM: the source's unicast (NAK) port from the header"),
    _f("retransmission", pa.bool_(), "UDP DATA: the RX flag; LBT-TCP: the segment carries only "
       "bytes already seen (a TCP retransmission)"),
    _f("syn", pa.bool_(), "LBT-RU SM: the SYN flag"),
    _f("num_naks", pa.int32(), "NAK: `num_naks` as sent"),
    _f("nak_sqns", pa.list_(pa.int64()), "NAK: the NAKed sequence numbers"),
    _f("num_ncfs", pa.int32(), "NCF: `num_ncfs` as sent"),
    _f("ncf_sqns", pa.list_(pa.int64()), "NCF: the confirmed sequence numbers"),
    _f("ncf_reason", pa.int32(), "NCF: reason nibble (0 no retry, 1 ignored, 2 delay, 3 shed)"),
    _f("format", pa.int32(), "NAK/NCF: format nibble (0 selective, 1 parity)"),
    _f("creq_request", pa.int32(), "LBT-RU CREQ: request code (0 = SYN)"),
    _f("rst_reason", pa.int32(), "LBT-RU RST: reason code"),
    _f("tcp_seq", pa.int64(), "LBT-TCP: the segment's TCP sequence number"),
    _f("messages", pa.int32(), "LBMC messages decoded from this packet (LBT-TCP: messages "
       "this segment made deliverable)"),
    _f("malformed_reason", pa.string(), "why (part of) the packet does not decode; null if fine"),
    _f("icmp_type", pa.int32(), "the type of the ICMP error quoting this UDP datagram (3 "
       "destination unreachable, 11 time exceeded ...; addresses and ports are the quoted "
       "datagram's); null for a datagram seen itself"),
    _f("icmp_code", pa.int32(), "that ICMP error's code (type 3 code 3: port unreachable, "
       "e.g. a NAK to a source that is gone)"),
])
"""One row per UM packet: a UDP datagram of LBT-RM, LBT-RU or LBMR, or a TCP segment with
payload on an LBT-TCP connection.  Columns that do not apply to a packet type are null."""

LBMC_TYPE_NAMES = {
    lbmc.MessageType.MESSAGE: "data", lbmc.MessageType.EOT: "eot",
    lbmc.MessageType.PRORX: "proactive_retrans", lbmc.MessageType.CONTROL: "control",
    lbmc.MessageType.RETRANS: "retrans",
}

MESSAGES_SCHEMA = pa.schema([
    *_IDENTITY,
    _f("session_id", pa.int64(), "the carrying packet's transport session ID (UDP)"),
    _f("transport_sqn", pa.int64(), "the carrying DATA packet's transport sequence number"),
    _f("msg_index", pa.int32(), "position of the message in its packet (LBT-TCP: among the "
       "messages its segment made deliverable)"),
    _f("type", pa.int32(), "`lbmc.type` nibble"),
    _f("message_type", pa.string(), "data, retrans, proactive_retrans, control or eot"),
    _f("label", pa.string(), "tshark's Info label (DATA, RX-DATA, PREG, ACK, SRI ...)"),
    _f("msglen", pa.int32(), "`lbmc.msglen`"),
    _f("tidx", pa.int64(), "topic index (data types)"),
    _f("sqn", pa.int64(), "topic sequence number (data types)"),
    _f("topic_name", pa.string(), "topic of the message's topicname header, up to a NUL"),
    _f("payload_length", pa.int32(), "bytes after a chain ending in DATA (0 otherwise)"),
    _f("header_codes", pa.list_(pa.int32()), "every extended-header code, in chain order"),
    _f("malformed_reason", pa.string(), "why the message does not decode; null if fine"),
    *[_f(h.name, h.arrow_type, f"`lbmc.{h.kind.name}` header" +
         (", every occurrence" if h.repeated else ", first occurrence"))
      for h in MESSAGE_HEADER_COLUMNS],
])
"""One row per LBMC message, with its packet's identity and time."""

MESSAGE_KEY = ("file", "file_offset", "msg_index")
"""The columns naming one message: its frame (file and record offset) and its place among
the messages that frame holds or (LBT-TCP) made deliverable."""

MESSAGE_CORE_SCHEMA = pa.schema([f for f in MESSAGES_SCHEMA
                                 if f.name not in {h.name for h in MESSAGE_HEADER_COLUMNS}])
"""``messages`` without the typed header columns: how :func:`split_messages` stores it."""

HEADER_TABLE_PREFIX = "lbmc_"
"""Stored header tables are named after tshark's field prefix: ``lbmc_ume_ack`` holds what
tshark shows as ``lbmc.ume_ack.*``."""

HEADER_TABLE_SCHEMAS: dict[str, pa.Schema] = {
    f"{HEADER_TABLE_PREFIX}{h.name}": pa.schema([
        *[MESSAGES_SCHEMA.field(k) for k in MESSAGE_KEY],
        MESSAGES_SCHEMA.field(h.name).with_nullable(False)])
    for h in MESSAGE_HEADER_COLUMNS}
"""One table per typed header column: the key of each message that carries the header
(:data:`MESSAGE_KEY`) and the header itself, the column of ``messages`` of the same name."""


def split_messages(messages: pa.Table) -> tuple[pa.Table, dict[str, pa.Table]]:
    """``messages`` as stored: the core columns (:data:`MESSAGE_CORE_SCHEMA`) and, per
    header column with any value, the rows that carry it (:data:`HEADER_TABLE_SCHEMAS`).

    Why stored apart: a wide row costs the Parquet writer a definition level for every leaf
    of every header struct whether the header is there or not (148 leaves; most messages
    carry one header or none), which was most of the time spent writing ``messages``.
    :func:`join_headers` (pyarrow) and :meth:`spark_analysis.decode.ParquetTables.messages`
    (Spark) put them back together.  Dictionary-typed key columns stay so
    (:data:`CATEGORICAL_COLUMNS`)."""
    core = messages.select(MESSAGE_CORE_SCHEMA.names)
    dictionaries = pa.types.is_dictionary(messages.schema.field("file").type)
    headers: dict[str, pa.Table] = {}
    for column in MESSAGE_HEADER_COLUMNS:
        values = messages.column(column.name)
        if values.null_count == len(values):
            continue
        name = f"{HEADER_TABLE_PREFIX}{column.name}"
        present = values.is_valid()
        rows = messages.select([*MESSAGE_KEY, column.name]).filter(present)
        wanted = HEADER_TABLES_STORED if dictionaries else HEADER_TABLE_SCHEMAS
        headers[name] = rows.cast(wanted[name])
    return core, headers


def join_headers(core: pa.Table, headers: Mapping[str, pa.Table],
                 names: Sequence[str] | None = None) -> pa.Table:
    """The wide ``messages`` table (:data:`MESSAGES_SCHEMA`; with ``names``, only those
    header columns) from the stored core and header tables: the inverse of
    :func:`split_messages`, for reading stored tables back with pyarrow (whose categorical
    columns come back dictionary-typed: they are cast to plain strings).  Raises ValueError
    for a header row whose key names no message."""
    if core.schema != MESSAGE_CORE_SCHEMA:
        core = core.cast(MESSAGE_CORE_SCHEMA)
    wanted = [h.name for h in MESSAGE_HEADER_COLUMNS if names is None or h.name in names]
    n = core.num_rows
    rows = {key: i for i, key in enumerate(
        zip(*(core.column(k).to_pylist() for k in MESSAGE_KEY), strict=True))}
    columns = [core.column(name) for name in MESSAGE_CORE_SCHEMA.names]
    for name in wanted:
        stored = headers.get(f"{HEADER_TABLE_PREFIX}{name}")
        index = np.full(n, -1, np.int64)
        if stored is not None and stored.num_rows:
            keys = zip(*(stored.column(k).to_pylist() for k in MESSAGE_KEY), strict=True)
            try:
                at = np.array([rows[key] for key in keys], np.int64)
            except KeyError as exc:
                raise ValueError(f"a {name} row names no message: {exc.args[0]}") from None
            index[at] = np.arange(stored.num_rows)
            values = stored.column(name).combine_chunks()
        else:
            values = arrow_array([], MESSAGES_SCHEMA.field(name).type)
        columns.append(values.take(arrow_array(index, mask=index < 0)))
    schema = pa.schema([MESSAGES_SCHEMA.field(c) for c in [*MESSAGE_CORE_SCHEMA.names, *wanted]])
    return pa.Table.from_arrays(columns, schema=schema)


ADVERTISEMENTS_SCHEMA = pa.schema([
    *_IDENTITY,
    _f("record", pa.string(), "tir, tqr or wc_tqr"),
    _f("record_index", pa.int32(), "position among the packet's records of this kind"),
    _f("topic", pa.string(), "TIR/TQR topic name, or the wildcard TQR pattern"),
    _f("pattern_type", pa.int32(), "wildcard TQR pattern type (1 PCRE, 2 regex)"),
    _f("transport", pa.string(), "TIR transport: tcp, lbtru, lbtrm, lbtipc, ... or 0xNN"),
    _f("transport_type", pa.int32(), "TIR transport type code"),
    _f("source_ip", pa.string(), "TIR transport source address (LBT-RM: `src_addr`)"),
    _f("source_port", pa.int32(), "TIR transport source port (LBT-RM: `src_ucast_port`)"),
    _f("mcast_group", pa.string(), "LBT-RM multicast group"),
    _f("mcast_port", pa.int32(), "LBT-RM UDP destination port"),
    _f("session_id", pa.int64(), "TIR transport session ID, when the transport has one"),
    _f("topic_index", pa.int64(), "TIR topic index (`lbmr.tir.index`)"),
    _f("ttl", pa.int32(), "TIR ttl"),
    *[_f(o.name, o.arrow_type, f"`{o.cls.kind.tshark}` option") for o in
      ADVERTISEMENT_OPTION_COLUMNS],
])
"""One row per LBMR topic information record (TIR) and per topic query (TQR, wildcard TQR)."""

SKIPPED_SCHEMA = pa.schema([
    _f("file", pa.string(), "capture file"),
    _f("reason", pa.string(), "why these frames are not UM packets"),
    _f("frames", pa.int64(), "how many frames"),
    _f("first_file_offset", pa.int64(), "offset of the first such frame (an example to look at)"),
])
"""Counts of the frames that are not UM packets, by reason: nothing is dropped silently."""

TCP_SEGMENTS_SCHEMA = pa.schema([
    _f("file", pa.string(), "capture file"),
    _f("file_offset", pa.int64(), "frame offset in the file"),
    _f("ts_ns", pa.int64(), "capture time"),
    _f("src_ip_int", pa.int64(), "IPv4 source as a number"),
    _f("src_port", pa.int32(), "TCP source port"),
    _f("dst_ip_int", pa.int64(), "IPv4 destination as a number"),
    _f("dst_port", pa.int32(), "TCP destination port"),
    _f("seq", pa.int64(), "TCP sequence number"),
    _f("tcp_flags", pa.int32(), "TCP flags (FIN 0x01, SYN 0x02, ...)"),
    _f("payload", pa.binary(), "TCP payload"),
])
"""The input of the stateful second stage (grouped by :data:`FLOW_KEY`): the TCP segments of
candidate LBT-TCP connections (for :func:`reassemble_tcp`), and the IPv4 fragments of UDP
datagrams (for :func:`spark_analysis.defrag.defragment`), told apart by
:data:`FRAGMENT_PORT`.  Addresses travel as numbers only: stage 2 formats the dotted form of
the few distinct ones itself."""

FRAGMENT_PORT = -1
"""``src_port`` of a stage-2 row that is an IPv4 fragment of a UDP datagram (no TCP port is
negative).  Such a row's ``dst_port`` is the IP identification, ``seq`` the fragment's byte
offset in the datagram, ``tcp_flags`` 1 when more fragments follow (0 on the last), and
``payload`` the fragment's IP payload.  So the stage-2 shuffle by :data:`FLOW_KEY` gathers a
datagram's fragments (same addresses, same identification) as it gathers a TCP flow."""

CATEGORICAL_COLUMNS = frozenset({"file", "protocol", "src_ip", "dst_ip", "classified_by",
                                 "packet_type", "message_type", "label"})
"""String columns of ``packets``, ``messages`` and ``advertisements`` with few distinct values
(file names, protocols, addresses, kinds).  The decoder makes them as dictionary arrays
(:data:`DICTIONARY_STRING`): a code per row and each distinct text once.  The public schemas
say ``string`` and the tables are cast to them on the way out; in the stored form
(:class:`DecodedTables`) they stay dictionaries, which is how
:func:`spark_analysis.decode.decode_to_parquet` stores them: the Parquet writer takes a
dictionary column's codes as they are, where it hashes every value of a plain string column
(measured: 7 against 13-20 ns a row and column), and the cast to plain strings (a copy of
every value) is not made at all."""

DICTIONARY_STRING = pa.dictionary(pa.int32(), pa.string())
"""The type of a categorical column in the stored form."""


def dictionary_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with its :data:`CATEGORICAL_COLUMNS` dictionary-typed (names, docs and
    nullability kept): a table's schema in the stored form."""
    return pa.schema([f.with_type(DICTIONARY_STRING)
                      if f.name in CATEGORICAL_COLUMNS and pa.types.is_string(f.type) else f
                      for f in schema], metadata=schema.metadata)


STORED_SCHEMAS: dict[str, pa.Schema] = {
    "packets": dictionary_schema(PACKETS_SCHEMA),
    "messages": dictionary_schema(MESSAGE_CORE_SCHEMA),
    "advertisements": dictionary_schema(ADVERTISEMENTS_SCHEMA),
    "tcp_segments": dictionary_schema(TCP_SEGMENTS_SCHEMA),
    **{name: dictionary_schema(s) for name, s in HEADER_TABLE_SCHEMAS.items()},
}
"""Every table's schema in the stored form (:class:`DecodedTables`): ``messages`` holds its
core columns and each typed header has a table of its own (:data:`HEADER_TABLE_SCHEMAS`)."""

IDENTITY_COLUMNS = tuple(f.name for f in _IDENTITY)
"""The frame columns every UM table starts with: the frame (file and record offset), its time
and its addresses."""

ALWAYS_SET: dict[str, frozenset[str]] = {
    "packets": frozenset({*IDENTITY_COLUMNS, "src_ip_int", "dst_ip_int", "classified_by",
                          "payload_length", "messages"}),
    "messages": frozenset({*IDENTITY_COLUMNS, "msg_index", "type", "msglen", "header_codes"}),
    "advertisements": frozenset(IDENTITY_COLUMNS),
    **{name: frozenset(schema.names) for name, schema in HEADER_TABLE_SCHEMAS.items()},
}
"""Per table, the columns the decoder fills on every row: never null, even for a malformed
message (whose ``label``, ``payload_length`` and ``message_type`` may be null).  The schemas
above still call them nullable, so that every table of the module has one schema whatever its
source; :func:`spark_analysis.decode.decode_to_parquet` stores them as required Parquet
columns, which spares the writer a definition level per value (see there)."""

PACKETS_STORED = STORED_SCHEMAS["packets"]
MESSAGE_CORE_STORED = STORED_SCHEMAS["messages"]
ADVERTISEMENTS_STORED = STORED_SCHEMAS["advertisements"]
TCP_SEGMENTS_STORED = STORED_SCHEMAS["tcp_segments"]
HEADER_TABLES_STORED = {name: STORED_SCHEMAS[name] for name in HEADER_TABLE_SCHEMAS}
MESSAGES_STORED_WIDE = dictionary_schema(MESSAGES_SCHEMA)  # the wide table, before the public cast

FLOW_KEY = ("src_ip_int", "src_port", "dst_ip_int", "dst_port")
"""The columns naming one direction of a TCP connection (the stage-2 grouping key)."""


def flow_key_columns(options: DecodeOptions) -> tuple[str, ...]:
    """The stage-2 grouping key under ``options``: :data:`FLOW_KEY`, led by ``file`` when
    each file is a capture of its own (:attr:`DecodeOptions.separate_files`)."""
    return ("file", *FLOW_KEY) if options.separate_files else FLOW_KEY

# =============================================================================================
# Stage 1: a batch of frames
# =============================================================================================


@dataclass
class DecodedTables:
    """The decoded tables of some frames (see the ``*_SCHEMA`` constants).

    ``tcp_segments`` holds the TCP segments of candidate LBT-TCP connections still to be
    reassembled by :func:`reassemble_tcp` (empty once that stage has run).

    In the *stored* form (``stored=True`` of :func:`decode_chunk`, :func:`decode_batch` and
    :func:`reassemble_tcp`: how :func:`spark_analysis.decode.decode_to_parquet` writes them)
    the :data:`CATEGORICAL_COLUMNS` are dictionary arrays, ``messages`` holds the core
    columns only (:data:`MESSAGE_CORE_SCHEMA`) and ``headers`` the typed header tables
    (:data:`HEADER_TABLE_SCHEMAS`, those with rows): what :func:`split_messages` makes of
    the wide table, built directly.  :meth:`public` turns it into the public form.
    """

    packets: pa.Table
    messages: pa.Table
    advertisements: pa.Table
    skipped: pa.Table
    tcp_segments: pa.Table
    headers: dict[str, pa.Table] = field(default_factory=dict)

    @classmethod
    def empty(cls, stored: bool = False) -> DecodedTables:
        packets, messages, adverts = ((PACKETS_STORED, MESSAGE_CORE_STORED, ADVERTISEMENTS_STORED)
                                      if stored else
                                      (PACKETS_SCHEMA, MESSAGES_SCHEMA, ADVERTISEMENTS_SCHEMA))
        segments = TCP_SEGMENTS_STORED if stored else TCP_SEGMENTS_SCHEMA
        return cls(empty_table(packets), empty_table(messages), empty_table(adverts),
                   empty_table(SKIPPED_SCHEMA), empty_table(segments))

    @property
    def stored(self) -> bool:
        """Whether these tables are in the stored form."""
        return "header_codes" in self.messages.column_names and not any(
            h.name in self.messages.column_names for h in MESSAGE_HEADER_COLUMNS)

    def public(self) -> DecodedTables:
        """These tables in the public form: :data:`CATEGORICAL_COLUMNS` as plain strings and
        the header tables joined into ``messages`` (:func:`join_headers`)."""
        messages = (join_headers(self.messages, self.headers) if self.stored
                    else _cast(self.messages, MESSAGES_SCHEMA))
        return DecodedTables(_cast(self.packets, PACKETS_SCHEMA), messages,
                             _cast(self.advertisements, ADVERTISEMENTS_SCHEMA),
                             self.skipped, _cast(self.tcp_segments, TCP_SEGMENTS_SCHEMA))


def _cast(table: pa.Table, schema: pa.Schema) -> pa.Table:
    return table if table.schema == schema else table.cast(schema)


def concat_or_empty(tables: Sequence[pa.Table], schema: pa.Schema) -> pa.Table:
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return empty_table(schema)
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def merge_skipped(tables: Sequence[pa.Table]) -> pa.Table:
    """One ``skipped`` table (:data:`SKIPPED_SCHEMA`) from several: frames summed and the
    first offset kept per file and reason."""
    table = concat_or_empty(tables, SKIPPED_SCHEMA)
    if not table.num_rows:
        return table
    # a handful of rows: merged in Python (Table.group_by would import pandas, see
    # arrow_array), in the order each file and reason first appears
    merged: dict[tuple[str, str], dict[str, Any]] = {}
    for row in table.to_pylist():
        found = merged.setdefault((row["file"], row["reason"]), {**row, "frames": 0})
        found["frames"] += row["frames"] or 0
        offsets = [o for o in (found["first_file_offset"], row["first_file_offset"])
                   if o is not None]
        found["first_file_offset"] = min(offsets, default=None)
    return python_table(list(merged.values()), SKIPPED_SCHEMA)


def concat_tables(parts: Sequence[DecodedTables]) -> DecodedTables:
    """One :class:`DecodedTables` from several (skipped counts merged per file and reason);
    the parts must all be in the public form or all in the stored form."""
    like = parts[0] if parts else DecodedTables.empty()
    return DecodedTables(
        concat_or_empty([p.packets for p in parts], like.packets.schema),
        concat_or_empty([p.messages for p in parts], like.messages.schema),
        concat_or_empty([p.advertisements for p in parts], like.advertisements.schema),
        merge_skipped([p.skipped for p in parts]),
        concat_or_empty([p.tcp_segments for p in parts], like.tcp_segments.schema),
        concat_headers([p.headers for p in parts]),
    )


def concat_headers(parts: Sequence[Mapping[str, pa.Table]]) -> dict[str, pa.Table]:
    names = sorted({name for part in parts for name in part})
    return {name: concat_or_empty([p[name] for p in parts if name in p], HEADER_TABLES_STORED[name])
            for name in names}
