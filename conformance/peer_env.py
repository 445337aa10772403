"""What the harness's scripted peers need from the run around them, passed in as values.

The peers (:mod:`conformance.peers`, :mod:`conformance.store_peer`) used to hold a
back-reference to the whole :class:`~conformance.harness.Harness`, which made the harness and its
peers import each other.  They now get a :class:`PeerEnv` instead: the case's recorder, its time
scale, the list the case's closers go on, and two look-ups the harness answers (where the store
IUT listens, and the TIR the resolver saw for a topic).  This module sits below both the peers
and the harness, so the import graph of the conformance package stays a tree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from conformance.evidence import Addr, Recorder
from conformance.net import DEFAULT_PORTS, PortPlan
from wire import lbmr


@dataclass
class PeerEnv:
    """The values a scripted peer uses from its case.

    Attributes:
        recorder: where the peer's traffic and notes go (the case's evidence).
        time_scale: the run's ``--time-scale``; every peer timeout is multiplied by it.
        store_addr: where the store IUT listens; a call, because only store cases have one
            and asking in any other case is the case's error (raised then, not before).
        wait_tir: the TIR the harness resolver saw for a topic within a (scaled) timeout, or
            ``None``; the harness stores use it to join a source IUT's transport.
        closers: what to close when the case ends, last opened first (shared with the case).
        ports: the ports the peers prefer (the run's, or its worker's share in a parallel run).
        transport: the transport a harness source sends its data on in front of a store IUT
            (``tcp``, ``lbt-ru`` or ``lbt-rm``: :mod:`conformance.udp_transport`).
    """

    recorder: Recorder
    time_scale: float
    store_addr: Callable[[], Addr]
    wait_tir: Callable[[str, float], lbmr.Tir | None]
    closers: list[Callable[[], None]] = field(default_factory=list)
    ports: PortPlan = DEFAULT_PORTS
    transport: str = "tcp"

    def scaled(self, seconds: float) -> float:
        """``seconds`` at the run's time scale."""
        return seconds * self.time_scale

    def note(self, text: str) -> None:
        """A line of the case's evidence."""
        self.recorder.note(text)

    def on_close(self, closer: Callable[[], None]) -> None:
        """Close ``closer`` when the case ends."""
        self.closers.append(closer)
