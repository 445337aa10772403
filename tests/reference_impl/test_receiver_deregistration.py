"""A receiver that deregisters (guide "RPP Deregistration": it "can still receive messages
after deregistering, but cannot acknowledge message consumption", and "must restart in order to
register again"; what it had not yet got is unrecoverable).

Core level in the simulator (the deregistration PREG, per-store "Deregistration Success" and
the final "Deregistration Complete" events, silence towards the stores afterwards, no
re-registration), then ``ump receiver`` as a real process next to a real ``ump store`` and
``ump source``: SIGUSR1 deregisters it and it goes on receiving; ``--deregister`` leaves after
``--count`` deliveries and exits 0.
"""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from reference_impl import events as ev
from reference_impl.deployment import SimDeployment
from reference_impl.receiver import ReceiverCore
from reference_impl.source import SendError, SendErrorCode
from reference_impl.store import StoreCore, TopicPolicy, TopicRule
from tests.reference_impl.loopback import loopback
from wire.lbmc import LbmcMessage, UmeAck, UmeKeepalive, UmePreg
from wire.lbttcp import LbttcpStream

TOPIC = "dereg.quotes"


def deployment(stores: int = 1, **receiver: Any) -> tuple[SimDeployment, ReceiverCore]:
    d = SimDeployment(seed=5)
    for i in range(stores):
        d.add_store(f"store{i}", port=14567 + i,
                    topics=(TopicRule(".*", TopicPolicy(), kind="PCRE"),), seed=11 + i)
    d.add_source("src", TOPIC)
    rcv = d.add_receiver("rcv", TOPIC, **receiver)
    assert d.run_until(lambda: d.sources["src"].complete and rcv.complete, 10)
    return d, rcv


def from_receiver(d: SimDeployment, store: StoreCore, since: float = 0.0
                  ) -> list[tuple[float, LbmcMessage]]:
    """What the receiver wrote to ``store`` (its time, decoded), from the simulated trace."""
    ip = d.ips["rcv"]
    framers: dict[Any, LbttcpStream] = {}
    out = []
    for packet in d.net.trace:
        if packet.proto != "tcp" or packet.dst != store.addr or packet.src[0] != ip:
            continue
        if packet.kind == "syn":
            framers[packet.src] = LbttcpStream()
        elif packet.kind == "data":
            for item in framers.setdefault(packet.src, LbttcpStream()).feed(packet.data):
                if item.message is not None and packet.time >= since:
                    out.append((packet.time, item.message))
    return out


def delivered(d: SimDeployment) -> list[bytes]:
    return [e.payload for e in d.events("rcv", ev.MessageDelivered)
            if isinstance(e, ev.MessageDelivered)]


def test_deregistration_is_confirmed_per_store_then_complete_and_the_stores_drop_it() -> None:
    d, rcv = deployment(stores=2)
    src = d.sources["src"]
    regs = {r.info.index: r.reg_id for r in rcv.registered_stores}
    src.send(b"before")
    assert d.run_until(lambda: delivered(d) == [b"before"], 5)
    rcv.deregister()
    assert rcv.deregistering and not rcv.deregistered
    assert d.run_until(lambda: rcv.deregistered, 5)
    left = d.events("rcv", ev.ReceiverDeregistered)
    assert sorted(e.store.index for e in left[:2] if isinstance(e, ev.ReceiverDeregistered)
                  and e.store is not None) == [0, 1]
    assert all(isinstance(e, ev.ReceiverDeregistered) and e.source == rcv.primary.name
               for e in left[:2])
    assert left[2:] == [ev.ReceiverDeregistered(None)]
    for i, store in enumerate(d.stores.values()):
        deleted = d.events(f"store{i}", ev.ClientStateDeleted)
        assert ev.ClientStateDeleted("receiver", regs[i], "deregistered") in deleted
        (_, last), = [m for m in from_receiver(d, store) if m[1].header(UmePreg)][-1:]
        preg = last.header(UmePreg)
        assert preg is not None and preg.d_flag == 1 and preg.reg_id == regs[i]
    texts = [e.text for e in d.events("rcv", ev.LogRecord) if isinstance(e, ev.LogRecord)]
    assert sum("deregistration confirmed" in t for t in texts) == 2
    assert any(t == "deregistration complete: every store confirmed" for t in texts)


def test_after_deregistering_it_receives_but_acknowledges_nothing_and_never_registers() -> None:
    d, rcv = deployment()
    src = d.sources["src"]
    store = d.stores["store0"]
    for i in range(3):
        src.send(b"a%d" % i)
    assert d.run_until(lambda: len(delivered(d)) == 3, 5)
    d.run(1)
    rcv.deregister()
    assert d.run_until(lambda: rcv.deregistered, 5)
    since = d.now
    for i in range(3):
        src.send(b"b%d" % i)
    d.run(60)  # many ACK batching and keepalive intervals, registration intervals, SRIs
    assert delivered(d) == [b"a0", b"a1", b"a2", b"b0", b"b1", b"b2"]  # still receives
    after = from_receiver(d, store, since)
    assert [m.label() for _, m in after
            if m.header(UmeAck) or m.header(UmeKeepalive) or m.header(UmePreg)] == []
    assert len(d.events("rcv", ev.ReceiverRegistrationSuccess)) == 1
    before = from_receiver(d, store)
    assert any(m.header(UmeAck) for _, m in before)  # it did acknowledge before
    rcv.ack(5)  # an explicit ACK does not go out either
    d.run(1)
    assert from_receiver(d, store, since) == after
    rcv.deregister()  # a second call changes nothing
    assert len(d.events("rcv", ev.ReceiverDeregistered)) == 2


def test_what_it_still_missed_is_lost_at_once_and_delivery_goes_on() -> None:
    d, rcv = deployment(reg_id=4242, retransmit_request_message_timeout=600_000)
    src = d.sources["src"]
    store = d.stores["store0"]
    src.send(b"s0")
    assert d.run_until(lambda: delivered(d) == [b"s0"], 5)
    d.run(1)
    d.kill("rcv")
    src.send(b"s1")
    src.send(b"s2")
    store._on_rxreq = lambda *args: None  # type: ignore[method-assign]
    rcv = d.restart("rcv")  # type: ignore[assignment]
    assert d.run_until(lambda: rcv.complete and bool(rcv.requests), 10)  # asks for 1 and 2
    rcv.deregister()  # not after the ten minutes of the message timeout: at once
    assert d.events("rcv", ev.UnrecoverableLoss) == [ev.UnrecoverableLoss(1, 2)]
    src.send(b"s3")
    assert d.run_until(lambda: delivered(d) == [b"s0", b"s3"], 5)


def test_deregistering_with_no_store_registered_is_done_at_once() -> None:
    d = SimDeployment(seed=5)
    rcv = d.add_receiver("rcv", TOPIC)
    rcv.deregister()
    assert rcv.deregistered and not rcv.deregistering
    assert d.events("rcv", ev.ReceiverDeregistered) == [ev.ReceiverDeregistered(None)]


def test_a_registration_granted_after_the_deregistration_is_undone() -> None:
    d = SimDeployment(seed=5)
    d.add_store("store0", topics=(TopicRule(".*", TopicPolicy(), kind="PCRE"),), seed=11)
    src = d.add_source("src", TOPIC)
    assert d.run_until(lambda: src.complete, 5)
    rcv = d.add_receiver("rcv", TOPIC)
    register = rcv._register

    def and_leave(reg: Any) -> None:  # the application leaves while the PREG is on its way
        register(reg)
        rcv.deregister()
    rcv._register = and_leave  # type: ignore[method-assign]
    d.run(10)
    assert len(d.events("rcv", ev.ReceiverRegistrationSuccess)) == 1  # the answer came
    deleted = d.events("store0", ev.ClientStateDeleted)
    assert [(e.role, e.reason) for e in deleted
            if isinstance(e, ev.ClientStateDeleted)] == [("receiver", "deregistered")]
    assert rcv.deregistered and not rcv.registered_stores
    assert not rcv.complete or d.events("rcv", ev.ReceiverRegistrationComplete) == []


# --- ump receiver: SIGUSR1 and --deregister --------------------------------------------------


def deliveries(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue  # a line being written
    return out


def wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.05)


def test_ump_receiver_deregisters_on_sigusr1_and_goes_on_receiving(tmp_path: Path) -> None:
    with loopback(tmp_path) as lb:
        cfg = lb.client_config("client.cfg")
        out = tmp_path / "rcv.jsonl"
        receiver = lb.start("receiver", "-c", str(cfg), "--topic", TOPIC, "--out", str(out))
        source = lb.start("source", "-c", str(cfg), "--topic", TOPIC, "--count", "100000",
                          "--rate", "200")
        try:
            source.wait_for("registered; next sequence number")
            wait(lambda: len(deliveries(out)) >= 20, 20, "no deliveries:\n" + receiver.stderr)
            receiver.proc.send_signal(signal.SIGUSR1)
            receiver.wait_for("ump receiver: deregistering from every store")
            receiver.wait_for("ump receiver: deregistered from 1 store", 10)
            count = len(deliveries(out))
            wait(lambda: len(deliveries(out)) >= count + 20, 20,
                 "no deliveries after the deregistration:\n" + receiver.stderr)
            assert receiver.proc.poll() is None  # it goes on
            numbers = [d["sqn"] for d in deliveries(out)]
            assert numbers == list(range(numbers[0], numbers[0] + len(numbers)))
        finally:
            receiver.stop()
            source.stop()


def test_ump_receiver_deregister_leaves_after_count_and_exits_0(tmp_path: Path) -> None:
    with loopback(tmp_path) as lb:
        cfg = lb.client_config("client.cfg")
        out = tmp_path / "rcv.jsonl"
        receiver = lb.start("receiver", "-c", str(cfg), "--topic", TOPIC, "--out", str(out),
                            "--count", "30", "--deregister")
        source = lb.start("source", "-c", str(cfg), "--topic", TOPIC, "--count", "100000",
                          "--rate", "200")
        try:
            assert receiver.finish(30) == 0, receiver.stderr
            assert "ump receiver: deregistered from 1 store" in receiver.stderr
            assert len(deliveries(out)) >= 30
        finally:
            receiver.stop()
            source.stop()


def test_ump_receiver_deregister_without_count_is_a_one_line_error(tmp_path: Path) -> None:
    with loopback(tmp_path) as lb:
        receiver = lb.start("receiver", "--topic", TOPIC, "--deregister")
        assert receiver.finish(20) == 2
        (line,) = receiver.stderr.splitlines()
        assert line.startswith("ump receiver: --deregister needs --count")


def test_a_send_after_the_source_deregistered_fails_with_a_clear_error() -> None:
    """The source side of the guide's "RPP Deregistration" ("the source is blocked after
    deregistering"): ``send`` and ``send_many`` both refuse, saying why and what to do."""
    d, _rcv = deployment()
    src = d.sources["src"]
    src.deregister()
    assert d.run_until(lambda: src.deregistered, 5)
    for send in (lambda: src.send(b"x"), lambda: src.send_many([b"y", b"z"])):
        with pytest.raises(SendError) as info:
            send()
        assert info.value.code is SendErrorCode.DEREGISTERED
        assert "deregistered from its stores and cannot send" in str(info.value)
        assert "create it again" in str(info.value)
