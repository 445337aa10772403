"""Explicit acknowledgements (guide "Acknowledgement Generation", "Explicit Acknowledgments",
"Batching Acknowledgments"; docs/semantics.md §1.5): with ``ume_explicit_ack_only`` 1 the
receiver acknowledges only what the application acknowledged (:meth:`ReceiverCore.ack`), in
ascending order, never something not delivered; without it, ACKs are batched every
``ume_ack_batching_interval`` or sent at once.  Then the application of ``ump receiver
--explicit-ack MS`` / ``--ack-file PATH`` (:mod:`reference_impl.explicit_ack`) and its one-line
errors.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

import pytest

import reference_impl.cli
from reference_impl.aio import AioHost, HostError
from reference_impl.events import MessageDelivered
from reference_impl.explicit_ack import ExplicitAcker, parse_line
from reference_impl.receiver import source_name
from tests.reference_impl.test_quorum_receiver import REQUEST, Rig
from ump.cli import main
from wire.lbmc import UmeAck


def explicit(**options: Any) -> Rig:
    """A receiver in explicit-ACK mode with two stores (one group), registered at 0, that
    received and delivered 0..9 live."""
    rig = Rig(2, high=0, ume_explicit_ack_only=1, **options)
    rig.grant(0, low=0)
    rig.grant(1, low=0)
    rig.live(*range(10))
    assert rig.delivered() == list(range(10))
    return rig


def test_nothing_is_acknowledged_before_the_application() -> None:
    rig = explicit(ume_proactive_keepalive_interval=1500)
    rig.tick(2.0)  # batching intervals and a keepalive pass
    assert rig.acks(0) == rig.acks(1) == []
    rig.rcv.ack(4)
    rig.pump()
    assert rig.acks(0) == rig.acks(1) == [4]
    rig.tick(1.6)  # the keepalive repeats what the application acknowledged, nothing more
    assert max(rig.acks(0)) == 4


def test_acks_go_out_in_ascending_order_only() -> None:
    rig = explicit()
    for sqn in (6, 3, 6, 8):
        rig.rcv.ack(sqn)
        rig.pump()
    assert rig.acks(0) == rig.acks(1) == [6, 8]


def test_what_was_not_delivered_cannot_be_acknowledged() -> None:
    rig = explicit()
    with pytest.raises(ValueError) as info:
        rig.rcv.ack(10)
    assert "not delivered" in str(info.value) and "delivered up to 9" in str(info.value)
    with pytest.raises(ValueError, match="no source"):
        rig.rcv.ack(3, "TCP:10.9.9.9:1")
    rig.pump()
    assert rig.acks(0) == []


def test_delivery_confirmation_of_an_explicit_ack_says_so() -> None:
    rig = Rig(1, high=0, acktosrc=True, ume_explicit_ack_only=1)
    rig.grant(0, low=0)
    rig.live(0, 1, 2)
    rig.rcv.ack(2)
    rig.pump()
    confirmations = [h for m in rig.sent.get(REQUEST, []) for h in m.headers
                     if isinstance(h, UmeAck)]
    assert [(h.seqnum, h.flags & 0x08) for h in confirmations] == [(2, 0x08)]


def test_batched_acks_wait_for_the_interval() -> None:
    rig = Rig(1, high=0, ume_ack_batching_interval=200)
    rig.grant(0, low=0)
    rig.live(*range(5))
    rig.tick(0.1)
    assert rig.acks(0) == []
    rig.tick(0.15)
    assert rig.acks(0) == [4]  # the contiguous run consumed, in one ACK


def test_without_batching_each_chunk_is_acknowledged_at_once() -> None:
    rig = Rig(1, high=0, ume_use_ack_batching=0)
    rig.grant(0, low=0)
    rig.live(0, 1)
    rig.live(2)
    assert rig.acks(0) == [1, 2]


# --- consumption out of order (an application that retains its messages) -----------------------


def retaining(**options: Any) -> Rig:
    """A receiver whose application retains 1..10 (the store answered low 1)."""
    rig = Rig(1, high=0, **options)
    rig.rcv.retain_messages()
    rig.grant(0, low=1)
    rig.live(*range(1, 11))
    assert rig.delivered() == list(range(1, 11))
    return rig


def test_batching_acknowledges_the_contiguous_run_consumed() -> None:
    """The guide's example: consumed 1, 2, then 4, 5, 7, 8, 6, 10, 3 -> 3 - 8."""
    rig = retaining(ume_ack_batching_interval=100)
    rig.tick(0.2)
    assert rig.acks(0) == []  # delivery is not consumption
    for sqn in (1, 2):
        rig.rcv.consume(sqn)
    rig.tick(0.1)
    assert rig.acks(0) == [2]
    for sqn in (4, 5, 7, 8, 6, 10):
        rig.rcv.consume(sqn)
    rig.tick(0.3)
    assert rig.acks(0) == [2]
    rig.rcv.consume(3)
    rig.tick(0.1)
    assert rig.acks(0) == [2, 8]
    rig.rcv.consume(9)
    rig.tick(0.1)
    assert rig.acks(0) == [2, 8, 10]


def test_without_batching_consumption_is_acknowledged_at_once() -> None:
    rig = retaining(ume_use_ack_batching=0)
    rig.rcv.consume(2)
    rig.rcv.consume(1)
    rig.rcv.consume(1)  # again: nothing
    rig.pump()
    assert rig.acks(0) == [2]
    with pytest.raises(ValueError, match="not delivered"):
        rig.rcv.consume(11)


def test_a_lost_message_counts_as_consumed() -> None:
    # 3 is a transport gap: off-transport recovery asks for it at once (no initial delay) and
    # gives it up retransmit_request_message_timeout later
    rig = Rig(1, high=0, ume_use_ack_batching=0, retransmit_request_interval=100,
              retransmit_request_message_timeout=300, otr_request_initial_delay=0)
    rig.rcv.retain_messages()
    rig.grant(0, low=1)
    rig.live(1, 2, 4)  # 3 never comes
    rig.tick(0.5)
    assert rig.delivered() == [1, 2, 4]
    for sqn in (4, 1, 2):
        rig.rcv.consume(sqn)
    rig.pump()
    assert rig.acks(0)[-1] == 4


def test_consume_without_retaining_changes_nothing() -> None:
    rig = Rig(1, high=0, ume_use_ack_batching=0)
    rig.grant(0, low=1)
    rig.live(1, 2, 3)
    rig.rcv.consume(1)
    rig.pump()
    assert rig.acks(0) == [3]  # delivery was consumption already


# --- the application of ump receiver -------------------------------------------------------------


@pytest.mark.parametrize(("line", "parsed"), [
    ("7", (None, 7)), ("  12  ", (None, 12)), ("TCP:10.0.0.3:14371 5", ("TCP:10.0.0.3:14371", 5)),
    ("4294967295", (None, 4294967295))])
def test_ack_file_lines(line: str, parsed: tuple[str | None, int]) -> None:
    assert parse_line(line) == parsed


@pytest.mark.parametrize("line", ["x", "-1", "4294967296", "a b c", "3.5", "TCP:x y"])
def test_bad_ack_file_lines(line: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_line(line)
    assert "\n" not in str(info.value)


def acker(rig: Rig, **kw: Any) -> ExplicitAcker:
    """An acker of the rig's receiver, driven by hand (no host loop)."""
    return ExplicitAcker(cast(AioHost, object()), rig.rcv, **kw)


def test_ack_file_acknowledges_in_file_order_once_delivered(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rig = Rig(1, high=0, ume_explicit_ack_only=1)
    rig.grant(0, low=0)
    path = tmp_path / "acks"
    app = acker(rig, ack_file=str(path))
    assert app._read() == []  # no file yet
    rig.live(0, 1, 2)
    name = source_name(rig.rcv.primary.source)  # type: ignore[arg-type]
    path.write_text(f"1\njunk\n{name} 2\n5\n3\n7")  # 7: not a complete line yet
    app.pending.extend(app._read())
    assert list(app.pending) == [(None, 1), (name, 2), (None, 5), (None, 3)]
    assert "line 2" in capsys.readouterr().err
    app._ack([], 0.0)
    rig.pump()
    assert rig.acks(0) == [1, 2]  # 5 is not delivered yet: it, and 3 behind it, wait
    rig.live(3, 4, 5)
    app._ack([], 0.0)
    rig.pump()
    assert rig.acks(0) == [1, 2, 5]  # 3 after 5 sends nothing
    assert not app.pending
    with path.open("a") as f:
        f.write("\n")
    assert app._read() == [(None, 7)]


def test_schedule_acknowledges_the_newest_delivered() -> None:
    rig = Rig(1, high=0, ume_explicit_ack_only=1)
    rig.grant(0, low=0)
    app = acker(rig, every_ms=50)
    rig.live(0, 1, 2)
    for event in rig.events:
        if isinstance(event, MessageDelivered):
            app.offer(event)
    app._ack(list(app.delivered.items()), 0.0)
    rig.pump()
    assert rig.acks(0) == [2]


def test_consume_file_consumes_in_file_order(tmp_path: Path) -> None:
    rig = Rig(1, high=0, ume_use_ack_batching=0)
    rig.rcv.retain_messages()
    rig.grant(0, low=0)
    path = tmp_path / "consumed"
    app = acker(rig, ack_file=str(path), consume=True)
    rig.live(0, 1, 2, 3)
    path.write_text("1\n0\n3\n")
    app.pending.extend(app._read())
    app._ack([], 0.0)
    rig.pump()
    assert rig.acks(0) == [1]  # 3 waits for 2
    with path.open("a") as f:
        f.write("2\n")
    app.pending.extend(app._read())
    app._ack([], 0.0)
    rig.pump()
    assert rig.acks(0) == [1, 3]


class FakeHost:
    """Runs each call into the core at once; closes (HostError) after ``calls`` calls."""

    def __init__(self, rig: Rig, calls: int) -> None:
        self.rig, self.left = rig, calls

    def call(self, core: object, action: Callable[[float], None]) -> None:
        if self.left == 0:
            raise HostError("closed")
        self.left -= 1
        action(self.rig.now)
        self.rig.pump()


def test_the_schedule_runs_until_the_host_closes(tmp_path: Path) -> None:
    rig = Rig(1, high=0, ume_explicit_ack_only=1)
    rig.grant(0, low=0)
    rig.live(0, 1, 2)
    app = ExplicitAcker(cast(AioHost, FakeHost(rig, calls=3)), rig.rcv, every_ms=5)
    app.offer(MessageDelivered(2, b"m2", False, rig.rcv.primary.name))
    asyncio.run(asyncio.wait_for(app.run(), 5))  # returns once the host is closed
    assert rig.acks(0) == [2] and app.acked == 3  # the same ACK thrice, sent once
    path = tmp_path / "acks"
    path.write_text("1\n2\n")
    app = ExplicitAcker(cast(AioHost, FakeHost(rig, calls=2)), rig.rcv, ack_file=str(path))
    asyncio.run(asyncio.wait_for(app.run(), 5))
    assert app.acked == 2 and rig.acks(0) == [2]  # (both at or below what was sent)


def test_acker_needs_exactly_one_way() -> None:
    rig = Rig(1)
    for kw in ({}, {"every_ms": 5, "ack_file": "x"}, {"every_ms": 5, "consume": True}):
        with pytest.raises(ValueError):
            acker(rig, **kw)


# --- ump receiver's options ----------------------------------------------------------------------

Ump = Callable[..., tuple[int, str]]


@pytest.fixture
def ump(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Ump:
    """``ump ARGS`` in this process; getting as far as starting the receiver fails the test."""
    def started(*_: object) -> int:
        raise AssertionError("the receiver would start")
    monkeypatch.setattr(reference_impl.cli, "_run", started)

    def run(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(list(argv))
        return code, capsys.readouterr().err
    return run


@pytest.mark.parametrize(("args", "words"), [
    (["--explicit-ack", "100", "--ack-file", "a"], ["--explicit-ack", "--ack-file"]),
    (["--consume-rate", "5", "--explicit-ack", "100"], ["--consume-rate", "--explicit-ack"]),
    (["--explicit-ack", "-3"], ["--explicit-ack", "-3"]),
    (["--explicit-ack", "9999999"], ["--explicit-ack"]),
    (["--ack-file", ""], ["--ack-file"]),
    (["--consume-file", "c", "--ack-file", "a"], ["--ack-file", "--consume-file"]),
    (["--consume-file", ""], ["--consume-file"]),
])
def test_bad_ack_options_are_one_line_errors(ump: Ump, args: list[str],
                                             words: list[str]) -> None:
    code, err = ump("receiver", "--topic", "t", *args)
    assert code == 2, err
    assert "Traceback" not in err and err.startswith("ump receiver: ")
    assert len(err.splitlines()) == 1, err
    for word in words:
        assert word in err


def test_ack_file_that_is_a_directory(ump: Ump, tmp_path: Path) -> None:
    code, err = ump("receiver", "--topic", "t", "--ack-file", str(tmp_path))
    assert code == 2 and len(err.splitlines()) == 1 and str(tmp_path) in err


def test_unknown_behaviour_in_the_receiver_configuration(ump: Ump, tmp_path: Path) -> None:
    cfg = tmp_path / "lbm.cfg"
    cfg.write_text("receiver ume_consensus_sequence_number_behavior median\n")
    code, err = ump("receiver", "--topic", "t", "-c", str(cfg))
    assert code == 2, err
    assert len(err.splitlines()) == 1 and "median" in err and "Traceback" not in err
