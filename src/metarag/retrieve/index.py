"""Index folders on disk: built once, reused while the corpus, settings and encoder are unchanged.

An index directory holds one folder per index: `bm25/` and `dense-<encoder id>/`. Each holds its
back-end's files, `metarag.json` (the settings, and which passages its rows are; written by the
retriever's `save`) and `fingerprint.json` (what it was built from; written last). A folder is
built under a temporary name and renamed into place when complete, so an interrupted build never
leaves an index that looks finished. A dense build writes its embeddings in chunks to
`.dense-<encoder id>.embeddings/` as they finish, so a build interrupted mid-corpus resumes where it
stopped; the chunks are removed once the index is in place.

`save_corpus` puts a copy of the passages beside the indexes (`corpus.jsonl`), so a served index
(`open_saved`, `metarag serve-retriever --index DIR`) needs nothing but its folder. Within a run,
retrievers keep recent answers in an `LRUCache` (`store.py`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from metarag.data.corpus import corpus_fingerprint
from metarag.errors import ConfigError, DataError, close_matches
from metarag.paths import metarag_home
from metarag.records import Passage
from metarag.retrieve.store import META_FILE
from metarag.settings import file_digest

if TYPE_CHECKING:
    from metarag.retrieve.base import Retriever
    from metarag.retrieve.bm25 import BM25Retriever, BM25Settings
    from metarag.retrieve.dense import DenseRetriever, DenseSettings
    from metarag.retrieve.fusion import FusionRetriever, FusionSettings

log = logging.getLogger(__name__)
FINGERPRINT_FILE = "fingerprint.json"
# Bump when the saved layout changes, so older folders are rebuilt rather than misread.
INDEX_FORMAT = 1
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
CORPUS_FILE = "corpus.jsonl"
CORPUS_META_FILE = "corpus.json"
# The retrievers an index directory provides, by name; "remote:URL" names a retrieval service instead
# (`metarag serve-retriever`). The one list the CLI, the pipeline and the trainers check names against.
RETRIEVERS = ("bm25", "dense", "hybrid")
REMOTE = "remote:"


class _Saveable(Protocol):
    index_dir: Path | None

    def save(self, directory: str | os.PathLike[str]) -> None: ...


R = TypeVar("R", bound=_Saveable)


# -------------------------------------------------------------------------------- opening
def default_index_dir(passages: Sequence[Passage]) -> Path:
    """Where the indexes of a corpus live unless told: `$METARAG_HOME/indexes/<corpus id>`."""
    return _default_dir(corpus_fingerprint(passages))


def open_bm25(passages: Sequence[Passage], index_dir: str | os.PathLike[str] | None = None,
              settings: BM25Settings | None = None, *, build: bool = True) -> BM25Retriever:
    """The BM25 index of `passages` in `index_dir/bm25`, reused if it matches, else (re)built.

    `index_dir` None means `default_index_dir(passages)`; `settings` None means `BM25Settings()`.
    `build` False never builds: an index that is missing or was built from another corpus or with
    other settings raises DataError naming what differs.
    """
    from metarag.retrieve.bm25 import BM25Retriever, BM25Settings, index_fields

    settings = BM25Settings() if settings is None else settings
    corpus_sha = corpus_fingerprint(passages)
    target = Path(index_dir) if index_dir is not None else _default_dir(corpus_sha)
    expected = {"format": INDEX_FORMAT, "kind": "bm25", "corpus_sha256": corpus_sha,
                "passages": len(passages), "settings": index_fields(settings)}
    return _open(target / "bm25", expected,
                 build=(lambda: BM25Retriever.build(passages, settings)) if build else None,
                 load=lambda folder: BM25Retriever.load(folder, passages, settings=settings))


def open_dense(passages: Sequence[Passage], index_dir: str | os.PathLike[str] | None = None,
               settings: DenseSettings | None = None, *, show_progress: bool = True,
               build: bool = True) -> DenseRetriever:
    """The dense index of `passages` in `index_dir/dense-<encoder id>`, reused if it matches, else built.

    The encoder id is the start of the sha256 of its weights, so indexes of different encoders
    live side by side. `index_dir` None means `default_index_dir(passages)`. The index is exact
    (FAISS flat) up to `settings.ann_threshold` passages and approximate (`settings.ann`) beyond.
    `settings` None: the index already built there for this corpus with the default encoder, as it
    was built (an IVF-PQ or HNSW index of `metarag index build --dense-index`, with its saved search
    settings), else `DenseSettings()`. A build encodes in chunks saved as they finish, so an
    interrupted build resumes where it stopped. `build` False never builds: a missing or mismatched
    index raises DataError naming what differs (another corpus, another encoder, other settings).
    """
    from metarag.retrieve.dense import DenseRetriever, DenseSettings, encoder_path, index_fields

    given = settings
    settings = DenseSettings() if settings is None else settings
    corpus_sha = corpus_fingerprint(passages)
    target = Path(index_dir) if index_dir is not None else _default_dir(corpus_sha)
    identity = encoder_identity(encoder_path(settings))
    # The encoder is identified by its weights alone, not by where it is installed (another virtual
    # environment holds the same MiniLM at another path) nor by how `settings` spelled it; the
    # settings recorded are those that shape the index (search-time ones may change freely).
    encoder = {"sha256": identity["sha256"]}
    expected = {"format": INDEX_FORMAT, "kind": "dense", "corpus_sha256": corpus_sha,
                "passages": len(passages), "settings": index_fields(settings, len(passages)),
                "encoder": encoder}
    name = f"dense-{encoder['sha256'][:12]}"
    folder = target / name
    if given is None:  # no settings asked for: the index built here for this corpus, as it was built
        settings = _built_dense_settings(folder, expected) or settings
        expected["settings"] = index_fields(settings, len(passages))
    if not build and _read_fingerprint(folder) is None:
        raise DataError(_no_dense_index(target, identity), path=str(target))
    # Embedding chunks of this corpus and encoder survive an interrupted build, and only that.
    chunk_key = {"corpus_sha256": corpus_sha, "encoder": encoder, "normalize": settings.normalize,
                 "passage_prefix": settings.passage_prefix, "chunk_size": settings.chunk_size}
    resume_dir = target / f".{name}.embeddings"

    def build_dense() -> DenseRetriever:
        return DenseRetriever.build(passages, settings, show_progress=show_progress,
                                    work_dir=_prepare_resume_dir(resume_dir, chunk_key))

    retriever = _open(folder, expected, build=build_dense if build else None,
                      load=lambda folder: DenseRetriever.load(folder, passages, settings=settings))
    # The index is in place (built or reused): its embedding chunks are no longer needed.
    shutil.rmtree(resume_dir, ignore_errors=True)
    return retriever


def _built_dense_settings(folder: Path, expected: dict[str, Any]) -> DenseSettings | None:
    """The settings the complete dense index in `folder` was built with (its encoder left to the
    default, which `folder` is named after), when it indexes the corpus and format `expected` names;
    else None."""
    from metarag.retrieve.dense import DenseSettings

    stored = _read_fingerprint(folder)
    if stored is None or any(stored.get(key) != expected[key] for key in ("format", "corpus_sha256", "passages",
                                                                           "encoder")):
        return None
    try:
        return dataclasses.replace(_settings(DenseSettings, folder), encoder=None)
    except (DataError, ConfigError):  # unreadable, or written by another version: build as asked
        return None


def open_hybrid(passages: Sequence[Passage], index_dir: str | os.PathLike[str] | None = None,
                fusion: FusionSettings | None = None, bm25: BM25Settings | None = None,
                dense: DenseSettings | None = None, *, show_progress: bool = True,
                build: bool = True) -> FusionRetriever:
    """BM25 and dense over `passages` (each opened as `open_bm25` and `open_dense` do), fused.

    `fusion` None means `FusionSettings()`: reciprocal rank fusion (k = 60) of each retriever's
    top 100, the MetaRAG reproducibility study's setup.
    """
    from metarag.retrieve.fusion import FusionRetriever, FusionSettings

    fusion = FusionSettings() if fusion is None else fusion
    root = Path(index_dir) if index_dir is not None else default_index_dir(passages)
    sparse = open_bm25(passages, root, bm25, build=build)
    dense_retriever = open_dense(passages, root, dense, show_progress=show_progress, build=build)
    return FusionRetriever([sparse, dense_retriever], fusion)


def open_saved(index_dir: str | os.PathLike[str], kind: str = "bm25",
               corpus: str | os.PathLike[str] | None = None, *, fusion: FusionSettings | None = None,
               bm25: BM25Settings | None = None, dense: DenseSettings | None = None) -> Retriever:
    """The retriever `kind` ("bm25", "dense" or "hybrid") of an index directory built earlier.

    For serving: nothing is built. `index_dir` is the folder `metarag index build` made (the one
    holding `bm25/` and `dense-*/`). The passages come from `corpus` if given, else from the copy
    `save_corpus` left there. Settings left None are those the index was built with (for dense:
    the one dense index in the folder; several need `dense` to choose). An index built from another
    corpus, or with another encoder or settings than asked, is refused with the difference named.
    """
    from metarag.data.corpus import load_corpus
    from metarag.retrieve.bm25 import BM25Settings
    from metarag.retrieve.dense import DenseSettings

    check_retriever(kind, remote=False)
    root = Path(index_dir)
    if (root / FINGERPRINT_FILE).is_file():  # given one index's folder: its parent holds them all
        root = root.parent
    if not root.is_dir():
        raise DataError("index directory not found", path=str(root))
    if corpus is None:
        corpus = root / CORPUS_FILE
        if not corpus.is_file():
            raise DataError(f"no {CORPUS_FILE} in the index directory: give the corpus the index was built "
                            "from (--corpus FILE)", path=str(root))
    passages = load_corpus(corpus)
    if kind in ("bm25", "hybrid") and bm25 is None:
        bm25 = _settings(BM25Settings, root / "bm25")
    if kind in ("dense", "hybrid") and dense is None:
        found = sorted(p for p in root.glob("dense-*") if _read_fingerprint(p) is not None)
        if len(found) > 1:
            raise ConfigError(f"several dense indexes in {root} ({', '.join(p.name for p in found)}): "
                              "name the encoder to serve")
        if not found:
            raise DataError("no dense index in the index directory (build it with metarag index build)",
                            path=str(root))
        dense = _settings(DenseSettings, found[0])
    if kind == "bm25":
        return open_bm25(passages, root, bm25, build=False)
    if kind == "dense":
        return open_dense(passages, root, dense, show_progress=False, build=False)
    return open_hybrid(passages, root, fusion, bm25, dense, show_progress=False, build=False)


def check_retriever(name: str, *, remote: bool = True) -> str:
    """`name` when it names a retriever (one of RETRIEVERS, or remote:URL where `remote` allows it),
    else ConfigError with the close matches."""
    if name in RETRIEVERS or (remote and name.startswith(REMOTE)):
        return name
    valid = [*RETRIEVERS, f"{REMOTE}URL"] if remote else RETRIEVERS
    raise ConfigError(f"unknown retriever {name!r}{close_matches(name, valid)}")


def save_corpus(index_dir: str | os.PathLike[str], passages: Sequence[Passage]) -> Path:
    """Keep a copy of `passages` in `index_dir/corpus.jsonl` (unless it is already that corpus).

    What `open_saved` reads when no corpus file is named, so a served index is self-contained.
    `corpus.json` beside it records the corpus sha256 and size, to skip rewriting an equal copy.
    """
    root = Path(index_dir)
    path = root / CORPUS_FILE
    meta = {"corpus_sha256": corpus_fingerprint(passages), "passages": len(passages)}
    try:
        stored = json.loads((root / CORPUS_META_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):  # absent or half-written: write the copy again
        stored = None
    if stored == meta and path.is_file():
        return path
    from metarag.data.corpus import write_corpus_jsonl

    # The record goes first and comes back last: a copy interrupted midway is never taken as current.
    (root / CORPUS_META_FILE).unlink(missing_ok=True)
    write_corpus_jsonl(passages, path)
    (root / CORPUS_META_FILE).write_text(json.dumps(meta, indent=1), encoding="utf-8")
    return path


S = TypeVar("S")


def _settings(kind: Callable[..., S], folder: Path) -> S:
    """The settings (of class `kind`) an index folder was built with, for reopening it as is."""
    try:
        return kind(**_saved_settings(folder))
    except TypeError as exc:  # a field this version does not know: written by another version
        raise DataError(f"unreadable index settings: {exc}", path=str(folder / META_FILE)) from None


def _saved_settings(folder: Path) -> dict[str, Any]:
    """The settings recorded in an index folder's `metarag.json`."""
    try:
        meta = json.loads((folder / META_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DataError(f"no {folder.name} index here (build it with metarag index build)",
                        path=str(folder.parent)) from None
    except (OSError, ValueError) as exc:
        raise DataError(f"unreadable index metadata: {exc}", path=str(folder / META_FILE)) from None
    settings = meta.get("settings") if isinstance(meta, dict) else None
    if not isinstance(settings, dict):
        raise DataError("index metadata without settings", path=str(folder / META_FILE))
    return settings


def _default_dir(corpus_sha: str) -> Path:
    return metarag_home() / "indexes" / corpus_sha[:16]


def _open(folder: Path, expected: dict[str, Any], build: Callable[[], R] | None,
          load: Callable[[Path], R]) -> R:
    """Load the index in `folder` if its fingerprint is `expected`, else build it (`build` None: refuse)."""
    stored = _read_fingerprint(folder)
    if stored == expected:
        try:
            return load(folder)
        except (DataError, OSError, ValueError) as exc:  # files lost or damaged since it was built
            if build is None:
                raise DataError(f"the {expected['kind']} index is unreadable: {exc}", path=str(folder)) from None
            reason = f"it is unreadable ({exc})"
    elif stored is None:
        reason = "none built yet" if not folder.exists() else "its fingerprint is missing or unreadable"
        if build is None:
            raise DataError(f"no complete {expected['kind']} index here ({reason}); build it with "
                            "metarag index build", path=str(folder))
    else:
        if build is None:
            raise DataError(f"refusing the {expected['kind']} index: {_mismatch(stored, expected)}",
                            path=str(folder))
        changed = [key for key in expected if stored.get(key) != expected[key]]
        reason = f"{', '.join(changed)} changed"
    log.info(f"metarag: building {expected['kind']} index in {folder}: {reason}")
    retriever = build()

    def write(tmp: Path) -> None:
        retriever.save(tmp)
        # Written last: a folder with a matching fingerprint is a complete index.
        (tmp / FINGERPRINT_FILE).write_text(json.dumps(expected, indent=1), encoding="utf-8")

    _install(folder, write)
    retriever.index_dir = folder
    return retriever


def _mismatch(stored: dict[str, Any], expected: dict[str, Any]) -> str:
    """What differs between the index built (`stored`) and the one asked for, in words."""
    parts = []
    if stored.get("format") != expected["format"]:
        parts.append(f"it has index format {stored.get('format')}, this version reads {expected['format']}")
    if stored.get("corpus_sha256") != expected["corpus_sha256"] or stored.get("passages") != expected["passages"]:
        parts.append(f"it was built for another corpus ({stored.get('passages')} passages, sha256 "
                     f"{str(stored.get('corpus_sha256'))[:12]}; given {expected['passages']} passages, "
                     f"sha256 {expected['corpus_sha256'][:12]})")
    if "encoder" in expected and stored.get("encoder") != expected["encoder"]:
        built = stored.get("encoder") if isinstance(stored.get("encoder"), dict) else {}
        parts.append(f"it was built with another encoder (sha256 {str(built.get('sha256'))[:12]}; "
                     f"given sha256 {expected['encoder']['sha256'][:12]})")
    if stored.get("settings") != expected["settings"]:
        built = stored.get("settings") if isinstance(stored.get("settings"), dict) else {}
        keys = sorted(set(built) | set(expected["settings"]))
        diffs = [f"{key}: built {built.get(key)!r}, asked {expected['settings'].get(key)!r}"
                 for key in keys if built.get(key) != expected["settings"].get(key)]
        parts.append(f"it was built with other settings ({'; '.join(diffs)})")
    return "; ".join(parts) or "its fingerprint differs"


def _no_dense_index(root: Path, encoder: dict[str, str]) -> str:
    """Why no dense index for `encoder` is in `root`, naming the encoders of those that are."""
    others = []
    for folder in sorted(root.glob("dense-*")):
        stored = _read_fingerprint(folder)
        built = stored.get("encoder") if stored and isinstance(stored.get("encoder"), dict) else None
        if built:
            others.append(f"{folder.name} (encoder sha256 {str(built.get('sha256'))[:12]})")
    wanted = f"encoder {encoder['path']} (sha256 {encoder['sha256'][:12]})"
    if others:
        return f"refusing the dense index: it was built with another encoder: {', '.join(others)}; asked {wanted}"
    return f"no dense index for {wanted} here; build it with metarag index build"


def _prepare_resume_dir(folder: Path, key: dict[str, Any]) -> Path:
    """`folder`, emptied unless its chunks were embedded for `key` (same corpus, encoder, chunking)."""
    key_file = folder / "key.json"
    try:
        stored = json.loads(key_file.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        stored = None
    if stored != key:
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        key_file.write_text(json.dumps(key, indent=1), encoding="utf-8")
    return folder


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
        file_sha = file_digest(str(f), stat.st_size, stat.st_mtime_ns)
        digest.update(f"{f.relative_to(path)}:{file_sha}".encode())
    return {"path": str(path), "sha256": digest.hexdigest()}


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
