"""Random one-layer Llama EAGLE drafts as :class:`~sgl_eagle_triton.drafter.DraftWeights` (test and
benchmark inputs): EAGLE-3 (input norms, draft vocabulary with a token map) or EAGLE-1 (fc with bias,
q/k/v bias)."""

from types import SimpleNamespace

import torch

from sgl_eagle_triton.drafter import DraftWeights


def cos_sin_cache(max_pos: int, head_dim: int, theta: float = 10000.0) -> torch.Tensor:
    """SGLang's neox RoPE table: [max_pos, D] fp32, cos then sin."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim)
    freqs = torch.arange(max_pos, dtype=torch.float)[:, None] * inv_freq
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1)


def random_draft(eagle3: bool, device, *, H=64, Hq=4, Hkv=2, D=16, inter=96, vocab=300, draft_vocab=120, seed=0):
    """``(weights, generator)``: the generator continues the seeded stream for further test inputs."""
    gen = torch.Generator().manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(torch.bfloat16).to(device)

    def norm():
        return (1 + 0.1 * torch.randn(H, generator=gen)).to(torch.bfloat16).to(device)

    h_in = 2 * H if eagle3 else H
    qkv_rows = (Hq + 2 * Hkv) * D
    w = DraftWeights(
        eagle3=eagle3,
        embed=rand(vocab, H),
        qkv=rand(qkv_rows, h_in, scale=h_in**-0.5),
        o_proj=rand(H, Hq * D, scale=(Hq * D) ** -0.5),
        post_norm=norm(),
        gate_up=rand(2 * inter, H, scale=H**-0.5),
        down=rand(H, inter, scale=inter**-0.5),
        lm_head=rand(draft_vocab if eagle3 else vocab, H, scale=3 * H**-0.5),
        rotary=SimpleNamespace(cos_sin_cache=cos_sin_cache(4096, D).to(device)),
        num_q_heads=Hq,
        num_kv_heads=Hkv,
        head_dim=D,
        eps=1e-5,
    )
    if eagle3:
        w.input_norm, w.hidden_norm, w.final_norm = norm(), norm(), norm()
        w.token_map = torch.randperm(vocab, generator=gen)[:draft_vocab].to(device)
    else:
        w.fc, w.fc_bias = rand(H, 2 * H, scale=(2 * H) ** -0.5), rand(H, scale=0.1)
        w.qkv_bias = rand(qkv_rows, scale=0.1)
    return w, gen
