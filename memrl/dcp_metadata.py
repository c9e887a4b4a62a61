"""The classes a torch.distributed.checkpoint (DCP) `.metadata` file may name: the one allowlist both readers of
DCP metadata unpickle by (a training checkpoint's optimizer shards, memrl.training.checkpoints.checkpoint; a Megatron
torch_dist checkpoint, memrl.models.convert_megatron, which admits Megatron's own classes beside them).
Torch dtypes are admitted by each reader on their own; anything else is refused."""

from __future__ import annotations

DCP_METADATA_CLASSES: frozenset[tuple[str, str]] = frozenset({
    ("torch.distributed.checkpoint.metadata", n)
    for n in ("Metadata", "MetadataIndex", "StorageMeta", "TensorProperties", "TensorStorageMetadata",
              "ChunkStorageMetadata", "_MEM_FORMAT_ENCODING")
} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch.serialization", "_get_layout"),
     ("torch", "Size"), ("pathlib", "PosixPath"), ("pathlib", "WindowsPath"), ("collections", "OrderedDict")})
"""(module, name) of every class DCP's metadata pickles (torch 2.x's layout)."""
