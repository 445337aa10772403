"""LBMR against the oracle: tshark 4.0 must see exactly the fields our codec says it built.

Packets are drawn with the Hypothesis strategies of ``test_lbmr`` (deterministically, via an
inner ``@given`` that only collects them), written hundreds to a pcap on the default unicast
resolver ports (127.0.0.1:14402 -> 15380, no preferences needed), and read back with one
tshark run.  For every frame, every (field, value) of :meth:`LbmrPacket.tshark_fields` must be
in tshark's view with the same values in the same order, tshark must not mark it malformed,
and ``-z expert`` must show no errors (and no warnings except the ones an unknown kind earns).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import construct as cs
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from tests.wire.test_lbmr import (
    BAD_INPUTS,
    EXAMPLE_FRAME_1,
    QMGMT_IKA,
    _accidental_trim,
    example_packet,
    names,
    packets,
    record_of,
)
from wire import lbmr as L
from wire.errors import WireError
from wire.fields import bit_views, members, qualify, tshark_name
from wire.pcap import udp_frame, write_pcap
from wire.tshark import TsharkFrame, compare, expert_summary, field_list, read_frames, run

pytestmark = pytest.mark.oracle

SEVERITY = {"8388608": "Error", "6291456": "Warn", "4194304": "Note", "2097152": "Chat"}


def collect(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """``count`` deterministic draws from ``strategy`` (Hypothesis generation only)."""
    out: list[Any] = []

    @settings(max_examples=count, deadline=None, database=None, derandomize=True,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    @given(strategy)
    def draw(value: Any) -> None:
        out.append(value)

    draw()
    return out


def tshark_view(tmp_path: Path, name: str, payloads: Iterable[bytes],
                ) -> tuple[list[TsharkFrame], dict[str, list[str]]]:
    pcap = tmp_path / f"{name}.pcap"
    write_pcap(pcap, [udp_frame("127.0.0.1", 14402, "127.0.0.1", 15380, p) for p in payloads])
    return read_frames(pcap, protocols=("lbmr",)), expert_summary(pcap)


def as_tshark_text(fields: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """Our fields, with 1-byte byte strings in tshark's text form.

    tshark prints a one-byte FT_BYTES value without a colon (``"05"``), which
    :func:`wire.tshark.normalize` then reads as the decimal number 5; handing it our value as
    the same text makes both sides go through the same normalisation.
    """
    return [(n, v.hex() if isinstance(v, bytes) and len(v) == 1 else v) for n, v in fields]


def disagreements(frames: list[TsharkFrame], packets_: list[L.LbmrPacket]) -> list[str]:
    """Field mismatches and malformed frames, each with the packet that caused it."""
    assert len(frames) == len(packets_)
    problems = []
    for frame, packet in zip(frames, packets_, strict=True):
        occurrences = frame.occurrences("lbmr")
        if len(occurrences) != 1:
            problems.append(f"frame {frame.number}: {len(occurrences)} lbmr layers: {packet!r}")
            continue
        ours = as_tshark_text(packet.tshark_fields())
        for diff in compare(frame.number, ours, occurrences[0]):
            problems.append(f"{diff}\n    packet: {packet!r}")
        if frame.malformed:
            problems.append(f"frame {frame.number}: malformed {frame.malformed}: {packet!r}")
        errors = [m for s, m in frame.experts if SEVERITY.get(s) == "Error"]
        if errors:
            problems.append(f"frame {frame.number}: errors {errors}: {packet!r}")
    return problems


def expected_warns(packet: L.LbmrPacket) -> set[str]:
    """The warnings tshark gives for the unknown kinds a packet carries."""
    out: set[str] = set()
    if packet.type == 5:
        out.add("Unknown LBMR type 0x05")
    ext = packet.ext
    if isinstance(ext, L.ExtUnknown):
        out.add(f"Unknown LBMR extended type 0x{ext.ext_type:02x}")
    if isinstance(ext, L.Tnwg) and int(ext.type) not in list(L.TnwgType):
        out.add(f"Unknown LBMR TNWG type 0x{int(ext.type):04x}")
    if isinstance(ext, L.Pser):
        out |= {f"Unknown LBMR PSER option 0x{int(o.type):02x}" for o in ext.options or ()
                if isinstance(o, L.PserOptUnknown)}
    for record in packet.tirs:
        if isinstance(record, L.Tir) and isinstance(record.info, L.OpaqueTransport):
            out.add(f"Unknown LBMR TIR transport 0x{record.info.transport:02x}")
        for option in getattr(record, "options", None) or ():
            if isinstance(option, L.ToptUnknown):
                out.add(f"Unknown option 0x{int(option.type):02x}")
    out |= {f"Unknown LBMR option type 0x{int(o.type):02x}" for o in packet.options
            if isinstance(o, L.OptUnknown)}
    return out


def assert_agrees(tmp_path: Path, name: str, packets_: list[L.LbmrPacket]) -> None:
    frames, summary = tshark_view(tmp_path, name, [p.build() for p in packets_])
    problems = disagreements(frames, packets_)
    assert not problems, f"{len(problems)} problems, first ones:\n" + "\n".join(problems[:25])
    assert not summary.get("Errors"), summary
    allowed = set().union(*(expected_warns(p) for p in packets_))
    assert set(summary.get("Warns", [])) <= allowed, summary


# --- the field names themselves --------------------------------------------------------------


def _emittable(struct_def: Any, prefix: str) -> Iterable[tuple[str, int | None]]:
    """(tshark name, bit mask or None) of everything a struct's export can produce."""
    for member in members(struct_def):
        name = tshark_name(member)
        inner = member.subcon
        if name is not None and isinstance(inner, cs.Array):
            yield from _emittable(inner.subcon, qualify(prefix, name))
            continue
        if name is not None:
            yield qualify(prefix, name), None
        for view, bit in bit_views(member).items():
            if bit.when is not None and not bit.when(0xFFFFFFFF) and not bit.when(0):
                continue  # never displayed by tshark
            yield qualify(prefix, bit.tshark or f"{name or member.name}.{view}"), bit.mask


def test_every_field_name_and_bit_mask_is_registered_in_tshark() -> None:
    registered = field_list(("lbmr",))
    emitted = list(_emittable(L.LbmrHeader, "lbmr")) + list(_emittable(L.ExtHeader, "lbmr"))
    emitted += list(_emittable(L.ToptLenStruct, "lbmr.topt.len"))
    for cls in L.record_classes():
        emitted += list(_emittable(cls.kind.struct, cls.kind.tshark))
    emitted += [(L.UMQ_COUNT_NAMES[n], None) for n in L.UMQ_COUNT_NAMES]
    # Fields registered as plain integers that tshark shows over a wider wire word.
    byte_views = {"lbmr.topt.domain_id.flags", "lbmr.topt.unknown.flags"}
    problems = []
    for name, mask in emitted:
        if name not in registered:
            problems.append(f"{name} is not a tshark field")
        elif mask is not None and registered[name][1] != mask and name not in byte_views:
            problems.append(f"{name}: our mask 0x{mask:x}, tshark's 0x{registered[name][1]:x}")
    assert not problems, "\n".join(problems)
    assert len({n for n, _ in emitted}) > 250


# --- cross-checks ------------------------------------------------------------------------------


def test_one_byte_values(tmp_path: Path) -> None:
    """Single-byte opaque values (the case tshark prints without a colon) compare correctly."""
    drawn = [L.LbmrPacket(tirs=[L.Tir(name="t", info=L.OpaqueTransport(0x02, data=bytes([b])),
                                      options=[L.ToptUnknown(type=0x40, data=bytes([b]))])],
                          options=[L.OptUnknown(type=0x99, data=bytes([b]))])
             for b in (0x00, 0x05, 0x10, 0xAB)]
    frames, summary = tshark_view(tmp_path, "onebyte", [p.build() for p in drawn])
    assert not disagreements(frames, drawn)
    assert not summary.get("Errors")


def test_fact_sheet_example_frame(tmp_path: Path) -> None:
    packet = example_packet()
    assert packet.build() == EXAMPLE_FRAME_1
    frames, summary = tshark_view(tmp_path, "example", [EXAMPLE_FRAME_1])
    assert not disagreements(frames, [packet])
    assert summary == {}


def test_every_known_kind_agrees_with_tshark(tmp_path: Path) -> None:
    """Random packets of every type with every known record, option and transport kind."""
    drawn = collect(packets(printable=True, known=True), 400) + one_of_each_packets()
    kinds = {type(r) for p in drawn for r in walk(p)}
    expected = {c for c in L.record_classes()
                if c not in (L.ToptUnknown, L.OptUnknown, L.OpaqueTransport, L.ExtUnknown,
                             L.PserOptUnknown, L.PserOptLen)}
    assert expected <= kinds, f"not drawn: {sorted(c.__name__ for c in expected - kinds)}"
    assert {p.type for p in drawn} >= {0, 1, 2, 3, 4, 6, 7}
    assert_agrees(tmp_path, "known", drawn)


def test_unknown_kinds_agree_and_only_warn(tmp_path: Path) -> None:
    """Unknown options, transports and types: same fields, and only the expected warnings."""
    drawn = collect(packets_with_unknowns(), 200)
    assert sum(bool(expected_warns(p)) for p in drawn) > 120
    frames, summary = tshark_view(tmp_path, "unknown", [p.build() for p in drawn])
    problems = disagreements(frames, drawn)
    for frame, packet in zip(frames, drawn, strict=True):
        warns = {m for s, m in frame.experts if SEVERITY.get(s) == "Warn"}
        expected = expected_warns(packet)
        tree_only = {w for w in expected if not w.startswith("Unknown LBMR PSER option")}
        if not tree_only <= warns <= expected:
            problems.append(f"frame {frame.number}: warns {warns} expected {expected}: "
                            f"{packet!r}")
    assert not problems, "\n".join(problems[:10])
    assert not summary.get("Errors"), summary
    assert set(summary.get("Warns", [])) <= set().union(*(expected_warns(p) for p in drawn))


def test_length_option_first_last_or_absent_decode_the_same(tmp_path: Path) -> None:
    """[I] choice check: tshark shows the same option fields whichever way we place OptLen."""
    body = [L.OptSrcId(src_id=b"ABCDEFGH"), L.OptSrcType(src_type=L.SourceType.STORE),
            L.OptVersion(ume=1, version=5), L.OptLocalDomain(local_domain_id=7)]
    variants = [L.with_length_option(body, last=True), L.with_length_option(body, last=False),
                list(body)]
    drawn = [L.LbmrPacket(tqrs=[L.Tqr(name="topic")], tirs=[
        L.Tir(name="topic", info=L.TcpInfo(ip="127.0.0.1", port=14371))], options=v)
        for v in variants]
    frames, summary = tshark_view(tmp_path, "optlen", [p.build() for p in drawn])
    assert not disagreements(frames, drawn)
    assert summary == {}
    views = [sorted((n, v) for n, v in f.occurrences("lbmr")[0] if n.startswith("lbmr.opt.")
                    and not n.startswith("lbmr.opt.len")) for f in frames]
    assert views[0] == views[1] == views[2]


def test_info_column(tmp_path: Path) -> None:
    drawn = [*collect(packets(printable=True, known=True), 60),
             L.LbmrPacket(), L.LbmrPacket(type=2), L.LbmrPacket(type=3), L.LbmrPacket(type=5),
             L.LbmrPacket(type=7, ext=L.ExtUnknown(0x09))]
    pcap = tmp_path / "info.pcap"
    write_pcap(pcap, [udp_frame("127.0.0.1", 14402, "127.0.0.1", 15380, p.build())
                      for p in drawn])
    shown = run(["-r", str(pcap), "-T", "fields", "-e", "_ws.col.Info"]).splitlines()
    assert shown == [p.info() for p in drawn]


# Rejected inputs tshark does not flag: it never hands an empty payload to LBMR, and it
# reads a context-info name (the bytes a short len would cut) only when the name flag is set.
NOT_BROKEN_FOR_TSHARK = {"empty", "context info len below 20"}


def test_rejected_packets_are_broken_for_tshark_too(tmp_path: Path) -> None:
    """What we reject as bad input, tshark marks malformed or with an error-level expert."""
    payloads = [(label, raw) for label, raw, _, _ in BAD_INPUTS
                if label not in NOT_BROKEN_FOR_TSHARK]
    payloads += [
        ("zero-length option", L.LbmrPacket(tirs=[L.Tir(
            name="t", info=L.TcpInfo(), options=[L.ToptCost(len=0)])]).build()),
        ("wrong TCP tlen", L.LbmrPacket(tirs=[L.Tir(name="t", info=L.OpaqueTransport(
            L.TransportType.TCP, data=bytes(7)))]).build()),
        ("wrong LBT-RU tlen", L.LbmrPacket(tirs=[L.Tir(
            name="t", info=L.LbtruInfo(), tlen=8)]).build() + bytes(2)),
        ("wrong LBT-SMX tlen", L.LbmrPacket(tirs=[L.Tir(
            name="t", info=L.OpaqueTransport(L.TransportType.LBTSMX, data=bytes(12)))]).build()),
    ]
    for _, raw in payloads:
        with pytest.raises(WireError):
            L.parse_packet(raw)
    frames, _ = tshark_view(tmp_path, "bad", [raw for _, raw in payloads])
    not_flagged = [label for (label, _), frame in zip(payloads, frames, strict=True)
                   if not frame.malformed
                   and not any(SEVERITY.get(s) == "Error" for s, _ in frame.experts)]
    assert not not_flagged, f"tshark accepts what we reject: {not_flagged}"


def test_where_we_are_stricter_than_tshark(tmp_path: Path) -> None:
    """Documented choices (module docstring): complete packets we refuse, tshark decodes."""
    good = L.LbmrPacket(tirs=[L.Tir(name="t", info=L.TcpInfo(), options=[])]).build()
    header_type_5 = good[:14] + b"\x05" + good[15:]  # options block header type 5
    cases = {
        "options header type 5": header_type_5,
        "context info len 16": b"\x07\x03\x10\x00" + bytes(20),
        "TMR name beyond its len": b"\x04\x00\x00\x00\x00\x0f\x00\x01"
                                   b"\x00\x05\x01\x00topic\x00",
    }
    for raw in cases.values():
        with pytest.raises(WireError):
            L.parse_packet(raw)
    frames, summary = tshark_view(tmp_path, "strict", list(cases.values()))
    assert all(not f.malformed and not f.experts for f in frames), [
        (label, f.malformed, f.experts) for label, f in zip(cases, frames, strict=True)]
    assert not summary.get("Errors")


# --- packet builders used above --------------------------------------------------------------


def walk(packet: L.LbmrPacket) -> Iterable[L.Record]:
    """Every record in a packet, children included."""
    stack: list[L.Record] = [*packet.tqrs, *packet.tirs, *packet.options]
    stack += [r for r in (packet.tmb, packet.ext) if r is not None]
    while stack:
        record = stack.pop()
        yield record
        for attr in ("info", "options", "groups", "queues", "records"):
            child = getattr(record, attr, None) if attr in _slots(record) else None
            if isinstance(child, L.Record):
                stack.append(child)
            elif isinstance(child, list):
                stack += [c for c in child if isinstance(c, L.Record)]


def _slots(record: L.Record) -> set[str]:
    return {s for cls in type(record).__mro__ for s in getattr(cls, "__slots__", ())}


def one_of_each_packets() -> list[L.LbmrPacket]:
    """Packets that carry every known kind at least once, whatever the random draw was."""
    options = [cls() for cls in L.TOPIC_OPTIONS.values()]
    tirs = [L.Tir(name=f"t{i}", info=cls(), options=options if i == 0 else None)
            for i, cls in enumerate(L.TRANSPORTS.values())]
    pser = L.Pser(topic="ume.topic", options=[
        L.PserCtxinst(type=L.PserOptType.SOURCE_CTXINST, ctxinst=b"src-inst"),
        L.PserCtxinst(type=L.PserOptType.STORE_CTXINST, ctxinst=b"storinst")])
    packet_options = L.with_length_option([cls() for cls in L.PACKET_OPTIONS.values()
                                           if cls is not L.OptLen])
    return [
        L.LbmrPacket(tirs=tirs, options=packet_options),
        L.LbmrPacket(type=L.PacketType.EXT, ext=pser, options=packet_options),
        L.LbmrPacket(type=L.PacketType.UMQ, tqrs=[L.Qqr(name="q")], tirs=[L.Qir(
            qname="q", tname="t", options=[L.ToptUmqQinfo(queue="q")], groups=[L.QirGroup()],
            queues=[L.QirQueue()])]),
        L.LbmrPacket(type=L.PacketType.TOPIC_MGMT, tmb=L.Tmb(records=[L.Tmr(name="t")])),
        L.LbmrPacket(type=L.PacketType.EXT, ext=L.Tnwg(type=L.TnwgType.TRREQ, body=b"\0\2"),
                     options=packet_options),
        L.LbmrPacket(type=L.PacketType.EXT, ext=L.QueueMgmt(data=QMGMT_IKA),
                     options=packet_options),
        L.LbmrPacket(type=L.PacketType.EXT, ext=L.CtxInfo(name="store-a", name_flag=1,
                                                           ip="127.0.0.1", port=14567)),
        L.LbmrPacket(type=L.PacketType.EXT, ext=L.TopicResRequest()),
        L.LbmrPacket(type=L.PacketType.EXT, ext=L.RemoteDomainRoute()),
        L.LbmrPacket(type=L.PacketType.EXT, ext=L.RemoteCtxInfo()),
    ]


@st.composite
def packets_with_unknowns(draw: st.DrawFn) -> L.LbmrPacket:
    """A tshark-clean packet with one to three unknown kinds spliced in."""
    packet = draw(packets(printable=True, known=True))
    for _ in range(draw(st.integers(1, 3))):
        choice = draw(st.sampled_from(["topt", "transport", "popt", "type5", "ext", "tnwg",
                                       "pser"]))
        if choice in ("topt", "transport"):
            if packet.type not in (0, 1):
                packet = L.LbmrPacket(options=packet.options)
            if not packet.tirs:
                packet.tirs.append(L.Tir(name=draw(names(True)), info=L.TcpInfo()))
            tir = packet.tirs[0]
            assert isinstance(tir, L.Tir)
            if choice == "topt":
                tir.options = [*(tir.options or []), draw(record_of(
                    L.ToptUnknown, type=st.integers(0x0F, 0xFF)))]
            else:
                code = draw(st.sampled_from([0x02, 0x11, 0x03, 0x7F]))
                tir.info = L.OpaqueTransport(code, data=draw(st.binary(max_size=12)))
                tir.values["tlen"] = None
        elif choice == "popt":
            unknown = draw(record_of(L.OptUnknown, type=st.integers(0, 0x7F)))
            packet.options = [*[o for o in packet.options if not isinstance(o, L.OptLen)],
                              unknown]
        elif choice == "type5":
            packet = L.LbmrPacket(type=5, options=packet.options)
        elif choice == "ext":
            packet = L.LbmrPacket(type=7, ext=L.ExtUnknown(draw(st.integers(8, 255))),
                                  options=packet.options)
        elif choice == "tnwg":
            packet = L.LbmrPacket(type=7, ext=L.Tnwg(type=draw(st.integers(3, 0xFFFF))),
                                  options=packet.options)
        else:
            pser = draw(record_of(L.Pser, printable=True))
            assert isinstance(pser, L.Pser)
            pser.options = [draw(record_of(L.PserOptUnknown, type=st.integers(2, 255)))]
            packet = L.LbmrPacket(type=7, ext=pser, options=packet.options)
    if isinstance(packet.ext, L.QueueMgmt) and packet.options:
        packet.options = L.with_length_option(
            [o for o in packet.options if not isinstance(o, L.OptLen)])
    assume(not _accidental_trim(packet))
    return packet


def test_strategy_sanity() -> None:
    """The splicing strategy yields packets our own codec round-trips."""
    for packet in collect(packets_with_unknowns(), 40):
        raw = packet.build()
        assert L.parse_packet(raw).build() == raw
