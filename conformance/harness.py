"""What a case works with: the IUT, the harness's peers, checks, and the case's evidence.

A case is a function taking a :class:`Harness`::

    @case("REG-SRC-001", ...)
    def new_source_gets_a_regid(h: Harness) -> None:
        src = h.source()
        resp = src.register(reg_id=0)
        h.check(not resp.e_flag, "the store refused a new source",
                expected="PREG_RESP without the E flag", observed=resp)

Every wait is scaled by ``--time-scale`` (:meth:`Harness.scaled`) and ends as soon as what it
waits for arrives; nothing sleeps for a fixed time.
"""

from __future__ import annotations

import itertools
import random
import time
from collections.abc import Callable
from typing import Any

from conformance.evidence import Recorder
from conformance.iut import StoreUnderTest
from conformance.model import CaseSpec, Failed, NonStrict
from conformance.peers import HarnessReceiver, HarnessResolver, HarnessSource


class Harness:
    def __init__(self, spec: CaseSpec, iut: StoreUnderTest, resolver: HarnessResolver,
                 recorder: Recorder, *, time_scale: float = 1.0, seed: int = 0) -> None:
        self.spec = spec
        self.iut = iut
        self.resolver = resolver
        self.recorder = recorder
        self.time_scale = time_scale
        self.closers: list[Callable[[], None]] = []
        self.random = random.Random(f"{seed}:{spec.id}")
        self._topics = itertools.count(1)
        self.restarted = False

    # --- time ---------------------------------------------------------------------------------

    def scaled(self, seconds: float) -> float:
        return seconds * self.time_scale

    def wait_until(self, predicate: Callable[[], bool], timeout: float, what: str,
                   poll: float = 0.01) -> bool:
        """Poll ``predicate`` until true or ``timeout`` (scaled) passed; True if it held."""
        deadline = time.monotonic() + self.scaled(timeout)
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(poll)
        self.note(f"gave up waiting for {what} after {self.scaled(timeout):.2f} s")
        return predicate()

    # --- peers --------------------------------------------------------------------------------

    def topic(self) -> str:
        """A fresh topic name matching the IUT's configured pattern."""
        return f"conform.{self.spec.id.lower()}.{next(self._topics)}.{self.random.randrange(10**6)}"

    def source(self, name: str = "source", topic: str | None = None) -> HarnessSource:
        """A scripted source with its own topic, transport port and request port."""
        return HarnessSource(self, topic or self.topic(),
                             transport_idx=self.random.randrange(1, 1 << 31), name=name)

    def receiver(self, source: HarnessSource, name: str = "receiver") -> HarnessReceiver:
        return HarnessReceiver(self, source, name=name)

    def restart_iut(self, *, kill: bool = False) -> None:
        """Restart the IUT on its own files (SIGKILL with ``kill``); peers must reconnect."""
        self.note(f"{'SIGKILL' if kill else 'stopping'} the IUT and starting it again")
        self.restarted = True
        self.iut.restart(kill=kill)
        self.note("the IUT is ready again")

    # --- verdicts -----------------------------------------------------------------------------

    def note(self, text: str) -> None:
        self.recorder.note(text)

    def check(self, condition: bool, message: str, *, expected: Any = None,
              observed: Any = None) -> None:
        """Fail the case with ``message`` unless ``condition``."""
        if condition:
            self.note(f"ok: {message if expected is None else expected}")
            return
        raise Failed(message, expected=expected, observed=observed)

    def check_equal(self, observed: Any, expected: Any, what: str) -> None:
        self.check(observed == expected, f"{what} is {observed!r}, expected {expected!r}",
                   expected=expected, observed=observed)

    def prefer(self, condition: bool, message: str, *, expected: Any = None,
               observed: Any = None) -> None:
        """The guide prefers ``condition`` but allows otherwise: ``non-strict`` if it fails."""
        if not condition:
            raise NonStrict(message, expected=expected, observed=observed)

    def close(self) -> None:
        for closer in reversed(self.closers):
            try:
                closer()
            except OSError:
                continue
        self.closers.clear()
