"""``proxy-source-repo-quorum-required`` (docs/semantics.md §1.11; reference_impl/proxy.py,
module docstring 7): only stores that hold the source's state take part, and a proxy needs a
quorum of them.  Simulator scenarios with the jittery links of test_proxy_scenarios.py, the
sans-IO election on its own, and the store XML option reaching the store.
"""

from __future__ import annotations

import random

import pytest

from reference_impl import runtime
from reference_impl.config.store_xml import parse_store_config
from reference_impl.config.store_xml_writer import disk_store_xml
from reference_impl.deployment import STORE_PORT, SimDeployment
from reference_impl.proxy import (
    Claim,
    CreateProxy,
    Dropped,
    ProxyElection,
    SendClaim,
    SourceKey,
    decode_claim,
    encode_claim,
    encode_support,
    is_support,
)
from reference_impl.source import StoreSpec
from reference_impl.store import StoreCore
from tests.reference_impl.test_proxy_scenarios import JITTER, NAMES, PROXY_PORT, RULES, SETTLE

TOPIC = "proxy.quorum"


def group_of_three(seed: int, *, registered: int, quorum_required: bool
                   ) -> tuple[SimDeployment, list[StoreCore]]:
    """Three stores of one group; the source registers with the first ``registered`` only
    (the others hold no state for it), then dies."""
    d = SimDeployment(seed=seed, link=JITTER)
    group = tuple((d._host(n), STORE_PORT) for n in NAMES)
    for i, name in enumerate(NAMES):
        d.add_store(name, topics=RULES, seed=seed * 10 + i, allow_proxy_source=True,
                    proxy_stores=group, proxy_port=PROXY_PORT,
                    proxy_source_repo_quorum_required=quorum_required)
    specs = tuple(StoreSpec(ip, port) for ip, port in group[:registered])
    src = d.add_source("src", TOPIC, ume_store=specs, ume_session_id=0x5E55,
                       ume_proxy_source=1, ume_registration_interval=500,
                       ume_proactive_keepalive_interval=250)
    assert d.run_until(lambda: src.complete, 10)
    d.kill("src")
    d.run(SETTLE)
    return d, [d.stores[n] for n in NAMES]


def holders(cores: list[StoreCore]) -> list[int]:
    return [i for i, c in enumerate(cores) if c.proxies() == [TOPIC]]


@pytest.mark.parametrize("seed", range(20))
def test_a_quorum_of_state_holders_elects_exactly_one_proxy(seed: int) -> None:
    _, cores = group_of_three(seed, registered=3, quorum_required=True)
    assert len(holders(cores)) == 1


@pytest.mark.parametrize("seed", range(5))
def test_two_of_three_holding_state_are_a_quorum(seed: int) -> None:
    _, cores = group_of_three(seed, registered=2, quorum_required=True)
    assert len(holders(cores)) == 1 and holders(cores)[0] in (0, 1)


@pytest.mark.parametrize("seed", range(5))
def test_one_store_holding_state_is_no_quorum(seed: int) -> None:
    d, cores = group_of_three(seed, registered=1, quorum_required=True)
    d.run(SETTLE)
    assert holders(cores) == []
    # without the option the one store that holds the state runs the proxy
    _, plain = group_of_three(seed, registered=1, quorum_required=False)
    assert holders(plain) == [0]


SOURCE = SourceKey("10.0.0.9", 14391, 7, 0)
PEERS = {1: ("10.0.0.2", 14567), 2: ("10.0.0.3", 14567)}


def election() -> ProxyElection:
    e = ProxyElection(0, ("10.0.0.1", 14567), PEERS, 0.2, random.Random(1),
                      quorum_required=True)
    e.watch(SOURCE, reg_id=5)
    e.source_timed_out(SOURCE, 0.0)
    e.on_timer(1.0)  # the wait (at most 0.3 s) ended: a claim, but no proxy yet
    return e


def test_the_claimant_creates_its_proxy_at_the_first_support() -> None:
    e = election()
    actions = e.actions()
    assert not any(isinstance(a, CreateProxy) for a in actions)
    claims = [decode_claim(a.data) for a in actions if isinstance(a, SendClaim)]
    assert {c.store_index for c in claims} == {0} and len(claims) == 2 and e.proxies() == []
    token = claims[0].token
    support = encode_support(Claim(SOURCE, PEERS[1], 1, token, reg_id=5))
    assert is_support(support) and not is_support(encode_claim(claims[0]))
    e.on_claim(support, (PEERS[1][0], 40000), 1.1)
    assert [type(a) for a in e.actions()] == [CreateProxy] and e.proxies() == [SOURCE]


@pytest.mark.parametrize("forgery", ["stranger", "wrong token", "unknown source", "index"])
def test_a_bad_support_changes_nothing(forgery: str) -> None:
    e = election()
    token = next(decode_claim(a.data) for a in e.actions() if isinstance(a, SendClaim)).token
    source, store, index, sender = SOURCE, PEERS[1], 1, PEERS[1][0]
    if forgery == "stranger":
        sender = "10.9.9.9"
    elif forgery == "wrong token":
        token ^= 1
    elif forgery == "unknown source":
        source = SourceKey("10.0.0.8", 1, 1, 1)
    else:
        index = 2
    e.on_claim(encode_support(Claim(source, store, index, token, reg_id=5)), (sender, 1), 1.1)
    actions = e.actions()
    assert not any(isinstance(a, CreateProxy) for a in actions) and e.proxies() == []
    assert len(actions) == 1 and isinstance(actions[0], Dropped)


def test_a_follower_supports_only_with_the_option() -> None:
    claim = Claim(SOURCE, PEERS[1], 1, 0x1234, reg_id=5)
    for required in (True, False):
        e = ProxyElection(0, ("10.0.0.1", 14567), PEERS, 0.2, random.Random(1),
                          quorum_required=required)
        e.watch(SOURCE, reg_id=5)
        e.on_claim(encode_claim(claim), (PEERS[1][0], 40000), 0.0)
        sent = [a for a in e.actions() if isinstance(a, SendClaim)]
        assert [is_support(a.data) for a in sent] == ([True] if required else [])
        if required:
            back = decode_claim(sent[0].data)
            assert (back.store_index, back.token, back.store) == (0, 0x1234, ("10.0.0.1", 14567))


def test_the_store_xml_option_reaches_the_store() -> None:
    config = parse_store_config(disk_store_xml(
        "q", 14567, ".*", repository="memory",
        store_options={"allow-proxy-source": 1, "proxy-source-repo-quorum-required": 1}))
    (store,) = config.stores
    settings = runtime.store_settings(store, resolver=("127.0.0.1", 15380))
    assert settings.allow_proxy_source and settings.proxy_source_repo_quorum_required
