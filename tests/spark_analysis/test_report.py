"""report.html: self-contained, anomalies first, plots that parse, tables that respect limits.

Most checks render synthetic result tables (no Spark); the last ones read the report the
corpus run wrote.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from typing import Any

import pytest

pd = pytest.importorskip("pandas")

from spark_analysis.report import (  # noqa: E402
    SECTIONS,
    ReportInput,
    bar_chart,
    histogram,
    line_chart,
    render,
    timeline,
)

VOID = {"meta", "br", "img", "input", "link", "hr", "col", "area", "base", "source", "wbr"}
SVG_EMPTY = {"rect", "line", "circle", "path"}


class Balance(HTMLParser):
    """Checks that every element is closed in order (SVG shapes may self-close)."""

    def __init__(self) -> None:
        super().__init__()
        self.stack: list[str] = []
        self.errors: list[str] = []
        self.tags: list[str] = []

    def handle_starttag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)
        if tag not in VOID:
            self.stack.append(tag)

    def handle_startendtag(self, tag: str, attrs: Any) -> None:
        self.tags.append(tag)

    def handle_endtag(self, tag: str) -> None:
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes {self.stack[-1:]}")
            return
        self.stack.pop()


def _check_html(text: str) -> Balance:
    parser = Balance()
    parser.feed(text)
    parser.close()
    assert not parser.errors, parser.errors[:5]
    assert not parser.stack, parser.stack
    return parser


def _self_contained(text: str) -> None:
    assert "<script" not in text and "<link" not in text and "<img" not in text
    urls = set(re.findall(r"https?://[^\s\"'<>]+", text))
    assert urls <= {"http://www.w3.org/2000/svg"}, urls


def _input(**tables: Any) -> ReportInput:
    counts = {name: len(df) for name, df in tables.items()}
    return ReportInput(files=["a.pcap"], options={"per_file": False}, tables=tables,
                       row_counts=counts, row_limit=10)


def _anomalies(n: int) -> Any:
    return pd.DataFrame({
        "capture": ["all"] * n, "severity": ["error"] * n, "kind": ["ack-for-unsent-sqn"] * n,
        "ts_ns": [1_000_000_000 + 1000 * i for i in range(n)], "file": ["a.pcap"] * n,
        "file_offset": list(range(n)), "subject": [f"store <{i}> & co" for i in range(n)],
        "detail": ["sqn 9 was not sent"] * n})


def test_empty_results_render() -> None:
    text = render(_input())
    _check_html(text)
    _self_contained(text)
    assert "No anomalies found" in text
    for key, title in SECTIONS:
        assert f'id="{key}"' in text and title.split()[0] in text


def test_anomalies_come_first_and_rows_are_limited() -> None:
    anomalies = _anomalies(25)
    summary = pd.DataFrame({"capture": ["all"], "severity": ["error"],
                            "kind": ["ack-for-unsent-sqn"], "count": [25],
                            "first_ts_ns": [1_000_000_000], "example_subject": ["x"],
                            "example_detail": ["y"], "example_file": ["a.pcap"],
                            "example_file_offset": [0]})
    text = render(_input(anomalies=anomalies, anomaly_summary=summary))
    _check_html(text)
    positions = [text.index(f'<h2 id="{key}"') for key, _ in SECTIONS]
    assert positions == sorted(positions) and SECTIONS[0][0] == "anomalies"
    section = text[positions[0]:positions[1]]
    assert "25 error(s)" in section
    assert "First 10 of 25 rows" in section
    assert "15 more row(s) not shown" in section
    # the subject text is escaped, never markup
    assert "store &lt;3&gt; &amp; co" in section and "store <3>" not in section
    # times are seconds from the first event (the ninth anomaly is 9 us later), not raw ns
    assert ">0.000009</span>" in section and "1,000,009,000" not in section


def test_plots_are_valid_svg_with_escaped_labels() -> None:
    svgs = [
        bar_chart(["a<b", "c&d"], [("data", [10.0, 1000.0]), ("NAK", [1.0, 0.0])],
                  title="t <1>", log=True),
        bar_chart(["x"], [("served", [3.0]), ("ncf", [1.0]), ("unanswered", [0.0])],
                  title="stacked", stacked=True),
        line_chart([("s<1>", [(0.0, 1.0), (0.5, 3.0), (1.0, 0.0)])], title="flight",
                   x_label="seconds", y_label="in flight"),
        timeline(["store a", "store b"], [(0, 0.1, "#000", "circle", "ok <1>"),
                                          (1, 0.2, "#f00", "cross", "error"),
                                          (1, 0.3, "#777", "square", "none")],
                 title="registrations", legend=[("granted", "#000", "circle")]),
        histogram([(1.0, 2.0, 5), (2.0, 4.0, 0), (4.0, 8.0, 12)], title="latency",
                  x_label="latency"),
    ]
    for svg in svgs:
        root = ET.fromstring(svg)
        assert root.tag.endswith("svg")
        assert float(root.get("width", 0)) > 0 and float(root.get("height", 0)) > 0
    assert "a&lt;b" in svgs[0] and "t &lt;1&gt;" in svgs[0]
    # log scale: the 10-packet bar is visibly shorter than the 1000-packet one, but not 100x
    widths = [float(r.get("width", 0)) for r in ET.fromstring(svgs[0]).iter()
              if r.tag.endswith("rect") and r.get("height") == "8"]
    assert widths and 2 < max(widths) / min(widths) < 100
    assert bar_chart([], [], title="none") == "" and histogram([], title="", x_label="") == ""


def test_registration_timeline_marks_outcomes() -> None:
    regs = pd.DataFrame({
        "capture": ["all"] * 3, "ts_ns": [10**9, 2 * 10**9, 3 * 10**9],
        "role": ["source", "source", "receiver"], "client_ip": ["1.1.1.1", "4.4.4.4", "2.2.2.2"],
        "client_port": [40000] * 3, "store_ip": ["3.3.3.3"] * 3, "store_port": [14567] * 3,
        "source_ip": ["1.1.1.1", "4.4.4.4", "1.1.1.1"], "topic": ["t"] * 3,
        "outcome": ["granted", "error", "unanswered"], "error": [None, "RegID in use", None],
        "granted_reg_id": [1001, None, None], "error_code": [None, 5, None]})
    text = render(_input(registrations=regs))
    _check_html(text)
    section = text[text.index('id="registrations"'):text.index('id="latency"')]
    assert section.count("<circle") >= 1 and "<line x1" in section
    assert "source 4.4.4.4:40000 -&gt; 3.3.3.3; topic t; error (RegID in use)" in section
    assert "3.3.3.3:14567 receiver" in section


# =============================================================================================
# The corpus report
# =============================================================================================


@pytest.fixture(scope="module")
def corpus_report(request: pytest.FixtureRequest,
                  tmp_path_factory: pytest.TempPathFactory) -> str:
    from .analysis_corpus import shared_corpus_run

    run = shared_corpus_run(request, tmp_path_factory)
    assert run.exit_code == 0, run.stderr
    return (run.out / "report.html").read_text()


def test_corpus_report(corpus_report: str) -> None:
    text = corpus_report
    parser = _check_html(text)
    _self_contained(text)
    # one capture per file: every plot is drawn per capture
    assert parser.tags.count("svg") >= 5 * 4
    assert "— " in text and "planted.pcap" in text
    anomalies = text[text.index('id="anomalies"'):text.index('id="topics"')]
    for kind in ("ack-for-unsent-sqn", "regid-reuse", "regid-conflict", "registration-error"):
        assert kind in anomalies
    assert "RegID is in use by a different source" in text
    assert len(text) < 2_000_000


# =============================================================================================
# Labels, booleans, charts only where they mean something
# =============================================================================================


def test_fitted_labels_stay_distinct_and_short() -> None:
    from spark_analysis.report import fit_labels

    long = [f"lbtrm:127.1.0.1:14390:4d9ec766:{'x' * 30} tidx {i}" for i in (1, 2, 10)]
    short = fit_labels(long, 40)
    assert len(set(short)) == 3 and all(len(s) <= 40 for s in short)
    assert all(s.startswith("lbtrm:127.1") and "…" in s for s in short)
    assert short[2].endswith("tidx 10")
    # labels that differ only in the middle still come out distinct (numbered)
    middle = [f"{'a' * 30}{c}{'b' * 30}" for c in "xyz"]
    fitted = fit_labels(middle, 20)
    assert len(set(fitted)) == 3 and all(len(s) <= 20 for s in fitted)
    assert fit_labels(["data", "RX"]) == ["data", "RX"]  # short labels are left alone


def test_booleans_are_yes_or_no_and_null_is_blank() -> None:
    ads = pd.DataFrame({"capture": ["all"] * 3, "topic": ["a", "b", "c"],
                        "persistent": [True, False, None], "stores": [3, 0, 0]})
    text = render(_input(topic_advertisements=ads))
    rows = re.findall(r"<tr>(.*?)</tr>", text[text.index('id="topics"'):])
    cells = [re.findall(r"<td[^>]*>([^<]*)</td>", row) for row in rows[1:4]]
    assert [c[1] for c in cells] == ["yes", "no", ""]


def test_flight_chart_only_for_source_topics_with_stores() -> None:
    from spark_analysis.report import persistent_topics

    summary = pd.DataFrame({
        "capture": ["all"] * 3, "session": ["s1", "s1", "s2"], "source_ip": ["1", "1", "2"],
        "tidx": [1, 2, 1], "messages": [10, 10, 5000], "stabilized": [10, 0, 0],
        "never_stable": [0, 10, 5000], "stores": [2, None, None]})
    series = pd.DataFrame({
        "capture": ["all"] * 3, "session": ["s1", "s1", "s2"], "source_ip": ["1", "1", "2"],
        "tidx": [1, 2, 1], "bin": [0, 0, 0], "max_in_flight": [3, 10, 5000],
        "bin_start_ns": [10**9] * 3})
    # topic 2 of source 1 never got stable, but its stores ACKed it: it is drawn
    latency = pd.DataFrame({"capture": ["all"], "kind": ["stability"], "source_ip": ["1"],
                            "tidx": [2], "store_ip": ["9"], "acks": [4]})
    data = _input(flight_size_summary=summary, flight_size=series, latency_summary=latency)
    assert persistent_topics(data) == {("all", "1", 1), ("all", "1", 2)}
    text = render(data)
    section = text[text.index('id="flight"'):text.index('id="retransmissions"')]
    assert section.count("<path") == 2 and "s2 tidx 1" not in section
    assert "1 source topic(s) without stores left out" in section
    # a TIR with the UME option marks a topic persistent too
    ads = pd.DataFrame({"capture": ["all"], "source_ip": ["2"], "topic_index": [1],
                        "persistent": [True]})
    assert ("all", "2", 1) in persistent_topics(_input(flight_size_summary=summary,
                                                       topic_advertisements=ads))
