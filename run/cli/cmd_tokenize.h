/* `krun tokenize`: text -> token ids, ids -> text, and chat rendering, with only the tokenizer of
 * a KPK file (no model runtime).  main() dispatches here when argv[1] is "tokenize". */
#ifndef KRUN_CMD_TOKENIZE_H
#define KRUN_CMD_TOKENIZE_H

/* argv[0] is "tokenize".  Returns the process exit status (0 ok, 1 the tokenizer in the file is
 * damaged, 2 usage / unreadable input / not a KPK file / no tokenizer / bad ids or request). */
int krun_tokenize_main(int argc, char **argv);

#endif
