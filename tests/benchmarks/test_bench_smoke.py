"""Smoke test of ``python -m benchmarks.wire``: every section runs and yields positive figures.

Durations are cut to a fraction of a millisecond, so the figures are noisy; this test therefore
asserts only that results exist and are positive.  Speed targets are judged by the benchmark's
own output, never here.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from benchmarks.wire import BenchResults, main, run
from wire import lbmc

NUMPY_COUNT = 1000


@pytest.fixture(scope="module")
def results() -> BenchResults:
    return run(duration=0.0005, repeat=1, numpy_count=NUMPY_COUNT, out=io.StringIO())


def test_every_header_kind_has_positive_figures(results: BenchResults) -> None:
    by_name = {h.kind: h for h in results.headers}
    assert set(by_name) == {k.name for k in lbmc.header_kinds()}
    for kind in lbmc.header_kinds():
        h = by_name[kind.name]
        assert h.size > 0
        assert h.construct_parse.per_second > 0
        assert h.construct_build.per_second > 0
        fast = (h.fast_raw, h.fast_decode, h.fast_pack)
        if kind.fixed:
            assert h.fixed
            assert all(r is not None and r.per_second > 0 for r in fast)
            assert h.parse_ratio is not None and h.parse_ratio > 0
        else:
            assert fast == (None, None, None)
            assert h.parse_ratio is None


def test_messages_columnar_and_transport_rows(results: BenchResults) -> None:
    assert {m.name for m in results.messages} == {
        "control_ume_preg", "control_ume_ack_stable", "data_64"}
    for m in results.messages:
        assert m.size > 0 and m.parse.per_second > 0 and m.build.per_second > 0
    assert results.columnar is not None
    assert results.columnar.count == NUMPY_COUNT
    assert all(results.columnar.headers_per_second(r) > 0 for _, r in results.columnar.rows)
    assert {t.name for t in results.transports} == {"lbtru", "lbtrm", "lbmr", "lbttcp"}
    for t in results.transports:
        assert (t.parse is not None and t.parse.per_second > 0) or t.reason


def test_targets_are_reported_not_asserted(results: BenchResults) -> None:
    targets = results.targets()
    assert len(targets) == 2
    assert all(t.passed in (True, False) and t.worst is not None for t in targets)


def test_command_line_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bench.json"
    status = main(["--kinds", "ume_preg,ume_ack,topicname", "--duration", "0.0005",
                   "--repeat", "1", "--numpy-count", "100", "--json", str(out)])
    assert status == 0
    printed = capsys.readouterr().out
    assert "fast path >= 1,000,000 header parses/s:" in printed
    assert "fast path >= 10x Construct:" in printed
    data = json.loads(out.read_text())
    assert [h["kind"] for h in data["headers"]] == ["topicname", "ume_preg", "ume_ack"]
    assert data["headers"][0]["fast_unpack_from"] is None
    assert data["headers"][1]["fast_unpack_from"]["per_second"] > 0


def test_unknown_kind_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--kinds", "no_such_header", "--duration", "0.0005", "--repeat", "1"]) == 2
    assert "no_such_header" in capsys.readouterr().err
