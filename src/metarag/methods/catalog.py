"""What each of metarag's methods is, for people: its paper, one line on what it does, what it needs
beyond a model and a retriever, and what can be trained for it. `metarag methods` prints this table,
docs/methods.md and the README's methods table are generated from it, and a test keeps every
registered method of ours described here (a method of another package describes itself: the first
line of its class's docstring). Names in `HELPERS` run through the harness but are not methods a user
compares (SIM-RAG's self-practice, which `train-critic` runs), so the table leaves them out.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Card:
    """One method: `paper` (authors, year), `what` it does in a line, `requires` beyond a model and a
    retriever (a trained artifact, a kind of model), `training` what metarag can train for it."""

    paper: str
    what: str
    requires: str = ""
    training: str = ""


CARDS: dict[str, Card] = {
    "closed-book": Card("standard prompting (baseline of Zhou et al., 2024)",
                        "Answers from the model's own knowledge, few-shot, no retrieval."),
    "cot": Card("Wei et al., 2022", "Reasons step by step, then answers; no retrieval."),
    "standard-rag": Card("Lewis et al., 2020", "Retrieves once for the question and answers from the passages."),
    "metarag": Card("Zhou et al., 2024 (reproduced 2025)",
                    "Monitors its answer, evaluates whether its own knowledge and the passages suffice, and "
                    "plans the next retrieval (decompose, rewrite, more passages) until they do.",
                    training="sufficiency thresholds (calibrate-judges)"),
    "sim-rag": Card("Yang et al., 2025",
                    "Answers, lets a critic accept or reject the answer, and searches again on rejection.",
                    requires="the paper's critic is trained (train-critic); the LLM can stand in",
                    training="critic (train-critic)"),
    "evoctx": Card("Chen et al., 2026",
                   "Chooses per step between retrieving and thinking by the distance between its reasoning "
                   "and the evidence gathered so far.", requires="MiniLM encoder (embedded)"),
    "iterdrag": Card("Yue et al., 2025",
                     "Decomposes the question into follow-ups, retrieves and answers each, then answers."),
    "self-ask": Card("Press et al., 2023", "Asks and answers follow-up questions over retrieval, then answers."),
    "ircot": Card("Trivedi et al., 2023",
                  "Interleaves one chain-of-thought sentence with one retrieval, then reads all passages."),
    "search-r1": Card("Jin et al., 2025",
                      "A search agent: reasons, searches with <search> queries and answers in one growing turn.",
                      training="GRPO with the outcome reward (train-agent)"),
    "belief-agent": Card("Qi et al., 2026",
                         "A search agent that verifies a proposed action before acting; trained so that its "
                         "searching agrees with its belief that it can answer.",
                         training="GRPO with the belief-action reward (train-agent)"),
    "search-o1": Card("Li et al., 2025",
                      "Reasons in one long chain, searching when unsure; each search's documents are condensed "
                      "by the model before they join the chain."),
    "r1-searcher": Card("Song et al., 2025", "A search agent continuing one raw prompt, documents injected "
                        "after each query.", training="GRPO, two stages (train-agent)"),
    "autorefine": Card("Shi et al., 2025",
                       "A search agent that refines each search's documents into notes before reasoning on.",
                       training="GRPO with the answer-plus-refine reward (train-agent)"),
    "flare": Card("Jiang et al., 2023",
                  "Writes the answer a sentence at a time and retrieves to rewrite a sentence it is unsure of.",
                  requires="token probabilities (llama.cpp, transformers, servers that return them)"),
    "react": Card("Yao et al., 2023", "Thought, action and observation in turn over the retriever."),
    "reflexion": Card("Shinn et al., 2023",
                      "Retries ReAct episodes, carrying its own reflections on failed ones into the next."),
    "dragin": Card("Su et al., 2024",
                   "Retrieves when a generated token is uncertain and important, with a query from attention.",
                   requires="attention weights and token entropy (transformers back-end)"),
    "dragin-entropy": Card("Su et al., 2024",
                           "DRAGIN's trigger from token entropy alone and a masked-sentence query.",
                           requires="token entropy (llama.cpp, transformers)"),
    "self-rag": Card("Asai et al., 2024",
                     "Decides to retrieve, judges relevance, support and usefulness with reflection tokens.",
                     requires="a Self-RAG checkpoint (hf:PATH)"),
    "self-rag-prompted": Card("Asai et al., 2024",
                              "Self-RAG's algorithm on an instruction model, each reflection asked as a question."),
    "kirag": Card("Fang, Meng & Macdonald, 2025",
                  "Grows a chain of knowledge triples by iterative retrieval and answers from its passages."),
    "adaptive-rag": Card("Jeong et al., 2024",
                         "Classifies the question's complexity and routes it to no, single or iterative retrieval.",
                         requires="the paper's router is trained (train-router); the LLM can classify",
                         training="router (train-router)"),
}

# Run by the harness for a training command, not a method to compare
HELPERS = frozenset({"sim-rag-practice"})

# what a method's `needs` (per-token capabilities, `llm.base.CAPABILITIES`) means in words
CAPABILITY_WORDS = {"token_logprobs": "token probabilities", "token_entropy": "token entropy",
                    "attentions": "attention weights", "hidden_states": "hidden states"}
