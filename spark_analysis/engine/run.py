"""Every analysis of ``ump analyze`` over one capture's tables: :func:`analyze`.

The intermediate tables several results share (data messages, sends, registrations,
sequence verdicts, ACK matches, stability times, retransmission requests, flight events) are
made once, each as soon as its inputs are there, two at a time: numpy, pandas and Arrow
release the interpreter lock in their loops, so two steps share the two cores of a laptop.
The results come out in report order (:data:`OUTPUTS`) as Arrow tables sorted by
:data:`SORT_KEYS`, so two runs over one capture write the same rows in the same order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from spark_analysis.engine import (
    acks,
    anomalies,
    data,
    flight,
    registrations,
    retransmission,
    sequence,
    sessions,
    topics,
)
from spark_analysis.engine.inputs import Inputs
from spark_analysis.engine.options import AnalysisOptions

OUTPUTS = ("anomaly_summary", "anomalies", "topic_advertisements", "topic_queries",
           "transport_sessions", "sequence_summary", "sequence_events", "registrations",
           "registration_summary", "latency_summary", "latency_histogram", "stability_acks",
           "consumption_acks", "flight_size_summary", "flight_size", "retransmission_summary",
           "retransmission_requests")
"""The results, in report order."""

DETAIL_OUTPUTS = frozenset({"anomalies", "sequence_events", "registrations", "stability_acks",
                            "consumption_acks", "retransmission_requests"})
"""Outputs with a row per event: as large as the capture.  (``flight_size`` has a row per
time bin and source topic: bounded by ``flight_bins``.)"""

SORT_KEYS: dict[str, list[str]] = {
    "anomaly_summary": ["capture", "severity", "kind"],
    "anomalies": ["capture", "ts_ns", "kind", "file", "file_offset", "subject", "detail"],
    "topic_advertisements": ["capture", "topic", "transport", "source_ip", "source_port",
                             "session_id", "topic_index"],
    "topic_queries": ["capture", "record", "topic"],
    "transport_sessions": ["capture", "session"],
    "sequence_summary": ["capture", "level", "protocol", "source_ip", "source_port",
                         "session_id", "dest_ip", "dest_port", "tidx"],
    "sequence_events": ["capture", "pos", "msg_index", "level", "dest_ip", "dest_port", "tidx",
                        "event"],
    "registrations": ["capture", "pos", "msg_index"],
    "registration_summary": ["capture", "role", "store_ip", "outcome", "error_code"],
    "latency_summary": ["capture", "kind", "source_ip", "tidx", "store_ip"],
    "latency_histogram": ["capture", "kind", "source_ip", "store_ip", "bucket"],
    "stability_acks": ["capture", "pos", "msg_index"],
    "consumption_acks": ["capture", "pos", "msg_index"],
    "flight_size_summary": ["capture", "session", "tidx"],
    "flight_size": ["capture", "session", "tidx", "bin"],
    "retransmission_summary": ["capture", "kind", "responder_ip", "responder_port", "session"],
    "retransmission_requests": ["capture", "pos", "kind", "sqn", "requester_ip"],
}
"""A total order of every output's rows (nulls first)."""

THREADS = 2
"""Steps run at once."""

HEAVY = frozenset({"sequence analysis", "transport sessions", "stability ACKs"})
"""Steps whose working memory is as large as the capture's: one at a time (the other
thread runs the light steps meanwhile)."""


def to_arrow(df: pd.DataFrame, sort_keys: list[str] | None = None) -> pa.Table:
    """A result as Arrow, sorted by ``sort_keys`` (nulls first) when given."""
    # without pandas' metadata: a reader of the Parquet gets plain Arrow types back, not the
    # Arrow-backed pandas dtypes the engine computed with
    table = pa.Table.from_pandas(df, preserve_index=False).replace_schema_metadata(None)
    # the results hold plain values (inputs.DICTIONARY: dictionary-encoded while analysed)
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(field.type.value_type))
    if sort_keys:
        order = pc.sort_indices(table, sort_keys=[(k, "ascending", "at_start")
                                                  for k in sort_keys])
        table = table.take(order)
    return table


def analyze(inputs: Inputs, options: AnalysisOptions | None = None, *,
            progress: Callable[[str, float], None] | None = None) -> dict[str, pa.Table]:
    """Every result over ``inputs`` (one or more captures), by name in report order.

    ``progress`` is told each step's name and its seconds when it is done.

    Memory: a table is let go as soon as the last step that reads it is done (the steps hold
    their inputs, this function keeps only the futures of the results).  A caller that
    passes ``inputs`` without keeping a reference (``analyze(load(...))``) lets the input
    tables go too: ``messages`` once the data messages are made, ``packets`` once the
    transport sessions are.  At 10,000,000 frames that is a gigabyte less at the peak."""
    options = options or AnalysisOptions()
    heavy = threading.Lock()
    with ThreadPoolExecutor(THREADS, thread_name_prefix="ump-engine") as pool:
        def step(name: str, make: Callable[..., Any], *needs: Any) -> Future[Any]:
            def run() -> Any:
                ready = [x.result() if isinstance(x, Future) else x for x in needs]
                started = time.perf_counter()
                if name in HEAVY:
                    with heavy:
                        result = make(*ready)
                else:
                    result = make(*ready)
                del ready
                if progress is not None:
                    progress(name, time.perf_counter() - started)
                return result
            return pool.submit(run)

        def first_steps(inputs: Inputs) -> dict[str, Future[Any]]:
            """The steps that read the input tables (so that only they hold them)."""
            packets, messages, adverts = inputs.packets, inputs.messages, inputs.advertisements
            # each analysis of UME headers reads its own control messages (inputs.CONTROL_TABLES)
            acked, flagged = inputs.acks, inputs.flagged
            f = {"topics": step("topics", topics.advertised_topics, adverts),
                 "data": step("data messages", data.data_messages, packets, messages, adverts),
                 "regs": step("registrations", registrations.registrations,
                              inputs.registrations),
                 "packet_found": step("packet anomalies", anomalies.packet_anomalies, packets)}
            f["sends"] = step("message sends", data.message_sends, f["data"])
            f["flags"] = step("sequence analysis", sequence.judged_items, packets, f["data"])
            f["transport_sessions"] = step("transport sessions", sessions.transport_sessions,
                                           packets, f["data"])
            # the last reader of packets, and every reader of the sequence verdicts, before the
            # ACK analyses: both tables are gone by the time the ACKs are paired
            f["requests"] = step("retransmission requests",
                                 retransmission.retransmission_requests, packets, f["data"],
                                 inputs.rxreqs, f["regs"])
            f["sequence_found"] = step("sequence anomalies", anomalies.sequence_anomalies,
                                       f["flags"])
            f["sequence_summary"] = step("sequence summary", sequence.sequence_summary,
                                         f["flags"])
            f["sequence_events"] = step("sequence events", sequence.sequence_events,
                                        f.pop("flags"))
            f["stability"] = step("stability ACKs", acks.stability_acks, acked, f["sends"],
                                  f["regs"])
            f["consumption"] = step("consumption ACKs", acks.consumption_acks, acked,
                                    f["sends"], f["regs"])
            f["found"] = step("anomalies", anomalies.combined_anomalies, f.pop("packet_found"),
                              f.pop("sequence_found"), flagged, f["sends"], f["regs"],
                              f["stability"], f["consumption"], f["requests"])
            f["topic_advertisements"] = step("topic advertisements",
                                             topics.topic_advertisements, adverts)
            f["topic_queries"] = step("topic queries", topics.topic_queries, adverts)
            return f

        f = first_steps(inputs)
        del inputs
        stable_f = step("stability times", lambda a, r: flight.stable_times(a, r, options),
                        f["stability"], f["regs"])
        events_f = step("flight events", flight.flight_events, f.pop("sends"), stable_f)
        out: dict[str, Future[Any]] = {
            "anomaly_summary": step("anomaly summary", anomalies.anomaly_summary, f["found"]),
            "anomalies": f["found"],
            "topic_advertisements": f["topic_advertisements"],
            "topic_queries": f["topic_queries"],
            "transport_sessions": f["transport_sessions"],
            "sequence_summary": f["sequence_summary"],
            "sequence_events": f["sequence_events"],
            "registrations": f["regs"],
            "registration_summary": step("registration summary",
                                         registrations.registration_summary, f["regs"]),
            "latency_summary": step("latency summary", acks.latency_summary, f["stability"],
                                    f["consumption"]),
            "latency_histogram": step("latency histogram",
                                      lambda s, c: acks.latency_histogram(s, c, options),
                                      f["stability"], f["consumption"]),
            "stability_acks": f["stability"],
            "consumption_acks": f["consumption"],
            "flight_size_summary": step(
                "flight size summary",
                lambda e, s, t: flight.flight_size_summary(e, s, options, t),
                events_f, stable_f, f.pop("topics")),
            "flight_size": step("flight size", lambda e: flight.flight_size(e, options),
                                events_f),
            "retransmission_summary": step("retransmission summary",
                                           retransmission.retransmission_summary,
                                           f["requests"]),
            "retransmission_requests": f["requests"],
        }
        # only the futures of the results stay here: an intermediate table (data messages,
        # sends, sequence verdicts, stability times, flight events) goes with its last reader
        del f, stable_f, events_f
        results = {name: future.result() for name, future in out.items()}
        del out
        started = time.perf_counter()
        names = list(results)
        # each result let go once sorted (a sorted copy of the ACKs of a persistent capture is
        # as big as the capture's data messages)
        tables = dict(zip(names, pool.map(lambda name: to_arrow(results.pop(name),
                                                                SORT_KEYS[name]), names),
                          strict=True))
        if progress is not None:
            progress("sorting the results", time.perf_counter() - started)
    return tables
