"""keep_own_frames: a capture of a loopback run keeps only the frames of the run's processes.

Other runs on the machine use the same UM port ranges; these cases build captures that mix
both and check which frames survive (reference_impl.demo.keep_own_frames' docstring)."""

from __future__ import annotations

from pathlib import Path

from reference_impl.demo import keep_own_frames
from wire.pcap import TcpConversation, decode_frame, read_capture, udp_frame, write_pcap

IP = "127.0.0.1"


def _kept(path: Path) -> list[tuple[int, int, bytes]]:
    return [(s.sport, s.dport, s.payload)
            for s in (decode_frame(r.linktype, r.data) for r in read_capture(path))]


def test_frames_to_or_from_our_ports_stay_and_the_others_go(tmp_path: Path) -> None:
    pcap = tmp_path / "run.pcap"
    write_pcap(pcap, [udp_frame(IP, 40000, IP, 15380, b"ours out"),
                      udp_frame(IP, 15380, IP, 40000, b"ours in"),
                      udp_frame(IP, 41000, IP, 15381, b"theirs")])
    assert keep_own_frames(pcap, frozenset({15380})) == (2, 1)
    assert [p for _, _, p in _kept(pcap)] == [b"ours out", b"ours in"]


def test_a_connection_that_began_before_the_capture_is_not_ours_even_on_our_port(
        tmp_path: Path) -> None:
    # another run's source held 14371 and is closing its connection when the capture starts;
    # ours binds 14371 afterwards and a receiver connects to it
    theirs = TcpConversation((IP, 50000), (IP, 14371))
    theirs.handshake()  # not captured: it happened before the capture started
    ours = TcpConversation((IP, 50001), (IP, 14371))
    frames = [theirs.send(False, b"their tail"), *theirs.close(),
              *ours.handshake(), ours.send(False, b"our data"), *ours.close()]
    pcap = tmp_path / "run.pcap"
    write_pcap(pcap, frames)
    assert keep_own_frames(pcap, frozenset({14371})) == (7, 4)
    kept = _kept(pcap)
    assert {(s, d) for s, d, _ in kept} == {(50001, 14371), (14371, 50001)}
    assert [p for _, _, p in kept if p] == [b"our data"]


def test_a_multicast_datagram_is_ours_only_from_our_port(tmp_path: Path) -> None:
    # every receiver on the machine binds the group port: it says nothing about whose a
    # datagram is, and a NAK another run sends from it is not ours either
    pcap = tmp_path / "run.pcap"
    write_pcap(pcap, [udp_frame(IP, 14390, "224.10.10.10", 14400, b"our data"),
                      udp_frame(IP, 14391, "224.10.10.10", 14400, b"their data"),
                      udp_frame(IP, 14400, IP, 14391, b"their nak")])
    assert keep_own_frames(pcap, frozenset({14390, 14400})) == (1, 2)
    assert [p for _, _, p in _kept(pcap)] == [b"our data"]
