"""Serve an agent over HTTP (extra ``raf-agents[serve]``): ``raf.serve.app(agent)`` is an ASGI app.

It speaks the OpenAI chat completions protocol (``POST /v1/chat/completions``,
``GET /v1/models``), so any OpenAI client can call the agent as a model, and
the AG-UI protocol (``POST /ag-ui``); ``GET /`` is a chat page and ``GET
/healthz`` says whether the session store answers. A client that goes away
mid-stream (a closed tab, the page's Stop button, a dropped connection) is an
*early close* of the run, never a cancellation: every entered provider gets
:class:`raf.StreamClosedError` with the partial answer, and a history
provider with ``persist_partial=True`` keeps it. Run it with any ASGI server
(``uvicorn``), or ``raf serve CONFIG``; :class:`ServeOptions` says how it
serves. See docs/serving.md.
"""

from raf.serve._app import app
from raf.serve._options import ServeOptions

__all__ = ["ServeOptions", "app"]

app.__module__ = "raf.serve"
ServeOptions.__module__ = "raf.serve"
