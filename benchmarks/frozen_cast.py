"""What casting the frozen weights once does to a rollout's decoding under bf16 autocast.

Autocast keeps the bf16 cast of a weight only for a weight that trains; LoRA's frozen base (and the LM
head) is cast again at every forward, i.e. at every generated token. `train.agent.frozen_linears_as`
makes those casts once. This decodes `--tokens` tokens for `--rows` rows after a `--prompt`-token
prefill, the embedded model through transformers (float32, frozen), under bf16 autocast, first as it
is, then inside `frozen_linears_as`, in one process, and prints ms per token, the ratio and the
largest difference between the two runs' last logits (0: the same casts, made once).

    .venv/bin/python benchmarks/frozen_cast.py [--model hf-0.5b] [--rows 5] [--prompt 600] [--tokens 10]
        [--threads 1]
"""
from __future__ import annotations

import argparse
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="hf-0.5b")
    parser.add_argument("--rows", type=int, default=5)
    parser.add_argument("--prompt", type=int, default=600)
    parser.add_argument("--tokens", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    from metarag.llm.hf import HFLLM
    from metarag.llm.registry import backend_settings, parse_llm_spec
    from metarag.train.agent import frozen_linears_as, trainable

    torch.set_num_threads(args.threads)
    model = trainable(HFLLM(backend_settings(parse_llm_spec(args.model))).model).float()
    for param in model.parameters():
        param.requires_grad_(False)
    ids = torch.randint(0, 1000, (args.rows, args.prompt), generator=torch.Generator().manual_seed(0))

    def decode() -> tuple[float, torch.Tensor]:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out = model(input_ids=ids, use_cache=True, logits_to_keep=1)
            past, token = out.past_key_values, ids[:, -1:]
            start = time.perf_counter()
            for _ in range(args.tokens):
                out = model(input_ids=token, past_key_values=past, use_cache=True)
                past = out.past_key_values
            return (time.perf_counter() - start) / args.tokens, out.logits.float()

    before, logits = decode()
    with frozen_linears_as(model, "bfloat16") as swapped:
        after, cast_logits = decode()
    print(f"{args.model}, {args.rows} rows, {args.prompt}-token prefix, {args.threads} thread(s), bf16 autocast")
    print(f"as autocast casts them (every forward): {before * 1e3:8.1f} ms a token")
    print(f"{swapped} frozen tensors cast once:        {after * 1e3:8.1f} ms a token   {before / after:.2f}x")
    print(f"largest logit difference: {(cast_logits - logits).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
