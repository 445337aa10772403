"""The proxy-source election machine (reference_impl/proxy.py) on its own: waits, claims, ties,
source return, re-election and bad claims, driven by hand (unit) and by Hypothesis (any order
of claim deliveries between any number of stores still leaves exactly one proxy)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl.proxy import (
    SILENCE,
    WAIT_HIGH,
    WAIT_LOW,
    Claim,
    CreateProxy,
    DeleteProxy,
    Dropped,
    Phase,
    ProxyElection,
    SendClaim,
    SourceKey,
    decode_claim,
    encode_claim,
)

SRC = SourceKey("10.0.0.9", 15001, 1, 0)
INTERVAL = 5.0


def store_addr(i: int) -> tuple[str, int]:
    return (f"10.0.1.{i + 1}", 14567)


def group(n: int, seed: int = 0) -> list[ProxyElection]:
    out = []
    for i in range(n):
        peers = {j: store_addr(j) for j in range(n) if j != i}
        election = ProxyElection(i, store_addr(i), peers, INTERVAL, random.Random(seed * 100 + i))
        election.watch(SRC, reg_id=1000 + i)
        out.append(election)
    return out


def claim_from(i: int, token: int, source: SourceKey = SRC) -> bytes:
    return encode_claim(Claim(source, store_addr(i), i, token))


def test_claim_round_trips() -> None:
    claim = Claim(SRC, store_addr(2), 2, 0xDEADBEEF, reelect=True, reg_id=77)
    assert decode_claim(encode_claim(claim)) == claim


def test_wait_is_within_half_to_one_and_a_half_intervals() -> None:
    for seed in range(50):
        (e,) = group(1, seed)
        e.source_timed_out(SRC, now=100.0)
        deadline = e.next_timer()
        assert deadline is not None
        assert 100.0 + WAIT_LOW * INTERVAL <= deadline <= 100.0 + WAIT_HIGH * INTERVAL


def test_lone_store_creates_the_proxy_and_claims_it_at_every_peer() -> None:
    e = group(3)[0]
    e.source_timed_out(SRC, 0.0)
    deadline = e.next_timer()
    assert deadline is not None
    e.on_timer(deadline - 0.001)
    assert e.actions() == [] and e.proxies() == []
    e.on_timer(deadline)
    actions = e.actions()
    create = actions[0]
    assert isinstance(create, CreateProxy) and create.source == SRC and not create.reelect
    sends = [a for a in actions if isinstance(a, SendClaim)]
    assert [s.peer for s in sends] == [store_addr(1), store_addr(2)]
    claim = decode_claim(sends[0].data)
    assert claim.token == create.token and claim.store_index == 0 and claim.reg_id == 1000
    assert e.proxies() == [SRC]


def test_a_claim_during_the_wait_means_no_proxy_here() -> None:
    e = group(3)[1]
    e.source_timed_out(SRC, 0.0)
    e.on_claim(claim_from(0, 5), store_addr(0), 1.0)
    assert e.next_timer() == 1.0 + SILENCE * INTERVAL  # only the patience with the proxy
    e.on_timer(1.0 + SILENCE * INTERVAL - 0.01)
    assert e.actions() == [] and e.proxies() == []
    assert e.sources[SRC].phase is Phase.FOLLOWING


@pytest.mark.parametrize(("mine", "theirs", "i_keep"), [(10, 5, True), (5, 10, False),
                                                        (7, 7, True)])
def test_tie_of_two_proxies_is_broken_by_token_then_index(mine: int, theirs: int,
                                                          i_keep: bool) -> None:
    e = group(3)[2]  # index 2 beats index 0 on equal tokens
    e.source_timed_out(SRC, 0.0)
    e.rng = random.Random()
    e.on_timer(100.0)
    e.actions()
    e.sources[SRC].token = mine
    e.on_claim(claim_from(0, theirs), store_addr(0), 101.0)
    actions = e.actions()
    if i_keep:
        assert e.proxies() == [SRC]
        assert [type(a) for a in actions] == [SendClaim]  # the loser hears us again
        assert actions[0].peer == store_addr(0)  # type: ignore[union-attr]
    else:
        assert e.proxies() == []
        assert actions == [DeleteProxy(SRC, "election lost")]


def test_source_return_deletes_the_proxy() -> None:
    e = group(1)[0]
    e.source_timed_out(SRC, 0.0)
    e.on_timer(10.0)
    e.actions()
    e.source_returned(SRC, 11.0)
    assert e.actions() == [DeleteProxy(SRC, "source returned")]
    assert e.proxies() == [] and e.sources[SRC].phase is Phase.ACTIVE
    e.source_timed_out(SRC, 20.0)  # a second departure elects again
    assert e.next_timer() is not None


def test_dead_proxy_store_triggers_a_reelection() -> None:
    e = group(3)[1]
    e.source_timed_out(SRC, 0.0)
    e.on_claim(claim_from(0, 9), store_addr(0), 1.0)
    e.peer_lost(2, 2.0)  # not the holder: nothing
    assert e.sources[SRC].phase is Phase.FOLLOWING
    e.peer_lost(0, 2.0)
    deadline = e.next_timer()
    assert deadline is not None and deadline >= 2.0 + WAIT_LOW * INTERVAL
    e.on_timer(deadline)
    actions = e.actions()
    assert isinstance(actions[0], CreateProxy) and actions[0].reelect
    sent = [decode_claim(a.data) for a in actions if isinstance(a, SendClaim)]
    assert sent and all(c.reelect for c in sent)


@pytest.mark.parametrize("bad", ["unknown source", "unknown index", "wrong sender",
                                 "token 0", "garbage", "no pser"])
def test_bad_claims_are_dropped_without_state_change(bad: str) -> None:
    e = group(3)[1]
    e.source_timed_out(SRC, 0.0)
    before = (dict((k, vars(v).copy()) for k, v in e.sources.items()), e.next_timer())
    sender = store_addr(0)
    if bad == "unknown source":
        data = claim_from(0, 5, SourceKey("10.9.9.9", 1, 2, 3))
    elif bad == "unknown index":
        data = encode_claim(Claim(SRC, ("10.0.1.99", 14567), 9, 5))
        sender = ("10.0.1.99", 40000)
    elif bad == "wrong sender":
        data = claim_from(0, 5)
        sender = ("10.6.6.6", 40000)
    elif bad == "token 0":
        data = claim_from(0, 0)
    elif bad == "garbage":
        data = b"\x01\x02garbage"
    else:
        data = claim_from(0, 5)[:-8]  # cut: not a whole message
    e.on_claim(data, sender, 1.0)
    actions = e.actions()
    assert len(actions) == 1 and isinstance(actions[0], Dropped)
    assert actions[0].peer == sender and actions[0].size == len(data)
    assert (dict((k, vars(v)) for k, v in e.sources.items()), e.next_timer()) == before
    e.on_timer(100.0)  # the wait still ends in a proxy: the forged claim did not cancel it
    assert e.proxies() == [SRC]


def test_store_index_must_fit_the_token_byte() -> None:
    with pytest.raises(ValueError, match=r"0\.\.255"):
        ProxyElection(256, store_addr(0), {}, 1.0)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(2, 5), seed=st.integers(0, 2**32 - 1), data=st.data())
def test_any_delivery_order_leaves_exactly_one_proxy(n: int, seed: int,
                                                     data: st.DataObject) -> None:
    """Every store times out; deadlines are drawn; then claims are delivered in an order and at
    times Hypothesis picks (a claim may overtake another store's deadline).  Once every claim is
    delivered exactly one store runs the proxy and every other follows it."""
    stores = group(n, seed)
    for e in stores:
        e.source_timed_out(SRC, 0.0)
    pending: list[tuple[int, bytes]] = []  # (destination index, claim bytes)
    deadlines = sorted((e.next_timer() or 0.0, e.store_index) for e in stores)
    by_addr = {store_addr(i): i for i in range(n)}

    def collect(e: ProxyElection) -> None:
        for action in e.actions():
            if isinstance(action, SendClaim):
                pending.append((by_addr[action.peer], action.data))

    for when, index in deadlines:
        # deliver some of the pending claims before this store's deadline
        k = data.draw(st.integers(0, len(pending)))
        for _ in range(k):
            dst, raw = pending.pop(data.draw(st.integers(0, len(pending) - 1)))
            stores[dst].on_claim(raw, store_addr(decode_claim(raw).store_index), when)
            collect(stores[dst])
        stores[index].on_timer(when)
        collect(stores[index])
    steps = 0
    while pending:
        steps += 1
        assert steps < 10_000
        dst, raw = pending.pop(data.draw(st.integers(0, len(pending) - 1)))
        stores[dst].on_claim(raw, store_addr(decode_claim(raw).store_index), 1000.0)
        collect(stores[dst])
    holders = [e.store_index for e in stores if e.proxies()]
    assert len(holders) == 1
    for e in stores:
        if e.store_index != holders[0]:
            holder = e.sources[SRC].holder
            assert holder is not None and holder.store_index == holders[0]


def test_a_source_waits_by_its_own_topics_interval() -> None:
    e = group(1)[0]
    e.watch(SRC, reg_id=1000, interval=100.0)
    e.source_timed_out(SRC, 0.0)
    deadline = e.next_timer()
    assert deadline is not None and WAIT_LOW * 100.0 <= deadline <= WAIT_HIGH * 100.0
    with pytest.raises(ValueError, match="more than 0"):
        e.watch(SRC, reg_id=1000, interval=0.0)


PROXY_XML = """<?xml version="1.0"?>
<ume-store version="1.2">
  <daemon><log>stored.log</log></daemon>
  <stores>
    <store name="s" port="14567">
      <ume-attributes>
        <option type="store" name="allow-proxy-source" value="1"/>
      </ume-attributes>
      <topics>
        <topic pattern="orders" type="direct">
          <ume-attributes>
            <option type="store" name="proxy-election-interval" value="2500"/>
          </ume-attributes>
        </topic>
      </topics>
    </store>
  </stores>
</ume-store>
"""


def test_the_store_configuration_reaches_the_store_core(tmp_path: Path) -> None:
    from reference_impl import runtime
    from reference_impl.config.store_xml import parse_store_config

    config = parse_store_config(PROXY_XML, "s.xml")
    settings = runtime.store_settings(config.stores[0], resolver=("127.0.0.1", 15380),
                                      base=tmp_path)
    assert settings.allow_proxy_source
    policy = settings.policy_for("orders")
    assert policy is not None and policy.proxy_election_interval == 2500
    off = parse_store_config(PROXY_XML.replace('value="1"', 'value="0"'), "s.xml")
    assert not runtime.store_settings(off.stores[0], resolver=("127.0.0.1", 15380),
                                      base=tmp_path).allow_proxy_source


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_mutated_claims_never_raise_and_dropped_ones_change_nothing(data: st.DataObject) -> None:
    """Bit flips, inserted, deleted and overwritten bytes in a genuine claim: the machine never
    raises; whatever it drops leaves every source's state and its timer as they were."""
    from tests.reference_impl.strategies import mutated

    e = group(3)[1]
    e.source_timed_out(SRC, 0.0)
    raw = data.draw(mutated(claim_from(0, 0x1234)))
    before = ({k: vars(v).copy() for k, v in e.sources.items()}, e.next_timer())
    e.on_claim(raw, store_addr(0), 1.0)
    actions = e.actions()
    if any(isinstance(a, Dropped) for a in actions):
        assert len(actions) == 1
        assert ({k: vars(v) for k, v in e.sources.items()}, e.next_timer()) == before
    else:  # the edits left a well-formed claim of store 0 for the watched source
        assert e.sources[SRC].phase is Phase.FOLLOWING


def test_a_proxy_repeats_its_claim_and_a_silent_one_is_replaced() -> None:
    holder, follower = group(2)
    holder.source_timed_out(SRC, 0.0)
    follower.source_timed_out(SRC, 0.0)
    holder.on_timer(100.0)
    first = [a for a in holder.actions() if isinstance(a, SendClaim)]
    follower.on_claim(first[0].data, store_addr(0), 100.0)
    # each interval the proxy claims again, and the follower's patience starts over
    for k in range(1, 4):
        at = holder.next_timer()
        assert at == 100.0 + k * INTERVAL
        holder.on_timer(at)
        (again,) = holder.actions()
        assert isinstance(again, SendClaim) and decode_claim(again.data) == decode_claim(
            first[0].data)
        follower.on_claim(again.data, store_addr(0), at)
        assert follower.next_timer() == at + SILENCE * INTERVAL
    # then the proxy's store goes silent (cut off, its connection not reset)
    last = 100.0 + 3 * INTERVAL
    follower.on_timer(last + SILENCE * INTERVAL)
    assert follower.sources[SRC].phase is Phase.WAITING and follower.sources[SRC].reelect


def test_a_stale_claim_after_the_source_returned_starts_no_election() -> None:
    """The source came back here; a claim its proxy sent before being deleted arrives late.
    The store follows it, and when that proxy falls silent it goes back to the live source
    instead of electing a proxy for it."""
    e = group(3)[1]
    e.source_timed_out(SRC, 0.0)
    e.on_claim(claim_from(0, 5), store_addr(0), 1.0)
    e.source_returned(SRC, 2.0)
    e.on_claim(claim_from(0, 5), store_addr(0), 2.1)  # late
    e.on_timer(2.1 + SILENCE * INTERVAL)
    assert e.sources[SRC].phase is Phase.ACTIVE and e.next_timer() is None
    e.on_timer(1000.0)
    assert e.proxies() == [] and e.actions() == []
