"""The reference resolver daemon: unicast topic resolution without multicast.

The product's ``lbmrd`` lets contexts that cannot use multicast resolve topics: each context
sends its LBMR datagrams (advertisements, queries) to the daemon, which forwards them to every
other context it has heard from recently.  This core does exactly that relay, so every
reference component on loopback resolves topics through real LBMR datagrams that tshark can
dissect.  A client is forgotten after ``client_timeout`` seconds of silence (contexts query or
advertise at least once a second, so the default of 10 s survives a few lost datagrams).

Datagrams that are not LBMR are dropped with a log line and never relayed.
"""

from __future__ import annotations

from reference_impl.context import ContextCore
from reference_impl.events import Addr
from wire import lbmr
from wire.errors import WireError

DEFAULT_PORT = 15380


class ResolverCore(ContextCore):
    """Relays LBMR datagrams between the contexts that talk to it."""

    component = "resolver"

    def __init__(self, ip: str, port: int = DEFAULT_PORT, *, client_timeout: float = 10.0,
                 now: float = 0.0) -> None:
        super().__init__("lbmrd", ip, lbmr_port=port)
        self.client_timeout = client_timeout
        self.clients: dict[Addr, float] = {}
        self.now = now
        self.stats.update(relayed=0, received=0)

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        self.now = now
        try:
            lbmr.parse_packet(data)
        except WireError as exc:
            self.drop(addr, f"not LBMR: {exc}", len(data))
            return
        self.stats["received"] += 1
        self.clients[addr] = now
        for client, seen in list(self.clients.items()):
            if now - seen > self.client_timeout:
                del self.clients[client]
            elif client != addr:
                self.send_datagram(data, client)
                self.stats["relayed"] += 1
