"""The thinkloop server (SPEC §13.2): start runs over HTTP, follow them over WebSocket, approve from a page.

    from thinkloop import Agent
    from thinkloop.safety import PendingApprovals, SafetyController
    from thinkloop.server import create_app
    from thinkloop.stores import SQLiteStore

    agent = Agent("local", tools=[...], store=SQLiteStore("runs.db"),
                  safety=SafetyController("balanced", approval=PendingApprovals()))
    app = create_app(agent, token=os.environ["THINKLOOP_SERVER_TOKEN"])  # or `thinkloop serve`

Needs the `server` extra (FastAPI, uvicorn, websockets). See docs/server.md for the API.
"""

from ._app import ApprovalAnswer as ApprovalAnswer
from ._app import RunRequest as RunRequest
from ._app import create_app as create_app
from ._runs import RunManager as RunManager

__all__ = ["ApprovalAnswer", "RunManager", "RunRequest", "create_app"]
