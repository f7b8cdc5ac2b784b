"""The arguments commands share: argparse types, and the options of a run (`evaluate.options.OPTIONS`)
declared as flags from that table, so `eval`, `sweep`, `ask` and the trainers take the options that
`metarag.run` and experiment files take, under the same names, read into the config by the same function.
"""
from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Iterable

from metarag.errors import ConfigError, MetaRAGError
from metarag.evaluate.options import BY_NAME, LLM_OPTIONS, OPTIONS, config_from_options, llm_spec
from metarag.retrieve.index import check_retriever


def port_number(value: str) -> int:
    """An argparse type: a TCP port, 0..65535."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {value!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0..65535, got {port}")
    return port


def positive_int(value: str) -> int:
    """An argparse type: a whole number of at least 1 (a count of questions, workers, threads ...)."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def retriever_name(value: str) -> str:
    """An argparse type: a retriever's name (`retrieve.index.RETRIEVERS`) or remote:URL."""
    try:
        return check_retriever(value)
    except MetaRAGError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_options(p: argparse.ArgumentParser, names: Iterable[str], *, defaults: bool = False) -> None:
    """Declare the run options `names` on `p`: each one's flags and help from its entry in OPTIONS, its
    value under its name. A flag not given holds None, the config's default (`config_from_options` fills
    it in), or with `defaults` that default itself, for a command that reads the values on its own."""
    from metarag.judges.correctness import PROMPTS

    checked = {"retriever": {"type": retriever_name}, "judge_prompt": {"choices": tuple(PROMPTS)}}
    for name in names:
        option = BY_NAME[name]
        default = option.default if defaults and option.default is not dataclasses.MISSING else None
        kwargs = {"dest": name, "default": default, "help": option.help, **checked.get(name, {})}
        if option.kind is bool:
            kwargs.update(action="store_const", const=not option.default)
        else:
            kwargs["metavar"] = option.metavar
            if option.kind is dict:
                kwargs.update(action="append", default=[] if defaults else None)
            elif option.kind in (int, float):
                kwargs.setdefault("type", positive_int if option.positive else option.kind)
            if option.bare is not None:
                kwargs.update(nargs="?", const=option.bare)
        if option.default is dataclasses.MISSING and not defaults:
            kwargs["required"] = True
        p.add_argument(*option.flag_names, **kwargs)


def add_method_args(p: argparse.ArgumentParser) -> None:
    from metarag.methods.registry import METHODS

    p.add_argument("--method", default="standard-rag",
                   help=f"method to run: {', '.join(METHODS)} (default: standard-rag)")
    p.add_argument("--k", type=int, default=None, help="passages per retrieval (method default: 5)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a method setting by name; repeatable")


def add_corpus_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--corpus", default=None,
                   help="corpus file: JSONL {id,title,text} or {id,contents}, or a HippoRAG JSON corpus "
                        "(default: the HotpotQA train100 demo corpus shipped with metarag)")
    p.add_argument("--index-dir", default=None,
                   help="where indexes live (default: $METARAG_HOME/indexes/<corpus fingerprint>)")


def add_reranker_args(p: argparse.ArgumentParser) -> None:
    add_options(p, ("reranker", "rerank_depth"), defaults=True)


def add_llm_args(p: argparse.ArgumentParser) -> None:
    """The model's options; read with `llm_spec_from_args` (a flag not given: the spec's default)."""
    add_options(p, LLM_OPTIONS)


def add_eval_args(p: argparse.ArgumentParser, *, leave_out: Iterable[str] = ()) -> None:
    """Every option of a run (OPTIONS) but `leave_out`, and --quiet."""
    add_options(p, [option.name for option in OPTIONS if option.name not in set(leave_out)])
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def eval_config_from_args(args: argparse.Namespace):
    """The run the parsed options of `eval` or `sweep` describe (`evaluate.options.config_from_options`)."""
    return config_from_options({name: value for name, value in vars(args).items() if name in BY_NAME})


def llm_spec_from_args(args: argparse.Namespace):
    """The model the parsed LLM options name."""
    return llm_spec(vars(args))


def raise_config(message: str):
    raise ConfigError(message)
