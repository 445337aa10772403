"""The store IUT's port: the harness picks a free one, and the IUT binds it a moment later.

Another process (a second ``ump conform`` on the machine, a test run) can take the port in
between; the IUT then cannot listen and exits.  That is the harness's race, not the IUT's
fault, so the harness starts the IUT again on another port instead of reporting an error.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

import conformance.iut as iut_module
from conformance.model import Role, Verdict, all_cases
from conformance.profile import REFERENCE_STORE
from conformance.runner import Runner


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A TCP port another process listens on for the duration of the test."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_store_port_taken_before_the_iut_binds_it_is_replaced(
        tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    picks = iter([taken_port])
    real = iut_module.free_port
    monkeypatch.setattr(iut_module, "free_port", lambda ip="127.0.0.1": next(picks, None)
                        or real(ip))
    (case,) = [c for c in all_cases(Role.STORE) if c.id == "REG-STORE-001"]
    with Runner(REFERENCE_STORE, tmp_path / "out") as runner:
        result = runner.run_case(case)
        assert isinstance(runner.iut, iut_module.StoreUnderTest)
        port = runner.iut.addr[1]
    assert result.verdict is Verdict.PASS, result.message
    assert port != taken_port
    log = (tmp_path / "out" / "iut" / "001" / "iut.log").read_text()
    assert log.count("=== ump conform: start #") == 2  # the first start met the taken port
    assert "address already in use" in log.lower()
