// Builds ticker.js into a component for the `vvm:host` `service` world with componentize-js.
// Usage: node build.mjs OUT.wasm
import { writeFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';
import { componentize } from '@bytecodealliance/componentize-js';

const out = process.argv[2];
if (!out) {
  console.error('usage: node build.mjs OUT.wasm');
  process.exit(2);
}
const here = (p) => fileURLToPath(new URL(p, import.meta.url));
const { component } = await componentize({
  sourcePath: here('./ticker.js'),
  witPath: here('../../wit'),
  worldName: 'service',
});
await writeFile(out, component);
