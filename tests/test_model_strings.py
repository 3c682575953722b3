"""Model strings (`Agent(model="...")`, `$THINKLOOP_MODEL`, `--model`): what a wrong one says."""

from __future__ import annotations

from pathlib import Path

import pytest

from thinkloop import Agent, ConfigurationError
from thinkloop.models import resolve_model
from thinkloop.models._local import LocalModel
from thinkloop.models._openai import OpenAIModel

VALID = "use 'local', 'local:0.5b', 'openai:MODEL', 'script:FILE' or 'router:SPEC,SPEC', or pass a Model"


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("opneai:gpt-4o", "unknown model 'opneai:gpt-4o' (did you mean 'openai:gpt-4o'?)"),
        ("locl", "unknown model 'locl' (did you mean 'local'?)"),
        ("Routr:a,b", "unknown model 'Routr:a,b' (did you mean 'router:a,b'?)"),
        ("gpt-4o-mini", "unknown model 'gpt-4o-mini' (did you mean 'openai:gpt-4o-mini'?)"),
        ("ollama:llama3", "unknown model 'ollama:llama3': there is no provider 'ollama'"),
    ],
)
def test_an_unknown_provider_or_a_typo_says_what_was_meant_and_what_is_valid(spec: str, said: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        resolve_model(spec)
    message = str(info.value)
    assert message.startswith(said), message
    assert VALID in message


def test_a_server_of_another_name_is_pointed_to_the_openai_compatible_adapter() -> None:
    with pytest.raises(ConfigurationError) as info:
        resolve_model("ollama:llama3")
    assert (
        "An OpenAI-compatible server (Ollama, vLLM, DeepSeek …) is 'openai:llama3' with OPENAI_BASE_URL set to "
        "its /v1 URL, or OpenAIModel('llama3', base_url=..., provider='ollama')"
    ) in str(info.value)


@pytest.mark.parametrize(
    ("spec", "said"),
    [
        ("openai:", "'openai:' needs a model name, e.g. 'openai:gpt-4o-mini'"),
        ("openai:  ", "'openai:' needs a model name, e.g. 'openai:gpt-4o-mini'"),
        ("router:", "'router:' needs at least one model string, e.g. 'router:openai:gpt-4o-mini,local'"),
        ("router: , ", "'router:' needs at least one model string, e.g. 'router:openai:gpt-4o-mini,local'"),
        ("script:", "'script:' needs a JSON file of replies, e.g. 'script:replies.json'"),
    ],
)
def test_a_provider_without_its_name_says_what_to_add(spec: str, said: str) -> None:
    with pytest.raises(ConfigurationError, match="^" + said.replace("(", r"\(").replace(")", r"\)")):
        resolve_model(spec)


def test_a_script_that_is_a_directory_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="script file .* is a directory, not a JSON file of replies"):
        resolve_model(f"script:{tmp_path}")


def test_spaces_around_the_model_name_are_not_part_of_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    model = resolve_model("openai: gpt-4o-mini ")
    assert isinstance(model, OpenAIModel) and model.name == "gpt-4o-mini"


def test_a_blank_model_string_is_no_model_string(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THINKLOOP_MODEL", raising=False)
    assert isinstance(resolve_model("  "), LocalModel)
    monkeypatch.setenv("THINKLOOP_MODEL", "local:0.5b")
    assert resolve_model(" ").name == "qwen2.5-coder-0.5b"


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("opneai:gpt-4o", "$THINKLOOP_MODEL is 'opneai:gpt-4o': unknown model 'opneai:gpt-4o' (did you mean"),
        ("openai:", "$THINKLOOP_MODEL is 'openai:': 'openai:' needs a model name"),
        ("local:xyz", "$THINKLOOP_MODEL is 'local:xyz': unknown local model variant 'xyz'"),
    ],
)
def test_a_wrong_thinkloop_model_variable_is_named_as_the_source(
    value: str, said: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("THINKLOOP_MODEL", value)
    with pytest.raises(ConfigurationError) as info:
        resolve_model(None)
    assert str(info.value).startswith(said), str(info.value)
    assert "set $THINKLOOP_MODEL to a valid model string, or unset it for 'local'" in str(info.value)


def test_a_misspelt_thinkloop_model_variable_is_refused_when_the_agent_is_made(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """It failed at the first run, far from the line that made the agent, as a misspelt model string did."""
    monkeypatch.setenv("THINKLOOP_MODEL", "opneai:gpt-4o")
    for named in (None, " "):
        with pytest.raises(ConfigurationError) as info:
            Agent(named)
        assert str(info.value).startswith("$THINKLOOP_MODEL is 'opneai:gpt-4o': unknown model"), str(
            info.value
        )
    Agent("local:0.5b")  # a model named: the variable is not read
    monkeypatch.setenv("THINKLOOP_MODEL", "router:local,gpt-4o")
    with pytest.raises(ConfigurationError, match="THINKLOOP_MODEL is 'router:local,gpt-4o'"):
        Agent()
    monkeypatch.setenv("THINKLOOP_MODEL", "  ")
    Agent()  # blank: the local model, nothing to refuse


def test_unknown_local_variants_list_the_valid_ones() -> None:
    with pytest.raises(ConfigurationError) as info:
        resolve_model("local:xyz")
    assert str(info.value) == (
        "unknown local model variant 'xyz': use one of '1.5b' (qwen2.5-coder-1.5b), '0.5b' (qwen2.5-coder-0.5b)"
    )
    assert resolve_model("local:0.5B").name == "qwen2.5-coder-0.5b"


@pytest.mark.parametrize("spec", [5, 2.5, object()])
def test_something_that_is_no_model_is_a_configuration_error(spec: object) -> None:
    with pytest.raises(ConfigurationError) as info:
        resolve_model(spec)  # type: ignore[arg-type]
    assert f"a model must be a model string, a Model or a list of them, not {spec!r}" in str(info.value)


def test_a_local_model_of_a_file_is_named_by_a_string_that_resolves_to_it_again(tmp_path: Path) -> None:
    """Its string was 'local:<file stem>', which named no variant: a stored run of it could not be resumed
    from the CLI ('unknown local model variant')."""
    model = LocalModel(path=tmp_path / "qwen2.5-7b-instruct-q4_k_m.gguf")
    assert model.spec == f"local:{tmp_path / 'qwen2.5-7b-instruct-q4_k_m.gguf'}"
    assert model.name == "qwen2.5-7b-instruct-q4_k_m"  # what the price table and events name
    again = resolve_model(model.spec)
    assert isinstance(again, LocalModel) and again.path == model.path and again.spec == model.spec
    relative = LocalModel(path="models/mine.gguf")
    assert relative.spec == f"local:{Path.cwd() / 'models' / 'mine.gguf'}"  # resumable from anywhere
    home = resolve_model("local:~/models/mine.gguf")
    assert isinstance(home, LocalModel) and home.path == Path("~/models/mine.gguf").expanduser()
    assert resolve_model("local:0.5b").spec == "local:qwen2.5-coder-0.5b"
