"""The reports of a run: JSON (machines), JUnit XML (CI) and one self-contained HTML page.

The HTML report needs no network and no script: per case it shows the verdict, the
requirement (guide section and sentence), expected vs observed, the packet timeline, the IUT's
log for the case and a link to the case's pcap (relative, so the output directory can be
copied or attached to a CI run as a whole).  When the run has cases of the rpp-matrix suite, the
page also draws the guide's "UMP Version RPP Compatibility Matrix" as a grid per IUT role that
ran (rows: client kinds, columns: store kinds), each cell the case's verdict and the guide's
outcome (:func:`matrix_html`); the JSON names each such case's cell (``rpp_cell``).
"""

from __future__ import annotations

import html
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

from conformance.model import Role, Verdict
from conformance.runner import CaseResult, RunResult
from conformance.suites.rpp_matrix import CASE_OF, CELL_OF
from conformance.udp_transport import LABELS as TRANSPORT_LABELS
from reference_impl import rpp

_COLORS = {
    Verdict.PASS: "#1a7f37", Verdict.FAIL: "#cf222e", Verdict.NON_STRICT: "#9a6700",
    Verdict.INFORMATIONAL: "#0969da", Verdict.UNSUPPORTED: "#6e7781", Verdict.ERROR: "#8250df",
}


def _text(value: Any) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else repr(value)


def case_json(r: CaseResult, out: Path) -> dict[str, Any]:
    spec = r.spec
    return {
        "id": spec.id, "title": spec.title, "suite": spec.suite, "role": spec.role.value,
        "section": spec.section, "requirement": spec.requirement,
        "strength": spec.strength.value, "verdict": r.verdict.value, "message": r.message,
        "transport": r.transport, "transport_ports": r.transport_ports,
        "expected": _text(r.expected), "observed": _text(r.observed),
        "seconds": round(r.seconds, 3), "known_failure": r.known_failure,
        "counts_against": r.counts_against,
        "pcap": str(r.pcap.relative_to(out)) if r.pcap else None, "frames": r.frames,
        "store_port": r.iut_port,
        "store_ports": r.store_ports,
        "timeline": r.timeline,
        "rpp_cell": ({"client": cell.client, "store": cell.store, "expected": cell.label}
                     if (cell := CELL_OF.get(spec.id)) is not None else None),
        # a passive run (ump conform --capture): the entity judged and the deciding frames
        **({"entity": entity, "decided_by": getattr(r, "decided_by", []),
            "frames_page": getattr(r, "page", None)}
           if (entity := getattr(r, "entity", None)) is not None else {}),
    }


def write_json(run: RunResult, path: Path) -> None:
    data = {"iut": {"name": run.profile.name, "role": run.profile.role.value,
                    "version": run.profile.version, "profile": run.profile.source},
            "seconds": round(run.seconds, 3), "time_scale": run.time_scale,
            "exit_code": run.exit_code, "counts": run.counts(),
            "cases": [case_json(r, run.out) for r in run.results]}
    path.write_text(json.dumps(data, indent=1))


def _transport_tag(r: CaseResult) -> str:
    """`` [LBT-RU]`` after a case that ran on another transport than LBT-TCP (a run on every
    transport lists a store case once per transport; its ID stays)."""
    return "" if r.transport == "tcp" else f" [{TRANSPORT_LABELS.get(r.transport, r.transport)}]"


def write_junit(run: RunResult, path: Path) -> None:
    """JUnit XML: one testsuite per conformance suite; fail/error per CI conventions.

    A SHOULD case that fails and a known failure are reported as skipped with the reason, so
    a CI dashboard does not turn red for what the exit code also accepts.
    """
    root = ET.Element("testsuites", name=f"ump conform: {run.profile.name}")
    by_suite: dict[str, list[CaseResult]] = {}
    for r in run.results:
        by_suite.setdefault(r.spec.suite, []).append(r)
    for suite, results in by_suite.items():
        el = ET.SubElement(root, "testsuite", name=suite, tests=str(len(results)),
                           failures=str(sum(r.counts_against and r.verdict is not Verdict.ERROR
                                            for r in results)),
                           errors=str(sum(r.verdict is Verdict.ERROR for r in results)),
                           skipped=str(sum(not r.counts_against and r.verdict not in
                                           (Verdict.PASS, Verdict.INFORMATIONAL)
                                           for r in results)),
                           time=f"{sum(r.seconds for r in results):.3f}")
        for r in results:
            entity = getattr(r, "entity", None)  # passive runs: one testcase per entity
            tc = ET.SubElement(el, "testcase", classname=f"conformance.{suite}",
                               name=f"{r.spec.id} {r.spec.title}"
                                    + (f" [{entity}]" if entity else "")
                                    + _transport_tag(r),
                               time=f"{r.seconds:.3f}")
            props = ET.SubElement(tc, "properties")
            ET.SubElement(props, "property", name="transport", value=r.transport)
            detail = (f"{r.spec.strength.value} [{r.spec.section}] {r.spec.requirement}\n"
                      f"expected: {_text(r.expected)}\nobserved: {_text(r.observed)}\n"
                      f"evidence: {r.pcap}")
            if r.counts_against:
                tag = "error" if r.verdict is Verdict.ERROR else "failure"
                msg = "known failure passed unexpectedly" if r.unexpected_pass else r.message
                ET.SubElement(tc, tag, message=msg).text = detail
            elif r.verdict not in (Verdict.PASS, Verdict.INFORMATIONAL):
                reason = f"{r.verdict.value}: {r.message}"
                if r.known_failure:
                    reason = f"known failure {r.known_failure}: {r.message}"
                ET.SubElement(tc, "skipped", message=reason)
            ET.SubElement(tc, "system-out").text = r.message
    ET.indent(root)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:2em;color:#1f2328;max-width:1200px}
h1{font-size:1.5em}table{border-collapse:collapse;width:100%}td,th{border:1px solid #d0d7de;
padding:4px 8px;text-align:left;vertical-align:top}th{background:#f6f8fa}
.v{color:#fff;border-radius:4px;padding:1px 6px;font-weight:600;font-size:12px;white-space:nowrap}
details{border:1px solid #d0d7de;border-radius:6px;margin:8px 0;padding:6px 10px}
summary{cursor:pointer}pre{background:#f6f8fa;padding:8px;overflow:auto;max-height:300px;
font-size:12px}.iut{color:#cf222e}.h{color:#0969da}.note{color:#6e7781;font-style:italic}
.req{border-left:4px solid #d0d7de;padding-left:8px;margin:6px 0}
table.matrix{width:auto}table.matrix td{text-align:center;min-width:11em}
"""


def _badge(v: Verdict) -> str:
    return f'<span class="v" style="background:{_COLORS[v]}">{v.value}</span>'


def _timeline_rows(r: CaseResult) -> str:
    rows = []
    for e in r.timeline:
        kind = e["kind"]
        who = "note" if kind == "note" else ("iut" if e.get("from_iut") else "h")
        arrow = "" if kind == "note" else ("IUT → harness" if e.get("from_iut")
                                           else "harness → IUT")
        where = f'{e.get("src", "")} → {e.get("dst", "")}' if "src" in e else ""
        rows.append(f'<tr class="{who}"><td>{e["t"]:.4f}</td><td>{html.escape(kind)}</td>'
                    f"<td>{arrow}</td><td>{html.escape(where)}</td>"
                    f'<td>{html.escape(e["text"])}</td></tr>')
    return "".join(rows)


def matrix_html(results: list[CaseResult]) -> str:
    """The guide's "UMP Version RPP Compatibility Matrix" as one grid per IUT role with
    rpp-matrix results: a row per client kind the role's cases cover, a column per store kind;
    each cell links the case and shows its verdict and the guide's outcome (``data-case`` and
    ``data-verdict`` name them for tools).  Empty when the run has no such case."""
    by_role: dict[Role, dict[tuple[str, str], CaseResult]] = {}
    for r in results:
        cell = CELL_OF.get(r.spec.id)
        if cell is not None:
            by_role.setdefault(r.spec.role, {})[cell.client, cell.store] = r
    if not by_role:
        return ""
    grids = []
    for role in Role:
        ran = by_role.get(role)
        if ran is None:
            continue
        covered = CASE_OF.get(role, {})
        rows = [k for k in rpp.CLIENT_KINDS if any((k, s) in covered for s in rpp.STORE_KINDS)]
        head = "".join(f"<th>{html.escape(s)}</th>" for s in rpp.STORE_KINDS)
        body = []
        for client in rows:
            tds = []
            for store in rpp.STORE_KINDS:
                guide = html.escape(rpp.cell(client, store).label)
                found = ran.get((client, store))
                if found is None:
                    tds.append(f'<td class="mtx" data-verdict="not run">not run<br>'
                               f"<small>guide: {guide}</small></td>")
                    continue
                tds.append(f'<td class="mtx" data-case="{found.spec.id}" '
                           f'data-verdict="{found.verdict.value}"><a href="#{found.spec.id}">'
                           f"{_badge(found.verdict)}</a> <small>{found.spec.id}</small><br>"
                           f"<small>guide: {guide}</small></td>")
            body.append(f"<tr><th>{html.escape(client)}</th>{''.join(tds)}</tr>")
        grids.append(f'<h3>{role.value} IUT</h3><table class="matrix" data-role="{role.value}">'
                     f"<tr><th>client \\ store</th>{head}</tr>{''.join(body)}</table>")
    return ("<h2>UMP Version RPP Compatibility Matrix</h2><p>The guide's outcome per cell, and "
            "the verdict of the case that checks it (* the guide's asterisk: a source "
            "re-registering onto an existing repository).</p>" + "".join(grids))


def _decided_by(r: CaseResult) -> str:
    """A passive verdict's evidence: its deciding frames, with the ``ump dissect`` command
    that shows them (a display of those frames of the judged capture)."""
    frames: list[int] = getattr(r, "decided_by", [])
    captures: list[Path] = getattr(r, "captures", [])
    if not frames:
        return "no frames (nothing in the capture decided it)"
    from conformance.passive.evidence import dissect_command

    names = " ".join(html.escape(str(p)) for p in captures)
    listed = ", ".join(str(f) for f in frames)
    page: str | None = getattr(r, "page", None)
    shown = f' (<a href="{html.escape(page)}">dissected</a>)' if page else ""
    return (f"{html.escape(getattr(r, 'entity', ''))}, frames {listed} of {names}{shown}: "
            f"<code>{html.escape(dissect_command(captures, frames, r.store_ports))}</code>")


def write_html(run: RunResult, path: Path) -> None:
    out = run.out
    counts = run.counts()
    summary = " ".join(f"{_badge(Verdict(k))} {n}" for k, n in counts.items() if n)
    index = []
    blocks = []
    for i, r in enumerate(run.results):
        spec = r.spec
        anchor = spec.id if getattr(r, "entity", None) is None else f"{spec.id}-{i}"
        known = f" (known failure {html.escape(r.known_failure)})" if r.known_failure else ""
        label = TRANSPORT_LABELS.get(r.transport, r.transport)
        if r.transport != "tcp" and getattr(r, "entity", None) is None:
            anchor = f"{spec.id}-{r.transport}"
        index.append(f'<tr><td><a href="#{anchor}">{spec.id}</a></td><td>{_badge(r.verdict)}'
                     f"{known}"
                     f"</td><td>{html.escape(label)}</td>"
                     f"<td>{spec.strength.value}</td><td>{html.escape(spec.suite)}</td>"
                     f"<td>{html.escape(spec.title)}</td><td>{r.seconds:.2f} s</td></tr>")
        ports = ",".join(str(p) for p in r.store_ports)
        whose = "the IUT's port" if r.iut_port is not None else "the harness stores' ports"
        udp = "".join(f" --{kind.replace('-', '')}-port {','.join(map(str, found))}"
                      for kind, found in r.transport_ports.items())
        pcap = (f'<a href="{html.escape(str(r.pcap.relative_to(out)))}">evidence.pcap</a> '
                f"({r.frames} frames; decode {whose} {ports} as UM store ports: "
                f"<code>ump dissect evidence.pcap --store-port {ports}{udp}</code>)"
                ) if r.pcap and ports else (
                f'<a href="{html.escape(str(r.pcap.relative_to(out)))}">evidence.pcap</a> '
                f"({r.frames} frames"
                + (f": <code>ump dissect evidence.pcap{udp}</code>)" if udp else ")")
                if r.pcap else "no packets")
        if getattr(r, "entity", None) is not None:  # passive: the capture's deciding frames
            pcap = _decided_by(r)
        blocks.append(f"""
<details id="{anchor}" {'open' if r.counts_against else ''}>
<summary>{_badge(r.verdict)} <b>{spec.id}</b> {html.escape(spec.title)}{_transport_tag(r)}
</summary>
<p class="req"><b>{spec.strength.value}</b> — guide section “{html.escape(spec.section)}”:
{html.escape(spec.requirement)}</p>
<p>{html.escape(r.message) or "as required"}</p>
<table><tr><th>expected</th><th>observed</th></tr>
<tr><td><pre>{html.escape(_text(r.expected))}</pre></td>
<td><pre>{html.escape(_text(r.observed))}</pre></td></tr></table>
<p>Evidence: {pcap}</p>
<details><summary>packet timeline ({len(r.timeline)} entries)</summary>
<table><tr><th>t (s)</th><th>kind</th><th>direction</th><th>endpoints</th><th>content</th></tr>
{_timeline_rows(r)}</table></details>
<details><summary>IUT log during the case</summary><pre>{html.escape(r.iut_log[-8000:])}</pre>
</details>
</details>""")
    # a passive run judges every role seen in its captures (ump conform --capture)
    passive = any(getattr(r, "entity", None) is not None for r in run.results)
    kind = "passive: every store, source and receiver seen" if passive else \
        run.profile.role.value
    page = f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<title>ump conform: {html.escape(run.profile.name)}</title><style>{_CSS}</style></head>
<body><h1>Conformance of {html.escape(run.profile.name)} ({kind})</h1>
<p>{len(run.results)} cases in {run.seconds:.1f} s, time scale {run.time_scale}:
{summary}. Exit code <b>{run.exit_code}</b>
({'no MUST case failed' if run.exit_code == 0 else 'a MUST case failed or errored'}).</p>
<table id="index"><tr><th>case</th><th>verdict</th><th>transport</th><th>strength</th>
<th>suite</th><th>title</th><th>time</th></tr>{''.join(index)}</table>
{matrix_html(run.results)}
<h2>Cases</h2>{''.join(blocks)}
</body></html>"""
    path.write_text(page, encoding="utf-8")


def write_all(run: RunResult) -> dict[str, Path]:
    paths = {"json": run.out / "results.json", "junit": run.out / "junit.xml",
             "html": run.out / "report.html"}
    write_json(run, paths["json"])
    write_junit(run, paths["junit"])
    write_html(run, paths["html"])
    return paths
