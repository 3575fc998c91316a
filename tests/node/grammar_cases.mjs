// The strings constrained decoding's formats and patterns are checked on, each with ajv's verdict:
// ajv 2020 with ajv-formats (full mode) -- the independent validator -- on every format krun has a
// grammar for and on the patterns zod writes for its helpers, for hand-picked strings and random
// edits of them.  Writes one JSON line per case: {"schema", "s", "ajv", "subset"} ("subset": a
// string in a class docs/SERVE.md says the grammar leaves out on purpose: leap seconds, IP-literal
// URIs, ...; for those only "grammar accepts => ajv accepts" must hold).  tests/unit/test_constrain
// --cases FILE compiles each schema and walks each string (tests/cli/test_krun_serve_agents.sh).
// Usage: node grammar_cases.mjs OUT.jsonl [SEED]; node grammar_cases.mjs --check WALKS.jsonl (below)
import Ajv from "ajv/dist/2020.js";
import addFormats from "ajv-formats";
import { readFileSync, writeFileSync } from "node:fs";
import { z } from "zod";

const [out, seedArg] = process.argv.slice(2);
const ajv = new Ajv({ strict: false, logger: false });
addFormats(ajv);

// --check WALKS.jsonl (test_constrain --walks): every finished random walk of a grammar is a JSON
// document its schema accepts
if (out === "--check") {
  const bad = [];
  let n = 0;
  for (const line of readFileSync(seedArg, "utf8").split("\n")) {
    if (!line) continue;
    const { schema, doc } = JSON.parse(line);
    n++;
    let value, why = null;
    try { value = JSON.parse(doc); } catch (e) { why = "not JSON: " + e.message; }
    if (!why && !ajv.validate(schema, value)) why = ajv.errorsText();
    if (why) bad.push({ schema: JSON.stringify(schema).slice(0, 120), doc: doc.slice(0, 200), why });
  }
  console.log(`${n && !bad.length ? "ok" : "not ok"} - ${n} documents from random walks of the grammars: every one JSON that ajv + ajv-formats ` +
              `accepts under its schema${bad.length ? ": " + bad.length + " not, e.g. " + JSON.stringify(bad.slice(0, 3)) : ""}`);
  process.exit(bad.length || !n ? 1 : 0);
}
let seed = Number(seedArg || 7);
const rnd = (n) => { seed = (seed * 1103515245 + 12345) % 2147483648; return seed % n; };

const formats = {
  "date": ["2024-02-29", "2023-02-29", "1900-02-29", "2000-02-29", "2023-12-31", "2023-13-01", "2023-04-31", "2023-4-01", "20230101", "0000-01-01"],
  "time": ["23:59:59Z", "00:00:00+01:00", "12:30:45.123-05:30", "12:30:45", "24:00:00Z", "12:60:00Z", "12:30:45+0530", "12:30:45+05", "12:30:45z",
           "23:59:60Z", "12:30:45+24:00", "1:30:45Z"],
  "date-time": ["2024-01-01T10:00:00Z", "2024-01-01t10:00:00z", "2024-01-01 10:00:00+02:00", "2024-02-30T10:00:00Z", "2024-01-01T10:00:00",
                "2024-01-01T25:00:00Z", "2024-01-01T10:00:00.5Z", "2016-12-31T23:59:60Z", "2024-01-01\t10:00:00Z"],
  "duration": ["P1Y", "P1Y2M3DT4H5M6S", "PT1H", "P1W", "P", "PT", "P1YT", "P1W2D", "PT1.5S", "P1D", "P2M1D", "PT36H", "P1Y1W"],
  "email": ["a@b.co", "first.last@example.com", "a+tag@sub.example.org", "a..b@c.de", ".a@b.c", "a@b", "a@-b.c", "a@b-.c", "A_B@C.D", "a b@c.d",
            "user@localhost", "x@y.z1", "#!$%&'*+/=?^_`{|}~-@x.io"],
  "hostname": ["example.com", "a", "a.b.c", "-a.com", "a-.com", "a..b", "xn--bcher-kva.example", "example.com.", "a_b.com", "1.2.3.4",
               "a".repeat(63) + ".com", "a".repeat(64) + ".com"],
  "ipv4": ["192.168.0.1", "0.0.0.0", "255.255.255.255", "256.0.0.1", "1.2.3", "01.2.3.4", "1.2.3.4.5", "1.2.3.04"],
  "ipv6": ["::1", "::", "fe80::1", "2001:db8::8a2e:370:7334", "1:2:3:4:5:6:7:8", "1:2:3:4:5:6:7:8:9", "1::2::3", "::ffff:192.168.1.1",
           "12345::1", "FE80::1", "fe80::1%eth0", "1:2:3:4:5:6:7::"],
  "uri": ["https://example.com", "http://a.b/c?d=e#f", "mailto:a@b.c", "urn:isbn:0451450523", "https://example.com:8080/p%20q", "example.com",
          "/relative/path", "http://[::1]/", "ftp://user:pw@host/f", "https://exa mple.com", "h://x", "1http://x", "https://e.com/%zz"],
  "uuid": ["123e4567-e89b-12d3-a456-426614174000", "123E4567-E89B-12D3-A456-426614174000", "urn:uuid:123e4567-e89b-12d3-a456-426614174000",
           "123e4567e89b12d3a456426614174000", "123e4567-e89b-12d3-a456-42661417400g", "123e4567-e89b-12d3-a456-4266141740000"],
};

// what a format's grammar leaves out (docs/SERVE.md "format"), by the string
const subsetGap = {
  "time": (s) => /:60/.test(s),
  "date-time": (s) => /:60/.test(s) || /^\d{4}-\d\d-\d\d\s/.test(s) && !/^\d{4}-\d\d-\d\d /.test(s),
  "uri": (s) => /\[/.test(s),
  "hostname": (s) => s.length > 253,
};

// zod's own patterns for the helpers the issue names
const zs = z.toJSONSchema(z.object({
  email: z.string().email(), uuid: z.string().uuid(), date: z.string().date(), dt: z.string().datetime(), re: z.string().regex(/^[a-z]+\d{2,3}$/),
  sw: z.string().startsWith("ab"), ew: z.string().endsWith("yz"), inc: z.string().includes("mid"), time: z.string().time(),
  ipv4: z.string().ipv4(), ipv6: z.string().ipv6(), cuid: z.string().cuid(), b64: z.string().base64(), lc: z.string().lowercase(),
}));
const patterns = {};
for (const [k, v] of Object.entries(zs.properties)) patterns[k] = v;
const patternSeeds = {
  email: formats.email, uuid: formats.uuid, date: formats.date, dt: formats["date-time"], re: ["abc12", "x999", "a1234", "ABC12", "abc1"],
  sw: ["abc", "ab", "xab", "a"], ew: ["xyz", "yz", "yza"], inc: ["amidb", "mid", "mi d"], time: ["23:59", "24:00", "12:30:15.25", "1:00"],
  ipv4: formats.ipv4, ipv6: formats.ipv6, cuid: ["cjld2cjxh0000qzrmn831i7rn", "c12", "Cabcdef1"], b64: ["", "YWJj", "YWI=", "YQ==", "YQ=", "Y"],
  lc: ["abc", "aBc", "123", "ß"],
};

const alphabet = "aZ09-_.:/@+=%?#T ZtzP";
function mutate(s) {
  const a = [...s];
  const op = rnd(3), i = a.length ? rnd(a.length) : 0, c = alphabet[rnd(alphabet.length)];
  if (op === 0 && a.length) a.splice(i, 1);
  else if (op === 1) a.splice(i, 0, c);
  else if (a.length) a[i] = c;
  return a.join("");
}

const lines = [];
function add(schema, strings, gap) {
  const v = ajv.compile(schema);
  const seen = new Set();
  for (const base of strings) {
    const all = [base];
    for (let k = 0; k < 12; k++) all.push(mutate(k < 6 ? base : all[all.length - 1]));
    for (const s of all) {
      if (seen.has(s) || s.includes("\u0000")) continue;
      seen.add(s);
      lines.push(JSON.stringify({ schema, s, ajv: !!v(s), subset: !!(gap && gap(s)) }));
    }
  }
}
for (const [f, strings] of Object.entries(formats)) add({ type: "string", format: f }, strings, subsetGap[f]);
for (const [k, schema] of Object.entries(patterns)) {
  const f = schema.format;
  add(schema, patternSeeds[k], f && subsetGap[f]);
}
// lengths with a pattern, and a format with them
add({ type: "string", pattern: "^(ab)*$", minLength: 3, maxLength: 6 }, ["abab", "ab", "ababab", "abababab", "aba"]);
add({ type: "string", format: "email", maxLength: 12 }, ["a@b.co", "abcdef@gh.ij", "abcdefgh@ij.kl"]);

// zod's structures and number helpers as z.toJSONSchema writes them, each with values ajv accepts and
// rejects (whole documents, not mutated)
const Node = z.object({ name: z.string(), get children() { return z.array(Node).max(2); } });
const structures = {
  object: [z.object({ a: z.string(), b: z.number().optional(), c: z.boolean().nullable() }),
    [{ a: "x", c: null }, { a: "x", b: 1, c: true }, { a: "x" }, { a: 1, c: null }, { a: "x", c: null, d: 1 }]],
  tuple: [z.tuple([z.string(), z.number().int()]), [["a", 1], ["a"], ["a", 1.5], [1, "a"], ["a", 1, 2]]],
  literal_enum: [z.object({ k: z.literal("on"), e: z.enum(["a", "b"]) }), [{ k: "on", e: "a" }, { k: "off", e: "a" }, { k: "on", e: "c" }]],
  union: [z.union([z.string().max(3), z.number().int()]), ["abc", 7, "abcd", 1.5, null]],
  discriminated: [z.discriminatedUnion("kind", [z.object({ kind: z.literal("a"), x: z.number() }), z.object({ kind: z.literal("b"), y: z.string() })]),
    [{ kind: "a", x: 1 }, { kind: "b", y: "s" }, { kind: "a", y: "s" }, { kind: "c", x: 1 }]],
  intersection: [z.intersection(z.object({ a: z.string() }), z.object({ b: z.number().int().min(0) })),
    [{ a: "x", b: 0 }, { a: "x" }, { a: "x", b: -1 }, { b: 2 }]],
  record: [z.record(z.string(), z.number().int()), [{}, { a: 1, b: 2 }, { a: 1.5 }, { a: "x" }]],
  recursive: [Node, [{ name: "r", children: [] }, { name: "r", children: [{ name: "c", children: [] }] }, { name: "r" }, { name: "r", children: [{ name: 1, children: [] }] }]],
  numbers: [z.object({ p: z.number().positive(), g: z.number().gt(0.1).lte(0.3), i: z.number().int().gte(-5).lt(5), m: z.number().int().multipleOf(5).max(20),
                       n: z.number().nonnegative().max(1) }),
    [{ p: 0.001, g: 0.3, i: -5, m: 15, n: 0 }, { p: 0, g: 0.3, i: 0, m: 5, n: 1 }, { p: 1, g: 0.1, i: 0, m: 5, n: 1 }, { p: 1, g: 0.2, i: 5, m: 5, n: 1 },
     { p: 1, g: 0.2, i: 0, m: 7, n: 1 }, { p: 1, g: 0.2, i: 0, m: 25, n: 1 }, { p: 1, g: 0.2, i: 0, m: 0, n: 1.5 }, { p: 1, g: 0.2, i: 4, m: -5, n: 0.5 }]],
  strings: [z.object({ url: z.string().url(), dt: z.iso.datetime(), d: z.iso.date(), t: z.iso.time(), lo: z.string().lowercase(),
                       en: z.string().endsWith("yz"), inc: z.string().includes("mid"), len: z.string().min(2).max(4), b: z.string().base64() }),
    [{ url: "https://a.b/c", dt: "2024-01-01T10:00:00Z", d: "2024-02-29", t: "10:00", lo: "abc", en: "xyz", inc: "amidb", len: "ab", b: "YWI=" },
     { url: "nota url", dt: "2024-01-01T10:00:00Z", d: "2024-02-29", t: "10:00", lo: "abc", en: "xyz", inc: "amidb", len: "ab", b: "YWI=" },
     { url: "https://a.b/c", dt: "2024-01-01", d: "2024-02-29", t: "10:00", lo: "abc", en: "xyz", inc: "amidb", len: "ab", b: "YWI=" },
     { url: "https://a.b/c", dt: "2024-01-01T10:00:00Z", d: "2023-02-29", t: "10:00", lo: "Abc", en: "xyz", inc: "amidb", len: "abcde", b: "YWI" }]],
};
let structural = 0;
for (const [, [schema, values]] of Object.entries(structures)) {
  const js = z.toJSONSchema(schema);
  delete js.$schema;
  const v = ajv.compile(js);
  for (const s of values) { lines.push(JSON.stringify({ schema: js, s, ajv: !!v(s), subset: false })); structural++; }
}
writeFileSync(out, lines.join("\n") + "\n");
console.log(`# ${lines.length} cases: ${Object.keys(formats).length} formats, ${Object.keys(patterns).length} zod patterns, lengths, ` +
            `${Object.keys(structures).length} zod structures (${structural} documents)`);
