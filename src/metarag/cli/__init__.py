"""The `metarag` command: parses arguments, calls library functions, prints. No logic of its own.

`build_parser` gathers the commands of this package's modules: evaluation.py (eval, sweep, report,
experiment, probe, calibrate-judges), training.py (the trainers), answering.py (ask, index,
serve-retriever) and info.py (view, methods, doctor); args.py declares the options they share, those of
a run generated from `evaluate.options.OPTIONS`.
"""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from metarag.cli import answering, evaluation, info, training
from metarag.cli.args import (  # noqa: F401 (the helpers the tests and scripts import from metarag.cli)
    add_corpus_args,
    add_eval_args,
    add_llm_args,
    add_method_args,
    add_options,
    add_reranker_args,
    eval_config_from_args,
    llm_spec_from_args,
    port_number,
    positive_int,
    raise_config,
    retriever_name,
)
from metarag.errors import MetaRAGError


def main(argv: Sequence[str] | None = None) -> int:
    show_library_notes()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except MetaRAGError as exc:
        print(f"metarag: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("metarag: interrupted", file=sys.stderr)
        return 130


class _StderrLines(logging.Handler):
    """Each record as one plain line on the current `sys.stderr`, as the library's notes read when it
    printed them (the stream looked up at each line, so a redirected stderr gets them too)."""

    def emit(self, record: logging.LogRecord) -> None:
        print(self.format(record), file=sys.stderr)


def show_library_notes() -> None:
    """Let the library's notes and warnings (`logging.getLogger(__name__)` in each module: an index
    being built, a run resumed, questions left out) reach stderr at INFO; other packages' logs are
    left as they are. Once per process."""
    logger = logging.getLogger("metarag")
    if not any(isinstance(h, _StderrLines) for h in logger.handlers):
        logger.addHandler(_StderrLines())
    logger.setLevel(logging.INFO)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metarag",
        description="Metacognitive and adaptive RAG for multi-hop QA, offline by default.")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND")
    answering.add_ask(sub)
    answering.add_index(sub)
    evaluation.add_eval(sub)
    evaluation.add_sweep(sub)
    evaluation.add_report(sub)
    answering.add_serve_retriever(sub)
    info.add_view(sub)
    training.add_train_critic(sub)
    training.add_train_router(sub)
    training.add_train_agent(sub)
    evaluation.add_experiment(sub)
    info.add_methods(sub)
    info.add_doctor(sub)
    evaluation.add_calibrate_judges(sub)
    evaluation.add_probe(sub)
    return parser
