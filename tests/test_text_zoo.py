"""The text-LM zoo pipeline, end to end on the CPU with `--smoke` runs (seconds, never a zoo).

Cards are re-measured within tolerance: the smoke model's here; every shipped text model's in
`test_every_shipped_text_card_is_reproduced` (none is shipped until the GPU run lands).
"""

from __future__ import annotations

import json

import pytest
import torch
from tiers import documented_params

from attnlens.cli import main as cli_main
from attnlens.hooked_models import HookedVariantTransformer, zoo
from attnlens.interp.tools.text_eval import evaluate_windows, icl_positions, load_eval_tokens
from attnlens.lab.text_recipes import RECIPES, SHAPES, VARIANT_OPTIONS, ZOO_TRAIN, train_config
from attnlens.lab.text_train import prepare_data, release, shipped_recipes, train_recipe, train_zoo

NAMES = ["text-mha-l1", "text-infini-l2"]
TOL = 1e-3  # card values are rounded to 4 decimals; float32 on one CPU reproduces them exactly


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("zoo")
    argv = ["train", "--zoo", "text", "--smoke", "--only", *NAMES, "--out", str(out),
            "--device", "cpu", "--no-progress"]
    assert cli_main(argv) == 0
    return out, argv


def _one_recipe_argv(smoke_run, tmp_path):
    """The smoke command for NAMES[0] alone into tmp_path, sharing the smoke run's data cache."""
    out, argv = smoke_run
    (tmp_path / "cache").symlink_to(out / "cache", target_is_directory=True)
    return [*argv[:argv.index("--only") + 1], NAMES[0], "--out", str(tmp_path),
            "--device", "cpu", "--no-progress"]


def _sampler_acting_on_third_batch(real, action):
    """A `window_sampler` replacement whose samplers call `action()` while the third batch
    (that of step 3) is drawn, then draw it as usual."""
    def sampler(*args, **kwargs):
        sample, calls = real(*args, **kwargs), []

        def wrapped(batch, gen):
            calls.append(batch)
            if len(calls) == 3:
                action()
            return sample(batch, gen)

        return wrapped

    return sampler


def _train_losses(out):
    return [json.loads(line)["train_loss"]
            for line in (out / "runs" / NAMES[0] / "metrics.jsonl").read_text().splitlines()]


def test_recipe_table_covers_every_variant_and_shape_at_one_budget():
    assert len(RECIPES) == 15
    assert {(r.variant, r.shape) for r in RECIPES.values()} == {
        (v, s) for v in VARIANT_OPTIONS for s in SHAPES}
    for shape in SHAPES:
        cfgs = [RECIPES[f"text-{v}-{shape}"].config(d_vocab=4096) for v in VARIANT_OPTIONS]
        params = [sum(p.numel() for p in HookedVariantTransformer(c).parameters())
                  for c in cfgs]
        assert max(params) / min(params) < 1.05, (shape, params)
        assert {c.n_ctx for c in cfgs} == {512}
    big = RECIPES["text-dcmha-l4mlp"].config(d_vocab=4096)
    # Issue 26: a deeper model with MLPs (>= 4 layers), sized for the CPU (d_model 128).
    assert big.d_model >= 128 and not big.attn_only and 4 <= big.n_layers <= 6
    # one budget, 41M tokens, for every recipe: the curriculum's 10,000 steps of 4,096 tokens
    for recipe in RECIPES.values():
        tcfg = train_config(recipe.train_overrides)
        assert tcfg.steps * tcfg.batch_size == ZOO_TRAIN["steps"] * ZOO_TRAIN["batch_size"]
        assert recipe.data_mix == {"ctx_schedule": ((6250, 256),)}


def test_smoke_run_releases_fp16_models_with_complete_cards(smoke_run):
    out, argv = smoke_run
    for name in NAMES:
        rel = out / "release" / name
        card = json.loads((rel / "card.json").read_text())
        assert card["kind"] == "text-lm" and card["smoke_test_only"] is True
        assert card["train_command"] == "attnlens " + " ".join(argv)
        assert card["tokens"] == 4 * 4 * 64 and card["steps"] == 4 and card["seed"] == 0
        assert card["device"] == "cpu" and card["wall_time_s"] > 0
        assert len(card["corpus"]["sha256"]) == 64 and card["tokenizer"]["vocab_size"] <= 512
        m = card["metrics"]
        assert m["icl_score"] == pytest.approx(m["loss_late"] - m["loss_early"], abs=2e-4)
        model = HookedVariantTransformer.from_pretrained(rel)
        assert len(m["head_table"]) == model.cfg.n_layers * model.cfg.n_heads
        log = [json.loads(x) for x in (rel / "metrics.jsonl").read_text().splitlines()]
        # the release's log: every evaluation (steps 2, 4), step 1 and the last; step 3 is thinned
        assert [r["step"] for r in log] == [1, 2, 4] and card["metrics_log"]["every"] == 10
        assert {"val_loss", "induction_score", "repeat_loss"} <= set(log[1]) and \
            "val_loss" not in log[0]
        assert model.to_str_tokens("def f():")[0] == "<|bos|>"


def test_cards_are_reproduced_by_re_evaluation(smoke_run):
    out, _ = smoke_run
    for name in NAMES:
        rel = out / "release" / name
        card = json.loads((rel / "card.json").read_text())
        measured = evaluate_windows(HookedVariantTransformer.from_pretrained(rel),
                                    load_eval_tokens(rel))
        for key in ("val_loss", "icl_score", "induction_score", "repeat_loss"):
            assert measured[key] == pytest.approx(card["metrics"][key], abs=TOL), key


def test_running_the_command_again_resumes_instead_of_retraining(smoke_run):
    out, argv = smoke_run
    log = (out / "runs" / NAMES[0] / "metrics.jsonl").read_text()
    assert cli_main(argv[:5] + [NAMES[0]] + argv[6 + len(NAMES) - 1:]) == 0
    assert (out / "runs" / NAMES[0] / "metrics.jsonl").read_text() == log


def test_skip_shipped_trains_only_what_the_zoo_lacks(smoke_run, tmp_path, capsys):
    out, _ = smoke_run
    # NAMES are released (smoke cards) under out/release; text-cope-l1 is not
    train_zoo(tmp_path, names=[NAMES[0], "text-cope-l1"], smoke=True, progress=False,
              skip_shipped_in=out / "release")
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["text-cope-l1"]
    assert f"{NAMES[0]}" in capsys.readouterr().err
    # the command's flag reads the bundled zoo, where text-mha-l1 is shipped at today's recipe
    assert "text-mha-l1" in shipped_recipes(["text-mha-l1"], zoo.ZOO_DIR)
    fresh = tmp_path / "fresh"
    assert cli_main(["train", "--zoo", "text", "--smoke", "--skip-shipped", "--only",
                     "text-mha-l1", "--out", str(fresh), "--device", "cpu",
                     "--no-progress"]) == 0
    assert not (fresh / "runs").exists()
    assert "text-mha-l1        shipped in" in capsys.readouterr().err


def test_an_unfinished_run_is_not_released(tmp_path, smoke_run):
    out, _ = smoke_run
    data = prepare_data(out / "cache", vocab_size=512, max_files=40, val_fraction=0.25)
    run_dir = train_recipe("text-mha-l1", data, tmp_path, smoke=True, progress=False)
    state_file = next(run_dir.glob("step-*")) / "trainer_state.json"
    state = json.loads(state_file.read_text())
    state["step"] = 2
    state_file.write_text(json.dumps(state))
    with pytest.raises(ValueError, match="stopped at step 2 of 4"):
        release("text-mha-l1", run_dir, data, tmp_path / "release")


def test_icl_positions_follow_olsson_at_512():
    assert icl_positions(512) == (51, 502)
    early, late = icl_positions(64)
    assert 2 <= early < late <= 60


SHIPPED_TEXT = [n for n in zoo.available()
                if json.loads((zoo.path(n) / "card.json").read_text()).get("kind") == "text-lm"]


@pytest.mark.parametrize("name", documented_params("text card", SHIPPED_TEXT, ids=str,
                                                   keep=["text-mha-l1"]))
def test_every_shipped_text_card_is_reproduced(name):
    card = json.loads((zoo.path(name) / "card.json").read_text())
    assert not card["smoke_test_only"], f"{name} is a smoke run, not a zoo model"
    measured = evaluate_windows(zoo.load(name), load_eval_tokens(zoo.path(name)))
    for key in ("val_loss", "icl_score", "induction_score"):
        assert measured[key] == pytest.approx(card["metrics"][key], abs=5e-3), (name, key)
    torch.manual_seed(0)  # leaves the global RNG as other tests expect


def test_data_mix_repeats_a_span_and_leaves_natural_text_draws_unchanged():
    """The documented data mix copies one earlier span of a context to a later place; with
    repeat_fraction 0 the sampler draws exactly the natural-text batches (exact resume)."""
    import numpy as np

    from attnlens.lab.text_recipes import MIX_RECIPES, REPEAT_MIX
    from attnlens.lab.text_train import window_sampler

    stream = np.arange(5000) % 997 + 1   # no accidental repeats within 512 tokens
    natural = window_sampler(stream, 64, 0)
    mixed = window_sampler(stream, 64, 0, repeat_fraction=1.0, span=(5, 10))
    g1, g2 = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    a, _ = natural(8, g1)
    b, _ = window_sampler(stream, 64, 0, repeat_fraction=0.0)(8, g2)
    assert torch.equal(a, b)
    tokens, _ = mixed(8, torch.Generator().manual_seed(3))
    for row in tokens[:, 1:]:
        changed = (row[1:] - row[:-1] != 1).nonzero().flatten()
        assert len(changed) >= 1   # the copied span breaks the running count
        found = any(torch.equal(row[j:j + 5], row[i:i + 5])
                    for i in range(len(row) - 5) for j in range(i + 5, len(row) - 4))
        assert found
    assert all(r.data_mix == {**REPEAT_MIX, "ctx_schedule": ((6250, 256),)} and r.shape == "l2"
               for r in MIX_RECIPES.values())
    with pytest.raises(ValueError, match="repeat_fraction"):
        window_sampler(stream, 64, 0, repeat_fraction=1.5)


def test_a_run_stopped_mid_way_resumes_bit_exactly_from_the_command(smoke_run, tmp_path,
                                                                     monkeypatch, capsys):
    """Issue 26 item 4: `attnlens train --zoo text` killed mid-run (here: after the step-2
    checkpoint) and run again continues from the checkpoint with the uninterrupted run's
    losses, and says what is done and what is left."""
    import attnlens.lab.text_train as text_train

    new_argv = _one_recipe_argv(smoke_run, tmp_path)
    real = text_train.window_sampler

    def die():
        raise KeyboardInterrupt

    monkeypatch.setattr(text_train, "window_sampler", _sampler_acting_on_third_batch(real, die))
    with pytest.raises(KeyboardInterrupt):
        cli_main(new_argv)
    monkeypatch.setattr(text_train, "window_sampler", real)
    capsys.readouterr()
    assert cli_main(new_argv) == 0
    assert "step 2 of 4" in capsys.readouterr().err
    assert _train_losses(tmp_path) == _train_losses(smoke_run[0])


def test_sigterm_checkpoints_the_step_and_the_command_exits_143(smoke_run, tmp_path,
                                                               monkeypatch, capsys):
    """A session's end (SIGTERM) loses nothing: the command finishes the step, checkpoints it,
    says so and exits 128 + 15; run again, it continues with the uninterrupted losses."""
    import os
    import signal

    import attnlens.lab.text_train as text_train

    new_argv = _one_recipe_argv(smoke_run, tmp_path)
    real = text_train.window_sampler

    def sigterm():   # while step 3 is prepared: no periodic checkpoint at 3
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(text_train, "window_sampler", _sampler_acting_on_third_batch(real, sigterm))
    capsys.readouterr()
    assert cli_main(new_argv) == 143
    assert "stopped by SIGTERM after step 3; checkpoint saved in" in capsys.readouterr().err
    assert not (tmp_path / "release" / NAMES[0]).exists()
    # --status reads the stopped run without training it
    assert cli_main([*new_argv, "--status"]) == 0
    status = capsys.readouterr().out
    assert f"{NAMES[0]} " in status and "step 3 of 4 (" in status and "CPU-h so far" in status
    monkeypatch.setattr(text_train, "window_sampler", real)
    assert cli_main(new_argv) == 0
    assert "step 3 of 4" in capsys.readouterr().err
    assert cli_main([*new_argv, "--status"]) == 0
    assert "done (released)" in capsys.readouterr().out
    assert _train_losses(tmp_path) == _train_losses(smoke_run[0])


def test_a_text_model_is_served_on_held_out_source_code(smoke_run):
    """Issue 26 item 6: the dashboard's default prompt of a text model is its first held-out
    validation window's text (a source file training never saw), within n_ctx."""
    from attnlens.dashboards.store import load_store

    out, _ = smoke_run
    directory = out / "release" / NAMES[0]
    store = load_store([str(directory)])
    text, model = store.default_text[NAMES[0]], store.models[NAMES[0]]
    window = load_eval_tokens(directory)[0].tolist()
    assert text and "<|bos|>" not in text[:10]
    start = next(i for i, t in enumerate(window) if t != model.tokenizer.bos_token_id)
    assert text.startswith(model.to_string(torch.tensor(window[start:start + 5])))
    assert model.to_tokens(text).shape[1] <= model.cfg.n_ctx


def test_random_span_mix_pastes_one_random_token_span_twice_into_natural_text():
    """`span_tokens="random"`: both copies of the repeated span are random vocabulary ids (never
    BOS), the rest of the context is the natural text, and draws are reproducible."""
    import numpy as np

    from attnlens.lab.text_train import window_sampler

    stream = np.arange(5000) % 997 + 1   # consecutive ids: natural text here has step 1
    sample = window_sampler(stream, 64, 0, repeat_fraction=1.0, span=(5, 10),
                            span_tokens="random", vocab_size=4096)
    tokens, _ = sample(8, torch.Generator().manual_seed(3))
    again, _ = sample(8, torch.Generator().manual_seed(3))
    assert torch.equal(tokens, again)
    for row in tokens[:, 1:]:
        natural = torch.cat([torch.tensor([True]), (row[1:] - row[:-1]) == 1])
        # the running count survives outside the two copies: at most 2 x 10 + 2 breaks
        assert (~natural).sum() <= 22 and (row > 0).all()
        pasted = [(i, j, n) for n in range(10, 4, -1) for i in range(len(row) - n)
                  for j in range(i + n, len(row) - n + 1)
                  if torch.equal(row[i:i + n], row[j:j + n])
                  and not bool(((row[i + 1:i + n] - row[i:i + n - 1]) == 1).all())]
        assert pasted, "no random-token span repeated later in the context"
    with pytest.raises(ValueError, match="span_tokens"):
        window_sampler(stream, 64, 0, repeat_fraction=1.0, span=(5, 10), span_tokens="words")
    with pytest.raises(ValueError, match="vocab_size"):
        window_sampler(stream, 64, 0, repeat_fraction=1.0, span=(5, 10), span_tokens="random")


def test_toy_schedule_serves_toy_phases_then_natural_text_and_resumes_exactly():
    """The curriculum: `(steps, ctx)` phases of `[BOS] r r` with as many tokens per step as the
    natural batches, then natural text; a sampler started at step k serves what the
    uninterrupted one serves from step k on (given the generator state)."""
    import numpy as np

    from attnlens.lab.text_train import window_sampler

    stream = np.arange(5000) % 997 + 1
    kwargs = dict(vocab_size=50, toy_schedule=((2, 16), (1, 32)))
    sample = window_sampler(stream, 64, 0, **kwargs)
    gen = torch.Generator().manual_seed(0)
    batches = [sample(4, gen)[0] for _ in range(5)]
    assert [tuple(b.shape) for b in batches] == [(16, 16), (16, 16), (8, 32), (4, 64), (4, 64)]
    lengths = set()
    for b in batches[:3]:
        assert (b[:, 0] == 0).all() and (b[:, 1:] < 50).all() and (b[:, 1:] > 0).all()
        for row in b[:, 1:]:
            body = len(row)
            found = [n for n in range(max(1, body // 8), body // 2 + 1)
                     if torch.equal(row[:n], row[n:2 * n])]
            assert found, row
            lengths.add(found[-1])
    assert len(lengths) > 3   # the copy distance varies
    assert ((batches[3][:, 2:] - batches[3][:, 1:-1]) % 997 == 1).float().mean() > 0.95
    gen = torch.Generator().manual_seed(0)
    resumed = window_sampler(stream, 64, 0, start_step=2, **kwargs)
    full = window_sampler(stream, 64, 0, **kwargs)
    for _ in range(2):
        full(4, gen)
    state = gen.get_state()
    ahead = [full(4, gen)[0] for _ in range(3)]
    gen.set_state(state)
    assert all(torch.equal(a, resumed(4, gen)[0]) for a in ahead)
    fixed, _ = window_sampler(stream, 64, 0, vocab_size=50, toy_schedule=((1, 16),),
                              toy_copy="fixed")(4, torch.Generator().manual_seed(1))
    assert torch.equal(fixed[:, 1:8], fixed[:, 9:16]) and fixed.shape == (16, 16)
    small, _ = window_sampler(stream, 64, 0, vocab_size=50, toy_schedule=((1, 16),),
                              toy_vocab=5)(4, torch.Generator().manual_seed(1))
    assert small[:, 1:].max() <= 4 and small[:, 1:].min() >= 1
    with pytest.raises(ValueError, match="toy_vocab"):
        window_sampler(stream, 64, 0, vocab_size=50, toy_schedule=((1, 16),), toy_vocab=51)
    with pytest.raises(ValueError, match="toy_copy"):
        window_sampler(stream, 64, 0, vocab_size=50, toy_schedule=((1, 16),), toy_copy="x")
    with pytest.raises(ValueError, match="toy_schedule phase"):
        window_sampler(stream, 64, 0, vocab_size=50, toy_schedule=((2, 128),))


def test_runs_default_outside_the_work_tree(monkeypatch, tmp_path):
    """Checkpoints under the work tree never reach the next session (it is laid anew from
    git): the default runs directory is $ATTNLENS_RUNS/zoo-text, else ~/.cache/attnlens."""
    from pathlib import Path

    from attnlens.lab.text_train import default_runs_dir

    monkeypatch.setenv("ATTNLENS_RUNS", str(tmp_path))
    assert default_runs_dir() == tmp_path / "zoo-text"
    monkeypatch.delenv("ATTNLENS_RUNS")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_runs_dir() == tmp_path / "home" / ".cache" / "attnlens" / "zoo-text"
    repo = Path(__file__).resolve().parents[1]
    assert repo not in default_runs_dir().parents


def test_paper_runs_default_outside_the_work_tree(monkeypatch, tmp_path):
    """The paper-task zoo's long runs (issue 24) resume across sessions too: their runs live
    under the same root as the text zoo's, in paper-zoo/."""
    from attnlens.lab.paper._training import default_run_root

    monkeypatch.setenv("ATTNLENS_RUNS", str(tmp_path))
    assert default_run_root() == tmp_path / "paper-zoo"
    monkeypatch.delenv("ATTNLENS_RUNS")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert default_run_root() == tmp_path / "home" / ".cache" / "attnlens" / "paper-zoo"


@pytest.mark.parametrize("attention, stage", [("mha", None), ("cope", None), ("mta", "softmax"),
                                              ("dcmha", "probs"), ("infini", "local_pattern")])
def test_probe_adds_the_row_stochastic_stage_where_pattern_is_not_one(attention, stage):
    """MTA's, DCMHA's and Infini's `pattern` is not a distribution over keys, so the probe also
    scores the last row-stochastic stage before it: that stage's best stripe, recomputed here,
    and at most 1."""
    from attnlens.interp.tools.heads import induction_table
    from attnlens.interp.tools.text_eval import PROBE_SEED, distribution_stage, induction_probe

    from helpers import tiny_model

    attn_cfg = {"segment_len": 8} if attention == "infini" else None
    model = tiny_model(attention, n_ctx=32, attn_cfg=attn_cfg)
    assert distribution_stage(model) == stage
    probe = induction_probe(model, batch=2, half=6)
    extra = [k for k in probe if k.startswith("induction_score_")]
    if stage is None:
        assert extra == []
        return
    assert extra == [f"induction_score_{stage}"]
    table = induction_table(model, batch=2, half_len=6, seed=PROBE_SEED, stage=stage)
    assert probe[extra[0]] == pytest.approx(float(table["induction_stripe"].max()), abs=1e-7)
    assert 0.0 <= probe[extra[0]] <= 1.0 + 1e-6


def test_measure_prints_the_wall_and_cpu_pace_and_the_projection(smoke_run, tmp_path, capsys):
    """`--measure` times a few steps of each recipe, per wall-second and per CPU-second, and
    projects the budget from each; it trains nothing."""
    argv = _one_recipe_argv(smoke_run, tmp_path)
    assert cli_main([*argv, "--measure", "--measure-steps", "2"]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split()
    for column in ("tokens_per_s", "tokens_per_cpu_s", "projected_s", "projected_cpu_s"):
        assert column in header
    row = next(line.split() for line in out.splitlines() if line.startswith(NAMES[0]))
    values = dict(zip(header, (float(x) for x in row[1:]), strict=True))
    assert values["tokens_per_s"] > 0 and values["tokens_per_cpu_s"] > 0
    for pace, projected in (("tokens_per_s", "projected_s"),
                            ("tokens_per_cpu_s", "projected_cpu_s")):   # whole seconds
        assert abs(values[projected] - values["budget_tokens"] / values[pace]) <= 0.51
    assert "CPU-hours (training steps only" in out
    assert not (tmp_path / "runs").exists()

