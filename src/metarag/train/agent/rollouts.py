"""A training step's rollouts (TRL's `rollout_func`, `AgentRollouts`): the agent's own policy run
through `methods/runner.run_many` on the trainer's live model or TRL's vLLM engine, sampled with a seed
per rollout and process, each finished trace laid out as a row (`layout.py`) and rewarded
(`train/rewards.py`); and the reward columns TRL logs (`reward_columns`)."""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from metarag.errors import BackendError, ConfigError, DataError
from metarag.policy.agent_trace import STEP_PURPOSE, decision_generations
from metarag.records import Generate, Question, Trace
from metarag.train.agent.layout import LAYOUTS, POSITIONS_FIELD, rollout_sample
from metarag.train.agent.model import frozen_linears_as, whole_for_rollouts
from metarag.train.agent.settings import AgentTrainSettings


def rollout_seed(run_seed: int, step: int, position: int, process: int = 0) -> int:
    """The seed of the rollout at `position` of training step `step` on process `process` (its
    rank): distinct across rollouts, steps and processes (each process rolls out its own share of the
    group), the same when a resumed run re-draws a step, 31 bits."""
    digest = hashlib.blake2b(f"agent-rollout:{run_seed}:{step}:{process}:{position}".encode(),
                             digest_size=8).digest()
    return int.from_bytes(digest, "big") & 0x7FFF_FFFF


def rollout_seconds(traces: Sequence[Trace]) -> dict[str, float]:
    """Where a step's rollouts spent their time, from the traces' own step latencies: the decision
    steps' generation, the belief probe's scoring, and the rest (retrieval, other model calls)."""
    from metarag.records import Score

    out = {"generation": 0.0, "probe": 0.0, "other": 0.0}
    for trace in traces:
        for step in trace.steps:
            seconds = step.usage.latency_s
            if isinstance(step, Generate) and step.purpose == STEP_PURPOSE:
                out["generation"] += seconds
            elif isinstance(step, Score) and step.purpose == "belief-probe":
                out["probe"] += seconds
            else:
                out["other"] += seconds
    return out


def cut_share(traces: Sequence[Trace]) -> float:
    """The share of the step's decision replies cut at `step_max_tokens` (`Generate.cut`), over the
    rollouts that ran; NaN without one. A cut reply rarely holds a closed action, so it is mostly an
    invalid step: this says how many of the invalid steps are the budget's, not the format's. (TRL's
    `completions/clipped_ratio` cannot say: it counts completions without EOS, and every rollout here
    ends at a stop string.)"""
    replies = [s for t in traces if t.error is None for s in decision_generations(t)]
    return sum(s.cut for s in replies) / len(replies) if replies else math.nan


def prompt_tokens(llm: Any) -> dict[str, float]:
    """The step's prompt tokens the rollouts' back-end ran through the model ("computed") and took
    from its stored key/value states ("reused", `HFSettings.prefix_cache_tokens`); empty for a
    back-end that keeps none (vLLM's rollouts: the policy's probes)."""
    store = getattr(llm, "prefix", None) or getattr(getattr(llm, "policy", None), "prefix", None)
    return {"computed": float(store.computed), "reused": float(store.reused)} if store is not None else {}


def training_prompts(questions: Sequence[Question]) -> list[str]:
    """The dataset rows TRL hands back to the rollout function, one per question: the question's
    place and text, so that two questions with the same text (and other answers) stay apart."""
    return [f"[{i}] {q.text}" for i, q in enumerate(questions)]


class _PerRollout:
    """The agent with its own settings per rollout (belief-agent's random candidate is seeded from
    the rollout seed, so the G rollouts of a question draw different candidates): `policy` dispatches
    on the rollout's question object to that rollout's agent. Not a loop: the agents' own policies run."""

    def __init__(self, name: str, by_question: dict[int, Any]):
        self.name = name
        self._by_question = by_question

    def policy(self, question: Question):
        return self._by_question[id(question)].policy(question)


class FrozenProbes:
    """The rollouts' back-end with every label read (the belief probe's P(Yes) / P(No)) taken from the
    frozen starting weights (`AgentTrainSettings.probe_weights` "frozen"); generation stays the policy's.
    `frozen` is a back-end of its own over those weights, with its own key/value states (the policy's
    are not the frozen model's), read inside `switch` (PEFT's `disable_adapter`, or nothing for a
    separate reference model)."""

    def __init__(self, policy: Any, frozen: Any, switch: Callable[[], Any] = contextlib.nullcontext):
        self.policy, self.frozen, self._switch = policy, frozen, switch
        self.identity = policy.identity

    def __getattr__(self, name: str) -> Any:  # generation, rendering, tokenizing: the policy's
        return getattr(self.policy, name)

    def score_labels(self, prompt: Any, labels: Sequence[str]) -> Any:
        with self._switch():
            return self.frozen.score_labels(prompt, labels)

    def score_labels_batch(self, prompts: Sequence[Any], labels: Sequence[str]) -> list[Any]:
        with self._switch():
            return self.frozen.score_labels_batch(prompts, labels)


def frozen_probes(llm: Any, model: Any, tokenizer: Any, reference: Any, settings: Any) -> FrozenProbes:
    """`llm` (the policy's rollout back-end) with its probes read from the starting weights: `model`'s
    LoRA adapter switched off, or else the trainer's KL `reference` model; neither is a ConfigError."""
    from metarag.llm.hf import HFLLM

    if hasattr(model, "disable_adapter"):
        inner = model.get_base_model() if hasattr(model, "get_base_model") else model
        frozen = HFLLM.from_model(inner, tokenizer, identity=f"{llm.identity}:frozen", settings=settings)
        return FrozenProbes(llm, frozen, model.disable_adapter)
    if reference is not None:
        return FrozenProbes(llm, HFLLM.from_model(reference, tokenizer, identity=f"{llm.identity}:reference",
                                                  settings=settings))
    raise ConfigError("probe_weights 'frozen' reads the starting weights: train with LoRA (the adapter switched "
                      "off for each probe) or with a KL reference model (kl_coef > 0)")


class AgentRollouts:
    """TRL's `rollout_func`: runs the agent on the step's prompts through `run_many` with the live
    model and returns the sequences, masks, log-probs, position ids and each rollout's `Reward`
    (`rollout_reward`, read by the reward columns; None for a rollout whose back-end failed, which
    TRL then leaves out of its group's baseline). `last` keeps the step's traces, samples and rewards
    (tests, logs). The model generates whole on every process (`whole_for_rollouts`: FSDP2 units
    gathered once for the step's rollouts, ZeRO-3 through TRL's `unwrap_model_for_generation`), or
    through TRL's vLLM engine when the trainer has one (the probes still read the gathered policy)."""

    def __init__(self, questions: Sequence[Question], retriever: Any, settings: AgentTrainSettings,
                 reward_settings: Any = None, identity: str = "train-agent", judge_settings: Any = None):
        from metarag.judges.process import ProcessJudgeSettings
        from metarag.methods.registry import build_method, method_settings
        from metarag.train.rewards import RewardSettings, reward_function

        self.settings = settings
        self.retriever = retriever
        self.reward_fn = reward_function(settings.reward)
        self.reward_settings = reward_settings if reward_settings is not None else RewardSettings()
        self.judge_settings = judge_settings if judge_settings is not None else ProcessJudgeSettings()
        self._judge_models: dict[str, Any] = {}  # a judge named by spec loads once, not once per step
        self.identity = identity
        self.questions = list(questions)
        self.by_prompt = dict(zip(training_prompts(self.questions), self.questions))
        self._by_text: dict[str, list[Question]] = {}
        for q in self.questions:
            self._by_text.setdefault(q.text, []).append(q)
        overrides = settings.method_overrides()
        self.agent_settings = method_settings(settings.method, overrides)
        self._build = build_method
        self.method = build_method(settings.method, overrides)
        self.last: dict[str, Any] = {}
        self.rollout_log: Path | None = None  # OUT/rollouts.jsonl when training writes one (train_agent)

    def __call__(self, prompts: Sequence[Any], trainer: Any) -> dict[str, list]:
        step = int(trainer.state.global_step)
        process = int(trainer.accelerator.process_index)
        frozen_reference = self.settings.probe_weights == "frozen" and not hasattr(
            trainer.accelerator.unwrap_model(trainer.model_wrapped), "disable_adapter")
        with whole_for_rollouts(trainer, reference=frozen_reference) as model:
            llm = None
            if getattr(trainer, "use_vllm", False):  # vLLM samples; the policy tokenizes and probes
                from metarag.llm.vllm import VLLMRollouts

                llm = VLLMRollouts.from_trainer(trainer, model, f"{self.identity}:step{step}", self.settings.n_ctx,
                                                self.settings.rollout_prefix_tokens)
            return self.run(prompts, model, trainer.processing_class, step, process=process, llm=llm,
                            reference=getattr(trainer, "ref_model", None))

    def run(self, prompts: Sequence[Any], model: Any, tokenizer: Any, step: int, *, process: int = 0,
            llm: Any = None, reference: Any = None) -> dict[str, list]:
        from metarag.llm.hf import HFLLM, HFSettings
        from metarag.methods.runner import Runtime, Sampling, run_many
        from metarag.policy.agent_trace import agent_steps, gap_rates

        questions = [self._question(p) for p in prompts]
        if llm is None:
            inner = model.get_base_model() if hasattr(model, "get_base_model") else model  # LoRA layers stay in
            llm = HFLLM.from_model(inner, tokenizer, identity=f"{self.identity}:step{step}",
                                   settings=HFSettings(embedded=None, n_ctx=self.settings.n_ctx,
                                                       autocast=self._autocast(inner),
                                                       prefix_cache_tokens=self.settings.rollout_prefix_tokens))
        seeds = [rollout_seed(self.settings.seed, step, i, process) for i in range(len(questions))]
        rollouts = [dataclasses.replace(q) for q in questions]  # one object per rollout (see _PerRollout)
        method = self.method
        if hasattr(self.agent_settings, "candidate_seed"):
            method = _PerRollout(self.method.name, {
                id(r): self._build(self.settings.method, {**self.settings.method_overrides(), "candidate_seed": s})
                for r, s in zip(rollouts, seeds)})
        probing = llm
        if self.settings.probe_weights == "frozen":
            inner = model.get_base_model() if hasattr(model, "get_base_model") else model
            probing = frozen_probes(llm, model, tokenizer, reference,
                                    HFSettings(embedded=None, n_ctx=self.settings.n_ctx, autocast=self._autocast(inner),
                                               prefix_cache_tokens=0))
        runtime = Runtime(llm=probing, retriever=self.retriever,
                          sampling=Sampling(temperature=self.settings.temperature))
        cast = frozen_linears_as(model, "bfloat16") if isinstance(llm, HFLLM) and llm.settings.autocast \
            and llm.device.type == "cpu" else contextlib.nullcontext()
        with cast as swapped:
            traces = run_many(method, rollouts, runtime, seeds=seeds)
            failed = [t for t in traces if t.error is not None]
            if len(failed) == len(traces):  # nothing to learn from: the cause is the run's, not the policy's
                raise BackendError(f"every rollout of training step {step} failed; the first: {failed[0].error}")
            verdicts = self._step_verdicts(traces, questions, llm)
        samples = [rollout_sample(t, llm) for t in traces]
        rewards = [self._reward(t, q, v) for t, q, v in zip(traces, questions, verdicts)]
        under = gap_rates([agent_steps(t) for t in traces if t.error is None], self.reward_settings.margin)
        self.last = {"step": step, "traces": traces, "samples": samples, "rewards": rewards, "questions": questions,
                     "verdicts": verdicts, "seeds": seeds, "cast_once": swapped or 0}
        if self.rollout_log is not None:
            self._log_rollouts(step, traces, questions, rewards, seeds, process)
        out = {"prompt_ids": [list(s.prompt_ids) for s in samples],
               "completion_ids": [list(s.completion_ids) for s in samples],
               "logprobs": [list(s.logprobs) for s in samples],
               "env_mask": [list(s.env_mask) for s in samples],
               "rollout_reward": rewards,
               "rollout_layout": [s.layout for s in samples],
               "rollout_under_search": under.under_search_rate,
               "rollout_over_search": under.over_search_rate,
               "rollout_failed": len(failed) / len(traces),
               "rollout_cut": cut_share(traces),
               "rollout_seconds": rollout_seconds(traces),
               "rollout_prompt_tokens": prompt_tokens(llm)}
        if any(s.packed for s in samples):
            out[POSITIONS_FIELD] = [list(s.positions) for s in samples]
        store = getattr(llm, "prefix", None) or getattr(getattr(llm, "policy", None), "prefix", None)
        if store is not None:  # the step's key/value states go now, not whenever the back-end is collected
            store.clear()
        return out

    def _log_rollouts(self, step: int, traces: Sequence[Trace], questions: Sequence[Question],
                      rewards: Sequence[Any], seeds: Sequence[int], process: int) -> None:
        """One line per rollout in `rollout_log` (another process's in `rollouts.process-N.jsonl`):
        the step (the log's numbering: the step these rollouts train), the question, the answer and
        its EM, the reward and its parts, each decision step's action. A step re-run after a resume
        writes its lines again; a reader keeps a step's last ones."""
        from metarag.policy.agent_trace import agent_steps

        path = self.rollout_log if process == 0 else self.rollout_log.with_name(f"rollouts.process-{process}.jsonl")
        with path.open("a") as f:
            for trace, question, reward, seed in zip(traces, questions, rewards, seeds):
                f.write(json.dumps({
                    "step": step + 1, "question_id": question.id, "seed": seed, "answer": trace.answer,
                    "golds": list(question.answers), "error": trace.error,
                    "reward": None if reward is None else reward.total,
                    "outcome": None if reward is None else reward.outcome,
                    "consistency": None if reward is None else reward.consistency,
                    "penalty": None if reward is None else reward.penalty,
                    "actions": [s.action for s in agent_steps(trace)] if trace.error is None else [],
                    "cut": sum(s.cut for s in decision_generations(trace))}) + "\n")

    def _autocast(self, model: Any) -> bool:
        """Whether rollouts run under bf16 autocast: in the bf16-autocast precision, as training does."""
        device = next(model.parameters()).device
        return self.settings.resolved_precision(device.type == "cuda") == "bf16-autocast"

    def _question(self, prompt: Any) -> Question:
        text = prompt if isinstance(prompt, str) else prompt[-1]["content"]
        if text in self.by_prompt:
            return self.by_prompt[text]
        same = self._by_text.get(text, [])
        if len(same) == 1:  # a bare question text names its question when no other has that text
            return same[0]
        if same:
            raise DataError(f"{len(same)} training questions have the text {str(text)[:80]!r}: name one by its "
                            "training prompt (train.agent.training_prompts)")
        raise DataError(f"the trainer sent a prompt that is no training question: {str(text)[:80]!r}")

    def _step_verdicts(self, traces: Sequence[Trace], questions: Sequence[Question], llm: Any) -> list[Any]:
        """HiPRAG's step verdicts for a reward that reads them (None per rollout otherwise): the
        process judges run through `run_many`, greedy, on the live model (the direct answers; and
        the judge, unless `judge_model` names another), over the correct well-formed rollouts only."""
        from metarag.judges.process import ProcessAudit, step_inputs, step_verdicts
        from metarag.methods.runner import Runtime, run_many
        from metarag.train.rewards import NEEDS_STEP_JUDGES, hiprag_needs_judging

        out: list[Any] = [None] * len(traces)
        if self.settings.reward not in NEEDS_STEP_JUDGES:
            return out
        judged = [i for i, (t, q) in enumerate(zip(traces, questions))
                  if t.error is None and hiprag_needs_judging(t, q.answers)]
        if not judged:
            return out
        inputs = {f"rollout{i}": step_inputs(traces[i]) for i in judged}  # one id per rollout: G share a question
        audits = run_many(ProcessAudit(inputs, self.judge_settings),
                          [Question(key, traces[i].question) for key, i in zip(inputs, judged)],
                          Runtime(llm=llm, models=self._judge_models))
        for items, i, audit in zip(inputs.values(), judged, audits):
            out[i] = step_verdicts(items, audit)
        return out

    def _reward(self, trace: Trace, question: Question, verdicts: Any = None) -> Any:
        from metarag.train.rewards import NEEDS_STEP_JUDGES

        if trace.error is not None:  # no score: TRL leaves the rollout out of its group's baseline
            return None
        from metarag.train.rewards import with_support

        if self.settings.reward in NEEDS_STEP_JUDGES:
            reward = self.reward_fn(trace, question.answers, self.reward_settings, verdicts=verdicts)
        else:
            reward = self.reward_fn(trace, question.answers, self.reward_settings)
        return with_support(reward, trace, question.supporting_ids, self.reward_settings)


def reward_columns() -> tuple[list[Callable[..., list]], list[float]]:
    """TRL's reward functions and weights: the total (weight 1) and its parts as zero-weight columns,
    so TRL logs each (`rewards/<name>/mean`) while only the total reaches the advantage; the total's
    function also logs searches, invalid actions and the pooled under-search rate as metrics. A failed
    rollout (reward None) is None in every column: TRL leaves it out of its group's mean and gives it
    no advantage, so a back-end failure neither rewards nor punishes the group's other rollouts."""

    def column(part: Callable[[Any], Any]) -> Callable[..., list]:
        def read(prompts, completions, rollout_reward, **_):
            values = [None if r is None else part(r) for r in rollout_reward]
            return [None if v is None else float(v) for v in values]
        return read

    def reward(prompts, completions, rollout_reward, log_metric=None, rollout_layout=None,
               rollout_under_search=None, rollout_over_search=None, rollout_failed=None, rollout_seconds=None,
               rollout_prompt_tokens=None, rollout_cut=None, **_):
        scored = [r for r in rollout_reward if r is not None]
        if log_metric is not None:
            for part, seconds in (rollout_seconds[0] if rollout_seconds else {}).items():
                log_metric(f"time/{part}", seconds)  # the process's rollouts this step, summed
            for part, tokens in (rollout_prompt_tokens[0] if rollout_prompt_tokens else {}).items():
                log_metric(f"prompt_tokens/{part}", tokens)
            log_metric("failed_rollouts", rollout_failed[0] if rollout_failed else 0.0)
            if rollout_cut and not math.isnan(rollout_cut[0]):
                log_metric("cut_replies", rollout_cut[0])
            if scored:
                log_metric("searches", sum(r.searches for r in scored) / len(scored))
                log_metric("invalid_actions", sum(r.invalid_actions for r in scored) / len(scored))
            for name, rates in (("under_search_rate", rollout_under_search), ("over_search_rate", rollout_over_search)):
                rate = rates[0] if rates else math.nan  # one value, per row
                if not math.isnan(rate):
                    log_metric(name, rate)
            if rollout_layout:
                steps = [case for layout in rollout_layout for case in layout]
                for case in LAYOUTS:
                    log_metric(f"layout/{case}", sum(c == case for c in steps) / max(len(steps), 1))
        return column(lambda r: r.total)(prompts, completions, rollout_reward)

    outcome = column(lambda r: r.outcome)
    consistency = column(lambda r: r.consistency)
    penalty = column(lambda r: r.penalty)
    process = column(lambda r: r.process)  # HiPRAG's N_corr/N, where judged
    retrieval = column(lambda r: r.retrieval)  # AutoRefine's and R1-Searcher stage 1's retrieval term
    for f, name in ((outcome, "outcome"), (consistency, "consistency"), (penalty, "penalty"), (process, "process"),
                    (retrieval, "retrieval")):
        f.__name__ = name  # TRL names the logged columns after the functions
    return [reward, outcome, consistency, penalty, process, retrieval], [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
