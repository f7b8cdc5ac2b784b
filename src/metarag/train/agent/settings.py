"""What a `metarag train-agent` run is set to (the package's first floor): the agents it trains,
`AgentTrainSettings` with the paper's defaults, the named recipes, the precisions, the refusal to train
on an evaluation split, and the names of the files a run folder holds."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from metarag.errors import ConfigError, close_matches
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
