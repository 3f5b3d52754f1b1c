"""Test guest: fire-command in Python, a `wasi:cli/command` (it exports `wasi:cli/run`) for a
scheduled service (issue 40). vvm-host runs it once per fire time, the fire time in
`VVM_FIRE_TIME` (Unix seconds, decimal). It needs a directory granted as `/data`. Each run:

1. reads `VVM_FIRE_TIME` (and `VVM_SLEEP_MS`, if set); if `VVM_FIRE_TIME` is missing or not a
   decimal integer, or `VVM_SLEEP_MS` is set but not a decimal integer, it writes a line on
   stderr and exits with `err` (`wasi:cli/exit`), appending nothing;
2. appends `<fire time> <term>\\n` to `/data/fires` (created if absent) with one `os.write` on
   a file opened with `O_APPEND`, so lines of overlapping runs never interleave; `<term>` is
   `VVM_TERM` if set and not empty, else `-`. If that fails: a line on stderr, exit `err`;
3. prints `fired <fire time>` on stdout;
4. sleeps `VVM_SLEEP_MS` milliseconds, if set (for overlap tests);
5. exits with `err`, with `fire-python: /data/fail exists` on stderr, if the file `/data/fail`
   existed just after the append (for outcome tests); else `run` returns `ok` (exit 0).

Every failure exits through `wasi:cli/exit` with `err`, as the Rust fire-command's
`std::process::exit` does: WASI 0.2's exit carries only ok or err, so the host sees the same
for both guests (`exited with code 1`; the Rust one's code 2 too).

Built with componentize-py against `wasi:cli/command` (../../../wit/deps) by ../../build.sh.
"""

import os
import sys
from typing import NoReturn

from componentize_py_types import Err
from wit_world import exports
from wit_world.imports import environment, monotonic_clock, poll
from wit_world.imports import exit as wasi_exit


def env() -> dict[str, str]:
    # Through WASI at run time: `os.environ` was captured when the component was
    # pre-initialised at build time.
    return dict(environment.get_environment())


def fail(message: str) -> NoReturn:
    # `wasi:cli/exit` with `err`, as Rust's `std::process::exit(1)` does, so the host reports
    # the same as for fire-command (`exited with code 1`); not `raise Err(None)` from `run`.
    print(f"fire-python: {message}", file=sys.stderr, flush=True)
    wasi_exit.exit(Err(None))
    raise AssertionError("wasi:cli/exit returned")


def decimal(value: str) -> int | None:
    value = value.strip()
    digits = value[1:] if value.startswith("-") else value
    return int(value) if digits.isdigit() else None


class Run(exports.Run):
    def run(self) -> None:
        vars = env()
        if "VVM_FIRE_TIME" not in vars:
            fail("VVM_FIRE_TIME is not set (run me as a scheduled service)")
        fire = decimal(vars["VVM_FIRE_TIME"])
        if fire is None:
            fail(f"VVM_FIRE_TIME={vars['VVM_FIRE_TIME']!r} is not Unix seconds")
        sleep_ms = None
        if "VVM_SLEEP_MS" in vars:
            sleep_ms = decimal(vars["VVM_SLEEP_MS"])
            if sleep_ms is None or sleep_ms < 0:
                fail(f"VVM_SLEEP_MS={vars['VVM_SLEEP_MS']!r} is not milliseconds")
        term = vars.get("VVM_TERM") or "-"

        line = f"{fire} {term}\n".encode()
        try:
            fd = os.open("/data/fires", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                written = os.write(fd, line)
            finally:
                os.close(fd)
            if written != len(line):
                raise OSError(f"short write: {written} of {len(line)} bytes")
        except OSError as e:
            fail(f"cannot append to /data/fires: {e}")
        failing = os.path.exists("/data/fail")

        print(f"fired {fire}", flush=True)
        if sleep_ms:
            poll.poll([monotonic_clock.subscribe_duration(sleep_ms * 1_000_000)])
        if failing:
            fail("/data/fail exists")
