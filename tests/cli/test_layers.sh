#!/usr/bin/env bash
# make check-layers (tests/layers/check_layers.py) keeps run/ to its written
# layers (run/LAYERS): the tree passes, and a copy of it with one bad include,
# one bad call or one bad rule planted fails, naming the file and the rule.
. "$(dirname "$0")/lib.sh"
CHECK="python3 $TOP/tests/layers/check_layers.py"
case ${BUILD:-build} in /*) OBJ="$BUILD" ;; *) OBJ="$TOP/${BUILD:-build}" ;; esac

$CHECK --root "$TOP" >"$T/out" 2>&1 && [ ! -s "$T/out" ] && ok "the tree keeps run/LAYERS (every include)" \
    || notok "the tree breaks run/LAYERS: $(head -5 "$T/out")"
if [ -d "$OBJ/run" ]; then
    $CHECK --root "$TOP" --objects "$OBJ" >"$T/out" 2>&1 && ok "every call between the objects of $OBJ goes downward" \
        || notok "calls against run/LAYERS: $(head -5 "$T/out")"
else
    skip "calls: no objects in $OBJ/run (make first)"
fi

# planted: a fresh copy of the sources, one change, the check must fail with `want`
planted() {
    local what=$1 want=$2 change=$3
    rm -rf "$T/tree"; mkdir -p "$T/tree"
    cp -r "$TOP/run" "$TOP/format" "$TOP/pack" "$T/tree/"
    (cd "$T/tree" && eval "$change")
    if $CHECK --root "$T/tree" >"$T/out" 2>&1; then notok "$what: not caught"
    elif grep -qE -- "$want" "$T/out"; then ok "$what: caught ($(grep -E -- "$want" "$T/out" | head -1))"
    else notok "$what: caught, but not as expected: $(head -3 "$T/out")"
    fi
}
planted "a command including the store" 'run/cli/main.c:[0-9]+: includes run/store/store.h: cli uses only' \
    'echo "#include \"run/store/store.h\"" >>run/cli/main.c'
planted "the server including the forward pass" 'run/serve/serve_gen.c:[0-9]+: includes run/engine/forward.h: serve uses only' \
    'echo "#include \"run/engine/forward.h\"" >>run/serve/serve_gen.c'
planted "the engine including the session (upward)" 'run/engine/ops.c:[0-9]+: includes run/session/session.h: engine uses only' \
    'echo "#include \"run/session/session.h\"" >>run/engine/ops.c'
planted "the store including the engine (upward)" 'run/store/store.h:[0-9]+: includes run/engine/weights.h: store uses only' \
    'sed -i "s|^#include \"store_pieces.h\"|&\n#include \"run/engine/weights.h\"|" run/store/store.h'
planted "the text layer including the model" 'run/text/tokenizer.c:[0-9]+: includes run/model/model.h: text uses only util' \
    'echo "#include \"run/model/model.h\"" >>run/text/tokenizer.c'
planted "the grammar including the APIs' JSON (upward)" 'run/grammar/kgram.c:[0-9]+: includes run/api/oai.h: grammar uses only text util' \
    'echo "#include \"run/api/oai.h\"" >>run/grammar/kgram.c'
planted "the chat format including the grammar (upward)" 'run/text/chat_render.c:[0-9]+: includes run/grammar/kgram.h: text uses only util' \
    'echo "#include \"run/grammar/kgram.h\"" >>run/text/chat_render.c'
planted "run/ including pack/" 'run/util/procmem.c:[0-9]+: includes pack/cli.h: nothing in run/ uses pack/' \
    'echo "#include \"pack/cli.h\"" >>run/util/procmem.c'
planted "format/ including run/" 'format/kio.c:[0-9]+: includes run/util/krun_err.h: format/ uses nothing but itself' \
    'echo "#include \"run/util/krun_err.h\"" >>format/kio.c'
planted "pack/ including run/" 'pack/cli.c:[0-9]+: includes run/session/session.h: pack/ uses only format/' \
    'echo "#include \"run/session/session.h\"" >>pack/cli.c'
planted "an include that names no folder" 'run/engine/ops.c:[0-9]+: #include "model.h" names no folder' \
    'echo "#include \"model.h\"" >>run/engine/ops.c'
planted "a header the session may include, seen through it by a command" \
    'run/cli/[a-z_]+\.[ch]: sees run/engine/forward.h \(through run/session/session.h\)' \
    'sed -i "s|^#include \"memplan.h\"|&\n#include \"run/engine/forward.h\"|" run/session/session.h'
planted "a file of run/ outside the layers" 'run/stray.c: a file of run/ itself' 'echo "int stray;" >run/stray.c'
planted "a cycle in the rules" 'run/LAYERS: the rules have a cycle' 'sed -i "s/^util:.*/util: text/" run/LAYERS'
planted "includes in a cycle between folders" 'the includes make a cycle between folders: .*session.*text' \
    'echo "#include \"run/session/session.h\"" >>run/text/stopstr.c'

# a call against the rules, in the objects: the text layer calling the session
if [ -d "$OBJ/run" ] && command -v "${CC:-cc}" >/dev/null; then
    rm -rf "$T/tree" "$T/obj"; mkdir -p "$T/tree" "$T/obj"
    cp -r "$TOP/run" "$TOP/format" "$TOP/pack" "$T/tree/"
    (cd "$OBJ" && find format pack run -name '*.o' -exec cp --parents {} "$T/obj/" \;)
    printf '#include "run/session/session.h"\nvoid text_calls_up(void);\nvoid text_calls_up(void) { krun_session_free(NULL); }\n' \
        >"$T/tree/run/text/up.c"
    ${CC:-cc} -std=c11 -D_GNU_SOURCE -I"$T/tree" -c "$T/tree/run/text/up.c" -o "$T/obj/run/text/up.o" 2>"$T/err"
    sed -i '/^#include "run\/session\/session.h"/d' "$T/tree/run/text/up.c"   # the call alone, not the include
    if $CHECK --root "$T/tree" --objects "$T/obj" >"$T/out" 2>&1; then notok "a call from text/ up to session/: not caught"
    elif grep -qE 'run/text/up.c: calls run/session/session.c \(krun_session_free\): text uses only util' "$T/out"; then
        ok "a call from text/ up to session/: caught ($(grep -E 'calls' "$T/out" | head -1))"
    else notok "a call from text/ up to session/: caught, but not as expected: $(head -3 "$T/out")"
    fi
else
    skip "a planted call: no objects in $OBJ/run or no compiler"
fi
finish
