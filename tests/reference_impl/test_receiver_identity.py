"""Who a receiver is to a store, and how it says so (issue 22 follow-ups on the receiver side):

* ``ump receiver`` listens on a request port of its own, in the context's
  ``request_tcp_port_low..high`` range, and names it in every registration (it named port 0);
* a receiver's RegID stays its own until its activity timeout ran out since the store last
  heard from it (restored state: counted from the store's restart), whatever happened to its
  connection, except for a registration that provably comes from the same receiver: its own
  connection, or one from its IP with its Session ID (without one: its request address) - the
  guide's "Activity Timeout and State Lifetime Options" and "Registration Identifier";
* a receiver retries a "RegID in use" refusal instead of giving up for good;
* two sources started at once in one range both start, on different ports.

Sans-IO cores driven with real PREG bytes, the simulator, and real sockets on free ports.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import Mapping
from pathlib import Path

import pytest

from reference_impl import events as ev
from reference_impl import runtime
from reference_impl.aio import AioHost, HostError
from reference_impl.config import ClientConfig
from reference_impl.config.store_xml import parse_store_config
from reference_impl.config.store_xml_writer import disk_store_xml
from reference_impl.context import control
from reference_impl.deployment import SimDeployment
from reference_impl.receiver import ReceiverConfig, ReceiverCore
from reference_impl.sim import ConnKey, StreamEvent, StreamEventKind, StreamWrite
from reference_impl.store import TopicPolicy, TopicRule
from tests.reference_impl.loopback import free_port as _free_port
from tests.reference_impl.store_bench import RESOLVER, STORE, StoreBench
from wire import lbmr
from wire.lbmc import (
    Header,
    PregError,
    Sri,
    TopicIdx,
    Topicname,
    UmePreg,
    UmePregResp,
    UmeSid,
    UmeStore,
    parse_message,
)

SOURCE = ("10.0.0.3", 14391)  # the source's request address
OWNER = ("10.0.0.4", 14392)  # the receiver's request address
THIEF = ("10.0.0.9", 14392)  # another host
NEIGHBOUR = ("10.0.0.4", 14393)  # the owner's host, another request port
TOPIC = "orders"
SRC_REG_ID = 77
REG_ID = 900
TIMEOUT_MS = 5000
POLICY = TopicPolicy(source_activity_timeout=60_000, receiver_activity_timeout=TIMEOUT_MS,
                     repository_size_threshold=1 << 30)
DISK = TopicPolicy(source_activity_timeout=60_000, receiver_activity_timeout=TIMEOUT_MS,
                   repository_type="disk", repository_size_threshold=1 << 30)


class Bench(StoreBench):
    """A store core with one registered source; receivers register on connections of their
    own (one ephemeral port each), with real PREG bytes."""

    def __init__(self, policy: TopicPolicy = POLICY, tmp: Path | None = None,
                 now: float = 0.0, *, source: bool = True) -> None:
        super().__init__(policy, tmp, now)
        if source:
            key = self.connect(SOURCE[0], now)
            self.send(key, now, UmePreg(s_flag=1, reg_id=SRC_REG_ID, transport_idx=1,
                                        topic_idx=1, resp_ip=SOURCE[0], resp_port=SOURCE[1]),
                      Topicname(topic=TOPIC))
            self.store.handle_timer(now + 2.5)  # answered without the transport (JOIN_WAIT)
            self.answers(key, now + 2.5)

    def register(self, key: ConnKey, now: float, *, request: tuple[str, int] = OWNER,
                 reg_id: int = REG_ID, session_id: int = 0) -> Header:
        """A receiver PREG for the source on ``key``; returns the store's answer."""
        headers: list[object] = [UmePreg(s_flag=0, reg_id=reg_id, transport_idx=1, topic_idx=1,
                                         src_reg_id=SRC_REG_ID, resp_ip=request[0],
                                         resp_port=request[1]), Topicname(topic=TOPIC)]
        if session_id:
            headers.append(UmeSid(sid=session_id))
        self.send(key, now, *headers)
        (answer,) = self.answers(key, now)
        return answer


def refused(resp: Header) -> bool:
    """Refused because another receiver holds the RegID (code 3, "RegID is in use by a
    receiver")."""
    return bool(resp.e_flag) and resp.error_code == PregError.EREGID


def granted(resp: Header, reg_id: int = REG_ID) -> bool:
    return not resp.e_flag and resp.reg_id == reg_id


# --- the store: a receiver's RegID is its own for its activity timeout ---------------------------


def test_a_killed_receivers_regid_is_refused_to_another_host_until_its_activity_timeout(
        ) -> None:
    bench = Bench()
    owner = bench.connect(OWNER[0], 3.0)
    assert granted(bench.register(owner, 3.0))
    heard = bench.store.receivers[REG_ID].last_activity
    bench.close(owner, 3.5)  # SIGKILL: the kernel closes the socket at once
    assert refused(bench.register(bench.connect(THIEF[0], 3.6), 3.6, request=THIEF))
    late = heard + TIMEOUT_MS / 1000 - 0.1
    bench.tick(late)
    assert refused(bench.register(bench.connect(THIEF[0], late), late, request=THIEF))
    free = heard + TIMEOUT_MS / 1000 + 1.0
    bench.tick(free)
    assert granted(bench.register(bench.connect(THIEF[0], free), free, request=THIEF))


def test_a_receiver_on_the_owners_host_with_another_request_port_is_refused() -> None:
    bench = Bench()
    owner = bench.connect(OWNER[0], 3.0)
    assert granted(bench.register(owner, 3.0))
    bench.close(owner, 3.5)
    assert refused(bench.register(bench.connect(NEIGHBOUR[0], 3.6), 3.6, request=NEIGHBOUR))
    # the owner's request address named from another host is no proof either
    assert refused(bench.register(bench.connect(THIEF[0], 3.7), 3.7, request=OWNER))


def test_the_owner_back_on_its_request_address_is_granted_at_once() -> None:
    """A restarted receiver without a Session ID (its RegID in its configuration) is known by
    its request address: granted at once, as the old registration."""
    bench = Bench()
    owner = bench.connect(OWNER[0], 3.0)
    assert granted(bench.register(owner, 3.0))
    bench.close(owner, 3.5)
    again = bench.register(bench.connect(OWNER[0], 3.6), 3.6)
    assert granted(again) and again.o_flag == 1
    assert granted(bench.register(bench.connect(OWNER[0], 3.7), 3.7))  # a retried PREG


def test_with_a_session_id_the_owner_is_its_session_id_from_its_host() -> None:
    bench = Bench()
    owner = bench.connect(OWNER[0], 3.0)
    assert granted(bench.register(owner, 3.0, session_id=5))
    bench.close(owner, 3.5)
    assert refused(bench.register(bench.connect(OWNER[0], 3.6), 3.6, session_id=6))
    assert refused(bench.register(bench.connect(OWNER[0], 3.6), 3.6))  # without one
    assert refused(bench.register(bench.connect(THIEF[0], 3.7), 3.7, request=THIEF,
                                  session_id=5))
    # the restarted application, on another request port, asks by its Session ID alone
    again = bench.register(bench.connect(NEIGHBOUR[0], 3.8), 3.8, request=NEIGHBOUR,
                           session_id=5, reg_id=0)
    assert granted(again) and again.o_flag == 1
    assert bench.store.receivers[REG_ID].request_addr == NEIGHBOUR


def test_request_port_0_proves_nothing() -> None:
    """A registration naming port 0 has no request port to tell it apart from any other
    process on its host: without a Session ID it is the owner only on its own connection."""
    bench = Bench()
    nowhere = (OWNER[0], 0)
    owner = bench.connect(OWNER[0], 3.0)
    assert granted(bench.register(owner, 3.0, request=nowhere))
    assert granted(bench.register(owner, 3.1, request=nowhere))  # its own connection
    bench.close(owner, 3.5)
    assert refused(bench.register(bench.connect(OWNER[0], 3.6), 3.6, request=nowhere))


def test_a_live_receivers_regid_is_refused_while_its_keepalives_keep_it_active() -> None:
    bench = Bench()
    owner = bench.connect(OWNER[0], 3.0)
    assert granted(bench.register(owner, 3.0))
    bench.close(owner, 3.5)
    bench.store.receivers[REG_ID].last_activity = 7.5  # what a keepalive at 7.5 does
    bench.tick(10.0)
    assert refused(bench.register(bench.connect(THIEF[0], 10.0), 10.0, request=THIEF))


def test_weak_receiver_regids_are_held_only_while_the_owner_is_connected() -> None:
    bench = Bench(TopicPolicy(receiver_activity_timeout=0, repository_size_threshold=1 << 30))
    owner = bench.connect(OWNER[0], 3.0)
    assert granted(bench.register(owner, 3.0))
    assert refused(bench.register(bench.connect(THIEF[0], 3.2), 3.2, request=THIEF))
    bench.close(owner, 3.5)
    assert granted(bench.register(bench.connect(THIEF[0], 3.6), 3.6, request=THIEF))


def test_a_regid_of_a_receiver_of_another_source_waits_for_its_activity_timeout() -> None:
    """A receiver RegID belongs to one source ("Registration Identifier"): the same RegID for
    another source at that store waits until the first registration's activity timeout ran
    out, even from the same receiver (two sessions of one receiver must not take each
    other's RegID)."""
    bench = Bench()
    other = bench.connect("10.0.0.5", 3.0)
    bench.send(other, 3.0, UmePreg(s_flag=1, reg_id=78, transport_idx=1, topic_idx=2,
                                   resp_ip="10.0.0.5", resp_port=14391),
               Topicname(topic=TOPIC))
    bench.store.handle_timer(5.5)
    owner = bench.connect(OWNER[0], 6.0)
    assert granted(bench.register(owner, 6.0))
    bench.close(owner, 6.5)
    key = bench.connect(OWNER[0], 6.6)
    bench.send(key, 6.6, UmePreg(s_flag=0, reg_id=REG_ID, transport_idx=1, topic_idx=2,
                                 src_reg_id=78, resp_ip=OWNER[0], resp_port=OWNER[1]))
    (answer,) = bench.answers(key, 6.6)
    assert refused(answer)


def restarted(tmp_path: Path, restart_at: float, session_id: int = 0) -> Bench:
    """A disk store that held a receiver's registration, restarted at ``restart_at``."""
    first = Bench(DISK, tmp_path)
    owner = first.connect(OWNER[0], 3.0)
    assert granted(first.register(owner, 3.0, session_id=session_id))
    first.store.close()
    return Bench(DISK, tmp_path, restart_at, source=False)


def test_after_a_store_restart_a_restored_receiver_regid_is_its_owners(tmp_path: Path) -> None:
    bench = restarted(tmp_path, 100.0)
    assert REG_ID in bench.store.receivers
    assert refused(bench.register(bench.connect(THIEF[0], 100.2), 100.2, request=THIEF))
    assert refused(bench.register(bench.connect(NEIGHBOUR[0], 100.3), 100.3,
                                  request=NEIGHBOUR))
    real = bench.register(bench.connect(OWNER[0], 100.4), 100.4)
    assert granted(real) and real.o_flag == 1


def test_after_a_store_restart_the_session_id_finds_the_receiver_at_once(
        tmp_path: Path) -> None:
    bench = restarted(tmp_path, 100.0, session_id=0x5E56)
    again = bench.register(bench.connect(OWNER[0], 100.2), 100.2, request=NEIGHBOUR,
                           session_id=0x5E56, reg_id=0)
    assert granted(again) and again.o_flag == 1


def test_restored_receiver_state_is_owned_for_an_activity_timeout_from_the_restart(
        tmp_path: Path) -> None:
    bench = restarted(tmp_path, 100.0)
    bench.tick(104.5)
    assert refused(bench.register(bench.connect(THIEF[0], 104.5), 104.5, request=THIEF))
    bench.tick(106.0)
    assert granted(bench.register(bench.connect(THIEF[0], 106.0), 106.0, request=THIEF))


# --- the receiver core: "RegID in use" is retried ------------------------------------------------


def registering_receiver() -> tuple[ReceiverCore, ConnKey]:
    """A receiver core that joined a source and sent its PREG to the store the SRI names."""
    rcv = ReceiverCore(TOPIC, ReceiverConfig(reg_id=REG_ID), ip=OWNER[0],
                       request_port=OWNER[1], resolver=RESOLVER, now=0.0)
    rcv.handle_timer(0.0)
    rcv.datagrams_to_send(0.0)
    tir = lbmr.Tir(name=TOPIC, ttl=1, index=1, info=lbmr.TcpInfo(ip=SOURCE[0], port=14371),
                   options=[lbmr.ToptUme(store=1, src_tcp_port=SOURCE[1],
                                         src_tcp_addr=SOURCE[0], transport_idx=1)])
    rcv.receive(lbmr.LbmrPacket(tirs=[tir]).build(), RESOLVER, 0.1)
    transport: ConnKey = ((OWNER[0], 40001), (SOURCE[0], 14371))
    rcv.stream_commands(0.1)
    rcv.stream_event(StreamEvent(StreamEventKind.CONNECTED, transport), 0.2)
    rcv.stream_event(StreamEvent(StreamEventKind.DATA, transport, control(
        Sri(version=1), TopicIdx(tidx=1),
        UmeStore(store_idx=0, grp_idx=0, store_ip_addr=STORE[0], store_tcp_port=STORE[1],
                 src_reg_id=SRC_REG_ID))), 0.3)
    store: ConnKey = ((OWNER[0], 40002), STORE)
    rcv.stream_commands(0.3)
    rcv.stream_event(StreamEvent(StreamEventKind.CONNECTED, store), 0.31)
    return rcv, store


def pregs(rcv: ReceiverCore, key: ConnKey, now: float) -> list[Header]:
    return [h for c in rcv.stream_commands(now) if isinstance(c, StreamWrite) and c.conn == key
            for h in parse_message(c.data)[0].headers if isinstance(h, UmePreg)]


def run_timers(rcv: ReceiverCore, until: float) -> None:
    due = rcv.get_timer()
    while due is not None and due <= until:
        rcv.handle_timer(due)
        due = rcv.get_timer()


def test_a_receiver_retries_a_regid_in_use_refusal_and_not_a_final_one() -> None:
    rcv, store = registering_receiver()
    assert pregs(rcv, store, 0.31)
    rcv.stream_event(StreamEvent(StreamEventKind.DATA, store, control(UmePregResp(
        e_flag=1, error_code=PregError.EREGID, reg_id=REG_ID, marker=1))), 0.4)
    (error,) = [e for e in rcv.events() if isinstance(e, ev.ReceiverRegistrationError)]
    assert error.code == PregError.EREGID
    run_timers(rcv, 3.4)
    (again,) = pregs(rcv, store, 3.4)  # one ume_registration_interval later
    assert again.reg_id == REG_ID
    # the holder timed out at the store: the retry is granted
    rcv.stream_event(StreamEvent(StreamEventKind.DATA, store, control(UmePregResp(
        reg_id=REG_ID, marker=1, low_seqnum=0, high_seqnum=0))), 3.5)
    assert any(isinstance(e, ev.ReceiverRegistrationComplete) for e in rcv.events())
    # a final refusal (no matching topic pattern) is not retried
    final, key = registering_receiver()
    pregs(final, key, 0.31)
    final.stream_event(StreamEvent(StreamEventKind.DATA, key, control(UmePregResp(
        e_flag=1, error_code=PregError.ENOPATTERN, reg_id=REG_ID, marker=1))), 0.4)
    run_timers(final, 10.0)
    assert not pregs(final, key, 10.0)


def test_in_the_simulator_a_second_receiver_gets_a_killed_ones_regid_after_its_timeout(
        ) -> None:
    """Two receivers configured with one RegID (the common mistake): the second is refused
    while the first lives, keeps asking, and gets the RegID once the first, killed, has been
    silent for the store's receiver activity timeout - not at once when its socket closes."""
    d = SimDeployment(seed=3)
    d.add_store("store0", topics=(TopicRule(".*", POLICY, kind="PCRE"),), seed=100)
    d.add_source("src", TOPIC)
    first = d.add_receiver("first", TOPIC, reg_id=REG_ID)
    assert d.run_until(lambda: first.complete, 10)
    second = d.add_receiver("second", TOPIC, reg_id=REG_ID)
    d.run(4)
    codes = [e.code for e in d.events("second", ev.ReceiverRegistrationError)
             if isinstance(e, ev.ReceiverRegistrationError)]
    assert codes and set(codes) == {PregError.EREGID}
    d.kill("first")
    killed = d.net.now
    assert d.run_until(lambda: second.complete, 30)
    took = d.net.now - killed
    assert TIMEOUT_MS / 1000 - 0.1 <= took <= TIMEOUT_MS / 1000 + 4.0, took


def test_in_the_simulator_a_restarted_receiver_gets_its_static_regid_back_at_once() -> None:
    d = SimDeployment(seed=4)
    d.add_store("store0", topics=(TopicRule(".*", POLICY, kind="PCRE"),), seed=100)
    d.add_source("src", TOPIC)
    rcv = d.add_receiver("rcv", TOPIC, reg_id=REG_ID)
    assert d.run_until(lambda: rcv.complete, 10)
    d.kill("rcv")
    d.run(0.5)
    back = d.restart("rcv")
    assert isinstance(back, ReceiverCore)
    assert d.run_until(lambda: back.complete, 3)
    assert not d.events("rcv", ev.ReceiverRegistrationError)
    success = d.events("rcv", ev.ReceiverRegistrationSuccess)[-1]
    assert isinstance(success, ev.ReceiverRegistrationSuccess) and success.old is True


# --- real sockets ---------------------------------------------------------------------------------


def _free_range(size: int) -> int:
    """The first port of ``size`` consecutive TCP ports free a moment ago (high ports, away
    from UM's defaults, so tests running beside this one do not take them)."""
    rng = random.Random()
    while True:
        low = rng.randrange(20000, 60000)
        socks = []
        try:
            for port in range(low, low + size):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", port))
            return low
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()


def _client(resolver: tuple[str, int], **sections: Mapping[str, object]) -> ClientConfig:
    mapping: dict[str, dict[str, object]] = {
        "context": {"resolver_unicast_daemon": f"{resolver[0]}:{resolver[1]}"}}
    for scope, values in sections.items():
        mapping.setdefault(scope, {}).update(values)
    return ClientConfig.from_mapping(mapping)


def test_ump_receiver_listens_on_a_request_port_in_its_range_and_registers_with_it(
        tmp_path: Path) -> None:
    async def main() -> None:
        resolver = ("127.0.0.1", _free_port(socket.SOCK_DGRAM))
        store_port = _free_port(socket.SOCK_STREAM)
        config = parse_store_config(disk_store_xml("s", store_port, r"t\..*",
                                                   repository="memory"))
        low = _free_range(1)  # a range of its own
        ranges = {"request_tcp_port_low": low, "request_tcp_port_high": low}
        async with AioHost() as host:
            await runtime.run_resolver(host, resolver)
            (store,) = await runtime.start_stores(host, config, resolver=resolver,
                                                  base=tmp_path)
            receiver = await runtime.start_receiver(host, "t.x",
                                                    _client(resolver, context=ranges))
            assert receiver.request_addr == ("127.0.0.1", low)
            with socket.create_connection(("127.0.0.1", low), timeout=2):
                pass  # it listens there
            source = await runtime.start_source(host, "t.x", _client(
                resolver, source={"ume_store": [f"127.0.0.1:{store_port}"]}))
            await host.wait_until(lambda: source.complete, timeout=15)
            await host.wait_until(lambda: bool(store.receivers), timeout=15)
            (state,) = store.receivers.values()
            assert state.request_addr == ("127.0.0.1", low)
    asyncio.run(main())


def test_two_sources_started_at_once_take_different_ports_of_one_range() -> None:
    """The port check and the bind are apart, so two sources starting together may pick the
    same port; the one whose bind fails moves on to the next port instead of failing."""
    async def main() -> None:
        resolver = ("127.0.0.1", _free_port(socket.SOCK_DGRAM))
        transport, request = _free_range(2), _free_range(2)
        ctx = {"transport_tcp_port_low": transport, "transport_tcp_port_high": transport + 1,
               "request_tcp_port_low": request, "request_tcp_port_high": request + 1}
        async with AioHost() as host:
            first, second = await asyncio.gather(
                runtime.start_source(host, "t.a", _client(resolver, context=ctx)),
                runtime.start_source(host, "t.b", _client(resolver, context=ctx)))
            assert first.request_addr != second.request_addr
            assert first.transport_addr != second.transport_addr
            for core in (first, second):
                for addr in (core.request_addr, core.transport_addr):
                    with socket.create_connection(addr, timeout=2):
                        pass
    asyncio.run(main())


def test_a_core_whose_start_failed_is_forgotten_with_its_sockets() -> None:
    """What lets start_source try again: a bind that fails inside ``AioHost.starting`` drops
    the core from the host, closing what it had bound already, and the core never runs."""
    async def main() -> None:
        async with AioHost() as host:
            core = ReceiverCore(TOPIC, ReceiverConfig(), ip="127.0.0.1", resolver=RESOLVER,
                                now=host.now())
            with socket.socket() as taken:
                taken.bind(("127.0.0.1", 0))
                taken.listen()
                udp = _free_port(socket.SOCK_DGRAM)
                listening = _free_port(socket.SOCK_STREAM)
                try:
                    with host.starting(core, name="doomed"):
                        await host.bind_udp(core, ("127.0.0.1", udp))
                        await host.listen_tcp(core, ("127.0.0.1", listening))
                        await host.listen_tcp(core, taken.getsockname())
                except HostError:
                    pass
                else:
                    raise AssertionError("listening on a taken port succeeded")
            for kind, port in ((socket.SOCK_DGRAM, udp), (socket.SOCK_STREAM, listening)):
                with socket.socket(socket.AF_INET, kind) as again:
                    again.bind(("127.0.0.1", port))  # closed with the core
            await asyncio.sleep(0.05)
            assert core.get_timer() is not None  # its start-up timers never ran
            try:
                host.call(core, lambda now: None)
            except HostError:
                pass
            else:
                raise AssertionError("the host still drives the core")
            assert not host.closed  # the host and its other cores go on
    asyncio.run(main())


def test_with_its_request_range_taken_a_receiver_listens_on_an_ephemeral_port(
        caplog: pytest.LogCaptureFixture) -> None:
    """Five request ports by default, shared by every client on the host: when none is free
    the receiver still starts (on a port of the kernel's choosing, said in a warning)."""
    async def main() -> None:
        resolver = ("127.0.0.1", _free_port(socket.SOCK_DGRAM))
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            ctx = {"request_tcp_port_low": port, "request_tcp_port_high": port}
            async with AioHost() as host:
                receiver = await runtime.start_receiver(host, "t.x",
                                                        _client(resolver, context=ctx))
                got = receiver.request_addr[1]
                assert got not in (0, port)
                with socket.create_connection(("127.0.0.1", got), timeout=2):
                    pass
        assert f"no free port in request_tcp_port_low..high ({port}-{port})" in caplog.text
    with caplog.at_level(logging.WARNING, logger="ump"):
        asyncio.run(main())
