"""Topic resolution: which topics the TIRs advertise and for which transport session, which
topics and patterns receivers query, and the transport session key TIRs and data share.

The twins of the topic resolution analyses of :mod:`tests.spark_analysis.twin`, on Arrow-backed
pandas tables (:mod:`spark_analysis.engine.common`).  The work is done in Arrow (filters,
hash aggregations, hash joins); the only Python loop is over the few distinct wildcard
patterns and advertised topic names of a capture.

The Arrow plumbing :mod:`~spark_analysis.engine.data` and
:mod:`~spark_analysis.engine.sessions` share with this module (Spark's ``concat_ws`` and
session key, codes per distinct key combination) lives in :mod:`spark_analysis.engine.common`
and is re-exported here.
"""

from __future__ import annotations

import re

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_analysis.engine.common import (
    Arrayish,
    capture_order,
    concat_ws,
    frame,
    match_rows,
    row_codes,
    table,
    take_matched,
    transport_session_key,
)

__all__ = [
    "Arrayish",
    "advertised_topics",
    "capture_order",
    "concat_ws",
    "frame",
    "match_rows",
    "row_codes",
    "table",
    "take_matched",
    "topic_advertisements",
    "topic_queries",
    "transport_session_key",
    "wildcard_matches",
]

# =============================================================================================
# The session a TIR names
# =============================================================================================


def _protocol_session_id(protocol: Arrayish, session_id: Arrayish) -> Arrayish:
    """The session ID a key names: none for LBT-TCP (not on every segment) and none when the
    protocol is unknown (Spark's ``when(protocol != "lbttcp", session_id)``)."""
    keep = pc.fill_null(pc.not_equal(protocol, "lbttcp"), False)
    return pc.if_else(keep, session_id, pa.scalar(None, pa.int64()))


def _advertised_session(tirs: pa.Table) -> pa.ChunkedArray | pa.Array:
    """The session key (:func:`transport_session_key`) of the transport a TIR names: TIR
    transport ``tcp`` is LBT-TCP, whose data rows have no session ID."""
    transport = tirs["transport"]
    protocol = pc.if_else(pc.fill_null(pc.equal(transport, "tcp"), False),
                          pa.scalar("lbttcp"), transport)
    return transport_session_key(protocol, tirs["source_ip"], tirs["source_port"],
                                 _protocol_session_id(protocol, tirs["session_id"]))


# =============================================================================================
# Topic resolution
# =============================================================================================

_TIR_KEYS = ["capture", "topic", "transport", "source_ip", "source_port", "session_id",
             "topic_index"]


def topic_advertisements(advertisements: pd.DataFrame) -> pd.DataFrame:
    """Which topics were advertised, by which source, over which transport, how often?

    One row per (topic, transport, source address and port, session ID, topic index) seen in
    TIRs (a null is a key value of its own, as in Spark's ``groupBy``).  ``tirs`` counts the
    TIR copies on the wire (an lbmrd relays one TIR to every client); ``senders`` the distinct
    hosts that sent them.  ``persistent``: some TIR carried the UME option; ``stores`` the
    largest store list advertised; ``mcast_group``, ``mcast_port`` and
    ``ume_transport_idx`` the first non-null value in capture order (``pos``, then the
    record's index in its packet; Spark's ``first`` takes some row's, in practice the
    same).  Columns in the Spark result's order."""
    rows = table(advertisements, ["capture", "pos", "record", "record_index", "src_ip",
                                  "ts_ns", "mcast_group", "mcast_port", "topt_ume",
                                  "topt_ume_store", *_TIR_KEYS[1:]])
    tirs = capture_order(rows.filter(pc.equal(rows["record"], "tir")), "pos", "record_index")
    stores = pc.fill_null(pc.list_value_length(tirs["topt_ume_store"]), 0)
    tirs = tirs.append_column("_persistent", pc.is_valid(tirs["topt_ume"])) \
        .append_column("_stores", stores) \
        .append_column("_ume_idx", pc.struct_field(tirs["topt_ume"], "transport_idx"))
    first = pc.ScalarAggregateOptions(skip_nulls=True)
    agg = tirs.group_by(_TIR_KEYS, use_threads=False).aggregate([
        ([], "count_all"),
        ("src_ip", "count_distinct", pc.CountOptions(mode="only_valid")),
        ("ts_ns", "min"), ("ts_ns", "max"),
        ("mcast_group", "first", first), ("mcast_port", "first", first),
        ("_persistent", "max"), ("_stores", "max"), ("_ume_idx", "first", first)])
    out = pa.table({
        **{k: agg[k] for k in _TIR_KEYS},
        "tirs": agg["count_all"],
        "senders": agg["src_ip_count_distinct"],
        "first_ts_ns": agg["ts_ns_min"],
        "last_ts_ns": agg["ts_ns_max"],
        "mcast_group": agg["mcast_group_first"],
        "mcast_port": agg["mcast_port_first"],
        "persistent": agg["_persistent_max"],
        "stores": agg["_stores_max"],
        "ume_transport_idx": agg["_ume_idx_first"],
    })
    return frame(out.append_column("session", _advertised_session(out)))


def topic_queries(advertisements: pd.DataFrame) -> pd.DataFrame:
    """Which topics (and wildcard patterns) did receivers ask for, and how often?

    One row per (record, queried topic or pattern, pattern type): ``queries`` records on the
    wire, ``queriers`` the distinct hosts that sent them, ``matching_topics`` how many
    advertised topics of the capture answer it and ``answered`` whether any does.  A TQR is
    answered by the TIRs of its own topic (one topic at most); a wildcard TQR by those of every
    topic its pattern matches (:func:`wildcard_matches`).  A null topic answers nothing.
    Columns in the Spark result's order."""
    rows = table(advertisements, ["capture", "record", "topic", "pattern_type", "src_ip",
                                  "ts_ns"])
    queries = rows.filter(pc.is_in(rows["record"], pa.array(["tqr", "wc_tqr"])))
    agg = queries.group_by(["capture", "record", "topic", "pattern_type"],
                           use_threads=False).aggregate([
        ([], "count_all"),
        ("src_ip", "count_distinct", pc.CountOptions(mode="only_valid")),
        ("ts_ns", "min"), ("ts_ns", "max")])
    advertised = _distinct(rows.filter(pc.equal(rows["record"], "tir")), ["capture", "topic"])
    exact = _distinct(queries.filter(pc.equal(queries["record"], "tqr")),
                      ["capture", "record", "topic"]).join(
        advertised, ["capture", "topic"], join_type="inner")
    exact = exact.select(["capture", "record", "topic"]).append_column(
        "_matching", pa.array([1] * exact.num_rows, pa.int64()))
    wildcard = pa.Table.from_pandas(_wildcard_answers(advertisements), preserve_index=False)
    matched = pa.concat_tables([exact, wildcard.cast(exact.schema)])
    joined = agg.join(matched, ["capture", "record", "topic"], join_type="left outer")
    matching = pc.fill_null(joined["_matching"], 0)
    return frame(pa.table({
        "capture": joined["capture"], "record": joined["record"], "topic": joined["topic"],
        "pattern_type": joined["pattern_type"],
        "queries": joined["count_all"],
        "queriers": joined["src_ip_count_distinct"],
        "first_ts_ns": joined["ts_ns_min"],
        "last_ts_ns": joined["ts_ns_max"],
        "matching_topics": matching,
        "answered": pc.greater(matching, 0),
    }))


def _distinct(rows: pa.Table, columns: list[str]) -> pa.Table:
    """The distinct combinations of ``columns`` in ``rows`` (a null is a value)."""
    return rows.select(columns).group_by(columns, use_threads=False).aggregate([])


def wildcard_matches(pattern: str, topic: str) -> bool:
    """Whether a wildcard receiver's pattern selects ``topic``: a regular-expression search
    anywhere in the name (the pattern anchors itself with ``^``/``$`` if it wants to).
    Python's ``re`` stands for both UM pattern types (PCRE and POSIX extended regex): they
    agree on what receiver patterns use (classes, alternation, quantifiers, anchors).  A
    pattern that does not compile matches nothing."""
    try:
        return re.search(pattern, topic) is not None
    except re.error:
        return False


def _wildcard_answers(advertisements: pd.DataFrame) -> pd.DataFrame:
    """``(capture, record, topic, _matching)`` per wildcard pattern (non-null): how many
    distinct advertised topic names of its capture it matches.  Patterns and names are few
    (one per distinct name), so they are matched one pair at a time with
    :func:`wildcard_matches`."""
    rows = table(advertisements, ["capture", "record", "topic"])
    names = _distinct(rows.filter(pc.and_(pc.is_in(rows["record"], pa.array(["tir", "wc_tqr"])),
                                         pc.is_valid(rows["topic"]))),
                      ["capture", "record", "topic"]).to_pylist()
    topics: dict[str | None, list[str]] = {}
    for row in names:
        if row["record"] == "tir":
            topics.setdefault(row["capture"], []).append(row["topic"])
    patterns = [row for row in names if row["record"] == "wc_tqr"]
    return pd.DataFrame({
        "capture": pd.array([r["capture"] for r in patterns], pd.ArrowDtype(pa.string())),
        "record": pd.array(["wc_tqr"] * len(patterns), pd.ArrowDtype(pa.string())),
        "topic": pd.array([r["topic"] for r in patterns], pd.ArrowDtype(pa.string())),
        "_matching": pd.array([sum(wildcard_matches(r["topic"], name)
                                   for name in topics.get(r["capture"], []))
                               for r in patterns], pd.ArrowDtype(pa.int64())),
    })


def advertised_topics(advertisements: pd.DataFrame) -> pd.DataFrame:
    """Which topic each (transport session, topic index) carries, by the TIRs.

    A TIR names its transport by source address, port (LBT-RM: the NAK port the DATA header
    carries too) and session ID, and its topic by the topic index data messages carry: the
    join of topic names to data.  One row per ``(capture, session, tidx)`` with
    ``advertised_topic``; should TIRs name different topics for one index (a source restarted
    with the same session ID), the first advertised (least ``pos``, then ``record_index``:
    Spark's ``min_by``) wins."""
    rows = table(advertisements, ["capture", "pos", "record", "record_index", "topic",
                                  "transport", "source_ip", "source_port", "session_id",
                                  "topic_index"])
    tirs = rows.filter(pc.and_(pc.and_(pc.equal(rows["record"], "tir"),
                                       pc.is_valid(rows["topic_index"])),
                              pc.is_valid(rows["source_ip"])))
    tirs = capture_order(tirs, "pos", "record_index")
    keyed = pa.table({"capture": tirs["capture"], "session": _advertised_session(tirs),
                      "tidx": tirs["topic_index"], "topic": tirs["topic"]})
    agg = keyed.group_by(["capture", "session", "tidx"], use_threads=False).aggregate(
        [("topic", "first", pc.ScalarAggregateOptions(skip_nulls=False))])
    return frame(pa.table({"capture": agg["capture"], "session": agg["session"],
                           "tidx": agg["tidx"], "advertised_topic": agg["topic_first"]}))
