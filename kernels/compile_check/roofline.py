"""A roofline time estimate of a launch from its instruction mix (`mix_report.launch_mix`).

    time ~= tensor FLOPs / tensor peak + CUDA-core FLOPs / fp32 peak + bytes / HBM bandwidth

summed, not overlapped (a kernel that overlaps them perfectly runs in the largest term). The
FLOPs are read from the SASS (`sass_mix`: an MMA's FLOPs from the shape in its opcode; FFMA 2,
FMUL/FADD 1 per lane) weighted by trip counts. Bytes: `io` (the default), the launch's
distinct tensor arguments read or written once each, because the SASS global load count is
unreliable as HBM traffic (a K/V tile re-read by every query tile mostly hits L2); `sass`,
every global load/store's width x 32 lanes x executions, is the other bound (all L2 misses).

Compute terms are scaled by the share of SMs the grid can fill (a program runs on one SM:
fewer programs than SMs leave SMs idle). `issue_s` is a second, separate bound: warp
instructions / (SMs x 4 schedulers x clock), each scheduler issuing one warp instruction per
clock (Hopper SM: 4 partitions); the clock is what the fp32 peak implies (peak / (SMs x 128
lanes x 2)), 1.98 GHz. `sfu_s` is a third: MUFU warp instructions (exp2, log2, rcp, ...) x 32
/ (SMs x 16 special-function results per clock x clock). The special-function units are a
pipe of their own, 4 lanes per SM partition: a warp's MUFU holds them 8 clocks, so a loop
with more than one MUFU per 8 instructions waits on them, not on issue (FlashAttention-3,
Shah et al. 2024: 989 TFLOPS of fp16 matmul against 3.9 TFLOPS of special functions on an
H100 SXM5, 16 results per clock per SM at its 1.83 GHz boost).

Peaks: dense (no sparsity) datasheet numbers from /work/shared/reference/kernels.md section 8
("Roofline numbers and the shapes that matter", added 2026-12-04; NVIDIA H100 SXM / H200
datasheets).

Example:
    >>> estimate(dict(mma_flops=989e9, cuda_flops=0, instructions=0), 0, PEAKS["H100"],
    ...          programs=132)["tensor_s"]
    0.001
"""

from __future__ import annotations

from dataclasses import dataclass

SOURCE = "/work/shared/reference/kernels.md section 8 (datasheet peaks, dense)"


@dataclass(frozen=True)
class Peak:
    """One GPU's peaks: bf16/fp16 tensor FLOP/s, fp32 CUDA-core FLOP/s (an FMA is 2), HBM
    bytes/s, streaming multiprocessors."""

    tensor: float
    fp32: float
    hbm: float
    sms: int
    fp32_lanes: int = 128          # fp32 lanes per SM (Hopper)
    schedulers: int = 4            # warp schedulers per SM, one warp instruction per clock
    sfu_lanes: int = 16            # special-function (MUFU) results per clock per SM

    @property
    def clock(self) -> float:
        return self.fp32 / (self.sms * self.fp32_lanes * 2)


PEAKS = {"H100": Peak(tensor=989e12, fp32=67e12, hbm=3.35e12, sms=132),     # H100 SXM
         "H200": Peak(tensor=989e12, fp32=67e12, hbm=4.8e12, sms=132)}


WARP_LANES = 32                    # threads per warp: one MUFU warp instruction is 32 results
REGISTER_FILE = 65536              # 32-bit registers per SM (sm_80, sm_90)
SHARED_PER_SM = 228 * 1024         # bytes per SM (section 8), 1 KB of it reserved per block
MAX_WARPS, MAX_BLOCKS = 64, 32     # resident per SM on sm_90


def resident_warps(registers: int, warps: int, shared_bytes: int) -> int:
    """Warps of one kernel resident on an SM: programs that fit by registers (allocated in
    multiples of 8 per thread), shared memory, the 64-warp and 32-block limits, x warps. Not
    in the time estimate: few warps per SM hide little latency, which a roofline ignores."""
    regs = -(-max(registers, 1) // 8) * 8
    fit = min(REGISTER_FILE // (regs * 32 * warps), SHARED_PER_SM // (shared_bytes + 1024),
              MAX_WARPS // warps, MAX_BLOCKS)
    return fit * warps


def estimate(counts: dict, nbytes: float, peak: Peak, programs: int) -> dict:
    """Seconds: `tensor_s`, `cuda_s`, `hbm_s`, their sum `time_s`, and the bounds `issue_s`
    and `sfu_s`, for per-launch `counts` (`mma_flops`, `cuda_flops`, `instructions`: warp
    instructions, `mufu`: MUFU warp instructions) and `nbytes` of HBM traffic over a grid of
    `programs`."""
    used = min(1.0, programs / peak.sms) if programs else 1.0
    tensor_s = counts.get("mma_flops", 0) / (peak.tensor * used)
    cuda_s = counts.get("cuda_flops", 0) / (peak.fp32 * used)
    hbm_s = nbytes / peak.hbm
    issue_s = counts.get("instructions", 0) / (peak.sms * used * peak.schedulers * peak.clock)
    sfu_s = counts.get("mufu", 0) * WARP_LANES / (peak.sms * used * peak.sfu_lanes * peak.clock)
    return dict(tensor_s=tensor_s, cuda_s=cuda_s, hbm_s=hbm_s,
                time_s=tensor_s + cuda_s + hbm_s, issue_s=issue_s, sfu_s=sfu_s, sm_share=used)


def fastest(items, key, seconds) -> list:
    """Per kernel (`key(item)`: its name, or its pass and name), the item with the least
    `seconds(item)`: an autotuned kernel records every config the autotuner would try, which
    keeps the fastest it measures. The first recorded wins a tie; kernels in the order first
    recorded.

    >>> fastest([("a", 2.0), ("b", 1.0), ("a", 1.0)], key=lambda x: x[0],
    ...         seconds=lambda x: x[1])
    [('a', 1.0), ('b', 1.0)]
    """
    best: dict = {}
    for item in items:
        k, t = key(item), seconds(item)
        if k not in best or t < best[k][0]:
            best[k] = (t, item)
    return [item for _, item in best.values()]


__all__ = ["PEAKS", "SOURCE", "WARP_LANES", "Peak", "estimate", "fastest", "resident_warps"]
