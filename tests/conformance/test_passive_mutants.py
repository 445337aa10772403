"""The project's mutants seen passively: the capture of the active case that catches a mutant
(its evidence.pcap, tests/conformance/test_mutants.py) judged by ``ump conform --capture``
must fail the same rule, for every mutant whose fault is visible on the wire; the same case
run against the reference is judged without any failure.

The passive run is given what a user would give it: the IUT's configuration file that the
harness wrote (``lbm.cfg`` of a source or receiver as ``--source-config`` /
``--receiver-config``, ``store.xml`` of a store as ``--store-config``).  Which mutants are not
visible passively, and why, is in docs/passive.md.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conformance.model import Role, Verdict
from conformance.passive.judge import PassiveResult, judge, passive_cases
from conformance.passive.observe import observe
from conformance.profile import (
    REFERENCE_RECEIVER,
    REFERENCE_SOURCE,
    REFERENCE_STORE,
    IutProfile,
    parse_profile,
)
from conformance.runner import RunResult, run
from reference_impl.config.client import load_client_config
from reference_impl.config.store_xml import load_store_config
from wire.tshark import PortMap

HERE = Path(__file__).parent
STORE_MUTANT = HERE / "mutant_store.py"
CLIENT_MUTANT = HERE / "mutant_client.py"

STORE_SEEN = {
    # store mutant -> (the active case whose capture is judged, the passive case that fails)
    "grants-active-regid": ("REG-STORE-003", "REG-STORE-003"),
    "wrong-low-sqn": ("REG-STORE-010", "REG-STORE-010"),
    "ignores-rate-limit": ("REC-STORE-005", "REC-STORE-005"),
    "answers-unknown-regid": ("QRM-STORE-004", "QRM-STORE-004"),
    "acks-rpp-without-room": ("RPP-STORE-030", "RPP-STORE-030"),
    "answers-beyond-newest": ("OTR-STORE-001", "OTR-STORE-001"),
}

CLIENT_SEEN = {
    # source/receiver mutant -> (its role, the active case, the passive case that fails)
    "stale-store-version": ("source", "SRC-REG-008", "SRC-REG-008"),
    "ignores-flight-size": ("source", "SRC-REC-002", "SRC-REC-002"),
    "hasty-proactive": ("source", "SRC-PRX-001", "SRC-PRX-001"),
    "resends-with-timeout-zero": ("source", "SRC-PRX-002", "SRC-PRX-001"),
    "ignores-nack": ("source", "SRC-PRX-004", "SRC-PRX-004"),
    "ignores-outstanding-maximum": ("receiver", "RCV-REC-002", "RCV-REC-002"),
    "hasty-rerequest": ("receiver", "RCV-REC-003", "RCV-REC-003"),
    "ignores-lbtrm-naks": ("source", "SRC-LBTRM-001", "SRC-LBTRM-001"),
}
"""Mutants seen in their case's capture; those seen only in a demo capture are in
tests/conformance/test_passive.py (PASSIVE_CATCHES), and docs/passive.md lists the rest."""


def _store_profile(launch_script: list[str], name: str) -> IutProfile:
    return parse_profile({"iut": {
        "name": name, "role": "store", "launch": [*launch_script, "-c", "{config}",
                                                  "--profile", "{version}"],
        "ready": "ready to accept registrations", "web_monitor": True, "instances": 3}},
        f"<{name}>")


def _client_profile(launch_script: list[str], role: str, name: str) -> IutProfile:
    launch = [*launch_script, role, "-c", "{lbm_config}", "--topic", "{topic}",
              "--profile", "{version}"]
    launch += ["--count", "100000000", "--rate", "50", "--linger", "0"] if role == "source" \
        else ["--out", "{deliveries}"]
    iut: dict[str, object] = {"name": name, "role": role, "launch": launch,
                              "deregister_signal": "SIGUSR1"}
    if role == "source":
        iut.update(nonblocking_args=["--nonblocking"], would_block_text="would block")
    else:
        iut.update(explicit_ack_args=["--ack-file", "{acks}"],
                   consume_args=["--consume-file", "{acks}"])
    return parse_profile({"iut": iut}, f"<{name}>")


def judged_passively(result: RunResult, out: Path) -> list[PassiveResult]:
    """Each case's evidence.pcap of ``result`` judged passively, with the IUT's configuration
    files the harness wrote (every IUT work directory of the run: one case here)."""
    verdicts: list[PassiveResult] = []
    store = result.profile.role is Role.STORE
    for r in result.results:
        if r.pcap is None:
            continue
        obs = observe([r.pcap], PortMap(store_ports=list(r.store_ports)))
        for xml in sorted((out / "iut").glob("*/store.xml")):
            obs.store_config = load_store_config(xml)
        for cfg in [] if store else sorted((out / "iut").glob("*/lbm.cfg")):
            client = load_client_config(cfg)  # (a store IUT's lbm.cfg is its own)
            obs.source_options, obs.receiver_options = client.source, client.receiver
        verdicts += judge(obs, passive_cases())
    return verdicts


def _failing(results: list[PassiveResult], role: str = "") -> dict[str, list[str]]:
    """Case -> the messages of its failures (of entities of ``role`` only: "store",
    "source", "receiver"; the harness's own peers play some faults on purpose)."""
    out: dict[str, list[str]] = {}
    for r in results:
        words = r.entity.split()
        mine = not role or role in words[:1] or (words[:1] in (["LBT-RM"], ["LBT-RU"])
                                                  and role in words[1:2])
        if r.verdict is Verdict.FAIL and mine:
            out.setdefault(r.spec.id, []).append(r.message)
    return out


def _shown(results: list[PassiveResult]) -> list[tuple[str, str, str]]:
    return [(r.spec.id, r.verdict.value, r.message) for r in results
            if r.verdict is not Verdict.UNSUPPORTED]


@pytest.mark.parametrize("mutant", sorted(STORE_SEEN))
def test_a_store_mutant_is_seen_in_the_capture_of_its_case(mutant: str, tmp_path: Path) -> None:
    active, passive = STORE_SEEN[mutant]
    out = tmp_path / "out"
    result = run(_store_profile([sys.executable, str(STORE_MUTANT), mutant], mutant),
                 out, keywords=[active])
    results = judged_passively(result, out)
    failing = _failing(results)
    assert passive in failing, _shown(results)
    assert all(r.decided_by for r in results if r.verdict is Verdict.FAIL)


@pytest.mark.parametrize("mutant", sorted(CLIENT_SEEN))
def test_a_client_mutant_is_seen_in_the_capture_of_its_case(mutant: str,
                                                            tmp_path: Path) -> None:
    role, active, passive = CLIENT_SEEN[mutant]
    out = tmp_path / "out"
    profile = _client_profile([sys.executable, str(CLIENT_MUTANT), mutant], role, mutant)
    result = run(profile, out, keywords=[active])
    results = judged_passively(result, out)
    failing = _failing(results)
    assert passive in failing, _shown(results)
    assert all(r.decided_by for r in results if r.verdict is Verdict.FAIL)


REFERENCE = {"store": REFERENCE_STORE, "source": REFERENCE_SOURCE,
             "receiver": REFERENCE_RECEIVER}

REFERENCE_CASES = sorted({("store", a) for a, _ in STORE_SEEN.values()}
                         | {("store", "PRX-STORE-002")}  # judged, its mutant not seen
                         | {("store", "OTR-STORE-003")}  # its own OTR, answered by the source
                         | {(role, a) for role, a, _ in CLIENT_SEEN.values()})


@pytest.mark.parametrize(("role", "case_id"), REFERENCE_CASES)
def test_the_same_case_against_the_reference_is_judged_without_failure(
        role: str, case_id: str, tmp_path: Path) -> None:
    """The reference in each case above, judged passively with the same configuration files:
    no failure (the rules the mutants break are not read too strictly)."""
    out = tmp_path / "out"
    result = run(REFERENCE[role], out, keywords=[case_id])
    assert result.exit_code == 0, [(r.spec.id, r.verdict.value, r.message)
                                   for r in result.results]
    results = judged_passively(result, out)
    assert not _failing(results, role), _failing(results, role)
