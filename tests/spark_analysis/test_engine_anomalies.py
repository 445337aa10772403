"""The engine's anomalies (:mod:`spark_analysis.engine.anomalies`) against their Spark SQL
twins (:func:`tests.spark_analysis.twin.anomalies`, :func:`~tests.spark_analysis.twin.
anomaly_summary`) on the corpus, and the rules of their text and examples on hand-made
rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from spark_analysis.engine.anomalies import (
    ANOMALY_COLUMNS,
    SUMMARY_COLUMNS,
    _array_join,
    _concat,
    _concat_ws,
    _s,
    anomalies,
    anomaly_summary,
)
from spark_analysis.engine.common import take_rows
from tests.spark_analysis.engine_oracle import assert_same, frame

INPUTS = ["packets", "messages", "sends", "regs", "stability", "consumption", "requests",
          "flags"]
"""The tables :func:`anomalies` reads, in argument order."""

EXAMPLE = ["example_subject", "example_detail", "example_file", "example_file_offset"]


@pytest.fixture(scope="module")
def spark_summary(steps: dict[str, pa.Table], spark: Any) -> pa.Table:
    """Spark's ``anomaly_summary`` of Spark's anomalies of the corpus."""
    from tests.spark_analysis import twin as A

    return A.anomaly_summary(spark.createDataFrame(steps["found"])).toArrow()


def _found(steps: dict[str, pa.Table]) -> pd.DataFrame:
    return anomalies(*(frame(steps[name]) for name in (
        "packets", "messages", "sends", "regs", "stability", "consumption", "requests",
        "flags")))


def test_anomalies_equal_spark(steps: dict[str, pa.Table]) -> None:
    ours = _found(steps)
    assert list(ours.columns) == ANOMALY_COLUMNS
    assert_same(ours, steps["found"], columns_in_order=True)


def test_anomaly_summary_equal_spark(steps: dict[str, pa.Table],
                                     spark_summary: pa.Table) -> None:
    """Counts and first times equal Spark's; the example is Spark's wherever one anomaly is
    the earliest of its kind.  Where several share the earliest time Spark's ``min_by``
    takes any of them (the corpus has such ties): the engine takes the one of the lowest file
    offset, and Spark's pick is one of the tied rows."""
    found = frame(steps["found"])
    ours = anomaly_summary(found)
    theirs = frame(spark_summary)
    keys = ["capture", "severity", "kind"]
    assert_same(ours.drop(columns=EXAMPLE), theirs.drop(columns=EXAMPLE), columns_in_order=True)
    assert_same(ours.iloc[:0], theirs.iloc[:0], columns_in_order=True)  # names and types
    merged = ours.merge(theirs, on=keys, suffixes=("", "_spark"))
    assert len(merged) == len(ours)
    ties = 0
    for row in merged.itertuples(index=False):
        group = found[(found["capture"] == row.capture) & (found["severity"] == row.severity)
                      & (found["kind"] == row.kind)]
        earliest = group[group["ts_ns"] == row.first_ts_ns]
        candidates = {tuple(r) for r in earliest[["subject", "detail", "file",
                                                  "file_offset"]].itertuples(index=False)}
        ours_pick = (row.example_subject, row.example_detail, row.example_file,
                     row.example_file_offset)
        spark_pick = (row.example_subject_spark, row.example_detail_spark,
                      row.example_file_spark, row.example_file_offset_spark)
        assert ours_pick in candidates and spark_pick in candidates
        assert row.example_file_offset == earliest["file_offset"].min()
        if len(earliest) == 1:
            assert ours_pick == spark_pick
        else:
            ties += 1
    assert ties  # the corpus does exercise the tie rule


def test_text_follows_spark_rules() -> None:
    """``concat_ws`` skips nulls and keeps every row (an all-null row is ``""``: pyarrow's
    own skip mode drops such rows); ``concat`` is null with any null part; ``array_join``
    skips null elements; ``_s`` prints a null as ``?`` and numbers as digits."""
    a = pa.array(["x", None, None, ""])
    b = pa.array([None, "y", None, "z"])
    assert _concat_ws(":", a, b).to_pylist() == ["x", "y", "", ":z"]
    assert _concat_ws(" ", "lit", a, b).to_pylist() == ["lit x", "lit y", "lit", "lit  z"]
    assert _concat("<", a, ">").to_pylist() == ["<x>", None, None, "<>"]
    lists = pa.array([[142, None, 149], [], None, [None]], pa.list_(pa.int64()))
    assert _array_join(lists, " ").to_pylist() == ["142 149", "", None, ""]
    assert _s(pa.array([5, None, -1], pa.int16())).to_pylist() == ["5", "?", "-1"]


def _table(schema: pa.Schema, rows: list[dict[str, Any]]) -> pd.DataFrame:
    return frame(pa.Table.from_pylist(rows, schema=schema))


def test_reuse_conflict_and_unsent_rules(steps: dict[str, pa.Table]) -> None:
    """A RegID asked for by another client than its holder is reused (the holder's null topic
    index left out of its name); asked for by its holder, it is not; grants of one RegID at a
    null store group together (two clients: both conflicts).  An ACK with no send is for an
    unsent number only from the source topic's lowest sent number on; a null topic index
    matches no sends."""
    empty = {name: frame(steps[name].schema.empty_table()) for name in steps}
    reg = {"capture": "c", "ts_ns": 10, "file": "f", "file_offset": 1, "pos": 1,
           "msg_index": 0, "role": "source", "store_ip": "10.0.3.1", "store_port": 14567}
    regs = _table(steps["regs"].schema, [
        {**reg, "client_ip": "10.0.1.1", "outcome": "granted", "granted_reg_id": 7},
        {**reg, "client_ip": "10.0.4.1", "outcome": "granted", "requested_reg_id": 7,
         "granted_reg_id": 8, "topic_idx": 1, "file_offset": 2},
        {**reg, "client_ip": "10.0.1.1", "outcome": "granted", "requested_reg_id": 7,
         "granted_reg_id": 7, "file_offset": 3},
        {**reg, "client_ip": "10.0.5.1", "store_ip": None, "outcome": "granted",
         "granted_reg_id": 9, "file_offset": 4},
        {**reg, "client_ip": "10.0.6.1", "store_ip": None, "outcome": "granted",
         "granted_reg_id": 9, "file_offset": 5},
    ])
    send = {"capture": "c", "session": "s", "source_ip": "10.0.1.1", "tidx": 1,
            "send_ts_ns": 1, "copies": 1}
    sends = _table(steps["sends"].schema, [{**send, "sqn": 5}, {**send, "sqn": 6}])
    ack = {"capture": "c", "source_ip": "10.0.1.1", "tidx": 1, "ts_ns": 20, "file": "f",
           "store_ip": "10.0.3.1"}
    stability = _table(steps["stability"].schema, [
        {**ack, "sqn": 4, "file_offset": 10}, {**ack, "sqn": 7, "file_offset": 11},
        {**ack, "sqn": 7, "tidx": None, "file_offset": 12},
        {**ack, "sqn": 6, "send_ts_ns": 1, "file_offset": 13}])
    found = anomalies(empty["packets"], empty["messages"], sends, regs, stability,
                      empty["consumption"], empty["requests"], empty["flags"])
    got = sorted(zip(found["kind"], found["file_offset"], found["subject"], found["detail"],
                     strict=True))
    assert got == [
        ("ack-for-unsent-sqn", 11, "stability ACK from 10.0.3.1 to 10.0.1.1",
         "source 10.0.1.1 topic index 1 sqn 7 was not sent before the ACK"),
        ("regid-conflict", 4, "source registration of 10.0.5.1 at store ?:14567",
         "store granted RegID 9 to 2 different clients"),
        ("regid-conflict", 5, "source registration of 10.0.6.1 at store ?:14567",
         "store granted RegID 9 to 2 different clients"),
        ("regid-reuse", 2, "source registration of 10.0.4.1 at store 10.0.3.1:14567",
         "asks for RegID 7, which this store granted to 10.0.1.1/source"),
    ]
    assert found["file_offset"].dtype == pd.ArrowDtype(pa.int64())


def test_summary_example_rules() -> None:
    """The example is the earliest anomaly with a time (null times passed over), ties going
    to the lowest file offset; a kind with no time has no example; null captures group
    together."""
    row = {"capture": "c", "severity": "error", "kind": "k", "file": "f", "detail": "d"}
    found = _table(pa.schema([(name, pa.int64() if name in ("ts_ns", "file_offset")
                               else pa.string()) for name in ANOMALY_COLUMNS]), [
        {**row, "ts_ns": None, "file_offset": 1, "subject": "untimed"},
        {**row, "ts_ns": 5, "file_offset": 9, "subject": "late offset"},
        {**row, "ts_ns": 5, "file_offset": 3, "subject": "first frame"},
        {**row, "ts_ns": 6, "file_offset": 2, "subject": "later"},
        {**row, "kind": "none", "ts_ns": None, "file_offset": 1, "subject": "s"},
        {**row, "capture": None, "ts_ns": 1, "file_offset": 1, "subject": "a"},
        {**row, "capture": None, "ts_ns": 2, "file_offset": 2, "subject": "b"},
    ])
    out = anomaly_summary(found)
    assert list(out.columns) == SUMMARY_COLUMNS
    rows = {(r["capture"] if pd.notna(r["capture"]) else None, r["kind"]):
            (r["count"], r["first_ts_ns"] if pd.notna(r["first_ts_ns"]) else None,
             r["example_subject"] if pd.notna(r["example_subject"]) else None)
            for r in out.to_dict("records")}
    assert rows == {("c", "k"): (4, 5, "first frame"), ("c", "none"): (1, None, None),
                    (None, "k"): (2, 1, "a")}
    assert out["count"].dtype == pd.ArrowDtype(pa.int64())


def test_empty_inputs_without_icmp_columns(steps: dict[str, pa.Table]) -> None:
    """No rows in, no rows out, with the output's columns and types; packets of a decode
    without the ICMP columns bounce nothing."""
    empty = {name: frame(steps[name].schema.empty_table()) for name in steps}
    packets = empty["packets"].drop(columns=["icmp_type", "icmp_code"], errors="ignore")
    found = anomalies(packets, *(empty[name] for name in (
        "messages", "sends", "regs", "stability", "consumption", "requests", "flags")))
    assert_same(found, steps["found"].schema.empty_table(), columns_in_order=True)
    summary = anomaly_summary(found)
    assert list(summary.columns) == SUMMARY_COLUMNS and len(summary) == 0


def _rechunked(table: pa.Table, rows: int) -> pd.DataFrame:
    """``table`` as a frame whose columns are many Arrow chunks of ``rows`` rows each (and an
    empty one), as the engine's steps hand their results on."""
    empty = pa.RecordBatch.from_pylist([], schema=table.schema)
    return frame(pa.Table.from_batches([*table.to_batches(max_chunksize=rows), empty],
                                       table.schema))


def test_chunked_inputs_give_the_same_anomalies(steps: dict[str, pa.Table]) -> None:
    """The flagged rows are taken chunk by chunk (:func:`common.take_rows`): columns in many chunks
    give the same anomalies as whole ones."""
    found = anomalies(*(_rechunked(steps[name], 7) for name in INPUTS))
    assert_same(found, steps["found"], columns_in_order=True)


def test_take_reads_positions_across_chunks() -> None:
    values = pa.chunked_array([pa.array([], pa.string()), pa.array(["a", None, "c"]),
                               pa.array([], pa.string()), pa.array(["d", "e"])])
    taken = take_rows(values, np.array([0, 1, 2, 3, 4], np.int64))
    assert taken.to_pylist() == ["a", None, "c", "d", "e"]
    assert take_rows(values, np.array([2, 3], np.int64)).to_pylist() == ["c", "d"]
    assert take_rows(values, np.array([], np.int64)).type == pa.string()
    assert take_rows(pa.array([1, 2, 3]), np.array([2], np.int64)).to_pylist() == [3]
