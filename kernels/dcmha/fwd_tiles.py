"""The DCMHA tensor-core forward's tiles (`triton_fwd_tc`, both passes, 16-bit inputs), chosen
on the host per GPU architecture, or by the autotuning pass's measurement where it made one.

Wider key tiles halve the out pass's P v atomics per key, give the P v dot 64 keys of inner
dimension and halve the head loops' fixed costs per key, but hold twice the registers per
map. On 64 x 64 tiles each phase's hidden maps are summed in a head loop of their own over the
maps read back from the scratch (MAPS_APART in the out pass, PRE_APART in the lse pass,
`maps_apart`): the score loops hold no hidden map, the probabilities' loop the 4 pre maps
instead of the pre and post maps together (8), and the scratch needs no slots for the pre
maps' re-read. sm_90 compiles both passes spill-free so at 16 and 32 heads, d_head 64 and 128
(197-228 registers), where sm_80 spilled 144 B in the out pass at d_head 128 with the post
maps apart (`python -m attnlens.kernels.compile_check --ops dcmha`, docs/benchmarks.md). So
sm_90 takes 64 x 64 and every other architecture 64 x 32 (maps fused), fp32 its own 32 x 16.

Whether 64 x 64 is faster on a real sm_90 (its per-program scratch is 256 KiB where 64 x 32
has 160 KiB, docs/benchmarks.md) is settled by measurement: `python -m
attnlens.kernels.autotune_pass` times the forward with each of FWD_CANDIDATES and records the
faster under TUNED_NAME in `kernels/tuned_configs.json`, which `fwd_blocks` then takes for
that architecture, head count, head size and dtype, with no code change. On sm_90 it times
each tile with the head loops plain and pipelined 3 deep (`HEAD_STAGE_CANDIDATES`,
`FwdLaunch.head_stages`; `fwd_head_stages` reads the record back): the compile check's two
readings disagree on which is faster.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass, replace

from attnlens.kernels import _triton

FWD_CANDIDATES = ((64, 64), (64, 32))    # (BLOCK_M, BLOCK_N) the autotuning pass times
# The head loops' pipeline stages the autotuning pass times with each tile, per architecture
# (`FwdLaunch.head_stages`; others time their default only).
HEAD_STAGE_CANDIDATES = {"sm_90": (1, 3)}
ARCH_FWD_BLOCKS = {"sm_90": (64, 64)}    # where both passes compile spill-free at 64 x 64
DEFAULT_FWD_BLOCKS = (64, 32)
INTERPRETER_ARCH = "sm_90"               # the interpreter (tests) runs sm_90's choice
TUNED_NAME = "dcmha_tc_fwd"              # the tuned file's entry (both passes' kernels)
FWD_LAUNCH = dict(num_warps=8, num_stages=1)   # `triton_fwd_tc.TC_LAUNCH`, for the record


@dataclass(frozen=True)
class FwdLaunch:
    """A 16-bit forward's launch shape beyond its tiles: the lse pass's num_warps and score
    dot's d_head chunk (capped at d_head; with its pre maps apart), and the programs each
    pass's table aims at (`fwd_plan.forward_plan`: at most `split_count`'s equal splits).
    The out pass keeps TC_LAUNCH's warps. head_stages: the pipeline stages of both passes'
    head loops that read global memory (`tl.range(0, H, num_stages=...)`: the score dots',
    the maps' loops from the scratch, the lse pass's Compose, the out pass's P V; 1 is the
    plain loop). With 3 on sm_90 Triton loads two heads ahead by cp.async: in the compile
    check's latency reading the forward at 4k falls 37-43% and its issue bound rises 18-19%
    (docs/benchmarks.md, "Where the DCMHA kernels wait"), so only a GPU decides: the
    autotuning pass times both (`HEAD_STAGE_CANDIDATES`) and a tuned record overrides this."""
    lse_warps: int = 8
    lse_dch: int = 128
    lse_programs: int = 264
    out_programs: int = 264
    head_stages: int = 1


# The forward's launch per architecture (`fwd_launch`); others take FwdLaunch(). sm_90 (64 x 64
# tiles): up to 6 programs per SM in both passes' tables (shorter programs finish closer to
# the even share; `fwd_plan` takes fewer where the model finishes as soon: 544 at 4k), the
# lse pass's score dot in 64-column chunks (fewer instructions than one dot over d_head
# 128), 8 warps kept: 4 warps cut the lse pass's instructions but need two programs per SM,
# which doubles the resident scratch past the L2 (docs/benchmarks.md, "DCMHA forward: 4
# warps per program tried ...").
ARCH_FWD_LAUNCH = {"sm_90": FwdLaunch(lse_warps=8, lse_dch=64, lse_programs=792,
                                      out_programs=792)}

_TUNED: dict = {}


def maps_apart(block_n: int) -> bool:
    """Whether a pass on key tiles of block_n sums its hidden maps in head loops of their
    own: from 64 keys (fused, the out pass spilled 24-32 B on sm_90 at 64 x 64); at 64 x 32
    apart cost 1-3% more instructions (docs/benchmarks.md)."""
    return block_n >= 64


def fwd_key(heads: int, block_d: int, dtype) -> str:
    """The tuned file's key of a forward launch (`_triton.tuning_key`'s form)."""
    return f"H={heads},BLOCK_D={block_d}|{dtype}"


def _tuned_entries() -> tuple[str, dict]:
    """`(arch, {key: config})` of the current device: its architecture and the autotuning
    pass's records for this forward. `_triton.gpu_arch` is read through its module (the
    compile check's capture replaces it there to record each architecture's launch); the
    answer is kept per `gpu_arch` function (a driver query and a file read otherwise)."""
    arch_of = _triton.gpu_arch
    known = _TUNED.get(arch_of)
    if known is None:
        try:
            arch = arch_of()
        except (AssertionError, RuntimeError):   # no CUDA device
            arch = ""
        known = (arch, _triton.load_tuned().get(arch, {}).get(TUNED_NAME, {}))
        _TUNED[arch_of] = known
    return known


def _tuned_record(heads: int, block_d: int, dtype, arch: str | None,
                  tuned: dict | None) -> tuple[str, dict | None]:
    """`(arch, record)`: the architecture a launch takes (the current device's,
    INTERPRETER_ARCH under the interpreter, unless given) and the tuned file's record for
    this launch there (None if none; `tuned` given replaces the device's records, tests)."""
    if arch is None:
        if _triton.interpreting():
            arch, tuned = INTERPRETER_ARCH, tuned or {}
        else:
            arch, found = _tuned_entries()
            tuned = found if tuned is None else tuned
    return arch, (tuned or {}).get(fwd_key(heads, block_d, dtype))


def fwd_blocks(heads: int, block_d: int, dtype, arch: str | None = None,
               tuned: dict | None = None) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of both passes of a 16-bit forward: the tuned file's record for
    this launch when it names one of FWD_CANDIDATES, else ARCH_FWD_BLOCKS of the architecture
    (the current device's, INTERPRETER_ARCH under the interpreter) or DEFAULT_FWD_BLOCKS.
    arch / tuned: given, they replace the device's (tests)."""
    arch, record = _tuned_record(heads, block_d, dtype, arch, tuned)
    if record is not None:
        blocks = (record["BLOCK_M"], record["BLOCK_N"])
        if blocks in FWD_CANDIDATES:
            return blocks
    return ARCH_FWD_BLOCKS.get(arch, DEFAULT_FWD_BLOCKS)


def fwd_arch() -> str:
    """The architecture whose table entries a launch takes: the current device's
    (`_tuned_entries`), INTERPRETER_ARCH under the interpreter."""
    return INTERPRETER_ARCH if _triton.interpreting() else _tuned_entries()[0]


def fwd_launch(arch: str | None = None) -> FwdLaunch:
    """The launch shape of a 16-bit forward on `arch` (default `fwd_arch`)."""
    return ARCH_FWD_LAUNCH.get(fwd_arch() if arch is None else arch, FwdLaunch())


def fwd_candidates(arch: str) -> list[tuple[tuple[int, int], int]]:
    """`(blocks, head_stages)` the autotuning pass times on `arch`: every FWD_CANDIDATES tile
    with the launch's head_stages, then the architecture's own tile (ARCH_FWD_BLOCKS, the
    one the compile check's cases compile spill-free with them) with each other
    HEAD_STAGE_CANDIDATES entry."""
    own = fwd_launch(arch).head_stages
    others = [n for n in HEAD_STAGE_CANDIDATES.get(arch, ()) if n != own]
    blocks = ARCH_FWD_BLOCKS.get(arch, DEFAULT_FWD_BLOCKS)
    return [(b, own) for b in FWD_CANDIDATES] + [(blocks, n) for n in others]


def fwd_head_stages(heads: int, block_d: int, dtype, arch: str | None = None,
                    tuned: dict | None = None, blocks: tuple[int, int] | None = None) -> int:
    """The head loops' pipeline stages of a 16-bit forward: the tuned record's HEAD_STAGES
    for this launch when it is one of the architecture's candidates on the architecture's
    own tile (`fwd_candidates`: what the compile check compiles), else the launch's
    (`fwd_launch(arch).head_stages`); the launch's also where `blocks`, the tiles launched,
    are not that tile (a caller's override). arch / tuned as `fwd_blocks`."""
    arch, record = _tuned_record(heads, block_d, dtype, arch, tuned)
    record = record or {}
    stages = record.get("HEAD_STAGES")
    own = ARCH_FWD_BLOCKS.get(arch, DEFAULT_FWD_BLOCKS)
    own_tile = (record.get("BLOCK_M"), record.get("BLOCK_N")) == own and (
        blocks is None or tuple(blocks) == own)
    if own_tile and stages in HEAD_STAGE_CANDIDATES.get(arch, ()):
        return stages
    return fwd_launch(arch).head_stages


@contextmanager
def arch_head_stages(arch: str, stages: int):
    """Inside the block, `arch`'s launch takes `stages` head-loop stages (ARCH_FWD_LAUNCH's
    entry replaced, restored after): the compile check's cases compile the autotuning pass's
    other candidates with it."""
    saved = ARCH_FWD_LAUNCH.get(arch)
    ARCH_FWD_LAUNCH[arch] = replace(saved or FwdLaunch(), head_stages=stages)
    try:
        yield
    finally:
        if saved is None:
            del ARCH_FWD_LAUNCH[arch]
        else:
            ARCH_FWD_LAUNCH[arch] = saved


def record_of(blocks: tuple[int, int], head_stages: int = 1) -> dict:
    """The tuned file's entry for forward blocks and head-loop stages (the form
    `LazyAutotune` records, with HEAD_STAGES)."""
    return {"BLOCK_M": blocks[0], "BLOCK_N": blocks[1], "HEAD_STAGES": head_stages,
            **FWD_LAUNCH}


__all__ = ["ARCH_FWD_BLOCKS", "ARCH_FWD_LAUNCH", "DEFAULT_FWD_BLOCKS", "FWD_CANDIDATES",
           "HEAD_STAGE_CANDIDATES", "FwdLaunch", "TUNED_NAME", "arch_head_stages", "fwd_arch",
           "fwd_blocks",
           "fwd_candidates", "fwd_head_stages", "fwd_key", "fwd_launch", "maps_apart",
           "record_of"]
