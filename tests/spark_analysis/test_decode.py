"""The Spark plumbing: ``decode_frames`` gives what the single-process columnar decode gives.

Few tests, one shared session (the ``spark`` fixture of conftest.py).  The captures go through
the real reader (``spark.read.format("pcap")``) with tiny splits, so the frames of one TCP
connection land in different partitions and files and stage 2 must bring them together.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from spark_analysis import columnar, decode
from spark_analysis.columnar import DecodeOptions
from tests.spark_analysis.test_columnar import (
    REFERENCE,
    STORE_PORTS,
    lbmr_frames,
    lbtrm_frames,
    lbtru_frames,
    lbttcp_story,
    lbttcp_transport_frames,
)
from wire.pcap import PcapWriter


def _write(path: Path, frames: list[bytes], start: float) -> Path:
    with PcapWriter(path) as writer:
        for i, frame in enumerate(frames):
            writer.write(start + i / 1000, frame)
    return path


def _rows(table: pa.Table, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    rows = [{k: v for k, v in row.items() if k != "file"} for row in table.to_pylist()]
    return sorted(rows, key=lambda r: tuple(-1 if r[k] is None else r[k] for k in keys))


def _normal(value: Any) -> Any:
    """Spark returns nested rows as dicts and decimals as Decimal; make both sides alike."""
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, Decimal):
        return int(value)
    return value


@pytest.fixture(scope="module")
def captures(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two files; one LBT-TCP connection continues from the first into the second."""
    story = lbttcp_story()
    half = len(story.frames) // 2
    root = tmp_path_factory.mktemp("captures")
    first = _write(root / "a.pcap", lbtrm_frames() + story.frames[:half] + lbmr_frames(),
                   1_700_000_000.0)
    second = _write(root / "b.pcap", story.frames[half:] + lbtru_frames()
                    + lbttcp_transport_frames(), 1_700_000_100.0)
    return [REFERENCE, first, second]


def test_decode_frames_matches_the_columnar_decode(spark: Any, captures: list[Path]) -> None:
    frames = (spark.read.format("pcap").option("splitSize", 4096)
              .load([str(p) for p in captures]))
    assert frames.rdd.getNumPartitions() >= 3  # a TCP connection spans two files
    decoded = decode.decode_frames(frames, DecodeOptions(STORE_PORTS))
    try:
        expected = columnar.decode_batches(
            [columnar.frames_batch_from_capture(p) for p in captures],
            DecodeOptions(STORE_PORTS))
        for name, keys in (("packets", ("ts_ns",)), ("messages", ("ts_ns", "msg_index")),
                           ("advertisements", ("ts_ns", "record", "record_index"))):
            got = [_normal(r) for r in _rows(getattr(decoded, name).toArrow(), keys)]
            want = [_normal(r) for r in _rows(getattr(expected, name), keys)]
            assert len(got) == len(want) > 0, name
            assert got == want, name
        skipped = {(Path(r["file"]).name, r["reason"], r["frames"])
                   for r in decoded.skipped.collect()}
        assert skipped == {(Path(r["file"]).name, r["reason"], r["frames"])
                           for r in expected.skipped.to_pylist()}
    finally:
        decoded.unpersist()


def test_decode_frames_refuses_a_dataframe_without_frames(spark: Any) -> None:
    with pytest.raises(ValueError, match="lacks column"):
        decode.decode_frames(spark.createDataFrame([(1,)], "x int"))


def test_parts_round_trip() -> None:
    """What stage 1 ships between Python workers comes back unchanged."""
    tables = columnar.decode_batches([columnar.frames_batch_from_capture(REFERENCE)],
                                     DecodeOptions(STORE_PORTS))
    parts = decode.pack(tables)
    assert set(parts.column("table").to_pylist()) == {"packets", "messages", "advertisements",
                                                      "skipped"}
    for name in ("packets", "messages", "advertisements", "skipped"):
        back = pa.Table.from_batches(list(decode.unpack(parts, name)), decode.TABLES[name])
        assert back.equals(getattr(tables, name).combine_chunks())
