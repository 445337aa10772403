"""Spark plumbing of the UM decode: captures or a frames DataFrame in, UM tables out.

The work itself is :mod:`spark_analysis.columnar`'s; this module places it on Spark in two
ways that give the same rows:

* :func:`decode_to_parquet` (the fast path, for whole captures): Python tasks read, decode
  and write Parquet with pyarrow, and only file lists cross into the JVM.  Measured with
  ``python -m benchmarks.spark`` on the 2-core machine (10,000,000 frames): about 600,000-
  700,000 frames per CPU-second of the whole Spark process tree (JVM and Python workers), against
  about 17,000 for the DataFrame path below and about 35,000 for tshark.  See its docstring
  for the stages and the commit rule;
* :func:`decode_frames` (the DataFrame path, for any frames DataFrame, e.g. a filtered
  ``spark.read.format("pcap")``), lazily, described below.  Every frame crosses the
  Python/JVM boundary twice and ``messages`` rows carry every null struct field through
  Arrow, which is why it is much slower.

The DataFrame path:

* **stage 1** (stateless) runs :func:`~spark_analysis.columnar.decode_batch` on every Arrow
  batch with ``mapInArrow``.  ``mapInArrow`` has a single output schema but stage 1 makes five
  tables, so each output row is one table *batch* as a compressed Arrow IPC stream
  (:data:`PARTS_SCHEMA`: ``table``, ``rows``, ``ipc``).  A tagged union of struct columns
  would be the obvious alternative and is far slower: Arrow ships every child buffer of a
  null struct, so each row would carry all five tables' widths (about 1.5 KB);
* **stage 2** (LBT-TCP, and UDP datagrams cut into IPv4 fragments) needs all segments of a
  connection direction (all fragments of a datagram) together, whatever partition or file
  they came from: the ``tcp_segments`` parts are unpacked, repartitioned by
  :data:`~spark_analysis.schemas.FLOW_KEY` (a hash shuffle: every segment of a flow lands in
  the same partition) and each partition is reassembled at once by
  :func:`~spark_analysis.columnar.reassemble` in ``mapInArrow``, which returns parts
  again.  (``groupBy().applyInArrow`` gives the same result but also sorts by key and calls
  Python per flow: measured almost twice as slow.)  A partition's TCP payload is held in
  memory; ``spark.sql.shuffle.partitions`` bounds it (capture TCP bytes / partitions);
* each table is a ``mapInArrow`` that unpacks its parts of both stages (zero-copy reads of
  the IPC streams) into the table's own schema.

Both stages' parts are persisted (``persist=True``): they are small (compressed) and every
table reads them, so the capture is decoded once however many tables are used.  Call
:meth:`DecodedFrames.unpersist` when done.

Throughput notes.  ``mapInArrow`` receives batches of
``spark.sql.execution.arrow.maxRecordsPerBatch`` rows (10,000 by default); the columnar decode
has a fixed cost per call of several milliseconds, so stage 1 regroups them into calls of
:data:`DECODE_ROWS` frames.  ``messages`` is a wide table (typed header columns are shipped
for every row, present or not): select what you need early.
"""

from __future__ import annotations

import contextlib
import functools
import gc
import itertools
import logging
import os
import resource
import time
import uuid
import zlib
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark import StorageLevel, TaskContext
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from . import arrow_build, columnar, schemas
from .capture_files import DEFAULT_CHUNK_SIZE, CaptureError, PcapngIndexMode, resolve
from .schemas import (
    ADVERTISEMENTS_SCHEMA,
    ALWAYS_SET,
    FLOW_KEY,
    HEADER_TABLE_PREFIX,
    HEADER_TABLE_SCHEMAS,
    MESSAGE_CORE_SCHEMA,
    MESSAGE_HEADER_COLUMNS,
    MESSAGE_KEY,
    MESSAGES_SCHEMA,
    PACKETS_SCHEMA,
    SKIPPED_SCHEMA,
    STORED_SCHEMAS,
    TCP_SEGMENTS_SCHEMA,
    DecodedTables,
    DecodeOptions,
)
from .splits import (
    DEFAULT_SPLIT_SIZE,
    OnTruncated,
    Split,
    SplitReader,
    TruncatedRecord,
    plan,
)

log = logging.getLogger(__name__)

__all__ = [
    "PARQUET_TABLES",
    "PARTS_SCHEMA",
    "TABLES",
    "DecodedFrames",
    "ParquetTables",
    "decode_frames",
    "decode_to_parquet",
    "flow_buckets",
    "pack",
    "unpack",
]

TABLES: dict[str, pa.Schema] = {
    "packets": PACKETS_SCHEMA,
    "messages": MESSAGES_SCHEMA,
    "advertisements": ADVERTISEMENTS_SCHEMA,
    "skipped": SKIPPED_SCHEMA,
    "tcp_segments": TCP_SEGMENTS_SCHEMA,
}
"""The tables a stage produces, by the name of the :class:`DecodedTables` attribute."""

PARTS_SCHEMA = pa.schema([
    pa.field("table", pa.string(), nullable=False),
    pa.field("rows", pa.int64(), nullable=False),
    pa.field("ipc", pa.binary(), nullable=False),
])
"""What both stages output: one row per table batch, as an Arrow IPC stream."""

INPUT_COLUMNS = ("file", "file_offset", "ts_ns", "linktype", "data")
"""The frame columns stage 1 reads (the frames DataFrame may have more)."""

_COMPRESSION = "lz4" if pa.Codec.is_available("lz4") else None
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression=_COMPRESSION)


PACK_ROWS = 1 << 16
"""Rows per packed IPC stream at most: the JVM materialises each as one byte array, so a
stage-2 partition of millions of segments must not become one blob (it did, and ran a
1 GiB driver out of heap on a 10,000,000-frame capture)."""


def pack(tables: DecodedTables, max_rows: int = PACK_ROWS) -> pa.RecordBatch:
    """The non-empty tables of ``tables`` as :data:`PARTS_SCHEMA` rows, each table cut into
    streams of at most ``max_rows`` rows."""
    names, rows, blobs = [], [], []
    for name, schema in TABLES.items():
        whole: pa.Table = getattr(tables, name)
        for start in range(0, whole.num_rows, max_rows):
            table = whole.slice(start, max_rows)
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, schema, options=_WRITE_OPTIONS) as writer:
                writer.write_table(table)
            names.append(name)
            rows.append(table.num_rows)
            blobs.append(sink.getvalue().to_pybytes())
    return pa.RecordBatch.from_arrays(
        [pa.array(names, pa.string()), pa.array(rows, pa.int64()), pa.array(blobs, pa.binary())],
        schema=PARTS_SCHEMA)


def unpack(parts: pa.RecordBatch | pa.Table, name: str) -> Iterator[pa.RecordBatch]:
    """The batches of table ``name`` held in ``parts`` (rows of other tables are ignored)."""
    schema = TABLES[name]
    table_column = parts.column("table").to_pylist()
    blobs = parts.column("ipc")
    for i, tag in enumerate(table_column):
        if tag != name:
            continue
        blob = blobs[i].as_buffer()
        with pa.ipc.open_stream(blob) as reader:
            for batch in reader:
                yield batch if batch.schema == schema else batch.cast(schema)


DECODE_ROWS = 65536
DECODE_BYTES = 64 << 20
"""Stage 1 decodes at least this many frames (or bytes) at a time, whatever batch size Spark
delivers: the columnar decode has a fixed cost of several milliseconds per call."""


def rebatch(batches: Iterator[pa.RecordBatch], rows: int = DECODE_ROWS,
            nbytes: int = DECODE_BYTES) -> Iterator[pa.Table]:
    """Group consecutive batches into tables of about ``rows`` rows or ``nbytes`` bytes."""
    pending: list[pa.RecordBatch] = []
    count = size = 0
    for batch in batches:
        pending.append(batch)
        count += batch.num_rows
        size += batch.nbytes
        if count >= rows or size >= nbytes:
            yield pa.Table.from_batches(pending)
            pending, count, size = [], 0, 0
    if pending:
        yield pa.Table.from_batches(pending)


def _stage1(options: DecodeOptions) -> Callable[[Iterator[pa.RecordBatch]],
                                                Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for table in rebatch(batches):
            parts = pack(columnar.decode_batch(table, options))
            if parts.num_rows:
                yield parts
    return run


def _stage2(options: DecodeOptions) -> Callable[[Iterator[pa.RecordBatch]],
                                                Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        segments = list(batches)  # the whole partition: every segment of its flows
        if segments:
            parts = pack(columnar.reassemble(pa.Table.from_batches(segments), options))
            if parts.num_rows:
                yield parts
    return run


def _unpacker(name: str) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            yield from unpack(batch, name)
    return run


_SPARK_PARTS = from_arrow_schema(PARTS_SCHEMA)
_SPARK_SCHEMAS = {name: from_arrow_schema(schema) for name, schema in TABLES.items()}


def _table(parts: DataFrame, name: str) -> DataFrame:
    return (parts.where(F.col("table") == name)
            .mapInArrow(_unpacker(name), _SPARK_SCHEMAS[name]))


@dataclass
class DecodedFrames:
    """The decoded tables of a frames DataFrame (schemas: :mod:`spark_analysis.columnar`).

    Attributes:
        packets: one row per UM packet (``PACKETS_SCHEMA``).
        messages: one row per LBMC message (``MESSAGES_SCHEMA``).
        advertisements: one row per LBMR TIR/TQR (``ADVERTISEMENTS_SCHEMA``).
        skipped: frames that are not UM packets, counted per file and reason.
        stage1 / stage2: the packed stage results (:data:`PARTS_SCHEMA`) the tables read.
    """

    packets: DataFrame
    messages: DataFrame
    advertisements: DataFrame
    skipped: DataFrame
    stage1: DataFrame
    stage2: DataFrame

    def unpersist(self) -> None:
        self.stage1.unpersist()
        self.stage2.unpersist()


def decode_frames(frames: DataFrame, options: DecodeOptions | None = None, *,
                  persist: bool = True) -> DecodedFrames:
    """Decode a frames DataFrame (``spark.read.format("pcap")``, columns
    :data:`spark_analysis.columnar.FRAME_SCHEMA`) into UM tables.

    ``options`` carries the port map (store ports!) and the content-heuristics switch.
    Nothing runs until an action; with ``persist`` the two stage results are cached the first
    time they are computed.
    """
    options = options or DecodeOptions()
    missing = [c for c in INPUT_COLUMNS if c not in frames.columns]
    if missing:
        raise ValueError(f"frames DataFrame lacks column(s) {missing}; "
                         f"expected {schemas.FRAME_SCHEMA.names}")
    stage1 = frames.select(*INPUT_COLUMNS).mapInArrow(_stage1(options), _SPARK_PARTS)
    if persist:
        stage1 = stage1.persist(StorageLevel.MEMORY_AND_DISK)
    segments = _table(stage1, "tcp_segments")
    stage2 = (segments.repartition(*schemas.flow_key_columns(options))
              .mapInArrow(_stage2(options), _SPARK_PARTS))
    if persist:
        stage2 = stage2.persist(StorageLevel.MEMORY_AND_DISK)
    parts = stage1.where(F.col("table") != "tcp_segments").unionByName(stage2)
    skipped = (_table(parts, "skipped").groupBy("file", "reason")
               .agg(F.sum("frames").alias("frames"),
                    F.min("first_file_offset").alias("first_file_offset")))
    return DecodedFrames(
        packets=_table(parts, "packets"),
        messages=_table(parts, "messages"),
        advertisements=_table(parts, "advertisements"),
        skipped=skipped,
        stage1=stage1,
        stage2=stage2,
    )


# =============================================================================================
# Straight to Parquet: the fast path for whole captures
# =============================================================================================

def _required(name: str, schema: pa.Schema) -> pa.Schema:
    """``schema`` with the columns of :data:`~spark_analysis.schemas.ALWAYS_SET` not nullable
    (stored as required Parquet columns)."""
    always = ALWAYS_SET.get(name, frozenset())
    return pa.schema([f.with_nullable(False) if f.name in always else f for f in schema],
                     metadata=schema.metadata)


PARQUET_TABLES: dict[str, pa.Schema] = {
    **{name: _required(name, STORED_SCHEMAS[name])
       for name in ("packets", "messages", "advertisements")},
    "skipped": SKIPPED_SCHEMA,  # a few rows, merged on the driver
    **{name: _required(name, STORED_SCHEMAS[name]) for name in HEADER_TABLE_SCHEMAS},
}
"""The tables :func:`decode_to_parquet` writes, one directory of Parquet files each.
``messages`` is stored split (:func:`~spark_analysis.schemas.split_messages`): its core
columns, and one ``lbmc_<header>`` table per typed header column holding the messages that
carry that header; :meth:`ParquetTables.messages` joins them back.  The
:data:`~spark_analysis.schemas.CATEGORICAL_COLUMNS` are stored from dictionary arrays (see
there why): Spark reads them as strings, pyarrow as dictionary arrays (pandas: categoricals);
their Parquet column is a string column either way.  The columns the decoder always fills
(:data:`~spark_analysis.schemas.ALWAYS_SET`: the frame's identity, the message key, counts
and lengths) are *required* Parquet columns: a required column has no definition levels, which
made writing the LBT-TCP ``packets`` and ``messages`` of the benchmark capture 13-17%
cheaper.  Spark reads every file column as nullable anyway; pyarrow shows
these fields as not nullable."""

DEFAULT_BUCKETS = 64
"""Flow buckets of the LBT-TCP hand-over (stage 2 tasks take whole buckets)."""

ROW_GROUP_ROWS = 1 << 18
"""Rows a task buffers per table before writing them as one Parquet row group."""

STAGE2_TASKS_PER_CORE = 3
"""Stage-2 tasks per core: with one task per core, a cost estimate that is off by a tenth
left one core idle for a second at the end of a 10,000,000-frame run; smaller tasks handed
out as cores free up even that out, for about 0.1 s of task start-up each."""

STAGE2_TASK_BYTES = 256 << 20
"""TCP payload bytes per stage-2 task at most (unless one bucket alone is larger)."""

_TEMPORARY = "_temporary"


@dataclass(frozen=True)
class _Job:
    """What every task of one :func:`decode_to_parquet` run needs (pickled to the workers)."""

    filesystem: pafs.FileSystem
    tmp: str  # the run's private directory on ``filesystem``
    options: DecodeOptions
    buckets: int
    compression: str
    chunk_size: int


def _task_tag(kind: str, index: int) -> str:
    """A file name stem no other task attempt can produce (Spark may run a task twice)."""
    context = TaskContext.get()
    attempt = context.attemptNumber() if context is not None else 0
    return f"{kind}{index:05d}-a{attempt}-{uuid.uuid4().hex[:8]}"


class _ParquetSink:
    """A task's Parquet files: one per table, appended a row group at a time.

    Decoded pieces are buffered to :data:`ROW_GROUP_ROWS` rows (memory stays bounded by that
    times the row width); the ``skipped`` counts are returned, not written, and merged once
    on the driver."""

    def __init__(self, job: _Job, tag: str) -> None:
        self.job = job
        self.tag = tag
        self.pending: dict[str, list[pa.Table]] = defaultdict(list)
        self.pending_rows: dict[str, int] = defaultdict(int)
        self.writers: dict[str, pq.ParquetWriter] = {}
        self.rows: dict[str, int] = defaultdict(int)
        self.skipped: list[pa.Table] = []

    def add(self, tables: DecodedTables) -> None:
        """Buffer (and write when due) tables in the stored form (:class:`DecodedTables`)."""
        for name, table in (("packets", tables.packets), ("messages", tables.messages),
                            ("advertisements", tables.advertisements),
                            *tables.headers.items()):
            if table.num_rows:
                self.pending[name].append(table)
                self.pending_rows[name] += table.num_rows
                if self.pending_rows[name] >= ROW_GROUP_ROWS:
                    self._flush(name)
        if tables.skipped.num_rows:
            self.skipped.append(tables.skipped)

    def _flush(self, name: str) -> None:
        pending = self.pending.pop(name, [])
        self.pending_rows.pop(name, None)
        if not pending:
            return
        writer = self.writers.get(name)
        if writer is None:
            path = f"{self.job.tmp}/{name}/{self.tag}.parquet"
            writer = self.writers[name] = pq.ParquetWriter(
                path, PARQUET_TABLES[name], filesystem=self.job.filesystem,
                compression=self.job.compression, **_writer_options(name))
        # one dictionary per column and row group: the writer takes a dictionary column's
        # codes as they are only while its dictionary stays the same (else it hashes values)
        table = _as_stored(name, pa.concat_tables(pending).unify_dictionaries())
        writer.write_table(table, row_group_size=table.num_rows)
        self.rows[name] += table.num_rows

    def close(self) -> dict[str, Any]:
        for name in list(self.pending):
            self._flush(name)
        files = []
        for name, writer in self.writers.items():
            writer.close()
            files.append((name, f"{self.job.tmp}/{name}/{self.tag}.parquet", self.rows[name]))
        return {"files": files, "skipped": schemas.merge_skipped(self.skipped).to_pylist()}


def _as_stored(name: str, table: pa.Table) -> pa.Table:
    """``table`` (the stored form) relabelled with its Parquet schema, without copying.

    Raises RuntimeError if a column that is stored as required holds a null: a decoder bug,
    reported rather than written (the writer would not notice)."""
    schema = PARQUET_TABLES[name]
    for i, fld in enumerate(schema):
        if not fld.nullable and table.column(i).null_count:
            raise RuntimeError(f"decoder bug: {name}.{fld.name} has nulls but is always set")
    return pa.Table.from_arrays(table.columns, schema=schema)


DELTA_COLUMNS = ("file_offset", "ts_ns", "tcp_seq")
"""Columns stored with Parquet's DELTA_BINARY_PACKED encoding: values that grow along a
table's rows (record offsets, capture times, a flow's TCP sequence numbers).  Measured on
the benchmark's ``packets`` (262,144 rows): 10-11 ns a row and 1.7-2 bytes for
``file_offset``/``ts_ns`` and 7 ns and 0.03 bytes for ``tcp_seq``, against 17-20 ns and 4-5
bytes as snappy-compressed plain values.  Spark's vectorized reader reads the encoding."""


@functools.cache
def _writer_options(name: str) -> dict[str, Any]:
    """Dictionary pages for the string columns only (addresses, names, reasons: few distinct
    values), delta encoding for :data:`DELTA_COLUMNS`, and min/max statistics for the
    top-level integer and boolean columns only (times, offsets, ports, sequence numbers: what
    queries filter on by range).  String statistics cost about a fifth of the write time of
    ``packets`` and ``messages`` (measured on the benchmark capture); an equality filter on a
    string column is answered from its dictionary page instead.  Nested columns (header
    structs, lists) are encoded plainly and without statistics."""
    schema = PARQUET_TABLES[name]
    return {
        # levels and values are produced this many rows at a time (default 1,024): fewer
        # rounds over the leaves of the header structs (measured -8% CPU)
        "write_batch_size": 1 << 16,
        "use_dictionary": [f.name for f in schema
                           if pa.types.is_string(f.type) or pa.types.is_dictionary(f.type)],
        "column_encoding": {f.name: "DELTA_BINARY_PACKED" for f in schema
                            if f.name in DELTA_COLUMNS and pa.types.is_int64(f.type)},
        "write_statistics": [f.name for f in schema
                             if pa.types.is_integer(f.type) or pa.types.is_boolean(f.type)],
    }


def flow_buckets(segments: pa.Table, buckets: int, separate_files: bool = False) -> np.ndarray:
    """The bucket (``0 <= b < buckets``) of each segment's connection direction.

    A fixed integer hash of :data:`~spark_analysis.schemas.FLOW_KEY` (never Python's
    per-process ``hash``): every task must put a flow in the same bucket.  With
    ``separate_files`` the file name (its CRC-32) is part of the key, so the same 4-tuple in
    two captures usually lands in different buckets (stage 2 keeps them apart either way)."""
    mixed = np.zeros(segments.num_rows, np.uint64)
    if separate_files and segments.num_rows:
        files = arrow_build.encode_files(segments.column("file"))
        crcs = np.array([zlib.crc32(name.encode()) for name in files.dictionary.to_pylist()],
                        np.uint64)
        mixed = crcs[arrow_build.numpy_of(files.indices)] * np.uint64(0x9FB21C651E98DF25)
    for name, factor in zip(FLOW_KEY, (0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F,
                                       0x165667B19E3779F9, 0x27D4EB2F165667C5), strict=True):
        values = arrow_build.numpy_of(segments.column(name)).astype(np.uint64)
        mixed = (mixed ^ values) * np.uint64(factor)
    mixed ^= mixed >> np.uint64(29)
    return (mixed % np.uint64(buckets)).astype(np.int64)


_SEGMENTS_STORED = STORED_SCHEMAS["tcp_segments"]


class _BucketSink:
    """A task's TCP segments, one Arrow IPC stream file per flow bucket it met, in the
    stored form (the capture's name once per stream, not per segment)."""

    def __init__(self, job: _Job, tag: str) -> None:
        self.job = job
        self.tag = tag
        self.writers: dict[int, tuple[Any, pa.ipc.RecordBatchStreamWriter]] = {}
        self.stats: dict[int, list[int]] = {}

    def add(self, segments: pa.Table) -> None:
        if not segments.num_rows:
            return
        bucket = flow_buckets(segments, self.job.buckets, self.job.options.separate_files)
        order = np.argsort(bucket, kind="stable")
        sorted_buckets = bucket[order]
        cuts = np.flatnonzero(np.diff(sorted_buckets)) + 1
        bounds = [0, *cuts.tolist(), len(order)]
        if len(bounds) > 2 and (np.diff(order) != 1).any():  # one take, then zero-copy slices
            segments = segments.take(arrow_build.arrow_array(order))
        lengths = arrow_build.numpy_of(pc.binary_length(segments.column("payload")))
        for lo, hi in itertools.pairwise(bounds):
            number = int(sorted_buckets[lo])
            self._writer(number).write_table(segments.slice(lo, hi - lo))
            stat = self.stats.setdefault(number, [0, 0])
            stat[0] += hi - lo
            stat[1] += int(lengths[lo:hi].sum())

    def _writer(self, bucket: int) -> pa.ipc.RecordBatchStreamWriter:
        found = self.writers.get(bucket)
        if found is None:
            sink = self.job.filesystem.open_output_stream(self._path(bucket))
            found = self.writers[bucket] = (sink, pa.ipc.new_stream(sink, _SEGMENTS_STORED))
        return found[1]

    def _path(self, bucket: int) -> str:
        return f"{self.job.tmp}/tcp/b{bucket:04d}/{self.tag}.arrow"

    def close(self) -> list[tuple[int, str, int, int]]:
        for sink, writer in self.writers.values():
            writer.close()
            sink.close()
        return [(b, self._path(b), rows, size) for b, (rows, size) in sorted(self.stats.items())]


def _worker_stats(cpu: float, wall: float) -> dict[str, Any]:
    """The task's CPU and wall seconds, and its worker's pid and peak RSS."""
    return {"pid": os.getpid(), "maxrss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
            "cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall,
            "ended": time.time()}


def _freeze_heap() -> None:
    """In a Spark Python worker, exempt everything alive now from garbage collection.

    PySpark's daemon runs a full ``gc.collect()`` after every task of a reused worker.  With
    pyarrow, numpy, pandas and PySpark imported, that walked some 86,000 objects, about 30 ms
    each time, for objects that live as long as the worker (measured on the 2-core machine,
    before the decode stopped importing pandas: fewer objects now, the same waste per task).
    Called at the start of each task, right after that collection, it leaves the collector
    only the objects created since.  Frozen objects are still freed by reference counting;
    only a reference cycle among them would outlive its use.  The driver (tasks run
    in-process for tiny captures) is left alone."""
    if TaskContext.get() is not None:
        gc.freeze()


def _note_truncated(truncated: list[str], damaged: list[str], record: TruncatedRecord) -> None:
    (damaged if record.damaged else truncated).append(str(record))


def _decode_splits(job: _Job, items: Iterable[tuple[int, Split]]) -> Iterator[dict[str, Any]]:
    """Stage 1 task: each split is read chunk by chunk and decoded where it lies; the tables go
    to Parquet and the LBT-TCP segments to the flow-bucket files of stage 2."""
    _freeze_heap()
    for index, split in items:
        cpu, wall = time.process_time(), time.perf_counter()
        tag = _task_tag("s", index)
        sink, buckets = _ParquetSink(job, tag), _BucketSink(job, tag)
        truncated: list[str] = []
        damaged: list[str] = []
        reader = SplitReader(split, chunk_size=job.chunk_size,
                             on_truncated=functools.partial(_note_truncated, truncated,
                                                            damaged))
        frames = 0
        try:
            for chunk in reader.chunks():
                frames += len(chunk)
                tables = columnar.decode_chunk(split.capture.name, chunk, job.options,
                                               stored=True)
                sink.add(tables)
                buckets.add(tables.tcp_segments)
        except CaptureError as exc:
            yield {"error": str(exc)}
            return
        yield {"stage": 1, "index": index, "frames": frames, **sink.close(),
               "tcp": buckets.close(), "truncated": truncated, "damaged": damaged,
               **_worker_stats(cpu, wall)}


def _read_segments(job: _Job, paths: Sequence[str]) -> pa.Table:
    tables = []
    local = isinstance(job.filesystem, pafs.LocalFileSystem)
    for path in paths:
        # a local file is mapped, not read: the payloads stay in the page cache until stage 2
        # gathers them in flow order
        handle = pa.memory_map(path) if local else job.filesystem.open_input_file(path)
        with handle, pa.ipc.open_stream(handle) as reader:
            tables.append(reader.read_all())
    return pa.concat_tables(tables) if len(tables) > 1 else tables[0]


def _reassemble_buckets(job: _Job, items: Iterable[tuple[int, list[tuple[int, list[str]]]]],
                        ) -> Iterator[dict[str, Any]]:
    """Stage 2 task: each of its flow buckets (every segment of those flows, from every split)
    is reassembled on its own, so a task holds one bucket at a time."""
    _freeze_heap()
    for index, buckets in items:
        cpu, wall = time.process_time(), time.perf_counter()
        sink = _ParquetSink(job, _task_tag("t", index))
        segments = 0
        for _bucket, paths in buckets:
            table = _read_segments(job, paths)
            segments += table.num_rows
            sink.add(columnar.reassemble(table, job.options, stored=True))
            del table
        yield {"stage": 2, "index": index, "segments": segments, **sink.close(),
               **_worker_stats(cpu, wall)}


@dataclass
class ParquetTables:
    """Where :func:`decode_to_parquet` put the tables, and what it counted.

    Attributes:
        out: the output directory (URI or local path) as given.
        paths: table name -> its directory of Parquet files.
        rows: table name -> rows written.
        frames: captured frames read.
        tcp_segments: rows handed to stage 2 (LBT-TCP candidate segments and IPv4 fragments).
        truncated: the partial last records that were dropped (one line each).
        damaged: where a file is damaged, and what of it was not read (one line each:
            :class:`~spark_analysis.splits.TruncatedRecord`).
        workers: per Python worker process: pid -> peak RSS in KiB (as the worker saw it).
        seconds: wall time of the two Spark jobs and the commit.
        tasks: per task: stage, index, worker pid, CPU and wall seconds, end (epoch seconds).
    """

    out: str
    paths: dict[str, str]
    rows: dict[str, int]
    frames: int
    tcp_segments: int
    truncated: list[str]
    workers: dict[int, int]
    seconds: dict[str, float]
    tasks: list[dict[str, Any]] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)

    def dataframes(self, spark: SparkSession) -> dict[str, DataFrame]:
        """Each table as stored, as a DataFrame read back from its Parquet files
        (``messages`` without its header columns: see :meth:`messages`)."""
        return {name: spark.read.parquet(path) for name, path in self.paths.items()}

    def messages(self, spark: SparkSession, headers: Iterable[str] | None = None,
                 ) -> DataFrame:
        """``messages`` with its typed header columns joined back from the ``lbmc_*``
        tables: all of them (the schema of :func:`decode_frames`' ``messages``), or only
        those named in ``headers`` (each join costs a shuffle: ask for what you read)."""
        wanted = [h.name for h in MESSAGE_HEADER_COLUMNS if headers is None or h.name in headers]
        unknown = sorted(set(headers or ()) - set(wanted))
        if unknown:
            raise ValueError(f"no header column {unknown[0]!r}; known: "
                             f"{', '.join(h.name for h in MESSAGE_HEADER_COLUMNS)}")
        # only the tables joined: every ``spark.read.parquet`` is a Spark job (the schema from
        # a footer), and reading all twenty cost 1-3 s of jobs on every run
        from pyspark.sql import functions as F

        joined = spark.read.parquet(self.paths["messages"])
        for name in wanted:
            table = f"{HEADER_TABLE_PREFIX}{name}"
            header = spark.read.parquet(self.paths[table])
            # a header table of fewer rows than BROADCAST_HEADER_ROWS goes to every task
            # whole: no shuffle and sort of ``messages`` (as large as the capture) for it
            if self.rows.get(table, BROADCAST_HEADER_ROWS) < BROADCAST_HEADER_ROWS:
                header = F.broadcast(header)
            joined = joined.join(header, list(MESSAGE_KEY), "left")
        return joined.select(*MESSAGE_CORE_SCHEMA.names, *wanted)


BROADCAST_HEADER_ROWS = 1 << 20
"""Header tables (``lbmc_*``) of fewer rows are broadcast when :meth:`ParquetTables.messages`
joins them: at 1,000,000 frames the largest (``lbmc_ume_ack``) has 336,347 rows of four
columns, a few MiB in the broadcast; the others a few hundred."""


def _join(root: str, name: str) -> str:
    return f"{root.rstrip('/')}/{name}"


STAGE2_BYTES_PER_SEGMENT = 4096
"""Payload bytes that cost stage 2 about as much CPU as one more segment.  Measured per flow
bucket of the benchmark capture: CPU follows the segment count (correlation 0.98; about
2.7 us per segment with its Parquet rows) far more than the payload bytes (0.54)."""


def _plan_stage2(tcp: Sequence[tuple[int, str, int, int]], parallelism: int,
                 ) -> list[list[tuple[int, list[str]]]]:
    """Flow buckets packed into stage-2 tasks: costliest first onto the least loaded task,
    with :data:`STAGE2_TASKS_PER_CORE` tasks for every core (at least; more when needed to
    keep each under :data:`STAGE2_TASK_BYTES`).  A bucket's cost is its segments plus its
    payload over :data:`STAGE2_BYTES_PER_SEGMENT`.  The tasks come costliest first: Spark
    hands them out in that order as cores free up, which evens out what the estimate
    missed."""
    paths: dict[int, list[str]] = defaultdict(list)
    size: dict[int, int] = defaultdict(int)
    cost: dict[int, int] = defaultdict(int)
    for bucket, path, rows, nbytes in tcp:
        paths[bucket].append(path)
        size[bucket] += nbytes
        cost[bucket] += rows + nbytes // STAGE2_BYTES_PER_SEGMENT
    if not paths:
        return []
    total = sum(size.values())
    count = min(len(paths), max(STAGE2_TASKS_PER_CORE * parallelism,
                                -(-total // STAGE2_TASK_BYTES)))
    tasks: list[list[tuple[int, list[str]]]] = [[] for _ in range(count)]
    load = [0] * count
    for bucket in sorted(paths, key=lambda b: (-cost[b], b)):
        lightest = load.index(min(load))
        tasks[lightest].append((bucket, sorted(paths[bucket])))
        load[lightest] += cost[bucket]
    order = sorted(range(count), key=lambda i: -load[i])
    return [tasks[i] for i in order if tasks[i]]


def decode_to_parquet(spark: SparkSession | None, paths: str | Sequence[str], out: str,
                      options: DecodeOptions | None = None, *,
                      split_size: int | None = None, pcapng_index: PcapngIndexMode = "head",
                      on_truncated: OnTruncated = "warn", overwrite: bool = False,
                      buckets: int = DEFAULT_BUCKETS, compression: str = "snappy",
                      chunk_size: int = DEFAULT_CHUNK_SIZE,
                      driver_bytes: int = 0,
                      processes: ProcessPoolExecutor | None = None) -> ParquetTables:
    """Decode captures into Parquet tables under ``out`` (``packets/``, ``messages/``,
    ``advertisements/``, ``skipped/``): the same rows as :func:`decode_frames`, about ten
    times faster, in bounded memory.

    Two Spark jobs of Python tasks, with nothing of the capture crossing into the JVM:

    1. one task per byte-range split reads its records (:meth:`SplitReader.chunks`, the bytes
       stay in the read buffer), decodes them (:func:`columnar.decode_chunk`) and writes the
       UDP and LBMR rows straight to Parquet with pyarrow; LBT-TCP segments and IPv4
       fragments go, grouped by flow, to Arrow IPC files of :data:`DEFAULT_BUCKETS` flow
       buckets under ``out``;
    2. one task per group of buckets reassembles them (:func:`columnar.reassemble`) and
       writes their rows.  Buckets are balanced over the tasks by estimated cost (segments,
       then payload bytes: :func:`_plan_stage2`).

    The tasks write under ``out/_temporary/<run>/`` with file names unique per attempt; the
    driver moves the files of the successful attempts into place once both jobs succeeded
    and deletes the rest, so a failed or retried task leaves no partial data (Spark's own
    file-commit rule).  ``out`` may be any pyarrow filesystem URI (``hdfs://``, ``s3://``)
    that every executor can reach.

    Memory: a stage-1 task holds one read chunk, its decode and :data:`ROW_GROUP_ROWS` rows
    per table; a stage-2 task holds one flow bucket (all of its flows' payload).

    Captures of at most ``driver_bytes`` bytes in all (0: never) are decoded by the same task
    code in the driver process, without Spark jobs: for a tiny capture, starting Python
    workers and scheduling two jobs costs seconds, the decode milliseconds.

    With ``processes`` (a pool of local worker processes) the same tasks run in that pool and
    no Spark job runs at all (``spark`` may then be None; with neither, every task runs in
    this process): ``ump analyze`` on a local master decodes this way while the JVM is still
    starting, so the two overlap instead of the decode waiting for Spark's start (about six
    seconds).

    Raises :class:`CaptureError` for unreadable captures (also when found by a task), and
    ``FileExistsError`` when ``out`` exists and ``overwrite`` is false.
    """
    options = options or DecodeOptions()
    started = time.perf_counter()
    splits_planned = plan(paths, split_size or DEFAULT_SPLIT_SIZE, pcapng_index)
    sc: Any = spark.sparkContext if processes is None and spark is not None else None
    parallelism = max(1, sc.defaultParallelism if sc is not None
                      else getattr(processes, "_max_workers", os.cpu_count() or 1))
    if split_size is None:  # enough tasks for every core, even for one smallish file
        total = sum(s.end - s.start for s in splits_planned)
        size = min(DEFAULT_SPLIT_SIZE, max(8 << 20, -(-total // (4 * parallelism))))
        splits_planned = plan(paths, size, pcapng_index)
    filesystem, root = resolve(out)
    info = filesystem.get_file_info(root)
    if info.type != pafs.FileType.NotFound:
        if not overwrite:
            raise FileExistsError(f"{out} exists; choose another directory or overwrite")
        if info.type != pafs.FileType.Directory:
            raise FileExistsError(f"{out} is a file, not an output directory")
        ours = {*PARQUET_TABLES, _TEMPORARY, "_SUCCESS"}
        foreign = sorted(e.base_name for e in filesystem.get_file_info(pafs.FileSelector(root))
                         if e.base_name not in ours)
        if foreign:  # overwrite replaces an earlier output, never someone's directory
            raise FileExistsError(f"{out} holds more than decoded tables ({', '.join(foreign[:3])}"
                                  f"{' ...' if len(foreign) > 3 else ''}); not overwriting it")
        filesystem.delete_dir(root)
    tmp = _join(root, f"{_TEMPORARY}/{uuid.uuid4().hex}")
    for sub in [*PARQUET_TABLES, *(f"tcp/b{b:04d}" for b in range(buckets))]:
        filesystem.create_dir(_join(tmp, sub), recursive=True)
    job = _Job(filesystem, tmp, options, buckets, compression, chunk_size)
    seconds: dict[str, float] = {}
    try:
        t0 = time.perf_counter()
        in_driver = sum(s.end - s.start for s in splits_planned) <= driver_bytes
        runner: Any = None if in_driver else (processes if processes is not None else sc)
        first = _run_tasks(runner, _decode_splits, job, splits_planned)
        seconds["stage1"] = time.perf_counter() - t0
        tcp = [entry for m in first for entry in m["tcp"]]
        plan2 = _plan_stage2(tcp, parallelism)
        t0 = time.perf_counter()
        second = _run_tasks(runner, _reassemble_buckets, job, plan2)
        seconds["stage2"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        result = _commit(job, root, out, first + second)
        seconds["commit"] = time.perf_counter() - t0
    except BaseException:
        with contextlib.suppress(OSError):
            filesystem.delete_dir(tmp)
        raise
    seconds["total"] = time.perf_counter() - started
    result.frames = sum(m["frames"] for m in first)
    result.tcp_segments = sum(rows for _b, _p, rows, _n in tcp)
    result.truncated = [t for m in first for t in m["truncated"]]
    result.damaged = [t for m in first for t in m["damaged"]]
    for stage, manifests in (("stage1", first), ("stage2", second)):
        seconds[f"{stage}_task_cpu"] = sum(m["cpu"] for m in manifests)
        seconds[f"{stage}_task_wall"] = sum(m["wall"] for m in manifests)
    result.seconds = seconds
    result.tasks = [{k: m[k] for k in ("stage", "index", "pid", "cpu", "wall", "ended")}
                    for m in (*first, *second)]
    for line in (*result.damaged, *result.truncated):
        if on_truncated == "error":
            raise CaptureError(line)
        if on_truncated == "warn":
            log.warning("%s", line)
    return result


def _run_tasks(sc: Any, task: Callable[[_Job, Iterable[tuple[int, Any]]],
                                       Iterator[dict[str, Any]]],
               job: _Job, items: Sequence[Any]) -> list[dict[str, Any]]:
    """``task``'s manifests for every item (one Spark task each, or one call in a pool of
    local processes when ``sc`` is a :class:`ProcessPoolExecutor`), or, with no SparkContext
    ``sc`` (a capture small enough to decode in the driver) or nothing to do, run right
    here.  Raises the first task's CaptureError."""
    numbered = list(enumerate(items))
    if sc is None or not numbered:
        manifests = list(task(job, numbered))
    elif isinstance(sc, ProcessPoolExecutor):
        # costliest first, as Spark hands them out (the items come in that order)
        calls = [sc.submit(_run_items, task, job, [item]) for item in numbered]
        manifests = [m for call in calls for m in call.result()]
    else:
        manifests = (sc.parallelize(numbered, len(numbered))
                     .mapPartitions(functools.partial(task, job)).collect())
    _raise_task_error(manifests)
    return manifests


def _run_items(task: Callable[[_Job, Iterable[tuple[int, Any]]], Iterator[dict[str, Any]]],
               job: _Job, items: list[tuple[int, Any]]) -> list[dict[str, Any]]:
    """One pool call of :func:`_run_tasks` (a module-level function: pools pickle it)."""
    return list(task(job, items))


def _raise_task_error(manifests: Sequence[Mapping[str, Any]]) -> None:
    for manifest in manifests:
        if "error" in manifest:
            raise CaptureError(manifest["error"])


def _commit(job: _Job, root: str, out: str, manifests: Sequence[Mapping[str, Any]],
            ) -> ParquetTables:
    """Move the successful attempts' files into place, write ``skipped``, drop the rest."""
    fs = job.filesystem
    rows: dict[str, int] = dict.fromkeys(PARQUET_TABLES, 0)
    paths = {name: _join(root, name) for name in PARQUET_TABLES}
    for name in PARQUET_TABLES:
        fs.create_dir(paths[name], recursive=True)
    numbers: dict[str, int] = defaultdict(int)
    ordered = sorted(manifests, key=lambda m: (m["stage"], m["index"]))
    for manifest in ordered:
        for name, path, count in manifest["files"]:
            fs.move(path, f"{paths[name]}/part-{numbers[name]:05d}.parquet")
            numbers[name] += 1
            rows[name] += count
    skipped = schemas.merge_skipped([pa.Table.from_pylist(m["skipped"], schema=SKIPPED_SCHEMA)
                                      for m in ordered])
    skipped = skipped.sort_by([("file", "ascending"), ("reason", "ascending")])
    pq.write_table(skipped, f"{paths['skipped']}/part-00000.parquet", filesystem=fs)
    numbers["skipped"] = 1
    rows["skipped"] = skipped.num_rows
    for name, schema in PARQUET_TABLES.items():
        if not numbers[name]:  # an empty table still has its schema on disk
            pq.write_table(schema.empty_table(), f"{paths[name]}/part-00000.parquet",
                           filesystem=fs)
    fs.delete_dir(_join(root, _TEMPORARY))
    with fs.open_output_stream(_join(root, "_SUCCESS")):
        pass
    workers: dict[int, int] = {}
    for manifest in manifests:
        workers[manifest["pid"]] = max(workers.get(manifest["pid"], 0), manifest["maxrss_kb"])
    return ParquetTables(out, {n: (_join(out, n)) for n in PARQUET_TABLES}, rows, 0, 0, [],
                         workers, {})
