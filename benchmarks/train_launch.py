"""`train-agent` on one process against two (`accelerate launch`, the CPU's gloo), same tiny Qwen2
built from a config, same questions and settings: seconds per GRPO step (TRL's `step_time`:
rollouts, rewards and the policy update of the whole step, on the main process) and the two
runs' per-step loss and reward side by side, with their correlation (the curves' shape: rollouts
differ by process seed, so the numbers are not equal).

With two processes each rolls out half of every group, so on an idle machine with two cores a step
should take about half as long; on a loaded machine, less gain.

    .venv/bin/python benchmarks/train_launch.py [--steps 6] [--group 4] [--tokens 16]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve()
TESTS = HERE.parent.parent / "tests"  # tiny_hf.py: the tiny Qwen2 and tokenizer the tests build


def worker(out: Path, steps: int, group: int, tokens: int) -> None:
    import copy

    import torch

    sys.path.insert(0, str(TESTS))
    from tiny_hf import tiny_model_and_tokenizer

    from metarag.records import Passage, Question
    from metarag.retrieve.memory import MemoryRetriever
    from metarag.train.agent import AgentTrainSettings, train_agent

    torch.set_num_threads(1)
    questions = [Question(f"q{i}", text, (answer,)) for i, (text, answer) in enumerate([
        ("What is the capital of France?", "Paris"), ("Where was Gustave Eiffel born?", "Dijon"),
        ("Is Lyon a city in France?", "Yes"), ("Who built the tower?", "Eiffel")])]
    passages = [Passage("p1", "France", "The capital of France is Paris. Lyon is a city in France."),
                Passage("p2", "Eiffel", "Gustave Eiffel was born in Dijon. He built the tower.")]
    model, tokenizer = tiny_model_and_tokenizer()
    settings = AgentTrainSettings(method="belief-agent", reward="belief", group_size=group, max_turns=3,
                                  step_max_tokens=tokens, top_k=1, save_every=steps, steps=steps, lora_r=4,
                                  learning_rate=1e-4)
    train_agent(questions, MemoryRetriever(passages), copy.deepcopy(model), tokenizer, out, settings)


def run(processes: int, out: Path, args) -> list[dict]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    program = [str(HERE), "--worker", str(out), "--steps", str(args.steps), "--group", str(args.group),
               "--tokens", str(args.tokens)]
    if processes == 1:
        command = [sys.executable, *program]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        command = [str(Path(sys.executable).with_name("accelerate")), "launch", "--multi_gpu", "--num_processes",
                   str(processes), "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                   "--main_process_ip", "127.0.0.1", "--main_process_port", str(port), *program]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"{processes} process(es) failed:\n{done.stderr[-2000:]}")
    return [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]


def correlation(a: list[float], b: list[float]) -> float:
    import numpy as np

    if len(a) < 2 or np.std(a) == 0 or np.std(b) == 0:
        return float("nan")
    return float(np.corrcoef(a, b)[0, 1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=16)
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker), args.steps, args.group, args.tokens)
        return
    with tempfile.TemporaryDirectory() as tmp:
        logs = {p: run(p, Path(tmp) / f"p{p}", args) for p in (1, 2)}
    times = {p: [r["step_time"] for r in log if "step_time" in r] for p, log in logs.items()}
    print(f"{args.steps} GRPO steps, belief-agent, G = {args.group}, {args.tokens} tokens a step, tiny Qwen2 + LoRA")
    print("step | 1 process: s, loss, reward | 2 processes: s, loss, reward")
    for one, two in zip(logs[1], logs[2]):
        print(f"{one['step']:>4} | {one.get('step_time', 0):6.2f} {one.get('loss', 0):+.4f} "
              f"{one.get('rewards/reward/mean', 0):+.3f} | {two.get('step_time', 0):6.2f} {two.get('loss', 0):+.4f} "
              f"{two.get('rewards/reward/mean', 0):+.3f}")
    mean = {p: sum(t[1:]) / max(len(t) - 1, 1) for p, t in times.items()}  # the first step warms up
    print(f"seconds a step (steps 2+): 1 process {mean[1]:.2f}, 2 processes {mean[2]:.2f}, "
          f"ratio 2/1 = {mean[2] / mean[1]:.2f}")
    for key in ("loss", "rewards/reward/mean"):
        a = [r.get(key, 0.0) for r in logs[1]]
        b = [r.get(key, 0.0) for r in logs[2]]
        print(f"correlation of the two runs' {key} per step: {correlation(a, b):.2f}")


if __name__ == "__main__":
    main()
