"""UDP datagrams cut into IPv4 fragments, in ``ump dissect`` and ``ump analyze`` alike.

tshark reassembles them (``ip.defragment``) and shows the datagram in the frame of the
fragment that completes it; both tools must do the same (:mod:`wire.ipdefrag`), the Spark
decode even when a datagram's fragments lie in different batches, splits or files.  The
oracles: tshark itself (field by field), the Dissector (frame by frame), and the same
scenario generated without an MTU (every analysis the same but for frame positions).
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from captures.generator import generate, icmp_unreachable
from captures.scenarios import PRESETS
from conformance.passive.judge import judge, passive_cases
from conformance.passive.observe import observe
from conformance.passive.tables import observe_columnar
from spark_analysis import decode, framing, schemas
from spark_analysis.columnar import DecodeOptions
from spark_analysis.engine.inputs import load
from spark_analysis.engine.run import analyze
from tests.spark_analysis.test_columnar import (
    SRC,
    assert_matches_dissector,
    data_message,
    lbtrm_frames,
    offsets_of,
    records_of,
)
from tests.spark_analysis.test_columnar import (
    decode as decode_records,
)
from wire import ipdefrag, lbtrm, pcap
from wire.dissect import Dissector, FrameReport, check_against_tshark, dissect_file
from wire.pcap import CaptureRecord, PcapWriter, read_capture
from wire.tshark import PortMap, read_frames

CORPUS = Path(__file__).resolve().parents[2] / "captures" / "corpus"
FRAGMENTS = CORPUS / "fragments.pcap"
STORE = PortMap(store_ports=[14567])
GROUP = "224.10.10.10"
PLACED = {"file", "file_offset", "pos", "response_pos", "example_file", "example_file_offset"}


def _datagram(sqn: int, messages: int = 5, size: int = 900) -> bytes:
    return lbtrm.LbtrmData(ucast_port=14390, session_id=0xABCD0001, sqn=sqn, trail_sqn=0,
                           ucast_naks=1, payload=[data_message(i, "x" * size)
                                                  for i in range(messages)]).build()


def _fragments(sqn: int, ident: int, mtu: int = 1500, **kw: Any) -> list[bytes]:
    return pcap.udp_fragments(SRC, 40000, GROUP, 14400, _datagram(sqn, **kw), ident, mtu)


def tricky_frames() -> list[bytes]:
    """Every way fragments arrive: in order, reversed, a duplicate, a lost last fragment
    whose identification is reused by the next datagram (tshark then mixes the two, and so
    must we), a 68-byte MTU (97 fragments), a first and a second fragment cut by the snap
    length (tshark decodes the first as far as it goes, never the second, and never
    completes their datagram),
    two datagrams interleaved, overlapping fragments with different bytes, and a datagram
    that would be longer than IPv4 allows."""
    frames = lbtrm_frames()
    frames += _fragments(10, 1)
    frames += _fragments(11, 2)[::-1]
    c = _fragments(12, 3)
    frames += [c[0], c[1], c[1], c[2], c[3]]
    frames += _fragments(13, 4)[:-1]
    frames += _fragments(14, 4)
    frames += _fragments(15, 5, mtu=68)
    g = _fragments(16, 6)
    frames += [g[0][:200], g[1][:300], *g[2:]]
    for x, y in zip(_fragments(17, 7), _fragments(18, 8), strict=True):
        frames += [x, y]
    # overlap: a rogue copy of the second fragment, shifted 8 bytes back and with other
    # bytes, comes first; the lower offset's bytes are kept where they overlap
    o = _fragments(19, 9)
    head = pcap.IP4.decode(o[1], pcap.ETH.size)
    rogue = pcap.ipv4_frame(head["src"], head["dst"], pcap.PROTO_UDP, b"\xee" * 1000, 9,
                            pcap.IP_MORE_FRAGMENTS | ((head["flags_frag"] & 0x1FFF) - 1))
    frames += [o[0], rogue, *o[1:]]
    # too long: a last fragment at offset 65,512 (the end would pass 65,515)
    frames += [pcap.ipv4_frame(SRC, GROUP, pcap.PROTO_UDP, b"\0" * 64, 10, 8189)]
    return frames


NOT_SHOWN = {ipdefrag.HELD, pcap.SHORT_FRAGMENT_REASON}
"""What ``ump dissect`` says of a fragment that shows no datagram."""


def assert_tshark_shows_the_same_frames(path: Path, reports: list[FrameReport],
                                        ports: PortMap | None = None) -> None:
    """``check_against_tshark`` compares the frames we call UM; here the other side: every
    fragment we show nothing in, tshark shows nothing in either ("Fragmented IP protocol"),
    and every frame we show a reassembled datagram in, tshark shows UM in."""
    theirs = {f.number: f for f in read_frames(path, ports)}

    def um(number: int) -> bool:
        return any(theirs[number].occurrences(p) for p in ("lbtrm", "lbtru", "lbmr", "lbmc"))

    held = [r.number for r in reports if r.reason in NOT_SHOWN]
    assert held and not any(um(n) for n in held)
    assert all(um(r.number) for r in reports if r.reassembled)


def test_tricky_fragments_dissect_as_tshark_does(tmp_path: Path) -> None:
    path = tmp_path / "tricky.pcap"
    pcap.write_pcap(path, tricky_frames())
    reports = list(dissect_file(path))
    assert check_against_tshark(path, reports) == []
    assert_tshark_shows_the_same_frames(path, reports)
    whole = [r for r in reports if r.reassembled]
    # eight datagrams complete (the mixed pair as one; not the cut, nor the too long one)
    assert [len(r.reassembled) for r in whole] == [4, 4, 5, 7, 97, 4, 4, 5]
    assert all(r.reassembled[-1] == r.number for r in whole)
    sqns = [dict(r.occurrences[0].fields)["lbtrm.data.sqn"] for r in whole[:-1]]
    assert sqns == [10, 11, 12, 13, 15, 17, 18]  # the mixed pair: the first datagram's head
    # the overlap: the rogue bytes (lower offset) were kept, where a message header was
    assert whole[-1].status == "malformed" and "offset 1870" in (whole[-1].reason or "")
    assert {r.reason for r in reports if r.status == "not-um"} == NOT_SHOWN
    # the first fragment cut by the snap length is decoded as far as it goes (tshark too)
    cut = next(r for r in reports if r.status == "malformed" and not r.reassembled)
    assert "truncated" in (cut.reason or "") and cut.transport == "lbtrm"
    assert cut.number == len(lbtrm_frames()) + 4 + 4 + 5 + 3 + 4 + 97 + 1


@pytest.mark.parametrize("batch_size", [None, 1, 3, 16])
def test_tricky_fragments_decode_as_the_dissector_does(batch_size: int | None) -> None:
    """In any batches (a datagram's fragments in several), the columnar decode gives every
    frame what the Dissector gives it; the fragments that show no datagram are counted by
    why."""
    records = records_of(tricky_frames())
    tables = decode_records(records, DecodeOptions(), batch_size)
    counts = assert_matches_dissector(records, tables, PortMap())
    assert counts["um"] == len(lbtrm_frames()) + 7 and counts["malformed"] == 2
    reasons = {r["reason"]: r["frames"] for r in tables.skipped.to_pylist()}
    assert reasons == {ipdefrag.HELD: 4 + 4 + 5 + 7 + 97 + 4 + 4 + 5 - 8,
                       ipdefrag.INCOMPLETE: 2 + 1,  # behind the cut ones; the too long one
                       pcap.SHORT_FRAGMENT_REASON: 1}


def _tagged(frame: bytes, vlan: int) -> bytes:
    """``frame`` with an 802.1Q tag of VLAN ``vlan`` after its Ethernet addresses."""
    eth = pcap.ETH.decode(frame)
    tag = pcap.VLAN.pack({"tci": vlan, "ethertype": eth["ethertype"]})
    return pcap.ETH.pack({**eth, "ethertype": pcap.VLAN_ETHERTYPES[0]}) + tag + frame[
        pcap.ETH.size:]


def trunk_frames() -> list[bytes]:
    """Datagrams routed between VLANs 10 and 20 and captured on a trunk: each fragment
    twice, once per VLAN, the copies interleaved; from a private source (tshark keys its
    fragments by VLAN too: two datagrams), then from a public one (no VLAN in the key: the
    copies mix, the first completes and the second copy's last fragment starts a datagram
    that never completes)."""
    frames = []
    for ident, source in ((20, SRC), (21, "198.51.100.7")):
        copy = pcap.udp_fragments(source, 40000, GROUP, 14400, _datagram(ident), ident, 1500)
        for piece in copy:
            frames += [_tagged(piece, 10), _tagged(piece, 20)]
    return frames


def test_fragments_are_keyed_by_vlan_where_tshark_keys_them(tmp_path: Path) -> None:
    path = tmp_path / "trunk.pcap"
    pcap.write_pcap(path, trunk_frames())
    reports = list(dissect_file(path))
    assert check_against_tshark(path, reports) == []
    assert_tshark_shows_the_same_frames(path, reports)
    whole = [r.number for r in reports if r.reassembled]
    assert whole == [7, 8, 15]   # 4 fragments a datagram, 2 copies each
    assert [dict(r.occurrences[0].fields)["lbtrm.data.sqn"] for r in reports
            if r.reassembled] == [20, 20, 21]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("batch_size", [None, 1, 3])
def test_trunk_fragments_decode_as_the_dissector_does(
        batch_size: int | None, compiled: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not compiled:   # the numpy header decode, the compiled one's reference
        monkeypatch.setattr(framing, "_compiled_network", None)
    records = records_of(trunk_frames())
    tables = decode_records(records, DecodeOptions(), batch_size)
    counts = assert_matches_dissector(records, tables, PortMap())
    assert counts["um"] == 3
    reasons = {r["reason"]: r["frames"] for r in tables.skipped.to_pylist()}
    # the mixed copies: seven fragments held in the one datagram, the last copy alone
    assert reasons == {ipdefrag.HELD: 3 + 3 + 6, ipdefrag.INCOMPLETE: 1}


def test_stage_two_takes_fragments_in_any_order_and_grouping() -> None:
    """Stage 2 replays a datagram's fragments in capture order whatever order its input
    rows come in (Spark's shuffle keeps none), and one group of rows per datagram key gives
    what all of them together give."""
    records = records_of(tricky_frames())
    first = decode.columnar.decode_batch(
        decode.columnar.frames_batch(records, "t.pcap", offsets_of(records)), DecodeOptions())
    rows = first.tcp_segments
    assert set(rows["src_port"].to_pylist()) == {schemas.FRAGMENT_PORT}
    whole = decode.columnar.reassemble(rows, DecodeOptions())
    shuffled = rows.take(pa.array(random.Random(1).sample(range(rows.num_rows), rows.num_rows)))
    by_key = [decode.columnar.reassemble(shuffled.filter(pc.equal(shuffled["dst_port"], ident)),
                                         DecodeOptions())
              for ident in set(rows["dst_port"].to_pylist())]
    merged = schemas.concat_tables(by_key)
    keys = [("file_offset", "ascending"), ("msg_index", "ascending")]
    assert whole.packets.num_rows == 8
    for got in (decode.columnar.reassemble(shuffled, DecodeOptions()), merged):
        assert got.messages.sort_by(keys).equals(whole.messages.sort_by(keys))
        assert got.packets.sort_by(keys[:1]).equals(whole.packets.sort_by(keys[:1]))
        assert got.skipped.sort_by("reason").equals(whole.skipped.sort_by("reason"))


def test_separate_files_never_mix_their_fragments() -> None:
    """Analysed as separate captures, two files' fragments with the same key stay apart
    (each file holds half of a datagram: neither completes); as one capture they join."""
    first, second = _fragments(20, 11)[:2], _fragments(20, 11)[2:]
    records = records_of(first + second)
    batch = pa.Table.from_batches([
        decode.columnar.frames_batch(records[:2], "a.pcap"),
        decode.columnar.frames_batch(records[2:], "b.pcap", [24, 24 + 16 + len(second[0])])])
    joined = decode.columnar.decode_batches([batch], DecodeOptions())
    apart = decode.columnar.decode_batches([batch], DecodeOptions(separate_files=True))
    assert joined.packets.num_rows == 1 and joined.packets["file"].to_pylist() == ["b.pcap"]
    assert apart.packets.num_rows == 0
    assert {r["reason"] for r in apart.skipped.to_pylist()} == {ipdefrag.INCOMPLETE}


# --- the corpus capture: the same traffic as without an MTU ---------------------------------


def _analysed(paths: list[Path], out: Path, split_size: int | None = None) -> dict[str, Any]:
    names = [str(p) for p in paths]
    decode.decode_to_parquet(None, names, str(out), DecodeOptions(STORE), split_size=split_size)
    return analyze(load(str(out), names, per_file=False))


def _rows(table: pa.Table) -> list[str]:
    columns = [c for c in table.schema.names if c not in PLACED]
    return sorted(map(repr, table.select(columns).to_pylist()))


@pytest.fixture(scope="module")
def whole_capture(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The corpus scenario generated again with no MTU: the same traffic, unfragmented."""
    path = tmp_path_factory.mktemp("whole") / "whole.pcap"
    meta = json.loads(Path(f"{FRAGMENTS}.meta.json").read_text())
    scenario = dataclasses.replace(PRESETS["fragments"], ip_mtu=0)
    generate(scenario, path, seed=meta["generator"]["seed"],
             messages=meta["generator"]["messages"], progress=False)
    return path


@pytest.fixture(scope="module")
def unfragmented(whole_capture: Path) -> dict[str, Any]:
    """:func:`whole_capture`, analysed."""
    return _analysed([whole_capture], whole_capture.with_name("decoded"))


def test_the_corpus_capture_is_fragmented_and_dissects_as_tshark_does() -> None:
    meta = json.loads(Path(f"{FRAGMENTS}.meta.json").read_text())
    reports = list(dissect_file(FRAGMENTS, STORE))
    fragments = [r for r in reports if r.reason == ipdefrag.HELD or r.reassembled]
    assert len(fragments) == meta["expected"]["ipv4_fragments"] > len(reports) // 2
    assert {r.transport for r in reports if r.reassembled} == {"lbtrm", "lbtru"}
    assert check_against_tshark(FRAGMENTS, reports, STORE) == []
    assert_tshark_shows_the_same_frames(FRAGMENTS, reports, STORE)


def test_every_analysis_is_the_one_without_fragments(
        tmp_path: Path, unfragmented: dict[str, Any]) -> None:
    """Decoded in splits of 64 KiB (most datagrams' fragments cross one), every result of
    the fragmented capture equals the unfragmented one's but for frame positions."""
    ours = _analysed([FRAGMENTS], tmp_path / "decoded", split_size=64 << 10)
    assert ours.keys() == unfragmented.keys()
    assert ours["stability_acks"].num_rows > 0 and ours["retransmission_requests"].num_rows > 0
    for name, table in unfragmented.items():
        assert _rows(ours[name]) == _rows(table), name


def test_a_capture_rotated_inside_datagrams_is_one_capture(
        tmp_path: Path, unfragmented: dict[str, Any]) -> None:
    """Cut into files in the middle of datagrams (``tcpdump -C`` does not care), analysed as
    one capture: the fragments on either side of a cut are reassembled."""
    records = list(read_capture(FRAGMENTS))
    dissector = Dissector(STORE)
    middles = [i for i, r in enumerate(records)
               if dissector.frame(r).reason == ipdefrag.HELD
               and 0 < i < len(records) - 1]
    cuts = sorted(random.Random(3).sample(middles, 3))
    bounds = [0, *(c + 1 for c in cuts), len(records)]
    paths = [tmp_path / f"cap{i}.pcap" for i in range(len(bounds) - 1)]
    for path, start, end in zip(paths, bounds, bounds[1:], strict=False):
        _write(path, records[start:end])
    ours = _analysed(paths, tmp_path / "decoded")
    for name, table in unfragmented.items():
        assert _rows(ours[name]) == _rows(table), name


def _write(path: Path, records: list[CaptureRecord]) -> None:
    with PcapWriter(path, linktype=records[0].linktype) as writer:
        for record in records:
            writer.write(record.ts, record.data)


@pytest.mark.parametrize("columnar", [False, True])
def test_passive_verdicts_are_the_ones_without_fragments(whole_capture: Path,
                                                         columnar: bool) -> None:
    """``ump conform --capture`` (frame by frame, or through the columnar decode) judges the
    fragmented capture as the unfragmented one, case by case and entity by entity."""
    observe_with = observe_columnar if columnar else observe

    def verdicts(path: Path) -> list[tuple[str, str, str]]:
        return sorted((r.spec.id, r.entity, r.verdict.value)
                      for r in judge(observe_with([path], STORE), passive_cases()))

    ours = verdicts(FRAGMENTS)
    assert ("pass" in {v for _, _, v in ours}) and ours == verdicts(whole_capture)


def test_the_dataframe_path_reassembles_across_partitions(spark: Any, tmp_path: Path) -> None:
    """``spark.read.format("pcap")`` cuts the capture into small partitions (a datagram's
    fragments in several); ``decode_frames`` gives the rows the in-process decode gives."""
    path = tmp_path / "tricky.pcap"
    pcap.write_pcap(path, tricky_frames())
    frames = spark.read.format("pcap").option("splitSize", 16384).load(str(path))
    assert frames.rdd.getNumPartitions() >= 4
    decoded = decode.decode_frames(frames, DecodeOptions())
    try:
        expected = decode.columnar.decode_batches([decode.columnar.frames_batch_from_capture(
            path)], DecodeOptions())
        key = ["file_offset", "protocol", "packet_type", "sqn", "messages", "malformed_reason"]
        got = decoded.packets.toArrow().select(key).sort_by("file_offset")
        assert got.num_rows == expected.packets.num_rows == len(lbtrm_frames()) + 9
        assert got.to_pylist() == expected.packets.select(key).sort_by("file_offset").to_pylist()
        assert ({(r["reason"], r["frames"]) for r in decoded.skipped.collect()}
                == {(r["reason"], r["frames"]) for r in expected.skipped.to_pylist()})
    finally:
        decoded.unpersist()


def test_fragments_without_timestamps_are_replayed_in_file_order() -> None:
    """pcapng simple packet blocks carry no time: such fragments are replayed in file order
    (nulls last, as stage 2 orders TCP segments) and their datagram's frame has no time."""
    records = records_of(_fragments(30, 12)[::-1])
    batch = decode.columnar.frames_batch(records, "spb.pcapng")
    batch = batch.set_column(batch.schema.get_field_index("ts_ns"), "ts_ns",
                             pa.nulls(batch.num_rows, pa.int64()))
    tables = decode.columnar.decode_batches([batch], DecodeOptions())
    assert tables.packets["file_offset"].to_pylist() == [batch["file_offset"][-1].as_py()]
    assert tables.packets["ts_ns"].null_count == 1 and tables.messages.num_rows == 5


def edge_frames() -> list[bytes]:
    """Three more of tshark's rules: a second "last" fragment does not move the end the first
    one set (the datagram is 150 bytes, not the whole 2-message datagram); a whole first
    fragment of an ICMP error is held for reassembly (its quoted NAK is not shown); and a
    plain NAK after them for contrast."""
    whole = pcap.udp_frame(SRC, 40000, GROUP, 14400, _datagram(40, messages=2, size=100))
    payload = whole[pcap.ETH.size + pcap.IP4.size:]
    head = pcap.IP4.decode(whole, pcap.ETH.size)

    def piece(at: int, data: bytes, more: bool) -> bytes:
        return pcap.ipv4_frame(head["src"], head["dst"], pcap.PROTO_UDP, data, 21,
                               (pcap.IP_MORE_FRAGMENTS if more else 0) | at // 8)

    nak = pcap.udp_frame("10.0.0.2", 40001, SRC, 14390, lbtrm.LbtrmNak(
        ucast_port=14390, session_id=0xABCD0001, naks=[1, 2]).build())
    quoted = icmp_unreachable(SRC, "10.0.0.2", nak[pcap.ETH.size:])
    icmp = bytearray(quoted)
    icmp[pcap.ETH.size + 6] |= pcap.IP_MORE_FRAGMENTS >> 8  # "more fragments": held
    return [piece(16, payload[16:150], False), piece(16, payload[16:], False),
            piece(0, payload[:16], True), bytes(icmp), nak]


def test_edge_fragments_as_tshark_shows_them(tmp_path: Path) -> None:
    path = tmp_path / "edges.pcap"
    pcap.write_pcap(path, edge_frames())
    reports = list(dissect_file(path))
    assert check_against_tshark(path, reports) == []
    assert [r.status for r in reports] == ["not-um", "not-um", "malformed", "not-um", "um"]
    assert reports[2].reassembled == [1, 2, 3]  # 150 bytes: the second message cut short
    assert reports[3].reason == pcap.LATER_FRAGMENT_REASON
    theirs = {f.number: f for f in read_frames(path)}
    assert not theirs[4].occurrences("lbtrm") and theirs[5].occurrences("lbtrm")
    records = records_of(edge_frames())
    assert_matches_dissector(records, decode_records(records, DecodeOptions()), PortMap())


def test_a_file_is_replayed_in_record_order_whatever_its_timestamps() -> None:
    """Timestamps may step back within a file (merged or multi-queue captures): the
    fragments are replayed in record order, as tshark reads them, so the datagram shows in
    the same frame for both tools."""
    frames = _fragments(41, 22)
    records = [CaptureRecord(i + 1, 1_700_000_000.0 + (0.5 if i == len(frames) - 1 else i),
                             pcap.LINKTYPE_ETHERNET, f, len(f))
               for i, f in enumerate(frames)]  # the last one's time before the third's
    tables = decode_records(records, DecodeOptions())
    assert_matches_dissector(records, tables, PortMap())
    assert tables.packets["file_offset"].to_pylist() == [offsets_of(records)[-1]]
