"""A store core driven with real registration bytes on connections of its own (one ephemeral
port each): the bench the RegID ownership tests of sources and receivers share."""

from __future__ import annotations

from pathlib import Path

from reference_impl.context import control
from reference_impl.sim import ConnKey, StreamEvent, StreamEventKind, StreamWrite
from reference_impl.store import StoreCore, StoreSettings, TopicPolicy, TopicRule
from wire.lbmc import Header, UmePregResp
from wire.lbttcp import LbttcpStream

STORE = ("10.0.0.2", 14567)
RESOLVER = ("10.0.0.1", 15380)


class StoreBench:
    """A store core (store ``s1`` on :data:`STORE`, every topic under ``policy``, its files in
    ``tmp`` when given) and the connections registrations arrive on."""

    def __init__(self, policy: TopicPolicy, tmp: Path | None = None, now: float = 0.0) -> None:
        self.store = StoreCore(StoreSettings(
            "s1", STORE[0], STORE[1], topics=(TopicRule(".*", policy, kind="PCRE"),),
            resolver=RESOLVER, seed=1,
            disk_cache_directory=tmp / "cache" if tmp else None,
            disk_state_directory=tmp / "state" if tmp else None), now=now)
        self.next_port = 50000
        self.framers: dict[ConnKey, LbttcpStream] = {}

    def connect(self, peer_ip: str, now: float) -> ConnKey:
        self.next_port += 1
        key: ConnKey = (STORE, (peer_ip, self.next_port))
        self.store.stream_event(StreamEvent(StreamEventKind.ACCEPTED, key), now)
        return key

    def send(self, key: ConnKey, now: float, *headers: object) -> None:
        """One CONTROL message with ``headers`` from the client on ``key``."""
        self.store.stream_event(StreamEvent(StreamEventKind.DATA, key, control(*headers)), now)

    def answers(self, key: ConnKey, now: float) -> list[Header]:
        """The registration answers the store wrote to ``key`` since the last call."""
        framer = self.framers.setdefault(key, LbttcpStream())
        out = []
        for command in self.store.stream_commands(now):
            if isinstance(command, StreamWrite) and command.conn == key:
                for item in framer.feed(command.data):
                    assert item.message is not None
                    out += [h for h in item.message.headers if isinstance(h, UmePregResp)]
        return out

    def close(self, key: ConnKey, now: float) -> None:
        self.store.stream_event(StreamEvent(StreamEventKind.CLOSED, key), now)

    def tick(self, until: float) -> None:
        """Run the store's timers (activity checks every source-check-interval) to ``until``."""
        due = self.store.get_timer()
        while due is not None and due <= until:
            self.store.handle_timer(due)
            due = self.store.get_timer()
