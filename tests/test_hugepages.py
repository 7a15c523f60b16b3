"""The quantized weights in one huge-page arena (model/cpu/hugepages.py): a GGUF's QLinear buffers
(opened in place, or from a converted model directory) land in an anonymous mapping advised
MADV_HUGEPAGE at load, the file's mapping is let go, and the C step computes the same logits from
the moved bytes as from the file's pages (tests/data/tiny_llama_q3_k_m.gguf: llama-quantize's
Q3_K_M mix)."""

from __future__ import annotations

import mmap
import sys
from pathlib import Path

import pytest
import torch

from model.cpu import native
from model.cpu.hugepages import model_linears
from model.cpu.step import CpuStep
from model.loading import LoadOptions, load_model
from model.loading.gguf import convert_gguf

GGUF = Path(__file__).parent / "data" / "tiny_llama_q3_k_m.gguf"
pytestmark = [pytest.mark.skipif(not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_HUGEPAGE"),
                                 reason="MADV_HUGEPAGE is Linux's"),
              pytest.mark.skipif(native.library() is None, reason="CPU kernels unavailable")]


def mapping_of(addr: int) -> tuple[str, str]:
    """(the /proc/self/maps line, its VmFlags) of the mapping holding `addr`."""
    line = None
    for text in Path("/proc/self/smaps").read_text().splitlines():
        head = text.split()[0]
        if "-" in head and ":" not in head:
            lo, hi = (int(x, 16) for x in head.split("-"))
            line = text if lo <= addr < hi else None
        elif line and text.startswith("VmFlags:"):
            return line, text
    raise AssertionError(f"{addr:#x} is in no mapping")


def logits(lm, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        step = CpuStep(lm.model, lm.model.new_cache(64), 1)
        return torch.stack([step(t).clone() for t in ids])


@pytest.mark.parametrize("source", ["gguf", "folder"])
def test_weights_move_into_one_advised_mapping_and_compute_the_same(tmp_path, monkeypatch, source):
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path / "home"))
    spec = GGUF if source == "gguf" else convert_gguf(GGUF, tmp_path / "folder")
    lm = load_model(str(spec), LoadOptions(quantized=True))
    # the loader's mapping of the file is gone (it kept the pages the copy read resident)
    assert not [m for m in Path("/proc/self/maps").read_text().splitlines() if str(spec) in m]
    monkeypatch.setenv("NANOCHAT_HUGEPAGES", "0")
    plain = load_model(str(GGUF), LoadOptions(quantized=True))
    lins, before = model_linears(lm.model), model_linears(plain.model)
    assert {ql.kind for ql in lins} >= {"q3_k", "q4_k", "q6_k"}
    bufs = [getattr(ql, n) for ql in lins for n in ("q", "scale", "min") if getattr(ql, n) is not None]
    homes = {mapping_of(b.data_ptr()) for b in bufs}
    assert len(homes) == 1   # one mapping holds every weight
    (line, flags), = homes
    assert "hg" in flags.split() and len(line.split()) == 5   # advised MADV_HUGEPAGE; anonymous (no file)
    assert all(b.data_ptr() % 64 == 0 for b in bufs)
    for a, b in zip(lins, before, strict=True):
        for n in ("q", "scale", "min"):
            x, y = getattr(a, n), getattr(b, n)
            assert (x is None) == (y is None) and (x is None or torch.equal(x, y))
    ids = lm.template.start("") + lm.template.user_turn("hello 1234 world")
    assert torch.equal(logits(lm, ids), logits(plain, ids))


def test_the_off_switch_keeps_the_files_pages(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_TUI_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("NANOCHAT_HUGEPAGES", "0")
    lm = load_model(str(GGUF), LoadOptions(quantized=True))
    line, _ = mapping_of(lm.model.lm_head.q.data_ptr())
    assert line.split()[-1] == str(GGUF.resolve())   # read where it lies: the GGUF's own pages
