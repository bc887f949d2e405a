"""Issue 26 item 6: `attnlens serve` (and `make serve`) opens on the bundled text language
models, 2-layer first, each on about 500 tokens of a held-out source file; the toy induction
models stay one flag away (`--zoo induction`) or by name."""

from __future__ import annotations

import json

import pytest

from attnlens import cli
from attnlens.hooked_models import zoo

TEXT = zoo.available(kind="text-lm")


def _layers(name: str) -> int:
    return json.loads((zoo.path(name) / "config.json").read_text())["n_layers"]


def test_the_default_set_is_every_text_model_two_layers_first():
    names = cli.default_sources()
    assert TEXT, "the zoo ships no text language model"
    assert sorted(names) == sorted(TEXT)           # whatever text models are present, only them
    twos = [n for n in names if _layers(n) == 2]
    assert names[:len(twos)] == twos and twos


def test_the_order_puts_two_layers_first_then_by_depth(tmp_path, monkeypatch):
    """The zoo's own 2-layer models first, MHA then CoPE, MTA, DCMHA, Infini (the opening
    Compare page: MHA's textbook circuit beside CoPE's, both maps distributions on one colour
    scale), then the 2-layer twins, then by depth; models still in training join in this
    order when they are committed."""
    configs = {"text-cope-l1": (1, "cope"), "text-cope-l4mlp": (4, "cope"),
               "text-mha-l1": (1, "mha"), "text-mha-l2": (2, "mha"),
               "text-mha-l2-mix": (2, "mha"), "text-infini-l2": (2, "infini"),
               "text-mta-l2": (2, "mta"), "text-mha-l4mlp": (4, "mha"),
               "text-cope-l2": (2, "cope")}
    for name, (n, variant) in configs.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps({"n_layers": n,
                                                                  "attention": variant}))
    monkeypatch.setattr(zoo, "available", lambda kind=None: sorted(configs))
    monkeypatch.setattr(zoo, "path", lambda name: tmp_path / name)
    assert cli.default_sources() == ["text-mha-l2", "text-cope-l2", "text-mta-l2",
                                     "text-infini-l2",
                                     "text-mha-l2-mix", "text-mha-l1", "text-cope-l1",
                                     "text-mha-l4mlp", "text-cope-l4mlp"]


def test_without_text_models_the_toys_are_the_default(monkeypatch):
    real = zoo.available
    monkeypatch.setattr(zoo, "available",
                        lambda kind=None: [] if kind == "text-lm" else real(kind))
    assert cli.default_sources() == real(kind="induction") != []


@pytest.mark.parametrize("argv, expected", [
    ([], None),                                                  # the default set
    (["--zoo", "induction"], zoo.available(kind="induction")),
    (["induction-mha", "--zoo", "induction", "text"],            # named ones first, no twice
     ["induction-mha", *[n for n in zoo.available(kind="induction") if n != "induction-mha"],
      *TEXT]),
    (["induction-mta"], ["induction-mta"]),
])
def test_serve_chooses_its_sources(monkeypatch, argv, expected):
    seen = []

    def fake_build_store(sources=None):
        seen.append(sources)
        raise SystemExit(0)

    monkeypatch.setattr(cli, "build_store", fake_build_store)
    monkeypatch.setattr(cli, "check_port", lambda host, port: None)
    with pytest.raises(SystemExit):
        cli.main(["serve", *argv])
    assert seen == [expected or []]
    with pytest.raises(SystemExit):
        cli.main(["serve", "--zoo", "letters"])   # argparse names the choices


def test_the_default_store_serves_held_out_source_code_of_about_500_tokens():
    store = cli.build_store()
    assert store.names == cli.default_sources()
    assert store.get(store.names[0]).cfg.n_layers == 2   # what the one-model pages open on
    for name in store.names[:2]:   # the models the Compare page opens on
        model = store.get(name)
        assert model.card["kind"] == "text-lm"
        prompt = store.prompt(name, "")
        assert 400 <= len(prompt.labels) <= model.cfg.n_ctx
        assert prompt.note == "the prompt is empty: showing the default text"
        assert "\n" in store.default_text[name]    # a source file's lines, not a toy string


def test_a_text_model_reads_a_multi_line_prompt_as_one_text():
    """Code spans lines: for a model whose tokenizer reads line breaks the prompt box's lines are
    one prompt (labels show the breaks); a toy model still averages one prompt per line."""
    from attnlens.dashboards.store import load_store

    store = load_store([TEXT[0], "induction-mha"])
    code = "def read(self, size):\n    return self.file.read(size)\n"
    prompt = store.prompt(TEXT[0], code)
    assert prompt.tokens.shape[0] == 1 and prompt.note == ""
    assert prompt.tokens.shape[1] == store.get(TEXT[0]).to_tokens(code).shape[1]
    assert any(label.split(":", 1)[1].startswith("↵") for label in prompt.labels)
    toy = store.prompt("induction-mha", "abcabc\nabdabd")
    assert toy.tokens.shape[0] == 2 and toy.note.startswith("averaged over 2 prompts")
    assert store.reads_line_breaks == {TEXT[0]: True, "induction-mha": False}
