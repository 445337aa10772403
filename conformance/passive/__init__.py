"""Passive conformance: judge the stores, sources and receivers seen in a capture
(``ump conform --capture FILE``) against the requirements traffic alone can decide.

* :mod:`conformance.passive.observe`: the observed model of a capture (entities,
  registrations, data, ACKs, retransmission requests, with frame numbers);
* :mod:`conformance.passive.judge`: runs every case's passive judge (or says "judged only
  actively") into the results the active reports show;
* :mod:`conformance.passive.checks`: the judges, by area;
* :mod:`conformance.passive.cases`: the passive-only cases (``PSV-...``).
"""
