"""``ump analyze``: options, one-line errors before Spark starts, and what a run leaves behind."""

from __future__ import annotations

import argparse
import gzip
import html
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from spark_analysis import cli, job, session
from wire import pcap
from wire.fastpath import derive

from .analysis_corpus import CAPTURES, PLANTED, STORE_PORT, CorpusRun, shared_corpus_run

OUTPUTS = ("anomaly_summary", "anomalies", "topic_advertisements", "topic_queries",
           "transport_sessions", "sequence_summary", "sequence_events", "registrations",
           "registration_summary", "latency_summary", "latency_histogram", "stability_acks",
           "consumption_acks", "flight_size_summary", "flight_size", "retransmission_summary",
           "retransmission_requests")


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="ump")
    cli.register(parser.add_subparsers())
    return parser.parse_args(["analyze", *argv])


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    args = _parse(*argv)
    code = args.handler(args)
    return code, capsys.readouterr().err


def test_options() -> None:
    args = _parse("a.pcap", "b*.pcap", "--out", "res", "--store-port", "14567",
                  "--store-port", "14568-14569", "--lbtrm-port", "15000", "--per-file",
                  "--stability", "all", "--master", "local[2]", "--flight-bins", "50")
    assert args.captures == ["a.pcap", "b*.pcap"]
    assert args.store_port == [14567, 14568, 14569] and args.lbtrm_port == [15000]
    assert (args.per_file, args.stability, args.master, args.flight_bins) == (
        True, "all", "local[2]", 50)
    assert job.port_map(args).store_ports == [14567, 14568, 14569]


@pytest.mark.parametrize("argv", [
    ("a.pcap",),  # --out is required
    ("--out", "x"),  # a capture is required
    ("a.pcap", "--out", "x", "--flight-bins", "0"),
    ("a.pcap", "--out", "x", "--stability", "most"),
    ("a.pcap", "--out", "x", "--store-port", "70000"),
])
def test_bad_options_are_usage_errors(argv: tuple[str, ...],
                                      capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parse(*argv)
    assert exc.value.code == 2
    assert "usage:" in capsys.readouterr().err


def _one_line_error(code: int, err: str, *fragments: str) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ump analyze: ")
    assert "Traceback" not in err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, str(tmp_path / "nope.pcap"), "--out", str(tmp_path / "o"))
    _one_line_error(code, err, "nope.pcap", "no such file")
    assert not (tmp_path / "o").exists()  # nothing is created before the inputs are good


def test_glob_matching_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, str(tmp_path / "*.pcap"), "--out", str(tmp_path / "o"))
    _one_line_error(code, err, "no file matches")


def test_not_a_capture(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    text = tmp_path / "notes.pcap"
    text.write_text("these are notes, not packets\n" * 10)
    code, err = _run(capsys, str(PLANTED), str(text), "--out", str(tmp_path / "o"))
    _one_line_error(code, err, "notes.pcap")


def test_a_gzip_compressed_capture_is_one_line_saying_to_decompress_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    packed = tmp_path / "planted.pcap.gz"
    packed.write_bytes(gzip.compress(PLANTED.read_bytes()))
    folder = tmp_path / "caps"   # in a directory too: taken, so that the line says it
    folder.mkdir()
    (folder / packed.name).write_bytes(packed.read_bytes())
    for given in (packed, folder):
        code, err = _run(capsys, str(given), "--out", str(tmp_path / "o"))
        _one_line_error(code, err, "planted.pcap.gz", "gzip-compressed", "gunzip")
    assert not (tmp_path / "o").exists()


def test_empty_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.pcap"
    empty.write_bytes(b"")
    code, err = _run(capsys, str(empty), "--out", str(tmp_path / "o"))
    _one_line_error(code, err, "empty.pcap", "too short")


def test_same_file_twice(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, str(PLANTED), str(PLANTED), "--out", str(tmp_path / "o"))
    _one_line_error(code, err, "planted.pcap", "more than once")


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])   # nothing listens there once closed


@pytest.mark.parametrize("master, fragments", [
    ("bogus://x", ("'bogus://x' is not a Spark master URL",)),
    ("local[0]", ("'local[0]' is not a Spark master URL",)),
    ("spark://head", ("must be HOST:PORT", "'head'")),
    ("spark://127.0.0.1:{closed}", ("cannot reach the Spark master spark://127.0.0.1:",
                                    "refused")),
])
def test_a_bad_or_unreachable_master_is_one_line_before_spark_starts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], master: str,
        fragments: tuple[str, ...]) -> None:
    # Spark itself retries an unreachable master for a minute, prints Java stack traces and
    # fails with a message that does not name the master
    master = master.format(closed=_closed_port())
    started = time.monotonic()
    code, err = _run(capsys, str(PLANTED), "--out", str(tmp_path / "o"), "--master", master)
    _one_line_error(code, err, *fragments)
    assert time.monotonic() - started < 10
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("master", ["local", "local[*]", "local[2]", "local[2,3]",
                                    "local-cluster[2,1,1024]", "yarn", "k8s://https://k:6443"])
def test_every_form_of_master_spark_takes_is_taken(master: str) -> None:
    assert session.master_problem(master) is None


def test_a_damaged_or_cut_capture_is_said_and_a_damaged_one_is_not_a_success(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blob = bytearray(PLANTED.read_bytes())
    third = _record_offsets(blob)[2]
    damaged = bytearray(blob)
    record = derive(pcap.PcapRecordLE)
    head = record.decode(bytes(blob), third)
    damaged[third:third + record.size] = record.pack({**head, "incl_len": 0x7FFFFFFF,
                                                      "orig_len": 0x7FFFFFFF})
    (tmp_path / "damaged.pcap").write_bytes(bytes(damaged))
    (tmp_path / "cut.pcap").write_bytes(bytes(blob[:-5]))
    for name, status in (("damaged.pcap", 1), ("cut.pcap", 0)):
        out = tmp_path / name.replace(".pcap", "")
        code, err = _run(capsys, str(tmp_path / name), "--out", str(out), "--store-port",
                         str(STORE_PORT), "--quiet")
        assert code == status, err
        assert "Traceback" not in err
        warnings = [line for line in err.splitlines() if line.startswith("ump analyze: warning:")]
        problems = json.loads((out / "summary.json").read_text())["capture_problems"]
        # the results of what was read, the problem first in the report
        assert html.escape(warnings[0].split("warning: ", 1)[1]) in (
            out / "report.html").read_text()
        if status:
            assert len(warnings) == 1 and f"damaged at offset {third}" in warnings[0]
            assert "results cover the rest" in err.splitlines()[-1]
            assert problems["damaged"] and not problems["cut_short"]
        else:
            assert len(warnings) == 1 and "cut short" in warnings[0]
            assert problems["cut_short"] and not problems["damaged"]


def test_a_capture_without_um_says_so_on_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, str(PLANTED.parent / "not-um.pcap"), "--out", str(tmp_path / "o"),
                     "--quiet")
    assert code == 0, err
    (line,) = err.strip().splitlines()
    assert line.startswith("ump analyze: warning: no frame of 7 decodes as UM")
    assert "--store-port" in line


def test_a_directory_of_captures_and_their_sidecars_is_its_captures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "caps"
    folder.mkdir()
    (folder / "planted.pcap").write_bytes(PLANTED.read_bytes())
    (folder / "planted.pcap.meta.json").write_text("{}")
    (folder / "README.md").write_text("# what these are\n")
    code, err = _run(capsys, str(folder), "--out", str(tmp_path / "o"), "--quiet",
                     "--store-port", str(STORE_PORT))
    assert code == 0, err
    assert err.strip().splitlines() == [
        "ump analyze: passing over 2 file(s) in the directories given that are not captures: "
        "README.md, planted.pcap.meta.json"]
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert summary["files"] == [str(folder / "planted.pcap")]


def test_a_small_capture_is_analysed_without_spark_as_spark_analyses_it(
        tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    assert PLANTED.stat().st_size <= job.IN_PROCESS_BYTES
    runs = {}
    for how, extra in (("in-process", ()), ("spark", ("--spark",))):
        out = tmp_path / how
        # a process of its own: in this one a test may have left a Spark session running,
        # which ump analyze then uses
        done = subprocess.run([sys.executable, "-m", "ump", "analyze", str(PLANTED), "--out",
                               str(out), "--store-port", str(STORE_PORT), *extra],
                              capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        runs[how] = (out, done.stderr)
    assert "without Spark" in runs["in-process"][1] and "starting Spark" not in runs[
        "in-process"][1]
    assert "starting Spark" in runs["spark"][1] and "without Spark" not in runs["spark"][1]
    (alone, _), (spark, _) = runs["in-process"], runs["spark"]
    names = sorted(p.name for p in (spark / "parquet").iterdir())
    assert names == sorted(p.name for p in (alone / "parquet").iterdir()) and len(names) == 17
    for name in names:
        assert pq.read_table(alone / "parquet" / name).equals(
            pq.read_table(spark / "parquet" / name)), name
    assert json.loads((alone / "summary.json").read_text()) == json.loads(
        (spark / "summary.json").read_text())


def _record_offsets(blob: bytes | bytearray) -> list[int]:
    """Where each record of a little-endian classic pcap starts."""
    header, record = derive(pcap.PcapHeaderLE), derive(pcap.PcapRecordLE)
    at, found = header.size, []
    while at + record.size <= len(blob):
        found.append(at)
        at += record.size + record.decode(bytes(blob), at)["incl_len"]
    return found


def test_output_is_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "report"
    out.write_text("not a directory")
    code, err = _run(capsys, str(PLANTED), "--out", str(out))
    _one_line_error(code, err, "exists and is not a directory")


def test_output_not_writable(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _run(capsys, str(PLANTED), "--out", "/proc/ump-analyze-test/out")
    _one_line_error(code, err, "/proc/ump-analyze-test/out", "cannot write there")


def test_job_entry_point_has_the_spark_submit_command() -> None:
    """``spark-submit spark_analysis/job.py`` runs the module as a script: its help works
    without Spark starting, and the documented command names the script."""
    done = subprocess.run([sys.executable, "-m", "spark_analysis.job", "--help"],
                          capture_output=True, text=True, check=True, timeout=60)
    assert "spark-submit --master" in done.stdout and "--store-port" in done.stdout
    assert "spark_analysis/job.py" in (job.__doc__ or "")
    script = subprocess.run([sys.executable, job.__file__, "--help"], capture_output=True,
                            text=True, timeout=60)
    assert script.returncode == 0, script.stderr


def test_progress_can_be_silenced(capsys: pytest.CaptureFixture[str]) -> None:
    job.Progress(quiet=True)("hidden")
    job.Progress()("shown")
    err = capsys.readouterr().err
    assert "hidden" not in err and "ump analyze: [" in err and "shown" in err


# =============================================================================================
# A real run (the corpus, shared with the other analysis tests)
# =============================================================================================


@pytest.fixture(scope="module")
def corpus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CorpusRun:
    return shared_corpus_run(request, tmp_path_factory)


def test_run_succeeds_with_progress(corpus: CorpusRun) -> None:
    assert corpus.exit_code == 0, corpus.stderr
    lines = corpus.stderr.splitlines()
    progress = [line for line in lines if line.startswith("ump analyze: [")]
    assert progress[0].endswith(f"{len(CAPTURES)} capture file(s); results in {corpus.out}")
    # a line per capture with what its analyses took
    assert sum(" steps in " in line for line in progress) == len(CAPTURES)
    assert progress[-1].split("] ", 1)[1].startswith("done in")


def test_run_writes_every_output(corpus: CorpusRun) -> None:
    for name in OUTPUTS:
        files = list((corpus.out / "parquet" / name).glob("*.parquet"))
        assert files, name
    summary = corpus.summary()
    assert summary["files"] == [str(c) for c in CAPTURES]
    assert summary["options"]["store_ports"] == [STORE_PORT]
    assert set(summary["captures"]) == {str(c) for c in CAPTURES}
    for section in summary["captures"].values():
        assert set(OUTPUTS) <= set(section)
        # every corpus capture has frames that are not UM (TCP handshakes at least)
        assert sum(section["not_um_frames"].values()) > 0
    assert (corpus.out / "report.html").stat().st_size > 10_000


def test_summary_row_counts_match_parquet(corpus: CorpusRun) -> None:
    summary = corpus.summary()
    for name in OUTPUTS:
        table = corpus.table(name)
        for capture, section in summary["captures"].items():
            assert section[name]["rows"] == int((table["capture"] == capture).sum()), name
            if "data" in section[name]:
                assert len(section[name]["data"]) == min(section[name]["rows"],
                                                         job.JSON_ROW_LIMIT)


def test_outputs_are_sorted(corpus: CorpusRun) -> None:
    from spark_analysis.engine.run import SORT_KEYS

    for name in ("registrations", "stability_acks", "anomalies", "transport_sessions"):
        table = corpus.table(name)
        keys = [k for k in SORT_KEYS[name] if k in table.columns][:3]
        records = [tuple((v is not None, v) for v in row)
                   for row in table[keys].itertuples(index=False)]
        assert records == sorted(records), name


def test_summary_json_is_plain_json(corpus: CorpusRun) -> None:
    text = (corpus.out / "summary.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    json.loads(text)


def test_run_keeps_the_decoded_tables(corpus: CorpusRun) -> None:
    """``OUT/decoded/`` holds the decode the analyses read: one decode for every file, each
    file's packets under its own name (``--per-file`` decodes with ``separate_files``)."""
    import pyarrow.parquet as pq

    decoded = corpus.out / job.DECODED
    assert (decoded / "_SUCCESS").exists()
    packets = pq.read_table(decoded / "packets", columns=["file"]).column("file").to_pylist()
    assert set(packets) == {str(c) for c in CAPTURES if "not-um" not in c.name}
    skipped = pq.read_table(decoded / "skipped").to_pylist()
    summary = corpus.summary()
    for capture, section in summary["captures"].items():
        assert section["not_um_frames"] == {
            r["reason"]: r["frames"] for r in skipped if r["file"] == capture}


def test_failed_analyses_are_said_in_a_line() -> None:
    """What a failed capture's analyses say: out of memory as such (a Python or an Arrow
    allocation that failed in the task, or the task's process killed), else the exception."""
    import pyarrow as pa

    from spark_analysis.engine_job import MEMORY_HINT, _crash, _reason

    assert _reason(MemoryError()) == f"out of memory ({MEMORY_HINT})"
    assert _reason(pa.ArrowMemoryError("malloc of size 64 failed")).startswith("out of memory")
    assert _reason(KeyError("tidx")) == "KeyError: 'tidx'"
    died = Exception("An error occurred while calling o93.collectAndServe.\n: org.apache.spark."
                     "SparkException: Python worker exited unexpectedly (crashed)\n\tat x")
    assert _crash(died).startswith("the analysing process died, most likely killed for want"
                                   " of memory")
    other = Exception("An error occurred while calling o93.collectAndServe.\n"
                      "pyspark.errors.exceptions.base.PySparkRuntimeError: [X] the reason\n\tat y")
    assert _crash(other) == "pyspark.errors.exceptions.base.PySparkRuntimeError: [X] the reason"


def test_analysis_out_of_memory_leaves_no_results(tmp_path: Path) -> None:
    """A capture whose analyses do not fit the worker's memory (Spark's Python workers held to
    a tenth of what they need, ``spark.executor.pyspark.memory``): one line saying so,
    status 1, no results and no report (not even an earlier run's), the decoded tables kept."""
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "spark-defaults.conf").write_text("spark.executor.pyspark.memory 200m\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.html").write_text("an earlier run's report")
    done = subprocess.run([sys.executable, "-m", "ump", "analyze", str(PLANTED), "--out",
                           str(out), "--store-port", str(STORE_PORT), "--spark"],
                          capture_output=True, text=True, timeout=600,
                          env={**__import__("os").environ, "SPARK_CONF_DIR": str(conf)})
    assert done.returncode == 1, done.stderr
    ours = [line for line in done.stderr.splitlines() if line.startswith("ump analyze: ")]
    failed = [line for line in ours if "failed" in line]
    assert len(failed) == 1, done.stderr
    assert failed[0].startswith("ump analyze: analysing the capture failed: "), failed[0]
    assert "memory" in failed[0], failed[0]
    assert "at org.apache" not in done.stderr   # no Java stack trace
    assert not (out / "report.html").exists() and not (out / "summary.json").exists()
    assert list((out / "parquet").iterdir()) == []
    assert (out / job.DECODED / "_SUCCESS").exists()
