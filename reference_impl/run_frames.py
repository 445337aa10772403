"""Which frames of a loopback capture belong to one run of the reference implementation.

A capture of a loopback run (``ump demo --capture``, ``python -m captures.qc_loopback``, the
capture tests) has to name UM's port ranges in its filter: a source's transport and request
ports are the first free ones of 14371-14395, LBT-RU's are 14360-14389, LBT-RM's 14390-14400,
as in the product.  Every other UM process on the machine (a second demo, the other worker of
a parallel test run) takes its ports from the same ranges, before, during and after the run,
so the raw capture holds some of their frames too.  Checking those with the run's own would
fail for reasons that are not the run's: another process's connection seen from its middle
does not dissect, another LBT-RM source adds a session.

:class:`RunPorts` says which ports the run held *and when*: the ports chosen for it (the store
and resolver ports, free ones) for the whole capture, and each process's ports (read from
``/proc`` once it is up: :func:`bound_sockets`) from its start to its exit.  A port of a shared
range is the run's only while one of its processes lived; another process may hold the same
port number before or after, or the same number for the other protocol meanwhile (LBT-RU's
UDP ranges overlap LBT-TCP's TCP ones).  Of a process's TCP sockets only the listening ones
count: every connection of a run has its server end on a port the run listens on, while the
client end is an ephemeral port the kernel gives to another process as soon as the connection
closes.  :func:`keep_run_frames` rewrites a capture with the run's frames:

* a unicast frame is the run's when one of its ports was the run's, for its protocol, at the
  frame's time;
* a datagram to a multicast group (LBT-RM) when its *source* port was: every receiving
  process on the machine binds the group's destination port with SO_REUSEADDR, so that port
  says nothing about whose a datagram is; a port some multicast datagram went to is left out
  of the unicast test too (a NAK another run's receiver sends from it is not the run's);
* a TCP segment when, besides, its connection's first such segment is a SYN: a connection
  first seen in its middle began before any process of the run held the port (the previous
  holder closing it), whatever its port;
* a frame without UDP or TCP is kept (nothing says it is foreign).
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable
from pathlib import Path

from wire.errors import WireError
from wire.pcap import TCP_SYN, PcapWriter, decode_frame, has_nanosecond_stamps, read_capture

__all__ = ["RunPorts", "bound_ports", "bound_sockets", "keep_run_frames"]

Window = tuple[float, float]
Socket = tuple[str, int]
"""A protocol ("tcp" or "udp") and a port."""
PROTOCOLS = ("tcp", "udp")


class RunPorts:
    """The ports a run held, per protocol, each with the wall-clock windows (``time.time()``,
    the clock of capture timestamps) it held them in."""

    def __init__(self) -> None:
        self._windows: dict[Socket, list[Window]] = {}

    @classmethod
    def always(cls, ports: Iterable[int | Socket]) -> RunPorts:
        """``ports`` held for the whole capture (free ports chosen for the run)."""
        run = cls()
        run.add(ports)
        return run

    def add(self, ports: Iterable[int | Socket], start: float = -math.inf,
            end: float | None = None) -> None:
        """``ports`` held from ``start`` to ``end`` (``None``: until the end of the capture);
        a bare port number stands for both protocols.

        A process's ports are added with its start and exit times: it bound them after it
        started and let them go when it exited, so the window covers its whole hold."""
        window = (start, math.inf if end is None else end)
        for port in ports:
            for key in ([(proto, port) for proto in PROTOCOLS] if isinstance(port, int)
                        else [port]):
                self._windows.setdefault(key, []).append(window)

    def held(self, proto: str, port: int, at: float) -> bool:
        """Whether the run held ``port`` for ``proto`` at ``at``."""
        return any(lo <= at <= hi for lo, hi in self._windows.get((proto, port), ()))

    @property
    def ports(self) -> frozenset[int]:
        """Every port number the run held at some time, for either protocol."""
        return frozenset(port for _, port in self._windows)

    def __repr__(self) -> str:
        return f"RunPorts({self._windows!r})"


_TCP_LISTEN = "0A"
"""The state column of a listening socket in ``/proc/net/tcp``."""


def bound_sockets(pid: int) -> frozenset[Socket]:
    """Process ``pid``'s listening TCP ports and bound UDP ports (Linux ``/proc``; empty where
    there is none): the ends of its conversations that are its own (module docstring)."""
    inodes = set()
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:  # gone meanwhile, or no /proc
        return frozenset()
    for fd in fds:
        try:
            target = os.readlink(fd)
        except OSError:  # closed since the listing
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = set()
    for table in ("tcp", "udp", "tcp6", "udp6"):
        proto = table[:3]
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[9] in inodes and (
                    proto == "udp" or fields[3] == _TCP_LISTEN):
                found.add((proto, int(fields[1].rsplit(":", 1)[1], 16)))
    return frozenset(found)


def bound_ports(pid: int) -> frozenset[int]:
    """The port numbers of :func:`bound_sockets`, for either protocol."""
    return frozenset(port for _, port in bound_sockets(pid))


def keep_run_frames(path: Path, run: RunPorts | frozenset[int]) -> tuple[int, int]:
    """Rewrite the capture at ``path`` with the run's frames only (the module docstring says
    which); returns (kept, dropped).  ``run`` as a plain set of ports means "held for the
    whole capture"."""
    if not isinstance(run, RunPorts):
        run = RunPorts.always(run)
    everything = path.with_name(path.name + ".all")
    os.replace(path, everything)
    nanosecond = has_nanosecond_stamps(everything)
    group_ports: set[int] = set()
    for rec in read_capture(everything):
        with contextlib.suppress(WireError):
            seg = decode_frame(rec.linktype, rec.data)
            if _is_multicast(seg.dst):
                group_ports.add(seg.dport)
    connections: dict[tuple[str, int, str, int], bool] = {}
    """Whether each TCP connection (its two ends, the lower first) began with a SYN."""
    kept = dropped = 0
    writer: PcapWriter | None = None
    try:
        for rec in read_capture(everything):
            if writer is None:
                writer = PcapWriter(path, linktype=rec.linktype, nanosecond=nanosecond)
            try:
                seg = decode_frame(rec.linktype, rec.data)
                if _is_multicast(seg.dst):
                    ours = run.held(seg.proto, seg.sport, rec.ts)
                else:
                    ours = any(port not in group_ports and run.held(seg.proto, port, rec.ts)
                               for port in (seg.sport, seg.dport))
                if ours and seg.proto == "tcp":
                    ends = sorted([(seg.src, seg.sport), (seg.dst, seg.dport)])
                    key = (ends[0][0], ends[0][1], ends[1][0], ends[1][1])
                    ours = connections.setdefault(key, bool(seg.flags & TCP_SYN))
            except WireError:
                ours = True
            if ours:
                writer.write(rec.ts, rec.data)
                kept += 1
            else:
                dropped += 1
    finally:
        if writer is None:
            writer = PcapWriter(path)
        writer.close()
    everything.unlink()
    return kept, dropped


def _is_multicast(ip: str) -> bool:
    """Whether ``ip`` (dotted IPv4) is a multicast group, 224.0.0.0/4."""
    first = ip.split(".", 1)[0]
    return first.isdigit() and 224 <= int(first) <= 239
