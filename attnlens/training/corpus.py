"""Real text every machine has offline: the Python standard library's own `.py` sources.

The corpus is read from the running interpreter's install (`sysconfig` "stdlib" path), so nobody
wrote it for this project and nothing is downloaded. Choices, recorded in every card:

- `site-packages`/`dist-packages` are excluded (third-party code differs between machines).
- Test directories are *included*: they are real, varied Python and double the text (about 31 MB
  instead of 13 MB on CPython 3.11), which matters for a multi-epoch token budget.
- Files that are not valid UTF-8 are skipped (the stdlib tests ship a few deliberately
  mis-encoded files); the skip is deterministic for a given install.
- The file list is the sorted relative POSIX paths; `fingerprint` is the sha256 of every path and
  its bytes, so two machines with the same Python get the same corpus and can tell if not.
- Whole files are held out for validation: a file is in the validation split when the first
  8 bytes of sha256(path) read as a fraction fall below `val_fraction` (stable across versions:
  adding a file never moves another one between splits).

Example:
    >>> corpus = Corpus.from_stdlib()                               # doctest: +SKIP
    >>> len(corpus.train_files), corpus.fingerprint[:12]            # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

EXCLUDED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
DEFAULT_VAL_FRACTION = 0.05


def stdlib_root() -> Path:
    """The running interpreter's standard-library directory."""
    return Path(sysconfig.get_paths()["stdlib"])


def hash_files(h, root: Path, files: list[str]) -> None:
    """Feed (path, NUL, bytes, NUL) of every file in `files` (relative to `root`) to `h`."""
    for rel in files:
        hash_file(h, rel, (root / rel).read_bytes())


def hash_file(h, rel: str, data: bytes) -> None:
    """Feed one file's (path, NUL, bytes, NUL) to `h`: `hash_files` for bytes already read."""
    h.update(rel.encode("utf-8") + b"\0")
    h.update(data + b"\0")


def is_validation(relpath: str, val_fraction: float) -> bool:
    """Whether the file `relpath` is held out (by the hash of its path, not its content)."""
    digest = hashlib.sha256(relpath.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < val_fraction


@dataclass
class Corpus:
    """A deterministic list of source files under `root`, split into train and validation.

    Attributes:
        root: the directory the relative paths are resolved against.
        files: every kept file, sorted relative POSIX paths.
        val_fraction: the share of files (by path hash) held out for validation.
        skipped: files dropped because they are not valid UTF-8.
    """

    root: Path
    files: list[str]
    val_fraction: float = DEFAULT_VAL_FRACTION
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.0 < self.val_fraction < 1.0:
            raise ValueError(f"val_fraction must be in (0, 1), got {self.val_fraction!r}")
        if not self.files:
            raise ValueError(f"no .py files found under {self.root}")
        self._fingerprint: str | None = None

    @classmethod
    def from_directory(cls, root, val_fraction: float = DEFAULT_VAL_FRACTION,
                       max_files: int | None = None) -> Corpus:
        """Every UTF-8 `.py` file under `root` (excluded dirs left out), in sorted order.

        `max_files` keeps the first N paths of the sorted list (quick runs and tests).
        """
        root = Path(root)
        if not root.is_dir():
            raise ValueError(f"corpus root {root} is not a directory")
        paths = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.py")
                       if p.is_file() and not EXCLUDED_DIRS & set(p.relative_to(root).parts))
        if max_files is not None:
            if max_files < 2:
                raise ValueError(f"max_files must be >= 2 (train and validation), got {max_files}")
            paths = paths[:max_files]
        kept, skipped = [], []
        for rel in paths:
            try:
                (root / rel).read_bytes().decode("utf-8")
            except UnicodeDecodeError:
                skipped.append(rel)
                continue
            kept.append(rel)
        return cls(root=root, files=kept, val_fraction=val_fraction, skipped=skipped)

    @classmethod
    def from_stdlib(cls, val_fraction: float = DEFAULT_VAL_FRACTION,
                    max_files: int | None = None) -> Corpus:
        return cls.from_directory(stdlib_root(), val_fraction=val_fraction, max_files=max_files)

    @property
    def train_files(self) -> list[str]:
        return [f for f in self.files if not is_validation(f, self.val_fraction)]

    @property
    def val_files(self) -> list[str]:
        return [f for f in self.files if is_validation(f, self.val_fraction)]

    def split_files(self, split: str) -> list[str]:
        if split not in ("train", "val"):
            raise ValueError(f"split={split!r}; choose 'train' or 'val'")
        files = self.train_files if split == "train" else self.val_files
        if not files:
            raise ValueError(f"the {split} split of {self.root} is empty "
                             f"({len(self.files)} files, val_fraction={self.val_fraction})")
        return files

    def read(self, relpath: str) -> str:
        return (self.root / relpath).read_text(encoding="utf-8")

    def texts(self, split: str):
        """The file texts of `split`, in the sorted path order."""
        for rel in self.split_files(split):
            yield self.read(rel)

    @property
    def fingerprint(self) -> str:
        """sha256 over (path, NUL, bytes, NUL) of every kept file, plus the split fraction."""
        if self._fingerprint is None:
            h = hashlib.sha256(f"val_fraction={self.val_fraction!r}\0".encode())
            hash_files(h, self.root, self.files)
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def describe(self) -> dict:
        """A JSON-ready record for cards: where the text came from and how it was split."""
        import platform

        return {"source": "python-stdlib", "python": platform.python_version(),
                "root": str(self.root), "n_files": len(self.files),
                "n_train_files": len(self.train_files), "n_val_files": len(self.val_files),
                "n_skipped_not_utf8": len(self.skipped), "val_fraction": self.val_fraction,
                "sha256": self.fingerprint, "tests_included": True,
                "excluded_dirs": sorted(EXCLUDED_DIRS)}
