/* The bundle's decisions without a host (src/exec/bundle.c): a host's probe answer read as typed
 * lines, and the refusal of a host the bundle cannot run on (another architecture, an older
 * glibc, none) naming both sides and the fix; the per-zone spot price parser that the zone choice
 * ranks (src/cloud/ec2.c); which binaries of a portable install go in (each x86-64 level's
 * build beside `tandem`). The ship itself is checked end to end by test_aws_run.sh. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "test.h"

#include "exec/bundle.h"
#include "tandem/cloud.h"

static td__bundle bundle_like(const char *arch, const char *glibc) {
    td__bundle b;
    memset(&b, 0, sizeof b);
    strcpy(b.os, "Linux");
    strcpy(b.arch, arch);
    strcpy(b.glibc_needed, glibc);
    strcpy(b.key, "0123456789abcdef");
    return b;
}

static void test_probe(void) {
    td__bundle_host h;
    ASSERT_OK(td__bundle_parse_probe("os Linux\narch aarch64\nglibc 2.35\n"
                                     "dir /home/ubuntu/.cache/tandem/bundles/k\nhave 0\n",
                                     &h));
    ASSERT_STREQ(h.arch, "aarch64");
    ASSERT_STREQ(h.glibc, "2.35");
    ASSERT_STREQ(h.dir, "/home/ubuntu/.cache/tandem/bundles/k");
    ASSERT(!h.have);
    ASSERT_OK(td__bundle_parse_probe("os Linux\narch x86_64\nglibc \ndir /r/b\nhave 1", &h));
    ASSERT_STREQ(h.glibc, "");
    ASSERT(h.have);
    /* a missing line, or a home that is not absolute: not guessed */
    ASSERT_STATUS(td__bundle_parse_probe("os Linux\narch x86_64\ndir /r\nhave 1\n", &h),
                  TD_ERR_FORMAT);
    td_error_clear();
    ASSERT_STATUS(td__bundle_parse_probe("os Linux\narch x86_64\nglibc 2.36\ndir \nhave 1\n", &h),
                  TD_ERR_FORMAT);
    td_error_clear();
}

static void test_check(void) {
    td__bundle b = bundle_like("x86_64", "2.34");
    td__bundle_host h = {.os = "Linux", .arch = "x86_64", .glibc = "2.36", .dir = "/r"};
    ASSERT_OK(td__bundle_check_host(&b, &h, "instance i-1 (node 0)"));
    strcpy(h.glibc, "2.34");
    ASSERT_OK(td__bundle_check_host(&b, &h, "instance i-1 (node 0)"));
    /* an arm64 instance for an x86-64 binary */
    strcpy(h.arch, "aarch64");
    ASSERT_STATUS(td__bundle_check_host(&b, &h, "instance i-2 (node 1, m7g.large)"),
                  TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "instance i-2 (node 1, m7g.large) is Linux aarch64, but this "
                                    "tandem is a Linux x86_64 binary");
    ASSERT_CONTAINS(td_error_msg(), "aws.tandem");
    ASSERT_CONTAINS(td_error_msg(), "aws.setup");
    td_error_clear();
    /* an older glibc: 2.31 < 2.34, and 2.4 < 2.34 (numbers, not text) */
    strcpy(h.arch, "x86_64");
    strcpy(h.glibc, "2.31");
    ASSERT_STATUS(td__bundle_check_host(&b, &h, "instance i-3"), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "instance i-3 has glibc 2.31, but this tandem");
    ASSERT_CONTAINS(td_error_msg(), "needs glibc 2.34");
    td_error_clear();
    strcpy(h.glibc, "2.4");
    ASSERT_STATUS(td__bundle_check_host(&b, &h, "instance i-3"), TD_ERR_INVALID);
    td_error_clear();
    strcpy(h.glibc, "2.100");
    ASSERT_OK(td__bundle_check_host(&b, &h, "instance i-3"));
    /* no glibc at all (musl) */
    h.glibc[0] = '\0';
    ASSERT_STATUS(td__bundle_check_host(&b, &h, "instance i-4"), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "has no GNU C library");
    td_error_clear();
    ASSERT_STREQ(td__bundle_uname_arch("arm64"), "aarch64");
    ASSERT_STREQ(td__bundle_uname_arch("x86_64"), "x86_64");
}

static void test_zone_prices(void) {
    static const char xml[] =
        "<DescribeSpotPriceHistoryResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">"
        "<spotPriceHistorySet>"
        "<item><instanceType>t3.micro</instanceType><availabilityZone>us-east-1b</availabilityZone>"
        "<spotPrice>0.0040</spotPrice><timestamp>2026-11-26T10:00:00.000Z</timestamp></item>"
        "<item><instanceType>t3.micro</instanceType><availabilityZone>us-east-1a</availabilityZone>"
        "<spotPrice>0.0031</spotPrice><timestamp>2026-11-26T09:00:00.000Z</timestamp></item>"
        "<item><instanceType>t3.micro</instanceType><availabilityZone>us-east-1b</availabilityZone>"
        "<spotPrice>0.0050</spotPrice><timestamp>2026-11-26T11:00:00.000Z</timestamp></item>"
        "</spotPriceHistorySet></DescribeSpotPriceHistoryResponse>";
    td_ec2_zone_price *p = NULL;
    size_t n = 0;
    ASSERT_OK(td_ec2_parse_spot_prices(xml, sizeof xml - 1, &p, &n));
    ASSERT_EQ(n, 2);
    ASSERT_STREQ(p[0].zone, "us-east-1a");
    ASSERT_NEAR(p[0].usd, 0.0031, 1e-12);
    ASSERT_STREQ(p[1].zone, "us-east-1b"); /* the newest of its two entries */
    ASSERT_NEAR(p[1].usd, 0.0050, 1e-12);
    ASSERT_STREQ(p[1].when, "2026-11-26T11:00:00.000Z");
    free(p);
    static const char none[] = "<R><spotPriceHistorySet/></R>";
    ASSERT_STATUS(td_ec2_parse_spot_prices(none, sizeof none - 1, &p, &n), TD_ERR_NOTFOUND);
    td_error_clear();
}

static void touch(const char *dir, const char *name, mode_t mode) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    ASSERT(f != NULL);
    fputs("#!/bin/sh\n", f);
    fclose(f);
    ASSERT(chmod(p, mode) == 0);
}

/* A portable install's directory: tandem, its level builds, and files that are none of them. */
static void test_levels(void) {
    char dir[] = "/tmp/tandem-bundle-levels-XXXXXX";
    ASSERT(mkdtemp(dir) != NULL);
    touch(dir, "tandem", 0755);
    touch(dir, "tandem-x86-64", 0755);
    touch(dir, "tandem-x86-64-v3", 0755);
    touch(dir, "tandem-x86-64-v4", 0755);
    touch(dir, "tandem-x86-64-v2", 0644);     /* not executable */
    touch(dir, "tandem-x86-64-v5", 0755);     /* no such level */
    touch(dir, "tandem-x86-64-v3.bak", 0755); /* not a level's name */
    char exe[PATH_MAX], want[PATH_MAX];
    char **paths = NULL;
    /* the process is the v4 build: the bundle's bin/tandem is the install's tandem */
    snprintf(exe, sizeof exe, "%s/tandem-x86-64-v4", dir);
    snprintf(want, sizeof want, "%s/tandem", dir);
    size_t n = td__bundle_levels(exe, &paths);
    ASSERT_STREQ(exe, want);
    ASSERT_EQ(n, 3);
    const char *names[] = {"tandem-x86-64", "tandem-x86-64-v3", "tandem-x86-64-v4"};
    for (size_t i = 0; i < n; i++) { /* glob's order: sorted */
        ASSERT_STREQ(strrchr(paths[i], '/') + 1, names[i]);
        free(paths[i]);
    }
    free(paths);
    /* the process is tandem itself: unchanged, the same levels */
    snprintf(exe, sizeof exe, "%s/tandem", dir);
    ASSERT_EQ(td__bundle_levels(exe, &paths), 3);
    ASSERT_STREQ(exe, want);
    for (size_t i = 0; i < 3; i++) free(paths[i]);
    free(paths);
    /* a level build with no tandem beside it ships as itself, with the levels there */
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s/tandem", dir);
    ASSERT(unlink(p) == 0);
    snprintf(exe, sizeof exe, "%s/tandem-x86-64-v3", dir);
    snprintf(want, sizeof want, "%s", exe);
    n = td__bundle_levels(exe, &paths);
    ASSERT_STREQ(exe, want);
    ASSERT_EQ(n, 3);
    for (size_t i = 0; i < n; i++) free(paths[i]);
    free(paths);
    /* a plain build: nothing beside it */
    const char *gone[] = {"tandem-x86-64", "tandem-x86-64-v2", "tandem-x86-64-v3", "tandem-x86-64-v4",
                          "tandem-x86-64-v5", "tandem-x86-64-v3.bak"};
    for (size_t i = 0; i < sizeof gone / sizeof *gone; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, gone[i]);
        ASSERT(unlink(p) == 0);
    }
    touch(dir, "tandem", 0755);
    snprintf(exe, sizeof exe, "%s/tandem", dir);
    ASSERT_EQ(td__bundle_levels(exe, &paths), 0);
    ASSERT(paths == NULL);
    snprintf(p, sizeof p, "%s/tandem", dir);
    unlink(p);
    rmdir(dir);
}

int main(void) {
    test_levels();
    test_probe();
    test_check();
    test_zone_prices();
    TEST_PASS();
}
