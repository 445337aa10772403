"""The runtime glue: store XML written by the shared writer, and the order of application
events and consumption ACKs on real sockets.

UM acknowledges consumption when the application's callback returns.  The receiver core queues
its ACK when it delivers a message, so it is the driver's job to run the application's handler
before that ACK leaves; otherwise a receiver killed right after the ACK loses the message (the
store resumes a re-registering receiver after its last ACK).  ``ump demo`` found exactly that
once (one message lost across a SIGKILL); the test below pins the order directly.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl import runtime
from reference_impl.aio import AioHost
from reference_impl.config import ClientConfig
from reference_impl.config.store_xml import parse_store_config
from reference_impl.config.store_xml_writer import (
    StoreXml,
    TopicXml,
    disk_store_xml,
    store_daemon_xml,
)
from reference_impl.events import Event, MessageDelivered
from reference_impl.source import SourceCore
from reference_impl.store import StoreCore
from tests.reference_impl.loopback import free_port

TOPIC = "runtime.acks"


# --- the store XML writer -----------------------------------------------------------------------

_names = st.text(st.characters(codec="ascii", categories=("L", "N", "P", "S")), min_size=1,
                 max_size=20).filter(lambda s: s.strip() == s)


@settings(max_examples=60, deadline=None)
@given(name=_names, pattern=_names, port=st.integers(1, 65535),
       threshold=st.integers(1, 1 << 40))
def test_written_store_xml_parses_back_to_the_same_values(name: str, pattern: str, port: int,
                                                         threshold: int) -> None:
    text = store_daemon_xml(
        [StoreXml(name, port, options={"context-name": "ctx", "disk-cache-directory": "c&d"},
                  topics=[TopicXml(pattern, {"repository-type": "memory",
                                             "repository-size-threshold": threshold},
                                   type="direct")])],
        web_monitor="127.0.0.1:9000")
    config = parse_store_config(text)
    (store,) = config.stores
    assert (store.name, store.port, store.interface) == (name, port, "127.0.0.1")
    assert store.disk_cache_directory == "c&d" and store.context_name == "ctx"
    (topic,) = store.topics
    assert topic.pattern == pattern and topic.type == "direct" and topic.matches(pattern)
    assert topic.options.repository_type == "memory"
    assert topic.options.repository_size_threshold == threshold
    assert config.daemon.web_monitor is not None


def test_disk_store_helper_gives_a_disk_repository_for_matching_topics() -> None:
    (store,) = parse_store_config(disk_store_xml("s", 1234, r"demo\..*")).stores
    (topic,) = store.topics
    assert topic.matches("demo.x") and not topic.matches("other")
    assert topic.options.repository_type == "disk"
    assert store.disk_state_directory == "state"


# --- consumption ACKs leave after the application saw the message -------------------------------


def _client(resolver_port: int, **sections: dict[str, object]) -> ClientConfig:
    mapping: dict[str, dict[str, object]] = {
        "context": {"resolver_unicast_daemon": f"127.0.0.1:{resolver_port}"}}
    for scope, values in sections.items():
        mapping.setdefault(scope, {}).update(values)
    return ClientConfig.from_mapping(mapping)


async def _acks_seen_by_store_at_delivery(tmp_path: Path, receiver_options: dict[str, object],
                                          batching_ms: int) -> tuple[list[int], list[int]]:
    """Deliver 300 messages; for each, what the store had as the receiver's last ACK when the
    application's handler ran."""
    resolver_port, store_port = free_port(socket.SOCK_DGRAM), free_port()
    config = parse_store_config(disk_store_xml("acks", store_port, r"runtime\..*",
                                               repository="memory"))
    async with AioHost() as host:
        await runtime.run_resolver(host, ("127.0.0.1", resolver_port))
        (store,) = await runtime.start_stores(host, config, resolver=("127.0.0.1", resolver_port),
                                              base=tmp_path)
        source = await runtime.start_source(host, TOPIC, _client(
            resolver_port, source={"ume_store": [f"127.0.0.1:{store_port}"]}))
        await host.wait_until(lambda: source.complete, timeout=15)
        receiver = await runtime.start_receiver(host, TOPIC, _client(
            resolver_port, receiver=receiver_options,
            context={"ume_ack_batching_interval": batching_ms}))
        await host.wait_until(lambda: bool(receiver.registered_stores), timeout=15)
        delivered: list[int] = []
        acked_then: list[int] = []

        def on_event(core: object, event: Event) -> None:
            if isinstance(event, MessageDelivered):
                delivered.append(event.sequence_number)
                acks = [r.last_ack for r in store.receivers.values() if r.last_ack is not None]
                acked_then.append(max(acks, default=-1))
        runtime.handle_events(host, [receiver], on_event)
        await runtime.send_messages(host, source, 300, rate=3000)
        await host.wait_until(lambda: len(delivered) >= 300, timeout=20, poll=0.01)
        await host.wait_until(
            lambda: any(r.last_ack == 299 for r in store.receivers.values()), timeout=5)
        await asyncio.sleep(0)
    return delivered, acked_then


@pytest.mark.parametrize("options, batching_ms", [
    ({"ume_use_ack_batching": 0}, 100),  # an ACK per delivery, queued in the same call
    ({}, 1),  # a batching timer that comes due very often
], ids=["immediate", "batched-1ms"])
def test_store_never_holds_an_ack_for_a_message_the_application_has_not_seen(
        tmp_path: Path, options: dict[str, object], batching_ms: int) -> None:
    delivered, acked_then = asyncio.run(asyncio.wait_for(
        _acks_seen_by_store_at_delivery(tmp_path, options, batching_ms), 60))
    assert delivered == list(range(300))
    early = [(sqn, ack) for sqn, ack in zip(delivered, acked_then, strict=True) if ack >= sqn]
    assert early == [], f"the store had these ACKs before the application saw the message: " \
                        f"{early[:5]}"


# --- LBT-RU on real sockets ---------------------------------------------------------------------


async def _lbtru_run(tmp_path: Path, count: int) -> tuple[list[int], SourceCore, StoreCore]:
    resolver_port, store_port = free_port(socket.SOCK_DGRAM), free_port()
    config = parse_store_config(disk_store_xml("ru", store_port, r"runtime\..*",
                                               repository="memory"))
    async with AioHost() as host:
        await runtime.run_resolver(host, ("127.0.0.1", resolver_port))
        (store,) = await runtime.start_stores(host, config, resolver=("127.0.0.1", resolver_port),
                                              base=tmp_path)
        receiver = await runtime.start_receiver(host, TOPIC, _client(resolver_port))
        delivered: list[int] = []
        runtime.handle_events(host, [receiver], lambda core, event: delivered.append(
            event.sequence_number) if isinstance(event, MessageDelivered) else None)
        source = await runtime.start_source(host, TOPIC, _client(
            resolver_port,
            source={"ume_store": [f"127.0.0.1:{store_port}"], "transport": "lbt-ru"}))
        await host.wait_until(lambda: source.complete, timeout=15)
        await host.wait_until(lambda: bool(receiver.registered_stores), timeout=15)
        await runtime.send_messages(host, source, count, rate=5000)
        await host.wait_until(lambda: len(delivered) >= count and source.inflight == 0,
                              timeout=20, poll=0.01)
    return delivered, source, store


def test_lbtru_source_store_and_receiver_over_loopback(tmp_path: Path) -> None:
    """The source's data goes over LBT-RU (its own UDP port, 10-byte TIR form); the store
    and the receiver join by CREQ from their receiver ports; everything is stable and
    delivered once, in order."""
    delivered, source, store = asyncio.run(asyncio.wait_for(_lbtru_run(tmp_path, 500), 60))
    assert delivered == list(range(500))
    assert source.inflight == 0
    assert source.config.transport == "lbt-ru"
    assert 14380 <= source.lbtru[0].port <= 14389  # the context's LBT-RU source range
    assert 14360 <= store.settings.lbtru_port <= 14379  # a receiver-range port of its own
    (binding,) = source.lbtru
    assert binding.session is source.lbtru_session is not None
    assert len(source.lbtru_session.clients) == 2  # the store and the receiver


def test_events_that_mean_trouble_are_logged_as_warnings(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    """A message the source gave up on must show in ``ump source``'s log at its default level
    (the proactive-retransmit suite reads Message Not Stable from the IUT log)."""
    from reference_impl.events import MessageNotStable, MessageReclaimed
    from reference_impl.runtime import log_event
    with caplog.at_level(logging.INFO, logger="ump"):
        log_event(MessageNotStable(sequence_number=7))
        log_event(MessageReclaimed(sequence_number=8))
    levels = {record.getMessage().split("(")[0]: record.levelno for record in caplog.records}
    assert levels["event MessageNotStable"] == logging.WARNING
    assert levels["event MessageReclaimed"] == logging.INFO


def test_a_store_on_port_0_listens_on_and_names_a_real_port(tmp_path: Path) -> None:
    """``port="0"`` in the store XML means any free port: the store must say, advertise and
    put in its registration answers the port it really listens on, never 0."""
    config = parse_store_config(disk_store_xml("anyport", 0, r"runtime\..*",
                                               repository="memory"))

    async def main() -> None:
        async with AioHost() as host:
            (store,) = await runtime.start_stores(host, config, resolver=("127.0.0.1", 9),
                                                  base=tmp_path)
            assert store.addr[1] != 0
            _, writer = await asyncio.open_connection(*store.addr)
            writer.close()

    asyncio.run(main())


def test_a_store_whose_lbtru_port_is_taken_before_it_binds_takes_the_next_free_one(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The LBT-RU port is chosen free, then bound later: a port another process took in
    between must not stop the store (a CI run once failed with "cannot bind UDP 14360")."""
    config = parse_store_config(disk_store_xml("race", 0, r"runtime\..*", repository="memory"))
    taken = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    taken.bind(("127.0.0.1", 0))
    stolen = taken.getsockname()[1]
    real = runtime.free_udp_port
    calls: list[int] = []

    def racing(ip: str, ports: tuple[int, int]) -> int:
        calls.append(1)
        return stolen if len(calls) == 1 else real(ip, ports)
    monkeypatch.setattr(runtime, "free_udp_port", racing)

    async def main() -> int:
        async with AioHost() as host:
            (store,) = await runtime.start_stores(host, config, resolver=("127.0.0.1", 9),
                                                  base=tmp_path)
            return store.settings.lbtru_port

    try:
        port = asyncio.run(main())
    finally:
        taken.close()
    assert port != stolen and len(calls) == 2
    assert runtime.LBTRU_RECEIVER_PORTS[0] <= port <= runtime.LBTRU_RECEIVER_PORTS[1]
