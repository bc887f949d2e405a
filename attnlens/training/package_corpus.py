"""More real Python for training: the `.py` sources of installed distributions, pinned by version.

The standard library gives about 9M training tokens, so a 41M-token run reads it 4.5 times. The
distributions the project's own installation brings (torch, transformers, sympy, pandas, ...)
hold ten times as much code that nobody wrote for this project; pinned by name and version, and
fingerprinted by content, they are the same on any machine that installs the same versions.

Only training text comes from here: validation stays the standard library's held-out files
(`attnlens.training.corpus`), so models trained with and without these sources are measured on the
same windows. Rules, recorded in every card:

- A distribution is read only at its pinned version; any other installed version is an error
  that names the distribution and both versions (the corpus would silently differ otherwise).
- A distribution's files are the `.py` entries of its installed RECORD under `root`; files that
  are not valid UTF-8 are skipped.
- Files are deduplicated by content (the first path in sorted order is kept): vendored copies
  and duplicated helpers are read once.
- No file is kept whose bytes equal a standard-library file, or whose path ends with the path
  of a held-out standard-library file (`setuptools/_distutils/util.py` for `distutils/util.py`):
  validation text never enters training this way.

Example:
    >>> pins = {"numpy": "2.4.6"}                                             # doctest: +SKIP
    >>> extra = PackageCorpus.from_installed(pins, Corpus.from_stdlib())      # doctest: +SKIP
    >>> extra.describe()["n_files"], extra.fingerprint[:12]                   # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import importlib.metadata as metadata
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from attnlens.training.corpus import Corpus, hash_file, hash_files


def site_packages() -> Path:
    """The running environment's pure-Python install directory (`sysconfig` "purelib")."""
    return Path(sysconfig.get_paths()["purelib"])


def installed_pins(exclude=()) -> dict[str, str]:
    """`{distribution: version}` of every distribution installed in this environment, except
    `exclude` (names compared case- and `-`/`_`-insensitively): a pin list to record."""
    skip = {_normal(n) for n in exclude}
    pins = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and _normal(name) not in skip:
            pins[name] = dist.version
    return dict(sorted(pins.items(), key=lambda kv: _normal(kv[0])))


def _normal(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@dataclass
class PackageCorpus:
    """The kept `.py` files of the pinned distributions, relative to `root`, sorted.

    Attributes:
        root: the directory the relative paths are resolved against (site-packages).
        pins: `{distribution: version}` read.
        files: kept files (sorted relative POSIX paths).
        dropped: counts of files left out, by reason ("not_utf8", "duplicate",
            "same_bytes_as_stdlib", "path_of_heldout_stdlib_file").
        files_per_distribution: kept files of each distribution.
    """

    root: Path
    pins: dict[str, str]
    files: list[str]
    dropped: dict[str, int] = field(default_factory=dict)
    files_per_distribution: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.files:
            raise ValueError(f"no .py files kept from {sorted(self.pins)} under {self.root}")
        # set by from_installed, which reads every file once for the dedup anyway
        self._fingerprint: str | None = None
        self._bytes: int | None = None

    @classmethod
    def from_installed(cls, pins: dict[str, str], stdlib: Corpus,
                       root: Path | None = None) -> PackageCorpus:
        """Read the pinned distributions installed under `root` (default: site-packages),
        keeping out every file that the standard-library corpus `stdlib` could leak into
        validation (module docstring)."""
        if not pins:
            raise ValueError("pins is empty: name at least one distribution and its version")
        root = Path(root or site_packages()).resolve()
        found = {_normal(d.metadata["Name"]): d for d in metadata.distributions(path=[str(root)])
                 if d.metadata["Name"]}
        problems = []
        for name, version in pins.items():
            dist = found.get(_normal(name))
            if dist is None:
                problems.append(f"{name}=={version} is not installed under {root}")
            elif dist.version != version:
                problems.append(f"{name}: pinned {version}, installed {dist.version}")
        if problems:
            raise ValueError("the package corpus is pinned to other versions than this "
                             "environment has; " + "; ".join(problems))
        stdlib_digests = {_digest((stdlib.root / rel).read_bytes()) for rel in stdlib.files}
        heldout = set(stdlib.val_files)
        candidates: dict[str, str] = {}
        for name in pins:
            for entry in found[_normal(name)].files or []:
                path = Path(entry.locate()).resolve()
                if path.suffix == ".py" and path.is_file() and path.is_relative_to(root):
                    candidates.setdefault(path.relative_to(root).as_posix(), name)
        dropped = {"not_utf8": 0, "duplicate": 0, "same_bytes_as_stdlib": 0,
                   "path_of_heldout_stdlib_file": 0}
        kept, seen, per_dist = [], set(), dict.fromkeys(pins, 0)
        fingerprint, size = _pins_hash(pins), 0    # one read of each file serves both
        for rel in sorted(candidates):
            data = (root / rel).read_bytes()
            reason = _drop_reason(rel, data, seen, stdlib_digests, heldout)
            if reason:
                dropped[reason] += 1
                continue
            seen.add(_digest(data))
            kept.append(rel)
            per_dist[candidates[rel]] += 1
            hash_file(fingerprint, rel, data)
            size += len(data)
        corpus = cls(root=root, pins=dict(pins), files=kept, dropped=dropped,
                     files_per_distribution=per_dist)
        corpus._fingerprint, corpus._bytes = fingerprint.hexdigest(), size
        return corpus

    def texts(self, split: str = "train"):
        """The kept files' texts in sorted path order. All of them are training text
        (`bpe.cached_stream(tokenizer, corpus, "train", ...)`); validation is the standard
        library's."""
        if split != "train":
            raise ValueError(f"split={split!r}: a package corpus is training text only; "
                             "validation is the standard library's held-out files")
        for rel in self.files:
            yield (self.root / rel).read_text(encoding="utf-8")

    @property
    def fingerprint(self) -> str:
        """sha256 over the pins, then (path, NUL, bytes, NUL) of every kept file."""
        if self._fingerprint is None:
            h = _pins_hash(self.pins)
            hash_files(h, self.root, self.files)
            self._fingerprint = h.hexdigest()
        return self._fingerprint

    def describe(self) -> dict:
        """A JSON-ready record for cards."""
        size = self._bytes if self._bytes is not None else sum(
            (self.root / rel).stat().st_size for rel in self.files)
        return {"source": "installed-distributions", "pins": dict(sorted(self.pins.items())),
                "n_files": len(self.files), "bytes": size, "dropped": dict(self.dropped),
                "files_per_distribution": dict(sorted(self.files_per_distribution.items())),
                "sha256": self.fingerprint}


def _pins_hash(pins: dict[str, str]):
    h = hashlib.sha256()
    for name, version in sorted(pins.items()):
        h.update(f"{name}=={version}\0".encode())
    return h


def _digest(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def _drop_reason(rel: str, data: bytes, seen: set, stdlib_digests: set,
                 heldout: set[str]) -> str | None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return "not_utf8"
    digest = _digest(data)
    if digest in stdlib_digests:
        return "same_bytes_as_stdlib"
    parts = rel.split("/")
    if any("/".join(parts[i:]) in heldout for i in range(len(parts))):
        return "path_of_heldout_stdlib_file"
    if digest in seen:
        return "duplicate"
    return None
