"""Configuration options in EXTOPT headers (docs/wire-lbmc.md §2.3): what tshark shows of the
ones we build, and how the parser refuses garbled ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.wire.test_lbmc_oracle import Capture, assert_clean, run_oracle
from wire import WireError, lbmc
from wire.lbmc import CFGOPT_SUBTYPE, CfgOpt, CfgScope, Extopt, LbmcMessage, UmePreg
from wire.scapy_layers import to_message, to_scapy

OPTIONS = [CfgOpt(CfgScope.SOURCE, "ume_flight_size_bytes", "1000000"),
           CfgOpt(CfgScope.SOURCE, "ume_write_delay", "0"),
           CfgOpt(CfgScope.RECEIVER, "ume_receiver_paced_persistence", "2"),
           CfgOpt(CfgScope.CONTEXT, "x" * 100, "y" * 100)]


def test_tshark_shows_each_option_as_we_meant(tmp_path: Path) -> None:
    """A registration followed by its options: scope, name and value field by field, the
    message still labelled PREG, no expert item.  tshark 4.0 shows ``parent`` with the scope
    byte's value (see wire.lbmc.CfgOptBody)."""
    capture = Capture()
    capture.connect()
    preg = UmePreg(s_flag=1, w_flag=1, marker=1, reg_id=7, transport_idx=1, topic_idx=2,
                   resp_ip="10.0.0.1", resp_port=14391)
    frame = capture.send_messages([LbmcMessage(headers=[preg, *(o.header() for o in OPTIONS)])])
    result = run_oracle(capture, tmp_path / "cfgopt.pcap")
    assert_clean(result, capture)
    assert result.info[frame].strip() == "PREG"
    (shown,) = result.frames[frame].occurrences("lbmc")
    values = [(k, v) for k, v in shown if k.startswith("lbmc.extopt.cfgopt.")]
    expected: list[tuple[str, str]] = []
    for option in OPTIONS:
        expected += [("lbmc.extopt.cfgopt.scope", str(option.scope)),
                     ("lbmc.extopt.cfgopt.parent", str(option.scope)),
                     ("lbmc.extopt.cfgopt.name", option.name),
                     ("lbmc.extopt.cfgopt.value", option.value)]
    assert values == expected


def test_round_trip_through_bytes_and_scapy() -> None:
    message = LbmcMessage(headers=[UmePreg(s_flag=1), *(o.header() for o in OPTIONS)])
    parsed, _ = lbmc.parse_message(message.build())
    assert lbmc.cfgopts(parsed) == OPTIONS
    assert lbmc.cfgopts(to_message(to_scapy(message))) == OPTIONS
    assert bytes(to_scapy(message)) == message.build()


def test_other_subtypes_are_not_options() -> None:
    message = LbmcMessage(headers=[UmePreg(), Extopt(subtype=0x1234, data=b"abc")])
    assert lbmc.cfgopts(message) == []


def garbled(data: bytes, **fields: int) -> lbmc.Header:
    return Extopt(subtype=fields.pop("subtype", CFGOPT_SUBTYPE), data=data, **fields)


@pytest.mark.parametrize(("header", "reason"), [
    (garbled(b"\x01\x00name"), "NUL-terminated"),
    (garbled(b"\x01\x00name\x00value"), "NUL-terminated"),
    (garbled(b"\x01\x00name\x00value\x00junk"), "bytes after the value"),
    (garbled(b"\x01"), "too short"),
    (garbled(b"\x01\x00\x00value\x00"), "empty option name"),
    (garbled(b"\x01\x00n\xff\x00v\x00"), "UTF-8"),
    (garbled(b"\x01\x00name\x00v\x00", flags=0x20), "fragmented"),
    (garbled(b"\x01\x00name\x00v\x00", fragment_offset=4), "fragmented"),
    (garbled(b"\x01\x00name\x00v\x00", subtype=0x0101), "not a configuration option"),
])
def test_garbled_options_are_refused(header: lbmc.Header, reason: str) -> None:
    with pytest.raises(WireError, match=reason):
        lbmc.parse_cfgopt(header)


def test_an_option_too_long_for_one_header_is_refused_on_build() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        CfgOpt(CfgScope.SOURCE, "n" * 200, "v" * 60).header()
    with pytest.raises(ValueError, match="NUL"):
        CfgOpt(CfgScope.SOURCE, "a\0b", "1").header()


@given(st.binary(max_size=80))
def test_any_data_parses_or_raises_wire_error(data: bytes) -> None:
    try:
        option = lbmc.parse_cfgopt(garbled(data))
    except WireError:
        return
    assert option.header().data == data


SHAPES = [b"", b"\x01", b"\x01\x00", b"\x01\x00\x00", b"\x01\x00\x00\x00",
          b"\x01\x00name", b"\x01\x00ume_flight_size_bytes\x001000",
          b"\x01\x00a\x00b\x00\x02\x00c\x00d\x00", b"\x01\x00a\x00b\x00\x02",
          b"\x01\x00a\x00b\x00\x02\x00", b"\x01\x00a\x00b\x00junk", b"\x09\x07a\x00b\x00"]


def test_ump_dissect_agrees_with_tshark_on_garbled_options(tmp_path: Path) -> None:
    """Our dissector shows the options tshark shows and calls Malformed exactly the frames
    tshark throws on (a name or value without its NUL), whole or garbled; several options may
    share one header, one or two bytes left over are ignored (wire.lbmc.shown_cfgopts)."""
    from tests.wire.test_lbmc_oracle import PORTS
    from wire.dissect import check_against_tshark, dissect_file
    from wire.tshark import read_frames

    capture = Capture()
    capture.connect()
    frames = [capture.send_messages([LbmcMessage(headers=[UmePreg(s_flag=1, w_flag=1),
                                                          garbled(data)])])
              for data in SHAPES]
    path = capture.write(tmp_path / "garbled.pcap")
    reports = {r.number: r for r in dissect_file(path, PORTS)}
    assert check_against_tshark(path, list(reports.values()), PORTS) == []
    theirs = {f.number: f for f in read_frames(path, PORTS)}
    for data, number in zip(SHAPES, frames, strict=True):
        thrown = lbmc.shown_cfgopts(data)[1] is not None
        assert bool(theirs[number].malformed) == thrown, data
        assert (reports[number].status == "malformed") == thrown, data
