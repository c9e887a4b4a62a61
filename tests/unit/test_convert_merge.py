"""memrl.models.convert pieces that need no processes: merging plain (non-DTensor) per-rank tensors, the
Megatron fused-qkv split on hand-built rows, and format detection."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from memrl.models.convert import detect_format, merge_fsdp_shards
from memrl.models.convert_megatron import megatron_layer_to_hf
from memrl.models.errors import ConvertError

FILES = [Path("/ckpt/actor/model_world_size_2_rank_0.pt"), Path("/ckpt/actor/model_world_size_2_rank_1.pt")]


def test_plain_tensors_replicated_or_dim0_shards_by_the_expected_shape() -> None:
    norm = torch.arange(4.0)
    emb = torch.arange(12.0).reshape(6, 2)
    states = [{"model.norm.weight": norm, "model.embed_tokens.weight": emb[:3]},
              {"model.norm.weight": norm.clone(), "model.embed_tokens.weight": emb[3:]}]
    out = merge_fsdp_shards(states, FILES, {"model.norm.weight": (4,), "model.embed_tokens.weight": (6, 2)})
    assert torch.equal(out["model.norm.weight"], norm)  # full shape on every rank: replicated, kept once
    assert torch.equal(out["model.embed_tokens.weight"], emb)  # [3, 2] + [3, 2] rows in rank order
    states[1]["model.norm.weight"] = norm + 1
    with pytest.raises(ConvertError, match="model.norm.weight: a replicated plain tensor that differs between "
                                           "rank 0 and rank 1"):
        merge_fsdp_shards(states, FILES, {"model.norm.weight": (4,)})


def test_names_must_agree_across_ranks_and_wrappers_are_stripped() -> None:
    t = torch.ones(2)
    out = merge_fsdp_shards([{"_fsdp_wrapped_module.model.norm.weight": t}], FILES[:1])
    assert list(out) == ["model.norm.weight"]
    with pytest.raises(ConvertError, match=r"rank_1.pt: its tensor names differ from rank 0's \(b\)"):
        merge_fsdp_shards([{"a": t}, {"a": t, "b": t}], FILES)


def test_qkv_rows_grouped_by_query_group() -> None:
    """4 heads, 2 query groups (2 q heads each), head_dim 1, hidden 1: Megatron's rows are
    [q0, q1, k0, v0, q2, q3, k1, v1]; rows numbered 0..7 split into q = [0, 1, 4, 5], k = [2, 6], v = [3, 7]."""
    class Cfg:
        num_attention_heads, num_key_value_heads, head_dim, hidden_size = 4, 2, 1, 1

    fused = torch.arange(8.0).reshape(8, 1)
    got = dict(megatron_layer_to_hf("self_attention.linear_qkv.weight", fused, Cfg, "w"))
    assert got["self_attn.q_proj.weight"].flatten().tolist() == [0, 1, 4, 5]
    assert got["self_attn.k_proj.weight"].flatten().tolist() == [2, 6]
    assert got["self_attn.v_proj.weight"].flatten().tolist() == [3, 7]
    gate, up = (dict(megatron_layer_to_hf("mlp.linear_fc1.weight", torch.arange(4.0).reshape(4, 1), Cfg, "w"))[k]
                for k in ("mlp.gate_proj.weight", "mlp.up_proj.weight"))
    assert gate.flatten().tolist() == [0, 1] and up.flatten().tolist() == [2, 3]


def test_detect_format(tmp_path: Path) -> None:
    (tmp_path / "step" / "actor").mkdir(parents=True)
    (tmp_path / "step" / "actor" / "model_world_size_1_rank_0.pt").write_bytes(b"")
    (tmp_path / "iter_0000005").mkdir()
    (tmp_path / "iter_0000005" / ".metadata").write_bytes(b"")
    assert detect_format(tmp_path / "step") == "verl" and detect_format(tmp_path / "step" / "actor") == "verl"
    assert detect_format(tmp_path / "iter_0000005") == "megatron"
    with pytest.raises(ConvertError, match="holds Megatron checkpoints iter_0000005: give one iter_\\* directory"):
        detect_format(tmp_path)


def test_weightless_dir_fails_at_model_dir_and_build_engine(tmp_path: Path) -> None:
    from memrl.engines import EngineConfig, build_engine
    from memrl.errors import UserError, model_dir

    cfg_only = tmp_path / "m"
    cfg_only.mkdir()
    (cfg_only / "config.json").write_text("{}")
    hint = (f"{cfg_only} has config.json but no weights (*.safetensors or pytorch_model*.bin); a verl or Megatron "
            "checkpoint converts with: memrl model convert --from verl|megatron SRC --out DIR")
    with pytest.raises(UserError) as e:
        model_dir(str(cfg_only), "model.path")
    assert str(e.value) == f"model.path={cfg_only}: {hint}"
    for kind in ("hf", "vllm"):
        with pytest.raises(UserError) as e:
            build_engine(EngineConfig(name=kind, model=str(cfg_only)))
        assert str(e.value) == f"engine.model={cfg_only}: {hint}"
    (cfg_only / "model.safetensors").write_bytes(b"")
    with pytest.raises(UserError) as e:  # with a weight file the folder goes on to the full check (a bad config)
        model_dir(str(cfg_only), "model.path")
    assert "no weights" not in str(e.value) and 'config.json has no "model_type"' in str(e.value)
