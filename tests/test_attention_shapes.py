"""The C step's attention at the head shapes of the real families (qdecode.c: scores4 converts each
key once for up to 4 query heads, values_regs keeps every dim of 1-3 heads in registers for head
dims 64 and 128, and 32 dims of 4 heads a pass for Gemma 3's 256): tiny Llama GGUFs with 3 and 5
query heads a KV head at head_dim 64, 2 at 128 and 4 at 256, decoded past 40 keys, follow the
fp32 reference's logits and picks."""

from __future__ import annotations

import helpers
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from helpers import assert_close_logits

from model.cpu import native
from model.cpu.step import CpuStep
from model.loading import LoadOptions, load_model

pytestmark = pytest.mark.skipif(native.library() is None, reason="CPU kernels unavailable")


@pytest.mark.parametrize(("hidden", "heads", "kv_heads"), [(384, 6, 2), (320, 5, 1), (256, 2, 1), (1024, 4, 1)],
                         ids=["d64-g3", "d64-g5", "d128-g2", "d256-g4"])
def test_attention_follows_the_reference(hidden, heads, kv_heads, tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NANOCHAT_QGEMM", "0")
    for name, value in (("HIDDEN", hidden), ("HEADS", heads), ("KV_HEADS", kv_heads), ("LAYERS", 1)):
        monkeypatch.setattr(helpers, name, value)   # write_gguf reads the shape from these
    path = tmp_path / "m.gguf"
    helpers.write_gguf(path, {0: {"ffn_up": Q.Q8_0}}, tied=True)
    q, ref = load_model(str(path), LoadOptions(quantized=True)), load_model(str(path))
    assert q.model.config.head_dim == hidden // heads
    qc, rc = q.model.new_cache(64), ref.model.new_cache(64)
    for threads in (1, 2):
        qc.reset(), rc.reset()
        step = CpuStep(q.model, qc, threads=threads)
        for tok in [(7 * i + 3) % q.tokenizer.vocab_size for i in range(45)]:
            with torch.no_grad():
                want = ref.model(torch.tensor([[tok]]), rc)[0, -1]
            assert_close_logits(step(tok), want)
