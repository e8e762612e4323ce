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
