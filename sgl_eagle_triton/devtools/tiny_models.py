"""Tiny random-weight Llama target + EAGLE draft checkpoints, written on demand (no model hub).

Used by ``python -m sgl_eagle_triton demo`` and by the tests. The target is a 4-layer Llama
(hidden 256, vocab 2048); the draft is SGLang's ``LlamaForCausalLMEagle3`` (EAGLE-3: one layer fed
the target's hidden states at layers 0-2, its own 512-token vocabulary mapped to target ids by
``d2t``) or ``LlamaForCausalLMEagle`` (EAGLE-1/2). These shapes run on the air-gapped GPU bundle
(``docs/gpu.md``). With random weights the draft is almost never right, so the
acceptance length is about 1.0.

The target gets a byte-level BPE tokenizer covering all 2048 ids (6 special tokens, 256 bytes,
1786 fixed merges) and a chat template, so every text endpoint works; pass ``tokenizer_dir`` to
copy an existing tokenizer instead.
"""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, VOCAB, DRAFT_VOCAB = 256, 4, 2, 64, 512, 2048, 512
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")
SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>", "<|pad|>", "<|system|>", "<|user|>", "<|assistant|>")
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<|' + message['role'] + '|>\\n' + message['content']"
    " + eos_token + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
_MERGE_CHARS = "etaoinsrhldcumfpgwybvkxjqzĠĊ_():.,=0123456789"  # byte-level chars; Ġ = space, Ċ = newline
_COMMON = {
    "model_type": "llama",
    "hidden_size": HIDDEN,
    "intermediate_size": INTERMEDIATE,
    "num_attention_heads": HEADS,
    "num_key_value_heads": KV_HEADS,
    "head_dim": HEAD_DIM,
    "hidden_act": "silu",
    "max_position_embeddings": 4096,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "vocab_size": VOCAB,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": False,
}


def _randn(gen: torch.Generator, *shape: int, scale: float = 0.05) -> torch.Tensor:
    return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16)


def _ones(n: int) -> torch.Tensor:
    return torch.ones(n, dtype=torch.bfloat16)


def _layer(prefix: str, gen: torch.Generator, input_norm: bool = True, attn_in: int = HIDDEN) -> dict:
    """Random bf16 weights of one Llama decoder layer (EAGLE-3 attends over ``2 * HIDDEN`` inputs)."""
    tensors = {
        f"{prefix}self_attn.q_proj.weight": _randn(gen, HEADS * HEAD_DIM, attn_in),
        f"{prefix}self_attn.k_proj.weight": _randn(gen, KV_HEADS * HEAD_DIM, attn_in),
        f"{prefix}self_attn.v_proj.weight": _randn(gen, KV_HEADS * HEAD_DIM, attn_in),
        f"{prefix}self_attn.o_proj.weight": _randn(gen, HIDDEN, HEADS * HEAD_DIM),
        f"{prefix}post_attention_layernorm.weight": _ones(HIDDEN),
        f"{prefix}mlp.gate_proj.weight": _randn(gen, INTERMEDIATE, HIDDEN),
        f"{prefix}mlp.up_proj.weight": _randn(gen, INTERMEDIATE, HIDDEN),
        f"{prefix}mlp.down_proj.weight": _randn(gen, HIDDEN, INTERMEDIATE),
    }
    if input_norm:
        tensors[f"{prefix}input_layernorm.weight"] = _ones(HIDDEN)
    return tensors


def _save(path: Path, tensors: dict, config: dict) -> None:
    path.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path / "model.safetensors"))
    (path / "config.json").write_text(json.dumps(config, indent=2))


def write_tokenizer(path: Path) -> None:
    """A byte-level BPE tokenizer with exactly ``VOCAB`` ids, special tokens 0-5 as in the trained pair."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    n_merges = VOCAB - len(SPECIAL_TOKENS) - len(alphabet)
    merges = list(itertools.islice(itertools.product(_MERGE_CHARS, repeat=2), n_merges))
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *alphabet, *(a + b for a, b in merges)])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    bos, eos, pad, *extra = SPECIAL_TOKENS
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", special_tokens=[(bos, 0)])
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos, "pad_token": pad,
        "extra_special_tokens": extra, "model_max_length": 4096, "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }, indent=2))
    (path / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": bos, "eos_token": eos, "pad_token": pad, "additional_special_tokens": extra}, indent=2))
    (path / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 2}))


def _target(path: Path, gen: torch.Generator) -> None:
    tensors = {
        "model.embed_tokens.weight": _randn(gen, VOCAB, HIDDEN, scale=0.5),
        "model.norm.weight": _ones(HIDDEN),
        "lm_head.weight": _randn(gen, VOCAB, HIDDEN, scale=0.5),
    }
    for i in range(4):
        tensors.update(_layer(f"model.layers.{i}.", gen))
    _save(path, tensors, {**_COMMON, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4})


def _eagle1_draft(path: Path, gen: torch.Generator) -> None:
    """SGLang's ``LlamaForCausalLMEagle``: ``fc(cat(embed, hidden))`` with bias, layer 0 without input
    norm; embedding and LM head come from the target."""
    tensors = _layer("layers.0.", gen, input_norm=False)
    tensors["fc.weight"] = _randn(gen, HIDDEN, 2 * HIDDEN)
    tensors["fc.bias"] = torch.zeros(HIDDEN, dtype=torch.bfloat16)
    _save(path, tensors, {**_COMMON, "architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1})


def _eagle3_draft(path: Path, gen: torch.Generator) -> None:
    """SGLang's ``LlamaForCausalLMEagle3``: ``fc`` over the target's 3 aux hidden states, one ``midlayer``
    attending over ``cat(embed, fc out)``, LM head over a draft vocabulary; embedding from the target."""
    hot = torch.randperm(VOCAB, generator=gen)[:DRAFT_VOCAB].sort().values
    t2d = torch.zeros(VOCAB, dtype=torch.bool)
    t2d[hot] = True
    tensors = {
        "d2t": hot - torch.arange(DRAFT_VOCAB),  # target id = draft id + d2t[draft id]
        "t2d": t2d,
        "fc.weight": _randn(gen, HIDDEN, 3 * HIDDEN),
        "midlayer.hidden_norm.weight": _ones(HIDDEN),
        "norm.weight": _ones(HIDDEN),
        "lm_head.weight": _randn(gen, DRAFT_VOCAB, HIDDEN, scale=0.5),
        **_layer("midlayer.", gen, attn_in=2 * HIDDEN),
    }
    config = {
        **_COMMON, "architectures": ["LlamaForCausalLMEagle3"], "num_hidden_layers": 1, "rope_scaling": None,
        "draft_vocab_size": DRAFT_VOCAB, "target_hidden_size": HIDDEN,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 1, 2], "use_aux_hidden_state": True},
    }
    _save(path, tensors, config)


DRAFT_WRITERS = {"eagle3": _eagle3_draft, "eagle": _eagle1_draft}


def write_random_pair(root: Path, draft: str = "eagle3", seed: int = 0, tokenizer_dir: Path | None = None):
    """Write ``root/target`` and ``root/<draft>`` (``"eagle3"`` or ``"eagle"``); return both paths."""
    gen = torch.Generator().manual_seed(seed)
    target, draft_path = Path(root) / "target", Path(root) / draft
    _target(target, gen)
    DRAFT_WRITERS[draft](draft_path, gen)
    if tokenizer_dir is None:
        write_tokenizer(target)
    else:
        for name in TOKENIZER_FILES:
            shutil.copy(Path(tokenizer_dir) / name, target / name)
    return target, draft_path
