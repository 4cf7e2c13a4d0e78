// /metrics after real traffic passes `promtool check metrics` (exposition format + lint).
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { get, post, waitIdle } from './common.mjs';

for (const stream of [false, true]) {
  const r = await post('/v1/chat/completions', { messages: [{ role: 'user', content: 'hello' }], max_tokens: 16, stream });
  assert.equal(r.status, 200);
}
await post('/v1/completions', { prompt: 'x', max_tokens: -1 });  // a rejected request too
await waitIdle();
const m = await get('/metrics');
assert.equal(m.status, 200);
for (const name of ['dflash_kv_reuse_rate', 'dspark_cache_hit_ratio', 'dflash_validation_failures_total',
  'dsinfer_requests_total', 'dsinfer_time_to_first_token_seconds_bucket', 'dsinfer_time_per_output_token_seconds_bucket',
  'dsinfer_e2e_request_latency_seconds_bucket', 'dsinfer_requests_waiting', 'dsinfer_requests_running',
  'dsinfer_kv_blocks_used', 'dsinfer_kv_blocks_free', 'dsinfer_kv_cache_fragmentation_ratio',
  'dsinfer_spec_tokens_per_round_bucket', 'dsinfer_spec_position_accepted_total', 'dsinfer_verify_budget_per_step_bucket'])
  assert.ok(m.text.includes('\n' + name), `missing ${name}`);
const p = spawnSync('promtool', ['check', 'metrics'], { input: m.text, encoding: 'utf8' });
assert.equal(p.status, 0, `promtool check metrics failed:\n${p.stdout}${p.stderr}`);
console.log('promtool test: ok');
