"""docs/circuit_discovery.md's text-model tables are what the report command computes: each
shipped text model's row is recomputed here (the first table: heads found, K-composition, rank,
faithfulness; numbers to 0.01, since summation order differs between CPUs)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from tiers import documented_params

from attnlens.hooked_models.zoo import available
from attnlens.interp.circuits.discovery.report import model_rows

DOC = Path(__file__).resolve().parents[1] / "docs" / "circuit_discovery.md"
SECTION = "## The induction circuit of a text language model"
HALF_LEN = 20      # the command quoted in that section


def documented_rows() -> dict[str, dict[str, str]]:
    """`{model: {column: cell}}` of the section's first table (the one with 'recovered')."""
    text = DOC.read_text()
    section = text[text.index(SECTION):]
    section = section[:section.index("\n## ", 1)]
    lines = [ln for ln in section.splitlines() if ln.startswith("|")]
    header_at = next(i for i, ln in enumerate(lines) if "| recovered |" in ln)
    header = [c.strip() for c in lines[header_at].strip("|").split("|")]
    rows = {}
    for ln in lines[header_at + 2:]:
        cells = [c.strip() for c in ln.strip("|").split("|")]
        if len(cells) != len(header):
            break
        rows[cells[0]] = dict(zip(header, cells, strict=True))
    return rows


def test_the_section_lists_every_shipped_2_layer_text_model():
    rows = documented_rows()
    shipped = {n for n in available() if re.fullmatch(r"text-[a-z]+-l2", n)}
    assert shipped and shipped <= set(rows) <= set(available())   # data-mix twins may join


@pytest.mark.parametrize("name", documented_params(
    "circuit", sorted(documented_rows()), ids=str, keep=["text-mha-l2"]))   # ~6 s; dcmha: minutes
def test_documented_text_circuit_is_recomputed(name):
    torch.manual_seed(0)
    top, _ = model_rows(name, half_len=HALF_LEN)
    doc = documented_rows()[name]
    for column in ("prev-token heads", "induction heads", "edges",
                   "K-composition edges (of possible)", "best K-comp rank",
                   "induction -> logits", "recovered", "how"):
        assert doc[column] == str(top[column]), column
    for column in ("faith EAP-IG", "faith AP", "faith EAP-IG, mean-ablated"):
        assert float(doc[column]) == pytest.approx(top[column], abs=0.01), column
    clean, corrupted = map(float, doc["metric clean / corrupted"].split(" / "))
    got = [float(x) for x in top["metric clean / corrupted"].split(" / ")]
    assert [clean, corrupted] == pytest.approx(got, abs=0.01)
