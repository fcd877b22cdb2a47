/* The JSON Lines writer of the track layer: one JSON object per line, built field by field in a
 * fixed buffer, for the files the ingester reads (a worker's rank-R.jsonl through the metrics
 * sink, the supervisor's sys.jsonl and a node agent's sys-HOST.jsonl through sysmon). One writer
 * keeps one format for all of them:
 *
 *   {"step": 3, "loss": 0.5, "acc": 0.125}\n
 *
 * separators ", " and ": ", integers as %lld, reals as %.<digits>g with a '.' whatever the
 * locale, strings as JSON strings. A string of printable ASCII is copied as it is; any other
 * (quotes, backslashes, control bytes, non-ASCII) goes through jansson's encoder, which escapes
 * what JSON requires and refuses text that is not UTF-8 (the ingester, jansson too, would drop
 * the whole line). JSON has no NaN or infinity: td_jsonl_real writes them as null, which the
 * ingester reads as "no point" (it stores numbers only), so one diverged value never makes the
 * rest of its line unreadable.
 *
 * Nothing here allocates except for the rare string that needs escaping, and nothing writes to
 * a file: the caller appends the finished line with one write(2). */
#ifndef TANDEM_TRACK_JSONL_H
#define TANDEM_TRACK_JSONL_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

/* The longest line, newline included. The ingester reads lines of up to 8 MiB; this bound is
 * the writers' (a metrics call logs a handful of keys), and it keeps the buffer on the stack. */
#define TD_JSONL_MAX_BYTES 4096

typedef struct td_jsonl {
    size_t len;           /* bytes of line[] used */
    int nfields;          /* fields written so far (the next one is preceded by ", ") */
    int overflow;         /* a field did not fit: the line is void */
    const char *bad_utf8; /* the first key or string that is not UTF-8 (the caller's pointer) */
    char line[TD_JSONL_MAX_BYTES];
} td_jsonl;

/* Starts a line: "{". */
void td_jsonl_begin(td_jsonl *j);
/* "key": value */
void td_jsonl_int(td_jsonl *j, const char *key, int64_t value);
/* "key": value with `digits` significant digits (%.*g, 1..17); null for NaN and infinities. */
void td_jsonl_real(td_jsonl *j, const char *key, double value, int digits);
/* "key": "value" */
void td_jsonl_str(td_jsonl *j, const char *key, const char *value);
/* Ends the object and the line ("}\n") and hands back the whole of it (valid until j changes).
 * TD_ERR_INVALID, and nothing to write, when a field did not fit in TD_JSONL_MAX_BYTES
 * (j->overflow; callers with a better message check it first) or a key or string is not UTF-8
 * (the message shows it with its bad bytes as \xNN). */
td_status td_jsonl_end(td_jsonl *j, const char **line, size_t *nbytes);

#endif
