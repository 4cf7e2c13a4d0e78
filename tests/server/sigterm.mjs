// SIGTERM: the server refuses new requests at once (503, /health "draining"), lets the
// in-flight streaming request finish normally, then closes its socket and exits 0
// (run_server_test.sh checks the exit code).
import assert from 'node:assert/strict';
import { base, serverPid, readSse, get, post, assertOpenAIError } from './common.mjs';

const res = await fetch(base + '/v1/completions', {
  method: 'POST', headers: { 'Content-Type': 'application/json' },
  body: JSON.stringify({ prompt: 'int main', max_tokens: 2000, temperature: 0, ignore_eos: true, stream: true }) });
assert.equal(res.status, 200);
const reader = res.body.getReader();
let first = '';
while (!first.includes('"text"')) first += new TextDecoder().decode((await reader.read()).value);
process.kill(serverPid, 'SIGTERM');
await new Promise((r) => setTimeout(r, 100));
const h = await get('/health');
assert.equal(h.status, 503);
assert.equal(h.json.status, 'draining');
assertOpenAIError(await post('/v1/completions', { prompt: 'x', max_tokens: 2 }), 503, 'shutting down');
let rest = first;
for (;;) {
  const { value, done } = await reader.read();
  if (done) break;
  rest += new TextDecoder().decode(value);
}
const { events, done } = await readSse(new Response(rest));
assert.ok(done, 'the in-flight stream finished with [DONE]');
assert.equal(events.at(-1).choices[0].finish_reason, 'length');
const tokens = events.map((e) => e.choices[0].text).join('');
assert.ok(tokens.length > 0);
// Once drained, the listening socket closes.
let refused = false;
for (let i = 0; i < 100 && !refused; i++) {
  try { await fetch(base + '/health'); await new Promise((r) => setTimeout(r, 100)); } catch { refused = true; }
}
assert.ok(refused, 'connections refused after the drain');
console.log('sigterm test: ok (new requests 503 while draining; in-flight stream finished with finish_reason length)');
