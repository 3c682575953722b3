"""thinkloop: a production-grade engine for LLM agents (Think → Act → Observe)."""

from ._agent import Agent as Agent
from ._budget import Budget as Budget
from ._budget import Price as Price
from ._budget import PriceTable as PriceTable
from ._context import ContextManager as ContextManager
from ._context import validate_history as validate_history
from ._discovery import ToolDiscovery as ToolDiscovery
from ._errors import ConcurrencyError as ConcurrencyError
from ._errors import ConfigurationError as ConfigurationError
from ._errors import ContextOverflowError as ContextOverflowError
from ._errors import ModelError as ModelError
from ._errors import ModelRetryableError as ModelRetryableError
from ._errors import RunError as RunError
from ._errors import StateError as StateError
from ._errors import ThinkloopError as ThinkloopError
from ._errors import ToolExecutionError as ToolExecutionError
from ._errors import ToolsUnsupportedError as ToolsUnsupportedError
from ._errors import UserError as UserError
from ._events import Event as Event
from ._events import RunResult as RunResult
from ._guards import GuardConfig as GuardConfig
from ._messages import Message as Message
from ._messages import ModelRequest as ModelRequest
from ._messages import ModelResponse as ModelResponse
from ._messages import ModelSettings as ModelSettings
from ._messages import ToolCall as ToolCall
from ._messages import ToolDefinition as ToolDefinition
from ._messages import Usage as Usage
from ._risk import RiskLevel as RiskLevel
from ._state import RunState as RunState
from ._state import StopReason as StopReason
from ._tokens import TokenCounter as TokenCounter
from ._tools import Tool as Tool
from ._tools import ToolContext as ToolContext
from ._tools import ToolRegistry as ToolRegistry
from ._tools import tool as tool
from .models import Model as Model

__version__ = "0.1.0"
