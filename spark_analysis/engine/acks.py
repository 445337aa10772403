"""Stability and consumption latency: how long after its send each message was acknowledged.

:func:`stability_acks` (store to source) and :func:`consumption_acks` (receiver to store) give
one row per ACK with the latest send of the acknowledged message at or before it and the
latency between them; :func:`latency_summary` and :func:`latency_histogram` condense them per
source topic and store.

Grouping and joining work on integer codes of the key columns: an integer column by its
distance from its least value, a string column through a dictionary of its (few) values,
combined in mixed radix (``_pair_codes``, ``_groups``).  The as-of join sorts only the sends,
by one int64 code of message and send time, and finds each ACK's send by binary search; the
summaries count and sort by group code and take the key values once per group from the
dictionaries.  No step loops per row, hashes a tuple per row, or copies a string column
except into an output.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_analysis.engine.common import (
    arrow,
    dense_codes,
    dictionary_encode,
    plain,
    series,
)
from spark_analysis.engine.inputs import ACK_COLUMNS
from spark_analysis.engine.options import PERCENTILES, AnalysisOptions
from wire.lbmc import AckType

_SEND_KEY = ["capture", "source_ip", "tidx", "sqn"]
"""What names a message of a source: the key of an ACK's as-of join with the sends."""

_PERCENTILE_COLUMNS = ("p50_us", "p90_us", "p99_us")
"""The output columns of :data:`~spark_analysis.engine.options.PERCENTILES`, in order."""

Array: TypeAlias = pa.Array | pa.ChunkedArray


# ---------------------------------------------------------------------------------------------
# Column and key helpers
# ---------------------------------------------------------------------------------------------

def _flat(values: Array) -> pa.Array:
    """One contiguous Arrow array (a chunked one combined)."""
    if isinstance(values, pa.ChunkedArray):
        return values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    return values


def _col(table: pd.DataFrame, name: str) -> pa.Array:
    return _flat(arrow(table[name]))


def _frame(columns: dict[str, Array]) -> pd.DataFrame:
    """A pandas table of Arrow-backed columns (all of one length), in the order given."""
    n = len(next(iter(columns.values()))) if columns else 0
    index = pd.RangeIndex(n)
    return pd.DataFrame({name: series(values, index) for name, values in columns.items()},
                        index=index)


def _codes(columns: Sequence[Array]) -> np.ndarray:
    """One int64 code per row for the tuple of ``columns``: equal tuples share a code, and a
    null equals a null (as grouping keys do in Spark)."""
    n = len(columns[0])
    codes = np.zeros(n, dtype=np.int64)
    for values in columns:
        encoded = dictionary_encode(_flat(values), null_encoding="encode")
        part = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        combined = codes * max(len(encoded.dictionary), 1) + part
        codes = pd.factorize(combined)[0].astype(np.int64)
    return codes


_LIMIT = 1 << 62
"""Mixed-radix codes stay below this (no 64-bit overflow)."""


def _distinct(values: np.ndarray) -> np.ndarray:
    """The distinct ``values``, ascending (by a sort: numpy's hashing ``unique`` is slower on
    millions of integers)."""
    ordered = np.sort(values)
    if len(ordered) < 2:
        return ordered
    keep = np.empty(len(ordered), dtype=bool)
    keep[0] = True
    np.not_equal(ordered[1:], ordered[:-1], out=keep[1:])
    return ordered[keep]


def _part(right: pa.Array, left: pa.Array,
          null_equal: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """Codes in ``range(size)`` of the values of ``right`` and, for ``left``, of the same
    values (-1 for a value ``right`` lacks), and ``size``.  A null is a value of its own with
    ``null_equal`` (as in a grouping), else its code is -1 on both sides (as in a join).  An
    integer column is coded by its distance from its least value when their span is small
    (no hashing), any other through a dictionary of ``right``'s values (``left`` may come
    dictionary-encoded with ``null_encoding="encode"``: then only its dictionary is looked
    up)."""
    if pa.types.is_integer(right.type) and pa.types.is_integer(left.type):
        r_null = pc.is_null(right).to_numpy(zero_copy_only=False)
        l_null = pc.is_null(left).to_numpy(zero_copy_only=False)
        r_val = pc.fill_null(right, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        l_val = pc.fill_null(left, 0).to_numpy(zero_copy_only=False).astype(np.int64)
        shift = 1 if null_equal else 0
        present = r_val[~r_null]
        low = int(present.min()) if len(present) else 0
        high = int(present.max()) if len(present) else -1
        if high - low < (1 << 31):
            r_code = r_val - low + shift
            l_code = l_val - low + shift
            l_code[(l_val < low) | (l_val > high)] = -1
            size = high - low + 1 + shift
        else:
            uniques = _distinct(present)
            r_code = np.searchsorted(uniques, r_val) + shift
            at = np.minimum(np.searchsorted(uniques, l_val), len(uniques) - 1)
            l_code = np.where(uniques[at] == l_val, at + shift, -1)
            size = len(uniques) + shift
        r_code[r_null] = 0 if null_equal else -1
        l_code[l_null] = 0 if null_equal else -1
        return r_code, l_code, max(size, 1)
    values = right.type.value_type if pa.types.is_dictionary(right.type) else right.type
    encoded = dictionary_encode(right, null_encoding="encode" if null_equal else "mask")
    r_code = pc.fill_null(encoded.indices, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    if isinstance(left, pa.DictionaryArray):
        # encoded (an input's strings, or a caller's codes): normalised, a null an entry of
        # its own, and only its few values looked up, not every row
        left = dictionary_encode(left, null_encoding="encode")
        found = pc.index_in(left.dictionary.cast(values), value_set=encoded.dictionary,
                            skip_nulls=not null_equal)
        per_entry = pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int64)
        rows = left.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        l_code = per_entry[rows] if len(per_entry) else np.full(len(rows), -1, dtype=np.int64)
    else:
        found = pc.index_in(left.cast(values), value_set=encoded.dictionary,
                            skip_nulls=not null_equal)
        l_code = pc.fill_null(found, -1).to_numpy(zero_copy_only=False).astype(np.int64)
    return r_code, l_code, max(len(encoded.dictionary), 1)


def _pair_codes(right: Sequence[Array], left: Sequence[Array], null_equal: bool,
                room: int = 1) -> tuple[np.ndarray, np.ndarray, int]:
    """One int64 code per row of the key columns ``right`` (``size`` codes at most) and, for
    each row of ``left``, the code of the equal key of ``right`` or -1 when ``right`` has none:
    the columns' codes (:func:`_part`) in mixed radix, made dense again (``right``'s distinct
    keys) when the radix times ``room`` would overflow.  Without ``null_equal`` a key with a
    null is -1 on both sides."""
    r_code = np.zeros(len(right[0]), dtype=np.int64)
    l_code = np.zeros(len(left[0]), dtype=np.int64)
    r_bad = np.zeros(len(r_code), dtype=bool)
    l_bad = np.zeros(len(l_code), dtype=bool)
    radix = 1

    def dense() -> int:
        nonlocal r_code, l_code
        uniques, r_code = np.unique(r_code, return_inverse=True)
        r_code = r_code.astype(np.int64).reshape(-1)
        at = np.minimum(np.searchsorted(uniques, l_code), max(len(uniques) - 1, 0))
        if len(uniques):
            l_bad[uniques[at] != l_code] = True
        l_code = at.astype(np.int64)
        return max(len(uniques), 1)

    for r_values, l_values in zip(right, left, strict=True):
        r_part, l_part, size = _part(_flat(r_values), _flat(l_values), null_equal)
        if radix * size >= _LIMIT:
            radix = dense()
        r_bad |= r_part < 0
        l_bad |= l_part < 0
        r_code = r_code * size + np.maximum(r_part, 0)
        l_code = l_code * size + np.maximum(l_part, 0)
        radix *= size
    if radix * room >= _LIMIT:
        radix = dense()
    r_code[r_bad] = -1
    l_code[l_bad] = -1
    return r_code, l_code, radix


def _lookup(left: Sequence[Array], right: Sequence[Array]) -> np.ndarray:
    """For each row of ``left``, the row of ``right`` with equal keys, or -1: an equi-join's
    match with the keys of ``right`` unique (as after a group-by).  A null key matches
    nothing, as in a SQL join."""
    r_code, l_code, _ = _pair_codes(right, left, null_equal=False)
    rows = np.flatnonzero(r_code >= 0)
    rows = rows[np.argsort(r_code[rows], kind="stable")]
    keys = r_code[rows]
    if not len(keys):
        return np.full(len(l_code), -1, dtype=np.int64)
    at = np.minimum(np.searchsorted(keys, l_code), len(keys) - 1)
    return np.where((l_code >= 0) & (keys[at] == l_code), rows[at], -1)


def _take(values: Array, rows: np.ndarray) -> pa.Array:
    """``values`` at ``rows``; a null where the row is -1."""
    indices = pa.array(rows, pa.int64(), mask=rows < 0)
    return pc.take(_flat(values), indices)


def _first_by_pos(table: pd.DataFrame, keys: Sequence[Array]) -> tuple[np.ndarray, np.ndarray]:
    """Per group of ``keys``: the row with the least ``pos`` (Spark's ``min_by(x, pos)``,
    which ignores rows whose ``pos`` is null) and whether there was one.  Returns the row of
    each group (one per group, in first-seen order) and a mask of the groups that had a
    ``pos``; a group whose every ``pos`` is null yields null values."""
    codes = _codes(keys)
    pos = _col(table, "pos")
    missing = pc.is_null(pos).to_numpy(zero_copy_only=False)
    value = pc.fill_null(pos, 0).to_numpy(zero_copy_only=False)
    order = np.lexsort((value, missing, codes))
    _, first = np.unique(codes[order], return_index=True)
    rows = order[first]
    return rows, ~missing[rows]


# ---------------------------------------------------------------------------------------------
# ACKs and the as-of join with the sends
# ---------------------------------------------------------------------------------------------

def _acks(messages: pd.DataFrame, ack_type: int) -> dict[str, pa.Array]:
    """The messages carrying a UME ACK of ``ack_type`` (``ume_ack.type``), with the ACK's
    fields flattened: ``transport_idx``, ``id_2``, ``rcv_reg_id`` and ``sqn`` (its seqnum)."""
    # the messages columns stay chunked (combining the wide struct column would copy it)
    ack = arrow(messages["ume_ack"])
    is_type = pc.and_kleene(pc.is_valid(ack),
                            pc.equal(pc.struct_field(ack, "type"), ack_type))
    keep = pc.fill_null(is_type, False)
    out = {name: _flat(pc.filter(arrow(messages[name]), keep)) for name in ACK_COLUMNS}
    # only the four fields are filtered, not the whole struct (its other children)
    for name, field in (("transport_idx", "transport_idx"), ("id_2", "id_2"),
                        ("rcv_reg_id", "rcv_reg_id"), ("sqn", "seqnum")):
        out[name] = _flat(pc.filter(pc.struct_field(ack, field), keep))
    return out


def _as_of_send(acks: dict[str, pa.Array], sends: pd.DataFrame,
                coded: dict[str, pa.Array] | None = None) -> dict[str, pa.Array]:
    """``acks`` with the latest send of its message at or before each ACK (or nulls):
    ``session``, ``send_ts_ns`` and ``latency_us``.

    The sends of one message (:data:`_SEND_KEY`, a null key part equal to a null) are ordered
    by time (a null time first, as Spark sorts), those of one instant by ``session`` (the
    greatest last); an ACK takes the last send of its message at or before its instant (a
    send of the ACK's own instant included).  Done as one sort of the sends alone by a single
    int64 code, message code and rank of the send time, and one binary search per ACK for the
    code of its message and time (the number of send times at or before it): no sort of the
    ACKs, no string compared.  (``pd.merge_asof`` would need non-null times and keys and its
    own tie rule.)  ``coded`` may hold key columns of ``acks`` already dictionary-encoded
    (:func:`_part`)."""
    send_ts = _col(sends, "send_ts_ns").cast(pa.int64())
    has_ts = pc.is_valid(send_ts).to_numpy(zero_copy_only=False)
    send_time = pc.fill_null(send_ts, 0).to_numpy(zero_copy_only=False)
    times = _distinct(send_time[has_ts])
    width = len(times) + 1
    send_code, ack_code, _ = _pair_codes([_col(sends, k) for k in _SEND_KEY],
                                         [(coded or {}).get(k, _flat(acks[k]))
                                          for k in _SEND_KEY],
                                         null_equal=True, room=width)
    # a send's time as 1 + its rank among the send times (0 when null); an ACK's as the number
    # of send times at or before it: a send is at or before the ACK when its value is <= the
    # ACK's (a send of a null time before every ACK, as Spark sorts a null first)
    send_when = np.where(has_ts, np.searchsorted(times, send_time) + 1, 0)
    ack_ts = _flat(acks["ts_ns"]).cast(pa.int64())
    ack_has_ts = pc.is_valid(ack_ts).to_numpy(zero_copy_only=False)
    ack_when = np.where(ack_has_ts,
                        np.searchsorted(times, pc.fill_null(ack_ts, 0).to_numpy(
                            zero_copy_only=False), side="right"), 0)
    # Spark orders strings by their UTF-8 bytes, as Arrow's sort does; a null session first
    session = _col(sends, "session")
    encoded = dictionary_encode(session)
    rank_of = np.empty(len(encoded.dictionary), dtype=np.int64)
    rank_of[pc.array_sort_indices(encoded.dictionary).to_numpy()] = np.arange(len(rank_of))
    entry = pc.fill_null(encoded.indices, 0).to_numpy(zero_copy_only=False).astype(np.int64)
    rank = np.where(pc.is_null(session).to_numpy(zero_copy_only=False), -1,
                    rank_of[entry] if len(rank_of) else -1)
    send_key = send_code * width + send_when
    order = np.lexsort((rank, send_key))
    sorted_key = send_key[order]
    ack_key = ack_code * width + ack_when
    at = np.searchsorted(sorted_key, ack_key, side="right") - 1
    hit = np.maximum(at, 0)
    found = (ack_code >= 0) & (at >= 0)
    if len(sorted_key):
        found &= sorted_key[hit] >= ack_code * width
    else:
        found[:] = False
    matched = np.where(found, order[hit] if len(order) else -1, -1)
    out = dict(acks)
    out["session"] = _take(session, matched)
    out["send_ts_ns"] = _take(_col(sends, "send_ts_ns"), matched)
    out["latency_us"] = pc.divide(
        pc.cast(pc.subtract(_flat(acks["ts_ns"]), out["send_ts_ns"]), pa.float64()), 1000.0)
    return out


def _source_topics(regs: pd.DataFrame) -> pd.DataFrame:
    """The topic of each source transport index and topic index: one row per (``capture``,
    ``source_ip``, ``transport_idx``, ``topic_idx``) of the source registrations, with the
    ``topic`` of its first registration in capture order (least ``pos``)."""
    names = ["capture", "source_ip", "transport_idx", "topic_idx"]
    source = regs[(regs["role"] == "source").fillna(False).astype(bool)]
    rows, has_pos = _first_by_pos(source, [_col(source, k) for k in names])
    out = {k: pc.take(_col(source, k), pa.array(rows, pa.int64())) for k in names}
    out["topic"] = _take(_col(source, "topic"), np.where(has_pos, rows, -1))
    return _frame(out)


def _receiver_registrations(regs: pd.DataFrame) -> pd.DataFrame:
    """Per granted receiver registration (``capture``, ``store_ip``, granted RegID as
    ``rcv_reg_id``): the ``source_ip``, ``topic_idx`` and ``topic`` of its first
    registration in capture order (least ``pos``)."""
    granted = regs[((regs["role"] == "receiver") & (regs["outcome"] == "granted"))
                   .fillna(False).astype(bool)]
    keys = [_col(granted, "capture"), _col(granted, "store_ip"), _col(granted, "granted_reg_id")]
    rows, has_pos = _first_by_pos(granted, keys)
    picked = pa.array(rows, pa.int64())
    chosen = np.where(has_pos, rows, -1)
    return _frame({"capture": pc.take(keys[0], picked), "store_ip": pc.take(keys[1], picked),
                   "rcv_reg_id": pc.take(keys[2], picked),
                   "source_ip": _take(_col(granted, "source_ip"), chosen),
                   "topic_idx": _take(_col(granted, "topic_idx"), chosen),
                   "topic": _take(_col(granted, "topic"), chosen)})


def _registered(regs: pd.DataFrame, keys: Sequence[Array]) -> tuple[pd.DataFrame, np.ndarray]:
    """:func:`_receiver_registrations` and, for each row of ``keys`` (capture, store address,
    receiver RegID of a consumption ACK), its registration's row there, or -1."""
    receivers = _receiver_registrations(regs)
    return receivers, _lookup(keys, [_col(receivers, k)
                                     for k in ("capture", "store_ip", "rcv_reg_id")])


def ack_hosts(messages: pd.DataFrame, regs: pd.DataFrame) -> pa.Array:
    """The source host (:mod:`spark_analysis.engine.owners`) of each message of ``messages``
    (``Inputs.acks``): for a consumption ACK the source of its receiver's registration, as
    :func:`consumption_acks` finds it (null without one), else the destination (a stability
    ACK's source, :func:`stability_acks`)."""
    ack = _col(messages, "ume_ack")
    destination = plain(_col(messages, "dst_ip")).cast(pa.string())
    if not len(ack):
        return destination
    consumption = pc.fill_null(pc.equal(pc.struct_field(ack, "type"), AckType.CDELV), False)
    receivers, match = _registered(regs, [_col(messages, "capture"), _col(messages, "dst_ip"),
                                          _flat(pc.struct_field(ack, "rcv_reg_id"))])
    source = plain(_take(_col(receivers, "source_ip"), match)).cast(pa.string())
    return pc.if_else(consumption, source, destination)


# ---------------------------------------------------------------------------------------------
# Per-ACK tables
# ---------------------------------------------------------------------------------------------

def stability_acks(messages: pd.DataFrame, sends: pd.DataFrame,
                   regs: pd.DataFrame) -> pd.DataFrame:
    """How long did each message take to become stable at each store?

    One row per stability ACK (store to source): the store, the source (the ACK's
    destination), the topic index (``id_2`` of a store's ACK) and the sequence number it
    acknowledges, the latest send of that message at or before the ACK and the latency
    between them.  ``send_ts_ns`` (and ``session``, ``latency_us``) is null when the capture
    holds no such send.  ``topic`` comes from the source's first registration of that
    transport and topic index; null without one (or with a null key).  Columns in the order
    of the Spark twin (the join keys first).  Only the messages with a ``ume_ack`` are read:
    all messages or the control messages alone (``Inputs.acks``) give the same.
    """
    raw = _acks(messages, AckType.STABLE)
    acks = {"capture": raw["capture"], "pos": raw["pos"], "msg_index": raw["msg_index"],
            "ts_ns": raw["ts_ns"], "file": raw["file"], "file_offset": raw["file_offset"],
            "store_ip": raw["src_ip"], "store_port": raw["src_port"],
            "source_ip": raw["dst_ip"], "transport_idx": raw["transport_idx"],
            "tidx": raw["id_2"], "sqn": raw["sqn"]}
    # the string keys hashed once, for both joins
    coded = {k: dictionary_encode(acks[k], null_encoding="encode")
             for k in ("capture", "source_ip")}
    timed = _as_of_send(acks, sends, coded)
    topics = _source_topics(regs)
    join = ["capture", "source_ip", "transport_idx", "tidx"]
    match = _lookup([coded.get(k, timed[k]) for k in join],
                    [_col(topics, k) for k in ("capture", "source_ip", "transport_idx",
                                               "topic_idx")])
    rest = ["pos", "msg_index", "ts_ns", "file", "file_offset", "store_ip", "store_port", "sqn",
            "session", "send_ts_ns", "latency_us"]
    out = {k: timed[k] for k in join + rest}
    out["topic"] = _take(_col(topics, "topic"), match)
    return _frame(out)


def consumption_acks(messages: pd.DataFrame, sends: pd.DataFrame,
                     regs: pd.DataFrame) -> pd.DataFrame:
    """How long after a message was sent did each receiver acknowledge consuming it?

    One row per consumption ACK (CDELV, receiver to store): the receiver, the store, the
    receiver RegID and, through the receiver's registration with that store (its first
    granted registration under that RegID), the source, topic index and topic; then, as for
    :func:`stability_acks`, the latest send of the acknowledged sequence number and the
    latency.  A cumulative (batched) ACK is measured for the sequence number it names.  An
    ACK whose registration is not in the capture has a null ``source_ip`` (and so no send).
    ``messages``: as for :func:`stability_acks`.
    """
    raw = _acks(messages, AckType.CDELV)
    acks = {"capture": raw["capture"], "pos": raw["pos"], "msg_index": raw["msg_index"],
            "ts_ns": raw["ts_ns"], "file": raw["file"], "file_offset": raw["file_offset"],
            "receiver_ip": raw["src_ip"], "receiver_port": raw["src_port"],
            "store_ip": raw["dst_ip"], "store_port": raw["dst_port"],
            "transport_idx": raw["transport_idx"], "rcv_reg_id": raw["rcv_reg_id"],
            "sqn": raw["sqn"]}
    receivers, match = _registered(regs, [acks[k] for k in ("capture", "store_ip",
                                                             "rcv_reg_id")])
    acks["source_ip"] = _take(_col(receivers, "source_ip"), match)
    acks["tidx"] = _take(_col(receivers, "topic_idx"), match)
    acks["topic"] = _take(_col(receivers, "topic"), match)
    return _frame(_as_of_send(acks, sends))


# ---------------------------------------------------------------------------------------------
# Summaries
# ---------------------------------------------------------------------------------------------

def _kinds(stability: pd.DataFrame, consumption: pd.DataFrame,
           names: Sequence[str]) -> tuple[list[np.ndarray], list[pa.Array]]:
    """Stability and consumption rows together, as codes: per column of ``names`` (``kind``
    being ``stability`` or ``consumption``; a column consumption alone has is null for
    stability), a code per row (stability rows first) into a dictionary of the column's
    values (a null a value of its own).  Each table's column is dictionary-encoded once and
    the two small dictionaries unified, so no string column is copied or concatenated."""
    tables = (stability, consumption)
    codes: list[np.ndarray] = []
    dictionaries: list[pa.Array] = []
    for name in names:
        if name == "kind":
            codes.append(np.repeat(np.arange(2, dtype=np.int64),
                                   [len(stability), len(consumption)]))
            dictionaries.append(pa.array(["stability", "consumption"], pa.string()))
            continue
        owner = consumption if name in consumption.columns else stability
        kind = _col(owner, name).type
        parts, values = [], []
        for table in tables:
            if name in table.columns:
                encoded = dictionary_encode(_col(table, name).cast(kind),
                                               null_encoding="encode")
                parts.append(encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64))
                values.append(encoded.dictionary)
            else:
                parts.append(np.zeros(len(table), dtype=np.int64))
                values.append(pa.nulls(1 if len(table) else 0, kind))
        joint = dictionary_encode(pa.concat_arrays(values), null_encoding="encode")
        unified = joint.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        codes.append(np.concatenate([unified[part] if len(unified) else part for part in
                                     (parts[0], parts[1] + len(values[0]))]))
        dictionaries.append(joint.dictionary)
    return codes, dictionaries


def _groups(codes: Sequence[np.ndarray],
            sizes: Sequence[int]) -> tuple[np.ndarray, list[np.ndarray]]:
    """Per row, a group (0, 1, ...) of its tuple of ``codes`` (column k's in
    ``range(sizes[k])``), and per group the code of each column: the codes in mixed radix,
    made dense by a table when the radix is small (no sort), else by a sort."""
    n = len(codes[0])
    combined = np.zeros(n, dtype=np.int64)
    radix = 1
    for code, size in zip(codes, sizes, strict=True):
        if radix * size >= _LIMIT:
            combined, radix = dense_codes(combined, radix)
        combined = combined * size + code
        radix *= size
    group, count = dense_codes(combined, radix)
    some_row = np.zeros(count, dtype=np.int64)
    some_row[group] = np.arange(n)
    return group, [code[some_row] for code in codes]


def _latencies(stability: pd.DataFrame, consumption: pd.DataFrame) -> tuple[np.ndarray,
                                                                             np.ndarray]:
    """The ``latency_us`` of the stability rows then the consumption rows (0 where null),
    and whether each is there (not null)."""
    values, valid = [], []
    for table in (stability, consumption):
        latency = _col(table, "latency_us").cast(pa.float64())
        values.append(pc.fill_null(latency, 0.0).to_numpy(zero_copy_only=False))
        valid.append(pc.is_valid(latency).to_numpy(zero_copy_only=False))
    return np.concatenate(values), np.concatenate(valid)


def _spark_percentiles(values: np.ndarray, starts: np.ndarray, counts: np.ndarray,
                       fraction: float) -> np.ndarray:
    """Spark's exact ``percentile`` per group of the sorted ``values`` (group g is
    ``values[starts[g]:starts[g] + counts[g]]``, ``counts`` > 0): at position
    ``(n - 1) * fraction``, the value there when the position is whole or both neighbours are
    equal, else ``low + (position - lower) * (high - low)``.  That is numpy's default linear
    interpolation, but not its arithmetic: numpy computes ``high - (high - low) * (1 - t)``
    when the fraction t >= 0.5, which can differ in the last bit, so it is written out here
    as Spark 4's ``PercentileBase.getPercentile`` computes it."""
    position = (counts - 1).astype(np.float64) * fraction
    lower = np.floor(position)
    higher = np.ceil(position)
    low = values[starts + lower.astype(np.int64)]
    high = values[starts + higher.astype(np.int64)]
    mixed = low + (position - lower) * (high - low)
    return np.where((lower == higher) | (low == high), low, mixed)


def _by_group(values: np.ndarray, owners: np.ndarray, n_groups: int) -> np.ndarray:
    """The order that sorts ``values`` by group ``owners``, then ascending: a sort of the
    values, then a stable sort of their groups (a radix sort when the groups are few).  Both
    stable: numpy's merge sort profits from the runs latencies come in, its quicksort is
    slow on their many equal values."""
    by_value = np.argsort(values, kind="stable")
    narrow = np.uint16 if n_groups <= (1 << 16) else np.int64
    by_group = np.argsort(owners[by_value].astype(narrow), kind="stable")
    return by_value[by_group]


def latency_summary(stability: pd.DataFrame, consumption: pd.DataFrame) -> pd.DataFrame:
    """Stability and consumption latency percentiles per source topic and store.

    Per ``capture``, ``kind``, ``source_ip``, ``tidx``, ``topic`` and ``store_ip`` (a null a
    value of its own): ``acks`` counted, ``matched`` (with a send in the capture), the
    distinct ``receivers`` (0 for stability), and over the matched latencies min, max, mean
    and the exact percentiles p50/p90/p99 in microseconds (null when none matched).  The
    percentiles follow Spark's ``percentile`` (linear interpolation between the closest
    ranks); one sort of all latencies by group serves every group.  Groups are found on
    integer codes of the key columns (:func:`_kinds`, :func:`_groups`); the key values are
    taken once per group from the small dictionaries.
    """
    keys = ["capture", "kind", "source_ip", "tidx", "topic", "store_ip"]
    codes, dictionaries = _kinds(stability, consumption, keys)
    group, group_codes = _groups(codes, [max(len(d), 1) for d in dictionaries])
    n_groups = len(group_codes[0])
    acks = np.bincount(group, minlength=n_groups)
    latency, valid = _latencies(stability, consumption)
    matched = np.bincount(group[valid], minlength=n_groups)
    if "receiver_ip" in consumption.columns:
        encoded = dictionary_encode(_col(consumption, "receiver_ip"))
        receiver = pc.fill_null(encoded.indices, -1).to_numpy(
            zero_copy_only=False).astype(np.int64)
        has = receiver >= 0
        width = max(len(encoded.dictionary), 1)
        pairs = _distinct(group[len(stability):][has] * width + receiver[has])
        receivers = np.bincount(pairs // width, minlength=n_groups)
    else:
        receivers = np.zeros(n_groups, dtype=np.int64)
    values, owners = latency[valid], group[valid]
    order = _by_group(values, owners, n_groups)
    values, owners = values[order], owners[order]
    starts = np.searchsorted(owners, np.arange(n_groups))
    some = matched > 0
    cut = np.minimum(starts, max(len(values) - 1, 0))
    ends = np.maximum(starts + matched - 1, 0)

    def stat(result: np.ndarray) -> pa.Array:
        return pa.array(result, pa.float64(), mask=~some)

    out = {k: pc.take(d, pa.array(c, pa.int64()))
           for k, d, c in zip(keys, dictionaries, group_codes, strict=True)}
    out["acks"] = pa.array(acks, pa.int64())
    out["matched"] = pa.array(matched, pa.int64())
    out["receivers"] = pa.array(receivers, pa.int64())
    if len(values):
        lows, highs = values[cut], values[np.minimum(ends, len(values) - 1)]
        # summed in ascending order within each group (the order the sort gives)
        sums = np.bincount(owners, weights=values, minlength=n_groups)
        means = sums / np.maximum(matched, 1)
    else:
        lows = highs = means = np.zeros(n_groups)
    out["min_us"] = stat(lows)
    out["max_us"] = stat(highs)
    out["mean_us"] = stat(means)
    for name, fraction in zip(_PERCENTILE_COLUMNS, PERCENTILES, strict=True):
        full = np.zeros(n_groups)
        if len(values):
            full[some] = _spark_percentiles(values, cut[some], matched[some], fraction)
        out[name] = stat(full)
    return _frame(out)


def latency_histogram(stability: pd.DataFrame, consumption: pd.DataFrame,
                      options: AnalysisOptions | None = None) -> pd.DataFrame:
    """The shape of the latency distributions: counts in log-spaced buckets per kind, source
    and store.

    ``bucket`` = floor(log_base(max(latency, 1))) (``bucket_low_us`` <= latency <
    ``bucket_high_us``; latencies under 1 us share the first bucket), ``base`` being
    ``options.histogram_base``.  The logarithm is computed as Spark's ``log(base, x)``, ln x /
    ln base in floating point, so a latency at a power of the base lands in the bucket Spark
    puts it in, even the one below (1000 us with base 10: 2.9999999999999996, bucket 2).
    Unmatched ACKs (null latency) are not counted.  Counted on integer codes of the keys, as
    :func:`latency_summary` groups.
    """
    base = (options or AnalysisOptions()).histogram_base
    keys = ["capture", "kind", "source_ip", "store_ip"]
    codes, dictionaries = _kinds(stability, consumption, keys)
    latency, valid = _latencies(stability, consumption)
    bucket = np.floor(np.log(np.maximum(latency[valid], 1.0)) / np.log(base)).astype(np.int64)
    least = int(bucket.min()) if len(bucket) else 0
    span = int(bucket.max()) - least + 1 if len(bucket) else 1
    group, group_codes = _groups([c[valid] for c in codes] + [bucket - least],
                                 [max(len(d), 1) for d in dictionaries] + [span])
    count = np.bincount(group, minlength=len(group_codes[0]))
    out = {k: pc.take(d, pa.array(c, pa.int64()))
           for k, d, c in zip(keys, dictionaries, group_codes, strict=False)}
    low = group_codes[-1] + least
    out["bucket"] = pa.array(low, pa.int64())
    out["count"] = pa.array(count, pa.int64())
    out["bucket_low_us"] = pa.array(np.power(base, low.astype(np.float64)), pa.float64())
    out["bucket_high_us"] = pa.array(np.power(base, (low + 1).astype(np.float64)),
                                     pa.float64())
    return _frame(out)
