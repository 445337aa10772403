"""Every analysis of ``ump analyze`` over one capture's tables: :func:`analyze`, or
:func:`analyze_in_parts` for a capture analysed a part at a time.

The intermediate tables several results share (data messages, sends, registrations,
sequence verdicts, ACK matches, stability times, retransmission requests, flight events) are
made once, each as soon as its inputs are there, two at a time: numpy, pandas and Arrow
release the interpreter lock in their loops, so two steps share the two cores of a laptop.
The results come out in report order (:data:`OUTPUTS`) as Arrow tables sorted by
:data:`SORT_KEYS`, so two runs over one capture write the same rows in the same order.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Sequence
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
    owners,
    registrations,
    retransmission,
    sequence,
    sessions,
    spill,
    topics,
)
from spark_analysis.engine.inputs import Inputs, as_frame, as_inputs
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
    table = plain_values(pa.Table.from_pandas(df, preserve_index=False))
    return sorted_rows(table, sort_keys) if sort_keys else table


def plain_values(table: pa.Table) -> pa.Table:
    """``table`` as a result holds it: plain values (:data:`~spark_analysis.engine.inputs.
    DICTIONARY` columns are dictionary-encoded while analysed), no pandas metadata."""
    table = table.replace_schema_metadata(None)
    for i, field in enumerate(table.schema):
        if pa.types.is_dictionary(field.type):
            table = table.set_column(i, field.name, table.column(i).cast(field.type.value_type))
    return table


def sorted_rows(table: pa.Table, sort_keys: list[str]) -> pa.Table:
    """``table``'s rows sorted by ``sort_keys`` (nulls first)."""
    order = pc.sort_indices(table, sort_keys=[(k, "ascending", "at_start") for k in sort_keys])
    return table.take(order)


SHARED_OUTPUTS = ("topic_advertisements", "topic_queries", "registrations",
                  "registration_summary")
"""Results of the tables every part of a capture reads whole (registrations and topic
resolution, :mod:`spark_analysis.engine.owners`): made once."""

PART_OUTPUTS = tuple(name for name in OUTPUTS
                     if name not in {*SHARED_OUTPUTS, "anomaly_summary", "flight_size"})
"""The results a part of a capture gives (:func:`analyze` with ``shared=False``), merged
over the parts by :func:`analyze_in_parts` (with ``flight_events``, from which the parts'
flight size bins are made once the whole capture's time span is known)."""


def analyze(inputs: Inputs, options: AnalysisOptions | None = None, *,
            progress: Callable[[str, float], None] | None = None,
            shared: bool = True, regs: pd.DataFrame | None = None) -> dict[str, pa.Table]:
    """Every result over ``inputs`` (one or more captures), by name in report order.

    ``progress`` is told each step's name and its seconds when it is done.

    ``shared=False`` analyses one part of a capture (:func:`analyze_in_parts`): only the
    :data:`PART_OUTPUTS`, unsorted, and ``flight_events`` (:func:`~spark_analysis.
    engine.flight.flight_events` as Arrow); ``regs`` is
    then the registrations (:func:`~spark_analysis.engine.registrations.registrations`),
    made once for every part.

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
                 "regs": (step("registrations", registrations.registrations,
                               inputs.registrations) if regs is None else regs),
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
            f["found"] = step("anomalies",
                              lambda *tables: anomalies.combined_anomalies(*tables,
                                                                           shared=shared),
                              f.pop("packet_found"), f.pop("sequence_found"), flagged,
                              f["sends"], f["regs"], f["stability"], f["consumption"],
                              f["requests"])
            if shared:
                f["topic_advertisements"] = step("topic advertisements",
                                                 topics.topic_advertisements, adverts)
                f["topic_queries"] = step("topic queries", topics.topic_queries, adverts)
            return f

        f = first_steps(inputs)
        del inputs
        stable_f = step("stability times", lambda a, r: flight.stable_times(a, r, options),
                        f["stability"], f["regs"])
        events_f = step("flight events", flight.flight_events, f.pop("sends"), stable_f)
        out: dict[str, Future[Any]] = {"anomalies": f["found"]}
        if shared:
            out["anomaly_summary"] = step("anomaly summary", anomalies.anomaly_summary,
                                          f["found"])
            out["topic_advertisements"] = f["topic_advertisements"]
            out["topic_queries"] = f["topic_queries"]
            out["registrations"] = f["regs"]
            out["registration_summary"] = step("registration summary",
                                               registrations.registration_summary, f["regs"])
            out["flight_size"] = step("flight size", lambda e: flight.flight_size(e, options),
                                      events_f)
        out.update({
            "transport_sessions": f["transport_sessions"],
            "sequence_summary": f["sequence_summary"],
            "sequence_events": f["sequence_events"],
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
            "retransmission_summary": step("retransmission summary",
                                           retransmission.retransmission_summary,
                                           f["requests"]),
            "retransmission_requests": f["requests"],
        })
        # only the futures of the results stay here: an intermediate table (data messages,
        # sends, sequence verdicts, stability times, flight events) goes with its last reader
        del f, stable_f
        if shared:
            del events_f
            names = [name for name in OUTPUTS if name in out]
        else:
            names = list(PART_OUTPUTS)
        results = {name: out.pop(name).result() for name in names}
        del out
        started = time.perf_counter()
        # each result let go once sorted (a sorted copy of the ACKs of a persistent capture is
        # as big as the capture's data messages); a part's results are sorted once merged
        tables = dict(zip(names, pool.map(
            lambda name: to_arrow(results.pop(name), SORT_KEYS[name] if shared else None),
            names), strict=True))
        if not shared:
            tables["flight_events"] = pa.Table.from_pandas(events_f.result(),
                                                           preserve_index=False)
        if progress is not None:
            progress("sorting the results", time.perf_counter() - started)
    return tables


PART_TOTAL = " (all parts)"
"""What :func:`analyze_in_parts` appends to a step's name when it tells its seconds over all
the parts (each part's own seconds are told as ``part i of n``)."""


def analyze_in_parts(shared: dict[str, pa.Table], parts: Sequence[owners.Part],
                     read: Callable[[int], dict[str, pa.Table]],
                     ack_buckets: Iterable[pa.Table], options: AnalysisOptions | None = None, *,
                     progress: Callable[[str, float], None] | None = None,
                     scratch: str | None = None) -> dict[str, pa.Table]:
    """:func:`analyze` of one capture, a part at a time (:mod:`spark_analysis.engine.owners`):
    the same results, the analyses holding one part at a time.

    ``shared`` holds the input tables every part reads (:func:`~spark_analysis.engine.inputs.
    load_tables` with ``parts``: control messages and advertisements), ``read(i)`` the
    ``packets`` and ``messages`` of part ``i`` of ``parts``, and ``ack_buckets`` the ACK
    control messages a bucket at a time (:class:`~spark_analysis.engine.inputs.AckBuckets`).
    The ACKs and the RXREQs (taken out of ``shared``) are cut into the parts here (each
    part's set aside on disk until its turn), where the registrations that route consumption
    ACKs are known (:func:`~spark_analysis.engine.acks.ack_hosts`): no step holds every ACK
    of the capture.  The results of the shared tables alone
    (:data:`SHARED_OUTPUTS`, and the anomalies of the registrations and flagged messages)
    are made once.  Each part's :data:`PART_OUTPUTS` and flight events are written to a
    temporary directory in ``scratch`` (:mod:`spark_analysis.engine.spill`): the flight-size
    bins cut the whole capture's time span, so they are made once every part is done; then
    each result's parts are joined and sorted, a big one a slice at a time onto disk (it
    comes back memory-mapped: :func:`_sorted_via`), and the anomaly summary is made from all
    the anomalies.  ``progress`` is told each part's seconds, then each step's over all
    parts."""
    options = options or AnalysisOptions()
    spans: list[flight.Span] = []
    spent: dict[str, float] = {}

    def told(name: str, seconds: float) -> None:
        spent[name] = spent.get(name, 0.0) + seconds

    started = time.perf_counter()
    regs = registrations.registrations(as_frame("registrations", shared["registrations"]))
    made = _shared_results(as_frame("advertisements", shared["advertisements"]),
                           as_frame("flagged", shared["flagged"]), regs)
    told("registrations and topic resolution", time.perf_counter() - started)
    none = {name: shared[name].schema.empty_table() for name in ("registrations", "flagged")}

    # the files stay mapped by the results returned once the directory is gone (POSIX)
    with tempfile.TemporaryDirectory(prefix="ump-analyze-", dir=scratch,
                                     ignore_cleanup_errors=True) as directory:
        kept = spill.Spill(directory)
        # the ACKs and RXREQs leave shared: each part's own set aside on disk until its turn
        started = time.perf_counter()
        cut = spill.Spill(f"{directory}/cut", compressed=True)
        for bucket in ack_buckets:
            hosts = acks.ack_hosts(as_frame("acks", bucket), regs)
            for i, part in enumerate(parts):
                cut.add(f"acks-{i}", bucket.filter(pa.array(part.owns(hosts))))
            del hosts, bucket
        for i, piece in enumerate(owners.split(parts, "rxreqs", shared.pop("rxreqs"))):
            cut.add(f"rxreqs-{i}", piece)
        told("cutting the ACKs and RXREQs into the parts", time.perf_counter() - started)

        def part_inputs(i: int) -> Inputs:
            started = time.perf_counter()
            tables = read(i)
            tables.update(acks=cut.read(f"acks-{i}"), rxreqs=cut.read(f"rxreqs-{i}"), **none,
                          advertisements=shared["advertisements"])
            inputs = as_inputs(tables)
            told("reading the decoded tables", time.perf_counter() - started)
            return inputs

        for i in range(len(parts)):
            started = time.perf_counter()
            # no name holds the inputs here: analyze lets each table go when done with it
            results = analyze(part_inputs(i), options, progress=told, shared=False, regs=regs)
            events = results.pop("flight_events")
            spans.append(flight.event_span(events.to_pandas(types_mapper=pd.ArrowDtype)))
            kept.add(f"flight_events-{i}", events)
            del events
            # each part's results on disk (a part's empty result may type a column null)
            for name in PART_OUTPUTS:
                kept.add(f"{name}-{i}", results.pop(name))
            if progress is not None:
                progress(f"part {i + 1} of {len(parts)}", time.perf_counter() - started)
        started = time.perf_counter()
        span = flight.merged_span(spans)
        flight_size = _joined([to_arrow(flight.flight_size(
            kept.read(f"flight_events-{i}").to_pandas(types_mapper=pd.ArrowDtype), options,
            span)) for i in range(len(parts))])
        if progress is not None:
            for name, seconds in spent.items():
                progress(f"{name}{PART_TOTAL}", seconds)
            progress("flight size", time.perf_counter() - started)
        started = time.perf_counter()
        whole = {name: _joined([kept.read(f"{name}-{i}") for i in range(len(parts))])
                 for name in PART_OUTPUTS}
        whole["anomalies"] = _joined([whole["anomalies"], made.pop("shared_anomalies")])
        whole["anomaly_summary"] = to_arrow(anomalies.anomaly_summary(
            whole["anomalies"].to_pandas(types_mapper=pd.ArrowDtype)))
        whole["flight_size"] = flight_size
        whole.update(made)
        tables = {name: _sorted_via(kept, name, whole.pop(name)) for name in OUTPUTS}
        if progress is not None:
            progress("sorting the results", time.perf_counter() - started)
    return tables


SORTED_SLICE = 1 << 20
"""Rows of a result sorted in one go: a bigger result is sorted a slice at a time onto disk
(:func:`_sorted_via`)."""


def _sorted_via(kept: spill.Spill, name: str, table: pa.Table) -> pa.Table:
    """Result ``name`` sorted by its :data:`SORT_KEYS`: in memory when small, else its rows
    taken a :data:`SORTED_SLICE` at a time in sorted order and written to ``kept``, and read
    back memory-mapped (the sort itself holds only the key columns and the order)."""
    keys = SORT_KEYS[name]
    if table.num_rows <= SORTED_SLICE:
        return sorted_rows(table, keys)
    order = pc.sort_indices(table.select(keys),
                            sort_keys=[(k, "ascending", "at_start") for k in keys])
    for start in range(0, len(order), SORTED_SLICE):
        kept.add(f"{name}-sorted", table.take(order.slice(start, SORTED_SLICE)))
    return kept.read(f"{name}-sorted")


def _shared_results(adverts: pd.DataFrame, flagged: pd.DataFrame, regs: pd.DataFrame
                    ) -> dict[str, pa.Table]:
    """The results of the tables every part reads whole (:data:`SHARED_OUTPUTS`) and the
    anomalies they show (``shared_anomalies``), unsorted."""
    return {"topic_advertisements": to_arrow(topics.topic_advertisements(adverts)),
            "topic_queries": to_arrow(topics.topic_queries(adverts)),
            "registrations": to_arrow(regs),
            "registration_summary": to_arrow(registrations.registration_summary(regs)),
            "shared_anomalies": plain_values(anomalies.shared_anomalies(flagged, regs))}


def _joined(tables: list[pa.Table]) -> pa.Table:
    """The parts of a result as one table (a part without rows may type a column of nulls
    only as null)."""
    return pa.concat_tables(tables, promote_options="permissive")
