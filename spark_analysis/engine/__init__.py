"""The analyses of ``ump analyze`` as vectorised functions over Arrow-backed pandas tables.

Each module answers one group of questions (topics, transport sessions, sequence gaps,
registrations, ACK latencies, flight size, retransmission requests, anomalies) with pure
functions: tables in, one table out, no I/O and no Spark.  Spark runs the chain once per
capture in a Python worker (or the driver runs it, in local mode); see
:mod:`spark_analysis.engine.common` for the table conventions.  Three modules around them
touch files: :mod:`~spark_analysis.engine.inputs` reads the decode's Parquet,
:mod:`~spark_analysis.engine.run` runs the chain (a capture too big for the memory in parts,
:mod:`~spark_analysis.engine.owners`) and :mod:`~spark_analysis.engine.spill` keeps a
part's tables on local disk meanwhile.
"""
