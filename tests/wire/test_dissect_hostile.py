"""``ump dissect --check-tshark`` on captures tshark refuses to read (issue 22, item 3).

Each capture is built here through the layouts of :mod:`wire.pcap` (no struct formats written
again): a record cut short, a record header claiming 3 GB, a pcapng option whose length runs
past its block.  Our side must still print its own report of the frames it could read and of
the damage, then one line saying that tshark refused the file (with tshark's first error line),
and exit with status 2, never a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.wire.test_dissect import STORE, _store_capture
from wire import pcap
from wire.pcap import (
    LINKTYPE_ETHERNET,
    PCAPNG_BOM,
    PCAPNG_SHB,
    PcapRecordLE,
    derive,
    pcapng_layouts,
    udp_frame,
)

pytestmark = pytest.mark.oracle

RECORD = derive(PcapRecordLE)
ORDER = "<"
BLOCK, IDB, EPB, _SPB, SHB = pcapng_layouts(ORDER)
OPTION = pcap._NG_OPTION[ORDER]  # the (code, length) option header of pcap.pcapng_options


def _record_offsets(raw: bytes) -> list[int]:
    """Where each record header of a classic pcap starts (after the 24-byte file header)."""
    offsets, pos = [], derive(pcap.PcapHeaderLE).size
    while pos < len(raw):
        offsets.append(pos)
        pos += RECORD.size + RECORD.decode(raw, pos)["incl_len"]
    return offsets


def truncated(tmp_path: Path) -> Path:
    """The store capture with its last record cut 10 bytes short."""
    raw = _store_capture(tmp_path / "store.pcap").read_bytes()
    path = tmp_path / "truncated.pcap"
    path.write_bytes(raw[:-10])
    return path


def huge_record(tmp_path: Path) -> Path:
    """The store capture whose last record header claims 3 GB of captured data."""
    raw = bytearray(_store_capture(tmp_path / "store.pcap").read_bytes())
    last = _record_offsets(bytes(raw))[-1]
    values = RECORD.decode(raw, last)
    values.update(incl_len=3_000_000_000, orig_len=3_000_000_000)
    raw[last : last + RECORD.size] = RECORD.pack(values)
    path = tmp_path / "huge.pcap"
    path.write_bytes(bytes(raw))
    return path


def _u32(value: int) -> bytes:
    return value.to_bytes(4, "little")


def _block(btype: int, body: bytes) -> bytes:
    """A pcapng block: header, body, trailing copy of the length."""
    length = BLOCK.size + len(body) + 4
    return BLOCK.pack({"block_type": btype, "block_length": length}) + body + _u32(length)


def _option(code: int, value: bytes, length: int | None = None) -> bytes:
    head = OPTION.pack({"code": code, "length": len(value) if length is None else length})
    return head + value + b"\0" * (-len(value) % 4)


def bad_option(tmp_path: Path) -> Path:
    """A pcapng whose second packet block has a comment option claiming 300 bytes."""
    end = _option(0, b"")
    shb = _block(PCAPNG_SHB, SHB.pack({"byte_order_magic": PCAPNG_BOM, "version_major": 1,
                                       "version_minor": 0})
                 + (-1).to_bytes(8, "little", signed=True) + end)
    idb = _block(1, IDB.pack({"linktype": LINKTYPE_ETHERNET, "reserved": 0,
                              "snaplen": 262144}) + _option(2, b"eth0") + end)
    frame = udp_frame("10.0.0.1", 1234, "10.0.0.2", 53, b"hello")

    def epb(ticks: int, options: bytes) -> bytes:
        head = EPB.pack({"interface_id": 0, "ts_high": 0, "ts_low": ticks,
                         "captured_len": len(frame), "orig_len": len(frame)})
        return _block(6, head + frame + b"\0" * (-len(frame) % 4) + options)

    path = tmp_path / "bad-option.pcapng"
    path.write_bytes(shb + idb + epb(1, end) + epb(2, _option(1, b"comment", 300) + end)
                     + epb(3, end))
    return path


CASES = {
    # builder, frames our side reads, what tshark says (its first error line)
    "truncated": (truncated, 7, "cut short in the middle of a packet"),
    "huge-record": (huge_record, 7, "bigger than maximum"),
    "bad-pcapng-option": (bad_option, 3, "option of length 300"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_check_tshark_on_a_capture_tshark_refuses(tmp_path: Path, case: str) -> None:
    build, frames, theirs = CASES[case]
    path = build(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "ump", "dissect", str(path), "--store-port",
                           str(STORE), "--check-tshark", "--brief"], capture_output=True,
                          text=True, check=False, timeout=60)
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.returncode == 2, proc.stderr
    # our own report comes first and is complete
    assert f"# {frames} frames:" in proc.stdout
    refused = [line for line in proc.stderr.splitlines() if "tshark refused" in line]
    assert len(refused) == 1, proc.stderr
    assert refused[0].startswith(f"ump dissect: {path}: tshark refused the file: ")
    assert theirs in refused[0]
    assert "Running as user" not in refused[0]
    if case != "bad-pcapng-option":  # our reader tolerates a damaged option (metadata only)
        assert f"capture damaged after frame {frames}" in proc.stderr


def test_tshark_refusal_names_tshark_s_first_error_line(tmp_path: Path) -> None:
    """The exception carries tshark's own words, without its root warning or the command."""
    from wire.tshark import TsharkRefused, read_frames

    with pytest.raises(TsharkRefused) as caught:
        read_frames(huge_record(tmp_path))
    first = caught.value.first_error
    assert "appears to be damaged or corrupt" in first
    assert "3000000000-byte packet" in first  # tshark's detail line, joined to the first
    assert "\n" not in first and "Running as user" not in first
    assert "use_heuristic" not in first  # not the command line
