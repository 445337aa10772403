"""The analyses right on what real deployments do, against tshark on every corpus capture.

Real LBT-RM sources send data from an ephemeral UDP port and take NAKs on the unicast NAK port
their headers name; topic resolution is LBMR version 1 with options on the resolver multicast
group; a session carries several topics; receivers query by wildcard; NAKs to a source that
died come back quoted in ICMP port-unreachable errors; switches add 802.3/LLC frames.  The
``real-traits`` corpus capture (``ump captures generate --scenario real-traits``) has all of
that, the others have none of it: every analysis below must agree with tshark on all of them.

The expectations are computed here from ``tshark -T fields`` alone (no code shared with
:mod:`spark_analysis`), keyed the way ``packet-lbtrm.c`` keys an LBT-RM transport (source
address, ``lbtrm.hdr.ucast_port``, session ID; a NAK by its destination, the same port and
session ID).  What tshark decodes inside an ICMP error (the quoted NAK) is a bounce, not a
NAK sent: counted apart, as a NAK to a closed port.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from wire.lbtrm import PacketType as RmType
from wire.lbtru import PacketType as RuType
from wire.tshark import PortMap

from .analysis_corpus import CAPTURES, CORPUS, STORE_PORT, CorpusRun, shared_corpus_run

REAL = CORPUS / "real-traits.pcap"

FIELDS = {
    "frame": "frame.number", "time": "frame.time_epoch", "ip_src": "ip.src",
    "ip_dst": "ip.dst", "udp_src": "udp.srcport", "udp_dst": "udp.dstport",
    "tcp_src": "tcp.srcport", "icmp_type": "icmp.type", "icmp_code": "icmp.code",
    "eth_len": "eth.len",
    "llc_dsap": "llc.dsap",
    "rm_type": "lbtrm.hdr.type", "rm_ucast": "lbtrm.hdr.ucast_port",
    "rm_session": "lbtrm.hdr.session_id", "rm_sqn": "lbtrm.data.sqn",
    "rm_rx": "lbtrm.data.flags_fec_type.rx", "rm_naks": "lbtrm.nak.list.nak",
    "rm_ncfs": "lbtrm.ncf.list.ncf", "rm_sm_sqn": "lbtrm.sm.sm_sqn",
    "rm_gap": "lbtrm.transport.data_sqn_gap", "rm_ooo": "lbtrm.transport.data_ooo_gap",
    "rm_dup": "lbtrm.transport.data_duplicate",
    "ru_type": "lbtru.hdr.type", "ru_session": "lbtru.opt_sid.session_id",
    "ru_sqn": "lbtru.data.sqn", "ru_rx": "lbtru.hdr.flags.rx", "ru_naks": "lbtru.nak.list.nak",
    "ru_ncfs": "lbtru.ncf.list.ncf",
    "lbmc_type": "lbmc.type", "tidx": "lbmc.tidx",
    "lbmr_ver": "lbmr.hdr.ver", "lbmr_opts": "lbmr.hdr.opts",
    "tir_name": "lbmr.tir.name", "tir_type": "lbmr.tir.transport_type",
    "tir_index": "lbmr.tir.index",
    "tir_tcp_ip": "lbmr.tir.tcp.ip", "tir_tcp_port": "lbmr.tir.tcp.port",
    "tir_ru_ip": "lbmr.tir.lbtru.ip", "tir_ru_port": "lbmr.tir.lbtru.port",
    "tir_ru_session": "lbmr.tir.lbtru.session_id", "tir_rm_ip": "lbmr.tir.lbtrm.srcip",
    "tir_rm_port": "lbmr.tir.lbtrm.sport", "tir_rm_session": "lbmr.tir.lbtrm.sessid",
    "tqr_name": "lbmr.tqr.name", "tqr_pattern": "lbmr.tqr.pattern",
}
PREFS = ["-2", "-o", "lbtrm.sequence_analysis:TRUE"]
"""LBT-RM sequence verdicts need the analysis on and a second pass."""
SEP = "\x1f"
TIR_TRANSPORTS = {0x00: ("lbttcp", "tir_tcp"), 0x01: ("lbtru", "tir_ru"),
                  0x10: ("lbtrm", "tir_rm")}
LBTTCP_SOURCE_PORTS = range(14371, 14391)
SOURCE_SIDE = {"data", "sm", "ncf", "rst"}


def _int(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(text)


@dataclass
class Frame:
    number: int
    ts_ns: int
    values: dict[str, list[str]]

    def one(self, name: str) -> str | None:
        got = self.values.get(name)
        return got[0] if got else None

    def last(self, name: str) -> str | None:
        """The innermost occurrence (an ICMP error's quoted IP header comes second)."""
        got = self.values.get(name)
        return got[-1] if got else None

    def all(self, name: str) -> list[str]:
        return self.values.get(name, [])


def frames(capture: Path) -> Iterator[Frame]:
    args = ["tshark", "-r", str(capture), *PortMap(store_ports=[STORE_PORT]).tshark_args(),
            *PREFS, "-T", "fields", "-E", f"aggregator={SEP}", "-E", "occurrence=a"]
    for name in FIELDS.values():
        args += ["-e", name]
    names = list(FIELDS)
    out = subprocess.run(args, capture_output=True, text=True, check=True).stdout
    for line in out.splitlines():
        cells = line.split("\t")
        values = {n: c.split(SEP) for n, c in zip(names, cells, strict=True) if c}
        yield Frame(int(values["frame"][0]), int(Decimal(values["time"][0]) * 10**9), values)


# =============================================================================================
# tshark's view, rebuilt from the fields
# =============================================================================================


@dataclass
class Packet:
    """One LBT-RM/LBT-RU datagram as tshark shows it, with its session (tshark's keying)."""

    frame: int
    ts_ns: int
    protocol: str
    type: str
    src_ip: str
    src_port: int
    dst_ip: str
    dst_port: int
    session: str
    sqn: int | None
    rx: bool
    naks: list[int]
    ncfs: list[int]
    quoted: bool  # inside an ICMP error: a bounce
    closed_port: bool  # ... of type 3 code 3: nothing listens on its destination port
    gap: int
    ooo: int
    dup: bool


@dataclass
class View:
    packets: list[Packet]
    data: list[tuple[str, int]]  # (session, tidx) of every new data message
    tirs: dict[tuple[str, int], str]  # (session, topic index) -> topic, first advertised
    tir_names: set[str]
    tqrs: list[str]
    patterns: list[str]
    lbmr_versions: Counter[tuple[int, bool]]
    llc_frames: int


def _key(protocol: str, ip: str, port: int, session_id: int | None) -> str:
    key = f"{protocol}:{ip}:{port}"
    return key if session_id is None else f"{key}:{session_id:08x}"


def view(capture: Path) -> View:
    v = View([], [], {}, set(), [], [], Counter(), 0)
    for f in frames(capture):
        if f.one("llc_dsap") is not None and f.one("eth_len") is not None:
            v.llc_frames += 1
        quoted = f.one("icmp_type") is not None
        closed = (f.one("icmp_type"), f.one("icmp_code")) == ("3", "3")
        packet = None
        if f.one("rm_type") is not None:
            kind = RmType(_int(f.one("rm_type") or "0")).name.lower()
            session_id = _int(f.one("rm_session") or "0")
            src, dst = f.last("ip_src") or "", f.last("ip_dst") or ""
            ip = dst if kind == "nak" else src
            session = _key("lbtrm", ip, _int(f.one("rm_ucast") or "0"), session_id)
            sqn = f.one("rm_sqn") or f.one("rm_sm_sqn")
            packet = Packet(f.number, f.ts_ns, "lbtrm", kind, src,
                            _int(f.last("udp_src") or "0"), dst, _int(f.last("udp_dst") or "0"),
                            session, _int(sqn) if sqn else None,
                            f.one("rm_rx") in ("1", "True"),
                            [_int(n) for n in f.all("rm_naks")],
                            [_int(n) for n in f.all("rm_ncfs")], quoted, closed,
                            _int(f.one("rm_gap") or "0"), _int(f.one("rm_ooo") or "0"),
                            f.one("rm_dup") in ("1", "True"))
        elif f.one("ru_type") is not None:
            kind = RuType(_int(f.one("ru_type") or "0")).name.lower()
            src, dst = f.last("ip_src") or "", f.last("ip_dst") or ""
            sport, dport = _int(f.last("udp_src") or "0"), _int(f.last("udp_dst") or "0")
            ours = kind in SOURCE_SIDE
            sid = f.one("ru_session")
            session = _key("lbtru", src if ours else dst, sport if ours else dport,
                           _int(sid) if sid else None)
            sqn = f.one("ru_sqn")
            packet = Packet(f.number, f.ts_ns, "lbtru", kind, src, sport, dst, dport, session,
                            _int(sqn) if sqn else None, f.one("ru_rx") in ("1", "True"),
                            [_int(n) for n in f.all("ru_naks")],
                            [_int(n) for n in f.all("ru_ncfs")], quoted, closed, 0, 0, False)
        if packet is not None:
            v.packets.append(packet)
        types = [_int(t) for t in f.all("lbmc_type")]
        tidxs = [_int(t) for t, k in zip(f.all("tidx"), [t for t in types if t in (0, 1, 2, 10)],
                                           strict=False) if k == 0]
        if packet is not None and packet.type == "data" and not packet.rx and not quoted:
            v.data += [(packet.session, t) for t in tidxs]
        elif packet is None and f.one("tcp_src") is not None and tidxs:
            sport = _int(f.one("tcp_src") or "0")
            if sport in LBTTCP_SOURCE_PORTS:
                v.data += [(_key("lbttcp", f.one("ip_src") or "", sport, None), t)
                           for t in tidxs]
        if f.one("lbmr_ver") is not None:
            v.lbmr_versions[(_int(f.one("lbmr_ver") or "0"),
                             f.one("lbmr_opts") in ("1", "True"))] += 1
        per_kind: Counter[str] = Counter()
        for name, kind_text, index in zip(f.all("tir_name"), f.all("tir_type"),
                                          f.all("tir_index"), strict=True):
            v.tir_names.add(name)
            known = TIR_TRANSPORTS.get(_int(kind_text))
            if known is None:
                continue
            protocol, prefix = known
            k = per_kind[prefix]
            per_kind[prefix] += 1
            tir_sid = None if protocol == "lbttcp" else _int(f.all(f"{prefix}_session")[k])
            session = _key(protocol, f.all(f"{prefix}_ip")[k],
                           _int(f.all(f"{prefix}_port")[k]), tir_sid)
            v.tirs.setdefault((session, _int(index)), name)
        v.tqrs += f.all("tqr_name")
        v.patterns += [p[1:] for p in f.all("tqr_pattern")]  # tshark shows the type byte first
    return v


def expect_sessions(v: View) -> dict[str, dict[str, Any]]:
    out: dict[str, Counter[str]] = defaultdict(Counter)
    for p in v.packets:
        s = out[p.session]
        if p.quoted:
            s["naks_to_closed_port"] += p.type == "nak" and p.closed_port
            continue
        s["data_packets"] += p.type == "data" and not p.rx
        s["rx_packets"] += p.type == "data" and p.rx
        for kind in ("sm", "nak", "ncf"):
            s[f"{kind}_packets"] += p.type == kind
        s["nak_sqns"] += len(p.naks)
        s["ncf_sqns"] += len(p.ncfs)
    topics: dict[str, set[str]] = defaultdict(set)
    for session, tidx in v.data:
        out[session]["messages"] += 1
        if (session, tidx) in v.tirs:
            topics[session].add(v.tirs[(session, tidx)])
    return {k: {**c, "topic_names": ", ".join(sorted(topics[k]))} for k, c in out.items()}


def expect_naks(v: View) -> list[tuple[Any, ...]]:
    """Per NAKed sequence number: the first retransmission of it from the NAK's session
    after the NAK (LBT-RU: to the NAKer), else the first NCF, else the NAK's own bounce."""
    out = []
    live = [p for p in v.packets if not p.quoted]
    bounces = [p for p in v.packets if p.closed_port and p.type == "nak"]
    for nak in (p for p in live if p.type == "nak"):
        for sqn in nak.naks:
            later = [p for p in live if p.frame > nak.frame and p.session == nak.session
                     and (p.protocol == "lbtrm" or p.dst_ip == nak.src_ip)]
            rx = next((p.ts_ns for p in later if p.type == "data" and p.rx and p.sqn == sqn),
                      None)
            ncf = any(p.type == "ncf" and sqn in p.ncfs for p in later)
            bounced = any(b.frame > nak.frame and b.session == nak.session
                          and b.src_ip == nak.src_ip and b.src_port == nak.src_port
                          and sqn in b.naks for b in bounces)
            outcome = ("served" if rx is not None else "ncf" if ncf else
                       "closed-port" if bounced else "unanswered")
            out.append((f"{nak.protocol}-nak", nak.ts_ns, nak.src_ip, nak.session, sqn,
                        outcome, rx))
    return sorted(out, key=lambda r: (r[0], r[1], r[2], r[4]))


def expect_transport_sequence(v: View) -> dict[tuple[Any, ...], tuple[int, ...]]:
    """tshark's own LBT-RM data verdicts per stream (source address, NAK port, session ID,
    group, port): items, RX, gaps, out of order, duplicates."""
    out: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0] * 5)
    for p in v.packets:
        if p.protocol != "lbtrm" or p.type != "data" or p.quoted:
            continue
        _, ip, port, sid = p.session.split(":")
        row = out[(ip, int(port), int(sid, 16), p.dst_ip, p.dst_port)]
        row[0] += 1
        row[1] += p.rx
        row[2] += p.gap > 0
        row[3] += p.ooo > 0
        row[4] += p.dup
    return {k: tuple(r) for k, r in out.items()}


# =============================================================================================
# The comparison
# =============================================================================================


@pytest.fixture(scope="module")
def corpus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> CorpusRun:
    run = shared_corpus_run(request, tmp_path_factory)
    assert run.exit_code == 0, run.stderr
    return run


def _none(value: Any) -> Any:
    if value is None or (isinstance(value, float) and value != value):
        return None
    if hasattr(value, "item"):
        return value.item()
    return value


def _ours(corpus: CorpusRun, name: str, capture: Path) -> list[dict[str, Any]]:
    df = corpus.table(name)
    rows: list[dict[str, Any]] = df[df["capture"] == str(capture)].to_dict("records")
    return [{k: _none(v) for k, v in r.items()} for r in rows]


@pytest.fixture(scope="module")
def views() -> dict[Path, View]:
    return {capture: view(capture) for capture in CAPTURES}


def test_the_corpus_has_a_real_traits_capture(views: dict[Path, View]) -> None:
    """The traits are on the wire as tshark sees them, so the comparisons below cover them."""
    v = views[REAL]
    sidecar = json.loads(Path(f"{REAL}.meta.json").read_text())
    assert sidecar["scenario"]["name"] == "real-traits"
    data = [p for p in v.packets if p.protocol == "lbtrm" and p.type == "data"]
    assert data and all(p.src_port != int(p.session.split(":")[2]) for p in data), \
        "LBT-RM data must leave from a port other than the NAK port of its header"
    naks = [p for p in v.packets if p.protocol == "lbtrm" and p.type == "nak" and not p.quoted]
    assert naks and {p.dst_port for p in naks} == {int(p.session.split(":")[2]) for p in naks}
    assert v.lbmr_versions and set(v.lbmr_versions) == {(1, True)}, v.lbmr_versions
    assert any(p.closed_port and p.type == "nak" for p in v.packets), "no ICMP-quoted NAK"
    assert v.llc_frames > 0
    assert v.patterns and len({s for s, _ in v.data if s.startswith("lbtrm")}) >= 1
    assert max(Counter(s for s, _ in set(v.data)).values()) >= 3, "several topics per session"


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.stem for c in CAPTURES])
def test_sessions_are_tsharks(corpus: CorpusRun, views: dict[Path, View], capture: Path) -> None:
    """One row per session as tshark keys it: data, RX, SM, NAK and NCF counts, NAKs that
    bounced, new messages, and the topic names the TIRs give its data."""
    want = expect_sessions(views[capture])
    got = {r["session"]: r for r in _ours(corpus, "transport_sessions", capture)
           if r["protocol"] != "lbttcp"}
    columns = ["data_packets", "rx_packets", "sm_packets", "nak_packets", "nak_sqns",
               "ncf_packets", "ncf_sqns", "naks_to_closed_port", "messages"]
    udp_want = {k: w for k, w in want.items() if not k.startswith("lbttcp")}
    assert set(got) == set(udp_want)
    for session, row in got.items():
        w = udp_want[session]
        assert {c: row[c] for c in columns} == {c: w.get(c, 0) for c in columns}, session
        assert (row["topic_names"] or "") == w["topic_names"], session
    tcp = {r["session"]: r for r in _ours(corpus, "transport_sessions", capture)
           if r["protocol"] == "lbttcp"}
    for session, row in tcp.items():
        assert (row["topic_names"] or "") == want.get(session, {}).get("topic_names", ""), \
            session


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.stem for c in CAPTURES])
def test_nak_pairing_is_tsharks(corpus: CorpusRun, views: dict[Path, View],
                                capture: Path) -> None:
    """Every NAKed sequence number: served by a retransmission of the NAK's session, NCF'd,
    bounced off a closed port, or unanswered; the same verdicts as tshark's fields give."""
    rows = [r for r in _ours(corpus, "retransmission_requests", capture)
            if r["kind"].endswith("-nak")]
    got = sorted(((r["kind"], r["ts_ns"], r["requester_ip"], r["session"], r["sqn"],
                   r["outcome"], r["served_ts_ns"]) for r in rows),
                 key=lambda r: (r[0], r[1], r[2], r[4]))
    assert got == expect_naks(views[capture])


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.stem for c in CAPTURES])
def test_transport_gaps_are_tsharks(corpus: CorpusRun, views: dict[Path, View],
                                    capture: Path) -> None:
    """LBT-RM data streams keyed by the header's NAK port, with tshark's own verdicts."""
    rows = [r for r in _ours(corpus, "sequence_summary", capture)
            if r["level"] == "transport-data" and r["protocol"] == "lbtrm"]
    got = {(r["source_ip"], r["source_port"], r["session_id"], r["dest_ip"], r["dest_port"]):
           (r["items"], r["retransmissions"], r["gaps"], r["out_of_order"], r["duplicates"])
           for r in rows}
    assert got == expect_transport_sequence(views[capture])


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.stem for c in CAPTURES])
def test_topics_on_data_rows(corpus: CorpusRun, views: dict[Path, View], capture: Path) -> None:
    """Each source topic's flight row is named by the TIR for its session and topic index;
    a TIR names the session the data rows are on (its ``session`` column)."""
    v = views[capture]
    for row in _ours(corpus, "flight_size_summary", capture):
        assert row["topic"] == v.tirs.get((row["session"], row["tidx"])), row
    data_sessions = {s for s, _ in v.data}
    for row in _ours(corpus, "topic_advertisements", capture):
        key = (row["session"], row["topic_index"])
        assert v.tirs.get(key) is not None, key
        if capture == REAL and row["transport"] == "lbtrm":
            assert row["session"] in data_sessions, row["session"]


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.stem for c in CAPTURES])
def test_queries_answered_by_matching_tirs(corpus: CorpusRun, views: dict[Path, View],
                                           capture: Path) -> None:
    """A TQR is answered by TIRs of its topic; a wildcard TQR by TIRs of every topic its
    pattern matches (a search, as UM matches receiver patterns)."""
    v = views[capture]
    got = {(r["record"], r["topic"]): (r["queries"], r["matching_topics"], r["answered"])
           for r in _ours(corpus, "topic_queries", capture)}
    want: dict[tuple[str, str], tuple[int, int, bool]] = {}
    for record, names in (("tqr", v.tqrs), ("wc_tqr", v.patterns)):
        for name, count in Counter(names).items():
            if record == "tqr":
                matching = int(name in v.tir_names)
            else:
                matching = sum(1 for t in v.tir_names if re.search(name, t))
            want[(record, name)] = (count, matching, matching > 0)
    assert got == want


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.stem for c in CAPTURES])
def test_naks_to_a_closed_port_are_anomalies(corpus: CorpusRun, views: dict[Path, View],
                                             capture: Path) -> None:
    bounced = [p for p in views[capture].packets if p.closed_port and p.type == "nak"]
    kinds = Counter(r["kind"] for r in _ours(corpus, "anomalies", capture))
    assert kinds["nak-to-closed-port"] == len(bounced)
    unanswered = sum(1 for r in expect_naks(views[capture]) if r[5] == "unanswered")
    rxreq = [r for r in _ours(corpus, "retransmission_requests", capture)
             if r["kind"] == "ume-rxreq" and r["outcome"] == "unanswered"]
    assert kinds["retransmission-unanswered"] == unanswered + len(rxreq)


def test_wildcard_patterns_search_topic_names() -> None:
    """UM matches a receiver's pattern anywhere in the name unless it anchors itself; a
    pattern that does not compile answers nothing instead of failing the analysis."""
    from spark_analysis.engine.topics import wildcard_matches

    assert wildcard_matches(r"^ump\.lbtrm\.src0\.topic[0-9]+$", "ump.lbtrm.src0.topic12")
    assert not wildcard_matches(r"^ump\.lbtrm\.src0\.topic[0-9]+$", "ump.lbtrm.src0.topicX")
    assert wildcard_matches(r"src0", "ump.lbtrm.src0.topic1")  # a search, not a full match
    assert not wildcard_matches(r"^src0", "ump.lbtrm.src0.topic1")
    assert not wildcard_matches(r"topic[0-9", "topic1")  # does not compile
