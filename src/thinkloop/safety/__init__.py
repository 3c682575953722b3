"""Safety levels, human approval and the shell-command classifier (SPEC §6).

- `classify_command(command)` rates a shell command (`CommandRisk`: level, reasons, parsed).
- `SafetyPolicy` is the configuration: mode, deny/allow lists, per-tool rules.
- `SafetyController(policy, approval=...)` is the gate every tool call passes: `Agent(safety=...)`.
- `console_approval()` asks the person at the terminal (the CLI's approval function).
"""

from .._risk import RiskLevel as RiskLevel
from .._state import ApprovalRecord as ApprovalRecord
from ._classifier import CommandRisk as CommandRisk
from ._classifier import classify_command as classify_command
from ._controller import ApprovalDecision as ApprovalDecision
from ._controller import ApprovalFunction as ApprovalFunction
from ._controller import ApprovalRequest as ApprovalRequest
from ._controller import PendingApprovals as PendingApprovals
from ._controller import SafetyController as SafetyController
from ._controller import approval_key as approval_key
from ._controller import console_approval as console_approval
from ._policy import Evaluation as Evaluation
from ._policy import SafetyMode as SafetyMode
from ._policy import SafetyPolicy as SafetyPolicy
from ._policy import ShellCommandRisk as ShellCommandRisk
from ._policy import ToolRule as ToolRule
from ._policy import command_risk as command_risk

__all__ = [
    "ApprovalDecision",
    "ApprovalFunction",
    "ApprovalRecord",
    "ApprovalRequest",
    "CommandRisk",
    "Evaluation",
    "PendingApprovals",
    "RiskLevel",
    "SafetyController",
    "SafetyMode",
    "SafetyPolicy",
    "ShellCommandRisk",
    "ToolRule",
    "approval_key",
    "classify_command",
    "command_risk",
    "console_approval",
]
