"""Wall time of the whole conformance run, every suite, for every role, serial and with
``--jobs``, against 60 s (issues 5 and 17).  Run::

    python -m benchmarks.conform [--jobs 2] [--iut store] [--suite registration]

See ``__main__`` for what it prints.
"""
