"""The harness tests itself: each deliberately faulty IUT must fail a MUST case.

The mutants live in :mod:`tests.conformance.mutant_store` (stores) and
:mod:`tests.conformance.mutant_client` (sources and receivers); each is the reference
implementation with one behaviour broken.  A profile launches the mutant like any third-party
IUT, and the case holding the broken behaviour must fail (the run ending with exit code 1).
Store mutants run their whole suite, except the receiver-paced persistence ones, which run the
catching case only (the rpp suite has some forty cases, each starting a store); source and
receiver mutants (a fresh process per case) run just the catching case, which keeps the test
short.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance.model import Strength, Verdict
from conformance.profile import parse_profile
from conformance.runner import run

MUTANT = Path(__file__).with_name("mutant_store.py")
CLIENT_MUTANT = Path(__file__).with_name("mutant_client.py")

# mutant -> (suite to run, the case that must catch it)
CATCHES = {
    "grants-active-regid": ("registration", "REG-STORE-003"),
    "forgets-old-flag": ("registration", "REG-STORE-004"),
    "wrong-low-sqn": ("registration", "REG-STORE-010"),
    "ignores-rate-limit": ("recovery", "REC-STORE-005"),
    "drops-duplicate": ("proactive-retransmit", "PRX-STORE-002"),
    "acks-before-writing": ("durability", "DUR-STORE-001"),
    # receiver-paced persistence: the catching case alone (see the module docstring)
    "grants-rpp-not-allowed": ("rpp", "RPP-STORE-042"),
    "releases-on-any-ack": ("rpp", "RPP-STORE-036"),
    "ignores-override-maximum": ("rpp", "RPP-STORE-001"),
    "ignores-consistency": ("rpp", "RPP-STORE-010"),
    "accepts-changed-rpp-values": ("rpp", "RPP-STORE-015"),
    "acks-rpp-without-room": ("rpp", "RPP-STORE-030"),
    "writes-despite-consumed": ("rpp", "RPP-STORE-035"),
    "blocking-is-non-blocking": ("rpp", "RPP-STORE-037"),
    "late-receiver-gets-history": ("rpp", "RPP-STORE-038"),
    "forgets-early-exiter": ("rpp", "RPP-STORE-039"),
    "keeps-deregistered-receiver": ("rpp", "RPP-STORE-040"),
    "keeps-deregistered-source-messages": ("rpp", "RPP-STORE-041"),
    # receiver activity timeout, state lifetime, unknown RegIDs (issue 18)
    "receivers-never-time-out": ("quorum", "QRM-STORE-001"),
    "store-value-ignored": ("quorum", "QRM-STORE-003"),
    "answers-unknown-regid": ("quorum", "QRM-STORE-004"),
    "acks-are-not-activity": ("quorum", "QRM-STORE-005"),
    "client-timeout-ignored": ("quorum", "QRM-STORE-006"),
    # off-transport recovery (issue 20)
    "answers-beyond-newest": ("otr", "OTR-STORE-001"),
    "serves-only-registration-history": ("otr", "OTR-STORE-002"),
    "store-otr-never-asked": ("otr", "OTR-STORE-003"),
    # proxy sources: a group of three instances (profile 'instances', issue 20)
    "proxy-never-elected": ("proxy", "PXY-STORE-001"),
    "two-proxies": ("proxy", "PXY-STORE-002"),
    "proxy-without-allow": ("proxy", "PXY-STORE-007"),
    "ignores-repo-quorum": ("proxy", "PXY-STORE-009"),
    "proxy-sends-without-quorum": ("proxy", "PXY-STORE-006"),
    "accepts-forged-claims": ("proxy", "PXY-STORE-008"),
    "proxy-ignores-sri": ("proxy", "PXY-STORE-003"),
    "proxy-outlives-source": ("proxy", "PXY-STORE-004"),
    "no-reelection": ("proxy", "PXY-STORE-005"),
}

ALSO_CAUGHT = {"store-otr-never-asked": {"OTR-STORE-004"}}
"""Further cases of the mutant's suite that must fail too (the same rule on another
transport: OTR-STORE-003 judges the store's own OTR on LBT-RU, 004 on LBT-RM)."""

CLIENT_VERSION = {"pre53-sets-rpp-flag": "pre-5.3"}
"""Client mutants that must run under a profile version other than the default."""

# source/receiver mutant -> (its role, the case that must catch it)
CLIENT_CATCHES = {
    "ignores-store-sqn": ("source", "SRC-REG-003"),
    "sends-before-quorum": ("source", "SRC-REG-004"),
    "counts-refused-store": ("source", "SRC-REG-005"),
    "ignores-sri-request": ("source", "SRC-REG-007"),
    "stale-store-version": ("source", "SRC-REG-008"),
    "cumulative-stability": ("source", "SRC-REC-001"),
    "ignores-flight-size": ("source", "SRC-REC-002"),
    "counts-any-ack": ("source", "SRC-ROB-003"),
    "deregisters-from-one-store": ("source", "SRC-REG-009"),
    "flight-bytes-count-headers": ("source", "SRC-FLT-002"),
    "bytes-replace-count": ("source", "SRC-FLT-003"),
    "notify-blocks": ("source", "SRC-FLT-004"),
    "stable-in-any-group": ("source", "SRC-FLT-005"),
    "stable-with-one-store": ("source", "SRC-FLT-007"),
    "ignores-confirmations": ("source", "SRC-FLT-006"),
    "hasty-proactive": ("source", "SRC-PRX-001"),
    "resends-with-timeout-zero": ("source", "SRC-PRX-002"),
    "resends-forever": ("source", "SRC-PRX-003"),
    "ignores-nack": ("source", "SRC-PRX-004"),
    "flight-counts-fragments": ("source", "SRC-FLT-008"),
    "no-sri-request": ("receiver", "RCV-REG-001"),
    "ignores-low-sqn": ("receiver", "RCV-REG-004"),
    "never-rxreq": ("receiver", "RCV-REC-001"),
    "ignores-outstanding-maximum": ("receiver", "RCV-REC-002"),
    "hasty-rerequest": ("receiver", "RCV-REC-003"),
    "no-consumption-ack": ("receiver", "RCV-REC-005"),
    "delivers-unrequested-rx": ("receiver", "RCV-ROB-003"),
    "source-omits-overrides": ("source", "SRC-RPP-001"),
    "source-ignores-rpp-ack": ("source", "SRC-MTX-002"),
    "pre53-sets-rpp-flag": ("source", "SRC-MTX-001"),
    "receiver-ignores-rpp-ack": ("receiver", "RCV-MTX-002"),
    "receiver-nonblocking-as-blocking": ("receiver", "RCV-RPP-002"),
    "receiver-acks-after-deregistration": ("receiver", "RCV-RPP-003"),
    "nonblocking-waits": ("source", "SRC-FLT-009"),
}
CLIENT_CATCHES |= {  # the quorum suite, receiver IUT
    "receiver-majority-over-all-stores": ("receiver", "RCV-QRM-001"),
    "receiver-ignores-consensus-behavior": ("receiver", "RCV-QRM-002"),
    "receiver-ignores-intergroup": ("receiver", "RCV-QRM-004"),
    "reregisters-with-unchanged-store": ("receiver", "RCV-QRM-006"),
    "never-retries-other-store": ("receiver", "RCV-QRM-007"),
    "ignores-message-timeout": ("receiver", "RCV-QRM-008"),
    "ignores-rx-maximum": ("receiver", "RCV-QRM-009"),
    "acks-before-app": ("receiver", "RCV-QRM-010"),
    "acks-out-of-order": ("receiver", "RCV-QRM-011"),
    "confirms-unasked": ("receiver", "RCV-QRM-012"),
    "ignores-allow-confirmed-delivery": ("receiver", "RCV-QRM-013"),
    "acks-unbatched": ("receiver", "RCV-QRM-015"),
    "acks-highest-consumed": ("receiver", "RCV-QRM-016"),
    # quorum/consensus, source (issue 18)
    "registers-with-any-group": ("source", "SRC-QRM-002"),
    "majority-of-groups-as-half": ("source", "SRC-QRM-003"),
    "all-active-registers-as-any": ("source", "SRC-QRM-004"),
    "intragroup-all-registers-at-quorum": ("source", "SRC-QRM-005"),
    "all-active-registers-as-all": ("source", "SRC-QRM-006"),
    "majority-stability-as-any": ("source", "SRC-QRM-007"),
    "all-active-stability-as-any": ("source", "SRC-QRM-008"),
    "intragroup-all-active-as-quorum": ("source", "SRC-QRM-009"),
    "intragroup-all-active-as-all": ("source", "SRC-QRM-010"),
    "intragroup-all-stable-at-quorum": ("source", "SRC-QRM-011"),
    "majority-over-all-stores": ("source", "SRC-QRM-012"),
    "consensus-lowest-as-highest": ("source", "SRC-QRM-013"),
    "consensus-highest-as-majority": ("source", "SRC-QRM-014"),
    "ignores-store-timeout": ("source", "SRC-QRM-015"),
    "sends-after-quorum-lost": ("source", "SRC-QRM-016"),
    "returning-store-not-resent": ("source", "SRC-QRM-017"),
    "all-active-waits-for-lost-store": ("source", "SRC-QRM-018"),
    "all-stability-as-any": ("source", "SRC-QRM-019"),
    "all-stability-as-majority": ("source", "SRC-QRM-019"),
}
CLIENT_CATCHES |= {  # the lbt-rm suite: a receiver's and a source's LBT-RM (issue 20)
    "naks-at-once": ("receiver", "RCV-LBTRM-001"),
    "naks-not-backed-off": ("receiver", "RCV-LBTRM-002"),
    "ncf-ignored": ("receiver", "RCV-LBTRM-003"),
    "naks-forever": ("receiver", "RCV-LBTRM-004"),
    "retries-after-do-not-retry": ("receiver", "RCV-LBTRM-005"),
    "ignores-lbtrm-naks": ("source", "SRC-LBTRM-001"),
    "retransmits-every-nak": ("source", "SRC-LBTRM-002"),
    "no-session-messages": ("source", "SRC-LBTRM-003"),
    "hasty-session-messages": ("source", "SRC-LBTRM-003"),
}
CLIENT_CATCHES |= {  # the otr suite: off-transport recovery, receiver IUT (issue 20)
    "otr-never-asked": ("receiver", "RCV-OTR-001"),
    "otr-unflagged": ("receiver", "RCV-OTR-001"),
    "otr-asks-at-once": ("receiver", "RCV-OTR-002"),
    "otr-when-off": ("receiver", "RCV-OTR-003"),
    "otr-never-asks-source": ("receiver", "RCV-OTR-004"),
}


@pytest.mark.parametrize("mutant", sorted(CATCHES))
def test_every_mutant_is_caught(mutant: str, tmp_path: Path) -> None:
    suite, catcher = CATCHES[mutant]
    profile = parse_profile({"iut": {
        "name": f"mutant {mutant}", "role": "store",
        "launch": [sys.executable, str(MUTANT), mutant, "-c", "{config}",
                   "--profile", "{version}"],
        "ready": "ready to accept registrations",
        "web_monitor": True, "instances": 3}}, f"<mutant {mutant}>")  # as the reference's
    # the catching cases only: each case sets up what it judges (a parallel run gives each its
    # own IUT), so the rest of the suite would only add minutes to the default test run
    named = {catcher, *ALSO_CAUGHT.get(mutant, set())}
    result = run(profile, tmp_path / "out", suites=[suite], keywords=[" or ".join(sorted(named))])
    assert {r.spec.id for r in result.results} == named
    failed = {r.spec.id for r in result.results
              if r.verdict is Verdict.FAIL and r.spec.strength is Strength.MUST}
    errors = [(r.spec.id, r.message) for r in result.results if r.verdict is Verdict.ERROR]
    assert errors == []
    assert catcher in failed, [(r.spec.id, r.verdict.value, r.message) for r in result.results]
    assert ALSO_CAUGHT.get(mutant, set()) <= failed, sorted(failed)
    assert result.exit_code == 1


def test_every_store_mutant_is_known() -> None:
    sys.path.insert(0, str(MUTANT.parent))
    try:
        from mutant_store import MUTANTS
    finally:
        sys.path.remove(str(MUTANT.parent))
    assert set(MUTANTS) == set(CATCHES)


def test_every_client_mutant_is_known() -> None:
    sys.path.insert(0, str(CLIENT_MUTANT.parent))
    try:
        from mutant_client import MUTANTS
    finally:
        sys.path.remove(str(CLIENT_MUTANT.parent))
    assert {name: role for name, (role, _) in MUTANTS.items()} == \
        {name: role for name, (role, _) in CLIENT_CATCHES.items()}


SHOULD_CATCHERS = {"RCV-QRM-004", "RCV-OTR-003"}
"""Cases that catch a client mutant with a SHOULD failure (see conformance/suites/
quorum_receiver.py: receivers read the group options in their own scope by the reference's
choice)."""


@pytest.mark.parametrize("mutant", sorted(CLIENT_CATCHES))
def test_every_source_and_receiver_mutant_is_caught(mutant: str, tmp_path: Path) -> None:
    role, catcher = CLIENT_CATCHES[mutant]
    launch = [sys.executable, str(CLIENT_MUTANT), mutant, role, "-c", "{lbm_config}",
              "--topic", "{topic}", "--profile", "{version}"]
    launch += ["--count", "100000000", "--rate", "50", "--linger", "0"] if role == "source" \
        else ["--out", "{deliveries}"]
    iut: dict[str, object] = {"name": f"mutant {mutant}", "role": role, "launch": launch,
                              "deregister_signal": "SIGUSR1"}  # as the reference profiles say
    if role == "source":  # non-blocking sends, as the reference source profile says
        iut.update(nonblocking_args=["--nonblocking"], would_block_text="would block")
    else:  # explicit ACKs and consumption from the harness, as the reference profile says
        iut.update(explicit_ack_args=["--ack-file", "{acks}"],
                   consume_args=["--consume-file", "{acks}"])
    if mutant in CLIENT_VERSION:
        iut["version"] = CLIENT_VERSION[mutant]
    profile = parse_profile({"iut": iut}, f"<mutant {mutant}>")
    result = run(profile, tmp_path / "out", keywords=[catcher])
    assert [r.spec.id for r in result.results] == [catcher]
    (only,) = result.results
    assert only.verdict is Verdict.FAIL, (only.verdict.value, only.message)
    # a SHOULD case's failure is reported but does not fail the run (RCV-QRM-004: the
    # receiver-scoped group options are the reference's reading, not a sentence of the guide)
    assert only.spec.strength is (Strength.SHOULD if catcher in SHOULD_CATCHERS
                                  else Strength.MUST)
    assert result.exit_code == (0 if catcher in SHOULD_CATCHERS else 1)


CLIENT_ALSO_CAUGHT = {"otr-never-asks-source": "RCV-OTR-005"}
"""Client mutants a second case must catch too: the same rule reached another way (RCV-OTR-004
judges a streaming source's OTR after an LBT-TCP gap, 005 after an LBT-RM 'Do not retry')."""


@pytest.mark.parametrize("mutant", sorted(CLIENT_ALSO_CAUGHT))
def test_a_client_mutant_is_caught_by_its_second_case(mutant: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    role, _ = CLIENT_CATCHES[mutant]
    monkeypatch.setitem(CLIENT_CATCHES, mutant, (role, CLIENT_ALSO_CAUGHT[mutant]))
    test_every_source_and_receiver_mutant_is_caught(mutant, tmp_path)
