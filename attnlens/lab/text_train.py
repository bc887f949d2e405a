"""Train, evaluate and release the text-language-model zoo (`attnlens train --zoo text`).

    attnlens train --zoo text --device cuda          all 15 recipes, resumable, into
                                                     ~/.cache/attnlens/lab-text (default_runs_dir)
    attnlens train --zoo text --measure              tokens per wall- and CPU-second of each
                                                     recipe, and its projected time
    attnlens train --zoo text --smoke                the whole pipeline in seconds (never a zoo)

Each recipe trains in `OUT/runs/<name>/` (checkpoints every 250 steps, metrics.jsonl); a killed
run continues from its last checkpoint when the command is run again. When a run is complete it
is released to `RELEASE/<name>/`: fp16 weights, tokenizer.json, eval_tokens.safetensors, the
metrics log and card.json written by the evaluation. RELEASE defaults to `OUT/release`; only a
full-budget run may be released into `hooked_models/zoo` (`--release-to hooked_models/zoo`).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from attnlens.hooked_models.model import HookedVariantTransformer
from attnlens.hooked_models.tokenizers.bpe import BPETokenizer, cached_stream, train_bpe
from attnlens.interp.tools.text_eval import (
    evaluate_windows,
    induction_probe,
    save_eval_tokens,
    text_repeat_probe,
    val_windows,
)
from attnlens.lab.run_progress import describe, progress
from attnlens.lab.text_recipes import (
    RECIPES,
    SMOKE,
    VOCAB_SIZE,
    flops_per_token,
    get_recipe,
    package_pins,
    run_seed,
)
from attnlens.lab.text_recipes import train_config as make_train_config
from attnlens.training.corpus import DEFAULT_VAL_FRACTION, Corpus, stdlib_root
from attnlens.training.package_corpus import PackageCorpus
from attnlens.training.train_state import (
    latest_checkpoint,
    read_train_state,
    runs_root,
    thin_metrics,
)
from attnlens.training.trainer import METRICS_FILE, fit

# A release's training log keeps every evaluation row and every 10th step's training row
# (attnlens.training.train_state.thin_metrics): 10,000 rows of ~1.1 MB become ~1,040 of ~0.1 MB.
RELEASE_METRICS_EVERY = 10


def default_runs_dir() -> Path:
    """Where `attnlens train --zoo text` keeps runs by default: `runs_root()/zoo-text`, i.e.
    `$ATTNLENS_RUNS/zoo-text`, else `~/.cache/attnlens/lab-text`, outside the work tree (the old
    default, `out/zoo-text`, never reached the next session)."""
    return runs_root() / "zoo-text"


@dataclass
class TextData:
    corpus: Corpus
    tokenizer: BPETokenizer
    train: np.ndarray
    val: np.ndarray


def prepare_data(cache_dir, vocab_size: int = VOCAB_SIZE, max_files: int | None = None,
                 root=None, val_fraction: float = DEFAULT_VAL_FRACTION) -> TextData:
    """The stdlib corpus, its BPE tokenizer and token streams (all cached under `cache_dir`)."""
    cache_dir = Path(cache_dir)
    corpus = Corpus.from_directory(root or stdlib_root(), val_fraction=val_fraction,
                                   max_files=max_files)
    tok_path = cache_dir / f"tokenizer-{corpus.fingerprint[:16]}-{vocab_size}.json"
    if tok_path.is_file():
        tokenizer = BPETokenizer.from_file(tok_path)
    else:
        tokenizer = train_bpe(corpus.texts("train"), vocab_size=vocab_size)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save(tok_path)
    return TextData(corpus, tokenizer, cached_stream(tokenizer, corpus, "train", cache_dir),
                    cached_stream(tokenizer, corpus, "val", cache_dir))


def training_stream(name: str, data: TextData, cache_dir) -> tuple[np.ndarray, dict | None]:
    """Recipe `name`'s training token stream and, for a "stdlib+packages" recipe, the record of
    its package corpus for the card (None for the standard library alone). The package sources'
    stream, in the zoo's tokenizer, is cached under `cache_dir` like the standard library's."""
    if get_recipe(name).corpus == "stdlib":
        return data.train, None
    extra = PackageCorpus.from_installed(package_pins(), data.corpus)
    stream = cached_stream(data.tokenizer, extra, "train", cache_dir)
    return np.concatenate([data.train, stream]), extra.describe() | {
        "tokens": int(len(stream)), "stdlib_train_tokens": int(len(data.train))}


def window_sampler(stream: np.ndarray, n_ctx: int, bos: int, repeat_fraction: float = 0.0,
                   span: tuple[int, int] = (20, 100), span_tokens: str = "text",
                   vocab_size: int | None = None, toy_schedule=(), toy_copy: str = "varied",
                   toy_vocab: int | None = None, ctx_schedule=(), start_step: int = 0):
    """Batches of `[BOS] + n_ctx-1` tokens from uniformly random offsets of `stream`.

    Every context starts with BOS, like `to_tokens(prepend_bos=True)` at analysis time.
    With `repeat_fraction` > 0 (the documented data mix of issue 26, stated on the card), that
    fraction of contexts, on average, has one span of `span[0]..span[1]` of its own tokens
    copied to a later place in the same context, so a copy of earlier text appears more often
    than natural text has one. With `span_tokens="random"` both copies of the span are ids
    drawn uniformly from `1..vocab_size-1` instead of the context's own text (a random-token
    repeat pasted into natural text, the toy induction task's signal). Every draw comes from
    the run's generator (exact resume); with the default 0 no extra draw is made, so
    natural-text runs are unchanged by this option.

    `toy_schedule`, a sequence of `(steps, ctx)` phases, is a curriculum: the run's first
    batches are the toy induction task instead (`toy_rows`), `[BOS] r r s` with r and s random
    ids of `1..vocab_size-1` (`1..toy_vocab-1` when given: the BPE ids are in merge order, so
    low ids are the bytes) in contexts of `ctx` tokens, `batch x n_ctx // ctx` of them so that
    a step holds the same number of tokens; natural text (with the mix above) follows. |r| is
    drawn per context (`toy_copy="varied"`); "fixed" makes it half the context, which a head
    that attends |r| back solves without induction, as the calibration found. The sampler
    counts the batches it has served from `start_step`, the step a resumed run continues from,
    so a resumed run gets the batches the uninterrupted run would.

    `ctx_schedule`, `(steps, ctx)` phases after the toy ones, is a context-length curriculum on
    the natural text: `batch x n_ctx // ctx` windows of `ctx` tokens per step (the same tokens
    per step, the data mix applied within each window), then windows of `n_ctx`. With rotary
    positions the model is the same at every length; the calibration found induction heads
    forming at n_ctx 256 in steps where n_ctx 512 formed none.
    """
    body = n_ctx - 1
    if len(stream) <= body:
        raise ValueError(f"training stream has {len(stream)} tokens; need more than {body}")
    if not 0.0 <= repeat_fraction <= 1.0:
        raise ValueError(f"repeat_fraction must be in [0, 1], got {repeat_fraction}")
    toy_ends = schedule_phase_ends(toy_schedule, n_ctx)
    text_ends = schedule_phase_ends(ctx_schedule, n_ctx, start=toy_ends[-1][0] if toy_ends else 0,
                               what="ctx_schedule")
    shortest = min([ctx for _, ctx in text_ends] + [n_ctx]) - 1
    lo, hi = span
    if repeat_fraction and not 1 <= lo <= hi <= shortest // 2 - 1:
        raise ValueError(f"span {span} must satisfy 1 <= lo <= hi <= {shortest // 2 - 1} "
                         f"(half the shortest context of {shortest} tokens)")
    if span_tokens not in ("text", "random"):
        raise ValueError(f"span_tokens must be 'text' or 'random', got {span_tokens!r}")
    if (span_tokens == "random" or toy_schedule) and (vocab_size is None or vocab_size < 2):
        raise ValueError(f"span_tokens='random' and toy_schedule need vocab_size >= 2, "
                         f"got {vocab_size}")
    toy_high = vocab_size if toy_vocab is None else toy_vocab
    if toy_vocab is not None and not 2 <= toy_vocab <= (vocab_size or 0):
        raise ValueError(f"toy_vocab must be in [2, vocab_size={vocab_size}], got {toy_vocab}")
    if toy_copy not in ("varied", "fixed"):
        raise ValueError(f"toy_copy must be 'varied' or 'fixed', got {toy_copy!r}")
    if start_step < 0:
        raise ValueError(f"start_step must be >= 0, got {start_step}")
    served = [start_step]
    data = torch.from_numpy(stream.astype(np.int64))

    def text_rows(n: int, body: int, gen: torch.Generator) -> torch.Tensor:
        starts = torch.randint(0, len(data) - body, (n,), generator=gen)
        rows = torch.stack([data[s:s + body] for s in starts.tolist()])
        if repeat_fraction:
            repeat = torch.rand(n, generator=gen) < repeat_fraction
            draws = torch.rand(n, 3, generator=gen)
            for i in repeat.nonzero().flatten().tolist():
                k = lo + int(draws[i, 0] * (hi - lo + 1))
                a = int(draws[i, 1] * (body - 2 * k + 1))
                b = a + k + int(draws[i, 2] * (body - k - (a + k) + 1))
                if span_tokens == "random":
                    rows[i, a:a + k] = torch.randint(1, vocab_size, (k,), generator=gen)
                rows[i, b:b + k] = rows[i, a:a + k].clone()
        return rows

    def sample(batch: int, gen: torch.Generator):
        served[0] += 1
        toy_ctx = next((ctx for end, ctx in toy_ends if served[0] <= end), None)
        text_ctx = next((ctx for end, ctx in text_ends if served[0] <= end), n_ctx)
        if toy_ctx is not None:
            rows = toy_rows(batch * n_ctx // toy_ctx, toy_ctx - 1, toy_high, toy_copy, gen)
        else:
            rows = text_rows(batch * n_ctx // text_ctx, text_ctx - 1, gen)
        return torch.cat([torch.full((len(rows), 1), bos, dtype=torch.long), rows], 1), None

    return sample


def schedule_phase_ends(schedule, n_ctx: int, start: int = 0,
                   what: str = "toy_schedule") -> list[tuple[int, int]]:
    """`[(last step of the phase, ctx)]` of a schedule of `(steps, ctx)` phases that begins
    after step `start`."""
    ends, total = [], start
    for steps, ctx in schedule:
        if steps < 1 or not 3 <= ctx <= n_ctx:
            raise ValueError(f"{what} phase ({steps}, {ctx}): need steps >= 1 and "
                             f"3 <= ctx <= n_ctx={n_ctx}")
        total += steps
        ends.append((total, ctx))
    return ends


def toy_rows(n: int, body: int, high: int, copy: str, gen: torch.Generator) -> torch.Tensor:
    """`[n body]` rows of the toy induction task, ids in `1..high-1`: `r r` ("fixed", |r| half
    the row) or `r r s` with |r| drawn per row from body/8 to body/2 ("varied")."""
    if copy == "fixed":
        r = torch.randint(1, high, (n, (body + 1) // 2), generator=gen)
        return torch.cat([r, r], 1)[:, :body]
    rows = torch.randint(1, high, (n, body), generator=gen)
    # the copy's length, so its offset, varies by row: a head that attends a fixed distance
    # back cannot solve the task, an induction head can
    lengths = torch.randint(max(1, body // 8), body // 2 + 1, (n,), generator=gen)
    for i, length in enumerate(lengths.tolist()):
        rows[i, length:2 * length] = rows[i, :length]
    return rows


def build_model(name: str, data: TextData, device: str, seed: int = 0, smoke: bool = False):
    recipe = get_recipe(name)
    arch = SMOKE["arch"] if smoke else None
    attn_cfg = SMOKE["attn_cfg"].get(recipe.variant) if smoke else None
    cfg = recipe.config(d_vocab=data.tokenizer.vocab_size, seed=seed, arch=arch,
                        attn_cfg=attn_cfg)
    cfg.device = device
    model = HookedVariantTransformer(cfg, tokenizer=data.tokenizer)
    if recipe.embed_std is not None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            model.W_E.copy_(torch.randn(model.W_E.shape, generator=gen) * recipe.embed_std)
    return model


def train_recipe(name: str, data: TextData, out_dir, device: str = "cpu", seed: int = 0,
                 smoke: bool = False, progress: bool = True, command: str | None = None) -> Path:
    """Train (or resume) recipe `name` in `out_dir/runs/name`; returns that run directory.
    A recipe with its own seed (text_recipes.COMPARISON_RECIPES) trains with it, not `seed`."""
    seed = run_seed(name, seed)
    model = build_model(name, data, device, seed=seed, smoke=smoke)
    overrides = SMOKE["train"] if smoke else get_recipe(name).train_overrides
    tcfg = make_train_config(overrides, seed=seed, progress=progress)
    windows = val_windows(data.val, model.cfg.n_ctx, data.tokenizer.bos_token_id)

    def evaluate(m):
        losses = m(windows[:16].to(m.W_E.device), return_type="loss")
        probe = induction_probe(m, batch=4) | text_repeat_probe(m, windows, batch=4)
        probe.pop("table")
        return {"val_loss": round(float(losses), 4)} | {
            k: round(v, 4) for k, v in probe.items()}

    run_dir = Path(out_dir) / "runs" / name
    mix = dict(get_recipe(name).data_mix or {})
    curriculum = mix.pop("ctx_schedule", None)
    if smoke and curriculum:   # the smoke model's context is 64 tokens
        curriculum = SMOKE["ctx_schedule"]
    card = {"recipe": name, "train_command": command, "device": device,
            "data_mix": mix or "natural text"}
    stream, extra_corpus = training_stream(name, data, Path(out_dir) / "cache")
    if extra_corpus:
        card["extra_corpus"] = extra_corpus
    if curriculum:
        card["ctx_schedule"] = curriculum
    ckpt = latest_checkpoint(run_dir)
    start_step = read_train_state(ckpt)["step"] if ckpt else 0
    if ckpt and (ckpt / "card.json").is_file():   # a run started from another's (run_fork)
        forked = json.loads((ckpt / "card.json").read_text()).get("forked_from")
        if forked:
            card["forked_from"] = forked
    sampler = window_sampler(stream, model.cfg.n_ctx, data.tokenizer.bos_token_id,
                             vocab_size=data.tokenizer.vocab_size, start_step=start_step,
                             ctx_schedule=curriculum or (), **mix)
    fit(model, sampler, tcfg,
        run_dir=run_dir, evaluate=evaluate, card=card)
    return run_dir


def card_timing(run_dir: Path, state: dict) -> dict:
    """The card's `wall_time_s`, `cpu_time_s` and `timed_from_step` (+ `timing_note`).

    From the checkpoint's `timing` (the trainer's count over the steps the checkpoint holds,
    carried across resumes). Runs begun before it was kept fall back on `wall_time.json` /
    `cpu_time.json`, sums over the training processes that ran to their end, which leave out
    the time of interrupted ones; the note says so.
    """
    timing = state.get("timing")
    if timing is not None:
        out = {"wall_time_s": timing["wall_s"], "cpu_time_s": timing["cpu_s"],
               "timed_from_step": timing["from_step"]}
        if timing["from_step"]:
            out["timing_note"] = (f"times cover steps {timing['from_step']}-{state['step']} "
                                  "only: the earlier checkpoints kept no timing")
        return out

    def legacy(name: str) -> float | None:
        path = run_dir / name
        return round(json.loads(path.read_text())["seconds"], 3) if path.is_file() else None

    return {"wall_time_s": legacy("wall_time.json"), "cpu_time_s": legacy("cpu_time.json"),
            "timed_from_step": None,
            "timing_note": "sums over the training processes that ran to their end; the "
                           "processes interrupted before them are not counted (a lower bound)"}


def release(name: str, run_dir, data: TextData, release_dir, device: str = "cpu",
            command: str = "", smoke: bool = False) -> Path:
    """Write the fp16 release of a finished run and its card (measured on the fp16 weights)."""
    run_dir, out = Path(run_dir), Path(release_dir) / name
    ckpt = latest_checkpoint(run_dir)
    if ckpt is None:
        raise ValueError(f"{run_dir} holds no checkpoint to release")
    state = read_train_state(ckpt)
    tcfg = state["train_config"]
    if state["step"] != tcfg["steps"]:
        raise ValueError(f"{run_dir} stopped at step {state['step']} of {tcfg['steps']}: "
                         "finish the run (run the command again) before releasing")
    model = HookedVariantTransformer.from_pretrained(ckpt, device="cpu")
    model.save_pretrained(out, weights_dtype=torch.float16)
    save_eval_tokens(out, val_windows(data.val, model.cfg.n_ctx, data.tokenizer.bos_token_id))
    metrics_log = thin_metrics(run_dir / METRICS_FILE, out / METRICS_FILE,
                               RELEASE_METRICS_EVERY)
    released = HookedVariantTransformer.from_pretrained(out, device=device)
    from attnlens.interp.tools.text_eval import load_eval_tokens

    metrics = evaluate_windows(released, load_eval_tokens(out))
    card = {"kind": "text-lm", "recipe": name, "smoke_test_only": smoke,
            "train_command": command, "eval_command": f"python -m attnlens.lab.evaluate {name}",
            "seed": tcfg["seed"], "steps": state["step"], "tokens": state["tokens"],
            "train_config": tcfg, "device": (model.card or {}).get("device"),
            "device_name": _device_name((model.card or {}).get("device")),
            "parameters": sum(p.numel() for p in model.parameters()),
            "corpus": data.corpus.describe(),
            "tokenizer": {"kind": "byte-level BPE (HF tokenizers)",
                          "vocab_size": data.tokenizer.vocab_size,
                          "sha256": data.tokenizer.sha256},
            "weights_dtype": "float16", "python": platform.python_version(),
            "torch": torch.__version__, "metrics": metrics, "metrics_log": metrics_log,
            **card_timing(run_dir, state)}
    for key in ("ctx_schedule", "forked_from", "extra_corpus"):
        if (model.card or {}).get(key):
            card[key] = model.card[key]
    (out / "card.json").write_text(json.dumps(card, indent=2, sort_keys=True))
    return out


def _device_name(device: str | None) -> str:
    if device and device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(torch.device(device))
    return _cpu_model() or platform.processor() or platform.machine()


def _cpu_model() -> str | None:
    """The CPU's model name (Linux /proc/cpuinfo) with its core count, or None."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return None
    names = [ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")]
    return f"{names[0]} ({len(names)} cores)" if names else None


def measure(names, data: TextData, device: str, steps: int = 3, batch: int | None = None,
            smoke: bool = False) -> list[dict]:
    """Tokens per wall-second and per CPU-second (all of the process's threads) of a few
    training steps of each recipe (the first step is a warm-up), and the projected time of the
    recipe's whole budget: `projected_s` in wall seconds at the wall pace, `projected_cpu_s` in
    CPU seconds at the CPU pace (on a shared machine the wall pace depends on the load, the CPU
    pace much less)."""
    rows = []
    for name in names:
        model = build_model(name, data, device, smoke=smoke)
        tcfg = make_train_config(SMOKE["train"] if smoke else get_recipe(name).train_overrides,
                                 progress=False)
        bsz = batch or tcfg.batch_size
        sample = window_sampler(data.train, model.cfg.n_ctx, data.tokenizer.bos_token_id)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        use_bf16 = device.startswith("cuda")
        gen = torch.Generator().manual_seed(0)
        times, cpu_times = [], []
        for _ in range(steps + 1):
            tokens = sample(bsz, gen)[0].to(device)
            t0, c0 = time.perf_counter(), time.process_time()
            with torch.autocast(device_type=torch.device(device).type, dtype=torch.bfloat16,
                                enabled=use_bf16):
                loss = model(tokens, return_type="loss")
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            cpu_times.append(time.process_time() - c0)
        measured = bsz * model.cfg.n_ctx * steps
        tok_s = measured / sum(times[1:])
        tok_cpu_s = measured / max(sum(cpu_times[1:]), 1e-9)
        budget = tcfg.steps * tcfg.batch_size * model.cfg.n_ctx
        rows.append({"recipe": name, "parameters": sum(p.numel() for p in model.parameters()),
                     "flops_per_token": flops_per_token(model.cfg), "tokens_per_s": round(tok_s),
                     "tokens_per_cpu_s": round(tok_cpu_s), "budget_tokens": budget,
                     "projected_s": round(budget / tok_s),
                     "projected_cpu_s": round(budget / tok_cpu_s)})
    return rows


def queue_status(out_dir, names, release_dir=None) -> list[dict]:
    """Where each recipe's run stands: `attnlens.lab.run_progress.progress` (steps done of the
    total, tokens, CPU hours, the recent pace and the time left) and whether it is released."""
    out_dir = Path(out_dir)
    release_dir = Path(release_dir) if release_dir else out_dir / "release"
    return [{"recipe": name, **progress(out_dir / "runs" / name),
             "released": released_under(release_dir / name, name)} for name in names]


def released_under(directory: Path, name: str) -> str | None:
    """Whether `directory` holds a release of recipe `name` as it stands: "current", "older
    recipe" (a card whose train config is not the recipe's today, e.g. a model shipped before
    the recipe changed, which the run replaces when it is released) or None."""
    card_path = directory / "card.json"
    if not card_path.is_file():
        return None
    card = json.loads(card_path.read_text())
    if card.get("smoke_test_only"):
        return "current"
    today = json.loads(json.dumps(make_train_config(get_recipe(name).train_overrides,
                                                    seed=card.get("seed", 0)).to_dict()))
    return "current" if card.get("train_config") == today else "older recipe"


def print_queue_status(rows: list[dict], file=None, shipped=()) -> None:
    """One line per recipe (on stderr unless `file`): shipped (the recipes in `shipped`),
    done, in progress (step x of y, CPU hours so far, time left at the recent pace) or not
    started."""
    for r in rows:
        if r["released"] == "current":
            what = "done (released)"
        elif r["step"]:
            what = describe(r)
        else:
            what = "not started"
        if r["released"] == "older recipe":
            what += "; the release there is of an older recipe, replaced when this one ends"
        if r["recipe"] in shipped:   # a run of a shipped recipe is shown only if it exists
            what = "shipped in hooked_models/zoo" + (f"; run: {what}" if r["step"] else "")
        print(f"[attnlens train] {r['recipe']:<18} {what}", file=file or sys.stderr)


def shipped_recipes(names, zoo_dir) -> list[str]:
    """The recipes among `names` whose model in `zoo_dir` is a release of today's recipe."""
    return [n for n in names if released_under(Path(zoo_dir) / n, n) == "current"]


def train_zoo(out_dir, device: str = "cpu", names=None, seed: int = 0, smoke: bool = False,
              release_to=None, progress: bool = True, command: str = "",
              skip_shipped_in=None) -> list[Path]:
    """Train every recipe in `names` (default: all 15), resuming finished or partial runs;
    with `skip_shipped_in` (a zoo directory), not those already shipped there at today's
    recipe (a fresh machine then trains only what is missing, not the whole zoo again)."""
    names = list(names or RECIPES)
    for n in names:
        get_recipe(n)
    if skip_shipped_in is not None:
        shipped = shipped_recipes(names, skip_shipped_in)
        for n in shipped:
            print(f"[attnlens train] {n:<18} shipped in {skip_shipped_in} (today's recipe): "
                  "skipped", file=sys.stderr)
        names = [n for n in names if n not in shipped]
    out_dir = Path(out_dir)
    data = prepare_data(out_dir / "cache", vocab_size=SMOKE["vocab_size"] if smoke else VOCAB_SIZE,
                        max_files=SMOKE["max_files"] if smoke else None,
                        val_fraction=SMOKE["val_fraction"] if smoke else DEFAULT_VAL_FRACTION)
    print_queue_status(queue_status(out_dir, names, release_to))
    released = []
    for name in names:
        print(f"[attnlens train] {name} on {device}", file=sys.stderr)
        run_dir = train_recipe(name, data, out_dir, device=device, seed=seed, smoke=smoke,
                               progress=progress, command=command)
        released.append(release(name, run_dir, data, release_to or out_dir / "release",
                                device=device, command=command, smoke=smoke))
    return released
