"""Example service in Python: every tick (1 s, or the granted TICK_MS) logs the term of its
lease and adds one to `count` in the term-fenced key-value store, until the host says stop.

Built with componentize-py against the `vvm:host` `service` world (../../wit/host.wit).
"""

import wit_world
from componentize_py_types import Err
from wit_world.imports import environment, kv, lease, log, monotonic_clock, poll


def info(message: str) -> None:
    log.log(log.Level.INFO, message)


def tick_ms(default: int) -> int:
    # Read the environment through WASI at run time: `os.environ` was captured when the
    # component was pre-initialised at build time.
    for name, value in environment.get_environment():
        if name == "TICK_MS" and value.isdigit():
            return int(value)
    return default


def read_count() -> int:
    value = kv.get("count")  # raises Err(str) if the store cannot be reached
    if value is None:
        return 0
    try:
        return int(value.decode())
    except ValueError:
        raise Err(f"count {value!r}: not a number")


def sleep_or_stop(stopping: poll.Pollable, ms: int) -> bool:
    """Waits `ms` or until the host says stop; True if the service must stop."""
    with monotonic_clock.subscribe_duration(ms * 1_000_000) as timer:
        return 0 in poll.poll([stopping, timer])


class WitWorld(wit_world.WitWorld):
    def run(self) -> None:
        current = lease.current()
        period = tick_ms(1000)
        info(
            f"python ticker started: slot {current.slot} holder {current.holder} "
            f"term {current.term}"
        )
        with lease.stopping() as stopping:
            tick = 0
            while True:
                tick += 1
                count = read_count() + 1
                try:
                    kv.set("count", str(count).encode())
                except Err as e:
                    log.log(log.Level.ERROR, f"set failed: {e.value}")
                    raise
                info(f"tick {tick}: term {current.term} count {count}")
                if sleep_or_stop(stopping, period):
                    info("python ticker stopping")
                    return
