"""`metarag eval`, `sweep`, `report`, `experiment`, `probe` and `calibrate-judges`: evaluations and
what is read from them."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from metarag.cli.args import add_eval_args, eval_config_from_args, positive_int, raise_config


def add_eval(sub) -> None:
    ev = sub.add_parser("eval", help="evaluate a method over a dataset (resumable)",
                        description="Run a method over a dataset's questions. Each finished question is "
                                    "written at once to runs/<run-id>/results.jsonl; re-running the same "
                                    "command resumes where it stopped.")
    add_eval_args(ev)
    ev.add_argument("--print-run-dir", action="store_true",
                    help="print the run folder these arguments name and exit (no model is loaded)")
    ev.set_defaults(handler=cmd_eval)


def add_sweep(sub) -> None:
    sw = sub.add_parser("sweep", help="evaluate a grid of settings (like the study's Table 3)",
                        description="One evaluation per combination of --vary values, then a table of "
                                    "EM, F1 and per-question counts for each.")
    add_eval_args(sw, leave_out=("shard",))
    sw.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                    help="a method setting and the values to try; repeatable (a grid)")
    sw.add_argument("--plot", default=None, metavar="PNG", help="write metric-versus-value to this PNG")
    sw.set_defaults(handler=cmd_sweep)


def add_report(sub) -> None:
    rp = sub.add_parser("report", help="tables, significance and breakdowns over finished runs",
                        description="One markdown row per run (EM, cover-EM, F1 with 95 % intervals, answer length, "
                                    "yes/no share, requests/q, tokens, latency, retrieval calls/q, USD); with "
                                    "several runs over the same questions, paired tests against a baseline "
                                    "(exact McNemar on EM / cover-EM, permutation and bootstrap CI on F1), "
                                    "Holm-corrected across the table.")
    rp.add_argument("runs", nargs="+", metavar="RUN", help="run folders (runs/<run-id>)")
    rp.add_argument("--baseline", default=None, metavar="RUN",
                    help="the run others are tested against (default: the first)")
    rp.add_argument("--test", action="append", default=None,
                    choices=("auto", "mcnemar", "t-test", "bootstrap", "randomization"),
                    help="paired test(s) for the p-values, repeatable; the first is Holm-corrected and marks * "
                         "(default: auto, the exact McNemar test on EM / cover-EM and a permutation test on F1; "
                         "t-test: the MetaRAG study's paired t-test on every metric)")
    rp.add_argument("--ci", choices=("inline", "columns", "none"), default="inline",
                    help="95 %% intervals as '40.0 (33.5–46.8)' (inline, default), as lo / hi columns, or none "
                         "(the CSV has them as columns either way)")
    rp.add_argument("--power", action="store_true",
                    help="also print, per comparison, the smallest EM difference detectable at 80 %% power given "
                         "the observed discordance, and the questions the observed difference would need")
    rp.add_argument("--csv", default=None, metavar="PATH",
                    help="also write the rows, intervals and p-values as CSV to PATH")
    rp.add_argument("--plot", default=None, metavar="PNG", help="write F1 versus tokens per question")
    rp.add_argument("--prices", default=None, metavar="JSON",
                    help='price table {"model": {"input_per_1m": USD, "output_per_1m": USD}}')
    rp.add_argument("--columns", default=None, metavar="A,B,...",
                    help="the table's columns, by name (default: method,retriever,model,dataset,n,failed,EM,"
                         "cover-EM,F1,words/answer,yes/no,req/q,served req/q,cached req/q,tok/req,served tok/q,"
                         "lat/req,served lat/q,"
                         "retr/q,USD; others: Prec, Rec, reranker, tok/q, passages/q, lat/q, steps/q, prompt tok/q, "
                         "cached tok/q, served prompt tok/q, served completion tok/q, served USD, support recall, "
                         "first recall, <decision>/q (fixed-point/q ...), set:<method setting>, ...; served = "
                         "answered by the model, cached = by the response cache)")
    rp.add_argument("--breakdown", action="store_true",
                    help="also print each run's judge verdicts and decisions (study Table 2)")
    rp.add_argument("--changes", action="store_true",
                    help="also print, for each run, how many answers differ from the baseline's, how many went "
                         "from wrong to right and right to wrong (EM), and how many of those changed only in form "
                         "(cover-EM unchanged): what a change to a method did")
    rp.add_argument("--by-type", action="store_true",
                    help="also print EM per question type (MuSiQue's hops, MultiHop-RAG's query types, HotpotQA's "
                         "bridge / comparison), the types read from the runs' dataset")
    rp.add_argument("--analysis", choices=("evoctx", "agent"), default=None,
                    help="method-specific analyses: evoctx (oracle agreement, action allocation versus "
                         "question-answer distance, confidence across rounds); agent (search-r1 / belief-agent: "
                         "Acc, searches per question, belief-based over/under-search rates, judged under-search)")
    rp.add_argument("--judge-llm", default=None, metavar="SPEC",
                    help="with --analysis agent: run the external under-search judge (belief-action paper, "
                         "Appendix G) with this model over each run's final answers first; its verdicts are kept "
                         "in the run folder (under-search-<id>.jsonl) and reported from then on")
    rp.add_argument("--closed-book", default=None, metavar="RUN",
                    help="with --analysis agent: a closed-book run of the same model over the same questions; each "
                         "agent's searches per question on the questions it does not know (closed-book wrong) and "
                         "on those it does, and, with several runs, how much more each run's searches lean toward "
                         "the questions it does not know than the baseline run's (bootstrap CI)")
    rp.add_argument("--judge-prefix-chunk", type=int, default=0, metavar="C",
                    help="--prefix-chunk for a llama.cpp --judge-llm (exact KV-cache reuse: a verdict does not "
                         "depend on what the judge read before; a new judge id, so verdicts are judged anew)")
    rp.add_argument("--analysis-plots", default=None, metavar="DIR",
                    help="with --analysis evoctx: also draw Figure 4 (trace vs oracle margin) and Figure 3 "
                         "(RETRIEVE ratio vs question-answer distance) of each run as PNGs in DIR")
    rp.set_defaults(handler=cmd_report)


def add_experiment(sub) -> None:
    ex = sub.add_parser("experiment", help="run a table from an experiment file (rows x datasets), then its reports",
                        description="Every row of the file (a method and its settings) on each of its datasets, "
                                    "each an ordinary eval run (resumable, the same run id as the same eval "
                                    "command), then one report per dataset against the file's reference row, "
                                    "its rows also written to RUNS/<name>-<dataset>.csv. experiments/ holds the "
                                    "papers' tables.")
    ex.add_argument("file", metavar="FILE", help="an experiment file (TOML; see experiments/)")
    ex.add_argument("--rows", nargs="+", default=(), metavar="ROW",
                    help='run only these rows ("method" or "method:key=value,..."; one the file lacks runs as an '
                         "extra row); the report still takes every row that has a run folder")
    ex.add_argument("--datasets", nargs="+", default=(), metavar="DATASET", help="only these datasets")
    ex.add_argument("--limit", type=int, default=None, help="questions per dataset (default: the file's)")
    ex.add_argument("--llm", default=None, metavar="SPEC", help="the model (default: the file's)")
    ex.add_argument("--prefix-chunk", type=int, default=None, metavar="C",
                    help="the model's --prefix-chunk on every dataset (default: the file's)")
    ex.add_argument("--runs-dir", default=None, metavar="DIR", help="where the run folders go (default: $METARAG_RUNS, "
                                                                    "else ./runs)")
    ex.add_argument("--report-only", action="store_true", help="run nothing; report the rows that have run folders")
    ex.add_argument("--no-cache", "--no-response-cache", dest="no_cache", action="store_true",
                    help="the runs neither read nor write the persistent response cache")
    ex.add_argument("--quiet", action="store_true", help="no progress bars")
    ex.set_defaults(handler=cmd_experiment)


def add_probe(sub) -> None:
    pb = sub.add_parser("probe", help="how much a belief signal tells about correctness, before training on it",
                        description="The AUROC (95 %% bootstrap CI) against the closed-book answer's correctness of "
                                    "the belief-action paper's probe (P(Yes) - P(No) on the agent's first "
                                    "context), of agreement among K sampled closed-book answers, and of a linear "
                                    "probe on hidden states trained on training questions only; by default on "
                                    "the headline tables' 400 questions, the linear probe trained on the "
                                    "declared training pool. Resumable.")
    pb.add_argument("--llm", default="embedded", metavar="SPEC", help="the model whose belief is read")
    pb.add_argument("--lora", default=None, metavar="PATH",
                    help="a trained adapter: the probe is read from the policy and from the frozen weights")
    pb.add_argument("--hidden-llm", default="", metavar="SPEC",
                    help="the transformers model of the same weights for the linear probe (hf, hf-0.5b)")
    pb.add_argument("--samples", type=int, default=5, metavar="K", help="closed-book samples for agreement (0: none)")
    pb.add_argument("--eval", action="append", default=None, metavar="PRESET[:LIST]",
                    help="evaluation questions (default: hotpotqa-dev500:headline200 and 2wiki-dev1000:headline200)")
    pb.add_argument("--train", action="append", default=None, metavar="PRESET[:LIST]",
                    help="the linear probe's training questions (default: hotpotqa-train100, musique-train100, "
                         "hotpotqa-dev500:train-pool, 2wiki-dev1000:train-pool)")
    pb.add_argument("--threads", type=positive_int, default=None)
    pb.add_argument("--runs-dir", default=None, metavar="DIR", help="where the closed-book runs go (default: "
                    "$METARAG_RUNS, else ./runs)")
    pb.add_argument("--out", required=True, metavar="DIR", help="where the readings and report.md go")
    pb.set_defaults(handler=cmd_probe)


def add_calibrate_judges(sub) -> None:
    cj = sub.add_parser("calibrate-judges", help="choose MetaRAG's sufficiency thresholds on training questions",
                        description="Read a finished MetaRAG run over TRAINING questions, compare each sufficiency "
                                    "judge's P(Yes) with what it was asked (external: all supporting passages "
                                    "retrieved; internal: the closed-book run answers exactly) and print, per "
                                    "judge, the threshold of best balanced accuracy next to the paper's rule "
                                    "(0.5), with the --set flags that use it.")
    cj.add_argument("run", metavar="RUN", help="a MetaRAG run folder over training questions")
    cj.add_argument("--closed-book", metavar="RUN", help="a closed-book run over the same questions (for the "
                                                         "internal-sufficiency target)")
    cj.add_argument("--allow-any", action="store_true", help="allow a run whose dataset is named as a dev/test split")
    cj.add_argument("--out", metavar="JSON", help="also write the thresholds as JSON")
    cj.set_defaults(handler=cmd_calibrate_judges)


def cmd_eval(args: argparse.Namespace) -> int:
    from metarag.evaluate.harness import evaluate, failure_summary
    from metarag.evaluate.report import load_run, report_table

    if args.print_run_dir:
        from metarag.evaluate.harness import prepare

        print(prepare(eval_config_from_args(args))[0].path)
        return 0
    store, results = evaluate(eval_config_from_args(args), progress=not args.quiet)
    run = load_run(store.path)
    table, _ = report_table([run], baseline=None)
    print(table)
    if args.judge_llm is not None:
        from metarag.evaluate.answer_judge import format_answer_judges

        print()
        print(format_answer_judges([run]))
    print(f"run folder: {store.path}")
    failures = [failure_summary(results)]
    if args.judge_llm is not None:
        from metarag.evaluate.harness import judge_failure_summary

        failures.append(judge_failure_summary(store.path))
    for failure in filter(None, failures):
        print(f"metarag: error: {failure}", file=sys.stderr)
    return 1 if any(failures) else 0


def cmd_sweep(args: argparse.Namespace) -> int:
    from metarag.evaluate.report import plot_sweep
    from metarag.evaluate.sweep import parse_vary, sweep

    grid = parse_vary(args.vary)
    table, rows = sweep(eval_config_from_args(args), grid, progress=not args.quiet)
    print(table)
    if args.plot:
        if len(grid) != 1:
            raise_config("--plot draws one varied setting; give one --vary")
        key = next(iter(grid))
        print(f"plot: {plot_sweep(grid[key], rows, args.plot, key)}")
    failed = [row for row in rows if row["failed"]]
    for row in failed:
        print(f"metarag: error: {row['run']}: {row['failed']} of {row['n']} questions have no successful result "
              f"({row['retryable failed']} retryable; --retry-failed retries all); first: {row['first error']}",
              file=sys.stderr)
    return 1 if failed else 0


def cmd_report(args: argparse.Namespace) -> int:
    from metarag.evaluate.cost import load_price_table
    from metarag.evaluate.report import format_report, load_run, plot_runs, write_csv
    from metarag.paths import check_folder

    if args.analysis_plots and args.analysis != "evoctx":
        raise_config("--analysis-plots draws the figures of --analysis evoctx; give both")
    if args.judge_llm and args.analysis != "agent":
        raise_config("--judge-llm runs the under-search judge of --analysis agent; give both")
    if args.closed_book and args.analysis != "agent":
        raise_config("--closed-book splits the searches of --analysis agent; give both")
    if args.judge_prefix_chunk and not args.judge_llm:
        raise_config("--judge-prefix-chunk sets the model of --judge-llm; give both")
    for path in [*args.runs, *filter(None, [args.baseline])]:
        if not (Path(path) / "settings.json").is_file():
            raise_config(f"{path!r} is not a run folder (runs/<run-id>, holding the settings.json that metarag "
                         "eval writes)")
    if args.csv:
        if Path(args.csv).is_dir():
            raise_config(f"--csv {args.csv!r} is a folder; give a file, e.g. {str(Path(args.csv) / 'report.csv')!r}")
        check_folder(Path(args.csv).parent, "the folder of --csv")
    runs = [load_run(path) for path in args.runs]
    baseline = 0
    if args.baseline is not None:
        names = [str(r.path) for r in runs]
        base = load_run(args.baseline)
        if str(base.path) not in names:
            runs.insert(0, base)
            names.insert(0, str(base.path))
        baseline = names.index(str(base.path))
    prices = load_price_table(args.prices) if args.prices else None
    columns = [c.strip() for c in args.columns.split(",") if c.strip()] if args.columns else None
    text, rows = format_report(runs, baseline=baseline, tests=args.test or ("auto",), prices=prices,
                               columns=columns, breakdowns=args.breakdown, types=args.by_type, changes=args.changes,
                               power=args.power, ci=args.ci)
    print(text)
    if args.csv:
        write_csv(rows, args.csv)
        print(f"csv: {args.csv}")
    if args.plot:
        print(f"plot: {plot_runs(rows, args.plot)}")
    if args.analysis == "agent":
        from metarag.evaluate.agent_analysis import format_agent_analysis, judge_run

        if args.judge_llm:
            from metarag.methods.runner import build_named_llm

            judge_llm = build_named_llm(args.judge_llm, prefix_chunk=args.judge_prefix_chunk)
            for run in runs:
                print(f"under-search judge: {judge_run(run, judge_llm)}")
        print()
        print(format_agent_analysis(runs))
        if args.closed_book:
            from metarag.evaluate.agent_analysis import format_alignment_shift, format_search_by_knowledge

            book = load_run(args.closed_book)
            print()
            print(format_search_by_knowledge(runs, book))
            if len(runs) > 1:  # each run's lean toward what the model does not know, against the baseline's
                print()
                print(format_alignment_shift(runs, baseline, book))
    if args.analysis == "evoctx":
        from metarag.evaluate.evoctx_analysis import (
            allocation_vs_distance,
            format_analysis,
            has_decisions,
            plot_analysis,
        )

        for run in runs:
            # a baseline's run gets its efficiency row only: nothing to embed or draw
            allocation = allocation_vs_distance(run) if has_decisions(run) else None
            print()
            print(format_analysis(run, allocation=allocation))
            if args.analysis_plots and allocation is not None:
                for path in plot_analysis(run, args.analysis_plots, allocation=allocation):
                    print(f"plot: {path}")
    return 0


def cmd_experiment(args: argparse.Namespace) -> int:
    from metarag.evaluate.experiment import load_experiment, run_experiment, with_overrides
    from metarag.evaluate.harness import runs_dir_default
    from metarag.paths import check_folder

    experiment = with_overrides(load_experiment(args.file), limit=args.limit, prefix_chunk=args.prefix_chunk)
    runs_dir = check_folder(args.runs_dir or runs_dir_default(),
                            "--runs-dir" if args.runs_dir else "the runs folder ($METARAG_RUNS, else ./runs)")
    reports = run_experiment(experiment, runs_dir, rows=args.rows, datasets=args.datasets,
                             report_only=args.report_only, llm=args.llm, response_cache=not args.no_cache,
                             progress=not args.quiet)
    print("\n\n".join(reports))
    return 0 if reports else 1


def cmd_probe(args: argparse.Namespace) -> int:
    from metarag.evaluate.belief_signal import (
        EVAL_SETS,
        TRAIN_SETS,
        ProbeSettings,
        QuestionSet,
        format_signals,
        measure,
    )
    from metarag.evaluate.harness import runs_dir_default

    settings = ProbeSettings(
        llm=args.llm, lora=args.lora, hidden_llm=args.hidden_llm, samples=args.samples, threads=args.threads,
        eval_sets=tuple(map(QuestionSet.parse, args.eval)) if args.eval else EVAL_SETS,
        train_sets=tuple(map(QuestionSet.parse, args.train)) if args.train else TRAIN_SETS)
    results = measure(settings, args.out, args.runs_dir or runs_dir_default(),
                      log=lambda line: print(line, file=sys.stderr))
    print(format_signals(results, settings))
    print(f"readings: {Path(args.out) / 'signals.jsonl'}")
    return 0


def cmd_calibrate_judges(args: argparse.Namespace) -> int:
    import json

    from metarag.evaluate.calibration import calibrate_run, calibration_table

    results = calibrate_run(args.run, args.closed_book, allow_any=args.allow_any)
    print(calibration_table(results))
    print("\nuse: " + " ".join(f"--set {c.setting}={c.threshold:g}" for c in results))
    if args.out:
        Path(args.out).write_text(json.dumps({c.setting: c.threshold for c in results}, indent=1) + "\n")
    return 0
