/* A run's artifacts in S3 (workflow `artifacts: {paths: [...], to: s3://B/P}`,
 * docs/cloud.md "S3 checkpoints and artifacts"): after the end's collection
 * into RUN/artifacts, each recorded artifact goes to s3://B/P/RUN_ID/NAME with
 * its SHA-256 (S3 checks the body, the object keeps the digest), and
 * RUN/artifacts-s3.json says where each went, so that `tandem artifacts
 * --download` can fetch a copy whose local one is gone. Every carrier records
 * its end through td__exec_record_end, so this holds for local, ssh, slurm and
 * aws alike. */
#include "tandem/cloud.h"
#include "tandem/exec.h"
#include "tandem/os.h"
#include "tandem/track.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static td_status new_client(td_aws_t **out) {
    td_aws_opts o;
    memset(&o, 0, sizeof o);
    return td_aws_new(&o, out);
}

td_status td_artifacts_s3_upload(td_rundb *store, const td_run *run, const char *to, FILE *out) {
    td_s3_url u = {0};
    TD_CHECK(td_s3_url_parse(to, &u));
    size_t kl = strlen(u.key);
    while (kl && u.key[kl - 1] == '/') u.key[--kl] = '\0';
    char *prefix = kl ? td_xasprintf("%s/%s/", u.key, run->id) : td_xasprintf("%s/", run->id);
    td_artifact *arts = NULL;
    size_t n = 0;
    td_aws_t *aws = NULL;
    json_t *list = json_array();
    int64_t total = 0;
    double t0 = td_now_s();
    td_status st = td_artifacts_list(store, run->id, &arts, &n);
    if (st == TD_OK && n) {
        st = new_client(&aws);
        if (st != TD_OK)
            st = td_error(st, "artifacts to s3://%s/%s: no AWS credentials or region here: %s",
                          u.bucket, prefix, td_error_msg());
    }
    for (size_t i = 0; i < n && st == TD_OK; i++) {
        char *key = td_xasprintf("%s%s", prefix, arts[i].name);
        char sha[65];
        st = td_s3_put_file(aws, u.bucket, key, arts[i].path, sha);
        if (st != TD_OK) {
            st = td_error(st,
                          "uploading artifact %s to s3://%s/%s: %s; it stays in %s (`tandem "
                          "artifacts %s` lists it); check the bucket and the credentials",
                          arts[i].name, u.bucket, key, td_error_msg(), arts[i].path, run->id);
        } else if (strcmp(sha, arts[i].sha256)) {
            /* the stored copy changed since it was recorded: the record's digest
             * would lie */
            st = td_error(TD_ERR_FORMAT,
                          "artifact %s: its stored copy %s has sha256 %s, not the recorded %s; "
                          "it changed after the run ended, so it was not recorded as uploaded",
                          arts[i].name, arts[i].path, sha, arts[i].sha256);
        } else {
            json_array_append_new(list, json_pack("{s:s, s:s, s:I, s:s}", "name", arts[i].name,
                                                  "key", key, "nbytes",
                                                  (json_int_t)arts[i].size_bytes, "sha256", sha));
            total += arts[i].size_bytes;
        }
        free(key);
    }
    /* What did go up is recorded even after a failure. */
    if (json_array_size(list)) {
        char *url = td_xasprintf("s3://%s/%.*s", u.bucket, (int)(strlen(prefix) - 1), prefix);
        json_t *doc =
            json_pack("{s:s, s:s, s:O}", "to", url, "bucket", u.bucket, "artifacts", list);
        char *text = json_dumps(doc, JSON_INDENT(1) | JSON_SORT_KEYS);
        char *path = td_run_path(run->run_dir, TD_RUN_PATH_ARTIFACTS_S3);
        td_chunk ch[2] = {{text, strlen(text)}, {"\n", 1}};
        td_status wst = td_write_atomic(path, "artifacts-s3.json", ch, 2);
        if (wst != TD_OK && st == TD_OK) st = wst;
        if (out && st == TD_OK)
            fprintf(out, "tandem: %zu artifact file%s uploaded to %s (%lld bytes, %.1f s)\n",
                    json_array_size(list), json_array_size(list) > 1 ? "s" : "", url,
                    (long long)total, td_now_s() - t0);
        free(path);
        free(text);
        json_decref(doc);
        free(url);
    }
    json_decref(list);
    td_aws_free(aws);
    td_artifacts_free(arts, n);
    free(prefix);
    td_s3_url_free(&u);
    return st;
}

td_status td_artifacts_s3_download(const td_run *run, const char *name, const char *dest) {
    char *path = td_run_path(run->run_dir, TD_RUN_PATH_ARTIFACTS_S3);
    json_error_t jerr;
    json_t *doc = json_load_file(path, 0, &jerr);
    td_status st = TD_OK;
    if (!doc) {
        st = td_error(TD_ERR_NOTFOUND,
                      "run %s has no S3 copy of its artifacts (%s: %s); only a workflow with "
                      "artifacts: {to: s3://...} uploads them",
                      run->id, path, jerr.text);
        free(path);
        return st;
    }
    const char *bucket = json_string_value(json_object_get(doc, "bucket"));
    const char *key = NULL, *sha = NULL;
    size_t i;
    json_t *a;
    json_array_foreach(json_object_get(doc, "artifacts"), i, a) {
        const char *nm = json_string_value(json_object_get(a, "name"));
        if (nm && !strcmp(nm, name)) {
            key = json_string_value(json_object_get(a, "key"));
            sha = json_string_value(json_object_get(a, "sha256"));
        }
    }
    if (!bucket || !key || !sha) {
        st = td_error(TD_ERR_NOTFOUND, "%s records no S3 copy of artifact %s", path, name);
    } else {
        td_aws_t *aws = NULL;
        td_s3_object info = {0};
        st = new_client(&aws);
        if (st == TD_OK) st = td_s3_get_file(aws, bucket, key, dest, &info);
        if (st != TD_OK) {
            st = td_error(st, "downloading artifact %s from s3://%s/%s: %s", name, bucket, key,
                          td_error_msg());
        } else if (strcmp(info.sha256_hex, sha)) {
            (void)remove(dest);
            st = td_error(TD_ERR_FORMAT,
                          "artifact %s: s3://%s/%s carries sha256 '%s', not the recorded %s; "
                          "the object was replaced after the run; nothing was kept",
                          name, bucket, key, info.sha256_hex, sha);
        }
        td_s3_object_free(&info);
        td_aws_free(aws);
    }
    json_decref(doc);
    free(path);
    return st;
}
