"""The quorum suite's source cases (SRC-QRM-*, conformance/suites/quorum_source.py): they are
listed for the source role, cite the guide, and pass against the reference source.

Each case's mutant (a reference source with that one rule broken) is in
tests/conformance/mutant_client.py and must fail it (tests/conformance/test_mutants.py,
``CLIENT_CATCHES``); the rules themselves are tested on the core in
tests/reference_impl/test_quorum_source.py.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from conformance.model import Role, Strength, Verdict, all_cases
from conformance.profile import resolve_profile
from conformance.runner import RunResult, run
from tests.conformance.explain import explain
from wire.dissect import check_against_tshark, dissect_file
from wire.tshark import PortMap

IDS = [f"SRC-QRM-{n:03d}" for n in range(1, 20)]
SECTIONS = {"Quorum/Consensus Store Usage", "Sources Using Quorum/Consensus Store Configuration",
            "Source Recovery", "Source Events", "Source Registration Information (SRI)"}


def test_the_source_cases_of_the_quorum_suite() -> None:
    cases = [c for c in all_cases(Role.SOURCE) if c.suite == "quorum"]
    assert [c.id for c in cases] == IDS
    assert {c.section for c in cases} == SECTIONS
    assert all(c.strength is Strength.MUST and len(c.requirement) > 40 for c in cases)
    assert all(c.timeout <= 15 for c in cases)  # a few seconds each at --time-scale 1


def test_ump_conform_lists_them_for_the_source_iut() -> None:
    out = subprocess.run([sys.executable, "-m", "ump", "conform", "--iut", "source", "--list",
                          "--suite", "quorum"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    listed = [line.split()[0] for line in out.stdout.splitlines() if line[:1].isalnum()]
    assert listed == IDS


@pytest.fixture(scope="module")
def suite_run(tmp_path_factory: pytest.TempPathFactory) -> RunResult:
    """One run of the suite against the reference source (two cases at a time), shared."""
    return run(resolve_profile("source"), tmp_path_factory.mktemp("quorum") / "out",
               suites=["quorum"], jobs=2)


def test_every_source_case_passes_against_the_reference_source(suite_run: RunResult) -> None:
    assert [(r.spec.id, r.verdict) for r in suite_run.results] == \
        [(i, Verdict.PASS) for i in IDS], [(r.spec.id, r.message) for r in suite_run.results]
    assert suite_run.exit_code == 0


@pytest.mark.oracle
def test_the_evidence_agrees_with_tshark(suite_run: RunResult) -> None:
    # two and three groups of harness stores: every frame dissects as tshark dissects it, with
    # the harness stores' ports as store ports
    for case in suite_run.results:
        assert case.pcap is not None and case.store_ports, case.spec.id
        ports = PortMap(store_ports=case.store_ports)
        reports = list(dissect_file(case.pcap, ports))
        assert any(r.status == "um" for r in reports), case.spec.id
        problems = check_against_tshark(case.pcap, reports, ports)
        assert not problems, f"{case.spec.id}: {explain(case.pcap, ports, reports, problems)}"
