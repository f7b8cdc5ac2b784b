"""How passages are shown to a model, shared by every retrieval method so prompts stay comparable."""
from __future__ import annotations

from collections.abc import Sequence

from metarag.records import Hit


def format_passages(hits: Sequence[Hit]) -> str:
    """Numbered passages, title then text, in rank order."""
    return "\n\n".join(f"[{i}] {h.passage.title}\n{h.passage.text}" for i, h in enumerate(hits, 1))


def clean_answer(text: str) -> str:
    """A short answer as the model wrote it, trimmed to its first line without a closing period,
    quotes or markdown emphasis; used where a prompt asks for the answer alone."""
    line = next((ln for ln in text.strip().splitlines() if ln.strip()), "")
    line = line.strip().strip("*").strip()
    for prefix in ("answer:", "final answer:", "a:"):
        if line.lower().startswith(prefix):
            line = line[len(prefix):].strip()
    line = line.strip().strip("\"'`*").strip()
    return line[:-1].strip() if line.endswith(".") else line
