#!/usr/bin/env bash
# The kernels against the GPU image's Triton, without a GPU (run before a GPU window, after a
# kernel change): the lent GPU's image runs torch 2.11.0+cu130 with triton 3.6.0, while every
# kernel is designed here with the real compiler of triton 3.9.0. A kernel that does not
# import, compile, or stay spill-free under 3.6.0 would waste the window.
#
#   bash scripts/triton_gpu_compat.sh [compile] [tests]      (default: both)
#
# Time on 2 shared cores: compile ~15 min cold (196 kernels, twice), much less for kernels the
# results cache holds; tests ~4 min; the first run also installs ~1.6 GB (a few minutes).
#
# 1. A side environment, $VENV (default .venv-triton36/, git-ignored), with the same CPU torch as
#    .venv (torch==2.13.0, setup.sh's pin), triton==$TRITON_GPU (3.6.0), and the three small
#    packages the kernels and the compile check import (numpy, jaxtyping, tqdm); nothing else.
#    numpy < 2.4: triton 3.6.0's interpreter turns a one-element array into a Python int with
#    int(), an error since numpy 2.4 (a deprecation warning before); 3.9.0's squeezes first.
# 2. compile: `attnlens.kernels.compile_check.versions run` in .venv (triton 3.9.0) and in
#    $VENV, the same cases (each op's main options, "H16 6x11+mix", "H16 6x11+mix 2k rows",
#    "H16 6x11+mix 4k rows", "H16 official", "H32 official"; bf16; d_head 64, 128; sm_90,
#    sm_80; every autotune
#    config), then `... table`: one row per kernel, both versions' registers/spill bytes and
#    the compile error if any.
#    Files in $OUT (default out/triton36): base.json, target.json, table.txt, summary.md.
# 3. tests: quick kernel tests on triton $TRITON_GPU's interpreter, to catch API differences
#    (~5 min). They run in .venv's python (pytest, transformer-lens, ...) with only triton and
#    numpy replaced: $VENV/overlay holds links to the side environment's packages and goes first
#    on PYTHONPATH (the script checks that `import triton` then gives $TRITON_GPU).
#
# Exit status: 1 when a kernel fails to compile (or exceeds a launch limit) under $TRITON_GPU or
# a test fails; new spills are reported in table.txt, not failed on.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=${VENV:-.venv-triton36}
case $VENV in /*) ;; *) VENV=$ROOT/$VENV ;; esac
TRITON_GPU=${TRITON_GPU:-3.6.0}
OUT=${OUT:-out/triton36}
MAIN_PY=${MAIN_PY:-.venv/bin/python}
STAGES=${*:-compile tests}
mkdir -p "$OUT"

# -- 1. the side environment (idempotent) ---------------------------------------------------
REQS=("torch==2.13.0" "triton==$TRITON_GPU" "numpy<2.4" jaxtyping tqdm)
stamp=$VENV/.installed
if [ "$(cat "$stamp" 2>/dev/null)" != "${REQS[*]}" ]; then
    [ -x "$VENV/bin/python" ] || ${PYTHON:-python3} -m venv "$VENV" || exit 1
    # torch pinned (the CPU build the main venv has), so nothing pulls a CUDA build.
    nice -n 10 "$VENV/bin/python" -m pip install -q "${REQS[@]}" \
        || { echo "pip install failed: ${REQS[*]}"; exit 1; }
    echo "${REQS[*]}" >"$stamp"
fi
SITE=$("$VENV/bin/python" -c "import triton, os; print(os.path.dirname(os.path.dirname(triton.__file__)))")
rm -rf "$VENV/overlay" && mkdir -p "$VENV/overlay"
for entry in "$SITE"/triton "$SITE"/triton-*.dist-info "$SITE"/numpy "$SITE"/numpy.libs \
             "$SITE"/numpy-*.dist-info; do
    [ -e "$entry" ] && ln -sfn "$entry" "$VENV/overlay/"
done
echo "side env: $("$VENV/bin/python" -c "import numpy, torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, 'numpy', numpy.__version__)")"

status=0
# -- 2. the compile check under both versions --------------------------------------------------
if [[ " $STAGES " == *" compile "* ]]; then
    compat="-m attnlens.kernels.compile_check.versions"
    for side in base:"$MAIN_PY" target:"$VENV/bin/python"; do
        echo "== compile check, ${side%%:*}: ${side#*:}"
        env -u TRITON_INTERPRET PYTHONPATH="$ROOT" nice -n 10 "${side#*:}" $compat run \
            --json "$OUT/${side%%:*}.json" ${WORKERS:+--workers $WORKERS}
    done
    env -u TRITON_INTERPRET PYTHONPATH="$ROOT" "$MAIN_PY" $compat table "$OUT/base.json" \
        "$OUT/target.json" --markdown "$OUT/summary.md" | tee "$OUT/table.txt"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi

# -- 3. quick kernel tests on the side version's interpreter ---------------------------------
if [[ " $STAGES " == *" tests "* ]]; then
    export PYTHONPATH="$VENV/overlay:$ROOT" TRITON_INTERPRET=1
    got=$("$MAIN_PY" -c "import triton; print(triton.__version__)")
    if [ "$got" != "$TRITON_GPU" ]; then
        echo "the overlay gives triton $got, not $TRITON_GPU"; exit 1
    fi
    echo "== interpreter tests, triton $got"
    nice -n 10 "$MAIN_PY" -m pytest -p no:cacheprovider -x \
        tests/test_kernel_flash_attention.py tests/test_kernel_flash_schedule.py \
        tests/test_kernel_flash_host.py tests/test_kernel_infini.py tests/test_kernel_cope.py \
        tests/test_triton_prologue.py tests/test_kernel_dcmha_bwd_tc.py \
        tests/test_autotune_dispatch.py tests/test_kernel_autotune_tiles.py tests/test_dispatch.py \
        "tests/test_kernel_mta_bwd.py::test_gradients_at_sixteen_heads_full_mixing" \
        "tests/test_kernel_mta.py::test_sixteen_heads_full_mixing" \
        2>&1 | tee "$OUT/tests.log"
    [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
fi
exit $status
