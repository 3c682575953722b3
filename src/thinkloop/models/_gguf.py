"""The header of a GGUF model file, read before llama.cpp loads it: what llama.cpp would refuse, and what the
model will need, said in words.

llama.cpp (through llama-cpp-python, whose load logs are silenced) answers a file it cannot load with
"Failed to load model from file", whatever the reason, and allocates the KV cache of any `n_ctx` asked for:
`n_ctx=2_000_000` on the 0.5B model asked for 24 GB, and the kernel killed the process without a word.
`read_header` reads the metadata and the tensor table (a few MB, no tensor data) so that the local model can
say instead that a file is not GGUF, is cut short, was trained for a smaller context, or would not fit in
the memory this machine has (`available_memory`).

The format (https://github.com/ggml-org/ggml/blob/master/docs/gguf.md): `GGUF`, a version, the tensor and
key-value counts, the key-values (typed, arrays included), the tensor infos (name, dimensions, type, offset),
then the tensor data from the next `general.alignment` boundary.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
_HEAD_READ = 32 * 1024 * 1024  # a header larger than this (a huge vocabulary) is read further as needed

# ggml_type -> (elements per block, bytes per block), from ggml.h / ggml.c's type traits
_TYPE_SIZES = {
    0: (1, 4),  # F32
    1: (1, 2),  # F16
    2: (32, 18),  # Q4_0
    3: (32, 20),  # Q4_1
    6: (32, 22),  # Q5_0
    7: (32, 24),  # Q5_1
    8: (32, 34),  # Q8_0
    9: (32, 36),  # Q8_1
    10: (256, 84),  # Q2_K
    11: (256, 110),  # Q3_K
    12: (256, 144),  # Q4_K
    13: (256, 176),  # Q5_K
    14: (256, 210),  # Q6_K
    15: (256, 292),  # Q8_K
    24: (1, 1),  # I8
    25: (1, 2),  # I16
    26: (1, 4),  # I32
    27: (1, 8),  # I64
    28: (1, 8),  # F64
    30: (1, 2),  # BF16
}
# GGUF value types: fixed-size scalars (struct format), 8 = string, 9 = array
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_STRING, _ARRAY = 8, 9


class GgufError(ValueError):
    """The file is not a GGUF file llama.cpp can load; the message says what is wrong with it."""


@dataclass(frozen=True, slots=True)
class GgufInfo:
    """What the header of a GGUF file says (None where it does not say, or says something unexpected)."""

    version: int
    file_size: int
    architecture: str | None
    context_length: int | None  # the context the model was trained for (llama.cpp's n_ctx_train)
    kv_bytes_per_token: int | None  # the f16 KV cache llama.cpp allocates for each token of n_ctx
    vocab_size: int | None
    tensor_count: int
    data_end: int  # where the last tensor's data ends, at least (exact when every tensor type is known)
    data_exact: bool  # whether `data_end` is exact

    def kv_cache_bytes(self, n_ctx: int) -> int | None:
        return None if self.kv_bytes_per_token is None else self.kv_bytes_per_token * n_ctx

    def compute_bytes(self) -> int:
        """About what llama.cpp's compute buffers take (dominated by a 512-token batch of logits)."""
        return 512 * (self.vocab_size or 32_000) * 4 + 64 * 2**20


def read_header(path: Path) -> GgufInfo:
    """Read the header of the GGUF file at `path`; GgufError saying what is wrong when it is not one."""
    size = path.stat().st_size
    if size == 0:
        raise GgufError("it is empty (0 bytes)")
    with path.open("rb") as file:
        reader = _Reader(file, size)
        start = reader.take(min(4, size))
        if start != MAGIC:
            raise GgufError(f"it is not a GGUF file: it starts with {start!r}, not {MAGIC!r}")
        return _parse(reader, size)


def _parse(reader: _Reader, size: int) -> GgufInfo:
    version = reader.scalar("I")
    if version == 1:
        raise GgufError("it is GGUF version 1, which llama.cpp no longer reads: convert the model again")
    tensors, count = reader.scalar("Q"), reader.scalar("Q")
    meta: dict[str, Any] = {}
    for _ in range(count):
        key = reader.string()
        meta[key] = reader.value(reader.scalar("I"), key)
    offsets: list[tuple[int, int | None]] = []
    for _ in range(tensors):
        reader.string()
        dims = [reader.scalar("Q") for _ in range(reader.scalar("I"))]
        kind, offset = reader.scalar("I"), reader.scalar("Q")
        offsets.append((offset, _tensor_bytes(kind, dims)))
    alignment = meta.get("general.alignment", 32)
    alignment = alignment if isinstance(alignment, int) and alignment > 0 else 32
    data_start = -(-reader.position // alignment) * alignment
    ends = [offset + (nbytes or 1) for offset, nbytes in offsets]
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) else None
    return GgufInfo(
        version=version,
        file_size=size,
        architecture=arch,
        context_length=_positive(meta.get(f"{arch}.context_length")),
        kv_bytes_per_token=_kv_bytes_per_token(meta, arch),
        vocab_size=meta.get("tokenizer.ggml.tokens")
        if isinstance(meta.get("tokenizer.ggml.tokens"), int)
        else None,
        tensor_count=tensors,
        data_end=data_start + max(ends, default=0),
        data_exact=all(nbytes is not None for _, nbytes in offsets),
    )


def _tensor_bytes(kind: int, dims: list[int]) -> int | None:
    if kind not in _TYPE_SIZES:
        return None
    block, size = _TYPE_SIZES[kind]
    elements = 1
    for dim in dims:
        elements *= dim
    return elements // block * size


def _kv_bytes_per_token(meta: dict[str, Any], arch: str | None) -> int | None:
    """2 bytes (f16) x layers x (K + V widths), the widths from the head counts and sizes."""
    layers = _positive(meta.get(f"{arch}.block_count"))
    heads = _positive(meta.get(f"{arch}.attention.head_count"))
    kv_heads = _positive(meta.get(f"{arch}.attention.head_count_kv")) or heads
    width = _positive(meta.get(f"{arch}.embedding_length"))
    if layers is None or heads is None or kv_heads is None or width is None:
        return None
    key = _positive(meta.get(f"{arch}.attention.key_length")) or width // heads
    value = _positive(meta.get(f"{arch}.attention.value_length")) or width // heads
    return 2 * layers * kv_heads * (key + value)


def _positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


class _Reader:
    """Little-endian GGUF values from a file read in large blocks (the header holds ~300,000 strings)."""

    def __init__(self, file: Any, size: int) -> None:
        self.file, self.size = file, size
        self.buffer = b""
        self.base = 0  # the file offset of buffer[0]
        self.offset = 0  # the read position in buffer

    @property
    def position(self) -> int:
        return self.base + self.offset

    def take(self, n: int) -> bytes:
        if self.offset + n > len(self.buffer):
            self._fill(n)
        data = self.buffer[self.offset : self.offset + n]
        self.offset += n
        return data

    def _fill(self, n: int) -> None:
        if self.position + n > self.size:
            raise GgufError(
                f"it is cut short in its header: it ends at byte {self.size:,}, in the middle of its metadata "
                "(a copy or download that did not finish)"
            )
        rest = self.buffer[self.offset :]
        self.base += self.offset
        self.buffer = rest + self.file.read(max(n - len(rest), _HEAD_READ))
        self.offset = 0

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize("<" + fmt)
        return struct.unpack("<" + fmt, self.take(size))[0]

    def string(self) -> str:
        length = self.scalar("Q")
        if length > self.size:
            raise GgufError(f"its header is damaged: a string of {length:,} bytes in a file of {self.size:,}")
        return self.take(length).decode("utf-8", errors="replace")

    def value(self, kind: int, key: str) -> Any:
        """A value of GGUF type `kind`; an array is read past and stands for its length."""
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.scalar("I"), self.scalar("Q")
            self._skip_array(item, count, key)
            return count
        raise GgufError(f"its header is damaged: the value of {key!r} has the unknown type {kind}")

    def _skip_array(self, item: int, count: int, key: str) -> None:
        if item in _SCALARS:
            total = struct.calcsize("<" + _SCALARS[item]) * count
            if self.position + total > self.size:
                self._fill(total)  # raises: cut short
            self._skip(total)
            return
        if item == _STRING:
            self._skip_strings(count)
            return
        for _ in range(count):
            self.value(item, key)

    def _skip_strings(self, count: int) -> None:
        """Past `count` strings without decoding them (a vocabulary: ~150,000 tokens and as many merges)."""
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            if self.offset + 8 > len(self.buffer):
                self._fill(8)
            (length,) = unpack(self.buffer, self.offset)
            if length > self.size:
                raise GgufError(
                    f"its header is damaged: a string of {length:,} bytes in a file of {self.size:,}"
                )
            self.offset += 8
            if self.offset + length > len(self.buffer):
                self._fill(length)
            self.offset += length

    def _skip(self, n: int) -> None:
        if self.offset + n <= len(self.buffer):
            self.offset += n
            return
        skipped = n - (len(self.buffer) - self.offset)
        self.base += len(self.buffer) + skipped
        self.buffer, self.offset = b"", 0
        self.file.seek(self.base)


def available_memory() -> int | None:
    """Bytes of memory this process can still get: the system's MemAvailable, or less under a cgroup limit
    (a container); None where neither can be read (not Linux)."""
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
                    break
    except (OSError, ValueError, IndexError):
        pass
    for limit_file, usage_file in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        try:
            limit = Path(limit_file).read_text().strip()
            usage = int(Path(usage_file).read_text().strip())
        except (OSError, ValueError):
            continue
        if limit.isdigit() and int(limit) < 2**60:  # "max", or v1's "no limit" of 2^63 - page size
            found.append(max(int(limit) - usage, 0))
        break
    return min(found) if found else None


def gib(n: int) -> str:
    """Bytes as GiB for a message (`1.3 GiB`)."""
    return f"{n / 2**30:,.1f} GiB"


__all__ = ["GgufError", "GgufInfo", "available_memory", "gib", "read_header"]
