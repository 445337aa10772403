"""What a conformance case may use of the harness: the :class:`CaseContext` protocol.

A case (see :mod:`conformance.model`) is a function of one argument, the case context.  The
protocol states exactly what the suites call on it, so the case model and the suites depend on
this description rather than on :class:`conformance.harness.Harness`, which implements it; the
import graph of the conformance package stays a tree (``tests/conformance/test_layering.py``
keeps it so).  Adding a method a case needs means adding it here and in the harness.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any, Protocol

from conformance.evidence import Addr, Recorder
from conformance.iut import ClientUnderTest, StoreUnderTest, UmOptions
from conformance.peers import HarnessReceiver, HarnessResolver, HarnessSource
from conformance.profile import IutProfile
from conformance.store_peer import HarnessStore, SourceTap
from wire import lbmr


class CaseContext(Protocol):
    """The harness as a case sees it (:class:`conformance.harness.Harness` implements it).

    Attributes:
        iut_topic: the topic a source or receiver IUT is started for.
        iut_version: the profile's UM version (``current`` or ``guide-5.3``), for cases whose
            expectation differs between the guide and the current product.
        iut_profile: the whole IUT profile (the RPP compatibility matrix reads its version
            and, for a store reached at an address, its ``rpp_topic``/``spp_topic``).
        random: the case's random numbers, seeded from the run's seed and the case ID.
        recorder: the case's evidence (notes, traffic).
        resolver: the harness's resolver daemon (TQR answers, TIRs the IUT advertised).
        closers: what to close when the case ends, last opened first.
    """

    iut_topic: str
    iut_version: str
    iut_profile: IutProfile
    random: random.Random
    recorder: Recorder
    resolver: HarnessResolver
    closers: list[Callable[[], None]]

    # --- the IUT ------------------------------------------------------------------------------

    @property
    def store_addr(self) -> Addr:
        """Where the store IUT listens (store cases only)."""
        ...

    @property
    def web_monitor(self) -> Addr | None:
        """Where the store IUT's web monitor listens (profile ``web_monitor``), else None."""
        ...

    @property
    def client_iut(self) -> ClientUnderTest:
        """The source or receiver IUT (source and receiver cases only)."""
        ...

    def start_iut(self, *stores: HarnessStore, reg_ids: dict[HarnessStore, int] | None = None,
                  groups: tuple[tuple[int, int], ...] = (),
                  options: UmOptions | None = None,
                  nonblocking: bool = False, explicit_ack: bool = False,
                  consume: bool = False) -> ClientUnderTest:
        """Start the source or receiver IUT for :attr:`iut_topic` with these stores (with
        ``nonblocking``: sending without blocking, the profile's ``nonblocking_args``;
        with ``explicit_ack``: a receiver acknowledging only what :meth:`ack_iut` says, the
        profile's ``explicit_ack_args``; with ``consume``: its application consuming only
        what :meth:`ack_iut` says, ``consume_args``; unsupported without them)."""
        ...

    def ack_iut(self, sqn: int) -> None:
        """The receiver IUT's application acknowledges ``sqn`` (explicit ACKs), or consumes
        it (``consume``)."""
        ...

    def iut_output(self) -> str:
        """What the source or receiver IUT printed since the case started it (a black box's
        only report of what its application saw, such as a send returning "would block")."""
        ...

    def restart_iut(self, *, kill: bool = False) -> None:
        """Restart the store IUT on its own files (SIGKILL with ``kill``)."""
        ...

    def deregister_iut(self) -> None:
        """Ask the source or receiver IUT to deregister from its stores."""
        ...

    def deliveries(self) -> list[dict[str, object]]:
        """What a receiver IUT reported delivering."""
        ...

    def check_delivered(self, expected: list[int], timeout: float = 4.0,
                        retransmitted: set[int] | None = None) -> None:
        """The receiver IUT delivered exactly ``expected``, in order, each once."""
        ...

    def wait_tir(self, topic: str | None = None, timeout: float = 3.0) -> lbmr.Tir:
        """The TIR the IUT advertised for ``topic`` (default: :attr:`iut_topic`)."""
        ...

    def store_group(self, size: int) -> list[StoreUnderTest]:
        """The store IUT as ``size`` instances of one Quorum/Consensus group (profile
        ``instances``; unsupported with fewer), the case's IUT first."""
        ...

    # --- time ---------------------------------------------------------------------------------

    def scaled(self, seconds: float) -> float:
        """``seconds`` at the run's ``--time-scale``."""
        ...

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str,
                   poll: float = 0.01) -> bool:
        """Poll ``predicate`` until true or ``timeout`` (scaled) passed; True if it held."""
        ...

    # --- peers --------------------------------------------------------------------------------

    def topic(self) -> str:
        """A fresh topic name matching the launched IUT's topic pattern (``conform.<case>...``)."""
        ...

    def source(self, name: str = "source", topic: str | None = None,
               stores: tuple[HarnessStore, ...] = ()) -> HarnessSource:
        """A scripted source with its own topic, transport port and request port."""
        ...

    def store(self, name: str | None = None, *, group: int = 0) -> HarnessStore:
        """A scripted store on a port of its own."""
        ...

    def tap(self, name: str = "receiver", timeout: float = 3.0) -> SourceTap:
        """A scripted receiver on the source IUT's transport."""
        ...

    def receiver(self, source: HarnessSource, name: str = "receiver") -> HarnessReceiver:
        """A scripted receiver of a harness source's topic."""
        ...

    # --- verdicts -----------------------------------------------------------------------------

    def note(self, text: str) -> None:
        """A line of the case's evidence."""
        ...

    def check(self, condition: bool, message: str, *, expected: Any = None,
              observed: Any = None) -> None:
        """Fail the case with ``message`` unless ``condition``."""
        ...

    def check_equal(self, observed: Any, expected: Any, what: str) -> None:
        """Fail the case unless ``observed == expected``."""
        ...

    def prefer(self, condition: bool, message: str, *, expected: Any = None,
               observed: Any = None) -> None:
        """``non-strict`` unless ``condition`` (the guide prefers it but allows otherwise)."""
        ...
