"""The conformance suites; importing this package registers every case."""

from conformance.suites import recovery, registration, robustness

__all__ = ["recovery", "registration", "robustness"]
