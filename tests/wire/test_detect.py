"""The one UM detector (:mod:`wire.detect`): port rules, content rules, options, false positives.

Agreement of ``ump dissect`` and ``ump analyze`` frame by frame is
tests/spark_analysis/test_detector_agreement.py; here the rules themselves.
"""

from __future__ import annotations

import json
import random
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import wire.lbmr as L
from wire import detect, lbtrm, lbtru
from wire.detect import CONTENT, PORT, Detection, Detector, content_protocol
from wire.dissect import Dissector, content_ports
from wire.lbmc import LbmcMessage, MessageType
from wire.pcap import (
    CaptureRecord,
    Segment,
    decode_frame,
    ipv4_frame,
    read_capture,
    tcp_frame,
    udp_frame,
    write_pcap,
)
from wire.tshark import PortMap, read_frames

CORPUS = Path(__file__).resolve().parents[2] / "captures" / "corpus"
SRC = "10.0.0.1"


def seg(dst: str, dport: int, payload: bytes, sport: int = 40000) -> Segment:
    return decode_frame(1, udp_frame(SRC, sport, dst, dport, payload))


def message(sqn: int) -> LbmcMessage:
    return LbmcMessage(type=MessageType.MESSAGE, tidx=1, sqn=sqn, payload=b"hello")


def rm_data(sqn: int = 1) -> bytes:
    return lbtrm.LbtrmData(ucast_port=14390, session_id=7, sqn=sqn, trail_sqn=0,
                           payload=[message(sqn)]).build()


def rm_nak() -> bytes:
    return lbtrm.LbtrmNak(naks=[3, 4], ucast_port=14390, session_id=7).build()


def lbmr_v1() -> bytes:
    """A version-1 LBMR packet with packet options, as UM gateways and current UM send."""
    return L.LbmrPacket(version=1, tirs=[L.Tir(
        name="ume.test.topic", ttl=1, index=1,
        info=L.LbtruSidInfo(ip="127.0.0.1", session_id=0x1234, port=14380),
        options=[L.ToptUme(store=1, store_tcp_port=14567, store_tcp_addr="127.0.0.1",
                           src_reg_id=1000)])],
        options=[L.OptLen(), L.OptVersion(version=0x60000, ume=1)]).build()


def icmp_quoting(frame: bytes, kind: tuple[int, int] = (3, 3)) -> bytes:
    """An ICMP error (default: port unreachable) from the frame's destination, quoting the
    frame's IPv4 datagram whole."""
    src, dst = frame[26:30], frame[30:34]
    dotted = [".".join(str(b) for b in a) for a in (dst, src)]
    return ipv4_frame(dotted[0], dotted[1], 1, bytes([*kind, 0, 0, 0, 0, 0, 0]) + frame[14:])


def real_trait_frames() -> list[bytes]:
    """What real deployments show and the generated corpus does not (yet): LBT-RM on a
    site's own group and ports, NAKs bounced as ICMP port unreachable, LBMR version 1 with
    options on a non-default port, an 802.3/LLC frame (spanning tree)."""
    data = lbtrm.LbtrmData(ucast_port=34567, session_id=7, sqn=1, trail_sqn=0, payload=[
        LbmcMessage(type=MessageType.MESSAGE, tidx=1, sqn=1, payload=b"x")]).build()
    nak = lbtrm.LbtrmNak(naks=[3, 4], ucast_port=34567, session_id=7).build()
    lbmr_v1 = L.LbmrPacket(version=1, tirs=[L.Tir(
        name="t", ttl=1, index=1, info=L.LbtruSidInfo(ip="10.0.0.1", session_id=9, port=1))],
        options=[L.OptLen(), L.OptVersion(version=0x60000, ume=1)]).build()
    nak_frame = udp_frame("10.0.0.2", 40001, "10.0.0.1", 34567, nak)
    default_nak = udp_frame("10.0.0.2", 40001, "10.0.0.1", 14390, nak)
    stp = (bytes.fromhex("0180c2000000") + bytes(6) + struct.pack(">H", 38)
           + bytes.fromhex("424203") + bytes(35))
    return [udp_frame("10.0.0.1", 50000, "239.192.1.1", 12001, data), nak_frame,
            icmp_quoting(nak_frame), icmp_quoting(default_nak),
            icmp_quoting(udp_frame("10.0.0.2", 1, "10.0.0.1", 2, b"junk")),
            udp_frame("10.0.0.1", 50001, "239.255.0.1", 5000, lbmr_v1), stp]


# --- port rules (tshark's) and content rules ------------------------------------------------------


def test_lbtrm_in_tsharks_ranges_is_found_by_port() -> None:
    assert Detector().udp(seg("224.10.10.10", 14400, rm_data())) == Detection("lbtrm", PORT)
    assert Detector().udp(seg("10.0.0.2", 14395, rm_nak())) == Detection("lbtrm", PORT)


def test_one_detector_answers_each_datagram_as_a_fresh_one_would(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The detector remembers its port-rule answers per port pair; the LBT-RM rule also reads
    the header, so the same ports carry LBT-RM, then not, then LBT-RM again (and a full memory
    starts again without a wrong answer)."""
    detector = Detector(content=False)
    datagrams = [seg("224.10.10.10", 14400, p) for p in (rm_data(), b"junk" * 8, rm_data(2))]
    datagrams += [seg("10.0.0.2", 14395, rm_nak()), seg("10.0.0.2", 14395, b"\xff" * 30)]
    for s in datagrams * 2:
        assert detector.udp(s) == Detector(content=False).udp(s)
    assert [detector.udp(s) is not None for s in datagrams] == [True, False, True, True, False]
    monkeypatch.setattr(detect, "CACHED", 3)  # a small memory, filled again and again
    tcp = decode_frame(1, tcp_frame(SRC, 14371, "10.0.0.2", 50000, 1, 0, 0x18, b"x"))
    for dport in range(50000, 50010):
        other = decode_frame(1, tcp_frame(SRC, 50001, "10.0.0.2", dport, 1, 0, 0x18, b"x"))
        assert detector.tcp(tcp) and not detector.tcp(other)
        assert len(detector._tcp) <= 3
    for s in datagrams * 2:
        assert detector.udp(s) == Detector(content=False).udp(s)


def test_lbtrm_anywhere_else_is_found_by_content_unless_content_is_off() -> None:
    """Real deployments use their own groups and ports: tshark needs preferences, the
    detector finds it by content; with the content rules off it behaves like tshark."""
    for s in (seg("239.192.1.1", 12001, rm_data()), seg("10.0.0.2", 34567, rm_nak())):
        assert Detector().udp(s) == Detection("lbtrm", CONTENT)
        assert Detector(content=False).udp(s) is None


def test_options_move_the_port_rules() -> None:
    ports = PortMap(lbtrm_mc_range=("239.192.0.0", "239.192.255.255"), lbtrm_dport=(12000, 12100))
    assert Detector(ports, content=False).udp(seg("239.192.1.1", 12001, rm_data())) == \
        Detection("lbtrm", PORT)
    assert Detector(ports, content=False).udp(seg("239.193.1.1", 12001, rm_data())) is None
    assert Detector(PortMap(lbtrm_sport=(34000, 35000)), content=False).udp(
        seg("10.0.0.2", 34567, rm_nak())) == Detection("lbtrm", PORT)
    assert Detector(PortMap(lbmr_mc=("239.255.0.1", 5000)), content=False).udp(
        seg("239.255.0.1", 5000, b"\x00" * 4)) == Detection("lbmr", PORT)


def test_lbmr_version_1_with_options_is_found_by_content() -> None:
    """The issue's case: topic resolution on a non-default port, version 1 with options."""
    raw = lbmr_v1()
    assert raw[0] >> 4 == 1 and raw[0] & L.OPTS_FLAG
    assert content_protocol(raw) == "lbmr"
    assert Detector().udp(seg("239.255.0.1", 5000, raw)) == Detection("lbmr", CONTENT)


@pytest.mark.parametrize("version", [2, 15])
def test_lbmr_other_versions_are_not_claimed_by_content(version: int) -> None:
    raw = bytearray(lbmr_v1())
    raw[0] = (raw[0] & 0x0F) | (version << 4)
    assert content_protocol(bytes(raw)) is None


def test_lbtru_is_found_by_content() -> None:
    raw = lbtru.LbtruData(sqn=5, trail_sqn=0, options=[lbtru.SidOption(session_id=9)],
                          payload=[message(5)]).build()
    assert content_protocol(raw) == "lbtru"
    assert Detector().udp(seg("10.0.0.2", 5555, raw)) == Detection("lbtru", CONTENT)


def test_lbtru_header_word_must_hold_only_defined_bits() -> None:
    """A 16-byte SM has nothing else to check: its flags word must be SYN or nothing (the
    random payload below, once the commonest false positive, is refused), a reserved word
    zero."""
    sm = lbtru.LbtruSm(sm_sqn=1, lead_sqn=2, syn=1).build()
    assert content_protocol(sm) == "lbtru"
    assert content_protocol(sm[:3] + b"\x01" + sm[4:]) is None
    assert content_protocol(bytes.fromhex("0200a466789bebab9ba5ead449ae032a")) is None
    ack = lbtru.LbtruAck(ack_sqn=5).build()
    assert content_protocol(ack) == "lbtru"
    assert content_protocol(ack[:2] + b"\x00\x10" + ack[4:]) is None


def test_a_content_guess_needs_a_clean_decode() -> None:
    """Left-over bytes, an empty NAK list, a cut LBMC message: not claimed by content."""
    assert content_protocol(rm_data() + b"\x00") is None
    assert content_protocol(rm_data()[:-1]) is None
    assert content_protocol(lbtrm.LbtrmNak(naks=[]).build()) is None
    assert content_protocol(L.LbmrPacket().build()) is None  # a 4-byte keepalive
    assert content_protocol(lbmr_v1() + b"\x00") is None


def test_tcp_is_found_by_port_rules_only() -> None:
    det = Detector(PortMap(store_ports=[14567]))
    frame = decode_frame(1, tcp_frame(SRC, 50000, "10.0.0.2", 14567, 1, 1, 0x18, b"abc"))
    assert det.segment(frame) == Detection("lbttcp", PORT)
    assert Detector().segment(frame) is None


# --- false positives ---------------------------------------------------------------------


def test_no_frame_of_the_not_um_corpus_capture_is_um() -> None:
    """captures/corpus/not-um.pcap (ARP, HTTP, DNS, junk on an LBT-RM port): nothing claimed,
    with or without the content rules (the figure in docs/wire-transports.md)."""
    reports = list(Dissector().run(read_capture(CORPUS / "not-um.pcap")))
    assert reports and not [r for r in reports if r.transport is not None]


def test_random_datagrams_are_not_claimed_by_content() -> None:
    """False positives on noise: 20,000 random payloads of 1-1,400 bytes, plus 20,000 with a
    plausible first byte for each protocol (the weakest spot): none decodes cleanly."""
    rng = random.Random(19)
    claimed = []
    for i in range(40_000):
        payload = bytearray(rng.randbytes(rng.randint(1, 1400)))
        if i % 2:
            payload[0] = rng.choice([0x00, 0x02, 0x03, 0x04, 0x10, 0x11, 0x18, 0x06])
        if content_protocol(bytes(payload)) is not None:
            claimed.append(bytes(payload[:16]).hex())
    assert not claimed


# --- the command line --------------------------------------------------------------------


def ump(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ump", *args], capture_output=True, text=True,
                          timeout=300, check=False)


def test_dissect_finds_lbtrm_on_other_ports_by_content_and_by_option(tmp_path: Path) -> None:
    path = tmp_path / "rm.pcap"
    write_pcap(path, [udp_frame(SRC, 40000, "239.192.1.1", 12001, rm_data(1)),
                      udp_frame("10.0.0.2", 40001, SRC, 34567, rm_nak())])
    found = json.loads(ump("dissect", str(path), "--json").stdout)
    assert [(f["transport"], f["classified_by"]) for f in found] == [("lbtrm", CONTENT)] * 2
    off = json.loads(ump("dissect", str(path), "--json", "--no-content-heuristics").stdout)
    assert [f["transport"] for f in off] == [None, None]
    ported = json.loads(ump("dissect", str(path), "--json", "--no-content-heuristics",
                            "--lbtrm-mc-range", "239.192.0.0/16", "--lbtrm-dest-ports",
                            "12000-12100", "--lbtrm-source-ports", "34567").stdout)
    assert [(f["transport"], f["classified_by"]) for f in ported] == [("lbtrm", PORT)] * 2


@pytest.mark.parametrize("option", ["--lbtrm-mc-range=10.0.0.0/8", "--lbtrm-mc-range=x",
                                    "--lbmr-mc=224.9.10.11", "--lbtrm-dest-ports=0"])
def test_bad_option_values_are_one_line_errors(option: str, tmp_path: Path) -> None:
    path = tmp_path / "empty.pcap"
    write_pcap(path, [])
    done = ump("dissect", str(path), option)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "error:" in done.stderr


def test_content_ports_show_tshark_what_was_found_by_content() -> None:
    frame = udp_frame(SRC, 40000, "239.192.1.1", 12001, rm_data())
    reports = list(Dissector().run([CaptureRecord(1, 0.0, 1, frame, len(frame))]))
    assert reports[0].classified_by == CONTENT
    assert content_ports(PortMap(), reports).lbtrm_ports == [12001]
    assert content_ports(PortMap(), []) == PortMap()


def test_the_rules_are_data_read_off_the_protocol_modules() -> None:
    assert set(detect.LBTRM_CONTENT_TYPES) == {int(t) for t in lbtrm.HEURISTIC_TYPES}
    assert detect.LBMR_CONTENT_VERSIONS == (0, 1)


# --- Scapy -------------------------------------------------------------------------------


def test_scapy_binding_helper_uses_the_detector() -> None:
    """With :func:`wire.scapy_layers.bind_detector`, Scapy labels what the detector finds
    (here LBT-RM on a group and port no default binding covers, by content), and stops
    labelling what the detector refuses (LBT-RM outside the multicast range with the
    content rules off); :func:`unbind_detector` restores the port bindings."""
    from scapy.layers.l2 import Ether
    from scapy.packet import Raw

    from wire import scapy_layers as sl

    lbtrm_layer = sl.transports()["lbtrm"].base
    odd = udp_frame(SRC, 40000, "239.192.1.1", 12001, rm_data())
    default = udp_frame(SRC, 40000, "239.192.1.1", 14400, rm_data())
    assert lbtrm_layer not in Ether(odd) and lbtrm_layer in Ether(default)
    try:
        sl.bind_detector()
        assert lbtrm_layer in Ether(odd) and Ether(odd)[lbtrm_layer].session_id == 7
        sl.bind_detector(content=False)
        assert lbtrm_layer not in Ether(default) and Raw in Ether(default)
        sl.bind_detector(PortMap(lbtrm_mc_range=("239.192.0.0", "239.192.255.255"),
                                 lbtrm_dport=(12001, 12001)), content=False)
        assert lbtrm_layer in Ether(odd)
    finally:
        sl.unbind_detector()
    assert lbtrm_layer not in Ether(odd) and lbtrm_layer in Ether(default)


# --- ICMP-quoted datagrams, 802.3 frames, tshark ---------------------------------------


def test_real_deployment_traits_in_dissect_agree_with_tshark(tmp_path: Path) -> None:
    """``ump dissect`` with no options on LBT-RM on a site's own group and ports, NAKs bounced
    as ICMP port unreachable, LBMR version 1 with options on a non-default port and an
    802.3/LLC frame: what it finds and tshark's dissection agree field by field
    (``--check-tshark`` shows tshark the ports found by content)."""
    path = tmp_path / "traits.pcap"
    write_pcap(path, real_trait_frames())
    done = ump("dissect", str(path), "--json", "--check-tshark")
    assert done.returncode == 0, done.stderr
    assert "0 disagreement(s) over 7 frames" in done.stderr
    frames = json.loads(done.stdout)
    assert [(f["transport"], f["classified_by"], f["icmp"]) for f in frames] == [
        ("lbtrm", CONTENT, None), ("lbtrm", CONTENT, None), ("lbtrm", CONTENT, [3, 3]),
        ("lbtrm", PORT, [3, 3]), (None, None, [3, 3]), ("lbmr", CONTENT, None),
        (None, None, None)]
    assert frames[6]["reason"] == "not IPv4 (IEEE 802.3 frame with an LLC header, length 38)"
    assert frames[2]["src"] == "10.0.0.2" and frames[2]["dport"] == 34567
    text = ump("dissect", str(path), "--brief").stdout
    assert "ICMP type 3 code 3 quoting 10.0.0.2:40001 -> 10.0.0.1:34567 LBT-RM NAK" in text


def test_mim_is_lbtrm_by_port_as_in_tshark(tmp_path: Path) -> None:
    """tshark's LBT-RM rule also takes the multicast immediate messaging group and port
    (224.10.10.21:14401 by default, ``--lbtrm-mim``); with the content rules off both sides
    find it there, and only there."""
    path = tmp_path / "mim.pcap"
    write_pcap(path, [udp_frame(SRC, 40000, "224.10.10.21", 14401, rm_data()),
                      udp_frame(SRC, 40000, "224.10.10.22", 14401, rm_data()),
                      udp_frame(SRC, 40000, "239.1.1.1", 5000, rm_data())])
    for extra, ports, expected in (
            ([], PortMap(), ["lbtrm", None, None]),
            (["--lbtrm-mim", "239.1.1.1:5000"], PortMap(lbtrm_mim=("239.1.1.1", 5000)),
             [None, None, "lbtrm"])):
        done = ump("dissect", str(path), "--json", "--no-content-heuristics", *extra)
        assert [f["transport"] for f in json.loads(done.stdout)] == expected
        theirs = ["lbtrm" if frame.occurrences("lbtrm") else None
                  for frame in read_frames(path, ports)]
        assert theirs == expected
