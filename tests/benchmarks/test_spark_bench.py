"""Smoke test of ``python -m benchmarks.spark`` on a tiny capture: the command runs end to end,
repeats the Spark side in new SparkContexts and reports the median run.  The speed target is
judged by the benchmark's own output, never here.

The benchmark starts and stops its own Spark sessions, so it runs in a subprocess: in this
process it would stop the session other tests share.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from benchmarks.spark import median_run

ROOT = Path(__file__).resolve().parents[2]


def test_median_run_is_the_middle_wall_time() -> None:
    runs = [{"seconds": s} for s in (3.0, 1.0, 2.0)]
    assert median_run(runs)["seconds"] == 2.0
    assert median_run(runs[:2])["seconds"] == 1.0  # an even count: the lower middle
    assert median_run(runs[:1])["seconds"] == 3.0


def test_command_line_repeats_and_reports(tmp_path: Path) -> None:
    figures = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.spark", "--packets", "20000", "--tshark-packets",
         "2000", "--repeat", "2", "--cache", str(tmp_path / "cache"), "--json", str(figures)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(figures.read_text())
    runs = result["spark_runs"]
    assert len(runs) == 2 and all(r["seconds"] > 0 and r["cpu_seconds"] > 0 for r in runs)
    assert result["spark"]["seconds"] == min(r["seconds"] for r in runs)
    assert result["spark"]["frames"] == 20000
    assert result["spark"]["rows"]["packets"] > 0 and result["spark"]["rows"]["lbmc_ume_ack"] > 0
    assert result["tshark"]["frames"] == 2000
    assert "the median of 2 runs" in done.stdout and "ratio spark/tshark" in done.stdout
    assert "packets/s" in result["report"]


def test_bad_repeat_is_a_usage_error() -> None:
    done = subprocess.run([sys.executable, "-m", "benchmarks.spark", "--repeat", "0"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "--repeat must be at least 1" in done.stderr
