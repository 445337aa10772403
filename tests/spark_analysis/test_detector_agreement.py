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

import pytest

from spark_analysis import columnar
from spark_analysis.schemas import DecodeOptions
from wire.dissect import Dissector
from wire.pcap import read_capture
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
    segments = tables.tcp_segments
    for off, payload in zip(segments.column("file_offset").to_pylist(),
                            segments.column("payload").to_pylist(), strict=True):
        if payload:
            out[number[off]] = ("lbttcp", "port")
    return out


@pytest.mark.parametrize("options", list(OPTION_SETS))
@pytest.mark.parametrize("capture", CAPTURES, ids=[p.name for p in CAPTURES])
def test_both_tools_classify_every_frame_identically(capture: Path, options: str) -> None:
    ports, content = OPTION_SETS[options]
    ours = dissect_verdicts(capture, ports, content)
    spark = analyze_verdicts(capture, ports, content)
    assert ours.keys() == spark.keys(), "both tools see every frame"
    differ = {n: (ours[n], spark[n]) for n in ours if ours[n] != spark[n]}
    assert not differ, (f"{len(differ)} frames classified differently (dissect, analyze), "
                        f"first: {dict(list(differ.items())[:5])}")


def test_the_corpus_is_there_and_has_um_found_only_by_content() -> None:
    """The comparison means something: with the ranges moved away every UDP protocol of the
    corpus is found by content alone, and there are frames that are not UM."""
    assert len(CAPTURES) >= 6
    ports, content = OPTION_SETS["ranges moved away"]
    verdicts = {v for path in CAPTURES for v in
                dissect_verdicts(path, ports, content).values()}
    assert {("lbtrm", "content"), ("lbtru", "content"), ("lbmr", "content"),
            ("lbttcp", "port"), None} <= verdicts
