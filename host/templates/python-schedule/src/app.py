"""{{name}}: a scheduled vvm-host service (world `schedule` of wit/schedule.wit), a `wasi:cli`
command. With `schedule = "<cron>"` under `[service.{{name}}]` in the host's `vvm.toml`, the
host runs it once per fire time, on the leader, in a fresh instance, with the fire time in
`VVM_FIRE_TIME` (Unix seconds). Each run adds one to `runs` in its key-value store
(`wasi:keyvalue`, a write fenced by the lease term), prints
`report for fire time <t> (term <T>): run <n>` and returns: the run's outcome is `ok`. A run
that fails prints why on stderr and ends with an error: the run's outcome is `error`.
"""

import sys

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import atomics, environment, lease
from wit_world.imports import wasi_keyvalue_store as keyvalue


class Failed(Exception):
    """Why a run failed."""


def fire_time() -> int:
    """The fire time this run is for: `VVM_FIRE_TIME`, Unix seconds. Read through WASI at run
    time: `os.environ` is what it was when the component was pre-initialised, at build time."""
    text = dict(environment.get_environment()).get("VVM_FIRE_TIME")
    if text is None:
        raise Failed("VVM_FIRE_TIME is not set: give [service.{{name}}] a schedule in vvm.toml")
    try:
        return int(text.strip())
    except ValueError:
        raise Failed(f"VVM_FIRE_TIME={text!r} is not Unix seconds") from None


def error_text(e: Err) -> str:
    """A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
    `over a limit: ...`, or access denied."""
    return getattr(e.value, "value", None) or type(e.value).__name__


def report() -> str:
    """One run's work: what it prints."""
    fire = fire_time()
    term = lease.current().term
    # "" is the service's own bucket. The write fails once another host leads
    # (`stale term ...`), and then so does the run.
    try:
        with keyvalue.open("") as bucket:
            runs = atomics.increment(bucket, "runs", 1)
    except Err as e:
        raise Failed(error_text(e)) from None
    return f"report for fire time {fire} (term {term}): run {runs}"


class Run(exports.Run):
    def run(self) -> None:
        try:
            line = report()
        except Failed as e:
            print(f"{{name}}: {e}", file=sys.stderr, flush=True)
            raise Err(None)
        print(line, flush=True)
