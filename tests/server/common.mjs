// Helpers shared by the server tests (node >= 18: global fetch).
import assert from 'node:assert/strict';

export const base = process.argv[2];
export const serverPid = Number(process.argv[3]);

export async function post(path, body, { key, raw, headers = {} } = {}) {
  const h = { 'Content-Type': 'application/json', ...headers };
  if (key) h.Authorization = `Bearer ${key}`;
  const res = await fetch(base + path, { method: 'POST', headers: h, body: raw ?? JSON.stringify(body) });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: res.status, text, json };
}

export async function get(path, { key } = {}) {
  const res = await fetch(base + path, { headers: key ? { Authorization: `Bearer ${key}` } : {} });
  const text = await res.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* metrics are text */ }
  return { status: res.status, text, json };
}

// Prometheus text -> { 'name{labels}': value }.
export function parseMetrics(text) {
  const m = {};
  for (const line of text.split('\n')) {
    if (!line || line.startsWith('#')) continue;
    const i = line.lastIndexOf(' ');
    m[line.slice(0, i)] = Number(line.slice(i + 1));
  }
  return m;
}

export async function metrics(key) {
  const r = await get('/metrics', { key });
  assert.equal(r.status, 200);
  return parseMetrics(r.text);
}

// Reads an SSE response to the end: the parsed `data:` events and whether [DONE] came.
export async function readSse(res) {
  const text = await res.text();
  const events = [];
  let done = false;
  for (const block of text.split('\n\n')) {
    for (const line of block.split('\n')) {
      if (!line.startsWith('data: ')) continue;
      const d = line.slice(6);
      if (d === '[DONE]') { done = true; continue; }
      events.push(JSON.parse(d));
    }
  }
  return { events, done };
}

export function assertOpenAIError(r, status, paramOrText) {
  assert.equal(r.status, status, `want ${status}, got ${r.status}: ${r.text}`);
  assert.ok(r.json && r.json.error, `error JSON expected: ${r.text}`);
  const e = r.json.error;
  assert.equal(typeof e.message, 'string');
  assert.ok(e.message.length > 0);
  assert.ok('type' in e && 'param' in e && 'code' in e, `error object fields: ${r.text}`);
  if (paramOrText) assert.ok(e.message.includes(paramOrText), `message should name '${paramOrText}': ${e.message}`);
}

export async function waitIdle(timeoutMs = 30000) {
  const t0 = Date.now();
  for (;;) {
    const s = (await get('/api/v1/cache/stats')).json;
    if (s && s.requests_running === 0 && s.requests_waiting === 0 && s.blocks_used === 0) return s;
    if (Date.now() - t0 > timeoutMs) throw new Error('engine not idle: ' + JSON.stringify(s));
    await new Promise((r) => setTimeout(r, 100));
  }
}
