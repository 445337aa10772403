"""The whole ``ump analyze``, end to end, against tshark's lightest pass:
``python -m benchmarks.analyze [--frames N ...] [--no-corpus] [--json PATH]``.

Issue 19 asks for the speed of the whole analysis, not only of the decode
(``python -m benchmarks.spark`` measures that): a user runs ``ump analyze CAPTURE --out DIR``
and waits for ``report.html``.  So each capture is analysed by ``ump analyze`` started as a
subprocess, exactly as a user starts it (a new interpreter, a new Spark JVM and its Python
workers, Parquet, ``summary.json`` and ``report.html`` written), and the clock runs from the
start of the process to its exit.  In the same run, on the same file, tshark makes its
lightest pass: ``tshark -r CAPTURE -n -T fields -e frame.number`` with the capture's port map
(its generator sidecar's ``tshark_args``, so tshark dissects the same UM traffic), the
cheapest thing tshark does with every frame.

Captures, by default:

* the biggest capture of ``captures/corpus`` (by frames; its sidecar gives the port options);
* 1,000,000 and 10,000,000 frames of the generator's ``big`` scenario, made once with the
  project's capture generator into the cache shared with ``benchmarks.spark``
  (``--cache``, default ``$UMP_BENCH_CACHE`` or ``/tmp/ump-bench-spark``; about 10 s per
  1,000,000 frames).  ``--frames N`` (repeatable) picks other sizes, e.g. ``--frames 20000
  --no-corpus`` for a quick run; ``--scenario fragments`` another preset (there ``N`` counts
  datagrams: the MTU cuts most of them into two or three IPv4 fragments).

Printed per capture: frames; wall seconds, CPU seconds and peak memory of ``ump analyze``'s
whole process tree (the Python driver, the Spark JVM and every Python worker, sampled from
``/proc`` every :data:`SAMPLE_INTERVAL` s: the peak of the *sum* over the tree, both as RSS
(pages shared between forked workers counted in each) and as PSS (shared pages divided among
their sharers: what the tree really holds)); the same for tshark; the ratio of the wall times;
and the target of issue 19 (:data:`TARGETS`: 1,000,000 frames in 15 s, 10,000,000 in 60 s on
the 2-core machine).  Then where ``ump analyze``'s time went: the duration of every step it
reports on stderr (start of Spark, decode, each intermediate table, each output written,
report).  ``--spark-events`` adds Spark's own account (its event log, what the Spark UI
shows): per analysis step the jobs, stages and tasks it ran and its tasks' run and CPU
seconds, which stay meaningful on a busy machine where wall times do not.

``--frames-per-part N`` is passed to ``ump analyze``: the same captures analysed in parts
(a capture bigger than the memory available is analysed so by default).

The benchmark reports; it never fails because a target is missed.  Exit status 2 is a usage
error, 1 a failed run (``ump analyze`` or tshark failed: its last lines are shown).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.spark import _TICK, _descendants, _stat, default_cache, ensure_capture
from wire.pcap import read_capture

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "captures" / "corpus"
DEFAULT_FRAMES = (1_000_000, 10_000_000)
TARGETS = {1_000_000: 15.0, 10_000_000: 60.0}
"""Issue 19's targets on the 2-core machine: frames -> wall seconds of ``ump analyze``."""
SAMPLE_INTERVAL = 0.1
"""Seconds between two samples of a process tree's memory (a peak shorter than this can be
missed; the JVM's heap and the workers' batches live for seconds)."""
TSHARK_FIELDS = ("frame.number",)
"""tshark's lightest pass: one field per frame."""

_STEP = re.compile(r"^ump analyze: \[\s*([0-9.]+)s\] (.*)$")


# --- process-tree sampling -----------------------------------------------------------------------


def _own_cpu(pid: int) -> float | None:
    """CPU seconds of the process itself (user + system, not its reaped children: those are
    sampled as processes of their own)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / _TICK


def _pss(pid: int) -> int:
    """Proportional set size of a process in bytes (0 when unreadable)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


@dataclass
class TreeMemory:
    """Samples the memory of the process tree under ``root`` (the root included) in a thread
    until stopped: the peak of the tree's summed RSS and summed PSS, the most processes seen
    at once, and the CPU seconds of every process of the tree at its last sample.  Unlike
    ``RUSAGE_CHILDREN`` (``ru_maxrss`` is the largest single process; and Spark's JVM is
    never waited for by the driver that started it, so its CPU is not there at all), this is
    what the whole tree held at its worst moment and spent.  A process that lived less than
    one interval is missed, and each loses at most its last interval of CPU."""

    root: int
    interval: float = SAMPLE_INTERVAL
    peak_rss: int = 0
    peak_pss: int = 0
    processes: int = 0
    samples: int = 0
    cpu_by_pid: dict[int, float] = field(default_factory=dict)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> None:
        pids = _descendants(self.root)
        rss = pss = alive = 0
        for pid in pids:
            got = _stat(pid)
            if got is None:
                continue
            alive += 1
            rss += got[0]
            pss += _pss(pid)
            cpu = _own_cpu(pid)
            if cpu is not None:
                self.cpu_by_pid[pid] = cpu
        self.peak_rss = max(self.peak_rss, rss)
        self.peak_pss = max(self.peak_pss, pss)
        self.processes = max(self.processes, alive)
        self.samples += 1

    @property
    def cpu_seconds(self) -> float:
        return sum(self.cpu_by_pid.values())

    def start(self) -> TreeMemory:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                return

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


@dataclass
class Measured:
    """One timed process tree: what it printed and what it cost."""

    argv: list[str]
    returncode: int
    seconds: float
    cpu_seconds: float
    peak_rss: int
    peak_pss: int
    processes: int
    stdout: str
    stderr: str


def measure(argv: Sequence[str], *, cwd: Path | None = None,
            env: dict[str, str] | None = None, count_lines: bool = False) -> Measured:
    """Run ``argv`` to its end while sampling its tree; with ``count_lines`` stdout is only
    counted (tshark's output of 10,000,000 lines is not kept), its line count is ``stdout``.

    CPU seconds: the tree's, sampled (:class:`TreeMemory`), or the ``RUSAGE_CHILDREN``
    difference (the processes that were waited for) where that is more."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    sampler = TreeMemory(proc.pid).start()
    err_chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: err_chunks.append(
        proc.stderr.read() if proc.stderr else b""), daemon=True)
    reader.start()
    assert proc.stdout is not None
    if count_lines:
        lines = 0
        for block in iter(lambda: proc.stdout.read(1 << 20), b""):  # type: ignore[union-attr]
            lines += block.count(b"\n")
        out = str(lines)
    else:
        out = proc.stdout.read().decode(errors="replace")
    proc.wait()
    seconds = time.perf_counter() - started
    reader.join()
    sampler.stop()
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = max(sampler.cpu_seconds,
              (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime))
    return Measured(list(argv), proc.returncode, seconds, cpu, sampler.peak_rss,
                    sampler.peak_pss, sampler.processes, out,
                    b"".join(err_chunks).decode(errors="replace"))


# --- the captures --------------------------------------------------------------------------------


@dataclass
class Capture:
    """A capture to analyse, with the port options of both tools (from its sidecar)."""

    label: str
    path: Path
    analyze_args: list[str]
    tshark_args: list[str]
    frames: int | None = None
    generated_seconds: float | None = None


def _sidecar(path: Path) -> dict[str, Any]:
    meta = Path(f"{path}.meta.json")
    return json.loads(meta.read_text()) if meta.exists() else {}


def _capture(label: str, path: Path, generated: float | None = None) -> Capture:
    meta = _sidecar(path)
    frames = meta.get("expected", {}).get("frames") or meta.get("generator", {}).get("packets")
    return Capture(label, path, [str(a) for a in meta.get("dissect_args", [])],
                   [str(a) for a in meta.get("tshark_args", [])],
                   int(frames) if frames else None, generated)


def corpus_capture(corpus: Path = CORPUS) -> Capture:
    """The biggest capture of the committed corpus, by frames (by bytes, the capture of a
    few large fragmented datagrams would be picked over one of many more frames)."""
    pcaps = [p for p in corpus.glob("*.pcap*") if not p.name.endswith(".json")]
    if not pcaps:
        raise FileNotFoundError(f"no capture in {corpus}")
    biggest = min(pcaps, key=lambda p: (-_frames_in(p), p.name))
    return _capture(f"corpus {biggest.name}", biggest)


def _frames_in(path: Path) -> int:
    """How many frames ``path`` holds."""
    return sum(1 for _ in read_capture(path))


def generated_capture(cache: Path, frames: int, seed: int, scenario: str = "big") -> Capture:
    """``frames`` frames of the generator's ``scenario`` (``big`` by default), generated into
    ``cache`` when missing."""
    path, seconds = ensure_capture(cache, frames, seed, scenario)
    return _capture(f"{scenario} {frames:,}", path, seconds)


# --- the runs ------------------------------------------------------------------------------------


def steps(stderr: str) -> list[tuple[str, float]]:
    """``ump analyze``'s progress lines as (step, seconds): where the time went.

    A step's line is printed when it starts, so the time until the next line is its own;
    a ``wrote NAME: N rows`` line is printed when that output is written, so the time since
    the line before is the writing of NAME, and the time before the last line ("done in
    ...") is the writing of ``summary.json`` and ``report.html``.  Every gap between two lines
    is counted once."""
    marks = [(float(m.group(1)), m.group(2).strip()) for m in
             (_STEP.match(line) for line in stderr.splitlines()) if m]
    spent = [0.0] * len(marks)
    for i, ((at, _), (later, text)) in enumerate(itertools.pairwise(marks)):
        spent[i + 1 if text.startswith(("wrote ", "done in ")) else i] += later - at
    return [("summary.json and report.html" if text.startswith("done in ") else text, spent[i])
            for i, (_, text) in enumerate(marks)]


def run_analyze(capture: Capture, out: Path, master: str | None,
                extra: Sequence[str] = (), events: Path | None = None) -> Measured:
    """``ump analyze`` on the capture; with ``events`` Spark writes its event log there."""
    argv = [sys.executable, "-m", "ump", "analyze", str(capture.path), "--out", str(out),
            *capture.analyze_args, *(["--master", master] if master else []), *extra,
            # Spark's event log needs Spark, even for a capture small enough to go without
            *(["--spark"] if events is not None else [])]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if events is not None:
        env["SPARK_CONF_DIR"] = str(_event_log_conf(events, env.get("SPARK_CONF_DIR")))
    return measure(argv, cwd=ROOT, env=env)


def _event_log_conf(events: Path, conf_dir: str | None) -> Path:
    """A Spark configuration directory: the user's ``spark-defaults.conf`` (if any) plus an
    uncompressed, unrolled event log into ``events`` (what the Spark UI's history shows)."""
    conf = events / "conf"
    conf.mkdir(parents=True, exist_ok=True)
    (events / "log").mkdir(exist_ok=True)
    own = Path(conf_dir or "/nonexistent") / "spark-defaults.conf"
    lines = [own.read_text()] if own.is_file() else []
    lines += ["spark.eventLog.enabled true", f"spark.eventLog.dir {(events / 'log').as_uri()}",
              "spark.eventLog.compress false", "spark.eventLog.rolling.enabled false"]
    (conf / "spark-defaults.conf").write_text("\n".join(lines) + "\n")
    return conf


def spark_jobs(log_dir: Path) -> list[dict[str, Any]]:
    """Spark's own account of a run, from its event log: per job description (``ump
    analyze`` names each analysis step's jobs; the decode's are unnamed) the jobs, stages
    and tasks run, the seconds from the first job's start to the last one's end, and the
    tasks' run time, CPU time (the JVM's task threads only: not the Python workers, not the
    driver's planning and code generation) and garbage collection time."""
    rows: dict[str, dict[str, Any]] = {}
    job_step: dict[int, str] = {}
    stage_step: dict[int, str] = {}
    for path in sorted(log_dir.iterdir()):
        for line in path.read_text(errors="replace").splitlines():
            event = json.loads(line)
            kind = event.get("Event")
            if kind == "SparkListenerJobStart":
                step = (event.get("Properties") or {}).get("spark.job.description") or \
                    "(unnamed: decode, reading tables back)"
                job_step[event["Job ID"]] = step
                row = rows.setdefault(step, {"step": step, "jobs": 0, "stages": 0, "tasks": 0,
                                             "first": event["Submission Time"], "last": 0,
                                             "task_seconds": 0.0, "cpu_seconds": 0.0,
                                             "gc_seconds": 0.0})
                row["jobs"] += 1
                row["stages"] += len(event.get("Stage IDs", []))
                for stage in event.get("Stage IDs", []):
                    stage_step[stage] = step
            elif kind == "SparkListenerJobEnd" and event["Job ID"] in job_step:
                row = rows[job_step[event["Job ID"]]]
                row["last"] = max(row["last"], event.get("Completion Time", 0))
            elif kind == "SparkListenerTaskEnd" and event.get("Stage ID") in stage_step:
                row = rows[stage_step[event["Stage ID"]]]
                metrics = event.get("Task Metrics") or {}
                row["tasks"] += 1
                row["task_seconds"] += metrics.get("Executor Run Time", 0) / 1e3
                row["cpu_seconds"] += metrics.get("Executor CPU Time", 0) / 1e9
                row["gc_seconds"] += metrics.get("JVM GC Time", 0) / 1e3
    out = []
    for row in rows.values():
        row["seconds"] = max(0, row.pop("last") - row.pop("first")) / 1e3
        out.append(row)
    return out


def run_tshark(capture: Capture) -> Measured:
    from wire.tshark import tshark_path

    argv = [tshark_path(), "-r", str(capture.path), "-n", *capture.tshark_args, "-T", "fields"]
    for name in TSHARK_FIELDS:
        argv += ["-e", name]
    return measure(argv, count_lines=True)


def _fail(what: str, run: Measured) -> RuntimeError:
    """The failure in one line: the first Java or Python exception named on stderr (the
    cause, e.g. an OutOfMemoryError, precedes a long stack) and the last line."""
    lines = run.stderr.strip().splitlines()
    causes = [line.strip() for line in lines
              if re.search(r"(Error|Exception)(:|$)", line) and not line.startswith("\tat ")]
    tail = " | ".join([*causes[:2], *lines[-1:]])
    return RuntimeError(f"{what} exited with {run.returncode}: {tail}")


def bench_capture(capture: Capture, master: str | None, tshark: bool,
                  keep: Path | None, spark_events: bool = False,
                  extra: Sequence[str] = ()) -> dict[str, Any]:
    """Both tools on one capture; the figures as a JSON-ready dict."""
    out_parent = keep or Path(tempfile.mkdtemp(prefix="ump-bench-analyze-"))
    out = out_parent / capture.path.stem
    events = out_parent / f"{capture.path.stem}.spark-events" if spark_events else None
    jobs: list[dict[str, Any]] = []
    try:
        analyze = run_analyze(capture, out, master, extra, events=events)
        if analyze.returncode != 0:
            raise _fail("ump analyze", analyze)
        summary = json.loads((out / "summary.json").read_text())
        if events is not None:
            jobs = spark_jobs(events / "log")
    finally:
        if keep is None:
            shutil.rmtree(out_parent, ignore_errors=True)
    decoded = re.search(r"decoded ([0-9]+) frames", analyze.stderr)
    result: dict[str, Any] = {
        "capture": str(capture.path), "label": capture.label,
        "bytes": capture.path.stat().st_size,
        "frames": int(decoded.group(1)) if decoded else capture.frames,
        "generated_seconds": capture.generated_seconds,
        "analyze": _figures(analyze),
        "steps": steps(analyze.stderr),
        "tables": len(summary.get("captures", {}).get("all", {})),
        "spark_jobs": jobs,
    }
    if tshark:
        shark = run_tshark(capture)
        if shark.returncode != 0:
            raise _fail("tshark", shark)
        result["tshark"] = {**_figures(shark), "frames": int(shark.stdout)}
    return result


def _figures(run: Measured) -> dict[str, Any]:
    return {"argv": run.argv, "seconds": run.seconds, "cpu_seconds": run.cpu_seconds,
            "peak_rss": run.peak_rss, "peak_pss": run.peak_pss, "processes": run.processes}


# --- report --------------------------------------------------------------------------------------


def _mib(value: int) -> str:
    return f"{value / 2**20:,.0f} MiB"


def target_for(frames: int | None) -> float | None:
    return TARGETS.get(frames or -1)


def report(results: Sequence[dict[str, Any]], top_steps: int = 12) -> str:
    """The figures as text: a table of all captures, then each capture's slowest steps."""
    lines = [f"machine: {os.cpu_count()} CPUs; load average now "
             + " ".join(f"{x:.1f}" for x in os.getloadavg()), "",
             f"{'capture':<28}{'frames':>12}{'ump analyze':>13}{'CPU':>9}{'peak RSS':>11}"
             f"{'peak PSS':>11}{'tshark':>9}{'t.peak':>10}{'ratio':>8}  target"]
    for r in results:
        a, t = r["analyze"], r.get("tshark")
        target = target_for(r["frames"])
        verdict = ("" if target is None else
                   f"{target:.0f} s: {'met' if a['seconds'] <= target else 'MISSED'} "
                   f"({a['seconds'] / target:.2f} of it)")
        lines.append(
            f"{r['label'][:27]:<28}{r['frames'] or 0:>12,}{a['seconds']:>11.1f} s"
            f"{a['cpu_seconds']:>7.1f} s{_mib(a['peak_rss']):>11}{_mib(a['peak_pss']):>11}"
            + (f"{t['seconds']:>7.1f} s{_mib(t['peak_rss']):>10}"
               f"{a['seconds'] / t['seconds']:>7.2f}x" if t else f"{'-':>9}{'-':>10}{'-':>8}")
            + f"  {verdict}")
    lines += ["", "ratio = ump analyze wall / tshark wall (below 1: faster than tshark); "
                  "memory is the peak of the sum over each process tree",
              f"tshark: -T fields -e {' -e '.join(TSHARK_FIELDS)} with the capture's port map"]
    for r in results:
        ranked = sorted(r["steps"], key=lambda s: -s[1])[:top_steps]
        lines += ["", f"where ump analyze's {r['analyze']['seconds']:.1f} s went on "
                      f"{r['label']} (slowest steps, from its progress lines):"]
        lines += [f"  {seconds:7.2f} s  {text}" for text, seconds in ranked]
        if r.get("spark_jobs"):
            lines += ["", f"Spark's event log on {r['label']} (per step: jobs, stages, tasks; "
                          "first job start to last job end; task run, CPU and GC seconds):",
                      f"  {'step':<40}{'jobs':>5}{'stages':>7}{'tasks':>7}{'span':>8}"
                      f"{'run':>8}{'CPU':>7}{'GC':>6}"]
            totals = [0, 0, 0, 0.0, 0.0, 0.0, 0.0]
            for j in r["spark_jobs"]:
                lines.append(f"  {j['step'][:39]:<40}{j['jobs']:>5}{j['stages']:>7}"
                             f"{j['tasks']:>7}{j['seconds']:>8.1f}{j['task_seconds']:>8.1f}"
                             f"{j['cpu_seconds']:>7.1f}{j['gc_seconds']:>6.1f}")
                for i, key in enumerate(("jobs", "stages", "tasks", "seconds", "task_seconds",
                                         "cpu_seconds", "gc_seconds")):
                    totals[i] += j[key]
            lines.append(f"  {'all':<40}{totals[0]:>5}{totals[1]:>7}{totals[2]:>7}"
                         f"{totals[3]:>8.1f}{totals[4]:>8.1f}{totals[5]:>7.1f}{totals[6]:>6.1f}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.analyze",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--frames", type=lambda s: int(s.replace("_", "").replace(",", "")),
                        action="append", metavar="N",
                        help="frames of a generated capture (repeatable; default "
                             + " and ".join(f"{n:,}" for n in DEFAULT_FRAMES) + ")")
    parser.add_argument("--no-corpus", action="store_true",
                        help="skip the biggest corpus capture")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--scenario", default="big",
                        help="generator preset of the generated captures (default big; "
                             "fragments: datagrams over the MTU, reassembled from IPv4 "
                             "fragments)")
    parser.add_argument("--cache", type=Path, default=default_cache(),
                        help="directory of generated captures (default %(default)s)")
    parser.add_argument("--master", help="Spark master for ump analyze (default: its own)")
    parser.add_argument("--skip-tshark", action="store_true")
    parser.add_argument("--keep-out", type=Path, metavar="DIR",
                        help="keep ump analyze's output under DIR (default: deleted)")
    parser.add_argument("--spark-events", action="store_true",
                        help="have Spark write its event log and print, per analysis step, "
                             "its jobs, stages, tasks and task CPU seconds")
    parser.add_argument("--frames-per-part", metavar="N",
                        help="passed to ump analyze: analyse each capture in parts of N "
                             "frames (0: whole; default: ump analyze's, whole when it fits "
                             "in half the memory available)")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    sizes = args.frames or list(DEFAULT_FRAMES)
    if any(n <= 0 for n in sizes):
        parser.error("--frames must be positive")
    results: list[dict[str, Any]] = []
    try:
        captures = [] if args.no_corpus else [corpus_capture()]
        for frames in sizes:
            captures.append(generated_capture(args.cache, frames, args.seed, args.scenario))
            if captures[-1].generated_seconds is not None:
                print(f"generated {captures[-1].path} in {captures[-1].generated_seconds:.0f} s",
                      flush=True)
        for capture in captures:
            extra = ([] if args.frames_per_part is None
                     else ["--frames-per-part", args.frames_per_part])
            results.append(bench_capture(capture, args.master, not args.skip_tshark,
                                         args.keep_out, args.spark_events, extra))
            done = results[-1]
            if args.json:  # after every capture: a long run's figures survive a later failure
                args.json.write_text(json.dumps({"results": results}, indent=2))
            print(f"{capture.label}: ump analyze {done['analyze']['seconds']:.1f} s"
                  + (f", tshark {done['tshark']['seconds']:.1f} s" if "tshark" in done else ""),
                  flush=True)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a failed run is one line with its cause
        print(f"benchmark failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    text = report(results)
    print(text)
    if args.json:
        args.json.write_text(json.dumps({"results": results, "report": text}, indent=2))
    return 0
