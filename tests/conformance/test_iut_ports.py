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


def test_a_group_member_whose_port_was_taken_restarts_the_group_on_the_ports_it_holds(
        tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    # the second instance of a Quorum/Consensus group is given the taken port: it starts on
    # another, and the others' configurations named the taken one (a CI run's flaky ERROR)
    real_init = iut_module.StoreUnderTest.__init__

    def init(self: iut_module.StoreUnderTest, *args: object, **kwargs: object) -> None:
        real_init(self, *args, **kwargs)  # type: ignore[arg-type]
        if self.workdir.name.endswith("-1"):
            self.addr = (self.addr[0], taken_port)

    monkeypatch.setattr(iut_module.StoreUnderTest, "__init__", init)
    (case,) = [c for c in all_cases(Role.STORE) if c.id == "PXY-STORE-002"]
    with Runner(REFERENCE_STORE, tmp_path / "out") as runner:
        result = runner.run_case(case)
    assert result.verdict is Verdict.PASS, result.message
    text = "".join(path.read_text() for path in (tmp_path / "out").rglob("timeline.json"))
    assert "had to move to another port: the group is started again" in text
    assert f":{taken_port}" not in text.split("started again as", 1)[1].split('"', 1)[0]
