"""The typed events of a run (SPEC §8.1): import them from here.

Every event has `type` (its name on the wire, e.g. `"tool_result"`), `run_id`, `seq` (its number in the
run's event log) and `time`. `Event` is the union of them all; `event_from_json()` parses one.
"""

from ._events import AnswerDelta as AnswerDelta
from ._events import AnswerReset as AnswerReset
from ._events import ApprovalRequested as ApprovalRequested
from ._events import Decision as Decision
from ._events import Done as Done
from ._events import ErrorEvent as ErrorEvent
from ._events import ErrorKind as ErrorKind
from ._events import Event as Event
from ._events import Hint as Hint
from ._events import ModelAttempt as ModelAttempt
from ._events import ModelCalled as ModelCalled
from ._events import ModeSwitched as ModeSwitched
from ._events import PlanCreated as PlanCreated
from ._events import Progress as Progress
from ._events import RunResult as RunResult
from ._events import RunStarted as RunStarted
from ._events import Status as Status
from ._events import TaskFinished as TaskFinished
from ._events import TaskSkipped as TaskSkipped
from ._events import TaskStarted as TaskStarted
from ._events import Thought as Thought
from ._events import ToolCallEvent as ToolCallEvent
from ._events import ToolResultEvent as ToolResultEvent
from ._events import event_from_json as event_from_json

__all__ = [
    "AnswerDelta", "AnswerReset", "ApprovalRequested", "Decision", "Done", "ErrorEvent", "ErrorKind", "Event", "Hint",
    "ModeSwitched", "ModelAttempt", "ModelCalled", "PlanCreated", "Progress", "RunResult", "RunStarted",
    "Status", "TaskFinished", "TaskSkipped", "TaskStarted", "Thought", "ToolCallEvent", "ToolResultEvent",
    "event_from_json",
]  # fmt: skip
