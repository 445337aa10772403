"""The harness tests itself: each deliberately faulty store must fail a MUST case.

The mutants live in :mod:`tests.conformance.mutant_store`; each is the reference store with one
behaviour broken.  A profile launches the mutant like any third-party store, and the suite
holding the broken behaviour must end with exit code 1 and the named case failing.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance.model import Strength, Verdict
from conformance.profile import parse_profile
from conformance.runner import run

MUTANT = Path(__file__).with_name("mutant_store.py")

# mutant -> (suite to run, the case that must catch it)
CATCHES = {
    "grants-active-regid": ("registration", "REG-STORE-003"),
    "forgets-old-flag": ("registration", "REG-STORE-004"),
    "wrong-low-sqn": ("registration", "REG-STORE-010"),
    "ignores-rate-limit": ("recovery", "REC-STORE-005"),
}


@pytest.mark.parametrize("mutant", sorted(CATCHES))
def test_every_mutant_is_caught(mutant: str, tmp_path: Path) -> None:
    suite, catcher = CATCHES[mutant]
    profile = parse_profile({"iut": {
        "name": f"mutant {mutant}", "role": "store",
        "launch": [sys.executable, str(MUTANT), mutant, "-c", "{config}",
                   "--profile", "{version}"],
        "ready": "ready to accept registrations"}}, f"<mutant {mutant}>")
    result = run(profile, tmp_path / "out", suites=[suite])
    failed = {r.spec.id for r in result.results
              if r.verdict is Verdict.FAIL and r.spec.strength is Strength.MUST}
    errors = [(r.spec.id, r.message) for r in result.results if r.verdict is Verdict.ERROR]
    assert errors == []
    assert catcher in failed, [(r.spec.id, r.verdict.value, r.message) for r in result.results]
    assert result.exit_code == 1
