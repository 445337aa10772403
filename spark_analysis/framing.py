"""Network framing of a batch of captured frames, column-wise: link, IPv4, UDP/TCP.

:class:`Frames` holds one input batch; :func:`decode_network` reads the link header
(Ethernet with VLAN tags, Linux SLL/SLL2, null/loopback, raw IP), IPv4 and UDP/TCP of every
frame at once into a :class:`Network` (compiled ``_netheaders.c`` where built, else numpy:
the same result).  What does not get as far as a UDP/TCP payload is counted in
:class:`Skips` with the reason :func:`wire.pcap.decode_frame` would give: nothing is
dropped silently.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from wire import pcap
from wire.fastpath import FastLayout
from wire.ipdefrag import keyed_ident

from .arrow_build import (
    BinaryColumn,
    ByteView,
    arrow_array,
    constant_strings,
    empty_table,
    ipv4_strings,
    masked_array,
    member_at,
    numpy_of,
    read_member,
    read_members,
)
from .schemas import (
    FRAME_SCHEMA,
    SKIPPED_SCHEMA,
)
from .splits import RecordChunk

# =============================================================================================
# Skipped frames
# =============================================================================================


class Skips:
    """Frames that are not UM packets, by reason (aggregated per file at the end)."""

    def __init__(self) -> None:
        self._parts: list[tuple[np.ndarray, str]] = []

    def add(self, rows: np.ndarray, reason: str) -> None:
        if len(rows):
            self._parts.append((np.asarray(rows, np.int64), reason))

    def parts(self) -> list[tuple[np.ndarray, str]]:
        """The rows added so far, with their reasons."""
        return list(self._parts)

    def add_by_value(self, rows: np.ndarray, values: np.ndarray,
                     reason: Callable[[int], str]) -> None:
        """Rows whose reason depends on a small set of values (a link type, a protocol)."""
        if not len(rows):
            return
        for value in np.unique(values):
            self.add(rows[values == value], reason(int(value)))

    def table(self, files: pa.Array, offsets: np.ndarray) -> pa.Table:
        """Frames and first offset per (file, reason), sorted by both; ``files`` gives each
        frame row's file (a dictionary array: grouped by its codes, in numpy)."""
        if not self._parts:
            return empty_table(SKIPPED_SCHEMA)
        if not pa.types.is_dictionary(files.type):
            files = pc.dictionary_encode(files)
        reasons = sorted({reason for _, reason in self._parts})
        number = {reason: i for i, reason in enumerate(reasons)}
        rows = np.concatenate([r for r, _ in self._parts])
        reason = np.concatenate([np.full(len(r), number[text], np.int64)
                                 for r, text in self._parts])
        names = files.dictionary.to_pylist()
        file_rank = np.argsort(np.argsort(np.array(names, object), kind="stable"))
        code = numpy_of(files.indices).astype(np.int64)[rows]
        key = file_rank[code] * len(reasons) + reason
        order = np.lexsort((offsets[rows], key))
        key, first_offset = key[order], offsets[rows][order]
        starts = np.flatnonzero(np.diff(key, prepend=-1))
        counts = np.diff(np.append(starts, len(key)))
        by_rank = np.argsort(file_rank)
        return pa.table({
            "file": arrow_array([names[i] for i in by_rank[key[starts] // len(reasons)]],
                             pa.string()),
            "reason": arrow_array([reasons[i] for i in key[starts] % len(reasons)], pa.string()),
            "frames": arrow_array(counts, pa.int64()),
            "first_file_offset": arrow_array(first_offset[starts], pa.int64()),
        }, schema=SKIPPED_SCHEMA)


# =============================================================================================
# Link, IPv4, UDP/TCP
# =============================================================================================

PROTO_UDP, PROTO_TCP = 17, 6
_NULL_FAMILY_INET = 2
_IPV4_ETHERTYPE = 0x0800
_VLAN_ETHERTYPES = pcap.VLAN_ETHERTYPES
_RAW_LINKTYPES = (pcap.LINKTYPE_RAW, pcap.LINKTYPE_IPV4, 12)
_FRAG_OFFSET, _MORE_FRAGMENTS = pcap.IP_FRAGMENT_OFFSET, pcap.IP_MORE_FRAGMENTS
_TCP_FLAG_BITS = 0x3F  # FIN, SYN, RST, PSH, ACK, URG
_U32 = np.dtype(">u4")
_U32LE = np.dtype("<u4")

_NETWORK_SKIPS: dict[str, str | Callable[[int], str]] = {
    "link": lambda v: f"unsupported or truncated link layer (link type {v})",
    "not_ipv4": pcap.not_ipv4_reason,
    "ipv4_truncated": "truncated IPv4 header",
    "not_ipv4_header": "not an IPv4 header",
    "later_fragment": pcap.LATER_FRAGMENT_REASON,  # (and a first one of neither UDP nor TCP)
    "short_fragment": pcap.SHORT_FRAGMENT_REASON,
    "udp_truncated": "truncated UDP header",
    "tcp_truncated": "truncated TCP header",
    "not_udp_tcp": lambda v: f"IP protocol {v} is neither UDP nor TCP",
    "tcp_data_offset": "TCP data offset does not fit the segment",
    "tcp_fragment": pcap.TCP_FRAGMENT_REASON,
}
"""Why :func:`decode_network` skips a frame, by the names both of its versions use (the
reasons of :func:`wire.pcap.decode_frame`); a function of the link type, ethertype or IP
protocol where the reason names one."""


def _skip_network(skips: Skips, reason: str, rows: np.ndarray,
                  values: np.ndarray | None = None) -> None:
    text = _NETWORK_SKIPS[reason]
    if callable(text):
        assert values is not None
        skips.add_by_value(rows, values, text)
    else:
        skips.add(rows, text)


def _be_member(layout: FastLayout, member: str, width: int) -> int:
    """The offset of ``member``, which the compiled header decode reads as an unsigned
    big-endian integer of ``width`` bytes (TypeError if the wire/ layout disagrees)."""
    dtype, offset = member_at(layout, member)
    if dtype.kind != "u" or dtype.itemsize != width or (width > 1 and dtype.byteorder != ">"):
        raise TypeError(f"the header decode reads {member} as a big-endian {width}-byte "
                        f"unsigned integer; the layout has {dtype}")
    return offset


def _network_params() -> dict[str, int]:
    """The parameters of the compiled header decode (``_netheaders.c``), by name: every
    size, offset and constant it uses, from the wire/ layouts and the constants above."""
    raw_a, raw_b, raw_c = _RAW_LINKTYPES
    vlan_a, vlan_b = _VLAN_ETHERTYPES
    return {
        "linktype_ethernet": pcap.LINKTYPE_ETHERNET, "linktype_sll": pcap.LINKTYPE_LINUX_SLL,
        "linktype_sll2": pcap.LINKTYPE_LINUX_SLL2, "linktype_null": pcap.LINKTYPE_NULL,
        "linktype_raw_a": raw_a, "linktype_raw_b": raw_b, "linktype_raw_c": raw_c,
        "eth_size": pcap.ETH.size, "eth_type_at": _be_member(pcap.ETH, "ethertype", 2),
        "vlan_size": pcap.VLAN.size, "vlan_type_at": _be_member(pcap.VLAN, "ethertype", 2),
        "vlan_tci_at": _be_member(pcap.VLAN, "tci", 2), "vlan_id_mask": pcap.VLAN_ID_MASK,
        "vlan_tpid_a": vlan_a, "vlan_tpid_b": vlan_b,
        "sll_size": pcap.SLL.size, "sll_protocol_at": _be_member(pcap.SLL, "protocol", 2),
        "sll2_size": pcap.SLL2.size, "sll2_protocol_at": _be_member(pcap.SLL2, "protocol", 2),
        "null_header_size": _U32LE.itemsize, "null_family_inet": _NULL_FAMILY_INET,
        "ipv4_ethertype": _IPV4_ETHERTYPE,
        "ip_size": pcap.IP4.size, "ip_ver_ihl_at": _be_member(pcap.IP4, "ver_ihl", 1),
        "ip_total_length_at": _be_member(pcap.IP4, "total_length", 2),
        "ip_flags_frag_at": _be_member(pcap.IP4, "flags_frag", 2),
        "ip_ident_at": _be_member(pcap.IP4, "ident", 2),
        "ip_protocol_at": _be_member(pcap.IP4, "protocol", 1),
        "ip_src_at": _be_member(pcap.IP4, "src", 4), "ip_dst_at": _be_member(pcap.IP4, "dst", 4),
        "frag_offset_mask": _FRAG_OFFSET, "more_fragments_mask": _MORE_FRAGMENTS,
        "proto_udp": PROTO_UDP, "proto_tcp": PROTO_TCP,
        "udp_size": pcap.UDP.size, "udp_sport_at": _be_member(pcap.UDP, "sport", 2),
        "udp_dport_at": _be_member(pcap.UDP, "dport", 2),
        "tcp_size": pcap.TCP.size, "tcp_sport_at": _be_member(pcap.TCP, "sport", 2),
        "tcp_dport_at": _be_member(pcap.TCP, "dport", 2),
        "tcp_seq_at": _be_member(pcap.TCP, "seq", 4),
        "tcp_offset_flags_at": _be_member(pcap.TCP, "offset_flags", 2),
        "tcp_flags_mask": _TCP_FLAG_BITS,
    }


_compiled_network: Callable[..., None] | None
try:
    from . import _netheaders
except ImportError:  # built without a C compiler (see setup.py): the numpy version runs
    _netheaders = None  # type: ignore[assignment]
    _compiled_network = None
    _NETWORK_PARAM_ARRAY = np.zeros(0, np.int64)
else:
    _compiled_network = _netheaders.decode
    _NETWORK_PARAM_ARRAY = np.array([_network_params()[name] for name in _netheaders.PARAMS],
                                    np.int64)

NETWORK_DECODE = "compiled" if _compiled_network is not None else "numpy"
"""Which header decode this process runs: ``"compiled"`` (``_netheaders.c``) or ``"numpy"``."""


@dataclass
class Frames:
    """One input batch: identity columns and the frame bytes."""

    n: int
    files: pa.Array
    file_offset: np.ndarray
    ts_ns: pa.Array  # may hold nulls (pcapng simple packet blocks carry no time)
    linktype: np.ndarray
    data: BinaryColumn
    single_file: str | None = None  # the one file of the batch (the usual case)

    @classmethod
    def of(cls, batch: pa.RecordBatch | pa.Table) -> Frames:
        names = set(batch.schema.names)
        missing = [c for c in ("file", "file_offset", "ts_ns", "linktype", "data")
                   if c not in names]
        if missing:
            raise ValueError(f"frame batch lacks column(s) {missing}; "
                             f"expected {FRAME_SCHEMA.names}")

        def column(name: str) -> pa.Array:
            col = batch.column(name)
            if isinstance(col, pa.ChunkedArray):
                col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            return col

        def ints(name: str) -> np.ndarray:
            col = column(name)
            if col.null_count:
                raise ValueError(f"frame column {name!r} has nulls")
            return numpy_of(col).astype(np.int64)

        files = column("file")
        if not pa.types.is_string(files.type):
            files = files.cast(pa.string())
        ts_ns = column("ts_ns")
        if ts_ns.type != pa.int64():
            ts_ns = ts_ns.cast(pa.int64())
        single = None
        if len(files) and not files.null_count and pc.all(pc.equal(files, files[0])).as_py():
            single = files[0].as_py()
        files = pc.dictionary_encode(files)  # taken per table row: codes, not texts
        return cls(len(batch), files, ints("file_offset"), ts_ns, ints("linktype"),
                   BinaryColumn.of(column("data")), single)

    @classmethod
    def of_chunk(cls, file: str, chunk: RecordChunk) -> Frames:
        """The records of a reader chunk, bytes read in place (nothing copied or packed)."""
        n = len(chunk)
        valid = chunk.ts_valid
        ts_ns = masked_array(chunk.ts_ns, valid, pa.int64())
        data = BinaryColumn(ByteView(np.frombuffer(chunk.buf, np.uint8)),
                            chunk.data_at.astype(np.int64), chunk.caplen.astype(np.int64))
        return cls(n, constant_strings(file, n), chunk.offset.astype(np.int64), ts_ns,
                   chunk.linktype.astype(np.int64), data, file)

    def take(self, rows: np.ndarray) -> Frames:
        """The frames ``rows`` (their bytes stay where they are)."""
        take = arrow_array(rows)
        return Frames(len(rows), self.files.take(take), self.file_offset[rows],
                      self.ts_ns.take(take), self.linktype[rows],
                      BinaryColumn(self.data.bv, self.data.starts[rows], self.data.lengths[rows]),
                      self.single_file)


@dataclass
class Network:
    """Per frame row (length n; meaningful where ``proto`` is set): the L4 view.

    A row of ``fragment`` (an IPv4 fragment of a UDP datagram, held for reassembly in stage
    2: :mod:`wire.ipdefrag`) has no ``proto``; its ``src`` and ``dst`` are the IP addresses,
    ``dport`` the identification it is keyed by (:func:`wire.ipdefrag.keyed_ident`: the IP
    identification, with the VLAN ID above it for some addresses), ``seq`` the fragment's
    byte offset in the datagram,
    ``tcp_flags`` 1 when more fragments follow, and ``pstart``/``pend`` bound its IP
    payload."""

    proto: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    sport: np.ndarray
    dport: np.ndarray
    pstart: np.ndarray  # absolute position of the L4 payload in the data buffer
    pend: np.ndarray
    seq: np.ndarray
    tcp_flags: np.ndarray
    fragment: np.ndarray
    text: dict[str, tuple[np.ndarray, pa.Array]] = field(default_factory=dict)
    # per row ``type << 8 | code`` of the ICMP error quoting the UDP datagram (-1: not
    # quoted); None when no row of the batch is (the usual case: no column work at all)
    icmp: np.ndarray | None = None

    @classmethod
    def empty(cls, n: int) -> Network:
        def zeros() -> np.ndarray:
            return np.zeros(n, np.int64)
        return cls(proto=zeros(), src=zeros(), dst=zeros(), sport=zeros(), dport=zeros(),
                   pstart=zeros(), pend=zeros(), seq=zeros(), tcp_flags=zeros(),
                   fragment=np.zeros(n, bool))

    def ip_strings(self, which: str, rows: np.ndarray) -> pa.Array:
        """Dotted ``src``/``dst`` of ``rows``; the batch's few distinct addresses are found
        (hashed) and formatted once per batch."""
        cached = self.text.get(which)
        if cached is None:
            encoded = ipv4_strings(getattr(self, which))
            cached = self.text[which] = (numpy_of(encoded.indices), encoded.dictionary)
        indices, dictionary = cached
        return pa.DictionaryArray.from_arrays(arrow_array(indices[rows]), dictionary)


def decode_network(fr: Frames, skips: Skips) -> Network:
    """Link header (Ethernet with VLAN tags, Linux SLL/SLL2, null/loopback, raw IP) and IPv4,
    then UDP/TCP, for every frame at once; what does not get that far is counted in ``skips``
    with the reasons :func:`wire.pcap.decode_frame` gives (:data:`_NETWORK_SKIPS`).

    Compiled (``_netheaders.c``: one pass over the frames) where built, else in numpy
    (:func:`_decode_network_numpy`, some fifty passes over columns); the same result either
    way.  Measured on the benchmark capture: about 300 ns a frame in numpy."""
    if _compiled_network is None:
        return _keyed(_decode_network_numpy(fr, skips))
    out = np.empty((len(_netheaders.OUTPUTS), fr.n), np.int64)
    _compiled_network(fr.data.bv.data, np.ascontiguousarray(fr.data.starts, np.int64),
                      np.ascontiguousarray(fr.data.lengths, np.int64),
                      np.ascontiguousarray(fr.linktype, np.int64), _NETWORK_PARAM_ARRAY, out)
    o = dict(zip(_netheaders.OUTPUTS, out, strict=True))
    skipped = np.flatnonzero(o["status"])
    codes = o["status"][skipped]
    icmp_rows = np.zeros(0, np.int64)
    for code in np.unique(codes).tolist():
        which = skipped[codes == code]
        reason = _netheaders.REASONS[code]
        if reason == "not_udp_tcp":  # ICMP errors may quote UDP: the numpy decode reads them
            icmp = o["value"][which] == pcap.PROTO_ICMP
            icmp_rows, which = which[icmp], which[~icmp]
        _skip_network(skips, reason, which, o["value"][which])
    net = Network(proto=o["proto"], src=o["src"], dst=o["dst"], sport=o["sport"],
                  dport=o["dport"], pstart=o["pstart"], pend=o["pend"], seq=o["seq"],
                  tcp_flags=o["tcp_flags"], fragment=o["fragment"].astype(bool))
    if icmp_rows.size:
        _merge_rows(net, icmp_rows, fr.take(icmp_rows), skips)
    return _keyed(net)


def _keyed(net: Network) -> Network:
    """``net`` with its fragments' ``dport`` (the IP identification, the innermost VLAN tag's
    ID above it, as both decodes give it) made the identification they are keyed by
    (:func:`wire.ipdefrag.keyed_ident`)."""
    rows = np.flatnonzero(net.fragment)
    if rows.size:
        raw = net.dport[rows]
        net.dport[rows] = keyed_ident(raw & 0xFFFF, raw >> 16, net.src[rows], net.dst[rows])
    return net


def _merge_rows(net: Network, rows: np.ndarray, sub: Frames, skips: Skips) -> None:
    """Decode the frames ``rows`` (``sub`` holds them) with :func:`_decode_network_numpy`
    into ``net``: how the compiled decode hands over the rare frames it does not read (ICMP
    errors quoting a datagram)."""
    sub_skips = Skips()
    got = _decode_network_numpy(sub, sub_skips)
    for part, reason in sub_skips.parts():
        skips.add(rows[part], reason)
    for name in ("proto", "src", "dst", "sport", "dport", "pstart", "pend", "seq",
                 "tcp_flags", "fragment"):
        getattr(net, name)[rows] = getattr(got, name)
    if got.icmp is not None:
        if net.icmp is None:
            net.icmp = np.full(len(net.proto), -1, np.int64)
        net.icmp[rows] = got.icmp


def _decode_network_numpy(fr: Frames, skips: Skips) -> Network:
    """:func:`decode_network` in numpy: the reference the compiled version is held to."""
    n = fr.n
    bv, start, length, lt = fr.data.bv, fr.data.starts, fr.data.lengths, fr.linktype
    l3 = np.full(n, -1, np.int64)
    etype = np.zeros(n, np.int64)

    rows = np.flatnonzero((lt == pcap.LINKTYPE_ETHERNET) & (length >= pcap.ETH.size))
    etype[rows] = read_member(bv, pcap.ETH, "ethertype", start[rows])
    l3[rows] = pcap.ETH.size
    tagged = rows
    vlan = np.zeros(n, np.int64)  # the innermost tag's VLAN ID
    while tagged.size:
        tagged = tagged[np.isin(etype[tagged], _VLAN_ETHERTYPES)
                        & (length[tagged] >= l3[tagged] + pcap.VLAN.size)]
        vlan[tagged] = read_member(bv, pcap.VLAN, "tci",
                                   start[tagged] + l3[tagged]) & pcap.VLAN_ID_MASK
        etype[tagged] = read_member(bv, pcap.VLAN, "ethertype", start[tagged] + l3[tagged])
        l3[tagged] += pcap.VLAN.size
    for linktype, layout in ((pcap.LINKTYPE_LINUX_SLL, pcap.SLL),
                             (pcap.LINKTYPE_LINUX_SLL2, pcap.SLL2)):
        rows = np.flatnonzero((lt == linktype) & (length >= layout.size))
        etype[rows] = read_member(bv, layout, "protocol", start[rows])
        l3[rows] = layout.size
    rows = np.flatnonzero((lt == pcap.LINKTYPE_NULL) & (length >= _U32LE.itemsize))
    family = bv.read(_U32LE, start[rows]).astype(np.int64)
    family = np.where(family > 0xFFFF, bv.read(_U32, start[rows]).astype(np.int64), family)
    etype[rows] = np.where(family == _NULL_FAMILY_INET, _IPV4_ETHERTYPE, 0)
    l3[rows] = _U32LE.itemsize
    rows = np.flatnonzero(np.isin(lt, _RAW_LINKTYPES) & (length >= 1))
    etype[rows] = np.where(bv.u8(start[rows]) >> 4 == 4, _IPV4_ETHERTYPE, 0)
    l3[rows] = 0

    unsupported = np.flatnonzero(l3 < 0)
    _skip_network(skips, "link", unsupported, lt[unsupported])
    not_ip = np.flatnonzero((l3 >= 0) & (etype != _IPV4_ETHERTYPE))
    _skip_network(skips, "not_ipv4", not_ip, etype[not_ip])

    rows = np.flatnonzero((l3 >= 0) & (etype == _IPV4_ETHERTYPE))
    short = length[rows] - l3[rows] < pcap.IP4.size
    _skip_network(skips, "ipv4_truncated", rows[short])
    rows = rows[~short]
    ip = read_members(bv, pcap.IP4, start[rows] + l3[rows],
                      ("ver_ihl", "total_length", "ident", "flags_frag", "protocol", "src",
                       "dst"))
    ihl = (ip["ver_ihl"] & 0x0F) * 4
    bad = (ip["ver_ihl"] >> 4 != 4) | (ihl < pcap.IP4.size)
    _skip_network(skips, "not_ipv4_header", rows[bad])
    more = (ip["flags_frag"] & _MORE_FRAGMENTS) != 0
    offset = ip["flags_frag"] & _FRAG_OFFSET
    held = ~bad & (more | (offset != 0)) & (ip["protocol"] == PROTO_UDP)
    # what tshark does not add to a reassembly: a first fragment is decoded as far as it
    # goes, a later one is not decoded
    held &= (length[rows] >= l3[rows] + ip["total_length"]) & (ip["total_length"] > ihl)
    is_udp = ip["protocol"] == PROTO_UDP
    short = ~bad & ~held & is_udp & (offset != 0)
    _skip_network(skips, "short_fragment", rows[short])
    later = ~bad & ~is_udp & ((offset != 0) | (
        more & (ip["protocol"] != PROTO_TCP) & (length[rows] >= l3[rows] + ip["total_length"])
        & (ip["total_length"] > ihl)))  # tshark holds any whole first fragment but TCP's
    _skip_network(skips, "later_fragment", rows[later])

    net = Network.empty(n)
    r = rows[held]  # fragments of UDP datagrams, held for stage 2 (see Network)
    net.fragment[r] = True
    net.src[r], net.dst[r] = ip["src"][held], ip["dst"][held]
    net.dport[r] = ip["ident"][held] | vlan[r] << 16  # (keyed in decode_network)
    net.seq[r], net.tcp_flags[r] = offset[held] * 8, more[held]
    net.pstart[r] = start[r] + l3[r] + ihl[held]
    net.pend[r] = start[r] + l3[r] + ip["total_length"][held]

    keep = ~bad & ~later & ~held & ~short
    rows, ihl, first_fragment = rows[keep], ihl[keep], more[keep]
    ip = {k: v[keep] for k, v in ip.items()}
    end = np.minimum(length[rows], l3[rows] + ip["total_length"])
    body = l3[rows] + ihl
    proto = ip["protocol"]

    udp = proto == PROTO_UDP
    short = udp & (end - body < pcap.UDP.size)
    _skip_network(skips, "udp_truncated", rows[short])
    udp &= ~short
    tcp = proto == PROTO_TCP
    short = tcp & (end - body < pcap.TCP.size)
    _skip_network(skips, "tcp_truncated", rows[short])
    tcp &= ~short
    other = (proto != PROTO_UDP) & (proto != PROTO_TCP)
    quoted = _icmp_quoted(bv, start[rows], body, end, other & (proto == pcap.PROTO_ICMP))
    other &= ~quoted.ok
    _skip_network(skips, "not_udp_tcp", rows[other], proto[other])

    r = rows[udp]
    ports = read_members(bv, pcap.UDP, start[r] + body[udp], ("sport", "dport"))
    net.proto[r] = PROTO_UDP
    net.sport[r], net.dport[r] = ports["sport"], ports["dport"]
    net.pstart[r] = start[r] + body[udp] + pcap.UDP.size
    net.pend[r] = start[r] + end[udp]

    r = rows[tcp]
    head = read_members(bv, pcap.TCP, start[r] + body[tcp],
                        ("sport", "dport", "seq", "offset_flags"))
    words = head["offset_flags"] >> 12
    pstart = body[tcp] + words * 4
    bad = (words * 4 < pcap.TCP.size) | (pstart > end[tcp])
    _skip_network(skips, "tcp_data_offset", r[bad])
    fragment = first_fragment[tcp] & ~bad
    _skip_network(skips, "tcp_fragment", r[fragment])
    good = ~bad & ~fragment
    r = r[good]
    net.proto[r] = PROTO_TCP
    net.sport[r], net.dport[r] = head["sport"][good], head["dport"][good]
    net.seq[r] = head["seq"][good]
    net.tcp_flags[r] = head["offset_flags"][good] & _TCP_FLAG_BITS
    net.pstart[r] = start[r] + pstart[good]
    net.pend[r] = start[r] + end[tcp][good]

    r = rows[udp | tcp]
    net.src[r], net.dst[r] = ip["src"][udp | tcp], ip["dst"][udp | tcp]

    if quoted.ok.any():  # the UDP datagram an ICMP error quotes, with its own addresses
        r, q = rows[quoted.ok], quoted.ok
        net.proto[r] = PROTO_UDP
        net.src[r], net.dst[r] = quoted.src[q], quoted.dst[q]
        net.sport[r], net.dport[r] = quoted.sport[q], quoted.dport[q]
        net.pstart[r] = start[r] + quoted.pstart[q]
        net.pend[r] = start[r] + quoted.pend[q]
        net.icmp = np.full(n, -1, np.int64)
        net.icmp[r] = quoted.icmp[q]
    return net


@dataclass
class _Quoted:
    """Per IPv4 row: the UDP datagram an ICMP error quotes (``ok``), as
    :func:`wire.pcap.decode_frame` reads it (:data:`wire.pcap.ICMP_ERROR_TYPES`); payload
    positions relative to the frame start."""

    ok: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    sport: np.ndarray
    dport: np.ndarray
    pstart: np.ndarray
    pend: np.ndarray
    icmp: np.ndarray


def _icmp_quoted(bv: ByteView, start: np.ndarray, body: np.ndarray, end: np.ndarray,
                 candidate: np.ndarray) -> _Quoted:
    n = len(start)
    out = _Quoted(*(np.zeros(n, bool if i == 0 else np.int64) for i in range(8)))
    rows = np.flatnonzero(candidate & (end - body >= pcap.ICMP.size + pcap.IP4.size))
    if not rows.size:
        return out
    icmp = read_members(bv, pcap.ICMP, start[rows] + body[rows], ("type", "code"))
    rows_ok = np.isin(icmp["type"], pcap.ICMP_ERROR_TYPES)
    rows, kind = rows[rows_ok], (icmp["type"] << 8 | icmp["code"])[rows_ok]
    inner = body[rows] + pcap.ICMP.size
    ip = read_members(bv, pcap.IP4, start[rows] + inner,
                      ("ver_ihl", "total_length", "flags_frag", "protocol", "src", "dst"))
    ihl = (ip["ver_ihl"] & 0x0F) * 4
    udp = inner + ihl
    good = ((ip["ver_ihl"] >> 4 == 4) & (ihl >= pcap.IP4.size)
            & (ip["protocol"] == pcap.PROTO_UDP) & ((ip["flags_frag"] & _FRAG_OFFSET) == 0)
            & (end[rows] - udp >= pcap.UDP.size))
    rows, udp, kind, inner = rows[good], udp[good], kind[good], inner[good]
    ip = {k: v[good] for k, v in ip.items()}
    ports = read_members(bv, pcap.UDP, start[rows] + udp, ("sport", "dport"))
    out.ok[rows] = True
    out.src[rows], out.dst[rows] = ip["src"], ip["dst"]
    out.sport[rows], out.dport[rows] = ports["sport"], ports["dport"]
    out.pstart[rows] = udp + pcap.UDP.size
    out.pend[rows] = np.maximum(out.pstart[rows],
                                np.minimum(end[rows], inner + ip["total_length"]))
    out.icmp[rows] = kind
    return out


def frame_columns(fr: Frames, net: Network, frame_rows: np.ndarray) -> dict[str, pa.Array]:
    """The frame's file, offset and time and its addresses and ports as numbers."""
    take = arrow_array(frame_rows)
    return {
        "file": (constant_strings(fr.single_file, len(frame_rows)) if fr.single_file is not None
                 else fr.files.take(take)),
        "file_offset": arrow_array(fr.file_offset[frame_rows], pa.int64()),
        "ts_ns": fr.ts_ns.take(take),
        "src_port": arrow_array(net.sport[frame_rows].astype(np.int32)),
        "dst_port": arrow_array(net.dport[frame_rows].astype(np.int32)),
        "src_ip_int": arrow_array(net.src[frame_rows], pa.int64()),
        "dst_ip_int": arrow_array(net.dst[frame_rows], pa.int64()),
    }


def identity_columns(fr: Frames, net: Network, frame_rows: np.ndarray, protocol: str,
                     ) -> dict[str, pa.Array]:
    """:func:`frame_columns` with the protocol and the dotted addresses (and the ICMP
    error quoting each datagram, when a row of the batch is quoted in one)."""
    out = {**frame_columns(fr, net, frame_rows),
           "protocol": constant_strings(protocol, len(frame_rows)),
           "src_ip": net.ip_strings("src", frame_rows),
           "dst_ip": net.ip_strings("dst", frame_rows)}
    if net.icmp is not None:
        icmp = net.icmp[frame_rows]
        quoted = icmp >= 0
        out["icmp_type"] = masked_array((icmp >> 8).astype(np.int32), quoted, pa.int32())
        out["icmp_code"] = masked_array((icmp & 0xFF).astype(np.int32), quoted, pa.int32())
    return out
