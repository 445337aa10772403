"""The fast path (wire/fastpath.py) is *derived* from the Construct definitions and agrees.

For every fixed-layout Construct struct in wire (every complete ``HeaderKind`` layout, the LBMC
base headers, the apphdr-chain and TSNI records, the pcap/pcapng/link/IP/UDP/TCP structs):

* ``derive(s).decode(b)`` equals Construct's ``s.parse(b)`` for random bytes;
* ``derive(s).pack(v)`` equals Construct's ``s.build(v)`` for random values;
* the numpy ``dtype()`` decodes the same values with ``np.frombuffer``.

Then ``derive`` on small ad-hoc structs (random ones too) shows that the struct format is read off
the definition: a different definition gives a different format, both byte orders work, mixed
byte orders are refused.
"""

from __future__ import annotations

import ipaddress
import struct as pystruct
from typing import Any

import construct as cs
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.wire import strategies
from wire import WireError, lbmc, pcap
from wire.fastpath import FastLayout, derive
from wire.fields import Auto, IPv4, field, members

# --- the structs under test ---------------------------------------------------------------------


def _module_structs(module: Any) -> list[tuple[str, cs.Struct]]:
    return [(f"{module.__name__.split('.')[-1]}.{name}", value)
            for name, value in sorted(vars(module).items()) if isinstance(value, cs.Struct)]


def _all_structs() -> list[tuple[str, cs.Struct]]:
    found = _module_structs(lbmc) + _module_structs(pcap)
    found += [(f"lbmc.kind.{k.name}", k.struct) for k in lbmc.header_kinds()
              if k.struct is not None]
    for order, (u16, u32) in (("LE", (cs.Int16ul, cs.Int32ul)), ("BE", (cs.Int16ub, cs.Int32ub))):
        names = ("block", "idb", "epb", "spb", "shb")
        found += [(f"pcap.pcapng_{n}_{order}", s)
                  for n, s in zip(names, pcap._pcapng_structs(u16, u32), strict=True)]
    return found


def _has_trailing(struct_def: cs.Struct) -> bool:
    return any(m.name == "trailing" for m in members(struct_def))


ALL_STRUCTS = _all_structs()
FIXED_STRUCTS = [pytest.param(s, id=name) for name, s in ALL_STRUCTS if derive(s).complete]


def test_the_struct_inventory() -> None:
    """Every fixed-layout kind and the base/pcap structs named in the brief are covered."""
    names = {name for name, _ in ALL_STRUCTS}
    fixed = {name for name, s in ALL_STRUCTS if derive(s).complete}
    for kind in lbmc.header_kinds():
        assert (f"lbmc.kind.{kind.name}" in fixed) == kind.fixed
    expected = {
        "lbmc.DataHeader", "lbmc.ControlHeader", "lbmc.TsniRecord", "lbmc.AppHdrMsgPropLen",
        "pcap.PcapHeaderLE", "pcap.PcapHeaderBE", "pcap.PcapRecordLE", "pcap.PcapRecordBE",
        "pcap.EthernetHeader", "pcap.VlanTag", "pcap.LinuxSll", "pcap.LinuxSll2",
        "pcap.IPv4Header", "pcap.UdpHeader", "pcap.TcpHeader",
    }
    assert expected <= fixed
    assert "lbmc.AppHdrElement" in names and "lbmc.AppHdrElement" not in fixed
    for base, struct_def in ((lbmc.DATA_BASE, lbmc.DataHeader),
                             (lbmc.CONTROL_BASE, lbmc.ControlHeader)):
        again = derive(struct_def)
        assert (base.names, base.format, base.kinds) == (again.names, again.format, again.kinds)
    assert (lbmc.DATA_BASE.size, lbmc.CONTROL_BASE.size) == (12, 4)


def _raw(struct_def: cs.Struct, fast: FastLayout, data: st.DataObject) -> bytes:
    """Random bytes of one struct; for header kinds hdr_len covers some extra trailing bytes."""
    raw = data.draw(st.binary(min_size=fast.size, max_size=fast.size), label="raw")
    if _has_trailing(struct_def):
        extra = data.draw(st.binary(max_size=8), label="trailing")
        raw = raw[:1] + bytes([fast.size + len(extra)]) + raw[2:] + extra
    return raw


def _as_int(value: Any, kind: str) -> Any:
    return int(ipaddress.IPv4Address(value)) if kind == "ipv4" else value


# --- decode / pack / dtype agree with Construct --------------------------------------------------


@pytest.mark.parametrize("struct_def", FIXED_STRUCTS)
@given(data=st.data())
def test_decode_equals_construct_parse(struct_def: cs.Struct, data: st.DataObject) -> None:
    fast = derive(struct_def)
    raw = _raw(struct_def, fast, data)
    parsed = struct_def.parse(raw)
    decoded = fast.decode(raw)
    assert decoded == {name: parsed[name] for name in fast.names}
    if not _has_trailing(struct_def):
        assert set(fast.names) == {m.name for m in members(struct_def)}
        assert fast.size == struct_def.sizeof()
    raw_values = fast.unpack_from(raw)
    assert list(raw_values) == [_as_int(parsed[n], k) for n, k in zip(fast.names, fast.kinds,
                                                                       strict=True)]
    pad = data.draw(st.binary(max_size=7), label="pad")
    assert fast.decode(pad + raw, len(pad)) == decoded
    assert fast.decode(memoryview(bytearray(raw))) == decoded


@pytest.mark.parametrize("struct_def", FIXED_STRUCTS)
@given(data=st.data())
def test_pack_equals_construct_build(struct_def: cs.Struct, data: st.DataObject) -> None:
    fast = derive(struct_def)
    overrides = {"trailing": st.just(b"")} if _has_trailing(struct_def) else {}
    values = data.draw(strategies.values_for(struct_def, skip=(), overrides=overrides))
    for member in members(struct_def):
        if isinstance(member.subcon, Auto):  # lengths: computed on build unless given
            top = (1 << (8 * member.subcon.sizeof())) - 1
            values[member.name] = (fast.size if _has_trailing(struct_def) else
                                   data.draw(st.integers(0, top), label=member.name))
    built = struct_def.build(values)
    assert fast.pack(values) == built
    # IPv4 members may be given as int as well
    as_ints = {n: _as_int(values[n], k) for n, k in zip(fast.names, fast.kinds, strict=True)}
    assert fast.pack(as_ints) == built
    assert fast.decode(built) == {n: struct_def.parse(built)[n] for n in fast.names}


@pytest.mark.parametrize("struct_def", FIXED_STRUCTS)
@given(data=st.data())
def test_numpy_dtype_decodes_the_same_values(struct_def: cs.Struct, data: st.DataObject) -> None:
    fast = derive(struct_def)
    dtype = fast.dtype()
    assert dtype.names == fast.names
    assert dtype.itemsize == fast.size
    assert dtype.fields is not None
    rows = [_raw(struct_def, fast, data)[: fast.size]
            for _ in range(data.draw(st.integers(1, 4), label="rows"))]
    table = np.frombuffer(b"".join(rows), dtype=dtype)
    assert len(table) == len(rows)
    for row, record in zip(rows, table, strict=True):
        expected = fast.decode(row)
        for name, kind in zip(fast.names, fast.kinds, strict=True):
            value = record[name]
            if kind == "bytes":
                # raw void items: the exact bytes, trailing NULs included
                width = dtype[name].itemsize
                assert dtype[name].kind == "V"
                assert bytes(value) == expected[name]
                assert table[name].tobytes()[: width] == rows[0][
                    dtype.fields[name][1] : dtype.fields[name][1] + width]
            else:
                assert int(value) == _as_int(expected[name], kind)


# --- derive() reads the format off the definition ------------------------------------------------


@pytest.mark.parametrize(("struct_def", "fmt", "kinds"), [
    pytest.param(cs.Struct("a" / cs.Int8ub, "b" / cs.Int16ub, "c" / cs.Int32ub, "d" / cs.Int64ub),
                 ">BHLQ", ("int",) * 4, id="unsigned-be"),
    pytest.param(cs.Struct("a" / cs.Int8sb, "b" / cs.Int16sb, "c" / cs.Int32sb, "d" / cs.Int64sb),
                 ">bhlq", ("int",) * 4, id="signed-be"),
    pytest.param(cs.Struct("a" / cs.Int16ul, "b" / cs.Int32ul, "c" / cs.Int64sl),
                 "<HLq", ("int",) * 3, id="little-endian"),
    pytest.param(cs.Struct("mac" / cs.Bytes(6), "t" / cs.Int16ub), ">6sH", ("bytes", "int"),
                 id="bytes"),
    pytest.param(cs.Struct(field("ip", IPv4), field("port", cs.Int16ub)), ">LH", ("ipv4", "int"),
                 id="ipv4"),
    pytest.param(cs.Struct("mac" / cs.Bytes(3)), ">3s", ("bytes",), id="bytes-only"),
])
def test_derive_small_structs(struct_def: cs.Struct, fmt: str, kinds: tuple[str, ...]) -> None:
    fast = derive(struct_def)
    assert fast.format == fmt
    assert fast.kinds == kinds
    assert fast.complete
    assert fast.size == struct_def.sizeof()
    raw = bytes(range(1, fast.size + 1))
    assert fast.decode(raw) == {k: v for k, v in struct_def.parse(raw).items() if k != "_io"}
    assert fast.pack(struct_def.parse(raw)) == raw


def test_changing_the_definition_changes_the_fast_layout() -> None:
    raw = bytes.fromhex("0102030405060708")
    two_u16 = cs.Struct("a" / cs.Int16ub, "b" / cs.Int16ub, "c" / cs.Int32ub)
    one_u32 = cs.Struct("a" / cs.Int32ub, "c" / cs.Int32ub)
    little = cs.Struct("a" / cs.Int32ul, "c" / cs.Int32ul)
    inserted = cs.Struct("a" / cs.Int16ub, "x" / cs.Int8ub, "b" / cs.Int8ub, "c" / cs.Int32ub)
    layouts = [derive(s) for s in (two_u16, one_u32, little, inserted)]
    assert len({f.format for f in layouts}) == 4
    assert layouts[0].decode(raw) == {"a": 0x0102, "b": 0x0304, "c": 0x05060708}
    assert layouts[1].decode(raw) == {"a": 0x01020304, "c": 0x05060708}
    assert layouts[2].decode(raw) == {"a": 0x04030201, "c": 0x08070605}
    assert layouts[3].decode(raw) == {"a": 0x0102, "x": 3, "b": 4, "c": 0x05060708}
    for struct_def, fast in zip((two_u16, one_u32, little, inserted), layouts, strict=True):
        assert fast.decode(raw) == {k: v for k, v in struct_def.parse(raw).items() if k != "_io"}


BIG = [cs.Int8ub, cs.Int16ub, cs.Int32ub, cs.Int64ub, cs.Int8sb, cs.Int16sb, cs.Int32sb,
       cs.Int64sb]
LITTLE = [cs.Int8ul, cs.Int16ul, cs.Int32ul, cs.Int64ul, cs.Int8sl, cs.Int16sl, cs.Int32sl,
          cs.Int64sl]


BYTES = [cs.Int8ub, cs.Int8ul, cs.Int8sb, cs.Int8sl]  # one byte: no byte order


@st.composite
def ad_hoc_structs(draw: st.DrawFn) -> cs.Struct:
    """Random fixed-size structs of one byte order: integers, byte strings, IPv4, single bytes
    of either order, and unnamed padding."""
    big = draw(st.booleans())
    pool = st.one_of(st.sampled_from(BIG if big else LITTLE),
                     st.sampled_from(BYTES),
                     st.integers(1, 9).map(cs.Bytes),
                     st.integers(1, 3).map(cs.Padding),
                     *([st.just(IPv4)] if big else []))
    subcons = draw(st.lists(pool, min_size=1, max_size=8))
    return cs.Struct(*(sc if isinstance(sc, cs.Padded) else field(f"m{i}", sc)
                       for i, sc in enumerate(subcons)))


def _has_padding(struct_def: cs.Struct) -> bool:
    return any(isinstance(sc, cs.Padded) for sc in struct_def.subcons)


@given(data=st.data())
def test_derive_random_structs(data: st.DataObject) -> None:
    struct_def = data.draw(ad_hoc_structs())
    fast = derive(struct_def)
    assert fast.complete
    assert fast.names == tuple(m.name for m in members(struct_def))
    assert fast.size == pystruct.calcsize(fast.format) == struct_def.sizeof()
    raw = data.draw(st.binary(min_size=fast.size, max_size=fast.size))
    parsed = struct_def.parse(raw)
    assert fast.decode(raw) == {n: parsed[n] for n in fast.names}
    assert fast.pack(parsed) == struct_def.build(parsed)
    if not _has_padding(struct_def):
        assert fast.pack(parsed) == raw
    dtype = fast.dtype()
    assert (dtype.names or ()) == fast.names and dtype.itemsize == fast.size
    table = np.frombuffer(raw, dtype=dtype)
    for name, kind in zip(fast.names, fast.kinds, strict=True):
        value = table[0][name]
        if kind == "bytes":
            assert bytes(value) == parsed[name]
        else:
            assert int(value) == _as_int(parsed[name], kind)


@pytest.mark.parametrize("struct_def", [
    pytest.param(cs.Struct("a" / cs.Int16ub, "b" / cs.Int16ul), id="be-then-le"),
    pytest.param(cs.Struct("a" / cs.Int32ul, "ip" / IPv4), id="le-then-ipv4"),
    pytest.param(cs.Struct("a" / cs.Int64sl, "b" / cs.Bytes(2), "c" / cs.Int64sb), id="signed"),
    pytest.param(cs.Struct("a" / cs.Int8ul, "b" / cs.Int16ul, "c" / cs.Int32ub),
                 id="one-byte-does-not-hide-the-mix"),
])
def test_mixed_byte_orders_raise(struct_def: cs.Struct) -> None:
    with pytest.raises(TypeError, match="byte orders"):
        derive(struct_def, name="mixed")


@pytest.mark.parametrize(("struct_def", "fmt"), [
    pytest.param(cs.Struct("a" / cs.Int8ul, "b" / cs.Int32ub), ">BL", id="le-byte-then-be"),
    pytest.param(cs.Struct("a" / cs.Int8sb, "b" / cs.Int16ul), "<bH", id="be-byte-then-le"),
    pytest.param(cs.Struct("a" / cs.Int8ul, "b" / cs.Int8sb), ">Bb", id="bytes-only"),
    pytest.param(cs.Struct("a" / cs.Int8un, "b" / cs.Int16ub), ">BH", id="native-byte"),
])
def test_single_bytes_have_no_byte_order(struct_def: cs.Struct, fmt: str) -> None:
    fast = derive(struct_def)
    assert fast.format == fmt
    raw = b"\x81\x02\x03" + (b"\x04\x05" if fast.size == 5 else b"")
    raw = raw[: fast.size]
    assert fast.decode(raw) == {k: v for k, v in struct_def.parse(raw).items() if k != "_io"}
    assert fast.pack(struct_def.parse(raw)) == raw


def test_variable_members_end_the_fast_prefix() -> None:
    middle = cs.Struct("a" / cs.Int8ub, "n" / cs.Int8ub, "v" / cs.Bytes(cs.this.n),
                       "z" / cs.Int16ub)
    fast = derive(middle)
    assert (fast.names, fast.format, fast.complete) == (("a", "n"), ">BB", False)
    assert fast.decode(b"\x07\x02xy\x00\x01") == {"a": 7, "n": 2}
    trailing = cs.Struct("a" / cs.Int16ub, "trailing" / cs.Bytes(cs.this.a))
    assert derive(trailing).complete
    assert derive(trailing).names == ("a",)
    other_tail = cs.Struct("a" / cs.Int16ub, "rest" / cs.GreedyBytes)
    assert not derive(other_tail).complete
    for kind in lbmc.header_kinds():
        assert kind.struct is not None
        fast = derive(kind.struct)
        if kind.fixed:
            assert fast.complete and "trailing" not in fast.names
        else:
            assert not fast.complete
            # an extended option may carry no data at all
            assert fast.size < kind.min_len or kind.name in ("tsni", "apphdr_chain", "extopt")


# --- regressions (former bugs) and open problems --------------------------------------------------


# (was a bug: fields.members() skipped unnamed members, so derive() compiled '>BH' (3 bytes)
# for this 5-byte struct and decoded b from the padding)
def test_unnamed_padding_becomes_pad_bytes() -> None:
    struct_def = cs.Struct("a" / cs.Int8ub, cs.Padding(2), "b" / cs.Int16ub)
    fast = derive(struct_def)
    assert (fast.format, fast.names, fast.kinds) == (">B2xH", ("a", "b"), ("int", "int"))
    assert fast.complete
    assert fast.size == struct_def.sizeof() == 5
    for raw in (b"\x01\x00\x00\x00\x02", b"\x01\xaa\xbb\x00\x02"):
        assert fast.decode(raw) == {"a": 1, "b": 2}
        assert fast.unpack_from(raw) == (1, 2)
    assert fast.pack({"a": 1, "b": 2}) == struct_def.build({"a": 1, "b": 2}) == (
        b"\x01\x00\x00\x00\x02")
    dtype = fast.dtype()
    assert dtype.names == ("a", "b")
    assert (dtype.fields["a"][1], dtype.fields["b"][1], dtype.itemsize) == (0, 3, 5)
    table = np.frombuffer(b"\x01\xaa\xbb\x00\x02" * 2, dtype=dtype)
    assert [(int(r["a"]), int(r["b"])) for r in table] == [(1, 2), (1, 2)]
    # padding first and last, and inside the fixed prefix of a variable struct
    edges = cs.Struct(cs.Padding(1), "a" / cs.Int16ul, cs.Padding(3))
    assert derive(edges).format == "<1xH3x"
    assert derive(edges).decode(b"\xff\x01\x02\xff\xff\xff") == {"a": 0x0201}
    prefix = cs.Struct("n" / cs.Int8ub, cs.Padding(1), "v" / cs.Bytes(cs.this.n))
    assert (derive(prefix).format, derive(prefix).names) == (">B1x", ("n",))


# (was a bug: native-order members were compiled as big-endian, '=L' read 01 00 00 00 as
# 16777216 where Construct on a little-endian host gives 1)
@pytest.mark.parametrize("subcon", [cs.Int16un, cs.Int32un, cs.Int64sn, cs.Float32n])
def test_native_order_members_are_refused(subcon: cs.Construct) -> None:
    with pytest.raises(TypeError, match="native"):
        derive(cs.Struct("x" / cs.Int16ub, "a" / subcon), name="native")


# (was a bug: float letters were missing from the dtype table, Float32b got dtype 'S', width 0)
@pytest.mark.parametrize(("subcon", "raw", "value", "numpy"), [
    pytest.param(cs.Float32b, b"\x3f\x80\x00\x00", 1.0, ">f4", id="f4-be"),
    pytest.param(cs.Float64l, b"\x00\x00\x00\x00\x00\x00\xf8\x3f", 1.5, "<f8", id="f8-le"),
    pytest.param(cs.Float16b, b"\xc0\x00", -2.0, ">f2", id="f2-be"),
])
def test_float_members_get_a_numeric_dtype(subcon: cs.Construct, raw: bytes, value: float,
                                           numpy: str) -> None:
    struct_def = cs.Struct("a" / subcon)
    fast = derive(struct_def)
    assert fast.kinds == ("float",)
    assert fast.decode(raw) == {"a": value} == {"a": struct_def.parse(raw).a}
    assert fast.pack({"a": value}) == raw == struct_def.build({"a": value})
    dtype = fast.dtype()
    assert dtype["a"] == np.dtype(numpy)
    assert dtype.itemsize == len(raw)
    assert float(np.frombuffer(raw, dtype=dtype)[0]["a"]) == value


# (was a bug: numpy's 'S' dtype dropped trailing NULs of byte members on item access)
def test_byte_members_keep_trailing_nuls_in_numpy() -> None:
    fast = derive(cs.Struct("m" / cs.Bytes(4), "t" / cs.Int16ub))
    dtype = fast.dtype()
    assert dtype["m"] == np.dtype("V4")
    record = np.frombuffer(b"ab\0\0\x00\x07", dtype=dtype)[0]
    assert bytes(record["m"]) == b"ab\0\0" == fast.decode(b"ab\0\0\x00\x07")["m"]
    assert int(record["t"]) == 7


# (was a bug: FastLayout.pack() relied on struct's 'Ns', which silently zero-padded short and
# truncated long byte strings where Construct's build raises)
def test_pack_refuses_byte_strings_of_the_wrong_length() -> None:
    struct_def = cs.Struct("a" / cs.Int8ub, "c" / cs.Bytes(8))
    fast = derive(struct_def)
    for wrong in (b"", b"abc", b"abcdefg", b"abcdefghi", b"abcdefghij"):
        with pytest.raises(ValueError, match=r"\bc\b.*8 bytes"):
            fast.pack({"a": 1, "c": wrong})
        with pytest.raises(cs.ConstructError):
            struct_def.build({"a": 1, "c": wrong})
    assert fast.pack({"a": 1, "c": b"abcdefgh"}) == b"\x01abcdefgh"


# (was a bug: inet_aton accepted legacy forms, '010.0.0.1' was packed as 8.0.0.1)
def test_pack_refuses_what_the_ipv4_adapter_refuses() -> None:
    fast = derive(cs.Struct(field("ip", IPv4)))
    for text in ("010.0.0.1", "127.1", "0x7f.0.0.1"):
        with pytest.raises(ValueError):
            cs.Struct(field("ip", IPv4)).build({"ip": text})
        with pytest.raises((WireError, ValueError, OSError)):
            fast.pack({"ip": text})


# (was a bug, against wire/errors.py's contract: FastLayout.decode() of a short buffer raised
# a bare struct.error)
def test_decode_of_short_bytes_raises_wire_error() -> None:
    fast = derive(cs.Struct("a" / cs.Int8ub, "b" / cs.Int8ub), name="lbmc.test_layout")
    assert fast.name == "lbmc.test_layout"
    for buf, offset in ((b"", 0), (b"\x01", 0), (b"\x01\x02\x03", 2), (b"\x01", 5)):
        with pytest.raises(WireError) as info:
            fast.decode(buf, offset)
        assert (info.value.header, info.value.offset) == ("lbmc.test_layout", offset)
        assert f"{max(0, len(buf) - offset)} bytes" in info.value.reason
        assert "needs 2" in info.value.reason
    assert fast.decode(b"\x01\x02\x03", 1) == {"a": 2, "b": 3}
    assert derive(cs.Struct("a" / cs.Int8ub)).name == "struct"
    with pytest.raises(WireError) as info:
        derive(cs.Struct("a" / cs.Int8ub)).decode(b"")
    assert info.value.header == "struct"


def test_header_layouts_are_named_after_their_header() -> None:
    """A short header in the fast path is reported under the header's tshark name."""
    for kind in lbmc.header_kinds():
        if kind.fast is not None:
            assert kind.fast.name == kind.tshark
            with pytest.raises(WireError) as info:
                kind.fast.decode(bytes(kind.fast.size - 1))
            assert info.value.header == kind.tshark


@pytest.mark.parametrize("struct_def", [
    pytest.param(cs.Struct(cs.Const(b"AB"), "a" / cs.Int8ub), id="unnamed-const"),
    pytest.param(cs.Struct("a" / cs.Int8ub, cs.Padding(2, pattern=b"\xff")), id="pattern"),
    pytest.param(cs.Struct("a" / cs.Int8ub, "p" / cs.Padding(2)), id="named-padding"),
])
def test_unnamed_members_other_than_zero_padding_agree_with_construct(
        struct_def: cs.Struct) -> None:
    try:
        fast = derive(struct_def)
    except TypeError:
        return  # refusing the struct would be fine
    values = {m.name: (7 if m.name == "a" else None) for m in members(struct_def)}
    built = struct_def.build(values)
    assert fast.pack(values) == built
    parsed = struct_def.parse(built)
    assert fast.decode(built) == {n: parsed[n] for n in fast.names}
    flipped = bytes(b ^ 0x5A for b in built[:-1]) + built[-1:]
    try:
        expected = struct_def.parse(flipped)
    except cs.ConstructError:
        with pytest.raises(WireError):
            fast.decode(flipped)
    else:
        assert fast.decode(flipped) == {n: expected[n] for n in fast.names}
