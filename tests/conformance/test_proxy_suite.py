"""``ump conform --suite proxy`` against the reference store run as a group of three instances:
every PXY-STORE case passes, each instance's ``<lbm-config>`` names the whole group, each
instance has a store name of its own, and a
profile that allows fewer instances than a case needs makes it unsupported, not failed.

One run of the suite (about 85 s) and one of a single case.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conformance.model import Role, Verdict, all_cases
from conformance.profile import REFERENCE_STORE, ProfileError, parse_profile
from conformance.runner import run as run_cases

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory
        ) -> tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("proxy") / "out"
    proc = subprocess.run([sys.executable, "-m", "ump", "conform", "--suite", "proxy",
                           "--out", str(out)], capture_output=True, text=True, timeout=600,
                          cwd=ROOT)
    results = json.loads((out / "results.json").read_text()) if \
        (out / "results.json").exists() else {}
    return proc, out, results


def test_every_proxy_case_passes_against_the_reference(
        run: tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]) -> None:
    proc, _, results = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ids = {c.id for c in all_cases(Role.STORE) if c.suite == "proxy"}
    assert ids == {f"PXY-STORE-00{n}" for n in range(1, 10)}
    verdicts = {c["id"]: c["verdict"] for c in results["cases"]}
    assert verdicts == {i: "pass" for i in ids}, results["cases"]


def test_each_instance_names_the_whole_group_in_its_lbm_config(
        run: tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]) -> None:
    _, out, _ = run
    groups = []
    for lbm in sorted((out / "iut").glob("*/lbm.cfg")):
        stores = re.findall(r"^source ume_store (127\.0\.0\.1:\d+):0:0$", lbm.read_text(), re.M)
        if stores:
            groups.append((lbm.parent.name, stores))
    assert len(groups) >= 2 * 9  # two or three instances per case
    by_case: dict[str, set[tuple[str, ...]]] = {}
    for name, stores in groups:
        by_case.setdefault(name.split("-")[0], set()).add(tuple(stores))
    # every instance of one case's group wrote the same group, of two or three stores
    assert all(len(g) == 1 and len(next(iter(g))) in (2, 3) for g in by_case.values()), by_case


def test_each_instance_carries_its_own_store_name(
        run: tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]) -> None:
    """The instances of a case's group have distinct ``<store>`` names and ``context-name``s,
    which their log lines use and the case's evidence names with their addresses."""
    _, out, results = run
    by_case: dict[str, list[str]] = {}
    for xml in sorted((out / "iut").glob("*/store.xml")):
        text = xml.read_text()
        name = re.search(r'<store name="([^"]+)"', text)
        context = re.search(r'name="context-name" value="([^"]+)"', text)
        assert name is not None and context is not None and context[1] == name[1], text
        assert f'Store "{name[1]}" ready' in (xml.parent / "iut.log").read_text()
        by_case.setdefault(xml.parent.name.split("-")[0], []).append(name[1])
    groups = [names for names in by_case.values() if len(names) > 1]
    assert len(groups) >= 9 and all(len(set(g)) == len(g) for g in groups), by_case
    for case in results["cases"]:
        notes = (out / "cases" / case["id"] / "timeline.json").read_text()
        assert re.search(r"group of conformance-store \S+, conformance-store-1 ", notes), \
            case["id"]


def test_a_profile_with_one_instance_makes_the_cases_unsupported(tmp_path: Path) -> None:
    profile = parse_profile({"iut": {
        "name": "one instance", "role": "store", "launch": list(REFERENCE_STORE.launch or ()),
        "ready": "ready to accept registrations"}}, "<one instance>")
    assert profile.instances == 1
    result = run_cases(profile, tmp_path / "out", keywords=["PXY-STORE-002"])
    (only,) = result.results
    assert only.verdict is Verdict.UNSUPPORTED, (only.verdict, only.message)
    assert "instances" in only.message
    assert result.exit_code == 0


@pytest.mark.parametrize(("iut", "message"), [
    ({"role": "store", "launch": "x {config}", "instances": 0}, "whole number from 1"),
    ({"role": "store", "launch": "x {config}", "instances": "3"}, "whole number from 1"),
    ({"role": "store", "launch": "x {config}", "instances": True}, "whole number from 1"),
    ({"role": "store", "address": "127.0.0.1:14567", "instances": 3}, "launched store"),
    ({"role": "source", "launch": "x {topic}", "instances": 2}, "launched store"),
])
def test_instances_is_checked(iut: dict[str, object], message: str) -> None:
    with pytest.raises(ProfileError, match=message):
        parse_profile({"iut": iut}, "<profile>")


def test_the_reference_profile_runs_a_group_of_three() -> None:
    assert REFERENCE_STORE.instances == 3
    assert parse_profile({"iut": {"role": "store", "launch": "x {config}", "instances": 2}},
                         "<p>").instances == 2


def test_a_proxy_case_on_lbt_rm(tmp_path: Path) -> None:
    """The harness's source sends on the run's transport: a late receiver recovers through the
    proxy of a source that sent on LBT-RM (its evidence under ``PXY-STORE-003.lbt-rm``)."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "ump", "conform", "--suite", "proxy", "-k",
                           "PXY-STORE-003", "--transport", "lbt-rm", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (only,) = json.loads((out / "results.json").read_text())["cases"]
    assert (only["id"], only["verdict"], only["transport"]) == ("PXY-STORE-003", "pass", "lbt-rm")
    notes = (out / "cases" / "PXY-STORE-003.lbt-rm" / "timeline.json").read_text()
    assert "LBT-RM source" in notes


@pytest.mark.oracle
def test_the_evidence_of_every_instance_agrees_with_tshark(
        run: tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]) -> None:
    """Each case's result names every instance's store port (the report's ``ump dissect``
    command decodes the traffic with all of them), and with them the evidence dissects as
    tshark reads it."""
    from wire.dissect import check_against_tshark, dissect_file
    from wire.tshark import PortMap

    _, out, results = run
    for case in results["cases"]:
        assert len(case["store_ports"]) in (2, 3), case["id"]
        ports = PortMap(store_ports=case["store_ports"])
        pcap = out / case["pcap"]
        reports = list(dissect_file(pcap, ports))
        assert any(r.status == "um" for r in reports), case["id"]
        assert check_against_tshark(pcap, reports, ports) == [], case["id"]
