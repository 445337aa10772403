"""A link's MTU in the capture generator: :class:`LinkMtu`.

A scenario with ``ip_mtu`` (:class:`captures.scenarios.Scenario`) has every UDP datagram
larger than the MTU written as IPv4 fragments, as the sender's IP layer cuts it
(:func:`wire.pcap.fragment_frame`), each source host numbering its fragmented datagrams with
an IP identification of its own.  The writer (:class:`captures.generator.CaptureWriter`)
renders a chunk's frames, then asks this what to write for each.
"""

from __future__ import annotations

from wire import pcap


class LinkMtu:
    """Cuts the frames over ``mtu`` and counts what it made (for the sidecar)."""

    def __init__(self, mtu: int) -> None:
        self.mtu = mtu
        self.fragments = 0
        """Frames written as IPv4 fragments."""
        self.extra_frames = 0
        """Frames written beyond the ones rendered (all but one of each datagram's)."""
        self._ident: dict[str, int] = {}  # per source address: the next IP identification

    def over(self, frame_length: int) -> bool:
        """Whether a frame of this length may need cutting (its IPv4 datagram over the MTU)."""
        return frame_length > pcap.ETH.size + self.mtu

    def cut(self, frame: bytes) -> list[bytes]:
        """The frames to write for ``frame``: its fragments, or itself."""
        if not self.over(len(frame)):
            return [frame]
        src = pcap.IP4.decode(frame, pcap.ETH.size)["src"]
        ident = self._ident.get(src, 1)
        pieces = pcap.fragment_frame(frame, self.mtu, ident)
        if len(pieces) > 1:
            self._ident[src] = (ident + 1) & 0xFFFF
            self.fragments += len(pieces)
            self.extra_frames += len(pieces) - 1
        return pieces
