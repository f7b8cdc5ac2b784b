"""AutoRefine (Shi et al., 2025, "Search and Refine During Think: Autonomous Retrieval-Augmented
Reasoning of LLMs", §3), as a policy over the shared runner loop: search, documents, refine — the
model writes `<refine> ... </refine>` to extract the evidence from the documents it was given before
it searches again or answers. Its reward for `train-agent` is `train/rewards.py`'s `autorefine`.

One growing assistant turn, as Search-R1 (whose trainer AutoRefine extends): the model reasons in
`<think>`, searches with `<search> query </search>`, gets the top-k passages inside `<documents>
</documents>`, refines them inside `<refine> </refine>` and answers inside `<answer> </answer>`.
Generation stops at `</search>` / `</answer>`. The action is the first complete `<search>` or
`<answer>` pair of the reply, even an empty one (an empty answer ends the episode, an empty query is
sent); a reply without one is the action "invalid": nothing is retrieved, the model is told how to
write an action, and the episode goes on (the transcript grows at every step, so no loop state
repeats and the shared fixed-point rule has nothing to detect). After the last search turn one
more turn is free: a search there runs nothing. The answer is the last `<answer> ... </answer>` of
the whole response, stripped (`final_answer`). Every step that follows a search records whether
the model refined the documents it got, right after its generation: `Decide("refine",
"refined"|"skipped", {step})` (the refined text itself is in the generation, which the reward reads).

Prompt (`preprocess/data_process/utils.py`, `make_prefix`, template "autorefine"), observation and
invalid-action texts, stop strings and the action reader (`search_r1/llm_agent/generation.py`),
document layout (`_passages2string`) and turn budget (`cmd/eval.sh`) follow
github.com/syr-cn/AutoRefine, in our words and their shape. Per step, in trace order (the contract
of `policy/agent_trace.py`): the step's generation (Generate "agent-step"), the refine decision after a
search, `Decide("agent-step", "search"|"answer"|"invalid", {step, forced})`, and for a search its
Retrieve step; last, why the episode ended, `Decide("stop-reason", "answered"|"max-turns"|"forced")`.
"""
from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from metarag.llm.base import Decoding
from metarag.methods.runner import Policy
from metarag.parsing import clean_answer as clean_line_answer
from metarag.policy.actions import Ask, Clip, Note, Search
from metarag.records import Completion, Hit, Message, Question
from metarag.settings import check_ranges, setting

STOP = ("</search>", "</answer>")
REFINE = re.compile(r"<refine>(.*?)</refine>", re.S)
_ACTION = re.compile(r"<(search|answer)>(.*?)</\1>", re.S)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.S)

# ------------------------------------------------------------------------------------- prompts
INSTRUCTION = (
    "You are a helpful assistant who is good at answering questions by calling a search engine over several "
    "turns. To answer a question, first reason through the information you have inside <think> and </think>. "
    "If you find some knowledge missing, you may send a search request with <search> query </search> at any "
    "time. The retrieval system gives you the three most relevant documents inside <documents> and "
    "</documents>. After each search, summarize and refine the documents so far inside <refine> and "
    "</refine>. You may send several search requests if needed. Once you have enough information, give a "
    "concise final answer inside <answer> and </answer>. For example, <answer> Donald Trump </answer>. "
    "Question: {question}\n")
DOCUMENTS_BLOCK = "\n\n<documents>{documents}</documents>\n\n"
DOCUMENT = "Doc {n}(Title: {title}) {text}\n"
INVALID_NOTE = ("\nMy previous action is invalid. To search, I should put the query between <search> and "
                "</search>. To give the final answer, I should put it between <answer> and </answer>. "
                "Let me try again.\n")
# the last turn, when the answer is forced: the reply starts inside the answer tag
FORCE_NOTE = "\nI have no searches left, so I give the final answer now.\n"
FORCE_PREFIX = "<answer>"
# why an episode ended: an answer action (the authors' `done`), the free final turn spent, ours
ANSWERED, MAX_TURNS, FORCED = "answered", "max-turns", "forced"


@dataclass(frozen=True)
class AutoRefineSettings:
    """AutoRefine as its authors evaluate it (`cmd/eval.sh`; training in `cmd/train.sh`).

    `T` 4 generations: the Search-R1 trainer's `max_turns` = 3 (eval.sh) search turns, then one final
    turn (train.sh trains with `max_turns` = 5: `train-agent --max-turns 5`). The final turn is free,
    as `run_llm_loop`'s final rollout (`search_r1/llm_agent/generation.py`, lines 278-310): a search
    there runs nothing and the episode ends. `k` 3 passages per search (`retriever.topk`),
    `step_max_tokens` 512 (`max_response_length`), `max_obs_tokens` 1024: a documents block longer
    than that many tokens of the run's model is cut there (eval.sh's `max_obs_length`; train.sh's is
    512; 0: never cut). Ours, off, each named in a report's row: `force_answer` starts the final
    turn's reply inside `<answer>`, so the episode ends with an answer (as `search-r1`);
    `clean_answer` reads the answer as the other methods' short answers are read
    (`parsing.clean_answer`: its first non-empty line, labels and quotes removed) instead of the
    authors' stripped tag content."""

    T: int = setting(4, ge=1)
    k: int = setting(3, ge=1)
    step_max_tokens: int = setting(512, ge=1)
    max_obs_tokens: int = setting(1024, ge=0)
    force_answer: bool = setting(False, metadata={"departure": "forced answer"})
    clean_answer: bool = setting(False, metadata={"departure": "cleaned answer"})

    def __post_init__(self) -> None:
        check_ranges(self)


def format_documents(hits: Sequence[Hit]) -> str:
    """The passages of one search as the documents block shows them, best first."""
    return "".join(DOCUMENT.format(n=i, title=h.passage.title, text=h.passage.text) for i, h in enumerate(hits, 1))


def read_action(reply: str) -> tuple[str, str]:
    """(action, content) of one reply: the first complete `<search>` or `<answer>` pair, its content
    stripped, even empty, as the authors' `postprocess_predictions` (`generation.py`, lines 407-436);
    ("invalid", "") without one."""
    found = _ACTION.search(reply)
    if found is None:
        return "invalid", ""
    return found.group(1), found.group(2).strip()


def final_answer(response: str) -> str:
    """The answer of an episode as the authors score it (`extract_solution`,
    `verl/utils/reward_score/qa_em.py`, lines 147-157): the last `<answer> ... </answer>` of the
    response (every generation and every observation after the prompt), stripped; "" without one.
    The invalid-action message holds "<answer> and </answer>" (theirs and ours), so an episode with
    an invalid step and no answer after it answers "and", as theirs does."""
    found = _ANSWER.findall(response)
    return found[-1].strip() if found else ""


def closed(out: Completion) -> str:
    """The reply with the closing tag its stop string cut restored."""
    return out.text + (out.stop or "") if out.finish_reason == "stop" else out.text


class AutoRefine:
    """AutoRefine: Search-R1's growing turn with `<documents>` and the model's `<refine>` step."""

    name = "autorefine"
    # 2: the authors' free final turn (force_answer off), empty pairs read as actions, the answer the response's
    # last <answer> (clean_answer off), and the stop reason in the trace
    revision = 2

    def __init__(self, settings: AutoRefineSettings = AutoRefineSettings()):
        self.settings = settings

    def policy(self, question: Question) -> Policy:
        s = self.settings
        user = Message("user", INSTRUCTION.format(question=question.text))
        transcript = ""
        searched = False  # the previous step searched: this step should refine what it got
        for t in range(s.T):
            last = t == s.T - 1
            forced = s.force_answer and last
            turn = transcript + (FORCE_NOTE + FORCE_PREFIX if forced else "")
            prompt = (user, Message("assistant", turn)) if turn else (user,)
            out = yield Ask("agent-step", prompt, Decoding(max_tokens=s.step_max_tokens, stop=STOP, logprobs=1))
            reply = closed(out)
            if forced:  # the reply opened inside <answer>; one that ended without a stop string is closed here
                reply = FORCE_PREFIX + reply + ("</answer>" if out.finish_reason != "stop" else "")
                action = "answer" if out.stop != "</search>" and final_answer(reply) else "invalid"
            else:
                action = read_action(reply)[0]
            if searched:
                yield Note("refine", "refined" if REFINE.search(reply) else "skipped", (("step", float(t)),))
            yield Note("agent-step", action, (("step", float(t)), ("forced", float(forced))))
            if action == "answer" or last:
                reason = FORCED if forced else ANSWERED if action == "answer" else MAX_TURNS
                yield Note("stop-reason", reason, (("step", float(t)),))
                answer = final_answer(transcript + (FORCE_NOTE if forced else "") + reply)
                return (clean_line_answer(answer) or answer) if s.clean_answer else answer
            searched = action == "search"
            if searched:
                hits = list((yield Search(read_action(reply)[1], s.k)))
                observation = DOCUMENTS_BLOCK.format(documents=format_documents(hits).strip())
                if s.max_obs_tokens:
                    observation = yield Clip("documents", observation, s.max_obs_tokens)
                transcript += reply + observation
            else:
                transcript += reply + INVALID_NOTE
        return ""  # T >= 1: every episode returns above
