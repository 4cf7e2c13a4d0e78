// The official `openai` npm client (pinned by run_server_test.sh) against `dsinfer serve`:
// models, chat and completions, streaming and not, usage (stream_options.include_usage),
// stop, max_tokens, seed, errors; and the --record-requests log.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import { base } from './common.mjs';

const require = createRequire(process.env.OPENAI_NODE_DIR + '/');
const OpenAI = require('openai');
const client = new OpenAI({ apiKey: 'test-key', baseURL: base + '/v1', maxRetries: 0 });
const models = await client.models.list();
const model = models.data[0].id;
assert.equal(models.data.length, 1);

const messages = [{ role: 'user', content: 'Write a C function that adds two integers.' }];
let recorded = 0;

// Chat, not streaming (greedy).
const chat = await client.chat.completions.create({ model, messages, max_tokens: 24, temperature: 0 });
recorded++;
assert.equal(chat.object, 'chat.completion');
assert.equal(chat.choices.length, 1);
assert.equal(chat.choices[0].message.role, 'assistant');
assert.equal(typeof chat.choices[0].message.content, 'string');
assert.ok(['stop', 'length'].includes(chat.choices[0].finish_reason));
const u = chat.usage;
assert.ok(u.prompt_tokens > 0 && u.completion_tokens > 0 && u.completion_tokens <= 24);
assert.equal(u.total_tokens, u.prompt_tokens + u.completion_tokens);

// Chat, streaming with usage: same greedy text, usage in a final chunk with no choices.
const stream = await client.chat.completions.create({
  model, messages, max_tokens: 24, temperature: 0, stream: true, stream_options: { include_usage: true } });
let text = '', finish = null, usage = null, chunks = 0;
for await (const c of stream) {
  chunks++;
  assert.equal(c.object, 'chat.completion.chunk');
  if (c.usage) { usage = c.usage; assert.equal(c.choices.length, 0); continue; }
  text += c.choices[0].delta.content ?? '';
  if (c.choices[0].finish_reason) finish = c.choices[0].finish_reason;
}
recorded++;
assert.ok(chunks >= 2);
assert.equal(text, chat.choices[0].message.content, 'streamed greedy text = non-streamed greedy text');
assert.equal(finish, chat.choices[0].finish_reason);
assert.deepEqual(usage, { prompt_tokens: u.prompt_tokens, completion_tokens: u.completion_tokens, total_tokens: u.total_tokens });

// Streaming without include_usage: no usage chunk.
const s2 = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, stream: true });
for await (const c of s2) assert.ok(!c.usage, 'usage only with stream_options.include_usage');
recorded++;

// Completions, both ways, greedy: identical text.
const prompt = '#include <stdio.h>\n\nint main(void)\n{\n';
const comp = await client.completions.create({ model, prompt, max_tokens: 32, temperature: 0 });
recorded++;
assert.equal(comp.object, 'text_completion');
assert.ok(comp.choices[0].text.length > 0);
assert.equal(comp.usage.total_tokens, comp.usage.prompt_tokens + comp.usage.completion_tokens);
const cs = await client.completions.create({ model, prompt, max_tokens: 32, temperature: 0, stream: true,
  stream_options: { include_usage: true } });
let ctext = '', cusage = null;
for await (const c of cs) {
  if (c.usage) { cusage = c.usage; continue; }
  assert.equal(c.object, 'text_completion');
  ctext += c.choices[0].text;
}
recorded++;
assert.equal(ctext, comp.choices[0].text);
assert.equal(cusage.completion_tokens, comp.usage.completion_tokens);

// max_tokens: finish_reason length with exactly that many tokens (ignore_eos extension).
const len = await client.completions.create({ model, prompt, max_tokens: 5, temperature: 0, ignore_eos: true });
recorded++;
assert.equal(len.choices[0].finish_reason, 'length');
assert.equal(len.usage.completion_tokens, 5);

// stop: a piece of the greedy continuation as stop string -> text is cut before it.
const full = comp.choices[0].text;
const stopStr = full.slice(Math.floor(full.length / 2), Math.floor(full.length / 2) + 2);
const cut = full.slice(0, full.indexOf(stopStr));
for (const stop of [stopStr, [stopStr, 'zzzz-never']]) {
  const r = await client.completions.create({ model, prompt, max_tokens: 32, temperature: 0, stop });
  recorded++;
  assert.equal(r.choices[0].text, cut, `stop ${JSON.stringify(stop)}`);
  assert.equal(r.choices[0].finish_reason, 'stop');
}
// max_completion_tokens (chat's newer name).
const mct = await client.chat.completions.create({ model, messages, max_completion_tokens: 3, temperature: 0 });
recorded++;
assert.ok(mct.usage.completion_tokens <= 3);

// Sampling with a seed is reproducible; top_k / top_p accepted.
const sampled = async () => (await client.completions.create({
  model, prompt, max_tokens: 16, temperature: 0.9, top_p: 0.95, seed: 1234, top_k: 40 })).choices[0].text;
const a = await sampled(); const b = await sampled();
recorded += 2;
assert.equal(a, b, 'same seed, same text');

// Errors: the client's typed errors with OpenAI's status codes.
await assert.rejects(new OpenAI({ apiKey: 'wrong', baseURL: base + '/v1', maxRetries: 0 }).models.list(),
  (e) => e instanceof OpenAI.AuthenticationError && e.status === 401);
await assert.rejects(client.chat.completions.create({ model: 'no-such-model', messages }),
  (e) => e instanceof OpenAI.NotFoundError && e.status === 404 && /no-such-model/.test(e.message));
await assert.rejects(client.chat.completions.create({ model, messages, temperature: 5 }),
  (e) => e instanceof OpenAI.BadRequestError && e.status === 400 && /temperature/.test(e.message) && e.param === 'temperature');
await assert.rejects(client.chat.completions.create({ model, messages: [] }),
  (e) => e instanceof OpenAI.BadRequestError && /messages/.test(e.message));
await assert.rejects(client.completions.create({ model, prompt, n: 2 }),
  (e) => e instanceof OpenAI.BadRequestError && /\bn\b/.test(e.message));

// --record-requests: one JSON line per finished request, replayable (prompt_ids + params + timings).
let lines = [];
for (let i = 0; i < 50; i++) {
  lines = fs.readFileSync(process.env.RECORD_FILE, 'utf8').split('\n').filter(Boolean);
  if (lines.length >= recorded) break;
  await new Promise((r) => setTimeout(r, 100));
}
assert.equal(lines.length, recorded);
for (const l of lines) {
  const j = JSON.parse(l);
  assert.ok(Array.isArray(j.prompt_ids) && j.prompt_ids.length > 0);
  assert.ok(typeof j.params.max_tokens === 'number');
  assert.ok(j.arrival_unix_s > 1.6e9 && j.e2e_s >= 0 && j.completion_tokens >= 0);
  assert.ok(j.ttft_s === null || (j.ttft_s >= 0 && j.ttft_s <= j.e2e_s));
  assert.ok(j.messages || j.prompt_text !== undefined);
}
console.log(`openai client test: ok (${recorded} requests recorded)`);
