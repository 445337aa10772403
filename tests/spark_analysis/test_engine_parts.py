"""A capture analysed in parts (:func:`spark_analysis.engine.run.analyze_in_parts`, the
parts from :mod:`spark_analysis.engine.owners`) gives exactly what it gives analysed whole.

Every corpus capture with more than one source host, and pieces cut out of them (ACKs
without their registration, NAKs without their data), is analysed whole and in two, three
and one part per host; all 17 results must be equal, row for row.  Each of these broken
routing rules fails :func:`test_parts_give_the_whole_results` (checked by hand, one at a
time): a NAK counted to its sender's part (``BY_DESTINATION["packets"]`` all false), an
RXREQ to the receiver's (``"rxreqs"`` all false), a topic message to its destination's, a
consumption ACK to its store's (:func:`~spark_analysis.engine.acks.ack_hosts` returning the
destination), the flight-size bins cut per part (``bounds`` ignored), and the shared
anomalies found again in every part (``shared=True`` in the parts).
"""

from __future__ import annotations

import functools
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from spark_analysis import decode
from spark_analysis.columnar import DecodeOptions
from spark_analysis.engine import owners
from spark_analysis.engine.inputs import AckBuckets, PartSpills, load, load_tables, scan_packets
from spark_analysis.engine.options import BYTES_PER_FRAME, MEMORY_SHARE, AnalysisOptions
from spark_analysis.engine.run import OUTPUTS, analyze, plain_values
from spark_analysis.engine.spill import Spill
from spark_analysis.engine_job import analyze_capture_in_parts, frames_that_fit, plan
from wire.pcap import PcapWriter, read_capture
from wire.tshark import PortMap

CORPUS = Path(__file__).resolve().parents[2] / "captures" / "corpus"
STORE_PORT = 14567
CAPTURES = ["restarts.pcap", "real-traits.pcap", "qc3.pcap", "lossy-lbtrm.pcap",
            "planted.pcap", "basic.pcap"]


def _decoded(path: Path, out: Path) -> Path:
    decode.decode_to_parquet(None, [str(path)], str(out),
                             DecodeOptions(PortMap(store_ports=[STORE_PORT])), overwrite=True)
    return out


def _subset(path: Path, out: Path, share: float, seed: int) -> Path:
    """About ``share`` of the frames of ``path``, picked at random."""
    records = list(read_capture(path))
    rng = random.Random(seed)
    with PcapWriter(out, linktype=records[0].linktype) as writer:
        for record in records:
            if rng.random() < share:
                writer.write(record.ts, record.data)
    return out


def _assert_parts_alike(path: Path, decoded: Path) -> int:
    """Whole against two, three and one part per host; returns the hosts."""
    files = [str(path)]
    whole = analyze(load(str(decoded), files, per_file=False))
    counts = owners.host_counts(load_tables(str(decoded), files, per_file=False)["packets"],
                                "packets")
    for asked in (2, 3, len(counts)):
        parts = owners.plan_parts(counts, asked)
        assert len(parts) == min(asked, len(counts))
        got = analyze_capture_in_parts(str(decoded), files, False, "all", parts,
                                       AnalysisOptions(), None, None)
        assert list(got) == list(OUTPUTS)
        for name in OUTPUTS:
            assert got[name].schema == whole[name].schema, (asked, name)
            assert got[name].equals(whole[name]), (asked, name)
    return len(counts)


@pytest.mark.parametrize("name", CAPTURES)
def test_parts_give_the_whole_results(tmp_path: Path, name: str) -> None:
    path = CORPUS / name
    hosts = _assert_parts_alike(path, _decoded(path, tmp_path / "decoded"))
    assert hosts > 2   # else the parts would test nothing


@pytest.mark.parametrize("name", ["restarts.pcap", "real-traits.pcap", "lossy-lbtrm.pcap"])
def test_parts_of_a_cut_capture_give_the_whole_results(tmp_path: Path, name: str) -> None:
    piece = _subset(CORPUS / name, tmp_path / "piece.pcap", 0.5, seed=sum(map(ord, name)))
    _assert_parts_alike(piece, _decoded(piece, tmp_path / "decoded"))


def test_every_row_is_in_exactly_one_part(tmp_path: Path) -> None:
    path = CORPUS / "real-traits.pcap"
    decoded = _decoded(path, tmp_path / "decoded")
    files = [str(path)]
    whole = load_tables(str(decoded), files, per_file=False)
    parts = owners.plan_parts(owners.host_counts(whole["packets"], "packets"), 99)
    spills = [Spill(tmp_path / f"part-{i}") for i in range(len(parts))]
    buckets = AckBuckets(Spill(tmp_path / "acks"), 3)
    shared = load_tables(str(decoded), files, per_file=False,
                         parts=PartSpills(functools.partial(owners.split, parts), spills,
                                          buckets))
    rows: Counter[str] = Counter()
    for spill in spills:
        for name in ("packets", "messages"):
            table = spill.read(name)
            assert table.num_rows < whole[name].num_rows
            assert table.schema == spills[0].read(name).schema
            rows[name] += table.num_rows
        assert spill.read("packets").num_rows
    assert rows == {name: whole[name].num_rows for name in ("packets", "messages")}
    # the shared tables whole, the parts' own without rows
    for name in ("registrations", "advertisements", "rxreqs", "flagged"):
        assert shared[name].equals(whole[name]), name
    for name in ("packets", "messages"):
        assert shared[name].num_rows == 0
    # every ACK in exactly one bucket, with its header, and none held in the shared tables
    assert "acks" not in shared
    got = [bucket for bucket in buckets]
    assert len(got) == 3 and all(bucket.num_rows for bucket in got)
    keys = [("pos", "ascending"), ("msg_index", "ascending")]
    in_buckets = plain_values(pa.concat_tables(got, promote_options="permissive"))
    assert (in_buckets.sort_by(keys).to_pylist()
            == plain_values(whole["acks"]).sort_by(keys).to_pylist())


def test_plan_reads_the_hosts_of_the_stored_packets(tmp_path: Path) -> None:
    path = CORPUS / "restarts.pcap"
    decoded = _decoded(path, tmp_path / "decoded")
    files = [str(path)]
    frames = sum(b.num_rows for b in scan_packets(str(decoded), files, False, ["src_ip"]))
    assert plan(str(decoded), files, False, "all", 0) == [owners.WHOLE]
    assert plan(str(decoded), files, False, "all", frames) == [owners.WHOLE]
    assert len(plan(str(decoded), files, False, "all", -(-frames // 3))) == 3


def _packets(rows: list[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(rows, schema=pa.schema([
        ("protocol", pa.string()), ("packet_type", pa.string()), ("src_ip", pa.string()),
        ("dst_ip", pa.string())]))


def test_a_packet_belongs_to_its_transport_session_source() -> None:
    table = _packets([
        {"protocol": "lbtrm", "packet_type": "data", "src_ip": "S", "dst_ip": "G"},
        {"protocol": "lbtrm", "packet_type": "nak", "src_ip": "R", "dst_ip": "S"},
        {"protocol": "lbtru", "packet_type": "ncf", "src_ip": "S", "dst_ip": "R"},
        {"protocol": "lbtru", "packet_type": "ack", "src_ip": "R", "dst_ip": "S"},
        {"protocol": "lbtrm", "packet_type": None, "src_ip": "R", "dst_ip": "S"},
        {"protocol": "lbttcp", "packet_type": None, "src_ip": "S", "dst_ip": "R"},
        {"protocol": "lbmr", "packet_type": "tir", "src_ip": "S", "dst_ip": "G"},
    ])
    assert owners.hosts_of(table, "packets").to_pylist() == ["S"] * 7
    assert owners.host_counts(table, "packets") == {"S": 7}


@given(st.dictionaries(st.one_of(st.none(), st.sampled_from("ABCDEFGHIJ")),
                       st.integers(0, 1000), max_size=11),
       st.integers(1, 12))
def test_a_plan_puts_each_host_in_one_part(counts: dict[str | None, int], asked: int) -> None:
    parts = owners.plan_parts(counts, asked)
    named = [h for h in counts if h is not None]
    assert len(parts) == max(1, min(asked, len(named)))
    assert parts[0].rest and not any(p.rest for p in parts[1:])
    hosts = pa.array([*named, None, "unseen"], pa.string())
    owned = np.stack([p.owns(hosts) for p in parts])
    assert (owned.sum(axis=0) == 1).all()     # each host, a null and an unseen one: one part
    assert owned[0, -2] and owned[0, -1]      # no host and an unseen one: the rest
    # greedy by falling count: no part is above the average by more than its largest host
    loads = [sum(counts[h] for h, mine in zip(named, owned[i, :len(named)], strict=True)
                 if mine) + (counts.get(None, 0) if i == 0 else 0)
             for i in range(len(parts))]
    if named:
        biggest = max(counts[h] for h in named)
        assert max(loads) <= sum(loads) / len(parts) + biggest + counts.get(None, 0)


def test_frames_that_fit_follow_the_memory_available() -> None:
    assert frames_that_fit(0) == 1_000_000   # never below a million
    assert frames_that_fit(9 * 10**9) == int(9 * 10**9 * MEMORY_SHARE / BYTES_PER_FRAME)
    assert frames_that_fit() >= 1_000_000      # this machine's
    # the corpus captures are analysed whole here
    path = CORPUS / "restarts.pcap"
    assert count_frames(path) < frames_that_fit()


def count_frames(path: Path) -> int:
    return sum(1 for _ in read_capture(path))


def test_ump_analyze_in_parts_writes_what_it_writes_whole(tmp_path: Path) -> None:
    """The whole command, Spark and all, on two captures analysed each on its own
    (``--per-file``): ``--frames-per-part`` small enough for one part per host writes the
    same Parquet results as ``--frames-per-part 0`` (whole)."""
    import pyarrow.dataset as ds

    paths = [str(CORPUS / "real-traits.pcap"), str(CORPUS / "lossy-lbtrm.pcap")]
    runs = {}
    for label, frames in (("whole", "0"), ("parts", "500")):
        out = tmp_path / label
        done = subprocess.run([sys.executable, "-m", "ump", "analyze", *paths, "--per-file",
                               "--out", str(out), "--store-port", str(STORE_PORT),
                               "--frames-per-part", frames],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        runs[label] = (out, done.stderr)
    assert "part 1 of" not in runs["whole"][1]
    for path in paths:   # a line per capture: its parts are counted once
        line = next(x for x in runs["parts"][1].splitlines() if f"  {path}: " in x)
        # planning, reading, five parts, flight size, sorting, writing
        assert " 10 steps in " in line and "(all parts)" not in line, line
    for name in OUTPUTS:
        whole, parts = (ds.dataset(runs[label][0] / "parquet" / name).to_table()
                        for label in ("whole", "parts"))
        assert parts.equals(whole), name


@pytest.mark.parametrize("compressed", [False, True])
def test_a_spill_gives_back_its_batches(tmp_path: Path, compressed: bool) -> None:
    """Batches whose dictionaries differ (each Parquet page has its own), one plain: read
    back as written, in order, with the first batch's schema."""
    import pyarrow.compute as pc

    spill = Spill(tmp_path / "spill", compressed)
    first = pa.table({"ip": pc.dictionary_encode(pa.array(["a", "b", None])), "n": [1, 2, 3]})
    spill.add("t", first)
    spill.add("t", pa.table({"ip": pc.dictionary_encode(pa.array(["c", "a"])), "n": [4, 5]}))
    spill.add("t", pa.table({"ip": pa.array(["d"]), "n": [6]}))
    spill.add("empty", first.slice(0, 0))
    spill.close()
    back = spill.read("t")
    assert back.schema == first.schema
    assert back.column("ip").to_pylist() == ["a", "b", None, "c", "a", "d"]
    assert back.column("n").to_pylist() == [1, 2, 3, 4, 5, 6]
    assert spill.read("empty").num_rows == 0 and spill.read("empty").schema == first.schema
    with pytest.raises(KeyError):
        spill.read("never")
