"""``python -m benchmarks.store``'s transport figures (issue 20): the memory figure with the
source on LBT-RU and on LBT-RM, measured beside LBT-TCP in one run, every message stable.
Figures themselves are not judged here (the benchmark reports, it never fails on a target)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

import benchmarks.store as bench
from tests.reference_impl.loopback import free_port


def test_lbtru_and_lbtrm_rows_beside_lbttcp(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figures.json"
    code = bench.main(["--only", "memory,memory-lbtru,memory-lbtrm", "--count", "3000",
                       "--limit", "60", "--store-port", str(free_port()),
                       "--resolver-port", str(free_port(socket.SOCK_DGRAM)), "--json", str(out)])
    assert code == 0
    figures = [f["name"] for f in json.loads(out.read_text())["figures"]]
    assert figures == ["memory", "memory-lbtru", "memory-lbtrm"]
    for figure in json.loads(out.read_text())["figures"]:
        assert figure["completed"] == figure["count"] == 3000, figure
        assert figure["per_second"] > 0
    printed = capsys.readouterr().out
    assert "source on LBT-RU" in printed and "source on LBT-RM" in printed


def test_the_lbtrm_source_runs_unthrottled_on_a_group_of_its_own() -> None:
    sections = bench._transport_options("lbt-rm")
    assert sections["source"]["transport"] == "lbt-rm"
    assert sections["context"]["transport_lbtrm_data_rate_limit"] == bench.LBTRM_RATE_LIMIT
    port = sections["source"]["transport_lbtrm_destination_port"]
    assert isinstance(port, int) and port != 14400
    assert bench._transport_options("tcp") == {}
    assert bench._transport_options("lbt-ru") == {"source": {"transport": "lbt-ru"}}
