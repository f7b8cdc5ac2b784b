"""`train-agent` on one process against two (`accelerate launch`, the CPU's gloo), same tiny Qwen2
built from a config, same questions and settings: seconds per GRPO step (TRL's `step_time`:
rollouts, rewards and the policy update of the whole step, on the main process) and the two
runs' per-step loss and reward side by side, with their correlation (the curves' shape: rollouts
differ by process seed, so the numbers are not equal). A random tiny model earns no answer reward,
so the reward here is a learnable stand-in: the share of a rollout's generated tokens whose id is
even (the policy can move its logits toward them), so that both curves have a shape to compare.

With two processes each rolls out half of every group, so on an idle machine with two cores a step
should take about half as long; on a loaded machine, less gain.

`--memory`: host memory per process at load, two processes launched under the FSDP2 configuration
(configs/accelerate/8gpu-fsdp.yaml: `cpu_ram_efficient_loading`), loading `--llm` (the embedded 0.5B
read through transformers) and making the KL reference model of full fine-tuning, the way train-agent
did before 2026-12-06 ("before": every process loads the float32 weights, then deep-copies them for
the reference) and the way it does now ("after": `load_base`, the main process alone reads the weights,
the other holds the architecture on the meta device; `meta_reference`, the reference on the meta device,
given the main process's weights only when FSDP2 shards it). Resident memory after loading, after the
reference, and the peak (VmHWM), per process, each way in a launch of its own.

    .venv/bin/python benchmarks/train_launch.py [--steps 20] [--group 8] [--tokens 16] [--lr 1e-3]
    nice -n 15 .venv/bin/python benchmarks/train_launch.py --memory [--llm hf-0.5b]
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


def worker(out: Path, steps: int, group: int, tokens: int, lr: float) -> None:
    import copy

    import torch

    sys.path.insert(0, str(TESTS))
    from tiny_hf import tiny_model_and_tokenizer

    from metarag.records import Passage, Question
    from metarag.retrieve.memory import MemoryRetriever
    from metarag.train.agent import AgentRollouts, AgentTrainSettings, step_generations, train_agent
    from metarag.train.rewards import Reward

    class EvenTokens(AgentRollouts):
        def _reward(self, trace, question, verdicts=None):
            ids = [t.id for g in step_generations(trace) for t in g.logprobs or ()]
            share = sum(i % 2 == 0 for i in ids) / max(len(ids), 1)
            return None if trace.error is not None else Reward(share, share)

    torch.set_num_threads(1)
    questions = [Question(f"q{i}", text, (answer,)) for i, (text, answer) in enumerate([
        ("What is the capital of France?", "Paris"), ("Where was Gustave Eiffel born?", "Dijon"),
        ("Is Lyon a city in France?", "Yes"), ("Who built the tower?", "Eiffel")])]
    passages = [Passage("p1", "France", "The capital of France is Paris. Lyon is a city in France."),
                Passage("p2", "Eiffel", "Gustave Eiffel was born in Dijon. He built the tower.")]
    model, tokenizer = tiny_model_and_tokenizer()
    settings = AgentTrainSettings(method="belief-agent", reward="belief", group_size=group, max_turns=3,
                                  step_max_tokens=tokens, top_k=1, save_every=steps, steps=steps, lora=False,
                                  kl_coef=0.0, learning_rate=lr)
    retriever = MemoryRetriever(passages)
    train_agent(questions, retriever, copy.deepcopy(model), tokenizer, out, settings,
                rollouts=EvenTokens(questions, retriever, settings))


def memory(key: str) -> float:
    """This process's VmRSS or VmHWM in GB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024 ** 2
    return float("nan")


def memory_worker(out: Path, way: str, llm: str) -> None:
    """One process of a `--memory` launch: load as `way` says, write what it held."""
    import copy
    import dataclasses

    import torch
    from accelerate import PartialState

    from metarag.llm.registry import backend_settings, parse_llm_spec
    from metarag.train.agent import load_base, meta_reference, rank0_loading, trainable

    torch.set_num_threads(1)
    state = PartialState(cpu=True)
    settings = dataclasses.replace(backend_settings(parse_llm_spec(llm)), device="cpu", dtype="float32")
    start = memory("VmRSS")
    if way == "before":
        from metarag.llm.hf import HFLLM

        model = trainable(HFLLM(settings).model)
        loaded = memory("VmRSS")
        reference = copy.deepcopy(model)
    else:
        model, *_ = load_base(settings, state)
        loaded = memory("VmRSS")
        reference = meta_reference(model)
    record = {"process": state.process_index, "way": way, "rank0_loading": rank0_loading(), "start_gb": start,
              "loaded_gb": loaded, "with_reference_gb": memory("VmRSS"), "peak_gb": memory("VmHWM"),
              "policy_on_meta": next(model.parameters()).is_meta,
              "reference_on_meta": next(reference.parameters()).is_meta,
              "parameters": sum(p.numel() for p in model.parameters())}
    (out / f"memory-{way}-{state.process_index}.json").write_text(json.dumps(record))
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def memory_benchmark(args) -> None:
    config = HERE.parent.parent / "configs" / "accelerate" / "8gpu-fsdp.yaml"
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for way in ("before", "after"):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            command = [str(Path(sys.executable).with_name("accelerate")), "launch", "--config_file", str(config),
                       "--num_processes", "2", "--mixed_precision", "no", "--main_process_ip", "127.0.0.1",
                       "--main_process_port", str(port), str(HERE), "--memory-worker", tmp, "--way", way,
                       "--llm", args.llm]
            done = subprocess.run(command, capture_output=True, text=True, env=env)
            if done.returncode != 0:
                raise SystemExit(f"the {way} launch failed:\n{done.stderr[-2000:]}")
            rows += [json.loads((Path(tmp) / f"memory-{way}-{i}.json").read_text()) for i in (0, 1)]
    print(f"host memory per process at load, {args.llm}, 2 gloo processes under configs/accelerate/8gpu-fsdp.yaml "
          f"({rows[0]['parameters'] / 1e6:.0f}M parameters, float32; the KL reference of full fine-tuning made too)")
    print("way    | process | weights read | RSS loaded GB | RSS with reference GB | peak (VmHWM) GB")
    for r in rows:
        print(f"{r['way']:6s} | {r['process']:7d} | {'no (meta)' if r['policy_on_meta'] else 'yes':12s} | "
              f"{r['loaded_gb']:13.2f} | {r['with_reference_gb']:21.2f} | {r['peak_gb']:15.2f}")
    for way in ("before", "after"):
        total = sum(r["with_reference_gb"] for r in rows if r["way"] == way)
        print(f"{way}: both processes together {total:.2f} GB resident after loading and the reference")


def run(processes: int, out: Path, args) -> list[dict]:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    program = [str(HERE), "--worker", str(out), "--steps", str(args.steps), "--group", str(args.group),
               "--tokens", str(args.tokens), "--lr", str(args.lr)]
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
    parser.add_argument("--memory-worker", metavar="OUT", help=argparse.SUPPRESS)
    parser.add_argument("--way", choices=("before", "after"), help=argparse.SUPPRESS)
    parser.add_argument("--memory", action="store_true", help="host memory per process at load (see above)")
    parser.add_argument("--llm", default="hf-0.5b", help="--memory: the transformers model loaded")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3,
                        help="learning rate (full fine-tuning of a tiny model, a stand-in reward)")
    args = parser.parse_args()
    if args.worker:
        worker(Path(args.worker), args.steps, args.group, args.tokens, args.lr)
        return
    if args.memory_worker:
        memory_worker(Path(args.memory_worker), args.way, args.llm)
        return
    if args.memory:
        memory_benchmark(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        logs = {p: run(p, Path(tmp) / f"p{p}", args) for p in (1, 2)}
    times = {p: [r["step_time"] for r in log if "step_time" in r] for p, log in logs.items()}
    print(f"{args.steps} GRPO steps, belief-agent, G = {args.group}, {args.tokens} tokens a step, tiny Qwen2, "
          "full fine-tuning")
    print("step | 1 process: s, loss, reward | 2 processes: s, loss, reward")
    for one, two in zip(logs[1], logs[2]):
        print(f"{one['step']:>4} | {one.get('step_time', 0):6.2f} {one.get('loss', 0):+.4f} "
              f"{one.get('rewards/reward/mean', 0):+.3f} | {two.get('step_time', 0):6.2f} {two.get('loss', 0):+.4f} "
              f"{two.get('rewards/reward/mean', 0):+.3f}")
    mean = {p: sum(t[1:]) / max(len(t) - 1, 1) for p, t in times.items()}  # the first step warms up
    print(f"seconds a step (steps 2+): 1 process {mean[1]:.2f}, 2 processes {mean[2]:.2f}, "
          f"ratio 2/1 = {mean[2] / mean[1]:.2f}")
    half = len(logs[1]) // 2
    for p, log in logs.items():
        rewards = [r.get("rewards/reward/mean", 0.0) for r in log]
        print(f"{p} process(es): mean reward, first half of the steps {sum(rewards[:half]) / half:.3f}, "
              f"second half {sum(rewards[half:]) / (len(rewards) - half):.3f}")
    for key in ("loss", "rewards/reward/mean"):
        a = [r.get(key, 0.0) for r in logs[1]]
        b = [r.get(key, 0.0) for r in logs[2]]
        print(f"correlation of the two runs' {key} per step: {correlation(a, b):.2f}")


if __name__ == "__main__":
    main()
