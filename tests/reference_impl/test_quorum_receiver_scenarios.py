"""Receivers of a source with two and three store groups, in the simulator (real store cores,
virtual time; docs/semantics.md §1.2, §1.9, §1.12): a receiver configured with the source's
group rules registers only when they hold, recovers after a restart from the consensus low
sequence number, gets what one partitioned store cannot retransmit from another, and
re-registers only with a store that comes back.
"""

from __future__ import annotations

from reference_impl import events as ev
from reference_impl.deployment import SimDeployment
from reference_impl.source import StoreSpec
from reference_impl.store import TopicPolicy, TopicRule

TOPIC = "qc.orders"
RULES = (TopicRule(".*", TopicPolicy(repository_size_threshold=50_000_000), kind="PCRE"),)


def deployment(*sizes: int, inter: str = "all", seed: int = 3) -> SimDeployment:
    """Stores in groups of ``sizes`` (``g<group>s<i>``), a source using all of them with
    ``inter`` as its intergroup rule."""
    d = SimDeployment(seed=seed)
    specs = []
    for g, size in enumerate(sizes):
        for i in range(size):
            store = d.add_store(f"g{g}s{i}", topics=RULES, seed=10 * g + i)
            specs.append(StoreSpec(store.addr[0], store.addr[1], group=g))
    d.add_source("src", TOPIC, ume_store=tuple(specs),
                 ume_store_group=tuple(enumerate(sizes)),
                 ume_retention_intergroup_stability_behavior=inter, ume_session_id=0x51)
    return d


def send(d: SimDeployment, n: int) -> None:
    src = d.sources["src"]
    for _ in range(n):
        src.send(b"m%d" % src.next_sqn)
        d.run(0.002)


def delivered(d: SimDeployment, name: str) -> list[ev.MessageDelivered]:
    return d.events(name, ev.MessageDelivered)  # type: ignore[return-value]


def test_restart_recovers_from_the_consensus_of_two_groups() -> None:
    d = deployment(2, 2)
    assert d.run_until(lambda: d.sources["src"].complete, 10)
    rcv = d.add_receiver("rcv", TOPIC, ume_session_id=0xABC,
                         ume_retention_intergroup_stability_behavior="all")
    assert d.run_until(lambda: rcv.complete, 10)
    send(d, 30)
    d.run(1)
    assert [m.sequence_number for m in delivered(d, "rcv")] == list(range(30))
    d.kill("rcv")
    send(d, 30)
    rcv = d.restart("rcv")  # type: ignore[assignment]
    assert d.run_until(lambda: rcv.complete, 15)
    d.run(3)
    after = delivered(d, "rcv")[30:]
    assert [m.sequence_number for m in after] == list(range(30, 60))
    done = [e for e in d.events("rcv") if isinstance(e, ev.ReceiverRegistrationComplete)]
    assert done[-1].sequence_number == 30  # every store had its ACK of 29
    successes = [e for e in d.events("rcv") if isinstance(e, ev.ReceiverRegistrationSuccess)]
    assert len(successes) == 8 and all(s.old for s in successes[4:])


def test_what_one_store_missed_comes_from_another() -> None:
    """Three groups of one, two and two stores; store g1s0 is cut off from the source (its
    connections reset) while 10..49 are sent, so it never has them.  A receiver restarted
    after that registers with every store again, and its requests that g1s0 leaves
    unanswered are retried at other stores ("as long as a single store has a message"): every
    message once and in order, nothing lost."""
    d = deployment(1, 2, 2, inter="majority")
    assert d.run_until(lambda: d.sources["src"].complete, 10)
    rcv = d.add_receiver("rcv", TOPIC, ume_session_id=0xABD, retransmit_request_interval=200,
                         retransmit_request_message_timeout=60_000,
                         ume_retention_intergroup_stability_behavior="all")
    assert d.run_until(lambda: rcv.complete, 10)
    send(d, 10)
    d.run(1)
    d.kill("rcv")
    d.net.partition(["src"], ["g1s0"], sever_streams=True)
    send(d, 40)
    d.run(1)
    d.net.heal()
    d.run(5)
    cut_off = next(iter(d.stores["g1s0"].sources.values()))
    assert cut_off.high_received == 9  # it never got 10..49
    rcv = d.restart("rcv")  # type: ignore[assignment]
    assert d.run_until(lambda: len(delivered(d, "rcv")) >= 50, 30)
    d.run(1)
    assert [m.sequence_number for m in delivered(d, "rcv")] == list(range(50))
    assert not d.events("rcv", ev.UnrecoverableLoss)
    assert len(rcv.registered_stores) == 5


def test_no_registration_until_the_intergroup_rule_holds() -> None:
    """Intergroup 'all' on both sides; group 1's only store unreachable from the receiver:
    no Registration Complete and no delivery until it is reachable again."""
    d = deployment(1, 1)
    assert d.run_until(lambda: d.sources["src"].complete, 10)
    rcv = d.add_receiver("rcv", TOPIC, ume_registration_interval=500,
                         ume_retention_intergroup_stability_behavior="all")
    d.net.partition(["g1s0"], ["rcv"])
    d.run(3)
    send(d, 5)
    d.run(2)
    assert not rcv.complete and delivered(d, "rcv") == []
    d.net.heal()
    assert d.run_until(lambda: rcv.complete, 10)
    d.run(2)
    assert [m.sequence_number for m in delivered(d, "rcv")] == list(range(5))
