// --disable-metrics and --enable-health-check=false: GET /metrics and GET /health are 404s
// in OpenAI's error JSON naming the flag that disabled them; completions and
// /api/v1/cache/stats still work, and an unknown route is still "no route". (The enabled
// state is what every other server test runs; promtool's run names both flags explicitly.)
import assert from 'node:assert/strict';
import { get, post, assertOpenAIError } from './common.mjs';

const m = await get('/metrics');
assertOpenAIError(m, 404, '--enable-metrics');
assert.equal(m.json.error.code, 'endpoint_disabled');
const h = await get('/health');
assertOpenAIError(h, 404, '--enable-health-check');
assert.equal(h.json.error.code, 'endpoint_disabled');
assertOpenAIError(await get('/no/such/route'), 404, 'no route');

const r = await post('/v1/completions', { prompt: 'def main():\n', max_tokens: 4, temperature: 0 });
assert.equal(r.status, 200, r.text);
assert.equal(r.json.usage.completion_tokens, 4);
const s = await get('/api/v1/cache/stats');
assert.equal(s.status, 200);
assert.ok(Number.isInteger(s.json.blocks_used));
console.log('endpoint_flags test: ok (/metrics and /health 404 naming their flags; the rest serves)');
