"""Tensor dicts to safetensors shards and back. safetensors stores raw bytes plus a JSON header, so
loading a shard never runs pickle."""

from __future__ import annotations

from collections.abc import Mapping

import safetensors.torch
import torch

from ringzero.errors import IntegrityError, StoreError

# What safetensors can store; anything else is refused by name before a byte is written.
SUPPORTED_DTYPES = frozenset(
    {
        torch.float64,
        torch.float32,
        torch.float16,
        torch.bfloat16,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.complex64,
        torch.int64,
        torch.int32,
        torch.int16,
        torch.int8,
        torch.uint64,
        torch.uint32,
        torch.uint16,
        torch.uint8,
        torch.bool,
    }
)
_RESERVED_NAME = "__metadata__"  # the key of safetensors' own header metadata
# The header metadata transformers writes and checks for: a shard is a PyTorch state dict.
_HEADER_METADATA = {"format": "pt"}


def check_tensors(tensors: Mapping[str, torch.Tensor]) -> None:
    """Refuse, naming the tensor, anything a shard cannot hold faithfully."""
    if not isinstance(tensors, Mapping):
        raise StoreError(f"tensors must be a dict of name -> torch.Tensor (got {type(tensors).__name__})")
    for name, t in tensors.items():
        if not isinstance(name, str):
            raise StoreError(f"tensor names must be strings (got {name!r})")
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise StoreError(f"tensor name {name!r} cannot be encoded as UTF-8") from None
        if name == _RESERVED_NAME:
            raise StoreError(f"tensor name {name!r} is reserved by the safetensors format")
        if not isinstance(t, torch.Tensor):
            raise StoreError(f"tensor {name!r}: expected a torch.Tensor, got {type(t).__name__}")
        if t.layout != torch.strided:
            raise StoreError(
                f"tensor {name!r}: layout {t.layout} cannot be stored; convert it to dense first"
            )
        if t.dtype not in SUPPORTED_DTYPES:
            raise StoreError(f"tensor {name!r}: dtype {t.dtype} cannot be stored in safetensors")


def plan_shards(tensors: Mapping[str, torch.Tensor], max_shard_bytes: int) -> list[list[str]]:
    """Group tensor names, in the given order, into shards of at most ``max_shard_bytes`` of data.

    A tensor larger than the limit gets a shard of its own rather than being split: a shard is
    always loadable on its own.
    """
    shards: list[list[str]] = []
    current: list[str] = []
    size = 0
    for name, t in tensors.items():
        nbytes = t.numel() * t.element_size()
        if current and size + nbytes > max_shard_bytes:
            shards.append(current)
            current, size = [], 0
        current.append(name)
        size += nbytes
    if current:
        shards.append(current)
    return shards


def serialize(tensors: Mapping[str, torch.Tensor], names: list[str]) -> bytes:
    """The safetensors bytes of ``names`` from ``tensors`` (on CPU, contiguous, unshared)."""
    prepared: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name in names:
        t = tensors[name].detach().to("cpu").contiguous()
        storage = t.untyped_storage()
        # safetensors refuses tensors that share memory (tied weights, views of one buffer); a copy
        # stores each as the independent tensor it will be after loading anyway.
        if storage.data_ptr() in seen or storage.nbytes() != t.numel() * t.element_size():
            t = t.clone()
        if t.numel():
            seen.add(t.untyped_storage().data_ptr())
        prepared[name] = t
    return safetensors.torch.save(prepared, metadata=_HEADER_METADATA)


def deserialize(data: bytes, expected: tuple[str, ...], where: str) -> dict[str, torch.Tensor]:
    """The tensors of one shard whose bytes were already verified; refuses a tensor list that
    differs from the manifest's."""
    try:
        tensors = safetensors.torch.load(data)
    except Exception as exc:  # safetensors raises its own SafetensorError; any failure means bad bytes
        raise IntegrityError(f"{where}: not a readable safetensors file ({exc})") from None
    if set(tensors) != set(expected):
        missing = sorted(set(expected) - set(tensors))
        extra = sorted(set(tensors) - set(expected))
        raise IntegrityError(
            f"{where}: tensors differ from the manifest (missing {missing}, unexpected {extra})"
        )
    return tensors
