/* EC2's Query API (Version=2016-11-15): RunInstances, DescribeInstances, TerminateInstances.
 * A request is a form-encoded POST to the region's endpoint; the answer is XML. */
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cloud/cloud_internal.h"

#define EC2_VERSION "2016-11-15"
#define RUN_TAG     TD_EC2_TAG_RUN

void td_ec2_instances_free(td_ec2_instances *l) {
    if (!l) return;
    free(l->items);
    l->items = NULL;
    l->count = 0;
}

static void parse_instance(const td__xml *it, td_ec2_instance *o) {
    memset(o, 0, sizeof *o);
    td__xml_copy(o->id, sizeof o->id, it, "instanceId");
    td__xml_copy(o->state, sizeof o->state, it, "instanceState/name");
    if (!o->state[0]) td__xml_copy(o->state, sizeof o->state, it, "currentState/name");
    td__xml_copy(o->type, sizeof o->type, it, "instanceType");
    td__xml_copy(o->image_id, sizeof o->image_id, it, "imageId");
    td__xml_copy(o->lifecycle, sizeof o->lifecycle, it, "instanceLifecycle");
    td__xml_copy(o->private_ip, sizeof o->private_ip, it, "privateIpAddress");
    td__xml_copy(o->public_ip, sizeof o->public_ip, it, "ipAddress");
    td__xml_copy(o->zone, sizeof o->zone, it, "placement/availabilityZone");
    td__xml_copy(o->key_name, sizeof o->key_name, it, "keyName");
    td__xml_copy(o->launch_time, sizeof o->launch_time, it, "launchTime");
    const char *rc = td__xml_text(it, "stateReason/code");
    const char *rm = td__xml_text(it, "stateReason/message");
    if (*rc || *rm) snprintf(o->state_reason, sizeof o->state_reason, "%s: %s", rc, rm);
    td__xml_copy(o->subnet_id, sizeof o->subnet_id, it, "subnetId");
    o->node = -1;
    const td__xml *tags = td__xml_child(it, "tagSet");
    for (const td__xml *t = tags ? tags->child : NULL; t; t = t->next) {
        const char *key = td__xml_text(t, "key");
        if (!strcmp(key, RUN_TAG)) {
            td__xml_copy(o->run_id, sizeof o->run_id, t, "value");
        } else if (!strcmp(key, TD_EC2_TAG_PROJECT)) {
            td__xml_copy(o->project, sizeof o->project, t, "value");
        } else if (!strcmp(key, TD_EC2_TAG_CONTROLLER)) {
            td__xml_copy(o->controller_of, sizeof o->controller_of, t, "value");
        } else if (!strcmp(key, TD_EC2_TAG_STORE)) {
            td__xml_copy(o->store, sizeof o->store, t, "value");
        } else if (!strcmp(key, TD_EC2_TAG_NODE)) {
            /* Anyone may edit a tag: a value that is not a small index stays unknown. */
            const char *v = td__xml_text(t, "value");
            char *end;
            long n = strtol(v, &end, 10);
            if (*v && !*end && n >= 0 && n < 1000000) o->node = (int)n;
        }
    }
}

static void add_set(const td__xml *set, td_ec2_instances *out) {
    for (const td__xml *it = set ? set->child : NULL; it; it = it->next) {
        if (strcmp(it->name, "item")) continue;
        out->items = td_xrealloc(out->items, (size_t)(out->count + 1) * sizeof *out->items);
        parse_instance(it, &out->items[out->count++]);
    }
}

td_status td_ec2_parse_instances(const char *xml, size_t nbytes, td_ec2_instances *out,
                                 char **next_token_out) {
    if (next_token_out) *next_token_out = NULL;
    td__xml *root = NULL;
    TD_CHECK(td__xml_parse(xml, nbytes, &root));
    const td__xml *inst = td__xml_child(root, "instancesSet");
    const td__xml *res = td__xml_child(root, "reservationSet");
    td_status st = TD_OK;
    if (!inst && !res) {
        st =
            td_error(TD_ERR_FORMAT,
                     "an EC2 answer <%s> with neither instancesSet nor reservationSet", root->name);
    } else {
        add_set(inst, out);
        for (const td__xml *r = res ? res->child : NULL; r; r = r->next)
            add_set(td__xml_child(r, "instancesSet"), out);
        const char *next = td__xml_text(root, "nextToken");
        if (next_token_out && *next) *next_token_out = td_xstrdup(next);
    }
    td__xml_free(root);
    return st;
}

static td_status ec2_call(td_aws_t *aws, const char *action, const char *what, const char *params,
                          td__http_resp *resp) {
    char *body = NULL;
    td__query_add(&body, "Action", action);
    td__query_add(&body, "Version", EC2_VERSION);
    char *full = td_xasprintf("%s%s%s", body, params && *params ? "&" : "", params ? params : "");
    free(body);
    td_http_header h[] = {{"content-type", "application/x-www-form-urlencoded; charset=utf-8"}};
    td__http_req req = {
        .service = "ec2",
        .action = action,
        .what = what,
        .method = "POST",
        .base_url = aws->endpoint_ec2,
        .path = "/",
        .headers = h,
        .nheaders = 1,
        .body = full,
        .body_nbytes = strlen(full),
        .body_fd = -1,
        .sink_fd = -1,
    };
    td_status st = td__aws_request(aws, &req, resp);
    free(full);
    return st;
}

static int valid_token(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 64) return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < 0x21 || s[i] > 0x7e) return 0;
    return 1;
}

td_status td_ec2_run_instances(td_aws_t *aws, const td_ec2_run_spec *s, td_ec2_instances *out) {
    memset(out, 0, sizeof *out);
    if (!s->image_id || !*s->image_id || !s->instance_type || !*s->instance_type)
        return td_error(TD_ERR_INVALID, "aws ec2 RunInstances: an image id and an instance type "
                                        "are required");
    int min = s->min_count > 0 ? s->min_count : 1;
    int max = s->max_count > 0 ? s->max_count : min;
    if (max < min)
        return td_error(TD_ERR_INVALID, "aws ec2 RunInstances: max_count %d < min_count %d", max,
                        min);
    if (s->client_token && !valid_token(s->client_token))
        return td_error(TD_ERR_INVALID,
                        "aws ec2 RunInstances: client token '%s' must be 1-64 printable ASCII "
                        "characters",
                        s->client_token);
    char *q = NULL;
    td__query_add(&q, "ImageId", s->image_id);
    td__query_add(&q, "InstanceType", s->instance_type);
    td__query_addf(&q, "MinCount", "%d", min);
    td__query_addf(&q, "MaxCount", "%d", max);
    if (s->key_name && *s->key_name) td__query_add(&q, "KeyName", s->key_name);
    if (s->subnet_id && *s->subnet_id) td__query_add(&q, "SubnetId", s->subnet_id);
    if (s->availability_zone && *s->availability_zone)
        td__query_add(&q, "Placement.AvailabilityZone", s->availability_zone);
    for (int i = 0; i < s->nsecurity_groups; i++) {
        char k[48];
        snprintf(k, sizeof k, "SecurityGroupId.%d", i + 1);
        td__query_add(&q, k, s->security_group_ids[i]);
    }
    if (s->spot) {
        td__query_add(&q, "InstanceMarketOptions.MarketType", "spot");
        td__query_add(&q, "InstanceMarketOptions.SpotOptions.SpotInstanceType", "one-time");
        td__query_add(&q, "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior",
                      "terminate");
        if (s->spot_max_price && *s->spot_max_price)
            td__query_add(&q, "InstanceMarketOptions.SpotOptions.MaxPrice", s->spot_max_price);
    }
    if (s->iam_instance_profile && *s->iam_instance_profile)
        td__query_add(&q,
                      strncmp(s->iam_instance_profile, "arn:", 4) ? "IamInstanceProfile.Name"
                                                                  : "IamInstanceProfile.Arn",
                      s->iam_instance_profile);
    if (s->root_volume_gib > 0) {
        td__query_add(&q, "BlockDeviceMapping.1.DeviceName",
                      s->root_device_name ? s->root_device_name : "/dev/xvda");
        td__query_addf(&q, "BlockDeviceMapping.1.Ebs.VolumeSize", "%d", s->root_volume_gib);
        td__query_add(&q, "BlockDeviceMapping.1.Ebs.VolumeType", "gp3");
        td__query_add(&q, "BlockDeviceMapping.1.Ebs.DeleteOnTermination", "true");
    }
    int ntags = s->ntags + (s->run_id && *s->run_id);
    if (ntags > 0) {
        static const char *const types[] = {"instance", "volume"};
        for (int t = 0; t < 2; t++) {
            char k[96];
            snprintf(k, sizeof k, "TagSpecification.%d.ResourceType", t + 1);
            td__query_add(&q, k, types[t]);
            int n = 0;
            if (s->run_id && *s->run_id) {
                n++;
                snprintf(k, sizeof k, "TagSpecification.%d.Tag.%d.Key", t + 1, n);
                td__query_add(&q, k, RUN_TAG);
                snprintf(k, sizeof k, "TagSpecification.%d.Tag.%d.Value", t + 1, n);
                td__query_add(&q, k, s->run_id);
            }
            for (int i = 0; i < s->ntags; i++) {
                n++;
                snprintf(k, sizeof k, "TagSpecification.%d.Tag.%d.Key", t + 1, n);
                td__query_add(&q, k, s->tags[i].key);
                snprintf(k, sizeof k, "TagSpecification.%d.Tag.%d.Value", t + 1, n);
                td__query_add(&q, k, s->tags[i].value ? s->tags[i].value : "");
            }
        }
    }
    if (s->client_token) td__query_add(&q, "ClientToken", s->client_token);
    if (s->shutdown_terminates)
        td__query_add(&q, "InstanceInitiatedShutdownBehavior", "terminate");
    if (s->user_data) {
        char *b64 = td__base64(s->user_data, strlen(s->user_data));
        td__query_add(&q, "UserData", b64);
        free(b64);
    }
    char what[160];
    snprintf(what, sizeof what, "(%d x %s%s, image %s)", max, s->instance_type,
             s->spot ? " spot" : "", s->image_id);
    td__http_resp resp;
    td_status st = ec2_call(aws, "RunInstances", what, q, &resp);
    free(q);
    if (st == TD_OK) st = td_ec2_parse_instances(resp.body, resp.body_nbytes, out, NULL);
    td__http_resp_free(&resp);
    return st;
}

/* DescribeInstances with the query `base` (ids, filters), page after page (NextToken); ids ask
 * no MaxResults (EC2 refuses the two together). */
static td_status describe_pages(td_aws_t *aws, const char *what, const char *base, bool by_ids,
                                td_ec2_instances *out) {
    memset(out, 0, sizeof *out);
    char *next = NULL, *prev = NULL;
    td_status st = TD_OK;
    do {
        char *q = base && *base ? td_xstrdup(base) : NULL;
        if (next) {
            td__query_add(&q, "NextToken", next);
            free(prev);
            prev = next;
            next = NULL;
        }
        if (!by_ids) td__query_addf(&q, "MaxResults", "%d", aws->ec2_page_size);
        td__http_resp resp;
        st = ec2_call(aws, "DescribeInstances", what, q, &resp);
        free(q);
        if (st == TD_OK) st = td_ec2_parse_instances(resp.body, resp.body_nbytes, out, &next);
        td__http_resp_free(&resp);
        /* the same token twice would page forever (botocore's paginator refuses it too) */
        if (st == TD_OK && next && prev && !strcmp(next, prev))
            st = td_error(TD_ERR_PROTOCOL,
                          "aws ec2 DescribeInstances %s: the same NextToken twice; stopped "
                          "after %d instances",
                          what, out->count);
    } while (st == TD_OK && next);
    free(next);
    free(prev);
    if (st != TD_OK) td_ec2_instances_free(out);
    return st;
}

/* Filter.N.Name=name, Filter.N.Value.K=values[K-1] */
static void add_filter(char **q, int n, const char *name, const char *const *values, int nvalues) {
    char k[40];
    snprintf(k, sizeof k, "Filter.%d.Name", n);
    td__query_add(q, k, name);
    for (int i = 0; i < nvalues; i++) {
        snprintf(k, sizeof k, "Filter.%d.Value.%d", n, i + 1);
        td__query_add(q, k, values[i]);
    }
}

td_status td_ec2_describe_instances(td_aws_t *aws, const char *const *ids, int nids,
                                    const char *run_id, const char *state, td_ec2_instances *out) {
    char *q = NULL;
    for (int i = 0; i < nids; i++) {
        char k[32];
        snprintf(k, sizeof k, "InstanceId.%d", i + 1);
        td__query_add(&q, k, ids[i]);
    }
    int f = 0;
    if (run_id && *run_id) add_filter(&q, ++f, "tag:" RUN_TAG, &run_id, 1);
    if (state && *state) add_filter(&q, ++f, "instance-state-name", &state, 1);
    char what[160];
    snprintf(what, sizeof what, "(%s%s)", run_id ? "run " : "instances by id",
             run_id ? run_id : "");
    td_status st = describe_pages(aws, what, q, nids > 0, out);
    free(q);
    return st;
}

td_status td_ec2_describe_tagged(td_aws_t *aws, const char *tag_key, const char *const *states,
                                 int nstates, td_ec2_instances *out) {
    char *q = NULL;
    add_filter(&q, 1, "tag-key", &tag_key, 1);
    if (nstates > 0) add_filter(&q, 2, "instance-state-name", states, nstates);
    char what[160];
    snprintf(what, sizeof what, "(every instance tagged %s)", tag_key);
    td_status st = describe_pages(aws, what, q, false, out);
    free(q);
    return st;
}

td_status td_ec2_describe_tandem(td_aws_t *aws, const char *const *states, int nstates,
                                 td_ec2_instances *out) {
    return td_ec2_describe_tagged(aws, RUN_TAG, states, nstates, out);
}

td_status td_ec2_terminate_instances(td_aws_t *aws, const char *const *ids, int nids,
                                     td_ec2_instances *out) {
    if (out) memset(out, 0, sizeof *out);
    if (nids <= 0) return TD_OK;
    char *q = NULL;
    for (int i = 0; i < nids; i++) {
        char k[32];
        snprintf(k, sizeof k, "InstanceId.%d", i + 1);
        td__query_add(&q, k, ids[i]);
    }
    char what[96];
    snprintf(what, sizeof what, "(%d instance%s, %s...)", nids, nids == 1 ? "" : "s", ids[0]);
    td__http_resp resp;
    td_status st = ec2_call(aws, "TerminateInstances", what, q, &resp);
    free(q);
    if (st == TD_OK && out) st = td_ec2_parse_instances(resp.body, resp.body_nbytes, out, NULL);
    td__http_resp_free(&resp);
    return st;
}

/* The newest item of a DescribeSpotPriceHistory answer (the list is not sorted by time on
 * every endpoint: the newest timestamp wins; ISO 8601 in UTC compares as text). */
td_status td_ec2_parse_spot_price(const char *xml, size_t nbytes, double *usd_out, char *when,
                                  size_t when_nbytes) {
    *usd_out = 0;
    if (when_nbytes) when[0] = '\0';
    td__xml *root = NULL;
    TD_CHECK(td__xml_parse(xml, nbytes, &root));
    const td__xml *set = td__xml_child(root, "spotPriceHistorySet");
    const char *best = NULL, *best_price = NULL;
    for (const td__xml *it = set ? set->child : NULL; it; it = it->next) {
        const char *ts = td__xml_text(it, "timestamp"), *price = td__xml_text(it, "spotPrice");
        if (*price && (!best || strcmp(ts, best) > 0)) {
            best = ts;
            best_price = price;
        }
    }
    td_status st = TD_OK;
    char *end = NULL;
    double usd = best_price ? strtod(best_price, &end) : 0;
    if (!best_price)
        st = td_error(TD_ERR_NOTFOUND, "EC2 has no spot price for it");
    else if (end == best_price || *end || !(usd > 0))
        st = td_error(TD_ERR_FORMAT, "EC2 gave the spot price '%.40s', which is not a price",
                      best_price);
    else {
        *usd_out = usd;
        if (when_nbytes) snprintf(when, when_nbytes, "%s", best);
    }
    td__xml_free(root);
    return st;
}

/* DescribeSpotPriceHistory's query for a Linux type, StartTime now: EC2 answers with the price
 * in effect now in each zone. */
static char *spot_price_query(const char *type) {
    char *q = NULL;
    td__query_add(&q, "InstanceType.1", type);
    td__query_add(&q, "ProductDescription.1", "Linux/UNIX");
    char now[32];
    time_t t = time(NULL);
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(now, sizeof now, "%Y-%m-%dT%H:%M:%SZ", &tm);
    td__query_add(&q, "StartTime", now);
    return q;
}

td_status td_ec2_spot_price(td_aws_t *aws, const char *type, const char *zone, double *usd_out,
                            char *when, size_t when_nbytes) {
    char *q = spot_price_query(type);
    if (zone && *zone) add_filter(&q, 1, "availability-zone", &zone, 1);
    char what[160];
    snprintf(what, sizeof what, "(%s in %s)", type, zone && *zone ? zone : "every zone");
    td__http_resp resp;
    td_status st = ec2_call(aws, "DescribeSpotPriceHistory", what, q, &resp);
    free(q);
    if (st == TD_OK) {
        st = td_ec2_parse_spot_price(resp.body, resp.body_nbytes, usd_out, when, when_nbytes);
        if (st != TD_OK)
            st = td_error(st, "aws ec2 DescribeSpotPriceHistory %s: %s", what, td_error_msg());
    }
    td__http_resp_free(&resp);
    return st;
}

static int by_zone(const void *a, const void *b) {
    return strcmp(((const td_ec2_zone_price *)a)->zone, ((const td_ec2_zone_price *)b)->zone);
}

/* Each zone's newest item (the newest timestamp wins, as in td_ec2_parse_spot_price). */
td_status td_ec2_parse_spot_prices(const char *xml, size_t nbytes, td_ec2_zone_price **out,
                                   size_t *count) {
    *out = NULL;
    *count = 0;
    td__xml *root = NULL;
    TD_CHECK(td__xml_parse(xml, nbytes, &root));
    const td__xml *set = td__xml_child(root, "spotPriceHistorySet");
    size_t n = 0, cap = 0;
    td_ec2_zone_price *v = NULL;
    td_status st = TD_OK;
    for (const td__xml *it = set ? set->child : NULL; it && st == TD_OK; it = it->next) {
        const char *zone = td__xml_text(it, "availabilityZone");
        const char *ts = td__xml_text(it, "timestamp"), *price = td__xml_text(it, "spotPrice");
        if (!*zone || !*price) continue;
        char *end = NULL;
        double usd = strtod(price, &end);
        if (end == price || *end || !(usd > 0)) {
            st = td_error(TD_ERR_FORMAT, "EC2 gave the spot price '%.40s' in %.40s, which is "
                                         "not a price", price, zone);
            break;
        }
        size_t k = 0;
        while (k < n && strcmp(v[k].zone, zone)) k++;
        if (k == n) {
            if (n == cap) {
                cap = cap ? 2 * cap : 8;
                v = realloc(v, cap * sizeof *v);
                if (!v) abort();
            }
            memset(&v[n], 0, sizeof v[n]);
            snprintf(v[n].zone, sizeof v[n].zone, "%s", zone);
            n++;
        } else if (strcmp(ts, v[k].when) <= 0) {
            continue;
        }
        v[k].usd = usd;
        snprintf(v[k].when, sizeof v[k].when, "%s", ts);
    }
    td__xml_free(root);
    if (st == TD_OK && !n)
        st = td_error(TD_ERR_NOTFOUND, "EC2 has no spot price for it in any zone");
    if (st != TD_OK) {
        free(v);
        return st;
    }
    qsort(v, n, sizeof *v, by_zone);
    *out = v;
    *count = n;
    return TD_OK;
}

td_status td_ec2_spot_prices(td_aws_t *aws, const char *type, td_ec2_zone_price **out,
                             size_t *count) {
    *out = NULL;
    *count = 0;
    char *q = spot_price_query(type);
    char what[160];
    snprintf(what, sizeof what, "(%s in every zone)", type);
    td__http_resp resp;
    td_status st = ec2_call(aws, "DescribeSpotPriceHistory", what, q, &resp);
    free(q);
    if (st == TD_OK) {
        st = td_ec2_parse_spot_prices(resp.body, resp.body_nbytes, out, count);
        if (st != TD_OK)
            st = td_error(st, "aws ec2 DescribeSpotPriceHistory %s: %s", what, td_error_msg());
    }
    td__http_resp_free(&resp);
    return st;
}

/* ---- instance types ---- */
static double xml_num(const td__xml *n, const char *path) {
    const char *t = td__xml_text(n, path);
    return *t ? strtod(t, NULL) : 0;
}

td_status td_ec2_parse_instance_types(const char *xml, size_t nbytes, td_ec2_type **items,
                                      size_t *count, char **next_token_out) {
    if (next_token_out) *next_token_out = NULL;
    td__xml *root = NULL;
    TD_CHECK(td__xml_parse(xml, nbytes, &root));
    const td__xml *set = td__xml_child(root, "instanceTypeSet");
    if (!set) {
        td__xml_free(root);
        return td_error(TD_ERR_FORMAT, "an EC2 answer <%s> without instanceTypeSet", root->name);
    }
    for (const td__xml *it = set->child; it; it = it->next) {
        *items = td_xrealloc(*items, (*count + 1) * sizeof **items);
        td_ec2_type *t = &(*items)[(*count)++];
        memset(t, 0, sizeof *t);
        td__xml_copy(t->name, sizeof t->name, it, "instanceType");
        t->vcpus = (int)xml_num(it, "vCpuInfo/defaultVCpus");
        t->memory_gib = xml_num(it, "memoryInfo/sizeInMiB") / 1024.0;
        /* x86_64 when the type supports it (t2 lists i386 first), else the first */
        const td__xml *archs = td__xml_child(td__xml_child(it, "processorInfo"),
                                             "supportedArchitectures");
        for (const td__xml *a = archs ? archs->child : NULL; a; a = a->next) {
            const char *name = a->text ? a->text : "";
            if (!t->arch[0] || !strcmp(name, "x86_64"))
                snprintf(t->arch, sizeof t->arch, "%s", name);
        }
        const td__xml *gpus = td__xml_child(td__xml_child(it, "gpuInfo"), "gpus");
        for (const td__xml *g = gpus ? gpus->child : NULL; g; g = g->next) {
            t->gpus += (int)xml_num(g, "count");
            if (!t->gpu_model[0]) {
                td__xml_copy(t->gpu_model, sizeof t->gpu_model, g, "name");
                t->gpu_memory_gib = xml_num(g, "memoryInfo/sizeInMiB") / 1024.0;
            }
        }
    }
    const char *next = td__xml_text(root, "nextToken");
    if (next_token_out && *next) *next_token_out = td_xstrdup(next);
    td__xml_free(root);
    return TD_OK;
}

td_status td_ec2_describe_instance_types(td_aws_t *aws, td_ec2_type **out, size_t *count) {
    *out = NULL;
    *count = 0;
    char *token = NULL;
    td_status st = TD_OK;
    for (int page = 0; page < 1000; page++) {
        char *q = NULL;
        td__query_add(&q, "MaxResults", "100");
        if (token) td__query_add(&q, "NextToken", token);
        td__http_resp resp;
        st = ec2_call(aws, "DescribeInstanceTypes", "(every type)", q, &resp);
        free(q);
        char *next = NULL;
        if (st == TD_OK)
            st = td_ec2_parse_instance_types(resp.body, resp.body_nbytes, out, count, &next);
        td__http_resp_free(&resp);
        bool same = next && token && !strcmp(next, token);
        free(token);
        token = next;
        if (st != TD_OK || !token) break;
        if (same) {
            st = td_error(TD_ERR_PEER,
                          "aws ec2 DescribeInstanceTypes gave the same NextToken twice");
            break;
        }
    }
    free(token);
    if (st != TD_OK) {
        free(*out);
        *out = NULL;
        *count = 0;
    }
    return st;
}
