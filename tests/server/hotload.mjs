// Hot loading under load (tests/cli_serve.sh runs it): clients stream and
// fetch completions from an adapter while another loop unloads and reloads
// it. Every request either completes with exactly the `loraplex run` text
// for that adapter, or is refused with 404 (it arrived while the adapter was
// unloaded): an unload never frees an adapter a running request uses (the
// server is also run under ASan and TSan by CI).
//   usage: node hotload.mjs PORT LORAPLEX_BINARY DEMO_DIR ADAPTER_PATH_IN_DIR
import OpenAI from "openai";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

const [port, bin, demo, relPath] = process.argv.slice(2);
const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: "none", maxRetries: 0 });
const N = 16, ROUNDS = 12, CLIENTS = 8;
const prompt = JSON.parse(readFileSync(`${demo}/eval/tasks/style-terse.eval.jsonl`, "utf8").split("\n")[0]).prompt;
const want = execFileSync(bin, ["run", "-m", `${demo}/base.gguf`, "--adapter", `${demo}/adapters/style-terse.lpa`,
  "-p", prompt, "-n", String(N), "--temp", "0", "-t", "1"], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] })
  .replace(/\n$/, "");
const post = async (path, body) => (await fetch(`http://127.0.0.1:${port}${path}`, { method: "POST", body: JSON.stringify(body) })).status;

let done = false, ok = 0, refused = 0;
const bad = [];
async function clientLoop(i) {
  while (!done) {
    try {
      let text = "";
      if (i % 2) {
        const st = await client.completions.create({ model: "hot", prompt, max_tokens: N, temperature: 0, stream: true });
        for await (const ch of st) text += ch.choices[0]?.text ?? "";
      } else {
        text = (await client.completions.create({ model: "hot", prompt, max_tokens: N, temperature: 0 })).choices[0].text;
      }
      if (text === want) ok++;
      else bad.push(JSON.stringify(text));
    } catch (e) {
      if (e.status === 404) refused++;
      else bad.push(e.message);
    }
  }
}

async function main() {
  if (await post("/v1/load_lora_adapter", { lora_name: "hot", lora_path: relPath }) !== 200) throw new Error("first load");
  const clients = [...Array(CLIENTS).keys()].map(clientLoop);
  let cycles = 0;
  for (let r = 0; r < ROUNDS; r++) {
    await new Promise((res) => setTimeout(res, 40));
    const u = await post("/v1/unload_lora_adapter", { lora_name: "hot" });
    await new Promise((res) => setTimeout(res, 10));
    const l = await post("/v1/load_lora_adapter", { lora_name: "hot", lora_path: relPath });
    if (u === 200 && l === 200) cycles++;
  }
  await new Promise((res) => setTimeout(res, 100));
  done = true;
  await Promise.all(clients);
  const unloaded = await post("/v1/unload_lora_adapter", { lora_name: "hot" });
  console.log(`hotload: ${cycles} unload/load cycles, ${ok} completed, ${refused} refused, ${bad.length} wrong`);
  if (bad.length) console.error("FAIL:", bad.slice(0, 3));
  process.exit(!bad.length && cycles === ROUNDS && ok > 0 && unloaded === 200 ? 0 : 1);
}
main().catch((e) => { console.error("FAIL:", e); process.exit(1); });
