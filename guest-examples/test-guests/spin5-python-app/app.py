"""Test guest: an HTTP component made with Spin's current Python SDK (spin-sdk 5.0.0 with
componentize-py 0.25.1, world `spin:up/http-trigger@4.1.0`: WASI 0.3), as its documentation
shows one, unchanged. It imports Spin's whole platform (Redis, MySQL, PostgreSQL, SQLite,
MQTT, LLM; WASI 0.3 and its release candidate). It adds one to `count` in its default store and
answers `GREETING PATH #N`, GREETING the variable `greeting`.
"""

from spin_sdk import http, key_value, variables
from spin_sdk.http import Request, Response


class HttpHandler(http.Handler):
    async def handle_request(self, request: Request) -> Response:
        with await key_value.open_default() as store:
            n = int((await store.get("count") or b"0").decode()) + 1
            await store.set("count", str(n).encode())
        greeting = await variables.get("greeting")
        return Response(
            200,
            {"content-type": "text/plain"},
            bytes(f"{greeting} {request.uri} #{n}\n", "utf-8"),
        )
