"""The program `tests/test_train_launch.py` starts under `accelerate launch`: GRPO on the tiny Qwen2
built from a config, every process writing what it rolled out (seeds, completions) to
OUT/rank-<i>.jsonl, one line per step. Usage: launch_train_agent.py OUT STEPS [ddp|fsdp].

"fsdp" (launched with configs/accelerate/8gpu-fsdp.yaml): the model is read from the folder OUT/base
through `load_base` (the main process reads the weights, the other holds the architecture on the meta
device), trained in full with a KL reference model that the frozen belief probe reads, and every
process calls the model a different number of times inside its rollouts (process i three times i
more), which hangs unless the rollouts run on the whole model. Each line then also says what the
model's parameters were inside the rollouts and after the step (DTensor: sharded again), and
OUT/load-<i>.json what each process loaded."""
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
    extra_calls = False  # "fsdp": process i calls the model 3·i more times inside the rollouts

    def run(self, prompts, model, tokenizer, step, *, process=0, llm=None, reference=None):
        import torch

        inside = type(next(model.parameters())).__name__
        if self.extra_calls:
            with torch.no_grad():
                for _ in range(3 * process):
                    model(input_ids=torch.tensor([[5, 6, 7]]))
        out = super().run(prompts, model, tokenizer, step, process=process, llm=llm, reference=reference)
        with (OUT / f"rank-{process}.jsonl").open("a") as f:
            f.write(json.dumps({"step": step, "seeds": self.last["seeds"], "prompts": list(prompts),
                                "completions": out["completion_ids"], "parameters_inside": inside}) + "\n")
        return out


def fsdp_on_cpu_processes() -> None:
    """accelerate applies FSDP on accelerator devices only (`AcceleratorState` turns it on for multi-GPU
    kinds of processes, never for MULTI_CPU); FSDP2 itself runs on the CPU over gloo. So here CPU
    processes are reported as multi-GPU ones and accelerate shards the model with FSDP2 on the CPU: the
    same code path a GPU node takes, on the machine the tests run on."""
    from accelerate.state import DistributedType, PartialState

    init = PartialState.__init__

    def as_multi_gpu(self, *args, **kwargs):
        init(self, *args, **kwargs)
        if self._shared_state.get("distributed_type") == DistributedType.MULTI_CPU:
            self._shared_state["distributed_type"] = DistributedType.MULTI_GPU

    PartialState.__init__ = as_multi_gpu


if __name__ == "__main__":
    import torch
    from tiny_hf import tiny_model_and_tokenizer
    from transformers import TrainerCallback

    torch.set_num_threads(1)
    OUT, steps = Path(sys.argv[1]), int(sys.argv[2])
    mode = sys.argv[3] if len(sys.argv) > 3 else "ddp"
    callbacks = []
    if mode == "fsdp":
        from accelerate import PartialState

        from metarag.llm.hf import HFSettings
        from metarag.train.agent import load_base

        fsdp_on_cpu_processes()
        state = PartialState(cpu=True)
        model, tokenizer, identity, sha = load_base(
            HFSettings(embedded=None, path=str(OUT / "base"), device="cpu", dtype="float32"), state)
        (OUT / f"load-{state.process_index}.json").write_text(json.dumps(
            {"meta": next(model.parameters()).is_meta, "identity": identity, "sha256": sha}))
        settings = AgentTrainSettings(method="search-r1", reward="search-r1", group_size=2, max_turns=2,
                                      step_max_tokens=5, top_k=1, save_every=1, steps=steps, lora=False,
                                      kl_coef=0.01, probe_weights="frozen")

        class AfterStep(TrainerCallback):
            def on_step_end(self, args, state, control, model=None, **kw):
                with (OUT / f"after-{state.global_step}-rank-{torch.distributed.get_rank()}.txt").open("w") as f:
                    f.write(type(next(model.parameters())).__name__)

        callbacks.append(AfterStep())
        Recorded.extra_calls = True
    else:
        model, tokenizer = tiny_model_and_tokenizer()
        model = copy.deepcopy(model)
        settings = AgentTrainSettings(method="search-r1", reward="search-r1", group_size=2, max_turns=2,
                                      step_max_tokens=5, top_k=1, save_every=1, steps=steps, lora_r=4)
    retriever = MemoryRetriever(PASSAGES)
    report = train_agent(QUESTIONS, retriever, model, tokenizer, OUT / "run", settings,
                         rollouts=Recorded(QUESTIONS, retriever, settings), callbacks=callbacks)
    print(f"rank done: steps={report.steps}")
    import torch.distributed as dist

    if dist.is_initialized():  # leave together: a rank exiting with the group alive can abort in gloo's threads
        dist.barrier()
        dist.destroy_process_group()
