"""Defects of the attribution-graph API and the `attnlens graph` / `attnlens circuit` command
lines (issue 55 item 6): distinct default slugs, a graph list that keeps every graph written
by several processes, repeated targets refused, output and argument errors found before the
graph is computed (status 2, one line), CoPE's `clamped` in float32, bad prompt characters,
negative counts, map entries out of range, `attribute`'s and `prune`'s arguments, and hints
that name something the user can run."""

import json
import multiprocessing
import os
import stat
from argparse import Namespace

import numpy as np
import pytest
import torch
from attribution_models import model_and_transcoders, prompt, write_cope_checkpoint
from dashboard_common import ALPHABET

from attnlens.cli import find_block_variant, main
from attnlens.commands.graph import missing_transcoders
from attnlens.hooked_models import zoo
from attnlens.interp.attribution import graph as graph_module
from attnlens.interp.attribution.export import (
    INDEX_FILE,
    MAX_SLUG_BYTES,
    check_output,
    check_slug,
    default_slug,
    write_graph,
)
from attnlens.interp.attribution.graph import attribute, resolve_targets
from attnlens.interp.attribution.prune import prune
from attnlens.interp.attribution.qk import cope_position_counts, pattern_sources
from attnlens.interp.attribution.replacement import clean_run
from attnlens.interp.sae.transcoder import Transcoder, TranscoderConfig

from helpers import tiny_model


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny CoPE checkpoint with a tokenizer and transcoders."""
    return write_cope_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-cope")


@pytest.fixture(scope="module")
def small():
    model, tcs = model_and_transcoders("mha-rotary")
    return model, tcs, attribute(model, tcs, prompt(model), max_logits=3)


@pytest.fixture
def no_graph(monkeypatch):
    """Fail the test if the command gets as far as computing a graph."""
    def refuse(*args, **kwargs):
        raise AssertionError("the graph was computed before the arguments were checked")
    monkeypatch.setattr(graph_module, "attribute", refuse)


def usage_error(capsys, argv) -> str:
    """Run `attnlens argv`, expect exit status 2 and one line on stderr; return that line."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2, info.value
    err = capsys.readouterr().err.strip()
    assert err and "Traceback" not in err
    return err.splitlines()[-1]


# 1. default slugs ------------------------------------------------------------------------------

def test_default_slugs_differ_for_prompts_that_read_alike(checkpoint, tmp_path, capsys):
    prompts = ["import os", "Import OS!", "import  os", "日本語", "Ελληνικά", "\ud800", "x\udcff"]
    slugs = [default_slug("text-mha-l4mlp", p) for p in prompts]
    assert len(set(slugs)) == len(prompts)
    assert slugs[0].startswith("text-mha-l4mlp-import-os-")
    assert all(check_slug(s) == s for s in slugs)
    # the same graph asked for again keeps its name; the model and the targets are part of it
    assert default_slug("text-mha-l4mlp", "import os") == slugs[0]
    assert default_slug("text-cope-l4mlp", "import os") != slugs[0]
    assert default_slug("text-mha-l4mlp", "import os", [" path"]) != slugs[0]
    assert default_slug("text-mha-l4mlp", "import os", [" path"]) != \
        default_slug("text-mha-l4mlp", "import os", [" sys"])
    # on the command line: two prompts that differ in case and punctuation, two graphs listed
    out = tmp_path / "graphs"
    for text in ("the cat sat", "the cat  sat."):   # one slug under the old default
        assert main(["graph", str(checkpoint), text, "--target", " ", "--out", str(out),
                     "--no-progress", "--show", "1"]) == 0
    capsys.readouterr()
    index = json.loads((out / INDEX_FILE).read_text())["graphs"]
    assert sorted(g["prompt"] for g in index) == ["the cat  sat.", "the cat sat"]
    assert all((out / f"{g['slug']}.json").is_file() for g in index)


def test_explicit_slugs_stay_checked():
    with pytest.raises(ValueError, match=f"at most {MAX_SLUG_BYTES} fit a file name"):
        check_slug("x" * (MAX_SLUG_BYTES + 1))
    with pytest.raises(ValueError, match="character no file name can hold"):
        check_slug("bad\ud800")
    for bad in ("", ".hidden", "a/b", "graph-metadata"):
        with pytest.raises(ValueError, match="slug"):
            check_slug(bad)


# 2. the graph list under concurrent writers ----------------------------------------------------

def _write_many(graph, directory, worker: int, n: int, barrier) -> None:
    torch.set_num_threads(1)      # forked: no OpenMP pool from the parent is touched
    barrier.wait()
    for i in range(n):
        write_graph(graph, directory, f"w{worker}-g{i}")


def test_every_graph_written_by_several_processes_is_listed(small, tmp_path):
    _, _, graph = small
    ctx = multiprocessing.get_context("fork")
    workers, per_worker = 6, 10
    barrier = ctx.Barrier(workers)
    procs = [ctx.Process(target=_write_many, args=(graph, tmp_path, w, per_worker, barrier))
             for w in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    listed = [g["slug"] for g in json.loads((tmp_path / INDEX_FILE).read_text())["graphs"]]
    expected = {f"w{w}-g{i}" for w in range(workers) for i in range(per_worker)}
    assert len(listed) == len(expected) and set(listed) == expected
    # nothing but the graphs and their list is left in the folder (no temp or lock files)
    assert {p.name for p in tmp_path.iterdir()} == {f"{s}.json" for s in expected} | {INDEX_FILE}


# 3. repeated targets -----------------------------------------------------------------------

def test_repeated_targets_are_refused(small, checkpoint, capsys, no_graph):
    model, tcs, _ = small
    with pytest.raises(ValueError, match=r"same token more than once \(5 "):
        attribute(model, tcs, prompt(model), targets=[5, 5])
    with pytest.raises(ValueError, match="same token more than once"):
        resolve_targets(model, [7, torch.tensor(7)])
    line = usage_error(capsys, ["graph", str(checkpoint), "the cat", "--target", " ",
                                "--target", " "])
    assert line == "attnlens graph: error: --target ' ' is given more than once: each logit " \
                   "node needs its own token"


def test_a_text_and_an_id_of_one_token_are_a_repeat(checkpoint):
    from attnlens.hooked_models import HookedVariantTransformer

    model = HookedVariantTransformer.from_pretrained(checkpoint)
    space = int(model.to_tokens(" ", prepend_bos=False)[0, 0])
    with pytest.raises(ValueError, match="same token more than once"):
        resolve_targets(model, [" ", space])


# 4. output, slug and threshold errors before the graph ---------------------------------------

def test_output_errors_come_first(checkpoint, tmp_path, capsys, no_graph):
    a_file = tmp_path / "a-file"
    a_file.write_text("mine")
    line = usage_error(capsys, ["graph", str(checkpoint), "the cat", "--out", str(a_file)])
    assert line.startswith("attnlens graph: error: output folder") and "is not a folder" in line
    assert a_file.read_text() == "mine"
    line = usage_error(capsys, ["graph", str(checkpoint), "the cat", "--out", str(tmp_path),
                                "--slug", "s" * 300])
    assert "bytes long; at most 200 fit a file name" in line
    line = usage_error(capsys, ["graph", str(checkpoint), "the cat",
                                "--out", str(tmp_path / ("d" * 300))])
    assert "cannot create the output folder" in line and "too long" in line
    line = usage_error(capsys, ["graph", str(checkpoint), "the cat", "--out", str(tmp_path),
                                "--slug", "graph-metadata"])
    assert "would overwrite the graph list" in line
    line = usage_error(capsys, ["graph", str(checkpoint), "the cat", "--slug", "a/b"])
    assert "slug must be a non-empty file name" in line
    for flag, value in (("--node-threshold", "1.5"), ("--edge-threshold", "0"),
                        ("--node-threshold", "nan"), ("--edge-threshold", "true")):
        line = usage_error(capsys, ["graph", str(checkpoint), "the cat", flag, value])
        assert f"argument {flag}: must be a number in (0, 1]" in line


def _read_only_folder(tmp_path):
    """A folder this process cannot write into: a chmod'ed one, or /sys when running as root
    (root ignores the permission bits); None when there is none."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(stat.S_IRUSR | stat.S_IXUSR)
    probe = folder / "probe"
    try:
        probe.touch()
    except OSError:
        return folder
    probe.unlink()
    folder.chmod(stat.S_IRWXU)
    try:
        os.close(os.open("/sys/attnlens-probe", os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except OSError:
        return "/sys" if os.path.isdir("/sys") else None
    os.unlink("/sys/attnlens-probe")
    return None


def test_a_read_only_folder_is_found_before_the_graph(checkpoint, tmp_path, capsys, no_graph):
    folder = _read_only_folder(tmp_path)
    if folder is None:
        pytest.skip("no folder here is read-only for this process")
    line = usage_error(capsys, ["graph", str(checkpoint), "the cat", "--out", str(folder)])
    assert line.startswith("attnlens graph: error: cannot write into the output folder")
    with pytest.raises(ValueError, match="cannot write into the output folder"):
        check_output(folder, "g")


# 5. CoPE's clamped flag in float32 -----------------------------------------------------------

def test_cope_clamped_is_dtype_aware_on_a_float32_model():
    """text-cope-l4mlp (float32, npos_max 513) cannot clamp on 10 tokens: the gate sum and the
    layer's own sum differ only by float32 rounding (21 of 220 entries said clamped with a
    fixed 1e-9)."""
    model = zoo.load("text-cope-l4mlp")
    assert model.cfg.dtype == torch.float32
    tokens = model.to_tokens("import os\nimport sys\nfrom os import")
    n = tokens.shape[1]
    flags = [cope_position_counts(model, tokens, 3, h, q, k).clamped
             for h in range(model.cfg.n_heads) for q in range(n) for k in range(q + 1)]
    assert len(flags) == 220 and not any(flags)


def test_cope_clamped_still_says_when_the_cap_applies():
    model = tiny_model("cope", attn_cfg=dict(npos_max=3), n_ctx=16)
    assert model.cfg.dtype == torch.float32
    tokens = torch.arange(12)[None] % model.cfg.d_vocab
    counts = [cope_position_counts(model, tokens, 1, 0, 11, k) for k in range(12)]
    for c in counts:
        assert c.clamped == (float(c.gates.sum()) > 2 + 1e-4), (c.position, c.gates.sum())
        if c.clamped:
            assert c.position == pytest.approx(2.0)
    assert counts[0].clamped and not counts[-1].clamped


# 6. prompts no tokenizer can encode ---------------------------------------------------------

def test_bad_prompt_characters_are_named(checkpoint, capsys, no_graph):
    from attnlens.hooked_models import HookedVariantTransformer

    model = HookedVariantTransformer.from_pretrained(checkpoint)
    tcs = {layer: Transcoder(TranscoderConfig(d_in=model.cfg.d_model, d_sae=8,
                                              d_out=model.cfg.d_model, activation="topk", k=2,
                                              layer=layer), seed=layer)
           for layer in range(model.cfg.n_layers)}
    with pytest.raises(ValueError, match=r"lone surrogate '\\ud800' at character 3"):
        clean_run(model, tcs, "cat\ud800")
    with pytest.raises(ValueError, match=r"undecodable byte 0xff .* at character 4"):
        pattern_sources(model_and_transcoders("dcmha")[0], "the \udcff cat", 0, 0, 1, 0)
    with pytest.raises(ValueError, match="at character 0"):
        cope_position_counts(model, "\udc80", 0, 0, 0, 0)
    # a non-UTF-8 byte in argv arrives as a surrogate escape
    line = usage_error(capsys, ["graph", str(checkpoint), "the \udcff cat"])
    assert line == ("attnlens graph: error: the prompt has the undecodable byte 0xff (the prompt "
                    "is not valid UTF-8) '\\udcff' at character 4: it must be valid Unicode "
                    "text")
    line = usage_error(capsys, ["graph", str(checkpoint), "the cat", "--target", "a\ud800"])
    assert "--target 'a\\ud800' has a lone surrogate '\\ud800' at character 1" in line
    with pytest.raises(ValueError, match="target 'a\\\\udcff' has the undecodable byte 0xff"):
        resolve_targets(model, ["a\udcff"])


# 7. negative counts ------------------------------------------------------------------------

@pytest.mark.parametrize("argv, message", [
    (["graph", "M", "x", "--contexts", "-3"], "argument --contexts: must be an integer >= 0"),
    (["graph", "M", "x", "--show", "-5"], "argument --show: must be an integer >= 0"),
    (["graph", "M", "x", "--batch-size", "0"], "argument --batch-size: must be an integer >= 1"),
    (["graph", "M", "x", "--show", "two"], "argument --show: 'two' is not an integer"),
    (["circuit", "M", "--show", "-1"], "argument --show: must be an integer >= 0"),
    (["circuit", "M", "--top-k", "0"], "argument --top-k: must be an integer >= 1"),
    (["circuit", "M", "--prompts", "-2"], "argument --prompts: must be an integer >= 1"),
    (["circuit", "M", "--steps", "0"], "argument --steps: must be an integer >= 1"),
])
def test_negative_counts_are_refused(argv, message, checkpoint, capsys, no_graph):
    argv = [str(checkpoint) if a == "M" else a for a in argv]
    assert message in usage_error(capsys, argv)


# 8. map entries out of range ---------------------------------------------------------------

@pytest.mark.parametrize("call", ["pattern_sources", "cope_position_counts"])
def test_map_entries_are_checked(call):
    case = "dcmha" if call == "pattern_sources" else "cope"
    model, _ = model_and_transcoders(case)
    fn = pattern_sources if call == "pattern_sources" else cope_position_counts
    tokens = prompt(model)                       # 11 tokens, 2 layers, 4 heads
    for args, message in [((1, -1, 5, 3), r"head=-1 is out of range \(0 .. 3\)"),
                          ((1, 4, 5, 3), r"head=4 is out of range \(0 .. 3\)"),
                          ((2, 0, 5, 3), r"layer=2 is out of range \(0 .. 1\)"),
                          ((-1, 0, 5, 3), r"layer=-1 is out of range"),
                          ((1, 0, 11, 3), r"query_pos=11 is out of range \(0 .. 10\)"),
                          ((1, 0, 5, -1), r"key_pos=-1 is out of range"),
                          ((1, 0, 3, 5), "key_pos 5 is after query_pos 3: a causal head"),
                          ((1, 0, 5.0, 3), "query_pos must be an int, got 5.0"),
                          ((1, True, 5, 3), "head must be an int, got True")]:
        with pytest.raises(ValueError, match=message):
            fn(model, tokens, *args)


# 9. attribute's and prune's arguments ------------------------------------------------------

def test_attribute_checks_its_arguments(small):
    model, tcs, graph = small
    p = prompt(model)
    for targets, message in [([], "targets is empty"),
                             ([1.7], "target 1.7 is a float: give a token id"),
                             ([2.0], "target 2.0 is a float"),
                             ([True], "target True is a bool"),
                             (True, "target True is a bool"),
                             ([None], "target None is a NoneType"),
                             (torch.tensor([1.5]), "is a Tensor"),
                             ([-1], "outside the vocabulary"),
                             ({"a": 1}, "targets must be a token id")]:
        with pytest.raises(ValueError, match=message):
            attribute(model, tcs, p, targets=targets)
    assert resolve_targets(model, torch.tensor([3, 4])).tolist() == [3, 4]
    assert resolve_targets(model, 3).tolist() == [3]
    assert resolve_targets(model, [np.int64(3), torch.tensor(4)]).tolist() == [3, 4]
    assert resolve_targets(model, np.int64(5)).tolist() == [5]
    for bad, message in [(None, "prompt must be a str or a \\[1, pos\\] tensor of token ids, "
                                "got NoneType"),
                         (b"abc", "got bytes \\(decode it to str first\\)"),
                         (p.double(), "integer token ids"),
                         (p[0], "one prompt at a time")]:
        with pytest.raises(ValueError, match=message):
            attribute(model, tcs, bad)
    for threshold in (True, False, "0.8", float("nan"), 1.5, 0, None):
        with pytest.raises(ValueError, match="node_threshold must be in \\(0, 1\\]"):
            prune(graph, threshold)
        with pytest.raises(ValueError, match="edge_threshold must be in \\(0, 1\\]"):
            prune(graph, 0.8, threshold)
    assert prune(graph, 1, 1).node_threshold == 1


def test_transcoders_must_sit_at_their_own_layers(small):
    model, tcs, _ = small
    p = prompt(model)
    with pytest.raises(ValueError, match=r"transcoders\[0\] was trained for layer 1"):
        attribute(model, {0: tcs[1], 1: tcs[0]}, p)
    with pytest.raises(ValueError, match=r"keys \[2\] that are not layers"):
        attribute(model, {**tcs, 2: tcs[1]}, p)
    with pytest.raises(ValueError, match="transcoders must be a dict"):
        attribute(model, [tcs[0], tcs[1]], p)
    moved = Transcoder(TranscoderConfig(**{**tcs[1].cfg.to_dict(), "dtype": torch.float64,
                                           "layer": None}))
    assert moved.cfg.hook_name == "blocks.1.ln2.hook_normalized"
    with pytest.raises(ValueError, match=r"transcoders\[0\] reads or replaces "
                                         r"'blocks.1.ln2.hook_normalized'"):
        attribute(model, {0: moved, 1: tcs[1]}, p)
    plain = Transcoder(TranscoderConfig(d_in=model.cfg.d_model, d_sae=8, d_out=model.cfg.d_model,
                                        activation="topk", k=2, dtype=torch.float64))
    clean_run(model, {0: plain, 1: tcs[1]}, p)       # no stored layer: nothing to contradict


# 10. hints that name something that works ----------------------------------------------------

def test_missing_transcoders_hint_names_what_works(tmp_path, capsys):
    bare = tmp_path / "bare"
    tiny_model("mha", tokenizer_alphabet=ALPHABET).save_pretrained(bare)
    with pytest.raises(SystemExit) as info:
        main(["graph", str(bare), "the cat"])
    message = str(info.value)
    assert "has no transcoders" in message and "transcoder_train" in message
    assert "transcoders train bare" not in message          # that command refuses "bare"
    assert "takes only the zoo's MLP models: text-mha-l4mlp" in message
    # a zoo MLP model in the zoo's own folder: the lab's command, which takes that name
    from attnlens.lab import transcoders as lab

    hint = missing_transcoders(zoo.path("text-mha-l4mlp"), FileNotFoundError("none"))
    assert hint.endswith("`python -m attnlens.lab.transcoders train text-mha-l4mlp`")
    with pytest.raises(SystemExit):        # a name the lab refuses is never suggested to it
        lab.main(["train", "bare"])
    capsys.readouterr()


def test_circuit_findblock_on_another_model_names_the_option(capsys):
    line = usage_error(capsys, ["circuit", "text-mha-l2", "--task", "findblock"])
    assert line.startswith("attnlens circuit: error: text-mha-l2 is not one of the zoo's "
                           "find-the-block models")
    assert "--variant first|last|all" in line and "variant=" not in line
    line = usage_error(capsys, ["circuit", "text-mha-l2", "--variant", "last"])
    assert "--variant is the find-the-block answer variant: it goes with --task findblock" in line
    model = zoo.load("text-mha-l2")
    assert find_block_variant(model, Namespace(variant="last", model="x")) == "Last"
    assert find_block_variant(zoo.load("mta-findblock-first-mta-s0"),
                              Namespace(variant=None, model="x")) == "First"
