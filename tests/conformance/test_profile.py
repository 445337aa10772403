"""IUT profiles and case selection: every mistake is one clear message naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.model import Role, all_cases
from conformance.profile import (
    BUILTIN_PROFILES,
    REFERENCE_RECEIVER,
    REFERENCE_SOURCE,
    REFERENCE_STORE,
    ProfileError,
    load_profile,
    parse_profile,
    resolve_profile,
)
from conformance.runner import select


def test_a_full_profile_parses() -> None:
    p = parse_profile({"iut": {"name": "acme", "role": "store", "version": "guide-5.3",
                               "launch": "acme-store --config {config} --port {port}",
                               "ready": "serving", "start_timeout": 5,
                               "stop_signal": "sigint"},
                       "cases": {"REG-STORE-002": {"skip": "no static RegIDs"},
                                 "REC-STORE-005": {"known_failure": "ACME-12"}}}, "acme.toml")
    assert p.role is Role.STORE and p.version == "guide-5.3" and p.launches
    assert p.launch == ("acme-store", "--config", "{config}", "--port", "{port}")
    assert p.expectation("REG-STORE-002").skip == "no static RegIDs"
    assert p.expectation("REC-STORE-005").known_failure == "ACME-12"
    assert p.expectation("REG-STORE-001").skip is None
    assert p.stop_signal.name == "SIGINT"
    assert p.deregister_signal is None
    source = parse_profile({"iut": {"role": "source", "launch": "s",
                                    "deregister_signal": "sigusr2"}}, "s.toml")
    assert source.deregister_signal is not None and source.deregister_signal.name == "SIGUSR2"


def test_pre53_version_and_the_rpp_topics_of_a_store_at_an_address() -> None:
    """``version = "pre-5.3"`` declares an IUT from before RPP (any role); a store reached at an
    address names its RPP and non-RPP topics (the rpp-matrix suite's 5.3 columns)."""
    for role in ("store", "source", "receiver"):
        assert parse_profile({"iut": {"role": role, "launch": "x", "version": "pre-5.3"}},
                             "p.toml").version == "pre-5.3"
    p = parse_profile({"iut": {"role": "store", "address": "10.0.0.5:14567",
                               "rpp_topic": "conform.rpp", "spp_topic": "conform.spp"}}, "p.toml")
    assert (p.rpp_topic, p.spp_topic) == ("conform.rpp", "conform.spp")
    plain = parse_profile({"iut": {"role": "store", "address": "h:1"}}, "p.toml")
    assert (plain.rpp_topic, plain.spp_topic) == (None, None)


@pytest.mark.parametrize("data, message", [
    ({}, "needs an [iut] table"),
    ({"iut": {"role": "broker", "address": "h:1"}}, "role must be one of"),
    ({"iut": {"role": "store"}}, "exactly one of launch"),
    ({"iut": {"role": "store", "launch": "x", "address": "h:1"}}, "exactly one of launch"),
    ({"iut": {"role": "store", "address": "nohost"}}, "host:port"),
    ({"iut": {"role": "store", "address": "h:70000"}}, "port 1-65535"),
    ({"iut": {"role": "store", "launch": "x {cfg}"}}, "unknown placeholder {cfg}"),
    ({"iut": {"role": "store", "launch": "x", "lanch": 1}}, "did you mean 'launch'"),
    ({"iut": {"role": "store", "launch": "x", "version": "7"}}, "version must be"),
    ({"iut": {"role": "store", "launch": "x", "stop_signal": "SIGNOPE"}}, "not a signal"),
    ({"iut": {"role": "store", "launch": "x"}, "cases": {"A": {"skip": "a",
                                                               "known_failure": "b"}}},
     "exactly one of skip or known_failure"),
    ({"iut": {"role": "store", "launch": "x"}, "cases": {"A": {"skp": "a"}}},
     "did you mean 'skip'"),
    ({"iut": {"role": "store", "launch": "x"}, "extra": {}}, "unknown key 'extra'"),
    ({"iut": {"role": "source", "address": "h:1"}}, "a source IUT needs launch"),
    ({"iut": {"role": "receiver", "launch": "r {delivered}"}}, "unknown placeholder {delivered}"),
    ({"iut": {"role": "source", "launch": "s", "deregister_signal": "USR9"}}, "not a signal"),
    ({"iut": {"role": "store", "launch": "x", "deregister_signal": "SIGUSR1"}},
     "for a source or receiver"),
    ({"iut": {"role": "store", "launch": "x", "rpp_topic": "a"}},
     "rpp_topic is for a store IUT reached at an address"),
    ({"iut": {"role": "source", "launch": "x", "spp_topic": "a"}},
     "spp_topic is for a store IUT reached at an address"),
    ({"iut": {"role": "store", "address": "h:1", "rpp_topic": " a"}}, "topic name prefix"),
    ({"iut": {"role": "store", "address": "h:1", "spp_topic": 3}}, "topic name prefix"),
    ({"iut": {"role": "store", "address": "h:1", "rpp_topic": "a", "spp_topic": "a"}},
     "must differ"),
    ({"iut": {"role": "store", "address": "h:1", "rpp_topc": "a"}}, "did you mean 'rpp_topic'"),
])
def test_profile_mistakes_are_named(data: dict[str, object], message: str) -> None:
    with pytest.raises(ProfileError, match=message.replace("[", r"\[").replace("{", r"\{")):
        parse_profile(data, "p.toml")


def test_load_profile_reports_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="cannot read"):
        load_profile(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[iut\nrole=")
    with pytest.raises(ProfileError, match="not valid TOML"):
        load_profile(bad)


def test_reference_profile_launches_the_reference_store() -> None:
    assert REFERENCE_STORE.role is Role.STORE and REFERENCE_STORE.launch is not None
    assert "{config}" in REFERENCE_STORE.launch and "{version}" in REFERENCE_STORE.launch


def test_builtin_profiles_launch_the_reference_source_and_receiver(tmp_path: Path) -> None:
    assert resolve_profile(None) is REFERENCE_STORE
    assert resolve_profile("default") is REFERENCE_STORE
    assert resolve_profile("source") is REFERENCE_SOURCE
    assert resolve_profile("receiver") is REFERENCE_RECEIVER
    assert REFERENCE_SOURCE.role is Role.SOURCE and REFERENCE_RECEIVER.role is Role.RECEIVER
    assert REFERENCE_SOURCE.launch and "{lbm_config}" in REFERENCE_SOURCE.launch
    assert REFERENCE_RECEIVER.launch and "{deliveries}" in REFERENCE_RECEIVER.launch
    assert {p.role for p in BUILTIN_PROFILES.values()} == set(Role)
    with pytest.raises(ProfileError, match="did you mean 'receiver'"):
        resolve_profile("recevier")
    own = tmp_path / "source"  # a file wins over the built-in name of the same spelling
    own.write_text('[iut]\nrole = "source"\nname = "mine"\nlaunch = "x {topic}"\n')
    assert resolve_profile(str(own)).name == "mine"


def test_every_case_has_a_stable_id_a_section_and_a_requirement() -> None:
    cases = all_cases()
    assert len({c.id for c in cases}) == len(cases) >= 40
    prefixes = {Role.STORE: {"REG", "REC", "ROB", "PRX", "DUR", "RPP", "MTX", "QRM", "PXY",
                             "OTR"},
                Role.SOURCE: {"SRC"},
                Role.RECEIVER: {"RCV"}}
    for c in cases:
        assert c.section and len(c.requirement) > 20 and c.title
        assert c.id.split("-")[0] in prefixes[c.role], c.id
    for role in Role:
        assert all(c.role is role for c in all_cases(role))
        assert len(all_cases(role)) >= 9


def test_selection_by_suite_and_keywords() -> None:
    cases = all_cases()
    reg = select(cases, suites=["registration"])
    assert reg and all(c.suite == "registration" for c in reg)
    assert [c.id for c in select(cases, keywords=["REG-STORE-003"])] == ["REG-STORE-003"]
    some = select(cases, keywords=["session and not receiver"])
    assert some and all("session" in (c.id + c.title).lower() for c in some)
    assert all("receiver" not in (c.id + c.title + c.suite).lower() for c in some)
    either = select(cases, keywords=["REG-STORE-001 or REC-STORE-001"])
    assert [c.id for c in either] == ["REC-STORE-001", "REG-STORE-001"]
