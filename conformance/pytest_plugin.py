"""Run the conformance cases as pytest tests: ``pytest -p conformance.pytest_plugin --iut X``.

Options: ``--iut PROFILE.toml`` (or a built-in name: ``default``/``store``, ``source``,
``receiver`` for the reference implementation), ``--conform-suite``
(repeatable), ``--conform-out DIR`` (evidence and reports, default ``conform-out``),
``--time-scale X``.  Every case becomes one test item named by its ID, so ``-k`` and
``--junitxml`` work as usual; a ``fail`` of a MUST case or an ``error`` fails the item, a
``fail`` of a SHOULD case, ``non-strict``, ``unsupported`` and known failures are reported as
skips with the verdict and reason, and the harness's own reports (HTML, JUnit, JSON) are written
at the end of the session.

Without ``--iut`` the plugin adds nothing, so it is safe to load in any pytest run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from conformance.model import SUITES, CaseSpec, Verdict, all_cases
from conformance.profile import IutProfile, ProfileError, resolve_profile
from conformance.runner import CaseResult, Runner, RunResult, select
from conformance.udp_transport import TRANSPORTS


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("ump conform")
    g.addoption("--iut", metavar="PROFILE.toml",
                help="run the UM persistence conformance cases against this IUT profile "
                     "('default', 'source', 'receiver' = the reference implementation)")
    g.addoption("--conform-suite", action="append", default=[], choices=SUITES,
                help="only this conformance suite (repeatable)")
    g.addoption("--conform-out", default="conform-out", help="evidence and report directory")
    g.addoption("--time-scale", type=float, default=1.0, help="scale every case timeout")
    g.addoption("--conform-transport", choices=TRANSPORTS, default=None,
                help="what the harness's sources send on to a store IUT (ump conform "
                     "--transport; default: the profile's transport, else tcp)")


class ConformanceSession:
    def __init__(self, config: pytest.Config, profile: IutProfile) -> None:
        transport = config.getoption("--conform-transport") or profile.transport
        if transport not in TRANSPORTS:  # a profile's "all": one transport per pytest run
            raise pytest.UsageError(f"the profile's transport {transport!r}: the pytest plugin "
                                    f"runs one transport; give --conform-transport")
        self.runner = Runner(profile, Path(config.getoption("--conform-out")),
                             time_scale=config.getoption("--time-scale"), transport=transport)
        self.out = self.runner.out  # absolute: the directory pytest was started in
        self.results: list[CaseResult] = []
        self.entered = False

    def run(self, spec: CaseSpec) -> CaseResult:
        if not self.entered:
            self.runner.__enter__()
            self.entered = True
        result = self.runner.run_case(spec)
        self.results.append(result)
        return result

    def finish(self) -> None:
        if not self.entered:
            return
        self.runner.__exit__(None, None, None)
        from conformance.report import write_all

        write_all(RunResult(self.runner.profile, self.results,
                            sum(r.seconds for r in self.results), self.out,
                            self.runner.time_scale))


_SESSION_KEY = pytest.StashKey[ConformanceSession]()


def pytest_configure(config: pytest.Config) -> None:
    iut = config.getoption("--iut", default=None)
    if not iut:
        return
    try:
        profile = resolve_profile(iut)
    except ProfileError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[_SESSION_KEY] = ConformanceSession(config, profile)
    if config.args_source is not pytest.Config.ArgsSource.ARGS:
        # no test paths given: run the conformance cases, not the project's testpaths
        config.args = [str(Path(__file__).with_name("pytest_cases.py"))]


def pytest_unconfigure(config: pytest.Config) -> None:
    session = config.stash.get(_SESSION_KEY, None)
    if session is not None:
        session.finish()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "conformance_case" not in metafunc.fixturenames:
        return
    suites = metafunc.config.getoption("--conform-suite")
    session = metafunc.config.stash.get(_SESSION_KEY, None)
    role = session.runner.profile.role if session is not None else None
    cases = select(all_cases(role), suites=suites)
    metafunc.parametrize("conformance_case", cases, ids=[c.id for c in cases])


@pytest.fixture
def conformance_session(request: pytest.FixtureRequest) -> ConformanceSession:
    session = request.config.stash.get(_SESSION_KEY, None)
    if session is None:
        pytest.skip("give --iut PROFILE.toml to run the conformance cases")
    return session


def judge(result: CaseResult) -> None:
    """Turn a case result into the pytest outcome (see the module docstring)."""
    detail = f"{result.spec.id} {result.verdict.value}: {result.message}"
    if result.counts_against:
        pytest.fail(detail + (f" (expected {result.expected!r}, observed {result.observed!r})"
                              if result.expected is not None else ""), pytrace=False)
    if result.verdict not in (Verdict.PASS, Verdict.INFORMATIONAL):
        pytest.skip(detail)


def run_case(session: ConformanceSession, spec: CaseSpec) -> Any:
    result = session.run(spec)
    judge(result)
    return result
