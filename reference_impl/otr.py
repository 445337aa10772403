"""Off-transport recovery (OTR): when and for what a receiver asks again for messages its
transport gave up on.  A sans-IO core (no I/O, no clock: every call takes ``now``), one per
source a receiver joins; :class:`~reference_impl.receiver.ReceiverCore` feeds it the gaps and
arrivals and sends the requests it returns.

What the product documents (guide "Receiver Recovery"; docs/semantics.md §1.9): transport
NAK recovery is unchanged under persistence and stores take no part in it; when the transport
gives up on a gap, a receiver with ``use_otr`` asks, without restarting, the *store* (a
persistent source) for the missing topic sequence numbers; deliveries recovered that way carry
the OTR flag (``LBM_MSG_FLAG_OTR``).  ``use_otr`` 1 = always, 2 = persistent receivers only
(the default since UM 6.8; 0 before), and the requests are paced by
``otr_request_initial_delay`` (2000 ms), ``otr_request_minimum_interval`` (1000 ms) and
``otr_request_maximum_interval`` (10000 ms).

*Choices* where the fact sheets are silent (docs/semantics.md §1.9, "OTR in the reference"):

* Pacing: a gap is first asked for ``initial_delay`` after it was seen (the transport may
  still deliver it meanwhile: nothing that arrives is asked for).  What is still missing is
  asked again after ``minimum_interval``, then after twice that, doubling up to
  ``maximum_interval``.  Every request of a gap names only the numbers still missing.
* Giving up: ``retransmit_request_message_timeout`` after a gap's first request (the
  receiver's per-message recovery timeout; the fact sheets name no OTR timeout) whatever is
  still missing is lost (:class:`OtrLost`, reported as an
  :class:`~reference_impl.events.UnrecoverableLoss`).
* The wire: an OTR request is the receiver's ordinary retransmission request (``UME RXREQ``,
  docs/wire-lbmc.md) to a store it is registered with, sent over its connection to that
  store's request port; each attempt goes to the next store (as an unanswered RXREQ is
  retried on another store).  tshark knows no OTR header, and the retransmission that answers
  is the store's ordinary RETRANS data message: the OTR flag lives in the delivery
  (:attr:`~reference_impl.events.MessageDelivered.otr`), not on the wire.
* ``otr_message_caching_threshold``: the most messages a receiver holds (received, not yet
  deliverable in order) while OTR gaps are open; past it every open gap is given up (reported
  lost) so that delivery goes on and memory stays bounded, rather than holding the stream for
  up to ``retransmit_request_message_timeout``.
* Scope: OTR serves gaps the transport opened after the receiver's registration completed.
  What a late receiver missed before its first live message is registration recovery, as
  before.  A streaming source (no stores) is asked only with ``use_otr`` 1: the same RXREQs
  (``id_2`` 0, transport index 0: a streaming TIR gives none) to the request port its TIR's
  EXFUNC option names; a reference source with ``late_join`` 1 answers from its retention
  buffer.  Otherwise its transport's gaps are reported lost at once and delivery goes on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

OTR_OFF, OTR_ALWAYS, OTR_PERSISTENT = 0, 1, 2
"""The ``use_otr`` values."""


def otr_applies(use_otr: int, persistent: bool) -> bool:
    """Whether a receiver with ``use_otr`` recovers a source's transport gaps by OTR
    (``persistent``: the source is persistent and the receiver registered with its stores)."""
    return use_otr == OTR_ALWAYS or (use_otr == OTR_PERSISTENT and persistent)


@dataclass(frozen=True)
class OtrSettings:
    """The pacing of :class:`OtrCore`, in seconds (the options are in ms)."""

    initial_delay: float = 2.0
    minimum_interval: float = 1.0
    maximum_interval: float = 10.0
    message_timeout: float = 10.0

    def __post_init__(self) -> None:
        if self.initial_delay < 0 or self.minimum_interval <= 0 or self.message_timeout <= 0:
            raise ValueError(f"OTR delays must be positive: {self}")
        if self.minimum_interval > self.maximum_interval:
            raise ValueError("otr_request_minimum_interval exceeds "
                             "otr_request_maximum_interval")

    @classmethod
    def from_ms(cls, initial_delay: int, minimum_interval: int, maximum_interval: int,
                message_timeout: int) -> OtrSettings:
        return cls(initial_delay / 1000, minimum_interval / 1000, maximum_interval / 1000,
                   message_timeout / 1000)


@dataclass(frozen=True)
class OtrRequest:
    """Ask for ``sequence_numbers`` now (``attempt`` 1 is a gap's first request)."""

    sequence_numbers: tuple[int, ...]
    attempt: int


@dataclass(frozen=True)
class OtrLost:
    """``sequence_numbers`` were asked for until the timeout and never came."""

    sequence_numbers: tuple[int, ...]


Action = OtrRequest | OtrLost


@dataclass(eq=False)
class _Gap:
    missing: set[int]
    due: float
    interval: float = 0.0  # the wait after the latest request (0: none sent yet)
    first_request: float | None = None
    attempt: int = 0


@dataclass
class OtrCore:
    """The OTR gaps of one source (see the module docstring): :meth:`gap` when the transport
    skipped numbers, :meth:`received` for every message that arrives, :meth:`due` at
    :meth:`deadline`."""

    settings: OtrSettings = field(default_factory=OtrSettings)
    _gaps: list[_Gap] = field(default_factory=list)
    _where: dict[int, _Gap] = field(default_factory=dict)

    def __contains__(self, sqn: int) -> bool:
        return sqn in self._where

    def __len__(self) -> int:
        """How many sequence numbers are waited for."""
        return len(self._where)

    def gap(self, first: int, end: int, now: float) -> None:
        """Numbers ``[first, end)`` were skipped by the transport (seen at ``now``)."""
        missing = {s for s in range(first, end) if s not in self._where}
        if not missing:
            return
        gap = _Gap(missing, now + self.settings.initial_delay)
        self._gaps.append(gap)
        for sqn in missing:
            self._where[sqn] = gap

    def received(self, sqn: int) -> bool:
        """``sqn`` arrived (by any path); True when OTR was waiting for it."""
        gap = self._where.pop(sqn, None)
        if gap is None:
            return False
        gap.missing.discard(sqn)
        if not gap.missing:
            self._gaps.remove(gap)
        return True

    def give_up_all(self) -> tuple[int, ...]:
        """Stop waiting for anything; returns what was waited for, ascending."""
        numbers = tuple(sorted(self._where))
        self._where.clear()
        self._gaps.clear()
        return numbers

    def forget_below(self, sqn: int) -> None:
        """Stop waiting for anything below ``sqn`` (the delivery point moved past it)."""
        for stale in [s for s in self._where if s < sqn]:
            self.received(stale)

    def deadline(self) -> float | None:
        """When :meth:`due` has something to do (None: nothing is waited for)."""
        return min((g.due for g in self._gaps), default=None)

    def due(self, now: float) -> list[Action]:
        """The requests (and losses) due at ``now``, and the next wait of each gap."""
        out: list[Action] = []
        cfg = self.settings
        for gap in [g for g in self._gaps if g.due <= now + 1e-9]:
            numbers = tuple(sorted(gap.missing))
            if gap.first_request is not None and \
                    now + 1e-9 >= gap.first_request + cfg.message_timeout:
                for sqn in numbers:
                    del self._where[sqn]
                self._gaps.remove(gap)
                out.append(OtrLost(numbers))
                continue
            if gap.first_request is None:
                gap.first_request = now
                gap.interval = cfg.minimum_interval
            else:
                gap.interval = min(gap.interval * 2, cfg.maximum_interval)
            gap.attempt += 1
            out.append(OtrRequest(numbers, gap.attempt))
            gap.due = min(now + gap.interval, gap.first_request + cfg.message_timeout)
        return out
