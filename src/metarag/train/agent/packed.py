"""The trainer: TRL's `GRPOTrainer` made to train each decision step on the context it was sampled
from (`step_packed_trainer`: a packed row's position ids and block-causal mask, or one pass a segment
on the CPU), with a sampler that draws an epoch's questions from the seed alone, so a resumed run
draws what the uninterrupted one did (`epoch_sampler`; `training_order` reproduces the order)."""
from __future__ import annotations

import contextlib
import time
from typing import Any

from metarag.errors import ConfigError
from metarag.train.agent.layout import POSITIONS_FIELD
from metarag.train.agent.model import frozen_linears_as, fsdp2_launch, meta_reference


def packed_inputs(attention_mask: Any, completion_positions: Any, logits_to_keep: int, *, boolean: bool,
                  with_mask: bool = True):
    """The position ids and the 4D attention mask of a batch of packed rollouts. `attention_mask` is
    TRL's (B, P + C) padding mask (prompt left-padded, completion right-padded); `completion_positions`
    (B, ≤ C) the rollouts' `RolloutSample.positions`. A token attends to the earlier tokens of its own
    segment only (a segment starts where the positions restart at 0); padding attends to itself only,
    so that no row of the mask is empty. `boolean`: True where attention is allowed (sdpa); else
    additive, 0 or the float32 minimum (eager). `with_mask` False: the positions only (mask None), for
    passes that run a segment at a time."""
    import torch

    batch, width = attention_mask.shape
    prompt_width = width - logits_to_keep
    valid = attention_mask.bool()
    positions = torch.zeros_like(attention_mask, dtype=torch.long)
    prompt_mask = attention_mask[:, :prompt_width].long()
    positions[:, :prompt_width] = (prompt_mask.cumsum(-1) - 1).clamp(min=0)
    given = completion_positions.to(attention_mask.device).long()[:, :logits_to_keep]
    positions[:, prompt_width:prompt_width + given.size(1)] = given
    if not with_mask:
        return positions, None
    starts = (positions == 0) & valid
    segment = starts.long().cumsum(-1)
    same = segment.unsqueeze(2) == segment.unsqueeze(1)
    causal = torch.ones(width, width, dtype=torch.bool, device=attention_mask.device).tril()
    allowed = same & causal & valid.unsqueeze(1) & valid.unsqueeze(2)
    allowed |= torch.eye(width, dtype=torch.bool, device=attention_mask.device)  # padding sees itself
    mask = allowed.unsqueeze(1)
    if not boolean:
        mask = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_fill(
            ~mask, torch.finfo(torch.float32).min)
    return positions, mask


@contextlib.contextmanager
def scored_positions_only(device: Any):
    """TRL's fused LM head (`add_fused_lm_head`) projects only the positions that carry a label on a
    Triton device (CUDA, XPU), and every position elsewhere, so that an accelerator compiling fixed
    tile shapes (Neuron) does not recompile per batch. On the CPU nothing compiles, and the head is
    float32 over the 151,936-token vocabulary: a packed row's prompts (every step's, three quarters of
    its tokens) cost as much in the head as the tokens the loss counts. Inside this context, on the
    CPU, the head takes the labelled positions only: the same log-probs and gradient (zeros elsewhere,
    as before), less work. A TRL without the switch is left as it is."""
    from trl.trainer import utils

    original = getattr(utils, "_use_triton", None)
    if original is None or getattr(device, "type", None) != "cpu":
        yield
        return
    utils._use_triton = lambda where: where.type == "cpu" or original(where)
    try:
        yield
    finally:
        utils._use_triton = original


def epoch_sampler(sampler: Any) -> Any:
    """TRL's GRPO `RepeatSampler` as one that draws epoch e's question order from the seed alone.

    TRL's sampler draws one `torch.randperm` an epoch from a generator it seeds once, so epoch e's
    order is the generator's e-th permutation. A resumed run builds a new sampler, and transformers'
    Trainer no longer iterates the epochs it skips: the new generator's first permutation came back
    (a run resumed in epoch 4 drew epoch 1's order, then epoch 2's: found in the retry's rollout log,
    steps 16-20). This one is told its epoch (`set_epoch`: the step-packed trainer's callback calls it as each
    epoch begins, across processes too) and re-seeds and skips e permutations before drawing, so a
    resumed run draws what the uninterrupted run draws (`training_order` reproduces it). A sampler
    that is not TRL's, or one without a seed, is returned as it is."""
    from trl.trainer.utils import RepeatSampler

    if type(sampler) is not RepeatSampler or not sampler.shuffle or sampler.seed is None:
        return sampler

    class EpochSampler(RepeatSampler):
        epoch: int | None = None

        def set_epoch(self, epoch: int) -> None:
            self.epoch = int(epoch)

        def __iter__(self):
            import torch

            if self.epoch is not None:
                self.generator.manual_seed(self.seed)
                for _ in range(self.epoch):
                    torch.randperm(self.num_samples, generator=self.generator)
            return super().__iter__()

    return EpochSampler(sampler.data_source, sampler.mini_repeat_count, sampler.batch_size, sampler.repeat_count,
                        sampler.shuffle, sampler.seed)


def training_order(questions: int, seed: int, per_step: int, steps: int) -> list[tuple[int, ...]]:
    """The training questions (indices into the training set) each step draws, as TRL's GRPO sampler
    (`RepeatSampler`) draws them: a generator seeded with the run's seed, one `torch.randperm` an
    epoch, cut into steps of `per_step` questions, an epoch's last incomplete step left out (with 17
    questions and 4 a step, 16 are trained each epoch and a different one waits). A resumed run skips
    the steps already done and draws the same order. Needs torch."""
    import torch

    if per_step < 1 or questions < per_step:
        raise ConfigError(f"{questions} training questions cannot fill a step of {per_step}")
    generator = torch.Generator()
    generator.manual_seed(seed)
    order: list[tuple[int, ...]] = []
    while len(order) < steps:
        epoch = torch.randperm(questions, generator=generator).tolist()
        order += [tuple(epoch[i:i + per_step]) for i in range(0, questions - per_step + 1, per_step)]
    return order[:steps]


def step_packed_trainer(trl: Any) -> type:
    """TRL's `GRPOTrainer` that trains each decision step on the context it was sampled from: the
    rollouts' position ids (`POSITIONS_FIELD`) travel with the batch (`completion_positions`, shuffled
    and split with it), and every log-prob pass (policy, old, reference) gives the model those
    positions and the block-causal mask of `packed_inputs`. Rows without a restart get the plain
    causal mask and positions, i.e. exactly what TRL computes. Text models with sdpa or eager
    attention (a 4D mask; flash attention takes none)."""
    import copy

    import torch
    from transformers import TrainerCallback

    class _SamplerEpoch(TrainerCallback):
        """Tells the sampler each epoch it starts. accelerate's loader passes `set_epoch` on to the
        sampler in one process but not through the batch sampler it shards across processes (nor
        through the one that skips a resumed epoch's done steps there), so the trainer tells it here:
        the epoch is the state's at the epoch's start (a resumed run's is read from its checkpoint, e.g.
        3.75 in the fourth epoch)."""

        def __init__(self, trainer: Any):
            self.trainer = trainer

        def on_epoch_begin(self, args, state, control, **kwargs):
            sampler = self.trainer._epoch_sampler
            if hasattr(sampler, "set_epoch"):
                sampler.set_epoch(int(state.epoch + 1e-6))

    class StepPackedGRPOTrainer(trl.GRPOTrainer):
        """(see `step_packed_trainer`) The reference model of full fine-tuning with a KL term is a
        frozen copy of the policy as it starts, not a model TRL re-loads from the policy's config
        path (which an in-memory model, or one read from a GGUF file, does not have); there is none at
        KL 0 (TRL's rule too). Under FSDP2 the copy is the policy's architecture on the meta device
        (`meta_reference`), given the main process's starting weights as TRL shards it: no process
        holds a second full copy in host memory."""

        def __init__(self, *args, model: Any = None, peft_config: Any = None, **kwargs):
            from trl.trainer import grpo_trainer

            needs_reference = peft_config is None and float(getattr(kwargs.get("args"), "beta", 0.0)) != 0.0 \
                and not hasattr(model, "peft_config")
            sharded = needs_reference and fsdp2_launch()
            snapshot = (meta_reference(model) if sharded else copy.deepcopy(model)) if needs_reference else None
            load = grpo_trainer.create_model_from_path

            def reference(model_id: str, **init: Any) -> Any:
                dtype = init.get("dtype")
                return snapshot.to(dtype) if isinstance(dtype, torch.dtype) else snapshot

            grpo_trainer.create_model_from_path = reference if snapshot is not None else load
            try:
                super().__init__(*args, model=model, peft_config=peft_config, **kwargs)
            finally:
                grpo_trainer.create_model_from_path = load
            if sharded and self.ref_model is not None:  # sharded on the meta device: the starting weights now
                from accelerate.utils.fsdp_utils import fsdp2_load_full_state_dict

                fsdp2_load_full_state_dict(self.accelerator, self.ref_model,
                                           model.state_dict() if self.accelerator.is_main_process else {})
            self.add_callback(_SamplerEpoch(self))

        def _get_train_sampler(self, dataset: Any = None) -> Any:
            """TRL's sampler, made to draw epoch e's order on resume too (`epoch_sampler`)."""
            self._epoch_sampler = epoch_sampler(super()._get_train_sampler(dataset))
            return self._epoch_sampler

        _epoch_sampler = None

        def _load_from_checkpoint(self, resume_from_checkpoint: str, model: Any = None) -> None:
            """transformers' loading, then every adapter but the trained one dropped. It loads the
            adapter at a checkpoint's top into the trained adapter and any sub-folder holding adapter
            weights as one more adapter, named after the folder: checkpoints written before
            2026-12-06 kept a copy of their adapter in adapter/, so each resume of them carried an
            idle second adapter ("adapter", never active, never trained) and each save after it
            wrote that one again, nested (checkpoint-N/adapter/adapter/: 74 MB for the 1.5B)."""
            super()._load_from_checkpoint(resume_from_checkpoint, model)
            loaded = model if model is not None else self.model
            configs = getattr(loaded, "peft_config", None)
            if isinstance(configs, dict):
                for name in [n for n in configs if n not in loaded.active_adapters]:
                    loaded.delete_adapter(name)

        _scoring_positions = None
        _in_loss = False
        packed_passes = "mask"  # or "split" (AgentTrainSettings.packed_passes, resolved by train_agent)
        cast_frozen = False  # bf16 copies of the frozen weights for each training_step (`frozen_linears_as`)
        # seconds of the current optimizer step, logged as time/* metrics when it ends: the rollout
        # function, the log-prob passes outside the loss (the reference model's), and the policy's
        # forward and backward (everything else in the step's training_step calls)
        _seconds = {"rollouts": 0.0, "reference": 0.0, "policy": 0.0}
        _scoring = 0.0
        _loss_mask = None

        def training_step(self, model, inputs, num_items_in_batch):
            self._scoring = 0.0
            start = time.perf_counter()
            cast = frozen_linears_as(self.accelerator.unwrap_model(model), "bfloat16") if self.cast_frozen \
                else contextlib.nullcontext()
            with cast:  # the forward, the backward and any recomputation: the frozen weights cast once
                out = super().training_step(model, inputs, num_items_in_batch)
            self._seconds = {**self._seconds,
                             "policy": self._seconds["policy"] + time.perf_counter() - start - self._scoring}
            if self._step % self.current_gradient_accumulation_steps == 0:  # TRL counted this micro-step
                for part, seconds in self._seconds.items():
                    self._metrics["train"][f"time/{part}"].append(seconds)
                self._seconds = dict.fromkeys(self._seconds, 0.0)
            return out

        def _generate(self, prompts):
            start = time.perf_counter()
            out = super()._generate(prompts)
            self._seconds = {**self._seconds, "rollouts": self._seconds["rollouts"] + time.perf_counter() - start}
            positions = out[5].pop(POSITIONS_FIELD, None)  # extra_fields: not a reward column
            if positions is not None:
                width = max(len(p) for p in positions)
                table = torch.zeros((len(positions), width), dtype=torch.long)
                for i, row in enumerate(positions):
                    table[i, :len(row)] = torch.tensor(row, dtype=torch.long)
                    if len(row) < width:  # right padding goes on counting (it is masked out anyway)
                        table[i, len(row):] = torch.arange(len(row), width) + (row[-1] if row else 0) + 1
                self._scoring_positions = table.to(self.accelerator.device)
            return out

        def _generate_and_score_completions(self, inputs):
            start = time.perf_counter()
            try:
                output = super()._generate_and_score_completions(inputs)
                if self._scoring_positions is not None:
                    output["completion_positions"] = self._scoring_positions
                return output
            finally:
                self._scoring_positions = None
                self._scoring += time.perf_counter() - start

        def _compute_loss(self, model, inputs):
            self._scoring_positions = inputs.get("completion_positions")
            # the tokens the loss counts (TRL's own mask): the LM head is run at no other position
            mask = inputs["completion_mask"]
            self._loss_mask = mask if "tool_mask" not in inputs else mask * inputs["tool_mask"]
            self._in_loss = True
            try:
                return super()._compute_loss(model, inputs)
            finally:
                self._scoring_positions = self._loss_mask = None
                self._in_loss = False

        def _get_per_token_logps_and_entropies(self, model, input_ids, attention_mask, logits_to_keep,
                                               batch_size=None, compute_entropy=False, compute_aux_loss=False,
                                               **multimodal):
            if not self._in_loss:
                start = time.perf_counter()
                try:
                    return self._logps(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                                       compute_aux_loss, **multimodal)
                finally:
                    self._seconds = {**self._seconds,
                                     "reference": self._seconds["reference"] + time.perf_counter() - start}
            return self._logps(model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                               compute_aux_loss, **multimodal)

        def _logps(self, model, input_ids, attention_mask, logits_to_keep, batch_size, compute_entropy,
                   compute_aux_loss, **multimodal):
            positions = self._scoring_positions
            packed = positions is not None and positions.size(0) == input_ids.size(0)
            if any(v is not None for v in multimodal.values()):
                if packed:
                    raise ConfigError("packed step training takes text models only")
                return super()._get_per_token_logps_and_entropies(
                    model, input_ids, attention_mask, logits_to_keep, batch_size=batch_size,
                    compute_entropy=compute_entropy, compute_aux_loss=compute_aux_loss, **multimodal)
            attn = str(getattr(self.accelerator.unwrap_model(model).config, "_attn_implementation", "eager"))
            if packed and "flash" in attn:
                raise ConfigError(f"packed step training needs attn_implementation sdpa or eager, not {attn}")
            batch_size = batch_size or input_ids.size(0)
            logps, entropies, aux = [], [], []
            for start in range(0, input_ids.size(0), batch_size):
                end = min(start + batch_size, input_ids.size(0))
                ids, pad = input_ids[start:end], attention_mask[start:end]
                split = packed and self.packed_passes == "split" and not compute_aux_loss
                position_ids, mask = (packed_inputs(pad, positions[start:end], logits_to_keep, boolean=attn == "sdpa",
                                                    with_mask=not split)
                                      if packed else (None, pad))  # unpacked: TRL's own inputs
                labels = ids.masked_fill(pad == 0, -100)
                labels[:, :-logits_to_keep] = -100
                loss_mask = self._loss_mask if self._in_loss else None
                if loss_mask is not None and loss_mask.shape == (input_ids.size(0), logits_to_keep):
                    # What the loss leaves out (a packed row's later prompts, an injected <information>
                    # block) gets no label: the fused LM head (float32, the vocabulary wide) skips it, as it
                    # skips a prompt (`scored_positions_only`; its log-prob reads 0 and is multiplied by 0).
                    # The loss and its gradient are unchanged.
                    labels[:, -logits_to_keep:] = labels[:, -logits_to_keep:].masked_fill(
                        loss_mask[start:end] == 0, -100)
                extra = {"output_router_logits": True} if compute_aux_loss else {}
                if split:
                    row_logps, row_entropies = self._segment_passes(model, ids, pad, position_ids, labels,
                                                                    compute_entropy)
                    logps.append(row_logps[:, -logits_to_keep:])
                    if compute_entropy:
                        entropies.append(row_entropies[:, -logits_to_keep:])
                    continue
                with self.accelerator.autocast(), scored_positions_only(ids.device):
                    out = model(input_ids=ids, attention_mask=mask, position_ids=position_ids, labels=labels,
                                fused_lm_head=True, **extra)
                logps.append(out.log_probs[:, -logits_to_keep:])
                if compute_entropy:
                    entropies.append(out.entropy[:, -logits_to_keep:])
                if compute_aux_loss:
                    aux.append(out.aux_loss)
            return (torch.cat(logps, dim=0), torch.cat(entropies, dim=0) if compute_entropy else None,
                    torch.stack(aux).mean() if compute_aux_loss else None)

        def _segment_passes(self, model, ids, pad, position_ids, labels, compute_entropy):
            """Per-token log-probs (and entropies) of packed rows, one forward per segment (a run of
            positions counting up from 0) under the plain causal mask: what the block-causal mask of
            `packed_inputs` computes, without the attention across segments that the mask throws away.
            A segment's first token has no context of its own: it reads 0 (it is a prompt token the
            loss leaves out). Padding reads 0."""
            logps = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device)
            entropies = torch.zeros(ids.shape, dtype=torch.float32, device=ids.device) if compute_entropy else None
            for row in range(ids.size(0)):
                where = pad[row].nonzero().flatten()
                if where.numel() == 0:
                    continue
                starts = (position_ids[row, where] == 0).nonzero().flatten().tolist()
                bounds = sorted({0, *starts}) + [where.numel()]
                for a, b in zip(bounds, bounds[1:]):
                    span = where[a:b]
                    if not bool((labels[row, span[1:]] != -100).any()):
                        continue  # nothing scored in this segment
                    with self.accelerator.autocast(), scored_positions_only(ids.device):
                        out = model(input_ids=ids[row, span][None], position_ids=position_ids[row, span][None],
                                    labels=labels[row, span][None], fused_lm_head=True)
                    scored = (torch.full_like(span[1:], row), span[1:])  # the head's outputs are shifted by one
                    logps = logps.index_put(scored, out.log_probs[0].float())
                    if compute_entropy:
                        entropies = entropies.index_put(scored, out.entropy[0].float())
            return logps, entropies

    return StepPackedGRPOTrainer
