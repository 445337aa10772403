"""The columnar decoder against the object decoders of :mod:`wire`, record by record.

The reference for every frame is :class:`wire.dissect.Dissector` (the ``ump dissect``
decoder, itself checked against tshark): its status for the frame and the
:class:`~wire.lbmc.LbmcMessage` objects it reports, captured by wrapping
``wire.dissect.lbmc_occurrence``.  Transport fields are compared with
:func:`wire.lbtru.parse_packet` / :func:`wire.lbtrm.parse_packet` / :func:`wire.lbmr.parse_packet`
of the same payload.  The captures are the committed reference capture and captures built here
with the :mod:`wire` encoders.
"""

from __future__ import annotations

import contextlib
import os
import random
import time
from collections import defaultdict
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from spark_analysis import arrow_build, columnar, schemas
from spark_analysis.columnar import (
    DecodedTables,
    DecodeOptions,
    decode_batch,
    decode_batches,
    frames_batch,
    reassemble_tcp,
)
from spark_analysis.schemas import ADVERTISEMENT_OPTION_COLUMNS, MESSAGE_HEADER_COLUMNS, ColumnPart
from wire import dissect, ipdefrag, lbmc, lbmr, lbtrm, lbtru, pcap
from wire.dissect import Dissector, FrameReport
from wire.errors import WireError
from wire.fields import bytes_text, text_bytes
from wire.lbmc import LbmcMessage, MessageType
from wire.pcap import CaptureRecord, TcpConversation, tcp_frame, udp_frame
from wire.tshark import PortMap

REFERENCE = Path(__file__).resolve().parents[2] / "captures" / "reference" / "ume-basic.pcap"
STORE_PORTS = PortMap(store_ports=[14567])

# =============================================================================================
# The reference: what the Dissector makes of each frame
# =============================================================================================


@dataclass
class Expected:
    report: FrameReport
    messages: list[tuple[LbmcMessage, bool]]  # (message, carried on a transport channel)


@contextmanager
def _recording() -> Iterator[list[tuple[LbmcMessage, bool]]]:
    seen: list[tuple[LbmcMessage, bool]] = []
    original = dissect.lbmc_occurrence

    def record(message: LbmcMessage, transport_channel: bool = True) -> dissect.Occurrence:
        seen.append((message, transport_channel))
        return original(message, transport_channel)

    with mock.patch.object(dissect, "lbmc_occurrence", record):
        yield seen


def reference(records: Sequence[CaptureRecord], ports: PortMap) -> list[Expected]:
    out = []
    dissector = Dissector(ports)
    with _recording() as seen:
        for record in records:
            seen.clear()
            report = dissector.frame(record)
            out.append(Expected(report, list(seen)))
    return out


def datagram_payloads(records: Sequence[CaptureRecord]) -> list[bytes | None]:
    """Per record, the UDP or TCP payload it shows: its own, or the reassembled datagram's
    in the frame whose IPv4 fragment completes one (None: no payload to show)."""
    fragments: ipdefrag.Defragmenter[int] = ipdefrag.Defragmenter()
    out: list[bytes | None] = []
    for record in records:
        try:
            found = pcap.decode_ip(record.linktype, record.data)
        except WireError:
            out.append(None)
            continue
        if isinstance(found, pcap.Fragment):
            whole = fragments.add(found, record.number)
            out.append(None if whole is None else
                       pcap.udp_segment(found.src, found.dst, whole.payload).payload)
        else:
            out.append(found.payload)
    return out


def offsets_of(records: Sequence[CaptureRecord]) -> list[int]:
    offsets, pos = [], 24
    for record in records:
        offsets.append(pos)
        pos += 16 + len(record.data)
    return offsets


# =============================================================================================
# Expected column values, written from the wire objects
# =============================================================================================


def expected_struct(parts: Sequence[ColumnPart], record: Any) -> dict[str, Any]:
    """A struct column value as the wire record's attributes give it."""
    values = record.resolved()
    out: dict[str, Any] = {}
    for part in parts:
        value = getattr(record, part.name)
        if part.bit is not None and part.bit.when is not None \
                and not part.bit.when(int(values[part.member])):
            value = None
        out[part.name] = value
    return out


def check_message(row: dict[str, Any], message: LbmcMessage, transport: bool) -> None:
    assert row["malformed_reason"] is None
    assert row["type"] == message.type
    assert row["message_type"] == {0: "data", 1: "eot", 2: "proactive_retrans", 8: "control",
                                   10: "retrans"}[message.type]
    assert row["msglen"] == message.resolved_msglen()
    assert row["label"] == message.label(transport)
    if message.is_data_type:
        assert (row["tidx"], row["sqn"]) == (message.tidx, message.sqn)
    else:
        assert (row["tidx"], row["sqn"]) == (None, None)
    assert row["header_codes"] == [h.header_code for h in message.headers]
    expected_payload = len(message.payload) if message.chain_end() == lbmc.NHDR_DATA else 0
    assert row["payload_length"] == expected_payload
    topics = [h.topic.split("\0")[0] for h in message.headers if isinstance(h, lbmc.Topicname)]
    assert row["topic_name"] == (topics[0] if topics else None)
    for column in MESSAGE_HEADER_COLUMNS:
        cls = lbmc.header_class(column.kind.code)
        found = [expected_struct(column.parts, h) for h in message.headers
                 if isinstance(h, cls)] if cls else []
        if column.repeated:
            assert row[column.name] == (found or None), column.name
        else:
            assert row[column.name] == (found[0] if found else None), column.name


def _last(options: Sequence[Any], cls: type, member: str) -> int | None:
    values = [getattr(o, member) for o in options if isinstance(o, cls)]
    return values[-1] if values else None


def check_transport_packet(row: dict[str, Any], payload: bytes) -> None:
    """A LBT-RM/LBT-RU packet row against the object decoder's packet."""
    module = lbtru if row["protocol"] == "lbtru" else lbtrm
    packet = module.parse_packet(payload)
    values = packet.header_values()
    tname = type(packet).type_code.name.lower()
    assert row["packet_type"] == tname
    expected = {
        "sqn": values.get("sqn", values.get("sm_sqn", values.get("ack_sqn"))),
        "trail_sqn": values.get("trail_sqn"),
        "lead_sqn": values.get("lead_sqn"),
        "ucast_port": values.get("ucast_port"),
        "flags": values.get("flags", values.get("flags_fec_type")),
        "num_naks": values.get("num_naks"),
        "nak_sqns": values.get("naks"),
        "num_ncfs": values.get("num_ncfs"),
        "ncf_sqns": values.get("ncfs"),
        "format": packet.format if tname in ("nak", "ncf") else None,
        "ncf_reason": packet.reason if tname == "ncf" else None,
        "creq_request": values.get("request"),
        "rst_reason": values.get("reason") if tname == "rst" else None,
        "retransmission": bool(packet.rx) if tname == "data" else None,
        "syn": bool(packet.syn) if module is lbtru and tname == "sm" else None,
        "messages": len(packet.messages()),
    }
    if module is lbtrm:
        expected["session_id"] = values["session_id"]
        expected["client_id"] = None
    else:
        expected["session_id"] = _last(packet.options, lbtru.SidOption, "session_id")
        expected["client_id"] = _last(packet.options, lbtru.CidOption, "client_id")
    assert {k: row[k] for k in expected} == expected


def check_advertisements(rows: list[dict[str, Any]], payload: bytes) -> None:
    packet = lbmr.parse_packet(payload)
    queries = [r for r in rows if r["record"] in ("tqr", "wc_tqr")]
    infos = [r for r in rows if r["record"] == "tir"]
    assert [r["topic"] for r in queries] == [getattr(q, "name", getattr(q, "pattern", None))
                                             for q in packet.tqrs]
    assert len(infos) == len(packet.tirs)
    for row, tir in zip(infos, packet.tirs, strict=True):
        info = tir.info.values
        assert (row["topic"], row["topic_index"], row["ttl"]) == (tir.name, tir.index, tir.ttl)
        assert row["transport_type"] == tir.info.code
        assert row["session_id"] == info.get("session_id")
        assert row["source_ip"] == info.get("ip", info.get("src_addr"))
        assert row["source_port"] == info.get("port", info.get("src_ucast_port"))
        assert row["mcast_group"] == info.get("mcast_addr")
        for column in ADVERTISEMENT_OPTION_COLUMNS:
            found = [expected_struct(column.parts, o) for o in tir.options or []
                     if isinstance(o, column.cls)]
            if column.repeated:
                assert row[column.name] == (found or None)
            else:
                assert row[column.name] == (found[0] if found else None)


# =============================================================================================
# The comparison
# =============================================================================================


def by_offset(table: pa.Table) -> dict[int, list[dict[str, Any]]]:
    out: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for row in table.to_pylist():
        out[row["file_offset"]].append(row)
    for rows in out.values():
        rows.sort(key=lambda r: r.get("msg_index") or r.get("record_index") or 0)
    return out


def assert_matches_dissector(records: Sequence[CaptureRecord], tables: DecodedTables,
                             ports: PortMap) -> dict[str, int]:
    """Every frame: same status, same packet fields, same messages.  Returns status counts."""
    expected = reference(records, ports)
    payloads = datagram_payloads(records)
    offsets = offsets_of(records)
    packets = by_offset(tables.packets)
    messages = by_offset(tables.messages)
    adverts = by_offset(tables.advertisements)
    assert all(len(rows) == 1 for rows in packets.values()), "one packet row per frame"
    counts: dict[str, int] = defaultdict(int)
    for offset, exp in zip(offsets, expected, strict=True):
        report = exp.report
        counts[report.status] += 1
        rows = packets.get(offset, [])
        row = rows[0] if rows else None
        where = f"frame {report.number} ({report.reason})"
        if report.status == "um":
            assert row is not None, where
            assert row["malformed_reason"] is None, (where, row["malformed_reason"])
            assert row["protocol"] == report.transport, where
            assert (row["src_ip"], row["src_port"], row["dst_ip"], row["dst_port"]) == (
                report.src, report.sport, report.dst, report.dport), where
            mine = messages.get(offset, [])
            assert len(mine) == len(exp.messages), where
            for got, (message, transport) in zip(mine, exp.messages, strict=True):
                check_message(got, message, transport)
            payload = payloads[report.number - 1]
            assert payload is not None, where
            if row["protocol"] in ("lbtru", "lbtrm"):
                check_transport_packet(row, payload)
            elif row["protocol"] == "lbmr":
                check_advertisements(adverts.get(offset, []), payload)
            else:
                assert row["messages"] == len(exp.messages)
        elif report.status == "malformed":
            assert row is not None and row["malformed_reason"], where
        elif report.status == "pending":
            assert row is not None, where
            assert row["messages"] == 0 and row["malformed_reason"] is None, where
        elif report.reason == "TCP retransmission of data already seen":
            assert row is None or (row["retransmission"] and row["messages"] == 0), where
        else:
            assert row is None, (where, row)
    assert set(packets) <= set(offsets)
    skipped = sum(tables.skipped.column("frames").to_pylist())
    assert skipped + tables.packets.num_rows == len(records), "every frame is accounted for"
    assert_always_set(tables)
    return dict(counts)


def assert_always_set(tables: DecodedTables) -> None:
    """The columns :data:`schemas.ALWAYS_SET` names (stored as required Parquet columns) hold
    a value on every row, malformed packets and messages included."""
    core, headers = schemas.split_messages(tables.messages)
    for name, table in {"packets": tables.packets, "messages": core,
                        "advertisements": tables.advertisements, **headers}.items():
        for column in schemas.ALWAYS_SET[name]:
            assert table.column(column).null_count == 0, (name, column)


def decode(records: Sequence[CaptureRecord], options: DecodeOptions,
           batch_size: int | None = None) -> DecodedTables:
    batch = frames_batch(records, "test.pcap", offsets_of(records))
    if batch_size is None:
        return decode_batches([batch], options)
    return decode_batches([batch.slice(i, batch_size)
                           for i in range(0, batch.num_rows, batch_size)], options)


def records_of(frames: Sequence[bytes | tuple[int, bytes]], start: float = 1_700_000_000.0,
               ) -> list[CaptureRecord]:
    """Capture records 1 ms apart (a frame may be ``(linktype, bytes)``)."""
    out = []
    for i, frame in enumerate(frames):
        linktype, data = frame if isinstance(frame, tuple) else (pcap.LINKTYPE_ETHERNET, frame)
        out.append(CaptureRecord(i + 1, start + i / 1000, linktype, data, len(data)))
    return out


# =============================================================================================
# Captures built with the wire encoders
# =============================================================================================

SRC, RCV, RCV2 = "10.0.0.1", "10.0.0.2", "10.0.0.3"
TOPIC = "orders.eu"


def data_message(sqn: int, text: str = "", tidx: int = 7, mtype: int = MessageType.MESSAGE,
                 topic: bool = True) -> LbmcMessage:
    headers: list[lbmc.AnyHeader] = [lbmc.Topicname(topic=TOPIC)] if topic else []
    return LbmcMessage(type=mtype, tidx=tidx, sqn=sqn, headers=headers,
                       payload=(text or f"payload {sqn}").encode())


def control(*headers: lbmc.AnyHeader) -> LbmcMessage:
    return LbmcMessage(type=MessageType.CONTROL, headers=list(headers))


def lbtrm_frames(group: str = "224.10.10.10", dport: int = 14400, ucast: int = 14390,
                 resolver: tuple[str, int] = ("224.9.10.11", 12965)) -> list[bytes]:
    """An LBT-RM session: advertisement, data (several messages per packet), SM, a NAK, its
    NCF and the retransmission."""
    sid = 0xABCD0001
    tir = lbmr.Tir(name=TOPIC, ttl=8, index=7, info=lbmr.LbtrmInfo(
        src_addr=SRC, mcast_addr=group, session_id=sid, udp_dest_port=dport,
        src_ucast_port=ucast), options=[lbmr.ToptUme(store=1, src_reg_id=77,
                                                     store_tcp_port=14567, store_tcp_addr=SRC)])
    frames = [udp_frame(SRC, 50000, resolver[0], resolver[1],
                        lbmr.LbmrPacket(tirs=[tir], tqrs=[lbmr.Tqr(name="other.topic")]).build())]

    def data(sqn: int, msgs: list[LbmcMessage], rx: int = 0) -> bytes:
        packet = lbtrm.LbtrmData(ucast_port=ucast, session_id=sid, sqn=sqn, trail_sqn=0, rx=rx,
                                 ucast_naks=1, payload=msgs)
        return udp_frame(SRC, 40000, group, dport, packet.build())

    frames.append(data(0, [data_message(0)]))
    frames.append(data(1, [data_message(1), data_message(2, topic=False),
                           control(lbmc.UmeKeepalive(type=2, reg_id=77))]))
    frames.append(data(2, [data_message(3, mtype=MessageType.PRORX)]))
    frames.append(udp_frame(SRC, 40000, group, dport, lbtrm.LbtrmSm(
        ucast_port=ucast, session_id=sid, sm_sqn=5, lead_sqn=2, trail_sqn=0,
        ucast_naks=1).build()))
    frames.append(udp_frame(RCV, 40001, SRC, ucast, lbtrm.LbtrmNak(
        ucast_port=ucast, session_id=sid, naks=[1, 2]).build()))
    frames.append(udp_frame(SRC, 40000, group, dport, lbtrm.LbtrmNcf(
        ucast_port=ucast, session_id=sid, trail_sqn=0, reason=lbtrm.NcfReason.RX_DELAY,
        ncfs=[1, 2]).build()))
    frames.append(data(1, [data_message(1), data_message(2, topic=False)], rx=1))
    return frames


def lbtru_frames(src_port: int = 14380, rcv_port: int = 14360) -> list[bytes]:
    sid = lbtru.SidOption(session_id=0x77)
    out = [
        udp_frame(RCV, rcv_port, SRC, src_port, lbtru.LbtruCreq(options=[sid]).build()),
        udp_frame(SRC, src_port, RCV, rcv_port, lbtru.LbtruSm(
            syn=1, sm_sqn=0, lead_sqn=0, trail_sqn=0, options=[sid]).build()),
        udp_frame(SRC, src_port, RCV, rcv_port, lbtru.LbtruData(
            sqn=0, trail_sqn=0, options=[sid, lbtru.CidOption(client_id=9)],
            payload=[control(lbmc.Sri(version=1, low_sqn=0, high_sqn=4, acktosrc=1),
                             lbmc.UmeStoreGroup(grp_idx=0, grp_sz=2),
                             lbmc.UmeStore(grp_idx=0, store_tcp_port=14567, store_ip_addr=SRC,
                                           src_reg_id=5),
                             lbmc.UmeStore(grp_idx=0, store_idx=1, store_tcp_port=14568,
                                           store_ip_addr=RCV2, src_reg_id=6))]).build()),
        udp_frame(SRC, src_port, RCV, rcv_port, lbtru.LbtruData(
            sqn=1, trail_sqn=0, options=[sid],
            payload=[data_message(10), data_message(11), data_message(12)]).build()),
        udp_frame(RCV, rcv_port, SRC, src_port, lbtru.LbtruNak(naks=[1], options=[sid]).build()),
        udp_frame(SRC, src_port, RCV, rcv_port, lbtru.LbtruNcf(
            trail_sqn=0, reason=lbtru.NcfReason.SHED, ncfs=[1], options=[sid]).build()),
        udp_frame(RCV, rcv_port, SRC, src_port, lbtru.LbtruAck(ack_sqn=1, options=[sid]).build()),
        udp_frame(SRC, src_port, RCV, rcv_port, lbtru.LbtruData(
            sqn=1, trail_sqn=0, rx=1, options=[sid], payload=[data_message(10)]).build()),
        udp_frame(RCV, rcv_port, SRC, src_port, lbtru.LbtruRst(options=[]).build()),
    ]
    return out


def lbmr_frames(resolver: tuple[str, int] = ("224.9.10.11", 12965)) -> list[bytes]:
    tirs: list[lbmr.Record] = [
        lbmr.Tir(name=TOPIC, ttl=1, index=3, info=lbmr.TcpSidInfo(
            ip=SRC, session_id=0x42, port=14371), options=[
                lbmr.ToptUme(store=1, latejoin=1, store_tcp_port=14567, store_tcp_addr=RCV2,
                             src_tcp_port=14391, src_tcp_addr=SRC, src_reg_id=1000),
                lbmr.ToptUmeStore(store_tcp_port=14567, store_ip_addr=RCV2, src_reg_id=1000),
                lbmr.ToptUmeStore(store_idx=1, store_tcp_port=14568, store_ip_addr=RCV,
                                  src_reg_id=1001),
                lbmr.ToptUmeStoreGroup(grp_sz=2),
                lbmr.ToptLatejoin(src_tcp_port=14391, src_ip_addr=SRC, low_seqnum=1),
                lbmr.ToptExfunc(src_tcp_port=14391, src_ip_addr=SRC, ume=1)]),
        lbmr.Tir(name="plain.topic", ttl=1, index=4, info=lbmr.LbtruInfo(ip=SRC, port=14380)),
    ]
    return [
        udp_frame(SRC, 50001, resolver[0], resolver[1], lbmr.LbmrPacket(tirs=tirs).build()),
        udp_frame(RCV, 50002, resolver[0], resolver[1], lbmr.LbmrPacket(
            type=lbmr.PacketType.WC_TQR, tqrs=[lbmr.WcTqr(pattern_type=1, pattern="^orders")],
        ).build()),
    ]


@dataclass
class TcpStory:
    """An LBT-TCP store conversation with every framing case: several messages per segment,
    messages split across segments, duplicate and overlapping retransmissions."""

    frames: list[bytes]
    messages: list[LbmcMessage]


def lbttcp_story(client: tuple[str, int] = (RCV, 50010), server: tuple[str, int] = (SRC, 14567),
                 isn: tuple[int, int] = (0xFFFFFF00, 5000)) -> TcpStory:
    conv = TcpConversation(client, server, isn=isn)  # by default the client's wraps past 2^32
    frames = conv.handshake()
    msgs = [
        control(lbmc.UmePreg(s_flag=1, marker=3, reg_id=0, transport_idx=1, topic_idx=7,
                             resp_port=14391, resp_ip=RCV), lbmc.UmeCapability(qc_flag=1),
                lbmc.UmeSid(sid=0xFEDC_BA98_7654_3210), lbmc.UmeClientLifetime(
                    activity_tmo=1, lifetime=2, ttl=3)),
        control(lbmc.UmeAck(type=lbmc.AckType.CDELV, transport_idx=1, id_2=2, rcv_reg_id=2,
                            seqnum=0, u_flag=1)),
        control(lbmc.UmeAck(type=lbmc.AckType.CDELV, transport_idx=1, id_2=2, rcv_reg_id=2,
                            seqnum=1, o_flag=1)),
        control(lbmc.UmeRxreq(request_idx=1, transport_idx=1, id_2=2, seqnum=3, rx_port=14391,
                              rx_ip=RCV, t=1)),
        control(lbmc.UmeKeepalive(type=lbmc.KeepaliveType.RECEIVER, reg_id=2, r_flag=1)),
        control(lbmc.SriReq(transport_idx=1, topic_idx=7), lbmc.TcpSid(sid=0x42)),
        control(lbmc.UmeAck(type=lbmc.AckType.STABLE, seqnum=4)),
    ]
    raw = [m.build() for m in msgs]
    frames.append(conv.send(True, raw[0]))                      # one message
    frames.append(conv.send(True, raw[1] + raw[2] + raw[3][:10]))  # two and a start
    before = conv.next_seq[True]
    frames.append(conv.send(True, raw[3][10:]))                 # the rest
    frames.append(tcp_frame(client[0], client[1], server[0], server[1], before,
                            conv.next_seq[False], pcap.TCP_ACK | pcap.TCP_PSH, raw[3][10:]))
    frames.append(conv.send(True, raw[4][:3]))                  # a header split in two
    overlap_at = conv.next_seq[True]
    frames.append(conv.send(True, raw[4][3:] + raw[5]))
    # a retransmission overlapping what was seen, carrying one new message
    frames.append(tcp_frame(client[0], client[1], server[0], server[1],
                            (overlap_at + 5) & 0xFFFFFFFF, conv.next_seq[False],
                            pcap.TCP_ACK | pcap.TCP_PSH, (raw[4][3:] + raw[5])[5:] + raw[6]))
    conv.next_seq[True] = (conv.next_seq[True] + len(raw[6])) & 0xFFFFFFFF
    reply = control(lbmc.UmePregResp(reg_id=2, s_flag=0, marker=3, transport_idx=1,
                                     topic_idx=7, low_seqnum=1, high_seqnum=9),
                    lbmc.UmeStoreid(store_id=5))
    error = control(lbmc.UmePregResp(e_flag=1, error_code=lbmc.PregError.EREGID, reg_id=2))
    frames.append(conv.send(False, reply.build() + error.build()))
    frames.extend(conv.close())
    return TcpStory(frames, [*msgs, reply, error])


def lbttcp_transport_frames() -> list[bytes]:
    """LBT-TCP transport data (source port range): DATA vs RX-DATA labelling."""
    conv = TcpConversation((RCV, 50020), (SRC, 14371), isn=(10, 20))
    frames = conv.handshake()
    frames.append(conv.send(False, data_message(1).build() + data_message(2).build()))
    frames.append(conv.send(False, LbmcMessage(
        type=MessageType.RETRANS, tidx=7, sqn=1, payload=b"again").build()))
    frames.extend(conv.close())
    return frames


def relink(frame: bytes, linktype: int) -> tuple[int, bytes]:
    """The IPv4 packet of an Ethernet frame under another link header."""
    ip = frame[pcap.ETH.size:]
    if linktype == pcap.LINKTYPE_LINUX_SLL:
        head = pcap.SLL.pack({"packet_type": 0, "arphrd": 772, "addr_len": 6,
                              "addr": bytes(8), "protocol": 0x0800})
    elif linktype == pcap.LINKTYPE_LINUX_SLL2:
        head = pcap.SLL2.pack({"protocol": 0x0800, "reserved": 0, "ifindex": 1, "arphrd": 1,
                               "packet_type": 0, "addr_len": 6, "addr": bytes(8)})
    elif linktype == pcap.LINKTYPE_NULL:
        head = (2).to_bytes(4, "little")
    elif linktype == pcap.LINKTYPE_RAW:
        head = b""
    else:  # Ethernet with two VLAN tags
        eth = frame[:pcap.ETH.size - 2]
        tags = pcap.VLAN.pack({"tci": 5, "ethertype": 0x8100}) + pcap.VLAN.pack(
            {"tci": 6, "ethertype": 0x0800})
        return pcap.LINKTYPE_ETHERNET, eth + b"\x88\xa8" + tags + ip
    return linktype, head + ip


# =============================================================================================
# Tests: equality with the object decoders
# =============================================================================================


def test_reference_capture_matches_dissector() -> None:
    records = list(pcap.read_capture(REFERENCE))
    tables = decode(records, DecodeOptions(STORE_PORTS))
    counts = assert_matches_dissector(records, tables, STORE_PORTS)
    assert counts == {"um": 46, "not-um": 12}
    assert tables.messages.num_rows == sum(len(e.messages)
                                           for e in reference(records, STORE_PORTS))
    assert tables.advertisements.num_rows == 2


def test_reference_capture_through_the_capture_reader() -> None:
    """The real input path (splits' reader: exact offsets and nanosecond times) agrees."""
    from spark_analysis import splits

    ours = decode_batches([columnar.frames_batch_from_capture(REFERENCE)],
                          DecodeOptions(STORE_PORTS))
    theirs = decode_batches(splits.read_table(str(REFERENCE)).to_batches(),
                            DecodeOptions(STORE_PORTS))
    for name in ("packets", "messages", "advertisements"):
        a = getattr(ours, name).sort_by([("file_offset", "ascending")])
        b = getattr(theirs, name).sort_by([("file_offset", "ascending")])
        assert a.drop_columns(["file"]).equals(b.drop_columns(["file"])), name


@pytest.mark.parametrize("chunk_size", [256, 1 << 20])
def test_chunks_decode_in_place_like_batches(chunk_size: int) -> None:
    """decode_chunk reads the records where the reader left them (no packed data column) and
    gives exactly what decode_batch gives for the same records as an Arrow batch."""
    from spark_analysis import splits

    options = DecodeOptions(STORE_PORTS)
    [split] = splits.plan(str(REFERENCE))
    reader = splits.SplitReader(split, chunk_size=chunk_size)
    chunks = list(reader.chunks())
    assert len(chunks) > (1 if chunk_size == 256 else 0)
    in_place = schemas.concat_tables([columnar.decode_chunk(split.capture.name, chunk, options)
                                       for chunk in chunks])
    batches = schemas.concat_tables([
        decode_batch(batch, options)
        for batch in splits.SplitReader(split, chunk_size=chunk_size)])
    for name in ("packets", "messages", "advertisements", "skipped", "tcp_segments"):
        a, b = getattr(in_place, name), getattr(batches, name)
        assert a.num_rows > 0 and a.equals(b), name


def test_pcapng_chunks_decode_in_place_like_batches(tmp_path: Path) -> None:
    """Two sections, two byte orders, SPBs without time: the same skipped counts and rows."""
    from spark_analysis import splits
    from tests.spark_analysis.test_splits import multi_section_pcapng

    path = multi_section_pcapng(random.Random(3), 150).write(tmp_path / "m.pcapng")
    options = DecodeOptions(STORE_PORTS)
    for split in splits.plan(str(path), 4096, "scan"):
        reader = splits.SplitReader(split, chunk_size=1024)
        in_place = schemas.concat_tables([columnar.decode_chunk(split.capture.name, c, options)
                                           for c in reader.chunks()])
        batches = schemas.concat_tables([decode_batch(b, options) for b in
                                          splits.SplitReader(split, chunk_size=1024)])
        for name in ("packets", "skipped", "tcp_segments"):
            keys = [("reason", "ascending")] if name == "skipped" else [("file_offset",
                                                                         "ascending")]
            a, b = getattr(in_place, name), getattr(batches, name)
            assert a.sort_by(keys).equals(b.sort_by(keys)), name
        assert in_place.skipped.num_rows > 0


def test_udp_transports_and_resolver_on_default_ports() -> None:
    records = records_of(lbtrm_frames() + lbtru_frames() + lbmr_frames())
    tables = decode(records, DecodeOptions())
    counts = assert_matches_dissector(records, tables, PortMap())
    assert counts == {"um": len(records)}
    assert set(tables.packets.column("classified_by").to_pylist()) == {"port"}
    naks = [r for r in tables.packets.to_pylist() if r["packet_type"] == "nak"]
    assert [(r["protocol"], r["num_naks"], r["nak_sqns"]) for r in naks] == [
        ("lbtrm", 2, [1, 2]), ("lbtru", 1, [1])]


def test_non_default_ports_decode_by_content() -> None:
    """UM on ports no rule names: the Dissector needs decode-as ports, the content
    heuristics find the same packets without them."""
    frames = (lbtrm_frames(group="225.1.1.1", dport=30000, ucast=31000,
                           resolver=("239.1.1.1", 40000))
              + lbtru_frames(src_port=20000, rcv_port=20001)
              + lbmr_frames(resolver=("239.1.1.1", 40000)))
    records = records_of(frames)
    decode_as = PortMap(lbtru_ports=[20000], lbtrm_ports=[30000, 31000], lbmr_ports=[40000])
    tables = decode(records, DecodeOptions())
    counts = assert_matches_dissector(records, tables, decode_as)
    assert counts == {"um": len(records)}
    assert set(tables.packets.column("classified_by").to_pylist()) == {"content"}
    # without the heuristics (and without decode-as ports) they are skipped, not lost
    off = decode(records, DecodeOptions(content_heuristics=False))
    assert off.packets.num_rows == 0
    assert off.skipped.to_pylist()[0]["frames"] == len(records)


def test_junk_udp_is_not_claimed_by_content() -> None:
    rng = random.Random(4)
    junk = [b"", b"\x00" * 4, b"\x00" * 64, b"\x02\x00\x00\x00", bytes(range(40)),
            b"\x00\x00\x00\x01abc\x00" + bytes(12)]  # a TIR-count header without a real TIR
    junk += [bytes(rng.randrange(256) for _ in range(rng.randrange(1, 120))) for _ in range(300)]
    junk += [b"\x00\x00" + bytes(rng.randrange(256) for _ in range(30)) for _ in range(100)]
    records = records_of([udp_frame("192.168.1.1", 53, "192.168.1.2", 5353 + i % 7, j)
                          for i, j in enumerate(junk)])
    tables = decode(records, DecodeOptions())
    assert tables.packets.num_rows == 0, tables.packets.to_pylist()[:3]
    assert sum(tables.skipped.column("frames").to_pylist()) == len(records)


def test_lbttcp_reassembly_matches_dissector_across_batches() -> None:
    story = lbttcp_story()
    again = lbttcp_story(isn=(77, 99))  # the same ports again: a new connection after FIN
    frames = story.frames + lbttcp_transport_frames() + lbtru_frames() + again.frames
    records = records_of(frames)
    whole = decode(records, DecodeOptions(STORE_PORTS))
    counts = assert_matches_dissector(records, whole, STORE_PORTS)
    assert counts["um"] >= 8
    tcp = [r for r in whole.messages.to_pylist() if r["protocol"] == "lbttcp"]
    assert len(tcp) == 2 * len(story.messages) + 3
    retx = [r for r in whole.packets.to_pylist() if r["retransmission"] and
            r["protocol"] == "lbttcp"]
    assert len(retx) == 2  # the whole duplicates; the overlapping ones carry a new message
    for size in (1, 2, 5):
        split = decode(records, DecodeOptions(STORE_PORTS), batch_size=size)
        for name in ("packets", "messages", "skipped"):
            keys = [("file_offset", "ascending")] + (
                [("msg_index", "ascending")] if name == "messages" else
                [("reason", "ascending")] if name == "skipped" else [])
            a = getattr(whole, name)
            b = getattr(split, name)
            if name == "skipped":
                keys = [("reason", "ascending")]
            assert a.sort_by(keys).equals(b.sort_by(keys)), (name, size)


def test_malformed_packets_match_dissector() -> None:
    good = data_message(1).build()
    bad_code = bytearray(good)
    bad_code[1] = 0x03  # a code tshark flags as unhandled
    frames = [
        udp_frame(SRC, 14380, RCV, 14360, lbtru.LbtruData(sqn=1, payload=good + bytes(
            bad_code)).build()),
        udp_frame(SRC, 14380, RCV, 14360, lbtru.LbtruData(sqn=2, payload=good[:-4]).build()),
        udp_frame(SRC, 14380, RCV, 14360, b"\x09\x00\x00\x00"),        # unknown type
        udp_frame(SRC, 14380, RCV, 14360, lbtru.LbtruNak(num_naks=5, naks=[1]).build()),
        udp_frame(SRC, 14380, RCV, 14360, lbtru.LbtruSm(options=[lbtru.SidOption(
            hdr_len=0)]).build()),
        udp_frame(SRC, 14380, RCV, 14360, lbtru.LbtruAck(options=[lbtru.SidOption(
            hdr_len=6)]).build()),
        udp_frame(SRC, 14380, RCV, 14360, b"\x00\x00"),
        udp_frame(SRC, 40000, "224.10.10.10", 14400, lbtrm.LbtrmData(
            payload=[control(lbmc.UmeAck(hdr_len=12))]).build()),
        udp_frame(SRC, 40000, "224.9.10.11", 12965, b"\x00\x01\x00\x00no-nul"),
        udp_frame(SRC, 40000, "224.10.10.10", 14400, lbtrm.LbtrmNcf(
            num_ncfs=3, ncfs=[1]).build()),
    ]
    conv = TcpConversation((RCV, 50030), (SRC, 14567))
    frames += conv.handshake()
    frames.append(conv.send(True, control(lbmc.UmeAck()).build()))
    frames.append(conv.send(True, good[:2] + b"\x00\x02" + good[4:]))  # msglen 2: no resync
    frames.append(conv.send(True, control(lbmc.UmeAck()).build()))
    records = records_of(frames)
    tables = decode(records, DecodeOptions(STORE_PORTS))
    counts = assert_matches_dissector(records, tables, STORE_PORTS)
    assert counts["malformed"] == 11
    # the first (good) message of the first datagram is kept, the bad one is reported
    first = [r for r in tables.messages.to_pylist() if r["file_offset"] == 24]
    assert [r["malformed_reason"] is None for r in first] == [True, False]
    assert "unknown header code 0x03" in first[1]["malformed_reason"]


def test_long_chains_match_dissector() -> None:
    """Datagrams deep enough for the walks to finish row by row (and errors down there)."""
    tiny = control().build()
    batch_headers = control(*[lbmc.Batch() for _ in range(80)]).build()
    broken_chain = bytearray(batch_headers)
    broken_chain[lbmc.CONTROL_BASE.size + 4 * 60 + 1] = 0  # hdr_len 0 of header 60

    def ru(payload: bytes) -> bytes:
        return udp_frame(SRC, 14380, RCV, 14360, lbtru.LbtruData(sqn=1, payload=payload).build())
    frames = [ru(tiny * 100 + data_message(1).build()), ru(batch_headers),
              ru(bytes(broken_chain)), ru(tiny * 50 + b"\x08\xff\x00\x00"),
              ru(data_message(1).build() * 40)]
    records = records_of(frames)
    tables = decode(records, DecodeOptions())
    counts = assert_matches_dissector(records, tables, PortMap())
    assert counts == {"um": 3, "malformed": 2}
    # the bad messages are listed too (with their reason), the ones after them are not
    assert tables.messages.num_rows == 101 + 1 + 1 + (50 + 1) + 40


def test_batches_of_any_shape() -> None:
    """Empty, sliced, large_binary, null data: no crash and nothing lost."""
    records = records_of(lbtru_frames())
    batch = frames_batch(records, "t.pcap", offsets_of(records))
    assert decode_batches([batch.slice(0, 0)]).packets.num_rows == 0
    whole = decode_batches([batch]).packets
    sliced = decode_batches([batch.slice(3), batch.slice(0, 3)]).packets
    assert sliced.sort_by("file_offset").equals(whole.sort_by("file_offset"))
    large = batch.set_column(7, "data", batch.column("data").cast(pa.large_binary()))
    large = large.set_column(0, "file", large.column("file").cast(pa.large_string()))
    assert decode_batches([large]).packets.equals(whole)
    holes = batch.set_column(7, "data", pa.array(
        [None if i % 3 == 0 else d for i, d in enumerate(batch.column("data").to_pylist())],
        pa.binary()))
    tables = decode_batches([holes])
    assert tables.packets.num_rows + sum(tables.skipped.column("frames").to_pylist()) \
        == len(records)


@pytest.mark.parametrize("linktype", [pcap.LINKTYPE_LINUX_SLL, pcap.LINKTYPE_LINUX_SLL2,
                                      pcap.LINKTYPE_NULL, pcap.LINKTYPE_RAW, -1])
def test_link_types_match_dissector(linktype: int) -> None:
    frames = [relink(f, linktype) for f in lbtru_frames() + lbmr_frames()]
    records = records_of(frames)
    tables = decode(records, DecodeOptions())
    assert assert_matches_dissector(records, tables, PortMap()) == {"um": len(records)}


def test_skipped_frames_are_counted_by_reason() -> None:
    udp = udp_frame(SRC, 14380, RCV, 14360, lbtru.LbtruAck(ack_sqn=1).build())
    frag = bytearray(udp)
    frag[pcap.ETH.size + 6] = 0x00
    frag[pcap.ETH.size + 7] = 0x10  # fragment offset 16: a later fragment
    first = bytearray(udp)
    first[pcap.ETH.size + 6] = 0x20  # more fragments, offset 0
    records = records_of([
        udp, bytes(frag), bytes(first),
        udp[:pcap.ETH.size - 2] + b"\x86\xdd" + udp[pcap.ETH.size:],  # IPv6 ethertype
        udp[:pcap.ETH.size + 10],                                     # truncated IPv4
        (pcap.LINKTYPE_ETHERNET, b"\x00" * 5),
        (147, udp),                                                   # unknown link type
        udp_frame(SRC, 1234, RCV, 5678, b"hello"),
        tcp_frame(SRC, 1234, RCV, 5678, 1, 1, pcap.TCP_ACK, b"x"),
    ])
    tables = decode(records, DecodeOptions())
    reasons = {r["reason"]: r["frames"] for r in tables.skipped.to_pylist()}
    assert reasons == {
        ipdefrag.INCOMPLETE: 2,  # offsets 0 and 128 of one datagram: a hole between
        "not IPv4 (ethertype 0x86dd)": 1,
        "truncated IPv4 header": 1,
        "unsupported or truncated link layer (link type 1)": 1,
        "unsupported or truncated link layer (link type 147)": 1,
        "UDP matches no UM port rule and decodes as no UM protocol": 1,
        "TCP matches no LBT-TCP port range": 1,
    }
    rows = tables.packets.to_pylist()
    assert [r["malformed_reason"] for r in rows] == [None]
    assert rows[0]["file_offset"] == offsets_of(records)[0]


def test_tcp_reordering_gaps_and_sequence_wrap() -> None:
    """Beyond the Dissector: segments out of order reassemble; a real hole resets the stream
    and decoding resumes at the next segment that starts a message."""
    conv = TcpConversation((RCV, 50040), (SRC, 14567), isn=(0xFFFFFFF0, 1))
    frames = conv.handshake()
    raw = [control(lbmc.UmeAck(seqnum=i)).build() for i in range(6)]
    seqs = []
    for i in range(4):
        seqs.append(conv.next_seq[True])
        frames.append(conv.send(True, raw[i]))
    frames[4], frames[5] = frames[5], frames[4]  # messages 1 and 2 arrive swapped
    conv.next_seq[True] = (conv.next_seq[True] + len(raw[4])) & 0xFFFFFFFF  # 4 is lost
    frames.append(conv.send(True, raw[5][:7]))
    frames.append(conv.send(True, raw[5][7:] + raw[0]))
    records = records_of(frames)
    tables = decode(records, DecodeOptions(STORE_PORTS))
    got = [(r["file_offset"], r["ume_ack"]["seqnum"] if r["ume_ack"] else None)
           for r in tables.messages.to_pylist()]
    offsets = offsets_of(records)
    # message 1 becomes deliverable only when its (later captured) frame arrives, and 2 with
    # it; after the hole left by message 4 the stream resumes with the segment starting 5
    assert got == [(offsets[3], 0), (offsets[5], 1), (offsets[5], 2), (offsets[6], 3),
                   (offsets[8], 5), (offsets[8], 0)]
    gap = [r for r in tables.packets.to_pylist() if r["malformed_reason"]]
    assert [r["file_offset"] for r in gap] == [offsets[7]]
    assert "bytes missing" in gap[0]["malformed_reason"]
    skipped = {r["reason"]: r["frames"] for r in tables.skipped.to_pylist()}
    assert skipped["TCP segment without payload"] == 3
    assert sum(v for k, v in skipped.items() if k.startswith("LBT-TCP entry test")) == 0
    assert tables.packets.num_rows + sum(skipped.values()) == len(records)


def test_stage_two_is_order_and_grouping_independent() -> None:
    story = lbttcp_story()
    records = records_of(story.frames + lbttcp_story(client=(RCV2, 50011)).frames)
    first = decode_batch(frames_batch(records, "t.pcap", offsets_of(records)),
                         DecodeOptions(STORE_PORTS))
    segments = first.tcp_segments
    whole = reassemble_tcp(segments, DecodeOptions(STORE_PORTS))
    shuffled = segments.take(pa.array(random.Random(1).sample(range(segments.num_rows),
                                                               segments.num_rows)))
    by_flow = [reassemble_tcp(shuffled.filter(pa.compute.equal(shuffled["src_port"], port)),
                              DecodeOptions(STORE_PORTS))
               for port in set(segments.column("src_port").to_pylist())]
    merged = schemas.concat_tables(by_flow)
    keys = [("file_offset", "ascending"), ("msg_index", "ascending")]
    assert whole.messages.sort_by(keys).equals(merged.messages.sort_by(keys))
    assert whole.packets.sort_by(keys[:1]).equals(merged.packets.sort_by(keys[:1]))


@pytest.mark.parametrize("lengths", ["any", "long", "inline", "mostly_empty"])
def test_gather_ranges_equals_slicing(lengths: str) -> None:
    """The range gather (Arrow binary views for payloads, inline views up to 12 bytes, empty
    values) concatenates exactly the slices, with int32 offsets."""
    import numpy as np

    rng = np.random.default_rng(len(lengths))
    for _ in range(200):
        size = int(rng.integers(41, 300))
        data = rng.integers(0, 255, size, dtype=np.uint8)
        n = int(rng.integers(1, 40))
        if lengths == "mostly_empty":
            length = np.where(rng.random(n) < 0.9, 0, rng.integers(0, 31, n))
        else:
            lo, hi = {"any": (0, 40), "long": (13, 40), "inline": (0, 12)}[lengths]
            length = rng.integers(lo, hi + 1, n)
        start = np.array([rng.integers(0, size - k + 1) for k in length.tolist()])
        values, offsets = arrow_build.gather_ranges(data, start, length)
        assert values.tobytes() == b"".join(
            data[a:a + k].tobytes() for a, k in zip(start.tolist(), length.tolist(), strict=True))
        assert offsets.dtype == np.int32
        assert offsets.tolist() == [0, *np.cumsum(length).tolist()]


def test_separate_files_keep_a_reused_four_tuple_apart() -> None:
    """Two captures of the same conversation (same 4-tuple, same ISNs): as pieces of one
    capture the second file's segments are TCP retransmissions of the first's; as separate
    captures (``separate_files``) each file reassembles its own messages."""
    story = lbttcp_story()
    records = records_of(story.frames)
    segments = pa.concat_tables([
        decode_batch(frames_batch(records, name, offsets_of(records)),
                     DecodeOptions(STORE_PORTS)).tcp_segments
        for name in ("a.pcap", "b.pcap")])
    joined = reassemble_tcp(segments, DecodeOptions(STORE_PORTS))
    separate = reassemble_tcp(segments, DecodeOptions(STORE_PORTS, separate_files=True))
    alone = reassemble_tcp(segments.filter(pa.compute.equal(segments["file"], "a.pcap")),
                           DecodeOptions(STORE_PORTS))
    assert alone.messages.num_rows == len(story.messages)
    assert joined.messages.num_rows == len(story.messages)  # b.pcap: all duplicates
    per_file = defaultdict(list)
    for row in separate.messages.to_pylist():
        per_file[row.pop("file")].append(row)
    want = [{k: v for k, v in r.items() if k != "file"} for r in alone.messages.to_pylist()]
    assert per_file == {"a.pcap": want, "b.pcap": want}
    assert schemas.flow_key_columns(DecodeOptions(separate_files=True))[0] == "file"


def test_the_stored_form_gives_the_same_rows() -> None:
    """``stored=True`` (how decode_to_parquet writes the tables) changes the form only:
    categorical columns are dictionary arrays and ``messages`` comes as its core columns plus
    one table per typed header, exactly what split_messages makes of the public table; made
    public again, both stages equal the default output.  Unnamed codes (a packet type without
    a name) stay null; the skipped counts come sorted by file and reason."""
    options = DecodeOptions(STORE_PORTS)
    batch = columnar.frames_batch_from_capture(REFERENCE)
    public = decode_batch(batch, options)
    stored = decode_batch(batch, options, stored=True)
    second = reassemble_tcp(public.tcp_segments, options)
    second_stored = reassemble_tcp(public.tcp_segments, options, stored=True)
    for a, b in ((public, stored), (second, second_stored)):
        assert b.stored and not a.stored and not a.headers
        assert b.tcp_segments.schema.field("file").type == schemas.DICTIONARY_STRING
        for name in ("packets", "messages", "advertisements"):
            got: pa.Table = getattr(b, name)
            for column in schemas.CATEGORICAL_COLUMNS & set(got.column_names):
                assert got.schema.field(column).type == schemas.DICTIONARY_STRING, column
        core, headers = schemas.split_messages(a.messages)
        assert b.messages.schema == schemas.dictionary_schema(core.schema)
        assert b.messages.cast(core.schema).equals(core)
        assert sorted(b.headers) == sorted(headers) and headers
        for name, table in headers.items():
            assert b.headers[name].schema == schemas.dictionary_schema(table.schema), name
            assert b.headers[name].cast(table.schema).equals(table), name
        public_again = b.public()
        for name in ("packets", "messages", "advertisements", "skipped", "tcp_segments"):
            assert getattr(public_again, name).equals(getattr(a, name)), name
    assert public.packets.num_rows and second.messages.num_rows
    assert "lbmc_ume_ack" in second_stored.headers
    both = schemas.concat_tables([stored, second_stored])
    assert both.headers["lbmc_ume_ack"].num_rows == (
        stored.headers.get("lbmc_ume_ack", pa.table({})).num_rows
        + second_stored.headers["lbmc_ume_ack"].num_rows)
    empty = reassemble_tcp(public.tcp_segments.slice(0, 0), options, stored=True)
    assert empty.stored and empty.packets.schema == schemas.dictionary_schema(
        schemas.PACKETS_SCHEMA)
    names = arrow_build.dictionary_strings(np.array([0, 1, 2, 1]), ["a", None, "c"],
                                           np.array([True, True, True, False]))
    assert names.to_pylist() == ["a", None, "c", None]
    records = records_of([udp_frame(SRC, 1234, RCV, 5678, b"hello"),
                          tcp_frame(SRC, 1234, RCV, 5678, 1, 1, pcap.TCP_ACK, b"x"),
                          udp_frame(SRC, 1234, RCV, 5678, b"again")])
    skipped = decode(records, DecodeOptions()).skipped
    offsets = offsets_of(records)
    assert [(r["reason"], r["frames"], r["first_file_offset"]) for r in skipped.to_pylist()] == [
        ("TCP matches no LBT-TCP port range", 1, offsets[1]),
        ("UDP matches no UM port rule and decodes as no UM protocol", 2, offsets[0]),
    ]


def test_encode_files_unifies_the_dictionaries_of_hand_over_streams() -> None:
    """Each stage-1 hand-over stream carries its own file dictionary; stage 2 reads several
    at once and must see each name once (else one file would look like two)."""
    first = pa.DictionaryArray.from_arrays(pa.array([0, 0], pa.int32()), pa.array(["a.pcap"]))
    second = pa.DictionaryArray.from_arrays(pa.array([0, 1], pa.int32()),
                                            pa.array(["b.pcap", "a.pcap"]))
    for column in (pa.chunked_array([first, second]),
                   pa.chunked_array([first.cast(pa.string()), second.cast(pa.string())])):
        encoded = arrow_build.encode_files(column)
        assert sorted(encoded.dictionary.to_pylist()) == ["a.pcap", "b.pcap"]
        assert encoded.to_pylist() == ["a.pcap", "a.pcap", "b.pcap", "a.pcap"]


def test_schemas_document_every_column() -> None:
    for schema in (schemas.PACKETS_SCHEMA, schemas.MESSAGES_SCHEMA,
                   schemas.ADVERTISEMENTS_SCHEMA, schemas.SKIPPED_SCHEMA,
                   schemas.TCP_SEGMENTS_SCHEMA):
        for fld in schema:
            assert fld.metadata and fld.metadata.get(b"doc"), fld.name
    # header fields carry tshark's names, read off the wire definitions
    preg = schemas.MESSAGES_SCHEMA.field("ume_preg").type
    names = {preg.field(i).name: preg.field(i).metadata[b"tshark"].decode()
             for i in range(preg.num_fields) if preg.field(i).metadata}
    assert names["reg_id"] == "lbmc.ume_preg.reg_id"
    assert names["s_flag"] == "lbmc.ume_preg.s_flag"
    assert names["f_flag"] == "lbmc.ume_preg.flags.f_flag"


# =============================================================================================
# Throughput (slow): frames/s of the columnar decode on a 1M-frame UM capture
# =============================================================================================


def synthetic_frames(count: int, seed: int = 0) -> list[bytes]:
    """LBT-RM and LBT-RU traffic (data packets with 1-3 messages, SM, NAK, NCF ...) and an
    LBT-TCP stream of acknowledgements (1-3 per segment), about 60/25/15 %, from the frames of
    the test captures above.  TCP sequence numbers advance (checksums are not recomputed: the
    decoder does not check them)."""
    rng = random.Random(seed)
    rm_templates = lbtrm_frames()[1:]  # without the resolver packet
    ru_templates = lbtru_frames()
    ack = control(lbmc.UmeAck(type=lbmc.AckType.STABLE, transport_idx=1, seqnum=0)).build()
    conv = TcpConversation((RCV, 50060), (SRC, 14567))
    out: list[bytes] = [*lbttcp_story(client=(RCV, 50050)).frames, *conv.handshake()]
    seq = conv.next_seq[True]
    tcp_templates = [tcp_frame(RCV, 50060, SRC, 14567, seq, conv.next_seq[False],
                               pcap.TCP_ACK | pcap.TCP_PSH, ack * n) for n in (1, 2, 3)]
    seq_at = pcap.ETH.size + pcap.IP4.size + arrow_build.member_at(pcap.TCP, "seq")[1]
    while len(out) < count:
        pick = rng.random()
        if pick < 0.6:
            out.append(rng.choice(rm_templates))
        elif pick < 0.85:
            out.append(rng.choice(ru_templates))
        else:
            n = rng.randint(1, 3)
            frame = bytearray(tcp_templates[n - 1])
            frame[seq_at:seq_at + 4] = seq.to_bytes(4, "big")
            seq = (seq + n * len(ack)) & 0xFFFFFFFF
            out.append(bytes(frame))
    return out[:count]


@pytest.mark.slow
def test_throughput_of_the_columnar_decode() -> None:
    count = int(os.environ.get("UMP_BENCH_FRAMES", "1000000"))
    frames = synthetic_frames(count)
    batch_rows = 100_000
    batches = []
    for i in range(0, count, batch_rows):
        chunk = frames[i:i + batch_rows]
        batches.append(pa.RecordBatch.from_arrays([
            pa.array(["bench.pcap"] * len(chunk)), pa.array(range(i, i + len(chunk)), pa.int64()),
            pa.array(range(i, i + len(chunk)), pa.int64()),
            pa.array([len(f) for f in chunk], pa.int32()),
            pa.array([len(f) for f in chunk], pa.int32()),
            pa.array([1] * len(chunk), pa.int32()), pa.array([0] * len(chunk), pa.int32()),
            pa.array(chunk, pa.binary())], schema=schemas.FRAME_SCHEMA))
    options = DecodeOptions(STORE_PORTS)
    # CPU time, best of three: the figures should not depend on what else the machine runs
    stage1_cpu = stage2_cpu = float("inf")
    for _ in range(3):
        started = time.process_time()
        stage1 = [decode_batch(b, options) for b in batches]
        stage1_cpu = min(stage1_cpu, time.process_time() - started)
        first = schemas.concat_tables(stage1)  # (gathering segments is Spark's shuffle)
        started = time.process_time()
        second = reassemble_tcp(first.tcp_segments, options)
        stage2_cpu = min(stage2_cpu, time.process_time() - started)
    packets = first.packets.num_rows + second.packets.num_rows
    messages = first.messages.num_rows + second.messages.num_rows
    segments = first.tcp_segments.num_rows
    print(f"\n{count} frames in batches of {batch_rows} ({segments} LBT-TCP segments), CPU: "
          f"stage 1 {count / stage1_cpu:,.0f} frames/s, "
          f"stage 2 {segments / stage2_cpu:,.0f} segments/s, "
          f"both {count / (stage1_cpu + stage2_cpu):,.0f} frames/s; "
          f"{packets} packets, {messages} messages")
    assert packets == count - sum(first.skipped.column("frames").to_pylist()) \
        - sum(second.skipped.column("frames").to_pylist())


# --- Arrow arrays built without pyarrow's pandas import --------------------------------------

_NUMERIC = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
            "float32", "float64"]


@given(hnp.arrays(st.sampled_from(_NUMERIC), st.integers(0, 40),
                  elements={"allow_nan": False}),
       st.integers(0, 3), st.booleans(), st.data())
def test_arrow_array_equals_pa_array(values: Any, step: int, masked: bool, data: Any) -> None:
    values = values[::step + 1]  # strided views too
    mask = data.draw(hnp.arrays(bool, len(values))) if masked else None
    expected = pa.array(values, mask=mask)
    got = arrow_build.arrow_array(values, mask=mask)
    assert got.type == expected.type
    assert got.to_pylist() == expected.to_pylist()
    assert got.null_count == expected.null_count
    if expected.null_count == 0:
        assert np.array_equal(arrow_build.numpy_of(got), values)


def test_arrow_array_casts_to_the_type_asked_for() -> None:
    values = np.array([1, 0, 7], np.int64)
    for kind in (pa.int32(), pa.uint16(), pa.float32(), pa.float64(), pa.bool_()):
        expected = pa.array(values.astype(bool) if kind == pa.bool_() else values, kind)
        assert arrow_build.arrow_array(values, kind).equals(expected)
    assert arrow_build.arrow_array([3, 4], pa.int64()).equals(pa.array([3, 4], pa.int64()))
    assert arrow_build.arrow_array([], pa.int32()).equals(pa.array([], pa.int32()))
    text = ["a", None, "é", ""]
    assert arrow_build.arrow_array(text, pa.string()).equals(pa.array(text, pa.string()))
    # numpy_of of a sliced boolean array reads its bits from the right offset
    bools = pa.array([True, False, True, True, False])[1:]
    assert arrow_build.numpy_of(bools).tolist() == [False, True, True, False]
    assert arrow_build.numpy_of(pa.chunked_array([[1, 2], [3]])).tolist() == [1, 2, 3]


def test_python_table_equals_from_pylist() -> None:
    schema = schemas.ADVERTISEMENTS_SCHEMA
    nested = [f for f in schema if pa.types.is_struct(f.type) or pa.types.is_list(f.type)]
    assert nested  # the option columns: structs and lists of structs
    struct_field = next(f for f in nested if pa.types.is_struct(f.type))
    list_field = next(f for f in nested if pa.types.is_list(f.type))
    first = {f.name: 0 for f in struct_field.type}
    first.update({f.name: "10.0.0.1" for f in struct_field.type if pa.types.is_string(f.type)})
    first.update({f.name: True for f in struct_field.type if pa.types.is_boolean(f.type)})
    item = {f.name: (True if pa.types.is_boolean(f.type) else
                     "h" if pa.types.is_string(f.type) else 5) for f in list_field.type.value_type}
    rows: list[dict[str, Any]] = [
        {"record": "tir", "topic": "a", "record_index": 0, "session_id": 2 ** 40,
         struct_field.name: first, list_field.name: [item, {**item, "grp_idx": None}]},
        {"record": "tqr", "topic": None, "record_index": 1, list_field.name: []},
        {"record": "tir", "topic": "ü", "source_port": 14371, struct_field.name: None},
    ]
    got = arrow_build.python_table(rows, schema)
    assert got.equals(pa.Table.from_pylist(rows, schema=schema))
    assert arrow_build.empty_table(schema).equals(schema.empty_table())


@given(names=st.lists(st.text(max_size=12) | st.binary(max_size=12), max_size=6))
def test_topic_names_are_read_as_the_wire_reads_them(names: list[str | bytes]) -> None:
    """Topic names are UTF-8 in Spark as in ``wire`` (``ump dissect``, the cores): a name
    ``wire`` reads as text is the same string here, cut at a NUL as tshark shows it; bytes
    that are not UTF-8 become U+FFFD, since an Arrow string cannot hold ``wire``'s escapes."""
    raws = [text_bytes(n) for n in names]
    data = np.frombuffer(b"".join(raws), dtype=np.uint8)
    lengths = np.array([len(r) for r in raws], dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    got = arrow_build.text_array(data, starts, lengths).to_pylist()
    expected = [r.split(b"\0")[0].decode("utf-8", "replace") for r in raws]
    assert got == expected
    for raw, value in zip(raws, got, strict=True):
        head = raw.split(b"\0")[0]
        with contextlib.suppress(UnicodeDecodeError):
            assert value == bytes_text(head) == head.decode("utf-8")
