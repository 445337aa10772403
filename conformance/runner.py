"""Runs cases against an IUT and collects verdicts with their evidence.

One run = one harness resolver (UDP), a work directory per IUT process and an evidence
directory per case (``<out>/cases/<ID>/``: ``evidence.pcap``, ``timeline.json``,
``iut.log``).  Cases run one after the other; consecutive cases with the same
:class:`~conformance.iut.StoreSetup` share an IUT process, and a case that restarts the IUT,
or after which the IUT is no longer running, ends that process's use.

Transports (``ump conform --transport``): the harness's sources send their data to a store IUT
on LBT-TCP, LBT-RU or LBT-RM (:mod:`conformance.udp_transport`); a case keeps its ID on every
transport, its result names the transport (:attr:`CaseResult.transport`) and its evidence of a
run on LBT-RU or LBT-RM is ``<out>/cases/<ID>.<transport>/``.

A source or receiver IUT gets a fresh work directory and process for every case, which starts it
itself once the peers it plays (stores, a source) listen, and stops it at the end: its
configuration names those peers.

A case that runs past its timeout (scaled) is an ``error``: its sockets are closed, which ends
any wait it is blocked in, and the IUT is replaced for the next case.  An IUT that dies during
a case makes the case ``fail`` (a crash is never conformant), with its log in the evidence.

Parallel runs (``ump conform --jobs N``, :func:`run` with ``jobs``): ``N`` workers, each a
:class:`Runner` of its own on a thread, take the next segment in case order from one
:class:`_Schedule` until none is left; a segment (:func:`segments`) is the cases a serial run
serves with one IUT process, so a parallel run starts no more IUT processes than a serial one.
Every worker has its own resolver daemon, its own IUT processes (work directories
``<out>/iut/w<k>-NNN``; a serial run keeps ``<out>/iut/NNN``) and its own share of the
preferred ports (:meth:`conformance.net.PortPlan.share`: worker ``k`` of ``N`` prefers every
``N``-th port of tshark's default ranges, so two workers never prefer the same port, and worker
1 keeps the lbmrd port 15380).  Evidence was per case already (``<out>/cases/<ID>/``, one
recorder per case), so nothing interleaves.  The results are put back in case order, and
``progress`` is called in case order too (a case finished early waits for the ones before it),
so the reports and the printed lines are those of a serial run; only times, ports and which IUT
process served which case differ.  A case marked ``alone`` (:attr:`CaseSpec.alone`: a fixed
well-known port, or a timing other cases' load would distort) starts only when no other case is
running, and no case starts beside it.  Cases that restart or SIGKILL their IUT share nothing
with other workers (the IUT is the worker's own), so they run in parallel.  A store reached at
an ``address`` is one process for every case, and it names one resolver: against it cases
always run one at a time.  The default is one job: a serial run is what a slow or
single-instance IUT expects, and ``--jobs 2`` is the sensible setting on a two-core machine
(each IUT is a process of its own; more jobs than cores only adds contention).
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
from conformance.net import DEFAULT_PORTS, NoAnswer, PortPlan, UdpPort
from conformance.peers import HarnessResolver
from conformance.profile import IutProfile
from conformance.udp_transport import transport_ports


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
    transport_ports: dict[str, list[int]] = field(default_factory=dict)
    """UDP ports that carried ``lbt-ru`` / ``lbt-rm`` in the evidence (decode them as such)."""
    transport: str = "tcp"
    """The transport the case ran on (``tcp``, ``lbt-ru``, ``lbt-rm``: the run's
    ``--transport`` for a store case, the case's own for one about a transport)."""

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
                 progress: Callable[[CaseResult], None] | None = None,
                 ports: PortPlan = DEFAULT_PORTS, iut_prefix: str = "",
                 transport: str = "tcp") -> None:
        """``ports`` and ``iut_prefix`` (of the IUT work directories' names) are a parallel
        run's worker's own (see the module docstring); ``transport`` the harness sources'
        (:func:`case_transport`)."""
        self.profile = profile
        self.transport = transport
        self.ports = ports
        self.iut_prefix = iut_prefix
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
                                     ports=self.ports.resolver)
        self.resolver = HarnessResolver(self.resolver_port)
        return self

    def __exit__(self, *exc: object) -> None:
        self._retire_iut()
        if self.resolver_port is not None:
            self.resolver_port.close()

    def retire_iut(self) -> None:
        """Stop the IUT process this runner holds, if any."""
        self._retire_iut()

    def _retire_iut(self) -> None:
        if self.iut is not None:
            self.iut.stop()
            self.iut = None

    def _iut_for(self, spec: CaseSpec) -> IutProcess:
        if self.profile.role is not Role.STORE:
            return self._client_for(spec)
        setup = StoreSetup.of(spec.store_options, spec.topic_options, spec.lbm_options)
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
            workdir = self._workdir()
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
        workdir = self._workdir()
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        iut = ClientUnderTest(self.profile, workdir, self.resolver_port.addr,
                              time_scale=self.time_scale)
        self.iut = iut
        return iut

    def _workdir(self) -> Path:
        """The next IUT process's work directory (``<out>/iut/<prefix>NNN``)."""
        return self.out / "iut" / f"{self.iut_prefix}{self._iut_count:03d}"

    def _usable(self, iut: StoreUnderTest) -> bool:
        return self.profile.address is not None or iut.running

    def run_case(self, spec: CaseSpec) -> CaseResult:
        started = time.monotonic()
        expectation = self.profile.expectation(spec.id)
        result = CaseResult(spec, Verdict.PASS, known_failure=expectation.known_failure,
                            transport=case_transport(spec, self.transport))
        if expectation.skip is not None:
            result.verdict, result.skipped = Verdict.UNSUPPORTED, expectation.skip
            result.message = f"skipped by the profile: {expectation.skip}"
            return self._done(result, started)
        if spec.role is not self.profile.role:
            result.verdict = Verdict.UNSUPPORTED
            result.message = f"the case tests a {spec.role.value}; the IUT is a " \
                             f"{self.profile.role.value}"
            return self._done(result, started)
        if (why := transport_unsupported(spec, self.transport)) is not None:
            result.verdict, result.message = Verdict.UNSUPPORTED, why
            return self._done(result, started)
        if spec.needs_restart and self.profile.address is not None:
            result.verdict = Verdict.UNSUPPORTED
            result.message = "the case restarts the IUT, which needs a launch command"
            return self._done(result, started)
        evidence = self.out / "cases" / (spec.id if spec.transport is not None
                                         or result.transport == "tcp"
                                         else f"{spec.id}.{result.transport}")
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
        harness = Harness(spec, iut, self.resolver, recorder, time_scale=self.time_scale,
                          ports=self.ports, transport=result.transport)
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
        result.store_ports += [p for p in harness.group_ports if p not in result.store_ports]
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
        result.transport_ports = transport_ports(recorder.snapshot())
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


def case_transport(spec: CaseSpec, transport: str) -> str:
    """The transport ``spec`` runs on in a run on ``transport``: a case about one transport
    (:attr:`CaseSpec.transport`) runs on it whatever the run's; a store case on the run's; a
    source or receiver case on LBT-TCP (the harness plays its LBT-RU and LBT-RM sources only
    in front of a store: :func:`transport_unsupported`)."""
    if spec.transport is not None:
        return spec.transport
    return transport if spec.role is Role.STORE else "tcp"


def transport_unsupported(spec: CaseSpec, transport: str) -> str | None:
    """Why ``spec`` cannot run in a run on ``transport`` (None: it can).  A source or
    receiver case not about a transport runs on LBT-TCP only: what it judges is the
    persistence of a client whose transport the harness does not configure per case (the
    LBT-RM suite judges that transport)."""
    if transport == "tcp" or spec.role is Role.STORE or spec.transport is not None:
        return None
    return (f"the harness runs {spec.role.value} cases on LBT-TCP only; --transport "
            f"{transport} judges stores (the lbt-rm suite judges a {spec.role.value}'s LBT-RM)")


def segments(cases: list[CaseSpec], role: Role) -> list[list[int]]:
    """``cases`` (by index) cut where a serial run would start a fresh IUT process: a store
    IUT serves consecutive cases of one :class:`StoreSetup` until a case that restarts it
    (a source or receiver IUT gets a fresh process per case); an ``alone`` case is a segment
    of its own.  A parallel run hands out whole segments, so it starts no more IUT processes
    than a serial run (starting one is most of a short case's time)."""
    out: list[list[int]] = []
    previous: CaseSpec | None = None
    for index, spec in enumerate(cases):
        fresh = (previous is None or role is not Role.STORE or spec.alone or previous.alone
                 or previous.needs_restart
                 or StoreSetup.of(spec.store_options, spec.topic_options, spec.lbm_options)
                 != StoreSetup.of(previous.store_options, previous.topic_options,
                                  previous.lbm_options))
        if fresh:
            out.append([])
        out[-1].append(index)
        previous = spec
    return out


class _Schedule:
    """The cases of a parallel run, handed out a segment (:func:`segments`) at a time in case
    order, and their results put back in case order (see the module docstring)."""

    def __init__(self, cases: list[CaseSpec], role: Role,
                 progress: Callable[[CaseResult], None] | None) -> None:
        self.cases = cases
        self.segments = segments(cases, role)
        self.progress = progress
        self.results: dict[int, CaseResult] = {}
        self.failure: BaseException | None = None
        self._next = 0
        self._reported = 0
        self._running = 0
        self._alone_running = False
        self._cond = threading.Condition()

    def take(self) -> list[int] | None:
        """The next segment to run, waiting while an ``alone`` case runs or (for an ``alone``
        case) until nothing else does; None when no segment is left."""
        with self._cond:
            while True:
                if self._next >= len(self.segments) or self.failure is not None:
                    return None
                segment = self.segments[self._next]
                alone = self.cases[segment[0]].alone
                if not self._alone_running and (not alone or self._running == 0):
                    self._next += 1
                    self._running += 1
                    self._alone_running = alone
                    return segment
                self._cond.wait()

    def done(self, index: int, result: CaseResult) -> None:
        """Keep ``result`` and report every result that is now next in case order."""
        with self._cond:
            self.results[index] = result
            while self._reported in self.results:
                if self.progress is not None:
                    self.progress(self.results[self._reported])
                self._reported += 1

    def segment_done(self, segment: list[int]) -> None:
        with self._cond:
            self._running -= 1
            if self.cases[segment[0]].alone:
                self._alone_running = False
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        """Stop handing out cases: a worker could not go on (the run then raises ``exc``)."""
        with self._cond:
            if self.failure is None:
                self.failure = exc
            self._cond.notify_all()

    def stop(self) -> None:
        """Hand out no further segment (the cases running finish)."""
        with self._cond:
            self._next = len(self.segments)
            self._cond.notify_all()


def _run_parallel(profile: IutProfile, out: Path, cases: list[CaseSpec], *, jobs: int,
                  time_scale: float, progress: Callable[[CaseResult], None] | None,
                  transport: str = "tcp") -> list[CaseResult]:
    """Run ``cases`` on ``jobs`` workers; the results in case order."""
    schedule = _Schedule(cases, profile.role, progress)

    def work(worker: int) -> None:
        try:
            with Runner(profile, out, time_scale=time_scale,
                        ports=DEFAULT_PORTS.share(worker, jobs),
                        iut_prefix=f"w{worker + 1}-", transport=transport) as runner:
                while (segment := schedule.take()) is not None:
                    try:
                        for index in segment:
                            schedule.done(index, runner.run_case(cases[index]))
                    finally:
                        schedule.segment_done(segment)
                    # the next segment is not this one's continuation: a fresh IUT for it
                    runner.retire_iut()
        except BaseException as exc:  # re-raised by the main thread, as a serial run would
            schedule.fail(exc)

    workers = [threading.Thread(target=work, args=(k,), name=f"conform worker {k + 1}")
               for k in range(min(jobs, len(schedule.segments)))]
    for worker in workers:
        worker.start()
    try:
        for worker in workers:
            worker.join()
    except KeyboardInterrupt:
        schedule.stop()  # the running cases end (within their timeouts) and stop their IUTs
        for worker in workers:
            worker.join()
        raise
    if schedule.failure is not None:
        raise schedule.failure
    return [schedule.results[i] for i in range(len(cases))]


def run(profile: IutProfile, out: Path, *, suites: Iterable[str] = (),
        keywords: Iterable[str] = (), time_scale: float = 1.0,
        progress: Callable[[CaseResult], None] | None = None,
        cases: list[CaseSpec] | None = None, jobs: int = 1,
        transport: str = "tcp") -> RunResult:
    """Run the selected cases, ``jobs`` at a time (see the module docstring), the harness's
    sources in front of a store on ``transport``; the reports are the caller's business
    (:mod:`.report`)."""
    if jobs < 1:
        raise ValueError(f"jobs must be at least 1, not {jobs}")
    chosen = cases if cases is not None else select(all_cases(profile.role), suites=suites,
                                                    keywords=keywords)
    started = time.monotonic()
    if jobs > 1 and len(chosen) > 1 and profile.address is None:
        results = _run_parallel(profile, out, chosen, jobs=jobs, time_scale=time_scale,
                                progress=progress, transport=transport)
        return RunResult(profile, results, time.monotonic() - started, out.resolve(),
                         time_scale)
    with Runner(profile, out, time_scale=time_scale, progress=progress,
                transport=transport) as runner:
        results = [runner.run_case(spec) for spec in chosen]
    return RunResult(profile, results, time.monotonic() - started, runner.out, time_scale)
