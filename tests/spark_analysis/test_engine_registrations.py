"""The engine's store registrations (:mod:`spark_analysis.engine.registrations`) against their
Spark SQL twins on the corpus, and the pairing rules on hand-made registrations."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_analysis.engine.registrations import (
    PREG_ERROR_TEXT,
    _pair_by_key,
    _pair_registrations,
    _preg_error_text,
    registration_summary,
    registrations,
)
from tests.spark_analysis.engine_oracle import Golden, assert_same, frame

POSITIONS = ["pos", "response_pos"]
"""``pos`` of the golden output counts every corpus file (``not-um.pcap`` too), the steps'
only files with packets: the same rows, other file ranks."""


def test_registrations_equal_spark(steps: dict[str, pa.Table], golden: Golden) -> None:
    ours = registrations(frame(steps["messages"]))
    assert_same(ours, steps["regs"])
    assert_same(ours.drop(columns=POSITIONS), golden("registrations").drop_columns(POSITIONS),
                columns_in_order=True)


def test_registration_summary_equal_spark(steps: dict[str, pa.Table], golden: Golden) -> None:
    assert_same(registration_summary(frame(steps["regs"])), golden("registration_summary"),
                columns_in_order=True)


def test_pair_by_key_equals_pairing_each_key(steps: dict[str, pa.Table]) -> None:
    """The driver's pairing of all keys at once is the per-key pairing of ``applyInArrow``."""
    regs = steps["regs"]
    key = ["capture", "client_ip", "client_port", "store_ip", "store_port", "role",
           "transport_idx", "topic_idx"]
    requests = regs.select([*key, "pos", "msg_index"])
    events = requests.append_column("request", pa.array([True] * regs.num_rows)).append_column(
        "content", pa.array([str(i) for i in range(regs.num_rows)]))
    answered = regs.filter(pc.is_valid(regs["response_pos"]))
    responses = (answered.select([*key, "response_pos", "response_index"])
                 .rename_columns(requests.column_names)
                 .append_column("request", pa.array([False] * answered.num_rows))
                 .append_column("content", pa.array([""] * answered.num_rows)))
    events = pa.concat_tables([events, responses])
    by_key = _pair_by_key(events)
    keys = events.select(key).to_pylist()
    parts = [_pair_registrations(events.filter(pa.array([k == key for k in keys])))
             for key in {tuple(k.items()): k for k in keys}.values()]
    assert by_key.num_rows > 0
    assert_same(by_key, pa.concat_tables(parts))


# =============================================================================================
# Hand-made: retries, unsolicited responses, several pending requests, named sources
# =============================================================================================

STORE = ("10.0.3.1", 14567)
SOURCE1, SOURCE2, RECEIVER = ("10.0.1.1", 40000), ("10.0.1.2", 40000), ("10.0.2.1", 50000)
PREG = pa.struct([("s_flag", pa.bool_()), ("marker", pa.int16()), ("reg_id", pa.int64()),
                  ("transport_idx", pa.int64()), ("topic_idx", pa.int64()),
                  ("src_reg_id", pa.int64()), ("w_flag", pa.bool_()), ("d_flag", pa.bool_()),
                  ("p_flag", pa.bool_())])
PREG_RESP = pa.struct([("s_flag", pa.bool_()), ("marker", pa.int16()), ("reg_id", pa.int64()),
                       ("transport_idx", pa.int64()), ("topic_idx", pa.int64()),
                       ("e_flag", pa.bool_()), ("error_code", pa.int16()),
                       ("o_flag", pa.bool_()), ("n_flag", pa.bool_()), ("w_flag", pa.bool_()),
                       ("low_seqnum", pa.int64()), ("high_seqnum", pa.int64())])
SCHEMA = pa.schema([("capture", pa.string()), ("pos", pa.int64()), ("msg_index", pa.int32()),
                    ("file", pa.string()), ("file_offset", pa.int64()), ("ts_ns", pa.int64()),
                    ("src_ip", pa.string()), ("src_port", pa.int32()),
                    ("dst_ip", pa.string()), ("dst_port", pa.int32()),
                    ("topic_name", pa.string()), ("ume_preg", PREG),
                    ("ume_preg_resp", PREG_RESP),
                    ("ume_sid", pa.struct([("sid", pa.decimal128(20, 0))])),
                    ("ume_storeid", pa.struct([("store_id", pa.int16())]))])


def _preg(pos: int, client: tuple[str, int], source: bool | None, *, index: int = 0,
          src_reg_id: int = 0, topic: str | None = None, sid: int | None = None
          ) -> dict[str, Any]:
    return {"capture": "c", "pos": pos, "msg_index": index, "file": "f", "file_offset": pos,
            "ts_ns": pos * 1000, "src_ip": client[0], "src_port": client[1],
            "dst_ip": STORE[0], "dst_port": STORE[1], "topic_name": topic,
            "ume_preg": {"s_flag": source, "marker": 1, "reg_id": 0, "transport_idx": 1,
                         "topic_idx": 1, "src_reg_id": src_reg_id, "w_flag": False,
                         "d_flag": False, "p_flag": False},
            "ume_sid": None if sid is None else {"sid": Decimal(sid)}}


def _resp(pos: int, client: tuple[str, int], source: bool | None, reg_id: int, *,
          error: int | None = None) -> dict[str, Any]:
    return {"capture": "c", "pos": pos, "msg_index": 0, "file": "f", "file_offset": pos,
            "ts_ns": pos * 1000 + 85, "src_ip": STORE[0], "src_port": STORE[1],
            "dst_ip": client[0], "dst_port": client[1],
            "ume_preg_resp": {"s_flag": source, "marker": 1, "reg_id": reg_id,
                              "transport_idx": 1, "topic_idx": 1,
                              "e_flag": None if error is None else True, "error_code": error,
                              "o_flag": False, "n_flag": False, "w_flag": False,
                              "low_seqnum": 0, "high_seqnum": 0},
            "ume_storeid": {"store_id": 7}}


def test_registration_pairing_rules() -> None:
    """A retry supersedes the pending request (which stays unanswered); a response with
    nothing pending answers nothing; of two pending requests the oldest is answered first; a
    null S flag is a receiver; a null error flag is a grant; a receiver's source is the
    earliest source granted the RegID it names at that store."""
    messages = pa.Table.from_pylist([
        _preg(100, SOURCE1, True, topic="t", sid=2**63 + 5),
        _preg(200, SOURCE1, True, topic="t", sid=2**63 + 5),          # retry of 100
        _resp(300, SOURCE1, True, 1001),                               # answers 200
        _resp(400, SOURCE1, True, 1002),                               # unsolicited
        _preg(500, RECEIVER, None, src_reg_id=1001),
        _preg(500, RECEIVER, False, index=1, src_reg_id=1003),        # second pending
        _resp(600, RECEIVER, False, 2001, error=9),                    # answers 500/0
        _resp(700, RECEIVER, None, 2002),                              # answers 500/1
        _preg(800, SOURCE2, True, topic="u"),
        _resp(900, SOURCE2, True, 1001),                               # 1001 granted again
    ], SCHEMA).to_pandas(types_mapper=pd.ArrowDtype)
    regs = registrations(messages).sort_values(["pos", "msg_index"])
    got = regs[["pos", "msg_index", "role", "outcome", "response_pos", "granted_reg_id",
                "error_code", "error", "source_ip", "topic", "session_id",
                "response_us"]].astype(object).where(regs.notna(), None)
    assert got.values.tolist() == [
        [100, 0, "source", "unanswered", None, None, None, None, "10.0.1.1", "t",
         str(2**63 + 5), None],
        [200, 0, "source", "granted", 300, 1001, None, None, "10.0.1.1", "t",
         str(2**63 + 5), 100.085],
        [500, 0, "receiver", "error", 600, None, 9, "Unknown error 9", "10.0.1.1", "t",
         None, 100.085],
        [500, 1, "receiver", "granted", 700, 2002, None, None, None, None, None, 200.085],
        [800, 0, "source", "granted", 900, 1001, None, None, "10.0.1.2", "u", None, 100.085],
    ]
    assert regs["store_id"].tolist() == [pd.NA, 7, 7, 7, 7]
    summary = registration_summary(regs).sort_values(["role", "outcome"])
    assert summary[["role", "outcome", "requests", "clients", "topics"]].values.tolist() == [
        ["receiver", "error", 1, 1, 1], ["receiver", "granted", 1, 1, 0],
        ["source", "granted", 2, 2, 2], ["source", "unanswered", 1, 1, 1]]
    assert str(summary["requests"].dtype) == "int64[pyarrow]"


def test_preg_error_texts() -> None:
    """Known codes get tshark's text, others ``Unknown error N``, no code no text."""
    codes = pa.array([0, 5, 6, 42, None], pa.int16())
    assert _preg_error_text(codes).to_pylist() == [
        PREG_ERROR_TEXT[0], PREG_ERROR_TEXT[5], PREG_ERROR_TEXT[6], "Unknown error 42", None]


def test_chunked_messages_give_the_same_registrations(steps: dict[str, pa.Table]) -> None:
    """The registration messages are taken chunk by chunk: message columns in many chunks
    (and empty ones) give the same registrations as whole ones."""
    table = steps["messages"]
    empty = pa.RecordBatch.from_pylist([], schema=table.schema)
    chunked = pa.Table.from_batches([*table.to_batches(max_chunksize=5), empty], table.schema)
    assert frame(chunked)["pos"].array._pa_array.num_chunks > 2
    assert_same(registrations(frame(chunked)), steps["regs"])
