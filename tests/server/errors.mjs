// Bad requests: each is a 4xx with OpenAI's error JSON and a message naming the problem,
// and the server keeps serving others (a good request after each batch, and one running
// concurrently with all of them).
import assert from 'node:assert/strict';
import { assertOpenAIError, get, post, readSse, base } from './common.mjs';

const key = 'test-key';
const good = { messages: [{ role: 'user', content: 'hi' }], max_tokens: 8, temperature: 0 };
// A long streaming request runs through all the bad ones and must finish normally.
const bystander = fetch(base + '/v1/completions', {
  method: 'POST', headers: { Authorization: `Bearer ${key}`, 'Content-Type': 'application/json' },
  body: JSON.stringify({ prompt: 'int main', max_tokens: 64, temperature: 0, stream: true, ignore_eos: true }) });

const chat = (body, opts = {}) => post('/v1/chat/completions', body, { key, ...opts });
const cmpl = (body, opts = {}) => post('/v1/completions', body, { key, ...opts });
const cases = [
  ['malformed JSON', () => chat(null, { raw: '{"messages": [' }), 400, 'invalid JSON'],
  ['not an object', () => chat([1, 2]), 400, 'JSON object'],
  ['messages wrong type', () => chat({ messages: 'hi' }), 400, 'messages'],
  ['message role wrong', () => chat({ messages: [{ role: 'robot', content: 'x' }] }), 400, 'role'],
  ['content wrong type', () => chat({ messages: [{ role: 'user', content: 5 }] }), 400, 'content'],
  ['max_tokens string', () => chat({ ...good, max_tokens: '10' }), 400, 'max_tokens'],
  ['max_tokens negative', () => chat({ ...good, max_tokens: -5 }), 400, 'max_tokens'],
  ['max_tokens zero', () => chat({ ...good, max_tokens: 0 }), 400, 'max_tokens'],
  ['max_tokens huge', () => chat({ ...good, max_tokens: 1e12 }), 400, 'max_tokens'],
  ['max_tokens 2^64', () => chat(null, { raw: '{"messages":[{"role":"user","content":"x"}],"max_tokens":18446744073709551616}' }), 400, 'max_tokens'],
  ['temperature negative', () => chat({ ...good, temperature: -1 }), 400, 'temperature'],
  ['temperature huge', () => chat({ ...good, temperature: 1e300 }), 400, 'temperature'],
  ['top_p zero', () => chat({ ...good, top_p: 0 }), 400, 'top_p'],
  ['top_k wrong type', () => chat({ ...good, top_k: 1.5 }), 400, 'top_k'],
  ['seed wrong type', () => chat({ ...good, seed: 'abc' }), 400, 'seed'],
  ['stop wrong type', () => chat({ ...good, stop: 7 }), 400, 'stop'],
  ['too many stops', () => chat({ ...good, stop: ['a', 'b', 'c', 'd', 'e'] }), 400, 'stop'],
  ['stream wrong type', () => chat({ ...good, stream: 'yes' }), 400, 'stream'],
  ['stream_options without stream', () => chat({ ...good, stream_options: { include_usage: true } }), 400, 'stream_options'],
  ['n > 1', () => chat({ ...good, n: 3 }), 400, 'n'],
  ['logprobs', () => chat({ ...good, logprobs: true }), 400, 'logprobs'],
  ['unknown argument', () => chat({ ...good, frobnicate: 1 }), 400, 'frobnicate'],
  ['unknown model', () => chat({ ...good, model: 'gpt-17' }), 404, 'gpt-17'],
  ['invalid UTF-8', () => chat(null, { raw: Buffer.from([0x7b, 0x22, 0x6d, 0x22, 0x3a, 0x22, 0xff, 0xfe, 0x22, 0x7d]) }), 400, 'UTF-8'],
  ['prompt ids out of vocabulary', () => cmpl({ prompt: [1, 2, 99999999] }), 400, 'vocabulary'],
  ['prompt too long', () => cmpl({ prompt: Array(1500).fill(5) }), 400, 'prompt'],
  ['prompt empty', () => cmpl({ prompt: '' }), 400, 'prompt'],
  ['prompt missing', () => cmpl({ max_tokens: 3 }), 400, 'prompt'],
  ['oversized body', () => cmpl({ prompt: 'x'.repeat(200000) }), 413, 'limit'],
  ['bad key', () => post('/v1/chat/completions', good, { key: 'nope' }), 401, 'API key'],
  ['missing key', () => post('/v1/chat/completions', good), 401, 'API key'],
  ['metrics need the key', () => get('/metrics'), 401, 'API key'],
  ['no route', () => get('/v1/nothing', { key }), 404, '/v1/nothing'],
  ['config: bad threshold', () => post('/api/v1/config/dflash', { validation_threshold: 7 }, { key }), 400, 'validation_threshold'],
];
for (const [name, run, status, text] of cases) {
  const r = await run();
  try { assertOpenAIError(r, status, text); } catch (e) { throw new Error(`${name}: ${e.message}`); }
}
// /health needs no key.
assert.equal((await get('/health')).status, 200);
// The server still serves.
const ok = await chat(good);
assert.equal(ok.status, 200, ok.text);
assert.equal(ok.json.object, 'chat.completion');
const by = await readSse(await bystander);
assert.ok(by.done, 'bystander stream ended with [DONE]');
const last = by.events.filter((e) => e.choices.length).at(-1);
assert.equal(last.choices[0].finish_reason, 'length');
console.log(`errors test: ok (${cases.length} bad requests, each a 4xx; server unaffected)`);
