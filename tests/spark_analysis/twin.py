"""The analyses of ``ump analyze`` in Spark SQL: the Spark DataFrame twins of
:mod:`spark_analysis.engine`, kept as the independent oracle the engine's tests compare with.

``ump analyze`` ran these until the analyses moved to the engine (issue 19: 145 Spark jobs of
small stages made a 1,000,000-frame run 50 s long; the engine does the same in seconds, one
Spark task per capture).  Every engine function must give what its twin here gives on the same
inputs (``tests/spark_analysis/test_engine_*.py``, through
:mod:`tests.spark_analysis.engine_oracle`): two implementations written apart, one in
Spark's SQL semantics (nulls, joins, windows, ``min_by``, ``percentile``), one in numpy and
Arrow, agreeing on the corpus, is the check that the port kept every rule.  Change a rule in
both, or the tests say which one moved.

What every source, receiver and store did: the analyses of ``ump analyze`` as DataFrames.

Each public function takes DataFrames and returns one DataFrame; its docstring says which
question it answers.  They read the decoded tables of :mod:`spark_analysis.decode` (column
meanings in :mod:`spark_analysis.columnar`) after :func:`prepare` has added two columns:

``capture``
    which capture set a row belongs to.  By default every file given is one capture (files of
    a rotated capture, ``tcpdump -C``); with ``per_file`` each file is analysed on its own.
    Every result is keyed by it first, so one Spark job analyses many captures at once.
``pos``
    the frame's position in capture order: files in natural name order (``x2`` before
    ``x10``), then byte offset.  Sequence analysis follows capture order, as tshark does, not
    timestamps (which may step back).

Messages are tied to what they answer by time and place, never by guessing sessions: an ACK
to the latest send of its message at or before it (a restarted source reusing sequence
numbers stays apart), a registration response to the oldest pending request on its
connection (first come, first served), a retransmission request to the first retransmission
after it.  The transport-level sequence verdicts reproduce tshark's own LBT-RM/LBT-RU
analysis, so both tools flag the same frames.

Conventions: ``*_ts_ns`` are capture timestamps (ns since the epoch); ``*_us`` durations in
microseconds; ``*_per_s`` rates over the stream's own first-to-last span; ``session`` is a
printable transport session key ``protocol:ip:port:sessionid`` (``lbttcp:ip:port`` for TCP,
whose session ID is not on every segment).

Where the capture cannot tell what a deployment's configuration was, the choice is an explicit
option (:class:`AnalysisOptions`): stability needs a quorum of the stores a source registered
with unless told otherwise (UM's default intragroup behaviour).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark_analysis.engine.inputs import FILE_SHIFT, natural_order
from spark_analysis.engine.inputs import OPTIONAL_PACKET_COLUMNS as _OPTIONAL_PACKET_COLUMNS
from spark_analysis.engine.inputs import PACKET_COLUMNS as _PACKET_COLUMNS
from spark_analysis.engine.inputs import WIDE_MESSAGE_COLUMNS as _MESSAGE_COLUMNS
from spark_analysis.engine.options import PERCENTILES, AnalysisOptions
from spark_analysis.engine.registrations import PREG_ERROR_TEXT
from spark_analysis.engine.run import DETAIL_OUTPUTS, SORT_KEYS
from spark_analysis.engine.topics import wildcard_matches
from wire.lbmc import AckType
from wire.lbtru import NCF_REASON_TEXT

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "ANOMALY_COLUMNS",
    "DETAIL_OUTPUTS",
    "PREG_ERROR_TEXT",
    "SORT_KEYS",
    "AnalysisOptions",
    "AnalysisRun",
    "CaptureTables",
    "advertised_topics",
    "analyze",
    "anomalies",
    "anomaly_summary",
    "consumption_acks",
    "data_messages",
    "flight_events",
    "flight_size",
    "flight_size_summary",
    "latency_histogram",
    "latency_summary",
    "message_sends",
    "natural_order",
    "prepare",
    "registration_summary",
    "registrations",
    "retransmission_requests",
    "retransmission_summary",
    "sequence_events",
    "sequence_flags",
    "sequence_summary",
    "stability_acks",
    "stable_times",
    "topic_advertisements",
    "topic_queries",
    "transport_sessions",
    "wildcard_matches",
    "with_session_side",
]

# =============================================================================================
# Preparation
# =============================================================================================


@dataclass
class CaptureTables:
    """The decoded tables with ``capture`` and ``pos`` added (see the module docstring)."""

    packets: DataFrame
    messages: DataFrame
    advertisements: DataFrame


def prepare(packets: DataFrame, messages: DataFrame, advertisements: DataFrame, *,
            files: Sequence[str], per_file: bool = False) -> CaptureTables:
    """Add ``capture`` and ``pos`` to the decoded tables.

    Args:
        files: every capture file name as it appears in the ``file`` column; their natural
            order is the capture order of a multi-file capture.
        per_file: each file is its own capture (``capture`` = file name), else all are one
            (``capture`` = ``"all"``).
    """
    ordered = natural_order(files)
    spark = packets.sparkSession
    ranks = F.broadcast(spark.createDataFrame(
        [(name, index) for index, name in enumerate(ordered)],
        "file string, file_rank long"))

    def add(df: DataFrame) -> DataFrame:
        out = df.join(ranks, "file", "left")
        return (out.withColumn("capture", F.col("file") if per_file else F.lit("all"))
                .withColumn("pos", F.shiftleft(F.coalesce(F.col("file_rank"), F.lit(0)),
                                               FILE_SHIFT) + F.col("file_offset"))
                .drop("file_rank"))

    return CaptureTables(add(packets), add(messages), add(advertisements))


def _session_key(protocol: Column, ip: Column, port: Column, session_id: Column) -> Column:
    """``lbtrm:10.0.0.1:14390:2b7f8306`` (the sidecar's and tshark's way to name a session)."""
    hex_id = F.lower(F.lpad(F.hex(session_id), 8, "0"))
    base = F.concat_ws(":", protocol, ip, port.cast("string"))
    return F.when(session_id.isNull(), base).otherwise(F.concat_ws(":", base, hex_id))


ICMP_DEST_UNREACHABLE, ICMP_PORT_UNREACHABLE = 3, 3


def _quoted(packets: DataFrame) -> Column:
    """Whether a packet row is a datagram quoted by an ICMP error (``icmp_type`` set; its
    addresses and ports are the quoted datagram's): the bounce of something sent earlier,
    never traffic of its own (false when the decode has no such column)."""
    if "icmp_type" in packets.columns:
        return F.col("icmp_type").isNotNull()
    return F.lit(False)


def _closed_port(packets: DataFrame) -> Column:
    """Whether a packet row is a datagram an ICMP port-unreachable error quotes: it reached
    the host, and nothing listened on its destination port."""
    if "icmp_type" in packets.columns and "icmp_code" in packets.columns:
        return F.coalesce((F.col("icmp_type") == ICMP_DEST_UNREACHABLE)
                          & (F.col("icmp_code") == ICMP_PORT_UNREACHABLE), F.lit(False))
    return F.lit(False)


_SOURCE_SIDE = ("data", "sm", "ncf", "rst")
"""UDP packet types a transport source sends (the others come from receivers)."""


def with_session_side(packets: DataFrame) -> DataFrame:
    """LBT-RM / LBT-RU packets with the transport session they belong to, as tshark keys it.

    Adds ``source_ip``/``source_port`` (the session's address and port), ``from_source``
    and ``session`` (:func:`_session_key`).  LBT-RM (``packet-lbtrm.c``): a session is the
    source address, the unicast NAK port named in every header (``lbtrm.hdr.ucast_port``)
    and the session ID.  Real sources send DATA, SM and NCF from an ephemeral UDP port and
    take NAKs on that NAK port, so the UDP source port names nothing: DATA/SM/NCF belong to
    (source address, header port, session ID), a NAK to (its destination address, header
    port, session ID).  LBT-RU: the source side's address and UDP port (its source port for
    what the source sends, its destination port for what receivers send) and the SID.  A NAK
    seen before any packet of its session still belongs to it (tshark finds no transport for
    such a NAK; the key is the same either way).
    """
    from_source = F.col("packet_type").isin(*_SOURCE_SIDE)
    rm = F.col("protocol") == "lbtrm"
    source_ip = F.when(from_source, F.col("src_ip")).otherwise(F.col("dst_ip"))
    source_port = F.when(rm, F.col("ucast_port")).when(from_source, F.col("src_port")) \
        .otherwise(F.col("dst_port"))
    return (packets.withColumn("from_source", from_source)
            .withColumn("source_ip", source_ip)
            .withColumn("source_port", source_port)
            .withColumn("session", _session_key(F.col("protocol"), F.col("source_ip"),
                                                F.col("source_port"), F.col("session_id"))))


def _distinct_count(*columns: str | Column) -> Column:
    """``countDistinct(*columns)`` (rows with a null in any of them not counted), as the size
    of the set of values.  Spark plans a distinct count as an aggregation over the grouping
    keys and the counted column, merged again per key, and two or more of them (or one beside
    a percentile) by copying every row once per distinct aggregate (``Expand``); a set is one
    hash aggregation like the others.  The sets here are small (peers, stores, hosts, topics
    of one group)."""
    cols = [F.col(c) if isinstance(c, str) else c for c in columns]
    value = cols[0]
    if len(cols) > 1:
        present = cols[0].isNotNull()
        for col in cols[1:]:
            present = present & col.isNotNull()
        value = F.when(present, F.struct(*cols))
    return F.size(F.collect_set(value)).cast("long")


def _span_seconds(first: Column, last: Column) -> Column:
    return (last - first) / F.lit(1e9)


def _rate(count: Column, seconds: Column) -> Column:
    return F.when(seconds > 0, count / seconds)


def _us(later: Column, earlier: Column) -> Column:
    return (later - earlier) / F.lit(1000.0)


# =============================================================================================
# Topic resolution
# =============================================================================================


def topic_advertisements(advertisements: DataFrame) -> DataFrame:
    """Which topics were advertised, by which source, over which transport, how often?

    One row per (topic, transport, source address and port, session ID, topic index) seen in
    TIRs.  A TIR relayed by a unicast resolver (lbmrd) to every client counts once per copy on
    the wire (``tirs``); ``senders`` are the hosts that sent those copies.  ``persistent`` says
    the TIR carried the UME option (the source uses stores); ``stores`` is the largest store
    list advertised, ``ume_transport_idx`` the transport index of the UME option.
    """
    tirs = advertisements.where(F.col("record") == "tir")
    return (tirs.groupBy("capture", "topic", "transport", "source_ip", "source_port",
                         "session_id", "topic_index")
            .agg(F.count("*").alias("tirs"),
                 _distinct_count("src_ip").alias("senders"),
                 F.min("ts_ns").alias("first_ts_ns"),
                 F.max("ts_ns").alias("last_ts_ns"),
                 F.first("mcast_group", ignorenulls=True).alias("mcast_group"),
                 F.first("mcast_port", ignorenulls=True).alias("mcast_port"),
                 F.max(F.col("topt_ume").isNotNull()).alias("persistent"),
                 F.max(F.coalesce(F.size("topt_ume_store"), F.lit(0))).alias("stores"),
                 F.first("topt_ume.transport_idx", ignorenulls=True).alias("ume_transport_idx"))
            .withColumn("session", _advertised_session(tirs)))


def topic_queries(advertisements: DataFrame) -> DataFrame:
    """Which topics (and wildcard patterns) did receivers ask for, and how often?

    One row per queried topic or pattern: ``queries`` records on the wire, ``queriers`` the
    distinct hosts that sent them, ``matching_topics`` how many advertised topics answer it
    and whether any does (``answered``: a topic queried but never advertised has no source
    in the capture).  A TQR is answered by TIRs of its topic; a wildcard TQR by TIRs of every
    topic its pattern matches (UM matches receiver patterns, PCRE or POSIX regex, anywhere
    in the topic name: :func:`wildcard_matches`).
    """
    queries = advertisements.where(F.col("record").isin("tqr", "wc_tqr"))
    topics = (advertisements.where(F.col("record") == "tir")
              .select("capture", "topic").distinct())
    exact = (queries.where(F.col("record") == "tqr").select("capture", "record", "topic")
             .distinct().join(topics, ["capture", "topic"])
             .groupBy("capture", "record", "topic").agg(F.count("*").alias("_matching")))
    matched = exact.unionByName(_wildcard_answers(advertisements))
    return (queries.groupBy("capture", "record", "topic", "pattern_type")
            .agg(F.count("*").alias("queries"),
                 _distinct_count("src_ip").alias("queriers"),
                 F.min("ts_ns").alias("first_ts_ns"),
                 F.max("ts_ns").alias("last_ts_ns"))
            .join(matched, ["capture", "record", "topic"], "left")
            .withColumn("matching_topics", F.coalesce(F.col("_matching"), F.lit(0)))
            .withColumn("answered", F.col("matching_topics") > 0)
            .drop("_matching"))


def _wildcard_answers(advertisements: DataFrame) -> DataFrame:
    """``(capture, record, topic, _matching)`` per wildcard pattern: how many advertised
    topics of its capture it matches.  Patterns and topic names are few (one row per
    distinct name), so they come over in one small job and are matched in the driver with
    :func:`wildcard_matches`, where a pattern the JVM's regex dialect rejects cannot fail the
    job."""
    spark = advertisements.sparkSession
    schema = "capture string, record string, topic string, _matching long"
    names = (advertisements.where(F.col("record").isin("tir", "wc_tqr")
                                  & F.col("topic").isNotNull())
             .select("capture", "record", "topic").distinct().collect())
    topics: dict[str, list[str]] = {}
    for row in names:
        if row["record"] == "tir":
            topics.setdefault(row["capture"], []).append(row["topic"])
    rows = [(row["capture"], "wc_tqr", row["topic"],
             sum(wildcard_matches(row["topic"], name) for name in topics.get(row["capture"], [])))
            for row in names if row["record"] == "wc_tqr"]
    return spark.createDataFrame(rows, schema)


# =============================================================================================
# Data messages and when they were sent
# =============================================================================================


def data_messages(packets: DataFrame, messages: DataFrame,
                  advertisements: DataFrame | None = None) -> DataFrame:
    """Every topic message on the wire (new, retransmitted, proactively retransmitted).

    ``rx`` marks copies carried by a UDP retransmission (the LBT-RM/LBT-RU RX flag, a packet
    property, hence the join with ``packets``); store retransmissions and proactive
    retransmissions are told apart by ``message_type`` (``retrans``,
    ``proactive_retrans``).  ``session`` names the sending transport session and
    ``source_port`` its port as tshark keys it (LBT-RM: the unicast NAK port of the DATA
    header, not the UDP source port, which real sources take from the ephemeral range; see
    :func:`with_session_side`).  ``topic`` is the message's own topic name header or else the
    topic the TIRs of ``advertisements`` name for its transport session and topic index
    (:func:`advertised_topics`).
    """
    udp_data = (packets.where((F.col("packet_type") == "data")
                              & F.col("protocol").isin("lbtrm", "lbtru"))
                .select("file", "file_offset", _quoted(packets).alias("_quoted"),
                        F.coalesce(F.col("retransmission"), F.lit(False)).alias("_rx"),
                        F.when(F.col("protocol") == "lbtrm", F.col("ucast_port"))
                        .alias("_ucast_port")))
    data = messages.where(F.col("message_type").isin("data", "retrans", "proactive_retrans")
                          & F.col("sqn").isNotNull() & F.col("tidx").isNotNull())
    out = (data.select("capture", "pos", "msg_index", "file", "file_offset", "ts_ns",
                       "protocol", "src_ip", "src_port", "dst_ip", "dst_port", "session_id",
                       "transport_sqn", "message_type", "label", "tidx", "sqn", "topic_name",
                       "payload_length")
           .join(udp_data, ["file", "file_offset"], "left")
           .where(~F.coalesce(F.col("_quoted"), F.lit(False)))
           .withColumn("rx", F.coalesce(F.col("_rx"), F.lit(False)))
           .withColumn("source_port", F.coalesce(F.col("_ucast_port"), F.col("src_port")))
           .drop("_rx", "_ucast_port", "_quoted")
           .withColumn("session", _session_key(
               F.col("protocol"), F.col("src_ip"), F.col("source_port"),
               F.when(F.col("protocol") != "lbttcp", F.col("session_id")))))
    if advertisements is None:
        return out.withColumn("topic", F.col("topic_name"))
    named = advertised_topics(advertisements)
    return (out.join(F.broadcast(named), ["capture", "session", "tidx"], "left")
            .withColumn("topic", F.coalesce(F.col("topic_name"), F.col("advertised_topic")))
            .drop("advertised_topic"))


def advertised_topics(advertisements: DataFrame) -> DataFrame:
    """Which topic each (transport session, topic index) carries, by the TIRs.

    A TIR names its transport by source address, port (LBT-RM: ``src_ucast_port``, the NAK
    port the DATA header carries too) and session ID, and its topic by the topic index the
    data messages carry (``lbmr.tir.index``): that is the join of topic names to data.  One
    row per ``(capture, session, tidx)``; should two TIRs name different topics for one
    index (a source restarted with the same session ID), the first advertised wins.
    """
    tirs = advertisements.where((F.col("record") == "tir") & F.col("topic_index").isNotNull()
                                & F.col("source_ip").isNotNull())
    return (tirs.withColumn("session", _advertised_session(tirs))
            .groupBy("capture", "session", F.col("topic_index").alias("tidx"))
            .agg(F.min_by("topic", F.struct("pos", "record_index")).alias("advertised_topic")))


def _advertised_session(tirs: DataFrame) -> Column:
    """The session key (:func:`_session_key`) of the transport a TIR names: TIR transport
    ``tcp`` is LBT-TCP, whose data rows have no session ID (it is not on every segment)."""
    protocol = F.when(F.col("transport") == "tcp", F.lit("lbttcp")).otherwise(F.col("transport"))
    return _session_key(protocol, F.col("source_ip"), F.col("source_port"),
                        F.when(protocol != "lbttcp", F.col("session_id")))


def _new_data(data: DataFrame) -> Column:
    """A first transmission on a transport: type MESSAGE on a transport channel, not RX."""
    return (F.col("message_type") == "data") & (F.col("label") == "DATA") & ~F.col("rx")


def message_sends(data: DataFrame) -> DataFrame:
    """When was each topic message first put on the wire?

    One row per (transport session, topic index, sequence number): the earliest new-data copy
    (LBT-RU and LBT-TCP send one copy per receiver and store; the first is the send).
    """
    return (data.where(_new_data(data))
            .groupBy("capture", "session", "protocol", F.col("src_ip").alias("source_ip"),
                     "source_port", "tidx", "sqn")
            .agg(F.min("ts_ns").alias("send_ts_ns"), F.count("*").alias("copies")))


# =============================================================================================
# Transport sessions
# =============================================================================================

def transport_sessions(packets: DataFrame, data: DataFrame) -> DataFrame:
    """Per transport session: data, retransmission, NAK, NCF and SM counts and rates.

    What Wireshark's (GUI-only) LBT-RM and LBT-RU transport dialogs show, for every session:
    packets and payload bytes of new data and of retransmissions (RX), session messages,
    NAK packets and the sequence numbers they NAK, NCF packets and the sequence numbers they
    confirm, connection requests/ACKs/resets (LBT-RU), the peers seen (LBT-RU receivers, LBT-RM
    NAKers, LBT-TCP connections), new topic ``messages``, and per-second rates over the
    session's span.  Sessions are keyed as tshark keys them (:func:`with_session_side`: for
    LBT-RM the source address, the NAK port of the header and the session ID, so data sent
    from an ephemeral port and the NAKs to the NAK port make one row); packets a receiver
    sends (NAK, ACK, CREQ) belong to the session they are addressed to.  ``data_src_port`` is
    the UDP port the data left from; ``topic_names`` the topics of its new messages (named
    by the TIRs, :func:`advertised_topics`).  NAKs that come back quoted in an ICMP error
    (the session's NAK port is closed: the source is gone) are not NAKs sent: they are
    counted apart, in ``naks_to_closed_port``, and the session's span is that of its own
    traffic.  LBT-TCP sessions are the TCP endpoints that
    send new data; RX there counts TCP retransmissions.
    """
    udp = with_session_side(packets.where(F.col("protocol").isin("lbtrm", "lbtru")))
    udp = (udp.withColumn("_live", ~_quoted(udp))
           .withColumn("peer", F.when(F.col("_live") & (
               ~F.col("from_source") | (F.col("protocol") == "lbtru")),
               F.when(F.col("from_source"), F.concat_ws(":", "dst_ip", "dst_port"))
               .otherwise(F.concat_ws(":", "src_ip", "src_port")))))
    live = F.col("_live")
    bounced = _closed_port(udp) & (F.col("packet_type") == "nak")
    is_data = (F.col("packet_type") == "data") & live
    rx = is_data & F.coalesce(F.col("retransmission"), F.lit(False))
    new = is_data & ~rx

    def count(cond: Column) -> Column:
        return F.sum(F.when(cond, 1).otherwise(0))

    def total(cond: Column, value: Column) -> Column:
        return F.sum(F.when(cond, value).otherwise(0))

    udp_sessions = (udp.groupBy("capture", "protocol", "source_ip", "source_port", "session_id")
                    .agg(count(new).alias("data_packets"),
                         total(new, F.col("payload_length")).alias("data_bytes"),
                         count(rx).alias("rx_packets"),
                         total(rx, F.col("payload_length")).alias("rx_bytes"),
                         count(live & (F.col("packet_type") == "sm")).alias("sm_packets"),
                         count(live & (F.col("packet_type") == "nak")).alias("nak_packets"),
                         total(live & (F.col("packet_type") == "nak"),
                               F.size("nak_sqns")).alias("nak_sqns"),
                         count(live & (F.col("packet_type") == "ncf")).alias("ncf_packets"),
                         total(live & (F.col("packet_type") == "ncf"),
                               F.size("ncf_sqns")).alias("ncf_sqns"),
                         count(live & (F.col("packet_type") == "creq")).alias("creq_packets"),
                         count(live & (F.col("packet_type") == "ack")).alias("ack_packets"),
                         count(live & (F.col("packet_type") == "rst")).alias("rst_packets"),
                         _distinct_count("peer").alias("peers"),
                         F.min(F.when(is_data, F.col("src_port"))).alias("data_src_port"),
                         F.first(F.when(is_data & (F.col("protocol") == "lbtrm"),
                                        F.col("dst_ip")), ignorenulls=True).alias("mcast_group"),
                         count(bounced).alias("naks_to_closed_port"),
                         F.min(F.when(live, F.col("ts_ns"))).alias("first_ts_ns"),
                         F.max(F.when(live, F.col("ts_ns"))).alias("last_ts_ns")))

    tcp_sources = (data.where(_new_data(data) & (F.col("protocol") == "lbttcp"))
                   .select("capture", F.col("src_ip").alias("source_ip"),
                           F.col("src_port").alias("source_port")).distinct())
    tcp = (packets.where(F.col("protocol") == "lbttcp")
           .join(F.broadcast(tcp_sources.withColumnRenamed("source_ip", "src_ip")
                             .withColumnRenamed("source_port", "src_port")),
                 ["capture", "src_ip", "src_port"])
           .withColumn("tcp_rx", F.coalesce(F.col("retransmission"), F.lit(False))))
    tcp_sessions = (tcp.groupBy("capture", "protocol", F.col("src_ip").alias("source_ip"),
                                F.col("src_port").alias("source_port"))
                    .agg(count(~F.col("tcp_rx")).alias("data_packets"),
                         total(~F.col("tcp_rx"), F.col("payload_length")).alias("data_bytes"),
                         count(F.col("tcp_rx")).alias("rx_packets"),
                         total(F.col("tcp_rx"), F.col("payload_length")).alias("rx_bytes"),
                         _distinct_count(F.concat_ws(":", "dst_ip", "dst_port")).alias("peers"),
                         F.min("ts_ns").alias("first_ts_ns"),
                         F.max("ts_ns").alias("last_ts_ns"))
                    .withColumn("session_id", F.lit(None).cast("long")))

    new_messages = (data.where(_new_data(data))
                    .groupBy("capture", "session")
                    .agg(F.count("*").alias("messages"),
                         _distinct_count("tidx").alias("topics"),
                         F.array_join(F.array_sort(F.collect_set("topic")), ", ")
                         .alias("topic_names")))
    out = (udp_sessions.unionByName(tcp_sessions, allowMissingColumns=True)
           .withColumn("session", _session_key(F.col("protocol"), F.col("source_ip"),
                                               F.col("source_port"), F.col("session_id")))
           .join(new_messages, ["capture", "session"], "left")
           .fillna(0, subset=["messages", "topics", "data_packets", "data_bytes", "rx_packets",
                              "rx_bytes", "sm_packets", "nak_packets", "nak_sqns",
                              "ncf_packets", "ncf_sqns", "creq_packets", "ack_packets",
                              "rst_packets", "peers", "naks_to_closed_port"])
           .withColumn("duration_s", _span_seconds(F.col("first_ts_ns"), F.col("last_ts_ns"))))
    for name in ("data_packets", "rx_packets", "nak_packets", "ncf_packets", "sm_packets",
                 "messages", "data_bytes"):
        out = out.withColumn(f"{name}_per_s", _rate(F.col(name), F.col("duration_s")))
    return out


# =============================================================================================
# Sequence gaps, duplicates, out of order
# =============================================================================================

_STREAM = ["capture", "level", "protocol", "source_ip", "source_port", "session_id",
           "dest_ip", "dest_port", "tidx"]


def sequence_flags(packets: DataFrame, data: DataFrame) -> DataFrame:
    """Every sequenced item with its gap / out-of-order / duplicate verdict
    (:func:`_judged_items` without its working column)."""
    return _judged_items(packets, data).drop("seen")


def _judged_items(packets: DataFrame, data: DataFrame) -> DataFrame:
    """Every sequenced item with its gap / out-of-order / duplicate verdict.

    Three levels, each a set of streams walked in capture order:

    ``transport-data`` / ``transport-sm``
        LBT-RM and LBT-RU DATA and SM transport sequence numbers, per stream as tshark keys
        them (LBT-RM: source address, the header's NAK port (``source_port``, not the UDP
        port: see :func:`with_session_side`), session ID, group and port; LBT-RU: per
        receiver),
        judged exactly like tshark's transport analysis (``lbtrm.transport.data_sqn_gap``,
        ``..._ooo_gap``, ``..._duplicate``, and the same for ``lbtru.analysis``): the first
        item of a stream is not judged; RX data is never judged but counts as seen; an item at
        or below the high-water mark of new items (0 at the start) is out of order by
        ``high - sqn`` (unless equal) and a duplicate if its number was seen before; one above
        ``high + 1`` opens a gap.  tshark measures a *data* gap from the previous data item,
        RX included, and an SM gap from the high-water mark; both are reproduced.
    ``topic``
        topic sequence numbers of new data messages per transport stream and topic index
        (one stream per LBT-RU receiver and LBT-TCP connection), by the same rules, the gap
        measured from the high-water mark (the number of sequence numbers skipped).

    ``seen`` (whether the item's number came earlier in its stream) stays: each number's
    first item is the one not seen, so :func:`sequence_summary` counts the distinct numbers
    from it instead of a distinct aggregation (a shuffle of every item by number).
    """
    udp = packets.where(F.col("protocol").isin("lbtrm", "lbtru") & ~_quoted(packets)
                        & F.col("packet_type").isin("data", "sm") & F.col("sqn").isNotNull())
    transport = udp.select(
        "capture", "pos", F.lit(0).alias("msg_index"), "file", "file_offset", "ts_ns",
        F.concat(F.lit("transport-"), F.col("packet_type")).alias("level"), "protocol",
        F.col("src_ip").alias("source_ip"),
        F.when(F.col("protocol") == "lbtrm", F.col("ucast_port")).otherwise(F.col("src_port"))
        .alias("source_port"),
        "session_id", F.col("dst_ip").alias("dest_ip"), F.col("dst_port").alias("dest_port"),
        F.lit(None).cast("long").alias("tidx"), "sqn",
        ((F.col("packet_type") == "data")
         & F.coalesce(F.col("retransmission"), F.lit(False))).alias("rx"))
    topic = data.where((F.col("message_type") == "data") & (F.col("label") == "DATA")).select(
        "capture", "pos", "msg_index", "file", "file_offset", "ts_ns",
        F.lit("topic").alias("level"), "protocol", F.col("src_ip").alias("source_ip"),
        "source_port",
        F.when(F.col("protocol") != "lbttcp", F.col("session_id")).alias("session_id"),
        F.col("dst_ip").alias("dest_ip"), F.col("dst_port").alias("dest_port"), "tidx",
        "sqn", "rx")
    items = transport.unionByName(topic)
    order = Window.partitionBy(*_STREAM).orderBy("pos", "msg_index")
    before = order.rowsBetween(Window.unboundedPreceding, -1)
    # the same stream partitions in number order: an item whose predecessor there has its
    # number is not its number's first.  (A window per stream and number, as before, needs
    # a shuffle of every item of its own; this one only sorts the stream's rows again.)
    by_sqn = Window.partitionBy(*_STREAM).orderBy("sqn", "pos", "msg_index")
    items = (items
             .withColumn("high", F.coalesce(F.max(F.when(~F.col("rx"), F.col("sqn")))
                                            .over(before), F.lit(0)))
             .withColumn("previous", F.lag("sqn").over(order))
             .withColumn("seen", F.coalesce(F.lag("sqn").over(by_sqn) == F.col("sqn"),
                                            F.lit(False))))
    judged = F.col("previous").isNotNull() & ~F.col("rx")
    low = judged & (F.col("sqn") <= F.col("high"))
    gap_from_previous = F.col("level") == "transport-data"
    return (items
            .withColumn("duplicate", low & F.col("seen"))
            .withColumn("ooo_gap", F.when(low & (F.col("sqn") != F.col("high")),
                                          F.col("high") - F.col("sqn")).otherwise(0))
            .withColumn("sqn_gap", F.when(
                judged & (F.col("sqn") > F.col("high") + 1),
                F.when(gap_from_previous, F.col("sqn") - (F.col("previous") + 1))
                .otherwise(F.col("sqn") - (F.col("high") + 1))).otherwise(0))
            .drop("high", "previous"))


def sequence_summary(flags: DataFrame) -> DataFrame:
    """Per sequenced stream: items, retransmissions, gaps, out-of-order and duplicates.

    ``gaps``/``gap_sqns``: gap events and the sequence numbers they skipped;
    ``out_of_order``: items below the high-water mark; ``duplicates``: items already seen;
    ``missing``: numbers between the first and highest item never seen in any copy (what
    still lacks after retransmissions).
    """
    def count(cond: Column) -> Column:
        return F.sum(F.when(cond, 1).otherwise(0))

    # flags from _judged_items say which items repeat a number (see there)
    distinct = (F.count(F.when(~F.col("seen"), F.lit(1))) if "seen" in flags.columns
                else F.countDistinct("sqn")).alias("distinct_sqns")
    return (flags.groupBy(*_STREAM)
            .agg(F.count("*").alias("items"),
                 count(F.col("rx")).alias("retransmissions"),
                 F.min_by("sqn", F.struct("pos", "msg_index")).alias("first_sqn"),
                 F.max("sqn").alias("high_sqn"),
                 distinct,
                 F.min("sqn").alias("low_sqn"),
                 count(F.col("sqn_gap") > 0).alias("gaps"),
                 F.sum("sqn_gap").alias("gap_sqns"),
                 count(F.col("ooo_gap") > 0).alias("out_of_order"),
                 count(F.col("duplicate")).alias("duplicates"),
                 F.min("ts_ns").alias("first_ts_ns"),
                 F.max("ts_ns").alias("last_ts_ns"))
            .withColumn("missing", F.col("high_sqn") - F.col("low_sqn") + 1
                        - F.col("distinct_sqns"))
            .drop("low_sqn"))


def sequence_events(flags: DataFrame) -> DataFrame:
    """Where exactly: one row per gap, out-of-order item and duplicate (``size`` = sequence
    numbers skipped, distance below the high-water mark, or 1)."""
    events = F.filter(F.array(
        F.when(F.col("sqn_gap") > 0, F.struct(F.lit("gap").alias("event"),
                                              F.col("sqn_gap").alias("size"))),
        F.when(F.col("ooo_gap") > 0, F.struct(F.lit("out-of-order").alias("event"),
                                              F.col("ooo_gap").alias("size"))),
        F.when(F.col("duplicate"), F.struct(F.lit("duplicate").alias("event"),
                                            F.lit(1).cast("long").alias("size")))),
        lambda e: e.isNotNull())
    return (flags.where((F.col("sqn_gap") > 0) | (F.col("ooo_gap") > 0) | F.col("duplicate"))
            .select(*_STREAM, "ts_ns", "file", "file_offset", "pos", "msg_index", "sqn",
                    F.explode(events).alias("e"))
            .select("*", "e.event", "e.size").drop("e"))


# =============================================================================================
# Store registrations
# =============================================================================================

_REG_KEY = ["capture", "client_ip", "client_port", "store_ip", "store_port", "role",
            "transport_idx", "topic_idx"]
"""Where a PREG-RESP looks for its PREG.  Not the marker: whether a store echoes it is not
documented (the corpus generator does not)."""

_REQUEST_CONTENT = ["requested_reg_id", "src_reg_id", "session_id", "rpp", "deregister",
                    "request_topic"]
"""A request repeating these of a pending one is a retry: it replaces it."""

_PAIR_SCHEMA = "capture string, pos long, msg_index int, response_pos long, response_index int"


def _pair_registrations(events: pa.Table) -> pa.Table:
    """Pair the requests and responses of one connection/role/index key, first come first
    served.  The key alone cannot tell two requests apart (a receiver registering two
    sources' topics that share a transport and topic index), so responses answer pending
    requests in order; a request identical to a pending one is a retry and supersedes it (the
    older one stays unanswered).  (Arrow in, Arrow out: ``applyInArrow``, no pandas.)"""
    import pyarrow as pa

    order = sorted(range(events.num_rows), key=lambda i: (events["pos"][i].as_py(),
                                                          events["msg_index"][i].as_py()))
    columns = {name: events[name].to_pylist() for name in
               ("capture", "pos", "msg_index", "request", "content")}
    pending: dict[str, tuple[int, int]] = {}
    pairs: dict[str, list[Any]] = {"capture": [], "pos": [], "msg_index": [],
                                   "response_pos": [], "response_index": []}
    for i in order:
        pos, index = columns["pos"][i], columns["msg_index"][i]
        if columns["request"][i]:
            pending.pop(columns["content"][i], None)
            pending[columns["content"][i]] = (pos, index)
        elif pending:
            req_pos, req_index = pending.pop(next(iter(pending)))
            for name, value in (("capture", columns["capture"][i]), ("pos", req_pos),
                                ("msg_index", req_index), ("response_pos", pos),
                                ("response_index", index)):
                pairs[name].append(value)
    return pa.table({
        "capture": pa.array(pairs["capture"], pa.string()),
        "pos": pa.array(pairs["pos"], pa.int64()),
        "msg_index": pa.array(pairs["msg_index"], pa.int32()),
        "response_pos": pa.array(pairs["response_pos"], pa.int64()),
        "response_index": pa.array(pairs["response_index"], pa.int32())})


def _pair_by_key(events: pa.Table) -> pa.Table:
    """:func:`_pair_registrations` over every :data:`_REG_KEY` group of ``events`` (what
    ``groupBy(*_REG_KEY).applyInArrow`` does, in one process)."""
    import pyarrow as pa

    groups: dict[tuple[Any, ...], list[int]] = {}
    keys = zip(*(events.column(k).to_pylist() for k in _REG_KEY), strict=True)
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    parts = [_pair_registrations(events.take(pa.array(rows))) for rows in groups.values()]
    return (pa.concat_tables(parts) if parts
            else _pair_registrations(events.slice(0, 0)))


def _role(s_flag: Column) -> Column:
    return F.when(s_flag, "source").otherwise("receiver")


def registrations(messages: DataFrame, *, pair_on_driver: bool = False) -> DataFrame:
    """Who registered with which store, asking what, and what did the store answer? (timeline)

    One row per registration request (PREG), source or receiver, with its response
    (PREG-RESP) when the capture has it: the latest request on the same connection with the
    same role, transport index and topic index before the response.  Columns: the
    request (requested RegID, the source RegID a receiver names, UME session ID, RPP and
    deregister flags, the topic of a source's registration), the answer (``outcome`` granted,
    error or unanswered; granted RegID, error code and tshark's text, old-client, no-cache and
    RPP flags, the store's low/high sequence numbers, store ID) and the response time.
    ``source_ip``/``topic`` of a receiver's registration come from the source registration
    the store granted with the RegID the receiver names (``src_reg_id``).

    ``pair_on_driver`` pairs requests and responses in the driver process (the events come
    over as Arrow) instead of in ``applyInArrow`` tasks: for a small capture, starting the
    Python workers costs more than the pairing.  The result is the same.
    """
    preg = F.col("ume_preg")
    requests = messages.where(preg.isNotNull()).select(
        "capture", "pos", "msg_index", "ts_ns", "file", "file_offset",
        F.col("src_ip").alias("client_ip"), F.col("src_port").alias("client_port"),
        F.col("dst_ip").alias("store_ip"), F.col("dst_port").alias("store_port"),
        _role(preg["s_flag"]).alias("role"), preg["marker"].alias("marker"),
        preg["transport_idx"].alias("transport_idx"), preg["topic_idx"].alias("topic_idx"),
        preg["reg_id"].alias("requested_reg_id"), preg["src_reg_id"].alias("src_reg_id"),
        preg["w_flag"].alias("rpp"), preg["d_flag"].alias("deregister"),
        preg["p_flag"].alias("proxy"), F.col("topic_name").alias("request_topic"),
        F.col("ume_sid.sid").cast("string").alias("session_id"))
    resp = F.col("ume_preg_resp")
    responses = messages.where(resp.isNotNull()).select(
        "capture", F.col("pos").alias("response_pos"),
        F.col("msg_index").alias("response_index"), F.col("ts_ns").alias("response_ts_ns"),
        F.col("dst_ip").alias("client_ip"), F.col("dst_port").alias("client_port"),
        F.col("src_ip").alias("store_ip"), F.col("src_port").alias("store_port"),
        _role(resp["s_flag"]).alias("role"), resp["marker"].alias("response_marker"),
        resp["transport_idx"].alias("transport_idx"), resp["topic_idx"].alias("topic_idx"),
        resp["reg_id"].alias("response_reg_id"), resp["e_flag"].alias("error_flag"),
        resp["error_code"].alias("error_code"), resp["o_flag"].alias("old_client"),
        resp["n_flag"].alias("no_cache"), resp["w_flag"].alias("rpp_granted"),
        resp["low_seqnum"].alias("low_seqnum"), resp["high_seqnum"].alias("high_seqnum"),
        F.col("ume_storeid.store_id").alias("store_id"))
    events = (requests.select(*_REG_KEY, "pos", "msg_index", F.lit(True).alias("request"),
                              F.concat_ws("/", *[F.coalesce(F.col(c).cast("string"), F.lit(""))
                                                 for c in _REQUEST_CONTENT]).alias("content"))
              .unionByName(responses.select(*_REG_KEY, F.col("response_pos").alias("pos"),
                                            F.col("response_index").alias("msg_index"),
                                            F.lit(False).alias("request"),
                                            F.lit("").alias("content"))))
    if pair_on_driver:
        pairs = messages.sparkSession.createDataFrame(
            _pair_by_key(events.toArrow()).to_pandas(), _PAIR_SCHEMA)
    else:
        pairs = events.groupBy(*_REG_KEY).applyInArrow(_pair_registrations, _PAIR_SCHEMA)
    response_cols = [c for c in responses.columns if c not in _REG_KEY]
    matched = pairs.join(responses.select("capture", *response_cols),
                         ["capture", "response_pos", "response_index"])
    timeline = (requests.join(matched, ["capture", "pos", "msg_index"], "left")
                .withColumn("outcome", F.when(F.col("response_pos").isNull(), "unanswered")
                            .when(F.col("error_flag"), "error").otherwise("granted"))
                .withColumn("granted_reg_id", F.when(F.col("outcome") == "granted",
                                                     F.col("response_reg_id")))
                .withColumn("error", _preg_error_text(F.col("error_code")))
                .withColumn("response_us", _us(F.col("response_ts_ns"), F.col("ts_ns"))))
    sources = (timeline.where((F.col("role") == "source") & (F.col("outcome") == "granted"))
               .groupBy("capture", "store_ip", F.col("granted_reg_id").alias("src_reg_id"))
               .agg(F.min_by("client_ip", "pos").alias("named_source_ip"),
                    F.min_by("request_topic", "pos").alias("named_topic")))
    return (timeline.join(sources, ["capture", "store_ip", "src_reg_id"], "left")
            .withColumn("source_ip", F.when(F.col("role") == "source", F.col("client_ip"))
                        .otherwise(F.col("named_source_ip")))
            .withColumn("topic", F.when(F.col("role") == "source", F.col("request_topic"))
                        .otherwise(F.col("named_topic")))
            .select("capture", "ts_ns", "file", "file_offset", "pos", "msg_index", "role",
                    "client_ip", "client_port", "store_ip", "store_port", "source_ip",
                    "topic", "transport_idx", "topic_idx", "marker", "requested_reg_id",
                    "src_reg_id", "session_id", "rpp", "deregister", "proxy", "outcome",
                    "response_ts_ns", "response_us", "granted_reg_id", "error_code", "error",
                    "old_client", "no_cache", "rpp_granted", "low_seqnum", "high_seqnum",
                    "store_id", "response_marker", "response_pos", "response_index"))


def _preg_error_text(code: Column) -> Column:
    text: Column = F.lit(None).cast("string")
    for value, name in PREG_ERROR_TEXT.items():
        text = F.when(code == int(value), name).otherwise(text)
    return F.when(code.isNotNull(), F.coalesce(text, F.concat(F.lit("Unknown error "),
                                                              code.cast("string"))))


def registration_summary(regs: DataFrame) -> DataFrame:
    """How did registrations go, per role, store and outcome?

    ``requests``, distinct ``clients`` (hosts) and ``topics``, how many were granted to an old
    (returning) client, and response-time extremes."""
    return (regs.groupBy("capture", "role", "store_ip", "outcome", "error_code", "error")
            .agg(F.count("*").alias("requests"),
                 _distinct_count("client_ip").alias("clients"),
                 _distinct_count("transport_idx", "topic_idx", "source_ip").alias("topics"),
                 F.sum(F.when(F.col("old_client"), 1).otherwise(0)).alias("old_clients"),
                 F.sum(F.when(F.col("rpp"), 1).otherwise(0)).alias("rpp_requests"),
                 F.max("response_us").alias("max_response_us"),
                 F.min("ts_ns").alias("first_ts_ns"),
                 F.max("ts_ns").alias("last_ts_ns")))


# =============================================================================================
# Stability and consumption latency
# =============================================================================================

_SEND_KEY = ["capture", "source_ip", "tidx", "sqn"]


def _acks(messages: DataFrame, ack_type: int) -> DataFrame:
    ack = F.col("ume_ack")
    return messages.where(ack.isNotNull() & (ack["type"] == ack_type)).select(
        "capture", "pos", "msg_index", "ts_ns", "file", "file_offset", "src_ip", "src_port",
        "dst_ip", "dst_port", ack["transport_idx"].alias("transport_idx"),
        ack["id_2"].alias("id_2"), ack["rcv_reg_id"].alias("rcv_reg_id"),
        ack["seqnum"].alias("sqn"))


def _as_of_send(acks: DataFrame, sends: DataFrame) -> DataFrame:
    """Attach to each ACK the latest send of its message at or before the ACK (or nulls).

    An as-of join in one pass: ACKs and sends of a message (:data:`_SEND_KEY`) in one
    window, in time order with a send before an ACK of the same instant, and each ACK takes
    the last send before it.  (A join on the key with ``send <= ACK`` and then a window per
    ACK keeping the latest send shuffled and sorted the ACKs twice and the sends once; this
    is one shuffle and sort of both.)  Of sends at the same instant, the greatest session
    wins."""
    ack_columns = acks.columns
    sent = F.struct(F.col("send_ts_ns"), F.col("session"))
    items = (acks.select(*ack_columns, F.lit(1).alias("_kind"), F.lit(None).cast(
                 "struct<send_ts_ns:bigint,session:string>").alias("_sent"))
             .unionByName(sends.select(*_SEND_KEY, F.col("send_ts_ns").alias("ts_ns"),
                                       F.lit(0).alias("_kind"), sent.alias("_sent")),
                          allowMissingColumns=True))
    before = (Window.partitionBy(*_SEND_KEY)
              .orderBy("ts_ns", "_kind", F.col("_sent.session"))
              .rowsBetween(Window.unboundedPreceding, Window.currentRow))
    return (items.withColumn("_latest", F.last("_sent", ignorenulls=True).over(before))
            .where(F.col("_kind") == 1)
            .select(*ack_columns, F.col("_latest.session").alias("session"),
                    F.col("_latest.send_ts_ns").alias("send_ts_ns"))
            .withColumn("latency_us", _us(F.col("ts_ns"), F.col("send_ts_ns"))))


def _source_topics(regs: DataFrame) -> DataFrame:
    return (regs.where(F.col("role") == "source")
            .groupBy("capture", "source_ip", "transport_idx", "topic_idx")
            .agg(F.min_by("topic", "pos").alias("topic")))


def stability_acks(messages: DataFrame, sends: DataFrame, regs: DataFrame) -> DataFrame:
    """How long did each message take to become stable at each store?

    One row per stability ACK (store to source): the store, the source (the ACK's
    destination), the topic index (``id_2`` of a store's ACK) and sequence number it
    acknowledges, the latest send of that message at or before the ACK and the latency
    between them.  ``send_ts_ns`` is null when the capture holds no such send (see
    :func:`anomalies`).  ``topic`` comes from the source's registration.
    """
    acks = _acks(messages, AckType.STABLE).select(
        "capture", "pos", "msg_index", "ts_ns", "file", "file_offset",
        F.col("src_ip").alias("store_ip"), F.col("src_port").alias("store_port"),
        F.col("dst_ip").alias("source_ip"), "transport_idx",
        F.col("id_2").alias("tidx"), "sqn")
    return _as_of_send(acks, sends).join(
        _source_topics(regs).withColumnRenamed("topic_idx", "tidx"),
        ["capture", "source_ip", "transport_idx", "tidx"], "left")


def consumption_acks(messages: DataFrame, sends: DataFrame, regs: DataFrame) -> DataFrame:
    """How long after a message was sent did each receiver acknowledge consuming it?

    One row per consumption ACK (CDELV, receiver to store): the receiver, the store, the
    receiver RegID, and, through the receiver's registration with that store (RegID ->
    source RegID -> source registration), the source and topic index; then, as for
    stability, the latest send of the acknowledged sequence number and the latency.  A
    cumulative (batched) ACK is measured for the sequence number it names.  ACKs whose
    registration is not in the capture have a null ``source_ip``.
    """
    acks = _acks(messages, AckType.CDELV).select(
        "capture", "pos", "msg_index", "ts_ns", "file", "file_offset",
        F.col("src_ip").alias("receiver_ip"), F.col("src_port").alias("receiver_port"),
        F.col("dst_ip").alias("store_ip"), F.col("dst_port").alias("store_port"),
        "transport_idx", "rcv_reg_id", "sqn")
    receivers = (regs.where((F.col("role") == "receiver") & (F.col("outcome") == "granted"))
                 .groupBy("capture", "store_ip", F.col("granted_reg_id").alias("rcv_reg_id"))
                 .agg(F.min_by(F.struct("source_ip", "topic_idx", "topic"), "pos")
                      .alias("reg")))
    named = (acks.join(receivers, ["capture", "store_ip", "rcv_reg_id"], "left")
             .select(acks["*"], F.col("reg.source_ip").alias("source_ip"),
                     F.col("reg.topic_idx").alias("tidx"), F.col("reg.topic").alias("topic")))
    return _as_of_send(named, sends)


def latency_summary(stability: DataFrame, consumption: DataFrame) -> DataFrame:
    """Stability and consumption latency percentiles per source topic and store.

    ``acks`` counted, ``matched`` (with a send in the capture), exact percentiles (linear
    interpolation, as numpy's default) p50/p90/p99, min, max and mean, in microseconds.
    Consumption rows also count the distinct ``receivers``.
    """
    cols = ["capture", "source_ip", "tidx", "topic", "store_ip", "latency_us"]
    both = (stability.select(*cols, F.lit("stability").alias("kind"),
                             F.lit(None).cast("string").alias("receiver_ip"))
            .unionByName(consumption.select(*cols, F.lit("consumption").alias("kind"),
                                            "receiver_ip")))
    q = F.percentile("latency_us", list(PERCENTILES))
    return (both.groupBy("capture", "kind", "source_ip", "tidx", "topic", "store_ip")
            .agg(F.count("*").alias("acks"), F.count("latency_us").alias("matched"),
                 _distinct_count("receiver_ip").alias("receivers"), q.alias("q"),
                 F.min("latency_us").alias("min_us"), F.max("latency_us").alias("max_us"),
                 F.avg("latency_us").alias("mean_us"))
            .select("*", F.col("q")[0].alias("p50_us"), F.col("q")[1].alias("p90_us"),
                    F.col("q")[2].alias("p99_us"))
            .drop("q"))


def latency_histogram(stability: DataFrame, consumption: DataFrame,
                      options: AnalysisOptions | None = None) -> DataFrame:
    """The shape of the latency distributions: counts in log-spaced buckets per kind, source
    and store (``bucket_low_us`` <= latency < ``bucket_high_us``; latencies under 1 us share
    the first bucket)."""
    base = (options or AnalysisOptions()).histogram_base
    cols = ["capture", "source_ip", "store_ip", "latency_us"]
    both = (stability.select(*cols, F.lit("stability").alias("kind"))
            .unionByName(consumption.select(*cols, F.lit("consumption").alias("kind")))
            .where(F.col("latency_us").isNotNull()))
    bucket = F.floor(F.log(base, F.greatest(F.col("latency_us"), F.lit(1.0))))
    return (both.withColumn("bucket", bucket)
            .groupBy("capture", "kind", "source_ip", "store_ip", "bucket")
            .agg(F.count("*").alias("count"))
            .withColumn("bucket_low_us", F.pow(F.lit(base), F.col("bucket")))
            .withColumn("bucket_high_us", F.pow(F.lit(base), F.col("bucket") + 1)))


# =============================================================================================
# Flight size
# =============================================================================================

_FLIGHT = ["capture", "session", "source_ip", "tidx"]


def stable_times(stability: DataFrame, regs: DataFrame,
                 options: AnalysisOptions | None = None) -> DataFrame:
    """When did each sent message become stable?

    Under ``options.stability_rule``: the n-th store's first stability ACK, n from the number
    of stores the source registered with for that topic (granted), or of the stores that
    ACKed when no registration is in the capture.  Messages that never got enough ACKs have
    no row."""
    rule = (options or AnalysisOptions()).stability_rule
    # partitioned once by message: the first ACK per store and the n-th store per message
    # both group within a message, so neither shuffles again (without this each did)
    matched = stability.where(F.col("send_ts_ns").isNotNull()).repartition(*_FLIGHT, "sqn")
    first_per_store = (matched.groupBy(*_FLIGHT, "sqn", "store_ip")
                       .agg(F.min("ts_ns").alias("ack_ts_ns")))
    registered = (regs.where((F.col("role") == "source") & (F.col("outcome") == "granted"))
                  .groupBy("capture", "source_ip", F.col("topic_idx").alias("tidx"))
                  .agg(_distinct_count("store_ip").alias("registered_stores")))
    acking = (first_per_store.groupBy(*_FLIGHT)
              .agg(_distinct_count("store_ip").alias("acking_stores")))
    stores = (acking.join(registered, ["capture", "source_ip", "tidx"], "left")
              .withColumn("stores", F.coalesce("registered_stores", "acking_stores")))
    need = {"quorum": F.floor(F.col("stores") / 2) + 1, "all": F.col("stores"),
            "any": F.lit(1)}[rule]
    stores = stores.withColumn("needed", need.cast("int"))
    nth = Window.partitionBy(*_FLIGHT, "sqn").orderBy("ack_ts_ns", "store_ip")
    return (first_per_store.join(F.broadcast(stores.select(*_FLIGHT, "stores", "needed")),
                                 _FLIGHT)
            .withColumn("_n", F.row_number().over(nth))
            .where(F.col("_n") == F.col("needed"))
            .select(*_FLIGHT, "sqn", F.col("ack_ts_ns").alias("stable_ts_ns"), "stores",
                    "needed"))


def flight_events(sends: DataFrame, stable: DataFrame) -> DataFrame:
    """Messages entering (send, +1) and leaving (stable, -1) the flight of their source
    topic, with the running ``in_flight`` count after each event."""
    ups = sends.select(*_FLIGHT, "sqn", F.col("send_ts_ns").alias("ts_ns"),
                       F.lit(1).alias("delta"))
    downs = stable.select(*_FLIGHT, "sqn", F.col("stable_ts_ns").alias("ts_ns"),
                          F.lit(-1).alias("delta"))
    # at equal times the message leaving goes first, so a peak is never overstated
    order = Window.partitionBy(*_FLIGHT).orderBy("ts_ns", "delta", "sqn")
    return (ups.unionByName(downs)
            .withColumn("in_flight", F.sum("delta").over(
                order.rowsBetween(Window.unboundedPreceding, 0)))
            .withColumn("event", F.row_number().over(order)))


def flight_size(events: DataFrame, options: AnalysisOptions | None = None) -> DataFrame:
    """How many messages were in flight (sent, not yet stable) per source topic, over time?

    ``events`` from :func:`flight_events` (stability by :func:`stable_times`).  The capture's
    span of events is cut into ``options.flight_bins`` bins; per bin with events: the peak
    (``max_in_flight``) and the value at its end (``end_in_flight``), messages ``sent`` and
    ``stabilized``; between bins the value holds.
    """
    options = options or AnalysisOptions()
    span = (events.groupBy("capture").agg(F.min("ts_ns").alias("t0"),
                                          F.max("ts_ns").alias("t1"))
            .withColumn("width", F.greatest(F.lit(1), F.ceil(
                (F.col("t1") - F.col("t0") + 1) / F.lit(options.flight_bins))).cast("long"))
            .drop("t1"))
    binned = (events.join(F.broadcast(span), "capture")
              .withColumn("bin", F.floor((F.col("ts_ns") - F.col("t0")) / F.col("width"))))
    return (binned.groupBy(*_FLIGHT, "bin", "t0", "width")
            .agg(F.max("in_flight").alias("max_in_flight"),
                 F.max_by("in_flight", "event").alias("end_in_flight"),
                 F.sum(F.when(F.col("delta") > 0, 1).otherwise(0)).alias("sent"),
                 F.sum(F.when(F.col("delta") < 0, 1).otherwise(0)).alias("stabilized"))
            .withColumn("bin_start_ns", F.col("t0") + F.col("bin") * F.col("width"))
            .withColumn("bin_end_ns", F.col("bin_start_ns") + F.col("width"))
            .drop("t0", "width"))


def flight_size_summary(events: DataFrame, stable: DataFrame,
                        options: AnalysisOptions | None = None, *,
                        topics: DataFrame | None = None) -> DataFrame:
    """Per source topic: messages sent, stabilized, never stable in the capture, the peak
    in-flight count and when, and how many store ACKs stability needed (of how many
    stores).  With ``topics`` (:func:`advertised_topics`) each row gets its ``topic``
    name."""
    options = options or AnalysisOptions()
    needed = stable.groupBy(*_FLIGHT).agg(F.max("stores").alias("stores"),
                                          F.max("needed").alias("acks_needed"))
    out = (events.groupBy(*_FLIGHT)
            .agg(F.sum(F.when(F.col("delta") > 0, 1).otherwise(0)).alias("messages"),
                 F.sum(F.when(F.col("delta") < 0, 1).otherwise(0)).alias("stabilized"),
                 F.max("in_flight").alias("peak_in_flight"),
                 F.min_by("ts_ns", F.struct(-F.col("in_flight"), F.col("event")))
                 .alias("peak_ts_ns"),
                 F.max_by("in_flight", "event").alias("end_in_flight"))
            .withColumn("never_stable", F.col("messages") - F.col("stabilized"))
            .join(needed, _FLIGHT, "left")
            .withColumn("stability_rule", F.lit(options.stability_rule)))
    if topics is None:
        return out
    return (out.join(F.broadcast(topics), ["capture", "session", "tidx"], "left")
            .withColumnRenamed("advertised_topic", "topic"))


# =============================================================================================
# Retransmission requests
# =============================================================================================


def retransmission_requests(packets: DataFrame, data: DataFrame, messages: DataFrame,
                            regs: DataFrame) -> DataFrame:
    """Which retransmissions were asked for, who answered, how fast?

    One row per requested sequence number:

    ``ume-rxreq``
        a receiver's RXREQ to a store, served by the store's first RETRANS of that sequence
        number (and topic, through the receiver's registration) on the same connection after
        the request;
    ``lbtrm-nak`` / ``lbtru-nak``
        each sequence number of a transport NAK, served by the first RX data of it after the
        NAK from the session the NAK is addressed to (LBT-RU: sent to the NAKer), or
        confirmed by an NCF (``ncf_reason``).  The session is tshark's
        (:func:`with_session_side`): an LBT-RM NAK goes to the NAK port its header names,
        while the retransmission leaves from whatever UDP port the source sends from, and
        both carry that NAK port and the session ID in their header.

    ``outcome`` is ``served``, ``ncf`` (confirmed, not retransmitted in the capture),
    ``closed-port`` (neither, and the NAK came back quoted in an ICMP error: nothing listens
    on the NAK port any more, the source is gone; ``closed_port_ts_ns``) or ``unanswered``;
    ``service_us`` the time to the retransmission.
    """
    rx_req = F.col("ume_rxreq")
    reg_topics = (regs.where((F.col("role") == "receiver") & (F.col("outcome") == "granted"))
                  .groupBy("capture", "store_ip", "granted_reg_id")
                  .agg(F.min_by("topic_idx", "pos").alias("request_tidx")))
    rxreqs = (messages.where(rx_req.isNotNull()).select(
        "capture", "pos", "msg_index", "ts_ns", "file", "file_offset",
        F.col("src_ip").alias("requester_ip"), F.col("src_port").alias("requester_port"),
        F.col("dst_ip").alias("responder_ip"), F.col("dst_port").alias("responder_port"),
        rx_req["request_idx"].alias("request_idx"), rx_req["id_2"].alias("reg_id"),
        rx_req["seqnum"].alias("sqn"))
        .join(reg_topics.withColumnRenamed("store_ip", "responder_ip")
              .withColumnRenamed("granted_reg_id", "reg_id"),
              ["capture", "responder_ip", "reg_id"], "left"))
    retrans = data.where(F.col("message_type") == "retrans").select(
        F.col("capture").alias("a_capture"), F.col("pos").alias("a_pos"),
        F.col("msg_index").alias("a_index"), F.col("ts_ns").alias("a_ts"),
        F.col("src_ip").alias("a_src_ip"), F.col("src_port").alias("a_src_port"),
        F.col("dst_ip").alias("a_dst_ip"), F.col("dst_port").alias("a_dst_port"),
        F.col("sqn").alias("a_sqn"), F.col("tidx").alias("a_tidx"))
    cond = ((F.col("capture") == F.col("a_capture"))
            & (F.col("requester_ip") == F.col("a_dst_ip"))
            & (F.col("requester_port") == F.col("a_dst_port"))
            & (F.col("responder_ip") == F.col("a_src_ip"))
            & (F.col("responder_port") == F.col("a_src_port"))
            & (F.col("sqn") == F.col("a_sqn"))
            & (F.col("request_tidx").isNull() | (F.col("request_tidx") == F.col("a_tidx")))
            & (F.struct("a_pos", "a_index") > F.struct("pos", "msg_index")))
    served = (rxreqs.join(retrans, cond, "left")
              .groupBy(*rxreqs.columns)
              .agg(F.min(F.struct("a_pos", "a_index", "a_ts")).alias("answer"))
              .select("*", F.col("answer.a_ts").alias("served_ts_ns")).drop("answer"))
    ume = served.select(
        "capture", F.lit("ume-rxreq").alias("kind"), "ts_ns", "file", "file_offset", "pos",
        "requester_ip", "requester_port", "responder_ip", "responder_port",
        F.lit(None).cast("string").alias("session"), "request_idx", "reg_id",
        F.col("request_tidx").alias("tidx"), "sqn", "served_ts_ns",
        F.lit(None).cast("long").alias("ncf_ts_ns"), F.lit(None).cast("int").alias("ncf_reason"))

    side = with_session_side(packets.where(F.col("protocol").isin("lbtrm", "lbtru")))
    side = side.withColumn("_live", ~_quoted(side))
    naks = (side.where((F.col("packet_type") == "nak") & F.col("_live")).select(
        "capture", "pos", "ts_ns", "file", "file_offset", "protocol",
        F.col("src_ip").alias("requester_ip"), F.col("src_port").alias("requester_port"),
        F.col("dst_ip").alias("responder_ip"), F.col("dst_port").alias("responder_port"),
        "session", F.posexplode("nak_sqns").alias("nak_index", "sqn")))
    answer_cols = [F.col("capture").alias("a_capture"), F.col("session").alias("a_session"),
                   F.col("pos").alias("a_pos"), F.col("ts_ns").alias("a_ts"),
                   F.col("src_ip").alias("a_src_ip"), F.col("src_port").alias("a_src_port"),
                   F.col("dst_ip").alias("a_dst_ip")]
    rx = (side.where((F.col("packet_type") == "data") & F.col("_live")
                     & F.coalesce(F.col("retransmission"), F.lit(False)))
          .select(*answer_cols, F.col("sqn").alias("a_sqn")))
    ncfs = (side.where((F.col("packet_type") == "ncf") & F.col("_live"))
            .select(*answer_cols, F.col("ncf_reason").alias("a_reason"),
                    F.explode("ncf_sqns").alias("a_sqn")))
    bounces = (side.where((F.col("packet_type") == "nak") & _closed_port(side))
               .select(*answer_cols, F.explode("nak_sqns").alias("a_sqn")))

    def first_answer(answers: DataFrame, fields: Sequence[str], to_requester: Column
                     ) -> DataFrame:
        cond = ((F.col("capture") == F.col("a_capture"))
                & (F.col("session") == F.col("a_session"))
                & (F.col("sqn") == F.col("a_sqn")) & to_requester
                & (F.col("a_pos") > F.col("pos")))
        return (naks.join(answers, cond, "left")
                .groupBy("capture", "pos", "nak_index")
                .agg(F.min(F.struct("a_pos", *fields)).alias("answer")))

    # LBT-RM retransmits and confirms to the group; LBT-RU to the NAKer alone
    multicast = (F.col("protocol") == "lbtrm") | (F.col("requester_ip") == F.col("a_dst_ip"))
    by_rx = first_answer(rx, ["a_ts"], multicast).select(
        "capture", "pos", "nak_index", F.col("answer.a_ts").alias("served_ts_ns"))
    by_ncf = first_answer(ncfs, ["a_ts", "a_reason"], multicast).select(
        "capture", "pos", "nak_index", F.col("answer.a_ts").alias("ncf_ts_ns"),
        F.col("answer.a_reason").alias("ncf_reason"))
    # the ICMP error quotes the NAK itself: same sender, port and sequence numbers
    by_bounce = first_answer(bounces, ["a_ts"], (F.col("requester_ip") == F.col("a_src_ip"))
                             & (F.col("requester_port") == F.col("a_src_port"))).select(
        "capture", "pos", "nak_index", F.col("answer.a_ts").alias("closed_port_ts_ns"))
    transport = (naks.join(by_rx, ["capture", "pos", "nak_index"], "left")
                 .join(by_ncf, ["capture", "pos", "nak_index"], "left")
                 .join(by_bounce, ["capture", "pos", "nak_index"], "left")
                 .select("capture", F.concat(F.col("protocol"), F.lit("-nak")).alias("kind"),
                         "ts_ns", "file", "file_offset", "pos", "requester_ip",
                         "requester_port", "responder_ip", "responder_port", "session",
                         F.lit(None).cast("long").alias("request_idx"),
                         F.lit(None).cast("long").alias("reg_id"),
                         F.lit(None).cast("long").alias("tidx"), "sqn", "served_ts_ns",
                         "ncf_ts_ns", "ncf_reason", "closed_port_ts_ns"))
    return (ume.withColumn("closed_port_ts_ns", F.lit(None).cast("long"))
            .unionByName(transport)
            .withColumn("outcome", F.when(F.col("served_ts_ns").isNotNull(), "served")
                        .when(F.col("ncf_ts_ns").isNotNull(), "ncf")
                        .when(F.col("closed_port_ts_ns").isNotNull(), "closed-port")
                        .otherwise("unanswered"))
            .withColumn("ncf_text", _ncf_text(F.col("ncf_reason")))
            .withColumn("service_us", _us(F.col("served_ts_ns"), F.col("ts_ns"))))


def _ncf_text(reason: Column) -> Column:
    text: Column = F.lit(None).cast("string")
    for value, name in NCF_REASON_TEXT.items():
        text = F.when(reason == value, name).otherwise(text)
    return text


def retransmission_summary(requests: DataFrame) -> DataFrame:
    """Per kind and responder: requests, distinct sequence numbers, served / NCF'd / NAKed
    to a closed port / unanswered, and service-time percentiles (exact, microseconds)."""
    def count(cond: Column) -> Column:
        return F.sum(F.when(cond, 1).otherwise(0))

    q = F.percentile("service_us", list(PERCENTILES))
    return (requests.groupBy("capture", "kind", "responder_ip", "responder_port", "session")
            .agg(F.count("*").alias("requests"), _distinct_count("sqn").alias("sqns"),
                 _distinct_count("requester_ip").alias("requesters"),
                 count(F.col("outcome") == "served").alias("served"),
                 count(F.col("outcome") == "ncf").alias("ncf"),
                 count(F.col("outcome") == "closed-port").alias("closed_port"),
                 count(F.col("outcome") == "unanswered").alias("unanswered"),
                 q.alias("q"), F.max("service_us").alias("max_us"),
                 F.avg("service_us").alias("mean_us"))
            .select("*", F.col("q")[0].alias("p50_us"), F.col("q")[1].alias("p90_us"),
                    F.col("q")[2].alias("p99_us"))
            .drop("q"))


# =============================================================================================
# Anomalies
# =============================================================================================

ANOMALY_COLUMNS = ["capture", "severity", "kind", "ts_ns", "file", "file_offset", "subject",
                   "detail"]
"""One anomaly: where (capture, time, file and offset of the frame), how bad, what kind, who
(``subject``) and what exactly (``detail``)."""


def _anomaly(df: DataFrame, severity: str, kind: str, subject: Column,
             detail: Column) -> DataFrame:
    return df.select("capture", F.lit(severity).alias("severity"), F.lit(kind).alias("kind"),
                     "ts_ns", "file", "file_offset", subject.alias("subject"),
                     detail.alias("detail"))


def _s(col: str) -> Column:
    return F.coalesce(F.col(col).cast("string"), F.lit("?"))


def anomalies(packets: DataFrame, messages: DataFrame, sends: DataFrame,
              regs: DataFrame, stability: DataFrame, consumption: DataFrame,
              requests: DataFrame, flags: DataFrame) -> DataFrame:
    """What would a conformance reviewer want flagged?

    ``error``s: ``ack-for-unsent-sqn`` (a stability or consumption ACK for a sequence number
    that no send of that source topic carried before it, where the capture holds that source
    topic's data from that number or earlier, so the capture start does not explain it);
    ``registration-error`` (a PREG-RESP with the error flag); ``regid-reuse`` (a PREG asking
    a store for a RegID that store granted to a different client: another host, role, or
    topic); ``regid-conflict`` (a store granting one RegID to different clients);
    ``nak-to-closed-port`` (a transport NAK that came back quoted in an ICMP error: nothing
    listens on the session's NAK port, the source is gone and will repair nothing; an error,
    not a warning, because the receivers' only way left is the stores);
    ``malformed`` packets and messages.  ``warning``s: ``registration-unanswered``,
    ``unsolicited-registration-response``, ``retransmission-unanswered`` (an RXREQ or NAKed
    sequence number neither retransmitted nor NCF'd in the capture, nor bounced off a closed
    port), and transport/topic
    sequence ``gap``, ``out-of-order`` and ``duplicate`` events.  Columns:
    :data:`ANOMALY_COLUMNS`.
    """
    parts: list[DataFrame] = []

    lows = sends.groupBy("capture", "source_ip", "tidx").agg(F.min("sqn").alias("low_sqn"))
    for name, acks, who in (("stability", stability, "store_ip"),
                            ("consumption", consumption, "receiver_ip")):
        unsent = (acks.where(F.col("send_ts_ns").isNull() & F.col("source_ip").isNotNull())
                  .join(lows, ["capture", "source_ip", "tidx"])
                  .where(F.col("sqn") >= F.col("low_sqn")))
        parts.append(_anomaly(
            unsent, "error", "ack-for-unsent-sqn",
            F.concat_ws(" ", F.lit(name), F.lit("ACK from"), _s(who), F.lit("to"),
                        _s("store_ip" if who == "receiver_ip" else "source_ip")),
            F.concat(F.lit("source "), _s("source_ip"), F.lit(" topic index "), _s("tidx"),
                     F.lit(" sqn "), _s("sqn"), F.lit(" was not sent before the ACK"))))

    reg_subject = F.concat_ws(" ", "role", F.lit("registration of"), _s("client_ip"),
                              F.lit("at store"), F.concat_ws(":", _s("store_ip"),
                                                             _s("store_port")))
    errors = regs.where(F.col("outcome") == "error")
    parts.append(_anomaly(errors, "error", "registration-error", reg_subject,
                          F.concat(F.lit("error "), _s("error_code"), F.lit(": "), _s("error"),
                                   F.lit(" (RegID "), _s("requested_reg_id"), F.lit(")"))))
    unanswered = regs.where(F.col("outcome") == "unanswered")
    parts.append(_anomaly(unanswered, "warning", "registration-unanswered", reg_subject,
                          F.concat(F.lit("no PREG-RESP in the capture (RegID "),
                                   _s("requested_reg_id"), F.lit(")"))))

    identity = F.concat_ws("/", "client_ip", "role", F.col("topic_idx").cast("string"))
    granted = (regs.where(F.col("outcome") == "granted")
               .select("capture", "store_ip", F.col("granted_reg_id").alias("reg_id"),
                       identity.alias("holder")).distinct())
    asked = (regs.where(F.col("requested_reg_id") > 0)
             .withColumn("asker", identity)
             .join(granted.withColumnRenamed("reg_id", "requested_reg_id"),
                   ["capture", "store_ip", "requested_reg_id"])
             .where(F.col("holder") != F.col("asker")))
    parts.append(_anomaly(asked, "error", "regid-reuse", reg_subject,
                          F.concat(F.lit("asks for RegID "), _s("requested_reg_id"),
                                   F.lit(", which this store granted to "), _s("holder"))))
    conflicts = (regs.where(F.col("outcome") == "granted")
                 .withColumn("holder", identity)
                 .withColumn("holders", F.size(F.collect_set("holder").over(
                     Window.partitionBy("capture", "store_ip", "granted_reg_id"))))
                 .where(F.col("holders") > 1))
    parts.append(_anomaly(conflicts, "error", "regid-conflict", reg_subject,
                          F.concat(F.lit("store granted RegID "), _s("granted_reg_id"),
                                   F.lit(" to "), _s("holders"), F.lit(" different clients"))))

    resp = F.col("ume_preg_resp")
    answered = regs.where(F.col("response_pos").isNotNull()).select(
        "capture", F.col("response_pos").alias("pos"),
        F.col("response_index").alias("msg_index"), F.lit(True).alias("_answered"))
    orphans = (messages.where(resp.isNotNull())
               .join(answered, ["capture", "pos", "msg_index"], "left")
               .where(F.col("_answered").isNull()))
    parts.append(_anomaly(
        orphans, "warning", "unsolicited-registration-response",
        F.concat_ws(" ", F.lit("store"), F.concat_ws(":", _s("src_ip"), _s("src_port")),
                    F.lit("to"), F.concat_ws(":", _s("dst_ip"), _s("dst_port"))),
        F.concat(F.lit("PREG-RESP for RegID "), resp["reg_id"].cast("string"),
                 F.lit(" answers no request in the capture"))))

    lost = requests.where(F.col("outcome") == "unanswered")
    parts.append(_anomaly(
        lost, "warning", "retransmission-unanswered",
        F.concat_ws(" ", "kind", F.lit("from"), _s("requester_ip"), F.lit("to"),
                    F.concat_ws(":", _s("responder_ip"), _s("responder_port"))),
        F.concat(F.lit("sqn "), _s("sqn"), F.lit(" neither retransmitted nor confirmed"))))

    bounced = (with_session_side(packets.where(_closed_port(packets)
                                               & (F.col("packet_type") == "nak")))
               .withColumn("_sqns", F.array_join(F.col("nak_sqns"), " ")))
    parts.append(_anomaly(
        bounced, "error", "nak-to-closed-port",
        F.concat_ws(" ", "protocol", F.lit("NAK from"),
                    F.concat_ws(":", _s("src_ip"), _s("src_port")), F.lit("to"),
                    F.concat_ws(":", _s("dst_ip"), _s("dst_port"))),
        F.concat(F.lit("ICMP port unreachable: nothing listens on the NAK port of session "),
                 _s("session"), F.lit(" (the source is gone); NAKed sqns "), _s("_sqns"))))

    bad_packets = packets.where(F.col("malformed_reason").isNotNull())
    parts.append(_anomaly(bad_packets, "error", "malformed",
                          F.concat_ws(" ", "protocol", F.lit("packet from"), _s("src_ip")),
                          F.col("malformed_reason")))
    bad_messages = messages.where(F.col("malformed_reason").isNotNull())
    parts.append(_anomaly(bad_messages, "error", "malformed",
                          F.concat_ws(" ", "protocol", F.lit("message from"), _s("src_ip")),
                          F.col("malformed_reason")))

    seq = sequence_events(flags)
    seq_subject = F.concat_ws(" ", "level", F.concat_ws(":", "protocol", "source_ip",
                                                        F.col("source_port").cast("string")),
                              F.lit("to"), F.concat_ws(":", "dest_ip",
                                                       F.col("dest_port").cast("string")),
                              F.when(F.col("tidx").isNotNull(),
                                     F.concat(F.lit("tidx "), F.col("tidx").cast("string"))))
    parts.append(seq.select(
        "capture", F.lit("warning").alias("severity"), F.col("event").alias("kind"), "ts_ns",
        "file", "file_offset", seq_subject.alias("subject"),
        F.concat(F.lit("sqn "), F.col("sqn").cast("string"), F.lit(", size "),
                 F.col("size").cast("string")).alias("detail")))

    out = parts[0]
    for part in parts[1:]:
        out = out.unionByName(part)
    return out.select(*ANOMALY_COLUMNS)


def anomaly_summary(found: DataFrame) -> DataFrame:
    """How many of each anomaly, when first, and one example of each."""
    return (found.groupBy("capture", "severity", "kind")
            .agg(F.count("*").alias("count"), F.min("ts_ns").alias("first_ts_ns"),
                 F.min_by(F.struct("subject", "detail", "file", "file_offset"), "ts_ns")
                 .alias("example"))
            .select("capture", "severity", "kind", "count", "first_ts_ns",
                    F.col("example.subject").alias("example_subject"),
                    F.col("example.detail").alias("example_detail"),
                    F.col("example.file").alias("example_file"),
                    F.col("example.file_offset").alias("example_file_offset")))


# =============================================================================================
# All of them
# =============================================================================================

ANALYSIS_THREADS = 3
"""Intermediate tables made at once by :func:`analyze` (and outputs written at once by
``ump analyze``): a few more than the two cores of the machine the figures of issue 19 were
taken on, so that while one step's job waits on a single-task stage or on the driver
(planning, a collect) another's tasks run."""


@dataclass
class AnalysisRun:
    """The result DataFrames of :func:`analyze`, by output name, in report order.

    ``cached`` are the intermediate tables several results share, persisted so the capture is
    walked once; :meth:`unpersist` releases them."""

    outputs: dict[str, DataFrame]
    cached: list[DataFrame]

    def unpersist(self) -> None:
        for df in self.cached:
            df.unpersist()


def analyze(tables: CaptureTables, options: AnalysisOptions | None = None, *,
            checkpoint: bool = True, small: bool = False, pair_on_driver: bool | None = None,
            progress: Callable[[str], None] | None = None) -> AnalysisRun:
    """Every analysis of the module over ``tables``.

    The intermediate tables several results share (the narrowed packets and messages, data
    messages, sends, registrations, sequence verdicts, ACK matches, retransmission requests,
    flight events) are computed once.  With ``checkpoint`` (the default) each is materialized
    as it is made (``localCheckpoint``, memory then disk) so later plans start from it: the
    query plans of the results stay small, which matters as much as the data on small
    captures (planning a result over the whole lineage costs seconds).  Without it they are
    only persisted and everything stays lazy.  ``small`` (a capture of a few thousand
    messages) does what needs Python workers in the driver instead (registration pairing);
    ``pair_on_driver`` asks for that pairing alone (default: ``small``), which suits any
    capture with few registration messages, whatever its size.
    ``progress`` is told each step's name.
    Detail tables (one row per event) and summaries are both returned; :data:`DETAIL_OUTPUTS`
    names the detail ones.
    """
    from concurrent.futures import Future, ThreadPoolExecutor

    from pyspark import StorageLevel

    options = options or AnalysisOptions()
    cached: list[DataFrame] = []

    def keep(name: str, make: Callable[..., DataFrame], *inputs: Any) -> Future[DataFrame]:
        def run() -> DataFrame:
            ready = [x.result() if isinstance(x, Future) else x for x in inputs]
            if progress is not None:
                progress(name)
            df = make(*ready)
            if checkpoint:
                df = df.localCheckpoint(eager=True)
            else:
                df = df.persist(StorageLevel.MEMORY_AND_DISK)
            cached.append(df)
            return df
        return pool.submit(run)

    # packets and advertisements are read as they are stored: a selection of Parquet columns
    # is a small plan and a cheap scan (pruned to the columns each analysis reads, filters
    # pushed down), where a checkpoint copied every kept column of every packet into the
    # block store (a job, and the largest table in memory)
    packets = tables.packets.select(
        *_PACKET_COLUMNS, *[c for c in _OPTIONAL_PACKET_COLUMNS if c in tables.packets.columns])
    adverts = tables.advertisements
    # the intermediate tables are made by ANALYSIS_THREADS threads, each step as soon as its
    # inputs are there (submitted in dependency order, so a step waits only for steps that
    # run already): Spark runs their jobs side by side, and the many stages of one or two
    # tasks (small shuffles, coalesced) no longer leave cores idle
    with ThreadPoolExecutor(ANALYSIS_THREADS, thread_name_prefix="ump-analysis") as pool:
        messages_f = keep("messages", lambda: tables.messages.where(
            F.col("sqn").isNotNull() | F.col("ume_preg").isNotNull()
            | F.col("ume_preg_resp").isNotNull() | F.col("ume_ack").isNotNull()
            | F.col("ume_rxreq").isNotNull() | F.col("malformed_reason").isNotNull())
            .select(*_MESSAGE_COLUMNS))
        data_f = keep("data messages", lambda m: data_messages(packets, m, adverts), messages_f)
        on_driver = small if pair_on_driver is None else pair_on_driver
        regs_f = keep("registrations", lambda m: registrations(m, pair_on_driver=on_driver),
                      messages_f)
        sends_f = keep("message sends", message_sends, data_f)
        flags_f = keep("sequence analysis", lambda d: _judged_items(packets, d), data_f)
        stability_f = keep("stability ACKs", stability_acks, messages_f, sends_f, regs_f)
        consumption_f = keep("consumption ACKs", consumption_acks, messages_f, sends_f, regs_f)
        requests_f = keep("retransmission requests",
                          lambda d, m, r: retransmission_requests(packets, d, m, r),
                          data_f, messages_f, regs_f)
        stable_f = keep("stability times", lambda a, r: stable_times(a, r, options),
                        stability_f, regs_f)
        events_f = keep("flight events", flight_events, sends_f, stable_f)
        found_f = keep("anomalies",
                       lambda m, s, r, a, c, q, f: anomalies(packets, m, s, r, a, c, q, f),
                       messages_f, sends_f, regs_f, stability_f, consumption_f, requests_f,
                       flags_f)
    data, regs, flags = data_f.result(), regs_f.result(), flags_f.result()
    stability, consumption = stability_f.result(), consumption_f.result()
    requests, stable = requests_f.result(), stable_f.result()
    events, found = events_f.result(), found_f.result()
    outputs = {
        "anomaly_summary": anomaly_summary(found),
        "anomalies": found,
        "topic_advertisements": topic_advertisements(adverts),
        "topic_queries": topic_queries(adverts),
        "transport_sessions": transport_sessions(packets, data),
        "sequence_summary": sequence_summary(flags),
        "sequence_events": sequence_events(flags),
        "registrations": regs,
        "registration_summary": registration_summary(regs),
        "latency_summary": latency_summary(stability, consumption),
        "latency_histogram": latency_histogram(stability, consumption, options),
        "stability_acks": stability,
        "consumption_acks": consumption,
        "flight_size_summary": flight_size_summary(events, stable, options,
                                                   topics=advertised_topics(adverts)),
        "flight_size": flight_size(events, options),
        "retransmission_summary": retransmission_summary(requests),
        "retransmission_requests": requests,
    }
    return AnalysisRun(outputs, cached)
