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


def build(cells, path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nb.cells = [nbformat.v4.new_markdown_cell(src) if kind == "md"
                else nbformat.v4.new_code_cell(src) for kind, src in cells]
    nbformat.write(nb, str(path))


if __name__ == "__main__":
    build(QUICKSTART, HERE / "quickstart.ipynb")
