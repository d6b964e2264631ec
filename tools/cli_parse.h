/*
 * cli_parse.h - numbers of a command-line value, read whole: the one rule of
 * the tools (attnkit-info, attnkit-bench), so that "32/8junk", "abc" or a
 * value past int is refused, never taken as 32/8, 0 or a wrapped number.
 */
#ifndef AK_CLI_PARSE_H
#define AK_CLI_PARSE_H

#include <errno.h>
#include <stdlib.h>

/* least to most integers of s separated by '/', each the whole of its text
 * (strtol's leading blanks and sign allowed) and within [lo, hi], into out:
 * their count, or -1. */
static inline int cli_ints(const char *s, int least, int most, long lo, long hi, int *out)
{
    const char *p = s;
    for (int k = 0; p && k < most; k++) {
        char *end = NULL;
        errno = 0;
        const long v = strtol(p, &end, 10);
        if (end == p || errno == ERANGE || v < lo || v > hi) return -1;
        out[k] = (int)v;
        if (*end == '\0') return k + 1 >= least ? k + 1 : -1;
        if (*end != '/') return -1;
        p = end + 1;
    }
    return -1;
}

#endif /* AK_CLI_PARSE_H */
