"""What a case works with: the IUT, the harness's peers, checks, and the case's evidence.

:class:`Harness` implements :class:`conformance.context.CaseContext`, the protocol the cases are
typed against (so the case model does not import the harness).  A case is a function taking
it::

    @case("REG-SRC-001", ...)
    def new_source_gets_a_regid(h: CaseContext) -> None:
        src = h.source()
        resp = src.register(reg_id=0)
        h.check(not resp.e_flag, "the store refused a new source",
                expected="PREG_RESP without the E flag", observed=resp)

Against a source or receiver IUT the case sets up the peers first and then starts the IUT
with a configuration naming them::

    @case("SRC-REG-001", role=Role.SOURCE, ...)
    def registers_with_every_store(h: CaseContext) -> None:
        a, b = h.store("store A"), h.store("store B")
        h.start_iut(a, b)
        h.wait_until(lambda: a.source_pregs() and b.source_pregs(), 3.0, "PREGs")

Every wait is scaled by ``--time-scale`` (:meth:`Harness.scaled`) and ends as soon as what it
waits for arrives; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import itertools
import random
import shutil
import time
from collections.abc import Callable
from typing import Any

from conformance.evidence import Addr, Recorder
from conformance.iut import (
    PORT_ATTEMPTS,
    ClientUnderTest,
    IutProcess,
    StoreEntry,
    StoreUnderTest,
    UmOptions,
)
from conformance.model import CaseSpec, Failed, HarnessError, NonStrict, Unsupported
from conformance.net import DEFAULT_PORTS, NoAnswer, PortPlan
from conformance.peer_env import PeerEnv
from conformance.peers import HarnessReceiver, HarnessResolver, HarnessSource
from conformance.store_peer import HarnessStore, SourceTap
from wire import lbmr


class Harness:
    """One case's run: its IUT, the peers it plays, its evidence and its verdict helpers."""

    def __init__(self, spec: CaseSpec, iut: IutProcess, resolver: HarnessResolver,
                 recorder: Recorder, *, time_scale: float = 1.0, seed: int = 0,
                 ports: PortPlan = DEFAULT_PORTS, transport: str = "tcp") -> None:
        """``ports``: the ports the case's peers prefer (a parallel run's worker passes its
        share, :meth:`PortPlan.share`); ``transport``: what the harness's sources send their
        data on in front of a store IUT (:mod:`conformance.udp_transport`)."""
        self.spec = spec
        self.iut = iut
        self.resolver = resolver
        self.recorder = recorder
        self.time_scale = time_scale
        self.closers: list[Callable[[], None]] = []
        self.env = PeerEnv(recorder, time_scale, store_addr=lambda: self.store_addr,
                           wait_tir=resolver.wait_tir, closers=self.closers, ports=ports,
                           transport=transport if isinstance(iut, StoreUnderTest) else "tcp")
        """What the peers get of the case (they hold no reference to the harness)."""
        self.random = random.Random(f"{seed}:{spec.id}")
        self._topics = itertools.count(1)
        self.restarted = False
        self.deregistered = False
        """The harness asked the IUT to deregister (it may then exit: guide "RPP
        Deregistration", a deregistered source is blocked until it is re-created)."""
        self.stores: list[HarnessStore] = []
        self.group_ports: list[int] = []
        """The store ports of the IUT's group (:meth:`store_group`), for the evidence."""
        self.sources: list[HarnessSource] = []
        self.iut_topic = self.topic() if isinstance(iut, ClientUnderTest) else ""
        """The topic a source or receiver IUT is started for."""
        self.iut_version = iut.profile.version
        self.iut_profile = iut.profile
        """The IUT's profile (its version, and the topics a store at an address offers)."""
        """The profile's UM version (``current`` or ``guide-5.3``)."""

    # --- the IUT ------------------------------------------------------------------------------

    @property
    def store_addr(self) -> Addr:
        """Where the store IUT listens (store cases only)."""
        if not isinstance(self.iut, StoreUnderTest):
            raise HarnessError("the case talks to a store IUT, but the IUT is a "
                               f"{self.iut.profile.role.value}")
        return self.iut.addr

    @property
    def web_monitor(self) -> Addr | None:
        """Where the store IUT's web monitor listens (a profile with ``web_monitor``)."""
        return self.iut.web_monitor if isinstance(self.iut, StoreUnderTest) else None

    @property
    def client_iut(self) -> ClientUnderTest:
        if not isinstance(self.iut, ClientUnderTest):
            raise HarnessError("the case needs a source or receiver IUT")
        return self.iut

    def start_iut(self, *stores: HarnessStore, reg_ids: dict[HarnessStore, int] | None = None,
                  groups: tuple[tuple[int, int], ...] = (),
                  options: UmOptions | None = None,
                  nonblocking: bool = False, explicit_ack: bool = False,
                  consume: bool = False) -> ClientUnderTest:
        """Start the source or receiver IUT for :attr:`iut_topic`.

        ``stores`` become a source's ``ume_store`` lines in this order (with the RegID from
        ``reg_ids``, default 0, and the store's group); ``groups`` its ``ume_store_group``
        lines; ``options`` any further UM options (``{"source ume_flight_size": 4}``);
        ``nonblocking``: the IUT sends without blocking (the profile's ``nonblocking_args``;
        the case is unsupported without them); ``explicit_ack``: the receiver acknowledges
        only what :meth:`ack_iut` says (the profile's ``explicit_ack_args``); ``consume``: its
        application consumes what :meth:`ack_iut` says, in that order (``consume_args``)."""
        iut = self.client_iut
        entries = tuple(StoreEntry(s.addr, (reg_ids or {}).get(s, 0), s.group) for s in stores)
        shown = ", ".join(f"{k}={v}" for k, v in (options or {}).items())
        self.note(f"starting the IUT for topic {self.iut_topic!r}"
                  + (f" with stores {', '.join(s.name for s in stores)}" if stores else "")
                  + (f"; {shown}" if shown else "")
                  + ("; non-blocking sends" if nonblocking else "")
                  + ("; explicit ACKs from the harness" if explicit_ack else "")
                  + ("; consumption from the harness" if consume else ""))
        iut.start(self.iut_topic, stores=entries, groups=groups, options=options,
                  nonblocking=nonblocking, explicit_ack=explicit_ack, consume=consume)
        return iut

    def ack_iut(self, sqn: int) -> None:
        """The receiver IUT's application acknowledges ``sqn`` (started with
        ``explicit_ack``), or consumes it (started with ``consume``)."""
        self.note(f"the application acknowledges (or consumes) sqn {sqn}")
        self.client_iut.ack(sqn)

    def iut_output(self) -> str:
        """What the source or receiver IUT printed since the case started it."""
        return self.client_iut.output()

    def check_delivered(self, expected: list[int], timeout: float = 4.0,
                        retransmitted: set[int] | None = None) -> None:
        """The receiver IUT delivered exactly ``expected``, in that order, each once (waits
        for the count, then a moment for a duplicate that must not come); with
        ``retransmitted``, exactly those carry the retransmission flag."""
        self.wait_until(lambda: len(self.deliveries()) >= len(expected), timeout,
                        f"{len(expected)} deliveries")
        self.wait_until(lambda: len(self.deliveries()) > len(expected), 0.2,
                        "a duplicate (must not come)")
        got = [int(str(d["sqn"])) for d in self.deliveries()]
        self.check(got == expected, "the receiver did not deliver every message once and in "
                   "order", expected=expected, observed=got)
        if retransmitted is not None:
            flagged = {int(str(d["sqn"])) for d in self.deliveries() if d.get("rx")}
            self.check(flagged == retransmitted,
                       "the retransmission flag of the delivered messages is wrong",
                       expected=sorted(retransmitted), observed=sorted(flagged))

    def deregister_iut(self) -> None:
        """Ask the source or receiver IUT to deregister from its stores (the profile's
        ``deregister_signal``; the case is unsupported without one)."""
        sig = self.iut.profile.deregister_signal
        if sig is None:
            raise Unsupported("the profile names no deregister_signal, so the harness cannot "
                              "ask the IUT to deregister")
        self.note(f"asking the IUT to deregister ({sig.name})")
        self.deregistered = True
        self.client_iut.signal(sig)

    def deliveries(self) -> list[dict[str, object]]:
        """What a receiver IUT reported delivering (unsupported when it reports nothing)."""
        iut = self.client_iut
        if not iut.reports_deliveries:
            raise Unsupported("the profile's launch command has no {deliveries} file, so the "
                              "harness cannot see what the receiver delivered")
        return iut.deliveries()

    def wait_tir(self, topic: str | None = None, timeout: float = 3.0) -> lbmr.Tir:
        """The TIR the IUT advertised for ``topic`` (default: :attr:`iut_topic`)."""
        name = topic or self.iut_topic
        tir = self.resolver.wait_tir(name, self.scaled(timeout))
        if tir is None:
            raise NoAnswer(f"the IUT advertised no TIR for {name!r} within "
                           f"{self.scaled(timeout):.2f} s")
        return tir

    # --- time ---------------------------------------------------------------------------------

    def scaled(self, seconds: float) -> float:
        return seconds * self.time_scale

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str,
                   poll: float = 0.01) -> bool:
        """Poll ``predicate`` until true or ``timeout`` (scaled) passed; True if it held."""
        deadline = time.monotonic() + self.scaled(timeout)
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(poll)
        self.note(f"gave up waiting for {what} after {self.scaled(timeout):.2f} s")
        return predicate()

    # --- peers --------------------------------------------------------------------------------

    def topic(self) -> str:
        """A fresh topic name matching the IUT's configured pattern."""
        return f"conform.{self.spec.id.lower()}.{next(self._topics)}.{self.random.randrange(10**6)}"

    def source(self, name: str = "source", topic: str | None = None,
               stores: tuple[HarnessStore, ...] = ()) -> HarnessSource:
        """A scripted source with its own topic, transport port and request port (registered
        with the harness ``stores`` when it plays for a receiver IUT)."""
        source = HarnessSource(self.env, topic or self.topic(),
                               transport_idx=self.random.randrange(1, 1 << 31), name=name,
                               stores=stores)
        self.resolver.serve(source)
        self.sources.append(source)
        return source

    def store(self, name: str | None = None, *, group: int = 0) -> HarnessStore:
        """A scripted store on a port of its own; its index is its place in the case."""
        index = len(self.stores)
        store = HarnessStore(self.env, name or f"store {chr(ord('A') + index)}", index=index,
                             group=group)
        self.stores.append(store)
        return store

    def tap(self, name: str = "receiver", timeout: float = 3.0) -> SourceTap:
        """A scripted receiver on the source IUT's transport (found through its TIR)."""
        return SourceTap(self.env, self.wait_tir(timeout=timeout), name)

    def receiver(self, source: HarnessSource, name: str = "receiver") -> HarnessReceiver:
        return HarnessReceiver(self.env, source, name=name)

    def restart_iut(self, *, kill: bool = False) -> None:
        """Restart the IUT on its own files (SIGKILL with ``kill``); peers must reconnect."""
        self.note(f"{'SIGKILL' if kill else 'stopping'} the IUT and starting it again")
        self.restarted = True
        if not isinstance(self.iut, StoreUnderTest):
            raise HarnessError("only a store IUT is restarted by its case")
        self.iut.restart(kill=kill)
        self.note("the IUT is ready again")

    def store_group(self, size: int) -> list[StoreUnderTest]:
        """The store IUT as ``size`` instances of one Quorum/Consensus group (profile
        ``instances``; unsupported when it allows fewer): the case's IUT, started again with
        the group in its ``<lbm-config>`` file, and ``size - 1`` more launched here with the
        case's options, each in a work directory of its own (``<IUT directory>-<n>``), stopped
        when the case ends.  The case's IUT is retired after the case (its configuration names
        this group)."""
        iut = self.iut
        if not isinstance(iut, StoreUnderTest):
            raise HarnessError("only a store IUT runs as a group")
        if not iut.profile.launches or iut.profile.instances < size:
            raise Unsupported(f"the case needs {size} instances of the store as one "
                              f"Quorum/Consensus group, and the profile allows "
                              f"{iut.profile.instances if iut.profile.launches else 'none'} "
                              f"(its 'instances' key, for a launched store)")
        members = [iut]
        for n in range(1, size):
            workdir = iut.workdir.with_name(f"{iut.workdir.name}-{n}")
            shutil.rmtree(workdir, ignore_errors=True)
            members.append(StoreUnderTest(iut.profile, workdir, iut.resolver, iut.setup,
                                          time_scale=iut.time_scale))
            members[-1].name = f"{iut.name}-{n}"
        group = tuple(m.addr for m in members)
        self.group_ports = [a[1] for a in group]
        for member in members:
            member.group = group
        self.note("starting the store as a group of " + ", ".join(
            f"{m.name} {m.addr[0]}:{m.addr[1]}" for m in members))
        self.restarted = True
        iut.restart()
        for member in members[1:]:
            self.closers.append(member.stop)
            member.start()
        # an instance whose port another process took before it could bind it started on
        # another port (StoreUnderTest.start), so the others' configurations name a port it
        # is not on: every member is started again with the ports they now hold
        for _ in range(PORT_ATTEMPTS):
            if tuple(m.addr for m in members) == group:
                return members
            group = tuple(m.addr for m in members)
            self.group_ports = [a[1] for a in group]
            self.note("an instance had to move to another port: the group is started again "
                      "as " + ", ".join(f"{m.name} {m.addr[0]}:{m.addr[1]}" for m in members))
            for member in members:
                member.group = group
                member.restart()
        raise HarnessError("an instance of the group had to move to another port")

    # --- verdicts -----------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.recorder.note(text)

    def check(self, condition: bool, message: str, *, expected: Any = None,
              observed: Any = None) -> None:
        """Fail the case with ``message`` unless ``condition``."""
        if condition:
            self.note(f"ok: {message if expected is None else expected}")
            return
        raise Failed(message, expected=expected, observed=observed)

    def check_equal(self, observed: Any, expected: Any, what: str) -> None:
        self.check(observed == expected, f"{what} is {observed!r}, expected {expected!r}",
                   expected=expected, observed=observed)

    def prefer(self, condition: bool, message: str, *, expected: Any = None,
               observed: Any = None) -> None:
        """The guide prefers ``condition`` but allows otherwise: ``non-strict`` if it fails."""
        if not condition:
            raise NonStrict(message, expected=expected, observed=observed)

    def peer_errors(self) -> list[str]:
        """What went wrong inside the harness's own peers (reported as a harness error)."""
        links = [link for store in self.stores for link in store.links()]
        links += [link for source in self.sources for link in source.request.links]
        return [e for link in links for e in link.errors if e.startswith("harness peer failed")]

    def close(self) -> None:
        for closer in reversed(self.closers):
            try:
                closer()
            except OSError:
                continue
        self.closers.clear()
