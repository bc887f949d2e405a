"""What the bundled text models show, in words: the hand-written part of docs/zoo.md's first
section ("The text models at a glance"), which `attnlens.reports.zoo_docs` writes around the
generated summary table (`attnlens.reports.readme_table.summary_table`).

The numbers here are read off the cards, the studies (docs/figures/zoo/*.csv) and the circuit
runs; edit them when a model is retrained, then run `python -m attnlens.reports.zoo_docs`. Links
are relative to docs/. A zoo that lacks a model named here (a test's small zoo) gets the table
without this prose (`findings`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

INTRO = """\
Small transformers trained here on two CPU cores on the source files of the Python standard library,
512-token context, with the byte-level BPE tokenizer (4,096 tokens) they were trained with; each
`card.json` holds the exact command, data, tokens seen, wall and CPU time, and metrics re-measured
by `python -m attnlens.lab.evaluate NAME`. Score: the best head's attention on the induction stripe
of the zoo's probe (`[BOS] r r`, 150 random ids, held-out seed 20261125), at the `pattern` stage
and, for MTA, DCMHA and Infini, whose pattern is not a plain softmax, also at their row-stochastic
stage. Where the pattern is not row-stochastic its score is not attention mass but a signed weight:
DCMHA's post-Compose pattern mixes the heads' maps (text-dcmha-l4mlp's L3H0 rows on the probe sum to
3.4 on average, -1.0 to 11.2, entries -1.4 to 8.9), so its 2.72 can exceed 1, and the row-stochastic
stage's score is the attention mass; copy ratio: the second copy's loss over the first's; a model
copies when a score reaches 0.3 and the ratio is below 0.5 (the bar of [Induction heads across
variants](#induction-heads-across-variants)). One training seed each (0), so no interval."""

FINDINGS = """\
Every model saw the same 41M tokens: five 2-layer attention-only models of 4 heads, their
1-layer controls, three 2-layer twins (`-mix`: a quarter of the contexts repeat a span; `-pkgs`:
ten times the text) and 4-layer models with MLPs (d_mlp 512). What they show:

**4 layers with MLPs.** `text-mha-l4mlp` (validation loss 2.53 against 2.86 for `text-mha-l2`)
has an induction head in its last layer (L3H2; the copy half of the bar is missed, as for
`text-mha-l2`), fed by a previous-token head in layer 1 that shifts the first MLP's reading of
each token, which circuit discovery finds automatically
([circuit_discovery.md](circuit_discovery.md)); `text-cope-l4mlp` builds the same
circuit (MLP0 -> previous-token head L1H3 -> three layer-3 induction heads), and its best
induction head weakens less with distance than the MHA model's (score 0.55 against 0.29 at 255
tokens back). `text-mta-l4mlp` has the lowest validation loss of the five and copies best
(0.26x), again through layer 0 (19 of its circuit's top 20 edges), as `text-mta-l2` does
(below). `text-dcmha-l4mlp` is the DCMHA that copies (0.37x; validation loss 2.47, second to
MTA's), where the 2-layer DCMHA formed no induction head on the same text: it builds MHA's
circuit (MLP0 -> previous-token head L1H0 -> the keys of last-layer heads), and its last layer's
heads share one induction map through Compose. L3H2 computes it (0.74 of its softmax on the
induction stripe of the zoo's probe) and the post-softmax composition hands it to L3H0 and L3H1,
whose patterns carry it (L3H1's own softmax: 0.02), so a detector that reads patterns names two
heads and misses the one that did the work (the dashboard's Variants page draws who borrows from
whom: `make serve`, then `?page=variants&models=text-dcmha-l4mlp&layer=3`). Its circuit is the
zoo's most spread out (20 edges keep 0.38 of the gap, 150 keep 0.92) and leans on its Compose
edges (0.81 with the 18 in the top 100, 0.12 without). `text-infini-l4mlp` copies inside its
128-token segments (score 0.42 at 20 tokens back) but not through its memory (1.00x beyond a
segment; 12 of its 16 heads are local specialists).

**2 layers.** `text-mha-l2` has the textbook induction
circuit: a previous-token head in layer 0 (L0H0) feeding an induction head in layer 1 (L1H3,
induction score 0.37 on the zoo's probe), which `attnlens circuit text-mha-l2 --task induction`
recovers automatically. The head formed in a phase change at 14-25M tokens, trained on
256-token contexts before 512 (the first recipe, 512 from the start, formed none in the same
budget). It copies repeated random ids only partly (second copy 0.68x the first copy's loss; the
zoo's bar is 0.5x), which its card and [the models' table](#the-models) report. `text-infini-l2`
has the same circuit (L0H3 -> L1H3) inside its 128-token segments, but does not copy from an
earlier segment through its compressive memory, so it fails the zoo's 150-token probe
([Induction by copy distance](#induction-by-copy-distance)). `text-cope-l2` spreads the circuit
over two previous-token heads and two induction heads (all four K-composition edges found
automatically, [circuit_discovery.md](circuit_discovery.md)), copies best of the three
(0.65x; the bar is still missed), and several of its heads' CoPE gates open mostly on newlines:
they count lines. `text-dcmha-l2` formed no induction head in the same budget (score 0.001;
its validation loss, 3.13, is the highest of the five), nor did `text-dcmha-l2-mix`, trained
with a quarter of its contexts repeating a span (copy ratio 0.99); both have the zoo's flattest
q.k scores and attend through Compose
([Where attention gets its sharpness](#where-attention-gets-its-sharpness)).
`text-dcmha-l2-pkgs`, the same recipe on ten times the text (the standard library followed by
the installed packages' sources, none of it read twice), did form one (score 0.42, copy 0.82x):
previous-token head L0H1 -> induction head L1H0, with a Compose edge handing L1H0's map to L1H1,
which the search finds too; its MHA twin `text-mha-l2-pkgs` (score 0.38, copy 0.72x) has the
same two-head circuit without it. `text-mta-l2` has the lowest validation
loss (2.62) and copies best (0.26x: it meets the bar), with an induction head in *layer 0*:
the previous-token shift is in its key-query kernel, which matches the query against the key
before each key (switch that one kernel off with `attnlens.interp.variants.mta.plain_kernel` and the
copying is gone, 0.96x), and its post-softmax head mixing hands that head's map to three other
heads ([circuit_discovery.md](circuit_discovery.md)). That shift needs no second layer:
the 1-layer `text-mta-l1` copies as well (0.25x, validation loss 2.69 against 3.40 for
`text-mha-l1`), its best head L0H1 with a kernel holding 98% of its energy on the
previous-key diagonal, the one control in the zoo that forms an induction head."""


def named_models(text: str = FINDINGS) -> list[str]:
    """The text models the findings name (`text-mha-l2`, ...), sorted, without repeats."""
    return sorted(set(re.findall(r"`(text-[a-z0-9-]+)`", text)))


def findings(shipped: Iterable[str]) -> str:
    """FINDINGS when every model it names is shipped, else "" (the prose is about the real zoo)."""
    shipped = set(shipped)
    return FINDINGS if all(name in shipped for name in named_models()) else ""


__all__ = ["FINDINGS", "INTRO", "findings", "named_models"]
