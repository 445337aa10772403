"""``report.html``: the analyses of a capture as one self-contained page.

Everything is inline (CSS, SVG plots drawn here, no script, no external file or font), so the
page can be mailed or attached to a ticket and opens anywhere.  The plots are plain SVG built
from the result tables with a few helpers (bars, step lines, a timeline, a histogram): the
project has no plotting dependency and these charts need none.

Order: overview, then **anomalies first** (what a reviewer must look at), then one section per
analysis: a plot where a picture helps, the summary table, and the first rows of detail tables
(``row_limit``; the Parquet output has all rows).  With several captures (``--per-file``) every
plot is drawn per capture and tables carry a ``capture`` column.

Layout rules (checked in headless Chromium by ``tests/spark_analysis/test_report_browser.py``):
nothing is wider than the window: tables scroll sideways in their own box, charts shrink to
the window (``viewBox``); chart labels are shortened in the middle so that they stay distinct
(:func:`fit_labels`) and legends are as wide as their labels; booleans read "yes"/"no"; a
chart is drawn only where it means something (no flight size for source topics without
stores: :func:`persistent_topics`).
"""

from __future__ import annotations

import datetime as dt
import html
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

__all__ = ["ReportInput", "render"]

PALETTE = ("#3b6fb6", "#e07b39", "#4c9a52", "#c44e52", "#8172b2", "#937860", "#da8bc3",
           "#7f7f7f", "#ccb974", "#64b5cd")
SEVERITY_COLOR = {"error": "#c44e52", "warning": "#e0a030"}
OUTCOME_STYLE = {"granted": ("#4c9a52", "circle"), "error": ("#c44e52", "cross"),
                 "unanswered": ("#7f7f7f", "square")}


@dataclass
class ReportInput:
    """What the report is made from.

    Attributes:
        files: the capture files, in capture order.
        options: the run's options (shown in the overview).
        tables: result tables by output name (as read back from Parquet; detail tables may be
            only their first rows).
        row_counts: total rows of every output (what Parquet holds).
        skipped: frames that are not UM (``file``, ``reason``, ``frames``).
        row_limit: rows shown per table.
        problems: see the attribute.
    """

    files: Sequence[str]
    options: Mapping[str, Any]
    tables: Mapping[str, pd.DataFrame]
    row_counts: Mapping[str, int]
    skipped: pd.DataFrame = field(default_factory=pd.DataFrame)
    problems: Sequence[str] = ()
    """Where a capture file is damaged or cut short (one line each): shown first."""
    row_limit: int = 50

    def table(self, name: str) -> pd.DataFrame:
        return self.tables.get(name, pd.DataFrame())


# =============================================================================================
# Page
# =============================================================================================

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Helvetica,Arial,sans-serif;margin:24px;
color:#222;max-width:1400px}
h1{font-size:1.5em;margin-bottom:4px}h2{margin-top:36px;border-bottom:2px solid #3b6fb6;
padding-bottom:4px}h3{margin-top:20px;font-size:1.05em}
table{border-collapse:collapse;font-size:12px;margin:8px 0}
th,td{border:1px solid #ccc;padding:2px 6px;text-align:right;white-space:nowrap}
th{background:#eef2f8;position:sticky;top:0}td.text{text-align:left}
tr:nth-child(even) td{background:#fafafa}
.note{color:#555;font-size:13px}.ok{color:#2e7d32;font-weight:bold}
.error{color:#c44e52;font-weight:bold}.warning{color:#b8860b;font-weight:bold}
.scroll{overflow-x:auto;max-height:520px;overflow-y:auto}
nav a{margin-right:12px}svg{display:block;margin:8px 0;max-width:100%;height:auto}
svg text{font-family:system-ui,Helvetica,Arial,sans-serif}
"""

SECTIONS: tuple[tuple[str, str], ...] = (
    ("anomalies", "Anomalies"),
    ("topics", "Topic resolution"),
    ("sessions", "Transport sessions"),
    ("sequence", "Sequence gaps, out of order, duplicates"),
    ("registrations", "Store registrations"),
    ("latency", "Stability and consumption latency"),
    ("flight", "Flight size"),
    ("retransmissions", "Retransmission requests"),
    ("frames", "Frames that are not UM"),
)


def render(data: ReportInput) -> str:
    """The whole page as HTML text."""
    builders: dict[str, Callable[[ReportInput], str]] = {
        "anomalies": _anomalies, "topics": _topics, "sessions": _sessions,
        "sequence": _sequence, "registrations": _registrations, "latency": _latency,
        "flight": _flight, "retransmissions": _retransmissions, "frames": _frames,
    }
    parts = [
        "<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">",
        "<title>UM capture analysis</title>", f"<style>{CSS}</style></head><body>",
        "<h1>UM capture analysis</h1>", _overview(data),
        "<nav>" + "".join(f'<a href="#{key}">{html.escape(title)}</a>'
                          for key, title in SECTIONS) + "</nav>",
    ]
    for key, title in SECTIONS:
        parts.append(f'<h2 id="{key}">{html.escape(title)}</h2>')
        parts.append(builders[key](data))
    parts.append("</body></html>")
    return "\n".join(parts)


def _captures(data: ReportInput) -> list[str]:
    seen: set[str] = set()
    for df in data.tables.values():
        if len(df) and "capture" in df.columns:
            seen.update(str(c) for c in df["capture"].unique())
    return sorted(seen) or ["all"]


def _start_ns(data: ReportInput, capture: str | None = None) -> int | None:
    """The earliest timestamp any table shows (the origin of relative times)."""
    candidates = []
    for df in data.tables.values():
        if not len(df):
            continue
        part = df[df["capture"] == capture] if capture is not None and "capture" in df else df
        for col in part.columns:
            if col.endswith("ts_ns") or col == "bin_start_ns":
                values = pd.to_numeric(part[col], errors="coerce").dropna()
                if len(values):
                    candidates.append(int(values.min()))
    return min(candidates) if candidates else None


def _overview(data: ReportInput) -> str:
    start = _start_ns(data)
    when = (dt.datetime.fromtimestamp(start / 1e9, tz=dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
            if start is not None else "n/a")
    files = "".join(f"<li>{html.escape(f)}</li>" for f in data.files)
    options = ", ".join(f"{html.escape(str(k))}={html.escape(str(v))}"
                        for k, v in data.options.items())
    counts = "".join(f"<tr><td class=text>{html.escape(k)}</td><td>{v:,}</td></tr>"
                     for k, v in data.row_counts.items())
    problems = "".join(f"<p class=error>{html.escape(line)}</p>" for line in data.problems)
    return (f"{problems}<p class=note>Capture start {when}; times below are seconds from it.  "
            f"Options: {options}.</p><details><summary>{len(data.files)} file(s)</summary>"
            f"<ul>{files}</ul></details><details><summary>Rows per result table (all in "
            f"Parquet)</summary><table><tr><th>table</th><th>rows</th></tr>{counts}</table>"
            "</details>")


# =============================================================================================
# Sections
# =============================================================================================


def _anomalies(data: ReportInput) -> str:
    summary = data.table("anomaly_summary")
    if not len(summary):
        return "<p class=ok>No anomalies found.</p>"
    out = []
    total = int(summary["count"].sum())
    errors = int(summary.loc[summary["severity"] == "error", "count"].sum())
    out.append(f"<p><span class=error>{errors:,} error(s)</span>, <span class=warning>"
               f"{total - errors:,} warning(s)</span> in {len(summary)} kind(s).</p>")
    by_kind = summary.groupby(["severity", "kind"], as_index=False)["count"].sum()
    by_kind = by_kind.sort_values(["severity", "count"], ascending=[True, False])
    out.append(bar_chart([f"{r.kind} ({r.severity})" for r in by_kind.itertuples()],
                         [("count", [float(c) for c in by_kind["count"]])],
                         title="Anomalies by kind", log=False,
                         colors=[SEVERITY_COLOR.get(s, PALETTE[0])
                                 for s in by_kind["severity"]]))
    out.append(_table(summary, data, ["capture", "severity", "kind", "count", "first_ts_ns",
                                      "example_subject", "example_detail", "example_file",
                                      "example_file_offset"]))
    out.append("<h3>First anomalies</h3>")
    out.append(_detail_note(data, "anomalies"))
    out.append(_table(data.table("anomalies"), data, ["capture", "ts_ns", "severity", "kind",
                                                      "subject", "detail", "file",
                                                      "file_offset"]))
    return "\n".join(out)


def _topics(data: ReportInput) -> str:
    ads = data.table("topic_advertisements")
    queries = data.table("topic_queries")
    out = ["<h3>Advertisements (TIR) per topic, source and transport</h3>",
           _table(ads, data, ["capture", "topic", "transport", "session", "source_ip",
                              "source_port", "session_id", "topic_index", "mcast_group",
                              "mcast_port", "tirs", "senders", "persistent", "stores",
                              "ume_transport_idx", "first_ts_ns", "last_ts_ns"]),
           "<h3>Queries (TQR)</h3>",
           _table(queries, data, ["capture", "record", "topic", "pattern_type", "queries",
                                  "queriers", "answered", "first_ts_ns", "last_ts_ns"])]
    return "\n".join(out)


_SESSION_SERIES = (("data_packets", "data"), ("rx_packets", "RX"), ("nak_packets", "NAK"),
                   ("ncf_packets", "NCF"), ("sm_packets", "SM"))


def _sessions(data: ReportInput) -> str:
    sessions = data.table("transport_sessions")
    if not len(sessions):
        return "<p class=note>No LBT-RM, LBT-RU or LBT-TCP transport session.</p>"
    out = []
    for capture, part in _per_capture(sessions, data):
        labels = list(part["session"].astype(str))
        series = [(label, [float(v or 0) for v in part[col].fillna(0)])
                  for col, label in _SESSION_SERIES]
        out.append(bar_chart(labels, series, title=f"Packets per session{capture}",
                             log=True))
    out.append(_table(sessions, data, [
        "capture", "session", "protocol", "mcast_group", "messages", "topics", "data_packets",
        "data_bytes", "rx_packets", "rx_bytes", "sm_packets", "nak_packets", "nak_sqns",
        "ncf_packets", "ncf_sqns", "creq_packets", "ack_packets", "rst_packets", "peers",
        "duration_s", "data_packets_per_s", "rx_packets_per_s", "nak_packets_per_s",
        "ncf_packets_per_s", "sm_packets_per_s", "messages_per_s", "data_bytes_per_s",
        "first_ts_ns", "last_ts_ns"]))
    return "\n".join(out)


def _sequence(data: ReportInput) -> str:
    summary = data.table("sequence_summary")
    if not len(summary):
        return "<p class=note>No sequenced traffic.</p>"
    issues = summary["gaps"] + summary["out_of_order"] + summary["duplicates"]
    flagged = int((issues > 0).sum())
    note = (f"<p class=ok>No gap, out-of-order or duplicate item in {len(summary)} "
            "stream(s).</p>" if not flagged else
            f"<p><span class=warning>{flagged} of {len(summary)} stream(s)</span> have gaps, "
            "out-of-order or duplicate items (listed first).</p>")
    ordered = summary.assign(_issues=issues).sort_values(
        ["_issues", "level", "source_ip"], ascending=[False, True, True])
    out = [note, "<p class=note>Transport levels follow tshark's LBT-RM/LBT-RU analysis; "
                 "topic level is per transport stream and topic index.</p>",
           _table(ordered, data, ["capture", "level", "protocol", "source_ip", "source_port",
                                  "session_id", "dest_ip", "dest_port", "tidx", "items",
                                  "retransmissions", "first_sqn", "high_sqn", "gaps",
                                  "gap_sqns", "out_of_order", "duplicates", "missing",
                                  "first_ts_ns", "last_ts_ns"])]
    events = data.table("sequence_events")
    if len(events):
        out += ["<h3>Events</h3>", _detail_note(data, "sequence_events"),
                _table(events, data, ["capture", "ts_ns", "level", "event", "size", "sqn",
                                      "protocol", "source_ip", "source_port", "dest_ip",
                                      "dest_port", "tidx", "file", "file_offset"])]
    return "\n".join(out)


def _registrations(data: ReportInput) -> str:
    regs = data.table("registrations")
    summary = data.table("registration_summary")
    if not len(regs) and not len(summary):
        return "<p class=note>No store registration in the capture.</p>"
    out = []
    for capture, part in _per_capture(regs, data):
        start = _start_ns(data, None if capture == "" else part["capture"].iloc[0])
        lanes = sorted({(r.store_ip, r.store_port, r.role)
                        for r in part.itertuples()})
        lane_names = [f"{ip}:{port} {role}" for ip, port, role in lanes]
        index = {lane: i for i, lane in enumerate(lanes)}
        points = []
        for r in part.itertuples():
            color, shape = OUTCOME_STYLE.get(str(r.outcome), ("#333", "circle"))
            tip = (f"{r.role} {r.client_ip}:{r.client_port} -> {r.store_ip}; topic "
                   f"{r.topic}; {r.outcome}"
                   + (f" ({r.error})" if isinstance(r.error, str) else "")
                   + (f"; RegID {int(r.granted_reg_id)}" if _num(r.granted_reg_id) else ""))
            points.append((index[(r.store_ip, r.store_port, r.role)],
                           (int(r.ts_ns) - (start or 0)) / 1e9, color, shape, tip))
        out.append(timeline(lane_names, points, title=f"Registrations over time{capture}",
                            legend=[(k, v[0], v[1]) for k, v in OUTCOME_STYLE.items()]))
    out.append("<h3>Summary</h3>")
    out.append(_table(summary, data, ["capture", "role", "store_ip", "outcome", "error_code",
                                      "error", "requests", "clients", "topics", "old_clients",
                                      "rpp_requests", "max_response_us", "first_ts_ns",
                                      "last_ts_ns"]))
    out.append("<h3>Timeline</h3>")
    out.append(_detail_note(data, "registrations"))
    out.append(_table(regs, data, [
        "capture", "ts_ns", "role", "client_ip", "client_port", "store_ip", "store_port",
        "source_ip", "topic", "transport_idx", "topic_idx", "requested_reg_id", "src_reg_id",
        "session_id", "rpp", "deregister", "outcome", "granted_reg_id", "error_code", "error",
        "old_client", "no_cache", "rpp_granted", "low_seqnum", "high_seqnum", "store_id",
        "response_us"]))
    return "\n".join(out)


def _latency(data: ReportInput) -> str:
    summary = data.table("latency_summary")
    hist = data.table("latency_histogram")
    if not len(summary):
        return "<p class=note>No stability or consumption ACK in the capture.</p>"
    out = []
    for capture, part in _per_capture(hist, data):
        for kind in ("stability", "consumption"):
            rows = part[part["kind"] == kind]
            if not len(rows):
                continue
            grouped = rows.groupby(["bucket_low_us", "bucket_high_us"], as_index=False)[
                "count"].sum().sort_values("bucket_low_us")
            out.append(histogram([(float(r.bucket_low_us), float(r.bucket_high_us),
                                   int(r.count)) for r in grouped.itertuples()],
                                 title=f"{kind.capitalize()} latency{capture}",
                                 x_label="latency (log scale)"))
    ordered = summary.sort_values(["kind", "source_ip", "tidx", "store_ip"],
                                  ascending=[False, True, True, True])
    out.append(_table(ordered, data, ["capture", "kind", "source_ip", "topic", "tidx",
                                      "store_ip", "acks", "matched", "receivers", "p50_us",
                                      "p90_us", "p99_us", "min_us", "max_us", "mean_us"]))
    out.append(f"<p class=note>{data.row_counts.get('stability_acks', 0):,} stability and "
               f"{data.row_counts.get('consumption_acks', 0):,} consumption ACK(s) in "
               "Parquet (stability_acks, consumption_acks), one row each with its "
               "latency.</p>")
    return "\n".join(out)


_FLIGHT_KEY = ["capture", "source_ip", "tidx"]


def persistent_topics(data: ReportInput) -> set[tuple[str, str, int]]:
    """(capture, source IP, topic index) of the source topics known to use stores: a message
    of theirs became stable (the summary's ``stores``), a store sent stability ACKs for them
    (``latency_summary``), or their TIR carried the UME option (``topic_advertisements``
    ``persistent``).

    Flight size means "sent, not yet stable": on a source topic without stores nothing is ever
    stable, so its line would only climb with every message sent (5,000 "never stable" on
    traffic with no store at all).  The spec is silent on what to show; the report draws and
    lists only these topics and says how many it left out."""
    keys: set[tuple[str, str, int]] = set()

    def add(df: pd.DataFrame, tidx: str, where: Any) -> None:
        if not len(df) or not {"capture", "source_ip", tidx} <= set(df.columns):
            return
        for r in df[where(df)][["capture", "source_ip", tidx]].itertuples(index=False):
            if _num(r[2]):
                keys.add((str(r[0]), str(r[1]), int(r[2])))

    add(data.table("flight_size_summary"), "tidx",
        lambda df: pd.to_numeric(df.get("stores"), errors="coerce").fillna(0) > 0)
    add(data.table("latency_summary"), "tidx", lambda df: df["kind"] == "stability")
    add(data.table("topic_advertisements"), "topic_index",
        lambda df: df["persistent"].fillna(False).astype(bool))
    return keys


def _persistent_rows(df: pd.DataFrame, keys: set[tuple[str, str, int]]) -> pd.DataFrame:
    if not len(df):
        return df
    mask = [(str(c), str(ip), int(t)) in keys if _num(t) else False
            for c, ip, t in zip(df["capture"], df["source_ip"], df["tidx"], strict=True)]
    return df[mask]


def _flight(data: ReportInput) -> str:
    all_summary = data.table("flight_size_summary")
    if not len(all_summary):
        return "<p class=note>No message with a send and stability ACKs in the capture.</p>"
    keys = persistent_topics(data)
    summary = _persistent_rows(all_summary, keys)
    series_table = _persistent_rows(data.table("flight_size"), keys)
    left_out = len(all_summary) - len(summary)
    note = (f"<p class=note>{left_out:,} source topic(s) without stores left out: their "
            "messages are never stable, so they have no flight size.</p>" if left_out else "")
    if not len(summary):
        return ("<p class=note>No source topic uses stores (no stability ACK, no UME option "
                "in its advertisements): nothing becomes stable, so there is no flight size "
                f"to show.</p>{note}")
    out = [note] if note else []
    for capture, part in _per_capture(series_table, data):
        start = _start_ns(data, None if capture == "" else part["capture"].iloc[0]) or 0
        lines = []
        for (session, tidx), rows in part.groupby(["session", "tidx"]):
            rows = rows.sort_values("bin")
            points = [((int(r.bin_start_ns) - start) / 1e9, float(r.max_in_flight))
                      for r in rows.itertuples()]
            lines.append((f"{session} tidx {tidx}", points))
        out.append(line_chart(lines, title=f"Messages in flight (peak per bin){capture}",
                              x_label="seconds", y_label="in flight"))
    out.append(_table(summary, data, ["capture", "session", "source_ip", "tidx", "messages",
                                      "stabilized", "never_stable", "peak_in_flight",
                                      "peak_ts_ns", "end_in_flight", "stores", "acks_needed",
                                      "stability_rule"]))
    return "\n".join(out)


def _retransmissions(data: ReportInput) -> str:
    summary = data.table("retransmission_summary")
    if not len(summary):
        return "<p class=note>No RXREQ or NAK in the capture.</p>"
    out = []
    for capture, part in _per_capture(summary, data):
        labels = [f"{r.kind} {r.responder_ip}:{r.responder_port}" for r in part.itertuples()]
        series = [(name, [float(v) for v in part[name].fillna(0)])
                  for name in ("served", "ncf", "unanswered")]
        out.append(bar_chart(labels, series, title=f"Requested sequence numbers{capture}",
                             stacked=True, colors_by_series=("#4c9a52", "#e0a030", "#c44e52")))
    out.append(_table(summary, data, ["capture", "kind", "responder_ip", "responder_port",
                                      "session", "requests", "sqns", "requesters", "served",
                                      "ncf", "unanswered", "p50_us", "p90_us", "p99_us",
                                      "max_us", "mean_us"]))
    out.append(f"<p class=note>{data.row_counts.get('retransmission_requests', 0):,} "
               "request(s), one row per sequence number, in Parquet "
               "(retransmission_requests).</p>")
    return "\n".join(out)


def _frames(data: ReportInput) -> str:
    if not len(data.skipped):
        return "<p class=note>Every frame was decoded as UM.</p>"
    return _table(data.skipped, data, ["file", "reason", "frames", "first_file_offset"])


# =============================================================================================
# Tables
# =============================================================================================


def _per_capture(df: pd.DataFrame, data: ReportInput) -> Iterable[tuple[str, pd.DataFrame]]:
    """(title suffix, rows) per capture: one untitled group when there is one capture."""
    if not len(df):
        return []
    if len(_captures(data)) <= 1 or "capture" not in df.columns:
        return [("", df)]
    return [(f" — {str(capture).rsplit('/', 1)[-1]}", part)
            for capture, part in df.groupby("capture")]


def _detail_note(data: ReportInput, name: str) -> str:
    total = data.row_counts.get(name, 0)
    if total <= data.row_limit:
        return ""
    return (f"<p class=note>First {data.row_limit:,} of {total:,} rows (all in "
            f"parquet/{name}).</p>")


def _num(value: Any) -> bool:
    return value is not None and not (isinstance(value, float) and math.isnan(value))


def _table(df: pd.DataFrame, data: ReportInput, columns: Sequence[str]) -> str:
    if not len(df):
        return "<p class=note>(none)</p>"
    shown = [c for c in columns if c in df.columns]
    if len(_captures(data)) <= 1:
        shown = [c for c in shown if c != "capture"]
    if len(data.files) <= 1:
        shown = [c for c in shown if c not in ("file", "example_file")]
    rows = df.head(data.row_limit)
    starts: dict[str, int | None] = {}
    head = "".join(f"<th>{html.escape(_header(c))}</th>" for c in shown)
    body = []
    extra = ["capture"] if "capture" in rows and "capture" not in shown else []
    for record in rows[[*shown, *extra]].itertuples(index=False, name=None):
        values = dict(zip([*shown, *extra], record, strict=True))
        capture = str(values.get("capture", ""))
        if capture not in starts:
            starts[capture] = _start_ns(data, capture if len(_captures(data)) > 1 else None)
        cells = []
        for col in shown:
            text, is_text = _cell(col, values[col], starts[capture])
            cls = " class=text" if is_text else ""
            cells.append(f"<td{cls}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    more = ("" if len(df) <= data.row_limit else
            f"<p class=note>{len(df) - data.row_limit:,} more row(s) not shown.</p>")
    return (f"<div class=scroll><table><tr>{head}</tr>{''.join(body)}</table></div>{more}")


def _is_time(column: str) -> bool:
    return column == "ts_ns" or column.endswith("_ts_ns")


def _header(column: str) -> str:
    if column == "ts_ns":
        return "time (s)"
    if column.endswith("_ts_ns"):
        return column[:-6] + " (s)"
    if column.endswith("_us"):
        return column[:-3] + " (µs)"
    return column.replace("_", " ")


def _cell(column: str, value: Any, start: int | None) -> tuple[str, bool]:
    """(escaped text, left-aligned?) of one table cell.  Booleans read "yes"/"no"; only a
    null (unknown or not applicable, e.g. the RPP grant of an unanswered registration) is
    blank."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "", False
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if _is_time(column):
        absolute = dt.datetime.fromtimestamp(int(value) / 1e9, tz=dt.UTC).isoformat()
        rel = (int(value) - (start or 0)) / 1e9
        return f'<span title="{absolute}">{rel:.6f}</span>', False
    if isinstance(value, bool):  # a blank would read as "unknown"; a null stays blank
        return ("yes" if value else "no"), True
    if column in ("capture", "file", "example_file") and isinstance(value, str):
        short = value.rstrip("/").rsplit("/", 1)[-1]
        return f'<span title="{html.escape(value)}">{html.escape(short)}</span>', True
    if isinstance(value, int):
        return f"{value:,}" if not column.endswith(("_id", "_idx", "port", "sqn", "offset",
                                                    "index")) else str(value), False
    if isinstance(value, float):
        if value.is_integer() and column.endswith(("_id", "_idx", "port", "sqn", "_code",
                                                   "tidx", "index")):
            return str(int(value)), False
        return f"{value:,.3f}" if abs(value) < 1e6 else f"{value:,.0f}", False
    return html.escape(str(value)), True


# =============================================================================================
# SVG plots
# =============================================================================================


def _nice_ticks(low: float, high: float, count: int = 5) -> list[float]:
    """About ``count`` round tick values (1, 2, 5 times a power of ten) covering the range."""
    if high <= low:
        high = low + 1
    raw = (high - low) / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    first = math.floor(low / step) * step
    ticks = []
    value = first
    while value <= high + step * 1e-9:
        if value >= low - step * 1e-9:
            ticks.append(round(value, 12))
        value += step
    return ticks


def _fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1e6:
        return f"{value / 1e6:g}M"
    if abs(value) >= 1e3:
        return f"{value / 1e3:g}k"
    return f"{value:g}"


def _svg_open(width: float, height: float) -> str:
    """The start of an ``<svg>`` tag (attributes still open): drawn at its natural size, and
    with a ``viewBox`` so that the stylesheet's ``max-width:100%`` shrinks it to a narrow
    window instead of cutting it."""
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0f}" '
            f'height="{height:.0f}" viewBox="0 0 {width:.0f} {height:.0f}" ')


def _text(x: float, y: float, text: str, anchor: str = "start", size: int = 11,
          extra: str = "") -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"'
            f'{extra}>{html.escape(text)}</text>')


CHAR_W = 6.6
"""Width in pixels allowed per character of 11-pixel label text (system sans-serif fonts
average about 6 for digits and lower case): what a label's room is computed from."""

LABEL_CHARS = 44
"""Longest label drawn in a legend or beside a bar; longer ones are shortened in the middle
(the full text is the element's tooltip)."""


def fit_labels(labels: Sequence[str], max_chars: int = LABEL_CHARS) -> list[str]:
    """Labels of at most ``max_chars`` characters that stay *distinct* when the labels are.

    Labels of one chart tend to share a long prefix (``lbtrm:127.1.0.1:14390:... tidx 1``,
    ``... tidx 2``): cutting the end would make them equal, so the middle is elided, keeping
    the start and the end where they differ.  Labels that still collide get `` #n``."""
    def shorten(label: str, room: int) -> str:
        if len(label) <= room:
            return label
        tail = (room - 1) // 2
        return label[:room - 1 - tail] + "…" + label[len(label) - tail:]

    out = [shorten(str(label), max_chars) for label in labels]
    seen: dict[str, int] = {}
    for label in out:
        seen[label] = seen.get(label, 0) + 1
    if all(n == 1 for n in seen.values()):
        return out
    numbered: dict[str, int] = {}
    for i, (label, short) in enumerate(zip(labels, out, strict=True)):
        if seen[short] > 1 and str(label) != short:
            numbered[short] = numbered.get(short, 0) + 1
            suffix = f" #{numbered[short]}"
            out[i] = shorten(str(label), max_chars - len(suffix)) + suffix
    return out


def _text_width(labels: Iterable[str]) -> float:
    """Pixels the longest of ``labels`` needs at the legend font size."""
    return CHAR_W * max((len(label) for label in labels), default=0)


def _legend(items: Sequence[tuple[str, str]], x: float, y: float) -> str:
    """Colour swatches with distinct, fitted labels (the full label is the tooltip)."""
    parts = []
    short = fit_labels([label for label, _ in items])
    for i, ((label, color), text) in enumerate(zip(items, short, strict=True)):
        yy = y + i * 15
        parts.append(f'<g class="legend-item"><title>{html.escape(label)}</title>'
                     f'<rect x="{x:.1f}" y="{yy - 9:.1f}" width="10" height="10" '
                     f'fill="{color}"/>{_text(x + 14, yy, text)}</g>')
    return "".join(parts)


def _legend_width(labels: Iterable[str]) -> int:
    """Room a legend of ``labels`` needs: swatch, gap, the longest fitted label, margin."""
    return int(14 + _text_width(fit_labels(list(labels))) + 8)


def bar_chart(categories: Sequence[str], series: Sequence[tuple[str, Sequence[float]]], *,
              title: str, log: bool = False, stacked: bool = False,
              colors: Sequence[str] | None = None,
              colors_by_series: Sequence[str] | None = None, width: int = 760) -> str:
    """Horizontal bars, one group per category: one bar per series (or stacked).

    ``colors`` colours the bars of a single series per category; ``log`` uses a log x axis
    (counts that span orders of magnitude, such as data vs NAK packets)."""
    if not categories:
        return ""
    shown = fit_labels(categories, int((320 - 8) / CHAR_W))
    label_w = min(320, 8 + _text_width(shown))
    legend_w = 0 if len(series) == 1 else _legend_width(name for name, _ in series) + 6
    plot_w = width - label_w - legend_w - 20
    per = 1 if stacked else len(series)
    bar_h = 14 if per == 1 else 9
    group_h = per * bar_h + 8
    top = 24
    height = int(top + group_h * len(categories) + 30)
    totals = ([sum(vals[i] for _, vals in series) for i in range(len(categories))] if stacked
              else [v for _, vals in series for v in vals])
    peak = max([*totals, 1.0])

    def scale(v: float) -> float:
        if v <= 0:
            return 0.0
        if log:
            return plot_w * math.log10(1 + v) / math.log10(1 + peak)
        return plot_w * v / peak

    svg = [_svg_open(width, height)
           + f'role="img" aria-label="{html.escape(title)}">', _text(0, 14, title, size=13,
                                                                   extra=' font-weight="bold"')]
    palette = list(colors_by_series or PALETTE)
    for i, category in enumerate(categories):
        y0 = top + i * group_h
        svg.append(_text(label_w - 6, y0 + group_h / 2 + 3, shown[i], anchor="end",
                         extra=f' data-full="{html.escape(category)}"'))
        offset = 0.0
        for j, (name, values) in enumerate(series):
            value = float(values[i])
            color = (colors[i] if colors is not None and len(series) == 1
                     else palette[j % len(palette)])
            if stacked:
                start = scale(offset)
                offset += value
                w = scale(offset) - start
                y = y0
            else:
                start, w = 0.0, scale(value)
                y = y0 + j * bar_h
            if value > 0:
                svg.append(f'<rect x="{label_w + start:.1f}" y="{y:.1f}" width="{max(w, 1):.1f}" '
                           f'height="{bar_h - 1}" fill="{color}"><title>{html.escape(name)}: '
                           f'{value:,.0f}</title></rect>')
            if not stacked and value > 0:
                svg.append(_text(label_w + start + max(w, 1) + 3, y + bar_h - 3,
                                 _fmt(value), size=9))
        if stacked and offset > 0:
            svg.append(_text(label_w + scale(offset) + 3, y0 + bar_h - 3, _fmt(offset), size=9))
    axis_y = top + group_h * len(categories)
    svg.append(f'<line x1="{label_w}" y1="{top - 4}" x2="{label_w}" y2="{axis_y}" '
               'stroke="#555"/>')
    svg.append(_text(label_w, axis_y + 14, "0" if not log else "0 (log scale)", size=9))
    svg.append(_text(label_w + plot_w, axis_y + 14, _fmt(peak), anchor="end", size=9))
    if len(series) > 1:
        svg.append(_legend([(name, palette[j % len(palette)]) for j, (name, _) in
                            enumerate(series)], width - legend_w + 6, top + 10))
    svg.append("</svg>")
    return "".join(svg)


def line_chart(lines: Sequence[tuple[str, Sequence[tuple[float, float]]]], *, title: str,
               x_label: str, y_label: str, width: int = 760, height: int = 280) -> str:
    """Step lines (the value holds until the next point), one per series, with a legend."""
    points = [p for _, pts in lines for p in pts]
    if not points:
        return ""
    left, top, bottom = 56, 24, 40
    plot_w, plot_h = width - left - 190, height - top - bottom
    legend = [(name, PALETTE[i % len(PALETTE)]) for i, (name, _) in enumerate(lines[:14])]
    if len(lines) > 14:
        legend.append((f"and {len(lines) - 14} more (same colours again)", "#ffffff"))
    width = left + plot_w + 10 + _legend_width(name for name, _ in legend)
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x_ticks = _nice_ticks(min(xs), max(xs))
    y_ticks = _nice_ticks(0, max(max(ys), 1))
    x0, x1 = min(x_ticks[0], min(xs)), max(x_ticks[-1], max(xs))
    y1 = max(y_ticks[-1], max(ys))

    def sx(x: float) -> float:
        return left + plot_w * (x - x0) / ((x1 - x0) or 1)

    def sy(y: float) -> float:
        return top + plot_h * (1 - y / (y1 or 1))

    svg = [_svg_open(width, height)
           + f'role="img" aria-label="{html.escape(title)}">',
           _text(0, 14, title, size=13, extra=' font-weight="bold"')]
    for t in y_ticks:
        svg.append(f'<line x1="{left}" y1="{sy(t):.1f}" x2="{left + plot_w}" y2="{sy(t):.1f}" '
                   'stroke="#e5e5e5"/>')
        svg.append(_text(left - 4, sy(t) + 3, _fmt(t), anchor="end", size=9))
    for t in x_ticks:
        svg.append(_text(sx(t), top + plot_h + 14, _fmt(t), anchor="middle", size=9))
    svg.append(f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="none" '
               'stroke="#555"/>')
    svg.append(_text(left + plot_w / 2, height - 6, x_label, anchor="middle"))
    svg.append(_text(12, top + plot_h / 2, y_label, anchor="middle",
                     extra=f' transform="rotate(-90 12 {top + plot_h / 2:.1f})"'))
    for i, (name, pts) in enumerate(lines):
        color = PALETTE[i % len(PALETTE)]
        path = []
        previous: tuple[float, float] | None = None
        for x, y in sorted(pts):
            if previous is None:
                path.append(f"M{sx(x):.1f},{sy(y):.1f}")
            else:
                path.append(f"H{sx(x):.1f}V{sy(y):.1f}")
            previous = (x, y)
        svg.append(f'<path d="{"".join(path)}" fill="none" stroke="{color}" '
                   f'stroke-width="1.5"><title>{html.escape(name)}</title></path>')
    svg.append(_legend(legend, left + plot_w + 10, top + 10))
    svg.append("</svg>")
    return "".join(svg)


def timeline(lanes: Sequence[str], points: Sequence[tuple[int, float, str, str, str]], *,
             title: str, legend: Sequence[tuple[str, str, str]], width: int = 760) -> str:
    """Events on horizontal lanes over time: ``(lane, seconds, colour, shape, tooltip)``."""
    if not lanes or not points:
        return ""
    shown = fit_labels(lanes, int((260 - 8) / CHAR_W))
    label_w = min(260, 8 + _text_width(shown))
    right, top, lane_h = _legend_width(label for label, _, _ in legend) + 20, 24, 18
    plot_w = width - label_w - right
    height = int(top + lane_h * len(lanes) + 36)
    times = [p[1] for p in points]
    ticks = _nice_ticks(min(times), max(times))
    t0, t1 = min(ticks[0], min(times)), max(ticks[-1], max(times))

    def sx(t: float) -> float:
        return label_w + plot_w * (t - t0) / ((t1 - t0) or 1)

    svg = [_svg_open(width, height)
           + f'role="img" aria-label="{html.escape(title)}">',
           _text(0, 14, title, size=13, extra=' font-weight="bold"')]
    for i, lane in enumerate(lanes):
        y = top + i * lane_h + lane_h / 2
        svg.append(f'<line x1="{label_w}" y1="{y:.1f}" x2="{label_w + plot_w}" y2="{y:.1f}" '
                   'stroke="#e5e5e5"/>')
        svg.append(_text(label_w - 6, y + 3, shown[i], anchor="end",
                         extra=f' data-full="{html.escape(lane)}"'))
    bottom = top + lane_h * len(lanes)
    for t in ticks:
        svg.append(_text(sx(t), bottom + 14, _fmt(t), anchor="middle", size=9))
    svg.append(_text(label_w + plot_w / 2, bottom + 30, "seconds", anchor="middle"))
    for lane_index, t, color, shape, tip in points:
        x, y = sx(t), top + lane_index * lane_h + lane_h / 2
        svg.append(_marker(x, y, color, shape, tip))
    for i, (label, color, shape) in enumerate(legend):
        y = top + 10 + i * 16
        svg.append(_marker(label_w + plot_w + 16, y - 3, color, shape, label))
        svg.append(_text(label_w + plot_w + 26, y, label))
    svg.append("</svg>")
    return "".join(svg)


def _marker(x: float, y: float, color: str, shape: str, tip: str) -> str:
    title = f"<title>{html.escape(tip)}</title>"
    if shape == "cross":
        return (f'<g stroke="{color}" stroke-width="2">{title}<line x1="{x - 4:.1f}" '
                f'y1="{y - 4:.1f}" x2="{x + 4:.1f}" y2="{y + 4:.1f}"/><line x1="{x - 4:.1f}" '
                f'y1="{y + 4:.1f}" x2="{x + 4:.1f}" y2="{y - 4:.1f}"/></g>')
    if shape == "square":
        return (f'<rect x="{x - 4:.1f}" y="{y - 4:.1f}" width="8" height="8" '
                f'fill="{color}">{title}</rect>')
    return f'<circle cx="{x:.1f}" cy="{y:.1f}" r="4" fill="{color}" opacity="0.8">{title}</circle>'


def histogram(buckets: Sequence[tuple[float, float, int]], *, title: str, x_label: str,
              width: int = 760, height: int = 240) -> str:
    """Vertical bars over log-spaced buckets ``(low, high, count)`` (one bar per bucket)."""
    if not buckets:
        return ""
    left, top, bottom = 56, 24, 48
    plot_w, plot_h = width - left - 20, height - top - bottom
    peak = max(c for _, _, c in buckets) or 1
    bar_w = plot_w / len(buckets)
    svg = [_svg_open(width, height)
           + f'role="img" aria-label="{html.escape(title)}">',
           _text(0, 14, title, size=13, extra=' font-weight="bold"')]
    for t in _nice_ticks(0, peak):
        y = top + plot_h * (1 - t / peak)
        if y >= top - 0.5:
            svg.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" '
                       'stroke="#e5e5e5"/>')
            svg.append(_text(left - 4, y + 3, _fmt(t), anchor="end", size=9))
    for i, (low, high, count) in enumerate(buckets):
        h = plot_h * count / peak
        x = left + i * bar_w
        svg.append(f'<rect x="{x + 1:.1f}" y="{top + plot_h - h:.1f}" width="{bar_w - 2:.1f}" '
                   f'height="{h:.1f}" fill="{PALETTE[0]}"><title>{_duration(low)} - '
                   f'{_duration(high)}: {count:,}</title></rect>')
        if len(buckets) <= 24 or i % 2 == 0:
            svg.append(_text(x + bar_w / 2, top + plot_h + 12, _duration(low), anchor="middle",
                             size=9))
    svg.append(f'<line x1="{left}" y1="{top + plot_h}" x2="{left + plot_w}" '
               f'y2="{top + plot_h}" stroke="#555"/>')
    svg.append(_text(left + plot_w / 2, height - 8, x_label, anchor="middle"))
    svg.append("</svg>")
    return "".join(svg)


def _duration(us: float) -> str:
    if us >= 1e6:
        return f"{us / 1e6:g}s"
    if us >= 1e3:
        return f"{us / 1e3:g}ms"
    return f"{us:g}µs"
