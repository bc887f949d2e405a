"""Analysis sweeps: many models x prompt sets x analyses, sharded, resumable, optionally on Ray.

    attnlens sweep SPEC [--out DIR] [--ray [ADDRESS]] [--workers N]

Modules: `spec` (YAML/JSON specs, validated), `prompts` (task generators and text files),
`analyses` (the registry of analyses), `shards` (plan, keys, the pure shard runner), `store`
(Parquet + manifest, merge), `summary`, `figures`, `ray_backend`, `runner` (`run_sweep`).

Example:
    >>> from attnlens.interp.sweep import run_sweep
    >>> result = run_sweep({"models": ["induction-mha"],
    ...                     "prompts": [{"task": "induction", "count": 32}],
    ...                     "analyses": ["heads"]}, out="runs/s1")        # doctest: +SKIP
"""

from attnlens.interp.sweep.analyses import ANALYSES
from attnlens.interp.sweep.runner import SweepResult, run_sweep
from attnlens.interp.sweep.spec import load_spec

__all__ = ["ANALYSES", "SweepResult", "load_spec", "run_sweep"]
