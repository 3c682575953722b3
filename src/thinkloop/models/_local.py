"""The embedded local model (SPEC §2.3): Qwen2.5-Coder-Instruct (1.5B or 0.5B, Q4_K_M GGUF) run in-process
by llama.cpp — no key, no network, thinkloop's zero-configuration default (`model="local"`).

- The prompt is the Qwen2.5 ChatML template built here (`render_chatml`), completed with a raw
  `create_completion`; no llama-cpp chat handler is used. Template markers are tokenized as control
  tokens and message text as plain text, so a tool output cannot forge a `<|im_start|>` turn.
- Text ReAct is the default mode (`capabilities.tools` is False); the loop sends `prefill="Thought:"`
  and the reply continues from it. Native tools, when a request carries them, are rendered Qwen-style
  in the system prompt and `<tool_call>{json}</tool_call>` (or bare JSON) replies are parsed leniently.
- One `Llama` per model file per process, shared by every `LocalModel` and every run: generations are
  serialised (an asyncio lock per event loop, a thread lock across loops) and run in a worker thread,
  so the event loop stays responsive. Consecutive turns of one run reuse the KV cache of their common
  prefix (llama.cpp prefix matching), so only the new messages are processed.
- `llama_cpp` is imported lazily, when the model is first used: `import thinkloop` never loads it.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import logging
import os
import sys
import threading
import uuid
import weakref
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import _react
from .._errors import ConfigurationError, ContextOverflowError, ModelError
from .._messages import (
    FinishReason,
    Message,
    ModelRequest,
    ModelResponse,
    StreamChunk,
    TextDelta,
    ToolCall,
    ToolDefinition,
    Usage,
)
from . import _gguf, _weights
from ._base import Model, ModelCapabilities
from ._prompt_cache import PromptCache

logger = logging.getLogger("thinkloop.models")

DEFAULT_N_CTX = 8192
# A cap on one reply: on 2 CPU cores a small model stuck repeating itself would otherwise generate the
# request's whole 4,096 tokens (about 5 minutes) before the loop's guards can act.
DEFAULT_MAX_OUTPUT_TOKENS = 1024
DEFAULT_SEED = 0
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
IM_START, IM_END, END_OF_TEXT = "<|im_start|>", "<|im_end|>", "<|endoftext|>"
STOP_TOKENS = [IM_END, END_OF_TEXT]

INSTALL_HINT = (
    "the local model needs llama-cpp-python: install it with `pip install 'thinkloop[local]'` "
    "(it builds llama.cpp from source: about 11 minutes on 2 cores, once), or choose another model, "
    "e.g. model='openai:gpt-4o-mini'"
)

# =============================================================================================== prompt


@dataclass(frozen=True, slots=True)
class Segment:
    """A piece of the prompt: template markup (`control`, tokenized with special tokens) or plain text."""

    text: str
    control: bool = False


_TOOLS_HEAD = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>"
)
_TOOLS_TAIL = (
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    '<tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": '
    "<args-json-object>}\n</tool_call>"
)


def render_chatml(
    messages: Sequence[Message],
    tools: Sequence[ToolDefinition] = (),
    prefill: str = "",
    *,
    scratchpad: bool = True,
) -> list[Segment]:
    """The Qwen2.5 ChatML prompt of a conversation, ending with an open assistant turn and `prefill`.

    System messages are merged into the first turn (Qwen's default system prompt when there are none);
    tool calls are written as `<tool_call>` JSON (arguments as an object, never a string); tool results
    become a user turn, as `<tool_response>` when `tools` are given and as `Observation:` text otherwise.

    With `scratchpad` (text ReAct, no native `tools`), a ReAct exchange (Action, then the user message
    `Observation: …` that answers it, and so on) is kept in ONE assistant turn, left open, so the model
    continues its own Thought/Action/Observation scratchpad right after the task, as in the ReAct paper.
    """
    system = "\n\n".join(m.content for m in messages if m.role == "system") or DEFAULT_SYSTEM
    if tools:
        system = f"{system}\n\n{_tools_block(tools)}"
    turns = [_Turn("system", system)]
    for msg in messages if tools else _react.render_transcript(list(messages)):
        if msg.role != "system":
            _add_turn(turns, msg, native=bool(tools), scratchpad=scratchpad and not tools)
    last = turns[-1]
    closed = turns[:-1] if last.open else turns
    segments = [seg for turn in closed for seg in _turn_segments(turn.role, turn.text)]
    head = f"assistant\n{last.text}\n" if last.open else "assistant\n"
    return [*segments, Segment(IM_START, control=True), Segment(head + prefill)]


@dataclass(slots=True)
class _Turn:
    role: str
    text: str
    tool_results: bool = False  # a user turn made of tool results (consecutive ones are merged)
    open: bool = False  # an assistant ReAct scratchpad that continues after its last Observation


def _add_turn(turns: list[_Turn], msg: Message, *, native: bool, scratchpad: bool) -> None:
    role, text = _turn_of(msg, native=native)
    last = turns[-1]
    if msg.role == "tool" and last.tool_results:
        last.text = f"{last.text}\n{text}"
    elif scratchpad and last.role == "assistant" and _is_observation(msg):
        last.text, last.open = f"{last.text}\n{text}", True
    elif scratchpad and last.open and msg.role == "assistant":
        last.text = f"{last.text}\n{text}"
    else:
        turns.append(_Turn(role, text, tool_results=msg.role == "tool"))


def _is_observation(msg: Message) -> bool:
    """A tool result as the loop renders it in ReAct mode (a user message starting `Observation:`)."""
    observed = msg.role == "user" and msg.kind == "reply" and msg.content.startswith(_react.OBSERVATION)
    return observed or msg.role == "tool"


def _turn_segments(role: str, text: str) -> list[Segment]:
    return [
        Segment(IM_START, control=True),
        Segment(f"{role}\n"),
        Segment(text),
        Segment(IM_END, control=True),
        Segment("\n"),
    ]


def _turn_of(msg: Message, *, native: bool) -> tuple[str, str]:
    if msg.role == "tool":
        if native:
            return "user", f"<tool_response>\n{_react.readable_json(msg.content)}\n</tool_response>"
        return "user", f"{_react.OBSERVATION} {msg.content}"
    if msg.role == "assistant" and msg.tool_calls:
        calls = "\n".join(_tool_call_text(c) for c in msg.tool_calls)
        return "assistant", f"{msg.content.strip()}\n{calls}".strip()
    return msg.role, msg.content


def _tool_call_text(call: ToolCall) -> str:
    args: Any = call.arguments if call.raw_arguments is None else call.raw_arguments
    body = json.dumps({"name": call.name, "arguments": args}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def _tools_block(tools: Sequence[ToolDefinition]) -> str:
    lines = [
        json.dumps(
            {
                "type": "function",
                "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
            },
            ensure_ascii=False,
        )
        for t in tools
    ]
    return "\n".join([_TOOLS_HEAD, *lines, _TOOLS_TAIL])


def prompt_text(segments: Sequence[Segment]) -> str:
    """The prompt as one string (what the model reads; for logs and tests)."""
    return "".join(s.text for s in segments)


# ============================================================================================ tool calls


def parse_tool_calls(text: str, tool_names: Sequence[str]) -> tuple[str, list[ToolCall]]:
    """Native-mode reply → (text before the calls, tool calls), tolerating missing tags and string args
    (`<tool_call>` blocks, or a reply that is a JSON call of a known tool: see `_react.text_calls`)."""
    return _react.text_calls(text, list(tool_names), _call_id())


def _call_id() -> str:
    return f"call_{uuid.uuid4().hex[:12]}"


# ============================================================================================== runtime


@dataclass(eq=False)
class _Runtime:
    """One loaded `Llama` and the locks that serialise its use."""

    llm: Any
    path: Path
    thread_lock: threading.Lock = field(default_factory=threading.Lock)
    _loop_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    running: _Job | None = None  # the job generating now (it holds `thread_lock`)
    aborting: bool = False  # llama.cpp's abort callback is set: its next batch fails
    state_lock: threading.Lock = field(default_factory=threading.Lock)  # guards `running` and `aborting`

    def stop(self, job: _Job) -> None:
        """Cancel `job`: one that has not started does not start; one that runs stops at its next token, and
        llama.cpp aborts its next batch of up to 512 prompt tokens (reading a long prompt takes a minute)."""
        with self.state_lock:
            job.cancel.set()
            if self.running is job and not self.aborting:
                self.aborting = _set_abort(self.llm, True)

    def start(self, job: _Job) -> bool:
        """Mark `job` as running (under `thread_lock`); False when it was cancelled while it waited."""
        with self.state_lock:
            if job.cancel.is_set():
                return False
            self.running = job
            return True

    def finish(self) -> None:
        """The running job is over: the next one must not be aborted."""
        with self.state_lock:
            self.running = None
            if self.aborting:
                self.aborting = not _set_abort(self.llm, False)

    def async_lock(self) -> asyncio.Lock:
        """This event loop's lock: waiting runs queue here, not in worker threads."""
        loop = asyncio.get_running_loop()
        lock = self._loop_locks.get(loop)
        if lock is None:
            lock = self._loop_locks[loop] = asyncio.Lock()
        return lock

    def tokenize(self, segments: Sequence[Segment]) -> list[int]:
        tokens: list[int] = []
        for seg in segments:
            if seg.text:
                tokens += self.llm.tokenize(seg.text.encode("utf-8"), add_bos=False, special=seg.control)
        return tokens


_RUNTIMES: dict[tuple[str, int, int], _Runtime] = {}
_LOAD_LOCK = threading.Lock()
_ABORT_CALLBACKS: list[Any] = []  # [abort, none], made once: llama.cpp keeps a pointer to them


def _set_abort(llm: Any, on: bool) -> bool:
    """Set (or clear) the llama.cpp abort callback of `llm`'s context; False for a stand-in without one."""
    ctx = getattr(getattr(llm, "_ctx", None), "ctx", None)
    if ctx is None:
        return False
    llama_cpp = sys.modules["llama_cpp"]
    if not _ABORT_CALLBACKS:
        _ABORT_CALLBACKS.extend(
            [llama_cpp.ggml_abort_callback(lambda _: True), llama_cpp.ggml_abort_callback()]
        )
    llama_cpp.llama_set_abort_callback(ctx, _ABORT_CALLBACKS[0 if on else 1], None)
    return True


def _import_llama() -> Any:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle threads must not spin between requests
    try:
        import llama_cpp
    except ImportError as exc:
        if exc.name == "llama_cpp":
            raise ConfigurationError(INSTALL_HINT) from exc
        raise ConfigurationError(_broken_install(exc)) from exc
    except (
        RuntimeError,
        OSError,
        AttributeError,
    ) as exc:  # its shared library, or a symbol of it, is missing
        raise ConfigurationError(_broken_install(exc)) from exc
    return llama_cpp.Llama


def _broken_install(exc: BaseException) -> str:
    return (
        f"llama-cpp-python is installed but cannot be imported: {exc}; reinstall it with "
        "`pip install --force-reinstall --no-cache-dir 'thinkloop[local]'` (it builds llama.cpp from source: "
        "about 11 minutes on 2 cores), or choose another model, e.g. model='openai:gpt-4o-mini'"
    )


def _load_runtime(path: Path, n_ctx: int, n_threads: int, seed: int, *, assembled: bool = False) -> _Runtime:
    """The shared runtime of a model file (loaded on first use; seconds). `assembled`: the file is the
    verified weights of a variant (not one given as `path=`), which changes the advice of a failure."""
    key = (str(path.resolve()), n_ctx, n_threads)
    with _LOAD_LOCK:
        runtime = _RUNTIMES.get(key)
        if runtime is None:
            llama = _import_llama()
            info = _check_model_file(path, n_ctx)
            try:
                llm = llama(model_path=str(path), n_ctx=n_ctx, n_threads=n_threads, seed=seed, verbose=False)
            except (ValueError, RuntimeError, MemoryError) as exc:
                raise _load_error(path, n_ctx, info, exc, assembled=assembled) from exc
            if not _RUNTIMES:
                atexit.register(_close_all)
                _warn_if_amx_on_a_vm(lambda: sys.modules["llama_cpp"].llama_print_system_info())
            runtime = _RUNTIMES[key] = _Runtime(llm, path)
        return runtime


def _check_model_file(path: Path, n_ctx: int) -> _gguf.GgufInfo:
    """The header of the model file, refused in words before llama.cpp reads it: not GGUF, cut short, trained
    for a smaller context than `n_ctx`, or too large a KV cache for the memory this machine has (llama.cpp
    would allocate it anyway, and the kernel kill the process)."""
    try:
        info = _gguf.read_header(path)
    except _gguf.GgufError as exc:
        raise ConfigurationError(
            f"the local model file {path} cannot be loaded: {exc}; {_BAD_FILE}"
        ) from None
    except OSError as exc:
        raise ConfigurationError(f"cannot read the local model file {path}: {exc.strerror or exc}") from None
    if info.data_end > info.file_size:
        need = f"{info.data_end:,}" if info.data_exact else f"more than {info.data_end:,}"
        raise ConfigurationError(
            f"the local model file {path} is cut short: it has {info.file_size:,} bytes and its "
            f"{info.tensor_count} tensors need {need} (a copy or download that did not finish); {_BAD_FILE}"
        )
    if info.context_length is not None and n_ctx > info.context_length:
        raise ConfigurationError(
            f"n_ctx={n_ctx:,} is more than the {info.context_length:,} tokens the model {path.name} was trained "
            f"for: use LocalModel(n_ctx=...) of at most {info.context_length}"
        )
    _check_memory(path, n_ctx, info)
    return info


_BAD_FILE = (
    "LocalModel(path=...) needs a complete GGUF model file that uses the ChatML template (a Qwen2.5 instruct "
    "model): copy or download it again"
)


def _check_memory(path: Path, n_ctx: int, info: _gguf.GgufInfo) -> None:
    """ConfigurationError when the KV cache and buffers of `n_ctx` tokens exceed the available memory; a
    warning when the weights do not fit beside them (they are paged in from disk: slow, but it works)."""
    kv, available = info.kv_cache_bytes(n_ctx), _gguf.available_memory()
    if kv is None or available is None or info.kv_bytes_per_token is None:
        return
    need = kv + info.compute_bytes()
    if need <= available:
        if need + info.file_size > available:
            logger.warning(
                "the local model %s needs about %s of memory with n_ctx=%d and %s are available: its weights "
                "will be read from disk again and again (slow); lower n_ctx or free memory",
                path.name, _gguf.gib(need + info.file_size), n_ctx, _gguf.gib(available),
            )  # fmt: skip
        return
    fits = (available - info.compute_bytes()) // info.kv_bytes_per_token // 1024 * 1024
    what = f"lower n_ctx (n_ctx={fits} fits)" if fits >= 512 else "use a smaller model (local:0.5b)"
    raise ConfigurationError(
        f"not enough memory for the local model {path.name} with n_ctx={n_ctx:,}: its KV cache and buffers "
        f"need about {_gguf.gib(need)} ({info.kv_bytes_per_token / 1024:,.0f} KiB a token of n_ctx), besides "
        f"{_gguf.gib(info.file_size)} of weights, and {_gguf.gib(available)} are available: {what}, or free memory"
    )


def _load_error(
    path: Path, n_ctx: int, info: _gguf.GgufInfo, exc: BaseException, *, assembled: bool
) -> ConfigurationError:
    """What llama.cpp's refusal of a file whose header looked right means, and what to do."""
    if isinstance(exc, MemoryError) or "context" in str(exc):  # "Failed to create llama_context"
        kv = info.kv_cache_bytes(n_ctx)
        size = f" ({_gguf.gib(kv)} for its KV cache)" if kv is not None else ""
        return ConfigurationError(
            f"llama.cpp could not set up the model file {path} with n_ctx={n_ctx:,}: {str(exc) or 'out of memory'}; "
            f"there is probably not enough memory{size}: lower n_ctx or free memory"
        )
    version = getattr(sys.modules.get("llama_cpp"), "__version__", "?")
    what = f"a GGUF v{info.version} file of architecture {info.architecture or 'unknown'!r}, {info.file_size:,} bytes"
    advice = (
        "its SHA-256 was verified when it was assembled, so llama-cpp-python is at fault: reinstall it with "
        "`pip install --force-reinstall 'thinkloop[local]'`"
        if assembled
        else f"check that llama-cpp-python {version} supports its architecture and quantisation (upgrade it with "
        "`pip install -U llama-cpp-python`), or use another GGUF file"
    )
    return ConfigurationError(f"llama.cpp could not load the model file {path} ({what}): {exc}; {advice}")


AMX_WARNING = (
    "llama.cpp was built with Intel AMX and this is a virtual machine: some lose the AMX tile state, and the "
    "process then dies with 'Illegal instruction' (SIGILL) in the middle of a prompt. If it does, rebuild "
    "llama-cpp-python without AMX (docs/local-model.md, 'AMX off')"
)


def _warn_if_amx_on_a_vm(system_info: Callable[[], Any], cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Warn when llama.cpp (its `llama_print_system_info`) uses AMX under a hypervisor; True when it warned."""
    try:
        info = system_info()
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            flags = next((line for line in f if line.startswith("flags")), "").split()
    except Exception:  # a check for a warning: never the reason a model does not load
        return False
    text = info.decode(errors="replace") if isinstance(info, bytes) else str(info)
    if "AMX_INT8 = 1" in text and "hypervisor" in flags:
        logger.warning(AMX_WARNING)
        return True
    return False


def _close_all() -> None:
    """Free the loaded models before interpreter shutdown (llama-cpp's `__del__` fails during it)."""
    with _LOAD_LOCK:
        runtimes = list(_RUNTIMES.values())
        _RUNTIMES.clear()
    for runtime in runtimes:
        if runtime.thread_lock.acquire(timeout=5):  # not while a generation still runs
            with contextlib.suppress(Exception):
                runtime.llm.close()
            runtime.thread_lock.release()


# ============================================================================================ generation


@dataclass(slots=True)
class _Generation:
    text: str = ""
    finish_reason: FinishReason = "unknown"
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True, slots=True)
class _Job:
    """One completion to run in the worker thread."""

    segments: list[Segment]
    stop: list[str]
    max_tokens: int
    temperature: float
    seed: int
    on_text: Callable[[str], object]
    cancel: threading.Event
    prompt_cache: PromptCache | None = (
        None  # where the state after the system prompt is kept between processes
    )


def _generate(runtime: _Runtime, job: _Job, provider: str) -> _Generation:
    """Run one completion (blocking: call it in a worker thread), streaming text to `job.on_text`."""
    with runtime.thread_lock:
        if not runtime.start(job):  # cancelled while it waited for the model: nobody wants its reply
            return _Generation()
        try:
            return _generate_now(runtime, job, provider)
        finally:
            runtime.finish()


def _generate_now(runtime: _Runtime, job: _Job, provider: str) -> _Generation:
    """The completion of a job that has the model (under `thread_lock`)."""
    llm = runtime.llm
    tokens = runtime.tokenize(job.segments)
    n_ctx = int(llm.n_ctx())
    if len(tokens) >= n_ctx:
        raise ContextOverflowError(
            f"the prompt has {len(tokens):,} tokens, more than the context window of {n_ctx:,}: "
            "lower the agent's max_context_tokens or load the model with a larger n_ctx",
            provider=provider,
            scope="generation",
            limit=n_ctx,
            prompt_tokens=len(tokens),
        )
    result = _Generation(prompt_tokens=len(tokens))
    try:
        _hold_system_prompt(runtime, job, tokens)
        result.text, result.finish_reason = _complete(llm, tokens, job)
    except (RuntimeError, ValueError, OSError, MemoryError) as exc:
        llm.reset()  # the KV cache may be half-written (or aborted): start the next prompt from scratch
        if job.cancel.is_set():  # aborted by `stop`: nobody wants its reply
            return result
        what = (
            "ran out of memory: lower n_ctx or max_output_tokens, or free memory"
            if isinstance(exc, MemoryError)
            else f"failed: {exc}"
        )
        raise ModelError(f"llama.cpp {what}", provider=provider, scope="generation") from exc
    end = 1 if result.finish_reason == "stop" else 0  # the stop token was generated too
    result.completion_tokens = len(llm.tokenize(result.text.encode("utf-8"), add_bos=False)) + end
    return result


SYSTEM_SEGMENTS = (
    5  # `render_chatml` starts with the system turn: <|im_start|>, "system\n", text, <|im_end|>, "\n"
)


def _hold_system_prompt(runtime: _Runtime, job: _Job, tokens: list[int]) -> None:
    """Before a completion: have the KV cache hold the system prompt's tokens — already there (an earlier
    request of this process), restored from the prompt cache, or read and then saved to it."""
    cache = job.prompt_cache
    if cache is None or len(job.segments) <= SYSTEM_SEGMENTS:
        return
    llm = runtime.llm
    size = len(runtime.tokenize(job.segments[:SYSTEM_SEGMENTS]))
    prefix = tokens[:size]
    if size >= len(tokens) or (llm.n_tokens >= size and llm.input_ids[:size].tolist() == prefix):
        return
    key = cache.key(runtime.path, int(llm.n_ctx()), prefix)
    if cache.restore(llm, key, prefix):
        logger.debug("prompt cache: restored %d system prompt tokens from %s", size, cache.directory)
        return
    llm.reset()
    llm.eval(prefix)
    cache.save(llm, key)
    logger.debug("prompt cache: read %d system prompt tokens, saved to %s", size, cache.directory)


def _complete(llm: Any, tokens: list[int], job: _Job) -> tuple[str, FinishReason]:
    """Stream one raw completion of `tokens`; stops early when `job.cancel` is set."""
    pieces: list[str] = []
    finish: FinishReason = "unknown"
    stream = llm.create_completion(
        tokens,
        max_tokens=job.max_tokens,
        temperature=job.temperature,
        stop=job.stop,
        seed=job.seed,
        stream=True,
    )
    try:
        for chunk in stream:
            choice = chunk["choices"][0]
            if choice["text"]:
                pieces.append(choice["text"])
                job.on_text(choice["text"])
                if "\n" in choice["text"] and (looped := _loop_start(pieces)) is not None:
                    return looped, "stop"
            if choice.get("finish_reason"):
                finish = "length" if choice["finish_reason"] == "length" else "stop"
            if job.cancel.is_set():
                break
    finally:
        stream.close()
    return "".join(pieces), finish


REPEATS = 4
"""A reply whose last `REPEATS` lines are one line repeated is stuck: its generation stops there."""


def _loop_start(pieces: list[str]) -> str | None:
    """The text up to the first copy of a line the reply repeats `REPEATS` times in a row, that copy
    included, or None. The 0.5B model wrote `Thought: 479.19 EUR = 479.19 EUR` until its 1,024-token limit
    (98 s on 2 cores) and the whole stutter became the answer."""
    text = "".join(pieces)
    lines = text.split("\n")[:-1]  # complete lines only
    if len(lines) < REPEATS:
        return None
    last = lines[-1].strip()
    if len(last) < 3 or any(line.strip() != last for line in lines[-REPEATS:]):
        return None
    return "\n".join(lines[: len(lines) - REPEATS + 1])


# ================================================================================================ model


class LocalModel(Model):
    """The embedded Qwen2.5-Coder-Instruct model, run in-process by llama.cpp.

    Args:
        variant: `"1.5b"` (the default) or `"0.5b"` (smaller, faster, weaker); model names
            (`"qwen2.5-coder-0.5b"`) are accepted too.
        path: an explicit GGUF file to load instead of the assembled weights of `variant`
            (it must use the ChatML template, like every Qwen2.5 instruct model).
        n_ctx: the context window in tokens (prompt + reply), 8192 by default.
        n_threads: CPU threads for llama.cpp; by default the CPUs this process may use (its affinity, and
            a container's CPU quota).
        seed: the sampling seed, fixed so that the same prompt gives the same reply.
        max_output_tokens: the most tokens one reply may have (1,024 by default; the request's own
            `max_output_tokens` applies when smaller), so a reply stuck repeating itself ends in about a
            minute on 2 cores instead of five; one repeating a line 4 times in a row ends there, with
            one copy of the line kept.
        prompt_cache: keep llama.cpp's state after the system prompt on disk, so that a new process
            does not read it again (~10 s on 2 cores): True (the default) for `prompt-cache/` beside the
            weights, a directory, or False. `THINKLOOP_PROMPT_CACHE` changes the default: `0` for none, or a
            directory.

    Loading happens on the first request (or `await model.load()`): the weights are assembled from
    their installed part packages if needed (never downloaded), then loaded once per process.
    """

    provider = "local"

    def __init__(
        self,
        variant: str | None = None,
        *,
        path: str | os.PathLike[str] | None = None,
        n_ctx: int = DEFAULT_N_CTX,
        n_threads: int | None = None,
        seed: int = DEFAULT_SEED,
        max_output_tokens: int = DEFAULT_MAX_OUTPUT_TOKENS,
        prompt_cache: bool | str | os.PathLike[str] = True,
    ) -> None:
        if max_output_tokens < 16:
            raise ConfigurationError(f"max_output_tokens must be at least 16, not {max_output_tokens}")
        if n_ctx < 512:
            raise ConfigurationError(f"n_ctx must be at least 512 tokens, not {n_ctx}")
        self.variant = _weights.get_variant(variant)
        self.path = Path(path).expanduser() if path is not None else None
        self._file = self.path.absolute() if self.path is not None else None  # as the run was started from
        self.name = self.path.stem if self.path is not None else self.variant.model_name
        self.n_ctx = n_ctx
        self.n_threads = n_threads or available_cpus()
        self.seed = seed
        self.max_output_tokens = max_output_tokens
        self.prompt_cache = _prompt_cache_of(prompt_cache)
        self.capabilities = ModelCapabilities(
            tools=False, streaming=True, parallel_tool_calls=False, prefill=True, context_window=n_ctx
        )
        self._runtime: _Runtime | None = None

    @property
    def spec(self) -> str:
        """`local:<variant>`, or `local:<file>` for a model file given as `path` (both resolve again)."""
        return f"local:{self._file}" if self._file is not None else f"local:{self.name}"

    # ------------------------------------------------------------------------------------ loading

    @property
    def loaded(self) -> bool:
        return self._runtime is not None

    async def load(self, progress: _weights.ProgressCallback | None = None) -> None:
        """Assemble the weights if needed and load the model (in a worker thread; seconds)."""
        if self._runtime is None:
            self._runtime = await asyncio.to_thread(self._load_sync, progress)

    def _load_sync(self, progress: _weights.ProgressCallback | None = None) -> _Runtime:
        _import_llama()  # fail fast, before assembling a gigabyte, when the runtime is missing
        path = self._weights_path(progress)
        if progress is not None:
            progress("load", 0, 1)
        runtime = _load_runtime(path, self.n_ctx, self.n_threads, self.seed, assembled=self.path is None)
        if progress is not None:
            progress("load", 1, 1)
        return runtime

    def _weights_path(self, progress: _weights.ProgressCallback | None) -> Path:
        if self.path is None:
            return _weights.assemble(self.variant.key, progress)
        if self.path.is_dir():
            raise ConfigurationError(f"the local model file {self.path} is a directory, not a GGUF file")
        if not self.path.is_file():
            raise ConfigurationError(f"the local model file {self.path} does not exist")
        return self.path

    # ------------------------------------------------------------------------------------- requests

    async def request(self, request: ModelRequest) -> ModelResponse:
        response: ModelResponse | None = None
        async for chunk in self.stream(request):
            if isinstance(chunk, ModelResponse):
                response = chunk
        assert response is not None
        return response

    async def stream(self, request: ModelRequest) -> AsyncIterator[StreamChunk]:
        """Generate in a worker thread; text deltas come through a queue, then the final response."""
        await self.load()
        runtime = self._runtime
        assert runtime is not None
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str | None] = asyncio.Queue()
        job = _Job(
            segments=render_chatml(request.messages, request.tools, request.prefill),
            stop=[*request.settings.stop, *STOP_TOKENS],
            max_tokens=min(request.settings.max_output_tokens, self.max_output_tokens),
            temperature=request.settings.temperature,
            seed=self.seed,
            on_text=lambda text: loop.call_soon_threadsafe(queue.put_nowait, text),
            cancel=threading.Event(),
            prompt_cache=self.prompt_cache,
        )
        async with runtime.async_lock():
            task = asyncio.ensure_future(asyncio.to_thread(_generate, runtime, job, self.provider))
            task.add_done_callback(lambda _: queue.put_nowait(None))
            try:
                while (text := await queue.get()) is not None:
                    yield TextDelta(text=text)
                generation = await task
            finally:
                if not task.done():  # cancelled or abandoned: stop generating (or reading the prompt)
                    runtime.stop(job)
                    task.add_done_callback(_consume_result)
        yield self._response(request, generation)

    def _response(self, request: ModelRequest, generation: _Generation) -> ModelResponse:
        text, calls = generation.text, list[ToolCall]()
        if request.tools:
            text, calls = parse_tool_calls(text, [t.name for t in request.tools])
        usage = Usage(
            input_tokens=generation.prompt_tokens, output_tokens=generation.completion_tokens, requests=1
        )
        finish = "tool_calls" if calls else generation.finish_reason
        return ModelResponse(
            text=text, tool_calls=calls, usage=usage, model_name=self.name, finish_reason=finish
        )

    # --------------------------------------------------------------------------------------- tokens

    def count_tokens(self, messages: Sequence[Message]) -> int | None:
        """Tokens of `messages` in the ChatML prompt, by the model's own tokenizer (once it is loaded)."""
        if self._runtime is None:
            return None
        segments = render_chatml(messages, scratchpad=False)[:-2]  # without the open assistant turn
        return len(self._runtime.tokenize(segments))


def available_cpus(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The CPUs this process may use: its affinity (`taskset`), lowered to a cgroup v2 CPU quota rounded up
    (a container given `--cpus=2` on a 64-core host), at least 1. `os.cpu_count()` is the host's: llama.cpp
    threads beyond the quota wait for each other at every layer."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cpus = os.cpu_count() or 1
    try:
        quota, period = Path(cpu_max).read_text(encoding="ascii").split()[:2]
        cpus = min(cpus, max(-(-int(quota) // int(period)), 1))
    except (OSError, ValueError):  # no cgroup v2 here, or "max": no quota
        pass
    return max(cpus, 1)


def _prompt_cache_of(setting: bool | str | os.PathLike[str]) -> PromptCache | None:
    """`prompt_cache=True` follows `$THINKLOOP_PROMPT_CACHE`: "0" (or false/no/off) for none, a directory,
    or, unset, `prompt-cache/` beside the assembled weights."""
    if setting is False:
        return None
    if setting is not True:
        return PromptCache(Path(setting).expanduser())
    chosen = os.environ.get("THINKLOOP_PROMPT_CACHE", "").strip()
    if chosen.lower() in ("0", "false", "no", "off"):
        return None
    return PromptCache(Path(chosen).expanduser() if chosen else _weights.models_dir().parent / "prompt-cache")


def _consume_result(task: asyncio.Future[Any]) -> None:
    """Retrieve an abandoned generation's outcome so asyncio does not report it as never retrieved."""
    with contextlib.suppress(BaseException):
        task.result()
