"""Data messages and when they were sent: every topic message on the wire with its transport
session and topic (:func:`data_messages`), each message's first send (:func:`message_sends`),
and the transport session of an LBT-RM / LBT-RU packet as tshark keys it
(:func:`with_session_side`).

The twins of the functions of the same names in :mod:`tests.spark_analysis.twin`, on
Arrow-backed pandas tables (:mod:`spark_analysis.engine.common`), computed with Arrow
filters, hash joins and hash aggregations (a null is a key value of its own in a grouping and
matches nothing in a join, as in Spark).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_analysis.engine.common import (
    Arrayish,
    encoded,
    frame,
    match_rows,
    row_codes,
    series,
    table,
    take_matched,
    transport_session_key,
)
from spark_analysis.engine.topics import advertised_topics

__all__ = ["DATA_TYPES", "SOURCE_SIDE", "data_messages", "from_source", "message_sends",
           "new_data", "session_side",
           "with_session_side"]

SOURCE_SIDE = ("data", "sm", "ncf", "rst")
"""UDP packet types a transport source sends (the others come from receivers)."""

DATA_TYPES = ("data", "retrans", "proactive_retrans")
"""Message types of topic messages: new, store retransmission, proactive retransmission."""

_MESSAGE_COLUMNS = ["capture", "pos", "msg_index", "file", "file_offset", "ts_ns", "protocol",
                    "src_ip", "src_port", "dst_ip", "dst_port", "session_id", "transport_sqn",
                    "message_type", "label", "tidx", "sqn", "topic_name", "payload_length"]

_DATA_ORDER = ["capture", "session", "tidx", "file", "file_offset", "pos", "msg_index", "ts_ns",
               "protocol", "src_ip", "src_port", "dst_ip", "dst_port", "session_id",
               "transport_sqn", "message_type", "label", "sqn", "topic_name", "payload_length",
               "rx", "source_port", "topic"]
"""The columns of :func:`data_messages`, in the Spark result's order."""


def _is_in(values: Arrayish, names: tuple[str, ...]
           ) -> Arrayish:
    """Spark's ``isin``: null where the value is null."""
    found = pc.is_in(values, value_set=pa.array(names, pa.string()))
    return pc.if_else(pc.is_null(values), pa.scalar(None, pa.bool_()), found)


def from_source(packet_type: Arrayish) -> Arrayish:
    """Whether a UDP packet of this type comes from the transport source (:data:`SOURCE_SIDE`);
    null for a null type."""
    return _is_in(packet_type, SOURCE_SIDE)


def with_session_side(packets: pd.DataFrame) -> pd.DataFrame:
    """LBT-RM / LBT-RU packets with the transport session they belong to, as tshark keys it.

    Adds ``from_source``, ``source_ip``/``source_port`` (the session's address and port) and
    ``session`` (:func:`~spark_analysis.engine.topics.transport_session_key`).  LBT-RM: a
    session is the source address, the unicast NAK port every header names (``ucast_port``)
    and the session ID; real sources send DATA, SM and NCF from an ephemeral UDP port, so a
    packet from the source belongs to (source address, header port, ID) and a NAK to (its
    destination address, header port, ID).  LBT-RU: the source side's address and UDP port
    (source port of what the source sends, destination port of what receivers send) and the
    ID.  As in Spark, a null packet type counts as not from the source (destination address
    and port) and leaves ``from_source`` null."""
    side = session_side(table(packets, _SIDE_COLUMNS))
    index = packets.index
    return packets.assign(**{name: series(side[name], index) for name in _SIDE_ADDED})


_SIDE_COLUMNS = ["protocol", "packet_type", "src_ip", "src_port", "dst_ip", "dst_port",
                 "ucast_port", "session_id"]
_SIDE_ADDED = ["from_source", "source_ip", "source_port", "session"]


def session_side(packets: pa.Table) -> pa.Table:
    """:func:`with_session_side` on an Arrow table (which needs the columns of
    ``_SIDE_COLUMNS``): the table with the four columns appended."""
    side = from_source(packets["packet_type"])
    sent = pc.fill_null(side, False)
    protocol = packets["protocol"]
    rm = pc.fill_null(pc.equal(protocol, "lbtrm"), False)
    source_ip = pc.if_else(sent, packets["src_ip"], packets["dst_ip"])
    source_port = pc.if_else(rm, packets["ucast_port"],
                             pc.if_else(sent, packets["src_port"], packets["dst_port"]))
    session = transport_session_key(protocol, source_ip, source_port, packets["session_id"])
    return packets.append_column("from_source", side).append_column(
        "source_ip", source_ip).append_column("source_port", source_port).append_column(
        "session", session)


def data_messages(packets: pd.DataFrame, messages: pd.DataFrame,
                  advertisements: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every topic message on the wire (new, retransmitted, proactively retransmitted).

    Messages of :data:`DATA_TYPES` with a sequence number and a topic index, joined to their
    LBT-RM / LBT-RU DATA packet (Spark joins by ``(file, file_offset)``; here by ``pos``,
    which names the same frame, found by a binary search in the sorted positions, or a real
    join should a frame be in ``packets`` twice): ``rx`` is the packet's
    retransmission flag (false without one), copies quoted by an ICMP error are dropped, and
    ``source_port`` is the LBT-RM header's NAK port (else the UDP source port), the port
    tshark keys the session by (:func:`with_session_side`).  ``session`` names the sending
    transport session (no session ID for LBT-TCP).  ``topic`` is the message's own topic name,
    else the topic the TIRs name for its session and topic index
    (:func:`~spark_analysis.engine.topics.advertised_topics`).  Keys and topics are made once
    per distinct combination (:func:`~spark_analysis.engine.common.row_codes`) and spread to
    the rows: a capture has few sessions and topics, and millions of messages."""
    msgs = table(messages, _MESSAGE_COLUMNS)
    keep = pc.and_(pc.and_(pc.is_in(msgs["message_type"],
                                    value_set=pa.array(DATA_TYPES, pa.string())),
                           pc.is_valid(msgs["sqn"])), pc.is_valid(msgs["tidx"]))

    quoted_cols = [c for c in ("icmp_type",) if c in packets.columns]
    pk = table(packets, ["pos", "file", "file_offset", "protocol", "packet_type",
                         "retransmission", "ucast_port", *quoted_cols])
    udp_rows = pc.and_(pc.equal(pk["packet_type"], "data"),
                       pc.is_in(pk["protocol"], value_set=pa.array(["lbtrm", "lbtru"])))
    found = _frame_rows(msgs["pos"], keep, pk["pos"], udp_rows)
    if found is None:   # a frame twice in packets: the join repeats its messages
        joined, rx, ucast_port = _joined_slowly(msgs.filter(keep), pk, udp_rows,
                                                        quoted_cols)
    else:
        rows, at = found
        if quoted_cols:   # copies quoted by an ICMP error are not messages sent
            bounced = np.asarray(pc.is_valid(pk["icmp_type"]), dtype=bool)
            live = (at < 0) | ~bounced[np.maximum(at, 0)]
            rows, at = rows[live], at[live]
        joined = msgs.take(pa.array(rows))
        retrans = np.asarray(pc.fill_null(pk["retransmission"], False), dtype=bool)
        rx = pa.array((at >= 0) & retrans[np.maximum(at, 0)])
        rm_port = pc.if_else(pc.equal(pk["protocol"], "lbtrm"), pk["ucast_port"],
                             pa.scalar(None, pk.schema.field("ucast_port").type))
        ucast_port = take_matched(rm_port, at)
    protocol = joined["protocol"]
    source_port = pc.coalesce(ucast_port, joined["src_port"])
    keep_sid = pc.fill_null(pc.not_equal(protocol, "lbttcp"), False)
    parts = [joined["capture"], protocol, joined["src_ip"], source_port,
             pc.if_else(keep_sid, joined["session_id"], pa.scalar(None, pa.int64()))]
    codes, first = row_codes(parts)
    picked = pa.array(first)
    keys = transport_session_key(*(pc.take(c, picked) for c in parts[1:]))
    # encoded: a capture has few sessions (as a string on every message, the widest column)
    session = encoded(codes, keys)
    out = joined.append_column("rx", rx).append_column(
        "source_port", source_port).append_column("session", session)
    if advertisements is None:
        topic = out["topic_name"]
    else:
        # the advertised topic per distinct (capture, session, topic index)
        named = pa.Table.from_pandas(advertised_topics(advertisements), preserve_index=False)
        combo, combo_first = row_codes([pa.array(codes), joined["tidx"]])
        picked = pa.array(combo_first)
        mine = [pc.take(joined["capture"], picked), pc.take(session, picked),
                pc.take(joined["tidx"], picked)]
        where = match_rows(mine, [named[k] for k in ["capture", "session", "tidx"]])
        assert where is not None   # one row per key
        advertised = take_matched(named["advertised_topic"], where)
        # the topic once per distinct (capture, session, topic index, own topic name)
        topics, topics_first = row_codes([pa.array(combo), out["topic_name"]])
        picked = pa.array(topics_first)
        chosen = pc.coalesce(pc.take(out["topic_name"], picked),
                             pc.take(advertised, pa.array(combo[topics_first])))
        topic = encoded(topics, chosen)
    return frame(out.append_column("topic", topic).select(_DATA_ORDER))


def _frame_rows(msg_pos: Arrayish, keep: Arrayish, packet_pos: Arrayish, udp: Arrayish
                ) -> tuple[np.ndarray, np.ndarray] | None:
    """The kept message rows and, for each, the row of the ``udp`` packet of its frame (same
    ``pos``; -1 when none), or None when a frame's ``pos`` is twice among the ``udp`` packets
    (or a ``pos`` is null): then the caller joins for real."""
    if msg_pos.null_count or packet_pos.null_count:
        return None
    rows = np.flatnonzero(np.asarray(pc.fill_null(keep, False), dtype=bool))
    packet_rows = np.flatnonzero(np.asarray(pc.fill_null(udp, False), dtype=bool))
    wanted = np.asarray(msg_pos, dtype=np.int64)[rows]
    have = np.asarray(packet_pos, dtype=np.int64)[packet_rows]
    order = np.argsort(have, kind="stable")   # nearly sorted: capture order
    have = have[order]
    if len(have) > 1 and bool((have[1:] == have[:-1]).any()):
        return None
    if not len(have):
        return rows, np.full(len(rows), -1, dtype=np.int64)
    at = np.minimum(np.searchsorted(have, wanted), len(have) - 1)
    return rows, np.where(have[at] == wanted, packet_rows[order[at]], -1)


def _joined_slowly(msgs: pa.Table, pk: pa.Table, udp_rows: Arrayish, quoted_cols: list[str]
                   ) -> tuple[pa.Table, Arrayish, Arrayish]:
    """The kept messages joined to their DATA packets by ``(file, file_offset)`` (Spark's
    join, repeating a message whose frame is twice in ``packets``), quoted copies dropped:
    the messages, and per row ``rx`` and the LBT-RM NAK port."""
    pk = pk.filter(udp_rows)
    quoted = (pc.is_valid(pk["icmp_type"]) if quoted_cols
              else pa.array([False] * pk.num_rows, pa.bool_()))
    udp = pa.table({
        "file": pk["file"], "file_offset": pk["file_offset"], "_quoted": quoted,
        "_rx": pc.fill_null(pk["retransmission"], False),
        "_ucast_port": pc.if_else(pc.equal(pk["protocol"], "lbtrm"), pk["ucast_port"],
                                  pa.scalar(None, pk.schema.field("ucast_port").type)),
    })
    joined = msgs.join(udp, ["file", "file_offset"], join_type="left outer")
    joined = joined.filter(pc.invert(pc.fill_null(joined["_quoted"], False)))
    rest = joined.select(msgs.column_names)
    return rest, pc.fill_null(joined["_rx"], False), joined["_ucast_port"]


def new_data(data: pa.Table) -> Arrayish:
    """A first transmission on a transport: type MESSAGE on a transport channel (``data``,
    label ``DATA``), not RX.  Null where a term is null (a filter drops the row)."""
    return pc.and_kleene(pc.and_kleene(pc.equal(data["message_type"], "data"),
                                       pc.equal(data["label"], "DATA")),
                         pc.invert(data["rx"]))


def message_sends(data: pd.DataFrame) -> pd.DataFrame:
    """When was each topic message first put on the wire?

    One row per (transport session, topic index, sequence number) of new data
    (:func:`new_data`): the earliest copy's time (LBT-RU and LBT-TCP send one copy per
    receiver and store; the first is the send) and how many copies there were.  Grouped by
    integer codes of the key (:func:`~spark_analysis.engine.common.row_codes`): numpy's
    bincount and ``minimum.at`` instead of a hash aggregation over strings."""
    keys = ["capture", "session", "protocol", "src_ip", "source_port", "tidx", "sqn"]
    rows = table(data, [*keys, "ts_ns", "message_type", "label", "rx"])
    new = np.flatnonzero(np.asarray(pc.fill_null(new_data(rows), False), dtype=bool))
    codes, heads = row_codes([rows[k] for k in keys])
    # a group's first row of new data (a group of other rows only has none: left out)
    first_new = np.full(len(heads), len(codes), dtype=np.int64)
    np.minimum.at(first_new, codes[new], new)
    sent = first_new < len(codes)
    size = int(sent.sum())
    renumber = np.cumsum(sent) - 1
    group = renumber[codes[new]]
    first = pa.array(first_new[sent])
    ts = rows["ts_ns"]
    valid = np.asarray(pc.is_valid(ts), dtype=bool)[new]
    times = np.asarray(pc.fill_null(ts, 0), dtype=np.int64)[new]
    least = np.full(size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(least, group[valid], times[valid])
    timed = np.bincount(group[valid], minlength=size) > 0
    return frame(pa.table({
        "capture": pc.take(rows["capture"], first), "session": pc.take(rows["session"], first),
        "protocol": pc.take(rows["protocol"], first),
        "source_ip": pc.take(rows["src_ip"], first),
        "source_port": pc.take(rows["source_port"], first),
        "tidx": pc.take(rows["tidx"], first), "sqn": pc.take(rows["sqn"], first),
        "send_ts_ns": pa.array(least, ts.type, mask=~timed),
        "copies": pa.array(np.bincount(group, minlength=size).astype(np.int64))}))
