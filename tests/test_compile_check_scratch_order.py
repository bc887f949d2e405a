"""The scratch-order check (kernels/compile_check/scratch_order.py): every per-program scratch
buffer a kernel writes in one layout and reads in another needs a barrier between, which the
interpreter cannot show. Small hand-written TTGIR for each rule; the DCMHA lse kernel compiled
(front end only) with each of its barriers removed in turn; every MTA and DCMHA kernel in the
reproduce tier."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from tiers import reproduce

from attnlens.kernels.compile_check import scratch_order as so

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _module(body: str, callee: str = "") -> str:
    """A kernel `k(%S: ptr, %n: i32)` with `body`; locations name line numbers of f.py."""
    return (
        "module {\n"
        "  tt.func public @k(%S: !tt.ptr<f32> loc(\"S\"(#loc)), %n: i32 loc(\"n\"(#loc))) "
        "attributes {noinline = false} {\n"
        "    %c0 = arith.constant 0 : i32 loc(#loc)\n"
        "    %c1 = arith.constant 1 : i32 loc(#loc)\n"
        "    %r = tt.make_range {end = 64 : i32, start = 0 : i32} : tensor<64xi32> loc(#loc)\n"
        "    %p = tt.splat %S : !tt.ptr<f32> -> tensor<64x!tt.ptr<f32>> loc(#loc)\n"
        "    %a = tt.addptr %p, %r : tensor<64x!tt.ptr<f32>>, tensor<64xi32> loc(#loc)\n"
        "    %b = tt.addptr %p, %r : tensor<64x!tt.ptr<f32>>, tensor<64xi32> loc(#loc)\n"
        f"{body}"
        "    tt.return loc(#loc)\n"
        "  } loc(#loc)\n"
        f"{callee}"
        "} loc(#loc)\n"
        "#loc = loc(\"/nowhere/f.py\":1:1)\n"
        + "".join(f"#loc{i} = loc(\"/nowhere/f.py\":{i}:1)\n" for i in range(2, 40))
    )


STORE_A = "    tt.store %a, %x : tensor<64x!tt.ptr<f32>> loc(#loc{line})\n"
LOAD_B = "    %y{line} = tt.load %b : tensor<64x!tt.ptr<f32>> loc(#loc{line})\n"
BARRIER = "    ttg.barrier all loc(#loc{line})\n"
VALUE = "    %x = arith.constant dense<1.0> : tensor<64xf32> loc(#loc)\n"


def _kinds(text):
    return sorted((h.kind, h.first.rsplit(":", 1)[1], h.second.rsplit(":", 1)[1],
                   h.across_iterations) for h in so.hazards(text))


def test_a_read_after_a_write_through_another_pointer_needs_a_barrier():
    racy = _module(VALUE + STORE_A.format(line=2) + LOAD_B.format(line=3))
    assert _kinds(racy) == [("read after write", "2", "3", False)]
    ordered = _module(VALUE + STORE_A.format(line=2) + BARRIER.format(line=4)
                      + LOAD_B.format(line=3))
    assert _kinds(ordered) == []
    assert so.scratch_args(racy) == ["S"]


def test_an_overwrite_in_the_next_iteration_needs_a_barrier_at_the_loop_end():
    loop = ("    scf.for %i = %c0 to %n step %c1 : i32 {\n"
            + STORE_A.format(line=5) + "{barrier}" + LOAD_B.format(line=6)
            + "    } loc(#loc)\n")
    racy = _module(VALUE + loop.replace("{barrier}", BARRIER.format(line=7)))
    # the store of iteration i + 1 against the load of iteration i
    assert _kinds(racy) == [("write after read", "6", "5", True)]
    end = ("    scf.for %i = %c0 to %n step %c1 : i32 {\n" + STORE_A.format(line=5)
           + BARRIER.format(line=7) + LOAD_B.format(line=6) + BARRIER.format(line=8)
           + "    } loc(#loc)\n")
    assert _kinds(_module(VALUE + end)) == []


def test_the_same_pointer_value_or_an_elementwise_update_is_ordered_by_itself():
    same = _module("    %v = tt.load %a : tensor<64x!tt.ptr<f32>> loc(#loc2)\n"
                   "    %w = arith.addf %v, %v : tensor<64xf32> loc(#loc3)\n"
                   "    tt.store %a, %w : tensor<64x!tt.ptr<f32>> loc(#loc4)\n")
    assert _kinds(same) == []
    # another pointer value (another layout, other threads), but the stored value is the
    # loaded one plus something: each address was read before it is written
    update = same.replace("tt.store %a, %w", "tt.store %b, %w")
    assert _kinds(update) == []
    # through a transpose, an element is written by a thread that never needed its old value
    trans = update.replace("%w = arith.addf %v, %v", "%w = tt.trans %v")
    assert _kinds(trans) == [("write after read", "2", "4", False)]


def test_a_called_function_is_followed_with_its_arguments():
    callee = ("  tt.func private @g(%P: !tt.ptr<f32> loc(\"P\"(#loc))) attributes "
              "{noinline = true} {\n"
              "    %r2 = tt.make_range {end = 64 : i32, start = 0 : i32} : tensor<64xi32> "
              "loc(#loc)\n"
              "    %q = tt.splat %P : !tt.ptr<f32> -> tensor<64x!tt.ptr<f32>> loc(#loc)\n"
              "    %q2 = tt.addptr %q, %r2 : tensor<64x!tt.ptr<f32>>, tensor<64xi32> loc(#loc)\n"
              "    %z = tt.load %q2 : tensor<64x!tt.ptr<f32>> loc(#loc9)\n"
              "    tt.return loc(#loc)\n"
              "  } loc(#loc)\n")
    racy = _module(VALUE + STORE_A.format(line=2) + "    tt.call @g(%S) : (!tt.ptr<f32>) -> () "
                   "loc(#loc3)\n", callee)
    assert _kinds(racy) == [("read after write", "2", "9", False)]


def test_no_public_kernel_is_an_error():
    with pytest.raises(ValueError, match="no public tt.func"):
        so.hazards("module {\n} loc(#loc)\n")


_COMPILED = r"""
import json, sys
from attnlens.kernels.compile_check import scratch_order as so
from attnlens.kernels.compile_check.run import _first_configs, _record, select_cases
(case,) = select_cases(["dcmha"], options=["H4 official"])
out = {}
for launch in _first_configs(_record(case, "bf16", 64, 90)):
    if launch.name != "dcmha_tc_lse_kernel":
        continue
    text = so.launch_ttgir(launch, 90)
    lines = text.splitlines()
    bars = [i for i, s in enumerate(lines) if s.strip().startswith(so._BARRIERS)]
    out = dict(clean=len(so.hazards(text)), barriers=len(bars), scratch=so.scratch_args(text),
               without=[len(so.hazards("\n".join(lines[:i] + lines[i + 1:]))) for i in bars])
print(json.dumps(out))
"""


def _run(code: str, timeout: int = 600) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_dcmha_lse_kernel_is_ordered_and_each_of_its_barriers_is_needed():
    got = _run(_COMPILED)
    assert got["scratch"] == ["SCRATCH", "STATE"]
    assert got["clean"] == 0
    assert got["barriers"] >= 3
    assert all(n > 0 for n in got["without"]), got["without"]


_SWEEP = r"""
import json
from attnlens.kernels.compile_check import scratch_order as so
rows = so.check(["mta", "dcmha"], archs=(90, 80), d_heads=(64, 128))
print(json.dumps(dict(kernels=len(rows), bad=[(r["kernel"], r["option"], r["arch"], r["d_head"],
                  [h.describe() for h in r["hazards"]]) for r in rows if r["hazards"]])))
"""


@pytest.mark.parametrize("sweep", [pytest.param("mta+dcmha", marks=reproduce("report"))])
def test_every_mta_and_dcmha_kernel_orders_its_scratch(sweep):
    got = _run(_SWEEP, timeout=1800)
    assert got["kernels"] >= 150
    assert got["bad"] == []
