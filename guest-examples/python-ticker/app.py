"""Example service in Python: every tick (1 s, or the granted TICK_MS) logs the term of its
lease and adds one to `count` in the term-fenced key-value store (`wasi:keyvalue`), until the
host says stop. It greets with `greeting` from its configuration (`wasi:config`,
`[service.python-ticker.config]` in vvm.toml).

With `notify-url` in its configuration, it also POSTs `python-ticker count N term T` to that
URL after every tick (`wasi:http`, waiting on its pollables) and logs the status or the error.
The operator must grant the URL's origin (`http = ["http://127.0.0.1:8080"]` under
`[service.python-ticker]`), or every request fails with `HttpRequestDenied`.

Built with componentize-py against the `vvm:host` `service` world (../../wit/host.wit).
"""

import wit_world
from componentize_py_types import Err, Ok
from wit_world.imports import atomics, environment, lease, log, monotonic_clock, poll
from wit_world.imports import outgoing_handler, streams
from wit_world.imports import wasi_http_types as http
from wit_world.imports import wasi_config_store as config
from wit_world.imports import wasi_keyvalue_store as keyvalue


def info(message: str) -> None:
    log.log(log.Level.INFO, message)


def tick_ms(default: int) -> int:
    # Read the environment through WASI at run time: `os.environ` was captured when the
    # component was pre-initialised at build time.
    for name, value in environment.get_environment():
        if name == "TICK_MS" and value.isdigit():
            return int(value)
    return default


def sleep_or_stop(stopping: poll.Pollable, ms: int) -> bool:
    """Waits `ms` or until the host says stop; True if the service must stop."""
    with monotonic_clock.subscribe_duration(ms * 1_000_000) as timer:
        return 0 in poll.poll([stopping, timer])


def error_text(e: Err) -> str:
    """A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
    `over a limit: ...`, or access denied."""
    return getattr(e.value, "value", None) or type(e.value).__name__


def post(url: str, body: bytes) -> int:
    """POSTs `body` to `url` (`http://host[:port]/path`) and returns the response status.
    Raises `Err` with the `wasi:http` error (an `ErrorCode`, `HeaderError` or stream error)."""
    scheme, _, rest = url.partition("://")
    authority, _, path = rest.partition("/")
    length = str(len(body)).encode()
    headers = http.Fields.from_list(
        [("content-type", b"text/plain"), ("content-length", length)]
    )
    request = http.OutgoingRequest(headers)
    request.set_method(http.Method_Post())
    request.set_scheme(http.Scheme_Https() if scheme == "https" else http.Scheme_Http())
    request.set_authority(authority)
    request.set_path_with_query("/" + path)
    outgoing = request.body()  # taken before `handle`, which consumes the request
    with outgoing_handler.handle(request, None) as future:
        try:
            send_body(outgoing, body)
        except Err as e:
            # A refused or failed exchange closes the body stream: its own error says more.
            with wait(future):
                raise e
        with wait(future) as response:
            return response.status()


def send_body(outgoing: http.OutgoingBody, body: bytes) -> None:
    # The stream is the body's child: closed before `finish`. At most 4096 bytes per call.
    with outgoing.write() as stream:
        for start in range(0, len(body), 4096):
            stream.blocking_write_and_flush(body[start : start + 4096])
    http.OutgoingBody.finish(outgoing, None)


def wait(future: http.FutureIncomingResponse) -> http.IncomingResponse:
    """Blocks until the response head arrives; raises `Err(ErrorCode)` if the exchange failed."""
    with future.subscribe() as ready:
        ready.block()
    result = future.get()  # Ok(Ok(response)), Ok(Err(error-code)); not ready: None
    if not isinstance(result, Ok):
        raise Err("no response")
    if isinstance(result.value, Err):
        raise result.value
    return result.value.value


def http_error_text(e: Err) -> str:
    """A `wasi:http` error as text, e.g. `ErrorCode_HttpRequestDenied()`."""
    error = e.value
    if isinstance(error, streams.StreamError_LastOperationFailed):
        error = http.http_error_code(error.value) or error.value.to_debug_string()
    return error if isinstance(error, str) else repr(error)


def notify(url: str, count: int, term: int) -> None:
    """Tells `url` the new count; a failure is logged, not fatal (the count is stored). The
    URL is not logged: the operator may have given it as a secret (`{ env = ... }`)."""
    try:
        status = post(url, f"python-ticker count {count} term {term}".encode())
        info(f"notify: status {status}")
    except Err as e:
        log.log(log.Level.WARN, f"notify failed: {http_error_text(e)}")


class WitWorld(wit_world.WitWorld):
    def run(self) -> None:
        current = lease.current()
        period = tick_ms(1000)
        greeting = config.get("greeting") or "hello"
        notify_url = config.get("notify-url")
        info(
            f"python ticker started: slot {current.slot} holder {current.holder} "
            f"term {current.term}; {greeting}"
        )
        # "" is the service's own namespace.
        with keyvalue.open("") as bucket, lease.stopping() as stopping:
            tick = 0
            while True:
                tick += 1
                try:
                    count = atomics.increment(bucket, "count", 1)
                except Err as e:
                    log.log(log.Level.ERROR, f"increment failed: {error_text(e)}")
                    raise Err(error_text(e))
                info(f"tick {tick}: term {current.term} count {count}")
                if notify_url:
                    notify(notify_url, count, current.term)
                if sleep_or_stop(stopping, period):
                    info("python ticker stopping")
                    return
