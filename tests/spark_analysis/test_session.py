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


# =============================================================================================
# register(spark): shuffle partitions, shipping, the workers' interpreter, a quiet start
# =============================================================================================


class _FakeConf:
    """``spark.conf`` (run-time settings) over a dict."""

    def __init__(self, values: dict[str, str]) -> None:
        self.values = values

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.values.get(key, default)

    def set(self, key: str, value: str) -> None:
        self.values[key] = value


class _FakeSpark:
    """What :func:`session.size_shuffle_partitions` reads: run-time settings, the launch
    settings and the cores."""

    conf: Any
    sparkContext: Any

    def __init__(self, cores: int, launch: dict[str, str] | None = None,
                 runtime: dict[str, str] | None = None) -> None:
        from pyspark import SparkConf

        launched = SparkConf(loadDefaults=False)
        for key, value in (launch or {}).items():
            launched.set(key, value)
        self.conf = _FakeConf({**(launch or {}), **(runtime or {})})
        self.sparkContext = type("SC", (), {"defaultParallelism": cores,
                                            "getConf": lambda _self: launched})()


def test_shuffle_partitions_follow_the_input_and_the_cores() -> None:
    mib = 1 << 20
    assert session.shuffle_partitions(0, 2) == 2  # one per core at least
    assert session.shuffle_partitions(5 * mib, 8) == 8
    assert session.shuffle_partitions(64 * mib, 2) == 2
    assert session.shuffle_partitions(65 * mib, 1) == 2  # one per 64 MiB
    assert session.shuffle_partitions(300 * mib, 2) == 6  # 5 rounded up to whole waves of 2
    assert session.shuffle_partitions(10 << 30, 4) == 160
    assert session.shuffle_partitions(10, 0) == 1


def test_spark_default_shuffle_partitions_are_replaced_a_users_are_kept() -> None:
    key = session.SHUFFLE_PARTITIONS
    fresh: Any = _FakeSpark(cores=2)  # Spark's default: the setting is absent (reads 200)
    assert session.size_shuffle_partitions(fresh) == 2 and fresh.conf.get(key) == "2"
    # sized again for an input: the count was ours
    assert session.size_shuffle_partitions(fresh, 1 << 30) == 16
    assert fresh.conf.get(key) == "16"
    explicit_200: Any = _FakeSpark(cores=2, runtime={key: "200"})  # indistinguishable: replaced
    assert session.size_shuffle_partitions(explicit_200) == 2
    at_launch: Any = _FakeSpark(cores=2, launch={key: "200"})
    assert session.size_shuffle_partitions(at_launch, 1 << 30) == 200
    at_run_time: Any = _FakeSpark(cores=2, runtime={key: "7"})
    assert session.size_shuffle_partitions(at_run_time, 1 << 30) == 7
    assert at_run_time.conf.get(key) == "7"


def test_register_is_the_package_level_call(spark: Any) -> None:
    import spark_analysis

    assert spark_analysis.register is session.register
    spark_analysis.register(spark)
    # local master: nothing shipped; the fixture's launch-time partition count kept
    assert session.ship_project(spark) is None
    assert spark.conf.get(session.SHUFFLE_PARTITIONS) == "2"
    assert spark.read.format("pcap").load(str(_PLANTED)).count() == 43


_PLANTED = Path(__file__).resolve().parents[2] / "captures" / "corpus" / "planted.pcap"


def test_the_project_zip_holds_every_module_of_the_shipped_packages(tmp_path: Path) -> None:
    import zipfile

    import spark_analysis
    import wire

    path = session.project_zip()
    assert session.project_zip() == path  # built once per process
    with zipfile.ZipFile(path) as archive:
        names = set(archive.namelist())
    for package in (spark_analysis, wire):
        root = Path(package.__file__ or "").parent
        expected = {f"{root.name}/{p.relative_to(root).as_posix()}" for p in root.rglob("*.py")
                    if "__pycache__" not in p.parts}
        assert expected and expected <= names
    assert not [n for n in names if not n.endswith(".py")]  # no compiled modules, no caches
    # the command of the README writes the same bytes
    import subprocess
    import sys

    written = tmp_path / "ump.zip"
    done = subprocess.run([sys.executable, "-m", "spark_analysis.session", "--zip",
                           str(written)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == str(written), done.stderr
    assert written.read_bytes() == Path(path).read_bytes()


def test_workers_run_this_interpreter_on_this_host(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.delenv("PYSPARK_PYTHON", raising=False)
    assert session.worker_python("local[*]") == sys.executable
    assert session.worker_python("local-cluster[2,1,1024]") == sys.executable
    assert session.worker_python("spark://127.0.0.1:7077") == sys.executable
    assert session.worker_python("spark://localhost:7077,127.0.0.2:7078") == sys.executable
    # an address of another machine (TEST-NET-3), or any of the masters there: Spark's rule
    assert session.worker_python("spark://203.0.113.7:7077") is None
    assert session.worker_python("spark://127.0.0.1:7077,203.0.113.7:7077") is None
    assert session.worker_python("yarn") is None
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python3")  # the user's choice stands
    assert session.worker_python("local[*]") is None


_START = """
import sys
from spark_analysis.session import get_spark
extra = dict([sys.argv[2:4]]) if len(sys.argv) > 2 else {}
spark = get_spark(master="local[1]", quiet=sys.argv[1] == "quiet", log_level="ERROR",
                  config={"spark.ui.enabled": "false", **extra})
print(spark.range(5).count())
"""


def _start(*argv: str) -> Any:
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    return subprocess.run([sys.executable, "-c", _START, *argv], capture_output=True,
                          text=True, timeout=300, env=env)


def test_start_up_banner_is_held_back_unless_asked_for() -> None:
    quiet = _start("quiet")
    assert quiet.returncode == 0 and quiet.stdout.strip() == "5", quiet.stderr
    assert quiet.stderr == ""
    loud = _start("verbose")
    assert loud.returncode == 0 and loud.stdout.strip() == "5", loud.stderr
    assert "log4j" in loud.stderr  # "Using Spark's default log4j profile: ..."


def test_a_failed_start_shows_what_the_jvm_said() -> None:
    failed = _start("quiet", "spark.driver.memory", "12xyz")
    assert failed.returncode != 0
    assert "12xyz" in failed.stderr  # the launcher's own complaint, held back and then shown
