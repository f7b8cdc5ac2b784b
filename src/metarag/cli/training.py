"""`metarag train-critic`, `train-router` and `train-agent`: the trainers, on training splits only."""
from __future__ import annotations

import argparse
import sys

from metarag.cli.args import add_llm_args, llm_spec_from_args, positive_int, raise_config
from metarag.retrieve.index import RETRIEVERS


def add_training_sets(p: argparse.ArgumentParser, what: str, *, corpus: bool = False) -> None:
    """The training questions of a trainer that takes several sets (train-critic, train-router), where
    `what` it trains goes, and its retriever."""
    p.add_argument("--dataset", action="append", default=[], metavar="PRESET",
                   help="a training preset (hotpotqa-train100, musique-train100, demo); repeatable")
    p.add_argument("--dataset-file", action="append", default=[], metavar="PATH",
                   help="a training file of your own; repeatable (needs --allow-any if its name does not say train)")
    p.add_argument("--format", default=None, help="format of --dataset-file, when not detected")
    if corpus:
        p.add_argument("--corpus", default=None, metavar="PATH", help="the corpus of --dataset-file, if it has none")
    p.add_argument("--limit", type=positive_int, default=None, help="a seeded sample of N questions per dataset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True, metavar="DIR", help=f"where {what} and its manifest go")
    p.add_argument("--retriever", default="bm25", choices=RETRIEVERS)
    p.add_argument("--allow-any", action="store_true", help="allow a --dataset-file not named as a training split")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def training_sets(args: argparse.Namespace) -> list:
    """The `DatasetSpec`s of `add_training_sets`'s arguments; at least one."""
    from metarag.evaluate.config import DatasetSpec

    specs = [DatasetSpec(preset=p, limit=args.limit, seed=args.seed) for p in args.dataset]
    specs += [DatasetSpec(file=f, format=args.format, corpus=getattr(args, "corpus", None), limit=args.limit,
                          seed=args.seed) for f in args.dataset_file]
    if not specs:
        raise_config("give at least one --dataset PRESET or --dataset-file PATH")
    return specs


def add_train_critic(sub) -> None:
    tc = sub.add_parser("train-critic", help="train SIM-RAG's lightweight critic by self-practice",
                        description="Run the SIM-RAG reasoner on training questions with varying evidence, "
                                    "label each answer correct or not against gold, train a logistic-regression "
                                    "critic on MiniLM features and report held-out accuracy and AUC. Training "
                                    "splits only. Use it with: metarag eval --method sim-rag --set critic=DIR")
    add_training_sets(tc, "the critic")
    add_llm_args(tc)
    tc.set_defaults(handler=cmd_train_critic)


def add_train_router(sub) -> None:
    tr = sub.add_parser("train-router", help="train Adaptive-RAG's query-complexity router on silver labels",
                        description="Answer training questions with the three strategies Adaptive-RAG routes to "
                                    "(A closed-book, B standard-rag, C ircot), label each question with the cheapest "
                                    "one that answers it correctly (else C on a multi-hop dataset, B on a single-hop "
                                    "one), train a logistic-regression router on MiniLM question embeddings and report "
                                    "held-out accuracy per class and the share routed to each. Training splits only. "
                                    "Use it with: metarag eval --method adaptive-rag --set classifier=DIR")
    add_training_sets(tr, "the router", corpus=True)
    tr.add_argument("--label", default="em", choices=("em", "f1"),
                    help="a strategy is right on exact match (default) or token F1 >= 0.5")
    add_llm_args(tr)
    tr.set_defaults(handler=cmd_train_router)


def add_train_agent(sub) -> None:
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
                    "checkpointing, bf16 autocast, LoRA at 1e-5; train/agent/settings.py RECIPES says why); "
                    "--set overrides it")
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


def cmd_train_critic(args: argparse.Namespace) -> int:
    from metarag.train.critic import run_training

    report = run_training(training_sets(args), args.out, llm_spec=llm_spec_from_args(args), retriever=args.retriever,
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
    from metarag.train.router import RouterTrainSettings, run_router_training

    report = run_router_training(training_sets(args), args.out, llm_spec=llm_spec_from_args(args),
                                 retriever=args.retriever, train=RouterTrainSettings(label=args.label),
                                 allow_any=args.allow_any, progress=not args.quiet)
    print(report.summary())
    return 0
