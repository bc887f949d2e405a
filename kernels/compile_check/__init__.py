"""GPU readiness without a GPU: compile every Triton kernel for sm_80 and sm_90 on the CPU.

`python -m attnlens.kernels.compile_check` records the launches each op makes on a GPU (`capture`:
the autotune configs, the GPU tile sizes) for every option combination that changes the compiled
code (`cases`), in fp16, bf16 and fp32, d_head 64 and 128, compiles each with Triton's real
compiler for `GPUTarget("cuda", 80 | 90, 32)` down to a cubin (`compiler`), and reads the
registers, spills and shared memory with the cuobjdump shipped in the triton wheel. Nothing is
launched; it must run with TRITON_INTERPRET unset. `--quick` compiles the subset the test suite
runs (tests/test_compile_check.py). Results: docs/benchmarks.md.

Instruments (issue 57): `--mix` reads each kernel's instruction mix from its SASS per loop body
and per launch (`sass_mix`: classes and loops; `trips`: trip counts from the launch;
`mix_report`: the report), and `--roofline FILE` estimates the benchmark's forward launches
(`roofline`: peaks and the time formula; `calibrate`: against the H200 times measured
2026-12-04). Tests: tests/test_compile_check_instruments.py.

Two Triton versions (`versions`): the same cases compiled under the CPU's triton and the GPU
image's, kernel by kernel (scripts/triton_gpu_compat.sh; tests/test_compile_check_versions.py).

Latency (`chain`: the dependency chain of a hot loop's SASS, cycles per iteration; `latency`:
a per-launch reading from it, calibrated on the same H200 points and found no better than the
issue bound, so not used to judge kernels; tests/test_compile_check_latency.py). Races
(`scratch_order`: per-program scratch buffers written and read by different threads need a
barrier between, checked on each kernel's TTGIR; tests/test_compile_check_scratch_order.py).
Headlines (`headline`: the issue bounds docs/benchmarks.md's latest sections state, recomputed
in the reproduce tier under the triton they were computed with;
tests/test_compile_check_headline.py).
"""
