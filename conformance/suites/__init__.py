"""The conformance suites; importing this package registers every case.

Store IUT: :mod:`.registration`, :mod:`.recovery`, :mod:`.robustness`; source IUT:
:mod:`.source`; receiver IUT: :mod:`.receiver` (their cases belong to the registration and
recovery suites too, told apart by role); robustness for source and receiver IUTs:
:mod:`.robustness_clients` (the robustness suite, SRC-ROB-* and RCV-ROB-*).
"""

from conformance.suites import (
    receiver,
    recovery,
    registration,
    robustness,
    robustness_clients,
    source,
)

__all__ = ["receiver", "recovery", "registration", "robustness", "robustness_clients", "source"]
