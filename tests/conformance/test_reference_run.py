"""``ump conform`` against the reference store: every case passes, every report is complete,
every evidence pcap dissects identically in wire/ and tshark, and the HTML report renders in
headless Chromium with every case and its evidence.

One run (about 15 s) is shared by the tests of this module.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from conformance.model import Role, all_cases
from tests.conformance.explain import explain
from tests.conformance.judged import DELIBERATE, by_iut, passive_failures
from wire.dissect import check_against_tshark, dissect_file
from wire.tshark import PortMap

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("conform") / "out"
    proc = subprocess.run([sys.executable, "-m", "ump", "conform", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    return proc, out


def _results(out: Path) -> dict[str, Any]:
    return json.loads((out / "results.json").read_text())


def test_every_case_passes_against_the_reference_store(
        run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, out = run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = _results(out)
    assert {c["id"] for c in data["cases"]} == {c.id for c in all_cases(Role.STORE)}
    # the RPP matrix's "pre-5.3 store" column needs a store whose profile says pre-5.3
    pre53 = {c["id"] for c in data["cases"]
             if (c.get("rpp_cell") or {}).get("store") == "pre-5.3 store"}
    failed = [(c["id"], c["verdict"], c["message"]) for c in data["cases"]
              if c["verdict"] != ("unsupported" if c["id"] in pre53 else "pass")]
    assert failed == [] and len(pre53) == 6
    passed = len(data["cases"]) - len(pre53)
    assert data["exit_code"] == 0 and data["counts"]["pass"] == passed
    assert f"{passed} pass" in proc.stdout


def test_junit_lists_every_case_without_failures(
        run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = run
    root = ET.parse(out / "junit.xml").getroot()
    cases = root.findall(".//testcase")
    assert len(cases) == len(all_cases(Role.STORE))
    assert not root.findall(".//failure") and not root.findall(".//error")
    assert {s.get("name") for s in root.findall("testsuite")} == {
        "registration", "recovery", "robustness", "proactive-retransmit", "durability",
        "rpp-matrix", "rpp", "quorum", "proxy", "otr"}


def test_every_evidence_pcap_is_judged_passively_without_a_failure(
        run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    """What the reference store did in every case, judged from the capture alone (``ump
    conform --capture``): the store fails nothing, and the harness's peers only what they
    break on purpose."""
    _, out = run
    cases = _results(out)["cases"]
    failures = passive_failures(out, cases)
    assert by_iut(failures, Role.STORE, cases) == []
    assert [f for f in failures if f[:2] not in DELIBERATE] == []


@pytest.mark.oracle
def test_every_evidence_pcap_agrees_with_tshark(
        run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    _, out = run
    checked = 0
    ran = [c for c in _results(out)["cases"] if c["verdict"] != "unsupported"]
    for case in ran:
        pcap = out / case["pcap"]
        ports = PortMap(store_ports=[case["store_port"]])
        reports = list(dissect_file(pcap, ports))
        assert any(r.status == "um" for r in reports), case["id"]
        problems = check_against_tshark(pcap, reports, ports)
        assert not problems, f"{case['id']}: {explain(pcap, ports, reports, problems)}"
        checked += 1
    # every case but the RPP matrix's pre-5.3 store column (unsupported: no traffic)
    assert checked == len(all_cases(Role.STORE)) - 6


def test_html_report_renders_in_headless_chromium(
        run: tuple[subprocess.CompletedProcess[str], Path], tmp_path: Path) -> None:
    _, out = run
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is installed by scripts/ensure-tools"
    proc = subprocess.run(
        [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom",
         (out / "report.html").as_uri()],
        capture_output=True, text=True, timeout=120)
    dom = proc.stdout
    assert "<table id=\"index\">" in dom, proc.stderr[-2000:]
    for case in _results(out)["cases"]:
        # a section per case; a case run on another transport than LBT-TCP (OTR-STORE-003
        # on LBT-RU) is anchored with it, so one case on several transports has several
        transport = case.get("transport", "tcp")
        anchor = case["id"] if transport == "tcp" else f'{case["id"]}-{transport}'
        assert f'id="{anchor}"' in dom and f'href="#{anchor}"' in dom
        assert f'href="{case["pcap"]}"' in dom  # with its evidence
    # verdict badges: index + sections
    assert dom.count('class="v"') >= 2 * len(all_cases(Role.STORE))
    assert "guide section" in dom and "packet timeline" in dom


def test_pytest_plugin_runs_cases_as_items(tmp_path: Path) -> None:
    junit = tmp_path / "pytest-junit.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conformance.pytest_plugin", "-p",
         "no:cacheprovider", "-q", "--iut", "default", "--conform-suite", "registration",
         "--conform-out", str(tmp_path / "out"), "-k", "REG-STORE-001 or REG-STORE-003",
         f"--junitxml={junit}"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "2 passed" in proc.stdout
    names = {tc.get("name") for tc in ET.parse(junit).getroot().iter("testcase")}
    assert names == {"test_conformance[REG-STORE-001]", "test_conformance[REG-STORE-003]"}
    assert (tmp_path / "out" / "report.html").exists()
