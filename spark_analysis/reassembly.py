"""Stage 2 of the columnar decode: LBT-TCP byte streams per connection direction.

:func:`reassemble_tcp` takes the ``tcp_segments`` stage 1 kept (grouped by connection
direction) and frames each stream into LBMC messages.  A stretch of in-order segments without
holes or overlaps is framed in one pass over the payload buffer: breadth first over the
segments when each holds whole messages (the usual case), else one short Python loop step
per message, since each ``msglen`` says where the next message starts; anything else is
replayed segment by segment with the Dissector's rules.  The framed messages go through the
same vectorised LBMC decoder (:func:`spark_analysis.lbmc_columns.decode_lbmc`).

Segments are reassembled in sequence-number order (the Dissector uses capture order), so
reordered segments reassemble instead of being reported as a gap plus a retransmission.  A
message is reported with the frame that made it deliverable: the latest-captured frame of
the stream up to the message's last byte (the completing frame when the capture is in
order, exactly as tshark reports it).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wire import lbmc, pcap
from wire.lbttcp import entry_test

from .arrow_build import (
    BinaryColumn,
    ByteView,
    arrow_array,
    constant_strings,
    empty_table,
    encode_files,
    gather_ranges,
    ipv4_strings,
    member_at,
    numpy_of,
    read_member,
    running_offsets,
    sparse_strings,
    table_of,
)
from .classify import (
    in_range,
)
from .framing import (
    Skips,
)
from .lbmc_columns import (
    decode_lbmc,
    messages_table,
)
from .schemas import (
    ADVERTISEMENTS_STORED,
    FLOW_KEY,
    MESSAGES_SCHEMA,
    PACKETS_STORED,
    TCP_SEGMENTS_STORED,
    DecodedTables,
    DecodeOptions,
)

# =============================================================================================
# Stage 2: LBT-TCP reassembly per connection direction
# =============================================================================================

_MSGLEN_AT = member_at(lbmc.CONTROL_BASE, "msglen")[1]
if member_at(lbmc.CONTROL_BASE, "msglen")[0] != np.dtype(">u2"):
    raise TypeError("the LBT-TCP framer reads msglen as a big-endian u16")
_MIN_FRAME = lbmc.CONTROL_BASE.size
_MSGLEN_DTYPE = member_at(lbmc.CONTROL_BASE, "msglen")[0]
_SEQ_MOD = 1 << 32
NO_PAYLOAD = "TCP segment without payload"


class _TcpOut:
    """What stage 2 produces for the (sorted) segments of one stage-2 call.

    Messages lying in the input payload buffer are kept as their position and the segment
    they are attributed to, in completion order, as numpy arrays (the one-pass path makes
    them so; the segment-by-segment replay collects Python lists and adds them when done);
    messages that straddled segments are copied to ``extra``.  Lengths are read column-wise
    after."""

    def __init__(self) -> None:
        self.row_parts: list[np.ndarray] = []  # segments that get a packets row
        self.retx: list[int] = []  # ... of which whole retransmissions
        self.reason: dict[int, str] = {}
        self.skips: dict[str, list[int]] = defaultdict(list)
        self.pos_parts: list[np.ndarray] = []  # messages inside the payload buffer ...
        self.owner_parts: list[np.ndarray] = []  # ... and the segment each is attributed to
        self.in_buffer = 0  # how many such messages so far
        self.extra_pos: list[int] = []  # messages copied to ``extra`` (straddling segments)
        self.extra_seg: list[int] = []
        self.extra_order: list[int] = []  # ``in_buffer`` when each was completed
        self.extra = bytearray()

    def note(self, row: int, reason: str) -> None:
        old = self.reason.get(row)
        self.reason[row] = f"{old}; {reason}" if old else reason

    def add(self, rows: np.ndarray, positions: np.ndarray, owners: np.ndarray) -> None:
        """Packets rows for ``rows``, and buffer messages at ``positions`` owned by
        ``owners`` (completed in this order, after everything added before)."""
        self.row_parts.append(rows)
        self.pos_parts.append(positions)
        self.owner_parts.append(owners)
        self.in_buffer += len(positions)


def _reassemble_epoch(out: _TcpOut, raw: bytes, rows: np.ndarray, seq: np.ndarray,
                      flags: np.ndarray, pstart: np.ndarray, plen: np.ndarray) -> None:
    """One connection direction from one SYN (or the capture start) to the next SYN.

    Sequence numbers are unwrapped in capture order, data segments are replayed in sequence
    order, and the Dissector's rules apply: bytes already seen are trimmed (a whole duplicate
    is a retransmission), a hole resets the framer, a framer that has not yet seen a message
    start needs the LBMC entry test at a segment start, and a ``msglen`` below 4 breaks the
    stream (reported on that segment, or on the next one when messages completed first, as
    :class:`wire.lbttcp.LbttcpStream` does)."""
    raw_seq = seq[rows]
    delta = (np.diff(raw_seq) % _SEQ_MOD).astype(np.int64)
    delta[delta >= _SEQ_MOD // 2] -= _SEQ_MOD
    useq = np.concatenate([[0], np.cumsum(delta)]) + int(raw_seq[0])
    syn = (flags[rows] & pcap.TCP_SYN) != 0
    useq = useq + syn  # data of a SYN segment starts after the SYN's sequence number
    has_data = plen[rows] > 0
    out.skips[NO_PAYLOAD].extend(rows[~has_data].tolist())
    data_rows = rows[has_data]
    data_useq = useq[has_data]
    order = np.lexsort((data_rows, data_useq))
    data_rows, data_useq = data_rows[order], data_useq[order]
    if not data_rows.size:
        return
    # A hole resets everything, so the pieces between holes are independent: each goes
    # through the one-pass path when it is clean, else through the segment-by-segment replay.
    next_seq: int | None = int(useq[0]) if syn[0] else None
    ends = data_useq + plen[data_rows]
    reach = np.maximum.accumulate(ends)
    hole = np.zeros(len(data_rows), bool)
    hole[1:] = data_useq[1:] > reach[:-1]
    if next_seq is not None:
        hole[0] = data_useq[0] > next_seq
    cuts = [0, *np.flatnonzero(hole[1:]) + 1, len(data_rows)]
    for a, b in itertools.pairwise(cuts):
        before = next_seq if a == 0 else int(reach[a - 1])
        if not _contiguous_piece(out, raw, data_rows[a:b], data_useq[a:b], before, pstart,
                                 plen):
            _replay(out, raw, data_rows[a:b], data_useq[a:b], before, pstart, plen)


def _replay(out: _TcpOut, raw: bytes, data_rows: np.ndarray, data_useq: np.ndarray,
            next_seq: int | None, pstart: np.ndarray, plen: np.ndarray) -> None:
    """Data segments (in sequence order) one by one, from a fresh framer."""
    accepted = False
    broken = False
    pending = b""
    fed = 0  # bytes fed to the current framer (for error offsets)
    best = -1  # latest-captured fed segment: the one that makes a message deliverable
    rows: list[int] = []  # segments that get a packets row
    msg_pos: list[int] = []  # messages inside the payload buffer, in feed order
    feed_seg: list[int] = []  # per feed: attributed segment ...
    feed_count: list[int] = []  # ... and how many buffer messages it completed
    for r, u, length, start in zip(data_rows.tolist(), data_useq.tolist(),
                                   plen[data_rows].tolist(), pstart[data_rows].tolist(),
                                   strict=True):
        if next_seq is None:
            next_seq = u
        if u + length <= next_seq:
            if accepted:
                rows.append(r)
                out.retx.append(r)
            else:
                out.skips["TCP retransmission of data already seen"].append(r)
            continue
        trim = 0
        gap = None
        if u < next_seq:
            trim = next_seq - u
        elif u > next_seq:
            gap = f"{u - next_seq} bytes missing from the capture before this segment"
            accepted, broken, pending, fed = False, False, b"", 0
        next_seq = u + length
        ps = start + trim
        pe = start + length
        if broken:
            rows.append(r)
            out.note(r, "lbttcp: stream unusable after an earlier framing error")
            accepted, broken, pending, fed = False, False, b"", 0
            continue
        if not accepted:
            why = entry_test(memoryview(raw)[ps:pe])
            if why is not None:
                out.skips[f"LBT-TCP entry test fails: {why}"].append(r)
                continue
            accepted = True
        rows.append(r)
        if gap:
            out.note(r, gap)
        if r > best:
            best = r
        framing_error = None
        before = len(msg_pos)
        emitted = 0
        if pending:  # finish the straddling message on a copy, then go on in the buffer
            buf = pending + raw[ps:pe]
            pos, end = 0, len(buf)
            while end - pos >= _MIN_FRAME and pos < len(pending):
                msglen = (buf[pos + _MSGLEN_AT] << 8) | buf[pos + _MSGLEN_AT + 1]
                if msglen < _MIN_FRAME:
                    framing_error = (f"lbttcp at offset {fed - len(pending) + pos + _MSGLEN_AT}"
                                     f": msglen {msglen} cannot frame a message; stream cannot "
                                     "resync")
                    break
                if end - pos < msglen:
                    break
                out.extra_pos.append(len(out.extra))
                out.extra_seg.append(best)
                out.extra_order.append(out.in_buffer + len(msg_pos))
                out.extra += buf[pos:pos + msglen]
                emitted += 1
                pos += msglen
            if framing_error is None and pos >= len(pending):
                ps += pos - len(pending)
                pending = b""
            elif framing_error is None:
                pending = bytes(buf[pos:end])
                fed += pe - start - trim
                continue
        pos = ps
        while framing_error is None and pe - pos >= _MIN_FRAME:
            msglen = (raw[pos + _MSGLEN_AT] << 8) | raw[pos + _MSGLEN_AT + 1]
            if msglen < _MIN_FRAME:
                framing_error = (f"lbttcp at offset {fed + pos - start - trim + _MSGLEN_AT}: "
                                 f"msglen {msglen} cannot frame a message; stream cannot resync")
                break
            if pe - pos < msglen:
                break
            msg_pos.append(pos)
            pos += msglen
        count = len(msg_pos) - before
        if count:
            feed_seg.append(best)
            feed_count.append(count)
        fed += pe - start - trim
        if framing_error is None:
            pending = raw[pos:pe]
        elif emitted or count:
            broken, pending = True, b""
        else:
            out.note(r, framing_error)
            accepted, pending, fed = False, b"", 0
    out.add(np.array(rows, np.int64), np.array(msg_pos, np.int64),
            np.repeat(np.array(feed_seg, np.int64), np.array(feed_count, np.int64)))


_WHOLE_DEPTH = 256


def _whole_messages(raw: bytes, starts: np.ndarray, lengths: np.ndarray,
                    ) -> np.ndarray | None:
    """The message starts of back-to-back segments when each holds whole messages only (what
    a sender writing message by message produces): framed breadth first, the ``k``-th message
    of every segment at once, so Python loops over messages per segment, not per stream.

    None when some segment ends inside a message or holds a ``msglen`` below the minimum: the
    caller then frames message by message (the same result wherever both apply)."""
    if not starts.size:
        return np.zeros(0, np.int64)
    bv = ByteView(np.frombuffer(raw, np.uint8))
    ends = starts + lengths
    pos = starts.astype(np.int64)
    active = np.arange(len(starts))
    found: list[np.ndarray] = []
    for _ in range(_WHOLE_DEPTH):
        if not active.size:
            break
        at = pos[active]
        room = ends[active] - at
        if (room < _MIN_FRAME).any():
            return None
        msglen = bv.read(_MSGLEN_DTYPE, at + _MSGLEN_AT).astype(np.int64)
        if (msglen < _MIN_FRAME).any() or (msglen > room).any():
            return None
        found.append(at)
        pos[active] = at + msglen
        active = active[pos[active] < ends[active]]
    else:
        if active.size:
            return None
    return np.sort(np.concatenate(found)) if found else np.zeros(0, np.int64)


def _contiguous_piece(out: _TcpOut, raw: bytes, rows: np.ndarray, useq: np.ndarray,
                      next_seq: int | None, pstart: np.ndarray, plen: np.ndarray) -> bool:
    """The common case in one pass: data segments in capture order, each starting where the
    previous ended (no overlap or retransmission), the first passing the entry test and no
    framing error.  The stream is then one range of the payload buffer, framed by one loop
    over its messages, each attributed to the segment holding its last byte.  Returns False
    (having changed nothing) when a condition fails: the caller then replays the segments
    one by one, which gives the same result in this case."""
    if rows.size > 1 and (np.diff(rows) <= 0).any():
        return False
    lengths = plen[rows]
    starts = pstart[rows]
    if rows.size > 1 and ((useq[1:] != useq[:-1] + lengths[:-1]).any()
                          or (starts[1:] != starts[:-1] + lengths[:-1]).any()):
        return False
    begin = int(starts[0])
    end = begin + int(lengths.sum())
    if entry_test(memoryview(raw)[begin:begin + int(lengths[0])]) is not None:
        return False
    positions: np.ndarray | list[int] | None = _whole_messages(raw, starts, lengths)
    if positions is None:
        found: list[int] = []
        pos = begin
        while end - pos >= _MIN_FRAME:
            msglen = (raw[pos + _MSGLEN_AT] << 8) | raw[pos + _MSGLEN_AT + 1]
            if msglen < _MIN_FRAME:
                return False
            if end - pos < msglen:
                break
            found.append(pos)
            pos += msglen
        positions = found
    if next_seq is not None and int(useq[0]) > next_seq:
        out.note(int(rows[0]), f"{int(useq[0]) - next_seq} bytes missing from the capture "
                 "before this segment")
    first = np.asarray(positions, np.int64)
    last = first + read_member(ByteView(np.frombuffer(raw, np.uint8)), lbmc.CONTROL_BASE,
                               "msglen", first) - 1
    out.add(rows, first, rows[np.searchsorted(starts + lengths, last, side="right")])
    return True


def reassemble_tcp(segments: pa.Table | pa.RecordBatch, options: DecodeOptions | None = None,
                   *, stored: bool = False) -> DecodedTables:
    """Stage 2 (stateful): reassemble and frame LBT-TCP connection directions.

    ``segments`` (:data:`TCP_SEGMENTS_SCHEMA`) must hold *every* segment of each connection
    direction it contains (Spark groups them by :func:`flow_key_columns`); any order.  Returns
    the lbttcp packets (one per segment with payload on a recognised connection), their
    messages and the skipped counts.  With :attr:`DecodeOptions.separate_files` a direction
    is reassembled per file.  With ``stored``, the tables come in the stored form
    (:class:`DecodedTables`).
    """
    options = options or DecodeOptions()
    table = segments if isinstance(segments, pa.Table) else pa.Table.from_batches([segments])
    if table.num_rows == 0:
        return DecodedTables.empty(stored)
    seg = _Segments.of(table, by_file=options.separate_files)
    n = seg.n
    raw = seg.raw
    key_columns = [*FLOW_KEY, "file_rank"] if options.separate_files else list(FLOW_KEY)
    keys = np.stack([seg.ints[k] for k in key_columns], axis=1)
    seq, flags = seg.ints["seq"], seg.ints["tcp_flags"]
    change = np.flatnonzero((keys[1:] != keys[:-1]).any(axis=1)) + 1
    flow_bounds = np.concatenate([[0], change, [n]])
    out = _TcpOut()
    for a, b in zip(flow_bounds[:-1].tolist(), flow_bounds[1:].tolist(), strict=True):
        starts = [a, *(a + np.flatnonzero(flags[a + 1:b] & pcap.TCP_SYN) + 1).tolist(), b]
        for s, e in itertools.pairwise(starts):
            _reassemble_epoch(out, raw, np.arange(s, e), seq, flags, seg.pstart, seg.plen)
    transport = (in_range(seg.ints["src_port"], options.ports.lbttcp_source)
                 | in_range(seg.ints["dst_port"], options.ports.lbttcp_source))
    tables = _tcp_tables(seg, out, transport, stored)
    return tables if stored else tables.public()


@dataclass
class _Segments:
    """A stage-2 input sorted by flow, then time, file and offset, read into numpy.

    Only the sort order is computed on the table (from its key columns); the payloads are
    gathered once into a buffer in that order, so a flow's in-order segments lie back to back
    (what the one-pass framing of :func:`_contiguous_piece` needs), and the identity columns of
    the output are rebuilt from the ``order`` positions, never by sorting every column."""

    n: int
    table: pa.Table  # the input, unsorted
    order: np.ndarray  # sorted position -> input row
    ints: dict[str, np.ndarray]  # sorted numeric columns
    raw: bytes  # payloads in sorted order
    pstart: np.ndarray
    plen: np.ndarray
    file_codes: np.ndarray  # input row -> index into file_names
    file_names: pa.Array

    @classmethod
    def of(cls, table: pa.Table, by_file: bool = False) -> _Segments:
        """Sorted by flow, then time, file and offset; with ``by_file`` by file first (each
        file's flows apart, ``ints["file_rank"]`` tells them apart)."""
        def ints(name: str, null: int = 0) -> np.ndarray:
            col = table.column(name)
            if col.null_count:
                col = col.fill_null(null)
            return numpy_of(col).astype(np.int64)

        files = encode_files(table.column("file"))
        names = files.dictionary.to_pylist()
        rank = np.empty(len(names), np.int64)
        rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))
        file_rank = rank[numpy_of(files.indices)]
        columns = {k: ints(k) for k in (*FLOW_KEY, "seq", "tcp_flags", "file_offset")}
        # nulls sort last, as in Table.sort_by
        ts = ints("ts_ns", np.iinfo(np.int64).max)
        # (address, port) as one 48-bit number sorts like the pair: five sort keys, not seven
        src_ip, src_port, dst_ip, dst_port = (columns[k] for k in FLOW_KEY)
        keys = [columns["file_offset"], ts, (dst_ip << 16) | dst_port,
                (src_ip << 16) | src_port]
        if len(names) > 1:
            keys.insert(1, file_rank)
            if by_file:  # the most significant key
                keys.append(file_rank)
        columns["file_rank"] = file_rank
        order = np.lexsort(keys)
        raw, pstart, plen = _gather_sorted(table.column("payload"), order)
        file_codes = numpy_of(files.indices).astype(np.int64)
        return cls(len(order), table, order, {k: v[order] for k, v in columns.items()},
                   raw, pstart, plen, file_codes, files.dictionary)

    def files(self, input_rows: np.ndarray) -> pa.Array:
        """The ``file`` column of input rows (a constant when there is one file)."""
        if len(self.file_names) == 1:
            return constant_strings(self.file_names[0].as_py(), len(input_rows))
        return pa.DictionaryArray.from_arrays(
            arrow_array(self.file_codes[input_rows], pa.int32()), self.file_names)

    def identity(self, rows: np.ndarray) -> dict[str, pa.Array]:
        """The identity columns of sorted positions ``rows``."""
        take = self.order[rows]
        src = self.ints["src_ip_int"][rows]
        dst = self.ints["dst_ip_int"][rows]
        ts = self.table.column("ts_ns")
        return {
            "file": self.files(take),
            "file_offset": arrow_array(self.ints["file_offset"][rows], pa.int64()),
            "ts_ns": _flat(pc.take(ts.combine_chunks() if ts.num_chunks != 1 else ts,
                                   arrow_array(take))),
            "protocol": constant_strings("lbttcp", len(rows)),
            "src_ip": ipv4_strings(src),
            "src_port": arrow_array(self.ints["src_port"][rows].astype(np.int32)),
            "dst_ip": ipv4_strings(dst),
            "dst_port": arrow_array(self.ints["dst_port"][rows].astype(np.int32)),
            "src_ip_int": arrow_array(src, pa.int64()),
            "dst_ip_int": arrow_array(dst, pa.int64()),
        }


def _gather_sorted(column: pa.ChunkedArray | pa.Array, order: np.ndarray,
                   ) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The values of a binary column in ``order``, back to back: (bytes, starts, lengths).

    Copied run by run: consecutive positions whose values are adjacent in the same Arrow
    buffer are one slice (stage 1 ships each flow's payloads adjacent, so a flow is a few
    long runs); without such runs it falls back to the vectorised byte gather."""
    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    parts = [BinaryColumn.of(c) for c in chunks if len(c)]
    if not parts:
        empty = np.zeros(0, np.int64)
        return b"", empty, empty.copy()
    chunk_of = np.concatenate([np.full(len(p.starts), i, np.int64) for i, p in enumerate(parts)])
    starts = np.concatenate([p.starts for p in parts])[order]
    lengths = np.concatenate([p.lengths for p in parts])[order]
    chunk_of = chunk_of[order]
    ends = starts + lengths
    n = len(order)
    new_run = np.ones(n, bool)
    new_run[1:] = (starts[1:] != ends[:-1]) | (chunk_of[1:] != chunk_of[:-1])
    first = np.flatnonzero(new_run)
    offsets = running_offsets(lengths)
    if len(first) * 8 > n and len(parts) == 1:
        values, _ = gather_ranges(parts[0].bv.data, starts, lengths)
        return values.tobytes(), offsets[:-1], lengths.astype(np.int64)
    last = np.append(first[1:], n) - 1
    views = [p.bv.data.data for p in parts]
    raw = b"".join([views[c][a:b] for c, a, b in zip(
        chunk_of[first].tolist(), starts[first].tolist(), ends[last].tolist(), strict=True)])
    return raw, offsets[:-1], lengths.astype(np.int64)


def _flat(array: pa.Array | pa.ChunkedArray) -> pa.Array:
    if isinstance(array, pa.ChunkedArray):
        return array.combine_chunks() if array.num_chunks != 1 else array.chunk(0)
    return array


def _tcp_tables(seg: _Segments, out: _TcpOut, transport: np.ndarray, stored: bool,
                ) -> DecodedTables:
    n = seg.n
    raw = seg.raw
    combined = np.frombuffer(raw + bytes(out.extra), np.uint8)
    bv = ByteView(combined)
    # messages in completion order: the buffer ones, with the straddling ones slotted in
    nothing = np.zeros(0, np.int64)
    in_buffer = np.concatenate([nothing, *out.pos_parts])
    buffer_seg = np.concatenate([nothing, *out.owner_parts])
    extra_at = np.array(out.extra_order, np.int64)
    start = np.insert(in_buffer, extra_at, np.array(out.extra_pos, np.int64) + len(raw))
    owner_of = np.insert(buffer_seg, extra_at, np.array(out.extra_seg, np.int64))
    length = read_member(bv, lbmc.CONTROL_BASE, "msglen", start) if start.size else start
    msgs = decode_lbmc(bv, start, start + length, single=True)
    owner = owner_of[msgs.region]
    # the message's index among those its segment made deliverable
    index = (np.arange(msgs.count) - np.searchsorted(owner, owner, side="left")
             if msgs.count else np.zeros(0, np.int64))
    for i in np.flatnonzero(msgs.err != 0).tolist():
        out.note(int(owner[i]), f"lbttcp message {int(index[i])}: {msgs.error_text(i)}")

    rows = np.sort(np.concatenate([nothing, *out.row_parts]))
    columns = seg.identity(rows)
    columns["classified_by"] = constant_strings("port", len(rows))
    columns["payload_length"] = arrow_array(seg.plen[rows].astype(np.int32))
    columns["tcp_seq"] = arrow_array(seg.ints["seq"][rows], pa.int64())
    columns["retransmission"] = arrow_array(np.isin(rows, np.array(out.retx, np.int64)))
    ok = msgs.err == 0
    columns["messages"] = arrow_array(np.bincount(owner[ok], minlength=n)[rows], pa.int32())
    if out.reason:
        at = np.searchsorted(rows, np.fromiter(out.reason.keys(), np.int64, len(out.reason)))
        columns["malformed_reason"] = sparse_strings(
            len(rows), dict(zip(at.tolist(), out.reason.values(), strict=True)))
    packets = table_of(PACKETS_STORED, len(rows), columns)
    mident = {k: v for k, v in seg.identity(owner).items() if k in MESSAGES_SCHEMA.names}
    messages, headers = messages_table(bv, msgs, mident, transport[owner], msg_index=index,
                                       stored=stored)
    skips = Skips()
    for reason, skipped_rows in sorted(out.skips.items()):
        skips.add(seg.order[np.array(skipped_rows, np.int64)], reason)
    skipped = skips.table(seg.files(np.arange(n)),
                          numpy_of(seg.table.column("file_offset")).astype(np.int64))
    return DecodedTables(packets, messages, empty_table(ADVERTISEMENTS_STORED), skipped,
                         empty_table(TCP_SEGMENTS_STORED), headers)
