"""The public surface is deliberate: exactly these names are exported (adding one is an API decision)."""

from __future__ import annotations

import subprocess
import sys
import types

import thinkloop

PUBLIC = {
    "Agent", "Budget", "ConcurrencyError", "ConfigurationError", "ContextManager", "ContextOverflowError", "Event", "GuardConfig",
    "Message", "Model", "ModelError", "ModelRequest", "ModelResponse", "ModelRetryableError", "ModelSettings",
    "Price", "PriceTable", "RiskLevel", "RunError", "RunResult", "RunState", "StateError", "StopReason",
    "ThinkloopError", "TokenCounter", "Tool", "ToolCall", "ToolDefinition", "ToolDiscovery", "ToolExecutionError",
    "ToolContext", "ToolRegistry", "ToolsUnsupportedError", "Usage", "UserError", "tool", "validate_history",
}  # fmt: skip


def test_exported_names_are_exactly_the_intended_ones() -> None:
    exported = {
        name
        for name in dir(thinkloop)
        if not name.startswith("_") and not isinstance(getattr(thinkloop, name), types.ModuleType)
    }
    assert exported == PUBLIC


def test_error_hierarchy() -> None:
    assert issubclass(thinkloop.ConfigurationError, thinkloop.UserError)
    assert issubclass(thinkloop.UserError, thinkloop.ThinkloopError)
    for run_error in (
        thinkloop.ModelError,
        thinkloop.StateError,
        thinkloop.ConcurrencyError,
        thinkloop.ToolExecutionError,
    ):
        assert issubclass(run_error, thinkloop.RunError) and issubclass(run_error, thinkloop.ThinkloopError)
    assert issubclass(thinkloop.ModelRetryableError, thinkloop.ModelError)
    assert issubclass(thinkloop.ContextOverflowError, thinkloop.ModelError)
    assert not issubclass(thinkloop.ContextOverflowError, thinkloop.ModelRetryableError)
    assert issubclass(thinkloop.ToolsUnsupportedError, thinkloop.ModelError)
    assert not issubclass(thinkloop.ToolsUnsupportedError, thinkloop.ModelRetryableError)


def test_import_does_not_load_heavy_dependencies() -> None:
    code = "import sys, thinkloop; print(sorted(m for m in ('openai', 'llama_cpp', 'psycopg', 'asyncssh', 'fastapi', 'rich', 'typer') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_feature_modules_export_exactly_their_intended_names() -> None:
    import importlib

    expected = {
        "thinkloop.events": {
            "AnswerDelta", "AnswerReset", "ApprovalRequested", "Decision", "Done", "ErrorEvent", "ErrorKind", "Event", "Hint",
            "ModeSwitched", "ModelAttempt", "ModelCalled", "PlanCreated", "Progress", "RunResult", "RunStarted",
            "Status", "TaskFinished", "TaskSkipped", "TaskStarted", "Thought", "ToolCallEvent", "ToolResultEvent",
            "event_from_json",
        },
        "thinkloop.experience": {
            "Learner", "Lesson", "LessonBook", "RunRecord", "ToolUse", "model_distiller", "rule_lessons",
        },
        "thinkloop.tracing": {"OpenTelemetryTracing", "json_lines_provider"},
        "thinkloop.distributed": {"Job", "JobQueue", "JobStatus", "Worker", "run_or_resume"},
        "thinkloop.celery": {"AgentTask", "TaskResult", "agent_task", "task_result"},
        "thinkloop.server": {"ApprovalAnswer", "RunManager", "RunRequest", "create_app"},
    }  # fmt: skip
    for name, names in expected.items():
        module = importlib.import_module(name)
        assert set(module.__all__) == names, name
        assert all(hasattr(module, n) for n in names), name
