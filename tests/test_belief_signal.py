"""`metarag probe`: AUROC with its bootstrap interval, the readings of each belief signal, the linear probe
trained on training questions only, and the measurement end to end on a scripted model."""
import json

import numpy as np
import pytest

from metarag.errors import ConfigError, DataError
from metarag.evaluate.belief_signal import (
    ProbeSettings,
    QuestionSet,
    agreement,
    auroc,
    default_layers,
    first_step_context,
    fit_linear_probe,
    measure,
    read_probe,
)
from metarag.llm.scripted import ScriptedLLM


def test_auroc_by_hand_and_against_the_rank_formula():
    # pairs (right, wrong): 0.35 > 0.1, 0.35 < 0.4, 0.8 > both -> 3 of 4
    assert auroc([0.1, 0.4, 0.35, 0.8], [0, 0, 1, 1]).estimate == pytest.approx(0.75)
    assert auroc([0.5, 0.5, 0.5, 0.5], [0, 1, 0, 1]).estimate == pytest.approx(0.5)  # ties count one half
    sklearn = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(0)
    labels = rng.random(300) < 0.3
    scores = rng.normal(0, 1, 300) + 0.8 * labels
    ci = auroc(scores, labels, seed=1)
    assert ci.estimate == pytest.approx(sklearn.roc_auc_score(labels, scores))
    assert ci.low < ci.estimate < ci.high and ci == auroc(scores, labels, seed=1)
    # a synthetic signal with a known AUROC: Phi(0.8 / sqrt 2) = 0.714, inside the interval
    assert ci.low < 0.714 < ci.high
    with pytest.raises(DataError, match="right and wrong answers"):
        auroc([0.1, 0.2], [1, 1])


def test_agreement_is_the_share_of_samples_equal_to_the_greedy_answer():
    assert agreement("The Paris", ["paris", "Paris.", "Lyon", "the paris"]) == 0.75
    assert agreement("", ["x"]) == 0.0


def test_the_probe_reads_the_agents_first_context_with_the_papers_instruction():
    llm = ScriptedLLM(label_rules=[("capable of answering the question confidently", {"Yes": 0.6, "No": 0.2})])
    assert read_probe(llm, "Who?") == pytest.approx(0.75 - 0.25)
    assert "Your question: Who?" in first_step_context("Who?")
    # no mass on either label: 1/2 each, b = 0 (the agent's rule)
    assert read_probe(ScriptedLLM(label_rules=[(".", {"Yes": 0.0, "No": 0.0})]), "Who?") == 0.0


def test_the_linear_probe_picks_its_layer_by_cross_validation_on_training_questions():
    pytest.importorskip("sklearn")
    rng = np.random.default_rng(3)
    y = rng.random(200) < 0.4
    states = rng.normal(0, 1, (200, 3, 8)).astype(np.float32)
    states[:, 1, 0] += 2.0 * y  # only layer "8" (index 1) carries the label
    probe = fit_linear_probe(states, y, (4, 8, 12))
    assert probe.layer == 8 and probe.cv_auroc > 0.8
    fresh_y = rng.random(100) < 0.4
    fresh = rng.normal(0, 1, (100, 8))
    fresh[:, 0] += 2.0 * fresh_y
    assert auroc(probe.scores(fresh), fresh_y).estimate > 0.8
    assert default_layers(28) == (4, 8, 12, 16, 20, 24, 28) and default_layers(2) == (2,)


def test_settings_refuse_what_cannot_be_measured():
    with pytest.raises(ConfigError, match="K >= 2"):
        ProbeSettings(samples=1)
    with pytest.raises(ConfigError, match="without --lora"):
        ProbeSettings(lora="adapter.gguf", hidden_llm="hf")
    assert QuestionSet.parse("2wiki-dev1000:headline200") == QuestionSet("2wiki-dev1000", "headline200")


def test_the_measurement_end_to_end_on_a_scripted_model(tmp_path):
    from metarag.data.datasets import resolve_preset

    demo = resolve_preset("demo")
    golds = {q.text: q.answers[0] for q in demo.questions}
    twice = {t for t in golds if sum(q.text == t for q in demo.questions) > 1}  # one text, two golds
    known = {q.text for q in demo.questions[::3]} - twice  # the model knows every third question ...

    def answer(prompt: str) -> str:
        question = prompt.rsplit("Question: ", 1)[1].split("\n<assistant>")[0]
        return golds[question] if question in known else "I do not know"

    def belief(prompt: str) -> dict:
        question = prompt.split("Your question: ", 1)[1].split("\n", 1)[0]
        return {"Yes": 0.9, "No": 0.1} if question in known else {"Yes": 0.3, "No": 0.7}

    class Believing(ScriptedLLM):  # ... and its probe says so
        def score_labels(self, prompt, labels):
            from metarag.records import LabelScores

            text = prompt[-1].content
            p = belief(text)
            return LabelScores(tuple(labels), tuple(p[label] for label in labels))

    llm = Believing([("Question:", answer)])
    settings = ProbeSettings(llm="embedded", samples=3, eval_sets=(QuestionSet("demo"),))
    results = measure(settings, tmp_path / "probe", tmp_path / "runs", llm=llm)
    by = {(r.signal, r.label): r for r in results}
    assert by[("probe", "EM")].auroc.estimate == pytest.approx(1.0)
    assert by[("probe", "EM")].n == 100 and by[("probe", "EM")].right == len(known)
    # a scripted model samples what it answers greedily: full agreement everywhere tells nothing
    assert by[("agreement", "EM")].auroc.estimate == pytest.approx(0.5)
    report = (tmp_path / "probe" / "report.md").read_text()
    assert f"| probe | EM | demo | 100 | {len(known)} | 1.000 |" in report and "Reaching AUROC 0.65 on EM" in report
    lines = (tmp_path / "probe" / "signals.jsonl").read_text().splitlines()
    assert len(lines) == 100 and json.loads(lines[0])["probe"] is not None
    # resumed: nothing is read again
    quiet = Believing([("Question:", answer)])
    measure(settings, tmp_path / "probe", tmp_path / "runs", llm=quiet)
    assert (tmp_path / "probe" / "signals.jsonl").read_text().count("\n") == 100
    assert not any("capable of answering" in p for p in quiet.prompts)


def _demo_model(yes: float):
    from metarag.records import LabelScores

    class Fixed(ScriptedLLM):
        def score_labels(self, prompt, labels):
            return LabelScores(tuple(labels), tuple(yes if label == "Yes" else 1 - yes for label in labels))

    return Fixed([("Question:", "Paris")])


def test_with_an_adapter_the_frozen_probe_reads_the_starting_weights(tmp_path):
    adapter = tmp_path / "adapter.gguf"
    adapter.write_bytes(b"GGUF" + bytes(60))  # hashed into the run id only: the scripted models stand in
    settings = ProbeSettings(llm="embedded", lora=str(adapter), samples=0, eval_sets=(QuestionSet("demo"),))
    policy, frozen = _demo_model(0.8), _demo_model(0.25)
    measure(settings, tmp_path / "p", tmp_path / "runs", llm=policy, frozen_llm=frozen)
    first = json.loads((tmp_path / "p" / "signals.jsonl").read_text().splitlines()[0])
    assert first["probe"] == pytest.approx(0.6) and first["probe_frozen"] == pytest.approx(-0.5)
    assert first["agreement"] is None


def test_the_linear_probe_reads_hidden_states_of_the_closed_book_prompt(tmp_path):
    pytest.importorskip("sklearn")
    from tiny_hf import tiny_llm

    from metarag.evaluate.belief_signal import last_token_states
    from metarag.records import Message

    hidden = tiny_llm()
    states = last_token_states(hidden, (Message("user", "Question: Who built the tower?"),), (0, 1, 2))
    assert states.shape == (3, 64) and np.isfinite(states).all()
    # the training set's right and wrong answers: a model that knows the first 40 of 100 demo questions
    from metarag.data.datasets import resolve_preset

    known = {q.text for q in resolve_preset("demo").questions[:40]}
    settings = ProbeSettings(llm="embedded", hidden_llm="hf", samples=0, eval_sets=(QuestionSet("demo"),),
                             train_sets=(QuestionSet("demo"),), layers=(1, 2))

    def answers(prompt: str) -> str:
        from metarag.data.datasets import resolve_preset

        question = prompt.rsplit("Question: ", 1)[1].split("\n<assistant>")[0]
        gold = {q.text: q.answers[0] for q in resolve_preset("demo").questions}
        return gold[question] if question in known else "no idea"

    llm = ScriptedLLM([("Question:", answers)], label_rules=[(".", {"Yes": 0.5, "No": 0.5})])
    results = measure(settings, tmp_path / "p", tmp_path / "runs", llm=llm, hidden_llm=hidden)
    chosen = json.loads((tmp_path / "p" / "linear-probe.json").read_text())
    assert chosen["layer"] in (1, 2) and chosen["layers"] == [1, 2]
    assert any(r.signal == "linear" for r in results)
    assert (tmp_path / "p" / "states-demo.npz").is_file()


def test_hidden_states_read_before_a_kill_are_not_read_again(tmp_path):
    """The hidden states are saved every STATES_EVERY questions (states-<set>.partial.npz): a probe killed
    at the 61st question reads only the 50 it had not saved when started again, and the finished file
    holds every question's states in the run's order."""
    pytest.importorskip("sklearn")
    from tiny_hf import tiny_llm

    from metarag.evaluate.belief_signal import STATES_EVERY

    assert STATES_EVERY == 25
    hidden = tiny_llm()

    class Counting:
        def __init__(self, fail_at: int | None = None):
            self.calls, self.fail_at, self.identity = 0, fail_at, hidden.identity

        def chat(self, prompt, decoding):
            self.calls += 1
            if self.calls == self.fail_at:
                raise RuntimeError("killed")
            return hidden.chat(prompt, decoding)

    from metarag.data.datasets import resolve_preset

    demo = resolve_preset("demo").questions
    known, gold = {q.text for q in demo[:40]}, {q.text: q.answers[0] for q in demo}

    def answers(prompt: str) -> str:
        question = prompt.rsplit("Question: ", 1)[1].split("\n<assistant>")[0]
        return gold[question] if question in known else "no idea"

    settings = ProbeSettings(llm="embedded", hidden_llm="hf", samples=0, eval_sets=(QuestionSet("demo"),),
                             train_sets=(QuestionSet("demo"),), layers=(1, 2))
    llm = ScriptedLLM([("Question:", answers)], label_rules=[(".", {"Yes": 0.5, "No": 0.5})])
    dying = Counting(fail_at=61)
    with pytest.raises(RuntimeError, match="killed"):
        measure(settings, tmp_path / "p", tmp_path / "runs", llm=llm, hidden_llm=dying)
    assert (tmp_path / "p" / "states-demo.partial.npz").is_file() and not (tmp_path / "p" / "states-demo.npz").exists()
    again = Counting()
    measure(settings, tmp_path / "p", tmp_path / "runs", llm=llm, hidden_llm=again)
    assert again.calls == 50
    final = np.load(tmp_path / "p" / "states-demo.npz")
    assert final["states"].shape == (100, 2, 64) and not (tmp_path / "p" / "states-demo.partial.npz").exists()
    fresh = [last_token_states_of(hidden, tmp_path, i) for i in (0, 99)]
    assert np.allclose(final["states"][0], fresh[0], atol=1e-5)
    assert np.allclose(final["states"][99], fresh[1], atol=1e-5)


def last_token_states_of(hidden, tmp_path, index: int):
    """The states of the index-th question's closed-book prompt, read anew from the kept run."""
    from metarag.evaluate.belief_signal import last_token_states
    from metarag.evaluate.report import load_run

    [run_dir] = [p for p in (tmp_path / "runs").iterdir() if p.name.startswith("closed-book")]
    result = load_run(run_dir).results[index]
    prompt = next(s.prompt for s in result.trace.steps if getattr(s, "purpose", None) == "answer")
    return last_token_states(hidden, prompt, (1, 2))


def test_the_verdict_says_which_signals_pass_within_each_set_not_only_pooled():
    """Pooled over two sets whose closed-book EM differs, a signal can pass by telling the sets apart:
    the verdict names the signals that reach 0.65 within every set apart."""
    from metarag.evaluate.belief_signal import SignalResult, format_signals
    from metarag.evaluate.stats import Interval

    def r(signal, questions, estimate):
        return SignalResult(signal, "EM", questions, 200, 50, Interval(estimate, estimate - .05, estimate + .05, .95))

    results = [r("probe", "a", 0.55), r("probe", "b", 0.70), r("probe", "all", 0.68),
               r("agreement", "a", 0.70), r("agreement", "b", 0.74), r("agreement", "all", 0.72)]
    text = format_signals(results, ProbeSettings(llm="embedded", eval_sets=(QuestionSet("demo"),)))
    assert "Reaching AUROC 0.65 on EM over all questions: probe, agreement; with the whole 95 % CI above it: " \
           "agreement." in text
    assert "Within each set (a, b): agreement." in text


def test_out_of_fold_beliefs_never_see_their_own_label_and_follow_the_signal(tmp_path):
    """scripts/belief-table --linear: each pool question's p_right from a probe fitted on the other folds.
    On synthetic states where one direction carries the label, the out-of-fold probabilities rank right
    above wrong (AUROC well above chance) and are calibrated near the base rate; on noise they are at
    chance (no question's own label reaches its belief). The script writes one record per pool question
    from a probe folder."""
    import subprocess
    import sys
    from pathlib import Path

    from metarag.evaluate.belief_signal import auroc, out_of_fold_p_right

    rng = np.random.default_rng(0)
    n, width = 300, 16
    y = rng.random(n) < 0.25
    states = rng.normal(size=(n, width))
    states[:, 0] += 1.5 * y
    p = out_of_fold_p_right(states, y, c=1.0)
    assert auroc(p, y).estimate > 0.8 and abs(p.mean() - y.mean()) < 0.05
    # on pure noise a probe fitted on all questions would "know" its training labels; out of fold, chance
    noise = rng.normal(size=(n, 200))
    assert abs(auroc(out_of_fold_p_right(noise, y, c=1.0), y).estimate - 0.5) < 0.1

    probe = tmp_path / "probe"
    probe.mkdir()
    (probe / "settings.json").write_text(json.dumps({"train_sets": ["a", "b:pool"], "seed": 0}))
    (probe / "linear-probe.json").write_text(json.dumps({"layer": 8, "C": 1.0, "layers": [4, 8]}))
    ids = [f"q{i}" for i in range(n)]
    layered = np.stack([rng.normal(size=(n, width)), states], axis=1)  # layer 8 is the informative one
    np.savez(probe / "states-a.npz", ids=np.array(ids[:100]), layers=np.array([4, 8]), states=layered[:100],
             em=y[:100].astype(float))
    np.savez(probe / "states-b.pool.npz", ids=np.array(ids[100:]), layers=np.array([4, 8]), states=layered[100:],
             em=y[100:].astype(float))
    pool = tmp_path / "pool.jsonl"
    pool.write_text("".join(json.dumps({"id": q}) + "\n" for q in ids[::3]))
    script = Path(__file__).parents[1] / "scripts" / "belief-table"
    out = tmp_path / "beliefs.jsonl"
    done = subprocess.run([sys.executable, str(script), "--linear", str(probe), str(pool), str(out)],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["question_id"] for r in rows] == ids[::3] and all(0 <= r["p_right"] <= 1 for r in rows)
    assert np.allclose([r["p_right"] for r in rows], p[::3], atol=1e-6)
    pool.write_text(json.dumps({"id": "elsewhere"}) + "\n")
    refused = subprocess.run([sys.executable, str(script), "--linear", str(probe), str(pool), str(out)],
                             capture_output=True, text=True)
    assert refused.returncode != 0 and "1 pool questions are not among the probe's training questions" in refused.stderr
