"""BodyPace (vit_deploy/serve/pace.py), the body timeout and minimum rate of `serve` as ASGI
middleware (what a Ray Serve replica reads bodies with), driven directly: a body in chunks
at a chosen pace into a small app that reads it all and answers 200. On a real cluster:
tests/serve/test_ray.py::test_slow_bodies_are_cut_and_never_keep_health_out."""

from __future__ import annotations

import asyncio
import json

import pytest

from vit_deploy.serve.connections import TIMED_OUT
from vit_deploy.serve.limits import Limits
from vit_deploy.serve.pace import BodyPace


async def _echo(scope, receive, send):
    """Reads the whole body (a disconnect ends it, as Starlette raises ClientDisconnect),
    then answers 200 with its length."""
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ConnectionError("client disconnected")
        size += len(message.get("body", b""))
        if not message.get("more_body"):
            break
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": str(size).encode()})


def _run(chunks: int, every: float, limits: Limits) -> tuple[int, dict, dict]:
    """`chunks` chunks of 100 bytes, one each `every` seconds: (status, body, scope)."""
    sent: list[dict] = []
    scope: dict = {"type": "http"}

    async def main():
        left = chunks

        async def receive():
            nonlocal left
            await asyncio.sleep(every)
            left -= 1
            return {"type": "http.request", "body": b"x" * 100, "more_body": left > 0}

        async def send(message):
            sent.append(message)

        await BodyPace(_echo, limits)(scope, receive, send)

    asyncio.run(main())
    start, body = sent
    raw = body["body"]
    return start["status"], (json.loads(raw) if start["status"] != 200 else {"size": int(raw)}), \
        scope


@pytest.mark.parametrize("chunks, every, status, said", [
    (5, 0.02, 200, None),  # fast
    (8, 0.1, 200, None),  # 1000 bytes/s, over the minimum, within the timeout
    (3, 0.6, 408, "minimum body rate"),  # 100 bytes in a 0.5 s window: under 500 bytes/s
    (30, 0.1, 408, "the body timeout"),  # steady, but 3 s in all: past 2 s
])
def test_a_body_is_read_within_the_timeout_and_the_minimum_rate(chunks, every, status, said):
    limits = Limits(body_timeout_s=2.0, min_body_rate=200, body_window_s=0.5)
    got, body, scope = _run(chunks, every, limits)
    assert got == status, body
    if said is None:
        assert body == {"size": 100 * chunks} and TIMED_OUT not in scope
    else:
        assert said in body["error"] and scope[TIMED_OUT] == "body"


def test_what_is_not_http_passes_through():
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])

    asyncio.run(BodyPace(app)({"type": "lifespan"}, None, None))
    assert seen == ["lifespan"]
