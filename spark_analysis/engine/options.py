"""Choices of the analyses that a capture cannot make: :class:`AnalysisOptions`."""

from __future__ import annotations

from dataclasses import dataclass

STABILITY_RULES = ("quorum", "all", "any")
PERCENTILES = (0.5, 0.9, 0.99)
BYTES_PER_FRAME = 450
"""What the analyses of a capture analysed whole hold at their peak, per UM frame: 10,000,000
frames of a persistent capture took 4,020 MiB for the whole process tree
(``python -m benchmarks.analyze``), 421 bytes a frame.  With :data:`MEMORY_SHARE`, how big
a part is when :attr:`AnalysisOptions.frames_per_part` is left to the machine."""

MEMORY_SHARE = 0.5
"""The share of the memory available when a capture's analyses start that they plan to use:
the rest is for the other captures analysed at once, Spark and the system."""


@dataclass(frozen=True)
class AnalysisOptions:
    """Choices the capture cannot make for us.

    Attributes:
        stability_rule: when a message stops being in flight: ``quorum`` (stability ACKs from a
            majority of the stores the source registered with, UM's default), ``all`` (every
            such store) or ``any`` (the first ACK).
        flight_bins: time bins of the flight-size series over the whole capture.
        histogram_base: latency histogram buckets grow by this factor (log scale).
        frames_per_part: a capture of more UM frames is analysed in parts of about this
            many, one after the other (:func:`spark_analysis.engine.run.analyze_in_parts`):
            the same results in less memory, a little slower; 0 analyses every capture
            whole; None leaves it to the machine: a capture is analysed whole when
            :data:`BYTES_PER_FRAME` a frame fit in :data:`MEMORY_SHARE` of the memory
            available, else in parts that do.
    """

    stability_rule: str = "quorum"
    flight_bins: int = 200
    histogram_base: float = 2.0
    frames_per_part: int | None = None

    def __post_init__(self) -> None:
        if self.stability_rule not in STABILITY_RULES:
            raise ValueError(f"stability_rule must be one of {', '.join(STABILITY_RULES)}, "
                             f"not {self.stability_rule!r}")
        if self.flight_bins < 1:
            raise ValueError("flight_bins must be >= 1")
        if self.histogram_base <= 1:
            raise ValueError("histogram_base must be > 1")
        if self.frames_per_part is not None and self.frames_per_part < 0:
            raise ValueError("frames_per_part must be >= 0")
