"""`metarag train-agent`: the rollout layout (token ids line up with the trace, env_mask 0 exactly on
injected tokens), the rollouts (the agent's own policy through run_many on the live model, G that
differ by seed), TRL's GRPO run end to end on a tiny Qwen2 built from a config (rewards reach the
trainer unchanged, every component logged, a checkpoint with its manifest, resume after an
interruption), the checkpoint evaluated with `eval --llm hf:CHECKPOINT`, the refusal of evaluation
splits, and the curves."""
import contextlib
import dataclasses
import importlib.util
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from metarag.errors import ConfigError
from metarag.evaluate.training_curves import plot_curves, read_log
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.registry import build_method
from metarag.methods.runner import Runtime, Sampling, run_many
from metarag.methods.search_agent import INFORMATION_BLOCK, format_information
from metarag.policy.agent_trace import STEP_PURPOSE
from metarag.records import Generate, Passage, Question, Retrieve
from metarag.retrieve.memory import MemoryRetriever
from metarag.train.agent import (
    FRESH_PROMPT,
    MANIFEST,
    MERGED,
    TEXT_CONTINUED,
    TOKEN_EXACT,
    AgentRollouts,
    AgentTrainSettings,
    check_training_split,
    rollout_sample,
    step_generations,
)

HEAVY = ("torch", "transformers", "trl", "peft")
needs_trl = pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in HEAVY),
                               reason="needs pip install 'metarag[hf,train]'")

QUESTIONS = [Question("q1", "What is the capital of France?", ("Paris",)),
             Question("q2", "Where was Gustave Eiffel born?", ("Dijon",)),
             Question("q3", "Is Lyon a city in France?", ("Yes",))]
PASSAGES = [Passage("p1", "France", "The capital of France is Paris."),
            Passage("p2", "Eiffel", "Gustave Eiffel was born in Dijon."),
            Passage("p3", "Lyon", "Lyon is a city in France.")]
# small budgets so that a training step of the tiny model takes a second or two
TINY = dict(group_size=2, max_turns=2, step_max_tokens=5, top_k=1, save_every=1, steps=1, lora_r=4)


@pytest.fixture(scope="module")
def tiny():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)  # the machine's cores are shared: one thread is the fastest here
    from tiny_hf import tiny_model_and_tokenizer

    return tiny_model_and_tokenizer()


# ---------------------------------------------------------------------------- layout, scripted
def test_search_r1_sequence_masks_exactly_the_information_block():
    llm = ScriptedLLM([(r"<information>Doc 1", "<think> found it </think> <answer> Paris </answer>"),
                       (r"Question:", "<think> need facts </think> <search> capital France </search>")])
    method = build_method("search-r1", {"k": 1, "probe": True})
    runtime = Runtime(llm=llm, retriever=MemoryRetriever(PASSAGES), sampling=Sampling(seed=3))
    trace = run_many(method, [QUESTIONS[0]], runtime, seeds=[3])[0]
    assert trace.error is None and trace.answer == "Paris"
    sample = rollout_sample(trace, llm)
    generations = step_generations(trace)
    assert len(generations) == 2 and sample.layout[0] == TOKEN_EXACT
    # the prompt is step 0's prompt as the back-end tokenized it
    assert list(sample.prompt_ids) == llm.tokenize(llm.render(generations[0].prompt))
    # mask 1 exactly on the generated ids, in order, with their sampled log-probs
    generated = [t.id for g in generations for t in g.logprobs]
    assert [i for i, m in zip(sample.completion_ids, sample.env_mask) if m] == generated
    assert [lp for lp, m in zip(sample.logprobs, sample.env_mask) if m] == [t.logprob for g in generations
                                                                            for t in g.logprobs]
    # injected tokens carry log-prob 0.0, never NaN (TRL's importance correction reads them)
    assert all(lp == 0.0 for lp, m in zip(sample.logprobs, sample.env_mask) if not m)
    # one growing transcript: positions count on from the prompt, never restart
    assert list(sample.positions) == list(range(len(sample.prompt_ids), len(sample.prompt_ids)
                                                + len(sample.completion_ids)))
    assert not sample.packed
    assert [sample.env_mask[a:b] for a, b in sample.spans] == [(1,) * len(g.logprobs) for g in generations]
    # mask 0 exactly on the injected <information> block, which is what step 1's prompt adds
    hits = next(s for s in trace.steps if isinstance(s, Retrieve)).hits
    injected = llm.detokenize([i for i, m in zip(sample.completion_ids, sample.env_mask) if not m])
    assert injected == INFORMATION_BLOCK.format(passages=format_information(hits))
    assert "Paris" in injected and sample.layout[1] in (TOKEN_EXACT, TEXT_CONTINUED)
    # the whole sequence reads as step 1's context followed by its output
    full = llm.detokenize(sample.prompt_ids + sample.completion_ids)
    assert full == llm.render(generations[1].prompt) + llm.detokenize([t.id for t in generations[1].logprobs])


def test_belief_agent_rebuilt_prompt_is_masked_as_a_fresh_prompt():
    llm = ScriptedLLM([(r"History:", "<think> ok </think> <answer> Paris </answer>"),
                       (r"Your question", "<think> need </think> <search> capital France </search>")])
    method = build_method("belief-agent", {"k": 1, "probe": True, "candidates": "search"})
    runtime = Runtime(llm=llm, retriever=MemoryRetriever(PASSAGES), sampling=Sampling(seed=1))
    trace = run_many(method, [QUESTIONS[0]], runtime, seeds=[1])[0]
    sample = rollout_sample(trace, llm)
    generations = step_generations(trace)
    assert sample.layout == (TOKEN_EXACT, FRESH_PROMPT)
    start, _ = sample.spans[1]
    rebuilt = llm.tokenize(llm.render(generations[1].prompt))
    assert list(sample.completion_ids[start - len(rebuilt):start]) == rebuilt
    assert set(sample.env_mask[start - len(rebuilt):start]) == {0}
    # the rebuilt prompt starts a segment of its own: positions from 0 through step 1's output
    assert sample.packed
    end = sample.spans[1][1]
    assert list(sample.positions[start - len(rebuilt):end]) == list(range(end - start + len(rebuilt)))
    first = sample.spans[0]
    assert list(sample.positions[:first[1]]) == list(range(len(sample.prompt_ids), len(sample.prompt_ids) + first[1]))


# ---------------------------------------------------------------------------- rollouts, tiny model
@needs_trl
def test_rollouts_run_the_agent_on_the_live_model_and_line_up(tiny):
    import torch

    model, tokenizer = tiny
    settings = AgentTrainSettings(method="search-r1", reward="search-r1", **{**TINY, "group_size": 3})
    rollouts = AgentRollouts(QUESTIONS, MemoryRetriever(PASSAGES), settings)
    out = rollouts.run([QUESTIONS[0].text] * 3, model, tokenizer, step=0)
    traces, samples = rollouts.last["traces"], rollouts.last["samples"]
    assert len(out["completion_ids"]) == 3 and all(t.method == "search-r1" for t in traces)
    assert len({t.steps[2].text for t in traces}) > 1  # G rollouts differ by seed (step 0's generation)
    again = AgentRollouts(QUESTIONS, MemoryRetriever(PASSAGES), settings).run([QUESTIONS[0].text] * 3, model,
                                                                             tokenizer, step=0)
    assert again["completion_ids"] == out["completion_ids"]  # the same seeds draw the same rollouts
    assert all(any(s.purpose == "belief-probe" for s in t.steps if hasattr(s, "purpose")) for t in traces)
    # the trainer's forward pass over the sequence gives the sampled log-probs on every token-exact step
    for sample in samples:
        ids = torch.tensor([sample.prompt_ids + sample.completion_ids])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
        n = len(sample.prompt_ids)
        for case, (a, b) in zip(sample.layout, sample.spans):
            if case != TOKEN_EXACT:
                continue
            for j in range(a, b):
                assert logp[n + j - 1, sample.completion_ids[j]].item() == pytest.approx(sample.logprobs[j],
                                                                                        abs=1e-3)
        assert sum(sample.env_mask) == sum(b - a for a, b in sample.spans)
    assert out["env_mask"] == [list(s.env_mask) for s in samples]


@needs_trl
def test_a_step_whose_every_rollout_fails_stops_training(tiny):
    from metarag.errors import BackendError

    model, tokenizer = tiny
    settings = AgentTrainSettings(method="search-r1", reward="search-r1", **{**TINY, "n_ctx": 64})
    with pytest.raises(BackendError, match="every rollout of training step 0 failed.*does not fit the context"):
        AgentRollouts(QUESTIONS, MemoryRetriever(PASSAGES), settings).run([QUESTIONS[0].text] * 2, model,
                                                                          tokenizer, step=0)


# ----------------------------------------------------------------------------- training, tiny model
@needs_trl
def test_training_end_to_end_checkpoint_resume_and_eval(tiny, tmp_path, monkeypatch):
    import copy

    import trl

    from metarag.cli import main
    from metarag.settings import content_sha256
    from metarag.train.agent import train_agent

    base, tokenizer = tiny
    seen = []  # the masks TRL's loss multiplies in: our env_mask arrives as its tool_mask
    compute_loss = trl.GRPOTrainer._compute_loss

    def spy(self, model, inputs):
        seen.append((inputs["completion_mask"] * inputs["tool_mask"]).tolist())
        return compute_loss(self, model, inputs)

    monkeypatch.setattr(trl.GRPOTrainer, "_compute_loss", spy)
    settings = AgentTrainSettings(method="search-r1", reward="belief", **TINY)
    rollouts = AgentRollouts(QUESTIONS, MemoryRetriever(PASSAGES), settings)
    out = tmp_path / "run"
    provenance = {"base_model_sha256": "tiny-sha", "data_sha256": "data-sha"}
    # LoRA is injected into the model it wraps: each run gets its own copy, as a fresh load would be
    report = train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, out, settings,
                         provenance=provenance, rollouts=rollouts)
    assert report.steps == 1
    step1 = rollouts.last
    # the loss sees exactly our masks: 0 on every injected token, 1 on every generated one
    rows = [row for batch in seen for row in batch]  # TRL shuffles the rows of a generation batch
    masks = [list(sample.env_mask) for sample in step1["samples"]]
    assert sorted(row[:len(row) - row[::-1].index(1)] if 1 in row else [] for row in rows) == \
        sorted(m[:len(m) - m[::-1].index(1)] if 1 in m else [] for m in masks)
    assert sum(map(sum, rows)) == sum(map(sum, masks))
    log = read_log(out)
    assert [r["step"] for r in log] == [1]
    # the rewards reach the trainer unchanged, each part logged
    totals = [r.total for r in step1["rewards"]]
    assert log[0]["rewards/reward/mean"] == pytest.approx(sum(totals) / len(totals), abs=1e-6)
    assert log[0]["rewards/outcome/mean"] == pytest.approx(sum(r.outcome for r in step1["rewards"]) / 2, abs=1e-6)
    assert log[0]["rewards/penalty/mean"] == pytest.approx(sum(r.penalty for r in step1["rewards"]) / 2, abs=1e-6)
    assert {"rewards/consistency/mean", "searches", "invalid_actions", "failed_rollouts", "kl"} <= set(log[0])
    # every rollout of the step, with its question, answer, reward and actions (the why of a flat curve)
    lines = [json.loads(x) for x in (out / "rollouts.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 1] and [x["reward"] for x in lines] == pytest.approx(totals)
    assert [x["question_id"] for x in lines] == [q.id for q in step1["questions"]]
    assert [x["answer"] for x in lines] == [t.answer for t in step1["traces"]]
    assert all(x["actions"] and set(x["actions"]) <= {"search", "answer", "invalid"} for x in lines)
    # replies cut at step_max_tokens: per rollout in the log, their share of the step's replies as a metric
    replies = [[s for s in t.steps if isinstance(s, Generate) and s.purpose == STEP_PURPOSE] for t in step1["traces"]]
    assert [x["cut"] for x in lines] == [sum(s.cut for s in r) for r in replies]
    assert log[0]["cut_replies"] == pytest.approx(sum(x["cut"] for x in lines) / sum(map(len, replies)))
    # the checkpoint: TRL's files, the merged model, the manifest
    checkpoint = out / "trainer" / "checkpoint-1"
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    assert manifest["steps"] == 1 and manifest["base_model_sha256"] == "tiny-sha"
    assert manifest["data_sha256"] == "data-sha" and manifest["reward"] == "belief"
    assert manifest["reward_settings"]["consistency_weight"] == 0.1 and "git_commit" in manifest
    assert (checkpoint / MERGED / "model.safetensors").exists() and report.checkpoint == checkpoint / MERGED
    assert (checkpoint / "adapter_model.safetensors").exists() and manifest["adapter"] == str(checkpoint)
    assert not (checkpoint / "adapter").exists()  # one copy: a sub-folder would be loaded as a 2nd adapter
    # a checkpoint of before 2026-12-06 kept a copy in adapter/: resumed, the run still trains one adapter
    shutil.copytree(checkpoint, checkpoint / "adapter", ignore=shutil.ignore_patterns("merged", "*.pt", "*.pth"))

    # resume: a second run of the same folder continues at step 2, not from scratch
    settings2 = AgentTrainSettings(method="search-r1", reward="belief", **{**TINY, "steps": 2})
    rollouts2 = AgentRollouts(QUESTIONS, MemoryRetriever(PASSAGES), settings2)
    report2 = train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, out, settings2,
                          provenance=provenance, rollouts=rollouts2)
    assert report2.steps == 2 and rollouts2.last["step"] == 1  # only step 2 (global step 1 -> 2) was rolled out
    assert list(rollouts2.trainer.model.peft_config) == ["default"]
    assert not (out / "trainer" / "checkpoint-2" / "adapter").exists()
    assert [r["step"] for r in read_log(out)] == [1, 2]
    assert [json.loads(x)["step"] for x in (out / "rollouts.jsonl").read_text().splitlines()] == [1, 1, 2, 2]
    state = json.loads((out / "trainer" / "checkpoint-2" / "trainer_state.json").read_text())
    assert state["global_step"] == 2 and [h["step"] for h in state["log_history"] if "loss" in h] == [1, 2]
    with pytest.raises(ConfigError, match="another reward"):  # another reward in the same folder: refused
        train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, out,
                    AgentTrainSettings(method="search-r1", reward="search-r1", **TINY), provenance=provenance)

    # the checkpoint is an hf:PATH model for eval, whose run id hashes it
    data = tmp_path / "tiny_train.json"
    data.write_text(json.dumps([{"_id": q.id, "question": q.text, "answer": q.answers[0], "type": "bridge",
                                 "level": "easy", "supporting_facts": [[p.title, 0]],
                                 "context": [[x.title, [x.text]] for x in PASSAGES]}
                                for q, p in zip(QUESTIONS, PASSAGES)]))
    runs = tmp_path / "runs"
    merged = report2.checkpoint
    assert main(["eval", "--method", "search-r1", "--dataset-file", str(data), "--limit", "1", "--llm",
                 f"hf:{merged}", "--set", "T=1", "--set", "step_max_tokens=3", "--runs-dir", str(runs),
                 "--quiet", "--no-cache"]) == 0
    (run,) = runs.iterdir()
    resolved = json.loads((run / "settings.json").read_text()) if (run / "settings.json").exists() else \
        json.loads((run / "manifest.json").read_text())
    assert content_sha256(merged) in json.dumps(resolved)


@needs_trl
def test_training_order_is_trls_sampler_order_and_a_resumed_sampler_draws_its_epoch():
    """`training_order` is the order TRL's RepeatSampler draws (an epoch's incomplete last step left
    out); `epoch_sampler` told its epoch draws that epoch's order from a fresh start (a resume)."""
    from trl.trainer.utils import RepeatSampler

    from metarag.train.agent import epoch_sampler, training_order

    def steps(indices: list[int]) -> list[tuple[int, ...]]:  # 4 questions a step, each repeated G = 5 times
        return [tuple(indices[i:i + 20:5]) for i in range(0, len(indices), 20)]

    sampler = RepeatSampler(range(17), mini_repeat_count=5, batch_size=4, seed=7)
    uninterrupted = [step for _ in range(3) for step in steps(list(sampler))]
    assert uninterrupted == training_order(17, 7, 4, 12) and len(uninterrupted) == 12
    fresh = epoch_sampler(RepeatSampler(range(17), mini_repeat_count=5, batch_size=4, seed=7))
    assert steps(list(fresh)) == uninterrupted[:4]  # never told its epoch: TRL's own order
    fresh = epoch_sampler(RepeatSampler(range(17), mini_repeat_count=5, batch_size=4, seed=7))
    fresh.set_epoch(2)
    assert steps(list(fresh)) == uninterrupted[8:]
    fresh.set_epoch(0)
    assert steps(list(fresh)) == uninterrupted[:4]
    with pytest.raises(ConfigError, match="cannot fill a step"):
        training_order(3, 0, 4, 1)


@needs_trl
def test_a_resumed_run_saves_at_its_own_save_every(tiny, tmp_path):
    """transformers reads a resumed run's save interval back from the checkpoint (trainer_state.json);
    the resumed run's `save_every` holds instead: saved every 2 steps, resumed saving every step."""
    import copy

    from metarag.train.agent import train_agent

    base, tokenizer = tiny

    def run(steps: int, every: int) -> None:
        settings = AgentTrainSettings(method="belief-agent", reward="belief",
                                      **{**TINY, "steps": steps, "save_every": every, "keep_checkpoints": 0})
        train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, tmp_path, settings)

    run(2, 2)
    run(4, 1)
    saved = sorted(int(p.name.removeprefix("checkpoint-")) for p in (tmp_path / "trainer").glob("checkpoint-*"))
    assert saved == [2, 3, 4]


@needs_trl
def test_a_resumed_run_draws_the_questions_of_an_uninterrupted_one(tiny, tmp_path):
    """Stopped after step 4 (epoch 2's first) and resumed, a run trains step 5 on epoch 2's second
    question, as an uninterrupted run does; TRL's own sampler started epoch 1's order again."""
    import copy

    from metarag.evaluate.training_curves import read_rollouts
    from metarag.train.agent import train_agent, training_order

    base, tokenizer = tiny
    order = training_order(len(QUESTIONS), 0, 1, 5)
    assert order[4] != order[1]  # epoch 1's order again would show
    for steps in (4, 5):
        settings = AgentTrainSettings(method="search-r1", reward="search-r1", **{**TINY, "steps": steps})
        train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, tmp_path, settings)
    drawn = {step: list(groups) for step, groups in read_rollouts(tmp_path).items()}
    assert drawn == {s: [QUESTIONS[i].id for i in chunk] for s, chunk in enumerate(order, 1)}


@needs_trl
def test_time_budget_stops_and_saves(tiny, tmp_path):
    import copy

    from metarag.train.agent import train_agent

    base, tokenizer = tiny
    settings = AgentTrainSettings(method="belief-agent", reward="search-r1",
                                  **{**TINY, "steps": 3, "save_every": 10, "time_budget_s": 0.001})
    report = train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, tmp_path, settings)
    first = tmp_path / "trainer" / "checkpoint-1"
    assert report.steps == 1 and (first / MANIFEST).exists()
    # a pause, not the end: no merged copy (6 GB for the 1.5B), and the summary says how to go on
    assert not (first / MERGED).exists() and report.checkpoint is None and report.paused_at == first
    assert "step 1 of 3" in report.summary() and "--steps 1" in report.summary()
    # --steps at the paused step: the merged copy, no training
    done = train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, tmp_path,
                       dataclasses.replace(settings, steps=1, time_budget_s=0.0))
    assert done.steps == 1 and done.checkpoint == first / MERGED and (first / MERGED).is_dir()
    assert not (tmp_path / "trainer" / "checkpoint-2").exists()


@needs_trl
def test_merged_copy_only_at_the_last_checkpoint(tiny, tmp_path):
    """merged/ (a full model copy: 6 GB for the 1.5B) goes into the checkpoint a run ends on; an earlier
    one keeps the adapter; a run resumed at its last step writes a missing merged copy."""
    import copy

    from metarag.train.agent import train_agent

    base, tokenizer = tiny
    settings = AgentTrainSettings(method="belief-agent", reward="belief", **{**TINY, "steps": 2})
    report = train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, tmp_path, settings)
    first, last = (tmp_path / "trainer" / f"checkpoint-{n}" for n in (1, 2))
    assert (first / "adapter_model.safetensors").exists() and not (first / MERGED).exists()
    assert json.loads((first / MANIFEST).read_text())["merged"] is None
    assert report.checkpoint == last / MERGED and (last / MERGED / "model.safetensors").exists()
    assert json.loads((last / MANIFEST).read_text())["merged_sha256"]
    written = (last / MERGED / "model.safetensors").read_bytes()
    generation = json.loads((last / MERGED / "generation_config.json").read_text())
    assert generation["eos_token_id"] is not None
    shutil.rmtree(last / MERGED)  # as after a run cut off between its last save and its merged copy
    report = train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, tmp_path, settings)
    # the finished run takes no further step, and its merged copy holds the weights written before
    assert report.steps == 2 and (last / MERGED / "model.safetensors").read_bytes() == written
    # ... and stops where the trained policy stopped (train() never ran to align the stop tokens)
    rewritten = json.loads((last / MERGED / "generation_config.json").read_text())
    assert {k: rewritten.get(k) for k in ("eos_token_id", "pad_token_id")} == \
        {k: generation.get(k) for k in ("eos_token_id", "pad_token_id")}
    assert not (tmp_path / "trainer" / "checkpoint-3").exists()
    # ... read from the checkpoint (the tiny run's rewards are equal, so its adapter is still the identity:
    # move it, and the merged copy moves too)
    from safetensors.torch import load_file, save_file

    weights = load_file(last / "adapter_model.safetensors")
    save_file({k: v + 0.5 if "lora_B" in k else v for k, v in weights.items()}, last / "adapter_model.safetensors")
    shutil.rmtree(last / MERGED)
    train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, tmp_path, settings)
    assert (last / MERGED / "model.safetensors").read_bytes() != written
    assert not (tmp_path / "trainer" / "checkpoint-3").exists()
    every = AgentTrainSettings(method="belief-agent", reward="belief",
                               **{**TINY, "steps": 2, "merged_checkpoints": "every"})
    train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, tmp_path / "every", every)
    assert (tmp_path / "every" / "trainer" / "checkpoint-1" / MERGED / "model.safetensors").exists()


@needs_trl
def test_plot_reads_the_log(tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "log.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 1, "rewards/outcome/mean": 0.2, "rewards/reward/mean": 0.21, "searches": 1.5,
         "under_search_rate": 0.4},
        {"step": 2, "rewards/outcome/mean": 0.4, "rewards/reward/mean": 0.43, "searches": 1.2}]) + "\n")
    png = plot_curves(tmp_path)
    assert png.read_bytes()[:4] == b"\x89PNG"
    # past 20 steps, the 10-step means are drawn too (a step without over-search has no point)
    (tmp_path / "log.jsonl").write_text("\n".join(json.dumps(
        {"step": n, "rewards/reward/mean": n / 25, "over_search_rate": float("nan") if n % 3 else 0.5})
        for n in range(1, 26)) + "\n")
    assert plot_curves(tmp_path, tmp_path / "long.png").read_bytes()[:4] == b"\x89PNG"


def test_training_curves_overlay_several_runs(tmp_path, capsys):
    """Several runs (a run beside its retry): each panel's lines per run, named by run, the 10-step
    means past 20 points; a figure of them needs a file, and the command says so."""
    from metarag.cli import main
    from metarag.evaluate.training_curves import training_curves

    first, retry = tmp_path / "first-log.jsonl", tmp_path / "retry"
    first.write_text("\n".join(json.dumps({"step": n, "rewards/outcome/mean": 0.2, "searches": 1.0})
                               for n in range(1, 21)) + "\n")
    retry.mkdir()
    (retry / "log.jsonl").write_text("\n".join(json.dumps({"step": n, "rewards/outcome/mean": n / 10})
                                               for n in range(1, 4)) + "\n")
    curves = training_curves([first, retry])
    assert [(c.panel, c.run, c.key) for c in curves] == [
        ("accuracy (EM)", "first", "rewards/outcome/mean"), ("accuracy (EM)", "retry", "rewards/outcome/mean"),
        ("per rollout", "first", "searches")]
    assert curves[0].smooth == tuple((n, pytest.approx(0.2)) for n in range(10, 21))
    assert curves[1].points == ((1, 0.1), (2, 0.2), (3, 0.3)) and curves[1].smooth == ()
    assert curves[1].label == "retry: outcome" and training_curves([retry])[0].label == "outcome"
    pytest.importorskip("matplotlib")
    with pytest.raises(ConfigError, match="PNG file"):
        plot_curves([first, retry])
    assert main(["train-agent", "--plot", str(first), str(retry)]) == 1
    assert "--plot-file" in capsys.readouterr().err
    assert main(["train-agent", "--plot", str(first), str(retry), "--plot-file", str(tmp_path / "both.png")]) == 0
    out = capsys.readouterr().out
    assert (tmp_path / "both.png").read_bytes()[:4] == b"\x89PNG" and "retry: no reward trend yet" in out
    assert main(["train-agent", "--plot", str(first)]) == 0  # a log copy: its figure beside it
    assert (tmp_path / "first-curves.png").read_bytes()[:4] == b"\x89PNG"


def test_the_curves_show_how_often_the_consistency_term_flipped_an_advantage(tmp_path):
    """The flips panel, from the rollout log: per step, the share of advantages whose sign the
    consistency term changed (rewards with it against outcome − penalty), scaled as the run scaled
    them. Step 1: in a group of two that the outcome ties (both wrong), consistency +0.1 on one
    rollout gives it +0.05 and the other −0.05, where without the term both had 0: one of two
    advantages turns positive. Step 2: the term moves no sign. An outcome-only run: 0 throughout."""
    from metarag.evaluate.training_curves import FLIPS, flip_shares, training_curves

    run = tmp_path / "belief"
    run.mkdir()
    (run / "settings.json").write_text(json.dumps({"scale_rewards": "none"}))
    (run / "log.jsonl").write_text("\n".join(json.dumps({"step": n, "rewards/reward/mean": 0.1}) for n in (1, 2)))
    rollouts = [(1, "q1", 0.1, 0.0, 0.1), (1, "q1", 0.0, 0.0, 0.0),
                (2, "q1", 1.1, 1.0, 0.1), (2, "q1", 0.0, 0.0, 0.0)]
    (run / "rollouts.jsonl").write_text("\n".join(json.dumps(
        {"step": s, "question_id": q, "seed": i, "reward": r, "outcome": o, "consistency": c, "penalty": 0.0})
        for i, (s, q, r, o, c) in enumerate(rollouts)) + "\n")
    assert flip_shares(run) == {1: 50.0, 2: 0.0}
    [curve] = [c for c in training_curves([run]) if c.key == FLIPS]
    assert curve.points == ((1, 50.0), (2, 0.0))


def test_run_labels_tell_same_named_runs_apart(tmp_path):
    """Two runs' folders of one name get their parents in front (each its own lines in a figure);
    a run given twice is numbered; distinct names stay as they are."""
    from metarag.evaluate.training_curves import run_labels, training_curves

    assert run_labels(["x/first-log.jsonl", "y/retry"]) == ["first", "retry"]
    assert run_labels(["a/q4/run", "b/q4/run", "c"]) == ["a/q4/run", "b/q4/run", "c"]
    assert run_labels(["a/run", "a/run"]) == ["a/run #1", "a/run #2"]
    for name in ("a", "b"):
        (tmp_path / name / "run").mkdir(parents=True)
        (tmp_path / name / "run" / "log.jsonl").write_text(json.dumps({"step": 1, "rewards/outcome/mean": 0.5}) + "\n")
    curves = training_curves([tmp_path / "a" / "run", tmp_path / "b" / "run"])
    assert [c.run for c in curves] == ["a/run", "b/run"]


def test_training_table_prints_a_row_a_step(tmp_path):
    """scripts/training-table: one Markdown row a step (a resumed step's last record), a minus sign."""
    (tmp_path / "log.jsonl").write_text("\n".join(json.dumps(r) for r in [
        {"step": 1, "reward": 0.5, "rewards/outcome/mean": 0.6},
        {"step": 1, "reward": -0.012, "rewards/outcome/mean": 0.0, "reward_std": 0.004, "step_time": 201.4},
        {"step": 2, "reward": 0.208, "rewards/outcome/mean": 0.2, "invalid_actions": 1.2}]) + "\n")
    script = Path(__file__).parents[1] / "scripts" / "training-table"
    out = subprocess.run([sys.executable, str(script), str(tmp_path), "--no-header"], capture_output=True,
                         text=True, check=True).stdout.splitlines()
    assert out == ["| 1 | −0.012 | 0.00 | – | 0.004 | – | – | – | – | – | 201 |",
                   "| 2 | 0.208 | 0.20 | – | – | 1.2 | – | – | – | – | – |"]
    # a measure later runs log (the replies cut at the token budget) has its column only where logged
    with (tmp_path / "log.jsonl").open("a") as f:
        f.write(json.dumps({"step": 3, "reward": 0.1, "invalid_actions": 0.8, "cut_replies": 0.25}) + "\n")
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert "| replies cut |" in out[0] and out[-1] == "| 3 | 0.100 | – | – | – | 0.8 | 0.25 | – | – | – | – | – |"
    assert out[2].startswith("| 1 | −0.012 | 0.00 | – | 0.004 | – | – |")


def test_training_order_script_checks_the_logged_questions_and_counts_draw_by_draw(tmp_path):
    """scripts/training-order: each step's questions as the sampler draws them, checked against the
    rollout log ("no, predicted ..." where the log trained others), and a question drawn twice gets its
    right rollouts side by side, draw by draw."""
    pytest.importorskip("torch")
    from metarag.train.agent import training_order

    ids = [f"q{i}" for i in range(5)]
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"id": q, "question": q, "answers": ["a"]}) + "\n" for q in ids))
    (tmp_path / "settings.json").write_text(json.dumps(
        {"data": {"path": str(data)}, "settings": {"seed": 3, "questions_per_step": 2, "group_size": 2}}))
    order = [[ids[i] for i in chunk] for chunk in training_order(5, 3, 2, 4)]  # 2 steps an epoch, 1 left out
    logged = [order[0], order[1], order[2], [q for q in ids if q not in order[3]][:2]]  # step 4: other questions
    records = [{"step": s, "seed": 10 * s + 2 * j + k, "question_id": q, "outcome": float(k == 0 and s > 2)}
               for s, questions in enumerate(logged, 1) for j, q in enumerate(questions) for k in range(2)]
    (tmp_path / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (tmp_path / "log.jsonl").write_text("".join(json.dumps({"step": s, "reward": 0.0}) + "\n" for s in range(1, 5)))
    script = Path(__file__).parents[1] / "scripts" / "training-order"
    out = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert len(rows) == 8  # 4 steps (the log's), 2 questions each
    assert all("| yes |" in row for row in rows[:6])
    assert all(f"| no, predicted {', '.join(order[3])} |" in row for row in rows[6:])
    assert rows[0] == f"| 1 | {order[0][0]} | – | yes | 0 of 2 |" and rows[4].endswith("| yes | 1 of 2 |")
    again = {q for q in ids if sum(q in step for step in logged) > 1}
    assert f"the {len(again)} questions drawn twice or more" in out
    first = sum(2 for q in again for s in logged[:2] if q in s)  # draws 1 are in epoch 1: none right
    assert f"  draw 1: 0 of {first} ({len(again)} questions)" in out


def test_training_table_windows_average_steps_and_count_signal_groups(tmp_path):
    """--windows W: a row per run and full W-step window (a short last one left out), the steps' means,
    and the steps whose group's reward spread says some rollouts were right; a log file works as a run."""
    log = tmp_path / "try-log.jsonl"
    log.write_text("\n".join(json.dumps({"step": s, "reward": s / 10, "reward_std": 0.5 if s in (2, 3) else 0.005,
                                         "grad_norm": 1.0}) for s in range(1, 6)) + "\n")
    script = Path(__file__).parents[1] / "scripts" / "training-table"
    out = subprocess.run([sys.executable, str(script), str(log), "--windows", "2", "--no-header"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == ["| try | 1–2 | 0.150 | – | – | – | – | – | 0.253 | 1.00 | 1 of 2 |",
                   "| try | 3–4 | 0.350 | – | – | – | – | – | 0.253 | 1.00 | 1 of 2 |"]
    two = subprocess.run([sys.executable, str(script), str(log), str(log)], capture_output=True, text=True)
    assert two.returncode == 2 and "only with --windows" in two.stderr


def test_training_table_windows_count_groups_from_the_rollout_log(tmp_path):
    """With the run's rollout log beside it, a step of several questions counts each question's group;
    a step a resumed run took again (the same rollout seeds) counts its last block of rollouts only."""
    log = tmp_path / "q4-log.jsonl"
    log.write_text("\n".join(json.dumps({"step": s, "reward": 0.1, "reward_std": 0.2}) for s in (1, 2)) + "\n")

    def step(number, groups):
        outcomes = [(q, o) for q, group in groups for o in group]
        return [{"step": number, "question_id": q, "seed": 100 * number + i, "outcome": o}
                for i, (q, o) in enumerate(outcomes)]

    rollouts = [*step(1, [("a", [1, 0]), ("b", [0, 0]), ("c", [1, 1])]),
                *step(2, [("a", [1, 0]), ("b", [1, 0]), ("c", [1, 0])]),  # cut off before its checkpoint ...
                *step(2, [("a", [0, 0]), ("d", [0, 1]), ("e", [1, 0])])]  # ... and taken again on resuming
    (tmp_path / "q4-rollouts.jsonl").write_text("\n".join(json.dumps(r) for r in rollouts) + "\n")
    script = Path(__file__).parents[1] / "scripts" / "training-table"
    out = subprocess.run([sys.executable, str(script), str(log), "--windows", "1", "--no-header"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert [row.rsplit("|", 2)[1].strip() for row in out] == ["1 of 3", "2 of 3"]


# ----------------------------------------------------------------------------- data and the command
def test_evaluation_splits_are_refused(tmp_path):
    for name in ("hotpotqa-train100", "musique-train100", "demo"):
        check_training_split(name, None)
    check_training_split("my_train", str(tmp_path / "my_train.json"))
    with pytest.raises(ConfigError, match="evaluation set"):
        check_training_split("hotpotqa-dev500", None)
    with pytest.raises(ConfigError, match="not named as a training split"):
        check_training_split("dev", str(tmp_path / "dev.json"))
    check_training_split("dev", str(tmp_path / "dev.json"), allow_any=True)


def test_cli_refuses_before_loading_anything(capsys):
    from metarag.cli import main

    assert main(["train-agent", "--out", "x", "--dataset", "hotpotqa-dev500"]) == 1
    assert "evaluation set" in capsys.readouterr().err
    assert main(["train-agent", "--out", "x", "--dataset", "demo", "--reward", "belif"]) == 1
    assert "belief" in capsys.readouterr().err
    assert main(["train-agent", "--out", "x", "--dataset", "demo", "--method", "react"]) == 1
    assert "search-r1 or belief-agent" in capsys.readouterr().err


@needs_trl
def test_dry_run_prints_the_plan_without_loading_the_model(capsys, tmp_path):
    from metarag.cli import main

    assert main(["train-agent", "--out", str(tmp_path), "--dataset", "demo", "--llm", "hf:/no/such/model",
                 "--dry-run"]) == 1
    assert "not found" in capsys.readouterr().err
    assert main(["train-agent", "--out", str(tmp_path), "--dataset", "demo", "--dry-run", "--steps", "400",
                 "--set", "questions_per_step=16"]) == 0
    plan = capsys.readouterr().out
    assert "G=5 x 16 question(s) per step = 80 rollouts" in plan and "400 steps" in plan and "KL 0.001" in plan


def test_a_gguf_read_by_transformers_is_made_trainable_other_quantizations_are_not():
    from types import SimpleNamespace

    from metarag.train.agent import trainable

    def model(method):
        quantizer = SimpleNamespace(quantization_config=SimpleNamespace(quant_method=method))
        return SimpleNamespace(hf_quantizer=quantizer, is_quantized=True,
                               config=SimpleNamespace(quantization_config={"quant_method": method}))

    gguf = trainable(model("gguf"))
    assert gguf.hf_quantizer is None and gguf.is_quantized is False and not hasattr(gguf.config, "quantization_config")
    bnb = trainable(model("bitsandbytes"))
    assert bnb.hf_quantizer is not None and bnb.is_quantized is True


def test_settings_are_the_papers():
    s = AgentTrainSettings()
    assert (s.learning_rate, s.kl_coef, s.group_size, s.max_turns, s.step_max_tokens, s.n_ctx, s.top_k,
            s.temperature) == (1e-6, 0.001, 5, 4, 512, 4096, 3, 1.0)
    assert s.method_overrides()["probe"] is True
    with pytest.raises(ConfigError):
        AgentTrainSettings(group_size=1)


def test_packed_passes_split_on_one_cpu_process_only():
    auto = AgentTrainSettings()
    assert [auto.resolved_packed_passes(gpu, n) for gpu, n in [(False, 1), (True, 1), (False, 2)]] == \
        ["split", "mask", "mask"]
    assert AgentTrainSettings(packed_passes="mask").resolved_packed_passes(False) == "mask"
    with pytest.raises(ConfigError, match="DDP across 2 processes"):
        AgentTrainSettings(packed_passes="split").resolved_packed_passes(False, 2)


def test_import_stays_light():
    code = ("import sys, metarag, metarag.train.agent, metarag.cli; "
            "bad = [m for m in ('torch', 'trl', 'peft', 'transformers', 'datasets') if m in sys.modules]; "
            "sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@needs_trl
def test_frozen_linears_cast_once_give_the_same_logits_and_come_back(tiny):
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    from metarag.train.agent import frozen_linears_as

    base, _ = tiny
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for name, param in model.named_parameters():  # adapters that moved: the LoRA path counts in the logits
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.05)
    inner = model.get_base_model()
    tied = inner.lm_head.weight is inner.model.embed_tokens.weight
    before = {id(p): p for p in model.parameters()}
    ids = torch.tensor([[5, 9, 14, 3, 7, 11]])
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(input_ids=ids).logits.float()
        with frozen_linears_as(model, "bfloat16") as swapped:
            assert swapped > 0
            assert inner.lm_head.weight.dtype == torch.bfloat16  # the head's own copy ...
            assert inner.model.embed_tokens.weight.dtype == torch.float32  # ... not the embedding's
            assert all(p.dtype == torch.float32 for n, p in model.named_parameters() if "lora_" in n)  # trained: kept
            got = model(input_ids=ids).logits.float()
    assert torch.equal(got, expected)
    grads = []  # ... and the same gradient for the adapters
    for cast in (False, True):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16), \
                (frozen_linears_as(model, "bfloat16") if cast else contextlib.nullcontext()):
            model(input_ids=ids).logits.float().logsumexp(-1).sum().backward()
        grads.append([p.grad.clone() for n, p in model.named_parameters() if "lora_" in n])
    assert all(torch.equal(a, b) for a, b in zip(*grads)) and any(g.abs().sum() > 0 for g in grads[0])
    assert {id(p): p for p in model.parameters()} == before and all(p.dtype == torch.float32 for p in before.values())
    assert tied == (inner.lm_head.weight is inner.model.embed_tokens.weight)


# ------------------------------------------------------------------ the GPU path, on a tiny model
class _SpreadRewards(AgentRollouts):
    """Rollouts whose rewards are 0, 1, 2 ... in order: every group has a gradient."""

    def run(self, prompts, model, tokenizer, step, **kw):
        import dataclasses

        out = super().run(prompts, model, tokenizer, step, **kw)
        out["rollout_reward"] = [None if r is None else dataclasses.replace(r, total=float(i))
                                 for i, r in enumerate(out["rollout_reward"])]
        return out


@needs_trl
@pytest.mark.parametrize("passes", ["mask", "split"])
def test_each_belief_agent_step_is_trained_on_the_context_it_was_sampled_from(tiny, tmp_path, monkeypatch, passes):
    import copy

    import torch

    from metarag.train.agent import training

    base, tokenizer = tiny
    records = []  # (ids, mask, logits_to_keep, per-token log-probs) of every loss pass
    head_rows, projected = [], []  # positions per call of TRL's fused LM head; their sum per loss pass
    real = training.step_packed_trainer

    def spying(trl):
        class Spy(real(trl)):
            def _compute_loss(self, model, inputs):
                self._in_loss = True
                try:
                    return super()._compute_loss(model, inputs)
                finally:
                    self._in_loss = False

            def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep, **kw):
                before = len(head_rows)
                out = super()._get_per_token_logps_and_entropies(model, input_ids, attention_mask, logits_to_keep,
                                                                  **kw)
                if getattr(self, "_in_loss", False):
                    records.append((input_ids.clone(), attention_mask.clone(), logits_to_keep, out[0].detach()))
                    projected.append(sum(head_rows[before:]))
                return out
        return Spy

    monkeypatch.setattr(training, "step_packed_trainer", spying)  # where train_agent looks it up
    from trl.trainer import utils as trl_utils

    fused = trl_utils._ChunkedLogProbFunction

    class CountingHead(fused):
        @staticmethod
        def forward(ctx, hidden, *args):
            head_rows.append(hidden.size(0))
            return fused.forward(ctx, hidden, *args)

    monkeypatch.setattr(trl_utils, "_ChunkedLogProbFunction", CountingHead)
    settings = AgentTrainSettings(method="belief-agent", reward="belief", packed_passes=passes,
                                  **{**TINY, "group_size": 3})
    rollouts = _SpreadRewards(QUESTIONS, MemoryRetriever(PASSAGES), settings)
    training.train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, tmp_path, settings,
                         rollouts=rollouts)
    assert rollouts.trainer.packed_passes == passes
    samples, traces = rollouts.last["samples"], rollouts.last["traces"]
    assert any(s.packed for s in samples)  # the tiny model's first step is invalid: a second, rebuilt prompt
    rows = [(ids[mask.bool()].tolist(), ids, mask, keep, logps) for ids, masks, keep, logps_ in records
            for ids, mask, logps in zip(ids, masks, logps_)]
    from metarag.llm.base import prompt_text
    from metarag.llm.hf import HFLLM

    llm = HFLLM.from_model(base, tokenizer, identity="tiny")
    checked = differs = 0
    for sample, trace in zip(samples, traces):
        full = list(sample.prompt_ids + sample.completion_ids)
        (_, _, _, keep, logps), = [r for r in rows if r[0] == full]
        for g, (a, b) in zip(step_generations(trace), sample.spans):
            prompt = llm.tokenize(prompt_text(llm, g.prompt))  # step k's own prompt, as it was sampled
            own = prompt + [t.id for t in g.logprobs]
            with torch.no_grad():
                direct = torch.log_softmax(base(input_ids=torch.tensor([own])).logits[0].float(), -1)
                whole = torch.log_softmax(base(input_ids=torch.tensor([full])).logits[0].float(), -1)
            n = len(prompt)
            for j in range(a, b):
                token = sample.completion_ids[j]
                expected = direct[n + j - a - 1, token].item()
                assert logps[j].item() == pytest.approx(expected, abs=1e-3)  # the trainer's, at completion index j
                checked += 1
                differs += abs(whole[len(sample.prompt_ids) + j - 1, token].item() - expected) > 1e-3
        # the tokens the loss leaves out (a later step's prompt) never went through the LM head
        skipped = [logps[j].item() for j, counted in enumerate(sample.env_mask) if not counted]
        assert skipped == [0.0] * len(skipped)
    assert checked == sum(sum(s.env_mask) for s in samples)
    assert differs > 0  # the whole sequence as context would have given other log-probs: the test can fail
    # ... and the head projected the counted tokens only (on the CPU TRL itself would project every position)
    assert sum(projected) == sum(sum(s.env_mask) for s in samples)


@needs_trl
@pytest.mark.parametrize("precision, moves", [("bf16-autocast", True), ("bf16", False)])
def test_one_step_at_lr_1e6_moves_fp32_master_weights_and_not_pure_bf16(tiny, tmp_path, precision, moves):
    import copy

    import torch

    from metarag.train.agent import train_agent

    base, tokenizer = tiny
    settings = AgentTrainSettings(method="search-r1", reward="search-r1", lora=False, precision=precision,
                                  kl_coef=0.0, **{**TINY, "group_size": 4})
    model = copy.deepcopy(base)
    name = "model.layers.0.mlp.up_proj.weight"
    start = dict(model.named_parameters())[name].detach().to(getattr(torch, PRECISION_DTYPE[precision])).clone()
    rollouts = _SpreadRewards(QUESTIONS, MemoryRetriever(PASSAGES), settings)
    train_agent(QUESTIONS, MemoryRetriever(PASSAGES), model, tokenizer, tmp_path, settings, rollouts=rollouts)
    trained = dict(rollouts.trainer.accelerator.unwrap_model(rollouts.trainer.model).named_parameters())[name]
    assert trained.dtype == getattr(torch, PRECISION_DTYPE[precision])
    changed = (trained.detach() != start).float().mean().item()
    assert rollouts.trainer.args.learning_rate == 1e-6
    if moves:
        assert changed > 0.5
    else:
        assert changed < 0.05  # Adam's ~1e-6 steps round away in bf16


PRECISION_DTYPE = {"bf16-autocast": "float32", "bf16": "bfloat16", "fp32": "float32"}


def test_settings_default_to_token_mean_loss_and_gpu_precision():
    settings = AgentTrainSettings()
    assert settings.loss_type == "dapo" and settings.kl_coef == 0.001
    assert settings.resolved_precision(on_gpu=True) == "bf16-autocast"
    assert settings.resolved_precision(on_gpu=False) == "fp32"
    with pytest.raises(ConfigError, match="loss_type.*must be one of"):
        AgentTrainSettings(loss_type="token-mean")
    # search-r1 runs Search-R1's max_turns search turns, then the answer turn
    assert AgentTrainSettings(method="search-r1").method_overrides()["T"] == 5
    assert AgentTrainSettings(method="belief-agent").method_overrides()["T"] == 4


def test_rollout_seeds_differ_across_processes():
    from metarag.train.agent import rollout_seed

    seeds = {(p, i): rollout_seed(0, 3, i, p) for p in range(8) for i in range(5)}
    assert len(set(seeds.values())) == len(seeds)
    assert rollout_seed(0, 3, 1, 0) == rollout_seed(0, 3, 1)  # rank 0 is the single-process run


def test_failed_rollouts_score_none_in_every_column():
    from metarag.train.agent import reward_columns
    from metarag.train.rewards import Reward

    funcs, weights = reward_columns()
    rewards = [Reward(1.0, 1.0, 0.1, searches=2), None, Reward(0.0, 0.0, -0.1)]
    logged = {}
    for f in funcs:
        out = f(prompts=["a"] * 3, completions=["x"] * 3, rollout_reward=rewards,
                log_metric=lambda k, v: logged.__setitem__(k, v))
        assert out[1] is None and out[0] is not None or f.__name__ in ("process", "retrieval")
    assert logged["searches"] == 1.0  # the mean over the rollouts that have a score
    assert [f.__name__ for f in funcs] == ["reward", "outcome", "consistency", "penalty", "process", "retrieval"]


def test_questions_with_the_same_text_stay_apart():
    from metarag.errors import DataError
    from metarag.train.agent import training_prompts

    twins = [Question("a", "Who?", ("Ann",)), Question("b", "Who?", ("Bob",)), QUESTIONS[0]]
    rollouts = AgentRollouts(twins, MemoryRetriever(PASSAGES), AgentTrainSettings(method="search-r1",
                                                                                    reward="search-r1"))
    keys = training_prompts(twins)
    assert len(set(keys)) == 3 and list(rollouts.by_prompt) == keys
    assert [rollouts._question(k).answers for k in keys[:2]] == [("Ann",), ("Bob",)]
    assert rollouts._question(QUESTIONS[0].text) is QUESTIONS[0]  # a unique text still names its question
    with pytest.raises(DataError, match="2 training questions have the text"):
        rollouts._question("Who?")


# --------------------------------------------------------------------- the CPU recipe and the signal
def test_cpu_recipe_resolves_to_its_settings_and_keeps_the_papers_method():
    from metarag.train.agent import recipe_settings

    s = recipe_settings("cpu")
    assert (s.max_turns, s.step_max_tokens, s.top_k, s.kl_coef, s.train_batch_size, s.gradient_checkpointing,
            s.precision, s.learning_rate, s.lora) == (3, 128, 2, 0.0, 1, False, "bf16-autocast", 1e-5, True)
    # the paper's reward, its gap diagnosis (the probe at every step), verify-first and G stay
    assert s.reward == "belief" and s.method == "belief-agent" and s.group_size == 5
    assert s.method_overrides()["probe"] is True
    assert build_method("belief-agent", s.method_overrides()).settings.verify_first
    assert recipe_settings("cpu", max_turns=4).max_turns == 4  # --set still wins
    assert recipe_settings("paper") == AgentTrainSettings()
    with pytest.raises(ConfigError, match="unknown training recipe 'cpuu'.*cpu"):
        recipe_settings("cpuu")


@needs_trl
@pytest.mark.parametrize("think_prefix", [False, True])
def test_two_steps_of_the_cpu_recipe_on_a_tiny_model_log_where_the_time_went(tiny, tmp_path, think_prefix):
    import copy

    from metarag.train.agent import recipe_settings, train_agent

    base, tokenizer = tiny
    settings = recipe_settings("cpu", steps=2, step_max_tokens=5, lora_r=4, save_every=1, group_size=2,
                               train_batch_size=2, max_turns=2, keep_checkpoints=1, think_prefix=think_prefix)
    rollouts = AgentRollouts(QUESTIONS, MemoryRetriever(PASSAGES), settings)
    report = train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, tmp_path, settings,
                         rollouts=rollouts)
    args = rollouts.trainer.args
    assert report.steps == 2 and args.per_device_train_batch_size == 2 and args.gradient_accumulation_steps == 1
    assert args.bf16 and rollouts.trainer.beta == 0.0 and rollouts.trainer.ref_model is None
    assert args.scale_rewards == "none"  # TRL forms the advantages as the settings say (Dr. GRPO's)
    log = read_log(tmp_path)
    assert [r["step"] for r in log] == [1, 2]
    assert sorted(p.name for p in (tmp_path / "trainer").glob("checkpoint-*")) == ["checkpoint-2"]  # the newest kept
    for record in log:
        assert record["time/rollouts"] > 0 and record["time/policy"] > 0 and record["time/generation"] > 0
        assert record["time/probe"] > 0 and record["time/reference"] == 0.0  # KL 0: no reference pass
        # later turns and probes, and the group's shared prompt, came from the stored key/value states
        assert record["prompt_tokens/reused"] > 0 and record["prompt_tokens/computed"] > 0
        assert record["memory/rss_gb"] > 0  # the process's resident memory, after the heap's trim
    # the rollouts ran under bf16 autocast, as the training passes do, the frozen weights cast once a step
    assert all(g.logprobs for t in rollouts.last["traces"] for g in step_generations(t))
    assert rollouts.trainer.cast_frozen  # inside training_step (rollouts included) the frozen weights are bf16 casts
    rollouts.run([QUESTIONS[0].text] * 2, rollouts.trainer.model, tokenizer, step=2)  # outside: cast for the rollouts
    assert rollouts.last["cast_once"] > 0
    # with think_prefix every unforced step's prompt ends inside <think>: prompt, trained on nowhere
    openings = [g.prompt[-1].content for t in rollouts.last["traces"] for g in step_generations(t)
                if g.prompt[-1].role == "assistant" and g.prompt[-1].content != "<answer>"]
    assert (set(openings) == {"<think>"}) if think_prefix else not openings


def test_signal_fraction_counts_the_groups_whose_rewards_differ():
    from metarag.train.agent import signal_fraction

    groups = [[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [None, 1.0, 1.0], [None, None, 1.0], [0.5, 0.5], [-0.01, 0.0]]
    assert signal_fraction(groups) == pytest.approx(2 / 6)  # all-equal groups and lone scores give no gradient
    assert math.isnan(signal_fraction([]))


@needs_trl
def test_measure_signal_writes_a_line_per_question_and_resumes(tiny, tmp_path, monkeypatch):
    from metarag.train.agent import SIGNAL_FILE, measure_signal

    model, tokenizer = tiny
    settings = AgentTrainSettings(method="search-r1", reward="search-r1", **TINY)
    calls = []
    real = AgentRollouts.run
    monkeypatch.setattr(AgentRollouts, "run", lambda self, prompts, *a, **k: calls.append(prompts) or
                        real(self, prompts, *a, **k))
    first = measure_signal(QUESTIONS, MemoryRetriever(PASSAGES), model, tokenizer, tmp_path, settings, 2)
    assert first.questions == 2 and len(calls) == 2 and all(len(c) == settings.group_size for c in calls)
    again = measure_signal(QUESTIONS, MemoryRetriever(PASSAGES), model, tokenizer, tmp_path, settings, 3)
    assert again.questions == 3 and len(calls) == 3  # only the third question was rolled out
    lines = [json.loads(x) for x in (tmp_path / SIGNAL_FILE).read_text().splitlines()]
    assert [x["question_id"] for x in lines] == ["q1", "q2", "q3"] and all(len(x["total"]) == 2 for x in lines)
    assert all(len(x["answers"]) == len(x["actions"]) == 2 and x["gold"] for x in lines)  # why no signal, per rollout
    assert all(a and a[-1] in ("answer", "invalid", "search") for x in lines for a in x["actions"])
    assert "groups" in again.summary()


@needs_trl
def test_full_fine_tuning_with_a_kl_term_takes_the_starting_policy_as_reference(tiny, tmp_path):
    import copy

    import torch

    from metarag.train.agent import train_agent

    base, tokenizer = tiny
    settings = AgentTrainSettings(method="search-r1", reward="search-r1", lora=False, **{**TINY, "group_size": 4})
    assert settings.kl_coef == 0.001
    rollouts = _SpreadRewards(QUESTIONS, MemoryRetriever(PASSAGES), settings)
    train_agent(QUESTIONS, MemoryRetriever(PASSAGES), copy.deepcopy(base), tokenizer, tmp_path, settings,
                rollouts=rollouts)  # an in-memory model: TRL alone would look for it on the hub
    trainer = rollouts.trainer
    reference = dict(trainer.accelerator.unwrap_model(trainer.ref_model).named_parameters())
    policy = dict(trainer.accelerator.unwrap_model(trainer.model).named_parameters())
    name = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(reference[name], dict(base.named_parameters())[name])  # the policy as it started
    assert not torch.equal(policy[name], reference[name])  # which the step moved away from


def test_a_run_resumes_after_a_reward_setting_is_added_at_its_default_not_after_one_is_changed(tmp_path):
    import dataclasses
    import json

    from metarag.errors import ConfigError
    from metarag.train.agent import MANIFEST, TRAINER_DIR
    from metarag.train.agent.checkpoints import _check_resumable
    from metarag.train.rewards import RewardSettings

    now = {"method": "belief-agent", "reward": "belief", "reward_settings": dataclasses.asdict(RewardSettings())}
    saved = {**now, "reward_settings": {k: v for k, v in now["reward_settings"].items() if k != "refine_weight"}}
    checkpoint = tmp_path / TRAINER_DIR / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    (checkpoint / MANIFEST).write_text(json.dumps(saved))
    _check_resumable(tmp_path, now)  # the run predates refine_weight: it had the default
    changed = {**now, "reward_settings": {**now["reward_settings"], "consistency_weight": 0.3}}
    with pytest.raises(ConfigError, match="another reward_settings"):
        _check_resumable(tmp_path, changed)
    added_off_default = {**now, "reward_settings": {**now["reward_settings"], "refine_weight": 0.5}}
    with pytest.raises(ConfigError, match="another reward_settings"):
        _check_resumable(tmp_path, added_off_default)


def test_think_prefix_reaches_the_rollouts_agent_and_a_run_resumes_only_with_the_same_opening(tmp_path):
    import json

    from metarag.errors import ConfigError
    from metarag.train.agent import MANIFEST, TRAINER_DIR, recipe_settings
    from metarag.train.agent.checkpoints import _check_resumable

    s = recipe_settings("cpu", think_prefix=True)
    assert build_method("belief-agent", s.method_overrides()).settings.think_prefix is True
    assert "think_prefix" not in recipe_settings("cpu").method_overrides()  # off: the paper's agent
    with pytest.raises(ConfigError, match="think_prefix is belief-agent's"):
        recipe_settings("cpu", method="search-r1", reward="search-r1", think_prefix=True)
    checkpoint = tmp_path / TRAINER_DIR / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    (checkpoint / MANIFEST).write_text(json.dumps({"method": "belief-agent", "think_prefix": True}))
    _check_resumable(tmp_path, {"method": "belief-agent", "think_prefix": True})
    with pytest.raises(ConfigError, match="another think_prefix"):  # trained with it, resumed without
        _check_resumable(tmp_path, {"method": "belief-agent"})


def test_training_table_trend_reads_each_measure_last_minus_first(tmp_path):
    """--trend W: each measure's last W steps − first W with its interval; one too short is left out."""
    (tmp_path / "log.jsonl").write_text("\n".join(json.dumps(
        {"step": s, "rewards/reward/mean": 0.0 if s <= 3 else 1.0, "invalid_actions": 2.0 - (s > 3),
         "grad_norm": 0.5 if s < 2 else None}) for s in range(1, 7)) + "\n")
    script = Path(__file__).parents[1] / "scripts" / "training-table"
    out = subprocess.run([sys.executable, str(script), str(tmp_path), "--trend", "3", "--no-header"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    name = tmp_path.name
    assert out == [f"| {name} | reward | 1.000 | 1.000 .. 1.000 |",
                   f"| {name} | invalid / rollout | −1.00 | −1.00 .. −1.00 |"]
    # --to N: the trend as it stood at step N (steps 1-2 against 3-4), not over the whole log
    out = subprocess.run([sys.executable, str(script), str(tmp_path), "--trend", "2", "--to", "4", "--no-header"],
                         capture_output=True, text=True, check=True).stdout.splitlines()
    assert out == [f"| {name} | reward | 0.500 | 0.000 .. 1.000 |",
                   f"| {name} | invalid / rollout | −0.50 | −1.00 .. 0.00 |"]


# ------------------------------------------------------------------ issue 51: what trained wrongly
def test_a_format_only_group_gets_no_advantage_that_outweighs_an_outcome_group():
    from metarag.evaluate.training_curves import group_advantages

    # group 1 differs only by the -0.01 invalid-action penalty; group 2 in the answer (one right of five)
    rewards = [0.0, 0.0, 0.0, 0.0, -0.01] + [1.0, 0.0, 0.0, 0.0, 0.0]
    old = group_advantages(rewards, 5, "group")  # the paper's GRPO: both groups get advantages of ~1.8
    assert max(map(abs, old[:5])) == pytest.approx(max(map(abs, old[5:])), rel=0.05)
    new = group_advantages(rewards, 5, AgentTrainSettings().scale_rewards)
    assert max(map(abs, new[:5])) <= 0.01 and max(map(abs, new[5:])) == pytest.approx(0.8)
    # batch scaling alone does not bound a step in which no group differs in outcome
    assert max(map(abs, group_advantages(rewards[:5] * 2, 5, "batch"))) > 1
    with pytest.raises(ValueError):
        group_advantages([1.0, 0.0, 1.0], 2)


def test_f1_outcome_and_the_supporting_passage_reward():
    from metarag.records import Answer, Hit, Retrieve, Trace, Usage
    from metarag.train.rewards import RewardSettings, search_r1_reward, with_support

    hits = (Hit(PASSAGES[0], 1.0, "bm25"), Hit(PASSAGES[2], 0.5, "bm25"))
    trace = Trace("q1", QUESTIONS[0].text, "search-r1", (Retrieve(Usage(retrieval_calls=1), "capital", 2, hits),
                                                          Answer(Usage(), "Paris city")), answer="Paris city")
    assert search_r1_reward(trace, ["Paris"]).total == 0.0  # EM
    f1 = search_r1_reward(trace, ["Paris"], RewardSettings(outcome="f1"))
    assert f1.total == pytest.approx(2 / 3) and f1.outcome == pytest.approx(2 / 3)
    with pytest.raises(ConfigError, match="unknown outcome 'acc'"):
        RewardSettings(outcome="acc")
    supported = with_support(f1, trace, ["p1", "p2"], RewardSettings(outcome="f1", support_weight=0.5))
    assert supported.retrieval == 0.5 and supported.total == pytest.approx(2 / 3 + 0.25)
    assert with_support(f1, trace, ["p1"], RewardSettings()) is f1  # off by default


def test_the_frozen_probe_reads_the_starting_weights_however_the_policy_moves(tiny):
    import copy

    import torch
    from peft import LoraConfig, get_peft_model

    from metarag.judges.belief import PROBE_LABELS, probe_prompt
    from metarag.llm.hf import HFLLM, HFSettings
    from metarag.train.agent import frozen_probes

    base, tokenizer = tiny
    model = get_peft_model(copy.deepcopy(base), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    inner = model.get_base_model()
    settings = HFSettings(embedded=None, n_ctx=512, prefix_cache_tokens=0)
    policy = HFLLM.from_model(inner, tokenizer, identity="policy", settings=settings)
    probing = frozen_probes(policy, model, tokenizer, None, settings)
    prompt = probe_prompt("Your question: Who built the tower?")

    def read(llm):
        return llm.score_labels(prompt, PROBE_LABELS).probs

    start = read(HFLLM.from_model(base, tokenizer, identity="base", settings=settings))
    with torch.no_grad():  # the policy moves: its adapter's B matrices leave zero
        for name, weight in model.named_parameters():
            if "lora_B" in name:
                weight.add_(0.5)
    assert read(policy) != pytest.approx(start)  # the policy's own reading moved ...
    assert read(probing) == pytest.approx(start, abs=1e-5)  # ... the frozen one did not
    assert read(policy) != pytest.approx(start)  # and the adapter is back on after the probe
    with pytest.raises(ConfigError, match="train with LoRA"):
        frozen_probes(policy, base, tokenizer, None, settings)


def test_an_old_run_resumes_only_with_the_scaling_and_probe_it_had(tmp_path):
    from metarag.train.agent import TRAINER_DIR
    from metarag.train.agent.checkpoints import _check_resumable

    checkpoint = tmp_path / TRAINER_DIR / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text("{}")
    (checkpoint / MANIFEST).write_text(json.dumps({"method": "belief-agent", "reward": "belief"}))
    _check_resumable(tmp_path, {"method": "belief-agent", "reward": "belief", "scale_rewards": "group",
                                "probe_weights": "policy"})
    with pytest.raises(ConfigError, match="another scale_rewards"):
        _check_resumable(tmp_path, {"method": "belief-agent", "reward": "belief", "scale_rewards": "none",
                                    "probe_weights": "policy"})


@needs_trl
def test_full_fine_tuning_at_kl_0_loads_no_reference_model(tiny, tmp_path, monkeypatch):
    import copy

    from metarag.train.agent import train_agent

    base, tokenizer = tiny
    model = copy.deepcopy(base)
    copied = []
    real = copy.deepcopy
    monkeypatch.setattr(copy, "deepcopy", lambda x, memo=None: (copied.append(x is model), real(x, memo))[1])
    settings = AgentTrainSettings(method="search-r1", reward="search-r1", lora=False, kl_coef=0.0, **TINY)
    rollouts = AgentRollouts(QUESTIONS, MemoryRetriever(PASSAGES), settings)
    train_agent(QUESTIONS, MemoryRetriever(PASSAGES), model, tokenizer, tmp_path, settings, rollouts=rollouts)
    assert rollouts.trainer.ref_model is None and not any(copied)  # no copy of the policy was made
    assert "kl" not in read_log(tmp_path)[0]


@needs_trl
def test_the_fsdp2_reference_is_the_policys_architecture_with_nothing_allocated(tiny):
    import torch

    from metarag.train.agent import meta_reference

    base, _ = tiny
    reference = meta_reference(base)
    assert all(p.is_meta for p in reference.parameters())
    assert {n: (tuple(p.shape), p.dtype) for n, p in reference.named_parameters()} == \
        {n: (tuple(p.shape), p.dtype) for n, p in base.named_parameters()}
    buffers = dict(base.named_buffers())  # the rotary frequencies, which FSDP2 does not send, are real
    assert all(torch.equal(b, buffers[n]) for n, b in reference.named_buffers())


@needs_trl
def test_sharded_setups_the_rollouts_cannot_run_whole_are_refused_in_one_line(monkeypatch):
    from types import SimpleNamespace

    from metarag.train.agent import check_sharding

    def trainer(fsdp_version=None, zero_stage=None, gather=True):
        state = SimpleNamespace(deepspeed_plugin=SimpleNamespace(zero_stage=zero_stage) if zero_stage else None,
                                fsdp_plugin=SimpleNamespace(fsdp_version=fsdp_version) if fsdp_version else None)
        return SimpleNamespace(accelerator=SimpleNamespace(state=state),
                               args=SimpleNamespace(ds3_gather_for_generation=gather))

    settings = AgentTrainSettings()
    frozen = AgentTrainSettings(probe_weights="frozen")
    for case, message in ((trainer(fsdp_version=1), "FSDP version 1 cannot give the rollouts the whole model"),
                          (trainer(zero_stage=3, gather=False), "need the policy gathered"),):
        with pytest.raises(ConfigError, match=message) as caught:
            check_sharding(case, settings, lora=False)
        assert "\n" not in str(caught.value)
    with pytest.raises(ConfigError, match="ZeRO-3 shards and nothing gathers"):
        check_sharding(trainer(zero_stage=3), frozen, lora=False)
    check_sharding(trainer(zero_stage=3), frozen, lora=True)  # the adapter switched off: the policy's own weights
    check_sharding(trainer(fsdp_version=2), frozen, lora=False)  # FSDP2 gathers the reference too
    check_sharding(trainer(), settings, lora=False)


def test_the_accelerate_configs_parse_and_the_fsdp_one_is_what_the_rollouts_and_loading_need(monkeypatch):
    pytest.importorskip("accelerate")
    from accelerate.commands.config.config_args import ClusterConfig

    from metarag.train.agent import rank0_loading

    folder = Path(__file__).parent.parent / "configs" / "accelerate"
    configs = {p.name: ClusterConfig.from_yaml_file(str(p)) for p in sorted(folder.glob("*.yaml"))}
    assert set(configs) == {"1gpu.yaml", "8gpu-ddp.yaml", "8gpu-fsdp.yaml"}
    fsdp = configs["8gpu-fsdp.yaml"]
    assert fsdp.distributed_type == "FSDP" and fsdp.mixed_precision == "bf16" and fsdp.num_processes == 8
    # version 2 (whole_for_rollouts gathers FSDP2 units; version 1 is refused), whole checkpoints, and the
    # main process alone reading the weights (load_base)
    assert fsdp.fsdp_config["fsdp_version"] == 2 and fsdp.fsdp_config["fsdp_state_dict_type"] == "FULL_STATE_DICT"
    assert fsdp.fsdp_config["fsdp_cpu_ram_efficient_loading"] is True
    # the environment accelerate's launcher writes from it is one where load_base reads on the main process only
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser
    from accelerate.utils.launch import prepare_multi_gpu_env

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    args = launch_command_parser().parse_args(["--config_file", str(folder / "8gpu-fsdp.yaml"), "--num_processes",
                                               "2", "train.py"])
    for key, value in prepare_multi_gpu_env(_validate_launch_command(args)[0]).items():
        monkeypatch.setenv(key, value)
    assert rank0_loading()
    monkeypatch.setenv("FSDP_VERSION", "1")
    assert not rank0_loading()
    assert configs["8gpu-ddp.yaml"].distributed_type == "MULTI_GPU" and configs["1gpu.yaml"].num_processes == 1
