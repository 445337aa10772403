"""What a passive judge concludes about one entity of a capture (:class:`Judgement`), and
the shorthands the judges write it with.

Kept apart from :mod:`conformance.passive.judge` (which runs the judges) so the case model
(:mod:`conformance.model`) can name the judges' type without importing the runner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from conformance.verdicts import Verdict


@dataclass
class Judgement:
    """What a passive judge concluded about one entity.

    Attributes:
        entity: the store, source or receiver judged ("store 10.0.0.5:14567", see
            :attr:`conformance.passive.observe.Client.name`).
        verdict: pass, fail, non-strict, informational or unsupported.
        message: why (for a pass: what was checked, e.g. "3 re-registrations").
        frames: the frame numbers that decided it (evidence).
        expected / observed: shown side by side in the reports.
    """

    entity: str
    verdict: Verdict
    message: str
    frames: list[int] = field(default_factory=list)
    expected: Any = None
    observed: Any = None


def passed(entity: str, message: str, frames: list[int]) -> Judgement:
    return Judgement(entity, Verdict.PASS, message, sorted(set(frames)))


def failed(entity: str, message: str, frames: list[int], *, expected: Any = None,
           observed: Any = None) -> Judgement:
    return Judgement(entity, Verdict.FAIL, message, sorted(set(frames)), expected, observed)


def informational(entity: str, message: str, frames: list[int], *,
                  observed: Any = None) -> Judgement:
    return Judgement(entity, Verdict.INFORMATIONAL, message, sorted(set(frames)),
                     observed=observed)


def unsupported(entity: str, message: str) -> Judgement:
    return Judgement(entity, Verdict.UNSUPPORTED, message)


NEEDS: dict[str, str] = {}
"""Case ID -> what its passive judge needs that a capture may lack (:func:`needs`)."""


def needs(case_id: str, what: str) -> None:
    """Say what case ``case_id``'s judge needs, for its ``unsupported`` reason ("no
    deregistration was captured")."""
    NEEDS[case_id] = what
