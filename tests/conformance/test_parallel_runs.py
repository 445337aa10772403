"""``ump conform --jobs N``: the same results as a serial run, in case order, without two
concurrent cases sharing a port.

The scheduling rules (segments, ``alone`` cases, results in case order) and the per-worker
port shares are checked without processes; two real runs of a few suites against the reference
store and receiver, serial and with ``--jobs 2``, must write the same JSON results (times,
ports, frame counts and timelines aside) and their evidence must show no TCP port listened on
by two cases that ran at the same time.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from conformance.model import CaseSpec, Role, Strength, Verdict, all_cases
from conformance.net import DEFAULT_PORTS, PortPlan
from conformance.profile import resolve_profile
from conformance.runner import CaseResult, _Schedule, run, segments
from wire.pcap import read_capture

ROOT = Path(__file__).resolve().parents[2]

VARYING = {"seconds", "timeline", "frames", "store_port", "store_ports"}
"""What differs between any two runs (serial or not): times, ports and how many frames a case
took (a keepalive more or less)."""


# --- port shares ----------------------------------------------------------------------------


@pytest.mark.parametrize("workers", [1, 2, 3, 5, 7])
def test_port_shares_split_every_range_without_overlap(workers: int) -> None:
    shares = [DEFAULT_PORTS.share(k, workers) for k in range(workers)]
    for name in ("transport", "request", "resolver"):
        whole = list(getattr(DEFAULT_PORTS, name))
        parts = [list(getattr(s, name)) for s in shares]
        assert sorted(itertools.chain(*parts)) == whole, name
        for a, b in itertools.combinations(parts, 2):
            assert not set(a) & set(b), name
    assert list(shares[0].resolver) == [15380]  # the first worker keeps the lbmrd port


def test_rotation_stays_in_the_share_and_moves_on() -> None:
    plan = DEFAULT_PORTS.share(1, 2)
    firsts = []
    for _ in range(len(plan.request)):
        ports = plan.rotated(plan.request)
        assert sorted(ports) == list(plan.request)
        firsts.append(ports[0])
    # each call starts elsewhere, however many other workers rotate meanwhile
    assert sorted(firsts) == list(plan.request)
    assert PortPlan(request=range(0)).rotated(range(0)) == []


def test_a_share_must_name_a_worker_of_the_run() -> None:
    with pytest.raises(ValueError):
        DEFAULT_PORTS.share(2, 2)


# --- scheduling -----------------------------------------------------------------------------


def _spec(id: str, *, alone: bool = False, restart: bool = False,
          topic: dict[str, str | int] | None = None) -> CaseSpec:
    return CaseSpec(id=id, title=id, suite="registration", role=Role.STORE, section="s",
                    requirement="r", strength=Strength.MUST, run=lambda h: None,
                    topic_options=topic or {}, needs_restart=restart, alone=alone)


def test_segments_are_what_one_iut_process_serves_in_a_serial_run() -> None:
    other: dict[str, str | int] = {"repository-type": "disk"}
    cases = [_spec("A"), _spec("B"), _spec("C", topic=other), _spec("D", topic=other,
             restart=True), _spec("E", topic=other), _spec("F"), _spec("G", alone=True),
             _spec("H"), _spec("I")]
    assert segments(cases, Role.STORE) == [[0, 1], [2, 3], [4], [5], [6], [7, 8]]
    # a source or receiver IUT is a fresh process for every case
    assert segments(cases, Role.SOURCE) == [[i] for i in range(len(cases))]


def test_schedule_reports_in_case_order_and_runs_alone_cases_alone() -> None:
    specs = [_spec(f"C{i:02d}", alone=i in (4, 9), topic={"n": i}) for i in range(14)]
    reported: list[str] = []
    schedule = _Schedule(specs, Role.STORE, lambda r: reported.append(r.spec.id))
    running: set[str] = set()
    overlaps: list[tuple[str, ...]] = []
    lock = threading.Lock()
    rng = random.Random(17)
    delays = [rng.uniform(0.0, 0.03) for _ in specs]

    def worker() -> None:
        while (segment := schedule.take()) is not None:
            for index in segment:
                spec = specs[index]
                with lock:
                    running.add(spec.id)
                    if len(running) > 1 and any(specs[i].alone for i in range(len(specs))
                                                if specs[i].id in running):
                        overlaps.append(tuple(sorted(running)))
                time.sleep(delays[index])
                with lock:
                    running.discard(spec.id)
                schedule.done(index, CaseResult(spec, Verdict.PASS))
            schedule.segment_done(segment)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert reported == [s.id for s in specs]
    assert overlaps == []


# --- real runs ------------------------------------------------------------------------------


def _conform(out: Path, iut: str, suites: list[str], jobs: int) -> dict[str, Any]:
    argv = [sys.executable, "-m", "ump", "conform", "--iut", iut, "--out", str(out),
            "--jobs", str(jobs)]
    for suite in suites:
        argv += ["--suite", suite]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    data: dict[str, Any] = json.loads((out / "results.json").read_text())
    data["stdout"] = proc.stdout
    return data


def _steady(data: dict[str, Any]) -> dict[str, Any]:
    """The results without what varies between any two runs."""
    cases = [{k: v for k, v in c.items() if k not in VARYING} for c in data["cases"]]
    return {**{k: v for k, v in data.items() if k not in {"seconds", "cases", "stdout"}},
            "cases": cases}


def _verdict_lines(stdout: str) -> list[tuple[str, str]]:
    """(case ID, verdict) of each progress line, in printed order."""
    out = []
    for line in stdout.splitlines():
        words = line.split()
        if len(words) > 2 and words[1] in {v.value for v in Verdict} and "-" in words[0]:
            out.append((words[0], words[1]))
    return out


def _span(pcap: Path) -> tuple[float, float]:
    """The times of the case's first and last frames."""
    times = [record.ts for record in read_capture(pcap)]
    return (min(times), max(times)) if times else (0.0, 0.0)


def _harness_ports(case: dict[str, Any]) -> set[int]:
    """The ports of the harness's listeners the IUT connected to in the case (its timeline's
    connections opened by the IUT)."""
    return {int(e["dst"].rsplit(":", 1)[1]) for e in case["timeline"]
            if e["kind"] == "open" and e["from_iut"]}


def _shares(ports: set[int], jobs: int) -> set[int]:
    """Which worker's share (:meth:`PortPlan.share`) each preferred port belongs to."""
    out = set()
    for port in ports:
        for ports_range in (DEFAULT_PORTS.transport, DEFAULT_PORTS.request):
            if port in ports_range:
                out.add((port - ports_range.start) % jobs)
    return out


@pytest.mark.parametrize(("iut", "suites"), [
    ("store", ["registration", "durability", "proactive-retransmit"]),
    ("receiver", ["rpp", "rpp-matrix"]),
])
def test_a_parallel_run_gives_the_serial_results_without_sharing_ports(
        tmp_path: Path, iut: str, suites: list[str]) -> None:
    serial = _conform(tmp_path / "serial", iut, suites, 1)
    parallel = _conform(tmp_path / "parallel", iut, suites, 2)
    assert _steady(parallel) == _steady(serial)
    role = resolve_profile(iut).role
    expected = [c.id for c in all_cases(role) if c.suite in suites]
    assert [c["id"] for c in parallel["cases"]] == expected
    # the printed lines too: in case order, with the serial run's verdicts
    assert _verdict_lines(parallel["stdout"]) == _verdict_lines(serial["stdout"])
    assert len(_verdict_lines(parallel["stdout"])) == len(expected)
    # each worker had its own IUT processes
    workdirs = {p.name.split("-")[0] for p in (tmp_path / "parallel" / "iut").iterdir()}
    assert workdirs == {"w1", "w2"}

    cases = {c["id"]: c for c in parallel["cases"] if c["frames"]}
    spans = {i: _span(tmp_path / "parallel" / c["pcap"]) for i, c in cases.items()}
    overlapping = 0
    for a, b in itertools.combinations(cases, 2):
        (a0, a1), (b0, b1) = spans[a], spans[b]
        if not (a0 < b1 and b0 < a1):
            continue
        # the two cases ran at the same time, so on two workers: their harness peers never
        # listened on the same port, nor on ports of the same worker's share
        overlapping += 1
        pa, pb = _harness_ports(cases[a]), _harness_ports(cases[b])
        assert not pa & pb, f"{a} and {b} both listened on {sorted(pa & pb)}"
        assert not _shares(pa, 2) & _shares(pb, 2), f"{a} {sorted(pa)} and {b} {sorted(pb)}"
    assert overlapping > 0, "no two cases ran at the same time: nothing was parallel"


def test_jobs_must_be_a_positive_whole_number() -> None:
    for bad in ("0", "two"):
        proc = subprocess.run([sys.executable, "-m", "ump", "conform", "--jobs", bad, "--list"],
                              capture_output=True, text=True, timeout=60, cwd=ROOT)
        assert proc.returncode == 2 and "--jobs" in proc.stderr, proc.stderr
    with pytest.raises(ValueError, match="jobs"):
        run(resolve_profile("store"), Path("unused"), jobs=0)


def _other_role_cases(n: int) -> list[CaseSpec]:
    """``n`` receiver cases: against a store IUT each ends ``unsupported`` at once, without
    an IUT process (what the runner's scheduling is tested with below)."""
    return all_cases(Role.RECEIVER)[:n]


def test_a_parallel_run_puts_results_in_case_order(tmp_path: Path) -> None:
    cases = _other_role_cases(7)
    printed: list[str] = []
    result = run(resolve_profile("store"), tmp_path / "out", cases=cases, jobs=3,
                 progress=lambda r: printed.append(r.spec.id))
    assert [r.spec.id for r in result.results] == [c.id for c in cases] == printed
    assert {r.verdict for r in result.results} == {Verdict.UNSUPPORTED}


def test_a_store_at_an_address_runs_its_cases_one_at_a_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One running store names one resolver: ``--jobs`` cannot give each worker its own."""
    import conformance.runner

    def parallel(*args: object, **kwargs: object) -> None:
        raise AssertionError("ran in parallel")

    monkeypatch.setattr(conformance.runner, "_run_parallel", parallel)
    at_address = replace(resolve_profile("store"), launch=None, address=("127.0.0.1", 9))
    result = run(at_address, tmp_path / "out", cases=_other_role_cases(3), jobs=2)
    assert len(result.results) == 3
    with pytest.raises(AssertionError, match="parallel"):
        run(resolve_profile("store"), tmp_path / "out2", cases=_other_role_cases(3), jobs=2)
