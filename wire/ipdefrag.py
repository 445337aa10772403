"""IPv4 reassembly: UDP datagrams from their fragments, in capture order, as tshark does it.

A UM transport datagram may be larger than the link's MTU (an LBT-RM or LBT-RU source
sends datagrams of up to ``transport_lbtrm_datagram_max_size``, 8,192 bytes by default), and
then the sender's IP layer cuts it into fragments.  tshark's IPv4 dissector reassembles them
(preference ``ip.defragment``, on by default) and decodes the datagram in the frame whose
fragment completed it; the other fragments show as "Fragmented IP protocol".  This module is
that rule, written once: ``ump dissect`` feeds it frame by frame, and the Spark decode feeds
it each datagram's fragments in capture order, after a shuffle brings them together.

The rules, as tshark applies them (``packet-ip.c`` and ``reassemble.c``):

* fragments belong together when they share source, destination, protocol and
  identification (only UDP fragments are reassembled here: UM runs on UDP and TCP, and TCP
  does not let IP fragment it), and, when either address is private (RFC 1918) or
  link-local, the VLAN ID of the frame's innermost 802.1Q tag (0 untagged): such addresses
  may stand for other hosts on another VLAN, and a capture on a trunk port sees a datagram
  routed between two VLANs twice, its two copies' fragments interleaved
  (:func:`keyed_ident`);
* a datagram is complete when its last fragment (no "more fragments" flag) has been seen
  and the bytes from 0 to its end are all there; the frame whose fragment made it so is the
  one that shows the datagram;
* a second "last" fragment does not move the datagram's end: the first one seen set it;
* once complete, the identification is free again: a later fragment with the same key
  starts a new datagram (identifications wrap every 65,536 datagrams of a host);
* a fragment cut short by the capture's snap length, or without payload, is not added
  (tshark checks that the bytes exist), so its datagram never completes; a *first* fragment
  so cut is decoded as far as it goes, as tshark does (:func:`wire.pcap.decode_ip`);
* where fragments overlap, the bytes of the one with the lower offset are kept (of two at
  the same offset, the first captured): tshark copies them in offset order;
* ours, not tshark's: a datagram that would be longer than IPv4 allows (65,515 bytes of
  payload) never completes.  tshark reassembles it anyway; no sender makes one (its UDP
  length could not say it), and ``ump analyze`` could not show it as an IPv4 frame.

Incomplete datagrams are held until the end (tshark keeps them for the whole capture too):
the memory is bounded by the capture's own fragment bytes.
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from .fields import ipv4_to_int
from .pcap import IP4, Fragment

HELD = "IPv4 fragment of a UDP datagram, reassembled in the frame that completes it"
INCOMPLETE = "IPv4 fragment of a UDP datagram that the capture never completes"
"""What the tools say of a fragment that does not show its datagram itself: ``ump dissect``,
frame by frame, cannot tell the two apart and says :data:`HELD` of both; ``ump analyze``
sees the whole capture and says which."""

MAX_PAYLOAD = 0xFFFF - IP4.size
"""The longest IP payload a datagram can have (total length 65,535 with a 20-byte header)."""

VLAN_KEYED_NETWORKS = (("10.0.0.0", 8), ("172.16.0.0", 12), ("192.168.0.0", 16),
                       ("169.254.0.0", 16))
"""The IPv4 networks (address, prefix length) whose fragments tshark keys by VLAN ID too:
the private and the link-local ones (``in4_addr_is_private``, ``in4_addr_is_link_local``)."""

_VLAN_KEYED = tuple((ipv4_to_int(net), (0xFFFFFFFF << (32 - bits)) & 0xFFFFFFFF)
                    for net, bits in VLAN_KEYED_NETWORKS)


IntOrArray = int | np.ndarray
"""A plain integer or a numpy array of them (:func:`keyed_ident` works on either)."""


def keyed_ident(ident: IntOrArray, vlan: IntOrArray, src: IntOrArray, dst: IntOrArray
                ) -> np.ndarray:
    """The identification fragments are keyed by, with their addresses (as integers): the
    IP identification, with the VLAN ID above its 16 bits when either address is in
    :data:`VLAN_KEYED_NETWORKS`.  Element-wise over numpy arrays (the Spark decode's
    columns) or plain integers."""
    ident, vlan, src, dst = (np.asarray(x, np.int64) for x in (ident, vlan, src, dst))
    scoped = np.zeros(np.broadcast(ident, src, dst).shape, bool)
    for net, mask in _VLAN_KEYED:
        scoped |= ((src & mask) == net) | ((dst & mask) == net)
    return np.where(scoped, ident | (vlan << 16), ident)


T = TypeVar("T")


@dataclass
class _Datagram(Generic[T]):
    """The fragments of one datagram so far.

    Pieces are kept one per offset (a later one at the same offset adds only the bytes past
    the first's end), in offset order, and ``prefix`` is how far the bytes run from 0
    without a hole: each fragment costs a binary search and the pieces it joins to the
    prefix, so a flood of duplicate or overlapping fragments (hostile input) stays linear."""

    pieces: dict[int, bytes] = field(default_factory=dict)
    offsets: list[int] = field(default_factory=list)  # the pieces' offsets, sorted
    prefix: int = 0
    end: int | None = None  # the payload length, once the last fragment is seen
    tags: list[T] = field(default_factory=list)

    def add(self, offset: int, payload: bytes) -> None:
        old = self.pieces.get(offset)
        if old is None:
            self.pieces[offset] = payload
            bisect.insort(self.offsets, offset)
        elif len(payload) > len(old):
            self.pieces[offset] = old + payload[len(old):]  # the first captured bytes stay
        else:
            return
        if offset <= self.prefix < offset + len(self.pieces[offset]):
            before, self.prefix = self.prefix, offset + len(self.pieces[offset])
            at = bisect.bisect_right(self.offsets, before)
            while at < len(self.offsets) and self.offsets[at] <= self.prefix:
                piece = self.offsets[at]
                self.prefix = max(self.prefix, piece + len(self.pieces[piece]))
                at += 1

    def whole(self) -> bytes | None:
        """The payload when every byte up to the end is there, else None (also when the
        end would exceed :data:`MAX_PAYLOAD`: such a datagram never completes)."""
        end = self.end
        if end is None or end > MAX_PAYLOAD or self.prefix < end:
            return None
        out = bytearray()
        for offset in self.offsets:
            if len(out) >= end:
                break
            data = self.pieces[offset]
            if offset + len(data) > len(out):
                out += data[len(out) - offset:]  # overlapping bytes: the lower offset's stay
        return bytes(out[:end])


@dataclass(frozen=True)
class Reassembled(Generic[T]):
    """A datagram made whole: its IP payload (UDP header first), and the tags of the
    fragments that made it, in capture order (the last one completed it)."""

    payload: bytes
    tags: list[T]


class Defragmenter(Generic[T]):
    """Collects fragments in capture order and gives each datagram once it is complete.

    ``tag`` is whatever the caller needs to name a fragment's frame (a frame number, a row);
    ``scope`` keeps apart datagrams that must never meet (e.g. two capture files analysed as
    separate captures)."""

    def __init__(self) -> None:
        self._open: dict[Hashable, _Datagram[T]] = {}

    def add(self, fragment: Fragment, tag: T, scope: Hashable = None) -> Reassembled[T] | None:
        """Add one fragment; the reassembled datagram when this fragment completes it."""
        ident = int(keyed_ident(fragment.ident, fragment.vlan, ipv4_to_int(fragment.src),
                                ipv4_to_int(fragment.dst)))
        return self.add_piece((scope, fragment.src, fragment.dst, ident),
                              fragment.offset, fragment.more, fragment.payload, tag)

    def add_piece(self, key: Hashable, offset: int, more: bool, payload: bytes, tag: T,
                  ) -> Reassembled[T] | None:
        """:meth:`add` for a caller that holds a fragment as its parts: ``key`` must name the
        datagram (addresses, :func:`keyed_ident` and any scope) as :meth:`add` does."""
        datagram = self._open.setdefault(key, _Datagram())
        datagram.tags.append(tag)
        datagram.add(offset, payload)
        if not more and datagram.end is None:  # tshark keeps the first end it is told
            datagram.end = offset + len(payload)
        whole = datagram.whole()
        if whole is None:
            return None
        del self._open[key]
        return Reassembled(whole, datagram.tags)

    def pending(self) -> list[list[T]]:
        """The tags of every datagram still incomplete (in the order they started)."""
        return [d.tags for d in self._open.values()]
