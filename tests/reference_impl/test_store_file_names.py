"""Store names become file names (issue 22 items 3 and 4): never a path, never too long.

A ``<store name>`` comes from a configuration file and may be ``../../x``, an absolute path,
300 characters or anything else XML allows; before, ``<state dir>/<name>.state`` put the state
journal wherever such a name pointed, and a long name failed with ENAMETOOLONG.  These tests
pin the encoding of :func:`reference_impl.repository.store_file_stem` (a Hypothesis property
over any text: the file is created, inside its directory, under NAME_MAX) and a store with a
hostile name journalling, caching and restoring inside its own directories.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from reference_impl.deployment import SimDeployment
from reference_impl.repository import (
    STEM_MAX,
    cache_file,
    state_file,
    store_file_stem,
    store_name_of_stem,
)
from reference_impl.store import TopicPolicy, TopicRule

HOSTILE_NAMES = [
    "../../x", "a/../../b", "..", ".", ".hidden", "n" * 300, "é" * 150, "x\u2028y", "nul\x00",
    "%2E%2E%2Fx", "back\\slash", "~tilde",
]


@pytest.fixture(scope="module")
def name_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("names")


@settings(max_examples=100, deadline=None)
@given(name=st.text(min_size=1, max_size=400) | st.sampled_from(HOSTILE_NAMES))
def test_a_store_name_never_names_a_file_outside_its_directory(name_dir: Path, name: str) -> None:
    for path in (state_file(name_dir, name), cache_file(name_dir, name, 0xFFFFFFFF)):
        assert path.parent == name_dir
        assert not path.name.startswith(".")
        assert len(path.name.encode()) <= 255
        path.touch()  # the file system takes the name, and it is in the directory
        assert (name_dir / path.name).is_file() and path.resolve().parent == name_dir.resolve()
        path.unlink()
    stem = store_file_stem(name)
    assert len(stem) <= STEM_MAX
    decoded = store_name_of_stem(stem)
    if decoded is None:  # cut to fit, with the name's hash: only when escaping made it long
        assert "~" in stem and len(name.encode("utf-8", "surrogatepass")) > STEM_MAX // 3
    else:
        assert decoded == name


@given(st.text(min_size=1, max_size=300), st.text(min_size=1, max_size=300))
def test_distinct_store_names_get_distinct_files(one: str, two: str) -> None:
    if one != two:
        assert store_file_stem(one) != store_file_stem(two)


@pytest.mark.parametrize("name", ["store-1", "ny4.primary", "S_2", "a.b-c_d"])
def test_ordinary_names_keep_their_file_names(tmp_path: Path, name: str) -> None:
    assert state_file(tmp_path, name) == tmp_path / f"{name}.state"
    assert cache_file(tmp_path, name, 7) == tmp_path / f"{name}-7-cache"


def test_a_state_file_of_the_old_naming_is_adopted(tmp_path: Path) -> None:
    (tmp_path / "store one.state").write_text("{}\n")
    (tmp_path / "store one-7-cache").write_bytes(b"x")
    assert state_file(tmp_path, "store one").read_text() == "{}\n"
    assert cache_file(tmp_path, "store one", 7).read_bytes() == b"x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["store%20one-7-cache",
                                                          "store%20one.state"]


@pytest.mark.parametrize("name", ["../../x", "a/../../b", "..", "n" * 300, "x\u2028y"])
def test_hostile_store_name_keeps_its_files_in_its_directories(tmp_path: Path,
                                                               name: str) -> None:
    """A store whose name is a path or too long for a file name journals, caches and restores
    inside its directories (before, ``../../x`` wrote ``<state>/../../x.state`` and a name of
    300 characters failed with ENAMETOOLONG)."""
    root = tmp_path / "a" / "b" / "c"
    disk = TopicPolicy(repository_type="disk", repository_size_threshold=50_000_000)
    d = SimDeployment(seed=1)
    d.add_store(name, topics=(TopicRule(".*", disk, kind="PCRE"),), seed=100,
                disk_cache_directory=root / "cache", disk_state_directory=root / "state")
    src = d.add_source("src", "orders", ume_session_id=7)
    assert d.run_until(lambda: src.complete, 10)
    for _ in range(5):
        src.send(b"m%d" % src.next_sqn)
        d.run(0.01)
    d.run(1)
    d.kill(name)
    d.run(1)
    store = d.restart(name)
    assert [r.sqns() for r in (s.repo for s in store.sources.values())  # type: ignore[attr-defined]
            if r is not None] == [[0, 1, 2, 3, 4]]
    files = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert files and all(p.parent in (root / "state", root / "cache") for p in files), files
