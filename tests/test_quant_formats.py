"""The GGUF types kept as the file's own bytes (model/cpu/file_blocks.py, kernels in
model/cpu/qformats.h): Q5_0, Q6_K, Q2_K, Q3_K, IQ4_NL and IQ4_XS. Every kernel, AVX2
and portable, equals the gguf package's dequantization followed by an exact reference: the
dequantized rows bit for bit, the GEMV within float rounding of a float64 product with the
integer activations the kernels use (int16 per 32; int8 per 32 for Q4_K, Q5_K and Q6_K where
that rounding is close enough). Blocks come from three sources: every bit pattern (random
bytes with finite scales), the gguf package's own quantizer where it has one, and rows cut
from files llama-quantize made (tests/data/llama_quantize_rows.gguf)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, quants
from helpers import (
    K8_MAX_ERR,
    LOGITS_REL_ACT8,
    act_reference,
    assert_greedy_within,
    bits,
    int8_error,
    int16_reference,
    random_blocks,
    turn_of,
)

from model.cpu import native
from model.cpu.file_blocks import FILE_TYPES, as_rows
from model.cpu.qlinear import QLinear

pytestmark = pytest.mark.skipif(native.library() is None, reason=f"CPU kernels unavailable: {native.why_not()}")
ROWS, COLS = 7, 512   # an odd row: the AVX2 build takes rows two at a time
FIXTURE = Path(__file__).parent / "data" / "llama_quantize_rows.gguf"


@pytest.fixture(scope="module")
def portable():
    lib = native.build(["-O3", "-fopenmp"])
    assert lib is not None and lib.qd_simd() == 0
    return lib


@pytest.fixture(scope="module")
def avx2_only():
    """The AVX2 kernels without VNNI or AVX-512 (what a CPU before them runs): this machine's
    native build takes the VNNI byte kernels instead, so both are checked."""
    lib = native.build(["-O3", "-mavx2", "-mfma", "-mf16c", "-pthread"])
    assert lib is not None and lib.qd_simd() == 1
    return lib




def fixture_tensors() -> list[tuple[str, str, np.ndarray, int]]:
    """(type, tensor name, bytes, cols) of every tensor in the llama-quantize fixture."""
    out = []
    for t in GGUFReader(FIXTURE).tensors:
        cols = int(t.shape[0])
        out.append((t.tensor_type.name, t.name, np.array(t.data).reshape(int(t.shape[1]), -1), cols))
    return out


def sources(kind: str) -> list[tuple[str, np.ndarray, int]]:
    """(where from, GGUF bytes (rows, row bytes), cols) to test `kind` on."""
    rng = np.random.default_rng(sum(map(ord, kind)))
    out = [("every bit pattern", random_blocks(kind, ROWS, COLS, rng), COLS)]
    if kind == "Q5_0":   # the gguf package quantizes this one itself
        w = rng.normal(0, 1, (ROWS, COLS)).astype(np.float32)
        out.append(("gguf.quants.quantize", quants.quantize(w, Q.Q5_0).reshape(ROWS, -1), COLS))
    out += [(f"llama-quantize {name}", raw, cols) for t, name, raw, cols in fixture_tensors() if t == kind]
    return out


def file_linear(kind: str, raw: np.ndarray, cols: int) -> QLinear:
    return QLinear(kind.lower(), torch.from_numpy(as_rows(kind.lower(), raw, raw.shape[0], cols)))


def test_the_fixture_holds_every_file_type_from_llama_quantize():
    assert {t for t, *_ in fixture_tensors()} >= set(FILE_TYPES)
    assert FIXTURE.stat().st_size < 200_000


@pytest.mark.parametrize("kind", FILE_TYPES)
def test_dequantized_rows_equal_gguf_bit_for_bit(kind, portable, avx2_only):
    for where, raw, cols in sources(kind):
        ql = file_linear(kind, raw, cols)
        want = quants.dequantize(raw, Q[kind]).reshape(raw.shape[0], cols).astype(np.float32)
        assert np.isfinite(want).all()
        assert ql.in_features == cols and ql.out_features == raw.shape[0]
        for lib in (native.library(), avx2_only, portable):
            out = torch.empty(raw.shape[0], cols)
            lib.qd_dequant(ql.qw(), out.data_ptr(), 2)
            assert np.array_equal(bits(out.numpy()), bits(want)), (where, lib.qd_simd())
        rows = torch.tensor([[1, 0], [raw.shape[0] - 1, 1]])
        assert torch.equal(ql.rows(rows), torch.from_numpy(want)[rows])   # the embedding lookup


@pytest.mark.parametrize("kind", FILE_TYPES)
def test_gemv_equals_the_integer_reference(kind, portable, avx2_only):
    """Int16 activations per 32; int8 per 32 for the K-quant rows (helpers.ACT8_TYPES) where that
    rounding's error is small, as for Gaussian values, and int16 where an outlier channel makes it
    large. The same in every build."""
    rng = np.random.default_rng(7)
    for where, raw, cols in sources(kind):
        ql = file_linear(kind, raw, cols)
        w = quants.dequantize(raw, Q[kind]).reshape(raw.shape[0], cols)
        plain = rng.normal(0, 1, cols).astype(np.float32)
        outlier = plain.copy()
        outlier[5] = 30.0   # an outlier channel, as real MLP hidden states have
        assert int8_error(plain) < K8_MAX_ERR < int8_error(outlier)
        for x in (plain, outlier):
            want = act_reference(kind, w, x)
            for lib in (native.library(), avx2_only, portable):
                y = torch.empty(raw.shape[0])
                lib.qd_gemv(ql.qw(), torch.from_numpy(x).data_ptr(), y.data_ptr(), 2)
                # float32 sums of exact integer block products: within float rounding of float64
                np.testing.assert_allclose(y.numpy(), want, rtol=1e-5, atol=1e-5 * np.abs(want).max(),
                                           err_msg=f"{where}, simd={lib.qd_simd()}")


def test_the_gemv_check_has_teeth(portable):
    """A kernel reading one bit wrong fails the bound above: Q3_K's hmask with its sense flipped."""
    raw = random_blocks("Q3_K", ROWS, COLS, np.random.default_rng(0))
    x = np.random.default_rng(1).normal(0, 1, COLS).astype(np.float32)
    flipped = raw.reshape(ROWS, -1, 110).copy()
    flipped[..., :32] ^= 0xFF
    w_wrong = quants.dequantize(flipped.reshape(ROWS, -1), Q.Q3_K).reshape(ROWS, COLS)
    y = torch.empty(ROWS)
    native.library().qd_gemv(file_linear("Q3_K", raw, COLS).qw(), torch.from_numpy(x).data_ptr(), y.data_ptr(), 1)
    want = int16_reference(w_wrong, x)
    assert np.abs(y.numpy() - want).max() > 1e-3 * np.abs(want).max()


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_types_without_a_kernel_run_dequantized_with_a_note(tmp_path, home):
    """IQ2_XXS (random blocks) and TQ2_0 (gguf's own quantizer) have no kernel: their exact fp32
    values run, the CLI says so in one line, and the quantized path still chats."""
    import os
    import subprocess
    import sys

    from helpers import write_gguf

    from model.cpu.step import CpuStep
    from model.loading import LoadOptions, load_model

    path = tmp_path / "iq.gguf"
    state = write_gguf(path, {0: {"ffn_up": Q.IQ2_XXS}, 1: {"attn_q": Q.TQ2_0}, "token_embd": Q.IQ4_XS}, tied=True)
    lm = load_model(str(path), LoadOptions(quantized=True))
    note = ("nanochat-tui: note: iq: no kernel for IQ2_XXS (1 tensor), TQ2_0 (1 tensor); dequantized exactly "
            "to fp32 (slower, more memory)")
    assert lm.notes == [note]
    up = lm.model.model.layers[0].mlp.up_proj
    assert up.kind == "f32" and torch.equal(up.q, torch.from_numpy(state["model.layers.0.mlp.up_proj.weight"]))
    ids = lm.template.start("") + lm.template.user_turn("hello 1234 world")
    fp32 = load_model(str(path))   # the exact reference (test_gguf checks it against transformers)
    with torch.no_grad():
        ref = fp32.model(torch.tensor([ids]), fp32.model.new_cache(64))[0]
        step = CpuStep(lm.model, lm.model.new_cache(64))
        got = torch.stack([step(t).clone() for t in ids])
    assert (got - ref).abs().max().item() <= 5e-3 * ref.abs().max().item()
    p = subprocess.run([sys.executable, "-m", "chatapp.cli", "--headless", "--no-store", "--model", str(path),
                        "--temperature", "0", "--max-new-tokens", "3"], input=b"hello\n", capture_output=True,
                       timeout=300, env={**os.environ})
    assert p.returncode == 0, p.stderr.decode()[-2000:]
    assert [line for line in p.stderr.decode().splitlines() if "no kernel" in line] == [note]


def test_a_mixed_file_from_llama_quantize_chats_on_the_quantized_path(home):
    """tests/data/tiny_llama_q3_k_m.gguf: the test suite's tiny Llama (random weights, F32),
    quantized by llama.cpp's llama-quantize to Q3_K_M, its own mix (Q3_K, Q4_K and Q5_K layers,
    a Q6_K head). Every matrix stays in the file's format, and every token of a greedy chat through
    the C step (the object the app decodes with) is the fp32-dequantized reference's pick, or within
    the int8 activations' bound of it (a near-tie of random weights), and nearly all exactly."""
    from chatapp.chat.session import Session
    from chatapp.chat.settings import Settings
    from model.loading import LoadOptions, load_model

    path = Path(__file__).parent / "data" / "tiny_llama_q3_k_m.gguf"
    q, ref = load_model(str(path), LoadOptions(quantized=True)), load_model(str(path))
    kinds = {m.kind for m in q.model.modules() if isinstance(m, QLinear)}
    assert kinds == {"q3_k", "q4_k", "q5_k", "q6_k"}
    s = Session(q, Settings(temperature=0.0, max_new_tokens=12), context=128)
    assert s.gen.cpu_step is not None
    exact = total = 0
    for text in ("hello world", "what is 1234"):
        st = turn_of(list(s.send(text)))
        start = s.exchanges[-1].reply_start
        exact += assert_greedy_within(ref.model, s.tokens, start, st.decode_tokens, LOGITS_REL_ACT8)
        total += st.decode_tokens
    assert total >= 12 and exact >= total - 2
