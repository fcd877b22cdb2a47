/* On-demand prices: a small table built into tandem, and the user's own file over it
 * (aws.prices; docs/cloud.md, "What it costs"). AWS's Price List API is large, slow and in
 * another endpoint (pricing.us-east-1), and a run's cost must be computable offline, in a test
 * and by `tandem show` years later: so the price used is recorded with each instance, and the
 * table here is what is used when the user gives none. Spot prices come from EC2 itself
 * (td_ec2_spot_price, ec2.c). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/cloud.h"

/* USD per hour, Linux, on demand, us-east-1, as AWS's price pages listed them in mid-2025.
 * Other regions cost more or less: name them in aws.prices. */
#define TABLE_DATE "us-east-1, mid-2025"
static const struct {
    const char *type;
    double usd;
} on_demand_us_east_1[] = {
    {"t3.micro", 0.0104},     {"t3.small", 0.0208},    {"t3.medium", 0.0416},
    {"t3.large", 0.0832},     {"t3.xlarge", 0.1664},   {"t3.2xlarge", 0.3328},
    {"c6i.large", 0.085},     {"c6i.xlarge", 0.17},    {"c6i.2xlarge", 0.34},
    {"c7i.large", 0.08925},   {"c7i.xlarge", 0.1785},  {"c7i.2xlarge", 0.357},
    {"c7i.4xlarge", 0.714},   {"m7i.large", 0.1008},   {"m7i.xlarge", 0.2016},
    {"m7i.2xlarge", 0.4032},  {"g4dn.xlarge", 0.526},  {"g4dn.12xlarge", 3.912},
    {"g5.xlarge", 1.006},     {"g5.2xlarge", 1.212},   {"g5.12xlarge", 5.672},
    {"g5.48xlarge", 16.288},  {"p4d.24xlarge", 32.7726},
};

/* The user's file: "REGION TYPE USD_PER_HOUR" per line. *found: it named them. */
static td_status from_file(const char *path, const char *region, const char *type, double *usd,
                           char *source, size_t nbytes, int *found) {
    *found = 0;
    FILE *f = fopen(path, "r");
    if (!f) return td_error_errno(TD_ERR_IO, "aws.prices %s", path);
    char line[512];
    td_status st = TD_OK;
    for (int lineno = 1; fgets(line, sizeof line, f); lineno++) {
        char *hash = strchr(line, '#');
        if (hash) *hash = '\0';
        char r[128], t[128], p[64], extra[8];
        int n = sscanf(line, "%127s %127s %63s %7s", r, t, p, extra);
        if (n <= 0) continue;
        char *end = NULL;
        errno = 0;
        double v = n == 3 ? strtod(p, &end) : 0;
        if (n != 3 || end == p || *end || errno || !(v > 0) || v > 10000) {
            st = td_error(TD_ERR_FORMAT,
                          "aws.prices %s:%d: expected 'REGION TYPE USD_PER_HOUR' (such as "
                          "'us-east-1 g5.xlarge 1.006', REGION * for any region), got '%.120s'",
                          path, lineno, line);
            break;
        }
        /* the last line that matches wins: a file may start with '*' and refine below */
        if ((!strcmp(r, "*") || !strcmp(r, region)) && !strcmp(t, type)) {
            *usd = v;
            *found = 1;
            snprintf(source, nbytes, "%s:%d", path, lineno);
        }
    }
    fclose(f);
    return st;
}

td_status td_aws_on_demand_price(const char *region, const char *type, const char *prices_file,
                                 double *usd_out, char *source, size_t source_nbytes) {
    *usd_out = 0;
    if (source_nbytes) source[0] = '\0';
    if (prices_file && *prices_file) {
        int found = 0;
        TD_CHECK(from_file(prices_file, region, type, usd_out, source, source_nbytes, &found));
        if (found) return TD_OK;
    }
    if (region && !strcmp(region, "us-east-1"))
        for (size_t i = 0; i < TD_ARRAY_LEN(on_demand_us_east_1); i++)
            if (!strcmp(on_demand_us_east_1[i].type, type)) {
                *usd_out = on_demand_us_east_1[i].usd;
                snprintf(source, source_nbytes, "tandem's table (%s)", TABLE_DATE);
                return TD_OK;
            }
    return td_error(TD_ERR_NOTFOUND,
                    "no on-demand price for %s in %s: tandem's table has a few types of "
                    "us-east-1; add a line '%s %s USD_PER_HOUR' to a file named by aws.prices",
                    type, region ? region : "?", region ? region : "REGION", type);
}
