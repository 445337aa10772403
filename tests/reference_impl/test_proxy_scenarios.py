"""Proxy-source elections between real reference stores in the simulator (issue 20).

Guide "Proxy Sources" ("How Proxy Sources Operate", "Proxy Source Elections"); docs/semantics.md
§1.11.  A QC source with ``ume_proxy_source`` 1 and a Session ID registers with three stores
that allow proxy sources; it dies; each store sees its activity time out, waits its random time
and runs the election over store-to-store TCP (claims: PREG + PSER + PSRC-ETOK).  Links carry
delay and jitter comparable to the election waits, so stores often claim at nearly the same
time and the token has to break the tie.
"""

from __future__ import annotations

import asyncio
import socket
import uuid
from pathlib import Path

import pytest

from reference_impl import events as ev
from reference_impl import runtime
from reference_impl.aio import AioHost
from reference_impl.config import ClientConfig, parse_client_config
from reference_impl.config.store_xml import parse_store_config
from reference_impl.config.store_xml_writer import (
    StoreXml,
    TopicXml,
    disk_store_xml,
    store_daemon_xml,
)
from reference_impl.deployment import STORE_PORT, SimDeployment
from reference_impl.proxy import SILENCE, Claim, SourceKey, encode_claim
from reference_impl.sim import CallbackEndpoint, LinkConfig
from reference_impl.source import SourceConfig, SourceCore, StoreSpec
from reference_impl.store import StoreCore, TopicPolicy, TopicRule
from tests.reference_impl.loopback import free_port
from wire.lbmc import LbmcMessage, UmePreg, UmeProxySrc, parse_messages

TOPIC = "proxy.orders"
ACTIVITY = 1.0  # the stores' source-activity-timeout, s
INTERVAL = 0.2  # proxy-election-interval, s: waits of 0.1 .. 0.3 s
JITTER = LinkConfig(delay=0.02, jitter=0.06)  # up to 80 ms one way: claims cross often
RULES = (TopicRule(".*", TopicPolicy(source_activity_timeout=int(ACTIVITY * 1000),
                                     source_check_interval=50, keepalive_interval=300,
                                     proxy_election_interval=int(INTERVAL * 1000)),
                   kind="PCRE"),)
NAMES = ["s0", "s1", "s2"]
PROXY_PORT = 14372  # the stores' proxy sources' transport (in the LBT-TCP source port range)
SETTLE = ACTIVITY + 1.5 * INTERVAL + 1.5  # timeout, longest wait, claims under jitter


def deployment(seed: int, *, allow: bool = True, proxy_source: int = 1,
               ) -> tuple[SimDeployment, SourceCore]:
    d = SimDeployment(seed=seed, link=JITTER)
    group = tuple((d._host(n), STORE_PORT) for n in NAMES)  # addresses before the stores
    for i, name in enumerate(NAMES):
        d.add_store(name, topics=RULES, seed=seed * 10 + i, allow_proxy_source=allow,
                    proxy_stores=group, proxy_port=PROXY_PORT)
    specs = tuple(StoreSpec(ip, port) for ip, port in group)
    src = d.add_source("src", TOPIC, ume_store=specs, ume_session_id=0x5E55,
                       ume_proxy_source=proxy_source, ume_registration_interval=500,
                       ume_proactive_keepalive_interval=250)  # heard well within ACTIVITY
    assert d.run_until(lambda: src.complete, 10)
    return d, src


def stores(d: SimDeployment) -> list[StoreCore]:
    return [d.stores[n] for n in NAMES]


def holders(d: SimDeployment) -> list[str]:
    return [n for n in NAMES if d.stores[n].proxies() == [TOPIC]]


def created(d: SimDeployment, name: str) -> list[ev.ProxySourceCreated]:
    return [e for e in d.events(name) if isinstance(e, ev.ProxySourceCreated)]


def logs(d: SimDeployment, name: str) -> list[ev.LogRecord]:
    return [e for e in d.events(name) if isinstance(e, ev.LogRecord)]


def deleted(d: SimDeployment, name: str) -> list[ev.ProxySourceDeleted]:
    return [e for e in d.events(name) if isinstance(e, ev.ProxySourceDeleted)]


def test_exactly_one_proxy_in_100_seeded_runs_under_jitter() -> None:
    ties = 0
    for seed in range(100):
        d, _ = deployment(seed)
        d.kill("src")
        d.run(SETTLE)
        assert len(holders(d)) == 1, (seed, holders(d))
        made = sum(len(created(d, n)) for n in NAMES)
        lost = [e.reason for n in NAMES for e in deleted(d, n)]
        assert lost == ["election lost"] * (made - 1), seed
        ties += made > 1
        d.run(3.0)  # and it stays one
        assert len(holders(d)) == 1, seed
    assert ties >= 5, ties  # the jitter made stores race (else the test shows little)


def test_proxy_takeover_and_source_return() -> None:
    d, _ = deployment(7)
    d.kill("src")
    d.run(ACTIVITY / 2)
    assert holders(d) == []  # not before the activity timeout
    d.run(SETTLE)
    (holder,) = holders(d)
    (made,) = created(d, holder)[-1:]
    assert made.topic == TOPIC and not made.reelect and made.token
    lines = [e.text for e in logs(d, holder)]
    assert any(t.startswith(f"proxy source created for topic {TOPIC!r}") for t in lines)
    # the source's state was kept while its proxy runs (no state lifetime: see the store)
    assert all(any(s.topic == TOPIC for s in st.sources.values()) for st in stores(d))
    returned = d.restart("src")
    assert isinstance(returned, SourceCore)
    assert d.run_until(lambda: returned.complete, 10)
    d.run(0.5)
    assert holders(d) == []
    assert deleted(d, holder)[-1].reason == "source returned"
    lines = [e.text for e in logs(d, holder)]
    assert any("proxy source deleted" in t and "source returned" in t for t in lines)
    # a second departure elects again
    d.kill("src")
    d.run(SETTLE)
    assert len(holders(d)) == 1


def test_a_receiver_of_the_proxy_follows_the_returned_source() -> None:
    """A late receiver joined the proxy; the source returns: the proxy goes (its receivers'
    connections to it are closed), no store elects another one while the source is alive,
    and the receiver gets the returned source's new messages."""
    d, src = deployment(7)
    for i in range(5):
        src.send(b"m%d" % i)
    d.run(1.0)
    d.kill("src")
    d.run(SETTLE)
    d.add_receiver("late", TOPIC)
    d.run(4.0)
    got = [e.sequence_number for e in d.events("late") if isinstance(e, ev.MessageDelivered)]
    assert got == [0, 1, 2, 3, 4]
    back = d.restart("src")
    assert isinstance(back, SourceCore)
    assert d.run_until(lambda: back.complete, 10)
    d.run(1.0)
    assert holders(d) == []
    new = [back.send(b"n%d" % i) for i in range(5)]
    d.run(6.0)
    assert holders(d) == []  # the source is alive: no election after all
    got = [e.sequence_number for e in d.events("late") if isinstance(e, ev.MessageDelivered)]
    assert set(new) <= set(got)


def test_a_late_receiver_registers_through_the_proxy_and_recovers() -> None:
    """Guide "Proxy Sources": the proxy's advertisements "allow new receivers to join the
    source's transport session and request Source Registration Information (SRI) to register
    with the store and request retransmissions"."""
    d, src = deployment(7)
    sent = [src.send(b"m%d" % i) for i in range(10)]
    d.run(1.0)
    assert src.inflight == 0
    d.kill("src")
    d.run(SETTLE)
    (holder,) = holders(d)
    late = d.add_receiver("late", TOPIC)
    d.run(8.0)
    got = [e for e in d.events("late") if isinstance(e, ev.MessageDelivered)]
    assert [e.sequence_number for e in got] == sent
    assert all(e.retransmission for e in got)
    (ok,) = [e for e in d.events("late") if isinstance(e, ev.ReceiverRegistrationSuccess)]
    assert ok.store.addr == d.stores[holder].addr
    assert late.complete
    assert created(d, "late") == []  # (the receiver makes no proxy, of course)


@pytest.mark.parametrize("seed", [3, 11, 29])
def test_store_of_the_proxy_killed_triggers_a_reelection(seed: int) -> None:
    d, _ = deployment(seed)
    d.kill("src")
    d.run(SETTLE)
    (first,) = holders(d)
    d.kill(first)
    d.run(1.5 * INTERVAL + 1.0)
    survivors = [n for n in holders(d) if n != first]
    assert len(survivors) == 1, holders(d)
    (again,) = created(d, survivors[0])[-1:]
    assert again.reelect


def test_a_proxy_cut_off_is_replaced_and_one_survives_the_heal() -> None:
    """The proxy's store is cut off from the others without its connections being reset
    (streams stall): its claims stop arriving, the others elect again after SILENCE
    intervals; when the cut heals the two proxies' claims meet and one goes."""
    d, _ = deployment(17)
    d.kill("src")
    d.run(SETTLE)
    (first,) = holders(d)
    others = [n for n in NAMES if n != first]
    d.net.partition([first], others)
    d.run((SILENCE + 1.5) * INTERVAL + 1.0)
    assert first in holders(d) and len(holders(d)) == 2  # one on each side of the cut
    (second,) = [n for n in holders(d) if n != first]
    assert created(d, second)[-1].reelect
    d.net.heal()
    # a claim connection opened during the cut waits out the simulator's 3 s connect timeout
    # before it is opened again; then one interval for the next claim
    d.run(3.0 + 3 * INTERVAL + 1.0)
    assert len(holders(d)) == 1
    loser = first if holders(d) == [second] else second
    assert deleted(d, loser)[-1].reason == "election lost"


def test_no_proxy_without_allow_proxy_source() -> None:
    d, _ = deployment(5, allow=False)
    d.kill("src")
    d.run(SETTLE)
    assert holders(d) == [] and all(created(d, n) == [] for n in NAMES)
    # and nobody answers for the topic: a late receiver cannot register
    d.add_receiver("late", TOPIC)
    d.run(5.0)
    assert [e for e in d.events("late") if isinstance(e, ev.ReceiverRegistrationSuccess)] == []


def test_no_proxy_for_a_source_that_did_not_ask() -> None:
    d, _ = deployment(5, proxy_source=0)
    d.kill("src")
    d.run(SETTLE)
    assert holders(d) == []


def inject(d: SimDeployment, frm: str, to: str, data: bytes) -> None:
    """Open a TCP connection from node ``frm`` to store ``to``'s port and write ``data`` as one
    LBT-TCP stream (what a forger on that host would do)."""
    ep = CallbackEndpoint()
    conn = d.net.connect((d.ips[frm], 0), (d.ips[to], STORE_PORT), owner=ep)
    d.run(0.2)
    d.net.stream_send(conn, data)
    d.run(0.2)


@pytest.mark.parametrize("forgery", ["unknown source", "forged store index", "token 0",
                                     "from a stranger"])
def test_bad_claims_are_logged_and_dropped(forgery: str) -> None:
    """Forged election tokens and PSERs for unknown sources: logged and dropped, no proxy,
    no state change, the source's own registration undisturbed."""
    d, src = deployment(13)
    d.add_store("x", topics=RULES, seed=99)  # a node that is no store of the group
    s0, s1 = d.ips["s0"], d.ips["s1"]
    # what the election at s1 knows of the source
    (key,) = list(d.stores["s1"]._proxy.sources)  # type: ignore[union-attr]
    frm = "s0"
    if forgery == "unknown source":
        claim = Claim(SourceKey("10.9.9.9", 1, 2, 3), (s0, STORE_PORT), 0, 77)
    elif forgery == "forged store index":
        claim = Claim(key, (s0, STORE_PORT), 7, 77)
    elif forgery == "token 0":
        claim = Claim(key, (s0, STORE_PORT), 0, 0)
    else:
        claim = Claim(key, (s0, STORE_PORT), 0, 77)
        frm = "x"  # claims to be s0, sent from another host
    election = d.stores["s1"]._proxy
    assert election is not None
    before = {k: vars(v).copy() for k, v in election.sources.items()}
    inject(d, frm, "s1", encode_claim(claim))
    dropped = [e for e in d.events("s1") if isinstance(e, ev.InputDropped)]
    assert len(dropped) == 1 and dropped[0].peer[0] == d.ips[frm]
    warnings = [e.text for e in logs(d, "s1") if e.level is ev.Level.WARNING]
    assert any("proxy" in t or "PSER" in t for t in warnings)
    after = {k: vars(v) for k, v in election.sources.items()}
    assert after == before
    assert holders(d) == [] and created(d, "s1") == []
    assert src.complete and s1  # the source is still registered everywhere
    # the election itself is untouched: the source dying still elects exactly one
    d.kill("src")
    d.run(SETTLE)
    assert len(holders(d)) == 1


# --- the source's side: the proxy request in its PREG, and its one-line config error -----------


def to_stores(d: SimDeployment) -> list[LbmcMessage]:
    """Every LBMC message the stores received on their store port (streams reassembled)."""
    streams: dict[tuple[tuple[str, int], tuple[str, int]], bytes] = {}
    for p in d.net.trace:
        if p.proto == "tcp" and p.kind == "data" and p.dst[1] == STORE_PORT:
            streams[(p.src, p.dst)] = streams.get((p.src, p.dst), b"") + p.data
    return [m for data in streams.values() for m in parse_messages(data)]


def test_the_source_asks_for_a_proxy_in_every_registration() -> None:
    d, _ = deployment(2)
    pregs = [m for m in to_stores(d) if m.header(UmePreg) is not None]
    assert len(pregs) >= 3
    for m in pregs:
        asked, preg = m.header(UmeProxySrc), m.header(UmePreg)
        assert asked is not None and asked.enable
        assert preg is not None and not preg.p_flag  # P is the proxy's own flag
    d2, _ = deployment(2, proxy_source=0)
    assert all(m.header(UmeProxySrc) is None for m in to_stores(d2))


def test_proxy_source_without_regid_or_session_id_is_one_config_error() -> None:
    with pytest.raises(ValueError, match="explicit RegID") as refused:
        SourceConfig(ume_store=(StoreSpec("10.0.0.2", STORE_PORT),), ume_proxy_source=1)
    assert "\n" not in str(refused.value)
    SourceConfig(ume_store=(StoreSpec("10.0.0.2", STORE_PORT, reg_id=5),), ume_proxy_source=1)
    SourceConfig(ume_store=(StoreSpec("10.0.0.2", STORE_PORT),), ume_proxy_source=1,
                 ume_session_id=9)


# --- on real sockets: ump store's proxy port, a late receiver recovering through it ------------


def loopback_topic() -> str:
    """A topic of this run only: another test run on the machine at the same time (its
    stores, sources and resolvers on other ports) cannot answer for it."""
    return f"proxy.{uuid.uuid4().hex[:12]}"


async def _late_receiver_on_loopback(tmp_path: Path) -> tuple[list[int], int]:
    topic = loopback_topic()
    resolver_port, store_port = free_port(socket.SOCK_DGRAM), free_port()
    config = parse_store_config(disk_store_xml(
        "proxy", store_port, r"proxy\..*", repository="memory",
        store_options={"allow-proxy-source": 1},
        topic_options={"source-activity-timeout": 1000, "source-check-interval": 100,
                       "keepalive-interval": 300, "proxy-election-interval": 200}))

    def client(**sections: dict[str, object]) -> ClientConfig:
        mapping: dict[str, dict[str, object]] = {
            "context": {"resolver_unicast_daemon": f"127.0.0.1:{resolver_port}"}}
        mapping.update(sections)
        return ClientConfig.from_mapping(mapping)

    async with AioHost() as host:
        await runtime.run_resolver(host, ("127.0.0.1", resolver_port))
        (store,) = await runtime.start_stores(host, config, resolver=("127.0.0.1", resolver_port),
                                              base=tmp_path)
        assert store.settings.proxy_port not in (0, store_port)
        async with AioHost() as process:  # the source's process: it ends with the block
            source = await runtime.start_source(process, topic, client(source={
                "ume_store": [f"127.0.0.1:{store_port}"], "ume_session_id": 77,
                "ume_proxy_source": 1}))
            await process.wait_until(lambda: source.complete, timeout=15)
            await runtime.send_messages(process, source, 20)
            await process.wait_until(lambda: source.inflight == 0, timeout=10)
        await host.wait_until(lambda: store.proxies() == [topic], timeout=10)
        receiver = await runtime.start_receiver(host, topic, client())
        delivered: list[int] = []

        def on_event(core: object, event: ev.Event) -> None:
            if isinstance(event, ev.MessageDelivered):
                delivered.append(event.sequence_number)
        runtime.handle_events(host, [receiver], on_event)
        await host.wait_until(lambda: len(delivered) >= 20, timeout=15)
        return delivered, len(store.receivers)


def test_a_late_receiver_recovers_through_the_proxy_on_loopback(tmp_path: Path) -> None:
    delivered, receivers = asyncio.run(asyncio.wait_for(
        _late_receiver_on_loopback(tmp_path), 60))
    assert delivered == list(range(20)) and receivers == 1


def test_the_proxy_group_is_the_lbm_config_files_ume_store_list() -> None:
    client = parse_client_config("source ume_store 127.0.0.1:14567\n"
                                 "source ume_store 127.0.0.1:14568:5:1\n"
                                 "source ume_store_name other:7\n")
    assert runtime.proxy_group(client) == (("127.0.0.1", 14567), ("127.0.0.1", 14568))
    assert runtime.proxy_group(None) == ()


async def _two_stores_on_loopback(tmp_path: Path) -> tuple[list[bool], list[int]]:
    topic_name = loopback_topic()
    resolver_port = free_port(socket.SOCK_DGRAM)
    ports = [free_port(), free_port()]
    topic: dict[str, str | int] = {"repository-type": "memory", "source-activity-timeout": 1000,
             "source-check-interval": 100, "keepalive-interval": 300,
             "proxy-election-interval": 200}
    config = parse_store_config(store_daemon_xml([
        StoreXml(f"p{i}", port, options={"allow-proxy-source": 1},
                 topics=[TopicXml(r"proxy\..*", topic)]) for i, port in enumerate(ports)]))
    resolver = {"resolver_unicast_daemon": f"127.0.0.1:{resolver_port}"}
    lbm = ClientConfig.from_mapping({"context": resolver, "source": {
        "ume_store": [f"127.0.0.1:{p}" for p in ports]}})
    async with AioHost() as host:
        await runtime.run_resolver(host, ("127.0.0.1", resolver_port))
        cores = await runtime.start_stores(host, config, resolver=("127.0.0.1", resolver_port),
                                           base=tmp_path, proxy_group=runtime.proxy_group(lbm))
        async with AioHost() as process:  # the source's process: it ends with the block
            source = await runtime.start_source(process, topic_name, ClientConfig.from_mapping({
                "context": resolver, "source": {
                    "ume_store": [f"127.0.0.1:{p}:0:0" for p in ports], "ume_session_id": 78,
                    "ume_proxy_source": 1}}))
            await process.wait_until(lambda: source.complete, timeout=15)
            await runtime.send_messages(process, source, 5)
            await process.wait_until(lambda: source.inflight == 0, timeout=10)
        await host.wait_until(lambda: any(c.proxies() for c in cores), timeout=10)
        await asyncio.sleep(1.0)  # a second claim, had both created one, has settled by now
        receiver = await runtime.start_receiver(host, topic_name, ClientConfig.from_mapping(
            {"context": resolver}))
        delivered: list[int] = []

        def on_event(core: object, event: ev.Event) -> None:
            if isinstance(event, ev.MessageDelivered):
                delivered.append(event.sequence_number)
        runtime.handle_events(host, [receiver], on_event)
        await host.wait_until(lambda: len(delivered) >= 5, timeout=15)
        return [c.proxies() == [topic_name] for c in cores], delivered


def test_two_stores_of_one_daemon_elect_one_proxy_on_loopback(tmp_path: Path) -> None:
    proxies, delivered = asyncio.run(asyncio.wait_for(_two_stores_on_loopback(tmp_path), 60))
    assert sorted(proxies) == [False, True]
    assert delivered == list(range(5))
