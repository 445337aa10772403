"""Columnar decode of captured frames into UM tables (numpy + pyarrow, no Spark).

Spark hands Python a batch of captured frames as an Arrow ``RecordBatch`` (see
:data:`FRAME_SCHEMA`).  Decoding it frame by frame with the object decoders of :mod:`wire`
costs tens of microseconds per packet; the analysis pipeline needs about one.  This module
therefore decodes whole batches at once:

* the ``data`` column's values buffer is read as one numpy byte array, and every fixed header
  (link, IPv4, UDP/TCP, LBT-RM, LBT-RU, the LBMC base and extended headers) is read for all
  rows that have it with *one* gather: a strided view (:class:`ByteView`) whose element ``i``
  is the ``size``-byte record starting at byte ``i``, indexed by the rows' header positions
  and then viewed with the layout's structured dtype (about ten times faster than one
  unaligned gather per member);
* those dtypes are :meth:`wire.fastpath.FastLayout.dtype` of the layouts :mod:`wire` derives
  from its Construct structs (``pcap.IP4``, ``lbtrm.LbtrmData.fast``, ``lbmc.HeaderKind.fast``
  ...).  No offset or size is written here;
* variable structure (LBT-RU option chains, LBMC messages in a datagram, LBMC header chains)
  is walked *breadth first*: iteration ``k`` reads the ``k``-th element of every row that still
  has one, so Python loops over the chain depth, not over packets (the last few rows of a
  very deep walk finish in a scalar loop);
* LBMR (topic resolution: a few packets per second per topic) is decoded packet by packet with
  :func:`wire.lbmr.parse_packet`;
* :func:`decode_chunk` takes the records of a capture reader chunk
  (:meth:`spark_analysis.splits.SplitReader.chunks`) where they lie in the read buffer, so the
  fast path never copies the capture into an Arrow ``data`` column;
* stage 1 counts TCP segments without payload and without SYN (pure ACKs) as skipped at once
  (stage 2 would only count them too) and hands the other candidate segments on grouped by
  connection direction, so each flow's payloads lie back to back;
* LBT-TCP byte streams are reassembled per connection direction in :func:`reassemble_tcp`.
  A stretch of in-order segments without holes or overlaps is framed in one pass over the
  payload buffer: breadth first over the segments when each holds whole messages (the usual
  case), else one short Python loop step per message, since each ``msglen`` says where the
  next message starts; anything else is replayed segment by segment with the Dissector's
  rules.  The framed messages go through the same vectorised LBMC decoder.

Every table is built column-wise; the Arrow types are Spark's (no unsigned integers), as
narrow as exact, because Spark ships every field of every row, null struct fields included.

Classification follows :mod:`wire.dissect` (tshark's port preferences, :class:`PortMap`) and
adds *content heuristics* (on by default, :attr:`DecodeOptions.content_heuristics`) so UM on
non-default UDP ports still decodes.  A UDP datagram that no port rule claims is tried, in this
order, as:

1. LBT-RM: tshark's content test (:func:`wire.lbtrm.heuristic_content_test`: version 0, type
   DATA/SM/NAK/NCF, no options) *and* a clean decode with nothing left over: SM exactly its
   layout, NAK/NCF exactly their lists with at least one entry, DATA at least one LBMC message
   filling the datagram exactly;
2. LBT-RU: version 0, a defined type, only SID/CID options, a clean decode with nothing left
   over (DATA: at least one LBMC message, NAK/NCF: at least one entry);
3. LBMR: version 0, type NORMAL/WC-TQR (with at least one record), topic management, UMQ or
   extended (a known extended type), a clean :func:`wire.lbmr.parse_packet` with no trailer.
   Keepalive-like 4-byte packets (types 2, 3, empty NORMAL) are too weak a signal to claim.

A datagram claimed only by content that then fails to decode is counted as skipped (not UM),
never as a malformed UM packet: a content guess that does not decode was a wrong guess.
LBT-TCP is recognised by port only (tshark has no store-port default either).

Nothing is dropped silently.  Every frame ends up in exactly one place: a ``packets`` row (UM
packet, possibly with a ``malformed_reason``), or a count in ``skipped`` with the reason (not
IPv4, non-first IPv4 fragment, no UM port rule, TCP without payload ...).

Differences from :class:`wire.dissect.Dissector` (which decodes frame by frame in capture
order), all deliberate:

* a UDP packet whose *n*-th LBMC message is bad still yields messages 1..n-1 (the packet row
  carries the reason), where the Dissector reports the whole frame as malformed;
* an IPv4 *first* fragment of a UDP datagram is decoded as far as it goes and flagged; the
  Dissector refuses every fragment.  Non-first fragments are skipped and counted;
* LBT-TCP segments are reassembled in sequence-number order per connection direction (the
  Dissector uses capture order), so reordered segments reassemble instead of being reported as
  a gap plus a retransmission.  A message is reported with the frame that made it deliverable:
  the latest-captured frame of the stream up to the message's last byte (the completing frame
  when the capture is in order, exactly as tshark reports it).
"""

from __future__ import annotations

import functools
import ipaddress
import itertools
import struct
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import construct as cs
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wire import lbmc, lbmr, lbtrm, lbtru, pcap
from wire.errors import WireError
from wire.fastpath import FastLayout, derive
from wire.fields import (
    TEXT_ENCODING,
    Bit,
    bit_views,
    fixed_format,
    members,
    qualify,
    tshark_name,
    value_kind,
)
from wire.fields import ipv4_to_int as _ipv4_int
from wire.lbttcp import entry_test
from wire.records import view_index
from wire.transport import CountOf, RestOf, TransportCodec
from wire.tshark import PortMap

from .splits import CAPTURE_SCHEMA, RecordChunk

__all__ = [
    "ADVERTISEMENTS_SCHEMA",
    "CATEGORICAL_COLUMNS",
    "DICTIONARY_STRING",
    "FRAME_SCHEMA",
    "HEADER_TABLE_SCHEMAS",
    "MESSAGES_SCHEMA",
    "MESSAGE_CORE_SCHEMA",
    "MESSAGE_HEADER_COLUMNS",
    "MESSAGE_KEY",
    "PACKETS_SCHEMA",
    "SKIPPED_SCHEMA",
    "STORED_SCHEMAS",
    "TCP_SEGMENTS_SCHEMA",
    "ByteView",
    "DecodeOptions",
    "DecodedTables",
    "concat_tables",
    "decode_batch",
    "decode_batches",
    "decode_chunk",
    "dictionary_schema",
    "encode_files",
    "flow_key_columns",
    "frames_batch",
    "frames_batch_from_capture",
    "join_headers",
    "member_at",
    "merge_skipped",
    "null_array",
    "reassemble_tcp",
    "split_messages",
]

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


def _struct_type(parts: Sequence[ColumnPart]) -> pa.StructType:
    return _struct_type_of(tuple(parts))


@functools.cache
def _struct_type_of(parts: tuple[ColumnPart, ...]) -> pa.StructType:
    return pa.struct([pa.field(p.name, p.type,
                               metadata={"tshark": p.tshark} if p.tshark else None)
                      for p in parts])


def _struct_pyvalue(parts: Sequence[ColumnPart], values: Mapping[str, Any]) -> dict[str, Any]:
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
        return _struct_type(self.parts)

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
        st = _struct_type(self.parts)
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
])
"""One row per UM packet: a UDP datagram of LBT-RM, LBT-RU or LBMR, or a TCP segment with
payload on an LBT-TCP connection.  Columns that do not apply to a packet type are null."""

_LBMC_TYPE_NAMES = {
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
        schemas = _HEADER_TABLES_D if dictionaries else HEADER_TABLE_SCHEMAS
        headers[name] = rows.cast(schemas[name])
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
"""TCP segments of candidate LBT-TCP connections: the input of :func:`reassemble_tcp` (the
stateful second stage, grouped by connection direction).  Addresses travel as numbers only:
stage 2 formats the dotted form of the few distinct ones itself."""

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

_PACKETS_D = STORED_SCHEMAS["packets"]
_MESSAGE_CORE_D = STORED_SCHEMAS["messages"]
_ADVERTISEMENTS_D = STORED_SCHEMAS["advertisements"]
_TCP_SEGMENTS_D = STORED_SCHEMAS["tcp_segments"]
_HEADER_TABLES_D = {name: STORED_SCHEMAS[name] for name in HEADER_TABLE_SCHEMAS}
_MESSAGES_D = dictionary_schema(MESSAGES_SCHEMA)  # the wide table, before the public cast

FLOW_KEY = ("src_ip_int", "src_port", "dst_ip_int", "dst_port")
"""The columns naming one direction of a TCP connection (the stage-2 grouping key)."""


def flow_key_columns(options: DecodeOptions) -> tuple[str, ...]:
    """The stage-2 grouping key under ``options``: :data:`FLOW_KEY`, led by ``file`` when
    each file is a capture of its own (:attr:`DecodeOptions.separate_files`)."""
    return ("file", *FLOW_KEY) if options.separate_files else FLOW_KEY

# =============================================================================================
# Reading bytes column-wise
# =============================================================================================


class ByteView:
    """A byte buffer with unaligned, strided numpy views for gathering header members.

    ``read(dtype, pos)`` returns the value of ``dtype`` starting at each byte offset in
    ``pos`` with one fancy-index: the view for ``>u4`` has stride 1, so its element ``i`` is
    the big-endian u32 at byte ``i``.  Callers check bounds first (a position whose value runs
    past the buffer is an IndexError, never a silent read of something else).
    """

    def __init__(self, data: np.ndarray) -> None:
        self.data = data
        self._views: dict[np.dtype, np.ndarray] = {}

    def view(self, dtype: np.dtype) -> np.ndarray:
        found = self._views.get(dtype)
        if found is None:
            count = max(0, self.data.size - dtype.itemsize + 1)
            found = np.ndarray((count,), dtype=dtype, buffer=self.data if count else None,
                               offset=0, strides=(1,))
            self._views[dtype] = found
        return found

    def read(self, dtype: np.dtype, pos: np.ndarray) -> np.ndarray:
        return self.view(dtype)[pos]

    def u8(self, pos: np.ndarray) -> np.ndarray:
        return self.data[pos].astype(np.int64)


_DTYPES: dict[int, tuple[FastLayout, np.dtype]] = {}


def _layout_dtype(layout: FastLayout) -> np.dtype:
    cached = _DTYPES.get(id(layout))
    if cached is None or cached[0] is not layout:
        cached = (layout, layout.dtype())
        _DTYPES[id(layout)] = cached
    return cached[1]


def member_at(layout: FastLayout, member: str) -> tuple[np.dtype, int]:
    """(dtype, offset) of a member of a derived layout."""
    fields = _layout_dtype(layout).fields
    assert fields is not None
    found = fields[member]
    return found[0], int(found[1])


def _as_int(values: np.ndarray) -> np.ndarray:
    """Native integers: int64, except u64 members which stay uint64."""
    if values.dtype.kind == "u" and values.dtype.itemsize == 8:
        return values.astype(np.uint64)
    if values.dtype.kind in "ui":
        return values.astype(np.int64)
    return values


def _records(bv: ByteView, layout: FastLayout, pos: np.ndarray) -> np.ndarray:
    """The records of ``layout`` at ``pos``: one gather of ``size``-byte items, viewed with the
    layout's structured dtype (reading whole records and then their members is many times
    faster than one unaligned gather per member)."""
    dt = _layout_dtype(layout)
    return bv.read(np.dtype(f"V{dt.itemsize}"), pos).view(dt)


def read_member(bv: ByteView, layout: FastLayout, member: str, pos: np.ndarray,
                ) -> np.ndarray:
    """The member ``member`` of ``layout`` for the record starting at each of ``pos``."""
    return _as_int(_records(bv, layout, pos)[member])


def read_members(bv: ByteView, layout: FastLayout, pos: np.ndarray,
                 names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    records = _records(bv, layout, pos)
    return {name: _as_int(records[name])
            for name in ((records.dtype.names or ()) if names is None else names)}


def _views_of(values: dict[str, np.ndarray], views: Mapping[str, tuple[str, Bit]]) -> None:
    """Add every bit view whose member was read (``(raw & mask) >> shift``)."""
    for view, (member, bit) in views.items():
        raw = values.get(member)
        if raw is not None and view not in values:
            values[view] = (raw & bit.mask) >> bit.shift


@dataclass
class _Binary:
    """The values buffer and the per-row [start, start+length) of an Arrow binary column."""

    bv: ByteView
    starts: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, column: pa.Array | pa.ChunkedArray) -> _Binary:
        if isinstance(column, pa.ChunkedArray):
            column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        if pa.types.is_large_binary(column.type) or pa.types.is_large_string(column.type):
            odt: type[np.generic] = np.int64
        elif pa.types.is_binary(column.type) or pa.types.is_string(column.type):
            odt = np.int32
        else:
            raise TypeError(f"expected a binary column, got {column.type}")
        n = len(column)
        buffers = column.buffers()
        if n == 0 or buffers[1] is None:
            empty = np.zeros(0, np.int64)
            return cls(ByteView(np.zeros(0, np.uint8)), empty, empty.copy())
        offsets = np.frombuffer(buffers[1], dtype=odt)[column.offset:column.offset + n + 1]
        offsets = offsets.astype(np.int64)
        data = (np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None
                else np.zeros(0, np.uint8))
        starts = offsets[:-1].copy()
        lengths = offsets[1:] - offsets[:-1]
        if column.null_count:
            lengths[~np.asarray(column.is_valid())] = 0
        return cls(ByteView(data), starts, lengths)


def _running_offsets(counts: np.ndarray, dtype: type[np.integer] = np.int64) -> np.ndarray:
    """``[0, c0, c0 + c1, ...]``: where each of ``len(counts)`` runs of ``counts`` items
    starts, and the total at the end (the offsets of an Arrow list or string column, of a
    gathered byte buffer)."""
    offsets = np.zeros(len(counts) + 1, dtype)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def _gather_ranges(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                   ) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate ``data[s:s+l]`` for every range: (bytes, int32 offsets), vectorised.

    Ranges of similar length (topic names, most payloads) are read as one fixed-width row
    each through a strided view and compacted with a mask; very uneven ones build a byte
    index instead (its memory is proportional to the bytes, not to rows x longest)."""
    lengths = lengths.astype(np.int64)
    # binary views pay 16 bytes of view per row: for mostly empty ranges (the topic names of
    # every message, few present) the byte-index gather below is cheaper
    total = int(lengths.sum())
    if 0 < data.size < _VIEW_LIMIT and total < _VIEW_LIMIT and total > 8 * len(lengths):
        return _gather_by_views(data, starts.astype(np.int64), lengths)
    offsets = _running_offsets(lengths)
    total = int(offsets[-1])
    if total == 0:
        return np.zeros(0, np.uint8), offsets.astype(np.int32)
    widest = int(lengths.max())
    if widest * len(lengths) <= 4 * total and data.size >= widest:
        starts = starts.astype(np.int64)
        window = np.minimum(starts, data.size - widest)  # a window may not run off the end
        shift = (starts - window)[:, None]
        rows = ByteView(data).read(np.dtype(f"V{widest}"), window)
        matrix = rows.view(np.uint8).reshape(len(lengths), widest)
        column = np.arange(widest)
        keep = (column >= shift) & (column < shift + lengths[:, None])
        return matrix[keep], offsets.astype(np.int32)
    index = np.arange(total, dtype=np.int64)
    index += np.repeat(starts.astype(np.int64) - offsets[:-1], lengths)
    return data[index], offsets.astype(np.int32)


_VIEW_LIMIT = 1 << 31
_VIEW_INLINE = 12
_PREFIX = np.dtype("<i4")
"""Arrow's binary-view layout: 16 bytes per value; values up to 12 bytes inline, longer ones
as (length, 4-byte prefix, buffer index, int32 offset)."""


def _gather_by_views(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_gather_ranges` by Arrow: the ranges become a ``binary_view`` array over
    ``data`` (a few numpy operations per row, no byte touched but prefixes) and Arrow's cast
    to ``binary`` copies them, one ``memcpy`` each: about 13 times faster than the masked
    numpy gather on TCP payloads."""
    data = np.ascontiguousarray(data)
    n = len(lengths)
    views = np.zeros((n, 4), np.int32)
    views[:, 0] = lengths
    far = lengths > _VIEW_INLINE
    if far.all():  # the usual case (payloads): no row selection at all
        views[:, 1] = ByteView(data).read(_PREFIX, starts)
        views[:, 3] = starts
        return _cast_views(views, data, n)
    rows = np.flatnonzero(far)
    views[rows, 1] = ByteView(data).read(_PREFIX, starts[rows])
    views[rows, 3] = starts[rows]
    inline = np.flatnonzero(~far & (lengths > 0))  # empty values are all-zero views already
    if inline.size:
        column = np.arange(_VIEW_INLINE)
        at = np.minimum(starts[inline, None] + column, data.size - 1)
        short = np.where(column < lengths[inline, None], data[at], 0).astype(np.uint8)
        views[inline, 1:] = short.view("<i4")
    return _cast_views(views, data, n)


def _cast_views(views: np.ndarray, data: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The values and offsets of the ``binary_view`` array ``views`` over ``data``."""
    array = pa.Array.from_buffers(pa.binary_view(), n, [None, pa.py_buffer(views),
                                                        pa.py_buffer(data)])
    packed = array.cast(pa.binary())
    offsets = np.frombuffer(packed.buffers()[1], np.int32, count=n + 1)
    values_buffer = packed.buffers()[2]
    values = (np.frombuffer(values_buffer, np.uint8, count=int(offsets[-1]))
              if values_buffer is not None else np.zeros(0, np.uint8))
    return values, offsets


def _binary_array(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    values, offsets = _gather_ranges(data, starts, lengths)
    return pa.Array.from_buffers(pa.binary(), len(lengths),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(values)])


def _text_array(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                cut_at_nul: bool = True) -> pa.Array:
    """Text members (topic names) as strings, cut at the first NUL like tshark displays them.

    The bytes are UTF-8, as :func:`wire.fields.bytes_text` reads them; a name that is not valid
    UTF-8 (which ``wire`` keeps byte for byte with surrogate escapes, something an Arrow string
    cannot hold) shows each bad byte as U+FFFD.  Valid UTF-8 (the norm) stays vectorised."""
    values, offsets = _gather_ranges(data, starts, lengths)
    n = len(lengths)
    if cut_at_nul and values.size:
        nul = np.flatnonzero(values == 0)
        if nul.size:
            row = np.searchsorted(offsets, nul, side="right") - 1
            first = np.full(n, np.iinfo(np.int64).max)
            np.minimum.at(first, row, nul)
            cut = first != np.iinfo(np.int64).max
            new_len = np.diff(offsets).astype(np.int64)
            new_len[cut] = first[cut] - offsets[:-1][cut]
            return _text_array(values, offsets[:-1].astype(np.int64), new_len, False)
    array = pa.Array.from_buffers(pa.string(), n,
                                  [None, pa.py_buffer(offsets), pa.py_buffer(values)])
    if values.size == 0 or int(values.max()) < 0x80:
        return array
    try:
        array.validate(full=True)  # every row valid UTF-8
        return array
    except pa.ArrowInvalid:
        raw = values.tobytes()
        return arrow_array([raw[offsets[i]:offsets[i + 1]].decode(TEXT_ENCODING, "replace")
                            for i in range(n)], pa.string())


def encode_files(column: pa.ChunkedArray | pa.Array) -> pa.DictionaryArray:
    """A ``file`` column (plain or dictionary-typed, any chunking) as one dictionary array
    whose dictionary holds each name once: the chunks' dictionaries are unified first (the
    stored form gives each hand-over stream its own)."""
    if isinstance(column, pa.ChunkedArray):
        if pa.types.is_dictionary(column.type) and column.num_chunks > 1:
            column = pa.table({"f": column}).unify_dictionaries().column("f")
        column = column.combine_chunks()
    return pc.dictionary_encode(column)


def _dictionary_strings(codes: np.ndarray, names: Sequence[str | None],
                        valid: np.ndarray | None = None) -> pa.DictionaryArray:
    """A dictionary-typed string column (:data:`DICTIONARY_STRING`) from small integer codes
    (enum-like columns: protocol, types), null where ``valid`` is false.  :func:`_table`
    casts it to plain strings where the schema says so."""
    names = list(names)
    if None in names:  # a code without a name is a null (a dictionary holds no nulls)
        codes = np.where(valid, codes, 0) if valid is not None else codes
        named = np.array([n is not None for n in names])[codes]
        valid = named if valid is None else valid & named
        names = [n if n is not None else "" for n in names]
    indices = _masked(np.where(valid, codes, 0) if valid is not None else codes, valid,
                      pa.int32())
    return pa.DictionaryArray.from_arrays(indices, arrow_array(names, pa.string()))


def _ipv4_strings(values: np.ndarray) -> pa.DictionaryArray:
    """Dotted IPv4 strings for u32 values, dictionary-typed: hashed to the few distinct
    addresses first, each formatted once."""
    encoded = pc.dictionary_encode(arrow_array(values.astype(np.int64)))
    distinct = numpy_of(encoded.dictionary)
    text = [str(ipaddress.IPv4Address(int(v))) for v in distinct]
    return pa.DictionaryArray.from_arrays(encoded.indices, arrow_array(text, pa.string()))


_ARROW_OF_NUMPY: dict[np.dtype, pa.DataType] = {
    np.dtype(t): pa.from_numpy_dtype(np.dtype(t))
    for t in ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
              "float32", "float64")}


def arrow_array(values: Any, type: pa.DataType | None = None,
                mask: np.ndarray | None = None) -> pa.Array:
    """``pa.array(values, type, mask=mask)`` for 1-d numpy arrays of booleans and numbers, and
    for lists of strings or numbers (``type`` given), built from buffers; anything else goes
    to ``pa.array``.

    Why: the first ``pa.array`` call in a process imports pandas (pyarrow checks every input
    for pandas objects), 0.28 CPU-s in each new Spark worker, and it falls on the critical
    path of a job's first tasks.  The decode calls this instead, so its workers never import
    pandas.  Numbers are converted with numpy's ``astype``: callers give values that fit
    ``type``, where ``pa.array`` would raise on an overflow.  A null where ``mask`` is true.
    """
    if isinstance(values, list) and type is not None:
        if not values and mask is None:
            return pa.nulls(0, type)
        if pa.types.is_string(type):
            return _string_array(values, mask)
        if ((pa.types.is_integer(type) or pa.types.is_floating(type))
                and all(isinstance(v, int | float) for v in values)):
            values = np.array(values, _numpy_dtype(type))
    if (not isinstance(values, np.ndarray) or values.ndim != 1
            or isinstance(values, np.ma.MaskedArray)):
        return pa.array(values, type, mask=mask)
    arrow_type = type if type is not None else _ARROW_OF_NUMPY.get(values.dtype)
    if arrow_type is None or not (pa.types.is_integer(arrow_type)
                                  or pa.types.is_floating(arrow_type)
                                  or pa.types.is_boolean(arrow_type)):
        return pa.array(values, type, mask=mask)
    data = np.ascontiguousarray(values.astype(_numpy_dtype(arrow_type), copy=False))
    if pa.types.is_boolean(arrow_type):
        data = np.packbits(data, bitorder="little")
    validity, nulls = _validity(None if mask is None else ~np.asarray(mask, bool), len(values))
    return pa.Array.from_buffers(arrow_type, len(values), [validity, pa.py_buffer(data)],
                                 null_count=nulls)


def numpy_of(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``values.to_numpy()`` read straight from the buffer for numbers and booleans without
    nulls (numbers read only, like ``to_numpy``'s zero-copy result); anything else goes to
    ``to_numpy``.  Why not ``to_numpy`` itself: it imports pandas too (see
    :func:`arrow_array`)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    kind, rows = values.type, len(values)
    numeric = pa.types.is_integer(kind) or pa.types.is_floating(kind)
    if values.null_count or not (numeric or pa.types.is_boolean(kind)):
        return values.to_numpy(zero_copy_only=False)
    dtype = _numpy_dtype(kind)
    data = values.buffers()[1]
    if data is None or not rows:
        return np.zeros(0, dtype)
    if numeric:
        return np.frombuffer(data, dtype, count=rows, offset=values.offset * dtype.itemsize)
    bits = np.unpackbits(np.frombuffer(data, np.uint8), count=values.offset + rows,
                         bitorder="little")
    return bits[values.offset:].astype(bool)


def empty_table(schema: pa.Schema) -> pa.Table:
    """``schema.empty_table()`` without the pandas import (see :func:`arrow_array`)."""
    return pa.Table.from_batches([], schema=schema)


def python_table(rows: Sequence[Mapping[str, Any]], schema: pa.Schema) -> pa.Table:
    """``pa.Table.from_pylist(rows, schema)`` built column by column from Python values
    (:func:`_python_array`), without the pandas import (see :func:`arrow_array`)."""
    return pa.Table.from_arrays([_python_array([r.get(f.name) for r in rows], f.type)
                                 for f in schema], schema=schema)


def _python_array(values: Sequence[Any], kind: pa.DataType) -> pa.Array:
    """An array of Python values (None: null) of a string, number, boolean, struct or list
    type, built from its children; other types go to ``pa.array``."""
    missing = np.fromiter((v is None for v in values), bool, len(values))
    nulls = missing if missing.any() else None
    if pa.types.is_string(kind):
        return _string_array(list(values))
    if pa.types.is_integer(kind) or pa.types.is_floating(kind) or pa.types.is_boolean(kind):
        data = np.array([0 if v is None else v for v in values], _numpy_dtype(kind))
        return arrow_array(data, kind, mask=nulls)
    if pa.types.is_struct(kind):
        children = [_python_array([None if v is None else v.get(f.name) for v in values], f.type)
                    for f in kind]
        return pa.StructArray.from_arrays(
            children, fields=list(kind), mask=None if nulls is None else arrow_array(nulls))
    if pa.types.is_list(kind):
        counts = np.array([0 if v is None else len(v) for v in values], np.int64)
        flat = [item for v in values if v is not None for item in v]
        return pa.ListArray.from_arrays(
            _list_offsets(counts), _python_array(flat, kind.value_type), type=kind,
            mask=None if nulls is None else arrow_array(nulls))
    return pa.array(values, kind)


def _validity(valid: np.ndarray | None, rows: int) -> tuple[pa.Buffer | None, int]:
    """The validity bitmap of ``rows`` values, null where ``valid`` is false, packed with
    numpy (``pa.array(..., mask=...)`` is an order of magnitude slower), and the null count;
    no bitmap when nothing is null."""
    if valid is None:
        return None, 0
    if len(valid) != rows:
        raise ValueError("the mask and the values differ in length")
    nulls = rows - int(np.count_nonzero(valid))
    if not nulls:
        return None, 0
    return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls


def _string_array(values: list[str | None], mask: np.ndarray | None = None) -> pa.Array:
    """A string array of Python strings (None: null), from buffers."""
    encoded = [v.encode() if v is not None else b"" for v in values]
    offsets = _running_offsets(np.fromiter(map(len, encoded), np.int64, len(encoded)),
                               np.int32)
    missing = np.fromiter((v is None for v in values), bool, len(values))
    if mask is not None:
        missing |= np.asarray(mask, bool)
    validity, nulls = _validity(~missing, len(values))
    return pa.Array.from_buffers(pa.string(), len(values),
                                 [validity, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))],
                                 null_count=nulls)


@functools.cache
def _numpy_dtype(dtype: pa.DataType) -> np.dtype:
    """numpy's dtype for an Arrow integer, floating-point or boolean type (``to_pandas_dtype``
    would import pandas, half a second per Spark worker)."""
    if pa.types.is_boolean(dtype):
        return np.dtype("bool")
    return np.dtype({"float": "float32", "double": "float64", "halffloat": "float16"}.get(
        str(dtype), str(dtype)))


def _masked(values: np.ndarray, valid: np.ndarray | None, dtype: pa.DataType) -> pa.Array:
    """``values`` as ``dtype`` with nulls where ``valid`` is false."""
    arr = arrow_array(values, dtype)
    return arr if valid is None else _with_nulls(arr, valid)


def _with_nulls(arr: pa.Array, valid: np.ndarray) -> pa.Array:
    """``arr`` (no nulls, offset 0) with nulls where ``valid`` is false."""
    validity, nulls = _validity(valid, len(arr))
    if validity is None:
        return arr
    return pa.Array.from_buffers(arr.type, len(arr), [validity, *arr.buffers()[1:]],
                                 null_count=nulls)


_NULLS: dict[pa.DataType, pa.Array] = {}
_NULLS_MAX = 1 << 22


def null_array(dtype: pa.DataType, rows: int) -> pa.Array:
    """An all-null array: a zero-copy slice of a cached one.  Most header columns are absent
    from most messages, and building wide nested null arrays each time costs milliseconds
    (Arrow shares one zeroed buffer among all children, so the cache stays small)."""
    if rows > _NULLS_MAX:
        return pa.nulls(rows, dtype)
    cached = _NULLS.get(dtype)
    if cached is None or len(cached) < rows:
        cached = _NULLS[dtype] = pa.nulls(max(1024, 1 << (rows - 1).bit_length()), dtype)
    return cached.slice(0, rows)


def _sparse_strings(rows: int, texts: Mapping[int, str]) -> pa.Array:
    """A string column that is null except at a few rows (reasons of malformed packets)."""
    if not texts:
        return null_array(pa.string(), rows)
    distinct = sorted(set(texts.values()))
    index = {text: i for i, text in enumerate(distinct)}
    codes = np.zeros(rows, np.int64)
    valid = np.zeros(rows, bool)
    at = np.fromiter(texts.keys(), np.int64, len(texts))
    codes[at] = [index[text] for text in texts.values()]
    valid[at] = True
    return _dictionary_strings(codes, distinct, valid)


def _constant(text: str, rows: int) -> pa.DictionaryArray:
    """A dictionary-typed string column holding ``text`` in every row."""
    return pa.DictionaryArray.from_arrays(arrow_array(np.zeros(rows, np.int32)),
                                          arrow_array([text], pa.string()))


def _convert(part: ColumnPart, raw: np.ndarray) -> pa.Array:
    """A struct field's Arrow array from the raw values of its member (no nulls)."""
    if part.bit is not None:
        values = (raw & part.bit.mask) >> part.bit.shift
        when = part.bit.when
        if when is None:
            return _masked(values, None, part.type)
        distinct = np.unique(raw)
        allowed = distinct[np.array([bool(when(int(v))) for v in distinct], dtype=bool)]
        return _masked(values, np.isin(raw, allowed), part.type)
    if part.kind == "ipv4":  # a struct field: plain strings (struct types are fixed)
        return _ipv4_strings(raw).cast(pa.string())
    if part.kind == "bytes":
        width = raw.dtype.itemsize
        fixed = pa.Array.from_buffers(pa.binary(width), len(raw),
                                      [None, pa.py_buffer(np.ascontiguousarray(raw).tobytes())])
        return fixed.cast(pa.binary())
    if pa.types.is_decimal(part.type):
        return arrow_array(raw.astype(np.uint64)).cast(part.type)
    return _masked(raw, None, part.type)


def _struct_array(parts: Sequence[ColumnPart], raw: Mapping[str, np.ndarray],
                  count: int) -> pa.StructArray:
    if count == 0:
        return arrow_array([], _struct_type(parts))
    arrays = [_convert(p, raw[p.member]) for p in parts]
    return pa.StructArray.from_arrays(arrays, fields=list(_struct_type(parts)))


def _spread_struct(parts: Sequence[ColumnPart], raw: Mapping[str, np.ndarray],
                   owner: np.ndarray, rows: int) -> pa.Array:
    """A struct column of ``rows`` rows with the values ``raw`` at rows ``owner`` (unique) and
    nulls elsewhere: scattered with numpy before conversion (an Arrow ``take`` with null
    indices is many times slower)."""
    struct_type = _struct_type(parts)
    if not len(owner):
        return null_array(struct_type, rows)
    present = np.zeros(rows, bool)
    present[owner] = True
    # convert the k present values, then spread each field to all rows: a header present in
    # few messages costs O(k) conversions plus one zero-filled buffer per field, where
    # converting spread-out raw values cost O(rows) byte swaps and casts per field
    index: list[np.ndarray] = []
    arrays = [_spread_field(_convert(p, raw[p.member]), owner, rows, index) for p in parts]
    return pa.StructArray.from_arrays(arrays, fields=list(struct_type), mask=arrow_array(~present))


def _spread_field(values: pa.Array, owner: np.ndarray, rows: int,
                  index: list[np.ndarray]) -> pa.Array:
    """``values`` (one per ``owner`` row) placed at those rows of a ``rows``-long array.  What
    lies at the other rows is never seen (the struct is null there).  ``index`` caches the
    take index the variable-width fields share."""
    kind = values.type
    if (pa.types.is_integer(kind) or pa.types.is_boolean(kind)) and not values.null_count:
        compact = numpy_of(values)
        full = np.zeros(rows, compact.dtype)
        full[owner] = compact
        return arrow_array(full, kind)
    if not index:
        at = np.zeros(rows, np.int64)
        at[owner] = np.arange(len(owner))
        index.append(at)
    return values.take(arrow_array(index[0]))


# =============================================================================================
# Skipped frames
# =============================================================================================


class _Skips:
    """Frames that are not UM packets, by reason (aggregated per file at the end)."""

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, str]] = []

    def add(self, rows: np.ndarray, reason: str) -> None:
        if len(rows):
            self._parts.append((np.asarray(rows, np.int64), reason))

    def add_by_value(self, rows: np.ndarray, values: np.ndarray,
                     reason: Callable[[int], str]) -> None:
        """Rows whose reason depends on a small set of values (a link type, a protocol)."""
        if not len(rows):
            return
        for value in np.unique(values):
            self.add(rows[values == value], reason(int(value)))

    def table(self, files: pa.Array, offsets: np.ndarray) -> pa.Table:
        """Frames and first offset per (file, reason), sorted by both; ``files`` gives each
        frame row's file (a dictionary array: grouped by its codes, in numpy)."""
        if not self._parts:
            return empty_table(SKIPPED_SCHEMA)
        if not pa.types.is_dictionary(files.type):
            files = pc.dictionary_encode(files)
        reasons = sorted({reason for _, reason in self._parts})
        number = {reason: i for i, reason in enumerate(reasons)}
        rows = np.concatenate([r for r, _ in self._parts])
        reason = np.concatenate([np.full(len(r), number[text], np.int64)
                                 for r, text in self._parts])
        names = files.dictionary.to_pylist()
        file_rank = np.argsort(np.argsort(np.array(names, object), kind="stable"))
        code = numpy_of(files.indices).astype(np.int64)[rows]
        key = file_rank[code] * len(reasons) + reason
        order = np.lexsort((offsets[rows], key))
        key, first_offset = key[order], offsets[rows][order]
        starts = np.flatnonzero(np.diff(key, prepend=-1))
        counts = np.diff(np.append(starts, len(key)))
        by_rank = np.argsort(file_rank)
        return pa.table({
            "file": arrow_array([names[i] for i in by_rank[key[starts] // len(reasons)]],
                             pa.string()),
            "reason": arrow_array([reasons[i] for i in key[starts] % len(reasons)], pa.string()),
            "frames": arrow_array(counts, pa.int64()),
            "first_file_offset": arrow_array(first_offset[starts], pa.int64()),
        }, schema=SKIPPED_SCHEMA)


# =============================================================================================
# Link, IPv4, UDP/TCP
# =============================================================================================

_PROTO_UDP, _PROTO_TCP = 17, 6
_NULL_FAMILY_INET = 2
_IPV4_ETHERTYPE = 0x0800
_VLAN_ETHERTYPES = (0x8100, 0x88A8)
_RAW_LINKTYPES = (pcap.LINKTYPE_RAW, pcap.LINKTYPE_IPV4, 12)
_FRAG_OFFSET, _MORE_FRAGMENTS = 0x1FFF, 0x2000
_TCP_FLAG_BITS = 0x3F  # FIN, SYN, RST, PSH, ACK, URG
_U32 = np.dtype(">u4")
_U32LE = np.dtype("<u4")

_NETWORK_SKIPS: dict[str, str | Callable[[int], str]] = {
    "link": lambda v: f"unsupported or truncated link layer (link type {v})",
    "not_ipv4": lambda v: f"not IPv4 (ethertype 0x{v:04x})" if v else "not IPv4",
    "ipv4_truncated": "truncated IPv4 header",
    "not_ipv4_header": "not an IPv4 header",
    "later_fragment": "IPv4 non-first fragment (reassembly not supported)",
    "udp_truncated": "truncated UDP header",
    "tcp_truncated": "truncated TCP header",
    "not_udp_tcp": lambda v: f"IP protocol {v} is neither UDP nor TCP",
    "tcp_data_offset": "TCP data offset does not fit the segment",
    "tcp_fragment": "IPv4 fragment of a TCP segment (reassembly not supported)",
}
"""Why :func:`_decode_network` skips a frame, by the names both of its versions use (the
reasons of :func:`wire.pcap.decode_frame`); a function of the link type, ethertype or IP
protocol where the reason names one."""


def _skip_network(skips: _Skips, reason: str, rows: np.ndarray,
                  values: np.ndarray | None = None) -> None:
    text = _NETWORK_SKIPS[reason]
    if callable(text):
        assert values is not None
        skips.add_by_value(rows, values, text)
    else:
        skips.add(rows, text)


def _be_member(layout: FastLayout, member: str, width: int) -> int:
    """The offset of ``member``, which the compiled header decode reads as an unsigned
    big-endian integer of ``width`` bytes (TypeError if the wire/ layout disagrees)."""
    dtype, offset = member_at(layout, member)
    if dtype.kind != "u" or dtype.itemsize != width or (width > 1 and dtype.byteorder != ">"):
        raise TypeError(f"the header decode reads {member} as a big-endian {width}-byte "
                        f"unsigned integer; the layout has {dtype}")
    return offset


def _network_params() -> dict[str, int]:
    """The parameters of the compiled header decode (``_netheaders.c``), by name: every
    size, offset and constant it uses, from the wire/ layouts and the constants above."""
    raw_a, raw_b, raw_c = _RAW_LINKTYPES
    vlan_a, vlan_b = _VLAN_ETHERTYPES
    return {
        "linktype_ethernet": pcap.LINKTYPE_ETHERNET, "linktype_sll": pcap.LINKTYPE_LINUX_SLL,
        "linktype_sll2": pcap.LINKTYPE_LINUX_SLL2, "linktype_null": pcap.LINKTYPE_NULL,
        "linktype_raw_a": raw_a, "linktype_raw_b": raw_b, "linktype_raw_c": raw_c,
        "eth_size": pcap.ETH.size, "eth_type_at": _be_member(pcap.ETH, "ethertype", 2),
        "vlan_size": pcap.VLAN.size, "vlan_type_at": _be_member(pcap.VLAN, "ethertype", 2),
        "vlan_tpid_a": vlan_a, "vlan_tpid_b": vlan_b,
        "sll_size": pcap.SLL.size, "sll_protocol_at": _be_member(pcap.SLL, "protocol", 2),
        "sll2_size": pcap.SLL2.size, "sll2_protocol_at": _be_member(pcap.SLL2, "protocol", 2),
        "null_header_size": _U32LE.itemsize, "null_family_inet": _NULL_FAMILY_INET,
        "ipv4_ethertype": _IPV4_ETHERTYPE,
        "ip_size": pcap.IP4.size, "ip_ver_ihl_at": _be_member(pcap.IP4, "ver_ihl", 1),
        "ip_total_length_at": _be_member(pcap.IP4, "total_length", 2),
        "ip_flags_frag_at": _be_member(pcap.IP4, "flags_frag", 2),
        "ip_protocol_at": _be_member(pcap.IP4, "protocol", 1),
        "ip_src_at": _be_member(pcap.IP4, "src", 4), "ip_dst_at": _be_member(pcap.IP4, "dst", 4),
        "frag_offset_mask": _FRAG_OFFSET, "more_fragments_mask": _MORE_FRAGMENTS,
        "proto_udp": _PROTO_UDP, "proto_tcp": _PROTO_TCP,
        "udp_size": pcap.UDP.size, "udp_sport_at": _be_member(pcap.UDP, "sport", 2),
        "udp_dport_at": _be_member(pcap.UDP, "dport", 2),
        "tcp_size": pcap.TCP.size, "tcp_sport_at": _be_member(pcap.TCP, "sport", 2),
        "tcp_dport_at": _be_member(pcap.TCP, "dport", 2),
        "tcp_seq_at": _be_member(pcap.TCP, "seq", 4),
        "tcp_offset_flags_at": _be_member(pcap.TCP, "offset_flags", 2),
        "tcp_flags_mask": _TCP_FLAG_BITS,
    }


_compiled_network: Callable[..., None] | None
try:
    from . import _netheaders
except ImportError:  # built without a C compiler (see setup.py): the numpy version runs
    _netheaders = None  # type: ignore[assignment]
    _compiled_network = None
    _NETWORK_PARAM_ARRAY = np.zeros(0, np.int64)
else:
    _compiled_network = _netheaders.decode
    _NETWORK_PARAM_ARRAY = np.array([_network_params()[name] for name in _netheaders.PARAMS],
                                    np.int64)

NETWORK_DECODE = "compiled" if _compiled_network is not None else "numpy"
"""Which header decode this process runs: ``"compiled"`` (``_netheaders.c``) or ``"numpy"``."""


@dataclass
class _Frames:
    """One input batch: identity columns and the frame bytes."""

    n: int
    files: pa.Array
    file_offset: np.ndarray
    ts_ns: pa.Array  # may hold nulls (pcapng simple packet blocks carry no time)
    linktype: np.ndarray
    data: _Binary
    single_file: str | None = None  # the one file of the batch (the usual case)

    @classmethod
    def of(cls, batch: pa.RecordBatch | pa.Table) -> _Frames:
        names = set(batch.schema.names)
        missing = [c for c in ("file", "file_offset", "ts_ns", "linktype", "data")
                   if c not in names]
        if missing:
            raise ValueError(f"frame batch lacks column(s) {missing}; "
                             f"expected {FRAME_SCHEMA.names}")

        def column(name: str) -> pa.Array:
            col = batch.column(name)
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            return col

        def ints(name: str) -> np.ndarray:
            col = column(name)
            if col.null_count:
                raise ValueError(f"frame column {name!r} has nulls")
            return numpy_of(col).astype(np.int64)

        files = column("file")
        if not pa.types.is_string(files.type):
            files = files.cast(pa.string())
        ts_ns = column("ts_ns")
        if ts_ns.type != pa.int64():
            ts_ns = ts_ns.cast(pa.int64())
        single = None
        if len(files) and not files.null_count and pc.all(pc.equal(files, files[0])).as_py():
            single = files[0].as_py()
        files = pc.dictionary_encode(files)  # taken per table row: codes, not texts
        return cls(len(batch), files, ints("file_offset"), ts_ns, ints("linktype"),
                   _Binary.of(column("data")), single)

    @classmethod
    def of_chunk(cls, file: str, chunk: RecordChunk) -> _Frames:
        """The records of a reader chunk, bytes read in place (nothing copied or packed)."""
        n = len(chunk)
        valid = chunk.ts_valid
        ts_ns = _masked(chunk.ts_ns, valid, pa.int64())
        data = _Binary(ByteView(np.frombuffer(chunk.buf, np.uint8)),
                       chunk.data_at.astype(np.int64), chunk.caplen.astype(np.int64))
        return cls(n, _constant(file, n), chunk.offset.astype(np.int64), ts_ns,
                   chunk.linktype.astype(np.int64), data, file)


@dataclass
class _Network:
    """Per frame row (length n; meaningful where ``proto`` is set): the L4 view."""

    proto: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    sport: np.ndarray
    dport: np.ndarray
    pstart: np.ndarray  # absolute position of the L4 payload in the data buffer
    pend: np.ndarray
    seq: np.ndarray
    tcp_flags: np.ndarray
    first_fragment: np.ndarray
    text: dict[str, tuple[np.ndarray, pa.Array]] = field(default_factory=dict)

    @classmethod
    def empty(cls, n: int) -> _Network:
        def zeros() -> np.ndarray:
            return np.zeros(n, np.int64)
        return cls(proto=zeros(), src=zeros(), dst=zeros(), sport=zeros(), dport=zeros(),
                   pstart=zeros(), pend=zeros(), seq=zeros(), tcp_flags=zeros(),
                   first_fragment=np.zeros(n, bool))

    def ip_strings(self, which: str, rows: np.ndarray) -> pa.Array:
        """Dotted ``src``/``dst`` of ``rows``; the batch's few distinct addresses are found
        (hashed) and formatted once per batch."""
        cached = self.text.get(which)
        if cached is None:
            encoded = _ipv4_strings(getattr(self, which))
            cached = self.text[which] = (numpy_of(encoded.indices), encoded.dictionary)
        indices, dictionary = cached
        return pa.DictionaryArray.from_arrays(arrow_array(indices[rows]), dictionary)


def _decode_network(fr: _Frames, skips: _Skips) -> _Network:
    """Link header (Ethernet with VLAN tags, Linux SLL/SLL2, null/loopback, raw IP) and IPv4,
    then UDP/TCP, for every frame at once; what does not get that far is counted in ``skips``
    with the reasons :func:`wire.pcap.decode_frame` gives (:data:`_NETWORK_SKIPS`).

    Compiled (``_netheaders.c``: one pass over the frames) where built, else in numpy
    (:func:`_decode_network_numpy`, some fifty passes over columns); the same result either
    way.  Measured on the benchmark capture: about 300 ns a frame in numpy."""
    if _compiled_network is None:
        return _decode_network_numpy(fr, skips)
    out = np.empty((len(_netheaders.OUTPUTS), fr.n), np.int64)
    _compiled_network(fr.data.bv.data, np.ascontiguousarray(fr.data.starts, np.int64),
                      np.ascontiguousarray(fr.data.lengths, np.int64),
                      np.ascontiguousarray(fr.linktype, np.int64), _NETWORK_PARAM_ARRAY, out)
    o = dict(zip(_netheaders.OUTPUTS, out, strict=True))
    skipped = np.flatnonzero(o["status"])
    codes = o["status"][skipped]
    for code in np.unique(codes).tolist():
        which = skipped[codes == code]
        _skip_network(skips, _netheaders.REASONS[code], which, o["value"][which])
    return _Network(proto=o["proto"], src=o["src"], dst=o["dst"], sport=o["sport"],
                    dport=o["dport"], pstart=o["pstart"], pend=o["pend"], seq=o["seq"],
                    tcp_flags=o["tcp_flags"], first_fragment=o["first_fragment"].astype(bool))


def _decode_network_numpy(fr: _Frames, skips: _Skips) -> _Network:
    """:func:`_decode_network` in numpy: the reference the compiled version is held to."""
    n = fr.n
    bv, start, length, lt = fr.data.bv, fr.data.starts, fr.data.lengths, fr.linktype
    l3 = np.full(n, -1, np.int64)
    etype = np.zeros(n, np.int64)

    rows = np.flatnonzero((lt == pcap.LINKTYPE_ETHERNET) & (length >= pcap.ETH.size))
    etype[rows] = read_member(bv, pcap.ETH, "ethertype", start[rows])
    l3[rows] = pcap.ETH.size
    tagged = rows
    while tagged.size:
        tagged = tagged[np.isin(etype[tagged], _VLAN_ETHERTYPES)
                        & (length[tagged] >= l3[tagged] + pcap.VLAN.size)]
        etype[tagged] = read_member(bv, pcap.VLAN, "ethertype", start[tagged] + l3[tagged])
        l3[tagged] += pcap.VLAN.size
    for linktype, layout in ((pcap.LINKTYPE_LINUX_SLL, pcap.SLL),
                             (pcap.LINKTYPE_LINUX_SLL2, pcap.SLL2)):
        rows = np.flatnonzero((lt == linktype) & (length >= layout.size))
        etype[rows] = read_member(bv, layout, "protocol", start[rows])
        l3[rows] = layout.size
    rows = np.flatnonzero((lt == pcap.LINKTYPE_NULL) & (length >= _U32LE.itemsize))
    family = bv.read(_U32LE, start[rows]).astype(np.int64)
    family = np.where(family > 0xFFFF, bv.read(_U32, start[rows]).astype(np.int64), family)
    etype[rows] = np.where(family == _NULL_FAMILY_INET, _IPV4_ETHERTYPE, 0)
    l3[rows] = _U32LE.itemsize
    rows = np.flatnonzero(np.isin(lt, _RAW_LINKTYPES) & (length >= 1))
    etype[rows] = np.where(bv.u8(start[rows]) >> 4 == 4, _IPV4_ETHERTYPE, 0)
    l3[rows] = 0

    unsupported = np.flatnonzero(l3 < 0)
    _skip_network(skips, "link", unsupported, lt[unsupported])
    not_ip = np.flatnonzero((l3 >= 0) & (etype != _IPV4_ETHERTYPE))
    _skip_network(skips, "not_ipv4", not_ip, etype[not_ip])

    rows = np.flatnonzero((l3 >= 0) & (etype == _IPV4_ETHERTYPE))
    short = length[rows] - l3[rows] < pcap.IP4.size
    _skip_network(skips, "ipv4_truncated", rows[short])
    rows = rows[~short]
    ip = read_members(bv, pcap.IP4, start[rows] + l3[rows],
                      ("ver_ihl", "total_length", "flags_frag", "protocol", "src", "dst"))
    ihl = (ip["ver_ihl"] & 0x0F) * 4
    bad = (ip["ver_ihl"] >> 4 != 4) | (ihl < pcap.IP4.size)
    later = ~bad & ((ip["flags_frag"] & _FRAG_OFFSET) != 0)
    _skip_network(skips, "not_ipv4_header", rows[bad])
    _skip_network(skips, "later_fragment", rows[later])
    keep = ~bad & ~later
    rows, ihl = rows[keep], ihl[keep]
    ip = {k: v[keep] for k, v in ip.items()}

    net = _Network.empty(n)
    end = np.minimum(length[rows], l3[rows] + ip["total_length"])
    body = l3[rows] + ihl
    proto = ip["protocol"]
    first_fragment = (ip["flags_frag"] & _MORE_FRAGMENTS) != 0

    udp = proto == _PROTO_UDP
    short = udp & (end - body < pcap.UDP.size)
    _skip_network(skips, "udp_truncated", rows[short])
    udp &= ~short
    tcp = proto == _PROTO_TCP
    short = tcp & (end - body < pcap.TCP.size)
    _skip_network(skips, "tcp_truncated", rows[short])
    tcp &= ~short
    other = (proto != _PROTO_UDP) & (proto != _PROTO_TCP)
    _skip_network(skips, "not_udp_tcp", rows[other], proto[other])

    r = rows[udp]
    ports = read_members(bv, pcap.UDP, start[r] + body[udp], ("sport", "dport"))
    net.proto[r] = _PROTO_UDP
    net.sport[r], net.dport[r] = ports["sport"], ports["dport"]
    net.pstart[r] = start[r] + body[udp] + pcap.UDP.size
    net.pend[r] = start[r] + end[udp]

    r = rows[tcp]
    head = read_members(bv, pcap.TCP, start[r] + body[tcp],
                        ("sport", "dport", "seq", "offset_flags"))
    words = head["offset_flags"] >> 12
    pstart = body[tcp] + words * 4
    bad = (words * 4 < pcap.TCP.size) | (pstart > end[tcp])
    _skip_network(skips, "tcp_data_offset", r[bad])
    fragment = first_fragment[tcp] & ~bad
    _skip_network(skips, "tcp_fragment", r[fragment])
    good = ~bad & ~fragment
    r = r[good]
    net.proto[r] = _PROTO_TCP
    net.sport[r], net.dport[r] = head["sport"][good], head["dport"][good]
    net.seq[r] = head["seq"][good]
    net.tcp_flags[r] = head["offset_flags"][good] & _TCP_FLAG_BITS
    net.pstart[r] = start[r] + pstart[good]
    net.pend[r] = start[r] + end[tcp][good]

    r = rows[udp | tcp]
    net.src[r], net.dst[r] = ip["src"][udp | tcp], ip["dst"][udp | tcp]
    net.first_fragment[rows[udp]] = first_fragment[udp]
    return net


# =============================================================================================
# Classification (tshark's port preferences, as wire.dissect.classify_udp)
# =============================================================================================

PROTOCOLS = ("", "lbtrm", "lbtru", "lbttcp", "lbmr")
_LBTRM, _LBTRU, _LBTTCP, _LBMR = 1, 2, 3, 4


def _in(values: np.ndarray, bounds: tuple[int, int]) -> np.ndarray:
    return (values >= bounds[0]) & (values <= bounds[1])


def _listed(values: np.ndarray, ports: Sequence[int]) -> np.ndarray:
    return np.isin(values, np.asarray(list(ports), np.int64))


def _multicast(addresses: np.ndarray) -> np.ndarray:
    return (addresses >> 28) == 0xE  # 224.0.0.0/4


def _classify_udp(bv: ByteView, net: _Network, rows: np.ndarray, ports: PortMap,
                  ) -> np.ndarray:
    """The protocol tshark's rules give each UDP row (0: none), as
    :func:`wire.dissect.classify_udp` decides it."""
    out = np.zeros(len(rows), np.int8)
    sport, dport, dst = net.sport[rows], net.dport[rows], net.dst[rows]
    open_ = np.ones(len(rows), bool)

    def claim(mask: np.ndarray, code: int) -> None:
        nonlocal open_
        mask = mask & open_
        out[mask] = code
        open_ = open_ & ~mask

    for code, listed in ((_LBTRU, ports.lbtru_ports), (_LBTRM, ports.lbtrm_ports),
                         (_LBMR, ports.lbmr_ports)):
        claim(_listed(sport, listed) | _listed(dport, listed), code)
    mc = _multicast(dst)
    claim(mc & (dst == _ipv4_int(ports.lbmr_mc[0])) & (dport == ports.lbmr_mc[1]), _LBMR)
    uc_dest = ports.lbmr_uc_dest_port
    claim(~mc & ((sport == uc_dest) | (dport == uc_dest))
          & (_in(sport, ports.lbmr_uc_ports) | _in(dport, ports.lbmr_uc_ports)), _LBMR)
    claim((_in(dport, ports.lbtru_source) & _in(sport, ports.lbtru_receiver))
          | (_in(dport, ports.lbtru_receiver) & _in(sport, ports.lbtru_source)), _LBTRU)
    if open_.any():
        content = _lbtrm_content_test(bv, net.pstart[rows], net.pend[rows])
        mc_range = (_ipv4_int(ports.lbtrm_mc_range[0]), _ipv4_int(ports.lbtrm_mc_range[1]))
        claim(content & ((mc & _in(dst, mc_range) & _in(dport, ports.lbtrm_dport))
                         | (~mc & _in(dport, ports.lbtrm_sport))), _LBTRM)
    return out


def _tcp_candidates(net: _Network, rows: np.ndarray, ports: PortMap) -> np.ndarray:
    """As :func:`wire.dissect.tcp_candidate`: a store/decode-as port or the LBT-TCP ranges."""
    sport, dport = net.sport[rows], net.dport[rows]
    listed = [*ports.store_ports, *ports.lbttcp_ports]
    out = _listed(sport, listed) | _listed(dport, listed)
    for bounds in (ports.lbttcp_source, ports.lbttcp_request):
        out |= _in(sport, bounds) | _in(dport, bounds)
    return out


def _ver_type(bits: Mapping[str, Bit], raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return ((raw & bits["version"].mask) >> bits["version"].shift,
            (raw & bits["type"].mask) >> bits["type"].shift)


def _lbtrm_content_test(bv: ByteView, pstart: np.ndarray, pend: np.ndarray) -> np.ndarray:
    """:func:`wire.lbtrm.heuristic_content_test`, column-wise."""
    out = np.zeros(len(pstart), bool)
    rows = np.flatnonzero(pend - pstart >= lbtrm.HEADER_SIZE)
    head = read_members(bv, lbtrm.COMMON, pstart[rows], ("ver_type", "next_hdr"))
    version, ptype = _ver_type(lbtrm.VER_TYPE_BITS, head["ver_type"])
    out[rows] = ((version == 0) & np.isin(ptype, list(lbtrm.HEURISTIC_TYPES))
                 & (head["next_hdr"] == 0))
    return out


# =============================================================================================
# LBMC messages, column-wise
# =============================================================================================

_VT = lbmc.VER_TYPE_BITS
_DATA_TYPES = np.zeros(16, bool)
_DATA_TYPES[[int(t) for t in lbmc.DATA_TYPES]] = True
_VALID_TYPES = np.zeros(16, bool)
_VALID_TYPES[[int(t) for t in lbmc.MessageType]] = True
_BASE_SIZE = np.where(_DATA_TYPES, lbmc.DATA_BASE.size, lbmc.CONTROL_BASE.size)


def _min_len_table() -> tuple[np.ndarray, list[str]]:
    """Per header code: the smallest ``hdr_len`` :func:`wire.lbmc.parse_message` accepts
    (0 = a code it refuses), and tshark's header name for errors."""
    table = np.zeros(256, np.int64)
    names = ["lbmc"] * 256
    for code in range(256):
        kind = lbmc.kind_by_code(code)
        if kind is not None:
            table[code], names[code] = kind.min_len, kind.tshark
        elif code in lbmc.KNOWN_CODES and code in lbmc.OPAQUE_MIN_LEN:
            table[code], names[code] = lbmc.OPAQUE_MIN_LEN[code], lbmc.KNOWN_CODES[code][1]
    return table, names


_MIN_LEN, _HEADER_NAMES = _min_len_table()
_NHDR_DATA, _NHDR_NONE = lbmc.NHDR_DATA, lbmc.NHDR_NONE
_TOPICNAME = lbmc.Topicname.kind
_TOPIC_AT = derive(_TOPICNAME.struct).size if _TOPICNAME.struct is not None else 0
_SRCIDX_CODE = lbmc.Srcidx.kind.code
_REQUEST_CODE = lbmc.TcpRequest.kind.code
_LABEL_RANK = np.full(256, len(lbmc.LABEL_ORDER), np.int64)
for _code in range(256):
    _label = lbmc.label_of(_code)
    if _label in lbmc.LABEL_ORDER:
        _LABEL_RANK[_code] = lbmc.LABEL_ORDER.index(_label)

# message error codes
(_E_MSGLEN_ZERO, _E_TYPE, _E_SHORT, _E_TRUNC, _E_HDR_ZERO, _E_HDR_OVER, _E_UNKNOWN,
 _E_HDR_SHORT) = range(1, 9)


def _message_error(code: int, off: int, val: int, hcode: int) -> str:
    header = _HEADER_NAMES[hcode] if code >= _E_HDR_ZERO else "lbmc"
    text = {
        _E_MSGLEN_ZERO: "msglen is zero",
        _E_TYPE: f"invalid LBMC type 0x{val:02x}",
        _E_SHORT: f"msglen {val} is shorter than its base header",
        _E_TRUNC: f"msglen {val} runs past the bytes present (truncated)",
        _E_HDR_ZERO: "hdr_len is zero",
        _E_HDR_OVER: f"hdr_len {val} runs past the end of the message",
        _E_UNKNOWN: f"unknown header code 0x{hcode:02x}",
        _E_HDR_SHORT: f"hdr_len {val} is shorter than the {int(_MIN_LEN[hcode])}-byte minimum",
    }[code]
    return f"{header} at offset {off}: {text}"


@dataclass
class _Lbmc:
    """Messages found in a set of byte regions (one row per message, region-major order),
    and their extended-header occurrences (``h_*``, one row per header)."""

    region: np.ndarray
    index: np.ndarray
    start: np.ndarray
    msglen: np.ndarray
    mtype: np.ndarray
    first: np.ndarray
    err: np.ndarray
    err_off: np.ndarray
    err_val: np.ndarray
    err_hcode: np.ndarray
    tidx: np.ndarray
    sqn: np.ndarray
    terminator: np.ndarray
    payload_len: np.ndarray
    h_msg: np.ndarray
    h_code: np.ndarray
    h_pos: np.ndarray
    h_len: np.ndarray

    @property
    def count(self) -> int:
        return len(self.region)

    def take(self, keep: np.ndarray) -> _Lbmc:
        """The messages selected by the boolean ``keep`` (headers renumbered)."""
        new_index = np.cumsum(keep) - 1
        hk = keep[self.h_msg]
        fields = {}
        for name in ("region", "index", "start", "msglen", "mtype", "first", "err", "err_off",
                     "err_val", "err_hcode", "tidx", "sqn", "terminator", "payload_len"):
            fields[name] = getattr(self, name)[keep]
        return _Lbmc(**fields, h_msg=new_index[self.h_msg[hk]], h_code=self.h_code[hk],
                     h_pos=self.h_pos[hk], h_len=self.h_len[hk])

    def error_text(self, i: int) -> str | None:
        code = int(self.err[i])
        if not code:
            return None
        return _message_error(code, int(self.err_off[i]), int(self.err_val[i]),
                              int(self.err_hcode[i]))


def decode_lbmc(bv: ByteView, rstart: np.ndarray, rend: np.ndarray, *,
                single: bool = False) -> _Lbmc:
    """Every LBMC message in the regions ``[rstart, rend)`` of ``bv``, as
    :func:`wire.lbmc.iter_messages` walks a datagram (``single``: each region is exactly one
    framed message, the LBT-TCP case).

    Messages are found breadth first (iteration *k* reads the *k*-th message of every region
    that has one) and so are their header chains.  A region stops at its first message that
    fails the base checks; chain errors mark the message (the caller decides what follows).
    """
    parts: dict[str, list[np.ndarray]] = {k: [] for k in ("region", "index", "start", "msglen",
                                                         "mtype", "first", "err", "err_val")}
    cur = rstart.astype(np.int64).copy()
    active = np.arange(len(rstart))
    index = 0
    while active.size:
        remaining = rend[active] - cur[active]
        enough = remaining >= lbmc.CONTROL_BASE.size
        active, remaining = active[enough], remaining[enough]
        if not active.size:
            break
        pos = cur[active]
        head = read_members(bv, lbmc.CONTROL_BASE, pos)
        mtype = (head["ver_type"] & _VT["type"].mask) >> _VT["type"].shift
        msglen = head["msglen"]
        err = np.zeros(len(active), np.int64)
        val = msglen.copy()
        err[msglen == 0] = _E_MSGLEN_ZERO
        bad_type = (err == 0) & ~_VALID_TYPES[mtype]
        err[bad_type] = _E_TYPE
        val[bad_type] = mtype[bad_type]
        err[(err == 0) & (msglen < _BASE_SIZE[mtype])] = _E_SHORT
        err[(err == 0) & (msglen > remaining)] = _E_TRUNC
        for name, values in (("region", active), ("index", np.full(len(active), index)),
                             ("start", pos), ("msglen", msglen), ("mtype", mtype),
                             ("first", head["next_hdr"]), ("err", err), ("err_val", val)):
            parts[name].append(values)
        if single:
            break
        ok = err == 0
        active = active[ok]
        cur[active] += msglen[ok]
        index += 1
        if index >= _SCALAR_DEPTH and 0 < active.size <= _SCALAR_ROWS:
            _frame_scalar(bv, active, cur, rend, index, parts)
            break
    cols = {k: (np.concatenate(v) if v else np.zeros(0, np.int64)) for k, v in parts.items()}
    order = np.lexsort((cols["index"], cols["region"]))
    cols = {k: v[order] for k, v in cols.items()}
    m = len(order)
    err, start, msglen, mtype = cols["err"], cols["start"], cols["msglen"], cols["mtype"]
    err_off = np.zeros(m, np.int64)
    err_hcode = np.zeros(m, np.int64)
    err_off[(err == _E_SHORT) | (err == _E_TRUNC) | (err == _E_MSGLEN_ZERO)] = 2

    tidx = np.zeros(m, np.int64)
    sqn = np.zeros(m, np.int64)
    data_rows = np.flatnonzero((err == 0) & _DATA_TYPES[mtype])
    if data_rows.size:
        base = read_members(bv, lbmc.DATA_BASE, start[data_rows], ("tidx", "sqn"))
        tidx[data_rows], sqn[data_rows] = base["tidx"], base["sqn"]

    # header chains, breadth first
    terminator = cols["first"].copy()
    hpos = start + _BASE_SIZE[mtype]
    mend = start + msglen
    h_parts: dict[str, list[np.ndarray]] = {k: [] for k in ("msg", "code", "pos", "len")}
    act = np.flatnonzero((err == 0) & (hpos + lbmc.BASIC.size <= mend)
                         & (terminator != _NHDR_DATA) & (terminator != _NHDR_NONE))
    depth = 0
    while act.size:
        pos = hpos[act]
        code = terminator[act]
        basic = read_members(bv, lbmc.BASIC, pos, ("next_hdr", "hdr_len"))
        hdr_len = basic["hdr_len"]
        e = np.zeros(len(act), np.int64)
        e[hdr_len == 0] = _E_HDR_ZERO
        e[(e == 0) & (pos + hdr_len > mend[act])] = _E_HDR_OVER
        need = _MIN_LEN[code]
        e[(e == 0) & (need == 0)] = _E_UNKNOWN
        e[(e == 0) & (hdr_len < need)] = _E_HDR_SHORT
        bad = e != 0
        if bad.any():
            b = act[bad]
            err[b], err_off[b] = e[bad], pos[bad] - start[b]
            cols["err_val"][b], err_hcode[b] = hdr_len[bad], code[bad]
        good = ~bad
        g = act[good]
        for name, values in (("msg", g), ("code", code[good]), ("pos", pos[good]),
                             ("len", hdr_len[good])):
            h_parts[name].append(values)
        terminator[g] = basic["next_hdr"][good]
        hpos[g] += hdr_len[good]
        act = g[(hpos[g] + lbmc.BASIC.size <= mend[g]) & (terminator[g] != _NHDR_DATA)
                & (terminator[g] != _NHDR_NONE)]
        depth += 1
        if depth >= _SCALAR_DEPTH and 0 < act.size <= _SCALAR_ROWS:
            _chain_scalar(bv, act, start, mend, hpos, terminator, err, err_off,
                          cols["err_val"], err_hcode, h_parts)
            break
    hcols = {k: (np.concatenate(v) if v else np.zeros(0, np.int64)) for k, v in h_parts.items()}
    horder = np.argsort(hcols["msg"], kind="stable")  # chain order within each message
    payload_len = np.where((err == 0) & (terminator == _NHDR_DATA), mend - hpos, 0)
    return _Lbmc(region=cols["region"], index=cols["index"], start=start, msglen=msglen,
                 mtype=mtype, first=cols["first"], err=err, err_off=err_off,
                 err_val=cols["err_val"], err_hcode=err_hcode, tidx=tidx, sqn=sqn,
                 terminator=terminator, payload_len=payload_len,
                 h_msg=hcols["msg"][horder], h_code=hcols["code"][horder],
                 h_pos=hcols["pos"][horder], h_len=hcols["len"][horder])


_SCALAR_DEPTH = 32
_SCALAR_ROWS = 8
"""Breadth-first walks hand their last few rows to a scalar loop once this deep: a datagram
of thousands of tiny messages (or a message of thousands of headers) would otherwise cost
one round of numpy calls per element."""
_CONTROL_CODEC = lbmc.CONTROL_BASE.codec
_BASIC_CODEC = lbmc.BASIC.codec
_BASIC_NEXT = lbmc.BASIC.names.index("next_hdr")
_BASIC_LEN = lbmc.BASIC.names.index("hdr_len")


def _frame_scalar(bv: ByteView, regions: np.ndarray, cur: np.ndarray, rend: np.ndarray,
                  index: int, parts: dict[str, list[np.ndarray]]) -> None:
    """The rest of :func:`decode_lbmc`'s message walk for a few regions, one by one (same
    checks, same output columns)."""
    names = ("region", "index", "start", "msglen", "mtype", "first", "err", "err_val")
    rows: list[tuple[int, ...]] = []
    type_mask, type_shift = _VT["type"].mask, _VT["type"].shift
    data = bv.data.data  # a memoryview of the buffer
    for region in regions.tolist():
        pos, end, k = int(cur[region]), int(rend[region]), index
        while end - pos >= lbmc.CONTROL_BASE.size:
            ver_type, first, msglen = _CONTROL_CODEC.unpack_from(data, pos)
            mtype = (ver_type & type_mask) >> type_shift
            err, val = 0, msglen
            if msglen == 0:
                err = _E_MSGLEN_ZERO
            elif not _VALID_TYPES[mtype]:
                err, val = _E_TYPE, mtype
            elif msglen < _BASE_SIZE[mtype]:
                err = _E_SHORT
            elif msglen > end - pos:
                err = _E_TRUNC
            rows.append((region, k, pos, msglen, mtype, first, err, val))
            if err:
                break
            pos += msglen
            k += 1
    if rows:
        for name, column in zip(names, zip(*rows, strict=True), strict=True):
            parts[name].append(np.array(column, np.int64))


def _chain_scalar(bv: ByteView, messages: np.ndarray, start: np.ndarray, mend: np.ndarray,
                  hpos: np.ndarray, terminator: np.ndarray, err: np.ndarray,
                  err_off: np.ndarray, err_val: np.ndarray, err_hcode: np.ndarray,
                  h_parts: dict[str, list[np.ndarray]]) -> None:
    """The rest of :func:`decode_lbmc`'s header-chain walk for a few messages, one by one."""
    found: list[tuple[int, int, int, int]] = []
    data = bv.data.data  # a memoryview of the buffer
    for m in messages.tolist():
        pos, end, code = int(hpos[m]), int(mend[m]), int(terminator[m])
        while pos + lbmc.BASIC.size <= end and code not in (_NHDR_DATA, _NHDR_NONE):
            basic = _BASIC_CODEC.unpack_from(data, pos)
            following, hdr_len = basic[_BASIC_NEXT], basic[_BASIC_LEN]
            need = int(_MIN_LEN[code])
            e = (_E_HDR_ZERO if hdr_len == 0 else _E_HDR_OVER if pos + hdr_len > end
                 else _E_UNKNOWN if need == 0 else _E_HDR_SHORT if hdr_len < need else 0)
            if e:
                err[m], err_off[m], err_val[m], err_hcode[m] = e, pos - start[m], hdr_len, code
                break
            found.append((m, code, pos, hdr_len))
            code = following
            pos += hdr_len
        hpos[m], terminator[m] = pos, code
    if found:
        for name, column in zip(("msg", "code", "pos", "len"), zip(*found, strict=True),
                                strict=True):
            h_parts[name].append(np.array(column, np.int64))


def _stop_at_first_error(msgs: _Lbmc, regions: int) -> _Lbmc:
    """Drop the messages after a region's first bad one (a datagram's decoder stops there)."""
    bad = msgs.err != 0
    if not bad.any():
        return msgs
    first = np.full(regions, np.iinfo(np.int64).max)
    np.minimum.at(first, msgs.region[bad], msgs.index[bad])
    keep = msgs.index <= first[msgs.region]
    return msgs if keep.all() else msgs.take(keep)


def _labels(msgs: _Lbmc, transport: np.ndarray) -> pa.Array:
    """tshark's Info label per message (:meth:`wire.lbmc.LbmcMessage.label`), column-wise;
    ``transport`` per message: carried on a transport channel (else data without SRCIDX is
    ``RX-DATA``)."""
    m = msgs.count
    rank = np.full(m, len(lbmc.LABEL_ORDER), np.int64)
    if msgs.h_msg.size:  # h_msg is sorted: one reduceat over each message's headers
        firsts = np.flatnonzero(np.diff(msgs.h_msg, prepend=-1))
        rank[msgs.h_msg[firsts]] = np.minimum.reduceat(_LABEL_RANK[msgs.h_code], firsts)
    srcidx = np.zeros(m, bool)
    srcidx[msgs.h_msg[msgs.h_code == _SRCIDX_CODE]] = True
    request = np.zeros(m, bool)
    request[msgs.h_msg[msgs.h_code == _REQUEST_CODE]] = True
    data = msgs.terminator == _NHDR_DATA
    names = [*lbmc.LABEL_ORDER, "", "DATA", "DATA[REQ]", "RX-DATA", "RX-DATA[REQ]"]
    base = len(lbmc.LABEL_ORDER) + 1
    code = np.where(data, base + request + 2 * (~transport & ~srcidx), rank)
    return _dictionary_strings(code, names, msgs.err == 0)


def _typed_headers(bv: ByteView, msgs: _Lbmc,
                   ) -> Iterator[tuple[HeaderColumn, np.ndarray, dict[str, np.ndarray]]]:
    """Per typed header column that some message of ``msgs`` carries: the owning message of
    each value (ascending; repeated for a repeated header) and the raw member values."""
    for column in MESSAGE_HEADER_COLUMNS:
        kind = column.kind
        assert kind.fast is not None
        sel = np.flatnonzero(msgs.h_code == kind.code)
        if not sel.size:
            continue
        owner = msgs.h_msg[sel]  # h_msg is sorted
        if not column.repeated:
            owner, first = np.unique(owner, return_index=True)
            sel = sel[first]
        yield column, owner, read_members(bv, kind.fast, msgs.h_pos[sel],
                                          {p.member for p in column.parts})


def _list_offsets(counts: np.ndarray) -> pa.Array:
    """The int32 offsets array of a list column whose rows hold ``counts`` values each."""
    return arrow_array(_running_offsets(counts, np.int32))


def _header_columns(bv: ByteView, msgs: _Lbmc) -> dict[str, pa.Array]:
    """The typed header columns of ``msgs``, one row per message (null where absent)."""
    m = msgs.count
    out = {column.name: null_array(column.arrow_type, m) for column in MESSAGE_HEADER_COLUMNS}
    for column, owner, raw in _typed_headers(bv, msgs):
        if column.repeated:
            counts = np.bincount(owner, minlength=m)
            out[column.name] = pa.ListArray.from_arrays(
                _list_offsets(counts), _struct_array(column.parts, raw, len(owner)),
                mask=arrow_array(counts == 0))
        else:
            out[column.name] = _spread_struct(column.parts, raw, owner, m)
    return out


def _header_tables(bv: ByteView, msgs: _Lbmc, key: Mapping[str, pa.Array],
                   ) -> dict[str, pa.Table]:
    """The typed headers of ``msgs`` as stored (:data:`HEADER_TABLE_SCHEMAS`, categorical key
    columns dictionary-typed): per header, only the messages that carry it, built from those
    values alone (no spreading to every message and filtering back)."""
    out: dict[str, pa.Table] = {}
    for column, owner, raw in _typed_headers(bv, msgs):
        values = _struct_array(column.parts, raw, len(owner))
        if column.repeated:
            owner, counts = np.unique(owner, return_counts=True)
            values = pa.ListArray.from_arrays(_list_offsets(counts), values)
        take = arrow_array(owner)
        name = f"{HEADER_TABLE_PREFIX}{column.name}"
        out[name] = _table(_HEADER_TABLES_D[name], len(owner), {
            **{k: key[k].take(take) for k in MESSAGE_KEY}, column.name: values})
    return out


def _core_header_columns(bv: ByteView, msgs: _Lbmc) -> dict[str, pa.Array]:
    """``header_codes`` and ``topic_name`` of ``msgs``."""
    m = msgs.count
    out: dict[str, pa.Array] = {}
    out["header_codes"] = pa.ListArray.from_arrays(_list_offsets(np.bincount(msgs.h_msg,
                                                                             minlength=m)),
                                                   arrow_array(msgs.h_code, pa.int32()))
    sel = np.flatnonzero(msgs.h_code == _TOPICNAME.code)
    owner, first = np.unique(msgs.h_msg[sel], return_index=True)
    sel = sel[first]
    starts = np.zeros(m, np.int64)
    lengths = np.zeros(m, np.int64)
    starts[owner] = msgs.h_pos[sel] + _TOPIC_AT
    lengths[owner] = msgs.h_len[sel] - _TOPIC_AT
    present = np.zeros(m, bool)
    present[owner] = True
    out["topic_name"] = _with_nulls(_text_array(bv.data, starts, lengths), present)
    return out


def _messages_table(bv: ByteView, msgs: _Lbmc, identity: Mapping[str, pa.Array],
                    transport: np.ndarray, extra: Mapping[str, pa.Array] | None = None,
                    msg_index: np.ndarray | None = None, stored: bool = False,
                    ) -> tuple[pa.Table, dict[str, pa.Table]]:
    """The messages table and, when ``stored``, apart from it its header tables
    (:func:`split_messages`); ``identity`` columns are already one value per message."""
    m = msgs.count
    ok = msgs.err == 0
    data = ok & _DATA_TYPES[msgs.mtype]
    columns: dict[str, pa.Array] = dict(identity)
    columns.update(extra or {})
    columns["msg_index"] = arrow_array(msgs.index if msg_index is None else msg_index, pa.int32())
    columns["type"] = arrow_array(msgs.mtype, pa.int32())
    type_names = [_LBMC_TYPE_NAMES.get(t) for t in range(16)]  # type: ignore[call-overload]
    columns["message_type"] = _dictionary_strings(msgs.mtype, type_names)
    columns["label"] = _labels(msgs, transport)
    columns["msglen"] = arrow_array(msgs.msglen, pa.int32())
    columns["tidx"] = _masked(msgs.tidx, data, pa.int64())
    columns["sqn"] = _masked(msgs.sqn, data, pa.int64())
    columns["payload_length"] = _masked(msgs.payload_len, ok, pa.int32())
    if (~ok).any():
        columns["malformed_reason"] = _sparse_strings(
            m, {i: msgs.error_text(i) or "" for i in np.flatnonzero(~ok).tolist()})
    columns.update(_core_header_columns(bv, msgs))
    if stored:
        return _table(_MESSAGE_CORE_D, m, columns), _header_tables(bv, msgs, columns)
    columns.update(_header_columns(bv, msgs))
    return _table(_MESSAGES_D, m, columns), {}


def _table(schema: pa.Schema, n: int, columns: Mapping[str, pa.Array]) -> pa.Table:
    """A table of ``schema`` from the given columns; the others are all null."""
    arrays = []
    for fld in schema:
        col = columns.get(fld.name)
        if col is None:
            arrays.append(null_array(fld.type, n))
        else:
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks()
            if col.type != fld.type:
                col = col.cast(fld.type)
            arrays.append(col)
    return pa.Table.from_arrays(arrays, schema=schema)


# =============================================================================================
# LBT-RM and LBT-RU, column-wise (one decoder for both: the TransportCodec tables drive it)
# =============================================================================================


@dataclass(frozen=True)
class _RecordPlan:
    """How to read one transport packet or option class: its derived fixed layout, the lists
    that follow it (count member and element layout) and a trailing ``RestOf`` byte string."""

    cls: type
    prefix: str
    fast: FastLayout
    lists: tuple[tuple[str, str, FastLayout], ...]
    rest_of: tuple[str, int] | None
    views: Mapping[str, tuple[str, Bit]]

    @classmethod
    def of(cls, record: Any) -> _RecordPlan:
        fast: FastLayout = record.fast
        lists: list[tuple[str, str, FastLayout]] = []
        rest_of = None
        for member in members(record.struct):
            if member.name in fast.names:
                continue
            inner = member.subcon
            if isinstance(inner, cs.Array) and isinstance(inner.count, CountOf):
                lists.append((member.name, inner.count.member, derive(inner.subcon)))
            elif isinstance(getattr(inner, "length", None), RestOf):
                rest_of = (inner.length.member, inner.length.fixed)
            else:
                raise TypeError(f"{record.__name__}.{member.name}: no column-wise reading")
        return cls(record, record.prefix, fast, tuple(lists), rest_of, view_index(record.struct))


# packet column <- member or bit-view names (per packet type where a name means different things)
_PACKET_COLUMN_SOURCES: dict[str, tuple[str, ...]] = {
    "flags": ("flags", "flags_fec_type"),
    "sqn": ("sqn", "sm_sqn", "ack_sqn"),
    "trail_sqn": ("trail_sqn",),
    "lead_sqn": ("lead_sqn",),
    "session_id": ("session_id",),
    "ucast_port": ("ucast_port",),
    "num_naks": ("num_naks",),
    "num_ncfs": ("num_ncfs",),
    "format": ("format",),
    "retransmission": ("rx",),
    "syn": ("syn",),
    "creq_request": ("request",),
}
_TYPE_SPECIFIC = {("ncf", "reason"): "ncf_reason", ("rst", "reason"): "rst_reason"}
_LIST_COLUMNS = {"naks": "nak_sqns", "ncfs": "ncf_sqns"}
_OPTION_COLUMNS = {"session_id": "session_id", "client_id": "client_id"}

# packet error codes
(_P_SHORT, _P_TYPE, _P_FIXED, _P_LIST, _P_OPT_END, _P_OPT_ZERO, _P_OPT_FIXED, _P_OPT_SHORT,
 _P_OPT_OVER, _P_LBMC, _P_FRAGMENT) = range(1, 12)


class _TransportDecoder:
    """Column-wise :meth:`wire.transport.TransportCodec.parse` for one transport."""

    def __init__(self, codec: TransportCodec) -> None:
        self.codec = codec
        self.name = codec.protocol
        self.packets = {int(code): _RecordPlan.of(cls) for code, cls in codec.packets.items()}
        self.type_names = {int(code): cls.type_code.name.lower()  # type: ignore[attr-defined]
                           for code, cls in codec.packets.items()}
        self.options = {int(code): _RecordPlan.of(cls) for code, cls in codec.options.items()}
        self.unknown_option = (_RecordPlan.of(codec.unknown_option)
                               if codec.unknown_option is not None else None)
        any_packet = next(iter(codec.packets.values()))
        self.ver_type_bits = {view: bit for view, (_, bit) in view_index(any_packet.struct).items()
                              if view in ("version", "type")}

    def decode(self, bv: ByteView, pstart: np.ndarray, pend: np.ndarray) -> _Transport:
        n = len(pstart)
        res = _Transport(self, n)
        length = pend - pstart
        short = length < self.codec.header_size
        res.fail(np.flatnonzero(short), _P_SHORT, 0, length[short], self.codec.header_size)
        rows = np.flatnonzero(~short)
        version, ptype = _ver_type(self.ver_type_bits, bv.u8(pstart[rows]))
        res.ptype[rows] = ptype
        res.version[rows] = version
        known = np.isin(ptype, list(self.packets))
        res.fail(rows[~known], _P_TYPE, 0, ptype[~known])
        pos = np.zeros(n, np.int64)
        next_hdr = np.zeros(n, np.int64)
        for code, plan in self.packets.items():
            r = rows[ptype == code]
            if not r.size:
                continue
            fits = length[r] >= plan.fast.size
            res.fail(r[~fits], _P_FIXED, 0, length[r][~fits], plan.fast.size, plan.prefix)
            r = r[fits]
            values = read_members(bv, plan.fast, pstart[r])
            _views_of(values, plan.views)
            cur = plan.fast.size + np.zeros(len(r), np.int64)
            lists = []
            ok = np.ones(len(r), bool)
            for member, count_member, element in plan.lists:
                count = values[count_member]
                need = count * element.size
                over = ok & (need > length[r] - cur)
                res.fail(r[over], _P_LIST, int(_offset_of(plan, count_member)), count[over],
                         0, plan.prefix, count_member)
                ok &= ~over
                lists.append((member, element, pstart[r] + cur, count))
                cur = cur + np.where(ok, need, 0)
            res.set_values(r[ok], code, {k: v[ok] for k, v in values.items()})
            for member, element, lstart, lcount in lists:
                res.set_list(member, r[ok], lstart[ok], lcount[ok], element, bv)
            pos[r[ok]] = cur[ok]
            next_hdr[r[ok]] = values["next_hdr"][ok]
        self._options(bv, res, pstart, pend, pos, next_hdr)
        res.body_end = pos
        return res

    def _options(self, bv: ByteView, res: _Transport, pstart: np.ndarray, pend: np.ndarray,
                 pos: np.ndarray, next_hdr: np.ndarray) -> None:
        """The option chain after the type body, breadth first (:meth:`_parse_options`)."""
        active = np.flatnonzero((res.err == 0) & (next_hdr != 0))
        code = next_hdr
        basic = self.unknown_option or next(iter(self.options.values()))
        while active.size:
            left = pend[active] - (pstart[active] + pos[active])
            end_short = left < 2
            res.fail(active[end_short], _P_OPT_END, pos[active][end_short], left[end_short])
            active, left = active[~end_short], left[~end_short]
            at = pstart[active] + pos[active]
            hdr_len = bv.u8(at + _offset_of(basic, "hdr_len"))
            zero = hdr_len == 0
            res.fail(active[zero], _P_OPT_ZERO, pos[active][zero] + 1, 0)
            active, left, at, hdr_len = active[~zero], left[~zero], at[~zero], hdr_len[~zero]
            nxt_active = []
            for opt_code in np.unique(code[active]):
                sel = code[active] == opt_code
                plan = self.options.get(int(opt_code), self.unknown_option)
                r, rleft, rat, rlen = active[sel], left[sel], at[sel], hdr_len[sel]
                if plan is None:
                    res.fail(r, _P_TYPE, pos[r], opt_code)
                    continue
                res.unknown_option[r] |= int(opt_code) not in self.options
                fixed = plan.fast.size
                bad = rleft < fixed
                res.fail(r[bad], _P_OPT_FIXED, pos[r][bad], rleft[bad], fixed, plan.prefix)
                ok = ~bad
                if plan.rest_of is not None:
                    short = ok & (rlen < plan.rest_of[1])
                    res.fail(r[short], _P_OPT_SHORT, pos[r][short] + 1, rlen[short],
                             plan.rest_of[1], plan.prefix)
                    ok &= ~short
                    over = ok & (rlen > rleft)
                    res.fail(r[over], _P_OPT_OVER, pos[r][over] + 1, rlen[over], 0, plan.prefix)
                    ok &= ~over
                    used = rlen
                else:
                    used = np.full(len(r), fixed)
                r, rat, used = r[ok], rat[ok], used[ok]
                values = read_members(bv, plan.fast, rat)
                for member, column in _OPTION_COLUMNS.items():
                    if member in values:
                        res.set_option(column, r, values[member])
                code[r] = values["next_hdr"]
                pos[r] += used
                nxt_active.append(r[values["next_hdr"] != 0])
            active = np.concatenate(nxt_active) if nxt_active else np.zeros(0, np.int64)


def _offset_of(plan: _RecordPlan, member: str) -> int:
    return member_at(plan.fast, member)[1]


class _Transport:
    """Per-row results of a transport decode (rows are positions in the decoder's input)."""

    def __init__(self, decoder: _TransportDecoder, n: int) -> None:
        self.decoder = decoder
        self.n = n
        self.err = np.zeros(n, np.int64)
        self.err_off = np.zeros(n, np.int64)
        self.err_val = np.zeros(n, np.int64)
        self.err_aux: dict[int, tuple[Any, ...]] = {}
        self.ptype = np.full(n, -1, np.int64)
        self.version = np.zeros(n, np.int64)
        self.values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._lists: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self.unknown_option = np.zeros(n, bool)
        self.body_end = np.zeros(n, np.int64)

    def fail(self, rows: np.ndarray, code: int, off: Any, val: Any, *aux: Any) -> None:
        """Record the first error of each row (later errors of a row are ignored)."""
        if not len(rows):
            return
        rows = np.asarray(rows)
        fresh = self.err[rows] == 0
        self.err_off[rows[fresh]] = np.broadcast_to(np.asarray(off), rows.shape)[fresh]
        self.err_val[rows[fresh]] = np.broadcast_to(np.asarray(val), rows.shape)[fresh]
        rows = rows[fresh]
        self.err[rows] = code
        if aux:
            for r in rows.tolist():
                self.err_aux[r] = aux

    def _column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        col = self.values.get(name)
        if col is None:
            col = self.values[name] = (np.zeros(self.n, np.int64), np.zeros(self.n, bool))
        return col

    def set_values(self, rows: np.ndarray, ptype: int, values: Mapping[str, np.ndarray]) -> None:
        tname = self.decoder.type_names[ptype]
        for column, sources in _PACKET_COLUMN_SOURCES.items():
            for source in sources:
                if source in values:
                    data, valid = self._column(column)
                    data[rows], valid[rows] = values[source], True
                    break
        for (type_name, source), column in _TYPE_SPECIFIC.items():
            if type_name == tname and source in values:
                data, valid = self._column(column)
                data[rows], valid[rows] = values[source], True

    def set_option(self, column: str, rows: np.ndarray, values: np.ndarray) -> None:
        data, valid = self._column(column)
        data[rows], valid[rows] = values, True  # the last option of a row wins, as in wire

    def set_list(self, member: str, rows: np.ndarray, start: np.ndarray, count: np.ndarray,
                 element: FastLayout, bv: ByteView) -> None:
        """A NAK/NCF list per row: ``count[i]`` elements from ``start[i]``."""
        idx, _ = _gather_index(np.zeros(len(rows), np.int64), count)
        pos = np.repeat(start, count) + idx * element.size
        values = read_member(bv, element, element.names[0], pos)
        self._lists.setdefault(_LIST_COLUMNS[member], []).append((rows, count, values))

    def list_array(self, column: str, rows: np.ndarray) -> pa.Array | None:
        """The list column for ``rows`` (ascending; null where a row has no such list)."""
        parts = self._lists.get(column)
        if not parts:
            return None
        counts = np.zeros(self.n, np.int64)
        present = np.zeros(self.n, bool)
        for p_rows, p_count, _ in parts:
            counts[p_rows] = p_count
            present[p_rows] = True
        owner = np.concatenate([np.repeat(p_rows, p_count) for p_rows, p_count, _ in parts])
        order = np.argsort(owner, kind="stable")
        owner = owner[order]
        values = np.concatenate([p[2] for p in parts])[order]
        selected = np.zeros(self.n, bool)
        selected[rows] = True
        return pa.ListArray.from_arrays(_list_offsets(counts[rows]),
                                        arrow_array(values[selected[owner]], pa.int64()),
                                        mask=arrow_array(~present[rows]))

    def error_text(self, row: int, lbmc_reason: str | None = None) -> str | None:
        code = int(self.err[row])
        if not code:
            return None
        return _packet_error(self.decoder.name, code, int(self.err_off[row]),
                             int(self.err_val[row]), self.err_aux.get(row, ()), lbmc_reason)


def _gather_index(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    offsets = _running_offsets(counts)
    total = int(offsets[-1])
    idx = np.arange(total, dtype=np.int64) + np.repeat(starts - offsets[:-1], counts)
    return idx, offsets


def _packet_error(protocol: str, code: int, off: int, val: int, aux: tuple[Any, ...],
                  lbmc_reason: str | None) -> str:
    need = aux[0] if aux else 0
    header = aux[1] if len(aux) > 1 else protocol
    if code == _P_SHORT:
        return f"{protocol} at offset 0: {val} bytes; the common header needs {need}"
    if code == _P_TYPE:
        return f"{protocol} at offset {off}: unrecognized packet type or option 0x{val:02x}"
    if code == _P_FIXED:
        return f"{header} at offset {off}: {val} bytes but the fixed layout needs {need}"
    if code == _P_LIST:
        return (f"{header} at offset {off}: {aux[2]} {val} needs more bytes of list than "
                "remain in the datagram")
    if code == _P_OPT_END:
        return f"{protocol} at offset {off}: the datagram ends where an option should start"
    if code == _P_OPT_ZERO:
        return f"{protocol} option at offset {off}: hdr_len is zero"
    if code == _P_OPT_FIXED:
        return f"{header} at offset {off}: {val} bytes left but the option layout needs {need}"
    if code == _P_OPT_SHORT:
        return f"{header} at offset {off}: hdr_len {val} is shorter than the {need}-byte layout"
    if code == _P_OPT_OVER:
        return f"{header} at offset {off}: hdr_len {val} runs past the end of the datagram"
    if code == _P_LBMC:
        return f"{protocol}/{lbmc_reason}" if lbmc_reason else f"{protocol}: bad LBMC message"
    if code == _P_FRAGMENT:
        return "IPv4 fragment: the datagram continues in later fragments (not reassembled)"
    return f"{protocol}: error {code}"


_LBTRM_DECODER = _TransportDecoder(lbtrm.CODEC)
_LBTRU_DECODER = _TransportDecoder(lbtru.CODEC)


# =============================================================================================
# UDP: decode, strict acceptance of content-claimed datagrams, tables
# =============================================================================================


@dataclass
class _UdpResult:
    """A transport decode of some UDP rows: per row results and the LBMC of DATA rows."""

    frame_rows: np.ndarray
    transport: _Transport
    messages: _Lbmc
    region_rows: np.ndarray  # region index -> position in frame_rows
    pstart: np.ndarray
    pend: np.ndarray

    def message_count(self) -> np.ndarray:
        ok = self.messages.err == 0
        return np.bincount(self.region_rows[self.messages.region[ok]],
                           minlength=len(self.frame_rows))

    def lbmc_error_rows(self) -> dict[int, int]:
        """Position -> index of its first bad message."""
        bad = np.flatnonzero(self.messages.err != 0)
        return {int(self.region_rows[self.messages.region[i]]): int(i) for i in bad[::-1]}

    def clean(self) -> np.ndarray:
        """Rows that decode with nothing left over (the content heuristics' acceptance)."""
        tr = self.transport
        out = (tr.err == 0) & ~tr.unknown_option & (tr.version == 0)
        length = self.pend - self.pstart
        msgs = self.messages
        consumed = np.zeros(len(self.frame_rows), np.int64)
        np.add.at(consumed, self.region_rows[msgs.region], msgs.msglen)
        has_lbmc = np.zeros(len(self.frame_rows), bool)
        has_lbmc[self.region_rows] = True
        bad = np.zeros(len(self.frame_rows), bool)
        bad[self.region_rows[msgs.region[msgs.err != 0]]] = True
        data_ok = has_lbmc & ~bad & (consumed > 0) & (tr.body_end + consumed == length)
        other_ok = ~has_lbmc & (tr.body_end == length)
        for column in ("num_naks", "num_ncfs"):
            counted = tr.values.get(column)
            if counted is not None:
                other_ok &= ~counted[1] | (counted[0] > 0)
        return out & (data_ok | other_ok)


def _decode_udp(decoder: _TransportDecoder, bv: ByteView, net: _Network, frame_rows: np.ndarray,
                ) -> _UdpResult:
    pstart, pend = net.pstart[frame_rows], net.pend[frame_rows]
    tr = decoder.decode(bv, pstart, pend)
    lbmc_types = [code for code, plan in decoder.packets.items()
                  if getattr(plan.cls, "carries_lbmc", False)]
    region_rows = np.flatnonzero((tr.err == 0) & np.isin(tr.ptype, lbmc_types))
    msgs = decode_lbmc(bv, pstart[region_rows] + tr.body_end[region_rows], pend[region_rows])
    msgs = _stop_at_first_error(msgs, len(region_rows))
    return _UdpResult(frame_rows, tr, msgs, region_rows, pstart, pend)


def _frame_columns(fr: _Frames, net: _Network, frame_rows: np.ndarray) -> dict[str, pa.Array]:
    """The frame's file, offset and time and its addresses and ports as numbers."""
    take = arrow_array(frame_rows)
    return {
        "file": (_constant(fr.single_file, len(frame_rows)) if fr.single_file is not None
                 else fr.files.take(take)),
        "file_offset": arrow_array(fr.file_offset[frame_rows], pa.int64()),
        "ts_ns": fr.ts_ns.take(take),
        "src_port": arrow_array(net.sport[frame_rows].astype(np.int32)),
        "dst_port": arrow_array(net.dport[frame_rows].astype(np.int32)),
        "src_ip_int": arrow_array(net.src[frame_rows], pa.int64()),
        "dst_ip_int": arrow_array(net.dst[frame_rows], pa.int64()),
    }


def _identity(fr: _Frames, net: _Network, frame_rows: np.ndarray, protocol: str,
              ) -> dict[str, pa.Array]:
    """:func:`_frame_columns` with the protocol and the dotted addresses."""
    return {**_frame_columns(fr, net, frame_rows),
            "protocol": _constant(protocol, len(frame_rows)),
            "src_ip": net.ip_strings("src", frame_rows),
            "dst_ip": net.ip_strings("dst", frame_rows)}


_BOOL_COLUMNS = ("retransmission", "syn")


def _udp_tables(fr: _Frames, net: _Network, res: _UdpResult, positions: np.ndarray,
                classified_by: str, stored: bool,
                ) -> tuple[pa.Table, pa.Table, dict[str, pa.Table]]:
    """Packets and messages tables for ``positions`` (into ``res.frame_rows``), and the header
    tables when ``stored`` (see :func:`_messages_table`)."""
    decoder = res.transport.decoder
    tr = res.transport
    frame_rows = res.frame_rows[positions]
    k = len(positions)
    columns = _identity(fr, net, frame_rows, decoder.name)
    columns["classified_by"] = _constant(classified_by, k)
    columns["payload_length"] = arrow_array((res.pend - res.pstart)[positions], pa.int32())
    type_codes = tr.ptype[positions]
    names = [decoder.type_names.get(t) for t in range(16)]
    columns["packet_type"] = _dictionary_strings(type_codes, names, type_codes >= 0)
    for name, (data, valid) in tr.values.items():
        if name in _BOOL_COLUMNS:
            columns[name] = _masked(data[positions] != 0, valid[positions], pa.bool_())
        else:
            fld = PACKETS_SCHEMA.field(name)
            columns[name] = _masked(data[positions], valid[positions], fld.type)
    for column in _LIST_COLUMNS.values():
        arr = tr.list_array(column, positions)
        if arr is not None:
            columns[column] = arr
    counts = res.message_count()
    columns["messages"] = arrow_array(counts[positions], pa.int32())
    fragment = net.first_fragment[frame_rows]
    lbmc_bad = res.lbmc_error_rows()
    reasons: dict[int, str] = {}
    msgs = res.messages
    for i in np.flatnonzero((tr.err[positions] != 0) | fragment
                            | np.isin(positions, list(lbmc_bad))).tolist():
        pos = int(positions[i])
        parts = []
        text = tr.error_text(pos)
        if text:
            parts.append(text)
        bad = lbmc_bad.get(pos)
        if bad is not None:
            offset = int(msgs.start[bad] - res.pstart[pos])
            parts.append(f"{decoder.name} message {int(msgs.index[bad])} at offset "
                         f"{offset}: {msgs.error_text(bad)}")
        if fragment[i]:
            parts.append(_packet_error(decoder.name, _P_FRAGMENT, 0, 0, (), None))
        reasons[i] = "; ".join(parts)
    columns["malformed_reason"] = _sparse_strings(k, reasons)
    packets = _table(_PACKETS_D, k, columns)

    # messages of the selected rows
    selected = np.zeros(len(res.frame_rows), bool)
    selected[positions] = True
    msgs = res.messages
    keep = selected[res.region_rows[msgs.region]] if msgs.count else np.zeros(0, bool)
    msgs = msgs.take(keep) if not keep.all() else msgs
    owner = res.region_rows[msgs.region]
    ident = _identity(fr, net, res.frame_rows[owner], decoder.name)
    ident = {name: ident[name] for name in MESSAGES_SCHEMA.names if name in ident}
    extra = {}
    for name, column in (("session_id", "session_id"), ("transport_sqn", "sqn")):
        got = tr.values.get(column)
        if got is not None:
            extra[name] = _masked(got[0][owner], got[1][owner], pa.int64())
    messages, headers = _messages_table(fr.data.bv, msgs, ident, np.ones(msgs.count, bool),
                                        extra, stored=stored)
    return packets, messages, headers


# =============================================================================================
# LBMR (packet by packet: resolver traffic is light)
# =============================================================================================

_LBMR_CONTENT_TYPES = (lbmr.PacketType.NORMAL, lbmr.PacketType.WC_TQR, lbmr.PacketType.TOPIC_MGMT,
                       lbmr.PacketType.UMQ, lbmr.PacketType.EXT)


def _lbmr_plausible(bv: ByteView, pstart: np.ndarray, pend: np.ndarray) -> np.ndarray:
    """Cheap pre-filter for the LBMR content heuristic (header only)."""
    out = np.zeros(len(pstart), bool)
    rows = np.flatnonzero(pend - pstart >= lbmr.HEADER.size)
    head = read_members(bv, lbmr.HEADER, pstart[rows])
    bits = lbmr.VER_TYPE_BITS
    version = (head["ver_type"] & bits["ver"].mask) >> bits["ver"].shift
    ptype = (head["ver_type"] & bits["type"].mask) >> bits["type"].shift
    records = head["tqrs"] + head["tirs"]
    counted = np.isin(ptype, [lbmr.PacketType.NORMAL, lbmr.PacketType.WC_TQR])
    out[rows] = ((version == 0) & np.isin(ptype, [int(t) for t in _LBMR_CONTENT_TYPES])
                 & (~counted | (records > 0)))
    return out


def _lbmr_strict(packet: lbmr.LbmrPacket) -> bool:
    """What a content-claimed LBMR datagram must look like beyond decoding."""
    if packet.trailer:
        return False
    if packet.type == lbmr.PacketType.EXT:
        return not isinstance(packet.ext, lbmr.ExtUnknown)
    return True


_LBMR_TYPE_NAMES = {int(t): t.name.lower() for t in lbmr.PacketType}


def _transport_name(code: int) -> str:
    return lbmr.TRANSPORT_NAMES.get(code, f"0x{code:02x}")


def _advertisement_rows(packet: lbmr.LbmrPacket) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if packet.type not in (lbmr.PacketType.NORMAL, lbmr.PacketType.WC_TQR):
        return rows
    for i, query in enumerate(packet.tqrs):
        if isinstance(query, lbmr.WcTqr):
            rows.append({"record": "wc_tqr", "record_index": i, "topic": query.pattern,
                         "pattern_type": query.pattern_type})
        else:
            rows.append({"record": "tqr", "record_index": i, "topic": query.name})
    for i, tir in enumerate(packet.tirs):
        if not isinstance(tir, lbmr.Tir):
            continue
        info = tir.info
        values = info.values
        code = int(info.code or 0)
        row: dict[str, Any] = {
            "record": "tir", "record_index": i, "topic": tir.name, "transport": _transport_name(
                code), "transport_type": code, "topic_index": tir.index, "ttl": tir.ttl,
            "session_id": values.get("session_id"),
            "source_ip": values.get("ip", values.get("src_addr")),
            "source_port": values.get("port", values.get("src_ucast_port")),
            "mcast_group": values.get("mcast_addr"), "mcast_port": values.get("udp_dest_port"),
        }
        for column in ADVERTISEMENT_OPTION_COLUMNS:
            found = [o for o in tir.options or [] if isinstance(o, column.cls)]
            got = [_struct_pyvalue(column.parts, o.resolved()) for o in found]
            row[column.name] = (got or None) if column.repeated else (got[0] if got else None)
        rows.append(row)
    return rows


_LbmrRow = tuple[int, str | None, str | None, list[dict[str, Any]]]
"""A decoded LBMR datagram: frame row, packet type, malformed reason, advertisement rows."""


_LbmrParsed = tuple[bool, str | None, str | None, list[dict[str, Any]]]
"""What an LBMR payload decodes to: accepted, packet type, error, advertisement rows."""

_LBMR_CACHE: dict[tuple[bytes, bool], _LbmrParsed] = {}
_LBMR_CACHE_MAX = 4096


def _parse_lbmr(payload: bytes, strict: bool) -> _LbmrParsed:
    """One LBMR payload, memoised: topic resolution repeats the same advertisements every
    few seconds (nothing in an LBMR packet changes between repeats), and the object decoder
    costs milliseconds per packet of TIRs with options."""
    key = (payload, strict)
    found = _LBMR_CACHE.get(key)
    if found is not None:
        return found
    try:
        packet = lbmr.parse_packet(payload)
    except WireError as exc:
        if strict:
            result: _LbmrParsed = (False, None, None, [])
        else:
            ptype = _LBMR_TYPE_NAMES.get(payload[0] & lbmr.VER_TYPE_BITS["type"].mask) \
                if payload else None
            result = (True, ptype, str(exc), [])
    else:
        if strict and not _lbmr_strict(packet):
            result = (False, None, None, [])
        else:
            result = (True, _LBMR_TYPE_NAMES.get(int(packet.type), f"type {packet.type}"),
                      None, _advertisement_rows(packet))
    if len(_LBMR_CACHE) >= _LBMR_CACHE_MAX:
        _LBMR_CACHE.clear()
    _LBMR_CACHE[key] = result
    return result


def _decode_lbmr(fr: _Frames, net: _Network, frame_rows: np.ndarray, strict: bool,
                 ) -> tuple[np.ndarray, list[_LbmrRow]]:
    """Parse each datagram; returns (accepted mask, per accepted row: frame row, packet type,
    malformed reason, advertisement rows).  ``strict``: content-claimed, refuse on error."""
    accepted = np.zeros(len(frame_rows), bool)
    out: list[_LbmrRow] = []
    data = fr.data.bv.data
    for i, row in enumerate(frame_rows.tolist()):
        payload = data[net.pstart[row]:net.pend[row]].tobytes()
        ok, ptype, error, adverts = _parse_lbmr(payload, strict)
        if not ok:
            continue
        accepted[i] = True
        if error is None and net.first_fragment[row]:
            error = _packet_error("lbmr", _P_FRAGMENT, 0, 0, (), None)
        out.append((row, ptype, error, adverts))
    return accepted, out


def _lbmr_tables(fr: _Frames, net: _Network, decoded: list[_LbmrRow], classified_by: str,
                 ) -> tuple[pa.Table, pa.Table]:
    if not decoded:
        return empty_table(_PACKETS_D), empty_table(_ADVERTISEMENTS_D)
    rows = np.array([d[0] for d in decoded], np.int64)
    columns = _identity(fr, net, rows, "lbmr")
    columns["classified_by"] = _constant(classified_by, len(rows))
    columns["payload_length"] = arrow_array(net.pend[rows] - net.pstart[rows], pa.int32())
    columns["packet_type"] = arrow_array([d[1] for d in decoded], pa.string())
    columns["messages"] = arrow_array(np.zeros(len(rows), np.int32))
    columns["malformed_reason"] = arrow_array([d[2] for d in decoded], pa.string())
    packets = _table(_PACKETS_D, len(rows), columns)
    owners = np.array([d[0] for d in decoded for _ in d[3]], np.int64)
    records = [r for d in decoded for r in d[3]]
    if not records:
        return packets, empty_table(_ADVERTISEMENTS_D)
    ident = _identity(fr, net, owners, "lbmr")
    adverts = python_table(records, pa.schema(
        [f for f in ADVERTISEMENTS_SCHEMA if f.name not in ident]))
    cols = {**{n: ident[n] for n in ADVERTISEMENTS_SCHEMA.names if n in ident},
            **{n: adverts.column(n) for n in adverts.column_names}}
    return packets, _table(_ADVERTISEMENTS_D, len(records), cols)


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
        packets, messages, adverts = ((_PACKETS_D, _MESSAGE_CORE_D, _ADVERTISEMENTS_D)
                                      if stored else
                                      (PACKETS_SCHEMA, MESSAGES_SCHEMA, ADVERTISEMENTS_SCHEMA))
        segments = _TCP_SEGMENTS_D if stored else TCP_SEGMENTS_SCHEMA
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


def _concat(tables: Sequence[pa.Table], schema: pa.Schema) -> pa.Table:
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return empty_table(schema)
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def merge_skipped(tables: Sequence[pa.Table]) -> pa.Table:
    """One ``skipped`` table (:data:`SKIPPED_SCHEMA`) from several: frames summed and the
    first offset kept per file and reason."""
    table = _concat(tables, SKIPPED_SCHEMA)
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
        _concat([p.packets for p in parts], like.packets.schema),
        _concat([p.messages for p in parts], like.messages.schema),
        _concat([p.advertisements for p in parts], like.advertisements.schema),
        merge_skipped([p.skipped for p in parts]),
        _concat([p.tcp_segments for p in parts], like.tcp_segments.schema),
        _concat_headers([p.headers for p in parts]),
    )


def _concat_headers(parts: Sequence[Mapping[str, pa.Table]]) -> dict[str, pa.Table]:
    names = sorted({name for part in parts for name in part})
    return {name: _concat([p[name] for p in parts if name in p], _HEADER_TABLES_D[name])
            for name in names}


def decode_batch(batch: pa.RecordBatch | pa.Table, options: DecodeOptions | None = None,
                 *, stored: bool = False) -> DecodedTables:
    """Stage 1 (stateless): every frame of ``batch`` to packets, messages, advertisements and
    skipped counts; TCP segments of candidate LBT-TCP connections go to ``tcp_segments``.
    With ``stored``, the tables come in the stored form (:class:`DecodedTables`)."""
    tables = _decode_frames(_Frames.of(batch), options or DecodeOptions(), stored)
    return tables if stored else tables.public()


def decode_chunk(file: str, chunk: RecordChunk, options: DecodeOptions | None = None,
                 *, stored: bool = False) -> DecodedTables:
    """:func:`decode_batch` of the records of a reader chunk
    (:meth:`spark_analysis.splits.SplitReader.chunks`), read where they lie in the chunk's
    buffer: the same tables as decoding the Arrow batches of those records."""
    tables = _decode_frames(_Frames.of_chunk(file, chunk), options or DecodeOptions(), stored)
    return tables if stored else tables.public()


def _decode_frames(fr: _Frames, options: DecodeOptions, stored: bool) -> DecodedTables:
    ports = options.ports
    skips = _Skips()
    net = _decode_network(fr, skips)
    bv = fr.data.bv
    packets: list[pa.Table] = []
    messages: list[pa.Table] = []
    headers: list[dict[str, pa.Table]] = []
    adverts: list[pa.Table] = []

    udp = np.flatnonzero(net.proto == _PROTO_UDP)
    proto = _classify_udp(bv, net, udp, ports)
    open_rows = udp[proto == 0]
    if not options.content_heuristics:
        skips.add(open_rows, "UDP matches no UM port rule")
        open_rows = open_rows[:0]

    for decoder, code in ((_LBTRM_DECODER, _LBTRM), (_LBTRU_DECODER, _LBTRU)):
        by_port = udp[proto == code]
        if code == _LBTRM:
            trial = open_rows[_lbtrm_content_test(bv, net.pstart[open_rows], net.pend[open_rows])]
        else:
            trial = open_rows
        rows = np.concatenate([by_port, trial])
        if not rows.size:
            continue
        res = _decode_udp(decoder, bv, net, rows)
        n_port = len(by_port)
        content_ok = np.flatnonzero(res.clean()[n_port:]) + n_port
        for positions, how in ((np.arange(n_port), "port"), (content_ok, "content")):
            if positions.size:
                p, m, h = _udp_tables(fr, net, res, positions, how, stored)
                packets.append(p)
                messages.append(m)
                headers.append(h)
        open_rows = open_rows[~np.isin(open_rows, res.frame_rows[content_ok])]

    by_port = udp[proto == _LBMR]
    for rows, how in ((by_port, "port"),
                      (open_rows[_lbmr_plausible(bv, net.pstart[open_rows], net.pend[open_rows])],
                       "content")):
        if not rows.size:
            continue
        accepted, decoded = _decode_lbmr(fr, net, rows, strict=how == "content")
        p, a = _lbmr_tables(fr, net, decoded, how)
        packets.append(p)
        adverts.append(a)
        if how == "content":
            open_rows = open_rows[~np.isin(open_rows, rows[accepted])]
    skips.add(open_rows, "UDP matches no UM port rule and decodes as no UM protocol")

    tcp = np.flatnonzero(net.proto == _PROTO_TCP)
    candidate = _tcp_candidates(net, tcp, ports)
    skips.add(tcp[~candidate], "TCP matches no LBT-TCP port range")
    tcp = tcp[candidate]
    # Segments without payload matter to stage 2 only when they carry SYN (the start of a
    # stream epoch); the rest (pure ACKs, a quarter of a busy capture) are counted here
    # instead of being shipped there.
    empty = (net.pend[tcp] <= net.pstart[tcp]) & ((net.tcp_flags[tcp] & pcap.TCP_SYN) == 0)
    skips.add(tcp[empty], _NO_PAYLOAD)
    tcp = tcp[~empty]
    # grouped by flow (capture order within): a flow's payloads then lie back to back in the
    # shipped buffer, and stage 2 gathers them in long runs
    tcp = tcp[np.lexsort((tcp, net.dport[tcp], net.dst[tcp], net.sport[tcp], net.src[tcp]))]
    segments = _tcp_segments_table(fr, net, tcp, stored)

    return DecodedTables(
        _concat(packets, _PACKETS_D),
        _concat(messages, _MESSAGE_CORE_D if stored else _MESSAGES_D),
        _concat(adverts, _ADVERTISEMENTS_D),
        skips.table(fr.files, fr.file_offset), segments, _concat_headers(headers))


def _tcp_segments_table(fr: _Frames, net: _Network, rows: np.ndarray, stored: bool,
                        ) -> pa.Table:
    schema = _TCP_SEGMENTS_D if stored else TCP_SEGMENTS_SCHEMA
    if not rows.size:
        return empty_table(schema)
    columns = _frame_columns(fr, net, rows)  # no dotted addresses: stage 2 never reads them
    columns["seq"] = arrow_array(net.seq[rows], pa.int64())
    columns["tcp_flags"] = arrow_array(net.tcp_flags[rows], pa.int32())
    columns["payload"] = _binary_array(fr.data.bv.data, net.pstart[rows],
                                       net.pend[rows] - net.pstart[rows])
    return _table(schema, len(rows), columns)


# =============================================================================================
# Stage 2: LBT-TCP reassembly per connection direction
# =============================================================================================

_MSGLEN_AT = member_at(lbmc.CONTROL_BASE, "msglen")[1]
if member_at(lbmc.CONTROL_BASE, "msglen")[0] != np.dtype(">u2"):
    raise TypeError("the LBT-TCP framer reads msglen as a big-endian u16")
_MIN_FRAME = lbmc.CONTROL_BASE.size
_MSGLEN_DTYPE = member_at(lbmc.CONTROL_BASE, "msglen")[0]
_SEQ_MOD = 1 << 32
_NO_PAYLOAD = "TCP segment without payload"


class _TcpOut:
    """What stage 2 produces for the (sorted) segments of one stage-2 call.

    Messages lying in the input payload buffer are kept as their position and the segment
    they are attributed to, in completion order, as numpy arrays (the one-pass path makes
    them so; the segment-by-segment replay collects Python lists and adds them when done);
    messages that straddled segments are copied to ``extra``.  Lengths are read column-wise
    after."""

    def __init__(self) -> None:
        self.row_parts: list[np.ndarray] = []  # segments that get a packets row
        self.retx: list[int] = []  # ... of which whole retransmissions
        self.reason: dict[int, str] = {}
        self.skips: dict[str, list[int]] = defaultdict(list)
        self.pos_parts: list[np.ndarray] = []  # messages inside the payload buffer ...
        self.owner_parts: list[np.ndarray] = []  # ... and the segment each is attributed to
        self.in_buffer = 0  # how many such messages so far
        self.extra_pos: list[int] = []  # messages copied to ``extra`` (straddling segments)
        self.extra_seg: list[int] = []
        self.extra_order: list[int] = []  # ``in_buffer`` when each was completed
        self.extra = bytearray()

    def note(self, row: int, reason: str) -> None:
        old = self.reason.get(row)
        self.reason[row] = f"{old}; {reason}" if old else reason

    def add(self, rows: np.ndarray, positions: np.ndarray, owners: np.ndarray) -> None:
        """Packets rows for ``rows``, and buffer messages at ``positions`` owned by
        ``owners`` (completed in this order, after everything added before)."""
        self.row_parts.append(rows)
        self.pos_parts.append(positions)
        self.owner_parts.append(owners)
        self.in_buffer += len(positions)


def _reassemble_epoch(out: _TcpOut, raw: bytes, rows: np.ndarray, seq: np.ndarray,
                      flags: np.ndarray, pstart: np.ndarray, plen: np.ndarray) -> None:
    """One connection direction from one SYN (or the capture start) to the next SYN.

    Sequence numbers are unwrapped in capture order, data segments are replayed in sequence
    order, and the Dissector's rules apply: bytes already seen are trimmed (a whole duplicate
    is a retransmission), a hole resets the framer, a framer that has not yet seen a message
    start needs the LBMC entry test at a segment start, and a ``msglen`` below 4 breaks the
    stream (reported on that segment, or on the next one when messages completed first, as
    :class:`wire.lbttcp.LbttcpStream` does)."""
    raw_seq = seq[rows]
    delta = (np.diff(raw_seq) % _SEQ_MOD).astype(np.int64)
    delta[delta >= _SEQ_MOD // 2] -= _SEQ_MOD
    useq = np.concatenate([[0], np.cumsum(delta)]) + int(raw_seq[0])
    syn = (flags[rows] & pcap.TCP_SYN) != 0
    useq = useq + syn  # data of a SYN segment starts after the SYN's sequence number
    has_data = plen[rows] > 0
    out.skips[_NO_PAYLOAD].extend(rows[~has_data].tolist())
    data_rows = rows[has_data]
    data_useq = useq[has_data]
    order = np.lexsort((data_rows, data_useq))
    data_rows, data_useq = data_rows[order], data_useq[order]
    if not data_rows.size:
        return
    # A hole resets everything, so the pieces between holes are independent: each goes
    # through the one-pass path when it is clean, else through the segment-by-segment replay.
    next_seq: int | None = int(useq[0]) if syn[0] else None
    ends = data_useq + plen[data_rows]
    reach = np.maximum.accumulate(ends)
    hole = np.zeros(len(data_rows), bool)
    hole[1:] = data_useq[1:] > reach[:-1]
    if next_seq is not None:
        hole[0] = data_useq[0] > next_seq
    cuts = [0, *np.flatnonzero(hole[1:]) + 1, len(data_rows)]
    for a, b in itertools.pairwise(cuts):
        before = next_seq if a == 0 else int(reach[a - 1])
        if not _contiguous_piece(out, raw, data_rows[a:b], data_useq[a:b], before, pstart,
                                 plen):
            _replay(out, raw, data_rows[a:b], data_useq[a:b], before, pstart, plen)


def _replay(out: _TcpOut, raw: bytes, data_rows: np.ndarray, data_useq: np.ndarray,
            next_seq: int | None, pstart: np.ndarray, plen: np.ndarray) -> None:
    """Data segments (in sequence order) one by one, from a fresh framer."""
    accepted = False
    broken = False
    pending = b""
    fed = 0  # bytes fed to the current framer (for error offsets)
    best = -1  # latest-captured fed segment: the one that makes a message deliverable
    rows: list[int] = []  # segments that get a packets row
    msg_pos: list[int] = []  # messages inside the payload buffer, in feed order
    feed_seg: list[int] = []  # per feed: attributed segment ...
    feed_count: list[int] = []  # ... and how many buffer messages it completed
    for r, u, length, start in zip(data_rows.tolist(), data_useq.tolist(),
                                   plen[data_rows].tolist(), pstart[data_rows].tolist(),
                                   strict=True):
        if next_seq is None:
            next_seq = u
        if u + length <= next_seq:
            if accepted:
                rows.append(r)
                out.retx.append(r)
            else:
                out.skips["TCP retransmission of data already seen"].append(r)
            continue
        trim = 0
        gap = None
        if u < next_seq:
            trim = next_seq - u
        elif u > next_seq:
            gap = f"{u - next_seq} bytes missing from the capture before this segment"
            accepted, broken, pending, fed = False, False, b"", 0
        next_seq = u + length
        ps = start + trim
        pe = start + length
        if broken:
            rows.append(r)
            out.note(r, "lbttcp: stream unusable after an earlier framing error")
            accepted, broken, pending, fed = False, False, b"", 0
            continue
        if not accepted:
            why = entry_test(memoryview(raw)[ps:pe])
            if why is not None:
                out.skips[f"LBT-TCP entry test fails: {why}"].append(r)
                continue
            accepted = True
        rows.append(r)
        if gap:
            out.note(r, gap)
        if r > best:
            best = r
        framing_error = None
        before = len(msg_pos)
        emitted = 0
        if pending:  # finish the straddling message on a copy, then go on in the buffer
            buf = pending + raw[ps:pe]
            pos, end = 0, len(buf)
            while end - pos >= _MIN_FRAME and pos < len(pending):
                msglen = (buf[pos + _MSGLEN_AT] << 8) | buf[pos + _MSGLEN_AT + 1]
                if msglen < _MIN_FRAME:
                    framing_error = (f"lbttcp at offset {fed - len(pending) + pos + _MSGLEN_AT}"
                                     f": msglen {msglen} cannot frame a message; stream cannot "
                                     "resync")
                    break
                if end - pos < msglen:
                    break
                out.extra_pos.append(len(out.extra))
                out.extra_seg.append(best)
                out.extra_order.append(out.in_buffer + len(msg_pos))
                out.extra += buf[pos:pos + msglen]
                emitted += 1
                pos += msglen
            if framing_error is None and pos >= len(pending):
                ps += pos - len(pending)
                pending = b""
            elif framing_error is None:
                pending = bytes(buf[pos:end])
                fed += pe - start - trim
                continue
        pos = ps
        while framing_error is None and pe - pos >= _MIN_FRAME:
            msglen = (raw[pos + _MSGLEN_AT] << 8) | raw[pos + _MSGLEN_AT + 1]
            if msglen < _MIN_FRAME:
                framing_error = (f"lbttcp at offset {fed + pos - start - trim + _MSGLEN_AT}: "
                                 f"msglen {msglen} cannot frame a message; stream cannot resync")
                break
            if pe - pos < msglen:
                break
            msg_pos.append(pos)
            pos += msglen
        count = len(msg_pos) - before
        if count:
            feed_seg.append(best)
            feed_count.append(count)
        fed += pe - start - trim
        if framing_error is None:
            pending = raw[pos:pe]
        elif emitted or count:
            broken, pending = True, b""
        else:
            out.note(r, framing_error)
            accepted, pending, fed = False, b"", 0
    out.add(np.array(rows, np.int64), np.array(msg_pos, np.int64),
            np.repeat(np.array(feed_seg, np.int64), np.array(feed_count, np.int64)))


_WHOLE_DEPTH = 256


def _whole_messages(raw: bytes, starts: np.ndarray, lengths: np.ndarray,
                    ) -> np.ndarray | None:
    """The message starts of back-to-back segments when each holds whole messages only (what
    a sender writing message by message produces): framed breadth first, the ``k``-th message
    of every segment at once, so Python loops over messages per segment, not per stream.

    None when some segment ends inside a message or holds a ``msglen`` below the minimum: the
    caller then frames message by message (the same result wherever both apply)."""
    if not starts.size:
        return np.zeros(0, np.int64)
    bv = ByteView(np.frombuffer(raw, np.uint8))
    ends = starts + lengths
    pos = starts.astype(np.int64)
    active = np.arange(len(starts))
    found: list[np.ndarray] = []
    for _ in range(_WHOLE_DEPTH):
        if not active.size:
            break
        at = pos[active]
        room = ends[active] - at
        if (room < _MIN_FRAME).any():
            return None
        msglen = bv.read(_MSGLEN_DTYPE, at + _MSGLEN_AT).astype(np.int64)
        if (msglen < _MIN_FRAME).any() or (msglen > room).any():
            return None
        found.append(at)
        pos[active] = at + msglen
        active = active[pos[active] < ends[active]]
    else:
        if active.size:
            return None
    return np.sort(np.concatenate(found)) if found else np.zeros(0, np.int64)


def _contiguous_piece(out: _TcpOut, raw: bytes, rows: np.ndarray, useq: np.ndarray,
                      next_seq: int | None, pstart: np.ndarray, plen: np.ndarray) -> bool:
    """The common case in one pass: data segments in capture order, each starting where the
    previous ended (no overlap or retransmission), the first passing the entry test and no
    framing error.  The stream is then one range of the payload buffer, framed by one loop
    over its messages, each attributed to the segment holding its last byte.  Returns False
    (having changed nothing) when a condition fails: the caller then replays the segments
    one by one, which gives the same result in this case."""
    if rows.size > 1 and (np.diff(rows) <= 0).any():
        return False
    lengths = plen[rows]
    starts = pstart[rows]
    if rows.size > 1 and ((useq[1:] != useq[:-1] + lengths[:-1]).any()
                          or (starts[1:] != starts[:-1] + lengths[:-1]).any()):
        return False
    begin = int(starts[0])
    end = begin + int(lengths.sum())
    if entry_test(memoryview(raw)[begin:begin + int(lengths[0])]) is not None:
        return False
    positions: np.ndarray | list[int] | None = _whole_messages(raw, starts, lengths)
    if positions is None:
        found: list[int] = []
        pos = begin
        while end - pos >= _MIN_FRAME:
            msglen = (raw[pos + _MSGLEN_AT] << 8) | raw[pos + _MSGLEN_AT + 1]
            if msglen < _MIN_FRAME:
                return False
            if end - pos < msglen:
                break
            found.append(pos)
            pos += msglen
        positions = found
    if next_seq is not None and int(useq[0]) > next_seq:
        out.note(int(rows[0]), f"{int(useq[0]) - next_seq} bytes missing from the capture "
                 "before this segment")
    first = np.asarray(positions, np.int64)
    last = first + read_member(ByteView(np.frombuffer(raw, np.uint8)), lbmc.CONTROL_BASE,
                               "msglen", first) - 1
    out.add(rows, first, rows[np.searchsorted(starts + lengths, last, side="right")])
    return True


def reassemble_tcp(segments: pa.Table | pa.RecordBatch, options: DecodeOptions | None = None,
                   *, stored: bool = False) -> DecodedTables:
    """Stage 2 (stateful): reassemble and frame LBT-TCP connection directions.

    ``segments`` (:data:`TCP_SEGMENTS_SCHEMA`) must hold *every* segment of each connection
    direction it contains (Spark groups them by :func:`flow_key_columns`); any order.  Returns
    the lbttcp packets (one per segment with payload on a recognised connection), their
    messages and the skipped counts.  With :attr:`DecodeOptions.separate_files` a direction
    is reassembled per file.  With ``stored``, the tables come in the stored form
    (:class:`DecodedTables`).
    """
    options = options or DecodeOptions()
    table = segments if isinstance(segments, pa.Table) else pa.Table.from_batches([segments])
    if table.num_rows == 0:
        return DecodedTables.empty(stored)
    seg = _Segments.of(table, by_file=options.separate_files)
    n = seg.n
    raw = seg.raw
    key_columns = [*FLOW_KEY, "file_rank"] if options.separate_files else list(FLOW_KEY)
    keys = np.stack([seg.ints[k] for k in key_columns], axis=1)
    seq, flags = seg.ints["seq"], seg.ints["tcp_flags"]
    change = np.flatnonzero((keys[1:] != keys[:-1]).any(axis=1)) + 1
    flow_bounds = np.concatenate([[0], change, [n]])
    out = _TcpOut()
    for a, b in zip(flow_bounds[:-1].tolist(), flow_bounds[1:].tolist(), strict=True):
        starts = [a, *(a + np.flatnonzero(flags[a + 1:b] & pcap.TCP_SYN) + 1).tolist(), b]
        for s, e in itertools.pairwise(starts):
            _reassemble_epoch(out, raw, np.arange(s, e), seq, flags, seg.pstart, seg.plen)
    transport = (_in(seg.ints["src_port"], options.ports.lbttcp_source)
                 | _in(seg.ints["dst_port"], options.ports.lbttcp_source))
    tables = _tcp_tables(seg, out, transport, stored)
    return tables if stored else tables.public()


@dataclass
class _Segments:
    """A stage-2 input sorted by flow, then time, file and offset, read into numpy.

    Only the sort order is computed on the table (from its key columns); the payloads are
    gathered once into a buffer in that order, so a flow's in-order segments lie back to back
    (what the one-pass framing of :func:`_contiguous_piece` needs), and the identity columns of
    the output are rebuilt from the ``order`` positions, never by sorting every column."""

    n: int
    table: pa.Table  # the input, unsorted
    order: np.ndarray  # sorted position -> input row
    ints: dict[str, np.ndarray]  # sorted numeric columns
    raw: bytes  # payloads in sorted order
    pstart: np.ndarray
    plen: np.ndarray
    file_codes: np.ndarray  # input row -> index into file_names
    file_names: pa.Array

    @classmethod
    def of(cls, table: pa.Table, by_file: bool = False) -> _Segments:
        """Sorted by flow, then time, file and offset; with ``by_file`` by file first (each
        file's flows apart, ``ints["file_rank"]`` tells them apart)."""
        def ints(name: str, null: int = 0) -> np.ndarray:
            col = table.column(name)
            if col.null_count:
                col = col.fill_null(null)
            return numpy_of(col).astype(np.int64)

        files = encode_files(table.column("file"))
        names = files.dictionary.to_pylist()
        rank = np.empty(len(names), np.int64)
        rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
        file_rank = rank[numpy_of(files.indices)]
        columns = {k: ints(k) for k in (*FLOW_KEY, "seq", "tcp_flags", "file_offset")}
        # nulls sort last, as in Table.sort_by
        ts = ints("ts_ns", np.iinfo(np.int64).max)
        # (address, port) as one 48-bit number sorts like the pair: five sort keys, not seven
        src_ip, src_port, dst_ip, dst_port = (columns[k] for k in FLOW_KEY)
        keys = [columns["file_offset"], ts, (dst_ip << 16) | dst_port,
                (src_ip << 16) | src_port]
        if len(names) > 1:
            keys.insert(1, file_rank)
            if by_file:  # the most significant key
                keys.append(file_rank)
        columns["file_rank"] = file_rank
        order = np.lexsort(keys)
        raw, pstart, plen = _gather_sorted(table.column("payload"), order)
        file_codes = numpy_of(files.indices).astype(np.int64)
        return cls(len(order), table, order, {k: v[order] for k, v in columns.items()},
                   raw, pstart, plen, file_codes, files.dictionary)

    def files(self, input_rows: np.ndarray) -> pa.Array:
        """The ``file`` column of input rows (a constant when there is one file)."""
        if len(self.file_names) == 1:
            return _constant(self.file_names[0].as_py(), len(input_rows))
        return pa.DictionaryArray.from_arrays(
            arrow_array(self.file_codes[input_rows], pa.int32()), self.file_names)

    def identity(self, rows: np.ndarray) -> dict[str, pa.Array]:
        """The identity columns of sorted positions ``rows``."""
        take = self.order[rows]
        src = self.ints["src_ip_int"][rows]
        dst = self.ints["dst_ip_int"][rows]
        ts = self.table.column("ts_ns")
        return {
            "file": self.files(take),
            "file_offset": arrow_array(self.ints["file_offset"][rows], pa.int64()),
            "ts_ns": _flat(pc.take(ts.combine_chunks() if ts.num_chunks != 1 else ts,
                                   arrow_array(take))),
            "protocol": _constant("lbttcp", len(rows)),
            "src_ip": _ipv4_strings(src),
            "src_port": arrow_array(self.ints["src_port"][rows].astype(np.int32)),
            "dst_ip": _ipv4_strings(dst),
            "dst_port": arrow_array(self.ints["dst_port"][rows].astype(np.int32)),
            "src_ip_int": arrow_array(src, pa.int64()),
            "dst_ip_int": arrow_array(dst, pa.int64()),
        }


def _gather_sorted(column: pa.ChunkedArray | pa.Array, order: np.ndarray,
                   ) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The values of a binary column in ``order``, back to back: (bytes, starts, lengths).

    Copied run by run: consecutive positions whose values are adjacent in the same Arrow
    buffer are one slice (stage 1 ships each flow's payloads adjacent, so a flow is a few
    long runs); without such runs it falls back to the vectorised byte gather."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [_Binary.of(c) for c in chunks if len(c)]
    if not parts:
        empty = np.zeros(0, np.int64)
        return b"", empty, empty.copy()
    chunk_of = np.concatenate([np.full(len(p.starts), i, np.int64) for i, p in enumerate(parts)])
    starts = np.concatenate([p.starts for p in parts])[order]
    lengths = np.concatenate([p.lengths for p in parts])[order]
    chunk_of = chunk_of[order]
    ends = starts + lengths
    n = len(order)
    new_run = np.ones(n, bool)
    new_run[1:] = (starts[1:] != ends[:-1]) | (chunk_of[1:] != chunk_of[:-1])
    first = np.flatnonzero(new_run)
    offsets = _running_offsets(lengths)
    if len(first) * 8 > n and len(parts) == 1:
        values, _ = _gather_ranges(parts[0].bv.data, starts, lengths)
        return values.tobytes(), offsets[:-1], lengths.astype(np.int64)
    last = np.append(first[1:], n) - 1
    views = [p.bv.data.data for p in parts]
    raw = b"".join([views[c][a:b] for c, a, b in zip(
        chunk_of[first].tolist(), starts[first].tolist(), ends[last].tolist(), strict=True)])
    return raw, offsets[:-1], lengths.astype(np.int64)


def _flat(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        return array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    return array


def _tcp_tables(seg: _Segments, out: _TcpOut, transport: np.ndarray, stored: bool,
                ) -> DecodedTables:
    n = seg.n
    raw = seg.raw
    combined = np.frombuffer(raw + bytes(out.extra), np.uint8)
    bv = ByteView(combined)
    # messages in completion order: the buffer ones, with the straddling ones slotted in
    nothing = np.zeros(0, np.int64)
    in_buffer = np.concatenate([nothing, *out.pos_parts])
    buffer_seg = np.concatenate([nothing, *out.owner_parts])
    extra_at = np.array(out.extra_order, np.int64)
    start = np.insert(in_buffer, extra_at, np.array(out.extra_pos, np.int64) + len(raw))
    owner_of = np.insert(buffer_seg, extra_at, np.array(out.extra_seg, np.int64))
    length = read_member(bv, lbmc.CONTROL_BASE, "msglen", start) if start.size else start
    msgs = decode_lbmc(bv, start, start + length, single=True)
    owner = owner_of[msgs.region]
    # the message's index among those its segment made deliverable
    index = (np.arange(msgs.count) - np.searchsorted(owner, owner, side="left")
             if msgs.count else np.zeros(0, np.int64))
    for i in np.flatnonzero(msgs.err != 0).tolist():
        out.note(int(owner[i]), f"lbttcp message {int(index[i])}: {msgs.error_text(i)}")

    rows = np.sort(np.concatenate([nothing, *out.row_parts]))
    columns = seg.identity(rows)
    columns["classified_by"] = _constant("port", len(rows))
    columns["payload_length"] = arrow_array(seg.plen[rows].astype(np.int32))
    columns["tcp_seq"] = arrow_array(seg.ints["seq"][rows], pa.int64())
    columns["retransmission"] = arrow_array(np.isin(rows, np.array(out.retx, np.int64)))
    ok = msgs.err == 0
    columns["messages"] = arrow_array(np.bincount(owner[ok], minlength=n)[rows], pa.int32())
    if out.reason:
        at = np.searchsorted(rows, np.fromiter(out.reason.keys(), np.int64, len(out.reason)))
        columns["malformed_reason"] = _sparse_strings(
            len(rows), dict(zip(at.tolist(), out.reason.values(), strict=True)))
    packets = _table(_PACKETS_D, len(rows), columns)
    mident = {k: v for k, v in seg.identity(owner).items() if k in MESSAGES_SCHEMA.names}
    messages, headers = _messages_table(bv, msgs, mident, transport[owner], msg_index=index,
                                        stored=stored)
    skips = _Skips()
    for reason, skipped_rows in sorted(out.skips.items()):
        skips.add(seg.order[np.array(skipped_rows, np.int64)], reason)
    skipped = skips.table(seg.files(np.arange(n)),
                          numpy_of(seg.table.column("file_offset")).astype(np.int64))
    return DecodedTables(packets, messages, empty_table(_ADVERTISEMENTS_D), skipped,
                         empty_table(_TCP_SEGMENTS_D), headers)


# =============================================================================================
# Whole captures in one process, and frame batches for tests
# =============================================================================================


def decode_batches(batches: Iterable[pa.RecordBatch | pa.Table],
                   options: DecodeOptions | None = None) -> DecodedTables:
    """Both stages in one process: every batch through :func:`decode_batch`, then the TCP
    segments of all batches through :func:`reassemble_tcp` (connections may span batches)."""
    options = options or DecodeOptions()
    parts = [decode_batch(b, options) for b in batches]
    first = concat_tables(parts) if parts else DecodedTables.empty()
    second = reassemble_tcp(first.tcp_segments, options)
    return concat_tables([
        DecodedTables(first.packets, first.messages, first.advertisements, first.skipped,
                      empty_table(TCP_SEGMENTS_SCHEMA)),
        second,
    ])


def frames_batch(records: Iterable[pcap.CaptureRecord], file: str,
                 offsets: Sequence[int] | None = None) -> pa.RecordBatch:
    """A frame batch (:data:`FRAME_SCHEMA`) from :func:`wire.pcap.read_capture` records.

    For tests and small tools (Spark reads captures with ``spark.read.format("pcap")``).
    ``offsets`` are the records' byte offsets in the file; by default they are computed for a
    classic pcap file (24-byte file header, 16-byte record headers), which is what the test
    captures are.  Timestamps become integer nanoseconds from the float seconds' shortest
    decimal form (exact for microsecond and nanosecond captures of today's dates).
    """
    recs = list(records)
    if offsets is None:
        offsets, pos = [], 24
        for rec in recs:
            offsets.append(pos)
            pos += 16 + len(rec.data)
    return pa.RecordBatch.from_arrays([
        arrow_array([file] * len(recs), pa.string()),
        arrow_array(list(offsets), pa.int64()),
        arrow_array([int(Decimal(repr(rec.ts)).scaleb(9).to_integral_value()) for rec in recs],
                    pa.int64()),
        arrow_array([len(rec.data) for rec in recs], pa.int32()),
        arrow_array([rec.orig_len for rec in recs], pa.int32()),
        arrow_array([rec.linktype for rec in recs], pa.int32()),
        arrow_array([0] * len(recs), pa.int32()),
        arrow_array([rec.data for rec in recs], pa.binary()),
    ], schema=FRAME_SCHEMA)


def frames_batch_from_capture(path: str | Path) -> pa.RecordBatch:
    """Every frame of a classic pcap file as one frame batch (see :func:`frames_batch`).

    pcapng files are refused: their record offsets are not computable from the records
    alone; :func:`spark_analysis.splits.read_table` reads any capture with exact offsets."""
    with open(path, "rb") as fh:
        head = fh.read(4)
    if len(head) == 4 and struct.unpack("<I", head)[0] == pcap.PCAPNG_SHB:
        raise ValueError(f"{path} is pcapng: use spark_analysis.splits.read_table() for it")
    return frames_batch(pcap.read_capture(path), str(path))
