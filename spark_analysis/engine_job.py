"""One capture from the decode's Parquet to the analyses' Parquet: the unit of work of
``ump analyze`` after the decode (:func:`analyze_capture`), and the two ways it is run
(:func:`analyze_captures`).

Every analysis is a function of one capture (:mod:`spark_analysis.engine`): its rows are
read from ``OUT/decoded/`` (a filter on the file names pushed into the scan), analysed in one
process, and each result written as ``OUT/parquet/<analysis>/part-<rank>.parquet``, where
``rank`` is the capture's place among all captures in name order: the files of a result,
read in name order, are then its rows sorted by capture first, as :data:`SORT_KEYS` sorts
them.  Spark runs one task per capture on whatever executors the master has (a cluster's
executors read ``OUT/decoded/`` and write ``OUT/parquet/`` on the shared filesystem the URI
names; in local mode the driver's machine does both).
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pyarrow as pa

from spark_analysis.engine.inputs import (
    AckBuckets,
    Inputs,
    PartSpills,
    count_packets,
    load,
    load_tables,
    scan_packets,
)
from spark_analysis.engine.options import BYTES_PER_FRAME, MEMORY_SHARE, AnalysisOptions
from spark_analysis.engine.owners import (
    WHOLE,
    Part,
    host_counts,
    parts_needed,
    plan_parts,
    split,
)
from spark_analysis.engine.run import OUTPUTS, PART_TOTAL, analyze, analyze_in_parts
from spark_analysis.engine.spill import Spill


def _filesystem(location: str) -> tuple[Any, str]:
    """The pyarrow filesystem of ``location`` (a local path or a URI) and the path in it."""
    import pyarrow.fs as pafs

    if "://" in location:
        fs, path = pafs.FileSystem.from_uri(location)
        return fs, path
    return pafs.LocalFileSystem(), location


def analyze_capture(decoded: str, files: Sequence[str], per_file: bool, capture: str,
                    rank: int, options: AnalysisOptions, out: str,
                    progress: Callable[[str, float], None] | None = None) -> dict[str, int]:
    """Analyse ``capture`` (a file name with ``per_file``, else ``all``) from the decoded
    tables under ``decoded`` and write every result's part ``rank`` under ``out/parquet``.
    Returns the rows written per result."""
    import pyarrow.parquet as pq

    fs, root = _filesystem(decoded)

    def read() -> Inputs:
        started = time.perf_counter()
        inputs = load(root, files, per_file, captures=[capture], filesystem=fs)
        if progress is not None:
            progress("reading the decoded tables", time.perf_counter() - started)
        return inputs

    started = time.perf_counter()
    parts = plan(root, files, per_file, capture, options.frames_per_part, fs)
    if progress is not None:
        progress(f"planning the parts ({len(parts)})", time.perf_counter() - started)
    if len(parts) == 1:
        # no reference kept here: the analyses let each input table go when done with it
        results = analyze(read(), options, progress=progress)
    else:
        results = analyze_capture_in_parts(root, files, per_file, capture, parts, options,
                                           fs, progress)
    started = time.perf_counter()
    out_fs, out_root = _filesystem(out)
    rows = {}
    for name in OUTPUTS:
        directory = f"{out_root.rstrip('/')}/parquet/{name}"
        out_fs.create_dir(directory, recursive=True)
        pq.write_table(results[name], f"{directory}/part-{rank:05d}.parquet", filesystem=out_fs)
        rows[name] = results[name].num_rows
    if progress is not None:
        progress("writing the results", time.perf_counter() - started)
    return rows


def analyze_capture_in_parts(root: str, files: Sequence[str], per_file: bool, capture: str,
                             parts: Sequence[Part], options: AnalysisOptions, filesystem: Any,
                             progress: Callable[[str, float], None] | None
                             ) -> dict[str, pa.Table]:
    """Every result of ``capture`` (:func:`analyze_in_parts`): read once, its packets and
    topic messages cut into ``parts`` on local disk, and analysed a part at a time.  The
    disk is a temporary directory in the executor's first Spark local directory
    (``SPARK_LOCAL_DIRS``, which Spark gives its workers), else the system's (``TMPDIR``):
    at 10,000,000 frames about 0.2 GB for the parts' inputs (the ACKs among them set aside
    twice, compressed: by frame into buckets, then into the parts, :class:`AckBuckets`) and
    1.3 GB for the results (the biggest sorted a slice at a time onto disk,
    :func:`analyze_in_parts`)."""
    local = os.environ.get("SPARK_LOCAL_DIRS", "").split(",")[0] or None
    with tempfile.TemporaryDirectory(prefix="ump-parts-", dir=local,
                                     ignore_cleanup_errors=True) as scratch:
        started = time.perf_counter()
        spills = [Spill(f"{scratch}/part-{i}", compressed=True) for i in range(len(parts))]
        # the ACKs in as many buckets as parts: a bucket holds about a part's share
        ack_buckets = AckBuckets(Spill(f"{scratch}/acks", compressed=True), len(parts))
        shared = load_tables(root, files, per_file, captures=[capture], filesystem=filesystem,
                             parts=PartSpills(functools.partial(split, parts), spills,
                                              ack_buckets))
        if progress is not None:
            progress("reading the decoded tables into parts", time.perf_counter() - started)

        def read(i: int) -> dict[str, pa.Table]:
            return {name: spills[i].read(name) for name in ("packets", "messages")}

        return analyze_in_parts(shared, parts, read, ack_buckets, options, progress=progress,
                                scratch=scratch)


def plan(root: str, files: Sequence[str], per_file: bool, capture: str,
         frames_per_part: int | None, filesystem: Any = None) -> list[Part]:
    """The parts ``capture`` is analysed in (:func:`spark_analysis.engine.owners.plan_parts`):
    one unless it has more than ``frames_per_part`` UM frames (0: one; None: what fits in
    this machine's memory, :func:`frames_that_fit`) and more than one source host.  Only
    the columns that name a packet's host are read for it."""
    limit = frames_that_fit() if frames_per_part is None else frames_per_part
    if not limit or count_packets(root, files, per_file, captures=[capture],
                                  filesystem=filesystem) <= limit:
        return [WHOLE]
    counts: Counter[str | None] = Counter()
    for batch in scan_packets(root, files, per_file, ["protocol", "packet_type", "src_ip",
                                                      "dst_ip"],
                              captures=[capture], filesystem=filesystem):
        counts.update(host_counts(batch, "packets"))
    return plan_parts(counts, parts_needed(sum(counts.values()), limit))


def frames_that_fit(available: int | None = None) -> int:
    """The UM frames a capture analysed whole may have on this machine: ``available`` bytes
    (default: the system's ``MemAvailable`` now) times :data:`~spark_analysis.engine.options.
    MEMORY_SHARE` over :data:`~spark_analysis.engine.options.BYTES_PER_FRAME`, at least
    a million.  0 (whole) when the memory available is unknown."""
    if available is None:
        available = _memory_available()
    if available is None:
        return 0
    return max(1_000_000, int(available * MEMORY_SHARE / BYTES_PER_FRAME))


def _memory_available() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes, or the process's address-space limit
    when lower (Spark sets one on its Python workers with ``spark.executor.pyspark.memory``);
    None when neither is known."""
    import resource

    known = []
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    known.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    limit = resource.getrlimit(resource.RLIMIT_AS)[0]
    if limit != resource.RLIM_INFINITY and limit > 0:
        known.append(limit)
    return min(known) if known else None


def _ready_worker(threads: int) -> None:
    """Ready a Spark Python worker for the engine.

    * Arrow's thread pool gets ``threads`` (Spark starts its Python workers with
      ``OMP_NUM_THREADS=1``, which Arrow takes for its CPU count: the Parquet scan and the
      kernels of a capture's analysis then ran on one core of an idle machine).
    * Arrow allocates from jemalloc instead of its default mimalloc: in a forked worker the
      fresh memory of the first tables cost seconds of kernel time with mimalloc (the decoded
      tables of 1,000,000 frames: read in 3.3 s, 2.9 of them system time; 1.4 s with
      jemalloc, 1.6 s with the system allocator; the whole capture 4.3 s against 2.5 s)."""
    import pyarrow as pa

    pa.set_cpu_count(max(1, threads))
    try:
        pa.set_memory_pool(pa.jemalloc_memory_pool())
    except (NotImplementedError, pa.ArrowNotImplementedError):
        pa.set_memory_pool(pa.system_memory_pool())


Done = tuple[str, dict[str, int], dict[str, float], str | None]
"""What a task says of one capture: its name, the rows of every result it wrote, the seconds
of every step, and why it failed (None when it did not)."""


class AnalysisFailed(Exception):
    """The analyses of a capture failed (the message says which capture and why, in a line)."""


MEMORY_HINT = ("the analyses of one capture hold it in one process, about half a KiB per "
               "frame: give the worker more memory, analyse it in smaller parts "
               "(--frames-per-part), or cut the capture into files (editcap -c) and "
               "analyse them with --per-file")
"""What a user can do when a capture's analyses ran out of memory."""


def _task(decoded: str, files: list[str], per_file: bool, order: dict[str, int],
          options: AnalysisOptions, out: str, threads: int,
          ) -> Callable[[Iterator[str]], Iterator[Done]]:
    """The function a Spark task runs over its share of the capture names: per capture
    :data:`Done`.  An exception of the analyses is caught here and said by the capture's
    name (raised, Spark would report a Java stack trace of the task with it inside)."""
    def run(captures: Iterator[str]) -> Iterator[Done]:
        _ready_worker(threads)
        for capture in captures:
            steps: dict[str, float] = {}
            try:
                rows = analyze_capture(decoded, files, per_file, capture, order[capture],
                                       options, out, progress=steps.__setitem__)
            except Exception as exc:
                yield capture, {}, steps, _reason(exc)
                continue
            yield capture, rows, steps, None
    return run


def _name(capture: str, per_file: bool) -> str:
    """A capture as a message names it (``all`` is every file given, as one capture)."""
    return capture if per_file else "the capture"


def _reason(exc: BaseException) -> str:
    """One line for a failed analysis: out of memory said as such, else the exception."""
    import pyarrow as pa

    if isinstance(exc, (MemoryError, pa.ArrowMemoryError)):
        return f"out of memory ({MEMORY_HINT})"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__


def _crash(exc: BaseException) -> str:
    """One line for a Spark job that failed outside the analyses' own code: a Python worker
    that died (the system kills the biggest process when memory runs out) or Spark's own
    error."""
    text = str(exc)
    if "Python worker exited unexpectedly" in text or "EOFException" in text \
            or "crashed" in text:
        return f"the analysing process died, most likely killed for want of memory ({MEMORY_HINT})"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if re.match(r"^[\w.]+(Error|Exception): ", line)]
    return (errors[-1] if errors else lines[0] if lines else type(exc).__name__)[:300]


def analyze_captures(spark: Any, decoded: str, files: Sequence[str], per_file: bool,
                     options: AnalysisOptions, out: str,
                     log: Callable[[str], None] = print) -> dict[str, int]:
    """Analyse every capture of the run (the files, or each file with ``per_file``) in Spark,
    one task per capture, and write the results under ``out/parquet``; returns the rows of
    each result over all captures.  A line per capture says what its analyses took (and, for
    a single capture, a line per analysis step).

    Without a session (``spark`` None: captures small enough for ``ump analyze`` to run
    without Spark) the same task function runs here, over the captures one after the other."""
    captures = sorted(files) if per_file else ["all"]
    order = {capture: rank for rank, capture in enumerate(captures)}
    totals = dict.fromkeys(OUTPUTS, 0)
    if spark is None:
        task = _task(decoded, list(files), per_file, order, options, out, os.cpu_count() or 1)
        finished = list(task(iter(captures)))
    else:
        # an RDD of the names, a partition each: one stage of one task per capture, and the
        # results come back as Python values (a DataFrame of names would shuffle them first)
        # the cores each task may use: a local master's cores shared by the captures
        # analysed at once (on a cluster, Spark's count of all executors' cores: an upper
        # bound)
        cores = max(1, spark.sparkContext.defaultParallelism)
        threads = max(1, cores // min(len(captures), cores))
        names = spark.sparkContext.parallelize(captures, len(captures))
        done = names.mapPartitions(_task(decoded, list(files), per_file, order, options, out,
                                         threads))
        try:
            finished = done.collect()
        except Exception as exc:
            what = _name(captures[0], per_file) if len(captures) == 1 else "a capture"
            raise AnalysisFailed(f"analysing {what} failed: {_crash(exc)}") from exc
    failed = [(capture, error) for capture, _, _, error in finished if error is not None]
    if failed:
        capture, error = failed[0]
        more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
        raise AnalysisFailed(f"analysing {_name(capture, per_file)} failed{more}: {error}")
    for capture, rows, steps, _ in finished:
        for name, count in rows.items():
            totals[name] += count
        # a capture analysed in parts tells each part's time, then each step's over the
        # parts (PART_TOTAL): counted once, by its parts
        own = {k: v for k, v in steps.items() if not k.endswith(PART_TOTAL)}
        slowest = ", ".join(f"{k} {v:.1f}s" for k, v in
                            sorted(own.items(), key=lambda kv: -kv[1])[:3])
        log(f"  {capture}: {len(own)} steps in {sum(own.values()):.1f}s "
            f"(slowest: {slowest})")
        if len(captures) == 1:
            # one capture: a line per analysis step, in the order they ended
            for step, seconds in steps.items():
                log(f"    {step}: {seconds:.2f}s")
    return totals
