"""The analyses of the EvoCtx paper (Chen et al., 2026, §4.4 and appendix C) over finished runs:
oracle agreement (Figure 4), action allocation against question–answer distance (Figure 3),
confidence across rounds (Table 8) and efficiency (Table 5). Everything is read from the traces'
`evoctx-decision` Decide steps and `sufficiency` Score steps (`metarag.methods.evoctx`); nothing is
kept on the side. `format_analysis` is what `metarag report RUN --analysis evoctx` prints.
"""
from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from metarag.evaluate.report import LoadedRun
from metarag.records import Decide, Score, Trace

DECISION = "evoctx-decision"
PROBE = "sufficiency"


# ------------------------------------------------------------------------------- correlation
def average_ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks of `values`, ties sharing the mean of the ranks they span (as scipy's rankdata)."""
    x = np.asarray(values, dtype=np.float64)
    order = np.argsort(x, kind="mergesort")
    ranks = np.empty(len(x), dtype=np.float64)
    ordered = x[order]
    start = 0
    while start < len(x):
        end = start
        while end + 1 < len(x) and ordered[end + 1] == ordered[start]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation with average ranks for ties; NaN for fewer than two pairs or a
    constant side (the correlation is undefined there)."""
    if len(x) != len(y):
        raise ValueError(f"spearman needs paired values, got {len(x)} and {len(y)}")
    if len(x) < 2:
        return math.nan
    return pearson(average_ranks(x), average_ranks(y))


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's correlation; NaN for fewer than two pairs or a constant side."""
    a, b = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    if len(a) < 2:
        return math.nan
    a, b = a - a.mean(), b - b.mean()
    denom = math.sqrt(float(a @ a) * float(b @ b))
    return math.nan if denom == 0 else float(a @ b) / denom


# --------------------------------------------------------------------------------- decisions
def decisions(trace: Trace) -> list[Decide]:
    """The trace's EvoCtx decision steps, in order."""
    return [s for s in trace.steps if isinstance(s, Decide) and s.name == DECISION]


def has_decisions(run: LoadedRun) -> bool:
    """Whether any question of the run made an EvoCtx decision (False for a baseline's run)."""
    return any(decisions(r.trace) for r in run.results)


def oracle_agreement(run: LoadedRun) -> dict[str, float]:
    """Figure 4: each decision's signed margin (score − 1, from the reasoning trace) against the
    oracle margin (the gold answer's embedding against the same boundary; runs with `oracle=true`).

    A margin above 0 means RETRIEVE. Returns n (decisions with both margins), spearman, and the
    shares of decisions where both say RETRIEVE, both THINK, agreement (their sum), under_retrieve
    (oracle RETRIEVE, trace THINK: the boundary should have grown but did not) and over_retrieve.
    """
    pairs = margin_pairs(run)
    n = len(pairs)
    if n == 0:
        return {"n": 0, "spearman": math.nan, "both_retrieve": math.nan, "both_think": math.nan,
                "agreement": math.nan, "under_retrieve": math.nan, "over_retrieve": math.nan}
    counts = Counter((m > 0, o > 0) for m, o in pairs)
    both_retrieve, both_think = counts[(True, True)] / n, counts[(False, False)] / n
    return {"n": n, "spearman": spearman([m for m, _ in pairs], [o for _, o in pairs]),
            "both_retrieve": both_retrieve, "both_think": both_think,
            "agreement": both_retrieve + both_think,
            "under_retrieve": counts[(False, True)] / n, "over_retrieve": counts[(True, False)] / n}


def margin_pairs(run: LoadedRun) -> list[tuple[float, float]]:
    """(trace margin, oracle margin) of every decision that recorded both, in run order."""
    return [(d.signals["margin"], d.signals["oracle_margin"]) for r in run.results
            for d in decisions(r.trace) if "margin" in d.signals and "oracle_margin" in d.signals]


def allocation_vs_distance(run: LoadedRun, encoder: Any = None) -> dict[str, Any]:
    """Figure 3: per question, the shares of RETRIEVE and THINK among its executed RETRIEVE/THINK
    actions against the cosine distance of the question and its first gold answer (embedded with
    `encoder`, MiniLM by default), with the correlations over questions.

    Questions without gold answers or without any RETRIEVE/THINK action are left out and counted
    in `excluded`. Returns n, excluded, rows (question_id, distance, retrieve_ratio, think_ratio,
    actions), spearman_retrieve, spearman_think, pearson_retrieve, pearson_think.
    """
    kept: list[tuple[str, str, str, int, int]] = []
    excluded = 0
    for r in run.results:
        chosen = Counter(d.choice for d in decisions(r.trace))
        actions = chosen["RETRIEVE"] + chosen["THINK"]
        if not r.golds or actions == 0:
            excluded += 1
            continue
        kept.append((r.question_id, r.trace.question, r.golds[0], chosen["RETRIEVE"], actions))
    rows: list[dict[str, Any]] = []
    if kept:
        from metarag.judges.boundary import embed, minilm_encoder

        vectors = embed(encoder if encoder is not None else minilm_encoder(),
                        [q for _, q, _, _, _ in kept] + [g for _, _, g, _, _ in kept])
        questions, golds = vectors[:len(kept)], vectors[len(kept):]
        for (qid, _, _, retrieve, actions), qv, gv in zip(kept, questions, golds):
            distance = float(np.clip(1.0 - qv @ gv, 0.0, 2.0))
            rows.append({"question_id": qid, "distance": distance, "retrieve_ratio": retrieve / actions,
                         "think_ratio": 1 - retrieve / actions, "actions": actions})
    distance = [row["distance"] for row in rows]
    retrieve = [row["retrieve_ratio"] for row in rows]
    think = [row["think_ratio"] for row in rows]
    return {"n": len(rows), "excluded": excluded, "rows": rows,
            "spearman_retrieve": spearman(distance, retrieve), "spearman_think": spearman(distance, think),
            "pearson_retrieve": pearson(distance, retrieve), "pearson_think": pearson(distance, think)}


def confidence_by_round(run: LoadedRun) -> list[tuple[int, float, int]]:
    """Table 8: (round, mean P(Yes), n) for every round that was probed, P(Yes) renormalized over
    the probe's labels. Each `sufficiency` probe belongs to the round of the decision that follows it."""
    by_round: dict[int, list[float]] = defaultdict(list)
    for r in run.results:
        pending: float | None = None
        for step in r.trace.steps:
            if isinstance(step, Score) and step.purpose == PROBE:
                pending = _p_yes(step)
            elif isinstance(step, Decide) and step.name == DECISION:
                if pending is not None and "round" in step.signals:
                    by_round[int(step.signals["round"])].append(pending)
                pending = None
    return [(round_, float(np.mean(ps)), len(ps)) for round_, ps in sorted(by_round.items())]


def _p_yes(step: Score) -> float:
    total = sum(step.probs)
    yes = step.probs[step.labels.index("Yes")] if "Yes" in step.labels else 0.0
    return yes / total if total > 0 else 1.0 / len(step.labels)


def efficiency(run: LoadedRun) -> dict[str, float]:
    """Table 5: per question, retrieval calls, distinct retrieved passages and tokens (prompt + completion),
    and the executed actions of EvoCtx runs."""
    n = len(run.results) or 1
    chosen = Counter(d.choice for r in run.results for d in decisions(r.trace))
    return {"questions": len(run.results),
            "retrieval_calls": sum(r.trace.usage.retrieval_calls for r in run.results) / n,
            "passages": sum(len(r.trace.retrieved_ids()) for r in run.results) / n,
            "tokens": sum(r.trace.usage.total_tokens for r in run.results) / n,
            **{f"{action.lower()}_per_question": chosen[action] / n for action in ("RETRIEVE", "THINK", "ANSWER")}}


def tail_readings(run: LoadedRun) -> dict[str, tuple[float, int]]:
    """For each reading of the tail signal recorded on the boundary decisions (`margin_p10`,
    `margin_p90`: the rule's margin with d_90 taken at that percentile of the distances), the share
    of the run's decisions that reading would have sent to RETRIEVE, and how many decisions had it.
    The states are the ones the run visited under its own setting, so this compares the readings
    decision by decision, not whole trajectories."""
    margins: dict[str, list[float]] = defaultdict(list)
    for r in run.results:
        for d in decisions(r.trace):
            for key, value in d.signals.items():
                if key.startswith("margin_p"):
                    margins[key].append(value)
    return {key[len("margin_"):]: (sum(m > 0 for m in values) / len(values), len(values))
            for key, values in sorted(margins.items(), key=lambda kv: float(kv[0][len("margin_p"):]))}


# -------------------------------------------------------------------------------------- figures
def plot_analysis(run: LoadedRun, folder: str | Path, encoder: Any = None,
                  allocation: dict[str, Any] | None = None) -> list[Path]:
    """The paper's two figures for one run, as PNGs in `folder` (created if missing):
    `<run>-figure4-oracle.png`, each decision's trace margin against its oracle margin with the
    agreement quadrants (drawn when the run recorded oracle margins), and
    `<run>-figure3-allocation.png`, each question's RETRIEVE ratio against its question–answer
    distance (drawn when some question qualifies). `allocation` reuses an `allocation_vs_distance`
    result. Returns the files written."""
    from metarag.evaluate.report import _pyplot

    plt = _pyplot()
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    pairs = margin_pairs(run)
    if pairs:
        fig, ax = plt.subplots(figsize=(5, 5))
        ax.scatter([o for _, o in pairs], [m for m, _ in pairs], s=12, alpha=0.6)
        ax.axhline(0, color="grey", lw=0.8)
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_xlabel("oracle margin (gold answer vs boundary)")
        ax.set_ylabel("trace margin (reasoning vs boundary)")
        oracle = oracle_agreement(run)
        ax.set_title(f"{len(pairs)} decisions, Spearman {_num(oracle['spearman'])}, "
                     f"agreement {_pct(oracle['agreement'])}", fontsize=9)
        for x, y, label in ((0.98, 0.98, "both RETRIEVE"), (0.02, 0.02, "both THINK"),
                            (0.98, 0.02, "under-RETRIEVE"), (0.02, 0.98, "over-RETRIEVE")):
            ax.text(x, y, label, transform=ax.transAxes, fontsize=8, color="grey",
                    ha="right" if x > 0.5 else "left", va="top" if y > 0.5 else "bottom")
        ax.grid(alpha=0.3)
        fig.tight_layout()
        written.append(out / f"{run.name}-figure4-oracle.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    allocation = allocation if allocation is not None else allocation_vs_distance(run, encoder)
    if allocation["rows"]:
        rows = allocation["rows"]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.scatter([r["distance"] for r in rows], [r["retrieve_ratio"] for r in rows], s=14, label="RETRIEVE")
        ax.scatter([r["distance"] for r in rows], [r["think_ratio"] for r in rows], s=14, marker="x",
                   label="THINK")
        ax.set_xlabel("question–answer distance (cosine)")
        ax.set_ylabel("share of the question's actions")
        ax.set_title(f"{allocation['n']} questions, Spearman(distance, RETRIEVE) "
                     f"{_num(allocation['spearman_retrieve'])}", fontsize=9)
        ax.legend()
        ax.grid(alpha=0.3)
        fig.tight_layout()
        written.append(out / f"{run.name}-figure3-allocation.png")
        fig.savefig(written[-1], dpi=120)
        plt.close(fig)
    return written


# -------------------------------------------------------------------------------------- report
def format_analysis(run: LoadedRun, encoder: Any = None, allocation: dict[str, Any] | None = None) -> str:
    """The four analyses of one run as markdown (the encoder, MiniLM by default, embeds questions and
    gold answers for Figure 3; `allocation` reuses an `allocation_vs_distance` result)."""
    eff = efficiency(run)
    lines = [f"### EvoCtx analysis: {run.name}", "",
             "Efficiency (Table 5), per question:", "",
             "| questions | retrieval calls | passages | tokens | RETRIEVE | THINK | ANSWER |",
             "|---|---|---|---|---|---|---|",
             f"| {eff['questions']} | {eff['retrieval_calls']:.2f} | {eff['passages']:.2f} | {eff['tokens']:.0f} "
             f"| {eff['retrieve_per_question']:.2f} | {eff['think_per_question']:.2f} "
             f"| {eff['answer_per_question']:.2f} |", ""]
    if not has_decisions(run):  # a baseline's run: Table 5's row only
        return "\n".join(lines + ["no EvoCtx decisions in this run: efficiency only"])
    readings = tail_readings(run)
    if readings:
        lines += ["RETRIEVE share of the boundary decisions under each reading of the tail signal d_90 "
                  "(percentile of the distances):", "",
                  "| " + " | ".join(readings) + " |", "|" + "---|" * len(readings),
                  "| " + " | ".join(f"{_pct(share)} of {n}" for share, n in readings.values()) + " |", ""]
    oracle = oracle_agreement(run)
    lines.append("Oracle agreement (Figure 4):")
    if oracle["n"] == 0:
        lines += ["", "no decisions with an oracle margin (run EvoCtx with --set oracle=true)", ""]
    else:
        lines += ["", "| decisions | Spearman ρ | agreement | both RETRIEVE | both THINK | under-RETRIEVE "
                      "| over-RETRIEVE |", "|---|---|---|---|---|---|---|",
                  f"| {oracle['n']} | {_num(oracle['spearman'])} | {_pct(oracle['agreement'])} "
                  f"| {_pct(oracle['both_retrieve'])} | {_pct(oracle['both_think'])} "
                  f"| {_pct(oracle['under_retrieve'])} | {_pct(oracle['over_retrieve'])} |", ""]
    allocation = allocation if allocation is not None else allocation_vs_distance(run, encoder)
    lines.append("Action allocation against question–answer distance (Figure 3):")
    if allocation["n"] == 0:
        lines += ["", "no question with gold answers and RETRIEVE/THINK decisions", ""]
    else:
        rows = allocation["rows"]
        lines += ["", "| questions | excluded | mean distance | mean RETRIEVE ratio | ρ(distance, RETRIEVE) "
                      "| ρ(distance, THINK) | r(distance, RETRIEVE) |", "|---|---|---|---|---|---|---|",
                  f"| {allocation['n']} | {allocation['excluded']} "
                  f"| {np.mean([r['distance'] for r in rows]):.3f} "
                  f"| {np.mean([r['retrieve_ratio'] for r in rows]):.3f} "
                  f"| {_num(allocation['spearman_retrieve'])} | {_num(allocation['spearman_think'])} "
                  f"| {_num(allocation['pearson_retrieve'])} |", ""]
    confidence = confidence_by_round(run)
    lines.append("Confidence across rounds (Table 8), mean P(Yes) to \"Is the current evidence sufficient?\":")
    if not confidence:
        lines += ["", "no sufficiency probes (run EvoCtx with confidence_probe=true)"]
    else:
        lines += ["", "| round | mean P(Yes) | Δ | n |", "|---|---|---|---|"]
        previous = None
        for round_, mean, count in confidence:
            delta = "–" if previous is None else f"{mean - previous:+.2f}"
            lines.append(f"| {round_} | {mean:.2f} | {delta} | {count} |")
            previous = mean
    return "\n".join(lines)


def _num(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.3f}"


def _pct(value: float) -> str:
    return "–" if math.isnan(value) else f"{100 * value:.1f}%"
