"""The engine's flight-size analyses (:mod:`spark_analysis.engine.flight`) equal their Spark SQL
twins in :mod:`tests.spark_analysis.twin`: on the corpus (inputs from the Spark steps, so the
ports of the other analyses do not matter here) under every stability rule, and on small
hand-made tables with the edge cases (repeated and tied ACKs, a partial quorum, a source
without a registration, a null key, events at equal times)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from spark_analysis.engine.common import session_key
from spark_analysis.engine.flight import (
    flight_events,
    flight_size,
    flight_size_summary,
    stable_times,
)
from spark_analysis.engine.options import AnalysisOptions
from tests.spark_analysis.engine_oracle import assert_same, frame

FLIGHT = ["capture", "session", "source_ip", "tidx"]


def advertised_topics(advertisements: pd.DataFrame) -> pd.DataFrame:
    """The topic each (capture, session, tidx) carries by the first TIR naming it, as
    :func:`tests.spark_analysis.twin.advertised_topics` (a stand-in for this test only)."""
    a = advertisements
    tirs = a[((a["record"] == "tir") & a["topic_index"].notna() & a["source_ip"].notna())
             .fillna(False).to_numpy(dtype=bool)]
    tcp = (tirs["transport"] == "tcp").fillna(False).to_numpy(dtype=bool)
    protocol = tirs["transport"].mask(tcp, "lbttcp")
    tirs = tirs.assign(session=session_key(protocol, tirs["source_ip"], tirs["source_port"],
                                           tirs["session_id"].mask(tcp)),
                       tidx=tirs["topic_index"])
    first = (tirs.sort_values(["pos", "record_index"], kind="stable")
             .drop_duplicates(["capture", "session", "tidx"]))
    return (first[["capture", "session", "tidx", "topic"]]
            .rename(columns={"topic": "advertised_topic"}).reset_index(drop=True))


def spark_chain(spark: Any, stability: pa.Table, regs: pa.Table, sends: pa.Table,
                options: AnalysisOptions) -> dict[str, pa.Table]:
    """The Spark twins, from stable times to the flight size, over Arrow inputs."""
    from tests.spark_analysis import twin as A

    stable = A.stable_times(spark.createDataFrame(stability), spark.createDataFrame(regs),
                            options)
    events = A.flight_events(spark.createDataFrame(sends), stable)
    return {"stable": stable.toArrow(), "events": events.toArrow(),
            "flight_size": A.flight_size(events, options).toArrow(),
            "flight_size_summary": A.flight_size_summary(events, stable, options).toArrow()}


# --- the corpus -------------------------------------------------------------------------------

def test_stable_times_equal_spark(steps: dict[str, pa.Table]) -> None:
    ours = stable_times(frame(steps["stability"]), frame(steps["regs"]), AnalysisOptions())
    assert_same(ours, steps["stable"])


def test_flight_events_equal_spark(steps: dict[str, pa.Table]) -> None:
    assert_same(flight_events(frame(steps["sends"]), frame(steps["stable"])), steps["events"])


def test_flight_size_equals_spark(steps: dict[str, pa.Table], spark: Any) -> None:
    from tests.spark_analysis import twin as A

    options = AnalysisOptions()
    theirs = A.flight_size(spark.createDataFrame(steps["events"]), options).toArrow()
    assert_same(flight_size(frame(steps["events"]), options), theirs, columns_in_order=True)


def test_flight_size_summary_equals_spark(steps: dict[str, pa.Table], spark: Any) -> None:
    from tests.spark_analysis import twin as A

    options = AnalysisOptions()
    theirs = A.flight_size_summary(
        spark.createDataFrame(steps["events"]), spark.createDataFrame(steps["stable"]), options,
        topics=A.advertised_topics(spark.createDataFrame(steps["advertisements"]))).toArrow()
    assert theirs.column("topic").null_count < theirs.num_rows  # topics do join
    ours = flight_size_summary(frame(steps["events"]), frame(steps["stable"]), options,
                               advertised_topics(frame(steps["advertisements"])))
    assert_same(ours, theirs, columns_in_order=True)


@pytest.mark.parametrize("rule", ["all", "any"])
def test_stability_rules_equal_spark(steps: dict[str, pa.Table], spark: Any,
                                     rule: str) -> None:
    options = AnalysisOptions(stability_rule=rule, flight_bins=50)
    theirs = spark_chain(spark, steps["stability"], steps["regs"], steps["sends"], options)
    stable = stable_times(frame(steps["stability"]), frame(steps["regs"]), options)
    assert_same(stable, theirs["stable"])
    events = flight_events(frame(steps["sends"]), stable)
    assert_same(events, theirs["events"])
    assert_same(flight_size(events, options), theirs["flight_size"], columns_in_order=True)
    assert_same(flight_size_summary(events, stable, options), theirs["flight_size_summary"],
                columns_in_order=True)
    # the rules do differ on the corpus (sources registered with three stores)
    quorum = stable_times(frame(steps["stability"]), frame(steps["regs"]), AnalysisOptions())
    assert len(stable) != len(quorum) or not stable["stable_ts_ns"].sort_values().reset_index(
        drop=True).equals(quorum["stable_ts_ns"].sort_values().reset_index(drop=True))


# --- hand-made edge cases ---------------------------------------------------------------------

STABILITY = pa.schema([("capture", pa.string()), ("session", pa.string()),
                       ("source_ip", pa.string()), ("tidx", pa.int64()), ("sqn", pa.int64()),
                       ("store_ip", pa.string()), ("ts_ns", pa.int64()),
                       ("send_ts_ns", pa.int64())])
REGS = pa.schema([("capture", pa.string()), ("role", pa.string()), ("outcome", pa.string()),
                  ("source_ip", pa.string()), ("topic_idx", pa.int64()),
                  ("store_ip", pa.string())])
SENDS = pa.schema([("capture", pa.string()), ("session", pa.string()),
                   ("source_ip", pa.string()), ("tidx", pa.int64()), ("sqn", pa.int64()),
                   ("send_ts_ns", pa.int64())])


def _acks() -> tuple[pa.Table, pa.Table]:
    s1, s2 = "lbtrm:10.0.0.1:14390:00000001", "lbtrm:10.0.0.2:14390:00000002"
    s3 = "lbtrm:10.0.0.3:14390:00000003"
    stability = pa.Table.from_pylist([
        # s1 registered with stores A, B, C: a repeated ACK (first is 5), a tie at 20
        {"capture": "c", "session": s1, "source_ip": "10.0.0.1", "tidx": 1, "sqn": 1,
         "store_ip": "A", "ts_ns": 10, "send_ts_ns": 1},
        {"capture": "c", "session": s1, "source_ip": "10.0.0.1", "tidx": 1, "sqn": 1,
         "store_ip": "A", "ts_ns": 5, "send_ts_ns": 1},
        {"capture": "c", "session": s1, "source_ip": "10.0.0.1", "tidx": 1, "sqn": 1,
         "store_ip": "C", "ts_ns": 20, "send_ts_ns": 1},
        {"capture": "c", "session": s1, "source_ip": "10.0.0.1", "tidx": 1, "sqn": 1,
         "store_ip": "B", "ts_ns": 20, "send_ts_ns": 1},
        # sqn 2: one store, and an ACK not matched to a send (ignored)
        {"capture": "c", "session": s1, "source_ip": "10.0.0.1", "tidx": 1, "sqn": 2,
         "store_ip": "A", "ts_ns": 30, "send_ts_ns": 2},
        {"capture": "c", "session": s1, "source_ip": "10.0.0.1", "tidx": 1, "sqn": 2,
         "store_ip": "B", "ts_ns": 31, "send_ts_ns": None},
        # s2 without a registration: the stores that ACKed (A, B) count
        {"capture": "c", "session": s2, "source_ip": "10.0.0.2", "tidx": 1, "sqn": 1,
         "store_ip": "B", "ts_ns": 40, "send_ts_ns": 3},
        {"capture": "c", "session": s2, "source_ip": "10.0.0.2", "tidx": 1, "sqn": 1,
         "store_ip": "A", "ts_ns": 41, "send_ts_ns": 3},
        {"capture": "c", "session": s2, "source_ip": "10.0.0.2", "tidx": 1, "sqn": 2,
         "store_ip": "A", "ts_ns": 50, "send_ts_ns": 4},
        # s3 registered, but no store address known: 0 stores (quorum: 1, all: none)
        {"capture": "c", "session": s3, "source_ip": "10.0.0.3", "tidx": 1, "sqn": 1,
         "store_ip": "A", "ts_ns": 70, "send_ts_ns": 6},
        # a null session: never joined back, never stable
        {"capture": "c", "session": None, "source_ip": "10.0.0.2", "tidx": 1, "sqn": 1,
         "store_ip": "A", "ts_ns": 60, "send_ts_ns": 5},
    ], schema=STABILITY)
    regs = pa.Table.from_pylist([
        {"capture": "c", "role": "source", "outcome": "granted", "source_ip": "10.0.0.1",
         "topic_idx": 1, "store_ip": store} for store in ("A", "B", "C", "C")
    ] + [
        {"capture": "c", "role": "source", "outcome": "error", "source_ip": "10.0.0.1",
         "topic_idx": 1, "store_ip": "D"},
        {"capture": "c", "role": "receiver", "outcome": "granted", "source_ip": "10.0.0.2",
         "topic_idx": 1, "store_ip": "E"},
        {"capture": "c", "role": "source", "outcome": "granted", "source_ip": "10.0.0.3",
         "topic_idx": 1, "store_ip": None},
    ], schema=REGS)
    return stability, regs


@pytest.mark.parametrize(("rule", "expected"), [
    # (source ip, sqn) -> (stable_ts_ns, stores, needed)
    ("quorum", {("10.0.0.1", 1): (20, 3, 2), ("10.0.0.2", 1): (41, 2, 2),
                ("10.0.0.3", 1): (70, 0, 1)}),
    ("all", {("10.0.0.1", 1): (20, 3, 3), ("10.0.0.2", 1): (41, 2, 2)}),
    ("any", {("10.0.0.1", 1): (5, 3, 1), ("10.0.0.1", 2): (30, 3, 1),
             ("10.0.0.2", 1): (40, 2, 1), ("10.0.0.2", 2): (50, 2, 1),
             ("10.0.0.3", 1): (70, 0, 1)}),
])
def test_stable_times_rules(spark: Any, rule: str,
                            expected: dict[tuple[str, int], tuple[int, int, int]]) -> None:
    """The n-th store's first ACK (by time, then store), n of the registered stores (a
    failed registration, a receiver's or a repeated store not counted) or, without one, of
    the stores that ACKed; an unmatched ACK and a null key count for nothing; a registration
    without a store address counts 0 stores (a quorum of 1, ``all`` never)."""
    stability, regs = _acks()
    options = AnalysisOptions(stability_rule=rule)
    ours = stable_times(frame(stability), frame(regs), options)
    got = {(r.source_ip, r.sqn): (r.stable_ts_ns, r.stores, r.needed)
           for r in ours.itertuples()}
    assert got == expected
    from tests.spark_analysis import twin as A

    theirs = A.stable_times(spark.createDataFrame(stability), spark.createDataFrame(regs),
                            options).toArrow()
    assert_same(ours, theirs)


def test_flight_at_equal_times(spark: Any) -> None:
    """A message leaving the flight at the time another enters goes first (the peak is 1,
    first reached at the first send); a send without a time comes first; the last message
    is never stable."""
    s = "lbtru:10.0.0.1:14390:00000001"
    sends = pa.Table.from_pylist([
        {"capture": "c", "session": s, "source_ip": "10.0.0.1", "tidx": 1, "sqn": sqn,
         "send_ts_ns": ts} for sqn, ts in ((1, 100), (2, 200), (3, 300))
    ] + [{"capture": "c", "session": s, "source_ip": "10.0.0.1", "tidx": 2, "sqn": 1,
          "send_ts_ns": None},
         {"capture": "c", "session": s, "source_ip": "10.0.0.1", "tidx": 2, "sqn": 2,
          "send_ts_ns": 150}], schema=SENDS)
    stability = pa.Table.from_pylist([
        {"capture": "c", "session": s, "source_ip": "10.0.0.1", "tidx": 1, "sqn": sqn,
         "store_ip": "A", "ts_ns": ts, "send_ts_ns": ts - 100}
        for sqn, ts in ((1, 200), (2, 300))
    ], schema=STABILITY)
    regs = pa.Table.from_pylist([], schema=REGS)
    options = AnalysisOptions(flight_bins=2)
    stable = stable_times(frame(stability), frame(regs), options)
    events = flight_events(frame(sends), stable)
    one = events[events["tidx"] == 1].sort_values("event")
    assert one["in_flight"].tolist() == [1, 0, 1, 0, 1]
    assert one["delta"].tolist() == [1, -1, 1, -1, 1]
    two = events[events["tidx"] == 2].sort_values("event")
    assert two["ts_ns"].isna().tolist() == [True, False]
    size = flight_size(events, options)
    assert size[size["tidx"] == 1].sort_values("bin")[
        ["bin", "max_in_flight", "end_in_flight", "sent", "stabilized"]
    ].values.tolist() == [[0, 1, 1, 2, 1], [1, 1, 1, 1, 1]]
    summary = flight_size_summary(events, stable, options).set_index("tidx")
    assert summary.loc[1, ["messages", "stabilized", "never_stable", "peak_in_flight",
                           "peak_ts_ns", "end_in_flight", "stores", "acks_needed"]
                       ].tolist() == [3, 2, 1, 1, 100, 1, 1, 1]
    assert pd.isna(summary.loc[2, "stores"])

    theirs = spark_chain(spark, stability, regs, sends, options)
    assert_same(stable, theirs["stable"])
    assert_same(events, theirs["events"])
    assert_same(size, theirs["flight_size"], columns_in_order=True)
    assert_same(flight_size_summary(events, stable, options), theirs["flight_size_summary"],
                columns_in_order=True)
