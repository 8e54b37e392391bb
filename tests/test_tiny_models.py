"""The random tiny checkpoints (sgl_eagle_triton/devtools/tiny_models.py) match the trained pair's layout, load
as SGLang reads them, and carry a tokenizer that covers every id."""

import pytest
import torch
from safetensors.torch import load_file
from sglang.srt.utils.hf_transformers_utils import get_tokenizer

from sgl_eagle_triton.config import resolve_draft_kind
from sgl_eagle_triton.devtools import tiny_models
from tests.tiny_models import TRAINED_PAIR


@pytest.fixture(scope="module")
def eagle3_pair(tmp_path_factory):
    return tiny_models.write_random_pair(tmp_path_factory.mktemp("eagle3"), draft="eagle3")


def _layout(path):
    return {name: (t.dtype, tuple(t.shape)) for name, t in load_file(str(path / "model.safetensors")).items()}


def test_eagle3_pair_has_the_trained_pairs_tensors(eagle3_pair):
    target, draft = eagle3_pair
    assert _layout(target) == _layout(TRAINED_PAIR / "target")
    assert _layout(draft) == _layout(TRAINED_PAIR / "eagle3")
    tensors = load_file(str(draft / "model.safetensors"))
    hot = tensors["d2t"] + torch.arange(tiny_models.DRAFT_VOCAB)
    assert hot.unique().numel() == tiny_models.DRAFT_VOCAB and 0 <= hot.min() and hot.max() < tiny_models.VOCAB
    assert tensors["t2d"].sum() == tiny_models.DRAFT_VOCAB and tensors["t2d"][hot].all()


def test_draft_kinds_resolve_like_the_server(eagle3_pair, tmp_path):
    assert resolve_draft_kind(str(eagle3_pair[1])) == "eagle3"
    assert resolve_draft_kind(str(tiny_models.write_random_pair(tmp_path, draft="eagle")[1])) == "eagle"


def test_same_seed_same_weights(eagle3_pair, tmp_path):
    again = tiny_models.write_random_pair(tmp_path, draft="eagle3")
    for a, b in zip(eagle3_pair, again, strict=True):
        assert (a / "model.safetensors").read_bytes() == (b / "model.safetensors").read_bytes()


def test_tokenizer_covers_every_id_and_chats(eagle3_pair):
    tok = get_tokenizer(str(eagle3_pair[0]))
    assert len(tok) == tiny_models.VOCAB
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)
    text = "def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
    ids = tok(text).input_ids
    assert ids[0] == 0 and len(ids) < len(text) and tok.decode(ids, skip_special_tokens=True) == text
    chat = tok.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert chat == "<|begin_of_text|><|user|>\nhi<|end_of_text|>\n<|assistant|>\n"
    assert all(tok.decode([i]) for i in range(len(tiny_models.SPECIAL_TOKENS), tiny_models.VOCAB, 7))
