"""Stage 2 of the columnar decode, for UDP: datagrams reassembled from their IPv4 fragments.

Stage 1 cannot decode a fragment: the rest of its datagram may lie in another batch, split
or file.  So it hands every fragment of a UDP datagram on in the stage-2 input, beside the
LBT-TCP segments (:data:`spark_analysis.schemas.FRAGMENT_PORT` marks its rows), and the same
shuffle by :data:`~spark_analysis.schemas.FLOW_KEY` brings a datagram's fragments together:
their key (addresses, ``FRAGMENT_PORT``, identification) is the datagram's.

:func:`defragment` replays them in capture order through :class:`wire.ipdefrag.Defragmenter`
(the rules ``ump dissect`` applies, tshark's) and gives each completed datagram as a frame of
its own: a raw IPv4 frame (link type 101) at the file, offset and time of the fragment that
completed it, which stage 1 then decodes like any captured frame.  So a reassembled LBT-RM
datagram is one ``packets`` row in that frame, where tshark shows it, and every other
fragment is counted in ``skipped`` (:data:`wire.ipdefrag.HELD` or, when the capture never
completes its datagram, :data:`wire.ipdefrag.INCOMPLETE`).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wire import pcap
from wire.ipdefrag import HELD, INCOMPLETE, Defragmenter

from .arrow_build import (
    BinaryColumn,
    arrow_array,
    binary_array,
    empty_table,
    encode_files,
    numpy_of,
    running_offsets,
)
from .framing import Skips
from .schemas import FRAME_SCHEMA, SKIPPED_SCHEMA, DecodeOptions


def defragment(fragments: pa.Table, options: DecodeOptions) -> tuple[pa.RecordBatch, pa.Table]:
    """The completed datagrams of ``fragments`` (stage-2 rows marked
    :data:`~spark_analysis.schemas.FRAGMENT_PORT`; every fragment of each datagram they
    hold) as frames (:data:`~spark_analysis.schemas.FRAME_SCHEMA`), and the skipped counts
    of the fragments that show no datagram.  Any row order: they are replayed in capture
    order (each file in record order, as tshark reads it, the files in the order of their
    first fragment's time, then of their names).  With
    :attr:`DecodeOptions.separate_files` a file's fragments never meet another's."""
    n = fragments.num_rows
    if not n:
        return _frames([], np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, bool),
                       []), empty_table(SKIPPED_SCHEMA)
    files = encode_files(fragments.column("file"))
    names = files.dictionary.to_pylist()
    codes = numpy_of(files.indices).astype(np.int64)
    rank = np.empty(len(names), np.int64)
    rank[sorted(range(len(names)), key=names.__getitem__)] = np.arange(len(names))

    def ints(name: str, null: int = 0) -> np.ndarray:
        col = fragments.column(name)
        if col.null_count:  # arrays only: an Arrow scalar from Python would import pandas
            col = pc.if_else(pc.is_valid(col), col,
                             arrow_array(np.full(len(col), null, np.int64), col.type))
        return numpy_of(col).astype(np.int64)

    ts_column = fragments.column("ts_ns")
    ts_valid = (numpy_of(pc.is_valid(ts_column)).astype(bool) if ts_column.null_count
                else np.ones(n, bool))
    offset_in_file, ts = ints("file_offset"), ints("ts_ns", np.iinfo(np.int64).max)
    # capture order: the files in the order of their first fragment's time (a rotated
    # capture's), each in its own record order (timestamps may step back within a file)
    first = np.full(len(names), np.iinfo(np.int64).max, np.int64)
    np.minimum.at(first, codes, ts)
    file_order = np.empty(len(names), np.int64)
    file_order[np.lexsort((rank, first))] = np.arange(len(names))
    order = np.lexsort((offset_in_file, file_order[codes]))
    src, dst, ident = ints("src_ip_int"), ints("dst_ip_int"), ints("dst_port")
    at, more = ints("seq"), ints("tcp_flags")
    payload = BinaryColumn.of(fragments.column("payload"))
    buffer = payload.bv.data.data
    starts, lengths = payload.starts, payload.lengths
    scope = codes if options.separate_files else np.zeros(n, np.int64)

    done: Defragmenter[int] = Defragmenter()
    made: list[int] = []  # the completing rows
    datagrams: list[bytes] = []  # ... and their datagrams' IP payloads
    held: list[int] = []
    columns = (scope[order], src[order], dst[order], ident[order], at[order],
               more[order] != 0, starts[order], starts[order] + lengths[order])
    for row, key_scope, key_src, key_dst, key_ident, offset, follows, a, b in zip(
            order.tolist(), *(c.tolist() for c in columns), strict=True):
        whole = done.add_piece((key_scope, key_src, key_dst, key_ident), offset, follows,
                               bytes(buffer[a:b]), row)
        if whole is not None:
            made.append(row)
            datagrams.append(whole.payload)
            held.extend(whole.tags[:-1])
    skips = Skips()
    skips.add(np.array(held, np.int64), HELD)
    skips.add(np.array([row for tags in done.pending() for row in tags], np.int64), INCOMPLETE)
    skipped = skips.table(files, offset_in_file)
    rows = np.array(made, np.int64)
    return _frames([names[codes[r]] for r in made], offset_in_file[rows], ts[rows],
                   ts_valid[rows], _ipv4(src[rows], dst[rows], datagrams)), skipped


def _ipv4(src: np.ndarray, dst: np.ndarray, payloads: list[bytes]) -> list[bytes]:
    """Raw IPv4 datagrams (no link header) of reassembled UDP payloads: each header says what
    the fragments' headers said of the whole, with no fragment bits (the headers are made
    at once through the layout's numpy form; the checksum is left 0, as no reader here
    checks it)."""
    heads = np.zeros(len(payloads), pcap.IP4.dtype())
    heads["ver_ihl"], heads["ttl"], heads["protocol"] = 0x45, 64, pcap.PROTO_UDP
    heads["total_length"] = pcap.IP4.size + np.array([len(p) for p in payloads], np.int64)
    heads["src"], heads["dst"] = src, dst
    raw, size = heads.tobytes(), pcap.IP4.size
    return [raw[i * size:(i + 1) * size] + p for i, p in enumerate(payloads)]


def _frames(files: list[str], offsets: np.ndarray, ts: np.ndarray, ts_valid: np.ndarray,
            data: list[bytes]) -> pa.RecordBatch:
    """A frame batch of raw IPv4 datagrams (built from buffers: a decode task never imports
    pandas, see :func:`spark_analysis.arrow_build.arrow_array`)."""
    k = len(data)
    sizes = np.array([len(d) for d in data], np.int64)
    joined = np.frombuffer(b"".join(data), np.uint8)
    return pa.RecordBatch.from_arrays([
        arrow_array(files, pa.string()),
        arrow_array(offsets, pa.int64()),
        arrow_array(ts, pa.int64(), mask=~ts_valid),
        arrow_array(sizes, pa.int32()),
        arrow_array(sizes, pa.int32()),
        arrow_array(np.full(k, pcap.LINKTYPE_RAW, np.int32)),
        arrow_array(np.zeros(k, np.int32)),
        binary_array(joined, running_offsets(sizes)[:-1], sizes),
    ], schema=FRAME_SCHEMA)
