"""The report on issue 24's early-stopped recipes (dcmha-conjunction-full, infini-passkey-long,
cope-*-long): every seed of an early-stopped group is pooled whatever step it stopped at, the
runs are listed with their stops and time, the budget is stated in CPU-hours, and the readings'
verdicts follow the numbers. Synthetic cards only: no training, no model loading."""

from __future__ import annotations

import copy
import re
import statistics

import pytest

from attnlens.lab.paper import cope, dcmha, infini
from attnlens.reports.reproduction import cope as cope_report
from attnlens.reports.reproduction import dcmha as dcmha_report
from attnlens.reports.reproduction import infini as infini_report
from attnlens.reports.reproduction import page as report

STEPS = (1750, 3250, 20_000)        # seed 2 runs to the ceiling without stopping early
SECONDS = (3600.0, 5400.0, 9000.0)  # 5 hours in all


def _run(recipe: str, phenomenon: str, variant: str, seed: int, task_args: dict,
         metrics: dict) -> dict:
    """A card as `_training.train_recipe` + `write_metrics` write it for an early-stopped run."""
    return {"kind": "paper-task", "recipe": recipe, "phenomenon": phenomenon,
            "variant": variant, "seed": seed, "steps": STEPS[seed],
            "stopped_early": STEPS[seed] < 20_000,
            "train": {"steps": 20_000, "batch_size": 32, "early_stop_patience": 8,
                      "eval_every": 250},
            "train_seconds": SECONDS[seed], "device": "cpu (1 thread)",
            "task_args": task_args, "eval_seed": report.EVAL_SEED, "metrics": metrics}


# --- dcmha-conjunction-full --------------------------------------------------------------

def _dcmha_card(variant: str, seed: int, acc: float, cost: float = 0.2) -> dict:
    m = {"accuracy": acc, "n_params": 34850.0 if variant == "dcmha" else 34832.0}
    for h in range(4):
        m.update({f"attn_L1H{h}_target": 0.5, f"attn_L1H{h}_colour": 0.25,
                  f"attn_L1H{h}_shape": 0.25})
    if variant == "dcmha":
        m.update(acc_no_compose=acc - cost, acc_no_pre=acc - cost / 2, acc_no_post=acc - cost,
                 borrow_pre_offdiag_L1=0.5, borrow_pre_diag_L1=1.0)
    return _run(f"dcmha-conjunction-full-{variant}-s{seed}", "dcmha-conjunction-full", variant,
                seed, {"task": "conjunction", "early_stop": True}, m)


DC_ACC, MHA_ACC = (0.90, 0.94, 0.97), (0.30, 0.31, 0.32)


def _dcmha_cards(dc=DC_ACC, mha=MHA_ACC, cost=(0.2, 0.25, 0.3)) -> list[dict]:
    return ([_dcmha_card("dcmha", s, a, c) for s, (a, c) in enumerate(zip(dc, cost, strict=True))]
            + [_dcmha_card("mha", s, a) for s, a in enumerate(mha)])


def test_dcmha_full_pools_every_seed_whatever_its_steps():
    text = dcmha_report.report_section(_dcmha_cards())
    mean = statistics.mean(DC_ACC)
    assert f"DCMHA {mean:.3f}, 95% t-interval" in text
    assert "over 3 seeds (0.900 / 0.940 / 0.970)" in text            # the 20000-step seed too
    assert "over 3 seeds (0.300 / 0.310 / 0.320)" in text
    assert "trained to early stopping (steps taken 1750-20000 of a 20000-step ceiling; 4 of 6 " \
           "runs stopped early, 2 hit the ceiling)" in text
    assert "| dcmha-conjunction-full-mha-s2 | 2 | 20000 | no: hit the 20000-step ceiling | " \
           "150 | - | cpu (1 thread) |" in text
    assert "| dcmha-conjunction-full-dcmha-s0 | 0 | 1750 | stopped early (patience 8) | 60 |" \
        in text
    assert "Budget spent: 10.0 CPU-hours of training (the sum of the 6 runs' wall times" in text
    assert "Reference: 1/3" in text                                   # the task's ceiling


def test_dcmha_full_reading_follows_the_numbers():
    win = dcmha_report.reading("dcmha-conjunction-full", _dcmha_cards())
    assert "DCMHA is better here" in win and "Welch 95% interval" in win
    assert ("3 model(s) pass the 1/3 ceiling of additive matching (by more than 0.020, its 95% "
            "margin) (DCMHA 3 of 3 seeds, MHA 0 of 3), also where no value is the only one of "
            "its kind, so they combine both attributes.") in win
    assert "the paper's DCMHA advantage reproduces here" in win
    assert "DCMHA does lean on Compose: zeroing its dynamic weights costs 25.0, 95% " \
           "t-interval" in win
    lose = dcmha_report.reading("dcmha-conjunction-full",
                         _dcmha_cards(dc=(0.28, 0.29, 0.30), mha=(0.31, 0.32, 0.30),
                                      cost=(0.01, -0.01, 0.0)))
    assert "No model passes the 1/3 ceiling" in lose and "reproduces here" not in lose
    assert "reliance on Compose is not shown" in lose and "does lean" not in lose
    mha_wins = dcmha_report.reading("dcmha-conjunction-full", _dcmha_cards(dc=MHA_ACC, mha=DC_ACC))
    assert "MHA is ahead at 95%: the paper's DCMHA advantage is not reproduced" in mha_wins


def test_dcmha_reading_catches_the_unique_value_shortcut():
    """Models past the 1/3 ceiling that fall on twin prompts (the target's value written twice)
    point at the target by its value's uniqueness: no conjunction, no reproduction claimed."""
    cards = _dcmha_cards()
    for c, twin in zip(cards, (0.10, 0.12, 0.15, 0.30, 0.31, 0.30), strict=True):
        c["metrics"]["acc_twin"] = twin
    text = dcmha_report.reading("dcmha-conjunction-full", cards)
    assert ("3 model(s) pass the 1/3 ceiling of additive matching (by more than 0.020, its 95% "
            "margin) (DCMHA 3 of 3 seeds, MHA 0 of 3); 0 of them also where no value is the "
            "only one of its kind (twin prompts), so none combines both attributes.") in text
    assert "Not every DCMHA seed combines both attributes" in text
    assert "reproduces here" not in text
    assert "DCMHA lose" in text and "by its value being written once" in text
    section = dcmha_report.report_section(cards)
    assert "| dcmha | 0 | 1750 | 34850 | 0.900 | 0.100 | 0.700 |" in section
    # trained on twin lookups: past the ceiling means the conjunction
    for c in cards:
        del c["metrics"]["acc_twin"]
        c["task_args"] = {**c["task_args"], "twin_target": True}
    twin = "dcmha-conjunction-twin"
    assert "so they combine both attributes" in dcmha_report.reading(twin, cards)
    # 0.34 on 2048 questions is within the ceiling's 95% margin: not past it
    for c in cards:
        c["metrics"]["accuracy"] = 0.345
    assert "No model passes the 1/3 ceiling" in dcmha_report.reading(twin, cards)
    # asked plain lookups, twin-trained models that answer "a value written twice" fall below 1/3
    for c, plain in zip(cards, (0.0, 0.01, 0.0, 0.12, 0.09, 0.11), strict=True):
        c["metrics"]["acc_plain"] = plain
    text = dcmha_report.reading("dcmha-conjunction-twin", cards)
    assert "these models trained on twin lookups score DCMHA 0.003, 95% t-interval" in text
    assert "DCMHA and MHA stay below 1/3 at 95%: they answer a value written twice" in text
    assert "| 0.120 |" in dcmha_report.report_section(cards)          # the plain-prompts column
    for c in cards:
        c["metrics"]["acc_plain"] = 0.6 + 0.01 * c["seed"]
    assert "below 1/3" not in dcmha_report.reading("dcmha-conjunction-twin", cards)


def test_dcmha_fixed_steps_are_budgets_of_their_own():
    """Fixed-step cards: the 3000-step pair is its own budget, not pooled with 1000 steps."""
    cards = [{**_dcmha_card(v, s, a), "steps": 1000, "train": {"steps": 1000, "batch_size": 32},
              "phenomenon": "dcmha-conjunction"}
             for v, accs in (("dcmha", DC_ACC), ("mha", MHA_ACC)) for s, a in enumerate(accs)]
    for c in cards:
        del c["stopped_early"]
    cards += [{**c, "seed": 0, "steps": 3000, "metrics": {**c["metrics"], "accuracy": 0.5}}
              for c in (cards[0], cards[3])]
    text = dcmha_report.report_section(cards)
    assert f"at 1000 steps, DCMHA {statistics.mean(DC_ACC):.3f}" in text
    assert "Runs" not in text and "CPU-hours" not in text
    reading = dcmha_report.reading("dcmha-conjunction", cards)
    assert "At 3000 steps: DCMHA 0.500 (1 seed, no interval)" in reading


# --- infini-passkey-long ------------------------------------------------------------------

def _infini_card(seed: int, far_exact: float, ko_exact: float = 0.05) -> dict:
    m = {}
    for f in infini.FACTORS:
        exact = 1.0 - 0.01 * seed if f == 1 else far_exact
        for d in infini.DEPTHS:
            m[f"acc_x{f}_d{d:.2f}"] = min(1.0, exact + 0.05)
            m[f"exact_x{f}_d{d:.2f}"] = exact
        m[f"acc_x{f}"], m[f"exact_x{f}"] = min(1.0, exact + 0.05), exact
    for f in infini.FACTORS:
        for d in infini.DEPTHS:
            m[f"ko_acc_x{f}_d{d:.2f}"], m[f"ko_exact_x{f}_d{d:.2f}"] = 0.2, ko_exact + 0.01 * seed
        m[f"ko_acc_x{f}"], m[f"ko_exact_x{f}"] = 0.2, ko_exact + 0.01 * seed
    for label in ("L0H0", "L0H1", "L1H0", "L1H1"):
        m[f"gate_{label}"], m[f"memory_ratio_{label}"] = 0.5 + 0.1 * seed, 0.4
    m.update(heads_memory=float(seed), heads_local=0.0, heads_mixer=4.0 - seed,
             heads_intermediate=0.0)
    return _run(f"infini-passkey-long-s{seed}", "infini-passkey-long", "infini", seed,
                {"lengths": [160, 320, 640], "answer_weight": 5.0, "early_stop": True}, m)


def _infini_cards(far=(0.95, 0.97, 0.99), ko=0.05) -> list[dict]:
    return [_infini_card(s, f, ko) for s, f in enumerate(far)]


def test_infini_long_pools_seeds_and_states_the_criterion():
    text = infini_report.report_section(_infini_cards())
    assert "| 16x (10240) |" in text and "| 1x (640), memory read zeroed |" in text
    # exact key 0.95 / 0.97 / 0.99: mean 0.97, half-width t(2) 4.303 x 0.02 / sqrt(3) = 0.050
    assert "| 16x (10240) | 1.00 [1.00, 1.00] (n=3) | 0.97 [0.92, 1.00] (n=3) | " \
           "0.97 [0.92, 1.00] (n=3) |" in text
    assert "whole-key accuracy at 16x (10240 tokens) with the key outside the last segment " \
           "(depths 0/0.25/0.5/0.75) is 0.97, 95% t-interval 0.92 to 1.00 over 3 seeds " \
           "(0.95 / 0.97 / 0.99)" in text
    assert "**reproduced**" in text                 # the interval's low end 0.92 >= 0.9
    assert "| infini-passkey-long-s2 | 2 | 20000 | no: hit the 20000-step ceiling |" in text
    assert "Budget spent: 5.0 CPU-hours" in text
    assert "seed 0: gate / memory share | seed 1: gate / memory share |" in text
    assert "| classes (memory / local / mixer / intermediate) | 0 / 0 / 4 / 0 | 1 / 0 / 3 / 0 |" \
        in text


def test_infini_long_reading_verdict_flips_with_the_numbers():
    good = infini_report.reading("infini-passkey-long", _infini_cards(far=(0.96, 0.97, 0.98)))
    assert good.startswith("Reproduced (3 seeds, trained to early stopping)")
    assert "At 16x, exact key outside the last segment is above the knock-out baseline" in good
    # 0.96 / 0.97 / 0.98: half-width 4.303 x 0.01 / sqrt(3) = 0.025
    assert "16x (10240) 1.00 [1.00, 1.00] / 0.97 [0.95, 0.99], outside 0.97 [0.95, 0.99]" in good
    assert "Fig. 3's memory/local split appears in 2 of 3 seeds" in good
    bad = infini_report.reading("infini-passkey-long", _infini_cards(far=(0.05, 0.07, 0.06)))
    assert bad.startswith("Not reproduced (3 seeds")
    assert "At 16x, exact key outside the last segment is not separated from the knock-out" in bad
    unsure = infini_report.reading("infini-passkey-long", _infini_cards(far=(0.5, 0.9, 1.0)))
    assert unsure.startswith("Not established (3 seeds")


def test_infini_long_reading_compares_each_length_with_its_own_knockout():
    good = infini_report.reading("infini-passkey-long", _infini_cards(far=(0.96, 0.97, 0.98)))
    assert "up to 16x the training length (10240 tokens), not beyond" in good
    assert ("Baseline, memory read zeroed (same prompts; token / exact key outside the last "
            "segment) (mean [95% t-interval]): 1x 0.20 [0.20, 0.20] (n=3) / 0.06 [0.04, 0.08] "
            "(n=3); 2x") in good
    bad = infini_report.reading("infini-passkey-long", _infini_cards(far=(0.05, 0.07, 0.06)))
    assert "up to 1x the training length (640 tokens), not beyond" in bad
    # a knock-out as good as the memory: no reach at all
    flat = infini_report.reading("infini-passkey-long",
                                 _infini_cards(far=(0.05, 0.07, 0.06), ko=0.99))
    assert "At no length does the key outside the last segment come back whole" in flat
    # cards evaluated when only 1x had a knock-out: 16x is read against the 1x baseline
    old = _infini_cards(far=(0.05, 0.07, 0.06))
    for card in old:
        card["metrics"] = {k: v for k, v in card["metrics"].items() if not k.startswith("ko_")
                           or re.match(r"ko_(acc|exact)_x1(_|$)", k)}
    text = infini_report.reading("infini-passkey-long", old)
    assert "not separated from the 1x knock-out baseline" in text and "2x 0.20" not in text
    assert "| 2x (1280), memory read zeroed |" not in infini_report.report_section(old)


# --- cope-*-long --------------------------------------------------------------------------

def _cope_cards(task: str, cope_err: float, other_err: float, n_vars=(None,)) -> list[dict]:
    cards = []
    for n in n_vars:
        tag = f"counting-{n}var" if n else task
        args = {"task": task, "early_stop": True} | ({"n_vars": n} if n else {})
        for seed in range(3):
            for v in cope.POSITIONS:
                base = cope_err if v == "cope" else other_err
                m = {f"error_{s}": round(base + 0.01 * seed + 0.002 * i, 4)
                     for i, s in enumerate(cope.SPLITS[task])}
                cards.append(_run(f"cope-{tag}-{v}-long-s{seed}", f"cope-{task}-long", v, seed,
                                  args, m))
    return cards


@pytest.fixture
def no_drawing(monkeypatch):
    monkeypatch.setitem(report._DRAW, "enabled", False)


def test_cope_long_table_pools_seeds(tmp_path, no_drawing):
    cards = _cope_cards("flipflop", 0.01, 0.2)
    text = cope_report.report_section(cards, tmp_path)
    errs = [c["metrics"]["error_id"] for c in cards if c["variant"] == "cope"]
    assert errs == [0.01, 0.02, 0.03]
    lo, hi = report.t_interval(errs)[1:]
    assert (f"| - | CoPE | 0, 1, 2 | 1750 / 3250 / 20000 (early stopping) | "
            f"{report.pct(statistics.mean(errs))} [{report.pct(max(lo, 0))}, {report.pct(hi)}] "
            f"(n=3) |") in text
    assert "| cope-flipflop-nope-long-s2 | 2 | 20000 | no: hit the 20000-step ceiling |" in text
    assert "Budget spent: 20.0 CPU-hours of training (the sum of the 12 runs' wall times" in text


def test_cope_long_reading_states_the_comparison_only_where_intervals_separate():
    win = cope_report.reading("cope-flipflop-long", _cope_cards("flipflop", 0.0, 0.2))
    assert "on 4 of 4 splits" in win and "reproduces on every split" in win
    assert win.count("CoPE is below every other scheme (95% t-intervals apart).") == 4
    assert "In distribution CoPE stays below 1.0% on every seed" not in win   # 0.0-0.026
    assert ("Our models have 4 layers of d_model 128 (the paper's are 4 layers of d_model 256: "
            "ours is the nearest shape that the CPU calibration allows") in win
    tie = cope_report.reading("cope-flipflop-long", _cope_cards("flipflop", 0.2, 0.2))
    assert "on no split" in tie and "The paper's CoPE advantage is not established here." in tie
    assert "not separated from RoPE, learned absolute, NoPE" in tie
    lose = cope_report.reading("cope-counting-long",
                        _cope_cards("counting", 0.3, 0.05, n_vars=(3, 5)))
    assert "**3 variables**" in lose and "**5 variables**" in lose
    assert lose.count("above RoPE, learned absolute, NoPE") == 2 * len(cope.SPLITS["counting"])
    assert "reproduces" not in lose


def test_fixed_step_readings_are_unchanged():
    """The shipped fixed-step cards give the readings the committed page prints."""
    page = report.REPORT.read_text(encoding="utf-8")
    cards = report.shipped_cards()
    for mod, phenomenon in ((dcmha_report, "dcmha-conjunction"),
                            (dcmha_report, "dcmha-composition"),
                            (infini_report, "infini-passkey"), (cope_report, "cope-flipflop"),
                            (cope_report, "cope-counting"), (cope_report, "cope-selcopy")):
        mine = [c for c in cards.values() if c["phenomenon"] == phenomenon]
        if mine:
            assert f"**Our reading.** {mod.reading(phenomenon, copy.deepcopy(mine))}" in page


def test_page_with_full_cards_keeps_the_other_sections(monkeypatch):
    """Shipping the -full cards adds their section and leaves the fixed-step sections as the
    committed page prints them (built for the dcmha module only, which loads no model)."""
    shipped = {k: c for k, c in report.shipped_cards().items() if k.startswith("dcmha-")}
    full = {c["recipe"]: c for c in _dcmha_cards()}
    monkeypatch.setattr(report, "shipped_cards", lambda: {**shipped, **full})
    monkeypatch.setattr(report, "modules", lambda: {"dcmha": dcmha})
    page = report.build_report(draw=False)
    committed = report.REPORT.read_text(encoding="utf-8")

    def section(text, name):
        return text.split(f"\n## {name}\n")[1].split("\n## ")[0]

    for name in ("dcmha-conjunction", "dcmha-composition"):
        assert section(page, name) == section(committed, name)
    new = section(page, "dcmha-conjunction-full")
    assert "Not trained yet" not in new and "Budget spent: 10.0 CPU-hours" in new
    assert "**Our reading.** Trained to early stopping" in new


def test_partial_groups_claim_nothing_without_intervals(no_drawing):
    """Seeds land one by one: a side with one seed gets no verdict from an interval."""
    one = infini_report.reading("infini-passkey-long", _infini_cards()[:1])
    assert one.startswith("Not established (1 seed") and "(1 seed, no interval)" in one
    dc = dcmha_report.reading("dcmha-conjunction-full", _dcmha_cards()[:4])   # MHA: seed 0 only
    assert "One seed on a side: the paper's DCMHA advantage is not established." in dc
    cards = [c for c in _cope_cards("flipflop", 0.01, 0.2) if c["seed"] == 0 or c["variant"]
             != "nope"]
    text = cope_report.reading("cope-flipflop-long", cards)
    assert text.count("One seed of NoPE so far: no split can show") == 1
    assert "apart" not in text and "advantage is not established yet" in text


def test_budget_counts_cpu_time_when_every_card_has_it():
    cards = [{"train_seconds": 3600.0, "cpu_seconds": 2700.0, "device": "cpu (1 thread)"},
             {"train_seconds": 7200.0, "cpu_seconds": 6300.0, "device": "cpu (1 thread)"}]
    text = report.budget_spent(cards)
    assert text.startswith("Budget spent: 2.5 CPU-hours of training (the sum of the 2 runs' "
                           "process CPU times") and "3.0 hours of wall time" in text
    del cards[0]["cpu_seconds"]           # one legacy card: wall times for all
    assert "3.0 CPU-hours of training (the sum of the 2 runs' wall times" in \
        report.budget_spent(cards)


def test_runs_table_gives_wall_and_cpu_minutes():
    cards = [{"variant": "cope", "seed": 1, "steps": 8000, "stopped_early": True,
              "train": {"early_stop_patience": 8}, "train_seconds": 10158.4,
              "cpu_seconds": 1984.9, "device": "cpu (1 thread)"},
             {"variant": "rope", "seed": 0, "steps": 100, "train_seconds": 120.0,
              "device": "cpu (1 thread)"}]   # a card from before cpu_seconds was kept
    table = report.runs_table(cards).splitlines()
    assert table[0] == ("| model | seed | steps taken | stopped early | wall time (min) | "
                        "CPU time (min) | device |")
    assert table[2] == ("| cope | 1 | 8000 | stopped early (patience 8) | 169 | 33 | "
                        "cpu (1 thread) |")
    assert table[3] == "| rope | 0 | 100 | no | 2 | - | cpu (1 thread) |"
