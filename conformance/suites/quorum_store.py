"""The quorum suite, store IUT (QRM-STORE-*): the receiver activity timeout and state lifetime
(client value against store value, the shorter wins) and a retransmission request naming an
unknown RegID (guide "Activity Timeout and State Lifetime Options", "Registration Identifier";
docs/semantics.md §1.11)."""

from __future__ import annotations
