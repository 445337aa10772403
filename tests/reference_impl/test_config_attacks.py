"""Hostile configuration files through the real command line (issue 22, items 3-5).

``config_attacks/xml/`` holds umestored XML files and ``config_attacks/cfg/`` flat UM
configuration files, each built to break a reader: declared encodings Python cannot decode
(or that are not text encodings at all), integers of 5,000 digits (past Python's 4,300-digit
``int()`` limit), non-ASCII digits, control and separator characters that ``str.splitlines()``
or ``str.split()`` treat as line or field breaks, path-like names and directories that are
files, and the XML entity tricks (billion laughs, XXE, external DTD, parameter entities,
XInclude, bad character references).  Every file must be refused by ``ump store -c FILE``,
``ump source -c FILE`` and ``ump receiver -c FILE`` (a flat file also as a store's
``<lbm-config>``) with exit status 2 and exactly one line on stderr that names the file and,
where the problem sits on a line, that line: never a traceback, never a silently accepted file.

:data:`XML_CASES` and :data:`CFG_CASES` give the line each file must be reported at, so a
message pointing at the wrong line fails too; a file in the folders but missing from them fails
:func:`test_every_corpus_file_is_listed`.  Larger inputs (a file over the size cap, deep
nesting) are generated here rather than committed.

The commands run in this process through ``ump.cli.main`` with stderr captured (a subprocess
costs about a second each); :func:`test_real_commands_refuse_the_corpus` runs one file of each
kind through the installed ``ump`` script to show the same holds there.  A corpus file that
were accepted would start a process: ``_run`` is replaced so such a file fails the test instead
of hanging it.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import reference_impl.cli
from ump.cli import main

CORPUS = Path(__file__).parent / "config_attacks"

XML_CASES: dict[str, int | None] = {
    # declared encodings: expat hands the name to Python's codecs, which fail in three ways
    "encoding-unknown.xml": 1,
    "encoding-unknown-ebcdic.xml": 1,
    "encoding-multibyte.xml": 1,
    "encoding-utf7.xml": 1,
    "encoding-not-text-rot13.xml": 1,
    "encoding-not-text-hex.xml": 1,
    "encoding-undefined.xml": 1,
    "encoding-idna.xml": 1,
    "encoding-declared-utf16.xml": 1,
    "encoding-bad-utf8.xml": 5,
    "encoding-utf32-undeclared.xml": 1,
    # integers past Python's int() digit limit, and digits that are not ASCII
    "huge-store-port.xml": 5,
    "huge-option-value.xml": 7,
    "huge-store-option-value.xml": 7,
    "huge-restore-last.xml": 6,
    "huge-log-size.xml": 3,
    "huge-web-monitor-port.xml": 3,
    "huge-publishing-interval.xml": 6,
    "unicode-digits-port.xml": 5,
    "superscript-digit-option.xml": 7,
    # entity tricks: no DOCTYPE at all, no XInclude, no invalid character references
    "entity-billion-laughs.xml": 2,
    "entity-xxe.xml": 2,
    "entity-external-dtd.xml": 2,
    "entity-parameter.xml": 2,
    "entity-undefined.xml": 3,
    "entity-charref-nul.xml": 5,
    "entity-charref-surrogate.xml": 5,
    "entity-charref-newline-port.xml": 5,
    "entity-xinclude.xml": 3,
    # control characters XML forbids
    "control-formfeed.xml": 5,
    "control-nul-byte.xml": 3,
    # paths: directories that are files, <lbm-config> missing, a directory, not a UM config
    "path-state-directory-is-a-file.xml": 5,
    "path-cache-directory-is-dev-null.xml": 5,
    "path-cache-directory-under-a-file.xml": 5,
    "path-lbm-config-missing.xml": 3,
    "path-lbm-config-directory.xml": 3,
    "path-lbm-config-garbage.xml": 1,
    "path-lbm-config-binary.xml": 3,
    "path-directory-too-long.xml": 7,
    "path-context-name-traversal.xml": 7,
}
"""Corpus XML file -> the line its error must name (``None``: the problem has no line)."""

CFG_CASES: dict[str, int | None] = {
    # integers past Python's int() digit limit, and digits that are not ASCII
    "huge-flight-size.cfg": 1,
    "huge-session-id.cfg": 1,
    "huge-context-session-id.cfg": 1,
    "huge-store-port.cfg": 1,
    "huge-store-regid.cfg": 1,
    "huge-store-domain.cfg": 1,
    "huge-store-name-regid.cfg": 1,
    "huge-store-group.cfg": 1,
    "huge-port-option.cfg": 1,
    "huge-rpp-mode.cfg": 1,
    "huge-resolver-daemon-port.cfg": 1,
    "unicode-digit-rpp-mode.cfg": 1,
    "unicode-digits-flight-size.cfg": 1,
    # characters that split lines or fields for str.splitlines() / str.split(), on a live line
    "control-vt-between-fields.cfg": 2,
    "control-ff-between-fields.cfg": 2,
    "control-fs-between-fields.cfg": 2,
    "control-gs-between-fields.cfg": 2,
    "control-rs-between-fields.cfg": 2,
    "control-nel-between-fields.cfg": 2,
    "control-line-separator-between-fields.cfg": 2,
    "control-paragraph-separator-between-fields.cfg": 2,
    "control-lone-cr-between-fields.cfg": 2,
    "control-nul-between-fields.cfg": 2,
    "control-nbsp-between-fields.cfg": 2,
    "control-del-between-fields.cfg": 2,
    "control-zero-width-in-name.cfg": 1,
    "control-bidi-override-in-value.cfg": 1,
    "control-ff-after-value.cfg": 1,
    # encodings other than UTF-8
    "encoding-latin1.cfg": None,
    "encoding-utf16.cfg": None,
    # names that would be paths, an entity that is only text, XML where UM config belongs
    "path-store-name-traversal.cfg": 1,
    "path-store-name-300.cfg": 1,
    "entity-charref-in-value.cfg": 1,
    "garbage-xml-as-cfg.cfg": 1,
}
"""Corpus flat UM configuration file -> the line its error must name."""

_DIGITS_RUN = re.compile(r"\d{200}")
Ump = Callable[..., tuple[int, str]]
"""``ump(*argv)`` -> (exit status, stderr)."""


@pytest.fixture
def ump(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> Ump:
    """``ump ARGS`` in this process: (exit status, stderr); a file that gets as far as starting
    a process fails the test (it was accepted)."""

    def accepted(*_: object) -> int:
        raise AssertionError("the configuration was accepted and the process would start")

    monkeypatch.setattr(reference_impl.cli, "_run", accepted)
    monkeypatch.chdir(CORPUS)  # relative <lbm-config> and directories resolve from the file

    def run(*argv: str) -> tuple[int, str]:
        capsys.readouterr()
        code = main(list(argv))
        return code, capsys.readouterr().err

    return run


def assert_one_line_error(code: int, err: str, path: Path, line: int | None) -> None:
    """Exit 2, one short line on stderr naming ``path`` (and ``line``), no traceback."""
    assert code == 2, err
    assert "Traceback" not in err
    assert err.endswith("\n") and err.splitlines() == [err[:-1]], repr(err[:300])
    assert len(err) < 600, f"{len(err)} characters: {err[:300]!r}"
    assert not _DIGITS_RUN.search(err), "the message repeats the whole huge number"
    assert str(path) in err, err
    if line is not None:
        assert f"{path}:{line}:" in err, err


def test_every_corpus_file_is_listed() -> None:
    assert sorted(p.name for p in (CORPUS / "xml").iterdir()) == sorted(XML_CASES)
    assert sorted(p.name for p in (CORPUS / "cfg").iterdir()) == sorted(CFG_CASES)


@pytest.mark.parametrize("name", sorted(XML_CASES))
def test_store_refuses_hostile_xml(ump: Ump, name: str) -> None:
    path = CORPUS / "xml" / name
    code, err = ump("store", "-c", str(path))
    assert_one_line_error(code, err, path, XML_CASES[name])


@pytest.mark.parametrize("command", ["source", "receiver"])
@pytest.mark.parametrize("name", sorted(CFG_CASES))
def test_clients_refuse_hostile_um_config(ump: Ump, name: str, command: str) -> None:
    path = CORPUS / "cfg" / name
    code, err = ump(command, "-c", str(path), "--topic", "t")
    assert_one_line_error(code, err, path, CFG_CASES[name])


@pytest.mark.parametrize("name", sorted(CFG_CASES))
def test_store_refuses_hostile_um_config_as_its_lbm_config(
        ump: Ump, tmp_path: Path, name: str) -> None:
    cfg = CORPUS / "cfg" / name
    xml = tmp_path / "store.xml"
    xml.write_text(
        '<?xml version="1.0"?>\n<ume-store version="1.3">\n'
        f"  <daemon><lbm-config>{cfg}</lbm-config></daemon>\n"
        '  <stores><store name="s" port="14567"><ume-attributes>'
        '<option name="disk-state-directory" value="state"/></ume-attributes>'
        '<topics><topic pattern="t"/></topics></store></stores>\n</ume-store>\n')
    code, err = ump("store", "-c", str(xml))
    assert_one_line_error(code, err, cfg, CFG_CASES[name])
    assert f"{xml}:3" in err, "the message also says which store file named the UM config"


def test_clients_refuse_a_directory_and_a_missing_file(ump: Ump) -> None:
    for command in ("source", "receiver"):
        for path in (CORPUS / "cfg", CORPUS / "cfg" / "no-such.cfg"):
            code, err = ump(command, "-c", str(path), "--topic", "t")
            assert_one_line_error(code, err, path, None)
    for path in (CORPUS / "xml", CORPUS / "xml" / "no-such.xml"):
        code, err = ump("store", "-c", str(path))
        assert_one_line_error(code, err, path, None)


def test_files_over_the_size_cap_are_refused_unread(ump: Ump, tmp_path: Path) -> None:
    from reference_impl.config.values import MAX_CONFIG_BYTES

    big = tmp_path / "big"
    with big.open("wb") as fh:
        fh.truncate(MAX_CONFIG_BYTES + 1)  # sparse: costs no disk
    for argv in (("store", "-c", str(big)), ("source", "-c", str(big), "--topic", "t")):
        code, err = ump(*argv)
        assert_one_line_error(code, err, big, None)
        assert "larger than" in err


def test_deep_xml_nesting_is_one_error(ump: Ump, tmp_path: Path) -> None:
    deep = tmp_path / "deep.xml"
    depth = 20_000
    deep.write_text('<ume-store version="1.3"><daemon>\n'
                    + "<log>" * depth + "</log>" * depth + "</daemon></ume-store>\n")
    code, err = ump("store", "-c", str(deep))
    assert_one_line_error(code, err, deep, 2)


def test_unwritable_state_directory(ump: Ump, tmp_path: Path) -> None:
    if os.geteuid() == 0:
        unwritable = Path("/proc")  # root writes everywhere, but not there
    else:
        unwritable = tmp_path / "ro"
        unwritable.mkdir()
        unwritable.chmod(0o555)
    xml = tmp_path / "store.xml"
    xml.write_text(
        '<ume-store version="1.3"><daemon/><stores>\n'
        '<store name="s" port="14567"><ume-attributes>'
        f'<option name="disk-state-directory" value="{unwritable}"/></ume-attributes>'
        '<topics><topic pattern="t"/></topics></store></stores></ume-store>\n')
    code, err = ump("store", "-c", str(xml))
    assert_one_line_error(code, err, xml, 2)
    assert "disk-state-directory" in err


def test_state_file_that_is_a_directory(ump: Ump, tmp_path: Path) -> None:
    (tmp_path / "state" / "s.state").mkdir(parents=True)
    xml = tmp_path / "store.xml"
    xml.write_text(
        '<ume-store version="1.3"><daemon/><stores>\n'
        '<store name="s" port="14567"><ume-attributes>'
        '<option name="disk-state-directory" value="state"/></ume-attributes>'
        '<topics><topic pattern="t"/></topics></store></stores></ume-store>\n')
    code, err = ump("store", "-c", str(xml))
    assert_one_line_error(code, err, xml, 2)
    assert "s.state" in err


REAL_RUNS = [
    ("store", "-c", str(CORPUS / "xml" / "encoding-unknown.xml")),
    ("receiver", "-c", str(CORPUS / "cfg" / "control-line-separator-between-fields.cfg"),
     "--topic", "t"),
]


def test_real_commands_refuse_the_corpus() -> None:
    """The installed entry point, as an operator runs it (the runs go in parallel: each costs
    about a second of imports)."""
    runs = [subprocess.Popen([sys.executable, "-m", "ump", *argv], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=CORPUS)
            for argv in REAL_RUNS]
    for argv, run in zip(REAL_RUNS, runs, strict=True):
        _, err = run.communicate(timeout=60)
        path = Path(argv[2])
        assert_one_line_error(run.returncode, err, path, (XML_CASES | CFG_CASES)[path.name])


def test_a_web_monitor_address_that_cannot_be_bound_is_one_line(tmp_path: Path) -> None:
    """The bind happens once the store runs, but the address is the file's: it is reported
    like a bad value, with the <web-monitor> line (before, a traceback from asyncio)."""
    with socket.socket() as taken, socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as resolver:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        resolver.bind(("127.0.0.1", 0))
        xml = tmp_path / "store.xml"
        xml.write_text(
            '<ume-store version="1.3"><daemon>\n'
            f"<web-monitor>127.0.0.1:{taken.getsockname()[1]}</web-monitor></daemon><stores>"
            '<store name="s" port="0"><ume-attributes>'
            '<option name="disk-state-directory" value="state"/></ume-attributes>'
            '<topics><topic pattern="t"/></topics></store></stores></ume-store>\n')
        done = subprocess.run(
            [sys.executable, "-m", "ump", "store", "-c", str(xml), "--resolver",
             f"127.0.0.1:{resolver.getsockname()[1]}"],
            capture_output=True, text=True, timeout=60, check=False)
    assert_one_line_error(done.returncode, done.stderr, xml, 2)
    assert "<web-monitor>" in done.stderr and "cannot listen" in done.stderr
