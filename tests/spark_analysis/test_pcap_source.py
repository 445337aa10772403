"""The ``pcap`` Spark data source (spark_analysis/pcap_source.py) and the session helper.

The reader class is exercised directly first (planning, options, pickling: no JVM needed), then
once through a real SparkSession: a glob of two captures, one pcap and one pcapng, read with
small splits must give exactly the frames :func:`wire.pcap.read_capture` gives.
"""

from __future__ import annotations

import json
import pickle
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pyspark", reason="pyspark is in the 'spark' extra")
import pyarrow as pa

from spark_analysis.capture_files import CaptureError
from spark_analysis.pcap_source import (
    SPARK_SCHEMA,
    PcapDataSource,
    PcapReader,
    SplitPartition,
    load_captures,
)
from spark_analysis.splits import CAPTURE_SCHEMA
from tests.spark_analysis.test_splits import (
    multi_section_pcapng,
    pcap_file,
    random_records,
)
from wire import pcap


def two_captures(directory: Path) -> dict[str, list[pcap.CaptureRecord]]:
    """A pcap and a (multi-section) pcapng file; returns read_capture's view of each."""
    directory.mkdir()
    rng = random.Random(7)
    classic = pcap_file(random_records(rng, 400, nanosecond=True, order=">"), order=">",
                        nanosecond=True, snaplen=512).write(directory / "a.pcap")
    ng = multi_section_pcapng(rng, 200).write(directory / "b.pcapng")
    return {str(p): list(pcap.read_capture(p)) for p in (classic, ng)}


def test_reader_plans_and_reads_without_spark(tmp_path: Path) -> None:
    expected = two_captures(tmp_path / "caps")
    glob = str(tmp_path / "caps" / "*")
    reader = PcapDataSource({"path": glob, "splitSize": "3000", "pcapngIndex": "scan",
                             "maxRecordsPerBatch": "16"}).reader(SPARK_SCHEMA)
    parts = reader.partitions()
    sizes = {name: Path(name).stat().st_size for name in expected}
    assert len(parts) == sum(-(-size // 3000) for size in sizes.values())
    rows: list[dict[str, Any]] = []
    for part in parts:
        shipped = pickle.loads(pickle.dumps(part))  # Spark ships partitions pickled
        assert isinstance(shipped, SplitPartition)
        for batch in reader.read(shipped):
            assert isinstance(batch, pa.RecordBatch)
            assert batch.schema == CAPTURE_SCHEMA and batch.num_rows <= 16
            rows.extend(batch.to_pylist())
    for name, records in expected.items():
        mine = [r for r in rows if r["file"] == name]
        assert [r["data"] for r in mine] == [r.data for r in records]
        assert [r["linktype"] for r in mine] == [r.linktype for r in records]


@pytest.mark.parametrize(("options", "message"), [
    ({}, "no capture given"),
    ({"path": "x", "splitSize": "ten"}, "splitSize must be a whole number"),
    ({"path": "x", "maxRecordsPerBatch": "0"}, "maxRecordsPerBatch must be positive"),
    ({"path": "x", "pcapngIndex": "all"}, "pcapngIndex must be one of head, scan"),
    ({"path": "x", "onTruncated": "ignore"}, "onTruncated must be one of warn, error"),
])
def test_bad_options_are_clear(options: dict[str, str], message: str) -> None:
    with pytest.raises(CaptureError, match=message):
        PcapReader(options)


def test_paths_option_lists_several_files(tmp_path: Path) -> None:
    expected = two_captures(tmp_path / "caps")
    names = sorted(expected)
    reader = PcapReader({"paths": json.dumps(names)})
    parts = reader.partitions()
    assert all(isinstance(p, SplitPartition) for p in parts)
    assert [p.split.capture.name for p in parts if isinstance(p, SplitPartition)] == names


def test_spark_reads_a_glob_of_two_captures(spark: Any, tmp_path: Path) -> None:
    """The one test that runs Spark (one JVM even under pytest-xdist)."""
    from spark_analysis.session import get_spark

    # get_spark hands out the running session, with the settings it made
    assert get_spark(app_name="another", master="local[1]") is spark
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"
    assert spark.conf.get("spark.sql.execution.arrow.pyspark.enabled") == "true"
    expected = two_captures(tmp_path / "caps")
    sizes = sum(Path(name).stat().st_size for name in expected)
    frames = (spark.read.format("pcap").option("splitSize", sizes // 6)
              .option("pcapngIndex", "scan").load(str(tmp_path / "caps" / "*.pcap*")))
    assert frames.schema == SPARK_SCHEMA
    rows = frames.collect()  # one job: the checks below run in Python
    counts = Counter(r["file"] for r in rows)
    assert counts == {name: len(records) for name, records in expected.items()}
    for name, records in expected.items():
        mine = sorted((r for r in rows if r["file"] == name), key=lambda r: r["file_offset"])
        assert [bytes(r["data"]) for r in mine] == [r.data for r in records]
        assert [r["origlen"] for r in mine] == [r.orig_len for r in records]
        for row, record in zip(mine, records, strict=True):
            ts = 0.0 if row["ts_ns"] is None else row["ts_ns"] / 1e9
            assert ts == pytest.approx(record.ts, abs=1e-6)
    assert {r["interface_id"] for r in rows if r["file"].endswith("pcapng")} == {0, 1}
    # user errors: a clean exception from load_captures, Spark's wrapping of our message
    # from a plain load (raised while planning: no task runs)
    with pytest.raises(CaptureError, match="no file matches"):
        load_captures(spark, str(tmp_path / "caps" / "*.pcapx"))
    with pytest.raises(Exception, match="no file matches"):
        spark.read.format("pcap").load(str(tmp_path / "nothing*.pcap")).count()
