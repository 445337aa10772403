"""Choices of the analyses that a capture cannot make: :class:`AnalysisOptions`."""

from __future__ import annotations

from dataclasses import dataclass

STABILITY_RULES = ("quorum", "all", "any")
PERCENTILES = (0.5, 0.9, 0.99)


@dataclass(frozen=True)
class AnalysisOptions:
    """Choices the capture cannot make for us.

    Attributes:
        stability_rule: when a message stops being in flight: ``quorum`` (stability ACKs from a
            majority of the stores the source registered with, UM's default), ``all`` (every
            such store) or ``any`` (the first ACK).
        flight_bins: time bins of the flight-size series over the whole capture.
        histogram_base: latency histogram buckets grow by this factor (log scale).
    """

    stability_rule: str = "quorum"
    flight_bins: int = 200
    histogram_base: float = 2.0

    def __post_init__(self) -> None:
        if self.stability_rule not in STABILITY_RULES:
            raise ValueError(f"stability_rule must be one of {', '.join(STABILITY_RULES)}, "
                             f"not {self.stability_rule!r}")
        if self.flight_bins < 1:
            raise ValueError("flight_bins must be >= 1")
        if self.histogram_base <= 1:
            raise ValueError("histogram_base must be > 1")
