"""The production line of attnlens: everything that trains, measures, writes or runs the project
rather than being imported by a researcher's analysis.

- `attnlens.cli`: the `attnlens` command line (demo, stages, serve, train, analyze, convert,
  sweep, circuit);
- `attnlens.training`: the training loop, resumable train state, stop signals, the corpora;
- `attnlens.zoo`: the zoo's recipes and training queues (text LMs, toy models, `zoo.paper`);
- `attnlens.reports`: the generators of docs/ and of the zoo's metadata;
- `attnlens.bench` and `attnlens.benchmarks`: the benchmark runner and scripts.

It is the top floor (docs/design.md): it may import `kernels`, `hooked_models`, `interp` and
`dashboards`; none of them imports it (tests/test_layering.py).
"""
