"""Store registrations: who registered with which store, asking what, and what the store
answered (:func:`registrations`), and how registrations went per store and outcome
(:func:`registration_summary`).

A registration request (PREG) is answered by a PREG-RESP travelling the other way on the same
connection, with the same role (source or receiver) and the same transport and topic indexes
(:data:`_REG_KEY`).  The key alone cannot tell two pending requests apart, so responses answer
them first come, first served (:func:`_pair_by_key`).  The pairing walks the registration
messages in capture order once; they are a handful per client and store, never per data
message, and everything around the walk is whole-column Arrow.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from wire.lbmc import PregError

from .common import arrow, take_rows

__all__ = ["PREG_ERROR_TEXT", "registration_summary", "registrations"]

PREG_ERROR_TEXT: dict[int, str] = {
    PregError.ENOERROR: "No error",
    PregError.ENOPATTERN: "Store has no matching pattern",
    PregError.ESRCREGID: "Source RegID not found",
    PregError.EREGID: "RegID is in use by a receiver",
    PregError.ETOPICNAME: "Topic name does not match previous registration",
    PregError.EACTIVE: "RegID is in use by a different source",
    PregError.ECONFIG: "Source and store configuration values are incompatible",
}
"""tshark's texts for the PREG-RESP error codes (``lbmc.ume_preg_resp.code.code``)."""

_REG_KEY = ["capture", "client_ip", "client_port", "store_ip", "store_port", "role",
            "transport_idx", "topic_idx"]
"""Where a PREG-RESP looks for its PREG.  Not the marker: whether a store echoes it is not
documented (the corpus generator does not)."""

_REQUEST_CONTENT = ["requested_reg_id", "src_reg_id", "session_id", "rpp", "deregister",
                    "request_topic"]
"""A request repeating these of a pending one is a retry: it replaces it."""

_PAIR_FIELDS = pa.schema([("capture", pa.string()), ("pos", pa.int64()),
                          ("msg_index", pa.int32()), ("response_pos", pa.int64()),
                          ("response_index", pa.int32())])
"""What :func:`_pair_registrations` returns: a request's and its response's place."""

_COLUMNS = ["capture", "ts_ns", "file", "file_offset", "pos", "msg_index", "role",
            "client_ip", "client_port", "store_ip", "store_port", "source_ip", "topic",
            "transport_idx", "topic_idx", "marker", "requested_reg_id", "src_reg_id",
            "session_id", "rpp", "deregister", "proxy", "outcome", "response_ts_ns",
            "response_us", "granted_reg_id", "error_code", "error", "old_client", "no_cache",
            "rpp_granted", "low_seqnum", "high_seqnum", "store_id", "response_marker",
            "response_pos", "response_index"]
"""The columns of :func:`registrations`, in order."""

_SUMMARY_KEY = ["capture", "role", "store_ip", "outcome", "error_code", "error"]
_SUMMARY_COLUMNS = [*_SUMMARY_KEY, "requests", "clients", "topics", "old_clients",
                    "rpp_requests", "max_response_us", "first_ts_ns", "last_ts_ns"]

Column: TypeAlias = pa.Array | pa.ChunkedArray
"""An Arrow column: one array or chunks."""


# =============================================================================================
# Column helpers
# =============================================================================================


def _role(s_flag: Column) -> Column:
    """``source`` where the header's S flag is set, else (clear or null) ``receiver``."""
    return pc.if_else(pc.fill_null(s_flag, False), "source", "receiver")


def _preg_error_text(code: Column) -> Column:
    """tshark's text of a PREG-RESP error code (:data:`PREG_ERROR_TEXT`), ``Unknown error N``
    for a code it does not know, null where there is no code."""
    known = pa.array(list(PREG_ERROR_TEXT), pa.int64())
    texts = pa.array(list(PREG_ERROR_TEXT.values()), pa.string())
    named = pc.take(texts, pc.index_in(pc.cast(code, pa.int64()), value_set=known))
    unknown = pc.binary_join_element_wise("Unknown error ", pc.cast(code, pa.string()), "")
    return pc.coalesce(named, unknown)


def _spark_string(values: Column) -> Column:
    """``coalesce(cast(values as string), '')`` as Spark writes it (``true``/``false``,
    decimal digits)."""
    return pc.fill_null(pc.cast(values, pa.string()), "")


def _header(messages: pd.DataFrame, header: str, columns: dict[str, str]) -> dict[str, Column]:
    """``columns`` (``name: message column or column.field``) of the rows of ``messages``
    carrying ``header`` (a struct column; null = absent), each column taken once."""
    rows = pc.indices_nonzero(pc.is_valid(arrow(messages[header]))).to_numpy()
    kept: dict[str, Column] = {}
    taken: dict[str, Column] = {}
    for name, source in columns.items():
        column, _, field = source.partition(".")
        if column not in kept:
            kept[column] = take_rows(arrow(messages[column]), rows)
        taken[name] = pc.struct_field(kept[column], field) if field else kept[column]
    return taken


# =============================================================================================
# Pairing requests and responses
# =============================================================================================


def _group_codes(table: pa.Table, keys: list[str]) -> np.ndarray:
    """One integer per row, equal where every ``keys`` column is (nulls equal to nulls, as
    Spark's ``groupBy``), so a sort on it brings each key's rows together."""
    codes = np.zeros(table.num_rows, np.int64)
    for key in keys:
        values, _ = pd.factorize(pd.Series(table.column(key).to_pandas(
            types_mapper=pd.ArrowDtype)), use_na_sentinel=False)
        codes = codes * (int(values.max(initial=0)) + 1) + values
        # keep the codes small: renumber once the product could grow past int64
        codes = pd.factorize(codes)[0].astype(np.int64)
    return codes


def _first_come_first_served(group: np.ndarray, pos: np.ndarray, msg_index: np.ndarray,
                             request: np.ndarray, content: list[str]
                             ) -> tuple[np.ndarray, np.ndarray]:
    """The (request row, response row) pairs of registration events: in each ``group`` in
    ``(pos, msg_index)`` order (a request before a response at the same place), a response
    answers the oldest pending request; a request with the ``content`` of a pending one is a
    retry and supersedes it (the older one stays unanswered); a response with nothing pending
    answers nothing.  A queue per key cannot be a column expression, so this walks the
    events once (registration messages, few per client and store)."""
    order = np.lexsort((~request, msg_index, pos, group))
    pairs_request: list[int] = []
    pairs_response: list[int] = []
    pending: dict[str, int] = {}
    current = None
    for row, key, is_request in zip(order.tolist(), group[order].tolist(),
                                    request[order].tolist(), strict=True):
        if key != current:
            pending.clear()
            current = key
        if is_request:
            pending.pop(content[row], None)
            pending[content[row]] = row
        elif pending:
            pairs_request.append(pending.pop(next(iter(pending))))
            pairs_response.append(row)
    return np.array(pairs_request, np.int64), np.array(pairs_response, np.int64)


def _pairs(events: pa.Table, group: np.ndarray) -> pa.Table:
    if events.num_rows == 0:
        return _PAIR_FIELDS.empty_table()
    requests, responses = _first_come_first_served(
        group, events.column("pos").to_numpy(), events.column("msg_index").to_numpy(),
        events.column("request").to_numpy(zero_copy_only=False).astype(bool),
        events.column("content").to_pylist())
    return pa.table({
        "capture": pc.take(events.column("capture"), responses),
        "pos": pc.take(events.column("pos"), requests),
        "msg_index": pc.take(events.column("msg_index"), requests),
        "response_pos": pc.take(events.column("pos"), responses),
        "response_index": pc.take(events.column("msg_index"), responses)}, _PAIR_FIELDS)


def _pair_registrations(events: pa.Table) -> pa.Table:
    """Pair the requests and responses of one connection/role/index key, first come first
    served.  The key alone cannot tell two requests apart (a receiver registering two
    sources' topics that share a transport and topic index), so responses answer pending
    requests in order; a request identical to a pending one is a retry and supersedes it (the
    older one stays unanswered).  (Arrow in, Arrow out: Spark's ``applyInArrow`` calls it per
    key.)  ``events`` has ``capture``, ``pos``, ``msg_index``, ``request`` (bool) and
    ``content`` (:data:`_REQUEST_CONTENT` joined)."""
    return _pairs(events, np.zeros(events.num_rows, np.int64))


def _pair_by_key(events: pa.Table) -> pa.Table:
    """:func:`_pair_registrations` over every :data:`_REG_KEY` group of ``events`` at once
    (what ``groupBy(*_REG_KEY).applyInArrow`` does, in one process)."""
    return _pairs(events, _group_codes(events, _REG_KEY))


# =============================================================================================
# Registrations
# =============================================================================================


def _requests(messages: pd.DataFrame) -> dict[str, Column]:
    req = _header(messages, "ume_preg", {
        "capture": "capture", "pos": "pos", "msg_index": "msg_index", "ts_ns": "ts_ns",
        "file": "file", "file_offset": "file_offset", "client_ip": "src_ip",
        "client_port": "src_port", "store_ip": "dst_ip", "store_port": "dst_port",
        "s_flag": "ume_preg.s_flag", "marker": "ume_preg.marker",
        "transport_idx": "ume_preg.transport_idx", "topic_idx": "ume_preg.topic_idx",
        "requested_reg_id": "ume_preg.reg_id", "src_reg_id": "ume_preg.src_reg_id",
        "rpp": "ume_preg.w_flag", "deregister": "ume_preg.d_flag", "proxy": "ume_preg.p_flag",
        "request_topic": "topic_name", "sid": "ume_sid.sid"})
    req["role"] = _role(req.pop("s_flag"))
    req["session_id"] = pc.cast(req.pop("sid"), pa.string())
    return req


def _responses(messages: pd.DataFrame) -> dict[str, Column]:
    resp = _header(messages, "ume_preg_resp", {
        "capture": "capture", "response_pos": "pos", "response_index": "msg_index",
        "response_ts_ns": "ts_ns", "client_ip": "dst_ip", "client_port": "dst_port",
        "store_ip": "src_ip", "store_port": "src_port", "s_flag": "ume_preg_resp.s_flag",
        "response_marker": "ume_preg_resp.marker",
        "transport_idx": "ume_preg_resp.transport_idx",
        "topic_idx": "ume_preg_resp.topic_idx", "response_reg_id": "ume_preg_resp.reg_id",
        "error_flag": "ume_preg_resp.e_flag", "error_code": "ume_preg_resp.error_code",
        "old_client": "ume_preg_resp.o_flag", "no_cache": "ume_preg_resp.n_flag",
        "rpp_granted": "ume_preg_resp.w_flag", "low_seqnum": "ume_preg_resp.low_seqnum",
        "high_seqnum": "ume_preg_resp.high_seqnum", "store_id": "ume_storeid.store_id"})
    resp["role"] = _role(resp.pop("s_flag"))
    return resp


def _answers(req: dict[str, Column], resp: dict[str, Column]) -> pa.Array:
    """For each request, the row of the response that answers it (null: none)."""
    n_req = len(req["pos"])
    n_resp = len(resp["response_pos"])
    events = pa.table({
        **{k: _concat(req[k], resp[k]) for k in _REG_KEY},
        "pos": _concat(req["pos"], resp["response_pos"]),
        "msg_index": _concat(req["msg_index"], resp["response_index"]),
    })
    content = pc.binary_join_element_wise(*[_spark_string(req[c]) for c in _REQUEST_CONTENT],
                                          "/").to_pylist() + [""] * n_resp
    request = np.arange(n_req + n_resp) < n_req
    requests, responses = _first_come_first_served(
        _group_codes(events, _REG_KEY), events.column("pos").to_numpy(),
        events.column("msg_index").to_numpy(), request, content)
    answer = np.full(n_req, -1, np.int64)
    answer[requests] = responses - n_req
    return pa.array(answer, mask=answer < 0)


def _chunks(values: Column) -> list[pa.Array]:
    if isinstance(values, pa.ChunkedArray):
        return [values.combine_chunks()]
    return [values]


def _concat(first: Column, second: Column) -> pa.ChunkedArray:
    return pa.chunked_array([pa.concat_arrays(_chunks(first) + _chunks(second))])


def registrations(messages: pd.DataFrame) -> pd.DataFrame:
    """Who registered with which store, asking what, and what did the store answer? (timeline)

    One row per registration request (PREG), source or receiver, with its response
    (PREG-RESP) when the capture has it.  A response answers a request on the same
    connection (client and store address and port) with the same role, transport index and
    topic index; of several pending there, the oldest (first come, first served), a retry
    (the same request content again while one is pending) replacing the earlier request,
    which stays unanswered.  Columns: the request (requested RegID, the source RegID a
    receiver names, UME session ID, RPP, deregister and proxy flags, the topic of a source's
    registration), the answer (``outcome`` granted, error or unanswered; granted RegID, error
    code and tshark's text, old-client, no-cache and RPP flags, the store's low/high sequence
    numbers, store ID) and the response time in microseconds.

    ``source_ip``/``topic`` of a receiver's registration come from the source registration
    the same store granted with the RegID the receiver names (``src_reg_id``); of several
    such grants, the earliest in capture order.  A source's are its own address and topic.

    ``messages`` has the message columns and the header struct columns ``ume_preg``,
    ``ume_preg_resp``, ``ume_sid`` and ``ume_storeid`` (null where the header is absent):
    all messages or the control messages alone (``Inputs.registrations``): only those with
    a PREG or PREG-RESP are read.
    """
    req = _requests(messages)
    resp = _responses(messages)
    answer = _answers(req, resp)
    for name in ("response_pos", "response_index", "response_ts_ns", "response_marker",
                 "response_reg_id", "error_flag", "error_code", "old_client", "no_cache",
                 "rpp_granted", "low_seqnum", "high_seqnum", "store_id"):
        req[name] = pc.take(resp[name], answer)
    answered = pc.is_valid(answer)
    req["outcome"] = pc.if_else(pc.invert(answered), "unanswered",
                                pc.if_else(pc.fill_null(req.pop("error_flag"), False),
                                           "error", "granted"))
    granted = pc.equal(req["outcome"], "granted")
    req["granted_reg_id"] = pc.if_else(granted, req.pop("response_reg_id"),
                                       pa.scalar(None, pa.int64()))
    req["error"] = _preg_error_text(req["error_code"])
    req["response_us"] = pc.divide(pc.cast(pc.subtract(req["response_ts_ns"], req["ts_ns"]),
                                           pa.float64()), 1000.0)
    source = pc.equal(req["role"], "source")
    keys = pa.table({k: req[k] for k in ("capture", "store_ip", "src_reg_id")})
    named = keys.to_pandas(types_mapper=pd.ArrowDtype).merge(
        _named_sources(req, pc.and_(source, granted)), how="left",
        on=["capture", "store_ip", "src_reg_id"])
    req["source_ip"] = pc.if_else(source, req["client_ip"], arrow(named["named_source_ip"]))
    req["topic"] = pc.if_else(source, req["request_topic"], arrow(named["named_topic"]))
    return pa.table({k: req[k] for k in _COLUMNS}).to_pandas(types_mapper=pd.ArrowDtype)


def _named_sources(req: dict[str, Column], granted_source: Column) -> pd.DataFrame:
    """Per store and granted source RegID, the address and topic of the granted source
    registration earliest in capture order (``pos``, then ``msg_index``): what a receiver's
    ``src_reg_id`` names.  (Keys with a null never match a receiver's: left out.)"""
    grants = pa.table({k: req[k] for k in ("capture", "store_ip", "granted_reg_id", "pos",
                                           "msg_index", "client_ip", "request_topic")})
    grants = grants.filter(granted_source).to_pandas(types_mapper=pd.ArrowDtype)
    grants = grants.dropna(subset=["capture", "store_ip", "granted_reg_id"])
    first = (grants.sort_values(["pos", "msg_index"], kind="stable")
             .drop_duplicates(["capture", "store_ip", "granted_reg_id"]))
    return first.rename(columns={"granted_reg_id": "src_reg_id",
                                 "client_ip": "named_source_ip",
                                 "request_topic": "named_topic"}
                        )[["capture", "store_ip", "src_reg_id", "named_source_ip",
                           "named_topic"]]


def registration_summary(regs: pd.DataFrame) -> pd.DataFrame:
    """How did registrations go, per role, store and outcome (and error)?

    ``requests``, distinct ``clients`` (hosts) and ``topics`` (transport index, topic index
    and source address, none null), how many were granted to an old (returning) client and
    asked for RPP, the longest response time and the first and last request.  Null keys
    (a store address, an error code) form their own groups, as in Spark's ``groupBy``."""
    t = pa.Table.from_pandas(regs[["capture", "role", "store_ip", "outcome", "error_code",
                                   "error", "client_ip", "transport_idx", "topic_idx",
                                   "source_ip", "old_client", "rpp", "response_us",
                                   "ts_ns"]], preserve_index=False)
    # a topic as one value, null if any part is: the two integers cannot hold the separator
    topic = pc.binary_join_element_wise(pc.cast(t["transport_idx"], pa.string()),
                                        pc.cast(t["topic_idx"], pa.string()),
                                        pc.cast(t["source_ip"], pa.string()), "|",
                                        null_handling="emit_null")
    t = t.append_column("_topic", topic)
    t = t.append_column("_old", pc.cast(pc.fill_null(t["old_client"], False), pa.int64()))
    t = t.append_column("_rpp", pc.cast(pc.fill_null(t["rpp"], False), pa.int64()))
    only_valid = pc.CountOptions(mode="only_valid")
    out = t.group_by(_SUMMARY_KEY, use_threads=False).aggregate([
        ([], "count_all"),
        ("client_ip", "count_distinct", only_valid),
        ("_topic", "count_distinct", only_valid),
        ("_old", "sum"), ("_rpp", "sum"),
        ("response_us", "max"), ("ts_ns", "min"), ("ts_ns", "max")])
    out = out.rename_columns([{
        "count_all": "requests", "client_ip_count_distinct": "clients",
        "_topic_count_distinct": "topics", "_old_sum": "old_clients",
        "_rpp_sum": "rpp_requests", "response_us_max": "max_response_us",
        "ts_ns_min": "first_ts_ns", "ts_ns_max": "last_ts_ns"}.get(n, n)
        for n in out.column_names])
    return out.select(_SUMMARY_COLUMNS).to_pandas(types_mapper=pd.ArrowDtype)
