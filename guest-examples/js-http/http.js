// Example HTTP service in JavaScript, a plain `fetch` event handler: a GET adds one to `hits`
// in the service's own key-value bucket (`wasi:keyvalue` `increment`, a write fenced by the
// lease term) and answers `hits N (term T)`, T being the term of `lease.current`. Any other
// method is 405. A failed write (another host leads now, the store is unreachable, a limit) is
// 503 with the error's text.
//
// Served at `/js-http/...` by default while the host leads; every response also carries the
// host's `vvm-fencing-token` header. Each request runs in a fresh instance.
//
// Built with componentize-js for the world `http-service-js` (wit/http-service-js.wit: the
// `http-service` world of ../../wit/host.wit with the handler at the WASI version of
// componentize-js's engine, StarlingMonkey, which answers the handler by dispatching `fetch`
// events). Top-level code runs at build time (the engine is pre-initialised), so everything
// that asks the host happens in the handler.

import { current } from 'vvm:host/lease@0.1.0';
import { open } from 'wasi:keyvalue/store@0.2.0-draft2';
import { increment } from 'wasi:keyvalue/atomics@0.2.0-draft2';

// A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
// `over a limit: ...`, or `access-denied`. An import's error is thrown with the WIT variant as
// its `payload`.
function errorText(e) {
  const error = e.payload ?? e;
  return error.val ?? error.tag ?? String(error);
}

function text(body, status = 200, headers = {}) {
  return new Response(body, {
    status,
    headers: { 'content-type': 'text/plain; charset=utf-8', ...headers },
  });
}

function handle(request) {
  if (request.method !== 'GET') {
    return text('only GET\n', 405, { allow: 'GET' });
  }
  let hits;
  try {
    hits = increment(open('default'), 'hits', 1n);
  } catch (e) {
    return text(`${errorText(e)}\n`, 503);
  }
  return text(`hits ${hits} (term ${current().term})\n`);
}

addEventListener('fetch', (event) => event.respondWith(handle(event.request)));
