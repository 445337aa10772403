"""The engine's shared column helpers (:mod:`spark_analysis.engine.common`) on
dictionary-encoded columns: the inputs keep their low-cardinality strings encoded
(:data:`spark_analysis.engine.inputs.DICTIONARY`) and the engine spreads session keys and
topic names as dictionaries, so grouping and matching must see values, not entries."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_analysis.engine.common import (
    dictionary_encode,
    encoded,
    match_rows,
    plain,
    plain_table,
    row_codes,
)

_TEXT = st.one_of(st.none(), st.sampled_from(["a", "b", "lbtrm:10.0.0.1:14390", ""]))


def _partition(codes: np.ndarray) -> set[tuple[int, ...]]:
    """The rows grouped by code: two codings agree when they make the same groups."""
    groups: dict[int, list[int]] = {}
    for row, code in enumerate(codes.tolist()):
        groups.setdefault(code, []).append(row)
    return {tuple(rows) for rows in groups.values()}


@settings(max_examples=200, deadline=None)
@given(values=st.lists(_TEXT, min_size=1, max_size=40),
       entries=st.lists(st.one_of(st.none(), st.integers(0, 5)), min_size=1, max_size=40),
       other=st.lists(st.integers(0, 2), min_size=1, max_size=40))
def test_row_codes_of_an_encoded_column_group_by_value(
        values: list[str | None], entries: list[int | None], other: list[int]) -> None:
    """A dictionary may hold a value twice (and a null): rows group by the value, as the
    plain column groups them, alone or with another key column."""
    dictionary = pa.array((values * 6)[:6], pa.string())
    n = min(len(entries), len(other))
    column = pa.DictionaryArray.from_arrays(pa.array(entries[:n], pa.int32()), dictionary)
    decoded = plain(column)
    assert decoded.type == pa.string()
    for keys in ([column], [column, pa.array(other[:n])]):
        ours, first = row_codes(keys)
        theirs, _ = row_codes([decoded, *keys[1:]])
        assert _partition(ours) == _partition(theirs)
        assert len(first) == len(set(ours.tolist()))


def test_encoded_spreads_values_without_a_copy_per_row() -> None:
    keys = pa.chunked_array([pa.array(["s1", None]), pa.array(["s1"])])
    spread = encoded(np.array([0, 1, 2, 0, 2]), keys)
    assert pa.types.is_dictionary(spread.type)
    assert spread.to_pylist() == ["s1", None, "s1", "s1", "s1"]
    codes, _ = row_codes([spread])
    assert _partition(codes) == {(0, 2, 3, 4), (1,)}   # "s1" twice in the dictionary: one group


def test_match_rows_meets_an_encoded_key_with_a_plain_one() -> None:
    left = pa.DictionaryArray.from_arrays(pa.array([1, 0, None, 1], pa.int32()),
                                          pa.array(["x", "y"]))
    right = pa.array(["y", "z", "x"])
    found = match_rows([left], [right])
    assert found is not None
    assert found.tolist() == [0, 2, -1, 0]


def test_plain_table_decodes_every_encoded_column() -> None:
    table = pa.table({"k": pa.array(["b", "a", "b"]).dictionary_encode(), "v": [1, 2, 3]})
    out = plain_table(table)
    assert out.schema.field("k").type == pa.string()
    assert out.sort_by("k")["v"].to_pylist() == [2, 1, 3]


@settings(max_examples=200, deadline=None)
@given(values=st.lists(_TEXT, min_size=1, max_size=6),
       entries=st.lists(st.one_of(st.none(), st.integers(0, 5)), max_size=30),
       null_encoding=st.sampled_from(["mask", "encode"]))
def test_dictionary_encode_normalises_an_encoded_column(
        values: list[str | None], entries: list[int | None], null_encoding: str) -> None:
    """Arrow hands an encoded column back unchanged (a value twice in its dictionary, its
    nulls masked whatever ``null_encoding`` asks): the engine's version encodes it as it
    encodes the plain column."""
    dictionary = pa.array((values * 6)[:6], pa.string())
    column = pa.DictionaryArray.from_arrays(pa.array(entries, pa.int32()), dictionary)
    ours = dictionary_encode(column, null_encoding)
    theirs = dictionary_encode(plain(column), null_encoding)
    assert ours.to_pylist() == theirs.to_pylist() == column.to_pylist()
    words = ours.dictionary.to_pylist()
    assert len(words) == len(set(words))   # a value once (unused ones may stay)
    assert ours.indices.null_count == theirs.indices.null_count   # a null as asked
    # rows of one value have one index
    by_value: dict[object, set[int]] = {}
    for value, index in zip(ours.to_pylist(), ours.indices.to_pylist(), strict=True):
        by_value.setdefault(value, set()).add(index)
    assert all(len(indices) == 1 for indices in by_value.values())
