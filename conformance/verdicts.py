"""The verdicts a conformance case can reach, and the conclusions that carry them.

This module sits at the bottom of the conformance package: the IUT launcher, the profile reader
and the harness raise these conclusions, and :mod:`conformance.model` (the case model) re-exports
them, so none of those modules needs the case model (see :mod:`conformance.model` for what each
verdict means).
"""

from __future__ import annotations

import enum
from typing import Any


class Verdict(enum.StrEnum):
    PASS = "pass"
    FAIL = "fail"
    NON_STRICT = "non-strict"
    INFORMATIONAL = "informational"
    UNSUPPORTED = "unsupported"
    ERROR = "error"


class Strength(enum.StrEnum):
    MUST = "MUST"
    SHOULD = "SHOULD"


class Role(enum.StrEnum):
    """The part the IUT plays; the harness plays every other part."""

    STORE = "store"
    SOURCE = "source"
    RECEIVER = "receiver"


class Conclusion(Exception):
    """Ends a case with a verdict other than ``pass`` and says why.

    ``expected`` and ``observed`` are shown side by side in the reports.
    """

    verdict = Verdict.FAIL

    def __init__(self, message: str, *, expected: Any = None, observed: Any = None) -> None:
        super().__init__(message)
        self.message = message
        self.expected = expected
        self.observed = observed


class Failed(Conclusion):
    verdict = Verdict.FAIL


class NonStrict(Conclusion):
    verdict = Verdict.NON_STRICT


class Informational(Conclusion):
    verdict = Verdict.INFORMATIONAL


class Unsupported(Conclusion):
    verdict = Verdict.UNSUPPORTED


class HarnessError(Conclusion):
    """The harness could not run the case (IUT did not start, bad profile, port in use)."""

    verdict = Verdict.ERROR
