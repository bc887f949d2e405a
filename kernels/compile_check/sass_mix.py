"""The instruction mix of a compiled kernel, read from its SASS, per loop body and per launch.

`disassemble(cubin)` runs the `nvdisasm -g -c` shipped in the triton wheel beside cuobjdump (the
same SASS as `cuobjdump -sass`, plus the kernel source line of every instruction); `parse` also
reads `cuobjdump -sass` text. `loops` finds the loops: a branch (`BRA`) whose target is at an
earlier address closes a loop whose body is [target, branch]; a loop containing no other loop
is innermost (the hot bodies). `mix` counts the classes below in an address range, and
`weighted_mix` weights every instruction by the trip counts of the loops around it
(`trips.py` gives them per loop, from the launch) for a total per program.

Classes (opcode before the first dot): `mma` tensor-core MMA (HMMA on sm_80, HGMMA, the SASS of
wgmma, on sm_90; IMMA/QGMMA...), `ffma` `fmul` `fadd` (CUDA-core fp32), `mufu` (exp2, log2,
rcp on the special-function unit), `ldg` / `stg` (global loads and stores; LDGSTS, the
cp.async copy global -> shared, counts as a global load), `tma` (UTMALDG/UTMASTG/UBLKCP),
`atom` (global atomics: RED/REDG, the fire-and-forget
reductions of relaxed `tl.atomic_add`s, and ATOM/ATOMG, those returning the old value or
ordered by fences), `lds` (LDS, LDSM) / `sts` (shared), `shfl`, `bar`, `other`.

Per-warp amounts of one executed instruction: FLOPs of an MMA from the shape in its opcode
(HMMA.16816 = 2*16*8*16 per warp; HGMMA.64x64x16 = 2*64*64*16 per warpgroup of 4 warps, so a
quarter per warp), 2*32 for an FFMA and 32 for an FMUL/FADD (all 32 lanes on); global bytes =
the access width in the opcode (.128 = 16 B, .64 = 8 B, .U16 = 2 B, .U8 = 1 B, else 4 B) x 32
lanes. Lanes masked off by predicates are counted as on: an upper bound. TMA copies are
counted but carry no bytes here (their size is in the tensor descriptor, not the opcode; no
kernel of this project uses TMA today: the count is 0 throughout).

Example:
    >>> instrs = parse(disassemble(cubin))                        # doctest: +SKIP
    >>> [mix(instrs, lo.start, lo.end)["mma"] for lo in innermost(loops(instrs))]  # doctest: +SKIP
"""

from __future__ import annotations

import re
import subprocess
import tempfile
from collections import Counter
from dataclasses import dataclass

CLASSES = ("mma", "ffma", "fmul", "fadd", "mufu", "ldg", "stg", "tma", "atom", "lds", "sts",
           "shfl", "bar", "other")
_CLASS = {"HMMA": "mma", "HGMMA": "mma", "IMMA": "mma", "IGMMA": "mma", "QGMMA": "mma",
          "BGMMA": "mma", "DMMA": "mma", "FFMA": "ffma", "FMUL": "fmul", "FADD": "fadd",
          "MUFU": "mufu", "LDG": "ldg", "LDGSTS": "ldg", "STG": "stg", "UTMALDG": "tma",
          "UTMASTG": "tma", "UBLKCP": "tma", "UTMAREDG": "tma", "RED": "atom", "REDG": "atom",
          "ATOM": "atom", "ATOMG": "atom", "LDS": "lds", "LDSM": "lds", "STS": "sts",
          "SHFL": "shfl", "BAR": "bar"}
TOTALS = ("instructions", "mma_flops", "cuda_flops", "global_bytes")
WARP = 32
WARPGROUP = 4                       # warps that issue one HGMMA together (sm_90 wgmma)

_INSTR = re.compile(r"/\*([0-9a-fA-F]+)\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z][A-Za-z0-9_.]*)"
                    r"\s*([^;]*);")
_LABEL = re.compile(r"^\s*(\.L_x_\d+):")
_FUNCTION = re.compile(r"^\s*\.type\s+\S+,@function")
_LINE = re.compile(r'//## File "([^"]+)", line (\d+)')
_TARGET = re.compile(r"(0x[0-9a-fA-F]+)|`\((\.L_x_\d+)\)")
_MMA = re.compile(r"^[A-Z]MMA\.(16|8)(8)(\d+)")       # HMMA.16816 -> m16 n8 k16, .1688
_GMMA = re.compile(r"^[A-Z]GMMA\.(\d+)x(\d+)x(\d+)")   # HGMMA.64x128x16


@dataclass
class Instr:
    """One SASS instruction: address, opcode with modifiers, operands, source (file, line)."""

    addr: int
    opcode: str
    operands: str = ""
    source: tuple[str, int] | None = None

    @property
    def kind(self) -> str:
        return _CLASS.get(self.opcode.split(".")[0], "other")


@dataclass
class Loop:
    """A loop body [start, end] (addresses; `end` is its backward branch), its source line and
    the loops it sits in (`depth` 0: outermost)."""

    start: int
    end: int
    source: tuple[str, int] | None = None
    depth: int = 0
    inner: bool = True                   # contains no other loop

    def contains(self, other: Loop) -> bool:
        return self.start <= other.start and other.end <= self.end and self != other


def disassemble(cubin: bytes) -> str:
    """SASS of `cubin` with source lines (`nvdisasm -g -c`, shipped in the triton wheel)."""
    from attnlens.kernels.compile_check.compiler import _nvidia_bin

    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([_nvidia_bin("nvdisasm"), "-g", "-c", f.name],
                              capture_output=True, text=True, check=True).stdout


def parse(text: str) -> list[Instr]:
    """Instructions of `nvdisasm` or `cuobjdump -sass` text; branch targets that are labels are
    resolved to addresses (operands then read `0x...`)."""
    instrs, labels, pending, source = [], {}, [], None
    for line in text.splitlines():
        if m := _LINE.search(line):
            source = (m.group(1), int(m.group(2)))
            continue
        if m := _LABEL.match(line):
            pending.append(m.group(1))
            continue
        if m := _INSTR.search(line):
            addr = int(m.group(1), 16)
            for label in pending:
                labels[label] = addr
            pending = []
            instrs.append(Instr(addr, m.group(2), m.group(3).strip(), source))
    for label in pending:                          # a label after the last instruction
        labels[label] = instrs[-1].addr + 16 if instrs else 0
    for ins in instrs:
        if ins.opcode.startswith("BRA") and (m := _TARGET.search(ins.operands)):
            if m.group(2):
                ins.operands = hex(labels.get(m.group(2), -1))
    return instrs


def _target(ins: Instr) -> int | None:
    if not ins.opcode.startswith("BRA"):
        return None
    m = _TARGET.search(ins.operands)
    return int(m.group(1), 16) if m and m.group(1) else None


def loops(instrs: list[Instr]) -> list[Loop]:
    """Every loop: a `BRA` to an earlier address (a branch to itself, the trap at a kernel's
    end, is none), with its nesting depth and whether it is innermost; in address order."""
    found = []
    for ins in instrs:
        t = _target(ins)
        if t is not None and 0 <= t < ins.addr:
            found.append(Loop(t, ins.addr, ins.source))
    found.sort(key=lambda lo: (lo.start, -lo.end))
    for lo in found:
        lo.depth = sum(o.contains(lo) for o in found)
        lo.inner = not any(lo.contains(o) for o in found)
    return found


def innermost(found: list[Loop]) -> list[Loop]:
    return [lo for lo in found if lo.inner]


def mix(instrs: list[Instr], start: int = 0, end: int | None = None) -> Counter:
    """Instruction counts per class in [start, end] (the whole kernel by default); also
    `mma_flops`, `cuda_flops` (per warp, one pass) and `global_bytes` (global loads, stores
    and atomics, per warp)."""
    c = zero()
    for ins in instrs:
        if start <= ins.addr and (end is None or ins.addr <= end):
            count(c, ins, 1)
    return c


def zero() -> Counter:
    """Counts of every class and total, all 0."""
    return Counter({k: 0 for k in CLASSES + TOTALS})


def count(c: Counter, ins: Instr, weight: float) -> None:
    """Add `weight` executions of `ins` to `c` (its class, instructions, FLOPs, bytes)."""
    kind = ins.kind
    c[kind] += weight
    c["instructions"] += weight
    if kind == "mma":
        c["mma_flops"] += weight * mma_flops(ins.opcode)
    elif kind == "ffma":
        c["cuda_flops"] += weight * 2 * WARP
    elif kind in ("fmul", "fadd"):
        c["cuda_flops"] += weight * WARP
    elif kind in ("ldg", "stg", "atom"):
        c["global_bytes"] += weight * access_bytes(ins.opcode) * WARP


def mma_flops(opcode: str) -> int:
    """FLOPs one warp's execution of an MMA opcode does (see the module docstring)."""
    if m := _GMMA.match(opcode):
        mm, n, k = (int(x) for x in m.groups())
        return 2 * mm * n * k // WARPGROUP
    if m := _MMA.match(opcode):
        mm, n, k = (int(x) for x in m.groups())
        return 2 * mm * n * k
    raise ValueError(f"no MMA shape in {opcode!r}")


def access_bytes(opcode: str) -> int:
    """Bytes per lane of a load/store opcode (`LDG.E.128` 16, `.64` 8, `.U16` 2, `.U8` 1)."""
    mods = opcode.split(".")[1:]
    for width, size in (("128", 16), ("64", 8), ("U16", 2), ("S16", 2), ("U8", 1), ("S8", 1)):
        if width in mods:
            return size
    return 4


def loop_var(source: tuple[str, int] | None) -> str | None:
    """The loop variable of the `for` statement at `source` (file, line), "while" for a
    `while` loop, or None."""
    if source is None:
        return None
    try:
        with open(source[0], encoding="utf-8") as f:
            line = f.read().splitlines()[source[1] - 1]
    except (OSError, IndexError):
        return None
    m = re.match(r"\s*for\s+(\w+)\s+in\b", line)
    if m:
        return m.group(1)
    return "while" if re.match(r"\s*while\b", line) else None


def callee_starts(text: str) -> list[int]:
    """Addresses where the functions after the first (the kernel) begin in `nvdisasm` text:
    the `noinline` jit functions ptxas keeps as SASS functions of their own, laid out after
    the kernel's code in one address range."""
    starts, pending, first = [], False, True
    for line in text.splitlines():
        if _FUNCTION.match(line):
            pending, first = not first, False
            continue
        if pending and (m := _INSTR.search(line)):
            starts.append(int(m.group(1), 16))
            pending = False
    return starts


def instruction_weights(instrs: list[Instr], found: list[Loop], trips: list[float],
                        callees: list[int] = (), calls: float = 1.0) -> list[float]:
    """Times each instruction executes per program (per warp) when loop `found[i]` runs
    `trips[i]` times each time it is entered: the product of the trips of the loops around
    it. An instruction of a called function (at or after the first of `callees`,
    `callee_starts`) outside that function's loops executes `calls` times (the calls per
    program); its loops' trips already carry the calls (`trips.py`)."""
    first_callee = min(callees) if callees else None
    out = []
    for ins in instrs:
        w = 1.0
        inside = False
        for lo, n in zip(found, trips, strict=True):
            if lo.start <= ins.addr <= lo.end:
                w *= n
                inside = True
        if not inside and first_callee is not None and ins.addr >= first_callee:
            w = calls
        out.append(w)
    return out


def weighted_mix(instrs: list[Instr], found: list[Loop], trips: list[float],
                 callees: list[int] = (), calls: float = 1.0) -> Counter:
    """Counts per program (per warp), each instruction weighted by `instruction_weights`."""
    c = zero()
    for ins, w in zip(instrs, instruction_weights(instrs, found, trips, callees, calls),
                      strict=True):
        count(c, ins, w)
    return c


def loop_rows(instrs: list[Instr], found: list[Loop]) -> list[dict]:
    """JSON-able rows of `found`: addresses, source file and line, loop variable, depth,
    innermost, and the counts of one pass of the body."""
    return [dict(start=lo.start, end=lo.end, file=lo.source[0] if lo.source else None,
                 line=lo.source[1] if lo.source else None, var=loop_var(lo.source),
                 depth=lo.depth, inner=lo.inner, mix=dict(mix(instrs, lo.start, lo.end)))
            for lo in found]


__all__ = ["CLASSES", "TOTALS", "Instr", "Loop", "access_bytes", "callee_starts", "count",
           "disassemble", "innermost", "instruction_weights", "loop_rows", "loop_var", "loops",
           "mix", "mma_flops", "parse", "weighted_mix", "zero"]
