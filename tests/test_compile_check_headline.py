"""The headline kernel estimates of docs/benchmarks.md (`compile_check.headline`): each is still
written in its section (fast tier), and recomputing it with the real compiler gives the
documented number (reproduce tier: compiles the benchmark's launches for sm_90)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiers import reproduce

from attnlens.kernels.compile_check import headline

ROOT = Path(__file__).resolve().parents[1]


def test_each_headline_is_written_in_its_section():
    for h in headline.HEADLINES:
        assert h.text.strip("*").startswith(f"{h.issue_ms:.3f}"), h
    found = headline.all_headlines()
    assert {(h.op, h.pass_) for h in found} >= {(op, p) for op in ("flash", "cope", "mta", "dcmha")
                                                for p in ("fwd", "bwd")}
    for h in found:
        assert h.text in headline.section_text(h.section), (h, "edited docs: update HEADLINES")


def test_a_section_is_cut_at_the_next_heading():
    docs = "intro\n## A first\nbody 0.320\n## B next\nother 0.371\n"
    assert headline.section_text("## A", docs) == "\n## A first\nbody 0.320"
    assert "0.371" in headline.section_text("## B", docs)
    with pytest.raises(LookupError, match="no section starting '## C'"):
        headline.section_text("## C", docs)


def test_the_table_rows_are_read_as_headlines():
    docs = ("## x\n" + headline.TABLE_SECTION + " and more\n| op | T |\n|---|---|\n"
            "| flash | 4096 | 64 | fwd | 0.0374 |\n| mta | 1024 | 128 | bwd | 11.4 |\n## next\n")
    rows = headline.table_headlines(docs)
    assert [(h.op, h.T, h.d_head, h.pass_, h.issue_ms) for h in rows] == [
        ("flash", 4096, 64, "fwd", 0.0374), ("mta", 1024, 128, "bwd", 11.4)]
    assert rows[0].text == "| flash | 4096 | 64 | fwd | 0.0374 |"


def test_sections_cut_once_match_a_search_of_the_whole_file():
    """`Sections` gives every section of benchmarks.md exactly as searching the whole text for
    its heading and cutting at the next one did (the lookup before `Sections`)."""
    docs = headline.DOCS.read_text()
    sections = headline.Sections(docs)
    headings = [line for line in docs.splitlines() if line.startswith("## ")]
    assert len(headings) > 10
    for heading in headings:
        start = docs.find("\n" + heading)
        end = docs.find("\n## ", start + 1)
        assert sections.text(heading) == docs[start:end if end >= 0 else len(docs)], heading
    with pytest.raises(LookupError, match="no section starting '## no such'"):
        sections.text("## no such")


def test_a_check_reads_benchmarks_md_once(monkeypatch, tmp_path, capsys):
    docs = tmp_path / "benchmarks.md"
    docs.write_text("# B\n## A one\nbound **0.500** ms\n## B two\nbound **0.250**\n"
                    f"{headline.TABLE_SECTION}\n| op | T |\n|---|---|\n"
                    "| flash | 4096 | 64 | fwd | 0.0374 |\n")
    monkeypatch.setattr(headline, "DOCS", docs)
    monkeypatch.setattr(headline, "HEADLINES", [
        headline.Headline("mta", 4096, 64, "fwd", 0.500, "**0.500**", "## A one"),
        headline.Headline("dcmha", 4096, 64, "fwd", 0.250, "**0.250**", "## B two")])
    documented = {(h.op, h.pass_): h.issue_ms for h in headline.all_headlines()}
    monkeypatch.setattr(headline, "issue_ms",
                        lambda op, T, d, pass_, cache, bound: documented[op, pass_])
    reads = []
    read_text = type(docs).read_text

    def counted(path, *args, **kwargs):
        reads.extend([path] if path == docs else [])
        return read_text(path, *args, **kwargs)

    monkeypatch.setattr(type(docs), "read_text", counted)
    assert headline.main([]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.endswith("| yes |")]
    assert len(rows) == 3 and reads == [docs]


def test_a_row_flags_a_headline_gone_from_its_section():
    h = headline.HEADLINES[0]
    assert headline.row(h, h.issue_ms * 1.5, False).endswith("| 1.5000 | NO |")
    sfu = [h for h in headline.HEADLINES if h.bound == "sfu"]
    assert sfu and all(h.bound in ("issue", "sfu") for h in headline.HEADLINES)
    line = headline.row(sfu[0], sfu[0].issue_ms, True)
    assert line.startswith("| flash | 4096 | 64 | fwd (sfu) |")


_RECOMPUTE = r"""
import json, sys
import triton
from attnlens.kernels.compile_check import headline
from attnlens.kernels.compile_check.results_cache import ResultCache
cache = ResultCache(None)
rows = [(h.op, h.T, h.d_head, h.pass_, h.bound, h.issue_ms,
         headline.issue_ms(h.op, h.T, h.d_head, h.pass_, cache, bound=h.bound))
        for h in headline.all_headlines()]
print(json.dumps(dict(triton=triton.__version__, rows=rows)))
"""


@pytest.mark.parametrize("headlines", [pytest.param("all", marks=reproduce("report"))])
def test_the_headline_issue_bounds_recompute(headlines):
    import triton

    if triton.__version__ != headline.TRITON:
        pytest.skip(f"documented with triton {headline.TRITON}; this is {triton.__version__}")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _RECOMPUTE], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    off = [r for r in got["rows"] if abs(r[6] / r[5] - 1) > headline.TOLERANCE]
    assert not off, f"(op, T, d, pass, bound, documented ms, recomputed ms): {off}"
