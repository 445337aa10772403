"""Wall time of the registration + recovery suites against the reference store.

Issue 5 asks for the full registration + recovery run in under 60 seconds.  Run::

    python -m benchmarks.conform [--repeat 3] [--time-scale 1] [--iut source|receiver]

``--iut`` times another built-in profile (the reference source or receiver: their
registration + recovery cases) against the same target.

It prints each run's seconds, case count and verdict counts, and the best run as a ratio to
the 60 s target (below 1 is better).
"""
