"""`metarag train-agent`: GRPO training of the search agents (`search-r1`, `belief-agent`) on TRL's
`GRPOTrainer`, with the belief-action paper's reward (Qi et al., 2026, "MetaRAG: Belief-Action Aligned
Policy Optimization for Agentic RAG", §3.5, Algorithm 1, Appendix D.1) or any other of
`train/rewards.py`. The released baselines R1-Searcher and AutoRefine train the same way, with their
own rewards (`--method r1-searcher --reward r1-searcher-stage1`, then `--reward r1-searcher`;
`--method autorefine --reward autorefine`).

Rollouts are the evaluation policy: TRL's `rollout_func` hook runs the agent's own policy through
`methods/runner.run_many` on the transformers back-end wrapping the trainer's live model
(`HFLLM.from_model`, whole on every process: `whole_for_rollouts`) or on TRL's vLLM engine
(`llm/vllm.py`), sampled (temperature 1.0, a seed per rollout and process), G rollouts per question,
the belief probe on at every decision step. Each finished trace is laid out as one training row with a
mask (`rollout_sample`): the first step's prompt is the prompt; the completion is every step's
generated token ids (env_mask 1, with their sampled log-probs) and, between them, the tokens the model
did not generate (env_mask 0, log-prob 0.0): the `<information>` blocks and notes injected into
search-r1's growing transcript, and for belief-agent the re-built step prompts. One row per rollout,
because TRL's GRPO forms its groups from exactly G completions per prompt. For search-r1 the row is
the text the model read at every step (its transcript grows), with the sampled ids kept; the ids equal
the back-end's own tokenization of a later step's prompt only where re-tokenizing the grown transcript
keeps them (Qwen's tokenizer mostly merges the token after `</search>` with the injected newlines, so
later steps are mostly `text-continued`: the same text, a boundary token apart). For belief-agent each
re-built step prompt starts a segment of its own: its positions restart at 0 and
`StepPackedGRPOTrainer` lets it attend only within the segment, so every step is trained on exactly
the context it was sampled from (verl-agent's per-step samples, packed in one row that shares the
rollout's advantage). `layout/*` metrics count each step's case.

The reward and its parts come from the trace (`train/rewards.py`'s registry) and are logged
separately: the total as TRL's reward, outcome / consistency / penalty as zero-weight reward columns,
searches, invalid actions, the pooled under- and over-search rates and where the step's time went
(`time/*`) as metrics.
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from metarag.errors import BackendError, ConfigError, DataError, MissingDependency, close_matches
from metarag.policy.agent_trace import STEP_PURPOSE, decision_generations
from metarag.records import Generate, Question, Trace
from metarag.settings import check_ranges, setting

AGENT_METHODS = ("search-r1", "belief-agent", "r1-searcher", "autorefine")
# agents whose T counts `max_turns` search turns and then one final turn (Search-R1's trainer and
# those built on it); the belief agent's T is `max_turns`, its forced answer included
_FINAL_TURN_AFTER = frozenset({"search-r1", "r1-searcher", "autorefine"})
# agents that run the belief probe (for the rewards that read it, `rewards.NEEDS_PROBE`)
_PROBED = frozenset({"search-r1", "belief-agent"})
MANIFEST = "metarag_manifest.json"
MERGED = "merged"
TRAINER_DIR = "trainer"
LOG_FILE = "log.jsonl"
ROLLOUT_LOG = "rollouts.jsonl"  # every rollout of every step: its question, answer, reward and actions
CURVES_FILE = "curves.png"
# layout of a decision step inside its rollout's sequence (see `rollout_sample`)
TOKEN_EXACT, TEXT_CONTINUED, FRESH_PROMPT = "token-exact", "text-continued", "fresh-prompt"
LAYOUTS = (TOKEN_EXACT, TEXT_CONTINUED, FRESH_PROMPT)


# ------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class AgentTrainSettings:
    """GRPO on the search agent, with the belief-action paper's settings (Qi et al., 2026, §4.1,
    Appendix D.1): actor lr 1e-6, KL coefficient 0.001 (the k3 "low-var" estimator, verl's and TRL's),
    rollout group G = 5, at most T = 4 turns, 512 response tokens per step, a 4,096-token prompt,
    top-3 passages, rollout temperature 1.0.

    Ours, where the paper's setting does not fit a CPU: `questions_per_step` 1 (the paper's batch is
    256 questions), `steps` 10 (the paper runs 400 iterations), LoRA (`lora` None: on when training
    on the CPU, full fine-tuning on a GPU) with r 16 / alpha 32 / dropout 0.05 (PEFT's usual values;
    the paper trains every weight), `save_every` 5 steps, a constant learning rate (verl's default).
    `loss_type` "dapo": the token mean over the whole generation batch, as Search-R1's and verl's
    `loss_agg_mode=token-mean` (TRL's default too); "grpo" (the mean per sequence, then over
    sequences) and TRL's others are settings. `precision` "auto": on a GPU "bf16-autocast" — float32
    master weights and optimizer state, the forward and backward under bf16 autocast (verl's FSDP
    mixed precision; Adam's update at lr 1e-6 is below bf16's resolution for most weights, so pure
    "bf16" weights would not move); on the CPU "fp32". "bf16" is kept as a setting for the test that
    shows it does not train. `vllm` "off": rollouts generate with the transformers back-end;
    "colocate" / "server" generate through TRL's vLLM (the server at `vllm_server_url`, which must run
    with `--logprobs-mode processed_logprobs`: refused otherwise), with `vllm_gpu_memory_utilization`
    of each GPU for a colocated engine (TRL's default 0.3; it loads the policy from a safetensors model
    folder, so a GGUF `--llm` is refused).
    `time_budget_s` 0: no limit; else training stops (and saves) after that many seconds, measured on
    the main process and broadcast, so every process stops after the same step. A budget stop is a
    pause, not the run's end: its checkpoint holds no `merged/` copy (with `merged_checkpoints`
    "last"), because the same command resumes it; `--steps` at the stop's step writes the copy
    without training (the 1.5B's copy takes a minute and 5-6 GB of peak memory more, each pause).
    `gradient_checkpointing` on and `attn_implementation` "sdpa" for the training passes: a rollout's
    sequence runs to thousands of tokens, and eager attention keeps an n × n matrix per head and layer
    for the backward pass (a 0.5B step on a 2,000-token belief-agent rollout ran out of 23 GB).
    `train_batch_size` rollouts go through one forward / backward pass (TRL's
    `per_device_train_batch_size`; 1: one at a time, the least memory). `packed_passes`: how a packed
    row (belief-agent's rebuilt step prompts, see `rollout_sample`) goes through the model: "mask",
    the row in one pass under a block-causal 4D mask (`packed_inputs`; rows batch together, which a GPU
    wants); "split", each segment a pass of its own under the plain causal mask — the same log-probs,
    but SDPA's fused causal kernel instead of its math path (which a 4D mask forces on the CPU:
    every L × L attention matrix of the whole row, across segments too, kept for the backward pass);
    "auto": split in one CPU process, mask on a GPU or across processes (DDP takes one forward per
    backward). `rollout_prefix_tokens`: the rollouts' back-end keeps that many tokens of key/value
    states (`HFSettings.prefix_cache_tokens`), so each turn and each probe runs only the tokens it adds
    to an earlier request, and a group's G rollouts run their shared prompt once; 0 runs every request
    whole (the same tokens up to float rounding, more time). `save_every`: a checkpoint every that many
    steps, a resumed run's own (not the interval it was saved with). `keep_checkpoints`: only the
    newest 3 checkpoints are kept (TRL's `save_total_limit`); 0 keeps every one. `merged_checkpoints`:
    which checkpoints also hold `merged/`, the full model with the adapter merged in (the folder
    `--llm hf:PATH` evaluates): "last", the one at the run's `steps` (not a time-budget pause; a
    checkpoint without one gets it when the same command is run again with `--steps` at its step),
    because the merged copy of a 1.5B is 6 GB in float32, takes a deep copy of the model in
    memory (the 1.5B run peaked at 19-20 GB while saving, 14-15 GB otherwise) and a minute to write
    and hash; "every", each checkpoint.
    search-r1 takes `max_turns` as Search-R1's trainer does (`max_turns` search turns, then one final
    answer turn: T = max_turns + 1 generations), and so do r1-searcher and autorefine (AutoRefine's
    trainer is Search-R1's; R1-Searcher's `experience_maker.py` cuts the ninth generation: its
    training is `--max-turns 8 --top-k 3`, AutoRefine's `--max-turns 5 --top-k 3`); belief-agent's
    T = max_turns counts the forced answer (the paper's agent). Only search-r1 and belief-agent run
    the belief probe, which the belief rewards need.
    `scale_rewards` "none": a group's advantages are its rewards minus their mean, not divided by a
    standard deviation (Dr. GRPO, Liu et al., 2025; TRL's `scale_rewards`). The paper's verl GRPO
    divides by the group's std ("group"), which gives a group whose rollouts differ only by the −0.01
    invalid-action penalty the same ±1 advantages as one that differs in the answer (44 of our first
    run's first 80 groups); "batch" (one std over the step's rollouts, Lite PPO) fixes that only while
    some group of the step differs in outcome, so a step without one (about 3 % of steps at our 57 %
    signal rate and 4 questions a step) would again blow the penalty up. Only "none" bounds a
    format-only group's advantages by the penalty itself, in every step.
    `probe_weights` "policy": the belief probe reads the model being trained, as the paper does;
    "frozen": it reads the starting weights (the LoRA adapter switched off for each probe, or the KL
    reference model in full fine-tuning), so training the policy cannot move the belief its reward
    is aligned with."""

    method: str = "belief-agent"
    reward: str = "belief"
    steps: int = setting(10, ge=1)
    learning_rate: float = setting(1e-6, gt=0)
    kl_coef: float = setting(0.001, ge=0)
    group_size: int = setting(5, ge=2)
    questions_per_step: int = setting(1, ge=1)
    max_turns: int = setting(4, ge=1)
    step_max_tokens: int = setting(512, ge=1)
    n_ctx: int = setting(4096, ge=64)
    top_k: int = setting(3, ge=1)
    temperature: float = setting(1.0, gt=0)
    lora: bool | None = None
    lora_r: int = setting(16, ge=1)
    lora_alpha: int = setting(32, ge=1)
    lora_dropout: float = setting(0.05, ge=0, lt=1)
    loss_type: Literal["dapo", "grpo", "bnpo", "dr_grpo"] = "dapo"
    precision: Literal["auto", "fp32", "bf16-autocast", "bf16"] = "auto"
    vllm: Literal["off", "colocate", "server"] = "off"
    vllm_server_url: str = "http://localhost:8000"
    vllm_gpu_memory_utilization: float = setting(0.3, gt=0, le=1)
    gradient_checkpointing: bool = True
    attn_implementation: str = "sdpa"
    train_batch_size: int = setting(1, ge=1)
    packed_passes: Literal["auto", "mask", "split"] = "auto"
    rollout_prefix_tokens: int = setting(16384, ge=0, metadata={"omit_default": True})
    save_every: int = setting(5, ge=1)
    keep_checkpoints: int = setting(3, ge=0)
    merged_checkpoints: Literal["last", "every"] = dataclasses.field(default="last", metadata={"omit_default": True})
    time_budget_s: float = setting(0.0, ge=0)
    seed: int = 0
    scale_rewards: Literal["none", "batch", "group"] = "none"
    probe_weights: Literal["policy", "frozen"] = "policy"
    # belief-agent's `belief_table` (methods/search_agent.py): the first step's belief from closed-book
    # agreement instead of the probe; left out of the saved settings when off
    belief_table: str = dataclasses.field(default="", metadata={"omit_default": True})
    # belief-agent's `think_prefix` (methods/search_agent.py says why), off as in the paper; left out of
    # the saved settings at its default
    think_prefix: bool = dataclasses.field(default=False, metadata={"omit_default": True})

    def __post_init__(self) -> None:
        check_ranges(self)
        if self.method not in AGENT_METHODS:
            raise ConfigError(f"train-agent trains {' or '.join(AGENT_METHODS)}, not {self.method!r}"
                              f"{close_matches(self.method, AGENT_METHODS)}")
        if self.belief_table and self.method != "belief-agent":
            raise ConfigError(f"belief_table is belief-agent's setting; {self.method} reads its belief from the probe")
        if self.think_prefix and self.method != "belief-agent":
            raise ConfigError(f"think_prefix is belief-agent's setting; {self.method} keeps its own reply opening")
        from metarag.train.rewards import reward_function

        reward_function(self.reward)  # an unknown reward fails here, before any model loads
        from metarag.train.rewards import NEEDS_PROBE

        if self.reward in NEEDS_PROBE and self.method not in _PROBED:
            raise ConfigError(f"the reward {self.reward!r} reads the belief probe, which {self.method} does not run "
                              f"(train {' or '.join(sorted(_PROBED))} with it)")

    def method_overrides(self) -> dict[str, Any]:
        """The agent's settings a training run fixes: turns, passages, step budget, the probe on."""
        turns = self.max_turns + 1 if self.method in _FINAL_TURN_AFTER else self.max_turns
        probe = {"probe": True} if self.method in _PROBED else {}
        think = {"think_prefix": True} if self.think_prefix else {}
        table = {"belief_table": self.belief_table} if self.belief_table else {}
        return {"T": turns, "k": self.top_k, "step_max_tokens": self.step_max_tokens, **probe, **think, **table}

    def resolved_packed_passes(self, on_gpu: bool, processes: int = 1) -> str:
        """What "auto" means here: one masked pass a batch on a GPU or across processes, a pass a segment
        on one CPU process. Across processes DDP takes one forward per backward, so "split" is refused."""
        if self.packed_passes == "split" and processes > 1:
            raise ConfigError(f"packed_passes 'split' runs a forward per segment, which DDP across {processes} "
                              "processes does not take (one forward per backward); use 'mask' or 'auto'")
        if self.packed_passes != "auto":
            return self.packed_passes
        return "mask" if on_gpu or processes > 1 else "split"

    def resolved_precision(self, on_gpu: bool) -> str:
        """The precision "auto" means on this machine: bf16 autocast over float32 weights on a GPU."""
        if self.precision != "auto":
            return self.precision
        return "bf16-autocast" if on_gpu else "fp32"


# Named presets of train-agent settings (`--recipe NAME`; `--set` still overrides any of them).
RECIPES: dict[str, dict[str, Any]] = {
    "paper": {},
    # A GRPO step the 2-core CPU can afford (measured by benchmarks/train_step.py against "paper").
    # Kept: the belief reward, its gap diagnosis (the probe at every step), verify-first, G = 5, the
    # forced last answer. Each change, its reason and its cost:
    "cpu": {
        # 3 turns, not 4: two searches then the forced answer (HotpotQA's bridge questions need two
        # hops); the longest rollouts, the costliest to generate and to train on, go.
        "max_turns": 3,
        # 128 tokens a step, not 512: the untrained 0.5B's steps average ~100 tokens; the long tail
        # is run-on prose past the action (cost: a step cut at 128 is an invalid action).
        "step_max_tokens": 128,
        # top-2 passages, not 3: a shorter context for every later step and its training row
        # (cost: the second hop's paragraph must rank in the top 2).
        "top_k": 2,
        # KL 0, no reference model (DAPO's choice, and several Search-R1 successors'): the reference
        # pass was a forward over every row (cost: nothing holds the policy near the base but LoRA's
        # small rank and the learning rate).
        "kl_coef": 0.0,
        # no gradient checkpointing (recomputation costs a forward), and so one row at a time: every
        # row's activations are kept for the backward pass (packed rows pass a segment at a time,
        # `packed_passes` "auto"; under the one-pass 4D mask SDPA's math path also kept every L x L
        # attention matrix, and five rows of the 0.5B at once took 14.6 GB).
        "train_batch_size": 1,
        "gradient_checkpointing": False,
        # bf16 autocast over float32 weights for rollouts and training: this CPU's AVX512-BF16
        # matmuls are ~4x float32's (benchmarks/train_step.py measures it and prints which the CPU has).
        "precision": "bf16-autocast",
        # LoRA's usual rate, ten times the paper's full fine-tuning rate (adapters start at zero).
        "learning_rate": 1e-5,
        "lora": True,
    },
}


def recipe_settings(name: str, **overrides: Any) -> AgentTrainSettings:
    """The settings of a named recipe with `overrides` on top (an unknown recipe fails with the names)."""
    if name not in RECIPES:
        raise ConfigError(f"unknown training recipe {name!r}{close_matches(name, RECIPES)}; recipes: "
                          f"{', '.join(RECIPES)}")
    return AgentTrainSettings(**{**RECIPES[name], **overrides})


def training_settings(recipe: str, values: Mapping[str, Any]) -> tuple[AgentTrainSettings, Any, Any]:
    """The trainer's, the reward's and HiPRAG's step judges' settings from one set of `key=value`
    overrides on a recipe (`train-agent --recipe R --set ...`): a key goes to the reward's or the
    judges' settings when it is theirs, else to the trainer's; an unknown key fails naming the owner.
    The judges' settings are None unless the reward is HiPRAG's (given for another reward: refused)."""
    import dataclasses

    from metarag.judges.process import ProcessJudgeSettings
    from metarag.settings import override
    from metarag.train.rewards import RewardSettings

    owned = {cls: {f.name for f in dataclasses.fields(cls)} for cls in (RewardSettings, ProcessJudgeSettings)}
    parts = {cls: {k: v for k, v in values.items() if k in names} for cls, names in owned.items()}
    settings = override(recipe_settings(recipe), {k: v for k, v in values.items()
                                                  if not any(k in names for names in owned.values())},
                        owner="train-agent")
    reward = override(RewardSettings(), parts[RewardSettings], owner="train-agent reward")
    judges = override(ProcessJudgeSettings(), parts[ProcessJudgeSettings], owner="train-agent HiPRAG judges")
    if parts[ProcessJudgeSettings] and settings.reward != "hiprag":
        raise ConfigError(f"--set {', '.join(parts[ProcessJudgeSettings])}: HiPRAG's judge settings apply to "
                          f"--reward hiprag only, not {settings.reward}")
    return settings, reward, judges if settings.reward == "hiprag" else None


PRECISIONS = {  # precision -> (the weights' torch dtype, TrainingArguments' bf16 autocast)
    "fp32": ("float32", False), "bf16-autocast": ("float32", True), "bf16": ("bfloat16", False)}


def check_training_split(name: str, path: str | None, allow_any: bool = False, questions: Sequence[Any] = ()) -> None:
    """Refuse to train on an evaluation split: `data.datasets.check_training_split`'s rule, for the
    dataset named `name` (a preset's name, or the file's as the loader names it), read from `path`, whose
    `questions` must hold no held-out question of the headline lists."""
    from types import SimpleNamespace

    from metarag.data.datasets import check_training_split as check

    check(SimpleNamespace(name=name, path=path or name, questions=tuple(questions)), allow_any,
          trained="the agent is trained")


# ------------------------------------------------------------------------------ rollout layout
@dataclass(frozen=True)
class RolloutSample:
    """One rollout as TRL trains it: `prompt_ids` (the first step's prompt, as the back-end
    tokenized it), `completion_ids` (everything after), `env_mask` (1 on the tokens the model
    generated, 0 on injected ones), `logprobs` (the sampled log-prob of each generated token; 0.0 on
    injected tokens, which carry none: a NaN there would reach TRL's importance correction),
    `layout` (each decision step's case: token-exact, text-continued or fresh-prompt, see
    `rollout_sample`), `spans` (where each step's generated ids lie in the completion: start, end),
    `positions` (the position id of each completion token: counting on from the prompt, and from 0
    again where a fresh-prompt step starts a segment of its own; `StepPackedGRPOTrainer` restarts
    attention there too)."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    env_mask: tuple[int, ...]
    logprobs: tuple[float, ...]
    layout: tuple[str, ...]
    spans: tuple[tuple[int, int], ...] = ()
    positions: tuple[int, ...] = ()

    @property
    def packed(self) -> bool:
        """Whether some step starts a segment of its own (its positions restart at 0)."""
        return FRESH_PROMPT in self.layout


def step_generations(trace: Trace) -> list[Generate]:
    """The trace's decision-step generations by the run's own model, in order (the probe's Score
    steps and any other model's calls are not trained on)."""
    return [s for s in decision_generations(trace) if not s.model]


def rollout_sample(trace: Trace, llm: Any) -> RolloutSample:
    """Lay a finished agent trace out as one sequence with a mask. `llm` is the back-end the rollout
    ran on (its `tokenize`, `detokenize` and `render`, i.e. how it turned each step's prompt into ids).

    Step 0's prompt ids are the prompt. Each step k's generated ids follow with mask 1. Before them,
    what step k's prompt adds to the sequence so far, with mask 0:
    - token-exact: step k's prompt ids start with the sequence so far (search-r1: the transcript
      grew by the `<information>` block); the rest of its ids. The model read exactly this.
    - text-continued: not as ids but as text (the back-end re-tokenized the transcript, e.g. a stop
      token whose piece ran past `</search>`, or sampled ids that tokenize differently); the rest of
      the text, tokenized. The same text as the model read, tokenized once.
    - fresh-prompt: step k's prompt is no continuation (belief-agent's re-built step prompt); all
      of its ids, as a new segment: its positions start again at 0 and the trainer lets it attend
      only to itself (`StepPackedGRPOTrainer`), so step k is trained on exactly the context it was
      sampled from. The sequence is then n steps packed in one row, sharing the rollout's advantage
      (one row per rollout keeps TRL's groups of G; verl-agent's per-step samples, packed).
    A trace with no generation (it failed first) gets one masked end-of-sequence token."""
    generations = step_generations(trace)
    eos = _eos_id(llm)
    if not generations:
        return RolloutSample((eos,), (eos,), (0,), (0.0,), (), (), (1,))

    prompt = step_prompt_ids(generations[0], llm)
    sequence = list(prompt)  # what the current segment's next token reads
    completion: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    positions: list[int] = []
    layout: list[str] = []
    spans: list[tuple[int, int]] = []
    for k, g in enumerate(generations):
        if k == 0:
            layout.append(TOKEN_EXACT)
        else:
            ctx = step_prompt_ids(g, llm)
            if ctx[:len(sequence)] == sequence:
                added, case = ctx[len(sequence):], TOKEN_EXACT
            else:
                said, read = llm.detokenize(sequence), llm.detokenize(ctx)
                if read.startswith(said):
                    added, case = list(llm.piece_tokens(read[len(said):])), TEXT_CONTINUED
                else:
                    added, case = ctx, FRESH_PROMPT
                    sequence = []  # a segment of its own: positions and attention start again
            layout.append(case)
            positions += range(len(sequence), len(sequence) + len(added))
            completion += added
            mask += [0] * len(added)
            logprobs += [0.0] * len(added)
            sequence += added
        ids, lps = step_token_ids(g, trace.question_id)
        spans.append((len(completion), len(completion) + len(ids)))
        positions += range(len(sequence), len(sequence) + len(ids))
        completion += ids
        mask += [1] * len(ids)
        logprobs += lps
        sequence += ids
    if not completion:  # an empty first generation that ended the trace
        completion, mask, logprobs, positions = [eos], [0], [0.0], [len(prompt)]
    return RolloutSample(tuple(prompt), tuple(completion), tuple(mask), tuple(logprobs), tuple(layout),
                         tuple(spans), tuple(positions))


def step_prompt_ids(g: Generate, llm: Any) -> list[int]:
    """The ids a decision step's prompt was fed as: its recorded `prompt_ids`, or its prompt rendered
    and tokenized by `llm` (the back-end it ran on)."""
    from metarag.llm.base import prompt_text

    if g.prompt_ids:
        return list(g.prompt_ids)
    return list(llm.tokenize(prompt_text(llm, g.prompt))) if g.prompt else []


def step_token_ids(g: Generate, question_id: str) -> tuple[list[int], list[float]]:
    """The ids and sampled log-probs a decision step generated, as its trace recorded them."""
    tokens = g.logprobs or ()
    if not tokens and g.text:
        raise DataError(f"trace of question {question_id!r}: a decision step recorded without its "
                        "tokens; the agent asks with logprobs=1")
    if any(t.id is None for t in tokens):
        raise DataError(f"trace of question {question_id!r}: the back-end returned no token ids")
    return [int(t.id) for t in tokens], [float(t.logprob) for t in tokens]


def _eos_id(llm: Any) -> int:
    tokenizer = getattr(llm, "tokenizer", None)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        return int(tokenizer.eos_token_id)
    ids = llm.tokenize("<|im_end|>")
    return ids[-1] if ids else 0


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


def release_freed_memory() -> float | None:
    """Hand the C heap's free pages back to the system (glibc's `malloc_trim`) and return the
    process's resident memory in GB (None where /proc does not say). A step frees tensors of many
    sizes (rollouts' key/value states, activations, a checkpoint's merged copy); glibc keeps freed
    pages in its heap, and the 1.5B run's resident memory grew from 12 to 22 GB over 14 steps (2026-12-05).
    Trimmed once a step (in `on_log`), it read 7.7-8.2 GB at each step's end over the next five steps,
    a checkpoint's save included (peaks inside a step: ~14 GB, ~19 GB while saving). A no-op beyond glibc."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024 ** 2
    except OSError:
        pass
    return None


def training_prompts(questions: Sequence[Question]) -> list[str]:
    """The dataset rows TRL hands back to the rollout function, one per question: the question's
    place and text, so that two questions with the same text (and other answers) stay apart."""
    return [f"[{i}] {q.text}" for i, q in enumerate(questions)]


# ------------------------------------------------------------------------------------ rollouts
@contextlib.contextmanager
def frozen_linears_as(model: Any, dtype: str):
    """Inside, every linear layer's frozen float32 weight and bias (LoRA's base layers, the LM head)
    are `dtype` copies, made once; on leaving, the originals are back. Under autocast to that dtype a
    linear layer computes from a cast of its weight, and autocast keeps the cast only for a weight
    that trains: a frozen one is cast again at every forward, i.e. at every generated token, which
    made the cast (the whole model's weights read and written) most of a CPU rollout's decode time.
    The same casts made once give the same logits, bit for bit (the cast is deterministic): the
    0.5B decoded a token 2.4x faster (benchmarks/frozen_cast.py). The rollouts run inside it, and so
    does each training_step of `StepPackedGRPOTrainer` (`cast_frozen`: one CPU process): the backward
    reads the same casts autocast would have saved, so the gradient is the same too. A tied LM head
    gets a copy of its own; the embedding it is tied to stays as it was. Yields how many tensors were
    swapped."""
    import torch

    target = getattr(torch, dtype)
    swapped = []
    try:
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            for name in ("weight", "bias"):
                tensor = getattr(module, name, None)
                if isinstance(tensor, torch.nn.Parameter) and not tensor.requires_grad \
                        and tensor.dtype == torch.float32:
                    swapped.append((module, name, tensor))
                    setattr(module, name, torch.nn.Parameter(tensor.detach().to(target), requires_grad=False))
        yield len(swapped)
    finally:
        for module, name, tensor in reversed(swapped):
            setattr(module, name, tensor)


@contextlib.contextmanager
def fsdp2_unsharded(module: Any):
    """Inside, every FSDP2 unit of `module` holds its full parameters, gathered once on entry (one
    all-gather a unit, in the same order on every process) and kept through every forward (no reshard
    after each), then sharded again on leaving. Rollouts call the model a different number of times on
    each process (each samples its own rollouts: other lengths, turns and probes), and a sharded unit
    all-gathers its parameters at every call, a collective every process must join: without this, a
    process waits on a gather no other process makes. Under the accelerate configuration's bf16 mixed
    precision the gathered parameters are bf16 (FSDP2's `param_dtype`), 2 bytes a parameter on every GPU
    while the rollouts run. A module without FSDP2 units is left as it is. (TRL's
    `unwrap_model_for_generation` gathers under DeepSpeed ZeRO-3 only; its `summon_full_params` does
    nothing under FSDP2: trl/distributed.py.)"""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        yield module
        return
    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not units:
        yield module
        return
    states = [unit._get_fsdp_state() for unit in units]
    states[0]._lazy_init()  # the root settles which unit reshards after forward before any forward has run
    # what each unit does after a forward, restored on leaving (FSDP2 keeps it per parameter group)
    saved = [(state._auto_reshard_after_forward, [group.post_forward_mesh_info for group in state._fsdp_param_groups])
             for state in states]
    for unit in units:
        unit.unshard()
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield module
    finally:
        for state, (auto, infos) in zip(states, saved):
            state._auto_reshard_after_forward = auto
            for group, info in zip(state._fsdp_param_groups, infos):
                group.post_forward_mesh_info = info
        for unit in units:
            unit.reshard()


@contextlib.contextmanager
def whole_for_rollouts(trainer: Any, reference: bool = False):
    """The trainer's policy, whole on every process, for a step's rollouts (and with `reference` the
    KL reference model too, which the frozen belief probe reads): FSDP2 units gathered for the whole
    rollout phase (`fsdp2_unsharded`), DeepSpeed ZeRO-3 through TRL's `unwrap_model_for_generation`
    (which also turns gradient checkpointing off for generation). Yields the policy as generation
    takes it. FSDP version 1 and a ZeRO-3 reference model are refused before training (`check_sharding`)."""
    from trl.models.utils import unwrap_model_for_generation

    with contextlib.ExitStack() as stack:
        stack.enter_context(fsdp2_unsharded(trainer.model_wrapped))
        ref = getattr(trainer, "ref_model", None)
        if reference and ref is not None:
            stack.enter_context(fsdp2_unsharded(ref))
        yield stack.enter_context(unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation))


def check_sharding(trainer: Any, settings: AgentTrainSettings, lora: bool) -> None:
    """Refuse what the rollouts cannot run whole on every process: FSDP version 1 (its
    `summon_full_params` refuses a forward inside it, and outside it every call gathers: the
    processes' different call counts would hang), a ZeRO-3 policy not gathered for generation, and
    the frozen belief probe on a ZeRO-3 reference model (nothing gathers it). The same on every process."""
    from trl.distributed import DistributedBackend

    backend = DistributedBackend(trainer.accelerator)
    if backend.fsdp_version == 1:
        raise ConfigError("FSDP version 1 cannot give the rollouts the whole model: set fsdp_version: 2 "
                          "(configs/accelerate/8gpu-fsdp.yaml)")
    if backend.is_zero3 and not trainer.args.ds3_gather_for_generation:
        raise ConfigError("DeepSpeed ZeRO-3 rollouts need the policy gathered (ds3_gather_for_generation)")
    if backend.is_zero3 and settings.probe_weights == "frozen" and not lora:
        raise ConfigError("probe_weights 'frozen' reads the KL reference model, which DeepSpeed ZeRO-3 shards and "
                          "nothing gathers for the rollouts: train with LoRA, or under FSDP2")


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


# --------------------------------------------------------------------------- packed step training
POSITIONS_FIELD = "rollout_positions"  # the rollout_func's column of completion position ids


def packed_inputs(attention_mask: Any, completion_positions: Any, logits_to_keep: int, *, boolean: bool,
                  with_mask: bool = True):
    """The position ids and the 4D attention mask of a batch of packed rollouts. `attention_mask` is
    TRL's (B, P + C) padding mask (prompt left-padded, completion right-padded); `completion_positions`
    (B, ≤ C) the rollouts' `RolloutSample.positions`. A token attends to the earlier tokens of its own
    segment only (a segment starts where the positions restart at 0); padding attends to itself only,
    so that no row of the mask is empty. `boolean`: True where attention is allowed (sdpa); else
    additive, 0 or the float32 minimum (eager). `with_mask` False: the positions only (mask None), for
    passes that run a segment at a time."""
    import torch

    batch, width = attention_mask.shape
    prompt_width = width - logits_to_keep
    valid = attention_mask.bool()
    positions = torch.zeros_like(attention_mask, dtype=torch.long)
    prompt_mask = attention_mask[:, :prompt_width].long()
    positions[:, :prompt_width] = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    given = completion_positions.to(attention_mask.device).long()[:, :logits_to_keep]
    positions[:, prompt_width:prompt_width + given.size(1)] = given
    if not with_mask:
        return positions, None
    starts = (positions == 0) & valid
    segment = starts.long().cumsum(-1)
    same = segment.unsqueeze(2) == segment.unsqueeze(1)
    causal = torch.ones(width, width, dtype=torch.bool, device=attention_mask.device).tril()
    allowed = same & causal & valid.unsqueeze(1) & valid.unsqueeze(2)
    allowed |= torch.eye(width, dtype=torch.bool, device=attention_mask.device)  # padding sees itself
    mask = allowed.unsqueeze(1)
    if not boolean:
        mask = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(
            ~mask, torch.finfo(torch.float32).min)
    return positions, mask


@contextlib.contextmanager
def scored_positions_only(device: Any):
    """TRL's fused LM head (`add_fused_lm_head`) projects only the positions that carry a label on a
    Triton device (CUDA, XPU), and every position elsewhere, so that an accelerator compiling fixed
    tile shapes (Neuron) does not recompile per batch. On the CPU nothing compiles, and the head is
    float32 over the 151,936-token vocabulary: a packed row's prompts (every step's, three quarters of
    its tokens) cost as much in the head as the tokens the loss counts. Inside this context, on the
    CPU, the head takes the labelled positions only: the same log-probs and gradient (zeros elsewhere,
    as before), less work. A TRL without the switch is left as it is."""
    from trl.trainer import utils

    original = getattr(utils, "_use_triton", None)
    if original is None or getattr(device, "type", None) != "cpu":
        yield
        return
    utils._use_triton = lambda where: where.type == "cpu" or original(where)
    try:
        yield
    finally:
        utils._use_triton = original


def epoch_sampler(sampler: Any) -> Any:
    """TRL's GRPO `RepeatSampler` as one that draws epoch e's question order from the seed alone.

    TRL's sampler draws one `torch.randperm` an epoch from a generator it seeds once, so epoch e's
    order is the generator's e-th permutation. A resumed run builds a new sampler, and transformers'
    Trainer no longer iterates the epochs it skips: the new generator's first permutation came back
    (a run resumed in epoch 4 drew epoch 1's order, then epoch 2's: found in the retry's rollout log,
    steps 16-20). This one is told its epoch (`set_epoch`: the step-packed trainer's callback calls it as each
    epoch begins, across processes too) and re-seeds and skips e permutations before drawing, so a
    resumed run draws what the uninterrupted run draws (`training_order` reproduces it). A sampler
    that is not TRL's, or one without a seed, is returned as it is."""
    from trl.trainer.utils import RepeatSampler

    if type(sampler) is not RepeatSampler or not sampler.shuffle or sampler.seed is None:
        return sampler

    class EpochSampler(RepeatSampler):
        epoch: int | None = None

        def set_epoch(self, epoch: int) -> None:
            self.epoch = int(epoch)

        def __iter__(self):
            import torch

            if self.epoch is not None:
                self.generator.manual_seed(self.seed)
                for _ in range(self.epoch):
                    torch.randperm(self.num_samples, generator=self.generator)
            return super().__iter__()

    return EpochSampler(sampler.data_source, sampler.mini_repeat_count, sampler.batch_size, sampler.repeat_count,
                        sampler.shuffle, sampler.seed)


def step_packed_trainer(trl: Any) -> type:
    """TRL's `GRPOTrainer` that trains each decision step on the context it was sampled from: the
    rollouts' position ids (`POSITIONS_FIELD`) travel with the batch (`completion_positions`, shuffled
    and split with it), and every log-prob pass (policy, old, reference) gives the model those
    positions and the block-causal mask of `packed_inputs`. Rows without a restart get the plain
    causal mask and positions, i.e. exactly what TRL computes. Text models with sdpa or eager
    attention (a 4D mask; flash attention takes none)."""
    import copy

    import torch
    from transformers import TrainerCallback

    class _SamplerEpoch(TrainerCallback):
        """Tells the sampler each epoch it starts. accelerate's loader passes `set_epoch` on to the
        sampler in one process but not through the batch sampler it shards across processes (nor
        through the one that skips a resumed epoch's done steps there), so the trainer tells it here:
        the epoch is the state's at the epoch's start (a resumed run's is read from its checkpoint, e.g.
        3.75 in the fourth epoch)."""

        def __init__(self, trainer: Any):
            self.trainer = trainer

        def on_epoch_begin(self, args, state, control, **kwargs):
            sampler = self.trainer._epoch_sampler
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(int(state.epoch + 1e-6))

    class StepPackedGRPOTrainer(trl.GRPOTrainer):
        """(see `step_packed_trainer`) The reference model of full fine-tuning with a KL term is a
        frozen copy of the policy as it starts, not a model TRL re-loads from the policy's config
        path (which an in-memory model, or one read from a GGUF file, does not have); there is none at
        KL 0 (TRL's rule too). Under FSDP2 the copy is the policy's architecture on the meta device
        (`meta_reference`), given the main process's starting weights as TRL shards it: no process
        holds a second full copy in host memory."""

        def __init__(self, *args, model: Any = None, peft_config: Any = None, **kwargs):
            from trl.trainer import grpo_trainer

            needs_reference = peft_config is None and float(getattr(kwargs.get("args"), "beta", 0.0)) != 0.0 \
                and not hasattr(model, "peft_config")
            sharded = needs_reference and fsdp2_launch()
            snapshot = (meta_reference(model) if sharded else copy.deepcopy(model)) if needs_reference else None
            load = grpo_trainer.create_model_from_path

            def reference(model_id: str, **init: Any) -> Any:
                dtype = init.get("dtype")
                return snapshot.to(dtype) if isinstance(dtype, torch.dtype) else snapshot

            grpo_trainer.create_model_from_path = reference if snapshot is not None else load
            try:
                super().__init__(*args, model=model, peft_config=peft_config, **kwargs)
            finally:
                grpo_trainer.create_model_from_path = load
            if sharded and self.ref_model is not None:  # sharded on the meta device: the starting weights now
                from accelerate.utils.fsdp_utils import fsdp2_load_full_state_dict

                fsdp2_load_full_state_dict(self.accelerator, self.ref_model,
                                           model.state_dict() if self.accelerator.is_main_process else {})
            self.add_callback(_SamplerEpoch(self))

        def _get_train_sampler(self, dataset: Any = None) -> Any:
            """TRL's sampler, made to draw epoch e's order on resume too (`epoch_sampler`)."""
            self._epoch_sampler = epoch_sampler(super()._get_train_sampler(dataset))
            return self._epoch_sampler

        _epoch_sampler = None

        def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
            """transformers' loading, then every adapter but the trained one dropped. It loads the
            adapter at a checkpoint's top into the trained adapter and any sub-folder holding adapter
            weights as one more adapter, named after the folder: checkpoints written before
            2026-12-06 kept a copy of their adapter in adapter/, so each resume of them carried an
            idle second adapter ("adapter", never active, never trained) and each save after it
            wrote that one again, nested (checkpoint-N/adapter/adapter/: 74 MB for the 1.5B)."""
            super()._load_from_checkpoint(resume_from_checkpoint, model)
            loaded = model if model is not None else self.model
            configs = getattr(loaded, "peft_config", None)
            if isinstance(configs, dict):
                for name in [n for n in configs if n not in loaded.active_adapters]:
                    loaded.delete_adapter(name)

        _scoring_positions = None
        _in_loss = False
        packed_passes = "mask"  # or "split" (AgentTrainSettings.packed_passes, resolved by train_agent)
        cast_frozen = False  # bf16 copies of the frozen weights for each training_step (`frozen_linears_as`)
        # seconds of the current optimizer step, logged as time/* metrics when it ends: the rollout
        # function, the log-prob passes outside the loss (the reference model's), and the policy's
        # forward and backward (everything else in the step's training_step calls)
        _seconds = {"rollouts": 0.0, "reference": 0.0, "policy": 0.0}
        _scoring = 0.0
        _loss_mask = None

        def training_step(self, model, inputs, num_items_in_batch):
            self._scoring = 0.0
            start = time.perf_counter()
            cast = frozen_linears_as(self.accelerator.unwrap_model(model), "bfloat16") if self.cast_frozen \
                else contextlib.nullcontext()
            with cast:  # the forward, the backward and any recomputation: the frozen weights cast once
                out = super().training_step(model, inputs, num_items_in_batch)
            self._seconds = {**self._seconds,
                             "policy": self._seconds["policy"] + time.perf_counter() - start - self._scoring}
            if self._step % self.current_gradient_accumulation_steps == 0:  # TRL counted this micro-step
                for part, seconds in self._seconds.items():
                    self._metrics["train"][f"time/{part}"].append(seconds)
                self._seconds = dict.fromkeys(self._seconds, 0.0)
            return out

        def _generate(self, prompts):
            start = time.perf_counter()
            out = super()._generate(prompts)
            self._seconds = {**self._seconds, "rollouts": self._seconds["rollouts"] + time.perf_counter() - start}
            positions = out[5].pop(POSITIONS_FIELD, None)  # extra_fields: not a reward column
            if positions is not None:
                width = max(len(p) for p in positions)
                table = torch.zeros((len(positions), width), dtype=torch.long)
                for i, row in enumerate(positions):
                    table[i, :len(row)] = torch.tensor(row, dtype=torch.long)
                    if len(row) < width:  # right padding goes on counting (it is masked out anyway)
                        table[i, len(row):] = torch.arange(len(row), width) + (row[-1] if row else 0) + 1
                self._scoring_positions = table.to(self.accelerator.device)
            return out

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            try:
                output = super()._generate_and_score_completions(inputs)
                if self._scoring_positions is not None:
                    output["completion_positions"] = self._scoring_positions
                return output
            finally:
                self._scoring_positions = None
                self._scoring += time.perf_counter() - start

        def _compute_loss(self, model, inputs):
            self._scoring_positions = inputs.get("completion_positions")
            # the tokens the loss counts (TRL's own mask): the LM head is run at no other position
            mask = inputs["completion_mask"]
            self._loss_mask = mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]
            self._in_loss = True
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self._scoring_positions = self._loss_mask = None
                self._in_loss = False

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                               **multimodal):
            if not self._in_loss:
                start = time.perf_counter()
                try:
                    return self._logps(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                                       compute_aux_loss, **multimodal)
                finally:
                    self._seconds = {**self._seconds,
                                     "reference": self._seconds["reference"] + time.perf_counter() - start}
            return self._logps(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                               compute_aux_loss, **multimodal)

        def _logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                   compute_aux_loss, **multimodal):
            positions = self._scoring_positions
            packed = positions is not None and positions.size(0) == input_ids.size(0)
            if any(v is not None for v in multimodal.values()):
                if packed:
                    raise ConfigError("packed step training takes text models only")
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                    compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
            attn = str(getattr(self.accelerator.unwrap_model(model).config, "_attn_implementation", "eager"))
            if packed and "flash" in attn:
                raise ConfigError(f"packed step training needs attn_implementation sdpa or eager, not {attn}")
            batch_size = batch_size or input_ids.size(0)
            logps, entropies, aux = [], [], []
            for start in range(0, input_ids.size(0), batch_size):
                end = min(start + batch_size, input_ids.size(0))
                ids, pad = input_ids[start:end], attention_mask[start:end]
                split = packed and self.packed_passes == "split" and not compute_aux_loss
                position_ids, mask = (packed_inputs(pad, positions[start:end], logits_to_keep, boolean=attn == "sdpa",
                                                    with_mask=not split)
                                      if packed else (None, pad))  # unpacked: TRL's own inputs
                labels = ids.masked_fill(pad == 0, -100)
                labels[:, :-logits_to_keep] = -100
                loss_mask = self._loss_mask if self._in_loss else None
                if loss_mask is not None and loss_mask.shape == (input_ids.size(0), logits_to_keep):
                    # What the loss leaves out (a packed row's later prompts, an injected <information>
                    # block) gets no label: the fused LM head (float32, the vocabulary wide) skips it, as it
                    # skips a prompt (`scored_positions_only`; its log-prob reads 0 and is multiplied by 0).
                    # The loss and its gradient are unchanged.
                    labels[:, -logits_to_keep:] = labels[:, -logits_to_keep:].masked_fill(
                        loss_mask[start:end] == 0, -100)
                extra = {"output_router_logits": True} if compute_aux_loss else {}
                if split:
                    row_logps, row_entropies = self._segment_passes(model, ids, pad, position_ids, labels,
                                                                    compute_entropy)
                    logps.append(row_logps[:, -logits_to_keep:])
                    if compute_entropy:
                        entropies.append(row_entropies[:, -logits_to_keep:])
                    continue
                with self.accelerator.autocast(), scored_positions_only(ids.device):
                    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, labels=labels,
                                fused_lm_head=True, **extra)
                logps.append(out.log_probs[:, -logits_to_keep:])
                if compute_entropy:
                    entropies.append(out.entropy[:, -logits_to_keep:])
                if compute_aux_loss:
                    aux.append(out.aux_loss)
            return (torch.cat(logps, dim=0), torch.cat(entropies, dim=0) if compute_entropy else None,
                    torch.stack(aux).mean() if compute_aux_loss else None)

        def _segment_passes(self, model, ids, pad, position_ids, labels, compute_entropy):
            """Per-token log-probs (and entropies) of packed rows, one forward per segment (a run of
            positions counting up from 0) under the plain causal mask: what the block-causal mask of
            `packed_inputs` computes, without the attention across segments that the mask throws away.
            A segment's first token has no context of its own: it reads 0 (it is a prompt token the
            loss leaves out). Padding reads 0."""
            logps = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
            entropies = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device) if compute_entropy else None
            for row in range(ids.size(0)):
                where = pad[row].nonzero().flatten()
                if where.numel() == 0:
                    continue
                starts = (position_ids[row, where] == 0).nonzero().flatten().tolist()
                bounds = sorted({0, *starts}) + [where.numel()]
                for a, b in zip(bounds, bounds[1:]):
                    span = where[a:b]
                    if not bool((labels[row, span[1:]] != -100).any()):
                        continue  # nothing scored in this segment
                    with self.accelerator.autocast(), scored_positions_only(ids.device):
                        out = model(input_ids=ids[row, span][None], position_ids=position_ids[row, span][None],
                                    labels=labels[row, span][None], fused_lm_head=True)
                    scored = (torch.full_like(span[1:], row), span[1:])  # the head's outputs are shifted by one
                    logps = logps.index_put(scored, out.log_probs[0].float())
                    if compute_entropy:
                        entropies = entropies.index_put(scored, out.entropy[0].float())
            return logps, entropies

    return StepPackedGRPOTrainer


# ------------------------------------------------------------------------------------ training
@dataclass(frozen=True)
class TrainReport:
    """What a training run left: its folder, the steps done, the last checkpoint (merged model
    folder, usable as `--llm hf:PATH`; None when a time budget paused the run, which then names the
    checkpoint it resumes from in `paused_at`) and the per-step log."""

    out: Path
    steps: int
    checkpoint: Path | None
    log: tuple[dict[str, Any], ...]
    paused_at: Path | None = None
    steps_planned: int | None = None

    def summary(self) -> str:
        lines = [f"trained {self.steps} step(s) into {self.out}"]
        if self.log:
            last = self.log[-1]
            parts = [f"{k}={last[k]:.4g}" for k in ("reward", "rewards/reward/mean", "rewards/outcome/mean",
                                                     "searches", "under_search_rate", "kl") if k in last]
            lines.append("last step: " + ", ".join(parts))
        if self.paused_at is not None:
            lines.append(f"time budget spent at step {self.steps} of {self.steps_planned}: the same command "
                         f"resumes from {self.paused_at}; with --steps {self.steps} it writes that checkpoint's "
                         "merged model (for --llm hf:PATH) without training")
        if self.checkpoint is not None:
            lines.append(f"checkpoint: {self.checkpoint}")
            lines.append(f"evaluate it: metarag eval --llm hf:{self.checkpoint} --method <agent> --dataset ...")
        return "\n".join(lines)


def _import_trl():
    try:
        import peft
        import trl
    except ModuleNotFoundError:
        raise MissingDependency("trl and peft", "train") from None
    return trl, peft


def train_agent(questions: Sequence[Question], retriever: Any, model: Any, tokenizer: Any, out_dir: str | Path,
                settings: AgentTrainSettings = AgentTrainSettings(), *, provenance: dict[str, Any] | None = None,
                reward_settings: Any = None, callbacks: Sequence[Any] = (),
                rollouts: AgentRollouts | None = None, judge_settings: Any = None) -> TrainReport:
    """GRPO-train `model` (a transformers causal LM, with `tokenizer`) as the agent `settings.method`
    on `questions`, retrieving from `retriever`. Checkpoints go to `out_dir/trainer/checkpoint-N`
    (TRL's: adapter or weights, optimizer, RNG; plus `merged/`, a full model folder, and the
    manifest); a run whose folder holds a checkpoint resumes from the last one. `provenance`
    (base model and data sha256 ...) goes into every manifest. `rollouts` replaces the rollout
    function built from the arguments (tests read its `last`). `judge_settings`: HiPRAG's process
    judges (`judges.process.ProcessJudgeSettings`), read by `--reward hiprag` only.

    Under `accelerate launch` each process rolls out its share of the step's groups (seeded by its
    rank) and the model is placed by accelerate (load it on the CPU); only the main process writes the
    settings, the log, the manifests and `merged/`, and the time budget is the main process's clock,
    broadcast at every step end."""
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    trl, peft = _import_trl()
    import torch
    from accelerate import PartialState
    from datasets import Dataset
    from transformers import TrainerCallback

    from metarag.train.rewards import RewardSettings

    if not questions:
        raise ConfigError("no training questions")
    on_gpu = torch.cuda.is_available()
    state = PartialState(cpu=not on_gpu)  # the launcher's processes (gloo on the CPU), as the trainer sees them
    main, processes = state.is_main_process, state.num_processes
    packed_passes = settings.resolved_packed_passes(on_gpu, processes)
    reward_settings = reward_settings if reward_settings is not None else RewardSettings()
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    lora = (not on_gpu) if settings.lora is None else settings.lora
    precision = settings.resolved_precision(on_gpu)
    weights_dtype, autocast = PRECISIONS[precision]
    model = model.to(getattr(torch, weights_dtype))
    manifest_base = {
        "method": settings.method, "reward": settings.reward,
        "settings": dataclasses.asdict(settings), "lora": lora, "precision": precision,
        "reward_settings": dataclasses.asdict(reward_settings),
        **({"judge_settings": dataclasses.asdict(judge_settings)} if judge_settings is not None else {}),
        **({"think_prefix": True} if settings.think_prefix else {}),
        # how advantages are scaled and where the probe reads: a run saved before they were settings had
        # "group" and "policy", so it resumes only with those
        "scale_rewards": settings.scale_rewards, "probe_weights": settings.probe_weights,
        "trl": trl.__version__, "peft": peft.__version__, "git_commit": _git_commit(),
        **(provenance or {}),
    }
    _check_resumable(out, manifest_base)
    if main:
        (out / "settings.json").write_text(json.dumps(manifest_base, indent=2, default=str) + "\n")

    base_sha = str((provenance or {}).get("base_model_sha256") or "")
    rollouts = rollouts if rollouts is not None else AgentRollouts(
        questions, retriever, settings, reward_settings, identity=f"train-agent:{base_sha[:16]}",
        judge_settings=judge_settings)
    batch = settings.group_size * settings.questions_per_step
    if batch % processes:
        raise ConfigError(f"{batch} rollouts per step (group_size x questions_per_step) do not split over "
                          f"{processes} processes")
    per_process = batch // processes
    if per_process % settings.train_batch_size:
        raise ConfigError(f"train_batch_size {settings.train_batch_size} does not divide the {per_process} "
                          "rollouts each process trains per step")
    micro_steps = per_process // settings.train_batch_size
    vllm = {}
    if settings.vllm != "off":
        vllm = dict(use_vllm=True, vllm_mode=settings.vllm, vllm_max_model_length=settings.n_ctx,
                    vllm_gpu_memory_utilization=settings.vllm_gpu_memory_utilization)
        if settings.vllm == "server":
            vllm["vllm_server_base_url"] = settings.vllm_server_url
    config = trl.GRPOConfig(
        output_dir=str(out / TRAINER_DIR), learning_rate=settings.learning_rate, beta=settings.kl_coef,
        num_generations=settings.group_size, per_device_train_batch_size=settings.train_batch_size,
        gradient_accumulation_steps=micro_steps, steps_per_generation=micro_steps, max_steps=settings.steps,
        lr_scheduler_type="constant", warmup_steps=0,
        temperature=settings.temperature, max_completion_length=settings.step_max_tokens,
        loss_type=settings.loss_type, scale_rewards=settings.scale_rewards, mask_truncated_completions=False,
        save_strategy="steps", save_steps=settings.save_every, save_total_limit=settings.keep_checkpoints or None,
        logging_steps=1, report_to="none",
        seed=settings.seed, data_seed=settings.seed, bf16=autocast, use_cpu=not on_gpu,
        gradient_checkpointing=settings.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False}, disable_dropout=True, remove_unused_columns=False,
        dataloader_num_workers=0, save_only_model=False, **vllm)
    funcs, weights = reward_columns()
    config.reward_weights = weights
    data = Dataset.from_list([{"prompt": key} for key in rollouts.by_prompt])
    peft_config = None
    if lora:
        peft_config = peft.LoraConfig(r=settings.lora_r, lora_alpha=settings.lora_alpha,
                                      lora_dropout=settings.lora_dropout, task_type="CAUSAL_LM",
                                      target_modules="all-linear")
    log: list[dict[str, Any]] = []
    log_path = out / LOG_FILE
    started = time.monotonic()
    budget_spent: list[int] = []

    class _Logs(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            # a resumed run reads its state, the save and logging intervals in it, from the checkpoint
            # after the arguments were applied: this run's `save_every` holds, not the saved run's
            state.compute_steps(args, state.max_steps)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "train_runtime" not in logs:
                record = {"step": state.global_step, **{k: v for k, v in logs.items()
                                                        if isinstance(v, (int, float))}}
                rss = release_freed_memory()  # once a step: the heap's free pages back to the system
                if rss is not None:
                    record["memory/rss_gb"] = round(rss, 2)
                log.append(record)
                if state.is_world_process_zero:
                    with log_path.open("a") as f:
                        f.write(json.dumps(record) + "\n")

        def on_step_end(self, args, state, control, **kw):
            if not settings.time_budget_s:
                return
            spent = [time.monotonic() - started >= settings.time_budget_s]
            if processes > 1:  # the main process's clock decides, for all: no process waits on another
                from accelerate.utils import broadcast_object_list

                broadcast_object_list(spent, from_process=0)
            if spent[0]:
                control.should_training_stop = True
                control.should_save = True
                budget_spent.append(state.global_step)

        def on_save(self, args, state, control, model=None, processing_class=None, **kw):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            last = state.global_step >= state.max_steps
            _save_checkpoint(folder, trainer, tokenizer, {**manifest_base, "steps": state.global_step},
                             merged=last or settings.merged_checkpoints == "every")

    if settings.attn_implementation and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(settings.attn_implementation)  # the rollouts ask for no attention weights
    if settings.vllm == "colocate":  # before TRL builds the engine from the model's folder
        from metarag.llm.vllm import check_colocated_model

        check_colocated_model(getattr(model, "name_or_path", None))
    rollouts.rollout_log = out / ROLLOUT_LOG
    trainer = step_packed_trainer(trl)(model=model, reward_funcs=funcs, args=config, train_dataset=data,
                                       processing_class=tokenizer, peft_config=peft_config, rollout_func=rollouts,
                                       callbacks=[_Logs(), *callbacks])
    check_sharding(trainer, settings, lora)
    if settings.vllm == "server":
        _check_vllm_server(trainer, settings.vllm_server_url, processes)
    trainer.packed_passes = packed_passes
    # under bf16 autocast in one CPU process, a row's passes use bf16 copies of the frozen weights made
    # once (autocast would cast them at every forward, and again when checkpointing recomputes one)
    trainer.cast_frozen = bool(autocast) and not on_gpu and processes == 1
    last = _last_checkpoint(out)
    if last is not None and _checkpoint_step(last) >= settings.steps:
        # a finished run: TRL's loop would take one more step before it looks at max_steps
        trainer._load_from_checkpoint(str(last))
        trainer.state.global_step = _checkpoint_step(last)
    else:
        trainer.train(resume_from_checkpoint=str(last) if last is not None else None)
    final = _last_checkpoint(out)
    done = int(trainer.state.global_step)
    paused = bool(budget_spent) and done < settings.steps
    if final is None or _checkpoint_step(final) != done:
        final = out / TRAINER_DIR / f"checkpoint-{done}"
        trainer.save_model(str(final))
        _save_checkpoint(final, trainer, tokenizer, {**manifest_base, "steps": done}, merged=not paused)
    elif not paused and not (final / MERGED).is_dir():  # a run resumed at its last step: its merged copy now
        _save_checkpoint(final, trainer, tokenizer, {**manifest_base, "steps": done})
    rollouts.trainer = trainer  # type: ignore[attr-defined]  # for tests and the caller's inspection
    return TrainReport(out, done, None if paused else final / MERGED, tuple(log),
                       paused_at=final if paused else None, steps_planned=settings.steps)


def _check_vllm_server(trainer: Any, url: str, processes: int) -> None:
    """Refuse a vLLM server whose log-probs are not the sampled distribution's (`llm.vllm.check_server_logprobs`):
    the main process asks it (TRL's client lives there) and every process raises the same error."""
    from metarag.llm.vllm import check_server_logprobs

    verdict: list[str | None] = [None]
    if trainer.accelerator.is_main_process:
        try:
            check_server_logprobs(trainer.vllm_generation.vllm_client.get_server_info(), url)
        except ConfigError as exc:
            verdict = [str(exc)]
        except Exception as exc:  # unreachable, or without the development endpoints TRL syncs weights through
            verdict = [f"cannot read the vLLM server's configuration at {url}: {str(exc).splitlines()[0][:200]}"]
    if processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(verdict, from_process=0)
    if verdict[0]:
        raise ConfigError(verdict[0])


def _save_checkpoint(folder: Path, trainer: Any, tokenizer: Any, manifest: dict[str, Any],
                     merged: bool = True) -> None:
    """Beside TRL's checkpoint files (a LoRA run's adapter among them, at the folder's top): `merged/`
    unless `merged` is false (the full model, adapter merged in, safetensors and the tokenizer: a
    folder `--llm hf:PATH` loads) and the manifest with the merged model's hash (None without one)
    and the adapter's folder. No second copy of the adapter in a sub-folder: transformers would load
    it on resume as one more adapter (`_load_from_checkpoint`).
    Every process takes part in gathering a sharded model's weights (ZeRO-3 / FSDP); the main
    process alone writes."""
    import copy

    from metarag.llm.hf import folder_sha256

    accelerator = trainer.accelerator
    inner = accelerator.unwrap_model(trainer.model)
    adapter = hasattr(inner, "merge_and_unload")
    # collective when sharded: every process (the flag is the same in all of them)
    state = None if adapter or not merged else accelerator.get_state_dict(trainer.model_wrapped)
    if not accelerator.is_main_process:
        accelerator.wait_for_everyone()
        return
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / MERGED
    if merged and adapter:
        full = copy.deepcopy(inner).merge_and_unload()
        _stop_tokens_from(tokenizer, full)
        full.save_pretrained(str(target), safe_serialization=True)
        del full
    elif merged:
        _stop_tokens_from(tokenizer, inner)
        inner.save_pretrained(str(target), state_dict=state, safe_serialization=True)
    if merged:
        tokenizer.save_pretrained(str(target))
    record = {**manifest, "merged": str(target) if merged else None,
              "merged_sha256": folder_sha256(target) if merged else None,
              "adapter": str(folder) if adapter and (folder / "adapter_config.json").exists() else None,
              "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (folder / MANIFEST).write_text(json.dumps(record, indent=2, default=str) + "\n")
    accelerator.wait_for_everyone()


def _stop_tokens_from(tokenizer: Any, model: Any) -> None:
    """Align a model's stop and padding ids with its tokenizer's, as Trainer.train() does before it
    trains, so that `merged/` is the same folder however it was written: a finished run re-run only
    to write its missing merged copy never calls train(). transformers' own `align_special_tokens`
    where it has one (it keeps every end-of-sequence id the config declares, as a list); older
    versions fill only the ids the generation config lacks."""
    if tokenizer is None or getattr(model, "generation_config", None) is None:
        return
    try:
        from transformers.trainer_utils import align_special_tokens
    except ImportError:  # an older transformers
        for key in ("eos_token_id", "pad_token_id"):
            if getattr(model.generation_config, key, None) is None and getattr(tokenizer, key, None) is not None:
                setattr(model.generation_config, key, int(getattr(tokenizer, key)))
        return
    align_special_tokens(model, tokenizer)


def _checkpoint_step(folder: Path) -> int:
    return int(folder.name.rsplit("-", 1)[1])


def _last_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint (TRL's files and our manifest) under out/trainer."""
    root = out / TRAINER_DIR
    if not root.is_dir():
        return None
    done = [p for p in root.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()
            and (p / MANIFEST).exists() and (p / "trainer_state.json").exists()]
    return max(done, key=_checkpoint_step) if done else None


_RESUME_KEYS = ("method", "reward", "reward_settings", "judge_settings", "base_model_sha256", "data_sha256", "lora",
                "think_prefix", "scale_rewards", "probe_weights")
# what a run saved before a key was recorded had (`_check_resumable`)
_RESUME_BEFORE = {"scale_rewards": "group", "probe_weights": "policy"}


def _settings_defaults(key: str) -> dict[str, Any]:
    """The defaults of the settings class a manifest's `key` records (reward or HiPRAG judge settings)."""
    from metarag.judges.process import ProcessJudgeSettings
    from metarag.train.rewards import RewardSettings

    cls = {"reward_settings": RewardSettings, "judge_settings": ProcessJudgeSettings}.get(key)
    return dataclasses.asdict(cls()) if cls is not None else {}


def _check_resumable(out: Path, manifest: dict[str, Any]) -> None:
    """A folder holding a run with another model, data or reward is refused, not silently resumed."""
    last = _last_checkpoint(out)
    if last is None:
        return
    old = json.loads((last / MANIFEST).read_text())
    for key in _RESUME_KEYS:
        before, now = old.get(key, _RESUME_BEFORE.get(key)), manifest.get(key)
        if isinstance(before, dict) and isinstance(now, dict):
            # a setting added since the run was saved, at its default, is what the run had
            defaults = _settings_defaults(key)
            before = {**{k: v for k, v in now.items() if k not in before and k in defaults and defaults[k] == v},
                      **before}
        if (key in manifest or key in old) and json.dumps(before, default=str, sort_keys=True) != json.dumps(
                now, default=str, sort_keys=True):
            raise ConfigError(f"{out} holds a training run with another {key} ({old.get(key)!r}, now "
                              f"{manifest.get(key)!r}): give a new --out, or the same settings to resume")


def _git_commit() -> str | None:
    from metarag.evaluate.harness import _git_commit as commit

    return commit()


# ----------------------------------------------------------------------------------- the command
# ------------------------------------------------------------------------------- signal before training
SIGNAL_FILE = "signal.jsonl"


def signal_fraction(groups: Sequence[Sequence[float | None]]) -> float:
    """The share of GRPO groups that give a gradient: whose scored rewards are not all equal (a group
    with fewer than two scored rollouts gives none). NaN for no groups."""
    if not groups:
        return math.nan
    live = 0
    for group in groups:
        scored = [r for r in group if r is not None]
        live += len(scored) >= 2 and max(scored) - min(scored) > 1e-12
    return live / len(groups)


@dataclass(frozen=True)
class SignalReport:
    """What the untrained model's rollouts say about a training set: per question its G total and
    outcome rewards, and the shares of groups whose rewards differ."""

    questions: int
    total_fraction: float
    outcome_fraction: float
    mean_outcome: float
    path: Path

    def summary(self) -> str:
        return (f"{self.questions} groups: total reward differs in {self.total_fraction:.1%}, the outcome (EM) in "
                f"{self.outcome_fraction:.1%}; mean EM {self.mean_outcome:.3f} ({self.path})")


@dataclass(frozen=True)
class SampleSignal:
    """The outcome signal a sampled evaluation predicts (`sample_signal`): `groups` questions with G
    answers each (`incomplete` had fewer), the share whose EM differs inside the group, the mean EM,
    and what the rollouts did: invalid steps per rollout, the first step's actions (shares), and the
    share of answers that repeat the prompt's example answer."""

    groups: int
    incomplete: int
    outcome_fraction: float
    mean_outcome: float
    invalid_per_rollout: float
    first_actions: dict[str, float]
    example_answers: float


def sample_signal(run_dir: str | Path, group: int = 5, example_answer: str = "Lisbon") -> SampleSignal:
    """`--measure-signal`'s outcome measure from a run folder of `metarag eval --samples K` (K >= G):
    each question's first `group` sampled answers are a GRPO group, through whatever back-end ran
    them (llama.cpp runs the same weights as `hf` far faster). A run without a complete group is a
    DataError naming the folder."""
    from collections import Counter

    from metarag.evaluate.runs import RunStore
    from metarag.metrics import normalize_answer
    from metarag.policy.agent_trace import agent_steps

    store = RunStore(run_dir)
    if not store.exists():
        raise DataError("no run folder here (settings.json missing)", path=str(run_dir))
    groups: dict[str, list[Any]] = {}
    for (qid, i), result in sorted(store.load_samples().items()):
        if i < group:
            groups.setdefault(qid, []).append(result)
    full = [rs for rs in groups.values() if len(rs) == group]
    if not full:
        raise DataError(f"no question has {group} sampled answers (eval --samples {group} or more)", path=str(run_dir))
    rollouts = [r for rs in full for r in rs]
    steps = [agent_steps(r.trace) for r in rollouts]
    first = Counter(s[0].action for s in steps if s)
    return SampleSignal(
        groups=len(full), incomplete=len(groups) - len(full),
        outcome_fraction=signal_fraction([[r.scores.em for r in rs] for rs in full]),
        mean_outcome=sum(r.scores.em for r in rollouts) / len(rollouts),
        invalid_per_rollout=sum(sum(x.action == "invalid" for x in s) for s in steps) / len(rollouts),
        first_actions={a: n / len(rollouts) for a, n in first.most_common()},
        example_answers=sum(normalize_answer(r.prediction) == normalize_answer(example_answer)
                            for r in rollouts) / len(rollouts))


def measure_signal(questions: Sequence[Question], retriever: Any, model: Any, tokenizer: Any, out_dir: str | Path,
                   settings: AgentTrainSettings, limit: int, reward_settings: Any = None) -> SignalReport:
    """Roll out G per question (the first `limit` questions) with `model` as a training step would,
    and measure the share of groups with a gradient. One line per question in OUT/signal.jsonl
    (each rollout's reward parts, answer and actions), written as each finishes: a re-run measures
    only the questions not yet there."""
    from metarag.policy.agent_trace import agent_steps

    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    path = out / SIGNAL_FILE
    done = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                record = json.loads(line)
                done[record["key"]] = record
    rollouts = AgentRollouts(questions, retriever, settings, reward_settings, identity="train-agent:signal")
    keys = list(rollouts.by_prompt)[:limit]
    for i, key in enumerate(keys):
        if key in done:
            continue
        result = rollouts.run([key] * settings.group_size, model, tokenizer, step=i)
        rewards = result["rollout_reward"]
        record = {"key": key, "question_id": rollouts.by_prompt[key].id,
                  "total": [None if r is None else r.total for r in rewards],
                  "outcome": [None if r is None else r.outcome for r in rewards],
                  "searches": [None if r is None else r.searches for r in rewards],
                  # what each rollout answered and did, against the gold: why a group has no signal
                  "answers": [t.answer for t in rollouts.last["traces"]],
                  "actions": [[s.action for s in agent_steps(t)] for t in rollouts.last["traces"]],
                  "gold": list(rollouts.by_prompt[key].answers),
                  "seconds": result["rollout_seconds"]}
        with path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        done[key] = record
    records = [done[k] for k in keys]
    outcomes = [o for r in records for o in r["outcome"] if o is not None]
    return SignalReport(len(records), signal_fraction([r["total"] for r in records]),
                        signal_fraction([r["outcome"] for r in records]),
                        sum(outcomes) / len(outcomes) if outcomes else math.nan, path)


# ------------------------------------------------------------------------------------- loading
def fsdp2_launch() -> bool:
    """Whether this process was started by `accelerate launch` under FSDP2 (the environment its launcher
    writes from the configuration, e.g. configs/accelerate/8gpu-fsdp.yaml)."""
    env = os.environ
    return env.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and env.get("FSDP_VERSION", "1") == "2"


def rank0_loading() -> bool:
    """Whether only the main process needs the weights: FSDP2 with `cpu_ram_efficient_loading`, where
    accelerate shards the model on the meta device and sends the main process's weights into the shards
    (`accelerate.utils.fsdp_utils.fsdp2_prepare_model`)."""
    return fsdp2_launch() and os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING", "false").lower() == "true"


def load_base(hf_settings: Any, state: Any, training: bool = True) -> tuple[Any, Any, str, str | None]:
    """The base model to train, its tokenizer, identity and weights sha256, loaded once the process group
    exists (`state`, accelerate's `PartialState`): for `training` under FSDP2's rank-0 loading
    (`rank0_loading`) only the main process reads the weights, every other holds the architecture on the
    meta device (`llm.hf.meta_model`) and is sent the identity; otherwise (one process, DDP, where every
    process needs the whole model, or rollouts without a trainer) each process loads it."""
    from metarag.llm.hf import HFLLM, meta_model

    if training and state.num_processes > 1 and not state.is_main_process and rank0_loading():
        model, tokenizer = meta_model(hf_settings)
        identity, sha = None, None
    else:
        base = HFLLM(hf_settings)
        model, tokenizer, identity, sha = trainable(base.model), base.tokenizer, base.identity, base.model_sha256
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        names = [identity, sha]
        broadcast_object_list(names, from_process=0)
        identity, sha = names
    return model, tokenizer, str(identity), sha


def meta_reference(model: Any) -> Any:
    """The policy's architecture with its parameters on the meta device (its non-persistent buffers, the
    rotary frequencies, computed: FSDP2 sends only the state dict), in its dtype and attention: the KL
    reference model TRL shards under FSDP2 before the main process's starting weights are sent into it
    (`StepPackedGRPOTrainer`), instead of a full copy in every process's host memory."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        reference = AutoModelForCausalLM.from_config(model.config, dtype=model.dtype,
                                                     attn_implementation=model.config._attn_implementation)
    reference.tie_weights()  # as the policy's: the same parameter names
    return reference


def run_training(dataset_spec: Any, llm_spec: Any, out_dir: str | Path, settings: AgentTrainSettings, *,
                 retriever: str = "bm25", allow_any: bool = False, dry_run: bool = False,
                 reward_settings: Any = None, judge_settings: Any = None,
                 signal_questions: int | None = None) -> TrainReport | SignalReport | str:
    """`metarag train-agent`: load the training questions with their corpus (any file or preset the
    harness reads; evaluation splits refused unless `allow_any`), the base model through the
    transformers back-end (`hf`, `hf-0.5b`, `hf:PATH`), then `train_agent`. `dry_run`: check all of
    it and return the plan (device, precision, LoRA, batch, folders) without loading the model.
    `signal_questions` N: instead of training, `measure_signal` on the first N questions."""
    from metarag.evaluate.harness import load_questions
    from metarag.llm.registry import BACKENDS, backend_settings, check_spec
    from metarag.pipeline import open_retriever

    check_spec(llm_spec)
    if BACKENDS[llm_spec.backend].cls != "HFLLM":
        raise ConfigError(f"train-agent trains a transformers model: --llm hf, hf-0.5b or hf:PATH, not "
                          f"{llm_spec.label()}")
    _import_trl()
    dataset = load_questions(dataset_spec)
    check_training_split(dataset.name, dataset.path, allow_any, dataset.questions)
    if not dataset.passages:
        raise ConfigError(f"{dataset.name} has no passages to retrieve from: give it a corpus")
    import torch

    # loaded on the CPU in the precision's weight dtype; the trainer (accelerate) places it on each
    # process's own device (every process loading onto cuda:0 would not)
    weights_dtype, _ = PRECISIONS[settings.resolved_precision(torch.cuda.is_available())]
    hf_settings = dataclasses.replace(backend_settings(llm_spec), n_ctx=settings.n_ctx, device="cpu",
                                      dtype=weights_dtype)
    if settings.vllm == "colocate":  # before any weights load
        from metarag.llm.vllm import check_colocated_model

        check_colocated_model(hf_settings.path, what=f"--llm {llm_spec.label()}")
    if dry_run:
        if hf_settings.path and not Path(hf_settings.path).expanduser().exists():
            raise DataError("model file or folder not found", path=hf_settings.path)
        return training_plan(settings, llm_spec.label(), dataset, out_dir)
    from accelerate import PartialState

    # the launcher's process group before any weights load: which process reads them depends on it (load_base)
    model, tokenizer, identity, sha = load_base(hf_settings, PartialState(cpu=not torch.cuda.is_available()),
                                                training=not signal_questions)
    provenance = {"base_model": identity, "base_model_sha256": sha,
                  "data": {"name": dataset.name, "path": dataset.path, "questions": len(dataset.questions),
                           "limit": dataset_spec.limit, "sample_seed": dataset_spec.seed},
                  "data_sha256": dataset.sha256, "retriever": retriever}
    search = open_retriever(dataset.passages, retriever)
    if signal_questions:  # measure the training set's signal with the untrained model, and stop
        return measure_signal(dataset.questions, search, model, tokenizer, out_dir, settings, signal_questions,
                              reward_settings)
    return train_agent(dataset.questions, search, model, tokenizer, out_dir, settings,
                       provenance=provenance, reward_settings=reward_settings, judge_settings=judge_settings)


def training_plan(settings: AgentTrainSettings, model: str, dataset: Any, out_dir: str | Path) -> str:
    """What a run would do on this machine, in a few lines (`--dry-run`)."""
    import torch

    gpu = torch.cuda.is_available()
    lora = (not gpu) if settings.lora is None else settings.lora
    precision = settings.resolved_precision(gpu)
    out = Path(out_dir).expanduser()
    last = _last_checkpoint(out)
    return "\n".join([
        f"model: {model} on {'cuda' if gpu else 'cpu'} ({precision}), rollouts on "
        f"{'vLLM (' + settings.vllm + ')' if settings.vllm != 'off' else 'transformers'}, "
        + (f"LoRA r={settings.lora_r}" if lora else "full fine-tuning"),
        f"agent: {settings.method}, reward: {settings.reward}, {settings.max_turns} turns, top-{settings.top_k}, "
        f"{settings.step_max_tokens} tokens per step, context {settings.n_ctx}",
        f"GRPO: G={settings.group_size} x {settings.questions_per_step} question(s) per step = "
        f"{settings.group_size * settings.questions_per_step} rollouts, lr {settings.learning_rate:g}, "
        f"KL {settings.kl_coef:g}, loss {settings.loss_type}, {settings.steps} steps"
        + (f", at most {settings.time_budget_s:g} s" if settings.time_budget_s else ""),
        f"data: {dataset.name} ({len(dataset.questions)} questions, {len(dataset.passages)} passages, "
        f"sha256 {dataset.sha256[:16]})",
        f"out: {out / TRAINER_DIR}/checkpoint-N every {settings.save_every} steps"
        + (f"; resumes from {last.name}" if last is not None else ""),
    ])


def trainable(model: Any) -> Any:
    """The model with transformers' GGUF marker removed: an embedded GGUF read through transformers is
    dequantized to float on load, but stays flagged as quantized, which the Trainer refuses to train
    and `save_pretrained` would record. Any other quantization is left as it is (and refused there)."""
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if quantizer is not None and str(getattr(method, "value", method)).lower() == "gguf":
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    return model


# ---------------------------------------------------------------------------------------- plot
SMOOTH_STEPS = 10
CURVES = (("accuracy (EM)", ("rewards/outcome/mean",)),
          ("reward", ("rewards/reward/mean", "rewards/consistency/mean")),
          ("per rollout", ("searches", "invalid_actions")),
          ("belief-action gap", ("under_search_rate", "over_search_rate")))


def read_log(out_dir: str | Path) -> list[dict[str, Any]]:
    """The per-step records of a training run (one JSON object a line), the last record of a step
    winning (a resumed run re-logs nothing before its checkpoint). `out_dir` is the run's folder, or
    a copy of its log file itself (docs/training-runs/*-log.jsonl)."""
    path = Path(out_dir).expanduser()
    path = path if path.suffix == ".jsonl" and not path.is_dir() else path / LOG_FILE
    if not path.exists():
        raise DataError("no training log (log.jsonl) in the folder: train first", path=str(path))
    by_step: dict[int, dict[str, Any]] = {}
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise DataError(f"line {n} is not JSON", path=str(path)) from None
        by_step[int(record.get("step", 0))] = record
    return [by_step[s] for s in sorted(by_step)]


def read_rollouts(run: str | Path) -> dict[int, dict[str, list[float | None]]]:
    """Each step's rollout outcomes by question (EM of each rollout's answer, None for a failed one),
    from a run's rollout log: RUN/rollouts.jsonl, or X-rollouts.jsonl beside a log copy X-log.jsonl;
    {} where there is none. A step that a resumed run took again keeps its last block of records, as
    `read_log` keeps a step's last record (a block starts again where the step number comes back, or
    where a rollout seed repeats: seeds follow from the run's seed, the step and the rollout's place)."""
    path = Path(run).expanduser()
    path = path.with_name(path.name.removesuffix("-log.jsonl") + "-rollouts.jsonl") if path.suffix == ".jsonl" \
        else path / "rollouts.jsonl"
    if not path.is_file():
        return {}
    steps: dict[int, dict[str, list[float | None]]] = {}
    seeds: dict[int, set] = {}
    previous = None
    for n, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            step, seed, question = int(record["step"]), record.get("seed"), str(record["question_id"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            raise DataError(f"line {n} is not a rollout record (JSON with step and question_id)",
                            path=str(path)) from None
        if (step != previous and step in steps) or (seed is not None and seed in seeds.get(step, ())):
            steps[step], seeds[step] = {}, set()
        previous = step
        seeds.setdefault(step, set()).add(seed)
        outcome = record.get("outcome")
        steps.setdefault(step, {}).setdefault(question, []).append(
            float(outcome) if isinstance(outcome, (int, float)) else None)
    return steps


def training_order(questions: int, seed: int, per_step: int, steps: int) -> list[tuple[int, ...]]:
    """The training questions (indices into the training set) each step draws, as TRL's GRPO sampler
    (`RepeatSampler`) draws them: a generator seeded with the run's seed, one `torch.randperm` an
    epoch, cut into steps of `per_step` questions, an epoch's last incomplete step left out (with 17
    questions and 4 a step, 16 are trained each epoch and a different one waits). A resumed run skips
    the steps already done and draws the same order. Needs torch."""
    import torch

    if per_step < 1 or questions < per_step:
        raise ConfigError(f"{questions} training questions cannot fill a step of {per_step}")
    generator = torch.Generator()
    generator.manual_seed(seed)
    order: list[tuple[int, ...]] = []
    while len(order) < steps:
        epoch = torch.randperm(questions, generator=generator).tolist()
        order += [tuple(epoch[i:i + per_step]) for i in range(0, questions - per_step + 1, per_step)]
    return order[:steps]


def reward_trend(records: Sequence[dict[str, Any]], window: int = 20, key: str = "rewards/reward/mean",
                 seed: int = 0) -> Any:
    """mean of the last `window` steps' `key` − mean of the first `window`'s, with a 95 % bootstrap
    interval (`evaluate.stats.mean_shift`): whether a run's reward rose. Needs 2 × window steps."""
    from metarag.evaluate.stats import mean_shift

    values = [r[key] for r in records if isinstance(r.get(key), (int, float)) and not math.isnan(r[key])]
    if len(values) < 2 * window:
        raise DataError(f"{len(values)} logged steps of {key}: the trend needs at least {2 * window}")
    return mean_shift(values[:window], values[-window:], seed=seed)


@dataclass(frozen=True)
class Curve:
    """One line of a panel of `plot_curves`: the run it comes from (None when one run is drawn), the
    logged measure, its points (step, value) and, past 2 x SMOOTH_STEPS points, the mean of each
    point's last SMOOTH_STEPS (one question a step makes the raw points jump)."""

    panel: str
    run: str | None
    key: str
    points: tuple[tuple[int, float], ...]
    smooth: tuple[tuple[int, float], ...] = ()

    @property
    def label(self) -> str:
        name = self.key.removeprefix("rewards/").removesuffix("/mean")
        return name if self.run is None else f"{self.run}: {name}"


def run_label(run: str | Path) -> str:
    """A run's name in tables and legends: its folder's name, or X for a log copy X-log.jsonl."""
    path = Path(run).expanduser()
    return path.stem.removesuffix("-log") if path.suffix == ".jsonl" else path.name


def run_labels(runs: Sequence[str | Path]) -> list[str]:
    """The runs' names for one table or figure: each `run_label`, with as many parent folders in
    front as it takes for every name to differ (two runs' `trainer` folders, `a/run` and `b/run`),
    and "#N" after a run given twice."""
    paths = [Path(run).expanduser() for run in runs]
    labels = [run_label(p) for p in paths]
    depth = 0
    while len(set(labels)) < len(labels) and depth < max((len(p.parts) for p in paths), default=0):
        depth += 1
        clashing = {x for x in labels if labels.count(x) > 1}
        labels = ["/".join([*p.parent.parts[len(p.parent.parts) - depth:], run_label(p)]) if x in clashing else x
                  for p, x in zip(paths, labels)]
    return [x if labels.count(x) == 1 else f"{x} #{labels[:i].count(x) + 1}" for i, x in enumerate(labels)]


def training_curves(runs: Sequence[str | Path]) -> list[Curve]:
    """The lines of the paper's Figure 3 panels (`CURVES`) for each run, read from its log: what
    `plot_curves` draws, in the order it draws them (panel, then run, then measure). Runs are named
    only when there are several."""
    names = [None] if len(runs) == 1 else run_labels(runs)
    logs = [(name, read_log(run)) for name, run in zip(names, runs)]
    curves = []
    for title, keys in CURVES:
        for name, records in logs:
            for key in keys:
                points = tuple((int(r["step"]), float(r[key])) for r in records
                               if isinstance(r.get(key), (int, float)) and not math.isnan(r[key]))
                if not points:
                    continue
                values = [v for _, v in points]
                smooth = tuple((points[i][0], sum(values[i + 1 - SMOOTH_STEPS:i + 1]) / SMOOTH_STEPS)
                               for i in range(SMOOTH_STEPS - 1, len(values))) \
                    if len(points) >= 2 * SMOOTH_STEPS else ()
                curves.append(Curve(title, name, key, points, smooth))
    return curves


def plot_curves(runs: str | Path | Sequence[str | Path], file: str | Path | None = None) -> Path:
    """The training curves of the paper's Figure 3 (accuracy, rewards, searches, under-search rate)
    per step, from each run's log, as a PNG (`training_curves` gives the lines). One run: its folder
    (by default `RUN/curves.png`) or a log copy X-log.jsonl (by default X-curves.png beside it).
    Several (a list; `file` then required): every panel overlays them, a colour a run and a line
    style a measure, each drawn as its 10-step mean where it has one (the raw points faint): a run
    beside its retry or its ablation."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ModuleNotFoundError:
        raise MissingDependency("matplotlib", "eval") from None
    several = not isinstance(runs, (str, Path))
    runs = list(runs) if several else [runs]
    if not runs:
        raise ConfigError("plot_curves needs a training run")
    if several and len(runs) > 1 and file is None:
        raise ConfigError("several runs make one figure: give the PNG file to write")
    curves = training_curves(runs)
    first = Path(runs[0]).expanduser()
    target = Path(file) if file is not None else \
        first.with_name(f"{run_label(first)}-{CURVES_FILE}") if first.suffix == ".jsonl" else first / CURVES_FILE
    colours = {name: f"C{i}" for i, name in enumerate(run_labels(runs))}
    styles = ("-", "--")
    fig, axes = plt.subplots(1, len(CURVES), figsize=(4 * len(CURVES), 3.2))
    for ax, (title, keys) in zip(axes, CURVES):
        for curve in (c for c in curves if c.panel == title):
            if curve.run is None:  # one run: a colour a measure, its points and their 10-step mean
                line, = ax.plot(*zip(*curve.points), marker="o", markersize=3, linewidth=0.6, alpha=0.45,
                                label=curve.label)
                if curve.smooth:
                    ax.plot(*zip(*curve.smooth), color=line.get_color(), linewidth=2,
                            label=f"{curve.label}, mean of {SMOOTH_STEPS}")
                continue
            colour, style = colours[curve.run], styles[keys.index(curve.key) % len(styles)]
            ax.plot(*zip(*curve.points), color=colour, marker="o", markersize=2, linewidth=0,
                    alpha=0.25 if curve.smooth else 0.6)
            drawn = curve.smooth or curve.points
            ax.plot(*zip(*drawn), color=colour, linestyle=style, linewidth=1.8 if curve.smooth else 0.8,
                    label=curve.label + (f", mean of {SMOOTH_STEPS}" if curve.smooth else ""))
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(target, dpi=110)
    plt.close(fig)
    return target
