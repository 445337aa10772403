"""Durable before acknowledged (issue 17): a disk store never sends a stability ACK for a
message whose bytes it has not yet handed to its repository file.

The guide's "Source Repositories" says a disk repository keeps the data on disk, and a source
counts a message stable once the stores acknowledged it ("Sources Using Quorum/Consensus"); a
store that acknowledged a message it still held only in its own memory would lose it when it is
killed, while the source has already reclaimed it.  "On disk" for the reference store means
*handed to the operating system with a write on the cache file*: a SIGKILL of the store then
cannot lose it (the kernel's page cache outlives the process); surviving a power loss needs an
fsync as well, which :class:`reference_impl.repository.Repository` does when it is opened with
``fsync=True``.

The check is made at the very moment the core writes an ACK to the source's connection (the
core's ``write`` is wrapped): the cache file, read through a fresh file handle (the OS's view,
not the store's buffers), must hold every acknowledged message already.  Hypothesis draws the
ACK batching (``stability-ack-minimum-number``, ``stability-ack-interval``), the chunk
boundaries of the transport stream, duplicates and the moments the batching timer fires.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl.context import Connection
from reference_impl.fastmsg import data_message
from reference_impl.repository import Repository, RetentionLimits
from reference_impl.sim import StreamEvent, StreamEventKind
from reference_impl.store import StoreCore, TopicPolicy
from tests.reference_impl.strategies import chunked
from tests.reference_impl.test_core_store import SOURCE_CONN, TRANSPORT_CONN, joined_store
from wire.lbmc import AckType, UmeAck
from wire.lbttcp import LbttcpStream


def _on_disk(path: Path) -> dict[int, bytes]:
    """sqn -> stored bytes, as a new reader of the cache file sees it now."""
    with open(path, "rb") as fh:  # a fresh handle: only what reached the OS
        items = LbttcpStream().feed(fh.read())
    return {item.message.sqn: item.raw for item in items if item.message is not None}


def _watch_acks(store: StoreCore, cache: Path, acked: list[int]) -> None:
    """Wrap the store's ``write``: every stability ACK to the source is checked against the
    cache file at the moment it is written, and recorded in ``acked``."""
    write = store.write

    def checked(conn: Connection, data: bytes) -> None:
        if conn.key == SOURCE_CONN:
            sqns = [h.seqnum for item in LbttcpStream().feed(data) if item.message
                    for h in item.message.headers
                    if isinstance(h, UmeAck) and h.type == AckType.STABLE]
            if sqns:
                held = _on_disk(cache)
                missing = [s for s in sqns if s not in held]
                assert not missing, f"ACK for {missing} written before the message reached " \
                                    f"the cache file (it holds {sorted(held)[-5:]}...)"
                acked.extend(sqns)
        write(conn, data)
    store.write = checked  # type: ignore[method-assign]


@settings(max_examples=60, deadline=None)
@given(sqns=st.lists(st.integers(0, 40), min_size=1, max_size=60),
       minimum=st.integers(1, 12), interval=st.integers(1, 500),
       size=st.integers(0, 400), data=st.data())
def test_no_stability_ack_leaves_before_its_message_is_in_the_cache_file(
        sqns: list[int], minimum: int, interval: int, size: int, data: st.DataObject) -> None:
    """Every batching setting, every chunk split, with the batching timer fired at drawn
    moments between chunks: each ACK finds its message in the file, and in the end every
    arrival was acknowledged (a duplicate again) and every message is in the file intact."""
    with tempfile.TemporaryDirectory() as tmp:
        store = joined_store(TopicPolicy(repository_type="disk",
                                         repository_size_threshold=1 << 30,
                                         stability_ack_minimum_number=minimum,
                                         stability_ack_interval=interval), Path(tmp))
        (src,) = store.sources.values()
        assert src.repo is not None and src.repo.cache_file is not None
        acked: list[int] = []
        _watch_acks(store, src.repo.cache_file, acked)
        messages = {s: data_message(1, s, bytes([s % 251]) * size) for s in sqns}
        stream = b"".join(messages[s] for s in sqns)
        now = 1.0
        for chunk in data.draw(chunked(stream)):
            store.stream_event(StreamEvent(StreamEventKind.DATA, TRANSPORT_CONN, chunk), now)
            store.stream_commands(now)
            now += data.draw(st.sampled_from([0.0, 0.001, interval / 2000, interval / 1000]))
            due = store.get_timer()
            if due is not None and due <= now:
                store.handle_timer(now)
                store.stream_commands(now)
        while (due := store.get_timer()) is not None and due <= now + interval / 1000:
            store.handle_timer(due)  # the batching timer sends what is left
            store.stream_commands(due)
            now = due
        assert sorted(acked) == sorted(sqns)
        assert _on_disk(src.repo.cache_file) == messages
        store.close()


def test_the_check_catches_a_store_that_acknowledges_before_writing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The property above can fail: with the repository's write-out made a no-op (the ACK then
    leaves while the message is still in the store's memory), the wrapped write trips."""
    monkeypatch.setattr(Repository, "sync", lambda self: None)
    store = joined_store(TopicPolicy(repository_type="disk",
                                     repository_size_threshold=1 << 30), tmp_path)
    (src,) = store.sources.values()
    assert src.repo is not None and src.repo.cache_file is not None
    _watch_acks(store, src.repo.cache_file, [])
    with pytest.raises(AssertionError, match="before the message reached the cache file"):
        store.stream_event(StreamEvent(StreamEventKind.DATA, TRANSPORT_CONN,
                                       data_message(1, 0, b"x")), 1.0)


def test_fsync_makes_sync_flush_to_the_device(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """``fsync=True``: every write-out ends with an fsync of the cache file (power-loss
    durability); the default hands the bytes to the OS only (SIGKILL durability)."""
    calls: list[int] = []
    real = os.fsync

    def counting(fd: Any) -> None:
        calls.append(fd)
        real(fd)
    monkeypatch.setattr(os, "fsync", counting)
    limits = RetentionLimits(1 << 30, 1 << 30, 0.0, 1 << 30)
    plain = Repository(limits, cache_file=tmp_path / "a.cache", write_behind=True, new=True)
    plain.add(0, data_message(1, 0, b"a"), 0.0)
    plain.sync()
    assert calls == []
    synced = Repository(limits, cache_file=tmp_path / "b.cache", write_behind=True, new=True,
                        fsync=True)
    synced.add(0, data_message(1, 0, b"b"), 0.0)
    synced.sync()
    assert len(calls) == 1
    synced.sync()  # nothing new: no device flush either
    assert len(calls) == 1
    plain.close()
    synced.close()
