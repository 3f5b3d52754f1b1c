"""Example HTTP service in Python (world `http-service` of ../../wit/host.wit): a GET adds one
to `hits` in the service's own key-value bucket (`wasi:keyvalue` `increment`, a write fenced
by the lease term) and answers `hits N (term T)`, T being the term of `lease.current`. Any
other method is 405. A failed write (another host leads now, the store is unreachable, a
limit) is 503 with the error's text.

Served at `/python-http/...` by default while the host leads; every response also carries the
host's `vvm-fencing-token` header. Each request runs in a fresh instance.

Built with componentize-py: `componentize-py -d ../../wit -w http-service componentize app`.
"""

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.imports import atomics, lease
from wit_world.imports import wasi_keyvalue_store as keyvalue
from wit_world.imports.types import (
    Fields,
    IncomingRequest,
    Method_Get,
    OutgoingBody,
    OutgoingResponse,
    ResponseOutparam,
)


class IncomingHandler(exports.IncomingHandler):
    def handle(self, request: IncomingRequest, response_out: ResponseOutparam) -> None:
        if not isinstance(request.method(), Method_Get):
            respond(response_out, 405, "only GET\n", [("allow", b"GET")])
            return
        try:
            with keyvalue.open("default") as bucket:
                hits = atomics.increment(bucket, "hits", 1)
        except Err as e:
            respond(response_out, 503, f"{error_text(e)}\n")
            return
        respond(response_out, 200, f"hits {hits} (term {lease.current().term})\n")


def error_text(e: Err) -> str:
    """A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
    `over a limit: ...`, or access denied."""
    return getattr(e.value, "value", None) or type(e.value).__name__


def respond(
    response_out: ResponseOutparam,
    status: int,
    body: str,
    headers: list[tuple[str, bytes]] | None = None,
) -> None:
    """Sends `status` with `body` as plain text."""
    fields = [("content-type", b"text/plain; charset=utf-8"), *(headers or [])]
    response = OutgoingResponse(Fields.from_list(fields))
    response.set_status_code(status)
    outgoing = response.body()
    ResponseOutparam.set(response_out, Ok(response))
    # The stream is the body's child: closed before `finish`.
    with outgoing.write() as stream:
        stream.blocking_write_and_flush(body.encode())
    OutgoingBody.finish(outgoing, None)
