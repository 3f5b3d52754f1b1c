// Example service in JavaScript: every tick (1 s, or the granted TICK_MS) logs the term of its
// lease and adds one to `count` in the term-fenced key-value store (`wasi:keyvalue`), until the
// host says stop. It greets with `greeting` from its configuration (`wasi:config`,
// `[service.js-ticker.config]` in vvm.toml).
//
// With `notify-url` in its configuration, it also POSTs `js-ticker count N term T` to that URL
// after every tick with `fetch()` (componentize-js's `http` feature, over
// `wasi:http/outgoing-handler`) and logs the status or the error. The operator must grant the
// URL's origin (`http = ["http://127.0.0.1:8080"]` under `[service.js-ticker]`); a denied
// fetch rejects. A POST whose connection fails before its body is sent (refused) does not
// reject with componentize-js 0.23: the engine aborts, which is a trap (see docs/http.md).
//
// Built with componentize-js (guest-examples/build.sh) against the `vvm:host` `service` world
// (../../wit/host.wit). Top-level code runs at build time (the engine is pre-initialised), so
// everything that asks the host happens inside `run`.

import { current, stopping as stoppingPollable } from 'vvm:host/lease@0.1.0';
import { log } from 'vvm:host/log@0.1.0';
import { open } from 'wasi:keyvalue/store@0.2.0-draft2';
import { increment } from 'wasi:keyvalue/atomics@0.2.0-draft2';
import { get as config } from 'wasi:config/store@0.2.0-draft';
import { poll } from 'wasi:io/poll@0.2.12';
import { subscribeDuration } from 'wasi:clocks/monotonic-clock@0.2.12';
import { getEnvironment } from 'wasi:cli/environment@0.2.12';

const info = (message) => log('info', message);

function tickMs(fallback) {
  const found = getEnvironment().find(([name]) => name === 'TICK_MS');
  const ms = found ? Number.parseInt(found[1], 10) : NaN;
  return Number.isSafeInteger(ms) && ms >= 0 ? ms : fallback;
}

// A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
// `over a limit: ...`, or `access-denied`. An import's error is thrown with the WIT variant as
// its `payload`.
function errorText(e) {
  const error = e.payload ?? e;
  return error.val ?? error.tag ?? String(error);
}

// Waits `ms` or until the host says stop; true if the service must stop.
function sleepOrStop(stopping, ms) {
  const timer = subscribeDuration(BigInt(ms) * 1_000_000n);
  return poll([stopping, timer]).includes(0);
}

// Tells `url` the new count; a failure is logged, not fatal (the count is stored). The URL is
// not logged: the operator may have given it as a secret (`{ env = ... }`).
async function notify(url, count, term) {
  try {
    const response = await fetch(url, {
      method: 'POST',
      headers: { 'content-type': 'text/plain' },
      body: `js-ticker count ${count} term ${term}`,
    });
    await response.arrayBuffer(); // read to its end, so the exchange completes
    info(`notify: status ${response.status}`);
  } catch (e) {
    log('warn', `notify failed: ${String(e?.message ?? e).trim()}`);
  }
}

// Called once per leadership. Returning is `ok`; throwing a string (or an import's error,
// which carries its message as `payload`) is `err(message)`. It is `async` so that it can
// `await` a `fetch()`: componentize-js runs the engine's event loop until the promise `run`
// returns settles, and the component's `run` stays a plain synchronous export.
export async function run() {
  const lease = current();
  const stopping = stoppingPollable();
  const period = tickMs(1000);
  const greeting = config('greeting') ?? 'hello';
  const notifyUrl = config('notify-url');
  info(`js ticker started: slot ${lease.slot} holder ${lease.holder} term ${lease.term}; ${greeting}`);
  const bucket = open(''); // the service's own namespace
  for (let tick = 1; ; tick++) {
    let count;
    try {
      count = increment(bucket, 'count', 1n);
    } catch (e) {
      log('error', `increment failed: ${errorText(e)}`);
      throw errorText(e);
    }
    info(`tick ${tick}: term ${lease.term} count ${count}`);
    if (notifyUrl) {
      await notify(notifyUrl, count, lease.term);
    }
    if (sleepOrStop(stopping, period)) {
      info('js ticker stopping');
      return;
    }
  }
}
