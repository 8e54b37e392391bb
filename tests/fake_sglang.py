"""Small stand-ins for the SGLang objects our glue reads (CPU tests of worker.py, verify.py and
drafter.draft_weights): only the attributes the glue touches, laid out as SGLang 0.5.17 lays them out."""

from types import SimpleNamespace

import torch


class ForwardMode:
    def __init__(self, idle: bool = False):
        self.idle = idle

    def is_idle(self) -> bool:
        return self.idle


def draft_model(w, vocab_padding: int = 0):
    """An SGLang ``LlamaForCausalLMEagle3`` / ``LlamaForCausalLMEagle`` holding the tensors of ``w``
    (:class:`~sgl_eagle_triton.drafter.DraftWeights`); the LM head is padded by ``vocab_padding`` rows as
    SGLang pads it (``logits_processor.vocab_size`` is the real size)."""
    ns = SimpleNamespace
    rotary = ns(cos_sin_cache=w.rotary.cos_sin_cache, is_neox_style=True, use_fallback_kernel=False)
    attn = ns(qkv_proj=ns(weight=w.qkv, bias=w.qkv_bias), o_proj=ns(weight=w.o_proj, bias=w.o_bias),
              rotary_emb=rotary, num_heads=w.num_q_heads, num_kv_heads=w.num_kv_heads, head_dim=w.head_dim,
              attn=ns(layer_id=3))
    layer = ns(self_attn=attn, post_attention_layernorm=ns(weight=w.post_norm, variance_epsilon=w.eps),
               mlp=ns(gate_up_proj=ns(weight=w.gate_up), down_proj=ns(weight=w.down)))
    model = ns(layers=[layer], embed_tokens=ns(weight=w.embed))
    if w.eagle3:
        layer.input_layernorm, layer.hidden_norm = ns(weight=w.input_norm), ns(weight=w.hidden_norm)
        model.norm = ns(weight=w.final_norm)
    else:
        model.fc = ns(weight=w.fc, bias=w.fc_bias)
    vocab = w.lm_head.shape[0]
    padded = torch.cat((w.lm_head, torch.full((vocab_padding, w.lm_head.shape[1]), float("nan"),
                                              dtype=w.lm_head.dtype, device=w.lm_head.device)))
    return ns(model=model, lm_head=ns(weight=padded), logits_processor=ns(vocab_size=vocab))


def sampling_info(bs: int, greedy: bool, temperature=1.0, top_k=1 << 30, top_p=1.0, min_p=0.0, logit_bias=None,
                  device="cpu"):
    """SGLang's ``SamplingBatchInfo`` fields that verification reads (no penalties, no seed)."""
    return SimpleNamespace(
        is_all_greedy=greedy,
        temperatures=torch.full((bs, 1), temperature, device=device),
        top_ks=torch.full((bs,), top_k, dtype=torch.int32, device=device),
        top_ps=torch.full((bs,), top_p, device=device),
        min_ps=torch.full((bs,), min_p, device=device),
        acc_additive_penalties=None,
        acc_scaling_penalties=None,
        logit_bias=logit_bias,
        sampling_seed=None,
    )
