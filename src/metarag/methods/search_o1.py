"""Search-o1 (Li et al., 2025, "Search-o1: Agentic Search-Enhanced Large Reasoning Models", §3), as a
policy over the shared runner loop: the agentic search loop with its query and result markers, and
the Reason-in-Documents step that condenses each search's documents before they enter the chain.

The model reasons in one growing assistant turn. A query is written between `<|begin_search_query|>`
and `<|end_search_query|>`; generation stops at the closing marker. The documents of a search never
enter the chain as they are: a separate call (the Reason-in-Documents step, Generate purpose
"reason-in-documents", then `Decide("reason-in-documents", "found"|"none", {step})`) reads the
previous reasoning, the query and the documents, and only what follows its `**Final Information**`
line is injected, between `<|begin_search_result|>` and `<|end_search_result|>`. A reply without a
complete query ends the episode (the authors' "finished"); so does the turn limit, after the last
turn's search, if it made one, has run. The answer is the last `\\boxed{...}` of the chain, read
as the authors read it (`boxed_answer`). Both calls sample, as the script does (temperature 0.7,
top-p 0.8, top-k 20; Reason-in-Documents with repetition penalty 1.05), seeded by the run's seed
(`methods.runner.question_seed`). The paper runs a large reasoning model (QwQ-32B-Preview); the loop
is prompt-only and runs on any instruction model, which follows the markers less reliably. The
chain grows at every step, so no loop state repeats and the shared fixed-point rule has nothing to
detect.

Prompts and rules follow the authors' release (github.com/sunnynexus/Search-o1):
`scripts/prompts.py` (`get_multiqa_search_o1_instruction`, `get_singleqa_search_o1_instruction`,
`get_task_instruction_openqa`, `get_webpage_to_reasonchain_instruction`), `scripts/run_search_o1.py`
(the loop: stop strings, the search limit and repeated-query messages, the previous-reasoning
digest, the max-turn stop) and `scripts/evaluate.py` (`extract_answer`: the boxed answer and the
"infogen" extraction), in our words and their shape. Per step, in trace order (the contract of
`policy/agent_trace.py`): the step's generation (Generate "agent-step"), `Decide("agent-step",
"search"|"answer"|"invalid", {step, forced, refused})`, and for an executed search its Retrieve step
and the Reason-in-Documents step; last, why the episode ended, `Decide("stop-reason",
"finished"|"max-turn"|"forced")`.
"""
from __future__ import annotations

import json
import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from metarag.llm.base import Decoding
from metarag.methods.runner import Policy
from metarag.policy.actions import Ask, Note, Search
from metarag.records import Hit, Message, Question
from metarag.settings import check_ranges, setting

BEGIN_QUERY, END_QUERY = "<|begin_search_query|>", "<|end_search_query|>"
BEGIN_RESULT, END_RESULT = "<|begin_search_result|>", "<|end_search_result|>"

# ------------------------------------------------------------------------------------- prompts
_INSTRUCTION_HEAD = (
    "You are a reasoning assistant who can search the web to answer the user's question accurately. "
    "You have a special tool:\n\n"
    f"- To search, write {BEGIN_QUERY} your query here {END_QUERY}.\n"
    "The system then searches, analyzes the relevant web pages and gives you the helpful information in the "
    f"format {BEGIN_RESULT} ...search results... {END_RESULT}.\n\n"
    "You may search several times if you need to. At most {max_searches} searches are allowed.\n\n"
    "When you have all the information you need, continue your reasoning.\n\n")
_INSTRUCTION_TAIL = (
    "Remember:\n"
    f"- Use {BEGIN_QUERY} to ask for a web search and end it with {END_QUERY}.\n"
    "- When you are done searching, continue your reasoning.\n\n")
# the authors' multi-hop example (two searches), for HotpotQA, MuSiQue, 2Wiki, Bamboogle ...
MULTI_QA_INSTRUCTION = _INSTRUCTION_HEAD + (
    "Example:\n"
    "Question: \"Which company developed the video game in which Alice David voices Lara Croft?\"\n"
    "Assistant thinking steps:\n"
    "- I need to find out in which video game Alice David voices Lara Croft.\n"
    "- Then I need to find the company that developed that game.\n\n"
    "Assistant:\n"
    f"{BEGIN_QUERY}Alice David Lara Croft voice{END_QUERY}\n\n"
    "(The system returns the processed information from the relevant web pages)\n\n"
    "Assistant thinks: the results say which game Alice David voices Lara Croft in. Now I need the company "
    "that developed it.\n\n"
    "Assistant:\n"
    f"{BEGIN_QUERY}video game developed by Alice David Lara Croft{END_QUERY}\n\n"
    "(The system returns the processed information from the relevant web pages)\n\n"
    "Assistant continues reasoning with the new information...\n\n") + _INSTRUCTION_TAIL
# ... and its single-hop one, for NQ and TriviaQA
SINGLE_QA_INSTRUCTION = _INSTRUCTION_HEAD + (
    "Example:\n"
    "Question: \"Who won the first Nobel Prize in Physics?\"\n"
    "Assistant thinking steps:\n"
    "- I need to find out who received the first Nobel Prize in Physics.\n\n"
    "Assistant:\n"
    f"{BEGIN_QUERY}first Nobel Prize in Physics winner{END_QUERY}\n\n"
    "(The system returns the processed information from the relevant web pages)\n\n"
    "Assistant continues reasoning with the new information...\n\n") + _INSTRUCTION_TAIL
# the open-QA task line: the authors' default, and the shorter one they give QwQ
TASK = {"default": ("Please answer the question below. Think step by step to solve it.\n\n"
                    "Give your final answer in the format \\boxed{{YOUR_ANSWER}}.\n\n"
                    "Question:\n{question}\n\n"),
        "qwq": ("Please answer the question below. Give your final answer in the format "
                "\\boxed{{YOUR_ANSWER}}.\n\nQuestion:\n{question}\n\n")}
# the Reason-in-Documents instruction (`get_webpage_to_reasonchain_instruction`), our words, its shape
REASON_IN_DOCUMENTS = (
    "**Task Instruction:**\n"
    "\n"
    "You read and analyze web pages given three inputs: the **Previous Reasoning Steps**, the "
    "**Current Search Query** and the **Searched Web Pages**. Your goal is to extract from the "
    "**Searched Web Pages** the information that is relevant and helpful for the **Current Search "
    "Query**, and to integrate it seamlessly into the **Previous Reasoning Steps** so that the "
    "reasoning on the original question can go on.\n"
    "\n"
    "**Guidelines:**\n"
    "\n"
    "1. **Analyze the Searched Web Pages:**\n"
    "- Review the content of every searched web page carefully.\n"
    "- Find the facts that bear on the **Current Search Query** and help the reasoning on the "
    "original question.\n"
    "\n"
    "2. **Extract Relevant Information:**\n"
    "- Select the information from the Searched Web Pages that directly moves the **Previous "
    "Reasoning Steps** forward.\n"
    "- Make sure the extracted information is accurate and relevant.\n"
    "\n"
    "3. **Output Format:**\n"
    "- **If the web pages give helpful information for the current search query:** present it after "
    "a line `**Final Information**`, as shown below.\n"
    "**Final Information**\n"
    "\n"
    "[Helpful information]\n"
    "\n"
    "- **If the web pages give no helpful information for the current search query:** output the "
    "text below.\n"
    "\n"
    "**Final Information**\n"
    "\n"
    "No helpful information found.\n"
    "\n"
    "**Inputs:**\n"
    "- **Previous Reasoning Steps:**  \n"
    "{prev_reasoning}\n"
    "\n"
    "- **Current Search Query:**  \n"
    "{search_query}\n"
    "\n"
    "- **Searched Web Pages:**  \n"
    "{document}\n"
    "\n"
    "Now analyze each web page and find the helpful information for the current search query "
    '"{search_query}" and the previous reasoning steps.\n')
FINAL_INFORMATION, MODIFIED_STEPS = "\n**Final Information**", "\n**Modified Reasoning Steps**"
NO_INFORMATION = "No helpful information found."
WEB_PAGE = "**Web Page {n}:**\n{page}\n"
RESULT_BLOCK = f"\n\n{BEGIN_RESULT}{{info}}{END_RESULT}\n\n"
LIMIT_NOTE = f"\n{BEGIN_RESULT}\nThe search limit is reached. You may not search any more.\n{END_RESULT}\n"
REPEAT_NOTE = f"\n{BEGIN_RESULT}\nYou have already searched this query. Use the earlier results.\n{END_RESULT}\n"
# the last turn, when the answer is forced: the reply starts inside the box
FORCE_NOTE = "\n\nI can search no more, so I give the final answer now: "
FORCE_PREFIX = "\\boxed{"
# why an episode ended: the authors' "finished" (a reply without a query), their turn limit, ours
FINISHED, MAX_TURN, FORCED = "finished", "max-turn", "forced"


# ------------------------------------------------------------------------------------ settings
@dataclass(frozen=True)
class SearchO1Settings:
    """Search-o1 as its authors run it on open-domain QA (`scripts/run_search_o1.py` defaults).

    `max_searches` 10 (`--max_search_limit`) and `T` 15 generations (`--max_turn`); `k` 10 passages
    per search (`--top_k`); `step_max_tokens` 8192, the script's budget for a model that is not QwQ
    (QwQ gets 20480 on QA), used for the Reason-in-Documents call too, as the script does.
    `max_doc_chars` 3000: a passage's text is cut there (the script keeps 3000 characters around a
    page's snippet; our passages have no snippet, so the text's start). `instruction` "multi": the
    multi-hop example, which the script uses for HotpotQA, MuSiQue, 2Wiki and Bamboogle ("single":
    its NQ / TriviaQA example). `task` "default": the script's task line for a model that is not
    QwQ ("qwq": the shorter one it gives QwQ; a setting, never guessed from the model's name).
    Sampling, as the script's `SamplingParams`: `temperature` 0.7, `top_p` 0.8, `top_k` 20 for
    both calls; `repetition_penalty` 1.0 for the reasoning chain (the script's for a model that is
    not QwQ; 1.05 for QwQ, lines 210-212) and `rid_repetition_penalty` 1.05 for Reason-in-Documents
    (fixed in `generate_webpage_to_reasonchain_batch`); each request seeded from the run's seed and
    the question (`methods.runner.question_seed`); a run's `--samples` sampling replaces temperature
    and top-p, as for every method. `greedy` (ours, off): both calls decode greedily, the penalties
    kept. The previous reasoning reaches Reason-in-Documents digested as the
    script digests it (`reasoning_digest`). `force_answer` (ours, off): the last turn starts the
    reply inside `\\boxed{` so the episode ends with an answer; the script stops after its 15th
    generation, and an unfinished chain keeps whatever box it holds. `strict_markers` off (ours):
    a Reason-in-Documents reply that opens with its `**Final Information**` (or `**Modified
    Reasoning Steps**`) line counts as marked; the authors' `extract_answer` finds a marker only
    after a newline, which their reasoning model always writes after its thinking, but an
    instruction model opens its reply with the marker, and the strict check then hands the chain
    "No helpful information found." for every search (the 1.5B: all 4 condensed results of its
    first 5 questions thrown away, 3 of them naming the answer); on reproduces the authors' check.
    `greedy` and `force_answer` on are named in a report's row (their field's "departure" label)."""

    T: int = setting(15, ge=1)
    max_searches: int = setting(10, ge=0)
    k: int = setting(10, ge=1)
    step_max_tokens: int = setting(8192, ge=1)
    max_doc_chars: int = setting(3000, ge=1)
    temperature: float = setting(0.7, gt=0)
    top_p: float = setting(0.8, gt=0, le=1)
    top_k: int = setting(20, ge=0)
    repetition_penalty: float = setting(1.0, gt=0)
    rid_repetition_penalty: float = setting(1.05, gt=0)
    instruction: Literal["multi", "single"] = "multi"
    task: Literal["default", "qwq"] = "default"
    greedy: bool = setting(False, metadata={"departure": "greedy"})
    force_answer: bool = setting(False, metadata={"departure": "forced answer"})
    strict_markers: bool = False

    def __post_init__(self) -> None:
        check_ranges(self)

    def decoding(self, max_tokens: int, penalty: float, **fields: Any) -> Decoding:
        """The decoding of one call: the script's sampling, or greedy with `greedy`."""
        sampling = {} if self.greedy else {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k}
        return Decoding(max_tokens=max_tokens, repetition_penalty=penalty, **sampling, **fields)


# ------------------------------------------------------------------------------------- reading
_BOXED = re.compile(r"\\boxed\{(.*)\}")
_TEXT = re.compile(r"\\text\{(.*)\}")


def last_between(text: str, start: str, end: str) -> str | None:
    """The last span between `start` and `end` in `text`, stripped (None without one)."""
    found = re.findall(re.escape(start) + r"(.*?)" + re.escape(end), text, flags=re.S)
    return found[-1].strip() if found else None


def boxed_answer(text: str) -> str:
    """The answer of a chain as the authors' `extract_answer` reads it in "qa" mode
    (`scripts/evaluate.py`, lines 31-42): of the matches of the pattern "boxed{(.*)}" (within a line,
    greedy to the line's last "}") the last; inside it the last `\\text{...}` if any; parentheses stripped
    from its ends. A box not closed on its line is no match; "" without a box."""
    found = _BOXED.findall(text)
    if not found:
        return ""
    inner = found[-1]
    wrapped = _TEXT.findall(inner)
    return (wrapped[-1] if wrapped else inner).strip("()")


def forced_answer(text: str) -> str:
    """The answer of a forced last turn, whose reply starts inside `\\boxed{` and stops at the first
    "}" (ours): its first line, an opening `\\text{` dropped, parentheses and spaces stripped."""
    line = text.split("\n", 1)[0].strip()
    return line.removeprefix("\\text{").strip().strip("()").strip()


def final_information(reply: str, strict: bool = False) -> str:
    """What a Reason-in-Documents reply hands to the chain: the text after its last `**Final
    Information**` line (newlines dropped, code fences stripped), else after `**Modified Reasoning
    Steps**`, else "No helpful information found." (`extract_answer`, mode "infogen"). A marker
    opening the reply counts unless `strict` (the authors' check: only after a newline)."""
    if not strict:
        reply = "\n" + reply
    if FINAL_INFORMATION in reply:
        return reply.split(FINAL_INFORMATION)[-1].replace("\n", "").strip("`").strip()
    if MODIFIED_STEPS in reply:
        return reply.split(MODIFIED_STEPS)[-1].strip("`").strip()
    return NO_INFORMATION


def reasoning_digest(chain: str) -> str:
    """The previous reasoning as Reason-in-Documents reads it: the chain's lines numbered "Step i:",
    the first, the last three and every line holding a query or result marker kept, each run of
    other lines replaced by "..." (all kept when there are at most four lines)."""
    lines = chain.replace("\n\n", "\n").split("\n")
    steps = [f"Step {i}: {line}" for i, line in enumerate(lines, 1)]
    if len(steps) <= 4:
        return "\n\n".join(steps).strip("\n")
    kept: list[str] = []
    for i, step in enumerate(steps):
        if i == 0 or i >= len(steps) - 3 or BEGIN_QUERY in step or BEGIN_RESULT in step:
            kept.append(step)
        elif not kept or kept[-1] != "...":
            kept.append("...")
    return "\n\n".join(kept).strip("\n")


def format_pages(hits: Sequence[Hit], max_chars: int) -> str:
    """The documents of one search as the authors lay out web pages: a numbered header and the
    page's fields as indented JSON."""
    return "".join(WEB_PAGE.format(n=i, page=json.dumps({"title": h.passage.title,
                                                        "context": h.passage.text[:max_chars]},
                                                       ensure_ascii=False, indent=2))
                   for i, h in enumerate(hits, 1))


# -------------------------------------------------------------------------------------- method
class SearchO1:
    """Search-o1: one growing reasoning chain that reads each search's documents condensed first."""

    name = "search-o1"
    # 2: a Reason-in-Documents reply that opens with its marker counts (strict_markers off); 3: the authors'
    # sampling, boxed-answer reader and free last turn (force_answer off), and the stop reason in the trace
    revision = 3

    def __init__(self, settings: SearchO1Settings = SearchO1Settings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        s = self.settings
        instruction = (MULTI_QA_INSTRUCTION if s.instruction == "multi" else SINGLE_QA_INSTRUCTION)
        user = Message("user", instruction.replace("{max_searches}", str(s.max_searches))
                       + TASK[s.task].format(question=question.text))
        chain = ""
        searches, executed = 0, set()
        for t in range(s.T):
            forced = s.force_answer and t == s.T - 1
            opened = chain + (FORCE_NOTE + FORCE_PREFIX if forced else "")
            prompt = (user, Message("assistant", opened)) if opened else (user,)
            stop = ("}",) if forced else (END_QUERY,)
            out = yield Ask("agent-step", prompt, s.decoding(s.step_max_tokens, s.repetition_penalty, stop=stop,
                                                             logprobs=1))
            signals = (("step", float(t)), ("forced", float(forced)))
            if forced:
                answer = forced_answer(out.text)
                yield Note("agent-step", "answer" if answer else "invalid", signals)
                yield Note("stop-reason", FORCED, (("step", float(t)),))
                return answer
            reply = out.text + (END_QUERY if out.finish_reason == "stop" and out.stop == END_QUERY else "")
            chain += reply
            query = last_between(reply, BEGIN_QUERY, END_QUERY)
            if not query or not chain.rstrip().endswith(END_QUERY):
                answer = boxed_answer(chain)
                yield Note("agent-step", "answer" if answer else "invalid", signals)
                yield Note("stop-reason", FINISHED, (("step", float(t)),))
                return answer
            if searches >= s.max_searches or query in executed:
                yield Note("agent-step", "search", signals + (("refused", 1.0),))
                chain += LIMIT_NOTE if searches >= s.max_searches else REPEAT_NOTE
                continue
            yield Note("agent-step", "search", signals + (("refused", 0.0),))
            hits = list((yield Search(query, s.k)))
            searches += 1
            executed.add(query)
            info = yield from reason_in_documents(chain, query, hits, s)
            yield Note("reason-in-documents", "none" if info == NO_INFORMATION else "found", (("step", float(t)),))
            chain += RESULT_BLOCK.format(info=info)
        # the script's turn limit (`run_search_o1.py` lines 683-685): the last turn's search has run, and
        # the chain, unfinished, answers with whatever box it holds
        yield Note("stop-reason", MAX_TURN, (("step", float(s.T - 1)),))
        return boxed_answer(chain)


def reason_in_documents(chain: str, query: str, hits: Sequence[Hit],
                        settings: SearchO1Settings) -> Generator[Any, Any, str]:
    """The Reason-in-Documents step: the condensed information of one search's documents."""
    prompt = REASON_IN_DOCUMENTS.format(prev_reasoning=reasoning_digest(chain), search_query=query,
                                        document=format_pages(hits, settings.max_doc_chars))
    out = yield Ask("reason-in-documents", (Message("user", prompt),),
                    settings.decoding(settings.step_max_tokens, settings.rid_repetition_penalty))
    return final_information(out.text, settings.strict_markers)
