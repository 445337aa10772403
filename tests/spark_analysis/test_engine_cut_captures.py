"""The engine on pieces of the corpus captures: a capture cut anywhere (a prefix, a suffix, a
random subset of its frames) is what a real one often is (rotated files, a capture started
late, a lossy tap), and leaves ACKs without their registration, RXREQs without their data,
sessions without their start.  Every piece is decoded and analysed in-process; no step may
fail, and the results from the inputs' strings dictionary-encoded (as the engine reads them)
must equal the results from the same inputs plain (a null looked up through a missing
registration once broke the ACK pairing on encoded columns, on 25 of 133 such pieces, while
every whole corpus capture passed)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from spark_analysis import decode
from spark_analysis.columnar import DecodeOptions
from spark_analysis.engine.inputs import load
from spark_analysis.engine.run import OUTPUTS, analyze
from tests.spark_analysis.engine_oracle import plain_inputs
from wire.pcap import PcapWriter, read_capture
from wire.tshark import PortMap

CORPUS = Path(__file__).resolve().parents[2] / "captures" / "corpus"
STORE_PORT = 14567


def _pieces(name: str, seed: int) -> list[tuple[str, list[int]]]:
    """Which frames (by index) each piece of the capture keeps."""
    n = sum(1 for _ in read_capture(CORPUS / name))
    rng = random.Random(seed)
    pieces = [("prefix", list(range(rng.randrange(1, n)))),
              ("suffix", list(range(rng.randrange(n), n)))]
    for share in (0.1, 0.5, 0.9):
        pieces.append((f"subset{share}", [i for i in range(n) if rng.random() < share]))
    return pieces


@pytest.mark.parametrize("name", ["restarts.pcap", "real-traits.pcap", "qc3.pcap",
                                  "lossy-lbtrm.pcap"])
def test_cut_captures_analyse_alike_encoded_and_plain(tmp_path: Path, name: str) -> None:
    records = list(read_capture(CORPUS / name))
    for piece, keep in _pieces(name, seed=sum(map(ord, name))):
        path = tmp_path / f"{piece}.pcap"
        with PcapWriter(path, linktype=records[0].linktype) as writer:
            for i in keep:
                writer.write(records[i].ts, records[i].data)
        out = tmp_path / f"{piece}-decoded"
        decode.decode_to_parquet(None, [str(path)], str(out),
                                 DecodeOptions(PortMap(store_ports=[STORE_PORT])),
                                 overwrite=True)
        inputs = load(str(out), [str(path)], per_file=False)
        plain = plain_inputs(inputs)
        ours, theirs = analyze(inputs), analyze(plain)
        assert list(ours) == list(OUTPUTS), piece
        for output in OUTPUTS:
            assert ours[output].equals(theirs[output]), (piece, len(keep), output)
