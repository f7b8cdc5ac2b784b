"""The program `tests/test_train_launch.py` starts under `accelerate launch`: GRPO on the tiny Qwen2
built from a config, every process writing what it rolled out (seeds, completions) to
OUT/rank-<i>.jsonl, one line per step. Usage: launch_train_agent.py OUT STEPS."""
import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from metarag.records import Passage, Question  # noqa: E402
from metarag.retrieve.memory import MemoryRetriever  # noqa: E402
from metarag.train.agent import AgentRollouts, AgentTrainSettings, train_agent  # noqa: E402

QUESTIONS = [Question("q1", "What is the capital of France?", ("Paris",)),
             Question("q2", "Where was Gustave Eiffel born?", ("Dijon",))]
PASSAGES = [Passage("p1", "France", "The capital of France is Paris."),
            Passage("p2", "Eiffel", "Gustave Eiffel was born in Dijon.")]


class Recorded(AgentRollouts):
    def run(self, prompts, model, tokenizer, step, *, process=0, llm=None):
        out = super().run(prompts, model, tokenizer, step, process=process, llm=llm)
        with (OUT / f"rank-{process}.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, "seeds": self.last["seeds"], "prompts": list(prompts),
                                "completions": out["completion_ids"]}) + "\n")
        return out


if __name__ == "__main__":
    import torch
    from tiny_hf import tiny_model_and_tokenizer

    torch.set_num_threads(1)
    OUT, steps = Path(sys.argv[1]), int(sys.argv[2])
    model, tokenizer = tiny_model_and_tokenizer()
    settings = AgentTrainSettings(method="search-r1", reward="search-r1", group_size=2, max_turns=2,
                                  step_max_tokens=5, top_k=1, save_every=1, steps=steps, lora_r=4)
    retriever = MemoryRetriever(PASSAGES)
    report = train_agent(QUESTIONS, retriever, copy.deepcopy(model), tokenizer, OUT / "run", settings,
                         rollouts=Recorded(QUESTIONS, retriever, settings))
    print(f"rank done: steps={report.steps}")
    import torch.distributed as dist

    if dist.is_initialized():  # leave together: a rank exiting with the group alive can abort in gloo's threads
        dist.barrier()
        dist.destroy_process_group()
