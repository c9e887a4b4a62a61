"""Reading Megatron torch_dist checkpoints for `memrl model convert --from megatron` (memrl.models.convert).

Megatron torch_dist (slime / vime; slime's tools/convert_torch_dist_to_hf.py): SRC is one `iter_*`
directory written by Megatron-core's dist checkpointing through torch.distributed.checkpoint (DCP):
`.metadata` + `*.distcp`. DCP reassembles tensor-parallel shards into global tensors; decoder weights
are either stacked (`decoder.layers.<name>`, leading axis = layer) or per layer
(`decoder.layers.<i>.<name>`). Qwen2 / Qwen3 dense names (--hf-config gives the HF config: heads,
query groups, head_dim, vocab size):
  embedding.word_embeddings.weight            -> model.embed_tokens.weight (vocab padding rows cut)
  output_layer.weight                         -> lm_head.weight (absent when tied)
  decoder.final_layernorm.weight              -> model.norm.weight
  self_attention.linear_qkv.weight / .bias    -> q/k/v_proj: rows grouped by query group g =
      [q heads of g (heads/groups x head_dim rows), k head g, v head g], groups in order
  self_attention.linear_proj.weight           -> self_attn.o_proj.weight
  self_attention.linear_qkv.layer_norm_weight -> input_layernorm.weight (also input_layernorm.weight)
  mlp.linear_fc1.weight                       -> [gate_proj; up_proj] (first half gate)
  mlp.linear_fc1.layer_norm_weight            -> post_attention_layernorm.weight (also pre_mlp_layernorm)
  mlp.linear_fc2.weight                       -> mlp.down_proj.weight
  self_attention.q_layernorm / k_layernorm    -> self_attn.q_norm / k_norm (Qwen3)
Other entries (optimizer state, RNG, Transformer Engine `_extra_state`, any non-tensor) are not read.
Safety: `.metadata` is unpickled by an allowlist (DCP's metadata classes, BytesStorageMetadata, and
Megatron's MCoreMetadata read as plain DCP Metadata); tensor data is read by DCP's FileSystemReader with
torch.load(weights_only=True); byte entries (which DCP would unpickle freely) and `common.pt` (Megatron's
pickled args) are never read.
"""

from __future__ import annotations

import pickle
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    Metadata,
    MetadataIndex,
    StorageMeta,
    TensorStorageMetadata,
)

from memrl.dcp_metadata import DCP_METADATA_CLASSES
from memrl.models.errors import ConvertError, why


def _metadata_classes() -> dict[tuple[str, str], Any]:
    class MCoreMetadata(Metadata):
        """Megatron-core's Metadata subclass (an extra `mcore_data` dict of plain data), read as DCP's."""

    allowed: dict[tuple[str, str], Any] = {k: None for k in DCP_METADATA_CLASSES}
    allowed[("torch.distributed.checkpoint.metadata", "BytesStorageMetadata")] = BytesStorageMetadata
    allowed[("megatron.core.dist_checkpointing.strategies.torch", "MCoreMetadata")] = MCoreMetadata
    return allowed


class _MegatronMetadataUnpickler(pickle.Unpickler):
    """DCP metadata classes, torch dtypes and Megatron's MCoreMetadata; anything else is refused."""

    allowed: dict[tuple[str, str], Any] = {}

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in self.allowed:
            cls = self.allowed[(module, name)]
            return cls if cls is not None else super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"{module}.{name} is not part of DCP metadata")


def read_megatron_metadata(src: Path) -> Any:
    f = src / ".metadata"
    if not f.is_file():
        raise ConvertError(f"{f} is missing (expected a Megatron torch_dist iter_* directory)")
    _MegatronMetadataUnpickler.allowed = _metadata_classes()
    try:
        with f.open("rb") as fh:
            md = _MegatronMetadataUnpickler(fh).load()
    except Exception as e:  # noqa: BLE001 - truncated: EOFError; planted objects: UnpicklingError
        raise ConvertError(f"{f}: not readable DCP metadata ({type(e).__name__}: {e})") from e
    if not isinstance(md, Metadata) or not isinstance(getattr(md, "state_dict_metadata", None), dict):
        raise ConvertError(f"{f}: not DCP metadata")
    return md


def _model_keys(md: Any) -> list[str]:
    return [k for k, v in md.state_dict_metadata.items()
            if isinstance(v, TensorStorageMetadata) and k.startswith(("embedding.", "decoder.", "output_layer."))
            and "_extra_state" not in k]


VOCAB_PADDING_MAX = 65536
"""Most rows Megatron's vocabulary padding may add (it pads to a multiple of make_vocab_size_divisible_by x TP)."""


def megatron_layer_shapes(config: Any) -> dict[str, tuple[tuple[int, ...], str]]:
    """{Megatron per-layer name: (shape the config gives, how)} for Qwen2 / Qwen3 dense layers."""
    try:
        hidden, heads = int(config.hidden_size), int(config.num_attention_heads)
        groups = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or hidden // heads)
        inter = int(config.intermediate_size)
    except (AttributeError, TypeError, ValueError, ZeroDivisionError) as e:
        raise ConvertError(f"--hf-config: the config lacks a dense decoder's sizes ({e})") from e
    if heads % groups:
        raise ConvertError(f"--hf-config: {heads} attention heads do not divide into {groups} query groups")
    per = heads // groups
    qkv = groups * (per + 2) * head_dim
    how = f"{groups} query groups x ({per} q + 1 k + 1 v heads) x head_dim {head_dim} = {qkv} rows"
    norm = ((hidden,), "hidden_size")
    return {
        "self_attention.linear_qkv.weight": ((qkv, hidden), how),
        "self_attention.linear_qkv.bias": ((qkv,), how),
        "self_attention.linear_proj.weight": ((hidden, heads * head_dim), f"hidden_size x {heads} heads x head_dim"),
        "self_attention.linear_qkv.layer_norm_weight": norm,
        "input_layernorm.weight": norm,
        "mlp.linear_fc1.layer_norm_weight": norm,
        "pre_mlp_layernorm.weight": norm,
        "mlp.linear_fc1.weight": ((2 * inter, hidden), "gate and up: 2 x intermediate_size rows"),
        "mlp.linear_fc2.weight": ((hidden, inter), "hidden_size x intermediate_size"),
        "self_attention.q_layernorm.weight": ((head_dim,), "head_dim"),
        "self_attention.k_layernorm.weight": ((head_dim,), "head_dim"),
    }


def check_declared_shapes(md: Any, keys: list[str], config: Any, src: Path) -> None:
    """Every model tensor the metadata declares has the shape the HF config gives (vocabulary rows: the
    config's vocab_size plus Megatron's padding), before anything is allocated."""
    per_layer = megatron_layer_shapes(config)
    layers, vocab, hidden = int(config.num_hidden_layers), int(config.vocab_size), int(config.hidden_size)
    for k in keys:
        size = tuple(int(x) for x in md.state_dict_metadata[k].size)
        where = f"{src}: {k}"
        if k in ("embedding.word_embeddings.weight", "output_layer.weight"):
            if len(size) != 2 or size[1] != hidden or not vocab <= size[0] < vocab + VOCAB_PADDING_MAX:
                raise ConvertError(f"{where}: declared shape {size}, the config gives ({vocab} vocab_size + "
                                   f"< {VOCAB_PADDING_MAX} padding rows, {hidden})")
            continue
        if k == "decoder.final_layernorm.weight":
            want, how = (hidden,), "hidden_size"
        elif k.startswith("decoder.layers."):
            rest = k[len("decoder.layers."):]
            head, _, tail = rest.partition(".")
            if head.isdigit():
                if int(head) >= layers:
                    raise ConvertError(f"{where}: layer {head}, but the config has {layers} layers")
                rest, lead = tail, ()
            else:
                lead = (layers,)
            if rest not in per_layer:
                raise ConvertError(f"{where}: unknown Megatron weight name (Qwen2/Qwen3 dense names are supported)")
            shape, how = per_layer[rest]
            want = lead + shape
            if lead:
                how = f"num_hidden_layers {layers} stacked; {how}"
        else:
            raise ConvertError(f"{where}: unknown Megatron weight name (Qwen2/Qwen3 dense names are supported)")
        if size != want:
            raise ConvertError(f"{where}: declared shape {size}, the config gives {want} ({how})")


def check_declared_storage(md: Any, keys: list[str], src: Path) -> None:
    """Each declared tensor's chunks tile its shape, and each chunk's bytes lie in a .distcp file that
    exists and is long enough: what is then allocated is bounded by the files' sizes."""
    sizes: dict[str, int | None] = {}
    sdm = md.state_dict_metadata
    for k in keys:
        tm = sdm[k]
        shape = tuple(int(x) for x in tm.size)
        itemsize = torch.empty((), dtype=tm.properties.dtype).element_size()
        covered = 0
        for i, ch in enumerate(tm.chunks):
            offs, lens = tuple(int(x) for x in ch.offsets), tuple(int(x) for x in ch.sizes)
            if len(offs) != len(shape) or len(lens) != len(shape) or any(
                    o < 0 or n < 0 or o + n > d for o, n, d in zip(offs, lens, shape, strict=True)):
                raise ConvertError(f"{src / '.metadata'}: {k}: chunk {i} (offsets {offs}, sizes {lens}) lies outside "
                                   f"the declared shape {shape}")
            numel = 1
            for n in lens:
                numel *= n
            covered += numel
            info = md.storage_data.get(MetadataIndex(k, ch.offsets))
            if info is None:
                raise ConvertError(f"{src / '.metadata'}: {k}: chunk {i} has no storage record")
            rel = str(info.relative_path)
            if rel not in sizes:
                f = src / rel
                sizes[rel] = f.stat().st_size if f.is_file() else None
            if sizes[rel] is None:
                n_in = sum(1 for v in md.storage_data.values() if str(v.relative_path) == rel)
                raise ConvertError(f"{src / rel} is missing (a shard of this checkpoint: the metadata places {n_in} "
                                   f"entries in it, e.g. {k})")
            end = int(info.offset) + int(info.length)
            if end > sizes[rel]:
                raise ConvertError(f"{src / rel}: cut short: {sizes[rel]} bytes, but the metadata places {k} at bytes "
                                   f"{int(info.offset)}..{end}")
            if numel * itemsize > int(info.length):
                raise ConvertError(f"{src / '.metadata'}: {k}: chunk {i} declares {numel * itemsize} bytes "
                                   f"({lens} x {tm.properties.dtype}), but its record in {rel} holds {int(info.length)}")
        total = 1
        for d in shape:
            total *= d
        if covered != total:
            raise ConvertError(f"{src / '.metadata'}: {k}: declared shape {shape} has {total} elements, its chunks "
                               f"hold {covered}")


def _checkpoint_failure(e: BaseException) -> str:
    """_why of the error under a DCP CheckpointException (whose own text is a traceback)."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        e = next((x for x in first if isinstance(x, BaseException)), e) if isinstance(first, tuple) else first
    text = str(e)
    if "WeightsUnpickler error:" in text:  # torch.load's advice paragraphs around the actual reason
        reason = next((ln.strip() for ln in text.split("WeightsUnpickler error:", 1)[1].splitlines() if ln.strip()), "")
        return f"{type(e).__name__}: {reason}"
    return why(e)


def read_dcp_tensors(src: Path, config: Any = None) -> dict[str, torch.Tensor]:
    """The model tensors of a Megatron torch_dist directory (global, TP shards joined by DCP); the declared
    shapes are checked against `config` (when given) and the files' sizes first."""
    md = read_megatron_metadata(src)
    keys = _model_keys(md)
    if not keys:
        raise ConvertError(f"{src / '.metadata'}: no model tensors (embedding.*, decoder.*, output_layer.*)")
    if config is not None:
        check_declared_shapes(md, keys, config, src)
    check_declared_storage(md, keys, src)
    sdm = md.state_dict_metadata
    flat = {k: torch.empty(tuple(sdm[k].size), dtype=sdm[k].properties.dtype) for k in keys}

    class Reader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            if getattr(md, "storage_meta", None) is None:
                md.storage_meta = StorageMeta()
            md.storage_meta.load_id = self.load_id
            if getattr(md, "planner_data", None) is None:
                md.planner_data = {}
            return md

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(flat, storage_reader=Reader(src), no_dist=True)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - damaged .distcp data surfaces in many types
        raise ConvertError(f"{src}: cannot read the tensor data, a damaged .distcp file? "
                           f"({_checkpoint_failure(e)})") from e
    return flat


def _qkv_split(t: torch.Tensor, groups: int, per_group: int, head_dim: int, where: str) -> list[torch.Tensor]:
    rows = groups * (per_group + 2) * head_dim
    if t.shape[0] != rows:
        raise ConvertError(f"{where}: {t.shape[0]} rows, expected {groups} query groups x ({per_group} q + 1 k "
                           f"+ 1 v heads) x head_dim {head_dim} = {rows}")
    g = t.reshape(groups, per_group + 2, head_dim, *t.shape[1:])
    rest = tuple(t.shape[1:])
    return [g[:, :per_group].reshape(groups * per_group * head_dim, *rest),
            g[:, per_group].reshape(groups * head_dim, *rest),
            g[:, per_group + 1].reshape(groups * head_dim, *rest)]


_LAYER_NAMES = {
    "self_attention.linear_proj.weight": ["self_attn.o_proj.weight"],
    "self_attention.linear_qkv.layer_norm_weight": ["input_layernorm.weight"],
    "input_layernorm.weight": ["input_layernorm.weight"],
    "mlp.linear_fc1.layer_norm_weight": ["post_attention_layernorm.weight"],
    "pre_mlp_layernorm.weight": ["post_attention_layernorm.weight"],
    "mlp.linear_fc2.weight": ["mlp.down_proj.weight"],
    "self_attention.q_layernorm.weight": ["self_attn.q_norm.weight"],
    "self_attention.k_layernorm.weight": ["self_attn.k_norm.weight"],
}


def megatron_layer_to_hf(rest: str, t: torch.Tensor, config: Any, where: str) -> list[tuple[str, torch.Tensor]]:
    """One decoder layer's Megatron tensor -> (HF name below model.layers.<i>., tensor) pairs."""
    heads = int(config.num_attention_heads)
    groups = int(getattr(config, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // heads)
    if rest in ("self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias"):
        if heads % groups:
            raise ConvertError(f"{where}: {heads} attention heads do not divide into {groups} query groups")
        kind = rest.rsplit(".", 1)[1]
        q, k, v = _qkv_split(t, groups, heads // groups, head_dim, where)
        return [(f"self_attn.{n}_proj.{kind}", x) for n, x in zip("qkv", (q, k, v), strict=True)]
    if rest == "mlp.linear_fc1.weight":
        if t.shape[0] % 2:
            raise ConvertError(f"{where}: {t.shape[0]} rows cannot be split into gate and up halves")
        gate, up = t.chunk(2, dim=0)
        return [("mlp.gate_proj.weight", gate), ("mlp.up_proj.weight", up)]
    if rest in _LAYER_NAMES:
        return [(n, t) for n in _LAYER_NAMES[rest]]
    raise ConvertError(f"{where}: unknown Megatron weight name (Qwen2/Qwen3 dense names are supported)")


def _vocab_cut(t: torch.Tensor, vocab: int, where: str) -> torch.Tensor:
    """Megatron pads the vocabulary to a multiple of its divisor; the HF model has config.vocab_size rows."""
    if t.shape[0] < vocab:
        raise ConvertError(f"{where}: {t.shape[0]} rows, fewer than the config's vocab_size {vocab}")
    return t[:vocab]


def megatron_to_hf(tensors: dict[str, torch.Tensor], config: Any, src: Path) -> dict[str, torch.Tensor]:
    """Megatron-core GPT names (Qwen2/Qwen3 dense) -> HuggingFace Qwen2/Qwen3 names."""
    layers = int(config.num_hidden_layers)
    vocab = int(config.vocab_size)
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        where = f"{src}: {name}"
        if name == "embedding.word_embeddings.weight":
            out["model.embed_tokens.weight"] = _vocab_cut(t, vocab, where)
        elif name == "output_layer.weight":
            out["lm_head.weight"] = _vocab_cut(t, vocab, where)
        elif name == "decoder.final_layernorm.weight":
            out["model.norm.weight"] = t
        elif name.startswith("decoder.layers."):
            rest = name[len("decoder.layers."):]
            head, _, tail = rest.partition(".")
            if head.isdigit():  # per-layer keys (non-homogeneous layers)
                per_layer = [(int(head), tail, t)]
            else:  # stacked: the global layer index is the leading axis
                if t.shape[0] != layers:
                    raise ConvertError(f"{where}: leading axis {t.shape[0]}, expected num_hidden_layers {layers}")
                per_layer = [(i, rest, t[i]) for i in range(layers)]
            for i, r, x in per_layer:
                if i >= layers:
                    raise ConvertError(f"{where}: layer {i}, but the config has {layers} layers")
                for n, y in megatron_layer_to_hf(r, x, config, where):
                    out[f"model.layers.{i}.{n}"] = y.contiguous()
        else:
            raise ConvertError(f"{where}: unknown Megatron weight name (Qwen2/Qwen3 dense names are supported)")
    return out
