// serve --log-dflash-details FILE: after requests, FILE holds one valid JSON line per
// speculative round with generate's round fields plus the request id the client saw;
// per request the rounds are numbered 0.. in order and commit every token but the
// prefill's first; over the test the lines agree with the metrics' drafted / verified /
// accepted counters (the warm-up request's rounds, before the test, have request_id null).
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { post, metrics, waitIdle } from './common.mjs';

const file = process.env.DFLASH_LOG;
assert.ok(file, 'DFLASH_LOG is set by run_server_test.sh');
const readLines = () => fs.readFileSync(file, 'utf8').split('\n').filter((l) => l.length).map((l) => JSON.parse(l));

const warm = readLines();
assert.ok(warm.length > 0 && warm.every((l) => l.request_id === null), 'warm-up rounds logged with request_id null');
const before = await metrics();

const reqs = [
  ['/v1/completions', { prompt: 'def fib(n):\n', max_tokens: 24, temperature: 0, ignore_eos: true }],
  ['/v1/chat/completions', { messages: [{ role: 'user', content: 'Write a C function that adds two ints.' }],
    max_tokens: 20, temperature: 0, ignore_eos: true }],
  ['/v1/completions', { prompt: '#include <stdio.h>\n', max_tokens: 16, temperature: 0.8, seed: 3, ignore_eos: true,
    stream: true }],
];
const ids = [];
const tokens = {};
for (const [path, body] of reqs) {
  const r = await post(path, body);
  assert.equal(r.status, 200, r.text);
  if (body.stream) {
    const ev = r.text.split('\n').filter((l) => l.startsWith('data: {')).map((l) => JSON.parse(l.slice(6)));
    ids.push(ev[0].id);
    tokens[ev[0].id] = body.max_tokens;  // ignore_eos: finish_reason length
  } else {
    ids.push(r.json.id);
    tokens[r.json.id] = r.json.usage.completion_tokens;
    assert.equal(r.json.usage.completion_tokens, body.max_tokens);
  }
}
await waitIdle();

// The last step's lines are written right after its tokens went out: poll for them.
let lines = [];
for (let t0 = Date.now(); ; ) {
  lines = readLines().slice(warm.length);
  const done = ids.every((id) => lines.filter((l) => l.request_id === id).reduce((a, l) => a + l.committed, 0) ===
    tokens[id] - 1);
  if (done) break;
  if (Date.now() - t0 > 30000) throw new Error('rounds missing from ' + file);
  await new Promise((r) => setTimeout(r, 100));
}
const after = await metrics();
const delta = (k) => (after[k] ?? 0) - (before[k] ?? 0);

const fields = ['request_id', 'engine_request_id', 'step', 'batch', 'round', 'start', 'anchor', 'draft_ids',
  'confidences', 'drafted', 'verify_len', 'accepted', 'next_token', 'committed', 'draft_ms', 'verify_ms',
  'drafted_ids', 'drafted_confidences', 'step_ms', 'source'];
let drafted = 0, verified = 0, accepted = 0;
for (const l of lines) {
  for (const f of fields) assert.ok(f in l, `field ${f} missing: ${JSON.stringify(l)}`);
  assert.ok(ids.includes(l.request_id), `unexpected request_id ${l.request_id}`);
  assert.ok(Number.isInteger(l.engine_request_id) && Number.isInteger(l.step) && l.batch >= 1);
  assert.equal(l.verify_len, l.draft_ids.length + 1);
  assert.equal(l.drafted, l.drafted_ids.length);
  assert.deepEqual(l.draft_ids, l.drafted_ids.slice(0, l.draft_ids.length), 'verified drafts are a prefix of the drafted');
  assert.equal(l.drafted_confidences.length, l.drafted, 'the DSpark drafter has a confidence head (lookup rounds report theirs)');
  assert.ok(['drafter', 'lookup', 'none'].includes(l.source), `source ${l.source}`);
  assert.equal(l.confidences.length, l.draft_ids.length);
  l.drafted_confidences.forEach((c) => assert.ok(c >= 0 && c <= 1, `confidence ${c}`));
  assert.ok(l.accepted >= 0 && l.accepted <= l.draft_ids.length);
  assert.ok(l.committed >= 1 && l.committed <= l.accepted + 1);
  assert.ok(l.draft_ms >= 0 && l.verify_ms >= 0 && l.step_ms >= l.draft_ms);
  drafted += l.drafted;
  verified += l.verify_len - 1;
  accepted += l.accepted;
}
for (const id of ids) {
  const mine = lines.filter((l) => l.request_id === id);
  assert.deepEqual(mine.map((l) => l.round), mine.map((_, i) => i), `rounds of ${id} in order`);
  assert.equal(new Set(mine.map((l) => l.engine_request_id)).size, 1);
  for (let i = 1; i < mine.length; i++) assert.ok(mine[i].step > mine[i - 1].step);
}
assert.equal(drafted, delta('dsinfer_drafted_tokens_total'), 'drafted drafts = the metrics counter');
assert.equal(verified, delta('dsinfer_verified_draft_tokens_total'), 'verified drafts = the metrics counter');
assert.equal(accepted, delta('dsinfer_accepted_draft_tokens_total'), 'accepted drafts = the metrics counter');
assert.ok(drafted > 0, 'the drafter drafted');
console.log(`dflash_log test: ok (${lines.length} rounds of ${ids.length} requests; ${drafted} drafted, ` +
  `${verified} verified, ${accepted} accepted)`);
