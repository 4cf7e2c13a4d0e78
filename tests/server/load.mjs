// Bounded load test on loopback: two rounds of 128 concurrent clients, mixed streaming and
// non-streaming, 10% of them disconnecting mid-stream and 10% more hanging up on a
// non-streaming request 300 ms after sending it (it ends as disconnected, or normally if it
// was done by then). Checks: no 5xx; every completed response is well formed; the engine returns to idle (no running or waiting request, no
// KV block held) after each round; every request is accounted for in the metrics by
// outcome; the server's RSS after round 2 stays within 10% (+16 MiB) of round 1.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import net from 'node:net';
import { once } from 'node:events';
import { base, serverPid, metrics, readSse, waitIdle } from './common.mjs';

const CLIENTS = 128;
const prompts = ['#include <stdio.h>\n', 'def main():\n', 'The kernel module', 'int add(int a, int b)', 'static void'];
let seed = 12345;
const rand = () => ((seed = (seed * 1103515245 + 12345) % 2147483648) / 2147483648);

function rssKiB(pid) {
  const m = fs.readFileSync(`/proc/${pid}/status`, 'utf8').match(/VmRSS:\s+(\d+) kB/);
  return Number(m[1]);
}

async function client(i) {
  const stream = i % 2 === 0;
  const disconnect = i % 10 === 3;  // 10%, all streaming-capable
  const hangUp = i % 10 === 7;      // 10%: non-streaming, the client closes after 300 ms
  const chat = i % 3 === 0;
  const body = chat
    ? { messages: [{ role: 'user', content: prompts[i % prompts.length] }], max_tokens: disconnect ? 64 : 8 + (i % 8) }
    : { prompt: prompts[i % prompts.length], max_tokens: disconnect ? 64 : 8 + (i % 8) };
  if (hangUp) { body.max_tokens = 64; body.stream = false; }
  body.temperature = rand() < 0.5 ? 0 : 0.8;
  body.seed = i;
  if (stream || disconnect) { body.stream = true; body.stream_options = { include_usage: true }; }
  const ctl = new AbortController();
  if (hangUp) {
    // A raw socket, so the request is known to have reached the server (connected, fully
    // written) before the client closes: it then ends as disconnected, or normally if done.
    const url = new URL(base);
    const sock = net.connect(Number(url.port), url.hostname);
    sock.on('error', () => {});
    await once(sock, 'connect');
    const b = JSON.stringify(body);
    await new Promise((r) => sock.write(`POST ${chat ? '/v1/chat/completions' : '/v1/completions'} HTTP/1.1\r\n` +
      `Host: ${url.host}\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(b)}\r\n\r\n${b}`, r));
    await new Promise((r) => setTimeout(r, 300));
    sock.destroy();
    return 'hung up';
  }
  const res = await fetch(base + (chat ? '/v1/chat/completions' : '/v1/completions'), {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body), signal: ctl.signal });
  assert.ok(res.status < 500, `5xx: ${res.status}`);
  assert.equal(res.status, 200);
  if (disconnect) {
    const reader = res.body.getReader();
    await reader.read();  // the first chunk, then hang up
    ctl.abort();
    return 'disconnected';
  }
  if (!body.stream) {
    const j = await res.json();
    assert.equal(j.choices.length, 1);
    assert.ok(['stop', 'length'].includes(j.choices[0].finish_reason));
    assert.equal(j.usage.total_tokens, j.usage.prompt_tokens + j.usage.completion_tokens);
    assert.ok(j.usage.completion_tokens <= body.max_tokens);
    assert.equal(typeof (chat ? j.choices[0].message.content : j.choices[0].text), 'string');
    return j.choices[0].finish_reason;
  }
  const { events, done } = await readSse(res);
  assert.ok(done, 'stream ends with [DONE]');
  const withChoices = events.filter((e) => e.choices.length);
  const fin = withChoices.at(-1).choices[0].finish_reason;
  assert.ok(['stop', 'length'].includes(fin));
  withChoices.slice(0, -1).forEach((e) => assert.equal(e.choices[0].finish_reason, null));
  const usage = events.at(-1).usage;
  assert.ok(usage && usage.completion_tokens <= body.max_tokens);
  return fin;
}

async function round(r) {
  const t0 = Date.now();
  const results = await Promise.all(Array.from({ length: CLIENTS }, (_, i) => client(i + r * CLIENTS)));
  const idle = await waitIdle();
  return { results, idle, seconds: (Date.now() - t0) / 1000 };
}

const before = await metrics();
const r1 = await round(0);
const rss1 = rssKiB(serverPid);
const r2 = await round(1);
const rss2 = rssKiB(serverPid);

// A hung-up request is known to have reached the server, not to have been handled yet when
// its client returned: wait (bounded) until every request is counted.
let after;
const delta = (k) => (after[k] ?? 0) - (before[k] ?? 0);
const ended = () => delta('dsinfer_requests_total{outcome="stop"}') + delta('dsinfer_requests_total{outcome="length"}') +
  delta('dsinfer_requests_total{outcome="disconnected"}');
for (const t0 = Date.now(); ; await new Promise((r) => setTimeout(r, 100))) {
  after = await metrics();
  if (ended() >= 2 * CLIENTS || Date.now() - t0 > 60000) break;
}
await waitIdle();
after = await metrics();
const finished = ended();
const outcomes = Object.fromEntries(['stop', 'length', 'disconnected', 'cancelled', 'error']
  .map((o) => [o, delta(`dsinfer_requests_total{outcome="${o}"}`)]));
assert.equal(finished, 2 * CLIENTS, 'every request ended as stop, length or disconnected: ' + JSON.stringify(outcomes));
assert.equal(delta('dsinfer_requests_total{outcome="error"}'), 0);
assert.ok(delta('dsinfer_requests_total{outcome="disconnected"}') >= 1, 'disconnects cancel their requests');
assert.equal(after.dsinfer_kv_blocks_used, 0, 'KV blocks back to idle');
assert.equal(after.dsinfer_requests_running, 0);
assert.ok(rss2 <= rss1 * 1.1 + 16 * 1024, `RSS grew: ${rss1} KiB -> ${rss2} KiB`);
// server.load_async: the same load with --dflash-enable-async-prefetch (drafts of one cohort
// proposed on the drafter thread during the other's forward, cancellations in between).
if (process.env.EXPECT_PREFETCH === '1')
  assert.ok(delta('dsinfer_async_prefetch_passes_total') > 0, 'async prefetch passes ran');
console.log(`load test: ok (2 x ${CLIENTS} clients, ${delta('dsinfer_requests_total{outcome="disconnected"}')} ` +
  `disconnected; rounds ${r1.seconds.toFixed(1)} s / ${r2.seconds.toFixed(1)} s (noisy); RSS ${rss1} -> ${rss2} KiB)`);
