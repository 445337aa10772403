"""Columnar decode of captured frames into UM tables (numpy + pyarrow, no Spark).

Spark hands Python a batch of captured frames as an Arrow ``RecordBatch`` (see
:data:`FRAME_SCHEMA`).  Decoding it frame by frame with the object decoders of :mod:`wire`
costs tens of microseconds per packet; the analysis pipeline needs about one.  This module
therefore decodes whole batches at once:

* the ``data`` column's values buffer is read as one numpy byte array, and every fixed header
  (link, IPv4, UDP/TCP, LBT-RM, LBT-RU, the LBMC base and extended headers) is read for all
  rows that have it with *one* gather: a strided view (:class:`ByteView`) whose element ``i``
  is the ``size``-byte record starting at byte ``i``, indexed by the rows' header positions
  and then viewed with the layout's structured dtype (about ten times faster than one
  unaligned gather per member);
* those dtypes are :meth:`wire.fastpath.FastLayout.dtype` of the layouts :mod:`wire` derives
  from its Construct structs (``pcap.IP4``, ``lbtrm.LbtrmData.fast``, ``lbmc.HeaderKind.fast``
  ...).  No offset or size is written here;
* variable structure (LBT-RU option chains, LBMC messages in a datagram, LBMC header chains)
  is walked *breadth first*: iteration ``k`` reads the ``k``-th element of every row that still
  has one, so Python loops over the chain depth, not over packets (the last few rows of a
  very deep walk finish in a scalar loop);
* LBMR (topic resolution: a few packets per second per topic) is decoded packet by packet with
  :func:`wire.lbmr.parse_packet`;
* :func:`decode_chunk` takes the records of a capture reader chunk
  (:meth:`spark_analysis.splits.SplitReader.chunks`) where they lie in the read buffer, so the
  fast path never copies the capture into an Arrow ``data`` column;
* stage 1 counts TCP segments without payload and without SYN (pure ACKs) as skipped at once
  (stage 2 would only count them too) and hands the other candidate segments on grouped by
  connection direction, so each flow's payloads lie back to back;
* LBT-TCP byte streams are reassembled per connection direction in :func:`reassemble_tcp`.
  A stretch of in-order segments without holes or overlaps is framed in one pass over the
  payload buffer: breadth first over the segments when each holds whole messages (the usual
  case), else one short Python loop step per message, since each ``msglen`` says where the
  next message starts; anything else is replayed segment by segment with the Dissector's
  rules.  The framed messages go through the same vectorised LBMC decoder.

Every table is built column-wise; the Arrow types are Spark's (no unsigned integers), as
narrow as exact, because Spark ships every field of every row, null struct fields included.

Which frames are UM is :mod:`wire.detect`'s decision, the one detector ``ump dissect`` uses
too: tshark's port rules (:class:`wire.tshark.PortMap`), then, unless
:attr:`DecodeOptions.content_heuristics` is off, the content rules that find LBT-RM, LBT-RU
and LBMR (versions 0 and 1) on any UDP port.  :mod:`spark_analysis.classify` applies the
rules column-wise; the clean-decode half of the content rules uses the vectorised decoders
below.  A datagram claimed only by content that then fails to decode is counted as skipped
(not UM), never as a malformed UM packet.

Nothing is dropped silently.  Every frame ends up in exactly one place: a ``packets`` row (UM
packet, possibly with a ``malformed_reason``), or a count in ``skipped`` with the reason (not
IPv4, an IPv4 fragment whose datagram shows in another frame, no UM port rule, TCP without
payload ...).

IPv4 fragments of UDP datagrams go to stage 2 with the TCP segments and are reassembled there
(:mod:`spark_analysis.defrag`, the rules of :mod:`wire.ipdefrag`); each whole datagram is
decoded by stage 1 as a frame of its own, in the frame whose fragment completed it, where
tshark and the Dissector show it.

Differences from :class:`wire.dissect.Dissector` (which decodes frame by frame in capture
order), all deliberate:

* a UDP packet whose *n*-th LBMC message is bad still yields messages 1..n-1 (the packet row
  carries the reason), where the Dissector reports the whole frame as malformed;
* a fragment of a datagram that the capture never completes is counted as such
  (:data:`wire.ipdefrag.INCOMPLETE`); the Dissector, frame by frame, cannot know yet and says
  :data:`wire.ipdefrag.HELD`, as of every fragment that does not complete its datagram;
* LBT-TCP segments are reassembled in sequence-number order per connection direction (the
  Dissector uses capture order), so reordered segments reassemble instead of being reported as
  a gap plus a retransmission.  A message is reported with the frame that made it deliverable:
  the latest-captured frame of the stream up to the message's last byte (the completing frame
  when the capture is in order, exactly as tshark reports it).

The work is split by concern, one subject per module (this module runs the stages):

* :mod:`spark_analysis.schemas`: options, output schemas, the stored form, :class:`DecodedTables`;
* :mod:`spark_analysis.arrow_build`: column-wise header reads and Arrow array building;
* :mod:`spark_analysis.framing`: link, IPv4, UDP/TCP of every frame, and skipped counts;
* :mod:`spark_analysis.classify`: which UDP/TCP rows are UM (port rules, column-wise);
* :mod:`spark_analysis.lbmc_columns`: LBMC messages and their typed header columns;
* :mod:`spark_analysis.transport_columns`: LBT-RM and LBT-RU packets;
* :mod:`spark_analysis.lbmr_columns`: LBMR packets and advertisements;
* :mod:`spark_analysis.reassembly`: stage 2, LBT-TCP streams per connection direction;
* :mod:`spark_analysis.defrag`: stage 2, UDP datagrams from their IPv4 fragments.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence
from decimal import Decimal
from pathlib import Path

import numpy as np
import pyarrow as pa

from wire import pcap
from wire.detect import LBTRM_CONTENT_VERSIONS, LBTRU_CONTENT_VERSIONS

from .arrow_build import (  # re-exported: the public decode API
    ByteView,
    arrow_array,
    binary_array,
    empty_table,
    encode_files,
    member_at,
    null_array,
    numpy_of,
    table_of,
)
from .classify import (
    LBMR,
    LBTRM,
    LBTRU,
    classify_udp,
    lbmr_content_test,
    lbtrm_content_test,
    lbtru_content_test,
    tcp_candidates,
)
from .defrag import defragment
from .framing import (
    NETWORK_DECODE,
    PROTO_TCP,
    PROTO_UDP,
    Frames,
    Network,
    Skips,
    decode_network,
    frame_columns,
)
from .lbmr_columns import (
    decode_lbmr,
    lbmr_tables,
)
from .reassembly import (  # re-exported: the public decode API
    NO_PAYLOAD,
    reassemble_tcp,
)
from .schemas import (  # re-exported: the public decode API
    ADVERTISEMENTS_SCHEMA,
    ADVERTISEMENTS_STORED,
    CATEGORICAL_COLUMNS,
    DICTIONARY_STRING,
    FRAGMENT_PORT,
    FRAME_SCHEMA,
    HEADER_TABLE_SCHEMAS,
    MESSAGE_CORE_SCHEMA,
    MESSAGE_CORE_STORED,
    MESSAGE_HEADER_COLUMNS,
    MESSAGE_KEY,
    MESSAGES_SCHEMA,
    MESSAGES_STORED_WIDE,
    PACKETS_SCHEMA,
    PACKETS_STORED,
    SKIPPED_SCHEMA,
    STORED_SCHEMAS,
    TCP_SEGMENTS_SCHEMA,
    TCP_SEGMENTS_STORED,
    DecodedTables,
    DecodeOptions,
    concat_headers,
    concat_or_empty,
    concat_tables,
    dictionary_schema,
    flow_key_columns,
    join_headers,
    merge_skipped,
    split_messages,
)
from .splits import RecordChunk
from .transport_columns import (
    LBTRM_DECODER,
    LBTRU_DECODER,
    decode_udp,
    udp_tables,
)

__all__ = [
    "ADVERTISEMENTS_SCHEMA",
    "CATEGORICAL_COLUMNS",
    "DICTIONARY_STRING",
    "FRAME_SCHEMA",
    "HEADER_TABLE_SCHEMAS",
    "MESSAGES_SCHEMA",
    "MESSAGE_CORE_SCHEMA",
    "MESSAGE_HEADER_COLUMNS",
    "MESSAGE_KEY",
    "NETWORK_DECODE",
    "PACKETS_SCHEMA",
    "SKIPPED_SCHEMA",
    "STORED_SCHEMAS",
    "TCP_SEGMENTS_SCHEMA",
    "ByteView",
    "DecodeOptions",
    "DecodedTables",
    "concat_tables",
    "decode_batch",
    "decode_batches",
    "decode_chunk",
    "dictionary_schema",
    "encode_files",
    "flow_key_columns",
    "frames_batch",
    "frames_batch_from_capture",
    "join_headers",
    "member_at",
    "merge_skipped",
    "null_array",
    "reassemble",
    "reassemble_tcp",
    "split_messages",
]

# =============================================================================================
# Stage 1: a batch of frames
# =============================================================================================


def decode_batch(batch: pa.RecordBatch | pa.Table, options: DecodeOptions | None = None,
                 *, stored: bool = False) -> DecodedTables:
    """Stage 1 (stateless): every frame of ``batch`` to packets, messages, advertisements and
    skipped counts; TCP segments of candidate LBT-TCP connections go to ``tcp_segments``.
    With ``stored``, the tables come in the stored form (:class:`DecodedTables`)."""
    tables = _decode_frames(Frames.of(batch), options or DecodeOptions(), stored)
    return tables if stored else tables.public()


def decode_chunk(file: str, chunk: RecordChunk, options: DecodeOptions | None = None,
                 *, stored: bool = False) -> DecodedTables:
    """:func:`decode_batch` of the records of a reader chunk
    (:meth:`spark_analysis.splits.SplitReader.chunks`), read where they lie in the chunk's
    buffer: the same tables as decoding the Arrow batches of those records."""
    tables = _decode_frames(Frames.of_chunk(file, chunk), options or DecodeOptions(), stored)
    return tables if stored else tables.public()


def _decode_frames(fr: Frames, options: DecodeOptions, stored: bool) -> DecodedTables:
    ports = options.ports
    skips = Skips()
    net = decode_network(fr, skips)
    bv = fr.data.bv
    packets: list[pa.Table] = []
    messages: list[pa.Table] = []
    headers: list[dict[str, pa.Table]] = []
    adverts: list[pa.Table] = []

    udp = np.flatnonzero(net.proto == PROTO_UDP)
    proto = classify_udp(bv, net, udp, ports)
    open_rows = udp[proto == 0]
    if not options.content_heuristics:
        skips.add(open_rows, "UDP matches no UM port rule")
        open_rows = open_rows[:0]

    for decoder, code, versions in ((LBTRM_DECODER, LBTRM, LBTRM_CONTENT_VERSIONS),
                                    (LBTRU_DECODER, LBTRU, LBTRU_CONTENT_VERSIONS)):
        by_port = udp[proto == code]
        test = lbtrm_content_test if code == LBTRM else lbtru_content_test
        trial = open_rows[test(bv, net.pstart[open_rows], net.pend[open_rows])]
        rows = np.concatenate([by_port, trial])
        if not rows.size:
            continue
        res = decode_udp(decoder, bv, net, rows)
        n_port = len(by_port)
        content_ok = np.flatnonzero(res.clean(versions)[n_port:]) + n_port
        for positions, how in ((np.arange(n_port), "port"), (content_ok, "content")):
            if positions.size:
                p, m, h = udp_tables(fr, net, res, positions, how, stored)
                packets.append(p)
                messages.append(m)
                headers.append(h)
        open_rows = open_rows[~np.isin(open_rows, res.frame_rows[content_ok])]

    by_port = udp[proto == LBMR]
    for rows, how in ((by_port, "port"),
                      (open_rows[lbmr_content_test(bv, net.pstart[open_rows], net.pend[open_rows])],
                       "content")):
        if not rows.size:
            continue
        accepted, decoded = decode_lbmr(fr, net, rows, strict=how == "content")
        p, a = lbmr_tables(fr, net, decoded, how)
        packets.append(p)
        adverts.append(a)
        if how == "content":
            open_rows = open_rows[~np.isin(open_rows, rows[accepted])]
    skips.add(open_rows, "UDP matches no UM port rule and decodes as no UM protocol")

    tcp = np.flatnonzero(net.proto == PROTO_TCP)
    candidate = tcp_candidates(net, tcp, ports)
    skips.add(tcp[~candidate], "TCP matches no LBT-TCP port range")
    tcp = tcp[candidate]
    # Segments without payload matter to stage 2 only when they carry SYN (the start of a
    # stream epoch); the rest (pure ACKs, a quarter of a busy capture) are counted here
    # instead of being shipped there.
    empty = (net.pend[tcp] <= net.pstart[tcp]) & ((net.tcp_flags[tcp] & pcap.TCP_SYN) == 0)
    skips.add(tcp[empty], NO_PAYLOAD)
    tcp = tcp[~empty]
    # grouped by flow (capture order within): a flow's payloads then lie back to back in the
    # shipped buffer, and stage 2 gathers them in long runs
    tcp = tcp[np.lexsort((tcp, net.dport[tcp], net.dst[tcp], net.sport[tcp], net.src[tcp]))]
    segments = _tcp_segments_table(fr, net, tcp, stored)
    fragments = np.flatnonzero(net.fragment)
    if fragments.size:  # IPv4 fragments of UDP datagrams: reassembled in stage 2 too
        held = _tcp_segments_table(fr, net, fragments, stored)
        held = held.set_column(held.schema.get_field_index("src_port"), "src_port",
                               arrow_array(np.full(len(fragments), FRAGMENT_PORT, np.int32)))
        segments = pa.concat_tables([segments, held])

    return DecodedTables(
        concat_or_empty(packets, PACKETS_STORED),
        concat_or_empty(messages, MESSAGE_CORE_STORED if stored else MESSAGES_STORED_WIDE),
        concat_or_empty(adverts, ADVERTISEMENTS_STORED),
        skips.table(fr.files, fr.file_offset), segments, concat_headers(headers))


def _tcp_segments_table(fr: Frames, net: Network, rows: np.ndarray, stored: bool,
                        ) -> pa.Table:
    schema = TCP_SEGMENTS_STORED if stored else TCP_SEGMENTS_SCHEMA
    if not rows.size:
        return empty_table(schema)
    columns = frame_columns(fr, net, rows)  # no dotted addresses: stage 2 never reads them
    columns["seq"] = arrow_array(net.seq[rows], pa.int64())
    columns["tcp_flags"] = arrow_array(net.tcp_flags[rows], pa.int32())
    columns["payload"] = binary_array(fr.data.bv.data, net.pstart[rows],
                                      net.pend[rows] - net.pstart[rows])
    return table_of(schema, len(rows), columns)


# =============================================================================================
# Whole captures in one process, and frame batches for tests
# =============================================================================================


def reassemble(segments: pa.Table | pa.RecordBatch, options: DecodeOptions | None = None,
               *, stored: bool = False) -> DecodedTables:
    """Stage 2 (stateful) of a stage-2 input (:data:`TCP_SEGMENTS_SCHEMA`) holding every row
    of each flow and datagram it contains: LBT-TCP streams by :func:`reassemble_tcp`, and UDP
    datagrams made whole from their IPv4 fragments by
    :func:`spark_analysis.defrag.defragment`, then decoded by stage 1 as frames of their
    own.  With ``stored``, the tables come in the stored form (:class:`DecodedTables`)."""
    options = options or DecodeOptions()
    table = segments if isinstance(segments, pa.Table) else pa.Table.from_batches([segments])
    held = numpy_of(table.column("src_port")) == FRAGMENT_PORT  # (no scalars: see arrow_array)
    if not held.any():
        return reassemble_tcp(table, options, stored=stored)
    tcp = reassemble_tcp(table.filter(arrow_array(~held)), options, stored=stored)
    frames, skipped = defragment(table.filter(arrow_array(held)), options)
    udp = _decode_frames(Frames.of(frames), options, stored)
    udp.skipped = merge_skipped([udp.skipped, skipped])
    return concat_tables([tcp, udp if stored else udp.public()])


def decode_batches(batches: Iterable[pa.RecordBatch | pa.Table],
                   options: DecodeOptions | None = None) -> DecodedTables:
    """Both stages in one process: every batch through :func:`decode_batch`, then the
    stage-2 rows of all batches through :func:`reassemble` (TCP connections and fragmented
    datagrams may span batches)."""
    options = options or DecodeOptions()
    parts = [decode_batch(b, options) for b in batches]
    first = concat_tables(parts) if parts else DecodedTables.empty()
    second = reassemble(first.tcp_segments, options)
    return concat_tables([
        DecodedTables(first.packets, first.messages, first.advertisements, first.skipped,
                      empty_table(TCP_SEGMENTS_SCHEMA)),
        second,
    ])


def frames_batch(records: Iterable[pcap.CaptureRecord], file: str,
                 offsets: Sequence[int] | None = None) -> pa.RecordBatch:
    """A frame batch (:data:`FRAME_SCHEMA`) from :func:`wire.pcap.read_capture` records.

    For tests and small tools (Spark reads captures with ``spark.read.format("pcap")``).
    ``offsets`` are the records' byte offsets in the file; by default they are computed for a
    classic pcap file (24-byte file header, 16-byte record headers), which is what the test
    captures are.  Timestamps become integer nanoseconds from the float seconds' shortest
    decimal form (exact for microsecond and nanosecond captures of today's dates).
    """
    recs = list(records)
    if offsets is None:
        offsets, pos = [], 24
        for rec in recs:
            offsets.append(pos)
            pos += 16 + len(rec.data)
    return pa.RecordBatch.from_arrays([
        arrow_array([file] * len(recs), pa.string()),
        arrow_array(list(offsets), pa.int64()),
        arrow_array([int(Decimal(repr(rec.ts)).scaleb(9).to_integral_value()) for rec in recs],
                    pa.int64()),
        arrow_array([len(rec.data) for rec in recs], pa.int32()),
        arrow_array([rec.orig_len for rec in recs], pa.int32()),
        arrow_array([rec.linktype for rec in recs], pa.int32()),
        arrow_array([0] * len(recs), pa.int32()),
        arrow_array([rec.data for rec in recs], pa.binary()),
    ], schema=FRAME_SCHEMA)


def frames_batch_from_capture(path: str | Path) -> pa.RecordBatch:
    """Every frame of a classic pcap file as one frame batch (see :func:`frames_batch`).

    pcapng files are refused: their record offsets are not computable from the records
    alone; :func:`spark_analysis.splits.read_table` reads any capture with exact offsets."""
    with open(path, "rb") as fh:
        head = fh.read(4)
    if len(head) == 4 and struct.unpack("<I", head)[0] == pcap.PCAPNG_SHB:
        raise ValueError(f"{path} is pcapng: use spark_analysis.splits.read_table() for it")
    return frames_batch(pcap.read_capture(path), str(path))
