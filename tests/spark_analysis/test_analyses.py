"""The analyses on the reference corpus: against the generator's sidecars, the hand-planted
capture's known answers, and the committed expected results.

The whole corpus is analysed once per session (``analysis_corpus.shared_corpus_run``); the
tests read its output.  Independent sources of truth, in decreasing strength:
``planted.pcap`` was written by hand with known gaps, latencies and anomalies; the sidecars
count what the generator put on the wire; ``expected/*.json`` pins every summary table against
regressions (made by this code, so it only proves stability: the other two and the tshark
test prove correctness).
"""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from .analysis_corpus import (
    CAPTURES,
    EXPECTED,
    GENERATED,
    PLANTED,
    PLANTED_SESSION,
    PLANTED_TOPIC,
    RCV1,
    ROGUE,
    SOURCE,
    STORE,
    CorpusRun,
    planted_frames,
    planted_ns,
    shared_corpus_run,
)


@pytest.fixture(scope="module")
def corpus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CorpusRun:
    run = shared_corpus_run(request, tmp_path_factory)
    assert run.exit_code == 0, run.stderr
    return run


def _rows(corpus: CorpusRun, capture: Path, table: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = corpus.capture(capture.name)[table]["data"]
    return rows


def _table(corpus: CorpusRun, capture: Path, name: str) -> Any:
    df = corpus.table(name)
    return df[df["capture"] == str(capture)]


def _sidecar(capture: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(Path(f"{capture}.meta.json").read_text())
    return data


# =============================================================================================
# The planted capture: answers known by construction
# =============================================================================================


def test_planted_capture_is_what_the_builder_makes(tmp_path: Path) -> None:
    """The committed file is the builder's output, so the builder documents it."""
    from .analysis_corpus import build_planted

    fresh = tmp_path / "planted.pcap"
    build_planted(fresh)
    assert fresh.read_bytes() == PLANTED.read_bytes()
    assert len(planted_frames()) == 43


def test_planted_sequence_verdicts(corpus: CorpusRun) -> None:
    seq = _table(corpus, PLANTED, "sequence_summary")
    data = seq[seq["level"] == "transport-data"].iloc[0]
    # sqns 0 1 2 5 3 3 RX4 6: one gap of 2 (3, 4), 3 twice below the mark 5, the second a dup
    assert (data["items"], data["retransmissions"], data["gaps"], data["gap_sqns"],
            data["out_of_order"], data["duplicates"]) == (8, 1, 1, 2, 2, 1)
    assert (data["first_sqn"], data["high_sqn"], data["missing"]) == (0, 6, 0)
    topic = seq[seq["level"] == "topic"].iloc[0]
    assert (topic["tidx"], topic["items"], topic["gaps"], topic["gap_sqns"],
            topic["out_of_order"], topic["duplicates"]) == (1, 8, 1, 2, 2, 1)
    events = _table(corpus, PLANTED, "sequence_events")
    transport = events[events["level"] == "transport-data"].sort_values(["pos", "event"])
    assert list(zip(transport["sqn"], transport["event"], transport["size"], strict=True)) == [
        (5, "gap", 2), (3, "out-of-order", 2), (3, "duplicate", 1), (3, "out-of-order", 2)]


def test_planted_transport_session(corpus: CorpusRun) -> None:
    (session,) = _rows(corpus, PLANTED, "transport_sessions")
    assert session["session"] == f"lbtrm:{SOURCE}:14390:{PLANTED_SESSION:08x}"
    assert (session["data_packets"], session["rx_packets"], session["nak_packets"],
            session["nak_sqns"], session["ncf_packets"], session["ncf_sqns"],
            session["messages"], session["mcast_group"]) == (7, 1, 1, 2, 1, 1, 7, "224.10.10.10")
    assert session["first_ts_ns"] == planted_ns(10000)
    assert session["last_ts_ns"] == planted_ns(19000)
    assert session["data_packets_per_s"] == pytest.approx(7 / 0.009)


def test_planted_topic_resolution(corpus: CorpusRun) -> None:
    (ad,) = _rows(corpus, PLANTED, "topic_advertisements")
    assert (ad["topic"], ad["transport"], ad["source_ip"], ad["source_port"], ad["session_id"],
            ad["topic_index"], ad["tirs"], ad["persistent"]) == (
        PLANTED_TOPIC, "lbtrm", SOURCE, 14390, PLANTED_SESSION, 1, 1, False)
    queries = {q["topic"]: (q["queries"], q["answered"])
               for q in _rows(corpus, PLANTED, "topic_queries")}
    assert queries == {PLANTED_TOPIC: (1, True), "nobody.home": (1, False)}


def test_planted_registrations(corpus: CorpusRun) -> None:
    rows = _rows(corpus, PLANTED, "registrations")
    got = [(r["role"], r["client_ip"], r["requested_reg_id"], r["outcome"],
            r["granted_reg_id"], r["error_code"], r["source_ip"], r["topic"]) for r in rows]
    assert got == [
        ("source", SOURCE, 0, "granted", 1001, None, SOURCE, PLANTED_TOPIC),
        ("source", ROGUE, 1001, "error", None, 5, ROGUE, PLANTED_TOPIC),
        ("receiver", RCV1, 0, "granted", 2002, None, SOURCE, PLANTED_TOPIC),
        ("receiver", "10.0.2.2", 0, "granted", 2002, None, SOURCE, PLANTED_TOPIC),
        ("receiver", "10.0.2.3", 0, "unanswered", None, None, SOURCE, PLANTED_TOPIC)]
    assert rows[1]["error"] == "RegID is in use by a different source"
    assert [r["response_us"] for r in rows] == [90.0, 90.0, 90.0, 90.0, None]
    assert rows[0]["store_id"] == 1 and rows[0]["store_ip"] == STORE


def test_planted_latencies(corpus: CorpusRun) -> None:
    stability = _table(corpus, PLANTED, "stability_acks").sort_values("pos")
    assert list(stability["sqn"]) == [0, 2, 9]
    assert [None if v is None or (isinstance(v, float) and math.isnan(v)) else v
            for v in stability["latency_us"]] == [2000.0, 5000.0, None]
    consumption = _table(corpus, PLANTED, "consumption_acks")
    assert list(consumption["latency_us"]) == [7500.0]
    assert list(consumption["source_ip"]) == [SOURCE]
    summary = {r["kind"]: r for r in _rows(corpus, PLANTED, "latency_summary")}
    stable = summary["stability"]
    assert (stable["acks"], stable["matched"], stable["min_us"], stable["max_us"],
            stable["p50_us"], stable["p90_us"]) == (3, 2, 2000.0, 5000.0, 3500.0, 4700.0)
    assert stable["topic"] == PLANTED_TOPIC
    assert summary["consumption"]["p99_us"] == 7500.0


def test_planted_flight_size(corpus: CorpusRun) -> None:
    (flight,) = _rows(corpus, PLANTED, "flight_size_summary")
    # sends 0 1 2 5 3 6 (the second 3 and RX 4 are no sends); one store, so the first ACK
    # stabilizes: in flight 1 2 1 2 3 4 3 4, peak 4 first reached at the send of 3
    assert (flight["messages"], flight["stabilized"], flight["never_stable"],
            flight["peak_in_flight"], flight["end_in_flight"], flight["stores"],
            flight["acks_needed"]) == (6, 2, 4, 4, 4, 1, 1)
    assert flight["peak_ts_ns"] == planted_ns(15000)
    series = _table(corpus, PLANTED, "flight_size").sort_values("bin")
    assert int(series["sent"].sum()) == 6 and int(series["stabilized"].sum()) == 2
    assert int(series["max_in_flight"].max()) == 4


def test_planted_retransmission_requests(corpus: CorpusRun) -> None:
    requests = _table(corpus, PLANTED, "retransmission_requests").sort_values(["kind", "sqn"])
    got = [(r.kind, r.sqn, r.outcome, r.service_us, r.ncf_text)
           for r in requests.itertuples()]
    assert [g[:3] for g in got] == [("lbtrm-nak", 4, "served"), ("lbtrm-nak", 8, "ncf"),
                                    ("ume-rxreq", 1, "served"), ("ume-rxreq", 2, "unanswered")]
    assert got[0][3] == 2500.0 and got[2][3] == 300.0
    assert got[1][4] == "NAK Shed"


def test_planted_anomalies(corpus: CorpusRun) -> None:
    summary = {(r["severity"], r["kind"]): r["count"]
               for r in _rows(corpus, PLANTED, "anomaly_summary")}
    assert summary == {
        ("error", "ack-for-unsent-sqn"): 1,
        ("error", "registration-error"): 1,
        ("error", "regid-reuse"): 1,
        ("error", "regid-conflict"): 2,
        ("warning", "registration-unanswered"): 1,
        ("warning", "retransmission-unanswered"): 1,
        ("warning", "gap"): 2,  # transport and topic level
        ("warning", "out-of-order"): 4,
        ("warning", "duplicate"): 2,
    }
    unsent = [a for a in _rows(corpus, PLANTED, "anomalies")
              if a["kind"] == "ack-for-unsent-sqn"]
    assert "sqn 9" in unsent[0]["detail"] and unsent[0]["ts_ns"] == planted_ns(20000)
    reuse = [a for a in _rows(corpus, PLANTED, "anomalies") if a["kind"] == "regid-reuse"]
    assert ROGUE in reuse[0]["subject"] and "1001" in reuse[0]["detail"]


def test_capture_without_um(corpus: CorpusRun, tmp_path: Path) -> None:
    """No UM at all: every table is empty (nothing invented) and every frame is accounted
    for as not UM, by reason."""
    from .analysis_corpus import NOT_UM, build_not_um, not_um_frames

    fresh = tmp_path / "not-um.pcap"
    build_not_um(fresh)
    assert fresh.read_bytes() == NOT_UM.read_bytes()
    section = corpus.capture(NOT_UM.name)
    assert {name: entry["rows"] for name, entry in section.items()
            if name != "not_um_frames" and entry["rows"]} == {}
    assert sum(section["not_um_frames"].values()) == len(not_um_frames())
    assert len(section["not_um_frames"]) == 3  # not IPv4, TCP and UDP off the UM ports


# =============================================================================================
# Generated captures: the sidecars' counts
# =============================================================================================


def _sum(rows: list[dict[str, Any]], column: str, **where: Any) -> int:
    return sum(int(r[column] or 0) for r in rows
               if all(r.get(k) == v for k, v in where.items()))


@pytest.mark.parametrize("capture", GENERATED, ids=[c.stem for c in GENERATED])
def test_transport_counts_match_sidecar(corpus: CorpusRun, capture: Path) -> None:
    expected = _sidecar(capture)["expected"]
    sessions = _rows(corpus, capture, "transport_sessions")
    for protocol in ("lbtrm", "lbtru"):
        want = expected.get(protocol, {})
        got = {"DATA": _sum(sessions, "data_packets", protocol=protocol),
               "DATA(RX)": _sum(sessions, "rx_packets", protocol=protocol),
               "NAK": _sum(sessions, "nak_packets", protocol=protocol),
               "NCF": _sum(sessions, "ncf_packets", protocol=protocol),
               "SM": _sum(sessions, "sm_packets", protocol=protocol),
               "CREQ": _sum(sessions, "creq_packets", protocol=protocol)}
        assert {k: v for k, v in got.items() if v} == want, protocol
    by_session = {s["session"]: s for s in sessions}
    for key, counts in expected.get("naks", {}).items():
        assert (by_session[key]["nak_packets"], by_session[key]["nak_sqns"]) == \
            (counts["packets"], counts["sqns"])
    for key, counts in expected.get("ncfs", {}).items():
        assert (by_session[key]["ncf_packets"], by_session[key]["ncf_sqns"]) == \
            (counts["packets"], counts["sqns"])
    for key, count in expected.get("rx", {}).items():
        assert by_session[key]["rx_packets"] == count
    # the sidecar names LBT-TCP sessions with the TIR's session ID, which data segments lack
    assert set(by_session) == {k.rsplit(":", 1)[0] if k.startswith("lbttcp:") else k
                               for k in _sidecar(capture)["sessions"]}


@pytest.mark.parametrize("capture", GENERATED, ids=[c.stem for c in GENERATED])
def test_topic_messages_match_sidecar(corpus: CorpusRun, capture: Path) -> None:
    """New data messages per session and topic index: summed over the topic-level streams
    (LBT-RU and LBT-TCP send a copy per receiver and store, and the sidecar counts copies)."""
    seq = _rows(corpus, capture, "sequence_summary")
    got: Counter[str] = Counter()
    for row in seq:
        if row["level"] != "topic":
            continue
        session = f"{row['protocol']}:{row['source_ip']}:{row['source_port']}"
        if row["session_id"] is not None:
            session += f":{row['session_id']:08x}"
        got[f"{session}:{row['tidx']}"] += row["items"] - row["retransmissions"]
    want = {}
    for key, count in _sidecar(capture)["expected"]["data"].items():
        protocol, ip, port, _session, tidx = key.split(":")
        # our LBT-TCP key has no session ID (it is not on the data segments)
        short = f"{protocol}:{ip}:{port}:{tidx}" if protocol == "lbttcp" else key
        want[short] = count
    assert dict(got) == want


@pytest.mark.parametrize("capture", GENERATED, ids=[c.stem for c in GENERATED])
def test_registrations_match_sidecar(corpus: CorpusRun, capture: Path) -> None:
    sidecar = _sidecar(capture)
    regs = _rows(corpus, capture, "registrations")
    for role, want in sidecar["expected"]["registrations"].items():
        mine = [r for r in regs if r["role"] == role]
        got = Counter({"requests": len(mine),
                       "accepted": sum(r["outcome"] == "granted" for r in mine),
                       "old-client": sum(bool(r["old_client"]) and r["outcome"] == "granted"
                                         for r in mine)})
        for r in mine:
            if r["outcome"] == "error":
                got[f"error-{r['error_code']}"] += 1
        assert {k: v for k, v in got.items() if v} == want, role
    hosts = {name: ip for ip, name in sidecar["hosts"].items()}
    granted = {(r["topic"], r["store_ip"], r["granted_reg_id"]) for r in regs
               if r["role"] == "source" and r["outcome"] == "granted"}
    for topic in sidecar["topics"]:
        for store, regid in topic["regids"].items():
            assert (topic["name"], hosts[store], regid) in granted
    receivers = {(r["client_ip"], r["topic"], r["store_ip"], r["granted_reg_id"])
                 for r in regs if r["role"] == "receiver" and r["outcome"] == "granted"}
    for receiver in sidecar["receivers"]:
        for topic, by_store in receiver["regids"].items():
            for store, regid in by_store.items():
                assert (hosts[receiver["name"]], topic, hosts[store], regid) in receivers


@pytest.mark.parametrize("capture", GENERATED, ids=[c.stem for c in GENERATED])
def test_acks_and_requests_match_sidecar(corpus: CorpusRun, capture: Path) -> None:
    expected = _sidecar(capture)["expected"]
    section = corpus.capture(capture.name)
    assert section["stability_acks"]["rows"] == expected["acks"]["stable"]
    assert section["consumption_acks"]["rows"] == expected["acks"]["cdelv"]
    summary = section["retransmission_summary"]["data"]
    assert _sum(summary, "requests", kind="ume-rxreq") == expected.get("rxreq", 0)
    assert _sum(summary, "served", kind="ume-rxreq") == \
        expected.get("retransmissions", {}).get("store", 0)
    latency = section["latency_summary"]["data"]
    # every ACK in a generated capture acknowledges something sent before it
    assert _sum(latency, "matched") == _sum(latency, "acks")
    assert _sum(section["topic_advertisements"]["data"], "tirs") == expected["lbmr"]["tir"]
    assert _sum(section["topic_queries"]["data"], "queries") == \
        expected["lbmr"].get("tqr", 0) + expected["lbmr"].get("wc_tqr", 0)


@pytest.mark.parametrize("capture", GENERATED, ids=[c.stem for c in GENERATED])
def test_anomalies_match_the_scenario(corpus: CorpusRun, capture: Path) -> None:
    """Only what the scenario planted is flagged as an error."""
    scenario = _sidecar(capture)["scenario"]
    expected = _sidecar(capture)["expected"]
    errors = Counter({r["kind"]: r["count"] for r in
                      _rows(corpus, capture, "anomaly_summary") if r["severity"] == "error"})
    refused = sum(v for k, v in expected["registrations"]["source"].items()
                  if k.startswith("error-"))
    want = Counter({"registration-error": refused})
    if scenario["regid_collision"]:
        want["regid-reuse"] = scenario["collision_attempts"]
    want["nak-to-closed-port"] = sum(expected.get("icmp", {}).get("port-unreachable", {})
                                     .values())
    assert +errors == +want


# =============================================================================================
# Regression: the committed expected results
# =============================================================================================


def _close(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        problems = [f"{path}/{k}: only in {'fresh' if k in a else 'expected'}"
                    for k in set(a) ^ set(b)]
        for k in set(a) & set(b):
            problems += _close(a[k], b[k], f"{path}/{k}")
        return problems
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} rows, expected {len(b)}"]
        return [p for i, (x, y) in enumerate(zip(a, b, strict=True))
                for p in _close(x, y, f"{path}[{i}]")]
    if isinstance(a, float) and isinstance(b, float | int):
        return [] if math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9) else [f"{path}: {a} != {b}"]
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.stem for c in CAPTURES])
def test_results_equal_committed_expected(corpus: CorpusRun, capture: Path) -> None:
    expected = json.loads((EXPECTED / f"{capture.stem}.json").read_text())
    problems = _close(corpus.capture(capture.name), expected)
    assert not problems, ("differences from the committed results (regenerate with "
                          "python -m tests.spark_analysis.analysis_corpus if deliberate):\n"
                          + "\n".join(sorted(problems)[:40]))


# =============================================================================================
# Pieces that need no Spark
# =============================================================================================


def test_natural_file_order() -> None:
    from spark_analysis.engine.inputs import natural_order

    assert natural_order(["cap10.pcap", "cap2.pcap", "cap1.pcap", "b.pcap"]) == [
        "b.pcap", "cap1.pcap", "cap2.pcap", "cap10.pcap"]


def test_options_are_checked() -> None:
    from spark_analysis.engine.options import AnalysisOptions

    with pytest.raises(ValueError, match="stability_rule"):
        AnalysisOptions(stability_rule="most")
    with pytest.raises(ValueError, match="flight_bins"):
        AnalysisOptions(flight_bins=0)


def test_registration_pairing_is_first_come_first_served() -> None:
    """Two requests on one key (a receiver registering two sources' topics with the same
    indices) take the responses in order; a repeated request replaces the pending one."""
    import pyarrow as pa

    from spark_analysis.engine.registrations import _pair_registrations

    events = pa.table({
        "capture": ["c"] * 7, "pos": [10, 20, 30, 40, 50, 60, 5],
        "msg_index": pa.array([0] * 7, pa.int32()),
        "request": [True, True, False, False, True, True, False],
        "content": ["a", "b", "", "", "c", "c", ""]})
    pairs = _pair_registrations(events).to_pydict()
    # the response at 5 precedes every request: it answers nothing
    assert list(zip(pairs["pos"], pairs["response_pos"], strict=True)) == [(10, 30), (20, 40)]
