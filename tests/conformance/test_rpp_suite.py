"""``ump conform --suite rpp``: the reference store, source and receiver pass every RPP case of
their role, and the suite's cases are generated from the rules module (one per override, per
disk-only override, per garbled registration) so that a rule added there gets its case.

One run per role (store about 25 s, source 5 s, receiver 3 s).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conformance.model import Role, all_cases
from conformance.suites import rpp as suite
from reference_impl import rpp
from wire.lbmc import CfgOpt, CfgScope

ROOT = Path(__file__).resolve().parents[2]


def _rpp_cases(role: Role) -> set[str]:
    return {c.id for c in all_cases(role) if c.suite == "rpp"}


@pytest.fixture(scope="module", params=["store", "source", "receiver"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
        ) -> tuple[Role, subprocess.CompletedProcess[str], dict[str, Any]]:
    role = Role(request.param)
    out = tmp_path_factory.mktemp(f"rpp-{role.value}") / "out"
    proc = subprocess.run([sys.executable, "-m", "ump", "conform", "--iut", role.value,
                           "--suite", "rpp", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    results = json.loads((out / "results.json").read_text()) if \
        (out / "results.json").exists() else {}
    return role, proc, results


def test_every_rpp_case_of_the_role_passes_against_the_reference(
        run: tuple[Role, subprocess.CompletedProcess[str], dict[str, Any]]) -> None:
    role, proc, results = run
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert {c["id"] for c in results["cases"]} == _rpp_cases(role)
    assert [(c["id"], c["verdict"], c["message"]) for c in results["cases"]
            if c["verdict"] != "pass"] == []


def test_every_role_has_rpp_cases_with_their_id_scheme() -> None:
    prefixes = {Role.STORE: "RPP-STORE-", Role.SOURCE: "SRC-RPP-", Role.RECEIVER: "RCV-RPP-"}
    for role, prefix in prefixes.items():
        ids = _rpp_cases(role)
        assert ids and all(i.startswith(prefix) for i in ids), (role, ids)
    sections = {c.section for c in all_cases() if c.suite == "rpp"}
    assert sections == {"RPP Registration", "RPP Normal Operations", "Late Registering Receiver",
                        "Early Exiting Receiver", "RPP Deregistration", "Implementing RPP"}


def test_one_case_per_override_and_per_disk_only_override() -> None:
    titles = {c.id: c.title for c in all_cases(Role.STORE) if c.suite == "rpp"}
    for number, override in enumerate(rpp.OVERRIDES, start=1):
        assert override.option in titles[f"RPP-STORE-{number:03d}"]
    disk_only = [o for o in rpp.OVERRIDES if o.disk_only]
    assert len(disk_only) == 2
    for number, override in enumerate(disk_only, start=8):
        title = titles[f"RPP-STORE-{number:03d}"]
        assert override.option in title and "memory topic" in title


def test_the_override_topic_is_consistent_and_each_case_value_crosses_its_maximum() -> None:
    """The shared disk topic must grant a source that overrides nothing, and the values the
    override cases send must be granted at the maximum and refused one above it."""
    topic = suite.LIMITS_DISK
    suite._effective(topic, [])
    for override in rpp.OVERRIDES:
        top = int(topic[override.store_option])
        suite._effective(topic, [CfgOpt(CfgScope.SOURCE, override.option, str(top))])
        if not override.flag:
            with pytest.raises(rpp.RppRefused, match="above the store's"):
                suite._effective(topic, [CfgOpt(CfgScope.SOURCE, override.option,
                                                str(top + 1))])


def test_every_garbled_registration_is_one_the_rules_refuse() -> None:
    """Each garbled case sends something :mod:`reference_impl.rpp` refuses (so the suite and
    the rules module cannot drift apart)."""
    assert len(suite.GARBLED) == 7
    for bad in suite.GARBLED:
        options = [o for o in bad.options if isinstance(o, CfgOpt)]
        if len(options) < len(bad.options):
            continue  # raw bytes: refused by the wire parser (tests/wire/test_cfgopt.py)
        with pytest.raises(rpp.RppRefused):
            if bad.receiver:
                rpp.receiver_mode(int(bad.rpp_flag), options)
            elif not bad.rpp_flag:
                raise rpp.RppRefused("options without the RPP flag")
            else:
                rpp.requested_overrides(options)


def test_withholding_expectations() -> None:
    """The room arithmetic of the withholding cases: the topic's flight size stops at 22, a
    flight size of 500 at 26, a size limit of 3000 at 14; no message sits on the boundary."""
    flight = int(suite.SMALL["source-flight-size-bytes-maximum"])
    limit = int(suite.SMALL["repository-size-limit"])
    assert suite._roomy(limit, flight, 29) == 22
    assert suite._roomy(limit, 500, 29) == 26
    assert suite._roomy(3000, flight, 20) == 14
    with pytest.raises(AssertionError):
        suite._roomy(4096, 1024, 30)  # 4096 - 128 * 24 == 1024: a boundary message


def test_web_monitor_is_for_launched_stores_and_the_reference_store_has_one() -> None:
    """RPP-STORE-035 judges skipped disk writes through the web monitor the profile asks the
    harness to give a launched store (the reference store's profile does)."""
    from conformance.profile import REFERENCE_STORE, ProfileError, parse_profile

    assert REFERENCE_STORE.web_monitor
    store = {"role": "store", "launch": "umestored {config}", "web_monitor": True}
    assert parse_profile({"iut": store}).web_monitor
    assert not parse_profile({"iut": {**store, "web_monitor": False}}).web_monitor
    for bad, text in (({**store, "web_monitor": "yes"}, "true or false"),
                      ({"role": "store", "address": "127.0.0.1:1", "web_monitor": True},
                       "launched store"),
                      ({"role": "source", "launch": "x {topic}", "web_monitor": True},
                       "launched store")):
        with pytest.raises(ProfileError, match=text):
            parse_profile({"iut": bad})
