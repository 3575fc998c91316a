/* The tokenizer embedded in a KPK file's meta extent (tiktoken.model, tokenizer_config.json and
 * config.json's vocab_size), loaded without opening the model runtime: `krun tokenize` needs only
 * this. */
#ifndef KRUN_TOKENIZER_KPK_H
#define KRUN_TOKENIZER_KPK_H
#include "tokenizer.h"
#include "format/kpk_reader.h"

/* Status of ktok_load_kpk. */
enum { KTOK_KPK_OK = 0, KTOK_KPK_ABSENT = 1, KTOK_KPK_BAD = 2, KTOK_KPK_IO = 3 };

/* Loads the tokenizer of an open KPK file: ranks from tiktoken.model, specials from
 * tokenizer_config.json (added_tokens_decoder), and every unnamed id after the ranks up to
 * config.json's vocabulary named <|reserved_token_{id}|> (as tokenization_kimi.py does).
 * Returns the tokenizer and *status = KTOK_KPK_OK, or NULL with *status:
 *   KTOK_KPK_ABSENT  the file embeds no tiktoken.model (token ids only);
 *   KTOK_KPK_BAD     an embedded file is damaged or invalid (checksum, JSON, rank file);
 *   KTOK_KPK_IO      it cannot be read (I/O error, out of memory);
 * and err naming the file and the embedded member (KRUN_EDATA when BAD, KRUN_ENOMEM out of
 * memory, else KRUN_EINPUT). */
ktok *ktok_load_kpk(const kpk_file *f, int *status, krun_err *err);

#endif
