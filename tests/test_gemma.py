"""Gemma 3 on tiny models transformers builds (tests/gemma_tiny.py): logits fed over a chat
with retry and undo equal Gemma3ForCausalLM's full forward, from a model folder and from GGUF
files; windowed layers never read outside their window; the decode step equals the eager
forward; greedy replies equal `generate`; the chat format equals the official template; bad
files fail in one line naming the file."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from gemma_tiny import TEMPLATE, VARIANTS, dequantized, save_tiny, write_gguf
from gguf import GGMLQuantizationType as Q

from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from kvcache import KVCache
from model.decode.torch_step import TorchStep
from model.errors import ModelLoadError
from model.families.gemma import SLIDING
from model.loading import LoadOptions, load_model

transformers = pytest.importorskip("transformers")
render = pytest.importorskip("transformers.utils.chat_template_utils").render_jinja_template


@pytest.fixture(scope="module", params=list(VARIANTS))
def variant(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(f"gemma-{request.param}")
    return request.param, d, save_tiny(d, request.param)


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """The GGUF-compatible variant alone: llama.cpp fixes the local rotary base and query scale."""
    d = tmp_path_factory.mktemp("gemma-plain")
    return d, save_tiny(d, "plain")


@pytest.fixture(autouse=True)
def _model_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path / "home"))   # GGUF conversions land here


def chat_logits(lm, hf, windows: bool = True) -> float:
    """Worst |ours - transformers| over a chat fed chunk by chunk through one cache, with a retry
    and an undo; transformers runs the whole transcript each time."""
    t, g = lm.template, torch.Generator().manual_seed(1)
    if not windows:   # the control: a model that ignores windows must fail this comparison
        for layer in lm.model.model.layers:
            layer.self_attn.window = (-1, -1)

    def reply() -> list[int]:
        return torch.randint(9, lm.tokenizer.vocab_size, (9,), generator=g).tolist()

    cache, tokens, worst = lm.model.new_cache(256), [], 0.0

    def feed(chunk: list[int]) -> None:
        nonlocal worst
        tokens.extend(chunk)
        with torch.no_grad():
            got = lm.model(torch.tensor([chunk]), cache)[0]
            ref = hf(torch.tensor([tokens])).logits[0, -len(chunk):]
        worst = max(worst, (got - ref).abs().max().item())

    feed(t.start("") + t.user_turn("hello there", "You are terse."))
    feed(reply() + t.end_reply())
    turn2 = len(tokens)
    feed(t.user_turn("the capital of France?"))
    reply_at = len(tokens)
    feed(reply())
    del tokens[reply_at:]                  # retry
    cache.rewind(reply_at)
    feed(reply() + t.end_reply())
    del tokens[turn2:]                     # undo the second exchange
    cache.rewind(turn2)
    feed(t.user_turn("how are you? 1234"))
    feed(reply())
    assert cache.seqlen == len(tokens) > 6 * lm.model.config.sliding_window
    return worst


def test_config_reads_gemmas_knobs(variant):
    name, d, hf = variant
    c = load_model(str(d)).model.config
    assert c.layer_types == hf.config.layer_types and c.layer_types.count(SLIDING) == 5
    assert (c.sliding_window, c.query_pre_attn_scalar, c.tie_word_embeddings, c.final_logit_softcapping) == (
        6, VARIANTS[name]["query_pre_attn_scalar"], name == "plain", 3.0 if name == "knobs" else None)
    rope = VARIANTS[name]["rope_parameters"]
    assert (c.rope_theta, c.rope_local_base_freq) == (rope["full_attention"]["rope_theta"],
                                                      rope["sliding_attention"]["rope_theta"])


def test_incremental_logits_over_retry_and_undo(variant):
    _, d, hf = variant
    assert chat_logits(load_model(str(d)), hf) <= 1e-4
    assert chat_logits(load_model(str(d)), hf, windows=False) > 1e-2   # the windows are what makes it match


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q8_0])
def test_gguf_gives_the_same_logits(tmp_path, plain, qtype):
    hf = plain[1]
    lm = load_model(str(write_gguf(tmp_path / f"tiny-{qtype.name}.gguf", hf, qtype)))
    assert chat_logits(lm, dequantized(hf, qtype)) <= 1e-4


def test_windowed_layers_never_read_outside_their_window(variant):
    """After several turns, cache positions no windowed query can see are poisoned (huge values)
    in the windowed layers; the next turn's prefill and decode steps do not change at all."""
    _, d, _ = variant
    lm = load_model(str(d))
    m, w = lm.model, lm.model.config.sliding_window
    ids = torch.randint(9, lm.tokenizer.vocab_size, (1, 60), generator=torch.Generator().manual_seed(3))

    def run(poison: bool) -> torch.Tensor:
        cache = m.new_cache(128)
        outs = []
        with torch.no_grad():
            for a, b in ((0, 11), (11, 30), (30, 47)):   # earlier turns, the cache non-empty
                m(ids[:, a:b], cache)
            if poison:
                for i, layer in enumerate(m.model.layers):
                    if layer.sliding:
                        k, v = cache.get_layer_cache(i)
                        k[:, :47 - w + 1] = 1e4
                        v[:, :47 - w + 1] = 1e4
            outs.append(m(ids[:, 47:55], cache))    # a prefill on top
            step = TorchStep(m, cache)
            for t in ids[0, 55:60]:                 # and decode steps, past the poisoned region
                step.token.fill_(int(t))
                outs.append(step().clone()[None, None])
                cache.advance(1)
        return torch.cat(outs, 1)

    assert torch.equal(run(False), run(True))


def test_decode_step_equals_the_eager_forward(variant):
    _, d, _ = variant
    m = load_model(str(d)).model
    ids = torch.randint(9, 300, (1, 30), generator=torch.Generator().manual_seed(4))
    eager, stepped = m.new_cache(64), m.new_cache(64)
    with torch.no_grad():
        m(ids[:, :20], eager)
        m(ids[:, :20], stepped)
        step = TorchStep(m, stepped)
        for t in ids[0, 20:]:
            want = m(t.view(1, 1), eager)[0, 0]
            step.token.fill_(int(t))
            assert (step() - want).abs().max().item() <= 1e-5
            stepped.advance(1)


def test_greedy_chat_equals_generate(variant):
    _, d, hf = variant
    lm = load_model(str(d))
    s = Session(lm, Settings(temperature=0.0, max_new_tokens=8), context=256)
    stops = lm.template.stop_ids

    def check_last() -> list[int]:
        ex = s.exchanges[-1]
        mine = s.tokens[ex.reply_start:ex.end - len(lm.template.end_reply())]
        with torch.no_grad():
            out = hf.generate(torch.tensor([s.tokens[:ex.reply_start]]), max_new_tokens=len(mine) + 1,
                              do_sample=False, pad_token_id=0, eos_token_id=sorted(stops))[0, ex.reply_start:]
        assert out.tolist()[:len(mine)] == mine
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


def test_chat_format_equals_the_official_template(variant):
    """Each turn the session adds (system prompt folded into the first user message, replies
    trimmed in the history) equals Gemma 3's own template over the whole chat."""
    _, d, _ = variant
    lm = load_model(str(d))
    tokenizer, fmt = lm.tokenizer, lm.template
    users, replies = ["hello there", "  the capital of France? ", "how are you"], ["yes ok\n", " Paris is"]
    for system in (None, "You are terse.", " terse \n"):
        for k in range(3):
            msgs = [] if system is None else [{"role": "system", "content": system}]
            for u, r in zip(users[:k], replies[:k], strict=True):
                msgs += [{"role": "user", "content": u}, {"role": "assistant", "content": r}]
            out, _ = render([msgs + [{"role": "user", "content": users[k]}]], chat_template=TEMPLATE,
                            add_generation_prompt=True, bos_token="<bos>", eos_token="<eos>")
            turns = [(u, tokenizer.encode_rendered(r)) for u, r in zip(users[:k], replies[:k], strict=True)]
            assert fmt.conversation(system or "", turns, users[k]) == tokenizer.encode_rendered(out[0])
    assert fmt.stop_ids == {tokenizer.token("<end_of_turn>"), tokenizer.token("<eos>")}


def test_without_a_template_the_family_format_is_used(tmp_path):
    save_tiny(tmp_path, template=None)
    lm = load_model(str(tmp_path))
    t = lm.tokenizer
    assert t.decode(lm.template.start("") + lm.template.user_turn("hi")) == \
        "<bos><start_of_turn>user\nhi<end_of_turn>\n<start_of_turn>model\n"
    assert t.encode("<end_of_turn>") != [t.token("<end_of_turn>")]   # user text never makes a control token


@pytest.mark.parametrize("bad, error", [
    (dict(drop="blk.2.post_ffw_norm.weight"), "missing weights, e.g. model.layers.2.post_feedforward_layernorm"),
    (dict(head_dim=8), "has shape"),
    (dict(truncate=5000), "truncated"),
], ids=["missing-norm", "head-size", "truncated"])
def test_bad_gguf_files_fail_in_one_line_naming_the_file(tmp_path, plain, bad, error):
    path = write_gguf(tmp_path / "bad.gguf", plain[1], **bad)
    with pytest.raises(ModelLoadError) as e:
        load_model(str(path))
    msg = str(e.value)
    assert error in msg and str(path) in msg and "\n" not in msg


@pytest.mark.parametrize("edit, error", [
    (lambda c: {**c, "attn_logit_softcapping": 50.0}, "attn_logit_softcapping 50.0"),
    (lambda c: {**c, "use_bidirectional_attention": True}, "bidirectional"),
    (lambda c: {**c, "hidden_activation": "silu"}, "hidden_activation 'silu'"),
    (lambda c: {**c, "layer_types": ["chunked_attention"] * 6}, "layer_types must list"),
    (lambda c: {**c, "architectures": ["Gemma3ForConditionalGeneration"]}, "unsupported architecture Gemma3For"),
], ids=["attn-softcap", "bidirectional", "silu", "layer-type", "multimodal"])
def test_what_we_cannot_run_is_refused_naming_the_key(tmp_path, plain, edit, error):
    d = tmp_path / "m"
    shutil.copytree(plain[0], d)
    (d / "config.json").write_text(json.dumps(edit(json.loads((d / "config.json").read_text()))))
    with pytest.raises(ModelLoadError) as e:
        load_model(str(d))
    assert error in str(e.value) and "\n" not in str(e.value) and str(d) in str(e.value)


def test_the_cache_holds_every_layer_and_position(plain):
    m = load_model(str(plain[0])).model
    cache = m.new_cache(100)
    assert isinstance(cache, KVCache) and cache.shape == (6, 1, 100, 2, 16)


def test_the_family_works_without_its_fast_paths(tmp_path, plain, monkeypatch):
    """docs/families.md: Gemma's fused GPU step, its captured prefill and the CPU's C step are
    extras in model/decode/steps.py; with none of them a quantized Gemma replies through its own
    forward, greedily as transformers does on the same dequantized weights."""
    from model.decode import steps

    hf, path = plain[1], write_gguf(tmp_path / "q8.gguf", plain[1], Q.Q8_0)
    quantized = LoadOptions(quantized=True)   # QLinears: what the C step serves
    assert Session(load_model(str(path), quantized), Settings()).gen.cpu_step is not None   # the control
    for table in (steps.FUSED_STEPS, steps.PREFILL_STEPS):
        monkeypatch.delitem(table, "gemma3")
    monkeypatch.setattr(steps, "CPU_STEPS", steps.CPU_STEPS - {"gemma3"})
    s = Session(load_model(str(path), quantized), Settings(temperature=0.0, max_new_tokens=8), context=256)
    assert s.gen.cpu_step is None
    list(s.send("the capital of France?"))
    ex = s.exchanges[-1]
    mine = s.tokens[ex.reply_start:ex.end - len(s.lm.template.end_reply())]
    with torch.no_grad():
        out = dequantized(hf, Q.Q8_0).generate(torch.tensor([s.tokens[:ex.reply_start]]), do_sample=False,
                                               max_new_tokens=len(mine) + 1, pad_token_id=0,
                                               eos_token_id=sorted(s.lm.template.stop_ids))[0, ex.reply_start:]
    assert mine and out.tolist()[:len(mine)] == mine
