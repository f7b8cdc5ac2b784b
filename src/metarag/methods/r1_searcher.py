"""R1-Searcher (Song et al., 2025, "R1-Searcher: Incentivizing the Search Capability in LLMs via
Reinforcement Learning", §2), as a policy over the shared runner loop: its query and document markers
and its stop rule at inference; its two-stage rewards for `train-agent` are `train/rewards.py`'s
`r1-searcher-stage1` and `r1-searcher`.

The model continues one raw prompt (no chat template: the authors' evaluation feeds the prompt as
text) that ends "Assistant: <think>". It writes a query between `<|begin_of_query|>` and
`<|end_of_query|>` inside its reasoning and the answer between `<answer>` and `</answer>`;
generation stops at `<|end_of_query|>` or `</answer>`. After a query the loop appends the closing
marker and the top-k passages between `<|begin_of_documents|>` and `<|end_of_documents|>`, and the
model goes on. A reply that stops at neither marker, or whose query is empty once cleaned, ends the
episode with the authors' no-answer "I don't know." (their "shot_down" and "query_inst_error"):
recorded as the action "invalid", never a crash; so does the tenth generation, whatever it holds
(their "many_retrieve"). The prompt grows at every step, so no loop state repeats and the shared
fixed-point rule has nothing to detect.

Markers, prompt (`base_prompt_v0`, the one `evaluation/gen_search.sh` and the README run), stop
strings, query cleaning, document layout ("(1)..." one per line, "None" for no passage) and the
turn limit follow `evaluation/eval_search_loacl.py` of github.com/RUCAIBox/R1-Searcher, in our
words and its shape. Per step, in trace order (the contract of `policy/agent_trace.py`): the step's
generation (Generate "agent-step"), `Decide("agent-step", "search"|"answer"|"invalid", {step,
forced})`, and for a search its Retrieve step; last, why the episode ended, `Decide("stop-reason",
...)` with the authors' `stop_reason_final` ("finished", "shot_down", "query_inst_error",
"many_retrieve"), or "forced".
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from metarag.llm.base import Decoding
from metarag.methods.runner import Policy
from metarag.policy.actions import Ask, Note, Search
from metarag.records import Completion, Hit, Message, Question
from metarag.settings import check_ranges, setting

BEGIN_QUERY, END_QUERY = "<|begin_of_query|>", "<|end_of_query|>"
BEGIN_DOCUMENTS, END_DOCUMENTS = "<|begin_of_documents|>", "<|end_of_documents|>"
ANSWER_OPEN, ANSWER_CLOSE = "<answer>", "</answer>"
STOP = (END_QUERY, ANSWER_CLOSE)

# ------------------------------------------------------------------------------------- prompts
# `base_prompt_v0`, our words in its shape; the reward's reader splits the solution off at ASSISTANT.
ASSISTANT = "\nAssistant: <think>"
PROMPT = (
    "The User asks a question, and the Assistant solves it.\n"
    "The Assistant first thinks through the reasoning process in the mind and then gives the User the final "
    "answer.\nThe reasoning process and the final answer are enclosed in <think> </think> and <answer> </answer> "
    "tags, respectively, i.e., \"<think> reasoning process here </think>\\n\\n<answer> final answer here "
    "</answer>\".\n"
    "While thinking, the Assistant can search for uncertain knowledge if needed, in the format "
    f"\"{BEGIN_QUERY} search query (keywords only) here {END_QUERY}\". **A query must involve only a single "
    "triple**.\n"
    f"The system then gives the Assistant helpful information in the format \"{BEGIN_DOCUMENTS} ...search "
    f"results... {END_DOCUMENTS}\".\n\nUser:{{question}}" + ASSISTANT)
# after a query: its closing marker (cut by the stop) and the documents, one "(n)" line each
DOCUMENTS_BLOCK = f"{END_QUERY}\n\n{BEGIN_DOCUMENTS}\n{{documents}}{END_DOCUMENTS}\n\n"
DOCUMENT = "({n})Title: {title} Text: {text}\n"
NO_DOCUMENTS = "None"
# the last turn, when the answer is forced: the thinking is closed and the answer opened
FORCE_PREFIX = f"</think>\n\n{ANSWER_OPEN}"
# the answer of an episode that gave none, as the authors score it (their `pred_ans`)
NO_ANSWER = "I don't know."
# why an episode ended: the authors' `stop_reason_final` values, and ours for a forced last turn
FINISHED, SHOT_DOWN, QUERY_ERROR, MANY_RETRIEVE, FORCED = (
    "finished", "shot_down", "query_inst_error", "many_retrieve", "forced")


@dataclass(frozen=True)
class R1SearcherSettings:
    """R1-Searcher as its authors evaluate it (`evaluation/eval_search_loacl.py`, `gen_search.sh`).

    `k` 5 passages per query and `step_max_tokens` 512 per generation (its `topk` and
    `max_tokens`); greedy, as `gen_search.sh` runs it (`--temp 0.0`). `T` 10 generations: the
    script's loop drops a question's tenth generation, whatever it holds, and scores "I don't know."
    (lines 203-213, `k == 9`), so at most nine searches. `force_answer` (ours, off; a report names
    the row "forced answer"): that tenth generation starts inside `<answer>` (the thinking closed
    first) and its answer counts, so the episode ends with an answer, as the shared turn-limit rule
    of the search agents here; it leaves every shorter episode unchanged.
    Training (`train-agent`) runs this same prompt: the authors' trainer
    (`OpenRLHF-RAG/openrlhf/trainer/ppo_utils/experience_maker.py`) words the query line a little
    differently, takes the top-3 and cuts the ninth generation (`--max-turns 8 --top-k 3`); their
    Llama-Instruct checkpoint was trained behind its chat template, and is evaluated, as here, on the
    raw prompt (`eval_search_loacl.py` applies no template)."""

    T: int = setting(10, ge=1)
    k: int = setting(5, ge=1)
    step_max_tokens: int = setting(512, ge=1)
    force_answer: bool = setting(False, metadata={"departure": "forced answer"})

    def __post_init__(self) -> None:
        check_ranges(self)


def clean_query(text: str) -> str:
    """A query as the authors send it: quotes and "..." removed, tabs (their keyword separator) made
    spaces; then stripped (they send it unstripped: the retrievers here read its words, so only the
    trace's record of it differs)."""
    return text.replace('"', "").replace("'", "").replace("\t", " ").replace("...", "").strip()


def format_documents(hits: Sequence[Hit]) -> str:
    """The passages of one search as the documents block shows them ("None" for no passage)."""
    if not hits:
        return NO_DOCUMENTS
    return "".join(DOCUMENT.format(n=i, title=h.passage.title, text=h.passage.text) for i, h in enumerate(hits, 1))


def read_step(out: Completion) -> tuple[str, str, str]:
    """(action, content, stop reason) of one reply, as the authors' loop reads it
    (`eval_search_loacl.py`, lines 215-260): an answer when the reply holds `<answer>` and stopped at
    `</answer>` (the text after the last `<answer>`, even empty: "finished"); a search when it holds
    the query marker and stopped at the query's end (the text after the last opening marker, cleaned;
    a query is empty, "query_inst_error", only when nothing at all is left: spaces are a query, as
    their `if query` reads it); otherwise ("invalid", "", "shot_down"). The stop reason of a search
    is ""."""
    stopped = out.stop if out.finish_reason == "stop" else None
    if stopped == ANSWER_CLOSE and ANSWER_OPEN in out.text:
        return "answer", out.text.split(ANSWER_OPEN)[-1].strip(), FINISHED
    if stopped == END_QUERY and BEGIN_QUERY in out.text:
        query = out.text.split(BEGIN_QUERY)[-1]
        cleaned = query.replace('"', "").replace("'", "").replace("\t", " ").replace("...", "")
        return ("search", clean_query(query), "") if cleaned else ("invalid", "", QUERY_ERROR)
    return "invalid", "", SHOT_DOWN


class R1Searcher:
    """R1-Searcher: one raw prompt continued, documents injected after each query."""

    name = "r1-searcher"
    # 2: the authors' last turn (dropped, "I don't know."; force_answer off), their no-answer text and query
    # check, an empty answer an answer, and the stop reason in the trace
    revision = 2

    def __init__(self, settings: R1SearcherSettings = R1SearcherSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        s = self.settings
        text = PROMPT.format(question=question.text)
        for t in range(s.T):
            forced = s.force_answer and t == s.T - 1
            if forced:
                text += FORCE_PREFIX
            out = yield Ask("agent-step", (Message("raw", text),),
                            Decoding(max_tokens=s.step_max_tokens, stop=STOP, logprobs=1))
            signals = (("step", float(t)), ("forced", float(forced)))
            if forced:
                answer = re.split(re.escape(ANSWER_CLOSE), out.text)[0].strip()
                yield Note("agent-step", "answer" if answer else "invalid", signals)
                yield Note("stop-reason", FORCED, (("step", float(t)),))
                return answer
            action, content, reason = read_step(out)
            yield Note("agent-step", action, signals)
            if t == s.T - 1:  # the authors' turn limit: the last generation is dropped
                yield Note("stop-reason", MANY_RETRIEVE, (("step", float(t)),))
                return NO_ANSWER
            if action != "search":
                yield Note("stop-reason", reason, (("step", float(t)),))
                return content if action == "answer" else NO_ANSWER
            hits = list((yield Search(content, s.k)))
            text += out.text.strip() + DOCUMENTS_BLOCK.format(documents=format_documents(hits))
        return NO_ANSWER  # T = 0 cannot be set: every episode returns above
