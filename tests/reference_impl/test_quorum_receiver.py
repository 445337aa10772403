"""The receiver's quorum/consensus rules, on the core alone (docs/semantics.md §1.2, §1.4, §1.9):
registration completion by the intragroup and intergroup behaviours, the consensus low sequence
number per group, ``retransmit_request_maximum`` against the recovery callback (the guide's
"Recovery Management" example), re-registration only with the stores whose SRI version went up,
an unanswered request retried at another store, the message timeout, delivery confirmation only
when the source asks, and bad settings refused in one line.

:class:`Rig` plays the source (TIR, transport, SRI with store groups) and the stores (every
connection the receiver opens is accepted; PREG_RESPs, retransmissions as the test says).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from reference_impl.config import ConfigError
from reference_impl.context import control
from reference_impl.events import (
    MessageDelivered,
    ReceiverRegistrationComplete,
    RegistrationChange,
    UnrecoverableLoss,
)
from reference_impl.fastmsg import data_message
from reference_impl.receiver import ReceiverConfig, ReceiverCore
from reference_impl.runtime import load_client, receiver_config
from reference_impl.sim import Connect, ConnKey, StreamEvent, StreamEventKind, StreamWrite
from wire import lbmr
from wire.lbmc import (
    AckType,
    LbmcMessage,
    MessageType,
    Sri,
    TopicIdx,
    UmeAck,
    UmePreg,
    UmePregResp,
    UmeRxreq,
    UmeStoreExt,
    UmeStoreGroup,
)
from wire.lbttcp import LbttcpStream

TOPIC = "qc.receiver"
ME = "10.0.0.4"
TRANSPORT = ("10.0.0.3", 14371)
REQUEST = ("10.0.0.3", 14391)


class Rig:
    """A receiver core whose source names stores in groups of ``sizes`` (group 0, 1, ...);
    each store ``i`` is at 10.0.1.<i+1>:14567 with source RegID 70 + i."""

    def __init__(self, *sizes: int, high: int = 11, acktosrc: bool = False,
                 callback: Callable[[int, int], int] | None = None,
                 **options: Any) -> None:
        self.rcv = ReceiverCore(TOPIC, ReceiverConfig(**options), ip=ME, request_port=14392,
                                recovery_callback=callback)
        self.groups = [g for g, size in enumerate(sizes) for _ in range(size)]
        self.addrs = [(f"10.0.1.{i + 1}", 14567) for i in range(len(self.groups))]
        self.sizes = sizes
        self.high = high
        self.now = 0.0
        self.conns: dict[tuple[str, int], ConnKey] = {}
        self.framers: dict[ConnKey, LbttcpStream] = {}
        self.sent: dict[tuple[str, int], list[LbmcMessage]] = {}  # remote -> messages
        self.events: list[object] = []
        self._port = 50000
        tir = lbmr.Tir(name=TOPIC, ttl=1, index=1,
                       info=lbmr.TcpInfo(ip=TRANSPORT[0], port=TRANSPORT[1]),
                       options=[lbmr.ToptUme(store=1, src_tcp_port=REQUEST[1],
                                             src_tcp_addr=REQUEST[0], transport_idx=1)])
        self.rcv.receive(lbmr.LbmrPacket(tirs=[tir]).build(), ("10.0.0.1", 15380), 0.0)
        self.pump()
        self.sri(1, acktosrc=acktosrc)

    # --- the network ----------------------------------------------------------------------------

    def pump(self) -> None:
        """Carry out what the receiver asked for: connections accepted, writes parsed."""
        for _ in range(10):
            commands = self.rcv.stream_commands(self.now)
            if not commands:
                break
            for c in commands:
                if isinstance(c, Connect):
                    self._port += 1
                    key: ConnKey = ((ME, self._port), c.remote)
                    self.conns[c.remote] = key
                    self.rcv.stream_event(StreamEvent(StreamEventKind.CONNECTED, key), self.now)
                elif isinstance(c, StreamWrite):
                    framer = self.framers.setdefault(c.conn, LbttcpStream())
                    for item in framer.feed(c.data):
                        if item.message is not None:
                            self.sent.setdefault(c.conn[1], []).append(item.message)
        self.events += self.rcv.events()

    def to_receiver(self, remote: tuple[str, int], data: bytes) -> None:
        self.rcv.stream_event(StreamEvent(StreamEventKind.DATA, self.conns[remote], data),
                              self.now)
        self.pump()

    def sri(self, version: int, *, versions: dict[int, int] | None = None,
            acktosrc: bool = False) -> None:
        headers: list[object] = [
            Sri(version=version, low_sqn=0, high_sqn=self.high, initial_sqn_known=1,
                acktosrc=int(acktosrc)), TopicIdx(tidx=1)]
        headers += [UmeStoreGroup(grp_idx=g, grp_sz=size) for g, size in enumerate(self.sizes)]
        headers += [UmeStoreExt(grp_idx=g, store_tcp_port=addr[1], store_idx=i,
                                store_ip_addr=addr[0], src_reg_id=70 + i,
                                version=(versions or {}).get(i, 1))
                    for i, (g, addr) in enumerate(zip(self.groups, self.addrs, strict=True))]
        self.to_receiver(TRANSPORT, control(*headers))

    def grant(self, i: int, low: int = 0, *, high: int | None = None) -> None:
        """Store ``i`` grants the receiver's registration with ``low``."""
        self.to_receiver(self.addrs[i], control(UmePregResp(
            reg_id=90 + i, transport_idx=1, topic_idx=1, low_seqnum=low,
            high_seqnum=self.high if high is None else high)))

    def retransmit(self, i: int, *sqns: int) -> None:
        self.to_receiver(self.addrs[i], b"".join(
            data_message(1, s, b"m%d" % s, MessageType.RETRANS) for s in sqns))

    def live(self, *sqns: int) -> None:
        self.to_receiver(TRANSPORT, b"".join(
            data_message(1, s, b"m%d" % s, MessageType.MESSAGE) for s in sqns))

    def tick(self, seconds: float, step: float = 0.05) -> None:
        end = self.now + seconds
        while True:  # ends at ``end`` exactly (a timer armed at it must fire)
            self.now = min(end, self.now + step)
            self.rcv.handle_timer(self.now)
            self.pump()
            if self.now >= end:
                break

    # --- what the receiver did ------------------------------------------------------------------

    def headers(self, remote: tuple[str, int], kind: type) -> list[object]:
        return [h for m in self.sent.get(remote, []) for h in m.headers if isinstance(h, kind)]

    def pregs(self, i: int) -> int:
        return len(self.headers(self.addrs[i], UmePreg))

    def rxreqs(self, i: int) -> list[int]:
        return [h.seqnum for h in self.headers(self.addrs[i], UmeRxreq)]  # type: ignore[attr-defined]

    def acks(self, i: int) -> list[int]:
        return [h.seqnum for h in self.headers(self.addrs[i], UmeAck)  # type: ignore[attr-defined]
                if h.type == AckType.CDELV]  # type: ignore[attr-defined]

    def confirmations(self) -> list[int]:
        return [h.seqnum for h in self.headers(REQUEST, UmeAck)]  # type: ignore[attr-defined]

    def complete(self) -> ReceiverRegistrationComplete | None:
        return next((e for e in self.events if isinstance(e, ReceiverRegistrationComplete)),
                    None)

    def delivered(self) -> list[int]:
        return [e.sequence_number for e in self.events if isinstance(e, MessageDelivered)]


# --- registration completion ---------------------------------------------------------------


@pytest.mark.parametrize(("sizes", "intra", "inter", "grants", "completes_at"), [
    ((2, 2), "quorum", "any", [0, 1, 2, 3], 1),  # group 0's quorum is enough
    ((2, 2), "quorum", "all", [0, 1, 2, 3], 3),  # both groups' quorums
    ((2, 2), "quorum", "all", [0, 2, 1, 3], 3),
    ((3, 3), "quorum", "all", [0, 3, 1, 4, 2, 5], 3),  # 2 of 3 in each
    ((1, 1, 1), "quorum", "majority", [0, 1, 2], 1),  # two groups of three
    ((1, 1, 1), "quorum", "any", [2, 0, 1], 0),
    ((3,), "all", "any", [0, 1, 2], 2),  # intragroup all: every store
    ((2, 2), "quorum", "all-active", [0, 1, 2, 3], 1),  # the one active group is complete
    ((2, 3), "all", "all-active", [2, 3, 0, 1, 4], 4),  # group 1 active (2 of 3), needs all
])
def test_completion_follows_the_intragroup_and_intergroup_rules(
        sizes: tuple[int, ...], intra: str, inter: str, grants: list[int],
        completes_at: int) -> None:
    """Registration Complete comes with the grant that first satisfies both rules, not
    before (the issue: a receiver completed on any group's quorum whatever the rule)."""
    rig = Rig(*sizes, ume_retention_intragroup_stability_behavior=intra,
              ume_retention_intergroup_stability_behavior=inter)
    for n, store in enumerate(grants):
        rig.grant(store)
        assert (rig.complete() is not None) == (n >= completes_at), (n, store)


def test_no_delivery_before_completion() -> None:
    """Live data that comes before the intergroup rule holds waits, and is delivered (in
    order) once it does."""
    rig = Rig(2, 2, ume_retention_intergroup_stability_behavior="all")
    rig.grant(0)
    rig.grant(1)
    rig.live(12, 13)
    assert rig.delivered() == []
    assert not any(rig.rxreqs(i) for i in range(4))
    rig.grant(2, low=12)
    rig.grant(3, low=12)
    rig.grant(0, low=12)  # a repeated answer changes nothing
    assert rig.delivered() == [12, 13]


# --- the consensus low sequence number ----------------------------------------------------------

EVERY_STORE: dict[str, Any] = {"ume_retention_intragroup_stability_behavior": "all",
               "ume_retention_intergroup_stability_behavior": "all"}


@pytest.mark.parametrize(("behaviour", "expected"), [
    ("majority", 6),  # group 0: 6, group 1: 3 -> the latest, 6 (over all six stores: 4)
    ("lowest", 2),
    ("highest", 9),
    ("MAJORITY", 6),  # names are not case-sensitive
])
def test_consensus_is_per_group_then_across(behaviour: str, expected: int) -> None:
    rig = Rig(3, 3, ume_consensus_sequence_number_behavior=behaviour, **EVERY_STORE)
    for i, low in enumerate([4, 6, 9, 2, 3, 7]):
        rig.grant(i, low)
    done = rig.complete()
    assert done is not None and done.sequence_number == expected
    asked = sorted({s for i in range(6) for s in rig.rxreqs(i)})
    assert asked and min(asked) == expected


def test_majority_of_a_group_is_of_its_answers() -> None:
    """Three groups of one, three and one stores, intergroup all (intragroup quorum): the
    consensus is over the answers registration completed with."""
    rig = Rig(1, 3, 1, ume_retention_intergroup_stability_behavior="all")
    rig.grant(0, 3)
    rig.grant(1, 8)
    rig.grant(2, 5)
    assert rig.complete() is None
    rig.grant(4, 4)
    done = rig.complete()
    # group 0: 3; group 1 (8, 5): the latest a majority of them holds, 5; group 2: 4
    assert done is not None and done.sequence_number == 5


# --- retransmit_request_maximum and the recovery callback ----------------------------------------


@pytest.mark.parametrize(("maximum", "callback", "start"), [
    (2, None, 4),  # the guide: consumed 0, high 6, maximum 2 -> restarts with 4
    (2, lambda low, high: low, 4),  # the callback leaves it: the maximum still applies
    (2, lambda low, high: 0, 0),  # the callback may go earlier ...
    (2, lambda low, high: 3, 3),
    (2, lambda low, high: 5, 5),  # ... or later
    (0, None, 1),  # the only way to restart at 1: maximum 0
    (10, None, 1),  # a maximum above what is missing changes nothing
    (2, lambda low, high: 99, 7),  # never beyond high + 1
])
def test_rx_maximum_and_callback(maximum: int, callback: Callable[[int, int], int] | None,
                                 start: int) -> None:
    rig = Rig(1, high=6, callback=callback, retransmit_request_maximum=maximum)
    rig.grant(0, low=1)
    done = rig.complete()
    assert done is not None and (done.sequence_number, done.high_sequence_number) == (start, 6)
    rig.tick(0.01)
    assert sorted(set(rig.rxreqs(0))) == list(range(start, 7))


# --- re-registration ----------------------------------------------------------------------------


def test_reregisters_only_with_stores_whose_version_went_up() -> None:
    rig = Rig(3)
    for i in range(3):
        rig.grant(i)
    before = [rig.pregs(i) for i in range(3)]
    rig.sri(2, versions={1: 2})
    assert [rig.pregs(i) - before[i] for i in range(3)] == [0, 1, 0]
    assert any(isinstance(e, RegistrationChange) for e in rig.events)
    rig.sri(3, versions={1: 2})  # a newer SRI with no store version up: nobody
    rig.sri(3, versions={0: 5, 1: 2})  # the same overall version again: ignored
    assert [rig.pregs(i) - before[i] for i in range(3)] == [0, 1, 0]


# --- recovery ------------------------------------------------------------------------------------


def test_unanswered_request_is_retried_at_another_store() -> None:
    rig = Rig(2, high=9, retransmit_request_interval=300,
              retransmit_request_message_timeout=60_000)
    rig.grant(0)
    rig.grant(1)
    asked_0 = set(rig.rxreqs(0))
    assert asked_0, "requests are balanced over both stores"
    rig.retransmit(1, *sorted(set(rig.rxreqs(1))))  # store 1 answers, store 0 never does
    rig.tick(0.35)
    assert asked_0 <= set(rig.rxreqs(1))
    rig.retransmit(1, *sorted(asked_0))
    rig.tick(0.35)
    assert rig.delivered() == list(range(10))


def test_message_timeout_gives_up_and_delivery_goes_on() -> None:
    # 7 is a transport gap: off-transport recovery asks for it (at once: no initial delay) and
    # gives it up retransmit_request_message_timeout after its first request
    rig = Rig(1, high=4, retransmit_request_interval=300,
              retransmit_request_message_timeout=1500, otr_request_initial_delay=0)
    rig.grant(0, low=5)  # nothing to recover
    rig.live(5, 6, 8, 9)  # 7 missing
    rig.tick(0.05)
    assert rig.delivered() == [5, 6]
    rig.tick(1.3)
    assert 7 in rig.rxreqs(0)
    assert not any(isinstance(e, UnrecoverableLoss) for e in rig.events)
    assert rig.delivered() == [5, 6]
    rig.tick(0.3)
    losses = [(e.first, e.last) for e in rig.events if isinstance(e, UnrecoverableLoss)]
    assert losses == [(7, 7)]
    assert rig.delivered() == [5, 6, 8, 9]
    asked = len(rig.rxreqs(0))
    rig.tick(1.0)
    assert len(rig.rxreqs(0)) == asked  # no request for it any more


# --- delivery confirmation -----------------------------------------------------------------------


@pytest.mark.parametrize(("asked", "allowed", "confirms"), [
    (False, 1, False), (True, 1, True), (True, 0, False), (False, 0, False)])
def test_confirmation_only_when_asked_and_allowed(asked: bool, allowed: int,
                                                  confirms: bool) -> None:
    rig = Rig(1, high=0, acktosrc=asked, ume_allow_confirmed_delivery=allowed,
              ume_use_ack_batching=0)
    rig.grant(0, low=1)
    rig.live(1, 2, 3)
    assert rig.delivered() == [1, 2, 3]
    assert rig.acks(0)[-1] == 3  # the store always gets its consumption ACKs
    assert (3 in rig.confirmations()) == confirms


# --- bad settings --------------------------------------------------------------------------------


@pytest.mark.parametrize(("option", "value", "words"), [
    ("ume_retention_intergroup_stability_behavior", "most", ["intergroup", "'most'"]),
    ("ume_retention_intragroup_stability_behavior", "half", ["intragroup", "'half'"]),
    ("ume_consensus_sequence_number_behavior", "median", ["consensus", "'median'"]),
    ("retransmit_request_interval", 0, ["retransmit_request_interval", "positive"]),
    ("retransmit_request_message_timeout", -5, ["retransmit_request_message_timeout"]),
    ("retransmit_request_maximum", -1, ["retransmit_request_maximum"]),
])
def test_bad_receiver_settings_are_one_line_errors(option: str, value: object,
                                                   words: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        ReceiverConfig(**{option: value})  # type: ignore[arg-type]
    text = str(info.value)
    assert "\n" not in text
    for word in words:
        assert word in text


def test_receiver_reads_the_group_rules_from_its_configuration(tmp_path: Path) -> None:
    cfg = tmp_path / "lbm.cfg"
    cfg.write_text("receiver ume_retention_intergroup_stability_behavior all-groups\n"
                   "receiver ume_retention_intragroup_stability_behavior all-stores\n")
    config = receiver_config(load_client(str(cfg), "current"))
    assert (config.ume_retention_intragroup_stability_behavior,
            config.ume_retention_intergroup_stability_behavior) == ("all", "all")
    cfg.write_text("receiver ume_retention_intergroup_stability_behavior most\n")
    with pytest.raises(ConfigError) as info:
        load_client(str(cfg), "current")
    assert "\n" not in str(info.value) and "most" in str(info.value)


@pytest.mark.parametrize("line", ["receiver retransmit_request_message_timeout 0",
                                  "receiver retransmit_request_interval 0",
                                  "receiver retransmit_request_maximum -1"])
def test_bad_recovery_values_in_a_file_are_one_line_errors(tmp_path: Path, line: str) -> None:
    """What the core would refuse is refused by the configuration layer first, naming the
    file and line (a 0 message timeout gave a traceback from ``ump receiver``)."""
    cfg = tmp_path / "lbm.cfg"
    cfg.write_text(line + "\n")
    with pytest.raises(ConfigError) as info:
        load_client(str(cfg), "current")
    assert "\n" not in str(info.value) and line.split()[1] in str(info.value)
