"""Build the `attnlens-zoo` wheel: the bundled models as a distribution of their own (issue 54).

The library's wheel (`pip wheel .`) carries code only; the models (every folder of
hooked_models/zoo/ that holds a config.json, plus superseded.json) go into
`dist/attnlens_zoo-<version>-py3-none-any.whl`, import name `attnlens_zoo`, which
`attnlens.hooked_models.zoo` finds wherever it is installed. The version is attnlens's.

    python -m scripts.build_zoo_wheel [--out dist] [--models NAME ...]

The wheel is written by hand (a zip with METADATA, WHEEL and a RECORD of sha256 digests) because
setuptools cannot package a folder outside its project root without copying 161 MB; entries are
sorted and dated 1980-01-01, so the same models give the same bytes. Weights are stored
uncompressed (float weights barely compress), the rest deflated.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "hooked_models" / "zoo"
PACKAGE = "attnlens_zoo"
DISTRIBUTION = "attnlens-zoo"
SUPERSEDED_FILE = "superseded.json"
EPOCH = (1980, 1, 1, 0, 0, 0)
INIT = '''"""The bundled models of attnlens (toy induction models, text language models, paper-task
models), one folder each; `attnlens.zoo.load(name)` finds them here."""
'''


def project_version(pyproject: Path = ROOT / "pyproject.toml") -> str:
    match = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(encoding="utf-8"), re.M)
    if match is None:
        raise ValueError(f"no version in {pyproject}")
    return match.group(1)


def model_dirs(zoo: Path, names: list[str] | None = None) -> list[Path]:
    """The model folders to ship: every visible folder with a config.json, or exactly `names`
    (an unknown name is an error, not skipped)."""
    found = {p.name: p for p in sorted(zoo.iterdir())
             if p.is_dir() and not p.name.startswith(".") and (p / "config.json").is_file()}
    if names is None:
        return list(found.values())
    missing = [n for n in names if n not in found]
    if missing:
        raise ValueError(f"not a model folder of {zoo}: {', '.join(missing)}")
    return [found[n] for n in names]


def _record_line(arcname: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{arcname},sha256={digest},{len(data)}"


def _entries(zoo: Path, models: list[Path]):
    yield f"{PACKAGE}/__init__.py", INIT.encode()
    table = zoo / SUPERSEDED_FILE
    if table.is_file():
        yield f"{PACKAGE}/{SUPERSEDED_FILE}", table.read_bytes()
    for model in models:
        for f in sorted(model.rglob("*")):
            rel = f.relative_to(zoo)
            if f.is_file() and not any(part.startswith(".") or part == "__pycache__"
                                       for part in rel.parts):
                yield f"{PACKAGE}/{rel.as_posix()}", f.read_bytes()


def _metadata(version: str, n_models: int) -> str:
    return (f"Metadata-Version: 2.1\nName: {DISTRIBUTION}\nVersion: {version}\n"
            "Summary: The bundled models of attnlens: toy induction models, small text language "
            f"models and paper-task models ({n_models} checkpoints, safetensors)\n"
            "License: MIT\nRequires-Python: >=3.10\n")


def build(out: Path, zoo: Path = ZOO, names: list[str] | None = None,
          version: str | None = None) -> Path:
    """Write the wheel into `out` and return its path."""
    version = version or project_version()
    models = model_dirs(zoo, names)
    if not models:
        raise ValueError(f"{zoo} holds no model folder (a folder with a config.json)")
    out.mkdir(parents=True, exist_ok=True)
    info = f"{DISTRIBUTION.replace('-', '_')}-{version}.dist-info"
    wheel = out / f"{DISTRIBUTION.replace('-', '_')}-{version}-py3-none-any.whl"
    tmp = wheel.with_name(f".{wheel.name}.tmp")
    record = []
    with zipfile.ZipFile(tmp, "w") as zf:
        def add(arcname: str, data: bytes) -> None:
            entry = zipfile.ZipInfo(arcname, EPOCH)
            entry.external_attr = 0o644 << 16
            stored = arcname.endswith(".safetensors")
            entry.compress_type = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
            zf.writestr(entry, data)
            record.append(_record_line(arcname, data))

        for arcname, data in _entries(zoo, models):
            add(arcname, data)
        add(f"{info}/METADATA", _metadata(version, len(models)).encode())
        add(f"{info}/WHEEL", b"Wheel-Version: 1.0\nGenerator: attnlens build_zoo_wheel\n"
                             b"Root-Is-Purelib: true\nTag: py3-none-any\n")
        add(f"{info}/top_level.txt", f"{PACKAGE}\n".encode())
        record.append(f"{info}/RECORD,,")
        entry = zipfile.ZipInfo(f"{info}/RECORD", EPOCH)
        entry.external_attr = 0o644 << 16
        entry.compress_type = zipfile.ZIP_DEFLATED
        zf.writestr(entry, "\n".join(record) + "\n")
    tmp.replace(wheel)
    return wheel


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m scripts.build_zoo_wheel", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=ROOT / "dist", help="folder for the wheel")
    p.add_argument("--models", nargs="+", help="only these models (default: all)")
    args = p.parse_args(argv)
    try:
        wheel = build(args.out, names=args.models)
    except ValueError as e:
        print(f"build_zoo_wheel: {e}", file=sys.stderr)
        return 2
    print(f"{wheel} ({wheel.stat().st_size / 2**20:.1f} MiB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
