"""LBT-RU and LBT-RM against tshark 4.0.17, the oracle.

Each test draws a few hundred random packets with Hypothesis, writes them to ONE capture (tshark
start-up costs about half a second), and checks every frame: each field we export for the
transport occurrence and for each LBMC occurrence has tshark's value (:func:`wire.tshark.compare`),
no frame is malformed, the tree's expert items are exactly the ones the packet predicts, and
``tshark -z expert`` lists exactly the predicted messages (no Errors for well-formed packets).
tshark is a hard requirement: these tests fail, never skip, without it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import construct as cs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.wire.strategies import messages
from tests.wire.test_lbtrm import lbtrm_packets
from tests.wire.test_lbtru import PACKET_TYPES as RU_TYPES
from tests.wire.test_lbtru import lbtru_packets
from wire import lbtrm, lbtru
from wire.fields import bit_views, members, qualify, tshark_name
from wire.lbmc import LbmcMessage, MessageType, Topicname, Tsni
from wire.lbtru import TransportPacket, never
from wire.pcap import udp_frame, write_pcap
from wire.tshark import PortMap, TsharkFrame, compare, expert_summary, field_list, read_frames

pytestmark = pytest.mark.oracle

SEVERITY = {"2097152": "Chats", "4194304": "Notes", "6291456": "Warns", "8388608": "Errors"}

RU_SOURCE, RU_RECEIVER = ("10.1.0.1", 14380), ("10.1.0.2", 14360)
RM_SOURCE, RM_GROUP, RM_RECEIVER = "10.2.0.1", ("224.10.10.10", 14400), "10.2.0.2"


def json_order_safe(message: LbmcMessage) -> bool:
    """False for messages tshark's JSON cannot show in wire order: ``--no-duplicate-keys``
    merges repeated containers (``lbmc.ctxinst``) into one list at the first one's place, so
    when headers of *different* containers share field names (the ctxinst family:
    ctxinst/ume_ctxinsts, ctxinstd, ctxinstr all use ``lbmc.ctxinst.*``) their values change
    order.  A limitation of the JSON reading in :mod:`wire.tshark`, not of the codecs."""
    containers: dict[str, set[str]] = {}
    for header in message.headers:
        kind = getattr(header, "kind", None)
        if kind is not None:
            containers.setdefault(kind.field_prefix, set()).add(kind.tshark)
    return all(len(c) == 1 for c in containers.values())


LBMC = messages().filter(json_order_safe)


@dataclass
class Sent:
    """One frame of a capture: the packet and where it went."""

    packet: TransportPacket
    frame: bytes


def collect(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """``count`` examples of ``strategy``, drawn by Hypothesis (no shrinking needed: a failing
    frame is reported with the packet's repr)."""
    out: list[Any] = []

    @settings(max_examples=count, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(value: Any) -> None:
        out.append(value)

    draw()
    return out


def ru_frame(packet: lbtru.LbtruPacket, index: int) -> bytes:
    """Source -> receiver for DATA/SM/NCF/RST, receiver -> source for NAK/ACK/CREQ, as UM
    sends them; ports vary inside tshark's default ranges."""
    src = (RU_SOURCE[0], RU_SOURCE[1] + index % 10)
    dst = (RU_RECEIVER[0], RU_RECEIVER[1] + index % 20)
    if isinstance(packet, lbtru.LbtruNak | lbtru.LbtruAck | lbtru.LbtruCreq):
        src, dst = dst, src
    return udp_frame(src[0], src[1], dst[0], dst[1], packet.build())


def rm_frame(packet: lbtrm.LbtrmPacket, index: int) -> bytes:
    """DATA/SM/NCF to the multicast group, NAKs unicast to the source's port.  Every header
    carries a real source port (``ucast_port`` in tshark's default 14390-14399), as UM does;
    an NCF whose bytes 2-11 are all zero would be claimed by tshark's TAPA heuristic first."""
    packet.ucast_port = 14390 + index % 10
    if isinstance(packet, lbtrm.LbtrmNak):
        return udp_frame(RM_RECEIVER, 50000 + index, RM_SOURCE, packet.ucast_port,
                         packet.build())
    return udp_frame(RM_SOURCE, 40000 + index % 100, RM_GROUP[0], RM_GROUP[1], packet.build())


def ru_tshark_clean(packet: lbtru.LbtruPacket) -> bool:
    """tshark 4.0.17 throws (malformed) on an LBT-RU NAK/NCF whose empty list ends the
    datagram: it adds the list item with length -1 at the end of the buffer."""
    if isinstance(packet, lbtru.LbtruNak | lbtru.LbtruNcf):
        listed = packet.naks if isinstance(packet, lbtru.LbtruNak) else packet.ncfs
        return bool(listed or packet.options or packet.trailer)
    return True


def lbmc_experts(message: LbmcMessage) -> list[tuple[str, str]]:
    """The expert items tshark's LBMC dissector adds for a well-formed message: one Note per
    TSNI record.  (Belongs in :mod:`wire.lbmc`; kept here until it has such a method.)"""
    return [("Notes", f"TSNI Sqn 0x{int(record['sqn']):08x}")
            for header in message.headers if isinstance(header, Tsni)
            for record in header.records]


def expected_experts(packet: TransportPacket) -> list[tuple[str, str]]:
    out = list(packet.expert_items())
    for message in packet.messages():
        out += lbmc_experts(message)
    return out


def check_capture(tmp_path: Path, sent: Sequence[Sent], protocol: str,
                  ports: PortMap | None = None, *, tree_experts: Callable[[Any], bool]
                  = lambda p: True) -> list[TsharkFrame]:
    """Write ``sent`` to one pcap and hold tshark's view of every frame against ours."""
    pcap = tmp_path / f"{protocol}.pcap"
    write_pcap(pcap, [s.frame for s in sent])
    frames = read_frames(pcap, ports)
    assert len(frames) == len(sent)
    problems: list[str] = []
    expected_summary: dict[str, set[str]] = {}
    for frame, item in zip(frames, sent, strict=True):
        packet = item.packet
        where = f"frame {frame.number} {packet!r}"
        occurrences = frame.occurrences(protocol)
        if len(occurrences) != 1:
            problems.append(f"{where}: {len(occurrences)} {protocol} occurrences")
            continue
        problems += [f"{where}: {d}" for d in compare(frame.number, packet.tshark_fields(),
                                                       occurrences[0])]
        ours = packet.lbmc_tshark_fields()
        theirs = frame.occurrences("lbmc")
        if len(ours) != len(theirs):
            problems.append(f"{where}: {len(ours)} LBMC messages, tshark {len(theirs)}")
        else:
            for mine, other in zip(ours, theirs, strict=True):
                problems += [f"{where}: {d}" for d in compare(frame.number, mine, other)]
        if frame.malformed:
            problems.append(f"{where}: malformed {frame.malformed}")
        expected = expected_experts(packet)
        for severity, message in expected:
            expected_summary.setdefault(severity, set()).add(message)
        seen = Counter((SEVERITY.get(s, s), m) for s, m in frame.experts)
        if not tree_experts(packet):
            expected = expected[len(packet.expert_items()):]
        if seen != Counter(expected):
            problems.append(f"{where}: experts {sorted(seen)} != expected {sorted(expected)}")
    assert not problems, "\n".join(problems[:40])
    summary = {k: set(v) for k, v in expert_summary(pcap, ports).items()}
    assert "Errors" not in summary
    assert summary == expected_summary
    return frames


# --- names and masks ---------------------------------------------------------------------------


def _exported(prefix: str, struct_def: Any) -> list[tuple[str, int]]:
    """(tshark name, mask) of every field a struct exports (0 for whole members)."""
    out: list[tuple[str, int]] = []
    for member in members(struct_def):
        name = tshark_name(member)
        if isinstance(member.subcon, cs.Array):
            if name is not None:
                out += _exported(qualify(prefix, name), member.subcon.subcon)
            continue
        if name is not None:
            out.append((qualify(prefix, name), 0))
        for view, bit in bit_views(member).items():
            if bit.when is never:
                continue
            out.append((qualify(prefix, bit.tshark or f"{name or member.name}.{view}"),
                        bit.mask))
    return out


RECORD_CLASSES = [*RU_TYPES, lbtru.LbtruUnknown, lbtru.SidOption, lbtru.CidOption,
                  lbtru.UnknownOption, lbtrm.LbtrmData, lbtrm.LbtrmSm, lbtrm.LbtrmNak,
                  lbtrm.LbtrmNcf, lbtrm.LbtrmUnknown, lbtrm.LbtrmOption]


def test_every_exported_name_and_mask_is_tsharks() -> None:
    """Names and bit masks read off our structs exist in ``tshark -G fields`` as written."""
    registered = field_list(("lbtru", "lbtrm"))
    seen = set()
    for cls in RECORD_CLASSES:
        for name, mask in _exported(cls.prefix, cls.struct):
            seen.add(name)
            assert name in registered, f"{cls.__name__}: {name} is not a tshark field"
            if mask:
                assert registered[name][1] == mask, f"{name}: tshark mask " \
                    f"0x{registered[name][1]:x}, ours 0x{mask:x}"
    assert {"lbtru.data.trail", "lbtru.opt_sid.session_id", "lbtru.nak.list.nak",
            "lbtru.hdr.flags.rx", "lbtrm.data.sqn", "lbtrm.nak.list.nak",
            "lbtrm.data.flags_fec_type.rx", "lbtru.opt_unknown.hdr_len"} <= seen


# --- LBT-RU ------------------------------------------------------------------------------------


@pytest.mark.parametrize("cls", RU_TYPES, ids=lambda c: c.__name__)
def test_lbtru_packets_of_every_type(tmp_path: Path, cls: type[lbtru.LbtruPacket]) -> None:
    count = 300 if cls is lbtru.LbtruData else 120
    strategy = lbtru_packets(cls, unknown=False, max_messages=4, lbmc=LBMC)
    packets = collect(strategy.filter(ru_tshark_clean), count)
    sent = [Sent(p, ru_frame(p, i)) for i, p in enumerate(packets)]
    check_capture(tmp_path, sent, "lbtru")


def test_lbtru_several_lbmc_messages_in_one_datagram(tmp_path: Path) -> None:
    packets = collect(st.builds(
        lambda base, extra: lbtru.LbtruData(sqn=base.sqn, options=base.options,
                                            payload=[*base.messages(), *extra]),
        lbtru_packets(lbtru.LbtruData, unknown=False, lbmc=LBMC),
        st.lists(st.sampled_from(_FIXED_MESSAGES), min_size=2, max_size=6)), 80)
    sent = [Sent(p, ru_frame(p, i)) for i, p in enumerate(packets)]
    frames = check_capture(tmp_path, sent, "lbtru")
    assert sum(len(f.occurrences("lbmc")) for f in frames) >= 2 * len(frames)


_FIXED_MESSAGES = [
    LbmcMessage(type=MessageType.MESSAGE, headers=[Topicname(topic="ume.test.topic")],
                payload=b"hello", tidx=1, sqn=7),
    LbmcMessage(type=MessageType.MESSAGE, payload=b"", tidx=2, sqn=8),
    LbmcMessage(type=MessageType.CONTROL),
]


def test_lbtru_fact_sheet_example(tmp_path: Path) -> None:
    from tests.wire.test_lbtru import FRAME2

    packet = lbtru.parse_packet(FRAME2)
    check_capture(tmp_path, [Sent(packet, ru_frame(packet, 0))], "lbtru")


def test_lbtru_quirks_are_what_the_fact_sheet_says(tmp_path: Path) -> None:
    """Crafted packets tshark flags: unknown option (we round-trip it; tshark says Error and
    malformed), unknown type, RST with options at offset 4 (tshark reads offset 2 and reports
    a zero-length header: why we refuse to build them by default), and an empty NAK list at
    the end of the datagram (an exception in tshark, not in the fact sheet)."""
    unknown_opt = lbtru.LbtruAck(ack_sqn=1, options=[lbtru.UnknownOption(9, data=b"abcd")])
    unknown_type = lbtru.LbtruUnknown(type=9, trailer=bytes(8))
    rst = lbtru.LbtruRst(allow_options=True, options=[lbtru.SidOption(session_id=5)])
    empty_nak = lbtru.LbtruNak()
    sent = [Sent(p, ru_frame(p, i))
            for i, p in enumerate([unknown_opt, unknown_type, rst, empty_nak])]
    pcap = tmp_path / "quirks.pcap"
    write_pcap(pcap, [s.frame for s in sent])
    frames = read_frames(pcap)
    assert compare(1, unknown_opt.tshark_fields(), frames[0].occurrences("lbtru")[0]) == []
    messages = [sorted(m for _, m in f.experts) for f in frames]
    assert messages[0] == ["ACK", "Unrecognized header 0x09"] and frames[0].malformed
    assert messages[1] == ["Unrecognized type 0x09"]
    assert "Zero-length header" in messages[2] and frames[2].malformed
    assert not ru_tshark_clean(empty_nak) and frames[3].malformed and messages[3] == ["NAK"]
    summary = expert_summary(pcap)
    assert set(summary["Errors"]) == {"Unrecognized header 0x09", "Unrecognized type 0x09",
                                      "Zero-length header",
                                      "Malformed Packet (Exception occurred)"}


# --- LBT-RM ------------------------------------------------------------------------------------


def _rm_tree_experts(packet: Any) -> bool:
    """tshark's NCF expert has no tree item: it is only in ``-z expert``."""
    return not isinstance(packet, lbtrm.LbtrmNcf)


@pytest.mark.parametrize("cls", [lbtrm.LbtrmData, lbtrm.LbtrmSm, lbtrm.LbtrmNak,
                                 lbtrm.LbtrmNcf], ids=lambda c: c.__name__)
def test_lbtrm_packets_of_every_type(tmp_path: Path, cls: type[lbtrm.LbtrmPacket]) -> None:
    """Packets tshark's heuristic accepts: version 0, next_hdr 0 (no options)."""
    count = 300 if cls is lbtrm.LbtrmData else 120
    packets = collect(lbtrm_packets(cls, options=False, versions=st.just(0), max_messages=4,
                                    lbmc=LBMC),
                      count)
    assert all(p.heuristic_accepts() for p in packets)
    sent = [Sent(p, rm_frame(p, i)) for i, p in enumerate(packets)]
    check_capture(tmp_path, sent, "lbtrm", tree_experts=_rm_tree_experts)


def test_lbtrm_options_and_versions_through_decode_as(tmp_path: Path) -> None:
    """Options (and non-zero versions) are invisible to the heuristic; with Decode-As tshark
    skips the option chain and must still find the LBMC payload where we put it."""
    ports = PortMap(lbtrm_ports=[RM_GROUP[1], *range(14390, 14400)])
    strategy = st.sampled_from([lbtrm.LbtrmData, lbtrm.LbtrmSm, lbtrm.LbtrmNak,
                                lbtrm.LbtrmNcf]).flatmap(
        lambda cls: lbtrm_packets(cls, options=True, max_messages=3, lbmc=LBMC))
    packets = collect(strategy, 200)
    packets.append(lbtrm.LbtrmData(sqn=1, options=[lbtrm.LbtrmOption(1, data=b"abcd")],
                                   payload=list(_FIXED_MESSAGES)))
    sent = [Sent(p, rm_frame(p, i)) for i, p in enumerate(packets)]
    check_capture(tmp_path, sent, "lbtrm", ports, tree_experts=_rm_tree_experts)


def test_lbtrm_heuristic_rejects_options(tmp_path: Path) -> None:
    """Fact sheet 2.1: a DATA with next_hdr != 0 is not LBT-RM to the heuristic."""
    packet = lbtrm.LbtrmData(sqn=1, options=[lbtrm.LbtrmOption(1, data=b"abcd")])
    assert not packet.heuristic_accepts()
    pcap = tmp_path / "rm_opt.pcap"
    write_pcap(pcap, [rm_frame(packet, 0)])
    assert read_frames(pcap)[0].occurrences("lbtrm") == []
