// {{name}}: a vvm-host HTTP service, a plain `fetch` event handler (world `http-service-js`
// of wit/), served at /{{name}}/ while its host leads, each request in a fresh instance. A GET
// adds one to `hits` in its key-value store (`wasi:keyvalue`, a write fenced by the lease
// term) and answers `hits N (term T)`. With `upstream-url` in its configuration
// (`wasi:config`), it also fetches that URL (`wasi:http`) and adds the status:
// `; upstream 200`.
//
// The world is `http-service` of wit/host.wit with the handler at WASI 0.2.10
// (wit/http-service-js.wit), the version componentize-js 0.23 answers `fetch` events on.
// Top-level code runs at build time, so everything that asks the host happens in `handle`.

import { current } from 'vvm:host/lease@0.1.0';
import { open } from 'wasi:keyvalue/store@0.2.0-draft2';
import { increment } from 'wasi:keyvalue/atomics@0.2.0-draft2';
import { get as config } from 'wasi:config/store@0.2.0-draft';

// A `wasi:keyvalue` error as text: `stale term ...`, `store unavailable: ...`,
// `over a limit: ...`, or `access-denied`. An import throws its error as `payload`.
function errorText(e) {
  const error = e.payload ?? e;
  return error.val ?? error.tag ?? String(error);
}

function text(body, status = 200) {
  return new Response(body, {
    status,
    headers: { 'content-type': 'text/plain; charset=utf-8' },
  });
}

// GETs `url`: its status, or why it failed. The host sends it only to an origin in the
// service's `http` allow-list (a denied fetch rejects), and adds the `vvm-fencing-token`
// header.
async function upstreamStatus(url) {
  try {
    const response = await fetch(url);
    await response.arrayBuffer(); // read to its end, so the exchange completes
    return response.status;
  } catch (e) {
    return `failed: ${String(e?.message ?? e).trim()}`;
  }
}

async function handle(request) {
  if (request.method !== 'GET') {
    return text('only GET\n', 405);
  }
  let hits;
  try {
    // The write fails once another host leads (`stale term ...`).
    hits = increment(open('default'), 'hits', 1n);
  } catch (e) {
    return text(`${errorText(e)}\n`, 503);
  }
  let body = `hits ${hits} (term ${current().term})`;
  const url = config('upstream-url');
  if (url) {
    body += `; upstream ${await upstreamStatus(url)}`;
  }
  return text(`${body}\n`);
}

addEventListener('fetch', (event) => event.respondWith(handle(event.request)));
