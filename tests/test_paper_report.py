"""docs/reproduction.md is exactly as strong as the evidence (issue 20, items 13-20): the page is
rebuilt from the cards, its prose numbers follow the cards, every eval runs on a held-out seed,
and the new splits and probes are what their names say."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from tiers import documented

from attnlens.interp.tasks.counting import counting_batch
from attnlens.lab.paper import _training, cope, dcmha, infini, mta
from attnlens.lab.paper._registry import all_recipes, get_recipe, module_of, modules
from attnlens.lab.paper._training import EVAL_SEED, eval_seeds, train_recipe, training_seeds
from attnlens.reports.reproduction import cope as cope_report
from attnlens.reports.reproduction import page as report

CARDS = report.shipped_cards()


@documented("report")
def test_report_is_rebuilt_from_the_cards():
    """Item 20: the committed page equals the page the cards give now (text and tables)."""
    built = report.build_report(draw=False)
    assert built == report.REPORT.read_text(encoding="utf-8"), (
        "docs/reproduction.md is stale: run python -m attnlens.lab.paper report")


def test_no_hand_written_notes():
    """Item 20: readings are computed (`reading(phenomenon, cards)` of each module's report
    module), not typed-in NOTES; the report code lives only in the report modules."""
    for name, mod in modules().items():
        assert not hasattr(mod, "NOTES"), f"{name} still has hand-written NOTES"
        writer = report.report_module(mod)
        assert writer is not None and writer.__name__ == f"attnlens.reports.reproduction.{name}"
        assert callable(getattr(writer, "reading", None)), name
        assert callable(getattr(writer, "report_section", None)), name
        for attr in ("reading", "report_section", "extra_sections"):
            assert not hasattr(mod, attr), f"{name}.{attr}: report code belongs in attnlens.reports"


def test_report_module_is_none_where_there_is_none_and_a_broken_one_raises(monkeypatch):
    """A module without `<name>_report` gets the plain table; a report module whose own imports
    fail is an error, not a silent fall-back to the plain table."""
    import types

    bare = types.ModuleType("attnlens.lab.paper.no_such_variant")
    assert report.report_module(bare) is None

    def import_inside_fails(name):
        raise ModuleNotFoundError("No module named 'kaleido_missing'", name="kaleido_missing")

    monkeypatch.setattr(report.importlib, "import_module", import_inside_fails)
    with pytest.raises(ModuleNotFoundError, match="kaleido_missing"):
        report.report_module(modules()["mta"])


def _cope_report(monkeypatch, edit) -> str:
    cards = {k: copy.deepcopy(c) for k, c in CARDS.items() if k.startswith("cope-")}
    edit(cards)
    monkeypatch.setattr(report, "shipped_cards", lambda: cards)
    return report.build_report(draw=False)


def test_prose_numbers_follow_the_cards(monkeypatch):
    """Items 19/20: change a card, and the reading's number changes with the table's."""
    def edit(cards):
        cards["cope-counting-1var-cope-s0"]["metrics"]["error_len_64"] = 0.777
        cards["cope-flipflop-nope-s0"]["metrics"]["error_sparse_long_2x"] = 0.444
    text = _cope_report(monkeypatch, edit)
    reading = text.split("## cope-counting")[1].split("**Our reading.**")[1].split("##")[0]
    assert "(64 statements): CoPE 77.7," in reading
    flip = text.split("## cope-flipflop")[1].split("**Our reading.**")[1].split("##")[0]
    assert "NoPE 44.4" in flip and "NoPE ties CoPE" not in flip


@pytest.mark.parametrize("phenomenon", ["cope-selcopy", "cope-counting", "cope-flipflop"])
def test_reading_numbers_are_the_table_numbers(phenomenon):
    """Item 19: every one-decimal number of a reading is printed in its section's table."""
    text = report.REPORT.read_text(encoding="utf-8")
    section = text.split(f"## {phenomenon}\n")[1].split("\n## ")[0]
    table, reading = section.split("**Our reading.**")
    numbers = set(re.findall(r"\d+\.\d", reading)) - {f"{100 * cope_report.SOLVED:.1f}"}
    cells = set(re.findall(r"\d+\.\d", table))
    assert numbers and numbers <= cells, numbers - cells


def test_one_seed_claims_no_ordering():
    """Item 14: one training seed per scheme: the reading says so and ranks nothing."""
    cards = [c for c in CARDS.values() if c["phenomenon"] == "cope-counting"]
    text = cope_report.reading("cope-counting", cards)
    assert text.count("1 seed per scheme, no interval") == 3
    assert "no ordering of CoPE against" in text and "slightly better" not in text
    assert "With 5 variables the paper's CoPE advantage (its Table 3) is not established" in text


def test_describe_gives_seeds_and_interval():
    assert report.describe([0.074]) == "7.4 (1 seed, no interval)"
    text = report.describe([0.3, 0.33, 0.36])
    assert text.startswith("33.0, 95% t-interval 25.5 to 40.5 over 3 seeds (30.0 / 33.0 / 36.0)")
    d, lo, hi = report.welch_interval([1.0, 2.0, 3.0], [0.0, 1.0, 2.0])
    assert d == pytest.approx(1.0) and lo < 0 < hi


@pytest.mark.parametrize("name", sorted(CARDS))
def test_card_eval_seed_is_held_out(name):
    """Item 20: the card records the eval seed; training never used any seed it draws from."""
    card = CARDS[name]
    assert card.get("eval_seed") == EVAL_SEED, f"{name}: re-run eval --write"
    recipe = get_recipe(name)
    used = training_seeds(recipe)
    assert len(used) > card["steps"] // 2
    seeds = eval_seeds(card["eval_seed"])
    exact = getattr(module_of(recipe), "eval_data_seeds", None)
    if exact is None:        # no training seed anywhere in the band the evaluation draws from
        assert not [s for s in used if s in seeds]
    else:                    # the seeds the evaluation draws from, all inside the band
        drawn = exact(card["eval_seed"])
        assert drawn and all(s in seeds for s in drawn)
        assert not used & drawn, sorted(used & drawn)


def test_eval_seed_was_not_used_before():
    """The earlier rounds' eval seeds (the first notes were written from them) are retired."""
    assert EVAL_SEED not in (4321, 98765)
    for mod in (cope, mta, infini, dcmha):
        assert mod.EVAL_SEED == EVAL_SEED


@pytest.mark.parametrize("name, patch", [("cope-counting-1var-rope-s0", "task_batch"),
                                         ("infini-passkey-s0", "passkey_task")])
def test_training_seeds_are_the_seeds_training_draws(tmp_path, monkeypatch, name, patch):
    """`batch_seeds` replays exactly the data seeds a training run draws."""
    recipe = get_recipe(name)
    recipe = type(recipe)(**{**recipe.__dict__, "train": {**recipe.train, "steps": 3,
                                                          "batch_size": 2, "warmup": 1,
                                                          "checkpoint_every": 0},
                             "config": {**recipe.config, "d_model": 16, "d_head": 8,
                                        "n_heads": 2, "n_layers": 1, "d_mlp": 16}})
    mod = next(m for m in modules().values() if name in m.RECIPES)
    real, seen = getattr(mod, patch), []

    def spy(*args, **kwargs):
        seen.append(kwargs["seed"] if "seed" in kwargs else args[-1])
        return real(*args, **kwargs)

    monkeypatch.setattr(mod, patch, spy)
    monkeypatch.setattr(mod, "RECIPES", {**mod.RECIPES, name: recipe})
    train_recipe(recipe, tmp_path / "m", mod.sampler(recipe), run_root=tmp_path / "r")
    assert seen == mod.batch_seeds(recipe)
    assert training_seeds(recipe) == {recipe.seed, *seen}


def _statements(words: list[str]) -> int:
    return sum(w in (";", "pass;", "++;") for w in words)


def test_counting_2x_split_is_exactly_twice_the_training_length():
    """Item 13: `len_64` is exactly 2x the longest training program; the others say theirs."""
    splits = cope.SPLITS["counting"]
    low, high = cope.TRAIN_STATEMENTS
    assert splits["id"][0] == dict(min_steps=low, max_steps=high)
    assert splits["len_64"][0] == dict(min_steps=2 * high, max_steps=2 * high)
    assert splits["len_65_128"][0] == dict(min_steps=2 * high + 1, max_steps=4 * high)
    for split, lengths in (("len_64", {64}), ("len_33_64", set(range(33, 65))),
                           ("len_65_128", set(range(65, 129)))):
        batch = counting_batch(16, n_vars=3, seed=EVAL_SEED, **splits[split][0])
        counts = {_statements(t.split()[:-3]) for t in batch.texts}
        assert counts <= lengths and (split != "len_64" or counts == {64})
        assert batch.tokens.shape[1] <= cope.N_CTX
    for card in CARDS.values():
        if card["phenomenon"] == "cope-counting":
            assert {"error_len_64", "error_len_33_64", "error_len_65_128"} <= set(
                card["metrics"]), card["recipe"]


def test_flipflop_sparse_and_long_split():
    """Item 18: FFL(0.98) with 64 instructions is evaluated, and reported."""
    kwargs, label = cope.SPLITS["flipflop"]["sparse_long_2x"]
    assert kwargs == dict(n_instructions=2 * cope.TRAIN_INSTRUCTIONS, split="sparse")
    cards = [c for c in CARDS.values() if c["phenomenon"] == "cope-flipflop"]
    assert all("error_sparse_long_2x" in c["metrics"] for c in cards)
    text = report.REPORT.read_text(encoding="utf-8").split("## cope-flipflop")[1]
    assert f"{label} (%)" in text.split("## ")[0]


def test_mta_probes_and_longer_context():
    """Item 16: other block lengths and numbers of blocks are measured; lengthening the
    context leaves the model's outputs unchanged."""
    recipe = mta.RECIPES["mta-findblock-last-mta-s2"]
    probes = mta.ood_tasks(recipe)
    assert {t.block_length for t in probes.values()} == {3, *mta.BLOCK_LENGTHS}
    assert {t.n_blocks for t in probes.values()} == {8, *mta.N_BLOCKS}
    card = CARDS.get(recipe.name)
    if card is not None:
        assert set(probes) <= set(card["metrics"])
        from attnlens.hooked_models.zoo import load

        model = load(recipe.name)
        longer = mta.with_context(model, 2 * model.cfg.n_ctx)
        tokens = mta.task_of(recipe).batch(4, seed=1).tokens
        with torch.no_grad():
            torch.testing.assert_close(longer(tokens), model(tokens))
    section = report.REPORT.read_text(encoding="utf-8").split("## mta-findblock")[1]
    assert "blocks of 4 letters" in section and "12 blocks" in section
    if card is not None and card["metrics"]["error"] > 0:
        assert f"`{recipe.name}` errs on {report.pct(card['metrics']['error'])}%" in section


def test_infini_cards_have_exact_and_knockout():
    """Item 15: whole-key accuracy per cell and the memory knock-out baseline."""
    for card in (c for c in CARDS.values() if c["phenomenon"] == "infini-passkey"):
        m = card["metrics"]
        for f in infini.FACTORS:
            assert all(f"exact_x{f}_d{d:.2f}" in m for d in infini.DEPTHS)
        for f in infini.FACTORS:
            assert all(f"ko_exact_x{f}_d{d:.2f}" in m for d in infini.DEPTHS)
        assert m["ko_exact_x1"] < m["exact_x1"]


def test_all_recipes_have_replayable_seeds():
    for recipe in all_recipes().values():
        mod = next(m for m in modules().values() if recipe.name in m.RECIPES)
        assert callable(mod.batch_seeds)
    assert _training.EVAL_SPAN >= 10_000


def test_old_split_names_still_give_the_same_batches():
    """Notebook 04 asks for the earlier names; they are the same generator arguments."""
    for task, names in cope.OLD_SPLIT_NAMES.items():
        args = {"task": task, "n_vars": 1} if task == "counting" else {"task": task}
        for old, new in names.items():
            a, b = cope.task_batch(args, old, 4, 7), cope.task_batch(args, new, 4, 7)
            assert torch.equal(a.tokens, b.tokens)


def test_cope_figures_draw_each_settings_interval_over_its_seeds(monkeypatch, tmp_path):
    """The bar chart shows what the table says: the mean over seeds with its 95% t-interval
    (clipped to 0-100%), the seeds' values on hover; one seed: no bar to draw."""
    drawn = {}
    monkeypatch.setattr(report, "save_png", lambda fig, name, d: drawn.setdefault(name, fig)
                        and "")
    cards = [c for k, c in CARDS.items() if k.startswith("cope-flipflop-") and k.endswith(
        ("-long-s0", "-long-s1", "-long-s2"))]
    if len({c["seed"] for c in cards}) < 2:
        pytest.skip("the flip-flop -long models are not shipped with several seeds")
    cope_report.report_section(cards, tmp_path)
    fig = drawn["cope-flipflop-long"]
    assert "95% t-interval" in fig.layout.title.text
    split = list(cope.SPLITS["flipflop"])[2]          # FFL(0.8), 64 instructions (2x)
    bar = fig.data[2]
    assert list(bar.x) == ["cope", "rope", "absolute", "nope"]
    for i, scheme in enumerate(bar.x):
        values = [c["metrics"][f"error_{split}"] for c in cards if c["variant"] == scheme]
        m, lo, hi = report.t_interval(values)
        assert bar.y[i] == pytest.approx(100 * m)
        assert bar.y[i] + bar.error_y.array[i] == pytest.approx(100 * min(hi, 1.0))
        assert bar.y[i] - bar.error_y.arrayminus[i] == pytest.approx(100 * max(lo, 0.0))
    assert cope_report.error_bar([0.25]) == (25.0, 25.0, 25.0)
    m, lo, hi = cope_report.error_bar([0.0, 0.0, 0.3])
    assert m == pytest.approx(10.0) and lo == 0.0 and hi > m   # clipped at 0%


def test_a_one_seed_setting_beside_several_draws_no_error_bar(monkeypatch, tmp_path):
    """Where one setting has several seeds and another one, the one-seed bar has no error bar
    (None, not a zero-width cap that reads as a certain value) and its label says "1 seed"."""
    drawn = {}
    monkeypatch.setattr(report, "save_png", lambda fig, name, d: drawn.setdefault(name, fig)
                        and "")
    cards = [copy.deepcopy(c) for k, c in CARDS.items()
             if re.fullmatch(r"cope-flipflop-(cope|rope)-long-s[01]", k)]
    cards = [c for c in cards if not (c["variant"] == "rope" and c["seed"] == 1)]
    if len(cards) != 3:
        pytest.skip("the flip-flop -long models are not shipped")
    cope_report.report_section(cards, tmp_path)
    fig = drawn["cope-flipflop-long"]
    label = list(cope.SPLITS["flipflop"].values())[2][1]
    both, one = [t for t in fig.data if t.offsetgroup == label]
    assert list(fig.layout.xaxis.categoryarray) == ["cope", "rope (1 seed)"]
    assert list(both.x) == ["cope"] and both.error_y.array[0] > 0 and both.showlegend
    assert list(one.x) == ["rope (1 seed)"] and one.error_y.visible is False
    assert not one.showlegend and one.marker.color == both.marker.color
    rope = next(c for c in cards if c["variant"] == "rope")
    assert one.y[0] == pytest.approx(100 * rope["metrics"]["error_" + list(
        cope.SPLITS["flipflop"])[2]])


def test_each_section_states_its_training_time_once():
    """A section whose runs record CPU time states the budget once (`budget_spent`: CPU-hours
    and wall hours, summed over its cards); the others state their summed wall time."""
    text = report.REPORT.read_text(encoding="utf-8")
    long = text.split("## cope-counting-long\n")[1].split("\n## ")[0]
    mine = [c for k, c in CARDS.items() if k.startswith("cope-counting-") and "-long-" in k]
    assert long.count(report.budget_spent(mine)) == 1
    assert "min of training" not in long
    short = text.split("## cope-counting\n")[1].split("\n## ")[0]
    mine = [c for k, c in CARDS.items() if re.fullmatch(r"cope-counting-\dvar-[a-z]+-s\d", k)]
    wall = sum(c["train_seconds"] for c in mine) / 60
    assert f"{len(mine)} models, {wall:.0f} min of training (wall time) in all on " in short
    assert "Budget spent" not in short
    for title, section in sections(text).items():   # every section: one statement, no twins
        assert section.count("Budget spent:") + section.count("min of training") <= 1, title


def sections(text: str) -> dict[str, str]:
    """docs/reproduction.md's "## " sections by title."""
    return {part.split("\n", 1)[0]: part for part in text.split("\n## ")[1:]}


def test_loss_figure_has_a_panel_per_setting_a_colour_per_scheme_and_a_style_per_seed():
    """A dozen runs stay tellable apart: counting's settings get their own panel, each scheme
    one colour and one legend entry, each training seed one line style; each curve is its
    card's."""
    cards = [c for k, c in CARDS.items() if k.startswith("cope-counting-") and "-long-" in k]
    if len({c["seed"] for c in cards}) < 2:
        pytest.skip("the counting -long models are not shipped with several seeds")
    fig = cope_report.loss_figure(cards, "cope-counting-long")
    assert len(fig.data) == len(cards)
    settings = sorted({c["task_args"]["n_vars"] for c in cards})
    assert [a.text for a in fig.layout.annotations] == [f"{n} variables" for n in settings]
    by_recipe = {c["recipe"]: c for c in cards}
    colour = {}
    for trace in fig.data:
        card = by_recipe[trace.hovertext]
        assert list(trace.y) == [loss for _, loss in card["train_loss_curve"]]
        assert colour.setdefault(card["variant"], trace.line.color) == trace.line.color
        assert trace.line.dash == cope_report.SEED_DASH[card["seed"]]
        panel = settings.index(card["task_args"]["n_vars"]) + 1
        assert trace.xaxis == ("x" if panel == 1 else f"x{panel}")
    assert len(set(colour.values())) == len(colour)
    assert sorted(t.name for t in fig.data if t.showlegend) == sorted(
        cope_report.NAMES[v] for v in colour)
