#!/usr/bin/env bash
# The text zoo's training queue on a 2-core CPU: two lanes of single-thread runs at the lowest
# priority, each resuming from its last checkpoint (run it again after any interruption).
#   bash scripts/zoo_queue.sh            # both lanes, in the background; logs in $OUT
# Runs live outside the work tree (each session lays the work tree anew from git, so a
# checkpoint under it never reaches the next session): $OUT, default
# ${ATTNLENS_RUNS:-~/.cache/attnlens}/zoo-text, which survives when the next session is handed
# the same machine. When it is not, a run starts again: size runs to finish in a session.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh   # .venv with attnlens installed (idempotent)
OUT=${OUT:-${ATTNLENS_RUNS:-$HOME/.cache/attnlens}/zoo-text}
mkdir -p "$OUT"
# Models shipped in hooked_models/zoo at today's recipe are skipped (`--skip-shipped`: a fresh
# machine, whose cache is empty, trains only what is missing); finished runs in $OUT are
# skipped in a second (they resume at their last step and release). Every
# recipe trains with the context curriculum (attnlens/lab/text_recipes.py: CTX_CURRICULUM); the
# 2-layer / 1-layer pairs come first, the costly variants (MTA, DCMHA) spread over both lanes,
# the 4-layer MLP models last. text-mha-l2 is shipped and not queued (its first 6,250 steps are the
# calibration run text-mha-l2-ctx256's, attnlens.lab.run_fork).
LANE_A=${LANE_A-"text-infini-l2 text-infini-l1 text-mta-l2 text-mta-l1
  text-mha-l4mlp text-infini-l4mlp text-mta-l4mlp"}
LANE_B=${LANE_B-"text-mha-l1 text-cope-l2 text-dcmha-l2 text-cope-l1 text-dcmha-l1
  text-cope-l4mlp text-dcmha-l4mlp"}
run_lane() {   # an empty lane (LANE_A="") runs nothing
  [ -n "${1//[[:space:]]/}" ] || return 0
  OMP_NUM_THREADS=1 nice -n 19 .venv/bin/attnlens train --zoo text --device cpu --threads 1 \
    --out "$OUT" --no-progress --skip-shipped --only $1 >> "$OUT/$2.log" 2>&1
}
# The corpus, tokenizer and token streams are built once, before the lanes share the cache.
OMP_NUM_THREADS=1 nice -n 19 .venv/bin/python -c "
from attnlens.lab.text_train import prepare_data
prepare_data('$OUT/cache')" >> "$OUT/prepare.log" 2>&1
run_lane "$LANE_A" lane-a &
run_lane "$LANE_B" lane-b &
wait
