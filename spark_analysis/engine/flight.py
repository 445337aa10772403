"""Flight size: when each sent message became stable, the messages entering and leaving the
flight of their source topic, and the in-flight count over time and per source topic.

A message is *in flight* from its send (:func:`spark_analysis.engine.data.message_sends`) until
it is stable: acknowledged by enough of the stores its source registered with (the stability
rule of :class:`~spark_analysis.engine.options.AnalysisOptions`).  A *source topic* is the
flight key ``(capture, session, source_ip, tidx)``.

Grouping follows Spark's rules: a null is a value of a grouping key of its own (``groupBy``,
window partitions), while an equality join never matches a null key.  Orderings put nulls
first, as Spark's ascending sorts do.

Groups are numbered from integer codes of the key columns (an integer column by its distance
from its least value, a string column through a dictionary of its few values) packed in mixed
radix, numbered in order of first appearance: rows come in capture order, so the sorts by those
numbers see nearly sorted keys.  The event tables are sorted once by such codes packed into one
int64 (no multi-key ``lexsort``), and no pandas concat, merge or groupby touches the large
tables; only the output rows are taken.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_analysis.engine.common import dense_codes, dictionary_encode, plain, series
from spark_analysis.engine.options import AnalysisOptions

FLIGHT = ["capture", "session", "source_ip", "tidx"]
"""The key of a source topic's flight."""


_LIMIT = 1 << 62
"""Mixed-radix codes stay below this (no 64-bit overflow)."""


def _part(values: pa.Array) -> tuple[np.ndarray, int]:
    """Per row, a code in ``range(size)`` of its value (a null a value of its own), and
    ``size``: an integer column by its distance from its least value when their span is
    small (no hashing), any other through a dictionary of its values."""
    if pa.types.is_integer(values.type):
        nulls = pc.is_null(values).to_numpy(zero_copy_only=False)
        ints = pc.fill_null(values, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        present = ints[~nulls] if values.null_count else ints
        if len(present):
            low, high = int(present.min()), int(present.max())
            if high - low < (1 << 31):
                codes = ints - (low - 1)
                codes[nulls] = 0
                return codes, high - low + 2
    encoded = dictionary_encode(values, null_encoding="encode")
    return (encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64),
            max(len(encoded.dictionary), 1))


def _packed(columns: Sequence[pa.Array | np.ndarray], room: int = 1) -> tuple[np.ndarray, int]:
    """One int64 code per row for the values of ``columns`` (Arrow arrays, or numpy codes
    already dense from 0), a null being a value of its own (Spark's ``groupBy``), and the
    bound of the codes: the columns' codes (:func:`_part`) in mixed radix, not dense (equal
    tuples, equal codes), made dense only when the radix times ``room`` would overflow."""
    n = len(columns[0]) if columns else 0
    key = np.zeros(n, dtype=np.int64)
    radix = 1
    for column in columns:
        if isinstance(column, np.ndarray):
            codes, size = column.astype(np.int64), int(column.max(initial=-1)) + 1
        else:
            codes, size = _part(column)
        size = max(size, 1)
        if radix * size >= _LIMIT:
            key, radix = dense_codes(key, radix)
        key = key * size + codes
        radix *= size
    if radix * room >= _LIMIT:
        key, radix = dense_codes(key, radix)
    return key, radix


def _arrow(df: pd.DataFrame, name: str) -> pa.Array:
    """Column ``name`` of ``df`` as one Arrow array."""
    values = pa.array(df[name])
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks()
    return values


def _codes(df: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    """One int64 group number per row for the values of ``columns``, a null being a value of
    its own (Spark's ``groupBy``); numbers are dense from 0, in order of first appearance.
    Integer codes of each column (:func:`_packed`), no hashing of tuples."""
    key, _ = _packed([_arrow(df, name) for name in columns])
    if not columns:
        return key
    # numbered in order of first appearance (as pandas factorizes): rows come in capture
    # order, so sorts by these numbers see them nearly in order, where numpy is fastest
    return pd.factorize(key)[0].astype(np.int64)


def _sorted_codes(values: pd.Series) -> np.ndarray:
    """Per row, the rank of its value in ascending order, a null below every value (-1)
    (Spark's ascending sort puts nulls first; strings order by their UTF-8 bytes, which is
    the order of their code points)."""
    codes, _ = pd.factorize(values, sort=True, use_na_sentinel=True)
    return codes.astype(np.int64)


def _int64(values: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """An integer column as (values with nulls as 0, is-null mask)."""
    nulls = values.isna().to_numpy(dtype=bool)
    return values.fillna(0).to_numpy(dtype=np.int64), nulls


def _starts(sorted_key: np.ndarray) -> np.ndarray:
    """Indexes where a new group starts in a key array sorted by group."""
    if len(sorted_key) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]])


def _ends(starts: np.ndarray, n: int) -> np.ndarray:
    """The last index of each group whose first is ``starts``, of ``n`` sorted rows."""
    return np.r_[starts[1:], n][:len(starts)] - 1


def _reduce(ufunc: np.ufunc, values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``ufunc.reduceat`` over the runs from ``starts`` (none when there are no rows)."""
    if len(starts) == 0:
        return np.zeros(0, dtype=np.int64)
    return np.asarray(ufunc.reduceat(values, starts)).astype(np.int64)


def _column(values: np.ndarray, nulls: np.ndarray | None, dtype: pa.DataType,
            index: pd.Index) -> pd.Series:
    """A numpy column as an Arrow-backed Series (``nulls`` masked out)."""
    return series(pa.array(values, type=dtype, mask=nulls), index)


def _has_keys(df: pd.DataFrame, columns: Sequence[str]) -> np.ndarray:
    """Rows whose ``columns`` are all set: the rows an equality join can match."""
    return df[list(columns)].notna().all(axis=1).to_numpy(dtype=bool)


def _left_join(left: pd.DataFrame, right: pd.DataFrame, on: Sequence[str]) -> pd.DataFrame:
    """Spark's left equi-join: a null key matches nothing (pandas would match null to null)."""
    right = right[_has_keys(right, on)]
    return left.merge(right, on=list(on), how="left", sort=False)


def _ranks(values: np.ndarray, nulls: np.ndarray) -> tuple[np.ndarray, int]:
    """Per row, the rank (0, 1, ...) of its value among the distinct non-null ``values``
    (equal values, equal ranks; a null row gets 0), and how many distinct values there are.
    A stable sort: times come nearly in order, where it is cheapest."""
    present = np.flatnonzero(~nulls) if nulls.any() else None
    chosen = values if present is None else values[present]
    order = np.argsort(chosen, kind="stable")
    ordered = chosen[order]
    new = np.ones(len(ordered), dtype=bool)
    if len(ordered):
        np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    dense = np.cumsum(new) - 1
    rank = np.empty(len(chosen), dtype=np.int64)
    rank[order] = dense
    if present is not None:
        full = np.zeros(len(values), dtype=np.int64)
        full[present] = rank
        rank = full
    return rank, int(new.sum()) if len(ordered) else 0


def stable_times(stability: pd.DataFrame, regs: pd.DataFrame,
                 options: AnalysisOptions | None = None) -> pd.DataFrame:
    """When did each sent message become stable?

    ``stability`` from :func:`spark_analysis.engine.acks.stability_acks` (ACKs matched to their
    send: ``send_ts_ns`` set), ``regs`` from
    :func:`spark_analysis.engine.registrations.registrations`.
    Under ``options.stability_rule`` a message is stable at the n-th store's first stability
    ACK, ordered by that time then store address: n is a majority (``quorum``), every one
    (``all``) or one (``any``) of the ``stores`` the source registered with for the topic
    (granted source registrations; distinct stores), or, without such a registration in the
    capture, of the stores that ACKed any message of the source topic.  Messages that never
    got enough ACKs have no row, nor have those whose flight key has a null (Spark joins the
    store counts back on it).

    One row per message: ``capture, session, source_ip, tidx, sqn, stable_ts_ns, stores,
    needed``.  Done as one sort by message, ACK time and store: the first row per (message,
    store) is its first ACK, and the rank among those per message picks the n-th.
    """
    rule = (options or AnalysisOptions()).stability_rule
    # only the columns used (the ACK table is wide), and no copy when every ACK matched
    matched = stability[[*FLIGHT, "sqn", "store_ip", "ts_ns"]]
    has_send = stability["send_ts_ns"].notna().to_numpy(dtype=bool)
    if not has_send.all():
        matched = matched[has_send]
    flight = _codes(matched, FLIGHT)
    message = _codes(pd.DataFrame({"f": flight, "sqn": matched["sqn"]}, index=matched.index),
                     ["f", "sqn"])
    store = _sorted_codes(matched["store_ip"])
    ts, ts_null = _int64(matched["ts_ns"])

    # first ACK per (message, store): sorted by message, store, time (nulls last: Spark's min
    # skips nulls, and is null only when every time is)
    order = np.lexsort((ts, ts_null, store, message))
    pair = message[order] * (int(store.max(initial=-1)) + 2) + store[order] + 1
    firsts = order[_starts(pair)]

    # stores per flight: the distinct stores of a granted source registration, else the
    # distinct stores that ACKed (null addresses not counted)
    f_first = flight[firsts]
    s_first = store[firsts]
    stored = s_first >= 0
    pairs = np.unique(f_first[stored] * (int(store.max(initial=-1)) + 1) + s_first[stored])
    acking = np.bincount(pairs // (int(store.max(initial=-1)) + 1),
                         minlength=int(flight.max(initial=-1)) + 1)
    sources = regs[((regs["role"] == "source") & (regs["outcome"] == "granted"))
                   .fillna(False).to_numpy(dtype=bool)]
    registered = (sources[sources["store_ip"].notna().to_numpy(dtype=bool)]
                  .drop_duplicates(["capture", "source_ip", "topic_idx", "store_ip"])
                  .groupby(["capture", "source_ip", "topic_idx"], sort=False, dropna=False)
                  .size().rename("registered_stores").reset_index()
                  .rename(columns={"topic_idx": "tidx"}))
    # a registration whose stores are all null counts 0 stores, still a registration
    keys = (sources[["capture", "source_ip", "topic_idx"]].drop_duplicates()
            .rename(columns={"topic_idx": "tidx"}))
    registered = keys.merge(registered, on=["capture", "source_ip", "tidx"], how="left")
    registered["registered_stores"] = registered["registered_stores"].fillna(0).astype(np.int64)
    reps = np.zeros(len(acking), dtype=np.int64)
    reps[f_first] = firsts
    per_flight = matched[FLIGHT].iloc[reps].reset_index(drop=True)
    per_flight["flight"] = np.arange(len(acking))
    joined = _left_join(per_flight, registered, ["capture", "source_ip", "tidx"])
    joined = joined.sort_values("flight")
    unregistered = joined["registered_stores"].isna().to_numpy(dtype=bool)
    stores = np.where(unregistered, acking,
                      joined["registered_stores"].fillna(0).to_numpy(dtype=np.int64))
    needed = {"quorum": stores // 2 + 1, "all": stores,
              "any": np.ones_like(stores)}[rule].astype(np.int32)

    # rank of each store's first ACK within its message, by ACK time (nulls first), store
    f_ts, f_null = ts[firsts], ts_null[firsts]
    by_time = firsts[np.lexsort((store[firsts], f_ts, ~f_null, message[firsts]))]
    starts = _starts(message[by_time])
    rank = np.arange(len(by_time)) - np.repeat(starts, np.diff(np.r_[starts, len(by_time)])) + 1
    f_time = flight[by_time]
    keep = (rank == needed[f_time]) & _has_keys(matched, FLIGHT)[by_time]
    rows = by_time[keep]
    out = matched[[*FLIGHT, "sqn"]].iloc[rows].reset_index(drop=True)
    out["stable_ts_ns"] = _column(ts[rows], ts_null[rows], pa.int64(), out.index)
    out["stores"] = _column(stores[flight[rows]], None, pa.int64(), out.index)
    out["needed"] = _column(needed[flight[rows]], None, pa.int32(), out.index)
    return out


def _order(keys: Sequence[tuple[np.ndarray, int]]) -> np.ndarray:
    """The order that sorts rows by ``keys`` (most significant first; each a code array in
    ``range(size)``): one sort of the codes packed into an int64 when they fit, else numpy's
    ``lexsort`` of them."""
    radix = 1
    for _, size in keys:
        radix *= max(size, 1)
    if radix < _LIMIT:
        packed = np.zeros(len(keys[0][0]), dtype=np.int64)
        for codes, size in keys:
            packed = packed * max(size, 1) + codes
        return np.argsort(packed, kind="stable")
    return np.lexsort([codes for codes, _ in reversed(keys)])


def _int_codes(values: np.ndarray, nulls: np.ndarray) -> tuple[np.ndarray, int]:
    """Codes of an integer column in its ascending order, a null first (0): by the distance
    from the least value when the span is small, else by rank."""
    present = values[~nulls]
    if len(present):
        low, high = int(present.min()), int(present.max())
        if high - low < (1 << 31):
            return np.where(nulls, 0, values - (low - 1)), high - low + 2
    rank, count = _ranks(values, nulls)
    return np.where(nulls, 0, rank + 1), count + 1


def flight_events(sends: pd.DataFrame, stable: pd.DataFrame) -> pd.DataFrame:
    """Messages entering (send, ``delta`` +1) and leaving (stable, -1) the flight of their
    source topic, with the running ``in_flight`` count after each event and the ``event``
    number (from 1) within the source topic.

    Events of a source topic in order of time (nulls first), then ``delta`` (at equal times
    the message leaving goes first, so a peak is never overstated), then ``sqn``: one sort
    of integer codes packed into an int64 (source topic, time rank, delta, sqn), a cumulative
    sum and a count per source topic.  The output columns are taken from the two inputs'
    Arrow columns (no pandas concat of the tables).
    """
    cols = [*FLIGHT, "sqn"]
    n_ups, n_downs = len(sends), len(stable)

    def joint(up: str, down: str) -> pa.Array:
        kind = _arrow(sends, up).type
        return pa.concat_arrays([_arrow(sends, up), _arrow(stable, down).cast(kind)])

    columns = {k: joint(k, k) for k in cols}
    columns["ts_ns"] = joint("send_ts_ns", "stable_ts_ns")
    delta = np.r_[np.ones(n_ups, dtype=np.int64), -np.ones(n_downs, dtype=np.int64)]
    flight_key, flight_radix = _packed([columns[k] for k in FLIGHT])
    flight, n_flights = dense_codes(flight_key, flight_radix)
    ts_nulls = pc.is_null(columns["ts_ns"]).to_numpy(zero_copy_only=False)
    ts_values = pc.fill_null(columns["ts_ns"], 0).to_numpy(zero_copy_only=False).astype(np.int64)
    ts_rank, n_times = _ranks(ts_values, ts_nulls)
    sqn_nulls = pc.is_null(columns["sqn"]).to_numpy(zero_copy_only=False)
    sqn_values = pc.fill_null(columns["sqn"], 0).to_numpy(zero_copy_only=False).astype(np.int64)
    order = _order([(flight, n_flights),
                    (np.where(ts_nulls, 0, ts_rank + 1), n_times + 1),
                    ((delta + 1) // 2, 2),
                    _int_codes(sqn_values, sqn_nulls)])
    d = delta[order]
    starts = _starts(flight[order])
    sizes = np.diff(np.r_[starts, len(order)])
    total = np.cumsum(d)
    before = np.repeat(total[starts] - d[starts], sizes)
    event = np.arange(len(order)) - np.repeat(starts, sizes) + 1
    taken = pa.array(order, pa.int64())
    index = pd.RangeIndex(len(order))
    out = pd.DataFrame({k: series(pc.take(columns[k], taken), index)
                        for k in [*cols, "ts_ns"]}, index=index)
    out["delta"] = _column(d, None, pa.int32(), out.index)
    out["in_flight"] = _column(total - before, None, pa.int64(), out.index)
    out["event"] = _column(event, None, pa.int32(), out.index)
    return out


def _ints(df: pd.DataFrame, name: str) -> tuple[np.ndarray, np.ndarray]:
    """An integer column of ``df`` as (values with nulls as 0, is-null mask), from Arrow."""
    values = _arrow(df, name)
    nulls = pc.is_null(values).to_numpy(zero_copy_only=False)
    return pc.fill_null(values, 0).to_numpy(zero_copy_only=False).astype(np.int64), nulls


Span = dict[str, tuple[int, int]]
"""Per capture, the least and greatest event time (ns) of its flight events."""


def event_span(events: pd.DataFrame) -> Span:
    """The time span of ``events`` (:func:`flight_events`) per capture, for
    :func:`flight_size` over events analysed in parts (a capture without a timed event is
    left out)."""
    ts, ts_null = _ints(events, "ts_ns")
    capture = _codes(events, ["capture"])
    valid = np.asarray(pc.is_valid(_arrow(events, "capture")), dtype=bool)
    timed = ~ts_null & valid
    n_cap = int(capture.max(initial=-1)) + 1
    big = np.iinfo(np.int64).max
    low = np.full(n_cap, big, dtype=np.int64)
    high = np.full(n_cap, -big - 1, dtype=np.int64)
    np.minimum.at(low, capture[timed], ts[timed])
    np.maximum.at(high, capture[timed], ts[timed])
    names = _capture_names(events, capture)
    return {names[code]: (int(low[code]), int(high[code])) for code in range(n_cap)
            if low[code] != big}


def _capture_names(events: pd.DataFrame, capture: np.ndarray) -> list[str]:
    """The capture of each code of ``capture`` (:func:`_codes` of the ``capture`` column)."""
    firsts = np.unique(capture, return_index=True)[1]
    return plain(pc.take(_arrow(events, "capture"), pa.array(firsts, pa.int64()))).to_pylist()


def merged_span(spans: Sequence[Span]) -> Span:
    """The span of the events of every part (:func:`event_span` of each)."""
    out: Span = {}
    for span in spans:
        for name, (low, high) in span.items():
            was = out.get(name, (low, high))
            out[name] = (min(was[0], low), max(was[1], high))
    return out


def flight_size(events: pd.DataFrame, options: AnalysisOptions | None = None,
                bounds: Span | None = None) -> pd.DataFrame:
    """How many messages were in flight (sent, not yet stable) per source topic, over time?

    ``events`` from :func:`flight_events`.  Per capture the span of event times ``t0..t1``
    is cut into ``options.flight_bins`` bins of ``max(1, ceil((t1 - t0 + 1) / bins))`` ns
    (in floating point, as Spark divides); per source topic and bin with events: the peak
    (``max_in_flight``), the value after the bin's last event (``end_in_flight``), messages
    ``sent`` and ``stabilized``, and the bin's ``[bin_start_ns, bin_end_ns)``; between bins
    the value holds.  An event without a time falls in a null bin.  ``bounds`` gives each
    capture's ``t0..t1`` instead, when ``events`` are one part of a capture
    (:func:`merged_span`).  One sort of integer codes
    (source topic, bin, event) packed into an int64; the aggregates are reductions over the
    sorted runs.
    """
    options = options or AnalysisOptions()
    if _arrow(events, "capture").null_count:
        events = events[events["capture"].notna().to_numpy(dtype=bool)]  # Spark's join drops
    ts, ts_null = _ints(events, "ts_ns")
    capture = _codes(events, ["capture"])
    n_cap = int(capture.max(initial=-1)) + 1
    big = np.iinfo(np.int64).max
    t0 = np.full(n_cap, big, dtype=np.int64)
    t1 = np.full(n_cap, -big - 1, dtype=np.int64)
    np.minimum.at(t0, capture[~ts_null], ts[~ts_null])
    np.maximum.at(t1, capture[~ts_null], ts[~ts_null])
    if bounds is not None and n_cap:
        for code, name in enumerate(_capture_names(events, capture)):
            if name in bounds:
                t0[code], t1[code] = bounds[name]
    no_time = t0 == big  # Spark: t0 null, greatest(1, null) = 1
    span = (t1 - t0 + 1).astype(np.float64)
    width = np.where(no_time, 1, np.maximum(1, np.ceil(span / options.flight_bins))
                     ).astype(np.int64)
    row_t0, row_width = t0[capture], width[capture]
    bin_null = ts_null | no_time[capture]
    bins = np.where(bin_null, 0,
                    np.floor((ts - row_t0).astype(np.float64) / row_width)).astype(np.int64)

    flight = _codes(events, FLIGHT)
    n_flights = int(flight.max(initial=-1)) + 1
    event, _ = _ints(events, "event")
    in_flight, _ = _ints(events, "in_flight")
    delta, _ = _ints(events, "delta")
    timed = bins[~bin_null]
    low = int(timed.min()) if len(timed) else 0
    high = int(timed.max()) if len(timed) else -1
    # a null bin after the others (as the sort of the Spark twin's port put it)
    bin_key = np.where(bin_null, high - low + 1, bins - low)
    bin_size = high - low + 2
    order = _order([(flight, n_flights), (bin_key, bin_size),
                    _int_codes(event, np.zeros(len(event), dtype=bool))])
    starts = _starts(flight[order] * bin_size + bin_key[order])
    ends = _ends(starts, len(order))
    rows = order[starts]
    out = events[FLIGHT].iloc[rows].reset_index(drop=True)
    idx = out.index
    out["bin"] = _column(bins[rows], bin_null[rows], pa.int64(), idx)
    f = in_flight[order]
    out["max_in_flight"] = _column(_reduce(np.maximum, f, starts), None, pa.int64(), idx)
    out["end_in_flight"] = _column(f[ends], None, pa.int64(), idx)
    d = delta[order]
    out["sent"] = _column(_reduce(np.add, d > 0, starts), None, pa.int64(), idx)
    out["stabilized"] = _column(_reduce(np.add, d < 0, starts), None, pa.int64(), idx)
    start = row_t0[rows] + bins[rows] * row_width[rows]
    out["bin_start_ns"] = _column(start, bin_null[rows], pa.int64(), idx)
    out["bin_end_ns"] = _column(start + row_width[rows], bin_null[rows], pa.int64(), idx)
    return out


def _group_max(table: pd.DataFrame, group: np.ndarray, n_groups: int, name: str,
               kind: pa.DataType, index: pd.Index) -> pd.Series:
    """Per group, the greatest non-null value of integer column ``name`` (null when none)."""
    values, nulls = _ints(table, name)
    least = np.iinfo(np.int64).min
    best = np.full(n_groups, least, dtype=np.int64)
    np.maximum.at(best, group[~nulls], values[~nulls])
    return _column(best, best == least, kind, index)


def flight_size_summary(events: pd.DataFrame, stable: pd.DataFrame,
                        options: AnalysisOptions | None = None,
                        topics: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per source topic: messages sent, stabilized, never stable in the capture, the peak
    in-flight count and when (the earliest event reaching it), the count after the last
    event, and how many store ACKs stability needed (``acks_needed``) of how many
    ``stores`` (null without a stable message), under ``stability_rule``.

    ``events`` from :func:`flight_events`, ``stable`` from :func:`stable_times`.  With
    ``topics`` (``capture, session, tidx, advertised_topic``: the advertised topics) each row
    gets its ``topic`` name (null when not advertised).  Columns in the order of the Spark
    result: the join keys first.  One sort of the events by source topic and event; the
    peak is the first event of its source topic equal to the topic's greatest count.
    """
    options = options or AnalysisOptions()
    flight = _codes(events, FLIGHT)
    n_flights = int(flight.max(initial=-1)) + 1
    event, _ = _ints(events, "event")
    in_flight, _ = _ints(events, "in_flight")
    delta, _ = _ints(events, "delta")
    ts, ts_null = _ints(events, "ts_ns")

    by_event = _order([(flight, n_flights),
                       _int_codes(event, np.zeros(len(event), dtype=bool))])
    starts = _starts(flight[by_event])
    ends = _ends(starts, len(by_event))
    rows = by_event[starts]
    out = events[FLIGHT].iloc[rows].reset_index(drop=True)
    idx = out.index
    d = delta[by_event]
    messages = _reduce(np.add, d > 0, starts)
    stabilized = _reduce(np.add, d < 0, starts)
    # peak: the largest count, first reached (smallest event)
    f = in_flight[by_event]
    peak = _reduce(np.maximum, f, starts)
    sizes = np.diff(np.r_[starts, len(by_event)])
    reached = np.where(f == np.repeat(peak, sizes), np.arange(len(f)), len(f))
    peak_rows = by_event[_reduce(np.minimum, reached, starts)]
    out["messages"] = _column(messages, None, pa.int64(), idx)
    out["stabilized"] = _column(stabilized, None, pa.int64(), idx)
    out["peak_in_flight"] = _column(in_flight[peak_rows], None, pa.int64(), idx)
    out["peak_ts_ns"] = _column(ts[peak_rows], ts_null[peak_rows], pa.int64(), idx)
    out["end_in_flight"] = _column(in_flight[by_event[ends]], None, pa.int64(), idx)
    out["never_stable"] = _column(messages - stabilized, None, pa.int64(), idx)

    keyed = stable[_has_keys(stable, FLIGHT)] if len(stable) else stable
    group = _codes(keyed, FLIGHT)
    n_groups = int(group.max(initial=-1)) + 1
    reps = np.zeros(n_groups, dtype=np.int64)
    reps[group] = np.arange(len(group))
    needed = keyed[FLIGHT].iloc[reps].reset_index(drop=True)
    needed["stores"] = _group_max(keyed, group, n_groups, "stores",
                                  _arrow(keyed, "stores").type, needed.index)
    needed["acks_needed"] = _group_max(keyed, group, n_groups, "needed",
                                       _arrow(keyed, "needed").type, needed.index)
    out = _left_join(out, needed, FLIGHT)
    out["stability_rule"] = series(pa.array([options.stability_rule] * len(out), pa.string()),
                                   out.index)
    if topics is None:
        return out
    on = ["capture", "session", "tidx"]
    out = _left_join(out, topics[[*on, "advertised_topic"]], on)
    out = out.rename(columns={"advertised_topic": "topic"})
    return out[[*on, *[c for c in out.columns if c not in on]]]
