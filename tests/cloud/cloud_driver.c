/* The moto tests' driver: one call of tandem's AWS client per invocation, results on stdout,
 * one line per item; on failure the error on stderr and a line
 *   aws-error status=TD_ERR_x kind=K code=C retryable=R capacity=C
 * on stdout, exit 1. CLOUD_DRIVER_PART_MIB sets the multipart part size and threshold (MiB),
 * CLOUD_DRIVER_EC2_PAGE DescribeInstances' page size, CLOUD_DRIVER_STALL_S the stall window. */
#include "test.h"

#include "tandem/cloud.h"

static int usage(void) {
    fprintf(stderr, "usage: cloud_driver creds [PROFILE]\n"
                    "       cloud_driver ec2-run RUN_ID IMAGE TYPE COUNT [KEY_NAME [spot]]\n"
                    "       cloud_driver ec2-describe RUN_ID [STATE]\n"
                    "       cloud_driver ec2-terminate ID...\n"
                    "       cloud_driver s3-put BUCKET KEY FILE | s3-get BUCKET KEY FILE\n"
                    "       cloud_driver s3-head BUCKET KEY | s3-delete BUCKET KEY\n"
                    "       cloud_driver s3-list BUCKET PREFIX PAGE_SIZE | s3-url URL\n");
    return 2;
}

static int fail(td_aws_t *aws, td_status st) {
    td_error_print(st);
    const td_aws_error *e = aws ? td_aws_last_error(aws) : NULL;
    printf("aws-error status=%s kind=%s code=%s retryable=%d capacity=%d\n", td_status_name(st),
           e ? td_aws_errkind_name(e->kind) : "none", e && e->code[0] ? e->code : "-",
           e ? e->retryable : 0, e ? e->capacity : 0);
    td_aws_free(aws);
    return 1;
}

int main(int argc, char **argv) {
    if (argc < 2) return usage();
    const char *cmd = argv[1];
    if (!strcmp(cmd, "s3-url") && argc == 3) {
        td_s3_url u;
        td_status st = td_s3_url_parse(argv[2], &u);
        if (st != TD_OK) return fail(NULL, st);
        printf("%s %s\n", u.bucket, u.key);
        td_s3_url_free(&u);
        return 0;
    }
    td_aws_opts o = {.max_attempts = 3, .backoff_ms = 50};
    const char *part = getenv("CLOUD_DRIVER_PART_MIB");
    if (part) o.multipart_part_nbytes = o.multipart_threshold = (int64_t)atoi(part) << 20;
    const char *page = getenv("CLOUD_DRIVER_EC2_PAGE");
    if (page) o.ec2_page_size = atoi(page);
    const char *stall = getenv("CLOUD_DRIVER_STALL_S");
    if (stall) o.low_speed_timeout_s = atoi(stall);
    if (!strcmp(cmd, "creds") && argc == 3) o.profile = argv[2];
    td_aws_t *aws = NULL;
    td_status st = td_aws_new(&o, &aws);
    if (st != TD_OK) return fail(NULL, st);

    if (!strcmp(cmd, "creds") && argc <= 3) {
        td_aws_creds c;
        st = td_aws_creds_load(argc == 3 ? argv[2] : NULL, &c);
        if (st != TD_OK) return fail(aws, st);
        /* the key id is no secret (AWS prints it in errors); the secret never */
        printf("source %s\nregion %s\ntoken %s\nkey_id %s\n", c.source, td_aws_region(aws),
               c.session_token ? "yes" : "no", c.access_key_id);
        td_aws_creds_free(&c);
    } else if (!strcmp(cmd, "ec2-run") && argc >= 6) {
        td_ec2_tag tags[] = {{"Name", "tandem-test"}};
        td_ec2_run_spec s = {.image_id = argv[3],
                             .instance_type = argv[4],
                             .min_count = atoi(argv[5]),
                             .key_name = argc > 6 ? argv[6] : NULL,
                             .spot = argc > 7 && !strcmp(argv[7], "spot"),
                             .spot_max_price = argc > 7 ? "0.50" : NULL,
                             .run_id = argv[2],
                             .tags = tags,
                             .ntags = 1,
                             .root_volume_gib = 30,
                             .client_token = argv[2],
                             .user_data = "#!/bin/sh\necho tandem\n"};
        td_ec2_instances l;
        st = td_ec2_run_instances(aws, &s, &l);
        if (st != TD_OK) return fail(aws, st);
        for (int i = 0; i < l.count; i++)
            printf("%s %s %s\n", l.items[i].id, l.items[i].state, l.items[i].run_id);
        td_ec2_instances_free(&l);
    } else if (!strcmp(cmd, "ec2-describe") && argc >= 3) {
        td_ec2_instances l;
        st = td_ec2_describe_instances(aws, NULL, 0, argv[2], argc > 3 ? argv[3] : NULL, &l);
        if (st != TD_OK) return fail(aws, st);
        for (int i = 0; i < l.count; i++)
            printf("%s %s %s %s %s\n", l.items[i].id, l.items[i].state, l.items[i].run_id,
                   l.items[i].type, l.items[i].key_name);
        td_ec2_instances_free(&l);
    } else if (!strcmp(cmd, "ec2-terminate") && argc >= 3) {
        td_ec2_instances l;
        st = td_ec2_terminate_instances(aws, (const char *const *)argv + 2, argc - 2, &l);
        if (st != TD_OK) return fail(aws, st);
        for (int i = 0; i < l.count; i++) printf("%s %s\n", l.items[i].id, l.items[i].state);
        td_ec2_instances_free(&l);
    } else if (!strcmp(cmd, "s3-put") && argc == 5) {
        char sha[65];
        st = td_s3_put_file(aws, argv[2], argv[3], argv[4], sha);
        if (st != TD_OK) return fail(aws, st);
        printf("%s\n", sha);
    } else if (!strcmp(cmd, "s3-get") && argc == 5) {
        td_s3_object info;
        st = td_s3_get_file(aws, argv[2], argv[3], argv[4], &info);
        if (st != TD_OK) return fail(aws, st);
        printf("%s %lld\n", info.sha256_hex, (long long)info.nbytes);
        td_s3_object_free(&info);
    } else if (!strcmp(cmd, "s3-head") && argc == 4) {
        td_s3_object info;
        st = td_s3_head(aws, argv[2], argv[3], &info);
        if (st != TD_OK) return fail(aws, st);
        printf("%lld %s %s\n", (long long)info.nbytes, info.sha256_hex[0] ? info.sha256_hex : "-",
               info.etag);
        td_s3_object_free(&info);
    } else if (!strcmp(cmd, "s3-delete") && argc == 4) {
        st = td_s3_delete(aws, argv[2], argv[3]);
        if (st != TD_OK) return fail(aws, st);
    } else if (!strcmp(cmd, "s3-list") && argc == 5) {
        td_s3_list l;
        st = td_s3_list_objects(aws, argv[2], argv[3], atoi(argv[4]), &l);
        if (st != TD_OK) return fail(aws, st);
        for (int i = 0; i < l.count; i++)
            printf("%s %lld %s\n", l.items[i].key, (long long)l.items[i].nbytes, l.items[i].etag);
        td_s3_list_free(&l);
    } else {
        td_aws_free(aws);
        return usage();
    }
    td_aws_free(aws);
    return 0;
}
