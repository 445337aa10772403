"""``ump analyze --master spark://...`` on a real standalone Spark cluster on loopback (issue 19).

The master and one worker are the installed PySpark's own (``bin/spark-class``), on free
ports of 127.0.0.1, each checked as started through its web UI (the master's ``/json/`` lists
the worker as ALIVE) and always stopped.  The worker's executors stand for machines where the
project is *not* installed: a ``sitecustomize`` on their ``PYTHONPATH``
(:data:`HIDE_PROJECT`) lets ``spark_analysis`` and ``wire`` be imported only from a zip on the
path, i.e. from what the driver shipped.  Without the shipping of
:func:`spark_analysis.session.ship_project` their tasks fail with "No module named
'spark_analysis'", as the issue reported.

The capture is bigger than :data:`spark_analysis.job.DRIVER_DECODE_BYTES`, so the decode runs
as Spark tasks on the executors (split in 1 MiB pieces, several tasks), and the results must
equal a local run's, table for table.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pyspark

from captures.generator import generate
from captures.scenarios import preset
from spark_analysis import job
from tests.reference_impl.loopback import free_port

SPARK_CLASS = Path(pyspark.__file__).parent / "bin" / "spark-class"
STORE_PORT = 14567
START_TIMEOUT = 300.0

HIDE_PROJECT = '''\
"""Test cluster executors: spark_analysis and wire only from a zip on the path (shipped)."""
import importlib.machinery
import sys

SHIPPED = ("spark_analysis", "wire")


class OnlyShipped:
    @classmethod
    def find_spec(cls, name, path=None, target=None):
        top = name.partition(".")[0]
        if top not in SHIPPED:
            return None
        where = path if "." in name else [p for p in sys.path if p.endswith(".zip")]
        spec = importlib.machinery.PathFinder.find_spec(name, where)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return spec


sys.meta_path.insert(0, OnlyShipped)
'''


def ump_command() -> list[str]:
    """The ``ump`` entry point of this interpreter's environment."""
    script = Path(sys.executable).parent / "ump"
    assert script.is_file(), f"no ump entry point next to {sys.executable}: pip install -e ."
    return [str(script)]


def _get_json(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as response:
        return json.loads(response.read())


def _wait(what: str, check: Any, procs: list[subprocess.Popen[bytes]], logs: list[Path]) -> Any:
    """Poll ``check()`` until it returns something true; fail (with the daemons' logs) when a
    daemon exits or :data:`START_TIMEOUT` passes."""
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        try:
            found = check()
        except OSError:
            found = None
        if found:
            return found
        dead = [p for p in procs if p.poll() is not None]
        if dead or time.monotonic() > deadline:
            tails = "\n".join(f"--- {log.name}\n{log.read_text()[-3000:]}" for log in logs
                              if log.exists())
            raise AssertionError(f"{what}: {'a daemon exited' if dead else 'timed out'}\n{tails}")
        time.sleep(0.5)


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM each daemon's process group (the worker's executors are in its group), then
    SIGKILL what is left after 20 s."""
    for proc in procs:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@dataclass
class Cluster:
    url: str
    env: dict[str, str]
    work_dir: Path


@contextmanager
def standalone_cluster(root: Path) -> Iterator[Cluster]:
    """A master and a worker (2 cores) of the installed PySpark on 127.0.0.1."""
    hide = root / "hide-project"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE_PROJECT)
    work_dir = root / "work"
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_LOG_DIR": str(root / "logs"),
           # no fixed ports: the master's REST submission server would take 6066
           "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"}
    env.pop("SPARK_CONF_DIR", None)
    master_port, master_ui, worker_port, worker_ui = (free_port() for _ in range(4))
    url = f"spark://127.0.0.1:{master_port}"
    procs: list[subprocess.Popen[bytes]] = []
    logs = [root / "master.log", root / "worker.log"]
    try:
        with open(logs[0], "wb") as log:
            procs.append(subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.master.Master", "--host",
                 "127.0.0.1", "--port", str(master_port), "--webui-port", str(master_ui)],
                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
        state = f"http://127.0.0.1:{master_ui}/json/"
        _wait("master web UI", lambda: _get_json(state).get("status") == "ALIVE", procs, logs)
        with open(logs[1], "wb") as log:
            procs.append(subprocess.Popen(
                [str(SPARK_CLASS), "org.apache.spark.deploy.worker.Worker", "--host",
                 "127.0.0.1", "--port", str(worker_port), "--webui-port", str(worker_ui),
                 "--cores", "2", "--memory", "2g", "--work-dir", str(work_dir), url],
                env={**env, "PYTHONPATH": str(hide)}, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True))
        _wait("worker registered with the master",
              lambda: [w for w in _get_json(state)["workers"]
                       if w["state"] == "ALIVE" and w["port"] == worker_port], procs, logs)
        _wait("worker web UI", lambda: _get_json(f"http://127.0.0.1:{worker_ui}/json/"),
              procs, logs)
        yield Cluster(url, {k: v for k, v in env.items() if k != "SPARK_MASTER_OPTS"}, work_dir)
    finally:
        _stop(procs[::-1])


def _tables(out: Path) -> dict[str, list[dict[str, Any]]]:
    """Every result table of a run, as rows (they are written sorted)."""
    return {d.name: ds.dataset(d, format="parquet").to_table().to_pylist()
            for d in sorted((out / "parquet").iterdir())}


def _analyze(env: dict[str, str], capture: Path, out: Path, *extra: str,
             ) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*ump_command(), "analyze", str(capture), "--out", str(out), "--store-port",
         str(STORE_PORT), "--split-size", "1", *extra],
        env=env, capture_output=True, text=True, timeout=900)


def test_analyze_on_a_standalone_cluster_equals_the_local_run(tmp_path: Path) -> None:
    capture = tmp_path / "lbtrm.pcap"
    generate(preset("lossy-lbtrm"), capture, packets=50_000, progress=False)
    # decoded by Spark tasks, not in the driver, and in several splits of 1 MiB
    assert capture.stat().st_size > max(job.DRIVER_DECODE_BYTES, 4 << 20)
    with standalone_cluster(tmp_path) as cluster:
        remote = _analyze(cluster.env, capture, tmp_path / "cluster", "--master", cluster.url)
        assert remote.returncode == 0, remote.stderr
        # the executors got the project as the zip the driver built (and nothing else has it)
        shipped = list(cluster.work_dir.glob("app-*/*/ump-*.zip"))
        assert shipped, sorted(str(p) for p in cluster.work_dir.rglob("*"))
    # no Spark start-up banner or log lines: only the job's own progress
    assert [line for line in remote.stderr.splitlines()
            if not line.startswith("ump analyze: ")] == [], remote.stderr
    local = _analyze({**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"}, capture,
                     tmp_path / "local")
    assert local.returncode == 0, local.stderr
    remote_summary = json.loads((tmp_path / "cluster" / "summary.json").read_text())
    local_summary = json.loads((tmp_path / "local" / "summary.json").read_text())
    assert remote_summary == local_summary
    assert remote_summary["captures"]["all"]["transport_sessions"]["rows"] > 0
    remote_tables, local_tables = _tables(tmp_path / "cluster"), _tables(tmp_path / "local")
    assert remote_tables.keys() == local_tables.keys()
    for name, rows in local_tables.items():
        assert remote_tables[name] == rows, name
