"""The engine's input tables (:mod:`spark_analysis.engine.inputs`) against the rows the Spark
SQL twin prepares from the same decoded corpus: the messages with a sequence number without
their header columns, each analysis's control messages with theirs, ``file``
dictionary-encoded while analysed and plain in every result."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from spark_analysis.engine.common import plain_table
from spark_analysis.engine.inputs import (
    CONTROL_TABLES,
    DICTIONARY,
    HEADER_COLUMNS,
    MESSAGE_COLUMNS,
    Inputs,
    load,
)
from spark_analysis.engine.run import analyze
from tests.spark_analysis.engine_oracle import assert_same, plain_inputs


@pytest.fixture(scope="module")
def loaded(request: Any, tmp_path_factory: Any) -> Any:
    """A fresh :func:`load` of the decoded corpus per call (as ``ump analyze --per-file``)."""
    from tests.spark_analysis.analysis_corpus import shared_corpus_run

    out = shared_corpus_run(request, tmp_path_factory).out
    files = json.loads((out / "summary.json").read_text())["files"]
    return lambda: load(str(out / "decoded"), files, per_file=True)


def _plain(df: pd.DataFrame, columns: list[str]) -> pa.Table:
    return plain_table(pa.Table.from_pandas(df[columns], preserve_index=False)
                       ).replace_schema_metadata(None)


def test_messages_are_the_twins_rows_with_a_sequence_number(
        steps: dict[str, pa.Table], loaded: Any) -> None:
    inputs: Inputs = loaded()
    assert list(inputs.messages.columns) == MESSAGE_COLUMNS
    assert not set(HEADER_COLUMNS) & set(inputs.messages.columns)
    theirs = steps["messages"]
    expected = theirs.filter(pc.is_valid(theirs["sqn"])).select(MESSAGE_COLUMNS)
    assert 0 < expected.num_rows < theirs.num_rows   # the corpus has control messages
    assert_same(_plain(inputs.messages, MESSAGE_COLUMNS), expected,
                ["capture", "pos", "msg_index"])


@pytest.mark.parametrize("name", list(CONTROL_TABLES))
def test_control_tables_are_the_twins_rows_that_carry_their_headers(
        steps: dict[str, pa.Table], loaded: Any, name: str) -> None:
    spec = CONTROL_TABLES[name]
    ours = getattr(loaded(), name)
    theirs = steps["messages"]
    marked = pc.is_valid(theirs["malformed_reason"]) if spec.malformed else pa.array(
        [False] * theirs.num_rows)
    for header in spec.marked_by:
        marked = pc.or_(marked, pc.is_valid(theirs[header]))
    columns = [*spec.columns, *spec.headers]
    expected = theirs.filter(marked).select(columns)
    # the corpus has registrations, ACKs and RXREQs (no malformed message:
    # test_malformed_messages_are_control_messages)
    assert expected.num_rows > 0
    assert list(ours.columns) == columns
    assert_same(_plain(ours, columns), expected, ["capture", "pos", "msg_index"])


def test_strings_are_encoded_while_analysed_and_plain_in_the_results(loaded: Any) -> None:
    inputs: Inputs = loaded()
    for df in (inputs.packets, inputs.messages, inputs.acks, inputs.registrations):
        assert pa.types.is_dictionary(df["file"].dtype.pyarrow_dtype)
        for name in DICTIONARY & set(df.columns):
            assert pa.types.is_dictionary(df[name].dtype.pyarrow_dtype), name
    # the topic analyses join the advertisements' strings: plain
    assert not any(pa.types.is_dictionary(t.pyarrow_dtype)
                   for t in inputs.advertisements.dtypes)
    results = analyze(inputs)
    with_file = [name for name, table in results.items() if "file" in table.schema.names]
    assert {"anomalies", "registrations", "stability_acks", "sequence_events",
            "retransmission_requests"} <= set(with_file)
    for name in with_file:
        assert results[name].schema.field("file").type == pa.string(), name
    # no result column is left encoded (sessions, topics and levels are encoded on the way)
    for name, table in results.items():
        for field in table.schema:
            assert not pa.types.is_dictionary(field.type), (name, field.name)
    assert results["transport_sessions"].schema.field("session").type == pa.string()
    assert results["stability_acks"].num_rows > 0
    assert all(pc.ends_with(results["stability_acks"]["file"], ".pcap").to_pylist())


def test_malformed_messages_are_control_messages(spark: Any, tmp_path: Path) -> None:
    """A malformed message carries no header the analyses read, but it is an anomaly: it is a
    control message, so the anomalies (which read the control messages) still report it."""
    from spark_analysis import decode
    from spark_analysis.columnar import DecodeOptions
    from tests.spark_analysis.test_columnar import (
        RCV,
        SRC,
        STORE_PORTS,
        data_message,
    )
    from wire import lbtru
    from wire.pcap import PcapWriter, udp_frame

    good = data_message(1).build()
    bad = bytearray(data_message(2).build())
    bad[1] = 0x03   # an unknown header code
    capture = tmp_path / "bad.pcap"
    with PcapWriter(capture) as writer:
        for i, payload in enumerate([good, good + bytes(bad)]):
            writer.write(1.0 + i / 1000, udp_frame(SRC, 14380, RCV, 14360, lbtru.LbtruData(
                sqn=i + 1, payload=payload).build()))
    out = tmp_path / "decoded"
    decode.decode_to_parquet(spark, str(capture), str(out), DecodeOptions(STORE_PORTS))
    inputs = load(str(out), [str(capture)], per_file=False)
    assert inputs.flagged["malformed_reason"].notna().sum() == 1
    assert "unknown header code" in inputs.flagged["malformed_reason"].dropna().iloc[0]
    found = analyze(inputs)["anomalies"].to_pylist()
    bad_messages = [r for r in found if r["kind"] == "malformed"
                    and r["subject"].endswith(f"message from {SRC}")]
    assert [(r["file"], r["detail"]) for r in bad_messages] == [
        (str(capture), "lbmc at offset 12: unknown header code 0x03")], found


def test_analyze_lets_the_input_tables_go(loaded: Any) -> None:
    """Given without a reference kept (as ``ump analyze``'s task does), no input table
    outlives the analyses that read it: by the time the results are sorted, every step is
    done and the inputs are gone (their memory is free for the sorted copies)."""
    import gc
    import weakref

    alive: dict[str, list[str]] = {}

    def inputs() -> Inputs:
        made = loaded()
        refs.update({name: weakref.ref(getattr(made, name)) for name in
                     ("packets", "messages", "acks", "registrations", "rxreqs", "flagged")})
        return made

    def progress(step: str, seconds: float) -> None:
        gc.collect()
        alive[step] = [name for name, ref in refs.items() if ref() is not None]

    refs: dict[str, weakref.ref[pd.DataFrame]] = {}
    results = analyze(inputs(), progress=progress)
    assert alive["sorting the results"] == [], alive
    # while the first steps run, the tables are there (the check can see them alive)
    assert "packets" in alive["data messages"], alive
    assert results["stability_acks"].num_rows > 0


@pytest.mark.parametrize("capture", ["restarts.pcap", "qc3.pcap"])
def test_a_rotated_capture_is_one_capture(tmp_path: Path, capture: str) -> None:
    """A capture cut into files (``tcpdump -C``, named so that plain name order is wrong:
    ``cap9``, ``cap10``, ``cap11``) and analysed as one gives what the whole file gives, but
    for the file and position columns: the files' dictionaries of ``file`` are unified, and
    capture order is natural name order (TCP streams and sequences cross the cuts)."""
    from spark_analysis import decode
    from spark_analysis.columnar import DecodeOptions
    from tests.spark_analysis.analysis_corpus import CAPTURES, STORE_PORT
    from wire.pcap import PcapWriter, read_capture
    from wire.tshark import PortMap

    source = next(c for c in CAPTURES if c.name == capture)
    records = list(read_capture(source))
    cuts = [0, len(records) // 3, 2 * len(records) // 3, len(records)]
    parts = [tmp_path / f"cap{n}.pcap" for n in (9, 10, 11)]
    for path, start, end in zip(parts, cuts, cuts[1:], strict=False):
        with PcapWriter(path, linktype=records[0].linktype) as writer:
            for record in records[start:end]:
                writer.write(record.ts, record.data)
    options = DecodeOptions(PortMap(store_ports=[STORE_PORT]))
    names = [str(p) for p in parts]
    decode.decode_to_parquet(None, names, str(tmp_path / "cut"), options)
    decode.decode_to_parquet(None, [str(source)], str(tmp_path / "whole"), options)
    cut = analyze(load(str(tmp_path / "cut"), names, per_file=False))
    whole = analyze(load(str(tmp_path / "whole"), [str(source)], per_file=False))
    placed = {"file", "file_offset", "pos", "response_pos", "example_file", "example_file_offset"}
    for name, table in whole.items():
        columns = [c for c in table.schema.names if c not in placed]
        assert cut[name].select(columns).equals(table.select(columns)), name
    acks = cut["stability_acks"]
    assert acks.num_rows > 0
    assert set(acks["file"].to_pylist()) == set(names)
    # capture order is cap9, cap10, cap11: the ACKs' positions follow the files in that order
    order = [names.index(f) for f in acks.sort_by("pos")["file"].to_pylist()]
    assert order == sorted(order)


@pytest.mark.parametrize("kept", [0.0, 0.5])
def test_encoded_and_plain_inputs_give_the_same_results(loaded: Any, kept: float) -> None:
    """The engine reads the inputs' strings encoded; every result equals the result from the
    same inputs plain.  With registrations missing (none, or every other one) the keys looked
    up through them are null on encoded columns (consumption ACKs without a source, ACKs of
    unknown topics): a null among dictionary entries is where encoded columns went wrong
    (a cut capture's consumption ACKs once failed the ACK pairing)."""
    encoded = loaded()
    regs = encoded.registrations
    encoded.registrations = regs.iloc[::2] if kept else regs.iloc[0:0]
    plain = plain_inputs(encoded)
    assert not any(pa.types.is_dictionary(t.pyarrow_dtype) for t in plain.acks.dtypes)
    ours, theirs = analyze(encoded), analyze(plain)
    # registrations were missing: some consumption ACKs have no source
    assert ours["consumption_acks"]["source_ip"].null_count > 0
    for name, table in theirs.items():
        assert ours[name].equals(table), name
