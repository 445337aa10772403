"""``ump receiver --out`` that cannot be used: one line naming the file, exit status 2, nothing
started and nothing written (issue 22 follow-up: a directory, or a file that is not a delivery
log under ``--dedupe``, gave tracebacks or wrote into a stranger's file).

Runs ``ump`` in this process with the part that would start the receiver replaced, so each
case takes milliseconds; one case runs the real console script to see the whole path.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import reference_impl.cli
from ump.cli import main

Ump = Callable[..., tuple[int, str]]
"""``ump(*argv)`` -> (exit status, stderr)."""


@pytest.fixture
def ump(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Ump:
    """``ump ARGS`` in this process; getting as far as starting the receiver fails the test."""

    def started(*_: object) -> int:
        raise AssertionError("the receiver would start")

    monkeypatch.setattr(reference_impl.cli, "_run", started)

    def run(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(list(argv))
        return code, capsys.readouterr().err

    return run


def assert_one_line_error(code: int, err: str, *names: str) -> None:
    assert code == 2, err
    assert "Traceback" not in err
    assert err.startswith("ump receiver: ") and err.endswith("\n"), err
    assert err.splitlines() == [err[:-1]], repr(err)
    for name in names:
        assert name in err, err


def test_out_is_a_directory(ump: Ump, tmp_path: Path) -> None:
    for dedupe in ([], ["--dedupe"]):
        code, err = ump("receiver", "--topic", "t", "--out", str(tmp_path), *dedupe)
        assert_one_line_error(code, err, str(tmp_path), "--out", "directory")


def test_out_in_a_missing_directory(ump: Ump, tmp_path: Path) -> None:
    out = tmp_path / "nowhere" / "deliveries.jsonl"
    code, err = ump("receiver", "--topic", "t", "--out", str(out))
    assert_one_line_error(code, err, str(out), "--out")
    assert not out.parent.exists()


def test_a_non_utf8_out_file_under_dedupe_is_refused_at_its_line(ump: Ump,
                                                                 tmp_path: Path) -> None:
    """The delivery log is JSON lines written by ``ump receiver`` (ASCII): a file with bytes
    that are not UTF-8 is someone else's, so --dedupe neither guesses floors from it nor
    appends to it."""
    out = tmp_path / "deliveries.jsonl"
    data = b'{"sqn": 0, "rx": false}\n{"sqn": 1, "rx": false}\n\xff\xfe garbage\n'
    out.write_bytes(data)
    code, err = ump("receiver", "--topic", "t", "--out", str(out), "--dedupe")
    assert_one_line_error(code, err, f"{out}:3:", "UTF-8", "--dedupe")
    assert out.read_bytes() == data


def test_a_delivery_log_cut_by_a_crash_is_still_read(ump: Ump, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The control case: a log whose last line a crash cut is a delivery log; the receiver
    starts (here: reaches the start)."""
    out = tmp_path / "deliveries.jsonl"
    out.write_text('{"sqn": 0, "rx": false}\n{"sqn": 1, "r')
    monkeypatch.setattr(reference_impl.cli, "_run", lambda *_: 0)
    code, err = ump("receiver", "--topic", "t", "--out", str(out), "--dedupe")
    assert (code, err) == (0, "")


def test_the_console_script_gives_the_same_line(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("ump")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "ump"]
    done = subprocess.run([*command, "receiver", "--topic", "t", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert_one_line_error(done.returncode, done.stderr, str(tmp_path))
