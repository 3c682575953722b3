"""The layered system prompt (SPEC §12): role, environment, tools (ReAct), rules, experience."""

from __future__ import annotations

from collections.abc import Sequence

DEFAULT_ROLE = "You are a capable assistant that completes the user's task, using tools when they help."

DEFAULT_RULES: tuple[str, ...] = (
    "Use a tool only when it helps; never invent tool results.",
    "When a tool fails, read the error and change the call instead of repeating it.",
    "When you know the answer, give it directly and stop.",
)

FINAL_ANSWER_PROMPT = (
    "You must stop now: {reason} Do not call any tools. Using only what you have learned so far, give "
    "your best final answer to the task: {goal}\nIf the task is not complete, say what was done and what is "
    "missing."
)


def system_prompt(
    *,
    role: str = "",
    environment: str = "",
    tools: str = "",
    rules: Sequence[str] = DEFAULT_RULES,
    experience: Sequence[str] = (),
) -> str:
    """Join the non-empty layers, each under its own heading."""
    layers = [role.strip() or DEFAULT_ROLE]
    if environment.strip():
        layers.append(f"## Environment\n{environment.strip()}")
    if tools.strip():
        layers.append(f"## Tools\n{tools.strip()}")
    if rules:
        layers.append("## Rules\n" + "\n".join(f"- {r}" for r in rules))
    if experience:
        layers.append("## Lessons from earlier runs\n" + "\n".join(f"- {e}" for e in experience))
    return "\n\n".join(layers)


def final_answer_prompt(template: str | None, *, reason: str, goal: str) -> str:
    return (template or FINAL_ANSWER_PROMPT).format(reason=reason, goal=goal)
