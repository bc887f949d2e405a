"""Checkpoint safety: saves touch only their own files, atomically; corrupt files are named;
loaders return eval-mode models; cfg.dtype follows half()/float()/... through a save."""

from __future__ import annotations

import os

import pytest
import torch
from safetensors.torch import load_file

from attnlens.hooked_models import HookedVariantTransformer, checkpoint, zoo
from attnlens.hooked_models.tokenizers.bpe import train_bpe

from helpers import random_tokens, tiny_cfg


def trained_model(shift: float = 0.0, **overrides) -> HookedVariantTransformer:
    """A freshly built (training-mode) tiny model; `shift` moves every weight (same config)."""
    model = HookedVariantTransformer(tiny_cfg(**overrides))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(shift)
    return model


def temp_files(directory) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(checkpoint.TEMP_SUFFIX))


def assert_same_weights(model, directory) -> None:
    saved = load_file(str(directory / checkpoint.WEIGHTS_FILE))
    assert saved.keys() == model.state_dict().keys()
    for key, value in model.state_dict().items():
        assert torch.equal(saved[key], value), key


# -- saving touches only the checkpoint's own files ------------------------------------------
def test_other_files_in_the_directory_survive(tmp_path):
    ckpt = tmp_path / "ckpt"
    (ckpt / "runs").mkdir(parents=True)
    (ckpt / "notes.txt").write_text("mine")
    (ckpt / "runs" / "log.csv").write_text("1,2")
    (ckpt / "optimizer.safetensors").write_bytes(b"opt")
    trained_model(0).save_pretrained(ckpt, card={"task": "a"})
    trained_model(1).save_pretrained(ckpt)  # overwrite; no card this time
    assert (ckpt / "notes.txt").read_text() == "mine"
    assert (ckpt / "runs" / "log.csv").read_text() == "1,2"
    assert (ckpt / "optimizer.safetensors").read_bytes() == b"opt"
    # The old card described the old weights, so it goes; nothing else of ours is left over.
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "config.json", "model.safetensors", "notes.txt", "optimizer.safetensors", "runs"]
    assert_same_weights(trained_model(1), ckpt)


def test_a_plain_file_path_is_refused(tmp_path):
    target = tmp_path / "model.bin"
    target.write_bytes(b"not a checkpoint")
    with pytest.raises(ValueError, match="model.bin is an existing file"):
        trained_model().save_pretrained(target)
    assert target.read_bytes() == b"not a checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.bin"]


def test_only_our_own_stale_temp_files_are_cleaned(tmp_path):
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    ours = [".model.safetensors.0123456789abcdef.attnlens-tmp",
            ".config.json.fedcba9876543210.attnlens-tmp"]
    others = [".notes.txt.0123456789abcdef.attnlens-tmp", ".model.safetensors.tmp",
              "x.attnlens-tmp", ".config.json.0123.attnlens-tmp", "model.safetensors.bak"]
    for name in ours + others:
        (ckpt / name).write_text("left by a killed process or by the user")
    trained_model().save_pretrained(ckpt)
    names = {p.name for p in ckpt.iterdir()}
    assert not names & set(ours)
    assert names == set(others) | {"config.json", "model.safetensors"}


# -- a crash mid-save leaves a loadable checkpoint and no temp file -------------------------
class Crash(RuntimeError):
    pass


def test_crash_while_writing_weights_keeps_previous_checkpoint(tmp_path, monkeypatch):
    old = trained_model(0)
    old.save_pretrained(tmp_path, card={"v": 1})

    def dies_half_way(state, path, metadata=None):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise Crash("disk full")

    monkeypatch.setattr(checkpoint, "save_file", dies_half_way)
    with pytest.raises(Crash):
        trained_model(1).save_pretrained(tmp_path, card={"v": 2})
    assert temp_files(tmp_path) == []
    loaded = HookedVariantTransformer.from_pretrained(tmp_path)
    assert loaded.card == {"v": 1}
    assert_same_weights(old, tmp_path)


@pytest.mark.parametrize("fail_at", [1, 2, 3])  # the weights, card.json, config.json renames
def test_crash_between_renames_leaves_a_consistent_checkpoint(tmp_path, monkeypatch, fail_at):
    old, new = trained_model(0), trained_model(1)  # same config, other weights
    old.save_pretrained(tmp_path, card={"v": 1})
    real_replace, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == fail_at:
            raise Crash(f"killed before renaming onto {dst}")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(Crash):
        new.save_pretrained(tmp_path, card={"v": 2})
    monkeypatch.undo()
    assert [os.path.basename(c) for c in calls][-1] == (
        ["model.safetensors", "card.json", "config.json"][fail_at - 1])
    # Before the commit (the weights' rename) the save removes what it staged; after it the
    # staged files complete the new checkpoint and stay until the next save installs them.
    assert (temp_files(tmp_path) == []) == (fail_at == 1)
    loaded = HookedVariantTransformer.from_pretrained(tmp_path)
    assert loaded.card == {"v": 1 if fail_at == 1 else 2}
    assert_same_weights(old if fail_at == 1 else new, tmp_path)
    tokens = random_tokens(loaded)
    expected = (old if fail_at == 1 else new).eval()(tokens)
    torch.testing.assert_close(loaded(tokens), expected, atol=0, rtol=0)
    new.save_pretrained(tmp_path)
    assert temp_files(tmp_path) == []


def crash_replace_config(monkeypatch) -> None:
    real_replace = os.replace

    def replace(src, dst):
        if os.path.basename(dst) == "config.json":
            raise Crash("killed before the last rename")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)


def test_interrupted_save_with_another_config_loads_the_new_model(tmp_path, monkeypatch):
    # Same shapes, other dtype: the float64 weights must not load into a float32 model built
    # from the old config.json; the staged config.json of the interrupted save completes them.
    trained_model(0).save_pretrained(tmp_path)
    crash_replace_config(monkeypatch)
    with pytest.raises(Crash):
        trained_model(0, dtype=torch.float64).save_pretrained(tmp_path)
    monkeypatch.undo()
    assert HookedVariantTransformer.from_pretrained(tmp_path).cfg.dtype == torch.float64
    assert checkpoint.read_config(tmp_path).dtype == torch.float32   # the directory as it is


def test_hand_edited_config_is_named(tmp_path):
    trained_model(0).save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    path.write_text(path.read_text().replace('"float32"', '"float64"'))
    with pytest.raises(ValueError, match=r"config.json differs .*model.safetensors.*\['dtype'\]"):
        HookedVariantTransformer.from_pretrained(tmp_path)


def test_interrupted_tokenizer_rename_loads_the_new_tokenizer_and_hand_edits_are_named(
        tmp_path, monkeypatch):
    texts = ["the cat sat on the mat", "a dog ate the log"] * 4
    model = trained_model(0, d_vocab=260)
    model.tokenizer = train_bpe(texts, vocab_size=259)
    model.save_pretrained(tmp_path)
    assert HookedVariantTransformer.from_pretrained(tmp_path).to_str_tokens("the cat")
    real_replace = os.replace

    def replace(src, dst):
        if os.path.basename(dst) == "tokenizer.json":
            raise Crash("killed before renaming the tokenizer")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    model.tokenizer = train_bpe(texts, vocab_size=260)
    with pytest.raises(Crash):
        model.save_pretrained(tmp_path)
    monkeypatch.undo()
    loaded = HookedVariantTransformer.from_pretrained(tmp_path)
    assert loaded.tokenizer.to_json() == model.tokenizer.to_json()
    model.save_pretrained(tmp_path)
    (tmp_path / "tokenizer.json").write_text(train_bpe(texts, vocab_size=259).to_json())
    with pytest.raises(ValueError, match="tokenizer.json differs from the one"):
        HookedVariantTransformer.from_pretrained(tmp_path)


# -- issue 20 item 6: killed at any step of a save, one complete checkpoint loads ----------------
TEXTS = ["the cat sat on the mat", "a dog ate the log"] * 4


def with_tokenizer(model, vocab):
    model.tokenizer = train_bpe(TEXTS, vocab_size=vocab)
    return model


def checkpoint_kinds():
    """(old model, old card, new model, new card): each side file changes, appears or goes."""
    a = with_tokenizer(trained_model(0, d_vocab=260), 259)
    b = trained_model(1, dtype=torch.float64, n_layers=1)                 # other config
    c = with_tokenizer(trained_model(2, d_vocab=260, n_heads=2), 260)    # other tokenizer
    return [(a, {"v": "a"}, b, None), (b, None, a, {"v": "a"}), (a, {"v": "a"}, c, {"v": "c"})]


class Killed(BaseException):
    """A kill: raised by the step it interrupts and by every file operation after it, so no
    clean-up handler gets to run either."""


def kill_at(monkeypatch, step: int | None) -> list[str]:
    """Count the file-system changes of a save (renames, removals); die at number `step`."""
    calls: list[str] = []
    real = {"replace": os.replace, "unlink": os.unlink}

    def wrap(name):
        def op(*args, **kwargs):
            calls.append(f"{name} {os.path.basename(args[-1 if name == 'replace' else 0])}")
            if step is not None and len(calls) > step:
                raise Killed(calls[-1])
            return real[name](*args, **kwargs)
        return op

    monkeypatch.setattr(os, "replace", wrap("replace"))
    monkeypatch.setattr(os, "unlink", wrap("unlink"))
    return calls


def state_of(model) -> tuple:
    tok = model.tokenizer.to_json() if hasattr(model.tokenizer, "to_json") else None
    return (model.cfg.to_json(), tok, {k: v.clone() for k, v in model.state_dict().items()})


def same_state(x: tuple, y: tuple) -> bool:
    return x[:2] == y[:2] and x[2].keys() == y[2].keys() and all(
        torch.equal(x[2][k], y[2][k]) for k in x[2])


@pytest.mark.parametrize("kind", range(3))
def test_a_save_killed_at_any_step_leaves_the_old_or_the_new_checkpoint(tmp_path, monkeypatch,
                                                                        kind):
    old, old_card, new, new_card = checkpoint_kinds()[kind]
    old_state, new_state = state_of(old), state_of(new)
    probe = tmp_path / "probe"
    old.save_pretrained(probe, card=old_card)
    steps = kill_at(monkeypatch, None)
    new.save_pretrained(probe, card=new_card)
    monkeypatch.undo()
    assert len(steps) >= 3, steps
    for step in range(len(steps)):
        ckpt = tmp_path / f"step{step}"
        old.save_pretrained(ckpt, card=old_card)
        kill_at(monkeypatch, step)
        with pytest.raises(Killed):
            new.save_pretrained(ckpt, card=new_card)
        monkeypatch.undo()
        loaded = HookedVariantTransformer.from_pretrained(ckpt)
        got = state_of(loaded)
        is_new = same_state(got, new_state)
        assert is_new or same_state(got, old_state), (step, steps[step])
        assert loaded.card == (new_card if is_new else old_card), (step, steps[step])
        # a later save over what the kill left: complete at every step of its own
        for again in range(len(steps)):
            kill_at(monkeypatch, again)
            with pytest.raises(Killed):
                old.save_pretrained(ckpt, card=old_card)
            monkeypatch.undo()
            got = state_of(HookedVariantTransformer.from_pretrained(ckpt))
            assert same_state(got, old_state) or same_state(got, new_state), (step, again)
        old.save_pretrained(ckpt, card=old_card)
        assert temp_files(ckpt) == []
        assert same_state(state_of(HookedVariantTransformer.from_pretrained(ckpt)), old_state)


# -- corrupt files are named ---------------------------------------------------------------
def test_truncated_weights_are_named(tmp_path):
    trained_model().save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ValueError, match=f"{weights}.*corrupt or truncated"):
        HookedVariantTransformer.from_pretrained(tmp_path)


@pytest.mark.parametrize("text, problem", [("{not json", "is not valid JSON"),
                                           ("[1, 2]", "must hold a JSON object"),
                                           ('{"d_model": 32}', "n_layers")])
def test_bad_config_json_is_named(tmp_path, text, problem):
    trained_model().save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(ValueError, match=f"{tmp_path / 'config.json'}.*{problem}"):
        HookedVariantTransformer.from_pretrained(tmp_path)


@pytest.mark.parametrize("text", ['{"task": "induc', '"just a string"'])
def test_corrupt_card_only_warns(tmp_path, text):
    model = trained_model().eval()
    model.save_pretrained(tmp_path, card={"task": "induction"})
    (tmp_path / "card.json").write_text(text)
    with pytest.warns(UserWarning, match=str(tmp_path / "card.json")):
        loaded = HookedVariantTransformer.from_pretrained(tmp_path)
    assert loaded.card is None
    tokens = random_tokens(model)
    torch.testing.assert_close(loaded(tokens), model(tokens), atol=0, rtol=0)


# -- loaders return eval-mode models -------------------------------------------------------
def test_from_pretrained_returns_eval_mode(tmp_path):
    model = trained_model(attention="cope")
    assert model.training
    model.save_pretrained(tmp_path)
    loaded = HookedVariantTransformer.from_pretrained(tmp_path)
    assert not any(m.training for m in loaded.modules())


@pytest.mark.parametrize("name", zoo.available())
def test_zoo_models_load_in_eval_mode(name):
    model = zoo.load(name)
    assert not any(m.training for m in model.modules())


def test_transformer_lens_patching_runs_on_a_zoo_model():
    from transformer_lens.patching import get_act_patch_resid_pre

    model = zoo.load("induction-mha")  # no .eval(): patching refuses training-mode models
    clean = model.to_tokens("abcdefabcdef")
    corrupt = model.to_tokens("abcdefghijkl")  # same first 7 tokens (BOS + "abcdef")
    _, clean_cache = model.run_with_cache(clean)

    def metric(logits):
        return logits[0, -1, 1]

    out = get_act_patch_resid_pre(model, corrupt, clean_cache, metric)
    assert out.shape == (model.cfg.n_layers, clean.shape[1])
    # Causal model: residuals at the shared prefix are the same in both runs, so patching them
    # changes nothing (float32 logits of size ~10: 1e-5); patching later positions does.
    unpatched = metric(model(corrupt))
    same = unpatched.expand(model.cfg.n_layers, 7)
    torch.testing.assert_close(out[:, :7], same, atol=1e-5, rtol=0)
    assert (out[:, 7:] - unpatched).abs().max() > 1e-2


def test_from_hf_returns_eval_mode():
    transformers = pytest.importorskip("transformers")
    from attnlens.hooked_models.converters.hf import from_hf

    cfg = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=50, n_positions=16)
    hf = transformers.GPT2LMHeadModel(cfg).train()
    assert not any(m.training for m in from_hf(hf).modules())


def test_from_dcformer_returns_eval_mode(tmp_path):
    from test_dcformer_import import release_state, write_checkpoint

    from attnlens.hooked_models.converters.dcformer import from_dcformer

    model = from_dcformer(write_checkpoint(tmp_path / "dc", release_state()))
    assert not any(m.training for m in model.modules())


# -- cfg.dtype follows the weights ---------------------------------------------------------
@pytest.mark.parametrize("convert, dtype", [
    (lambda m: m.half(), torch.float16), (lambda m: m.bfloat16(), torch.bfloat16),
    (lambda m: m.double(), torch.float64), (lambda m: m.double().float(), torch.float32),
    (lambda m: m.to(torch.float64), torch.float64),
    (lambda m: m.to("cpu", dtype=torch.float16), torch.float16)])
def test_dtype_conversions_keep_cfg_in_sync_through_a_save(tmp_path, convert, dtype):
    model = convert(trained_model(attention="infini"))
    assert model.cfg.dtype == dtype and model.W_E.dtype == dtype
    model.save_pretrained(tmp_path)
    loaded = HookedVariantTransformer.from_pretrained(tmp_path)
    assert loaded.cfg.dtype == dtype
    for key, value in model.state_dict().items():
        got = loaded.state_dict()[key]
        assert got.dtype == value.dtype and torch.equal(got, value), key


def test_saved_files_get_the_permissions_the_umask_gives(tmp_path):
    """safetensors writes the weights readable by their owner only; a checkpoint's files all
    get what the umask allows, like any file the user writes (a shared model directory)."""
    old = os.umask(0o022)
    try:
        trained_model().save_pretrained(tmp_path / "a")
        checkpoint.save_tensors({"x": torch.zeros(2)}, tmp_path / "a" / "x.safetensors")
        os.umask(0o077)
        trained_model().save_pretrained(tmp_path / "b")
    finally:
        os.umask(old)
    modes = {d: {p.name: p.stat().st_mode & 0o777 for p in (tmp_path / d).iterdir()}
             for d in ("a", "b")}
    assert set(modes["a"].values()) == {0o644}, modes
    assert set(modes["b"].values()) == {0o600}, modes
