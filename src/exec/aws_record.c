/* RUN/instances.json: the instances executor aws created for a run, how long each lived and how
 * it ended, so that what a run cost (instance-hours) and what is still billing are known from
 * the run directory alone, without an AWS call:
 *
 *   {"provider": "aws", "region": "us-east-1",
 *    "instances": [{"id": "i-0abc", "node": 1, "type": "t3.micro", "market": "spot",
 *                   "subnet": "subnet-1", "zone": "us-east-1a", "launched_s": 1764000000.1,
 *                   "ended_s": null, "end": null, "replaces": null, "state": "running"}]}
 *
 * One writer at a time (the supervisor, or whoever holds RUN/lock once it is gone), rewritten
 * whole and atomically at each change, so a reader never sees half of one. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "exec/aws_internal.h"

void td_run_instances_clear(td_run_instances *r) {
    if (!r) return;
    for (size_t i = 0; i < r->count; i++) free(r->items[i].end);
    free(r->items);
    memset(r, 0, sizeof *r);
}

int td_run_instance_live(const td_run_instance *in) {
    return in->ended_s <= 0 && strcmp(in->state, "terminated") &&
           strcmp(in->state, "shutting-down");
}

double td_run_instance_lifetime_s(const td_run_instance *in, double now_s) {
    if (in->launched_s <= 0) return 0;
    double end = in->ended_s > 0 ? in->ended_s : now_s;
    return end > in->launched_s ? end - in->launched_s : 0;
}

double td_run_instances_cost(const td_run_instances *r, double now_s, size_t *unpriced) {
    double usd = 0;
    size_t none = 0;
    for (size_t i = 0; i < r->count; i++) {
        const td_run_instance *in = &r->items[i];
        /* track's formula, the one that ps and the ui use; an instance that has ended is
         * counted to its end even when that is after now_s (times kept to 0.1 s round up) */
        double t = in->ended_s > now_s ? in->ended_s : now_s;
        usd += td_instance_cost_at(in->usd_per_hour, in->launched_s, in->ended_s, t);
        if (in->usd_per_hour <= 0) none++;
    }
    if (unpriced) *unpriced = none;
    return usd;
}

double td_run_instances_hours(const td_run_instances *r, double now_s) {
    double s = 0;
    for (size_t i = 0; i < r->count; i++) s += td_run_instance_lifetime_s(&r->items[i], now_s);
    return s / 3600.0;
}

/* ---- writing ---- */
static json_t *str_or_null(const char *s) {
    return s && *s ? json_string(s) : json_null();
}

/* 0.1 s is what the record promises; the rounding keeps the file free of 1764000000.1000001. */
static json_t *time_or_null(double t) {
    return t > 0 ? json_real(round(t * 10) / 10) : json_null();
}

char *td__aws_record_dump(const td_run_instances *r) {
    json_t *o = json_object();
    json_object_set_new(o, "provider", json_string(r->provider[0] ? r->provider : "aws"));
    json_object_set_new(o, "region", str_or_null(r->region));
    json_t *arr = json_array();
    for (size_t i = 0; i < r->count; i++) {
        const td_run_instance *in = &r->items[i];
        json_t *e = json_object();
        json_object_set_new(e, "id", json_string(in->id));
        json_object_set_new(e, "node", in->node >= 0 ? json_integer(in->node) : json_null());
        json_object_set_new(e, "type", str_or_null(in->type));
        json_object_set_new(e, "market", str_or_null(in->market));
        json_object_set_new(e, "subnet", str_or_null(in->subnet));
        json_object_set_new(e, "zone", str_or_null(in->zone));
        json_object_set_new(e, "launched_s", time_or_null(in->launched_s));
        json_object_set_new(e, "ended_s", time_or_null(in->ended_s));
        json_object_set_new(e, "end", str_or_null(in->end));
        json_object_set_new(e, "replaces", str_or_null(in->replaces));
        json_object_set_new(e, "state", str_or_null(in->state));
        json_object_set_new(e, "usd_per_hour",
                            in->usd_per_hour > 0 ? json_real(in->usd_per_hour) : json_null());
        json_object_set_new(e, "price_source", str_or_null(in->price_source));
        json_array_append_new(arr, e);
    }
    json_object_set_new(o, "instances", arr);
    /* the total at this write (exact once every instance has ended), for readers that do not
     * sum it themselves: the store, tandem ps, the ui */
    /* from the times as written (to 0.1 s), so that a reader of the file gets the same sum */
    td_run_instances as_written = *r;
    as_written.items = td_xcalloc(r->count + 1, sizeof *as_written.items);
    for (size_t i = 0; i < r->count; i++) {
        as_written.items[i] = r->items[i];
        as_written.items[i].launched_s = round(r->items[i].launched_s * 10) / 10;
        as_written.items[i].ended_s = round(r->items[i].ended_s * 10) / 10;
    }
    size_t unpriced = 0;
    double cost = td_run_instances_cost(&as_written, td_wall_s(), &unpriced);
    free(as_written.items);
    json_object_set_new(o, "cost_usd", r->count > unpriced ? json_real(cost) : json_null());
    json_object_set_new(o, "cost_unpriced", json_integer((json_int_t)unpriced));
    /* 11 significant digits: epoch seconds to 0.1 s, without %.17g's 1764000000.0999999. */
    char *text = json_dumps(o, JSON_INDENT(1) | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII |
                                   JSON_REAL_PRECISION(11));
    json_decref(o);
    if (!text) {
        fprintf(stderr, "tandem: out of memory encoding an instance record\n");
        abort();
    }
    return text;
}

td_status td__aws_record_write(const char *run_dir, const td_run_instances *r) {
    char *text = td__aws_record_dump(r);
    char *path = td_run_path(run_dir, TD_RUN_PATH_INSTANCES);
    td_chunk chunks[2] = {{text, strlen(text)}, {"\n", 1}};
    td_status st = td_write_atomic(path, "instance record", chunks, 2);
    free(path);
    free(text);
    return st;
}

/* ---- reading ---- */
static void copy_str(char *dst, size_t n, json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    snprintf(dst, n, "%s", json_is_string(v) ? json_string_value(v) : "");
}

static double get_time(json_t *o, const char *key) {
    json_t *v = json_object_get(o, key);
    return json_is_number(v) && json_number_value(v) > 0 ? json_number_value(v) : 0;
}

td_status td__aws_record_parse(const char *text, const char *path, td_run_instances *out) {
    memset(out, 0, sizeof *out);
    json_error_t jerr;
    json_t *o = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    td_status st = TD_OK;
    if (!json_is_object(o)) {
        st = o ? td_error(TD_ERR_FORMAT,
                          "%s: not a JSON object (an instance record is {\"provider\", "
                          "\"region\", \"instances\": [...]})",
                          path)
               : td_error(TD_ERR_FORMAT, "%s: line %d: %s", path, jerr.line, jerr.text);
        goto out;
    }
    copy_str(out->provider, sizeof out->provider, o, "provider");
    copy_str(out->region, sizeof out->region, o, "region");
    json_t *arr = json_object_get(o, "instances");
    if (!json_is_array(arr)) {
        st = td_error(TD_ERR_FORMAT, "%s: \"instances\" is missing or not an array", path);
        goto out;
    }
    out->items = td_xcalloc(json_array_size(arr) + 1, sizeof *out->items);
    size_t i;
    json_t *e;
    json_array_foreach(arr, i, e) {
        json_t *id = json_object_get(e, "id");
        if (!json_is_object(e) || !json_is_string(id) || !*json_string_value(id)) {
            st = td_error(TD_ERR_FORMAT, "%s: instances[%zu] has no \"id\"", path, i);
            goto out;
        }
        td_run_instance *in = &out->items[out->count++];
        copy_str(in->id, sizeof in->id, e, "id");
        json_t *node = json_object_get(e, "node");
        in->node = json_is_integer(node) && json_integer_value(node) >= 0
                       ? (int)json_integer_value(node)
                       : -1;
        copy_str(in->type, sizeof in->type, e, "type");
        copy_str(in->market, sizeof in->market, e, "market");
        copy_str(in->subnet, sizeof in->subnet, e, "subnet");
        copy_str(in->zone, sizeof in->zone, e, "zone");
        in->launched_s = get_time(e, "launched_s");
        in->ended_s = get_time(e, "ended_s");
        json_t *end = json_object_get(e, "end");
        in->end = json_is_string(end) ? td_xstrdup(json_string_value(end)) : NULL;
        copy_str(in->replaces, sizeof in->replaces, e, "replaces");
        copy_str(in->state, sizeof in->state, e, "state");
        json_t *price = json_object_get(e, "usd_per_hour");
        in->usd_per_hour = json_is_number(price) && json_number_value(price) > 0
                               ? json_number_value(price)
                               : 0;
        copy_str(in->price_source, sizeof in->price_source, e, "price_source");
    }
out:
    json_decref(o);
    if (st != TD_OK) td_run_instances_clear(out);
    return st;
}

td_status td_run_instances_read(const char *run_dir, td_run_instances *out) {
    memset(out, 0, sizeof *out);
    char *path = NULL, *text = NULL;
    int fd = -1;
    td_status st = td_run_instances_open(run_dir, &fd, &path);
    if (st != TD_OK) goto out;
    struct stat sb;
    if (fstat(fd, &sb) != 0) {
        st = td_error_errno(TD_ERR_IO, "cannot examine the instance record %s (fstat)", path);
        goto out;
    }
    text = td_xmalloc((size_t)sb.st_size + 1);
    size_t got = 0;
    while (got < (size_t)sb.st_size) {
        ssize_t n = read(fd, text + got, (size_t)sb.st_size - got);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        got += (size_t)n;
    }
    text[got] = '\0';
    st = td__aws_record_parse(text, path, out);
out:
    if (fd >= 0) close(fd);
    free(text);
    free(path);
    return st;
}

/* ---- changing ---- */
td_run_instance *td__aws_record_find(td_run_instances *r, const char *id) {
    for (size_t i = 0; i < r->count; i++)
        if (!strcmp(r->items[i].id, id)) return &r->items[i];
    return NULL;
}

td_run_instance *td__aws_record_put(td_run_instances *r, const td_run_instance *in) {
    td_run_instance *e = td__aws_record_find(r, in->id);
    if (!e) {
        r->items = td_xrealloc(r->items, (r->count + 1) * sizeof *r->items);
        e = &r->items[r->count++];
    } else {
        free(e->end);
    }
    *e = *in;
    e->end = in->end ? td_xstrdup(in->end) : NULL;
    return e;
}

int td__aws_record_end(td_run_instances *r, const char *id, double ended_s, const char *end,
                       const char *state) {
    td_run_instance *e = td__aws_record_find(r, id);
    if (!e) return -1;
    snprintf(e->state, sizeof e->state, "%s", state ? state : "terminated");
    if (e->ended_s > 0 && e->end) return 0; /* the first end is the true one */
    e->ended_s = ended_s;
    free(e->end);
    e->end = td_xstrdup(end);
    return 0;
}

td_status td__aws_record_update(const char *run_dir, const char *region, const td_run_instance *in,
                                size_t n) {
    td_run_instances r;
    td_status st = td_run_instances_read(run_dir, &r);
    if (st == TD_ERR_NOTFOUND) {
        td_error_clear();
        memset(&r, 0, sizeof r);
        st = TD_OK;
    }
    TD_CHECK(st);
    if (!r.provider[0]) snprintf(r.provider, sizeof r.provider, "aws");
    if (!r.region[0] && region) snprintf(r.region, sizeof r.region, "%s", region);
    for (size_t i = 0; i < n; i++) td__aws_record_put(&r, &in[i]);
    st = td__aws_record_write(run_dir, &r);
    td_run_instances_clear(&r);
    return st;
}

/* ---- from EC2 ---- */
double td__aws_parse_time(const char *s) {
    struct tm tm = {0};
    int y, mo, d, h, mi;
    double sec;
    if (!s || sscanf(s, "%4d-%2d-%2dT%2d:%2d:%lf", &y, &mo, &d, &h, &mi, &sec) != 6) return 0;
    tm.tm_year = y - 1900;
    tm.tm_mon = mo - 1;
    tm.tm_mday = d;
    tm.tm_hour = h;
    tm.tm_min = mi;
    time_t t = timegm(&tm);
    return t < 0 ? 0 : (double)t + sec;
}

void td__aws_instance_from_ec2(const td_ec2_instance *e, td_run_instance *out) {
    memset(out, 0, sizeof *out);
    snprintf(out->id, sizeof out->id, "%s", e->id);
    out->node = e->node;
    snprintf(out->type, sizeof out->type, "%s", e->type);
    snprintf(out->market, sizeof out->market, "%s",
             !strcmp(e->lifecycle, "spot") ? "spot" : "on-demand");
    snprintf(out->subnet, sizeof out->subnet, "%s", e->subnet_id);
    snprintf(out->zone, sizeof out->zone, "%s", e->zone);
    out->launched_s = td__aws_parse_time(e->launch_time);
    snprintf(out->state, sizeof out->state, "%s", e->state);
}

void td__aws_controller_from_ec2(const td_ec2_instance *e, const char *region, const char *prices,
                                 td_run_instance *out) {
    td__aws_instance_from_ec2(e, out);
    out->node = -1;
    char source[160] = "";
    if (td_aws_on_demand_price(region, out->type, prices, &out->usd_per_hour, source,
                               sizeof source) == TD_OK)
        snprintf(out->price_source, sizeof out->price_source, "%s", source);
    else
        td_error_clear(); /* unpriced: the cost says so */
}

void td__aws_fmt_lifetime(double s, char *out, size_t nbytes) {
    /* In hours, as AWS bills and as the record totals them; two decimals below an hour. */
    snprintf(out, nbytes, s < 3600 ? "up %.2f h" : "up %.1f h", s / 3600);
}
