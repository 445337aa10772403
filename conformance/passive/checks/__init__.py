"""The passive judges, one module per area; importing this package registers them all
(:func:`conformance.model.passive_for`, :func:`conformance.passive.cases.passive_case`)."""

from conformance.passive.checks import (
    liveness,
    recovery,
    registration,
    rpp,
    sri,
    stability,
    transport,
)

__all__ = ["liveness", "recovery", "registration", "rpp", "sri", "stability", "transport"]
