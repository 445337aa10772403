"""A source that deregistered stays deregistered (issue 22 item 10; guide "RPP
Deregistration": the source is blocked after deregistering and must be re-created to register
again): it neither registers again nor calls the stores it left unresponsive."""

from __future__ import annotations

import pytest

from reference_impl import events as ev
from reference_impl.deployment import SimDeployment
from reference_impl.source import SendError, SendErrorCode
from reference_impl.store import TopicPolicy, TopicRule

TOPIC = "dereg.orders"


def test_a_deregistered_source_never_registers_again_nor_finds_stores_unresponsive() -> None:
    d = SimDeployment(seed=3)
    d.add_store("store0", topics=(TopicRule(".*", TopicPolicy(), kind="PCRE"),), seed=7)
    src = d.add_source("src", TOPIC)
    assert d.run_until(lambda: src.complete, 5)
    for i in range(5):
        src.send(b"m%d" % i)
    d.run(1)
    src.deregister()
    assert d.run_until(lambda: src.deregistered, 5)
    d.run(60)  # many store checks, registration intervals and activity timeouts
    (success,) = d.events("src", ev.SourceRegistrationSuccess)
    assert isinstance(success, ev.SourceRegistrationSuccess)
    assert d.events("store0", ev.ClientRegistered) == [
        ev.ClientRegistered("source", success.reg_id, TOPIC, 0, False)]
    assert d.events("src", ev.StoreUnresponsive) == []
    assert len(d.events("src", ev.SourceRegistrationSuccess)) == 1
    with pytest.raises(SendError) as info:
        src.send(b"after")
    assert info.value.code is SendErrorCode.DEREGISTERED


def test_deregistering_a_source_that_has_no_store_registered_is_done_at_once() -> None:
    d = SimDeployment(seed=3)
    src = d.add_source("src", TOPIC, ume_store=())
    src.deregister()
    assert src.deregistered and not src.deregistering
    assert d.events("src", ev.SourceDeregistered) == [ev.SourceDeregistered(None)]


def test_a_registration_answered_after_the_deregistration_is_undone() -> None:
    d = SimDeployment(seed=3)
    d.add_store("store0", topics=(TopicRule(".*", TopicPolicy(), kind="PCRE"),), seed=7)
    src = d.add_source("src", TOPIC)
    src.deregister()  # the PREG is on its way: nothing registered yet
    assert src.deregistered
    d.run(10)
    assert len(d.events("src", ev.SourceRegistrationSuccess)) == 1  # the answer came
    deleted = d.events("store0", ev.ClientStateDeleted)
    assert [(e.role, e.reason) for e in deleted] == [("source", "deregistered")]  # type: ignore
    assert not any(link.registered for link in src.links) and src.deregistered
    with pytest.raises(SendError):
        src.send(b"never")
