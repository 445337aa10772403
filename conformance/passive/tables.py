"""The observed model of a big capture, from the columnar decode's tables.

Dissecting a capture frame by frame in Python (:func:`conformance.passive.observe.observe`)
costs tens of microseconds a frame: minutes for a million.  ``ump analyze``'s columnar decode
(:mod:`spark_analysis.columnar`: whole batches of frames at once, the LBT-TCP streams
reassembled per connection) does the same capture in seconds, in this process or in Spark.
This module turns its tables into the *same* :class:`~conformance.passive.observe.Observed`:

* :func:`decode_tables` decodes captures in-process into :class:`CaptureTables` (the
  columns the judges need of ``packets``, ``messages`` and ``advertisements``, and every
  file's record offsets, which number the frames); :mod:`conformance.passive.spark_tables`
  collects the same tables from a Spark decode;
* :func:`observe_tables` folds them into an ``Observed`` with the observation's own builder
  (:class:`conformance.passive.observe._Builder`): every LBMC message goes through the same
  ``message`` rule as a dissected one, with its header columns named as tshark names them
  (the columns carry those names, :class:`spark_analysis.schemas.ColumnPart`), every LBT-RM /
  LBT-RU packet through the same ``transport`` rule and every TIR through ``tir``.  So there
  is one definition of what the wire says to the judges, whichever decoder read it;
* :func:`observe_columnar` is the whole in-process path, with the store ports the capture
  names found as :func:`~conformance.passive.observe.observe` finds them.

Where the two decoders differ (:mod:`spark_analysis.columnar` lists it), this path follows
the columnar decode: LBT-TCP segments are reassembled in sequence order (the same as capture
order in a capture without reordering).  A frame whose packet the columnar decode marks
malformed is a malformed frame, none of its messages is used, as the Dissector does.
Timestamps are the pcap reader's (seconds plus the fraction in the file's resolution), so
times compare exactly as in the frame-by-frame path.
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from conformance.passive.observe import (
    DATA_KINDS,
    STORE_PORT_FIELDS,
    TRANSPORT_KINDS,
    Observed,
    _Builder,
)
from wire.errors import WireError
from wire.lbmc import EXTOPT_CODE
from wire.tshark import PortMap

MESSAGE_COLUMNS = ("file", "file_offset", "ts_ns", "protocol", "src_ip", "src_port", "dst_ip",
                   "dst_port", "msg_index", "type", "tidx", "sqn", "topic_name",
                   "payload_length", "header_codes", "malformed_reason")
"""The core columns of ``messages`` the observation reads."""

HEADER_COLUMNS = ("ume_preg", "ume_preg_resp", "ume_ack", "ume_rxreq", "ume_keepalive",
                  "ume_client_lifetime", "ume_sid", "sri", "ume_store_ext", "topic_idx")
"""The typed header columns of ``messages`` whose fields :meth:`_Builder.message` reads."""

PACKET_COLUMNS = ("file", "file_offset", "ts_ns", "protocol", "src_ip", "src_port", "dst_ip",
                  "dst_port", "packet_type", "sqn", "lead_sqn", "session_id", "ucast_port",
                  "retransmission", "nak_sqns", "ncf_sqns", "malformed_reason")
"""The columns of ``packets`` the observation reads."""

ADVERT_COLUMNS = ("file", "file_offset", "ts_ns", "record", "topic", "transport",
                  "source_ip", "source_port", "topt_ume", "topt_ume_store")
"""The columns of ``advertisements`` the observation reads."""

TIR_TRANSPORTS = ("tcp", "lbtru", "lbtrm")
"""The TIR transports whose source address the observation uses (as ``tir_fields``)."""


@dataclass
class CaptureTables:
    """What the judges need of the columnar decode of some captures.

    Attributes:
        files: the capture files, in the order given.
        names: each file's name in the tables' ``file`` column (the capture reader's).
        packets / messages / advertisements: the decode's tables, the columns above.
        offsets: per file, the byte offset of every record in capture order: frame ``n`` of
            a file is its record ``n - 1``.
        tick_ns: per file, the timestamp resolution in ns (pcap: 1000 or 1; pcapng: 0, the
            time is then taken as ``ts_ns`` seconds).
        end_time: the time of the last frame (UM or not).
        problems: what limits the judgement (a damaged end).
    """

    files: list[Path]
    names: list[str]
    packets: pa.Table
    messages: pa.Table
    advertisements: pa.Table
    offsets: dict[str, np.ndarray]
    tick_ns: dict[str, int]
    end_time: float = 0.0
    problems: list[str] = field(default_factory=list)

    def store_ports(self) -> set[int]:
        """The store TCP ports the capture's TIRs and SRIs name (``STORE_PORT_FIELDS``)."""
        found: set[int] = set()
        wanted = {name.rsplit(".", 1)[0] for name in STORE_PORT_FIELDS}
        for table, column in ((self.advertisements, "topt_ume"),
                              (self.advertisements, "topt_ume_store"),
                              (self.messages, "ume_store_ext")):
            if column not in table.column_names:
                continue
            values = table.column(column)
            if pa.types.is_list(values.type):
                values = pc.list_flatten(values)
            if not {t.rsplit(".", 1)[0] for _, t in _tshark_names(column)} & wanted:
                continue
            ports = pc.struct_field(values, "store_tcp_port")
            found |= {int(p) for p in pc.unique(ports).to_pylist() if p}
        return found


def _tshark_names(column: str) -> list[tuple[str, str]]:
    """(field, tshark name) of a struct column of ``messages`` or ``advertisements``, from
    the decode's schema (the names travel as Arrow field metadata, which a Spark round trip
    drops)."""
    from spark_analysis.schemas import ADVERTISEMENTS_SCHEMA, MESSAGES_SCHEMA

    schema = MESSAGES_SCHEMA if column in MESSAGES_SCHEMA.names else ADVERTISEMENTS_SCHEMA
    kind = schema.field(column).type
    struct = kind.value_type if pa.types.is_list(kind) else kind
    return [(f.name, f.metadata[b"tshark"].decode()) for f in struct
            if f.metadata and b"tshark" in f.metadata]


@dataclass
class Records:
    """What reading the captures' records tells, whoever decodes them (:func:`read_records`):
    each file's name in the tables, its record offsets (the frame numbers) and time
    resolution, the last frame's time and a damaged end."""

    names: list[str] = field(default_factory=list)
    offsets: dict[str, np.ndarray] = field(default_factory=dict)
    tick_ns: dict[str, int] = field(default_factory=dict)
    end_time: float = 0.0
    problems: list[str] = field(default_factory=list)


def read_records(paths: Sequence[Path], records: Records,
                 each: Callable[[str, Any], None] | None = None) -> None:
    """Read every record of ``paths`` with the decode's capture reader
    (:class:`spark_analysis.splits.SplitReader`), noting them in ``records`` and handing each
    chunk to ``each(name, chunk)``.

    Raises :class:`WireError` when a file is not a capture at all."""
    from spark_analysis.capture_files import CaptureError, PcapInfo
    from spark_analysis.splits import SplitReader, TruncatedRecord, plan

    for path in paths:
        truncated: list[TruncatedRecord] = []
        file_offsets: list[np.ndarray] = []
        name = str(path)
        try:
            for split in plan([str(path)], 1 << 62):
                name = split.capture.name
                info = split.capture.info
                records.tick_ns[name] = info.tick_ns if isinstance(info, PcapInfo) else 0
                reader = SplitReader(split, on_truncated=truncated.append)
                for chunk in reader.chunks():
                    file_offsets.append(np.asarray(chunk.offset, np.int64))
                    if len(chunk):
                        last = np.asarray([chunk.ts_ns.max()], np.int64)
                        records.end_time = max(records.end_time, float(
                            _times(last, records.tick_ns[name])[0]))
                    if each is not None:
                        each(name, chunk)
        except (CaptureError, OSError) as exc:
            reason = str(exc).removeprefix(f"{path}: ")
            if not file_offsets:
                raise WireError("pcap", 0, f"{path}: not a readable capture: {reason}") from None
            records.problems.append(f"{path} is damaged after frame "
                                    f"{sum(len(o) for o in file_offsets)}: {reason}")
        records.names.append(name)
        records.offsets[name] = (np.concatenate(file_offsets) if file_offsets
                                 else np.zeros(0, np.int64))
        if truncated:
            records.problems.append(f"{path} is damaged after frame "
                                    f"{len(records.offsets[name])}: {truncated[0]}")


def capture_tables(paths: Sequence[Path], records: Records, packets: pa.Table,
                   messages: pa.Table, advertisements: pa.Table) -> CaptureTables:
    """The :class:`CaptureTables` of decoded tables (the columns the observation reads)."""
    return CaptureTables(
        [Path(p) for p in paths], records.names,
        packets.select(list(PACKET_COLUMNS)),
        messages.select([c for c in (*MESSAGE_COLUMNS, *HEADER_COLUMNS)
                         if c in messages.column_names]),
        advertisements.select(list(ADVERT_COLUMNS)),
        records.offsets, records.tick_ns, records.end_time, records.problems)


def decode_tables(paths: Sequence[Path], ports: PortMap, content: bool = True) -> CaptureTables:
    """The columnar decode of ``paths`` in this process (both stages, as
    :func:`spark_analysis.columnar.decode_batches`, chunk by chunk from the capture reader).

    Raises :class:`WireError` when the first file is not a capture at all."""
    from spark_analysis.columnar import decode_chunk, reassemble
    from spark_analysis.schemas import DecodedTables, DecodeOptions, concat_tables

    options = DecodeOptions(ports=ports, content_heuristics=content)
    parts: list[DecodedTables] = []
    records = Records()
    read_records(paths, records,
                 lambda name, chunk: parts.append(decode_chunk(name, chunk, options)))
    first = concat_tables(parts) if parts else DecodedTables.empty()
    second = reassemble(first.tcp_segments, options)
    both = concat_tables([
        DecodedTables(first.packets, first.messages, first.advertisements, first.skipped,
                      second.tcp_segments), second])
    return capture_tables(paths, records, both.packets, both.messages, both.advertisements)


Decode = Callable[[Sequence[Path], PortMap, bool], CaptureTables]
"""A columnar decode of captures: :func:`decode_tables` (in-process) or
:func:`conformance.passive.spark_tables.decode_tables_spark`."""


def observe_columnar(paths: Iterable[str | Path], ports: PortMap | None = None,
                     content: bool = True, decode: Decode | None = None) -> Observed:
    """:func:`conformance.passive.observe.observe` through a columnar decode (by default
    :func:`decode_tables`): the same ``Observed`` (module docstring), in seconds for a million
    frames.  Store ports the capture names and ``ports`` lacks are added and the capture
    decoded again, as :func:`~conformance.passive.observe.observe` does."""
    files = [Path(p) for p in paths]
    ports = ports or PortMap()
    decode = decode or decode_tables
    tables = decode(files, ports, content)
    named = tables.store_ports()
    if named - set(ports.store_ports):
        ports = replace(ports, store_ports=sorted({*ports.store_ports, *named}))
        tables = decode(files, ports, content)
        observed = observe_tables(tables, ports.store_ports)
        observed.notes.insert(0, "store ports taken from the capture's TIRs and SRIs: "
                              + ", ".join(str(p) for p in sorted(named)))
        return observed
    return observe_tables(tables, ports.store_ports)


# --- tables -> Observed ------------------------------------------------------------------------


def _column(table: pa.Table, name: str) -> list[Any]:
    """A column as Python values; strings through their dictionary (a capture has few
    addresses, and one Python string per distinct value is much cheaper)."""
    column = table.column(name)
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        column = pc.dictionary_encode(column)
    if pa.types.is_dictionary(column.type):
        chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
        out: list[Any] = []
        for chunk in chunks:
            words = chunk.dictionary.to_pylist()
            codes = chunk.indices.fill_null(-1).to_numpy(zero_copy_only=False)
            words.append(None)
            out.extend([words[c] for c in codes.tolist()])
        return out
    return column.to_pylist()


def _times(ts_ns: np.ndarray, tick_ns: int) -> np.ndarray:
    """Seconds as :func:`wire.pcap.read_capture` computes them: whole seconds plus the
    fraction in the file's resolution (pcapng: nanoseconds)."""
    sec = ts_ns // 1_000_000_000
    frac = ts_ns % 1_000_000_000
    if tick_ns == 1000:
        return sec + (frac // 1000) * 1e-6
    if tick_ns == 1:
        return sec + frac * 1e-9
    return ts_ns * 1e-9


class _Frames:
    """Frame numbers and times of table rows (``file``, ``file_offset``, ``ts_ns``)."""

    def __init__(self, tables: CaptureTables) -> None:
        self.tables = tables
        self.order = {name: i for i, name in enumerate(tables.names)}

    def of(self, table: pa.Table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(file index, frame number, time) of every row."""
        n = table.num_rows
        file_idx = np.zeros(n, np.int64)
        number = np.zeros(n, np.int64)
        times = np.zeros(n, np.float64)
        if not n:
            return file_idx, number, times
        files = table.column("file")
        off = table.column("file_offset").to_numpy()
        ts = table.column("ts_ns").to_numpy()
        for name in pc.unique(files).to_pylist():
            rows = np.flatnonzero(pc.equal(files, name).to_numpy(zero_copy_only=False))
            file_idx[rows] = self.order.get(name, len(self.order))
            number[rows] = np.searchsorted(self.tables.offsets.get(name, np.zeros(0, np.int64)),
                                           off[rows]) + 1
            times[rows] = _times(ts[rows], self.tables.tick_ns.get(name, 0))
        return file_idx, number, times


def _struct_rows(table: pa.Table, name: str, rows: np.ndarray) -> list[list[tuple[str, Any]]]:
    """The fields of header column ``name`` at ``rows`` (every row has it), named as tshark
    names them; a repeated header gives its occurrences in order, field by field."""
    column = table.column(name).combine_chunks().take(pa.array(rows, pa.int64()))
    repeated = pa.types.is_list(column.type)
    names = _tshark_names(name)
    if repeated:
        out: list[list[tuple[str, Any]]] = []
        for value in column.to_pylist():
            fields: list[tuple[str, Any]] = []
            for entry in value or ():
                fields.extend((tshark, _plain(entry[member])) for member, tshark in names)
            out.append(fields)
        return out
    values = [[_plain(v) for v in pc.struct_field(column, member).to_pylist()]
              for member, _ in names]
    tsharks = [tshark for _, tshark in names]
    return [list(zip(tsharks, row, strict=True)) for row in zip(*values, strict=True)]


def _plain(value: Any) -> Any:
    """A column value as the dissector gives it (wide integers come as decimals)."""
    return int(value) if isinstance(value, Decimal) else value


def _keys(idx: np.ndarray, number: np.ndarray) -> np.ndarray:
    """One integer per (file index, frame number)."""
    return idx.astype(np.int64) * (1 << 40) + number


def _malformed(tables: CaptureTables, frames: _Frames) -> dict[tuple[int, int], str]:
    """(file index, frame) -> why, for every frame the columnar decode calls malformed."""
    out: dict[tuple[int, int], str] = {}
    for table in (tables.packets, tables.messages):
        reasons = table.column("malformed_reason")
        bad = np.flatnonzero(reasons.is_valid().to_numpy(zero_copy_only=False))
        if not bad.size:
            continue
        sub = table.take(pa.array(bad, pa.int64()))
        idx, number, _ = frames.of(sub)
        for i, n, why in zip(idx.tolist(), number.tolist(), _column(sub, "malformed_reason"),
                             strict=True):
            out.setdefault((i, n), why)
    return out


def observe_tables(tables: CaptureTables, store_ports: Sequence[int] = ()) -> Observed:
    """The :class:`Observed` of the decoded ``tables`` (module docstring).

    The collector is off meanwhile: a million new objects that all stay alive would run its
    full collections again and again for nothing (a third of the time measured)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _observe_tables(tables, store_ports)
    finally:
        if enabled:
            gc.enable()


def _observe_tables(tables: CaptureTables, store_ports: Sequence[int]) -> Observed:
    observed = Observed(list(tables.files))
    observed.store_ports = list(store_ports)
    observed.problems.extend(tables.problems)
    observed.frames = sum(len(o) for o in tables.offsets.values())
    observed.end_time = tables.end_time
    builder = _Builder(observed)
    frames = _Frames(tables)
    malformed = _malformed(tables, frames)
    for (_, number), why in sorted(malformed.items()):
        builder.malformed(number, why)
    bad = np.array(sorted(_keys(np.array([i]), np.array([n]))[0] for i, n in malformed),
                   np.int64)

    pk, m, a = tables.packets, tables.messages, tables.advertisements
    p_idx, p_num, p_time = frames.of(pk)
    m_idx, m_num, m_time = frames.of(m)
    a_idx, a_num, _ = frames.of(a)
    p_key, m_key = _keys(p_idx, p_num), _keys(m_idx, m_num)
    good_p = ~np.isin(p_key, bad) if bad.size else np.ones(len(p_key), bool)
    good_m = ~np.isin(m_key, bad) if bad.size else np.ones(len(m_key), bool)

    # every UM frame once (a packet row per UDP datagram and per TCP segment with payload),
    # in capture order; the frames that carry (complete) an LBMC message are heard
    frame_keys, first = np.unique(p_key[good_p], return_index=True)
    rows = np.flatnonzero(good_p)[first]
    lbmc = np.isin(frame_keys, m_key[good_m])
    observed.um_frames += int(len(rows) - lbmc.sum())
    heard = rows[lbmc]
    if heard.size:
        sub = pk.take(pa.array(heard, pa.int64()))
        src = list(zip(_column(sub, "src_ip"), _column(sub, "src_port"), strict=True))
        dst = list(zip(_column(sub, "dst_ip"), _column(sub, "dst_port"), strict=True))
        um = builder.um
        for i, n, t in zip(range(len(heard)), p_num[heard].tolist(), p_time[heard].tolist(),
                           strict=True):
            um((n, t), src[i], dst[i], True)

    _transport_rows(builder, pk, np.lexsort((p_num, p_idx)), good_p, p_num, p_time)
    _tir_rows(builder, a, np.lexsort((a_num, a_idx)))
    _message_rows(builder, m, np.lexsort((m.column("msg_index").to_numpy(), m_num, m_idx)),
                  good_m, m_num, m_time)
    return observed


def _transport_rows(builder: _Builder, pk: pa.Table, order: np.ndarray, good: np.ndarray,
                    number: np.ndarray, times: np.ndarray) -> None:
    """The LBT-RM / LBT-RU packets through :meth:`_Builder.transport`, in capture order."""
    kinds = set(TRANSPORT_KINDS.values())
    ptype = _column(pk, "packet_type")
    proto = _column(pk, "protocol")
    rows = [r for r in order.tolist() if good[r] and proto[r] in ("lbtrm", "lbtru")
            and ptype[r] in kinds]
    if not rows:
        return
    cols = {c: _column(pk, c) for c in ("src_ip", "src_port", "dst_ip", "dst_port", "sqn",
                                        "lead_sqn", "session_id", "ucast_port",
                                        "retransmission")}
    listed = {r: v for c in ("nak_sqns", "ncf_sqns")
              for r, v in _sparse(pk, c)}
    num, tim = number.tolist(), times.tolist()
    transport = builder.transport
    for r in rows:
        transport((num[r], tim[r]), proto[r], ptype[r], (cols["src_ip"][r], cols["src_port"][r]),
                  (cols["dst_ip"][r], cols["dst_port"][r]), ucast_port=cols["ucast_port"][r] or 0,
                  session_id=cols["session_id"][r] or 0, rx=bool(cols["retransmission"][r]),
                  sqn=cols["sqn"][r] or 0, lead=cols["lead_sqn"][r] or 0,
                  listed=list(listed.get(r) or ()))


def _sparse(table: pa.Table, name: str) -> list[tuple[int, Any]]:
    """(row, value) of the rows where column ``name`` is set."""
    column = table.column(name)
    at = np.flatnonzero(column.is_valid().to_numpy(zero_copy_only=False))
    if not at.size:
        return []
    return list(zip(at.tolist(), column.take(pa.array(at, pa.int64())).to_pylist(), strict=True))


def _tir_rows(builder: _Builder, a: pa.Table, order: np.ndarray) -> None:
    """TIRs, one per packet only (``tir_fields``: several TIRs in one packet are skipped)."""
    if not a.num_rows:
        return
    record = _column(a, "record")
    per_packet: dict[tuple[str, int], int] = {}
    files, offs = _column(a, "file"), _column(a, "file_offset")
    for i in range(a.num_rows):
        if record[i] == "tir":
            per_packet[(files[i], offs[i])] = per_packet.get((files[i], offs[i]), 0) + 1
    topic, transport = _column(a, "topic"), _column(a, "transport")
    sip, sport = _column(a, "source_ip"), _column(a, "source_port")
    ume = _column(a, "topt_ume")
    for r in order.tolist():
        if record[r] != "tir" or per_packet[(files[r], offs[r])] != 1:
            continue
        where = (sip[r], sport[r]) if transport[r] in TIR_TRANSPORTS and isinstance(
            sip[r], str) and isinstance(sport[r], int) else None
        opt = ume[r]
        request = None
        if opt is not None and isinstance(opt.get("src_tcp_addr"), str) and isinstance(
                opt.get("src_tcp_port"), int):
            request = (opt["src_tcp_addr"], opt["src_tcp_port"])
        builder.tir(topic[r], where, request)


def _valid(column: pa.ChunkedArray) -> np.ndarray:
    valid = column.is_valid().to_numpy(zero_copy_only=False)
    if pa.types.is_list(column.type):
        valid &= pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False) > 0
    return valid


def _message_rows(builder: _Builder, m: pa.Table, order: np.ndarray, good: np.ndarray,
                  number: np.ndarray, times: np.ndarray) -> None:
    """Every LBMC message through the builder's rules, in capture order: a message with only
    a ``ume_ack`` header straight to :meth:`_Builder.ack`, one of a data type with none to
    :meth:`_Builder.data` (the branches :meth:`_Builder.message` takes for them), every other
    one through :meth:`_Builder.message` with the fields it reads."""
    n = m.num_rows
    if not n:
        return
    present = {name: _valid(m.column(name)) for name in HEADER_COLUMNS
               if name in m.column_names}
    headers = np.zeros(n, np.int64)
    for valid in present.values():
        headers += valid
    topic = m.column("topic_name").is_valid().to_numpy(zero_copy_only=False)
    types = m.column("type").to_numpy(zero_copy_only=False)
    has_sqn = m.column("sqn").is_valid().to_numpy(zero_copy_only=False)
    data_type = np.isin(types, list(DATA_KINDS))
    ack = present.get("ume_ack", np.zeros(n, bool))
    route = np.zeros(n, np.int8)  # 0: message(), 1: data(), 2: ack()
    route[(headers == 0) & ~topic & data_type & has_sqn] = 1
    route[(headers == 1) & ack & ~topic] = 2

    generic = np.flatnonzero((route == 0) & good)
    fields: dict[int, list[tuple[str, Any]]] = {}
    codes: dict[int, Any] = dict(_sparse(m, "header_codes")) if generic.size else {}
    if generic.size:
        sub = m.take(pa.array(generic, pa.int64()))
        for r, t, x, q, name in zip(generic.tolist(), _column(sub, "type"), _column(sub, "tidx"),
                                    _column(sub, "sqn"), _column(sub, "topic_name"), strict=True):
            f: list[tuple[str, Any]] = [("lbmc.type", t)]
            if x is not None:
                f += [("lbmc.tidx", x), ("lbmc.sqn", q)]
            if name is not None:
                f.append(("lbmc.topicname.topic", name))
            if EXTOPT_CODE in (codes[r] or ()):
                f.append(("lbmc.extopt", True))  # its options are not in the tables
            fields[r] = f
        for column in present:
            at = np.flatnonzero(_valid(sub.column(column)))
            for i, extra in zip(at.tolist(), _struct_rows(sub, column, at), strict=True):
                fields[int(generic[i])].extend(extra)

    proto = _column(m, "protocol")
    sip, sport = _column(m, "src_ip"), _column(m, "src_port")
    dip, dport = _column(m, "dst_ip"), _column(m, "dst_port")
    tidx, sqn = m.column("tidx").to_pylist(), m.column("sqn").to_pylist()
    acks = np.flatnonzero(route == 2)
    ack_fields: dict[int, tuple[Any, ...]] = {}
    if acks.size:
        sub = m.column("ume_ack").combine_chunks().take(pa.array(acks, pa.int64()))
        ack_fields = dict(zip(acks.tolist(), zip(*(
            pc.struct_field(sub, member).to_pylist()
            for member in ("type", "seqnum", "rcv_reg_id", "id_2", "flags")), strict=True),
            strict=True))
    num, tim, kinds = number.tolist(), times.tolist(), types.tolist()
    sizes = m.column("payload_length").to_numpy(zero_copy_only=False).tolist()
    routes = route.tolist()
    message, data, ack_rule = builder.message, builder.data, builder.ack
    addrs: dict[tuple[Any, Any], tuple[Any, Any]] = {}
    for r in order[good[order]].tolist():
        where = (num[r], tim[r])
        src = addrs.setdefault((sip[r], sport[r]), (sip[r], sport[r]))
        dst = addrs.setdefault((dip[r], dport[r]), (dip[r], dport[r]))
        how = routes[r]
        if how == 1:
            data(where, src, dst, kinds[r], tidx[r], sqn[r], proto[r], sizes[r])
        elif how == 2:
            ack_rule(where, src, dst, *ack_fields[r])
        else:
            message(where, proto[r], fields[r], src, dst, sizes[r])
