"""The committed capture corpus, analysed once per test session (shared by the analysis tests).

``captures/corpus/`` holds small captures made by the generator (with their sidecars) and, in
``expected/``, the ``summary.json`` section of each as ``ump analyze --per-file`` wrote it when
the corpus was made.  Running the job costs tens of seconds whatever the size (Spark plans and
schedules a few dozen jobs), so every test module that needs results takes them from
:func:`corpus_run`, which runs the job once, in-process, on the session's SparkSession.

Regenerate the expected files after a deliberate change of an analysis::

    python -m tests.spark_analysis.analysis_corpus

(it prints what changed; review that diff like code).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "captures" / "corpus"
EXPECTED = CORPUS / "expected"
CAPTURES = sorted(CORPUS.glob("*.pcap"))
GENERATED = [c for c in CAPTURES if Path(f"{c}.meta.json").exists()]
"""The captures made by the generator (with sidecars)."""
STORE_PORT = 14567


@dataclass
class CorpusRun:
    """One run of the job over the whole corpus (``--per-file``)."""

    out: Path
    exit_code: int
    stderr: str

    def summary(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.out / "summary.json").read_text())
        return data

    def capture(self, name: str) -> dict[str, Any]:
        """The summary section of one corpus capture, paths made relative (as committed)."""
        section: dict[str, Any] = self.summary()["captures"][str(CORPUS / name)]
        return normalize(section)

    def table(self, name: str) -> Any:
        """A result table read back in full (pandas)."""
        return read_table(self.out, name)


def read_table(out: Path, name: str) -> Any:
    """``OUT/parquet/<name>`` as pandas; integer columns with nulls stay exact (objects)."""
    import pyarrow.dataset as ds

    table = ds.dataset(out / "parquet" / name, format="parquet").to_table()
    return table.to_pandas(integer_object_nulls=True)


def normalize(value: Any) -> Any:
    """Corpus paths as bare file names, so results compare across checkouts."""
    if isinstance(value, dict):
        return {normalize(k): normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, str) and value.startswith(str(CORPUS) + "/"):
        return value[len(str(CORPUS)) + 1:]
    return value


def analyze_args(out: Path, *extra: str) -> argparse.Namespace:
    from spark_analysis import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    return parser.parse_args(["analyze", *map(str, CAPTURES), "--per-file", "--out", str(out),
                              "--store-port", str(STORE_PORT), *extra])


# =============================================================================================
# planted.pcap: one of every anomaly, hand-made
# =============================================================================================

PLANTED = CORPUS / "planted.pcap"
PLANTED_START_S = 1000
"""Seconds since the epoch of the planted capture's origin (small: exact in a float)."""
SOURCE, GROUP, STORE, ROGUE, LBMRD = "10.0.1.1", "224.10.10.10", "10.0.3.1", "10.0.4.1", \
    "10.0.0.1"
RCV1, RCV2, RCV3 = "10.0.2.1", "10.0.2.2", "10.0.2.3"
PLANTED_SESSION = 0xABCD
PLANTED_TOPIC = "planted.topic"


def planted_frames() -> list[tuple[int, bytes]]:
    """The planted capture as (microseconds from the origin, frame), built with :mod:`wire`.

    One LBT-RM source (session 0xabcd, topic index 1) sends topic/transport sequence numbers
    0, 1, 2, 5 (a gap of 2), 3 (out of order by 2), 3 again (a duplicate, also out of order),
    RX 4 and 6; a receiver NAKs 4 (served by the RX) and 8 (NCF, shed).  One store: the source
    registers (RegID 1001); a misconfigured source asks for RegID 1001 and is refused (error
    5: a registration error and a RegID reuse); two receivers are both granted RegID 2002 (a
    RegID conflict); a third gets no answer.  The store ACKs sqn 0 after 2 ms, sqn 2 after
    5 ms and sqn 9, which was never sent; receiver 1 consumes sqn 1 after 7.5 ms, asks the
    store to retransmit sqn 1 (served after 300 us) and sqn 2 (never answered).  One TIR, and
    TQRs for the topic and for a topic nobody advertises.
    """
    from wire import lbmr, lbtrm
    from wire.lbmc import (
        AckType,
        LbmcMessage,
        MessageType,
        PregError,
        Topicname,
        UmeAck,
        UmePreg,
        UmePregResp,
        UmeRxreq,
        UmeStoreid,
    )
    from wire.lbtru import NcfReason
    from wire.pcap import TcpConversation, udp_frame

    frames: list[tuple[int, bytes]] = []
    store = (STORE, STORE_PORT)

    def control(*headers: Any) -> bytes:
        return LbmcMessage(type=MessageType.CONTROL, headers=list(headers)).build()

    def preg(source: bool, reg_id: int, src_reg_id: int = 0) -> bytes:
        headers: list[Any] = [UmePreg(s_flag=int(source), marker=1, reg_id=reg_id,
                                      transport_idx=1, topic_idx=1, src_reg_id=src_reg_id,
                                      resp_port=14391, resp_ip="0.0.0.0")]
        if source:
            headers.append(Topicname(topic=PLANTED_TOPIC))
        return control(*headers)

    def granted(source: bool, reg_id: int) -> bytes:
        return control(UmePregResp(reg_id=reg_id, s_flag=int(source), marker=1, transport_idx=1,
                                   topic_idx=1, low_seqnum=0, high_seqnum=0),
                       UmeStoreid(store_id=1))

    def connect(us: int, client: str) -> TcpConversation:
        conv = TcpConversation((client, 40000), store)
        for i, frame in enumerate(conv.handshake()):
            frames.append((us + i, frame))
        return conv

    def rm(us: int, packet: Any, to_group: bool = True, sender: tuple[str, int] = (SOURCE, 14390),
           ) -> None:
        dst = (GROUP, 14400) if to_group else (SOURCE, 14390)
        frames.append((us, udp_frame(sender[0], sender[1], dst[0], dst[1], packet.build())))

    def data(us: int, sqn: int, rx: bool = False) -> None:
        message = LbmcMessage(type=MessageType.MESSAGE, tidx=1, sqn=sqn, payload=b"planted")
        rm(us, lbtrm.LbtrmData(ucast_port=14390, session_id=PLANTED_SESSION, sqn=sqn,
                               trail_sqn=0, rx=int(rx), payload=[message]))

    tir = lbmr.Tir(name=PLANTED_TOPIC, ttl=1, index=1, info=lbmr.LbtrmInfo(
        src_addr=SOURCE, mcast_addr=GROUP, session_id=PLANTED_SESSION, udp_dest_port=14400,
        src_ucast_port=14390))
    frames.append((0, udp_frame(SOURCE, 14402, LBMRD, 15380,
                                lbmr.LbmrPacket(tirs=[tir]).build())))
    tqrs = [lbmr.Tqr(name=PLANTED_TOPIC), lbmr.Tqr(name="nobody.home")]
    frames.append((100, udp_frame(RCV1, 14403, LBMRD, 15380, lbmr.LbmrPacket(tqrs=tqrs).build())))

    source = connect(1000, SOURCE)
    frames += [(1010, source.send(True, preg(True, 0))), (1100, source.send(False,
                                                                           granted(True, 1001)))]
    rogue = connect(2000, ROGUE)
    refused = control(UmePregResp(e_flag=1, error_code=PregError.EACTIVE, s_flag=1, marker=1,
                                  reg_id=1001, transport_idx=1, topic_idx=1))
    frames += [(2010, rogue.send(True, preg(True, 1001))), (2100, rogue.send(False, refused))]
    rcv1 = connect(3000, RCV1)
    frames += [(3010, rcv1.send(True, preg(False, 0, 1001))),
               (3100, rcv1.send(False, granted(False, 2002)))]
    rcv2 = connect(4000, RCV2)
    frames += [(4010, rcv2.send(True, preg(False, 0, 1001))),
               (4100, rcv2.send(False, granted(False, 2002)))]
    rcv3 = connect(5000, RCV3)
    frames.append((5010, rcv3.send(True, preg(False, 0, 1001))))

    def ack(kind: int, sqn: int, reg_id: int = 0, topic_or_reg: int = 1) -> bytes:
        return control(UmeAck(type=kind, transport_idx=1, id_2=topic_or_reg,
                              rcv_reg_id=reg_id, seqnum=sqn))

    data(10000, 0)
    data(11000, 1)
    frames.append((12000, source.send(False, ack(AckType.STABLE, 0))))
    data(13000, 2)
    data(14000, 5)
    rm(14500, lbtrm.LbtrmNak(ucast_port=14390, session_id=PLANTED_SESSION, naks=[4, 8]),
       to_group=False, sender=(RCV1, 39990))
    data(15000, 3)
    data(16000, 3)
    data(17000, 4, rx=True)
    rm(17500, lbtrm.LbtrmNcf(ucast_port=14390, session_id=PLANTED_SESSION, trail_sqn=0,
                             reason=NcfReason.SHED, ncfs=[8]))
    frames.append((18000, source.send(False, ack(AckType.STABLE, 2))))
    frames.append((18500, rcv1.send(True, ack(AckType.CDELV, 1, 2002, 2002))))
    data(19000, 6)
    frames.append((20000, source.send(False, ack(AckType.STABLE, 9))))

    def rxreq(index: int, sqn: int) -> bytes:
        return control(UmeRxreq(request_idx=index, transport_idx=1, id_2=2002, seqnum=sqn,
                                rx_port=14391, rx_ip=RCV1))

    retrans = LbmcMessage(type=MessageType.RETRANS, tidx=1, sqn=1, payload=b"planted",
                          headers=[Topicname(topic=PLANTED_TOPIC)]).build()
    frames += [(21000, rcv1.send(True, rxreq(7, 1))), (21300, rcv1.send(False, retrans)),
               (22000, rcv1.send(True, rxreq(8, 2)))]
    return sorted(frames, key=lambda f: f[0])


def build_planted(path: Path) -> None:
    from wire.pcap import PcapWriter

    with PcapWriter(path) as writer:
        for us, frame in planted_frames():
            writer.write(PLANTED_START_S + us / 1e6, frame)


NOT_UM = CORPUS / "not-um.pcap"


def not_um_frames() -> list[bytes]:
    """A capture without UM: an ARP frame, HTTP over TCP, a DNS-like datagram, a UDP datagram
    to an LBT-RM port whose content is not LBT-RM (every table must come out empty and every
    frame be counted as not UM, by reason)."""
    from wire.pcap import TcpConversation, udp_frame

    arp = bytes.fromhex("ffffffffffff" "020000000001" "0806") + bytes(28)
    web = TcpConversation(("10.9.0.1", 51000), ("10.9.0.2", 80))
    return [arp, *web.handshake(), web.send(True, b"GET / HTTP/1.1\r\n\r\n"),
            udp_frame("10.9.0.1", 5353, "10.9.0.3", 53, bytes(range(40))),
            udp_frame("10.9.0.1", 14390, "224.10.10.10", 14400, b"\xff" * 24)]


def build_not_um(path: Path) -> None:
    from wire.pcap import PcapWriter

    with PcapWriter(path) as writer:
        for i, frame in enumerate(not_um_frames()):
            writer.write(PLANTED_START_S + i / 1000, frame)


def planted_ns(us: int) -> int:
    """Capture time (ns since the epoch) of a planted event at ``us``."""
    return PLANTED_START_S * 1_000_000_000 + us * 1000


_RUNS: dict[str, CorpusRun] = {}


def corpus_run(out: Path) -> CorpusRun:
    """Run ``ump analyze --per-file`` over the corpus once per process (later calls return the
    first run, wherever they asked for it)."""
    if "corpus" not in _RUNS:
        args = analyze_args(out)
        captured = io.StringIO()
        with contextlib.redirect_stderr(captured):
            code = args.handler(args)
        _RUNS["corpus"] = CorpusRun(out, code, captured.getvalue())
    return _RUNS["corpus"]


def shared_corpus_run(request: Any, tmp_path_factory: Any) -> CorpusRun:
    """The corpus run for a test, computed once per test session even under pytest-xdist.

    xdist workers are separate processes: the first to get here runs the job (starting Spark
    through the ``spark`` fixture) into a directory under the shared base temp, holding a file
    lock; the others wait on the lock and read what it wrote, so they never start Spark for
    this (a second analysis would double the suite's most expensive step)."""
    import fcntl
    import os

    if "corpus" in _RUNS:
        return _RUNS["corpus"]
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent
    out = root / "ump-analyze-corpus"
    marker = root / "ump-analyze-corpus.json"
    with open(root / "ump-analyze-corpus.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if marker.exists():
            saved = json.loads(marker.read_text())
            _RUNS["corpus"] = CorpusRun(out, saved["exit_code"], saved["stderr"])
        else:
            request.getfixturevalue("spark")
            run = corpus_run(out)
            marker.write_text(json.dumps({"exit_code": run.exit_code, "stderr": run.stderr}))
    return _RUNS["corpus"]


def regenerate() -> int:
    """Rewrite ``expected/*.json`` from a fresh run; print which ones changed."""
    import tempfile

    from spark_analysis.session import get_spark

    get_spark(master="local[2]", log_level="ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        run = corpus_run(Path(tmp))
        if run.exit_code != 0:
            print(run.stderr, file=sys.stderr)
            return run.exit_code
        EXPECTED.mkdir(exist_ok=True)
        for capture in CAPTURES:
            path = EXPECTED / f"{capture.stem}.json"
            text = json.dumps(run.capture(capture.name), indent=1, sort_keys=True) + "\n"
            old = path.read_text() if path.exists() else None
            path.write_text(text)
            print(f"{path.relative_to(ROOT)}: {'unchanged' if old == text else 'written'}")
    return 0


if __name__ == "__main__":
    sys.exit(regenerate())
