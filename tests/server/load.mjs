// A load generator for OpenAI-compatible servers: loraplex serve and
// llama.cpp's llama-server, the same load for both. C concurrent clients,
// each sending R streamed /v1/completions requests back to back, each
// request with an adapter: all the same one (--mode one) or spread over the
// adapters (--mode mixed: client i uses adapter i mod K). Reports per level:
// aggregate generated tokens/s (wall clock), p50/p99 time to first token and
// inter-token latency, errors. No timing is meaningful on a loaded machine:
// run it on a quiet one (docs/server.md).
//
//   node tests/server/load.mjs --url http://127.0.0.1:8080 --adapters a,b,c,d,e,f,g,h \
//        [--server loraplex|llama] [--mode mixed|one] [--clients 1,4,16,64] [--requests 4]
//        [--max-tokens 64] [--prompts FILE.jsonl] [--api-key KEY] [--json OUT.json]
//
// loraplex selects an adapter by "model": NAME. llama-server selects by
// "lora": [{"id": i, "scale": s}] over the adapters it was started with
// (--lora A.gguf --lora B.gguf ... --lora-init-without-apply): --adapters
// then lists their ids in order (0,1,...), and every request sends all of
// them, scale 1 for its own and 0 for the others. --adapters "" runs the
// base alone.
import { readFileSync, writeFileSync } from "node:fs";

function args(argv) {
  const o = { url: "http://127.0.0.1:8080", server: "loraplex", mode: "mixed", clients: "1,4,16,64", requests: "4",
    "max-tokens": "64", adapters: "", prompts: "", "api-key": "", json: "" };
  for (let i = 0; i < argv.length; i++) {
    const k = argv[i].replace(/^--/, "");
    if (!(k in o) || i + 1 >= argv.length) throw new Error(`unknown option or missing value: ${argv[i]}`);
    o[k] = argv[++i];
  }
  if (!["loraplex", "llama"].includes(o.server)) throw new Error("--server is loraplex or llama");
  if (!["one", "mixed"].includes(o.mode)) throw new Error("--mode is one or mixed");
  return o;
}

const DEFAULT_PROMPTS = [
  "Once upon a time",
  "Write a short note to a colleague about the meeting moved to Thursday.",
  "Summarize: the committee met on Monday, reviewed the budget for the new library wing, and agreed to " +
    "postpone the vote on the parking plan until the traffic study is finished next month.",
  "Translate to French: the weather is nice today and we will walk to the market.",
  "fix: the the cat sleep on the mat and dont move.",
  "A list of three ideas for a rainy afternoon:",
];

function loadPrompts(file) {
  if (!file) return DEFAULT_PROMPTS;
  return readFileSync(file, "utf8").split("\n").filter((l) => l.trim()).map((l) => JSON.parse(l).prompt);
}

function quantile(xs, q) {
  if (!xs.length) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
}

// One streamed request: TTFT (first text chunk), the gaps between text
// chunks, and the generated token count (usage when the server sends it,
// else the chunks).
async function one(o, adapterIndex, adapters, prompt) {
  const body = { prompt, max_tokens: +o["max-tokens"], temperature: 0, stream: true,
    stream_options: { include_usage: true } };
  if (adapters.length && o.server === "loraplex") body.model = adapters[adapterIndex];
  if (adapters.length && o.server === "llama")
    body.lora = adapters.map((id, i) => ({ id: +id, scale: i === adapterIndex ? 1 : 0 }));
  const headers = { "Content-Type": "application/json" };
  if (o["api-key"]) headers.Authorization = `Bearer ${o["api-key"]}`;
  const t0 = performance.now();
  const r = await fetch(`${o.url}/v1/completions`, { method: "POST", headers, body: JSON.stringify(body) });
  if (!r.ok) return { error: `HTTP ${r.status}: ${(await r.text()).slice(0, 200)}` };
  const reader = r.body.getReader(), dec = new TextDecoder();
  let buf = "", first = 0, last = 0, chunks = 0, usage = 0, text = "";
  const gaps = [];
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let at;
    while ((at = buf.indexOf("\n\n")) >= 0) {
      const ev = buf.slice(0, at).trim();
      buf = buf.slice(at + 2);
      if (!ev.startsWith("data: ") || ev === "data: [DONE]") continue;
      const j = JSON.parse(ev.slice(6));
      if (j.usage?.completion_tokens) usage = j.usage.completion_tokens;
      const t = j.choices?.[0]?.text;
      if (!t) continue;
      const now = performance.now();
      if (!first) first = now;
      else gaps.push(now - last);
      last = now;
      chunks++;
      text += t;
    }
  }
  return { ttft: first ? first - t0 : NaN, gaps, tokens: usage || chunks, text };
}

async function level(o, clients, adapters, prompts) {
  const R = +o.requests, results = [];
  const t0 = performance.now();
  await Promise.all([...Array(clients).keys()].map(async (c) => {
    for (let k = 0; k < R; k++) {
      const a = !adapters.length ? -1 : o.mode === "one" ? 0 : (c + k) % adapters.length;
      const p = prompts[(c * R + k) % prompts.length];
      try { results.push({ ...(await one(o, a, adapters, p)), adapter: a, prompt: p }); }
      catch (e) { results.push({ error: e.message }); }
    }
  }));
  const wall = (performance.now() - t0) / 1e3;
  const okr = results.filter((r) => !r.error);
  const tokens = okr.reduce((s, r) => s + r.tokens, 0);
  const ttft = okr.map((r) => r.ttft).filter((x) => !Number.isNaN(x));
  const itl = okr.flatMap((r) => r.gaps);
  // greedy: the same adapter and prompt must give the same text every time
  const seen = new Map();
  let inconsistent = 0;
  for (const r of okr) {
    const key = `${r.adapter}\u0000${r.prompt}`;
    if (!seen.has(key)) seen.set(key, r.text);
    else if (seen.get(key) !== r.text) inconsistent++;
  }
  return { clients, mode: o.mode, requests: results.length, errors: results.length - okr.length, inconsistent,
    tokens, seconds: wall, tok_s: tokens / wall, ttft_p50_ms: quantile(ttft, 0.5), ttft_p99_ms: quantile(ttft, 0.99),
    itl_p50_ms: quantile(itl, 0.5), itl_p99_ms: quantile(itl, 0.99),
    first_error: results.find((r) => r.error)?.error };
}

async function main() {
  const o = args(process.argv.slice(2));
  const adapters = o.adapters ? o.adapters.split(",") : [];
  const prompts = loadPrompts(o.prompts);
  const rows = [];
  console.log(`${o.server} at ${o.url}, mode ${o.mode}, ${adapters.length} adapters, ${o.requests} requests a client, ` +
    `max_tokens ${o["max-tokens"]}`);
  console.log("clients  requests  errors  tokens    tok/s  ttft p50/p99 ms   itl p50/p99 ms");
  const f = (x) => (Number.isNaN(x) ? "-" : x.toFixed(1));
  for (const c of o.clients.split(",").map(Number)) {
    const r = await level(o, c, adapters, prompts);
    rows.push(r);
    console.log(`${String(c).padStart(7)}  ${String(r.requests).padStart(8)}  ${String(r.errors).padStart(6)}  ` +
      `${String(r.tokens).padStart(6)}  ${f(r.tok_s).padStart(7)}  ${(f(r.ttft_p50_ms) + "/" + f(r.ttft_p99_ms)).padStart(15)}  ` +
      `${(f(r.itl_p50_ms) + "/" + f(r.itl_p99_ms)).padStart(15)}` + (r.inconsistent ? `  (${r.inconsistent} greedy texts differ)` : "") +
      (r.first_error ? `  first error: ${r.first_error}` : ""));
  }
  if (o.json) writeFileSync(o.json, JSON.stringify({ server: o.server, url: o.url, adapters, rows }, null, 2));
  process.exit(rows.some((r) => r.errors || r.inconsistent) ? 1 : 0);
}
main().catch((e) => { console.error("load:", e.message); process.exit(2); });
