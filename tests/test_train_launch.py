"""`metarag train-agent` under `accelerate launch` with two processes on the CPU (gloo), on a tiny
Qwen2 built from a config (tests/launch_train_agent.py): each process rolls out its own share of a
question's group with seeds of its own, one process writes the log and the checkpoints, and a second
launch resumes from the last checkpoint; and under the FSDP2 configuration the 8-GPU recipe ships
(configs/accelerate/8gpu-fsdp.yaml, FSDP2 run on the CPU), where the processes' rollouts call the
sharded model different numbers of times without hanging, the main process alone reads the weights,
and the KL reference model holds the starting weights on every process."""
import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("torch", "transformers", "trl", "peft", "accelerate")
pytestmark = [pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in HEAVY),
                                 reason="needs pip install 'metarag[hf,train]'"),
              pytest.mark.slow]  # two launches of two training processes: half a minute
SCRIPT = Path(__file__).parent / "launch_train_agent.py"
FSDP_CONFIG = Path(__file__).parent.parent / "configs" / "accelerate" / "8gpu-fsdp.yaml"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(out: Path, steps: int, mode: str = "ddp") -> None:
    accelerate = Path(sys.executable).with_name("accelerate")
    how = ["--config_file", str(FSDP_CONFIG)] if mode == "fsdp" else ["--multi_gpu"]
    command = [str(accelerate), "launch", *how, "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_ip", "127.0.0.1",
               "--main_process_port", str(free_port()), str(SCRIPT), str(out), str(steps), mode]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    # a hang (the failure this guards against under FSDP) ends at the timeout, not never
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("rank done") == 2


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_two_processes_train_distinct_rollouts_one_writer_and_resume(tmp_path):
    from launch_train_agent import QUESTIONS

    from metarag.train.agent import training_order

    launch(tmp_path, 3)
    launch(tmp_path, 4)  # resumes at step 3, in the second epoch (two questions an epoch), and trains step 4
    ranks = [read(tmp_path / f"rank-{i}.jsonl") for i in (0, 1)]
    assert [[r["step"] for r in rank] for rank in ranks] == [[0, 1, 2, 3]] * 2  # the second launch: step 4 only
    for zero, one in zip(*ranks):
        assert zero["prompts"] == one["prompts"] and len(zero["prompts"]) == 1  # one question's group of 2, split
        assert not set(zero["seeds"]) & set(one["seeds"])
        assert zero["completions"] != one["completions"]  # no two processes draw the same rollout
    # the resumed launch draws the uninterrupted order (the sampler told its epoch through accelerate's
    # sharded loader): step 4 is the second epoch's second question, not the first epoch's again
    order = training_order(len(QUESTIONS), 0, 1, 4)
    assert order[3] != order[1]
    assert [QUESTIONS[i].text in r["prompts"][0] for r, (i,) in zip(ranks[0], order)] == [True] * 4
    run = tmp_path / "run"
    log = read(run / "log.jsonl")
    assert [r["step"] for r in log] == [1, 2, 3, 4]  # the main process alone writes: one line a step
    for step in (3, 4):  # each launch's last checkpoint holds the merged model
        manifest = json.loads((run / "trainer" / f"checkpoint-{step}" / "metarag_manifest.json").read_text())
        assert manifest["steps"] == step and (run / "trainer" / f"checkpoint-{step}" / "merged").is_dir()
    state = json.loads((run / "trainer" / "checkpoint-4" / "trainer_state.json").read_text())
    assert state["global_step"] == 4


def test_fsdp2_rollouts_run_on_the_whole_model_loaded_by_the_main_process_alone(tmp_path):
    from tiny_hf import tiny_model_and_tokenizer

    model, tokenizer = tiny_model_and_tokenizer()
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    launch(tmp_path, 2, mode="fsdp")
    loads = [json.loads((tmp_path / f"load-{i}.json").read_text()) for i in (0, 1)]
    assert [x["meta"] for x in loads] == [False, True]  # process 1 held the architecture only
    assert loads[0]["identity"] == loads[1]["identity"] and loads[1]["sha256"] == loads[0]["sha256"] is not None
    ranks = [read(tmp_path / f"rank-{i}.jsonl") for i in (0, 1)]
    assert [[r["step"] for r in rank] for rank in ranks] == [[0, 1]] * 2
    # inside the rollouts the parameters were whole (process 1 called the model 3 more times than
    # process 0 there, which hangs on sharded parameters); after each step they were shards again
    assert {r["parameters_inside"] for rank in ranks for r in rank} == {"Parameter"}
    assert {(tmp_path / f"after-{s}-rank-{i}.txt").read_text() for s in (1, 2) for i in (0, 1)} == {"DTensor"}
    for zero, one in zip(*ranks):
        assert not set(zero["seeds"]) & set(one["seeds"])
    log = read(tmp_path / "run" / "log.jsonl")
    assert [r["step"] for r in log] == [1, 2] and all(math.isfinite(r["loss"]) for r in log)
    # the first step's policy is the starting weights, and so is the reference on both processes (process
    # 1's was built on the meta device and sent process 0's weights): no divergence yet
    assert abs(log[0]["kl"]) < 1e-5
    manifest = json.loads((tmp_path / "run" / "trainer" / "checkpoint-2" / "metarag_manifest.json").read_text())
    assert manifest["steps"] == 2 and (tmp_path / "run" / "trainer" / "checkpoint-2" / "merged").is_dir()
