"""keep_run_frames: a capture of a loopback run keeps only the frames of the run's processes.

Other runs on the machine use the same UM port ranges; these cases build captures that mix
both and check which frames survive (reference_impl.run_frames' module docstring)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from reference_impl.run_frames import RunPorts, bound_sockets, keep_run_frames
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
    assert keep_run_frames(pcap, frozenset({15380})) == (2, 1)
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
    assert keep_run_frames(pcap, frozenset({14371})) == (7, 4)
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
    assert keep_run_frames(pcap, frozenset({14390, 14400})) == (1, 2)
    assert [p for _, _, p in _kept(pcap)] == [b"our data"]


def test_a_port_of_a_shared_range_is_ours_only_while_our_process_lived(tmp_path: Path) -> None:
    # frames at t = 0, 1, 2, 3, 4: another run's source held 14380 before ours (t 0-1) and
    # another after it (t 4); ours lived from 1.5 to 3.5; the store port is ours throughout
    pcap = tmp_path / "run.pcap"
    write_pcap(pcap, [udp_frame(IP, 14380, IP, 50000, b"before"),
                      udp_frame(IP, 14380, IP, 50000, b"still before"),
                      udp_frame(IP, 14380, IP, 50001, b"ours"),
                      udp_frame(IP, 14380, IP, 50001, b"ours too"),
                      udp_frame(IP, 14380, IP, 50002, b"after")])
    run = RunPorts.always({14567})
    run.add({14380}, 1.5, 3.5)
    assert keep_run_frames(pcap, run) == (2, 3)
    assert [p for _, _, p in _kept(pcap)] == [b"ours", b"ours too"]


def test_a_multicast_datagram_from_our_port_after_our_source_exited_is_not_ours(
        tmp_path: Path) -> None:
    # the demo's LBT-RM source exited; another run's source takes the same port and sends to
    # the same group: a third session ID in our capture unless time is looked at
    pcap = tmp_path / "run.pcap"
    write_pcap(pcap, [udp_frame(IP, 14390, "224.10.10.10", 14400, b"our data"),
                      udp_frame(IP, 14390, "224.10.10.10", 14400, b"their data")])
    run = RunPorts()
    run.add({14390, 14400}, 0.0, 0.5)
    assert keep_run_frames(pcap, run) == (1, 1)
    assert [p for _, _, p in _kept(pcap)] == [b"our data"]


def test_a_port_held_twice_is_ours_in_either_window_and_a_plain_set_means_always() -> None:
    run = RunPorts.always({15380})
    run.add({14371}, 10.0, 20.0)  # a source, killed
    run.add({14371}, 30.0)  # its restart, still running at the end of the capture
    assert [run.held("tcp", 14371, t) for t in (5.0, 10.0, 20.0, 25.0, 30.0, 1e12)] == \
        [False, True, True, False, True, True]
    assert run.held("udp", 15380, -1e12) and run.held("tcp", 15380, 1e12)
    assert not run.held("tcp", 14372, 15.0)
    assert run.ports == {15380, 14371}


def test_a_port_is_ours_only_for_the_protocol_we_held_it_for(tmp_path: Path) -> None:
    # LBT-RU's UDP ranges overlap LBT-TCP's: our source listens on TCP 14371 while another
    # run's LBT-RU receiver uses UDP 14371
    pcap = tmp_path / "run.pcap"
    ours = TcpConversation((IP, 50001), (IP, 14371))
    write_pcap(pcap, [udp_frame(IP, 14380, IP, 14371, b"their lbt-ru"),
                      *ours.handshake(), ours.send(False, b"our data")])
    run = RunPorts()
    run.add({("tcp", 14371)})
    assert keep_run_frames(pcap, run) == (4, 1)
    assert b"their lbt-ru" not in [p for _, _, p in _kept(pcap)]


def test_bound_sockets_names_listening_tcp_and_bound_udp_ports_not_client_ends() -> None:
    # a client end is an ephemeral port the kernel gives to another process once it closes
    with socket.socket() as server, socket.socket() as client, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        server.bind((IP, 0))
        server.listen(1)
        client.connect(server.getsockname())
        accepted, _ = server.accept()
        udp.bind((IP, 0))
        with accepted:
            found = bound_sockets(os.getpid())
            assert ("tcp", server.getsockname()[1]) in found
            assert ("udp", udp.getsockname()[1]) in found
            assert ("tcp", client.getsockname()[1]) not in found
