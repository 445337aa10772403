"""spark_analysis: pcap/pcapng captures in Spark, the columnar UM decode, analyses (issue 4).

Names are imported lazily: ``import spark_analysis`` must work where pyarrow or pyspark (the
``spark`` extra) is not installed, e.g. for the ``ump`` command line.

In a Spark session made elsewhere, one call readies it for ``spark.read.format("pcap")`` and
the decode on any master (ships this project to the executors, sizes the shuffle partitions,
registers the data source: :func:`spark_analysis.session.register`)::

    import spark_analysis
    spark_analysis.register(spark)
    frames = spark.read.format("pcap").load("caps/*.pcap")
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CAPTURE_SCHEMA": "splits",
    "CaptureError": "splits",
    "expand_paths": "splits",
    "open_capture": "splits",
    "plan": "splits",
    "plan_splits": "splits",
    "read_split": "splits",
    "read_table": "splits",
    "SplitReader": "splits",
    "PcapDataSource": "pcap_source",
    "load_captures": "pcap_source",
    "get_spark": "session",
    "register": "session",
    "DecodeOptions": "columnar",
    "decode_frames": "decode",
    "decode_to_parquet": "decode",
    "ParquetTables": "decode",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'spark_analysis' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)
