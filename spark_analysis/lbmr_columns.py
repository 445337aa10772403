"""LBMR (topic resolution) packets and advertisements, packet by packet.

Resolver traffic is light (a few packets a second per topic), so each datagram goes through
:func:`wire.lbmr.parse_packet` (memoised: advertisements repeat unchanged); its TIRs and
queries become ``advertisements`` rows.  A content-claimed datagram must also pass
:func:`wire.detect.lbmr_clean`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from wire import lbmr
from wire.detect import lbmr_clean
from wire.errors import WireError

from .arrow_build import (
    arrow_array,
    constant_strings,
    empty_table,
    python_table,
    table_of,
)
from .framing import (
    Frames,
    Network,
    identity_columns,
)
from .schemas import (
    ADVERTISEMENT_OPTION_COLUMNS,
    ADVERTISEMENTS_SCHEMA,
    ADVERTISEMENTS_STORED,
    PACKETS_STORED,
    struct_pyvalue,
)

# =============================================================================================
# LBMR (packet by packet: resolver traffic is light)
# =============================================================================================

_LBMR_TYPE_NAMES = {int(t): t.name.lower() for t in lbmr.PacketType}


def _transport_name(code: int) -> str:
    return lbmr.TRANSPORT_NAMES.get(code, f"0x{code:02x}")


def _advertisement_rows(packet: lbmr.LbmrPacket) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    if packet.type not in (lbmr.PacketType.NORMAL, lbmr.PacketType.WC_TQR):
        return rows
    for i, query in enumerate(packet.tqrs):
        if isinstance(query, lbmr.WcTqr):
            rows.append({"record": "wc_tqr", "record_index": i, "topic": query.pattern,
                         "pattern_type": query.pattern_type})
        else:
            rows.append({"record": "tqr", "record_index": i, "topic": query.name})
    for i, tir in enumerate(packet.tirs):
        if not isinstance(tir, lbmr.Tir):
            continue
        info = tir.info
        values = info.values
        code = int(info.code or 0)
        row: dict[str, Any] = {
            "record": "tir", "record_index": i, "topic": tir.name, "transport": _transport_name(
                code), "transport_type": code, "topic_index": tir.index, "ttl": tir.ttl,
            "session_id": values.get("session_id"),
            "source_ip": values.get("ip", values.get("src_addr")),
            "source_port": values.get("port", values.get("src_ucast_port")),
            "mcast_group": values.get("mcast_addr"), "mcast_port": values.get("udp_dest_port"),
        }
        for column in ADVERTISEMENT_OPTION_COLUMNS:
            found = [o for o in tir.options or [] if isinstance(o, column.cls)]
            got = [struct_pyvalue(column.parts, o.resolved()) for o in found]
            row[column.name] = (got or None) if column.repeated else (got[0] if got else None)
        rows.append(row)
    return rows


_LbmrRow = tuple[int, str | None, str | None, list[dict[str, Any]]]
"""A decoded LBMR datagram: frame row, packet type, malformed reason, advertisement rows."""


_LbmrParsed = tuple[bool, str | None, str | None, list[dict[str, Any]]]
"""What an LBMR payload decodes to: accepted, packet type, error, advertisement rows."""

_LBMR_CACHE: dict[tuple[bytes, bool], _LbmrParsed] = {}
_LBMR_CACHE_MAX = 4096


def _parse_lbmr(payload: bytes, strict: bool) -> _LbmrParsed:
    """One LBMR payload, memoised: topic resolution repeats the same advertisements every
    few seconds (nothing in an LBMR packet changes between repeats), and the object decoder
    costs milliseconds per packet of TIRs with options."""
    key = (payload, strict)
    found = _LBMR_CACHE.get(key)
    if found is not None:
        return found
    try:
        packet = lbmr.parse_packet(payload)
    except WireError as exc:
        if strict:
            result: _LbmrParsed = (False, None, None, [])
        else:
            ptype = _LBMR_TYPE_NAMES.get(payload[0] & lbmr.VER_TYPE_BITS["type"].mask) \
                if payload else None
            result = (True, ptype, str(exc), [])
    else:
        if strict and not lbmr_clean(packet):
            result = (False, None, None, [])
        else:
            result = (True, _LBMR_TYPE_NAMES.get(int(packet.type), f"type {packet.type}"),
                      None, _advertisement_rows(packet))
    if len(_LBMR_CACHE) >= _LBMR_CACHE_MAX:
        _LBMR_CACHE.clear()
    _LBMR_CACHE[key] = result
    return result


def decode_lbmr(fr: Frames, net: Network, frame_rows: np.ndarray, strict: bool,
                ) -> tuple[np.ndarray, list[_LbmrRow]]:
    """Parse each datagram; returns (accepted mask, per accepted row: frame row, packet type,
    malformed reason, advertisement rows).  ``strict``: content-claimed, refuse on error."""
    accepted = np.zeros(len(frame_rows), bool)
    out: list[_LbmrRow] = []
    data = fr.data.bv.data
    for i, row in enumerate(frame_rows.tolist()):
        payload = data[net.pstart[row]:net.pend[row]].tobytes()
        ok, ptype, error, adverts = _parse_lbmr(payload, strict)
        if not ok:
            continue
        accepted[i] = True
        out.append((row, ptype, error, adverts))
    return accepted, out


def lbmr_tables(fr: Frames, net: Network, decoded: list[_LbmrRow], classified_by: str,
                ) -> tuple[pa.Table, pa.Table]:
    if not decoded:
        return empty_table(PACKETS_STORED), empty_table(ADVERTISEMENTS_STORED)
    rows = np.array([d[0] for d in decoded], np.int64)
    columns = identity_columns(fr, net, rows, "lbmr")
    columns["classified_by"] = constant_strings(classified_by, len(rows))
    columns["payload_length"] = arrow_array(net.pend[rows] - net.pstart[rows], pa.int32())
    columns["packet_type"] = arrow_array([d[1] for d in decoded], pa.string())
    columns["messages"] = arrow_array(np.zeros(len(rows), np.int32))
    columns["malformed_reason"] = arrow_array([d[2] for d in decoded], pa.string())
    packets = table_of(PACKETS_STORED, len(rows), columns)
    owners = np.array([d[0] for d in decoded for _ in d[3]], np.int64)
    records = [r for d in decoded for r in d[3]]
    if not records:
        return packets, empty_table(ADVERTISEMENTS_STORED)
    ident = identity_columns(fr, net, owners, "lbmr")
    adverts = python_table(records, pa.schema(
        [f for f in ADVERTISEMENTS_SCHEMA if f.name not in ident]))
    cols = {**{n: ident[n] for n in ADVERTISEMENTS_SCHEMA.names if n in ident},
            **{n: adverts.column(n) for n in adverts.column_names}}
    return packets, table_of(ADVERTISEMENTS_STORED, len(records), cols)
