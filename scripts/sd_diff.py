#!/usr/bin/env python3
"""How far one `loraplex image` run is from another (the INT8-vs-float
figures of docs/benchmarks.md): the final latents' relative error (RMS of
the difference over RMS of the reference) from two --latents-out files, and
the PSNR of two 8-bit RGB PNGs. Standard library only.

    scripts/sd_diff.py REF.lat OTHER.lat [REF.png OTHER.png]
"""
import math
import struct
import sys
import zlib


def floats(path):
    data = open(path, "rb").read()
    if len(data) % 4:
        sys.exit(f"{path}: {len(data)} bytes, not float32s")
    return struct.unpack(f"<{len(data) // 4}f", data)


def png_rgb(path):
    """The pixels of an 8-bit RGB, non-interlaced PNG (what loraplex writes)."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        sys.exit(f"{path}: not a PNG")
    pos, idat, w = 8, b"", None
    while pos + 8 <= len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", body)
            if depth != 8 or color != 2 or interlace:
                sys.exit(f"{path}: not 8-bit RGB without interlace")
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    if w is None:
        sys.exit(f"{path}: no IHDR")
    raw, stride, out, prev = zlib.decompress(idat), w * 3, bytearray(), bytearray(w * 3)
    for y in range(h):
        f, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - 3] if i >= 3 else 0
            b, c = prev[i], prev[i - 3] if i >= 3 else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        out += line
        prev = line
    return w, h, bytes(out)


def main():
    if len(sys.argv) not in (3, 5):
        sys.exit(__doc__.strip())
    ref, other = floats(sys.argv[1]), floats(sys.argv[2])
    if len(ref) != len(other):
        sys.exit("the latents differ in size")
    diff = math.sqrt(sum((a - b) ** 2 for a, b in zip(ref, other)) / len(ref))
    rms = math.sqrt(sum(a * a for a in ref) / len(ref))
    line = f"latent rel. error {diff / rms:.3e} (RMS diff {diff:.3e}, RMS ref {rms:.3e})"
    if len(sys.argv) == 5:
        (w1, h1, p1), (w2, h2, p2) = png_rgb(sys.argv[3]), png_rgb(sys.argv[4])
        if (w1, h1) != (w2, h2):
            sys.exit("the images differ in size")
        mse = sum((a - b) ** 2 for a, b in zip(p1, p2)) / len(p1)
        line += f", PSNR {'inf' if mse == 0 else f'{10 * math.log10(255 * 255 / mse):.1f}'} dB"
    print(line)


if __name__ == "__main__":
    main()
