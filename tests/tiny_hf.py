"""A tiny randomly initialised Qwen2 model and a small byte-level BPE tokenizer, built in seconds,
for the transformers back-end's tests (no download, no model file)."""
from __future__ import annotations

import functools

CORPUS = ["The capital of France is Paris. Lyon is a city in France. Answer Yes or No. Yes sir, no sir.",
          "Gustave Eiffel was born in Dijon. The answer is Dijon. Question: Who built the tower?"] * 20
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@functools.lru_cache(maxsize=1)
def tiny_model_and_tokenizer():
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator(CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = CHATML
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         tie_word_embeddings=True, attn_implementation="eager")
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    with torch.no_grad():  # special tokens get logit 0 (tied embeddings): the model rarely ends its turn
        for special in SPECIALS:
            model.model.embed_tokens.weight[tokenizer.convert_tokens_to_ids(special)] = 0
    return model, tokenizer


def tiny_llm(identity: str = "tiny-qwen2:seed0"):
    from metarag.llm.hf import HFLLM

    model, tokenizer = tiny_model_and_tokenizer()
    return HFLLM.from_model(model, tokenizer, identity=identity)
