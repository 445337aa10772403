"""What a conformance reviewer wants flagged: :func:`anomalies` (one row per finding, with a
subject and a detail in words) and :func:`anomaly_summary` (how many of each kind, when
first, one example).

The subjects and details are the Spark SQL version's strings byte for byte, so their text
follows Spark's rules: a number prints as its decimal digits, ``concat`` is null when any
part is, ``concat_ws`` skips null parts (an all-null one is the empty string) and
``array_join`` skips null elements.  Missing values print as ``?`` where the Spark version
says so (:func:`_s`).  The strings are built with ``pyarrow.compute`` over whole columns of
the few flagged rows; the big tables (packets, messages, flags, stability ACKs) are only
filtered: each test reads the one or two columns it needs (an Arrow mask made positions),
and only the flagged rows of only the columns an anomaly prints are taken, chunk by chunk
(:func:`~spark_analysis.engine.common.take_rows`: a ``take`` on a chunked column would first
copy all of it into one).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeAlias

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_analysis.engine.common import (
    arrow,
    closed_port,
    plain,
    series,
    session_key,
    take_rows,
)
from spark_analysis.engine.sequence import sequence_events

ANOMALY_COLUMNS = ["capture", "severity", "kind", "ts_ns", "file", "file_offset", "subject",
                   "detail"]
"""One anomaly: where (capture, time, file and offset of the frame), how bad, what kind, who
(``subject``) and what exactly (``detail``)."""

ANOMALY_SCHEMA = pa.schema([("capture", pa.string()), ("severity", pa.string()),
                            ("kind", pa.string()), ("ts_ns", pa.int64()),
                            ("file", pa.string()), ("file_offset", pa.int64()),
                            ("subject", pa.string()), ("detail", pa.string())])
"""The Arrow types of :data:`ANOMALY_COLUMNS`."""

SUMMARY_COLUMNS = ["capture", "severity", "kind", "count", "first_ts_ns", "example_subject",
                   "example_detail", "example_file", "example_file_offset"]
"""The columns of :func:`anomaly_summary`, in output order."""

Column: TypeAlias = pa.Array | pa.ChunkedArray
"""An Arrow column."""

Text: TypeAlias = pa.Array | pa.ChunkedArray | str
"""A string column or a literal (broadcast) in the string builders below."""


# ---------------------------------------------------------------------------------------------
# Spark's string functions over Arrow columns
# ---------------------------------------------------------------------------------------------

def _str(values: Column) -> Column:
    """``CAST(values AS STRING)``: integers as decimal digits, booleans as ``true``/``false``,
    nulls stay null."""
    return values if pa.types.is_string(values.type) else pc.cast(values, pa.string())


def _s(values: Column) -> Column:
    """A column as text, ``?`` where it is null (who or what is unknown, not absent)."""
    return pc.coalesce(_str(values), pa.scalar("?"))


def _concat(*parts: Text) -> Column:
    """Spark's ``concat``: the parts one after the other, null when any part is."""
    return pc.binary_join_element_wise(*(p if isinstance(p, str) else plain(p) for p in parts),
                                       "", null_handling="emit_null")


def _concat_ws(sep: str, *parts: Text) -> Column:
    """Spark's ``concat_ws``: the non-null parts joined by ``sep`` (empty ones kept), never
    null (the empty string when every part is).  Folded pair by pair:
    ``binary_join_element_wise(..., null_handling="skip")`` would do it in one call, but
    drops the rows whose parts are all null (pyarrow 26) instead of giving ``""``."""
    out: Text = parts[0]
    for part in parts[1:]:
        if isinstance(out, str) and isinstance(part, str):
            out = out + sep + part
        elif isinstance(part, str):
            out = pc.coalesce(_concat(out, sep, part), pa.scalar(part))
        elif isinstance(out, str):
            out = pc.coalesce(_concat(out, sep, part), pa.scalar(out))
        else:
            out = pc.coalesce(_concat(out, sep, part), out, part)
    if isinstance(out, str):
        raise ValueError("_concat_ws needs at least one column")
    return pc.fill_null(out, "")


def _array_join(lists: Column, sep: str) -> pa.Array:
    """Spark's ``array_join(lists, sep)``: the elements as text joined by ``sep``, null
    elements skipped (``pc.binary_join`` would make the whole row null); a null list stays
    null, an empty one is ``""``."""
    if isinstance(lists, pa.ChunkedArray):
        lists = lists.combine_chunks()
    parents = pc.list_parent_indices(lists).to_numpy()
    values = pc.list_flatten(lists)
    keep = pc.is_valid(values).to_numpy(zero_copy_only=False)
    counts = np.bincount(parents[keep], minlength=len(lists))
    offsets = pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32))
    texts = _str(values.filter(pa.array(keep)))
    joined = pc.binary_join(pa.ListArray.from_arrays(offsets, texts), sep)
    return pc.if_else(pc.is_valid(lists), joined, pa.scalar(None, pa.string()))


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------

def _valid(mask: pd.Series) -> np.ndarray:
    """A boolean condition as Spark's ``where`` reads it: null is false."""
    return mask.fillna(False).to_numpy(dtype=bool)


def _where(mask: Column) -> np.ndarray:
    """The positions where an Arrow boolean column is true (null is false, as Spark's
    ``where`` reads it), ascending."""
    return pc.indices_nonzero(mask).to_numpy().astype(np.int64)


def _present(table: pd.DataFrame, name: str) -> Column:
    """Whether column ``name`` of ``table`` is not null (read from the validity bitmap; a
    struct column: whether the header is there)."""
    return pc.is_valid(arrow(table[name]))


def _chunks(values: Column) -> list[pa.Array]:
    """The arrays of a column (itself if not chunked), as strings."""
    arrays = values.chunks if isinstance(values, pa.ChunkedArray) else [values]
    return [array.cast(pa.string()) for array in arrays]


def _rows(table: pd.DataFrame, rows: np.ndarray, columns: Sequence[str]) -> pd.DataFrame:
    """``columns`` (each once, in order) of ``table`` at the ascending positions ``rows``:
    a small frame of the flagged rows, the other columns of the big table left alone."""
    index = pd.RangeIndex(len(rows))
    return pd.DataFrame({name: series(take_rows(arrow(table[name]), rows), index)
                         for name in dict.fromkeys(columns)}, index=index)


def _anomaly(rows: pd.DataFrame, severity: str, kind: str | Column,
             subject: Text, detail: Text) -> pa.Table:
    """The anomaly of each row: its place (capture, ts_ns, file, file_offset), ``severity``
    and ``kind`` (a literal or a column) and the given subject and detail."""
    n = len(rows)

    def column(values: Text, typ: pa.DataType) -> Column:
        if isinstance(values, str):
            return pa.repeat(pa.scalar(values, typ), n)
        return values.cast(typ)

    place = {name: arrow(rows[name]).cast(ANOMALY_SCHEMA.field(name).type)
             for name in ("capture", "ts_ns", "file", "file_offset")}
    return pa.table({"capture": place["capture"],
                     "severity": column(severity, pa.string()),
                     "kind": column(kind, pa.string()),
                     "ts_ns": place["ts_ns"], "file": place["file"],
                     "file_offset": place["file_offset"],
                     "subject": column(subject, pa.string()),
                     "detail": column(detail, pa.string())}, schema=ANOMALY_SCHEMA)


def _col(rows: pd.DataFrame, name: str) -> Column:
    return arrow(rows[name])


_SOURCE_TOPIC = ["capture", "source_ip", "tidx"]


def _unmatched(acks: pd.DataFrame, who: str) -> pd.DataFrame:
    """The ACKs that matched no send (``send_ts_ns`` null) and name a source, with the
    columns :func:`_unsent_acks` prints (``who`` sent the ACK)."""
    pick = _where(pc.and_(pc.is_null(arrow(acks["send_ts_ns"])),
                          _present(acks, "source_ip")))
    to = "store_ip" if who == "receiver_ip" else "source_ip"
    return _rows(acks, pick, [*_SOURCE_TOPIC, "sqn", who, to, "ts_ns", "file",
                              "file_offset"])


def _lowest_sends(sends: pd.DataFrame, unmatched: Sequence[pd.DataFrame]) -> pd.DataFrame:
    """The lowest sequence number sent per source topic (``low_sqn``; null if none has one),
    for the source addresses of the ``unmatched`` ACKs only (no other source topic is
    asked for: the sends of the others are not grouped).  Source topics with a null key are
    left out: they join nothing."""
    ips = arrow(sends["source_ip"])
    wanted = pc.unique(pa.chunked_array(
        [plain(chunk) for acks in unmatched for chunk in _chunks(arrow(acks["source_ip"]))],
        pa.string()))
    mine = _where(pc.is_in(ips, value_set=wanted))
    return (_rows(sends, mine, [*_SOURCE_TOPIC, "sqn"])
            .groupby(_SOURCE_TOPIC, sort=False, observed=True, dropna=True)["sqn"]
            .min().rename("low_sqn").reset_index())


def _unsent_acks(lows: pd.DataFrame, acks: pd.DataFrame, name: str, who: str) -> pa.Table:
    """``ack-for-unsent-sqn``: ACKs (of ``name``, from ``who``; the rows of
    :func:`_unmatched`) that matched no earlier send of their source topic, for a number at or
    above the lowest that source topic sent in the capture (``lows``, :func:`_lowest_sends`;
    below it, the capture start explains the miss).  Null keys match nothing, as in the
    Spark join."""
    rows = acks.merge(lows, on=_SOURCE_TOPIC, how="inner")
    rows = rows.loc[_valid(rows["sqn"] >= rows["low_sqn"])]
    to = "store_ip" if who == "receiver_ip" else "source_ip"
    return _anomaly(
        rows, "error", "ack-for-unsent-sqn",
        _concat_ws(" ", name, "ACK from", _s(_col(rows, who)), "to", _s(_col(rows, to))),
        _concat("source ", _s(_col(rows, "source_ip")), " topic index ",
                _s(_col(rows, "tidx")), " sqn ", _s(_col(rows, "sqn")),
                " was not sent before the ACK"))


def _reg_subject(rows: pd.DataFrame) -> Column:
    """``source registration of 10.0.1.1 at store 10.0.3.1:14567``."""
    return _concat_ws(" ", _col(rows, "role"), "registration of", _s(_col(rows, "client_ip")),
                      "at store", _concat_ws(":", _s(_col(rows, "store_ip")),
                                             _s(_col(rows, "store_port"))))


def _identity(rows: pd.DataFrame) -> pd.Series:
    """Who a registration is for: ``client_ip/role/topic_idx`` (null parts left out)."""
    text = _concat_ws("/", _col(rows, "client_ip"), _col(rows, "role"),
                      _str(_col(rows, "topic_idx")))
    return pd.Series(pd.arrays.ArrowExtensionArray(text), index=rows.index)


def _registration_anomalies(regs: pd.DataFrame) -> list[pa.Table]:
    """``registration-error``, ``registration-unanswered``, ``regid-reuse`` (a PREG asking
    a store for a RegID the store granted to another client: one row per such holder) and
    ``regid-conflict`` (each grant of a RegID the store granted to more than one client;
    grants with a null store or RegID group together, as in a Spark window)."""
    out = []
    errors = regs.loc[_valid(regs["outcome"] == "error")]
    out.append(_anomaly(errors, "error", "registration-error", _reg_subject(errors),
                        _concat("error ", _s(_col(errors, "error_code")), ": ",
                                _s(_col(errors, "error")), " (RegID ",
                                _s(_col(errors, "requested_reg_id")), ")")))
    unanswered = regs.loc[_valid(regs["outcome"] == "unanswered")]
    out.append(_anomaly(unanswered, "warning", "registration-unanswered",
                        _reg_subject(unanswered),
                        _concat("no PREG-RESP in the capture (RegID ",
                                _s(_col(unanswered, "requested_reg_id")), ")")))

    keys = ["capture", "store_ip", "requested_reg_id"]
    grants = regs.loc[_valid(regs["outcome"] == "granted")]
    grants = grants.assign(holder=_identity(grants))
    granted = (grants[["capture", "store_ip", "granted_reg_id", "holder"]]
               .rename(columns={"granted_reg_id": "requested_reg_id"})
               .dropna(subset=keys).drop_duplicates())
    askers = regs.loc[_valid(regs["requested_reg_id"] > 0)]
    askers = askers.assign(asker=_identity(askers)).dropna(subset=keys)
    asked = askers.merge(granted, on=keys, how="inner")
    asked = asked.loc[_valid(asked["holder"] != asked["asker"])]
    out.append(_anomaly(asked, "error", "regid-reuse", _reg_subject(asked),
                        _concat("asks for RegID ", _s(_col(asked, "requested_reg_id")),
                                ", which this store granted to ", _s(_col(asked, "holder")))))

    holders = (grants.groupby(["capture", "store_ip", "granted_reg_id"], sort=False,
                              observed=True, dropna=False)["holder"].transform("nunique"))
    conflicts = grants.loc[_valid(holders > 1)]
    counts = pa.array(holders.loc[conflicts.index].to_numpy(dtype=np.int64), pa.int32())
    out.append(_anomaly(conflicts, "error", "regid-conflict", _reg_subject(conflicts),
                        _concat("store granted RegID ", _s(_col(conflicts, "granted_reg_id")),
                                " to ", _s(counts), " different clients")))
    return out


def _orphan_responses(messages: pd.DataFrame, regs: pd.DataFrame) -> pa.Table:
    """``unsolicited-registration-response``: PREG-RESPs no registration was paired with
    (an anti-join on capture, position and message index; null keys match nothing)."""
    keys = ["capture", "pos", "msg_index"]
    resp = _rows(messages, _where(_present(messages, "ume_preg_resp")),
                 [*keys, "ts_ns", "file", "file_offset", "src_ip", "src_port", "dst_ip",
                  "dst_port", "ume_preg_resp"])
    answered = (regs.loc[_valid(regs["response_pos"].notna()),
                         ["capture", "response_pos", "response_index"]]
                .set_axis(keys, axis=1).dropna().drop_duplicates())
    joined = resp[keys].merge(answered.assign(_answered=True), on=keys, how="left")
    orphans = resp.loc[joined["_answered"].isna().to_numpy()]
    reg_id = pc.struct_field(arrow(orphans["ume_preg_resp"]), "reg_id")
    return _anomaly(
        orphans, "warning", "unsolicited-registration-response",
        _concat_ws(" ", "store", _concat_ws(":", _s(_col(orphans, "src_ip")),
                                            _s(_col(orphans, "src_port"))),
                   "to", _concat_ws(":", _s(_col(orphans, "dst_ip")),
                                    _s(_col(orphans, "dst_port")))),
        _concat("PREG-RESP for RegID ", _str(reg_id), " answers no request in the capture"))


def _lost_requests(requests: pd.DataFrame) -> pa.Table:
    """``retransmission-unanswered``: requests neither served, NCF'd nor bounced."""
    lost = _rows(requests,
                 _where(pc.equal(arrow(requests["outcome"]), "unanswered")),
                 ["capture", "ts_ns", "file", "file_offset", "kind", "requester_ip",
                  "responder_ip", "responder_port", "sqn"])
    return _anomaly(
        lost, "warning", "retransmission-unanswered",
        _concat_ws(" ", _col(lost, "kind"), "from", _s(_col(lost, "requester_ip")), "to",
                   _concat_ws(":", _s(_col(lost, "responder_ip")),
                              _s(_col(lost, "responder_port")))),
        _concat("sqn ", _s(_col(lost, "sqn")), " neither retransmitted nor confirmed"))


def _bounced_naks(packets: pd.DataFrame) -> pa.Table:
    """``nak-to-closed-port``: transport NAKs an ICMP port-unreachable quotes, with the
    session they were for (a NAK's session side: its destination address, and the header's
    NAK port for LBT-RM, the destination port for LBT-RU).  Only the quoted datagrams (the
    few with an ICMP type) are looked at."""
    if "icmp_type" not in packets.columns:
        return ANOMALY_SCHEMA.empty_table()
    quoted = _rows(packets, _where(_present(packets, "icmp_type")),
                   ["capture", "ts_ns", "file", "file_offset", "protocol", "packet_type",
                    "src_ip", "src_port", "dst_ip", "dst_port", "ucast_port", "session_id",
                    "nak_sqns", "icmp_type", "icmp_code"])
    bounced = quoted.loc[_valid(closed_port(quoted) & (quoted["packet_type"] == "nak"))]
    rm = _valid(bounced["protocol"] == "lbtrm")
    port = bounced["ucast_port"].where(rm, bounced["dst_port"])
    session = session_key(bounced["protocol"], bounced["dst_ip"], port, bounced["session_id"])
    return _anomaly(
        bounced, "error", "nak-to-closed-port",
        _concat_ws(" ", _col(bounced, "protocol"), "NAK from",
                   _concat_ws(":", _s(_col(bounced, "src_ip")), _s(_col(bounced, "src_port"))),
                   "to",
                   _concat_ws(":", _s(_col(bounced, "dst_ip")), _s(_col(bounced, "dst_port")))),
        _concat("ICMP port unreachable: nothing listens on the NAK port of session ",
                _s(arrow(session)), " (the source is gone); NAKed sqns ",
                _s(_array_join(_col(bounced, "nak_sqns"), " "))))


def _malformed(table: pd.DataFrame, what: str) -> pa.Table:
    """``malformed`` packets or messages (``what``), the reason as the detail."""
    bad = _rows(table, _where(_present(table, "malformed_reason")),
                ["capture", "ts_ns", "file", "file_offset", "protocol", "src_ip",
                 "malformed_reason"])
    return _anomaly(bad, "error", "malformed",
                    _concat_ws(" ", _col(bad, "protocol"), f"{what} from",
                               _s(_col(bad, "src_ip"))),
                    _col(bad, "malformed_reason"))


def sequence_anomalies(flags: pd.DataFrame) -> pa.Table:
    """The ``gap``, ``out-of-order`` and ``duplicate`` events of the sequence flags
    (:func:`~spark_analysis.engine.sequence.sequence_events`: one item can be several), each
    a warning: ``topic lbtrm:10.0.1.1:14390 to 224.10.10.10:14400 tidx 1`` / ``sqn 3, size
    2``.  Unlike the other subjects, the stream's null parts are left out, not printed as
    ``?``, and a null number makes the detail null.  Only the flagged items (a gap, out of
    order or a duplicate) are handed to ``sequence_events``, in their order.  Found on its
    own as soon as the verdicts are (:mod:`.run`), like :func:`packet_anomalies`."""
    flagged = pc.or_kleene(pc.or_kleene(pc.greater(arrow(flags["sqn_gap"]), 0),
                                        pc.greater(arrow(flags["ooo_gap"]), 0)),
                           arrow(flags["duplicate"]))
    rows = sequence_events(_rows(flags, _where(flagged), list(flags.columns)))
    subject = _concat_ws(
        " ", _col(rows, "level"),
        _concat_ws(":", _col(rows, "protocol"), _col(rows, "source_ip"),
                   _str(_col(rows, "source_port"))),
        "to", _concat_ws(":", _col(rows, "dest_ip"), _str(_col(rows, "dest_port"))),
        _concat("tidx ", _str(_col(rows, "tidx"))))
    return _anomaly(rows, "warning", _col(rows, "event"), subject,
                    _concat("sqn ", _str(_col(rows, "sqn")), ", size ",
                            _str(_col(rows, "size"))))


def anomalies(packets: pd.DataFrame, messages: pd.DataFrame, sends: pd.DataFrame,
              regs: pd.DataFrame, stability: pd.DataFrame, consumption: pd.DataFrame,
              requests: pd.DataFrame, flags: pd.DataFrame) -> pd.DataFrame:
    """What would a conformance reviewer want flagged?

    ``error``s: ``ack-for-unsent-sqn`` (a stability or consumption ACK for a sequence number
    no send of that source topic carried before it, where the capture holds that source
    topic's data from that number or earlier, so the capture start does not explain it);
    ``registration-error`` (a PREG-RESP with the error flag); ``regid-reuse`` (a PREG asking
    a store for a RegID that store granted to a different client: another host, role or
    topic); ``regid-conflict`` (a store granting one RegID to different clients);
    ``nak-to-closed-port`` (a transport NAK quoted back in an ICMP port-unreachable: nobody
    listens on the session's NAK port, the source is gone and will repair nothing, so the
    receivers are left with the stores); ``malformed`` packets and messages (``messages`` may
    be the control messages alone, ``Inputs.flagged``: only the malformed and the PREG-RESPs
    are read).  ``warning``s:
    ``registration-unanswered``, ``unsolicited-registration-response``,
    ``retransmission-unanswered`` (an RXREQ or NAKed number neither retransmitted nor NCF'd
    nor bounced off a closed port) and the ``gap``, ``out-of-order`` and ``duplicate``
    events of ``flags`` (the sequence verdicts, with their ``seen`` column or without).

    Each kind is a filter of its input and a few string columns built over the flagged rows
    only (see the module docstring for the rules of the text).  Columns:
    :data:`ANOMALY_COLUMNS`; row order is not meaningful.
    """
    return combined_anomalies(packet_anomalies(packets), sequence_anomalies(flags), messages,
                              sends, regs, stability, consumption, requests)


def packet_anomalies(packets: pd.DataFrame) -> pa.Table:
    """The anomalies of :func:`anomalies` that only ``packets`` shows (``nak-to-closed-port``
    and malformed packets): found on their own, as soon as the packets are read, so that
    the packets table is let go before the ACK analyses run (:mod:`.run`)."""
    return pa.concat_tables([_bounced_naks(packets), _malformed(packets, "packet")])


def combined_anomalies(from_packets: pa.Table, from_sequence: pa.Table,
                       messages: pd.DataFrame, sends: pd.DataFrame, regs: pd.DataFrame,
                       stability: pd.DataFrame, consumption: pd.DataFrame,
                       requests: pd.DataFrame, *, shared: bool = True) -> pd.DataFrame:
    """:func:`anomalies` given what :func:`packet_anomalies` and :func:`sequence_anomalies`
    found; without the :func:`shared_anomalies` when ``shared`` is false (one part of a
    capture analysed in parts: :mod:`spark_analysis.engine.owners`)."""
    unmatched = [_unmatched(stability, "store_ip"), _unmatched(consumption, "receiver_ip")]
    lows = _lowest_sends(sends, unmatched)
    parts = [_unsent_acks(lows, unmatched[0], "stability", "store_ip"),
             _unsent_acks(lows, unmatched[1], "consumption", "receiver_ip"),
             _lost_requests(requests),
             from_packets,
             from_sequence]
    if shared:
        parts.append(shared_anomalies(messages, regs))
    return pa.concat_tables(parts).to_pandas(types_mapper=pd.ArrowDtype)


def shared_anomalies(messages: pd.DataFrame, regs: pd.DataFrame) -> pa.Table:
    """The anomalies of :func:`anomalies` that the registrations and the flagged control
    messages (``messages``) show alone: the same for every part of a capture, so found once."""
    return pa.concat_tables([*_registration_anomalies(regs), _orphan_responses(messages, regs),
                             _malformed(messages, "message")])


def anomaly_summary(found: pd.DataFrame) -> pd.DataFrame:
    """How many of each anomaly (per capture, severity and kind), when first, and one
    example of each.

    The example is the earliest anomaly of its kind (Spark's ``min_by`` on ``ts_ns``: rows
    without a time are passed over; a kind none of whose rows has a time has a null example).
    Among anomalies at the same earliest time Spark takes whichever its partitions give last;
    here the choice is fixed: the lowest file and file offset (the first frame), then
    subject and detail.  Null keys group together.  Columns: :data:`SUMMARY_COLUMNS`.
    """
    keys = ["capture", "severity", "kind"]
    order: Sequence[str] = ["ts_ns", "file", "file_offset", "subject", "detail"]
    group = found.groupby(keys, sort=False, observed=True, dropna=False).ngroup().to_numpy()
    # each group's rows in example order, rows without a time last: its first row gives the
    # keys, the first time and the example (none if even that row has no time)
    first = (found[[*keys, *order]].assign(_group=group)
             .sort_values(["_group", *order], na_position="last", kind="stable")
             .drop_duplicates("_group", keep="first"))
    timed = first["ts_ns"].notna().to_numpy(dtype=bool)
    out = pd.DataFrame({
        **{key: first[key] for key in keys},
        "count": pd.array(np.bincount(group, minlength=len(first))[first["_group"].to_numpy()],
                          pd.ArrowDtype(pa.int64())),
        "first_ts_ns": first["ts_ns"],
        **{f"example_{name}": first[name].where(timed)
           for name in ("subject", "detail", "file", "file_offset")}})
    types = {"capture": pa.string(), "severity": pa.string(), "kind": pa.string(),
             "count": pa.int64(), "first_ts_ns": pa.int64(), "example_subject": pa.string(),
             "example_detail": pa.string(), "example_file": pa.string(),
             "example_file_offset": pa.int64()}
    return (out[SUMMARY_COLUMNS].reset_index(drop=True)
            .astype({name: pd.ArrowDtype(t) for name, t in types.items()}))
