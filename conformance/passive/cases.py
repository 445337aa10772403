"""Passive-only cases: requirements that only observed traffic judges, with their own IDs.

A requirement the active suites already check is judged passively by the *same* case object
(:func:`conformance.model.passive_for` next to its judge in :mod:`conformance.passive.checks`).
A requirement with no active counterpart gets a case here, ``PSV-<ROLE>-<NNN>``, registered
with :func:`passive_case`: it is a :class:`~conformance.model.CaseSpec` like every other (guide
section, sentence, strength), kept out of the active registry so an active run does not list
it; run actively it would only say "judged only passively".

Importing this module registers no case; :mod:`conformance.passive.checks` does.
"""

from __future__ import annotations

from collections.abc import Callable

from conformance.model import CaseSpec, PassiveJudge, Role, Strength, Unsupported, passive_for

SUITE = "passive"

PASSIVE_ONLY: list[CaseSpec] = []
"""The passive-only cases, in registration order."""


def _only_passive(_h: object) -> None:
    raise Unsupported("judged only passively (ump conform --capture)")


def passive_case(id: str, *, title: str, role: Role, section: str, requirement: str,
                 strength: Strength = Strength.MUST) -> Callable[[PassiveJudge], PassiveJudge]:
    """Register the decorated judge as a passive-only case ``id`` (IDs must be unique)."""
    def register(fn: PassiveJudge) -> PassiveJudge:
        if any(c.id == id for c in PASSIVE_ONLY):
            raise ValueError(f"passive case {id} is defined twice")
        PASSIVE_ONLY.append(CaseSpec(id=id, title=title, suite=SUITE, role=role,
                                     section=section, requirement=" ".join(requirement.split()),
                                     strength=strength, run=_only_passive))
        return passive_for(id)(fn)
    return register
