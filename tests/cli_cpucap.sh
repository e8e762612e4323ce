#!/usr/bin/env bash
# LORAPLEX_CPU end to end: `info` and `bench` show the kernel levels in use
# and say when they are capped; every cap gives the highest levels at or
# below both it and this CPU's; an unknown value is refused, naming the
# accepted ones (and only warned about by the library elsewhere).
set -u
bin="$1"; models="$2"; work="$3/cli_cpucap_tmp"
mkdir -p "$work"
fail=0; pass=0
ok() { pass=$((pass+1)); }
bad() { echo "FAIL: $*" >&2; fail=$((fail+1)); }
m="$models/stories260K.gguf"

kernels_line() { grep '^kernels:' | sed 's/^kernels: *//'; }
native=$(env -u LORAPLEX_CPU "$bin" info "$m" | kernels_line)
case "$native" in *LORAPLEX_CPU*|"") bad "uncapped info: '$native'" ;; *) ok ;; esac
native_int=${native%% *}
native_float=$(printf '%s\n' "$native" | sed -n 's/.*(float \([a-z0-9-]*\)).*/\1/p' | head -1)
echo "this CPU: $native"

# level orders, lowest first
ints=(reference avx2 avx-vnni avx512-vnni amx-int8 neon-dotprod)
floats=(reference avx2 avx512)
idx() { local want=$1; shift; local i=0; for v in "$@"; do [ "$v" = "$want" ] && { echo $i; return; }; i=$((i+1)); done; echo -1; }
min_of() { local a b; a=$(idx "$1" "${@:3}"); b=$(idx "$2" "${@:3}"); [ "$a" -le "$b" ] && echo "$1" || echo "$2"; }

if [ "$(uname -m)" = x86_64 ]; then
  caps=(amx avx512-vnni avx512 avx-vnni avx2 reference)
  # avx-vnni only where the CPU has it; the avx512 cap runs an AVX-512 CPU
  # as one without VNNI (so without AVX-VNNI) and lowers nothing below that
  flag() { grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -qx "$1"; }
  vnni256=avx2; flag avx_vnni && vnni256=avx-vnni
  int512=avx2; flag avx512f || int512=$vnni256
  declare -A cap_int=([amx]=amx-int8 [avx512-vnni]=avx512-vnni [avx512]=$int512 [avx-vnni]=$vnni256 [avx2]=avx2
                      [reference]=reference)
  declare -A cap_float=([amx]=avx512 [avx512-vnni]=avx512 [avx512]=avx512 [avx-vnni]=avx2 [avx2]=avx2
                        [reference]=reference)
  accepted="amx, avx512-vnni, avx512, avx-vnni, avx2, reference"
else
  caps=(neon-dotprod reference)
  declare -A cap_int=([neon-dotprod]=neon-dotprod [reference]=reference)
  declare -A cap_float=([neon-dotprod]=reference [reference]=reference)
  accepted="neon-dotprod, reference"
fi

for cap in "${caps[@]}"; do
  want_int=$(min_of "${cap_int[$cap]}" "$native_int" "${ints[@]}")
  want_float=$(min_of "${cap_float[$cap]}" "$native_float" "${floats[@]}")
  line=$(LORAPLEX_CPU=$cap "$bin" info "$m" 2>"$work/err" | kernels_line); rc=$?
  echo "LORAPLEX_CPU=$cap: $line"
  case "$line" in
    "$want_int "*"(float $want_float)"*) ok ;;
    *) bad "cap $cap: '$line', expected $want_int / float $want_float" ;;
  esac
  if [ "$want_int" != "$native_int" ] || [ "$want_float" != "$native_float" ]; then
    case "$line" in *"capped by LORAPLEX_CPU=$cap (this CPU: $native_int"*) ok ;; *) bad "cap $cap not reported: '$line'" ;; esac
  else
    case "$line" in *"not lowered by LORAPLEX_CPU=$cap"*) ok ;; *) bad "cap $cap above this CPU: '$line'" ;; esac
  fi
  # bench says the same, first, on stdout (stderr with --json)
  out=$(LORAPLEX_CPU=$cap "$bin" bench -m "$m" -p 4 -n 2 -t 1 -r 1 --bw-mib 0 2>"$work/err"); rc=$?
  first=$(printf '%s\n' "$out" | head -1)
  [ $rc -eq 0 ] && [ "$first" = "kernels: $line" ] && ok || bad "bench cap $cap: rc=$rc '$first' vs '$line' $(cat "$work/err")"
  out=$(LORAPLEX_CPU=$cap "$bin" bench -m "$m" -p 4 -n 2 -t 1 -r 1 --bw-mib 0 --json 2>"$work/err"); rc=$?
  [ $rc -eq 0 ] && grep -q "^kernels: $want_int " "$work/err" && [ "$(printf '%s\n' "$out" | grep -vc '^{.*}$')" = 0 ] \
    && ok || bad "bench --json cap $cap: rc=$rc $out $(cat "$work/err")"
done

# case and aliases
line=$(LORAPLEX_CPU=Reference "$bin" info "$m" | kernels_line)
case "$line" in "reference (float reference)"*) ok ;; *) bad "Reference: '$line'" ;; esac

# unknown values: info and bench refuse them, naming the accepted values
for v in avx3 "avx2 " native; do
  LORAPLEX_CPU="$v" "$bin" info "$m" >/dev/null 2>"$work/err"; rc=$?
  [ $rc -eq 2 ] && grep -qF "accepted: $accepted" "$work/err" && ok || bad "info with '$v': rc=$rc $(cat "$work/err")"
  LORAPLEX_CPU="$v" "$bin" bench -m "$m" -p 4 -n 2 -t 1 -r 1 --bw-mib 0 >/dev/null 2>"$work/err"; rc=$?
  [ $rc -eq 2 ] && grep -qF "accepted: $accepted" "$work/err" && ok || bad "bench with '$v': rc=$rc $(cat "$work/err")"
done
# other commands run uncapped with a warning
out=$(LORAPLEX_CPU=avx3 "$bin" run -m "$m" -p "Once" -n 2 --temp 0 2>"$work/err"); rc=$?
[ $rc -eq 0 ] && grep -q "warning: LORAPLEX_CPU=avx3 is not a kernel level; accepted: $accepted" "$work/err" \
  && ok || bad "run with a bad cap: rc=$rc $(cat "$work/err")"

rm -rf "$work"
echo "cli_cpucap: $pass passed, $fail failed"
[ $fail -eq 0 ]
