"""Sweep specs: parse a YAML or JSON file (or a dict) into a validated, normalised dict.

    models:                       # checkpoint directories or bundled zoo names
      - induction-mha
      - {name: mine, path: runs/ckpt, dtype: float64}
    prompts:                      # task generators (attnlens.interp.tasks) or text files, one per
    line
      - {name: rep, task: induction, count: 64, seed: 0, args: {half_len: 10}}
      - {name: notes, file: prompts.txt}
    analyses:                     # attnlens.interp.sweep.analyses.ANALYSES, with their arguments
      - heads
      - {name: heads_bos, analysis: heads, args: {exclude_bos: true}, prompts: [rep]}
      - composition
    shard_size: 16                # prompts per shard (default 16)
    device: cpu                   # cpu, cuda, cuda:N or auto
    threads: 1                    # torch threads while a shard runs

Relative paths (checkpoints, text files) are resolved against the spec file's folder. Every
problem raises ValueError naming the field (`models[1].path`, `prompts[0].count`, ...); an
unknown field is an error, never ignored.

Example:
    >>> spec = load_spec("sweep.yaml")                         # doctest: +SKIP
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from attnlens.hooked_models import zoo
from attnlens.interp.sweep.analyses import ANALYSES
from attnlens.interp.sweep.prompts import TASKS, read_lines

TOP = {"models", "prompts", "analyses", "shard_size", "device", "threads", "out"}
DTYPES = ("float32", "float64", "bfloat16", "float16")


def _fail(field: str, problem: str) -> ValueError:
    return ValueError(f"sweep spec: {field}: {problem}")


def _check_keys(field: str, entry: dict, allowed: set[str]) -> None:
    unknown = sorted(set(entry) - allowed)
    if unknown:
        raise _fail(field, f"unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def _positive_int(field: str, value, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(field, f"must be an integer >= {minimum}, got {value!r}")
    return value


def _name(field: str, value) -> str:
    if not isinstance(value, str) or not value or "/" in value:
        raise _fail(field, f"must be a non-empty string without '/', got {value!r}")
    return value


def _model(i: int, entry, base: Path) -> dict:
    field = f"models[{i}]"
    if isinstance(entry, str):
        entry = {"source": entry}
    if not isinstance(entry, dict):
        raise _fail(field, f"must be a zoo name, a checkpoint path or a mapping, got {entry!r}")
    _check_keys(field, entry, {"name", "path", "zoo", "source", "dtype"})
    given = [k for k in ("path", "zoo", "source") if k in entry]
    if len(given) != 1:
        raise _fail(field, "give exactly one of 'path' (checkpoint directory) or 'zoo' (name)")
    key, raw = given[0], entry[given[0]]
    if not isinstance(raw, str) or not raw:
        raise _fail(f"{field}.{key}", f"must be a non-empty string, got {raw!r}")
    path = (base / raw).expanduser()
    if key != "zoo" and (path / "config.json").is_file():
        resolved, default_name = path.resolve(), path.resolve().name
    elif key != "path" and raw in zoo.available():
        resolved, default_name = zoo.path(raw).resolve(), raw
    elif key == "path":
        raise _fail(f"{field}.path", f"{str(path)!r} is not a checkpoint directory "
                                     f"(no config.json)")
    else:
        raise _fail(f"{field}.{key}", f"{raw!r} is neither a checkpoint directory (with "
                                      f"config.json) nor a bundled zoo model: "
                                      f"{zoo.unknown_model_message(raw, zoo.available())}")
    dtype = entry.get("dtype")
    if dtype is not None and dtype not in DTYPES:
        raise _fail(f"{field}.dtype", f"{dtype!r}; choose from {list(DTYPES)}")
    return {"name": _name(f"{field}.name", entry.get("name", default_name)),
            "path": str(resolved), "dtype": dtype}


def _check_args(field: str, args, allowed: list[str]) -> dict:
    if not isinstance(args, dict):
        raise _fail(field, f"must be a mapping of argument names to values, got {args!r}")
    unknown = sorted(set(args) - set(allowed))
    if unknown:
        raise _fail(field, f"unknown argument(s) {unknown}; allowed: {allowed}")
    return dict(args)


def _task_arguments(task: str) -> list[str]:
    fn = getattr(TASKS[task], "__wrapped__", TASKS[task])
    skip = {"model", "batch", "count", "seed", "generator"}
    return [p for p in inspect.signature(fn).parameters if p not in skip]


def _prompt_set(i: int, entry, base: Path) -> dict:
    field = f"prompts[{i}]"
    if not isinstance(entry, dict):
        raise _fail(field, f"must be a mapping with 'task' or 'file', got {entry!r}")
    _check_keys(field, entry, {"name", "task", "file", "count", "seed", "args"})
    if ("task" in entry) == ("file" in entry):
        raise _fail(field, "give exactly one of 'task' (a generator) or 'file' (a text file)")
    if "task" in entry:
        task = entry["task"]
        if task not in TASKS:
            raise _fail(f"{field}.task", f"unknown task {task!r}; choose from {sorted(TASKS)}")
        if "count" not in entry:
            raise _fail(f"{field}.count", "a task prompt set needs a count")
        out = {"name": _name(f"{field}.name", entry.get("name", task)), "task": task,
               "count": _positive_int(f"{field}.count", entry["count"]),
               "seed": _positive_int(f"{field}.seed", entry.get("seed", 0), minimum=0),
               "args": _check_args(f"{field}.args", entry.get("args", {}),
                                   _task_arguments(task))}
        return out
    for key in ("seed", "args"):
        if key in entry:
            raise _fail(f"{field}.{key}", "only task prompt sets take a seed or arguments")
    raw = entry["file"]
    if not isinstance(raw, str) or not (base / raw).is_file():
        raise _fail(f"{field}.file", f"no text file {raw!r} (relative to {str(base)!r})")
    path = (base / raw).resolve()
    lines = read_lines(path)
    count = len(lines)
    if "count" in entry:
        count = _positive_int(f"{field}.count", entry["count"])
        if count > len(lines):
            raise _fail(f"{field}.count", f"{count} prompts asked; {raw!r} has {len(lines)} "
                                          f"non-empty lines")
    if count == 0:
        raise _fail(f"{field}.file", f"{raw!r} has no non-empty line")
    return {"name": _name(f"{field}.name", entry.get("name", path.stem)), "file": str(path),
            "count": count}


def _analysis(i: int, entry, prompt_names: list[str]) -> dict:
    field = f"analyses[{i}]"
    if isinstance(entry, str):
        entry = {"analysis": entry}
    if not isinstance(entry, dict) or "analysis" not in entry:
        raise _fail(field, f"must be an analysis name or a mapping with 'analysis', got {entry!r}")
    _check_keys(field, entry, {"name", "analysis", "args", "prompts"})
    kind = entry["analysis"]
    if kind not in ANALYSES:
        raise _fail(f"{field}.analysis", f"unknown analysis {kind!r}; choose from "
                                         f"{sorted(ANALYSES)}")
    spec = ANALYSES[kind]
    out = {"name": _name(f"{field}.name", entry.get("name", kind)), "analysis": kind,
           "args": _check_args(f"{field}.args", entry.get("args", {}), spec.arguments())}
    if not spec.uses_prompts:
        if "prompts" in entry:
            raise _fail(f"{field}.prompts", f"{kind!r} reads only the weights; it takes no "
                                            f"prompt sets")
        out["prompts"] = []
        return out
    chosen = entry.get("prompts", prompt_names)
    if not isinstance(chosen, list) or not chosen:
        raise _fail(f"{field}.prompts", f"must be a non-empty list of prompt-set names, got "
                                        f"{chosen!r}")
    unknown = [p for p in chosen if p not in prompt_names]
    if unknown:
        raise _fail(f"{field}.prompts", f"unknown prompt set(s) {unknown}; the spec has "
                                        f"{prompt_names}")
    out["prompts"] = list(chosen)
    return out


def _unique(field: str, entries: list[dict]) -> None:
    names = [e["name"] for e in entries]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise _fail(field, f"names must be unique; repeated: {dup} (set 'name')")


def _list(raw: dict, key: str, required: bool = True) -> list:
    value = raw.get(key, [] if not required else None)
    if not isinstance(value, list) or (required and not value):
        raise _fail(key, f"must be a non-empty list, got {value!r}")
    return value


def parse_spec(raw: dict, base: str | Path = ".") -> dict:
    """Validate a spec given as a dict; relative paths are resolved against `base`."""
    if not isinstance(raw, dict):
        raise _fail("spec", f"must be a mapping, got {type(raw).__name__}")
    _check_keys("spec", raw, TOP)
    base = Path(base)
    models = [_model(i, m, base) for i, m in enumerate(_list(raw, "models"))]
    prompts = [_prompt_set(i, p, base) for i, p in enumerate(raw.get("prompts") or [])]
    if "prompts" in raw and not isinstance(raw["prompts"], list):
        raise _fail("prompts", f"must be a list, got {raw['prompts']!r}")
    analyses = [_analysis(i, a, [p["name"] for p in prompts])
                for i, a in enumerate(_list(raw, "analyses"))]
    for key, entries in (("models", models), ("prompts", prompts), ("analyses", analyses)):
        _unique(key, entries)
    device = raw.get("device", "cpu")
    if not isinstance(device, str) or not (device in ("cpu", "cuda", "auto")
                                           or device.startswith("cuda:")):
        raise _fail("device", f"{device!r}; use cpu, cuda, cuda:N or auto")
    out = raw.get("out")
    if out is not None and not isinstance(out, str):
        raise _fail("out", f"must be a folder path, got {out!r}")
    return {"models": models, "prompts": prompts, "analyses": analyses,
            "shard_size": _positive_int("shard_size", raw.get("shard_size", 16)),
            "device": device, "threads": _positive_int("threads", raw.get("threads", 1)),
            "out": None if out is None else str((base / out).resolve())}


def load_spec(spec: str | Path | dict) -> dict:
    """A validated spec from a .yaml/.yml/.json file or a dict (paths relative to the cwd)."""
    if isinstance(spec, dict):
        return parse_spec(spec)
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"sweep spec: no file {str(path)!r}")
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            raw = yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ValueError(f"sweep spec: {path} is not valid YAML: {err}") from None
    elif path.suffix.lower() == ".json":
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"sweep spec: {path} is not valid JSON: {err}") from None
    else:
        raise ValueError(f"sweep spec: {path} must end in .yaml, .yml or .json")
    return parse_spec(raw, base=path.parent)
