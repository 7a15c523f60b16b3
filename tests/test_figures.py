"""Figures a person reads (chatapp/chat/figures.py): seconds past a second, human units in the
panel and in /stats, the cache's dtype apart from the weights' format, device rows only for
their device, and panel rows that fit."""

import pytest
import torch
from tui_pilot import make_app, notices, ready, row, submit

from chatapp.chat.figures import human_bytes, human_ms, stats_text
from chatapp.tui.cache_panel import LABEL_WIDTH, Row


def test_durations_and_sizes_read_as_people_say_them():
    assert human_ms(568.06) == "568.1 ms"
    assert human_ms(62880.9) == "62.9 s"
    assert human_ms(185_000) == "3 min 05 s"
    assert human_bytes(7695360) == "7.3 MiB" and human_bytes(512) == "512 B"


def stats_rows(text: str) -> dict[str, dict[str, str]]:
    """/stats's sections as {section: {name: value}}, checking every row's value starts in one column."""
    sections, columns = {}, set()
    for line in text.splitlines():
        if not line.startswith("  "):
            sections[line] = rows = {}
            continue
        name, value = line.split(None, 1)
        columns.add(line.index(value, len(name) + 2))
        rows[name] = value
    assert len(columns) == 1, text
    return sections


def test_stats_are_aligned_rows_in_sections_with_units():
    """/stats was one dense key=value block (issue 44)."""
    text = stats_text({"cache_seqlens": 334, "tokens": 336, "kv_bytes_used": 7695360, "kv_bytes_allocated": 3 << 30,
                       "temperature": 0.7, "max_new_tokens": None, "last_ttft_ms": 62880.9,
                       "last_tokens_per_s": 18.94})
    assert stats_rows(text) == {
        "cache": {"cache_seqlens": "334", "tokens": "336 (2 pending: in the chat, prefilled with the next turn)",
                  "kv_used": "7.3 MiB", "kv_allocated": "3.0 GiB"},
        "settings": {"temperature": "0.7", "max_new_tokens": "none"},
        "last turn": {"ttft": "62.9 s", "speed": "18.9 tok/s"}}


@pytest.mark.anyio
async def test_the_panel_and_stats_in_the_app():
    app = make_app("--temperature", "0", "--max-new-tokens", "4")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert not app.panel.row("cuda_allocated").display and not app.panel.row("cuda_reserved").display
        assert row(app, "weights") == "float32" and app.panel.row("dtype").label == "KV dtype"
        await submit(pilot, "hello")
        assert row(app, "ttft").endswith((" ms", " s")) and row(app, "shape") == "2×1×2048×2×16"
        inner = app.panel.content_region.width
        for r in app.panel.query(Row):
            if r.display and not r.has_class("wrap"):
                assert LABEL_WIDTH + len(r.value) <= inner, (r.id, r.value)
        await submit(pilot, "/stats")
        stats = stats_rows(notices(app)[-1])
        assert stats["cache"]["kv_used"].endswith("iB") and "kv_bytes_used" not in stats["cache"]
        assert stats["cache"]["weights"] == "float32" and stats["last turn"]["ttft"].endswith("ms")


@pytest.mark.anyio
async def test_one_tab_reaches_the_transcript_and_the_footer_names_its_keys():
    app = make_app("--no-store")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await pilot.press("tab")
        await pilot.pause()
        assert app.focused is app.transcript
        footer = " ".join(str(k.render()) for k in app.screen.query("FooterKey"))
        assert "Prev code" in footer and "Copy code" in footer


def test_the_weights_format_of_a_quantized_model_fits_its_row():
    """The default model's layout (Q4_1 GGUF kept as blocks: 4-bit layers, an 8-bit embedding)."""
    from chatapp.chat.figures import weights_format
    from model.cpu.qlinear import QLinear

    class Fake(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Module(), torch.nn.Module()
            self.a.kind, self.b.kind = "q4", "q8"

    text = weights_format(Fake())
    assert text == "4-bit+8-bit blocks" and LABEL_WIDTH + len(text) <= 33
    assert QLinear is not None


@pytest.mark.anyio
async def test_the_panel_names_our_c_kernels_for_a_quantized_gguf(mixed_gguf, home):
    """A GGUF on the CPU's default path attends in our C (the decode step, the prefill with the
    GEMM): the backend row says so, not SDPA, and fits its row."""
    app = make_app("--model", str(mixed_gguf), "--temperature", "0", "--max-new-tokens", "4", "--no-store")
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        await submit(pilot, "hello")
        assert "C kernels" in row(app, "backend").split("+"), row(app, "backend")
        assert LABEL_WIDTH + len(row(app, "backend")) <= app.panel.content_region.width
