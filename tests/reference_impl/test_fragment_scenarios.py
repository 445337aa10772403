"""Fragmented messages on a lossy LBT-RU network, in the simulator (issue 17).

10% of the datagrams on every link are lost (some also duplicated and reordered): fragments
come late, twice, out of order, from the transport's own repair or from the store; whatever
the mix, every message reaches the receiver exactly once, in order, with its payload intact
and its first fragment's sequence number, and the source ends with nothing in flight.
"""

from __future__ import annotations

from typing import Any

import pytest

from reference_impl import events as ev
from reference_impl import fragments
from reference_impl.deployment import SimDeployment
from reference_impl.sim import LinkConfig
from reference_impl.store import TopicPolicy, TopicRule

TOPIC = "big.ru"
RULES = (TopicRule(".*", TopicPolicy(repository_size_threshold=50_000_000), kind="PCRE"),)
DATAGRAM = 1200
SIZES = [100, 5000, 1100, 1200, 30_000, 7, 2400, 9000]
"""Payload lengths: some fit one datagram, some take 2 to 27 fragments."""


def deployment(seed: int, link: LinkConfig, **options: Any) -> SimDeployment:
    d = SimDeployment(seed=seed, link=link)
    d.add_store("store", topics=RULES, seed=100)
    d.add_source("src", TOPIC, transport="lbt-ru",
                 transport_lbtru_datagram_max_size=DATAGRAM, **options)
    d.add_receiver("rcv", TOPIC)
    assert d.run_until(lambda: d.sources["src"].complete and d.receivers["rcv"].complete, 60)
    return d


def run_messages(d: SimDeployment, rounds: int = 3) -> list[tuple[int, bytes]]:
    """Send every size ``rounds`` times; (first sequence number, payload) of each."""
    src = d.sources["src"]
    sent = []
    for r in range(rounds):
        for i, size in enumerate(SIZES):
            body = f"{r}.{i}:".encode().ljust(size, b"abcdefgh"[i % 8:i % 8 + 1])
            sent.append((src.send(body), body))
            d.run(0.01)
    return sent


def expected_sqns(rounds: int = 3) -> list[int]:
    piece = fragments.piece_size("lbt-ru", DATAGRAM)
    whole = fragments.whole_size("lbt-ru", DATAGRAM)
    sqns, sqn = [], 0
    for _ in range(rounds):
        for size in SIZES:
            sqns.append(sqn)
            sqn += 1 if size <= whole else fragments.fragment_count(size, piece)
    return sqns


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ten_percent_loss_every_message_once_in_order_and_intact(seed: int) -> None:
    d = deployment(seed, LinkConfig(loss=0.1, duplicate=0.02, reorder=0.05))
    sent = run_messages(d)
    assert [sqn for sqn, _ in sent] == expected_sqns()
    d.run(40)
    got = [(e.sequence_number, e.payload) for e in d.events("rcv")
           if isinstance(e, ev.MessageDelivered)]
    assert got == sent
    src = d.sources["src"]
    assert (src.inflight, src.inflight_bytes) == (0, 0)
    assert not d.events("rcv", ev.UnrecoverableLoss)
    session = d.receivers["rcv"].lbtru[0].session
    assert session.stats["naks"] > 0  # the transport repaired losses of fragments


def test_fragments_the_transport_cannot_repair_come_from_the_store() -> None:
    """A transmission window of one datagram and 10% loss from the source to the receiver
    only (a store that lost a fragment beyond the window would declare it lost,
    docs/semantics.md §1.8): a lost fragment is beyond the source's repair at once, so the
    receiver asks the store for it (RXREQ) and reassembles retransmissions."""
    d = deployment(4, LinkConfig(), transport_lbtru_transmission_window_size=DATAGRAM)
    d.net.set_link("src", "rcv", LinkConfig(loss=0.1), both_ways=False)
    sent = run_messages(d, rounds=2)
    d.run(60)
    got = [(e.sequence_number, e.payload) for e in d.events("rcv")
           if isinstance(e, ev.MessageDelivered)]
    assert got == sent
    rcv = d.receivers["rcv"]
    assert rcv.stats["requests"] > 0 and rcv.stats["retransmissions"] > 0
    assert any(e.retransmission for e in d.events("rcv") if isinstance(e, ev.MessageDelivered))
    assert (d.sources["src"].inflight, d.sources["src"].inflight_bytes) == (0, 0)
