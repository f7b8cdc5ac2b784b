"""A tiny llama-architecture GGUF written with the `gguf` package (no converter, no download): a
byte-level BPE vocabulary plus added special tokens of Self-RAG's kind ("[Relevant]", "[Retrieval]"
..., token type CONTROL, as a converter writes a tokenizer's added special tokens), and weights that
make the next-token distribution the same after any prompt, with `favour` the most likely token."""
from __future__ import annotations

from pathlib import Path

SPECIALS = ("<|im_end|>", "[Relevant]", "[Irrelevant]", "[Retrieval]", "[No Retrieval]")


def _byte_tokens() -> list[str]:
    """GPT-2's byte-to-unicode alphabet, one token a byte: the printable bytes as themselves, then
    the others mapped to the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return [chr(b) for b in printable] + [chr(256 + i) for i in range(len(others))]


def write_tiny_gguf(path: str | Path, favour: str = "[Relevant]", logit: float = 0.2) -> list[str]:
    """Write the GGUF; return its vocabulary. Every token embeds as ones, the block's weights are
    zero, so the last hidden state is all ones after the final norm and the output row of `favour`
    (all `logit`) gives it a logit of 32 × `logit`, every other token 0."""
    import gguf
    import numpy as np

    embed, ff = 32, 64
    tokens = _byte_tokens() + ["Ġt", *SPECIALS]
    types = [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS)) + [gguf.TokenType.CONTROL] * len(SPECIALS)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny-special-tokens")
    writer.add_context_length(256)
    writer.add_embedding_length(embed)
    writer.add_block_count(1)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(2)
    writer.add_head_count_kv(2)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(embed // 2)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([int(t) for t in types])
    writer.add_token_merges(["Ġ t"])  # llama.cpp refuses a BPE vocabulary without merges
    writer.add_eos_token_id(tokens.index("<|im_end|>"))
    writer.add_bos_token_id(tokens.index("<|im_end|>"))
    writer.add_add_bos_token(False)
    writer.add_chat_template("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
                             "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    f32 = np.float32
    writer.add_tensor("token_embd.weight", np.ones((len(tokens), embed), f32))
    for name, shape in (("attn_q", (embed, embed)), ("attn_k", (embed, embed)), ("attn_v", (embed, embed)),
                        ("attn_output", (embed, embed)), ("ffn_gate", (ff, embed)), ("ffn_up", (ff, embed)),
                        ("ffn_down", (embed, ff))):
        writer.add_tensor(f"blk.0.{name}.weight", np.zeros(shape, f32))
    for name in ("blk.0.attn_norm", "blk.0.ffn_norm", "output_norm"):
        writer.add_tensor(f"{name}.weight", np.ones(embed, f32))
    output = np.zeros((len(tokens), embed), f32)
    output[tokens.index(favour)] = logit
    writer.add_tensor("output.weight", output)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tokens
