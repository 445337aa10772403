"""wire.ipdefrag: UDP datagrams from IPv4 fragments, as tshark reassembles them.

Properties over datagrams cut anywhere on 8-byte boundaries, the pieces in any order with
duplicates: the datagram comes back whole exactly when its last missing piece arrives; with
a piece lost it never does; datagrams of other identifications never mix.  The fixed cases
pin the rules tshark applies beyond that (overlap, identification reuse, size limit);
``tests/spark_analysis/test_fragments.py`` holds them against tshark itself.
"""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from wire import pcap
from wire.ipdefrag import MAX_PAYLOAD, Defragmenter
from wire.pcap import Fragment

SRC, DST = "10.0.0.1", "224.10.10.10"


def _pieces(payload: bytes, cuts: list[int], ident: int = 1) -> list[Fragment]:
    bounds = sorted({0, *(c * 8 for c in cuts if 0 < c * 8 < len(payload)), len(payload)})
    return [Fragment(SRC, DST, ident, a, b < len(payload), payload[a:b])
            for a, b in itertools.pairwise(bounds)]


@st.composite
def cut_datagrams(draw: st.DrawFn) -> tuple[bytes, list[Fragment], list[int]]:
    """A payload, its fragments, and an arrival order (a permutation with repeats)."""
    payload = draw(st.binary(min_size=9, max_size=3000))
    cuts = draw(st.lists(st.integers(1, len(payload) // 8 + 1), max_size=12))
    pieces = _pieces(payload, cuts)
    order = draw(st.permutations(range(len(pieces))))
    repeats = draw(st.lists(st.integers(0, len(pieces) - 1), max_size=3))
    arrival = list(order)
    for r in repeats:
        arrival.insert(draw(st.integers(0, len(arrival))), r)
    return payload, pieces, arrival


@given(cut_datagrams())
@settings(max_examples=300, deadline=None)
def test_a_datagram_completes_when_its_last_missing_piece_arrives(
        case: tuple[bytes, list[Fragment], list[int]]) -> None:
    """Whole exactly when every piece has arrived since the last completion (then the
    identification starts a new datagram: late duplicates make one of their own)."""
    payload, pieces, arrival = case
    done: Defragmenter[int] = Defragmenter()
    seen: set[int] = set()
    since = 0
    completions = 0
    for step, index in enumerate(arrival):
        seen.add(index)
        whole = done.add(pieces[index], step)
        if len(seen) == len(pieces):
            assert whole is not None and whole.payload == payload
            assert whole.tags == list(range(since, step + 1))
            seen, since, completions = set(), step + 1, completions + 1
        else:
            assert whole is None
    assert completions >= 1


@given(cut_datagrams(), st.data())
@settings(max_examples=200, deadline=None)
def test_a_lost_piece_means_no_datagram(case: tuple[bytes, list[Fragment], list[int]],
                                        data: st.DataObject) -> None:
    _, pieces, arrival = case
    if len(pieces) < 2:
        return
    lost = data.draw(st.integers(0, len(pieces) - 1))
    done: Defragmenter[int] = Defragmenter()
    kept = [i for i in arrival if i != lost]
    assert all(done.add(pieces[i], step) is None for step, i in enumerate(kept))
    assert done.pending() == [list(range(len(kept)))]


@given(cut_datagrams(), cut_datagrams(), st.randoms())
@settings(max_examples=100, deadline=None)
def test_interleaved_datagrams_never_mix(a: tuple[bytes, list[Fragment], list[int]],
                                         b: tuple[bytes, list[Fragment], list[int]],
                                         rnd: object) -> None:
    first = [a[1][i] for i in sorted(set(a[2]), key=a[2].index)]
    second = [Fragment(f.src, f.dst, 2, f.offset, f.more, f.payload)
              for f in (b[1][i] for i in sorted(set(b[2]), key=b[2].index))]
    merged = [*first, *second]
    rnd.shuffle(merged)  # type: ignore[attr-defined]
    done: Defragmenter[int] = Defragmenter()
    got = {}
    for step, fragment in enumerate(merged):
        whole = done.add(fragment, step)
        if whole is not None:
            got[fragment.ident] = whole.payload
    assert got == {1: a[0], 2: b[0]}


def test_overlapping_bytes_come_from_the_lower_offset() -> None:
    done: Defragmenter[int] = Defragmenter()
    assert done.add(Fragment(SRC, DST, 1, 8, True, b"B" * 16), 0) is None
    assert done.add(Fragment(SRC, DST, 1, 16, False, b"C" * 16), 1) is None
    whole = done.add(Fragment(SRC, DST, 1, 0, True, b"A" * 16), 2)
    assert whole is not None and whole.payload == b"A" * 16 + b"B" * 8 + b"C" * 8


def test_an_identification_is_free_again_once_its_datagram_completes() -> None:
    done: Defragmenter[int] = Defragmenter()
    one, two = _pieces(b"x" * 40, [2]), _pieces(b"y" * 40, [3])
    assert done.add(one[0], 0) is None
    assert done.add(one[1], 1) is not None
    assert done.add(two[1], 2) is None  # a new datagram, not the finished one
    whole = done.add(two[0], 3)
    assert whole is not None and whole.payload == b"y" * 40 and whole.tags == [2, 3]


def test_scopes_and_addresses_keep_datagrams_apart() -> None:
    done: Defragmenter[int] = Defragmenter()
    first, last = _pieces(b"z" * 40, [2])
    assert done.add(first, 0, scope="a.pcap") is None
    assert done.add(last, 1, scope="b.pcap") is None
    other = Fragment("10.0.0.9", DST, last.ident, last.offset, last.more, last.payload)
    assert done.add(other, 2, scope="a.pcap") is None
    assert done.add(last, 3, scope="a.pcap") is not None


def test_a_datagram_longer_than_ipv4_allows_never_completes() -> None:
    done: Defragmenter[int] = Defragmenter()
    assert done.add(Fragment(SRC, DST, 1, 0, True, b"\0" * 65_512), 0) is None
    assert done.add(Fragment(SRC, DST, 1, 65_512, False, b"\0" * 8), 1) is None
    assert MAX_PAYLOAD < 65_520 and len(done.pending()) == 1


def test_fragment_frame_cuts_as_a_sender_does() -> None:
    payload = bytes(range(256)) * 20
    frames = pcap.udp_fragments(SRC, 40000, DST, 14400, payload, ident=77, mtu=1500)
    assert [len(f) - pcap.ETH.size for f in frames] == [1500, 1500, 1500, 708]  # 5,128 UDP bytes
    done: Defragmenter[int] = Defragmenter()
    wholes = []
    for i, frame in enumerate(frames):
        found = pcap.decode_ip(pcap.LINKTYPE_ETHERNET, frame)
        assert isinstance(found, Fragment) and found.ident == 77
        assert found.offset % 8 == 0 and found.more == (i < 3)
        wholes.append(done.add(found, i))
    assert wholes[:3] == [None] * 3 and wholes[3] is not None
    assert pcap.udp_segment(SRC, DST, wholes[3].payload).payload == payload
    small = pcap.udp_frame(SRC, 40000, DST, 14400, b"hi")
    assert pcap.fragment_frame(small, 1500, 1) == [small]


def test_the_first_last_fragment_sets_the_end() -> None:
    done: Defragmenter[int] = Defragmenter()
    assert done.add(Fragment(SRC, DST, 1, 16, False, b"B" * 8), 0) is None
    assert done.add(Fragment(SRC, DST, 1, 16, False, b"C" * 32), 1) is None
    whole = done.add(Fragment(SRC, DST, 1, 0, True, b"A" * 16), 2)
    assert whole is not None and whole.payload == b"A" * 16 + b"B" * 8
