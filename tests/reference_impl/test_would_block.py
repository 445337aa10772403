"""The non-blocking send and the flight size (docs/semantics.md §1.7, guide "UMP Flight Size"):
with ``ume_flight_size_behavior`` block a full flight makes :meth:`SourceCore.try_send` return
"would block" as a value (never raised), and the message is neither sent nor numbered nor
counted; bad flight-size options are one-line configuration errors, in the configuration file
and in :class:`SourceConfig` alike.

``ump source --nonblocking`` sends through it (:func:`reference_impl.runtime.send_messages`
with ``nonblocking``): it reports the first "would block" in one line, retries the same message
once the flight has room and counts the refusals at the end; the flight-size suite's
SRC-FLT-009 judges that from outside.  Also here: ``--until-sqn`` counts sequence numbers, so
with fragmented messages it stops once the next sequence number is at or above it.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

import reference_impl.cli
from reference_impl.config.client import ConfigError, parse_client_config
from reference_impl.events import FlightSizeNotification, FlightState
from reference_impl.source import SendError, SendErrorCode, SourceConfig, SourceCore
from tests.reference_impl.loopback import loopback
from tests.reference_impl.test_source_fastpath import ACK, Harness
from ump.cli import main
from wire.lbmc import ACK_NAK, AckType


def _state(h: Harness) -> tuple[object, ...]:
    src = h.source
    return (src.next_sqn, src.stats["sent"], src.inflight, src.inflight_bytes,
            list(src.retained), src.retained_bytes)


def test_a_full_flight_returns_would_block_and_takes_nothing() -> None:
    h = Harness.start(SourceCore, (0,), ume_flight_size=2)
    assert h.source.try_send(b"a") == 0
    assert h.source.try_send(b"b") == 1
    h.collect()
    h.written.clear()
    before = _state(h)
    for _ in range(3):  # asking again does not change it either
        refused = h.source.try_send(b"c")
        assert isinstance(refused, SendError)
        assert refused.code is SendErrorCode.WOULD_BLOCK
        assert str(refused) == "send would block because of flight size"
    h.collect()
    assert _state(h) == before
    assert not h.written.get(h.transport_key)  # nothing went out
    assert not [e for e in h.events if isinstance(e, FlightSizeNotification)]
    # a stability ACK makes room: the same call now succeeds, with the next number
    h.feed(h.store_keys[0], [ACK.pack(type=AckType.STABLE, seqnum=0)])
    assert h.source.try_send(b"c") == 2
    h.collect()
    assert h.written.get(h.transport_key)


def test_a_nack_makes_room_too() -> None:
    h = Harness.start(SourceCore, (0,), ume_flight_size=1)
    assert h.source.try_send(b"a") == 0
    assert isinstance(h.source.try_send(b"b"), SendError)
    h.feed(h.store_keys[0], [ACK.pack(flags=ACK_NAK, type=AckType.STABLE, seqnum=0)])
    assert h.source.try_send(b"b") == 1


def test_the_byte_limit_would_block_as_well() -> None:
    h = Harness.start(SourceCore, (0,), ume_flight_size=10, ume_flight_size_bytes=10)
    assert h.source.try_send(b"x" * 6) == 0
    refused = h.source.try_send(b"x" * 5)
    assert isinstance(refused, SendError) and refused.code is SendErrorCode.WOULD_BLOCK
    assert h.source.try_send(b"x" * 4) == 1  # fits exactly
    too_big = h.source.try_send(b"x" * 11)
    assert isinstance(too_big, SendError) and too_big.code is SendErrorCode.TOO_BIG


def test_notify_sends_and_tells_instead() -> None:
    h = Harness.start(SourceCore, (0,), ume_flight_size=1, ume_flight_size_behavior="Notify")
    assert h.source.try_send(b"a") == 0
    assert h.source.try_send(b"b") == 1
    h.collect()
    assert [e for e in h.events if isinstance(e, FlightSizeNotification)] == \
        [FlightSizeNotification(FlightState.OVER, 2)]


def test_other_refusals_are_values_too() -> None:
    h = Harness.start(SourceCore, (0,))
    h.source.deregister()
    refused = h.source.try_send(b"a")
    assert isinstance(refused, SendError) and refused.code is SendErrorCode.DEREGISTERED
    with pytest.raises(SendError):  # send itself still raises, as before
        h.source.send(b"a")


# --- bad flight-size options -------------------------------------------------------------------


@pytest.mark.parametrize("options, words", [
    ({"ume_flight_size": 0}, ["ume_flight_size 0", "at least 1"]),
    ({"ume_flight_size": -3}, ["ume_flight_size -3", "at least 1"]),
    ({"ume_flight_size_bytes": -1}, ["ume_flight_size_bytes -1"]),
    ({"ume_flight_size_behavior": "wait"}, ["ume_flight_size_behavior 'wait'", "block or notify"]),
])
def test_the_core_refuses_bad_flight_options_in_one_line(options: dict[str, object],
                                                         words: list[str]) -> None:
    with pytest.raises(ValueError) as caught:
        SourceConfig(**options)  # type: ignore[arg-type]
    text = str(caught.value)
    assert "\n" not in text and all(w in text for w in words), text


@pytest.mark.parametrize("line, words", [
    ("source ume_flight_size 0", ["ume_flight_size"]),
    ("source ume_flight_size -5", ["ume_flight_size"]),
    ("source ume_flight_size many", ["ume_flight_size"]),
    ("source ume_flight_size_behavior wait", ["block or notify"]),
    ("source ume_flight_size_behavior", ["ume_flight_size_behavior"]),
])
def test_the_configuration_file_refuses_them_in_one_line(line: str, words: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_client_config(line, "client.cfg")
    text = str(caught.value)
    assert "\n" not in text and "client.cfg" in text and all(w in text for w in words), text


def test_ump_source_says_so_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    def started(*_: object) -> int:
        raise AssertionError("the source would start")

    monkeypatch.setattr(reference_impl.cli, "_run", started)
    cfg = tmp_path / "lbm.cfg"
    cfg.write_text("source ume_flight_size 0\n")
    code = main(["source", "-c", str(cfg), "--topic", "t", "--count", "1"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "Traceback" not in err and err.splitlines() == [err.rstrip("\n")], err
    assert "ume_flight_size" in err


# --- ump source --nonblocking and --until-sqn, against a real store ----------------------------

TOPIC = "would.block"


def _deliveries(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait(predicate: object, timeout: float, message: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, message
        time.sleep(0.05)


def test_ump_source_nonblocking_reports_would_block_and_retries_the_same_message(
        tmp_path: Path) -> None:
    """Flight size 1 at full speed against a real store: nearly every send finds the flight
    full.  The non-blocking source says so once, counts the refusals, and every message still
    arrives once, in order, with its own payload (a refused message is retried, not
    skipped)."""
    with loopback(tmp_path) as lb:
        cfg = lb.client_config("client.cfg", "source ume_flight_size 1",
                               "source ume_flight_size_behavior block")
        out = tmp_path / "rcv.jsonl"
        receiver = lb.start("receiver", "-v", "-c", str(cfg), "--topic", TOPIC, "--out",
                            str(out), "--count", "40")
        source = lb.start("source", "-c", str(cfg), "--topic", TOPIC, "--count", "40",
                          "--nonblocking", "--linger", "5", "--wait-start")
        try:
            # the receiver joins before the first message (else it may never see the source)
            receiver.wait_for("ReceiverRegistrationComplete", 20)
            source.wait_for("registered; next sequence number 0")
            source.proc.send_signal(signal.SIGUSR2)
            assert source.finish(60) == 0, source.stderr
            err = source.stderr
            assert err.count(reference_impl.cli.WOULD_BLOCK_LINE) == 1, err
            assert "sent 40 messages, 0 still in flight" in err, err
            (total,) = [line for line in err.splitlines() if "returned would-block" in line]
            refused = int(total.split()[2])
            assert refused >= 1, total
            assert "Traceback" not in err
            _wait(lambda: len(_deliveries(out)) >= 40, 20, receiver.stderr)
            got = _deliveries(out)
            assert [d["sqn"] for d in got] == list(range(40))
            assert [str(d["payload"]).split(":")[0] for d in got] == \
                [str(n) for n in range(40)]
        finally:
            receiver.stop()
            source.stop()


def test_ump_source_blocking_never_mentions_would_block(tmp_path: Path) -> None:
    """The same run without --nonblocking: the blocking application waits silently."""
    with loopback(tmp_path) as lb:
        cfg = lb.client_config("client.cfg", "source ume_flight_size 1")
        source = lb.start("source", "-c", str(cfg), "--topic", TOPIC, "--count", "20",
                          "--linger", "5")
        try:
            assert source.finish(60) == 0, source.stderr
            assert "would block" not in source.stderr and \
                "would-block" not in source.stderr, source.stderr
            assert "sent 20 messages" in source.stderr
        finally:
            source.stop()


@pytest.mark.parametrize("until, messages, next_sqn", [(10, 3, 12), (8, 2, 8), (1, 1, 4)])
def test_until_sqn_counts_sequence_numbers_of_fragmented_messages(
        tmp_path: Path, until: int, messages: int, next_sqn: int) -> None:
    """64-byte messages with a 44-byte maximum datagram are 4 fragments (4 sequence numbers)
    each: ``--until-sqn N`` sends every message that starts below N and stops (it used to send
    N messages, 4N sequence numbers).  The source started again with the same session ID
    resumes where the store says it stopped, and has nothing left to send."""
    with loopback(tmp_path) as lb:
        cfg = lb.client_config("client.cfg", "source transport_tcp_datagram_max_size 44",
                               "source ume_session_id 0x5E55177")
        args = ("source", "-c", str(cfg), "--topic", TOPIC, "--until-sqn", str(until),
                "--size", "64", "--linger", "5")
        source = lb.start(*args)
        try:
            assert source.finish(60) == 0, source.stderr
            assert f"sent {messages} messages, 0 still in flight" in source.stderr, \
                source.stderr
        finally:
            source.stop()
        again = lb.start(*args)
        try:
            assert again.finish(60) == 0, again.stderr
            assert f"registered; next sequence number {next_sqn}" in again.stderr, again.stderr
            assert "sent 0 messages" in again.stderr, again.stderr
        finally:
            again.stop()


def test_ump_source_stopped_while_sending_still_reports_what_went_out(tmp_path: Path) -> None:
    """SIGTERM in the middle of a non-blocking run: the source still prints how many messages
    went out, how many are in flight and how many sends returned would-block."""
    with loopback(tmp_path) as lb:
        cfg = lb.client_config("client.cfg", "source ume_flight_size 1",
                               "source ume_flight_size_behavior block")
        source = lb.start("source", "-c", str(cfg), "--topic", TOPIC, "--count", "100000000",
                          "--nonblocking", "--rate", "500")
        try:
            source.wait_for(reference_impl.cli.WOULD_BLOCK_LINE, 30)
            time.sleep(0.3)
            source.proc.send_signal(signal.SIGTERM)
            source.finish(30)
            err = source.stderr
            (sent,) = [line for line in err.splitlines() if "ump source: sent " in line]
            assert int(sent.split()[3]) >= 1, sent
            (total,) = [line for line in err.splitlines() if "returned would-block" in line]
            assert int(total.split()[2]) >= 1, total
            assert "Traceback" not in err
        finally:
            source.stop()
