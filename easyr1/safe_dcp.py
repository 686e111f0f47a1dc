"""Reading torch.distributed.checkpoint (DCP) folders without running code from them.

DCP pickles two things: a folder's ``.metadata`` (its own dataclasses, ``torch.Size``, dtypes) and
each value of a state dict that is not a tensor (the LR schedule's numbers, the optimizer's
hyper-parameters), and it unpickles both with every global allowed: a ``.metadata`` or a shard made
to run code when unpickled would run it on every rank that scans, resumes or merges the checkpoint.
Here ``.metadata`` is unpickled through an allow-list of the classes DCP's metadata holds (read off
the checkpoints this engine writes), and the other values with ``torch.load(weights_only=True)``, as
DCP already loads tensors; anything else is refused with an error naming the file or the value.
"""

from __future__ import annotations

import io
import pickle
import re
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint._traverse import set_element
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta
from torch.distributed.checkpoint.planner import ReadItem

_DCP_METADATA = "torch.distributed.checkpoint.metadata"
# Every global a DCP .metadata refers to (read off the checkpoints torch 2.13 writes): the metadata's
# dataclasses and enum, the per-file storage records, shapes, layouts (pickled as a call of
# torch.serialization._get_layout with a layout's name), dtypes, and the checkpoint id as a path;
# besides, torch's dtype, layout and memory-format constants. None of them runs code when called.
_METADATA_GLOBALS = {
    *(
        (_DCP_METADATA, name)
        for name in (
            "Metadata",
            "MetadataIndex",
            "StorageMeta",
            "TensorProperties",
            "TensorStorageMetadata",
            "BytesStorageMetadata",
            "ChunkStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("collections", "OrderedDict"),
}


def refusal(exc: pickle.UnpicklingError) -> str:
    """What a weights-only ``torch.load`` refused, in a few words instead of its page of advice."""
    found = re.search(r"GLOBAL (\S+) was not an allowed global", str(exc))
    return f"it refers to {found.group(1)}" if found else "it holds objects other than tensors and numbers"


class RefusedPickle(pickle.UnpicklingError):
    """A checkpoint file refers to something other than the data its format holds (it could run code)."""


class _MetadataUnpickler(pickle.Unpickler):
    def __init__(self, stream: Any, path: Path):
        super().__init__(stream)
        self.path = path

    def find_class(self, module: str, name: str) -> Any:
        constant = module == "torch" and isinstance(
            getattr(torch, name, None), (torch.dtype, torch.layout, torch.memory_format)
        )
        if (module, name) in _METADATA_GLOBALS or constant:
            return super().find_class(module, name)
        raise RefusedPickle(
            f"{self.path} refers to {module}.{name}, which DCP metadata never holds: not loaded "
            "(unpickling it could run code)"
        )


def read_metadata(path: Path) -> Metadata:
    """The DCP metadata in the file ``path`` (a component's ``.metadata``), through the allow-list."""
    with path.open("rb") as stream:
        metadata = _MetadataUnpickler(stream, path).load()
    if not isinstance(metadata, Metadata):
        raise RefusedPickle(f"{path} holds a {type(metadata).__name__}, not DCP metadata")
    return metadata


class SafeReader(FileSystemReader):
    """DCP's file-system reader, reading ``.metadata`` through the allow-list."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
        if getattr(metadata, "storage_meta", None) is None:  # as FileSystemReader does
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


class WeightsOnlyPlanner(DefaultLoadPlanner):
    """DCP's default load planner, loading the values that are not tensors weights-only."""

    def load_bytes(self, read_item: ReadItem, value: io.BytesIO) -> None:
        fqn = read_item.dest_index.fqn
        try:
            loaded = torch.load(value, weights_only=True)
        except pickle.UnpicklingError as exc:
            raise RefusedPickle(
                f"{fqn} was refused by a weights-only load ({refusal(exc)}): not loaded (unpickling it could run code)"
            ) from None
        # As DefaultLoadPlanner.load_bytes, with the value loaded above.
        if self.flatten_state_dict:
            set_element(self.original_state_dict, self.mappings[fqn], loaded)
        else:
            self.state_dict[fqn] = loaded
