"""Sequence gaps, duplicates and out-of-order items: tshark's LBT-RM/LBT-RU sequence analysis
and the same rules applied to topic sequence numbers.

Every sequenced item (a transport DATA or SM packet, a new topic data message) belongs to a
stream (:data:`STREAM`) and is judged against the items before it in capture order (``pos``,
then ``msg_index``), never by timestamp.  The walk is done on whole integer columns: the
stream keys become one small code per row (one Arrow hash grouping of the key columns), the
items are sorted once by stream and capture order (stable sorts), and the running quantities
tshark keeps per stream (the previous number, the high-water mark of new items, the numbers
seen so far) become shifted columns, one segmented cumulative maximum and one stable sort of
(stream, number) pairs; no Python loop per item or per stream, no string built per row.
The per-stream summary is one Arrow ``group_by``.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_analysis.engine.common import arrow

__all__ = ["STREAM", "judged_items", "sequence_events", "sequence_flags", "sequence_summary"]

STREAM = ["capture", "level", "protocol", "source_ip", "source_port", "session_id",
          "dest_ip", "dest_port", "tidx"]
"""What one sequenced stream is: its level (``transport-data``, ``transport-sm``, ``topic``)
and the transport keys as tshark keys them (topic streams add the topic index ``tidx``)."""

_LEVELS = pa.array(["transport-data", "transport-sm", "topic"], pa.string())
_EVENTS = pa.array(["gap", "out-of-order", "duplicate"], pa.string())

_ITEM_TYPES = {"capture": pa.string(), "pos": pa.int64(), "msg_index": pa.int32(),
               "file": pa.string(), "file_offset": pa.int64(), "ts_ns": pa.int64(),
               "level": pa.string(), "protocol": pa.string(), "source_ip": pa.string(),
               "source_port": pa.int32(), "session_id": pa.int64(), "dest_ip": pa.string(),
               "dest_port": pa.int32(), "tidx": pa.int64(), "sqn": pa.int64(),
               "rx": pa.bool_()}

_SUMMARY_COUNTS = ["items", "retransmissions", "first_sqn", "high_sqn", "distinct_sqns",
                   "gaps", "gap_sqns", "out_of_order", "duplicates", "first_ts_ns",
                   "last_ts_ns", "missing"]
_EVENT_COLUMNS = ["ts_ns", "file", "file_offset", "pos", "msg_index", "sqn"]

_INT64_MAX = np.iinfo(np.int64).max
_INT64_MIN = np.iinfo(np.int64).min


# =============================================================================================
# Column helpers
# =============================================================================================


def _table(df: pd.DataFrame, columns: list[str]) -> pa.Table:
    """``columns`` of ``df`` as one Arrow table (no copy for Arrow-backed columns)."""
    return pa.table({name: arrow(df[name]) for name in columns})


def _array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    """A column as one Arrow array (no copy when it is one chunk already)."""
    if isinstance(values, pa.ChunkedArray):
        return values.chunk(0) if values.num_chunks == 1 else values.combine_chunks()
    return values


def _ints(values: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """An integer column as numpy: values (nulls as 0) and validity."""
    values = _array(values)
    if values.null_count == 0:
        return (values.to_numpy(zero_copy_only=False).astype(np.int64, copy=False),
                np.ones(len(values), bool))
    valid = pc.is_valid(values).to_numpy(zero_copy_only=False)
    return pc.fill_null(values, 0).to_numpy(zero_copy_only=False).astype(np.int64), valid


def _bools(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A boolean column as numpy, null as false (what a ``where`` / ``when`` makes of it)."""
    values = _array(values)
    if values.null_count:
        values = pc.fill_null(values, False)
    return values.to_numpy(zero_copy_only=False).astype(bool, copy=False)


def _take(table: pa.Table, rows: np.ndarray) -> pa.Table:
    """The ``rows`` of ``table`` (few of them), taken chunk by chunk: a take from a column
    of several chunks would first join its chunks (a copy of the whole column)."""
    rows = np.asarray(rows, np.int64)
    columns = []
    for column in table.columns:
        if column.num_chunks == 1:
            columns.append(pc.take(column.chunk(0), pa.array(rows)))
            continue
        bounds = np.cumsum([0, *(len(chunk) for chunk in column.chunks)])
        which = np.searchsorted(bounds, rows, side="right") - 1
        parts, positions = [pa.array([], column.type)], [np.zeros(0, np.int64)]
        for k, chunk in enumerate(column.chunks):
            picked = np.flatnonzero(which == k)
            if len(picked):
                parts.append(pc.take(chunk, pa.array(rows[picked] - bounds[k])))
                positions.append(picked)
        back = np.empty(len(rows), np.int64)
        back[np.concatenate(positions)] = np.arange(len(rows))
        columns.append(pc.take(pa.concat_arrays(parts), pa.array(back)))
    return pa.table(columns, names=table.column_names)


def _nullable(values: np.ndarray, valid: np.ndarray, type_: pa.DataType) -> pa.Array:
    """An Arrow array of ``values``, null where not ``valid``."""
    return pa.array(values, type_, mask=None if valid.all() else ~valid)


def _stream_codes(columns: list[pa.Array | pa.ChunkedArray | np.ndarray]) -> np.ndarray:
    """One dense integer per distinct combination of ``columns`` (a null is a value of its
    own, as in a Spark ``partitionBy`` / ``groupBy``).

    Arrow's hash grouping of all the key columns in one pass (``group_by``, one thread: the
    engine runs two steps at a time), each group listing its row numbers; a hash of one
    string column at a time and digits combined in numpy cost twice as much."""
    n = len(columns[0]) if columns else 0
    if n == 0:
        return np.zeros(0, np.int64)
    names = [f"key{i}" for i in range(len(columns))]
    keys = pa.table({name: pa.array(column) if isinstance(column, np.ndarray) else column
                     for name, column in zip(names, columns, strict=True)})
    keys = keys.unify_dictionaries().append_column(
        "row", pa.array(np.arange(n, dtype=np.int64)))
    lists = _array(keys.group_by(names, use_threads=False)
                   .aggregate([("row", "list")])["row_list"])
    sizes = pc.list_value_length(lists).to_numpy(zero_copy_only=False)
    codes = np.empty(n, np.int64)
    codes[pc.list_flatten(lists).to_numpy()] = np.repeat(np.arange(len(sizes)), sizes)
    return codes


def _stream_order(codes: np.ndarray, pos: np.ndarray, msg_index: np.ndarray) -> np.ndarray:
    """The row order by stream, then capture order (``pos``, then ``msg_index``).

    Two stable sorts instead of one three-key ``lexsort``: by capture order first (the rows
    come nearly in it, runs a merge sort takes whole), then by stream (a radix sort of
    16-bit codes when the streams are fewer than 65,536)."""
    n = len(codes)
    if n == 0:
        return np.zeros(0, np.int64)
    p_low, p_high = int(pos.min()), int(pos.max())
    m_low, m_high = int(msg_index.min()), int(msg_index.max())
    m_span = m_high - m_low + 1
    if (p_high - p_low + 1) * m_span >= 1 << 62:
        return np.lexsort((msg_index, pos, codes))
    key = (pos - p_low) * m_span + (msg_index - m_low)
    first = np.argsort(key, kind="stable")
    streams = codes[first]
    if int(codes.max()) < 1 << 16:
        streams = streams.astype(np.uint16)
    return first[np.argsort(streams, kind="stable")]


def _starts(codes_sorted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For rows sorted by stream: whether each row starts its stream, and where."""
    n = len(codes_sorted)
    is_start = np.ones(n, bool)
    if n:
        is_start[1:] = codes_sorted[1:] != codes_sorted[:-1]
    return is_start, np.flatnonzero(is_start)


def _running_max_before(codes: np.ndarray, starts: np.ndarray, values: np.ndarray,
                        present: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per row of streams laid out contiguously (``codes`` non-decreasing, ``starts`` marks
    each stream's first row): the maximum of ``values`` where ``present`` over the rows of
    its stream strictly before it, and whether there was any.

    One ``np.maximum.accumulate`` over the whole column: each stream's values are lifted
    above every earlier stream's (``code * span``), so the running maximum never crosses a
    stream boundary.  (``groupby().cummax()`` if the lifted values would overflow.)"""
    n = len(values)
    if n == 0 or not present.any():
        return np.zeros(n, np.int64), np.zeros(n, bool)
    low = int(values[present].min())
    high = int(values[present].max())
    span = high - low + 2
    shifted = np.where(present, values - (low - 1), 0)  # 0: nothing yet
    if (int(codes[-1]) + 1) * span < 1 << 62:
        lift = codes * span
        shifted += lift
        inclusive = np.maximum.accumulate(shifted)
        inclusive -= lift
    else:
        inclusive = pd.Series(shifted).groupby(codes, sort=False).cummax().to_numpy()
    before = np.empty(n, np.int64)
    before[0] = 0
    before[1:] = inclusive[:-1]
    before[starts] = 0
    marked = before > 0
    before += low - 1
    return before, marked


def _repeated(codes: np.ndarray, values: np.ndarray, present: np.ndarray) -> np.ndarray:
    """Per row, in the given order: whether a row before it has the same stream and the
    same (present) value.

    A stable sort of (stream, value): the rows of one number stay in the given order, so
    every row but the first of its run is a repeat.  Within a stream the numbers mostly
    rise in capture order, so the merge sort meets long sorted runs.  (A hash of the pairs
    if they do not fit one integer.)"""
    out = np.zeros(len(values), bool)
    rows = np.flatnonzero(present)
    if len(rows) == 0:
        return out
    all_rows = len(rows) == len(values)
    v = values if all_rows else values[rows]
    c = codes if all_rows else codes[rows]
    low = int(v.min())
    span = int(v.max()) - low + 1
    if (int(c.max()) + 1) * span < 1 << 62:
        key = c * span + (v - low)
        order = np.argsort(key, kind="stable")
        ranked = key[order]
        again = np.zeros(len(ranked), bool)
        again[1:] = ranked[1:] == ranked[:-1]
        dup = np.empty(len(ranked), bool)
        dup[order] = again
    else:
        dup = pd.DataFrame({"c": c, "v": v}).duplicated(keep="first").to_numpy()
    if all_rows:
        return dup
    out[rows] = dup
    return out


# =============================================================================================
# The sequenced items
# =============================================================================================


def _items(packets: pd.DataFrame, data: pd.DataFrame) -> tuple[pa.Table, np.ndarray]:
    """The sequenced items of both levels in :data:`_ITEM_TYPES` columns, and their level as
    codes into :data:`_LEVELS` (int8).  The rows of each input are picked by index and every
    column is taken once (one copy of the strings)."""
    protocol = _array(arrow(packets["protocol"]))
    packet_type = _array(arrow(packets["packet_type"]))
    is_data = _bools(pc.equal(packet_type, "data"))
    keep = ((_bools(pc.equal(protocol, "lbtrm")) | _bools(pc.equal(protocol, "lbtru")))
            & (is_data | _bools(pc.equal(packet_type, "sm")))
            & _bools(pc.is_valid(arrow(packets["sqn"]))))
    if "icmp_type" in packets.columns:
        keep &= _bools(pc.is_null(arrow(packets["icmp_type"])))
    tp = pa.array(np.flatnonzero(keep))
    d_keep = _bools(pc.and_kleene(pc.equal(arrow(data["message_type"]), "data"),
                                  pc.equal(arrow(data["label"]), "DATA")))
    td = pa.array(np.flatnonzero(d_keep))
    n_t, n_d = len(tp), len(td)

    def pick(df: pd.DataFrame, name: str, rows: pa.Array) -> pa.Array:
        return pc.take(_array(arrow(df[name])), rows)

    def joined(name: str, transport: pa.Array, topic: pa.Array) -> pa.ChunkedArray:
        type_ = _ITEM_TYPES[name]
        if transport.type == topic.type and pa.types.is_dictionary(transport.type):
            type_ = transport.type   # kept encoded (inputs.DICTIONARY), each its dictionary
        return pa.chunked_array([transport.cast(type_), topic.cast(type_)], type_)

    def same(name: str, p_name: str, d_name: str | None = None) -> pa.Array:
        return joined(name, pick(packets, p_name, tp), pick(data, d_name or p_name, td))

    t_protocol = pc.take(protocol, tp)
    t_data = is_data[keep]
    d_protocol = pick(data, "protocol", td)
    d_session = pick(data, "session_id", td)
    levels = np.concatenate([np.where(t_data, 0, 1).astype(np.int8),
                             np.full(n_d, 2, np.int8)])
    columns = {
        "capture": same("capture", "capture"),
        "pos": same("pos", "pos"),
        "msg_index": joined("msg_index", pa.array(np.zeros(n_t, np.int32)),
                            pick(data, "msg_index", td)),
        "file": same("file", "file"),
        "file_offset": same("file_offset", "file_offset"),
        "ts_ns": same("ts_ns", "ts_ns"),
        # encoded: a level per item, three values (its name was a tenth of the table)
        "level": pa.DictionaryArray.from_arrays(pa.array(levels, pa.int32()), _LEVELS),
        "protocol": joined("protocol", t_protocol, d_protocol),
        "source_ip": same("source_ip", "src_ip"),
        "source_port": joined(
            "source_port",
            pc.if_else(pc.equal(t_protocol, "lbtrm"),
                       pick(packets, "ucast_port", tp).cast(pa.int32()),
                       pick(packets, "src_port", tp).cast(pa.int32())),
            pick(data, "source_port", td)),
        "session_id": joined(
            "session_id", pick(packets, "session_id", tp),
            pc.if_else(pc.not_equal(d_protocol, "lbttcp"), d_session,
                       pa.scalar(None, d_session.type))),
        "dest_ip": same("dest_ip", "dst_ip"),
        "dest_port": same("dest_port", "dst_port"),
        "tidx": joined("tidx", pa.nulls(n_t, pa.int64()), pick(data, "tidx", td)),
        "sqn": same("sqn", "sqn"),
        "rx": joined("rx", pa.array(t_data & _bools(pick(packets, "retransmission", tp))),
                     pick(data, "rx", td)),
    }
    return pa.table(columns), levels


def judged_items(packets: pd.DataFrame, data: pd.DataFrame) -> pd.DataFrame:
    """Every sequenced item with its gap / out-of-order / duplicate verdict, and ``seen``.

    Three levels, each a set of streams (:data:`STREAM`) walked in capture order:

    ``transport-data`` / ``transport-sm``
        LBT-RM and LBT-RU DATA and SM packets (not those an ICMP error quotes) with their
        transport sequence numbers, keyed as tshark keys a transport (LBT-RM: source address,
        the header's NAK port ``ucast_port`` as ``source_port``, session ID, group and port;
        LBT-RU: per receiver, the UDP ports), judged exactly like tshark
        (``lbtrm.transport.data_sqn_gap``, ``..._ooo_gap``, ``..._duplicate`` and the same of
        ``lbtru.analysis``).
    ``topic``
        topic sequence numbers of new data messages (``label`` DATA) per transport stream and
        topic index (LBT-TCP has no session ID: one stream per connection).

    The rules, per stream: the first item is not judged; a retransmission (``rx``) is never
    judged but its number counts as seen; the high-water mark is the largest number of the
    earlier items that are not retransmissions (0 before any).  An item at or below it is
    out of order by ``high - sqn`` (0 when equal) and a duplicate if its number came earlier
    in the stream (``seen``); one above ``high + 1`` opens a gap, for ``transport-data``
    measured from the previous item, retransmissions included (``sqn - previous - 1``, as
    tshark does), for the others from the mark (``sqn - high - 1``).

    ``seen`` stays in the result: each number's first item is the one not seen, so
    :func:`sequence_summary` counts distinct numbers from it.  Done on integer columns: the
    stream keys become one small code per row, the items are sorted once by stream and
    capture order; the previous item is a shift, the mark a segmented running maximum, and
    ``seen`` a stable sort of (stream, number) in capture order (the earliest copy first).
    """
    items, levels = _items(packets, data)
    n = items.num_rows
    codes = _stream_codes([items["capture"], levels,
                           *(items[name] for name in STREAM[2:])])
    pos, _ = _ints(items["pos"])
    msg_index, _ = _ints(items["msg_index"])
    order = _stream_order(codes, pos, msg_index)
    del pos, msg_index
    codes_s = codes[order]
    del codes   # (the arrays of a step are as long as the capture: each goes when done)
    sqn_all, valid_all = _ints(items["sqn"])
    sqn, valid = sqn_all[order], valid_all[order]
    del sqn_all, valid_all
    # a null ``rx`` (never, in practice) is neither new nor judged, as in Spark's ``when``
    new = ~_bools(pc.fill_null(items["rx"], True))[order]
    is_start, starts = _starts(codes_s)

    mark, marked = _running_max_before(codes_s, starts, sqn, valid & new)
    high = np.where(marked, mark, 0)
    del mark, marked
    has_previous = np.zeros(n, bool)
    if n:
        has_previous[1:] = valid[:-1]
    has_previous &= ~is_start
    seen = _repeated(codes_s, sqn, valid)
    del codes_s

    judged = has_previous & new
    del has_previous, new, is_start, starts
    low = judged & valid & (sqn <= high)
    duplicate = low & seen
    ooo_gap = np.where(low & (sqn != high), high - sqn, 0)
    ahead = judged & valid & (sqn > high + 1)
    del judged, low
    from_previous = levels[order] == 0  # transport-data: from the previous item
    base = high
    if n:
        base = np.where(from_previous, np.concatenate([[0], sqn[:-1]]), high)
    sqn_gap = np.where(ahead, sqn - (base + 1), 0)
    del base, high, ahead, from_previous, sqn, valid

    def back(values: np.ndarray) -> pa.Array:
        out = np.empty_like(values)
        out[order] = values
        return pa.array(out)

    table = (items.append_column("seen", back(seen))
             .append_column("duplicate", back(duplicate))
             .append_column("ooo_gap", back(ooo_gap.astype(np.int64, copy=False)))
             .append_column("sqn_gap", back(sqn_gap.astype(np.int64, copy=False))))
    return table.to_pandas(types_mapper=pd.ArrowDtype)


def sequence_flags(packets: pd.DataFrame, data: pd.DataFrame) -> pd.DataFrame:
    """Every sequenced item with its verdict: :func:`judged_items` without ``seen``."""
    return judged_items(packets, data).drop(columns="seen")


# =============================================================================================
# Per stream, per event
# =============================================================================================


def _first_items(codes: np.ndarray, pos: np.ndarray, msg_index: np.ndarray,
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The rows grouped by stream (a stable sort of the codes: the order of the streams is
    that of the codes) and each stream's first item in capture order (``pos``, then
    ``msg_index``; of equal ones the earliest row), as row numbers.

    The aggregates of a summary need no capture order but the first item: a minimum of
    one integer capture-order key per stream instead of a sort of all rows by it."""
    n = len(codes)
    if n == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    p_low, p_high = int(pos.min()), int(pos.max())
    m_low, m_high = int(msg_index.min()), int(msg_index.max())
    m_span = m_high - m_low + 1
    if (p_high - p_low + 1) * m_span >= 1 << 62:
        order = np.lexsort((msg_index, pos, codes))
        return order, order[_starts(codes[order])[1]]
    order = np.argsort(codes.astype(np.uint16) if int(codes.max()) < 1 << 16 else codes,
                       kind="stable")
    codes_s = codes[order]
    _, starts = _starts(codes_s)
    key = ((pos - p_low) * m_span + (msg_index - m_low))[order]
    least = np.minimum.reduceat(key, starts)
    hits = np.flatnonzero(key == np.repeat(least, np.diff(np.append(starts, n))))
    hit_codes = codes_s[hits]
    firsts = np.ones(len(hits), bool)
    firsts[1:] = hit_codes[1:] != hit_codes[:-1]
    return order, order[hits[firsts]]


def _summary_grouped(t: pa.Table) -> pa.Table | None:
    """:func:`sequence_summary` of flags with ``seen`` as one Arrow ``group_by`` over the
    stream keys: counts and sums of flag columns made numeric, minima and maxima; the first
    item's number rides in the low digits of its capture-order key (``(pos, msg_index)``
    names one item of a stream), so it is a minimum too.  None when that key would overflow
    (then the rows are grouped by stream codes)."""
    n = t.num_rows
    if n == 0:
        return None
    pos, _ = _ints(t["pos"])
    msg_index, _ = _ints(t["msg_index"])
    sqn, sqn_valid = _ints(t["sqn"])
    p_low, p_high = int(pos.min()), int(pos.max())
    m_low, m_high = int(msg_index.min()), int(msg_index.max())
    s_low = int(sqn[sqn_valid].min()) if sqn_valid.any() else 0
    s_high = int(sqn[sqn_valid].max()) if sqn_valid.any() else 0
    m_span, s_span = m_high - m_low + 1, s_high - s_low + 2
    if (p_high - p_low + 1) * m_span * s_span >= 1 << 62:
        return None
    first = ((pos - p_low) * m_span + (msg_index - m_low)) * s_span
    first += np.where(sqn_valid, sqn - (s_low - 1), 0)
    del pos, msg_index

    def flag(values: np.ndarray) -> pa.Array:
        return pa.array(values.astype(np.int8))

    gap = t["sqn_gap"]
    work = t.select(STREAM).append_column("first", pa.array(first))
    for name, values in (
            ("rx", flag(_bools(t["rx"]))),
            ("sqn", t["sqn"]),
            ("distinct", flag(~_bools(pc.fill_null(t["seen"], True)))),
            ("gaps", flag(_bools(pc.greater(gap, 0)))),
            ("gap_sqns", gap),
            ("ooo", flag(_bools(pc.greater(t["ooo_gap"], 0)))),
            ("duplicate", flag(_bools(t["duplicate"]))),
            ("ts_ns", t["ts_ns"])):
        work = work.append_column(name, values)
    g = work.unify_dictionaries().group_by(STREAM, use_threads=False).aggregate([
        ([], "count_all"), ("rx", "sum"), ("first", "min"), ("sqn", "max"), ("sqn", "min"),
        ("distinct", "sum"), ("gaps", "sum"), ("gap_sqns", "sum"), ("ooo", "sum"),
        ("duplicate", "sum"), ("ts_ns", "min"), ("ts_ns", "max")])
    least, _ = _ints(g["first_min"])
    number = least % s_span
    distinct = g["distinct_sum"].cast(pa.int64())
    values = {
        "items": g["count_all"].cast(pa.int64()),
        "retransmissions": g["rx_sum"].cast(pa.int64()),
        "first_sqn": _nullable(number + (s_low - 1), number > 0, pa.int64()),
        "high_sqn": g["sqn_max"].cast(pa.int64()),
        "distinct_sqns": distinct,
        "gaps": g["gaps_sum"].cast(pa.int64()),
        "gap_sqns": g["gap_sqns_sum"].cast(pa.int64()),
        "out_of_order": g["ooo_sum"].cast(pa.int64()),
        "duplicates": g["duplicate_sum"].cast(pa.int64()),
        "first_ts_ns": g["ts_ns_min"].cast(pa.int64()),
        "last_ts_ns": g["ts_ns_max"].cast(pa.int64()),
        "missing": pc.subtract(pc.add(pc.subtract(g["sqn_max"], g["sqn_min"]), 1), distinct),
    }
    return pa.table({**{name: _array(g[name]) for name in STREAM},
                     **{name: _array(values[name]) for name in _SUMMARY_COUNTS}})


def sequence_summary(flags: pd.DataFrame) -> pd.DataFrame:
    """Per sequenced stream: items, retransmissions, gaps, out-of-order items and duplicates.

    ``first_sqn`` is the number of the stream's first item in capture order; ``high_sqn``
    the largest; ``distinct_sqns`` the numbers seen at all (the items not ``seen`` when the
    flags come from :func:`judged_items`, else a distinct count); ``gaps``/``gap_sqns`` the
    gap events and the numbers they skipped; ``out_of_order`` the items below the mark;
    ``duplicates`` the items already seen; ``missing`` the numbers from the lowest to the
    highest never seen in any copy (what still lacks after retransmissions).  With ``seen``
    it is one Arrow ``group_by`` (:func:`_summary_grouped`); otherwise (or should its key
    overflow) the aggregates are ``reduceat`` over the rows grouped by stream codes (one
    radix sort), the first item a minimum of the capture-order key per stream.
    """
    has_seen = "seen" in flags.columns
    t = _table(flags, [*STREAM, "pos", "msg_index", "sqn", "rx", "sqn_gap", "ooo_gap",
                       "duplicate", "ts_ns", *(["seen"] if has_seen else [])])
    grouped = _summary_grouped(t) if has_seen else None
    if grouped is not None:
        return grouped.to_pandas(types_mapper=pd.ArrowDtype)
    n = t.num_rows
    codes = _stream_codes([t[name] for name in STREAM])
    pos, _ = _ints(t["pos"])
    msg_index, _ = _ints(t["msg_index"])
    order, first_rows = _first_items(codes, pos, msg_index)
    del pos, msg_index
    codes_s = codes[order]
    _, starts = _starts(codes_s)

    def column(name: str) -> tuple[np.ndarray, np.ndarray]:
        values, valid = _ints(t[name])
        return values[order], valid[order]

    def count(flag: np.ndarray) -> np.ndarray:
        return np.add.reduceat(flag.astype(np.int64), starts) if n else np.zeros(0, np.int64)

    def extreme(values: np.ndarray, valid: np.ndarray, ufunc: np.ufunc,
                empty: int) -> pa.Array:
        if not n:
            return pa.array([], pa.int64())
        best = ufunc.reduceat(np.where(valid, values, empty), starts)
        return _nullable(best, count(valid) > 0, pa.int64())

    sqn, sqn_valid = column("sqn")
    if has_seen:
        distinct = count(~_bools(pc.fill_null(t["seen"], True))[order])
    else:
        distinct = count(sqn_valid & ~_repeated(codes_s, sqn, sqn_valid))
    gap, gap_valid = column("sqn_gap")
    ooo, _ = column("ooo_gap")
    ooo_valid = pc.is_valid(t["ooo_gap"]).to_numpy(zero_copy_only=False)[order]
    high = extreme(sqn, sqn_valid, np.maximum, _INT64_MIN)
    low = extreme(sqn, sqn_valid, np.minimum, _INT64_MAX)
    first_sqn, first_valid = _ints(t["sqn"])
    first = _nullable(first_sqn[first_rows], first_valid[first_rows], pa.int64())
    ts, ts_valid = column("ts_ns")
    gap_sum = (_nullable(np.add.reduceat(np.where(gap_valid, gap, 0), starts),
                         count(gap_valid) > 0, pa.int64()) if n else pa.array([], pa.int64()))
    missing = pc.subtract(pc.add(pc.subtract(high, low), 1), pa.array(distinct))
    values = {
        "items": pa.array(np.diff(np.append(starts, n)).astype(np.int64)),
        "retransmissions": pa.array(count(_bools(t["rx"])[order])),
        "first_sqn": first,
        "high_sqn": high,
        "distinct_sqns": pa.array(distinct),
        "gaps": pa.array(count(gap_valid & (gap > 0))),
        "gap_sqns": gap_sum,
        "out_of_order": pa.array(count(ooo_valid & (ooo > 0))),
        "duplicates": pa.array(count(_bools(t["duplicate"])[order])),
        "first_ts_ns": extreme(ts, ts_valid, np.minimum, _INT64_MAX),
        "last_ts_ns": extreme(ts, ts_valid, np.maximum, _INT64_MIN),
        "missing": missing,
    }
    keys = _take(t.select(STREAM), first_rows)
    out = pa.table({**{name: keys[name] for name in STREAM},
                    **{name: values[name] for name in _SUMMARY_COUNTS}})
    return out.to_pandas(types_mapper=pd.ArrowDtype)


def sequence_events(flags: pd.DataFrame) -> pd.DataFrame:
    """Where exactly: one row per gap, out-of-order item and duplicate of ``flags``
    (``event`` ``gap`` / ``out-of-order`` / ``duplicate``; ``size`` the numbers skipped, the
    distance below the high-water mark, or 1).  An item both out of order and a duplicate
    gives two rows."""
    t = _table(flags, [*STREAM, *_EVENT_COLUMNS, "sqn_gap", "ooo_gap", "duplicate"])
    rows = [np.flatnonzero(_bools(pc.greater(t["sqn_gap"], 0))),
            np.flatnonzero(_bools(pc.greater(t["ooo_gap"], 0))),
            np.flatnonzero(_bools(t["duplicate"]))]
    take = np.concatenate(rows).astype(np.int64)
    size = np.concatenate([_ints(pc.take(t["sqn_gap"], pa.array(rows[0])))[0],
                           _ints(pc.take(t["ooo_gap"], pa.array(rows[1])))[0],
                           np.ones(len(rows[2]), np.int64)])
    kind = np.repeat(np.arange(3, dtype=np.int8), [len(r) for r in rows])
    out = (_take(t.select([*STREAM, *_EVENT_COLUMNS]), take)
           .append_column("event", pc.take(_EVENTS, pa.array(kind)))
           .append_column("size", pa.array(size.astype(np.int64))))
    return out.to_pandas(types_mapper=pd.ArrowDtype)
