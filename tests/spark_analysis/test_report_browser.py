"""report.html laid out by a real browser (headless Chromium): nothing wider than the window
unless it sits in a scroll box, every chart label inside its chart, legend entries distinct,
no flight chart without stores, "yes"/"no" for booleans.

The page itself has no script (it must open anywhere, mailed or attached to a ticket), so the
test renders a copy with a probe script appended: the script measures the laid-out page and
writes its findings into the DOM, which ``chromium --dump-dom`` prints.  Chromium is installed
by ``scripts/ensure-tools`` (the conformance report's test uses it too).
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from spark_analysis.report import ReportInput, render

PROBE = r"""
<script>
(function () {
  const vw = document.documentElement.clientWidth;
  const scroller = (el) => {
    for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
      const x = getComputedStyle(a).overflowX;
      if (x === 'auto' || x === 'scroll') return a;
    }
    return null;
  };
  const name = (el) => el.tagName.toLowerCase() + (el.id ? '#' + el.id : '') +
      (el.className && typeof el.className === 'string' ? '.' + el.className : '') +
      ' "' + (el.textContent || '').trim().slice(0, 40) + '"';
  const overflowing = [];
  for (const el of document.body.querySelectorAll('*')) {
    if (el.closest('svg') && el.tagName.toLowerCase() !== 'svg') continue;
    const r = el.getBoundingClientRect();
    if (r.width === 0 || r.height === 0) continue;  // not shown (a closed <details>)
    if (r.right <= vw + 0.5) continue;
    const box = scroller(el);
    if (!box || box.getBoundingClientRect().right > vw + 0.5) overflowing.push(name(el));
  }
  const charts = [];
  for (const svg of document.querySelectorAll('svg')) {
    const box = svg.getBoundingClientRect();
    const outside = [...svg.querySelectorAll('text')].filter((t) => {
      const b = t.getBoundingClientRect();
      return b.width > 0 && (b.left < box.left - 1 || b.right > box.right + 1);
    }).map((t) => t.textContent);
    charts.push({
      title: svg.getAttribute('aria-label'),
      section: (svg.closest('[data-section]') || {dataset: {}}).dataset.section || null,
      legend: [...svg.querySelectorAll('.legend-item text')].map((t) => t.textContent),
      outside: outside,
      width: box.width,
    });
  }
  const scrolls = [...document.querySelectorAll('.scroll')].map((s) => ({
    right: s.getBoundingClientRect().right, scrolls: s.scrollWidth > s.clientWidth}));
  const out = document.createElement('pre');
  out.id = 'layout-probe';
  out.textContent = JSON.stringify({
    viewport: vw, pageWidth: document.documentElement.scrollWidth,
    overflowing: overflowing, charts: charts, scrolls: scrolls});
  document.body.appendChild(out);
})();
</script>
"""


def layout(page: str, tmp_path: Path, width: int) -> dict[str, Any]:
    """The probe's findings for ``page`` in a ``width`` x 900 pixel window."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is installed by scripts/ensure-tools"
    path = tmp_path / f"report-{width}.html"
    path.write_text(page.replace("</body>", PROBE + "</body>"))
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={width},900",
         "--hide-scrollbars", "--dump-dom", path.as_uri()],
        capture_output=True, text=True, timeout=180)
    found = re.search(r'<pre id="layout-probe">(.*?)</pre>', proc.stdout, re.S)
    assert found, proc.stderr[-2000:]
    result: dict[str, Any] = json.loads(html.unescape(found.group(1)))
    return result


LONG = "lbtrm:127.1.0.1:14390:4d9ec766"
"""A session label as the analyses write it: two topics of it share 30 characters."""


def _wide_input() -> ReportInput:
    """Result tables that stress the layout: wide tables, long shared-prefix legend labels,
    a persistent and a store-less source topic, booleans."""
    sessions = pd.DataFrame({
        "capture": ["all"] * 2, "session": [LONG, LONG.replace("4d9ec766", "2e883c97")],
        "protocol": ["lbtrm"] * 2, "mcast_group": ["224.10.10.10"] * 2,
        **{col: [123456789, 42] for col in (
            "messages", "topics", "data_packets", "data_bytes", "rx_packets", "rx_bytes",
            "sm_packets", "nak_packets", "nak_sqns", "ncf_packets", "ncf_sqns",
            "creq_packets", "ack_packets", "rst_packets", "peers")},
        **{col: [1234.5678, 0.5] for col in (
            "duration_s", "data_packets_per_s", "rx_packets_per_s", "nak_packets_per_s",
            "ncf_packets_per_s", "sm_packets_per_s", "messages_per_s", "data_bytes_per_s")},
        "first_ts_ns": [1_700_000_000_000_000_000] * 2,
        "last_ts_ns": [1_700_000_001_000_000_000] * 2})
    bins = list(range(20))
    flight = pd.DataFrame({
        "capture": ["all"] * 60, "session": [LONG] * 40 + ["lbtru:127.1.0.2:14380:1"] * 20,
        "source_ip": ["127.1.0.1"] * 40 + ["127.1.0.2"] * 20,
        "tidx": [1] * 20 + [2] * 20 + [1] * 20, "bin": bins * 3,
        "max_in_flight": [b % 7 for b in bins] + [b % 5 for b in bins] + [b * 250 for b in bins],
        "bin_start_ns": [1_700_000_000_000_000_000 + b * 10**7 for b in bins] * 3})
    flight_summary = pd.DataFrame({
        "capture": ["all"] * 3, "session": [LONG, LONG, "lbtru:127.1.0.2:14380:1"],
        "source_ip": ["127.1.0.1", "127.1.0.1", "127.1.0.2"], "tidx": [1, 2, 1],
        "messages": [100, 100, 5000], "stabilized": [100, 99, 0], "never_stable": [0, 1, 5000],
        "peak_in_flight": [6, 4, 4750], "stores": [3, 3, None], "acks_needed": [2, 2, None]})
    ads = pd.DataFrame({
        "capture": ["all"] * 2, "topic": ["ump.topic.a", "plain.topic"],
        "transport": ["lbtrm", "lbtru"], "session": [LONG, "lbtru:127.1.0.2:14380:1"],
        "source_ip": ["127.1.0.1", "127.1.0.2"], "topic_index": [1, 1],
        "persistent": [True, False], "stores": [3, 0], "tirs": [10, 10]})
    tables = {"transport_sessions": sessions, "flight_size": flight,
              "flight_size_summary": flight_summary, "topic_advertisements": ads}
    return ReportInput(files=["/captures/some/rather/long/directory/name/capture.pcap"],
                       options={"per_file": False}, tables=tables,
                       row_counts={n: len(t) for n, t in tables.items()}, row_limit=20)


@pytest.fixture(scope="module")
def page() -> str:
    return render(_wide_input())


@pytest.mark.parametrize("width", [1280, 640])
def test_nothing_is_cut_at_the_right_edge(page: str, tmp_path: Path, width: int) -> None:
    found = layout(page, tmp_path, width)
    assert found["overflowing"] == [], found["overflowing"][:5]
    assert found["pageWidth"] <= found["viewport"]  # no sideways scrolling of the page
    # the wide sessions table scrolls in its own box, which fits the window
    assert found["scrolls"] and all(s["right"] <= found["viewport"] + 0.5
                                    for s in found["scrolls"])
    assert any(s["scrolls"] for s in found["scrolls"])
    for chart in found["charts"]:
        assert chart["outside"] == [], chart
        assert chart["width"] <= found["viewport"]


def test_legends_are_distinct_and_fit(page: str, tmp_path: Path) -> None:
    charts = layout(page, tmp_path, 1280)["charts"]
    legends = [c["legend"] for c in charts if c["legend"]]
    assert legends, charts
    for legend in legends:
        assert len(set(legend)) == len(legend), legend
    flight = [c for c in charts if (c["title"] or "").startswith("Messages in flight")]
    assert len(flight) == 1
    # both topics of the long session are told apart, the store-less one is not drawn
    assert len(flight[0]["legend"]) == 2
    assert all("tidx 1" in t or "tidx 2" in t for t in flight[0]["legend"])


def test_booleans_read_yes_and_no(page: str) -> None:
    topics = page[page.index('id="topics"'):page.index('id="sessions"')]
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", topics)
    assert "yes" in cells and "no" in cells


def test_no_flight_chart_without_stores(tmp_path: Path) -> None:
    data = _wide_input()
    tables = dict(data.tables)
    summary = tables["flight_size_summary"]
    tables["flight_size_summary"] = summary.assign(stores=[None] * len(summary))
    tables["topic_advertisements"] = tables["topic_advertisements"].assign(persistent=False)
    text = render(ReportInput(files=data.files, options=data.options, tables=tables,
                              row_counts=data.row_counts, row_limit=20))
    section = text[text.index('id="flight"'):text.index('id="retransmissions"')]
    assert "<svg" not in section and "No source topic uses stores" in section
    assert "3 source topic(s) without stores left out" in section
