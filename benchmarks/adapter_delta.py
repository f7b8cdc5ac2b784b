"""How far a trained LoRA adapter has moved the model: for each checkpoint, the update it adds to a
weight matrix, ΔW = (alpha / r) · B · A, against that matrix W of the base GGUF (dequantized),
as ‖ΔW‖_F / ‖W‖_F over the chosen layers and the adapter's modules (median and max), and the
largest |B| entry (B starts at zero; under Adam it moves at most about lr a step). A run whose
update stays around 1e-4 of the weights changes the logits by thousandths (`lora_fidelity.py`):
the size that says whether a flat reward curve is the policy not moving or moving without gain.

    .venv/bin/python benchmarks/adapter_delta.py RUN/trainer/checkpoint-20 RUN/trainer/checkpoint-30 \\
        [--model qwen2.5-coder-1.5b-instruct] [--layers 0,13,27 | --layers all]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="+", help="train-agent checkpoint-N folders (or PEFT adapter folders)")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="the embedded model it was trained on")
    ap.add_argument("--layers", default="0,13,27", help="layers to measure, comma-separated, or 'all'")
    args = ap.parse_args()

    from gguf import GGUFReader
    from gguf.quants import dequantize
    from safetensors.numpy import load_file

    from metarag.llm.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, PEFT_KEY, PEFT_TO_GGUF, adapter_folder
    from metarag.llm.models import embedded_model, ensure_gguf

    tensors = {t.name: t for t in GGUFReader(str(ensure_gguf(embedded_model(args.model)))).tensors}
    layers = None if args.layers == "all" else {int(x) for x in args.layers.split(",")}
    norms: dict[str, float] = {}  # the base weights' norms, read once for all checkpoints
    print("| checkpoint | matrices | median ‖ΔW‖/‖W‖ | max ‖ΔW‖/‖W‖ | max abs B |")
    print("|---|---:|---:|---:|---:|")
    for checkpoint in args.checkpoints:
        folder = adapter_folder(checkpoint)
        config = json.loads((folder / ADAPTER_CONFIG).read_text())
        scale = config["lora_alpha"] / config["r"]
        weights = load_file(str(folder / ADAPTER_WEIGHTS))
        ratios = []
        for key, a in weights.items():
            match = PEFT_KEY.match(key)
            if not match or match.group(3) != "A" or match.group(2) not in PEFT_TO_GGUF:
                continue
            layer = int(match.group(1))
            if layers is not None and layer not in layers:
                continue
            b = weights[key.replace("lora_A", "lora_B")].astype(np.float64)
            delta = scale * (b @ a.astype(np.float64))
            name = f"blk.{layer}.{PEFT_TO_GGUF[match.group(2)]}.weight"
            if name not in norms:
                t = tensors[name]
                norms[name] = float(np.linalg.norm(dequantize(t.data, t.tensor_type).astype(np.float64)))
            ratios.append(float(np.linalg.norm(delta)) / norms[name])
        largest_b = max(float(np.abs(v).max()) for k, v in weights.items() if "lora_B" in k)
        print(f"| {Path(checkpoint).name} | {len(ratios)} | {np.median(ratios):.2e} | {max(ratios):.2e} "
              f"| {largest_b:.2e} |", flush=True)


if __name__ == "__main__":
    main()
