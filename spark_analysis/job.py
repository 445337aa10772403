"""The ``ump analyze`` job: captures in; Parquet tables, a JSON summary and an HTML report out.

The same code runs in three ways:

* ``ump analyze CAPTURE... --out DIR --store-port 14567`` (Spark in-process, ``local[*]``
  unless ``--master`` says otherwise; on a ``spark://`` master the project is shipped to the
  executors by :func:`spark_analysis.session.register`, nothing to install there but the
  third-party packages);
* ``python -m spark_analysis.job CAPTURE... --out DIR ...`` (the same, without the ``ump``
  front end);
* under ``spark-submit``, unchanged; the master (and everything else Spark is told) comes
  from spark-submit::

      python -m spark_analysis.session --zip ump.zip
      spark-submit --master spark://head:7077 --py-files ump.zip \\
          --conf spark.log.level=WARN \\
          spark_analysis/job.py 'hdfs:///caps/*.pcap' --out hdfs:///ump/results \\
          --store-port 14567

  Executors import the ``spark_analysis`` and ``wire`` packages: install the project on every
  node (``pip install .[spark]``) or ship it with ``--py-files`` (the zip the first command
  writes: ``wire/`` and ``spark_analysis/`` at its root).  ``spark.log.level`` applies as the
  SparkContext starts: of its forty-odd INFO lines the first three remain.  Locally
  ``spark-submit --master 'local[*]' spark_analysis/job.py ...`` works as it is.

``--out`` may be a local directory or any URI pyarrow understands (``hdfs://``, ``s3://``).
It receives ``decoded/<table>/`` (the decoded ``packets``, ``messages``, ``advertisements``
and ``skipped`` counts of :func:`spark_analysis.decode.decode_to_parquet`, which the analyses
read back), ``parquet/<analysis>/`` for every result of :mod:`spark_analysis.engine` (one
Spark task per capture, :mod:`spark_analysis.engine_job`; written sorted, so reruns are
byte-for-byte comparable), ``summary.json`` (every summary
table per capture plus the row count of every detail table: what the corpus tests compare)
and ``report.html`` (:mod:`spark_analysis.report`).

Errors a user can fix (no such file, not a capture, an output path that is a file, Java or
pyspark missing) end the run with one line on stderr and exit status 2; nothing else is
printed unless ``--debug``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import posixpath
import shutil
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from wire.cli import add_port_options, port_map

if TYPE_CHECKING:
    import pandas as pd

PROG = "ump analyze"
SUMMARY_FORMAT = 1
JSON_ROW_LIMIT = 1000
"""Rows of one table per capture in ``summary.json`` (the rest is in Parquet)."""
JSON_DETAIL_TABLES = ("registrations", "anomalies")
"""Detail tables whose rows (up to the limit) the summary carries; the others only count."""
JSON_COUNT_ONLY = ("flight_size",)
"""Summary tables the summary only counts (a plot series: bins x source topics)."""
REPORT_ROW_LIMIT = 5000
"""Rows of one table read back for the report (tables show fewer; plots use these)."""


class AnalyzeError(Exception):
    """A problem the user can fix; its message is the whole story (no traceback)."""


# =============================================================================================
# Command line
# =============================================================================================


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``ump analyze`` (shared by ``spark_analysis.cli`` and :func:`main`)."""
    parser.add_argument("captures", nargs="+", metavar="CAPTURE",
                        help="pcap/pcapng files, directories (their capture files) or globs "
                             "(local paths or URIs such as hdfs://..., s3://...)")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="output directory (created; existing results are replaced)")
    add_port_options(parser)
    parser.add_argument("--no-content-heuristics", action="store_true",
                        help="decode by port rules only (no UM detection by content)")
    parser.add_argument("--master", metavar="URL",
                        help="Spark master (default local[*]; under spark-submit, its own)")
    parser.add_argument("--spark", action="store_true",
                        help="run in Spark even a capture small enough to decode and analyse "
                             "in this process (at most 4 MiB: no Spark start, seconds faster)")
    parser.add_argument("--per-file", action="store_true",
                        help="analyse each file as a separate capture (default: all files "
                             "are one capture, e.g. the pieces of a rotated capture)")
    parser.add_argument("--stability", choices=("quorum", "all", "any"), default="quorum",
                        help="when a message stops being in flight: stability ACKs from a "
                             "majority of the source's stores (default), all of them, or any")
    parser.add_argument("--flight-bins", type=_positive, default=200, metavar="N",
                        help="time bins of the flight-size series (default 200)")
    parser.add_argument("--frames-per-part", type=_count, metavar="N",
                        help="analyse a capture of more UM frames in parts of about N, one "
                             "after the other: the same results in less memory (0: every "
                             "capture whole; default: whole when it fits in half the "
                             "memory available, else in parts that do)")
    parser.add_argument("--split-size", type=_positive, metavar="MIB",
                        help="MiB of capture per Spark task (default 64)")
    parser.add_argument("--report-rows", type=_positive, default=50, metavar="N",
                        help="rows shown per table in report.html (default 50)")
    parser.add_argument("--quiet", action="store_true", help="no progress messages")
    parser.add_argument("--verbose", action="store_true",
                        help="show Spark's start-up messages and its warnings (held back by "
                             "default)")
    parser.add_argument("--debug", action="store_true",
                        help="show Spark's log and full tracebacks (implies --verbose)")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _count(text: str) -> int:
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m spark_analysis.job`` / ``spark-submit spark_analysis/job.py``."""
    parser = argparse.ArgumentParser(prog="spark_analysis.job", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run_command(parser.parse_args(argv))


def run_command(args: argparse.Namespace) -> int:
    """Run with the parsed options; user errors become one line on stderr and status 2."""
    log = Progress(quiet=args.quiet)
    try:
        result = run(args, log)
    except AnalyzeError as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        if args.debug:
            raise
        print(f"{PROG}: {_one_line(exc)} (--debug shows the details)", file=sys.stderr)
        return 1
    if result.damaged:
        # the results are written, but they do not cover the whole capture: not a success
        print(f"{PROG}: {len(result.damaged)} damaged piece(s) of capture not read (see the "
              f"warnings above): the results cover the rest", file=sys.stderr)
        return 1
    return 0


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    first = text[0] if text else type(exc).__name__
    return first[:300]


_PRINT_LOCK = threading.Lock()


@dataclass
class Progress:
    """Progress lines on stderr (``ump analyze: ...`` with the elapsed time): one per step and
    per analysis; on a terminal the decode also gets a bar with percentage and ETA
    (:mod:`spark_analysis.progress`).  ``--quiet``: nothing."""

    quiet: bool = False
    started: float = field(default_factory=time.monotonic)
    stream: TextIO | None = None
    """Where to write (default: ``sys.stderr`` at the time of writing)."""
    tty: bool | None = None
    """Draw bars (default: when the stream is a terminal)."""

    def _out(self) -> TextIO:
        return self.stream if self.stream is not None else sys.stderr

    def _prefix(self, message: str) -> str:
        return f"{PROG}: [{time.monotonic() - self.started:6.1f}s] {message}"

    def __call__(self, message: str) -> None:
        if not self.quiet:
            # one write of the whole line under a lock: the analysis steps report from several
            # threads, and print() writes the text and its newline apart (two steps' lines
            # then ran together, "stability ACKsump analyze: ...")
            with _PRINT_LOCK:
                out = self._out()
                out.write(self._prefix(message) + "\n")
                out.flush()

    def bar(self, message: str, spark: Any = None,
            counter: Callable[[], tuple[float, int]] | None = None,
            ) -> contextlib.AbstractContextManager[Any]:
        """A block of Spark work (or of tasks ``counter`` counts): a bar of its tasks on a
        terminal, else the plain line."""
        out = self._out()
        tty = self.tty if self.tty is not None else bool(getattr(out, "isatty", bool)())
        if self.quiet or not tty or (spark is None and counter is None):
            self(message)
            return contextlib.nullcontext()
        from spark_analysis.progress import TaskBar, spark_task_counter

        return TaskBar(self._prefix(message),
                       counter if counter is not None else spark_task_counter(spark.sparkContext),
                       stream=out)


# =============================================================================================
# The run
# =============================================================================================


@dataclass
class RunResult:
    """What a run produced (for callers and tests)."""

    out: str
    files: list[str]
    summary: dict[str, Any]
    tables: dict[str, pd.DataFrame]
    row_counts: dict[str, int]
    seconds: float
    damaged: list[str] = field(default_factory=list)
    """Where a capture file is damaged and what of it was not read (the results cover the
    rest; the run's exit status is then 1)."""


def check_captures(captures: Sequence[str]) -> list[str]:
    """Expand paths and globs and read every file's header on the driver: a missing,
    unreadable or non-capture file is reported here, by name, before Spark starts."""
    from spark_analysis.capture_files import CaptureError, expand_paths, open_capture

    skipped: list[str] = []
    try:
        refs = expand_paths(list(captures), skipped)
        for ref in refs:
            open_capture(ref)
    except CaptureError as exc:
        raise AnalyzeError(str(exc)) from None
    except OSError as exc:
        raise AnalyzeError(f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": ")) from None
    names = [ref.name for ref in refs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise AnalyzeError(f"{duplicates[0]}: given more than once")
    if skipped:
        shown = ", ".join(posixpath.basename(name) for name in skipped[:5])
        more = f" and {len(skipped) - 5} more" if len(skipped) > 5 else ""
        print(f"{PROG}: passing over {len(skipped)} file(s) in the directories given that are "
              f"not captures: {shown}{more}", file=sys.stderr, flush=True)
    return names


def _need_spark() -> None:
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise AnalyzeError("pyspark is not installed: pip install 'ump-harness[spark]'") from None
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")
            or "PYSPARK_GATEWAY_PORT" in os.environ):
        raise AnalyzeError("Spark needs a Java runtime (17 or later) on PATH or in JAVA_HOME")


def run(args: argparse.Namespace, log: Callable[[str], None] = print) -> RunResult:
    """The whole job: check, decode, analyse, write Parquet, summary.json and report.html."""
    started = time.monotonic()
    _need_spark()
    if args.master is not None:
        from spark_analysis.session import master_problem

        problem = master_problem(args.master)
        if problem is not None:
            raise AnalyzeError(problem)
    files = check_captures(args.captures)
    out = OutputDir(args.out)
    log(f"{len(files)} capture file(s); results in {args.out}")

    from spark_analysis.columnar import DecodeOptions
    from spark_analysis.engine.inputs import natural_order
    from spark_analysis.engine.options import AnalysisOptions
    from spark_analysis.engine.run import DETAIL_OUTPUTS, OUTPUTS
    from spark_analysis.engine_job import analyze_captures
    from spark_analysis.session import get_spark, size_shuffle_partitions

    options = AnalysisOptions(stability_rule=args.stability, flight_bins=args.flight_bins,
                              frames_per_part=args.frames_per_part)
    decode_options = DecodeOptions(ports=port_map(args),
                                   content_heuristics=not args.no_content_heuristics)
    capture_bytes = _capture_bytes(args.captures)
    verbose = bool(args.debug or getattr(args, "verbose", False))

    def start_spark() -> Any:
        # the JVM only schedules: the decode and the analyses run in Python processes, and
        # no table passes through the JVM's heap, whatever the capture's size
        spark = get_spark(app_name="ump-analyze", master=args.master, config=SMALL_CAPTURE_JVM,
                          log_level="WARN" if verbose else "ERROR", quiet=not verbose)
        size_shuffle_partitions(spark, capture_bytes)
        return spark

    split_size = args.split_size << 20 if args.split_size else None
    spark: Any = None
    if _in_process(args, capture_bytes):
        # Spark's start (a JVM, 4-5 s) would be most of the run: this process decodes and
        # analyses a small capture itself, with the same code a Spark task runs
        log(f"a small capture ({capture_bytes / 2**20:.1f} MiB): decoding and analysing in "
            f"this process, without Spark (--spark: in Spark)")
        log("decoding")
        stored = _decode_locally(natural_order(files), args.per_file, decode_options,
                                 split_size, out, None)
    elif _decode_while_starting(args.master):
        # the decode needs no JVM: local processes decode while Spark starts (a thread)
        log("starting Spark")
        with _decode_pool(capture_bytes) as pool, \
                ThreadPoolExecutor(1, thread_name_prefix="ump-spark-start") as starter:
            starting = starter.submit(start_spark)
            try:
                # no pool: the driver decodes, one step the bar shows at 0% until it is done
                counter = pool.counter if pool is not None else _no_tasks
                if isinstance(log, Progress):
                    decoding = log.bar("decoding", counter=counter)
                else:
                    log("decoding")
                    decoding = contextlib.nullcontext()
                with decoding:
                    stored = _decode_locally(natural_order(files), args.per_file,
                                             decode_options, split_size, out, pool)
            finally:
                spark = starting.result()
    else:
        log("starting Spark")
        spark = start_spark()
        if isinstance(log, Progress):
            decoding = log.bar("decoding", spark)
        else:
            log("decoding")
            decoding = contextlib.nullcontext()
        with decoding:
            stored = _decode(spark, natural_order(files), args.per_file, decode_options,
                             split_size, out)
    log(f"  decoded {stored.frames} frames into {out.uri(DECODED)}")
    for line in (*stored.damaged, *stored.truncated):   # (said with --quiet too)
        print(f"{PROG}: warning: {line}", file=sys.stderr, flush=True)
    if not stored.rows.get("packets", 0):
        print(f"{PROG}: warning: no frame of {stored.frames:,} decodes as UM: if UM runs on "
              f"ports outside the defaults, give them (--store-port, --lbttcp-port, "
              f"--lbtrm-port, --lbtru-port, --lbmr-port; the report lists why each frame is "
              f"not UM)", file=sys.stderr, flush=True)
    if spark is not None:
        spark.sparkContext.setJobDescription("analyses")
    # no result of an earlier run stays next to this run's (nor after it failed)
    out.reset("parquet")
    out.remove("summary.json", "report.html")
    analysing = log.bar("analysing", spark) if isinstance(log, Progress) \
        else contextlib.nullcontext()
    if not verbose and spark is not None:
        # a failed task is said in one line (AnalysisFailed), not by Spark's stack traces
        spark.sparkContext.setLogLevel("FATAL")
    try:
        with analysing:
            counts = analyze_captures(spark, out.uri(DECODED), files, args.per_file, options,
                                      out.location if "://" in out.location else out.path,
                                      log)
    except BaseException:
        out.reset("parquet")   # no half-written results (the decoded tables are whole)
        raise
    finally:
        if not verbose and spark is not None:
            spark.sparkContext.setLogLevel("ERROR")
    skipped = _skipped(out)
    tables_read = {name: out.read(name, REPORT_ROW_LIMIT if name in DETAIL_OUTPUTS else None)
                   for name in OUTPUTS}
    summary = build_summary(files, args, out, list(OUTPUTS), DETAIL_OUTPUTS, skipped)
    summary["capture_problems"] = {"damaged": list(stored.damaged),
                                   "cut_short": list(stored.truncated)}
    out.write_text("summary.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
    from spark_analysis.report import ReportInput, render

    report = render(ReportInput(files=files, options=summary["options"], tables=tables_read,
                                row_counts=counts, skipped=skipped, row_limit=args.report_rows,
                                problems=[*stored.damaged, *stored.truncated]))
    out.write_text("report.html", report)
    seconds = time.monotonic() - started
    log(f"done in {seconds:.1f}s: {args.out}/report.html")
    return RunResult(args.out, files, summary, tables_read, counts, seconds,
                     list(stored.damaged))


DRIVER_DECODE_BYTES = 4 << 20
"""Captures up to this size (about 30,000 frames) are decoded in the driver process
(``decode_to_parquet(driver_bytes=...)``): under a second of decoding, against seconds of
Python worker start and two Spark jobs."""

SMALL_CAPTURE_BYTES = 32 << 20
"""Captures of at most this many bytes in all are judged by ``ump conform --capture
--decode spark`` (:mod:`conformance.passive.spark_tables`) with Spark started with
:data:`SMALL_CAPTURE_JVM`; larger ones get :func:`launch_config`."""

SMALL_CAPTURE_JVM = {
    # the JVM's optimising compiler (C2) spends tens of CPU-seconds on a run that lasts
    # seconds; the quick tier alone halves the JVM's CPU on planted.pcap
    "spark.driver.extraJavaOptions": "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    "spark.ui.enabled": "false",
}
"""Launch settings of the JVM when ``ump analyze`` starts Spark, for every capture (ignored
when a session exists already, e.g. under spark-submit, which has launched its JVM): the JVM
there schedules tasks and holds no table.  ``ump conform --capture --decode spark`` uses them
for captures up to :data:`SMALL_CAPTURE_BYTES` (its judges' tables pass through the JVM), and
:func:`launch_config` above that."""


QUICK_TIER_BYTES = 512 << 20
"""Captures up to this many bytes in all run Spark's JVM with the quick compiler tier alone
(:func:`launch_config`, used by ``ump conform --capture --decode spark``).  The optimising
compiler (C2) cost 41-50 CPU-seconds of a 1,000,000
frame run (142 MB of capture) that spent about 48 in its tasks: more than it saved.  The
bound is where the task work, about ten times larger at 10,000,000 frames, pays back the
compiler (a join over the decoded 10,000,000-frame tables took 22 s with the quick tier alone
against 9 s)."""

DRIVER_MEMORY_MIN = 2 << 30
DRIVER_MEMORY_PER_CAPTURE_BYTE = 3
"""Driver heap per byte of capture (local mode: the driver is the executor, its heap holds the
checkpointed intermediate tables).  With Spark's default 1 GiB the 1,000,000-frame run spilled
its checkpoints to disk and the 10,000,000-frame run failed at a ``localCheckpoint``."""
DRIVER_MEMORY_SHARE = 0.5
"""At most this share of the machine's memory for the driver heap."""


def launch_config(capture_bytes: int) -> dict[str, str]:
    """Launch settings for a capture of ``capture_bytes`` that is not small: a driver heap
    sized from the capture (:data:`DRIVER_MEMORY_PER_CAPTURE_BYTE`, at least
    :data:`DRIVER_MEMORY_MIN`, at most :data:`DRIVER_MEMORY_SHARE` of the machine), the
    throughput collector (the G1 collector's concurrent threads cost about 15 CPU-seconds of
    the 1,000,000-frame run; a batch job does not care about pauses) and, up to
    :data:`QUICK_TIER_BYTES`, the quick compiler tier alone.  Ignored when Spark runs already
    (spark-submit), like every launch setting."""
    try:
        machine = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        machine = 4 * DRIVER_MEMORY_MIN
    heap = max(DRIVER_MEMORY_MIN, DRIVER_MEMORY_PER_CAPTURE_BYTE * capture_bytes)
    heap = min(heap, max(DRIVER_MEMORY_MIN // 2, int(machine * DRIVER_MEMORY_SHARE)))
    java = ["-XX:+UseParallelGC"]
    if capture_bytes <= QUICK_TIER_BYTES:
        # the quick tier alone gets the JVM's small default code cache (48 MiB), which the
        # generated code of the analyses filled at 1,000,000 frames: the JIT then stops and
        # everything after runs interpreted
        java[:0] = ["-XX:TieredStopAtLevel=1", "-XX:ReservedCodeCacheSize=256m"]
    return {"spark.driver.memory": f"{heap >> 20}m",
            "spark.driver.extraJavaOptions": " ".join(java)}


def _capture_bytes(captures: Sequence[str]) -> int:
    """Total size of the capture files (already checked by :func:`check_captures`)."""
    from spark_analysis.capture_files import expand_paths

    return sum(ref.filesystem.get_file_info(ref.path).size or 0
               for ref in expand_paths(list(captures)))


DECODED = "decoded"
"""The subdirectory of ``--out`` that receives the decoded tables (``packets/``,
``messages/``, ``advertisements/``, ``skipped/``: :func:`spark_analysis.decode.decode_to_parquet`),
which the analyses read back and users may query themselves."""


IN_PROCESS_BYTES = DRIVER_DECODE_BYTES
"""Captures of at most this many bytes in all (those the driver decodes itself) are decoded
and analysed in this process, without Spark, unless ``--master`` or ``--spark`` asks for it
(:func:`_in_process`)."""


def _in_process(args: argparse.Namespace, capture_bytes: int) -> bool:
    """Whether this run decodes and analyses in this process, with no Spark session: captures
    of at most :data:`IN_PROCESS_BYTES` on this machine's disk, written to it, with no master
    asked for (``--master``, spark-submit's, a session already running) and no ``--spark``.

    Why: on a capture that small, starting Spark (its JVM and Python workers: 4-5 s on the
    2-core machine) was most of the run, 7.6 s in all for 4,693 frames where tshark takes
    0.3 s.  The decode already ran in this process for such captures while Spark started;
    the analyses are the same function a Spark task runs (:func:`spark_analysis.engine_job.
    analyze_captures` without a session)."""
    if args.spark or args.master is not None or capture_bytes > IN_PROCESS_BYTES:
        return False
    if "://" in args.out and not args.out.startswith("file://"):
        return False
    if any("://" in c and not c.startswith("file://") for c in args.captures):
        return False
    from spark_analysis.session import _under_spark_submit

    if _under_spark_submit():
        return False
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession() is None


def _decode_while_starting(master: str | None) -> bool:
    """Whether the decode runs in local processes while Spark starts: on a local master
    launched by this process (not under spark-submit, whose JVM is up already; not on a
    cluster, whose executors may be the only ones that reach the captures)."""
    from spark_analysis.session import _is_local, _launch_master, _under_spark_submit

    if _under_spark_submit():
        return False
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        return False
    return _is_local(master or _launch_master())


def _no_tasks() -> tuple[float, int]:
    """A task counter for the driver's own decode: no tasks to count."""
    return 0.0, 0


class _DecodePool(ProcessPoolExecutor):
    """A process pool that counts its calls for the decode's progress bar."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.submitted = 0
        self.done = 0

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        future = super().submit(fn, *args, **kwargs)
        self.submitted += 1
        future.add_done_callback(self._one_done)
        return future

    def _one_done(self, _future: Any) -> None:
        self.done += 1

    def counter(self) -> tuple[float, int]:
        """(calls done, calls submitted): a :data:`spark_analysis.progress.TaskCounter`."""
        return float(self.done), self.submitted


@contextlib.contextmanager
def _decode_pool(capture_bytes: int) -> Iterator[_DecodePool | None]:
    """Local decode processes, one per core, for a capture of more than
    :data:`DRIVER_DECODE_BYTES` (None: the driver decodes a smaller one itself).

    They are forked, and all of them before this returns: a forked child copies the driver
    with its modules imported (spawned ones imported pyarrow, numpy and PySpark again, about
    four CPU-seconds each), and forking must happen before the thread that starts Spark runs
    (a fork copies only the forking thread, and any lock another thread holds stays held)."""
    if capture_bytes <= DRIVER_DECODE_BYTES:
        yield None
        return
    import multiprocessing

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    pool = _DecodePool(os.cpu_count() or 1, mp_context=multiprocessing.get_context(method))
    try:
        ProcessPoolExecutor.submit(pool, os.getpid).result()  # forks every process now
        yield pool
    finally:
        pool.shutdown(cancel_futures=True)


def _decode_locally(files: Sequence[str], per_file: bool, options: Any,
                    split_size: int | None, out: OutputDir,
                    pool: ProcessPoolExecutor | None) -> Any:
    """:func:`spark_analysis.decode.decode_to_parquet` in ``pool`` (:func:`_decode_pool`)
    or, without one, in this process."""
    import dataclasses

    from spark_analysis.capture_files import CaptureError
    from spark_analysis.decode import decode_to_parquet

    options = dataclasses.replace(options, separate_files=per_file)
    try:
        return decode_to_parquet(None, list(files), out.uri(DECODED), options,
                                 split_size=split_size, overwrite=True, on_truncated="quiet",
                                 driver_bytes=DRIVER_DECODE_BYTES, processes=pool)
    except (CaptureError, FileExistsError) as exc:
        raise AnalyzeError(str(exc)) from None


def _decode(spark: Any, files: Sequence[str], per_file: bool, options: Any,
            split_size: int | None, out: OutputDir) -> Any:
    """Decode the captures to Parquet under ``OUT/decoded/`` in one Spark decode (the
    analyses read them from there).

    All files are one capture (TCP streams continue from one file to the next), or with
    ``per_file`` each is its own (``DecodeOptions.separate_files``: separate captures may reuse
    the same TCP 4-tuples, whose segments must not be reassembled together)."""
    import dataclasses

    from spark_analysis.capture_files import CaptureError
    from spark_analysis.decode import decode_to_parquet

    options = dataclasses.replace(options, separate_files=per_file)
    try:
        tables = decode_to_parquet(spark, list(files), out.uri(DECODED), options,
                                   split_size=split_size, overwrite=True, on_truncated="quiet",
                                   driver_bytes=DRIVER_DECODE_BYTES)
    except (CaptureError, FileExistsError) as exc:
        raise AnalyzeError(str(exc)) from None
    return tables


def _skipped(out: OutputDir) -> pd.DataFrame:
    """The decode's counts of frames that are not UM, by file and reason (a handful of rows,
    read on the driver)."""
    import pyarrow.dataset as ds

    return ds.dataset(f"{out.path}/{DECODED}/skipped", format="parquet",
                      filesystem=out.fs).to_table().to_pandas()


# =============================================================================================
# Output directory (local or any pyarrow filesystem)
# =============================================================================================


class OutputDir:
    """Where results go: a local directory, or a URI of a pyarrow filesystem."""

    def __init__(self, location: str) -> None:
        import pyarrow.fs as pafs

        self.location = location.rstrip("/") or "/"
        try:
            if "://" in location:
                self.fs, self.path = pafs.FileSystem.from_uri(location)
            else:
                self.fs, self.path = pafs.LocalFileSystem(), str(Path(location).absolute())
            info = self.fs.get_file_info(self.path)
            if info.type == pafs.FileType.File:
                raise AnalyzeError(f"{location}: exists and is not a directory")
            self.fs.create_dir(self.path, recursive=True)
            probe = f"{self.path}/.ump-analyze-write-test"
            with self.fs.open_output_stream(probe):
                pass
            self.fs.delete_file(probe)
        except AnalyzeError:
            raise
        except Exception as exc:
            raise AnalyzeError(f"{location}: cannot write there ({_one_line(exc)})") from None

    def uri(self, relative: str) -> str:
        if "://" in self.location:
            return f"{self.location}/{relative}"
        return str(Path(self.path) / relative)

    def _dataset(self, name: str) -> Any:
        import pyarrow.dataset as ds

        return ds.dataset(f"{self.path}/parquet/{name}", format="parquet", filesystem=self.fs)

    def count(self, name: str) -> int:
        return int(self._dataset(name).count_rows())

    def counts_by_capture(self, name: str) -> dict[str, int]:
        import pyarrow.compute as pc

        column = self._dataset(name).to_table(columns=["capture"]).column("capture")
        return {str(item["values"]): int(item["counts"])
                for item in pc.value_counts(column).to_pylist()}

    def read(self, name: str, limit: int | None, capture: str | None = None) -> pd.DataFrame:
        """The first ``limit`` rows (all: None) of a written table, optionally of one capture
        (files are in sort order, so these are the first rows in that order)."""
        import pyarrow.dataset as ds

        dataset = self._dataset(name)
        where = ds.field("capture") == capture if capture is not None else None
        if limit is None:
            return dataset.to_table(filter=where).to_pandas(integer_object_nulls=True)
        return dataset.head(limit, filter=where).to_pandas(integer_object_nulls=True)

    def write_table(self, name: str, table: Any) -> None:
        """One Parquet file as ``parquet/<name>/part-00000.parquet`` (replacing the table)."""
        import pyarrow.parquet as pq

        directory = f"{self.path}/parquet/{name}"
        self.fs.create_dir(directory, recursive=True)
        self.fs.delete_dir_contents(directory, missing_dir_ok=True)
        pq.write_table(table, f"{directory}/part-00000.parquet", filesystem=self.fs)

    def reset(self, relative: str) -> None:
        """Empty ``relative`` (created if missing): results of an earlier run must not mix
        with this run's (each capture writes its own part of every result)."""
        directory = f"{self.path}/{relative}"
        self.fs.create_dir(directory, recursive=True)
        self.fs.delete_dir_contents(directory, missing_dir_ok=True)

    def remove(self, *relative: str) -> None:
        """Delete these files of the directory (those that are there)."""
        import pyarrow.fs as pafs

        for name in relative:
            path = f"{self.path}/{name}"
            if self.fs.get_file_info(path).type == pafs.FileType.File:
                self.fs.delete_file(path)

    def write_text(self, relative: str, text: str) -> None:
        with self.fs.open_output_stream(f"{self.path}/{relative}") as stream:
            stream.write(text.encode("utf-8"))


# =============================================================================================
# summary.json
# =============================================================================================


def json_value(value: Any) -> Any:
    """A JSON-ready value: numpy scalars unwrapped, NaN/NaT as null, decimals as text, floats
    rounded to 6 decimals (enough for microseconds, stable across platforms)."""
    if value is None:
        return None
    if hasattr(value, "tolist") and not isinstance(value, str | bytes):
        value = value.tolist()
    if isinstance(value, float):
        return None if math.isnan(value) else round(value, 6)
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, Mapping):
        return {str(k): json_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_value(v) for v in value]
    return value


def table_rows(df: pd.DataFrame, limit: int = JSON_ROW_LIMIT) -> list[dict[str, Any]]:
    """Rows of a result table as JSON objects (the ``capture`` column is the grouping key
    of the summary, so it is left out)."""
    columns = [c for c in df.columns if c != "capture"]
    rows = []
    for record in df[columns].head(limit).itertuples(index=False, name=None):
        rows.append({c: json_value(v) for c, v in zip(columns, record, strict=True)})
    return rows


def build_summary(files: Sequence[str], args: argparse.Namespace, out: OutputDir,
                  names: Sequence[str], detail: frozenset[str] | set[str],
                  skipped: pd.DataFrame) -> dict[str, Any]:
    """``summary.json``: per capture, the row count of every table, every summary table in
    full (up to :data:`JSON_ROW_LIMIT` rows) and the first rows of
    :data:`JSON_DETAIL_TABLES`; plus the frames that are not UM, by reason."""
    captures = sorted(files) if args.per_file else ["all"]
    per_capture: dict[str, dict[str, Any]] = {c: {} for c in captures}
    for name in names:
        counts = out.counts_by_capture(name)
        for capture in captures:
            entry: dict[str, Any] = {"rows": counts.get(capture, 0)}
            if (name not in detail and name not in JSON_COUNT_ONLY) or name in JSON_DETAIL_TABLES:
                entry["data"] = table_rows(out.read(name, JSON_ROW_LIMIT, capture))
            per_capture[capture][name] = entry
    for capture in captures:
        frames = skipped if not args.per_file else skipped[skipped["file"] == capture]
        per_capture[capture]["not_um_frames"] = {
            str(reason): int(n) for reason, n in frames.groupby("reason")["frames"].sum().items()}
    return {
        "tool": PROG,
        "format": SUMMARY_FORMAT,
        "files": list(files),
        "options": {
            "per_file": bool(args.per_file),
            "stability_rule": args.stability,
            "flight_bins": args.flight_bins,
            "store_ports": list(args.store_port),
            "content_heuristics": not args.no_content_heuristics,
        },
        "captures": per_capture,
    }


if __name__ == "__main__":
    sys.exit(main())
