"""Index folders on disk: built once, reused while the corpus, settings and encoder are unchanged.

An index directory holds one folder per index: `bm25/` and `dense-<encoder id>/`. Each holds its
back-end's files, `metarag.json` (the settings, and which passages its rows are; written by the
retriever's `save`) and `fingerprint.json` (what it was built from; written last). A folder is
built under a temporary name and renamed into place when complete, so an interrupted build never
leaves an index that looks finished.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import shutil
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from metarag.data.corpus import corpus_fingerprint, ids_fingerprint
from metarag.errors import ConfigError, DataError
from metarag.paths import metarag_home
from metarag.records import Passage

if TYPE_CHECKING:
    from metarag.retrieve.bm25 import BM25Retriever, BM25Settings
    from metarag.retrieve.dense import DenseRetriever, DenseSettings

META_FILE = "metarag.json"
FINGERPRINT_FILE = "fingerprint.json"
# Bump when the saved layout changes, so older folders are rebuilt rather than misread.
INDEX_FORMAT = 1
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class _Saveable(Protocol):
    index_dir: Path | None

    def save(self, directory: str | os.PathLike[str]) -> None: ...


R = TypeVar("R", bound=_Saveable)


# -------------------------------------------------------------------------------- opening
def default_index_dir(passages: Sequence[Passage]) -> Path:
    """Where the indexes of a corpus live unless told: `$METARAG_HOME/indexes/<corpus id>`."""
    return _default_dir(corpus_fingerprint(passages))


def open_bm25(passages: Sequence[Passage], index_dir: str | os.PathLike[str] | None = None,
              settings: BM25Settings | None = None) -> BM25Retriever:
    """The BM25 index of `passages` in `index_dir/bm25`, reused if it matches, else (re)built.

    `index_dir` None means `default_index_dir(passages)`; `settings` None means `BM25Settings()`.
    """
    from metarag.retrieve.bm25 import BM25Retriever, BM25Settings

    settings = BM25Settings() if settings is None else settings
    corpus_sha = corpus_fingerprint(passages)
    target = Path(index_dir) if index_dir is not None else _default_dir(corpus_sha)
    expected = {"format": INDEX_FORMAT, "kind": "bm25", "corpus_sha256": corpus_sha,
                "passages": len(passages), "settings": dataclasses.asdict(settings)}
    return _open(target / "bm25", expected,
                 build=lambda: BM25Retriever.build(passages, settings),
                 load=lambda folder: BM25Retriever.load(folder, passages))


def open_dense(passages: Sequence[Passage], index_dir: str | os.PathLike[str] | None = None,
               settings: DenseSettings | None = None, *, show_progress: bool = True) -> DenseRetriever:
    """The dense index of `passages` in `index_dir/dense-<encoder id>`, reused if it matches, else built.

    The encoder id is the start of the sha256 of its weights, so indexes of different encoders
    live side by side. `index_dir` None means `default_index_dir(passages)`.
    """
    from metarag.retrieve.dense import DenseRetriever, DenseSettings, encoder_path

    settings = DenseSettings() if settings is None else settings
    corpus_sha = corpus_fingerprint(passages)
    target = Path(index_dir) if index_dir is not None else _default_dir(corpus_sha)
    encoder = encoder_identity(encoder_path(settings))
    # The encoder is identified by its weights and path below, not by how `settings` spelled it.
    settings_fields = {k: v for k, v in dataclasses.asdict(settings).items() if k != "encoder"}
    expected = {"format": INDEX_FORMAT, "kind": "dense", "corpus_sha256": corpus_sha,
                "passages": len(passages), "settings": settings_fields, "encoder": encoder}
    return _open(target / f"dense-{encoder['sha256'][:12]}", expected,
                 build=lambda: DenseRetriever.build(passages, settings, show_progress=show_progress),
                 load=lambda folder: DenseRetriever.load(folder, passages))


def _default_dir(corpus_sha: str) -> Path:
    return metarag_home() / "indexes" / corpus_sha[:16]


def _open(folder: Path, expected: dict[str, Any], build: Callable[[], R], load: Callable[[Path], R]) -> R:
    stored = _read_fingerprint(folder)
    if stored == expected:
        try:
            return load(folder)
        except (DataError, OSError, ValueError) as exc:  # files lost or damaged since it was built
            reason = f"it is unreadable ({exc})"
    elif stored is None:
        reason = "none built yet" if not folder.exists() else "its fingerprint is missing or unreadable"
    else:
        changed = [key for key in expected if stored.get(key) != expected[key]]
        reason = f"{', '.join(changed)} changed"
    print(f"metarag: building {expected['kind']} index in {folder}: {reason}", file=sys.stderr)
    retriever = build()

    def write(tmp: Path) -> None:
        retriever.save(tmp)
        # Written last: a folder with a matching fingerprint is a complete index.
        (tmp / FINGERPRINT_FILE).write_text(json.dumps(expected, indent=1), encoding="utf-8")

    _install(folder, write)
    retriever.index_dir = folder
    return retriever


def _read_fingerprint(folder: Path) -> dict[str, Any] | None:
    try:
        stored = json.loads((folder / FINGERPRINT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent or half-written: either way, not a usable index
        return None
    return stored if isinstance(stored, dict) else None


def _install(folder: Path, write: Callable[[Path], None]) -> None:
    """Run `write` into a temporary sibling of `folder`, then swap it into place."""
    tmp = folder.with_name(f".{folder.name}.building-{uuid.uuid4().hex[:8]}")
    tmp.mkdir(parents=True)
    try:
        write(tmp)
        if folder.exists():
            # rename() cannot replace a non-empty folder: move the stale one aside first.
            stale = folder.with_name(f".{folder.name}.stale-{uuid.uuid4().hex[:8]}")
            os.rename(folder, stale)
            os.rename(tmp, folder)
            shutil.rmtree(stale, ignore_errors=True)
        else:
            os.rename(tmp, folder)
    finally:
        if tmp.exists():  # the build failed or was interrupted: leave nothing behind
            shutil.rmtree(tmp, ignore_errors=True)


# ----------------------------------------------------------------------------- encoder identity
def encoder_identity(path: Path) -> dict[str, str]:
    """An encoder folder's identity: its path and the sha256 over its weight file(s)."""
    files = [path / name for name in WEIGHT_FILES if (path / name).is_file()]
    if not files:  # older sentence-transformers folders keep the weights one level down
        files = sorted(f for name in WEIGHT_FILES for f in path.glob(f"*/{name}") if f.is_file())
    if not files:
        raise ConfigError(f"no weights ({' or '.join(WEIGHT_FILES)}) in encoder folder {path}")
    digest = hashlib.sha256()
    for f in files:
        stat = f.stat()
        file_sha = _file_sha256(str(f), stat.st_size, stat.st_mtime_ns)
        digest.update(f"{f.relative_to(path)}:{file_sha}".encode())
    return {"path": str(path), "sha256": digest.hexdigest()}


@functools.lru_cache(maxsize=16)
def _file_sha256(path: str, size: int, mtime_ns: int) -> str:
    # Keyed on size and mtime too, so a rewritten file is hashed again; reading ~90 MB once
    # per process is the whole cost.
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


# ------------------------------------------------------------------------ saved index metadata
def write_meta(directory: Path, passages: Sequence[Passage], **fields: Any) -> None:
    """Write `metarag.json`: which passages the index rows are (count, ids digest) and `fields`."""
    meta = {"passages": len(passages), "ids_sha256": ids_fingerprint(passages), **fields}
    (directory / META_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")


def read_meta(directory: Path, passages: Sequence[Passage]) -> dict[str, Any]:
    """`metarag.json` of a saved index, after checking its rows are `passages`, in order."""
    path = directory / META_FILE
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError("not a saved metarag index (no metarag.json)", path=str(directory)) from None
    except (OSError, ValueError) as exc:
        raise DataError(f"unreadable index metadata: {exc}", path=str(path)) from None
    if not isinstance(meta, dict):
        raise DataError("unreadable index metadata: expected a JSON object", path=str(path))
    if meta.get("passages") != len(passages) or meta.get("ids_sha256") != ids_fingerprint(passages):
        raise DataError(f"the index was built over other passages ({meta.get('passages')} indexed, "
                        f"{len(passages)} given, or other ids)", path=str(directory))
    return meta


# -------------------------------------------------------------------------------------- stats
@dataclass(frozen=True)
class IndexStats:
    """What one saved index folder holds and weighs."""

    kind: str
    passages: int
    size_bytes: int
    path: Path


def index_stats(directory: str | os.PathLike[str]) -> IndexStats:
    """Kind, passage count and total file size of the index folder `directory` (e.g. `.../bm25`)."""
    directory = Path(directory)
    stored = _read_fingerprint(directory)
    if stored is None:
        raise DataError("not a complete metarag index (no readable fingerprint.json)", path=str(directory))
    size = sum(f.stat().st_size for f in directory.rglob("*") if f.is_file())
    return IndexStats(kind=str(stored.get("kind")), passages=int(stored.get("passages", 0)), size_bytes=size,
                      path=directory)
