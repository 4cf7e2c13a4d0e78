// Hot reload: POST /api/v1/config/dflash changes the verify policy's threshold and the
// measured verify budget per step (delta verified drafts / delta decoding steps, from
// /metrics) follows; invalid changes are 400 and leave the settings as they were.
import assert from 'node:assert/strict';
import { get, post, metrics, assertOpenAIError, waitIdle } from './common.mjs';

const cfg0 = (await get('/api/v1/config/dflash')).json;
for (const k of ['window_size', 'validation_threshold', 'max_reuse_depth', 'schedule_policy', 'admission_policy', 'async_prefetch'])
  assert.ok(k in cfg0, k);

async function budget() {
  const m0 = await metrics();
  for (const prompt of ['#include <stdio.h>\n', 'int main(void)\n{\n', 'static int __init']) {
    const r = await post('/v1/completions', { prompt, max_tokens: 32, temperature: 0, ignore_eos: true });
    assert.equal(r.status, 200, r.text);
  }
  await waitIdle();
  const m1 = await metrics();
  const steps = m1.dsinfer_decode_steps_total - m0.dsinfer_decode_steps_total;
  assert.ok(steps > 0);
  return (m1.dsinfer_verified_draft_tokens_total - m0.dsinfer_verified_draft_tokens_total) / steps;
}

let r = await post('/api/v1/config/dflash', { schedule_policy: 'threshold', validation_threshold: 0.01 });
assert.equal(r.status, 200, r.text);
assert.equal(r.json.schedule_policy, 'threshold');
const low = await budget();
r = await post('/api/v1/config/dflash', { validation_threshold: 0.9 });
assert.equal(r.status, 200, r.text);
assert.equal((await get('/api/v1/config/dflash')).json.validation_threshold.toFixed(2), '0.90');
const high = await budget();
assert.ok(high < low, `verify budget per step should drop with the threshold: ${low} -> ${high}`);
r = await post('/api/v1/config/dflash', { schedule_policy: 'fixed', max_reuse_depth: 2 });
assert.equal(r.status, 200, r.text);
const capped = await budget();
assert.ok(capped <= 2 + 1e-9 && capped > 0, `max_reuse_depth 2 caps the drafts per request-step: ${capped}`);

// Invalid: 400, nothing changed.
const before = (await get('/api/v1/config/dflash')).json;
for (const [body, field] of [
  [{ validation_threshold: 1.5 }, 'validation_threshold'], [{ validation_threshold: 'high' }, 'validation_threshold'],
  [{ max_reuse_depth: 0 }, 'max_reuse_depth'], [{ max_reuse_depth: 1000 }, 'max_reuse_depth'],
  [{ schedule_policy: 'magic' }, 'schedule_policy'], [{ admission_policy: 'lifo' }, 'admission_policy'],
  [{ async_prefetch: 'yes' }, 'async_prefetch'], [{ window_size: -5 }, 'window_size'], [{ nonsense: 1 }, 'nonsense'],
  [{ validation_threshold: 0.5, schedule_policy: 'bogus' }, 'schedule_policy'], [{}, 'settings'],
]) {
  const e = await post('/api/v1/config/dflash', body);
  assertOpenAIError(e, 400, field);
}
assert.deepEqual((await get('/api/v1/config/dflash')).json, before, 'rejected changes change nothing');
// Window and admission order change too; speculation stays lossless (greedy text unchanged).
const greedy = async () => (await post('/v1/completions', { prompt: 'static int __init', max_tokens: 48, temperature: 0 })).json.choices[0].text;
const t0 = await greedy();
r = await post('/api/v1/config/dflash', { window_size: 8, admission_policy: 'hybrid', schedule_policy: 'dspark' });
assert.equal(r.status, 200, r.text);
assert.equal(r.json.window_size, 8);
assert.equal(r.json.admission_policy, 'hybrid');
assert.equal(await greedy(), t0, 'greedy output does not depend on the speculation settings');
const m = await metrics();
assert.equal(m.dsinfer_config_changes_total, 4);
// Async prefetch on: drafter passes overlap forwards (counted), greedy output unchanged.
r = await post('/api/v1/config/dflash', { async_prefetch: true, schedule_policy: 'fixed' });
assert.equal(r.status, 200, r.text);
assert.equal(r.json.async_prefetch, true);
const p0 = (await metrics()).dsinfer_async_prefetch_passes_total;
const greedyAsync = await Promise.all([greedy(), greedy(), greedy()]);
for (const t of greedyAsync) assert.equal(t, t0, 'greedy output with async prefetch equals the sequential one');
const p1 = (await metrics()).dsinfer_async_prefetch_passes_total;
assert.ok(p1 > p0, `async prefetch passes counted: ${p0} -> ${p1}`);
r = await post('/api/v1/config/dflash', { async_prefetch: false });
assert.equal(r.status, 200, r.text);
assert.equal((await get('/api/v1/config/dflash')).json.async_prefetch, false);
console.log(`hot reload test: ok (verify budget per step ${low.toFixed(2)} at t=0.01 -> ${high.toFixed(2)} at t=0.9; ` +
  `${capped.toFixed(2)} with fixed + depth 2)`);
