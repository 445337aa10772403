"""tshark 4.0.x (the oracle) reads our LBMC bytes exactly as our codec describes them.

Everything travels on TCP connections to a store port (LBT-TCP framing, docs/wire-transports.md §3),
``wire.tshark.PortMap(store_ports=[STORE_PORT])``, many messages per capture because each tshark
run costs about half a second.  Per LBMC message, every (field, value) pair of
``LbmcMessage.tshark_fields()`` must be what tshark shows, and valid traffic must give no
``_ws.malformed`` and no Error/Warn in ``tshark -z expert`` (TSNI Notes and TCP Chats are
expected).

Covered: every header kind in CONTROL messages (and DATA messages for the data-family
headers) with edge and random field values, random mixed messages (Hypothesis), the fact-sheet
pitfalls (docs/wire-lbmc.md §6.2: chain terminators, hdr_len above the layout, several messages
per segment, a message split across segments, fragments reassembled by tshark), message
properties, the Info-column labels, malformed input flagged by both sides, and the tshark
field registry (names and bitmasks).
"""

from __future__ import annotations

import random
import string
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import construct as cs
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from tests.wire import strategies
from wire import WireError, lbmc, pcap, tshark
from wire.fields import bit_views, fixed_format, members, qualify, tshark_name, value_kind
from wire.lbmc import (
    ChainElement,
    HeaderKind,
    LbmcMessage,
    MessageType,
    OpaqueHeader,
    UmeKeepalive,
    UmePreg,
    UmeStore,
    UmeStoreid,
)

pytestmark = pytest.mark.oracle

STORE_PORT = 29001
TRANSPORT_PORT = 14371  # in tshark's default LBT-TCP source-port range: a transport channel
PORTS = tshark.PortMap(store_ports=[STORE_PORT])
KINDS = lbmc.header_kinds()

# docs/wire-lbmc.md §1.7 (HINT: layout naming): the headers that decorate data messages
DATA_FAMILY = frozenset({
    "frag", "batch", "tcp_request", "topicname", "apphdr", "apphdr_chain", "otid", "ctxinstd",
    "ctxinstr", "ctxinst", "srcidx", "stream", "destination", "domain", "odomain", "topic_idx",
})
SRCIDX = lbmc.Srcidx.kind.code

ERROR, WARN = "8388608", "6291456"  # _ws.expert.severity values


# --- capture building and checking -------------------------------------------------------------


@dataclass
class Capture:
    """Frames of TCP connections and, per frame, the LBMC messages tshark must dissect there."""

    frames: list[bytes] = field(default_factory=list)
    expected: dict[int, list[LbmcMessage]] = field(default_factory=dict)
    transport_frames: set[int] = field(default_factory=set)
    _conv: pcap.TcpConversation | None = None
    _port: int = 0
    _clients: int = 0

    def connect(self, server_port: int = STORE_PORT) -> None:
        self._clients += 1
        self._conv = pcap.TcpConversation(("10.0.0.1", 40000 + self._clients),
                                          ("10.0.0.2", server_port))
        self._port = server_port
        self.frames += self._conv.handshake()

    def send(self, payload: bytes, messages: Sequence[LbmcMessage] = (),
             from_client: bool = True) -> int:
        """One TCP segment; ``messages`` are those whose dissection completes in it."""
        if self._conv is None:
            self.connect()
        assert self._conv is not None
        self.frames.append(self._conv.send(from_client, payload))
        number = len(self.frames)
        if messages:
            self.expected[number] = list(messages)
        if self._port == TRANSPORT_PORT:
            self.transport_frames.add(number)
        return number

    def send_messages(self, messages: Sequence[LbmcMessage], from_client: bool = True) -> int:
        return self.send(lbmc.build_messages(messages), messages, from_client)

    def write(self, path: Path) -> Path:
        pcap.write_pcap(path, self.frames, step=0.001)
        return path


def expected_fields(message: LbmcMessage) -> list[tuple[str, Any]]:
    """tshark's view of one message: our export plus the apphdr-chain elements."""
    out = list(message.tshark_fields())
    for header in message.headers:
        if isinstance(header, lbmc.AppHdrChain):
            out += chain_element_fields(header)
    return out


def payload_shown(message: LbmcMessage) -> bytes | None:
    """The payload tshark shows as data.data (properties cut off), None when it shows none."""
    if message.chain_end() != lbmc.NHDR_DATA or not message.payload:
        return None
    body = message.payload[: len(message.payload) - lbmc.msgprop_length(message)]
    return body or None


def tshark_bytes(text: str) -> str:
    """An FT_BYTES value as bare hex.  (Not tshark.normalize, which once read a 1-byte value as
    an integer: see test_compare_one_byte_bytes_values.)"""
    return text.replace(":", "").lower()


def chain_element_fields(header: lbmc.Header) -> list[tuple[str, Any]]:
    """The apphdr-chain elements as tshark shows them.  tshark calls an element's byte 0
    ``next_hdr`` but reads it as the element's own type (see lbmc.ChainElement): it is the
    ``tag`` the parser records.  Element data is an FT_NONE item in tshark ("Data (n bytes)",
    no value), so hdr_len is what shows its size."""
    out: list[tuple[str, Any]] = []
    for element in lbmc.parse_apphdr_chain(header):
        if element.type == lbmc.MSGPROP_ELEMENT:
            prefix = "lbmc.apphdr_chain.msgprop"
            out += [(f"{prefix}.next_hdr", element.tag), (f"{prefix}.hdr_len", 8),
                    (f"{prefix}.res", element.res), (f"{prefix}.proplen", element.proplen)]
        else:
            prefix = "lbmc.apphdr_chain.element"
            out += [(f"{prefix}.next_hdr", element.tag),
                    (f"{prefix}.hdr_len", 4 + len(element.data)),
                    (f"{prefix}.res", element.res)]
    return out


def info_label(message: LbmcMessage, transport: bool) -> str:
    """docs/wire-lbmc.md §1.9: data labels get "RX-" off transport channels without SRCIDX."""
    label = message.label()
    if (message.chain_end() == lbmc.NHDR_DATA and not transport
            and not any(h.header_code == SRCIDX for h in message.headers)):
        return "RX-" + label
    return label


@dataclass
class Result:
    frames: dict[int, tshark.TsharkFrame]
    disagreements: dict[int, list[list[tshark.Disagreement]]]  # frame -> per message
    info: dict[int, str]
    experts: dict[str, list[str]]


def run_oracle(capture: Capture, path: Path, ports: tshark.PortMap = PORTS,
               fields: Callable[[LbmcMessage], list[tuple[str, Any]]] = expected_fields,
               check_payload: bool = True) -> Result:
    capture.write(path)
    frames = {f.number: f for f in tshark.read_frames(path, ports)}
    assert len(frames) == len(capture.frames)
    disagreements: dict[int, list[list[tshark.Disagreement]]] = {}
    for number, messages in capture.expected.items():
        occurrences = frames[number].occurrences("lbmc")
        assert len(occurrences) == len(messages), (
            f"frame {number}: tshark shows {len(occurrences)} LBMC messages, "
            f"we sent {len(messages)}")
        disagreements[number] = []
        for message, occurrence in zip(messages, occurrences, strict=True):
            problems = tshark.compare(number, fields(message), occurrence)
            if check_payload:
                body = payload_shown(message)
                shown = [tshark_bytes(v) for k, v in occurrence if k == "data.data"]
                if shown != ([] if body is None else [body.hex()]):
                    problems.append(tshark.Disagreement(
                        number, "data.data", None if body is None else body.hex(),
                        ",".join(shown) or None))
            disagreements[number].append(problems)
    rows = tshark.run(["-r", str(path), *ports.tshark_args(), "-T", "fields", "-e",
                       "frame.number", "-e", "_ws.col.Info", "-E", "separator=|"])
    info = {int(n): text for n, text in (line.split("|", 1) for line in rows.splitlines())}
    return Result(frames, disagreements, info, tshark.expert_summary(path, ports))


def assert_clean(result: Result, capture: Capture) -> None:
    """Zero disagreements, no malformed frame, no Error/Warn anywhere, Info labels as ours."""
    problems = [str(d) for per_frame in result.disagreements.values()
                for per_message in per_frame for d in per_message]
    assert not problems, "\n".join(problems[:40])
    malformed = {n: f.malformed for n, f in result.frames.items() if f.malformed}
    assert not malformed
    bad_experts = {n: f.experts for n, f in result.frames.items()
                   if any(sev in (ERROR, WARN) for sev, _ in f.experts)}
    assert not bad_experts
    assert set(result.experts) <= {"Notes", "Chats"}, result.experts
    notes = result.experts.get("Notes", [])
    assert all(n.startswith("TSNI Sqn 0x") for n in notes), notes
    for number, messages in capture.expected.items():
        transport = number in capture.transport_frames
        labels = [info_label(m, transport) for m in messages]
        assert result.info[number] == " ".join(label for label in labels if label), number


# --- random values read off the Construct definitions --------------------------------------------


PRINTABLE = string.ascii_letters + string.digits + string.punctuation + " "


def random_member(member: cs.Construct, rng: random.Random, mode: str) -> Any:
    """A value for one struct member: ``mode`` "min" (zeros), "max" (all ones) or "random"."""
    if isinstance(member.subcon, cs.Array):  # TSNI records
        count = {"min": 0, "max": 8}.get(mode, rng.randrange(1, 6))
        return [{m.name: random_member(m, rng, mode) for m in members(member.subcon.subcon)}
                for _ in range(count)]
    kind, letter = value_kind(member), fixed_format(member)
    if kind == "int":
        assert letter is not None
        top = (1 << (8 * struct.calcsize(">" + letter))) - 1
        return {"min": 0, "max": top}.get(mode, rng.randint(0, top))
    if kind == "ipv4":
        value = {"min": 0, "max": 0xFFFFFFFF}.get(mode, rng.getrandbits(32))
        return ".".join(str(b) for b in value.to_bytes(4, "big"))
    if kind == "text":
        size = 60 if mode == "max" else rng.randrange(1, 40)
        return "".join(rng.choice(PRINTABLE) for _ in range(size))
    if letter is not None:
        size = int(letter[:-1])
        return {"min": bytes(size), "max": b"\xff" * size}.get(mode, rng.randbytes(size))
    return b""  # variable bytes: trailing, data, elements (chosen by the caller)


def random_header(kind: HeaderKind, rng: random.Random, mode: str, *,
                  trailing: bool = False, msgprops: bool = True) -> lbmc.Header:
    cls = lbmc.header_class(kind.code)
    assert cls is not None and kind.struct is not None
    if kind.name == "apphdr_chain":
        # the properties-length element anywhere in the chain: every element carries its own
        # type in byte 0, which is where tshark looks for the types after the first
        elements = []
        for _ in range(rng.randrange(0 if mode == "min" else 1, 4)):
            elements.append(ChainElement(rng.randrange(1, 6), res=rng.getrandbits(16),
                                         data=rng.randbytes(rng.randrange(1, 12))))
        if msgprops and mode != "min" and rng.random() < 0.6:
            elements.insert(rng.randrange(len(elements) + 1),
                            ChainElement(6, proplen=rng.getrandbits(32), res=rng.getrandbits(16)))
        return lbmc.build_apphdr_chain(elements)
    values = {m.name: random_member(m, rng, mode) for m in members(kind.struct)
              if m.name not in ("next_hdr", "hdr_len")}
    if kind.name == "apphdr":
        values["data"] = rng.randbytes(rng.randrange(1, 40))
    if kind.name == "extopt":
        # whole options: raw data under a subtype tshark does not know, or a configuration
        # option, which tshark shows field by field
        values.update(flags=values["flags"] & 0xC0, fragment_offset=0)
        if rng.random() < 0.5:
            option = lbmc.CfgOpt(rng.randrange(1, 6), "opt_" + str(rng.getrandbits(20)),
                                 str(rng.getrandbits(32)))
            values.update(subtype=lbmc.CFGOPT_SUBTYPE, data=option.header().data)
        else:
            values.update(subtype=0x1234, data=rng.randbytes(rng.randrange(0, 40)))
    if "trailing" in values and trailing:
        limit = 8 - 1 if kind.name == "tsni" else 8
        values["trailing"] = rng.randbytes(rng.randrange(1, limit + 1))
    return cls(**values)


def all_kinds_messages(rng: random.Random) -> list[tuple[HeaderKind | None, LbmcMessage, bool]]:
    """(kind or None for mixed chains, message, send on the transport connection?)."""
    out: list[tuple[HeaderKind | None, LbmcMessage, bool]] = []
    modes = ["min", "max", "random", "random"]
    for kind in KINDS:
        for i, mode in enumerate(modes):
            header = random_header(kind, rng, mode, trailing=i == 3)
            out.append((kind, LbmcMessage(type=MessageType.CONTROL, headers=[header]), False))
        if kind.name in DATA_FAMILY:
            types = [MessageType.MESSAGE, MessageType.PRORX, MessageType.RETRANS,
                     MessageType.MESSAGE]
            for i, (mode, mtype) in enumerate(zip(modes, types, strict=True)):
                header = random_header(kind, rng, mode, trailing=i == 3, msgprops=False)
                payload = rng.randbytes(rng.randrange(0, 48))
                message = LbmcMessage(type=mtype, headers=[header], payload=payload,
                                      tidx=rng.getrandbits(32), sqn=rng.getrandbits(32))
                out.append((kind, message, i % 2 == 1))
    # mixed chains: every kind once more, in random order, chained four at a time
    shuffled = list(KINDS)
    rng.shuffle(shuffled)
    for start in range(0, len(shuffled), 4):
        headers: list[lbmc.AnyHeader] = [
            random_header(k, rng, "random", trailing=rng.random() < 0.5, msgprops=False)
            for k in shuffled[start : start + 4]]
        out.append((None, LbmcMessage(type=MessageType.CONTROL, headers=headers), False))
        out.append((None, LbmcMessage(type=rng.choice(sorted(lbmc.DATA_TYPES)),
                                      headers=list(reversed(headers)),
                                      payload=rng.randbytes(rng.randrange(1, 30))), False))
    return out


@dataclass
class AllKinds:
    result: Result
    capture: Capture
    where: list[tuple[HeaderKind | None, LbmcMessage, int, int]]  # kind, message, frame, index


@pytest.fixture(scope="module")
def all_kinds(tmp_path_factory: pytest.TempPathFactory) -> AllKinds:
    rng = random.Random(0x1B3C)
    items = all_kinds_messages(rng)
    capture = Capture()
    where: list[tuple[HeaderKind | None, LbmcMessage, int, int]] = []
    for transport in (False, True):
        capture.connect(TRANSPORT_PORT if transport else STORE_PORT)
        pos = 0
        pending = [(k, m) for k, m, t in items if t == transport]
        while pos < len(pending):
            group = pending[pos : pos + rng.randrange(1, 5)]
            pos += len(group)
            number = capture.send_messages([m for _, m in group], from_client=rng.random() < 0.7)
            where += [(k, m, number, i) for i, (k, m) in enumerate(group)]
    path = tmp_path_factory.mktemp("oracle") / "all_kinds.pcap"
    return AllKinds(run_oracle(capture, path), capture, where)


@pytest.mark.parametrize("kind", [pytest.param(k, id=k.name) for k in KINDS])
def test_every_header_kind_matches_tshark(all_kinds: AllKinds, kind: HeaderKind) -> None:
    mine = [(m, frame, i) for k, m, frame, i in all_kinds.where if k is kind]
    controls = [m for m, _, _ in mine if m.type == MessageType.CONTROL]
    datas = [m for m, _, _ in mine if m.type in lbmc.DATA_TYPES]
    assert len(controls) == 4
    assert len(datas) == (4 if kind.name in DATA_FAMILY else 0)
    assert all(m.chain_end() == lbmc.NHDR_NONE for m in controls)
    assert all(m.chain_end() == lbmc.NHDR_DATA for m in datas)
    for message, frame, index in mine:
        assert not all_kinds.result.frames[frame].malformed
        problems = all_kinds.result.disagreements[frame][index]
        assert not problems, "\n".join(map(str, problems))
        names = {name for name, _ in expected_fields(message)}
        assert any(name.startswith(kind.field_prefix + ".") for name in names)


def test_mixed_chains_match_tshark(all_kinds: AllKinds) -> None:
    mixed = [(m, frame, i) for k, m, frame, i in all_kinds.where if k is None]
    assert len(mixed) == 2 * ((len(KINDS) + 3) // 4)
    for _message, frame, index in mixed:
        problems = all_kinds.result.disagreements[frame][index]
        assert not problems, "\n".join(map(str, problems))


def test_all_kinds_capture_is_clean(all_kinds: AllKinds) -> None:
    """No malformed frame, only TSNI Notes and TCP Chats, Info labels as ours (RX-DATA on the
    store connection, DATA on the transport one), several messages per segment."""
    assert {k.name for k in KINDS} >= DATA_FAMILY
    assert_clean(all_kinds.result, all_kinds.capture)
    assert "Notes" in all_kinds.result.experts  # TSNI records were sent
    per_frame = [len(m) for m in all_kinds.capture.expected.values()]
    assert max(per_frame) >= 3
    assert all_kinds.capture.transport_frames


# --- random messages (Hypothesis) ---------------------------------------------------------------

LEAD = LbmcMessage(headers=[UmeKeepalive(reg_id=1)])


@settings(max_examples=max(2, settings().max_examples // 10),
          # no shrinking: every step would start tshark twice; the report names the frame,
          # the field and both values, which is enough to find the message
          phases=[Phase.explicit, Phase.reuse, Phase.generate],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large])
@given(data=st.data())
def test_random_messages_match_tshark(tmp_path: Path, data: st.DataObject) -> None:
    messages = data.draw(st.lists(strategies.messages(), min_size=20, max_size=40),
                         label="messages")
    capture = Capture()
    capture.connect()
    pos = 0
    while pos < len(messages):
        group = messages[pos : pos + data.draw(st.integers(1, 4), label="group")]
        pos += len(group)
        # docs/wire-lbmc.md §6.2 pitfall 2: a segment cannot start with first next_hdr 0xFF
        if group[0].build()[1] == lbmc.NHDR_NONE:
            group = [LEAD, *group]
        capture.send_messages(group, from_client=data.draw(st.booleans(), label="direction"))
    result = run_oracle(capture, tmp_path / "random.pcap")
    assert_clean(result, capture)


# --- fact-sheet pitfalls -----------------------------------------------------------------------


def ack(**values: Any) -> lbmc.Header:
    return lbmc.UmeAck(flags=0x48, type=lbmc.AckType.STABLE, transport_idx=3, id_2=4,
                       rcv_reg_id=5, seqnum=6, **values)


def test_chain_terminators_and_labels(tmp_path: Path) -> None:
    """0xFF gives the control label, 0x00 gives (RX-)DATA whatever the type nibble says."""
    cases = [
        (LbmcMessage(type=MessageType.CONTROL, headers=[ack()]), "ACK"),
        (LbmcMessage(type=MessageType.CONTROL, headers=[ack()], terminator=0x00,
                     payload=b"control payload"), "RX-DATA"),
        (LbmcMessage(type=MessageType.CONTROL, headers=[ack(), lbmc.Srcidx(srcidx=9)],
                     terminator=0x00, payload=b"x"), "DATA"),
        (LbmcMessage(type=MessageType.MESSAGE, headers=[UmePreg(reg_id=1, s_flag=1)],
                     terminator=0xFF, tidx=1, sqn=2), "PREG"),
        (LbmcMessage(type=MessageType.MESSAGE, headers=[lbmc.TcpRequest(qidx=1)],
                     payload=b"req"), "RX-DATA[REQ]"),
        (LbmcMessage(type=MessageType.MESSAGE, headers=[lbmc.Topicname(topic="t")]), "RX-DATA"),
        (LbmcMessage(type=MessageType.EOT, headers=[UmeStore(flags=0x80, grp_idx=5)]), ""),
        (LbmcMessage(type=MessageType.CONTROL, headers=[UmeStoreid(store_id=1)],
                     trailer=b"ignored by tshark"), ""),
        # unfinished chain: the message ends while the PREG code is pending (no expert)
        (LbmcMessage(type=MessageType.CONTROL, headers=[UmeStoreid(store_id=2)],
                     terminator=UmePreg.kind.code, trailer=b"\x01\x02"), ""),
        (LbmcMessage(type=MessageType.CONTROL, headers=[UmeStoreid(store_id=2)],
                     terminator=UmePreg.kind.code), ""),
    ]
    capture = Capture()
    capture.connect()
    for message, label in cases:
        number = capture.send_messages([message])
        assert info_label(message, transport=False) == label, message
        assert number in capture.expected
    # pitfall 2: a segment starting with a header-less control message is not LBT-TCP at all
    bare = capture.send(LbmcMessage().build())
    result = run_oracle(capture, tmp_path / "chains.pcap")
    assert_clean(result, capture)
    assert result.frames[bare].occurrences("lbmc") == []
    assert "LBT-TCP" not in tshark.run(["-r", str(tmp_path / "chains.pcap"),
                                        *PORTS.tshark_args(), "-Y", f"frame.number=={bare}"])


def test_hdr_len_longer_than_the_layout(tmp_path: Path) -> None:
    """tshark skips the extra bytes and finds the next header after them (6.3 frame 11)."""
    capture = Capture()
    capture.connect()
    for kind in KINDS:
        cls = lbmc.header_class(kind.code)
        assert cls is not None
        if not kind.fixed:
            continue
        tail = bytes(range(1, 1 + 1 + kind.code % 7))
        message = LbmcMessage(headers=[cls(trailing=tail), UmeKeepalive(reg_id=kind.code)])
        raw = message.build()
        assert kind.fast is not None and raw[5] == kind.fast.size + len(tail)
        capture.send_messages([message])
    result = run_oracle(capture, tmp_path / "longer.pcap")
    assert_clean(result, capture)


def test_messages_split_across_segments(tmp_path: Path) -> None:
    """A message cut at every byte boundary: tshark reassembles it in the second segment."""
    lead = LbmcMessage(headers=[UmeKeepalive(reg_id=77)])
    message = LbmcMessage(headers=[UmePreg(reg_id=9, trailing=b"abcd"), UmeStoreid(store_id=4)])
    raw = message.build()
    capture = Capture()
    capture.connect()
    for cut in range(1, len(raw)):
        capture.send(lead.build() + raw[:cut], [lead])
        capture.send(raw[cut:] + lead.build(), [message, lead])
    # one message in three segments, and a data message split inside its payload
    data = LbmcMessage(type=MessageType.MESSAGE, headers=[lbmc.Srcidx(srcidx=1)],
                       payload=bytes(range(200)), tidx=5, sqn=6)
    blob = data.build()
    capture.send(blob[:7])
    capture.send(blob[7:100])
    capture.send(blob[100:], [data])
    result = run_oracle(capture, tmp_path / "split.pcap")
    assert_clean(result, capture)


def test_fragments_reassembled_by_tshark(tmp_path: Path) -> None:
    """docs/wire-lbmc.md §3.1: FRAG headers; tshark -2 with lbmc.reassemble_fragments rebuilds the
    payload we cut, even with two messages' fragments interleaved and out of order."""
    rng = random.Random(3)
    payloads = {100: rng.randbytes(1000), 500: bytes(range(256)) * 2}
    fragments: list[tuple[int, LbmcMessage]] = []
    for first, payload in payloads.items():
        cuts = sorted(rng.sample(range(1, len(payload)), 4))
        bounds = list(zip([0, *cuts], [*cuts, len(payload)], strict=True))
        for i, (start, end) in enumerate(bounds):
            fragments.append((first, LbmcMessage(
                type=MessageType.MESSAGE, tidx=7, sqn=first + i,
                headers=[lbmc.Frag(first_sqn=first, offset=start, len=len(payload)),
                         lbmc.Srcidx(srcidx=first)],
                payload=payload[start:end])))
    order = [0, 5, 1, 6, 3, 2, 7, 4, 9, 8]  # interleaved, out of order within each message
    fragments = [fragments[i] for i in order]
    capture = Capture()
    capture.connect()
    numbers = {}
    for _, message in fragments:
        numbers[id(message)] = capture.send_messages([message])
    ports = tshark.PortMap(store_ports=[STORE_PORT], reassemble_fragments=True)
    assert ports.tshark_args()[0] == "-2"

    # the completing fragment shows the whole message as data: payloads are checked below
    result = run_oracle(capture, tmp_path / "frag.pcap", ports, check_payload=False)
    assert_clean(result, capture)
    for first, payload in payloads.items():
        mine = [m for f, m in fragments if f == first]
        last = numbers[id(mine[-1])]
        (occurrence,) = result.frames[last].occurrences("lbmc")
        reassembled = [v for k, v in occurrence if k == "data.data"]
        assert tshark_bytes(reassembled[-1]) == payload.hex()
        members_ = [int(v) for k, v in occurrence if k == "lbmc.reassembly.fragment"]
        assert sorted(members_) == sorted(numbers[id(m)] for m in mine)
        for message in mine[:-1]:
            (occurrence,) = result.frames[numbers[id(message)]].occurrences("lbmc")
            assert ("lbmc.reassembly_frame", str(last)) in occurrence
            shown = [v for k, v in occurrence if k == "data.data"]
            assert [tshark_bytes(v) for v in shown] == [message.payload.hex()]


def properties_block(little_endian: bool) -> bytes:
    """docs/wire-lbmc.md §3.3: keys k1 (int -5) and name (string "val"), key offsets 40 and 47."""
    order = "<" if little_endian else ">"
    magic = b"\xba\xda\xac\xab" if little_endian else b"\xab\xac\xda\xba"
    head = magic + struct.pack(order + "HBB", 2, 0, 0)
    records = struct.pack(order + "IIII", 40, 43, 0x1111, 4)
    records += struct.pack(order + "IIII", 47, 52, 0x2222, 8)
    return head + records + b"k1\0" + struct.pack(order + "i", -5) + b"name\0" + b"val\0"


# (was a bug/spec conflict: the chain builder carried each element's type in its predecessor,
# like LBMC headers, but tshark takes the first type from first_chain_hdr and every later type
# from the element's OWN byte 0; a properties element after a user element was missed by
# tshark and the properties block shown as payload)
@pytest.mark.parametrize("little_endian", [True, False], ids=["le", "be"])
@pytest.mark.parametrize("layout", [
    pytest.param("msgprop", id="msgprop-only"),
    pytest.param("msgprop-user", id="msgprop-then-user"),
    pytest.param("user-msgprop", id="user-then-msgprop"),
    pytest.param("user-msgprop-user", id="msgprop-between-users"),
])
def test_message_properties_are_cut_from_the_payload(tmp_path: Path, little_endian: bool,
                                                     layout: str) -> None:
    block = properties_block(little_endian)
    assert len(block) == 56
    user = ChainElement(5, data=b"user")
    other = ChainElement(2, data=b"\x06\x08")  # data that looks like a msgprop element
    props = ChainElement(6, proplen=len(block), res=0)
    elements = {"msgprop": [props], "msgprop-user": [props, user],
                "user-msgprop": [user, props], "user-msgprop-user": [user, props, other]}[layout]
    chain = lbmc.build_apphdr_chain(elements)
    message = LbmcMessage(type=MessageType.MESSAGE, headers=[chain, lbmc.Srcidx(srcidx=3)],
                          payload=b"application payload" + block, tidx=1, sqn=1)
    parsed, _ = lbmc.parse_message(message.build())
    assert lbmc.msgprop_length(parsed) == 56
    assert parsed.payload[:-56] == b"application payload"
    capture = Capture()
    capture.connect()
    number = capture.send_messages([message])
    result = run_oracle(capture, tmp_path / "props.pcap")
    (occurrence,) = result.frames[number].occurrences("lbmc")
    shown = dict(occurrence)
    assert shown.get("lbmc.lbm_msg_properties.data.num_fields") == "2"
    assert [v for k, v in occurrence if k == "lbmc.lbm_msg_properties.hdr.key"] == ["k1", "name"]
    assert shown["lbmc.lbm_msg_properties.hdr.int_value"] == str(2**32 - 5)
    assert shown["lbmc.lbm_msg_properties.hdr.string_value"] == "val"
    assert_clean(result, capture)


def test_spec_frame_4(tmp_path: Path) -> None:
    """docs/wire-lbmc.md §6.3 frame 4: PREG and a source keepalive in one segment: "PREG UME-KA"."""
    preg = LbmcMessage(headers=[UmePreg(
        f_flag=1, w_flag=1, s_flag=1, marker=1, reg_id=0x11223344, transport_idx=7,
        topic_idx=9, resp_port=14391, resp_ip="10.0.0.1")])
    keepalive = LbmcMessage(headers=[UmeKeepalive(type=lbmc.KeepaliveType.SOURCE,
                                                  reg_id=0x11223344)])
    assert preg.build().hex() == (
        "08120020ff1c5081112233440000000700000009000000003837" "00000a000001")
    capture = Capture()
    capture.connect()
    number = capture.send_messages([preg, keepalive])
    result = run_oracle(capture, tmp_path / "frame4.pcap")
    assert_clean(result, capture)
    assert result.info[number] == "PREG UME-KA"
    first = dict(result.frames[number].occurrences("lbmc")[0])
    assert {k: first[k] for k in ("lbmc.ume_preg.flags", "lbmc.ume_preg.s_flag",
                                  "lbmc.ume_preg.marker", "lbmc.ume_preg.reg_id",
                                  "lbmc.ume_preg.resp_port", "lbmc.ume_preg.resp_ip")} == {
        "lbmc.ume_preg.flags": "0x50", "lbmc.ume_preg.s_flag": "1",
        "lbmc.ume_preg.marker": "1", "lbmc.ume_preg.reg_id": "287454020",
        "lbmc.ume_preg.resp_port": "14391", "lbmc.ume_preg.resp_ip": "10.0.0.1"}


# (was a bug: build_apphdr_chain() encoded a generic element with empty data, element hdr_len
# 4, which tshark flags 'Header length incorrect')
def test_apphdr_chain_builder_makes_only_what_tshark_accepts(tmp_path: Path) -> None:
    with pytest.raises(WireError) as info:
        lbmc.build_apphdr_chain([ChainElement(5, data=b""), ChainElement(1, data=b"zz")])
    assert (info.value.header, info.value.offset) == ("lbmc.apphdr_chain.element", 4)
    # the same bytes crafted by hand: tshark flags them, and our parser refuses them
    empty = lbmc.AppHdrChain(first_chain_hdr=5, elements=bytes.fromhex("0504 0000 0106 0000 7a7a"))
    with pytest.raises(WireError):
        lbmc.parse_apphdr_chain(empty)
    # and one data byte is enough for both
    one = lbmc.build_apphdr_chain([ChainElement(5, data=b"z"), ChainElement(1, data=b"zz")])
    assert one.elements == bytes.fromhex("0505 0000 7a 0106 0000 7a7a")
    bad, good = Capture(), Capture()
    for capture, header in ((bad, empty), (good, one)):
        capture.connect()
        message = LbmcMessage(type=MessageType.MESSAGE, headers=[header, lbmc.Srcidx(srcidx=1)],
                              payload=b"hi")
        # no field comparison for the bad chain: our side refuses to walk it
        capture.send(message.build(), [message] if capture is good else [])
    flagged = run_oracle(bad, tmp_path / "bad-chain.pcap")
    assert flagged.experts.get("Errors") == ["Header length incorrect"], flagged.experts
    assert_clean(run_oracle(good, tmp_path / "good-chain.pcap"), good)


# --- malformed input: tshark flags it, parse_messages refuses it --------------------------------

KA = LbmcMessage(headers=[UmeKeepalive(reg_id=1)]).build()
PREG_RAW = LbmcMessage(headers=[UmeStoreid(store_id=1), UmePreg(reg_id=7)]).build()


def _patch(raw: bytes, index: int, value: int) -> bytes:
    out = bytearray(raw)
    out[index] = value
    return bytes(out)


@dataclass(frozen=True)
class Bad:
    name: str
    segment: bytes
    summary: str | None = None  # an expert with no tree item: seen only in -z expert
    chain: bool = False  # the apphdr chain is bad: parse_apphdr_chain refuses it


BAD = [
    Bad("spec-frame-8-preg-hdr_len-20", _patch(PREG_RAW, 9, 20)),
    Bad("spec-frame-9-code-0x21", _patch(PREG_RAW, 4, 0x21)),
    Bad("spec-frame-14-topicname-hdr_len-4", bytes.fromhex("08050008ff040000")),
    Bad("spec-frame-15-hdr_len-0", _patch(PREG_RAW, 9, 0), "LBMC header length is zero"),
    Bad("spec-frame-16-msglen-8", bytes.fromhex("08120008ff1c0081") + bytes(24)),
    Bad("spec-frame-17-type-3", KA + _patch(KA, 0, 0x03) + KA),
    Bad("msglen-3-mid-stream", KA + bytes.fromhex("08160003")),
    Bad("tgidx-0x03", _patch(PREG_RAW, 4, 0x03)),
    # (were bugs: opaque headers shorter than the layout tshark reads were accepted)
    Bad("hmac-hdr_len-4", bytes.fromhex("0817000c62040001ff040000")),
    Bad("umq_reg-hdr_len-4", bytes.fromhex("0817000c30040001ff040000")),
    Bad("advertisement-hdr_len-4", bytes.fromhex("0817000c3b040001ff040000")),
    Bad("umq_reg-hdr_len-1", bytes.fromhex("0830000aff0100000000")),
    Bad("hmac-hdr_len-23", LbmcMessage(headers=[
        UmeStoreid(store_id=1), OpaqueHeader(0x62, bytes(20), hdr_len=23)]).build()),
    Bad("apphdr_chain-element-hdr_len-4", LbmcMessage(
        type=MessageType.MESSAGE, headers=[lbmc.AppHdrChain(
            first_chain_hdr=5, elements=bytes.fromhex("0504 0000"))],
        payload=b"x").build(), chain=True),
]


@pytest.fixture(scope="module")
def malformed(tmp_path_factory: pytest.TempPathFactory,
              ) -> tuple[dict[str, tshark.TsharkFrame], dict[str, list[str]]]:
    capture = Capture()
    numbers = {}
    for case in BAD:
        capture.connect()  # a connection each, so one malformed PDU cannot hide the next
        numbers[case.name] = capture.send(case.segment)
    path = capture.write(tmp_path_factory.mktemp("oracle") / "malformed.pcap")
    frames = {f.number: f for f in tshark.read_frames(path, PORTS)}
    return {n: frames[num] for n, num in numbers.items()}, tshark.expert_summary(path, PORTS)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.name) for c in BAD])
def test_malformed_input_is_flagged_by_both(
        malformed: tuple[dict[str, tshark.TsharkFrame], dict[str, list[str]]],
        case: Bad) -> None:
    frames, summary = malformed
    frame = frames[case.name]
    assert frame.occurrences("lbmc"), "tshark must take the segment as LBT-TCP"
    if case.summary is None:
        flagged = bool(frame.malformed) or any(sev == ERROR for sev, _ in frame.experts)
        assert flagged, (frame.malformed, frame.experts)
    else:
        assert case.summary in summary.get("Errors", [])
    with pytest.raises(WireError):
        if case.chain:  # the message is fine, its apphdr chain is not
            for message in lbmc.parse_messages(case.segment):
                for header in message.headers:
                    if isinstance(header, lbmc.AppHdrChain):
                        lbmc.parse_apphdr_chain(header)
        else:
            lbmc.parse_messages(case.segment)


# --- the minimum lengths of opaque headers (lbmc.OPAQUE_MIN_LEN) against tshark -------------------

# docs/wire-lbmc.md §1.6: codes whose length is "var" (a fixed part plus a body chosen by a type or
# count inside the header); the others have one fixed layout
VARIABLE_OPAQUE = frozenset({0x30, 0x31, 0x32, 0x34, 0x35, 0x36, 0x40, 0x48, 0x49, 0x4C, 0x4D,
                             0x51, 0x52, 0x58, 0x60, 0xFE})


def opaque_variants(hdr_len: int) -> list[bytes]:
    """Header data (after next_hdr/hdr_len) of one length: zeros, and one of bytes 2-7 (where
    the type, opid or count fields sit) set to small values."""
    out = [bytes(hdr_len - 2)]
    for pos in range(2, min(hdr_len, 8)):
        for value in (1, 2, 3, 4, 5, 8):
            data = bytearray(hdr_len - 2)
            data[pos - 2] = value
            out.append(bytes(data))
    return out


@pytest.fixture(scope="module")
def opaque_lengths(tmp_path_factory: pytest.TempPathFactory,
                   ) -> dict[tuple[int, int], list[bool]]:
    """(code, hdr_len) -> per opaque_variants() entry: did tshark flag the header?  For
    hdr_len = minimum - 1 and minimum; each header between two STOREIDs on its own
    connection, so that a short header is walked and one bad PDU cannot hide the next."""
    capture = Capture()
    numbers: dict[tuple[int, int], list[int]] = {}
    for code, need in sorted(lbmc.OPAQUE_MIN_LEN.items()):
        for hdr_len in (need - 1, need):
            numbers[code, hdr_len] = []
            for data in opaque_variants(hdr_len):
                capture.connect()
                message = LbmcMessage(headers=[UmeStoreid(store_id=1), OpaqueHeader(code, data),
                                               UmeStoreid(store_id=2)])
                numbers[code, hdr_len].append(capture.send(message.build()))
    path = capture.write(tmp_path_factory.mktemp("oracle") / "opaque_lengths.pcap")
    frames = {f.number: f for f in tshark.read_frames(path, PORTS)}
    return {key: [bool(frames[n].malformed) or any(sev in (ERROR, WARN)
                                                   for sev, _ in frames[n].experts)
                  for n in nums]
            for key, nums in numbers.items()}


OPAQUE_PARAMS = [pytest.param(c, id=f"0x{c:02x}-{lbmc.KNOWN_CODES[c][0]}")
                 for c in sorted(lbmc.OPAQUE_MIN_LEN)]


@pytest.mark.parametrize("code", OPAQUE_PARAMS)
def test_opaque_headers_below_the_minimum_are_flagged_by_both(
        opaque_lengths: dict[tuple[int, int], list[bool]], code: int) -> None:
    """hdr_len one below OPAQUE_MIN_LEN: tshark flags every variant, parse_message refuses."""
    short = lbmc.OPAQUE_MIN_LEN[code] - 1
    flagged = opaque_lengths[code, short]
    assert all(flagged), [v.hex() for v, f in zip(opaque_variants(short), flagged,
                                                   strict=True) if not f]
    for data in opaque_variants(short):
        raw = LbmcMessage(headers=[UmeStoreid(store_id=1), OpaqueHeader(code, data),
                                   UmeStoreid(store_id=2)]).build()
        with pytest.raises(WireError) as info:
            lbmc.parse_message(raw)
        assert (info.value.header, info.value.offset) == (lbmc.KNOWN_CODES[code][1], 8)


@pytest.mark.parametrize("code", [p for p in OPAQUE_PARAMS if p.values[0] not in VARIABLE_OPAQUE])
def test_fixed_opaque_headers_at_the_minimum_are_clean(
        opaque_lengths: dict[tuple[int, int], list[bool]], code: int) -> None:
    """For fixed layouts the minimum is exactly tshark's: OpaqueHeader(code) (zeros) is clean
    in tshark and parses."""
    need = lbmc.OPAQUE_MIN_LEN[code]
    assert not opaque_lengths[code, need][0]
    assert lbmc.parse_message(LbmcMessage(headers=[OpaqueHeader(code)]).build())[0].headers == [
        OpaqueHeader(code)]


@pytest.mark.parametrize("code", [0x58, 0x60], ids=["0x58-gateway_name", "0x60-auth"])
def test_opaque_minimum_is_a_length_tshark_accepts(
        opaque_lengths: dict[tuple[int, int], list[bool]], code: int) -> None:
    flagged = opaque_lengths[code, lbmc.OPAQUE_MIN_LEN[code]]
    assert not all(flagged)


# (was a bug: a 1-byte FT_BYTES value such as '08' was compared as the integer 8)
@pytest.mark.parametrize("value", [b"\x08", b"\x00"], ids=["08", "00"])
def test_compare_one_byte_bytes_values(value: bytes) -> None:
    assert tshark.compare(1, [("data.data", value)], [("data.data", value.hex())]) == []


def test_one_byte_payloads_as_tshark_prints_them(tmp_path: Path) -> None:
    """tshark prints a 1-byte data.data without colons (the case normalize() gets wrong)."""
    capture = Capture()
    capture.connect()
    messages = [LbmcMessage(type=MessageType.MESSAGE, headers=[lbmc.Srcidx(srcidx=1)],
                            payload=bytes([b])) for b in (0x00, 0x08, 0x10, 0x0A, 0xFF)]
    number = capture.send_messages(messages)
    result = run_oracle(capture, tmp_path / "one.pcap")
    assert_clean(result, capture)
    shown = [v for occ in result.frames[number].occurrences("lbmc")
             for k, v in occ if k == "data.data"]
    assert shown == ["00", "08", "10", "0a", "ff"]


# --- the tshark field registry -------------------------------------------------------------------


@pytest.fixture(scope="module")
def registry() -> dict[str, tuple[str, int]]:
    return tshark.field_list()


def _exports() -> list[Any]:
    """Every header kind exported with zero and all-ones values (both E-bit branches)."""
    out = []
    for kind in KINDS:
        cls = lbmc.header_class(kind.code)
        assert cls is not None and kind.struct is not None
        samples = [cls(), random_header(kind, random.Random(1), "max")]
        if kind.name == "ume_preg_resp":
            samples.append(cls(code=0x40))
        if kind.name == "apphdr_chain":
            samples = [lbmc.build_apphdr_chain([ChainElement(1, data=b"a"),
                                                ChainElement(6, proplen=1)])]
        names: list[str] = []
        for header in samples:
            message = LbmcMessage(type=MessageType.MESSAGE, headers=[header])
            names += [n for n, _ in expected_fields(message)]
        out.append(pytest.param(kind, sorted(set(names)), id=kind.name))
    return out


@pytest.mark.parametrize(("kind", "names"), _exports())
def test_every_exported_name_is_a_tshark_field(registry: dict[str, tuple[str, int]],
                                                kind: HeaderKind, names: list[str]) -> None:
    missing = [n for n in names if n not in registry and n != "data.data"]
    assert not missing
    assert any(n.startswith(kind.field_prefix + ".") for n in names)


@pytest.mark.parametrize("code", [
    pytest.param(c, id=f"0x{c:02x}-{lbmc.KNOWN_CODES[c][0]}") for c in sorted(lbmc.OPAQUE_MIN_LEN)])
def test_opaque_exports_are_tshark_fields(registry: dict[str, tuple[str, int]],
                                          code: int) -> None:
    names = [n for n, _ in OpaqueHeader(code).tshark_fields(0xFF)]
    assert names and all(n in registry for n in names), names


# (was a bug: OpaqueHeader(0x60) exported 'lbmc.auth.hdr_len', which tshark does not register)
@pytest.mark.parametrize("opid", [0, 1, 2, 3, 4, 5, 0xFF])
def test_authentication_exports_are_tshark_fields(registry: dict[str, tuple[str, int]],
                                                  opid: int) -> None:
    ((name, value),) = OpaqueHeader(0x60, bytes([0, opid, 0])).tshark_fields(0xFF)
    assert name in registry and value == 5
    assert "lbmc.auth.hdr_len" not in registry


def test_authentication_prefix_matches_tshark(tmp_path: Path) -> None:
    """tshark shows each AUTH header under the prefix its opid chooses; so do we."""
    capture = Capture()
    capture.connect()
    numbers = {}
    for opid, body in ((1, b"\x00\x00"), (4, b"\x00"), (7, b"\x00\x00\x00")):
        auth = OpaqueHeader(0x60, bytes([0, opid]) + body)
        message = LbmcMessage(headers=[UmeStoreid(store_id=opid), auth])
        numbers[opid] = (capture.send(message.build()), auth)
    capture.write(tmp_path / "auth.pcap")
    frames = {f.number: f for f in tshark.read_frames(tmp_path / "auth.pcap", PORTS)}
    for number, auth in numbers.values():
        ((name, value),) = auth.tshark_fields(0xFF)
        shown = dict(frames[number].occurrences("lbmc")[0])
        assert shown.get(name) == str(value), (name, shown)


def test_message_level_names_are_tshark_fields(registry: dict[str, tuple[str, int]]) -> None:
    message = LbmcMessage(type=MessageType.MESSAGE, tidx=1, sqn=2)
    for name, _ in message.tshark_fields():
        assert name in registry
    assert registry["lbmc.version"][1] == lbmc.VER_TYPE_BITS["version"].mask
    assert registry["lbmc.type"][1] == lbmc.VER_TYPE_BITS["type"].mask


def _masks() -> list[Any]:
    out = []
    for kind in KINDS:
        assert kind.struct is not None
        for member in members(kind.struct):
            for view, bit in bit_views(member).items():
                name = qualify(kind.field_prefix,
                                    bit.tshark or f"{tshark_name(member) or member.name}.{view}")
                # the 16-bit display quirk: tshark's item spans the one-byte flags and the
                # following byte, so its masks are ours shifted up by 8 (0x80 -> 0x8000)
                quirk = kind.flags16_quirk is not None and member.name == "flags"
                out.append(pytest.param(name, bit.mask << 8 if quirk else bit.mask,
                                        id=f"{kind.name}.{view}"))
    return out


@pytest.mark.parametrize(("name", "mask"), _masks())
def test_bit_view_masks_equal_tshark_bitmasks(registry: dict[str, tuple[str, int]], name: str,
                                              mask: int) -> None:
    assert name in registry
    assert registry[name][1] == mask


def test_quirk_headers_really_have_16_bit_flags_in_tshark(
        registry: dict[str, tuple[str, int]]) -> None:
    for kind in KINDS:
        if kind.flags16_quirk:
            assert registry[f"{kind.field_prefix}.flags"][0] == "FT_UINT16", kind.name
            assert registry[f"{kind.field_prefix}.flags.ignore"][1] == 0x8000


_FT = {"ipv4": {"FT_IPv4"}, "bytes": {"FT_BYTES"}, "text": {"FT_STRING", "FT_STRINGZ"}}
_WIDTH = {1: {"FT_UINT8", "FT_BOOLEAN"}, 2: {"FT_UINT16"}, 4: {"FT_UINT32", "FT_INT32"},
          8: {"FT_UINT64", "FT_INT64"}}


def test_member_types_match_tshark(registry: dict[str, tuple[str, int]]) -> None:
    """Each exported member is a whole tshark field (bitmask 0) of the same type and width."""
    problems = []
    for kind in KINDS:
        assert kind.struct is not None
        for member in members(kind.struct):
            name = tshark_name(member)
            if name is None or isinstance(member.subcon, cs.Array):
                continue
            full = qualify(kind.field_prefix, name)
            ftype, bitmask = registry[full]
            if bitmask:
                problems.append(f"{full}: tshark bitmask {bitmask:#x} on a whole member")
            vkind = value_kind(member)
            if vkind == "int":
                letter = fixed_format(member)
                assert letter is not None
                width = struct.calcsize(">" + letter)
                if kind.flags16_quirk and member.name == "flags":
                    width = 2
                allowed = _WIDTH[width]
            else:
                allowed = _FT[vkind]
            if ftype not in allowed:
                problems.append(f"{full}: ours {vkind}/{fixed_format(member)}, tshark {ftype}")
    assert not problems, "\n".join(problems)
