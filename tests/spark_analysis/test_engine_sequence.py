"""The engine's sequence analyses (:mod:`spark_analysis.engine.sequence`) equal their Spark SQL
twins in :mod:`tests.spark_analysis.twin`: on the corpus (inputs from the Spark steps, so the
ports of the other analyses do not matter here), and on small hand-made tables with the edge
cases of tshark's rules (retransmissions, a data gap measured from the previous item against
an SM gap measured from the high-water mark, duplicates at and below the mark, capture order
against timestamps, items of one frame, a quoted datagram, null keys, a null number)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa

from spark_analysis.engine.sequence import (
    judged_items,
    sequence_events,
    sequence_flags,
    sequence_summary,
)
from tests.spark_analysis.engine_oracle import assert_same, frame, spark_twin

# ---------------------------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------------------------


def test_judged_items_equal_spark(steps: dict[str, pa.Table]) -> None:
    ours = judged_items(frame(steps["packets"]), frame(steps["data"]))
    assert_same(ours, steps["flags"], columns_in_order=True)


def test_sequence_flags_are_judged_items_without_seen(steps: dict[str, pa.Table]) -> None:
    ours = sequence_flags(frame(steps["packets"]), frame(steps["data"]))
    assert_same(ours, steps["flags"].drop(["seen"]), columns_in_order=True)


def test_sequence_summary_equals_spark(steps: dict[str, pa.Table], spark: Any) -> None:
    theirs = spark_twin(spark, "sequence_summary", steps["flags"])
    assert theirs.num_rows > 0
    assert_same(sequence_summary(frame(steps["flags"])), theirs, columns_in_order=True)
    # without ``seen`` the distinct numbers are counted: the same result
    assert_same(sequence_summary(frame(steps["flags"].drop(["seen"]))), theirs,
                columns_in_order=True)


def test_sequence_events_equal_spark(steps: dict[str, pa.Table], spark: Any) -> None:
    theirs = spark_twin(spark, "sequence_events", steps["flags"])
    assert theirs.num_rows > 0
    assert_same(sequence_events(frame(steps["flags"])), theirs, columns_in_order=True)


# ---------------------------------------------------------------------------------------------
# Hand-made edge cases
# ---------------------------------------------------------------------------------------------

PACKETS = pa.schema([
    ("capture", pa.string()), ("pos", pa.int64()), ("file", pa.string()),
    ("file_offset", pa.int64()), ("ts_ns", pa.int64()), ("protocol", pa.string()),
    ("src_ip", pa.string()), ("src_port", pa.int32()), ("dst_ip", pa.string()),
    ("dst_port", pa.int32()), ("packet_type", pa.string()), ("sqn", pa.int64()),
    ("session_id", pa.int64()), ("ucast_port", pa.int32()), ("retransmission", pa.bool_()),
    ("icmp_type", pa.int32())])

DATA = pa.schema([
    ("capture", pa.string()), ("pos", pa.int64()), ("msg_index", pa.int32()),
    ("file", pa.string()), ("file_offset", pa.int64()), ("ts_ns", pa.int64()),
    ("message_type", pa.string()), ("label", pa.string()), ("protocol", pa.string()),
    ("src_ip", pa.string()), ("source_port", pa.int32()), ("session_id", pa.int64()),
    ("dst_ip", pa.string()), ("dst_port", pa.int32()), ("tidx", pa.int64()),
    ("sqn", pa.int64()), ("rx", pa.bool_())])


def _packets() -> pa.Table:
    """An LBT-RM source: a DATA stream and an SM stream (rows out of capture order; the
    timestamps step back at pos 60), one DATA datagram quoted by an ICMP error, and an
    LBT-RU DATA stream of a second receiver with the same numbers."""
    rows: list[tuple[Any, ...]] = []

    def add(pos: int, ptype: str, sqn: int | None, rx: bool | None = False,
            icmp: int | None = None, ts: int | None = None, dst: str = "224.1.1.1",
            protocol: str = "lbtrm") -> None:
        rows.append(("c", pos, "f", pos, ts if ts is not None else 1000 + pos, protocol,
                     "10.0.0.1", 40000, dst, 14400, ptype, sqn, 7, 14390, rx, icmp))

    # transport-data, in capture order: 5 6 9 [7 rx] 8 8 [12 rx] 14 9
    for pos, sqn, rx in [(90, 14, False), (10, 5, False), (20, 6, None), (30, 9, False),
                         (40, 7, True), (50, 8, False), (60, 8, False), (80, 12, True),
                         (100, 9, False)]:
        add(pos, "data", sqn, rx, ts=1 if pos == 60 else None)
    add(35, "data", 100, icmp=3)             # quoted by an ICMP error: not an item
    add(36, "nak", 100)                      # not sequenced
    # transport-sm: 1 3 2 3 7 (an SM gap from the mark: 7 - 4)
    for pos, sqn in [(11, 1), (21, 3), (31, 2), (41, 3), (51, 7)]:
        add(pos, "sm", sqn, rx=None)
    # LBT-RU, same numbers to another receiver: a stream of its own
    for pos, sqn in [(12, 5), (22, 9)]:
        add(pos, "data", sqn, protocol="lbtru", dst="10.0.0.2")
    return pa.Table.from_pylist([dict(zip(PACKETS.names, r, strict=True)) for r in rows],
                                schema=PACKETS)


def _data() -> pa.Table:
    """Topic data of an LBT-TCP connection (session ID given but not part of the key) with
    two messages in one frame (``msg_index`` orders them), a retransmission, a non-DATA
    label and a second topic index reusing the numbers; a number-less message."""
    rows: list[tuple[Any, ...]] = []

    def add(pos: int, index: int, sqn: int | None, tidx: int | None = 1, rx: bool = False,
            label: str = "DATA", mtype: str = "data") -> None:
        rows.append(("c", pos, index, "f", pos, 1000 + pos, mtype, label, "lbttcp",
                     "10.0.0.1", 15000, 99, "10.0.0.3", 40001, tidx, sqn, rx))

    add(10, 1, 1)
    add(10, 0, 0)
    add(20, 0, 4)           # gap 2 (from the mark 1)
    add(20, 1, 2, rx=True)  # retransmission: not judged, counts as seen
    add(30, 0, 2)           # out of order by 2, a duplicate of the retransmission
    add(40, 0, 3, label="OTR")
    add(50, 0, 8, mtype="rx-data")
    add(60, 0, 4)           # at the mark: not out of order, a duplicate
    add(15, 0, 3, tidx=2)
    add(25, 0, 0, tidx=2)
    add(26, 0, None, tidx=None)
    add(27, 0, 5, tidx=None)
    return pa.Table.from_pylist([dict(zip(DATA.names, r, strict=True)) for r in rows],
                                schema=DATA)


def _verdicts(flags: pd.DataFrame, level: str, protocol: str = "lbtrm",
              tidx: int | None = None) -> list[tuple[Any, ...]]:
    f = flags[(flags["level"] == level) & (flags["protocol"] == protocol)]
    if tidx is not None:
        f = f[f["tidx"] == tidx]
    f = f.sort_values(["pos", "msg_index"])
    return list(zip(f["sqn"], f["seen"], f["duplicate"], f["ooo_gap"], f["sqn_gap"],
                    strict=True))


def test_tshark_rules_by_hand() -> None:
    flags = judged_items(frame(_packets()), frame(_data()))
    assert len(flags) == 9 + 5 + 2 + 10
    assert _verdicts(flags, "transport-data") == [
        (5, False, False, 0, 0),   # first: not judged
        (6, False, False, 0, 0),
        (9, False, False, 0, 2),   # 7 and 8 skipped
        (7, False, False, 0, 0),   # retransmission: never judged
        (8, False, False, 1, 0),   # below the mark 9, first copy
        (8, True, True, 1, 0),     # (its timestamp steps back: capture order rules)
        (12, False, False, 0, 0),  # retransmission above the mark: not judged
        (14, False, False, 0, 1),  # a data gap from the previous item (12), not the mark
        (9, True, True, 5, 0),     # the mark is 14 (12 was a retransmission)
    ]
    assert _verdicts(flags, "transport-sm") == [
        (1, False, False, 0, 0), (3, False, False, 0, 1), (2, False, False, 1, 0),
        (3, True, True, 0, 0),     # at the mark: a duplicate, not out of order
        (7, False, False, 0, 3),   # an SM gap from the mark: 4, 5, 6
    ]
    assert _verdicts(flags, "transport-data", "lbtru") == [(5, False, False, 0, 0),
                                                           (9, False, False, 0, 3)]
    assert _verdicts(flags, "topic", "lbttcp", tidx=1) == [
        (0, False, False, 0, 0), (1, False, False, 0, 0), (4, False, False, 0, 2),
        (2, False, False, 0, 0), (2, True, True, 2, 0), (4, True, True, 0, 0)]
    assert _verdicts(flags, "topic", "lbttcp", tidx=2) == [(3, False, False, 0, 0),
                                                           (0, False, False, 3, 0)]
    topic = flags[flags["level"] == "topic"]
    assert topic["session_id"].isna().all()      # LBT-TCP: no session ID in the key
    assert flags[flags["level"] != "topic"]["tidx"].isna().all()
    assert (flags[flags["protocol"] == "lbtrm"]["source_port"] == 14390).all()  # NAK port

    summary = sequence_summary(flags)
    (row,) = summary[(summary["level"] == "transport-data")
                     & (summary["protocol"] == "lbtrm")].to_dict("records")
    assert (row["items"], row["retransmissions"], row["first_sqn"], row["high_sqn"],
            row["distinct_sqns"], row["gaps"], row["gap_sqns"], row["out_of_order"],
            row["duplicates"], row["missing"]) == (9, 2, 5, 14, 7, 2, 3, 3, 2, 3)
    events = sequence_events(flags)
    dup_and_ooo = events[(events["level"] == "transport-data") & (events["sqn"] == 9)
                         & (events["pos"] == 100)]
    assert sorted(zip(dup_and_ooo["event"], dup_and_ooo["size"], strict=True)) == [
        ("duplicate", 1), ("out-of-order", 5)]


def test_hand_made_equal_spark(spark: Any) -> None:
    packets, data = _packets(), _data()
    theirs = spark_twin(spark, "_judged_items", packets, data)
    ours = judged_items(frame(packets), frame(data))
    assert_same(ours, theirs, columns_in_order=True)
    table = pa.Table.from_pandas(ours, preserve_index=False)
    assert_same(sequence_summary(ours), spark_twin(spark, "sequence_summary", table),
                columns_in_order=True)
    assert_same(sequence_events(ours), spark_twin(spark, "sequence_events", table),
                columns_in_order=True)


def test_no_items() -> None:
    packets, data = _packets().slice(0, 0), _data().slice(0, 0)
    flags = judged_items(frame(packets), frame(data))
    assert len(flags) == 0
    assert list(flags.columns)[-4:] == ["seen", "duplicate", "ooo_gap", "sqn_gap"]
    assert len(sequence_summary(flags)) == 0
    assert len(sequence_events(flags)) == 0


def test_stream_codes_are_the_distinct_keys() -> None:
    """The integer stream codes group rows exactly as the key values do: nulls a value of
    their own, integers of a narrow and of a wide range, strings in several chunks, numpy
    codes."""
    from spark_analysis.engine.sequence import _stream_codes

    rng = np.random.default_rng(7)
    n = 5000
    strings = rng.choice(np.array(["a", "b", "", "10.0.0.1"], object), n)
    strings[rng.random(n) < 0.1] = None
    narrow = rng.integers(0, 70000, n).astype(float)
    narrow[rng.random(n) < 0.1] = np.nan
    wide = rng.choice(np.array([-(1 << 62), 0, 1 << 40, (1 << 62) + 5], np.int64), n)
    wide_null = rng.random(n) < 0.1
    keys = pd.DataFrame({"s": strings, "narrow": narrow, "wide": wide})
    keys.loc[wide_null, "wide"] = None
    columns: list[Any] = [
        pa.chunked_array([pa.array(strings[:1000], pa.string()),
                          pa.array(strings[1000:], pa.string())]),
        pa.array(narrow, pa.int32(), from_pandas=True),
        pa.array(wide, pa.int64(), mask=wide_null),
        np.arange(n) % 3]
    keys["level"] = np.arange(n) % 3
    ours = _stream_codes(columns)
    theirs = keys.groupby(["s", "narrow", "wide", "level"], dropna=False, sort=False).ngroup()
    pairs = set(zip(ours.tolist(), theirs.tolist(), strict=True))
    assert len(pairs) == len(set(ours.tolist())) == len(set(theirs.tolist()))


def test_chunked_and_shuffled_inputs_give_the_same_verdicts() -> None:
    """The verdicts do not depend on how the inputs are chunked or ordered (capture order is
    ``pos`` / ``msg_index``, whatever the row order)."""
    packets, data = _packets(), _data()
    expected = judged_items(frame(packets), frame(data))
    rng = np.random.default_rng(3)
    shuffled_p = packets.take(pa.array(rng.permutation(packets.num_rows)))
    shuffled_d = data.take(pa.array(rng.permutation(data.num_rows)))
    chunked_p = pa.Table.from_batches(shuffled_p.to_batches(max_chunksize=4))
    chunked_d = pa.Table.from_batches(shuffled_d.to_batches(max_chunksize=5))
    ours = judged_items(frame(chunked_p), frame(chunked_d))
    assert_same(ours, pa.Table.from_pandas(expected, preserve_index=False),
                columns_in_order=True)
    assert_same(sequence_summary(ours), sequence_summary(expected).pipe(
        pa.Table.from_pandas, preserve_index=False), columns_in_order=True)
