"""Agreement with tshark: every analysis recomputed from ``tshark -T fields`` output.

The tshark side below shares no code with :mod:`spark_analysis`: it asks tshark (with the port
preferences that put the store port through LBT-TCP, as the sidecar records them) for the
fields of every frame, rebuilds packets, LBMC headers and topic records from that text, and
recomputes each analysis with plain Python and pandas.  Where tshark analyses something itself
(the LBT-RM / LBT-RU transport sequence analysis: ``lbtrm.transport.data_sqn_gap``,
``lbtru.analysis.data_duplicate`` ...) its verdicts are used as they are.

The corpus runs by default (one tshark pass per capture, about a second each); a generated
1,000,000-packet capture runs under ``-m slow``.
"""

from __future__ import annotations

import bisect
import json
import shutil
import subprocess
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wire.lbtrm import PacketType as RmType
from wire.lbtru import PacketType as RuType
from wire.tshark import PortMap

from .analysis_corpus import (
    CAPTURES,
    GENERATED,
    STORE_PORT,
    analyze_args,
    read_table,
    shared_corpus_run,
)

pytestmark = pytest.mark.skipif(shutil.which("tshark") is None, reason="tshark not installed")

# =============================================================================================
# tshark side: fields
# =============================================================================================

FIELDS: dict[str, str] = {
    "frame": "frame.number", "time": "frame.time_epoch", "ip_src": "ip.src", "ip_dst": "ip.dst",
    "udp_src": "udp.srcport", "udp_dst": "udp.dstport", "udp_len": "udp.length",
    "tcp_src": "tcp.srcport", "tcp_dst": "tcp.dstport", "tcp_len": "tcp.len",
    "icmp_type": "icmp.type", "icmp_code": "icmp.code",
    "rm_type": "lbtrm.hdr.type", "rm_session": "lbtrm.hdr.session_id",
    "rm_ucast": "lbtrm.hdr.ucast_port",
    "rm_data_sqn": "lbtrm.data.sqn", "rm_rx": "lbtrm.data.flags_fec_type.rx",
    "rm_sm_sqn": "lbtrm.sm.sm_sqn", "rm_naks": "lbtrm.nak.list.nak",
    "rm_ncfs": "lbtrm.ncf.list.ncf", "rm_ncf_reason": "lbtrm.ncf.reason",
    "rm_gap": "lbtrm.transport.data_sqn_gap", "rm_ooo": "lbtrm.transport.data_ooo_gap",
    "rm_dup": "lbtrm.transport.data_duplicate", "rm_sm_gap": "lbtrm.transport.sm_sqn_gap",
    "rm_sm_ooo": "lbtrm.transport.sm_ooo_gap", "rm_sm_dup": "lbtrm.transport.sm_duplicate",
    "ru_type": "lbtru.hdr.type", "ru_session": "lbtru.opt_sid.session_id",
    "ru_data_sqn": "lbtru.data.sqn", "ru_rx": "lbtru.hdr.flags.rx", "ru_sm_sqn": "lbtru.sm.sqn",
    "ru_naks": "lbtru.nak.list.nak", "ru_ncfs": "lbtru.ncf.list.ncf",
    "ru_ncf_reason": "lbtru.ncf.reason", "ru_gap": "lbtru.analysis.data_sqn_gap",
    "ru_ooo": "lbtru.analysis.data_ooo_gap", "ru_dup": "lbtru.analysis.data_duplicate",
    "ru_sm_gap": "lbtru.analysis.sm_sqn_gap", "ru_sm_ooo": "lbtru.analysis.sm_ooo_gap",
    "ru_sm_dup": "lbtru.analysis.sm_duplicate",
    "lbmc_type": "lbmc.type", "tidx": "lbmc.tidx", "sqn": "lbmc.sqn",
    "topicname": "lbmc.topicname.topic",
    "preg_s": "lbmc.ume_preg.s_flag", "preg_reg_id": "lbmc.ume_preg.reg_id",
    "preg_transport_idx": "lbmc.ume_preg.transport_idx",
    "preg_topic_idx": "lbmc.ume_preg.topic_idx", "preg_src_reg_id": "lbmc.ume_preg.src_reg_id",
    "preg_rpp": "lbmc.ume_preg.flags.w_flag", "preg_dereg": "lbmc.ume_preg.flags.d_flag",
    "sid": "lbmc.ume_sid.sid",
    "resp_s": "lbmc.ume_preg_resp.s_flag", "resp_reg_id": "lbmc.ume_preg_resp.reg_id",
    "resp_transport_idx": "lbmc.ume_preg_resp.transport_idx",
    "resp_topic_idx": "lbmc.ume_preg_resp.topic_idx",
    "resp_e": "lbmc.ume_preg_resp.code.e_flag", "resp_code": "lbmc.ume_preg_resp.code.code",
    "resp_o": "lbmc.ume_preg_resp.code.o_flag", "storeid": "lbmc.ume_storeid.store_id",
    "ack_type": "lbmc.ume_ack.type", "ack_transport_idx": "lbmc.ume_ack.transport_idx",
    "ack_id2": "lbmc.ume_ack.id_2", "ack_rcv": "lbmc.ume_ack.rcv_reg_id",
    "ack_sqn": "lbmc.ume_ack.seqnum",
    "rxreq_idx": "lbmc.ume_rxreq.request_idx", "rxreq_id2": "lbmc.ume_rxreq.id_2",
    "rxreq_sqn": "lbmc.ume_rxreq.seqnum",
    "tir_name": "lbmr.tir.name", "tir_type": "lbmr.tir.transport_type",
    "tir_index": "lbmr.tir.index", "tir_tcp_ip": "lbmr.tir.tcp.ip",
    "tir_tcp_port": "lbmr.tir.tcp.port", "tir_tcp_session": "lbmr.tir.tcp.session_id",
    "tir_ru_ip": "lbmr.tir.lbtru.ip", "tir_ru_port": "lbmr.tir.lbtru.port",
    "tir_ru_session": "lbmr.tir.lbtru.session_id", "tir_rm_ip": "lbmr.tir.lbtrm.srcip",
    "tir_rm_port": "lbmr.tir.lbtrm.sport", "tir_rm_session": "lbmr.tir.lbtrm.sessid",
    "tir_rm_mcast": "lbmr.tir.lbtrm.mcastip", "tqr_name": "lbmr.tqr.name",
    "tqr_pattern": "lbmr.tqr.pattern",
}
ANALYSIS_PREFS = ["-2", "-o", "lbtrm.sequence_analysis:TRUE",
                  "-o", "lbtru.sequence_analysis:TRUE"]
"""tshark's LBT-RM/LBT-RU sequence analysis is off by default, and LBT-RM shows its verdicts
only on the second pass (``-2``; LBT-RU shows them in one)."""
SEP = "\x1f"
"""Occurrence separator: topic names may contain commas."""
LBTTCP_SOURCE_PORTS = range(14371, 14391)
TIR_TRANSPORTS = {0x00: "tcp", 0x01: "lbtru", 0x10: "lbtrm"}
DATA_TYPES = {0: "data", 1: "eot", 2: "proactive_retrans", 10: "retrans"}


def _int(text: str) -> int:
    return int(text, 16) if text.lower().startswith("0x") else int(text)


def _flag(text: str) -> bool:
    return text.strip().lower() in ("1", "true")


def _ns(text: str) -> int:
    return int(Decimal(text) * 1_000_000_000)


@dataclass
class Frame:
    """One frame's fields; each value is the list of its occurrences."""

    number: int
    ts_ns: int
    values: dict[str, list[str]]

    def one(self, name: str) -> str | None:
        got = self.values.get(name)
        return got[0] if got else None

    def all(self, name: str) -> list[str]:
        return self.values.get(name, [])


def tshark_frames(capture: Path, ports: PortMap) -> Iterator[Frame]:
    """Every frame's fields, streamed (a large capture's text is never held whole)."""
    args = ["tshark", "-r", str(capture), *ports.tshark_args(), *ANALYSIS_PREFS, "-T", "fields",
            "-E", f"aggregator={SEP}", "-E", "occurrence=a"]
    for name in FIELDS.values():
        args += ["-e", name]
    names = list(FIELDS)
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                          bufsize=1 << 20) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            cells = line.rstrip("\n").split("\t")
            values = {n: c.split(SEP) for n, c in zip(names, cells, strict=True) if c}
            yield Frame(int(values["frame"][0]), _ns(values["time"][0]), values)
    assert proc.returncode == 0, f"tshark failed on {capture}"


# =============================================================================================
# tshark side: records
# =============================================================================================


@dataclass
class Tables:
    """What the tshark text says, as plain records (dicts)."""

    udp: list[dict[str, Any]] = field(default_factory=list)
    tcp: list[dict[str, Any]] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    pregs: list[dict[str, Any]] = field(default_factory=list)
    resps: list[dict[str, Any]] = field(default_factory=list)
    acks: list[dict[str, Any]] = field(default_factory=list)
    rxreqs: list[dict[str, Any]] = field(default_factory=list)
    tirs: list[dict[str, Any]] = field(default_factory=list)
    tqrs: list[dict[str, Any]] = field(default_factory=list)
    ambiguous: int = 0
    bounces: list[dict[str, Any]] = field(default_factory=list)  # NAKs a closed port bounced


def _udp_record(frame: Frame, prefix: str, types: type[RmType] | type[RuType]) -> dict[str, Any]:
    kind = types(_int(frame.one(f"{prefix}_type") or "0")).name.lower()
    sqn_text = frame.one(f"{prefix}_data_sqn") or frame.one(f"{prefix}_sm_sqn")
    session = frame.one(f"{prefix}_session")
    sport, dport = _int(frame.one("udp_src") or "0"), _int(frame.one("udp_dst") or "0")
    # the session's port as tshark keys it: LBT-RM the header's NAK port (data may leave from
    # an ephemeral port), LBT-RU the source side's UDP port
    port = (_int(frame.one("rm_ucast") or "0") if prefix == "rm"
            else sport if kind in SOURCE_SIDE else dport)
    return {"port": port,
        "frame": frame.number, "ts_ns": frame.ts_ns, "type": kind,
        "src_ip": frame.one("ip_src"), "src_port": _int(frame.one("udp_src") or "0"),
        "dst_ip": frame.one("ip_dst"), "dst_port": _int(frame.one("udp_dst") or "0"),
        "session_id": _int(session) if session else None,
        "sqn": _int(sqn_text) if sqn_text else None,
        "rx": _flag(frame.one(f"{prefix}_rx") or "0"),
        "naks": [_int(v) for v in frame.all(f"{prefix}_naks")],
        "ncfs": [_int(v) for v in frame.all(f"{prefix}_ncfs")],
        "ncf_reason": _int(frame.one(f"{prefix}_ncf_reason") or "0"),
        "payload": _int(frame.one("udp_len") or "8") - 8,
        "gap": _int(frame.one(f"{prefix}_gap") or frame.one(f"{prefix}_sm_gap") or "0"),
        "ooo": _int(frame.one(f"{prefix}_ooo") or frame.one(f"{prefix}_sm_ooo") or "0"),
        "dup": _flag(frame.one(f"{prefix}_dup") or frame.one(f"{prefix}_sm_dup") or "0"),
    }


def _headers(frame: Frame, prefix: str) -> list[dict[str, str]]:
    """Occurrences of one header kind: the i-th value of each of its fields."""
    columns = {key: frame.all(key) for key in FIELDS if key.startswith(prefix)}
    count = max((len(v) for v in columns.values()), default=0)
    return [{key: values[i] for key, values in columns.items() if i < len(values)}
            for i in range(count)]


def records(frames: Iterable[Frame]) -> Tables:
    out = Tables()
    for frame in frames:
        if frame.one("icmp_type") is not None:
            # an ICMP error quotes a datagram sent before, not traffic (test_real_traits.py);
            # a NAK that port unreachable bounced is the answer "nobody is there"
            if frame.one("rm_type") is not None and frame.one("icmp_code") == "3":
                out.bounces.append({**_udp_record(frame, "rm", RmType), "frame": frame.number,
                                    "src_ip": frame.all("ip_src")[-1],
                                    "dst_ip": frame.all("ip_dst")[-1]})
            continue
        base = {"frame": frame.number, "ts_ns": frame.ts_ns, "src_ip": frame.one("ip_src"),
                "dst_ip": frame.one("ip_dst")}
        protocol = None
        if frame.one("rm_type") is not None:
            protocol = "lbtrm"
            out.udp.append({"protocol": protocol, **_udp_record(frame, "rm", RmType)})
        elif frame.one("ru_type") is not None:
            protocol = "lbtru"
            out.udp.append({"protocol": protocol, **_udp_record(frame, "ru", RuType)})
        if frame.one("tcp_src") is not None:
            base["src_port"] = _int(frame.one("tcp_src") or "0")
            base["dst_port"] = _int(frame.one("tcp_dst") or "0")
            if frame.all("lbmc_type"):
                protocol = "lbttcp"
                out.tcp.append({**base, "payload": _int(frame.one("tcp_len") or "0")})
        elif frame.one("udp_src") is not None:
            base["src_port"] = _int(frame.one("udp_src") or "0")
            base["dst_port"] = _int(frame.one("udp_dst") or "0")
        types = [_int(t) for t in frame.all("lbmc_type")]
        if types:
            udp = out.udp[-1] if protocol in ("lbtrm", "lbtru") else None
            tidx, sqn = frame.all("tidx"), frame.all("sqn")
            data_positions = [i for i, t in enumerate(types) if t in DATA_TYPES]
            assert len(data_positions) == len(sqn) == len(tidx), frame.number
            transport_channel = protocol != "lbttcp" or (
                base["src_port"] in LBTTCP_SOURCE_PORTS or base["dst_port"] in LBTTCP_SOURCE_PORTS)
            for k, i in enumerate(data_positions):
                out.messages.append({
                    **base, "port": udp["port"] if udp else base["src_port"],
                    "protocol": protocol, "type": DATA_TYPES[types[i]],
                    "label": "DATA" if types[i] == 0 and transport_channel else "other",
                    "session_id": udp["session_id"] if udp else None,
                    "rx": bool(udp["rx"]) if udp else False,
                    "tidx": _int(tidx[k]), "sqn": _int(sqn[k])})
            if len(types) > 1 and (frame.all("preg_s") or frame.all("resp_s")):
                out.ambiguous += 1  # which topicname / sid / storeid goes with which header
            topics, sids, storeids = (frame.all("topicname"), frame.all("sid"),
                                      frame.all("storeid"))
            for h in _headers(frame, "preg_"):
                out.pregs.append({
                    **base, "role": "source" if _flag(h["preg_s"]) else "receiver",
                    "reg_id": _int(h["preg_reg_id"]),
                    "transport_idx": _int(h["preg_transport_idx"]),
                    "topic_idx": _int(h["preg_topic_idx"]),
                    "src_reg_id": _int(h["preg_src_reg_id"]), "rpp": _flag(h["preg_rpp"]),
                    "deregister": _flag(h["preg_dereg"]),
                    "topic": topics[0] if len(types) == 1 and topics else None,
                    "session": str(_int(sids[0])) if len(types) == 1 and sids else None})
            for h in _headers(frame, "resp_"):
                error = _flag(h["resp_e"])
                out.resps.append({
                    **base, "role": "source" if _flag(h["resp_s"]) else "receiver",
                    "reg_id": _int(h["resp_reg_id"]),
                    "transport_idx": _int(h["resp_transport_idx"]),
                    "topic_idx": _int(h["resp_topic_idx"]), "error": error,
                    "code": _int(h["resp_code"]) if error else None,
                    "old": _flag(h["resp_o"]),
                    "store_id": _int(storeids[0]) if len(types) == 1 and storeids else None})
            for h in _headers(frame, "ack_"):
                out.acks.append({**base, "type": _int(h["ack_type"]),
                                 "transport_idx": _int(h["ack_transport_idx"]),
                                 "id_2": _int(h["ack_id2"]), "rcv_reg_id": _int(h["ack_rcv"]),
                                 "sqn": _int(h["ack_sqn"])})
            for h in _headers(frame, "rxreq_"):
                out.rxreqs.append({**base, "request_idx": _int(h["rxreq_idx"]),
                                   "reg_id": _int(h["rxreq_id2"]), "sqn": _int(h["rxreq_sqn"])})
        names, kinds, indexes = frame.all("tir_name"), frame.all("tir_type"), frame.all("tir_index")
        per_kind: dict[str, int] = Counter()
        for name, kind, index in zip(names, kinds, indexes, strict=True):
            transport = TIR_TRANSPORTS.get(_int(kind), f"0x{_int(kind):02x}")
            prefix = {"tcp": "tir_tcp", "lbtru": "tir_ru", "lbtrm": "tir_rm"}.get(transport)
            k = per_kind[transport]
            per_kind[transport] += 1
            record = {**base, "topic": name, "transport": transport,
                      "topic_index": _int(index)}
            if prefix:
                record.update(source_ip=frame.all(f"{prefix}_ip")[k],
                              source_port=_int(frame.all(f"{prefix}_port")[k]),
                              session_id=_int(frame.all(f"{prefix}_session")[k]))
            out.tirs.append(record)
        for name in frame.all("tqr_name"):
            out.tqrs.append({**base, "topic": name})
        for pattern in frame.all("tqr_pattern"):  # a wildcard TQR: tshark shows the type first
            out.tqrs.append({**base, "topic": pattern[1:]})
    return out


def session_key(protocol: str, ip: str, port: int, session_id: int | None) -> str:
    key = f"{protocol}:{ip}:{port}"
    return key if session_id is None else f"{key}:{session_id:08x}"


# =============================================================================================
# tshark side: the analyses
# =============================================================================================


def expect_advertisements(t: Tables) -> dict[tuple[Any, ...], tuple[int, int, int, int]]:
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in t.tirs:
        groups[(r["topic"], r["transport"], r.get("source_ip"), r.get("source_port"),
                r.get("session_id"), r["topic_index"])].append(r)
    return {k: (len(v), len({r["src_ip"] for r in v}), min(r["ts_ns"] for r in v),
                max(r["ts_ns"] for r in v)) for k, v in groups.items()}


def expect_queries(t: Tables) -> dict[str, tuple[int, int]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in t.tqrs:
        groups[r["topic"]].append(r)
    return {k: (len(v), len({r["src_ip"] for r in v})) for k, v in groups.items()}


SOURCE_SIDE = {"data", "sm", "ncf", "rst"}


def expect_sessions(t: Tables) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {}
    for p in t.udp:
        ours = p["type"] in SOURCE_SIDE
        ip, port = (p["src_ip"] if ours else p["dst_ip"]), p["port"]
        key = session_key(p["protocol"], ip, port, p["session_id"])
        s = out.setdefault(key, Counter())
        rx = p["type"] == "data" and p["rx"]
        new = p["type"] == "data" and not p["rx"]
        s["data_packets"] += new
        s["data_bytes"] += p["payload"] if new else 0
        s["rx_packets"] += rx
        s["rx_bytes"] += p["payload"] if rx else 0
        for kind in ("sm", "nak", "ncf", "creq", "ack", "rst"):
            s[f"{kind}_packets"] += p["type"] == kind
        s["nak_sqns"] += len(p["naks"])
        s["ncf_sqns"] += len(p["ncfs"])
        s.setdefault("first_ts_ns", p["ts_ns"])
        s["last_ts_ns"] = p["ts_ns"]
    for m in t.messages:
        if m["type"] == "data" and m["label"] == "DATA" and not m["rx"]:
            key = session_key(m["protocol"], m["src_ip"], m["port"],
                              m["session_id"] if m["protocol"] != "lbttcp" else None)
            out.setdefault(key, Counter())["messages"] += 1
    return {k: dict(v) for k, v in out.items()}


def expect_transport_sequence(t: Tables) -> dict[tuple[Any, ...], tuple[int, ...]]:
    """tshark's own verdicts per stream: items, RX, gaps, gap sqns, out of order, dups."""
    out: dict[tuple[Any, ...], list[int]] = defaultdict(lambda: [0] * 6)
    for p in t.udp:
        if p["type"] not in ("data", "sm") or p["sqn"] is None:
            continue
        key = (f"transport-{p['type']}", p["protocol"], p["src_ip"], p["port"],
               p["session_id"], p["dst_ip"], p["dst_port"])
        row = out[key]
        row[0] += 1
        row[1] += p["rx"]
        row[2] += p["gap"] > 0
        row[3] += p["gap"]
        row[4] += p["ooo"] > 0
        row[5] += p["dup"]
    return {k: tuple(v) for k, v in out.items()}


def expect_topic_sequence(t: Tables) -> dict[tuple[Any, ...], tuple[int, ...]]:
    """Topic sequence numbers per transport stream and topic index, walked in capture order
    with the stated rules (first not judged; RX not judged; at or below the high-water mark:
    out of order unless equal, duplicate if seen; above high + 1: a gap of sqn - high - 1)."""
    streams: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for m in t.messages:
        if m["type"] == "data" and m["label"] == "DATA":
            streams[("topic", m["protocol"], m["src_ip"], m["port"],
                     m["session_id"] if m["protocol"] != "lbttcp" else None,
                     m["dst_ip"], m["dst_port"], m["tidx"])].append(m)
    out = {}
    for key, items in streams.items():
        high, seen, first = 0, set(), True
        counts = [0] * 6
        for m in items:
            sqn, rx = m["sqn"], m["rx"]
            counts[0] += 1
            counts[1] += rx
            if not first and not rx:
                if sqn <= high:
                    counts[5] += sqn in seen
                    counts[4] += sqn != high
                elif sqn > high + 1:
                    counts[2] += 1
                    counts[3] += sqn - high - 1
            if not rx and sqn > high:
                high = sqn
            seen.add(sqn)
            first = False
        out[key] = tuple(counts)
    return out


def expect_registrations(t: Tables) -> list[dict[str, Any]]:
    """Requests paired with responses first come first served per connection, role and
    indices (a repeated identical request replaces the pending one)."""
    events: dict[tuple[Any, ...], list[tuple[int, int, dict[str, Any]]]] = defaultdict(list)
    for r in t.pregs:
        key = (r["src_ip"], r["src_port"], r["dst_ip"], r["dst_port"], r["role"],
               r["transport_idx"], r["topic_idx"])
        events[key].append((r["frame"], 0, r))
    for r in t.resps:
        key = (r["dst_ip"], r["dst_port"], r["src_ip"], r["src_port"], r["role"],
               r["transport_idx"], r["topic_idx"])
        events[key].append((r["frame"], 1, r))
    rows = []
    for items in events.values():
        pending: dict[tuple[Any, ...], dict[str, Any]] = {}
        for _, is_response, r in sorted(items, key=lambda e: (e[0], e[1])):
            if not is_response:
                content = (r["reg_id"], r["src_reg_id"], r["session"], r["rpp"],
                           r["deregister"], r["topic"])
                if content in pending:
                    rows.append({**pending.pop(content), "response": None})
                pending[content] = r
            elif pending:
                first = next(iter(pending))
                rows.append({**pending.pop(first), "response": r})
        rows += [{**r, "response": None} for r in pending.values()]
    for row in rows:
        resp = row["response"]
        row["outcome"] = ("unanswered" if resp is None else
                          "error" if resp["error"] else "granted")
        row["granted_reg_id"] = resp["reg_id"] if row["outcome"] == "granted" else None
        row["error_code"] = resp["code"] if resp is not None else None
        row["old_client"] = resp["old"] if resp is not None else None
    rows.sort(key=lambda r: r["frame"])
    # a receiver registration names its source through the source RegID the store granted
    sources: dict[tuple[str, int], dict[str, Any]] = {}
    for row in rows:
        if row["role"] == "source" and row["outcome"] == "granted":
            sources.setdefault((row["dst_ip"], row["granted_reg_id"]), row)
    for row in rows:
        named = (row if row["role"] == "source"
                 else sources.get((row["dst_ip"], row["src_reg_id"])))
        row["source_ip"] = named["src_ip"] if named else None
        row["source_topic"] = named["topic"] if named else None
    return rows


def sends(t: Tables) -> dict[tuple[Any, ...], list[int]]:
    """(source ip, tidx, sqn) -> first-send times of each transport session, ascending."""
    first: dict[tuple[Any, ...], int] = {}
    for m in t.messages:
        if m["type"] == "data" and m["label"] == "DATA" and not m["rx"]:
            key = (m["src_ip"], m["tidx"], m["sqn"],
                   session_key(m["protocol"], m["src_ip"], m["port"],
                               m["session_id"] if m["protocol"] != "lbttcp" else None))
            first[key] = min(first.get(key, m["ts_ns"]), m["ts_ns"])
    out: dict[tuple[Any, ...], list[int]] = defaultdict(list)
    for (ip, tidx, sqn, _), ts in first.items():
        out[(ip, tidx, sqn)].append(ts)
    return {k: sorted(v) for k, v in out.items()}


def _latest(times: Sequence[int], at: int) -> int | None:
    before = [t for t in times if t <= at]
    return before[-1] if before else None


def expect_acks(t: Tables, regs: list[dict[str, Any]]
                ) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    """(stability, consumption) rows: (ts, store, source, tidx, sqn, send ts or None)."""
    sent = sends(t)
    receivers: dict[tuple[str, int], dict[str, Any]] = {}
    for row in regs:
        if row["role"] == "receiver" and row["outcome"] == "granted":
            receivers.setdefault((row["dst_ip"], row["granted_reg_id"]), row)
    stability, consumption = [], []
    for a in t.acks:
        if a["type"] == 1:
            source, tidx = a["dst_ip"], a["id_2"]
            stability.append((a["ts_ns"], a["src_ip"], source, tidx, a["sqn"],
                              _latest(sent.get((source, tidx, a["sqn"]), []), a["ts_ns"])))
        elif a["type"] == 0:
            reg = receivers.get((a["dst_ip"], a["rcv_reg_id"]))
            source = reg["source_ip"] if reg else None
            tidx = reg["topic_idx"] if reg else None
            consumption.append((a["ts_ns"], a["dst_ip"], source, tidx, a["sqn"],
                                _latest(sent.get((source, tidx, a["sqn"]), []), a["ts_ns"])
                                if source else None))
    return stability, consumption


def expect_flight(t: Tables, regs: list[dict[str, Any]], stability: list[tuple[Any, ...]]
                  ) -> dict[tuple[Any, ...], tuple[Any, ...]]:
    """Per (session, source, tidx): messages, stabilized, peak and final in-flight count,
    stores and ACKs needed (a quorum of the stores the source registered that topic with)."""
    first: dict[tuple[Any, ...], int] = {}
    for m in t.messages:
        if m["type"] == "data" and m["label"] == "DATA" and not m["rx"]:
            key = (session_key(m["protocol"], m["src_ip"], m["port"],
                               m["session_id"] if m["protocol"] != "lbttcp" else None),
                   m["src_ip"], m["tidx"], m["sqn"])
            first[key] = min(first.get(key, m["ts_ns"]), m["ts_ns"])
    session_of = {(ip, tidx, sqn, ts): session for (session, ip, tidx, sqn), ts in first.items()}
    acked: dict[tuple[Any, ...], dict[str, int]] = defaultdict(dict)
    for ts, store, source, tidx, sqn, sent in stability:
        if sent is not None:
            stream = (session_of[(source, tidx, sqn, sent)], source, tidx)
            acked[(*stream, sqn)].setdefault(store, ts)
    registered: dict[tuple[str, int], set[str]] = defaultdict(set)
    for row in regs:
        if row["role"] == "source" and row["outcome"] == "granted":
            registered[(row["src_ip"], row["topic_idx"])].add(row["dst_ip"])
    acking: dict[tuple[Any, ...], set[str]] = defaultdict(set)
    for (session, source, tidx, _), stores in acked.items():
        acking[(session, source, tidx)].update(stores)
    events: dict[tuple[Any, ...], list[tuple[int, int, int]]] = defaultdict(list)
    for (session, source, tidx, sqn), ts in first.items():
        events[(session, source, tidx)].append((ts, 1, sqn))
    acked_by_stream: dict[tuple[Any, ...], list[tuple[int, dict[str, int]]]] = defaultdict(list)
    for (session, source, tidx, sqn), by_store in acked.items():
        acked_by_stream[(session, source, tidx)].append((sqn, by_store))
    out = {}
    for stream, items in events.items():
        session, source, tidx = stream
        count = len(registered.get((source, tidx)) or acking.get(stream, set()))
        needed = count // 2 + 1
        for sqn, by_store in acked_by_stream.get(stream, []):
            if len(by_store) >= needed:
                items.append((sorted(by_store.values())[needed - 1], -1, sqn))
        level = peak = 0
        for _, delta, _ in sorted(items):
            level += delta
            peak = max(peak, level)
        sent = sum(1 for e in items if e[1] > 0)
        stabilized = len(items) - sent
        out[stream] = (sent, stabilized, peak, level,
                       count if stabilized else None, needed if stabilized else None)
    return out


def _first_after(candidates: Sequence[tuple[int, Any]], frame: int) -> Iterator[Any]:
    """The items of ``candidates`` (sorted by frame) after ``frame``, in order."""
    start = bisect.bisect_right(candidates, frame, key=lambda c: c[0])
    for _, item in candidates[start:]:
        yield item


def expect_retransmissions(t: Tables, regs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """(kind, ts, requester, sqn, outcome, served ts) per requested sequence number."""
    topics: dict[tuple[str, int], int] = {}
    for row in regs:
        if row["role"] == "receiver" and row["outcome"] == "granted":
            topics.setdefault((row["dst_ip"], row["granted_reg_id"]), row["topic_idx"])
    retrans: dict[tuple[Any, ...], list[tuple[int, Any]]] = defaultdict(list)
    for m in t.messages:
        if m["type"] == "retrans":
            key = (m["src_ip"], m["src_port"], m["dst_ip"], m["dst_port"], m["sqn"])
            retrans[key].append((m["frame"], (m["tidx"], m["ts_ns"])))
    out = []
    for r in t.rxreqs:
        tidx = topics.get((r["dst_ip"], r["reg_id"]))
        conn = (r["dst_ip"], r["dst_port"], r["src_ip"], r["src_port"], r["sqn"])
        served = next((ts for m_tidx, ts in _first_after(retrans.get(conn, []), r["frame"])
                       if tidx is None or m_tidx == tidx), None)
        out.append(("ume-rxreq", r["ts_ns"], r["src_ip"], r["sqn"],
                    "served" if served is not None else "unanswered", served))
    answers: dict[tuple[Any, ...], list[tuple[int, Any]]] = defaultdict(list)
    for p in t.udp:
        source = (p["protocol"], p["src_ip"], p["port"], p["session_id"])
        if p["type"] == "data" and p["rx"]:
            answers[(*source, p["sqn"])].append((p["frame"], ("rx", p["dst_ip"], p["ts_ns"])))
        elif p["type"] == "ncf":
            for sqn in p["ncfs"]:
                answers[(*source, sqn)].append((p["frame"], ("ncf", p["dst_ip"], p["ts_ns"])))
    for nak in (p for p in t.udp if p["type"] == "nak"):
        for sqn in nak["naks"]:
            wanted = (nak["protocol"], nak["dst_ip"], nak["port"], nak["session_id"], sqn)
            mine = [a for a in _first_after(answers.get(wanted, []), nak["frame"])
                    if nak["protocol"] == "lbtrm" or a[1] == nak["src_ip"]]
            rx = next((a[2] for a in mine if a[0] == "rx"), None)
            ncf = any(a[0] == "ncf" for a in mine)
            bounced = any(b["frame"] > nak["frame"] and b["src_ip"] == nak["src_ip"]
                          and b["dst_ip"] == nak["dst_ip"]
                          and b["src_port"] == nak["src_port"] and b["port"] == nak["port"]
                          and b["session_id"] == nak["session_id"] and sqn in b["naks"]
                          for b in t.bounces)
            outcome = ("served" if rx is not None else "ncf" if ncf else
                       "closed-port" if bounced else "unanswered")
            out.append((f"{nak['protocol']}-nak", nak["ts_ns"], nak["src_ip"], sqn, outcome, rx))
    return sorted(out, key=lambda r: (r[0], r[1], r[2], r[3]))


# =============================================================================================
# Comparison
# =============================================================================================


def _none(value: Any) -> Any:
    if value is None or (isinstance(value, float) and np.isnan(value)):
        return None
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def rows(df: Any, columns: Sequence[str]) -> list[tuple[Any, ...]]:
    return [tuple(_none(v) for v in r) for r in df[list(columns)].itertuples(index=False)]


def compare_capture(ours: Any, capture: Path, capture_key: str) -> None:
    """Every analysis of ``ours`` (a run's output) for ``capture`` against tshark's fields."""
    t = records(tshark_frames(capture, PortMap(store_ports=[STORE_PORT])))
    assert t.ambiguous == 0, "frames with several LBMC messages and registration headers"

    def table(name: str) -> Any:
        df = ours(name)
        return df[df["capture"] == capture_key]

    # topic resolution
    ads = table("topic_advertisements")
    got = {(r[0], r[1], r[2], r[3], r[4], r[5]): r[6:] for r in rows(ads, [
        "topic", "transport", "source_ip", "source_port", "session_id", "topic_index", "tirs",
        "senders", "first_ts_ns", "last_ts_ns"])}
    assert got == expect_advertisements(t)
    queries = table("topic_queries")
    assert {r[0]: r[1:] for r in rows(queries, ["topic", "queries", "queriers"])} == \
        expect_queries(t)

    # transport sessions
    expected_sessions = expect_sessions(t)
    sessions = table("transport_sessions")
    udp_columns = ["data_packets", "data_bytes", "rx_packets", "rx_bytes", "sm_packets",
                   "nak_packets", "nak_sqns", "ncf_packets", "ncf_sqns", "creq_packets",
                   "ack_packets", "rst_packets", "messages", "first_ts_ns", "last_ts_ns"]
    for row in sessions.to_dict("records"):
        want = expected_sessions.pop(row["session"])
        columns = udp_columns if row["protocol"] != "lbttcp" else ["messages"]
        assert {c: _none(row[c]) for c in columns} == {c: want.get(c, 0) for c in columns}, \
            row["session"]
    assert not expected_sessions, f"sessions tshark has and we do not: {expected_sessions}"

    # sequence analysis
    seq = table("sequence_summary")
    counts = ["items", "retransmissions", "gaps", "gap_sqns", "out_of_order", "duplicates"]
    keys = ["level", "protocol", "source_ip", "source_port", "session_id", "dest_ip",
            "dest_port"]
    transport = seq[seq["level"].str.startswith("transport")]
    assert {r[:7]: r[7:] for r in rows(transport, keys + counts)} == \
        expect_transport_sequence(t)
    topic = seq[seq["level"] == "topic"]
    assert {r[:8]: r[8:] for r in rows(topic, [*keys, "tidx", *counts])} == \
        expect_topic_sequence(t)

    # registrations
    regs = expect_registrations(t)
    timeline = table("registrations")
    assert rows(timeline, ["ts_ns", "role", "client_ip", "client_port", "store_ip",
                           "requested_reg_id", "src_reg_id", "transport_idx", "topic_idx",
                           "rpp", "deregister", "outcome", "granted_reg_id", "error_code",
                           "old_client", "source_ip", "topic"]) == [
        (r["ts_ns"], r["role"], r["src_ip"], r["src_port"], r["dst_ip"], r["reg_id"],
         r["src_reg_id"], r["transport_idx"], r["topic_idx"], r["rpp"], r["deregister"],
         r["outcome"], r["granted_reg_id"], r["error_code"], r["old_client"], r["source_ip"],
         r["source_topic"]) for r in regs]
    assert list(timeline["session_id"].fillna("")) == [r["session"] or "" for r in regs]

    # stability and consumption latency
    stability, consumption = expect_acks(t, regs)
    ours_stability = rows(table("stability_acks").sort_values("pos"),
                          ["ts_ns", "store_ip", "source_ip", "tidx", "sqn", "send_ts_ns"])
    assert ours_stability == stability
    ours_consumption = rows(table("consumption_acks").sort_values("pos"),
                            ["ts_ns", "store_ip", "source_ip", "tidx", "sqn", "send_ts_ns"])
    assert ours_consumption == consumption
    summary = table("latency_summary")
    for kind, acks in (("stability", stability), ("consumption", consumption)):
        groups: dict[tuple[Any, ...], list[float]] = defaultdict(list)
        totals: Counter[tuple[Any, ...]] = Counter()
        for ts, store, source, tidx, _, sent in acks:
            totals[(source, tidx, store)] += 1
            if sent is not None:
                groups[(source, tidx, store)].append((ts - sent) / 1000)
        part = summary[summary["kind"] == kind]
        assert len(part) == len(totals)
        for r in part.to_dict("records"):
            key = (_none(r["source_ip"]), _none(r["tidx"]), r["store_ip"])
            values = groups.get(key, [])
            assert r["acks"] == totals[key] and r["matched"] == len(values)
            if values:
                p50, p90, p99 = np.percentile(values, [50, 90, 99])
                assert r["p50_us"] == pytest.approx(p50) and r["p90_us"] == pytest.approx(p90)
                assert r["p99_us"] == pytest.approx(p99)
                assert r["max_us"] == max(values) and r["min_us"] == min(values)

    # flight size (stability needs a quorum of the registered stores)
    flight = table("flight_size_summary")
    assert {r[:3]: r[3:] for r in rows(flight, [
        "session", "source_ip", "tidx", "messages", "stabilized", "peak_in_flight",
        "end_in_flight", "stores", "acks_needed"])} == expect_flight(t, regs, stability)

    # retransmission requests
    requests = table("retransmission_requests")
    assert sorted(rows(requests, ["kind", "ts_ns", "requester_ip", "sqn", "outcome",
                                  "served_ts_ns"]),
                  key=lambda r: (r[0], r[1], r[2], r[3])) == expect_retransmissions(t, regs)

    # anomalies tshark's fields show directly
    anomalies = Counter(table("anomalies")["kind"])
    assert anomalies["registration-error"] == sum(r["outcome"] == "error" for r in regs)
    assert anomalies["registration-unanswered"] == sum(r["outcome"] == "unanswered"
                                                       for r in regs)
    seq_events = sum(v[2] + v[4] + v[5] for v in expect_transport_sequence(t).values())
    seq_events += sum(v[2] + v[4] + v[5] for v in expect_topic_sequence(t).values())
    assert anomalies["gap"] + anomalies["out-of-order"] + anomalies["duplicate"] == seq_events
    unsent = sum(1 for row in stability if row[5] is None) + sum(
        1 for row in consumption if row[5] is None and row[2] is not None)
    assert anomalies["ack-for-unsent-sqn"] <= unsent


# =============================================================================================
# Tests
# =============================================================================================


@pytest.fixture(scope="module")
def corpus(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    run = shared_corpus_run(request, tmp_path_factory)
    assert run.exit_code == 0, run.stderr
    return run


def test_sidecar_records_the_preferences_we_use() -> None:
    """The tshark side uses the same port preferences the generator recorded for tshark."""
    for capture in GENERATED:
        sidecar = json.loads(Path(f"{capture}.meta.json").read_text())
        assert sidecar["tshark_args"] == PortMap(store_ports=[STORE_PORT]).tshark_args()


@pytest.mark.parametrize("capture", CAPTURES, ids=[c.stem for c in CAPTURES])
def test_corpus_agrees_with_tshark(corpus: Any, capture: Path) -> None:
    compare_capture(corpus.table, capture, str(capture))


@pytest.mark.slow
def test_million_packet_capture_agrees_with_tshark(spark: Any, tmp_path: Path) -> None:
    """A generated 1,000,000-frame capture of the benchmark scenario, end to end."""
    capture = tmp_path / "big.pcap"
    subprocess.run(["ump", "captures", "generate", "--scenario", "big", "--packets",
                    "1000000", "--out", str(capture), "--no-progress"], check=True,
                   capture_output=True)
    args = analyze_args(tmp_path / "out")
    args.captures = [str(capture)]
    args.per_file = False
    args.quiet = True
    assert args.handler(args) == 0

    compare_capture(lambda name: read_table(tmp_path / "out", name), capture, "all")
