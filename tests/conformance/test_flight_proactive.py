"""The flight-size and proactive-retransmit suites, and the reference behaviour they judge.

What the wire cannot show a black-box case is checked here on the sans-IO source core: a
message counts once towards ``ume_flight_size`` whatever its length (an empty payload too),
the OVER notification comes from the send that exceeds the flight size and UNDER when the
flight falls back, and the Message Not Stable event ends the retransmissions.  Bad flight-size
options are start-up errors.  The suites themselves run against the reference store (fast:
well under a second) and are listed for both roles; the source cases run in
``test_mutants.py`` (each mutant's catching case) and by ``ump conform --iut source``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from conformance.model import Role, Verdict, all_cases
from conformance.profile import resolve_profile
from conformance.runner import run
from reference_impl.config.client import ConfigError, parse_client_config
from reference_impl.events import FlightSizeNotification, FlightState, MessageNotStable
from reference_impl.source import SendError, SendErrorCode, SourceCore
from tests.reference_impl.test_source_fastpath import ACK, Harness
from wire.lbmc import AckType

# --- the suites --------------------------------------------------------------------------------


def test_the_suites_hold_their_cases_for_each_role() -> None:
    by_suite = {(c.suite, c.role): c.id for c in all_cases()}
    flight = sorted(c.id for c in all_cases(Role.SOURCE) if c.suite == "flight-size")
    assert flight == [f"SRC-FLT-00{i}" for i in range(1, 10)]
    prx = sorted(c.id for c in all_cases() if c.suite == "proactive-retransmit")
    assert prx == ["PRX-STORE-001", "PRX-STORE-002", "SRC-PRX-001", "SRC-PRX-002",
                   "SRC-PRX-003", "SRC-PRX-004"]
    assert ("flight-size", Role.STORE) not in by_suite
    sections = {c.section for c in all_cases() if c.suite in ("flight-size",
                                                              "proactive-retransmit")}
    assert sections == {"UMP Flight Size", "Proactive Retransmissions",
                        "Sources Using Quorum/Consensus Store Configuration"}


def test_the_store_suite_passes_against_the_reference_store(tmp_path: Path) -> None:
    result = run(resolve_profile(None), tmp_path / "out", suites=["proactive-retransmit"])
    assert [(r.spec.id, r.verdict) for r in result.results] == \
        [("PRX-STORE-001", Verdict.PASS), ("PRX-STORE-002", Verdict.PASS)], \
        [(r.spec.id, r.message) for r in result.results]


def test_ump_conform_takes_the_suite_names() -> None:
    out = subprocess.run([sys.executable, "-m", "ump", "conform", "--iut", "source", "--list",
                          "--suite", "flight-size", "--suite", "proactive-retransmit"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    listed = [line.split()[0] for line in out.stdout.splitlines() if line[:1].isalnum()]
    assert listed == ["SRC-FLT-001", "SRC-FLT-002", "SRC-FLT-003", "SRC-FLT-004",
                      "SRC-FLT-005", "SRC-FLT-006", "SRC-FLT-007", "SRC-FLT-008", "SRC-FLT-009",
                      "SRC-PRX-001", "SRC-PRX-002", "SRC-PRX-003", "SRC-PRX-004"]


# --- the reference source's flight size --------------------------------------------------------


def _ack(h: Harness, *sqns: int, store: int = 0) -> None:
    h.feed(h.store_keys[store], [ACK.pack(type=AckType.STABLE, seqnum=s) for s in sqns])


@pytest.mark.parametrize("batch", [False, True], ids=["send", "send_many"])
def test_an_empty_message_counts_once_towards_the_flight_size(batch: bool) -> None:
    # guide "UMP Flight Size": the mechanism works per message; an empty payload is a message
    h = Harness.start(SourceCore, (0,), ume_flight_size=2)
    if batch:
        assert h.source.send_many([b""] * 5) == 2
    else:
        h.source.send(b"")
        h.source.send(b"")
        with pytest.raises(SendError) as refused:
            h.source.send(b"")
        assert refused.value.code is SendErrorCode.WOULD_BLOCK
    assert h.source.inflight == 2 and h.source.next_sqn == 2
    assert not h.source.can_send()


def test_the_byte_limit_counts_payload_only_and_either_limit_blocks() -> None:
    h = Harness.start(SourceCore, (0,), ume_flight_size=3, ume_flight_size_bytes=100)
    assert h.send([50, 50]) == 2  # exactly 100 payload bytes: headers are not counted
    assert h.send([1]) is SendErrorCode.WOULD_BLOCK  # the byte limit binds
    _ack(h, 0)
    assert h.send([10, 10]) == 2  # 60 bytes, 3 messages: now the count limit binds
    assert h.send([1]) is SendErrorCode.WOULD_BLOCK


def test_a_message_larger_than_the_byte_limit_is_refused_and_not_taken() -> None:
    # semantics: "Payload exceeds flight size bytes maximum", whatever the behaviour
    h = Harness.start(SourceCore, (0,), ume_flight_size_bytes=100,
                      ume_flight_size_behavior="notify")
    assert h.send([101]) is SendErrorCode.TOO_BIG
    assert (h.source.next_sqn, h.source.inflight, h.source.inflight_bytes) == (0, 0, 0)
    assert h.send([100]) == 1


def test_notify_raises_over_on_the_send_that_exceeds_and_under_when_it_falls_back() -> None:
    h = Harness.start(SourceCore, (0,), ume_flight_size=2, ume_flight_size_behavior="notify")
    assert h.send([8, 8]) == 2
    assert not [e for e in h.events if isinstance(e, FlightSizeNotification)]
    assert h.send([8]) == 1  # the third send exceeds: it goes ahead, and OVER is raised
    assert [e for e in h.events if isinstance(e, FlightSizeNotification)] == \
        [FlightSizeNotification(FlightState.OVER, 3)]
    assert h.send([8]) == 1  # still over: no second OVER
    _ack(h, 0)
    _ack(h, 1)  # back at 2 in flight: UNDER, once
    _ack(h, 2)
    notes = [e for e in h.events if isinstance(e, FlightSizeNotification)]
    assert notes == [FlightSizeNotification(FlightState.OVER, 3),
                     FlightSizeNotification(FlightState.UNDER, 2)]


def test_after_the_lifetime_the_message_is_not_stable_and_never_resent() -> None:
    h = Harness.start(SourceCore, (0,), ume_message_stability_timeout=200,
                      ume_message_stability_lifetime=700, ume_store_check_interval=100)
    assert h.send([8]) == 1
    resent = []
    for _ in range(20):
        before = h.source.stats["proactive_retransmissions"]
        h.tick(0.1)
        if h.source.stats["proactive_retransmissions"] > before:
            resent.append(round(h.now - 1.0, 1))
    assert resent and max(resent) < 0.75
    assert [e for e in h.events if isinstance(e, MessageNotStable)] == [MessageNotStable(0)]
    assert h.source.inflight == 0 and not h.source.retained


def test_a_stability_timeout_of_0_never_resends() -> None:
    h = Harness.start(SourceCore, (0,), ume_message_stability_timeout=0,
                      ume_store_check_interval=100)
    assert h.send([8, 8]) == 2
    for _ in range(30):
        h.tick(0.1)
    assert h.source.stats["proactive_retransmissions"] == 0
    assert h.source.inflight == 2


# --- bad options -------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "expected"), [
    ("source ume_flight_size 0", "1..4294967295"),
    ("source ume_flight_size -3", "1..4294967295"),
    ("source ume_flight_size_bytes -1", "ume_flight_size_bytes"),
    ("source ume_flight_size_behavior wait", "block or notify"),
])
def test_bad_flight_size_options_are_errors_with_their_line(text: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_client_config("# a source\n" + text, "bad.cfg")
    assert expected in caught.value.message
    assert (caught.value.file, caught.value.line) == ("bad.cfg", 2)


def test_ump_source_stops_at_once_on_a_bad_flight_size(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.cfg"
    cfg.write_text("source ume_store 127.0.0.1:9\nsource ume_flight_size 0\n")
    out = subprocess.run([sys.executable, "-m", "ump", "source", "-c", str(cfg), "--topic",
                          "t", "--count", "1"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and f"{cfg}:2:" in lines[0], out.stderr

