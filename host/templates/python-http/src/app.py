"""{{name}}: a vvm-host HTTP service (world `http-service` of wit/host.wit), served at
/{{name}}/ while its host leads, each request in a fresh instance. A GET adds one to `hits` in
its key-value store (`wasi:keyvalue`, a write fenced by the lease term) and answers
`hits N (term T)`. With `upstream-url` in its configuration (`wasi:config`), it also GETs that
URL (`wasi:http`) and adds the status: `; upstream 200`.
"""

from componentize_py_types import Err, Ok
from wit_world import exports
from wit_world.imports import atomics, lease, outgoing_handler
from wit_world.imports import wasi_config_store as config
from wit_world.imports import wasi_keyvalue_store as keyvalue
from wit_world.imports.types import (
    Fields,
    IncomingRequest,
    Method_Get,
    OutgoingBody,
    OutgoingRequest,
    OutgoingResponse,
    ResponseOutparam,
    Scheme_Http,
    Scheme_Https,
)


class IncomingHandler(exports.IncomingHandler):
    def handle(self, request: IncomingRequest, response_out: ResponseOutparam) -> None:
        if not isinstance(request.method(), Method_Get):
            respond(response_out, 405, "only GET\n")
            return
        try:
            # The write fails once another host leads (`stale term ...`).
            with keyvalue.open("default") as bucket:
                hits = atomics.increment(bucket, "hits", 1)
        except Err as e:
            respond(response_out, 503, f"{error_text(e)}\n")
            return
        body = f"hits {hits} (term {lease.current().term})"
        url = config.get("upstream-url")
        if url:
            body += f"; upstream {upstream_status(url)}"
        respond(response_out, 200, body + "\n")


def error_text(e: Err) -> str:
    """A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
    `over a limit: ...`, or access denied."""
    return getattr(e.value, "value", None) or type(e.value).__name__


def upstream_status(url: str) -> str:
    """GETs `url` (`http[s]://host[:port][/path]`): its status, or why it failed. The host
    sends it only to an origin in the service's `http` allow-list (else
    `ErrorCode_HttpRequestDenied`), and adds the `vvm-fencing-token` header."""
    scheme, _, rest = url.partition("://")
    authority, _, path = rest.partition("/")
    try:
        request = OutgoingRequest(Fields())
        request.set_scheme(Scheme_Https() if scheme == "https" else Scheme_Http())
        request.set_authority(authority)
        request.set_path_with_query("/" + path)
        with outgoing_handler.handle(request, None) as future:
            with future.subscribe() as ready:
                ready.block()
            result = future.get()  # Ok(Ok(response)), or Ok(Err(error-code))
            if not isinstance(result, Ok):
                return "failed: no response"
            if isinstance(result.value, Err):
                return f"failed: {result.value.value!r}"
            with result.value.value as response:
                return str(response.status())
    except Err as e:
        return f"failed: {e.value!r}"


def respond(response_out: ResponseOutparam, status: int, body: str) -> None:
    """Sends `status` with `body` as plain text."""
    fields = Fields.from_list([("content-type", b"text/plain; charset=utf-8")])
    response = OutgoingResponse(fields)
    response.set_status_code(status)
    outgoing = response.body()
    ResponseOutparam.set(response_out, Ok(response))
    # The stream is the body's child: closed before `finish`.
    with outgoing.write() as stream:
        stream.blocking_write_and_flush(body.encode())
    OutgoingBody.finish(outgoing, None)
