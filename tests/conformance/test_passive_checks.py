"""The passive judges of SRIs, liveness and the store's retransmission rate
(conformance/passive/checks/sri.py, liveness.py, recovery.py), on hand-built observations, and
``ump conform --capture --store-config``."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conformance.model import Verdict
from conformance.passive.judge import PassiveResult, judge, passive_cases
from conformance.passive.observe import (
    Data,
    Observed,
    PregResp,
    Registration,
    Rxreq,
    Sri,
    StoreEntry,
    Tpkt,
    observe,
)
from reference_impl.config.client import load_client_config
from reference_impl.config.store_xml import (
    StoreDaemonConfig,
    load_store_config,
    parse_store_config,
)
from reference_impl.demo import disk_store_xml
from wire.pcap import PcapWriter, read_capture
from wire.tshark import PortMap

ROOT = Path(__file__).resolve().parents[2]

A = ("10.0.0.9", 14567)
B = ("10.0.0.10", 14567)
CONN_A = ("10.0.0.1", 40000)
CONN_B = ("10.0.0.1", 40001)
TRANSPORT = ("10.0.0.1", 14371)


def _reg(frame: int, t: float, store: tuple[str, int], conn: tuple[str, int],
         granted: int) -> Registration:
    reg = Registration(frame, t, (conn, store), store, True, 0, 0, 1, 1, "topic", 0x55,
                       ("10.0.0.1", 14391), False)
    reg.response = PregResp(frame + 1, t + 0.01, granted, False, False, 0, 0, 0, False)
    return reg


def _sri(frame: int, t: float, version: int, *entries: tuple[tuple[str, int], int, int]) -> Sri:
    return Sri(frame, t, TRANSPORT, 1, version,
               [StoreEntry(store, reg_id, v, i, 0) for i, (store, reg_id, v) in
                enumerate(entries)])


def _obs(**kw: object) -> Observed:
    obs = Observed([Path("hand-built.pcap")], frames=1000, um_frames=1000, end_time=100.0)
    for key, value in kw.items():
        setattr(obs, key, value)
    # the SRIs name the transport: the source's transport is found from them
    for s in obs.sris:
        for e in s.stores:
            obs.sri.setdefault((s.src, e.store, e.reg_id), []).append(s.frame)
    return obs


def _verdicts(obs: Observed, case_id: str) -> set[Verdict]:
    return {r.verdict for r in _judged(obs, case_id)}


def _judged(obs: Observed, case_id: str) -> list[PassiveResult]:
    return judge(obs, [s for s in passive_cases() if s.id == case_id])


# --- SRI content and versions -------------------------------------------------------------


def test_sri_naming_the_granted_regids_passes_and_a_wrong_regid_fails() -> None:
    regs = [_reg(1, 0.1, A, CONN_A, 11), _reg(3, 0.1, B, CONN_B, 22)]
    good = _obs(registrations=regs, sris=[_sri(10, 0.5, 1, (A, 11, 1), (B, 22, 1))])
    assert _verdicts(good, "SRC-REG-006") == {Verdict.PASS}
    # a TIR names the transport, so the wrong SRI is still the source's
    tirs = {("topic", None): {TRANSPORT}}
    bad = _obs(registrations=regs, tirs=tirs,
               sris=[_sri(10, 0.5, 1, (A, 11, 1), (B, 23, 1))])
    results = _judged(bad, "SRC-REG-006")
    assert {r.verdict for r in results} == {Verdict.FAIL}
    assert results[0].decided_by == [3, 4, 10]  # the grant and the SRI


def test_sri_leaving_out_a_store_still_heard_fails_and_a_silent_one_does_not() -> None:
    regs = [_reg(1, 0.1, A, CONN_A, 11), _reg(3, 0.1, B, CONN_B, 22)]
    sris = [_sri(10, 0.5, 1, (A, 11, 1), (B, 22, 1)), _sri(20, 3.0, 1, (A, 11, 1))]
    heard = {(B, CONN_B): [(15, 2.5), (25, 3.5)]}
    assert _verdicts(_obs(registrations=regs, sris=sris, heard=heard),
                     "SRC-REG-006") == {Verdict.FAIL}
    # B last heard 2.4 s before: the source may have declared it unresponsive
    assert _verdicts(_obs(registrations=regs, sris=sris, heard={(B, CONN_B): [(4, 0.6)]}),
                     "SRC-REG-006") == {Verdict.PASS}


def test_sri_versions_rise_with_a_store_that_registered_again() -> None:
    regs = [_reg(1, 0.1, A, CONN_A, 11), _reg(3, 0.1, B, CONN_B, 22)]
    first = _sri(10, 0.5, 1, (A, 11, 1), (B, 22, 1))
    again = _reg(30, 5.0, B, CONN_B, 22)
    later = _sri(40, 5.5, 2, (A, 11, 1), (B, 22, 2))
    assert _verdicts(_obs(registrations=[*regs, again], sris=[first, later]),
                     "SRC-REG-008") == {Verdict.PASS}
    # no re-registration with B: its version may not rise
    assert _verdicts(_obs(registrations=regs, sris=[first, later]),
                     "SRC-REG-008") == {Verdict.FAIL}
    # B re-registered, but the overall version stayed
    same = _sri(40, 5.5, 1, (A, 11, 1), (B, 22, 2))
    assert _verdicts(_obs(registrations=[*regs, again], sris=[first, same]),
                     "SRC-REG-008") == {Verdict.FAIL}
    # a store's version going down (the overall version up: not a restart)
    down = _sri(40, 5.5, 2, (A, 11, 0), (B, 22, 1))
    assert _verdicts(_obs(registrations=regs, sris=[first, down]),
                     "SRC-REG-008") == {Verdict.FAIL}
    # a lower overall version: the source restarted, nothing to compare
    restart = _sri(40, 5.5, 1, (A, 11, 1), (B, 22, 1))
    assert _verdicts(_obs(registrations=regs, sris=[later, restart]),
                     "SRC-REG-008") == {Verdict.UNSUPPORTED}


# --- liveness ---------------------------------------------------------------------------------


STORE_XML = disk_store_xml(
    "s", 14567, "topic", store_options={"retransmission-request-processing-rate": 40},
    topic_options={"keepalive-interval": 500, "source-check-interval": 100})
"""A store on port 14567: 40 retransmissions a second, keepalives every 500 ms."""


def _store_config() -> StoreDaemonConfig:
    return parse_store_config(STORE_XML.encode(), "store.xml")


def test_store_keepalive_silence_is_judged_with_the_store_xml() -> None:
    reg = _reg(1, 0.1, A, CONN_A, 11)
    client = [(f, f / 10) for f in range(10, 60, 5)]  # the source talks until 5.5 s
    quiet = {(CONN_A, A): client, (A, CONN_A): [(12, 1.2), (30, 2.0), (50, 5.0)]}
    obs = _obs(registrations=[reg], heard=quiet)
    assert _verdicts(obs, "PSV-STORE-003") == {Verdict.INFORMATIONAL}
    obs.store_config = _store_config()
    results = _judged(obs, "PSV-STORE-003")
    assert {r.verdict for r in results} == {Verdict.FAIL}  # 3 s silent, limit 0.85 s
    assert results[0].decided_by == [30, 50]
    kept = {(CONN_A, A): client,
            (A, CONN_A): [(f + 1, f / 10 + 0.05) for f in range(5, 60, 5)]}
    obs = _obs(registrations=[reg], heard=kept)
    obs.store_config = _store_config()
    assert _verdicts(obs, "PSV-STORE-003") == {Verdict.PASS}


def test_source_reregisters_with_one_silent_store_only_after_its_activity_timeout(
        tmp_path: Path) -> None:
    cfg = tmp_path / "source.cfg"
    cfg.write_text("source ume_store_activity_timeout 2000\n")
    opts = load_client_config(cfg).source
    regs = [_reg(1, 0.1, A, CONN_A, 11), _reg(3, 0.1, B, CONN_B, 22)]
    soon = _reg(30, 3.0, B, ("10.0.0.1", 40002), 22)  # B last heard at 2.0 s: 1 s of silence
    heard = {(B, CONN_B): [(10, 1.0), (20, 2.0)]}
    obs = _obs(registrations=[*regs, soon], heard=heard)
    assert _verdicts(obs, "SRC-QRM-015") == {Verdict.INFORMATIONAL}
    obs.source_options = opts
    assert _verdicts(obs, "SRC-QRM-015") == {Verdict.FAIL}
    late = _reg(30, 4.5, B, ("10.0.0.1", 40002), 22)
    obs = _obs(registrations=[*regs, late], heard=heard)
    obs.source_options = opts
    assert _verdicts(obs, "SRC-QRM-015") == {Verdict.PASS}
    # re-registering with both stores at once is a restart: not judged
    restart = [_reg(30, 3.0, A, ("10.0.0.1", 40003), 11), soon]
    obs = _obs(registrations=[*regs, *restart], heard=heard)
    obs.source_options = opts
    assert _verdicts(obs, "SRC-QRM-015") == {Verdict.UNSUPPORTED}


# --- the store's retransmission rate ---------------------------------------------------------


def test_store_retransmission_rate_within_the_configured_rate() -> None:
    rcv = ("10.0.0.2", 40005)
    fast = [Data(100 + i, 1.0 + i * 0.005, A, rcv, 1, i, "retrans") for i in range(100)]
    obs = _obs(data=fast)
    assert _verdicts(obs, "REC-STORE-005") == {Verdict.INFORMATIONAL}
    obs.store_config = _store_config()
    results = _judged(obs, "REC-STORE-005")
    assert {r.verdict for r in results} == {Verdict.FAIL}  # 100 in 0.5 s, rate 40/s
    paced = [Data(100 + i, 1.0 + i / 40, A, rcv, 1, i, "retrans") for i in range(100)]
    obs = _obs(data=paced)
    obs.store_config = _store_config()
    assert _verdicts(obs, "REC-STORE-005") == {Verdict.PASS}


def test_conform_capture_takes_a_store_config(tmp_path: Path) -> None:
    xml = tmp_path / "store.xml"
    xml.write_text(STORE_XML)
    run = subprocess.run(
        [sys.executable, "-m", "ump", "conform", "--capture",
         str(ROOT / "captures" / "corpus" / "restarts.pcap"), "--store-port", "14567",
         "--store-config", str(xml), "--out", str(tmp_path / "out"), "-k", "REC-STORE-005"],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = [line for line in run.stdout.splitlines() if line.startswith("REC-STORE-005")]
    # a generated store retransmits 143 messages within a second: above 40/s
    assert any(" fail " in line for line in lines), run.stdout + run.stderr
    bad = subprocess.run(
        [sys.executable, "-m", "ump", "conform", "--capture",
         str(ROOT / "captures" / "corpus" / "basic.pcap"), "--store-config",
         str(tmp_path / "missing.xml"), "--out", str(tmp_path / "out2")],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr


# --- the reference demo, judged with every configuration file it ran with -------------------


@pytest.mark.parametrize("transport", ["tcp", "lbt-ru"])
def test_demo_judged_with_its_store_xml_has_no_failure(tmp_path: Path, transport: str) -> None:
    from tests.conformance.test_passive import _capture_demo

    pcap = _capture_demo(tmp_path, transport)
    work = tmp_path / "work"
    obs = observe([pcap])
    obs.source_options = load_client_config(work / "source.cfg").source
    obs.receiver_options = load_client_config(work / "receiver.cfg").receiver
    obs.store_config = load_store_config(work / "store.xml")
    results = judge(obs, passive_cases())
    fails = [f"{r.spec.id} {r.message}" for r in results if r.verdict is Verdict.FAIL]
    assert not fails, fails
    decided = {r.spec.id: r.verdict for r in results}
    assert decided["SRC-REG-006"] is Verdict.PASS  # the SRIs name the demo's store
    assert decided["PSV-STORE-003"] is Verdict.PASS  # judged against the store's XML


# --- evidence: the deciding frames, dissected ------------------------------------------------


def test_frames_arg_and_the_dissect_frame_filter() -> None:
    from conformance.passive.evidence import frames_arg

    assert frames_arg([9, 3, 4, 5, 5, 12]) == "3-5,9,12"
    run = subprocess.run(
        [sys.executable, "-m", "ump", "dissect", str(ROOT / "captures" / "corpus" / "basic.pcap"),
         "--store-port", "14567", "--brief", "--frames", "5-6,33"],
        cwd=ROOT, capture_output=True, text=True, timeout=300)
    numbers = [int(line.split()[0]) for line in run.stdout.splitlines()
               if not line.startswith("#")]
    assert numbers == [5, 6, 33], run.stdout + run.stderr
    bad = subprocess.run([sys.executable, "-m", "ump", "dissect", "x.pcap", "--frames", "0"],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert bad.returncode == 2 and "not frame numbers" in bad.stderr


def test_every_cited_verdict_links_a_page_of_its_frames_dissected(tmp_path: Path) -> None:
    import json

    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "ump", "conform", "--capture",
         str(ROOT / "captures" / "corpus" / "planted.pcap"), "--store-port", "14567",
         "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 1, run.stdout + run.stderr  # planted faults fail
    cases = json.loads((out / "results.json").read_text())["cases"]
    cited = [c for c in cases if c.get("decided_by")]
    assert cited and all(c["frames_page"] for c in cited)
    html = (out / "report.html").read_text()
    for case in cited:
        page = (out / case["frames_page"]).read_text()
        assert f'href="{case["frames_page"]}"' in html
        command = page.splitlines()[1]
        assert command.startswith("# ump dissect ") and " --frames " in command
        shown = [int(line.split()[0]) for line in page.splitlines()[2:]
                 if line[:6].strip().isdigit()]
        assert shown == sorted(case["decided_by"]), (case["id"], page)
    stable = next(c for c in cited if c["id"] == "PSV-STORE-002")
    assert "--frames 6-7,40" in (out / stable["frames_page"]).read_text()


def test_a_store_version_that_stays_after_its_reregistration_fails() -> None:
    regs = [_reg(1, 0.1, A, CONN_A, 11), _reg(3, 0.1, B, CONN_B, 22)]
    first = _sri(10, 0.5, 1, (A, 11, 1), (B, 22, 1))
    again = _reg(30, 5.0, B, CONN_B, 22)
    stale = _sri(40, 5.5, 2, (A, 11, 1), (B, 22, 1))  # the overall version rose, B's did not
    results = _judged(_obs(registrations=[*regs, again], sris=[first, stale]), "SRC-REG-008")
    assert {r.verdict for r in results} == {Verdict.FAIL}
    assert results[0].decided_by == [10, 30, 31, 40]
    # a retried PREG asked before the SRI: its second answer changes nothing
    retry = _reg(8, 0.4, B, CONN_B, 22)
    retry.response.time = 5.0  # type: ignore[union-attr]
    assert Verdict.FAIL not in {r.verdict for r in _judged(
        _obs(registrations=[*regs, retry], sris=[first, stale]), "SRC-REG-008")}


def test_an_lbtrm_nak_is_answered_by_a_retransmission_or_an_ncf() -> None:
    session = ("lbtrm", "10.0.0.1", 14390, 0xABCD)
    rcv = ("10.0.0.2", 40000)
    src = ("10.0.0.1", 14390)

    def tp(frame: int, t: float, kind: str, sqns: list[int], sender: tuple[str, int] = src
           ) -> Tpkt:
        return Tpkt(frame, t, session, kind, sqns, max(sqns, default=0), sender)

    sent = [tp(i + 1, i * 0.01, "data", [i]) for i in range(10)]
    nak = tp(20, 1.0, "nak", [3], rcv)
    later = tp(30, 4.0, "sm", [])  # the source still heard after the answer time
    answered = _obs(transport=[*sent, nak, tp(21, 1.1, "rx", [3]), later])
    results = _judged(answered, "SRC-LBTRM-001")
    assert {r.verdict for r in results} == {Verdict.PASS} and results[0].decided_by == [20, 21]
    assert _verdicts(_obs(transport=[*sent, nak, tp(21, 1.2, "ncf", [3]), later]),
                     "SRC-LBTRM-001") == {Verdict.PASS}
    assert _verdicts(_obs(transport=[*sent, nak, later]), "SRC-LBTRM-001") == {Verdict.FAIL}
    # a source not heard after the NAK (gone, or restarted): nothing decided
    assert _verdicts(_obs(transport=[*sent, nak]), "SRC-LBTRM-001") == {Verdict.UNSUPPORTED}
    # a repeat within the ignore interval of an answered NAK may go unanswered
    repeat = tp(22, 1.3, "nak", [3], rcv)
    assert _verdicts(_obs(transport=[*sent, nak, tp(21, 1.1, "rx", [3]), repeat, later]),
                     "SRC-LBTRM-001") == {Verdict.PASS}


# --- bad input: what a capture lacks is unsupported, never a failure ------------------------

NEW_CASES = ("SRC-REG-006", "SRC-REG-008", "PSV-STORE-003", "SRC-QRM-015", "REC-STORE-005",
             "SRC-LBTRM-001")


def _configured(paths: list[Path]) -> list[PassiveResult]:
    """Judged with a store XML for the corpus's store port and default client options."""
    from reference_impl.config.client import parse_client_config

    obs = observe(paths, PortMap(store_ports=[14567]))
    obs.store_config = _store_config()
    client = parse_client_config("source ume_flight_size 1000\n")
    obs.source_options, obs.receiver_options = client.source, client.receiver
    return judge(obs, passive_cases())


def test_no_um_traffic_leaves_the_new_cases_unsupported_with_the_reason() -> None:
    results = _configured([ROOT / "captures" / "corpus" / "not-um.pcap"])
    for case_id in NEW_CASES:
        (r,) = [r for r in results if r.spec.id == case_id]
        assert r.verdict is Verdict.UNSUPPORTED and "no UM traffic" in r.message, r.message


def test_a_cut_capture_fails_nothing_the_whole_capture_does_not(tmp_path: Path) -> None:
    """Captures starting mid-stream (no registration seen) or ending inside a record judged
    with every configuration given: each failure is one the whole capture has too."""
    src = ROOT / "captures" / "corpus" / "restarts.pcap"

    def fails(results: list[PassiveResult]) -> set[tuple[str, str]]:
        return {(r.spec.id, r.entity) for r in results if r.verdict is Verdict.FAIL}

    whole = fails(_configured([src]))
    records = list(read_capture(src))
    for start in (len(records) // 5, len(records) // 2, len(records) - 100):
        part = tmp_path / f"from-{start}.pcap"
        with PcapWriter(part, linktype=records[0].linktype) as out:
            for rec in records[start:]:
                out.write(rec.ts, rec.data)
        results = _configured([part])
        assert fails(results) <= whole, fails(results) - whole
    cut = tmp_path / "cut.pcap"
    data = src.read_bytes()
    cut.write_bytes(data[: len(data) // 3 + 5])  # ends inside a record
    assert fails(_configured([cut])) <= whole


def test_a_regid_granted_to_another_source_within_the_first_ones_activity_timeout_fails(
) -> None:
    """REG-STORE-003 with the store's XML: source A (request port 14391) was heard 1 s before
    source B (request port 14392, same host and topic, without A's Session ID) was
    granted A's RegID; the topic's source-activity-timeout is 30 s."""
    a = _reg(1, 0.1, A, CONN_A, 11)
    b = Registration(20, 1.2, (("10.0.0.1", 40009), A), A, True, 11, 0, 1, 1, "topic", 0,
                     ("10.0.0.1", 14392), False)
    b.response = PregResp(21, 1.21, 11, False, False, 0, 0, 0, False)
    heard = {(CONN_A, A): [(1, 0.1), (10, 0.2)]}
    obs = _obs(registrations=[a, b], heard=heard)
    assert _verdicts(obs, "REG-STORE-003") == {Verdict.PASS}  # the timeout is unknown
    obs.store_config = _store_config()
    results = _judged(obs, "REG-STORE-003")
    assert {r.verdict for r in results} == {Verdict.FAIL}
    assert 10 in results[0].decided_by
    # the same application again (its Session ID, from its host): a restart, not a clash
    b.session_id = a.session_id
    assert _verdicts(obs, "REG-STORE-003") == {Verdict.PASS}


def test_a_retransmission_for_a_request_naming_a_source_regid_fails() -> None:
    src = _reg(1, 0.1, A, CONN_A, 11)
    rcv_conn = ("10.0.0.2", 40010)
    rcv = Registration(5, 0.5, (rcv_conn, A), A, False, 0, 11, 1, 1, "topic", 0,
                       (rcv_conn[0], 14391), False)
    rcv.response = PregResp(6, 0.51, 33, False, False, 0, 0, 0, False)
    wrong = Rxreq(10, 1.0, rcv_conn, A, 11, 4)  # names the source's RegID
    answer = Data(11, 1.01, A, rcv_conn, 1, 4, "retrans")
    results = _judged(_obs(registrations=[src, rcv], rxreqs=[wrong], data=[answer]),
                      "QRM-STORE-004")
    assert {r.verdict for r in results} == {Verdict.FAIL} and results[0].decided_by == [10, 11]
    assert _verdicts(_obs(registrations=[src, rcv], rxreqs=[wrong], data=[]),
                     "QRM-STORE-004") == {Verdict.PASS}
    # the receiver's own request for it in between: the retransmission answers that one
    own = Rxreq(10, 1.005, rcv_conn, A, 33, 4)
    own.frame = 10
    wrong.frame = 9
    assert _verdicts(_obs(registrations=[src, rcv], rxreqs=[wrong, own], data=[answer]),
                     "QRM-STORE-004") == {Verdict.PASS}


def test_a_duplicate_of_an_acknowledged_message_is_acknowledged_again() -> None:
    from conformance.passive.observe import Ack

    reg = _reg(1, 0.1, A, CONN_A, 11)
    sri = _sri(3, 0.2, 1, (A, 11, 1))
    sent = Data(5, 0.3, TRANSPORT, ("10.0.0.3", 50000), 1, 4, "data")
    ack = Ack(6, 0.31, A, CONN_A, "stability", 4, 0, 1, False)
    dup = Data(7, 0.5, CONN_A, A, 1, 4, "prorx")  # over the registration connection: received
    again = Ack(8, 0.51, A, CONN_A, "stability", 4, 0, 1, False)
    later = {(A, CONN_A): [(2, 0.11), (6, 0.31), (9, 3.0)]}  # the store heard afterwards
    base = {"registrations": [reg], "sris": [sri], "heard": later}
    assert _verdicts(_obs(**base, data=[sent, dup], acks=[ack, again]),
                     "PRX-STORE-002") == {Verdict.PASS}
    assert _verdicts(_obs(**base, data=[sent, dup], acks=[ack]),
                     "PRX-STORE-002") == {Verdict.FAIL}
    # the store not heard after the duplicate: it may have died, nothing decided
    quiet = {**base, "heard": {(A, CONN_A): [(2, 0.11), (6, 0.31)]}}
    assert _verdicts(_obs(**quiet, data=[sent, dup], acks=[ack]),
                     "PRX-STORE-002") == {Verdict.UNSUPPORTED}
