#!/usr/bin/env bash
# Ship finished text-zoo runs: copy each release into hooked_models/zoo, add its calibration
# trajectory, run the studies on it, regenerate docs/zoo.md (its table of the text models) and
# re-execute the notebooks that load the zoo. What is left to a person: the findings
# (attnlens/reports/zoo_findings.py), the README's zoo.available listing, then the tests and the
# commit.
#   bash scripts/ship_text_models.sh                  # every released run not shipped yet
#   bash scripts/ship_text_models.sh text-mta-l4mlp   # these alone
#   DRY_RUN=1 bash scripts/ship_text_models.sh        # print the commands, run none
# Releases are read from $OUT/release (OUT as in scripts/zoo_queue.sh); a name with no finished
# release there is an error, and a model already in hooked_models/zoo is never overwritten.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-${ATTNLENS_RUNS:-$HOME/.cache/attnlens}/zoo-text}
ZOO=hooked_models/zoo
PY=".venv/bin/python"
run() { echo "+ $*" >&2; [ -n "${DRY_RUN:-}" ] || nice -n 10 "$@"; }

if [ $# -eq 0 ]; then
  names=()
  for d in "$OUT"/release/text-*/; do
    [ -f "$d/card.json" ] || continue
    n=$(basename "$d")
    [ -e "$ZOO/$n" ] || names+=("$n")
  done
  if [ ${#names[@]} -eq 0 ]; then
    echo "ship_text_models: no released run in $OUT/release is missing from $ZOO" >&2
    exit 0
  fi
else
  names=("$@")
fi
for n in "${names[@]}"; do
  if [ ! -f "$OUT/release/$n/card.json" ]; then
    echo "ship_text_models: $n has no finished release in $OUT/release/$n (attnlens train" \
         "--zoo text --status says where its run stands)" >&2
    exit 2
  fi
  if [ -e "$ZOO/$n" ]; then
    echo "ship_text_models: $ZOO/$n exists; remove it first to ship the new release" >&2
    exit 2
  fi
done
echo "ship_text_models: shipping ${names[*]}" >&2
for n in "${names[@]}"; do
  run cp -r "$OUT/release/$n" "$ZOO/$n"
done
CAL=docs/figures/zoo
run "$PY" -m attnlens.lab.calibration "${names[@]/#/$OUT/runs/}" --keep "$CAL/calibration.csv" \
  --csv "$CAL/calibration.csv" --png "$CAL/calibration.png" \
  --focus text-mha-l2-v1 text-mha-l2-ctx256 text-mha-l2 \
  --focus-png "$CAL/calibration_curriculum.png"
run "$PY" -m attnlens.lab.text_studies "$ZOO" --only "${names[@]}"
run "$PY" -m attnlens.reports.zoo_docs
run "$PY" notebooks/build_notebooks.py --execute 01_quickstart 02_induction_heads
cat >&2 <<EOF
ship_text_models: done. Left to you:
  - docs/zoo.md: its table is regenerated; the findings (attnlens/reports/zoo_findings.py) and
    README.md's zoo.available listing are yours;
  - tests: .venv/bin/python -m pytest -q tests/test_text_zoo.py tests/test_zoo_size.py \\
      tests/test_text_studies.py tests/test_zoo_calibration.py tests/test_docs.py \\
      tests/test_serve_defaults.py tests/test_readme.py tests/test_notebooks.py -k "not test_notebook_runs"
  - git add $ZOO/${names[0]} ... docs/ notebooks/ README.md, and commit.
EOF
