"""How much a belief signal tells about correctness, measured before anything is trained on it
(`metarag probe`): the AUROC, with a bootstrap interval, of each signal against whether the model's own
closed-book answer is right, on evaluation questions, so that a reward built on a belief is known to
carry information before a training run spends days on it.

The signals, each a score per question where higher means "I can answer":

- `probe`: the belief-action paper's probe (Qi et al., 2026, §3.3; `judges/belief.py`): b = P(Yes) − P(No)
  on the belief agent's first decision context (question, empty history), read from the policy, i.e.
  the model with its trained adapter when one is given (`lora`), as the paper reads it in training.
- `probe-frozen`: the same probe read from the frozen starting weights (the model without the
  adapter). Without an adapter the two are one reading, and only `probe` is reported.
- `agreement`: the share of K sampled closed-book answers equal (after SQuAD normalization) to the
  greedy answer: sampling consistency as a confidence (Manakul et al., 2023, SelfCheckGPT; Xiong et
  al., 2024), from an `eval --samples K` run (sampling as that run's, 0.6 / 0.95 by default).
- `linear`: a linear probe on hidden states (Azaria & Mitchell, 2023; Kadavath et al., 2022): the
  last prompt token's hidden state of the closed-book prompt, at one layer, into a logistic regression
  trained on the training questions' correctness only; the layer and the regularization chosen by
  5-fold cross-validated AUROC on those training questions (never on the evaluation questions).

Correctness is the closed-book greedy answer's EM (and, beside it, cover-EM) from a `closed-book` run
of the same model: the belief asks "can you answer?" before any search, and the closed-book answer is
what the model answers then. The closed-book runs are ordinary run folders (`eval --method
closed-book`), resumed when they exist; every per-question reading is appended to `signals.jsonl` as
it is made, so a stopped measurement goes on where it stopped.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from metarag.errors import ConfigError, DataError
from metarag.evaluate.stats import Interval
from metarag.metrics import normalize_answer

TARGET = 0.65  # the AUROC a signal must reach to be worth a reward (issue 51)
SIGNALS = ("probe", "probe-frozen", "agreement", "linear")


@dataclass(frozen=True)
class QuestionSet:
    """Questions as `eval` names them: a preset and an optional committed id list ("hotpotqa-dev500:headline200")."""

    preset: str
    questions: str | None = None

    @classmethod
    def parse(cls, text: str) -> QuestionSet:
        preset, _, listed = text.partition(":")
        if not preset.strip():
            raise ConfigError(f"question set {text!r}: give PRESET or PRESET:LIST")
        return cls(preset.strip(), listed.strip() or None)

    @property
    def label(self) -> str:
        return self.preset + (f":{self.questions}" if self.questions else "")


# The declared sets: evaluated on the headline tables' questions, a linear probe trained on the training pool
EVAL_SETS = (QuestionSet("hotpotqa-dev500", "headline200"), QuestionSet("2wiki-dev1000", "headline200"))
TRAIN_SETS = (QuestionSet("hotpotqa-train100"), QuestionSet("musique-train100"),
              QuestionSet("hotpotqa-dev500", "train-pool"), QuestionSet("2wiki-dev1000", "train-pool"))


@dataclass(frozen=True)
class ProbeSettings:
    """One measurement. `llm`: the model whose belief is read (a spec as --llm takes it); `lora`: its
    trained adapter (then `probe` reads the policy, `probe-frozen` the model without it); `hidden_llm`:
    the transformers spec of the same weights for the linear probe's hidden states ("" leaves it out);
    `samples`: K closed-book samples a question for `agreement` (0 leaves it out); `layers`: the hidden
    layers the linear probe may use (empty: every fourth, and the last)."""

    llm: str = "embedded"
    lora: str | None = None
    hidden_llm: str = ""
    samples: int = 5
    eval_sets: tuple[QuestionSet, ...] = EVAL_SETS
    train_sets: tuple[QuestionSet, ...] = TRAIN_SETS
    layers: tuple[int, ...] = ()
    threads: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.hidden_llm and self.lora:
            raise ConfigError("the linear probe reads the starting weights' hidden states: measure it without --lora "
                              "(or leave --hidden-llm out)")
        if self.samples < 0 or self.samples == 1:
            raise ConfigError(f"--samples {self.samples}: agreement needs K >= 2 samples (0 leaves it out)")
        if not self.eval_sets:
            raise ConfigError("give at least one evaluation question set")


# ------------------------------------------------------------------------------------ AUROC
def _auroc(scores: np.ndarray, labels: np.ndarray, axis: int = -1) -> np.ndarray:
    """AUROC along `axis` by the Mann–Whitney statistic on average ranks (ties count one half):
    (sum of the positives' ranks − n₁(n₁+1)/2) / (n₁ n₀); NaN where one class is absent."""
    from scipy.stats import rankdata

    ranks = rankdata(scores, axis=axis)
    positive = np.asarray(labels, dtype=bool)
    n1 = positive.sum(axis=axis)
    n0 = positive.shape[axis] - n1
    u = (ranks * positive).sum(axis=axis) - n1 * (n1 + 1) / 2
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where((n1 > 0) & (n0 > 0), u / (n1 * n0), np.nan)


def auroc(scores: Sequence[float], labels: Sequence[bool], n_resamples: int = 10_000, seed: int = 0,
          level: float = 0.95) -> Interval:
    """The AUROC of `scores` for `labels` (P(a right answer scores above a wrong one), ties one half)
    with its percentile bootstrap interval over questions (`scipy.stats.bootstrap`, paired, seeded).
    A sample with one class only is a DataError: nothing separates nothing."""
    from scipy.stats import bootstrap

    x, y = np.asarray(scores, dtype=float), np.asarray(labels, dtype=bool)
    if x.shape != y.shape or x.ndim != 1:
        raise ValueError("scores and labels must be paired one-dimensional sequences")
    if not np.all(np.isfinite(x)):
        raise ValueError("scores must be finite")
    if y.all() or not y.any():
        raise DataError(f"an AUROC needs right and wrong answers; all {len(y)} are {'right' if y.all() else 'wrong'}")
    estimate = float(_auroc(x, y))
    result = bootstrap((x, y), lambda s, t, axis=-1: _auroc(s, t, axis=axis), paired=True, vectorized=True,
                       n_resamples=n_resamples, confidence_level=level, method="percentile",
                       random_state=np.random.default_rng(seed))
    low, high = result.confidence_interval
    return Interval(estimate, float(low), float(high), level)


# ------------------------------------------------------------------------------------ readings
def first_step_context(question: str) -> str:
    """The belief agent's first decision context c_0 = (question, no history), which its probe reads."""
    from metarag.methods.search_agent import STEP_CONTEXT_FIRST

    return STEP_CONTEXT_FIRST.format(task_description=question)


def read_probe(llm: Any, question: str) -> float:
    """b = P(Yes) − P(No) of the paper's Probe Instruction on the first decision context, by the same
    label rule as the agent's probe (`judges.belief`: renormalized over the two labels, 1/2 each when
    neither gets mass)."""
    from metarag.judges.belief import PROBE_LABELS, probe_prompt

    scores = llm.score_labels(probe_prompt(first_step_context(question)), PROBE_LABELS)
    return scores.p("Yes")[0] - scores.p("No")[0]


def agreement(greedy: str, samples: Sequence[str]) -> float:
    """The share of `samples` that equal the greedy answer after SQuAD normalization (0 for an empty
    greedy answer)."""
    target = normalize_answer(greedy)
    if not target or not samples:
        return 0.0
    return sum(normalize_answer(s) == target for s in samples) / len(samples)


STATES_EVERY = 25  # questions between two saves of the hidden states read so far (states-<set>.partial.npz)


def last_token_states(llm: Any, prompt: Sequence[Any], layers: Sequence[int]) -> np.ndarray:
    """The hidden states of the prompt's last token at `layers` (0: the embeddings), as (len(layers),
    width) float32, from a back-end that returns them (transformers)."""
    from metarag.llm.base import Decoding

    out = llm.chat(tuple(prompt), Decoding(max_tokens=0, hidden_states=True))
    internals = out.internals
    if internals is None or internals.hidden_states is None:
        raise ConfigError(f"{llm.identity} returns no hidden states: the linear probe needs a transformers "
                          "model (--hidden-llm hf / hf-0.5b)")
    last = internals.n_prompt - 1
    return np.stack([np.asarray(internals.hidden_states[i][last], dtype=np.float32) for i in layers])


def default_layers(n_layers: int) -> tuple[int, ...]:
    """Every fourth hidden layer from the fourth, and the last (1..n_layers; 0 is the embeddings)."""
    return tuple(sorted(set(range(4, n_layers + 1, 4)) | {n_layers}))


# ------------------------------------------------------------------------------------ linear probe
@dataclass(frozen=True)
class LinearProbe:
    """A logistic regression on one layer's standardized hidden states, and how it was chosen."""

    layer: int
    c: float
    cv_auroc: float
    model: Any = field(repr=False, compare=False)

    def scores(self, states: np.ndarray) -> np.ndarray:
        return self.model.decision_function(states)


def fit_linear_probe(states: np.ndarray, labels: Sequence[bool], layers: Sequence[int],
                     cs: Sequence[float] = (0.001, 0.01, 0.1), seed: int = 0) -> LinearProbe:
    """The layer (an index into `states`' second axis, named by `layers`) and inverse regularization C
    with the best 5-fold stratified cross-validated AUROC on these (training) questions, refitted on
    all of them. `states`: (questions, layers, width)."""
    try:
        from sklearn.linear_model import LogisticRegression
        from sklearn.model_selection import StratifiedKFold, cross_val_score
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
    except ModuleNotFoundError as exc:
        from metarag.errors import MissingDependency

        raise MissingDependency(exc.name or "scikit-learn", "train") from None
    y = np.asarray(labels, dtype=bool)
    if y.sum() < 5 or (~y).sum() < 5:
        raise DataError(f"a linear probe needs at least 5 right and 5 wrong training answers; got {int(y.sum())} "
                        f"right of {len(y)}")
    folds = StratifiedKFold(5, shuffle=True, random_state=seed)
    best: tuple[float, int, float] | None = None
    for j in range(states.shape[1]):
        for c in cs:
            model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000, class_weight="balanced"))
            score = float(np.mean(cross_val_score(model, states[:, j], y, cv=folds, scoring="roc_auc")))
            if best is None or score > best[0]:
                best = (score, j, c)
    assert best is not None
    score, j, c = best
    model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000, class_weight="balanced"))
    model.fit(states[:, j], y)
    return LinearProbe(layers[j], c, score, model)


def out_of_fold_p_right(states: np.ndarray, labels: Sequence[bool], c: float, folds: int = 5,
                        seed: int = 0) -> np.ndarray:
    """Each question's probability that its closed-book answer is right, from a logistic regression on
    its (standardized) hidden states of one layer fitted on the other folds only (stratified, seeded):
    what a probe that never saw the question's label believes of it. Unweighted, unlike the probe that
    chose the layer and C (whose balanced classes suit AUROC), so the probabilities are calibrated to the
    real share of right answers and p > 0.5 means "more likely right than wrong". `states`: (questions,
    width)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_predict
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    y = np.asarray(labels, dtype=bool)
    if min(int(y.sum()), int((~y).sum())) < folds:
        raise DataError(f"out-of-fold beliefs need at least {folds} right and {folds} wrong answers; got "
                        f"{int(y.sum())} right of {len(y)}")
    model = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=2000))
    split = StratifiedKFold(folds, shuffle=True, random_state=seed)
    return cross_val_predict(model, states, y, cv=split, method="predict_proba")[:, 1]


# ------------------------------------------------------------------------------------ the measurement
@dataclass(frozen=True)
class Reading:
    """One question's labels and signals (None: not read)."""

    set: str
    question_id: str
    em: float
    cover_em: float
    answer: str
    probe: float | None = None
    probe_frozen: float | None = None
    agreement: float | None = None


@dataclass(frozen=True)
class SignalResult:
    """One signal's AUROC against one label on one set of questions."""

    signal: str
    label: str
    questions: str
    n: int
    right: int
    auroc: Interval


def closed_book_config(qs: QuestionSet, llm: str, runs_dir: str | Path, *, samples: int = 1,
                       lora: str | None = None, threads: int | None = None):
    """The `eval --method closed-book` run of a question set: its labels and answers (`samples` K > 1:
    the sampled run agreement reads)."""
    from metarag.evaluate.harness import DatasetSpec, EvalConfig, Samples
    from metarag.llm.registry import parse_llm_spec

    return EvalConfig(method="closed-book", dataset=DatasetSpec(preset=qs.preset, questions=qs.questions),
                      llm=parse_llm_spec(llm, n_threads=threads, lora=lora), runs_dir=str(runs_dir),
                      samples=Samples(k=samples))


def _load_readings(path: Path) -> dict[tuple[str, str], dict]:
    done: dict[tuple[str, str], dict] = {}
    if path.is_file():
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill
                continue
            done[(record["set"], record["question_id"])] = record
    return done


def measure(settings: ProbeSettings, out_dir: str | Path, runs_dir: str | Path, *,
            llm: Any = None, frozen_llm: Any = None, hidden_llm: Any = None,
            log: Callable[[str], None] = lambda line: None) -> list[SignalResult]:
    """Run (or resume) the measurement `settings` describes into `out_dir`: the closed-book runs (in
    `runs_dir`), the per-question readings (`signals.jsonl`), the linear probe's states
    (`states-<set>.npz`), and `report.md`. Returns each signal's AUROC per evaluation set and over
    all of them. `llm` / `frozen_llm` / `hidden_llm` replace the models the settings name (tests)."""
    from metarag.evaluate.harness import evaluate
    from metarag.evaluate.report import load_run
    from metarag.methods.runner import build_named_llm

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "settings.json").write_text(json.dumps(_plain(settings), indent=1) + "\n")
    if llm is None:
        llm = build_named_llm(settings.llm, n_threads=settings.threads, lora=settings.lora)
    if settings.lora and frozen_llm is None:
        frozen_llm = build_named_llm(settings.llm, n_threads=settings.threads)
    readings_path = out / "signals.jsonl"
    done = _load_readings(readings_path)
    greedy_runs = {}
    for qs in settings.eval_sets:
        log(f"probe: closed-book answers on {qs.label}")
        store, _ = evaluate(closed_book_config(qs, settings.llm, runs_dir, lora=settings.lora,
                                               threads=settings.threads), progress=False, llm=llm)
        greedy_runs[qs.label] = load_run(store.path)
        if settings.samples:
            log(f"probe: {settings.samples} sampled closed-book answers on {qs.label}")
            sampled, _ = evaluate(closed_book_config(qs, settings.llm, runs_dir, samples=settings.samples,
                                                     lora=settings.lora, threads=settings.threads),
                                  progress=False, llm=llm)
            greedy_runs[qs.label + "#samples"] = load_run(sampled.path)
    texts = {}
    with readings_path.open("a") as handle:
        for qs in settings.eval_sets:
            run = greedy_runs[qs.label]
            sampled = greedy_runs.get(qs.label + "#samples")
            by_question: dict[str, list[str]] = {}
            for r in (sampled.samples if sampled is not None else ()):
                by_question.setdefault(r.question_id, []).append(r.prediction)
            for r in run.results:
                texts[(qs.label, r.question_id)] = r.trace.question
                if (qs.label, r.question_id) in done:
                    continue
                reading = Reading(qs.label, r.question_id, r.scores.em, r.scores.acc, r.prediction,
                                  probe=read_probe(llm, r.trace.question),
                                  probe_frozen=read_probe(frozen_llm, r.trace.question) if frozen_llm else None,
                                  agreement=agreement(r.prediction, by_question[r.question_id])
                                  if sampled is not None else None)
                handle.write(json.dumps(asdict(reading)) + "\n")
                handle.flush()
                done[(qs.label, r.question_id)] = asdict(reading)
    linear: dict[tuple[str, str], float] = {}
    if settings.hidden_llm:
        linear = _linear_scores(settings, out, runs_dir, greedy_runs, hidden_llm, llm, log)
    results = summarize_signals([done[k] for k in sorted(done) if k[0] in {q.label for q in settings.eval_sets}],
                                linear, settings.seed)
    (out / "report.md").write_text(format_signals(results, settings) + "\n")
    return results


def _linear_scores(settings: ProbeSettings, out: Path, runs_dir: str | Path, greedy_runs: dict, hidden_llm: Any,
                   llm: Any, log: Callable[[str], None]) -> dict[tuple[str, str], float]:
    """The linear probe's score of each evaluation question, trained on the training sets' closed-book
    labels; states cached per question set in `states-<set>.npz`."""
    from metarag.evaluate.harness import evaluate
    from metarag.evaluate.report import load_run
    from metarag.methods.runner import build_named_llm

    if hidden_llm is None:
        hidden_llm = build_named_llm(settings.hidden_llm, n_threads=settings.threads)
    n_layers = int(getattr(getattr(getattr(hidden_llm, "model", None), "config", None), "num_hidden_layers", 0) or 0)
    layers = settings.layers or default_layers(n_layers)
    if not layers:
        raise ConfigError(f"{settings.hidden_llm}: the number of layers is unknown; give the layers")

    def states_of(qs: QuestionSet, run) -> tuple[list[str], np.ndarray, np.ndarray]:
        path = out / f"states-{qs.label.replace(':', '.')}.npz"
        ids = [r.question_id for r in run.results]
        if path.is_file():
            cached = np.load(path)
            if list(cached["ids"]) == ids and list(cached["layers"]) == list(layers):
                return ids, cached["states"], cached["em"]
        partial = path.with_name(path.stem + ".partial.npz")  # what a killed session had read: kept
        done: dict[str, np.ndarray] = {}
        if partial.is_file():
            kept = np.load(partial)
            if list(kept["layers"]) == list(layers):
                done = dict(zip(map(str, kept["ids"]), kept["states"]))
        log(f"probe: hidden states of {len(ids)} questions of {qs.label}"
            + (f" ({len(set(done) & set(ids))} read before)" if done else ""))

        def keep(target: Path) -> None:  # written whole, then renamed: a kill never leaves half a file
            tmp = target.with_name(target.name + ".tmp.npz")
            order = list(done)
            np.savez(tmp, ids=np.array(order), layers=np.array(layers), states=np.stack([done[i] for i in order]))
            tmp.replace(target)

        for n, r in enumerate(run.results, 1):
            if r.question_id in done:
                continue
            prompt = next(s.prompt for s in r.trace.steps if getattr(s, "purpose", None) == "answer")
            done[r.question_id] = last_token_states(hidden_llm, prompt, layers)
            if n % STATES_EVERY == 0:
                keep(partial)
        states, em = np.stack([done[i] for i in ids]), np.array([r.scores.em for r in run.results])
        np.savez(path, ids=np.array(ids), layers=np.array(layers), states=states, em=em)
        partial.unlink(missing_ok=True)
        return ids, states, em

    train_states, train_labels = [], []
    for qs in settings.train_sets:
        log(f"probe: closed-book answers on the training set {qs.label}")
        store, _ = evaluate(closed_book_config(qs, settings.llm, runs_dir, threads=settings.threads),
                            progress=False, llm=llm)
        _, states, em = states_of(qs, load_run(store.path))
        train_states.append(states)
        train_labels.append(em)
    probe = fit_linear_probe(np.concatenate(train_states), np.concatenate(train_labels) > 0, layers,
                             seed=settings.seed)
    log(f"probe: linear probe at layer {probe.layer}, C {probe.c} (cross-validated AUROC {probe.cv_auroc:.3f})")
    (out / "linear-probe.json").write_text(json.dumps({"layer": probe.layer, "C": probe.c,
                                                       "cv_auroc": probe.cv_auroc, "layers": list(layers)}) + "\n")
    scores: dict[tuple[str, str], float] = {}
    for qs in settings.eval_sets:
        ids, states, _ = states_of(qs, greedy_runs[qs.label])
        for qid, value in zip(ids, probe.scores(states[:, list(layers).index(probe.layer)])):
            scores[(qs.label, qid)] = float(value)
    return scores


def summarize_signals(readings: Sequence[dict], linear: dict[tuple[str, str], float] | None = None,
                      seed: int = 0) -> list[SignalResult]:
    """Each signal's AUROC against EM and cover-EM, per evaluation set and over all of them."""
    linear = linear or {}
    sets = sorted({r["set"] for r in readings})
    results = []
    for name in [*sets, "all"] if len(sets) > 1 else sets:
        chosen = [r for r in readings if name == "all" or r["set"] == name]
        for signal in SIGNALS:
            if signal == "linear":
                values = [linear.get((r["set"], r["question_id"])) for r in chosen]
            else:
                values = [r.get(signal.replace("-", "_")) for r in chosen]
            if not values or any(v is None for v in values):
                continue
            for label, key in (("EM", "em"), ("cover-EM", "cover_em")):
                y = [bool(r[key]) for r in chosen]
                if all(y) or not any(y):
                    continue
                results.append(SignalResult(signal, label, name, len(y), sum(y), auroc(values, y, seed=seed)))
    return results


def format_signals(results: Sequence[SignalResult], settings: ProbeSettings) -> str:
    """The measurement's table and its one-line verdict: which signals reach TARGET (their interval's
    lower end, and their estimate)."""
    lines = [f"## Belief signals of {settings.llm}" + (f" + {settings.lora}" if settings.lora else ""), "",
             "AUROC against the closed-book greedy answer's correctness (95 % bootstrap CI over questions, "
             "10,000 resamples); 0.5 is chance.", "",
             "| signal | label | questions | n | right | AUROC | 95 % CI |", "|---|---|---|---:|---:|---:|---|"]
    for r in results:
        lines.append(f"| {r.signal} | {r.label} | {r.questions} | {r.n} | {r.right} | {r.auroc.estimate:.3f} | "
                     f"{r.auroc.low:.3f}–{r.auroc.high:.3f} |")
    overall = [r for r in results if r.label == "EM" and r.questions == ("all" if any(
        x.questions == "all" for x in results) else r.questions)]
    passing = [r.signal for r in overall if r.auroc.estimate >= TARGET]
    sure = [r.signal for r in overall if r.auroc.low >= TARGET]
    lines += ["", f"Reaching AUROC {TARGET} on EM over all questions: "
              + (", ".join(passing) if passing else "none")
              + (f"; with the whole 95 % CI above it: {', '.join(sure)}" if sure else "") + "."]
    sets = sorted({r.questions for r in results if r.questions != "all"})
    if len(sets) > 1:  # pooled, a signal can pass by telling the sets apart (their closed-book EM differs)
        within = [name for name in dict.fromkeys(r.signal for r in overall)
                  if all(any(r.signal == name and r.label == "EM" and r.questions == q and r.auroc.estimate >= TARGET
                             for r in results) for q in sets)]
        lines.append(f"Within each set ({', '.join(sets)}): " + (", ".join(within) if within else "none") + ".")
    return "\n".join(lines)


def _plain(settings: ProbeSettings) -> dict:
    raw = asdict(settings)
    raw["eval_sets"] = [q.label for q in settings.eval_sets]
    raw["train_sets"] = [q.label for q in settings.train_sets]
    return raw
