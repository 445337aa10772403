"""``spark.read.format("pcap")``: pcap and pcapng files as a DataFrame, split across tasks.

A PySpark 4 Python data source.  The driver expands the paths (globs included, through the
pyarrow filesystem of the URI, so ``hdfs://`` and ``s3://`` work like local paths), reads each
file's header and plans byte-range splits; each task then finds its first record boundary and
streams its records as Arrow batches (:mod:`spark_analysis.splits` has the boundary rules).

Options (all optional):

``splitSize``
    bytes per task, default 64 MiB.  Smaller splits give more parallelism on few files.
``maxRecordsPerBatch``
    rows per Arrow batch handed to Spark, default 65536.
``pcapngIndex``
    ``head`` (default) or ``scan``; see "pcapng context" in :mod:`spark_analysis.capture_files`.
    ``head`` fails loudly on a pcapng file with several sections; ``scan`` reads every block
    header of each pcapng file on the driver first and handles anything.
``onTruncated``
    ``warn`` (default: the partial last record of a capture cut short is dropped and logged by
    the task) or ``error`` (the query fails naming the file and offset).

Usage, in a session of your own (one call first: it also ships this project to a cluster's
executors and sizes the shuffle partitions, see :func:`spark_analysis.session.register`)::

    import spark_analysis
    spark_analysis.register(spark)
    frames = spark.read.format("pcap").option("splitSize", 32 << 20).load("caps/*.pcapng")

``spark_analysis.session.get_spark()`` gives a session readied so already.

Errors the user can fix (no such file, not a capture, bad option) are raised as
:class:`~spark_analysis.capture_files.CaptureError` while planning.  Spark wraps exceptions from a
Python data source in its own; :func:`load_captures` checks the paths in the calling process
first, so a typo there is a plain Python exception with a one-line message.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import StructType

from .capture_files import CaptureError, expand_paths
from .splits import (
    CAPTURE_SCHEMA,
    DEFAULT_MAX_ROWS,
    DEFAULT_SPLIT_SIZE,
    Split,
    SplitReader,
    plan,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame, SparkSession

FORMAT = "pcap"
SPARK_SCHEMA: StructType = from_arrow_schema(CAPTURE_SCHEMA)


class SplitPartition(InputPartition):
    """One split, shipped pickled to the task that reads it."""

    def __init__(self, split: Split) -> None:
        super().__init__(split)
        self.split = split


def _int_option(options: Mapping[str, str], name: str, default: int) -> int:
    raw = options.get(name, options.get(name.lower()))
    if raw is None:
        return default
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise CaptureError(f"option {name} must be a whole number, not {raw!r}") from None
    if value <= 0:
        raise CaptureError(f"option {name} must be positive, not {value}")
    return value


def _choice(options: Mapping[str, str], name: str, choices: Sequence[str]) -> str:
    raw = options.get(name, options.get(name.lower(), choices[0]))
    if raw not in choices:
        raise CaptureError(f"option {name} must be one of {', '.join(choices)}, not {raw!r}")
    return str(raw)


def _paths(options: Mapping[str, str]) -> list[str]:
    """``load(path)`` passes ``path``; ``load([a, b])`` passes ``paths`` as a JSON list."""
    found: list[str] = []
    if options.get("path"):
        found.append(options["path"])
    if options.get("paths"):
        found.extend(json.loads(options["paths"]))
    if not found:
        raise CaptureError('no capture given: spark.read.format("pcap").load(PATH_OR_GLOB)')
    return found


class PcapDataSource(DataSource):
    """The ``pcap`` format: one row per captured frame, columns as in ``CAPTURE_SCHEMA``."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SPARK_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return PcapReader(dict(self.options))


class PcapReader(DataSourceReader):
    """Plans splits on the driver, reads one split per task."""

    def __init__(self, options: Mapping[str, str]) -> None:
        self.paths = _paths(options)
        self.split_size = _int_option(options, "splitSize", DEFAULT_SPLIT_SIZE)
        self.max_rows = _int_option(options, "maxRecordsPerBatch", DEFAULT_MAX_ROWS)
        self.pcapng_index = _choice(options, "pcapngIndex", ("head", "scan"))
        self.on_truncated = _choice(options, "onTruncated", ("warn", "error"))

    def partitions(self) -> Sequence[InputPartition]:
        splits = plan(self.paths, self.split_size, self.pcapng_index)  # type: ignore[arg-type]
        return [SplitPartition(split) for split in splits]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, SplitPartition)
        yield from SplitReader(partition.split, self.max_rows,
                               on_truncated=self.on_truncated)  # type: ignore[arg-type]


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("pcap")`` available in this session: the whole of
    :func:`spark_analysis.session.register` (shipping comes first on a cluster)."""
    from .session import register as ready

    ready(spark)


def load_captures(spark: SparkSession, paths: str | Sequence[str], **options: Any) -> DataFrame:
    """``spark.read.format("pcap")`` with the paths checked here first, for a clean error.

    Raises :class:`CaptureError` (a ``ValueError``) when a path matches nothing."""
    expand_paths(paths)
    register(spark)
    reader = spark.read.format(FORMAT)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load(paths if isinstance(paths, str) else list(paths))
