"""Reading a training run (the folder `metarag train-agent` writes): its per-step log and rollout log,
the reward's trend, and the paper's Figure 3 curves drawn from them (`train-agent --plot`). The trainer
(`metarag.train.agent`) writes these files by the names given here."""
from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metarag.errors import ConfigError, DataError, MissingDependency

LOG_FILE = "log.jsonl"
ROLLOUT_LOG = "rollouts.jsonl"  # every rollout of every step: its question, answer, reward and actions
CURVES_FILE = "curves.png"


SMOOTH_STEPS = 10
FLIPS = "consistency_flips"  # computed from the rollout log, not logged: `flip_shares`
CURVES = (("accuracy (EM)", ("rewards/outcome/mean",)),
          ("reward", ("rewards/reward/mean", "rewards/consistency/mean")),
          ("per rollout", ("searches", "invalid_actions")),
          ("belief-action gap", ("under_search_rate", "over_search_rate")),
          ("consistency's sign flips (% of advantages)", (FLIPS,)))


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


def read_rollout_records(run: str | Path) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """Each step's rollout records by question (the rollout log's lines: answer, reward, outcome,
    consistency, penalty ...), from a run's rollout log: RUN/rollouts.jsonl, or X-rollouts.jsonl beside
    a log copy X-log.jsonl; {} where there is none. A step that a resumed run took again keeps its last
    block of records, as `read_log` keeps a step's last record (a block starts again where the step
    number comes back, or where a rollout seed repeats: seeds follow from the run's seed, the step and
    the rollout's place)."""
    path = Path(run).expanduser()
    path = path.with_name(path.name.removesuffix("-log.jsonl") + "-rollouts.jsonl") if path.suffix == ".jsonl" \
        else path / ROLLOUT_LOG
    if not path.is_file():
        return {}
    steps: dict[int, dict[str, list[dict[str, Any]]]] = {}
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
        steps.setdefault(step, {}).setdefault(question, []).append(record)
    return steps


def read_rollouts(run: str | Path) -> dict[int, dict[str, list[float | None]]]:
    """Each step's rollout outcomes by question (EM of each rollout's answer, None for a failed one),
    as `read_rollout_records` reads the log."""
    return {step: {q: [float(r["outcome"]) if isinstance(r.get("outcome"), (int, float)) else None for r in rs]
                   for q, rs in groups.items()}
            for step, groups in read_rollout_records(run).items()}


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


def group_advantages(rewards: Sequence[float], group_size: int, scale: str = "none") -> list[float]:
    """GRPO's advantages of one step's rewards, in groups of `group_size` consecutive rollouts, as TRL
    1.16 forms them (`GRPOTrainer._generate_and_score_completions`, "sum_then_normalize"): reward minus
    its group's mean, divided by the group's ("group") or the whole step's ("batch") unbiased standard
    deviation + 1e-4, or not divided ("none"). For reading a run's logged rewards (how many advantages
    a reward term flips); the trainer's own come from TRL."""
    import numpy as np

    r = np.asarray(rewards, dtype=float)
    if group_size < 1 or r.size % group_size:
        raise ValueError(f"{r.size} rewards do not split into groups of {group_size}")
    groups = r.reshape(-1, group_size)
    centred = (groups - groups.mean(axis=1, keepdims=True)).ravel()
    if scale == "none":
        return centred.tolist()
    if scale == "group":
        std = np.repeat(groups.std(axis=1, ddof=1) if group_size > 1 else np.zeros(len(groups)), group_size)
    elif scale == "batch":
        std = np.full(r.size, r.std(ddof=1) if r.size > 1 else 0.0)
    else:
        raise ConfigError(f"unknown reward scaling {scale!r}; valid: none, batch, group")
    return (centred / (std + 1e-4)).tolist()


@dataclass(frozen=True)
class Flips:
    """What a reward term did to GRPO's advantages over a run's groups: of `advantages` rollouts'
    advantages, `flipped` changed sign with the term (with it against without it), and `mean_change`
    the mean |A_with − A_without|."""

    groups: int
    advantages: int
    flipped: int
    mean_change: float


def term_flips(groups: Sequence[tuple[Sequence[float], Sequence[float]]], scale: str = "none") -> Flips:
    """`Flips` of a reward term over `groups`, each (rewards with the term, rewards without it) of one
    group's scored rollouts, advantages as `group_advantages` forms them (groups of one rollout are
    left out: no advantage). A sign counts as changed when one advantage is positive and the other is
    not, or the reverse."""
    import numpy as np

    flipped = total = used = 0
    change = 0.0
    for with_term, without in groups:
        if len(with_term) != len(without):
            raise ValueError("a group's rewards with and without the term must pair up")
        if len(with_term) < 2:
            continue
        used += 1
        a = np.asarray(group_advantages(with_term, len(with_term), scale))
        b = np.asarray(group_advantages(without, len(without), scale))
        flipped += int(np.sum((a > 1e-12) != (b > 1e-12)))
        total += a.size
        change += float(np.abs(a - b).sum())
    return Flips(used, total, flipped, change / total if total else 0.0)


def run_scale(run: str | Path, given: str | None = None) -> str:
    """How a run scaled its advantages: `given`, else its settings.json's `scale_rewards`, else "group"
    (runs saved before the setting scaled by the group's standard deviation)."""
    if given:
        return given
    settings = Path(run).expanduser() / "settings.json"
    if settings.is_file():
        return json.loads(settings.read_text()).get("scale_rewards") or "group"
    return "group"


def term_pairs(groups: Iterable[Sequence[dict[str, Any]]]) -> list[tuple[list[float], list[float]]]:
    """Each group's scored rollouts as (rewards with the consistency term, the same without it: the
    outcome less the format penalty), from rollout-log records: what `term_flips` compares."""
    pairs = []
    for records in groups:
        scored = [r for r in records if isinstance(r.get("reward"), (int, float))]
        pairs.append(([r["reward"] for r in scored],
                      [(r.get("outcome") or 0.0) - (r.get("penalty") or 0.0) for r in scored]))
    return pairs


def flip_shares(run: str | Path, scale: str | None = None) -> dict[int, float]:
    """Per step, the percent of GRPO advantages whose sign the consistency term changed: each group's
    advantages from its rewards against those from the same rewards without the term (the outcome less
    the format penalty), scaled as the run scaled them (`term_flips`); {} without a
    rollout log. 0 throughout for an outcome-only run; near 0 for a belief run means the term trained
    nothing that the outcome did not."""
    how = run_scale(run, scale)
    shares = {}
    for step, groups in sorted(read_rollout_records(run).items()):
        f = term_flips(term_pairs(groups.values()), how)
        if f.advantages:
            shares[step] = 100 * f.flipped / f.advantages
    return shares


def training_curves(runs: Sequence[str | Path]) -> list[Curve]:
    """The lines of the paper's Figure 3 panels (`CURVES`) for each run, read from its log: what
    `plot_curves` draws, in the order it draws them (panel, then run, then measure). Runs are named
    only when there are several."""
    names = [None] if len(runs) == 1 else run_labels(runs)
    logs = []
    for name, run in zip(names, runs):
        records = read_log(run)
        flips = flip_shares(run)  # {} without a rollout log
        logs.append((name, [{**r, FLIPS: flips[int(r["step"])]} if int(r.get("step", 0)) in flips else r
                            for r in records]))
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
