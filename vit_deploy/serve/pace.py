"""`BodyPace`: the body timeout and minimum body rate of `vit-deploy serve`, as ASGI
middleware, for servers whose connections are not ours.

`serve` enforces them in its own connection protocol (`connections.GuardedH11Protocol`).
Behind Ray Serve the connections are the proxy's: it streams a body into the replica as it
arrives, and the request holds one of the replica's `max_ongoing_requests` slots all the
while, so 33 clients that sent headers and a few bytes kept every endpoint waited, /health
too. Here each body is read against the same `Limits`: past the body timeout, or under the
minimum rate over a window, the app's next receive is a disconnect and the client gets
408 with the reason (the app's own answer, if any, is dropped), and the slot is free."""

from __future__ import annotations

import asyncio
import json
from typing import Any, Awaitable, Callable

from vit_deploy.serve.connections import TIMED_OUT
from vit_deploy.serve.limits import Limits

Message = dict[str, Any]
ASGIApp = Callable[[dict, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]],
                   Awaitable[None]]


class BodyPace:
    """ASGI middleware: every HTTP request body within `limits` (body_timeout_s from the
    first receive, min_body_rate bytes/s over each body_window_s), else 408."""

    def __init__(self, app: ASGIApp, limits: Limits | None = None):
        self.app, self.limits = app, limits or Limits()

    async def __call__(self, scope: dict, receive: Callable[[], Awaitable[Message]],
                       send: Callable[[Message], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limits, loop = self.limits, asyncio.get_running_loop()
        start = loop.time()
        state: dict[str, Any] = {"window": start, "bytes": 0, "done": False, "late": None,
                                 "started": False, "pending": None}

        async def paced() -> Message:
            while not state["done"] and state["late"] is None:
                now = loop.time()
                if now >= start + limits.body_timeout_s:
                    state["late"] = (f"the request body did not arrive within "
                                     f"{limits.body_timeout_s:g} s of its headers (the body "
                                     f"timeout)")
                    break
                if now >= state["window"] + limits.body_window_s:
                    if state["bytes"] < limits.min_body_rate * limits.body_window_s:
                        state["late"] = (f"the request body arrived at under "
                                         f"{limits.min_body_rate:g} bytes/s ({state['bytes']} "
                                         f"bytes in {limits.body_window_s:g} s; the minimum "
                                         f"body rate)")
                        break
                    state["window"], state["bytes"] = now, 0
                until = min(start + limits.body_timeout_s, state["window"] + limits.body_window_s)
                # one receive outstanding across windows: never cancelled, no message lost
                pending = state["pending"] or asyncio.ensure_future(receive())
                done, _ = await asyncio.wait({pending}, timeout=max(0.0, until - now))
                if not done:
                    state["pending"] = pending
                    continue  # checked at the top
                state["pending"] = None
                message = pending.result()
                if message["type"] == "http.request":
                    state["bytes"] += len(message.get("body", b""))
                    state["done"] = not message.get("more_body", False)
                return message
            if state["late"] is not None:
                scope[TIMED_OUT] = "body"
                return {"type": "http.disconnect"}
            return await receive()  # after the body: the client leaving, as before

        async def guarded_send(message: Message) -> None:
            if state["late"] is not None and not state["started"]:
                return  # the 408 below answers this request
            state["started"] = state["started"] or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, paced, guarded_send)
        except Exception:
            if state["late"] is None or state["started"]:
                raise
        finally:
            if state["pending"] is not None:
                state["pending"].cancel()
        if state["late"] is not None and not state["started"]:
            body = json.dumps({"error": state["late"]}).encode()
            await send({"type": "http.response.start", "status": 408,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"connection", b"close"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
