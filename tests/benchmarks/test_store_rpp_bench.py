"""``python -m benchmarks.store``'s RPP figure: measured beside the SPP memory figure in one
run, with two blocking RPP receivers that get every message, and the RPP/SPP ratio printed.
Figures themselves are not judged here (the benchmark reports, it never fails on a target)."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import pytest

import benchmarks.store as bench
from reference_impl.config.store_xml import parse_store_config
from tests.reference_impl.loopback import free_port


def test_rpp_figure_beside_spp_with_the_ratio(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figures.json"
    code = bench.main(["--only", "memory,rpp", "--count", "3000", "--limit", "60",
                       "--store-port", str(free_port()),
                       "--resolver-port", str(free_port(socket.SOCK_DGRAM)), "--json", str(out)])
    assert code == 0
    figures = {f["name"]: f for f in json.loads(out.read_text())["figures"]}
    assert set(figures) == {"memory", "rpp"}
    for figure in figures.values():  # completed: every message stable (RPP: and delivered)
        assert figure["completed"] == figure["count"] == 3000
        assert figure["per_second"] > 0
    printed = capsys.readouterr().out
    ratio = re.search(r"RPP / SPP, memory repository +([\d,]+) / ([\d,]+) msg/s = ratio "
                      r"([\d.]+)", printed)
    assert ratio is not None, printed
    rpp, spp = (float(ratio.group(i).replace(",", "")) for i in (1, 2))
    assert rpp == pytest.approx(figures["rpp"]["per_second"], abs=1)
    assert spp == pytest.approx(figures["memory"]["per_second"], abs=1)
    assert float(ratio.group(3)) == pytest.approx(rpp / spp, abs=0.01)


def test_the_rpp_store_file_allows_rpp_for_the_benchmark_flight() -> None:
    config = parse_store_config(bench.store_xml("memory", 14767, rpp=True))
    (store,) = config.stores
    (topic,) = store.topics
    assert topic.options.repository_allow_receiver_paced_persistence
    assert topic.options.source_flight_size_bytes_maximum == bench.RPP_FLIGHT_BYTES
    assert topic.options.repository_size_threshold > bench.RPP_FLIGHT_BYTES
    spp = parse_store_config(bench.store_xml("memory", 14767)).stores[0].topics[0]
    assert not spp.options.repository_allow_receiver_paced_persistence
