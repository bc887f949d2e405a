"""Compile one recorded launch for an NVIDIA architecture with Triton's real compiler, no GPU.

The launch is specialised exactly as `JITFunction.run` would on a GPU (the same binder: dtypes,
16-divisibility, ints equal to 1 as constants), then `triton.compile` lowers it through
TTIR/TTGIR/LLIR/PTX to a cubin with the ptxas shipped in the triton wheel, for
`GPUTarget("cuda", arch, 32)`. The cubin's registers, stack frame and local memory (spills) and
static shared memory come from the shipped `cuobjdump --dump-resource-usage`; Triton's dynamic
shared memory from the compile metadata.

Example:
    >>> row = compile_launch(launch, arch=90)                       # doctest: +SKIP
    >>> row["registers"], row["spill_bytes"], row["shared_bytes"]    # doctest: +SKIP
    (107, 0, 66560)
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from functools import cache

from attnlens.kernels._triton import triton

# Per-block shared memory a kernel may use (dynamic, opted in), bytes: A100 163 KB, H100 227 KB.
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
REGISTER_FILE = 65536          # 32-bit registers per SM (and per block) on sm_80 and sm_90
ARCH_NAMES = {80: "sm_80", 90: "sm_90"}

_USAGE = re.compile(r"Function (\S+):\s*\n\s*REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)")


def _nvidia_bin(tool: str) -> str:
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", tool)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{tool} is not in the triton wheel ({path})")
    return path


@cache
def _backend(arch: int):
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    target = GPUTarget("cuda", arch, 32)
    return target, make_backend(target)


def _specialise(launch, arch: int):
    """`(signature, constexprs, attrs, options)` as `JITFunction.run` computes them."""
    from triton.runtime.jit import create_function_from_signature

    target, backend = _backend(arch)
    fn = launch.kernel
    kwargs = dict(launch.kwargs)
    knobs = triton.knobs
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    if hasattr(knobs.compilation, "fpsan_homomorphic_casts"):
        kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    bound, specialization, options = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound,
                                                          specialization, options)
    return target, signature, constexprs, attrs, options


def launch_key(launch, arch: int) -> str:
    """What makes two launches the same compiled kernel (for de-duplication), and where its
    line info points (`source_fingerprint`): a cubin records absolute source paths and line
    numbers, which the SASS mix reads back (`sass_mix.loop_var`) to name each loop, so a cached
    cubin is reused only by the same checkout with the same kernel files."""
    _, signature, constexprs, attrs, options = _specialise(launch, arch)
    return repr((launch.kernel.cache_key, sorted(signature.items()), sorted(constexprs.items()),
                 sorted((k, str(v)) for k, v in attrs.items()), sorted(options.__dict__.items(),
                                                                     key=lambda kv: kv[0]),
                 source_fingerprint(launch.kernel.fn.__code__.co_filename)))


def source_fingerprint(path: str) -> str:
    """The absolute path of the kernel's module, and a hash of the Python files beside it and
    of the kernels package's top level (shared `@triton.jit` helpers), whose line numbers a
    cubin's line info may cite. Without it a cubin cached by another checkout (a git worktree,
    same kernel source hash) named loops by reading that checkout's files: gone, or at other
    lines (the roofline then reported "trip model does not cover its loops (None)")."""
    here = os.path.dirname(os.path.abspath(path))
    top = _kernels_root()
    files = sorted({os.path.join(d, f) for d in (here, top) for f in os.listdir(d)
                    if f.endswith(".py")})
    return f"{os.path.abspath(path)}:{_files_hash(tuple(files), _mtimes(files))}"


def _kernels_root() -> str:
    import attnlens.kernels

    return os.path.dirname(os.path.abspath(attnlens.kernels.__file__))


def _mtimes(files) -> tuple:
    return tuple(os.stat(f).st_mtime_ns for f in files)


@cache
def _files_hash(files: tuple[str, ...], mtimes: tuple) -> str:
    import hashlib

    h = hashlib.sha256()
    for f in files:
        with open(f, "rb") as fh:
            h.update(f.encode() + b"\0" + fh.read() + b"\0")
    return h.hexdigest()[:16]


def resource_usage(cubin: bytes, name: str) -> dict[str, int]:
    """Registers, stack, static shared, local and spill (stack + local) bytes per thread of
    kernel `name` in `cubin`."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        text = subprocess.run([_nvidia_bin("cuobjdump"), "--dump-resource-usage", f.name],
                              capture_output=True, text=True, check=True).stdout
    for fn, reg, stack, shared, local in _USAGE.findall(text):
        if fn == name:
            # ptxas puts spilled registers in the stack frame (`ptxas -v`: "264 bytes stack
            # frame, 548 bytes spill stores"); Triton inlines every call and has no local
            # arrays, so stack + local memory per thread is what spilling costs.
            return dict(registers=int(reg), stack_bytes=int(stack), static_shared=int(shared),
                        local_bytes=int(local), spill_bytes=int(stack) + int(local))
    raise RuntimeError(f"cuobjdump printed no resource usage for {name}:\n{text}")


def describe_error(e: BaseException) -> str:
    """One line: the innermost compiler message and where it arose (kernel source line)."""
    where = []
    while True:
        node = getattr(e, "node", None)
        if node is not None and hasattr(node, "lineno"):
            src = (getattr(e, "src", None) or "").splitlines()
            line = src[node.lineno - 1].strip() if 0 < node.lineno <= len(src) else ""
            where.append(line)
        cause = e.__cause__
        if cause is None or getattr(e, "error_message", "x") not in (None, ""):
            break
        e = cause
    message = getattr(e, "error_message", None) or str(e).strip() or type(e).__name__
    message = " ".join(message.split())[:240]
    return f"{type(e).__name__}: {message}" + (f" [at: {where[-1][:80]}]" if where else "")


def problems(row: dict) -> list[str]:
    """Why the launch of `row` would fail on its architecture (empty when it would not)."""
    out = []
    limit = SHARED_LIMIT[row["arch_cc"]]
    if row["shared_bytes"] > limit:
        out.append(f"shared memory {row['shared_bytes']} B > {limit} B per block")
    threads = row["num_warps"] * 32
    if row["registers"] * threads > REGISTER_FILE:
        out.append(f"{row['registers']} registers x {threads} threads > {REGISTER_FILE}")
    return out


PRIVATE_CACHE_ENV = "ATTNLENS_COMPILE_CHECK_TRITON_CACHE"


def private_triton_cache(path: str | None = None) -> str:
    """Point Triton's own kernel cache (`TRITON_CACHE_DIR`) at a directory of this process (or
    `path`), once; forked or spawned workers inherit it. Triton keys that cache by the kernel's
    source hash, not its file, so a cubin compiled in another checkout (a git worktree) came
    back with that checkout's absolute paths in its line info, and `sass_mix.loop_var` named no
    loop (the roofline: "trip model does not cover its loops (None)"). Reuse across runs is the
    results cache's job (`launch_key` carries `source_fingerprint`)."""
    if os.environ.get(PRIVATE_CACHE_ENV) and path is None and os.environ.get("TRITON_CACHE_DIR"):
        return os.environ["TRITON_CACHE_DIR"]
    os.environ["TRITON_CACHE_DIR"] = path or tempfile.mkdtemp(prefix="compile_check_")
    os.environ[PRIVATE_CACHE_ENV] = "1"
    return os.environ["TRITON_CACHE_DIR"]


def compile_launch(launch, arch: int, cache=None, key: str | None = None,
                   keep_cubin: bool = False, keep_ptx: bool = False) -> dict:
    """Compile `launch` for sm_`arch`; returns a row (registers, spills, shared, seconds) or a
    row with `error` set when the compiler fails.

    With a `cache` (`results_cache.ResultCache`) and the launch's `key` (`cache.key(launch_key(
    launch, arch))`), a stored row is returned with `cached=True` and no compile; a new
    successful compile is stored. `keep_cubin`: the row also holds the cubin bytes (`cubin`,
    not JSON-able: the caller pops it); `keep_ptx`: also the PTX text (`ptx`; a cached row has
    none, so with it the launch is compiled again)."""
    from triton.compiler import ASTSource
    from triton.compiler import compile as triton_compile

    private_triton_cache()

    row = dict(kernel=launch.name, pass_=launch.pass_, config=launch.config,
               arch=ARCH_NAMES[arch], arch_cc=arch, num_warps=launch.num_warps,
               num_stages=launch.num_stages, error=None, cached=False)
    if cache is not None and key is not None and not keep_ptx:
        hit = cache.get(key)
        cubin = cache.cubin(key) if hit is not None and keep_cubin else b""
        if hit is not None and (cubin or not keep_cubin):
            row.update(hit, cached=True)
            if keep_cubin:
                row["cubin"] = cubin
            return row
    start = time.perf_counter()
    try:
        target, signature, constexprs, attrs, options = _specialise(launch, arch)
        compiled = triton_compile(ASTSource(launch.kernel, signature, constexprs, attrs),
                                  target=target, options=options.__dict__)
        usage = resource_usage(compiled.asm["cubin"], compiled.metadata.name)
    except Exception as e:  # noqa: BLE001 - every compiler failure is a result to report
        row.update(registers=0, spill_bytes=0, stack_bytes=0, shared_bytes=0,
                   compile_s=time.perf_counter() - start, error=describe_error(e))
        return row
    row.update(registers=usage["registers"], spill_bytes=usage["spill_bytes"],
               stack_bytes=usage["stack_bytes"],
               shared_bytes=int(compiled.metadata.shared) + usage["static_shared"],
               compile_s=time.perf_counter() - start)
    if cache is not None and key is not None:
        cache.put(key, row, compiled.asm["cubin"])
    if keep_cubin:
        row["cubin"] = compiled.asm["cubin"]
    if keep_ptx:
        row["ptx"] = compiled.asm["ptx"]
    return row


__all__ = ["ARCH_NAMES", "REGISTER_FILE", "SHARED_LIMIT", "compile_launch", "launch_key",
           "problems", "resource_usage"]
