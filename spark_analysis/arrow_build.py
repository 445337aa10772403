"""Reading header members column-wise and building Arrow arrays from numpy, fast.

The byte-level tools every columnar decoder shares (see :mod:`spark_analysis.columnar` for
the overview): :class:`ByteView` reads a fixed layout's members (the derived
:class:`wire.fastpath.FastLayout` of a Construct struct) for all rows at once with one
strided gather; :class:`BinaryColumn` is a batch's frame bytes in place; the rest build Arrow
arrays (binary, text, dictionary, masked, list, all-null) straight from numpy buffers
without a Python object per value, because Spark ships every field of every row.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wire.fastpath import FastLayout
from wire.fields import (
    TEXT_ENCODING,
    Bit,
    text_bytes,
)

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


def views_of(values: dict[str, np.ndarray], views: Mapping[str, tuple[str, Bit]]) -> None:
    """Add every bit view whose member was read (``(raw & mask) >> shift``)."""
    for view, (member, bit) in views.items():
        raw = values.get(member)
        if raw is not None and view not in values:
            values[view] = (raw & bit.mask) >> bit.shift


@dataclass
class BinaryColumn:
    """The values buffer and the per-row [start, start+length) of an Arrow binary column."""

    bv: ByteView
    starts: np.ndarray
    lengths: np.ndarray

    @classmethod
    def of(cls, column: pa.Array | pa.ChunkedArray) -> BinaryColumn:
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


def running_offsets(counts: np.ndarray, dtype: type[np.integer] = np.int64) -> np.ndarray:
    """``[0, c0, c0 + c1, ...]``: where each of ``len(counts)`` runs of ``counts`` items
    starts, and the total at the end (the offsets of an Arrow list or string column, of a
    gathered byte buffer)."""
    offsets = np.zeros(len(counts) + 1, dtype)
    np.cumsum(counts, out=offsets[1:])
    return offsets


def gather_ranges(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
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
    offsets = running_offsets(lengths)
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
    """:func:`gather_ranges` by Arrow: the ranges become a ``binary_view`` array over
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


def binary_array(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> pa.Array:
    values, offsets = gather_ranges(data, starts, lengths)
    return pa.Array.from_buffers(pa.binary(), len(lengths),
                                 [None, pa.py_buffer(offsets), pa.py_buffer(values)])


def text_array(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
               cut_at_nul: bool = True) -> pa.Array:
    """Text members (topic names) as strings, cut at the first NUL like tshark displays them.

    The bytes are UTF-8, as :func:`wire.fields.bytes_text` reads them; a name that is not valid
    UTF-8 (which ``wire`` keeps byte for byte with surrogate escapes, something an Arrow string
    cannot hold) shows each bad byte as U+FFFD.  Valid UTF-8 (the norm) stays vectorised."""
    values, offsets = gather_ranges(data, starts, lengths)
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
            return text_array(values, offsets[:-1].astype(np.int64), new_len, False)
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


def dictionary_strings(codes: np.ndarray, names: Sequence[str | None],
                       valid: np.ndarray | None = None) -> pa.DictionaryArray:
    """A dictionary-typed string column (:data:`DICTIONARY_STRING`) from small integer codes
    (enum-like columns: protocol, types), null where ``valid`` is false.  :func:`table_of`
    casts it to plain strings where the schema says so."""
    names = list(names)
    if None in names:  # a code without a name is a null (a dictionary holds no nulls)
        codes = np.where(valid, codes, 0) if valid is not None else codes
        named = np.array([n is not None for n in names])[codes]
        valid = named if valid is None else valid & named
        names = [n if n is not None else "" for n in names]
    indices = masked_array(np.where(valid, codes, 0) if valid is not None else codes, valid,
                           pa.int32())
    return pa.DictionaryArray.from_arrays(indices, arrow_array(names, pa.string()))


def ipv4_strings(values: np.ndarray) -> pa.DictionaryArray:
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
            list_offsets(counts), _python_array(flat, kind.value_type), type=kind,
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


def _utf8(value: str) -> bytes:
    """A Python string as UTF-8 for an Arrow string; a name :mod:`wire` read from bytes that
    are not UTF-8 (kept with surrogate escapes, which UTF-8 cannot hold) shows each bad byte
    as U+FFFD, as :func:`text_array` does."""
    try:
        return value.encode(TEXT_ENCODING)
    except UnicodeEncodeError:
        return text_bytes(value).decode(TEXT_ENCODING, "replace").encode(TEXT_ENCODING)


def _string_array(values: list[str | None], mask: np.ndarray | None = None) -> pa.Array:
    """A string array of Python strings (None: null), from buffers."""
    encoded = [_utf8(v) if v is not None else b"" for v in values]
    offsets = running_offsets(np.fromiter(map(len, encoded), np.int64, len(encoded)),
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


def masked_array(values: np.ndarray, valid: np.ndarray | None, dtype: pa.DataType) -> pa.Array:
    """``values`` as ``dtype`` with nulls where ``valid`` is false."""
    arr = arrow_array(values, dtype)
    return arr if valid is None else with_nulls(arr, valid)


def with_nulls(arr: pa.Array, valid: np.ndarray) -> pa.Array:
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


def sparse_strings(rows: int, texts: Mapping[int, str]) -> pa.Array:
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
    return dictionary_strings(codes, distinct, valid)


def constant_strings(text: str, rows: int) -> pa.DictionaryArray:
    """A dictionary-typed string column holding ``text`` in every row."""
    return pa.DictionaryArray.from_arrays(arrow_array(np.zeros(rows, np.int32)),
                                          arrow_array([text], pa.string()))


def ver_type_of(bits: Mapping[str, Bit], raw: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return ((raw & bits["version"].mask) >> bits["version"].shift,
            (raw & bits["type"].mask) >> bits["type"].shift)


def list_offsets(counts: np.ndarray) -> pa.Array:
    """The int32 offsets array of a list column whose rows hold ``counts`` values each."""
    return arrow_array(running_offsets(counts, np.int32))


def table_of(schema: pa.Schema, n: int, columns: Mapping[str, pa.Array]) -> pa.Table:
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
