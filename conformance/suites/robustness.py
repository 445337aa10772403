"""Robustness suite: malformed and hostile input must not crash or corrupt a store IUT.

Each case sends something wrong, then proves the IUT still works by registering a fresh
source (the runner also fails any case during which the IUT process exits).
"""

from __future__ import annotations

import os

from conformance.context import CaseContext
from conformance.model import Role, case
from conformance.net import connect
from conformance.packets import LBMC, LBMC_Topicname, LBMC_UmePreg

SUITE = "robustness"


def _still_registers(h: CaseContext) -> None:
    resp = h.source("fresh source").register(reg_id=0)
    h.check(not resp.e_flag, "after the bad input the IUT refuses a valid registration",
            expected="a granted registration", observed=repr(resp))


SURVIVES = "A store must survive malformed input from the network and keep serving its clients."
"""The requirement every case of this suite checks."""


@case("ROB-STORE-001", suite=SUITE, role=Role.STORE,
      title="Random bytes on a registration connection do not break the store",
      section="Persistent Store Fault Tolerance",
      requirement=SURVIVES)
def random_bytes(h: CaseContext) -> None:
    link = connect(h.store_addr, h.recorder, "stranger -> store", h.scaled(2.0))
    link.send(os.urandom(64), b"\x00" * 16, b"\xff" * 40)
    link.wait_closed(h.scaled(1.0))
    link.close()
    _still_registers(h)


@case("ROB-STORE-002", suite=SUITE, role=Role.STORE,
      title="A PREG with a wrong header length does not break the store",
      section="Persistent Store Fault Tolerance",
      requirement=SURVIVES)
def malformed_preg(h: CaseContext) -> None:
    src = h.source("bad source")
    link = src.connect()
    bad = LBMC() / LBMC_UmePreg(hdr_len=7, s_flag=1) / LBMC_Topicname(topic=src.topic)
    link.send(bad)
    link.wait_closed(h.scaled(1.0))
    link.close()
    _still_registers(h)


@case("ROB-STORE-003", suite=SUITE, role=Role.STORE,
      title="A NUL byte inside a registration's topic name is refused or ignored",
      section="Persistent Store Fault Tolerance",
      requirement=SURVIVES)
def nul_in_topic(h: CaseContext) -> None:
    src = h.source("odd source")
    link = src.connect()
    link.send(src.preg(reg_id=0, topic=src.topic + "\0tail"))
    answers = link.poll(lambda m: True)
    h.wait_until(lambda: bool(answers or link.poll(lambda m: True)) or link.closed, 1.0,
                 "an answer or a close")
    link.close()
    _still_registers(h)


@case("ROB-STORE-004", suite=SUITE, role=Role.STORE,
      title="Garbage datagrams to the store's topic-resolution socket do not break it",
      section="Persistent Store Fault Tolerance",
      requirement=SURVIVES)
def garbage_datagrams(h: CaseContext) -> None:
    _still_registers(h)  # makes the store talk to the resolver, so its address is known
    for addr in list(h.resolver.iut_addrs):
        for size in (1, 7, 24, 300):
            h.resolver.port.send(os.urandom(size), addr)
    _still_registers(h)
