/* What a run's cloud instances cost, from RUN/instances.json read as a run-dir file (as run.json
 * and sdk.json are): the aws executor writes it (src/exec/aws_record.c, docs/cloud.md), the store
 * reads only the fields a cost needs, so that tandem ps and the ui show it without track
 * depending on exec. The record's own "cost_usd" is the total at its last write; a live run keeps
 * billing after that, so the figure is computed here from each instance's price and lifetime at
 * the time the reader asks for. */
#include "store_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A record is a few hundred bytes per instance: anything this big is not one (the executor's
 * reader opens it through td_run_instances_open too). */
#define COST_RECORD_MAX_NBYTES (16 << 20)

void td_run_cost_clear(td_run_cost *c) {
    if (!c) return;
    free(c->items);
    memset(c, 0, sizeof *c);
}

static void copy_text(char *dst, size_t n, json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    snprintf(dst, n, "%s", json_is_string(v) ? json_string_value(v) : "");
}

/* A positive number, or 0 for null, missing or not a number (the record's "not known"). */
static double positive(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) && json_number_value(v) > 0 ? json_number_value(v) : 0;
}

static td_status parse(json_t *o, const char *path, td_run_cost *out) {
    json_t *arr = json_object_get(o, "instances");
    if (!json_is_object(o) || !json_is_array(arr))
        return td_error(TD_ERR_FORMAT,
                        "%s: not an instance record ({\"provider\", \"region\", \"instances\": "
                        "[...]}, docs/cloud.md); remove it or let tandem gc rewrite it",
                        path);
    out->items = td_xcalloc(json_array_size(arr) + 1, sizeof *out->items);
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        json_t *id = json_object_get(e, "id");
        if (!json_is_object(e) || !json_is_string(id) || !*json_string_value(id))
            return td_error(TD_ERR_FORMAT, "%s: instances[%zu] has no \"id\"", path, i);
        td_run_cost_instance *in = &out->items[out->count++];
        copy_text(in->id, sizeof in->id, e, "id");
        copy_text(in->type, sizeof in->type, e, "type");
        copy_text(in->market, sizeof in->market, e, "market");
        copy_text(in->zone, sizeof in->zone, e, "zone");
        copy_text(in->price_source, sizeof in->price_source, e, "price_source");
        in->usd_per_hour = positive(e, "usd_per_hour");
        in->launched_s = positive(e, "launched_s");
        in->ended_s = positive(e, "ended_s");
        if (in->usd_per_hour <= 0) out->unpriced++;
    }
    return TD_OK;
}

td_status td_run_instances_open(const char *run_dir, int *fd_out, char **path_out) {
    *fd_out = -1;
    char *path = td_run_path(run_dir, TD_RUN_PATH_INSTANCES);
    *path_out = path;
    /* Never follows a link nor blocks on a FIFO: ps and the ui read this for every run. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOFOLLOW);
    if (fd < 0)
        return errno == ENOENT
                   ? td_error(TD_ERR_NOTFOUND, "%s: no instance record (not a cloud run)", path)
                   : td_error_errno(TD_ERR_IO, "cannot open the instance record %s", path);
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size > COST_RECORD_MAX_NBYTES) {
        close(fd);
        return td_error(TD_ERR_FORMAT,
                        "%s is not a regular file under 16 MiB: not an instance record tandem "
                        "wrote; remove it",
                        path);
    }
    *fd_out = fd;
    return TD_OK;
}

td_status td_run_cost_read(const char *run_dir, td_run_cost *out) {
    memset(out, 0, sizeof *out);
    char *path = NULL;
    int fd = -1;
    json_t *o = NULL;
    td_status st = td_run_instances_open(run_dir, &fd, &path);
    if (st != TD_OK) goto out;
    json_error_t jerr;
    o = json_loadfd(fd, JSON_REJECT_DUPLICATES, &jerr);
    if (!o) {
        st = td_error(TD_ERR_FORMAT, "%s: line %d: %s (an instance record is JSON, docs/cloud.md)",
                      path, jerr.line, jerr.text);
        goto out;
    }
    st = parse(o, path, out);
out:
    json_decref(o);
    if (fd >= 0) close(fd);
    free(path);
    if (st != TD_OK) td_run_cost_clear(out);
    return st;
}

int td_run_cost_priced(const td_run_cost *c) {
    return c && c->count > c->unpriced;
}

/* The one definition of what an instance costs: its price times the hours of its life before
 * t_s. tandem show and the record's cost_usd (exec's td_run_instances_cost) sum this too. */
double td_instance_cost_at(double usd_per_hour, double launched_s, double ended_s, double t_s) {
    if (usd_per_hour <= 0 || launched_s <= 0) return 0;
    double end = ended_s > 0 && ended_s < t_s ? ended_s : t_s;
    return end > launched_s ? usd_per_hour * (end - launched_s) / 3600.0 : 0;
}

double td_run_cost_at(const td_run_cost *c, double t_s) {
    double usd = 0;
    for (size_t i = 0; c && i < c->count; i++)
        usd += td_instance_cost_at(c->items[i].usd_per_hour, c->items[i].launched_s,
                                   c->items[i].ended_s, t_s);
    return usd;
}

double td_run_cost_rate(const td_run_cost *c, double t_s) {
    double rate = 0;
    for (size_t i = 0; c && i < c->count; i++) {
        const td_run_cost_instance *in = &c->items[i];
        int alive = in->launched_s > 0 && in->launched_s <= t_s &&
                    (in->ended_s <= 0 || in->ended_s > t_s);
        if (alive) rate += in->usd_per_hour;
    }
    return rate;
}
