"""Real processes: the reference cores built from configuration files and run on sockets.

This is the glue between three pieces that know nothing of each other: the configuration
readers (:mod:`reference_impl.config`, the product's file formats), the sans-IO cores, and the
asyncio driver (:mod:`reference_impl.aio`).  Each ``run_*`` coroutine is one UM process -
resolver daemon, store daemon, source application, receiver application - and is what the
``ump resolver|store|source|receiver`` commands run.

Applications talk to their core only through :meth:`AioHost.call`, so every action happens on
the loop that drives the core, between two network events, exactly as in the simulator.
Events are drained every few milliseconds: log records go to the process log, deliveries to
the application callback.

Address choices (where the product would use its port ranges): a source binds its LBT-TCP
transport in ``transport_tcp_port_low..high`` (14371-14390) and its request port in
``request_tcp_port_low..high`` (14391-14395), the first free port of each; LBMR goes from an
ephemeral UDP port to the resolver daemon (``resolver_unicast_daemon``, default
127.0.0.1:15380).  A store whose ``interface`` is 0.0.0.0 listens on every address and
advertises 127.0.0.1.

A receiver listens on a request port too, the first free one of the same range, and names it
in its registrations (``resp_ip``/``resp_port``).  Every UM context binds one (the guide's
"Operational View": with ``request_tcp_bind_request_port`` 0 persistence is off), so a
product receiver's PREG names its context's request port; a store tells a restarted receiver
without a Session ID from an impostor by it.  When no port of the range is free (five by
default, shared with every source and receiver on the host) the source and the receiver take
an ephemeral request port and log a warning, where the product's context would not start:
the port works the same, only tshark does not label the traffic to it as UM by default.

LBT-RM (docs/wire-transports.md §2.6): a source binds its unicast (NAK) port at
``transport_lbtrm_source_port`` or the first free one of ``transport_lbtrm_source_port_low..
high`` (14390-14399) and sends its group from there, with its own IP as the multicast
interface and loop on (:meth:`AioHost.join_multicast`: on one machine the group is loopback's,
``scripts/ensure-multicast`` makes the machine route it).  Stores and receivers join groups as
their cores ask (:attr:`ContextCore.join_group`, :func:`group_joiner`): the group's destination
port bound on 0.0.0.0 with ``SO_REUSEADDR`` (every process of the host that receives the group
shares it), the group joined on the core's own IP.

A port is checked free and then bound, so another process (or another core of this one) may
take it in between; the bind then fails, the half-started core is dropped from the host
(:meth:`AioHost.starting`) and the next free ports are tried, up to :data:`BIND_ATTEMPTS` times.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import socket
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any, TextIO

from reference_impl.aio import AioHost, HostError
from reference_impl.config import (
    ClientConfig,
    ReceiverOptions,
    SourceOptions,
    StoreAddress,
    get_profile,
    load_client_config,
)
from reference_impl.config import profiles as config_profiles
from reference_impl.config.store_xml import StoreConfig, StoreDaemonConfig, TopicOptions
from reference_impl.context import ContextCore
from reference_impl.events import (
    Addr,
    Event,
    Level,
    LogRecord,
    MessageDelivered,
    MessageNotStable,
    ReceiverRegistrationError,
    SourceRegistrationError,
    StoreUnresponsive,
    UnrecoverableLoss,
)
from reference_impl.lbtrm_session import LbtrmReceiverSettings
from reference_impl.otr import OtrSettings, otr_applies
from reference_impl.receiver import ReceiverConfig, ReceiverCore
from reference_impl.resolver import DEFAULT_PORT, ResolverCore
from reference_impl.source import SendError, SendErrorCode, SourceConfig, SourceCore, StoreSpec
from reference_impl.store import StoreCore, StoreSettings, TopicPolicy, TopicRule
from wire.lbmc import NHDR_NONE, Topicname

log = logging.getLogger("ump")
DEFAULT_RESOLVER: Addr = ("127.0.0.1", DEFAULT_PORT)
TRANSPORT_PORTS = (14371, 14390)
REQUEST_PORTS = (14391, 14395)


class RuntimeError_(Exception):
    """A process could not start (ports taken, unsupported option); the CLI prints it."""


# --- configuration adapters -------------------------------------------------------------------


def topic_policy(options: TopicOptions) -> TopicPolicy:
    """The store core's view of one topic's options (same names, plain ints)."""
    values: dict[str, Any] = {f.name: getattr(options, f.name)
                              for f in dataclasses.fields(TopicPolicy)}
    plain: dict[str, Any] = {k: v if isinstance(v, str) else int(v) for k, v in values.items()}
    return TopicPolicy(**plain)


def store_settings(store: StoreConfig, *, resolver: Addr, seed: int | None = None,
                   base: Path | None = None,
                   profile: str = config_profiles.DEFAULT_PROFILE) -> StoreSettings:
    """A ``<store>`` element as the store core's settings (relative directories from ``base``);
    ``profile`` (the file's, :attr:`StoreDaemonConfig.profile`) says whether the store knows
    RPP and where a late RPP receiver starts."""
    era = config_profiles.get_profile(profile)
    ip = "127.0.0.1" if store.interface in ("0.0.0.0", "") else str(
        store.interface_network.network_address)
    root = base or Path.cwd()
    rules = tuple(TopicRule(t.pattern, topic_policy(t.options), kind=t.type, matcher=t.matches)
                  for t in store.topics)
    return StoreSettings(
        name=store.name, ip=ip, port=store.port, topics=rules, context_name=store.context_name,
        disk_cache_directory=root / store.disk_cache_directory,
        disk_state_directory=root / store.disk_state_directory,
        retransmission_request_processing_rate=store.retransmission_request_processing_rate,
        resolver=resolver, seed=seed, rpp_supported=era.rpp_supported,
        rpp_late_join_unconsumed=era.rpp_late_join_unconsumed,
        allow_proxy_source=store.allow_proxy_source,
        proxy_source_repo_quorum_required=store.proxy_source_repo_quorum_required)


def source_config(client: ClientConfig) -> SourceConfig:
    opts: SourceOptions = client.source
    specs = []
    for entry in opts.stores:
        if isinstance(entry, StoreAddress):
            specs.append(StoreSpec(entry.ip, entry.port, entry.reg_id, entry.group_idx,
                                   entry.domain_id))
        else:  # ume_store_name: resolved from the store's context-name advertisement
            specs.append(StoreSpec.named(entry.name, entry.reg_id, entry.group_idx))
    if not opts.transport_supported:
        raise RuntimeError_(f"transport {opts.transport} is not implemented by the reference "
                            f"source; use transport tcp, lbt-ru or lbt-rm")
    names = {f.name for f in dataclasses.fields(SourceConfig)}
    values: dict[str, Any] = {n: getattr(opts, n) for n in names if hasattr(opts, n)}
    values["ume_store"] = tuple(specs)
    values["ume_store_group"] = tuple((g.index, g.size) for g in opts.ume_store_group)
    values["ume_session_id"] = opts.ume_session_id or client.context.ume_session_id
    values["ume_proactive_keepalive_interval"] = client.context.ume_proactive_keepalive_interval
    for name in ("transport_lbtrm_multicast_address_low", "transport_lbtrm_multicast_address_high",
                 "transport_lbtrm_data_rate_limit", "transport_lbtrm_retransmit_rate_limit",
                 "transport_lbtrm_rate_interval"):  # context scope in the product
        values[name] = getattr(client.context, name)
    for key, value in list(values.items()):
        if isinstance(value, bool):
            values[key] = int(value)
    # the profile reaches the core here: a pre-5.3 source knows nothing of RPP
    values["rpp_supported"] = get_profile(client.profile).rpp_supported
    try:
        return SourceConfig(**values)
    except ValueError as exc:  # a rule the file reader only warns of (ume_proxy_source)
        raise RuntimeError_(str(exc)) from None


def receiver_config(client: ClientConfig, reg_id: int = 0) -> ReceiverConfig:
    opts: ReceiverOptions = client.receiver
    names = {f.name for f in dataclasses.fields(ReceiverConfig)}
    values: dict[str, Any] = {n: getattr(opts, n) for n in names if hasattr(opts, n)}
    values["ume_session_id"] = opts.ume_session_id or client.context.ume_session_id
    values["ume_ack_batching_interval"] = client.context.ume_ack_batching_interval
    values["ume_proactive_keepalive_interval"] = client.context.ume_proactive_keepalive_interval
    values["reg_id"] = reg_id or client.context.ume_user_receiver_registration_id
    for key, value in list(values.items()):
        if isinstance(value, bool):
            values[key] = int(value)
    values["rpp_supported"] = get_profile(client.profile).rpp_supported  # (as for a source)
    return ReceiverConfig(**values)


def lbtrm_receiver_settings(client: ClientConfig) -> LbtrmReceiverSettings:
    """A receiver's ``transport_lbtrm_*`` options as its LBT-RM sessions' settings (seconds)."""
    opts = client.receiver
    return LbtrmReceiverSettings(
        nak_initial_backoff_interval=opts.transport_lbtrm_nak_initial_backoff_interval / 1000,
        nak_backoff_interval=opts.transport_lbtrm_nak_backoff_interval / 1000,
        nak_generation_interval=opts.transport_lbtrm_nak_generation_interval / 1000,
        activity_timeout=opts.transport_lbtrm_activity_timeout / 1000,
        nak_suppress_interval=opts.transport_lbtrm_nak_suppress_interval / 1000,
        send_naks=opts.transport_lbtrm_send_naks)


def group_joiner(host: AioHost, core: ContextCore, interface: str) -> Callable[[Addr], None]:
    """What a store or receiver core calls to receive an LBT-RM group (see the module
    docstring): bind the destination port once (0.0.0.0, shared), join the group on it.

    The core calls it from inside a call into it, so it must bind at once: ``bind_udp`` binds
    before its first (and only) step returns, and is run to that end here.  A bind or join
    that fails is logged and leaves the core without that group (its session then times
    out), rather than stopping the whole process."""
    bound: set[int] = set()

    def join(group: Addr) -> None:
        port = group[1]
        try:
            if port not in bound:
                _now(host.bind_udp(core, ("0.0.0.0", port), reuse_address=True))
                bound.add(port)
            host.join_multicast(core, group[0], interface=interface, local=("0.0.0.0", port))
        except HostError as exc:
            log.error("cannot receive LBT-RM group %s:%d: %s", group[0], port, exc)

    return join


def _now(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never suspends (see :func:`group_joiner`) to its result."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise HostError("bind_udp suspended: it can no longer be called from inside a core")


def _max_topic_bytes() -> int:
    """The longest topic name the wire carries, in bytes: the LBMC topic name header, which
    every registration (PREG) names its topic with, counts itself in a one-byte ``hdr_len``."""
    empty = len(Topicname(topic="").encode(NHDR_NONE))
    return 0xFF - empty


MAX_TOPIC_BYTES = _max_topic_bytes()


def check_topic(topic: str) -> None:
    """Refuse, in one line, a topic name the wire cannot carry, before anything starts.

    Topic names are bytes on the wire; the reference processes write them in UTF-8
    (``prix/€/日本`` is 14 bytes), so any Unicode name is fine.  Refused: an empty name (tshark
    calls a topic name header without a name malformed), a NUL (a NUL ends a name in topic
    resolution, so the name could neither be advertised nor queried), a name that is not
    valid UTF-8 (a command-line argument in another encoding) and a name longer than
    :data:`MAX_TOPIC_BYTES` bytes in UTF-8.
    """
    if not topic:
        raise RuntimeError_("the topic name is empty")
    if "\0" in topic:
        raise RuntimeError_(f"topic name {topic!r} contains a NUL byte, which ends a name on "
                            "the wire")
    try:
        size = len(topic.encode("utf-8"))
    except UnicodeEncodeError:
        raise RuntimeError_(f"topic name {topic!r} is not valid UTF-8") from None
    if size > MAX_TOPIC_BYTES:
        raise RuntimeError_(f"topic name is {size} bytes in UTF-8; the wire carries at most "
                            f"{MAX_TOPIC_BYTES} (the LBMC topic name header)")


def resolver_of(client: ClientConfig | None) -> Addr:
    if client is not None and client.context.resolver_unicast_daemon:
        first = client.context.resolver_unicast_daemon[0]
        return (first.ip, first.port)
    return DEFAULT_RESOLVER


def load_client(path: str | None, profile: str) -> ClientConfig:
    if path is None:
        return ClientConfig.from_mapping({}, profile=profile)
    return load_client_config(path, profile=profile)


# --- event plumbing ---------------------------------------------------------------------------


#: Events that tell an operator something went wrong (a message the source gave up on, data a
#: receiver cannot get, a store gone silent, a refused registration): logged as warnings, so
#: they show in a daemon's log at its default level; every other event is logged as info.
WARNING_EVENTS = (MessageNotStable, UnrecoverableLoss, StoreUnresponsive,
                  SourceRegistrationError, ReceiverRegistrationError)


def log_event(event: Event) -> None:
    if isinstance(event, LogRecord):
        level = {Level.INFO: logging.INFO, Level.NOTICE: logging.INFO,
                 Level.WARNING: logging.WARNING, Level.ERROR: logging.ERROR}[event.level]
        log.log(level, "%s: %s", event.component, event.text)
    elif isinstance(event, WARNING_EVENTS):
        log.warning("event %s", event)
    elif not isinstance(event, MessageDelivered):
        log.info("event %s", event)


def handle_events(host: AioHost, cores: list[ContextCore],
                  handler: Callable[[ContextCore, Event], None]) -> None:
    """Give every event of ``cores`` to ``handler`` as it happens (see :meth:`AioHost.on_events`:
    a receiver's ACK for a message leaves only after ``handler`` returned for it)."""
    for core in cores:
        host.on_events(core, functools.partial(handler, core))  # one call per event


# --- processes ----------------------------------------------------------------------------------


async def run_resolver(host: AioHost, address: Addr = DEFAULT_RESOLVER) -> ResolverCore:
    core = ResolverCore(address[0], address[1], now=host.now())
    await host.bind_udp(core, address, name="resolver")
    log.info("resolver listening on %s:%d", *address)
    return core


def proxy_group(client: ClientConfig | None) -> tuple[Addr, ...]:
    """The Quorum/Consensus group a store's proxy-source elections run in: the ``source
    ume_store`` addresses of the daemon's ``<lbm-config>`` file (the product creates its proxy
    sources from that configuration).  *Choice*: ``ume_store_name`` entries are left out (a
    store learns no other store's address from a name); empty: each store elects alone."""
    if client is None:
        return ()
    return tuple((entry.ip, entry.port) for entry in client.source.stores
                 if isinstance(entry, StoreAddress))


def store_otr(client: ClientConfig | None) -> OtrSettings | None:
    """A store's own off-transport recovery, from the ``receiver`` options of its daemon's
    ``<lbm-config>`` file: only ``use_otr`` 1, since 2 (the default) covers persistent
    receivers and the store is none (docs/semantics.md §1.9); paced by the ``otr_request_*``
    timers, given up after ``retransmit_request_message_timeout``.  None: no OTR."""
    if client is None or not otr_applies(client.receiver.use_otr, persistent=False):
        return None
    rcv = client.receiver
    return OtrSettings.from_ms(rcv.otr_request_initial_delay, rcv.otr_request_minimum_interval,
                               rcv.otr_request_maximum_interval,
                               rcv.retransmit_request_message_timeout)


async def start_stores(host: AioHost, config: StoreDaemonConfig, *, resolver: Addr,
                       base: Path | None = None, seed: int | None = None,
                       proxy_group: tuple[Addr, ...] = (),
                       otr: OtrSettings | None = None) -> list[StoreCore]:
    """Bind one store core per ``<store>``; the web monitor is the caller's business.
    ``proxy_group``: the stores of proxy-source elections (:func:`proxy_group`); ``otr``:
    the stores' own off-transport recovery (:func:`store_otr`)."""
    cores = []
    for store in config.stores:
        settings = store_settings(store, resolver=resolver, seed=seed, base=base,
                                  profile=config.profile)
        for d in (settings.disk_cache_directory, settings.disk_state_directory):
            if d is not None:
                d.mkdir(parents=True, exist_ok=True)
        # every store can join LBT-RU sources: a receiver UDP port of its own
        settings = dataclasses.replace(
            settings, lbtru_port=free_udp_port(settings.ip, LBTRU_RECEIVER_PORTS))
        listen_ip = "0.0.0.0" if store.interface in ("0.0.0.0", "") else settings.ip
        if settings.allow_proxy_source:
            settings = dataclasses.replace(settings, proxy_stores=proxy_group)
        if otr is not None:
            settings = dataclasses.replace(settings, otr=otr)
        if settings.port == 0:
            # "any free port": picked before the core exists, because the core names its port
            # in context advertisements and registration answers (a port another process takes
            # in between makes the listen below fail with a clear error)
            settings = dataclasses.replace(settings, port=any_free_tcp_port(listen_ip))
        core = StoreCore(settings, now=host.now())
        await host.bind_udp(core, (settings.ip, 0), name=f"store {store.name}")
        core.join_group = group_joiner(host, core, settings.ip)  # LBT-RM sources
        await _bind_store_lbtru(host, core)
        try:
            await host.listen_tcp(core, (listen_ip, settings.port))
        except OSError as exc:
            raise RuntimeError_(f"store {store.name!r}: cannot listen on port {settings.port}: "
                                f"{exc.strerror}") from None
        if settings.allow_proxy_source:  # its proxy sources' transport: any free port
            proxy = await host.listen_tcp(core, (listen_ip, 0))
            core.use_proxy_port(proxy[1])
        cores.append(core)
        log.info('Store "%s" ready to accept registrations on %s:%d', store.name,
                 settings.ip, settings.port)
    return cores


async def _bind_store_lbtru(host: AioHost, core: StoreCore) -> None:
    """Bind the store's LBT-RU receiver port.  Another process may take the port chosen
    (:func:`free_udp_port` checks, the bind comes later): then the next free one of the range,
    a few times, the core told each time (:meth:`StoreCore.use_lbtru_port`).  The core is
    made only once, because making it takes the state directory's lock."""
    for attempt in range(BIND_ATTEMPTS):
        port = core.settings.lbtru_port
        try:
            await host.bind_udp(core, (core.settings.ip, port))
            return
        except HostError:
            if attempt == BIND_ATTEMPTS - 1:
                raise
            core.use_lbtru_port(free_udp_port(core.settings.ip, LBTRU_RECEIVER_PORTS))


LBTRU_RECEIVER_PORTS = (14360, 14379)
"""UM's receiver ``transport_lbtru_port_low/high`` defaults (tshark's LBT-RU receiver range)."""


def any_free_tcp_port(ip: str) -> int:
    """A TCP port the kernel hands out on ``ip`` now (closed again before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def any_free_udp_port(ip: str) -> int:
    """A UDP port the kernel hands out on ``ip`` now (closed again before use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((ip, 0))
        return int(sock.getsockname()[1])


def free_udp_port(ip: str, ports: tuple[int, int]) -> int:
    """The first UDP port of the range nobody has bound."""
    for port in range(ports[0], ports[1] + 1):
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                sock.bind((ip, port))
            except OSError:
                continue
            return port
    raise RuntimeError_(f"no free UDP port in {ports[0]}-{ports[1]} on {ip}")


def request_port(ip: str, client: ClientConfig, role: str) -> int:
    """The request port a source or receiver binds: the first free port of its context's
    ``request_tcp_port_low..high``, else an ephemeral one (see the module docstring)."""
    ctx = client.context
    ports = (ctx.request_tcp_port_low, ctx.request_tcp_port_high)
    try:
        return free_tcp_port(ip, ports)
    except RuntimeError_:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind((ip, 0))
            port: int = sock.getsockname()[1]
        log.warning("%s: no free port in request_tcp_port_low..high (%d-%d) on %s; request "
                    "port %d instead", role, ports[0], ports[1], ip, port)
        return port


def free_tcp_port(ip: str, ports: tuple[int, int], taken: frozenset[int] = frozenset()) -> int:
    """The first port of the range nobody listens on (checked by binding a throwaway socket)."""
    for port in range(ports[0], ports[1] + 1):
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((ip, port))
            except OSError:
                continue
            return port
    raise RuntimeError_(f"no free TCP port in {ports[0]}-{ports[1]} on {ip}")


BIND_ATTEMPTS = 10
"""How many times a source or receiver picks free ports again after a bind lost a race."""


def _lost_race(host: AioHost, exc: HostError) -> None:
    """A bind failed: carry on with other ports, unless the host itself has stopped."""
    if host.closed:
        raise exc


async def start_source(host: AioHost, topic: str, client: ClientConfig, *,
                       ip: str = "127.0.0.1") -> SourceCore:
    """A source core listening on the first free transport and request ports."""
    check_topic(topic)
    config = source_config(client)
    ctx = client.context  # UM's ranges unless the configuration narrows them
    for _ in range(BIND_ATTEMPTS):  # a port may be taken between the check and the bind
        transport = free_tcp_port(ip, (ctx.transport_tcp_port_low, ctx.transport_tcp_port_high))
        request = request_port(ip, client, "source")
        lbtru = lbtrm = 0
        if config.lbtru:  # LBT-RU: the source's UDP port for the transport
            lbtru = client.source.transport_lbtru_port or free_udp_port(
                ip, (client.context.transport_lbtru_port_low,
                     client.context.transport_lbtru_port_high))
        if config.lbtrm:  # LBT-RM: the source's unicast (NAK) port, which it sends from
            lbtrm = client.source.transport_lbtrm_source_port or free_udp_port(
                ip, (ctx.transport_lbtrm_source_port_low, ctx.transport_lbtrm_source_port_high))
        core = SourceCore(topic, config, ip=ip, transport_port=transport,
                          request_port=request, resolver=resolver_of(client), now=host.now(),
                          lbtru_port=lbtru, lbtrm_port=lbtrm)
        try:
            # every port listens before the core advertises them (AioHost.starting)
            with host.starting(core, name=f"source {topic}"):
                await host.listen_tcp(core, (ip, transport))
                await host.listen_tcp(core, (ip, request))
                await host.bind_udp(core, (ip, 0))
                if lbtru:
                    await host.bind_udp(core, (ip, lbtru))
                if lbtrm:
                    await host.bind_udp(core, (ip, lbtrm))
                    rm = core.lbtrm_session
                    assert rm is not None  # multicast out of our own IP, loop on
                    try:
                        host.join_multicast(core, rm.group[0], interface=ip,
                                            local=(ip, lbtrm))
                    except HostError as exc:  # not a port race: no other port helps
                        raise RuntimeError_(
                            f"source {topic}: cannot send LBT-RM to {rm.group[0]} from {ip}: "
                            f"{exc} (on one machine, scripts/ensure-multicast sets loopback "
                            f"up for multicast)") from None
        except HostError as exc:  # the core was dropped from the host: try other ports
            _lost_race(host, exc)
            continue
        return core
    raise RuntimeError_("could not bind the source's transport and request ports")


async def start_receiver(host: AioHost, topic: str, client: ClientConfig, *,
                         ip: str = "127.0.0.1", reg_id: int = 0) -> ReceiverCore:
    """A receiver core listening on the first free request port of its context's range (or an
    ephemeral one: :func:`request_port`), which it names in its registrations, and receiving
    LBT-RU on the first free port of its own range."""
    check_topic(topic)
    config = receiver_config(client, reg_id)
    for _ in range(BIND_ATTEMPTS):  # a port may be taken between the check and the bind
        request = request_port(ip, client, "receiver")
        lbtru = free_udp_port(ip, (client.receiver.transport_lbtru_port_low,
                                   client.receiver.transport_lbtru_port_high))
        core = ReceiverCore(topic, config, ip=ip, request_port=request,
                            resolver=resolver_of(client), now=host.now(), lbtru_port=lbtru)
        core.lbtrm_receiver_settings = lbtrm_receiver_settings(client)
        core.join_group = group_joiner(host, core, ip)  # LBT-RM sources
        try:
            with host.starting(core, name=f"receiver {topic}"):
                await host.listen_tcp(core, (ip, request))
                await host.bind_udp(core, (ip, 0))
                await host.bind_udp(core, (ip, lbtru))  # joins LBT-RU sources from here
        except HostError as exc:  # the core was dropped from the host: try other ports
            _lost_race(host, exc)
            continue
        return core
    raise RuntimeError_("could not bind the receiver's request and LBT-RU ports")


SEND_BATCH = 512
"""Most messages one :func:`send_messages` call into the source puts out at once
(:meth:`SourceCore.send_many`: one stream write).  Every call into a core ends with a flush,
so one message per call costs a system call (and a wake-up of the peer) per message.  The loop
gets a turn between batches, so ACKs are read in time."""


WOULD_BLOCK_RETRY = 0.005
"""Seconds a non-blocking :func:`send_messages` sleeps between two looks at
:meth:`SourceCore.can_send` after a "would block" (the application's retry loop)."""


async def send_messages(host: AioHost, source: SourceCore, count: int, *, rate: float = 0.0,
                        size: int = 64, start: int = 0,
                        progress: Callable[[int], None] | None = None,
                        timeout: float = 60.0, until_sqn: int | None = None,
                        nonblocking: bool = False,
                        would_block: Callable[[SendError], None] | None = None) -> int:
    """Send ``count`` messages numbered from ``start`` (payload ``"<number>:"`` padded to
    ``size`` bytes), waiting out flight size and registration; returns how many were sent
    (fewer when the source deregistered meanwhile).

    Up to :data:`SEND_BATCH` messages go into the source per call (with ``rate``: those whose
    time has come, at most that many).  Gives up when nothing could be sent for ``timeout``
    seconds.

    ``until_sqn``: also stop once the source's next sequence number is at or above it, checked
    before every message (a fragmented message takes one sequence number per fragment, so
    ``count`` messages may take more than ``count`` numbers).  Every message that starts below
    ``until_sqn`` is sent; the last one's fragments may run past it.

    ``nonblocking``: the application of a non-blocking send (docs/semantics.md §1.7): each
    message goes through :meth:`SourceCore.try_send`, one call at a time, and a "would block"
    comes back as a value; ``would_block`` is told of each such refusal (the message was not
    sent), then the application waits until :meth:`SourceCore.can_send` (polling every
    :data:`WOULD_BLOCK_RETRY` seconds) and sends the same message again.  A blocking
    application (the default) never sees the refusal: it just waits for room."""
    sent = 0
    deadline = time.monotonic() + timeout
    interval = 1.0 / rate if rate > 0 else 0.0
    next_at = time.monotonic()

    def payloads(first: int, wanted: int) -> Iterator[bytes]:
        for number in range(first, first + wanted):
            if until_sqn is not None and source.next_sqn >= until_sqn:
                return
            yield f"{number}:".encode().ljust(size, b".")

    def batch(first: int, wanted: int) -> Callable[[float], int]:
        def act(now: float) -> int:
            try:
                return source.send_many(payloads(first, wanted), now)
            except SendError as exc:
                if exc.code in (SendErrorCode.WOULD_BLOCK, SendErrorCode.NOT_REGISTERED):
                    return 0
                if exc.code == SendErrorCode.DEREGISTERED:
                    return -1  # the application deregistered: sending is over
                raise
        return act

    def one(first: int, wanted: int) -> Callable[[float], int | SendError]:
        def act(now: float) -> int | SendError:
            done = 0
            for payload in payloads(first, wanted):
                result = source.try_send(payload, now)
                if isinstance(result, SendError):
                    return done if done else result
                done += 1
            return done
        return act

    while sent < count:
        if until_sqn is not None and source.next_sqn >= until_sqn:
            break
        wanted = min(count - sent, SEND_BATCH)
        if interval:
            due = int((time.monotonic() - next_at) / interval) + 1
            wanted = max(1, min(wanted, due))
        if nonblocking:
            result = host.call(source, one(start + sent, wanted))
            if isinstance(result, SendError):
                if result.code == SendErrorCode.DEREGISTERED:
                    break
                if result.code not in (SendErrorCode.WOULD_BLOCK,
                                       SendErrorCode.NOT_REGISTERED):
                    raise result
                if result.code == SendErrorCode.WOULD_BLOCK and would_block is not None:
                    would_block(result)
                while not source.can_send() and time.monotonic() <= deadline \
                        and not (source.deregistering or source.deregistered):
                    await asyncio.sleep(WOULD_BLOCK_RETRY)
                done = 0
            else:
                done = result
        else:
            done = host.call(source, batch(start + sent, wanted))
        if done < 0:
            break
        if not done:
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(0.001)
            continue
        sent += done
        deadline = time.monotonic() + timeout
        if progress is not None:
            progress(done)
        next_at += done * interval
        # a turn for the loop after every batch (ACKs come in); with a rate, until the next
        # message is due (asyncio treats a delay <= 0 as one turn)
        await asyncio.sleep(next_at - time.monotonic() if interval else 0)
    return sent


class DeliveryLog:
    """Writes every delivered message as a JSON line (sequence number, retransmission flag,
    payload as text, source), so another process (the demo, a test, the conformance harness)
    can check order and uniqueness.

    ``source`` is the product's source string of the source it came from
    (``TCP:127.0.0.1:14371``): a receiver joins every source of its topic, and each numbers
    its own messages, so order and uniqueness hold per source.  A message off-transport
    recovery brought (:attr:`~reference_impl.events.MessageDelivered.otr`) also has
    ``"otr": true``."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.count = 0

    def __call__(self, core: ContextCore, event: Event) -> None:
        if isinstance(event, MessageDelivered):
            row = {"sqn": event.sequence_number, "rx": event.retransmission,
                   "payload": event.payload.decode("latin-1"), "source": event.source}
            if event.otr:  # only when set: the lines of every other delivery are unchanged
                row["otr"] = True
            self.out.write(json.dumps(row) + "\n")
            self.count += 1
        else:
            log_event(event)


@dataclasses.dataclass
class DeliveryFloors:
    """What a delivery log (:class:`DeliveryLog`) already holds: the highest sequence number
    per source, for ``ump receiver --dedupe`` (the application-level de-duplication the guide
    asks for after a receiver restart).  Each source of a topic numbers its own messages, so
    the floor is per source; lines without a source (older logs) count for every source."""

    highest: dict[str, int] = dataclasses.field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> DeliveryFloors:
        """The floors of the log at ``path`` (none when it does not exist); lines that are
        not deliveries (a line cut by a crash) are skipped.

        Raises :class:`RuntimeError_` (``FILE:LINE: ...``) for a line that is not UTF-8: a
        delivery log is JSON lines in ASCII, which no crash turns into other bytes, so such a
        file is not one (floors guessed from it would skip or repeat deliveries, and
        appending would write into someone else's file).  ``OSError`` when it cannot be read.
        """
        floors = cls()
        if not path.exists():
            return floors
        for number, raw in enumerate(path.read_bytes().split(b"\n"), 1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise RuntimeError_(f"{path}:{number}: byte {exc.start + 1} of the line is not "
                                    f"UTF-8: not a delivery log written by ump receiver") \
                    from None
            try:
                row = json.loads(line)
                name, sqn = str(row.get("source", "")), int(row["sqn"])
            except (ValueError, KeyError, TypeError, AttributeError):
                continue
            floors.highest[name] = max(floors.highest.get(name, -1), sqn)
        return floors

    def seen(self, event: MessageDelivered) -> bool:
        """The log already has this delivery (its sequence number is at or below the floor
        of its source)."""
        if not self.highest:
            return False
        floor = self.highest.get(event.source, self.highest.get("", -1))
        return event.sequence_number <= floor
