// Example service in JavaScript: every tick (1 s, or the granted TICK_MS) logs the term of its
// lease and adds one to `count` in the term-fenced key-value store, until the host says stop.
//
// Built with componentize-js (build.mjs) against the `vvm:host` `service` world
// (../../wit/host.wit). Top-level code runs at build time (the engine is pre-initialised), so
// everything that asks the host happens inside `run`.

import { current, stopping as stoppingPollable } from 'vvm:host/lease@0.1.0';
import { log } from 'vvm:host/log@0.1.0';
import { get, set } from 'vvm:host/kv@0.1.0';
import { poll } from 'wasi:io/poll@0.2.12';
import { subscribeDuration } from 'wasi:clocks/monotonic-clock@0.2.12';
import { getEnvironment } from 'wasi:cli/environment@0.2.12';

const info = (message) => log('info', message);

function tickMs(fallback) {
  const found = getEnvironment().find(([name]) => name === 'TICK_MS');
  const ms = found ? Number.parseInt(found[1], 10) : NaN;
  return Number.isSafeInteger(ms) && ms >= 0 ? ms : fallback;
}

// `kv.get` returns the value or undefined, and throws (with the error string as payload)
// when the store cannot be reached.
function readCount() {
  const value = get('count');
  if (value === undefined) return 0;
  const text = new TextDecoder().decode(value);
  const count = Number.parseInt(text, 10);
  if (!Number.isSafeInteger(count)) throw `count ${JSON.stringify(text)}: not a number`;
  return count;
}

// Waits `ms` or until the host says stop; true if the service must stop.
function sleepOrStop(stopping, ms) {
  const timer = subscribeDuration(BigInt(ms) * 1_000_000n);
  return poll([stopping, timer]).includes(0);
}

// Called once per leadership. Returning is `ok`; throwing a string (or an import's error,
// which carries its message as `payload`) is `err(message)`.
export function run() {
  const lease = current();
  const stopping = stoppingPollable();
  const period = tickMs(1000);
  info(`js ticker started: slot ${lease.slot} holder ${lease.holder} term ${lease.term}`);
  for (let tick = 1; ; tick++) {
    const count = readCount() + 1;
    try {
      set('count', new TextEncoder().encode(String(count)));
    } catch (e) {
      log('error', `set failed: ${e.payload ?? e}`);
      throw e;
    }
    info(`tick ${tick}: term ${lease.term} count ${count}`);
    if (sleepOrStop(stopping, period)) {
      info('js ticker stopping');
      return;
    }
  }
}
