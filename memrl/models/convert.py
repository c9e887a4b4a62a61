"""Convert training checkpoints of other frameworks into HuggingFace model directories (safetensors).

  memrl model convert --from verl     SRC --out DST [--hf-config DIR] [--dtype keep]
  memrl model convert --from megatron SRC --out DST --hf-config DIR [--dtype keep]

verl (MemAgent, ReMemR1, MemAct: verl/utils/checkpoint/fsdp_checkpoint_manager.py). SRC is a
`global_step_N` directory or its `actor` directory: one `model_world_size_W_rank_R.pt` per rank, each
`torch.save` of the FSDP model's sharded state dict (FSDP1 SHARDED_STATE_DICT or FSDP2 `state_dict()`):
parameter name -> DTensor whose local tensor is that rank's slice under placement Shard(0) (torch.chunk
sizes, so the last ranks may hold fewer rows) on a 1-D mesh ("fsdp",) of W ranks, or (Replicate(),
Shard(0)) on an HSDP mesh ("ddp", "fsdp"). The full tensor is the local tensors of one replica group
concatenated along the shard dim in mesh order (what verl's scripts/model_merger.py does). Plain tensors
are replicated when they already have the architecture's full shape, else dim-0 shards. Config
and tokenizer come from `actor/huggingface/` (written beside the shards, without weights) or --hf-config.
Files are read with torch.load(weights_only=True): DTensor, DeviceMesh and placement types are the only
classes admitted besides tensors (torch registers them on import of torch.distributed.tensor; the older
torch.distributed._tensor module paths are admitted as aliases of the same classes).

Megatron torch_dist (slime / vime): SRC is one `iter_*` directory of torch.distributed.checkpoint files; the
name mapping and the reading rules are in memrl.models.convert_megatron.

The output holds every weight the architecture expects (checked against the config's model class),
in the stored dtype unless --dtype says otherwise, plus the source's config and tokenizer files.
Damaged input is a one-line ConvertError naming the file; DCP's declared shapes are checked against the
config and the .distcp sizes before allocating; the output is written beside --out and renamed into place.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed.tensor as dt
from safetensors.torch import save_file
from torch.distributed.tensor import DTensor
from torch.distributed.tensor import _dtensor_spec as spec
from transformers import CONFIG_MAPPING, AutoConfig, AutoModelForCausalLM

from memrl.errors import WEIGHT_FILES, disk_full, os_message
from memrl.models.convert_megatron import megatron_to_hf, read_dcp_tensors
from memrl.models.errors import ConvertError, first_sentence, why

log = logging.getLogger(__name__)

FORMATS = ("verl", "megatron")
DTYPES = {"keep": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SHARD_BYTES = 4 * 1024**3
"""Largest safetensors file written; bigger models get model-0000i-of-0000n.safetensors + an index."""
_RANK_FILE = re.compile(r"model_world_size_(\d+)_rank_(\d+)\.pt")


# ------------------------------------------------------------------------------------------ detection
def rank_files(path: Path) -> dict[int, dict[int, Path]]:
    """{world size: {rank: file}} of verl model shards directly in `path`."""
    out: dict[int, dict[int, Path]] = {}
    if path.is_dir():
        for p in path.iterdir():
            m = _RANK_FILE.fullmatch(p.name)
            if m:
                out.setdefault(int(m.group(1)), {})[int(m.group(2))] = p
    return out


def verl_actor_dir(src: Path) -> Path | None:
    """The directory holding verl's model shards: `src` itself or `src/actor` (a global_step_N dir)."""
    for cand in (src, src / "actor"):
        if rank_files(cand):
            return cand
    return None


def is_dcp_dir(src: Path) -> bool:
    return (src / ".metadata").is_file()


def detect_format(src: Path) -> str:
    """"verl" or "megatron" from what `src` holds; ConvertError when it is neither."""
    if verl_actor_dir(src) is not None:
        return "verl"
    if is_dcp_dir(src):
        return "megatron"
    iters = sorted(p.name for p in src.glob("iter_*") if p.is_dir()) if src.is_dir() else []
    if iters:
        raise ConvertError(f"{src} holds Megatron checkpoints {', '.join(iters[-3:])}: give one iter_* directory")
    raise ConvertError(f"cannot tell the checkpoint format of {src}: expected a verl actor or global_step_N "
                       "directory (model_world_size_W_rank_R.pt) or a Megatron torch_dist iter_* directory "
                       "(.metadata + *.distcp); pass --from verl|megatron")


# ------------------------------------------------------------------------------------------ verl / FSDP
_LEGACY_DTENSOR_PATHS = {
    "DTensor": "torch.distributed._tensor.api.DTensor",
    "Shard": "torch.distributed._tensor.placement_types.Shard",
    "Replicate": "torch.distributed._tensor.placement_types.Replicate",
    "Partial": "torch.distributed._tensor.placement_types.Partial",
    "DTensorSpec": "torch.distributed._tensor.placement_types.DTensorSpec",
    "TensorMeta": "torch.distributed._tensor.placement_types.TensorMeta",
}


@contextlib.contextmanager
def _dtensor_globals() -> Iterator[None]:
    """While loading: DTensor's own classes admitted (torch does that on import of torch.distributed.tensor),
    plus the pre-2.5 module paths of the same classes; and the DeviceMesh "no process group" warning off."""
    classes = {"DTensor": dt.DTensor, "Shard": dt.Shard, "Replicate": dt.Replicate, "Partial": dt.Partial,
               "DTensorSpec": spec.DTensorSpec, "TensorMeta": spec.TensorMeta}
    aliases = [(classes[name], path) for name, path in _LEGACY_DTENSOR_PATHS.items()]
    mesh_log = logging.getLogger("torch.distributed.device_mesh")
    level = mesh_log.level
    mesh_log.setLevel(logging.ERROR)
    try:
        with torch.serialization.safe_globals(aliases):
            yield
    finally:
        mesh_log.setLevel(level)


def load_rank_file(path: Path) -> dict[str, Any]:
    """One rank's state dict, read without running pickled code (tensors, DTensors and plain data only)."""
    try:
        with _dtensor_globals():
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - RuntimeError / UnpicklingError / EOFError / zip errors
        text = str(e).strip()
        if "Weights only load failed" in text or "Unsupported global" in text:
            glob = re.search(r"GLOBAL (\S+)", text)
            what = f" ({glob.group(1)})" if glob else ""
            raise ConvertError(f"{path}: refused, it holds objects other than tensors, DTensors and plain data"
                               f"{what}; a pickle that could run code") from e
        raise ConvertError(f"{path}: not a readable torch file, truncated or damaged? ({why(e)})") from e
    if not isinstance(sd, dict):
        raise ConvertError(f"{path}: expected a state dict (name -> tensor), got {type(sd).__name__}")
    return sd


def _clean_name(name: str) -> str:
    """Parameter name without wrapper prefixes (FSDP1 / activation checkpointing / torch.compile)."""
    for part in ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod."):
        name = name.replace(part, "")
    return name


def _shard_ranks(t: Any, world: int, where: str) -> tuple[list[int], Any]:
    """(ranks whose local tensors concatenate to the full tensor, in mesh order; the Shard placement) of a
    DTensor. 1-D mesh (FSDP): every rank, placement (Shard(d),). 2-D mesh (HSDP, verl's ("ddp", "fsdp")):
    the ranks of the first replica group (mesh row 0), placements (Replicate(), Shard(d))."""
    spec = t._spec
    placements = tuple(spec.placements)
    mesh = spec.mesh
    names = getattr(mesh, "mesh_dim_names", None)
    try:
        grid = mesh.mesh.tolist()
    except Exception:  # noqa: BLE001 - a mesh pickled by another torch version: a 1-D mesh is ranks 0..W-1
        grid = list(range(world)) if len(placements) == 1 else None
    if grid is None:
        raise ConvertError(f"{where}: cannot read the {len(placements)}-D device mesh {names}")
    if len(placements) == 1:
        shard, ranks = placements[0], [int(r) for r in grid]
    elif len(placements) == 2 and placements[0].is_replicate():
        shard, ranks = placements[1], [int(r) for r in grid[0]]
    else:
        raise ConvertError(f"{where}: placements {placements} on mesh {names}; supported: (Shard,) for FSDP and "
                           "(Replicate, Shard) for HSDP (tensor parallel is not)")
    flat = sorted(int(r) for r in (grid if len(placements) == 1 else [x for row in grid for x in row]))
    if flat != list(range(world)):
        raise ConvertError(f"{where}: device mesh over ranks {flat}, expected 0..{world - 1}")
    return ranks, shard


def merge_fsdp_shards(states: list[dict[str, Any]], files: list[Path],
                      shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, torch.Tensor]:
    """Full tensors from per-rank sharded state dicts (index = rank). DTensors: local tensors concatenated
    along the Shard dim in mesh order (Replicate: rank 0's). Plain tensors: replicated when rank 0's has
    the full shape the architecture expects (`shapes`), else dim-0 shards concatenated in rank order."""
    world = len(states)
    keys = list(states[0])
    for r, sd in enumerate(states[1:], 1):
        if set(sd) != set(keys):
            diff = sorted(set(sd) ^ set(keys))
            raise ConvertError(f"{files[r]}: its tensor names differ from rank 0's ({', '.join(diff[:3])})")
    out: dict[str, torch.Tensor] = {}
    for key in keys:
        vals = [sd[key] for sd in states]
        name = _clean_name(key)
        where = f"{files[0].parent}: {key}"
        if all(isinstance(v, DTensor) for v in vals):
            placements = tuple(vals[0]._spec.placements)
            if all(p.is_replicate() for p in placements):
                full = vals[0]._local_tensor
            else:
                ranks, p = _shard_ranks(vals[0], world, where)
                if not (p.is_shard() and type(p).__name__ == "Shard"):
                    raise ConvertError(f"{where}: placement {p} is not supported (Shard or Replicate expected)")
                full = torch.cat([vals[r]._local_tensor for r in ranks], dim=p.dim)
            if tuple(full.shape) != tuple(vals[0].shape):
                raise ConvertError(f"{where}: shards concatenate to {tuple(full.shape)}, the DTensor says "
                                   f"{tuple(vals[0].shape)} (a rank file from another save?)")
        elif all(isinstance(v, torch.Tensor) and not isinstance(v, DTensor) for v in vals):
            want = (shapes or {}).get(name)
            if world == 1 or (want is not None and tuple(vals[0].shape) == tuple(want)):
                full = vals[0]
                for r, v in enumerate(vals[1:], 1):
                    if v.shape != full.shape or not torch.equal(v, full):
                        raise ConvertError(f"{where}: a replicated plain tensor that differs between rank 0 "
                                           f"and rank {r}")
            else:  # plain local shards (verl's merger concatenates plain tensors along dim 0)
                full = torch.cat(vals, dim=0)
        else:
            kinds = sorted({type(v).__name__ for v in vals})
            raise ConvertError(f"{where}: holds {', '.join(kinds)}; expected DTensor shards or tensors")
        out[name] = full.contiguous()
    return out


def verl_files(src: Path) -> tuple[Path, list[Path], Path | None]:
    """(actor dir, its rank files in rank order, its huggingface/ folder or None) of a verl checkpoint."""
    actor = verl_actor_dir(src)
    if actor is None:
        raise ConvertError(f"{src}: no model_world_size_W_rank_R.pt files here or in {src / 'actor'}")
    by_world = rank_files(actor)
    if len(by_world) > 1:
        raise ConvertError(f"{actor}: model shards of several world sizes ({sorted(by_world)}); keep one save")
    world, ranks = next(iter(by_world.items()))
    missing = [r for r in range(world) if r not in ranks]
    if missing:
        raise ConvertError(f"{actor}: model_world_size_{world}_rank_{missing[0]}.pt is missing "
                           f"({len(ranks)} of {world} rank files present)")
    meta = actor / "fsdp_config.json"
    if meta.is_file():
        try:
            declared = json.loads(meta.read_text(encoding="utf-8")).get("world_size")
        except (OSError, ValueError, AttributeError) as e:
            raise ConvertError(f"{meta}: not valid JSON ({e})") from e
        if declared is not None and int(declared) != world:
            raise ConvertError(f"{meta}: world_size {declared}, but the shards are for {world} ranks")
    hf = actor / "huggingface"
    return actor, [ranks[r] for r in range(world)], hf if (hf / "config.json").is_file() else None


def read_verl(src: Path, shapes: dict[str, tuple[int, ...]] | None = None) -> dict[str, torch.Tensor]:
    """The full state dict of a verl FSDP checkpoint (`shapes`: the architecture's, see merge_fsdp_shards)."""
    _, files, _ = verl_files(src)
    return merge_fsdp_shards([load_rank_file(f) for f in files], files, shapes)


# ------------------------------------------------------------------------------------------ output
def _expected(config: Any) -> tuple[dict[str, tuple[int, ...]], bool]:
    """({name: shape} the config's causal-LM class holds, whether lm_head is tied to the embedding)."""
    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConvertError(f"config model_type {getattr(config, 'model_type', '?')!r}: transformers builds no causal "
                           f"LM from it ({first_sentence(e)})") from e
    shapes = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    tied = bool(getattr(config, "tie_word_embeddings", False))
    return shapes, tied


def check_against_config(sd: dict[str, torch.Tensor], config: Any, where: str) -> dict[str, torch.Tensor]:
    """Every weight the architecture expects, with its shape; a tied lm_head is dropped (HF re-ties it)."""
    shapes, tied = _expected(config)
    sd = dict(sd)
    if tied:
        shapes.pop("lm_head.weight", None)
        head = sd.pop("lm_head.weight", None)
        emb = sd.get("model.embed_tokens.weight")
        if head is not None and emb is not None and not torch.equal(head, emb):
            raise ConvertError(f"{where}: the config ties lm_head to the embedding, but the checkpoint's "
                               "lm_head.weight differs from model.embed_tokens.weight")
    missing = sorted(set(shapes) - set(sd))
    extra = sorted(set(sd) - set(shapes))
    arch = (getattr(config, "architectures", None) or [type(config).__name__])[0]
    if missing:
        raise ConvertError(f"{where}: {len(missing)} weight(s) of {arch} missing, e.g. {', '.join(missing[:3])}")
    if extra:
        raise ConvertError(f"{where}: {len(extra)} weight(s) {arch} does not have, e.g. {', '.join(extra[:3])}")
    for k, shape in shapes.items():
        if tuple(sd[k].shape) != shape:
            raise ConvertError(f"{where}: {k} has shape {tuple(sd[k].shape)}, {arch} expects {shape}")
    return sd


def load_hf_config(path: Path, key: str) -> Any:
    """The HuggingFace config in `path` (`key`: the option that named it); one-line ConvertError otherwise."""
    f = path / "config.json"
    if not f.is_file():
        raise ConvertError(f"{key}={path} has no config.json (expected the model's HuggingFace config folder)")
    try:
        raw = json.loads(f.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise ConvertError(f"{key}={f}: not valid JSON ({e})") from e
    model_type = raw.get("model_type") if isinstance(raw, dict) else None
    if not isinstance(model_type, str) or model_type not in CONFIG_MAPPING:
        import transformers  # noqa: PLC0415 - only for its version in the message

        raise ConvertError(f"{key}={f}: model_type {model_type!r} is not an architecture transformers "
                           f"{transformers.__version__} knows (Qwen2 / Qwen3 checkpoints say 'qwen2' / 'qwen3')")
    try:
        return AutoConfig.from_pretrained(path)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ConvertError(f"{key}={f}: not a HuggingFace config ({first_sentence(e)})") from e


MODEL_FILES = re.compile(
    r"config\.json|generation_config\.json|(pre)?processor_config\.json|adapter_config\.json"
    r"|tokenizer\.json|tokenizer_config\.json|special_tokens_map\.json|added_tokens\.json|chat_template\.(jinja|json)"
    r"|vocab\.(json|txt)|merges\.txt|tokenizer\.model|spiece\.model|sentencepiece\.bpe\.model|.*\.tiktoken"
    r"|memrl_[a-z_]+\.json|additional_chat_templates")
"""Files (and transformers' additional_chat_templates folder) of a HuggingFace model directory besides its
weights: configs, every tokenizer side file transformers reads, memrl's own records."""
STALE_AFTER_S = 10.0
"""A staging directory nobody holds, untouched this long, was left by a killed process."""


def _hold(d: Path) -> int | None:
    """An open descriptor of directory `d` holding an exclusive flock on it, None when another process holds it."""
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def remove_stale_staging(out: Path) -> list[Path]:
    """Remove the staging directories (`.<name>.partial-*` beside `out`) that killed writes of `out` left: those
    no live process holds (each writer flocks its own) and untouched for STALE_AFTER_S; one log line each."""
    removed = []
    for d in sorted(out.parent.glob(f".{glob.escape(out.name)}.partial-*")):
        try:
            if not d.is_dir() or d.is_symlink() or time.time() - d.stat().st_mtime < STALE_AFTER_S:
                continue
            fd = _hold(d)
        except OSError:
            continue
        if fd is None:
            continue
        try:
            size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file())
            shutil.rmtree(d, ignore_errors=True)
            log.warning("removed %s (%.1f MB), the staging directory of a write of %s that was killed", d, size / 1e6,
                        out)
            removed.append(d)
        finally:
            os.close(fd)
    return removed


@contextlib.contextmanager
def staged_dir(out: Path) -> Iterator[Path]:
    """A fresh directory beside `out` to write into; when the block succeeds its files become `out`'s (a
    rename of the whole directory when `out` is absent or empty), and it is removed either way: a failed
    or killed conversion leaves no half-written model at `out`. Over an older model (--force) the older
    model's files (weights and MODEL_FILES) go first: `out` then holds the model written and nothing of the
    older one. Staging directories of killed writes of `out` are removed first (remove_stale_staging)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    fd = _hold(tmp)
    try:
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o777 & ~umask)  # mkdtemp's 0700 would become the model directory's mode
        yield tmp
        if out.is_dir() and not any(out.iterdir()):
            out.rmdir()
        if not out.exists():
            tmp.rename(out)
            return
        kept = []
        for p in sorted(out.iterdir()):  # --force over an older model: none of its files may outlive it
            if WEIGHT_FILES.fullmatch(p.name) or MODEL_FILES.fullmatch(p.name):
                if p.is_dir() and not p.is_symlink():
                    shutil.rmtree(p)
                else:
                    p.unlink()
            elif not p.name.startswith("."):
                kept.append(p.name)
        for p in sorted(tmp.iterdir()):
            p.replace(out / p.name)
        if kept:
            log.warning("%s: the older model's files were replaced; %d other file(s) stay (%s)", out, len(kept),
                        ", ".join(kept[:5]) + (", ..." if len(kept) > 5 else ""))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if fd is not None:
            os.close(fd)


def check_links(assets: Path, root: Path) -> None:
    """ConvertError for a file of `assets` (copied into the output) that is a symlink resolving outside the
    checkpoint `root`: a checkpoint from elsewhere must not pull a file of this machine into the model."""
    top = root.resolve()
    if not assets.resolve().is_relative_to(top):
        raise ConvertError(f"{assets} resolves to {assets.resolve()}, outside the checkpoint {root}; refusing to copy "
                           "from it (pass --hf-config DIR)")
    for p in sorted(assets.iterdir()):
        if p.is_symlink() and not p.resolve().is_relative_to(top):
            raise ConvertError(f"{p} is a symlink to {p.resolve()}, outside the checkpoint {root}; refusing to copy "
                               "it into the model (replace the link by the file, or pass --hf-config DIR)")


def write_hf_dir(sd: dict[str, torch.Tensor], assets: Path, out: Path, dtype: torch.dtype | None) -> list[str]:
    """Weights as safetensors (sharded above SHARD_BYTES) plus every non-weight file of `assets`
    (config, tokenizer, generation config) into the empty directory `out`; config.json's dtype names the
    written dtype."""
    for p in sorted(assets.iterdir()):
        if p.is_file() and not WEIGHT_FILES.fullmatch(p.name):
            shutil.copyfile(p, out / p.name)
    tensors = {k: (v.to(dtype) if dtype is not None else v).contiguous() for k, v in sorted(sd.items())}
    used = {v.dtype for v in tensors.values()}
    total = sum(v.numel() * v.element_size() for v in tensors.values())
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for k, v in tensors.items():
        n = v.numel() * v.element_size()
        if shards[-1] and size + n > SHARD_BYTES:
            shards.append({})
            size = 0
        shards[-1][k] = v
        size += n
    written = []
    if len(shards) == 1:
        save_file(shards[0], str(out / "model.safetensors"), metadata={"format": "pt"})
        written.append("model.safetensors")
    else:
        index: dict[str, Any] = {"metadata": {"total_size": total}, "weight_map": {}}
        for i, shard in enumerate(shards, 1):
            name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
            save_file(shard, str(out / name), metadata={"format": "pt"})
            index["weight_map"].update({k: name for k in shard})
            written.append(name)
        (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n", encoding="utf-8")
    cfg_file = out / "config.json"
    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    if len(used) == 1:
        name = str(next(iter(used))).removeprefix("torch.")
        keys = [k for k in ("dtype", "torch_dtype") if k in cfg] or ["torch_dtype"]
        for k in keys:
            cfg[k] = name
    cfg_file.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    return written


def convert(src: str | os.PathLike, out: str | os.PathLike, fmt: str | None = None,
            hf_config: str | os.PathLike | None = None, dtype: str = "keep") -> dict[str, Any]:
    """Convert `src` (verl or Megatron, detected when `fmt` is None) into the HuggingFace directory `out`.
    Returns a summary: format, source, tensors, parameters, dtype, files."""
    src_p = Path(src)
    if not src_p.is_dir():
        raise ConvertError(f"{src_p}: no such directory")
    if dtype not in DTYPES:
        raise ConvertError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    fmt = fmt or detect_format(src_p)
    if fmt not in FORMATS:
        raise ConvertError(f"--from {fmt!r} is not one of {', '.join(FORMATS)}")
    info: dict[str, Any] = {"format": fmt}
    if fmt == "verl":
        actor, files, hf = verl_files(src_p)
        assets = Path(hf_config) if hf_config else hf
        if assets is None:
            raise ConvertError(f"{actor}/huggingface has no config.json; pass --hf-config DIR (the base model's "
                               "HuggingFace folder: config and tokenizer)")
        if not hf_config:
            check_links(assets, src_p)  # before any weight is read
        config = load_hf_config(assets, "--hf-config" if hf_config else "huggingface")
        sd = read_verl(src_p, _expected(config)[0])
        info["world_size"] = len(files)
        where = str(actor)
    else:
        if not hf_config:
            raise ConvertError("--from megatron needs --hf-config DIR (the model's HuggingFace config and "
                               "tokenizer; Megatron's own args in common.pt are a pickle memrl does not load)")
        assets = Path(hf_config)
        config = load_hf_config(assets, "--hf-config")
        sd = megatron_to_hf(read_dcp_tensors(src_p, config), config, src_p)
        where = str(src_p)
    sd = check_against_config(sd, config, where)
    out_p = Path(out)
    try:
        with staged_dir(out_p) as tmp:
            info["files"] = write_hf_dir(sd, assets, tmp, DTYPES[dtype])
    except Exception as e:
        if disk_full(e):
            raise ConvertError(f"--out {out_p}: the disk is full (no space left on the device holding "
                               f"{out_p.parent}); nothing was written to {out_p}") from e
        if isinstance(e, OSError):
            raise ConvertError(f"--out {out_p}: cannot write the model ({os_message(e)})") from e
        raise
    info["tensors"] = len(sd)
    info["parameters"] = sum(v.numel() for v in sd.values())
    info["dtype"] = ", ".join(sorted({str(v.dtype if DTYPES[dtype] is None else DTYPES[dtype]).removeprefix("torch.")
                                      for v in sd.values()}))
    return info


def _fmt_params(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n < 1e9 else f"{n / 1e9:.2f}B"


def summary_line(info: dict[str, Any], out: Path) -> str:
    ws = f", world size {info['world_size']}" if "world_size" in info else ""
    return (f"converted {info['format']} checkpoint{ws} to {out}: {info['tensors']} tensors, "
            f"{_fmt_params(info['parameters'])} parameters, {info['dtype']}, {', '.join(info['files'])}")


__all__ = ["FORMATS", "convert", "detect_format", "merge_fsdp_shards", "read_verl", "verl_files"]
