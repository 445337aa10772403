"""The Spark SQL analyses as the oracle of the Arrow engine (``spark_analysis/engine``).

Each engine function must give what its Spark SQL twin
(:mod:`tests.spark_analysis.twin`) gives on the same inputs.
:func:`spark_steps` runs the Spark pipeline of :func:`tests.spark_analysis.twin.analyze` step by
step over a decoded capture and returns every input and intermediate table as Arrow;
:func:`assert_same` compares an engine result with its twin's, row for row.

``python -m tests.spark_analysis.engine_oracle OUT [--per-file]`` writes them next to an
``ump analyze`` output directory (``OUT/inputs/*.parquet``, ``OUT/steps/*.parquet``) for
quick work on a big capture without Spark.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa

from spark_analysis.engine.common import plain_table
from spark_analysis.engine.inputs import TABLES, Inputs

Golden = Callable[[str], pa.Table]
"""A reader of an ``ump analyze`` run's outputs by name (the ``golden`` fixture)."""

INPUTS = ("packets", "messages", "advertisements")
STEPS = ("data", "regs", "sends", "flags", "stability", "consumption", "requests", "stable",
         "events", "found")


def spark_steps(spark: Any, out: Path, per_file: bool) -> dict[str, pa.Table]:
    """Every prepared input and intermediate table of the Spark pipeline over the decoded
    tables of the ``ump analyze`` output directory ``out`` (``out/decoded``)."""
    import pyarrow.dataset as ds
    from pyspark.sql import functions as F

    from spark_analysis.decode import ParquetTables
    from spark_analysis.engine.inputs import HEADER_COLUMNS
    from tests.spark_analysis import twin as A

    dec = out / "decoded"
    paths = {p.name: str(p) for p in dec.iterdir() if p.is_dir()}
    rows = {name: ds.dataset(path, format="parquet").count_rows()
            for name, path in paths.items()}
    tables = ParquetTables(str(dec), paths, rows, rows["packets"], 0, [], {}, {})
    raw = spark.read.parquet(paths["packets"])
    # every file of the run, not only those with packets (a capture with no UM frame has
    # none, and the ranks of the files after it would shift)
    import json

    files = json.loads((out / "summary.json").read_text())["files"]
    t = A.prepare(raw, tables.messages(spark, HEADER_COLUMNS),
                  spark.read.parquet(paths["advertisements"]), files=files, per_file=per_file)
    packets = t.packets.select(
        *A._PACKET_COLUMNS, *[c for c in A._OPTIONAL_PACKET_COLUMNS if c in t.packets.columns])
    adverts = t.advertisements
    messages = t.messages.where(
        F.col("sqn").isNotNull() | F.col("ume_preg").isNotNull()
        | F.col("ume_preg_resp").isNotNull() | F.col("ume_ack").isNotNull()
        | F.col("ume_rxreq").isNotNull() | F.col("malformed_reason").isNotNull()
    ).select(*A._MESSAGE_COLUMNS)
    options = A.AnalysisOptions()
    data = A.data_messages(packets, messages, adverts)
    regs = A.registrations(messages, pair_on_driver=True)
    sends = A.message_sends(data)
    flags = A._judged_items(packets, data)
    stability = A.stability_acks(messages, sends, regs)
    consumption = A.consumption_acks(messages, sends, regs)
    requests = A.retransmission_requests(packets, data, messages, regs)
    stable = A.stable_times(stability, regs, options)
    events = A.flight_events(sends, stable)
    found = A.anomalies(packets, messages, sends, regs, stability, consumption, requests, flags)
    frames = {"packets": packets, "messages": messages, "advertisements": adverts,
              "data": data, "regs": regs, "sends": sends, "flags": flags,
              "stability": stability, "consumption": consumption, "requests": requests,
              "stable": stable, "events": events, "found": found}
    return {name: df.toArrow() for name, df in frames.items()}


def spark_twin(spark: Any, name: str, *tables: pa.Table) -> pa.Table:
    """The Spark SQL function ``name`` of :mod:`tests.spark_analysis.twin` over ``tables``.

    Spark's ``first`` takes the first row it meets, which the engine takes to be the first in
    capture order: so the twin gets the rows in capture order (``pos``, then
    ``record_index``), in one partition."""
    from tests.spark_analysis import twin as A

    def df(t: pa.Table) -> Any:
        if "pos" in t.column_names:
            t = t.sort_by([("pos", "ascending"), *([("record_index", "ascending")]
                                                  if "record_index" in t.column_names else [])])
        return spark.createDataFrame(t).coalesce(1)

    return getattr(A, name)(*(df(t) for t in tables)).toArrow()


_CORPUS: dict[str, pa.Table] = {}


def corpus_steps(request: Any, tmp_path_factory: Any) -> dict[str, pa.Table]:
    """:func:`spark_steps` over the whole corpus (``--per-file``), once per process: the
    decoded tables of :func:`tests.spark_analysis.analysis_corpus.shared_corpus_run`."""
    if not _CORPUS:
        from tests.spark_analysis.analysis_corpus import shared_corpus_run

        run = shared_corpus_run(request, tmp_path_factory)
        _CORPUS.update(spark_steps(request.getfixturevalue("spark"), run.out, per_file=True))
    return _CORPUS


def frame(table: pa.Table) -> pd.DataFrame:
    """An Arrow table as the engine takes it: pandas with Arrow-backed columns."""
    return table.to_pandas(types_mapper=pd.ArrowDtype)


def plain_inputs(inputs: Inputs) -> Inputs:
    """``inputs`` with every dictionary-encoded column plain: the engine must give the same
    results from both (:data:`spark_analysis.engine.inputs.DICTIONARY`)."""
    return Inputs(*(frame(plain_table(pa.Table.from_pandas(getattr(inputs, name),
                                                           preserve_index=False)))
                    for name in TABLES))


def _cell(value: Any) -> Any:
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def assert_same(ours: pd.DataFrame | pa.Table, theirs: pd.DataFrame | pa.Table,
                keys: Sequence[str] | None = None, *, columns_in_order: bool = False,
                rel: float = 1e-9) -> None:
    """``ours`` and ``theirs`` hold the same rows: the same column names (in the same order
    with ``columns_in_order``), the same Arrow types, and row for row the same values once
    both are sorted by ``keys`` (default: every column); floats to a relative ``rel``, a
    NaN the same as a null."""
    a = ours if isinstance(ours, pa.Table) else pa.Table.from_pandas(ours, preserve_index=False)
    b = theirs if isinstance(theirs, pa.Table) else pa.Table.from_pandas(
        theirs, preserve_index=False)
    if columns_in_order:
        assert a.schema.names == b.schema.names, (a.schema.names, b.schema.names)
    else:
        assert sorted(a.schema.names) == sorted(b.schema.names), \
            (sorted(set(a.schema.names) ^ set(b.schema.names)))
    # the engine keeps low-cardinality strings dictionary-encoded while it analyses (the
    # results are plain): the same values, the value type compared
    for i, field in enumerate(a.schema):
        if pa.types.is_dictionary(field.type) and field.name in b.schema.names \
                and not pa.types.is_dictionary(b.schema.field(field.name).type):
            a = a.set_column(i, field.name, a.column(i).cast(field.type.value_type))
    for name in b.schema.names:
        assert a.schema.field(name).type == b.schema.field(name).type, \
            (name, a.schema.field(name).type, b.schema.field(name).type)
    assert a.num_rows == b.num_rows, (a.num_rows, b.num_rows)
    order = list(keys or b.schema.names)
    a, b = plain_table(a), plain_table(b)   # (Arrow sorts a table by plain columns only)
    sortable = [k for k in order if not pa.types.is_nested(b.schema.field(k).type)]
    a = a.sort_by([(k, "ascending") for k in sortable])
    b = b.sort_by([(k, "ascending") for k in sortable])
    for name in b.schema.names:
        left, right = a.column(name).to_pylist(), b.column(name).to_pylist()
        for i, (x, y) in enumerate(zip(left, right, strict=True)):
            x, y = _cell(x), _cell(y)
            if isinstance(x, float) and isinstance(y, float):
                assert math.isclose(x, y, rel_tol=rel, abs_tol=1e-12), (name, i, x, y)
            else:
                assert x == y, (name, i, x, y, {k: b.column(k)[i].as_py() for k in sortable})


def main(argv: Sequence[str]) -> int:
    import pyarrow.parquet as pq

    from spark_analysis.session import get_spark

    out = Path(argv[0]).resolve()
    steps = spark_steps(get_spark(app_name="engine-oracle", quiet=True), out,
                        "--per-file" in argv)
    for name, table in steps.items():
        folder = out / ("inputs" if name in INPUTS else "steps")
        folder.mkdir(exist_ok=True)
        pq.write_table(table, folder / f"{name}.parquet")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
