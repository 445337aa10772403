"""A slow application: ``ump receiver --consume-rate R`` consumes at most R messages a second.

Receiver-paced persistence (guide "RPP Normal Operations", docs/semantics.md §1.13) is paced by
what the *application* consumed, not by what the receiver received: a blocking RPP receiver's
store releases a message, and so makes room for the source, only once the receiver acknowledged
consuming it.  :class:`PacedConsumer` plays such an application: deliveries queue up as they
arrive, a timer task takes them out at the given rate, hands each to the application's
``consume`` callback (``ump receiver`` writes its delivery log there) and then acknowledges
them through :meth:`ReceiverCore.ack` - the ``ume_explicit_ack_only 1`` way, so nothing is
acknowledged before it was consumed.  :func:`explicit_ack_only` makes the configuration say so.

*Choice* (the guide gives no application): the budget refills continuously at R per second and
holds at most :data:`BURST_SECONDS` worth, so a consumer that fell idle does not then swallow
a burst; one acknowledgement per source per tick (an explicit ACK covers everything before it,
docs/semantics.md §1.5), each after the messages it covers were consumed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections import deque
from collections.abc import Callable

from reference_impl.aio import AioHost, HostError
from reference_impl.config import ClientConfig
from reference_impl.events import MessageDelivered
from reference_impl.receiver import ReceiverCore

TICK = 0.01
"""Seconds between two turns of the consumer (its acknowledgements go out per turn)."""

BURST_SECONDS = 0.05
"""The most an idle consumer may consume at once, in seconds of its rate (at least one)."""


def explicit_ack_only(client: ClientConfig) -> ClientConfig:
    """``client`` with ``receiver ume_explicit_ack_only 1``: the receiver acknowledges only what
    the application acknowledges, never on delivery or on its batching timer."""
    return dataclasses.replace(
        client, receiver=dataclasses.replace(client.receiver, ume_explicit_ack_only=True))


class PacedConsumer:
    """Consume a receiver's deliveries at most ``rate`` a second, acknowledging each after
    ``consume`` returned for it (module docstring).

    Attributes:
        consumed: how many deliveries were consumed so far.
        backlog: deliveries received and not consumed yet, oldest first.
    """

    def __init__(self, host: AioHost, receiver: ReceiverCore, rate: float,
                 consume: Callable[[MessageDelivered], None]) -> None:
        if rate <= 0:
            raise ValueError(f"a consume rate is positive, not {rate}")
        self.host = host
        self.receiver = receiver
        self.rate = rate
        self.consume = consume
        self.consumed = 0
        self.backlog: deque[MessageDelivered] = deque()

    def offer(self, event: MessageDelivered) -> None:
        """A delivery arrived (called from the receiver's event handler): queue it."""
        self.backlog.append(event)

    def start(self) -> asyncio.Task[None]:
        """Run :meth:`run` as a task the host owns."""
        return self.host.spawn(self.run(), name="paced consumer")

    async def run(self) -> None:
        """Consume until the host closes (cancelled with it)."""
        cap = max(1.0, self.rate * BURST_SECONDS)
        budget, last = 0.0, time.monotonic()
        while True:
            await asyncio.sleep(TICK)
            now = time.monotonic()
            budget = min(cap, budget + (now - last) * self.rate)
            last = now
            if not self.backlog:
                budget = min(budget, 1.0)  # idle: no saving up beyond the next message
                continue
            highest: dict[str, int] = {}
            while budget >= 1.0 and self.backlog:
                event = self.backlog.popleft()
                self.consume(event)
                self.consumed += 1
                budget -= 1.0
                highest[event.source] = max(highest.get(event.source, -1),
                                            event.sequence_number)
            if highest:
                try:
                    self.host.call(self.receiver, functools.partial(self._ack, highest))
                except HostError:  # ``consume`` closed the host (``--count`` reached)
                    return

    def _ack(self, highest: dict[str, int], now: float) -> None:
        for source, sqn in highest.items():
            try:
                self.receiver.ack(sqn, source)
            except ValueError:  # that source left meanwhile: nothing to acknowledge to
                continue
