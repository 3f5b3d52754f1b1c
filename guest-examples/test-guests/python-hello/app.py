"""Test guest: a stateless hello in Python, a plain `wasi:http/proxy` component (no `vvm:host`
import), as an off-the-shelf Python HTTP component is: every request is answered `200` with
`hello from python`. For the benchmark beside `wasmtime serve` (instance reuse, issue 47),
where instantiating the interpreter is almost all a request costs.

Built with componentize-py: `componentize-py -d ../../../wit -w wasi:http/proxy@0.2.12
componentize app`.
"""

from componentize_py_types import Ok
from wit_world import exports
from wit_world.imports.types import (
    Fields,
    IncomingRequest,
    OutgoingBody,
    OutgoingResponse,
    ResponseOutparam,
)


class IncomingHandler(exports.IncomingHandler):
    def handle(self, request: IncomingRequest, response_out: ResponseOutparam) -> None:
        response = OutgoingResponse(Fields.from_list([("content-type", b"text/plain")]))
        body = response.body()
        ResponseOutparam.set(response_out, Ok(response))
        with body.write() as stream:
            stream.blocking_write_and_flush(b"hello from python\n")
        OutgoingBody.finish(body, None)
