"""The session defaults and the worker daemon that imports PySpark byte-compiled."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from spark_analysis import session
from spark_analysis.worker_daemon import prefer_installed


def _pip_layout(root: Path, py4j_version: str = "0.10.9.9") -> dict[str, str]:
    """A site-packages holding pyspark (with its zip and jars) and py4j, as pip lays it out."""
    site = root / "site-packages"
    lib = site / "pyspark" / "python" / "lib"
    lib.mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    (site / "pyspark" / "jars").mkdir()
    (site / "pyspark" / "jars" / "spark-core_2.13-4.3.0.jar").write_bytes(b"PK")
    (site / "py4j").mkdir()
    (site / "py4j" / "version.py").write_text(f'__version__ = "{py4j_version}"\n')
    for name in ("pyspark.zip", "py4j-0.10.9.9-src.zip"):
        (lib / name).write_bytes(b"PK")
    return {"site": str(site), "zip": str(lib / "pyspark.zip"),
            "py4j": str(lib / "py4j-0.10.9.9-src.zip"),
            "jar": str(site / "pyspark" / "jars" / "spark-core_2.13-4.3.0.jar")}


def test_a_pip_install_drops_the_bundled_zips_and_jars(tmp_path: Path) -> None:
    p = _pip_layout(tmp_path)
    stdlib = str(tmp_path / "stdlib")
    path = ["", p["zip"], p["py4j"], p["jar"], stdlib, p["site"]]
    assert prefer_installed(path) == ["", stdlib, p["site"]]


def test_another_py4j_version_keeps_its_zip(tmp_path: Path) -> None:
    p = _pip_layout(tmp_path, py4j_version="0.10.9.7")
    path = [p["zip"], p["py4j"], p["site"]]
    assert prefer_installed(path) == [p["py4j"], p["site"]]


def test_a_spark_distribution_is_left_alone(tmp_path: Path) -> None:
    home = tmp_path / "spark-4.3.0-bin"
    (home / "python" / "lib").mkdir(parents=True)
    zipped = str(home / "python" / "lib" / "pyspark.zip")
    site = _pip_layout(tmp_path)["site"]  # even with a pip pyspark installed as well
    path = [zipped, str(home / "python" / "lib" / "py4j-0.10.9.9-src.zip"), site]
    assert prefer_installed(path) == path


def test_an_earlier_pyspark_on_the_path_keeps_everything(tmp_path: Path) -> None:
    p = _pip_layout(tmp_path)
    mine = tmp_path / "mine"
    (mine / "pyspark").mkdir(parents=True)
    path = [p["zip"], str(mine), p["site"]]
    assert prefer_installed(path) == path


def test_without_the_installed_package_on_the_path_nothing_changes(tmp_path: Path) -> None:
    p = _pip_layout(tmp_path)
    path = [p["zip"], p["py4j"], str(tmp_path / "elsewhere")]
    assert prefer_installed(path) == path


def test_the_daemon_is_only_chosen_for_local_masters(monkeypatch: pytest.MonkeyPatch,
                                                      tmp_path: Path) -> None:
    key = "spark.python.daemon.module"
    assert session.default_config(local=True)[key] == session.DAEMON_MODULE
    assert key not in session.default_config(local=False)
    monkeypatch.delenv("PYSPARK_SUBMIT_ARGS", raising=False)
    monkeypatch.setenv("SPARK_CONF_DIR", str(tmp_path))
    assert session._launch_master() == "local[*]"
    (tmp_path / "spark-defaults.conf").write_text("# cluster\nspark.master   yarn\n")
    assert session._launch_master() == "yarn"
    assert not session._is_local(session._launch_master())
    monkeypatch.setenv("PYSPARK_SUBMIT_ARGS", "--master 'local[3]' pyspark-shell")
    assert session._launch_master() == "local[3]"


def test_no_daemon_when_the_package_comes_from_a_zip(monkeypatch: pytest.MonkeyPatch) -> None:
    """``spark-submit --master 'local[2]' --py-files ump.zip`` without the package installed:
    a worker starts its daemon before ``--py-files`` reach it, so it could not import
    :data:`session.DAEMON_MODULE`; PySpark's own daemon must stay."""
    key = "spark.python.daemon.module"
    monkeypatch.setattr(session, "__file__", "/jobs/ump.zip/spark_analysis/session.py")
    assert key not in session.default_config(local=True)
    assert session.default_config(local=True)["spark.sql.session.timeZone"] == "UTC"


def _worker_imports(_: Any) -> tuple[str, list[str]]:
    import sys

    import pyspark

    return pyspark.__file__ or "", list(sys.path)


def test_spark_workers_import_the_installed_pyspark(spark: Any) -> None:
    import pyspark

    conf = spark.sparkContext.getConf()
    assert conf.get("spark.python.daemon.module") == session.DAEMON_MODULE
    [(worker_pyspark, worker_path)] = (spark.sparkContext.parallelize([0], 1)
                                       .map(_worker_imports).collect())
    package = os.path.dirname(pyspark.__file__ or "")
    bundled = os.path.join(package, "python", "lib", "pyspark.zip")
    assert os.path.exists(bundled), "this test expects pyspark installed with pip"
    # the worker found the byte-compiled package the driver uses, not Spark's zip of it
    assert worker_pyspark == pyspark.__file__
    assert bundled not in worker_path
    assert not [e for e in worker_path if e.startswith(os.path.join(package, "jars"))]
