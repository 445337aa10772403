"""The quorum suite, source IUT (SRC-QRM-*): registration completion and message stability by the
intragroup and intergroup behaviours with two and three store groups, consensus sequence numbers,
store unresponsive, no sends after quorum loss and sends again after it returns, and the returning
store getting the unstable messages again (guide "Sources Using Quorum/Consensus";
docs/semantics.md §1.2, §1.12)."""

from __future__ import annotations
