"""Build a tiny random-weight Gemma 4 (model + tokenizer + chat template) that `vllm serve` loads on CPU.

Run with the vLLM venv's python (it has transformers and tokenizers): `python tiny_gemma4.py OUT_DIR`.
Everything is made offline: a byte-level BPE trained on a small built-in corpus, the Gemma 4 control tokens the
tool-call and reasoning parsers look up, and a chat template that renders system/user/assistant/tool turns, list
content, `tools` and `enable_thinking`. Shapes follow what vLLM's CPU backend accepts (head sizes 32 and 64).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

SPECIAL_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>"]
# Control tokens of the Gemma 4 chat format; vLLM's gemma4 tool-call and reasoning parsers look them up by text.
CONTROL_TOKENS = ["<|turn>", "<turn|>", "<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>",
                  "<|tool_response>", "<tool_response|>", '<|"|>', "<|think|>"]
VOCAB_MULTIPLE = 64
TRAINING_VOCAB_SIZE = 448

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Serve an open model with vLLM on a Cloud TPU virtual machine.",
    "What is the weather in Paris today? It is sunny and warm.",
    'call:get_weather{city:<|"|>Paris<|"|>} {"name": "get_weather", "arguments": {"city": "Paris"}}',
    "user model system tool assistant thought answer yes no true false null 0123456789",
    "Hello! How can I help you? Please answer in JSON: {\"answer\": \"yes\", \"ok\": true}",
] * 20

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{%- macro render_content(content) -%}"
    "{%- if content is string -%}{{ content }}"
    "{%- elif content is iterable -%}"
    "{%- for part in content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}"
    "{%- endif -%}"
    "{%- endmacro -%}"
    "{%- if enable_thinking or tools -%}"
    "<|turn>system\n"
    "{%- if enable_thinking -%}<|think|>{%- endif -%}"
    "{%- for tool in tools or [] -%}"
    "{%- set fn = tool.function if tool.function is defined else tool -%}"
    "declaration:{{ fn.name }}{{ fn | tojson }}\n"
    "{%- endfor -%}"
    "<turn|>\n"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'tool' -%}"
    "<|tool_response>response:{{ message.name or 'tool' }}{{ render_content(message.content) }}<tool_response|>"
    "{%- else -%}"
    "<|turn>{{ 'model' if message.role == 'assistant' else message.role }}\n"
    "{{- render_content(message.content) if message.content is not none -}}"
    "{%- for call in message.tool_calls or [] -%}"
    "<|tool_call>call:{{ call.function.name }}"
    "{{ call.function.arguments if call.function.arguments is string else call.function.arguments | tojson }}"
    "<tool_call|>"
    "{%- endfor -%}"
    "<turn|>\n"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|turn>model\n{%- endif -%}"
)


def build_tokenizer(out_dir: Path) -> int:
    """Train the BPE, save it with its chat template; return the vocabulary size padded for the embeddings."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TRAINING_VOCAB_SIZE, special_tokens=SPECIAL_TOKENS + CONTROL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>",
                                   pad_token="<pad>", unk_token="<unk>",
                                   additional_special_tokens=CONTROL_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return -(-len(fast) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE


def build_model(out_dir: Path, vocab_size: int, token_ids: dict[str, int]) -> None:
    """Save a 2-layer random Gemma4ForCausalLM whose ends of turn are EOS tokens."""
    import torch
    from transformers import Gemma4ForCausalLM, Gemma4TextConfig, GenerationConfig

    eos_ids = [token_ids["<eos>"], token_ids["<turn|>"]]
    config = Gemma4TextConfig(
        vocab_size=vocab_size, vocab_size_per_layer_input=vocab_size, hidden_size=64, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=32, global_head_dim=64,
        hidden_size_per_layer_input=16, sliding_window=128, max_position_embeddings=4096,
        layer_types=["sliding_attention", "full_attention"], tie_word_embeddings=True,
        pad_token_id=token_ids["<pad>"], bos_token_id=token_ids["<bos>"], eos_token_id=eos_ids,
        architectures=["Gemma4ForCausalLM"], dtype="float32")
    torch.manual_seed(0)
    Gemma4ForCausalLM(config).to(torch.float32).save_pretrained(out_dir)
    GenerationConfig(bos_token_id=token_ids["<bos>"], eos_token_id=eos_ids,
                     pad_token_id=token_ids["<pad>"]).save_pretrained(out_dir)


def build(out_dir: Path) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    vocab_size = build_tokenizer(out_dir)
    vocab = json.loads((out_dir / "tokenizer.json").read_text())["model"]["vocab"]
    build_model(out_dir, vocab_size, {token: vocab[token] for token in SPECIAL_TOKENS + CONTROL_TOKENS})


if __name__ == "__main__":
    build(Path(sys.argv[1]))
