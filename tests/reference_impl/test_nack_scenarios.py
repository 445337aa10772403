"""Whole deployments in the simulator for the ends of a message's instability
(docs/semantics.md §1.8, guide "Proactive Retransmissions"): a message no store acknowledges
within ``ume_message_stability_lifetime`` (Message Not Stable, retransmissions stop, forced
reclaim), and a message a store declared lost (its LBT-RU session gave it up) whose proactive
retransmission the store answers with a stability NACK (the source stops resending it and takes
it out of flight).
"""

from __future__ import annotations

from reference_impl import events as ev
from reference_impl.deployment import SimDeployment
from reference_impl.sim import LinkConfig
from reference_impl.store import TopicPolicy, TopicRule

TOPIC = "orders.nack"


def rules(policy: TopicPolicy) -> tuple[TopicRule, ...]:
    return (TopicRule(".*", policy, kind="PCRE"),)


def sqns_of(d: SimDeployment, name: str,
            kind: type[ev.MessageNotStable | ev.MessageStable]) -> list[int]:
    return [e.sequence_number for e in d.events(name) if isinstance(e, kind)]


def reclaimed(d: SimDeployment) -> list[tuple[int, bool]]:
    return [(e.sequence_number, e.forced) for e in d.events("src")
            if isinstance(e, ev.MessageReclaimed)]


def nacked(d: SimDeployment) -> list[ev.MessageNacked]:
    return [e for e in d.events("src") if isinstance(e, ev.MessageNacked)]


def test_a_message_never_acknowledged_is_not_stable_at_its_lifetime_and_no_longer_resent() -> None:
    # a store that batches its ACKs by 1000 and never flushes them in time: nothing is stable
    d = SimDeployment(seed=2)
    d.add_store("store", topics=rules(TopicPolicy(
        repository_size_threshold=50_000_000, stability_ack_minimum_number=1000,
        stability_ack_interval=10_000_000)), seed=100)
    src = d.add_source("src", TOPIC, ume_message_stability_timeout=500,
                       ume_message_stability_lifetime=2000, ume_store_check_interval=100)
    assert d.run_until(lambda: src.complete, 20)
    sent = [src.send(b"m%d" % i) for i in range(5)]
    d.run(1.2)
    resent = src.stats["proactive_retransmissions"]
    assert resent >= 5  # every message came back at least once before its lifetime
    d.run(2.0)
    assert sqns_of(d, "src", ev.MessageNotStable) == sent
    assert reclaimed(d) == [(s, True) for s in sent]
    assert src.inflight == 0 and not src.retained and src.can_send()
    after = src.stats["proactive_retransmissions"]
    d.run(3.0)  # nothing is resent any more
    assert src.stats["proactive_retransmissions"] == after
    assert not d.events("src", ev.MessageStable)


def test_a_message_the_store_lost_on_lbtru_is_nacked_and_the_source_lets_it_go() -> None:
    # the source's LBT-RU window holds a few messages: a NAK for an older one gets "do not
    # retry", so the store's session gives it up and the store declares it lost; the source's
    # proactive retransmission of it is then NACKed
    d = SimDeployment(seed=5)
    d.add_store("store", topics=rules(TopicPolicy(repository_size_threshold=50_000_000)),
                seed=100)
    src = d.add_source("src", TOPIC, transport="lbt-ru",
                       transport_lbtru_transmission_window_size=64,
                       ume_message_stability_timeout=500, ume_store_check_interval=100)
    assert d.run_until(lambda: src.complete, 20)
    d.net.set_link("src", "store", LinkConfig(loss=0.2), both_ways=False)
    sent = []
    for _ in range(200):
        sent.append(src.send(b"m%d" % src.next_sqn))
        d.run(0.0005)
    d.net.set_link("src", "store", LinkConfig(), both_ways=False)
    d.run(5.0)
    store = d.stores["store"]
    (state,) = store.sources.values()
    lost = sorted(s for s in state.lost if s in sent)
    assert lost, "the store declared nothing lost: the scenario did not happen"
    assert store.stats["lbtru_lost"] > 0 and store.stats["nacks"] >= len(lost)
    nacks = nacked(d)
    assert sorted(e.sequence_number for e in nacks) == lost  # once each
    assert all(e.abandoned for e in nacks)  # one store: nobody else can make it stable
    stable = set(sqns_of(d, "src", ev.MessageStable))
    assert stable.isdisjoint(lost) and stable | set(lost) == set(sent)
    assert src.inflight == 0 and not any(s in src.retained for s in lost)
    before = src.stats["proactive_retransmissions"], store.stats["nacks"]
    d.run(3.0)  # nothing resent, nothing NACKed any more
    assert (src.stats["proactive_retransmissions"], store.stats["nacks"]) == before
