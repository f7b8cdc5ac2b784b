"""Batched decoding on the embedded llama.cpp back-end (`eval --batch N`, `llm/llama_slots.py`).

The difficulty filter's run (issue 51: the untrained belief-agent, T=3, k=2, 128 tokens a step, K
sampled answers a question at temperature 1.0, top-p 1.0) twice on the same questions of the declared
training pool, in one process: one answer at a time (as `eval --samples K` runs), then the K samples of
each question in lockstep (`--batch K`: each round's requests decoded together in one context, the
shared prompt prefix evaluated once). Prints each pass's wall time, generated tokens a second and the
speed-up ratio, the EM of each pass, and how many answers are the same: few are, because the two
passes' logits differ in the last digits (llama.cpp's sums depend on the batch a token is evaluated
in, on the lone path too) and over ~200 tokens sampled at temperature 1.0 one draw near a boundary
is enough to part two episodes; the filter needs the same distribution, not the same draws. That the
batched KV cells hold the right thing is tested greedily (tests/test_llama_slots.py: batched and
lone greedy answers of the 0.5B equal). Both passes write to a temporary runs folder; nothing is kept.

Measured 2026-12-07 (2 questions x 5 samples, the 1.5B, one thread, the two cores shared with two
other runs): one at a time 829 s, lockstep 429 s: 1.93x; EM 20.0 both.

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
    parser.add_argument("--llm", default="embedded")
    args = parser.parse_args()
    if not (POOL / "declared_corpus.jsonl").is_file():
        raise SystemExit(f"no pool corpus at {POOL}: write it with `scripts/make-train-pool {POOL} --declared`")
    common = dict(dataset=str(POOL / "declared_train.jsonl"), corpus=str(POOL / "declared_corpus.jsonl"),
                  llm=args.llm, settings={"T": 3, "k": 2, "step_max_tokens": 128}, limit=args.questions,
                  samples=args.samples, temperature=1.0, top_p=1.0, threads=args.threads, response_cache=False)
    passes = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, batch in (("one at a time", 1), (f"lockstep x{args.samples}", args.samples)):
            start = time.perf_counter()
            done = run("belief-agent", runs_dir=Path(tmp) / name.replace(" ", "-"), batch=batch, **common)
            seconds = time.perf_counter() - start
            results = {(r.question_id, r.sample): r for r in done.sampled}
            tokens = sum(s.usage.completion_tokens for r in results.values() for s in r.trace.steps)
            passes[name] = (seconds, tokens, results)
            em = 100 * sum(r.scores.em for r in results.values()) / len(results)
            print(f"{name:>14}: {seconds:7.1f} s, {len(results)} answers, {tokens} tokens generated "
                  f"({tokens / seconds:.1f}/s), EM {em:.1f}", flush=True)
    (s1, t1, r1), (s2, t2, r2) = passes.values()
    same = sum(r1[key].prediction == r2[key].prediction for key in r1 if key in r2)
    print(f"speed-up {s1 / s2:.2f}x in wall time, {(t2 / s2) / (t1 / s1):.2f}x in tokens a second; "
          f"{same} of {len(r1)} answers the same")


if __name__ == "__main__":
    main()
