"""The serial chain of one warp through a hot loop's SASS: cycles per pass, without a GPU.

The roofline (`roofline.py`) and the issue bound count work; neither sees a warp *waiting*.
`chain_cycles(body)` walks a loop body's SASS in order, as one warp (of one warpgroup) issues it,
and returns the cycles of one pass in steady state. The model (stated, not measured):

- every instruction takes 1 cycle to issue, in program order (one warp, no dual issue);
- an MMA (HGMMA, the wgmma of sm_90) takes 1 cycle to issue; its work, 2 * m * n * k FLOPs of
  the opcode's shape, starts after that cycle and is queued in order on the SM's tensor
  cores, which do `TENSOR_FLOP_PER_CYCLE` (4,096: 989 TFLOP/s dense bf16 / 132 SMs / 1.83 GHz,
  /work/shared/reference/kernels.md section 8) per cycle; an HGMMA carrying `gsb0` closes a
  wgmma group;
- `WARPGROUP.DEPBAR.LE gsb0, N` waits until at most N groups are still on the tensor cores
  (N 0: the queue is empty);
- the body is walked `passes` (4) times back to back, the tensor queue carried from pass to
  pass, and the cycles of the third pass are returned (the first passes fill the pipeline: work
  issued by the previous iteration, e.g. a `P V` left in flight, is then in the queue);
  `mean_cycles` averages 12 passes after 4 instead (with latencies a pass can be periodic).

With `latencies` (a `Latencies`; `chain_cycles(body, LATENCIES)`), the walk also waits for
operands: an instruction issues when the registers it reads are ready; the registers it writes
are ready `latency(opcode)` cycles after it issues (fixed-latency ALU, MUFU, shared and global
loads, HMMA: the numbers and their sources are on `LATENCIES`). Asynchronous copies
(`LDGSTS`, cp.async) are committed in groups by `LDGDEPBAR` and complete `global_` cycles after
the commit; `DEPBAR.LE SB0, N` waits until at most N groups are pending. A load issued one or
more iterations ahead (Triton's `num_stages` pipelining) is thus waited only for what the
iterations between did not cover: the walk carries pending groups from pass to pass.
Without `latencies` the walk is the model of docs/benchmarks.md "Causal attention forward on
sm_90: the row sum on the tensor cores" (423 cycles per tile at flash fwd 64x64 w4 d 64 before
the row sum, 625 at 128x64 w8 d 128).

Not modelled: other warps (the caller overlaps resident warps, `latency.py`), the tensor cores
shared by the SM's warpgroups, bank conflicts, branch divergence, L2 hits (a global load is
always `global_`), predicates (a predicated-off instruction still costs its cycle).

Example:
    >>> from attnlens.kernels.compile_check.sass_mix import Instr
    >>> body = [Instr(0, "HGMMA.64x64x16.F32.BF16", "R24, gdesc[UR4], R24, gsb0"),
    ...         Instr(16, "WARPGROUP.DEPBAR.LE", "gsb0, 0x0"), Instr(32, "FADD", "R1, R2, R3")]
    >>> chain_cycles(body)     # issue 1, tensor work cycles 1-33, DEPBAR at 33, FADD at 34
    35.0
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from attnlens.kernels.compile_check.sass_mix import Instr, mma_flops

TENSOR_FLOP_PER_CYCLE = 4096           # per SM, dense bf16/fp16 (H100/H200, see above)
WARPGROUP = 4                          # warps issuing one HGMMA together

_REG = re.compile(r"(?<![U\w])R(\d+)(?:\.64)?")
_WAIT = re.compile(r"gsb0,\s*(0x[0-9a-fA-F]+|\d+)")
_SB_WAIT = re.compile(r"SB0,\s*(0x[0-9a-fA-F]+|\d+)")
# Opcodes whose first operand is read, not written (stores, reductions, copies, control).
_NO_DEST = ("ST", "STG", "STS", "STL", "RED", "REDG", "LDGSTS", "BRA", "BAR", "EXIT", "RET",
            "CALL", "WARPGROUP", "DEPBAR", "LDGDEPBAR", "MEMBAR", "FENCE", "NOP", "SYNCS",
            "UTMALDG", "UTMASTG", "ISETP", "FSETP", "HGMMA", "BSSY", "BSYNC", "WARPSYNC")


@dataclass(frozen=True)
class Latencies:
    """Cycles from issue until a result can be read (dependent-issue latency), per opcode class.

    Sources: fixed-latency ALU 4 (FFMA/FADD/IMAD..., Jia et al. 2018, "Dissecting the NVIDIA
    Volta GPU Architecture via Microbenchmarking", Table 4.1: 4 cycles; unchanged on Ampere and
    Hopper per Luo et al. 2024, "Benchmarking and Dissecting the Nvidia Hopper GPU
    Architecture"); MUFU 18 (SFU ops 14-23 cycles in Jia et al.'s Volta/Turing tables: a round
    middle value, an ASSUMPTION for Hopper); shared 30 (LDS/LDSM: ~ 29-33 cycles on H800,
    Luo et al. 2024); global 600 (LDG/cp.async from HBM: ~ 480-600 cycles on A100/H800 in the
    same papers; the round upper value the brief for this model states, an ASSUMPTION: an L2
    hit is ~ 260); HMMA 33 (mma.sync m16n8k16 latency ~ 32-33 cycles, Luo et al. 2024).
    """

    alu: float = 4
    mufu: float = 18
    shared: float = 30
    global_: float = 600
    hmma: float = 33

    def of(self, ins: Instr) -> float:
        op = ins.opcode.split(".")[0]
        if op == "MUFU":
            return self.mufu
        if op in ("LDS", "LDSM"):
            return self.shared
        if op in ("LDG", "LD", "ATOMG", "ATOM"):
            return self.global_
        if op in ("HMMA", "IMMA", "DMMA"):
            return self.hmma
        return self.alu


LATENCIES = Latencies()


def _width(opcode: str) -> int:
    mods = opcode.split(".")[1:]
    return 4 if "128" in mods else 2 if "64" in mods else 1


def registers(ins: Instr) -> tuple[list[int], list[int]]:
    """(written, read) general registers of `ins` (RZ and uniform registers are not tracked):
    the first operand is written unless the opcode is a store, copy, compare or control; a
    `.64` / `.128` load writes 2 / 4 consecutive registers; `Rn.64` reads Rn and Rn+1."""
    ops = [o.strip() for o in ins.operands.split(",")] if ins.operands else []
    base = ins.opcode.split(".")[0]
    written: list[int] = []
    if ops and base not in _NO_DEST and (m := re.fullmatch(r"R(\d+)", ops[0])):
        first = int(m.group(1))
        n = _width(ins.opcode) if base.startswith("LD") else 1
        written = list(range(first, first + n))
        ops = ops[1:]
    read = []
    for o in ops:
        for m in _REG.finditer(o):
            r = int(m.group(1))
            read += [r, r + 1] if m.group(0).endswith(".64") else [r]
    return written, read


def chain_cycles(body: list[Instr], latencies: Latencies | None = None, passes: int = 4,
                 measured_pass: int = 3) -> float:
    """Cycles of pass `measured_pass` (1-based) of `passes` back-to-back walks of `body` (one
    loop body's instructions in address order) under the model of the module docstring; with
    `latencies`, operand and copy latencies too."""
    if not 1 <= measured_pass <= passes:
        raise ValueError(f"measured_pass {measured_pass} outside 1..{passes}")
    marks = _pass_ends(body, latencies, passes)
    start = marks[measured_pass - 2] if measured_pass > 1 else 0.0
    return marks[measured_pass - 1] - start


def mean_cycles(body: list[Instr], latencies: Latencies | None = None, warmup: int = 4,
                measured: int = 12) -> float:
    """Mean cycles per pass over `measured` passes after `warmup`: with latencies, a wait on
    a copy committed k iterations earlier makes the passes periodic (one long pass in k + 1);
    12 passes cover periods of 1, 2, 3, 4 and 6 exactly."""
    marks = _pass_ends(body, latencies, warmup + measured)
    return (marks[-1] - marks[warmup - 1]) / measured


def stalls(body: list[Instr], latencies: Latencies = LATENCIES, warmup: int = 4,
           measured: int = 12) -> list[dict]:
    """Where one warp waits in a loop body (`mean_cycles`' walk): one row per instruction that
    waits, averaged over `measured` passes after `warmup`, longest first: `addr`, `opcode`,
    `cycles` (mean wait per pass before it issues), `source` (its kernel source line, `(file,
    line)` or None) and `cause`: `operand` (a register another instruction writes, its
    `producer` address and opcode given, and `producer_source`), `tensor` (a
    `WARPGROUP.DEPBAR` on the wgmma queue) or `copy` (a `DEPBAR` on cp.async groups). The sum of
    `cycles` is `mean_cycles(body, latencies)` minus the body's length: what prefetching,
    pipelining or more resident warps could hide."""
    rows: dict[int, dict] = {}

    def on_wait(pass_no, ins, cycles, cause, producer):
        if pass_no < warmup:
            return
        row = rows.setdefault(ins.addr, dict(
            addr=ins.addr, opcode=ins.opcode, cycles=0.0, source=ins.source, cause=cause,
            producer=None if producer is None else f"{producer.addr:#06x} {producer.opcode}",
            producer_source=None if producer is None else producer.source))
        row["cycles"] += cycles / measured

    _pass_ends(body, latencies, warmup + measured, on_wait)
    return sorted(rows.values(), key=lambda r: -r["cycles"])


def _pass_ends(body: list[Instr], latencies: Latencies | None, passes: int,
               on_wait=None) -> list[float]:
    """The cycle at which each of `passes` back-to-back walks of `body` ends. on_wait(pass
    index, instruction, cycles, cause, producer) is called for every wait (`stalls`)."""
    t = 0.0                              # cycle at which the next instruction may issue
    queue_end = 0.0                      # when the tensor cores finish the work queued so far
    groups: list[float] = []             # completion cycle of each open wgmma group
    open_group = False
    copies: list[float] = []             # completion cycle of each committed cp.async group
    ready: dict[int, float] = {}         # register -> cycle its value can be read
    writer: dict[int, Instr] = {}        # register -> the instruction that last wrote it
    marks = []

    def waited(p, ins, before, cause, producer=None):
        if on_wait is not None and t > before:
            on_wait(p, ins, t - before, cause, producer)

    for p in range(passes):
        for ins in body:
            base = ins.opcode.split(".")[0]
            if latencies is not None:
                written, read = registers(ins)
                before = t
                last = max(read, key=lambda r: ready.get(r, 0.0), default=None)
                t = max([t] + [ready.get(r, 0.0) for r in read])
                waited(p, ins, before, "operand", writer.get(last))
            before = t
            if base.endswith("GMMA"):
                queue_end = max(t + 1, queue_end) + mma_flops(ins.opcode) * WARPGROUP \
                    / TENSOR_FLOP_PER_CYCLE
                if open_group:
                    groups[-1] = queue_end
                else:
                    groups.append(queue_end)
                open_group = "gsb0" not in ins.operands
            elif ins.opcode.startswith("WARPGROUP.DEPBAR") and (m := _WAIT.search(ins.operands)):
                keep = int(m.group(1), 0)
                done = groups[:len(groups) - keep] if len(groups) > keep else []
                t = max([t] + done)
                groups = groups[len(done):]
                waited(p, ins, before, "tensor")
            elif latencies is not None and base == "LDGDEPBAR":
                copies.append(t + latencies.global_)
            elif latencies is not None and base == "DEPBAR" and (
                    m := _SB_WAIT.search(ins.operands)):
                keep = int(m.group(1), 0)
                done = copies[:len(copies) - keep] if len(copies) > keep else []
                t = max([t] + done)
                copies = copies[len(done):]
                waited(p, ins, before, "copy")
            if latencies is not None:
                for r in written:
                    ready[r] = t + latencies.of(ins)
                    writer[r] = ins
            t += 1
        marks.append(t)
    return marks


def loop_body(instrs: list[Instr], start: int, end: int) -> list[Instr]:
    """The instructions of the loop body [start, end] (addresses, as `sass_mix.Loop`)."""
    return [i for i in instrs if start <= i.addr <= end]


__all__ = ["LATENCIES", "TENSOR_FLOP_PER_CYCLE", "Latencies", "chain_cycles", "loop_body",
           "mean_cycles", "registers", "stalls"]
