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


def test_bodies_in_flight_are_bounded_in_bytes_together():
    """A replica takes many requests at once (a stalled body costs no batch slot), so the
    bodies it holds are bounded in bytes, as `serve` bounds them: with 1,000 bytes allowed,
    a request whose body would pass, with what two others already hold, gets 503 with Retry-After,
    the others are answered, and once they are, the budget is whole again."""
    limits = Limits(max_body_bytes=1000, max_infer_bytes=1000, max_image_bytes=1000,
                    max_json_bytes=1000)
    pace = BodyPace(_echo, limits)

    async def one(size: int, delays: tuple[float, float]) -> tuple[int, dict, bytes]:
        sent: list[dict] = []
        parts = [b"x" * (size // 2), b"x" * (size - size // 2)]
        waits = list(delays)

        async def receive():
            await asyncio.sleep(waits.pop(0))
            body = parts.pop(0)
            return {"type": "http.request", "body": body, "more_body": bool(parts)}

        async def send(message):
            sent.append(message)

        await pace({"type": "http"}, receive, send)
        start, body = sent
        return start["status"], dict(start["headers"]), body["body"]

    async def main():
        # a and b hold 250 bytes each from 0.01 s, the rest at 0.2 s; c's second half, at
        # 0.1 s, would bring the total to 1,100
        first = await asyncio.gather(one(500, (0.01, 0.2)), one(500, (0.01, 0.2)),
                                     one(600, (0.05, 0.05)))
        return first, pace.held, await one(1000, (0.0, 0.0))

    (a, b, c), held, after = asyncio.run(main())
    assert a[0] == b[0] == 200 and a[2] == b[2] == b"500"
    assert c[0] == 503 and c[1][b"retry-after"] == b"1", c
    assert "bytes of request bodies are held (the limit is 1000)" in json.loads(c[2])["error"]
    assert held == 0 and after[0] == 200 and after[2] == b"1000"
