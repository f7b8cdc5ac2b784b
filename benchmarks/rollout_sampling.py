"""Rollout decoding on the transformers back-end: each step's next tokens picked on the model's device
for all rows at once (`HFSettings.sampling` "device") against the shared rule in numpy on the host,
row by row, with the whole logit rows copied back at every step ("host", the path rollouts took
before 2026-12-06). One model (the embedded 0.5B read through transformers unless `--llm` names
another), one batch of G = 5 sampled rollouts of the same prompt (temperature 1, seeds 0-4, one top
alternative a token, as the agents ask), decoded with each path in turn, alternating, best of
`--repeats`; the two paths' tokens are checked equal (same seeds, same tokens). Prints rollout tokens
per second of each and their ratio: both timed in this process under the same load; and the time each
path spent picking tokens (everything between one forward pass's logits and the next pass): on the CPU
"device" is the CPU too, so the ratio there is the cost of the picking alone, while on a GPU the host
path's picking time is added to every decoding step's forward pass and the device path's is not.

    nice -n 15 .venv/bin/python benchmarks/rollout_sampling.py [--llm hf-0.5b] [--tokens 128] [--repeats 3]
        [--autocast] [--threads 1]
"""
from __future__ import annotations

import argparse
import time

PROMPT = ("Answer the question by reasoning step by step. You may search: write <search> query </search> and "
          "the results come back between <information> and </information>. Give the final answer between "
          "<answer> and </answer>.\n\nQuestion: Which magazine was started first, Arthur's Magazine or First "
          "for Women?")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llm", default="hf-0.5b", help="a transformers spec (hf, hf-0.5b, hf:PATH)")
    parser.add_argument("--group", type=int, default=5, help="rollouts decoded together (G)")
    parser.add_argument("--tokens", type=int, default=128, help="tokens each rollout may generate")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--autocast", action="store_true", help="bf16 autocast, as the cpu recipe's rollouts")
    args = parser.parse_args()

    import dataclasses

    import torch

    import metarag.llm.hf as hf
    from metarag.llm.base import Decoding
    from metarag.llm.hf import HFLLM
    from metarag.llm.registry import backend_settings, parse_llm_spec
    from metarag.records import Message

    picking = {"device": 0.0, "host": 0.0}
    steps = {"device": 0, "host": 0}

    def timed(cls, where):
        class Timed(cls):
            def __call__(self, *a, **k):
                start = time.perf_counter()
                try:
                    return super().__call__(*a, **k)
                finally:
                    picking[where] += time.perf_counter() - start
                    steps[where] += 1
        return Timed

    hf.DeviceSampler, hf.HostSampler = timed(hf.DeviceSampler, "device"), timed(hf.HostSampler, "host")
    torch.set_num_threads(args.threads)
    settings = dataclasses.replace(backend_settings(parse_llm_spec(args.llm)), device="cpu", dtype="float32",
                                   autocast=args.autocast, prefix_cache_tokens=0)
    start = time.perf_counter()
    base = HFLLM(settings)
    print(f"{base.identity}: loaded in {time.perf_counter() - start:.0f} s; {args.threads} torch thread(s)"
          f"{', bf16 autocast' if args.autocast else ''}")
    paths = {where: HFLLM.from_model(base.model, base.tokenizer, identity=base.identity,
                                     settings=dataclasses.replace(settings, sampling=where))
             for where in ("device", "host")}
    prompt = (Message("user", PROMPT),)
    decodings = [Decoding(max_tokens=args.tokens, temperature=1.0, seed=seed, logprobs=1)
                 for seed in range(args.group)]
    best = {where: float("inf") for where in paths}
    tokens: dict[str, list[tuple[int, ...]]] = {}
    paths["device"].generate_batch([prompt] * args.group, [dataclasses.replace(d, max_tokens=4) for d in decodings])
    picked = {where: float("inf") for where in paths}
    for rep in range(args.repeats):
        order = ("device", "host") if rep % 2 == 0 else ("host", "device")
        for where in order:
            picking[where], steps[where] = 0.0, 0
            start = time.perf_counter()
            out = paths[where].generate_batch([prompt] * args.group, decodings)
            best[where] = min(best[where], time.perf_counter() - start)
            picked[where] = min(picked[where], picking[where] / max(steps[where], 1))
            tokens[where] = [c.token_ids for c in out]
    count = sum(len(t) for t in tokens["device"])
    same = tokens["device"] == tokens["host"]
    print(f"G = {args.group} rollouts of up to {args.tokens} tokens, temperature 1, seeds 0-{args.group - 1}: "
          f"{count} tokens; the two paths' tokens equal: {same}")
    for where in ("host", "device"):
        print(f"  {where:6s}: {best[where]:7.2f} s, {count / best[where]:7.1f} rollout tokens/s (best of "
              f"{args.repeats}); picking the next tokens {1000 * picked[where]:.1f} ms a decoding step")
    print(f"ratio device/host: {best['host'] / best['device']:.2f}x the rollout tokens per second")
    if not same:
        raise SystemExit("the device path's tokens differ from the host rule's")


if __name__ == "__main__":
    main()
