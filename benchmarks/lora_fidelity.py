"""Does llama.cpp with a trained adapter (`--lora`) compute what transformers trained?

For a train-agent checkpoint, on a few chat prompts: the logit change the adapter makes in
transformers (base GGUF dequantized + the PEFT adapter, float32) against the change it makes in
llama.cpp (the quantized base + the converted GGUF adapter), at the trained scale and magnified
(`--magnify`: both sides' LoRA scale multiplied, so the update stands above llama.cpp's rounding),
their correlation, and llama.cpp's floor: the change an adapter of zeros makes (none) and the one the
trained adapter makes at 1/1000 of its scale (the int8 activation rounding it moves).

    .venv/bin/python benchmarks/lora_fidelity.py ~/.cache/metarag/agents/cpu-1.5b-cmp/trainer/checkpoint-5
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

PROMPTS = [
    "Which is older, the Eiffel Tower or the Statue of Liberty? Answer briefly.",
    "Were Scott Derrickson and Ed Wood of the same nationality?",
    "Answer the question. Search first if you do not know.\nQuestion: Which magazine was started first, "
    "Arthur's Magazine or First for Women?",
]


def chat(text: str) -> str:
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def llama_logits(base: Path, prompt: str, lora: str | None = None, scale: float = 1.0) -> np.ndarray:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(base), n_ctx=512, n_threads=1, logits_all=True, verbose=False,
                          **({"lora_path": lora, "lora_scale": scale} if lora else {}))
    tokens = llm.tokenize(prompt.encode(), special=True)
    llm.eval(tokens)
    return np.array(llm.scores[:len(tokens)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoint", help="a train-agent checkpoint-N folder (or a PEFT adapter folder)")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="the embedded model it was trained on")
    ap.add_argument("--magnify", type=float, default=100.0)
    args = ap.parse_args()

    import torch
    from peft import PeftModel
    from safetensors.numpy import load_file, save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from metarag.llm.lora import adapter_folder, gguf_adapter
    from metarag.llm.models import embedded_model, ensure_gguf

    torch.set_num_threads(1)
    base = ensure_gguf(embedded_model(args.model))
    folder = adapter_folder(args.checkpoint)
    adapter = str(gguf_adapter(folder, base))
    with tempfile.TemporaryDirectory() as tmp:  # the same adapter with B = 0
        zeros = Path(tmp)
        (zeros / "adapter_config.json").write_text((folder / "adapter_config.json").read_text())
        save_file({k: (np.zeros_like(v) if "lora_B" in k else v)
                   for k, v in load_file(str(folder / "adapter_model.safetensors")).items()},
                  str(zeros / "adapter_model.safetensors"))
        zero_adapter = str(gguf_adapter(zeros, base, cache_dir=zeros))
        model = AutoModelForCausalLM.from_pretrained(str(base.parent), gguf_file=base.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(base.parent), gguf_file=base.name)
        peft_model = PeftModel.from_pretrained(model, str(folder))
        layers = [m for m in peft_model.modules() if isinstance(getattr(m, "scaling", None), dict)]
        trained_scale = {id(m): dict(m.scaling) for m in layers}

        def hf_delta(prompt: str, magnify: float) -> np.ndarray:
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            with torch.no_grad(), peft_model.disable_adapter():
                plain = peft_model(ids).logits[0].numpy()
            for m in layers:
                m.scaling.update({k: v * magnify for k, v in trained_scale[id(m)].items()})
            with torch.no_grad():
                adapted = peft_model(ids).logits[0].numpy()
            return adapted - plain

        rows = []
        for text in PROMPTS:
            prompt = chat(text)
            plain = llama_logits(base, prompt)
            row = {"prompt": text[:40], "tokens": len(plain)}
            row["llama zeros: mean abs d"] = float(np.abs(llama_logits(base, prompt, zero_adapter) - plain).mean())
            row["llama 1/1000: mean abs d"] = float(np.abs(llama_logits(base, prompt, adapter, 1e-3) - plain).mean())
            for magnify in (1.0, args.magnify):
                hf = hf_delta(prompt, magnify)
                ll = llama_logits(base, prompt, adapter, magnify) - plain
                n = min(len(hf), len(ll))
                tag = "x1" if magnify == 1.0 else f"x{magnify:g}"
                row[f"hf {tag}: mean abs d"] = float(np.abs(hf[:n]).mean())
                row[f"llama {tag}: mean abs d"] = float(np.abs(ll[:n]).mean())
                row[f"corr {tag}"] = float(np.corrcoef(hf[:n].ravel(), ll[:n].ravel())[0, 1])
            rows.append(row)
            print(json.dumps(row), flush=True)
    keys = list(rows[0])
    print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys))
    for row in rows:
        print("| " + " | ".join(f"{v:.4f}" if isinstance(v, float) else str(v) for v in row.values()) + " |")


if __name__ == "__main__":
    main()
