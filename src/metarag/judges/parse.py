"""Explicit, tested rules for reading verdicts out of free model text. Never substring search for
"no" in a sentence, never eval: a rule either finds the verdict where it belongs or says None."""
from __future__ import annotations

import json
import re

_WORD = re.compile(r"[A-Za-z]+")
_LABELLED = re.compile(r"^\W*(?:final\s+)?(?:answer|verdict|decision|judgement|judgment)\s*[:\-]\s*(\w+)",
                       re.IGNORECASE | re.MULTILINE)
_YES = {"yes", "true", "correct", "entailed", "sufficient"}
_NO = {"no", "false", "incorrect", "insufficient"}


def parse_yes_no(text: str) -> bool | None:
    """True / False when the text gives a yes/no verdict, None when it does not.

    Rules, in order: (1) the first word of the text (markdown and punctuation ignored) is a verdict
    word ("Yes", "No.", "**No**"); (2) a labelled line "Answer: yes" / "Verdict: No". Anything else —
    "I cannot say no", "Not sure", an empty reply — is None, for the caller's recorded default.
    """
    words = _WORD.findall(text)
    if words:
        first = words[0].lower()
        if first in _YES:
            return True
        if first in _NO:
            return False
    match = _LABELLED.search(text)
    if match:
        word = match.group(1).lower()
        if word in _YES:
            return True
        if word in _NO:
            return False
    return None


def first_json_object(text: str) -> dict | None:
    """The first balanced {...} in the text that parses as a JSON object (code fences and prose
    around it ignored), or None."""
    start = text.find("{")
    while start != -1:
        depth, in_string, escaped = 0, False, False
        for end in range(start, len(text)):
            ch = text[end]
            if in_string:
                if escaped:
                    escaped = False
                elif ch == "\\":
                    escaped = True
                elif ch == '"':
                    in_string = False
            elif ch == '"':
                in_string = True
            elif ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    try:
                        value = json.loads(text[start:end + 1])
                    except ValueError:
                        break
                    if isinstance(value, dict):
                        return value
                    break
        start = text.find("{", start + 1)
    return None


def labelled_fields(text: str, names: tuple[str, ...]) -> dict[str, str]:
    """`Name: value` lines for the given field names (case-insensitive, markdown bold ignored)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        clean = line.strip().replace("**", "").lstrip("-*# ").strip()
        key, sep, value = clean.partition(":")
        if sep and key.strip().lower() in names and key.strip().lower() not in found:
            found[key.strip().lower()] = value.strip()
    return found
