"""Whole UM persistence deployments in the simulator: resolver, stores, sources, receivers.

Scenario tests, the capture generator and ``ump demo --simulated`` all need the same wiring:
one node per process, the well-known ports tshark decodes (resolver 15380, LBMR client ports
14402-14406, LBT-TCP transports 14371-14390, request ports 14391-14395, LBT-RU source ports
14380-14389 and receiver ports 14360-14379, store port chosen by the test and given to
``ump dissect --store-port``), and helpers that restart a process with
fresh state.  :class:`SimDeployment` is that wiring; every process is a core bound to a
:class:`~reference_impl.sim.SimNetwork` node, so a scenario of minutes runs in milliseconds and
the trace can be written as a pcap.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from reference_impl.context import ContextCore
from reference_impl.events import Event
from reference_impl.receiver import ReceiverConfig, ReceiverCore, RecoveryCallback
from reference_impl.resolver import DEFAULT_PORT, ResolverCore
from reference_impl.sim import LinkConfig, SimNetwork
from reference_impl.source import SourceConfig, SourceCore, StoreSpec
from reference_impl.store import StoreCore, StoreSettings

T = TypeVar("T")
LBMR_PORT = 14402
TRANSPORT_PORT = 14371
SOURCE_REQUEST_PORT = 14391
RECEIVER_REQUEST_PORT = 14392
STORE_PORT = 14567
LBTRU_SOURCE_PORT = 14380
"""A source's LBT-RU port (``source transport lbt-ru``): tshark's LBT-RU source range is
14380-14389."""
LBTRU_RECEIVER_PORT = 14360
"""Where stores and receivers receive LBT-RU transports: tshark's receiver range 14360-14379.
Every store and receiver binds it, since which transport a source uses is learnt from its TIR."""
LBTRM_SOURCE_PORT = 14390
"""A source's LBT-RM unicast (NAK) port (``source transport lbt-rm``): the product's
``transport_lbtrm_source_port_low``.  Stores and receivers bind a group's destination port
(14400 by default) and join the group when their core first asks (:meth:`SimDeployment.
_joiner`)."""


def restart_seed(seed: int | None, incarnation: int) -> int | None:
    """The RegID seed of a store's ``incarnation``-th restart (0: its first start, ``seed``).

    Why a fresh seed: a restarted process does not replay its random draws, and a memory store
    that did would hand out the RegIDs of its previous life again, to new clients, while the
    old holders may still come back to re-register with them.  Derived from ``seed`` so a
    scenario stays a pure function of its seeds; ``None`` (unseeded) stays unseeded.
    """
    if seed is None or incarnation == 0:
        return seed
    return random.Random(f"store-restart/{seed}/{incarnation}").getrandbits(64)


class SimDeployment:
    """Processes of one deployment on a simulated network (see the module docstring).

    Each ``add_*`` call creates a node named after the process with the next free address in
    10.0.0.0/24 and binds the core; ``restart_*`` kills the node and binds a fresh core (the
    process lost its memory, not its disk).
    """

    def __init__(self, seed: int = 0, *, link: LinkConfig | None = None,
                 keep_trace: bool = True) -> None:
        self.net = SimNetwork(seed, keep_trace=keep_trace)
        self._next_host = 1
        self.resolver_addr = ("10.0.0.1", DEFAULT_PORT)
        self.net.add_node("resolver", self.resolver_addr[0])
        self._next_host = 2
        self.resolver = ResolverCore(self.resolver_addr[0], DEFAULT_PORT, now=self.net.now)
        self.net.bind("resolver", DEFAULT_PORT, self.resolver)
        self.stores: dict[str, StoreCore] = {}
        self.sources: dict[str, SourceCore] = {}
        self.receivers: dict[str, ReceiverCore] = {}
        self.ips: dict[str, str] = {}
        self._factories: dict[str, Callable[[], object]] = {}
        self.link = link
        self.log: list[tuple[float, str, Event]] = []

    @property
    def now(self) -> float:
        return self.net.now

    def _host(self, name: str) -> str:
        if name in self.ips:
            return self.ips[name]
        ip = f"10.0.0.{self._next_host}"
        self._next_host += 1
        self.net.add_node(name, ip)
        if self.link is not None:
            for other in ["resolver", *self.ips]:
                self.net.set_link(name, other, self.link)
        self.ips[name] = ip
        return ip

    # --- processes --------------------------------------------------------------------------

    def add_store(self, name: str, *, port: int = STORE_PORT, **settings: object) -> StoreCore:
        """A store process; a ``seed`` seeds its RegID assignment, and every restart draws a
        fresh one from it (see :func:`restart_seed`)."""
        ip = self._host(name)
        seed = settings.pop("seed", None)
        if seed is not None and not isinstance(seed, int):
            raise TypeError(f"a store seed is an int, not {seed!r}")
        incarnations = itertools.count()

        def make() -> StoreCore:
            incarnation = next(incarnations)
            cfg = StoreSettings(name=name, ip=ip, port=port, lbmr_port=LBMR_PORT,
                                resolver=self.resolver_addr,
                                seed=restart_seed(seed, incarnation),
                                lbtru_port=LBTRU_RECEIVER_PORT,
                                **settings)  # type: ignore[arg-type]
            return self._joiner(name, StoreCore(cfg, now=self.net.now))

        store = make()
        self._factories[name] = make
        self.stores[name] = store
        ports = [LBMR_PORT, port, LBTRU_RECEIVER_PORT]
        if store.settings.proxy_port:  # its proxy sources' transport (reference_impl/proxy.py)
            ports.append(store.settings.proxy_port)
        self._bind(name, store, ports)
        return store

    def add_source(self, name: str, topic: str, stores: list[str] | None = None,
                   **options: object) -> SourceCore:
        ip = self._host(name)
        if "ume_store" not in options:
            names = list(self.stores) if stores is None else stores
            options["ume_store"] = tuple(
                StoreSpec(self.stores[s].addr[0], self.stores[s].addr[1]) for s in names)
        config = SourceConfig(**options)  # type: ignore[arg-type]

        def make() -> SourceCore:
            return SourceCore(topic, config, ip=ip, transport_port=TRANSPORT_PORT,
                              request_port=SOURCE_REQUEST_PORT, lbmr_port=LBMR_PORT,
                              resolver=self.resolver_addr, now=self.net.now,
                              lbtru_port=LBTRU_SOURCE_PORT, lbtrm_port=LBTRM_SOURCE_PORT)

        source = make()
        self._factories[name] = make
        self.sources[name] = source
        ports = [LBMR_PORT, TRANSPORT_PORT, SOURCE_REQUEST_PORT]
        if config.lbtru:
            ports.append(LBTRU_SOURCE_PORT)
        if config.lbtrm:
            ports.append(LBTRM_SOURCE_PORT)
        self._bind(name, source, ports)
        return source

    def add_receiver(self, name: str, topic: str, *,
                     recovery_callback: RecoveryCallback | None = None,
                     **options: object) -> ReceiverCore:
        ip = self._host(name)
        config = ReceiverConfig(**options)  # type: ignore[arg-type]

        def make() -> ReceiverCore:
            return self._joiner(name, ReceiverCore(
                topic, config, ip=ip, request_port=RECEIVER_REQUEST_PORT, lbmr_port=LBMR_PORT,
                resolver=self.resolver_addr, recovery_callback=recovery_callback,
                now=self.net.now, lbtru_port=LBTRU_RECEIVER_PORT))

        receiver = make()
        self._factories[name] = make
        self.receivers[name] = receiver
        self._bind(name, receiver, [LBMR_PORT, RECEIVER_REQUEST_PORT, LBTRU_RECEIVER_PORT])
        return receiver

    def _joiner(self, name: str, core: T) -> T:
        """Give a store or receiver core its LBT-RM group joins: the group's destination port
        bound on the core's node (once) and the group joined there."""
        def join(group: tuple[str, int]) -> None:
            if group[1] not in self.net._node(name).endpoints:
                self.net.bind(name, group[1], core)  # type: ignore[arg-type]
            self.net.join((self.ips[name], group[1]), group)

        assert isinstance(core, ContextCore)
        core.join_group = join
        return core

    def _bind(self, name: str, core: object, ports: list[int]) -> None:
        for port in ports:
            self.net.bind(name, port, core)  # type: ignore[arg-type]

    def kill(self, name: str) -> None:
        """Crash the process (its node): connections reset, memory gone."""
        self.net.kill(name)

    def restart(self, name: str, **changes: object) -> object:
        """Restart a killed (or running) process with a fresh core; ``changes`` replace
        config fields (a source restarted with its saved RegIDs, say)."""
        self.net.kill(name)
        old = self.stores.get(name) or self.sources.get(name) or self.receivers.get(name)
        if isinstance(old, StoreCore):
            old.close()
        if changes:
            self._apply_changes(name, old, changes)
        core = self._factories[name]()
        ports = [p for p, _ in self._bound_ports(name)]
        self.net.restart(name, {p: core for p in ports})  # type: ignore[misc]
        for registry in (self.stores, self.sources, self.receivers):
            if name in registry:
                registry[name] = core  # type: ignore[assignment]
        return core

    def _apply_changes(self, name: str, old: object, changes: dict[str, object]) -> None:
        make = self._factories[name]
        if isinstance(old, SourceCore):
            config = replace(old.config, **changes)  # type: ignore[arg-type]
            topic, ip = old.topic, old.ip

            def remake() -> SourceCore:
                return SourceCore(topic, config, ip=ip, transport_port=TRANSPORT_PORT,
                                  request_port=SOURCE_REQUEST_PORT, lbmr_port=LBMR_PORT,
                                  resolver=self.resolver_addr, now=self.net.now,
                                  lbtru_port=LBTRU_SOURCE_PORT, lbtrm_port=LBTRM_SOURCE_PORT)
            self._factories[name] = remake
        elif isinstance(old, ReceiverCore):
            rconfig = replace(old.config, **changes)  # type: ignore[arg-type]
            rtopic, rip, cb = old.topic, old.ip, old.recovery_callback

            def remake_r() -> ReceiverCore:
                return self._joiner(name, ReceiverCore(
                    rtopic, rconfig, ip=rip, request_port=RECEIVER_REQUEST_PORT,
                    lbmr_port=LBMR_PORT, resolver=self.resolver_addr, recovery_callback=cb,
                    now=self.net.now, lbtru_port=LBTRU_RECEIVER_PORT))
            self._factories[name] = remake_r
        else:
            raise ValueError(f"no config changes for {name!r} ({make})")

    def _bound_ports(self, name: str) -> list[tuple[int, object]]:
        node = self.net._node(name)  # the deployment owns the network; reading it is fine
        return list(node.endpoints.items())

    # --- running ----------------------------------------------------------------------------

    def run(self, seconds: float) -> None:
        """Advance virtual time by ``seconds``, collecting every core's events."""
        self.net.run_until(self.net.now + seconds)
        self.collect()

    def collect(self) -> None:
        for registry in (self.stores, self.sources, self.receivers):
            for name, core in registry.items():
                for event in core.events():
                    self.log.append((self.net.now, name, event))

    def events(self, name: str, kind: type | tuple[type, ...] = object) -> list[Event]:
        """Every event ``name`` produced so far of the given class(es), oldest first."""
        self.collect()
        return [e for _, n, e in self.log if n == name and isinstance(e, kind)]

    def run_until(self, predicate: Callable[[], bool], limit: float = 60.0,
                  step: float = 0.05) -> bool:
        """Run in ``step`` increments until ``predicate()`` or ``limit`` more seconds passed."""
        end = self.net.now + limit
        while self.net.now < end:
            if predicate():
                return True
            self.run(step)
        return predicate()

    def write_pcap(self, path: str | Path) -> int:
        return self.net.write_pcap(path)
