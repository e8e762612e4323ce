// The server through the official openai client (tests/cli_serve.sh runs it):
// models, completions and chat equal `loraplex run` byte for byte (greedy),
// streaming, n > 1 with per-choice adapters, usage, errors as the client's
// error classes, and 64 concurrent requests (mixed adapters, some streamed,
// some cancelled midway) each equal to its `loraplex run` output.
//   usage: node openai.mjs PORT LORAPLEX_BINARY DEMO_DIR API_KEY
import OpenAI from "openai";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

const [port, bin, demo, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey, maxRetries: 0 });
let pass = 0, fail = 0;
const check = (cond, what) => { if (cond) pass++; else { fail++; console.error("FAIL:", what); } };

const tasks = ["correct", "reply", "style-formal", "style-jovial", "style-polite", "style-terse", "summary", "translate"];
const prompts = {};
for (const t of tasks) {
  const first = readFileSync(`${demo}/eval/tasks/${t}.eval.jsonl`, "utf8").split("\n")[0];
  prompts[t] = JSON.parse(first).prompt;
}
const N = 24;
const reference = new Map();
// `loraplex run` prints the text and one newline
function run(adapter, prompt) {
  const key = `${adapter}\u0000${prompt}`;
  if (!reference.has(key)) {
    const args = ["run", "-m", `${demo}/base.gguf`, "-p", prompt, "-n", String(N), "--temp", "0", "-t", "1"];
    if (adapter) args.push("--adapter", `${demo}/adapters/${adapter}.lpa`);
    const out = execFileSync(bin, args, { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] });
    reference.set(key, out.endsWith("\n") ? out.slice(0, -1) : out);
  }
  return reference.get(key);
}

async function main() {
  const models = await client.models.list();
  const ids = models.data.map((m) => m.id);
  check(ids.length === 9 && ids[0] === "base" && tasks.every((t) => ids.includes(t)), `models: ${ids}`);
  check(models.data.slice(1).every((m) => m.parent === "base"), "adapters have parent = base");

  // completions and chat == loraplex run
  for (const t of ["correct", "translate"]) {
    const c = await client.completions.create({ model: t, prompt: prompts[t], max_tokens: N, temperature: 0 });
    check(c.choices[0].text === run(t, prompts[t]), `completion ${t}: ${JSON.stringify(c.choices[0].text)} vs ${JSON.stringify(run(t, prompts[t]))}`);
    check(c.object === "text_completion" && c.usage.prompt_tokens > 0 && c.usage.total_tokens === c.usage.prompt_tokens + c.usage.completion_tokens, "completion usage");
    const m = await client.chat.completions.create({ model: t, messages: [{ role: "user", content: prompts[t] }], max_tokens: N, temperature: 0 });
    check(m.choices[0].message.role === "assistant" && m.choices[0].message.content === run(t, prompts[t]), `chat ${t}`);
  }
  const b = await client.completions.create({ prompt: prompts.correct, max_tokens: N, temperature: 0 });
  check(b.model === "base" && b.choices[0].text === run(null, prompts.correct), "no model: the base");

  // streaming: one id, the role first, a finish_reason last, the same text
  const stream = await client.chat.completions.create({ model: "summary", messages: [{ role: "user", content: prompts.summary }],
    max_tokens: N, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let text = "", chunks = [];
  for await (const ch of stream) {
    chunks.push(ch);
    if (ch.choices[0]?.delta?.content) text += ch.choices[0].delta.content;
  }
  check(text === run("summary", prompts.summary), `stream text ${JSON.stringify(text)}`);
  check(new Set(chunks.map((c) => c.id)).size === 1, "one id for all chunks");
  check(chunks[0].choices[0].delta.role === "assistant", "first chunk has the role");
  const last = chunks[chunks.length - 1];
  check(last.choices.length === 0 && last.usage && last.usage.completion_tokens > 0, "usage chunk last");
  check(chunks[chunks.length - 2].choices[0].finish_reason !== null, "finish_reason before usage");

  // n = 2: per-choice adapters (CTG), and seeded sampling repeats
  const two = await client.completions.create({ prompt: prompts.correct, max_tokens: N, temperature: 0, n: 2,
    choice_models: ["correct", "style-terse"] });
  check(two.choices.length === 2 && two.choices[0].text === run("correct", prompts.correct) &&
        two.choices[1].text === run("style-terse", prompts.correct), "n=2 with choice_models");
  const s1 = await client.completions.create({ model: "reply", prompt: prompts.reply, max_tokens: N, temperature: 0.9, seed: 11, n: 2 });
  const s2 = await client.completions.create({ model: "reply", prompt: prompts.reply, max_tokens: N, temperature: 0.9, seed: 11, n: 2 });
  check(s1.choices[0].text === s2.choices[0].text && s1.choices[1].text === s2.choices[1].text, "seeded sampling repeats");

  // log-probabilities: chat (content[]) and completions (the legacy layout),
  // streamed and not, all the same numbers; tops sorted with the greedy
  // token first; the token texts join to the text
  {
    const p = prompts.correct, ref = run("correct", p);
    const close = (a, b) => Math.abs(a - b) < 1e-3;
    const chat = await client.chat.completions.create({ model: "correct", messages: [{ role: "user", content: p }],
      max_tokens: N, temperature: 0, logprobs: true, top_logprobs: 3 });
    const content = chat.choices[0].logprobs?.content ?? [];
    check(chat.choices[0].message.content === ref && content.map((t) => t.token).join("") === ref &&
          content.length === chat.usage.completion_tokens, "chat logprobs: one entry a token, joining to the text");
    check(content.every((t) => t.top_logprobs.length === 3 && t.top_logprobs[0].token === t.token &&
          t.top_logprobs[0].logprob === t.logprob && t.logprob <= 0 &&
          t.top_logprobs.every((x, i) => i === 0 || x.logprob <= t.top_logprobs[i - 1].logprob) &&
          Buffer.from(t.bytes).toString("utf8") === t.token), "chat logprobs: tops sorted, greedy first, bytes");
    const st = await client.chat.completions.create({ model: "correct", messages: [{ role: "user", content: p }],
      max_tokens: N, temperature: 0, logprobs: true, top_logprobs: 3, stream: true });
    const streamed = [];
    for await (const ch of st) streamed.push(...(ch.choices[0]?.logprobs?.content ?? []));
    check(JSON.stringify(streamed) === JSON.stringify(content), "streamed chat logprobs == non-streamed");
    const comp = await client.completions.create({ model: "correct", prompt: p, max_tokens: N, temperature: 0, logprobs: 3 });
    const lp = comp.choices[0].logprobs;
    check(lp.tokens.join("") === ref && lp.tokens.every((t, i) => t === content[i].token &&
          lp.token_logprobs[i] === content[i].logprob && lp.text_offset[i] === lp.tokens.slice(0, i).join("").length &&
          Object.keys(lp.top_logprobs[i]).length >= 1 && lp.top_logprobs[i][t] === content[i].logprob),
          "completion logprobs (legacy layout) == chat's");
    const cst = await client.completions.create({ model: "correct", prompt: p, max_tokens: N, temperature: 0, logprobs: 3, stream: true });
    const ctoks = [];
    for await (const ch of cst) ctoks.push(...(ch.choices[0]?.logprobs?.tokens ?? []));
    check(ctoks.join("") === ref, "streamed completion logprobs");

    // the same numbers from a prompt that already holds the first k tokens
    // (token ids through /tokenize): the distribution of token k is the
    // same computation from the same KV
    const post = async (path, body) => (await fetch(`http://127.0.0.1:${port}${path}`, { method: "POST",
      headers: { Authorization: `Bearer ${apiKey}` }, body: JSON.stringify(body) })).json();
    const ids = (await post("/tokenize", { content: p, add_special: true })).tokens;
    const gen = (await post("/tokenize", { content: ref })).tokens;
    const pieces = await Promise.all(gen.map(async (t) => (await post("/detokenize", { tokens: [t] })).content));
    check(pieces.join("") === ref && gen.length === content.length && pieces.every((x, i) => x === content[i].token),
          `retokenized output: ${pieces.length} pieces vs ${content.length} tokens`);
    for (const k of [1, 5]) {
      const c = await client.completions.create({ model: "correct", prompt: [...ids, ...gen.slice(0, k)], max_tokens: 1,
        temperature: 0, logprobs: 3 });
      const got = c.choices[0].logprobs;
      check(got.tokens[0] === content[k].token && close(got.token_logprobs[0], content[k].logprob) &&
            content[k].top_logprobs.every((x) => close(got.top_logprobs[0][x.token], x.logprob)),
            `logprobs at ${k} from a longer prompt: ${got.token_logprobs[0]} vs ${content[k].logprob}`);
    }

    // logit_bias -100 on the greedy first token: the runner-up comes first
    const biased = await client.completions.create({ model: "correct", prompt: p, max_tokens: 1, temperature: 0,
      logprobs: 3, logit_bias: { [gen[0]]: -100 } });
    check(biased.choices[0].logprobs.tokens[0] === content[0].top_logprobs[1].token &&
          !(content[0].token in biased.choices[0].logprobs.top_logprobs[0]), "logit_bias -100 on the greedy token");
    // penalties: deterministic for a seed, and they change the text
    const pen = { model: "correct", prompt: p, max_tokens: N, temperature: 0.7, seed: 5 };
    const a1 = await client.completions.create({ ...pen, frequency_penalty: 2, presence_penalty: 2 });
    const a2 = await client.completions.create({ ...pen, frequency_penalty: 2, presence_penalty: 2 });
    const a0 = await client.completions.create(pen);
    check(a1.choices[0].text === a2.choices[0].text, "penalized sampling repeats for a seed");
    const g0 = await client.completions.create({ model: "correct", prompt: p, max_tokens: N, temperature: 0, logprobs: 1, frequency_penalty: 2 });
    // greedy under a frequency penalty: no token repeats while others are close; the first token is the same
    check(g0.choices[0].logprobs.tokens[0] === content[0].token && close(g0.choices[0].logprobs.token_logprobs[0], content[0].logprob) &&
          (g0.choices[0].text !== ref || a1.choices[0].text !== a0.choices[0].text), "penalties change the output");
  }

  // errors as the client's classes
  const status = async (p) => { try { await p; return 200; } catch (e) { return e.status; } };
  check(await status(client.completions.create({ model: "nope", prompt: "x" })) === 404, "unknown model: 404");
  check(await status(client.completions.create({ prompt: "x", max_tokens: "many" })) === 400, "wrong type: 400");
  check(await status(client.completions.create({ prompt: "x", temperature: 7 })) === 400, "out of range: 400");
  const wrongKey = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "wrong", maxRetries: 0 });
  check(await status(wrongKey.models.list()) === 401, "wrong key: 401");

  // 64 concurrent clients: mixed adapters (and none), lengths, streamed or
  // not, some cancelled midway; every completed one equals loraplex run
  const jobs = [];
  for (let i = 0; i < 64; i++) {
    const adapter = i % 9 === 8 ? null : tasks[i % 8];
    const prompt = prompts[tasks[(i * 5) % 8]];
    const streamed = i % 3 === 0, cancel = i % 7 === 3;
    jobs.push((async () => {
      const ctl = new AbortController();
      const req = { prompt, max_tokens: N, temperature: 0, ...(adapter ? { model: adapter } : {}) };
      try {
        if (streamed || cancel) {
          const st = await client.completions.create({ ...req, stream: true }, { signal: ctl.signal });
          let t = "", k = 0;
          for await (const ch of st) {
            t += ch.choices[0]?.text ?? "";
            if (cancel && ++k === 2) { ctl.abort(); return "cancelled"; }
          }
          return t === run(adapter, prompt) ? "ok" : `stream ${i}: ${JSON.stringify(t)}`;
        }
        const c = await client.completions.create(req);
        return c.choices[0].text === run(adapter, prompt) ? "ok" : `request ${i}: ${JSON.stringify(c.choices[0].text)}`;
      } catch (e) {
        return cancel && ctl.signal.aborted ? "cancelled" : `request ${i}: ${e.message}`;
      }
    })());
  }
  const results = await Promise.all(jobs);
  const bad = results.filter((r) => r !== "ok" && r !== "cancelled");
  check(bad.length === 0 && results.filter((r) => r === "ok").length >= 50, `under load: ${bad.slice(0, 3)}`);
  // and the server still answers, with nothing left running
  const after = await client.completions.create({ model: "correct", prompt: prompts.correct, max_tokens: N, temperature: 0 });
  check(after.choices[0].text === run("correct", prompts.correct), "after the load");

  console.log(`openai client: ${pass} passed, ${fail} failed`);
  process.exit(fail ? 1 : 0);
}

main().catch((e) => { console.error("FAIL:", e); process.exit(1); });
