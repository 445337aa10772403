"""Whole deployments whose source sends on LBT-RM, in the simulator (issue 20).

The source runs an :class:`~reference_impl.lbtrm_session.LbtrmSourceSession` on its unicast
port and advertises the 16-byte LBT-RM TIR (group, destination port, session ID, unicast port);
stores and receivers join the group through their core's ``join_group`` (here
:class:`~reference_impl.deployment.SimDeployment`'s), receive on the destination port and feed
the delivered payloads into the same LBMC path as LBT-TCP.  What the transport gives up on, the
receiver recovers from the store, as for any gap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from reference_impl import events as ev
from reference_impl.context import ContextCore
from reference_impl.deployment import LBTRM_SOURCE_PORT, SimDeployment
from reference_impl.lbtrm_session import (
    DESTINATION_PORT,
    MULTICAST_RANGE,
    LbtrmReceiverSession,
    LbtrmReceiverSettings,
    LbtrmSourceSession,
    LbtrmSourceSettings,
)
from reference_impl.sim import LinkConfig
from reference_impl.source import SourceConfig, SourceCore, lbtrm_group, lbtrm_session_id
from reference_impl.store import TopicPolicy, TopicRule
from wire import lbmr, lbtrm

TOPIC = "orders.rm"
RULES = (TopicRule(".*", TopicPolicy(repository_size_threshold=50_000_000), kind="PCRE"),)


def deployment(seed: int = 1, link: LinkConfig | None = None,
               **source_options: Any) -> SimDeployment:
    d = SimDeployment(seed=seed, link=link)
    d.add_store("store", topics=RULES, seed=100)
    d.add_source("src", TOPIC, transport="lbt-rm", **source_options)
    d.add_receiver("rcv", TOPIC)
    assert d.run_until(lambda: d.sources["src"].complete and d.receivers["rcv"].complete, 20)
    return d


def send(d: SimDeployment, n: int, gap: float = 0.001) -> list[int]:
    src = d.sources["src"]
    sqns = []
    for _ in range(n):
        sqns.append(src.send(b"m%d" % src.next_sqn))
        d.run(gap)
    return sqns


def deliveries(d: SimDeployment, name: str = "rcv") -> list[ev.MessageDelivered]:
    return [e for e in d.events(name) if isinstance(e, ev.MessageDelivered)]


def delivered(d: SimDeployment, name: str = "rcv") -> list[int]:
    return [e.sequence_number for e in deliveries(d, name)]


def stable(d: SimDeployment) -> set[int]:
    return {e.sequence_number for e in d.events("src") if isinstance(e, ev.MessageStable)}


def logs(d: SimDeployment, name: str) -> list[str]:
    return [e.text for e in d.events(name) if isinstance(e, ev.LogRecord)]


def rm_session(core: ContextCore) -> LbtrmReceiverSession:
    sessions = [b.session for b in core.lbtru
                if isinstance(b.session, LbtrmReceiverSession) and b.conn is not None]
    assert len(sessions) == 1, sessions
    return sessions[0]


def test_registration_data_and_stability_over_lbtrm_with_the_tir_tshark_expects() -> None:
    d = deployment()
    src = d.sources["src"]
    rm = src.lbtrm_session
    assert isinstance(rm, LbtrmSourceSession)
    info = src._tir().info
    assert isinstance(info, lbmr.LbtrmInfo)
    group = (info.mcast_addr, info.udp_dest_port)
    assert (info.src_addr, info.src_ucast_port) == (src.ip, LBTRM_SOURCE_PORT)
    assert info.session_id == rm.session_id and group == rm.group
    assert info.udp_dest_port == DESTINATION_PORT
    low, high = (sum(int(b) << 8 * (3 - i) for i, b in enumerate(a.split(".")))
                 for a in MULTICAST_RANGE)
    as_int = sum(int(b) << 8 * (3 - i) for i, b in enumerate(info.mcast_addr.split(".")))
    assert low <= as_int <= high
    # the TIR round-trips through the wire as the 16-byte LBT-RM form
    back = lbmr.parse_packet(lbmr.LbmrPacket(tirs=[src._tir()]).build()).tirs[0]
    assert isinstance(back, lbmr.Tir) and back.info == info

    sqns = send(d, 200)
    d.run(2)
    assert delivered(d) == sqns == list(range(200))
    assert stable(d) == set(sqns)
    assert src._transport_conns == []  # nothing went on LBT-TCP
    # every datagram the source sent left its unicast port: data, SMs to the group
    from_source = [p for p in d.net.trace if p.src == (src.ip, LBTRM_SOURCE_PORT)]
    assert from_source and all(p.proto == "udp" and p.dst == group for p in from_source)
    parsed = [lbtrm.parse_packet(p.data, decode_lbmc=False) for p in from_source]
    assert all(p.ucast_port == LBTRM_SOURCE_PORT and p.session_id == rm.session_id
               for p in parsed)
    assert rm.stats["data"] >= 200 and rm.stats["sms"] >= 1
    # both the store and the receiver took it on the group's destination port
    for name in ("store", "rcv"):
        core = d.stores.get(name) or d.receivers[name]
        assert core.groups == {group}
        assert rm_session(core).stats["delivered"] >= 200
    assert d.events("rcv", ev.InputDropped) == d.events("store", ev.InputDropped) == []
    assert not d.events("rcv", ev.UnrecoverableLoss)
    assert "LBTRM:" in logs(d, "rcv")[0]


def test_with_loss_duplication_and_reordering_every_message_arrives_once_in_order() -> None:
    d = deployment(seed=3, link=LinkConfig(loss=0.1, duplicate=0.05, reorder=0.05))
    sqns = send(d, 300)
    d.run(20)
    assert delivered(d) == sqns
    session = rm_session(d.receivers["rcv"])
    assert session.stats["naks"] > 0  # the transport repaired the loss itself
    naks = [p for p in d.net.trace if p.proto == "udp" and p.data[:1] == bytes(
        [lbtrm.PacketType.NAK])]
    src = d.sources["src"]
    # NAKs go to the unicast port named in the header, at the source's address
    assert naks and all(p.dst == (src.ip, LBTRM_SOURCE_PORT) for p in naks)
    assert stable(d) == set(sqns)


def test_what_the_transport_gives_up_on_is_recovered_from_the_store() -> None:
    # a window of a few messages: a NAK for an older one gets "do not retry", the session
    # declares it lost, and the receiver asks the store (which got it on its lossless link)
    d = deployment(seed=5, transport_lbtrm_transmission_window_size=64)
    d.net.set_link("src", "rcv", LinkConfig(loss=0.2), both_ways=False)
    sqns = send(d, 200, gap=0.0005)
    d.run(15)
    assert delivered(d) == sqns
    retransmitted = [e for e in deliveries(d) if e.retransmission]
    assert retransmitted, "nothing came from the store"
    assert d.receivers["rcv"].stats["requests"] > 0
    assert any("LBT-RM transport lost" in text for text in logs(d, "rcv"))
    assert rm_session(d.receivers["rcv"]).stats["lost"] > 0
    assert not d.events("rcv", ev.UnrecoverableLoss)


def test_a_restarted_source_is_a_new_session_that_store_and_receiver_follow() -> None:
    d = deployment(ume_session_id=11)  # its UMP Session ID gets it its RegID back
    send(d, 20)
    d.run(1)
    old = d.sources["src"].lbtrm_session
    assert old is not None
    old_tir = lbmr.LbmrPacket(tirs=[d.sources["src"]._tir()]).build()
    d.kill("src")
    d.run(1)
    src = d.restart("src")
    assert isinstance(src, SourceCore) and src.lbtrm_session is not None
    assert src.lbtrm_session.session_id != old.session_id  # LBT-RM has no reset
    assert d.run_until(lambda: src.complete, 20)
    assert src.next_sqn == 20  # resumed after what the store holds
    send(d, 20)
    d.run(3)
    assert delivered(d) == list(range(40))
    for name in ("store", "rcv"):
        core = d.stores.get(name) or d.receivers[name]
        assert rm_session(core).session_id == src.lbtrm_session.session_id
    assert any("new session" in text for text in logs(d, "store"))
    assert any("the source restarted" in text for text in logs(d, "rcv"))
    assert stable(d) >= set(range(20, 40))
    # a stale advertisement of the old run (a resolver's cache) never brings it back
    for core in (d.stores["store"], d.receivers["rcv"]):
        core.receive(old_tir, d.resolver_addr, d.now)
        assert rm_session(core).session_id == src.lbtrm_session.session_id
        assert old.session_id in core.lbtrm_retired[(src.ip, LBTRM_SOURCE_PORT)]
    send(d, 5)
    d.run(2)
    assert delivered(d) == list(range(45))


def test_what_a_restarted_source_sends_before_its_tir_arrives_is_held_then_delivered() -> None:
    # the receiver hears of the new run from the resolver only 0.5 s late: the new session's
    # first datagrams start a provisional session, which the TIR then confirms
    d = deployment(ume_session_id=11)
    send(d, 10)
    d.run(1)
    d.kill("src")
    d.run(1)
    d.net.set_link("resolver", "rcv", LinkConfig(delay=0.5))
    src = d.restart("src")
    assert isinstance(src, SourceCore)
    assert d.run_until(lambda: src.complete, 20, step=0.01)
    send(d, 10)
    rcv = d.receivers["rcv"]
    held = [b for b in rcv.lbtru if b.held is not None]
    assert len(held) == 1 and held[0].held, "the new run's data was not held"
    assert delivered(d) == list(range(10))  # nothing of it delivered yet
    d.run(3)
    assert delivered(d) == list(range(20))
    assert [b for b in rcv.lbtru if b.held is not None] == []
    assert src.lbtrm_session is not None
    assert rm_session(rcv).session_id == src.lbtrm_session.session_id


def test_another_application_taking_a_dead_sources_port_is_never_delivered() -> None:
    # the source dies; before its sessions time out, a source of another topic (no stores)
    # binds the same unicast port and sends on the same group: its datagrams look like a
    # restart, but no TIR of our topic confirms them, so nothing reaches the store or the
    # receiver (they are held by a provisional session, then dropped with it)
    d = deployment()
    send(d, 10)
    d.run(1)
    old = d.sources["src"].lbtrm_session
    assert old is not None
    d.kill("src")
    d.run(1)
    stranger = SourceCore("another.topic", SourceConfig(transport="lbt-rm"), ip=d.ips["src"],
                          transport_port=14371, request_port=14391, lbmr_port=14402,
                          resolver=d.resolver_addr, now=d.now, lbtrm_port=LBTRM_SOURCE_PORT)
    d.net.restart("src", {14402: stranger, 14371: stranger, 14391: stranger,
                          LBTRM_SOURCE_PORT: stranger})
    assert stranger.lbtrm_session is not None
    assert stranger.lbtrm_session.group == old.group  # same port, same group
    for i in range(20):
        stranger.send(b"not yours %d" % i)
        d.run(0.001)
    d.run(3)
    assert delivered(d) == list(range(10))
    store = d.stores["store"]
    (state,) = store.sources.values()
    assert state.repo is not None and len(state.repo) == 10
    for core in (store, d.receivers["rcv"]):
        held = [b for b in core.lbtru if b.held is not None]
        assert len(held) == 1 and held[0].conn is None and len(held[0].held or []) >= 20
        assert rm_session(core).session_id == old.session_id  # still the old run's
        assert not [text for text in logs(d, "store") if "new session" in text]
    d.run(61)  # the old session times out (60 s), and the provisional one with it
    for core in (store, d.receivers["rcv"]):
        assert [b for b in core.lbtru if b.held is not None] == []


def test_a_datagram_of_another_session_on_the_group_port_is_counted_not_logged() -> None:
    d = deployment()
    rcv = d.receivers["rcv"]
    group = next(iter(rcv.groups))
    stranger = lbtrm.LbtrmSm(ucast_port=14391, session_id=99, sm_sqn=1, lead_sqn=0,
                             trail_sqn=0).build()
    rcv.receive_at(group[1], stranger, ("10.0.0.99", 14391), d.now)
    rcv.receive_at(group[1], b"\x00", ("10.0.0.99", 14391), d.now)  # too short for a header
    assert rcv.stats["lbtrm_foreign"] == 2
    assert not [e for e in rcv.events() if isinstance(e, ev.InputDropped | ev.LogRecord)]


def test_a_tir_naming_no_multicast_group_is_dropped_without_a_join() -> None:
    d = deployment()
    tir = d.sources["src"]._tir()
    assert isinstance(tir.info, lbmr.LbtrmInfo)
    for group, port, ucast in (("10.0.0.5", 14400, 14391), ("224.10.10.11", 0, 14391),
                               ("224.10.10.11", 14400, 0)):
        forged = lbmr.Tir(name=TOPIC, ttl=1, index=7, options=tir.options,
                          info=lbmr.LbtrmInfo(src_addr="10.0.0.77", mcast_addr=group,
                                              session_id=5, udp_dest_port=port,
                                              src_ucast_port=ucast))
        data = lbmr.LbmrPacket(tirs=[forged]).build()
        for core in (d.stores["store"], d.receivers["rcv"]):
            before = set(core.groups)
            core.receive(data, d.resolver_addr, d.now)
            assert core.groups == before
            dropped = [e for e in core.events() if isinstance(e, ev.InputDropped)]
            assert len(dropped) == 1 and "not a multicast group" in dropped[0].reason
            assert core.lbtru_receiving(("10.0.0.77", ucast)) is None
    send(d, 3)
    d.run(1)
    assert delivered(d) == [0, 1, 2]


def test_source_options_session_ids_and_groups() -> None:
    with pytest.raises(ValueError, match="UDP port"):
        SourceCore(TOPIC, SourceConfig(transport="lbtrm"), ip="10.0.0.9", transport_port=1,
                   request_port=2)
    with pytest.raises(ValueError, match="sm_maximum_interval"):
        SourceConfig(transport="lbt-rm", transport_lbtrm_sm_minimum_interval=500,
                     transport_lbtrm_sm_maximum_interval=100)
    with pytest.raises(ValueError, match="above"):
        SourceConfig(transport="lbt-rm", transport_lbtrm_multicast_address_low="224.10.10.20",
                     transport_lbtrm_multicast_address_high="224.10.10.10")
    # a new start time is a new session ID; never 0
    ids = {lbtrm_session_id("10.0.0.1", 14390, 1, t) for t in (0.0, 0.5, 1.0, 3600.0)}
    assert len(ids) == 4 and 0 not in ids
    config = SourceConfig(transport="lbt-rm")
    groups = {lbtrm_group(config, port) for port in range(14390, 14400)}
    assert groups == {f"224.10.10.{n}" for n in range(10, 15)}
    chosen = SourceConfig(transport="lbt-rm", transport_lbtrm_multicast_address="239.1.2.3")
    assert lbtrm_group(chosen, 14390) == "239.1.2.3"
    core = SourceCore(TOPIC, chosen, ip="10.0.0.9", transport_port=1, request_port=2,
                      lbtrm_port=14395, now=7.0)
    assert core.lbtrm_session is not None
    assert core.lbtrm_session.group == ("239.1.2.3", DESTINATION_PORT)
    assert core.lbtrm_session.ucast_port == 14395 and core.transport_addr == ("10.0.0.9", 14395)


@pytest.mark.oracle
def test_an_lbtrm_deployment_dissects_identically_in_tshark(tmp_path: Path) -> None:
    from reference_impl.deployment import STORE_PORT
    from wire.dissect import check_against_tshark, dissect_file
    from wire.tshark import PortMap

    d = deployment(seed=4, transport_lbtrm_transmission_window_size=64)
    d.net.set_link("src", "rcv", LinkConfig(loss=0.1), both_ways=False)
    send(d, 60)
    d.run(5)
    pcap = tmp_path / "lbtrm-sim.pcap"
    d.write_pcap(pcap)
    portmap = PortMap(store_ports=[STORE_PORT])
    reports = list(dissect_file(pcap, portmap))
    assert {r.transport for r in reports} >= {"lbtrm", "lbmr"}
    labels = {o.label for r in reports for o in r.occurrences}
    assert {"PREG", "SRI", "RXREQ"} <= labels
    assert check_against_tshark(pcap, reports, portmap) == []


def test_the_transport_lbtrm_options_parse_with_the_products_defaults_and_reach_the_cores(
        ) -> None:
    from reference_impl.config import ConfigError, parse_client_config
    from reference_impl.runtime import lbtrm_receiver_settings, source_config

    defaults = parse_client_config("source transport lbt-rm\n")
    assert defaults.warnings == () and defaults.source.transport_supported
    ctx, src = defaults.context, defaults.source
    assert (ctx.transport_lbtrm_multicast_address_low,
            ctx.transport_lbtrm_multicast_address_high) == MULTICAST_RANGE
    assert (ctx.transport_lbtrm_source_port_low, ctx.transport_lbtrm_source_port_high) == \
        (14390, 14399)
    assert (ctx.transport_lbtrm_data_rate_limit, ctx.transport_lbtrm_retransmit_rate_limit,
            ctx.transport_lbtrm_rate_interval) == (10_000_000, 5_000_000, 100)
    assert (src.transport_lbtrm_destination_port, src.transport_lbtrm_multicast_address,
            src.transport_lbtrm_source_port) == (DESTINATION_PORT, "", 0)
    assert lbtrm_receiver_settings(defaults) == LbtrmReceiverSettings()  # the session's own
    config = source_config(defaults)
    assert config.lbtrm_settings(1) == LbtrmSourceSettings(session_id=1)

    text = ("context transport_lbtrm_data_rate_limit 50000000\n"
            "context transport_lbtrm_rate_interval 50\n"
            "source transport lbtrm\n"
            "source transport_lbtrm_multicast_address 239.192.0.1\n"
            "source transport_lbtrm_sm_maximum_interval 2000\n"
            "receiver transport_lbtrm_nak_backoff_interval 400\n"
            "receiver transport_lbtrm_send_naks 0\n")
    chosen = parse_client_config(text)
    settings = source_config(chosen).lbtrm_settings(9)
    assert (settings.data_rate_limit, settings.rate_interval, settings.sm_maximum_interval) == \
        (50_000_000, 0.05, 2.0)
    assert lbtrm_group(source_config(chosen), 14390) == "239.192.0.1"
    receiving = lbtrm_receiver_settings(chosen)
    assert receiving.nak_backoff_interval == 0.4 and not receiving.send_naks

    for bad, said in (("source transport_lbtrm_multicast_address 10.1.2.3\n", "multicast"),
                      ("context transport_lbtrm_multicast_address_low 224.10.10.20\n",
                       "above"),
                      ("context transport_lbtrm_source_port_low 14500\n", "above"),
                      ("receiver transport_lbtrm_send_naks 2\n", "0 or 1"),
                      ("receiver transport_lbtrm_data_rate_limit 1\n", "context")):
        with pytest.raises(ConfigError, match=said):
            parse_client_config(bad)


def test_a_send_between_events_is_dated_by_the_application_time() -> None:
    """The runtime tells the core the time of a send; the session-message timer runs from it,
    not from the core's last event (a stale clock put an SM 0.2 ms after each DATA)."""
    core = SourceCore(TOPIC, SourceConfig(transport="lbt-rm",
                                          transport_lbtrm_sm_minimum_interval=15),
                      ip="10.0.0.9", transport_port=1, request_port=2, lbtrm_port=14395,
                      now=0.0)
    assert core.send_many([b"x" * 10], now=5.0) == 1
    assert core.lbtrm_session is not None
    assert core.lbtrm_session.get_timer() == pytest.approx(5.015)
    assert core.send(b"y", now=4.0) == 1  # an earlier time never moves the clock back
    assert core.now == 5.0


def test_a_source_back_on_its_port_with_another_group_is_joined_there() -> None:
    # a source that picks its group at random (the conformance harness's does) comes back
    # on its old unicast port with a new session ID and another group: store and receiver
    # join that group, and the new run's messages reach both
    d = deployment(ume_session_id=11)
    send(d, 10)
    d.run(1)
    old = d.sources["src"].lbtrm_session
    assert old is not None
    d.kill("src")
    d.run(1)
    src = d.restart("src", transport_lbtrm_multicast_address="239.192.7.7")
    assert isinstance(src, SourceCore) and src.lbtrm_session is not None
    assert src.lbtrm_session.group[0] == "239.192.7.7" != old.group[0]
    assert d.run_until(lambda: src.complete, 20)
    send(d, 10)
    d.run(3)
    assert delivered(d) == list(range(20))
    for core in (d.stores["store"], d.receivers["rcv"]):
        assert src.lbtrm_session.group in core.groups
        assert rm_session(core).session_id == src.lbtrm_session.session_id
    assert stable(d) >= set(range(10, 20))


def test_an_lbtru_source_back_on_its_port_under_another_session_id_is_followed() -> None:
    # LBT-RU: the store and the receiver move their session to the ID the new run's TIR
    # names (they used to go on asking it to connect under the old one, which it ignores)
    d = SimDeployment(seed=1)
    d.add_store("store", topics=RULES, seed=100)
    d.add_source("src", TOPIC, transport="lbt-ru", ume_session_id=11,
                 transport_lbtru_session_id=0x1111)
    d.add_receiver("rcv", TOPIC)
    assert d.run_until(lambda: d.sources["src"].complete and d.receivers["rcv"].complete, 20)
    send(d, 10)
    d.run(1)
    d.kill("src")
    d.run(1)
    src = d.restart("src", transport_lbtru_session_id=0x2222)
    assert isinstance(src, SourceCore) and src.lbtru_session is not None
    assert d.run_until(lambda: src.complete, 20)
    send(d, 10)
    d.run(3)
    assert delivered(d) == list(range(20))
    for core in (d.stores["store"], d.receivers["rcv"]):
        (session,) = [b.session for b in core.lbtru if b.conn is not None and b.conn.open]
        assert getattr(session, "session_id", None) == 0x2222
        assert 0x1111 in core.lbtrm_retired[(src.ip, src.transport_addr[1])]
    assert any("LBT-RU transport" in t and "new session" in t for t in logs(d, "store"))
    assert stable(d) >= set(range(10, 20))
