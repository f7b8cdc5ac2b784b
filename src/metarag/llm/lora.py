"""A trained LoRA adapter on the llama.cpp back-ends: a PEFT adapter folder converted once into
llama.cpp's GGUF adapter format, then applied at run time on top of the unchanged base GGUF.

`train-agent` trains LoRA on the transformers back-end, over the embedded GGUF dequantized; its
checkpoints hold the PEFT adapter (`checkpoint-N/adapter`, or the checkpoint folder itself). Evaluating
a checkpoint through transformers on the CPU runs at a third of llama.cpp's speed, and re-quantizing a
merged model to Q4_K_M would round away much of an update made at lr 1e-5. Applied as an adapter, the
update stays exact: llama.cpp computes W·x with the quantized base (the very values transformers
dequantized and trained over) and adds scale·B·(A·x) in float32, scale = alpha / r as PEFT's.

The GGUF adapter format (llama.cpp's `llama_adapter_lora_init`): `general.type` "adapter",
`general.architecture` the base model's (read from the base GGUF, and checked), `adapter.type`
"lora", `adapter.lora.alpha` a float32; for each adapted weight `blk.N.attn_q.weight` two tensors
`blk.N.attn_q.weight.lora_a` (PEFT's A, r × in) and `...lora_b` (B, out × r), stored as PEFT keeps
them (GGUF lists dimensions innermost first, so A reads [in, r] and B [r, out] there).
Only architectures whose GGUF keeps the attention weights in Hugging Face's row order are converted
(Qwen2 / Qwen3: llama.cpp's converter permutes LLaMA's q / k rows, which an adapter would then need
too); rsLoRA and DoRA adapters are refused, since llama.cpp applies plain alpha / r scaling.

llama.cpp does not refuse an adapter it cannot apply: a file that is no adapter, one cut short, or the
base model itself given as one ends its process with a segmentation fault at the first decode. So an
adapter is checked before it loads (`check_adapter`: its GGUF metadata and every tensor's shape against
the base), and its first decode runs once in a child process (`probe_adapter`), where a crash is a
one-line error instead of a dead run.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from metarag.errors import BackendError, ConfigError, DataError, MissingDependency
from metarag.paths import metarag_home

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
# architectures whose GGUF attention weights keep Hugging Face's row order (no q / k permutation)
UNPERMUTED_ARCHS = frozenset({"qwen2", "qwen3"})
# Hugging Face module path inside a decoder layer -> the GGUF tensor's name inside block N
PEFT_TO_GGUF = {
    "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
# PEFT's key: base_model.model.model.layers.N.<module>.lora_A.weight (the adapter name left out on save)
PEFT_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(.+)\.lora_([AB])\.weight$")


def adapter_folder(path: str | os.PathLike[str]) -> Path:
    """The PEFT adapter folder a path names: the folder itself (a train-agent checkpoint-N keeps its
    adapter at its top), or its `adapter/` (where checkpoints written before 2026-12-06 kept a copy)."""
    path = Path(path).expanduser()
    for folder in (path, path / "adapter"):
        if (folder / ADAPTER_CONFIG).is_file() and (folder / ADAPTER_WEIGHTS).is_file():
            return folder
    raise DataError(f"no LoRA adapter here: a PEFT adapter folder holds {ADAPTER_CONFIG} and {ADAPTER_WEIGHTS} "
                    "(a train-agent checkpoint-N folder, or its adapter/), or give a GGUF adapter file", path=str(path))


def adapter_sha256(path: str | os.PathLike[str]) -> str:
    """sha256 of what an adapter applies: a GGUF adapter file's bytes, or a PEFT folder's config and
    weights (its other files — optimizer state, tokenizer — change nothing it computes). Each file is
    read once per process for a given size and mtime (`settings.content_sha256`), however often the
    run id, the conversion cache and the model's identity ask."""
    from metarag.settings import content_sha256

    path = Path(path).expanduser()
    if path.is_file():
        return content_sha256(path)
    folder = adapter_folder(path)
    digest = hashlib.sha256()
    for name in (ADAPTER_CONFIG, ADAPTER_WEIGHTS):
        digest.update(f"{name}:{content_sha256(folder / name)}\n".encode())
    return digest.hexdigest()


def gguf_adapter(path: str | os.PathLike[str], base_gguf: str | os.PathLike[str],
                 cache_dir: Path | None = None) -> Path:
    """A GGUF adapter file for the base model `base_gguf`: `path` itself when it is one (checked for
    the GGUF magic), else the PEFT folder at `path` converted once into
    `$METARAG_HOME/adapters/<sha256>.gguf` (re-used while the adapter's bytes are unchanged)."""
    path = Path(path).expanduser()
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise DataError("not a GGUF adapter file (bad magic bytes) nor a PEFT adapter folder", path=str(path))
        return path
    folder = adapter_folder(path)
    target = (cache_dir or metarag_home() / "adapters") / f"{adapter_sha256(folder)[:32]}.gguf"
    if not target.is_file():
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_suffix(f".partial-{os.getpid()}")
        convert_peft_adapter(folder, base_gguf, partial)
        partial.replace(target)
    return target


def check_adapter(adapter: str | os.PathLike[str], base_gguf: str | os.PathLike[str]) -> None:
    """Refuse, naming the file and what is wrong, a GGUF adapter llama.cpp cannot apply to `base_gguf`:
    one that does not read as GGUF (a few bytes, a file cut short), whose `general.type` is not "adapter"
    (a model file) or `adapter.type` not "lora", made for another architecture, or whose tensors are not
    lora_a / lora_b pairs fitting base tensors (A [in, r], B [r, out] against the base's [in, out])."""
    reader = _read_gguf(adapter, "the LoRA adapter")
    where = str(adapter)
    kind = _field_value(reader, "general.type")
    if kind != "adapter":
        raise DataError(f"not a LoRA adapter: its general.type is {kind!r}, not 'adapter' (a model file?); give a "
                        "GGUF adapter file or a PEFT adapter folder", path=where)
    if (lora := _field_value(reader, "adapter.type")) != "lora":
        raise DataError(f"not a LoRA adapter: its adapter.type is {lora!r}, not 'lora'", path=where)
    base = _read_gguf(base_gguf, "the base model")
    arch, base_arch = _field_value(reader, "general.architecture"), _field_value(base, "general.architecture")
    if arch != base_arch:
        raise DataError(f"the adapter is for architecture {arch!r}, the base model {base_gguf} is {base_arch!r}",
                        path=where)
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in base.tensors}  # GGUF order: innermost first
    pairs: dict[str, dict[str, tuple[int, ...]]] = {}
    for tensor in reader.tensors:
        name, _, part = tensor.name.rpartition(".lora_")
        if part not in ("a", "b") or not name:
            raise DataError(f"tensor {tensor.name!r} is not a LoRA tensor (NAME.lora_a / NAME.lora_b)", path=where)
        pairs.setdefault(name, {})[part] = tuple(int(n) for n in tensor.shape)
    if not pairs:
        raise DataError("the adapter holds no LoRA tensors", path=where)
    for name, pair in sorted(pairs.items()):
        if set(pair) != {"a", "b"}:
            raise DataError(f"{name}: lora_{'b' if 'a' in pair else 'a'} is missing", path=where)
        if name not in shapes:
            raise DataError(f"{name} is not a tensor of the base model {base_gguf}", path=where)
        a, b = pair["a"], pair["b"]
        if len(a) != 2 or len(b) != 2 or a[1] != b[0] or (a[0], b[1]) != shapes[name][:2]:
            raise DataError(f"{name}: adapter shapes A {list(pair['a'])}, B {list(pair['b'])} do not fit the base "
                            f"tensor {list(shapes[name])} of {base_gguf}", path=where)


# The child `probe_adapter` runs: load the base with the adapter and evaluate a few tokens.
PROBE_CHILD = """
import sys
import llama_cpp
llm = llama_cpp.Llama(model_path=sys.argv[1], lora_path=sys.argv[2], n_ctx=64, n_batch=64, n_threads=1,
                      n_threads_batch=1, verbose=False)
llm.eval(llm.tokenize(b"The capital of France is", add_bos=True))
"""


def probe_adapter(adapter: str | os.PathLike[str], base_gguf: str | os.PathLike[str], *,
                  cache_dir: Path | None = None, timeout_s: float = 600) -> None:
    """llama.cpp's first decode with `adapter` on `base_gguf`, in a child process, once per pair of files
    (a marker under `$METARAG_HOME/adapters/probed/` remembers it): a crash there (llama.cpp dies with
    SIGSEGV on an adapter it cannot apply) or a refusal is a BackendError naming both files."""
    from metarag.llm.models import file_sha256

    key = hashlib.sha256(f"{file_sha256(Path(base_gguf))}:{adapter_sha256(adapter)}".encode()).hexdigest()[:32]
    marker = (cache_dir or metarag_home() / "adapters" / "probed") / key
    if marker.is_file():
        return
    try:
        out = subprocess.run([sys.executable, "-c", PROBE_CHILD, str(base_gguf), str(adapter)], capture_output=True,
                             text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise BackendError(f"llama.cpp's first decode with the adapter {adapter} on {base_gguf} did not finish "
                           f"within {timeout_s:g} s") from None
    if out.returncode != 0:
        if out.returncode < 0:
            number = -out.returncode
            how = f"died with {signal.Signals(number).name if number in signal.valid_signals() else number}"
        else:
            lines = [line for line in out.stderr.strip().splitlines() if line.strip()]
            how = f"failed ({lines[-1] if lines else f'exit {out.returncode}'})"
        raise BackendError(f"llama.cpp {how} in its first decode with the adapter {adapter} on {base_gguf}: the "
                           "adapter does not fit this model (train it on this base, or give its own base)")
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(f"{base_gguf}\n{adapter}\n")


def _read_gguf(path: str | os.PathLike[str], what: str):
    """A GGUFReader over `path`, or DataError naming the file: not GGUF, cut short, unreadable."""
    try:
        import gguf
    except ModuleNotFoundError:
        raise MissingDependency("gguf", "hf") from None
    try:
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise DataError(f"{what} is not a GGUF file (bad magic bytes)", path=str(path))
        return gguf.GGUFReader(str(path))
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001  the reader's own error on a file cut short or malformed
        raise DataError(f"{what} does not read as a GGUF file (cut short, or not GGUF): {type(exc).__name__}: "
                        f"{exc}", path=str(path)) from None


def _field_value(reader, key: str) -> str | None:
    """A string field of a GGUF's metadata, None when absent."""
    field = reader.fields.get(key)
    return None if field is None else bytes(field.parts[field.data[0]]).decode(errors="replace")


def convert_peft_adapter(folder: str | os.PathLike[str], base_gguf: str | os.PathLike[str],
                         out: str | os.PathLike[str]) -> Path:
    """Write the PEFT adapter in `folder` as a llama.cpp GGUF adapter for `base_gguf` at `out`: every
    lora_A / lora_B pair named as the base tensor it adapts, in float32, each checked against the
    base tensor's shape. Fails, naming the thing at fault, on a module llama.cpp has no tensor for,
    a shape that does not match the base model, an unpaired A or B, or an unsupported variant."""
    try:
        import gguf
        import numpy as np
        from safetensors.numpy import load_file
    except ModuleNotFoundError as exc:
        raise MissingDependency(exc.name or "gguf", "hf") from None
    folder = Path(folder)
    config = json.loads((folder / ADAPTER_CONFIG).read_text())
    if config.get("use_rslora") or config.get("use_dora"):
        raise ConfigError(f"{folder}: a {'rsLoRA' if config.get('use_rslora') else 'DoRA'} adapter; llama.cpp "
                          "applies plain LoRA (scale alpha / r) only")
    if config.get("rank_pattern") or config.get("alpha_pattern"):
        raise ConfigError(f"{folder}: per-module ranks or alphas (rank_pattern / alpha_pattern); llama.cpp "
                          "applies one alpha to every module")
    alpha, rank = float(config["lora_alpha"]), int(config["r"])
    base = gguf.GGUFReader(str(base_gguf))
    arch = _field_str(base, "general.architecture", base_gguf)
    if arch not in UNPERMUTED_ARCHS:
        raise ConfigError(f"{base_gguf}: LoRA conversion supports base models of architecture "
                          f"{', '.join(sorted(UNPERMUTED_ARCHS))}, not {arch!r} (its GGUF permutes the attention rows)")
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in base.tensors}  # GGUF order: innermost first
    pairs: dict[str, dict[str, np.ndarray]] = {}
    for key, value in load_file(str(folder / ADAPTER_WEIGHTS)).items():
        match = PEFT_KEY.match(key)
        if not match or match.group(2) not in PEFT_TO_GGUF:
            raise DataError(f"adapter tensor {key!r} adapts a module llama.cpp has no tensor for "
                            f"(known: {', '.join(PEFT_TO_GGUF)})", path=str(folder / ADAPTER_WEIGHTS))
        name = f"blk.{match.group(1)}.{PEFT_TO_GGUF[match.group(2)]}.weight"
        pairs.setdefault(name, {})[match.group(3)] = value.astype(np.float32)
    if not pairs:
        raise DataError("the adapter holds no LoRA tensors", path=str(folder / ADAPTER_WEIGHTS))
    writer = gguf.GGUFWriter(str(out), arch)
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    for name in sorted(pairs, key=_block_order):
        pair = pairs[name]
        if set(pair) != {"A", "B"}:
            raise DataError(f"{name}: lora_{'B' if 'A' in pair else 'A'} is missing",
                            path=str(folder / ADAPTER_WEIGHTS))
        a, b = pair["A"], pair["B"]
        if name not in shapes:
            raise DataError(f"{name} is not a tensor of the base model {base_gguf}", path=str(folder))
        n_in, n_out = shapes[name][0], shapes[name][1]
        if a.shape != (rank, n_in) or b.shape != (n_out, rank):
            raise DataError(f"{name}: adapter shapes A {a.shape}, B {b.shape} do not fit the base weight "
                            f"({n_out} x {n_in}) at rank {rank}", path=str(folder))
        writer.add_tensor(f"{name}.lora_a", np.ascontiguousarray(a))
        writer.add_tensor(f"{name}.lora_b", np.ascontiguousarray(b))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(out)


def _field_str(reader, key: str, path: str | os.PathLike[str]) -> str:
    field = reader.fields.get(key)
    if field is None:
        raise DataError(f"the base GGUF has no {key}", path=str(path))
    return bytes(field.parts[field.data[0]]).decode()


def _block_order(name: str) -> tuple[int, str]:
    return int(name.split(".")[1]), name
