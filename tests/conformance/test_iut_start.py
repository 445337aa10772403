"""A client IUT counts as started once its process tree holds a socket, so a slow start on a
busy machine is not charged to the case's protocol deadlines (conformance/iut.py)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from conformance.iut import _holds_a_socket

BINDS = "import socket, time; s = socket.socket(); s.bind(('127.0.0.1', 0)); time.sleep(30)"


def _eventually(pid: int, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _holds_a_socket(pid):
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("argv", [
    [sys.executable, "-c", BINDS],
    ["sh", "-c", f'{sys.executable} -c "{BINDS}"; true'],  # a wrapper: the child binds
], ids=["direct", "wrapper"])
def test_a_process_or_its_child_holding_a_socket_is_started(argv: list[str]) -> None:
    proc = subprocess.Popen(argv)
    try:
        assert _eventually(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_process_without_a_socket_is_not_started_yet() -> None:
    proc = subprocess.Popen(["sh", "-c", "sleep 30; true"])
    try:
        time.sleep(0.3)
        assert not _holds_a_socket(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_process_that_is_gone_holds_nothing() -> None:
    proc = subprocess.Popen(["true"])
    proc.wait()
    assert not _holds_a_socket(proc.pid)
