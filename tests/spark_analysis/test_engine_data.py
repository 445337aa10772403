"""The engine's topic resolution, data messages, sends and transport sessions
(:mod:`spark_analysis.engine.topics`, :mod:`~spark_analysis.engine.data`,
:mod:`~spark_analysis.engine.sessions`) equal their Spark SQL twins in
:mod:`tests.spark_analysis.twin`: on the corpus (inputs from the Spark steps), and on small
hand-made tables with the edge cases (a null packet type, a header without its NAK port, a
64-bit session ID, a NAK quoted by an ICMP port unreachable, a session of one instant, TIRs out
of capture order, a pattern that does not compile, a null queried topic)."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_analysis.engine.data import data_messages, message_sends, with_session_side
from spark_analysis.engine.sessions import transport_sessions
from spark_analysis.engine.topics import (
    advertised_topics,
    topic_advertisements,
    topic_queries,
    transport_session_key,
    wildcard_matches,
)
from tests.spark_analysis.engine_oracle import assert_same, frame, spark_twin

# ---------------------------------------------------------------------------------------------
# The corpus
# ---------------------------------------------------------------------------------------------


def test_data_messages_equal_spark(steps: dict[str, pa.Table]) -> None:
    ours = data_messages(frame(steps["packets"]), frame(steps["messages"]),
                         frame(steps["advertisements"]))
    assert_same(ours, steps["data"], columns_in_order=True)


def test_message_sends_equal_spark(steps: dict[str, pa.Table]) -> None:
    assert_same(message_sends(frame(steps["data"])), steps["sends"], columns_in_order=True)


# The final outputs are compared with their twins run here, not with what ``ump analyze`` wrote
# (which may be the engine's own result).


def test_topic_advertisements_equal_spark(steps: dict[str, pa.Table], spark: Any) -> None:
    theirs = spark_twin(spark, "topic_advertisements", steps["advertisements"])
    assert theirs.num_rows > 0
    assert_same(topic_advertisements(frame(steps["advertisements"])), theirs,
                columns_in_order=True)


def test_topic_queries_equal_spark(steps: dict[str, pa.Table], spark: Any) -> None:
    theirs = spark_twin(spark, "topic_queries", steps["advertisements"])
    assert theirs.num_rows > 0
    assert_same(topic_queries(frame(steps["advertisements"])), theirs, columns_in_order=True)


def test_transport_sessions_equal_spark(steps: dict[str, pa.Table], spark: Any) -> None:
    theirs = spark_twin(spark, "transport_sessions", steps["packets"], steps["data"])
    assert theirs.num_rows > 0
    assert_same(transport_sessions(frame(steps["packets"]), frame(steps["data"])), theirs,
                columns_in_order=True)


def test_advertised_topics_and_session_side_equal_spark(steps: dict[str, pa.Table],
                                                        spark: Any) -> None:
    assert_same(advertised_topics(frame(steps["advertisements"])),
                spark_twin(spark, "advertised_topics", steps["advertisements"]))
    udp = steps["packets"].filter(pc.is_in(steps["packets"]["protocol"],
                                                   pa.array(["lbtrm", "lbtru"])))
    assert_same(with_session_side(frame(udp)), spark_twin(spark, "with_session_side", udp),
                columns_in_order=True)


# ---------------------------------------------------------------------------------------------
# Hand-made edge cases
# ---------------------------------------------------------------------------------------------

PACKET_SCHEMA = pa.schema([
    ("capture", pa.string()), ("pos", pa.int64()), ("file", pa.string()),
    ("file_offset", pa.int64()), ("ts_ns", pa.int64()), ("protocol", pa.string()),
    ("src_ip", pa.string()), ("src_port", pa.int32()), ("dst_ip", pa.string()),
    ("dst_port", pa.int32()), ("payload_length", pa.int32()), ("packet_type", pa.string()),
    ("sqn", pa.int64()), ("session_id", pa.int64()), ("ucast_port", pa.int32()),
    ("retransmission", pa.bool_()), ("nak_sqns", pa.list_(pa.int64())),
    ("ncf_sqns", pa.list_(pa.int64())), ("icmp_type", pa.int32()), ("icmp_code", pa.int32()),
])

SRC, RCV, GROUP = "10.0.0.1", "10.0.0.9", "239.1.1.1"
SID, WIDE_SID = 0x2B7F8306, 0x1_0000_0001


def packet(pos: int, ts: int, protocol: str, packet_type: str | None, src: tuple[str, int],
           dst: tuple[str, int], **fields: Any) -> dict[str, Any]:
    return {"capture": "c", "pos": pos, "file": "f", "file_offset": pos, "ts_ns": ts,
            "protocol": protocol, "src_ip": src[0], "src_port": src[1], "dst_ip": dst[0],
            "dst_port": dst[1], "payload_length": 100, "packet_type": packet_type,
            "session_id": SID, **fields}


PACKETS = pa.Table.from_pylist([
    # LBT-RM: data from an ephemeral port, keyed by the header's NAK port 14390
    packet(40, 4_000, "lbtrm", "data", (SRC, 40000), ("239.4.4.4", 14400), ucast_port=14390,
           sqn=2, retransmission=True),
    packet(10, 1_000, "lbtrm", "data", (SRC, 40000), (GROUP, 14400), ucast_port=14390, sqn=1),
    packet(20, 2_000, "lbtrm", "data", (SRC, 40001), ("239.2.2.2", 14400), ucast_port=14390,
           sqn=2, payload_length=None),
    packet(30, 3_000, "lbtrm", "nak", (RCV, 5000), (SRC, 14390), ucast_port=14390,
           nak_sqns=[1, 2]),
    # the same NAK bounced: the NAK port is closed
    packet(50, 9_000, "lbtrm", "nak", (RCV, 5000), (SRC, 14390), ucast_port=14390,
           nak_sqns=[1, 2], icmp_type=3, icmp_code=3),
    # a packet of unknown type: not from the source, so its session is its destination's
    packet(60, 5_000, "lbtrm", None, (RCV, 5001), (SRC, 14390), ucast_port=14390),
    # a header without its NAK port and a session ID wider than 32 bits
    packet(70, 6_000, "lbtrm", "data", (SRC, 40002), (GROUP, 14400), sqn=9,
           session_id=WIDE_SID),
    # LBT-RU: one instant (a span of 0: no rates), a NAK without its list
    packet(80, 7_000, "lbtru", "data", (SRC, 15000), (RCV, 6000), sqn=1),
    packet(81, 7_000, "lbtru", "nak", (RCV, 6000), (SRC, 15000)),
    # LBT-TCP: a sender of new data, and a TCP retransmission of it
    packet(90, 8_000, "lbttcp", None, (SRC, 16000), (RCV, 7000), session_id=None),
    packet(91, 8_500, "lbttcp", None, (SRC, 16000), (RCV, 7000), session_id=None,
           retransmission=True, payload_length=50),
], PACKET_SCHEMA)

DATA_SCHEMA = pa.schema([
    ("capture", pa.string()), ("session", pa.string()), ("protocol", pa.string()),
    ("src_ip", pa.string()), ("src_port", pa.int32()), ("source_port", pa.int32()),
    ("tidx", pa.int64()), ("sqn", pa.int64()), ("ts_ns", pa.int64()), ("topic", pa.string()),
    ("message_type", pa.string()), ("label", pa.string()), ("rx", pa.bool_()),
])

RM_SESSION = "lbtrm:10.0.0.1:14390:2b7f8306"


def message(session: str, protocol: str, port: int, tidx: int, sqn: int, ts: int,
            topic: str | None, rx: bool = False) -> dict[str, Any]:
    return {"capture": "c", "session": session, "protocol": protocol, "src_ip": SRC,
            "src_port": port, "source_port": port, "tidx": tidx, "sqn": sqn, "ts_ns": ts,
            "topic": topic, "message_type": "data", "label": "DATA", "rx": rx}


DATA = pa.Table.from_pylist([
    message(RM_SESSION, "lbtrm", 14390, 1, 1, 1_000, "b.topic"),
    message(RM_SESSION, "lbtrm", 14390, 0, 1, 1_100, "a.topic"),
    message(RM_SESSION, "lbtrm", 14390, 0, 1, 1_200, "a.topic"),
    message(RM_SESSION, "lbtrm", 14390, 2, 1, 1_300, None),
    message(RM_SESSION, "lbtrm", 14390, 0, 2, 4_000, "a.topic", rx=True),
    message("lbtru:10.0.0.1:15000:2b7f8306", "lbtru", 15000, 0, 1, 7_000, None),
    message("lbttcp:10.0.0.1:16000", "lbttcp", 16000, 0, 1, 8_000, "t.topic"),
], DATA_SCHEMA)


def test_session_side_follows_spark_key_rules(spark: Any) -> None:
    """A null packet type is not the source's (its destination is the session), a header
    without its NAK port leaves the port out of the key (``concat_ws``), and a session ID
    wider than 32 bits keeps eight hex digits (``lpad`` cuts)."""
    ours = with_session_side(frame(PACKETS))
    by_pos = dict(zip(ours["pos"].tolist(), ours["session"].tolist(), strict=True))
    assert by_pos[30] == by_pos[10] == by_pos[40] == RM_SESSION
    assert by_pos[60] == RM_SESSION
    assert ours.loc[ours["pos"] == 60, "from_source"].isna().all()
    assert by_pos[70] == "lbtrm:10.0.0.1:10000000"
    assert by_pos[81] == "lbtru:10.0.0.1:15000:2b7f8306"
    assert_same(ours, spark_twin(spark, "with_session_side", PACKETS), columns_in_order=True)
    key = transport_session_key(pa.array([None], pa.string()), pa.array([None], pa.string()),
                                pa.array([None], pa.int32()), pa.array([-1], pa.int64()))
    assert key.to_pylist() == [":ffffffff"]


def test_transport_sessions_edge_cases(spark: Any) -> None:
    ours = transport_sessions(frame(PACKETS), frame(DATA))
    rows = {r["session"]: r for r in ours.to_dict("records")}
    rm = rows[RM_SESSION]
    # the bounced NAK is not a NAK sent, and not part of the span
    assert (rm["nak_packets"], rm["naks_to_closed_port"], rm["nak_sqns"]) == (1, 1, 2)
    assert (rm["first_ts_ns"], rm["last_ts_ns"]) == (1_000, 5_000)
    # new data: 2 packets (one without a length: no bytes), RX: 1
    assert (rm["data_packets"], rm["data_bytes"], rm["rx_packets"]) == (2, 100, 1)
    assert (rm["data_src_port"], rm["mcast_group"]) == (40000, GROUP)   # first by pos
    assert (rm["messages"], rm["topics"], rm["topic_names"]) == (4, 3, "a.topic, b.topic")
    ru = rows["lbtru:10.0.0.1:15000:2b7f8306"]
    assert ru["duration_s"] == 0 and pd.isna(ru["data_packets_per_s"])
    assert (ru["nak_packets"], ru["nak_sqns"], ru["topic_names"]) == (1, 0, "")
    tcp = rows["lbttcp:10.0.0.1:16000"]
    assert (tcp["data_packets"], tcp["rx_packets"], tcp["rx_bytes"], tcp["peers"]) == \
        (1, 1, 50, 1)
    assert rows["lbtrm:10.0.0.1:10000000"]["messages"] == 0
    assert_same(ours, spark_twin(spark, "transport_sessions", PACKETS, DATA),
                columns_in_order=True)


def test_message_sends_take_the_first_new_copy(spark: Any) -> None:
    ours = message_sends(frame(DATA))
    first = ours[(ours["tidx"] == 0) & (ours["sqn"] == 1) & (ours["protocol"] == "lbtrm")]
    assert first[["send_ts_ns", "copies"]].values.tolist() == [[1_100, 2]]
    assert_same(ours, spark_twin(spark, "message_sends", DATA), columns_in_order=True)


ADVERT_SCHEMA = pa.schema([
    ("capture", pa.string()), ("pos", pa.int64()), ("record_index", pa.int32()),
    ("ts_ns", pa.int64()), ("src_ip", pa.string()), ("record", pa.string()),
    ("topic", pa.string()), ("pattern_type", pa.int32()), ("transport", pa.string()),
    ("source_ip", pa.string()), ("source_port", pa.int32()), ("session_id", pa.int64()),
    ("topic_index", pa.int64()), ("mcast_group", pa.string()), ("mcast_port", pa.int32()),
    ("topt_ume", pa.struct([("transport_idx", pa.int64())])),
    ("topt_ume_store", pa.list_(pa.struct([("store_ip_addr", pa.string())]))),
])


def advert(pos: int, record: str, topic: str | None, index: int = 0,
           **fields: Any) -> dict[str, Any]:
    return {"capture": "c", "pos": pos, "record_index": index, "ts_ns": pos * 10,
            "src_ip": fields.pop("src_ip", SRC), "record": record, "topic": topic, **fields}


def tir(pos: int, topic: str, index: int = 0, **fields: Any) -> dict[str, Any]:
    fields = {"transport": "lbtrm", "source_ip": SRC, "source_port": 14390,
              "session_id": SID, "topic_index": fields.pop("tidx", 0), **fields}
    return advert(pos, "tir", topic, index, **fields)


ADVERTS = pa.Table.from_pylist([
    tir(30, "a.b", mcast_group="239.9.9.9", mcast_port=1),
    tir(20, "a.b", 1, mcast_group=GROUP, mcast_port=2, topt_ume={"transport_idx": 7},
        topt_ume_store=[{"store_ip_addr": "10.0.0.5"}, {"store_ip_addr": "10.0.0.6"}]),
    tir(20, "a.b", 0, src_ip="10.0.0.2"),          # first in its packet: no group
    tir(25, "other", tidx=0, transport="tcp"),     # LBT-TCP: no session ID in the key
    tir(40, "a.c", tidx=1),
    tir(35, "x.restarted", tidx=1),                # the first advertised wins for index 1
    advert(50, "tqr", "a.b"), advert(51, "tqr", "a.b", src_ip=RCV),
    advert(52, "tqr", "zzz"), advert(53, "tqr", None),
    advert(54, "wc_tqr", r"^a\.", pattern_type=1), advert(55, "wc_tqr", "(", pattern_type=1),
    advert(56, "wc_tqr", r"^a\.", pattern_type=2),
], ADVERT_SCHEMA)


def test_topics_edge_cases(spark: Any) -> None:
    ads = topic_advertisements(frame(ADVERTS))
    ab = ads[(ads["topic"] == "a.b")].to_dict("records")
    assert len(ab) == 1
    assert (ab[0]["tirs"], ab[0]["senders"], ab[0]["mcast_group"], ab[0]["mcast_port"],
            ab[0]["persistent"], ab[0]["stores"], ab[0]["ume_transport_idx"]) == \
        (3, 2, GROUP, 2, True, 2, 7)
    assert ads.loc[ads["topic"] == "other", "session"].tolist() == ["lbttcp:10.0.0.1:14390"]
    assert_same(ads, spark_twin(spark, "topic_advertisements", ADVERTS), columns_in_order=True)

    named = advertised_topics(frame(ADVERTS))
    assert named.loc[named["tidx"] == 1, "advertised_topic"].tolist() == ["x.restarted"]
    assert_same(named, spark_twin(spark, "advertised_topics", ADVERTS))

    queries = topic_queries(frame(ADVERTS))
    got = {(r["record"], r["topic"], r["pattern_type"]):
           (r["queries"], r["queriers"], r["matching_topics"], r["answered"])
           for r in queries.to_dict("records")}
    assert got[("tqr", "a.b", None)] == (2, 2, 1, True)
    assert got[("tqr", "zzz", None)] == (1, 1, 0, False)
    assert got[("tqr", None, None)] == (1, 1, 0, False)
    assert got[("wc_tqr", r"^a\.", 1)] == got[("wc_tqr", r"^a\.", 2)] == (1, 1, 2, True)
    assert got[("wc_tqr", "(", 1)] == (1, 1, 0, False)
    assert_same(queries, spark_twin(spark, "topic_queries", ADVERTS), columns_in_order=True)


def test_wildcard_matches_searches_anywhere() -> None:
    assert wildcard_matches("b\\.c", "a.b.c")
    assert not wildcard_matches("^b", "a.b")
    assert not wildcard_matches("(", "(")
