"""``ump dissect``: every frame reported, JSON in tshark's names, and the tshark cross-check."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from ump.cli import main
from wire import lbmc, lbmr
from wire.fields import text_bytes
from wire.lbmc import LbmcMessage, MessageType, parse_message
from wire.pcap import TcpConversation, udp_frame, write_pcap
from wire.tshark import PortMap

STORE = 29001


def _store_capture(path: Path) -> Path:
    """A source<->store exchange: PREG split over two segments, PREG-RESP, data, garbage."""
    conv = TcpConversation(("10.0.0.1", 50000), ("10.0.0.2", STORE))
    preg = LbmcMessage(headers=[lbmc.UmePreg(reg_id=77, s_flag=1, marker=1, w_flag=1,
                                             resp_ip="10.0.0.1", resp_port=14391)])
    ka = LbmcMessage(headers=[lbmc.UmeKeepalive(type=2, reg_id=77)])
    data = LbmcMessage(type=MessageType.RETRANS, headers=[lbmc.Topicname(topic="t.1")],
                       payload=b"payload", tidx=1, sqn=5)
    stream = preg.build() + ka.build() + data.build()
    resp = LbmcMessage(headers=[lbmc.UmePregResp(o_flag=1, reg_id=77, low_seqnum=1,
                                                 high_seqnum=9), lbmc.UmeStoreid(store_id=3)])
    bad = bytearray(LbmcMessage(headers=[lbmc.UmeAck(type=1)]).build())
    bad[5] = 8  # ume_ack hdr_len 8 < 20: tshark calls it malformed, so must we
    frames = [
        *conv.handshake(),
        conv.send(True, stream[:20]),
        conv.send(True, stream[20:]),
        conv.send(False, resp.build()),
        conv.send(False, bytes(bad)),
        udp_frame("10.0.0.9", 1234, "10.0.0.8", 53, b"dns?"),
    ]
    write_pcap(path, frames)
    return path


def test_text_output_reports_every_frame(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                         ) -> None:
    pcap = _store_capture(tmp_path / "store.pcap")
    assert main(["dissect", str(pcap), "--store-port", str(STORE)]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line[:6].strip().isdigit()]
    assert len(lines) == 8  # every frame has a line
    assert "[pending]" in lines[3]  # first half of the PREG
    assert "PREG UME-KA RX-DATA" in lines[4]
    assert "lbmc.ume_preg.reg_id=77" in out
    assert "PREG-RESP" in lines[5]
    assert "[malformed]" in lines[6] and "lbmc.ume_ack" in lines[6]
    assert "[not-um]" in lines[7] and "matches no UM port rule" in lines[7]
    assert "# 8 frames: 2 UM, 4 not UM, 1 malformed, 1 partial" in out


def test_json_uses_tshark_field_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                      ) -> None:
    pcap = _store_capture(tmp_path / "store.pcap")
    assert main(["dissect", str(pcap), "--store-port", str(STORE), "--json"]) == 0
    frames = json.loads(capsys.readouterr().out)
    assert [f["frame"] for f in frames] == list(range(1, 9))
    five = frames[4]
    assert five["status"] == "um" and five["transport"] == "lbttcp"
    preg, ka, data = five["messages"]
    assert preg["fields"]["lbmc.ume_preg.reg_id"] == 77
    assert preg["fields"]["lbmc.ume_preg.flags.w_flag"] == 1
    assert preg["fields"]["lbmc.ume_preg.resp_ip"] == "10.0.0.1"
    assert ka["label"] == "UME-KA"
    assert data["fields"]["lbmc.topicname.topic"] == "t.1"
    assert frames[6]["status"] == "malformed"
    assert "hdr_len 8" in frames[6]["reason"]


@pytest.mark.oracle
def test_check_tshark_agrees_on_valid_traffic(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    conv = TcpConversation(("10.0.0.1", 50000), ("10.0.0.2", STORE))
    msgs = [LbmcMessage(headers=[lbmc.UmeAck(type=1, seqnum=i, rcv_reg_id=i * 3)])
            for i in range(20)]
    blob = b"".join(m.build() for m in msgs)
    frames = conv.handshake() + [conv.send(True, blob[i : i + 50])
                                 for i in range(0, len(blob), 50)]
    write_pcap(tmp_path / "ok.pcap", frames)
    status = main(["dissect", str(tmp_path / "ok.pcap"), "--store-port", str(STORE),
                   "--check-tshark", "--brief"])
    err = capsys.readouterr().err
    assert status == 0, err
    assert "0 disagreement(s)" in err


@pytest.mark.oracle
def test_a_gzip_compressed_capture_dissects_and_agrees_with_tshark(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain = _store_capture(tmp_path / "store.pcap")
    packed = tmp_path / "store.pcap.gz"
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert main(["dissect", str(plain), "--store-port", str(STORE), "--json"]) == 0
    expected = capsys.readouterr().out
    status = main(["dissect", str(packed), "--store-port", str(STORE), "--check-tshark",
                   "--json"])
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert captured.out == expected and "0 disagreement(s)" in captured.err


@pytest.mark.oracle
@pytest.mark.parametrize("server", [14377, 14392])
def test_check_tshark_compares_a_connection_tshark_gives_to_another_protocol(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], server: int) -> None:
    # tshark tries the dissectors registered on a TCP port before its LBT-TCP heuristic (which
    # takes the LBT-TCP source and request port ranges), so an LBT-TCP connection from
    # ephemeral port 44321 (PCP's) is PCP to it, as in a CI run of the reference's evidence
    conv = TcpConversation(("127.0.0.1", 44321), ("127.0.0.1", server))
    # a data message without headers begins with its length in four bytes, as PCP does
    msgs = [LbmcMessage(type=MessageType.MESSAGE, payload=b"topic data %d" % i, tidx=0, sqn=i)
            for i in range(4)]
    ka = LbmcMessage(headers=[lbmc.UmeKeepalive(type=2, reg_id=7)])
    frames = conv.handshake() + [conv.send(True, ka.build())] + [
        conv.send(False, m.build()) for m in msgs]
    write_pcap(tmp_path / "pcp.pcap", frames)
    plain = subprocess.run(["tshark", "-r", str(tmp_path / "pcp.pcap"),
                            *PortMap(store_ports=[STORE]).tshark_args(), "-T", "fields",
                            "-e", "frame.protocols"], capture_output=True, text=True, check=True)
    # what the comparison has to get past
    assert "pcp" in plain.stdout and "lbmc" not in plain.stdout
    status = main(["dissect", str(tmp_path / "pcp.pcap"), "--store-port", str(STORE),
                   "--check-tshark", "--brief"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "0 disagreement(s)" in err
    assert "# 8 frames: 5 UM" in out


@pytest.mark.oracle
def test_check_tshark_agrees_on_a_full_loopback_segment(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]
                                                        ) -> None:
    """A 64 KiB loopback segment of small data messages (a coalesced send burst) is some
    5,000 LBMC messages; tshark's default layer limit (500) calls such a frame a dissector bug,
    so the oracle runs with :data:`wire.tshark.MAX_LAYERS` and agrees on every message."""
    conv = TcpConversation(("10.0.0.1", 14371), ("10.0.0.2", 50000))
    one = LbmcMessage(type=MessageType.MESSAGE, payload=b"m", tidx=1, sqn=0).build()
    count = 65_483 // len(one)
    blob = b"".join(LbmcMessage(type=MessageType.MESSAGE, payload=b"m", tidx=1, sqn=i).build()
                    for i in range(count))
    write_pcap(tmp_path / "burst.pcap", [*conv.handshake(), conv.send(True, blob)])
    status = main(["dissect", str(tmp_path / "burst.pcap"), "--lbttcp-port", "14371",
                   "--check-tshark", "--brief"])
    out, err = capsys.readouterr()
    assert status == 0, err
    assert f"{count} messages" in out and " 0 malformed" in out, out[-300:]
    assert "0 disagreement(s)" in err
    assert count > 2000


@pytest.mark.oracle
def test_check_tshark_catches_a_decoder_that_lies(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    pcap = _store_capture(tmp_path / "store.pcap")
    real = lbmc.Header.tshark_fields

    def lying(self: lbmc.Header, next_hdr: int | None = None) -> list[tuple[str, object]]:
        return [(n, v + 1 if n == "lbmc.ume_preg.reg_id" else v)
                for n, v in real(self, next_hdr)]

    monkeypatch.setattr(lbmc.Header, "tshark_fields", lying)
    status = main(["dissect", str(pcap), "--store-port", str(STORE), "--check-tshark",
                   "--brief"])
    err = capsys.readouterr().err
    assert status == 1
    assert "lbmc.ume_preg.reg_id: ours='78' tshark='77'" in err


def test_truncated_capture_reports_complete_frames(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    pcap = _store_capture(tmp_path / "store.pcap")
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(pcap.read_bytes()[:-10])
    assert main(["dissect", str(cut), "--store-port", str(STORE), "--brief"]) == 1
    captured = capsys.readouterr()
    assert "# 7 frames" in captured.out
    assert "capture damaged after frame 7" in captured.err


@pytest.mark.parametrize("content", [b"", b"not a capture at all", b"\xd4\xc3\xb2\xa1"])
def test_unreadable_file_is_a_clear_error(tmp_path: Path, content: bytes,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.pcap"
    bad.write_bytes(content)
    assert main(["dissect", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ump dissect:") and "Traceback" not in err


def test_missing_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dissect", "/nonexistent/x.pcap"]) == 2
    assert "no such file" in capsys.readouterr().err


def test_console_script_runs(tmp_path: Path) -> None:
    pcap = _store_capture(tmp_path / "store.pcap")
    proc = subprocess.run([sys.executable, "-m", "ump", "dissect", str(pcap), "--store-port",
                           str(STORE), "--um-only", "--brief"], capture_output=True, text=True,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    assert "PREG-RESP" in proc.stdout and "not-um" not in proc.stdout


# --- topic names outside ASCII (issue 22, item 6) ------------------------------------------------

NAMES: dict[str, str | bytes] = {
    "utf-8": "prix/€/日本",
    "latin-1 byte": b"ab\xe9cd",  # not UTF-8: still parses, and round-trips
    "invalid utf-8 and controls": b"a\xffb\x7f\x01c",
}


def _names_capture(path: Path) -> Path:
    """Each name as an LBMR TQR + TIR, then as the topic name header of LBT-TCP data."""
    frames = []
    for name in NAMES.values():
        tir = lbmr.Tir(name=name, ttl=1, index=1, info=lbmr.TcpInfo(ip="127.0.0.1", port=14371))
        packet = lbmr.LbmrPacket(tqrs=[lbmr.Tqr(name=name)], tirs=[tir])
        frames.append(udp_frame("127.0.0.1", 14402, "127.0.0.1", 15380, packet.build()))
    conv = TcpConversation(("127.0.0.1", 50000), ("127.0.0.1", 14371))
    frames += conv.handshake()
    for name in NAMES.values():
        data = LbmcMessage(type=MessageType.MESSAGE, headers=[lbmc.Topicname(topic=name)],
                           payload=b"x", tidx=1, sqn=5)
        frames.append(conv.send(False, data.build()))
    write_pcap(path, frames)
    return path


@pytest.mark.parametrize("name", sorted(NAMES))
def test_names_are_utf8_text_and_any_bytes_round_trip(name: str) -> None:
    raw = text_bytes(NAMES[name])
    packet = lbmr.parse_packet(lbmr.LbmrPacket(tirs=[lbmr.Tir(
        name=NAMES[name], info=lbmr.TcpInfo(ip="127.0.0.1", port=14371))]).build())
    value = packet.tirs[0].values["name"]
    assert value == raw.decode("utf-8", "surrogateescape")
    assert text_bytes(value) == raw
    message, _ = parse_message(LbmcMessage(headers=[lbmc.Topicname(topic=value)]).build())
    header = message.headers[0]
    assert isinstance(header, lbmc.Topicname)
    assert header.topic == value and header.hdr_len == 4 + len(raw)  # bytes, not characters


def test_names_show_as_tshark_shows_them_with_their_text(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    pcap = _names_capture(tmp_path / "names.pcap")
    assert main(["dissect", str(pcap), "--um-only"]) == 0
    out = capsys.readouterr().out
    euro = "'prix/\ufffd\ufffd\ufffd/\ufffd\ufffd\ufffd\ufffd\ufffd\ufffd'(utf-8:'prix/€/日本')"
    assert f"lbmr.tir.name={euro}" in out and f"lbmr.tqr.name={euro}" in out
    assert f"lbmc.topicname.topic={euro}" in out
    assert "lbmr.tir.name='ab\ufffdcd'(bytes:6162e96364)" in out
    assert "lbmc.topicname.topic='a\ufffdb\\x7f\\x01c'(bytes:61ff627f0163)" in out
    assert main(["dissect", str(pcap), "--um-only", "--json"]) == 0
    frames = json.loads(capsys.readouterr().out)
    tir = frames[0]["messages"][0]
    assert tir["fields"]["lbmr.tir.name"] == "prix/\ufffd\ufffd\ufffd/" + "\ufffd" * 6
    assert tir["utf8"]["lbmr.tir.name"] == "prix/€/日本"


@pytest.mark.oracle
def test_check_tshark_agrees_on_names_outside_ascii(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    pcap = _names_capture(tmp_path / "names.pcap")
    status = main(["dissect", str(pcap), "--check-tshark", "--brief"])
    err = capsys.readouterr().err
    assert status == 0, err
    assert "# tshark cross-check: 0 disagreement(s) over 9 frames" in err
