/* tokenizer_int.h - the inside of splash_tokenizer, shared by tokenizer.c
 * (encode, decode, lookups) and tokenizer_load.c (reading tokenizer.json).
 * Not for other modules: they use tokenizer.h. */
#ifndef SPLASH_TOKENIZER_INT_H
#define SPLASH_TOKENIZER_INT_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <stdint.h>

#include "text/bpe.h"
#include "text/tokenizer.h"

enum {
    TF_PRESENT = 1, /* the id names a token */
    TF_ADDED = 2,   /* an added token (matched in the text before BPE) */
    TF_SPECIAL = 4, /* "special": true */
};

typedef struct added_token {
    int32_t id;
    char *content; /* as in the file (UTF-8) */
    size_t len;
    unsigned single_word : 1, lstrip : 1, rstrip : 1, normalized : 1, special : 1;
} added_token;

/* A byte trie over added-token contents: leftmost-longest matching, as the
 * Aho-Corasick automaton (MatchKind::LeftmostLongest) in HF does. */
typedef struct trie_node {
    int32_t child;   /* first child, -1 if none */
    int32_t sibling; /* next sibling, -1 if none */
    int32_t token;   /* index into added[] ending here, -1 if none */
    uint8_t byte;
} trie_node;

typedef struct added_matcher {
    trie_node *nodes; /* nodes[0] is the root */
    size_t n_nodes, cap;
    uint8_t first[256]; /* bytes that start some token */
    size_t n_tokens;
} added_matcher;

#define TOK_MAX_SPLITS 4

typedef struct tok_split {
    pcre2_code *code;
    char *pattern; /* as given in the file, for messages */
} tok_split;

struct splash_tokenizer {
    size_t n_ids;            /* one more than the largest id */
    uint8_t *flags;          /* per id, TF_* */
    char *strs;              /* every token as written in the file, NUL-terminated */
    uint32_t *str_off;       /* per id, offset into strs */
    uint8_t *bytes;          /* every token's decoded bytes */
    uint32_t *byte_off;      /* n_ids + 1 offsets into bytes */
    bpe_model bpe;
    added_token *added;
    size_t n_added;
    added_matcher raw_match;  /* added tokens with "normalized": false */
    added_matcher norm_match; /* "normalized": true, matched after NFC */
    int nfc;                  /* the normaliser is NFC (else none) */
    tok_split split[TOK_MAX_SPLITS];
    int n_split;
};

/* The ByteLevel decoder's rule for one token string (tokenizer_load.c): if
 * every character is in the byte-level alphabet, the bytes they stand for
 * (*mapped = 1); otherwise the string's own UTF-8 (*mapped = 0).  out holds
 * at least n bytes; returns the byte count. */
size_t tok_byte_level_decode(const char *str, size_t n, uint8_t *out, int *mapped);

#endif
