"""The `metarag` command: parses arguments, calls library functions, prints. No logic of its own."""
from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from metarag.errors import MetaRAGError
from metarag.retrieve.index import RETRIEVERS, check_retriever


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
    _add_ask(sub)
    _add_index(sub)
    _add_eval(sub)
    _add_sweep(sub)
    _add_report(sub)
    _add_serve_retriever(sub)
    _add_view(sub)
    _add_train_critic(sub)
    _add_train_router(sub)
    _add_train_agent(sub)
    _add_experiment(sub)
    _add_methods(sub)
    _add_doctor(sub)
    _add_calibrate_judges(sub)
    _add_probe(sub)
    return parser


def _add_probe(sub) -> None:
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


def _add_ask(sub) -> None:
    ask = sub.add_parser("ask", help="answer one question and show the trace",
                         description="Answer one question with a method and print the answer and a "
                                     "readable trace (each step, what was retrieved, time, tokens).")
    ask.add_argument("question", help="the question to answer")
    add_method_args(ask)
    add_corpus_args(ask)
    ask.add_argument("--retriever", default="bm25", type=retriever_name,
                     help="retriever: bm25, dense (MiniLM + FAISS), hybrid (both fused by RRF), or remote:URL "
                          "(a metarag serve-retriever service) (default: bm25)")
    add_reranker_args(ask)
    add_llm_args(ask)
    ask.add_argument("--json", action="store_true", help="print the whole trace as JSON instead")
    ask.set_defaults(handler=cmd_ask)


def _add_index(sub) -> None:
    index = sub.add_parser("index", help="build or inspect retrieval indexes")
    index_sub = index.add_subparsers(title="index commands", metavar="ACTION")
    build = index_sub.add_parser("build", help="build the BM25 and dense indexes of a corpus",
                                 description="Build (or reuse, when the corpus and settings match) the "
                                             "indexes of a corpus and report their size and build time.")
    add_corpus_args(build)
    build.add_argument("--retrievers", default="bm25,dense",
                       help="which indexes to build, comma-separated (default: bm25,dense)")
    build.add_argument("--dense-index", default=None, metavar="TYPE",
                       help="flat, hnsw, ivf or ivfpq: the dense index's FAISS type whatever the corpus size "
                            "(default: flat up to 200,000 passages, HNSW beyond; ivfpq: product-quantized, "
                            "~32x smaller, for corpora that do not fit in memory as float32)")
    build.set_defaults(handler=cmd_index_build)


def _add_eval(sub) -> None:
    ev = sub.add_parser("eval", help="evaluate a method over a dataset (resumable)",
                        description="Run a method over a dataset's questions. Each finished question is "
                                    "written at once to runs/<run-id>/results.jsonl; re-running the same "
                                    "command resumes where it stopped.")
    add_eval_args(ev)
    ev.add_argument("--print-run-dir", action="store_true",
                    help="print the run folder these arguments name and exit (no model is loaded)")
    ev.add_argument("--shard", default=None, metavar="I/N",
                    help="run only the I-th of N disjoint slices of the questions (every N-th of the seeded "
                         "order), into the same run folder as the other N-1: N machines sharing the folder run "
                         "one evaluation, and report / view read it as one run once every shard has finished")
    ev.set_defaults(handler=cmd_eval)


def _add_sweep(sub) -> None:
    sw = sub.add_parser("sweep", help="evaluate a grid of settings (like the study's Table 3)",
                        description="One evaluation per combination of --vary values, then a table of "
                                    "EM, F1 and per-question counts for each.")
    add_eval_args(sw)
    sw.add_argument("--vary", action="append", default=[], metavar="KEY=V1,V2",
                    help="a method setting and the values to try; repeatable (a grid)")
    sw.add_argument("--plot", default=None, metavar="PNG", help="write metric-versus-value to this PNG")
    sw.set_defaults(handler=cmd_sweep)


def _add_report(sub) -> None:
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
                         "on those it does")
    rp.add_argument("--judge-prefix-chunk", type=int, default=0, metavar="C",
                    help="--prefix-chunk for a llama.cpp --judge-llm (exact KV-cache reuse: a verdict does not "
                         "depend on what the judge read before; a new judge id, so verdicts are judged anew)")
    rp.add_argument("--analysis-plots", default=None, metavar="DIR",
                    help="with --analysis evoctx: also draw Figure 4 (trace vs oracle margin) and Figure 3 "
                         "(RETRIEVE ratio vs question-answer distance) of each run as PNGs in DIR")
    rp.set_defaults(handler=cmd_report)


def _add_serve_retriever(sub) -> None:
    srv = sub.add_parser("serve-retriever", help="serve an index over HTTP for many workers",
                         description="Serve a built index (from `metarag index build`) on POST /retrieve "
                                     '{"queries": [...], "topk": k} and GET /health, bound to 127.0.0.1 unless '
                                     "--host says otherwise. Evaluations use it with --retriever remote:URL.")
    srv.add_argument("--index", required=True, metavar="DIR", help="the index folder `metarag index build` printed")
    srv.add_argument("--corpus", default=None, help="the corpus file, if the index folder holds no copy of it")
    srv.add_argument("--retriever", default="bm25", choices=RETRIEVERS)
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default: 127.0.0.1; 0.0.0.0: every "
                     "interface)")
    srv.add_argument("--port", type=port_number, default=8000, help="port, 0..65535 (0: a free one; default: 8000)")
    srv.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                     help="a batching setting or request limit (repeatable): batch_window_s, max_batch_queries, "
                          "max_body_bytes, max_queries, max_query_chars, max_topk, max_hits (see ServiceSettings)")
    srv.set_defaults(handler=cmd_serve_retriever)


def _add_view(sub) -> None:
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


def _add_train_critic(sub) -> None:
    tc = sub.add_parser("train-critic", help="train SIM-RAG's lightweight critic by self-practice",
                        description="Run the SIM-RAG reasoner on training questions with varying evidence, "
                                    "label each answer correct or not against gold, train a logistic-regression "
                                    "critic on MiniLM features and report held-out accuracy and AUC. Training "
                                    "splits only. Use it with: metarag eval --method sim-rag --set critic=DIR")
    tc.add_argument("--dataset", action="append", default=[], metavar="PRESET",
                    help="a training preset (hotpotqa-train100, musique-train100, demo); repeatable")
    tc.add_argument("--dataset-file", action="append", default=[], metavar="PATH",
                    help="a training file of your own; repeatable (needs --allow-any if its name does not say train)")
    tc.add_argument("--format", default=None, help="format of --dataset-file, when not detected")
    tc.add_argument("--limit", type=positive_int, default=None, help="a seeded sample of N questions per dataset")
    tc.add_argument("--seed", type=int, default=0)
    tc.add_argument("--out", required=True, metavar="DIR", help="where the critic and its manifest go")
    tc.add_argument("--retriever", default="bm25", choices=RETRIEVERS)
    tc.add_argument("--allow-any", action="store_true", help="allow a --dataset-file not named as a training split")
    tc.add_argument("--quiet", action="store_true", help="no progress bar")
    add_llm_args(tc)
    tc.set_defaults(handler=cmd_train_critic)


def _add_train_router(sub) -> None:
    tr = sub.add_parser("train-router", help="train Adaptive-RAG's query-complexity router on silver labels",
                        description="Answer training questions with the three strategies Adaptive-RAG routes to "
                                    "(A closed-book, B standard-rag, C ircot), label each question with the cheapest "
                                    "one that answers it correctly (else C on a multi-hop dataset, B on a single-hop "
                                    "one), train a logistic-regression router on MiniLM question embeddings and report "
                                    "held-out accuracy per class and the share routed to each. Training splits only. "
                                    "Use it with: metarag eval --method adaptive-rag --set classifier=DIR")
    tr.add_argument("--dataset", action="append", default=[], metavar="PRESET",
                    help="a training preset (hotpotqa-train100, musique-train100, demo); repeatable")
    tr.add_argument("--dataset-file", action="append", default=[], metavar="PATH",
                    help="a training file of your own; repeatable (needs --allow-any if its name does not say train)")
    tr.add_argument("--format", default=None, help="format of --dataset-file, when not detected")
    tr.add_argument("--corpus", default=None, metavar="PATH", help="the corpus of --dataset-file, if it has none")
    tr.add_argument("--limit", type=positive_int, default=None, help="a seeded sample of N questions per dataset")
    tr.add_argument("--seed", type=int, default=0)
    tr.add_argument("--out", required=True, metavar="DIR", help="where the router and its manifest go")
    tr.add_argument("--retriever", default="bm25", choices=RETRIEVERS)
    tr.add_argument("--label", default="em", choices=("em", "f1"),
                    help="a strategy is right on exact match (default) or token F1 >= 0.5")
    tr.add_argument("--allow-any", action="store_true", help="allow a --dataset-file not named as a training split")
    tr.add_argument("--quiet", action="store_true", help="no progress bar")
    add_llm_args(tr)
    tr.set_defaults(handler=cmd_train_router)


def _add_train_agent(sub) -> None:
    ta = sub.add_parser("train-agent", help="train the search agent with GRPO (TRL) on training questions",
                        description="GRPO on TRL's GRPOTrainer: the agent's own policy (search-r1, belief-agent, "
                                    "r1-searcher or autorefine) run through the shared runner on the live model as "
                                    "rollouts (G per question, sampled, the belief probe at every step of search-r1 "
                                    "and belief-agent), the reward read from each trace. "
                                    "Paper settings by default (lr 1e-6, KL 0.001, G 5, 4 turns, 512 response "
                                    "tokens, 4,096 prompt tokens, top-3). Training splits only. Checkpoints: "
                                    "OUT/trainer/checkpoint-N; the last one holds merged/, for metarag eval --llm "
                                    "hf:PATH (every one with --set merged_checkpoints=every); a re-run resumes. "
                                    "--plot OUT draws the training curves instead.")
    ta.add_argument("--dataset", default=None, metavar="PRESET", help="a training preset (hotpotqa-train100, "
                    "musique-train100, demo)")
    ta.add_argument("--dataset-file", default=None, metavar="PATH", help="a training file of your own (needs "
                    "--allow-any if its name does not say train)")
    ta.add_argument("--format", default=None, help="format of --dataset-file, when not detected")
    ta.add_argument("--corpus", default=None, metavar="PATH", help="corpus of --dataset-file")
    ta.add_argument("--limit", type=positive_int, default=None, help="a seeded sample of N training questions")
    ta.add_argument("--seed", type=int, default=0, help="sampling, rollout and trainer seed (default 0)")
    ta.add_argument("--out", metavar="DIR", help="where checkpoints, the log and the manifest go")
    ta.add_argument("--method", default="belief-agent", help="the agent: belief-agent (default), search-r1, "
                    "r1-searcher or autorefine")
    ta.add_argument("--reward", default="belief", help="the reward (train/rewards.py): belief (default), search-r1, "
                    "belief-over-only, belief-under-only, belief-ungated, beta-grpo, hiprag (HiPRAG's process "
                    "reward: LLM judges mark over- and under-search steps), r1-searcher-stage1 and r1-searcher "
                    "(R1-Searcher's two stages), autorefine (answer F1, or 0.1 for a refine that holds the gold)")
    ta.add_argument("--recipe", default="paper", help="a named preset of the settings below: paper (default: the "
                    "paper's), cpu (a step the 2-core CPU can afford: 3 turns, 128 tokens, top-2, KL 0, no "
                    "checkpointing, bf16 autocast, LoRA at 1e-5; train/agent.py RECIPES says why); --set overrides it")
    ta.add_argument("--measure-signal", type=positive_int, default=None, metavar="N",
                    help="before training: roll out G per question for N questions with the untrained model and "
                         "print the share of groups whose rewards differ (those give a gradient); writes "
                         "OUT/signal.json and exits")
    ta.add_argument("--vllm", choices=("off", "colocate", "server"), default=None,
                    help="generate rollouts on TRL's vLLM engine: colocate (beside the policy on each GPU) or server "
                         "(a `trl vllm-serve` at --set vllm_server_url=URL); default off (transformers)")
    ta.add_argument("--steps", type=positive_int, default=None, help="optimizer steps (default 10)")
    ta.add_argument("--time-budget", type=float, default=None, metavar="SECONDS",
                    help="pause after this many seconds of training: save a checkpoint (no merged/ copy) that "
                         "the same command resumes")
    ta.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="override a training setting (learning_rate, kl_coef, group_size, questions_per_step, "
                         "max_turns, step_max_tokens, n_ctx, top_k, lora, save_every ...), a reward setting "
                         "(consistency_weight, margin, invalid_penalty, query_confidence_threshold, format_weight, "
                         "process_weight) or a HiPRAG judge setting (judge_model, direct_max_tokens, "
                         "judge_max_tokens); repeatable")
    ta.add_argument("--retriever", default="bm25", choices=RETRIEVERS)
    ta.add_argument("--allow-any", action="store_true", help="allow a --dataset-file not named as a training split")
    ta.add_argument("--plot", metavar="RUN", nargs="+", help="draw the curves of the training run in RUN "
                    "(RUN/curves.png; or a copy X-log.jsonl of its log: X-curves.png beside it) and exit; "
                    "several runs overlaid in one figure (a run beside its retry or ablation) need --plot-file")
    ta.add_argument("--plot-file", metavar="PNG", default=None, help="where --plot writes its figure")
    ta.add_argument("--dry-run", action="store_true", help="check everything and print the plan (device, "
                    "precision, LoRA, batch, folders) without loading the model")
    add_llm_args(ta)
    ta.set_defaults(handler=cmd_train_agent, llm="hf-0.5b")


def _add_experiment(sub) -> None:
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


def _add_methods(sub) -> None:
    me = sub.add_parser("methods", help="list the methods (ours, installed packages', registered), or one's settings",
                        description="Every method with the first line of its docstring (its paper); with a name, "
                                    "each setting's type, default and range or choices, and the settings' docstring "
                                    "(the paper and section behind each default). Generated from the settings classes.")
    me.add_argument("name", nargs="?", help="a method's name")
    me.set_defaults(handler=cmd_methods)


def _add_doctor(sub) -> None:
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


def _add_calibrate_judges(sub) -> None:
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
    p.add_argument("--reranker", default="none",
                   help="reranker after every retrieval round: none, llm (LLM yes/no relevance judge), listwise "
                        "(RankGPT sliding window), cosine (MiniLM), cross-encoder:PATH (default: none)")
    p.add_argument("--rerank-depth", type=positive_int, default=20,
                   help="candidates retrieved for the reranker, of which k are kept (default: 20)")


def add_llm_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--llm", default="embedded",
                   help="the LLM, one spec string: embedded (Qwen2.5-Coder-1.5B by llama.cpp, default), "
                        "embedded-0.5b, gguf:PATH, hf (the 1.5B by transformers), hf-0.5b, hf:PATH (a GGUF or "
                        "a model folder), openai:MODEL[@URL]; also gguf with --gguf PATH, openai with --model "
                        "and --base-url")
    p.add_argument("--gguf", default=None, help="model path, for --llm gguf (or hf)")
    p.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="OpenAI-compatible server URL")
    p.add_argument("--model", default="", help="model name on the server, for --llm openai")
    p.add_argument("--api-key-env", default="OPENAI_API_KEY",
                   help="environment variable holding the API key (default: OPENAI_API_KEY)")
    p.add_argument("--threads", type=positive_int, default=None,
                   help="CPU threads for the llama.cpp back-ends (default: all cores; 1 is faster when other "
                        "jobs share the cores)")
    p.add_argument("--n-ctx", type=positive_int, default=None,
                   help="context window of the local back-ends in tokens (default: 4096); a prompt that does not "
                        "fit fails that question, and a larger window makes it a new run id")
    p.add_argument("--prefix-chunk", type=int, default=0, metavar="C",
                   help="llama.cpp: evaluate prompts in chunks ending at multiples of C tokens and reuse only "
                        "whole chunks from the KV cache, so a prompt's output does not depend on what ran before "
                        "it (0, the default: reuse any shared prefix, faster but order-dependent); e.g. 32")
    p.add_argument("--lora", default=None, metavar="PATH",
                   help="a LoRA adapter on a llama.cpp model: a train-agent checkpoint (or any PEFT adapter "
                        "folder; converted once) or a GGUF adapter file; its sha256 joins the run id")
    p.add_argument("--no-cache", "--no-response-cache", dest="no_cache", action="store_true",
                   help="this run neither reads nor writes the persistent response cache")


def add_eval_args(p: argparse.ArgumentParser) -> None:
    from metarag.judges.correctness import PROMPTS

    p.add_argument("--method", required=True, help="method to evaluate")
    p.add_argument("--dataset", default=None, metavar="PRESET",
                   help="a named dataset (hotpotqa-dev500, 2wiki-dev1000, musique-train100, bamboogle, "
                        "nq-1000, triviaqa-1000, popqa-1000, multihop-rag-500, multihop-rag-facts, demo, ...)")
    p.add_argument("--dataset-file", default=None, metavar="PATH", help="a question file of your own")
    p.add_argument("--format", default=None, help="its format, when not detected from the content")
    p.add_argument("--corpus", default=None, metavar="PATH",
                   help="retrieve from this corpus instead of the questions' own paragraphs")
    p.add_argument("--limit", type=positive_int, default=None, help="evaluate a seeded sample of N questions")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--questions", default=None, metavar="LIST",
                   help="only the questions of this committed id list, before --limit: a list metarag ships for "
                        "the dataset (headline200: the 200 questions of docs/report.md's tables) or a file of ids")
    p.add_argument("--types", default="", metavar="T1,T2",
                   help="only questions of these types, before --limit (2Wiki's comparison, bridge_comparison, "
                        "compositional, inference; HotpotQA's comparison, bridge); the run id includes them")
    p.add_argument("--allow-unanswerable", action="store_true",
                   help="score questions without a gold answer as unanswerable (right only when the answer "
                        "abstains: unanswerable, unknown, unsure, ...) instead of refusing the file")
    p.add_argument("--workers", type=positive_int, default=1,
                   help="questions run concurrently (useful against a served model; 1 for embedded); with "
                        "--batch, the requests of a round sent at once to a back-end that does not batch")
    p.add_argument("--batch", type=positive_int, default=1, metavar="N",
                   help="run N questions in lockstep, each round's model requests as one batch (a transformers "
                        "model decodes them as one padded batch); default 1: one question at a time")
    p.add_argument("--retriever", default="bm25", type=retriever_name,
                   help="retriever: bm25, dense (MiniLM + FAISS), hybrid (both fused by RRF), or remote:URL "
                          "(a metarag serve-retriever service) (default: bm25)")
    add_reranker_args(p)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override a method setting by name; repeatable")
    p.add_argument("--runs-dir", default=None, help="where run folders go (default: $METARAG_RUNS or runs)")
    p.add_argument("--retry-failed", action="store_true",
                   help="retry every failed question (a re-run retries those that failed with a retryable "
                        "error, a back-end down or timing out, anyway)")
    p.add_argument("--max-consecutive-failures", type=int, default=3, metavar="N",
                   help="stop after N questions in a row fail with retryable errors (default: 3; 0 never stops)")
    p.add_argument("--wait", action="store_true",
                   help="if another process is writing the same run, wait for it instead of refusing")
    p.add_argument("--samples", type=positive_int, default=1, metavar="K",
                   help="answer each question K times, sampled and seeded (sample i from --seed, the question and "
                        "i), each answer resumable on its own; report adds avg@k and pass@k (default 1: one "
                        "greedy answer); a larger K later on the same run adds the missing samples")
    p.add_argument("--sample-temperature", type=float, default=None, metavar="T",
                   help="sampling temperature of --samples K (default 0.6, with top-p 0.95: DeepSeek-R1's pass@1 "
                        "sampling)")
    p.add_argument("--sample-top-p", type=float, default=None, metavar="P",
                   help="nucleus sampling of --samples K (default 0.95)")
    p.add_argument("--judge-llm", nargs="?", const="embedded", default=None, metavar="SPEC",
                   help="after the questions, judge every answer with an LLM (LLM-as-judge accuracy: is the "
                        "prediction right given the question and gold answers?): alone the embedded model, or any "
                        "spec (openai:MODEL@URL ...); verdicts kept in the run folder (answer-judge-<id>.jsonl, "
                        "with the judge and its prompt), resumed on a re-run; report shows the judged accuracy and "
                        "its agreement with EM and Acc")
    p.add_argument("--judge-prompt", default=None, choices=tuple(PROMPTS),
                   help="the judge's prompt: equivalence (gold answers and prediction: the default, the one the "
                        "embedded judge can give), r1-searcher (question, golden answer, prediction -> True / "
                        "False: R1-Searcher's judge) or agentic-rag (ours, with the question); the last two for a "
                        "judge model that can read the question")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_llm_args(p)


# ------------------------------------------------------------------------------------- commands
def cmd_ask(args: argparse.Namespace) -> int:
    from metarag.display import format_trace
    from metarag.pipeline import answer_question, method_from_args

    if not args.question.strip():
        raise_config("the question is empty")
    method = method_from_args(args.method, args.k, args.set)
    trace = answer_question(args.question, method, corpus=args.corpus, retriever=args.retriever,
                            index_dir=args.index_dir, reranker=args.reranker, rerank_depth=args.rerank_depth,
                            llm_spec=llm_spec_from_args(args),
                            on_step=None if args.json else _live_printer())
    if args.json:
        print(trace.to_json())
    else:
        print(format_trace(trace, header_only=True))
    if trace.error is not None:
        print(f"metarag: error: {trace.error}", file=sys.stderr)
        return 1
    return 0


def cmd_index_build(args: argparse.Namespace) -> int:
    from metarag.pipeline import build_indexes

    for line in build_indexes(args.corpus, args.retrievers.split(","), index_dir=args.index_dir,
                              dense_index=args.dense_index):
        print(line)
    return 0


def eval_config_from_args(args: argparse.Namespace):
    from metarag.evaluate.harness import DatasetSpec, EvalConfig, runs_dir_default
    from metarag.evaluate.runs import Shard
    from metarag.paths import check_folder
    from metarag.settings import parse_assignments

    dataset = DatasetSpec(preset=args.dataset, file=args.dataset_file, format=args.format,
                          corpus=args.corpus, limit=args.limit, seed=args.seed,
                          allow_unanswerable=args.allow_unanswerable, questions=args.questions,
                          types=tuple(t.strip() for t in args.types.split(",") if t.strip()))
    runs_dir = check_folder(args.runs_dir or runs_dir_default(),
                            "--runs-dir" if args.runs_dir else "the runs folder ($METARAG_RUNS, else ./runs)")
    return EvalConfig(method=args.method, dataset=dataset, llm=llm_spec_from_args(args),
                      retriever=args.retriever, reranker=args.reranker, rerank_depth=args.rerank_depth,
                      overrides=parse_assignments(args.set),
                      workers=args.workers, runs_dir=str(runs_dir),
                      retry_failed=args.retry_failed, max_consecutive_failures=args.max_consecutive_failures,
                      wait=args.wait, batch=args.batch,
                      shard=Shard.parse(args.shard) if getattr(args, "shard", None) is not None else None,
                      samples=samples_from_args(args), judge_llm=args.judge_llm,
                      answer_judge=answer_judge_from_args(args))


def samples_from_args(args: argparse.Namespace):
    from metarag.evaluate.harness import Samples

    if args.samples == 1 and (args.sample_temperature is not None or args.sample_top_p is not None):
        raise_config("--sample-temperature and --sample-top-p set the sampling of --samples K; give K > 1")
    given = {"temperature": args.sample_temperature, "top_p": args.sample_top_p}
    return Samples(k=args.samples, **{k: v for k, v in given.items() if v is not None})


def answer_judge_from_args(args: argparse.Namespace):
    from metarag.judges.correctness import AnswerJudge

    if args.judge_prompt is not None and args.judge_llm is None:
        raise_config("--judge-prompt sets the prompt of --judge-llm; give both")
    return AnswerJudge(prompt=args.judge_prompt) if args.judge_prompt else AnswerJudge()


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
            from metarag.evaluate.agent_analysis import format_search_by_knowledge

            print()
            print(format_search_by_knowledge(runs, load_run(args.closed_book)))
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


def cmd_serve_retriever(args: argparse.Namespace) -> int:
    from metarag.retrieve.index import open_saved
    from metarag.retrieve.service import ServiceSettings, check_address, serve
    from metarag.settings import override, parse_assignments

    check_address(args.host, args.port)  # before the index loads
    settings = override(ServiceSettings(), parse_assignments(args.set), owner="serve-retriever")
    retriever = open_saved(args.index, args.retriever, args.corpus)
    serve(retriever, args.host, args.port, settings=settings, on_listening=lambda url: print(
        f"serving {args.retriever} over {args.index} on {url} (POST /retrieve, GET /health)", file=sys.stderr,
        flush=True))
    return 0


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


def cmd_train_critic(args: argparse.Namespace) -> int:
    from metarag.evaluate.harness import DatasetSpec
    from metarag.train.critic import run_training

    specs = [DatasetSpec(preset=p, limit=args.limit, seed=args.seed) for p in args.dataset]
    specs += [DatasetSpec(file=f, format=args.format, limit=args.limit, seed=args.seed) for f in args.dataset_file]
    if not specs:
        raise_config("give at least one --dataset PRESET or --dataset-file PATH")
    report = run_training(specs, args.out, llm_spec=llm_spec_from_args(args), retriever=args.retriever,
                          allow_any=args.allow_any, progress=not args.quiet)
    print(report.summary())
    return 0


def cmd_train_agent(args: argparse.Namespace) -> int:
    if args.plot_file and not args.plot:
        raise_config("--plot-file names the figure of --plot; give both")
    if args.plot:
        from metarag.errors import DataError
        from metarag.train.agent import plot_curves, read_log, reward_trend, run_labels

        if len(args.plot) > 1 and not args.plot_file:
            raise_config(f"--plot with {len(args.plot)} runs draws one figure: give --plot-file PNG")
        print(plot_curves(args.plot, args.plot_file))
        for run, label in zip(args.plot, run_labels(args.plot)):
            name = f"{label}: " if len(args.plot) > 1 else ""
            try:
                trend = reward_trend(read_log(run))
                print(f"{name}reward, mean of the last 20 steps - mean of the first 20: {trend.diff:+.4f} "
                      f"(95% bootstrap interval {trend.low:+.4f} .. {trend.high:+.4f})")
            except DataError as exc:
                print(f"{name}no reward trend yet: {exc}")
        return 0
    from metarag.evaluate.harness import DatasetSpec
    from metarag.settings import parse_assignments
    from metarag.train.agent import run_training, training_settings

    if not args.out:
        raise_config("give --out DIR (where the checkpoints go)")
    values: dict = dict(parse_assignments(list(args.set)))
    values.update(method=args.method, reward=args.reward, seed=args.seed)
    given = {"steps": args.steps, "vllm": args.vllm, "time_budget_s": args.time_budget}
    values.update({k: v for k, v in given.items() if v is not None})
    if args.n_ctx is not None:  # the trainer's own setting is the window; the flag is another way to give it
        if str(values.setdefault("n_ctx", args.n_ctx)) != str(args.n_ctx):
            raise_config(f"--n-ctx {args.n_ctx} and --set n_ctx={values['n_ctx']} disagree: give one")
    settings, reward_settings, judge_settings = training_settings(args.recipe, values)
    spec = DatasetSpec(preset=args.dataset, file=args.dataset_file, format=args.format, corpus=args.corpus,
                       limit=args.limit, seed=args.seed)
    report = run_training(spec, llm_spec_from_args(args), args.out, settings, retriever=args.retriever,
                          allow_any=args.allow_any, dry_run=args.dry_run, reward_settings=reward_settings,
                          judge_settings=judge_settings,
                          signal_questions=args.measure_signal)
    print(report if isinstance(report, str) else report.summary())
    distributed = getattr(sys.modules.get("torch"), "distributed", None)
    if distributed is not None and distributed.is_available() and distributed.is_initialized():
        distributed.barrier()  # under `accelerate launch`: the processes leave together, the group torn down
        distributed.destroy_process_group()
    return 0


def cmd_train_router(args: argparse.Namespace) -> int:
    from metarag.evaluate.harness import DatasetSpec
    from metarag.train.router import RouterTrainSettings, run_router_training

    specs = [DatasetSpec(preset=p, limit=args.limit, seed=args.seed) for p in args.dataset]
    specs += [DatasetSpec(file=f, format=args.format, corpus=args.corpus, limit=args.limit, seed=args.seed)
              for f in args.dataset_file]
    if not specs:
        raise_config("give at least one --dataset PRESET or --dataset-file PATH")
    report = run_router_training(specs, args.out, llm_spec=llm_spec_from_args(args), retriever=args.retriever,
                                 train=RouterTrainSettings(label=args.label), allow_any=args.allow_any,
                                 progress=not args.quiet)
    print(report.summary())
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


def cmd_methods(args: argparse.Namespace) -> int:
    from metarag.api import method_help, method_table

    if args.name:
        print(method_help(args.name))
        return 0
    print("| method | what | paper |\n|---|---|---|")
    for row in method_table():
        print(f"| {row['method']} | {row['what']} | {row['paper']} |")
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from metarag.doctor import report, run_checks
    from metarag.llm.models import embedded_model

    embedded_model(args.decode_model)  # an unknown name fails here, before any check runs
    failures = report(run_checks(decode=not args.no_decode, encoder=not args.no_encoder,
                                 decode_model=args.decode_model), show=lambda line: print(line, flush=True))
    return 1 if failures else 0


def llm_spec_from_args(args: argparse.Namespace):
    from metarag.llm.registry import parse_llm_spec

    return parse_llm_spec(args.llm, gguf=args.gguf, base_url=args.base_url, model=args.model,
                          api_key_env=args.api_key_env, n_threads=args.threads,
                          **({} if args.n_ctx is None else {"n_ctx": args.n_ctx}),
                          response_cache=not args.no_cache, prefix_chunk=args.prefix_chunk, lora=args.lora)


def raise_config(message: str):
    from metarag.errors import ConfigError

    raise ConfigError(message)


def _live_printer():
    from metarag.display import format_step

    def show(step) -> None:
        print(format_step(step), flush=True)
    return show


if __name__ == "__main__":
    sys.exit(main())
