#!/usr/bin/env bash
# 16 and 64 KiB pages (Apple silicon under Linux, some ARM servers): qemu
# reports them to the aarch64 programs (QEMU_PAGESIZE), and the OS seam's
# page rounding (test_kos) and a streamed krun in every --io mode give the
# same results as with 4 KiB pages: the ids and every logit bit of the
# x86-64 krun on the same file.  (qemu still maps in 4 KiB units, so this
# checks what krun computes from the page size, not the kernel's checks.)
. "$(dirname "$0")/../cli/lib.sh"
X86_BIN=${X86_BIN:-$TOP/bin}
"$X86_BIN/k3synth" "$T/m" --geometry tiny --seed 21 --shards 2 --quiet >/dev/null 2>"$T/err" && "$X86_BIN/kpack" convert "$T/m" "$T/m.kpk" --quiet \
    || { notok "k3synth/convert: $(cat "$T/err")"; finish; exit 1; }
IDS=5,80,81,82,200,13,7,7,7,31,99
"$X86_BIN/krun" "$T/m.kpk" --ids $IDS --gen 4 --dump-all-logits "$T/ref.bin" --json "$T/ref.json" --quiet >/dev/null
for pg in 16384 65536; do
    QEMU_PAGESIZE=$pg "$BUILD/tests/test_kos" >"$T/kos.out" 2>&1; rc=$?
    if [ $rc -eq 0 ] && grep -q "kos_page_size() = $pg:" "$T/kos.out" && ! grep -q '^not ok' "$T/kos.out"; then
        ok "$((pg / 1024)) KiB pages: test_kos ($(grep -c '^ok' "$T/kos.out") checks)"
    else
        notok "$((pg / 1024)) KiB pages: test_kos: $(grep -E '^not ok' "$T/kos.out" | head -3)"
    fi
    for io in mmap direct pread; do
        if QEMU_PAGESIZE=$pg "$BIN/krun" "$T/m.kpk" --ids $IDS --gen 4 --dump-all-logits "$T/x.bin" --json "$T/x.json" --quiet \
                --mem 1G --pin 2 --expert-slots 2 --head stream --piece 8K --io $io >/dev/null 2>"$T/x.err" \
            && cmp -s "$T/ref.bin" "$T/x.bin" \
            && python3 -c 'import json,sys; assert json.load(open(sys.argv[1]))["generated_ids"]==json.load(open(sys.argv[2]))["generated_ids"]' "$T/ref.json" "$T/x.json"; then
            ok "$((pg / 1024)) KiB pages, --io $io, streamed: the x86-64 ids and logit bits"
        else
            notok "$((pg / 1024)) KiB pages, --io $io: $(head -c 300 "$T/x.err")"
        fi
    done
done
finish
