"""Prompt and generation speed of llama.cpp builds, each in its own child process.

Each build is a folder holding an installed `llama_cpp` package (`pip install --no-deps --target DIR
WHEEL`, one per wheel `scripts/install-llama-cpp` built), or `venv` for the one installed in this
environment. Every child loads the same embedded GGUF and times the prompt evaluation of a fixed
~600-token prompt (cold KV cache, best of `--repeats`) and 32 greedy tokens. A child that crashes is
reported with its signal (the AMX build's SIGSEGV). Ratios are against the first build, measured in
the same run.

    .venv/bin/python benchmarks/llama_builds.py --build native-noamx=venv \\
        --build portable-avx2=/tmp/llama-portable-avx2 --build native=/tmp/llama-native [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys

CHILD = r"""
import json, sys, time
import llama_cpp
from metarag.llm.models import embedded_model, ensure_gguf
path = ensure_gguf(embedded_model(sys.argv[1]))
threads, repeats = int(sys.argv[2]), int(sys.argv[3])
llm = llama_cpp.Llama(model_path=str(path), n_ctx=2048, n_batch=512, n_threads=threads, verbose=False)
text = " ".join(f"Town {i} is a small settlement founded in {1700 + 7 * i} on the river Aa{i}; its mayor "
                f"in 2010 was Person {i}." for i in range(1, 26))
tokens = llm.tokenize(("Passages: " + text + "\nQuestion: Which town was founded first?\nAnswer:").encode())
best = float("inf")
for _ in range(repeats):
    llm.reset()
    start = time.perf_counter()
    llm.eval(tokens)
    best = min(best, time.perf_counter() - start)
llm.reset()
n, first = 0, None
for token in llm.generate(tokens, temp=0.0, reset=True):  # the first token comes after the prompt
    n += 1
    if n == 1:
        first = time.perf_counter()
    if n == 33:
        break
gen = time.perf_counter() - first  # 32 tokens, each one decode step
info = llama_cpp.llama_print_system_info().decode()
print(json.dumps({"prompt_tokens": len(tokens), "prompt_tok_s": len(tokens) / best,
                  "gen_tok_s": 32 / gen, "amx": "AMX_INT8 = 1" in info}))
"""


def measure(folder: str, model: str, threads: int, repeats: int) -> dict:
    env = dict(os.environ)
    if folder != "venv":
        env["PYTHONPATH"] = os.pathsep.join(p for p in (folder, env.get("PYTHONPATH", "")) if p)
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(threads), str(repeats)],
                         capture_output=True, text=True, env=env, timeout=1800)
    if out.returncode < 0:
        return {"crash": signal.Signals(-out.returncode).name}
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="append", required=True, metavar="NAME=DIR",
                        help="a build: its name and the folder holding its llama_cpp (or 'venv')")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rows = []
    for spec in args.build:
        name, _, folder = spec.partition("=")
        rows.append((name, measure(folder or "venv", args.model, args.threads, args.repeats)))
    base = next((r for _, r in rows if "prompt_tok_s" in r), None)
    print(f"model {args.model}, {args.threads} threads, prompt evaluation best of {args.repeats}\n")
    print("| build | AMX kernels | prompt tok/s | ratio | generated tok/s | ratio |")
    print("|---|---|---|---|---|---|")
    for name, r in rows:
        if "prompt_tok_s" not in r:
            print(f"| {name} | ? | crashed: {r.get('crash') or r.get('error')} | | | |")
            continue
        print(f"| {name} | {'yes' if r['amx'] else 'no'} | {r['prompt_tok_s']:.1f} | "
              f"{r['prompt_tok_s'] / base['prompt_tok_s']:.2f} | {r['gen_tok_s']:.1f} | "
              f"{r['gen_tok_s'] / base['gen_tok_s']:.2f} |")


if __name__ == "__main__":
    main()
