"""The quantized CPU path: every GGUF block type repacked equals the gguf package's own
dequantization bit for bit, the C kernels (AVX2 and portable builds) compute what they claim,
and the C decode step over the persistent fp16 cache follows the fp32-dequantized reference
through a chat with retry and undo."""

from __future__ import annotations

import ctypes
import json

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from helpers import (
    COLS,
    LOGITS_REL_ACT8,
    ROWS,
    assert_close_logits,
    assert_invariant,
    bits,
    both,
    int16_reference,
    packed_linear,
)
from safetensors.torch import load_file, save_file

from chatapp.chat.session import Session
from chatapp.chat.settings import Settings
from chatapp.keeper.keeper import ChatKeeper
from model.cpu import native, prefill_gemm
from model.cpu.blocks import BLOCK_TYPES, dequantize
from model.cpu.qlinear import QLinear
from model.cpu.step import STEPS_BELOW, CpuStep
from model.decode.generate import Generator
from model.errors import ModelLoadError
from model.loading import LoadOptions, load_model
from model.loading.gguf import convert_gguf

pytestmark = pytest.mark.skipif(native.library() is None, reason=f"CPU kernels unavailable: {native.why_not()}")


@pytest.fixture(autouse=True)
def exact_prefill(monkeypatch):
    """These tests hold the decode step to the fp32 reference after an exact (fp32) prefill; the
    int8 prefill GEMM, the default where the CPU has VNNI, has its own in test_prefill_gemm.py."""
    monkeypatch.setenv("NANOCHAT_QGEMM", "0")


def cpu_flags() -> set[str]:
    try:
        with open("/proc/cpuinfo") as f:
            return next((set(line.split(":", 1)[1].split()) for line in f if line.startswith("flags")), set())
    except OSError:
        return set()


@pytest.mark.skipif(not cpu_flags(), reason="no /proc/cpuinfo flags to compare with")
def test_the_default_build_has_every_simd_path_this_cpu_can_run():
    """A compile error under -march=native is not fatal: the library falls back to the next flags
    (no -march), and only speed shows it. So the default build must have the SIMD paths the CPU
    reports: AVX2 decode, the AVX-512 VNNI GEMM, the AVX-512 BF16 prefill."""
    flags, lib = cpu_flags(), prefill_gemm.lib()
    if {"avx2", "fma", "f16c"} <= flags:
        assert lib.qd_simd() == 1
    if {"avx512f", "avx512bw", "avx512_vnni"} <= flags:
        assert lib.qg_simd() == 2
    if "avx512_bf16" in flags:
        assert lib.qg_bf16() in (1, 2)
    said = native.describe(lib)   # install.sh's line names what the build runs
    assert said.startswith("AVX2 decode" if lib.qd_simd() else "portable C")
    assert ("AVX-512 VNNI prefill" in said) == (lib.qg_simd() == 2)
    assert ("bf16 prefill" in said) == (lib.qg_bf16() in (1, 2))


@pytest.fixture(scope="module")
def portable() -> ctypes.CDLL:
    """The kernels built without -march=native: the plain C path other CPUs run."""
    lib = native.build(["-O3", "-fopenmp", "-pthread"])
    assert lib is not None and lib.qd_simd() == 0
    return lib








@pytest.mark.parametrize("kind", BLOCK_TYPES)
def test_repacked_weights_equal_gguf_dequantization_bit_for_bit(kind, portable):
    ql, ref = packed_linear(kind)
    assert np.array_equal(bits(dequantize(ql.kind, ql.q, ql.scale, ql.min).numpy()), bits(ref))
    assert np.array_equal(bits(ql.weight_fp32().numpy()), bits(ref))   # the AVX2 build's dequant
    out = torch.empty(ROWS, COLS)
    portable.qd_dequant(ql.qw(), out.data_ptr(), 1)
    assert np.array_equal(bits(out.numpy()), bits(ref))
    rows = torch.tensor([[3, 0], [23, 3]])
    assert torch.equal(ql.rows(rows), torch.from_numpy(ref)[rows])   # the embedding lookup




@pytest.mark.parametrize("kind", BLOCK_TYPES + ("F32", "F16", "BF16"))
def test_gemv_kernels_compute_the_product(kind, portable):
    rng = np.random.default_rng(1)
    if kind in BLOCK_TYPES:
        ql, w = packed_linear(kind, seed=2)
        x = rng.normal(0, 1, COLS).astype(np.float32)
        x[7] = 40.0   # an outlier channel, as real hidden states have
        want = int16_reference(w, x)
    else:
        dt = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}[kind]
        wt = torch.randn(ROWS, COLS).to(dt)
        ql, w = QLinear.dense(wt), wt.float().numpy()
        x = rng.normal(0, 1, COLS).astype(np.float32)
        want = w.astype(np.float64) @ x.astype(np.float64)
    xt = torch.from_numpy(x)
    for lib in (native.library(), portable):
        y = torch.empty(ROWS)
        lib.qd_gemv(ql.qw(), xt.data_ptr(), y.data_ptr(), 2)
        np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-4 * np.abs(want).max())








def test_quantized_model_keeps_the_file_and_an_fp16_cache(mixed_gguf, home):
    q, ref = both(mixed_gguf)
    assert isinstance(q.model.lm_head, QLinear) and isinstance(q.model.model.layers[1].mlp.down_proj, QLinear)
    assert q.model.model.layers[0].mlp.gate_proj.kind == "q4_k"        # Q4_K stays the file's bytes
    assert q.model.model.layers[0].self_attn.q_proj.kind == "q4"       # Q4_0 repacked, 4-bit
    assert q.model.model.layers[0].self_attn.v_proj.kind == "f16"      # F16 stays F16
    assert q.model.new_cache(64).dtype == torch.float16 and ref.model.new_cache(64).dtype == torch.float32
    ids = torch.tensor([q.template.start("") + q.template.user_turn("hello 1234 world")])
    with torch.no_grad():   # the prefill dequantizes exactly: only the fp16 cache differs
        a = q.model(ids, q.model.new_cache(64))[0]
        b = ref.model(ids, ref.model.new_cache(64))[0]
    assert (a - b).abs().max().item() <= 2e-3 * b.abs().max().item()


def test_the_backend_says_c_where_our_kernels_attend(mixed_gguf, home):
    """The panel's and a turn's `backend`: the quantized model decodes (and, with the prefill GEMM,
    prefills) with attention in C, so it must not read SDPA; the fp32 reference's is SDPA's."""
    from chatapp.chat.session import Session
    from chatapp.chat.settings import Settings

    q, ref = both(mixed_gguf)
    sessions = [Session(lm, Settings(temperature=0.0, max_new_tokens=4), context=128) for lm in (q, ref)]
    for s in sessions:
        list(s.send("hello world"))
    names = [s.stats()["backend"] for s in sessions]
    assert "c" in names[0].split("+") and names[1] == "sdpa", names
    if prefill_gemm.enabled():   # the prefill attended in C too (no chunk reached the bf16 path's SDPA)
        assert names[0] == "c", names


def test_cpu_step_follows_the_reference_through_retry_and_undo(mixed_gguf, home):
    q, ref = both(mixed_gguf)
    qc, rc = q.model.new_cache(128), ref.model.new_cache(128)
    step = CpuStep(q.model, qc)
    t = q.template
    turn1 = t.start("") + t.user_turn("hello world")
    rng = np.random.default_rng(3)
    reply = [int(x) for x in rng.integers(3, q.tokenizer.vocab_size, 12)]

    def prefill(ids):
        with torch.no_grad():
            return (q.model(torch.tensor([ids]), qc, last=True)[0, -1],
                    ref.model(torch.tensor([ids]), rc, last=True)[0, -1])

    def decode(ids):
        for tok in ids:
            with torch.no_grad():
                b = ref.model(torch.tensor([[tok]]), rc)[0, -1]
            assert_close_logits(step(tok), b, LOGITS_REL_ACT8)   # MIXED holds Q4_K, Q5_K and Q6_K rows
        assert qc.seqlen == rc.seqlen == int(qc.cache_seqlens[0])

    prefill(turn1)
    decode(reply)
    qc.rewind(len(turn1)), rc.rewind(len(turn1))              # /retry: the reply again
    decode(reply[::-1])
    turn2 = t.end_reply() + t.user_turn("1234 what")
    prefill(turn2)                                            # a second turn on a non-empty cache
    decode(reply[:6])
    qc.rewind(len(turn1) + 12), rc.rewind(len(turn1) + 12)    # /undo the second exchange
    decode(reply[:4])
    # The cache holds what a fresh prefill of the same tokens writes (fp16 of it).
    tokens = turn1 + reply[::-1] + reply[:4]
    fresh = ref.model.new_cache(128)
    with torch.no_grad():
        ref.model(torch.tensor([tokens]), fresh)
    n = qc.seqlen
    assert n == len(tokens)
    torch.testing.assert_close(qc.k_cache[:, :, :n].float(), fresh.k_cache[:, :, :n], atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(qc.v_cache[:, :, :n].float(), fresh.v_cache[:, :, :n], atol=2e-2, rtol=2e-2)


def test_threads_agree(mixed_gguf, home):
    """One thread and two give the same logits: a race between the step's threads shows here."""
    q, _ = both(mixed_gguf)
    out = []
    for threads in (1, 2):
        cache = q.model.new_cache(96)
        step = CpuStep(q.model, cache, threads=threads)
        out.append(torch.stack([step(tok).clone() for tok in range(3, 83)]))
    # Only the order of the attention merge differs; a race was off by whole logits.
    torch.testing.assert_close(out[0], out[1], atol=1e-3, rtol=1e-3)


def test_quantized_session_chats_with_retry_and_undo(mixed_gguf, home):
    q, ref = both(mixed_gguf)
    s = Session(q, Settings(temperature=0.0, max_new_tokens=10), context=200)
    r = Session(ref, Settings(temperature=0.0, max_new_tokens=10), context=200)
    assert s.gen.cpu_step is not None and r.gen.cpu_step is None
    steps = [("send", "hello world"), ("send", "what 1234"), ("cmd", "/retry"), ("cmd", "/undo"),
             ("send", "world hello")]
    for kind, text in steps:
        for sess in (s, r):
            list(sess.send(text) if kind == "send" else ChatKeeper(sess, None).run_command(text))
        assert_invariant(s, atol=5e-2, rtol=2e-2)   # fp16; int8 activations on the K-quant rows (worst 0.04)
        assert s.tokens == r.tokens and s.cache.seqlen == r.cache.seqlen


CORRUPT = {"repacked": ("model.layers.0.self_attn.k_proj.weight.scale", r"\(mins are"),   # Q4_1
           "file-bytes": ("model.layers.0.mlp.gate_proj.weight.q4_k", r"\(q4_k torch.uint8 \(512, 3\); q4_k rows")}


def test_a_short_prefill_is_decode_steps(mixed_gguf, home):
    """A prompt shorter than the prefill GEMM's fixed cost (it prepares every weight block on each
    call, about eight decode steps) is fed through the C step, token by token: never slower than
    decoding it. A longer one takes the model's forward."""
    q = load_model(str(mixed_gguf), LoadOptions(quantized=True))
    forwards: list[int] = []
    q.model.register_forward_hook(lambda *a: forwards.append(1))
    gen = Generator(q.model, q.model.new_cache(64), q.tokenizer.vocab_size)
    ids = list(range(3, 3 + STEPS_BELOW - 1))
    gen.prefill(ids)
    assert forwards == [] and gen.cache.seqlen == len(ids)
    alone = CpuStep(q.model, q.model.new_cache(64))
    assert torch.equal(gen.logits, alone.prefill(ids)[:q.tokenizer.vocab_size])
    gen.cache.reset()
    gen.prefill(list(range(3, 3 + STEPS_BELOW)))
    assert forwards == [1] and gen.cache.seqlen == STEPS_BELOW


@pytest.mark.parametrize("hugepages", ["1", "0"], ids=["arena", "file-pages"])
def test_a_gguf_opened_in_place_computes_what_its_converted_copy_does(mixed_gguf, tmp_path, home, monkeypatch,
                                                                       hugepages):
    """Opening in place (weights from the GGUF's mapping, repacked or unpermuted at load) gives the
    weights, logits and decode steps of the converted directory the loader used to write, bit
    for bit, on the quantized path and the fp32 reference."""
    monkeypatch.setenv("NANOCHAT_HUGEPAGES", hugepages)
    folder = convert_gguf(mixed_gguf, tmp_path / "mixed-model")
    for opts in (LoadOptions(quantized=True), LoadOptions()):
        a, b = load_model(str(mixed_gguf), opts), load_model(str(folder), opts)
        for (name, x), (_, y) in zip(a.model.named_buffers(), b.model.named_buffers(), strict=True):
            assert x.dtype == y.dtype and torch.equal(x, y), name
        for (name, x), (_, y) in zip(a.model.named_parameters(), b.model.named_parameters(), strict=True):
            assert torch.equal(x, y), name
        ids = a.template.start("") + a.template.user_turn("hello 1234 world")
        with torch.no_grad():
            assert torch.equal(a.model(torch.tensor([ids]), a.model.new_cache(64)),
                               b.model(torch.tensor([ids]), b.model.new_cache(64)))
    quantized = [load_model(str(src), LoadOptions(quantized=True)) for src in (mixed_gguf, folder)]
    steps = [CpuStep(lm.model, lm.model.new_cache(64), 1) for lm in quantized]
    for tok in ids:
        assert torch.equal(steps[0](tok), steps[1](tok))


@pytest.mark.parametrize("which", CORRUPT)
@pytest.mark.parametrize("quantized", [True, False], ids=["quantized", "dequantized"])
def test_corrupt_quantized_tensor_names_the_file(mixed_gguf, tmp_path, home, quantized, which):
    """A model directory holding our block formats (what `nanochat-tui pull` installs) with a part
    that does not fit its weight: one line naming the directory."""
    folder = convert_gguf(mixed_gguf, tmp_path / "mixed-model")
    weights = folder / "model.safetensors"
    state = load_file(str(weights))
    key, why = CORRUPT[which]
    state[key] = state[key][:, :3].contiguous()
    save_file(state, str(weights))
    base = key.rsplit(".", 1)[0]
    with pytest.raises(ModelLoadError, match=rf"mixed-model: quantized weight {base} is corrupt {why}") as e:
        load_model(str(folder), LoadOptions(quantized=quantized))
    assert "\n" not in str(e.value)


def test_truncated_converted_weights_name_the_folder(mixed_gguf, tmp_path, home):
    folder = convert_gguf(mixed_gguf, tmp_path / "mixed-model")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ModelLoadError, match=r"mixed-model") as e:
        load_model(str(folder), LoadOptions(quantized=True))
    assert "\n" not in str(e.value)


def test_cpu_step_serves_gemma_windows_and_norms(tmp_path, home):
    """Gemma 3 (four norms scaling by 1 + w, GeGLU, q/k norms, windows of 6 keys on five layers
    in six, two rotary bases) decoded by the C step follows the fp32 reference past the window."""
    from gemma_tiny import save_tiny
    from gemma_tiny import write_gguf as write_gemma

    path = write_gemma(tmp_path / "gemma.gguf", save_tiny(tmp_path / "hf"), Q.Q8_0)
    q, ref = both(path)
    qc, rc = q.model.new_cache(64), ref.model.new_cache(64)
    assert Generator(q.model, q.model.new_cache(64), q.tokenizer.vocab_size).cpu_step is not None
    step = CpuStep(q.model, qc)
    assert step.gemma and [layer.window for layer in step.layers] == [5, 5, 5, 5, 5, -1]
    ids = q.template.start("") + q.template.user_turn("hello there")
    with torch.no_grad():
        q.model(torch.tensor([ids]), qc, last=True), ref.model(torch.tensor([ids]), rc, last=True)
        for tok in [5, 9, 11, 7, 13, 8, 10, 12, 9, 6, 14, 7]:   # well past the 6-key window
            assert_close_logits(step(tok), ref.model(torch.tensor([[tok]]), rc)[0, -1])


def test_a_quantized_chat_resumes_from_its_snapshot(mixed_gguf, tmp_path, home):
    """Headless, the CPU default path: /save, then --resume restores the fp16 cache from its
    snapshot, and the next greedy reply equals the one the same chat gives in one process."""
    import os
    import subprocess
    import sys

    def headless(stdin: str, *extra: str, chats) -> list[dict]:
        env = {**os.environ, "NANOCHAT_TUI_CHATS": str(chats)}
        p = subprocess.run([sys.executable, "-m", "chatapp.cli", "--headless", "--model", str(mixed_gguf),
                            "--temperature", "0", "--max-new-tokens", "6", *extra], input=stdin.encode(),
                           capture_output=True, timeout=300, env=env)
        assert p.returncode == 0, p.stderr.decode()[-2000:]
        return [json.loads(line) for line in p.stdout.decode().splitlines()]

    first = headless("hello\n/save\nsecond\n", chats=tmp_path / "a")
    resumed = headless("third\n", "--resume", chats=tmp_path / "a")
    whole = headless("hello\nsecond\nthird\n", chats=tmp_path / "b")
    assert resumed[0]["restored_tokens"] == first[-1]["cache_seqlens"] and resumed[0]["reprefilled_tokens"] == 0
    assert resumed[1]["cached_before"] == first[-1]["cache_seqlens"]
    assert resumed[1]["reply"] == whole[-1]["reply"]


def headless_hello(gguf, tmp_path, native: str) -> tuple[list[str], list[dict]]:
    """One greedy "hello" through `--headless` in a fresh process with NANOCHAT_NATIVE=`native`:
    its stderr lines and its `turn` events."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NANOCHAT_NATIVE": native, "NANOCHAT_TUI_CHATS": str(tmp_path / "chats")}
    p = subprocess.run([sys.executable, "-m", "chatapp.cli", "--headless", "--model", str(gguf),
                        "--temperature", "0", "--max-new-tokens", "4"], input=b"hello\n", capture_output=True,
                       timeout=300, env=env)
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    events = map(json.loads, p.stdout.decode().splitlines())
    return p.stderr.decode().splitlines(), [e for e in events if e["event"] == "turn"]


def test_without_the_kernels_the_app_runs_dequantized_with_a_note(mixed_gguf, tmp_path, home):
    """No C compiler (NANOCHAT_NATIVE=0 stands in for one): a one-line note, then the exact fp32
    path chats as usual."""
    notes, turns = headless_hello(mixed_gguf, tmp_path, "0")
    assert [n for n in notes if "CPU kernels unavailable" in n] == [
        "nanochat-tui: note: CPU kernels unavailable (NANOCHAT_NATIVE=0); quantized models run "
        "dequantized to fp32 (slower, more memory)"]
    assert len(turns) == 1 and turns[0]["cache_seqlens"] > 0


def test_a_descheduled_thread_delays_nobody(mixed_gguf, home):
    """A build whose second thread sleeps 50 ms on every third block it claims (what a busy
    machine does to a thread): the other thread computes those blocks too and never waits, so
    a token takes far less than one such sleep, and the logits are the one-thread step's."""
    import time

    stalled = native.build(["-O3", "-march=native", "-fopenmp", "-pthread", "-DQD_STALL_US=50000"])
    assert stalled is not None
    q, _ = both(mixed_gguf)
    out, times = [], []
    for lib, threads in ((native.library(), 1), (stalled, 2)):
        cache = q.model.new_cache(96)
        step = CpuStep(q.model, cache, threads=threads)
        step.lib, ctx = lib, step.ctx   # rebuild the context on the stalling library
        native.library().qd_free(ctx)
        step.ctx = lib.qd_new(ctypes.byref(step.model))
        t = time.perf_counter()
        out.append(torch.stack([step(tok).clone() for tok in range(3, 43)]))
        times.append((time.perf_counter() - t) / 40)
        del step
    torch.testing.assert_close(out[0], out[1], atol=1e-3, rtol=1e-3)
    assert times[1] < 0.02, f"{times[1] * 1e3:.1f} ms a token: the step waited for the sleeping thread"


def step_logits(lib: ctypes.CDLL, q, threads: int, n: int = 30) -> torch.Tensor:
    """n tokens' logits from a C step whose context lives in `lib` (another build of the kernels)."""
    step = CpuStep(q.model, q.model.new_cache(64), threads=threads)
    native.library().qd_free(step.ctx)
    step.lib, step.ctx = lib, lib.qd_new(ctypes.byref(step.model))
    return torch.stack([step(tok).clone() for tok in range(3, 3 + n)])


def test_portable_and_clang_builds_run_the_same_step(mixed_gguf, home, portable):
    """The portable C path (what a CPU without AVX2 gets) and, where clang is installed, clang's
    builds of both paths decode what the default build decodes."""
    import shutil

    q, _ = both(mixed_gguf)
    want = step_logits(native.library(), q, 2)
    builds = [portable]
    if shutil.which("clang"):
        for flags in (["-O3", "-march=native", "-pthread"], ["-O3", "-pthread"]):
            lib = native.build(flags, cc="clang")
            assert lib is not None, f"clang failed on qdecode.c with {flags}"
            assert lib.qd_simd() == ("-march=native" in flags)
            builds.append(lib)
    for lib in builds:
        torch.testing.assert_close(step_logits(lib, q, 2), want, atol=2e-3, rtol=2e-3)


def test_portable_kernels_say_so_in_one_line(mixed_gguf, tmp_path, home):
    notes, turns = headless_hello(mixed_gguf, tmp_path, "portable")
    assert [n for n in notes if "without SIMD" in n] == [
        "nanochat-tui: note: CPU kernels built without SIMD (NANOCHAT_NATIVE=portable); decode runs "
        "the portable C path (slower)"]
    assert len(turns) == 1 and turns[0]["cache_seqlens"] > 0
