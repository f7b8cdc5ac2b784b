"""The transformers back-end's settings (`HFSettings`) and its model on disk: the file or folder the
settings name, found and hashed into the back-end's identity (`folder_sha256`), the device and dtype
it runs in, and the architecture alone on the meta device for a sharded trainer (`meta_model`). The
back-end itself is `metarag.llm.hf`; torch and transformers are imported inside the functions."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from metarag.errors import BackendError, ConfigError, DataError, MissingDependency

WEIGHT_SUFFIXES = (".safetensors", ".gguf")
PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")  # loading one can run code: refused unless trust_pickle
# the files besides the weights that change what a folder's model answers
MODEL_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "tokenizer.model",
               "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json", "chat_template.jinja",
               "chat_template.json")
SAMPLING_PLACES = ("device", "host")  # where decoding picks each next token (HFSettings.sampling)


@dataclass(frozen=True)
class HFSettings:
    """How to load and run a model with transformers. `embedded` names an embedded GGUF
    (`metarag.llm.models.EMBEDDED_MODELS`); `path`, a GGUF file or a Hugging Face model folder,
    wins when given. `device` "auto" is cuda when torch sees a GPU, else cpu; `dtype` "auto" is
    bfloat16 on a GPU and float32 on the CPU. Eager attention, so that attention weights can be
    returned. `n_threads` None leaves torch's default. A folder's pickle weight files (.bin, .pt,
    .pth, .ckpt) can run code when loaded: refused unless `trust_pickle`. `autocast` runs every
    forward pass under bf16 autocast over the model's own (float32) weights: a trainer's rollouts in
    its bf16-autocast precision (on a CPU with AVX512-BF16 a bf16 matmul is about 4x a float32 one).
    `prefix_cache_tokens`: the key/value states of up to that many tokens of earlier requests are kept
    (`metarag.llm.prefix_kv`), so a request that extends one (an agent's next turn, a probe of a longer
    history) runs only its new tokens; 0 turns it off. A token of the 1.5B's states is 28 layers x 2
    KV heads x 128 for keys and as much for values: 16,384 tokens take about 0.94 GB in float32 (and
    about 0.7 GB under bf16 autocast, where the values are bf16 and the keys float32: Qwen2's rotary
    tables take the hidden states' dtype), enough for every row of a training step's group (5
    rollouts x 3 turns, their probes).
    `sampling` "device": each decoding step picks every row's next token in torch on the model's
    device, all rows at once, by the shared rule (`metarag.llm.base`: the uniform each draw needs comes
    from the row's numpy generator seeded by `seed`, and the draw is the inverse-CDF search numpy's
    `Generator.choice` makes, so a seed gives the tokens the host rule gives), and only the chosen ids,
    their log-probs, entropies and top alternatives come back to the host; "host": the rule in numpy,
    row by row, the whole logit rows copied to the host at every step (the reference the device path
    is tested and benchmarked against: tests/test_hf.py, benchmarks/rollout_sampling.py)."""

    embedded: str | None = "qwen2.5-coder-1.5b-instruct"
    path: str | None = None
    device: str = "auto"
    dtype: str = "auto"
    n_ctx: int = 4096
    n_threads: int | None = None
    attn_implementation: str = "eager"
    trust_pickle: bool = False
    autocast: bool = False
    prefix_cache_tokens: int = field(default=16384, metadata={"omit_default": True})
    sampling: str = field(default="device", metadata={"omit_default": True})

    def __post_init__(self) -> None:
        if self.prefix_cache_tokens < 0:
            raise ConfigError(f"prefix_cache_tokens must be >= 0, not {self.prefix_cache_tokens}")
        if self.sampling not in SAMPLING_PLACES:
            raise ConfigError(f"sampling must be one of {', '.join(SAMPLING_PLACES)}, not {self.sampling!r}")


def _torch():
    try:
        import torch
        import transformers
    except ModuleNotFoundError:
        raise MissingDependency("torch and transformers", "hf") from None
    return torch, transformers


def meta_model(settings: HFSettings) -> tuple[Any, Any]:
    """The model `settings` name as its architecture alone, its parameters on torch's meta device (no
    weight read, none allocated), with its tokenizer and generation config: what a training process
    holds whose weights the main process sends it as the model is sharded (FSDP2's rank-0 loading,
    `metarag.train.agent.model.load_base`). Its parameters have the names and shapes `HFLLM` loads."""
    torch, transformers = _torch()
    path = _locate(settings)
    kwargs: dict[str, Any] = {}
    folder = path
    if path.is_file():
        folder, kwargs["gguf_file"] = path.parent, path.name
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder), **kwargs)
        config = transformers.AutoConfig.from_pretrained(str(folder), **kwargs)
    except (OSError, ValueError, RuntimeError, ImportError) as exc:
        raise BackendError(f"transformers could not read {path}: {str(exc).splitlines()[0][:300]}") from None
    from accelerate import init_empty_weights

    dtype = _dtype(torch, settings.dtype, torch.device("cpu"))
    # parameters on the meta device; buffers (the rotary frequencies) computed on the CPU: FSDP2 sends
    # the parameters and persistent buffers, and keeps each process's own non-persistent ones
    with init_empty_weights(include_buffers=False):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=dtype,
                                                              attn_implementation=settings.attn_implementation)
    model.tie_weights()  # from_config on the meta device leaves tied embeddings untied; the loaded model ties them
    try:  # the end-of-turn ids the rollouts stop at, as from_pretrained reads them
        model.generation_config = transformers.GenerationConfig.from_pretrained(str(folder))
    except OSError:  # none in the folder (a GGUF's): the one from_pretrained derives from the config
        pass
    return model, tokenizer


def _locate(settings: HFSettings) -> Path:
    """The file or folder `settings` name (no hashing)."""
    from metarag.llm.models import check_gguf_path, embedded_model, ensure_gguf

    if settings.path:
        path = Path(settings.path).expanduser()
        if path.is_dir():
            return path
        if path.is_file():
            return check_gguf_path(path)
        raise DataError("model file or folder not found", path=str(path))
    if settings.embedded:
        return ensure_gguf(embedded_model(settings.embedded))
    raise ConfigError("the transformers back-end needs an embedded model name or a path")


def _resolve(settings: HFSettings) -> tuple[Path, str, str]:
    """(path to load, display name, sha256 of the weights)."""
    from metarag.llm.models import check_gguf_path, embedded_model, ensure_gguf, file_sha256

    if settings.path:
        path = Path(settings.path).expanduser()
        if path.is_dir():
            return path, path.name, folder_sha256(path, trust_pickle=settings.trust_pickle)
        if path.is_file():
            checked = check_gguf_path(path)
            return checked, checked.name, file_sha256(checked)
        raise DataError("model file or folder not found", path=str(path))
    if settings.embedded:
        model = embedded_model(settings.embedded)
        return ensure_gguf(model), model.name, model.sha256
    raise ConfigError("the transformers back-end needs an embedded model name or a path")


def folder_sha256(folder: Path, *, trust_pickle: bool = False) -> str:
    """One hash of a model folder's weight, config and tokenizer files (names and contents), so a
    retrained checkpoint or a changed tokenizer in the same folder gets a new identity."""
    from metarag.llm.models import file_sha256

    suffixes = WEIGHT_SUFFIXES + (PICKLE_SUFFIXES if trust_pickle else ())
    weights = [p for p in folder.rglob("*") if p.is_file() and p.suffix in suffixes]
    if not weights:
        pickles = sorted(p.name for p in folder.rglob("*") if p.is_file() and p.suffix in PICKLE_SUFFIXES)
        if pickles:
            raise DataError(f"only pickle weight files ({', '.join(pickles[:3])}), which can run code when loaded: "
                            "convert them to safetensors, or set trust_pickle", path=str(folder))
        raise DataError("no weight files (*.safetensors, *.gguf) in the model folder", path=str(folder))
    files = sorted(weights + [p for p in folder.rglob("*") if p.is_file() and p.name in MODEL_FILES])
    digest = hashlib.sha256()
    for f in files:
        digest.update(f"{f.relative_to(folder)}:{file_sha256(f)}\n".encode())
    return digest.hexdigest()


def _device(torch, name: str):
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(name)
    except RuntimeError:
        raise ConfigError(f"unknown torch device {name!r}") from None


def _dtype(torch, name: str, device):
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    value = getattr(torch, name, None)
    if not isinstance(value, torch.dtype):
        raise ConfigError(f"unknown torch dtype {name!r} (float32, bfloat16, float16)")
    return value
