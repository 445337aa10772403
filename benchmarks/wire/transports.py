"""Optional rows for the transport and resolver codecs (``wire.lbtru``, ``wire.lbtrm``,
``wire.lbttcp``, ``wire.lbmr``).

Those modules are written separately and may be absent, so each row is probed at run time: the
module must import, expose a public packet parse function, and accept the sample packet below.
The samples are built from ``docs/wire-transports.md`` (the LBMR and LBT-RU frames
of section 7.1 were checked against tshark; the LBT-RM and LBT-TCP ones follow sections 2.2-2.3
and 3.3), so the probe does not depend on each module's builder API.  Anything that does not
fit yields a row marked "not available" with the reason, never an error.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from wire import lbmc

from .samples import PAYLOAD_64

# docs/wire-transports.md §7.1, frame 1: LBMR NORMAL, 1 TIR (LBT-RU, with UME options).
LBMR_TIR = bytes.fromhex(
    "00000001756d652e746573742e746f70696300810a0001000000010004004c01"
    "20600038e738377f0000017f000001000003e800000001000000000000000002"
    "10000038e700007f000001000003e803080000000100000e100000383700007f"
    "000001000000037f00000100001234382c"
)

# Section 7.1, frame 2: LBT-RU DATA with a SID option and one LBMC MESSAGE ("hello").
LBTRU_DATA = bytes.fromhex(
    "0001000000000000000000000008000000001234000500230000000100000000"
    "00120000756d652e746573742e746f70696368656c6c6f"
)


def _data_message() -> bytes:
    return lbmc.LbmcMessage(type=lbmc.MessageType.MESSAGE, tidx=1, sqn=42,
                            payload=PAYLOAD_64).build()


def _lbtrm_data() -> bytes:
    """Section 2.2/2.3: 8-byte header (DATA, next_hdr 0, ucast_port 14390, session 0x1234),
    12-byte DATA body (sqn 42, trail 0, no flags), then one LBMC message."""
    header = bytes.fromhex("0000" "3836" "00001234")
    body = bytes.fromhex("0000002a" "00000000" "00" "00" "0000")
    return header + body + _data_message()


def _lbttcp_segment() -> bytes:
    """Section 3.3: a TCP payload is back-to-back LBMC messages (here a PREG, then DATA)."""
    preg = lbmc.LbmcMessage(type=lbmc.MessageType.CONTROL,
                            headers=[lbmc.UmePreg(reg_id=7, s_flag=1, resp_port=14567)]).build()
    return preg + _data_message()


SAMPLES: dict[str, tuple[str, Callable[[], bytes]]] = {
    "lbtru": ("LBT-RU DATA + SID + LBMC message", lambda: LBTRU_DATA),
    "lbtrm": ("LBT-RM DATA + LBMC message (64-byte payload)", _lbtrm_data),
    "lbmr": ("LBMR NORMAL, 1 TIR with UME options", lambda: LBMR_TIR),
    "lbttcp": ("LBT-TCP segment: PREG + DATA messages", _lbttcp_segment),
}

# Public parse functions tried, in order ({name} is the module name).
CANDIDATES = ("parse_packet", "parse_{name}", "parse_{name}_packet", "parse_datagram",
              "parse_segment", "parse_stream", "parse", "decode_packet", "decode")


@dataclass(frozen=True)
class TransportCase:
    """A transport row: either a callable ready to time or the reason there is none."""

    name: str
    description: str
    sample: bytes
    parse: Callable[[bytes], Any] | None
    function: str | None
    reason: str | None


def _accepts_one_bytes_argument(fn: Callable[..., Any]) -> bool:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    required = [p for p in sig.parameters.values()
                if p.default is p.empty and p.kind in (p.POSITIONAL_ONLY,
                                                       p.POSITIONAL_OR_KEYWORD)]
    return len(required) <= 1


def _feeder(cls: type[Any]) -> Callable[[bytes], Any]:
    def parse(data: bytes) -> Any:
        return cls().feed(data)

    parse.__name__ = f"{cls.__name__}().feed"
    return parse


def probe(name: str) -> TransportCase:
    """Find ``wire.<name>``'s packet parser and check it decodes the sample."""
    description, make = SAMPLES[name]
    sample = make()
    try:
        module = importlib.import_module(f"wire.{name}")
    except ImportError as exc:
        return TransportCase(name, description, sample, None, None,
                             f"module wire.{name} not importable ({exc.__class__.__name__})")
    failures: list[str] = []
    for pattern in CANDIDATES:
        fname = pattern.format(name=name)
        fn = getattr(module, fname, None)
        if not callable(fn) or inspect.isclass(fn) or not _accepts_one_bytes_argument(fn):
            continue
        try:
            fn(sample)
        except Exception as exc:  # any failure just means "not this function / not usable"
            failures.append(f"{fname}: {exc.__class__.__name__}: {exc}")
            continue
        return TransportCase(name, description, sample, fn, f"wire.{name}.{fname}", None)
    for cname, cls in vars(module).items():
        # Stream framers (LBT-TCP): parse one segment with a fresh stream, ``cls().feed(data)``.
        if cname.startswith("_") or not inspect.isclass(cls) or cls.__module__ != module.__name__:
            continue
        if not callable(getattr(cls, "feed", None)):
            continue
        feeder = _feeder(cls)
        try:
            feeder(sample)
        except Exception as exc:
            failures.append(f"{cname}().feed: {exc.__class__.__name__}: {exc}")
            continue
        return TransportCase(name, description, sample, feeder, f"wire.{name}.{cname}().feed",
                             None)
    reason = "; ".join(failures) if failures else "no public parse function found"
    return TransportCase(name, description, sample, None, None, reason)


def probe_all() -> list[TransportCase]:
    return [probe(name) for name in SAMPLES]
