"""LBT-RM and LBT-RU packets, column-wise, and their tables.

One decoder (:class:`_TransportDecoder`) for both transports, driven by the
:class:`wire.transport.TransportCodec` tables of :mod:`wire.lbtrm` and :mod:`wire.lbtru`
(packet layouts, counted lists, options), so no offset is written here.  :class:`_UdpResult`
holds a decode of some UDP rows with the LBMC messages of its DATA packets; its
:meth:`_UdpResult.clean` is the strict acceptance the content heuristics require;
:func:`udp_tables` turns it into ``packets`` and ``messages`` rows.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import construct as cs
import numpy as np
import pyarrow as pa

from wire import lbtrm, lbtru
from wire.fastpath import FastLayout, derive
from wire.fields import (
    Bit,
    members,
)
from wire.records import view_index
from wire.transport import CountOf, RestOf, TransportCodec

from .arrow_build import (
    ByteView,
    arrow_array,
    constant_strings,
    dictionary_strings,
    list_offsets,
    masked_array,
    member_at,
    read_member,
    read_members,
    running_offsets,
    sparse_strings,
    table_of,
    ver_type_of,
    views_of,
)
from .framing import (
    Frames,
    Network,
    identity_columns,
)
from .lbmc_columns import (
    LbmcColumns,
    decode_lbmc,
    messages_table,
    stop_at_first_error,
)
from .schemas import (
    MESSAGES_SCHEMA,
    PACKETS_SCHEMA,
    PACKETS_STORED,
)

# =============================================================================================
# LBT-RM and LBT-RU, column-wise (one decoder for both: the TransportCodec tables drive it)
# =============================================================================================


@dataclass(frozen=True)
class _RecordPlan:
    """How to read one transport packet or option class: its derived fixed layout, the lists
    that follow it (count member and element layout) and a trailing ``RestOf`` byte string."""

    cls: type
    prefix: str
    fast: FastLayout
    lists: tuple[tuple[str, str, FastLayout], ...]
    rest_of: tuple[str, int] | None
    views: Mapping[str, tuple[str, Bit]]

    @classmethod
    def of(cls, record: Any) -> _RecordPlan:
        fast: FastLayout = record.fast
        lists: list[tuple[str, str, FastLayout]] = []
        rest_of = None
        for member in members(record.struct):
            if member.name in fast.names:
                continue
            inner = member.subcon
            if isinstance(inner, cs.Array) and isinstance(inner.count, CountOf):
                lists.append((member.name, inner.count.member, derive(inner.subcon)))
            elif isinstance(getattr(inner, "length", None), RestOf):
                rest_of = (inner.length.member, inner.length.fixed)
            else:
                raise TypeError(f"{record.__name__}.{member.name}: no column-wise reading")
        return cls(record, record.prefix, fast, tuple(lists), rest_of, view_index(record.struct))


# packet column <- member or bit-view names (per packet type where a name means different things)
_PACKET_COLUMN_SOURCES: dict[str, tuple[str, ...]] = {
    "flags": ("flags", "flags_fec_type"),
    "sqn": ("sqn", "sm_sqn", "ack_sqn"),
    "trail_sqn": ("trail_sqn",),
    "lead_sqn": ("lead_sqn",),
    "session_id": ("session_id",),
    "ucast_port": ("ucast_port",),
    "num_naks": ("num_naks",),
    "num_ncfs": ("num_ncfs",),
    "format": ("format",),
    "retransmission": ("rx",),
    "syn": ("syn",),
    "creq_request": ("request",),
}
_TYPE_SPECIFIC = {("ncf", "reason"): "ncf_reason", ("rst", "reason"): "rst_reason"}
_LIST_COLUMNS = {"naks": "nak_sqns", "ncfs": "ncf_sqns"}
_OPTION_COLUMNS = {"session_id": "session_id", "client_id": "client_id"}

# packet error codes
(_P_SHORT, _P_TYPE, _P_FIXED, _P_LIST, _P_OPT_END, _P_OPT_ZERO, _P_OPT_FIXED, _P_OPT_SHORT,
 _P_OPT_OVER, _P_LBMC) = range(1, 11)


class _TransportDecoder:
    """Column-wise :meth:`wire.transport.TransportCodec.parse` for one transport."""

    def __init__(self, codec: TransportCodec) -> None:
        self.codec = codec
        self.name = codec.protocol
        self.packets = {int(code): _RecordPlan.of(cls) for code, cls in codec.packets.items()}
        self.type_names = {int(code): cls.type_code.name.lower()  # type: ignore[attr-defined]
                           for code, cls in codec.packets.items()}
        self.options = {int(code): _RecordPlan.of(cls) for code, cls in codec.options.items()}
        self.unknown_option = (_RecordPlan.of(codec.unknown_option)
                               if codec.unknown_option is not None else None)
        any_packet = next(iter(codec.packets.values()))
        self.ver_type_bits = {view: bit for view, (_, bit) in view_index(any_packet.struct).items()
                              if view in ("version", "type")}

    def decode(self, bv: ByteView, pstart: np.ndarray, pend: np.ndarray) -> _Transport:
        n = len(pstart)
        res = _Transport(self, n)
        length = pend - pstart
        short = length < self.codec.header_size
        res.fail(np.flatnonzero(short), _P_SHORT, 0, length[short], self.codec.header_size)
        rows = np.flatnonzero(~short)
        version, ptype = ver_type_of(self.ver_type_bits, bv.u8(pstart[rows]))
        res.ptype[rows] = ptype
        res.version[rows] = version
        known = np.isin(ptype, list(self.packets))
        res.fail(rows[~known], _P_TYPE, 0, ptype[~known])
        pos = np.zeros(n, np.int64)
        next_hdr = np.zeros(n, np.int64)
        for code, plan in self.packets.items():
            r = rows[ptype == code]
            if not r.size:
                continue
            fits = length[r] >= plan.fast.size
            res.fail(r[~fits], _P_FIXED, 0, length[r][~fits], plan.fast.size, plan.prefix)
            r = r[fits]
            values = read_members(bv, plan.fast, pstart[r])
            views_of(values, plan.views)
            cur = plan.fast.size + np.zeros(len(r), np.int64)
            lists = []
            ok = np.ones(len(r), bool)
            for member, count_member, element in plan.lists:
                count = values[count_member]
                need = count * element.size
                over = ok & (need > length[r] - cur)
                res.fail(r[over], _P_LIST, int(_offset_of(plan, count_member)), count[over],
                         0, plan.prefix, count_member)
                ok &= ~over
                lists.append((member, element, pstart[r] + cur, count))
                cur = cur + np.where(ok, need, 0)
            res.set_values(r[ok], code, {k: v[ok] for k, v in values.items()})
            for member, element, lstart, lcount in lists:
                res.set_list(member, r[ok], lstart[ok], lcount[ok], element, bv)
            pos[r[ok]] = cur[ok]
            next_hdr[r[ok]] = values["next_hdr"][ok]
        self._options(bv, res, pstart, pend, pos, next_hdr)
        res.body_end = pos
        return res

    def _options(self, bv: ByteView, res: _Transport, pstart: np.ndarray, pend: np.ndarray,
                 pos: np.ndarray, next_hdr: np.ndarray) -> None:
        """The option chain after the type body, breadth first (:meth:`_parse_options`)."""
        active = np.flatnonzero((res.err == 0) & (next_hdr != 0))
        code = next_hdr
        basic = self.unknown_option or next(iter(self.options.values()))
        while active.size:
            left = pend[active] - (pstart[active] + pos[active])
            end_short = left < 2
            res.fail(active[end_short], _P_OPT_END, pos[active][end_short], left[end_short])
            active, left = active[~end_short], left[~end_short]
            at = pstart[active] + pos[active]
            hdr_len = bv.u8(at + _offset_of(basic, "hdr_len"))
            zero = hdr_len == 0
            res.fail(active[zero], _P_OPT_ZERO, pos[active][zero] + 1, 0)
            active, left, at, hdr_len = active[~zero], left[~zero], at[~zero], hdr_len[~zero]
            nxt_active = []
            for opt_code in np.unique(code[active]):
                sel = code[active] == opt_code
                plan = self.options.get(int(opt_code), self.unknown_option)
                r, rleft, rat, rlen = active[sel], left[sel], at[sel], hdr_len[sel]
                if plan is None:
                    res.fail(r, _P_TYPE, pos[r], opt_code)
                    continue
                res.unknown_option[r] |= int(opt_code) not in self.options
                fixed = plan.fast.size
                bad = rleft < fixed
                res.fail(r[bad], _P_OPT_FIXED, pos[r][bad], rleft[bad], fixed, plan.prefix)
                ok = ~bad
                if plan.rest_of is not None:
                    short = ok & (rlen < plan.rest_of[1])
                    res.fail(r[short], _P_OPT_SHORT, pos[r][short] + 1, rlen[short],
                             plan.rest_of[1], plan.prefix)
                    ok &= ~short
                    over = ok & (rlen > rleft)
                    res.fail(r[over], _P_OPT_OVER, pos[r][over] + 1, rlen[over], 0, plan.prefix)
                    ok &= ~over
                    used = rlen
                else:
                    used = np.full(len(r), fixed)
                r, rat, used = r[ok], rat[ok], used[ok]
                values = read_members(bv, plan.fast, rat)
                for member, column in _OPTION_COLUMNS.items():
                    if member in values:
                        res.set_option(column, r, values[member])
                code[r] = values["next_hdr"]
                pos[r] += used
                nxt_active.append(r[values["next_hdr"] != 0])
            active = np.concatenate(nxt_active) if nxt_active else np.zeros(0, np.int64)


def _offset_of(plan: _RecordPlan, member: str) -> int:
    return member_at(plan.fast, member)[1]


class _Transport:
    """Per-row results of a transport decode (rows are positions in the decoder's input)."""

    def __init__(self, decoder: _TransportDecoder, n: int) -> None:
        self.decoder = decoder
        self.n = n
        self.err = np.zeros(n, np.int64)
        self.err_off = np.zeros(n, np.int64)
        self.err_val = np.zeros(n, np.int64)
        self.err_aux: dict[int, tuple[Any, ...]] = {}
        self.ptype = np.full(n, -1, np.int64)
        self.version = np.zeros(n, np.int64)
        self.values: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._lists: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        self.unknown_option = np.zeros(n, bool)
        self.body_end = np.zeros(n, np.int64)

    def fail(self, rows: np.ndarray, code: int, off: Any, val: Any, *aux: Any) -> None:
        """Record the first error of each row (later errors of a row are ignored)."""
        if not len(rows):
            return
        rows = np.asarray(rows)
        fresh = self.err[rows] == 0
        self.err_off[rows[fresh]] = np.broadcast_to(np.asarray(off), rows.shape)[fresh]
        self.err_val[rows[fresh]] = np.broadcast_to(np.asarray(val), rows.shape)[fresh]
        rows = rows[fresh]
        self.err[rows] = code
        if aux:
            for r in rows.tolist():
                self.err_aux[r] = aux

    def _column(self, name: str) -> tuple[np.ndarray, np.ndarray]:
        col = self.values.get(name)
        if col is None:
            col = self.values[name] = (np.zeros(self.n, np.int64), np.zeros(self.n, bool))
        return col

    def set_values(self, rows: np.ndarray, ptype: int, values: Mapping[str, np.ndarray]) -> None:
        tname = self.decoder.type_names[ptype]
        for column, sources in _PACKET_COLUMN_SOURCES.items():
            for source in sources:
                if source in values:
                    data, valid = self._column(column)
                    data[rows], valid[rows] = values[source], True
                    break
        for (type_name, source), column in _TYPE_SPECIFIC.items():
            if type_name == tname and source in values:
                data, valid = self._column(column)
                data[rows], valid[rows] = values[source], True

    def set_option(self, column: str, rows: np.ndarray, values: np.ndarray) -> None:
        data, valid = self._column(column)
        data[rows], valid[rows] = values, True  # the last option of a row wins, as in wire

    def set_list(self, member: str, rows: np.ndarray, start: np.ndarray, count: np.ndarray,
                 element: FastLayout, bv: ByteView) -> None:
        """A NAK/NCF list per row: ``count[i]`` elements from ``start[i]``."""
        idx, _ = _gather_index(np.zeros(len(rows), np.int64), count)
        pos = np.repeat(start, count) + idx * element.size
        values = read_member(bv, element, element.names[0], pos)
        self._lists.setdefault(_LIST_COLUMNS[member], []).append((rows, count, values))

    def list_array(self, column: str, rows: np.ndarray) -> pa.Array | None:
        """The list column for ``rows`` (ascending; null where a row has no such list)."""
        parts = self._lists.get(column)
        if not parts:
            return None
        counts = np.zeros(self.n, np.int64)
        present = np.zeros(self.n, bool)
        for p_rows, p_count, _ in parts:
            counts[p_rows] = p_count
            present[p_rows] = True
        owner = np.concatenate([np.repeat(p_rows, p_count) for p_rows, p_count, _ in parts])
        order = np.argsort(owner, kind="stable")
        owner = owner[order]
        values = np.concatenate([p[2] for p in parts])[order]
        selected = np.zeros(self.n, bool)
        selected[rows] = True
        return pa.ListArray.from_arrays(list_offsets(counts[rows]),
                                        arrow_array(values[selected[owner]], pa.int64()),
                                        mask=arrow_array(~present[rows]))

    def error_text(self, row: int, lbmc_reason: str | None = None) -> str | None:
        code = int(self.err[row])
        if not code:
            return None
        return packet_error(self.decoder.name, code, int(self.err_off[row]),
                            int(self.err_val[row]), self.err_aux.get(row, ()), lbmc_reason)


def _gather_index(starts: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    offsets = running_offsets(counts)
    total = int(offsets[-1])
    idx = np.arange(total, dtype=np.int64) + np.repeat(starts - offsets[:-1], counts)
    return idx, offsets


def packet_error(protocol: str, code: int, off: int, val: int, aux: tuple[Any, ...],
                 lbmc_reason: str | None) -> str:
    need = aux[0] if aux else 0
    header = aux[1] if len(aux) > 1 else protocol
    if code == _P_SHORT:
        return f"{protocol} at offset 0: {val} bytes; the common header needs {need}"
    if code == _P_TYPE:
        return f"{protocol} at offset {off}: unrecognized packet type or option 0x{val:02x}"
    if code == _P_FIXED:
        return f"{header} at offset {off}: {val} bytes but the fixed layout needs {need}"
    if code == _P_LIST:
        return (f"{header} at offset {off}: {aux[2]} {val} needs more bytes of list than "
                "remain in the datagram")
    if code == _P_OPT_END:
        return f"{protocol} at offset {off}: the datagram ends where an option should start"
    if code == _P_OPT_ZERO:
        return f"{protocol} option at offset {off}: hdr_len is zero"
    if code == _P_OPT_FIXED:
        return f"{header} at offset {off}: {val} bytes left but the option layout needs {need}"
    if code == _P_OPT_SHORT:
        return f"{header} at offset {off}: hdr_len {val} is shorter than the {need}-byte layout"
    if code == _P_OPT_OVER:
        return f"{header} at offset {off}: hdr_len {val} runs past the end of the datagram"
    if code == _P_LBMC:
        return f"{protocol}/{lbmc_reason}" if lbmc_reason else f"{protocol}: bad LBMC message"
    return f"{protocol}: error {code}"


LBTRM_DECODER = _TransportDecoder(lbtrm.CODEC)
LBTRU_DECODER = _TransportDecoder(lbtru.CODEC)


# =============================================================================================
# UDP: decode, strict acceptance of content-claimed datagrams, tables
# =============================================================================================


@dataclass
class _UdpResult:
    """A transport decode of some UDP rows: per row results and the LBMC of DATA rows."""

    frame_rows: np.ndarray
    transport: _Transport
    messages: LbmcColumns
    region_rows: np.ndarray  # region index -> position in frame_rows
    pstart: np.ndarray
    pend: np.ndarray

    def message_count(self) -> np.ndarray:
        ok = self.messages.err == 0
        return np.bincount(self.region_rows[self.messages.region[ok]],
                           minlength=len(self.frame_rows))

    def lbmc_error_rows(self) -> dict[int, int]:
        """Position -> index of its first bad message."""
        bad = np.flatnonzero(self.messages.err != 0)
        return {int(self.region_rows[self.messages.region[i]]): int(i) for i in bad[::-1]}

    def clean(self, versions: Sequence[int]) -> np.ndarray:
        """Rows that decode with nothing left over in one of ``versions``: the clean-decode
        half of :mod:`wire.detect`'s content rules for LBT-RM and LBT-RU."""
        tr = self.transport
        out = (tr.err == 0) & ~tr.unknown_option & np.isin(tr.version, versions)
        length = self.pend - self.pstart
        msgs = self.messages
        consumed = np.zeros(len(self.frame_rows), np.int64)
        np.add.at(consumed, self.region_rows[msgs.region], msgs.msglen)
        has_lbmc = np.zeros(len(self.frame_rows), bool)
        has_lbmc[self.region_rows] = True
        bad = np.zeros(len(self.frame_rows), bool)
        bad[self.region_rows[msgs.region[msgs.err != 0]]] = True
        data_ok = has_lbmc & ~bad & (consumed > 0) & (tr.body_end + consumed == length)
        other_ok = ~has_lbmc & (tr.body_end == length)
        for column in ("num_naks", "num_ncfs"):
            counted = tr.values.get(column)
            if counted is not None:
                other_ok &= ~counted[1] | (counted[0] > 0)
        return out & (data_ok | other_ok)


def decode_udp(decoder: _TransportDecoder, bv: ByteView, net: Network, frame_rows: np.ndarray,
               ) -> _UdpResult:
    pstart, pend = net.pstart[frame_rows], net.pend[frame_rows]
    tr = decoder.decode(bv, pstart, pend)
    lbmc_types = [code for code, plan in decoder.packets.items()
                  if getattr(plan.cls, "carries_lbmc", False)]
    region_rows = np.flatnonzero((tr.err == 0) & np.isin(tr.ptype, lbmc_types))
    msgs = decode_lbmc(bv, pstart[region_rows] + tr.body_end[region_rows], pend[region_rows])
    msgs = stop_at_first_error(msgs, len(region_rows))
    return _UdpResult(frame_rows, tr, msgs, region_rows, pstart, pend)



_BOOL_COLUMNS = ("retransmission", "syn")


def udp_tables(fr: Frames, net: Network, res: _UdpResult, positions: np.ndarray,
               classified_by: str, stored: bool,
               ) -> tuple[pa.Table, pa.Table, dict[str, pa.Table]]:
    """Packets and messages tables for ``positions`` (into ``res.frame_rows``), and the header
    tables when ``stored`` (see :func:`messages_table`)."""
    decoder = res.transport.decoder
    tr = res.transport
    frame_rows = res.frame_rows[positions]
    k = len(positions)
    columns = identity_columns(fr, net, frame_rows, decoder.name)
    columns["classified_by"] = constant_strings(classified_by, k)
    columns["payload_length"] = arrow_array((res.pend - res.pstart)[positions], pa.int32())
    type_codes = tr.ptype[positions]
    names = [decoder.type_names.get(t) for t in range(16)]
    columns["packet_type"] = dictionary_strings(type_codes, names, type_codes >= 0)
    for name, (data, valid) in tr.values.items():
        if name in _BOOL_COLUMNS:
            columns[name] = masked_array(data[positions] != 0, valid[positions], pa.bool_())
        else:
            fld = PACKETS_SCHEMA.field(name)
            columns[name] = masked_array(data[positions], valid[positions], fld.type)
    for column in _LIST_COLUMNS.values():
        arr = tr.list_array(column, positions)
        if arr is not None:
            columns[column] = arr
    counts = res.message_count()
    columns["messages"] = arrow_array(counts[positions], pa.int32())
    lbmc_bad = res.lbmc_error_rows()
    reasons: dict[int, str] = {}
    msgs = res.messages
    for i in np.flatnonzero((tr.err[positions] != 0)
                            | np.isin(positions, list(lbmc_bad))).tolist():
        pos = int(positions[i])
        parts = []
        text = tr.error_text(pos)
        if text:
            parts.append(text)
        bad = lbmc_bad.get(pos)
        if bad is not None:
            offset = int(msgs.start[bad] - res.pstart[pos])
            parts.append(f"{decoder.name} message {int(msgs.index[bad])} at offset "
                         f"{offset}: {msgs.error_text(bad)}")
        reasons[i] = "; ".join(parts)
    columns["malformed_reason"] = sparse_strings(k, reasons)
    packets = table_of(PACKETS_STORED, k, columns)

    # messages of the selected rows
    selected = np.zeros(len(res.frame_rows), bool)
    selected[positions] = True
    msgs = res.messages
    keep = selected[res.region_rows[msgs.region]] if msgs.count else np.zeros(0, bool)
    msgs = msgs.take(keep) if not keep.all() else msgs
    owner = res.region_rows[msgs.region]
    ident = identity_columns(fr, net, res.frame_rows[owner], decoder.name)
    ident = {name: ident[name] for name in MESSAGES_SCHEMA.names if name in ident}
    extra = {}
    for name, column in (("session_id", "session_id"), ("transport_sqn", "sqn")):
        got = tr.values.get(column)
        if got is not None:
            extra[name] = masked_array(got[0][owner], got[1][owner], pa.int64())
    messages, headers = messages_table(fr.data.bv, msgs, ident, np.ones(msgs.count, bool),
                                       extra, stored=stored)
    return packets, messages, headers
