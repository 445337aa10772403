"""The engine's ACK latency analyses (:mod:`spark_analysis.engine.acks`) equal their Spark SQL
twins in :mod:`tests.spark_analysis.twin`: on the corpus (inputs from the Spark steps, so the
ports of the other analyses do not matter here) and on small hand-made tables with the edge
cases (an ACK before any send, a send and an ACK at the same instant, sends of one instant in
two sessions, a null key, a registration without ``pos``, an unknown receiver RegID, a
percentile where numpy's arithmetic differs from Spark's, a latency at a power of the
histogram base)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from spark_analysis.engine.acks import (
    consumption_acks,
    latency_histogram,
    latency_summary,
    stability_acks,
)
from spark_analysis.engine.options import AnalysisOptions
from tests.spark_analysis.engine_oracle import Golden, assert_same, frame

STABLE, CDELV = 1, 0


# --- the corpus --------------------------------------------------------------------------------

def test_stability_acks_equal_spark(steps: dict[str, pa.Table], golden: Golden) -> None:
    ours = stability_acks(frame(steps["messages"]), frame(steps["sends"]), frame(steps["regs"]))
    assert_same(ours, steps["stability"])
    assert_same(ours, golden("stability_acks"), columns_in_order=True)


def test_consumption_acks_equal_spark(steps: dict[str, pa.Table], golden: Golden) -> None:
    ours = consumption_acks(frame(steps["messages"]), frame(steps["sends"]),
                            frame(steps["regs"]))
    assert_same(ours, steps["consumption"])
    assert_same(ours, golden("consumption_acks"), columns_in_order=True)


def test_latency_summary_equal_spark(steps: dict[str, pa.Table], golden: Golden) -> None:
    ours = latency_summary(frame(steps["stability"]), frame(steps["consumption"]))
    assert_same(ours, golden("latency_summary"), columns_in_order=True, rel=0)


def test_latency_histogram_equal_spark(steps: dict[str, pa.Table], golden: Golden) -> None:
    ours = latency_histogram(frame(steps["stability"]), frame(steps["consumption"]))
    assert_same(ours, golden("latency_histogram"), columns_in_order=True, rel=0)


# --- hand-made edge cases ----------------------------------------------------------------------

ACK_TYPE = pa.struct([("type", pa.int16()), ("transport_idx", pa.int64()),
                      ("id_2", pa.int64()), ("rcv_reg_id", pa.int64()), ("seqnum", pa.int64())])


def messages_table(rows: list[dict[str, Any]]) -> pa.Table:
    """Messages with the columns the ACK analyses read; ``ack`` is the ``ume_ack`` header
    (type, transport_idx, id_2, rcv_reg_id, seqnum) or None."""
    def ack(row: dict[str, Any]) -> dict[str, Any] | None:
        a = row.get("ack")
        return None if a is None else dict(zip(ACK_TYPE.names, a, strict=True))

    return pa.table({
        "capture": pa.array(["c"] * len(rows), pa.string()),
        "pos": pa.array([r["pos"] for r in rows], pa.int64()),
        "msg_index": pa.array([0] * len(rows), pa.int32()),
        "ts_ns": pa.array([r["ts"] for r in rows], pa.int64()),
        "file": pa.array(["f"] * len(rows), pa.string()),
        "file_offset": pa.array([r["pos"] for r in rows], pa.int64()),
        "src_ip": pa.array([r["src"] for r in rows], pa.string()),
        "src_port": pa.array([r.get("sport", 1) for r in rows], pa.int32()),
        "dst_ip": pa.array([r["dst"] for r in rows], pa.string()),
        "dst_port": pa.array([r.get("dport", 2) for r in rows], pa.int32()),
        "ume_ack": pa.array([ack(r) for r in rows], ACK_TYPE),
    })


def sends_table(rows: list[tuple[str | None, int, int, str, int]]) -> pa.Table:
    """Sends as (source_ip, tidx, sqn, session, send_ts_ns)."""
    return pa.table({
        "capture": pa.array(["c"] * len(rows), pa.string()),
        "session": pa.array([r[3] for r in rows], pa.string()),
        "source_ip": pa.array([r[0] for r in rows], pa.string()),
        "tidx": pa.array([r[1] for r in rows], pa.int64()),
        "sqn": pa.array([r[2] for r in rows], pa.int64()),
        "send_ts_ns": pa.array([r[4] for r in rows], pa.int64()),
    })


def regs_table(rows: list[dict[str, Any]]) -> pa.Table:
    names = ["pos", "role", "outcome", "source_ip", "store_ip", "transport_idx", "topic_idx",
             "topic", "granted_reg_id"]
    types = [pa.int64(), pa.string(), pa.string(), pa.string(), pa.string(), pa.int64(),
             pa.int64(), pa.string(), pa.int64()]
    return pa.table({"capture": pa.array(["c"] * len(rows), pa.string()),
                     **{n: pa.array([r.get(n) for r in rows], t)
                        for n, t in zip(names, types, strict=True)}})


SRC, STORE, RCV = "10.0.1.1", "10.0.3.1", "10.0.2.1"

MESSAGES = messages_table([
    # stability ACKs of (SRC, transport 1, topic 1): sqn 5 before any send, at the instant of
    # two sends (sessions a and b), between sends; sqn 6 before its only send; sqn 7 never sent
    {"pos": 1, "ts": 50, "src": STORE, "dst": SRC, "ack": (STABLE, 1, 1, None, 5)},
    {"pos": 2, "ts": 100, "src": STORE, "dst": SRC, "ack": (STABLE, 1, 1, None, 5)},
    {"pos": 3, "ts": 250, "src": STORE, "dst": SRC, "ack": (STABLE, 1, 1, None, 5)},
    {"pos": 4, "ts": 40, "src": STORE, "dst": SRC, "ack": (STABLE, 1, 1, None, 6)},
    {"pos": 5, "ts": 400, "src": STORE, "dst": SRC, "ack": (STABLE, 1, 1, None, 7)},
    # topic 2 has registrations without pos only; topic 3 none
    {"pos": 6, "ts": 400, "src": STORE, "dst": SRC, "ack": (STABLE, 1, 2, None, 5)},
    {"pos": 7, "ts": 400, "src": STORE, "dst": SRC, "ack": (STABLE, 1, 3, None, 5)},
    # a null destination: a null source, which Spark's window groups with a null-source send
    {"pos": 8, "ts": 30, "src": STORE, "dst": None, "ack": (STABLE, 1, 1, None, 9)},
    # consumption ACKs: a known RegID (sqn 5 at 260, after sessions a, b and c), an unknown one
    {"pos": 9, "ts": 260, "src": RCV, "dst": STORE, "ack": (CDELV, 1, 0, 77, 5)},
    {"pos": 10, "ts": 260, "src": RCV, "dst": STORE, "ack": (CDELV, 1, 0, 78, 5)},
    # not an ACK
    {"pos": 11, "ts": 500, "src": SRC, "dst": STORE, "ack": None},
])

SENDS = sends_table([
    (SRC, 1, 5, "lbtrm:b", 100), (SRC, 1, 5, "lbtrm:a", 100), (SRC, 1, 5, "lbtrm:c", 200),
    (SRC, 1, 5, "lbtrm:z", 300), (SRC, 1, 6, "lbtrm:a", 50), (SRC, 2, 5, "lbtrm:a", 10),
    (SRC, 3, 5, "lbtrm:a", 10), (None, 1, 9, "lbtrm:n", 10),
])

REGS = regs_table([
    {"pos": 20, "role": "source", "outcome": "granted", "source_ip": SRC, "store_ip": STORE,
     "transport_idx": 1, "topic_idx": 1, "topic": "late"},
    {"pos": 10, "role": "source", "outcome": "granted", "source_ip": SRC, "store_ip": STORE,
     "transport_idx": 1, "topic_idx": 1, "topic": "early"},
    {"pos": None, "role": "source", "outcome": "granted", "source_ip": SRC, "store_ip": STORE,
     "transport_idx": 1, "topic_idx": 1, "topic": "no pos"},
    {"pos": None, "role": "source", "outcome": "granted", "source_ip": SRC, "store_ip": STORE,
     "transport_idx": 1, "topic_idx": 2, "topic": "only without pos"},
    {"pos": 30, "role": "receiver", "outcome": "granted", "source_ip": SRC, "store_ip": STORE,
     "topic_idx": 1, "topic": "early", "granted_reg_id": 77},
    {"pos": 31, "role": "receiver", "outcome": "refused", "source_ip": SRC, "store_ip": STORE,
     "topic_idx": 1, "topic": "early", "granted_reg_id": 78},
])


def by_pos(table: Any) -> dict[int, dict[str, Any]]:
    rows = pa.Table.from_pandas(table, preserve_index=False).to_pylist()
    return {r["pos"]: r for r in rows}


def test_stability_as_of_rules() -> None:
    rows = by_pos(stability_acks(frame(MESSAGES), frame(SENDS), frame(REGS)))
    assert set(rows) == {1, 2, 3, 4, 5, 6, 7, 8}
    # before any send of the message: no send
    assert rows[1]["session"] is None and rows[1]["latency_us"] is None
    # a send at the ACK's instant counts; of two sends then, the greatest session
    assert (rows[2]["session"], rows[2]["send_ts_ns"], rows[2]["latency_us"]) == \
        ("lbtrm:b", 100, 0.0)
    # the latest send at or before the ACK, not a later one
    assert (rows[3]["session"], rows[3]["latency_us"]) == ("lbtrm:c", 0.05)
    assert rows[4]["send_ts_ns"] is None and rows[5]["send_ts_ns"] is None
    # topic: the registration with the least pos; one without pos never chosen
    assert rows[1]["topic"] == "early"
    assert rows[6]["topic"] is None and rows[6]["session"] == "lbtrm:a"
    assert rows[7]["topic"] is None
    # a null key part equals a null in the as-of join (Spark's window partitions so)
    assert rows[8]["source_ip"] is None and rows[8]["session"] == "lbtrm:n"


def test_consumption_registration_rules() -> None:
    rows = by_pos(consumption_acks(frame(MESSAGES), frame(SENDS), frame(REGS)))
    assert set(rows) == {9, 10}
    assert (rows[9]["source_ip"], rows[9]["tidx"], rows[9]["topic"]) == (SRC, 1, "early")
    assert (rows[9]["session"], rows[9]["latency_us"]) == ("lbtrm:c", 0.06)
    # a RegID the capture never granted: no source, so no send
    assert rows[10]["source_ip"] is None and rows[10]["send_ts_ns"] is None


def hand_stability_consumption() -> tuple[pa.Table, pa.Table]:
    """Stability and consumption rows whose latencies test the percentile arithmetic (p99 of
    24783, 24884, 60638, 90699: Spark 89797.16999999998, numpy 89797.17) and the histogram
    edges (1000 us, a power of 10 whose ln 1000 / ln 10 is 2.9999999999999996; 0.5 us; 8 us;
    a null)."""
    stability = pa.table({
        "capture": ["c"] * 8, "source_ip": [SRC] * 7 + [None], "tidx": pa.array([1] * 8),
        "topic": ["t"] * 8, "store_ip": [STORE] * 8,
        "latency_us": pa.array([24783.0, 24884.0, 60638.0, 90699.0, 1000.0, 0.5, 8.0, None]),
    })
    consumption = pa.table({
        "capture": ["c"] * 4, "source_ip": [SRC, SRC, SRC, None], "tidx": pa.array([1] * 4),
        "topic": ["t", "t", "t", None], "store_ip": [STORE] * 4,
        "receiver_ip": [RCV, RCV, None, "10.0.2.2"],
        "latency_us": pa.array([3.0, None, 7.0, 1.0]),
    })
    return stability, consumption


def test_percentiles_as_spark_computes_them() -> None:
    stability, consumption = hand_stability_consumption()
    four = stability.slice(0, 4)
    row = pa.Table.from_pandas(latency_summary(frame(four), frame(consumption.slice(0, 0))),
                               preserve_index=False).to_pylist()[0]
    # position 2.97: low + fraction * (high - low), Spark's arithmetic, not numpy's
    # high - (high - low) * (1 - fraction) (89797.17)
    assert row["p99_us"] == 60638.0 + (3 * 0.99 - 2) * (90699.0 - 60638.0) == 89797.16999999998
    assert row["p50_us"] == 24884.0 + 0.5 * (60638.0 - 24884.0)
    assert (row["acks"], row["matched"], row["receivers"]) == (4, 4, 0)


def test_histogram_buckets_as_spark_computes_them() -> None:
    stability, consumption = hand_stability_consumption()
    none = consumption.slice(0, 0)

    def buckets(base: float) -> dict[int, int]:
        options = AnalysisOptions(histogram_base=base)
        table = latency_histogram(frame(stability), frame(none), options)
        rows = pa.Table.from_pandas(table, preserve_index=False).to_pylist()
        return {r["bucket"]: r["count"] for r in rows if r["source_ip"] == SRC}

    # base 2: 0.5 us shares bucket 0 with 1 us; 8 us (ln 8 / ln 2 = 3.0) starts bucket 3
    assert buckets(2.0) == {14: 2, 15: 1, 16: 1, 9: 1, 0: 1, 3: 1}
    # base 10: 1000 us lands in [100, 1000), as Spark's log(10, 1000) = 2.9999999999999996
    # puts it (the null latency is not counted)
    assert buckets(10.0) == {4: 4, 2: 1, 0: 2}


def test_hand_made_equal_spark(spark: Any) -> None:
    from tests.spark_analysis import twin as A

    messages = spark.createDataFrame(MESSAGES)
    sends = spark.createDataFrame(SENDS)
    regs = spark.createDataFrame(REGS)
    theirs = A.stability_acks(messages, sends, regs).toArrow()
    ours = stability_acks(frame(MESSAGES), frame(SENDS), frame(REGS))
    assert_same(ours, theirs, columns_in_order=True)
    theirs = A.consumption_acks(messages, sends, regs).toArrow()
    ours = consumption_acks(frame(MESSAGES), frame(SENDS), frame(REGS))
    assert_same(ours, theirs, columns_in_order=True)

    stability, consumption = hand_stability_consumption()
    st, co = spark.createDataFrame(stability), spark.createDataFrame(consumption)
    assert_same(latency_summary(frame(stability), frame(consumption)),
                A.latency_summary(st, co).toArrow(), columns_in_order=True, rel=0)
    for base in (2.0, 10.0):
        options = AnalysisOptions(histogram_base=base)
        theirs = A.latency_histogram(st, co, options).toArrow()
        ours = latency_histogram(frame(stability), frame(consumption), options)
        assert_same(ours, theirs, columns_in_order=True, rel=0)
