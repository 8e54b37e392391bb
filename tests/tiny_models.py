"""Test model pairs: the trained tiny EAGLE-3 pair shipped in ``tests/assets`` and a random-weight
tiny Llama target + EAGLE-1 draft (``LlamaForCausalLMEagle``) written on demand.

The random target shares the trained pair's tokenizer (vocab 2048), so text endpoints work.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

ASSETS = Path(__file__).parent / "assets"
TRAINED_PAIR = ASSETS / "tiny-code-v1"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json")

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, VOCAB = 256, 4, 2, 64, 512, 2048
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
}


def _layer(prefix: str, gen: torch.Generator, input_norm: bool = True) -> dict[str, torch.Tensor]:
    """Random bf16 weights of one Llama decoder layer."""

    def w(*shape):
        return (torch.randn(*shape, generator=gen) * 0.05).to(torch.bfloat16)

    tensors = {
        f"{prefix}self_attn.q_proj.weight": w(HEADS * HEAD_DIM, HIDDEN),
        f"{prefix}self_attn.k_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
        f"{prefix}self_attn.v_proj.weight": w(KV_HEADS * HEAD_DIM, HIDDEN),
        f"{prefix}self_attn.o_proj.weight": w(HIDDEN, HEADS * HEAD_DIM),
        f"{prefix}post_attention_layernorm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        f"{prefix}mlp.gate_proj.weight": w(INTERMEDIATE, HIDDEN),
        f"{prefix}mlp.up_proj.weight": w(INTERMEDIATE, HIDDEN),
        f"{prefix}mlp.down_proj.weight": w(HIDDEN, INTERMEDIATE),
    }
    if input_norm:
        tensors[f"{prefix}input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.bfloat16)
    return tensors


def write_random_eagle1_pair(root: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write ``root/target`` (4-layer Llama) and ``root/eagle`` (1-layer EAGLE-1 head); return both."""
    gen = torch.Generator().manual_seed(seed)
    target, draft = root / "target", root / "eagle"
    target.mkdir(parents=True, exist_ok=True)
    draft.mkdir(parents=True, exist_ok=True)

    tensors = {
        "model.embed_tokens.weight": (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.5).to(torch.bfloat16),
        "model.norm.weight": torch.ones(HIDDEN, dtype=torch.bfloat16),
        "lm_head.weight": (torch.randn(VOCAB, HIDDEN, generator=gen) * 0.5).to(torch.bfloat16),
    }
    for i in range(4):
        tensors.update(_layer(f"model.layers.{i}.", gen))
    save_file(tensors, str(target / "model.safetensors"))
    target_config = {**_COMMON, "architectures": ["LlamaForCausalLM"], "num_hidden_layers": 4}
    target_config["tie_word_embeddings"] = False
    (target / "config.json").write_text(json.dumps(target_config, indent=2))
    for name in TOKENIZER_FILES:
        shutil.copy(TRAINED_PAIR / "target" / name, target / name)

    # SGLang's LlamaForCausalLMEagle: fc(cat(embed, hidden)) with bias, layer 0 without input norm;
    # embedding and LM head come from the target.
    tensors = _layer("layers.0.", gen, input_norm=False)
    tensors["fc.weight"] = (torch.randn(HIDDEN, 2 * HIDDEN, generator=gen) * 0.05).to(torch.bfloat16)
    tensors["fc.bias"] = torch.zeros(HIDDEN, dtype=torch.bfloat16)
    save_file(tensors, str(draft / "model.safetensors"))
    draft_config = {**_COMMON, "architectures": ["LlamaForCausalLMEagle"], "num_hidden_layers": 1}
    draft_config["tie_word_embeddings"] = False
    (draft / "config.json").write_text(json.dumps(draft_config, indent=2))
    return target, draft
