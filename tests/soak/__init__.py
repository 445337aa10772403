"""Long soak and fuzz runs (issue 22 "Must show"): a disk store SIGKILLed and restarted under
load, and a million fuzzed frames through ``ump dissect`` and the store and receiver cores.

Both are marked ``soak`` and ``slow`` (``tox -e soak`` runs them); each has a small smoke
version in the default run.
"""
