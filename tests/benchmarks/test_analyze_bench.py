"""Smoke test of ``python -m benchmarks.analyze`` on a tiny generated capture: ``ump analyze``
runs end to end as a subprocess, tshark's lightest pass runs on the same file, and the figures
(wall time, peak memory of the whole process tree, ratio, where the time went) are printed.
The targets are judged by the benchmark's own output, never here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.analyze import (
    Measured,
    TreeMemory,
    _fail,
    corpus_capture,
    measure,
    report,
    spark_jobs,
    steps,
    target_for,
)
from wire import pcap

ROOT = Path(__file__).resolve().parents[2]


def test_steps_are_the_gaps_between_progress_lines() -> None:
    stderr = "\n".join([
        "ump analyze: [   0.2s] 1 capture file(s); results in x",
        "ump analyze: [   0.3s] starting Spark",
        "some Spark noise",
        "ump analyze: [  10.3s] decoding [######] 100%  in 2.0s",
        "ump analyze: [  12.8s]   packets",
        "ump analyze: [  20.0s] writing 2 results",
        "ump analyze: [  21.0s]   wrote anomalies: 3 rows",
        "ump analyze: [  24.0s]   wrote registrations: 5 rows",
        "ump analyze: [  25.0s] done in 25.0s: x/report.html"])
    got = steps(stderr)
    assert [text for text, _ in got] == [
        "1 capture file(s); results in x", "starting Spark", "decoding [######] 100%  in 2.0s",
        "packets", "writing 2 results", "wrote anomalies: 3 rows", "wrote registrations: 5 rows",
        "summary.json and report.html"]
    # a step's time follows its line; an output's time (written, then reported) precedes it
    assert [round(s, 1) for _, s in got] == [0.1, 10.0, 2.5, 7.2, 0.0, 1.0, 3.0, 1.0]


def test_tree_memory_sums_every_process_of_the_tree() -> None:
    """Three processes holding 64 MiB each: the tree's peak is their sum, which
    ``RUSAGE_CHILDREN`` (the largest single process) would not show."""
    child = ("import subprocess, sys, time; b = bytearray(64 << 20); "
             "ps = [subprocess.Popen([sys.executable, '-c', "
             "'import time; b = bytearray(64 << 20); time.sleep(1.5)']) for _ in range(2)]; "
             "time.sleep(1.5); [p.wait() for p in ps]")
    run = measure([sys.executable, "-c", child])
    assert run.returncode == 0, run.stderr
    assert run.processes >= 3
    assert run.peak_rss >= 3 * (64 << 20)
    assert run.peak_pss >= 3 * (60 << 20)
    assert run.seconds >= 1.5 and run.cpu_seconds > 0
    sampler = TreeMemory(root=2**22 + 12345)  # no such process: nothing to add up
    sampler.sample()
    assert sampler.peak_rss == 0 and sampler.processes == 0


def test_targets_and_report() -> None:
    assert target_for(1_000_000) == 15.0 and target_for(10_000_000) == 60.0
    assert target_for(12_345) is None
    result = {"label": "big 1,000,000", "frames": 1_000_000, "steps": [("decoding", 5.0)],
              "analyze": {"seconds": 30.0, "cpu_seconds": 50.0, "peak_rss": 2 << 30,
                          "peak_pss": 1 << 30},
              "tshark": {"seconds": 15.0, "peak_rss": 100 << 20, "frames": 1_000_000}}
    text = report([result])
    assert "2.00x" in text and "15 s: MISSED (2.00 of it)" in text
    assert "2,048 MiB" in text and "1,024 MiB" in text and "5.00 s  decoding" in text


def test_command_line_runs_end_to_end(tmp_path: Path) -> None:
    figures = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.analyze", "--frames", "20000", "--no-corpus",
         "--cache", str(tmp_path / "cache"), "--json", str(figures), "--spark-events"],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    (result,) = json.loads(figures.read_text())["results"]
    assert result["frames"] == 20000
    assert result["tshark"]["frames"] == 20000
    analyze = result["analyze"]
    assert analyze["seconds"] > 0 and analyze["cpu_seconds"] > 0
    # the Spark JVM and the Python driver at least: far more than one interpreter
    assert analyze["processes"] >= 2 and analyze["peak_rss"] > 200 << 20
    names = [text for text, _ in result["steps"]]
    assert "starting Spark" in names and any(n.startswith("decoded 20000 frames") for n in names)
    assert "ump analyze" in done.stdout and "ratio" in done.stdout
    assert "where ump analyze's" in done.stdout
    # Spark's event log: the analyses are one job of one task (one capture)
    jobs = {row["step"]: row for row in result["spark_jobs"]}
    assert jobs["analyses"]["jobs"] == 1 and jobs["analyses"]["tasks"] == 1
    assert all(row["tasks"] >= 1 for row in jobs.values())
    assert "Spark's event log on" in done.stdout


def test_spark_jobs_group_the_event_log_by_step(tmp_path: Path) -> None:
    events = [
        {"Event": "SparkListenerJobStart", "Job ID": 0, "Submission Time": 1000,
         "Stage IDs": [0, 1], "Properties": {}},
        {"Event": "SparkListenerTaskEnd", "Stage ID": 0, "Task Metrics": {
            "Executor Run Time": 500, "Executor CPU Time": 250_000_000, "JVM GC Time": 10}},
        {"Event": "SparkListenerJobEnd", "Job ID": 0, "Completion Time": 2000},
        {"Event": "SparkListenerJobStart", "Job ID": 1, "Submission Time": 3000,
         "Stage IDs": [2], "Properties": {"spark.job.description": "packets"}},
        {"Event": "SparkListenerTaskEnd", "Stage ID": 2, "Task Metrics": {
            "Executor Run Time": 1500, "Executor CPU Time": 1_000_000_000, "JVM GC Time": 0}},
        {"Event": "SparkListenerTaskEnd", "Stage ID": 2, "Task Metrics": {
            "Executor Run Time": 500, "Executor CPU Time": 500_000_000, "JVM GC Time": 0}},
        {"Event": "SparkListenerJobEnd", "Job ID": 1, "Completion Time": 5500},
    ]
    (tmp_path / "app-1").write_text("\n".join(json.dumps(e) for e in events) + "\n")
    rows = {row["step"]: row for row in spark_jobs(tmp_path)}
    (unnamed,) = [row for step, row in rows.items() if step.startswith("(unnamed")]
    assert (unnamed["jobs"], unnamed["stages"], unnamed["tasks"]) == (1, 2, 1)
    assert unnamed["seconds"] == 1.0 and unnamed["cpu_seconds"] == 0.25
    packets = rows["packets"]
    assert (packets["jobs"], packets["tasks"], packets["seconds"]) == (1, 2, 2.5)
    assert packets["task_seconds"] == 2.0 and packets["cpu_seconds"] == 1.5


def test_a_failed_run_names_its_cause() -> None:
    stderr = "\n".join([
        "ump analyze: [ 1.0s] starting Spark",
        "java.lang.OutOfMemoryError: Java heap space",
        "\tat org.apache.spark.storage.BlockManager.doPut(BlockManager.scala:1)",
        *["\tat x.y(Z.java:1)"] * 50,
        "ump analyze: An error occurred while calling o2924.localCheckpoint. (--debug ...)"])
    error = _fail("ump analyze", Measured([], 1, 1.0, 1.0, 0, 0, 1, "", stderr))
    assert str(error).startswith("ump analyze exited with 1: java.lang.OutOfMemoryError: Java "
                                 "heap space | ump analyze: An error occurred")


def test_the_corpus_row_is_the_capture_of_most_frames(tmp_path: Path) -> None:
    # the bigger file holds fewer frames (large fragmented datagrams): frames decide
    small_frames = [pcap.udp_frame("10.0.0.1", 1, "10.0.0.2", 2, b"x" * 1400)] * 3
    many_frames = [pcap.udp_frame("10.0.0.1", 1, "10.0.0.2", 2, b"x")] * 5
    pcap.write_pcap(tmp_path / "a-few-big.pcap", small_frames)
    pcap.write_pcap(tmp_path / "b-many.pcap", many_frames)
    assert (tmp_path / "a-few-big.pcap").stat().st_size > (tmp_path / "b-many.pcap").stat().st_size
    chosen = corpus_capture(tmp_path)
    assert chosen.path.name == "b-many.pcap" and chosen.label == "corpus b-many.pcap"
