"""Llama 3.x (rotary scaling), Qwen2 (q/k/v biases) and Qwen3 (qk-norm, head_dim != hidden/heads)
folders saved by transformers load as our Llama-shaped module and match transformers: logits fed
incrementally over a chat with retry and undo, and greedy replies equal to `generate`.

The tiny models get weights with a wide spread (and non-zero biases), so logits differ a lot
between tokens and a greedy choice is never a near-tie that rounding could flip.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, trainers

from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from model.errors import ModelLoadError
from model.loading import load_model

transformers = pytest.importorskip("transformers")

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>", "<|start_header_id|>",
            "<|end_header_id|>", "<|eot_id|>", "<think>", "</think>"]
TEMPLATES = Path(__file__).parent / "data" / "chat_templates"   # the vendors' own chat templates
QWEN25 = (TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text()
QWEN3 = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
LLAMA3 = (TEMPLATES / "meta-llama-Llama-3.2-3B-Instruct.jinja").read_text()
SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-6)
# Wavelengths 6.3, 20, 63, 200, ... against an original context of 64: all three llama3 bands.
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}
VARIANTS = {   # name: (transformers config class, its extra settings, chat template, EOS)
    "llama3-untied": ("LlamaConfig", dict(rope_theta=10000.0, rope_scaling=LLAMA3_ROPE, tie_word_embeddings=False),
                      LLAMA3, "<|eot_id|>"),
    "qwen2-tied": ("Qwen2Config", dict(rope_theta=1000.0, tie_word_embeddings=True), QWEN25, "<|im_end|>"),
    "qwen3-untied": ("Qwen3Config", dict(head_dim=32, tie_word_embeddings=False), QWEN3, "<|im_end|>"),
}


def tiny_tokenizer() -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(["hello there, how are you? the capital of France is Paris. 12 34"] * 3, trainer)
    return tok


def spread_weights(model: torch.nn.Module, seed: int) -> None:
    """Wide random weights: norms around 1, everything else (biases included) N(0, 0.3)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            p.copy_(1 + 0.2 * noise if "norm" in name else 0.3 * noise)


def save_variant(d: Path, name: str, seed: int = 0) -> torch.nn.Module:
    cls, extra, template, eos = VARIANTS[name]
    tok = tiny_tokenizer()
    cfg = getattr(transformers, cls)(vocab_size=tok.get_vocab_size(), **SHAPE, **extra)
    model_cls = getattr(transformers, cls.replace("Config", "ForCausalLM"))
    hf = model_cls(cfg).eval()
    spread_weights(hf, seed)
    hf.save_pretrained(d, safe_serialization=True)
    (d / "tokenizer.json").write_text(tok.to_str(), encoding="utf-8")
    (d / "tokenizer_config.json").write_text(json.dumps({"chat_template": template, "eos_token": eos,
                                                         "bos_token": "<|begin_of_text|>"}))
    return hf


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    hf = save_variant(d, request.param)
    if request.param.startswith("llama3"):   # as the Hub's Llama 3.2 config.json has it (transformers 4)
        cfg = json.loads((d / "config.json").read_text())
        rope = cfg.pop("rope_parameters")
        cfg["rope_theta"] = rope.pop("rope_theta")
        (d / "config.json").write_text(json.dumps({**cfg, "rope_scaling": rope}))
    return request.param, d, hf


def test_config_says_what_the_family_adds(variant):
    name, d, hf = variant
    c = load_model(str(d)).model.config
    assert (c.attention_bias, c.qk_norm, c.rope_scaling is not None) == (
        name.startswith("qwen2"), name.startswith("qwen3"), name.startswith("llama3"))
    assert c.tie_word_embeddings == name.endswith("-tied")
    assert c.head_dim == (getattr(hf.config, "head_dim", None) or 16)


def test_incremental_logits_over_retry_and_undo(variant):
    """Turn by turn through one cache, rewinding for a retry and an undo; each chunk's logits
    against transformers' full forward over the transcript as it stands."""
    _, d, hf = variant
    lm = load_model(str(d))
    t, g = lm.template, torch.Generator().manual_seed(1)

    def reply() -> list[int]:
        return torch.randint(0, lm.tokenizer.vocab_size, (7,), generator=g).tolist()

    cache = lm.model.new_cache(256)
    tokens: list[int] = []
    worst = 0.0

    def feed(chunk: list[int]) -> None:
        nonlocal worst
        tokens.extend(chunk)
        with torch.no_grad():
            got = lm.model(torch.tensor([chunk]), cache)[0]
            ref = hf(torch.tensor([tokens])).logits[0, -len(chunk):]
        worst = max(worst, (got - ref).abs().max().item())

    feed(t.start("You are terse.") + t.user_turn("hello there"))
    feed(reply() + t.end_reply())
    turn2 = len(tokens)
    feed(t.user_turn("the capital of France?"))
    reply_at = len(tokens)
    feed(reply())
    del tokens[reply_at:]                  # retry: the reply again, differently
    cache.rewind(reply_at)
    feed(reply() + t.end_reply())
    del tokens[turn2:]                     # undo the whole second exchange
    cache.rewind(turn2)
    feed(t.user_turn("how are you? 1234"))
    feed(reply())
    assert cache.seqlen == len(tokens) and worst <= 1e-4


def test_greedy_chat_equals_generate(variant):
    """Session replies at temperature 0 (with a retry and an undo between) equal transformers'
    generate over the whole transcript so far."""
    _, d, hf = variant
    lm = load_model(str(d))
    s = Session(lm, Settings(temperature=0.0, max_new_tokens=8), context=256)
    stops = lm.template.stop_ids

    def check_last() -> list[int]:
        ex = s.exchanges[-1]
        mine = s.tokens[ex.reply_start:ex.end - len(lm.template.end_reply())]
        with torch.no_grad():
            out = hf.generate(torch.tensor([s.tokens[:ex.reply_start]]), max_new_tokens=len(mine) + 1,
                              do_sample=False, pad_token_id=0,   # both stop where the chat format stops
                              eos_token_id=sorted(stops))[0, ex.reply_start:].tolist()
        assert out[:len(mine)] == mine
        assert len(mine) == 8 or out[len(mine)] in stops   # stopped where generate stops
        return mine

    list(s.send("hello there"))
    check_last()
    list(s.send("the capital of France?"))
    first = check_last()
    list(ChatKeeper(s, None).run_command("/retry"))
    assert check_last() == first
    list(ChatKeeper(s, None).run_command("/undo"))
    list(s.send("how are you? 12"))
    check_last()


@pytest.mark.parametrize("edit, error", [
    (lambda c: {**c, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type 'yarn'"),
    (lambda c: {**c, "rope_scaling": {**LLAMA3_ROPE, "factor": 0}}, "rope_scaling.factor must be a positive"),
    (lambda c: {**c, "attention_bias": True}, "attention_bias True: a bias on o_proj is not supported"),
    (lambda c: {**c, "hidden_act": "gelu"}, "hidden_act 'gelu': only silu is supported"),
    (lambda c: {**c, "num_experts": 8}, "num_experts 8: mixture-of-experts"),
    (lambda c: {**c, "use_sliding_window": True}, "use_sliding_window True: sliding-window attention"),
    (lambda c: {**c, "layer_types": ["sliding_attention", "full_attention"]}, "layer_types ["),
    (lambda c: {**c, "architectures": ["Qwen3MoeForCausalLM"]}, "unsupported architecture Qwen3MoeForCausalLM"),
], ids=["yarn", "zero-factor", "o-bias", "gelu", "moe", "sliding", "layer-types", "moe-arch"])
def test_what_we_cannot_run_is_refused_naming_the_key(tmp_path, edit, error):
    d = tmp_path / "good"
    d.mkdir()
    save_variant(d, "qwen3-untied")   # one family is enough: the checks are shared
    for f in d.iterdir():
        (tmp_path / f.name).write_bytes(f.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps(edit(json.loads((d / "config.json").read_text()))))
    with pytest.raises(ModelLoadError) as e:
        load_model(str(tmp_path))
    assert error in str(e.value) and "\n" not in str(e.value) and str(tmp_path) in str(e.value)
