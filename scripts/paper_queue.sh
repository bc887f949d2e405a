#!/usr/bin/env bash
# The paper-task zoo's long runs (issue 24) on the CPU: one lane of single-thread runs at the
# lowest priority, each resuming from its last checkpoint (run it again after any interruption).
#   bash scripts/paper_queue.sh                  # in the foreground; log in $RUNS/paper.log
#   PAPER="infini-passkey-long-*" bash scripts/paper_queue.sh
#   PAPER="..." LOG=lane-2 bash scripts/paper_queue.sh   # a second lane beside the first
#   .venv/bin/python -m attnlens.lab.paper list "cope-*-long-*"   # shipped, or the step a run is at
# Runs live under $RUNS = ${ATTNLENS_RUNS:-~/.cache/attnlens}/paper-zoo, outside the work
# tree, so they continue in a later session on the same machine; each finished model is saved to
# hooked_models/zoo/<name>/ with its card and evaluated (`python -m attnlens.lab.paper train`).
# A run that is finished, shipped and evaluated is skipped (`_training.up_to_date`); one finished
# but not yet evaluated is saved and evaluated again.
# Cheapest first: DCMHA vs MHA on the conjunction task (about 5-12 CPU-minutes each), then the
# Infini passkey curriculum (about 0.3-1.3 CPU-s per step), then CoPE at 4 layers of d_model
# 128 (0.13-0.28 CPU-s per step; the paper's 4 x 256 does not fit: attnlens/lab/paper/cope.py),
# three seeds each, all to early stopping.
set -euo pipefail
set -f   # the recipe patterns below are for the train command, not for the shell
cd "$(dirname "$0")/.."
bash scripts/setup.sh   # .venv with attnlens installed (idempotent)
export ATTNLENS_RUNS=${ATTNLENS_RUNS:-$HOME/.cache/attnlens}
RUNS=$ATTNLENS_RUNS/paper-zoo
mkdir -p "$RUNS"
# CoPE: one task's three seeds before the next task's, so each result gets its intervals as
# early as possible.
PAPER=${PAPER:-"dcmha-conjunction-full-* infini-passkey-long-*
  cope-flipflop-*-long-s0 cope-flipflop-*-long-s1 cope-flipflop-*-long-s2
  cope-counting-3var-*-long-s0 cope-counting-3var-*-long-s1 cope-counting-3var-*-long-s2
  cope-counting-5var-*-long-s0 cope-counting-5var-*-long-s1 cope-counting-5var-*-long-s2"}
OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -m attnlens.lab.paper train $PAPER --resume \
  --threads 1 >> "$RUNS/${LOG:-paper}.log" 2>&1
