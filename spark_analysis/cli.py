"""``ump analyze``: mine UM captures with Spark (the analyses of :mod:`spark_analysis.engine`).

Adds the subcommand to the ``ump`` front end; the work is :mod:`spark_analysis.job` (which also
runs under ``spark-submit``).  Importing this module is cheap: Spark, pyarrow and pandas are
loaded only when the command runs, so ``ump --help`` works without the ``spark`` extra.
"""

from __future__ import annotations

import argparse
from typing import Any

from . import job


def register(sub: Any) -> None:
    parser = sub.add_parser(
        "analyze", help="analyse UM captures with Spark: Parquet tables and an HTML report",
        description="Decode UM captures with Spark and analyse what every source, receiver and "
                    "store did: topic advertisements, transport sessions (data, RX, NAK, NCF, "
                    "SM), sequence gaps, store registrations, stability and consumption "
                    "latency, flight size, retransmission requests, anomalies.  Writes "
                    "OUT/parquet/<analysis>/, OUT/summary.json and OUT/report.html.  Give the "
                    "store ports (--store-port): tshark has no default for them either.  UM "
                    "on other ports is found by content (no options needed); the detection "
                    "options are ump dissect's, so both tools see the same UM frames.  "
                    "--master spark://HOST:PORT runs on a standalone cluster: the project is "
                    "shipped to its executors.")
    job.add_arguments(parser)
    parser.set_defaults(handler=run_analyze)


def run_analyze(args: argparse.Namespace) -> int:
    return job.run_command(args)
