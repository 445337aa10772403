"""Shared pytest configuration: Hypothesis profiles, and no skipped test in CI.

Two profiles, chosen with the ``HYPOTHESIS_PROFILE`` environment variable:

* ``default`` (used when the variable is unset): a moderate number of examples per property so
  the whole wire suite stays well under three minutes on two cores;
* ``fuzz`` (``HYPOTHESIS_PROFILE=fuzz``, what ``tox -e slow`` sets): many examples per property,
  for long fuzzing runs.

Deadlines are off in both: the oracle properties start tshark (about half a second per run) and
a loaded CI machine must not turn a slow example into a failure.  The tests that have to prove
"never hangs" set their own deadline.

Under CI (``CI`` set, as ``.ci/run`` runs) a skipped test fails: CI installs every tool the tests
use (``scripts/ensure-tools``), so a skip there can only hide a missing install step.  On a
developer's machine a skip still says what is missing.

The ``spark`` fixture is one local SparkSession per test process (starting a JVM costs seconds),
for the Spark analysis tests and passive judging in Spark alike.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

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


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]
                              ) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = (f"skipped under CI ({reason}): CI installs every tool the tests "
                           "need, so this skip hides a missing install step")


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="pyspark is in the 'spark' extra")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Spark needs a Java runtime (17 or later)")
    from spark_analysis.session import get_spark

    session = get_spark(app_name="ump-tests", master="local[2]", config={
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        # a test JVM lives for seconds: the quick JIT tier and the serial GC start faster.
        # The quick tier alone gets the JVM's small code cache (48 MiB), which a test process
        # running the Spark SQL twins of the analyses filled ("Out of space in CodeCache for
        # adapters": the JVM died under the tests), so it gets the tiered default's size
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC "
                                         "-XX:ReservedCodeCacheSize=256m",
    }, log_level="ERROR")
    yield session
    session.stop()
