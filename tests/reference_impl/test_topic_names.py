"""Topic names outside Latin-1 (issue 22, item 6).

Topic names are bytes on the wire and the reference processes write them in UTF-8: a source,
a store and a receiver on loopback carry ``prix/€/日本`` end to end, and a capture of that run
agrees with tshark (which shows each byte outside ASCII as U+FFFD, as ``ump dissect`` does).
A name the wire cannot carry (longer than the LBMC topic name header allows, with a NUL, empty,
not UTF-8) is refused at start-up in one line with exit status 2, before any socket is bound.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from reference_impl import runtime
from reference_impl.capture import LoopbackCapture, available_backends
from tests.reference_impl.loopback import ROOT, free_port, loopback
from ump.cli import main

TOPIC = "prix/€/日本"
COUNT = 40


def _tshark_view(topic: str) -> str:
    """How tshark 4.0 prints the name: one U+FFFD per byte outside ASCII."""
    return "".join(c if c.isascii() else "\ufffd" * len(c.encode()) for c in topic)


TOO_LONG = {
    "252-ascii-bytes": "t" * 252,
    "252-utf8-bytes": "€" * 84,  # 84 characters, 252 bytes
}


@pytest.mark.parametrize("command", ["source", "receiver"])
@pytest.mark.parametrize("name", sorted(TOO_LONG))
def test_a_topic_longer_than_the_wire_allows_is_refused_at_start_up(command: str,
                                                                     name: str) -> None:
    proc = subprocess.run([sys.executable, "-m", "ump", command, "--topic", TOO_LONG[name]],
                          capture_output=True, text=True, check=False, timeout=30, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == (f"ump {command}: topic name is 252 bytes in UTF-8; the wire carries "
                           f"at most {runtime.MAX_TOPIC_BYTES} (the LBMC topic name header)\n")


def test_the_longest_topic_the_wire_carries_is_251_bytes() -> None:
    """The limit comes from the wire definition (one-byte hdr_len, 4-byte header head)."""
    assert runtime.MAX_TOPIC_BYTES == 251
    runtime.check_topic("€" * 83 + "xx")  # 251 bytes: accepted


@pytest.mark.parametrize("command", ["source", "receiver"])
@pytest.mark.parametrize(("topic", "why"), [
    ("a\0b", "contains a NUL byte"),
    ("", "the topic name is empty"),
    ("caf\udce9", "is not valid UTF-8"),  # b"caf\xe9" from a Latin-1 terminal, as argv gives it
])
def test_a_topic_the_wire_cannot_carry_is_refused_in_one_line(
        command: str, topic: str, why: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def never(*args: object, **kwargs: object) -> int:
        raise AssertionError("the process started")
    monkeypatch.setattr("reference_impl.cli.run_forever", never)
    assert main([command, "--topic", topic]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ump {command}: ") and why in err and err.count("\n") == 1


@pytest.mark.oracle
def test_a_utf8_topic_goes_from_source_through_store_to_receiver(tmp_path: Path) -> None:
    if not available_backends():
        pytest.skip("no capture tool (tcpdump, dumpcap) usable here")
    deliveries = tmp_path / "deliveries.jsonl"
    pcap = tmp_path / "utf8-topic.pcap"
    transport, request, receiver_request = free_port(), free_port(), free_port()
    with loopback(tmp_path) as net:
        # the source's and receiver's ports are free ones, not UM's ranges that other tests'
        # clients share: the capture holds this run's traffic only (each context has a
        # request port of its own, the receiver's too)
        ports = [net.resolver_port, net.store_port, transport, request, receiver_request]
        with LoopbackCapture(pcap, ports=ports):
            config = net.client_config(
                "client.cfg", f"context transport_tcp_port_low {transport}",
                f"context transport_tcp_port_high {transport}",
                f"context request_tcp_port_low {request}",
                f"context request_tcp_port_high {request}")
            receiver_config = net.client_config(
                "receiver.cfg", f"context request_tcp_port_low {receiver_request}",
                f"context request_tcp_port_high {receiver_request}")
            receiver = net.start("receiver", "-c", str(receiver_config), "--topic", TOPIC,
                                 "--count", str(COUNT), "--out", str(deliveries))
            # sends until stopped, so the receiver's start-up time does not matter (it may
            # join late: what it missed comes from the store)
            source = net.start("source", "-c", str(config), "--topic", TOPIC,
                               "--count", "1000000", "--rate", "200")
            try:
                assert receiver.finish(timeout=40) == 0, receiver.stderr + source.stderr
                source.proc.send_signal(signal.SIGINT)
                assert source.finish(timeout=20) == 130, source.stderr
            finally:
                source.stop()
                receiver.stop()
        store_log = net.store.stderr
    assert "Traceback" not in source.stderr + receiver.stderr + store_log
    assert "registered; next sequence number 0" in source.stderr
    got = [json.loads(line) for line in deliveries.read_text().splitlines()]
    sqns = [d["sqn"] for d in got]  # at least COUNT: a delivery batch is written out whole
    assert len(sqns) >= COUNT and sorted(sqns) == list(range(len(sqns))), sqns
    assert all(d["payload"].startswith(f"{d['sqn']}:") for d in got)

    dissect = subprocess.run(
        [sys.executable, "-m", "ump", "dissect", str(pcap), "--store-port",
         str(net.store_port), "--lbmr-port", str(net.resolver_port), "--lbttcp-port",
         f"{transport},{request}", "--um-only",
         "--check-tshark"], capture_output=True, text=True, check=False, timeout=120, cwd=ROOT)
    assert dissect.returncode == 0, dissect.stderr[-3000:]
    assert "# tshark cross-check: 0 disagreement(s)" in dissect.stderr
    shown = f"{_tshark_view(TOPIC)!r}(utf-8:{TOPIC!r})"
    assert f"lbmc.topicname.topic={shown}" in dissect.stdout  # the registrations (PREG)
    assert f"lbmr.tir.name={shown}" in dissect.stdout  # the source's advertisement
