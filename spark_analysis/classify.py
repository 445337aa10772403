"""Which UDP datagrams and TCP segments are UM, column-wise.

The vectorised form of the port rules :mod:`wire.dissect` applies frame by frame (tshark's
port preferences, :class:`wire.tshark.PortMap`): a protocol code per UDP row, and whether a
TCP row belongs to a candidate LBT-TCP connection.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from wire import lbtrm
from wire.fields import ipv4_to_int as _ipv4_int
from wire.tshark import PortMap

from .arrow_build import (
    ByteView,
    _ver_type,
    read_members,
)
from .framing import (
    _Network,
)

# =============================================================================================
# Classification (tshark's port preferences, as wire.dissect.classify_udp)
# =============================================================================================

PROTOCOLS = ("", "lbtrm", "lbtru", "lbttcp", "lbmr")
_LBTRM, _LBTRU, _LBTTCP, _LBMR = 1, 2, 3, 4


def _in(values: np.ndarray, bounds: tuple[int, int]) -> np.ndarray:
    return (values >= bounds[0]) & (values <= bounds[1])


def _listed(values: np.ndarray, ports: Sequence[int]) -> np.ndarray:
    return np.isin(values, np.asarray(list(ports), np.int64))


def _multicast(addresses: np.ndarray) -> np.ndarray:
    return (addresses >> 28) == 0xE  # 224.0.0.0/4


def _classify_udp(bv: ByteView, net: _Network, rows: np.ndarray, ports: PortMap,
                  ) -> np.ndarray:
    """The protocol tshark's rules give each UDP row (0: none), as
    :func:`wire.dissect.classify_udp` decides it."""
    out = np.zeros(len(rows), np.int8)
    sport, dport, dst = net.sport[rows], net.dport[rows], net.dst[rows]
    open_ = np.ones(len(rows), bool)

    def claim(mask: np.ndarray, code: int) -> None:
        nonlocal open_
        mask = mask & open_
        out[mask] = code
        open_ = open_ & ~mask

    for code, listed in ((_LBTRU, ports.lbtru_ports), (_LBTRM, ports.lbtrm_ports),
                         (_LBMR, ports.lbmr_ports)):
        claim(_listed(sport, listed) | _listed(dport, listed), code)
    mc = _multicast(dst)
    claim(mc & (dst == _ipv4_int(ports.lbmr_mc[0])) & (dport == ports.lbmr_mc[1]), _LBMR)
    uc_dest = ports.lbmr_uc_dest_port
    claim(~mc & ((sport == uc_dest) | (dport == uc_dest))
          & (_in(sport, ports.lbmr_uc_ports) | _in(dport, ports.lbmr_uc_ports)), _LBMR)
    claim((_in(dport, ports.lbtru_source) & _in(sport, ports.lbtru_receiver))
          | (_in(dport, ports.lbtru_receiver) & _in(sport, ports.lbtru_source)), _LBTRU)
    if open_.any():
        content = _lbtrm_content_test(bv, net.pstart[rows], net.pend[rows])
        mc_range = (_ipv4_int(ports.lbtrm_mc_range[0]), _ipv4_int(ports.lbtrm_mc_range[1]))
        claim(content & ((mc & _in(dst, mc_range) & _in(dport, ports.lbtrm_dport))
                         | (~mc & _in(dport, ports.lbtrm_sport))), _LBTRM)
    return out


def _tcp_candidates(net: _Network, rows: np.ndarray, ports: PortMap) -> np.ndarray:
    """As :func:`wire.dissect.tcp_candidate`: a store/decode-as port or the LBT-TCP ranges."""
    sport, dport = net.sport[rows], net.dport[rows]
    listed = [*ports.store_ports, *ports.lbttcp_ports]
    out = _listed(sport, listed) | _listed(dport, listed)
    for bounds in (ports.lbttcp_source, ports.lbttcp_request):
        out |= _in(sport, bounds) | _in(dport, bounds)
    return out


def _lbtrm_content_test(bv: ByteView, pstart: np.ndarray, pend: np.ndarray) -> np.ndarray:
    """:func:`wire.lbtrm.heuristic_content_test`, column-wise."""
    out = np.zeros(len(pstart), bool)
    rows = np.flatnonzero(pend - pstart >= lbtrm.HEADER_SIZE)
    head = read_members(bv, lbtrm.COMMON, pstart[rows], ("ver_type", "next_hdr"))
    version, ptype = _ver_type(lbtrm.VER_TYPE_BITS, head["ver_type"])
    out[rows] = ((version == 0) & np.isin(ptype, list(lbtrm.HEURISTIC_TYPES))
                 & (head["next_hdr"] == 0))
    return out
