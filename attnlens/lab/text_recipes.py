"""The text-language-model zoo: 5 variants x 3 shapes at one shared budget, trained on the CPU.

Shapes (every variant, d_model 128, 4 heads of 32, n_ctx 512, BPE vocabulary 4096):
    l1     1 layer, attention only      (the induction control: one layer cannot compose)
    l2     2 layers, attention only     (the smallest model that can form induction heads)
    l4mlp  4 layers with MLPs (d_mlp 512)

Sized for two CPU cores (issue 26): one thread per model, two models at a time. Budget (same
for every model of a shape): ZOO_TRAIN below, 5,000 steps x 16 x 512 = 41M tokens, about 4.5
epochs of the standard library's ~9M training tokens, through torch.compile (1.4-2.3x on this
CPU, docs/benchmarks.md). The schedule is the one that formed
induction heads in the calibration (docs/zoo.md): lr 3e-3 held constant after a 100-step warmup,
AdamW (0.9, 0.95), weight decay 0.1; a cosine from 1e-3 had not formed them by 19.5M tokens.

Variant options are the official defaults except where a small model needs placement: CoPE
brings its own positions (no rotary); Infini uses 128-token segments (4 per context, so the
memory is read at every depth of the context) with the delta rule, its gates at their own lr.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from attnlens.hooked_models.config import VariantConfig
from attnlens.training.trainer import TrainConfig

VOCAB_SIZE = 4096
ARCH = dict(d_model=128, d_head=32, n_heads=4, n_ctx=512)
SHAPES: dict[str, dict] = {
    "l1": dict(n_layers=1, attn_only=True),
    "l2": dict(n_layers=2, attn_only=True),
    "l4mlp": dict(n_layers=4, attn_only=False, d_mlp=512),
}
VARIANT_OPTIONS: dict[str, dict] = {
    "mha": dict(positional_embedding_type="rotary"),
    "mta": dict(positional_embedding_type="rotary"),
    "cope": dict(positional_embedding_type="none"),
    "dcmha": dict(positional_embedding_type="rotary"),
    "infini": dict(positional_embedding_type="rotary",
                   attn_cfg={"segment_len": 128, "update": "delta"}),
}
ZOO_TRAIN = dict(steps=5000, batch_size=16, lr=3e-3, min_lr_ratio=1.0, warmup=100,
                 weight_decay=0.1, betas=(0.9, 0.95), gate_lr=1e-2, grad_clip=1.0,
                 eval_every=250, checkpoint_every=250, checkpoint_minutes=4.0, compile=True)
# A pipeline check that runs in seconds on a CPU (`--smoke`): never a zoo model.
SMOKE = dict(arch=dict(d_model=32, d_head=16, n_heads=2, n_ctx=64, d_mlp=64),
             train=dict(steps=4, batch_size=4, warmup=1, eval_every=2, checkpoint_every=2,
                        compile=False),
             vocab_size=512, max_files=40, val_fraction=0.25, ctx_schedule=((2, 32),),
             attn_cfg={"infini": {"segment_len": 16}})


# Issue 26's allowed data mix: a quarter of the contexts carry a repeated span, which brought
# the phase change about twice as early in the calibration. Only the "-mix" recipes use it (their
# cards say so); the zoo's default recipes train on natural text.
REPEAT_MIX = {"repeat_fraction": 0.25, "span": (20, 100)}
CORPORA = ("stdlib", "stdlib+packages")
PACKAGE_PINS_FILE = Path(__file__).with_name("package_pins.json")


def package_pins() -> dict[str, str]:
    """`{distribution: version}` whose sources the "stdlib+packages" recipes train on."""
    return json.loads(PACKAGE_PINS_FILE.read_text())["pins"]


@dataclass(frozen=True)
class Recipe:
    name: str
    variant: str
    shape: str
    data_mix: dict | None = None
    arch_overrides: dict | None = None   # calibration recipes: ARCH entries changed
    train_overrides: dict | None = None  # calibration recipes: ZOO_TRAIN entries changed
    # std of the token embedding W_E at init (None: the model's initializer_range, 0.02)
    embed_std: float | None = None
    seed: int | None = None              # the run's seed (None: the command's --seed, 0)
    # training text: "stdlib" (the standard library's training files) or "stdlib+packages"
    # (those, then the pinned distributions' sources of package_pins.json); validation is the
    # standard library's held-out files either way
    corpus: str = "stdlib"

    def __post_init__(self) -> None:
        if self.corpus not in CORPORA:
            raise ValueError(f"recipe {self.name}: corpus {self.corpus!r}; choose from {CORPORA}")

    def config(self, d_vocab: int, seed: int = 0, arch: dict | None = None,
               attn_cfg: dict | None = None) -> VariantConfig:
        """The model's config; `arch`/`attn_cfg` override sizes (smoke runs, tests)."""
        shape = dict(SHAPES[self.shape])
        sizes = {**ARCH, **(self.arch_overrides or {}), **(arch or {})}
        if shape["attn_only"]:
            sizes.pop("d_mlp", None)
        else:
            shape["d_mlp"] = sizes.pop("d_mlp", shape["d_mlp"])
        options = dict(VARIANT_OPTIONS[self.variant])
        merged_attn = {**options.pop("attn_cfg", {}), **(attn_cfg or {})} or None
        return VariantConfig(**sizes, **shape, d_vocab=d_vocab, attention=self.variant,
                             attn_cfg=merged_attn, act_fn="gelu", normalization_type="LN",
                             seed=seed, metadata={"task": "text-lm", "recipe": self.name},
                             **options)


# The context-length curriculum every zoo model trains with (natural text throughout): 16
# windows of 256 tokens per step for the first 6,250 steps, then 8 of 512, 10,000 steps of 4,096
# tokens = ZOO_TRAIN's 41M tokens. In the calibration (docs/zoo.md) the 2-layer MHA formed
# induction heads at n_ctx 256 by step 6,000 and none at n_ctx 512 in 5,000 steps of 8,192
# tokens. With rotary (or CoPE's contextual) positions the model is the same at both lengths.
# The lr is constant at 3e-3 (where the heads formed) and decays linearly to 0 over the last
# 2,000 steps (a warmup-stable-decay schedule).
# text-mha-l2's first 6,250 steps are text-mha-l2-ctx256's (attnlens.lab.run_fork).
CTX_CURRICULUM = {"ctx_schedule": ((6250, 256),)}
CURRICULUM_TRAIN = {"steps": 10_000, "batch_size": 8, "cooldown": 2000}
RECIPES: dict[str, Recipe] = {
    f"text-{v}-{s}": Recipe(f"text-{v}-{s}", v, s, CTX_CURRICULUM,
                            train_overrides=CURRICULUM_TRAIN)
    for s in SHAPES for v in VARIANT_OPTIONS}
# Twins of the 2-layer recipes on the data mix, trained only when named (`--only`), for a
# variant that does not form induction heads on natural text within its share of the budget.
MIX_RECIPES: dict[str, Recipe] = {
    f"text-{v}-l2-mix": Recipe(f"text-{v}-l2-mix", v, "l2", {**REPEAT_MIX, **CTX_CURRICULUM},
                               train_overrides=CURRICULUM_TRAIN)
    for v in VARIANT_OPTIONS}


# Calibration runs (issue 26 item 2), never zoo models: the 2-layer MHA on natural text with one
# thing changed, at the zoo's 41M tokens. "ctx256" is the plain-PyTorch set-up (n_ctx
# 256, batch 16: 4,096 tokens per step, so 10,000 steps), which formed induction heads at
# 20-31M tokens where the zoo's n_ctx 512 run had not by 41M; "b8" keeps n_ctx 512 and halves
# the batch, so it takes as many steps as "ctx256" with the zoo's context.
CALIBRATION_RECIPES: dict[str, Recipe] = {
    "text-mha-l2-ctx256": Recipe("text-mha-l2-ctx256", "mha", "l2",
                                 arch_overrides={"n_ctx": 256},
                                 train_overrides={"steps": 10_000}),
    "text-mha-l2-b8": Recipe("text-mha-l2-b8", "mha", "l2",
                             train_overrides={"steps": 10_000, "batch_size": 8}),
}


def _session_run(name: str, mix: dict, steps: int = 2500, **fields) -> Recipe:
    """A calibration run of the 2-layer MHA at batch 8 x 512 (4,096 tokens per step), sized to
    finish inside one session: the ignored out/ directory does not survive between sessions."""
    return Recipe(name, "mha", "l2", mix, train_overrides={"steps": steps, "batch_size": 8},
                  **fields)


TEXT_SPANS = {"repeat_fraction": 1.0, "span": (20, 100)}
RANDOM_SPANS = {"repeat_fraction": 0.5, "span": (100, 254), "span_tokens": "random"}
# Session calibration (2026-11-27): what brings induction within ~10M tokens? Repeated spans of
# the context's own text ("rep"), random-token spans pasted twice ("rand"), a toy-task warm-up
# ("toy": `[BOS] r r` batches first; "fixed" copies at one distance, "varied" at many), the
# token embedding at PyTorch's N(0, 1) ("e1"). docs/zoo.md has the trajectories.
SESSION_CALIBRATION: dict[str, Recipe] = {r.name: r for r in [
    _session_run("text-mha-l2-rep50", {"repeat_fraction": 0.5, "span": (20, 100)}),
    _session_run("text-mha-l2-rep100", TEXT_SPANS),
    _session_run("text-mha-l2-rep100-e1", TEXT_SPANS, embed_std=1.0),
    _session_run("text-mha-l2-rep100-long", {"repeat_fraction": 1.0, "span": (50, 250)}),
    _session_run("text-mha-l2-rand50", {**RANDOM_SPANS, "span": (20, 100)}),
    _session_run("text-mha-l2-rand50-long", RANDOM_SPANS),
    _session_run("text-mha-l2-toy500", {"toy_schedule": ((500, 512),), "toy_copy": "fixed",
                                        **RANDOM_SPANS}),
    _session_run("text-mha-l2-toy128", {"toy_schedule": ((600, 128),), "toy_copy": "fixed",
                                        **RANDOM_SPANS}),
    _session_run("text-mha-l2-toy3", {"toy_schedule": ((400, 128), (200, 256), (200, 512)),
                                      **RANDOM_SPANS}),
    _session_run("text-mha-l2-toyonly", {"toy_schedule": ((3000, 128),)}, steps=3000),
    # the bundled toy models' task (26 letters, contexts of 41) in the text model: a check that
    # the pipeline forms induction heads where the toy models did
    _session_run("text-mha-l2-toyonly-v27", {"toy_schedule": ((1000, 41),), "toy_vocab": 27},
                 steps=1000),
    _session_run("text-mha-l2-toyonly-v256", {"toy_schedule": ((3000, 128),), "toy_vocab": 256},
                 steps=3000),
]}
CALIBRATION_RECIPES.update(SESSION_CALIBRATION)


# Issue 26 item 2, corpus size and diversity: the standard library gives about 9M training
# tokens, so the zoo's 41M-token runs read it 4.5 times. These twins of the 2-layer recipes train
# on it followed by the sources of the project's installed distributions (package_pins.json;
# about 334 MB, ten times the standard library), so the same 41M tokens read no text twice. The
# same tokenizer and validation windows as the zoo's. Trained only when named (`--only`).
PACKAGE_RECIPES: dict[str, Recipe] = {
    f"text-{v}-l2-pkgs": Recipe(f"text-{v}-l2-pkgs", v, "l2", CTX_CURRICULUM,
                                train_overrides=CURRICULUM_TRAIN, corpus="stdlib+packages")
    for v in ("dcmha", "mha")}
CALIBRATION_RECIPES.update(PACKAGE_RECIPES)
# The 2-layer DCMHA at a third of the zoo's learning rate (1e-3 for the same warmup, hold and
# decay): its q.k scores are the zoo's flattest and it attends through Compose's dynamic
# weights (docs/zoo.md, sharpness), which may not settle at 3e-3. Trained only when named.
LR_RECIPES: dict[str, Recipe] = {
    "text-dcmha-l2-lr1e3": Recipe("text-dcmha-l2-lr1e3", "dcmha", "l2", CTX_CURRICULUM,
                                  train_overrides={**CURRICULUM_TRAIN, "lr": 1e-3})}
CALIBRATION_RECIPES.update(LR_RECIPES)


# Issue 24 item 3: DCMHA vs MHA on text at equal tokens, three seeds each. The zoo's 2-layer
# models are one seed at 41M tokens; these are the same recipes cut to 2,500 steps of 16 x 256
# tokens (10M tokens, the curriculum's first stage, lr 3e-3 decaying linearly to 0 over the
# last 500 steps), so the seed spread of the validation loss is measured, not assumed. Never
# zoo models: attnlens.reports.reproduction.dcmha_text evaluates them into a committed CSV.
COMPARISON_SEEDS = (0, 1, 2)
COMPARISON_TRAIN = {"steps": 2500, "batch_size": 8, "cooldown": 500}
COMPARISON_RECIPES: dict[str, Recipe] = {
    f"text-{v}-l2-short-s{seed}": Recipe(f"text-{v}-l2-short-s{seed}", v, "l2", CTX_CURRICULUM,
                                         train_overrides=COMPARISON_TRAIN, seed=seed)
    for v in ("mha", "dcmha") for seed in COMPARISON_SEEDS}


# Seed replicates of the zoo's headline contrast (the 2-layer MHA forms an induction head on
# natural text, the 2-layer DCMHA does not): the zoo's own recipes at the full 41M tokens with
# training seeds 1 and 2 (the shipped models are seed 0), so that contrast carries an interval.
# Never zoo models; trained only when named.
REPLICATE_SEEDS = (1, 2)
SEED_RECIPES: dict[str, Recipe] = {
    f"text-{v}-l2-s{seed}": Recipe(f"text-{v}-l2-s{seed}", v, "l2", CTX_CURRICULUM,
                                   train_overrides=CURRICULUM_TRAIN, seed=seed)
    for v in ("mha", "dcmha") for seed in REPLICATE_SEEDS}


_TABLES = (RECIPES, MIX_RECIPES, CALIBRATION_RECIPES, COMPARISON_RECIPES, SEED_RECIPES)


def all_recipe_names() -> list[str]:
    """Every recipe `attnlens train --zoo text --only` accepts."""
    return [n for table in _TABLES for n in sorted(table)]


def get_recipe(name: str) -> Recipe:
    for table in _TABLES:
        if name in table:
            return table[name]
    raise ValueError(f"unknown text recipe {name!r}; choose from {all_recipe_names()}")


def run_seed(name: str, seed: int = 0) -> int:
    """The seed recipe `name` trains with: its own where it has one, else `seed`."""
    own = get_recipe(name).seed
    return seed if own is None else own


def train_config(overrides: dict | None = None, seed: int = 0, progress: bool = True):
    return TrainConfig(**{**ZOO_TRAIN, **(overrides or {})}, seed=seed, progress=progress)


def flops_per_token(cfg: VariantConfig) -> float:
    """Training FLOPs per token: 6 x matmul parameters + 6 x L x n_ctx x d_model (QK and AV,
    Kaplan et al.'s count), ignoring variant extras (MTA's convolutions over the maps, CoPE's
    gates, DCMHA's composition) whose cost is memory traffic rather than FLOPs."""
    d, L = cfg.d_model, cfg.n_layers
    attn = 4 * d * cfg.n_heads * cfg.d_head
    mlp = 0 if cfg.attn_only else 2 * d * cfg.d_mlp
    unembed = d * cfg.d_vocab
    return 6 * (L * (attn + mlp) + unembed) + 6 * L * cfg.n_ctx * cfg.n_heads * cfg.d_head
