"""The conformance suites; importing this package registers every case.

Store IUT: :mod:`.registration`, :mod:`.recovery`, :mod:`.robustness`; source IUT:
:mod:`.source`; receiver IUT: :mod:`.receiver` (their cases belong to the registration and
recovery suites too, told apart by role); robustness for source and receiver IUTs:
:mod:`.robustness_clients` (the robustness suite, SRC-ROB-* and RCV-ROB-*).  The
flight-size suite (source IUT, SRC-FLT-*): :mod:`.flight_size`; the proactive-retransmit suite
(source IUT, SRC-PRX-*, and store IUT, PRX-STORE-*): :mod:`.proactive`; the durability suite
(store IUT, DUR-STORE-*: acknowledged messages survive a SIGKILL): :mod:`.durability`.  The
rpp-matrix suite (the guide's "UMP Version RPP Compatibility Matrix", one case per cell and role:
MTX-STORE-*, SRC-MTX-*, RCV-MTX-*): :mod:`.rpp_matrix`.  The quorum suite: :mod:`.quorum_source`
(SRC-QRM-*), :mod:`.quorum_receiver` (RCV-QRM-*) and :mod:`.quorum_store` (QRM-STORE-*).
The proxy suite (store IUT run as a group of instances, PXY-STORE-*): :mod:`.proxy`.
The otr suite (off-transport recovery: RCV-OTR-* and OTR-STORE-*): :mod:`.otr`.
The lbt-rm suite (a source's and a receiver's LBT-RM transport: SRC-LBTRM-*, RCV-LBTRM-*):
:mod:`.transport_lbtrm`.
"""

from conformance.suites import (
    durability,
    flight_size,
    otr,
    proactive,
    proxy,
    quorum_receiver,
    quorum_source,
    quorum_store,
    receiver,
    recovery,
    registration,
    robustness,
    robustness_clients,
    rpp,
    rpp_matrix,
    source,
    transport_lbtrm,
)

__all__ = ["durability", "flight_size", "otr", "proactive", "proxy", "quorum_receiver",
           "quorum_source", "quorum_store", "receiver", "recovery", "registration",
           "robustness", "robustness_clients", "rpp", "rpp_matrix", "source", "transport_lbtrm"]
