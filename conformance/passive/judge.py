"""Running the passive judges over an observed capture, into the results the reports show.

Every case of every suite is judged: a case with a passive judge (:func:`conformance.model.
passive_for`) gets one result per entity its judge names (a store, a source, a receiver);
a case without one is ``unsupported`` once, with the reason "judged only actively"; and the
passive-only cases of :mod:`conformance.passive.cases` (requirements no active case has) are
judged like the others.  A judge that finds nothing it can decide returns no judgement, and the
case is ``unsupported`` with the reason the capture gives (:func:`why_nothing`: no UM at all, no
registration seen, a damaged capture), never ``fail``.

The results are :class:`PassiveResult` (a :class:`~conformance.runner.CaseResult` that also
names the entity and the frames that decided the verdict), gathered in a
:class:`~conformance.runner.RunResult` so the JSON, JUnit and HTML reports of an active run are
written by the same code (:mod:`conformance.report`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from conformance.model import CaseSpec, Role, Verdict, all_cases
from conformance.passive.judgement import (
    NEEDS,
    Judgement,
    failed,
    informational,
    needs,
    passed,
    unsupported,
)
from conformance.passive.observe import Observed
from conformance.profile import IutProfile
from conformance.runner import CaseResult, RunResult

__all__ = ["ACTIVE_ONLY", "Judgement", "PassiveResult", "failed", "informational", "judge",
           "needs", "passed", "passive_cases", "run_passive", "unsupported", "why_nothing"]

ACTIVE_ONLY = "judged only actively"
"""The reason a case without a passive judge gives."""


@dataclass
class PassiveResult(CaseResult):
    """A case's verdict for one entity of the capture.

    Attributes:
        entity: the store, source or receiver judged ("capture" for a case judged once).
        decided_by: the frame numbers that decided the verdict.
        captures: the capture files judged (the frame numbers are theirs).
        page: the evidence page showing those frames dissected, relative to the run's
            output directory (:mod:`conformance.passive.evidence`), once written.
    """

    entity: str = "capture"
    decided_by: list[int] = field(default_factory=list)
    captures: list[Path] = field(default_factory=list)
    page: str | None = None


def why_nothing(obs: Observed, need: str | None = None) -> str:
    """Why the capture lets a case decide nothing, most basic reason first."""
    damaged = [p for p in obs.problems if "damaged" in p]
    if obs.um_frames == 0:
        return (f"no UM traffic in {obs.frames} frames (a store's TCP port needs "
                f"--store-port, as in ump dissect)")
    if not obs.registrations:
        return ("no registration (PREG) was captured: the capture starts mid-stream, or the "
                "stores' TCP port was not named with --store-port")
    what = need or "the capture holds nothing this case judges"
    return f"{what} ({damaged[0]})" if damaged else what


def passive_cases() -> list[CaseSpec]:
    """Every case judged by ``ump conform --capture``: the suites' cases and the passive-only
    ones, in ID order."""
    from conformance.passive import checks  # noqa: F401 - registers the judges
    from conformance.passive.cases import PASSIVE_ONLY

    return sorted([*all_cases(), *PASSIVE_ONLY], key=lambda c: c.id)


def judge(obs: Observed, specs: list[CaseSpec]) -> list[PassiveResult]:
    """One result per (case, entity), in case order."""
    out: list[PassiveResult] = []
    for spec in specs:
        began = time.monotonic()
        fn = spec.passive
        if fn is None:
            out.append(PassiveResult(spec, Verdict.UNSUPPORTED, ACTIVE_ONLY,
                                     captures=obs.paths))
            continue
        found = fn(obs) or [unsupported("capture", why_nothing(obs, NEEDS.get(spec.id)))]
        took = (time.monotonic() - began) / len(found)
        for j in found:
            out.append(PassiveResult(spec, j.verdict, f"{j.entity}: {j.message}",
                                     expected=j.expected, observed=j.observed, seconds=took,
                                     entity=j.entity, decided_by=j.frames, captures=obs.paths,
                                     frames=len(j.frames), store_ports=obs.store_ports))
    return out


def capture_profile(obs: Observed) -> IutProfile:
    """The "IUT" of a passive run, as the reports name it: the captures themselves."""
    names = ", ".join(p.name for p in obs.paths)
    return IutProfile(name=f"capture {names}", role=Role.STORE,
                      source=", ".join(str(p) for p in obs.paths))


def run_passive(obs: Observed, specs: list[CaseSpec], out: Path) -> RunResult:
    began = time.monotonic()
    results: list[CaseResult] = list(judge(obs, specs))
    return RunResult(capture_profile(obs), results, time.monotonic() - began, out, 1.0)
