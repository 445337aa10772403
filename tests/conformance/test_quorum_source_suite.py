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
from pathlib import Path

from conformance.model import Role, Strength, Verdict, all_cases
from conformance.profile import resolve_profile
from conformance.runner import run

IDS = [f"SRC-QRM-{n:03d}" for n in range(1, 19)]
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


def test_every_source_case_passes_against_the_reference_source(tmp_path: Path) -> None:
    result = run(resolve_profile("source"), tmp_path / "out", suites=["quorum"], jobs=2)
    assert [(r.spec.id, r.verdict) for r in result.results] == \
        [(i, Verdict.PASS) for i in IDS], [(r.spec.id, r.message) for r in result.results]
    assert result.exit_code == 0
