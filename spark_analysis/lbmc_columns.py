"""LBMC messages, column-wise: framing, header chains, typed header columns.

:func:`decode_lbmc` walks the LBMC messages of many payload regions at once (breadth first:
iteration ``k`` reads the ``k``-th message, then the ``k``-th extended header, of every
region that still has one; the deep tail finishes in a scalar loop) with the acceptance
rules of :func:`wire.lbmc.parse_message`.  :func:`messages_table` builds the ``messages``
table and the typed header columns (:data:`spark_analysis.schemas.MESSAGE_HEADER_COLUMNS`)
from the result.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from wire import lbmc
from wire.fastpath import derive

from .arrow_build import (
    ByteView,
    arrow_array,
    dictionary_strings,
    ipv4_strings,
    list_offsets,
    masked_array,
    null_array,
    numpy_of,
    read_members,
    sparse_strings,
    table_of,
    text_array,
    with_nulls,
)
from .schemas import (
    HEADER_TABLE_PREFIX,
    HEADER_TABLES_STORED,
    LBMC_TYPE_NAMES,
    MESSAGE_CORE_STORED,
    MESSAGE_HEADER_COLUMNS,
    MESSAGE_KEY,
    MESSAGES_STORED_WIDE,
    ColumnPart,
    HeaderColumn,
    parts_struct_type,
)


def _convert(part: ColumnPart, raw: np.ndarray) -> pa.Array:
    """A struct field's Arrow array from the raw values of its member (no nulls)."""
    if part.bit is not None:
        values = (raw & part.bit.mask) >> part.bit.shift
        when = part.bit.when
        if when is None:
            return masked_array(values, None, part.type)
        distinct = np.unique(raw)
        allowed = distinct[np.array([bool(when(int(v))) for v in distinct], dtype=bool)]
        return masked_array(values, np.isin(raw, allowed), part.type)
    if part.kind == "ipv4":  # a struct field: plain strings (struct types are fixed)
        return ipv4_strings(raw).cast(pa.string())
    if part.kind == "bytes":
        width = raw.dtype.itemsize
        fixed = pa.Array.from_buffers(pa.binary(width), len(raw),
                                      [None, pa.py_buffer(np.ascontiguousarray(raw).tobytes())])
        return fixed.cast(pa.binary())
    if pa.types.is_decimal(part.type):
        return arrow_array(raw.astype(np.uint64)).cast(part.type)
    return masked_array(raw, None, part.type)


def _struct_array(parts: Sequence[ColumnPart], raw: Mapping[str, np.ndarray],
                  count: int) -> pa.StructArray:
    if count == 0:
        return arrow_array([], parts_struct_type(parts))
    arrays = [_convert(p, raw[p.member]) for p in parts]
    return pa.StructArray.from_arrays(arrays, fields=list(parts_struct_type(parts)))


def _spread_struct(parts: Sequence[ColumnPart], raw: Mapping[str, np.ndarray],
                   owner: np.ndarray, rows: int) -> pa.Array:
    """A struct column of ``rows`` rows with the values ``raw`` at rows ``owner`` (unique) and
    nulls elsewhere: scattered with numpy before conversion (an Arrow ``take`` with null
    indices is many times slower)."""
    struct_type = parts_struct_type(parts)
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
class LbmcColumns:
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

    def take(self, keep: np.ndarray) -> LbmcColumns:
        """The messages selected by the boolean ``keep`` (headers renumbered)."""
        new_index = np.cumsum(keep) - 1
        hk = keep[self.h_msg]
        fields = {}
        for name in ("region", "index", "start", "msglen", "mtype", "first", "err", "err_off",
                     "err_val", "err_hcode", "tidx", "sqn", "terminator", "payload_len"):
            fields[name] = getattr(self, name)[keep]
        return LbmcColumns(**fields, h_msg=new_index[self.h_msg[hk]], h_code=self.h_code[hk],
                           h_pos=self.h_pos[hk], h_len=self.h_len[hk])

    def error_text(self, i: int) -> str | None:
        code = int(self.err[i])
        if not code:
            return None
        return _message_error(code, int(self.err_off[i]), int(self.err_val[i]),
                              int(self.err_hcode[i]))


def decode_lbmc(bv: ByteView, rstart: np.ndarray, rend: np.ndarray, *,
                single: bool = False) -> LbmcColumns:
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
    return LbmcColumns(region=cols["region"], index=cols["index"], start=start, msglen=msglen,
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


def stop_at_first_error(msgs: LbmcColumns, regions: int) -> LbmcColumns:
    """Drop the messages after a region's first bad one (a datagram's decoder stops there)."""
    bad = msgs.err != 0
    if not bad.any():
        return msgs
    first = np.full(regions, np.iinfo(np.int64).max)
    np.minimum.at(first, msgs.region[bad], msgs.index[bad])
    keep = msgs.index <= first[msgs.region]
    return msgs if keep.all() else msgs.take(keep)


def _labels(msgs: LbmcColumns, transport: np.ndarray) -> pa.Array:
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
    return dictionary_strings(code, names, msgs.err == 0)


def _typed_headers(bv: ByteView, msgs: LbmcColumns,
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


def _header_columns(bv: ByteView, msgs: LbmcColumns) -> dict[str, pa.Array]:
    """The typed header columns of ``msgs``, one row per message (null where absent)."""
    m = msgs.count
    out = {column.name: null_array(column.arrow_type, m) for column in MESSAGE_HEADER_COLUMNS}
    for column, owner, raw in _typed_headers(bv, msgs):
        if column.repeated:
            counts = np.bincount(owner, minlength=m)
            out[column.name] = pa.ListArray.from_arrays(
                list_offsets(counts), _struct_array(column.parts, raw, len(owner)),
                mask=arrow_array(counts == 0))
        else:
            out[column.name] = _spread_struct(column.parts, raw, owner, m)
    return out


def _header_tables(bv: ByteView, msgs: LbmcColumns, key: Mapping[str, pa.Array],
                   ) -> dict[str, pa.Table]:
    """The typed headers of ``msgs`` as stored (:data:`HEADER_TABLE_SCHEMAS`, categorical key
    columns dictionary-typed): per header, only the messages that carry it, built from those
    values alone (no spreading to every message and filtering back)."""
    out: dict[str, pa.Table] = {}
    for column, owner, raw in _typed_headers(bv, msgs):
        values = _struct_array(column.parts, raw, len(owner))
        if column.repeated:
            owner, counts = np.unique(owner, return_counts=True)
            values = pa.ListArray.from_arrays(list_offsets(counts), values)
        take = arrow_array(owner)
        name = f"{HEADER_TABLE_PREFIX}{column.name}"
        out[name] = table_of(HEADER_TABLES_STORED[name], len(owner), {
            **{k: key[k].take(take) for k in MESSAGE_KEY}, column.name: values})
    return out


def _core_header_columns(bv: ByteView, msgs: LbmcColumns) -> dict[str, pa.Array]:
    """``header_codes`` and ``topic_name`` of ``msgs``."""
    m = msgs.count
    out: dict[str, pa.Array] = {}
    out["header_codes"] = pa.ListArray.from_arrays(list_offsets(np.bincount(msgs.h_msg,
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
    out["topic_name"] = with_nulls(text_array(bv.data, starts, lengths), present)
    return out


def messages_table(bv: ByteView, msgs: LbmcColumns, identity: Mapping[str, pa.Array],
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
    type_names = [LBMC_TYPE_NAMES.get(t) for t in range(16)]  # type: ignore[call-overload]
    columns["message_type"] = dictionary_strings(msgs.mtype, type_names)
    columns["label"] = _labels(msgs, transport)
    columns["msglen"] = arrow_array(msgs.msglen, pa.int32())
    columns["tidx"] = masked_array(msgs.tidx, data, pa.int64())
    columns["sqn"] = masked_array(msgs.sqn, data, pa.int64())
    columns["payload_length"] = masked_array(msgs.payload_len, ok, pa.int32())
    if (~ok).any():
        columns["malformed_reason"] = sparse_strings(
            m, {i: msgs.error_text(i) or "" for i in np.flatnonzero(~ok).tolist()})
    columns.update(_core_header_columns(bv, msgs))
    if stored:
        return table_of(MESSAGE_CORE_STORED, m, columns), _header_tables(bv, msgs, columns)
    columns.update(_header_columns(bv, msgs))
    return table_of(MESSAGES_STORED_WIDE, m, columns), {}
