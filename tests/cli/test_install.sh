#!/usr/bin/env bash
# make install / make uninstall (issue 35): the files and their modes under DESTDIR + PREFIX,
# every write of the install inside DESTDIR (as root: / read-only but DESTDIR), the paths the unit, the
# generator and the pages name as installed, the installed kpack and krun running the demo model,
# --version's one source of truth (format/release.h == debian/changelog), and uninstall leaving
# no file but an operator's configuration.  (The Debian package: tests/pkg/deb.sh, in CI.)
source "$(dirname "$0")/lib.sh"
cd "$TOP"
BUILD=${BUILD:-build}
# -o all: the binaries of this build are there already; never rebuild them here with another CC
mk() { make -s --no-print-directory -o all BUILD="$BUILD" "$@"; }

D="$T/dest"; mkdir -p "$D"
INSTALL_DIRS=(PREFIX=/usr sysconfdir=/etc systemdunitdir=/lib/systemd/system systemdgeneratordir=/lib/systemd/system-generators)
# As root, the install runs in a mount namespace where / is read-only and only DESTDIR is
# writable: any write elsewhere fails it (EROFS).  The sandbox is shown to refuse such a write.
SANDBOX=
if [ "$(id -u)" -eq 0 ] && command -v unshare >/dev/null \
    && unshare --mount --propagation private sh -c 'mount -o remount,bind,ro / && mount --bind "$1" "$1" && mount -o remount,bind,rw "$1" \
        && touch "$1/in" && ! touch "$2" 2>/dev/null' sh "$D" "$T/outside" && [ -e "$D/in" ] && [ ! -e "$T/outside" ]; then
    rm "$D/in"
    SANDBOX=1
    unshare --mount --propagation private sh -c 'mount -o remount,bind,ro / && mount --bind "$1" "$1" && mount -o remount,bind,rw "$1" \
        && shift && exec "$@"' sh "$D" make -s --no-print-directory -o all BUILD="$BUILD" install DESTDIR="$D" "${INSTALL_DIRS[@]}" >"$T/install.out" 2>&1
    rc=$?
else
    mk install DESTDIR="$D" "${INSTALL_DIRS[@]}" >"$T/install.out" 2>&1
    rc=$?
fi
[ $rc -eq 0 ] && ok "make install DESTDIR=... PREFIX=/usr" || notok "make install failed: $(tail -5 "$T/install.out")"

# what is installed, with its mode: exactly this list (a file added to install is added here)
(cd "$D" && find . ! -type d -printf '%m %p\n' | sort) > "$T/files"
cat > "$T/want" <<'EOF'
644 ./lib/systemd/system/krun-serve@.service
644 ./usr/lib/sysusers.d/krun.conf
644 ./usr/share/bash-completion/completions/kpack
644 ./usr/share/doc/kpk/LICENSE
644 ./usr/share/doc/kpk/README.md
644 ./usr/share/doc/kpk/examples/krun-serve.conf
644 ./usr/share/man/man1/kpack.1
644 ./usr/share/man/man1/krun.1
755 ./lib/systemd/system-generators/krun-serve-generator
755 ./usr/bin/kpack
755 ./usr/bin/krun
777 ./usr/share/bash-completion/completions/krun
EOF
for f in docs/*.md; do echo "644 ./usr/share/doc/kpk/$f"; done >> "$T/want"
sort -o "$T/want" "$T/want"
if diff "$T/want" "$T/files" > "$T/files.diff"; then
    ok "install writes the $(wc -l < "$T/want") files expected (binaries 755, the rest 644; k3synth, a test tool, is not installed)"
else
    notok "installed files differ from the list in test_install.sh (< expected, > installed): $(tr '\n' ' ' < "$T/files.diff")"
fi
[ -d "$D/etc/krun" ] && ok "install makes the configuration directory etc/krun" || notok "no etc/krun under DESTDIR"
[ "$(readlink "$D/usr/share/bash-completion/completions/krun")" = kpack ] && ok "krun's completion is a link to kpack's" \
    || notok "completions/krun is not a link to kpack"

[ -n "$SANDBOX" ] && [ $rc -eq 0 ] && ok "make install succeeds with only DESTDIR writable (/ read-only in its mount namespace, which refuses a write beside DESTDIR)"
[ -n "$SANDBOX" ] || skip "make install with only DESTDIR writable (needs root and unshare)"

# the paths the installed files name are the installed ones; no placeholder is left
grep -q '^ExecStart=/usr/bin/krun serve ${MODEL} $CACHE $ARGS$' "$D/lib/systemd/system/krun-serve@.service" \
    && grep -q '^EnvironmentFile=/etc/krun/%i.conf$' "$D/lib/systemd/system/krun-serve@.service" \
    && grep -q 'confdir=${KRUN_CONF_DIR:-/etc/krun}' "$D/lib/systemd/system-generators/krun-serve-generator" \
    && ! grep -rl '@[a-z]*dir@' "$D" >/dev/null \
    && ok "the unit and the generator name /usr/bin/krun and /etc/krun, no @placeholder@ left" \
    || notok "the installed unit or generator names the wrong paths: $(grep -rn '@[a-z]*dir@\|^ExecStart\|^EnvironmentFile' "$D" | head -3)"

# another prefix, no DESTDIR: the pages and the unit name its directories
P="$T/opt"
mk install prefix="$P" >/dev/null 2>"$T/opt.err" || notok "make install prefix=$P: $(head -3 "$T/opt.err")"
grep -q "^\.It Pa $P/etc/krun/ Ns" "$P/share/man/man1/krun.1" && grep -q "^\.It Pa $P/share/doc/kpk/$" "$P/share/man/man1/kpack.1" \
    && grep -q "^ExecStart=$P/bin/krun " "$P/lib/systemd/system/krun-serve@.service" \
    && ok "prefix=DIR: krun(1), kpack(1) and the unit name DIR/etc/krun, DIR/share/doc/kpk and DIR/bin/krun" \
    || notok "prefix=$P: a page or the unit names another directory"

# the installed tools: --help, --version, and the demo model end to end
"$D/usr/bin/kpack" --help >/dev/null && "$D/usr/bin/krun" --help >/dev/null && ok "installed kpack --help, krun --help" \
    || notok "an installed --help failed"
rel=$(sed -n 's/^#define KPK_RELEASE "\(.*\)"$/\1/p' format/release.h)
deb=$(sed -n '1s/^kpk (\([^)-]*\)\(-[^)]*\)\?).*/\1/p' debian/changelog)
kv=$("$D/usr/bin/kpack" --version | head -1); rv=$("$D/usr/bin/krun" --version | head -1)
if [ -n "$rel" ] && [ "$kv" = "kpack $rel" ] && [ "$rv" = "krun $rel" ] && [ "$deb" = "$rel" ]; then
    ok "kpack --version and krun --version say $rel, format/release.h's, and debian/changelog's upstream version is the same"
else
    notok "versions differ: format/release.h '$rel', debian/changelog '$deb', '$kv', '$rv' (bump both together)"
fi
"$D/usr/bin/kpack" --version | grep -qx "KPK format: writes $(sed -n 's/^#define KPK_VERSION_MAJOR //p' format/kpk.h).$(sed -n 's/^#define KPK_VERSION_MINOR //p' format/kpk.h)" \
    && "$D/usr/bin/krun" --version | grep -q '^KPK format: reads 1.0 to ' && "$D/usr/bin/krun" --version | grep -q '^state files: writes ' \
    && ! "$D/usr/bin/krun" --version | grep -q 'writes 1.1$' \
    && ok "--version names the KPK versions kpack writes and both read, and krun's state file versions" \
    || notok "--version: $("$D/usr/bin/kpack" --version | tr '\n' ' ') / $("$D/usr/bin/krun" --version | tr '\n' ' ')"
if DEMO_DIR="$T/demo" KPK_BIN="$D/usr/bin" K3SYNTH="$BIN/k3synth" tests/demo.sh >"$T/demo.out" 2>&1 \
    && grep -q 'OK' "$T/demo.out" && [ -s "$T/demo/tiny.kpk" ]; then
    ok "the installed kpack and krun run the demo model end to end (check-source, convert, verify, info, krun greedy and sampled)"
else
    notok "the demo with the installed tools failed: $(tail -5 "$T/demo.out")"
fi

# uninstall: no file left; an operator's configuration stays
echo "MODEL=/srv/x.kpk" > "$D/etc/krun/mine.conf"
mk uninstall DESTDIR="$D" "${INSTALL_DIRS[@]}" >"$T/un.out" 2>&1 || notok "make uninstall failed: $(tail -3 "$T/un.out")"
left=$(cd "$D" && find . ! -type d | sort | tr '\n' ' ')
if [ "$left" = "./etc/krun/mine.conf " ] && [ ! -e "$D/usr/share/doc/kpk" ]; then
    ok "make uninstall removes every installed file and the doc directory, and keeps etc/krun/mine.conf"
else
    notok "after make uninstall: left '$left'"
fi
mk uninstall prefix="$P" >/dev/null 2>&1
left=$(find "$P" ! -type d | wc -l)
[ "$left" -eq 0 ] && ok "make uninstall prefix=DIR: nothing left" || notok "make uninstall prefix=$P left $left files"

# install-strip: the same install, the binaries without their symbol tables
S="$T/strip"
if mk install-strip DESTDIR="$S" "${INSTALL_DIRS[@]}" >"$T/strip.out" 2>&1 && "$S/usr/bin/krun" --version >/dev/null \
    && readelf -S "$BIN/krun" | grep -q '\.symtab' && ! readelf -S "$S/usr/bin/krun" | grep -q '\.symtab' \
    && ! readelf -S "$S/usr/bin/kpack" | grep -q '\.symtab'; then
    ok "make install-strip: kpack and krun installed without a symbol table, and run"
else
    notok "make install-strip: $(tail -3 "$T/strip.out")"
fi
finish
