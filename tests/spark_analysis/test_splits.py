"""Byte-range splits of captures (spark_analysis/splits.py, and capture_files.py beneath it),
without Spark.

The central property: however a file is cut into splits, the union of what the splits read is
exactly what :func:`wire.pcap.read_capture` reads, each record read once, by the split its
header starts in.  The files are built to be hard for the boundary search: payloads carry fake
record headers whose lengths point exactly at the next real record, timestamps that look
right, pcapng payloads carry fake blocks with valid trailers.  Small snaplens keep the files
small while still making the search look back over many records.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import random
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pa = pytest.importorskip("pyarrow", reason="pyarrow is in the 'spark' extra")

import pyarrow.fs as pafs  # noqa: E402

from spark_analysis import capture_files, splits  # noqa: E402
from spark_analysis.capture_files import CaptureError, expand_paths, open_capture  # noqa: E402
from spark_analysis.splits import (  # noqa: E402
    CAPTURE_SCHEMA,
    SYNC_CHAIN,
    TS_AFTER_FIRST,
    TS_NEIGHBOUR,
    Split,
    SplitReader,
    plan_splits,
)
from tests.wire.test_pcap import Iface, epb, idb, other_block, shb, spb  # noqa: E402
from wire import pcap  # noqa: E402
from wire.errors import WireError  # noqa: E402
from wire.fastpath import derive  # noqa: E402

BASE_SEC = 1_700_000_000
HYPOTHESIS = settings(suppress_health_check=[HealthCheck.function_scoped_fixture,
                                             HealthCheck.too_slow])

# --- building captures ---------------------------------------------------------------------------


@dataclass
class Built:
    """A capture's bytes and, for each record, where its header starts."""

    blob: bytes
    offsets: list[int]  # every record / block boundary, packets or not
    packets: list[int]  # offsets of the packet records only
    ts: list[int | None]  # per packet: the exact ts_ns the reader must give

    def write(self, path: Path) -> Path:
        path.write_bytes(self.blob)
        return path


def record_header(order: str, sec: int, frac: int, caplen: int, orig: int) -> bytes:
    layout = derive(pcap.PcapRecordLE if order == "<" else pcap.PcapRecordBE)
    return layout.pack({"ts_sec": sec, "ts_frac": frac, "incl_len": caplen, "orig_len": orig})


def pcap_file(records: Sequence[tuple[int, int, bytes]], *, order: str = "<",
              nanosecond: bool = False, snaplen: int = 65535,
              linktype: int = pcap.LINKTYPE_ETHERNET, orig_extra: int = 0) -> Built:
    header = derive(pcap.PcapHeaderLE if order == "<" else pcap.PcapHeaderBE)
    out = bytearray(header.pack({
        "magic": pcap.PCAP_MAGIC_NS if nanosecond else pcap.PCAP_MAGIC_US,
        "version_major": 2, "version_minor": 4, "thiszone": 0, "sigfigs": 0,
        "snaplen": snaplen, "linktype": linktype}))
    offsets = []
    for sec, frac, data in records:
        offsets.append(len(out))
        out += record_header(order, sec, frac, len(data), len(data) + orig_extra) + data
    unit = 1 if nanosecond else 1000
    return Built(bytes(out), offsets, offsets, [s * 10**9 + f * unit for s, f, _ in records])


def with_fake(data: bytes, at: int, order: str, sec: int, frac: int) -> bytes:
    """``data`` with a plausible record header at ``at`` whose record ends exactly where
    ``data`` ends: followed forward, it lands on the next real record."""
    caplen = len(data) - at - 16
    assert caplen >= 0
    return data[:at] + record_header(order, sec, frac, caplen, caplen) + data[at + 16 :]


PACKET = object()  # marks a block as a packet without a timestamp (SPB)


def pcapng_file(blocks: Sequence[tuple[bytes, Any]]) -> Built:
    """Concatenate (block bytes, ts_ns of a packet / PACKET for an SPB / None) pairs."""
    out, offsets, packets, stamps = b"", [], [], []
    for block, ts in blocks:
        offsets.append(len(out))
        if ts is not None:
            packets.append(len(out))
            stamps.append(None if ts is PACKET else ts)
        out += block
    return Built(out, offsets, packets, stamps)


def fake_block(order: str, size: int) -> bytes:
    """Bytes that look like one complete pcapng block (type, length, trailing length)."""
    import struct

    body = bytes((i * 7) & 0xFF for i in range(size - 12))
    return struct.pack(order + "II", 6, size) + body + struct.pack(order + "I", size)


# --- reading them --------------------------------------------------------------------------------

Row = tuple[Any, ...]


def split_size_for(size: int, count: int) -> int:
    return max(1, math.ceil(size / count))


def read_rows(path: Path, count: int, *, pcapng_index: capture_files.PcapngIndexMode = "head",
              max_rows: int = 7, chunk_size: int = 64,
              on_truncated: Any = "error", exact: bool = True) -> list[Row]:
    """Every row read through ``count`` splits; checks each split reads only what it owns:
    the records in ``[sync(start), sync(end))``, which are those whose header starts in
    ``[start, end)`` when the boundary search is ``exact`` (the files built to make it miss
    boundaries on purpose pass ``exact=False``)."""
    capture = open_capture(str(path), pcapng_index)
    rows: list[Row] = []
    planned = plan_splits(capture, split_size_for(capture.size, count))
    assert 1 <= len(planned) <= count
    for split in planned:
        reader = SplitReader(split, max_rows, chunk_size, on_truncated)
        for batch in reader:
            assert batch.schema == CAPTURE_SCHEMA
            assert batch.num_rows <= max_rows
            for row in batch.to_pylist():
                assert reader.start <= row["file_offset"] < reader.stop
                if exact:
                    assert split.start <= row["file_offset"] < split.end, (split, row)
                rows.append(tuple(row.values()))
    return rows


def truth(path: Path) -> list[pcap.CaptureRecord]:
    out: list[pcap.CaptureRecord] = []
    with contextlib.suppress(WireError):  # a truncated last record: the complete ones count
        out.extend(pcap.read_capture(path))
    return out


def assert_same_as_read_capture(rows: list[Row], path: Path, built: Built,
                                kept: int | None = None) -> None:
    """``rows`` are the first ``kept`` packets of ``built`` (all by default), the same as
    read_capture reads, with the exact timestamps the builder wrote."""
    expected = truth(path)
    kept = len(built.packets) if kept is None else kept
    assert [r[1] for r in rows] == built.packets[:kept]
    assert [r[2] for r in rows] == built.ts[:kept]
    assert [r[7] for r in rows] == [e.data for e in expected]
    assert [(r[3], r[4], r[5]) for r in rows] == [
        (len(e.data), e.orig_len, e.linktype) for e in expected]
    for row, record in zip(rows, expected, strict=True):
        if row[2] is None:
            assert record.ts == 0.0  # read_capture's stand-in for "no timestamp" (SPB)
        else:
            assert row[2] / 1e9 == pytest.approx(record.ts, abs=1e-6)
    assert {r[0] for r in rows} <= {str(path)}


SPLIT_COUNTS = (1, 2, 7, 64)


@pytest.fixture(params=["compiled", "python"])
def walk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The pcap tests run with each record walk: the compiled one the decode uses, and the
    pure Python one it falls back to without a C compiler (in native and foreign byte
    order)."""
    if request.param == "python":
        monkeypatch.setattr(splits, "_compiled_walk", None)
    else:
        assert splits._compiled_walk is not None, "the compiled record walk is not built"
    return str(request.param)

# --- classic pcap --------------------------------------------------------------------------------


def random_records(rng: random.Random, count: int, *, nanosecond: bool, order: str,
                   max_size: int = 300, fake_rate: float = 0.4) -> list[tuple[int, int, bytes]]:
    limit = 10**9 if nanosecond else 10**6
    records = []
    for i in range(count):
        sec, frac = BASE_SEC + i // 3, rng.randrange(limit)
        data = rng.randbytes(rng.randint(0, max_size))
        if len(data) >= 16 and rng.random() < fake_rate:
            data = with_fake(data, rng.randint(0, len(data) - 16), order, sec, frac)
        records.append((sec, frac, data))
    return records


@pytest.mark.usefixtures("walk")
@pytest.mark.parametrize("order", ["<", ">"], ids=["le", "be"])
@pytest.mark.parametrize("nanosecond", [False, True], ids=["us", "ns"])
def test_pcap_same_records_for_any_split_count(tmp_path: Path, order: str,
                                                nanosecond: bool) -> None:
    rng = random.Random(f"{order}{nanosecond}")
    built = pcap_file(random_records(rng, 300, nanosecond=nanosecond, order=order),
                      order=order, nanosecond=nanosecond, snaplen=512)
    path = built.write(tmp_path / "c.pcap")
    reference = read_rows(path, 1)
    assert_same_as_read_capture(reference, path, built)
    for count in SPLIT_COUNTS[1:]:
        assert read_rows(path, count) == reference, count


@pytest.mark.usefixtures("walk")
@HYPOTHESIS
@given(seed=st.integers(0, 2**32), count=st.integers(1, 80), splits_n=st.integers(1, 300),
       order=st.sampled_from("<>"), nanosecond=st.booleans(), max_size=st.integers(0, 600),
       snaplen=st.sampled_from([0, 300, 600, 65535]), chunk=st.integers(64, 2048),
       max_rows=st.integers(1, 50))
def test_pcap_split_property(tmp_path: Path, seed: int, count: int, splits_n: int, order: str,
                             nanosecond: bool, max_size: int, snaplen: int, chunk: int,
                             max_rows: int) -> None:
    rng = random.Random(seed)
    if snaplen:
        max_size = min(max_size, snaplen)
    built = pcap_file(random_records(rng, count, nanosecond=nanosecond, order=order,
                                     max_size=max_size), order=order, nanosecond=nanosecond,
                      snaplen=snaplen)
    path = built.write(tmp_path / f"h{seed}.pcap")
    rows = read_rows(path, splits_n, max_rows=max_rows, chunk_size=chunk)
    assert_same_as_read_capture(rows, path, built)


def first_boundary(offsets: list[int], size: int, x: int) -> int:
    return next((o for o in [*offsets, size] if o >= x), size)


@pytest.mark.parametrize("snaplen", [200, 65535])
def test_pcap_sync_at_every_offset(tmp_path: Path, snaplen: int) -> None:
    """Exhaustive: sync(x) is the first real record at or after x, for every byte x.

    With snaplen 200 the search looks back 216 bytes, so most offsets go through the vote
    among the candidates behind x (and the fakes converge or lose); with 65535 the window
    reaches the file start and the real chain is walked."""
    rng = random.Random(snaplen)
    records = random_records(rng, 60, nanosecond=False, order="<", max_size=200, fake_rate=0.8)
    built = pcap_file(records, snaplen=snaplen)
    capture = open_capture(str(built.write(tmp_path / "s.pcap")))
    size = len(built.blob)
    for x in range(size + 2):
        assert splits.sync(capture, x) == first_boundary(built.offsets, size, x), x


def test_pcap_nanosecond_timestamps_are_exact(tmp_path: Path) -> None:
    fracs = [0, 1, 999_999_999, 123_456_789]
    built = pcap_file([(BASE_SEC + i, f, b"x" * i) for i, f in enumerate(fracs)],
                      nanosecond=True, order=">", linktype=0x1000_0000 | pcap.LINKTYPE_RAW)
    path = built.write(tmp_path / "ns.pcap")
    rows = read_rows(path, 2)
    assert [r[2] for r in rows] == [(BASE_SEC + i) * 10**9 + f for i, f in enumerate(fracs)]
    assert {r[5] for r in rows} == {pcap.LINKTYPE_RAW}  # FCS bits above the link type dropped
    assert {r[6] for r in rows} == {0}


def _read_reporting(path: Path, count: int
                    ) -> tuple[list[dict[str, Any]], list[tuple[Split, splits.TruncatedRecord]]]:
    """Every row read through ``count`` splits, and each split's truncation or damage
    report with the split that made it."""
    capture = open_capture(str(path))
    rows: list[dict[str, Any]] = []
    reports: list[tuple[Split, splits.TruncatedRecord]] = []
    for split in plan_splits(capture, split_size_for(capture.size, count)):
        reader = SplitReader(split, 5, 64, on_truncated=functools.partial(_note, reports,
                                                                          split))
        rows += [r for b in reader for r in b.to_pylist()]
    return rows, reports


def _note(reports: list[tuple[Split, splits.TruncatedRecord]], split: Split,
          report: splits.TruncatedRecord) -> None:
    reports.append((split, report))


@pytest.mark.usefixtures("walk")
@pytest.mark.parametrize("cut", [1, 8, 15, 16, 17, 40])
def test_truncated_last_record_is_dropped_and_reported(
        tmp_path: Path, cut: int, caplog: pytest.LogCaptureFixture) -> None:
    rng = random.Random(cut)
    records = random_records(rng, 40, nanosecond=False, order="<", max_size=100)
    records[-1] = (records[-1][0], 0, b"L" * 50)
    built = pcap_file(records, snaplen=128)
    path = tmp_path / "cut.pcap"
    path.write_bytes(built.blob[:-cut])
    last = built.offsets[-1]
    for count in SPLIT_COUNTS:
        read, owned = _read_reporting(path, count)
        rows = [tuple(r.values()) for r in read]
        for split, report in owned:
            assert split.start <= report.offset < split.end  # by the split that owns it
        reports = [report for _, report in owned]
        assert_same_as_read_capture(rows, path, built, len(built.packets) - 1)
        assert len(reports) == 1, count
        (report,) = reports
        kept = 66 - cut
        assert (report.offset, report.available) == (last, kept)
        assert report.declared == (66 if kept >= 16 else None)
        assert "cut short" in str(report)
    # the default warns, "error" refuses
    caplog.set_level(logging.WARNING, logger="spark_analysis.splits")
    table = splits.read_table(str(path), split_size=97)
    assert table.num_rows == len(records) - 1
    assert f"cut short at offset {last}" in caplog.text
    with pytest.raises(CaptureError, match=f"cut short at offset {last}"):
        splits.read_table(str(path), split_size=97, on_truncated="error")


@pytest.mark.usefixtures("walk")
def test_a_damaged_record_ends_its_piece_and_is_reported_as_damage(tmp_path: Path) -> None:
    # a record declaring a 2 GiB packet (tshark: "File has 2147483647-byte packet, bigger
    # than maximum of 262144"): not a capture cut short, and what follows is not read
    rng = random.Random(7)
    records = random_records(rng, 60, nanosecond=False, order="<", max_size=100,
                             fake_rate=0.0)
    built = pcap_file(records, snaplen=65535)
    blob = bytearray(built.blob)
    bad = built.offsets[20]
    struct.pack_into("<II", blob, bad + 8, 0x7FFFFFFF, 0x7FFFFFFF)
    path = tmp_path / "damaged.pcap"
    path.write_bytes(bytes(blob))
    for count in SPLIT_COUNTS:
        read, owned = _read_reporting(path, count)
        offsets = [r["file_offset"] for r in read]
        reports = [report for _, report in owned]
        assert offsets == sorted(offsets) and set(offsets) <= set(built.offsets) - {bad}
        assert [o for o in offsets if o < bad] == built.offsets[:20]   # all before it
        (report,) = reports
        assert report.damaged and report.offset == bad
        assert "damaged at offset" in str(report) and "2,147,483,647-byte packet" in str(report)
        assert "(262,144)" in str(report) and "cut short" not in str(report)
        if count == 1:   # one piece: nothing after the damage is read (as tshark)
            assert max(offsets) < bad and report.available == len(blob) - bad
    with pytest.raises(CaptureError, match=f"damaged at offset {bad}"):
        splits.read_table(str(path), split_size=97, on_truncated="error")


@pytest.mark.usefixtures("walk")
def test_timestamp_jump_only_slows_the_split_down(tmp_path: Path) -> None:
    """Records beyond TS_AFTER_FIRST of the first one are never sync candidates: the split
    boundaries behind the jump find nothing and the split before reads on to the end."""
    rng = random.Random(5)
    records = random_records(rng, 120, nanosecond=False, order="<", max_size=100)
    jumped = [(s + (TS_AFTER_FIRST + 10 if i >= 40 else 0), f, d)
              for i, (s, f, d) in enumerate(records)]
    built = pcap_file(jumped, snaplen=128)
    path = built.write(tmp_path / "jump.pcap")
    capture = open_capture(str(path))
    assert splits.sync(capture, built.offsets[60] - 3) == capture.size
    for count in SPLIT_COUNTS:
        assert_same_as_read_capture(read_rows(path, count, exact=False), path, built)


@pytest.mark.usefixtures("walk")
def test_caplen_above_snaplen_is_read_but_not_trusted_for_sync(tmp_path: Path) -> None:
    """Records that break the plausibility rules are still read (like read_capture does); the
    boundaries next to them are just not found, so the previous split reads further."""
    rng = random.Random(9)
    records = random_records(rng, 80, nanosecond=False, order="<", max_size=60)
    records[30:34] = [(BASE_SEC + 10, 0, b"B" * 300)] * 4
    built = pcap_file(records, snaplen=64)
    path = built.write(tmp_path / "big.pcap")
    for count in SPLIT_COUNTS:
        assert_same_as_read_capture(read_rows(path, count, exact=False), path, built)


def voting_fakes(tmp_path: Path, voter_sec: int) -> tuple[Path, Built, int, int]:
    """A capture whose second record's payload holds many fakes (stamped ``voter_sec``) that
    all point at one more fake behind a split boundary: (path, built, boundary, where the
    pointed-at fake starts)."""
    order = "<"
    rec = len(record_header(order, 0, 0, 0, 0))
    big = bytearray(b"\x00" * 400)
    fake_at = 300  # the fake every other fake points at; it points at the payload's end
    big[fake_at : fake_at + rec] = record_header(order, BASE_SEC, 0, 400 - fake_at - rec, 84)
    for at in range(40, 200, 20):
        big[at : at + rec] = record_header(order, voter_sec, 0, fake_at - at - rec, 400)
    records = [(BASE_SEC, 0, b"a" * 380), (BASE_SEC, 0, bytes(big)),
               *[(BASE_SEC, 0, b"c" * 30) for _ in range(10)]]
    built = pcap_file(records, snaplen=400)
    path = built.write(tmp_path / "adversarial.pcap")
    boundary = built.offsets[1] + rec + 250  # inside the big payload, after the voting fakes
    return path, built, boundary, built.offsets[1] + rec + fake_at


@pytest.mark.usefixtures("walk")
def test_fake_headers_that_outvote_the_truth_fail_loudly(tmp_path: Path) -> None:
    """The vote can be beaten on purpose: many fakes inside one payload that all point at
    one more fake behind the split boundary.  The split before the boundary then sees its
    last record straddle the boundary and refuses, rather than two splits disagreeing."""
    path, _built, boundary, fake = voting_fakes(tmp_path, BASE_SEC)
    capture = open_capture(str(path))
    assert splits.sync(capture, boundary) == fake  # fooled ...
    first, second = (splits.Split(capture, 0, boundary),
                     splits.Split(capture, boundary, capture.size))
    with pytest.raises(CaptureError, match="runs over the split boundary"):
        list(SplitReader(first))  # ... but not silently
    assert list(SplitReader(second))  # the later split alone cannot tell


def test_votes_through_a_timestamp_jump_do_not_count(tmp_path: Path) -> None:
    """The same fakes, but stamped more than TS_NEIGHBOUR after the one they point at
    (which is stamped like the true records around it, so its own chain is fine): adjacent
    records are never that far apart, so their votes are void and the search finds the true
    record after the payload."""
    path, built, boundary, _fake = voting_fakes(tmp_path, BASE_SEC + TS_NEIGHBOUR + 1)
    capture = open_capture(str(path))
    assert splits.sync(capture, boundary) == built.offsets[2]
    rows = [tuple(r.values()) for split in (splits.Split(capture, 0, boundary),
                                            splits.Split(capture, boundary, capture.size))
            for batch in SplitReader(split) for r in batch.to_pylist()]
    assert_same_as_read_capture(rows, path, built)


@pytest.mark.usefixtures("walk")
@pytest.mark.parametrize("fakes", [SYNC_CHAIN, SYNC_CHAIN + 1])
def test_a_fake_chain_needs_sync_chain_successors(tmp_path: Path, fakes: int) -> None:
    """With nothing plausible behind x (no vote), the first candidate after x must be followed
    by SYNC_CHAIN plausible, adjacent headers.  ``fakes`` chained fake headers give the first
    one ``fakes - 1`` successors: SYNC_CHAIN fakes are refused and the real record after the
    payload is found; one more fools the search, which the split before then reports."""
    payload = bytearray(300)  # caplen 300 > snaplen 64: the record itself is no candidate
    for k in range(fakes):
        payload[120 + 24 * k : 136 + 24 * k] = record_header("<", BASE_SEC, 0, 8, 8)
    records = [(BASE_SEC, 0, bytes(payload)), *[(BASE_SEC, i, b"n" * 20) for i in range(8)]]
    built = pcap_file(records, snaplen=64)
    path = built.write(tmp_path / "chain.pcap")
    capture = open_capture(str(path))
    x = built.offsets[0] + 16 + 100
    if fakes == SYNC_CHAIN:
        assert splits.sync(capture, x) == built.offsets[1]
        assert_same_as_read_capture(read_rows(path, 1), path, built)
    else:
        assert splits.sync(capture, x) == built.offsets[0] + 16 + 120
        with pytest.raises(CaptureError, match="runs over the split boundary"):
            list(SplitReader(splits.Split(capture, 0, x)))


@pytest.mark.usefixtures("walk")
def test_records_larger_than_a_chunk(tmp_path: Path) -> None:
    records = [(BASE_SEC, i, bytes([i]) * (5000 * (i % 3))) for i in range(12)]
    built = pcap_file(records)
    path = built.write(tmp_path / "large.pcap")
    for count in (1, 3, 20):
        assert_same_as_read_capture(read_rows(path, count, chunk_size=1024), path, built)


# --- pcapng --------------------------------------------------------------------------------------


def multi_section_pcapng(rng: random.Random, packets: int = 120, fakes: bool = True) -> Built:
    """Two sections (little- then big-endian); the first has two interfaces with different
    if_tsresol (default µs and 10^-9), the second a binary 2^-10 clock; SPBs, an NRB, and
    fake blocks with valid trailers inside packet data."""
    blocks: list[tuple[bytes, Any]] = [
        (shb("<"), None), (idb("<", Iface(pcap.LINKTYPE_ETHERNET)), None),
        (idb("<", Iface(pcap.LINKTYPE_RAW, 9)), None), (other_block("<"), None)]
    for i in range(packets):
        data = rng.randbytes(rng.randint(0, 200))
        if fakes and len(data) >= 48 and rng.random() < 0.5:
            at = rng.randrange(0, len(data) - 32) & ~3
            size = rng.choice([12, 16, 32])
            data = data[:at] + fake_block("<", size) + data[at + size :]
        iface = i % 2
        ticks = (BASE_SEC + i) * (10**6 if iface == 0 else 10**9) + rng.randrange(1000)
        blocks.append((epb("<", iface, ticks, data, orig=len(data) + 3),
                       ticks * (1000 if iface == 0 else 1)))
        if i % 25 == 0:
            blocks.append((spb("<", data[:40]), PACKET))
    blocks += [(shb(">"), None), (idb(">", Iface(pcap.LINKTYPE_ETHERNET, 0x80 | 10)), None)]
    for i in range(packets // 2):
        data = rng.randbytes(rng.randint(0, 120))
        fraction = rng.randrange(1024)
        blocks.append((epb(">", 0, ((BASE_SEC + i) << 10) + fraction, data),
                       (BASE_SEC + i) * 10**9 + fraction * 10**9 // 1024))
    blocks.append((spb(">", b"tail"), PACKET))
    return pcapng_file(blocks)


def test_pcapng_multi_section_same_for_any_split_count(tmp_path: Path) -> None:
    built = multi_section_pcapng(random.Random(1))
    path = built.write(tmp_path / "multi.pcapng")
    reference = read_rows(path, 1, pcapng_index="scan")
    assert_same_as_read_capture(reference, path, built)
    for count in SPLIT_COUNTS[1:]:
        assert read_rows(path, count, pcapng_index="scan") == reference, count
    interfaces = {(r[6], r[5]) for r in reference}
    assert interfaces == {(0, pcap.LINKTYPE_ETHERNET), (1, pcap.LINKTYPE_RAW)}
    assert sum(r[2] is None for r in reference) == 6  # the SPBs


def test_pcapng_sync_at_every_offset(tmp_path: Path) -> None:
    built = multi_section_pcapng(random.Random(2), packets=40)
    capture = open_capture(str(built.write(tmp_path / "s.pcapng")), "scan")
    size = len(built.blob)
    for x in range(size + 2):
        assert splits.sync(capture, x) == first_boundary(built.offsets, size, x), x


def test_pcapng_head_index_refuses_a_second_section(tmp_path: Path) -> None:
    built = multi_section_pcapng(random.Random(3), packets=20)
    path = built.write(tmp_path / "two.pcapng")
    for count in SPLIT_COUNTS:
        with pytest.raises(CaptureError, match="pcapngIndex=scan"):
            read_rows(path, count)


def test_pcapng_head_index_is_enough_for_one_section(tmp_path: Path) -> None:
    rng = random.Random(4)
    blocks: list[tuple[bytes, Any]] = [
        (shb(">"), None), (idb(">", Iface(pcap.LINKTYPE_ETHERNET, 3)), None),
        (idb(">", Iface(pcap.LINKTYPE_ETHERNET)), None)]
    for i in range(150):
        data = rng.randbytes(rng.randint(0, 90))
        ticks = (BASE_SEC + i) * 1000 + i
        blocks.append((epb(">", i % 2, ticks, data), ticks * (10**6 if i % 2 == 0 else 1000)))
    built = pcapng_file(blocks)
    path = built.write(tmp_path / "one.pcapng")
    index = open_capture(str(path)).info
    assert isinstance(index, capture_files.PcapngIndex)
    assert (index.complete, index.head_end) == (False, built.packets[0])
    assert [i.tsresol for i in index.sections[0].interfaces] == [3, 6]
    reference = read_rows(path, 1)
    assert_same_as_read_capture(reference, path, built)
    for count in SPLIT_COUNTS[1:]:
        assert read_rows(path, count) == reference


@HYPOTHESIS
@given(seed=st.integers(0, 2**32), packets=st.integers(0, 60), splits_n=st.integers(1, 200),
       chunk=st.integers(64, 4096), cut=st.integers(0, 40))
def test_pcapng_split_property(tmp_path: Path, seed: int, packets: int, splits_n: int,
                               chunk: int, cut: int) -> None:
    built = multi_section_pcapng(random.Random(seed), packets)
    path = tmp_path / f"h{seed}.pcapng"
    size = len(built.blob) - cut
    path.write_bytes(built.blob[:size])
    ends = dict(zip(built.offsets, [*built.offsets[1:], len(built.blob)], strict=True))
    kept = sum(ends[p] <= size for p in built.packets)
    reports: list[splits.TruncatedRecord] = []
    rows = read_rows(path, splits_n, pcapng_index="scan", chunk_size=chunk,
                     on_truncated=reports.append)
    assert_same_as_read_capture(rows, path, built, kept)
    cut_block = [o for o in built.offsets if o < size < ends[o]]
    assert [r.offset for r in reports] == cut_block


def test_ticks_to_ns() -> None:
    import numpy as np

    ticks = np.array([0, 1, 1023, 1024, 3 * 2**40 + 2**39], np.uint64)
    assert splits._ticks_to_ns(ticks, 0x80 | 10, 0).tolist() == [
        0, 976_562, 999_023_437, 10**9, 3 * 2**30 * 10**9 + 2**29 * 10**9]
    assert splits._ticks_to_ns(ticks, 0x80 | 40, 5).tolist() == [
        5 * 10**9, 5 * 10**9, 5 * 10**9, 5 * 10**9, 8 * 10**9 + 5 * 10**8]
    assert splits._ticks_to_ns(np.array([123_456_789_123], np.uint64), 12, 0).tolist() == [
        123_456_789]
    assert splits._ticks_to_ns(np.array([7], np.uint64), 3, -2).tolist() == [
        7_000_000 - 2 * 10**9]


# --- files, globs and bad input ------------------------------------------------------------------


def test_globs_directories_and_uris(tmp_path: Path) -> None:
    one = pcap_file([(BASE_SEC, 0, b"a")])
    (tmp_path / "d" / "e").mkdir(parents=True)
    for name in ("d/x1.pcap", "d/x2.pcap", "d/e/x3.pcap", "d/.hidden.pcap", "d/_SUCCESS"):
        one.write(tmp_path / name)
    names = lambda refs: [Path(r.name).relative_to(tmp_path).as_posix() for r in refs]  # noqa: E731
    assert names(expand_paths(str(tmp_path / "d" / "x*.pcap"))) == ["d/x1.pcap", "d/x2.pcap"]
    assert names(expand_paths(str(tmp_path / "d" / "**" / "*.pcap"))) == [
        "d/e/x3.pcap", "d/x1.pcap", "d/x2.pcap"]
    assert names(expand_paths(str(tmp_path / "d"))) == ["d/x1.pcap", "d/x2.pcap"]
    # a directory's files that are not captures are passed over (and said), named ones not
    (tmp_path / "d" / "x1.pcap.meta.json").write_text("{}")
    (tmp_path / "d" / "README.md").write_text("# captures\n")
    pcapng_file([(shb(">"), False)]).write(tmp_path / "d" / "y.ntar")
    skipped: list[str] = []
    assert names(expand_paths(str(tmp_path / "d"), skipped)) == [
        "d/x1.pcap", "d/x2.pcap", "d/y.ntar"]
    assert [Path(n).name for n in skipped] == ["README.md", "x1.pcap.meta.json"]
    assert names(expand_paths(str(tmp_path / "d" / "x1*"))) == ["d/x1.pcap",
                                                               "d/x1.pcap.meta.json"]
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "a.txt").write_text("not packets")
    with pytest.raises(CaptureError, match="no capture file in the directory"):
        expand_paths(str(tmp_path / "notes"))
    assert names(expand_paths([str(tmp_path / "d" / "e" / "x3.pcap")])) == ["d/e/x3.pcap"]
    uri = f"file://{tmp_path}/d/x?.pcap"
    assert [r.name for r in expand_paths(uri)] == [
        f"file://{tmp_path}/d/x1.pcap", f"file://{tmp_path}/d/x2.pcap"]
    table = splits.read_table(uri)
    assert table.column("file").to_pylist() == [f"file://{tmp_path}/d/x1.pcap",
                                                f"file://{tmp_path}/d/x2.pcap"]
    with pytest.raises(CaptureError, match="no file matches"):
        expand_paths(str(tmp_path / "d" / "*.pcapng"))
    with pytest.raises(CaptureError, match="no such file"):
        expand_paths(str(tmp_path / "missing.pcap"))
    with pytest.raises(CaptureError, match="no such directory"):
        expand_paths(str(tmp_path / "nowhere" / "*.pcap"))


@pytest.mark.parametrize(("blob", "message"), [
    (b"", "too short to be a capture"),
    (b"\xd4\xc3", "too short to be a capture"),
    (b"GET / HTTP/1.1\r\n" * 3, "not a pcap or pcapng file"),
    (b"\xd4\xc3\xb2\xa1\x02\x00\x04\x00" + bytes(8), "truncated pcap header"),
    (b"\x0a\x0d\x0d\x0a" + bytes(20), "byte-order mark"),
])
def test_not_a_capture(tmp_path: Path, blob: bytes, message: str) -> None:
    path = tmp_path / "bad.pcap"
    path.write_bytes(blob)
    with pytest.raises(CaptureError, match=message) as info:
        open_capture(str(path))
    assert str(path) in str(info.value)


def test_empty_captures_have_no_rows(tmp_path: Path) -> None:
    path = pcap_file([]).write(tmp_path / "empty.pcap")
    assert read_rows(path, 3) == []
    ng = pcapng_file([(shb("<"), False), (idb("<", Iface(1)), False)])
    assert read_rows(ng.write(tmp_path / "empty.pcapng"), 5) == []


def test_damaged_pcapng_block_is_an_error(tmp_path: Path) -> None:
    import struct

    blob = shb("<") + idb("<", Iface(1)) + epb("<", 0, 1, b"ok") + struct.pack("<II", 6, 22)
    path = tmp_path / "damaged.pcapng"
    path.write_bytes(blob + bytes(40))
    with pytest.raises(CaptureError, match="damaged pcapng block"):
        read_rows(path, 1)
    path.write_bytes(shb("<") + idb("<", Iface(1)) + epb("<", 3, 1, b"x"))
    with pytest.raises(CaptureError, match="unknown interface 3"):
        read_rows(path, 1)
    # a block declaring more than any block holds (2 GiB): damage, what follows unread
    head = shb("<") + idb("<", Iface(1)) + epb("<", 0, 1, b"ok")
    path.write_bytes(head + struct.pack("<II", 6, 0x7FFFFFF0) + bytes(64)
                     + epb("<", 0, 2, b"after"))
    reports: list[splits.TruncatedRecord] = []
    (split,) = plan_splits(open_capture(str(path)), 1 << 20)
    rows = [r for b in SplitReader(split, 5, 64, on_truncated=reports.append)
            for r in b.to_pylist()]
    assert len(rows) == 1 and len(reports) == 1
    assert reports[0].damaged and reports[0].offset == len(head)
    assert "2,147,483,632-byte block" in str(reports[0])


def test_bad_options() -> None:
    with pytest.raises(CaptureError, match="splitSize"):
        plan_splits(capture_files.CaptureFile(
            capture_files.FileRef("x", pafs.LocalFileSystem(), "/x"), 10,
            capture_files.PcapInfo("<", 1000, 0, 1, None)), 0)
    with pytest.raises(CaptureError, match="pcapngIndex"):
        open_capture("/dev/null", "everything")  # type: ignore[arg-type]


def test_capture_files_stands_alone_and_splits_re_exports_it() -> None:
    """capture_files (the driver's side: paths, headers, the pcapng index) does not import the
    reader, and the names modules have always imported from splits still come from there."""
    import subprocess
    import sys

    probe = ("import sys, spark_analysis.capture_files; "
             "assert 'spark_analysis.splits' not in sys.modules")
    subprocess.run([sys.executable, "-c", probe], check=True)
    for name in ("CaptureError", "CaptureFile", "FileRef", "Interface", "PcapInfo",
                 "PcapngIndex", "PcapngIndexMode", "Section", "expand_paths", "open_capture",
                 "MiB", "DEFAULT_CHUNK_SIZE", "DEFAULT_CAPLEN_BOUND"):
        assert name in splits.__all__
        assert getattr(splits, name) is getattr(capture_files, name)
