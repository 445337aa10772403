"""The README's conformance commands, typed as a new user types them: from a fresh, empty
working directory, with the relative paths the README shows (``--out conform-out``, the
default ``conform-out``, a profile file next to its own helper scripts).

Each command runs as a subprocess whose working directory is a fresh temporary directory, so
nothing here depends on the repository being the current directory.  The case selection
(``-k``) keeps each run to one or two cases; the README's full commands are the same code
path with more cases.
"""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest


def _ump() -> list[str]:
    """The ``ump`` command the README types: the console script installed next to this
    interpreter, or the module when the script is not installed."""
    script = Path(sys.executable).with_name("ump")
    return [str(script)] if script.exists() else [sys.executable, "-m", "ump"]


def _fresh(tmp_path: Path) -> Path:
    where = tmp_path / "fresh"
    where.mkdir()
    return where


def _run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=env)


def _verdicts(out: Path) -> dict[str, str]:
    data = json.loads((out / "results.json").read_text())
    return {c["id"]: c["verdict"] for c in data["cases"]}


def test_conform_with_a_relative_out_directory(tmp_path: Path) -> None:
    # README: ump conform --out conform-out
    cwd = _fresh(tmp_path)
    proc = _run([*_ump(), "conform", "--out", "conform-out",
                 "-k", "REG-STORE-001 or REG-STORE-004"], cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 pass" in proc.stdout
    out = cwd / "conform-out"
    assert _verdicts(out) == {"REG-STORE-001": "pass", "REG-STORE-004": "pass"}
    assert (out / "cases" / "REG-STORE-001" / "evidence.pcap").stat().st_size > 24
    assert (out / "report.html").exists() and (out / "junit.xml").exists()


@pytest.mark.parametrize(("iut", "case"), [("source", "SRC-REG-001"),
                                           ("receiver", "RCV-REG-003")])
def test_conform_a_reference_client_with_the_default_out(tmp_path: Path, iut: str,
                                                         case: str) -> None:
    # README: ump conform --iut source / ump conform --iut receiver (default --out conform-out)
    cwd = _fresh(tmp_path)
    proc = _run([*_ump(), "conform", "--iut", iut, "-k", case], cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _verdicts(cwd / "conform-out") == {case: "pass"}


def test_the_pytest_plugin_from_a_fresh_directory(tmp_path: Path) -> None:
    # README: pytest -p conformance.pytest_plugin --iut acme-store.toml --junitxml=j.xml
    cwd = _fresh(tmp_path)
    proc = _run([sys.executable, "-m", "pytest", "-p", "conformance.pytest_plugin",
                 "--iut", "store", "--junitxml=j.xml", "-k", "REG-STORE-001", "-q",
                 "-p", "no:cacheprovider"], cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "1 passed" in proc.stdout
    assert 'failures="0"' in (cwd / "j.xml").read_text()
    assert _verdicts(cwd / "conform-out") == {"REG-STORE-001": "pass"}


def _store_wrapper(where: Path) -> None:
    """A program that starts the reference store the way a third-party store is started."""
    (where / "run_store.py").write_text(
        "import runpy, sys\n"
        "sys.argv = ['ump', 'store', '-c', sys.argv[1]]\n"
        "runpy.run_module('ump', run_name='__main__')\n")
    script = where / "run-store.sh"
    script.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$(dirname "$0")/run_store.py" '
                      f'"$1"\n')
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize("launch", ["./run-store.sh {config}",
                                    "{python} ./run_store.py {config}",
                                    "{python} ../profiles/run_store.py {config}"],
                         ids=["program", "argument", "parent"])
def test_a_profile_launch_path_is_relative_to_the_profile_file(tmp_path: Path,
                                                                launch: str) -> None:
    # README: ump conform --iut acme-store.toml ...; the profile lives in its own directory
    cwd = _fresh(tmp_path)
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    _store_wrapper(profiles)
    (profiles / "acme-store.toml").write_text(
        f'[iut]\nname = "wrapped store"\nrole = "store"\nlaunch = "{launch}"\n'
        f'ready = "ready to accept registrations"\n')
    proc = _run([*_ump(), "conform", "--iut", "../profiles/acme-store.toml",
                 "--suite", "registration", "-k", "REG-STORE-001"], cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _verdicts(cwd / "conform-out") == {"REG-STORE-001": "pass"}


def test_the_stores_own_otr_case(tmp_path: Path) -> None:
    # README: ump conform --suite otr -k OTR-STORE-003 --out store-otr-out
    cwd = _fresh(tmp_path)
    proc = _run([*_ump(), "conform", "--suite", "otr", "-k", "OTR-STORE-003",
                 "--out", "store-otr-out"], cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _verdicts(cwd / "store-otr-out") == {"OTR-STORE-003": "pass"}
    lbm = next((cwd / "store-otr-out").rglob("lbm.cfg")).read_text()
    assert "receiver use_otr 1" in lbm.splitlines()
