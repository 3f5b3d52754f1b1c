// {{name}}: a scheduled vvm-host service (world `schedule` of wit/schedule.wit), a `wasi:cli`
// command. With `schedule = "<cron>"` under `[service.{{name}}]` in the host's `vvm.toml`, the
// host runs it once per fire time, on the leader, in a fresh instance, with the fire time in
// `VVM_FIRE_TIME` (Unix seconds). Each run adds one to `runs` in its key-value store
// (`wasi:keyvalue`, a write fenced by the lease term), prints
// `report for fire time <t> (term <T>): run <n>` and returns: the run's outcome is `ok`. A run
// that fails prints why on stderr and throws: the run's outcome is `error`.
//
// Top-level code runs at build time (componentize-js pre-initialises the engine), so
// everything that asks the host, the environment too, happens inside `run`.

import { getEnvironment } from 'wasi:cli/environment@0.2.12';
import { current } from 'vvm:host/lease@0.1.0';
import { open } from 'wasi:keyvalue/store@0.2.0-draft2';
import { increment } from 'wasi:keyvalue/atomics@0.2.0-draft2';

// The fire time this run is for: `VVM_FIRE_TIME`, Unix seconds.
function fireTime() {
  const text = new Map(getEnvironment()).get('VVM_FIRE_TIME');
  if (text === undefined) {
    throw 'VVM_FIRE_TIME is not set: give [service.{{name}}] a schedule in vvm.toml';
  }
  if (!/^-?\d+$/.test(text.trim())) {
    throw `VVM_FIRE_TIME=${JSON.stringify(text)} is not Unix seconds`;
  }
  return BigInt(text.trim());
}

// A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
// `over a limit: ...`, or `access-denied`. An import throws its error as `payload`.
function errorText(e) {
  const error = e.payload ?? e;
  return error.val ?? error.tag ?? String(error);
}

// One run's work: what it prints.
function report() {
  const fire = fireTime();
  const term = current().term;
  // '' is the service's own bucket. The write fails once another host leads
  // (`stale term ...`), and then so does the run.
  let runs;
  try {
    runs = increment(open(''), 'runs', 1n);
  } catch (e) {
    throw errorText(e);
  }
  return `report for fire time ${fire} (term ${term}): run ${runs}`;
}

// `wasi:cli/run`: returning is the run's `ok`, throwing its `error`.
export const run = {
  run() {
    let line;
    try {
      line = report();
    } catch (e) {
      console.error(`{{name}}: ${e}`);
      throw e;
    }
    console.log(line);
  },
};
