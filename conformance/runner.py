"""Runs cases against an IUT and collects verdicts with their evidence.

One run = one harness resolver (UDP), a work directory per IUT process and an evidence
directory per case (``<out>/cases/<ID>/``: ``evidence.pcap``, ``timeline.json``,
``iut.log``).  Cases run one after the other; consecutive cases with the same
:class:`~conformance.iut.StoreSetup` share an IUT process, and a case that restarts the IUT,
or after which the IUT is no longer running, ends that process's use.

A source or receiver IUT gets a fresh work directory and process for every case, which starts it
itself once the peers it plays (stores, a source) listen, and stops it at the end: its
configuration names those peers.

A case that runs past its timeout (scaled) is an ``error``: its sockets are closed, which ends
any wait it is blocked in, and the IUT is replaced for the next case.  An IUT that dies during
a case makes the case ``fail`` (a crash is never conformant), with its log in the evidence.
"""

from __future__ import annotations

import shutil
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conformance.evidence import Recorder
from conformance.harness import Harness
from conformance.iut import ClientUnderTest, IutProcess, StoreSetup, StoreUnderTest
from conformance.model import CaseSpec, Conclusion, Role, Strength, Verdict, all_cases
from conformance.net import NoAnswer, UdpPort
from conformance.peers import RESOLVER_PORTS, HarnessResolver
from conformance.profile import IutProfile


@dataclass
class CaseResult:
    """The outcome of one case, as the reports show it.

    ``counts_against`` is True when this result makes the run fail: a MUST case that failed,
    any case that errored, or a known failure that unexpectedly passed.
    """

    spec: CaseSpec
    verdict: Verdict
    message: str = ""
    expected: Any = None
    observed: Any = None
    seconds: float = 0.0
    evidence: Path | None = None
    pcap: Path | None = None
    frames: int = 0
    timeline: list[dict[str, Any]] = field(default_factory=list)
    iut_log: str = ""
    known_failure: str | None = None
    skipped: str | None = None
    iut_port: int | None = None
    store_ports: list[int] = field(default_factory=list)
    """TCP ports to decode as UM store ports in the evidence: the store IUT's, or the
    harness's stores' in front of a source or receiver IUT."""

    @property
    def unexpected_pass(self) -> bool:
        return self.known_failure is not None and self.verdict is Verdict.PASS

    @property
    def counts_against(self) -> bool:
        if self.known_failure is not None:
            return self.verdict is Verdict.PASS
        if self.verdict is Verdict.ERROR:
            return True
        return self.verdict is Verdict.FAIL and self.spec.strength is Strength.MUST


@dataclass
class RunResult:
    profile: IutProfile
    results: list[CaseResult]
    seconds: float
    out: Path
    time_scale: float

    @property
    def exit_code(self) -> int:
        return 1 if any(r.counts_against for r in self.results) else 0

    def counts(self) -> dict[str, int]:
        out = {v.value: 0 for v in Verdict}
        for r in self.results:
            out[r.verdict.value] += 1
        return out


def select(cases: Iterable[CaseSpec], *, suites: Iterable[str] = (),
           keywords: Iterable[str] = ()) -> list[CaseSpec]:
    """Cases of the given suites (all when empty) matching every ``-k`` keyword expression.

    A keyword matches case-insensitively against the ID, title and suite; ``not X`` negates;
    ``A or B`` matches either.
    """
    wanted = set(suites)
    chosen = [c for c in cases if not wanted or c.suite in wanted]
    for expr in keywords:
        chosen = [c for c in chosen if _keyword(expr, f"{c.id} {c.title} {c.suite}".lower())]
    return chosen


def _keyword(expr: str, text: str) -> bool:
    alternatives = [a.strip() for a in expr.lower().split(" or ")]
    for alt in alternatives:
        terms = [t.strip() for t in alt.split(" and ")]
        if all((t[4:].strip() not in text) if t.startswith("not ") else (t in text)
               for t in terms):
            return True
    return False


class Runner:
    def __init__(self, profile: IutProfile, out: Path, *, time_scale: float = 1.0,
                 progress: Callable[[CaseResult], None] | None = None) -> None:
        self.profile = profile
        # absolute once, here where the run directory is chosen: every path derived from it
        # (IUT work directories, configuration files, evidence) is handed to processes that
        # run in other directories, so a relative ``--out conform-out`` must not reach them
        self.out = out.resolve()
        self.time_scale = time_scale
        self.progress = progress
        self.iut: IutProcess | None = None
        self._iut_count = 0
        self.resolver_port: UdpPort | None = None
        self.resolver: HarnessResolver | None = None

    def __enter__(self) -> Runner:
        self.out.mkdir(parents=True, exist_ok=True)
        self.resolver_port = UdpPort(("127.0.0.1", 0), Recorder(), "resolver",
                                     ports=RESOLVER_PORTS)
        self.resolver = HarnessResolver(self.resolver_port)
        return self

    def __exit__(self, *exc: object) -> None:
        self._retire_iut()
        if self.resolver_port is not None:
            self.resolver_port.close()

    def _retire_iut(self) -> None:
        if self.iut is not None:
            self.iut.stop()
            self.iut = None

    def _iut_for(self, spec: CaseSpec) -> IutProcess:
        if self.profile.role is not Role.STORE:
            return self._client_for(spec)
        setup = StoreSetup.of(spec.store_options, spec.topic_options)
        iut = self.iut
        if iut is not None and not isinstance(iut, StoreUnderTest):
            self._retire_iut()
            iut = None
        if iut is not None and (iut.setup != setup or not self._usable(iut)):
            self._retire_iut()
            iut = None
        if iut is None:
            assert self.resolver_port is not None
            self._iut_count += 1
            workdir = self.out / "iut" / f"{self._iut_count:03d}"
            if workdir.exists():
                shutil.rmtree(workdir)
            iut = StoreUnderTest(self.profile, workdir, self.resolver_port.addr, setup,
                                 time_scale=self.time_scale)
            self.iut = iut
            iut.start()
        return iut

    def _client_for(self, spec: CaseSpec) -> ClientUnderTest:
        """A fresh, not yet started source or receiver IUT (the case starts it)."""
        self._retire_iut()
        assert self.resolver_port is not None
        self._iut_count += 1
        workdir = self.out / "iut" / f"{self._iut_count:03d}"
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        iut = ClientUnderTest(self.profile, workdir, self.resolver_port.addr,
                              time_scale=self.time_scale)
        self.iut = iut
        return iut

    def _usable(self, iut: StoreUnderTest) -> bool:
        return self.profile.address is not None or iut.running

    def run_case(self, spec: CaseSpec) -> CaseResult:
        started = time.monotonic()
        expectation = self.profile.expectation(spec.id)
        result = CaseResult(spec, Verdict.PASS, known_failure=expectation.known_failure)
        if expectation.skip is not None:
            result.verdict, result.skipped = Verdict.UNSUPPORTED, expectation.skip
            result.message = f"skipped by the profile: {expectation.skip}"
            return self._done(result, started)
        if spec.role is not self.profile.role:
            result.verdict = Verdict.UNSUPPORTED
            result.message = f"the case tests a {spec.role.value}; the IUT is a " \
                             f"{self.profile.role.value}"
            return self._done(result, started)
        if spec.needs_restart and self.profile.address is not None:
            result.verdict = Verdict.UNSUPPORTED
            result.message = "the case restarts the IUT, which needs a launch command"
            return self._done(result, started)
        evidence = self.out / "cases" / spec.id
        if evidence.exists():
            shutil.rmtree(evidence)
        evidence.mkdir(parents=True)
        recorder = Recorder()
        assert self.resolver is not None and self.resolver_port is not None
        self.resolver_port.recorder = recorder
        self.resolver.reset()
        try:
            iut = self._iut_for(spec)
        except Conclusion as exc:
            result.verdict, result.message = exc.verdict, exc.message
            self._retire_iut()
            return self._finish(result, recorder, evidence, None, 0, started)
        log_offset = iut.log_size()
        harness = Harness(spec, iut, self.resolver, recorder, time_scale=self.time_scale)
        outcome: dict[str, BaseException | None] = {"exc": None}

        def body() -> None:
            try:
                spec.run(harness)
            except BaseException as exc:
                outcome["exc"] = exc

        worker = threading.Thread(target=body, name=f"case {spec.id}", daemon=True)
        worker.start()
        worker.join(spec.timeout * self.time_scale)
        timed_out = worker.is_alive()
        harness.close()
        if timed_out:
            worker.join(2.0)
            result.verdict = Verdict.ERROR
            limit = spec.timeout * self.time_scale
            result.message = f"the case did not finish within {limit:.1f} s (harness timeout)"
            self._retire_iut()
        else:
            self._judge(result, outcome["exc"])
            errors = harness.peer_errors()
            if errors and result.verdict is not Verdict.ERROR:
                result.verdict = Verdict.ERROR
                result.message = "harness error: " + "; ".join(errors[:3])
        result.store_ports = [s.addr[1] for s in harness.stores] or \
            ([iut.addr[1]] if isinstance(iut, StoreUnderTest) else [])
        if not timed_out and iut.proc is not None and not iut.running and \
                not (harness.deregistered and iut.proc.returncode == 0):
            # (a client that deregistered on request may end there, with status 0)
            code = iut.proc.returncode
            result.verdict = Verdict.FAIL
            result.message = (f"the IUT exited (code {code}) during the case"
                              + (f"; before that: {result.message}" if result.message else ""))
            self._retire_iut()
        elif spec.needs_restart or harness.restarted or isinstance(iut, ClientUnderTest):
            self._retire_iut()
        return self._finish(result, recorder, evidence, iut, log_offset, started)

    def _judge(self, result: CaseResult, exc: BaseException | None) -> None:
        if exc is None:
            result.verdict = Verdict.PASS
        elif isinstance(exc, Conclusion):
            result.verdict, result.message = exc.verdict, exc.message
            result.expected, result.observed = exc.expected, exc.observed
        elif isinstance(exc, NoAnswer):
            result.verdict, result.message = Verdict.FAIL, str(exc)
        elif isinstance(exc, AssertionError):
            result.verdict, result.message = Verdict.FAIL, str(exc) or "assertion failed"
        else:
            result.verdict = Verdict.ERROR
            result.message = "harness error: " + "".join(
                traceback.format_exception_only(type(exc), exc)).strip()
            result.observed = "".join(traceback.format_exception(exc))[-4000:]

    def _finish(self, result: CaseResult, recorder: Recorder, evidence: Path,
                iut: IutProcess | None, log_offset: int, started: float) -> CaseResult:
        result.evidence = evidence
        result.iut_port = iut.addr[1] if isinstance(iut, StoreUnderTest) else None
        result.pcap = evidence / "evidence.pcap"
        result.frames = recorder.write_pcap(result.pcap)
        recorder.write_timeline(evidence / "timeline.json")
        result.timeline = recorder.timeline()
        if iut is not None:
            result.iut_log = iut.log_since(log_offset)[-20_000:]
            (evidence / "iut.log").write_text(result.iut_log)
        return self._done(result, started)

    def _done(self, result: CaseResult, started: float) -> CaseResult:
        result.seconds = time.monotonic() - started
        if self.progress is not None:
            self.progress(result)
        return result


def run(profile: IutProfile, out: Path, *, suites: Iterable[str] = (),
        keywords: Iterable[str] = (), time_scale: float = 1.0,
        progress: Callable[[CaseResult], None] | None = None,
        cases: list[CaseSpec] | None = None) -> RunResult:
    """Run the selected cases; the reports are the caller's business (:mod:`.report`)."""
    chosen = cases if cases is not None else select(all_cases(profile.role), suites=suites,
                                                    keywords=keywords)
    started = time.monotonic()
    with Runner(profile, out, time_scale=time_scale, progress=progress) as runner:
        results = [runner.run_case(spec) for spec in chosen]
    return RunResult(profile, results, time.monotonic() - started, runner.out, time_scale)
