/* tandem's SigV4 signer against botocore's: every case of sigv4_vectors.txt (written by
 * sigv4_vectors.py with botocore's SigV4Auth/S3SigV4Auth) must give the same canonical request,
 * string to sign, signature and Authorization header. argv[1] names another vectors file
 * (test_sigv4_botocore.sh passes one generated at test time). */
#include <time.h>

#include "test.h"

#include "tandem/cloud.h"

#ifndef TD_TEST_CLOUD_DIR
#define TD_TEST_CLOUD_DIR "."
#endif

typedef struct {
    char *name, *service, *region, *method, *path, *query, *ak, *sk, *token, *payload;
    char *cr, *sts, *sig, *authz;
    long long time_s;
    td_http_header headers[16];
    int nheaders;
} vcase;

static char *unesc(const char *s) {
    char *out = td_xstrdup(s), *o = out;
    for (const char *p = s; *p; p++) {
        if (*p == '\\' && p[1] == 'n')
            *o++ = '\n', p++;
        else if (*p == '\\' && p[1] == '\\')
            *o++ = '\\', p++;
        else
            *o++ = *p;
    }
    *o = '\0';
    return out;
}

static void check(const vcase *c) {
    td_sigv4_in in = {.access_key_id = c->ak,
                      .secret_access_key = c->sk,
                      .session_token = c->token,
                      .region = c->region,
                      .service = c->service,
                      .time_s = c->time_s,
                      .method = c->method,
                      .path = c->path,
                      .query = c->query,
                      .headers = c->headers,
                      .nheaders = c->nheaders,
                      .payload_sha256_hex = c->payload};
    td_sigv4_out out;
    ASSERT_OK(td_sigv4_sign(&in, &out));
    if (strcmp(out.canonical_request, c->cr))
        TEST_FAIL(
            "%s: canonical request differs from botocore's:\n--- tandem\n%s\n--- botocore\n%s",
            c->name, out.canonical_request, c->cr);
    if (strcmp(out.string_to_sign, c->sts))
        TEST_FAIL("%s: string to sign differs:\n--- tandem\n%s\n--- botocore\n%s", c->name,
                  out.string_to_sign, c->sts);
    ASSERT_STREQ(out.signature, c->sig);
    ASSERT_STREQ(out.authorization, c->authz);
    /* a changed secret changes the signature (the comparison is not vacuous) */
    char *other = td_xstrdup(c->sk);
    other[0] ^= 1;
    in.secret_access_key = other;
    td_sigv4_out out2;
    ASSERT_OK(td_sigv4_sign(&in, &out2));
    ASSERT(strcmp(out2.signature, c->sig) != 0);
    td_sigv4_out_free(&out2);
    free(other);
    printf("  %-28s %s\n", c->name, out.signature);
    td_sigv4_out_free(&out);
}

static void vcase_free(vcase *c) {
    char **fields[] = {&c->name,  &c->service, &c->region, &c->method, &c->path,
                       &c->query, &c->ak,      &c->sk,     &c->token,  &c->payload,
                       &c->cr,    &c->sts,     &c->sig,    &c->authz};
    for (size_t i = 0; i < TD_ARRAY_LEN(fields); i++) free(*fields[i]);
    for (int i = 0; i < c->nheaders; i++) {
        free((char *)c->headers[i].name);
        free((char *)c->headers[i].value);
    }
    memset(c, 0, sizeof *c);
}

/* Checks every vector of path; returns how many. */
static int run_vectors(const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) TEST_FAIL("cannot open %s", path);
    char *line = NULL;
    size_t cap = 0;
    vcase c = {0};
    int ncases = 0;
    ssize_t len;
    while ((len = getline(&line, &cap, f)) >= 0) {
        while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = '\0';
        if (line[0] == '#') continue;
        if (!line[0]) {
            if (c.name) {
                check(&c);
                ncases++;
            }
            vcase_free(&c);
            continue;
        }
        char *colon = strstr(line, ": ");
        char *key = line, *val;
        if (colon) {
            *colon = '\0';
            val = colon + 2;
        } else { /* "query:" with an empty value */
            char *end = line + strlen(line) - 1;
            if (*end != ':') TEST_FAIL("%s: bad line '%s'", path, line);
            *end = '\0';
            val = "";
        }
        if (!strcmp(key, "header")) {
            char *sep = strstr(val, ": ");
            if (!sep || c.nheaders == 16) TEST_FAIL("%s: bad header '%s'", path, val);
            *sep = '\0';
            c.headers[c.nheaders].name = td_xstrdup(val);
            c.headers[c.nheaders++].value = unesc(sep + 2);
            continue;
        }
        struct {
            const char *k;
            char **dst;
        } map[] = {{"name", &c.name},
                   {"service", &c.service},
                   {"region", &c.region},
                   {"method", &c.method},
                   {"path", &c.path},
                   {"query", &c.query},
                   {"access_key_id", &c.ak},
                   {"secret_access_key", &c.sk},
                   {"session_token", &c.token},
                   {"payload_sha256", &c.payload},
                   {"expect_canonical_request", &c.cr},
                   {"expect_string_to_sign", &c.sts},
                   {"expect_signature", &c.sig},
                   {"expect_authorization", &c.authz}};
        int known = 0;
        for (size_t i = 0; i < TD_ARRAY_LEN(map); i++)
            if (!strcmp(key, map[i].k)) {
                free(*map[i].dst);
                *map[i].dst = unesc(val);
                known = 1;
            }
        if (!strcmp(key, "time_s")) c.time_s = atoll(val), known = 1;
        if (!known) TEST_FAIL("%s: unknown field '%s'", path, key);
    }
    if (c.name) {
        check(&c);
        ncases++;
    }
    vcase_free(&c);
    free(line);
    fclose(f);
    return ncases;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : TD_TEST_CLOUD_DIR "/sigv4_vectors.txt";
    /* SigV4 dates are UTC whatever the machine's zone: the vectors again in India's (+05:30,
     * which moves the hour and, before 05:30 UTC, the date), by name and as a POSIX rule (the
     * same offset where no tz database is installed). A signer on local time passed in UTC. */
    const char *zones[] = {"UTC0", "Asia/Kolkata", "IST-5:30"};
    for (size_t z = 0; z < TD_ARRAY_LEN(zones); z++) {
        setenv("TZ", zones[z], 1);
        tzset();
        time_t t = 1700000000;
        struct tm local, utc;
        localtime_r(&t, &local);
        gmtime_r(&t, &utc);
        if (z > 0 && local.tm_hour == utc.tm_hour && local.tm_min == utc.tm_min) {
            printf("TZ=%s is not in effect here (no tz database?): skipped\n", zones[z]);
            continue;
        }
        int ncases = run_vectors(path);
        ASSERT_GE(ncases, 7);
        printf("%d botocore vectors from %s match with TZ=%s\n", ncases, path, zones[z]);
    }

    /* inputs missing: an error, never a signature over nothing */
    td_sigv4_in bad = {.access_key_id = "AKID",
                       .secret_access_key = "",
                       .region = "us-east-1",
                       .service = "s3",
                       .method = "GET",
                       .path = "/",
                       .payload_sha256_hex = "x"};
    td_sigv4_out out;
    ASSERT_STATUS(td_sigv4_sign(&bad, &out), TD_ERR_INVALID);
    TEST_PASS();
}
