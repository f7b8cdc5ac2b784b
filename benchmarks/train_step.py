"""Where a GRPO step of `train-agent` spends its time, for each training recipe, in one process.

One step of each recipe (`train.agent.RECIPES`: the paper's settings, and "cpu") on the same
training question(s), the same model (the embedded 0.5B through transformers, LoRA, as the CPU
trains it) and the same seeds, run one after the other; from the step's log: seconds of rollout
generation (the decision steps), the belief probe, the rest of the rollouts (retrieval, rewards,
layout), the reference model's log-prob pass, and the policy's forward and backward (everything else
in the step), then the whole step and its ratio to the first recipe's. It also says which bf16
matmul support the CPU has and times one float32 and one bf16-autocast matmul of the 0.5B's MLP shape
(what the cpu recipe's bf16 autocast stands on).

    .venv/bin/python benchmarks/train_step.py [--model hf-0.5b] [--recipes paper,cpu]
        [--dataset hotpotqa-train100] [--questions 1] [--threads 1]

A recipe may carry settings of its own after a colon, `name:key=value[;key=value]`
(e.g. `cpu:packed_passes=mask`, the cpu step with the packed rows' one-pass mask;
`cpu:rollout_prefix_tokens=0`, its rollouts running every request whole), to time one change.
"""
from __future__ import annotations

import argparse
import copy
import tempfile
import time
from pathlib import Path


def cpu_bf16() -> str:
    """The bf16 matmul support /proc/cpuinfo lists (AMX tiles, AVX512-BF16), or "none"."""
    try:
        flags = next(line for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("flags"))
    except (OSError, StopIteration):
        return "unknown"
    found = [f for f in ("amx_bf16", "avx512_bf16") if f in flags.split()]
    return ", ".join(found) or "none"


def matmul_seconds(torch, autocast: bool) -> float:
    a, w = torch.randn(1024, 896), torch.randn(896, 4864)
    context = torch.autocast("cpu", dtype=torch.bfloat16) if autocast else torch.no_grad()
    with context:
        a @ w
        start = time.perf_counter()
        for _ in range(5):
            a @ w
    return (time.perf_counter() - start) / 5


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="hf-0.5b")
    parser.add_argument("--recipes", default="paper,cpu")
    parser.add_argument("--dataset", default="hotpotqa-train100")
    parser.add_argument("--questions", type=int, default=1, help="questions per step (G rollouts each)")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    import torch

    from metarag.evaluate.harness import DatasetSpec, load_questions
    from metarag.evaluate.training_curves import read_log
    from metarag.llm.hf import HFLLM
    from metarag.llm.registry import backend_settings, parse_llm_spec
    from metarag.pipeline import open_retriever
    from metarag.settings import parse_assignments
    from metarag.train.agent import train_agent, trainable, training_settings

    torch.set_num_threads(args.threads)
    fp32, bf16 = matmul_seconds(torch, False), matmul_seconds(torch, True)
    print(f"CPU bf16 support: {cpu_bf16()}; a 1024x896 @ 896x4864 matmul: float32 {fp32 * 1e3:.1f} ms, "
          f"bf16 autocast {bf16 * 1e3:.1f} ms ({fp32 / bf16:.1f}x)")
    dataset = load_questions(DatasetSpec(preset=args.dataset))
    questions = list(dataset.questions[:args.questions])
    retriever = open_retriever(dataset.passages, "bm25")
    base = HFLLM(backend_settings(parse_llm_spec(args.model)))
    model = trainable(base.model)
    rows = []
    for name in args.recipes.split(","):
        recipe, _, extra = name.partition(":")
        values = {**parse_assignments([item for item in extra.split(";") if item]),
                  "steps": 1, "questions_per_step": len(questions), "save_every": 100}
        settings, reward_settings, _ = training_settings(recipe, values)
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            train_agent(questions, retriever, copy.deepcopy(model), base.tokenizer, out, settings,
                        reward_settings=reward_settings)
            wall = time.perf_counter() - start
            (record,) = read_log(out)
        parts = {k: record.get(f"time/{k}", 0.0) for k in ("generation", "probe", "other", "rollouts",
                                                            "reference", "policy")}
        step = parts["rollouts"] + parts["reference"] + parts["policy"]
        rows.append((name, parts, step, wall, record))
        print(f"{name}: step {step:.1f} s (wall {wall:.1f} s with loading and saving)", flush=True)
    print()
    print(f"one GRPO step, {args.model} + LoRA, {len(questions)} question(s) of {args.dataset}, "
          f"{args.threads} thread(s)")
    print("| recipe | rollout generation | belief probe | rest of rollouts | reference pass | policy fwd/bwd "
          "| step | speed-up | completion tokens / rollout | prompt tokens run / reused |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    first = rows[0][2]
    for name, parts, step, _, record in rows:
        rest = parts["rollouts"] - parts["generation"] - parts["probe"]
        print(f"| {name} | {parts['generation']:.1f} | {parts['probe']:.1f} | {rest:.1f} | {parts['reference']:.1f} "
              f"| {parts['policy']:.1f} | {step:.1f} | {first / step:.2f}x "
              f"| {record.get('completions/mean_length', float('nan')):.0f} "
              f"| {record.get('prompt_tokens/computed', float('nan')):,.0f} / "
              f"{record.get('prompt_tokens/reused', 0):,.0f} |")
    print("(seconds; rollout generation and probe are summed over the step's rollouts, which run as one batch)")


if __name__ == "__main__":
    main()
