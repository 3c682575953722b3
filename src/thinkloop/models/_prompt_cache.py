"""The local model's on-disk prompt cache: llama.cpp's state after the system prompt, kept between processes.

Every request of an agent starts with the same system prompt (its instructions and, in ReAct, the tool
list): 500+ tokens that take the embedded model ~10 s to read on 2 cores. Within a process the KV cache
is reused between requests anyway (llama.cpp prefix matching); this keeps it across processes, so the
first request of a new process (`thinkloop run …`, a worker, a test) reads only the task.

A file holds the state after exactly the system prompt's tokens (~28 kB a token for the 1.5B model, 15 MB
for a typical prompt), named by a hash of the model file, the context size, the llama-cpp-python
version and those tokens — a changed prompt or model is a new file, never a wrong state. Files are written
atomically with a SHA-256 of their contents, checked before loading; at most `max_files` are kept (the
least recently used go first). Any failure to read or write falls back to reading the prompt.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import os
import tempfile
from pathlib import Path
from typing import Any

logger = logging.getLogger("thinkloop.models")

_MAGIC = b"thinkloop-kv-1\n"
_SUFFIX = ".kv"


class PromptCache:
    """States of a llama.cpp context after a prompt prefix, in `directory` (see the module docstring)."""

    def __init__(self, directory: Path, *, max_files: int = 16) -> None:
        self.directory = directory
        self.max_files = max_files

    def key(self, model_path: Path, n_ctx: int, prefix: list[int]) -> str:
        import llama_cpp

        stat = model_path.stat()
        identity = f"{model_path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{n_ctx}|{llama_cpp.__version__}"
        digest = hashlib.sha256(identity.encode())
        digest.update(b"".join(t.to_bytes(4, "little", signed=True) for t in prefix))
        return digest.hexdigest()[:40]

    def restore(self, llm: Any, key: str, prefix: list[int]) -> bool:
        """Load the state saved under `key` into `llm` (its KV cache then holds `prefix`); False if none."""
        path = self.directory / f"{key}{_SUFFIX}"
        try:
            data = path.read_bytes()
        except OSError:
            return False
        try:
            payload = _checked_payload(data)
            if payload is None:
                raise ValueError("the file is cut short or damaged")
            import llama_cpp

            buffer = (ctypes.c_uint8 * len(payload)).from_buffer_copy(payload)
            llm.reset()
            if int(llama_cpp.llama_state_set_data(llm._ctx.ctx, buffer, len(payload))) != len(payload):
                raise ValueError("llama.cpp did not take the whole state")
            llm.input_ids[: len(prefix)] = prefix
            llm.n_tokens = len(prefix)
            os.utime(path)  # recently used: evicted last
            return True
        except Exception as exc:  # a damaged or foreign file: read the prompt instead, and drop the file
            logger.warning("the prompt cache file %s is unusable (%s); reading the prompt instead", path, exc)
            llm.reset()
            with contextlib.suppress(OSError):
                path.unlink()
            return False

    def save(self, llm: Any, key: str) -> None:
        """Save `llm`'s current state under `key` (best effort: a failure is logged, never raised)."""
        try:
            import llama_cpp

            size = int(llama_cpp.llama_state_get_size(llm._ctx.ctx))
            buffer = (ctypes.c_uint8 * size)()
            written = int(llama_cpp.llama_state_get_data(llm._ctx.ctx, buffer, size))
            payload = bytes(buffer)[:written]
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, suffix=".tmp")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(_MAGIC + hashlib.sha256(payload).digest() + payload)
                os.replace(tmp, self.directory / f"{key}{_SUFFIX}")
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
            self._evict()
        except Exception as exc:
            logger.warning(
                "could not save the prompt cache in %s (%s); the next process reads the prompt",
                self.directory,
                exc,
            )

    def _evict(self) -> None:
        files = sorted(self.directory.glob(f"*{_SUFFIX}"), key=_mtime, reverse=True)
        for old in files[self.max_files :]:
            with contextlib.suppress(OSError):
                old.unlink()


def _checked_payload(data: bytes) -> bytes | None:
    head = len(_MAGIC) + 32
    if len(data) <= head or not data.startswith(_MAGIC):
        return None
    payload = data[head:]
    return payload if hashlib.sha256(payload).digest() == data[len(_MAGIC) : head] else None


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
