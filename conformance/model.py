"""What a conformance case is, and what it can conclude.

A case checks one requirement of the product guide against the implementation under test (IUT).
Its metadata (:class:`CaseSpec`) names the requirement precisely enough for a reviewer to look it
up: a stable ID that never changes meaning (``REG-SRC-001``), the guide section and the
sentence checked, and the requirement's strength (MUST or SHOULD, as the guide words it).

Verdicts (:class:`Verdict`) follow the usual conformance-testing vocabulary:

* ``pass`` / ``fail``: the IUT did / did not do what the requirement says;
* ``non-strict``: the IUT did something the guide allows but does not prefer (e.g. answered a
  retried registration twice);
* ``informational``: the case measures or reports and has nothing to judge;
* ``unsupported``: the case cannot run against this IUT (a role it does not play, a launch
  command the case needs but the profile does not give);
* ``error``: the harness itself could not run the case (the IUT did not start, a port was taken).

A run fails (exit code 1) only when a MUST case ends in ``fail`` or ``error``, or a case the
profile marks as a known failure unexpectedly passes (so stale tickets are noticed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from conformance.verdicts import (
    Conclusion,
    Failed,
    HarnessError,
    Informational,
    NonStrict,
    Role,
    Strength,
    Unsupported,
    Verdict,
)

if TYPE_CHECKING:
    from conformance.context import CaseContext
    from conformance.passive.judgement import Judgement
    from conformance.passive.observe import Observed

PassiveJudge = Callable[["Observed"], "list[Judgement]"]
"""A case's passive form: the requirement judged over a capture's observed model, one
:class:`~conformance.passive.judgement.Judgement` per entity it concerns (``ump conform
--capture``; see :mod:`conformance.passive`)."""

__all__ = ["SUITES", "CaseSpec", "Conclusion", "Failed", "HarnessError", "Informational",
           "NonStrict", "PassiveJudge", "Role", "Strength", "Unsupported", "Verdict", "all_cases",
           "case", "passive_for"]


@dataclass(frozen=True)
class CaseSpec:
    """A conformance case: its identity, the requirement it checks, and the check itself.

    Attributes:
        id: stable identifier, ``<SUITE>-<AREA>-<NNN>`` for store cases (``REG-STORE-003``),
            ``<ROLE>-<SUITE>-<NNN>`` for source and receiver cases (``SRC-REG-001``,
            ``RCV-REC-002``); reports and profiles refer to it.
        title: one line saying what is checked.
        suite: the suite it belongs to (``registration``, ``recovery``, ``robustness``,
            ``flight-size``, ``proactive-retransmit``).
        role: the IUT role the case tests.
        section: the guide section that states the requirement (its heading as written).
        requirement: the sentence (or a close paraphrase) of the guide that is checked.
        strength: MUST or SHOULD.
        store_options: store-level umestored options the case needs in the IUT's XML.
        topic_options: topic-level options the case needs for its topic pattern.
        lbm_options: UM configuration options (``"scope option": value``) the case needs in
            the IUT's ``<lbm-config>`` file (a store's own client options, e.g. ``receiver
            use_otr``).
        needs_restart: the case restarts the IUT (needs a launch command).
        timeout: seconds the case may take at ``--time-scale 1``.
        alone: the case must not run next to another case (``ump conform --jobs``): it uses a
            fixed well-known port, or measures timing that other cases' load would distort.
        transport: the transport the case is about (``lbt-rm``): it runs on that one whatever
            ``--transport`` says; None: a store case runs on the run's transport.
        run: the check; it drives a :class:`~conformance.context.CaseContext` (the harness)
            and raises a :class:`Conclusion` (or returns for ``pass``).
    """

    id: str
    title: str
    suite: str
    role: Role
    section: str
    requirement: str
    strength: Strength
    run: Callable[[CaseContext], None]
    store_options: dict[str, str | int] = field(default_factory=dict)
    topic_options: dict[str, str | int] = field(default_factory=dict)
    lbm_options: dict[str, str | int] = field(default_factory=dict)
    needs_restart: bool = False
    timeout: float = 10.0
    alone: bool = False
    transport: str | None = None

    @property
    def doc(self) -> str:
        return (self.run.__doc__ or "").strip()

    @property
    def passive(self) -> PassiveJudge | None:
        """The case's passive judge (:func:`passive_for`), or None: judged only actively.
        Looked up, not stored, so the judges can live in :mod:`conformance.passive` and be
        registered after the case."""
        return _PASSIVE.get(self.id)


_REGISTRY: dict[str, CaseSpec] = {}


def case(id: str, *, title: str, suite: str, section: str, requirement: str,
         strength: Strength = Strength.MUST, role: Role = Role.STORE,
         store_options: dict[str, str | int] | None = None,
         topic_options: dict[str, str | int] | None = None,
         needs_restart: bool = False, timeout: float = 10.0, alone: bool = False,
         transport: str | None = None, lbm_options: dict[str, str | int] | None = None
         ) -> Callable[[Callable[[CaseContext], None]], Callable[[CaseContext], None]]:
    """Register the decorated function as a conformance case (IDs must be unique)."""
    def register(fn: Callable[[CaseContext], None]) -> Callable[[CaseContext], None]:
        if id in _REGISTRY and _REGISTRY[id].run is not fn:
            raise ValueError(f"conformance case {id} is defined twice")
        _REGISTRY[id] = CaseSpec(
            id=id, title=title, suite=suite, role=role, section=section,
            requirement=" ".join(requirement.split()), strength=strength, run=fn,
            store_options=dict(store_options or {}), topic_options=dict(topic_options or {}),
            needs_restart=needs_restart, timeout=timeout, alone=alone, transport=transport,
            lbm_options=dict(lbm_options or {}))
        return fn
    return register


_PASSIVE: dict[str, PassiveJudge] = {}


def passive_for(id: str) -> Callable[[PassiveJudge], PassiveJudge]:
    """Register the decorated function as the passive judge of case ``id``: the same
    requirement (ID, guide section, sentence, strength) judged over observed traffic."""
    def register(fn: PassiveJudge) -> PassiveJudge:
        if id in _PASSIVE and _PASSIVE[id] is not fn:
            raise ValueError(f"case {id} has two passive judges")
        _PASSIVE[id] = fn
        return fn
    return register


SUITES = ("registration", "recovery", "robustness", "flight-size", "proactive-retransmit",
          "durability", "rpp-matrix", "rpp", "quorum", "proxy", "otr",
          "lbt-rm")


def all_cases(role: Role | None = None) -> list[CaseSpec]:
    """Every case of every suite (of one IUT role, when given), in ID order (importing the
    suites registers them)."""
    from conformance import suites  # noqa: F401 - registers the cases

    return sorted((c for c in _REGISTRY.values() if role is None or c.role is role),
                  key=lambda c: c.id)
