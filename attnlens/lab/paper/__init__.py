"""The paper-task zoo: each variant's paper phenomenon reproduced on its own task (issue 15).

One module per phenomenon (`cope`, `mta`, `infini`, `dcmha`) declares `RECIPES` (frozen
`Recipe`s, see `_registry`), `train(recipe, out_dir, resume=True)` and
`evaluate(model, recipe) -> dict[str, float]`; `_training.train_recipe` does the shared part
(resumable run under ~/.cache/attnlens/paper-zoo/, save_pretrained, the card of kind "paper-task").
The models ship in `hooked_models/zoo/<recipe name>/`; `report.py` writes docs/reproduction.md.

    python -m attnlens.lab.paper list
    python -m attnlens.lab.paper train cope-flipflop-cope-s0 --resume
    python -m attnlens.lab.paper eval cope-flipflop-cope-s0 --write
    python -m attnlens.lab.paper report
"""
