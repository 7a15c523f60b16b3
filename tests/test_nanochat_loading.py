"""Loading nanochat checkpoints: layout, steps, shortcuts, overrides and one-line errors."""

import json
import shutil
from pathlib import Path

import pytest
import torch

from model.errors import ModelLoadError
from model.loading import LoadOptions, load_model

FIX = Path(__file__).parent / "fixtures" / "nanochat"
TOKENIZER = str(FIX / "tokenizer" / "tokenizer.pkl")


def opts(**kw) -> LoadOptions:
    return LoadOptions(tokenizer=TOKENIZER, attn="sdpa", **kw)


def copy_fixture(name: str, dest: Path) -> Path:
    shutil.copytree(FIX / name, dest)
    (dest / "golden.pt").unlink()
    return dest


def error_of(spec: str, o: LoadOptions | None = None) -> str:
    with pytest.raises(ModelLoadError) as e:
        load_model(spec, o or opts())
    msg = str(e.value)
    assert "\n" not in msg and "Traceback" not in msg
    return msg


def test_orig_mod_prefix_is_stripped():
    raw = torch.load(FIX / "head" / "model_000420.pt", weights_only=True)
    assert all(k.startswith("_orig_mod.") for k in raw)  # the fixture really has the prefix
    assert load_model(str(FIX / "head"), opts()).model.config.n_layer == 4


def base_dir(tmp_path: Path) -> Path:
    """nanochat's layout: <base>/tokenizer and <base>/chatsft_checkpoints/d<N>."""
    base = tmp_path / "nanochat"
    (base / "tokenizer").mkdir(parents=True)
    shutil.copy(TOKENIZER, base / "tokenizer" / "tokenizer.pkl")
    copy_fixture("head", base / "chatsft_checkpoints" / "d4")
    copy_fixture("jan2026", base / "chatsft_checkpoints" / "d12")
    copy_fixture("oct2025", base / "base_checkpoints" / "d3")
    return base


def test_shortcuts_follow_nanochat_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("NANOCHAT_BASE_DIR", str(base_dir(tmp_path)))
    assert load_model("nanochat:sft", LoadOptions()).model.config.generation == "2026-01"  # deepest tag
    assert load_model("nanochat:sft", LoadOptions(model_tag="d4")).model.config.generation == "2026-03-14"
    assert load_model("nanochat:base", LoadOptions()).model.config.generation == "2025-10"
    assert "no nanochat checkpoints" in error_of("nanochat:rl", LoadOptions())
    assert "no model tag 'd99'" in error_of("nanochat:sft", LoadOptions(model_tag="d99"))
    assert "unknown nanochat source" in error_of("nanochat:chat", LoadOptions())


def test_tokenizer_found_beside_checkpoints_without_env(tmp_path, monkeypatch):
    base = base_dir(tmp_path)
    monkeypatch.delenv("NANOCHAT_BASE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    lm = load_model(str(base / "chatsft_checkpoints" / "d4"), LoadOptions())
    assert lm.tokenizer.vocab_size == 300
    shutil.rmtree(base / "tokenizer")
    msg = error_of(str(base / "chatsft_checkpoints" / "d4"), LoadOptions())
    assert "tokenizer not found" in msg and "--tokenizer" in msg


def test_last_step_unless_step_given(tmp_path):
    ckpt = copy_fixture("head", tmp_path / "d4")
    # an older step with other weights: the jan2026 fixture renamed
    for src, dst in (("model_000650.pt", "model_000100.pt"), ("meta_000650.json", "meta_000100.json")):
        shutil.copy(FIX / "jan2026" / src, ckpt / dst)
    assert load_model(str(ckpt), opts()).name.endswith("step 420 (2026-03-14)")
    assert load_model(str(ckpt), opts(step=100)).model.config.generation == "2026-01"
    assert "no step 7" in error_of(str(ckpt), opts(step=7)) and "100, 420" in error_of(str(ckpt), opts(step=7))


def test_corrupt_checkpoint_names_the_file(tmp_path):
    ckpt = copy_fixture("head", tmp_path / "d4")
    data = (ckpt / "model_000420.pt").read_bytes()
    (ckpt / "model_000420.pt").write_bytes(data[: len(data) // 2])
    msg = error_of(str(ckpt))
    assert "model_000420.pt" in msg and "not a readable PyTorch checkpoint" in msg


class NotATensor:
    pass


def test_weights_only_refuses_objects(tmp_path):
    ckpt = copy_fixture("head", tmp_path / "d4")
    torch.save({"transformer.wte.weight": torch.zeros(2, 2), "x": NotATensor()}, ckpt / "model_000420.pt")
    assert "not a readable PyTorch checkpoint" in error_of(str(ckpt))


def edit_meta(ckpt: Path, step: int, **changes) -> None:
    path = ckpt / f"meta_{step:06d}.json"
    meta = json.loads(path.read_text())
    meta["model_config"].update(changes)
    path.write_text(json.dumps(meta))


def test_mismatched_meta_is_one_line_error(tmp_path):
    ckpt = copy_fixture("head", tmp_path / "d4")
    edit_meta(ckpt, 420, n_layer=5)
    msg = error_of(str(ckpt))
    assert "model_000420.pt" in msg and "does not fit" in msg and "weights missing" in msg
    edit_meta(ckpt, 420, n_layer=4, rope_scaling=2.0)
    assert "meta_000420.json" in error_of(str(ckpt)) and "rope_scaling" in error_of(str(ckpt))
    (ckpt / "meta_000420.json").write_text("{not json")
    assert "meta_000420.json: not valid JSON" in error_of(str(ckpt))
    (ckpt / "meta_000420.json").unlink()
    assert "meta_000420.json: missing" in error_of(str(ckpt))


def test_tokenizer_vocab_must_match(tmp_path):
    ckpt = copy_fixture("head", tmp_path / "d4")
    edit_meta(ckpt, 420, vocab_size=290)
    msg = error_of(str(ckpt))
    assert "tokenizer.pkl: 300 tokens" in msg and "290" in msg


def test_experimental_checkpoints_are_refused(tmp_path):
    ckpt = copy_fixture("jan2026", tmp_path / "d4")
    state = torch.load(ckpt / "model_000650.pt", weights_only=True)
    state["bigram_embed.embed.weight"] = torch.zeros(4, 32)
    torch.save(state, ckpt / "model_000650.pt")
    assert "short-lived nanochat experiment" in error_of(str(ckpt))


def test_override_file_selects_what_detection_cannot(tmp_path):
    """2026-01 and 2026-03-02 have the same weights; only the softcap differs."""
    ckpt = copy_fixture("jan2026", tmp_path / "d4")
    g = torch.load(FIX / "jan2026" / "golden.pt", weights_only=True)
    (ckpt / "nanochat_config.json").write_text(json.dumps({"generation": "2026-03-02"}))
    lm = load_model(str(ckpt), opts())
    assert lm.model.config.softcap == 20.0
    with torch.no_grad():
        out = lm.model(g["ids"][None], lm.model.new_cache(192))[0]
    assert (out - g["logits"]).abs().max().item() > 1e-2
    (ckpt / "nanochat_config.json").write_text(json.dumps({"softcap": 15, "window_pattern": "L"}))
    assert load_model(str(ckpt), opts()).model.window_lefts == [128] * 4
    (ckpt / "nanochat_config.json").write_text(json.dumps({"rope_theta": 1}))
    assert "nanochat_config.json: unknown field 'rope_theta'" in error_of(str(ckpt))
    (ckpt / "nanochat_config.json").write_text(json.dumps({"qk_scale": "big"}))
    assert "qk_scale should be float" in error_of(str(ckpt))
    (ckpt / "nanochat_config.json").write_text(json.dumps({"window_pattern": "SXL"}))
    assert "window_pattern" in error_of(str(ckpt))
    (ckpt / "nanochat_config.json").write_text('{"softcap": NaN}')  # Python's json takes NaN
    assert "softcap must be a positive number, not nan" in error_of(str(ckpt))
    (ckpt / "nanochat_config.json").unlink()
    edit_meta(ckpt, 650, sequence_len=-100)
    assert "sequence_len must be positive" in error_of(str(ckpt))


def test_bf16_stored_weights_load(tmp_path):
    """Checkpoints trained on GPUs hold bf16 embeddings next to fp32 matrices."""
    ckpt = copy_fixture("head", tmp_path / "d4")
    state = torch.load(ckpt / "model_000420.pt", weights_only=True)
    state = {k: v.bfloat16() if "wte" in k or "value_embeds" in k else v for k, v in state.items()}
    torch.save(state, ckpt / "model_000420.pt")
    lm = load_model(str(ckpt), opts())
    assert lm.model.transformer.wte.weight.dtype == torch.float32


def test_missing_directory_and_steps(tmp_path):
    assert "not found" in error_of(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "model_final.pt").write_bytes(b"")
    assert "no model_NNNNNN.pt" in error_of(str(tmp_path / "empty"))
