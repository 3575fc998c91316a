/* The UTF-8 hold-back (run/text/utf8_hold.c): text cut into random pieces, as
 * tokens cut it, comes out whole: what is handed out, concatenated, is the
 * input byte for byte, every handout but the last ends on a character
 * boundary of the input when the input is valid UTF-8, and at most three
 * bytes are ever held back. */
#include "check.h"
#include "testrand.h"
#include "run/text/utf8_hold.h"

#include <string.h>

/* A random string of 1- to 4-byte characters (valid UTF-8), or with junk bytes mixed in. */
static size_t random_text(uint8_t *out, size_t cap, int junk)
{
    size_t n = 0;
    while (n + 4 <= cap) {
        uint32_t r = (uint32_t)rnd() % 100;
        if (junk && r < 10) { out[n++] = (uint8_t)(uint32_t)rnd(); continue; }
        if (r < 40) out[n++] = (uint8_t)(0x20 + (uint32_t)rnd() % 0x5f);
        else if (r < 65) { uint32_t c = 0x80 + (uint32_t)rnd() % 0x780; out[n++] = (uint8_t)(0xC0 | c >> 6); out[n++] = (uint8_t)(0x80 | (c & 0x3F)); }
        else if (r < 90) {
            uint32_t c = 0x800 + (uint32_t)rnd() % 0xF800;
            if (c >= 0xD800 && c < 0xE000) c = 0x4E2D;   /* not a surrogate */
            out[n++] = (uint8_t)(0xE0 | c >> 12); out[n++] = (uint8_t)(0x80 | (c >> 6 & 0x3F)); out[n++] = (uint8_t)(0x80 | (c & 0x3F));
        } else {
            uint32_t c = 0x10000 + (uint32_t)rnd() % 0x100000;
            out[n++] = (uint8_t)(0xF0 | c >> 18); out[n++] = (uint8_t)(0x80 | (c >> 12 & 0x3F));
            out[n++] = (uint8_t)(0x80 | (c >> 6 & 0x3F)); out[n++] = (uint8_t)(0x80 | (c & 0x3F));
        }
    }
    return n;
}

int main(void)
{
    int same = 1, boundaries = 1, held_ok = 1;
    rs = 7;
    for (int round = 0; round < 3000; round++) {
        uint8_t in[400], got[400];
        const int junk = round % 3 == 2;
        size_t n = random_text(in, sizeof in, junk), at = 0, n_got = 0;
        kutf8_hold h = {{0}, 0};
        while (at < n) {
            size_t cut = 1 + (uint32_t)rnd() % 9, k;
            const char *text;
            if (cut > n - at) cut = n - at;
            if (kutf8_hold_take(&h, in + at, cut, 0, &text, &k)) { same = 0; break; }
            memcpy(got + n_got, text, k);
            n_got += k;
            at += cut;
            if (at - n_got > 3) held_ok = 0;
            /* valid text: a handout ends before a lead byte or at the end */
            if (!junk && n_got < n && (in[n_got] & 0xC0) == 0x80) boundaries = 0;
        }
        {
            const char *text;
            size_t k;
            if (kutf8_hold_take(&h, NULL, 0, 1, &text, &k) == 0) { memcpy(got + n_got, text, k); n_got += k; }
        }
        if (n_got != n || memcmp(got, in, n)) same = 0;
        kutf8_hold_free(&h);
    }
    CHECK(same, "3000 texts (a third with invalid bytes) cut at random: the handouts, flushed at the end, are the input byte for byte");
    CHECK(boundaries, "every handout of valid UTF-8 ends on a character boundary");
    CHECK(held_ok, "at most 3 bytes are ever held back");
    {
        kutf8_hold h = {{0}, 0};
        const char *text;
        size_t k;
        static const uint8_t euro[] = {0xE2, 0x82, 0xAC};
        int ok = !kutf8_hold_take(&h, euro, 2, 0, &text, &k) && k == 0;
        ok = ok && !kutf8_hold_take(&h, euro + 2, 1, 0, &text, &k) && k == 3 && !memcmp(text, euro, 3);
        kutf8_hold_reset(&h);
        ok = ok && !kutf8_hold_take(&h, euro, 1, 0, &text, &k) && k == 0;
        kutf8_hold_reset(&h);
        ok = ok && !kutf8_hold_take(&h, (const uint8_t *)"ab", 2, 0, &text, &k) && k == 2 && !memcmp(text, "ab", 2);
        CHECK(ok, "\"\\xE2\\x82\" is held, \"\\xAC\" completes the euro sign; reset forgets what is held");
        kutf8_hold_free(&h);
    }
    return check_exit();
}
