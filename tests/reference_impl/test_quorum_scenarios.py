"""Quorum/consensus deployments in the simulator (issue 18): a source with two or three store
groups, stores partitioned away and returning, each intergroup behaviour, quorum lost and
regained.

Guide "Quorum/Consensus Store Usage" ("As long as a single group maintains quorum, then UMP
allows a source to proceed"), "Sources Using Quorum/Consensus Store Configuration", "Source
Events" (Store Unresponsive); docs/semantics.md §1.2, §1.12.  Each test builds a
:class:`~reference_impl.deployment.SimDeployment` with real reference stores, cuts stores off
with :meth:`~reference_impl.sim.SimNetwork.partition` (streams stall, as over a broken route,
so the source finds the store silent after ``ume_store_activity_timeout``; or reset, as when
TCP keepalives give up) and heals the cut.
"""

from __future__ import annotations

from typing import Any

import pytest

from reference_impl import events as ev
from reference_impl.deployment import SimDeployment
from reference_impl.source import SendError, SendErrorCode, SourceCore, StoreSpec
from reference_impl.store import TopicPolicy, TopicRule

TOPIC = "qc.orders"
RULES = (TopicRule(".*", TopicPolicy(repository_size_threshold=50_000_000, keepalive_interval=500),
                   kind="PCRE"),)
"""The stores' topic: a store keeps an idle source hearing from it every 0.5 s (its
``keepalive-interval``), well within the source's activity timeout."""
TIMEOUT = 2.0
"""``ume_store_activity_timeout`` of every source here, seconds."""
RETURN = 4.0
"""Seconds a healed store may take to be registered again: a registration attempt made across
the cut waits for the simulator's connect timeout (3 s, as a SYN to an unreachable host)
before the source tries again, every ``ume_registration_interval``."""


def qc(sizes: list[int], **options: Any) -> tuple[SimDeployment, SourceCore, list[list[str]]]:
    """A deployment with ``sizes[g]`` stores in group ``g`` (store ``g{g}s{i}``) and a source
    using them all, registered; the store names per group."""
    d = SimDeployment(seed=18)
    names = [[f"g{g}s{i}" for i in range(size)] for g, size in enumerate(sizes)]
    specs = []
    for g, group in enumerate(names):
        for n, name in enumerate(group):
            store = d.add_store(name, topics=RULES, seed=1800 + 10 * g + n)
            specs.append(StoreSpec(*store.addr, group=g))
    options.setdefault("ume_store_activity_timeout", int(TIMEOUT * 1000))
    options.setdefault("ume_store_check_interval", 200)
    options.setdefault("ume_registration_interval", 500)
    src = d.add_source("src", TOPIC, ume_store=tuple(specs),
                       ume_store_group=tuple(enumerate(sizes)), **options)
    assert d.run_until(lambda: src.complete, 5)
    return d, src, names


def send(d: SimDeployment, src: SourceCore, n: int) -> list[int]:
    sqns = [src.send(b"qc%d" % src.next_sqn) for _ in range(n)]
    d.run(0.01)
    return sqns


def held(d: SimDeployment, store: str) -> list[int]:
    """The sequence numbers the store holds for the source."""
    (state,) = d.stores[store].sources.values()
    assert state.repo is not None
    return list(state.repo.sqns())


def unresponsive(d: SimDeployment) -> list[ev.StoreUnresponsive]:
    return [e for e in d.events("src") if isinstance(e, ev.StoreUnresponsive)]


def lost(d: SimDeployment) -> list[bool]:
    return [e.quorum_lost for e in unresponsive(d)]


def registered_again(d: SimDeployment, after: int) -> list[int]:
    """The stores (indexes) of the source's registration successes after the first
    ``after``."""
    return [e.store.index for e in d.events("src")
            if isinstance(e, ev.SourceRegistrationSuccess)][after:]


# what losing a quorum in one of two groups does under each intergroup behaviour
LOSES_QUORUM = {"any": False, "majority": True, "all": True, "all-active": False}


@pytest.mark.parametrize("inter", sorted(LOSES_QUORUM))
def test_two_groups_one_partitioned_away_and_back(inter: str) -> None:
    d, src, names = qc([3, 3], ume_retention_intergroup_stability_behavior=inter)
    send(d, src, 10)
    d.run(0.5)
    assert src.inflight == 0
    # one store of group 1 goes: every behaviour keeps its quorum (2 of 3 in group 1)
    d.net.partition(["src"], [names[1][0]])
    d.run(TIMEOUT + 1)
    assert lost(d) == [False]
    send(d, src, 5)
    d.run(0.5)
    assert src.inflight == 0
    # a second store of group 1 goes: group 1 has no quorum
    d.net.partition(["src"], [names[1][1]])
    d.run(TIMEOUT + 1)
    gone = LOSES_QUORUM[inter]
    assert lost(d) == [False, gone]
    assert src.can_send() is not gone
    if gone:
        with pytest.raises(SendError) as refused:
            src.send(b"x")
        assert refused.value.code is SendErrorCode.NOT_REGISTERED
    else:  # group 0 alone makes a message stable (all-active: group 1 is not active)
        send(d, src, 5)
        d.run(0.5)
        assert src.inflight == 0
    d.net.heal()
    d.run(RETURN)
    assert src.complete and src.can_send()
    completes = d.events("src", ev.SourceRegistrationComplete)
    assert len(completes) == (2 if gone else 1)
    assert sorted(registered_again(d, 6)) == [3, 4]  # the returning stores registered again
    more = send(d, src, 5)
    d.run(1)
    assert src.inflight == 0
    for name in names[1][:2]:
        assert set(more) <= set(held(d, name))


def test_three_groups_majority_survives_one_and_recovers_from_two() -> None:
    d, src, names = qc([1, 1, 1], ume_retention_intergroup_stability_behavior="majority")
    d.net.partition(["src"], names[0])
    d.run(TIMEOUT + 1)
    assert lost(d) == [False] and src.can_send()  # two groups of three are a majority
    send(d, src, 5)
    d.run(0.5)
    assert src.inflight == 0
    d.net.partition(["src"], names[1])
    d.run(TIMEOUT + 1)
    assert lost(d) == [False, True] and not src.can_send()
    d.net.heal(["src"], names[1])  # group 1 comes back: a majority again
    d.run(RETURN)
    assert src.complete
    after = send(d, src, 5)
    d.run(0.5)
    assert src.inflight == 0 and set(after) <= set(held(d, names[1][0]))


def test_three_groups_all_loses_the_quorum_with_one_and_regains_it() -> None:
    d, src, names = qc([1, 1, 1], ume_retention_intergroup_stability_behavior="all")
    d.net.partition(["src"], names[2])
    d.run(TIMEOUT + 1)
    assert lost(d) == [True] and not src.can_send()
    d.net.heal()
    d.run(RETURN)
    assert src.complete
    send(d, src, 3)
    d.run(0.5)
    assert src.inflight == 0


def test_quorum_lost_and_regained_the_returning_stores_get_the_unstable_messages() -> None:
    # messages go out, then two of three stores are cut off before they see them (their
    # connections reset, as TCP keepalives would): only g0s0 holds them, no quorum
    d, src, names = qc([3])
    sent = [src.send(b"u%d" % i) for i in range(10)]
    d.net.partition(["src"], names[0][1:], sever_streams=True)
    d.run(1)
    assert lost(d) == [False, True]
    assert "(quorum lost)" in unresponsive(d)[-1].text
    assert src.inflight == 10 and not src.can_send()
    with pytest.raises(SendError) as refused:
        src.send(b"x")
    assert refused.value.code is SendErrorCode.NOT_REGISTERED
    d.run(3)  # the source keeps trying every ume_registration_interval
    d.net.heal()
    d.run(RETURN)
    assert src.complete
    assert len(d.events("src", ev.SourceRegistrationComplete)) == 2
    for name in names[0][1:]:  # re-registered, and given what they lacked at once
        assert set(sent) <= set(held(d, name))
    assert src.inflight == 0
    assert src.send(b"next") == 10


def test_all_active_groups_drop_an_unresponsive_store_from_the_stability_rule() -> None:
    # intragroup all-active: a message waits for every registered store of the group; a
    # store cut off holds it up only until it is found unresponsive
    d, src, names = qc([3], ume_retention_intragroup_stability_behavior="all-active",
                       ume_message_stability_timeout=0)
    d.net.partition(["src"], [names[0][2]])
    send(d, src, 4)
    d.run(0.5)
    assert src.inflight == 4  # g0s2 is still registered: not stable yet
    d.run(TIMEOUT + 1)
    assert lost(d) == [False]
    assert src.inflight == 0  # stable at every store still registered
    d.net.heal()
    d.run(RETURN)
    assert registered_again(d, 3) == [2]
