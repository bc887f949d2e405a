"""Write the .ipynb notebooks from the cell lists below (keeps them reviewable as code).

    python notebooks/build_notebooks.py
"""

from pathlib import Path

import nbformat

HERE = Path(__file__).parent

QUICKSTART = [
    ("md", "# attnlens quickstart\n\nBuild a hooked model, look at its stage catalogue, cache "
           "activations and run TransformerLens's own tools on it."),
    ("code", "import torch\n"
             "from hooked_models import VariantConfig, HookedVariantTransformer, "
             "available_variants\n"
             "available_variants()"),
    ("code", "cfg = VariantConfig(d_model=64, d_head=16, n_layers=2, n_ctx=64, d_vocab=30,\n"
             "                    tokenizer_alphabet='abcdefghijklmnopqrstuvwxyz .', seed=0)\n"
             "model = HookedVariantTransformer(cfg)\n"
             "[(s.name, s.softmax, s.row_stochastic) for s in model.stages(0)]"),
    ("code", "logits, cache = model.run_with_cache('the cat sat. the cat sat.')\n"
             "pattern = cache['pattern', 1]\n"
             "z, v = cache['z', 1], cache['v', 1]\n"
             "# The effective-pattern identity: z = pattern @ v\n"
             "assert torch.allclose(torch.einsum('bhqk,bkhd->bqhd', pattern, v), z, atol=1e-6)\n"
             "pattern.shape"),
    ("code", "from transformer_lens.head_detector import detect_head\n"
             "detect_head(model, 'the cat sat. the cat sat.', 'previous_token_head')"),
    ("code", "parts, labels = cache.decompose_resid(return_labels=True)\n"
             "assert torch.allclose(parts.sum(0), cache['resid_post', -1], atol=1e-5)\n"
             "labels"),
    ("code", "model.QK, model.OV  # FactoredMatrix [n_layers, n_heads, d_model, d_model]"),
    ("md", "## Every variant has the same interface\n\nThe catalogue tells what each variant "
           "exposes; `hook_pattern` is always the matrix that multiplies the values."),
    ("code", "for name in available_variants():\n"
             "    m = HookedVariantTransformer(VariantConfig(d_model=32, d_head=8, n_layers=1,\n"
             "        n_ctx=32, d_vocab=30, attention=name, seed=0,\n"
             "        positional_embedding_type='none' if name == 'cope' else 'rotary'))\n"
             "    print(f'{name:7s}', [s.name for s in m.stages(0) if s.is_map])"),
]

TOUR = [
    ("md", "# A tour of the bundled models\n\nEach variant was trained on the same task (the "
           "second copy of `[BOS] r r`, random letters). Same task, different mechanisms: this "
           "notebook finds them with the same analyses, reading each variant's stage catalogue."),
    ("code", "import pandas as pd\n"
             "from hooked_models import zoo\n"
             "from interp import heads, infini, plots\n"
             "models = {name: zoo.load(name) for name in zoo.available()}\n"
             "pd.DataFrame({name: m.card['metrics'] for name, m in models.items()}).T"),
    ("md", "## MHA: the textbook two-layer circuit\n\nA previous-token head in layer 0 feeds "
           "induction heads in layer 1; knocking it out removes induction."),
    ("code", "mha = models['induction-mha']\n"
             "table = heads.induction_table(mha, half_len=15)\n"
             "table[['previous_token', 'induction_stripe']]"),
    ("code", "prev = int(table[table.layer == 0]['previous_token'].idxmax()[-1])\n"
             "heads.induction_ablation(mha, [(0, prev)], half_len=15)"),
    ("md", "## MTA: induction in one layer\n\nThe key-query convolution lets a layer-0 head "
           "match the *previous* key against the query, so layer 0 already attends along the "
           "induction stripe. Its softmax output (before the post-softmax convolution and head "
           "mixing) is scored like any pattern."),
    ("code", "mta = models['induction-mta']\n"
             "heads.induction_table(mta, half_len=15, stage='softmax')"
             "[['layer', 'induction_stripe']]"),
    ("md", "## DCMHA: heads that borrow attention\n\nZeroing a head's output is not enough when "
           "other heads read its attention weights through the post-softmax Compose; ablating its "
           "weights before the Compose (stage `probs`) is."),
    ("code", "dc = models['induction-dcmha']\n"
             "t = heads.induction_table(dc, half_len=15, stage='probs')\n"
             "prev = int(t[t.layer == 0]['previous_token'].idxmax()[-1])\n"
             "by_z = heads.induction_ablation(dc, [(0, prev)], half_len=15)\n"
             "by_probs = heads.induction_ablation(dc, [(0, prev)], half_len=15,\n"
             "                                    hook='probs', stage='probs')\n"
             "cols = ['before', 'after', 'delta']\n"
             "pd.concat({'zero z (scored on pattern)': by_z[cols],\n"
             "           'zero probs (scored on probs)': by_probs[cols]}, axis=1)"),
    ("md", "Knocking out the output leaves the layer-1 induction stripe intact (the composed "
           "`pattern` rows need not sum to 1, hence values above 1); knocking out the weights "
           "before the Compose removes it."),
    ("md", "## Infini-attention: memory specialists\n\nWith 16-token segments most of the "
           "second copy lies in later segments, so the layer-1 heads learn to read the compressive "
           "memory (gate near 1)."),
    ("code", "inf = models['induction-infini']\n"
             "from hooked_models.zoo.recipes import default_text\n"
             "spec = infini.memory_specialisation(inf, inf.to_tokens(default_text()))\n"
             "plots.memory_figure(spec)"),
    ("code", "spec[['gate', 'class', 'memory_ratio']]"),
]


def build(cells, path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "md"
                else nbformat.v4.new_code_cell(src) for kind, src in cells]
    nbformat.write(nb, str(path))


if __name__ == "__main__":
    build(QUICKSTART, HERE / "quickstart.ipynb")
    build(TOUR, HERE / "tour_of_the_zoo.ipynb")
