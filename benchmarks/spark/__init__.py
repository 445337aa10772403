"""Decode-to-Parquet speed of the Spark pipeline against tshark:
``python -m benchmarks.spark [--quick] [--packets N] [--repeat N] [--json PATH]``.

One run measures, on the same generated capture (scenario ``big``, at least 10,000,000 frames
by default; ``--quick`` 200,000):

* **Spark**: :func:`spark_analysis.decode.decode_to_parquet` on ``local[*]`` (or ``--master``):
  every frame read, decoded and written as the Parquet tables ``packets``, ``messages``,
  ``advertisements`` and ``skipped``.  The clock runs from the call to its return (files
  committed); starting the SparkSession is timed apart.  ``--pipeline dataframe`` times the
  DataFrame path instead (``spark.read.format("pcap")`` -> :func:`decode_frames` ->
  ``DataFrame.write.parquet``), the way the pipeline worked before the fast path;
* **tshark**: ``tshark -r CAPTURE -T fields`` with the store-port preference
  (:meth:`wire.tshark.PortMap.tshark_args`) and fields of the same tables (addresses, ports,
  transport types and sequence numbers, LBMC type/length/topic index/sequence number/topic,
  UME ACK and registration fields, LBMR TIR/TQR names).  tshark manages some 30,000
  packets/s, so by default it reads the first ``--tshark-packets`` (1,000,000) frames of the
  capture, copied to a file of their own; its rate is per packet of that subset, and the
  report says so.  ``--tshark-packets 0`` gives it the whole capture.

``--repeat N`` runs the Spark side N times, each in a new SparkContext (its Python workers
started anew, as a user's run starts them; the driver JVM is the first run's, so later runs
start their session in well under a second and their driver is warm), and reports the run of
median wall time plus every run's wall and CPU seconds: on this shared machine two runs of
the same code differ by a tenth or more, so a single run cannot show a change of a few
percent.

Printed: packets/s of both and their ratio (both wall clock, and per CPU-second: the machine
has two cores and other work may share them), the CPU seconds of each side, the peak resident
memory of the Spark driver (Python and JVM) and of each Python worker (sampled from /proc every
0.2 s), and the row counts written.  Captures are cached in ``--cache`` (default
``$UMP_BENCH_CACHE`` or ``/tmp/ump-bench-spark``) under their scenario, size and seed, and
generated there when missing (about 40 s per 10,000,000 frames).

The benchmark reports; it never fails because the target (1,000,000 packets/s, 30x tshark) is
missed.  Exit status 2 is a usage error, 1 a failed run.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
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

TARGET_PPS = 1_000_000
DEFAULT_PACKETS = 10_000_000
QUICK_PACKETS = 200_000
DEFAULT_TSHARK_PACKETS = 1_000_000
QUICK_TSHARK_PACKETS = 50_000
SCENARIO = "big"

TSHARK_FIELDS = (
    "frame.number", "frame.time_epoch", "ip.src", "ip.dst", "udp.srcport", "udp.dstport",
    "tcp.srcport", "tcp.dstport", "tcp.seq_raw", "tcp.len",
    "lbtrm.hdr.type", "lbtrm.hdr.session_id", "lbtrm.data.sqn", "lbtrm.data.trail_sqn",
    "lbtru.hdr.type", "lbtru.data.sqn", "lbtru.data.trail",
    "lbmc.type", "lbmc.msglen", "lbmc.tidx", "lbmc.sqn", "lbmc.topicname.topic",
    "lbmc.ume_ack.type", "lbmc.ume_ack.seqnum", "lbmc.ume_ack.rcv_reg_id",
    "lbmc.ume_preg.reg_id", "lbmc.ume_preg.src_reg_id", "lbmc.ume_preg_resp.reg_id",
    "lbmc.ume_preg_resp.code.code",
    "lbmr.hdr.type", "lbmr.tir.name", "lbmr.tir.index", "lbmr.tqr.name", "_ws.malformed",
)
"""What tshark extracts: one value list per table column family the Spark side writes."""


# --- the capture ---------------------------------------------------------------------------------


def default_cache() -> Path:
    return Path(os.environ.get("UMP_BENCH_CACHE", "/tmp/ump-bench-spark"))


def capture_path(cache: Path, packets: int, seed: int, scenario: str = SCENARIO) -> Path:
    return cache / f"{scenario}-{packets}-s{seed}.pcap"


def ensure_capture(cache: Path, packets: int, seed: int,
                   scenario: str = SCENARIO) -> tuple[Path, float | None]:
    """The cached capture of ``packets`` frames of the generator's ``scenario``, generated
    first when missing; returns (path, seconds generating)."""
    path = capture_path(cache, packets, seed, scenario)
    meta = Path(f"{path}.meta.json")
    if path.exists() and meta.exists():
        return path, None
    cache.mkdir(parents=True, exist_ok=True)
    from captures.generator import generate
    from captures.scenarios import preset

    partial = path.with_name(path.name + ".partial")
    started = time.perf_counter()
    generate(preset(scenario), partial, seed=seed, packets=packets, progress=False)
    Path(f"{partial}.meta.json").replace(meta)
    partial.replace(path)
    return path, time.perf_counter() - started


def store_ports(capture: Path) -> list[int]:
    """The store port(s) the generator used (its sidecar says)."""
    meta = json.loads(Path(f"{capture}.meta.json").read_text())
    port = meta.get("ports", {}).get("store")
    return [int(port)] if port else []


def first_frames(capture: Path, count: int) -> Path:
    """A classic pcap of the first ``count`` records of ``capture`` (cached beside it)."""
    subset = capture.with_name(f"{capture.stem}.first-{count}.pcap")
    if subset.exists():
        return subset
    from wire.fastpath import derive
    from wire.pcap import (
        PCAP_MAGIC_NS,
        PCAP_MAGIC_US,
        PcapHeaderLE,
        PcapRecordBE,
        PcapRecordLE,
    )

    with capture.open("rb") as src:
        little = derive(PcapHeaderLE)
        header = src.read(little.size)
        le = little.decode(header)["magic"] in (PCAP_MAGIC_US, PCAP_MAGIC_NS)
        record = derive(PcapRecordLE if le else PcapRecordBE)
        incl_len = record.names.index("incl_len")
        partial = subset.with_name(subset.name + ".partial")
        with partial.open("wb") as dst:
            dst.write(header)
            for _ in range(count):
                head = src.read(record.size)
                if len(head) < record.size:
                    break
                dst.write(head)
                dst.write(src.read(record.unpack_from(head)[incl_len]))
    partial.replace(subset)
    return subset


# --- process-tree sampling -----------------------------------------------------------------------

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _children() -> dict[int, list[int]]:
    tree: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        tree.setdefault(parent, []).append(int(entry))
    return tree


def _descendants(root: int) -> list[int]:
    tree = _children()
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(tree.get(pid, []))
    return out


def _role(pid: int) -> str:
    if pid == os.getpid():
        return "driver (python)"
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "other"
    if "java" in cmd.split(" ", 1)[0]:
        return "driver (JVM)"
    if "pyspark" in cmd or "daemon" in cmd or "worker" in cmd:
        return "python worker"
    return "other"


def _stat(pid: int) -> tuple[int, float] | None:
    """(RSS bytes, CPU seconds including reaped children) of a process."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return int(fields[21]) * _PAGE, (utime + stime + cutime + cstime) / _TICK


@dataclass
class TreeSampler:
    """Samples this process's tree (the JVM and the Python workers Spark starts) in a thread:
    peak RSS per process and per role, and the tree's CPU seconds between start and stop
    (less the sampling thread's own)."""

    interval: float = 0.2
    peak: dict[int, int] = field(default_factory=dict)
    roles: dict[int, str] = field(default_factory=dict)
    peak_total: int = 0
    cpu_start: float = 0.0
    cpu_stop: float = 0.0
    own_cpu: float = 0.0
    cpu_seen: dict[int, list[float]] = field(default_factory=dict)  # pid: first, last
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def _cpu(self) -> float:
        own = os.times()
        total = own.user + own.system
        for pid in _descendants(os.getpid()):
            if pid == os.getpid():
                continue
            got = _stat(pid)
            if got:
                total += got[1]
        return total

    def sample(self) -> None:
        total = 0
        for pid in _descendants(os.getpid()):
            got = _stat(pid)
            if got is None:
                continue
            rss = got[0]
            self.cpu_seen.setdefault(pid, [got[1], got[1]])[1] = got[1]
            total += rss
            if rss > self.peak.get(pid, 0):
                self.peak[pid] = rss
            if pid not in self.roles:
                self.roles[pid] = _role(pid)
        self.peak_total = max(self.peak_total, total)

    def __enter__(self) -> TreeSampler:
        self.cpu_start = self._cpu()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()
        self.own_cpu = time.thread_time()  # the sampling itself is not Spark's work

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.sample()
        self.cpu_stop = self._cpu()

    @property
    def cpu(self) -> float:
        return self.cpu_stop - self.cpu_start - self.own_cpu

    def cpu_by_role(self) -> dict[str, float]:
        """CPU seconds per role between a process's first and last sample (a process that
        lived shorter than one interval is missed; the driver's includes the sampling)."""
        out: dict[str, float] = {}
        for pid, (first, last) in self.cpu_seen.items():
            role = self.roles.get(pid, "other")
            out[role] = out.get(role, 0.0) + last - first
        return out

    def by_role(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for pid, rss in self.peak.items():
            out.setdefault(self.roles.get(pid, "other"), []).append(rss)
        return {role: sorted(values, reverse=True) for role, values in out.items()}


# --- the two sides -------------------------------------------------------------------------------


def run_spark(capture: Path, out: Path, master: str, pipeline: str) -> dict[str, Any]:
    from spark_analysis.columnar import NETWORK_DECODE, DecodeOptions
    from spark_analysis.session import get_spark
    from spark_analysis.splits import RECORD_WALK
    from wire.tshark import PortMap

    options = DecodeOptions(PortMap(store_ports=store_ports(capture)))
    started = time.perf_counter()
    spark = get_spark(app_name="ump-bench-spark", master=master,
                      config={"spark.ui.enabled": "false"}, log_level="ERROR")
    session_seconds = time.perf_counter() - started
    try:
        with TreeSampler() as sampler:
            t0 = time.perf_counter()
            if pipeline == "fast":
                from spark_analysis.decode import decode_to_parquet

                result = decode_to_parquet(spark, str(capture), str(out), options,
                                           overwrite=True)
                frames, rows, stages = result.frames, result.rows, result.seconds
            else:
                frames, rows, stages = _dataframe_pipeline(spark, capture, out, options)
            seconds = time.perf_counter() - t0
    finally:
        spark.stop()
    roles = sampler.by_role()
    return {"pipeline": pipeline, "master": master, "frames": frames, "seconds": seconds,
            "session_seconds": session_seconds, "cpu_seconds": sampler.cpu, "rows": rows,
            "stages": stages, "peak_rss": roles, "peak_rss_total": sampler.peak_total,
            "cpu_by_role": sampler.cpu_by_role(), "record_walk": RECORD_WALK,
            "header_decode": NETWORK_DECODE}


def _dataframe_pipeline(spark: Any, capture: Path, out: Path, options: Any,
                        ) -> tuple[int, dict[str, int], dict[str, float]]:
    """The DataFrame path: the pcap source, decode_frames, Spark's Parquet writer."""
    from spark_analysis.decode import decode_frames

    shutil.rmtree(out, ignore_errors=True)
    frames_df = spark.read.format("pcap").load(str(capture))
    decoded = decode_frames(frames_df, options)
    stages: dict[str, float] = {}
    try:
        for name in ("packets", "messages", "advertisements", "skipped"):
            t0 = time.perf_counter()
            getattr(decoded, name).write.mode("overwrite").parquet(str(out / name))
            stages[name] = time.perf_counter() - t0
    finally:
        decoded.unpersist()
    rows = {name: spark.read.parquet(str(out / name)).count()
            for name in ("packets", "messages", "advertisements", "skipped")}
    frames = frames_df.count()
    return frames, rows, stages


def median_run(runs: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The run of median wall time (the lower middle one of an even count): on a shared
    machine single runs of the same code differ by a tenth or more."""
    return sorted(runs, key=lambda run: run["seconds"])[(len(runs) - 1) // 2]


def run_tshark(capture: Path, store: Sequence[int]) -> dict[str, Any]:
    from wire.tshark import PortMap, tshark_path

    args = [tshark_path(), "-r", str(capture), "-n", *PortMap(store_ports=list(store))
            .tshark_args(), "-T", "fields", "-E", "separator=\t"]
    for name in TSHARK_FIELDS:
        args += ["-e", name]
    before = os.times()
    t0 = time.perf_counter()
    lines = 0
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as proc:
        assert proc.stdout is not None
        for block in iter(lambda: proc.stdout.read(1 << 20), b""):  # type: ignore[union-attr]
            lines += block.count(b"\n")
        stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    seconds = time.perf_counter() - t0
    after = os.times()
    if proc.returncode != 0:
        raise RuntimeError(f"tshark failed ({proc.returncode}): {stderr.strip()[-500:]}")
    cpu = (after.children_user + after.children_system
           - before.children_user - before.children_system)
    return {"frames": lines, "seconds": seconds, "cpu_seconds": cpu, "args": args}


# --- report --------------------------------------------------------------------------------------


def _mb(value: int) -> str:
    return f"{value / 2**20:,.0f} MB"


def report(result: dict[str, Any]) -> str:
    spark, tshark = result["spark"], result.get("tshark")
    s_pps = spark["frames"] / spark["seconds"]
    s_cpu = spark["frames"] / spark["cpu_seconds"] if spark["cpu_seconds"] else 0.0
    lines = [
        f"capture: {result['capture']} ({result['capture_frames']:,} frames, "
        f"{result['capture_bytes'] / 1e9:.2f} GB)",
        f"machine: {result['cpus']} CPUs, load average at start {result['load_start']}",
        "",
        f"spark ({spark['pipeline']} pipeline, {spark['master']}): {spark['frames']:,} frames "
        f"in {spark['seconds']:.1f} s = {s_pps:,.0f} packets/s wall "
        f"({spark['cpu_seconds']:.1f} CPU-s, {s_cpu:,.0f} packets per CPU-second); "
        f"session start {spark['session_seconds']:.1f} s not included; pcap record walk "
        f"{spark.get('record_walk', '?')}, header decode {spark.get('header_decode', '?')}",
        *([f"  the median of {len(runs)} runs: " + ", ".join(
            f"{r['seconds']:.1f} s ({r['cpu_seconds']:.1f} CPU-s)" for r in runs)]
          if len(runs := result.get("spark_runs", [])) > 1 else []),
        "  rows written: " + ", ".join(f"{k} {v:,}" for k, v in spark["rows"].items()),
        "  stages: " + ", ".join(f"{k} {v:.1f} s" for k, v in spark["stages"].items()),
        "  CPU by process: " + ", ".join(f"{k} {v:.1f} s" for k, v in
                                         sorted(spark.get("cpu_by_role", {}).items())),
        "  peak RSS: " + "; ".join(
            f"{role}: " + ", ".join(_mb(v) for v in values[:4])
            for role, values in sorted(spark["peak_rss"].items()))
        + f"; whole tree at once {_mb(spark['peak_rss_total'])}",
    ]
    if tshark is not None:
        t_pps = tshark["frames"] / tshark["seconds"]
        t_cpu = tshark["frames"] / tshark["cpu_seconds"] if tshark["cpu_seconds"] else 0.0
        lines += [
            f"tshark: {tshark['frames']:,} frames"
            + (" (the first frames of the capture, in a file of their own)"
               if tshark["frames"] < result["capture_frames"] else "")
            + f" in {tshark['seconds']:.1f} s = {t_pps:,.0f} packets/s wall "
            f"({tshark['cpu_seconds']:.1f} CPU-s, {t_cpu:,.0f} packets per CPU-second)",
            "",
            f"ratio spark/tshark: {s_pps / t_pps:.1f}x wall, "
            + (f"{s_cpu / t_cpu:.1f}x per CPU-second" if t_cpu and s_cpu
               else "n/a per CPU-second"),
        ]
    lines.append(f"target {TARGET_PPS:,} packets/s: {s_pps / TARGET_PPS:.2f} of it")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spark",
                                     description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--packets", type=lambda s: int(s.replace("_", "")),
                        help=f"frames in the capture (default {DEFAULT_PACKETS:,})")
    parser.add_argument("--quick", action="store_true",
                        help=f"a small run: {QUICK_PACKETS:,} frames, tshark on "
                             f"{QUICK_TSHARK_PACKETS:,}")
    parser.add_argument("--tshark-packets", type=lambda s: int(s.replace("_", "")),
                        help="frames tshark reads (first ones; 0 = the whole capture; "
                             f"default {DEFAULT_TSHARK_PACKETS:,})")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cache", type=Path, default=default_cache(),
                        help="directory of cached captures (default %(default)s)")
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--pipeline", choices=("fast", "dataframe"), default="fast")
    parser.add_argument("--out", type=Path, help="Parquet output directory (default: a "
                        "temporary one, deleted after)")
    parser.add_argument("--repeat", type=int, default=1,
                        help="Spark runs, each in a new SparkContext (new Python workers, "
                             "same driver JVM); the median (by wall time) is reported, with "
                             "every run's figures (default 1)")
    parser.add_argument("--skip-tshark", action="store_true")
    parser.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = parser.parse_args(argv)
    packets = args.packets or (QUICK_PACKETS if args.quick else DEFAULT_PACKETS)
    tshark_packets = (args.tshark_packets if args.tshark_packets is not None
                      else QUICK_TSHARK_PACKETS if args.quick else DEFAULT_TSHARK_PACKETS)
    if packets <= 0 or tshark_packets < 0:
        parser.error("packet counts must be positive")
    if args.repeat < 1:
        parser.error("--repeat must be at least 1")
    try:
        capture, generated = ensure_capture(args.cache, packets, args.seed)
        print(f"capture {capture}" + (f" (generated in {generated:.0f} s)" if generated else
                                      " (cached)"), flush=True)
        result: dict[str, Any] = {
            "capture": str(capture), "capture_frames": packets,
            "capture_bytes": capture.stat().st_size, "cpus": os.cpu_count(),
            "load_start": " ".join(f"{x:.1f}" for x in os.getloadavg()),
            "python": platform.python_version(),
        }
        out_dir = args.out or Path(tempfile.mkdtemp(prefix="ump-bench-spark-out-"))
        runs = []
        try:
            for _ in range(args.repeat):
                runs.append(run_spark(capture, out_dir, args.master, args.pipeline))
                print(f"spark done: {runs[-1]['frames']:,} frames in "
                      f"{runs[-1]['seconds']:.1f} s", flush=True)
        finally:
            if args.out is None:
                shutil.rmtree(out_dir, ignore_errors=True)
        result["spark"] = median_run(runs)
        result["spark_runs"] = [{k: run[k] for k in ("seconds", "cpu_seconds", "stages")}
                                for run in runs]
        if not args.skip_tshark:
            subset = (capture if tshark_packets == 0 or tshark_packets >= packets
                      else first_frames(capture, tshark_packets))
            result["tshark"] = run_tshark(subset, store_ports(capture))
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a failed run is reported in one line, with its cause
        print(f"benchmark failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    if args.json:  # the figures first: a long run must not be lost to a report bug
        args.json.write_text(json.dumps(result, indent=2, default=str))
    text = report(result)
    print(text)
    if args.json:
        result["report"] = text
        args.json.write_text(json.dumps(result, indent=2, default=str))
    return 0
