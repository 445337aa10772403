"""Passive conformance (``ump conform --capture``, issue 21): the same cases judged over
captured traffic.

* the reference's own captures (``ump demo`` on both transports, captures/reference and the
  committed corpus) are judged with no false ``fail``, and the cases that can decide something
  there pass;
* captures of demo deployments with a mutant store or source fail the case holding the broken
  rule (PASSIVE_CATCHES);
* bad input: a file that is not a capture is one line and exit code 2; a capture without UM, a
  truncated one and one that starts mid-stream give ``unsupported`` with the reason, never
  ``fail``;
* the judges decide from the model (hand-built observations that break one rule each).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conformance.model import Verdict, all_cases
from conformance.passive.judge import ACTIVE_ONLY, PassiveResult, judge, passive_cases
from conformance.passive.observe import (
    Ack,
    Data,
    Observed,
    PregResp,
    Registration,
    Rxreq,
    Tpkt,
    observe,
)
from reference_impl.config.client import load_client_config, parse_client_config
from reference_impl.demo import Demo, Started
from reference_impl.run_frames import keep_run_frames
from wire.pcap import PcapWriter, read_capture
from wire.tshark import PortMap

ROOT = Path(__file__).resolve().parents[2]
MUTANT_STORE = Path(__file__).with_name("mutant_store.py")
MUTANT_CLIENT = Path(__file__).with_name("mutant_client.py")

PASSIVE_CATCHES = {
    # mutant -> (role it replaces in the demo, the cases that must fail)
    "forgets-old-flag": ("store", {"REG-STORE-004", "REG-STORE-010"}),
    "wrong-low-sqn": ("store", {"REG-STORE-010"}),
    "ignores-store-sqn": ("source", {"SRC-REG-003"}),
    # judged with the demo's configuration files (--source-config / --receiver-config)
    "ignores-outstanding-maximum": ("receiver", {"RCV-REC-002"}),
    "no-consumption-ack": ("receiver", {"RCV-REC-005"}),
}


def _judged(paths: list[Path], configs: Path | None = None,
            ports: PortMap | None = None) -> list[PassiveResult]:
    """The verdicts over ``paths``; with the demo's UM configuration files from ``configs``
    (its work directory) as ``--source-config`` / ``--receiver-config`` give them."""
    obs = observe(paths, ports)
    if configs is not None:
        obs.source_options = load_client_config(configs / "source.cfg").source
        obs.receiver_options = load_client_config(configs / "receiver.cfg").receiver
    return judge(obs, passive_cases())


def _verdicts(results: list[PassiveResult], case_id: str) -> set[Verdict]:
    return {r.verdict for r in results if r.spec.id == case_id}


def _no_fail(results: list[PassiveResult]) -> None:
    fails = [f"{r.spec.id} {r.message}" for r in results if r.verdict is Verdict.FAIL]
    assert not fails, fails


# --- demo captures, reference and mutants --------------------------------------------------


class CapturedDemo(Demo):
    """``ump demo`` with one process replaced by a mutant (tests/conformance/mutant_*.py)."""

    def __init__(self, workdir: Path, transport: str, mutant: str | None = None,
                 role: str | None = None) -> None:
        super().__init__(240, workdir, 0, "current", transport, 0)
        self.mutant, self.role = mutant, role

    def _ump(self, name: str, args: list[str], *, ready: str, doing: str,
             timeout: float, status: int, addresses: tuple[str, ...] = (),
             option: str = "") -> Started:
        if self.mutant is None or name != self.role:
            return super()._ump(name, args, ready=ready, doing=doing, timeout=timeout,
                                status=status, addresses=addresses, option=option)
        # Demo._ump with the mutant's script in front of the same arguments
        command = ([sys.executable, str(MUTANT_STORE), self.mutant, *args[1:]]
                   if name == "store" else
                   [sys.executable, str(MUTANT_CLIENT), self.mutant, *args])
        path = self.dir / f"{name}.log"
        with path.open("ab") as log:
            offset = log.tell()
            proc = subprocess.Popen([*command, "--profile", self.profile, "-v"],
                                    cwd=self.dir, stdout=log, stderr=log,
                                    env={**os.environ, "PYTHONPATH": str(ROOT)})
        started = Started(name, proc, path, offset, ready, doing, addresses, timeout, status,
                          time.monotonic(), option)
        self.procs[name] = started
        self.history.append(started)
        return started


def _capture_demo(tmp: Path, transport: str, mutant: str | None = None,
                  role: str | None = None) -> Path:
    """Run the demo (with a mutant) and capture it, as ``ump demo --capture`` does."""
    from reference_impl.capture import LoopbackCapture

    demo = CapturedDemo(tmp / "work", transport, mutant, role)
    demo.prepare()
    pcap = tmp / "demo.pcap"
    ports = [demo.port, demo.resolver_port, *range(14360, 14396)]
    with LoopbackCapture(pcap, ports=ports):
        code = demo.run()
    keep_run_frames(pcap, demo.own_ports())
    if mutant is None:
        assert code == 0, sorted(p.name for p in (tmp / "work").iterdir())
    return pcap


@pytest.mark.parametrize("transport", ["tcp", "lbt-ru"])
def test_demo_capture_is_judged_all_pass(tmp_path: Path, transport: str) -> None:
    pcap = _capture_demo(tmp_path, transport)
    results = _judged([pcap])
    _no_fail(results)
    configured = _judged([pcap], tmp_path / "work")  # configured limits judged exactly
    _no_fail(configured)
    assert _verdicts(configured, "RCV-REC-002") == {Verdict.PASS}
    assert Verdict.PASS in _verdicts(configured, "SRC-REC-002")
    # what a demo shows (a receiver and a source killed and restarted) is decided, and passes
    for case_id in ("REG-STORE-001", "REG-STORE-003", "REG-STORE-004", "REG-STORE-010",
                    "SRC-REG-003", "SRC-REG-004", "PSV-STORE-001", "PSV-STORE-002"):
        assert _verdicts(results, case_id) == {Verdict.PASS}, case_id
    for r in results:
        if r.verdict is Verdict.PASS:
            assert r.decided_by, r.spec.id  # every verdict cites its frames


@pytest.mark.parametrize("mutant", sorted(PASSIVE_CATCHES))
def test_a_mutant_demo_fails_the_case_of_its_rule(tmp_path: Path, mutant: str) -> None:
    role, cases = PASSIVE_CATCHES[mutant]
    results = _judged([_capture_demo(tmp_path, "tcp", mutant, role)], tmp_path / "work")
    for case_id in cases:
        assert Verdict.FAIL in _verdicts(results, case_id), (
            case_id, [(r.spec.id, r.verdict.value, r.message) for r in results
                      if r.message != ACTIVE_ONLY])
        failing = [r for r in results if r.spec.id == case_id and r.verdict is Verdict.FAIL]
        assert all(r.decided_by for r in failing)
    # the command says so too: exit code 1, the case's line
    work = tmp_path / "work"
    cli = _ump("conform", "--capture", "demo.pcap", "--source-config", str(work / "source.cfg"),
               "--receiver-config", str(work / "receiver.cfg"), "--out", "out", cwd=tmp_path)
    assert cli.returncode == 1, cli.stdout + cli.stderr
    for case_id in cases:
        assert any(line.startswith(case_id) and " fail " in line
                   for line in cli.stdout.splitlines()), cli.stdout


@pytest.mark.parametrize("name", sorted(
    [p.name for p in (ROOT / "captures" / "reference").glob("*.pcap")]
    + ["corpus/basic.pcap", "corpus/restarts.pcap", "corpus/lossy-lbtrm.pcap"]))
def test_committed_captures_have_no_false_failure(name: str) -> None:
    base = ROOT / "captures" / ("" if "/" in name else "reference")
    _no_fail(_judged([base / name]))


CORPUS = ROOT / "captures" / "corpus"
EXPECTED = CORPUS / "expected-conform"
"""``<capture>.json``: the passive verdicts of each corpus capture (``UMP_UPDATE_EXPECTED=1``
rewrites them; review the diff)."""


def verdict_rows(path: Path) -> list[dict[str, object]]:
    """The passive verdicts of ``path`` as the expected files hold them: every case that
    judged something or said why not, with its entity and deciding frames (cases judged only
    actively are left out, so a new active case does not touch these files)."""
    rows: list[dict[str, object]] = [
        {"case": r.spec.id, "entity": r.entity, "verdict": r.verdict.value,
         "frames": r.decided_by, "message": r.message}
        for r in _judged([path], ports=PortMap(store_ports=[14567]))  # the corpus's port
        if r.message != ACTIVE_ONLY]
    return sorted(rows, key=lambda row: (str(row["case"]), str(row["entity"]),
                                         str(row["message"])))


@pytest.mark.parametrize("name", ["basic", "qc3", "lossy-lbtrm", "restarts", "real-traits",
                                  "fragments", "not-um", "planted"])
def test_corpus_verdicts_match_the_expected_files(name: str) -> None:
    rows = verdict_rows(CORPUS / f"{name}.pcap")
    expected = EXPECTED / f"{name}.json"
    if os.environ.get("UMP_UPDATE_EXPECTED"):
        EXPECTED.mkdir(exist_ok=True)
        expected.write_text(json.dumps(rows, indent=1) + "\n")
    assert rows == json.loads(expected.read_text()), (
        f"passive verdicts of {name}.pcap changed: rerun with UMP_UPDATE_EXPECTED=1 and review "
        f"the diff of {expected.relative_to(ROOT)}")


def test_planted_anomalies_fail_their_cases() -> None:
    """captures/corpus/planted.pcap (hand-built, tests/spark_analysis/analysis_corpus.py) plants
    anomalies; those a requirement forbids fail its case."""
    rows = verdict_rows(CORPUS / "planted.pcap")
    failing = {str(r["case"]) for r in rows if r["verdict"] == "fail"}
    assert failing == {
        "PSV-RCV-002",  # a NAK for a number the session had not reached
        "QRM-STORE-001",  # two receivers granted one RegID, the first still acknowledging
        "PSV-STORE-002",  # a stability ACK for a sequence number never sent
    }


def test_restarts_corpus_decides_receiver_and_source_reregistration() -> None:
    results = _judged([ROOT / "captures" / "corpus" / "restarts.pcap"])
    assert _verdicts(results, "REG-STORE-010") == {Verdict.PASS}
    assert _verdicts(results, "REG-STORE-004") == {Verdict.PASS}
    # a source of three stores: where it resumes depends on its consensus behaviour
    assert _verdicts(results, "SRC-REG-003") == {Verdict.UNSUPPORTED}


# --- bad input --------------------------------------------------------------------------------


def _ump(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ump", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300)


def test_a_file_that_is_not_a_capture_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bad = tmp_path / "notes.txt"
    bad.write_text("hello, not a pcap\n")
    result = _ump("conform", "--capture", str(bad), "--out", "out", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert "not a readable capture" in result.stderr
    missing = _ump("conform", "--capture", "nowhere.pcap", cwd=tmp_path)
    assert missing.returncode == 2 and "no such file" in missing.stderr


def test_a_capture_without_um_is_unsupported_with_the_reason() -> None:
    results = _judged([ROOT / "captures" / "corpus" / "not-um.pcap"])
    judged = [r for r in results if r.message != ACTIVE_ONLY]
    assert judged and {r.verdict for r in judged} == {Verdict.UNSUPPORTED}
    assert all("no UM traffic" in r.message for r in judged)


def _rewrite(src: Path, dst: Path, keep: slice) -> None:
    records = list(read_capture(src))
    with PcapWriter(dst, linktype=records[0].linktype) as out:
        for rec in records[keep]:
            out.write(rec.ts, rec.data)


def test_a_capture_starting_mid_stream_is_never_failed(tmp_path: Path) -> None:
    # the restarts corpus from its middle on: registrations, ACKs and data cut apart
    src = ROOT / "captures" / "corpus" / "restarts.pcap"
    total = sum(1 for _ in read_capture(src))
    for start in (total // 5, total // 3, total // 2):
        part = tmp_path / f"from-{start}.pcap"
        _rewrite(src, part, slice(start, None))
        results = _judged([part])
        _no_fail(results)
    only_data = tmp_path / "late.pcap"
    _rewrite(src, only_data, slice(total - 200, None))
    late = [r for r in _judged([only_data]) if r.message != ACTIVE_ONLY]
    assert {r.verdict for r in late} <= {Verdict.UNSUPPORTED, Verdict.INFORMATIONAL,
                                        Verdict.PASS}


def test_a_truncated_capture_is_judged_up_to_the_damage(tmp_path: Path) -> None:
    src = ROOT / "captures" / "corpus" / "restarts.pcap"
    data = src.read_bytes()
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(data[: len(data) // 2 + 7])  # ends inside a record
    obs = observe([cut])
    assert any("damaged" in p for p in obs.problems)
    results = judge(obs, passive_cases())
    _no_fail(results)
    assert any(r.verdict is Verdict.PASS for r in results)  # what was captured is judged
    result = _ump("conform", "--capture", str(cut), "--out", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "damaged" in result.stderr


# --- the command and its reports ---------------------------------------------------------------


def test_conform_capture_writes_the_reports_with_entities_and_frames(tmp_path: Path) -> None:
    pcap = ROOT / "captures" / "corpus" / "restarts.pcap"
    result = _ump("conform", "--capture", str(pcap), "--out", "out", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "REG-STORE-010  pass" in result.stdout
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    cases = data["cases"]
    ids = {c["id"] for c in cases}
    assert {c.id for c in all_cases()} <= ids  # every case, judged or "judged only actively"
    judged = [c for c in cases if c["verdict"] == "pass"]
    assert judged and all(c["entity"] and c["decided_by"] for c in judged)
    active_only = [c for c in cases if c["message"] == ACTIVE_ONLY]
    assert active_only and all(c["verdict"] == "unsupported" for c in active_only)
    html = (tmp_path / "out" / "report.html").read_text()
    assert "ump dissect" in html and "--store-port 14567" in html
    assert "(passive: every store, source and receiver seen)" in html
    junit = (tmp_path / "out" / "junit.xml").read_text()
    assert "[store 127.3.0.1:14567]" in junit


def test_the_same_case_objects_are_judged_actively_and_passively() -> None:
    specs = {c.id: c for c in passive_cases()}
    for case_id in ("REG-STORE-004", "REG-STORE-010", "SRC-REG-003", "RCV-REC-002"):
        active = next(c for c in all_cases() if c.id == case_id)
        assert specs[case_id] is active and active.passive is not None
    assert specs["PSV-STORE-001"].passive is not None
    assert "PSV-STORE-001" not in {c.id for c in all_cases()}  # not in active runs


# --- the judges, on hand-built observations ---------------------------------------------------

STORE = ("10.0.0.9", 14567)
SRC_CONN = ("10.0.0.1", 40000)
TRANSPORT = ("10.0.0.1", 14371)
RCV_CONN = ("10.0.0.2", 40001)


def _reg(frame: int, *, source: bool = True, conn: tuple[str, int] = SRC_CONN,
         reg_id: int = 0, session: int = 0x55, topic: str = "t", granted: int = 77,
         old: bool = False, low: int = 0, high: int = 0, code: int = 0) -> Registration:
    reg = Registration(frame, frame / 10, (conn, STORE), STORE, source, reg_id, 0, 1, 1,
                       topic, session, (conn[0], 14391), False)
    reg.response = PregResp(frame + 1, frame / 10 + 0.01, granted, old, bool(code), code, low,
                            high, False)
    return reg


def _obs(**kw: object) -> Observed:
    obs = Observed([Path("hand-built.pcap")], frames=100, um_frames=100)
    for key, value in kw.items():
        setattr(obs, key, value)
    obs.sri = {(TRANSPORT, STORE, 77): [5]}
    return obs


def _one(obs: Observed, case_id: str) -> list[PassiveResult]:
    return [r for r in judge(obs, [s for s in passive_cases() if s.id == case_id])]


def test_judge_refusal_with_an_unknown_code_fails() -> None:
    obs = _obs(registrations=[_reg(1, granted=0, code=9)])
    assert _verdicts(_one(obs, "PSV-STORE-001"), "PSV-STORE-001") == {Verdict.FAIL}
    obs = _obs(registrations=[_reg(1, granted=0, code=5)])
    assert _verdicts(_one(obs, "PSV-STORE-001"), "PSV-STORE-001") == {Verdict.PASS}


def test_judge_one_regid_for_two_active_sources_fails() -> None:
    first = _reg(1)
    second = _reg(10, conn=("10.0.0.3", 40005), session=0x66)
    ack_later = Ack(20, 2.0, STORE, SRC_CONN, "stability", 3, 0, 1, False)
    obs = _obs(registrations=[first, second], acks=[ack_later])
    assert _verdicts(_one(obs, "REG-STORE-003"), "REG-STORE-003") == {Verdict.FAIL}
    obs = _obs(registrations=[first, second], acks=[])  # the first one went quiet
    assert _verdicts(_one(obs, "REG-STORE-003"), "REG-STORE-003") == {Verdict.PASS}


def test_judge_stability_ack_before_the_data_fails() -> None:
    data = [Data(30, 3.0, TRANSPORT, ("10.0.0.2", 50000), 1, 0, "data")]
    early = Ack(25, 2.5, STORE, SRC_CONN, "stability", 0, 0, 1, False)
    late = Ack(31, 3.1, STORE, SRC_CONN, "stability", 0, 0, 1, False)
    obs = _obs(registrations=[_reg(1)], data=data, acks=[early])
    assert _verdicts(_one(obs, "PSV-STORE-002"), "PSV-STORE-002") == {Verdict.FAIL}
    obs = _obs(registrations=[_reg(1)], data=data, acks=[late])
    assert _verdicts(_one(obs, "PSV-STORE-002"), "PSV-STORE-002") == {Verdict.PASS}


def test_judge_configured_limits_fail_only_with_the_configuration() -> None:
    reqs = [Rxreq(10 + i, 1.0 + i / 100, RCV_CONN, STORE, 5, i) for i in range(6)]
    recv = _reg(2, source=False, conn=RCV_CONN, granted=5)
    obs = _obs(registrations=[_reg(1), recv], rxreqs=reqs)
    assert _verdicts(_one(obs, "RCV-REC-002"), "RCV-REC-002") == {Verdict.INFORMATIONAL}
    cfg = parse_client_config("receiver retransmit_request_outstanding_maximum 4\n")
    obs.receiver_options = cfg.receiver
    assert _verdicts(_one(obs, "RCV-REC-002"), "RCV-REC-002") == {Verdict.FAIL}
    cfg = parse_client_config("receiver retransmit_request_outstanding_maximum 6\n")
    obs.receiver_options = cfg.receiver
    assert _verdicts(_one(obs, "RCV-REC-002"), "RCV-REC-002") == {Verdict.PASS}


def test_judge_flight_size_from_the_source_configuration() -> None:
    data = [Data(10 + i, 1.0 + i, TRANSPORT, ("10.0.0.2", 50000), 1, i, "data")
            for i in range(5)]
    acks = [Ack(30, 9.0, STORE, SRC_CONN, "stability", 0, 0, 1, False)]
    obs = _obs(registrations=[_reg(1)], data=data, acks=acks)
    assert _verdicts(_one(obs, "SRC-REC-002"), "SRC-REC-002") == {Verdict.INFORMATIONAL}
    obs.source_options = parse_client_config("source ume_flight_size 3\n").source
    assert _verdicts(_one(obs, "SRC-REC-002"), "SRC-REC-002") == {Verdict.FAIL}
    obs.source_options = parse_client_config("source ume_flight_size 5\n").source
    assert _verdicts(_one(obs, "SRC-REC-002"), "SRC-REC-002") == {Verdict.PASS}


def test_judge_receiver_low_sqn_is_last_ack_plus_one() -> None:
    first = _reg(1, source=False, conn=RCV_CONN, granted=5)
    ack = Ack(5, 0.5, RCV_CONN, STORE, "consumption", 41, 5, 5, False)
    good = _reg(10, source=False, conn=("10.0.0.2", 40009), granted=5, old=True, low=42)
    bad = _reg(10, source=False, conn=("10.0.0.2", 40009), granted=5, old=True, low=43)
    plain = _reg(10, source=False, conn=("10.0.0.2", 40009), granted=5, old=False, low=42)
    for again, verdict in ((good, Verdict.PASS), (bad, Verdict.FAIL), (plain, Verdict.FAIL)):
        obs = _obs(registrations=[_reg(0), first, again], acks=[ack])
        assert _verdicts(_one(obs, "REG-STORE-010"), "REG-STORE-010") == {verdict}


def test_judge_consumption_acks_name_the_assigned_regid() -> None:
    recv = _reg(2, source=False, conn=RCV_CONN, granted=5)
    recv.src_reg_id = 77
    data = [Data(10, 1.0, TRANSPORT, ("10.0.0.2", 50000), 1, 0, "data"),
            Data(90, 9.0, TRANSPORT, ("10.0.0.2", 50000), 1, 1, "data")]
    good = Ack(11, 1.1, RCV_CONN, STORE, "consumption", 0, 5, 5, False)
    other = Ack(11, 1.1, RCV_CONN, STORE, "consumption", 0, 6, 6, False)
    for acks, verdict in (([good], Verdict.PASS), ([other], Verdict.FAIL)):
        obs = _obs(registrations=[_reg(1), recv], data=data, acks=acks)
        assert _verdicts(_one(obs, "RCV-REC-005"), "RCV-REC-005") == {verdict}
    obs = _obs(registrations=[_reg(1), recv], data=data, acks=[])
    assert _verdicts(_one(obs, "RCV-REC-005"), "RCV-REC-005") == {Verdict.INFORMATIONAL}
    obs.receiver_options = parse_client_config("receiver ume_explicit_ack_only 0\n").receiver
    # only the source's data seen: it may have gone to another listener
    assert _verdicts(_one(obs, "RCV-REC-005"), "RCV-REC-005") == {Verdict.INFORMATIONAL}
    obs.data = [*data, Data(20, 2.0, STORE, RCV_CONN, 1, 0, "retrans")]  # delivered to it
    assert _verdicts(_one(obs, "RCV-REC-005"), "RCV-REC-005") == {Verdict.FAIL}


def test_judge_naks_and_ncfs_on_a_transport_session() -> None:
    session = ("lbtrm", "10.0.0.1", 14390, 0x2B)
    src, rcv = ("10.0.0.1", 40000), ("10.0.0.2", 39990)

    def run(*pkts: Tpkt) -> dict[str, set[Verdict]]:
        obs = _obs(transport=list(pkts))
        out = judge(obs, [s for s in passive_cases() if s.id in ("PSV-RCV-002", "PSV-SRC-001")])
        return {c: _verdicts(out, c) for c in ("PSV-RCV-002", "PSV-SRC-001")}

    sm = Tpkt(1, 0.0, session, "sm", [], 10, src)
    nak = Tpkt(2, 0.1, session, "nak", [4, 7], 7, rcv)
    ncf = Tpkt(3, 0.2, session, "ncf", [7], 7, src)
    assert run(sm, nak, ncf) == {"PSV-RCV-002": {Verdict.PASS}, "PSV-SRC-001": {Verdict.PASS}}
    early = Tpkt(2, 0.1, session, "nak", [4, 12], 12, rcv)  # 12 is past the leading edge 10
    stray = Tpkt(3, 0.2, session, "ncf", [9], 9, src)  # 9 was never NAKed
    assert run(sm, early, stray) == {"PSV-RCV-002": {Verdict.FAIL},
                                     "PSV-SRC-001": {Verdict.FAIL}}
    # mid-stream: a NAK before any source traffic, an NCF right after the capture starts
    late = Tpkt(5, 0.3, session, "data", [11], 11, src)
    verdicts = run(Tpkt(1, 0.0, session, "ncf", [3], 3, src), early, late)
    assert verdicts == {"PSV-RCV-002": {Verdict.UNSUPPORTED},
                        "PSV-SRC-001": {Verdict.UNSUPPORTED}}


def test_judge_no_proactive_resend_once_acknowledged_or_nacked() -> None:
    first = Data(10, 1.0, TRANSPORT, ("10.0.0.2", 50000), 1, 0, "data")
    resend = Data(40, 7.0, SRC_CONN, STORE, 1, 0, "prorx")
    ack = Ack(30, 6.0, STORE, SRC_CONN, "stability", 0, 0, 1, False)
    nack = Ack(30, 6.0, STORE, SRC_CONN, "stability", 0, 0, 1, True)
    cfg = parse_client_config("source ume_message_stability_timeout 5000\n").source
    for acks, case_id, verdict in (([], "SRC-PRX-001", Verdict.PASS),
                                   ([ack], "SRC-PRX-001", Verdict.FAIL),
                                   ([nack], "SRC-PRX-004", Verdict.FAIL)):
        again = Data(50, 12.0, SRC_CONN, STORE, 1, 0, "prorx")  # 5 s after the first resend
        obs = _obs(registrations=[_reg(1)], data=[first, resend, again], acks=acks)
        obs.source_options = cfg
        assert _verdicts(_one(obs, case_id), case_id) == {verdict}, (case_id, acks)
    early = Data(40, 3.0, SRC_CONN, STORE, 1, 0, "prorx")  # 2 s after the send, timeout 5 s
    obs = _obs(registrations=[_reg(1)], data=[first, early], acks=[])
    obs.source_options = cfg
    # the first resend is not timed: the timeout runs from the application's send, which
    # may be long before the wire's (LBT-TCP holds messages until a receiver connects)
    assert _verdicts(_one(obs, "SRC-PRX-001"), "SRC-PRX-001") == {Verdict.INFORMATIONAL}
    sooner = Data(45, 5.0, SRC_CONN, STORE, 1, 0, "prorx")  # 2 s after the first resend
    obs = _obs(registrations=[_reg(1)], data=[first, early, sooner], acks=[])
    obs.source_options = cfg
    assert _verdicts(_one(obs, "SRC-PRX-001"), "SRC-PRX-001") == {Verdict.FAIL}


def test_evidence_of_a_conformance_run_against_the_reference_is_judged_without_failure(
        tmp_path: Path) -> None:
    """Each case's evidence.pcap of an active run (the harness's peers and the reference IUT)
    judged passively: no failure, with the store ports the active report names."""
    run = _ump("conform", "--suite", "registration", "--out", "act", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    cases = json.loads((tmp_path / "act" / "results.json").read_text())["cases"]
    judged = 0
    for case in cases:
        if not case["pcap"]:
            continue
        ports = PortMap(store_ports=case["store_ports"])
        results = _judged([tmp_path / "act" / case["pcap"]], ports=ports)
        _no_fail(results)
        judged += any(r.verdict is Verdict.PASS for r in results)
    assert judged >= 10  # most cases' traffic decides something


@pytest.mark.parametrize(("case_id", "catches"), [
    ("SRC-ROB-003", "PSV-STORE-002"),  # the harness store ACKs sequence numbers never sent
    ("SRC-ROB-002", "PSV-STORE-001"),  # the harness store refuses with an unknown error code
])
def test_faults_a_harness_store_plays_on_purpose_are_seen_passively(
        tmp_path: Path, case_id: str, catches: str) -> None:
    run = _ump("conform", "--iut", "source", "-k", case_id, "--out", "act", cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    case = json.loads((tmp_path / "act" / "results.json").read_text())["cases"][0]
    results = _judged([tmp_path / "act" / case["pcap"]],
                      ports=PortMap(store_ports=case["store_ports"]))
    failing = {r.spec.id for r in results if r.verdict is Verdict.FAIL}
    assert failing == {catches}
    assert all(r.entity.startswith("store ") for r in results
               if r.verdict is Verdict.FAIL)  # the harness's store, not the source IUT
