"""The engine's retransmission analyses (:mod:`spark_analysis.engine.retransmission`) equal
their Spark SQL twins in :mod:`tests.spark_analysis.twin`: on the corpus (inputs from the Spark
steps, so the ports of the other analyses do not matter here) and on small hand-made tables
with the edge cases (an RX before the NAK, an RX from another UDP port of the session, one of
another session, one to another LBT-RU receiver, an RX or NAK quoted by ICMP, a port- vs a
host-unreachable bounce, a null entry in a NAK, an unknown NCF reason, a NAK without NAK port,
a session ID over 32 bits, RXREQs and RETRANS in one packet, a registration's topic, a
percentile where older Spark's and numpy's arithmetic differ from Spark 4's)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa

from spark_analysis.engine.retransmission import (
    REQUEST_FIELDS,
    _ncf_text,
    retransmission_requests,
    retransmission_summary,
)
from tests.spark_analysis.engine_oracle import Golden, assert_same, frame

# --- the corpus --------------------------------------------------------------------------------

def test_retransmission_requests_equal_spark(steps: dict[str, pa.Table], golden: Golden) -> None:
    ours = retransmission_requests(frame(steps["packets"]), frame(steps["data"]),
                                   frame(steps["messages"]), frame(steps["regs"]))
    assert_same(ours, steps["requests"], columns_in_order=True)
    assert_same(ours, golden("retransmission_requests"), columns_in_order=True)


def test_retransmission_summary_equal_spark(steps: dict[str, pa.Table], golden: Golden) -> None:
    ours = retransmission_summary(frame(steps["requests"]))
    assert_same(ours, golden("retransmission_summary"), columns_in_order=True)


# --- hand-made tables --------------------------------------------------------------------------

PACKET_FIELDS = [
    ("capture", pa.string()), ("pos", pa.int64()), ("file", pa.string()),
    ("file_offset", pa.int64()), ("ts_ns", pa.int64()), ("protocol", pa.string()),
    ("src_ip", pa.string()), ("src_port", pa.int32()), ("dst_ip", pa.string()),
    ("dst_port", pa.int32()), ("packet_type", pa.string()), ("sqn", pa.int64()),
    ("session_id", pa.int64()), ("ucast_port", pa.int32()), ("retransmission", pa.bool_()),
    ("nak_sqns", pa.list_(pa.int64())), ("ncf_sqns", pa.list_(pa.int64())),
    ("ncf_reason", pa.int32()), ("icmp_type", pa.int32()), ("icmp_code", pa.int32())]
RXREQ = pa.struct([("request_idx", pa.int64()), ("id_2", pa.int64()), ("seqnum", pa.int64())])
MESSAGE_FIELDS = [
    ("capture", pa.string()), ("pos", pa.int64()), ("msg_index", pa.int32()),
    ("file", pa.string()), ("file_offset", pa.int64()), ("ts_ns", pa.int64()),
    ("src_ip", pa.string()), ("src_port", pa.int32()), ("dst_ip", pa.string()),
    ("dst_port", pa.int32()), ("ume_rxreq", RXREQ)]
DATA_FIELDS = [
    ("capture", pa.string()), ("pos", pa.int64()), ("msg_index", pa.int32()),
    ("ts_ns", pa.int64()), ("src_ip", pa.string()), ("src_port", pa.int32()),
    ("dst_ip", pa.string()), ("dst_port", pa.int32()), ("sqn", pa.int64()),
    ("tidx", pa.int64()), ("message_type", pa.string())]
REG_FIELDS = [
    ("capture", pa.string()), ("pos", pa.int64()), ("msg_index", pa.int32()),
    ("role", pa.string()), ("outcome", pa.string()), ("store_ip", pa.string()),
    ("granted_reg_id", pa.int64()), ("topic_idx", pa.int64())]


def table(fields: list[tuple[str, pa.DataType]], rows: list[dict[str, Any]]) -> pa.Table:
    """``rows`` (missing keys null; ``file``/``file_offset``/``capture`` filled in)."""
    defaults = {"capture": "c", "file": "c.pcap"}
    full = [{**defaults, "file_offset": r.get("pos"), **r} for r in rows]
    return pa.table({name: pa.array([r.get(name) for r in full], kind)
                     for name, kind in fields})


SRC, RCV, RCV2, GROUP = "10.0.0.1", "10.0.0.2", "10.0.0.3", "239.1.1.1"
RU_SRC = "10.0.1.1"


def rm(pos: int, packet_type: str, **more: Any) -> dict[str, Any]:
    """An LBT-RM packet of session (SRC, NAK port 14390, 0xabcd) at ``ts_ns`` = pos us."""
    row = {"pos": pos, "ts_ns": pos * 1000, "protocol": "lbtrm", "packet_type": packet_type,
           "session_id": 0xABCD, "ucast_port": 14390}
    if packet_type == "nak":
        row.update(src_ip=RCV, src_port=6000, dst_ip=SRC, dst_port=14390)
    else:
        row.update(src_ip=SRC, src_port=5000, dst_ip=GROUP, dst_port=14400)
    return {**row, **more}


def ru(pos: int, packet_type: str, receiver: str, **more: Any) -> dict[str, Any]:
    """An LBT-RU packet between RU_SRC:7000 and ``receiver``:8000, session ID over 32 bits."""
    row = {"pos": pos, "ts_ns": pos * 1000, "protocol": "lbtru", "packet_type": packet_type,
           "session_id": 0x1234567890}
    if packet_type == "nak":
        row.update(src_ip=receiver, src_port=8000, dst_ip=RU_SRC, dst_port=7000)
    else:
        row.update(src_ip=RU_SRC, src_port=7000, dst_ip=receiver, dst_port=8000)
    return {**row, **more}


def nak_packets() -> pa.Table:
    return table(PACKET_FIELDS, [
        rm(10, "data", sqn=1, retransmission=True),                # before the NAK
        rm(20, "nak", nak_sqns=[1, 2, 3, None, 4, 5]),
        rm(30, "data", sqn=1, retransmission=True),                # serves 1 (port 5000)
        rm(31, "data", sqn=1, retransmission=True),                # a second one
        rm(32, "data", sqn=2, retransmission=False),               # not a retransmission
        rm(35, "data", sqn=2, retransmission=True, session_id=0xBEEF),  # other session
        rm(40, "ncf", ncf_sqns=[2], ncf_reason=2),                 # confirms 2
        rm(45, "data", sqn=3, retransmission=True, icmp_type=3, icmp_code=3),  # a bounce
        rm(50, "nak", nak_sqns=[3], icmp_type=3, icmp_code=3),     # port unreachable: 3
        rm(55, "nak", nak_sqns=[4], icmp_type=3, icmp_code=1),     # host unreachable: no
        rm(60, "ncf", ncf_sqns=[5, 5], ncf_reason=9),              # unknown reason
        rm(200, "nak", nak_sqns=[9], ucast_port=None),             # no NAK port
        rm(210, "data", sqn=9, retransmission=True, ucast_port=None),
        ru(100, "nak", RCV, nak_sqns=[7]),
        ru(110, "data", RCV2, sqn=7, retransmission=True),         # to another receiver
        ru(120, "data", RCV, sqn=7, retransmission=True),          # serves 7
    ])


def rows(df: pd.DataFrame) -> list[dict[str, Any]]:
    return pa.Table.from_pandas(df, preserve_index=False).to_pylist()


def empty(fields: list[tuple[str, pa.DataType]]) -> pa.Table:
    return pa.schema(fields).empty_table()


def spark_requests(spark: Any, *tables: pa.Table) -> pa.Table:
    from tests.spark_analysis import twin as A

    return A.retransmission_requests(*[spark.createDataFrame(t) for t in tables]).toArrow()


def test_naks_pair_with_the_first_answer_of_their_session(spark: Any) -> None:
    inputs = (nak_packets(), empty(DATA_FIELDS), empty(MESSAGE_FIELDS), empty(REG_FIELDS))
    ours = retransmission_requests(*[frame(t) for t in inputs])
    got = {(r["pos"], r["sqn"]): (r["outcome"], r["service_us"], r["ncf_reason"],
                                   r["ncf_text"], r["session"]) for r in rows(ours)}
    rm_session, ru_session = "lbtrm:10.0.0.1:14390:0000abcd", "lbtru:10.0.1.1:7000:12345678"
    assert got == {
        (20, 1): ("served", 10.0, None, None, rm_session),
        (20, 2): ("ncf", None, 2, "Retransmit Delay", rm_session),
        (20, 3): ("closed-port", None, None, None, rm_session),
        (20, None): ("unanswered", None, None, None, rm_session),
        (20, 4): ("unanswered", None, None, None, rm_session),
        (20, 5): ("ncf", None, 9, None, rm_session),
        # concat_ws leaves a null part out: the key is never null
        (200, 9): ("served", 10.0, None, None, "lbtrm:10.0.0.1:0000abcd"),
        # lpad(hex(id), 8) keeps the first eight digits of a longer ID
        (100, 7): ("served", 20.0, None, None, ru_session),
    }
    assert set(ours["kind"]) == {"lbtrm-nak", "lbtru-nak"}
    assert_same(ours, spark_requests(spark, *inputs), columns_in_order=True, rel=0)


def test_rxreqs_pair_with_the_first_retrans_after_them(spark: Any) -> None:
    store, receiver = "10.0.2.1", "10.0.2.2"
    ends = {"src_ip": receiver, "src_port": 9100, "dst_ip": store, "dst_port": 9000}
    back = {"src_ip": store, "src_port": 9000, "dst_ip": receiver, "dst_port": 9100}
    messages = table(MESSAGE_FIELDS, [
        {"pos": 10, "msg_index": 1, "ts_ns": 10_000, **ends,
         "ume_rxreq": {"request_idx": 1, "id_2": 77, "seqnum": 100}},
        {"pos": 10, "msg_index": 2, "ts_ns": 10_000, **ends,
         "ume_rxreq": {"request_idx": 2, "id_2": 88, "seqnum": 100}},
        {"pos": 11, "msg_index": 0, "ts_ns": 11_000, **ends,
         "ume_rxreq": {"request_idx": 3, "id_2": 77, "seqnum": 101}},
        {"pos": 11, "msg_index": 1, "ts_ns": 11_000, **ends, "ume_rxreq": None}])
    data = table(DATA_FIELDS, [
        {"pos": 10, "msg_index": 0, "ts_ns": 10_000, **back, "sqn": 100, "tidx": 3,
         "message_type": "retrans"},                               # before the requests
        {"pos": 10, "msg_index": 3, "ts_ns": 10_500, **back, "sqn": 100, "tidx": 4,
         "message_type": "retrans"},                               # after, topic 4
        {"pos": 12, "msg_index": 0, "ts_ns": 12_000, **back, "sqn": 100, "tidx": 3,
         "message_type": "retrans"},                               # after, topic 3
        {"pos": 13, "msg_index": 0, "ts_ns": 13_000, **back, "sqn": 101, "tidx": 3,
         "message_type": "data"}])                                 # not a RETRANS
    regs = table(REG_FIELDS, [
        {"pos": 5, "msg_index": 0, "role": "receiver", "outcome": "granted",
         "store_ip": store, "granted_reg_id": 77, "topic_idx": 3},
        {"pos": 8, "msg_index": 0, "role": "receiver", "outcome": "granted",
         "store_ip": store, "granted_reg_id": 77, "topic_idx": 4},  # later: not the topic
        {"pos": 6, "msg_index": 0, "role": "receiver", "outcome": "error",
         "store_ip": store, "granted_reg_id": 88, "topic_idx": 4}])  # not granted
    inputs = (empty(PACKET_FIELDS), data, messages, regs)
    ours = retransmission_requests(*[frame(t) for t in inputs])
    got = {r["request_idx"]: (r["reg_id"], r["tidx"], r["sqn"], r["served_ts_ns"],
                              r["outcome"], r["kind"]) for r in rows(ours)}
    assert got == {
        1: (77, 3, 100, 12_000, "served", "ume-rxreq"),     # its registration's topic only
        2: (88, None, 100, 10_500, "served", "ume-rxreq"),  # no registration: any topic
        3: (77, 3, 101, None, "unanswered", "ume-rxreq"),
    }
    assert_same(ours, spark_requests(spark, *inputs), columns_in_order=True, rel=0)


def test_summary_percentiles_are_spark_4s(spark: Any) -> None:
    from tests.spark_analysis import twin as A

    def request(responder: str | None, sqn: int | None, service_us: float | None,
                outcome: str) -> dict[str, Any]:
        return {"capture": "c", "kind": "lbtrm-nak", "ts_ns": 0, "pos": 0,
                "requester_ip": RCV, "responder_ip": responder, "responder_port": 14390,
                "sqn": sqn, "service_us": service_us, "outcome": outcome}

    requests = table(REQUEST_FIELDS, [
        request(SRC, 1, 543.6, "served"), request(SRC, 1, 935.1, "served"),
        request(SRC, 2, None, "unanswered"), request(None, None, None, "ncf")])
    ours = retransmission_summary(frame(requests))
    theirs = A.retransmission_summary(spark.createDataFrame(requests)).toArrow()
    assert_same(ours, theirs, columns_in_order=True, rel=0)
    row = ours[ours["responder_ip"] == SRC].iloc[0]
    # v[lo] + t * (v[hi] - v[lo]); (1 - t) * v[lo] + t * v[hi] and numpy give 931.1850000000001
    assert row["p99_us"] == 931.185
    assert (row["requests"], row["sqns"], row["served"], row["unanswered"]) == (3, 2, 2, 1)
    lone = ours[ours["responder_ip"].isna()].iloc[0]
    assert (lone["requests"], lone["sqns"], lone["ncf"]) == (1, 0, 1)
    assert pd.isna(lone["p50_us"]) and pd.isna(lone["max_us"]) and pd.isna(lone["mean_us"])


def test_ncf_text_names_known_reasons_only() -> None:
    reasons = pa.array([0, 1, 2, 3, 4, None], pa.int32())
    assert _ncf_text(reasons).to_pylist() == [
        "Do not retry", "NAK Ignored", "Retransmit Delay", "NAK Shed", None, None]
