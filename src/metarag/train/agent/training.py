"""The top floor: `train_agent`, one GRPO run (TRL's configuration from the settings, the callbacks that
log, budget and checkpoint each step, resume from the last checkpoint), and `run_training`, the
`metarag train-agent` command (the questions and their corpus, the base model, then a plan, a signal
measurement or the run)."""
from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from metarag.errors import ConfigError, DataError, MissingDependency
from metarag.evaluate.training_curves import LOG_FILE, ROLLOUT_LOG
from metarag.provenance import git_commit
from metarag.records import Question
from metarag.train.agent.checkpoints import _check_resumable, _checkpoint_step, _last_checkpoint, _save_checkpoint
from metarag.train.agent.model import check_sharding, load_base
from metarag.train.agent.packed import step_packed_trainer
from metarag.train.agent.rollouts import AgentRollouts, reward_columns
from metarag.train.agent.settings import MERGED, PRECISIONS, TRAINER_DIR, AgentTrainSettings, check_training_split
from metarag.train.agent.signal import SignalReport, measure_signal


@dataclass(frozen=True)
class TrainReport:
    """What a training run left: its folder, the steps done, the last checkpoint (merged model
    folder, usable as `--llm hf:PATH`; None when a time budget paused the run, which then names the
    checkpoint it resumes from in `paused_at`) and the per-step log."""

    out: Path
    steps: int
    checkpoint: Path | None
    log: tuple[dict[str, Any], ...]
    paused_at: Path | None = None
    steps_planned: int | None = None

    def summary(self) -> str:
        lines = [f"trained {self.steps} step(s) into {self.out}"]
        if self.log:
            last = self.log[-1]
            parts = [f"{k}={last[k]:.4g}" for k in ("reward", "rewards/reward/mean", "rewards/outcome/mean",
                                                     "searches", "under_search_rate", "kl") if k in last]
            lines.append("last step: " + ", ".join(parts))
        if self.paused_at is not None:
            lines.append(f"time budget spent at step {self.steps} of {self.steps_planned}: the same command "
                         f"resumes from {self.paused_at}; with --steps {self.steps} it writes that checkpoint's "
                         "merged model (for --llm hf:PATH) without training")
        if self.checkpoint is not None:
            lines.append(f"checkpoint: {self.checkpoint}")
            lines.append(f"evaluate it: metarag eval --llm hf:{self.checkpoint} --method <agent> --dataset ...")
        return "\n".join(lines)


def _import_trl():
    try:
        import peft
        import trl
    except ModuleNotFoundError:
        raise MissingDependency("trl and peft", "train") from None
    return trl, peft


def train_agent(questions: Sequence[Question], retriever: Any, model: Any, tokenizer: Any, out_dir: str | Path,
                settings: AgentTrainSettings = AgentTrainSettings(), *, provenance: dict[str, Any] | None = None,
                reward_settings: Any = None, callbacks: Sequence[Any] = (),
                rollouts: AgentRollouts | None = None, judge_settings: Any = None) -> TrainReport:
    """GRPO-train `model` (a transformers causal LM, with `tokenizer`) as the agent `settings.method`
    on `questions`, retrieving from `retriever`. Checkpoints go to `out_dir/trainer/checkpoint-N`
    (TRL's: adapter or weights, optimizer, RNG; plus `merged/`, a full model folder, and the
    manifest); a run whose folder holds a checkpoint resumes from the last one. `provenance`
    (base model and data sha256 ...) goes into every manifest. `rollouts` replaces the rollout
    function built from the arguments (tests read its `last`). `judge_settings`: HiPRAG's process
    judges (`judges.process.ProcessJudgeSettings`), read by `--reward hiprag` only.

    Under `accelerate launch` each process rolls out its share of the step's groups (seeded by its
    rank) and the model is placed by accelerate (load it on the CPU); only the main process writes the
    settings, the log, the manifests and `merged/`, and the time budget is the main process's clock,
    broadcast at every step end."""
    import os

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    trl, peft = _import_trl()
    import torch
    from accelerate import PartialState
    from datasets import Dataset
    from transformers import TrainerCallback

    from metarag.train.rewards import RewardSettings

    if not questions:
        raise ConfigError("no training questions")
    on_gpu = torch.cuda.is_available()
    state = PartialState(cpu=not on_gpu)  # the launcher's processes (gloo on the CPU), as the trainer sees them
    main, processes = state.is_main_process, state.num_processes
    packed_passes = settings.resolved_packed_passes(on_gpu, processes)
    reward_settings = reward_settings if reward_settings is not None else RewardSettings()
    out = Path(out_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    lora = (not on_gpu) if settings.lora is None else settings.lora
    precision = settings.resolved_precision(on_gpu)
    weights_dtype, autocast = PRECISIONS[precision]
    model = model.to(getattr(torch, weights_dtype))
    manifest_base = {
        "method": settings.method, "reward": settings.reward,
        "settings": dataclasses.asdict(settings), "lora": lora, "precision": precision,
        "reward_settings": dataclasses.asdict(reward_settings),
        **({"judge_settings": dataclasses.asdict(judge_settings)} if judge_settings is not None else {}),
        **({"think_prefix": True} if settings.think_prefix else {}),
        # how advantages are scaled and where the probe reads: a run saved before they were settings had
        # "group" and "policy", so it resumes only with those
        "scale_rewards": settings.scale_rewards, "probe_weights": settings.probe_weights,
        "trl": trl.__version__, "peft": peft.__version__, "git_commit": git_commit(),
        **(provenance or {}),
    }
    _check_resumable(out, manifest_base)
    if main:
        (out / "settings.json").write_text(json.dumps(manifest_base, indent=2, default=str) + "\n")

    base_sha = str((provenance or {}).get("base_model_sha256") or "")
    rollouts = rollouts if rollouts is not None else AgentRollouts(
        questions, retriever, settings, reward_settings, identity=f"train-agent:{base_sha[:16]}",
        judge_settings=judge_settings)
    batch = settings.group_size * settings.questions_per_step
    if batch % processes:
        raise ConfigError(f"{batch} rollouts per step (group_size x questions_per_step) do not split over "
                          f"{processes} processes")
    per_process = batch // processes
    if per_process % settings.train_batch_size:
        raise ConfigError(f"train_batch_size {settings.train_batch_size} does not divide the {per_process} "
                          "rollouts each process trains per step")
    micro_steps = per_process // settings.train_batch_size
    vllm = {}
    if settings.vllm != "off":
        vllm = dict(use_vllm=True, vllm_mode=settings.vllm, vllm_max_model_length=settings.n_ctx,
                    vllm_gpu_memory_utilization=settings.vllm_gpu_memory_utilization)
        if settings.vllm == "server":
            vllm["vllm_server_base_url"] = settings.vllm_server_url
    config = trl.GRPOConfig(
        output_dir=str(out / TRAINER_DIR), learning_rate=settings.learning_rate, beta=settings.kl_coef,
        num_generations=settings.group_size, per_device_train_batch_size=settings.train_batch_size,
        gradient_accumulation_steps=micro_steps, steps_per_generation=micro_steps, max_steps=settings.steps,
        lr_scheduler_type="constant", warmup_steps=0,
        temperature=settings.temperature, max_completion_length=settings.step_max_tokens,
        loss_type=settings.loss_type, scale_rewards=settings.scale_rewards, mask_truncated_completions=False,
        save_strategy="steps", save_steps=settings.save_every, save_total_limit=settings.keep_checkpoints or None,
        logging_steps=1, report_to="none",
        seed=settings.seed, data_seed=settings.seed, bf16=autocast, use_cpu=not on_gpu,
        gradient_checkpointing=settings.gradient_checkpointing,
        gradient_checkpointing_kwargs={"use_reentrant": False}, disable_dropout=True, remove_unused_columns=False,
        dataloader_num_workers=0, save_only_model=False, **vllm)
    funcs, weights = reward_columns()
    config.reward_weights = weights
    data = Dataset.from_list([{"prompt": key} for key in rollouts.by_prompt])
    peft_config = None
    if lora:
        peft_config = peft.LoraConfig(r=settings.lora_r, lora_alpha=settings.lora_alpha,
                                      lora_dropout=settings.lora_dropout, task_type="CAUSAL_LM",
                                      target_modules="all-linear")
    log: list[dict[str, Any]] = []
    log_path = out / LOG_FILE
    started = time.monotonic()
    budget_spent: list[int] = []

    class _Logs(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            # a resumed run reads its state, the save and logging intervals in it, from the checkpoint
            # after the arguments were applied: this run's `save_every` holds, not the saved run's
            state.compute_steps(args, state.max_steps)

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "train_runtime" not in logs:
                record = {"step": state.global_step, **{k: v for k, v in logs.items()
                                                        if isinstance(v, (int, float))}}
                rss = release_freed_memory()  # once a step: the heap's free pages back to the system
                if rss is not None:
                    record["memory/rss_gb"] = round(rss, 2)
                log.append(record)
                if state.is_world_process_zero:
                    with log_path.open("a") as f:
                        f.write(json.dumps(record) + "\n")

        def on_step_end(self, args, state, control, **kw):
            if not settings.time_budget_s:
                return
            spent = [time.monotonic() - started >= settings.time_budget_s]
            if processes > 1:  # the main process's clock decides, for all: no process waits on another
                from accelerate.utils import broadcast_object_list

                broadcast_object_list(spent, from_process=0)
            if spent[0]:
                control.should_training_stop = True
                control.should_save = True
                budget_spent.append(state.global_step)

        def on_save(self, args, state, control, model=None, processing_class=None, **kw):
            folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
            last = state.global_step >= state.max_steps
            _save_checkpoint(folder, trainer, tokenizer, {**manifest_base, "steps": state.global_step},
                             merged=last or settings.merged_checkpoints == "every")

    if settings.attn_implementation and hasattr(model, "set_attn_implementation"):
        model.set_attn_implementation(settings.attn_implementation)  # the rollouts ask for no attention weights
    if settings.vllm == "colocate":  # before TRL builds the engine from the model's folder
        from metarag.llm.vllm import check_colocated_model

        check_colocated_model(getattr(model, "name_or_path", None))
    rollouts.rollout_log = out / ROLLOUT_LOG
    trainer = step_packed_trainer(trl)(model=model, reward_funcs=funcs, args=config, train_dataset=data,
                                       processing_class=tokenizer, peft_config=peft_config, rollout_func=rollouts,
                                       callbacks=[_Logs(), *callbacks])
    check_sharding(trainer, settings, lora)
    if settings.vllm == "server":
        _check_vllm_server(trainer, settings.vllm_server_url, processes)
    trainer.packed_passes = packed_passes
    # under bf16 autocast in one CPU process, a row's passes use bf16 copies of the frozen weights made
    # once (autocast would cast them at every forward, and again when checkpointing recomputes one)
    trainer.cast_frozen = bool(autocast) and not on_gpu and processes == 1
    last = _last_checkpoint(out)
    if last is not None and _checkpoint_step(last) >= settings.steps:
        # a finished run: TRL's loop would take one more step before it looks at max_steps
        trainer._load_from_checkpoint(str(last))
        trainer.state.global_step = _checkpoint_step(last)
    else:
        trainer.train(resume_from_checkpoint=str(last) if last is not None else None)
    final = _last_checkpoint(out)
    done = int(trainer.state.global_step)
    paused = bool(budget_spent) and done < settings.steps
    if final is None or _checkpoint_step(final) != done:
        final = out / TRAINER_DIR / f"checkpoint-{done}"
        trainer.save_model(str(final))
        _save_checkpoint(final, trainer, tokenizer, {**manifest_base, "steps": done}, merged=not paused)
    elif not paused and not (final / MERGED).is_dir():  # a run resumed at its last step: its merged copy now
        _save_checkpoint(final, trainer, tokenizer, {**manifest_base, "steps": done})
    rollouts.trainer = trainer  # type: ignore[attr-defined]  # for tests and the caller's inspection
    return TrainReport(out, done, None if paused else final / MERGED, tuple(log),
                       paused_at=final if paused else None, steps_planned=settings.steps)


def _check_vllm_server(trainer: Any, url: str, processes: int) -> None:
    """Refuse a vLLM server whose log-probs are not the sampled distribution's (`llm.vllm.check_server_logprobs`):
    the main process asks it (TRL's client lives there) and every process raises the same error."""
    from metarag.llm.vllm import check_server_logprobs

    verdict: list[str | None] = [None]
    if trainer.accelerator.is_main_process:
        try:
            check_server_logprobs(trainer.vllm_generation.vllm_client.get_server_info(), url)
        except ConfigError as exc:
            verdict = [str(exc)]
        except Exception as exc:  # unreachable, or without the development endpoints TRL syncs weights through
            verdict = [f"cannot read the vLLM server's configuration at {url}: {str(exc).splitlines()[0][:200]}"]
    if processes > 1:
        from accelerate.utils import broadcast_object_list

        broadcast_object_list(verdict, from_process=0)
    if verdict[0]:
        raise ConfigError(verdict[0])


def release_freed_memory() -> float | None:
    """Hand the C heap's free pages back to the system (glibc's `malloc_trim`) and return the
    process's resident memory in GB (None where /proc does not say). A step frees tensors of many
    sizes (rollouts' key/value states, activations, a checkpoint's merged copy); glibc keeps freed
    pages in its heap, and the 1.5B run's resident memory grew from 12 to 22 GB over 14 steps (2026-12-05).
    Trimmed once a step (in `on_log`), it read 7.7-8.2 GB at each step's end over the next five steps,
    a checkpoint's save included (peaks inside a step: ~14 GB, ~19 GB while saving). A no-op beyond glibc."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024 ** 2
    except OSError:
        pass
    return None


def run_training(dataset_spec: Any, llm_spec: Any, out_dir: str | Path, settings: AgentTrainSettings, *,
                 retriever: str = "bm25", allow_any: bool = False, dry_run: bool = False,
                 reward_settings: Any = None, judge_settings: Any = None,
                 signal_questions: int | None = None) -> TrainReport | SignalReport | str:
    """`metarag train-agent`: load the training questions with their corpus (any file or preset the
    harness reads; evaluation splits refused unless `allow_any`), the base model through the
    transformers back-end (`hf`, `hf-0.5b`, `hf:PATH`), then `train_agent`. `dry_run`: check all of
    it and return the plan (device, precision, LoRA, batch, folders) without loading the model.
    `signal_questions` N: instead of training, `measure_signal` on the first N questions."""
    from metarag.evaluate.harness import load_questions
    from metarag.llm.registry import BACKENDS, backend_settings, check_spec
    from metarag.pipeline import open_retriever

    check_spec(llm_spec)
    if BACKENDS[llm_spec.backend].cls != "HFLLM":
        raise ConfigError(f"train-agent trains a transformers model: --llm hf, hf-0.5b or hf:PATH, not "
                          f"{llm_spec.label()}")
    _import_trl()
    dataset = load_questions(dataset_spec)
    check_training_split(dataset.name, dataset.path, allow_any, dataset.questions)
    if not dataset.passages:
        raise ConfigError(f"{dataset.name} has no passages to retrieve from: give it a corpus")
    import torch

    # loaded on the CPU in the precision's weight dtype; the trainer (accelerate) places it on each
    # process's own device (every process loading onto cuda:0 would not)
    weights_dtype, _ = PRECISIONS[settings.resolved_precision(torch.cuda.is_available())]
    hf_settings = dataclasses.replace(backend_settings(llm_spec), n_ctx=settings.n_ctx, device="cpu",
                                      dtype=weights_dtype)
    if settings.vllm == "colocate":  # before any weights load
        from metarag.llm.vllm import check_colocated_model

        check_colocated_model(hf_settings.path, what=f"--llm {llm_spec.label()}")
    if dry_run:
        if hf_settings.path and not Path(hf_settings.path).expanduser().exists():
            raise DataError("model file or folder not found", path=hf_settings.path)
        return training_plan(settings, llm_spec.label(), dataset, out_dir)
    from accelerate import PartialState

    # the launcher's process group before any weights load: which process reads them depends on it (load_base)
    model, tokenizer, identity, sha = load_base(hf_settings, PartialState(cpu=not torch.cuda.is_available()),
                                                training=not signal_questions)
    provenance = {"base_model": identity, "base_model_sha256": sha,
                  "data": {"name": dataset.name, "path": dataset.path, "questions": len(dataset.questions),
                           "limit": dataset_spec.limit, "sample_seed": dataset_spec.seed},
                  "data_sha256": dataset.sha256, "retriever": retriever}
    search = open_retriever(dataset.passages, retriever)
    if signal_questions:  # measure the training set's signal with the untrained model, and stop
        return measure_signal(dataset.questions, search, model, tokenizer, out_dir, settings, signal_questions,
                              reward_settings)
    return train_agent(dataset.questions, search, model, tokenizer, out_dir, settings,
                       provenance=provenance, reward_settings=reward_settings, judge_settings=judge_settings)


def training_plan(settings: AgentTrainSettings, model: str, dataset: Any, out_dir: str | Path) -> str:
    """What a run would do on this machine, in a few lines (`--dry-run`)."""
    import torch

    gpu = torch.cuda.is_available()
    lora = (not gpu) if settings.lora is None else settings.lora
    precision = settings.resolved_precision(gpu)
    out = Path(out_dir).expanduser()
    last = _last_checkpoint(out)
    return "\n".join([
        f"model: {model} on {'cuda' if gpu else 'cpu'} ({precision}), rollouts on "
        f"{'vLLM (' + settings.vllm + ')' if settings.vllm != 'off' else 'transformers'}, "
        + (f"LoRA r={settings.lora_r}" if lora else "full fine-tuning"),
        f"agent: {settings.method}, reward: {settings.reward}, {settings.max_turns} turns, top-{settings.top_k}, "
        f"{settings.step_max_tokens} tokens per step, context {settings.n_ctx}",
        f"GRPO: G={settings.group_size} x {settings.questions_per_step} question(s) per step = "
        f"{settings.group_size * settings.questions_per_step} rollouts, lr {settings.learning_rate:g}, "
        f"KL {settings.kl_coef:g}, loss {settings.loss_type}, {settings.steps} steps"
        + (f", at most {settings.time_budget_s:g} s" if settings.time_budget_s else ""),
        f"data: {dataset.name} ({len(dataset.questions)} questions, {len(dataset.passages)} passages, "
        f"sha256 {dataset.sha256[:16]})",
        f"out: {out / TRAINER_DIR}/checkpoint-N every {settings.save_every} steps"
        + (f"; resumes from {last.name}" if last is not None else ""),
    ])
