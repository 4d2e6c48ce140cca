"""What every route of one served app shares: the agent, its session store, the keys."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Any

from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp

from raf._agent.agent import Agent, enter_resources
from raf._sessions.base import Session
from raf._sessions.stores import open_store
from raf._values.options import AgentRunOptions
from raf.serve._http import HttpError
from raf.serve._sessions import Keys, MemoryStore, session_key

__all__: list[str] = []

#: A route's handler: the request in, an ASGI app out (a Starlette response, or a stream).
Handler = Callable[["Served", Request], Awaitable[ASGIApp]]


class Served:
    """What every route of one app shares: the agent, the store, the keys."""

    def __init__(
        self,
        agent: Agent,
        store: Any,
        keys: Keys,
        max_body: int,
        options: AgentRunOptions,
        public_url: str | None = None,
    ) -> None:
        self.agent = agent
        #: The address the app is reached at from outside (``https://host/prefix``), for
        #: what names its own URLs (the A2A card); ``None``: the address it is bound to.
        self.public_url = public_url
        self.options = options
        self.model = agent.name or "raf-agent"
        self._db = store if isinstance(store, (str, os.PathLike)) else None
        self.store: Any = MemoryStore() if store is None else None if self._db else store
        self.keys = keys
        self.max_body = max_body
        #: What a protocol's route needs running while the app serves (the MCP SDK's
        #: session manager, the A2A SDK's task registry), entered after the store.
        self.lifespans: list[Callable[[], AbstractAsyncContextManager[Any]]] = []

    @asynccontextmanager
    async def lifespan(self, manage_agent: bool) -> AsyncIterator[None]:
        async with AsyncExitStack() as resources:
            if self._db is not None:
                opened = await open_store(self._db)
                resources.push_async_callback(opened.aclose)
                self.store = opened
            if manage_agent:
                await enter_resources(self.agent, resources)
            for running in self.lifespans:
                await resources.enter_async_context(running())
            yield

    async def session(
        self, request: Request, session_id: str, *, keep: bool = True, unnamed: bool = False
    ) -> Session:
        """The stored session a request names, under the caller's key.

        ``keep=False`` for a request that only reads: in this process's own store
        an unknown id then gets an empty session that is not kept. ``unnamed``: the
        server named it (a Responses request without one), and this process's own
        store keeps only the last ones of those (:data:`MAX_UNNAMED` of each key).
        """
        return await self.session_of(
            request.state.key_scope, session_id, keep=keep, unnamed=unnamed
        )

    async def session_of(
        self, key_scope: str, session_id: str, *, keep: bool = True, unnamed: bool = False
    ) -> Session:
        """The stored session ``session_id`` under the key scope ``key_scope`` (see
        :meth:`Keys.scope`): for a protocol whose run outlives its request (A2A)."""
        if self.store is None:
            raise HttpError(503, "the session store is not open (no lifespan)", "server_error")
        stored = session_key(key_scope, session_id)
        if isinstance(self.store, MemoryStore):
            if not keep:
                return self.store.find(stored)
            return await self.store.get(stored, unnamed=unnamed, scope=key_scope)
        session: Session = await self.store.get(stored)
        return session

    def route(self, path: str, method: str, handler: Handler, *, keyed: bool = True) -> Route:
        """A route of this app: with ``keyed``, the caller's key is checked first."""

        async def endpoint(request: Request) -> ASGIApp:
            if keyed:
                request.state.key_scope = self.keys.scope(request.scope)
            return await handler(self, request)

        return Route(path, endpoint, methods=[method])
