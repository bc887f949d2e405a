"""A persistent cache of compiled kernels: the cubin and its measured row, keyed by everything
that decides the cubin.

The key hashes the launch's specialisation (`compiler.launch_key`: the kernel's source hash,
signature, constexprs, attributes and compile options, for one architecture) with the Triton
version and the bytes of the ptxas and cuobjdump that compile and measure it. A hit returns the
row measured when the kernel was compiled (registers, spills, shared memory, compile seconds)
without calling the compiler; a changed kernel source, option, architecture or toolchain is a
different key, so it misses and compiles. Compiler errors are not cached: they are reported
again, and a transient failure does not stick.

Entries are written atomically (a temporary file, then `os.replace`), so a check killed midway
leaves only whole entries. The default directory is `~/.cache/attnlens/compile_check`
(`XDG_CACHE_HOME` respected).

Example:
    >>> cache = ResultCache(tmp_path)                      # doctest: +SKIP
    >>> cache.get(cache.key(launch_key(launch, 90)))        # None until a row is put
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from functools import cache
from pathlib import Path

ROW_FIELDS = ("registers", "spill_bytes", "stack_bytes", "shared_bytes", "compile_s")


def default_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "attnlens" / "compile_check"


@cache
def toolchain() -> str:
    """Triton's version and a hash of the ptxas and cuobjdump binaries it ships."""
    from attnlens.kernels._triton import triton
    from attnlens.kernels.compile_check.compiler import _nvidia_bin

    digest = hashlib.sha256(triton.__version__.encode())
    for tool in ("ptxas", "cuobjdump"):
        with open(_nvidia_bin(tool), "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()


class ResultCache:
    """Rows and cubins of compiled kernels under `root` (created on first write)."""

    def __init__(self, root: str | os.PathLike | None = None):
        self.root = Path(root) if root is not None else default_dir()

    def key(self, launch_key: str) -> str:
        """The cache key of a launch (`compiler.launch_key(launch, arch)`) for this toolchain."""
        return hashlib.sha256(f"{toolchain()}\n{launch_key}".encode()).hexdigest()

    def _path(self, key: str, suffix: str) -> Path:
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"cache key must be a sha256 hex digest, got {key!r}")
        return self.root / key[:2] / f"{key}{suffix}"

    def get(self, key: str) -> dict | None:
        """The stored row fields of `key`, or None (no entry, or an unreadable one)."""
        path = self._path(key, ".json")
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not self._path(key, ".cubin").is_file() or set(ROW_FIELDS) - set(entry):
            return None
        return {name: entry[name] for name in ROW_FIELDS}

    def cubin(self, key: str) -> bytes:
        """The stored cubin of `key` (b"" when there is none)."""
        try:
            return self._path(key, ".cubin").read_bytes()
        except OSError:
            return b""

    def put(self, key: str, row: dict, cubin: bytes) -> None:
        """Store the cubin and the row's measured fields of a successful compile."""
        if row.get("error"):
            raise ValueError("compiler errors are not cached")
        self._write(self._path(key, ".cubin"), cubin)
        entry = {name: row[name] for name in ROW_FIELDS}
        entry["kernel"] = row.get("kernel")
        self._write(self._path(key, ".json"), json.dumps(entry).encode())

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise


__all__ = ["ROW_FIELDS", "ResultCache", "default_dir", "toolchain"]
