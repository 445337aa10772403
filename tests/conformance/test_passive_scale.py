"""Passive judging at scale: the observation built from the columnar decode (in this process
and in Spark) is the frame-by-frame one, so the verdicts are the same every way
(conformance/passive/tables.py, conformance/passive/spark_tables.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from conformance.passive.cli import choose_decoder
from conformance.passive.judge import judge, passive_cases
from conformance.passive.observe import Observed, observe
from conformance.passive.tables import observe_columnar
from wire.tshark import PortMap

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "captures" / "corpus"
STORE_PORT = PortMap(store_ports=[14567])


def _verdicts(obs: Observed) -> list[tuple[str, str, str, list[int]]]:
    return [(r.spec.id, r.verdict.value, r.message, r.decided_by)
            for r in judge(obs, passive_cases())]


def _differences(a: Observed, b: Observed) -> list[str]:
    """The fields of two observations that differ (not the private indexes)."""
    return [f.name for f in fields(Observed) if not f.name.startswith("_")
            and getattr(a, f.name) != getattr(b, f.name)]


@pytest.mark.parametrize("name", sorted(p.stem for p in CORPUS.glob("*.pcap")))
def test_columnar_observation_is_the_dissected_one(name: str) -> None:
    """Every item of the observation (registrations, data, ACKs, SRIs, transport packets,
    TIRs, keepalives, who heard whom, frame counts) is the same from both decoders, and so
    are the verdicts, on every corpus capture (LBT-TCP, LBT-RU, LBT-RM, restarts, a store
    group, a capture with no UM, one with planted faults)."""
    path = CORPUS / f"{name}.pcap"
    dissected = observe([path], STORE_PORT)
    columnar = observe_columnar([path], STORE_PORT)
    assert _differences(dissected, columnar) == []
    assert _verdicts(dissected) == _verdicts(columnar)


def test_columnar_finds_store_ports_as_the_dissector_does() -> None:
    """Without --store-port both find the store port in the capture's TIRs and SRIs and say
    so."""
    path = CORPUS / "restarts.pcap"
    dissected, columnar = observe([path]), observe_columnar([path])
    assert columnar.store_ports == dissected.store_ports == [14567]
    assert columnar.notes == dissected.notes
    assert columnar.registrations == dissected.registrations


def test_columnar_refuses_what_is_not_a_capture(tmp_path: Path) -> None:
    from wire.errors import WireError

    bogus = tmp_path / "bogus.pcap"
    bogus.write_bytes(b"this is not a capture at all" * 10)
    with pytest.raises(WireError, match="not a readable capture"):
        observe_columnar([bogus])


def test_columnar_notes_a_damaged_end(tmp_path: Path) -> None:
    """A capture cut inside a record is judged up to the damage, and says so (a judge then
    answers unsupported with the reason instead of guessing)."""
    whole = (CORPUS / "basic.pcap").read_bytes()
    cut = tmp_path / "cut.pcap"
    cut.write_bytes(whole[:len(whole) * 2 // 3])
    dissected, columnar = observe([cut], STORE_PORT), observe_columnar([cut], STORE_PORT)
    assert any("damaged" in p for p in columnar.problems)
    assert columnar.frames == dissected.frames
    assert columnar.data == dissected.data and columnar.acks == dissected.acks


def test_auto_decoder_follows_the_capture_size(tmp_path: Path) -> None:
    from spark_analysis.job import DRIVER_DECODE_BYTES, QUICK_TIER_BYTES

    small, big = tmp_path / "small.pcap", tmp_path / "big.pcap"
    small.write_bytes(b"\0" * 100)
    with big.open("wb") as fh:
        fh.truncate(DRIVER_DECODE_BYTES + 1)
    assert choose_decoder([small]) == "frames"
    assert choose_decoder([big]) == "columnar"
    with big.open("r+b") as fh:
        fh.truncate(QUICK_TIER_BYTES + 1)
    assert choose_decoder([big]) == "spark"
    assert choose_decoder([big], "frames") == "frames"


# --- a generated capture: in-process and in Spark ---------------------------------------------


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """40,000 frames of the benchmark's scenario (every transport, three stores, restarts)."""
    from captures.generator import generate
    from captures.scenarios import preset

    path = tmp_path_factory.mktemp("scale") / "big-40000.pcap"
    generate(preset("big"), path, seed=3, packets=40_000, progress=False)
    return path


def test_generated_capture_same_verdicts_in_process_and_in_spark(generated: Path,
                                                                 spark: Any) -> None:
    """The verdicts (as JSON: case, verdict, message, deciding frames) of a generated capture
    are the same judged frame by frame, through the in-process columnar decode and through
    the decode in Spark."""
    from conformance.passive.spark_tables import decode_tables_spark

    ports = PortMap(store_ports=[int(json.loads(Path(f"{generated}.meta.json").read_text())
                                     ["ports"]["store"])])
    in_process = observe_columnar([generated], ports)
    in_spark = observe_columnar([generated], ports, decode=lambda p, m, c: decode_tables_spark(
        p, m, c, spark=spark))
    assert _differences(in_process, in_spark) == []
    judged = json.dumps(_verdicts(in_process))
    assert judged == json.dumps(_verdicts(in_spark))
    assert judged == json.dumps(_verdicts(observe([generated], ports)))
    assert '"pass"' in judged and '"fail"' not in judged  # the generator's traffic conforms


def test_cli_judges_a_capture_with_each_decoder(generated: Path, tmp_path: Path) -> None:
    """``ump conform --capture --decode columnar`` writes the same results.json verdicts as
    ``--decode frames``, and evidence pages for the cited frames."""
    outs = {}
    for decoder in ("frames", "columnar"):
        out = tmp_path / decoder
        done = subprocess.run([sys.executable, "-m", "ump", "conform", "--capture",
                               str(generated), "--store-port", "14567", "--decode", decoder,
                               "--out", str(out)], capture_output=True, text=True, cwd=ROOT,
                              timeout=600)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"read by the {decoder} decode" in done.stderr
        outs[decoder] = json.loads((out / "results.json").read_text())
        pages = list((out / "frames").glob("*.txt"))
        assert pages, "no evidence page written"
    def verdicts(doc: Any) -> list[Any]:
        return [(r["id"], r["verdict"], r["message"]) for r in doc["cases"]]
    assert verdicts(outs["frames"]) == verdicts(outs["columnar"])
