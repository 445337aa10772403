"""The conformance suites; importing this package registers every case.

Store IUT: :mod:`.registration`, :mod:`.recovery`, :mod:`.robustness`; source IUT:
:mod:`.source`; receiver IUT: :mod:`.receiver` (their cases belong to the registration and
recovery suites too, told apart by role).
"""

from conformance.suites import receiver, recovery, registration, robustness, source

__all__ = ["receiver", "recovery", "registration", "robustness", "source"]
