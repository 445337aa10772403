"""Retransmission requests and who answered them: UME RXREQs to stores, LBT-RM / LBT-RU NAKs
to transport sources, each paired with the first answer after it, and their summary per
responder.

The pairing is an as-of match: for every request the first answer after it (in capture
order, ``pos`` then ``msg_index``) among those that share its keys (capture, the two ends,
the sequence number...).  :func:`_first_after` does it for whole columns at once: requests
and answers go into one sort by (key, order, answers before requests), and each request
takes the next answer of its key in that sort.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_analysis.engine.common import (
    ICMP_DEST_UNREACHABLE,
    ICMP_PORT_UNREACHABLE,
    dictionary_encode,
    plain,
)
from spark_analysis.engine.data import session_side
from spark_analysis.engine.options import PERCENTILES
from wire.lbtru import NCF_REASON_TEXT

__all__ = ["REQUEST_COLUMNS", "SUMMARY_COLUMNS", "retransmission_requests",
           "retransmission_summary"]

REQUEST_FIELDS: list[tuple[str, pa.DataType]] = [
    ("capture", pa.string()), ("kind", pa.string()), ("ts_ns", pa.int64()),
    ("file", pa.string()), ("file_offset", pa.int64()), ("pos", pa.int64()),
    ("requester_ip", pa.string()), ("requester_port", pa.int32()),
    ("responder_ip", pa.string()), ("responder_port", pa.int32()), ("session", pa.string()),
    ("request_idx", pa.int64()), ("reg_id", pa.int64()), ("tidx", pa.int64()),
    ("sqn", pa.int64()), ("served_ts_ns", pa.int64()), ("ncf_ts_ns", pa.int64()),
    ("ncf_reason", pa.int32()), ("closed_port_ts_ns", pa.int64()), ("outcome", pa.string()),
    ("ncf_text", pa.string()), ("service_us", pa.float64())]
REQUEST_COLUMNS = [name for name, _ in REQUEST_FIELDS]
"""The columns of :func:`retransmission_requests`, in the order of ``ump analyze``'s output."""

SUMMARY_COLUMNS = ["capture", "kind", "responder_ip", "responder_port", "session", "requests",
                   "sqns", "requesters", "served", "ncf", "closed_port", "unanswered",
                   "max_us", "mean_us", "p50_us", "p90_us", "p99_us"]
"""The columns of :func:`retransmission_summary`, in the order of ``ump analyze``'s output."""

_NO_MATCH = -1
_NULL_FIRST = np.iinfo(np.int64).min

Int64s = npt.NDArray[np.int64]
Bools = npt.NDArray[np.bool_]


# =============================================================================================
# Requests
# =============================================================================================


def retransmission_requests(packets: pd.DataFrame, data: pd.DataFrame, messages: pd.DataFrame,
                            regs: pd.DataFrame) -> pd.DataFrame:
    """Which retransmissions were asked for, who answered, how fast?  One row per requested
    sequence number.

    ``ume-rxreq``: a receiver's RXREQ (``messages.ume_rxreq``; ``messages`` may be the control
    messages alone, ``Inputs.rxreqs``: no other row is read) to a store, served by the
    store's first RETRANS (``data``, ``message_type`` ``retrans``) of that sequence number on
    the same connection (store -> receiver) after the request, in ``(pos, msg_index)`` order.
    When the receiver's granted registration with that store names a topic (``regs``: the
    topic index of its earliest granted receiver registration with that RegID), the RETRANS
    must be of that topic too; without one, any topic does.

    ``lbtrm-nak`` / ``lbtru-nak``: each sequence number of a transport NAK (one row per entry
    of ``nak_sqns``, a null entry included), served by the first RX data of it after the NAK
    (``pos`` order) in the transport session the NAK is addressed to, or confirmed by the first
    NCF listing it (``ncf_ts_ns``, ``ncf_reason``).  The session is tshark's (see
    :func:`_session_side`): an LBT-RM NAK goes to the NAK port its header names, while the
    retransmission leaves from whatever UDP port the source sends from, and both carry that
    NAK port and the session ID in their header.  LBT-RM retransmits and confirms to the
    group, so any RX/NCF of the session counts; LBT-RU to the NAKer alone, so only those sent
    to the NAK's source address.  Datagrams quoted by ICMP errors are no traffic of their own
    and answer nothing; a NAK quoted by an ICMP port-unreachable from the same address and
    port, listing the sequence number, after the NAK, means nothing listened on the NAK port
    any more (``closed_port_ts_ns``: the first such bounce).

    ``outcome``: ``served`` (a retransmission), else ``ncf`` (confirmed, not retransmitted in
    the capture), else ``closed-port``, else ``unanswered``; ``service_us`` the time from the
    request to the retransmission; ``ncf_text`` tshark's name of the NCF reason.

    The twin of :func:`tests.spark_analysis.twin.retransmission_requests`: Spark pairs them by
    a range join and a minimum per request, here by :func:`_first_after`.
    """
    ume = _rxreq_requests(data, messages, regs)
    transport = _nak_requests(packets)
    parts = pa.schema(REQUEST_FIELDS[:REQUEST_COLUMNS.index("closed_port_ts_ns") + 1])
    table = pa.concat_tables([ume.select(parts.names).cast(parts),
                              transport.select(parts.names).cast(parts)])
    served = table.column("served_ts_ns")
    ncf = table.column("ncf_ts_ns")
    closed = table.column("closed_port_ts_ns")
    outcome = pc.if_else(pc.is_valid(served), "served",
                         pc.if_else(pc.is_valid(ncf), "ncf",
                                    pc.if_else(pc.is_valid(closed), "closed-port",
                                               "unanswered")))
    service = pc.divide(pc.subtract(served, table.column("ts_ns")).cast(pa.float64()), 1000.0)
    table = (table.append_column("outcome", outcome)
             .append_column("ncf_text", _ncf_text(table.column("ncf_reason")))
             .append_column("service_us", service))
    return _frame(table.select(REQUEST_COLUMNS).cast(pa.schema(REQUEST_FIELDS)))


def _ncf_text(reason: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """tshark's name of an NCF reason code (``wire.lbtru.NCF_REASON_TEXT``); null for a null
    or unknown code."""
    codes = pa.array(list(NCF_REASON_TEXT), reason.type)
    names = pa.array(list(NCF_REASON_TEXT.values()), pa.string())
    return pc.take(names, pc.index_in(reason, value_set=codes))


def _rxreq_requests(data: pd.DataFrame, messages: pd.DataFrame, regs: pd.DataFrame
                    ) -> pa.Table:
    """The ``ume-rxreq`` rows of :func:`retransmission_requests` (``closed_port_ts_ns`` and
    the other transport columns null)."""
    msgs = _arrow(messages, ["capture", "pos", "msg_index", "ts_ns", "file", "file_offset",
                             "src_ip", "src_port", "dst_ip", "dst_port", "ume_rxreq"])
    msgs = msgs.filter(pc.is_valid(msgs.column("ume_rxreq")))
    rx = msgs.column("ume_rxreq")
    n = msgs.num_rows
    req = pa.table({
        "capture": msgs.column("capture"), "pos": msgs.column("pos"),
        "msg_index": msgs.column("msg_index"), "ts_ns": msgs.column("ts_ns"),
        "file": msgs.column("file"), "file_offset": msgs.column("file_offset"),
        "requester_ip": msgs.column("src_ip"), "requester_port": msgs.column("src_port"),
        "responder_ip": msgs.column("dst_ip"), "responder_port": msgs.column("dst_port"),
        "request_idx": pc.struct_field(rx, "request_idx"),
        "reg_id": pc.struct_field(rx, "id_2"), "sqn": pc.struct_field(rx, "seqnum")})
    req = req.append_column("tidx", _request_topics(req, regs))

    ans = _arrow(data, ["capture", "pos", "msg_index", "ts_ns", "src_ip", "src_port", "dst_ip",
                        "dst_port", "sqn", "tidx", "message_type"])
    ans = ans.filter(pc.equal(ans.column("message_type"), "retrans"))
    served = np.full(n, _NO_MATCH, np.int64)
    # the topic must match only where the receiver's registration names one
    by_topic = pc.is_valid(req.column("tidx")).to_numpy(zero_copy_only=False)
    pairs = [("capture", "capture"), ("requester_ip", "dst_ip"), ("requester_port", "dst_port"),
             ("responder_ip", "src_ip"), ("responder_port", "src_port"), ("sqn", "sqn")]
    for topical in (False, True):
        rows = np.flatnonzero(by_topic == topical)
        part = req.take(rows)
        keys = [*pairs, ("tidx", "tidx")] if topical else pairs
        served[rows] = _first_after(
            [part.column(r) for r, _ in keys], [ans.column(a) for _, a in keys],
            [part.column("pos"), part.column("msg_index")],
            [ans.column("pos"), ans.column("msg_index")], [ans.column("ts_ns")])
    nulls_long = pa.nulls(n, pa.int64())
    return pa.table({
        "capture": req.column("capture"), "kind": pa.repeat(pa.scalar("ume-rxreq"), n),
        "ts_ns": req.column("ts_ns"), "file": req.column("file"),
        "file_offset": req.column("file_offset"), "pos": req.column("pos"),
        "requester_ip": req.column("requester_ip"),
        "requester_port": req.column("requester_port"),
        "responder_ip": req.column("responder_ip"),
        "responder_port": req.column("responder_port"), "session": pa.nulls(n, pa.string()),
        "request_idx": req.column("request_idx"), "reg_id": req.column("reg_id"),
        "tidx": req.column("tidx"), "sqn": req.column("sqn"),
        "served_ts_ns": _pick(ans.column("ts_ns"), served), "ncf_ts_ns": nulls_long,
        "ncf_reason": pa.nulls(n, pa.int32()), "closed_port_ts_ns": nulls_long})


def _request_topics(req: pa.Table, regs: pd.DataFrame) -> pa.Array:
    """For each RXREQ, the topic index of the earliest (``pos``) granted receiver
    registration with the store it is sent to, under the RegID it names (Spark's
    ``min_by(topic_idx, pos)`` per capture, store address and granted RegID; of registrations
    at the same ``pos``, the first in ``regs`` order).  Null where there is none."""
    cols = ["capture", "store_ip", "granted_reg_id", "topic_idx", "pos"]
    granted = regs.loc[(regs["role"] == "receiver").fillna(False).astype(bool)
                       & (regs["outcome"] == "granted").fillna(False).astype(bool), cols]
    granted = (granted[granted["pos"].notna()].sort_values("pos", kind="stable")
               .drop_duplicates(["capture", "store_ip", "granted_reg_id"]))
    topics = pa.Table.from_pandas(granted, preserve_index=False)
    found = _lookup(
        [req.column("capture"), req.column("responder_ip"), req.column("reg_id")],
        [topics.column("capture"), topics.column("store_ip"), topics.column("granted_reg_id")])
    return _pick(topics.column("topic_idx").cast(pa.int64()), found)


def _nak_requests(packets: pd.DataFrame) -> pa.Table:
    """The ``lbtrm-nak`` / ``lbtru-nak`` rows of :func:`retransmission_requests`."""
    cols = ["capture", "pos", "ts_ns", "file", "file_offset", "protocol", "src_ip", "src_port",
            "dst_ip", "dst_port", "packet_type", "sqn", "session_id", "ucast_port",
            "retransmission", "nak_sqns", "ncf_sqns", "ncf_reason"]
    side = _arrow(packets, cols + [c for c in ("icmp_type", "icmp_code") if c in packets])
    side = side.filter(pc.and_(
        pc.is_in(side.column("protocol"), pa.array(["lbtrm", "lbtru"])),
        pc.is_in(side.column("packet_type"), pa.array(["nak", "data", "ncf"]))))
    live = (pc.is_null(side.column("icmp_type")) if "icmp_type" in side.column_names
            else pa.array(np.ones(side.num_rows, bool)))
    kind = side.column("packet_type")
    if "icmp_type" in side.column_names and "icmp_code" in side.column_names:
        closed = pc.fill_null(pc.and_(pc.equal(side.column("icmp_type"), ICMP_DEST_UNREACHABLE),
                                      pc.equal(side.column("icmp_code"), ICMP_PORT_UNREACHABLE)),
                              False)
    else:
        closed = pa.array(np.zeros(side.num_rows, bool))
    naks = _explode(side.filter(pc.and_(pc.equal(kind, "nak"), live)), "nak_sqns")
    rx = side.filter(pc.and_(pc.and_(pc.equal(kind, "data"), live),
                             pc.fill_null(side.column("retransmission"), False)))
    rx = rx.append_column("session", _session_side(rx))
    ncfs = _explode(side.filter(pc.and_(pc.equal(kind, "ncf"), live)), "ncf_sqns")
    bounces = _explode(side.filter(pc.and_(pc.equal(kind, "nak"), closed)), "nak_sqns")
    n = naks.num_rows

    # LBT-RM retransmits and confirms to the group, LBT-RU to the NAKer alone: an answer must
    # go to the NAK's sender only on LBT-RU.  Sessions name their protocol, so an LBT-RM NAK
    # meets LBT-RM answers only, and one constant stands in for the address on that side.
    def keys(t: pa.Table, *more: pa.ChunkedArray) -> list[pa.ChunkedArray]:
        return [t.column("capture"), t.column("session"), t.column("sqn"), *more]

    def to_requester(t: pa.Table, ip: str) -> pa.ChunkedArray:
        return pc.if_else(pc.equal(t.column("protocol"), "lbtrm"), "", t.column(ip))

    nak_order = [naks.column("pos")]
    by_rx = _first_after(keys(naks, to_requester(naks, "src_ip")),
                         keys(rx, to_requester(rx, "dst_ip")),
                         nak_order, [rx.column("pos")], [rx.column("ts_ns")])
    by_ncf = _first_after(keys(naks, to_requester(naks, "src_ip")),
                          keys(ncfs, to_requester(ncfs, "dst_ip")),
                          nak_order, [ncfs.column("pos")],
                          [ncfs.column("ts_ns"), ncfs.column("ncf_reason")])
    # the ICMP error quotes the NAK itself: same sender, port and sequence numbers
    by_bounce = _first_after(
        keys(naks, naks.column("src_ip"), naks.column("src_port")),
        keys(bounces, bounces.column("src_ip"), bounces.column("src_port")),
        nak_order, [bounces.column("pos")], [bounces.column("ts_ns")])
    nulls_long = pa.nulls(n, pa.int64())
    return pa.table({
        "capture": naks.column("capture"),
        "kind": pc.binary_join_element_wise(plain(naks.column("protocol")), "-nak", ""),
        "ts_ns": naks.column("ts_ns"), "file": naks.column("file"),
        "file_offset": naks.column("file_offset"), "pos": naks.column("pos"),
        "requester_ip": naks.column("src_ip"), "requester_port": naks.column("src_port"),
        "responder_ip": naks.column("dst_ip"), "responder_port": naks.column("dst_port"),
        "session": naks.column("session"), "request_idx": nulls_long, "reg_id": nulls_long,
        "tidx": nulls_long, "sqn": naks.column("sqn"),
        "served_ts_ns": _pick(rx.column("ts_ns"), by_rx),
        "ncf_ts_ns": _pick(ncfs.column("ts_ns"), by_ncf),
        "ncf_reason": _pick(ncfs.column("ncf_reason"), by_ncf),
        "closed_port_ts_ns": _pick(bounces.column("ts_ns"), by_bounce)})


def _explode(packets: pa.Table, column: str) -> pa.Table:
    """One row per entry of the list ``column`` (renamed ``sqn``; no row for a null or empty
    list, a row for a null entry: Spark's ``explode``), with the row's ``session``."""
    lists = packets.column(column).combine_chunks()
    rows = pc.list_parent_indices(lists)
    out = packets.drop_columns([c for c in ("sqn", "nak_sqns", "ncf_sqns")
                                if c in packets.column_names]).take(rows)
    out = out.append_column("sqn", pc.list_flatten(lists))
    return out.append_column("session", _session_side(out))


def _session_side(packets: pa.Table) -> pa.Array:
    """The transport session of each LBT-RM / LBT-RU packet row, as tshark keys it
    (:func:`spark_analysis.engine.data.session_side`)."""
    session = session_side(packets).column("session")
    return session.combine_chunks() if isinstance(session, pa.ChunkedArray) else session


# =============================================================================================
# Summary
# =============================================================================================


def retransmission_summary(requests: pd.DataFrame) -> pd.DataFrame:
    """Per kind and responder (capture, kind, responder address and port, session): requests,
    distinct sequence numbers and requesters (nulls not counted), how many were served /
    NCF'd / NAKed to a closed port / unanswered, and the service time's maximum, mean and
    exact percentiles (:func:`_percentiles`, Spark's ``percentile``), in microseconds.

    The twin of :func:`tests.spark_analysis.twin.retransmission_summary`; null keys form groups
    of their own, as in Spark's ``groupBy``."""
    keys = ["capture", "kind", "responder_ip", "responder_port", "session"]
    df = requests[[*keys, "sqn", "requester_ip", "outcome", "service_us"]]
    grouped = df.groupby(keys, sort=False, observed=True, dropna=False)
    group = grouped.ngroup().to_numpy().astype(np.int64)
    groups = int(group.max()) + 1 if len(group) else 0
    first = np.unique(group, return_index=True)[1]
    out = df[keys].iloc[first].reset_index(drop=True)
    size = np.bincount(group, minlength=groups).astype(np.int64)
    outcome = df["outcome"]
    counts = {name: np.bincount(group, weights=(outcome == value).fillna(False)
                                .to_numpy(bool), minlength=groups).astype(np.int64)
              for name, value in (("served", "served"), ("ncf", "ncf"),
                                  ("closed_port", "closed-port"),
                                  ("unanswered", "unanswered"))}
    service = df["service_us"]
    has = service.notna().to_numpy()
    values = service.to_numpy(np.float64, na_value=np.nan)
    columns: dict[str, pa.Array] = {
        "requests": pa.array(size),
        "sqns": pa.array(_distinct(group, df["sqn"], groups)),
        "requesters": pa.array(_distinct(group, df["requester_ip"], groups))}
    columns.update({name: pa.array(c) for name, c in counts.items()})
    served = np.bincount(group[has], minlength=groups)
    total = np.bincount(group[has], weights=values[has], minlength=groups)
    top = np.full(groups, -np.inf)
    np.maximum.at(top, group[has], values[has])
    columns["max_us"] = pa.array(top, mask=served == 0)
    with np.errstate(invalid="ignore", divide="ignore"):
        columns["mean_us"] = pa.array(total / served, mask=served == 0)
    for p, q in zip(("p50_us", "p90_us", "p99_us"), _percentiles(group[has], values[has],
                                                               groups, PERCENTILES),
                    strict=True):
        columns[p] = pa.array(q, mask=served == 0)
    for name, values_ in columns.items():
        out[name] = pd.Series(pd.arrays.ArrowExtensionArray(values_))
    return out[SUMMARY_COLUMNS]


def _distinct(group: Int64s, values: pd.Series, groups: int) -> Int64s:
    """Distinct non-null ``values`` per group (Spark's ``countDistinct``)."""
    present = values.notna().to_numpy()
    codes = pd.factorize(values[present])[0]
    pairs = np.unique(np.stack([group[present], codes]), axis=1)
    return np.bincount(pairs[0], minlength=groups).astype(np.int64)


def _percentiles(group: Int64s, values: npt.NDArray[np.float64], groups: int,
                 percentages: Sequence[float]) -> list[npt.NDArray[np.float64]]:
    """Spark's exact ``percentile(values, p)`` per group, for each ``p``: of the group's ``n``
    values in ascending order ``v``, at position ``pos = (n - 1) * p`` (in doubles),
    ``v[lo] + (pos - lo) * (v[hi] - v[lo])`` with ``lo``/``hi`` the floor and ceiling of
    ``pos``; ``v[lo]`` itself when ``pos`` is whole or ``v[lo] == v[hi]``.  That is Spark
    4's ``PercentileBase.getPercentile`` operation for operation (older Spark computed
    ``(hi - pos) * v[lo] + (pos - lo) * v[hi]``, numpy's ``linear`` switches to
    ``v[hi] - (1 - t) * (v[hi] - v[lo])`` above ``t = 0.5``: both differ in the last bits).
    NaN where a group has no values."""
    order = np.lexsort((values, group))
    ordered = values[order]
    count = np.bincount(group, minlength=groups)
    start = np.concatenate([[0], np.cumsum(count)[:-1]]).astype(np.int64)
    empty = count == 0
    if not len(ordered):
        return [np.full(groups, np.nan) for _ in percentages]
    out = []
    for p in percentages:
        position = (count - 1).astype(np.float64) * p
        lo = np.floor(position)
        hi = np.ceil(position)
        v_lo = ordered[np.where(empty, 0, start + lo.astype(np.int64))]
        v_hi = ordered[np.where(empty, 0, start + hi.astype(np.int64))]
        with np.errstate(invalid="ignore"):
            value = np.where((lo == hi) | (v_lo == v_hi), v_lo,
                             v_lo + (position - lo) * (v_hi - v_lo))
        out.append(np.where(empty, np.nan, value))
    return out


# =============================================================================================
# Pairing
# =============================================================================================


def _first_after(request_keys: Sequence[pa.ChunkedArray | pa.Array],
                 answer_keys: Sequence[pa.ChunkedArray | pa.Array],
                 request_order: Sequence[pa.ChunkedArray | pa.Array],
                 answer_order: Sequence[pa.ChunkedArray | pa.Array],
                 answer_ties: Sequence[pa.ChunkedArray | pa.Array]) -> Int64s:
    """For each request, the row number of the first answer with equal keys whose order
    columns come strictly after the request's (lexicographically); -1 where there is none.
    A null key or order value matches nothing (SQL equality).  Of answers tied on the order,
    the one with the smallest ``answer_ties`` (lexicographically, nulls first: Spark's ``min``
    of a struct).

    One sort of requests and answers together by (key, order, answers first, ties); each
    request takes the next answer in that sort (a reverse running minimum), if it has the
    request's key."""
    n_req = len(request_keys[0])
    n_ans = len(answer_keys[0])
    if n_req == 0 or n_ans == 0:
        return np.full(n_req, _NO_MATCH, np.int64)
    key, valid = _keys(request_keys, answer_keys)
    orders: list[Int64s] = []
    for r, a in zip(request_order, answer_order, strict=True):
        both = _ints(r, a)
        valid &= both != _NULL_FIRST
        orders.append(both)
    flag = np.concatenate([np.ones(n_req, np.int64), np.zeros(n_ans, np.int64)])
    ties = [np.concatenate([np.zeros(n_req, np.int64), _ints(t, None)]) for t in answer_ties]
    rows = np.flatnonzero(valid)
    sort_keys = [k[rows] for k in (*reversed(ties), flag, *reversed(orders), key)]
    order = rows[np.lexsort(sort_keys)]
    is_answer = order >= n_req
    at = np.arange(len(order))
    nxt = np.minimum.accumulate(np.where(is_answer, at, len(order))[::-1])[::-1]
    sorted_at = np.empty(n_req + n_ans, np.int64)
    sorted_at[order] = at
    found = np.full(n_req, _NO_MATCH, np.int64)
    req_rows = rows[rows < n_req]
    cand = nxt[sorted_at[req_rows]]
    hit = cand < len(order)
    cand_rows = order[np.where(hit, cand, 0)]
    hit &= key[cand_rows] == key[req_rows]
    found[req_rows[hit]] = cand_rows[hit] - n_req
    return found


def _lookup(request_keys: Sequence[pa.ChunkedArray | pa.Array],
            answer_keys: Sequence[pa.ChunkedArray | pa.Array]) -> Int64s:
    """For each request, the row number of the first answer with equal keys (SQL equality: a
    null key matches nothing); -1 where there is none."""
    n_req = len(request_keys[0])
    n_ans = len(answer_keys[0])
    if n_req == 0 or n_ans == 0:
        return np.full(n_req, _NO_MATCH, np.int64)
    key, valid = _keys(request_keys, answer_keys)
    answers = np.flatnonzero(valid[n_req:])
    codes, first = np.unique(key[n_req:][answers], return_index=True)
    at = np.searchsorted(codes, key[:n_req])
    at = np.minimum(at, len(codes) - 1) if len(codes) else at
    hit = valid[:n_req] & (len(codes) > 0)
    if len(codes):
        hit &= codes[at] == key[:n_req]
    found = np.full(n_req, _NO_MATCH, np.int64)
    found[hit] = answers[first[at[hit]]]
    return found


def _keys(request_keys: Sequence[pa.ChunkedArray | pa.Array],
          answer_keys: Sequence[pa.ChunkedArray | pa.Array]) -> tuple[Int64s, Bools]:
    """One code per row of requests then answers for the tuple of its keys, and whether no key
    is null."""
    n = len(request_keys[0]) + len(answer_keys[0])
    key = np.zeros(n, np.int64)
    valid = np.ones(n, bool)
    for r, a in zip(request_keys, answer_keys, strict=True):
        codes = _codes(r, a)
        valid &= codes >= 0
        key = _combine(key, codes)
    return key, valid


def _codes(requests: pa.ChunkedArray | pa.Array, answers: pa.ChunkedArray | pa.Array
           ) -> Int64s:
    """Equal values get equal codes over requests then answers; null gets -1."""
    both = _chunked(requests, answers)
    encoded = dictionary_encode(both).combine_chunks()
    return pc.fill_null(encoded.indices.cast(pa.int64()), _NO_MATCH).to_numpy()


def _combine(key: Int64s, codes: Int64s) -> Int64s:
    """One code for the pair (``key``, ``codes``), dense again."""
    pair = key * (int(codes.max()) + 2) + (codes + 1)
    return np.unique(pair, return_inverse=True)[1].astype(np.int64).reshape(-1)


def _ints(requests: pa.ChunkedArray | pa.Array, answers: pa.ChunkedArray | pa.Array | None
          ) -> Int64s:
    """Integers as int64 over requests then answers, null as the smallest int64."""
    both = _chunked(requests, answers) if answers is not None else _chunked(requests)
    return pc.fill_null(both.cast(pa.int64()), _NULL_FIRST).to_numpy()


def _chunked(*parts: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray:
    kind = parts[0].type
    chunks: list[pa.Array] = []
    for part in parts:
        part = part.cast(kind) if part.type != kind else part
        chunks.extend(part.chunks if isinstance(part, pa.ChunkedArray) else [part])
    return pa.chunked_array(chunks, kind)


def _pick(values: pa.ChunkedArray | pa.Array, rows: Int64s) -> pa.Array:
    """``values[rows]``, null where ``rows`` is -1."""
    picked = pc.take(values, pa.array(rows, mask=rows < 0))
    return picked.combine_chunks() if isinstance(picked, pa.ChunkedArray) else picked


# =============================================================================================
# Tables
# =============================================================================================


def _arrow(frame: pd.DataFrame, columns: Sequence[str]) -> pa.Table:
    """The Arrow table of ``columns`` of ``frame`` (no copy for Arrow-backed columns)."""
    return pa.Table.from_pandas(frame[list(columns)], preserve_index=False)


def _frame(table: pa.Table) -> pd.DataFrame:
    return table.to_pandas(types_mapper=pd.ArrowDtype)
