/* tandem run --dry-run of an aws workflow: what the run would create, what it would cost and the
 * permissions it needs, and nothing created. The only calls are read-only (the credentials and
 * region, and DescribeSpotPriceHistory for a spot price): a plan can be made without the rights
 * to run it, and says so when a price cannot be had. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/aws_internal.h"
#include "tandem/cloud.h"

/* The hourly price of one instance of type for the market, and where it came from. */
static double price_of(td_aws_t *aws, const char *region, const td_aws_options *o,
                       const char *type, int spot, char *source, size_t nbytes) {
    double usd = 0;
    td_status st;
    if (spot && aws && o->nzones && !o->nsubnets) { /* the first zone tried: the cheapest */
        char when[48] = "";
        st = td_ec2_spot_price(aws, type, o->zones[0], &usd, when, sizeof when);
        if (st == TD_OK)
            snprintf(source, nbytes, "spot price of %s now (EC2, %s)", o->zones[0], when);
    } else if (spot && aws) {
        char when[48] = "";
        st = td_ec2_spot_price(aws, type, NULL, &usd, when, sizeof when);
        if (st == TD_OK) snprintf(source, nbytes, "spot price now (EC2, %s)", when);
    } else if (spot) {
        st = td_error(TD_ERR_AUTH, "no AWS client to ask the spot price");
    } else {
        st = td_aws_on_demand_price(region, type, o->prices, &usd, source, nbytes);
    }
    if (st != TD_OK) {
        snprintf(source, nbytes, "unknown: %s", td_error_msg());
        td_error_clear();
        return 0;
    }
    return usd;
}

td_status td_aws_plan(const td_aws_plan_in *in, FILE *out) {
    const td_aws_options *o = in->aws;
    if (!o || (!o->ninstance_types && !o->resources.set))
        return td_error(TD_ERR_USAGE, "--dry-run: workflow '%s' has no aws: instance_type to plan",
                        in->workflow ? in->workflow : "?");
    double orphan_s = o->orphan_timeout_s > 0 ? o->orphan_timeout_s : TD_AWS_ORPHAN_TIMEOUT_S;
    td_aws_opts ao = {.profile = o->profile, .region = o->region};
    td_aws_t *aws = NULL;
    char region[64] = "?";
    if (td_aws_new(&ao, &aws) == TD_OK) {
        snprintf(region, sizeof region, "%s", td_aws_region(aws));
    } else {
        fprintf(out, "note: %s (the plan goes on without AWS: no spot price)\n", td_error_msg());
        td_error_clear();
        if (o->region) snprintf(region, sizeof region, "%s", o->region);
    }
    /* resources: the choice the run would make, from the same catalog and prices */
    td_aws_options chosen = {0};
    if (o->resources.set) {
        if (!aws) return td_error(TD_ERR_AUTH, "--dry-run: resources: needs EC2's catalog of "
                                               "instance types, and no AWS client could be made");
        td_aws_options_copy(&chosen, o);
        char **types = NULL, **zones = NULL, *why = NULL, arch[64];
        size_t n = 0, nz = 0;
        const char *ship = td__aws_ship_arch(o, arch, sizeof arch);
        td_status st = td__aws_choose(aws, region, o, o->spot, ship, &types, &n, &zones, &nz, &why);
        if (st != TD_OK) {
            td_aws_options_clear(&chosen);
            td_aws_free(aws);
            return st;
        }
        for (size_t i = 0; i < chosen.ninstance_types; i++) free(chosen.instance_types[i]);
        free(chosen.instance_types);
        chosen.instance_types = types;
        chosen.ninstance_types = n;
        for (size_t i = 0; i < chosen.nzones; i++) free(chosen.zones[i]);
        free(chosen.zones);
        chosen.zones = zones;
        chosen.nzones = nz;
        if (!chosen.volume_gb && o->resources.disk_gib) chosen.volume_gb = o->resources.disk_gib;
        fprintf(out, "resources: %s\n", why);
        free(why);
        o = &chosen;
    } else if (o->spot && o->nzones && !o->nsubnets && aws) {
        /* aws.zones of a named type: the run tries them cheapest first */
        char **zones = NULL, src[200];
        size_t nz = 0;
        double usd = 0;
        if (td__aws_rank_zones(aws, o->instance_types[0], o, &zones, &nz, &usd, src,
                               sizeof src) == TD_OK) {
            td_aws_options_copy(&chosen, o);
            for (size_t i = 0; i < chosen.nzones; i++) free(chosen.zones[i]);
            free(chosen.zones);
            chosen.zones = zones;
            chosen.nzones = nz;
            o = &chosen;
        } else {
            fprintf(out, "note: %s (the zones are tried as aws.zones lists them)\n",
                    td_error_msg());
            td_error_clear();
        }
    }
    const char *type = o->instance_types[0];
    fprintf(out, "plan of workflow '%s' (--dry-run: nothing is created)\n",
            in->workflow ? in->workflow : "?");
    fprintf(out, "  instances   %d x %s, %s%s, in %s", in->nodes, type,
            o->spot ? "spot" : "on-demand", o->spot && o->fallback_on_demand ? " (on-demand if "
                                                                               "no spot capacity)"
                                                                             : "",
            region);
    if (o->nsubnets) {
        fprintf(out, ", subnet");
        for (size_t i = 0; i < o->nsubnets; i++)
            fprintf(out, "%s%s", i ? ", " : " ", o->subnets[i]);
    } else if (o->nzones) {
        fprintf(out, ", zone%s", o->nzones > 1 ? "s in turn" : "");
        for (size_t i = 0; i < o->nzones; i++)
            fprintf(out, "%s%s", i ? ", " : " ", o->zones[i]);
    } else {
        fprintf(out, ", the default subnet (EC2 picks the zone)");
    }
    fprintf(out, "; %d worker%s each\n", in->nproc_per_node, in->nproc_per_node == 1 ? "" : "s");
    /* nproc_per_node: gpu|cpu|auto, counted from the type (td_aws_count_nproc) */
    if (in->nproc_note && in->nproc_note[0]) fprintf(out, "  workers     %s\n", in->nproc_note);
    if (o->ninstance_types > 1) {
        fprintf(out, "  on capacity refusals, in turn:");
        for (size_t i = 1; i < o->ninstance_types; i++) fprintf(out, " %s", o->instance_types[i]);
        fprintf(out, "\n");
    }
    char source[600];
    double usd = price_of(aws, region, o, type, o->spot, source, sizeof source);
    if (usd > 0) {
        fprintf(out, "  price       $%.5f per instance-hour (%s); $%.5f per hour for %d\n", usd,
                source, usd * in->nodes, in->nodes);
        if (in->max_duration_s > 0)
            fprintf(out,
                    "  estimate    at most $%.4f: %d x %.2f h (max_duration), billed to the "
                    "second\n",
                    usd * in->nodes * in->max_duration_s / 3600.0, in->nodes,
                    in->max_duration_s / 3600.0);
        else
            fprintf(out,
                    "  estimate    $%.4f per hour the run lasts (no max_duration to bound it)\n",
                    usd * in->nodes);
    } else {
        fprintf(out, "  price       %s\n", source);
    }
    if (o->spot && o->fallback_on_demand) {
        double od = price_of(aws, region, o, type, 0, source, sizeof source);
        if (od > 0) fprintf(out, "  on demand   $%.5f per instance-hour (%s)\n", od, source);
    }
    fprintf(out, "  creates     %d instance%s (more if spot instances are interrupted and "
                 "replaced), "
                 "each with its root volume (%s, deleted with it), tagged tandem:run, "
                 "tandem:project, tandem:node, Name%s; user data: the dead-man's switch "
                 "(ends an instance whose supervisor is silent for %.0f s; "
                 "InstanceInitiatedShutdownBehavior terminate)\n",
            in->nodes, in->nodes == 1 ? "" : "s",
            o->volume_gb > 0 ? "gp3" : "the image's size", o->ntags ? " and aws.tags" : "",
            orphan_s);
    if (o->volume_gb > 0)
        fprintf(out, "              root volumes: %d GiB gp3 each\n", o->volume_gb);
    fprintf(out, "  not created security groups, key pairs, roles, subnets, buckets: yours, used "
                 "as named\n");
    fprintf(out, "  permissions ec2:RunInstances, ec2:CreateTags (at RunInstances), "
                 "ec2:DescribeInstances, ec2:TerminateInstances%s%s%s (docs/cloud.md: the "
                 "policy)\n",
            o->spot ? ", ec2:DescribeSpotPriceHistory" : "",
            o->iam_instance_profile ? ", iam:PassRole (the instance profile's role)" : "",
            in->s3 ? ", s3:PutObject, s3:GetObject, s3:DeleteObject, s3:AbortMultipartUpload, "
                     "s3:ListBucket (checkpoints and artifacts)"
                   : "");
    td_aws_free(aws);
    td_aws_options_clear(&chosen);
    return TD_OK;
}
