"""The one test function the pytest plugin parametrizes with every conformance case."""

from __future__ import annotations

from conformance.model import CaseSpec
from conformance.pytest_plugin import ConformanceSession, run_case


def test_conformance(conformance_case: CaseSpec,
                     conformance_session: ConformanceSession) -> None:
    run_case(conformance_session, conformance_case)
