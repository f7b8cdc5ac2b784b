"""`metarag sweep`: one evaluation per point of a settings grid, reported like the reproducibility
study's Table 3 (EM, F1 and per-question counts for each value), with the model-served requests,
tokens and latency per question: a cost-quality curve (e.g. `--vary reason_max_tokens=64,160`).
Each point is an ordinary run folder, so a sweep resumes point by point."""
from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import replace

from metarag.errors import ConfigError
from metarag.evaluate.harness import EvalConfig, evaluate
from metarag.evaluate.report import load_run, summarize
from metarag.evaluate.resolve import resolve

# Cost columns of a sweep's table: requests as the papers count them and as the model served them,
# and the model-served tokens and latency per question (the cost axis of a cost-quality curve).
COST_COLUMNS = ("req/q", "served req/q", "cached req/q", "served tok/q", "served lat/q", "retr/q")
# Per-question columns of `summarize` that are no decision count (those follow the cost columns).
SUMMARY_PER_QUESTION = ("req/q", "retr/q", "lat/q", "prompt tok/q", "completion tok/q", "cached tok/q",
                        "cache hits/q", "passages/q", "served req/q", "cached req/q", "served tok/q",
                        "served prompt tok/q", "served completion tok/q", "served lat/q", "steps/q")


def parse_vary(items: Sequence[str]) -> dict[str, list[str]]:
    """`['threshold=0.1,0.2', 'k=3,5']` -> `{'threshold': ['0.1', '0.2'], 'k': ['3', '5']}`."""
    grid: dict[str, list[str]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        parts = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not key.strip() or not parts:
            raise ConfigError(f"--vary expects key=v1,v2,..., got {item!r}")
        grid[key.strip()] = parts
    if not grid:
        raise ConfigError("give at least one --vary key=v1,v2,...")
    return grid


def grid_points(grid: Mapping[str, list[str]]) -> list[dict[str, str]]:
    keys = list(grid)
    return [dict(zip(keys, combo)) for combo in itertools.product(*(grid[k] for k in keys))]


def sweep(config: EvalConfig, grid: Mapping[str, list[str]], *, progress: bool = True
          ) -> tuple[str, list[dict]]:
    """Evaluate every grid point (each resolved up front, before any model loads); a markdown table
    and its rows. Each point is checked for a reachable back-end before its first question, and a
    point that stops on consecutive retryable failures stops the sweep (re-run it to resume)."""
    points = grid_points(grid)
    configs = [replace(config, overrides={**config.overrides, **point}) for point in points]
    for point in configs:
        resolve(point)
    rows = []
    for point, point_config in zip(points, configs):
        store, _ = evaluate(point_config, progress=progress)
        rows.append({**point, **summarize(load_run(store.path))})
    extra = sorted({k for row in rows for k in row if k.endswith("/q") and k not in SUMMARY_PER_QUESTION})
    columns = [*grid, "n", "failed", "EM", "F1", *COST_COLUMNS, *extra]
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(c)) for c in columns) + " |")
    return "\n".join(lines), rows


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.2f}"
    return "–" if value is None else str(value)
