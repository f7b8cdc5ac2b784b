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

The rooms, each importing only the ones above it: `settings.py` (what a run is set to, the recipes),
`layout.py` (a trace laid out as a training row), `model.py` (the policy loaded, gathered whole for
rollouts, its frozen weights cast once), `rollouts.py` (TRL's `rollout_func` and the reward columns),
`signal.py` (whether a training set gives a gradient), `packed.py` (the step-packed trainer and its
sampler), `checkpoints.py` (written, found, checked before a resume) and `training.py` (`train_agent`
and the `train-agent` command). A run's log is read and drawn by `metarag.evaluate.training_curves`,
whose names are re-exported here with the rooms' public ones.
"""
from metarag.evaluate.training_curves import (
    CURVES,
    CURVES_FILE,
    LOG_FILE,
    ROLLOUT_LOG,
    SMOOTH_STEPS,
    Curve,
    plot_curves,
    read_log,
    read_rollouts,
    reward_trend,
    run_label,
    run_labels,
    training_curves,
)
from metarag.train.agent.layout import (
    FRESH_PROMPT,
    LAYOUTS,
    POSITIONS_FIELD,
    TEXT_CONTINUED,
    TOKEN_EXACT,
    RolloutSample,
    rollout_sample,
    step_generations,
    step_prompt_ids,
    step_token_ids,
)
from metarag.train.agent.model import (
    check_sharding,
    frozen_linears_as,
    fsdp2_launch,
    fsdp2_unsharded,
    load_base,
    meta_reference,
    rank0_loading,
    trainable,
    whole_for_rollouts,
)
from metarag.train.agent.packed import (
    epoch_sampler,
    packed_inputs,
    scored_positions_only,
    step_packed_trainer,
    training_order,
)
from metarag.train.agent.rollouts import (
    AgentRollouts,
    FrozenProbes,
    cut_share,
    frozen_probes,
    prompt_tokens,
    reward_columns,
    rollout_seconds,
    rollout_seed,
    training_prompts,
)
from metarag.train.agent.settings import (
    AGENT_METHODS,
    MANIFEST,
    MERGED,
    PRECISIONS,
    RECIPES,
    TRAINER_DIR,
    AgentTrainSettings,
    check_training_split,
    recipe_settings,
    training_settings,
)
from metarag.train.agent.signal import (
    SIGNAL_FILE,
    SampleSignal,
    SignalReport,
    measure_signal,
    sample_signal,
    signal_fraction,
)
from metarag.train.agent.training import (
    TrainReport,
    release_freed_memory,
    run_training,
    train_agent,
    training_plan,
)

__all__ = [
    "AGENT_METHODS",
    "AgentRollouts",
    "AgentTrainSettings",
    "CURVES",
    "CURVES_FILE",
    "Curve",
    "FRESH_PROMPT",
    "FrozenProbes",
    "LAYOUTS",
    "LOG_FILE",
    "MANIFEST",
    "MERGED",
    "POSITIONS_FIELD",
    "PRECISIONS",
    "RECIPES",
    "ROLLOUT_LOG",
    "RolloutSample",
    "SIGNAL_FILE",
    "SMOOTH_STEPS",
    "SampleSignal",
    "SignalReport",
    "TEXT_CONTINUED",
    "TOKEN_EXACT",
    "TRAINER_DIR",
    "TrainReport",
    "check_sharding",
    "check_training_split",
    "cut_share",
    "epoch_sampler",
    "frozen_linears_as",
    "frozen_probes",
    "fsdp2_launch",
    "fsdp2_unsharded",
    "load_base",
    "measure_signal",
    "meta_reference",
    "packed_inputs",
    "plot_curves",
    "prompt_tokens",
    "rank0_loading",
    "read_log",
    "read_rollouts",
    "recipe_settings",
    "release_freed_memory",
    "reward_columns",
    "reward_trend",
    "rollout_sample",
    "rollout_seconds",
    "rollout_seed",
    "run_label",
    "run_labels",
    "run_training",
    "sample_signal",
    "scored_positions_only",
    "signal_fraction",
    "step_generations",
    "step_packed_trainer",
    "step_prompt_ids",
    "step_token_ids",
    "train_agent",
    "trainable",
    "training_curves",
    "training_order",
    "training_plan",
    "training_prompts",
    "training_settings",
    "whole_for_rollouts",
]
