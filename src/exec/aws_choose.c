/* `resources:` of an aws workflow: the cheapest instance type of the region that has what the
 * job needs (docs/cloud.md, "Machines by what the job needs"). The catalog is EC2's own
 * (DescribeInstanceTypes: vCPUs, memory, GPUs, their model and memory); the prices are the ones
 * the run's cost uses (prices.c and aws.prices for on demand, DescribeSpotPriceHistory for
 * spot), so the choice and the bill agree. Only types with an on-demand price (tandem's table or
 * aws.prices) are ranked: the cost of a type tandem cannot price is unknown, and a spot price
 * asked of every type that fits would be hundreds of calls. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/utsname.h>

#include "exec/aws_internal.h"
#include "exec/internal.h"

typedef struct {
    const td_ec2_type *t;
    double usd;
    char source[200];
    char zone[48]; /* spot: its cheapest allowed zone; "" on demand (any zone, one price) */
} candidate;

static int by_price(const void *a, const void *b) {
    const candidate *x = a, *y = b;
    if (x->usd != y->usd) return x->usd < y->usd ? -1 : 1;
    return strcmp(x->t->name, y->t->name);
}

/* How much of the request t has: the sum over what is asked of have/need, each at most 1; the
 * closest types to an impossible request are those with the most. */
static double nearness(const td_aws_options *o, const td_ec2_type *t) {
    double s = 0;
#define PART(have, need) ((need) > 0 ? ((have) >= (need) ? 1.0 : (double)(have) / (need)) : 0)
    s += PART(t->vcpus, o->resources.cpu);
    s += PART(t->memory_gib, o->resources.memory_gib);
    s += PART(t->gpus, o->resources.gpu);
    s += PART(t->gpu_memory_gib, o->resources.gpu_memory_gib);
#undef PART
    if (o->resources.gpu_model) s += !strcasecmp(t->gpu_model, o->resources.gpu_model);
    return s;
}

/* The architecture a type must have: resources.arch (x86_64 by default, arm64, any), narrowed
 * to the shipped binary's own when tandem ships itself (no aws.tandem: an x86-64 binary cannot
 * run on an arm64 instance). */
static bool usable(const td_ec2_type *t, const char *arch) {
    return !strcmp(arch, "any") || !strcmp(t->arch, arch);
}

static bool zone_allowed(const td_aws_options *o, const char *zone) {
    if (!o->nzones) return true;
    for (size_t i = 0; i < o->nzones; i++)
        if (!strcmp(o->zones[i], zone)) return true;
    return false;
}

static int by_usd(const void *a, const void *b) {
    const td_ec2_zone_price *x = a, *y = b;
    if (x->usd != y->usd) return x->usd < y->usd ? -1 : 1;
    return strcmp(x->zone, y->zone);
}

td_status td__aws_rank_zones(td_aws_t *aws, const char *type, const td_aws_options *o,
                             char ***zones_out, size_t *nzones_out, double *usd_out,
                             char *source, size_t source_nbytes) {
    *zones_out = NULL;
    *nzones_out = 0;
    *usd_out = 0;
    td_ec2_zone_price *p = NULL;
    size_t n = 0, k = 0;
    TD_CHECK(td_ec2_spot_prices(aws, type, &p, &n));
    for (size_t i = 0; i < n; i++)
        if (zone_allowed(o, p[i].zone)) p[k++] = p[i];
    if (!k) {
        free(p);
        return td_error(TD_ERR_NOTFOUND, "no spot price for %s in the zones aws.zones allows",
                        type);
    }
    qsort(p, k, sizeof *p, by_usd);
    *zones_out = td_xcalloc(k, sizeof **zones_out);
    for (size_t i = 0; i < k; i++) (*zones_out)[i] = td_xstrdup(p[i].zone);
    *nzones_out = k;
    *usd_out = p[0].usd;
    snprintf(source, source_nbytes, "spot price of %s at %s", p[0].zone, p[0].when);
    free(p);
    return TD_OK;
}

const char *td__aws_wanted_arch(const td_aws_options *o, const char *ship_arch, char *why,
                                size_t nbytes) {
    const char *arch = o->resources.arch ? o->resources.arch : "x86_64";
    why[0] = '\0';
    if (!ship_arch) return arch;
    const char *mine = !strcmp(ship_arch, "aarch64") ? "arm64" : ship_arch;
    if (!strcmp(arch, "any")) {
        snprintf(why, nbytes, " (arch: any, narrowed to %s: this tandem is an %s binary and ships "
                              "itself to the instances)", mine, ship_arch);
        return !strcmp(mine, "arm64") ? "arm64" : "x86_64";
    }
    return arch;
}

/* The workers spec (gpu|cpu|auto) counts on t by tandem launch's rule (td_launch_nproc_resolve)
 * applied to what the instance will have: its GPUs, or its vCPUs (the CPUs its kernel shows,
 * which is what the rule counts there); 0 for gpu on a type without GPUs. */
static int type_count(const td_ec2_type *t, const char *spec) {
    if (!strcmp(spec, "gpu")) return t->gpus > 0 ? t->gpus : 0;
    if (strcmp(spec, "cpu") && t->gpus > 0) return t->gpus;
    return t->vcpus > 0 ? t->vcpus : 1;
}

/* What t lacks of the request, in words ("" when it has it all); the count of what it lacks. */
static int lacks(const td_aws_options *o, const td_ec2_type *t, char *out, size_t nbytes) {
    td__buf b = {0};
    int n = 0;
    if (t->vcpus < o->resources.cpu)
        n++, td__buf_addf(&b, "%s%d vCPU", n > 1 ? ", " : "", t->vcpus);
    if (t->memory_gib + 1e-9 < o->resources.memory_gib)
        n++, td__buf_addf(&b, "%s%.1f GiB", n > 1 ? ", " : "", t->memory_gib);
    if (t->gpus < o->resources.gpu)
        n++, td__buf_addf(&b, "%s%d GPU%s", n > 1 ? ", " : "", t->gpus, t->gpus == 1 ? "" : "s");
    if (o->resources.gpu_model && strcasecmp(t->gpu_model, o->resources.gpu_model))
        n++, td__buf_addf(&b, "%s%s", n > 1 ? ", " : "", t->gpu_model[0] ? t->gpu_model : "no GPU");
    if (t->gpu_memory_gib + 1e-9 < o->resources.gpu_memory_gib)
        n++, td__buf_addf(&b, "%s%.0f GiB per GPU", n > 1 ? ", " : "", t->gpu_memory_gib);
    if (o->resources.nproc_spec[0]) { /* the run's one count per node (td_aws_count_nproc) */
        int count = type_count(t, o->resources.nproc_spec);
        if (count < 1)
            n++, td__buf_addf(&b, "%sno GPU for nproc_per_node: gpu", n > 1 ? ", " : "");
        else if (o->resources.nproc_count > 0 && count != o->resources.nproc_count)
            n++, td__buf_addf(&b, "%s%d workers for nproc_per_node: %s, not %d", n > 1 ? ", " : "",
                              count, o->resources.nproc_spec, o->resources.nproc_count);
    }
    snprintf(out, nbytes, "%s", b.s ? b.s : "");
    free(b.s);
    return n;
}

void td__aws_resources_text(const td_aws_options *o, char *out, size_t nbytes) {
    td__buf b = {0};
    td__buf_addf(&b, "{");
    if (o->resources.cpu > 0) td__buf_addf(&b, "cpu: %g, ", o->resources.cpu);
    if (o->resources.memory_gib > 0) td__buf_addf(&b, "memory: %g, ", o->resources.memory_gib);
    if (o->resources.gpu > 0) td__buf_addf(&b, "gpu: %d, ", o->resources.gpu);
    if (o->resources.gpu_model) td__buf_addf(&b, "gpu_model: %s, ", o->resources.gpu_model);
    if (o->resources.gpu_memory_gib > 0)
        td__buf_addf(&b, "gpu_memory: %g, ", o->resources.gpu_memory_gib);
    if (o->resources.disk_gib > 0) td__buf_addf(&b, "disk: %d, ", o->resources.disk_gib);
    if (o->resources.arch) td__buf_addf(&b, "arch: %s, ", o->resources.arch);
    if (b.len > 2) b.len -= 2;
    td__buf_addf(&b, "}");
    if (o->resources.nproc_spec[0] && o->resources.nproc_count > 0)
        td__buf_addf(&b, " and nproc_per_node: %s = %d", o->resources.nproc_spec,
                     o->resources.nproc_count);
    else if (!strcmp(o->resources.nproc_spec, "gpu"))
        td__buf_addf(&b, " and nproc_per_node: gpu");
    snprintf(out, nbytes, "%.*s", (int)b.len, b.s);
    free(b.s);
}

static void describe_type(const td_ec2_type *t, td__buf *b) {
    td__buf_addf(b, "%s (%d vCPU, %.4g GiB", t->name, t->vcpus, t->memory_gib);
    if (t->gpus) td__buf_addf(b, ", %d x %s %.0f GiB", t->gpus, t->gpu_model, t->gpu_memory_gib);
    td__buf_addf(b, ")");
}

td_status td__aws_choose(td_aws_t *aws, const char *region, const td_aws_options *o, int spot,
                         const char *ship_arch, char ***types_out, size_t *ntypes_out,
                         char ***zones_out, size_t *nzones_out, char **why_out) {
    *types_out = NULL;
    *ntypes_out = 0;
    *zones_out = NULL;
    *nzones_out = 0;
    *why_out = NULL;
    char req[256];
    td__aws_resources_text(o, req, sizeof req);
    char narrowed[200];
    const char *arch = td__aws_wanted_arch(o, ship_arch, narrowed, sizeof narrowed);
    const char *ship_ec2 = ship_arch && !strcmp(ship_arch, "aarch64") ? "arm64" : ship_arch;
    if (ship_arch && strcmp(arch, ship_ec2))
        return td_error(TD_ERR_INVALID,
                        "aws.resources asks for %s instances, but this tandem is an %s binary "
                        "and ships itself to the instances (no aws.tandem): it cannot run on %s; "
                        "use an image that has tandem built for %s (aws.image, and aws.tandem: "
                        "its path there), or ask for arch: %s",
                        arch, ship_arch, arch, arch, ship_ec2);
    td_ec2_type *all = NULL;
    size_t nall = 0;
    TD_CHECK(td_ec2_describe_instance_types(aws, &all, &nall));
    candidate *fit = td_xcalloc(nall + 1, sizeof *fit);
    size_t nfit = 0, nunpriced = 0;
    char unpriced[400] = "";
    for (size_t i = 0; i < nall; i++) {
        char what[200];
        if (!usable(&all[i], arch) || lacks(o, &all[i], what, sizeof what)) continue;
        candidate *c = &fit[nfit];
        c->t = &all[i];
        if (td_aws_on_demand_price(region, all[i].name, o->prices, &c->usd, c->source,
                                   sizeof c->source) != TD_OK) {
            td_error_clear();
            if (nunpriced++ < 5)
                snprintf(unpriced + strlen(unpriced), sizeof unpriced - strlen(unpriced), "%s%s",
                         nunpriced > 1 ? ", " : "", all[i].name);
            continue;
        }
        if (spot) { /* its cheapest allowed zone: spot prices differ from zone to zone */
            char **zones = NULL;
            size_t nz = 0;
            double usd = 0;
            if (td__aws_rank_zones(aws, all[i].name, o, &zones, &nz, &usd, c->source,
                                   sizeof c->source) != TD_OK) {
                td_error_clear(); /* no spot market for it in an allowed zone: not a candidate */
                continue;
            }
            c->usd = usd;
            snprintf(c->zone, sizeof c->zone, "%s", zones[0]);
            for (size_t z = 0; z < nz; z++) free(zones[z]);
            free(zones);
        }
        nfit++;
    }
    td_status st = TD_OK;
    td__buf why = {0};
    if (!nfit) {
        /* the closest: those that have the most of what is asked */
        td__buf_addf(&why, "no %s instance type in %s%s %s %s", arch, region,
                     o->nzones ? " (aws.zones)" : "", nunpriced ? "with a price has" : "has",
                     req);
        if (nunpriced)
            td__buf_addf(&why, " (%zu that fit have no price: %s%s; add them to aws.prices as "
                               "'%s TYPE USD_PER_HOUR')",
                         nunpriced, unpriced, nunpriced > 5 ? ", ..." : "", region);
        bool *shown = td_xcalloc(nall + 1, sizeof *shown);
        for (int k = 0; k < 3; k++) {
            size_t best = nall;
            for (size_t i = 0; i < nall; i++)
                if (usable(&all[i], arch) && !shown[i] &&
                    (best == nall || nearness(o, &all[i]) > nearness(o, &all[best])))
                    best = i;
            if (best == nall) break;
            shown[best] = true;
            char what[200];
            lacks(o, &all[best], what, sizeof what);
            td__buf_addf(&why, "%s", k ? "; " : "; the closest: ");
            describe_type(&all[best], &why);
            td__buf_addf(&why, "%s%s", what[0] ? " has " : "", what);
        }
        free(shown);
        td__buf_addf(&why, "; ask for less, or name an instance_type");
        st = td_error(TD_ERR_NOTFOUND, "aws.resources: %s", why.s);
        free(why.s);
        why.s = NULL;
    } else {
        qsort(fit, nfit, sizeof *fit, by_price);
        size_t keep = nfit < 3 ? nfit : 3; /* the next ones are tried on capacity refusals */
        *types_out = td_xcalloc(keep, sizeof **types_out);
        for (size_t i = 0; i < keep; i++) (*types_out)[i] = td_xstrdup(fit[i].t->name);
        *ntypes_out = keep;
        td__buf_addf(&why, "chose ");
        describe_type(fit[0].t, &why);
        td__buf_addf(&why, " for %s: $%.5f/h %s%s%s (%s), the cheapest of %zu type%s that fit%s%s",
                     req, fit[0].usd, spot ? "spot" : "on-demand", fit[0].zone[0] ? " in " : "",
                     fit[0].zone, fit[0].source, nfit, nfit == 1 ? "" : "s",
                     nunpriced ? " and have a price" : "", narrowed);
        if (spot) { /* the chosen type's allowed zones, cheapest first: tried in turn */
            double usd = 0;
            char src[200];
            if (td__aws_rank_zones(aws, fit[0].t->name, o, zones_out, nzones_out, &usd, src,
                                   sizeof src) != TD_OK)
                td_error_clear();
        } else if (o->nzones) {
            *zones_out = td_xcalloc(o->nzones, sizeof **zones_out);
            for (size_t z = 0; z < o->nzones; z++) (*zones_out)[z] = td_xstrdup(o->zones[z]);
            *nzones_out = o->nzones;
        }
        if (*nzones_out > 1) {
            td__buf_addf(&why, "; zones in turn:");
            for (size_t z = 0; z < *nzones_out; z++)
                td__buf_addf(&why, " %s", (*zones_out)[z]);
        }
        for (size_t i = 1; i < keep; i++) {
            td__buf_addf(&why, "%s", i == 1 ? "; then, on capacity refusals: " : ", ");
            td__buf_addf(&why, "%s $%.5f/h", fit[i].t->name, fit[i].usd);
        }
        *why_out = why.s;
    }
    free(fit);
    free(all);
    return st;
}

/* ---- nproc_per_node: gpu|cpu|auto from the instance type ---- */
td_status td__aws_type_nproc(const td_ec2_type *t, const char *spec, int *out, char *why,
                             size_t nbytes) {
    *out = 0;
    if (why && nbytes) why[0] = '\0';
    bool cpu = !strcmp(spec, "cpu");
    if (!cpu && strcmp(spec, "gpu") && strcmp(spec, "auto"))
        return td_error(TD_ERR_USAGE, "nproc_per_node: '%s' is not gpu, cpu or auto", spec);
    *out = type_count(t, spec);
    if (!*out)
        return td_error(TD_ERR_USAGE,
                        "nproc_per_node: gpu counts the GPUs of the instance type, and %s has "
                        "none (%d vCPU, %.4g GiB, no GPU in EC2's catalog); give a number of "
                        "workers, cpu (one per vCPU) or auto, or a type with GPUs "
                        "(aws.instance_type: g5.xlarge, or aws.resources: {gpu: 1})",
                        t->name, t->vcpus, t->memory_gib);
    if (why && !cpu && t->gpus > 0)
        snprintf(why, nbytes, "one per GPU of %s (%d x %s)", t->name, t->gpus,
                 t->gpu_model[0] ? t->gpu_model : "GPU");
    else if (why)
        snprintf(why, nbytes, "one per vCPU of %s (%d vCPU%s)", t->name, t->vcpus,
                 t->gpus ? "" : ", no GPU");
    return TD_OK;
}

static const td_ec2_type *find_type(const td_ec2_type *all, size_t n, const char *name) {
    for (size_t i = 0; i < n; i++)
        if (!strcmp(all[i].name, name)) return &all[i];
    return NULL;
}

td_status td_aws_count_nproc(td_aws_options *o, const char *spec, int *out, char *note,
                             size_t nbytes) {
    *out = 0;
    if (note && nbytes) note[0] = '\0';
    if (!o->ninstance_types && !o->resources.set)
        return td_error(TD_ERR_USAGE, "nproc_per_node: %s counts from the instance type, and "
                                      "the workflow names none (aws.instance_type or "
                                      "aws.resources)",
                        spec);
    td_aws_opts ao = {.profile = o->profile, .region = o->region};
    td_aws_t *aws = NULL;
    if (td_aws_new(&ao, &aws) != TD_OK) {
        char why[600];
        snprintf(why, sizeof why, "%s", td_error_msg());
        td_error_clear();
        return td_error(TD_ERR_AUTH,
                        "nproc_per_node: %s counts the GPUs or vCPUs of the instance type from "
                        "EC2's catalog (DescribeInstanceTypes), which needs AWS: %s; give a "
                        "number of workers per node",
                        spec, why);
    }
    const char *region = td_aws_region(aws);
    td_status st = TD_OK;
    char why[300] = "", from[400] = "";
    if (o->resources.set) {
        /* the type the run would choose now, among those the word counts on; the run's own
         * choice (aws.c, a moment later) then keeps that count: its candidates are narrowed to
         * the types of the same count (lacks above) */
        snprintf(o->resources.nproc_spec, sizeof o->resources.nproc_spec, "%s", spec);
        o->resources.nproc_count = 0;
        char **types = NULL, **zones = NULL, *chosen_why = NULL, arch[64];
        size_t ntypes = 0, nzones = 0;
        const char *ship = td__aws_ship_arch(o, arch, sizeof arch);
        td_ec2_type *all = NULL;
        size_t nall = 0;
        st = td__aws_choose(aws, region, o, o->spot, ship, &types, &ntypes, &zones, &nzones,
                            &chosen_why);
        if (st == TD_OK) st = td_ec2_describe_instance_types(aws, &all, &nall);
        const td_ec2_type *t = st == TD_OK ? find_type(all, nall, types[0]) : NULL;
        if (st == TD_OK && !t)
            st = td_error(TD_ERR_PEER, "EC2's catalog lost instance type %s", types[0]);
        if (st == TD_OK) st = td__aws_type_nproc(t, spec, out, why, sizeof why);
        if (st == TD_OK) {
            o->resources.nproc_count = *out;
            snprintf(from, sizeof from, "the type aws.resources chooses now; the run chooses "
                                        "among the types of that count");
        } else {
            o->resources.nproc_spec[0] = '\0';
        }
        for (size_t i = 0; i < ntypes; i++) free(types[i]);
        free(types);
        for (size_t i = 0; i < nzones; i++) free(zones[i]);
        free(zones);
        free(chosen_why);
        free(all);
    } else {
        /* aws.instance_types are tried in turn on capacity refusals: any of them may be a
         * node's, so they must agree, as ssh hosts must */
        td_ec2_type *all = NULL;
        size_t nall = 0;
        st = td_ec2_describe_instance_types(aws, &all, &nall);
        for (size_t i = 0; st == TD_OK && i < o->ninstance_types; i++) {
            const td_ec2_type *t = find_type(all, nall, o->instance_types[i]);
            if (!t) {
                st = td_error(TD_ERR_INVALID,
                              "nproc_per_node: %s: aws.instance_type%s %s is not an instance "
                              "type of %s (EC2's DescribeInstanceTypes has no such type); "
                              "check its spelling, or give a number of workers",
                              spec, o->ninstance_types > 1 ? "s'" : "", o->instance_types[i],
                              region);
                break;
            }
            int n = 0;
            char w[300];
            st = td__aws_type_nproc(t, spec, &n, w, sizeof w);
            if (st != TD_OK) break;
            if (!i) {
                *out = n;
                snprintf(why, sizeof why, "%s", w);
            } else if (n != *out) {
                st = td_error(TD_ERR_USAGE,
                              "nproc_per_node: %s counts %d worker%s on %s but %d on %s "
                              "(aws.instance_types, tried in turn on capacity refusals); a run "
                              "has one count per node: give a number, or list types that agree",
                              spec, *out, *out == 1 ? "" : "s", o->instance_types[0], n,
                              o->instance_types[i]);
            }
        }
        if (st == TD_OK)
            snprintf(from, sizeof from, "aws.instance_type%s, EC2's catalog in %s",
                     o->ninstance_types > 1 ? "s" : "", region);
        free(all);
    }
    if (st == TD_OK && note)
        snprintf(note, nbytes, "nproc_per_node %s: %d worker%s per instance, %s; %s", spec, *out,
                 *out == 1 ? "" : "s", why, from);
    td_aws_free(aws);
    return st;
}

const char *td__aws_ship_arch(const td_aws_options *o, char *buf, size_t nbytes) {
    struct utsname u;
    if (o->tandem || uname(&u) != 0) return NULL;
    snprintf(buf, nbytes, "%.63s", u.machine);
    return buf;
}
