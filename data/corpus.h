/* corpus.h — the text behind regc_tokens_builtin (private to data/). */
#ifndef REGC_CORPUS_H
#define REGC_CORPUS_H

/* Paragraphs of plain ASCII English, NULL-terminated; concatenated they are
 * the built-in corpus. Split so that no literal exceeds the 4095 characters
 * C11 guarantees a compiler accepts. */
extern const char *const regc_corpus_parts[];

#endif
