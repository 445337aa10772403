"""The evidence of an active run judged passively (issue 21's "every conformance run against
the reference is judged all-pass"): each case's pcap, as ``ump conform --capture`` would.

The reference IUT must fail nothing.  The harness's own peers do break rules on purpose in a
few robustness and transport cases (that is what those cases probe), and the passive judges
rightly see it: :data:`DELIBERATE` lists each such (active case, passive case) pair with the
fault, so a new passive failure of a peer is looked at rather than waved through."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from conformance.model import Role, Verdict
from conformance.passive.judge import judge, passive_cases
from conformance.passive.observe import observe
from wire.tshark import PortMap

Failure = tuple[str, str, str, str]
"""(active case, failed passive case, entity, message)."""

DELIBERATE = {
    ("SRC-ROB-002", "PSV-STORE-001"): "the harness store refuses with an unknown error code",
    ("SRC-ROB-003", "PSV-STORE-002"): "the harness store acknowledges a number not yet sent",
    ("RCV-LBTRM-002", "SRC-LBTRM-001"): "the harness LBT-RM source leaves NAKs unanswered "
                                        "(the receiver's NAK backoff is judged)",
    ("RCV-LBTRM-004", "SRC-LBTRM-001"): "the harness LBT-RM source leaves NAKs unanswered",
    ("RCV-ROB-003", "OTR-STORE-001"): "the harness store retransmits what was not asked for",
}


def passive_failures(out: Path, cases: list[dict[str, Any]]) -> list[Failure]:
    """Every passive ``fail`` in the evidence of ``cases`` (rows of ``results.json``) that
    passed actively."""
    failures = []
    specs = passive_cases()  # the suites' cases with their passive judges, and PSV-*
    for case in cases:
        if case["verdict"] != "pass":
            continue
        stores = case["store_ports"] or [p for p in [case["store_port"]] if p]
        observed = observe([out / case["pcap"]], PortMap(store_ports=stores))
        failures += [(case["id"], r.spec.id, getattr(r, "entity", ""), r.message)
                     for r in judge(observed, specs) if r.verdict is Verdict.FAIL]
    return failures


def by_iut(failures: list[Failure], role: Role, cases: list[dict[str, Any]]) -> list[Failure]:
    """The failures whose entity is the IUT: the store on the case's store port for a store
    run, an entity of the IUT's kind (source, receiver) for a client run (the harness plays
    the other roles only)."""
    store_port = {c["id"]: c["store_port"] for c in cases}
    mine = []
    for failure in failures:
        kind = failure[2].split(" 127.0.0.1")[0]
        if role is Role.STORE:
            if kind == "store" and failure[2].endswith(f":{store_port[failure[0]]}"):
                mine.append(failure)
        elif role.value in kind:
            mine.append(failure)
    return mine
