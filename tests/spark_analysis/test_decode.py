"""The Spark plumbing: ``decode_frames`` gives what the single-process columnar decode gives.

Few tests, one shared session (the ``spark`` fixture of conftest.py).  The captures go through
the real reader (``spark.read.format("pcap")``) with tiny splits, so the frames of one TCP
connection land in different partitions and files and stage 2 must bring them together.
"""

from __future__ import annotations

import os
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from spark_analysis import columnar, decode, schemas
from spark_analysis.capture_files import CaptureError
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
    rows = sorted(table.to_pylist(), key=lambda r: tuple(
        -1 if r[k] is None else Path(r[k]).name if k == "file" else r[k] for k in keys))
    return [{k: v for k, v in row.items() if k != "file"} for row in rows]


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


def _parquet_rows(directory: Path, keys: tuple[str, ...]) -> list[dict[str, Any]]:
    return _rows(pq.read_table(directory), keys)


@pytest.mark.parametrize("driver_bytes", [0, 1 << 30], ids=["spark", "in-driver"])
def test_decode_to_parquet_matches_the_columnar_decode(spark: Any, captures: list[Path],
                                                       tmp_path: Path, driver_bytes: int) -> None:
    """Small splits and three flow buckets: a TCP connection spans files, splits and the
    stage-2 hand-over, and the Parquet tables still hold exactly the single-process rows
    (also when the same tasks run in the driver for a tiny capture)."""
    out = tmp_path / "out"
    result = decode.decode_to_parquet(spark, [str(p) for p in captures], str(out),
                                      DecodeOptions(STORE_PORTS), split_size=4096, buckets=3,
                                      driver_bytes=driver_bytes)
    assert (driver_bytes > 0) == ({t["pid"] for t in result.tasks} <= {os.getpid()})
    expected = columnar.decode_batches(
        [columnar.frames_batch_from_capture(p) for p in captures], DecodeOptions(STORE_PORTS))
    assert result.frames == sum(columnar.frames_batch_from_capture(p).num_rows
                                for p in captures)
    core, headers = schemas.split_messages(expected.messages)
    stored = {"packets": expected.packets, "messages": core,
              "advertisements": expected.advertisements, **headers}
    assert {"lbmc_ume_preg", "lbmc_ume_ack", "lbmc_ume_store"} <= set(headers)
    for name, want_table in stored.items():
        keys = {"packets": ("ts_ns",), "advertisements": ("ts_ns", "record", "record_index")
                }.get(name, ("file", "file_offset", "msg_index"))
        got = _parquet_rows(out / name, keys)
        want = _rows(want_table, keys)
        assert len(got) == len(want) == result.rows[name] > 0, name
        assert got == want, name
    # range statistics on the integer columns (time, offsets, ports), none on strings, whose
    # dictionary pages answer equality filters
    meta = pq.ParquetFile(next((out / "packets").glob("*.parquet"))).metadata
    chunks = {meta.schema.column(i).name: meta.row_group(0).column(i)
              for i in range(meta.num_columns)}
    assert chunks["ts_ns"].is_stats_set and chunks["dst_port"].is_stats_set
    assert not chunks["src_ip"].is_stats_set and chunks["src_ip"].has_dictionary_page
    # columns the decoder always fills are required (no definition levels), the rest optional
    levels = {meta.schema.column(i).name: meta.schema.column(i).max_definition_level
              for i in range(meta.num_columns)}
    assert levels["file_offset"] == levels["src_ip"] == levels["messages"] == 0
    assert levels["malformed_reason"] == levels["sqn"] == 1
    # growing integers are delta-encoded (the other integers stay plain)
    assert "DELTA_BINARY_PACKED" in chunks["file_offset"].encodings
    assert "DELTA_BINARY_PACKED" in chunks["ts_ns"].encodings
    assert "DELTA_BINARY_PACKED" not in chunks["dst_port"].encodings
    # categorical strings are stored from dictionary arrays (pyarrow reads them back so)
    stored_packets = pq.read_table(out / "packets")
    assert pa.types.is_dictionary(stored_packets.schema.field("src_ip").type)
    assert stored_packets.schema.field("malformed_reason").type == pa.string()
    for name in set(decode.PARQUET_TABLES) - set(stored) - {"skipped"}:
        assert result.rows[name] == 0 and not pq.read_table(out / name).num_rows, name
    wide = schemas.join_headers(pq.read_table(out / "messages"),
                                 {n: pq.read_table(out / n) for n in headers})
    by_key = ("file", "file_offset", "msg_index")
    assert _rows(wide, by_key) == _rows(expected.messages, by_key)
    skipped = {(Path(r["file"]).name, r["reason"], r["frames"], r["first_file_offset"])
               for r in pq.read_table(out / "skipped").to_pylist()}
    assert skipped == {(Path(r["file"]).name, r["reason"], r["frames"], r["first_file_offset"])
                       for r in expected.skipped.to_pylist()}
    assert (out / "_SUCCESS").exists() and not (out / "_temporary").exists()
    tables = result.dataframes(spark)
    for name in ("packets", "advertisements", "skipped"):
        # Spark reads back the very types decode_frames gives (what the analyses use)
        assert tables[name].schema == decode._SPARK_SCHEMAS[name], name
    assert tables["packets"].count() == result.rows["packets"]
    messages = result.messages(spark)
    assert messages.schema == decode._SPARK_SCHEMAS["messages"]
    assert _rows(messages.toArrow().cast(schemas.MESSAGES_SCHEMA), by_key) == _rows(
        expected.messages, by_key)
    narrow = result.messages(spark, ["ume_ack"])
    assert narrow.columns == [*schemas.MESSAGE_CORE_SCHEMA.names, "ume_ack"]
    with pytest.raises(ValueError, match="no header column 'ume_akc'"):
        result.messages(spark, ["ume_akc"])


def test_a_null_in_an_always_set_column_is_refused_not_written() -> None:
    """The writer would store a null of a required column as some value: a decoder bug is
    reported instead."""
    schema = decode.PARQUET_TABLES["lbmc_ume_sid"]
    good = schema.empty_table()
    assert decode._as_stored("lbmc_ume_sid", good).schema == schema
    nulls = pa.Table.from_arrays([pa.nulls(1, f.type) for f in schema],
                                 schema=schemas.STORED_SCHEMAS["lbmc_ume_sid"])
    with pytest.raises(RuntimeError, match=r"decoder bug: lbmc_ume_sid\.file has nulls"):
        decode._as_stored("lbmc_ume_sid", nulls)


def test_decode_to_parquet_separate_files(spark: Any, tmp_path: Path) -> None:
    """Two captures reusing one TCP 4-tuple, decoded in one run as separate captures: each
    file's messages are exactly its own (joined, the second file would be retransmissions)."""
    story = lbttcp_story()
    files = [_write(tmp_path / f"{name}.pcap", story.frames, 1_700_000_000.0)
             for name in ("a", "b")]
    options = DecodeOptions(STORE_PORTS, separate_files=True)
    result = decode.decode_to_parquet(spark, [str(p) for p in files], str(tmp_path / "out"),
                                      options, split_size=4096, buckets=3)
    assert result.rows["messages"] == 2 * len(story.messages)
    alone = columnar.decode_batches([columnar.frames_batch_from_capture(files[0])], options)
    assert alone.messages.num_rows == len(story.messages)
    got = pq.read_table(tmp_path / "out" / "messages").to_pylist()
    alone_core, _ = schemas.split_messages(alone.messages)
    for path in files:
        mine = pa.Table.from_pylist([r for r in got if r["file"] == str(path)])
        assert _rows(mine, ("ts_ns", "msg_index")) == _rows(
            alone_core, ("ts_ns", "msg_index")), path.name
    buckets = decode.flow_buckets(
        pa.table({"file": ["a", "b"], **{k: [1, 1] for k in schemas.FLOW_KEY}}), 1 << 20,
        separate_files=True)
    assert buckets[0] != buckets[1]


def test_decode_to_parquet_reports_a_truncated_capture(spark: Any, tmp_path: Path) -> None:
    whole = REFERENCE.read_bytes()
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(whole[:-7])
    result = decode.decode_to_parquet(spark, str(cut), str(tmp_path / "a"),
                                      DecodeOptions(STORE_PORTS))
    assert len(result.truncated) == 1 and "cut.pcap" in result.truncated[0]
    assert result.frames == columnar.frames_batch_from_capture(REFERENCE).num_rows - 1
    with pytest.raises(CaptureError, match=r"cut\.pcap"):
        decode.decode_to_parquet(spark, str(cut), str(tmp_path / "b"),
                                 DecodeOptions(STORE_PORTS), on_truncated="error")


def test_decode_to_parquet_refuses_bad_paths(spark: Any, tmp_path: Path) -> None:
    with pytest.raises(CaptureError, match="no such file"):
        decode.decode_to_parquet(spark, str(tmp_path / "missing.pcap"), str(tmp_path / "o"))
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="taken"):
        decode.decode_to_parquet(spark, str(REFERENCE), str(tmp_path / "taken"))
    with pytest.raises(FileExistsError, match=r"notes\.txt"):
        decode.decode_to_parquet(spark, str(REFERENCE), str(tmp_path / "taken"),
                                 overwrite=True)
    assert (tmp_path / "taken" / "notes.txt").read_text() == "mine"


def test_flow_buckets_are_stable_and_keep_each_direction_together() -> None:
    segments = columnar.decode_batches(
        [columnar.frames_batch_from_capture(REFERENCE)], DecodeOptions(STORE_PORTS))
    story = columnar.decode_batch(columnar.frames_batch_from_capture(REFERENCE),
                                  DecodeOptions(STORE_PORTS)).tcp_segments
    assert story.num_rows > 0 and segments.packets.num_rows > 0
    buckets = decode.flow_buckets(story, 5)
    assert ((buckets >= 0) & (buckets < 5)).all()
    flows: dict[tuple[int, ...], set[int]] = {}
    for row, bucket in zip(story.select(list(schemas.FLOW_KEY)).to_pylist(), buckets.tolist(),
                           strict=True):
        flows.setdefault(tuple(row.values()), set()).add(bucket)
    assert all(len(b) == 1 for b in flows.values())
    # a fixed hash, not Python's per-process one: the same input gives the same buckets
    assert decode.flow_buckets(story.slice(1), 5).tolist() == buckets[1:].tolist()


def test_stage2_plan_balances_buckets_by_cost() -> None:
    """Segments are what stage 2 pays for (payload bytes count little): buckets are spread by
    segments plus bytes / STAGE2_BYTES_PER_SEGMENT, costliest first, a bucket's files together."""
    per = decode.STAGE2_BYTES_PER_SEGMENT
    tcp = [(0, "a0", 900, 10), (1, "a1", 500, 3 * per), (1, "b1", 400, 0), (2, "a2", 300, 0),
           (3, "a3", 200, 0), (4, "a4", 100, 10**4 * per)]
    # one core: STAGE2_TASKS_PER_CORE (3) tasks
    tasks = decode._plan_stage2(tcp, 1)
    assert decode.STAGE2_TASKS_PER_CORE == 3 and len(tasks) == 3
    assert sorted(b for task in tasks for b, _ in task) == [0, 1, 2, 3, 4]
    assert [dict(task)[1] for task in tasks if 1 in dict(task)] == [["a1", "b1"]]
    # bucket 4 is the costliest by its bytes and gets a task alone, handed out first; then
    # 0 + 2 (900 + 300) and 1 + 3 (903 + 200)
    assert [sorted(b for b, _ in task) for task in tasks] == [[4], [0, 2], [1, 3]]
    light = decode._plan_stage2([(b, p, r, 0) for b, p, r, _n in tcp[:-1]], 1)
    loads = [sum(r for b2, _p, r, _n in tcp if b2 in dict(task)) for task in light]
    assert loads == [900, 900, 500]  # 900 | 500 + 400 | 300 + 200, costliest first
    # never more tasks than buckets
    assert len(decode._plan_stage2(tcp, 8)) == 5


def test_pack_cuts_big_tables_into_bounded_streams() -> None:
    tables = columnar.decode_batches([columnar.frames_batch_from_capture(REFERENCE)],
                                     DecodeOptions(STORE_PORTS))
    parts = decode.pack(tables, max_rows=7)
    counts = [(t, r) for t, r in zip(parts.column("table").to_pylist(),
                                     parts.column("rows").to_pylist(), strict=True)]
    assert max(r for _, r in counts) == 7
    assert sum(r for t, r in counts if t == "messages") == tables.messages.num_rows
    back = pa.Table.from_batches(list(decode.unpack(parts, "messages")), decode.TABLES["messages"])
    assert back.equals(tables.messages.combine_chunks())


def test_tasks_freeze_the_heap_only_in_a_spark_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    import gc

    assert gc.get_freeze_count() == 0
    decode._freeze_heap()  # no TaskContext: the driver running a tiny capture's tasks
    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(decode.TaskContext, "get", staticmethod(lambda: object()))
    try:
        decode._freeze_heap()
        assert gc.get_freeze_count() > 0
    finally:
        gc.unfreeze()
    assert gc.get_freeze_count() == 0


_NO_PANDAS_SCRIPT = """
import builtins, os, sys, traceback
real_import = builtins.__import__
def guard(name, *args, **kwargs):
    if name == "pandas" or name.startswith("pandas."):
        raise AssertionError("pandas imported:\\n" + "".join(traceback.format_stack(limit=12)))
    return real_import(name, *args, **kwargs)
builtins.__import__ = guard
import pyarrow.fs as pafs
from spark_analysis import decode
from spark_analysis.columnar import DecodeOptions
from spark_analysis.splits import plan
from wire.tshark import PortMap
tmp = sys.argv[1]
job = decode._Job(pafs.LocalFileSystem(), tmp, DecodeOptions(PortMap(store_ports=[14567])),
                  4, "snappy", 1 << 16)
for sub in [*decode.PARQUET_TABLES, *(f"tcp/b{b:04d}" for b in range(4))]:
    os.makedirs(f"{tmp}/{sub}", exist_ok=True)
first = list(decode._decode_splits(job, enumerate(plan(sys.argv[2:], 1 << 16))))
assert first and not [m for m in first if "error" in m], first
tcp = [entry for m in first for entry in m["tcp"]]
second = list(decode._reassemble_buckets(job, enumerate(decode._plan_stage2(tcp, 2))))
assert tcp and second
print(sum(m["frames"] for m in first), "frames", "pandas" in sys.modules)
"""


def test_decode_tasks_never_import_pandas(tmp_path: Path) -> None:
    """pyarrow imports pandas on its first ``pa.array``/``to_numpy``/``group_by``; the decode
    tasks build their arrays without those, so a Spark worker never pays the import (0.28
    CPU-s each).  Every corpus capture, both stages, in a fresh interpreter."""
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    corpus = sorted(str(p) for p in (root / "captures" / "corpus").glob("*.pcap"))
    done = subprocess.run([sys.executable, "-c", _NO_PANDAS_SCRIPT, str(tmp_path), *corpus],
                          capture_output=True, text=True, timeout=300, cwd=root)
    assert done.returncode == 0, done.stderr[-4000:]
    frames, _, imported = done.stdout.split()[-3:]
    assert int(frames) > 1000
    assert imported == "False"
