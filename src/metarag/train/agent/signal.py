"""Before training: whether a training set gives GRPO a gradient, i.e. the share of groups whose rewards
differ, from the untrained model's rollouts (`measure_signal`, `train-agent --measure-signal`) or from
a sampled evaluation's run folder (`sample_signal`)."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metarag.errors import DataError
from metarag.records import Question
from metarag.train.agent.rollouts import AgentRollouts
from metarag.train.agent.settings import AgentTrainSettings

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
