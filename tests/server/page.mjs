// The chat page in a headless Chromium (Debian's, driven by puppeteer-core;
// tests/cli_page.sh runs it): it loads from the server, lists the adapters,
// streams a chat answer, then a completion with another adapter, then
// side-by-side variants from two adapters at once; each shown text equals
// `loraplex run` for the same greedy request, byte for byte.
//   usage: node page.mjs PORT LORAPLEX_BINARY DEMO_DIR CHROMIUM
import puppeteer from "puppeteer-core";
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

const [port, bin, demo, chromium] = process.argv.slice(2);
const N = 24;
let pass = 0, fail = 0;
const check = (cond, what) => { if (cond) pass++; else { fail++; console.error("FAIL:", what); } };
const prompt = (t) => JSON.parse(readFileSync(`${demo}/eval/tasks/${t}.eval.jsonl`, "utf8").split("\n")[0]).prompt;
const run = (adapter, p) => execFileSync(bin, ["run", "-m", `${demo}/base.gguf`, "--adapter", `${demo}/adapters/${adapter}.lpa`,
  "-p", p, "-n", String(N), "--temp", "0", "-t", "1"], { encoding: "utf8", stdio: ["ignore", "pipe", "ignore"] }).replace(/\n$/, "");

async function main() {
  const browser = await puppeteer.launch({ executablePath: chromium, headless: true,
    args: ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"] });
  try {
    const page = await browser.newPage();
    page.on("pageerror", (e) => check(false, `page error: ${e.message}`));
    await page.goto(`http://127.0.0.1:${port}/`, { waitUntil: "load" });
    await page.waitForFunction(() => document.getElementById("status").textContent.includes("adapters"), { timeout: 20000 });
    const options = await page.$$eval("#model option", (os) => os.map((o) => o.value));
    check(options.length === 9 && options.includes("correct") && options.includes("translate"), `adapters listed: ${options}`);
    await page.$eval("#max", (e, n) => { e.value = String(n); }, N);

    // a chat message with one adapter, streamed into the page
    const answer = async (k) => {
      await page.waitForFunction((k) => document.querySelectorAll(".msg.assistant")[k]?.dataset.done === "1", { timeout: 60000 }, k);
      return page.evaluate((k) => document.querySelectorAll(".msg.assistant")[k].lastChild.textContent, k);
    };
    const say = async (adapter, text) => {
      await page.select("#model", adapter);
      await page.$eval("#input", (e, t) => { e.value = t; }, text);
      await page.click("#send");
    };
    const p1 = prompt("correct");
    await say("correct", p1);
    const a1 = await answer(0);
    check(a1 === run("correct", p1), `chat answer ${JSON.stringify(a1)} vs ${JSON.stringify(run("correct", p1))}`);

    // switch the adapter (and to a plain completion, so the history is not in the prompt)
    await page.click("#raw");
    const p2 = prompt("translate");
    await say("translate", p2);
    const a2 = await answer(1);
    check(a2 === run("translate", p2), `second adapter ${JSON.stringify(a2)} vs ${JSON.stringify(run("translate", p2))}`);

    // variants: one request, n = 2, one adapter per choice
    const p3 = prompt("style-formal");
    await page.$eval("#input", (e, t) => { e.value = t; }, p3);
    for (const m of ["style-formal", "style-terse"]) await page.click(`#pick input[value="${m}"]`);
    await page.click("#vary");
    await page.waitForFunction(() => document.getElementById("variants").dataset.done === "1", { timeout: 60000 });
    const variants = await page.$$eval("#variants .msg", (ds) => ds.map((d) => [d.firstChild.textContent, d.lastChild.textContent]));
    check(variants.length === 2 && variants.every(([m, t]) => t === run(m, p3)),
          `variants ${JSON.stringify(variants)} vs ${JSON.stringify(["style-formal", "style-terse"].map((m) => run(m, p3)))}`);
  } finally {
    await browser.close();
  }
  console.log(`page: ${pass} passed, ${fail} failed`);
  process.exit(fail ? 1 : 0);
}
main().catch((e) => { console.error("FAIL:", e); process.exit(1); });
