"""An application that acknowledges explicitly: ``ump receiver --explicit-ack MS`` and
``ump receiver --ack-file PATH``; and one that consumes out of order: ``ump receiver
--consume-file PATH``.

With ``ume_explicit_ack_only`` 1 the receiver acknowledges nothing by itself; the application
does, through :meth:`ReceiverCore.ack` (guide "Explicit Acknowledgments": one explicit ACK
covers every earlier message, so they are sent in ascending order).  :class:`ExplicitAcker`
plays such an application, in one of two ways:

* on a schedule (``--explicit-ack MS``): every ``MS`` milliseconds it acknowledges, per source,
  the newest message delivered so far (what a batch-processing application that acknowledges
  after each batch does);
* from a file (``--ack-file PATH``): it acknowledges the sequence numbers written to ``PATH``,
  one a line (``SQN``, or ``SOURCE SQN`` with the source string of a delivery such as
  ``TCP:127.0.0.1:14371``; without one, the first source of the topic), as they are appended.
  Another process (the conformance harness, its ``{acks}`` placeholder) decides that way
  exactly when and what the application acknowledges.

With ``consume`` (``--consume-file PATH``) the receiver acknowledges as configured (batched
every ``ume_ack_batching_interval``, or at once) and the application *consumes* what the file
lists, in that order, which need not be delivery order: the receiver retains every delivery
(:meth:`ReceiverCore.retain_messages`) until the file says it was consumed
(:meth:`ReceiverCore.consume`; guide "Batching Acknowledgments": only the contiguous run
consumed is acknowledged).

*Choices* (the guide has no such application): the file is read every :data:`TICK` seconds,
from the start (it need not exist yet); a line names a message that may not be delivered yet:
it then waits, and the lines after it wait behind it, until it is (a message cannot be
consumed before it arrived, and the order of the lines is the order of the acknowledgements);
an ``ack`` at or below what was acknowledged already sends nothing (the core's rule); a line
that is not a sequence number is reported on stderr once (one line) and skipped.
:func:`parse_line` reads a line.
"""

from __future__ import annotations

import asyncio
import functools
import sys
from collections import deque
from pathlib import Path
from typing import TextIO

from reference_impl.aio import AioHost, HostError
from reference_impl.events import MessageDelivered
from reference_impl.receiver import ReceiverCore

TICK = 0.01
"""Seconds between two looks at the file (and the shortest ``--explicit-ack`` period)."""

MAX_SQN = 0xFFFFFFFF


def parse_line(line: str) -> tuple[str | None, int]:
    """``(source or None, sequence number)`` of an ack-file line; a one-line ValueError when
    it is neither ``SQN`` nor ``SOURCE SQN`` with SQN 0-4294967295."""
    words = line.split()
    if len(words) not in (1, 2):
        raise ValueError(f"expected SQN or SOURCE SQN, not {line.strip()[:80]!r}")
    text = words[-1]
    if not text.isdigit() or int(text) > MAX_SQN:
        raise ValueError(f"{text[:40]!r} is not a sequence number (0-{MAX_SQN})")
    return (words[0] if len(words) == 2 else None), int(text)


class ExplicitAcker:
    """Acknowledge a receiver's deliveries explicitly (module docstring): every ``every_ms``
    the newest delivered per source, or what ``ack_file`` lists.

    Attributes:
        delivered: the newest sequence number delivered, per source string.
        pending: ack-file entries not acknowledged yet (their message not delivered yet).
        acked: how many acknowledgements were handed to the receiver.
    """

    def __init__(self, host: AioHost, receiver: ReceiverCore, *, every_ms: int = 0,
                 ack_file: str | None = None, consume: bool = False,
                 err: TextIO | None = None) -> None:
        if (every_ms > 0) == (ack_file is not None):
            raise ValueError("give exactly one of a period (ms) and an ack file")
        self.host = host
        self.receiver = receiver
        self.every = every_ms / 1000
        self.path = Path(ack_file) if ack_file is not None else None
        self.err = err
        self.consume = consume
        if consume and ack_file is None:
            raise ValueError("consuming out of order needs the file that says the order")
        self.delivered: dict[str, int] = {}
        self.pending: deque[tuple[str | None, int]] = deque()
        self.acked = 0
        self._offset = 0
        self._partial = b""
        self._lines = 0

    def offer(self, event: MessageDelivered) -> None:
        """A delivery reached the application (called from the event handler)."""
        self.delivered[event.source] = event.sequence_number

    def start(self) -> asyncio.Task[None]:
        return self.host.spawn(self.run(), name="explicit acker")

    async def run(self) -> None:
        """Acknowledge until the host closes (cancelled with it)."""
        while True:
            await asyncio.sleep(self.every if self.path is None else TICK)
            if self.path is None:
                wanted = list(self.delivered.items())
            else:
                self.pending.extend(self._read())
                wanted = []
            try:
                self.host.call(self.receiver, functools.partial(self._ack, wanted))
            except HostError:  # the host closed under us (--count reached)
                return

    def _read(self) -> list[tuple[str | None, int]]:
        """The complete lines appended to the file since the last look."""
        assert self.path is not None
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        except OSError as exc:
            print(f"ump receiver: --ack-file {self.path}: {exc.strerror or exc}",
                  file=self.err or sys.stderr, flush=True)
            return []
        self._offset += len(chunk)
        data = self._partial + chunk
        *lines, self._partial = data.split(b"\n")
        out: list[tuple[str | None, int]] = []
        for raw in lines:
            self._lines += 1
            line = raw.decode("utf-8", "replace")
            if not line.strip():
                continue
            try:
                out.append(parse_line(line))
            except ValueError as exc:
                print(f"ump receiver: --ack-file {self.path} line {self._lines}: {exc}; "
                      f"skipped", file=self.err or sys.stderr, flush=True)
        return out

    def _ack(self, wanted: list[tuple[str, int]], now: float) -> None:
        """Inside the core's turn: the schedule's ACKs, or the file's in order while their
        messages were delivered."""
        for name, newest in wanted:
            self._one(name, newest)
        while self.pending:
            source, sqn = self.pending[0]
            if not self._one(source, sqn):
                break  # not delivered yet: it and what follows wait
            self.pending.popleft()

    def _one(self, source: str | None, sqn: int) -> bool:
        try:
            (self.receiver.consume if self.consume else self.receiver.ack)(sqn, source)
        except ValueError:
            return False
        self.acked += 1
        return True
