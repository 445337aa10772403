"""Quorum/consensus on the reference source core (issue 18): the group rules, the consensus
sequence number, store unresponsive and "(quorum lost)", and the bad QC settings refused at
start-up.

Guide "Sources Using Quorum/Consensus Store Configuration", "Quorum/Consensus Store Usage",
"UMP Flight Size"; docs/semantics.md §1.2, §1.12.  Each test drives a
:class:`~reference_impl.source.SourceCore` through hand-fed stream events (no network): the
harness stores answer PREGs only when a test says so, acknowledge only what a test says, and
fall silent by saying nothing.  The rules themselves are :mod:`reference_impl.quorum`.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from reference_impl import quorum
from reference_impl.cli import QUORUM_BACK_LINE, QUORUM_LOST_LINE
from reference_impl.context import control
from reference_impl.events import (
    Event,
    MessageReclaimed,
    MessageStable,
    SourceRegistrationComplete,
    StableFlags,
    StoreUnresponsive,
)
from reference_impl.fastmsg import ControlTemplate
from reference_impl.sim import (
    Connect,
    ConnKey,
    StreamClose,
    StreamEvent,
    StreamEventKind,
    StreamWrite,
)
from reference_impl.source import SendError, SendErrorCode, SourceConfig, SourceCore, StoreSpec
from tests.reference_impl.loopback import IP as LOOPBACK_IP
from tests.reference_impl.loopback import Proc, loopback
from wire.lbmc import (
    AckType,
    KeepaliveType,
    LbmcMessage,
    MessageType,
    UmeAck,
    UmeKeepalive,
    UmePregResp,
    parse_message,
)

IP = "127.0.0.1"
STORE_PORT = 15000
TRANSPORT: ConnKey = ((IP, 14371), (IP, 41000))
REQUEST: ConnKey = ((IP, 14391), (IP, 41001))
ACK = ControlTemplate(UmeAck)


class Qc:
    """A source and its harness stores (index ``i`` at port ``STORE_PORT + i``)."""

    def __init__(self, groups: tuple[int, ...], sizes: tuple[tuple[int, int], ...] = (),
                 **options: Any) -> None:
        options.setdefault("ume_registration_interval", 1000)
        options.setdefault("ume_store_check_interval", 100)
        options.setdefault("ume_message_stability_timeout", 0)
        specs = tuple(StoreSpec(IP, STORE_PORT + i, reg_id=100 + i, group=g)
                      for i, g in enumerate(groups))
        self.now = 0.0
        self.source = SourceCore("qc.topic", SourceConfig(ume_store=specs,
                                                          ume_store_group=sizes, **options),
                                 ip=IP, transport_port=14371, request_port=14391, now=0.0)
        self.keys: dict[int, ConnKey] = {}
        self.written: dict[int, bytearray] = defaultdict(bytearray)  # store -> bytes to it
        self.connects: dict[int, int] = defaultdict(int)
        self.events: list[Event] = []
        self._serial = 0
        self.source.stream_event(StreamEvent(StreamEventKind.ACCEPTED, TRANSPORT), 0.0)
        self.source.stream_event(StreamEvent(StreamEventKind.ACCEPTED, REQUEST), 0.0)
        self.pump()

    def pump(self) -> None:
        """Carry out what the source asked for: connections open at once, writes recorded."""
        while True:
            commands = self.source.stream_commands(self.now)
            if not commands:
                break
            for cmd in commands:
                if isinstance(cmd, Connect):
                    index = cmd.remote[1] - STORE_PORT
                    self._serial += 1
                    key: ConnKey = ((IP, 40000 + self._serial), cmd.remote)
                    self.keys[index] = key
                    self.connects[index] += 1
                    self.source.stream_event(StreamEvent(StreamEventKind.CONNECTED, key),
                                             self.now)
                elif isinstance(cmd, StreamWrite) and cmd.conn[1][1] >= STORE_PORT:
                    self.written[cmd.conn[1][1] - STORE_PORT] += cmd.data
                elif isinstance(cmd, StreamClose):
                    pass
        self.events += self.source.events()

    def feed(self, key: ConnKey, raw: bytes) -> None:
        self.source.stream_event(StreamEvent(StreamEventKind.DATA, key, raw), self.now)
        self.pump()

    def grant(self, *stores: int, old: bool = False, high: int = 0) -> None:
        """Stores grant the registration (OLD with ``high`` if asked) and say on the
        transport that they receive it."""
        for i in stores:
            self.feed(self.keys[i], control(UmePregResp(reg_id=100 + i, o_flag=int(old),
                                                        high_seqnum=high)))
            self.feed(TRANSPORT, control(UmeKeepalive(type=KeepaliveType.STORE,
                                                      reg_id=100 + i)))

    def ack(self, store: int, *sqns: int) -> None:
        for sqn in sqns:
            self.feed(self.keys[store], ACK.pack(type=AckType.STABLE, seqnum=sqn))

    def tick(self, seconds: float, step: float = 0.05) -> None:
        end = self.now + seconds
        while self.now < end - 1e-9:
            self.now = min(end, self.now + step)
            self.source.handle_timer(self.now)
            self.pump()

    def send(self, count: int) -> list[int]:
        self.source.now = self.now
        sqns = [self.source.send(b"m%d" % i) for i in range(count)]
        self.pump()
        return sqns

    def to_store(self, store: int) -> list[LbmcMessage]:
        data, out, pos = bytes(self.written[store]), [], 0
        while pos < len(data):
            message, used = parse_message(data, pos)
            out.append(message)
            pos += used
        return out

    def prorx(self, store: int) -> list[int]:
        return [m.sqn for m in self.to_store(store)
                if m.is_data_type and m.type == MessageType.PRORX]

    def of(self, kind: type) -> list[Any]:
        return [e for e in self.events if isinstance(e, kind)]


def _keep_alive(h: Qc, *stores: int) -> None:
    for i in stores:
        h.feed(h.keys[i], control(UmeKeepalive(type=KeepaliveType.STORE, reg_id=100 + i)))


def idle(h: Qc, seconds: float, *alive: int) -> None:
    """Let ``seconds`` pass while the stores ``alive`` stay heard (a keepalive every 0.2 s)."""
    for _ in range(round(seconds / 0.2)):
        h.tick(0.2)
        _keep_alive(h, *alive)


def started(groups: tuple[int, ...], sizes: tuple[tuple[int, int], ...] = (),
            grant: tuple[int, ...] | None = None, **options: Any) -> Qc:
    """A source whose stores ``grant`` (default: all) registered it, one registration
    interval later (the deadline for completing without every store)."""
    h = Qc(groups, sizes, **options)
    granted = tuple(range(len(groups))) if grant is None else grant
    h.grant(*granted)
    for _ in range(3):  # the granted stores stay heard meanwhile
        h.tick(0.35)
        _keep_alive(h, *granted)
    return h


# --- registration completion --------------------------------------------------------------------

TWO_OF_THREE = (0, 0, 0, 1, 1, 1)
"""Two groups of three stores: 0-2 in group 0, 3-5 in group 1."""


@pytest.mark.parametrize("intra, inter, granted, complete", [
    # guide: "As long as a single group maintains quorum, then UMP allows a source to proceed"
    ("quorum", "any", (0, 1), True),
    ("quorum", "any", (0, 3), False),  # one store of each group: no group has a quorum
    ("quorum", "all", (0, 1), False),  # intergroup all: group 1 has no quorum
    ("quorum", "all", (0, 1, 3, 4), True),
    ("quorum", "majority", (0, 1), False),  # 1 of 2 groups is no majority
    ("quorum", "majority", (0, 1, 4, 5), True),
    ("quorum", "all-active", (0, 1), True),  # group 1 is not active: only group 0 counts
    ("quorum", "all-active", (0, 3), False),  # no active group at all
    ("all", "any", (0, 1), False),  # intragroup all: every store of the group
    ("all", "any", (0, 1, 2), True),
    ("all", "all-active", (0, 1, 2, 3, 4), False),  # group 1 is active (2 of 3) but not all
    ("all", "all-active", (0, 1, 2, 3), True),  # group 1 is not active (1 of 3)
    ("all-active", "any", (0, 1), True),  # all-active registers with a quorum
])
def test_registration_completes_by_the_intragroup_and_intergroup_rules(
        intra: str, inter: str, granted: tuple[int, ...], complete: bool) -> None:
    h = started(TWO_OF_THREE, ((0, 3), (1, 3)), grant=granted,
                ume_retention_intragroup_stability_behavior=intra,
                ume_retention_intergroup_stability_behavior=inter)
    assert h.source.complete is complete
    assert bool(h.of(SourceRegistrationComplete)) is complete
    if not complete:
        with pytest.raises(SendError) as refused:
            h.send(1)
        assert refused.value.code is SendErrorCode.NOT_REGISTERED


def test_three_groups_majority_needs_two_of_them() -> None:
    groups = (0, 1, 2)
    sizes = ((0, 1), (1, 1), (2, 1))
    one = started(groups, sizes, grant=(2,),
                  ume_retention_intergroup_stability_behavior="majority")
    assert not one.source.complete
    two = started(groups, sizes, grant=(0, 2),
                  ume_retention_intergroup_stability_behavior="majority")
    assert two.source.complete


def test_quorum_is_a_majority_of_the_configured_size_not_of_the_stores_listed() -> None:
    # guide "Quorum/Consensus Store Usage": "in a group of five stores, three stores are
    # required"; two listed stores of a group declared with five never make a quorum
    h = started((0, 0), ((0, 5),), ume_retention_intergroup_stability_behavior="any")
    assert not h.source.complete


# --- stability and the Message Stable flags -----------------------------------------------------

IA, IR, STABLE, STORE = (StableFlags.INTRAGROUP, StableFlags.INTERGROUP, StableFlags.STABLE,
                         StableFlags.STORE)


def _flags(h: Qc) -> list[tuple[int, StableFlags]]:
    return [(e.store.index, e.flags) for e in h.of(MessageStable)]


def test_intergroup_all_needs_every_group_and_the_flags_say_which_rule_holds() -> None:
    h = started(TWO_OF_THREE, ((0, 3), (1, 3)), retransmit_retention_size_threshold=1 << 20,
                ume_retention_intergroup_stability_behavior="all")
    h.send(1)
    h.ack(0, 0)
    h.ack(1, 0)  # group 0 has its quorum: IA, but not IR
    h.ack(3, 0)
    assert not h.source.retained[0].stable
    h.ack(4, 0)  # group 1 too: IA, IR and STABLE
    assert h.source.retained[0].stable
    assert _flags(h) == [(0, STORE), (1, STORE | IA), (3, STORE), (4, STORE | IA | IR | STABLE)]


def test_intergroup_any_is_stable_with_one_group() -> None:
    h = started(TWO_OF_THREE, ((0, 3), (1, 3)), retransmit_retention_size_threshold=1 << 20)
    h.send(1)
    h.ack(3, 0)
    h.ack(4, 0)
    assert h.source.retained[0].stable
    h.ack(0, 0)  # a later ACK from the other group: its own group is not stable (no IA)
    assert _flags(h) == [(3, STORE), (4, STORE | IA | IR | STABLE), (0, STORE | IR)]


def test_intergroup_majority_of_three_groups() -> None:
    h = started((0, 1, 2), ((0, 1), (1, 1), (2, 1)),
                ume_retention_intergroup_stability_behavior="majority")
    h.send(1)
    h.ack(0, 0)
    assert not h.source.retained[0].stable
    h.ack(2, 0)
    assert MessageReclaimed(0, False) in h.of(MessageReclaimed)


def test_intragroup_all_needs_every_store_of_the_group() -> None:
    h = started((0, 0, 0), ((0, 3),), ume_retention_intragroup_stability_behavior="all")
    h.send(1)
    h.ack(0, 0)
    h.ack(1, 0)
    assert not h.source.retained[0].stable  # a quorum is not enough under all
    h.ack(2, 0)
    assert not h.source.retained  # stable and reclaimed


def test_intragroup_all_active_waits_for_every_registered_store_only() -> None:
    # three stores, two registered: every registered store, not every configured one
    h = started((0, 0, 0), ((0, 3),), grant=(0, 1),
                ume_retention_intragroup_stability_behavior="all-active")
    assert h.source.complete
    h.send(2)
    h.ack(0, 0, 1)
    assert h.source.inflight == 2  # store 1 (registered) has not acknowledged
    h.ack(1, 0)
    assert h.source.inflight == 1
    # quorum: one ACK of the same two would not do, two would (compare the mutant
    # "intragroup-all-active-as-quorum" in tests/conformance/mutant_client.py)


def test_all_active_drops_an_unresponsive_store_from_the_rule_at_once() -> None:
    # guide: a message is stable "at a quorum of stores in all the active groups"; an
    # unresponsive store is no longer active, so what waited only for it is stable now
    h = started((0, 0, 0), ((0, 3),), ume_retention_intragroup_stability_behavior="all-active",
                ume_store_activity_timeout=1000, ume_proactive_keepalive_interval=3000)
    h.send(2)
    h.ack(0, 0, 1)
    h.ack(1, 0, 1)
    assert h.source.inflight == 2  # store 2 is registered and silent
    for _ in range(6):  # stores 0 and 1 stay heard; store 2 says nothing
        h.tick(0.25)
        h.feed(h.keys[0], control(UmeKeepalive(type=KeepaliveType.STORE, reg_id=100)))
        h.feed(h.keys[1], control(UmeKeepalive(type=KeepaliveType.STORE, reg_id=101)))
    (gone,) = h.of(StoreUnresponsive)
    assert gone.store.index == 2 and not gone.quorum_lost
    assert h.source.inflight == 0 and not h.source.retained


def test_all_active_lands_a_fragmented_message_when_the_store_it_waited_for_leaves() -> None:
    h = started((0, 0, 0), ((0, 3),), ume_retention_intragroup_stability_behavior="all-active",
                ume_store_activity_timeout=1000, transport_tcp_datagram_max_size=44)
    h.source.now = h.now
    first = h.source.send(b"f" * 64)  # 16 payload bytes per fragment: 4 fragments
    h.pump()
    assert h.source.next_sqn - first == 4
    h.ack(0, 0, 1, 2, 3)
    h.ack(1, 0, 1, 2, 3)
    assert h.source.inflight == 1  # store 2 is registered and has no fragment
    idle(h, 1.6, 0, 1)
    assert [e.store.index for e in h.of(StoreUnresponsive)] == [2]
    assert h.source.inflight == 0
    assert [e.sequence_number for e in h.of(MessageReclaimed)] == [0, 1, 2, 3]


def test_all_active_needs_a_quorum_of_acks_too() -> None:
    # *choice* (reference_impl/quorum.py): a group with fewer than a quorum registered is no
    # active group, and what its one store holds is not stable there
    assert not quorum.group_stable("all-active", 3, acked=1, registered_unacked=0)
    assert quorum.group_stable("all-active", 3, acked=2, registered_unacked=0)
    assert not quorum.group_stable("all-active", 3, acked=2, registered_unacked=1)


def test_intergroup_all_active_ignores_a_group_without_a_quorum_registered() -> None:
    h = started(TWO_OF_THREE, ((0, 3), (1, 3)), grant=(0, 1, 3),
                ume_retention_intergroup_stability_behavior="all-active")
    h.send(1)
    h.ack(0, 0)
    h.ack(1, 0)  # group 1 (one store registered) is not active: group 0 is enough
    assert not h.source.retained


# --- consensus sequence number ------------------------------------------------------------------

# group 0 answers 3, 3, 3; group 1 answers 8, 8, 12
HIGHS = {0: 3, 1: 3, 2: 3, 3: 8, 4: 8, 5: 12}


@pytest.mark.parametrize("behaviour, first", [
    ("lowest", 4),  # the lowest answer of any store, + 1
    ("majority", 9),  # per group: 3 and 8; the latest of those: 8, + 1
    ("highest", 13),
])
def test_the_consensus_sequence_number_is_formed_per_group(behaviour: str, first: int) -> None:
    # over all six stores a "majority" (4 of 6) would hold only 3: the rule is per group
    h = Qc(TWO_OF_THREE, ((0, 3), (1, 3)),
           ume_consensus_sequence_number_behavior=behaviour)
    for store, high in HIGHS.items():
        h.grant(store, old=True, high=high)
    assert h.source.complete
    assert h.of(SourceRegistrationComplete) == [SourceRegistrationComplete(first)]
    assert h.send(1) == [first]


def test_consensus_counts_only_the_stores_that_answered_old() -> None:
    assert quorum.consensus({0: [10, 20, 30]}, "majority") == 20
    assert quorum.consensus({0: [10, 20]}, "majority") == 10
    assert quorum.consensus({0: [5], 1: [9, 9, 2]}, "majority") == 9
    assert quorum.consensus([7, 1, 4], "lowest") == 1
    with pytest.raises(ValueError):
        quorum.consensus({}, "highest")


# --- store unresponsive, quorum lost and regained -----------------------------------------------

def test_quorum_lost_blocks_sends_until_a_returning_store_brings_it_back() -> None:
    h = started((0, 0, 0), ((0, 3),), ume_store_activity_timeout=1000)
    h.send(3)
    h.ack(0, 0, 1, 2)
    h.ack(1, 0)  # 0 is stable; 1 and 2 are held at store 0 only
    idle(h, 1.6, 0)  # only store 0 stays heard
    lost = h.of(StoreUnresponsive)
    assert sorted(e.store.index for e in lost) == [1, 2]
    assert [e.quorum_lost for e in lost] == [False, True]  # the second one loses it
    last = lost[1].store.index
    assert lost[1].text == f"store {last} [{IP}:{STORE_PORT + last}] unresponsive (quorum lost)"
    assert not h.source.complete and not h.source.can_send()
    with pytest.raises(SendError) as refused:
        h.send(1)
    assert refused.value.code is SendErrorCode.NOT_REGISTERED
    assert "not currently registered with enough" in str(refused.value).lower()
    # the source keeps registering with the lost stores; store 2 answers
    before = len(h.to_store(2))
    idle(h, 1.2, 0)
    assert h.connects[2] >= 2  # a new connection: the old one was closed
    h.grant(2)
    assert h.source.complete
    assert len(h.of(SourceRegistrationComplete)) == 2
    # the returning store gets the unstable messages again at once, not the stable one
    resent = [m.sqn for m in h.to_store(2)[before:] if m.is_data_type]
    assert sorted(set(resent)) == [1, 2]
    assert h.send(1) == [3]  # numbering goes on


def test_a_store_that_returns_while_the_quorum_holds_gets_the_unstable_messages() -> None:
    h = started((0, 0, 0), ((0, 3),), ume_store_activity_timeout=1000)
    h.send(2)
    idle(h, 1.6, 0, 1)
    (gone,) = h.of(StoreUnresponsive)
    assert gone.store.index == 2 and not gone.quorum_lost and h.source.complete
    idle(h, 1.2, 0, 1)
    h.grant(2)
    assert h.prorx(2) == [0, 1]


def test_a_registered_store_silent_for_the_activity_timeout_is_unresponsive() -> None:
    h = started((0,), ume_store_activity_timeout=2000, ume_proactive_keepalive_interval=3000)
    h.tick(1.8)  # heard last 1.05 s after the start
    assert not h.of(StoreUnresponsive)
    h.tick(0.4)
    (event,) = h.of(StoreUnresponsive)
    assert event.text == f"store 0 [{IP}:{STORE_PORT}] unresponsive (quorum lost)"


# --- bad QC settings ----------------------------------------------------------------------------

@pytest.mark.parametrize("options, words", [
    ({"ume_retention_intragroup_stability_behavior": "most"},
     "ume_retention_intragroup_stability_behavior 'most': one of quorum, all-active, all"),
    ({"ume_retention_intergroup_stability_behavior": "some"},
     "ume_retention_intergroup_stability_behavior 'some': one of any, majority, all, "
     "all-active"),
    ({"ume_consensus_sequence_number_behavior": "median"},
     "ume_consensus_sequence_number_behavior 'median': one of lowest, majority, highest"),
    ({"ume_store_group": ((0, 3), (0, 2))}, "group 0 is declared twice"),
    ({"ume_store_group": ((0, 0),)}, "a group has at least 1 store"),
    ({"ume_store_group": ((1, 3),)}, "names group 0, which no ume_store_group declares"),
])
def test_bad_qc_settings_are_one_line_errors(options: dict[str, Any], words: str) -> None:
    with pytest.raises(ValueError) as refused:
        SourceConfig(ume_store=(StoreSpec(IP, STORE_PORT),), **options)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def test_aliases_become_the_canonical_names() -> None:
    cfg = SourceConfig(ume_retention_intragroup_stability_behavior="ALL-STORES",
                       ume_retention_intergroup_stability_behavior="any-group",
                       ume_consensus_sequence_number_behavior="Majority")
    assert (cfg.ume_retention_intragroup_stability_behavior,
            cfg.ume_retention_intergroup_stability_behavior,
            cfg.ume_consensus_sequence_number_behavior) == ("all", "any", "majority")


@pytest.mark.parametrize("config, words", [
    ("source ume_retention_intergroup_stability_behavior some\n", "all-active"),
    ("source ume_store_group 0:3\nsource ume_store 127.0.0.1:15000:0:4\n",
     "group 4, which no ume_store_group declares"),
    ("source ume_store_group 0:3\nsource ume_store 127.0.0.1:15000\n"
     "source ume_retention_intragroup_stability_behavior all\n",
     "could never complete registration"),
])
def test_ump_source_refuses_bad_qc_settings_in_one_line(tmp_path: Path, config: str,
                                                        words: str) -> None:
    path = tmp_path / "lbm.cfg"
    path.write_text(config)
    out = subprocess.run([sys.executable, "-m", "ump", "source", "-c", str(path),
                          "--topic", "qc", "--count", "1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "Traceback" not in out.stderr


# --- ump source: a quorum loss on loopback ------------------------------------------------------

def test_a_blocking_ump_source_reports_a_quorum_loss_waits_and_finishes(tmp_path: Path) -> None:
    # docs/semantics.md §1.12: the source's only store goes (its connection closes: at once
    # unresponsive, "(quorum lost)"); a blocking source says so, waits instead of failing its
    # sends, and once the store is back (restarted on its files) sends the rest
    with loopback(tmp_path) as lb:
        cfg = lb.client_config("src.cfg", "source ume_registration_interval 500",
                               "source ume_store_check_interval 100")
        src = lb.start("source", "-c", str(cfg), "--topic", "qc.loss", "--count", "150",
                       "--rate", "50", "--linger", "5")
        back: Proc | None = None
        try:
            src.wait_for("registered; next sequence number")
            time.sleep(1.0)
            lb.store.stop()
            src.wait_for(QUORUM_LOST_LINE, 10)
            assert "unresponsive (quorum lost)" in src.stderr
            time.sleep(1.0)
            assert src.proc.poll() is None  # waiting, not failed
            back = Proc(["store", "-c", "store.xml", "--resolver",
                         f"{LOOPBACK_IP}:{lb.resolver_port}"], tmp_path)
            back.wait_for("ready to accept registrations")
            src.wait_for(QUORUM_BACK_LINE, 20)
            assert src.finish(30) == 0, src.stderr
            assert "sent 150 messages" in src.stderr
            assert "Traceback" not in src.stderr
        finally:
            src.stop()
            if back is not None:
                back.stop()
