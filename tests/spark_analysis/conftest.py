"""Fixtures the engine tests share (``tests/spark_analysis/test_engine_*.py``): the Spark
twin's steps over the corpus, and the engine's own outputs of the corpus run."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from tests.spark_analysis.engine_oracle import Golden, corpus_steps


@pytest.fixture(scope="module")
def steps(request: Any, tmp_path_factory: Any) -> dict[str, pa.Table]:
    """Every input and intermediate table of the Spark twin over the decoded corpus
    (:func:`tests.spark_analysis.engine_oracle.corpus_steps`, made once per process)."""
    return corpus_steps(request, tmp_path_factory)


@pytest.fixture(scope="module")
def golden(request: Any, tmp_path_factory: Any) -> Golden:
    """A reader of the final outputs of the corpus run by name (``OUT/parquet/<name>``,
    written by the engine through ``ump analyze``): they check the wiring and column order of
    :mod:`spark_analysis.engine.run`; the Spark twins are the oracle of the values."""
    from tests.spark_analysis.analysis_corpus import shared_corpus_run

    out = shared_corpus_run(request, tmp_path_factory).out / "parquet"
    return lambda name: ds.dataset(out / name, format="parquet").to_table()
