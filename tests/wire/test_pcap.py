"""Capture files and link/IP/UDP/TCP framing (wire/pcap.py).

Reading: classic pcap (microsecond and nanosecond, little- and big-endian) and pcapng (SHB, IDB
with if_tsresol, EPB, SPB, several sections, both byte orders), from files these tests write
byte by byte, from our own writer, and from tshark's ``editcap``/``text2pcap``.  tshark reads
every hand-written file too, so the writers in this module are checked as well.  A truncated
last record raises WireError after the complete records.

Framing: ``decode_frame`` for Ethernet, VLAN, Linux SLL/SLL2, raw IP and BSD null link types,
and the checksums of ``udp_frame``/``tcp_frame``, which tshark must accept.
"""

from __future__ import annotations

import gzip
import random
import struct
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from wire import WireError, pcap, tshark
from wire.pcap import (
    CaptureRecord,
    PcapWriter,
    Segment,
    decode_frame,
    has_nanosecond_stamps,
    read_capture,
)

NO_UM = ["--disable-heuristic", "lbttcp_tcp", "--disable-heuristic", "lbtru_udp",
         "--disable-heuristic", "lbtrm_udp"]


def run_tool(tool: str, *args: str | Path) -> str:
    proc = subprocess.run([tool, *map(str, args)], capture_output=True, text=True, check=False,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def tshark_fields(path: Path, *fields: str, extra: Sequence[str] = ()) -> list[list[str]]:
    args = ["-r", str(path), *NO_UM, *extra, "-T", "fields", "-E", "separator=|"]
    for name in fields:
        args += ["-e", name]
    return [line.split("|") for line in tshark.run(args).splitlines()]


def read_all(path: Path) -> list[CaptureRecord]:
    return list(read_capture(path))


def sample_frames(count: int = 6) -> list[bytes]:
    frames = []
    for i in range(count):
        payload = bytes(range(i, i + 3 * i + 1))
        if i % 2:
            frames.append(pcap.udp_frame("10.1.0.1", 30000 + i, "10.1.0.2", 31000, payload))
        else:
            frames.append(pcap.tcp_frame("10.2.0.1", 32000, "10.2.0.2", 33000 + i, 100 * i, 7,
                                         pcap.TCP_ACK | pcap.TCP_PSH, payload))
    return frames


# --- hand-written pcap / pcapng ------------------------------------------------------------------


def pcap_bytes(records: Sequence[tuple[int, int, bytes]], *, big_endian: bool = False,
               nanosecond: bool = False, linktype: int = pcap.LINKTYPE_ETHERNET,
               orig_extra: int = 0) -> bytes:
    """A classic pcap: records are (seconds, fraction in µs or ns, data)."""
    order = ">" if big_endian else "<"
    magic = 0xA1B23C4D if nanosecond else 0xA1B2C3D4
    out = struct.pack(order + "IHHiIII", magic, 2, 4, 0, 0, 65535, linktype)
    for sec, frac, data in records:
        out += struct.pack(order + "IIII", sec, frac, len(data), len(data) + orig_extra) + data
    return out


def _pad(data: bytes) -> bytes:
    return data + b"\0" * (-len(data) % 4)


def _block(order: str, btype: int, body: bytes) -> bytes:
    length = 12 + len(body)
    return struct.pack(order + "II", btype, length) + body + struct.pack(order + "I", length)


def _option(order: str, code: int, value: bytes) -> bytes:
    return struct.pack(order + "HH", code, len(value)) + _pad(value)


@dataclass
class Iface:
    linktype: int
    tsresol: int | None = None  # the if_tsresol option byte, None for the 10^-6 default


def shb(order: str) -> bytes:
    body = struct.pack(order + "IHHq", 0x1A2B3C4D, 1, 0, -1)
    body += _option(order, 4, b"wire tests") + _option(order, 0, b"")  # shb_userappl
    return _block(order, 0x0A0D0D0A, body)


def idb(order: str, iface: Iface) -> bytes:
    body = struct.pack(order + "HHI", iface.linktype, 0, 262144)
    body += _option(order, 2, b"eth0")  # if_name, before if_tsresol on purpose
    if iface.tsresol is not None:
        body += _option(order, 9, bytes([iface.tsresol]))
    body += _option(order, 0, b"")
    return _block(order, 1, body)


def epb(order: str, iface: int, ticks: int, data: bytes, *, orig: int | None = None) -> bytes:
    body = struct.pack(order + "IIIII", iface, ticks >> 32, ticks & 0xFFFFFFFF, len(data),
                       len(data) if orig is None else orig)
    return _block(order, 6, body + _pad(data) + _option(order, 1, b"comment")
                  + _option(order, 0, b""))


def spb(order: str, data: bytes) -> bytes:
    return _block(order, 3, struct.pack(order + "I", len(data)) + _pad(data))


def other_block(order: str) -> bytes:
    """A name resolution block (type 4) with one IPv4 record; readers skip it."""
    record = struct.pack(order + "HH", 1, 13) + bytes([10, 1, 0, 1]) + b"host\0"
    return _block(order, 4, _pad(record) + struct.pack(order + "HH", 0, 0))


# --- classic pcap ------------------------------------------------------------------------------


@pytest.mark.parametrize("big_endian", [False, True], ids=["le", "be"])
@pytest.mark.parametrize("nanosecond", [False, True], ids=["us", "ns"])
def test_read_classic_pcap(tmp_path: Path, big_endian: bool, nanosecond: bool) -> None:
    frames = sample_frames()
    fracs = [0, 1, 999_999, 123_456, 500_000, 7]
    if nanosecond:
        fracs = [0, 1, 999_999_999, 123_456_789, 500_000_000, 7]
    records = [(1_700_000_000 + i, fracs[i], f) for i, f in enumerate(frames)]
    path = tmp_path / "hand.pcap"
    path.write_bytes(pcap_bytes(records, big_endian=big_endian, nanosecond=nanosecond,
                                orig_extra=3))
    got = read_all(path)
    scale = 1e-9 if nanosecond else 1e-6
    assert [r.number for r in got] == list(range(1, len(frames) + 1))
    assert [r.data for r in got] == frames
    assert [r.orig_len for r in got] == [len(f) + 3 for f in frames]
    assert {r.linktype for r in got} == {pcap.LINKTYPE_ETHERNET}
    for record, (sec, frac, _) in zip(got, records, strict=True):
        assert record.ts == pytest.approx(sec + frac * scale, abs=1e-9)
    # tshark agrees with our reading of the file (and with our hand-written bytes)
    rows = tshark_fields(path, "frame.number", "frame.time_epoch", "frame.cap_len")
    assert [int(r[2]) for r in rows] == [len(f) for f in frames]
    for row, record in zip(rows, got, strict=True):
        assert float(row[1]) == pytest.approx(record.ts, abs=2e-6)
    digits = 9 if nanosecond else 6
    assert [r[1].split(".")[1][:digits] for r in rows] == [
        f"{frac:0{digits}d}" for _, frac, _ in records]


@pytest.mark.parametrize("nanosecond", [False, True], ids=["us", "ns"])
def test_our_writer_round_trips(tmp_path: Path, nanosecond: bool) -> None:
    frames = sample_frames()
    path = tmp_path / "ours.pcap"
    with pcap.PcapWriter(path, nanosecond=nanosecond) as writer:
        for i, frame in enumerate(frames):
            writer.write(10.25 + i * 0.000125, frame)
    got = read_all(path)
    assert [r.data for r in got] == frames
    assert [r.ts for r in got] == pytest.approx([10.25 + i * 0.000125 for i in range(6)],
                                                abs=1e-9)
    assert pcap.write_pcap(tmp_path / "w.pcap", frames, start=5.0, step=0.5) == len(frames)
    assert [r.ts for r in read_all(tmp_path / "w.pcap")] == [5.0 + 0.5 * i for i in range(6)]
    rows = tshark_fields(path, "frame.time_epoch", "frame.len")
    assert [int(r[1]) for r in rows] == [len(f) for f in frames]


def test_editcap_conversions(tmp_path: Path) -> None:
    """Our pcap through editcap to nanosecond pcap, pcapng, and pcapng with if_tsresol=9."""
    frames = sample_frames()
    source = tmp_path / "src.pcap"
    with pcap.PcapWriter(source, nanosecond=True) as writer:
        for i, frame in enumerate(frames):
            writer.write(1000 + i + 0.123456789, frame)
    expected = read_all(source)
    for fmt, name in (("pcapng", "a.pcapng"), ("nsecpcap", "b.pcap"), ("pcap", "c.pcap")):
        out = tmp_path / name
        run_tool("editcap", "-F", fmt, source, out)
        got = read_all(out)
        assert [r.data for r in got] == [r.data for r in expected], fmt
        tolerance = 1e-6 if fmt == "pcap" else 1e-9
        assert [r.ts for r in got] == pytest.approx([r.ts for r in expected], abs=tolerance)
    # editcap keeps nanoseconds in pcapng through if_tsresol = 9
    assert b"\x09\x00\x01\x00\x09" in (tmp_path / "a.pcapng").read_bytes()


def test_gzip_compressed_captures_read_as_tshark_reads_them(tmp_path: Path) -> None:
    """A capture kept compressed (``tcpdump -z gzip``) reads as the plain one, pcap and
    pcapng; cut short, its records before the cut come first, then the error (tshark: "cut
    short in the middle of a packet" after the same frames)."""
    frames = sample_frames() * 40
    source = tmp_path / "src.pcap"
    with pcap.PcapWriter(source, nanosecond=True) as writer:
        for i, frame in enumerate(frames):
            writer.write(1000 + i * 0.001, frame)
    run_tool("editcap", "-F", "pcapng", source, tmp_path / "src.pcapng")
    for plain in (source, tmp_path / "src.pcapng"):
        packed = tmp_path / f"{plain.name}.gz"
        packed.write_bytes(gzip.compress(plain.read_bytes()))
        assert [(r.ts, r.data) for r in read_all(packed)] == [
            (r.ts, r.data) for r in read_all(plain)]
    cut = tmp_path / "cut.pcap.gz"
    whole = gzip.compress(source.read_bytes())
    cut.write_bytes(whole[:len(whole) // 2])
    got = []
    with pytest.raises(WireError, match="compressed capture is damaged or cut short"):
        for record in pcap.read_capture(cut):
            got.append(record.data)
    theirs = subprocess.run(["tshark", "-r", str(cut), "-T", "fields", "-e", "frame.number"],
                            capture_output=True, text=True)
    assert 0 < len(got) == len(theirs.stdout.split()) < len(frames)
    assert got == frames[:len(got)]


def test_text2pcap_files(tmp_path: Path) -> None:
    payloads = [b"hello LBMC", bytes(range(40)), b"x"]
    dump = "".join(
        "".join(f"{offset:06x} " + " ".join(f"{b:02x}" for b in p[offset:offset + 16]) + "\n"
                for offset in range(0, len(p), 16))
        for p in payloads)
    hexfile = tmp_path / "dump.txt"
    hexfile.write_text(dump)
    for fmt, args in (("pcapng", ["-T", "40001,40002", "-4", "10.9.0.1,10.9.0.2"]),
                      ("pcap", ["-u", "40003,40004", "-4", "10.9.0.3,10.9.0.4"])):
        out = tmp_path / f"t.{fmt}"
        run_tool("text2pcap", "-F", fmt, *args, hexfile, out)
        got = read_all(out)
        assert len(got) == len(payloads)
        segments = [decode_frame(r.linktype, r.data) for r in got]
        assert [s.payload for s in segments] == payloads
        proto = "tcp" if fmt == "pcapng" else "udp"
        assert {(s.proto, s.sport, s.dport) for s in segments} == {
            (proto, 40001, 40002) if proto == "tcp" else (proto, 40003, 40004)}


# --- pcapng ------------------------------------------------------------------------------------


@pytest.mark.parametrize("order", ["<", ">"], ids=["le", "be"])
def test_read_pcapng(tmp_path: Path, order: str) -> None:
    frames = sample_frames()
    ifaces = [Iface(pcap.LINKTYPE_ETHERNET), Iface(pcap.LINKTYPE_ETHERNET, 9),
              Iface(pcap.LINKTYPE_ETHERNET, 0x80 | 10), Iface(pcap.LINKTYPE_ETHERNET, 3)]
    blob = shb(order) + b"".join(idb(order, i) for i in ifaces) + other_block(order)
    # (interface, ticks) -> seconds: µs default, 10^-9, 2^-10, 10^-3
    stamps = [(0, 1_700_000_000_123_456), (1, 1_700_000_000_123_456_789),
              (2, 1024 * 1_700_000_000 + 512), (3, 1_700_000_000_250)]
    expected_ts = [1_700_000_000.123456, 1_700_000_000.123456789, 1_700_000_000.5,
                   1_700_000_000.25]
    for (iface, ticks), frame in zip(stamps, frames, strict=False):
        blob += epb(order, iface, ticks, frame, orig=len(frame) + 10)
    blob += spb(order, frames[4]) + spb(order, frames[5])
    path = tmp_path / "hand.pcapng"
    path.write_bytes(blob)
    got = read_all(path)
    assert [r.number for r in got] == list(range(1, 7))
    assert [r.data for r in got] == frames
    assert [r.orig_len for r in got] == [len(f) + 10 for f in frames[:4]] + [
        len(frames[4]), len(frames[5])]
    assert [r.ts for r in got[:4]] == pytest.approx(expected_ts, abs=1e-6)
    assert [r.ts for r in got[4:]] == [0.0, 0.0]
    rows = tshark_fields(path, "frame.number", "frame.time_epoch", "frame.cap_len")
    assert len(rows) == 6
    assert [int(r[2]) for r in rows] == [len(f) for f in frames]
    for row, ts in zip(rows, expected_ts, strict=False):
        assert float(row[1]) == pytest.approx(ts, abs=1e-6)


def test_pcapng_sections_restart_interfaces_and_byte_order(tmp_path: Path) -> None:
    frames = sample_frames(4)
    blob = (shb("<") + idb("<", Iface(pcap.LINKTYPE_ETHERNET)) + epb("<", 0, 1_000_000, frames[0])
            + shb(">") + idb(">", Iface(pcap.LINKTYPE_RAW, 9))
            + epb(">", 0, 2_000_000_000, frames[1][14:]) + spb(">", frames[2][14:]))
    path = tmp_path / "sections.pcapng"
    path.write_bytes(blob)
    got = read_all(path)
    assert [(r.linktype, r.data) for r in got] == [
        (pcap.LINKTYPE_ETHERNET, frames[0]), (pcap.LINKTYPE_RAW, frames[1][14:]),
        (pcap.LINKTYPE_RAW, frames[2][14:])]
    assert [r.ts for r in got[:2]] == pytest.approx([1.0, 2.0])
    assert len(tshark_fields(path, "frame.number")) == 3


def idb_with_snaplen(order: str, snaplen: int) -> bytes:
    return _block(order, 1, struct.pack(order + "HHI", pcap.LINKTYPE_ETHERNET, 0, snaplen)
                  + _option(order, 0, b""))


def test_pcapng_spb_cut_by_snaplen_to_a_multiple_of_4(tmp_path: Path) -> None:
    frame = sample_frames(2)[1]
    blob = (shb("<") + idb_with_snaplen("<", 20)
            + _block("<", 3, struct.pack("<I", len(frame)) + _pad(frame[:20])))
    path = tmp_path / "spb.pcapng"
    path.write_bytes(blob)
    (record,) = read_all(path)
    assert (record.data, record.orig_len) == (frame[:20], len(frame))
    assert tshark_fields(path, "frame.cap_len", "frame.len") == [["20", str(len(frame))]]


# (was a bug: the SPB length ignored the IDB snaplen and came out as min(orig_len, room in
# the block), padding included: 20 bytes instead of 18 here)
@pytest.mark.parametrize(("snaplen", "kept"), [(18, 18), (1, 1), (46, 46), (200, 46), (0, 46)],
                         ids=["18", "1", "equal", "above", "no-limit"])
def test_pcapng_spb_cut_by_snaplen(tmp_path: Path, snaplen: int, kept: int) -> None:
    frame = sample_frames(2)[1]
    assert len(frame) == 46
    blob = (shb("<") + idb_with_snaplen("<", snaplen)
            + _block("<", 3, struct.pack("<I", len(frame)) + _pad(frame[:kept])))
    path = tmp_path / "spb.pcapng"
    path.write_bytes(blob)
    assert tshark_fields(path, "frame.cap_len", "frame.len") == [[str(kept), "46"]]
    (record,) = read_all(path)
    assert (record.data, record.orig_len) == (frame[:kept], 46)


def test_pcapng_spb_shorter_than_its_packet(tmp_path: Path) -> None:
    """An SPB holding fewer bytes than min(orig_len, snaplen) is damaged, not cut quietly."""
    frame = sample_frames(2)[1]
    first = epb("<", 0, 1, frame)
    blob = (shb("<") + idb_with_snaplen("<", 0) + first
            + _block("<", 3, struct.pack("<I", len(frame)) + _pad(frame[:40])))
    path = tmp_path / "spb-short.pcapng"
    path.write_bytes(blob)
    records, error = collect(path)
    assert [r.data for r in records] == [frame]
    assert error is not None
    offset = len(shb("<")) + len(idb_with_snaplen("<", 0)) + len(first)
    assert (error.header, error.offset) == ("pcapng.spb", offset)
    assert str(len(frame)) in error.reason
    code, lengths, stderr = _tshark_reads(path)
    assert code != 0 and lengths == [str(len(frame))]
    assert "damaged or corrupt" in stderr


# (was a bug: an EPB whose captured_len ran past its block was read without complaint, its
# "packet" then included the options and the trailing block length)
def _tshark_reads(path: Path) -> tuple[int, list[str], str]:
    proc = subprocess.run([tshark.tshark_path(), "-r", str(path), "-T", "fields", "-e",
                           "frame.cap_len"], capture_output=True, text=True, check=False,
                          timeout=60)
    return proc.returncode, proc.stdout.split(), proc.stderr


@pytest.mark.parametrize("extra", [20, 40, 1000])
def test_pcapng_epb_captured_len_beyond_the_block(tmp_path: Path, extra: int) -> None:
    frame = UDP_FRAME
    body = (struct.pack("<IIIII", 0, 0, 0, len(frame) + extra, len(frame)) + _pad(frame)
            + _option("<", 1, b"comment") + _option("<", 0, b""))
    good = epb("<", 0, 5, frame)
    head = shb("<") + idb("<", Iface(pcap.LINKTYPE_ETHERNET)) + good
    path = tmp_path / "epb.pcapng"
    path.write_bytes(head + _block("<", 6, body))
    records, error = collect(path)
    assert [r.data for r in records] == [frame]
    assert error is not None, records
    assert (error.header, error.offset) == ("pcapng.epb", len(head))
    assert str(len(frame) + extra) in error.reason
    code, lengths, stderr = _tshark_reads(path)
    assert code != 0 and lengths == [str(len(frame))]
    assert "damaged or corrupt" in stderr


def test_pcapng_epb_captured_len_up_to_the_block_end(tmp_path: Path) -> None:
    """Like tshark, the bound is the block's end: a captured_len running into the options is
    read (the options' bytes become packet data), one byte more is damage."""
    frame = UDP_FRAME
    room = len(_pad(frame) + _option("<", 1, b"comment") + _option("<", 0, b""))
    body = (struct.pack("<IIIII", 0, 0, 0, room, len(frame)) + _pad(frame)
            + _option("<", 1, b"comment") + _option("<", 0, b""))
    path = tmp_path / "epb-edge.pcapng"
    path.write_bytes(shb("<") + idb("<", Iface(pcap.LINKTYPE_ETHERNET)) + _block("<", 6, body))
    (record,) = read_all(path)
    assert record.data == body[20:] and len(record.data) == room
    assert _tshark_reads(path)[:2] == (0, [str(room)])


def test_pcapng_epb_captured_len_filling_the_block_exactly(tmp_path: Path) -> None:
    """captured_len up to the end of the packet data (padding included) is still in bounds."""
    frame = UDP_FRAME + b"\xee" * (-len(UDP_FRAME) % 4)
    body = struct.pack("<IIIII", 0, 0, 0, len(frame), len(frame)) + frame
    path = tmp_path / "epb-exact.pcapng"
    path.write_bytes(shb("<") + idb("<", Iface(pcap.LINKTYPE_ETHERNET)) + _block("<", 6, body))
    (record,) = read_all(path)
    assert record.data == frame


# --- truncation and bad files ---------------------------------------------------------------------


def collect(path: Path) -> tuple[list[CaptureRecord], WireError | None]:
    records: list[CaptureRecord] = []
    iterator: Iterator[CaptureRecord] = read_capture(path)
    try:
        for record in iterator:
            records.append(record)
    except WireError as error:
        return records, error
    return records, None


@pytest.mark.parametrize("cut", [1, 8, 16, 17, 30], ids=lambda c: f"cut-{c}")
@pytest.mark.parametrize("big_endian", [False, True], ids=["le", "be"])
def test_truncated_last_pcap_record(tmp_path: Path, cut: int, big_endian: bool) -> None:
    frames = sample_frames(3)
    blob = pcap_bytes([(1, 0, f) for f in frames], big_endian=big_endian)
    path = tmp_path / "cut.pcap"
    path.write_bytes(blob[:-cut])
    records, error = collect(path)
    assert [r.data for r in records] == frames[:2]
    assert error is not None
    assert error.header == "pcap.record"
    assert error.offset == 24 + sum(16 + len(f) for f in frames[:2])
    assert "ends inside" in error.reason


@pytest.mark.parametrize("cut", [1, 4, 7, 8, 20], ids=lambda c: f"cut-{c}")
def test_truncated_last_pcapng_block(tmp_path: Path, cut: int) -> None:
    frames = sample_frames(3)
    head = shb("<") + idb("<", Iface(pcap.LINKTYPE_ETHERNET))
    blocks = [epb("<", 0, 1000 * i, f) for i, f in enumerate(frames)]
    path = tmp_path / "cut.pcapng"
    path.write_bytes((head + b"".join(blocks))[:-cut])
    records, error = collect(path)
    assert [r.data for r in records] == frames[:2]
    assert error is not None
    assert error.header == "pcapng.block"
    assert error.offset == len(head) + len(blocks[0]) + len(blocks[1])


def test_bad_capture_files(tmp_path: Path) -> None:
    cases = {
        "short": (b"\xd4\xc3", "pcap", 0),
        "not-a-capture": (b"GET / HTTP/1.1\r\n" * 3, "pcap", 0),
        "short-global-header": (pcap_bytes([])[:20], "pcap", 0),
    }
    frame = sample_frames(1)[0]
    cases["epb-unknown-interface"] = (
        shb("<") + idb("<", Iface(1)) + epb("<", 3, 0, frame), "pcapng.epb",
        len(shb("<") + idb("<", Iface(1))))
    cases["spb-before-idb"] = (shb("<") + spb("<", frame), "pcapng.spb", len(shb("<")))
    cases["block-length-not-multiple-of-4"] = (
        shb("<") + struct.pack("<II", 1, 21) + bytes(13), "pcapng.block", len(shb("<")))
    for name, (blob, header, offset) in cases.items():
        path = tmp_path / name
        path.write_bytes(blob)
        _, error = collect(path)
        assert error is not None, name
        assert (error.header, error.offset) == (header, offset), name
    empty = tmp_path / "empty.pcap"
    empty.write_bytes(pcap_bytes([]))
    assert collect(empty) == ([], None)


# --- decode_frame ------------------------------------------------------------------------------

UDP_FRAME = pcap.udp_frame("192.0.2.1", 40000, "198.51.100.7", 40001, b"udp payload")
TCP_FRAME = pcap.tcp_frame("192.0.2.2", 40002, "198.51.100.8", 40003, 0x01020304, 5,
                           pcap.TCP_ACK | pcap.TCP_PSH, b"tcp payload")
UDP_SEG = Segment("udp", "192.0.2.1", "198.51.100.7", 40000, 40001, b"udp payload")
TCP_SEG = Segment("tcp", "192.0.2.2", "198.51.100.8", 40002, 40003, b"tcp payload", 0x01020304,
                  pcap.TCP_ACK | pcap.TCP_PSH)


def link_variants(frame: bytes) -> dict[str, tuple[int, bytes]]:
    """The same IPv4 packet under every link type decode_frame supports."""
    eth, ip = frame[:14], frame[14:]
    dst, src = eth[:6], eth[6:12]
    vlan = dst + src + b"\x81\x00" + b"\x00\x64" + b"\x08\x00" + ip
    qinq = dst + src + b"\x88\xa8" + b"\x00\x0a" + b"\x81\x00" + b"\x00\x64" + b"\x08\x00" + ip
    sll = struct.pack(">HHH", 0, 1, 6) + src + b"\0\0" + b"\x08\x00" + ip
    sll2 = struct.pack(">HHIHBB", 0x0800, 0, 3, 1, 4, 6) + src + b"\0\0" + ip
    return {
        "ethernet": (pcap.LINKTYPE_ETHERNET, frame),
        "vlan": (pcap.LINKTYPE_ETHERNET, vlan),
        "qinq": (pcap.LINKTYPE_ETHERNET, qinq),
        "sll": (pcap.LINKTYPE_LINUX_SLL, sll),
        "sll2": (pcap.LINKTYPE_LINUX_SLL2, sll2),
        "raw": (pcap.LINKTYPE_RAW, ip),
        "ipv4": (pcap.LINKTYPE_IPV4, ip),
        "raw-12": (12, ip),
        "null-le": (pcap.LINKTYPE_NULL, struct.pack("<I", 2) + ip),
        "null-be": (pcap.LINKTYPE_NULL, struct.pack(">I", 2) + ip),
    }


@pytest.mark.parametrize("frame", [UDP_FRAME, TCP_FRAME], ids=["udp", "tcp"])
def test_decode_frame_link_types(tmp_path: Path, frame: bytes) -> None:
    expected = UDP_SEG if frame is UDP_FRAME else TCP_SEG
    variants = link_variants(frame)
    for name, (linktype, data) in variants.items():
        assert decode_frame(linktype, data) == expected, name
    # tshark reads the same addresses/ports/payload from each variant (one pcapng, one IDB
    # per link type); LINKTYPE 12 is left out: its meaning differs between platforms
    names = [n for n in variants if n != "raw-12"]
    blob = shb("<")
    for name in names:
        blob += idb("<", Iface(variants[name][0]))
    for index, name in enumerate(names):
        blob += epb("<", index, 1_000_000 * index, variants[name][1])
    path = tmp_path / "links.pcapng"
    path.write_bytes(blob)
    port = "udp" if frame is UDP_FRAME else "tcp"
    rows = tshark_fields(path, "ip.src", "ip.dst", f"{port}.srcport", f"{port}.dstport",
                         f"{port}.payload" if port == "tcp" else "data.data")
    assert len(rows) == len(names)
    for name, row in zip(names, rows, strict=True):
        assert row[:4] == [expected.src, expected.dst, str(expected.sport),
                           str(expected.dport)], name
        assert bytes.fromhex(row[4].replace(":", "")) == expected.payload, name


def test_decode_frame_ignores_ethernet_padding_and_reads_options() -> None:
    short = pcap.udp_frame("10.0.0.1", 1, "10.0.0.2", 2, b"ab")
    assert len(short) < 60
    padded = short + b"\xee" * (60 - len(short))
    assert decode_frame(pcap.LINKTYPE_ETHERNET, padded).payload == b"ab"
    # IPv4 header with one option word (IHL 6); the checksum does not matter to the decoder
    ip = bytearray(UDP_FRAME[14:34])
    ip[0] = 0x46
    ip[2:4] = (len(UDP_FRAME) - 14 + 4).to_bytes(2, "big")
    with_options = UDP_FRAME[:14] + bytes(ip) + b"\x01\x01\x01\x00" + UDP_FRAME[34:]
    assert decode_frame(pcap.LINKTYPE_ETHERNET, with_options) == UDP_SEG
    # TCP header with 12 bytes of options (data offset 8)
    tcp = bytearray(TCP_FRAME[34:54])
    tcp[12] = (8 << 4) | (tcp[12] & 0x0F)
    ip = bytearray(TCP_FRAME[14:34])
    ip[2:4] = (len(TCP_FRAME) - 14 + 12).to_bytes(2, "big")
    frame = TCP_FRAME[:14] + bytes(ip) + bytes(tcp) + b"\x01" * 12 + TCP_FRAME[54:]
    assert decode_frame(pcap.LINKTYPE_ETHERNET, frame) == TCP_SEG


def _with_ip(frame: bytes, offset: int, value: bytes) -> bytes:
    out = bytearray(frame)
    out[14 + offset : 14 + offset + len(value)] = value
    return bytes(out)


@pytest.mark.parametrize(("linktype", "data", "header", "offset"), [
    pytest.param(1, UDP_FRAME[:13], "eth", 0, id="short-ethernet"),
    pytest.param(1, UDP_FRAME[:12] + b"\x86\xdd" + UDP_FRAME[14:], "eth", 12, id="ipv6"),
    pytest.param(1, UDP_FRAME[:30], "ip", 14, id="short-ip"),
    pytest.param(1, _with_ip(UDP_FRAME, 0, b"\x65"), "ip", 14, id="version-6"),
    pytest.param(1, _with_ip(UDP_FRAME, 0, b"\x44"), "ip", 14, id="ihl-4"),
    pytest.param(1, _with_ip(UDP_FRAME, 6, b"\x20\x00"), "ip", 20, id="more-fragments"),
    pytest.param(1, _with_ip(UDP_FRAME, 6, b"\x00\x10"), "ip", 20, id="fragment-offset"),
    pytest.param(1, _with_ip(UDP_FRAME, 9, b"\x01"), "ip", 23, id="icmp"),
    pytest.param(1, UDP_FRAME[:38], "udp", 34, id="short-udp"),
    pytest.param(1, _with_ip(UDP_FRAME, 2, b"\x00\x1a"), "udp", 34, id="udp-past-total-length"),
    pytest.param(1, TCP_FRAME[:50], "tcp", 34, id="short-tcp"),
    pytest.param(pcap.LINKTYPE_LINUX_SLL, b"\0" * 10, "frame", 0, id="short-sll"),
    pytest.param(pcap.LINKTYPE_RAW, b"", "frame", 0, id="empty-raw"),
    pytest.param(147, UDP_FRAME, "frame", 0, id="unsupported-linktype"),
])
def test_decode_frame_errors(linktype: int, data: bytes, header: str, offset: int) -> None:
    with pytest.raises(WireError) as info:
        decode_frame(linktype, data)
    assert (info.value.header, info.value.offset) == (header, offset)
    assert info.value.reason


def _tcp_data_offset(words: int) -> bytes:
    frame = bytearray(TCP_FRAME)
    frame[14 + 20 + 12] = (words << 4) | (frame[14 + 20 + 12] & 0x0F)
    return bytes(frame)


# (was a bug: the TCP data offset was not checked: below 5 words the "payload" started inside
# the TCP header, past the segment it was silently empty; tshark flags both)
@pytest.mark.parametrize("data_offset", [0, 2, 4, 13, 15])
def test_decode_frame_checks_the_tcp_data_offset(data_offset: int) -> None:
    # the segment is 20 header bytes + 11 payload bytes: 8 words fit, 13 (52 bytes) do not
    with pytest.raises(WireError) as info:
        decode_frame(pcap.LINKTYPE_ETHERNET, _tcp_data_offset(data_offset))
    assert (info.value.header, info.value.offset) == ("tcp", 34 + 12)
    assert str(data_offset) in info.value.reason


@pytest.mark.parametrize(("data_offset", "payload"), [
    (5, b"tcp payload"), (6, b"payload"), (7, b"oad"),
])
def test_decode_frame_accepts_tcp_data_offsets_inside_the_segment(data_offset: int,
                                                                   payload: bytes) -> None:
    assert decode_frame(pcap.LINKTYPE_ETHERNET, _tcp_data_offset(data_offset)).payload == payload
    # the whole segment as header: no payload, still fine
    ip = bytearray(TCP_FRAME[14:34])
    ip[2:4] = (20 + 32).to_bytes(2, "big")
    frame = TCP_FRAME[:14] + bytes(ip) + _tcp_data_offset(8)[34:54] + b"\x01" * 12
    assert decode_frame(pcap.LINKTYPE_ETHERNET, frame).payload == b""


IPV6 = bytes([0x60]) + bytes(39)


def _sll(protocol: int) -> bytes:
    return struct.pack(">HHH8sH", 0, 1, 6, bytes(8), protocol)


def _sll2(protocol: int) -> bytes:
    return struct.pack(">HHIHBB8s", protocol, 0, 1, 1, 0, 6, bytes(8))


# (was a bug: every non-IPv4 frame was reported as WireError('eth', 12, ...), also for link
# types without an Ethernet header)
@pytest.mark.parametrize(("linktype", "data", "offset"), [
    pytest.param(pcap.LINKTYPE_RAW, IPV6, 0, id="raw"),
    pytest.param(pcap.LINKTYPE_IPV4, IPV6, 0, id="ipv4-linktype"),
    pytest.param(pcap.LINKTYPE_LINUX_SLL, _sll(0x86DD) + IPV6, 16, id="sll"),
    pytest.param(pcap.LINKTYPE_LINUX_SLL2, _sll2(0x86DD) + IPV6, 20, id="sll2"),
    pytest.param(pcap.LINKTYPE_NULL, (24).to_bytes(4, "little") + IPV6, 4, id="null-le"),
    pytest.param(pcap.LINKTYPE_NULL, (30).to_bytes(4, "big") + IPV6, 4, id="null-be"),
])
def test_decode_frame_names_the_ip_header_for_raw_links(linktype: int, data: bytes,
                                                        offset: int) -> None:
    with pytest.raises(WireError) as info:
        decode_frame(linktype, data)
    assert (info.value.header, info.value.offset) == ("ip", offset)
    assert "6" in info.value.reason
    # the same packet after an Ethernet header is still the Ethernet header's problem
    with pytest.raises(WireError) as info:
        decode_frame(pcap.LINKTYPE_ETHERNET, UDP_FRAME[:12] + b"\x86\xdd" + IPV6)
    assert (info.value.header, info.value.offset) == ("eth", 12)
    # and the IPv4 packet itself decodes under every one of these link types
    ipv4 = UDP_FRAME[14:]
    link = data[:offset]
    if linktype == pcap.LINKTYPE_NULL:
        link = (2).to_bytes(4, "little")
    elif linktype == pcap.LINKTYPE_LINUX_SLL:
        link = _sll(0x0800)
    elif linktype == pcap.LINKTYPE_LINUX_SLL2:
        link = _sll2(0x0800)
    assert decode_frame(linktype, link + ipv4) == UDP_SEG


def test_decode_frame_does_not_fail_on_the_dont_fragment_bit() -> None:
    assert int.from_bytes(UDP_FRAME[20:22], "big") == 0x4000
    assert decode_frame(1, UDP_FRAME).proto == "udp"


# --- checksums and TCP conversations, accepted by tshark ----------------------------------------

CHECKSUMS = ["-o", "ip.check_checksum:TRUE", "-o", "udp.check_checksum:TRUE",
             "-o", "tcp.check_checksum:TRUE"]

addresses = st.integers(0x01000000, 0xDFFFFFFF).map(
    lambda v: ".".join(str(b) for b in v.to_bytes(4, "big")))
ports = st.integers(1024, 65535).filter(lambda p: not 12000 <= p <= 16000)
frame_specs = st.tuples(st.booleans(), addresses, ports, addresses, ports,
                        st.integers(0, 0xFFFFFFFF), st.integers(0, 0xFFFFFFFF),
                        st.integers(0, 0x3F), st.binary(max_size=301))


def _frame(spec: tuple[bool, str, int, str, int, int, int, int, bytes]) -> bytes:
    udp, src, sport, dst, dport, seq, ack, flags, payload = spec
    if udp:
        return pcap.udp_frame(src, sport, dst, dport, payload)
    return pcap.tcp_frame(src, sport, dst, dport, seq, ack, flags, payload)


def checksum_status(path: Path) -> list[list[str]]:
    return tshark_fields(path, "ip.checksum.status", "udp.checksum.status",
                         "tcp.checksum.status", extra=CHECKSUMS)


@settings(max_examples=max(2, settings().max_examples // 10),
          phases=[Phase.explicit, Phase.reuse, Phase.generate],  # no shrinking: tshark runs
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(frame_specs, min_size=20, max_size=40))
def test_checksums_accepted_by_tshark(tmp_path: Path,
                                      specs: list[tuple[bool, str, int, str, int, int, int,
                                                        int, bytes]]) -> None:
    frames = [_frame(s) for s in specs]
    path = tmp_path / "sums.pcap"
    pcap.write_pcap(path, frames)
    rows = checksum_status(path)
    assert len(rows) == len(frames)
    for spec, row in zip(specs, rows, strict=True):
        ip_status, udp_status, tcp_status = row
        assert ip_status == "1", (spec, row)  # 1 = Good
        assert (udp_status if spec[0] else tcp_status) == "1", (spec, row)
    for frame in frames:
        segment = decode_frame(pcap.LINKTYPE_ETHERNET, frame)
        assert segment.payload in frame


def test_checksum_check_can_fail(tmp_path: Path) -> None:
    """The control: corrupt each checksum and tshark reports it Bad (status 0)."""
    udp = bytearray(UDP_FRAME)
    udp[14 + 20 + 6] ^= 0x01  # UDP checksum
    tcp = bytearray(TCP_FRAME)
    tcp[14 + 20 + 16] ^= 0x01  # TCP checksum
    ip = bytearray(UDP_FRAME)
    ip[14 + 10] ^= 0x01  # IP header checksum
    path = tmp_path / "bad.pcap"
    pcap.write_pcap(path, [bytes(udp), bytes(tcp), bytes(ip)])
    rows = checksum_status(path)
    assert rows[0][:2] == ["1", "0"]
    assert rows[1][0] == "1" and rows[1][2] == "0"
    assert rows[2][0] == "0"


def test_tcp_conversation_is_consistent_for_tshark(tmp_path: Path) -> None:
    conv = pcap.TcpConversation(("10.7.0.1", 45000), ("10.7.0.2", 45001),
                                isn=(0xFFFFFF00, 77))
    rng = random.Random(7)
    frames = conv.handshake()
    for i in range(20):
        frames.append(conv.send(i % 3 != 0, rng.randbytes(rng.randrange(1, 120))))
    frames += conv.close()
    path = tmp_path / "conv.pcap"
    pcap.write_pcap(path, frames, step=0.001)
    summary = tshark.run(["-r", str(path), *NO_UM, *CHECKSUMS, "-q", "-z", "expert"])
    assert "Errors" not in summary and "Warns" not in summary, summary
    rows = tshark_fields(path, "tcp.seq", "tcp.ack", "tcp.len", "tcp.analysis.flags",
                         extra=CHECKSUMS)
    assert [r[3] for r in rows] == [""] * len(frames)
    segments = [decode_frame(pcap.LINKTYPE_ETHERNET, f) for f in frames]
    assert [s.flags for s in segments[:3]] == [pcap.TCP_SYN, pcap.TCP_SYN | pcap.TCP_ACK,
                                               pcap.TCP_ACK]
    # the sequence number wraps past 2^32 without confusing tshark
    assert segments[0].seq == 0xFFFFFF00


def test_the_timestamp_resolution_is_read_from_the_magic(tmp_path: Path) -> None:
    for nanosecond in (True, False):
        path = tmp_path / f"{nanosecond}.pcap"
        PcapWriter(path, nanosecond=nanosecond).close()
        assert has_nanosecond_stamps(path) is nanosecond
    (tmp_path / "empty").write_bytes(b"")
    assert has_nanosecond_stamps(tmp_path / "empty") is False
