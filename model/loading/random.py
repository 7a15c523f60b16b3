"""`random:NAME`: random-weight models with a byte-level tokenizer, for tests and speed work.

The weights come from a fixed seed, so the same spec is the same model everywhere.
"""

from __future__ import annotations

import torch

from kvcache import Attention
from model.chat_formats.templates import ChatML
from model.errors import ModelLoadError
from model.families.gemma import Gemma, GemmaConfig
from model.families.llama import Llama, LlamaConfig
from model.loading.options import LoadedModel, LoadOptions
from model.tokenizers.tokenizer import Tokenizer, byte_level_encoding

CHATML_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

PRESETS: dict[str, dict] = {
    # A few layers, fast on a CPU: tests and tools rely on this exact name.
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                 rope_theta=10000.0),
    # Real shapes, random weights: speed and memory work.
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                         rope_theta=100000.0),
    # Llama shapes of nanochat d20 / d32 sizes (dim 1280 / 2048, 20 / 32 layers, MHA).
    "d20": dict(vocab_size=32768, hidden_size=1280, intermediate_size=5120, num_hidden_layers=20,
                num_attention_heads=10, num_key_value_heads=10, max_position_embeddings=8192,
                tie_word_embeddings=False),
    "d32": dict(vocab_size=32768, hidden_size=2048, intermediate_size=8192, num_hidden_layers=32,
                num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=8192,
                tie_word_embeddings=False),
    # The Llama-shaped families' real shapes (Qwen3-0.6B, Qwen2.5-0.5B, Llama-3.2-1B), random weights.
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                       rope_theta=1000000.0, rms_norm_eps=1e-6, qk_norm=True),
    "qwen2.5-0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                         num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                         rope_theta=1000000.0, rms_norm_eps=1e-6, attention_bias=True),
    "llama3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                        num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                        rope_theta=500000.0, rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                                                high_freq_factor=4.0,
                                                                original_max_position_embeddings=8192)),
    # Tiny versions of the same, fast on a CPU: the kernels' interpreter tests.
    "tiny-qwen2": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, attention_bias=True),
    "tiny-qwen3": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, head_dim=32, qk_norm=True,
                       tie_word_embeddings=False),
}


# Gemma 3 shapes (model/families/gemma.py), random weights: the same byte tokenizer and ChatML format.
GEMMA_PRESETS: dict[str, dict] = {
    # Gemma 3 270M's real shapes (its GGUF's metadata): 18 layers, width 640, 4 query heads and
    # 1 KV head of 256, FFN 2048, 262k vocabulary, a 512-key window on 5 layers of 6.
    "gemma3-270m": dict(vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18,
                        num_attention_heads=4, num_key_value_heads=1, head_dim=256, sliding_window=512,
                        query_pre_attn_scalar=256, max_position_embeddings=32768),
    # A few layers with a short window, fast on a CPU.
    "tiny-gemma3": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=6,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=8,
                        query_pre_attn_scalar=24, max_position_embeddings=2048),
}


def random_gemma(cfg: GemmaConfig, opts: LoadOptions, seed: int = 0) -> Gemma:
    """Norm weights random too (small, around 0: Gemma scales by 1 + weight), so a step that
    skipped or misplaced one of the four norms would show."""
    torch.manual_seed(seed)
    model = Gemma(cfg, Attention(opts.attn))
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.normal_(0.0, 0.1 if "norm" in name else 0.02 if "embed" in name else 0.08)
    return model.to(device=opts.device, dtype=opts.dtype).eval()


def random_llama(cfg: LlamaConfig, opts: LoadOptions, seed: int = 0) -> Llama:
    torch.manual_seed(seed)
    model = Llama(cfg, Attention(opts.attn))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.02 if "embed" in name or "lm_head" in name else 0.08)
    return model.to(device=opts.device, dtype=opts.dtype).eval()


def load_random(name: str, opts: LoadOptions) -> LoadedModel:
    if name not in PRESETS and name not in GEMMA_PRESETS:
        raise ModelLoadError(f"unknown random preset {name!r}; choose one of {', '.join([*PRESETS, *GEMMA_PRESETS])}")
    cfg = GemmaConfig(**GEMMA_PRESETS[name]) if name in GEMMA_PRESETS else LlamaConfig(**PRESETS[name])
    tok = Tokenizer(byte_level_encoding(f"bytes-{name}", CHATML_SPECIALS), eos="<|endoftext|>")
    if tok.vocab_size > cfg.vocab_size:
        raise ModelLoadError(f"preset {name}: tokenizer needs {tok.vocab_size} ids, model has {cfg.vocab_size}")
    template = ChatML(tok, default_system="You are a helpful assistant.")
    model = random_gemma(cfg, opts) if isinstance(cfg, GemmaConfig) else random_llama(cfg, opts)
    return LoadedModel(model, tok, template, f"random:{name}", cfg.max_position_embeddings)
