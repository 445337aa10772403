"""Column helpers every analysis of the engine shares: session keys, durations, rates, the
ICMP tests.

Tables are pandas DataFrames whose columns are Arrow-backed (``pd.ArrowDtype``): nulls stay
nulls in every type (an integer column with a missing value stays an exact 64-bit integer),
and a result converts back to Arrow without a copy or a cast.  The helpers work on whole
columns through ``pyarrow.compute`` (no Python loop per row).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

Arrayish: TypeAlias = pa.Array | pa.ChunkedArray
"""An Arrow column: an array or a chunked one."""

ICMP_DEST_UNREACHABLE = 3
ICMP_PORT_UNREACHABLE = 3


def arrow(series: pd.Series) -> pa.ChunkedArray | pa.Array:
    """The Arrow array behind ``series`` (any dtype; an Arrow-backed one without a copy)."""
    return pa.array(series)


def plain(values: Arrayish) -> Arrayish:
    """``values`` decoded when dictionary-encoded (the inputs' low-cardinality strings,
    :data:`spark_analysis.engine.inputs.DICTIONARY`): for the few functions Arrow has no
    dictionary kernel for."""
    if pa.types.is_dictionary(values.type):
        return pc.cast(values, values.type.value_type)
    return values


def encoded(codes: np.ndarray, values: Arrayish) -> pa.DictionaryArray:
    """``values`` at ``codes`` (a per-row code into ``values``, as :func:`row_codes` gives)
    kept dictionary-encoded: what ``pc.take(values, codes)`` holds at 4 bytes a row.  For
    the strings made once per distinct key and spread to millions of rows (session keys,
    topic names).  ``values`` may hold a value twice: :func:`row_codes` codes by value."""
    dictionary = plain(values)
    if isinstance(dictionary, pa.ChunkedArray):
        dictionary = dictionary.combine_chunks()
    return pa.DictionaryArray.from_arrays(pa.array(codes, pa.int32()), dictionary)


def plain_table(table: pa.Table, keep: frozenset[str] = frozenset()) -> pa.Table:
    """``table`` with every dictionary-encoded column decoded (:func:`plain`) but those named
    in ``keep``: Arrow sorts a table by plain columns only."""
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type) and field.name not in keep:
            table = table.set_column(i, field.name, plain(table.column(i)))
    return table


def series(values: pa.Array | pa.ChunkedArray, index: pd.Index) -> pd.Series:
    """An Arrow-backed Series of ``values`` on ``index``."""
    return pd.Series(pd.arrays.ArrowExtensionArray(values), index=index)


def session_key(protocol: Any, ip: Any, port: Any, session_id: Any) -> Any:
    """``lbtrm:10.0.0.1:14390:2b7f8306``: the session key of the analyses (the sidecar's and
    tshark's way to name a transport session), from pandas Series (a Series comes back) or
    Arrow columns (an Arrow column comes back): :func:`transport_session_key`."""
    if isinstance(protocol, pd.Series):
        keys = transport_session_key(arrow(protocol), arrow(ip), arrow(port),
                                     arrow(session_id))
        return series(keys, protocol.index)
    return transport_session_key(protocol, ip, port, session_id)


def table(df: pd.DataFrame, columns: Sequence[str]) -> pa.Table:
    """The ``columns`` of ``df`` as an Arrow table (Arrow-backed columns without a copy)."""
    return pa.table({name: arrow(df[name]) for name in columns})


def frame(result: pa.Table) -> pd.DataFrame:
    """An Arrow result as the engine hands tables on: pandas with Arrow-backed columns."""
    return result.to_pandas(types_mapper=pd.ArrowDtype)


def concat_ws(sep: str, *parts: Arrayish) -> pa.ChunkedArray | pa.Array:
    """Spark's ``concat_ws``: the non-null parts (cast to string) joined by ``sep``; the
    empty string, never null, when every part is.  (Arrow's own ``null_handling="skip"``
    drops the rows whose parts are all null, so the parts are joined pairwise.)"""
    acc: Arrayish | None = None
    for part in parts:
        text = pc.cast(part, pa.string())
        acc = text if acc is None else pc.coalesce(
            pc.binary_join_element_wise(acc, text, sep), acc, text)
    assert acc is not None
    return pc.fill_null(acc, "")


def transport_session_key(protocol: Arrayish, ip: Arrayish, port: Arrayish,
                          session_id: Arrayish) -> pa.ChunkedArray | pa.Array:
    """``lbtrm:10.0.0.1:14390:2b7f8306``, the session key of the Spark analyses
    (``_session_key``), down to its edge cases: protocol, address and port joined by
    :func:`concat_ws` (a null part is left out, never a null key), then, unless the session ID
    is null, its hex digits in lower case padded to eight and cut to eight (Spark's ``lpad``
    shortens a longer string; the 64-bit two's complement of a negative ID).  The keys are
    made once per distinct combination (a capture has few sessions) and spread to the rows."""
    columns = [protocol, ip, port, pc.cast(session_id, pa.int64())]
    codes, first = row_codes(columns)
    if len(first) == len(codes):
        return _session_keys(*columns)
    picked = pa.array(first)
    keys = _session_keys(*(pc.take(c, picked) for c in columns))
    return pc.take(keys, pa.array(codes))


def _session_keys(protocol: Arrayish, ip: Arrayish, port: Arrayish,
                  sid: Arrayish) -> pa.ChunkedArray | pa.Array:
    uniq = pc.drop_null(pc.unique(sid))
    texts = pa.array([f"{v & 0xFFFFFFFFFFFFFFFF:x}".rjust(8, "0")[:8]
                      for v in uniq.to_pylist()], pa.string())
    hexed = pc.take(texts, pc.index_in(sid, value_set=uniq))
    base = concat_ws(":", protocol, ip, port)
    return pc.if_else(pc.is_null(sid), base, pc.binary_join_element_wise(base, hexed, ":"))


_LIMIT = 1 << 62
"""Mixed-radix row codes stay below this (no 64-bit overflow)."""


def _dense(values: Arrayish, span: int) -> tuple[np.ndarray, int]:
    """Per row, a code in ``range(size)`` of its value in ``values`` (a null is a value of its
    own), and ``size``: an integer column without nulls whose values span less than ``span``
    by its distance from its least value, a column of one value by 0, any other by a
    dictionary of its values."""
    whole = values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
    if not pa.types.is_dictionary(whole.type):   # (an encoded column is coded by its entries)
        if pa.types.is_integer(whole.type) and whole.null_count == 0 and len(whole):
            ints = np.asarray(whole).astype(np.int64, copy=False)
            low, high = int(ints.min()), int(ints.max())
            if high - low < span:
                return ints - low, high - low + 1
        if whole.null_count == 0 and len(whole) and pc.all(pc.equal(whole, whole[0])).as_py():
            # one value (the capture, a filtered protocol): no hashing
            return np.zeros(len(whole), dtype=np.int64), 1
    coded = dictionary_encode(whole, null_encoding="encode")
    assert isinstance(coded, pa.DictionaryArray)
    return (np.asarray(coded.indices, dtype=np.int64).reshape(-1),
            max(len(coded.dictionary), 1))


def dictionary_encode(values: Arrayish, null_encoding: str = "mask") -> Arrayish:
    """``pc.dictionary_encode`` for a column that may be dictionary-encoded already (the
    inputs' strings, :data:`spark_analysis.engine.inputs.DICTIONARY`; the session keys and
    topic names :func:`encoded` spreads): Arrow returns such a column unchanged, whatever
    ``null_encoding`` asks and though its dictionary may hold a value twice.  Here an
    encoded column comes back with a dictionary of distinct values and its nulls encoded as
    asked (``encode``: a null is an entry of the dictionary, no index is null), as a plain
    one does; without decoding it."""
    if not pa.types.is_dictionary(values.type):
        return pc.dictionary_encode(values, null_encoding=null_encoding)
    if isinstance(values, pa.ChunkedArray):   # (combining unifies the chunks' dictionaries)
        # a chunked column comes back chunked, as from Arrow
        return pa.chunked_array([dictionary_encode(values.combine_chunks(), null_encoding)])
    distinct = pc.dictionary_encode(values.dictionary, null_encoding=null_encoding)
    remap = np.asarray(pc.fill_null(distinct.indices, -1), dtype=np.int64).reshape(-1)
    entries = np.asarray(pc.fill_null(values.indices, 0), dtype=np.int64).reshape(-1)
    codes = remap[entries] if len(remap) else np.full(len(values), -1, dtype=np.int64)
    nulls = codes < 0
    if values.indices.null_count:
        nulls |= np.asarray(pc.is_null(values.indices), dtype=bool)
    dictionary = distinct.dictionary
    if null_encoding == "encode" and nulls.any():
        at = [i for i, v in enumerate(dictionary.to_pylist()) if v is None]
        if not at:
            dictionary = pa.concat_arrays([dictionary, pa.nulls(1, dictionary.type)])
            at = [len(dictionary) - 1]
        codes[nulls] = at[0]
        nulls[:] = False
    return pa.DictionaryArray.from_arrays(
        pa.array(codes, pa.int32(), mask=nulls if nulls.any() else None), dictionary)


def row_codes(columns: Sequence[Arrayish]) -> tuple[np.ndarray, np.ndarray]:
    """Per row, a code (0, 1, ... in order of first appearance) of its combination of values
    in ``columns`` (a null is a value, as in a grouping), and for each code the first row that
    has it: the way to do once per distinct combination what every row needs.  The columns'
    codes are combined in mixed radix, made dense again when the radix would overflow."""
    combined = np.zeros(len(columns[0]), dtype=np.int64)
    radix = 1
    for column in columns:
        codes, size = _dense(column, _LIMIT // radix)
        if radix * size >= _LIMIT:
            combined, first = _appearance(combined, radix)
            radix = max(len(first), 1)
            if radix * size >= _LIMIT:
                codes, size = _dense(column, 0)
        combined = combined * size + codes
        radix *= size
    return _appearance(combined, radix)


def _appearance(combined: np.ndarray, radix: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`row_codes` of one column of codes below ``radix``: by a table of the radix's
    size when that is not much more than the rows (no hashing), else by a hash
    (``pd.factorize``)."""
    n = len(combined)
    if radix <= max(4 * n, 1 << 16):
        first_at = np.full(radix, n, dtype=np.int64)
        np.minimum.at(first_at, combined, np.arange(n, dtype=np.int64))
        first = np.sort(first_at[first_at < n])
        lookup = np.empty(radix, dtype=np.int64)
        lookup[combined[first]] = np.arange(len(first), dtype=np.int64)
        return lookup[combined], first
    codes = pd.factorize(combined)[0].astype(np.int64)
    # codes come in order of first appearance: a row has a new one when it tops all before it
    new = np.ones(n, dtype=bool)
    new[1:] = codes[1:] > np.maximum.accumulate(codes)[:-1]
    return codes, np.flatnonzero(new)


def match_rows(left: Sequence[Arrayish], right: Sequence[Arrayish]) -> np.ndarray | None:
    """For each row of the key columns ``left``, the row of ``right`` with equal keys (-1 when
    none; a null key matches nothing, as in a SQL join), or None when a key occurs twice in
    ``right`` (a join would repeat the left row: the caller joins for real)."""
    n_left = len(left[0])
    # a dictionary-encoded key meets a plain one as plain values
    pairs = [(a, b) if a.type == b.type else (plain(a), plain(b))
             for a, b in zip(left, right, strict=True)]
    joint = [pa.chunked_array([*_chunks(a), *_chunks(b)], type=a.type) for a, b in pairs]
    valid = np.ones(len(joint[0]), dtype=bool)
    for column in joint:
        valid &= np.asarray(pc.is_valid(column).combine_chunks(), dtype=bool)
    codes, first = row_codes(joint)
    right_codes, right_valid = codes[n_left:], valid[n_left:]
    keyed = right_codes[right_valid]
    if len(keyed) and np.bincount(keyed).max() > 1:
        return None
    row_of = np.full(len(first), -1, dtype=np.int64)
    row_of[keyed] = np.flatnonzero(right_valid)
    found = row_of[codes[:n_left]]
    found[~valid[:n_left]] = -1
    return found


def take_matched(values: Arrayish, found: np.ndarray) -> Arrayish:
    """``values`` at the rows :func:`match_rows` found (null where none)."""
    return pc.take(values, pa.array(found, mask=found < 0))


def take_rows(values: Arrayish, rows: np.ndarray) -> pa.Array:
    """``values`` at the ascending positions ``rows``, chunk by chunk: ``pc.take`` on a
    chunked column concatenates all of it first (a copy of a whole column for a few rows)."""
    if isinstance(values, pa.ChunkedArray) and values.num_chunks == 1:
        values = values.chunk(0)
    if isinstance(values, pa.Array):
        return values.take(pa.array(rows, pa.int64()))
    ends = np.cumsum([len(chunk) for chunk in values.chunks])
    cuts = np.searchsorted(rows, ends)
    parts = [pa.array([], values.type)]
    start, offset = 0, 0
    for chunk, cut, end in zip(values.chunks, cuts.tolist(), ends.tolist(), strict=True):
        if cut > start:
            parts.append(chunk.take(pa.array(rows[start:cut] - offset, pa.int64())))
        start, offset = cut, end
    return pa.concat_arrays(parts)


def dense_codes(codes: np.ndarray, radix: int) -> tuple[np.ndarray, int]:
    """``codes`` (in ``range(radix)``) renumbered 0, 1, ... in the order of their values, and
    how many there are: by a table when ``radix`` is small (no sort), else by a sort."""
    if radix <= max(4 * len(codes), 1 << 20):
        seen = np.zeros(radix, dtype=bool)
        seen[codes] = True
        number = np.cumsum(seen) - 1
        return number[codes], int(seen.sum())
    present, dense = np.unique(codes, return_inverse=True)
    return dense.astype(np.int64).reshape(-1), len(present)


def _chunks(values: Arrayish) -> list[pa.Array]:
    return values.chunks if isinstance(values, pa.ChunkedArray) else [values]


def capture_order(rows: pa.Table, *keys: str) -> pa.Table:
    """``rows`` sorted by the integer columns ``keys`` (a null first, as Spark orders it), for
    the ordered aggregations ("first") of a group_by without threads."""
    order = pa.table({k: pc.fill_null(rows[k], _least(rows.schema.field(k).type))
                      for k in keys})
    return rows.take(pc.sort_indices(order, sort_keys=[(k, "ascending") for k in keys]))


def _least(kind: pa.DataType) -> int:
    return -(1 << (kind.bit_width - 1))


def span_seconds(first: pd.Series, last: pd.Series) -> pd.Series:
    """Seconds from ``first`` to ``last`` (ns timestamps)."""
    return (last - first) / 1e9


def rate(count: pd.Series, seconds: pd.Series) -> pd.Series:
    """``count / seconds`` where ``seconds`` is positive, else null."""
    return (count / seconds).where(seconds > 0)


def us(later: pd.Series, earlier: pd.Series) -> pd.Series:
    """Microseconds from ``earlier`` to ``later`` (ns timestamps)."""
    return (later - earlier) / 1000.0


def quoted(packets: pd.DataFrame) -> pd.Series:
    """Whether a packet row is a datagram quoted by an ICMP error (``icmp_type`` set): the
    bounce of something sent earlier, never traffic of its own (false without the column)."""
    if "icmp_type" in packets.columns:
        return packets["icmp_type"].notna()
    return pd.Series(False, index=packets.index)


def closed_port(packets: pd.DataFrame) -> pd.Series:
    """Whether a packet row is a datagram an ICMP port-unreachable error quotes."""
    if "icmp_type" in packets.columns and "icmp_code" in packets.columns:
        return ((packets["icmp_type"] == ICMP_DEST_UNREACHABLE)
                & (packets["icmp_code"] == ICMP_PORT_UNREACHABLE)).fillna(False).astype(bool)
    return pd.Series(False, index=packets.index)
