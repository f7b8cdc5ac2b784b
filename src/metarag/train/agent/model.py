"""The policy model around the trainer: loaded once the process group exists (only the main process
reads the weights under FSDP2's rank-0 loading; the KL reference built on the meta device), gathered
whole on every process for a step's rollouts (`whole_for_rollouts`), and its frozen weights cast to
bf16 once for the CPU's autocast (`frozen_linears_as`). torch, accelerate, TRL and transformers are
imported inside the functions."""
from __future__ import annotations

import contextlib
import os
from typing import Any

from metarag.errors import ConfigError
from metarag.train.agent.settings import AgentTrainSettings


def fsdp2_launch() -> bool:
    """Whether this process was started by `accelerate launch` under FSDP2 (the environment its launcher
    writes from the configuration, e.g. configs/accelerate/8gpu-fsdp.yaml)."""
    env = os.environ
    return env.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and env.get("FSDP_VERSION", "1") == "2"


def rank0_loading() -> bool:
    """Whether only the main process needs the weights: FSDP2 with `cpu_ram_efficient_loading`, where
    accelerate shards the model on the meta device and sends the main process's weights into the shards
    (`accelerate.utils.fsdp_utils.fsdp2_prepare_model`)."""
    return fsdp2_launch() and os.environ.get("FSDP_CPU_RAM_EFFICIENT_LOADING", "false").lower() == "true"


def load_base(hf_settings: Any, state: Any, training: bool = True) -> tuple[Any, Any, str, str | None]:
    """The base model to train, its tokenizer, identity and weights sha256, loaded once the process group
    exists (`state`, accelerate's `PartialState`): for `training` under FSDP2's rank-0 loading
    (`rank0_loading`) only the main process reads the weights, every other holds the architecture on the
    meta device (`llm.hf_loading.meta_model`) and is sent the identity; otherwise (one process, DDP, where every
    process needs the whole model, or rollouts without a trainer) each process loads it."""
    from metarag.llm.hf import HFLLM
    from metarag.llm.hf_loading import meta_model

    if training and state.num_processes > 1 and not state.is_main_process and rank0_loading():
        model, tokenizer = meta_model(hf_settings)
        identity, sha = None, None
    else:
        base = HFLLM(hf_settings)
        model, tokenizer, identity, sha = trainable(base.model), base.tokenizer, base.identity, base.model_sha256
    if state.num_processes > 1:
        from accelerate.utils import broadcast_object_list

        names = [identity, sha]
        broadcast_object_list(names, from_process=0)
        identity, sha = names
    return model, tokenizer, str(identity), sha


def meta_reference(model: Any) -> Any:
    """The policy's architecture with its parameters on the meta device (its non-persistent buffers, the
    rotary frequencies, computed: FSDP2 sends only the state dict), in its dtype and attention: the KL
    reference model TRL shards under FSDP2 before the main process's starting weights are sent into it
    (`StepPackedGRPOTrainer`), instead of a full copy in every process's host memory."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    with init_empty_weights(include_buffers=False):
        reference = AutoModelForCausalLM.from_config(model.config, dtype=model.dtype,
                                                     attn_implementation=model.config._attn_implementation)
    reference.tie_weights()  # as the policy's: the same parameter names
    return reference


def trainable(model: Any) -> Any:
    """The model with transformers' GGUF marker removed: an embedded GGUF read through transformers is
    dequantized to float on load, but stays flagged as quantized, which the Trainer refuses to train
    and `save_pretrained` would record. Any other quantization is left as it is (and refused there)."""
    quantizer = getattr(model, "hf_quantizer", None)
    method = getattr(getattr(quantizer, "quantization_config", None), "quant_method", None)
    if quantizer is not None and str(getattr(method, "value", method)).lower() == "gguf":
        model.hf_quantizer = None
        model.is_quantized = False
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
    return model


@contextlib.contextmanager
def frozen_linears_as(model: Any, dtype: str):
    """Inside, every linear layer's frozen float32 weight and bias (LoRA's base layers, the LM head)
    are `dtype` copies, made once; on leaving, the originals are back. Under autocast to that dtype a
    linear layer computes from a cast of its weight, and autocast keeps the cast only for a weight
    that trains: a frozen one is cast again at every forward, i.e. at every generated token, which
    made the cast (the whole model's weights read and written) most of a CPU rollout's decode time.
    The same casts made once give the same logits, bit for bit (the cast is deterministic): the
    0.5B decoded a token 2.4x faster (benchmarks/frozen_cast.py). The rollouts run inside it, and so
    does each training_step of `StepPackedGRPOTrainer` (`cast_frozen`: one CPU process): the backward
    reads the same casts autocast would have saved, so the gradient is the same too. A tied LM head
    gets a copy of its own; the embedding it is tied to stays as it was. Yields how many tensors were
    swapped."""
    import torch

    target = getattr(torch, dtype)
    swapped = []
    try:
        for module in model.modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            for name in ("weight", "bias"):
                tensor = getattr(module, name, None)
                if isinstance(tensor, torch.nn.Parameter) and not tensor.requires_grad \
                        and tensor.dtype == torch.float32:
                    swapped.append((module, name, tensor))
                    setattr(module, name, torch.nn.Parameter(tensor.detach().to(target), requires_grad=False))
        yield len(swapped)
    finally:
        for module, name, tensor in reversed(swapped):
            setattr(module, name, tensor)


@contextlib.contextmanager
def fsdp2_unsharded(module: Any):
    """Inside, every FSDP2 unit of `module` holds its full parameters, gathered once on entry (one
    all-gather a unit, in the same order on every process) and kept through every forward (no reshard
    after each), then sharded again on leaving. Rollouts call the model a different number of times on
    each process (each samples its own rollouts: other lengths, turns and probes), and a sharded unit
    all-gathers its parameters at every call, a collective every process must join: without this, a
    process waits on a gather no other process makes. Under the accelerate configuration's bf16 mixed
    precision the gathered parameters are bf16 (FSDP2's `param_dtype`), 2 bytes a parameter on every GPU
    while the rollouts run. A module without FSDP2 units is left as it is. (TRL's
    `unwrap_model_for_generation` gathers under DeepSpeed ZeRO-3 only; its `summon_full_params` does
    nothing under FSDP2: trl/distributed.py.)"""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch without FSDP2
        yield module
        return
    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not units:
        yield module
        return
    states = [unit._get_fsdp_state() for unit in units]
    states[0]._lazy_init()  # the root settles which unit reshards after forward before any forward has run
    # what each unit does after a forward, restored on leaving (FSDP2 keeps it per parameter group)
    saved = [(state._auto_reshard_after_forward, [group.post_forward_mesh_info for group in state._fsdp_param_groups])
             for state in states]
    for unit in units:
        unit.unshard()
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
    try:
        yield module
    finally:
        for state, (auto, infos) in zip(states, saved):
            state._auto_reshard_after_forward = auto
            for group, info in zip(state._fsdp_param_groups, infos):
                group.post_forward_mesh_info = info
        for unit in units:
            unit.reshard()


@contextlib.contextmanager
def whole_for_rollouts(trainer: Any, reference: bool = False):
    """The trainer's policy, whole on every process, for a step's rollouts (and with `reference` the
    KL reference model too, which the frozen belief probe reads): FSDP2 units gathered for the whole
    rollout phase (`fsdp2_unsharded`), DeepSpeed ZeRO-3 through TRL's `unwrap_model_for_generation`
    (which also turns gradient checkpointing off for generation). Yields the policy as generation
    takes it. FSDP version 1 and a ZeRO-3 reference model are refused before training (`check_sharding`)."""
    from trl.models.utils import unwrap_model_for_generation

    with contextlib.ExitStack() as stack:
        stack.enter_context(fsdp2_unsharded(trainer.model_wrapped))
        ref = getattr(trainer, "ref_model", None)
        if reference and ref is not None:
            stack.enter_context(fsdp2_unsharded(ref))
        yield stack.enter_context(unwrap_model_for_generation(
            trainer.model_wrapped, trainer.accelerator,
            gather_deepspeed3_params=trainer.args.ds3_gather_for_generation))


def check_sharding(trainer: Any, settings: AgentTrainSettings, lora: bool) -> None:
    """Refuse what the rollouts cannot run whole on every process: FSDP version 1 (its
    `summon_full_params` refuses a forward inside it, and outside it every call gathers: the
    processes' different call counts would hang), a ZeRO-3 policy not gathered for generation, and
    the frozen belief probe on a ZeRO-3 reference model (nothing gathers it). The same on every process."""
    from trl.distributed import DistributedBackend

    backend = DistributedBackend(trainer.accelerator)
    if backend.fsdp_version == 1:
        raise ConfigError("FSDP version 1 cannot give the rollouts the whole model: set fsdp_version: 2 "
                          "(configs/accelerate/8gpu-fsdp.yaml)")
    if backend.is_zero3 and not trainer.args.ds3_gather_for_generation:
        raise ConfigError("DeepSpeed ZeRO-3 rollouts need the policy gathered (ds3_gather_for_generation)")
    if backend.is_zero3 and settings.probe_weights == "frozen" and not lora:
        raise ConfigError("probe_weights 'frozen' reads the KL reference model, which DeepSpeed ZeRO-3 shards and "
                          "nothing gathers for the rollouts: train with LoRA, or under FSDP2")
