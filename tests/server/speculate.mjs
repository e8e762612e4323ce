// Speculation per request through the official openai client
// (tests/cli_serve_spec.sh runs it against a server with --speculate auto and
// a forecast set for "correct"): 32 concurrent requests, half with the
// loraplex extension "speculate": true and half false, mixed adapters,
// greedy and seeded, streamed and not; each speculative text must equal its
// plain twin. The client passes unknown body fields through unchanged.
//   usage: node speculate.mjs PORT
import OpenAI from "openai";

const [port] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "none", maxRetries: 0 });
let pass = 0, fail = 0;
const check = (cond, what) => { if (cond) pass++; else { fail++; console.error("FAIL:", what); } };

const prompts = ["the cat sat on the mat and the cat", "once upon a time there was a"];
const models = ["correct", "summary", "base", "style-formal"];

async function one(model, prompt, sampling, stream, chat, speculate) {
  const common = { model, max_tokens: 32, stream, speculate, ...sampling };
  if (chat) {
    const r = await client.chat.completions.create({ ...common, messages: [{ role: "user", content: prompt }] });
    if (!stream) return r.choices[0].message.content;
    let t = "";
    for await (const ch of r) t += ch.choices[0]?.delta?.content ?? "";
    return t;
  }
  const r = await client.completions.create({ ...common, prompt });
  if (!stream) return r.choices[0].text;
  let t = "";
  for await (const ch of r) t += ch.choices[0]?.text ?? "";
  return t;
}

async function main() {
  const jobs = [];
  let k = 0;
  for (const model of models)
    for (const prompt of prompts)
      for (const sampling of [{ temperature: 0 }, { temperature: 0.8, seed: 11 }]) {
        const stream = k % 2 === 0, chat = k % 3 === 0;
        k++;
        const what = `${model} ${JSON.stringify(sampling)} stream=${stream} chat=${chat}`;
        jobs.push(Promise.all([one(model, prompt, sampling, stream, chat, true),
                               one(model, prompt, sampling, stream, chat, false)])
          .then(([a, b]) => check(a === b && b.length > 0, `${what}: ${JSON.stringify(a)} vs ${JSON.stringify(b)}`)));
      }
  await Promise.all(jobs);
  console.log(`speculate.mjs: ${pass} passed, ${fail} failed`);
  process.exit(fail ? 1 : 0);
}
main().catch((e) => { console.error("FAIL:", e); process.exit(1); });
