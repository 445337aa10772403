"""tshark (the oracle) reads the proxy-source election traffic as our codec writes it (issue 20).

Two captures: a simulator run of a real election between three reference stores (the source's
PREGs with ``ume_proxy_src``, the stores' claims - PREG with the P flag, ``ume_pser``,
``ume_psrc_election_token`` - under jitter, so several stores claim; then the winner's topic
advertisement and SRI to a late receiver), and hand-built claims with
edge values (token 0xFFFFFFFF, store index 255, re-election flag, RegID 0).  Each must dissect
with no disagreement in any field, no malformed frame and no error (docs/wire-lbmc.md §2.1:
ume_proxy_src, ume_pser, ume_psrc_election_token).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from reference_impl.deployment import STORE_PORT
from reference_impl.proxy import Claim, SourceKey, encode_claim, encode_support
from tests.reference_impl import test_proxy_scenarios as scenario
from tests.wire.test_lbmc_oracle import Capture, assert_clean, run_oracle
from wire.dissect import check_against_tshark, dissect_file
from wire.lbmc import parse_message
from wire.tshark import PortMap

pytestmark = pytest.mark.oracle


def test_a_simulated_election_dissects_identically_in_tshark(tmp_path: Path) -> None:
    d, _ = scenario.deployment(1)
    d.kill("src")
    d.run(scenario.SETTLE)
    assert len(scenario.holders(d)) == 1
    made = sum(len(scenario.created(d, n)) for n in scenario.NAMES)
    late = d.add_receiver("late", scenario.TOPIC)  # the proxy's TIR and SRI in the capture
    d.run(3.0)
    assert late.complete
    pcap = tmp_path / "proxy-election.pcap"
    d.write_pcap(pcap)
    portmap = PortMap(store_ports=[STORE_PORT])
    reports = list(dissect_file(pcap, portmap))
    assert all(r.status in ("um", "not-um") for r in reports), \
        [(r.number, r.status, r.reason) for r in reports if r.status not in ("um", "not-um")]
    names = [{name for name, _ in o.fields} for r in reports for o in r.occurrences]
    claims = [n for n in names if "lbmc.ume_psrc_election_token.token" in n]
    assert len(claims) >= 2 * made  # each proxy claims at both other stores (winners again)
    assert all("lbmc.ume_pser.source_ip" in n for n in claims)
    asks = [n for n in names if "lbmc.ume_proxy_src.flags.enable" in n]
    assert len(asks) >= 3  # the source's PREG at each store
    proxy_tirs = [n for r in reports for o in r.occurrences
                   for n in [dict(o.fields)] if n.get("lbmr.topt.ume.src_tcp_port")
                   == scenario.PROXY_PORT]
    assert proxy_tirs  # the proxy advertised the topic on its own port
    assert any("lbmc.sri.high_sqn" in n for n in names)
    assert check_against_tshark(pcap, reports, portmap) == []


CLAIMS = [
    Claim(SourceKey("10.0.0.9", 14391, 1, 0), ("10.0.0.2", STORE_PORT), 0, 1),
    Claim(SourceKey("192.168.1.20", 65535, 0xFFFFFFFF, 0xFFFFFFFF), ("10.0.0.3", 1), 255,
          0xFFFFFFFF, reelect=True, reg_id=0xFFFFFFFF),
    Claim(SourceKey("0.0.0.0", 0, 0, 0), ("255.255.255.255", 65535), 7, 0x80000000,
          reelect=False, reg_id=0),
]


def test_hand_built_claims_match_tshark_field_by_field(tmp_path: Path) -> None:
    capture = Capture()
    for claim in CLAIMS:
        data = encode_claim(claim)
        message, _ = parse_message(data)
        capture.send(data, [message])
    assert_clean(run_oracle(capture, tmp_path / "claims.pcap"), capture)


def test_supports_match_tshark_field_by_field(tmp_path: Path) -> None:
    """A store's support of a claim (``proxy-source-repo-quorum-required``: PREG_RESP + PSER +
    PSRC-ETOK, reference_impl/proxy.py module docstring 7) dissects like a claim does."""
    capture = Capture()
    for claim in CLAIMS:
        data = encode_support(claim)
        message, _ = parse_message(data)
        capture.send(data, [message])
    assert_clean(run_oracle(capture, tmp_path / "supports.pcap"), capture)


def test_a_quorum_required_election_dissects_identically_in_tshark(tmp_path: Path) -> None:
    from tests.reference_impl.test_proxy_quorum import group_of_three, holders

    d, cores = group_of_three(2, registered=2, quorum_required=True)
    assert len(holders(cores)) == 1
    pcap = tmp_path / "proxy-quorum.pcap"
    d.write_pcap(pcap)
    portmap = PortMap(store_ports=[STORE_PORT])
    reports = list(dissect_file(pcap, portmap))
    names = [{name for name, _ in o.fields} for r in reports for o in r.occurrences]
    supports = [n for n in names if "lbmc.ume_psrc_election_token.token" in n
                and "lbmc.ume_preg_resp.reg_id" in n]
    assert supports  # the follower holding the state supported the claim
    assert check_against_tshark(pcap, reports, portmap) == []
