"""How far each checkpoint's policy is from the untrained model, where the agent acts: the exact
KL(π_checkpoint ‖ π_untrained) per generated token (and per reply), the share of positions whose
greedy token differs, and the change of the replies' own log-probability, over the decision steps
of an eval run's traces (`metarag.train.drift`). The cpu recipe trains with KL 0 and no reference
pass, so its log has no KL; this is the number issue 32's "say why" asks for beside the reward's
spread and the gradient norms. One transformers model (the GGUF dequantized, float32) with every
checkpoint's adapter loaded by name; one start-model pass and one pass per checkpoint a reply.

    .venv/bin/python benchmarks/policy_kl.py RUN/trainer/checkpoint-20 RUN/trainer/checkpoint-100 \\
        --run docs/training-runs/heldout/belief-agent-hotpotqa-dev500-embedded-4692185c2a [--replies 40]
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("checkpoints", nargs="+", help="train-agent checkpoint-N folders (or PEFT adapter folders)")
    ap.add_argument("--run", required=True, help="an eval run folder whose traces hold the agent's replies")
    ap.add_argument("--replies", type=int, default=40, help="score the first N replies of the run (0: all)")
    ap.add_argument("--model", default="qwen2.5-coder-1.5b-instruct", help="the embedded model it was trained on")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from metarag.evaluate.runs import RunStore
    from metarag.llm.hf import HFLLM
    from metarag.llm.lora import adapter_folder
    from metarag.llm.models import embedded_model, ensure_gguf
    from metarag.train.drift import load_adapters, policy_drift, trace_replies

    torch.set_num_threads(args.threads)
    base = ensure_gguf(embedded_model(args.model))
    results = RunStore(args.run).load_results()
    model = AutoModelForCausalLM.from_pretrained(str(base.parent), gguf_file=base.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(base.parent), gguf_file=base.name)
    llm = HFLLM.from_model(model, tokenizer, identity="policy-kl")  # renders and tokenizes as the back-end does
    replies = trace_replies([results[q].trace for q in sorted(results)], llm)
    replies = replies[:args.replies] if args.replies else replies
    names = [Path(c).name for c in args.checkpoints]
    peft_model = load_adapters(model, [(n, str(adapter_folder(c))) for n, c in zip(names, args.checkpoints)])
    began = time.perf_counter()
    drifts = policy_drift(peft_model, names, replies)
    print(json.dumps({"run": args.run, "replies": len(replies), "tokens": drifts[0].tokens,
                      "seconds": round(time.perf_counter() - began, 1)}))
    print("\n| checkpoint | replies | tokens | KL / token (nats) | KL / reply (nats) | max KL at a token "
          "| greedy token changed | Δ log p(reply) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for d in drifts:
        print(f"| {d.adapter} | {d.replies} | {d.tokens} | {d.kl_per_token:.2e} | {d.kl_per_reply:.2e} | "
              f"{d.kl_max:.2e} | {d.greedy_flips:.2%} | {d.logprob_change:+.3f} |")


if __name__ == "__main__":
    main()
