"""The SparkSession every analysis uses: local by default, the cluster's under spark-submit.

``get_spark()`` in a plain ``python`` process starts Spark in-process on all local cores
(``local[*]``, spark-submit's own default, unless ``master=`` or ``PYSPARK_SUBMIT_ARGS`` says
otherwise) with settings that suit captures on one machine.  Under ``spark-submit`` (or in a
notebook that already has a session) what was chosen there wins: the master is never forced and
each default below applies only when the configuration does not already name that key.  Either
way the ``pcap`` data source is registered.

On a local master the Python workers are started by :mod:`spark_analysis.worker_daemon`, which
spares each of them compiling PySpark from Spark's zip anew (about 1.5 CPU-s less each time a
SparkContext starts its workers on the 2-core machine).  Not on a cluster master, nor when this
package was itself imported from a zip (``--py-files ump.zip`` without an install): there the
workers may get this package only through ``--py-files``, which reaches a worker after its
daemon started.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from .pcap_source import register

DAEMON_MODULE = "spark_analysis.worker_daemon"
"""``spark.python.daemon.module`` on local masters (see the module docstring)."""


def default_config(local: bool = True) -> dict[str, str]:
    """Settings that suit analysis of captures; each applies only when not already set.

    ``local``: the master is ``local[...]``, so the workers run where this package is
    installed and may use :data:`DAEMON_MODULE` (unless it came from a zip)."""
    cores = os.cpu_count() or 2
    on_disk = os.path.isdir(os.path.dirname(os.path.abspath(__file__)))
    daemon = {"spark.python.daemon.module": DAEMON_MODULE} if local and on_disk else {}
    return {
        **daemon,
        # the default 200 shuffle partitions cost more than the work on one machine
        "spark.sql.shuffle.partitions": str(max(4, 2 * cores)),
        # Arrow for toPandas/createDataFrame, the same columnar path the data source uses
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # timestamps derived from ts_ns print the same on every machine
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
    }


def get_spark(app_name: str = "ump-analysis", master: str | None = None,
              config: Mapping[str, str] | None = None, log_level: str = "WARN") -> SparkSession:
    """The active session, or a new one (see the module docstring for what wins).

    Args:
        app_name: shown in the Spark UI and logs (ignored when a session already exists).
        master: force a master (``"local[2]"``, ``"spark://host:7077"``); by default the one
            spark-submit or ``spark-defaults.conf`` gives, else ``local[*]``.
        config: extra settings; they override :func:`default_config`, and under spark-submit
            they too give way to what its command line set.
        log_level: Spark's log level once started (startup messages come before it applies).
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active
    builder = SparkSession.builder.appName(app_name)
    if master is not None:
        builder = builder.master(master)
    existing: SparkConf | None = None
    if _under_spark_submit():
        # the JVM exists already: read what spark-submit was told and only fill the gaps
        SparkContext._ensure_initialized()
        existing = SparkConf()
        chosen = existing.get("spark.master", master or "local[*]")
    else:
        # getOrCreate launches the JVM itself (with these settings, so launch-time ones such
        # as spark.driver.memory apply) and spark-submit's own default master is local[*]
        chosen = master or _launch_master()
    settings = {**default_config(_is_local(chosen)), **(config or {})}
    if existing is not None:
        settings = {k: v for k, v in settings.items() if not existing.contains(k)}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark


def _is_local(master: str) -> bool:
    return master.strip().startswith("local")


def _launch_master() -> str:
    """The master PySpark's launcher picks when none is given: ``--master`` in
    ``PYSPARK_SUBMIT_ARGS``, else ``spark.master`` in ``spark-defaults.conf``, else
    ``local[*]``."""
    args = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    for i, arg in enumerate(args):
        if arg == "--master" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--master="):
            return arg.split("=", 1)[1]
    conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(
        os.environ.get("SPARK_HOME", ""), "conf")
    try:
        with open(os.path.join(conf_dir, "spark-defaults.conf"), encoding="utf-8") as handle:
            for line in handle:
                parts = line.split(None, 1)
                if len(parts) == 2 and parts[0] == "spark.master":
                    return parts[1].strip()
    except OSError:
        pass
    return "local[*]"


def _under_spark_submit() -> bool:
    """spark-submit starts the JVM first and hands Python its gateway port."""
    return "PYSPARK_GATEWAY_PORT" in os.environ
