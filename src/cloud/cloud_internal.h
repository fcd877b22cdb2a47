/* The cloud layer's internals: the client, the HTTP round trip, a small XML tree. */
#ifndef TANDEM_CLOUD_INTERNAL_H
#define TANDEM_CLOUD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/cloud.h"

/* ---- a small XML tree (expat underneath): element names without namespace prefix, the text
 * of leaf elements; enough for AWS's answers, which carry their data in elements only. ---- */
typedef struct td__xml td__xml;
struct td__xml {
    char *name;
    char *text; /* concatenated character data of this element ("" when none) */
    size_t text_nbytes;
    td__xml *child, *last_child, *next;
};
td_status td__xml_parse(const char *buf, size_t nbytes, td__xml **root_out);
void td__xml_free(td__xml *root);
/* The first child named name, or NULL. */
const td__xml *td__xml_child(const td__xml *n, const char *name);
/* Follows "a/b/c" from n (n's own children first); NULL when a step is missing. */
const td__xml *td__xml_path(const td__xml *n, const char *path);
/* The text at path, "" when missing. */
const char *td__xml_text(const td__xml *n, const char *path);
/* Copies the text at path into dst[cap] (truncating). */
void td__xml_copy(char *dst, size_t cap, const td__xml *n, const char *path);

/* ---- the client ---- */
/* A transfer slower than this for low_speed_timeout_s is a stall: aborted, not retried. */
#define TD__AWS_LOW_SPEED_BPS 1024
struct td_aws {
    td_aws_creds creds;
    int creds_refreshable; /* from the instance role: reloaded before they expire */
    char *profile;         /* NULL: AWS_PROFILE / default */
    char *region;
    char *endpoint_ec2, *endpoint_s3; /* never NULL: the override or the AWS endpoint */
    int ec2_custom, s3_custom;        /* an override was given: S3 is path-style */
    int max_attempts, backoff_ms, connect_timeout_ms, low_speed_timeout_s, ec2_page_size;
    int64_t multipart_threshold, multipart_part_nbytes;
    void *curl; /* CURL * */
    td_aws_error last;
};

/* ---- one HTTP request, signed and retried ---- */
typedef struct td__http_req {
    const char *service; /* "ec2", "s3": signing scope and messages */
    const char *action;  /* "RunInstances", "PutObject": messages */
    const char *what;    /* extra context for messages ("s3://b/k"), may be NULL */
    const char *method;
    const char *base_url;          /* "https://host[:port]" */
    const char *path;              /* percent-encoded, starts with '/' */
    const char *query;             /* percent-encoded, "" or NULL: none */
    const td_http_header *headers; /* more headers to send and sign */
    int nheaders;
    const void *body; /* a body in memory ... */
    size_t body_nbytes;
    int body_fd; /* ... or from a file (>= 0): nbytes at offset */
    int64_t body_offset;
    const char *payload_sha256; /* hex; NULL: computed from the memory body */
    int sink_fd;                /* >= 0: a 2xx body goes here (truncated per attempt) */
    int head;                   /* a HEAD request: no body */
} td__http_req;

typedef struct td__http_resp {
    long status;
    char *body; /* NUL-terminated (error bodies, and all bodies when sink_fd < 0) */
    size_t body_nbytes;
    char *headers; /* raw response header lines of the final attempt */
} td__http_resp;
void td__http_resp_free(td__http_resp *r);
/* The value of a response header (case-insensitive name) into dst[cap]; 0 when absent. */
int td__http_resp_header(const td__http_resp *r, const char *name, char *dst, size_t cap);

/* The retries' pauses: before retry attempt+1 (attempt 0 is the first failure), base_ms
 * doubled per attempt up to max_ms; the pause slept is jittered between half and all of it. */
#define TD__AWS_BACKOFF_MAX_MS 20000
int64_t td__aws_backoff_ceiling_ms(int base_ms, int max_ms, int attempt);

/* Sends req with the client's credentials; retries throttling, 5xx and network failures. TD_OK
 * only for a 2xx answer; otherwise aws->last holds the typed error and td_error() the message. */
td_status td__aws_request(td_aws_t *aws, const td__http_req *req, td__http_resp *resp);

/* Percent-encoding of AWS (RFC 3986 unreserved kept); slash kept when keep_slash. Allocated. */
char *td__uri_encode(const char *s, int keep_slash);
/* Appends "&k=v" (or "k=v" first), both encoded, to a growing string. */
void td__query_add(char **q, const char *key, const char *value);
void td__query_addf(char **q, const char *key, const char *fmt, ...) TD_PRINTF(3, 4);
/* Base64 (standard alphabet, padded), allocated. */
char *td__base64(const void *buf, size_t nbytes);
/* libcurl's global initialisation, once per process whichever thread comes first: curl_easy_init
 * would do it implicitly, but not thread-safely (http.c). */
td_status td__curl_global_init(void);
/* The IMDSv2 credentials of the instance role (creds.c, through imds.c's client). */
td_status td__imds_creds(td_aws_creds *out);
/* An INI file's value: section exactly as written between brackets. 1 found, 0 not, <0 error. */
int td__ini_get(const char *path, const char *section, const char *key, char **value_out);
/* Whether an INI file has the section. */
int td__ini_has_section(const char *path, const char *section);

#endif /* TANDEM_CLOUD_INTERNAL_H */
