"""The SparkSession every analysis uses, and :func:`register`, which readies any session.

``get_spark()`` in a plain ``python`` process starts Spark in-process on all local cores
(``local[*]``, spark-submit's own default, unless ``master=`` or ``PYSPARK_SUBMIT_ARGS`` says
otherwise) with settings that suit captures on one machine.  Under ``spark-submit`` (or in a
notebook that already has a session) what was chosen there wins: the master is never forced and
each default below applies only when the configuration does not already name that key.  Either
way the session is readied by :func:`register`.

``spark_analysis.register(spark)`` is the one call a session made elsewhere (a notebook,
``pyspark``, your own ``SparkSession.builder``) needs before ``spark.read.format("pcap")`` and
the decode::

    import spark_analysis
    spark_analysis.register(spark)
    frames = spark.read.format("pcap").load("caps/*.pcap")

It does three things, in this order:

1. **Ships the project** on a master that is not ``local[...]``: the ``spark_analysis`` and
   ``wire`` packages (:data:`SHIPPED_PACKAGES`, every ``.py`` file of them) go into one zip,
   built once per process (:func:`project_zip`), which ``SparkContext.addPyFile`` hands to every
   executor.  It must come before anything Python is defined for the executors (the data source
   below, the decode's tasks): PySpark takes the list of shipped files when a function is
   wrapped.  Nothing is shipped when this package was itself imported from a zip
   (``spark-submit --py-files ump.zip``: that zip is shipped already) or on a local master
   (the workers are this machine's).  Executors still need the third-party packages
   (``pip install numpy pandas pyarrow construct`` in the interpreter they run); the compiled
   pieces of the decode (``_recordwalk``, ``_netheaders``) cannot be imported from a zip, so
   executors fed the zip run their numpy and Python equivalents, which give the same rows.
2. **Sizes** ``spark.sql.shuffle.partitions`` (:func:`size_shuffle_partitions`): Spark's
   default of 200 partitions costs far more than the work on a capture: the DataFrame decode
   (``decode_frames``) of a 12,058-frame capture took 278-387 s with it and 54-83 s with two
   (one per core), on the 2-core machine while other jobs kept its load average at 10-22.
   Without an input size it becomes one partition per core the session has
   (``defaultParallelism``); :func:`size_shuffle_partitions` with the capture's bytes gives
   one per :data:`SHUFFLE_PARTITION_BYTES` as well, in whole waves of the cores.  A value
   given at launch (``--conf``, ``SparkConf``, ``config=`` here) or set at run time to
   anything but 200 is the user's and is kept.
3. Registers the ``pcap`` data source (:class:`~spark_analysis.pcap_source.PcapDataSource`).

**Which Python the workers run.**  Spark starts its Python workers with ``PYSPARK_PYTHON``,
else the first ``python3`` on ``PATH``, which is not this interpreter when a virtual
environment's ``ump`` is run without activating it (and then lacks the packages).  So on a local
master, and on a ``spark://`` master on this host (its address is one of this machine's),
:func:`get_spark` sets ``PYSPARK_PYTHON`` to ``sys.executable`` before Spark starts, unless the
environment names one already.  On another host this interpreter's path may mean nothing: there
Spark's rule stands (set ``PYSPARK_PYTHON`` to the executors' interpreter).  ``SPARK_HOME``
is set too when unset (to the installed PySpark's), which spares Spark's launcher script from
asking that ``python3`` where Spark is.

**Quiet start.**  Starting the JVM prints a banner on stderr (a JDK warning, Spark's log
profile, the log level hint, hostname and native-library warnings) before any log level can
apply.  Unless ``quiet=False``, :func:`get_spark` launches the JVM with its stderr piped
through a thread that holds back what is printed until the session is up, drops it if the
start succeeded and prints it if the start failed (it then says why); from then on every line
is passed through, under the log level given.  Under spark-submit the JVM is running already
(its own ``--conf spark.log.level=WARN`` quiets it).

On a local master the Python workers are started by :mod:`spark_analysis.worker_daemon`, which
spares each of them compiling PySpark from Spark's zip anew (about 1.5 CPU-s less each time a
SparkContext starts its workers on the 2-core machine).  Not on a cluster master, nor when this
package was itself imported from a zip (``--py-files ump.zip`` without an install): there the
workers may get this package only through ``--py-files``, which reaches a worker after its
daemon started.

``python -m spark_analysis.session --zip ump.zip`` writes the zip of step 1 for
``spark-submit --py-files`` (the README's recipe).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import hashlib
import ipaddress
import math
import os
import re
import shlex
import shutil
import socket
import sys
import tempfile
import threading
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO

from pyspark import SparkConf, SparkContext
from pyspark.sql import SparkSession

from .pcap_source import PcapDataSource

DAEMON_MODULE = "spark_analysis.worker_daemon"
"""``spark.python.daemon.module`` on local masters (see the module docstring)."""

SHIPPED_PACKAGES = ("spark_analysis", "wire")
"""The packages executors import (the decode's tasks and the data source); what
:func:`project_zip` holds."""

SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
SPARK_DEFAULT_SHUFFLE_PARTITIONS = "200"
AUTO_SHUFFLE_MARK = "spark.ump.autoShufflePartitions"
"""Session setting holding the shuffle partition count :func:`size_shuffle_partitions` chose,
so that a later call may size it again (a count the user chose is left alone)."""

SHUFFLE_PARTITION_BYTES = 64 << 20
"""Capture bytes per shuffle partition beyond one per core: a partition of the analyses holds
rows of about this much capture (the decode's default split size too)."""


def default_config(local: bool = True) -> dict[str, str]:
    """Settings that suit analysis of captures; each applies only when not already set.

    ``local``: the master is ``local[...]``, so the workers run where this package is
    installed and may use :data:`DAEMON_MODULE` (unless it came from a zip).  The shuffle
    partitions are not here: :func:`register` sizes them (see the module docstring)."""
    daemon = {"spark.python.daemon.module": DAEMON_MODULE} if local and _on_disk() else {}
    return {
        **daemon,
        # Arrow for toPandas/createDataFrame, the same columnar path the data source uses
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # timestamps derived from ts_ns print the same on every machine
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.showConsoleProgress": "false",
    }


def get_spark(app_name: str = "ump-analysis", master: str | None = None,
              config: Mapping[str, str] | None = None, log_level: str = "WARN",
              quiet: bool = True) -> SparkSession:
    """The active session, or a new one (see the module docstring for what wins), readied by
    :func:`register`.

    Args:
        app_name: shown in the Spark UI and logs (ignored when a session already exists).
        master: force a master (``"local[2]"``, ``"spark://host:7077"``); by default the one
            spark-submit or ``spark-defaults.conf`` gives, else ``local[*]``.
        config: extra settings; they override :func:`default_config`, and under spark-submit
            they too give way to what its command line set.
        log_level: Spark's log level once started.
        quiet: hold back the JVM's start-up banner (shown only if the start fails).
    """
    active = SparkSession.getActiveSession()
    if active is not None:
        register(active)
        return active
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
    options = {"spark.app.name": app_name, **({"spark.master": master} if master else {}),
               **settings}
    python = worker_python(chosen)
    if python is not None:
        os.environ["PYSPARK_PYTHON"] = python
    if existing is None and not os.environ.get("SPARK_HOME"):
        # else Spark's launcher script asks the first python3 on PATH where Spark is
        from pyspark.find_spark_home import _find_spark_home

        os.environ["SPARK_HOME"] = _find_spark_home()
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    banner = None
    if quiet and existing is None and SparkContext._gateway is None:
        banner = _QuietLaunch(options)
    try:
        spark = builder.getOrCreate()
    except BaseException:
        if banner is not None:
            banner.failed()
        raise
    if banner is not None:
        banner.started()
    spark.sparkContext.setLogLevel(log_level)
    register(spark)
    return spark


def register(spark: SparkSession) -> None:
    """Ready ``spark`` for ``spark.read.format("pcap")`` and the decode on any master: ship
    the project, size the shuffle partitions, register the data source (the module docstring
    says why and in which order).  Calling it again is harmless."""
    ship_project(spark)
    size_shuffle_partitions(spark)
    spark.dataSource.register(PcapDataSource)


# =============================================================================================
# Shuffle partitions
# =============================================================================================


def shuffle_partitions(input_bytes: int, cores: int) -> int:
    """One partition per :data:`SHUFFLE_PARTITION_BYTES` of input and at least one per core,
    rounded up to whole waves of the cores (a partial last wave leaves cores idle)."""
    cores = max(1, cores)
    wanted = max(1, math.ceil(max(0, input_bytes) / SHUFFLE_PARTITION_BYTES))
    return cores * math.ceil(wanted / cores)


def size_shuffle_partitions(spark: SparkSession, input_bytes: int = 0) -> int:
    """Set ``spark.sql.shuffle.partitions`` to :func:`shuffle_partitions` of ``input_bytes``
    and the session's cores, unless the user chose a count (at launch, or at run time anything
    but Spark's default); returns the count in effect."""
    conf = spark.conf
    current = str(conf.get(SHUFFLE_PARTITIONS, SPARK_DEFAULT_SHUFFLE_PARTITIONS))
    ours = conf.get(AUTO_SHUFFLE_MARK, None)
    chosen_by_user = (spark.sparkContext.getConf().contains(SHUFFLE_PARTITIONS)
                      or current not in (SPARK_DEFAULT_SHUFFLE_PARTITIONS, ours))
    if chosen_by_user:
        return int(current)
    count = shuffle_partitions(input_bytes, spark.sparkContext.defaultParallelism)
    conf.set(SHUFFLE_PARTITIONS, str(count))
    conf.set(AUTO_SHUFFLE_MARK, str(count))
    return count


# =============================================================================================
# Shipping the project to executors
# =============================================================================================


_ZIP: dict[str, str] = {}
"""The zip of this process (:func:`project_zip`), built once."""


def _package_dir(name: str) -> Path:
    module = sys.modules.get(name) or __import__(name)
    return Path(module.__file__ or "").parent


def _on_disk() -> bool:
    """This package is a directory of files (not inside a zip on the path)."""
    return Path(__file__).parent.is_dir()


def write_project_zip(target: str | os.PathLike[str]) -> str:
    """Write the zip of :data:`SHIPPED_PACKAGES` (their ``.py`` files, at the zip's root, in
    a fixed order with fixed times: the same sources give the same bytes) to ``target``."""
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as archive:
        for package in SHIPPED_PACKAGES:
            root = _package_dir(package)
            for source in sorted(root.rglob("*.py")):
                if "__pycache__" in source.parts:
                    continue
                name = f"{package}/{source.relative_to(root).as_posix()}"
                info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                archive.writestr(info, source.read_bytes())
    return str(target)


def project_zip() -> str:
    """This process's zip of the project, in a temporary directory removed at exit.  Its name
    carries a digest of its bytes: Spark refuses a second file of the same name."""
    if "path" not in _ZIP:
        directory = tempfile.mkdtemp(prefix="ump-ship-")
        atexit.register(shutil.rmtree, directory, True)
        draft = write_project_zip(os.path.join(directory, "draft.zip"))
        digest = hashlib.sha256(Path(draft).read_bytes()).hexdigest()[:12]
        final = os.path.join(directory, f"ump-{digest}.zip")
        os.replace(draft, final)
        _ZIP["path"] = final
    return _ZIP["path"]


def ship_project(spark: SparkSession) -> str | None:
    """Add :func:`project_zip` to ``spark``'s Python files unless the master is local, the
    package came from a zip, or this context has it already; returns the zip's path if
    shipped now."""
    sc = spark.sparkContext
    if _is_local(sc.master or "local") or not _on_disk():
        return None
    path = project_zip()
    if os.path.basename(path) in (sc._python_includes or []):
        return None
    sc.addPyFile(path)
    return path


# =============================================================================================
# The workers' interpreter
# =============================================================================================


def worker_python(master: str) -> str | None:
    """The interpreter Spark's Python workers should run: this one (``sys.executable``) on a
    local master or a ``spark://`` master on this host, when ``PYSPARK_PYTHON`` is unset;
    else None (Spark's own rule)."""
    if os.environ.get("PYSPARK_PYTHON") or not sys.executable:
        return None
    if _is_local(master) or (master.startswith("spark://") and all(
            _is_this_host(host) for host in _master_hosts(master))):
        return sys.executable
    return None


_LOCAL_MASTER = re.compile(r"local(\[(\*|[1-9]\d*)(,[1-9]\d*)?\])?$"
                           r"|local-cluster\[[1-9]\d*,[1-9]\d*,[1-9]\d*\]$")
_OTHER_MASTER = re.compile(r"yarn$|k8s://\S+$")
MASTER_TIMEOUT = 5.0
"""Seconds a ``spark://`` master has to accept a connection before ``ump analyze`` starts."""


def master_problem(master: str, timeout: float = MASTER_TIMEOUT) -> str | None:
    """What is wrong with Spark master URL ``master``, in one line, or None: not one of
    Spark's forms (``local``, ``local[N]``, ``local[*]``, ``local[N,F]``,
    ``local-cluster[N,C,M]``, ``spark://HOST:PORT[,HOST:PORT...]``, ``yarn``, ``k8s://...``),
    or a ``spark://`` master none of whose addresses accepts a TCP connection.  Asked
    before Spark starts: Spark itself retries an unreachable master for a minute and prints
    Java stack traces, then fails with a message that does not name it."""
    master = master.strip()
    if _LOCAL_MASTER.match(master) or _OTHER_MASTER.match(master):
        return None
    if not master.startswith("spark://"):
        return (f"{master!r} is not a Spark master URL (local[N], spark://HOST:PORT, yarn, "
                f"k8s://...)")
    addresses = []
    for entry in master[len("spark://"):].split(","):
        host, _, port = entry.strip().rpartition(":")
        host = host.strip("[]")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            return f"{master!r}: each master address must be HOST:PORT, got {entry.strip()!r}"
        addresses.append((host, int(port)))
    reasons = []
    for address in addresses:
        try:
            with socket.create_connection(address, timeout=timeout):
                return None
        except OSError as exc:
            reasons.append(f"{address[0]}:{address[1]}: {exc.strerror or exc}")
    return (f"cannot reach the Spark master {master} ({'; '.join(reasons)}): is it started "
            f"(start-master.sh), and is the address the one its log prints?")


def _master_hosts(master: str) -> list[str]:
    """Hosts of ``spark://h1:p1,h2:p2`` (standby masters included)."""
    hosts = []
    for entry in master[len("spark://"):].split(","):
        entry = entry.strip()
        if entry.startswith("["):  # [ipv6]:port
            hosts.append(entry[1:entry.find("]")])
        else:
            hosts.append(entry.rsplit(":", 1)[0] if ":" in entry else entry)
    return [h for h in hosts if h]


def _is_this_host(host: str) -> bool:
    """``host`` names this machine: a loopback address, or one a socket can bind here."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    for family, _, _, _, address in infos:
        ip = str(address[0])
        if ipaddress.ip_address(ip.split("%", 1)[0]).is_loopback:
            continue
        with contextlib.closing(socket.socket(family, socket.SOCK_STREAM)) as probe:
            try:
                probe.bind((ip, 0))
            except OSError:
                return False
    return bool(infos)


# =============================================================================================
# Quiet start
# =============================================================================================


class _QuietLaunch:
    """Launches the JVM with its stderr on a pipe read by a thread (module docstring).

    The pipe is ours and its reader runs before the JVM starts: a JVM that printed more than
    a pipe holds before it is up would otherwise block."""

    HELD_LINES = 400
    """Lines of start-up output held back (the last ones are kept)."""

    def __init__(self, options: Mapping[str, str]) -> None:
        from pyspark.java_gateway import launch_gateway

        self._held: collections.deque[bytes] = collections.deque(maxlen=self.HELD_LINES)
        self._lock = threading.Lock()
        self._holding = True
        read_fd, write_fd = os.pipe()
        self._thread = threading.Thread(target=self._pump, args=(os.fdopen(read_fd, "rb"),),
                                        name="spark-stderr", daemon=True)
        self._thread.start()
        conf = SparkConf(loadDefaults=False)
        for key, value in options.items():
            conf.set(key, value)
        try:
            gateway = launch_gateway(conf, popen_kwargs={"stderr": write_fd})
        except BaseException:
            os.close(write_fd)
            self.failed()
            raise
        os.close(write_fd)  # the JVM holds the other copy: its exit ends the pump
        SparkContext._ensure_initialized(gateway=gateway)

    def _pump(self, stream: IO[bytes]) -> None:
        with stream:
            for line in iter(stream.readline, b""):
                with self._lock:
                    if self._holding:
                        self._held.append(line)
                        continue
                _write_stderr(line)

    def started(self) -> None:
        """The session is up: drop the held banner, pass on whatever comes next."""
        with self._lock:
            self._holding = False
            self._held.clear()

    def failed(self) -> None:
        """The start failed: print the held lines (they say why), after what a JVM that
        exited still had in the pipe."""
        self._thread.join(timeout=2.0)
        with self._lock:
            self._holding = False
            lines = list(self._held)
            self._held.clear()
        for line in lines:
            _write_stderr(line)


def _write_stderr(line: bytes) -> None:
    with contextlib.suppress(OSError, ValueError):
        stream = sys.stderr
        stream.write(line.decode("utf-8", "replace"))
        stream.flush()


# =============================================================================================
# Masters
# =============================================================================================


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


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spark_analysis.session --zip ump.zip``: the project zip for
    ``spark-submit --py-files``."""
    parser = argparse.ArgumentParser(
        prog="python -m spark_analysis.session",
        description="Write the zip of the packages Spark executors import "
                    f"({', '.join(SHIPPED_PACKAGES)}) for spark-submit --py-files.")
    parser.add_argument("--zip", required=True, metavar="PATH", help="zip file to write")
    args = parser.parse_args(argv)
    try:
        print(write_project_zip(args.zip))
    except OSError as exc:
        print(f"{parser.prog}: {args.zip}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
