"""Example service in Python: every tick (1 s, or the granted TICK_MS) logs the term of its
lease and adds one to `count` in the term-fenced key-value store (`wasi:keyvalue`), until the
host says stop. It greets with `greeting` from its configuration (`wasi:config`,
`[service.python-ticker.config]` in vvm.toml).

Built with componentize-py against the `vvm:host` `service` world (../../wit/host.wit).
"""

import wit_world
from componentize_py_types import Err
from wit_world.imports import atomics, environment, lease, log, monotonic_clock, poll
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


class WitWorld(wit_world.WitWorld):
    def run(self) -> None:
        current = lease.current()
        period = tick_ms(1000)
        greeting = config.get("greeting") or "hello"
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
                if sleep_or_stop(stopping, period):
                    info("python ticker stopping")
                    return
