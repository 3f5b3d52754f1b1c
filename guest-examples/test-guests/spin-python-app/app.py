"""Test guest: a Spin HTTP app made with the Python spin-sdk 3.4.1 (world `spin-http`, WASIp2) as
Spin's `http-py-p2` template makes one, served by vvm-host unchanged (issue 41). The Rust
spin-sdk-app's routes, routed by hand (this SDK has no router):
- `GET /items/<id>`: `200` with the value of key `<id>` in the default store, or `404`
  `no item <id>`;
- `POST /items/<id>`: stores the body under key `<id>`, `200` `stored <id>`;
- both item answers carry `item-id` (`<id>` from the path) and `item-path-match-id` (the
  request's `spin-path-match-id` header, `-` when absent);
- `GET /count`: adds one to key `hits` in the default store, `200` `hits N`;
- `GET /var/<name>`: `200` with the variable's value, or the error's repr (e.g.
  `Error_Undefined(value='...')`) with `404` for undefined and `500` for any other error;
- `GET /open/<label>`: `200` with `ok`, `no-such-store`, `access-denied`, `store-table-full`
  or `other: <repr>`;
- a default store that fails: `500` `key-value: <repr>`; anything else: `404` `Not Found`.
Like every componentize-py component it imports every interface of its world, used or not."""

from urllib.parse import urlparse

from spin_sdk import http, key_value, variables
from spin_sdk.http import Request, Response
from spin_sdk.wit.imports import key_value as kv
from spin_sdk.wit.imports import variables as var
from spin_sdk.wit.types import Err

OPEN_ERRORS = {
    kv.Error_NoSuchStore: "no-such-store",
    kv.Error_AccessDenied: "access-denied",
    kv.Error_StoreTableFull: "store-table-full",
}


def text(status: int, body, headers=None) -> Response:
    if isinstance(body, str):
        body = body.encode()
    return Response(status, {"content-type": "text/plain", **(headers or {})}, body)


class IncomingHandler(http.IncomingHandler):
    def handle_request(self, request: Request) -> Response:
        parts = urlparse(request.uri).path.strip("/").split("/")
        get = request.method == "GET"
        try:
            if get and parts == ["count"]:
                with key_value.open_default() as store:
                    raw = store.get("hits")
                    hits = (int(raw) if raw else 0) + 1
                    store.set("hits", str(hits).encode())
                return text(200, f"hits {hits}")
            if len(parts) == 2 and parts[0] == "items" and parts[1]:
                item = parts[1]
                echo = {
                    "item-id": item,
                    "item-path-match-id": request.headers.get("spin-path-match-id", "-"),
                }
                if request.method == "POST":
                    with key_value.open_default() as store:
                        store.set(item, request.body or b"")
                    return text(200, f"stored {item}", echo)
                if get:
                    with key_value.open_default() as store:
                        value = store.get(item)
                    if value is None:
                        return text(404, f"no item {item}", echo)
                    return text(200, value, echo)
            if get and len(parts) == 2 and parts[0] == "var":
                try:
                    return text(200, variables.get(parts[1]))
                except Err as e:
                    undefined = isinstance(e.value, var.Error_Undefined)
                    return text(404 if undefined else 500, repr(e.value))
            if get and len(parts) == 2 and parts[0] == "open":
                try:
                    with key_value.open(parts[1]):
                        return text(200, "ok")
                except Err as e:
                    return text(200, OPEN_ERRORS.get(type(e.value), f"other: {e.value!r}"))
        except Err as e:
            return text(500, f"key-value: {e.value!r}")
        return text(404, "Not Found")
