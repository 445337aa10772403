"""``ump dissect`` and ``ump analyze`` classify every frame identically (one detector).

Both tools ask :mod:`wire.detect` which frames are UM: the Dissector frame by frame, the
columnar decode column-wise (:mod:`spark_analysis.classify`).  Here every frame of every
corpus capture goes through both, under several option sets (the corpus's store port with
and without the content rules, and no options at all), and each frame's verdict (protocol
and how it was found: port or content, or not UM) must be the same on both sides.

LBT-TCP: the detector's verdict is per segment (a segment with payload on a candidate
connection); what reassembly then makes of it is a different question, not compared here.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.compute as pc
import pytest

from spark_analysis import columnar
from spark_analysis.schemas import FRAGMENT_PORT, DecodeOptions
from tests.wire.test_detect import real_trait_frames
from wire.dissect import Dissector
from wire.pcap import read_capture, udp_frame, write_pcap
from wire.tshark import PortMap

CORPUS = Path(__file__).resolve().parents[2] / "captures" / "corpus"
CAPTURES = sorted(CORPUS.glob("*.pcap"))
STORE_PORT = 14567

Verdict = tuple[str, str] | None
"""(protocol, "port" | "content"), or None for a frame that is not UM."""

OPTION_SETS: dict[str, tuple[PortMap, bool]] = {
    "store-port": (PortMap(store_ports=[STORE_PORT]), True),
    "store-port, ports only": (PortMap(store_ports=[STORE_PORT]), False),
    "no options": (PortMap(), True),
    # every default range moved off the corpus's ports: its UM is where tshark would not
    # look, as on a deployment with non-default ports, and only the content rules find it
    "ranges moved away": (PortMap(
        store_ports=[STORE_PORT], lbttcp_source=(1, 1), lbttcp_request=(2, 2),
        lbtru_source=(3, 3), lbtru_receiver=(4, 4), lbtrm_mc_range=("239.1.1.1", "239.1.1.1"),
        lbtrm_dport=(5, 5), lbtrm_sport=(6, 6), lbmr_uc_ports=(7, 7), lbmr_uc_dest_port=8,
        lbmr_mc=("239.1.1.2", 9)), True),
}


def dissect_verdicts(path: Path, ports: PortMap, content: bool) -> dict[int, Verdict]:
    """Frame number -> verdict of ``ump dissect`` (its reports' transport and classified_by)."""
    out: dict[int, Verdict] = {}
    for report in Dissector(ports, content).run(read_capture(path)):
        out[report.number] = ((report.transport, report.classified_by or "")
                              if report.transport is not None else None)
    return out


def analyze_verdicts(path: Path, ports: PortMap, content: bool) -> dict[int, Verdict]:
    """Frame number -> verdict of the columnar decode ``ump analyze`` runs: a ``packets`` row
    (protocol, classified_by), or None for a frame counted in ``skipped``."""
    batch = columnar.frames_batch_from_capture(path)
    number = {off: i + 1 for i, off in enumerate(batch.column("file_offset").to_pylist())}
    tables = columnar.decode_batch(batch, DecodeOptions(ports, content_heuristics=content))
    out: dict[int, Verdict] = dict.fromkeys(number.values())
    rows = tables.packets.select(["file_offset", "protocol", "classified_by"]).to_pylist()
    for row in rows:
        out[number[row["file_offset"]]] = (row["protocol"], row["classified_by"])
    # TCP segments still to be reassembled are classified already (stage 2 only frames
    # them); a SYN without payload goes there too, to start a stream, but carries no UM
    stage2 = tables.tcp_segments
    fragment = pc.equal(stage2["src_port"], FRAGMENT_PORT)
    segments = stage2.filter(pc.invert(fragment))
    for off, payload in zip(segments.column("file_offset").to_pylist(),
                            segments.column("payload").to_pylist(), strict=True):
        if payload:
            out[number[off]] = ("lbttcp", "port")
    # IPv4 fragments: classified once stage 2 has made their datagrams whole, in the frame
    # that completes each (as the Dissector does)
    whole = columnar.reassemble(stage2.filter(fragment), DecodeOptions(ports, content))
    for row in whole.packets.select(["file_offset", "protocol", "classified_by"]).to_pylist():
        out[number[row["file_offset"]]] = (row["protocol"], row["classified_by"])
    return out


@pytest.fixture(scope="module")
def real_traits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("traits") / "real-traits.pcap"
    write_pcap(path, real_trait_frames())
    return path


def assert_same_verdicts(capture: Path, options: str) -> None:
    ports, content = OPTION_SETS[options]
    ours = dissect_verdicts(capture, ports, content)
    spark = analyze_verdicts(capture, ports, content)
    assert ours.keys() == spark.keys(), "both tools see every frame"
    differ = {n: (ours[n], spark[n]) for n in ours if ours[n] != spark[n]}
    assert not differ, (f"{len(differ)} frames classified differently (dissect, analyze), "
                        f"first: {dict(list(differ.items())[:5])}")


@pytest.mark.parametrize("options", list(OPTION_SETS))
@pytest.mark.parametrize("capture", CAPTURES, ids=[p.name for p in CAPTURES])
def test_both_tools_classify_every_frame_identically(capture: Path, options: str) -> None:
    assert_same_verdicts(capture, options)


@pytest.mark.parametrize("options", list(OPTION_SETS))
def test_both_tools_agree_on_real_deployment_traits(real_traits: Path, options: str) -> None:
    assert_same_verdicts(real_traits, options)


def test_icmp_quoted_datagrams_and_8023_frames_in_analyze(real_traits: Path) -> None:
    """A NAK quoted in an ICMP port unreachable is an LBT-RM NAK row with the quoted
    datagram's addresses and ``icmp_type``/``icmp_code`` (3/3); an ICMP error quoting no UM
    and an 802.3/LLC frame are skipped with reasons that say what they are."""
    tables = columnar.decode_batches([columnar.frames_batch_from_capture(real_traits)])
    rows = tables.packets.to_pylist()
    quoted = [r for r in rows if r["icmp_type"] is not None]
    assert sorted((r["packet_type"], r["src_ip"], r["dst_port"], str(r["nak_sqns"]),
                   r["icmp_type"], r["icmp_code"], r["classified_by"]) for r in quoted) == [
        ("nak", "10.0.0.2", 14390, "[3, 4]", 3, 3, "port"),
        ("nak", "10.0.0.2", 34567, "[3, 4]", 3, 3, "content")]
    assert all(r["icmp_type"] is None for r in rows if r not in quoted)
    reasons = {r["reason"]: r["frames"] for r in tables.skipped.to_pylist()}
    assert reasons == {
        "not IPv4 (IEEE 802.3 frame with an LLC header, length 38)": 1,
        "UDP matches no UM port rule and decodes as no UM protocol": 1}


def test_the_corpus_is_there_and_has_um_found_only_by_content() -> None:
    """The comparison means something: with the ranges moved away every UDP protocol of the
    corpus is found by content alone, and there are frames that are not UM."""
    assert len(CAPTURES) >= 6
    ports, content = OPTION_SETS["ranges moved away"]
    verdicts = {v for path in CAPTURES for v in
                dissect_verdicts(path, ports, content).values()}
    assert {("lbtrm", "content"), ("lbtru", "content"), ("lbmr", "content"),
            ("lbttcp", "port"), None} <= verdicts


def test_both_commands_take_the_same_detection_options() -> None:
    """``ump dissect`` and ``ump analyze`` parse the same detection options into the same
    port map and content switch (the options of docs/wire-transports.md §8.1)."""
    import argparse

    from spark_analysis import job
    from wire import cli

    analyze = argparse.ArgumentParser()
    job.add_arguments(analyze)
    front = argparse.ArgumentParser()
    cli.register(front.add_subparsers())
    detection = ["--store-port", "14567", "--lbtrm-mc-range", "239.192.0.0/16",
                 "--lbtrm-dest-ports", "12000-12100", "--lbtrm-source-ports", "34567",
                 "--lbmr-mc", "239.255.0.1:5000", "--lbmr-uc-ports", "5001-5002",
                 "--lbttcp-request-ports", "20000-20001", "--no-content-heuristics"]
    a = analyze.parse_args(["x.pcap", "--out", "o", *detection])
    d = front.parse_args(["dissect", "x.pcap", *detection])
    assert cli.port_map(a) == cli.port_map(d) != PortMap()
    assert cli.port_map(d).lbtrm_mc_range == ("239.192.0.0", "239.192.255.255")
    assert a.no_content_heuristics and d.no_content_heuristics


def mutated_frames(count: int, seed: int) -> list[bytes]:
    """UM datagrams on ports no default covers, most of them damaged a little (a byte
    changed, cut short, bytes appended): where the frame-by-frame and the column-wise clean
    decode could part ways."""
    import random

    from tests.wire.test_detect import lbmr_v1, rm_data, rm_nak
    from wire import lbtru

    rng = random.Random(seed)
    bases = [rm_data(1), rm_nak(), lbmr_v1(), lbtru.LbtruSm(sm_sqn=1, lead_sqn=2, syn=1).build(),
             lbtru.LbtruAck(ack_sqn=5).build(),
             lbtru.LbtruNak(naks=[1, 2], options=[lbtru.SidOption(session_id=3)]).build()]
    frames = []
    for _ in range(count):
        raw = bytearray(rng.choice(bases))
        how = rng.randrange(5)
        if how == 1:
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        elif how == 2:
            del raw[rng.randrange(1, len(raw)):]
        elif how == 3:
            raw += rng.randbytes(rng.randint(1, 8))
        elif how == 4:
            raw[rng.randrange(min(4, len(raw)))] ^= 1 << rng.randrange(8)
        dst = rng.choice(["239.192.1.1", "10.0.0.2"])
        frames.append(udp_frame("10.0.0.1", 40000, dst, rng.randrange(1024, 60000), bytes(raw)))
    return frames


def test_both_tools_agree_on_damaged_um_on_any_port(tmp_path: Path) -> None:
    path = tmp_path / "mutated.pcap"
    write_pcap(path, mutated_frames(3000, 19))
    ours = dissect_verdicts(path, PortMap(), True)
    spark = analyze_verdicts(path, PortMap(), True)
    differ = {n: (ours[n], spark[n]) for n in ours if ours[n] != spark[n]}
    assert not differ, f"{len(differ)} frames differ, first: {dict(list(differ.items())[:5])}"
    found = [v for v in ours.values() if v is not None]
    assert len(found) > 1000 and len(found) < 3000, "some damage is refused, the rest found"


def test_a_topic_name_that_is_not_utf8_does_not_stop_the_decode(tmp_path: Path) -> None:
    """Found by the damaged-datagram test: an LBMR name with a byte that is not UTF-8 (wire
    keeps it with a surrogate escape) is shown with U+FFFD, as LBMC topic names are."""
    import wire.lbmr as L
    from wire.fields import bytes_text

    raw = L.LbmrPacket(tirs=[L.Tir(name=bytes_text(b"t\xffopic"), ttl=1, index=1, info=(
        L.LbtruSidInfo(ip="10.0.0.1", session_id=9, port=1)))]).build()
    path = tmp_path / "name.pcap"
    write_pcap(path, [udp_frame("10.0.0.1", 50000, "224.9.10.11", 12965, raw)])
    tables = columnar.decode_batches([columnar.frames_batch_from_capture(path)])
    assert tables.advertisements.column("topic").to_pylist() == ["t\ufffdopic"]


def test_um_found_by_content_alone_is_analysed_as_um_found_by_port(tmp_path: Path) -> None:
    """The real-traits capture (LBT-RM from an ephemeral port, LBMR version 1 with options
    on multicast) with every UDP range moved away: its LBT-RM, LBT-RU and topic resolution
    are found by content alone, and the analyses of them are those of a run that finds
    them by port (the topics, their queries, the transport sessions and their gaps)."""
    from spark_analysis import decode
    from spark_analysis.engine.inputs import load
    from spark_analysis.engine.run import analyze

    path = CORPUS / "real-traits.pcap"
    results = {}
    for name in ("store-port", "ranges moved away"):
        ports, content = OPTION_SETS[name]
        out = tmp_path / name.replace(" ", "-")
        stored = decode.decode_to_parquet(None, [str(path)], str(out),
                                          DecodeOptions(ports, content_heuristics=content))
        assert stored.rows["packets"] > 0
        results[name] = analyze(load(str(out), [str(path)], per_file=False))
    by_port, by_content = results["store-port"], results["ranges moved away"]
    for output in ("topic_advertisements", "topic_queries", "transport_sessions",
                   "sequence_summary", "retransmission_summary"):
        assert by_port[output].num_rows > 0, output
        assert by_content[output].equals(by_port[output]), output
    # the topic resolution really was found by content there (version 1 with options)
    versions = {v for v in dissect_verdicts(path, *OPTION_SETS["ranges moved away"]).values()
                if v is not None and v[0] == "lbmr"}
    assert versions == {("lbmr", "content")}
