"""Which source host each row of a capture belongs to, and a capture's hosts split into parts
that are analysed one after the other: :func:`plan_parts`, :class:`Part`.

A capture too big to analyse in one piece is analysed a part at a time
(:func:`spark_analysis.engine.run.analyze_in_parts`).  That is exact only if every pair or
group of rows an analysis puts together lands in one part.  Every pairing of the analyses is
keyed by the *source host*, the address of the transport source or store whose traffic it
is, so a part is a set of source hosts and a row goes to the part of its host:

``packets``
    LBT-RM / LBT-RU: the address of the transport session's source, as tshark keys the
    session (:func:`spark_analysis.engine.data.session_side`): the sender of what a source
    sends (DATA, SM, NCF, RST), the destination of what receivers send (NAKs, ACKs, and a NAK
    an ICMP error quotes).  Sequence gaps, NAK/NCF/RX pairing and transport sessions are then
    within one host.  Every other packet (LBT-TCP, topic resolution): its sender.
``messages`` (topic messages)
    the sender: a source's data, or a store's retransmissions, which the RXREQs to that
    store pair with.
``rxreqs``
    the destination (the store asked).
``acks``
    a stability ACK (store to source): its destination, the source its sends are paired by;
    a consumption ACK (receiver to store): the source its receiver's registration names
    (:func:`spark_analysis.engine.acks.ack_hosts`).

Registrations, topic resolution and the flagged control messages are few and shared: every
part reads them whole, and the results made of them alone are made once.  A row without a
host (an ACK whose registration is not in the capture) and every host the plan did not see
go to the first part, the complement of the others, so each row is in exactly one part.

Summaries keyed by a source (sequence streams, sessions, latencies per source, flight size
per source topic, retransmissions per responder) are then whole in one part; the few
results that span hosts are made after the parts (the anomaly summary from all anomalies;
the flight-size bins from each capture's whole time span).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from spark_analysis.engine.common import plain
from spark_analysis.engine.data import from_source

_SESSION_PROTOCOLS = pa.array(["lbtrm", "lbtru"], pa.string())


def _mask(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    return np.asarray(pc.fill_null(values, False), dtype=bool)


def packet_by_destination(packets: pa.Table) -> np.ndarray:
    """Where a packet's source host is its destination address: what an LBT-RM / LBT-RU
    receiver sends (not :data:`~spark_analysis.engine.data.SOURCE_SIDE`; a null type counts as
    not from the source, as in :func:`~spark_analysis.engine.data.session_side`)."""
    session = _mask(pc.is_in(packets.column("protocol"), value_set=_SESSION_PROTOCOLS))
    return session & ~_mask(from_source(packets.column("packet_type")))


BY_DESTINATION = {"packets": packet_by_destination,
                  "messages": lambda t: np.zeros(t.num_rows, dtype=bool),
                  "rxreqs": lambda t: np.ones(t.num_rows, dtype=bool)}
"""Per input table whose rows are owned by an address of their own: where that is the
destination (``dst_ip``) rather than the sender (``src_ip``)."""


def hosts_of(table: pa.Table, name: str) -> pa.Array:
    """The source host of every row of input table ``name`` (a key of
    :data:`BY_DESTINATION`), as strings."""
    if not table.num_rows:
        return pa.array([], pa.string())
    dst = BY_DESTINATION[name](table)
    return pc.if_else(pa.array(dst), plain(table.column("dst_ip").combine_chunks()),
                      plain(table.column("src_ip").combine_chunks()))


def host_counts(table: pa.Table, name: str) -> dict[str | None, int]:
    """Rows of input table ``name`` per source host (None: rows without one)."""
    counts = pc.value_counts(hosts_of(table, name))
    return dict(zip(counts.field("values").to_pylist(), counts.field("counts").to_pylist(),
                    strict=True))


@dataclass(frozen=True)
class Part:
    """One part of a capture: the rows of these source hosts, or (``rest``) of every other
    host and of rows without one."""

    hosts: frozenset[str]
    rest: bool = False

    def owns(self, hosts: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Which of these source hosts' rows are in this part."""
        found = _mask(pc.is_in(hosts, value_set=pa.array(sorted(self.hosts), pa.string())))
        return ~found if self.rest else found


def split(parts: Sequence[Part], name: str, table: pa.Table) -> list[pa.Table]:
    """The rows of input table ``name`` (:data:`BY_DESTINATION`) in each of ``parts`` (a plan
    of :func:`plan_parts`: each row in exactly one)."""
    hosts = hosts_of(table, name)
    return [table.filter(pa.array(part.owns(hosts))) for part in parts]


WHOLE = Part(frozenset(), rest=True)
"""The whole capture as one part."""


def plan_parts(counts: Mapping[str | None, int], parts: int) -> list[Part]:
    """``counts`` (rows per source host) split into at most ``parts`` parts of near equal
    rows: the hosts by falling count, each to the part with the fewest rows so far.  The
    first part is the rest (:class:`Part`): it holds the rows without a host and any host
    not in ``counts``.  Fewer parts than asked when there are fewer hosts."""
    named = sorted(((n, h) for h, n in counts.items() if h is not None),
                   key=lambda item: (-item[0], item[1]))
    parts = max(1, min(parts, len(named)))
    if parts == 1:
        return [WHOLE]
    heap = [(counts.get(None, 0) if i == 0 else 0, i) for i in range(parts)]
    members: list[list[str]] = [[] for _ in range(parts)]
    for rows, host in named:
        load, i = heapq.heappop(heap)
        members[i].append(host)
        heapq.heappush(heap, (load + rows, i))
    others = frozenset(h for i in range(1, parts) for h in members[i])
    return [Part(others, rest=True), *(Part(frozenset(m)) for m in members[1:])]


def parts_needed(rows: int, rows_per_part: int) -> int:
    """How many parts keep each near ``rows_per_part`` rows."""
    return max(1, int(np.ceil(rows / max(1, rows_per_part))))
