// Builds a CLIP tokenizer.json (the layout of openai/clip-vit-large-patch14's)
// from the merge list, then prints ids for test strings with @huggingface/tokenizers.
import fs from "fs";
import { Tokenizer } from "@huggingface/tokenizers";
const mergesPath = process.argv[2], stringsPath = process.argv[3];
// GPT-2 bytes_to_unicode
const bs = [];
for (let i = 33; i <= 126; i++) bs.push(i);
for (let i = 161; i <= 172; i++) bs.push(i);
for (let i = 174; i <= 255; i++) bs.push(i);
const cs = bs.slice();
let n = 0;
for (let b = 0; b < 256; b++) if (!bs.includes(b)) { bs.push(b); cs.push(256 + n); n++; }
const chars = cs.map((c) => String.fromCodePoint(c));
const lines = fs.readFileSync(mergesPath, "utf8").split("\n").slice(1).filter((l) => l.length > 0);
const vocab = {};
let id = 0;
for (const c of chars) vocab[c] = id++;
for (const c of chars) vocab[c + "</w>"] = id++;
const merges = [];
for (const l of lines) { const [a, b] = l.split(" "); merges.push(a + " " + b); vocab[a + b] = id++; }
vocab["<|startoftext|>"] = id++;
vocab["<|endoftext|>"] = id++;
const json = {
  version: "1.0", truncation: null, padding: null,
  added_tokens: [
    { id: 49406, content: "<|startoftext|>", single_word: false, lstrip: false, rstrip: false, normalized: true, special: true },
    { id: 49407, content: "<|endoftext|>", single_word: false, lstrip: false, rstrip: false, normalized: false, special: true },
  ],
  normalizer: { type: "Sequence", normalizers: [ { type: "NFC" }, { type: "Replace", pattern: { Regex: "\\s+" }, content: " " }, { type: "Lowercase" } ] },
  pre_tokenizer: { type: "Sequence", pretokenizers: [
    { type: "Split", pattern: { Regex: "<\\|startoftext\\|>|<\\|endoftext\\|>|'s|'t|'re|'ve|'m|'ll|'d|[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+" }, behavior: "Removed", invert: true },
    { type: "ByteLevel", add_prefix_space: false, trim_offsets: true, use_regex: false } ] },
  post_processor: { type: "RobertaProcessing", sep: ["<|endoftext|>", 49407], cls: ["<|startoftext|>", 49406], trim_offsets: false, add_prefix_space: false },
  decoder: { type: "ByteLevel", add_prefix_space: true, trim_offsets: true, use_regex: true },
  model: { type: "BPE", dropout: null, unk_token: "<|endoftext|>", continuing_subword_prefix: "", end_of_word_suffix: "</w>", fuse_unk: false, byte_fallback: false, vocab, merges },
};
const config = { model_max_length: 77, bos_token: "<|startoftext|>", eos_token: "<|endoftext|>", pad_token: "<|endoftext|>", unk_token: "<|endoftext|>", do_lower_case: true };
const tok = new Tokenizer(json, config);
const strings = JSON.parse(fs.readFileSync(stringsPath, "utf8"));
for (const s of strings) {
  let ids = tok.encode(s).ids; // BOS ... EOS
  if (ids[0] !== 49406 || ids[ids.length - 1] !== 49407) throw new Error("no BOS/EOS for " + s);
  let body = ids.slice(1, -1);
  const full = body.length;
  if (body.length > 75) body = body.slice(0, 75); // SD: truncation to 77 with BOS/EOS kept
  const out = [49406, ...body, 49407];
  while (out.length < 77) out.push(49407);            // SD 1.x pads with <|endoftext|>
  process.stdout.write(JSON.stringify(s) + "\t" + full + "\t" + out.join(" ") + "\n");
}
