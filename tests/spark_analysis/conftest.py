"""Shared fixtures for the Spark analysis tests.

One SparkSession for the whole run (starting a JVM costs seconds); tests that need Spark take
the ``spark`` fixture and are skipped, with the reason shown, where pyspark or Java is missing.
Most tests here need neither: the split logic is plain Python.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from typing import Any

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    pytest.importorskip("pyspark", reason="pyspark is in the 'spark' extra")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Spark needs a Java runtime (17 or later)")
    from spark_analysis.session import get_spark

    session = get_spark(app_name="ump-tests", master="local[2]", config={
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "2",
        # a test JVM lives for seconds: the quick JIT tier and the serial GC start faster
        "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    }, log_level="ERROR")
    yield session
    session.stop()
