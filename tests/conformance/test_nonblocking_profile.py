"""The source profile keys for non-blocking sends (``nonblocking_args``, ``would_block_text``)
and what SRC-FLT-009 does with them: checked like every profile key (one-line
:class:`ProfileError` naming the file and the key), appended to the launch command when a case
asks for non-blocking sends, and the case is ``unsupported`` without them and passes against
the reference source, which sets both."""

from __future__ import annotations

from pathlib import Path

import pytest

from conformance.iut import ClientUnderTest
from conformance.model import Verdict
from conformance.profile import REFERENCE_SOURCE, ProfileError, parse_profile
from conformance.runner import run
from conformance.verdicts import Unsupported

SOURCE = {"role": "source", "launch": "src {topic}"}


def test_the_keys_parse_as_a_list_or_a_command_line() -> None:
    listed = parse_profile({"iut": {**SOURCE, "nonblocking_args": ["--nb", "{workdir}/x"],
                                    "would_block_text": "EWOULDBLOCK"}}, "p.toml")
    assert listed.nonblocking_args == ("--nb", "{workdir}/x")
    assert listed.would_block_text == "EWOULDBLOCK"
    line = parse_profile({"iut": {**SOURCE, "nonblocking_args": "--mode 'non blocking'",
                                  "would_block_text": "would block"}}, "p.toml")
    assert line.nonblocking_args == ("--mode", "non blocking")
    plain = parse_profile({"iut": SOURCE}, "p.toml")
    assert plain.nonblocking_args is None and plain.would_block_text is None
    assert REFERENCE_SOURCE.nonblocking_args == ("--nonblocking",)
    assert REFERENCE_SOURCE.would_block_text == "would block"


@pytest.mark.parametrize("extra, role, words", [
    ({"nonblocking_args": ["--nb"]}, "source", "nonblocking_args needs would_block_text"),
    ({"would_block_text": "x"}, "source", "would_block_text needs nonblocking_args"),
    ({"nonblocking_args": [], "would_block_text": "x"}, "source", "nonblocking_args is empty"),
    ({"nonblocking_args": 3, "would_block_text": "x"}, "source", "must be a list of strings"),
    ({"nonblocking_args": ["--nb", 1], "would_block_text": "x"}, "source",
     "must be a list of strings"),
    ({"nonblocking_args": "'open", "would_block_text": "x"}, "source", "nonblocking_args:"),
    ({"nonblocking_args": ["{nope}"], "would_block_text": "x"}, "source",
     "nonblocking_args uses unknown placeholder {nope}"),
    ({"nonblocking_args": ["--nb"], "would_block_text": "  "}, "source",
     "would_block_text must be"),
    ({"nonblocking_args": ["--nb"], "would_block_text": 5}, "source",
     "would_block_text must be"),
    ({"nonblocking_args": ["--nb"], "would_block_text": "x"}, "receiver",
     "nonblocking_args is for a source IUT"),
    ({"nonblock_args": ["--nb"]}, "source", "did you mean 'nonblocking_args'"),
])
def test_mistakes_are_one_line_naming_file_and_key(extra: dict[str, object], role: str,
                                                   words: str) -> None:
    with pytest.raises(ProfileError) as caught:
        parse_profile({"iut": {**SOURCE, "role": role, **extra}}, "p.toml")
    text = str(caught.value)
    assert "\n" not in text and text.startswith("p.toml [iut]"), text
    assert words in text, text


def test_nonblocking_start_appends_the_args_or_is_unsupported(tmp_path: Path) -> None:
    profile = parse_profile({"iut": {**SOURCE, "nonblocking_args": ["--nb", "{topic}"],
                                     "would_block_text": "x"}}, "p.toml")
    iut = ClientUnderTest(profile, tmp_path, ("127.0.0.1", 1))
    iut.topic = "t.1"
    assert iut.argv(tmp_path / "lbm.cfg", profile.nonblocking_args or ()) == \
        ["src", "t.1", "--nb", "t.1"]
    plain = ClientUnderTest(parse_profile({"iut": SOURCE}, "p.toml"), tmp_path,
                            ("127.0.0.1", 1))
    with pytest.raises(Unsupported, match="nonblocking_args"):
        plain.start("t.2", nonblocking=True)
    assert plain.proc is None  # nothing was launched


def test_src_flt_009_is_unsupported_without_the_keys(tmp_path: Path) -> None:
    profile = parse_profile({"iut": {"role": "source", "launch": list(
        REFERENCE_SOURCE.launch or ())}}, "<no non-blocking keys>")
    result = run(profile, tmp_path / "out", keywords=["SRC-FLT-009"])
    (only,) = result.results
    assert only.verdict is Verdict.UNSUPPORTED, (only.verdict, only.message)
    assert "nonblocking_args" in only.message


def test_src_flt_009_passes_against_the_reference_source(tmp_path: Path) -> None:
    result = run(REFERENCE_SOURCE, tmp_path / "out", keywords=["SRC-FLT-009"])
    (only,) = result.results
    assert only.verdict is Verdict.PASS, only.message
