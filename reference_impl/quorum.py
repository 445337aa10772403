"""The quorum/consensus (QC) rules of a source's store groups, as pure functions.

Guide "Quorum/Consensus Store Usage" and "Sources Using Quorum/Consensus Store Configuration";
docs/semantics.md §1.2.  A *group* is a set of stores the source's configuration names
(``ume_store ...:GroupIDX``, ``ume_store_group GroupIDX:GroupSZ``); its *quorum* is a simple
majority of its configured size.  Two options decide when enough stores are registered
(Registration Complete) and when a message is stable:

* ``ume_retention_intragroup_stability_behavior`` (within one group): ``quorum`` - a majority
  registered / acknowledged; ``all-active`` - a majority registered / every store of the group
  registered now acknowledged; ``all`` (``all-stores``) - every store of the group.
* ``ume_retention_intergroup_stability_behavior`` (across groups): ``any`` (``any-group``),
  ``majority`` (more than half of the groups), ``all`` (``all-groups``), ``all-active`` (every
  *active* group, one with a quorum of its stores registered now; at least one must be).  A
  group counts for the intergroup rule only once it meets the intragroup rule.

The consensus sequence number of the stores' answers (``ume_consensus_sequence_number_
behavior``, docs/semantics.md §1.2, §1.9) is :func:`consensus`.

Choices where the guide is silent (each tested in tests/reference_impl/test_quorum_source.py):

* ``all-active`` within a group also needs a quorum of acknowledgements: a group without a
  quorum registered is no active group, and a message it holds at fewer stores than a quorum
  is not stable there (else ``all-active`` would be laxer than ``quorum``).
* consensus ``majority``: per group, the latest sequence number that a majority of the
  group's *answering* stores hold or exceed (a store with no state for the source, not OLD,
  does not vote); then the latest of the group majorities.  ``lowest`` and ``highest`` are
  the lowest and highest answer of any store.

Every name is compared lower-case; the aliases map to one canonical name, so the rest of the
code sees only ``quorum`` / ``all-active`` / ``all`` and ``any`` / ``majority`` / ``all`` /
``all-active``.  The source core (:class:`reference_impl.source.SourceCore`) and, for the
receiver's registration, :mod:`reference_impl.receiver` are the users.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

INTRAGROUP = {"quorum": "quorum", "all-active": "all-active", "all": "all", "all-stores": "all"}
"""``ume_retention_intragroup_stability_behavior`` values (and aliases) -> canonical name."""

INTERGROUP = {"any": "any", "any-group": "any", "majority": "majority", "all": "all",
              "all-groups": "all", "all-active": "all-active"}
"""``ume_retention_intergroup_stability_behavior`` values (and aliases) -> canonical name."""

CONSENSUS = ("lowest", "majority", "highest")
"""``ume_consensus_sequence_number_behavior`` values."""


def _named(table: Mapping[str, str], option: str, value: str) -> str:
    canonical = table.get(value.lower()) if isinstance(value, str) else None
    if canonical is None:
        names = sorted(set(table.values()), key=list(table.values()).index)
        raise ValueError(f"{option} {value!r}: one of {', '.join(names)}")
    return canonical


def intragroup(value: str) -> str:
    """The canonical intragroup behaviour of ``value``; a one-line ValueError when unknown."""
    return _named(INTRAGROUP, "ume_retention_intragroup_stability_behavior", value)


def intergroup(value: str) -> str:
    """The canonical intergroup behaviour of ``value``; a one-line ValueError when unknown."""
    return _named(INTERGROUP, "ume_retention_intergroup_stability_behavior", value)


def consensus_behaviour(value: str) -> str:
    """The canonical consensus behaviour of ``value``; a one-line ValueError when unknown."""
    return _named({n: n for n in CONSENSUS}, "ume_consensus_sequence_number_behavior", value)


def quorum(size: int) -> int:
    """A simple majority of a group's configured size (2 of 3, 3 of 5, 1 of 1)."""
    return size // 2 + 1


def group_registered(intra: str, size: int, registered: int) -> bool:
    """Whether a group of ``size`` stores with ``registered`` of them registered counts as
    registered by the intragroup rule (``all``: every store; otherwise a quorum)."""
    return registered >= (size if intra == "all" else quorum(size))


def group_stable(intra: str, size: int, acked: int, registered_unacked: int) -> bool:
    """Whether a message ``acked`` stores of a ``size``-store group acknowledged is stable in
    that group; ``registered_unacked``: stores of the group registered now that have not
    acknowledged it (what ``all-active`` waits for)."""
    if intra == "all":
        return acked >= size
    if intra == "all-active":
        return acked >= quorum(size) and not registered_unacked
    return acked >= quorum(size)


def groups_meet(inter: str, groups: int, ok: set[int], active: set[int]) -> bool:
    """The intergroup rule: ``ok`` are the groups (of ``groups`` configured) that meet the
    intragroup rule, ``active`` the groups with a quorum registered now."""
    if inter == "all":
        return len(ok) == groups
    if inter == "majority":
        return len(ok) > groups // 2
    if inter == "all-active":
        return bool(active) and active <= ok
    return bool(ok)


def registration_complete(intra: str, inter: str, sizes: Mapping[int, int],
                          registered: Mapping[int, int]) -> tuple[bool, set[int]]:
    """The registration rule, for sources and receivers alike: whether the stores registered
    per group (``registered``: group index -> count, of ``sizes``: group index -> configured
    size) complete the registration by the intragroup and intergroup behaviours, and which
    groups count as registered.  A group is *active* for ``all-active`` when a quorum of it
    is registered."""
    ok = {g for g, size in sizes.items() if group_registered(intra, size, registered.get(g, 0))}
    active = {g for g, size in sizes.items() if registered.get(g, 0) >= quorum(size)}
    return groups_meet(inter, len(sizes), ok, active), ok


def consensus(answers: Mapping[int, Sequence[int]] | Sequence[int], behaviour: str) -> int:
    """The consensus sequence number of the stores' answers, by group (group index -> the
    sequence numbers its answering stores gave; a flat sequence is one group).

    ``lowest``/``highest``: of every answer; ``majority``: per group the latest sequence
    number a majority of the group's answers hold or exceed, then the latest of those (see
    the module docstring)."""
    groups: Iterable[Sequence[int]] = \
        answers.values() if isinstance(answers, Mapping) else [answers]
    groups = [sorted(g) for g in groups if g]
    if not groups:
        raise ValueError("no answers to form a consensus from")
    behaviour = behaviour.lower()
    if behaviour == "lowest":
        return min(g[0] for g in groups)
    if behaviour == "majority":
        return max(g[len(g) - quorum(len(g))] for g in groups)
    return max(g[-1] for g in groups)
