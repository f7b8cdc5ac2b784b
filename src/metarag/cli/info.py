"""`metarag view`, `methods` and `doctor`: run folders in a browser, the methods and their settings, and
the installation's health."""
from __future__ import annotations

import argparse
import sys

from metarag.cli.args import port_number


def add_view(sub) -> None:
    vw = sub.add_parser("view", help="a local web page over run folders (question by question, traces, pictures)",
                        description="Serve a read-only page over run folders: the report table and each run's "
                                    "manifest, every question with each run's answer and cost (filters, sorting, "
                                    "paired wins and losses), and each trace step by step with pictures. Bound to "
                                    "127.0.0.1 unless --host says otherwise; nothing is fetched from the internet.")
    vw.add_argument("runs", nargs="+", metavar="RUN",
                    help="run folders (runs/<run-id>); a folder of run folders (runs/) stands for every run in it")
    vw.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1; 0.0.0.0: every "
                    "interface)")
    vw.add_argument("--port", type=port_number, default=8100, help="port, 0..65535 (0: a free one; default: 8100)")
    vw.set_defaults(handler=cmd_view)


def add_methods(sub) -> None:
    me = sub.add_parser("methods", help="list the methods (ours, installed packages', registered), or one's settings",
                        description="Every method: its paper, what it does, what it needs beyond a model and a "
                                    "retriever, what can be trained for it; with a name, each setting's type, default "
                                    "and range or choices, and the settings' docstring (the paper and section behind "
                                    "each default). Generated from the registry and the settings classes.")
    me.add_argument("name", nargs="?", help="a method's name")
    me.add_argument("--markdown", action="store_true",
                    help="the whole reference page of metarag's methods (docs/methods.md): the table, then each "
                         "method's settings")
    me.set_defaults(handler=cmd_methods)


def add_doctor(sub) -> None:
    dr = sub.add_parser("doctor", help="check the installation before a long run",
                        description="Check llama.cpp's build and CPU features (AMX kernels compiled in or not), "
                                    "each embedded model and its sha256, a one-token decode in a child process, "
                                    "the dense encoder, and which optional extras are installed. Exits non-zero "
                                    "on any failure.")
    dr.add_argument("--no-decode", action="store_true", help="skip the one-token decode")
    dr.add_argument("--no-encoder", action="store_true", help="skip loading the dense encoder")
    dr.add_argument("--decode-model", default="qwen2.5-coder-1.5b-instruct",
                    help="the embedded model of the decode check (default: qwen2.5-coder-1.5b-instruct)")
    dr.set_defaults(handler=cmd_doctor)


def cmd_view(args: argparse.Namespace) -> int:
    from metarag.retrieve.service import check_address
    from metarag.view.server import serve

    check_address(args.host, args.port)

    def listening(url: str, viewer) -> None:
        for view in viewer.views:
            state = view.error or f"{len(view.results)} of {len(view.run.question_ids)} questions finished" + (
                f", {len(view.problems)} problem(s) shown on the page" if view.problems else "")
            print(f"  {view.path}: {state}", file=sys.stderr)
        print(f"metarag view: serving {len(viewer.views)} run folder(s) on {url} (Ctrl-C stops)", file=sys.stderr,
              flush=True)

    serve(args.runs, args.host, args.port, on_listening=listening)
    return 0


def cmd_methods(args: argparse.Namespace) -> int:
    from metarag.api import method_help, method_table

    if args.markdown:
        from metarag.api import methods_markdown

        print(methods_markdown(), end="")
        return 0
    if args.name:
        print(method_help(args.name))
        return 0
    print("| method | paper | what it does | needs | training |\n|---|---|---|---|---|")
    for row in method_table():
        print(f"| {row['method']} | {row['paper']} | {row['what']} | {row['needs'] or '–'} | "
              f"{row['training'] or '–'} |")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from metarag.doctor import report, run_checks
    from metarag.llm.models import embedded_model

    embedded_model(args.decode_model)  # an unknown name fails here, before any check runs
    failures = report(run_checks(decode=not args.no_decode, encoder=not args.no_encoder,
                                 decode_model=args.decode_model), show=lambda line: print(line, flush=True))
    return 1 if failures else 0
