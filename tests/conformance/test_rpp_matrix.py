"""``ump conform --suite rpp-matrix``: the guide's "UMP Version RPP Compatibility Matrix" against
the reference implementation in every role, and the grid the HTML report draws of it.

The grids of verdicts are asserted whole: a 5.3 reference store passes the two 5.3 columns and
leaves the pre-5.3 column unsupported; run as a pre-5.3 store (profile version ``pre-5.3``) it
is the other way round, and what it answered (read back from the evidence: the PREG_RESP's E
and W flags) is exactly the matrix's pre-5.3 column.  The reference source and receiver pass
their 5.3 rows, or their pre-5.3 row when their profile says pre-5.3.  A store reached at an
address offers its RPP and non-RPP topics through the profile's ``rpp_topic``/``spp_topic``.
Every run is short (a registration or two per cell).
"""

from __future__ import annotations

import dataclasses
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from conformance.model import Role, Verdict, all_cases
from conformance.profile import BUILTIN_PROFILES, REFERENCE_STORE, IutProfile
from conformance.report import case_json, write_html
from conformance.runner import CaseResult, Runner, RunResult, run, select
from conformance.suites.rpp_matrix import CELL_OF, RPP_TOPIC, SPP_TOPIC
from reference_impl import rpp
from reference_impl.config.store_xml_writer import StoreXml, TopicXml, store_daemon_xml
from tests.reference_impl.loopback import Proc, free_port

PRE53 = "pre-5.3"
Grid = dict[tuple[str, str], str]


def _grid(result: RunResult) -> Grid:
    """(client kind, store kind) -> verdict of every matrix case of the run."""
    out: Grid = {}
    for r in result.results:
        cell = CELL_OF[r.spec.id]
        out[cell.client, cell.store] = r.verdict.value
    return out


def _why(result: RunResult) -> list[tuple[str, str, str]]:
    return [(r.spec.id, r.verdict.value, r.message) for r in result.results
            if r.verdict not in (Verdict.PASS, Verdict.UNSUPPORTED)]


def _expected(rows: tuple[str, ...], *, pre53: bool) -> Grid:
    """pass where the IUT's version meets the cell (the pre-5.3 column/row for a pre-5.3 IUT,
    the rest for a 5.3 one), unsupported elsewhere."""
    def runs(c: rpp.Cell) -> bool:
        old = c.store == "pre-5.3 store" if rows == rpp.CLIENT_KINDS \
            else c.client.startswith("pre-5.3")
        return old == pre53
    return {(c.client, c.store): "pass" if runs(c) else "unsupported"
            for c in rpp.MATRIX if c.client in rows}


def _observed_outcome(case: dict[str, Any]) -> rpp.Outcome:
    """The outcome the store's last PREG_RESP of a store case shows (its E and W flags)."""
    answers = [e["text"] for e in case["timeline"]
               if e["kind"] == "tcp" and e["text"].startswith("PREG-RESP")]
    last = answers[-1]
    if "e_flag=1" in last:
        return rpp.Outcome.REJECTED
    client = case["rpp_cell"]["client"]
    if client.startswith("5.3 RPP") and "w_flag=1" not in last:
        return rpp.Outcome.SOURCE_ERROR if client.endswith("source") \
            else rpp.Outcome.RECEIVER_ERROR
    return rpp.Outcome.GRANTED


@pytest.mark.parametrize("version", ["current", PRE53])
def test_reference_store_in_the_matrix(version: str, tmp_path: Path) -> None:
    profile = dataclasses.replace(REFERENCE_STORE, version=version)
    result = run(profile, tmp_path / "out", suites=["rpp-matrix"])
    assert _why(result) == []
    assert _grid(result) == _expected(rpp.CLIENT_KINDS, pre53=version == PRE53)
    assert result.exit_code == 0
    # what the store answered, read from the evidence, is the guide's cell
    observed = {(c.client, c.store): _observed_outcome(case_json(r, result.out))
                for r in result.results if r.verdict is Verdict.PASS
                for c in [CELL_OF[r.spec.id]]}
    assert observed == {(c.client, c.store): c.outcome for c in rpp.MATRIX
                        if (c.client, c.store) in observed}
    if version == PRE53:
        assert {store for _, store in observed} == {"pre-5.3 store"}
        assert len(observed) == 6


@pytest.mark.parametrize("role, version", [("source", "current"), ("source", PRE53),
                                           ("receiver", "current"), ("receiver", PRE53)])
def test_reference_clients_in_the_matrix(role: str, version: str, tmp_path: Path) -> None:
    profile = dataclasses.replace(BUILTIN_PROFILES[role], version=version)
    result = run(profile, tmp_path / "out", suites=["rpp-matrix"])
    assert _why(result) == []
    rows = rpp.CLIENT_KINDS[:3] if role == "source" else rpp.CLIENT_KINDS[3:]
    assert _grid(result) == _expected(rows, pre53=version == PRE53)
    assert result.exit_code == 0


def _address_profile(port: int, **topics: str) -> IutProfile:
    return IutProfile(name="reference store at an address", role=Role.STORE,
                      address=("127.0.0.1", port), **topics)  # type: ignore[arg-type]


@pytest.mark.parametrize("named", [True, False])
def test_store_at_an_address_names_its_rpp_topics(named: bool, tmp_path: Path) -> None:
    """A store the harness does not launch: its own XML has an RPP topic and a non-RPP one;
    with ``rpp_topic``/``spp_topic`` the 5.3 columns run on them, without they are unsupported
    (saying which key is missing)."""
    port = free_port()
    topics = {"rpp_topic": "conform.rpp", "spp_topic": "conform.spp"} if named else {}
    profile = _address_profile(port, **topics)
    cases = select(all_cases(Role.STORE), suites=["rpp-matrix"])
    base: dict[str, str | int] = {"repository-type": "memory",
                                  "repository-size-threshold": 64 << 20,
                                  "repository-size-limit": 128 << 20}
    with Runner(profile, tmp_path / "out") as runner:
        assert runner.resolver_port is not None
        resolver = runner.resolver_port.addr
        (tmp_path / "lbm.cfg").write_text(
            f"context resolver_unicast_daemon {resolver[0]}:{resolver[1]}\n")
        (tmp_path / "store.xml").write_text(store_daemon_xml([StoreXml(
            "at-address", port, options={"disk-cache-directory": "cache",
                                         "disk-state-directory": "state"},
            topics=[TopicXml(r"conform\.rpp\..*", {**base, **RPP_TOPIC}),
                    TopicXml(r"conform\.spp\..*", {**base, **SPP_TOPIC}),
                    TopicXml(r"conform\..*", base)])], lbm_config="lbm.cfg"))
        store = Proc(["store", "-c", "store.xml"], tmp_path)
        try:
            store.wait_for("ready to accept registrations")
            results = [runner.run_case(spec) for spec in cases]
        finally:
            store.stop()
    verdicts: dict[str, set[str]] = {store: set() for store in rpp.STORE_KINDS}
    for r in results:
        verdicts[CELL_OF[r.spec.id].store].add(r.verdict.value)
    assert [(r.spec.id, r.message) for r in results if r.verdict is Verdict.FAIL] == []
    assert verdicts["pre-5.3 store"] == {"unsupported"}
    if named:
        assert verdicts["5.3 RPP store"] == verdicts["5.3 non-RPP store"] == {"pass"}
    else:
        assert verdicts["5.3 RPP store"] == verdicts["5.3 non-RPP store"] == {"unsupported"}
        messages = {r.message for r in results if CELL_OF[r.spec.id].store != "pre-5.3 store"}
        assert any("names no rpp_topic" in m for m in messages), messages
        assert any("names no spp_topic" in m for m in messages), messages


class _Cells(HTMLParser):
    """Every ``<td class="mtx">`` of the report: (grid role, row, column) -> (case, verdict)."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str, int], tuple[str | None, str]] = {}
        self._role = ""
        self._row = ""
        self._column = 0
        self._in_th = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "table" and a.get("class") == "matrix":
            self._role = a.get("data-role") or ""
        elif tag == "tr":
            self._column = 0
        elif tag == "th" and self._role:
            self._in_th = True
        elif tag == "td" and a.get("class") == "mtx":
            self.cells[self._role, self._row, self._column] = (a.get("data-case"),
                                                               a.get("data-verdict") or "")
            self._column += 1

    def handle_endtag(self, tag: str) -> None:
        if tag == "th":
            self._in_th = False
        elif tag == "table":
            self._role = ""

    def handle_data(self, data: str) -> None:
        if self._in_th and data.strip():
            self._row = data.strip()


def test_html_report_draws_the_matrix_grid(tmp_path: Path) -> None:
    """A run with store cases of every verdict and two source cases: one grid per role, each
    cell at its row and column with its case's verdict; the source grid has only source rows
    and marks the cells without a result "not run"."""
    verdicts = list(Verdict)
    store_cases = [c for c in all_cases(Role.STORE) if c.id in CELL_OF]
    source_cases = [c for c in all_cases(Role.SOURCE) if c.id in CELL_OF][:2]
    results = [CaseResult(spec, verdicts[i % len(verdicts)])
               for i, spec in enumerate(store_cases)]
    results += [CaseResult(spec, Verdict.FAIL, message="x") for spec in source_cases]
    out = tmp_path / "out"
    out.mkdir()
    result = RunResult(REFERENCE_STORE, results, 1.0, out, 1.0)
    write_html(result, out / "report.html")
    page = (out / "report.html").read_text()
    assert "UMP Version RPP Compatibility Matrix" in page
    parser = _Cells()
    parser.feed(page)
    columns = list(rpp.STORE_KINDS)
    for r in results:
        cell = CELL_OF[r.spec.id]
        where = (r.spec.role.value, cell.client, columns.index(cell.store))
        assert parser.cells[where] == (r.spec.id, r.verdict.value), where
    store_grid = {k: v for k, v in parser.cells.items() if k[0] == "store"}
    source_grid = {k: v for k, v in parser.cells.items() if k[0] == "source"}
    assert len(store_grid) == 18
    assert {row for _, row, _ in source_grid} == set(rpp.CLIENT_KINDS[:3])
    assert len(source_grid) == 9
    assert sum(v == (None, "not run") for v in source_grid.values()) == 7
    # the guide's outcome is in each cell
    for c in rpp.MATRIX:
        assert re.search(rf"guide: {re.escape(c.label)}</small>", page), c.label
    assert not any(k[0] == "receiver" for k in parser.cells)
