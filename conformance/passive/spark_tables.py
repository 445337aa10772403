"""Passive judging at Spark scale: the capture is decoded in Spark, the judges run here.

The decode is ``ump analyze``'s (:func:`spark_analysis.decode.decode_to_parquet`: Python
tasks on the executors read, decode and reassemble the capture into Parquet tables).  What
the judges need of those tables (:data:`conformance.passive.tables.PACKET_COLUMNS`,
``MESSAGE_COLUMNS`` with the header columns they read, ``ADVERT_COLUMNS``: about one row per
data message and ACK) is collected into this process as Arrow and folded into the observation
by :func:`conformance.passive.tables.observe_tables`, exactly as the in-process decode's
tables are; the same case objects judge it.  So the verdicts are the in-process ones by
construction: the same decode code, the same builder, the same judges.

The frame numbers are the capture reader's record order, read here
(:func:`conformance.passive.tables.read_records`, a pass over the record headers).
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from conformance.passive.tables import (
    ADVERT_COLUMNS,
    HEADER_COLUMNS,
    MESSAGE_COLUMNS,
    PACKET_COLUMNS,
    CaptureTables,
    Records,
    capture_tables,
    read_records,
)
from wire.tshark import PortMap


def spark_session(capture_bytes: int, master: str | None = None) -> Any:
    """A Spark session sized for ``capture_bytes`` as ``ump analyze`` sizes its own."""
    from spark_analysis.job import SMALL_CAPTURE_BYTES, SMALL_CAPTURE_JVM, launch_config
    from spark_analysis.session import get_spark, size_shuffle_partitions

    config = SMALL_CAPTURE_JVM if capture_bytes <= SMALL_CAPTURE_BYTES else launch_config(
        capture_bytes)
    spark = get_spark(app_name="ump-conform", master=master, config=config,
                      log_level="ERROR", quiet=True)
    size_shuffle_partitions(spark, capture_bytes)
    return spark


def decode_tables_spark(paths: Sequence[Path], ports: PortMap, content: bool = True,
                        spark: Any = None, master: str | None = None) -> CaptureTables:
    """:func:`conformance.passive.tables.decode_tables`, decoded by Spark tasks (a session is
    started when ``spark`` is None)."""
    from spark_analysis.decode import decode_to_parquet
    from spark_analysis.schemas import DecodeOptions

    records = Records()
    read_records(paths, records)
    if spark is None:
        spark = spark_session(sum(Path(p).stat().st_size for p in paths), master)
    options = DecodeOptions(ports=ports, content_heuristics=content)
    with tempfile.TemporaryDirectory(prefix="ump-conform-") as tmp:
        decoded = decode_to_parquet(spark, [str(p) for p in paths], f"{tmp}/decoded", options)
        messages = decoded.messages(spark, HEADER_COLUMNS).select(
            *MESSAGE_COLUMNS, *HEADER_COLUMNS)
        tables = {"packets": spark.read.parquet(decoded.paths["packets"]).select(
                      *PACKET_COLUMNS),
                  "messages": messages,
                  "advertisements": spark.read.parquet(decoded.paths["advertisements"]).select(
                      *ADVERT_COLUMNS)}
        collected: dict[str, pa.Table] = {name: df.toArrow() for name, df in tables.items()}
    return capture_tables(paths, records, collected["packets"], collected["messages"],
                          collected["advertisements"])
