"""{{name}}: a vvm-host service (world `service` of wit/host.wit). The host calls `run` each
time it becomes leader. It greets with `greeting` from its configuration (`wasi:config`), then
adds one to `count` in its key-value store (`wasi:keyvalue`) every second and logs it, until
the lease's stop signal comes.
"""

import wit_world
from componentize_py_types import Err
from wit_world.imports import atomics, lease, log, monotonic_clock, poll
from wit_world.imports import wasi_config_store as config
from wit_world.imports import wasi_keyvalue_store as keyvalue

PERIOD_NS = 1_000_000_000  # how often it counts: one second


def info(message: str) -> None:
    log.log(log.Level.INFO, message)


def sleep_or_stop(stopping: poll.Pollable) -> bool:
    """Waits one period, or until the host says stop; True if the service must stop."""
    with monotonic_clock.subscribe_duration(PERIOD_NS) as timer:
        return 0 in poll.poll([stopping, timer])


def error_text(e: Err) -> str:
    """A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
    `over a limit: ...`, or access denied."""
    return getattr(e.value, "value", None) or type(e.value).__name__


class WitWorld(wit_world.WitWorld):
    def run(self) -> None:
        term = lease.current().term
        greeting = config.get("greeting") or "hello"
        info(f"started, term {term}: {greeting}")
        # "" is the service's own bucket. Every write is fenced by the lease term: once
        # another host leads, it fails, and raising the error ends this run.
        with keyvalue.open("") as bucket, lease.stopping() as stopping:
            while True:
                try:
                    count = atomics.increment(bucket, "count", 1)
                except Err as e:
                    raise Err(error_text(e))
                info(f"count {count}")
                if sleep_or_stop(stopping):
                    info("stopping")
                    return
