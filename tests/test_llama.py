"""Our Llama against transformers' LlamaForCausalLM, and incremental feeding against a full forward."""

import pytest
import torch

from kvcache import Attention
from model.families.llama import Llama, LlamaConfig

CFG = dict(vocab_size=300, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
           num_attention_heads=8, num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=10000.0,
           max_position_embeddings=256)


@pytest.mark.parametrize("tied", [True, False])
def test_matches_transformers(tied):
    transformers = pytest.importorskip("transformers")
    hf_cfg = transformers.LlamaConfig(**CFG, tie_word_embeddings=tied, attention_bias=False, mlp_bias=False)
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.normal_(0, 0.1)
    ours = Llama(LlamaConfig(**CFG, tie_word_embeddings=tied), Attention("sdpa")).eval()
    missing, unexpected = ours.load_state_dict(hf.state_dict(), strict=False)
    assert not missing and not unexpected
    ids = torch.randint(0, CFG["vocab_size"], (1, 40), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids).logits
        got = ours(ids, ours.new_cache(64))
    assert (got - ref).abs().max().item() <= 1e-4


def full_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids]), model.new_cache(len(ids) + 1))[0]


def test_incremental_multiturn_with_rewind_equals_full_forward(tiny):
    """Chunks and single-token decodes over several turns, and a rewind, give the logits of one
    full forward over the same tokens (fp32)."""
    model = tiny.model
    g = torch.Generator().manual_seed(3)
    seq = torch.randint(0, 259, (120,), generator=g).tolist()
    cache = model.new_cache(256)
    got = []
    with torch.no_grad():
        def feed(ids):
            got.append(model(torch.tensor([ids]), cache)[0])
        feed(seq[:30])                     # turn 1 prefill
        for t in seq[30:40]:
            feed([t])                      # decode
        feed(seq[40:52])                   # turn 2 prefill on top of a non-empty cache
        for t in seq[52:60]:
            feed([t])
        # retry: rewind to before the reply, regenerate different tokens, then rewind again
        cache.rewind(52)
        got = got[:1 + 10 + 1]
        model(torch.tensor([[7, 8, 9]]), cache)
        cache.rewind(52)
        for t in seq[52:60]:
            feed([t])
        feed(seq[60:100])
        for t in seq[100:120]:
            feed([t])
    inc = torch.cat(got, dim=0)
    ref = full_logits(model, seq)
    assert inc.shape == ref.shape
    assert (inc - ref).abs().max().item() < 1e-4


def test_bf16_runs_and_stays_close(tiny):
    from model.loading import LoadOptions, load_model

    bf = load_model("random:tiny", LoadOptions(dtype=torch.bfloat16))
    ids = list(range(40, 80))
    ref = full_logits(tiny.model, ids)
    got = full_logits(bf.model, ids)
    assert got.dtype == torch.float32
    assert (got - ref).abs().max().item() < 0.05 * ref.abs().max().item()
