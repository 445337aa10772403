"""The committed reference captures: reproducible, and decoded identically by us and tshark."""

from __future__ import annotations

from pathlib import Path

import pytest

from captures.reference import REFERENCES, STORE_PORT, write_all
from wire.dissect import check_against_tshark, dissect_file
from wire.tshark import PortMap, expert_summary

COMMITTED = Path(__file__).resolve().parents[2] / "captures" / "reference"
PORTS = PortMap(store_ports=[STORE_PORT])


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_committed_capture_equals_a_fresh_generation(name: str, tmp_path: Path) -> None:
    (fresh,) = [p for p in write_all(tmp_path) if p.name == name]
    assert fresh.read_bytes() == (COMMITTED / name).read_bytes(), (
        f"regenerate with: python -m captures.reference ({name} is stale)")


@pytest.mark.oracle
@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_reference_capture_is_tshark_clean(name: str) -> None:
    path = COMMITTED / name
    reports = list(dissect_file(path, PORTS))
    assert all(r.status in ("um", "not-um") for r in reports)
    assert {r.transport for r in reports if r.status == "um"} == {"lbmr", "lbtru", "lbttcp"}
    labels = {o.label for r in reports for o in r.occurrences}
    assert {"PREG", "PREG-RESP", "SRI", "ACK", "RXREQ", "UME-KA", "DATA"} <= labels
    assert check_against_tshark(path, reports, PORTS) == []
    experts = expert_summary(path, PORTS)
    assert "Errors" not in experts and "Warns" not in experts, experts
