"""``ump conform --suite quorum`` against the reference store: every QRM-STORE case passes, the
store logs the retransmission requests naming an unknown RegID, and the cases' timing leaves
each probe on the right side of the timeouts it tells apart.

One run (about 15 s).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conformance.model import Role, all_cases
from conformance.suites import quorum_store as suite

ROOT = Path(__file__).resolve().parents[2]


def _store_cases() -> dict[str, Any]:
    return {c.id: c for c in all_cases(Role.STORE) if c.suite == "quorum"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory
        ) -> tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]:
    out = tmp_path_factory.mktemp("quorum-store") / "out"
    proc = subprocess.run([sys.executable, "-m", "ump", "conform", "--suite", "quorum",
                           "--out", str(out)], capture_output=True, text=True, timeout=300,
                          cwd=ROOT)
    results = json.loads((out / "results.json").read_text()) if \
        (out / "results.json").exists() else {}
    return proc, out, results


def test_every_quorum_store_case_passes_against_the_reference(
        run: tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]) -> None:
    proc, _, results = run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert {c["id"] for c in results["cases"]} == set(_store_cases())
    assert [(c["id"], c["verdict"], c["message"]) for c in results["cases"]
            if c["verdict"] != "pass"] == []


def test_the_store_logs_each_request_naming_an_unknown_regid(
        run: tuple[subprocess.CompletedProcess[str], Path, dict[str, Any]]) -> None:
    _, out, _ = run
    log = (out / "cases" / "QRM-STORE-004" / "iut.log").read_text()
    lines = re.findall(r"WARNING .*RXREQ for sqn (\d+) names unknown receiver RegID (\d+)", log)
    assert [sqn for sqn, _ in lines] == ["1", "2", "3", "1"], log[-3000:]
    assert len({reg_id for _, reg_id in lines}) == 2  # the unknown one, then the source's
    assert all(re.search(r"dropped \d+ bytes from 127\.0\.0\.1:\d+: RXREQ", line)
               for line in log.splitlines() if "names unknown receiver" in line)


def test_the_cases_cover_timeout_both_lifetime_directions_and_unknown_regids() -> None:
    cases = _store_cases()
    assert sorted(cases) == [f"QRM-STORE-{n:03d}" for n in range(1, 7)]
    assert all(c.requirement and c.section for c in cases.values())
    client, store = (cases[i].topic_options for i in ("QRM-STORE-002", "QRM-STORE-003"))
    # the store's value is the long one where the client's must win, and the other way round
    assert store["receiver-state-lifetime"] == suite.SHORT < suite.LONG == \
        client["receiver-state-lifetime"]
    for options in (client, store):
        activity = int(options["receiver-activity-timeout"])
        check = int(options["source-check-interval"])
        # the "still held" probe (1 s after leaving) is past the activity timeout and its
        # check, within the short lifetime; the "deleted" one (4 s) past the lifetime's check
        assert activity + check < 1000 < suite.SHORT
        assert suite.SHORT + check < 4000
    assert int(cases["QRM-STORE-001"].topic_options["receiver-activity-timeout"]) + \
        int(cases["QRM-STORE-001"].topic_options["source-check-interval"]) < 2000
    # QRM-STORE-006: the store's own timeout outlasts the case, the client's (1 s) does not
    assert int(cases["QRM-STORE-006"].topic_options["receiver-activity-timeout"]) == \
        suite.LONG > 15_000 >= cases["QRM-STORE-006"].timeout * 1000
