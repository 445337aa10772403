"""Which UDP datagrams and TCP segments are UM, column-wise: :mod:`wire.detect` on columns.

The rules are :mod:`wire.detect`'s, the one detector ``ump dissect`` and the Scapy helpers
use too: its functions are numpy expressions over header values, so this module only reads
the header members they test (for all rows at once, through the derived layouts of
:mod:`wire.lbtrm`, :mod:`wire.lbtru` and :mod:`wire.lbmr`) and hands them over.  Nothing
about ports, versions or types is written here.  The clean-decode half of the content rules
is the decoders' (:meth:`spark_analysis.transport_columns._UdpResult.clean`,
:func:`wire.detect.lbmr_clean` on each parsed LBMR packet).
"""

from __future__ import annotations

import numpy as np

from wire import detect, lbmr, lbtrm, lbtru
from wire.detect import LBMR, LBTRM, LBTRU, PROTOCOLS
from wire.tshark import PortMap

from .arrow_build import ByteView, read_members
from .framing import Network

__all__ = ["LBMR", "LBTRM", "LBTRU", "PROTOCOLS", "classify_udp", "lbmr_content_test",
           "lbtrm_content_test", "lbtru_content_test", "tcp_candidates"]


def in_range(values: np.ndarray, bounds: tuple[int, int]) -> np.ndarray:
    return (values >= bounds[0]) & (values <= bounds[1])


def lbtrm_content_test(bv: ByteView, pstart: np.ndarray, pend: np.ndarray) -> np.ndarray:
    """:func:`wire.detect.lbtrm_header_test` of each payload (False when too short)."""
    out = np.zeros(len(pstart), bool)
    rows = np.flatnonzero(pend - pstart >= lbtrm.HEADER_SIZE)
    head = read_members(bv, lbtrm.COMMON, pstart[rows], ("ver_type", "next_hdr"))
    out[rows] = detect.lbtrm_header_test(head["ver_type"], head["next_hdr"])
    return out


def lbtru_content_test(bv: ByteView, pstart: np.ndarray, pend: np.ndarray) -> np.ndarray:
    """:func:`wire.detect.lbtru_header_test` of each payload (False when too short)."""
    out = np.zeros(len(pstart), bool)
    rows = np.flatnonzero(pend - pstart >= lbtru.HEADER_SIZE)
    head = read_members(bv, lbtru.COMMON, pstart[rows], ("ver_type", "flags_or_res"))
    out[rows] = detect.lbtru_header_test(head["ver_type"], head["flags_or_res"])
    return out


def lbmr_content_test(bv: ByteView, pstart: np.ndarray, pend: np.ndarray) -> np.ndarray:
    """:func:`wire.detect.lbmr_header_test` of each payload (False when too short): the
    cheap first half of the LBMR content rule."""
    out = np.zeros(len(pstart), bool)
    rows = np.flatnonzero(pend - pstart >= lbmr.HEADER.size)
    head = read_members(bv, lbmr.HEADER, pstart[rows])
    out[rows] = detect.lbmr_header_test(head["ver_type"], head["tqrs"], head["tirs"])
    return out


def classify_udp(bv: ByteView, net: Network, rows: np.ndarray, ports: PortMap) -> np.ndarray:
    """The protocol code (:data:`wire.detect.PROTOCOLS`) the port rules give each UDP row
    (0: none): :func:`wire.detect.udp_port_rules`."""
    pstart, pend = net.pstart[rows], net.pend[rows]
    return detect.udp_port_rules(
        net.sport[rows], net.dport[rows], net.dst[rows],
        lambda at: lbtrm_content_test(bv, pstart[at], pend[at]), ports)


def tcp_candidates(net: Network, rows: np.ndarray, ports: PortMap) -> np.ndarray:
    """:func:`wire.detect.tcp_port_rule` of each TCP row."""
    return detect.tcp_port_rule(net.sport[rows], net.dport[rows], ports)
