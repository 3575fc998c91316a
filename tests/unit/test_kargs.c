/* The command line both tools read (format/kargs.c): option matching with
 * "--name VALUE" and "--name=VALUE", the one size parser and the integer
 * parser, against a table of spellings accepted and refused (including what
 * either tool's old parser took), and every size a binary unit can spell
 * checked against exact arithmetic. */
#include "check.h"
#include "format/kargs.h"

#include <inttypes.h>
#include <string.h>

static void test_sizes(void)
{
    static const struct { const char *s; int64_t want; } ok[] = {
        {"0", 0}, {"4096", 4096}, {"64K", 65536}, {"64k", 65536}, {"16M", 16 << 20}, {"8G", (int64_t)8 << 30},
        {"2T", (int64_t)2 << 40}, {"1.5G", (int64_t)3 << 29}, {"0.5K", 512}, {"0.1K", 102}, {"1.5", 1}, {"4B", 4},
        {"64KiB", 65536}, {"512MB", (int64_t)512 << 20}, {"4Ki", 4096}, {"2TiB", (int64_t)2 << 40},
        {"4611686018427387904", (int64_t)1 << 62}, {"4194304T", (int64_t)1 << 62},
    };
    static const char *const bad[] = {
        "", "K", "-1", "+4K", " 4K", "4K ", "4KBB", "4iB", "4X", "5P", "1e3", "0x10", "1.", ".5", "1..5", "inf", "nan",
        "4611686018427387905", "4194305T", "99999999999999999999", "4 K",
    };
    int good = 1;
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        int64_t got = kargs_size(ok[i].s);
        if (got != ok[i].want) { good = 0; printf("# kargs_size(\"%s\") = %" PRId64 ", want %" PRId64 "\n", ok[i].s, got, ok[i].want); }
    }
    CHECK(good, "kargs_size: %zu spellings of a size (units in either case, i, B, fractions, 2^62)", sizeof ok / sizeof ok[0]);
    good = 1;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        if (kargs_size(bad[i]) != -1) { good = 0; printf("# kargs_size(\"%s\") = %" PRId64 ", want -1\n", bad[i], kargs_size(bad[i])); }
    CHECK(good, "kargs_size: %zu malformed or too large sizes refused", sizeof bad / sizeof bad[0]);
    /* every whole number of every unit up to 2^62, and the halves: exact */
    good = 1;
    for (int u = 0; u <= 4; u++) {
        static const char units[] = " KMGT";
        for (uint64_t v = 1; v <= ((uint64_t)1 << 22); v = v * 3 + 1) {
            char s[64];
            uint64_t mul = (uint64_t)1 << (10 * u);
            if (v > ((uint64_t)1 << 62) / mul) break;
            snprintf(s, sizeof s, "%" PRIu64 "%.*s", v, u ? 1 : 0, units + u);
            if (kargs_size(s) != (int64_t)(v * mul)) { good = 0; printf("# %s\n", s); }
            if (u) {
                snprintf(s, sizeof s, "%" PRIu64 ".5%c", v, units[u]);
                if (v * mul + mul / 2 <= ((uint64_t)1 << 62) && kargs_size(s) != (int64_t)(v * mul + mul / 2)) { good = 0; printf("# %s\n", s); }
            }
        }
    }
    CHECK(good, "kargs_size: N and N.5 of every unit are exact");
}

static void test_flags(void)
{
    char *argv[] = {"prog", "--mem", "8G", "--mem=16M", "--memory", "--quiet", "--quiet=1", "--io-threads", "4", "--io"};
    const int argc = (int)(sizeof argv / sizeof argv[0]);
    const char *v = NULL;
    int i = 1;
    CHECK(kargs_flag(argc, argv, &i, "--mem", &v) == 1 && i == 2 && !strcmp(v, "8G"), "--mem 8G: the next argument is the value");
    i = 3;
    CHECK(kargs_flag(argc, argv, &i, "--mem", &v) == 1 && i == 3 && !strcmp(v, "16M"), "--mem=16M: the value after '=', no argument taken");
    i = 4;
    CHECK(kargs_flag(argc, argv, &i, "--mem", &v) == 0 && i == 4, "--memory is not --mem");
    i = 5;
    CHECK(kargs_flag(argc, argv, &i, "--quiet", NULL) == 1, "--quiet: a flag without a value");
    i = 6;
    CHECK(kargs_flag(argc, argv, &i, "--quiet", NULL) == 0, "--quiet=1: a flag takes no value");
    i = 7;
    CHECK(kargs_flag(argc, argv, &i, "--io", &v) == 0 && kargs_flag(argc, argv, &i, "--io-threads", &v) == 1 && !strcmp(v, "4"),
          "--io-threads 4 is not --io; it is --io-threads");
    i = 9;
    CHECK(kargs_flag(argc, argv, &i, "--io", &v) == -1 && i == 9, "--io as the last argument: its value is missing (-1)");
}

static void test_longs(void)
{
    long v = 0;
    CHECK(kargs_long("42", 1, 256, &v) == 0 && v == 42, "kargs_long: 42 in 1..256");
    CHECK(kargs_long("-7", -10, 10, &v) == 0 && v == -7, "kargs_long: -7 in -10..10");
    CHECK(kargs_long("257", 1, 256, &v) == -1 && kargs_long("0", 1, 256, &v) == -1, "kargs_long: out of range refused");
    CHECK(kargs_long("", 0, 9, &v) == -1 && kargs_long("4x", 0, 9, &v) == -1 && kargs_long("99999999999999999999", 0, 9, &v) == -1,
          "kargs_long: empty, trailing junk and overflow refused");
}

int main(void)
{
    test_sizes();
    test_flags();
    test_longs();
    return check_exit();
}
