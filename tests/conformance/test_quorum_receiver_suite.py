"""The quorum suite's receiver cases (RCV-QRM-*): the reference receiver passes every one, each
names its guide section and sentence, the profile key ``explicit_ack_args`` is checked, and a
receiver profile without it makes the explicit-ACK cases unsupported (never a failure).

The cases are caught failing by the receiver mutants of tests/conformance/test_mutants.py
(CLIENT_CATCHES).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from conformance.model import Role, Verdict, all_cases
from conformance.profile import REFERENCE_RECEIVER, ProfileError, parse_profile
from conformance.runner import run

ROOT = Path(__file__).resolve().parents[2]


def quorum_receiver_cases() -> set[str]:
    return {c.id for c in all_cases(Role.RECEIVER) if c.suite == "quorum"}


def test_the_cases_cite_the_guide() -> None:
    cases = [c for c in all_cases(Role.RECEIVER) if c.suite == "quorum"]
    assert len(cases) >= 12
    for case in cases:
        assert case.id.startswith("RCV-QRM-"), case.id
        assert case.section and len(case.requirement) > 40, case.id
        assert case.doc, f"{case.id} has no docstring saying what it does"


def test_the_reference_receiver_passes_every_case(tmp_path: Path) -> None:
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "ump", "conform", "--iut", "receiver",
                           "--suite", "quorum", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((out / "results.json").read_text())
    assert {c["id"] for c in data["cases"]} == quorum_receiver_cases()
    assert [(c["id"], c["verdict"], c["message"]) for c in data["cases"]
            if c["verdict"] != "pass"] == []


def test_without_the_keys_the_application_cases_are_unsupported(tmp_path: Path) -> None:
    assert REFERENCE_RECEIVER.launch is not None
    profile = parse_profile({"iut": {"name": "no explicit acks", "role": "receiver",
                                     "launch": list(REFERENCE_RECEIVER.launch)}}, "<test>")
    assert profile.explicit_ack_args is None and profile.consume_args is None
    result = run(profile, tmp_path / "out", keywords=["RCV-QRM-010 or RCV-QRM-016"])
    assert [(r.spec.id, r.verdict) for r in result.results] == \
        [("RCV-QRM-010", Verdict.UNSUPPORTED), ("RCV-QRM-016", Verdict.UNSUPPORTED)]
    assert "explicit_ack_args" in result.results[0].message
    assert "consume_args" in result.results[1].message
    assert result.exit_code == 0


def _profile(**iut: Any) -> dict[str, Any]:
    return {"iut": {"role": "receiver", "launch": ["rcv", "{deliveries}"], **iut}}


def test_explicit_ack_args_are_read() -> None:
    profile = parse_profile(_profile(explicit_ack_args="--acks {acks} --slow"), "<p>")
    assert profile.explicit_ack_args == ("--acks", "{acks}", "--slow")
    profile = parse_profile(_profile(explicit_ack_args=["--ack-file", "{acks}"]), "<p>")
    assert profile.explicit_ack_args == ("--ack-file", "{acks}")
    assert REFERENCE_RECEIVER.explicit_ack_args == ("--ack-file", "{acks}")
    profile = parse_profile(_profile(consume_args=["--consume-file", "{acks}"]), "<p>")
    assert profile.consume_args == ("--consume-file", "{acks}")
    assert REFERENCE_RECEIVER.consume_args == ("--consume-file", "{acks}")


@pytest.mark.parametrize(("data", "words"), [
    (_profile(explicit_ack_args=[]), ["explicit_ack_args", "empty"]),
    (_profile(explicit_ack_args=["--ack-file"]), ["{acks}"]),
    (_profile(explicit_ack_args=["--ack-file", "{ack}"]), ["unknown placeholder", "{ack}"]),
    (_profile(explicit_ack_args=5), ["list of strings"]),
    (_profile(explicit_ack_args="--a '{acks}"), ["explicit_ack_args"]),
    ({"iut": {"role": "source", "launch": ["src"], "explicit_ack_args": ["{acks}"]}},
     ["receiver IUT"]),
    (_profile(consume_args=["--consume-file"]), ["consume_args", "{acks}"]),
    ({"iut": {"role": "store", "launch": ["st"], "consume_args": ["{acks}"]}},
     ["consume_args", "receiver IUT"]),
])
def test_bad_explicit_ack_args(data: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ProfileError) as info:
        parse_profile(data, "<p>")
    text = str(info.value)
    assert "\n" not in text and text.startswith("<p> [iut]")
    for word in words:
        assert word in text
