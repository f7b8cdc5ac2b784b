"""Batched decoding on the embedded llama.cpp back-end (`eval --batch N`, `llm/llama_slots.py`).

The difficulty filter's run (issue 51: the untrained belief-agent, T=3, k=2, 128 tokens a step, K
sampled answers a question at temperature 1.0, top-p 1.0) twice on the same questions of the declared
training pool, in one process, question by question with the two passes' order alternating (so that
what else the machine runs weighs on both alike): one answer at a time (as `eval --samples K` runs) and
the K samples of the question in lockstep (`--batch K`: each round's requests decoded together in one context, the
shared prompt prefix evaluated once). Prints each pass's wall time, generated tokens a second and the
speed-up ratio, the EM of each pass, and how many answers are the same: few are, because the two
passes' logits differ in the last digits (llama.cpp's sums depend on the batch a token is evaluated
in, on the lone path too) and over ~200 tokens sampled at temperature 1.0 one draw near a boundary
is enough to part two episodes; the filter needs the same distribution, not the same draws. That the
batched KV cells hold the right thing is tested greedily (tests/test_llama_slots.py: batched and
lone greedy answers of the 0.5B equal). Both passes write to a temporary runs folder; nothing is kept.

Measured 2026-12-07 (2 questions x 5 samples, the 1.5B, one thread, the two cores shared with the
two background runs and a test suite): one at a time 465 s, lockstep 323 s: 1.44x (EM 20.0 and 30.0
on 10 answers: the same distribution within its noise). A first version of this script, which ran
the whole passes one after the other, said 1.9x: its
one-at-a-time passes shared the cores with a test run, the other passes did not. The gain is
smaller than the 2.5x of decoding alone (four one-token sequences a step against one) because the
agent rebuilds its prompt each turn: its prompt tokens, evaluated at the same speed either way,
are over half the work.

    .venv/bin/python benchmarks/llama_batch.py [--questions 2] [--samples 5] [--threads 1]
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from metarag import run

ROOT = Path(__file__).resolve().parents[1]
POOL = ROOT / "docs" / "training-runs" / "pool"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--questions", type=int, default=2)
    parser.add_argument("--samples", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    args = parser.parse_args()
    if not (POOL / "declared_corpus.jsonl").is_file():
        raise SystemExit(f"no pool corpus at {POOL}: write it with `scripts/make-train-pool {POOL} --declared`")
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings

    models = {batch: LlamaCppLLM(LlamaCppSettings(embedded=args.model, n_threads=args.threads,
                                                  batch_slots=batch if batch > 1 else 0))
              for batch in (1, args.samples)}
    lines = (POOL / "declared_train.jsonl").read_text().splitlines()[:args.questions]
    seconds = {1: 0.0, args.samples: 0.0}
    results: dict[int, dict] = {1: {}, args.samples: {}}
    with tempfile.TemporaryDirectory() as tmp:
        for n, line in enumerate(lines):  # question by question, the passes' order alternating: drift shared
            question = Path(tmp) / f"q{n}.jsonl"
            question.write_text(line + "\n")
            for batch in ((1, args.samples) if n % 2 == 0 else (args.samples, 1)):
                start = time.perf_counter()
                done = run("belief-agent", dataset=str(question), corpus=str(POOL / "declared_corpus.jsonl"),
                           settings={"T": 3, "k": 2, "step_max_tokens": 128}, samples=args.samples,
                           temperature=1.0, top_p=1.0, batch=batch, runs_dir=Path(tmp) / f"b{batch}",
                           llm_instance=models[batch])
                seconds[batch] += time.perf_counter() - start
                results[batch].update({(r.question_id, r.sample): r for r in done.sampled})
    for batch, name in ((1, "one at a time"), (args.samples, f"lockstep x{args.samples}")):
        got = results[batch]
        tokens = sum(s.usage.completion_tokens for r in got.values() for s in r.trace.steps)
        em = 100 * sum(r.scores.em for r in got.values()) / len(got)
        print(f"{name:>14}: {seconds[batch]:7.1f} s, {len(got)} answers, {tokens} tokens generated "
              f"({tokens / seconds[batch]:.1f}/s), EM {em:.1f}", flush=True)
    one, many = results[1], results[args.samples]
    same = sum(one[key].prediction == many[key].prediction for key in one if key in many)
    print(f"speed-up {seconds[1] / seconds[args.samples]:.2f}x in wall time; {same} of {len(one)} answers the same")


if __name__ == "__main__":
    main()
