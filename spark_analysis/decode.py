"""Spark plumbing of the UM decode: frames DataFrame in, packets/messages/advertisements out.

The work itself is :mod:`spark_analysis.columnar`'s; this module only places it on Spark:

* **stage 1** (stateless) runs :func:`~spark_analysis.columnar.decode_batch` on every Arrow
  batch with ``mapInArrow``.  ``mapInArrow`` has a single output schema but stage 1 makes five
  tables, so each output row is one table *batch* as a compressed Arrow IPC stream
  (:data:`PARTS_SCHEMA`: ``table``, ``rows``, ``ipc``).  A tagged union of struct columns
  would be the obvious alternative and is far slower: Arrow ships every child buffer of a
  null struct, so each row would carry all five tables' widths (about 1.5 KB);
* **stage 2** (LBT-TCP) needs all segments of a connection direction together, whatever
  partition or file they came from: the ``tcp_segments`` parts are unpacked, repartitioned by
  :data:`~spark_analysis.columnar.FLOW_KEY` (a hash shuffle: every segment of a flow lands in
  the same partition) and each partition is reassembled at once by
  :func:`~spark_analysis.columnar.reassemble_tcp` in ``mapInArrow``, which returns parts
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

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pyarrow as pa
from pyspark import StorageLevel
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from . import columnar
from .columnar import (
    ADVERTISEMENTS_SCHEMA,
    FLOW_KEY,
    MESSAGES_SCHEMA,
    PACKETS_SCHEMA,
    SKIPPED_SCHEMA,
    TCP_SEGMENTS_SCHEMA,
    DecodedTables,
    DecodeOptions,
)

__all__ = ["PARTS_SCHEMA", "TABLES", "DecodedFrames", "decode_frames", "pack", "unpack"]

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


def pack(tables: DecodedTables) -> pa.RecordBatch:
    """The non-empty tables of ``tables`` as :data:`PARTS_SCHEMA` rows."""
    names, rows, blobs = [], [], []
    for name, schema in TABLES.items():
        table: pa.Table = getattr(tables, name)
        if not table.num_rows:
            continue
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
            parts = pack(columnar.reassemble_tcp(pa.Table.from_batches(segments), options))
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
                         f"expected {columnar.FRAME_SCHEMA.names}")
    stage1 = frames.select(*INPUT_COLUMNS).mapInArrow(_stage1(options), _SPARK_PARTS)
    if persist:
        stage1 = stage1.persist(StorageLevel.MEMORY_AND_DISK)
    segments = _table(stage1, "tcp_segments")
    stage2 = segments.repartition(*FLOW_KEY).mapInArrow(_stage2(options), _SPARK_PARTS)
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
