"""The family registry (model/families/registry.py): one entry a family, read by the decode step and the identity."""

import types
from pathlib import Path

import torch

from model.decode.graph_config import GraphConfig
from model.decode.steps import build_step
from model.decode.torch_step import TorchStep
from model.families.registry import FAMILIES, backend_family, family_of, for_architectures
from model.loading import LoadOptions, load_model

FIX = Path(__file__).parent / "fixtures" / "nanochat"


def nanochat():
    return load_model(str(FIX / "head"), LoadOptions(tokenizer=str(FIX / "tokenizer" / "tokenizer.pkl"))).model


def test_each_model_finds_its_family_and_its_step():
    llama, nano = load_model("random:tiny").model, nanochat()
    assert (family_of(llama).name, family_of(nano).name) == ("llama", "nanochat")
    assert isinstance(build_step(llama, llama.new_cache(32), GraphConfig(fused=False)), TorchStep)
    assert isinstance(build_step(nano, nano.new_cache(32), GraphConfig(fused=False)), TorchStep)
    assert family_of(torch.nn.Linear(2, 2)) is None
    assert build_step(torch.nn.Linear(2, 2), llama.new_cache(32), GraphConfig()) is None


def test_backend_family_keeps_the_strings_snapshots_are_keyed_by():
    """'<device>/<flash backend or sdpa>', as chatapp/fingerprint.py has always written it."""
    for model in (load_model("random:tiny").model, nanochat(), torch.nn.Linear(2, 2)):
        assert backend_family(model) == "cpu/sdpa"
    flash = load_model("random:tiny").model
    flash.attn = types.SimpleNamespace(flash=types.SimpleNamespace(name="fa3"))
    assert backend_family(flash) == "cpu/fa3"


def test_hugging_face_architectures_name_one_family():
    assert for_architectures({"MistralForCausalLM"}) is FAMILIES["llama"]
    assert for_architectures({"Qwen2ForCausalLM"}) is FAMILIES["qwen2"]
    assert for_architectures({"Qwen3ForCausalLM"}) is FAMILIES["qwen3"]
    assert for_architectures({"GPT2LMHeadModel"}) is None
