"""``ump analyze`` run by the entry point's absolute path, its environment not activated.

The issue: Spark started its Python workers with the first ``python3`` on ``PATH``, which in
an un-activated virtual environment is another interpreter, without the project's packages.
Here the first ``python3`` (and ``python``) on ``PATH`` is a stub that records being started
and fails loudly; the run must not touch it (:func:`spark_analysis.session.worker_python`
gives the workers the driver's own interpreter) and must finish.  The capture is bigger than
:data:`spark_analysis.job.DRIVER_DECODE_BYTES`, so Python workers do start (the decode's tasks).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from captures.generator import generate
from captures.scenarios import preset
from spark_analysis import job

from .test_cluster import ump_command

STUB = """#!/bin/sh
echo "$0 $*" >> '{marker}'
echo "stub $0 started: the wrong interpreter" >&2
exit 97
"""


def test_ump_analyze_from_an_unactivated_environment(tmp_path: Path) -> None:
    capture = tmp_path / "lbtrm.pcap"
    generate(preset("lossy-lbtrm"), capture, packets=50_000, progress=False)
    assert capture.stat().st_size > job.DRIVER_DECODE_BYTES  # so Python workers start
    stubs = tmp_path / "stub-bin"
    stubs.mkdir()
    marker = tmp_path / "stub-started"
    for name in ("python3", "python"):
        (stubs / name).write_text(STUB.format(marker=marker))
        (stubs / name).chmod(0o755)
    java = shutil.which("java")
    assert java, "Spark needs Java on PATH"
    path = os.pathsep.join([str(stubs), os.path.dirname(os.path.realpath(java)),
                            "/usr/bin", "/bin"])
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_HOME",
                        "VIRTUAL_ENV", "PYTHONPATH")}
    env.update(PATH=path, SPARK_LOCAL_IP="127.0.0.1")
    # the stub is what a bare "python3" finds now
    probe = subprocess.run(["python3", "-c", "pass"], env=env, capture_output=True, text=True)
    assert probe.returncode == 97 and marker.exists()
    marker.unlink()
    out = tmp_path / "out"
    done = subprocess.run([*ump_command(), "analyze", str(capture), "--out", str(out),
                           "--store-port", "14567", "--split-size", "1"],
                          env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    assert not marker.exists(), marker.read_text()
    assert "decoded 50000 frames" in done.stderr
    assert (out / "report.html").is_file() and (out / "summary.json").is_file()
