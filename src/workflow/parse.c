/* Workflow files: YAML (libyaml's document loader) into td_workflow structs, with every error
 * pointing at file:line:column and naming the field. */
#include "tandem/workflow.h"
#include "tandem/cloud.h"

#include <ctype.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <yaml.h>

typedef struct {
    const char *file;
    yaml_document_t *doc;
} parse_ctx;

/* "file:line:col: field: message" at a node; lines and columns 1-based. */
static td_status node_error(const parse_ctx *c, const yaml_node_t *n, const char *field,
                            const char *fmt, ...) TD_PRINTF(4, 5);
static td_status node_error(const parse_ctx *c, const yaml_node_t *n, const char *field,
                            const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return td_error(TD_ERR_FORMAT, "%s:%zu:%zu: %s%s%s", c->file, n ? n->start_mark.line + 1 : 1,
                    n ? n->start_mark.column + 1 : 1, field ? field : "", field ? ": " : "", msg);
}

static const char *scalar(const yaml_node_t *n) {
    return n && n->type == YAML_SCALAR_NODE ? (const char *)n->data.scalar.value : NULL;
}

/* A short rendering of a node for "got '...'" in messages. */
static const char *describe(const yaml_node_t *n) {
    if (!n) return "nothing";
    if (n->type == YAML_SEQUENCE_NODE) return "a list";
    if (n->type == YAML_MAPPING_NODE) return "a mapping";
    return (const char *)n->data.scalar.value;
}

static td_status get_string(const parse_ctx *c, const yaml_node_t *n, const char *field,
                            char **out) {
    const char *s = scalar(n);
    if (!s) return node_error(c, n, field, "expected a string, got %s", describe(n));
    free(*out);
    *out = td_xstrdup(s);
    return TD_OK;
}

static td_status get_int(const parse_ctx *c, const yaml_node_t *n, const char *field, int min,
                         int *out) {
    const char *s = scalar(n);
    const char *want = min > 0 ? "a positive integer" : "a non-negative integer";
    if (!s) return node_error(c, n, field, "expected %s, got %s", want, describe(n));
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (!*s || *end || errno || v < min || v > 1000000)
        return node_error(c, n, field, "expected %s, got '%s'", want, s);
    *out = (int)v;
    return TD_OK;
}

/* A string or a list of strings. */
static td_status get_string_list(const parse_ctx *c, const yaml_node_t *n, const char *field,
                                 char ***out, size_t *count) {
    if (n->type == YAML_SCALAR_NODE) {
        *out = td_xrealloc(*out, (*count + 1) * sizeof **out);
        (*out)[(*count)++] = td_xstrdup(scalar(n));
        return TD_OK;
    }
    if (n->type != YAML_SEQUENCE_NODE)
        return node_error(c, n, field, "expected a string or a list of strings, got %s",
                          describe(n));
    for (yaml_node_item_t *it = n->data.sequence.items.start; it < n->data.sequence.items.top;
         it++) {
        yaml_node_t *item = yaml_document_get_node(c->doc, *it);
        if (!scalar(item))
            return node_error(c, item, field, "expected a string in the list, got %s",
                              describe(item));
        *out = td_xrealloc(*out, (*count + 1) * sizeof **out);
        (*out)[(*count)++] = td_xstrdup(scalar(item));
    }
    return TD_OK;
}

/* An s3:// URL tandem can use (bucket name rules: cloud.h's td_s3_url_parse). */
static td_status check_s3_url(const parse_ctx *c, const yaml_node_t *n, const char *field,
                              const char *url) {
    td_s3_url u = {0};
    if (td_s3_url_parse(url, &u) == TD_OK) {
        td_s3_url_free(&u);
        return TD_OK;
    }
    char why[512];
    snprintf(why, sizeof why, "%s", td_error_msg());
    td_error_clear();
    return node_error(c, n, field, "%s", why);
}

/* artifacts: a string or a list of paths/globs, or a mapping {paths: [...], to: s3://B/P}
 * (the collected artifacts then also go to s3://B/P/RUN_ID/NAME). */
static td_status get_artifacts(const parse_ctx *c, const yaml_node_t *n, td_workflow *w) {
    if (n->type != YAML_MAPPING_NODE)
        return get_string_list(c, n, "artifacts", &w->artifacts, &w->nartifacts);
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        const char *f = scalar(k);
        if (f && !strcmp(f, "paths")) {
            TD_CHECK(get_string_list(c, v, "artifacts.paths", &w->artifacts, &w->nartifacts));
        } else if (f && !strcmp(f, "to")) {
            TD_CHECK(get_string(c, v, "artifacts.to", &w->artifacts_to));
            if (strncmp(w->artifacts_to, "s3://", 5))
                return node_error(c, v, "artifacts.to",
                                  "expected an s3://BUCKET/PREFIX URL, got '%s'", w->artifacts_to);
            TD_CHECK(check_s3_url(c, v, "artifacts.to", w->artifacts_to));
        } else {
            return node_error(c, k, "artifacts", "unknown field '%s'; expected paths or to",
                              f ? f : describe(k));
        }
    }
    return TD_OK;
}

static int valid_key(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && *s != '_' && *s != '-' && *s != '.') return 0;
    return 1;
}

static td_status get_map(const parse_ctx *c, const yaml_node_t *n, const char *field,
                         int keys_are_names, td_kv **out, size_t *count) {
    if (n->type != YAML_MAPPING_NODE)
        return node_error(c, n, field, "expected a mapping of names to values, got %s",
                          describe(n));
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        const char *ks = scalar(k);
        if (!ks || (keys_are_names && !valid_key(ks)))
            return node_error(c, k, field,
                              "expected a name of letters, digits, '_', '-' or '.', got '%s'",
                              describe(k));
        if (!scalar(v))
            return node_error(c, v, field, "%s: expected a single value, got %s", ks, describe(v));
        for (size_t i = 0; i < *count; i++)
            if (!strcmp((*out)[i].key, ks))
                return node_error(c, k, field, "'%s' appears twice", ks);
        *out = td_xrealloc(*out, (*count + 1) * sizeof **out);
        (*out)[*count].key = td_xstrdup(ks);
        (*out)[*count].value = td_xstrdup(scalar(v));
        (*count)++;
    }
    return TD_OK;
}

td_status td_parse_duration(const char *what, const char *text, double *seconds_out) {
    const char *p = text;
    double total = 0;
    int parts = 0;
    while (p && *p) {
        char *end = NULL;
        errno = 0;
        double v = strtod(p, &end);
        if (end == p || errno || v < 0 || !isfinite(v)) goto bad;
        double unit = 1;
        switch (*end) {
        case 's':
            unit = 1;
            end++;
            break;
        case 'm':
            unit = 60;
            end++;
            break;
        case 'h':
            unit = 3600;
            end++;
            break;
        case 'd':
            unit = 86400;
            end++;
            break;
        case '\0':
            if (parts) goto bad; /* "1h30" is ambiguous */
            break;
        default:
            goto bad;
        }
        total += v * unit;
        parts++;
        p = end;
    }
    if (!parts || total <= 0) goto bad;
    *seconds_out = total;
    return TD_OK;
bad:
    return td_error(TD_ERR_INVALID,
                    "%s: expected a duration such as 90s, 30m, 2h or 1h30m, got '%s'", what,
                    text ? text : "");
}

void td_workflow_free(td_workflow *w);

static void workflow_clear(td_workflow *w) {
    free(w->name);
    for (size_t i = 0; i < w->ncommands; i++) free(w->commands[i]);
    free(w->commands);
    for (size_t i = 0; i < w->nsetup; i++) free(w->setup[i]);
    free(w->setup);
    for (size_t i = 0; i < w->nnode_setup; i++) free(w->node_setup[i]);
    free(w->node_setup);
    for (size_t i = 0; i < w->nenv; i++) {
        free(w->env[i].key);
        free(w->env[i].value);
    }
    free(w->env);
    for (size_t i = 0; i < w->nsecrets; i++) free(w->secrets[i]);
    free(w->secrets);
    free(w->file);
    for (size_t i = 0; i < w->nparams; i++) {
        free(w->params[i].key);
        free(w->params[i].value);
    }
    free(w->params);
    for (size_t i = 0; i < w->nartifacts; i++) free(w->artifacts[i]);
    free(w->artifacts);
    free(w->artifacts_to);
    free(w->checkpoint_dir);
    for (size_t i = 0; i < w->ntags; i++) free(w->tags[i]);
    free(w->tags);
    free(w->group);
    free(w->workdir);
    free(w->executor);
    td_slurm_options_clear(&w->slurm);
    td_ssh_options_clear(&w->ssh);
    td_aws_options_clear(&w->aws);
    memset(w, 0, sizeof *w);
}

void td_workflow_free(td_workflow *w) {
    if (!w) return;
    workflow_clear(w);
    free(w);
}

void td_workflow_file_free(td_workflow_file *wf) {
    if (!wf) return;
    for (size_t i = 0; i < wf->count; i++) workflow_clear(&wf->items[i]);
    free(wf->items);
    free(wf->path);
    free(wf);
}

static const char *const known_fields =
    "name, description, command, commands, setup, node_setup, nodes, nproc_per_node, env, secrets, "
    "params, artifacts, checkpoint_dir, workdir, max_restarts, max_duration, executor, slurm, ssh, "
    "aws, tags, group";

static const char *const slurm_fields =
    "partition, time, account, sbatch_args, signal_lead, work_dir, link_host";
static const char *const ssh_fields = "hosts, hostfile, work_dir, ssh_args, tandem, rdzv_host";
static const char *const aws_fields =
    "region, profile, instance_type, instance_types, image, key_name, ssh_key, user, subnet, "
    "subnets, security_groups, spot, max_price, fallback, volume_gb, root_device, "
    "iam_instance_profile, tags, setup, work_dir, tandem, address, orphan_timeout, prices, "
    "resources, zones, controller";
static const char *const controller_fields = "instance_type, iam_instance_profile";
static const char *const resources_fields =
    "cpu, memory, gpu, gpu_model, gpu_memory, disk, arch";

static td_status get_aws_name(const parse_ctx *c, const yaml_node_t *n, const char *field,
                              const char *example, char **out);

/* A number at least min (GiB for memory and disk, a count for cpu and gpu). */
static td_status get_amount(const parse_ctx *c, const yaml_node_t *n, const char *field,
                            double min, double *out) {
    const char *s = scalar(n);
    char *end = NULL;
    double v = s ? strtod(s, &end) : 0;
    if (!s || end == s || (*end && strcasecmp(end, "GB") && strcasecmp(end, "GiB")) ||
        !(v >= min) || v > 1e6)
        return node_error(c, n, field, "expected a number of at least %g%s, got %s", min,
                          strstr(field, "memory") || strstr(field, "disk") ? " (GiB)" : "",
                          s ? s : describe(n));
    *out = v;
    return TD_OK;
}

/* resources: what the job needs; the executor picks the cheapest type that has it. */
/* aws.controller: the instance that supervises a run submitted with tandem run -d
 * (src/exec/controller.c). */
static td_status parse_aws_controller(const parse_ctx *c, const yaml_node_t *n,
                                      td_aws_options *o) {
    if (n->type != YAML_MAPPING_NODE)
        return node_error(c, n, "aws.controller", "expected a mapping with %s, got %s",
                          controller_fields, describe(n));
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        const char *f = scalar(k);
        if (f && !strcmp(f, "instance_type")) {
            TD_CHECK(get_aws_name(c, v, "aws.controller.instance_type", "t3.small",
                                  &o->controller_type));
        } else if (f && !strcmp(f, "iam_instance_profile")) {
            TD_CHECK(get_aws_name(c, v, "aws.controller.iam_instance_profile",
                                  "tandem-controller", &o->controller_profile));
        } else {
            return node_error(c, k, "aws.controller", "unknown field '%s'; the fields are: %s",
                              f ? f : "?", controller_fields);
        }
    }
    return TD_OK;
}

static td_status parse_resources(const parse_ctx *c, const yaml_node_t *n, td_aws_options *o) {
    if (n->type != YAML_MAPPING_NODE)
        return node_error(c, n, "aws.resources", "expected a mapping with %s, got %s",
                          resources_fields, describe(n));
    o->resources.set = 1;
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        const char *f = scalar(k);
        double x = 0;
        if (f && !strcmp(f, "cpu")) {
            TD_CHECK(get_amount(c, v, "aws.resources.cpu", 1, &o->resources.cpu));
        } else if (f && !strcmp(f, "memory")) {
            TD_CHECK(get_amount(c, v, "aws.resources.memory", 0.5, &o->resources.memory_gib));
        } else if (f && !strcmp(f, "gpu")) {
            TD_CHECK(get_amount(c, v, "aws.resources.gpu", 1, &x));
            if (x != (int)x)
                return node_error(c, v, "aws.resources.gpu", "expected a whole number of GPUs");
            o->resources.gpu = (int)x;
        } else if (f && !strcmp(f, "gpu_model")) {
            TD_CHECK(get_aws_name(c, v, "aws.resources.gpu_model", "A10G",
                                  &o->resources.gpu_model));
        } else if (f && !strcmp(f, "gpu_memory")) {
            TD_CHECK(get_amount(c, v, "aws.resources.gpu_memory", 1, &o->resources.gpu_memory_gib));
        } else if (f && !strcmp(f, "disk")) {
            TD_CHECK(get_amount(c, v, "aws.resources.disk", 1, &x));
            o->resources.disk_gib = (int)x + (x > (int)x);
        } else if (f && !strcmp(f, "arch")) {
            const char *s = scalar(v);
            if (!s || (strcmp(s, "x86_64") && strcmp(s, "arm64") && strcmp(s, "any")))
                return node_error(c, v, "aws.resources.arch",
                                  "expected x86_64 (the default), arm64 or any, got %s",
                                  s ? s : describe(v));
            free(o->resources.arch);
            o->resources.arch = td_xstrdup(s);
        } else {
            return node_error(c, k, "aws.resources", "unknown field '%s'; the fields are: %s",
                              f ? f : "?", resources_fields);
        }
    }
    if ((o->resources.gpu_model || o->resources.gpu_memory_gib > 0) && !o->resources.gpu)
        o->resources.gpu = 1; /* a model or its memory asks for one at least */
    return TD_OK;
}

static td_status get_bool(const parse_ctx *c, const yaml_node_t *n, const char *field, int *out) {
    const char *s = scalar(n);
    if (s && (!strcmp(s, "true") || !strcmp(s, "yes") || !strcmp(s, "on"))) {
        *out = 1;
        return TD_OK;
    }
    if (s && (!strcmp(s, "false") || !strcmp(s, "no") || !strcmp(s, "off"))) {
        *out = 0;
        return TD_OK;
    }
    return node_error(c, n, field, "expected true or false, got %s", s ? s : describe(n));
}

/* A string made of the characters AWS names are made of (ids, types, names): nothing a shell or
 * an XML body could misread, so no quoting question arises later. */
static int aws_name_ok(const char *s) {
    if (!*s) return 0;
    for (; *s; s++)
        if (!isalnum((unsigned char)*s) && !strchr("._-:/+=@", *s)) return 0;
    return 1;
}

static td_status get_aws_name(const parse_ctx *c, const yaml_node_t *n, const char *field,
                              const char *example, char **out) {
    TD_CHECK(get_string(c, n, field, out));
    if (!aws_name_ok(*out))
        return node_error(c, n, field, "'%s' is not a name AWS gives (such as %s)", *out, example);
    return TD_OK;
}

static td_status get_aws_names(const parse_ctx *c, const yaml_node_t *n, const char *field,
                               const char *example, char ***out, size_t *count) {
    TD_CHECK(get_string_list(c, n, field, out, count));
    for (size_t i = 0; i < *count; i++)
        if (!aws_name_ok((*out)[i]))
            return node_error(c, n, field, "'%s' is not a name AWS gives (such as %s)", (*out)[i],
                              example);
    return TD_OK;
}

static td_status parse_aws_tags(const parse_ctx *c, const yaml_node_t *n, td_aws_options *o) {
    if (n->type != YAML_MAPPING_NODE)
        return node_error(c, n, "aws.tags", "expected a mapping of tag keys to values, got %s",
                          describe(n));
    for (const yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
         p++) {
        const yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        const yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        const char *ks = scalar(k), *vs = scalar(v);
        if (!ks || !*ks || !vs) return node_error(c, k, "aws.tags", "expected key: value");
        if (!strncmp(ks, "aws:", 4) || !strncmp(ks, "tandem:", 7) || !strcmp(ks, "Name"))
            return node_error(c, k, "aws.tags",
                              "'%s' is set by AWS or tandem (aws:*, tandem:*, Name); choose "
                              "another key",
                              ks);
        if (strlen(ks) > 128 || strlen(vs) > 256)
            return node_error(c, k, "aws.tags",
                              "'%s': AWS allows keys of 128 and values of 256 characters", ks);
        o->tags = td_xrealloc(o->tags, (o->ntags + 1) * sizeof *o->tags);
        o->tags[o->ntags].key = td_xstrdup(ks);
        o->tags[o->ntags].value = td_xstrdup(vs);
        o->ntags++;
    }
    return TD_OK;
}

static td_status parse_aws_field(const parse_ctx *c, const char *f, const yaml_node_t *k,
                                 const yaml_node_t *v, td_aws_options *o) {
    if (!strcmp(f, "region")) return get_aws_name(c, v, "aws.region", "us-east-1", &o->region);
    if (!strcmp(f, "profile")) return get_string(c, v, "aws.profile", &o->profile);
    if (!strcmp(f, "instance_type") || !strcmp(f, "instance_types")) {
        char **v2 = NULL;
        size_t n2 = 0;
        td_status st = get_aws_names(c, v, f, "g5.xlarge", &v2, &n2);
        for (size_t i = 0; i < n2; i++) { /* instance_type first, then the alternatives */
            o->instance_types = td_xrealloc(o->instance_types,
                                            (o->ninstance_types + 1) * sizeof *o->instance_types);
            if (!strcmp(f, "instance_type")) {
                memmove(o->instance_types + 1, o->instance_types,
                        o->ninstance_types * sizeof *o->instance_types);
                o->instance_types[0] = v2[i];
            } else {
                o->instance_types[o->ninstance_types] = v2[i];
            }
            o->ninstance_types++;
        }
        free(v2);
        return st;
    }
    if (!strcmp(f, "image")) return get_aws_name(c, v, "aws.image", "ami-0abc123", &o->image);
    if (!strcmp(f, "key_name")) return get_string(c, v, "aws.key_name", &o->key_name);
    if (!strcmp(f, "ssh_key")) return get_string(c, v, "aws.ssh_key", &o->ssh_key);
    if (!strcmp(f, "user")) return get_aws_name(c, v, "aws.user", "ubuntu", &o->user);
    if (!strcmp(f, "zones"))
        return get_aws_names(c, v, "aws.zones", "us-east-1a", &o->zones, &o->nzones);
    if (!strcmp(f, "subnet") || !strcmp(f, "subnets"))
        return get_aws_names(c, v, f, "subnet-0abc", &o->subnets, &o->nsubnets);
    if (!strcmp(f, "security_groups"))
        return get_aws_names(c, v, "aws.security_groups", "sg-0abc", &o->security_groups,
                             &o->nsecurity_groups);
    if (!strcmp(f, "spot")) return get_bool(c, v, "aws.spot", &o->spot);
    if (!strcmp(f, "max_price")) {
        TD_CHECK(get_string(c, v, "aws.max_price", &o->max_price));
        char *end = NULL;
        double price = strtod(o->max_price, &end);
        if (end == o->max_price || *end || !(price > 0))
            return node_error(c, v, "aws.max_price",
                              "expected a price in USD per hour such as 0.35, got '%s'",
                              o->max_price);
        return TD_OK;
    }
    if (!strcmp(f, "fallback")) {
        const char *s = scalar(v);
        if (s && !strcmp(s, "on-demand"))
            o->fallback_on_demand = 1;
        else if (s && !strcmp(s, "none"))
            o->fallback_on_demand = 0;
        else
            return node_error(c, v, "aws.fallback",
                              "expected on-demand (spot refused everywhere: on-demand "
                              "instances) or none, got %s",
                              s ? s : describe(v));
        return TD_OK;
    }
    if (!strcmp(f, "volume_gb")) return get_int(c, v, "aws.volume_gb", 1, &o->volume_gb);
    if (!strcmp(f, "root_device")) return get_string(c, v, "aws.root_device", &o->root_device);
    if (!strcmp(f, "iam_instance_profile"))
        return get_aws_name(c, v, "aws.iam_instance_profile", "tandem-node",
                            &o->iam_instance_profile);
    if (!strcmp(f, "controller")) return parse_aws_controller(c, v, o);
    if (!strcmp(f, "tags")) return parse_aws_tags(c, v, o);
    if (!strcmp(f, "setup")) return get_string_list(c, v, "aws.setup", &o->setup, &o->nsetup);
    if (!strcmp(f, "work_dir")) return get_string(c, v, "aws.work_dir", &o->work_dir);
    if (!strcmp(f, "tandem")) return get_string(c, v, "aws.tandem", &o->tandem);
    if (!strcmp(f, "prices")) return get_string(c, v, "aws.prices", &o->prices);
    if (!strcmp(f, "resources")) return parse_resources(c, v, o);
    if (!strcmp(f, "orphan_timeout")) {
        /* The dead-man's switch of every instance (docs/cloud.md): the supervisor says it lives
         * every quarter of this (30 s at most), so a shorter one would end live runs on a
         * hiccup; a day is more than any instance should bill for nothing. */
        const char *s = scalar(v);
        double t = 0;
        if (!s || td_parse_duration("aws.orphan_timeout", s, &t) != TD_OK || t < 10 ||
            t > 86400) {
            td_error_clear();
            return node_error(c, v, "aws.orphan_timeout",
                              "expected a duration from 10s to 1d such as 5m (how long an "
                              "instance that hears nothing from its supervisor keeps running "
                              "before it terminates itself), got '%s'",
                              s ? s : describe(v));
        }
        o->orphan_timeout_s = t;
        return TD_OK;
    }
    if (!strcmp(f, "address")) {
        const char *s = scalar(v);
        if (s && !strcmp(s, "public"))
            o->public_address = 1;
        else if (s && !strcmp(s, "private"))
            o->public_address = -1;
        else if (s && !strcmp(s, "auto"))
            o->public_address = 0;
        else
            return node_error(c, v, "aws.address",
                              "expected public, private or auto (public when the instance has "
                              "one), got %s",
                              s ? s : describe(v));
        return TD_OK;
    }
    return node_error(c, k, "aws", "unknown field '%s'; the fields are: %s", f, aws_fields);
}

static td_status parse_aws(const parse_ctx *c, const yaml_node_t *n, td_aws_options *o) {
    if (n->type != YAML_MAPPING_NODE)
        return node_error(c, n, "aws", "expected a mapping with %s, got %s", aws_fields,
                          describe(n));
    for (const yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top;
         p++) {
        const yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        const yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        const char *f = scalar(k);
        if (!f) return node_error(c, k, "aws", "field names must be strings");
        TD_CHECK(parse_aws_field(c, f, k, v, o));
    }
    /* what no default can stand for */
    if (!o->ninstance_types && !o->resources.set)
        return node_error(c, n, "aws.instance_type",
                          "aws: needs instance_type (such as g5.xlarge or c7i.large), or "
                          "resources: what the job needs ({cpu: 8, memory: 32, gpu: 1}), from "
                          "which the cheapest type is chosen");
    if (o->ninstance_types && o->resources.set)
        return node_error(c, n, "aws.resources",
                          "aws: gives both instance_type and resources; name the type, or say "
                          "what the job needs and let tandem choose, not both");
    if (!o->image)
        return node_error(c, n, "aws.image",
                          "aws: needs image, the AMI id of the instances (docs/cloud.md: which "
                          "image)");
    if (!o->key_name)
        return node_error(c, n, "aws.key_name",
                          "aws: needs key_name, the EC2 key pair tandem logs in with (and "
                          "ssh_key, its private key on this machine)");
    if (o->max_price && !o->spot)
        return node_error(c, n, "aws.max_price", "max_price is for spot instances; add spot: true");
    if (o->fallback_on_demand && !o->spot)
        return node_error(c, n, "aws.fallback",
                          "fallback: on-demand is for spot instances; add spot: true");
    return TD_OK;
}

static td_status parse_ssh(const parse_ctx *c, const yaml_node_t *n, td_ssh_options *o) {
    if (n->type != YAML_MAPPING_NODE)
        return node_error(c, n, "ssh", "expected a mapping with %s, got %s", ssh_fields,
                          describe(n));
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        const char *f = scalar(k);
        if (!f) return node_error(c, k, "ssh", "field names must be strings");
        if (!strcmp(f, "hosts")) {
            /* given again (a profile, then tandem run --host): the later list */
            for (size_t i = 0; i < o->nhosts; i++) free(o->hosts[i]);
            free(o->hosts);
            o->hosts = NULL;
            o->nhosts = 0;
            TD_CHECK(get_string_list(c, v, "ssh.hosts", &o->hosts, &o->nhosts));
            for (size_t i = 0; i < o->nhosts; i++)
                if (td_ssh_host_check("ssh.hosts", o->hosts[i]) != TD_OK) {
                    char why[512];
                    snprintf(why, sizeof why, "%s", td_error_msg());
                    td_error_clear();
                    return node_error(c, v, "ssh.hosts", "%s", why);
                }
        } else if (!strcmp(f, "hostfile")) {
            TD_CHECK(get_string(c, v, "ssh.hostfile", &o->hostfile));
        } else if (!strcmp(f, "work_dir")) {
            TD_CHECK(get_string(c, v, "ssh.work_dir", &o->work_dir));
        } else if (!strcmp(f, "ssh_args")) {
            TD_CHECK(get_string_list(c, v, "ssh.ssh_args", &o->ssh_args, &o->nssh_args));
        } else if (!strcmp(f, "tandem")) {
            TD_CHECK(get_string(c, v, "ssh.tandem", &o->tandem));
        } else if (!strcmp(f, "rdzv_host")) {
            TD_CHECK(get_string(c, v, "ssh.rdzv_host", &o->rdzv_host));
        } else {
            return node_error(c, k, "ssh", "unknown field '%s'; the fields are: %s", f, ssh_fields);
        }
    }
    if (!o->nhosts == !o->hostfile)
        return node_error(c, n, "ssh",
                          "give the machines as hosts: [a, b] or as hostfile: FILE (one of them)");
    return TD_OK;
}

/* slurm.time: Slurm's own forms (30:00, 2:00:00, 1-12:00:00) or a tandem duration (90m, 2h).
 * A plain number is neither: Slurm reads minutes where tandem reads seconds. */
static td_status get_slurm_time(const parse_ctx *c, const yaml_node_t *v, double *out) {
    const char *s = scalar(v);
    if (!s) return node_error(c, v, "slurm.time", "expected a time limit, got %s", describe(v));
    size_t digits = strspn(s, "0123456789");
    if (*s && !s[digits])
        return node_error(c, v, "slurm.time",
                          "'%s' is ambiguous (Slurm reads minutes, tandem durations seconds); "
                          "write %sm, or Slurm's %s:00",
                          s, s, s);
    td_status st = strpbrk(s, ":-") ? td_slurm_parse_time("slurm.time", s, out)
                                    : td_parse_duration("slurm.time", s, out);
    if (st == TD_OK) return TD_OK;
    td_error_clear();
    return node_error(c, v, "slurm.time",
                      "expected a time limit such as 30:00, 2:00:00, 1-12:00:00, 90m or 2h, "
                      "got '%s'",
                      s);
}

static td_status parse_slurm(const parse_ctx *c, const yaml_node_t *n, td_slurm_options *o) {
    if (n->type != YAML_MAPPING_NODE)
        return node_error(c, n, "slurm", "expected a mapping with %s, got %s", slurm_fields,
                          describe(n));
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        const char *f = scalar(k);
        if (!f) return node_error(c, k, "slurm", "field names must be strings");
        if (!strcmp(f, "partition")) {
            TD_CHECK(get_string(c, v, "slurm.partition", &o->partition));
        } else if (!strcmp(f, "account")) {
            TD_CHECK(get_string(c, v, "slurm.account", &o->account));
        } else if (!strcmp(f, "time")) {
            TD_CHECK(get_slurm_time(c, v, &o->time_limit_s));
        } else if (!strcmp(f, "signal_lead")) {
            const char *s = scalar(v);
            if (!s || td_parse_duration("slurm.signal_lead", s, &o->signal_lead_s) != TD_OK ||
                o->signal_lead_s > TD_SLURM_SIGNAL_LEAD_MAX_S) {
                td_error_clear();
                return node_error(c, v, "slurm.signal_lead",
                                  "expected a duration up to %.0f s (Slurm's limit) such as 60s "
                                  "or 5m, got '%s'",
                                  TD_SLURM_SIGNAL_LEAD_MAX_S, describe(v));
            }
        } else if (!strcmp(f, "sbatch_args")) {
            TD_CHECK(get_string_list(c, v, "slurm.sbatch_args", &o->sbatch_args, &o->nsbatch_args));
        } else if (!strcmp(f, "work_dir")) {
            /* It appears in #SBATCH directives (--output), which cannot be quoted. */
            TD_CHECK(get_string(c, v, "slurm.work_dir", &o->work_dir));
            if (o->work_dir[0] != '/' ||
                strspn(o->work_dir, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghij"
                                    "klmnopqrstuvwxyz0123456789/._+-") != strlen(o->work_dir))
                return node_error(c, v, "slurm.work_dir",
                                  "expected an absolute path on the nodes of letters, digits and "
                                  "/._+- (such as /tmp or a node-local scratch directory), got "
                                  "'%s'",
                                  o->work_dir);
        } else if (!strcmp(f, "link_host")) {
            TD_CHECK(get_string(c, v, "slurm.link_host", &o->link_host));
            if (td_ssh_host_check("slurm.link_host", o->link_host) != TD_OK ||
                strpbrk(o->link_host, "@:") || o->link_host[0] == '-') {
                td_error_clear();
                return node_error(c, v, "slurm.link_host",
                                  "expected a host name or address by which the nodes reach this "
                                  "machine, got '%s'",
                                  o->link_host);
            }
        } else {
            return node_error(c, k, "slurm", "unknown field '%s'; the fields are: %s", f,
                              slurm_fields);
        }
    }
    if (o->link_host && !o->work_dir)
        return node_error(c, n, "slurm.link_host",
                          "is only used without a shared file system; set slurm.work_dir (where "
                          "the nodes keep their copy of the run) or remove link_host");
    if (o->time_limit_s > 0 && o->signal_lead_s > 0 && o->signal_lead_s >= o->time_limit_s)
        return node_error(c, n, "slurm.signal_lead",
                          "%.0f s is not shorter than the time limit (%.0f s): the job would be "
                          "signalled as soon as it starts; lower signal_lead",
                          o->signal_lead_s, o->time_limit_s);
    if (o->time_limit_s > 0 && !o->signal_lead_s &&
        TD_SLURM_SIGNAL_LEAD_DEFAULT_S >= o->time_limit_s)
        return node_error(c, n, "slurm.time",
                          "%.0f s leaves no room for the time-limit signal, which comes %.0f s "
                          "before the limit by default; set a longer time or a shorter "
                          "signal_lead",
                          o->time_limit_s, TD_SLURM_SIGNAL_LEAD_DEFAULT_S);
    return TD_OK;
}

/* The fields of a workflow that later checks look at, where the file has them. */
typedef struct {
    const yaml_node_t *command, *commands, *slurm, *ssh, *aws, *nodes, *secrets;
} workflow_fields;

/* tags: [...] and group: G, the labels every run of the workflow starts with (tandem run --tag
 * and --group add to them), checked as tandem tag checks them. */
static td_status parse_labels(const parse_ctx *c, const char *f, const yaml_node_t *v,
                              td_workflow *w) {
    if (!strcmp(f, "group")) {
        TD_CHECK(get_string(c, v, f, &w->group));
        if (td_label_check("group", w->group) != TD_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", td_error_msg());
            td_error_clear();
            return node_error(c, v, f, "%s", why);
        }
        return TD_OK;
    }
    TD_CHECK(get_string_list(c, v, f, &w->tags, &w->ntags));
    for (size_t i = 0; i < w->ntags; i++)
        if (td_label_check("tag", w->tags[i]) != TD_OK) {
            char why[512];
            snprintf(why, sizeof why, "%s", td_error_msg());
            td_error_clear();
            return node_error(c, v, f, "%s", why);
        }
    if (w->ntags > TD_TAGS_MAX)
        return node_error(c, v, f, "%zu tags; a run has at most %d", w->ntags, TD_TAGS_MAX);
    return TD_OK;
}

/* secrets: environment variable names (exec.h's rule), each once. The values are not in the
 * file: tandem run takes them from its own environment. */
static td_status parse_secrets(const parse_ctx *c, const yaml_node_t *v, td_workflow *w) {
    size_t first = w->nsecrets;
    TD_CHECK(get_string_list(c, v, "secrets", &w->secrets, &w->nsecrets));
    for (size_t i = first; i < w->nsecrets; i++) {
        const char *name = w->secrets[i];
        if (!td_exec_secret_name_ok(name))
            return node_error(c, v, "secrets",
                              "'%s' cannot be a secret: expected the name of an environment "
                              "variable (letters, digits and '_', not starting with a digit), "
                              "and not one tandem sets itself (TANDEM_*, PATH)",
                              name);
        for (size_t j = 0; j < i; j++)
            if (!strcmp(w->secrets[j], name))
                return node_error(c, v, "secrets", "'%s' appears twice", name);
    }
    return TD_OK;
}

/* Why an env: name cannot be set by a workflow (NULL: it can): the variables tandem itself
 * sets for every worker, whose value from env: would be replaced without a word. */
static const char *env_refusal(const char *key) {
    static const struct {
        td_var var;
        const char *why;
    } run_set[] = {
        {TD_VAR_TANDEM_RUN_ID, "tandem run sets it to the run's id"},
        {TD_VAR_TANDEM_RUN_DIR, "tandem run sets it to the run's directory"},
        {TD_VAR_TANDEM_WORK_DIR, "tandem run sets it to the run's working directory"},
        {TD_VAR_TANDEM_PROJECT_DIR, "tandem run sets it to the project directory"},
        {TD_VAR_TANDEM_CHECKPOINT_DIR, "tandem run sets it: use checkpoint_dir: instead"},
        {TD_VAR_TANDEM_CHECKPOINT_URL, "tandem run sets it: use checkpoint_dir: s3://... instead"},
        {TD_VAR_TANDEM_RESUME, "tandem run sets it on a resume: use tandem run --resume RUN"},
        {TD_VAR_TANDEM_METRICS, "the launcher sets one file per rank"},
        {TD_VAR_TANDEM_TOKEN, "a secret tandem makes for each run (never in a file)"},
        {TD_VAR_TANDEM_STORE_ADDR, "the launcher sets it to the job's store"},
        {TD_VAR_TANDEM_STORE_LISTEN_FD, "the launcher's own"},
        {TD_VAR_TANDEM_HEARTBEAT_MS, "the launcher sets it from the stall timeout: set "
                                     "TANDEM_STALL_TIMEOUT_MS instead"},
        {TD_VAR_TANDEM_SYS_METRICS, "the executor sets it"},
        {TD_VAR_TANDEM_RESTART_COUNT, "the launcher sets it for each attempt"},
        {TD_VAR_TANDEM_NODE_RANK, "the launcher sets it for each node"},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(run_set); i++)
        if (!strcmp(key, td_var_name(run_set[i].var))) return run_set[i].why;
    if (!strncmp(key, "TANDEM_PARAM_", 13)) return "tandem run sets it from params: (use params:)";
    /* torchrun's worker variables: the launcher sets each per worker */
    static const td_var launch_set[] = {
        TD_VAR_RANK,          TD_VAR_LOCAL_RANK,          TD_VAR_WORLD_SIZE,
        TD_VAR_LOCAL_WORLD_SIZE, TD_VAR_GROUP_RANK,       TD_VAR_GROUP_WORLD_SIZE,
        TD_VAR_NODE_RANK,     TD_VAR_NUM_NODES,           TD_VAR_ROLE_RANK,
        TD_VAR_ROLE_WORLD_SIZE, TD_VAR_ROLE_NAME,         TD_VAR_MASTER_ADDR,
        TD_VAR_MASTER_PORT,   TD_VAR_TORCHELASTIC_RESTART_COUNT,
        TD_VAR_TORCHELASTIC_MAX_RESTARTS, TD_VAR_TORCHELASTIC_RUN_ID,
        TD_VAR_TORCHELASTIC_USE_AGENT_STORE,
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(launch_set); i++)
        if (!strcmp(key, td_var_name(launch_set[i])))
            return "the launcher sets it for each worker, as torchrun does (nodes:, "
                   "nproc_per_node: and max_restarts: say what it is)";
    return NULL;
}

/* env: each entry is honoured on every executor or refused here with the reason: a name a
 * shell can export (the ssh, aws and Slurm executors set the remote environment through one),
 * not one tandem sets itself. PATH is honoured: its value replaces the workers' PATH, and
 * $PATH (or ${PATH}) in it stands for the PATH they would have had (docs/runs.md). */
static td_status check_env(const parse_ctx *c, const yaml_node_t *v, const td_workflow *w,
                           size_t first) {
    for (size_t i = first; i < w->nenv; i++) {
        const char *key = w->env[i].key;
        bool name_ok = (isalpha((unsigned char)key[0]) || key[0] == '_');
        for (const char *p = key; *p && name_ok; p++)
            name_ok = isalnum((unsigned char)*p) || *p == '_';
        if (!name_ok)
            return node_error(c, v, "env",
                              "'%s' is not an environment variable name a shell can set "
                              "(letters, digits and '_', not starting with a digit); the "
                              "ssh, aws and Slurm executors could not pass it on",
                              key);
        const char *why = env_refusal(key);
        if (why)
            return node_error(c, v, "env", "%s cannot be set here: %s; remove it from env:", key,
                              why);
    }
    return TD_OK;
}

/* One field of a workflow entry (f: its name, k its key's node, v its value's). */
static td_status parse_field(const parse_ctx *c, const yaml_node_t *k, const yaml_node_t *v,
                             const char *f, td_workflow *w, workflow_fields *seen) {
    if (!strcmp(f, "name")) {
        TD_CHECK(get_string(c, v, f, &w->name));
        if (!valid_key(w->name))
            return node_error(c, v, f, "expected letters, digits, '_', '-' or '.', got '%s'",
                              w->name);
    } else if (!strcmp(f, "description")) {
        if (!scalar(v)) return node_error(c, v, f, "expected a string, got %s", describe(v));
    } else if (!strcmp(f, "command")) {
        if (!scalar(v))
            return node_error(c, v, f, "expected a string (use 'commands:' for a list), got %s",
                              describe(v));
        seen->command = v;
    } else if (!strcmp(f, "commands")) {
        if (v->type != YAML_SEQUENCE_NODE)
            return node_error(c, v, f, "expected a list of strings, got %s", describe(v));
        seen->commands = v;
    } else if (!strcmp(f, "setup")) {
        TD_CHECK(get_string_list(c, v, f, &w->setup, &w->nsetup));
    } else if (!strcmp(f, "node_setup")) {
        TD_CHECK(get_string_list(c, v, f, &w->node_setup, &w->nnode_setup));
    } else if (!strcmp(f, "nodes")) {
        TD_CHECK(get_int(c, v, f, 1, &w->nodes));
        seen->nodes = v;
    } else if (!strcmp(f, "nproc_per_node")) {
        /* torchrun's words as tandem launch takes them, counted where the workers run */
        const char *s = scalar(v);
        if (s && (!strcmp(s, "gpu") || !strcmp(s, "auto") || !strcmp(s, "cpu"))) {
            snprintf(w->nproc_spec, sizeof w->nproc_spec, "%s", s);
            w->nproc_per_node = 0;
        } else if (s && strspn(s, "0123456789") != strlen(s)) {
            return node_error(c, v, f,
                              "expected a positive integer, got '%s' (or gpu: one worker per "
                              "visible GPU, cpu: one per core, auto: gpu where a GPU is visible, "
                              "else cpu)",
                              s);
        } else {
            TD_CHECK(get_int(c, v, f, 1, &w->nproc_per_node));
            w->nproc_spec[0] = '\0';
        }
    } else if (!strcmp(f, "max_restarts")) {
        TD_CHECK(get_int(c, v, f, 0, &w->max_restarts));
    } else if (!strcmp(f, "tags") || !strcmp(f, "group")) {
        TD_CHECK(parse_labels(c, f, v, w));
    } else if (!strcmp(f, "env")) {
        size_t first = w->nenv;
        TD_CHECK(get_map(c, v, f, 0, &w->env, &w->nenv));
        TD_CHECK(check_env(c, v, w, first));
    } else if (!strcmp(f, "secrets")) {
        TD_CHECK(parse_secrets(c, v, w));
        seen->secrets = v;
    } else if (!strcmp(f, "params")) {
        TD_CHECK(get_map(c, v, f, 1, &w->params, &w->nparams));
    } else if (!strcmp(f, "artifacts")) {
        TD_CHECK(get_artifacts(c, v, w));
    } else if (!strcmp(f, "checkpoint_dir")) {
        TD_CHECK(get_string(c, v, f, &w->checkpoint_dir));
        if (!strncmp(w->checkpoint_dir, "s3://", 5))
            TD_CHECK(check_s3_url(c, v, f, w->checkpoint_dir));
    } else if (!strcmp(f, "workdir")) {
        TD_CHECK(get_string(c, v, f, &w->workdir));
    } else if (!strcmp(f, "max_duration")) {
        const char *s = scalar(v);
        if (!s || td_parse_duration(f, s, &w->max_duration_s) != TD_OK) {
            td_error_clear();
            return node_error(c, v, f,
                              "expected a duration such as 90s, 30m, 2h or 1h30m, got '%s'",
                              describe(v));
        }
    } else if (!strcmp(f, "executor")) {
        const char *s = scalar(v);
        if (s && !strcmp(s, "local")) {
            free(w->executor);
            w->executor = NULL;
        } else if (s && td_executor_find(s)) {
            TD_CHECK(get_string(c, v, f, &w->executor));
        } else {
            return node_error(c, v, f, "expected local or %s, got '%s'", td_executor_names(),
                              describe(v));
        }
    } else if (!strcmp(f, "slurm")) {
        TD_CHECK(parse_slurm(c, v, &w->slurm));
        seen->slurm = v;
    } else if (!strcmp(f, "ssh")) {
        TD_CHECK(parse_ssh(c, v, &w->ssh));
        seen->ssh = v;
    } else if (!strcmp(f, "aws")) {
        TD_CHECK(parse_aws(c, v, &w->aws));
        seen->aws = v;
    } else {
        return node_error(c, k, f, "unknown field; the fields are: %s", known_fields);
    }
    return TD_OK;
}

/* What the fields must say together: a name, the executor's own section only with it, ssh's
 * hosts matching nodes:, one command form, no empty command. */
static td_status check_workflow(const parse_ctx *c, const yaml_node_t *n, td_workflow *w,
                                const workflow_fields *seen) {
    if (!w->name) return node_error(c, n, "name", "every workflow needs a name");
    if (seen->slurm && (!w->executor || strcmp(w->executor, "slurm")))
        return node_error(c, seen->slurm, "slurm",
                          "workflow '%s' sets slurm: but runs on the %s executor; add "
                          "'executor: slurm' or remove slurm:",
                          w->name, w->executor ? w->executor : "local");
    int on_aws = w->executor && !strcmp(w->executor, "aws");
    if (seen->aws && !on_aws)
        return node_error(c, seen->aws, "aws",
                          "workflow '%s' sets aws: but runs on the %s executor; add "
                          "'executor: aws' or remove aws:",
                          w->name, w->executor ? w->executor : "local");
    if (on_aws && !seen->aws)
        return node_error(c, n, "aws",
                          "workflow '%s' runs on the aws executor but says nothing of its "
                          "instances; add aws: {instance_type: ..., image: ami-..., key_name: "
                          "..., ssh_key: ...} (docs/cloud.md)",
                          w->name);
    int on_ssh = w->executor && !strcmp(w->executor, "ssh");
    if (seen->ssh && !on_ssh)
        return node_error(c, seen->ssh, "ssh",
                          "workflow '%s' sets ssh: but runs on the %s executor; add "
                          "'executor: ssh' or remove ssh:",
                          w->name, w->executor ? w->executor : "local");
    if (on_ssh && !seen->ssh)
        return node_error(c, n, "ssh",
                          "workflow '%s' runs on the ssh executor but names no machines; add "
                          "ssh: {hosts: [host1, host2]} (or hostfile: FILE)",
                          w->name);
    /* One node per host: nodes: is the host count (a hostfile's is known when the run starts,
     * and checked then). */
    if (on_ssh && w->ssh.nhosts) {
        if (seen->nodes && w->nodes != (int)w->ssh.nhosts)
            return node_error(c, seen->nodes, "nodes",
                              "workflow '%s' has nodes: %d but %zu ssh host%s (one node per "
                              "host); drop nodes: or make them agree",
                              w->name, w->nodes, w->ssh.nhosts, w->ssh.nhosts > 1 ? "s" : "");
        w->nodes = (int)w->ssh.nhosts;
    }
    /* A value in the file and a secret from the environment under one name: which one the
     * workers get would be a guess, and a secret's value does not belong in the file. */
    for (size_t i = 0; i < w->nsecrets; i++)
        for (size_t j = 0; j < w->nenv; j++)
            if (!strcmp(w->secrets[i], w->env[j].key))
                return node_error(c, seen->secrets, "secrets",
                                  "workflow '%s' sets %s under env: and names it under secrets:; "
                                  "keep one (a secret's value comes from tandem run's "
                                  "environment, never from the file)",
                                  w->name, w->secrets[i]);
    if (seen->command && seen->commands)
        return node_error(c, seen->commands, "commands",
                          "workflow '%s' has both 'command' and 'commands'; keep one", w->name);
    if (seen->command)
        TD_CHECK(get_string_list(c, seen->command, "command", &w->commands, &w->ncommands));
    if (seen->commands)
        TD_CHECK(get_string_list(c, seen->commands, "commands", &w->commands, &w->ncommands));
    if (!w->ncommands)
        return node_error(c, n, "command", "workflow '%s' has no command (or commands list)",
                          w->name);
    for (size_t i = 0; i < w->ncommands; i++) {
        const char *s = w->commands[i];
        while (isspace((unsigned char)*s)) s++;
        if (!*s)
            return node_error(c, seen->command ? seen->command : seen->commands, "command",
                              "workflow '%s' has an empty command", w->name);
    }
    return TD_OK;
}

static td_status parse_workflow(const parse_ctx *c, const yaml_node_t *n, td_workflow *w) {
    w->nodes = 1;
    w->nproc_per_node = 1;
    w->line = (int)n->start_mark.line + 1;
    if (n->type != YAML_MAPPING_NODE)
        return node_error(c, n, "workflows",
                          "each entry must be a mapping with name and "
                          "command, got %s",
                          describe(n));
    workflow_fields seen = {0};
    for (yaml_node_pair_t *p = n->data.mapping.pairs.start; p < n->data.mapping.pairs.top; p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        yaml_node_t *v = yaml_document_get_node(c->doc, p->value);
        const char *f = scalar(k);
        if (!f) return node_error(c, k, "workflows", "field names must be strings");
        TD_CHECK(parse_field(c, k, v, f, w, &seen));
    }
    return check_workflow(c, n, w, &seen);
}

static td_status parse_doc(const parse_ctx *c, td_workflow_file *wf) {
    yaml_node_t *root = yaml_document_get_root_node(c->doc);
    if (!root)
        return td_error(TD_ERR_FORMAT,
                        "%s:1:1: workflows: the file is empty; it needs a "
                        "'workflows:' list",
                        c->file);
    if (root->type != YAML_MAPPING_NODE)
        return node_error(c, root, "workflows",
                          "the top level must be a mapping with a 'workflows:' list, got %s",
                          describe(root));
    yaml_node_t *list = NULL;
    for (yaml_node_pair_t *p = root->data.mapping.pairs.start; p < root->data.mapping.pairs.top;
         p++) {
        yaml_node_t *k = yaml_document_get_node(c->doc, p->key);
        const char *f = scalar(k);
        if (f && !strcmp(f, "workflows"))
            list = yaml_document_get_node(c->doc, p->value);
        else
            return node_error(c, k, f ? f : "(key)",
                              "unknown top-level field; only 'workflows:' is allowed");
    }
    if (!list) return node_error(c, root, "workflows", "missing the 'workflows:' list");
    if (list->type != YAML_SEQUENCE_NODE)
        return node_error(c, list, "workflows", "expected a list of workflows, got %s",
                          describe(list));
    size_t n = (size_t)(list->data.sequence.items.top - list->data.sequence.items.start);
    wf->items = td_xcalloc(n ? n : 1, sizeof *wf->items);
    for (size_t i = 0; i < n; i++) {
        yaml_node_t *item = yaml_document_get_node(c->doc, list->data.sequence.items.start[i]);
        wf->count = i + 1;
        wf->items[i].file = td_xstrdup(c->file);
        TD_CHECK(parse_workflow(c, item, &wf->items[i]));
        for (size_t j = 0; j < i; j++)
            if (!strcmp(wf->items[j].name, wf->items[i].name))
                return node_error(c, item, "name",
                                  "workflow '%s' is defined twice (first at line %d)",
                                  wf->items[i].name, wf->items[j].line);
    }
    return TD_OK;
}

/* A workflow file nests four levels deep (workflows: a list of mappings whose values are
 * lists or mappings). libyaml's document loader takes time quadratic in the nesting depth
 * (issue 8: 100,000 brackets in a model spec took 46 s), so, as for model specs (src/nn/spec.c),
 * a pass over the events first refuses anything deeper than this, in time linear in the bytes
 * read before the refusal. Syntax errors are left to the loader, which reports them. */
#define WORKFLOW_MAX_DEPTH 32

static td_status check_depth(const char *text, size_t nbytes, const char *name) {
    yaml_parser_t parser;
    yaml_event_t ev;
    td_status st = TD_OK;
    int depth = 0;
    if (!yaml_parser_initialize(&parser)) return td_error(TD_ERR_NOMEM, "libyaml init failed");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, nbytes);
    for (;;) {
        if (!yaml_parser_parse(&parser, &ev)) break;
        yaml_event_type_t type = ev.type;
        if (type == YAML_SEQUENCE_START_EVENT || type == YAML_MAPPING_START_EVENT) {
            if (++depth > WORKFLOW_MAX_DEPTH) {
                st = td_error(TD_ERR_FORMAT,
                              "%s:%zu:%zu: nested more than %d levels deep; a workflow file "
                              "needs 4 (workflows: a list of mappings of lists and mappings)",
                              name, ev.start_mark.line + 1, ev.start_mark.column + 1,
                              WORKFLOW_MAX_DEPTH);
                yaml_event_delete(&ev);
                break;
            }
        } else if (type == YAML_SEQUENCE_END_EVENT || type == YAML_MAPPING_END_EVENT) {
            depth--;
        }
        yaml_event_delete(&ev);
        if (type == YAML_STREAM_END_EVENT) break;
    }
    yaml_parser_delete(&parser);
    return st;
}

td_status td_workflow_file_parse(const char *text, size_t nbytes, const char *name,
                                 td_workflow_file **out) {
    *out = NULL;
    yaml_parser_t parser;
    yaml_document_t doc;
    td_status st = TD_OK;
    TD_CHECK(check_depth(text, nbytes, name));
    if (!yaml_parser_initialize(&parser)) return td_error(TD_ERR_NOMEM, "libyaml init failed");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, nbytes);
    if (!yaml_parser_load(&parser, &doc)) {
        st = td_error(TD_ERR_FORMAT, "%s:%zu:%zu: invalid YAML: %s%s%s", name,
                      parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                      parser.problem ? parser.problem : "syntax error", parser.context ? " " : "",
                      parser.context ? parser.context : "");
        yaml_parser_delete(&parser);
        return st;
    }
    td_workflow_file *wf = td_xcalloc(1, sizeof *wf);
    wf->path = td_xstrdup(name);
    parse_ctx c = {name, &doc};
    st = parse_doc(&c, wf);
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    if (st != TD_OK) {
        td_workflow_file_free(wf);
        return st;
    }
    *out = wf;
    return TD_OK;
}

td_status td_workflow_file_load(const char *path, td_workflow_file **out) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return td_error_errno(TD_ERR_NOTFOUND,
                              "cannot open workflow file %s (create it, or pass -f FILE)", path);
    char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        if (n + 65536 > cap) {
            cap = cap ? 2 * cap : 65536;
            buf = td_xrealloc(buf, cap);
        }
        size_t k = fread(buf + n, 1, cap - n, f);
        n += k;
        if (k == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    td_status st = err ? td_error(TD_ERR_IO, "error reading %s", path)
                       : td_workflow_file_parse(buf, n, path, out);
    free(buf);
    return st;
}

td_status td_workflow_find(const td_workflow_file *wf, const char *name, const td_workflow **out) {
    *out = NULL;
    for (size_t i = 0; i < wf->count; i++)
        if (!strcmp(wf->items[i].name, name)) {
            *out = &wf->items[i];
            return TD_OK;
        }
    char list[1024] = "";
    size_t used = 0;
    for (size_t i = 0; i < wf->count && used < sizeof list; i++)
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s", i ? ", " : "",
                                 wf->items[i].name);
    return td_error(TD_ERR_NOTFOUND, "no workflow named '%s' in %s; known workflows: %s", name,
                    wf->path, wf->count ? list : "(none)");
}

static char **copy_strs(char **src, size_t n) {
    if (!n) return NULL;
    char **out = td_xcalloc(n, sizeof *out);
    for (size_t i = 0; i < n; i++) out[i] = td_xstrdup(src[i]);
    return out;
}

static td_kv *copy_kvs(const td_kv *src, size_t n) {
    if (!n) return NULL;
    td_kv *out = td_xcalloc(n, sizeof *out);
    for (size_t i = 0; i < n; i++) {
        out[i].key = td_xstrdup(src[i].key);
        out[i].value = td_xstrdup(src[i].value);
    }
    return out;
}

td_workflow *td_workflow_copy(const td_workflow *w) {
    td_workflow *c = td_xcalloc(1, sizeof *c);
    *c = *w;
    c->name = w->name ? td_xstrdup(w->name) : NULL;
    c->commands = copy_strs(w->commands, w->ncommands);
    c->setup = copy_strs(w->setup, w->nsetup);
    c->node_setup = copy_strs(w->node_setup, w->nnode_setup);
    c->env = copy_kvs(w->env, w->nenv);
    c->secrets = copy_strs(w->secrets, w->nsecrets);
    c->file = w->file ? td_xstrdup(w->file) : NULL;
    c->params = copy_kvs(w->params, w->nparams);
    c->artifacts = copy_strs(w->artifacts, w->nartifacts);
    c->artifacts_to = w->artifacts_to ? td_xstrdup(w->artifacts_to) : NULL;
    c->checkpoint_dir = w->checkpoint_dir ? td_xstrdup(w->checkpoint_dir) : NULL;
    c->tags = copy_strs(w->tags, w->ntags);
    c->group = w->group ? td_xstrdup(w->group) : NULL;
    c->workdir = w->workdir ? td_xstrdup(w->workdir) : NULL;
    c->executor = w->executor ? td_xstrdup(w->executor) : NULL;
    td_slurm_options_copy(&c->slurm, &w->slurm);
    td_ssh_options_copy(&c->ssh, &w->ssh);
    td_aws_options_copy(&c->aws, &w->aws);
    return c;
}

td_status td_workflow_set_param(td_workflow *w, const char *assignment) {
    const char *eq = strchr(assignment, '=');
    if (!eq || eq == assignment)
        return td_error(TD_ERR_USAGE, "--param %s: expected KEY=VALUE, e.g. --param lr=0.01",
                        assignment);
    char *key = td_xasprintf("%.*s", (int)(eq - assignment), assignment);
    if (!valid_key(key)) {
        td_status st = td_error(TD_ERR_USAGE,
                                "--param %s: the name '%s' may hold only letters, digits, '_', "
                                "'-' and '.'",
                                assignment, key);
        free(key);
        return st;
    }
    for (size_t i = 0; i < w->nparams; i++)
        if (!strcmp(w->params[i].key, key)) {
            free(w->params[i].value);
            w->params[i].value = td_xstrdup(eq + 1);
            free(key);
            return TD_OK;
        }
    w->params = td_xrealloc(w->params, (w->nparams + 1) * sizeof *w->params);
    w->params[w->nparams].key = key;
    w->params[w->nparams].value = td_xstrdup(eq + 1);
    w->nparams++;
    return TD_OK;
}

static void buf_add(char **buf, size_t *len, size_t *cap, const char *s, size_t n) {
    if (*len + n + 1 > *cap) {
        *cap = (*len + n + 1) * 2;
        *buf = td_xrealloc(*buf, *cap);
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = '\0';
}

static void buf_add_quoted(char **buf, size_t *len, size_t *cap, const char *s) {
    buf_add(buf, len, cap, "'", 1);
    for (; *s; s++) {
        if (*s == '\'')
            buf_add(buf, len, cap, "'\\''", 4);
        else
            buf_add(buf, len, cap, s, 1);
    }
    buf_add(buf, len, cap, "'", 1);
}

td_status td_workflow_script(const td_workflow *w, char **out) {
    *out = NULL;
    char *buf = NULL;
    size_t len = 0, cap = 0;
    char *used = td_xcalloc(w->nparams ? w->nparams : 1, 1);
    buf_add(&buf, &len, &cap, "", 0);
    /* set -e: a failing command ends the sequence with its exit code. */
    if (w->ncommands > 1) buf_add(&buf, &len, &cap, "set -e\n", 7);
    for (size_t c = 0; c < w->ncommands; c++) {
        const char *p = w->commands[c];
        while (*p) {
            const char *open = strstr(p, "${{");
            if (!open) {
                buf_add(&buf, &len, &cap, p, strlen(p));
                break;
            }
            buf_add(&buf, &len, &cap, p, (size_t)(open - p));
            const char *close = strstr(open, "}}");
            const char *q = open + 3;
            while (*q == ' ') q++;
            if (!close || strncmp(q, "params.", 7)) {
                td_status st = td_error(TD_ERR_FORMAT,
                                        "workflow '%s': command: cannot read '%.40s'; the form "
                                        "is ${{ params.NAME }}",
                                        w->name, open);
                free(buf);
                free(used);
                return st;
            }
            q += 7;
            const char *qe = q;
            while (qe < close && *qe != ' ') qe++;
            size_t k;
            for (k = 0; k < w->nparams; k++)
                if (strlen(w->params[k].key) == (size_t)(qe - q) &&
                    !strncmp(w->params[k].key, q, (size_t)(qe - q)))
                    break;
            if (k == w->nparams) {
                td_status st = td_error(TD_ERR_FORMAT,
                                        "workflow '%s': command uses ${{ params.%.*s }} but "
                                        "there is no such param; add it under params: or pass "
                                        "--param %.*s=VALUE",
                                        w->name, (int)(qe - q), q, (int)(qe - q), q);
                free(buf);
                free(used);
                return st;
            }
            used[k] = 1;
            buf_add(&buf, &len, &cap, w->params[k].value, strlen(w->params[k].value));
            p = close + 2;
        }
        /* strip trailing newlines/spaces of block scalars so the appended params stay on the
         * command's line */
        while (len > 0 && (buf[len - 1] == '\n' || buf[len - 1] == ' ')) buf[--len] = '\0';
        if (c + 1 == w->ncommands)
            for (size_t k = 0; k < w->nparams; k++) {
                if (used[k]) continue;
                buf_add(&buf, &len, &cap, " --", 3);
                buf_add(&buf, &len, &cap, w->params[k].key, strlen(w->params[k].key));
                buf_add(&buf, &len, &cap, " ", 1);
                buf_add_quoted(&buf, &len, &cap, w->params[k].value);
            }
        if (c + 1 < w->ncommands) buf_add(&buf, &len, &cap, "\n", 1);
    }
    free(used);
    *out = buf;
    return TD_OK;
}

char *td_workflow_params_json(const td_workflow *w) {
    json_t *obj = json_object();
    for (size_t i = 0; i < w->nparams; i++) {
        const char *v = w->params[i].value;
        char *end = NULL;
        errno = 0;
        long long iv = strtoll(v, &end, 10);
        json_t *jv;
        if (*v && !*end && !errno)
            jv = json_integer(iv);
        else {
            errno = 0;
            double dv = strtod(v, &end);
            if (*v && !*end && !errno && isfinite(dv))
                jv = json_real(dv);
            else
                jv = json_string(v);
        }
        json_object_set_new(obj, w->params[i].key, jv);
    }
    char *s = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(obj);
    char *out = td_xstrdup(s ? s : "{}");
    free(s);
    return out;
}

/* ---- executor settings outside a workflow file (tandem run --profile FILE, its flags) ---- */
static const char *const settings_fields =
    "executor, nodes, nproc_per_node, slurm, ssh, aws, env, secrets, node_setup, checkpoint_dir, "
    "artifacts, max_restarts, max_duration";

static bool is_settings_field(const char *f) {
    static const char *const names[] = {"executor",     "nodes",          "nproc_per_node",
                                        "slurm",        "ssh",            "aws",
                                        "env",          "secrets",        "node_setup",
                                        "checkpoint_dir", "artifacts",    "max_restarts",
                                        "max_duration"};
    for (size_t i = 0; i < TD_ARRAY_LEN(names); i++)
        if (!strcmp(f, names[i])) return true;
    return false;
}

static void free_strs(char ***v, size_t *n) {
    for (size_t i = 0; i < *n; i++) free((*v)[i]);
    free(*v);
    *v = NULL;
    *n = 0;
}

td_status td_workflow_apply_settings(td_workflow *w, const char *text, size_t nbytes,
                                     const char *name) {
    TD_CHECK(check_depth(text, nbytes, name));
    yaml_parser_t parser;
    yaml_document_t doc;
    if (!yaml_parser_initialize(&parser)) return td_error(TD_ERR_NOMEM, "libyaml init failed");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, nbytes);
    if (!yaml_parser_load(&parser, &doc)) {
        td_status st = td_error(TD_ERR_FORMAT, "%s:%zu:%zu: invalid YAML: %s", name,
                                parser.problem_mark.line + 1, parser.problem_mark.column + 1,
                                parser.problem ? parser.problem : "syntax error");
        yaml_parser_delete(&parser);
        return st;
    }
    parse_ctx c = {name, &doc};
    td_status st = TD_OK;
    yaml_node_t *root = yaml_document_get_root_node(&doc);
    if (root && root->type != YAML_MAPPING_NODE)
        st = node_error(&c, root, "settings", "expected a mapping with %s, got %s",
                        settings_fields, describe(root));
    for (yaml_node_pair_t *p = root && st == TD_OK ? root->data.mapping.pairs.start : NULL;
         p && p < root->data.mapping.pairs.top && st == TD_OK; p++) {
        yaml_node_t *k = yaml_document_get_node(&doc, p->key);
        yaml_node_t *v = yaml_document_get_node(&doc, p->value);
        const char *f = scalar(k);
        if (!f || !is_settings_field(f)) {
            st = node_error(&c, k, f ? f : "settings",
                            "not an executor setting; a profile holds: %s (the command and "
                            "the rest come from tandem run's own flags)",
                            settings_fields);
            break;
        }
        /* a list given again replaces the earlier one */
        if (!strcmp(f, "node_setup")) free_strs(&w->node_setup, &w->nnode_setup);
        if (!strcmp(f, "artifacts")) free_strs(&w->artifacts, &w->nartifacts);
        if (!strcmp(f, "secrets")) free_strs(&w->secrets, &w->nsecrets);
        workflow_fields seen = {0};
        st = parse_field(&c, k, v, f, w, &seen);
    }
    yaml_document_delete(&doc);
    yaml_parser_delete(&parser);
    return st;
}

td_status td_workflow_check(td_workflow *w, const char *name) {
    const char *ex = w->executor ? w->executor : "local";
    if (!strcmp(ex, "ssh")) {
        if (!w->ssh.nhosts && !w->ssh.hostfile)
            return td_error(TD_ERR_USAGE,
                            "%s: the ssh executor needs its machines: ssh: {hosts: [a, b]} (or "
                            "hostfile: FILE), or tandem run --host HOST (repeatable)",
                            name);
        if (w->ssh.nhosts && w->ssh.hostfile)
            return td_error(TD_ERR_USAGE, "%s: ssh: give hosts or hostfile, not both", name);
        if (w->ssh.nhosts) {
            if (w->nodes > 1 && w->nodes != (int)w->ssh.nhosts)
                return td_error(TD_ERR_USAGE,
                                "%s: %d nodes but %zu ssh host%s (one node per host); make "
                                "them agree",
                                name, w->nodes, w->ssh.nhosts, w->ssh.nhosts > 1 ? "s" : "");
            w->nodes = (int)w->ssh.nhosts;
        }
    } else if (w->ssh.nhosts || w->ssh.hostfile) {
        return td_error(TD_ERR_USAGE,
                        "%s: ssh machines are given but the run is on the %s executor; add "
                        "executor: ssh (tandem run --executor ssh)",
                        name, ex);
    }
    if (!strcmp(ex, "aws") &&
        ((!w->aws.ninstance_types && !w->aws.resources.set) || !w->aws.image || !w->aws.key_name))
        return td_error(TD_ERR_USAGE,
                        "%s: the aws executor needs instance_type, image and key_name (and "
                        "ssh_key): an aws: section in --profile FILE, or --instance-type, "
                        "--image, --key-name, --ssh-key (docs/cloud.md)",
                        name);
    if (strcmp(ex, "aws") && w->aws.ninstance_types)
        return td_error(TD_ERR_USAGE,
                        "%s: aws settings are given but the run is on the %s executor; add "
                        "executor: aws (tandem run --executor aws)",
                        name, ex);
    if (strcmp(ex, "slurm") && (w->slurm.partition || w->slurm.time_limit_s > 0 ||
                                w->slurm.account || w->slurm.nsbatch_args))
        return td_error(TD_ERR_USAGE,
                        "%s: slurm settings are given but the run is on the %s executor; add "
                        "executor: slurm (tandem run --executor slurm)",
                        name, ex);
    for (size_t i = 0; i < w->nsecrets; i++)
        for (size_t j = 0; j < w->nenv; j++)
            if (!strcmp(w->secrets[i], w->env[j].key))
                return td_error(TD_ERR_USAGE,
                                "%s: %s is both under env: and secrets:; keep one (a secret's "
                                "value comes from tandem run's environment)",
                                name, w->secrets[i]);
    return TD_OK;
}
