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

#include "exec/aws_internal.h"
#include "exec/internal.h"

typedef struct {
    const td_ec2_type *t;
    double usd;
    char source[200];
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

/* tandem's images are x86-64 (its table and its builds): other architectures are not offered
 * (an arm64 type would refuse an x86-64 image at RunInstances). */
static bool usable(const td_ec2_type *t) {
    return !strcmp(t->arch, "x86_64");
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
    if (b.len > 2) b.len -= 2;
    td__buf_addf(&b, "}");
    snprintf(out, nbytes, "%.*s", (int)b.len, b.s);
    free(b.s);
}

static void describe_type(const td_ec2_type *t, td__buf *b) {
    td__buf_addf(b, "%s (%d vCPU, %.4g GiB", t->name, t->vcpus, t->memory_gib);
    if (t->gpus) td__buf_addf(b, ", %d x %s %.0f GiB", t->gpus, t->gpu_model, t->gpu_memory_gib);
    td__buf_addf(b, ")");
}

td_status td__aws_choose(td_aws_t *aws, const char *region, const td_aws_options *o, int spot,
                         char ***types_out, size_t *ntypes_out, char **why_out) {
    *types_out = NULL;
    *ntypes_out = 0;
    *why_out = NULL;
    char req[256];
    td__aws_resources_text(o, req, sizeof req);
    td_ec2_type *all = NULL;
    size_t nall = 0;
    TD_CHECK(td_ec2_describe_instance_types(aws, &all, &nall));
    candidate *fit = td_xcalloc(nall + 1, sizeof *fit);
    size_t nfit = 0, nunpriced = 0;
    char unpriced[400] = "";
    for (size_t i = 0; i < nall; i++) {
        char what[200];
        if (!usable(&all[i]) || lacks(o, &all[i], what, sizeof what)) continue;
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
        if (spot) {
            char when[48] = "";
            double usd = 0;
            if (td_ec2_spot_price(aws, all[i].name, NULL, &usd, when, sizeof when) != TD_OK) {
                td_error_clear(); /* no spot market for it here: not a candidate */
                continue;
            }
            c->usd = usd;
            snprintf(c->source, sizeof c->source, "spot price now, %s", when);
        }
        nfit++;
    }
    td_status st = TD_OK;
    td__buf why = {0};
    if (!nfit) {
        /* the closest: those that have the most of what is asked */
        td__buf_addf(&why, "no x86-64 instance type in %s %s %s", region,
                     nunpriced ? "with a price has" : "has", req);
        if (nunpriced)
            td__buf_addf(&why, " (%zu that fit have no price: %s%s; add them to aws.prices as "
                               "'%s TYPE USD_PER_HOUR')",
                         nunpriced, unpriced, nunpriced > 5 ? ", ..." : "", region);
        bool *shown = td_xcalloc(nall + 1, sizeof *shown);
        for (int k = 0; k < 3; k++) {
            size_t best = nall;
            for (size_t i = 0; i < nall; i++)
                if (usable(&all[i]) && !shown[i] &&
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
        td__buf_addf(&why, " for %s: $%.5f/h %s (%s), the cheapest of %zu type%s that fit%s", req,
                     fit[0].usd, spot ? "spot" : "on-demand", fit[0].source, nfit,
                     nfit == 1 ? "" : "s",
                     nunpriced ? " and have a price" : "");
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
