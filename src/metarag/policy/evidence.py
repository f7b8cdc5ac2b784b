"""How passages are shown to a model, shared by every retrieval method so prompts stay comparable."""
from __future__ import annotations

from collections.abc import Sequence

from metarag.records import Hit, Message


def format_passages(hits: Sequence[Hit]) -> str:
    """Numbered passages, title then text, in rank order."""
    return "\n\n".join(f"[{i}] {h.passage.title}\n{h.passage.text}" for i, h in enumerate(hits, 1))


# One system line and the passages first, the varying task last: every prompt that a method and its
# judges send over the same evidence then shares a prefix the back-end's KV cache reuses.
EVIDENCE_SYSTEM = "You are a careful assistant for multi-hop question answering. Use the passages given."


def evidence_prompt(passages: str, task: str) -> tuple[Message, ...]:
    """A chat prompt with the shared system line, the formatted passages, then the task."""
    body = f"Passages:\n{passages}\n\n{task}" if passages else task
    return (Message("system", EVIDENCE_SYSTEM), Message("user", body))
