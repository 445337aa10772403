"""The quorum suite, receiver IUT (RCV-QRM-*): the receiver's consensus low sequence number and
registration completion with store groups, re-registration only with stores whose SRI version went
up, recovery that retries another store after ``retransmit_request_message_timeout``,
``retransmit_request_maximum``, and explicit-ACK-only mode (guide "Sources Using
Quorum/Consensus", "Receiver Recovery", "Acknowledgement Generation"; docs/semantics.md §1.4,
§1.9)."""

from __future__ import annotations
