"""polygw -- thin Python client of the polygw sidecar.

The sidecar governs LLM API calls for every process on the host; this
package only speaks its protocol (msgpack-RPC over a Unix socket,
proto/PROTOCOL.md): no retries, limits or other governance happen here.

    import polygw

    with polygw.Client() as pgw:                  # $POLYGW_SOCKET or /run/polygw/polygw.sock
        res = pgw.call("chat", {"model": "gpt-4o-mini",
                                "messages": [{"role": "user", "content": "Say hi"}]})
        print(res["body"]["choices"][0]["message"]["content"])

See README.md for streaming, cancellation, tasks and errors, and
polygw.graph for agent-graph nodes governed by a task (stop and resume).
"""

from .aio import AsyncCallStream, AsyncClient, AsyncTask
from .client import CallStream, Client, Task
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all
from .protocol import DEFAULT_SOCKET

__version__ = "0.1.0"

__all__ = ["Client", "AsyncClient", "CallStream", "AsyncCallStream", "Task", "AsyncTask",
           "DEFAULT_SOCKET", "__version__"] + list(_errors_all)
