"""Transport sessions: per LBT-RM, LBT-RU and LBT-TCP session, the packet, byte, NAK, NCF and
SM counts and rates Wireshark's transport dialogs show (:func:`transport_sessions`).

The twin of :func:`tests.spark_analysis.twin.transport_sessions` on Arrow-backed pandas tables
(:mod:`spark_analysis.engine.common`).  Rows are grouped by integer codes of their keys
(:func:`~spark_analysis.engine.common.row_codes`: strings are hashed once, a column of one
value not at all) and conditional counts and sums are numpy bincounts and ``ufunc.at``
reductions over those codes; a session key or peer text is built once per distinct value,
never per packet (at 10,000,000 frames the per-row strings and the hash aggregations over
them cost several seconds).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_analysis.engine.common import (
    ICMP_DEST_UNREACHABLE,
    ICMP_PORT_UNREACHABLE,
    Arrayish,
    concat_ws,
    dictionary_encode,
    frame,
    match_rows,
    plain_table,
    row_codes,
    table,
    take_matched,
    transport_session_key,
)
from spark_analysis.engine.data import from_source, new_data

__all__ = ["transport_sessions"]

_COUNTS = ["messages", "topics", "data_packets", "data_bytes", "rx_packets", "rx_bytes",
           "sm_packets", "nak_packets", "nak_sqns", "ncf_packets", "ncf_sqns", "creq_packets",
           "ack_packets", "rst_packets", "peers", "naks_to_closed_port"]
"""Columns a session without such traffic has 0 in (Spark's ``fillna(0)``)."""

_UDP_COLUMNS = ["capture", "protocol", "source_ip", "source_port", "session_id",
                "data_packets", "data_bytes", "rx_packets", "rx_bytes", "sm_packets",
                "nak_packets", "nak_sqns", "ncf_packets", "ncf_sqns", "creq_packets",
                "ack_packets", "rst_packets", "peers", "data_src_port", "mcast_group",
                "naks_to_closed_port", "first_ts_ns", "last_ts_ns"]

_RATES = ["data_packets", "rx_packets", "nak_packets", "ncf_packets", "sm_packets", "messages",
          "data_bytes"]
"""Counts that get a ``<name>_per_s`` column, in the Spark result's order."""


def _when(cond: Arrayish, value: Arrayish | pa.Scalar, kind: pa.DataType) -> Arrayish:
    """Spark's ``when(cond, value)``: the value where ``cond`` is true, else null."""
    return pc.if_else(pc.fill_null(cond, False), value, pa.scalar(None, kind))


def _np(values: Arrayish) -> np.ndarray:
    """A boolean Arrow column as numpy (null is false)."""
    return np.asarray(pc.fill_null(values, False), dtype=bool)


class _Groups:
    """Aggregations over rows coded by group (``codes``, 0 to ``size`` - 1): numpy's
    ``add.at``, ``minimum.at`` and ``maximum.at`` on integer columns, null where a group has
    no value (Arrow's and Spark's ``sum``, ``min`` and ``max`` of nothing)."""

    def __init__(self, codes: np.ndarray, size: int) -> None:
        self.codes, self.size = codes, size

    def _valued(self, values: Arrayish, where: np.ndarray | None
                ) -> tuple[np.ndarray, np.ndarray]:
        """Per row in ``where`` with a value: its group and value (int64)."""
        ok = np.asarray(pc.is_valid(values), dtype=bool)
        if where is not None:
            ok &= where
        ints = np.asarray(pc.fill_null(values, 0)).astype(np.int64, copy=False)
        return self.codes[ok], ints[ok]

    def _typed(self, out: np.ndarray, groups: np.ndarray, kind: pa.DataType) -> pa.Array:
        seen = np.bincount(groups, minlength=self.size) > 0
        return pa.array(out, pa.int64(), mask=~seen).cast(kind)

    def count(self, where: np.ndarray) -> pa.Array:
        """Rows where ``where`` holds (``when(cond, 1).otherwise(0)`` summed)."""
        return pa.array(np.bincount(self.codes[where], minlength=self.size).astype(np.int64))

    def sum(self, values: Arrayish, where: np.ndarray | None = None) -> pa.Array:
        """The sum of ``values`` (``when(where, values).otherwise(0)``: the other rows count
        0, and a group whose rows are all null gets null)."""
        groups, ints = self._valued(values, where)
        out = np.zeros(self.size, dtype=np.int64)
        np.add.at(out, groups, ints)
        if where is not None:   # a row outside ``where`` is a 0, not a null
            groups = np.concatenate([groups, self.codes[~where]])
        return self._typed(out, groups, pa.int64())

    def least(self, values: Arrayish, where: np.ndarray | None = None) -> pa.Array:
        """The least of ``values`` in ``where`` (null for none), of their type."""
        groups, ints = self._valued(values, where)
        out = np.full(self.size, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(out, groups, ints)
        return self._typed(out, groups, values.type)

    def most(self, values: Arrayish, where: np.ndarray | None = None) -> pa.Array:
        """The greatest of ``values`` in ``where`` (null for none), of their type."""
        groups, ints = self._valued(values, where)
        out = np.full(self.size, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(out, groups, ints)
        return self._typed(out, groups, values.type)

    def distinct(self, values: np.ndarray, where: np.ndarray) -> pa.Array:
        """How many distinct codes ``values`` (0 to n - 1) the rows in ``where`` hold."""
        width = int(values.max()) + 1 if len(values) else 1
        pairs = pd.unique(self.codes[where] * width + values[where])
        return pa.array(np.bincount(pairs // width, minlength=self.size).astype(np.int64))


def _endpoint_codes(ip: Arrayish, port: Arrayish) -> np.ndarray:
    """Per row, a code of its ``concat_ws(":", ip, port)`` text: made once per distinct
    (address, port) and merged where two pairs make one text (a null part is left out)."""
    codes, first = row_codes([ip, port])
    picked = pa.array(first)
    texts = concat_ws(":", pc.take(ip, picked), pc.take(port, picked))
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    merged = np.asarray(dictionary_encode(texts).indices, dtype=np.int64)
    return merged[codes]


def _udp_sessions(packets: pd.DataFrame) -> pa.Table:
    """LBT-RM / LBT-RU sessions as tshark keys them
    (:func:`~spark_analysis.engine.data.with_session_side`), one row per (capture, protocol,
    source address and port, session ID).  Grouped by integer codes
    (:func:`~spark_analysis.engine.common.row_codes`); a row's session key is never built,
    only a group's."""
    icmp = [c for c in ("icmp_type", "icmp_code") if c in packets.columns]
    t = table(packets, ["capture", "pos", "protocol", "packet_type", "session_id",
                        "retransmission", "payload_length", "nak_sqns", "ncf_sqns", "src_ip",
                        "src_port", "dst_ip", "dst_port", "ucast_port", "ts_ns", *icmp])
    # the list columns are needed for their lengths only: measured before the filter
    t = t.set_column(t.schema.get_field_index("nak_sqns"), "nak_sqns",
                     pc.list_value_length(t["nak_sqns"]))
    t = t.set_column(t.schema.get_field_index("ncf_sqns"), "ncf_sqns",
                     pc.list_value_length(t["ncf_sqns"]))
    t = t.filter(pc.is_in(t["protocol"], value_set=pa.array(["lbtrm", "lbtru"])))
    side = from_source(t["packet_type"])
    sent = pc.fill_null(side, False)
    protocol = t["protocol"]
    rm = _np(pc.equal(protocol, "lbtrm"))
    source_ip = pc.if_else(sent, t["src_ip"], t["dst_ip"])
    source_port = pc.if_else(pa.array(rm), t["ucast_port"],
                             pc.if_else(sent, t["src_port"], t["dst_port"]))
    keys = [t["capture"], protocol, source_ip, source_port, t["session_id"]]
    codes, first = row_codes(keys)
    groups = _Groups(codes, len(first))
    # common.quoted / common.closed_port on the Arrow columns
    n = t.num_rows
    live = (np.asarray(pc.is_null(t["icmp_type"]), dtype=bool) if "icmp_type" in icmp
            else np.ones(n, dtype=bool))
    if len(icmp) == len(("icmp_type", "icmp_code")):
        bounced = _np(pc.and_kleene(pc.equal(t["icmp_type"], ICMP_DEST_UNREACHABLE),
                                    pc.equal(t["icmp_code"], ICMP_PORT_UNREACHABLE)))
    else:
        bounced = np.zeros(n, dtype=bool)
    ptype = t["packet_type"]

    def typed(name: str) -> np.ndarray:
        return _np(pc.equal(ptype, name))

    is_data = live & typed("data")
    retrans = _np(t["retransmission"])
    rx, new = is_data & retrans, is_data & ~retrans
    nak, ncf = live & typed("nak"), live & typed("ncf")
    # when(live & (~from_source | protocol == lbtru), ...): Kleene logic, a null is not true
    lbtru = ~rm
    peered = live & (_np(pc.invert(side)) | lbtru)
    peer_ip = pc.if_else(sent, t["dst_ip"], t["src_ip"])
    peer_port = pc.if_else(sent, t["dst_port"], t["src_port"])
    length = pc.cast(t["payload_length"], pa.int64())
    # mcast_group is Spark's first(..., ignorenulls=True): the first in capture order here
    grouped = rm & is_data & np.asarray(pc.is_valid(t["dst_ip"]), dtype=bool)
    mcast = _first_in_order(codes, len(first), t["pos"], grouped)
    ts = t["ts_ns"]
    return pa.table({
        "capture": pc.take(keys[0], pa.array(first)),
        "protocol": pc.take(keys[1], pa.array(first)),
        "source_ip": pc.take(keys[2], pa.array(first)),
        "source_port": pc.take(keys[3], pa.array(first)),
        "session_id": pc.take(keys[4], pa.array(first)),
        "data_packets": groups.count(new), "data_bytes": groups.sum(length, new),
        "rx_packets": groups.count(rx), "rx_bytes": groups.sum(length, rx),
        "sm_packets": groups.count(live & typed("sm")), "nak_packets": groups.count(nak),
        "nak_sqns": groups.sum(t["nak_sqns"], nak),
        "ncf_packets": groups.count(ncf),
        "ncf_sqns": groups.sum(t["ncf_sqns"], ncf),
        "creq_packets": groups.count(live & typed("creq")),
        "ack_packets": groups.count(live & typed("ack")),
        "rst_packets": groups.count(live & typed("rst")),
        "peers": groups.distinct(_endpoint_codes(peer_ip, peer_port), peered),
        "data_src_port": groups.least(t["src_port"], is_data),
        "mcast_group": take_matched(t["dst_ip"], mcast),
        "naks_to_closed_port": groups.count(bounced & typed("nak")),
        "first_ts_ns": groups.least(ts, live),
        "last_ts_ns": groups.most(ts, live),
    })


def _first_in_order(codes: np.ndarray, size: int, pos: Arrayish, where: np.ndarray
                    ) -> np.ndarray:
    """Per group, its first row in ``where`` in capture order (least ``pos``, a null first,
    then the row's place), -1 for none."""
    rows = np.flatnonzero(where)
    least = np.iinfo(np.int64).min
    order = np.asarray(pc.fill_null(pos, least), dtype=np.int64)[rows]
    rows = rows[np.argsort(order, kind="stable")]
    groups, at = np.unique(codes[rows], return_index=True)
    out = np.full(size, -1, dtype=np.int64)
    out[groups] = rows[at]
    return out


def _tcp_sessions(packets: pd.DataFrame, data: pa.Table) -> pa.Table:
    """LBT-TCP sessions: the TCP endpoints (capture, address, port) that send new data, with
    every LBT-TCP packet they sent (RX: TCP retransmissions) and the connections' far ends as
    peers."""
    endpoint = ["capture", "src_ip", "src_port"]
    senders = data.select(endpoint).filter(
        pc.and_kleene(new_data(data), pc.equal(data["protocol"], "lbttcp")))
    _, once = row_codes([senders[k] for k in endpoint])
    senders = senders.take(pa.array(once, pa.int64()))
    rows = table(packets, [*endpoint, "protocol", "dst_ip", "dst_port", "retransmission",
                           "payload_length", "ts_ns"])
    rows = rows.filter(pc.fill_null(pc.equal(rows["protocol"], "lbttcp"), False))
    codes, first = row_codes([rows[k] for k in endpoint])
    # the semi join to the senders, once per distinct endpoint (a null matches nothing)
    sender = match_rows([pc.take(rows[k], pa.array(first, pa.int64())) for k in endpoint],
                        [senders[k] for k in endpoint])
    assert sender is not None   # distinct senders
    kept = np.flatnonzero(sender >= 0)
    regroup = np.full(len(first), -1, dtype=np.int64)
    regroup[kept] = np.arange(len(kept))
    mine = regroup[codes] >= 0
    rows = rows.filter(pa.array(mine))
    groups = _Groups(regroup[codes][mine], len(kept))
    tcp_rx = _np(rows["retransmission"])
    fresh = ~tcp_rx
    length = pc.cast(rows["payload_length"], pa.int64())
    # a kept group's first row, in the kept rows
    heads = pa.array(np.cumsum(mine)[first[kept]] - 1, pa.int64())
    ts = rows["ts_ns"]
    return pa.table({
        "capture": pc.take(rows["capture"], heads),
        "protocol": pc.take(rows["protocol"], heads),
        "source_ip": pc.take(rows["src_ip"], heads),
        "source_port": pc.take(rows["src_port"], heads),
        "data_packets": groups.count(fresh), "data_bytes": groups.sum(length, fresh),
        "rx_packets": groups.count(tcp_rx), "rx_bytes": groups.sum(length, tcp_rx),
        "peers": groups.distinct(_endpoint_codes(rows["dst_ip"], rows["dst_port"]),
                                 np.ones(rows.num_rows, dtype=bool)),
        "first_ts_ns": groups.least(ts), "last_ts_ns": groups.most(ts),
        "session_id": pa.nulls(len(kept), pa.int64()),
    })


def _new_messages(data: pa.Table) -> pa.Table:
    """Per (capture, session): new topic ``messages``, distinct topic indices (``topics``) and
    ``topic_names``, the distinct non-null topics sorted (byte order, as Spark's
    ``array_sort``) and joined by ``", "`` (empty when none is named).  Counted by integer
    codes; the names are sorted and joined once per distinct (session, topic)."""
    new = data.select(["capture", "session", "tidx", "topic"]).filter(new_data(data))
    codes, first = row_codes([new["capture"], new["session"]])
    groups = _Groups(codes, len(first))
    tidx, _ = row_codes([new["tidx"]])
    heads = pa.array(first, pa.int64())
    counts = pa.table({"capture": pc.take(new["capture"], heads),
                       "session": pc.take(new["session"], heads),
                       "messages": groups.count(np.ones(new.num_rows, dtype=bool)),
                       "topics": groups.distinct(
                           tidx, np.asarray(pc.is_valid(new["tidx"]), dtype=bool))})
    # the distinct named topics of a group, by the group's code and the topic's
    _, once = row_codes([pa.array(codes), new["topic"]])
    named = new.select(["capture", "session", "topic"]).take(pa.array(once, pa.int64()))
    named = plain_table(named.filter(pc.is_valid(named["topic"])))
    named = named.sort_by([("capture", "ascending"), ("session", "ascending"),
                           ("topic", "ascending")])
    lists = named.group_by(["capture", "session"], use_threads=False).aggregate(
        [("topic", "list")])
    lists = pa.table({"capture": lists["capture"], "session": lists["session"],
                      "topic_names": pc.binary_join(lists["topic_list"], ", ")})
    out = plain_table(counts).join(lists, ["capture", "session"], join_type="left outer")
    return out.set_column(out.schema.get_field_index("topic_names"), "topic_names",
                          pc.fill_null(out["topic_names"], ""))


def transport_sessions(packets: pd.DataFrame, data: pd.DataFrame) -> pd.DataFrame:
    """Per transport session: data, retransmission, NAK, NCF and SM counts and rates.

    What Wireshark's (GUI-only) LBT-RM and LBT-RU transport dialogs show, for every session:
    packets and payload bytes of new data and of retransmissions (RX), session messages, NAK
    packets and the sequence numbers they NAK, NCF packets and the numbers they confirm,
    connection requests / ACKs / resets (LBT-RU), the distinct ``peers`` (LBT-RU receivers,
    LBT-RM NAKers, LBT-TCP connections), new topic ``messages`` and their ``topics``, and
    per-second rates over the session's span (null for a span of 0).  Sessions are keyed as
    tshark keys them (:func:`~spark_analysis.engine.data.with_session_side`): packets a
    receiver sends belong to the session they are addressed to.  ``data_src_port`` is the
    least UDP port data left from; ``mcast_group`` the LBT-RM data's destination, the first
    in capture order (Spark's ``first`` takes some row's).  Packets quoted in an ICMP error
    are not traffic: a quoted NAK counts in ``naks_to_closed_port`` (the source is gone) and
    the span is that of the session's own packets.  LBT-TCP sessions are the TCP endpoints
    that send new data; RX there counts TCP retransmissions.  A session of new data without
    packets of its own is left out (the Spark twin joins the messages to the packets).
    Columns in the Spark result's order."""
    rows = table(data, ["capture", "session", "protocol", "src_ip", "src_port", "tidx",
                        "topic", "message_type", "label", "rx"])
    udp = _udp_sessions(packets)
    tcp = _tcp_sessions(packets, rows)
    sessions = pa.concat_tables([udp, tcp.select(
        [c for c in _UDP_COLUMNS if c in tcp.column_names]).cast(pa.schema(
            [udp.schema.field(c) for c in _UDP_COLUMNS if c in tcp.column_names]))],
        promote_options="default")
    session = transport_session_key(sessions["protocol"], sessions["source_ip"],
                                    sessions["source_port"], sessions["session_id"])
    sessions = sessions.append_column("session", session)
    # (a row per session: joined as plain strings, Arrow's join cannot unify dictionaries)
    out = plain_table(sessions).join(plain_table(_new_messages(rows)), ["capture", "session"],
                                     join_type="left outer")
    columns = {name: out[name] for name in ["capture", "session", *_UDP_COLUMNS[1:],
                                            "messages", "topics", "topic_names"]}
    for name in _COUNTS:
        columns[name] = pc.fill_null(columns[name], pa.scalar(0, columns[name].type))
    seconds = pc.divide(pc.cast(pc.subtract(columns["last_ts_ns"], columns["first_ts_ns"]),
                                pa.float64()), 1e9)
    columns["duration_s"] = seconds
    positive = pc.fill_null(pc.greater(seconds, 0), False)
    for name in _RATES:
        columns[f"{name}_per_s"] = _when(
            positive, pc.divide(pc.cast(columns[name], pa.float64()), seconds), pa.float64())
    return frame(pa.table(columns))
