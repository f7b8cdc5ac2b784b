"""A training run's checkpoints: written beside TRL's files (`merged/`, the full model a `--llm hf:PATH`
evaluates, and the manifest), found again (`_last_checkpoint`), and a folder that holds a run with
another model, data or reward refused before it is resumed (`_check_resumable`)."""
from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from metarag.errors import ConfigError
from metarag.train.agent.settings import MANIFEST, MERGED, TRAINER_DIR


def _save_checkpoint(folder: Path, trainer: Any, tokenizer: Any, manifest: dict[str, Any],
                     merged: bool = True) -> None:
    """Beside TRL's checkpoint files (a LoRA run's adapter among them, at the folder's top): `merged/`
    unless `merged` is false (the full model, adapter merged in, safetensors and the tokenizer: a
    folder `--llm hf:PATH` loads) and the manifest with the merged model's hash (None without one)
    and the adapter's folder. No second copy of the adapter in a sub-folder: transformers would load
    it on resume as one more adapter (`_load_from_checkpoint`).
    Every process takes part in gathering a sharded model's weights (ZeRO-3 / FSDP); the main
    process alone writes."""
    import copy

    from metarag.llm.hf_loading import folder_sha256

    accelerator = trainer.accelerator
    inner = accelerator.unwrap_model(trainer.model)
    adapter = hasattr(inner, "merge_and_unload")
    # collective when sharded: every process (the flag is the same in all of them)
    state = None if adapter or not merged else accelerator.get_state_dict(trainer.model_wrapped)
    if not accelerator.is_main_process:
        accelerator.wait_for_everyone()
        return
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / MERGED
    if merged and adapter:
        full = copy.deepcopy(inner).merge_and_unload()
        _stop_tokens_from(tokenizer, full)
        full.save_pretrained(str(target), safe_serialization=True)
        del full
    elif merged:
        _stop_tokens_from(tokenizer, inner)
        inner.save_pretrained(str(target), state_dict=state, safe_serialization=True)
    if merged:
        tokenizer.save_pretrained(str(target))
    record = {**manifest, "merged": str(target) if merged else None,
              "merged_sha256": folder_sha256(target) if merged else None,
              "adapter": str(folder) if adapter and (folder / "adapter_config.json").exists() else None,
              "saved": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    (folder / MANIFEST).write_text(json.dumps(record, indent=2, default=str) + "\n")
    accelerator.wait_for_everyone()


def _stop_tokens_from(tokenizer: Any, model: Any) -> None:
    """Align a model's stop and padding ids with its tokenizer's, as Trainer.train() does before it
    trains, so that `merged/` is the same folder however it was written: a finished run re-run only
    to write its missing merged copy never calls train(). transformers' own `align_special_tokens`
    where it has one (it keeps every end-of-sequence id the config declares, as a list); older
    versions fill only the ids the generation config lacks."""
    if tokenizer is None or getattr(model, "generation_config", None) is None:
        return
    try:
        from transformers.trainer_utils import align_special_tokens
    except ImportError:  # an older transformers
        for key in ("eos_token_id", "pad_token_id"):
            if getattr(model.generation_config, key, None) is None and getattr(tokenizer, key, None) is not None:
                setattr(model.generation_config, key, int(getattr(tokenizer, key)))
        return
    align_special_tokens(model, tokenizer)


def _checkpoint_step(folder: Path) -> int:
    return int(folder.name.rsplit("-", 1)[1])


def _last_checkpoint(out: Path) -> Path | None:
    """The newest complete checkpoint (TRL's files and our manifest) under out/trainer."""
    root = out / TRAINER_DIR
    if not root.is_dir():
        return None
    done = [p for p in root.glob("checkpoint-*") if p.name.split("-")[-1].isdigit()
            and (p / MANIFEST).exists() and (p / "trainer_state.json").exists()]
    return max(done, key=_checkpoint_step) if done else None


_RESUME_KEYS = ("method", "reward", "reward_settings", "judge_settings", "base_model_sha256", "data_sha256", "lora",
                "think_prefix", "scale_rewards", "probe_weights")
# what a run saved before a key was recorded had (`_check_resumable`)
_RESUME_BEFORE = {"scale_rewards": "group", "probe_weights": "policy"}


def _settings_defaults(key: str) -> dict[str, Any]:
    """The defaults of the settings class a manifest's `key` records (reward or HiPRAG judge settings)."""
    from metarag.judges.process import ProcessJudgeSettings
    from metarag.train.rewards import RewardSettings

    cls = {"reward_settings": RewardSettings, "judge_settings": ProcessJudgeSettings}.get(key)
    return dataclasses.asdict(cls()) if cls is not None else {}


def _check_resumable(out: Path, manifest: dict[str, Any]) -> None:
    """A folder holding a run with another model, data or reward is refused, not silently resumed."""
    last = _last_checkpoint(out)
    if last is None:
        return
    old = json.loads((last / MANIFEST).read_text())
    for key in _RESUME_KEYS:
        before, now = old.get(key, _RESUME_BEFORE.get(key)), manifest.get(key)
        if isinstance(before, dict) and isinstance(now, dict):
            # a setting added since the run was saved, at its default, is what the run had
            defaults = _settings_defaults(key)
            before = {**{k: v for k, v in now.items() if k not in before and k in defaults and defaults[k] == v},
                      **before}
        if (key in manifest or key in old) and json.dumps(before, default=str, sort_keys=True) != json.dumps(
                now, default=str, sort_keys=True):
            raise ConfigError(f"{out} holds a training run with another {key} ({old.get(key)!r}, now "
                              f"{manifest.get(key)!r}): give a new --out, or the same settings to resume")
