// {{name}}: a vvm-host service (world `service` of wit/host.wit). The host calls `run` each
// time it becomes leader. It greets with `greeting` from its configuration (`wasi:config`),
// then adds one to `count` in its key-value store (`wasi:keyvalue`) every second and logs it,
// until the lease's stop signal comes.
//
// Top-level code runs at build time (componentize-js pre-initialises the engine), so
// everything that asks the host happens inside `run`.

import { current, stopping as stoppingPollable } from 'vvm:host/lease@0.1.0';
import { log } from 'vvm:host/log@0.1.0';
import { open } from 'wasi:keyvalue/store@0.2.0-draft2';
import { increment } from 'wasi:keyvalue/atomics@0.2.0-draft2';
import { get as config } from 'wasi:config/store@0.2.0-draft';
import { poll } from 'wasi:io/poll@0.2.12';
import { subscribeDuration } from 'wasi:clocks/monotonic-clock@0.2.12';

const PERIOD_NS = 1_000_000_000n; // how often it counts: one second

const info = (message) => log('info', message);

// Waits one period, or until the host says stop; true if the service must stop.
function sleepOrStop(stopping) {
  return poll([stopping, subscribeDuration(PERIOD_NS)]).includes(0);
}

// A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
// `over a limit: ...`, or `access-denied`. An import throws its error as `payload`.
function errorText(e) {
  const error = e.payload ?? e;
  return error.val ?? error.tag ?? String(error);
}

// Returning is `ok`; throwing a string is `err(message)`.
export function run() {
  const lease = current();
  const stopping = stoppingPollable();
  const greeting = config('greeting') ?? 'hello';
  info(`started, term ${lease.term}: ${greeting}`);
  // '' is the service's own bucket. Every write is fenced by the lease term: once another
  // host leads, it fails, and throwing the error ends this run.
  const bucket = open('');
  for (;;) {
    let count;
    try {
      count = increment(bucket, 'count', 1n);
    } catch (e) {
      throw errorText(e);
    }
    info(`count ${count}`);
    if (sleepOrStop(stopping)) {
      info('stopping');
      return;
    }
  }
}
