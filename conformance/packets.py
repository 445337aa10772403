"""The Scapy layers cases craft packets with, under their :mod:`wire.scapy_layers` names.

:mod:`wire.scapy_layers` derives one layer per LBMC header from the Construct structs at import
time, so static type checkers cannot see them; this module names the ones the suites use, typed
as Scapy packet classes.  ``LBMC() / LBMC_UmePreg(reg_id=5, s_flag=1) / LBMC_Topicname(...)``
builds a message field by field; any field may be set to an invalid value.
"""

from __future__ import annotations

from typing import cast

from scapy.packet import Packet

from wire import scapy_layers
from wire.scapy_layers import LBMC


def _layer(name: str) -> type[Packet]:
    return cast(type[Packet], getattr(scapy_layers, name))


LBMC_Extopt = _layer("LBMC_Extopt")
LBMC_Sri = _layer("LBMC_Sri")
LBMC_SriReq = _layer("LBMC_SriReq")
LBMC_TopicIdx = _layer("LBMC_TopicIdx")
LBMC_Topicname = _layer("LBMC_Topicname")
LBMC_UmeAck = _layer("LBMC_UmeAck")
LBMC_UmeClientLifetime = _layer("LBMC_UmeClientLifetime")
LBMC_UmeKeepalive = _layer("LBMC_UmeKeepalive")
LBMC_UmePreg = _layer("LBMC_UmePreg")
LBMC_UmePregResp = _layer("LBMC_UmePregResp")
LBMC_UmeRxreq = _layer("LBMC_UmeRxreq")
LBMC_UmeSid = _layer("LBMC_UmeSid")
LBMC_UmeStoreExt = _layer("LBMC_UmeStoreExt")
LBMC_UmeStoreGroup = _layer("LBMC_UmeStoreGroup")
LBMC_UmeStoreid = _layer("LBMC_UmeStoreid")

__all__ = ["LBMC", "LBMC_Extopt", "LBMC_Sri", "LBMC_SriReq", "LBMC_TopicIdx", "LBMC_Topicname",
           "LBMC_UmeAck",
           "LBMC_UmeClientLifetime", "LBMC_UmeKeepalive", "LBMC_UmePreg", "LBMC_UmePregResp",
           "LBMC_UmeRxreq", "LBMC_UmeSid", "LBMC_UmeStoreExt", "LBMC_UmeStoreGroup",
           "LBMC_UmeStoreid"]
