#!/usr/bin/env bash
# loraplex synth --preset sd-tiny and loraplex image end to end: a valid PNG
# of the asked size (signature and IHDR read back), the same bytes for the
# same seed, --latents-out of [4][H/8][W/8] float32, --noise read back (the
# latent written by one run fed as another's noise changes the result), and
# clear errors for a wrong noise size, a bad sampler and a missing model;
# --lora (runtime LoRAs, scales, a textual-inversion token), a batch of two
# images with different adapters == each alone; --precision w8a16 / w8a8;
# loraplex compile of the checkpoint and image on the compiled file;
# --init / --strength (the steps a strength runs) and --mask (a white mask is
# plain image to image, bit for bit), an inpainting (9-channel) checkpoint,
# and the errors of a missing init, a mask or init of another size; a
# diffusers folder (synth --layout diffusers) gives the single file's latents.
set -u
bin="$1"; models="$2"; work="$3/cli_image_tmp"
mkdir -p "$work"
fail=0; pass=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail+1)); }
export LORAPLEX_SHARED_MODELS="$models"
m="$work/sd-tiny.safetensors"

"$bin" synth --preset sd-tiny --type f16 -o "$m" 2>"$work/err" && ok || bad "synth: $(cat "$work/err")"
grep -q "424 tensors" "$work/err" && ok || bad "synth summary: $(cat "$work/err")"

run() { "$bin" image -m "$m" -p "a photo of a cat" -W 64 -H 32 --steps 2 -t 1 "$@" 2>"$work/err"; }
run --seed 3 -o "$work/a.png" --latents-out "$work/a.lat" && ok || bad "image: $(cat "$work/err")"
grep -q "step 2/2" "$work/err" && ok || bad "progress: $(cat "$work/err")"
grep -Eq "text encoder [0-9]+ ms, UNet [0-9.]+ s/step \(2 steps, [0-9.]+ s\), VAE decoder [0-9.]+ s" "$work/err" && ok || bad "timings: $(cat "$work/err")"
# PNG signature, then the IHDR chunk's width and height (big-endian)
[ "$(head -c 8 "$work/a.png" | od -An -tx1 | tr -d ' \n')" = "89504e470d0a1a0a" ] && ok || bad "PNG signature"
[ "$(od -An -tu1 -j 12 -N 4 "$work/a.png" | tr -s ' ')" = " 73 72 68 82" ] && ok || bad "no IHDR first"
[ "$(od -An -tu1 -j 16 -N 8 "$work/a.png" | tr -s ' ')" = " 0 0 0 64 0 0 0 32" ] && ok || bad "IHDR size"
[ "$(stat -c %s "$work/a.lat")" = $((4 * 8 * 4 * 4)) ] && ok || bad "latents-out size $(stat -c %s "$work/a.lat")"
run --seed 3 -o "$work/b.png" && cmp -s "$work/a.png" "$work/b.png" && ok || bad "same seed, other bytes"
run --seed 4 -o "$work/c.png" && ! cmp -s "$work/a.png" "$work/c.png" && ok || bad "another seed, same bytes"
run --seed 3 --noise "$work/a.lat" -o "$work/d.png" && ! cmp -s "$work/a.png" "$work/d.png" && ok || bad "--noise ignored"
run --sampler dpm++2m --scheduler karras --cfg 1 --clip-skip 2 -o "$work/e.png" && ok || bad "dpm++2m: $(cat "$work/err")"

# int8 weights: w8a16 and w8a8 each give an image of their own, the same for a seed, and say what they hold;
# a LoRA runs on int8 weights as on f32
for pr in w8a16 w8a8; do
  run --seed 3 --precision $pr -o "$work/$pr.png" --latents-out "$work/$pr.lat" && ok || bad "--precision $pr: $(cat "$work/err")"
  grep -q "$pr weights, [0-9]* MB int8" "$work/err" && ok || bad "--precision $pr summary: $(cat "$work/err")"
  ! cmp -s "$work/a.lat" "$work/$pr.lat" && ok || bad "--precision $pr is f32"
  run --seed 3 --precision $pr -o "$work/$pr-2.png" && cmp -s "$work/$pr.png" "$work/$pr-2.png" && ok || bad "--precision $pr: same seed, other bytes"
done
! cmp -s "$work/w8a16.lat" "$work/w8a8.lat" && ok || bad "w8a8 is w8a16"
run --precision int4 -o "$work/f.png"; rc=$?
[ $rc -eq 2 ] && grep -q "f32, w8a16 or w8a8" "$work/err" && ok || bad "bad precision: rc=$rc $(cat "$work/err")"

# loraplex compile: the memory-mapped file gives the converted checkpoint's latents bit for bit (q8 with
# its default w8a8 and with w8a16; f32); it refuses a precision its weights do not have, and 4-bit weights
"$bin" compile "$m" -o "$work/t8.lpx" >"$work/out" 2>"$work/err" && grep -q "q8 per output channel" "$work/out" && ok || bad "compile q8: $(cat "$work/err" "$work/out")"
"$bin" compile "$m" --weights f32 -o "$work/t32.lpx" >"$work/out" 2>"$work/err" && ok || bad "compile f32: $(cat "$work/err")"
run --seed 3 -m "$work/t8.lpx" -o "$work/c8.png" --latents-out "$work/c8.lat" && cmp -s "$work/c8.lat" "$work/w8a8.lat" && ok || bad "compiled q8 != --precision w8a8: $(cat "$work/err")"
run --seed 3 -m "$work/t8.lpx" --precision w8a16 -o "$work/c16.png" --latents-out "$work/c16.lat" && cmp -s "$work/c16.lat" "$work/w8a16.lat" && ok || bad "compiled q8 w8a16 != --precision w8a16"
run --seed 3 -m "$work/t32.lpx" -o "$work/c32.png" --latents-out "$work/c32.lat" && cmp -s "$work/c32.lat" "$work/a.lat" && ok || bad "compiled f32 != f32: $(cat "$work/err")"
run -m "$work/t8.lpx" --precision f32 -o "$work/f.png"; rc=$?
[ $rc -ne 0 ] && grep -q "holds int8 weights" "$work/err" && ok || bad "f32 on a q8 file: rc=$rc $(cat "$work/err")"
"$bin" compile "$m" --weights q4 -o "$work/t4.lpx" 2>"$work/err"; rc=$?
[ $rc -eq 2 ] && grep -q "q8 or f32" "$work/err" && ok || bad "compile q4: rc=$rc $(cat "$work/err")"
head -c 5000 "$work/t8.lpx" > "$work/cut.lpx"

# image to image and inpainting from the first run's picture
png() { # FILE W H: a grey PNG, left half white when 4th arg is half, else all of VALUE
  python3 - "$@" <<'PY'
import struct, sys, zlib
f, w, h, v = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
row = lambda: bytes(255 if v == "half" and x < w // 2 - 3 or v == "white" else 0 for x in range(w) for _ in range(3))
raw = b"".join(b"\0" + row() for _ in range(h))
ch = lambda t, d: struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))
open(f, "wb").write(b"\x89PNG\r\n\x1a\n" + ch(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)) +
                    ch(b"IDAT", zlib.compress(raw)) + ch(b"IEND", b""))
PY
}
png "$work/white.png" 64 32 white; png "$work/half.png" 64 32 half; png "$work/small.png" 32 32 white
run --seed 5 --init "$work/a.png" --strength 0.5 -o "$work/i.png" --latents-out "$work/i.lat" && ok || bad "--init: $(cat "$work/err")"
grep -Eq "VAE encoder [0-9.]+ s, UNet [0-9.]+ s/step \(1 step," "$work/err" && ok || bad "--init timings: $(cat "$work/err")"
grep -q "step 1/1" "$work/err" && ok || bad "--strength 0.5 of 2 steps: $(cat "$work/err")"
! cmp -s "$work/i.lat" "$work/a.lat" && ok || bad "--init ignored"
run --seed 5 --init "$work/a.png" --strength 0.5 --mask "$work/white.png" -o "$work/j.png" --latents-out "$work/j.lat" && cmp -s "$work/i.lat" "$work/j.lat" && ok || bad "white mask != image to image: $(cat "$work/err")"
run --seed 5 --init "$work/a.png" --strength 0.5 --mask "$work/half.png" -o "$work/k.png" --latents-out "$work/k.lat" && ! cmp -s "$work/i.lat" "$work/k.lat" && ok || bad "half mask: $(cat "$work/err")"
"$bin" image -m "$m" -p x --steps 2 -t 1 --init "$work/a.png" -o "$work/l.png" 2>"$work/err" && grep -q "64x32" "$work/err" && ok || bad "init's size: $(cat "$work/err")"
run --mask "$work/half.png" -o "$work/f.png"; rc=$?
[ $rc -eq 2 ] && grep -q "needs --init" "$work/err" && ok || bad "mask without init: rc=$rc $(cat "$work/err")"
run --init "$work/a.png" --mask "$work/small.png" -o "$work/f.png"; rc=$?
[ $rc -ne 0 ] && grep -q "small.png is 32x32" "$work/err" && ok || bad "mask of another size: rc=$rc $(cat "$work/err")"
run --init "$work/small.png" -o "$work/f.png"; rc=$?
[ $rc -ne 0 ] && grep -q "not the 64x32" "$work/err" && ok || bad "init of another size: rc=$rc $(cat "$work/err")"
# the diffusers folder layout: the same tensors give the same latents; a missing part is named
"$bin" synth --preset sd-tiny --type f16 --layout diffusers -o "$work/folder" 2>"$work/err" && [ -f "$work/folder/vae/diffusion_pytorch_model.safetensors" ] && ok || bad "synth --layout diffusers: $(cat "$work/err")"
run --seed 3 -m "$work/folder" -o "$work/fo.png" --latents-out "$work/fo.lat" && cmp -s "$work/fo.lat" "$work/a.lat" && ok || bad "diffusers folder != single file: $(cat "$work/err")"
mv "$work/folder/unet/diffusion_pytorch_model.safetensors" "$work/folder/unet/x"
run -m "$work/folder" -o "$work/f.png"; rc=$?
[ $rc -ne 0 ] && grep -q "unet/diffusion_pytorch_model.safetensors" "$work/err" && ok || bad "folder without its unet: rc=$rc $(cat "$work/err")"
"$bin" synth --preset sd-tiny-inpaint -o "$work/inp.safetensors" 2>"$work/err" && ok || bad "synth inpaint: $(cat "$work/err")"
run -m "$work/inp.safetensors" --init "$work/a.png" --mask "$work/half.png" --strength 1 -o "$work/n.png" && ok || bad "9-channel inpainting: $(cat "$work/err")"
run -m "$work/inp.safetensors" -o "$work/f.png"; rc=$?
[ $rc -ne 0 ] && grep -q "inpainting UNet (9 input channels) needs" "$work/err" && ok || bad "9-channel without a mask: rc=$rc $(cat "$work/err")"
run -m "$work/cut.lpx" -o "$work/f.png"; rc=$?
[ $rc -ne 0 ] && grep -q "cut.lpx: header says" "$work/err" && ok || bad "truncated compiled file: rc=$rc $(cat "$work/err")"

# LoRAs as runtime inputs: a Kohya file (every linear and conv) changes the image, at scale 0 it is the
# base bit for bit; a cloneofsimo file's token "<s1>" in the prompt changes the text; a file for SD 1.5
# is refused naming its first key that does not fit
"$bin" synth --preset sd-tiny-lora --format kohya --rank 4 -o "$work/k.safetensors" 2>"$work/err" && ok || bad "synth lora: $(cat "$work/err")"
"$bin" synth --preset sd-tiny-lora --format cloneofsimo -o "$work/c.safetensors" 2>"$work/err" && ok || bad "synth lora: $(cat "$work/err")"
run --seed 3 --lora "$work/k.safetensors" -o "$work/l1.png" --latents-out "$work/l1.lat" && ok || bad "--lora: $(cat "$work/err")"
grep -q "k.safetensors (kohya: .* at 1" "$work/err" && ok || bad "--lora summary: $(cat "$work/err")"
! cmp -s "$work/a.lat" "$work/l1.lat" && ok || bad "the LoRA changed nothing"
run --seed 3 --precision w8a8 --lora "$work/k.safetensors" -o "$work/l8.png" --latents-out "$work/l8.lat" && ! cmp -s "$work/w8a8.lat" "$work/l8.lat" && ok || bad "--lora on w8a8: $(cat "$work/err")"
run --seed 3 --lora "$work/k.safetensors:0" -o "$work/l0.png" --latents-out "$work/l0.lat" && cmp -s "$work/a.lat" "$work/l0.lat" && ok || bad "--lora X:0 is not the base"
run --seed 3 --lora "$work/k.safetensors:0.5" -o "$work/lh.png" --latents-out "$work/lh.lat" && ! cmp -s "$work/l1.lat" "$work/lh.lat" && ok || bad "--lora X:0.5 is X:1"
run --seed 3 --lora "$work/c.safetensors" -o "$work/t0.png" --latents-out "$work/t0.lat" && ok || bad "cloneofsimo: $(cat "$work/err")"
"$bin" image -m "$m" -p "a photo of <s1>" -W 64 -H 32 --steps 2 -t 1 --seed 3 --lora "$work/c.safetensors" --latents-out "$work/t1.lat" -o "$work/t1.png" 2>"$work/err" && ok || bad "token: $(cat "$work/err")"
"$bin" image -m "$m" -p "a photo of" -W 64 -H 32 --steps 2 -t 1 --seed 3 --lora "$work/c.safetensors" --latents-out "$work/t2.lat" -o "$work/t2.png" 2>"$work/err" && ok || bad "token: $(cat "$work/err")"
! cmp -s "$work/t1.lat" "$work/t2.lat" && ok || bad "the token <s1> changed nothing"
# two images in one batch, the second with its own adapter: each equals its run alone (seed + 1 for the second)
"$bin" image -m "$m" -p "a photo of a cat" -p "a dog" --image-lora 1="$work/k.safetensors" -W 64 -H 32 --steps 2 -t 1 \
  --seed 3 --latents-out "$work/b2.lat" -o "$work/b2.png" 2>"$work/err" && ok || bad "batch: $(cat "$work/err")"
[ -s "$work/b2-0.png" ] && [ -s "$work/b2-1.png" ] && [ ! -e "$work/b2.png" ] && ok || bad "batch PNG names: $(ls "$work")"
"$bin" image -m "$m" -p "a dog" --lora "$work/k.safetensors" -W 64 -H 32 --steps 2 -t 1 --seed 4 \
  --latents-out "$work/b1.lat" -o "$work/b1.png" 2>"$work/err" && ok || bad "alone: $(cat "$work/err")"
cat "$work/a.lat" "$work/b1.lat" | cmp -s - "$work/b2.lat" && ok || bad "batch latents != each alone"
cmp -s "$work/a.png" "$work/b2-0.png" && cmp -s "$work/b1.png" "$work/b2-1.png" && ok || bad "batch PNGs != each alone"
run --image-lora 2="$work/k.safetensors" -o "$work/f.png"; rc=$?
[ $rc -ne 0 ] && grep -q "there are 1 images" "$work/err" && ok || bad "--image-lora past the batch: rc=$rc $(cat "$work/err")"
run --lora "$models/sd/sd15-lora-diffusers-r4.safetensors" -o "$work/f.png"; rc=$?
[ $rc -ne 0 ] && grep -q "sd15-lora-diffusers-r4.safetensors: key '.*' maps to no" "$work/err" && ok || bad "an SD 1.5 LoRA on sd-tiny: rc=$rc $(cat "$work/err")"
run --lora "$work/none.safetensors" -o "$work/f.png"; rc=$?
[ $rc -ne 0 ] && grep -q "none.safetensors" "$work/err" && ok || bad "missing LoRA: rc=$rc $(cat "$work/err")"

head -c 100 "$work/a.lat" > "$work/short.lat"
run --noise "$work/short.lat" -o "$work/f.png"; rc=$?
[ $rc -ne 0 ] && grep -q "short.lat has 100 bytes" "$work/err" && ok || bad "short noise: rc=$rc $(cat "$work/err")"
run --sampler plms -o "$work/f.png"; rc=$?
[ $rc -eq 2 ] && grep -q "euler, euler_a, ddim" "$work/err" && ok || bad "bad sampler: rc=$rc $(cat "$work/err")"
"$bin" image -m "$work/none.safetensors" -p x -o "$work/f.png" 2>"$work/err"; rc=$?
[ $rc -ne 0 ] && grep -q "none.safetensors" "$work/err" && ok || bad "missing model: rc=$rc $(cat "$work/err")"
run -W 60 -o "$work/f.png"; rc=$?
[ $rc -ne 0 ] && grep -q "multiples of 16" "$work/err" && ok || bad "bad width: rc=$rc $(cat "$work/err")"
[ ! -e "$work/f.png" ] && ok || bad "a failed run wrote a PNG"

rm -rf "$work"
echo "cli_image: $pass passed, $fail failed"
[ $fail -eq 0 ]
