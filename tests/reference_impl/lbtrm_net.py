"""An LBT-RM multicast group in the simulator, for the LBT-RM session tests and scenarios.

One source session bound at its unicast port on node ``src`` and receiver ports
(:class:`~reference_impl.lbtrm_session.LbtrmReceiverPort`) on nodes ``r0``, ``r1`` ... joined to
the group, on a :class:`~reference_impl.sim.SimNetwork` whose links may lose, duplicate and
reorder.  :class:`Filtered` puts a drop rule on what a session sends (losing the first copy of
chosen DATA, say), which link impairments cannot aim.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from reference_impl.fastmsg import data_message
from reference_impl.lbtrm_session import (
    DESTINATION_PORT,
    Delivered,
    Event,
    LbtrmReceiverPort,
    LbtrmReceiverSettings,
    LbtrmSourceSession,
    LbtrmSourceSettings,
    Lost,
    SessionKey,
)
from reference_impl.sim import Addr, LinkConfig, SimNetwork
from wire import lbtrm

GROUP: Addr = ("224.10.10.10", DESTINATION_PORT)
SOURCE_IP = "10.0.0.1"
UCAST_PORT = 14390
SESSION_ID = 0x5EED

Drop = Callable[[bytes, Addr], bool]
"""(datagram, destination) -> drop it?"""


def payload(i: int) -> bytes:
    """An LBMC data message (topic index 1, sqn ``i``), as a source core would send."""
    return data_message(tidx=1, sqn=i, payload=i.to_bytes(4, "big") * 4)


def parse(data: bytes) -> lbtrm.LbtrmPacket:
    return lbtrm.parse_packet(data, decode_lbmc=False)


def first_copies_of(sqns: set[int]) -> Drop:
    """Lose the original (not RX) DATA of ``sqns``: the loss every receiver shares."""
    def drop(data: bytes, dst: Addr) -> bool:
        packet = parse(data)
        return isinstance(packet, lbtrm.LbtrmData) and not packet.rx and packet.sqn in sqns
    return drop


class Filtered:
    """A session (or port) whose outgoing datagrams pass ``drop`` first; the rest is the
    session's own interface."""

    def __init__(self, inner: LbtrmSourceSession | LbtrmReceiverPort,
                 drop: Drop = lambda data, dst: False) -> None:
        self.inner = inner
        self.drop = drop
        self.dropped: list[bytes] = []

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        self.inner.receive(data, addr, now)

    def datagrams_to_send(self, now: float) -> list[tuple[bytes, Addr]]:
        out = []
        for data, dst in self.inner.datagrams_to_send(now):
            if self.drop(data, dst):
                self.dropped.append(data)
            else:
                out.append((data, dst))
        return out

    def get_timer(self) -> float | None:
        return self.inner.get_timer()

    def handle_timer(self, now: float) -> None:
        self.inner.handle_timer(now)


@dataclass
class Group:
    """The network, the source (behind its filter) and the receivers' ports and filters."""

    net: SimNetwork
    source: LbtrmSourceSession
    src_filter: Filtered
    ports: list[LbtrmReceiverPort]
    filters: list[Filtered]
    events: list[list[tuple[SessionKey, Event]]] = field(default_factory=list)

    def send(self, n: int, gap: float = 0.001, start: int = 0) -> list[int]:
        """Send ``n`` messages ``gap`` apart (virtual time runs); their sequence numbers."""
        sqns = []
        for i in range(start, start + n):
            sqns.append(self.source.send(payload(i), self.net.now))
            self.net.run_until(self.net.now + gap)
        return sqns

    def run(self, seconds: float) -> None:
        self.net.run_until(self.net.now + seconds)

    def drain(self) -> None:
        while len(self.events) < len(self.ports):
            self.events.append([])
        for port, seen in zip(self.ports, self.events, strict=True):
            while (item := port.next_event()) is not None:
                seen.append(item)

    def of(self, i: int, kind: type) -> list:
        self.drain()
        return [e for _, e in self.events[i] if isinstance(e, kind)]

    def delivered(self, i: int = 0) -> list[int]:
        return [e.sqn for e in self.of(i, Delivered)]

    def lost(self, i: int = 0) -> list[int]:
        return [s for e in self.of(i, Lost) for s in range(e.first, e.last + 1)]

    def sent_by(self, ip: str, kind: type) -> list[tuple[float, Addr, Addr, lbtrm.LbtrmPacket]]:
        """Datagrams from ``ip`` of packet class ``kind`` as delivered (one entry per copy
        delivered to a node; multicast counts once per member)."""
        out = []
        for p in self.net.trace:
            if p.src[0] == ip:
                packet = parse(p.data)
                if isinstance(packet, kind):
                    out.append((p.time, p.src, p.dst, packet))
        return out


def make_group(receivers: int = 1, *, seed: int = 1, link: LinkConfig | None = None,
               source_settings: LbtrmSourceSettings | None = None,
               receiver_settings: LbtrmReceiverSettings | None = None,
               warm_up: float = 0.5) -> Group:
    """A source and ``receivers`` receivers on ``GROUP``; runs ``warm_up`` seconds, so each
    receiver has heard the first session message and starts at sequence number 0."""
    net = SimNetwork(seed=seed, link=link or LinkConfig(delay=0.001))
    net.add_node("src", SOURCE_IP)
    source = LbtrmSourceSession(GROUP, UCAST_PORT,
                                source_settings or LbtrmSourceSettings(session_id=SESSION_ID))
    src_filter = Filtered(source)
    net.bind("src", UCAST_PORT, src_filter)
    ports, filters = [], []
    for i in range(receivers):
        ip = f"10.0.0.{10 + i}"
        net.add_node(f"r{i}", ip)
        port = LbtrmReceiverPort(receiver_settings, seed=seed * 100 + i, accept_new=True)
        flt = Filtered(port)
        net.bind(f"r{i}", DESTINATION_PORT, flt)
        net.join((ip, DESTINATION_PORT), GROUP)
        ports.append(port)
        filters.append(flt)
    group = Group(net, source, src_filter, ports, filters)
    group.run(warm_up)
    return group
