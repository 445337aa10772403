"""Shared pytest configuration: Hypothesis profiles.

Two profiles, chosen with the ``HYPOTHESIS_PROFILE`` environment variable:

* ``default`` (used when the variable is unset): a moderate number of examples per property so
  the whole wire suite stays well under three minutes on two cores;
* ``fuzz`` (``HYPOTHESIS_PROFILE=fuzz``, what ``tox -e slow`` sets): many examples per property,
  for long fuzzing runs.

Deadlines are off in both: the oracle properties start tshark (about half a second per run) and
a loaded CI machine must not turn a slow example into a failure.  The tests that have to prove
"never hangs" set their own deadline.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, Phase, settings

settings.register_profile(
    "default",
    max_examples=30,
    deadline=None,
    print_blob=True,
    # no "explain" phase: it re-runs failing examples (the strict-xfail bug demonstrations
    # among them) only to annotate the report
    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.target, Phase.shrink],
)
settings.register_profile(
    "fuzz",
    max_examples=3000,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_configure(config: pytest.Config) -> None:
    # Hypothesis imports libcst (to suggest @example patches) when a property fails, the
    # strict-xfail bug demonstrations included; libcst's import-time deprecation noise is not ours.
    config.addinivalue_line("filterwarnings", "ignore::DeprecationWarning:libcst.*")
