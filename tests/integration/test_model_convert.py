"""`memrl model convert`: real verl FSDP2 shards (gloo ranks) and a real DCP directory with Megatron-core
names, converted and loaded back with transformers; every tensor and the logits must equal the original's
exactly. Also: refusals (planted pickles), auto-detection, and the weightless huggingface/ folder error."""

from __future__ import annotations

import io
import json
import pickle
from pathlib import Path

import pytest
import torch
from doubles import make_model, megatron_state, write_dcp

from memrl.cli import main

IDS = torch.tensor([[5, 17, 300, 2048, 9, 4000, 77, 1]])


def assert_same_model(original: Path, converted: Path) -> None:
    from transformers import AutoModelForCausalLM

    a = AutoModelForCausalLM.from_pretrained(original, dtype=torch.float32).eval()
    b = AutoModelForCausalLM.from_pretrained(converted).eval()
    sa, sb = a.state_dict(), b.state_dict()
    assert sorted(sa) == sorted(sb)
    for k in sa:
        assert sb[k].dtype == torch.float32, k
        assert torch.equal(sa[k], sb[k]), k
    with torch.no_grad():
        assert torch.equal(a(IDS).logits, b(IDS).logits)
    assert (converted / "tokenizer.json").is_file() and (converted / "tokenizer_config.json").is_file()


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("qwen2"), "qwen2")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory) -> Path:
    return make_model(tmp_path_factory.mktemp("qwen3"), "qwen3")


# ------------------------------------------------------------------------------------------ verl
@pytest.mark.parametrize("world, replicas, version", [(2, 1, 2), (1, 1, 2), (4, 2, 2), (2, 1, 1)],
                         ids=["fsdp2", "fsdp2-1rank", "hsdp2x2", "fsdp1"])
def test_verl_fsdp_checkpoint_converts_exactly(world, replicas, version, qwen2, tmp_path, capsys):
    from doubles import save_verl_fsdp_checkpoint

    step = tmp_path / "global_step_7"
    actor = Path(save_verl_fsdp_checkpoint(str(qwen2), str(step), world, replicas, version))
    shard = torch.load(actor / f"model_world_size_{world}_rank_0.pt", weights_only=False)
    gate = shard["model.layers.0.mlp.gate_proj.weight"]
    # What verl's manager writes: DTensor shards, Shard(0) (HSDP: replicated over "ddp" first); 71 rows over
    # 2 shards = 36 + 35 (torch.chunk sizes).
    placements = "(Shard(dim=0),)" if replicas == 1 else "(Replicate(), Shard(dim=0))"
    assert type(gate).__name__ == "DTensor" and str(gate.placements) == placements
    assert gate._local_tensor.shape[0] == (71 if world == 1 else 36)
    assert not any(p.name.endswith(".safetensors") for p in (actor / "huggingface").iterdir())

    out = tmp_path / "hf"
    # SRC = the global_step dir, format detected
    assert main(["model", "convert", str(step), "--out", str(out)]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith(f"converted verl checkpoint, world size {world} to {out}: ")
    assert_same_model(qwen2, out)


def test_a_symlink_leaving_the_checkpoint_is_not_copied(qwen2, tmp_path, capsys):
    """Issue 49: huggingface/secret -> a file outside the checkpoint would be copied into the model."""
    from doubles import save_verl_fsdp_checkpoint

    step = tmp_path / "global_step_1"
    actor = Path(save_verl_fsdp_checkpoint(str(qwen2), str(step), 1))
    secret = tmp_path / "secret.txt"
    secret.write_text("api_key=sk-do-not-leak", encoding="utf-8")
    link = actor / "huggingface" / "notes.txt"
    link.symlink_to(secret)
    out = tmp_path / "hf"
    assert main(["model", "convert", str(step), "--out", str(out)]) == 1
    assert capsys.readouterr().err.strip() == (
        f"memrl model: error: {link} is a symlink to {secret}, outside the checkpoint {step}; refusing to copy it "
        "into the model (replace the link by the file, or pass --hf-config DIR)")
    assert not (out / "notes.txt").exists()
    link.unlink()
    link.symlink_to(actor / "huggingface" / "config.json")  # inside the checkpoint: copied as a file
    assert main(["model", "convert", str(step), "--out", str(out)]) == 0
    assert (out / "notes.txt").is_file() and not (out / "notes.txt").is_symlink()


def test_verl_actor_dir_and_dtype_switch(qwen3, tmp_path, capsys):
    """SRC = the actor dir, --from given; --dtype bfloat16 (the published merger's dtype) casts every tensor."""
    from doubles import save_verl_fsdp_checkpoint
    from transformers import AutoModelForCausalLM

    actor = Path(save_verl_fsdp_checkpoint(str(qwen3), str(tmp_path / "global_step_1"), 2))
    out = tmp_path / "hf"
    assert main(["model", "convert", "--from", "verl", str(actor), "--out", str(out)]) == 0
    assert_same_model(qwen3, out)
    bf = tmp_path / "bf16"
    assert main(["model", "convert", str(actor), "--out", str(bf), "--dtype", "bfloat16"]) == 0
    assert "bfloat16" in capsys.readouterr().out
    a = AutoModelForCausalLM.from_pretrained(qwen3, dtype=torch.float32).state_dict()
    b = AutoModelForCausalLM.from_pretrained(bf, dtype="auto").state_dict()
    assert all(b[k].dtype == torch.bfloat16 and torch.equal(b[k], a[k].to(torch.bfloat16)) for k in a)
    assert json.loads((bf / "config.json").read_text())["dtype"] == "bfloat16"


def legacy_paths(pt: Path) -> None:
    """Rewrite a torch.save file's class references to torch < 2.5 module paths (torch.distributed._tensor),
    as files written by older verl installs name them."""
    import zipfile

    old = {b"ctorch.distributed.tensor\nDTensor\n": b"ctorch.distributed._tensor.api\nDTensor\n",
           b"ctorch.distributed.tensor.placement_types\nShard\n": b"ctorch.distributed._tensor.placement_types\nShard\n"}
    buf = io.BytesIO()
    with zipfile.ZipFile(pt) as zin, zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("data.pkl"):
                for a, b in old.items():
                    assert a in data
                    data = data.replace(a, b)
            zout.writestr(item, data)
    pt.write_bytes(buf.getvalue())


def test_verl_legacy_paths_planted_pickle_and_missing_rank(qwen2, tmp_path, capsys):
    from doubles import save_verl_fsdp_checkpoint

    actor = Path(save_verl_fsdp_checkpoint(str(qwen2), str(tmp_path / "global_step_1"), 2))
    for r in (0, 1):
        legacy_paths(actor / f"model_world_size_2_rank_{r}.pt")
    assert main(["model", "convert", str(actor), "--out", str(tmp_path / "legacy")]) == 0
    assert_same_model(qwen2, tmp_path / "legacy")
    capsys.readouterr()
    (actor / "model_world_size_2_rank_1.pt").unlink()
    assert main(["model", "convert", str(actor), "--out", str(tmp_path / "a")]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"memrl model: error: {actor}: model_world_size_2_rank_1.pt is missing "
                   "(1 of 2 rank files present)")
    assert not (tmp_path / "a").exists()  # nothing half-written left behind
    torch.save({"w": torch.zeros(2), "planted": io.StringIO("x")}, actor / "model_world_size_2_rank_1.pt")
    assert main(["model", "convert", str(actor), "--out", str(tmp_path / "b")]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"memrl model: error: {actor}/model_world_size_2_rank_1.pt: refused, it holds objects "
                          "other than tensors") and "_io.StringIO" in err and len(err.splitlines()) == 1


# ------------------------------------------------------------------------------------------ Megatron
@pytest.mark.parametrize("arch, stacked", [("qwen2", True), ("qwen3", False)])
def test_megatron_torch_dist_converts_exactly(arch, stacked, qwen2, qwen3, tmp_path, capsys):
    model = qwen2 if arch == "qwen2" else qwen3
    it = write_dcp(megatron_state(model, stacked, pad_vocab=128), tmp_path / "iter_0000010")
    out = tmp_path / "hf"
    # --from detected from the .metadata file
    assert main(["model", "convert", str(it), "--out", str(out), "--hf-config", str(model)]) == 0
    assert capsys.readouterr().out.startswith(f"converted megatron checkpoint to {out}: ")
    assert_same_model(model, out)


def test_megatron_mcore_metadata_is_read_and_planted_metadata_refused(qwen2, tmp_path, capsys):
    """Megatron's .metadata root is megatron.core...MCoreMetadata (a DCP Metadata with mcore_data): it is
    admitted by name without importing Megatron; a pickle naming any other class is refused unrun."""
    import sys
    import types
    from dataclasses import dataclass

    from torch.distributed.checkpoint.metadata import Metadata

    it = write_dcp(megatron_state(qwen2, True, pad_vocab=0), tmp_path / "iter_0000001")
    md = pickle.loads((it / ".metadata").read_bytes())
    name = "megatron.core.dist_checkpointing.strategies.torch"
    mod = types.ModuleType(name)

    @dataclass
    class MCoreMetadata(Metadata):
        mcore_data: dict | None = None

    MCoreMetadata.__module__, MCoreMetadata.__qualname__ = name, "MCoreMetadata"
    mod.MCoreMetadata = MCoreMetadata
    parts = name.split(".")
    fake = {".".join(parts[:i]): types.ModuleType(".".join(parts[:i])) for i in range(1, len(parts))}
    fake[name] = mod
    sys.modules.update(fake)  # pickle checks the class is importable by its name
    try:
        data = pickle.dumps(MCoreMetadata(**vars(md), mcore_data={"k": {"shape": (1, 2)}}))
    finally:
        for k in fake:
            del sys.modules[k]
    (it / ".metadata").write_bytes(data)
    assert main(["model", "convert", "--from", "megatron", str(it), "--out", str(tmp_path / "a"),
                 "--hf-config", str(qwen2)]) == 0
    assert_same_model(qwen2, tmp_path / "a")
    capsys.readouterr()

    (it / ".metadata").write_bytes(b"cos\nsystem\n(S'touch " + str(tmp_path / "pwned").encode() + b"'\ntR.")
    assert main(["model", "convert", str(it), "--out", str(tmp_path / "b"), "--hf-config", str(qwen2)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"memrl model: error: {it}/.metadata: not readable DCP metadata "
                   "(UnpicklingError: os.system is not part of DCP metadata)")
    assert not (tmp_path / "pwned").exists()


def test_megatron_needs_hf_config_and_names_wrong_shapes(qwen2, qwen3, tmp_path, capsys):
    it = write_dcp(megatron_state(qwen2, True, pad_vocab=0), tmp_path / "iter_0000002")
    assert main(["model", "convert", str(it), "--out", str(tmp_path / "a")]) == 1
    assert "--from megatron needs --hf-config DIR" in capsys.readouterr().err
    # Qwen3's config (head_dim 8) against Qwen2's fused qkv (head_dim 6): 2 groups x (3 + 2) heads x 6 = 60
    # rows stored, 2 x 5 x 8 = 80 expected; found in the declared shapes, before any tensor is read.
    assert main(["model", "convert", str(it), "--out", str(tmp_path / "b"), "--hf-config", str(qwen3)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"memrl model: error: {it}: decoder.layers.self_attention.linear_qkv.weight: declared shape "
                   "(2, 60, 36), the config gives (2, 80, 36) (num_hidden_layers 2 stacked; 2 query groups x (3 q + "
                   "1 k + 1 v heads) x head_dim 8 = 80 rows)")


def test_unknown_source_is_one_line(tmp_path, capsys):
    (tmp_path / "x").mkdir()
    assert main(["model", "convert", str(tmp_path / "x"), "--out", str(tmp_path / "o")]) == 1
    assert capsys.readouterr().err.startswith(f"memrl model: error: cannot tell the checkpoint format of {tmp_path / 'x'}")


# ------------------------------------------------------------------------------------------ weightless folder
def test_weightless_huggingface_folder_names_the_convert_command(qwen2, tmp_path, capsys):
    from doubles import save_verl_fsdp_checkpoint

    step = tmp_path / "global_step_3"
    actor = Path(save_verl_fsdp_checkpoint(str(qwen2), str(step), 1))
    hf = actor / "huggingface"
    data = tmp_path / "eval_1.json"
    data.write_text(json.dumps([{"input": "q?", "answers": ["a"], "context": "c", "index": 0, "num_docs": 1}]))
    want = (f"{hf} holds a config and tokenizer but no weights: it is the huggingface/ folder of a verl "
            f"checkpoint; convert it first: memrl model convert --from verl {actor} --out {step / 'hf'}")
    assert main(["eval", str(data), "--out", str(tmp_path / "ev"), "--model", str(hf), "--no-progress"]) == 1
    assert capsys.readouterr().err.strip() == f"memrl eval: error: --model={hf}: {want}"
    assert main(["train", f"model.path={hf}", f"out_dir={tmp_path / 'run'}"]) == 1
    assert capsys.readouterr().err.strip() == f"memrl train: error: model.path={hf}: {want}"
    # ... and the command it names works
    assert main(["model", "convert", "--from", "verl", str(actor), "--out", str(step / "hf")]) == 0
    assert_same_model(qwen2, step / "hf")
