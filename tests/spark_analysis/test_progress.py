"""Progress of ``ump analyze``: the decode's bar (percentage, ETA) on a terminal only, plain
lines elsewhere, nothing with ``--quiet``; the bar's numbers come from Spark's task counts."""

from __future__ import annotations

import io
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from spark_analysis import job
from spark_analysis.progress import TaskBar, render_bar, spark_task_counter

ROOT = Path(__file__).resolve().parents[2]


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_bar_shows_percentage_and_eta() -> None:
    assert render_bar("x", 0.0, 0.0).endswith("[" + "-" * 30 + "]   0%  ETA ?")
    half = render_bar("x", 0.5, 5.0)
    assert "#" * 15 + "-" * 15 in half and " 50%" in half and half.endswith("ETA 0:05")
    assert render_bar("x", 0.25, 30.0).endswith("ETA 1:30")
    assert render_bar("x", 1.0, 12.34).endswith("100%  in 12.3s")


def test_task_bar_only_grows_and_ends_full() -> None:
    counts = iter([(0.0, 8), (2.0, 8), (4.0, 8), (4.5, 16), (16.0, 16)])
    now = iter(range(100))
    stream = Tty()
    bar = TaskBar("decoding", lambda: next(counts), stream=stream, poll=3600,
                  clock=lambda: float(next(now)))
    seen = []
    with bar:
        for _ in range(4):
            bar.update()
            seen.append(bar.fraction)
    assert seen == [0.0, 0.25, 0.5, 0.5]  # a stage adding tasks does not move it back
    text = stream.getvalue()
    assert text.count("\r") >= 5 and text.endswith("\n")
    assert text.rstrip("\n").rsplit("\r", 1)[1].split("] ")[1].startswith("100%  in ")
    assert " 25%  ETA " in text


def test_a_failed_poll_keeps_the_last_value() -> None:
    def broken() -> tuple[float, int]:
        raise RuntimeError("tracker gone")

    bar = TaskBar("decoding", broken, stream=Tty(), poll=3600)
    bar.fraction = 0.4
    bar.update()
    assert bar.fraction == 0.4


def _fake_spark(stages: dict[int, tuple[int, int, int]]) -> Any:
    """A SparkSession stand-in whose tracker reports ``stages``: id -> (done, active, all)."""
    def info(stage: int) -> Any:
        done, active, total = stages[stage]
        return SimpleNamespace(numCompletedTasks=done, numActiveTasks=active, numTasks=total)

    tracker = SimpleNamespace(getActiveStageIds=lambda: [s for s, v in stages.items()
                                                         if v[0] < v[2]],
                              getStageInfo=info)
    return SimpleNamespace(sparkContext=SimpleNamespace(statusTracker=lambda: tracker))


def test_task_counter_counts_new_stages_and_half_of_running_tasks() -> None:
    stages = {1: (0, 1, 4)}  # running before the bar: another step's
    spark = _fake_spark(stages)
    count = spark_task_counter(spark.sparkContext)
    stages[2] = (2, 2, 8)
    assert count() == (3.0, 8)
    stages[2] = (8, 0, 8)  # finished: no longer active, still counted
    stages[3] = (0, 0, 4)
    assert count() == (8.0, 12)


def test_bar_only_on_a_terminal_and_never_with_quiet() -> None:
    spark = _fake_spark({})
    plain = io.StringIO()
    with job.Progress(stream=plain).bar("decoding", spark):
        pass
    assert "\r" not in plain.getvalue() and plain.getvalue().endswith("] decoding\n")
    tty = Tty()
    with job.Progress(stream=tty).bar("decoding", spark):
        pass
    assert "\r" in tty.getvalue() and "100%" in tty.getvalue()
    quiet = Tty()
    with job.Progress(quiet=True, stream=quiet).bar("decoding", spark):
        pass
    assert quiet.getvalue() == ""


def test_bar_follows_real_spark_tasks(spark: Any) -> None:
    stream = Tty()
    sc = spark.sparkContext
    with TaskBar("work", spark_task_counter(sc), stream=stream, poll=0.05) as bar:
        sc.parallelize(range(8), 8).map(lambda x: time.sleep(0.3) or x).collect()
        bar.update()
        assert bar.fraction > 0.5  # every task is done; the bar saw them
    frames = stream.getvalue().split("\r")
    assert any(" 0%" not in f and "100%" not in f for f in frames if "%" in f), frames


def test_ump_analyze_draws_the_bar_on_a_terminal(tmp_path: Path) -> None:
    """A real run in a pseudo-terminal: the decode's bar reaches 100%, every analysis still
    has its line (in Spark: a capture this small is otherwise run without it, and without a
    bar, its decode over in a moment)."""
    capture = ROOT / "captures" / "corpus" / "planted.pcap"
    main, child = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS="200")
    proc = subprocess.Popen([sys.executable, "-m", "ump", "analyze", str(capture), "--out",
                             str(tmp_path / "out"), "--store-port", "14567", "--spark"],
                            cwd=ROOT,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=child,
                            env=env)
    os.close(child)
    chunks = []
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 1.0)
        if ready:
            try:
                data = os.read(main, 65536)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(main)
    assert proc.wait(timeout=60) == 0, b"".join(chunks)[-2000:]
    text = b"".join(chunks).decode(errors="replace")
    decoding = [line for line in text.splitlines() if "] decoding [" in line]
    assert decoding and "100%  in " in decoding[-1], text[-2000:]
    assert "\r" in text and "  registrations" in text and "done in" in text
