"""Wire formats of Ultra Messaging persistence: LBMC, LBT-TCP, LBT-RU, LBT-RM and LBMR.

Construct definitions in this package are the only place a layout is written; the fast path
(:mod:`wire.fastpath`), the Scapy layers and the tshark field export are derived from them.
"""

from .errors import WireError

__all__ = ["WireError"]
