"""The GPU path of `train-agent` on a tiny Qwen2 built from a config (no weights to carry): three
GRPO steps of the belief agent in the GPU precision ("bf16-autocast": float32 master weights, bf16
autocast), full fine-tuning at the paper's lr 1e-6, then the same in pure bf16 weights. Prints, per
step, the seconds and how much of one layer's weights changed (the share of elements and the mean
absolute change): with float32 master weights they move at 1e-6, in pure bf16 they do not.

Run on the device machine under the shipped 1-GPU config (it also runs on the CPU, slowly):

    accelerate launch --config_file configs/accelerate/1gpu.yaml benchmarks/gpu_train_check.py

It needs torch, transformers, accelerate, peft and TRL 1.16.0 (a wheel on that machine).
"""
from __future__ import annotations

import copy
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # tiny_hf: the tiny model
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

LAYER = "model.layers.0.mlp.up_proj.weight"


def main() -> None:
    import torch
    from tiny_hf import tiny_model_and_tokenizer
    from transformers import TrainerCallback

    from metarag.records import Passage, Question
    from metarag.retrieve.memory import MemoryRetriever
    from metarag.train.agent import AgentRollouts, AgentTrainSettings, train_agent
    from metarag.train.rewards import Reward

    class Spread(AgentRollouts):  # rewards 0, 1, 2 ... within a group: every step has a gradient
        def run(self, prompts, model, tokenizer, step, **kw):
            out = super().run(prompts, model, tokenizer, step, **kw)
            out["rollout_reward"] = [None if r is None else Reward(float(i), 0.0)
                                     for i, r in enumerate(out["rollout_reward"])]
            return out

    class Watch(TrainerCallback):
        def __init__(self):
            self.rows, self.last, self.clock = [], None, time.perf_counter()

        def on_step_end(self, args, state, control, model=None, **kw):
            weight = dict(model.named_parameters())[LAYER].detach().float().cpu().clone()
            if self.last is not None:
                delta = (weight - self.last).abs()
                self.rows.append((state.global_step, time.perf_counter() - self.clock,
                                  (delta > 0).float().mean().item(), delta.mean().item()))
            self.last, self.clock = weight, time.perf_counter()

        def on_train_begin(self, args, state, control, model=None, **kw):
            self.last = dict(model.named_parameters())[LAYER].detach().float().cpu().clone()
            self.clock = time.perf_counter()

    questions = [Question("q1", "What is the capital of France?", ("Paris",)),
                 Question("q2", "Where was Gustave Eiffel born?", ("Dijon",))]
    passages = [Passage("p1", "France", "The capital of France is Paris."),
                Passage("p2", "Eiffel", "Gustave Eiffel was born in Dijon.")]
    model, tokenizer = tiny_model_and_tokenizer()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    print(f"device {device}" + (f" ({torch.cuda.get_device_name(0)})" if device == "cuda" else ""))
    for precision in ("bf16-autocast", "bf16"):
        settings = AgentTrainSettings(method="belief-agent", reward="belief", lora=False, precision=precision,
                                      group_size=4, max_turns=2, step_max_tokens=16, top_k=1, steps=3, save_every=10)
        watch = Watch()
        retriever = MemoryRetriever(passages)
        with tempfile.TemporaryDirectory() as out:
            train_agent(questions, retriever, copy.deepcopy(model), tokenizer, out, settings, callbacks=[watch],
                        rollouts=Spread(questions, retriever, settings))
        for step, seconds, share, mean in watch.rows:
            print(f"{precision:>13} step {step}: {seconds:6.2f} s, {LAYER}: {share:.1%} of weights changed, "
                  f"mean |change| {mean:.2e}")


if __name__ == "__main__":
    main()
