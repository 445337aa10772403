"""Deliberately faulty stores: the harness must catch every one of them.

Run like ``ump store``, with the mutant's name first::

    python tests/conformance/mutant_store.py grants-active-regid -c store.xml --profile current

Each mutant patches one behaviour of the reference store (:class:`reference_impl.store
.StoreCore`) and is otherwise the reference store, so a case that catches it checks exactly
that behaviour.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from reference_impl import runtime
from reference_impl.store import StoreCore
from wire.lbmc import PregError


def grants_active_regid() -> None:
    """Grants a source the RegID another active source holds (instead of refusing it)."""
    reject = StoreCore._reject

    def patched(self: StoreCore, conn: Any, preg: Any, error: PregError, text: str) -> None:
        if error == PregError.EACTIVE:
            self._respond(conn, preg, reg_id=preg.reg_id)
            return
        reject(self, conn, preg, error, text)
    StoreCore._reject = patched  # type: ignore[method-assign, assignment]


def forgets_old_flag() -> None:
    """Answers every registration as if the client were new (no OLD flag)."""
    respond = StoreCore._respond

    def patched(self: StoreCore, conn: Any, preg: Any, **kw: Any) -> None:
        kw["old"] = False
        respond(self, conn, preg, **kw)
    StoreCore._respond = patched  # type: ignore[method-assign]


def wrong_low_sqn() -> None:
    """Tells receivers a low sequence number one past the right one."""
    respond = StoreCore._respond

    def patched(self: StoreCore, conn: Any, preg: Any, **kw: Any) -> None:
        if not preg.s_flag and not kw.get("error"):
            kw["low"] = kw.get("low", 0) + 1
        respond(self, conn, preg, **kw)
    StoreCore._respond = patched  # type: ignore[method-assign]


def ignores_rate_limit() -> None:
    """Serves retransmission requests as fast as they come, whatever the configured rate."""
    settings = runtime.store_settings

    def patched(*args: Any, **kw: Any) -> Any:
        import dataclasses

        s = settings(*args, **kw)
        return dataclasses.replace(s, retransmission_request_processing_rate=10**9)
    runtime.store_settings = patched


def drops_duplicate() -> None:
    """Drops a message it already holds without acknowledging it again (a proactive
    retransmission whose first stability ACK was lost never becomes stable)."""
    from reference_impl.repository import AddResult, Repository

    add = Repository.add

    def patched(self: Repository, sqn: int, raw: bytes, now: float) -> AddResult:
        result = add(self, sqn, raw, now)
        return AddResult(dropped=True) if result.duplicate else result
    Repository.add = patched  # type: ignore[method-assign]


def acks_before_writing() -> None:
    """Acknowledges messages it holds only in its own memory: its disk repositories write
    lazily, once 64 KiB have gathered (a clean shutdown writes the rest), while the stability
    ACKs go out per chunk as usual - so a SIGKILL loses the newest acknowledged messages."""
    from reference_impl.repository import Repository

    sync, close = Repository.sync, Repository.close

    def lazy(self: Repository) -> None:
        if sum(len(raw) for raw in self._unwritten) >= 1 << 16:
            sync(self)

    def closing(self: Repository) -> None:
        sync(self)
        close(self)
    Repository.sync = lazy  # type: ignore[method-assign]
    Repository.close = closing  # type: ignore[method-assign]


MUTANTS: dict[str, Callable[[], None]] = {
    "grants-active-regid": grants_active_regid,
    "forgets-old-flag": forgets_old_flag,
    "wrong-low-sqn": wrong_low_sqn,
    "ignores-rate-limit": ignores_rate_limit,
    "drops-duplicate": drops_duplicate,
    "acks-before-writing": acks_before_writing,
}


def main(argv: list[str]) -> int:
    if not argv or argv[0] not in MUTANTS:
        print(f"usage: mutant_store.py {{{','.join(MUTANTS)}}} STORE-ARGS...", file=sys.stderr)
        return 2
    MUTANTS[argv[0]]()
    from ump.cli import main as ump_main

    return ump_main(["store", *argv[1:]])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
