/* The cloud layer without a network: XML answers (EC2 instances, EC2 and S3 errors, S3 lists),
 * error classification, s3:// URLs, credentials and region from the environment and the shared
 * files, encodings. */
#include <sys/stat.h>

#include "test.h"

#include "cloud/cloud_internal.h"
#include "tandem/cloud.h"

static const char RUN_XML[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<RunInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">"
    "<requestId>r-1</requestId><reservationId>r-0abc</reservationId><ownerId>123</ownerId>"
    "<instancesSet>"
    "<item><instanceId>i-0aaa</instanceId><imageId>ami-1</imageId>"
    "<instanceState><code>0</code><name>pending</name></instanceState>"
    "<privateIpAddress>10.0.0.5</privateIpAddress><keyName>k1</keyName>"
    "<instanceType>g5.xlarge</instanceType><launchTime>2026-01-02T03:04:05.000Z</launchTime>"
    "<placement><availabilityZone>us-east-1a</availabilityZone></placement>"
    "<instanceLifecycle>spot</instanceLifecycle>"
    "<tagSet><item><key>Name</key><value>n</value></item>"
    "<item><key>tandem:run</key><value>run-42</value></item></tagSet></item>"
    "<item><instanceId>i-0bbb</instanceId>"
    "<instanceState><code>0</code><name>pending</name></instanceState></item>"
    "</instancesSet></RunInstancesResponse>";

static const char DESCRIBE_XML[] =
    "<DescribeInstancesResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">"
    "<reservationSet>"
    "<item><reservationId>r-1</reservationId><instancesSet>"
    "<item><instanceId>i-1</instanceId><instanceState><name>running</name></instanceState>"
    "<ipAddress>203.0.113.9</ipAddress></item></instancesSet></item>"
    "<item><reservationId>r-2</reservationId><instancesSet>"
    "<item><instanceId>i-2</instanceId><instanceState><name>terminated</name></instanceState>"
    "<stateReason><code>Server.SpotInstanceTermination</code>"
    "<message>Server.SpotInstanceTermination: Spot instance termination</message></stateReason>"
    "</item></instancesSet></item>"
    "</reservationSet><nextToken>tok-2</nextToken></DescribeInstancesResponse>";

static const char TERMINATE_XML[] =
    "<TerminateInstancesResponse><requestId>x</requestId><instancesSet><item>"
    "<instanceId>i-1</instanceId><currentState><code>32</code><name>shutting-down</name>"
    "</currentState><previousState><code>16</code><name>running</name></previousState>"
    "</item></instancesSet></TerminateInstancesResponse>";

static const char EC2_ERR_XML[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error>"
    "<Code>InvalidKeyPair.NotFound</Code><Message>The key pair 'nokey' does not exist</Message>"
    "</Error></Errors><RequestID>req-7</RequestID></Response>";

static const char S3_ERR_XML[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>NoSuchKey</Code>"
    "<Message>The specified key does not exist.</Message><Key>a/b</Key>"
    "<RequestId>4442587FB7D0A2F9</RequestId></Error>";

static const char LIST_XML[] =
    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
    "<ListBucketResult xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\"><Name>b</Name>"
    "<Prefix>runs/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>"
    "<IsTruncated>true</IsTruncated>"
    "<Contents><Key>runs/a &amp; b.bin</Key><LastModified>2026-01-01T00:00:00.000Z</LastModified>"
    "<ETag>&quot;9b2cf535f27731c974343645a3985328&quot;</ETag><Size>6291456</Size>"
    "<StorageClass>STANDARD</StorageClass></Contents>"
    "<Contents><Key>runs/c</Key><Size>0</Size><ETag>\"d41d8cd98f00b204e9800998ecf8427e\"</ETag>"
    "</Contents><NextContinuationToken>1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM="
    "</NextContinuationToken></ListBucketResult>";

static void test_ec2_parse(void) {
    td_ec2_instances l = {0};
    char *next = NULL;
    ASSERT_OK(td_ec2_parse_instances(RUN_XML, strlen(RUN_XML), &l, &next));
    ASSERT_EQ(l.count, 2);
    ASSERT(next == NULL);
    ASSERT_STREQ(l.items[0].id, "i-0aaa");
    ASSERT_STREQ(l.items[0].state, "pending");
    ASSERT_STREQ(l.items[0].type, "g5.xlarge");
    ASSERT_STREQ(l.items[0].lifecycle, "spot");
    ASSERT_STREQ(l.items[0].zone, "us-east-1a");
    ASSERT_STREQ(l.items[0].private_ip, "10.0.0.5");
    ASSERT_STREQ(l.items[0].run_id, "run-42");
    ASSERT_STREQ(l.items[0].key_name, "k1");
    ASSERT_STREQ(l.items[1].id, "i-0bbb");
    ASSERT_STREQ(l.items[1].run_id, "");
    td_ec2_instances_free(&l);

    ASSERT_OK(td_ec2_parse_instances(DESCRIBE_XML, strlen(DESCRIBE_XML), &l, &next));
    ASSERT_EQ(l.count, 2);
    ASSERT_STREQ(next, "tok-2");
    free(next);
    ASSERT_STREQ(l.items[0].public_ip, "203.0.113.9");
    ASSERT_STREQ(l.items[1].state, "terminated");
    ASSERT_CONTAINS(l.items[1].state_reason, "Server.SpotInstanceTermination");
    /* a second page appends */
    ASSERT_OK(td_ec2_parse_instances(TERMINATE_XML, strlen(TERMINATE_XML), &l, NULL));
    ASSERT_EQ(l.count, 3);
    ASSERT_STREQ(l.items[2].state, "shutting-down");
    td_ec2_instances_free(&l);

    /* not an instances answer, not XML, nested too deep, a DOCTYPE: errors, no crash */
    ASSERT_STATUS(td_ec2_parse_instances(S3_ERR_XML, strlen(S3_ERR_XML), &l, NULL), TD_ERR_FORMAT);
    ASSERT_STATUS(td_ec2_parse_instances("<a><b>", 6, &l, NULL), TD_ERR_FORMAT);
    ASSERT_STATUS(td_ec2_parse_instances("", 0, &l, NULL), TD_ERR_FORMAT);
    char deep[2000] = "";
    for (int i = 0; i < 100; i++) strcat(deep, "<a>");
    ASSERT_STATUS(td_ec2_parse_instances(deep, strlen(deep), &l, NULL), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "deeper");
    const char *bomb = "<!DOCTYPE x [<!ENTITY a \"aaaa\">]><x>&a;</x>";
    ASSERT_STATUS(td_ec2_parse_instances(bomb, strlen(bomb), &l, NULL), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "DOCTYPE");
    ASSERT_EQ(l.count, 0);
}

static void test_errors(void) {
    td_aws_error e;
    ASSERT_OK(td_aws_error_parse(EC2_ERR_XML, strlen(EC2_ERR_XML), 400, &e));
    ASSERT_STREQ(e.code, "InvalidKeyPair.NotFound");
    ASSERT_CONTAINS(e.message, "nokey");
    ASSERT_STREQ(e.request_id, "req-7");
    ASSERT_EQ(e.kind, TD_AWS_ERRK_NOTFOUND);
    ASSERT_EQ(e.retryable, 0);
    ASSERT_OK(td_aws_error_parse(S3_ERR_XML, strlen(S3_ERR_XML), 404, &e));
    ASSERT_STREQ(e.code, "NoSuchKey");
    ASSERT_STREQ(e.request_id, "4442587FB7D0A2F9");
    ASSERT_EQ(e.kind, TD_AWS_ERRK_NOTFOUND);
    ASSERT_STATUS(td_aws_error_parse(RUN_XML, strlen(RUN_XML), 400, &e), TD_ERR_FORMAT);

    struct {
        const char *code;
        int http;
        td_aws_errkind kind;
        int retryable, capacity;
    } cases[] = {
        {"InsufficientInstanceCapacity", 500, TD_AWS_ERRK_CAPACITY, 1, 1},
        {"SpotMaxPriceTooLow", 400, TD_AWS_ERRK_CAPACITY, 0, 1},
        {"InstanceLimitExceeded", 400, TD_AWS_ERRK_CAPACITY, 0, 1},
        {"AuthFailure", 401, TD_AWS_ERRK_AUTH, 0, 0},
        {"UnauthorizedOperation", 403, TD_AWS_ERRK_AUTH, 0, 0},
        {"InvalidParameterValue", 400, TD_AWS_ERRK_INVALID, 0, 0},
        {"InvalidInstanceType.NotFound", 400, TD_AWS_ERRK_INVALID, 0, 0},
        {"InvalidSubnetID.NotFound", 400, TD_AWS_ERRK_NOTFOUND, 0, 0},
        {"InvalidAMIID.Malformed", 400, TD_AWS_ERRK_INVALID, 0, 0},
        {"RequestLimitExceeded", 503, TD_AWS_ERRK_THROTTLE, 1, 0},
        {"SlowDown", 503, TD_AWS_ERRK_THROTTLE, 1, 0},
        {"InternalError", 500, TD_AWS_ERRK_SERVER, 1, 0},
        {"", 502, TD_AWS_ERRK_SERVER, 1, 0},
        {"", 429, TD_AWS_ERRK_THROTTLE, 1, 0},
        {"", 403, TD_AWS_ERRK_AUTH, 0, 0},
        {"SomethingNew", 409, TD_AWS_ERRK_OTHER, 0, 0},
    };
    for (size_t i = 0; i < TD_ARRAY_LEN(cases); i++) {
        memset(&e, 0, sizeof e);
        snprintf(e.code, sizeof e.code, "%s", cases[i].code);
        e.http_status = cases[i].http;
        td_aws_error_classify(&e);
        if (e.kind != cases[i].kind || e.retryable != cases[i].retryable ||
            e.capacity != cases[i].capacity)
            TEST_FAIL("%s/%d: kind %s retryable %d capacity %d, expected %s %d %d", cases[i].code,
                      cases[i].http, td_aws_errkind_name(e.kind), e.retryable, e.capacity,
                      td_aws_errkind_name(cases[i].kind), cases[i].retryable, cases[i].capacity);
    }
}

static void test_s3_parse(void) {
    td_s3_list l = {0};
    char *next = NULL;
    ASSERT_OK(td_s3_parse_list(LIST_XML, strlen(LIST_XML), &l, &next));
    ASSERT_EQ(l.count, 2);
    ASSERT_STREQ(l.items[0].key, "runs/a & b.bin");
    ASSERT_EQ(l.items[0].nbytes, 6291456);
    ASSERT_STREQ(l.items[0].etag, "9b2cf535f27731c974343645a3985328");
    ASSERT_STREQ(l.items[1].etag, "d41d8cd98f00b204e9800998ecf8427e");
    ASSERT_STREQ(next, "1ueGcxLPRx1Tr/XYExHnhbYLgveDs2J/wm36Hy4vbOwM=");
    free(next);
    td_s3_list_free(&l);

    td_s3_url u;
    ASSERT_OK(td_s3_url_parse("s3://my-bucket/runs/r1/ckpt.bin", &u));
    ASSERT_STREQ(u.bucket, "my-bucket");
    ASSERT_STREQ(u.key, "runs/r1/ckpt.bin");
    td_s3_url_free(&u);
    ASSERT_OK(td_s3_url_parse("s3://b.with.dots", &u));
    ASSERT_STREQ(u.bucket, "b.with.dots");
    ASSERT_STREQ(u.key, "");
    td_s3_url_free(&u);
    ASSERT_OK(td_s3_url_parse("s3://abc/", &u));
    ASSERT_STREQ(u.key, "");
    td_s3_url_free(&u);
    const char *bad[] = {"http://b/k",         "s3://",        "s3:///k",
                         "s3://ab/k",          "s3://Upper/k", "s3://-lead/k",
                         "s3://under_score/k", "b/k"};
    for (size_t i = 0; i < TD_ARRAY_LEN(bad); i++) {
        if (td_s3_url_parse(bad[i], &u) != TD_ERR_INVALID) TEST_FAIL("'%s' was accepted", bad[i]);
        ASSERT_CONTAINS(td_error_msg(), "s3://");
    }
    /* issue 29: "s3://ckpts/../other/x" wrote into bucket 'other' (libcurl resolved the dot
     * segments); a prefix is used as written, so such segments are refused where they are
     * typed, with the URL and the fix */
    const char *dotted[] = {"s3://ckpts/../other/x", "s3://ckpts/a/./b", "s3://ckpts/a/..",
                            "s3://ckpts/a//b",       "s3://ckpts//a",    "s3://ckpts/.",
                            "s3://ckpts/a\r\nb"};
    for (size_t i = 0; i < TD_ARRAY_LEN(dotted); i++) {
        if (td_s3_url_parse(dotted[i], &u) != TD_ERR_INVALID)
            TEST_FAIL("'%s' was accepted (bucket '%s', key '%s')", dotted[i], u.bucket, u.key);
        ASSERT_CONTAINS(td_error_msg(), dotted[i]);
        ASSERT_CONTAINS(td_error_msg(), "write s3://BUCKET/PREFIX");
    }
    /* names that only look like dot segments are keys like any other */
    ASSERT_OK(td_s3_url_parse("s3://ckpts/a..b/.c/d./runs//", &u));
    ASSERT_STREQ(u.key, "a..b/.c/d./runs");
    td_s3_url_free(&u);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    ASSERT(f);
    fputs(text, f);
    fclose(f);
}

static void clear_env(void) {
    for (int i = 0; i < TD_AWS_ENV_COUNT; i++) unsetenv(td_aws_env_name((td_aws_env)i));
}

static void test_creds(void) {
    char dir[] = "/tmp/tandem-cloud-unit-XXXXXX";
    ASSERT(mkdtemp(dir));
    char creds[256], config[256];
    snprintf(creds, sizeof creds, "%s/credentials", dir);
    snprintf(config, sizeof config, "%s/config", dir);
    write_file(creds, "# comment\n[default]\naws_access_key_id = AKIADEFAULT\n"
                      "aws_secret_access_key = secretdefault\n\n"
                      "[work]\naws_access_key_id=AKIAWORK\naws_secret_access_key=secretwork\n"
                      "aws_session_token = tokwork\n"
                      "[half]\naws_access_key_id = AKIAHALF\n");
    write_file(config, "[default]\nregion = eu-central-1\n"
                       "[profile work]\nregion = ap-south-1\ns3 =\n  region = nested-ignored\n"
                       "[profile cfgonly]\naws_access_key_id = AKIACFG\n"
                       "aws_secret_access_key = secretcfg\n"
                       "[profile sso]\nsso_start_url = https://x\n");
    clear_env();
    setenv("HOME", dir, 1); /* no ~/.aws of the machine running the test */
    setenv("AWS_SHARED_CREDENTIALS_FILE", creds, 1);
    setenv("AWS_CONFIG_FILE", config, 1);
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);

    td_aws_creds c;
    ASSERT_OK(td_aws_creds_load(NULL, &c));
    ASSERT_STREQ(c.access_key_id, "AKIADEFAULT");
    ASSERT_STREQ(c.secret_access_key, "secretdefault");
    ASSERT(c.session_token == NULL);
    ASSERT_CONTAINS(c.source, "profile 'default'");
    td_aws_creds_free(&c);

    setenv("AWS_PROFILE", "work", 1);
    ASSERT_OK(td_aws_creds_load(NULL, &c));
    ASSERT_STREQ(c.access_key_id, "AKIAWORK");
    ASSERT_STREQ(c.session_token, "tokwork");
    td_aws_creds_free(&c);
    char *region = NULL;
    ASSERT_OK(td_aws_region_load(NULL, &region));
    ASSERT_STREQ(region, "ap-south-1");
    free(region);
    setenv("AWS_DEFAULT_REGION", "us-west-1", 1);
    ASSERT_OK(td_aws_region_load(NULL, &region));
    ASSERT_STREQ(region, "us-west-1");
    free(region);
    setenv("AWS_REGION", "us-east-2", 1);
    ASSERT_OK(td_aws_region_load(NULL, &region));
    ASSERT_STREQ(region, "us-east-2");
    free(region);
    unsetenv("AWS_REGION");
    unsetenv("AWS_DEFAULT_REGION");

    /* the argument wins over AWS_PROFILE; keys from the config file alone */
    ASSERT_OK(td_aws_creds_load("cfgonly", &c));
    ASSERT_STREQ(c.access_key_id, "AKIACFG");
    ASSERT_CONTAINS(c.source, config);
    td_aws_creds_free(&c);
    ASSERT_STATUS(td_aws_region_load("cfgonly", &region), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), "AWS_REGION");
    ASSERT_CONTAINS(td_error_msg(), "cfgonly");

    /* errors name the profile and the files, and say what to do; never a secret */
    ASSERT_STATUS(td_aws_creds_load("half", &c), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "'half'");
    ASSERT_CONTAINS(td_error_msg(), "aws_secret_access_key");
    ASSERT_STATUS(td_aws_creds_load("sso", &c), TD_ERR_UNSUPPORTED);
    ASSERT_CONTAINS(td_error_msg(), "sso_start_url");
    setenv("AWS_PROFILE", "nosuch", 1);
    ASSERT_STATUS(td_aws_creds_load(NULL, &c), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), "'nosuch' (from AWS_PROFILE)");
    ASSERT_CONTAINS(td_error_msg(), creds);
    ASSERT(!strstr(td_error_msg(), "secretdefault"));
    unsetenv("AWS_PROFILE");

    /* the environment first */
    setenv("AWS_ACCESS_KEY_ID", "AKIAENV", 1);
    ASSERT_STATUS(td_aws_creds_load(NULL, &c), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "AWS_SECRET_ACCESS_KEY");
    setenv("AWS_SECRET_ACCESS_KEY", "secretenv", 1);
    setenv("AWS_SESSION_TOKEN", "tokenv", 1);
    setenv("AWS_PROFILE", "work", 1); /* AWS_PROFILE alone: the environment's keys still win */
    ASSERT_OK(td_aws_creds_load(NULL, &c));
    ASSERT_STREQ(c.access_key_id, "AKIAENV");
    ASSERT_STREQ(c.session_token, "tokenv");
    ASSERT_STREQ(c.source, "environment (AWS_ACCESS_KEY_ID)");
    td_aws_creds_free(&c);
    unsetenv("AWS_PROFILE");
    /* a profile named by the caller drops the environment's keys, as botocore does
     * (test_creds.sh checks the same against boto3) */
    ASSERT_OK(td_aws_creds_load("work", &c));
    ASSERT_STREQ(c.access_key_id, "AKIAWORK");
    ASSERT_STREQ(c.session_token, "tokwork");
    td_aws_creds_free(&c);

    /* issue 29: a control character in a credential would reach the signed request's
     * headers; refused, naming the variable, never showing the value */
    const char *bad_env[][2] = {{"AWS_SECRET_ACCESS_KEY", "secret\r\nX-Injected: 1"},
                                {"AWS_SESSION_TOKEN", "tok\x01en"},
                                {"AWS_ACCESS_KEY_ID", "AKIA\nENV"}};
    for (size_t i = 0; i < TD_ARRAY_LEN(bad_env); i++) {
        setenv(bad_env[i][0], bad_env[i][1], 1);
        ASSERT_STATUS(td_aws_creds_load(NULL, &c), TD_ERR_INVALID);
        ASSERT_CONTAINS(td_error_msg(), bad_env[i][0]);
        ASSERT_CONTAINS(td_error_msg(), "control character");
        ASSERT(!strstr(td_error_msg(), "tok\x01"));
        ASSERT(!strstr(td_error_msg(), "X-Injected"));
        setenv(bad_env[i][0], i == 0 ? "secretenv" : i == 1 ? "tokenv" : "AKIAENV", 1);
    }
    unsetenv("AWS_ACCESS_KEY_ID");
    unsetenv("AWS_SECRET_ACCESS_KEY");
    unsetenv("AWS_SESSION_TOKEN");
    /* ... and in a file: the profile, the file and the key's name */
    write_file(creds, "[ctl]\naws_access_key_id = AKIACTL\n"
                      "aws_secret_access_key = sec\x1bret\naws_session_token = tok\n");
    ASSERT_STATUS(td_aws_creds_load("ctl", &c), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "profile 'ctl' in");
    ASSERT_CONTAINS(td_error_msg(), "aws_secret_access_key has a control character");
    ASSERT(!strstr(td_error_msg(), "sec\x1bret"));

    /* nothing anywhere, metadata off: the message lists each place and the fixes */
    unlink(creds);
    unlink(config);
    ASSERT_STATUS(td_aws_creds_load(NULL, &c), TD_ERR_NOTFOUND);
    ASSERT_CONTAINS(td_error_msg(), "AWS_EC2_METADATA_DISABLED");
    ASSERT_CONTAINS(td_error_msg(), "aws configure");
    /* metadata on, at an endpoint where nothing listens: fails fast, names it */
    unsetenv("AWS_EC2_METADATA_DISABLED");
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1", 1);
    double t0 = td_now_s();
    ASSERT_STATUS(td_aws_creds_load(NULL, &c), TD_ERR_NOTFOUND);
    ASSERT_LT(td_now_s() - t0, 5.0);
    ASSERT_CONTAINS(td_error_msg(), "http://127.0.0.1:1/latest/api/token");
    ASSERT_CONTAINS(td_error_msg(), "instance profile");

    /* td_aws_new: an endpoint override that is not a URL */
    clear_env();
    setenv("AWS_ACCESS_KEY_ID", "AKIAENV", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "secretenv", 1);
    setenv("AWS_REGION", "us-east-1", 1);
    td_aws_t *aws = NULL;
    ASSERT_OK(td_aws_new(NULL, &aws));
    ASSERT_STREQ(td_aws_endpoint(aws, "ec2"), "https://ec2.us-east-1.amazonaws.com");
    ASSERT_STREQ(td_aws_endpoint(aws, "s3"), "https://s3.us-east-1.amazonaws.com");
    td_aws_free(aws);
    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:5000/", 1);
    setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:6000", 1);
    ASSERT_OK(td_aws_new(NULL, &aws));
    ASSERT_STREQ(td_aws_endpoint(aws, "ec2"), "http://127.0.0.1:5000");
    ASSERT_STREQ(td_aws_endpoint(aws, "s3"), "http://127.0.0.1:6000");
    td_aws_free(aws);
    setenv("AWS_ENDPOINT_URL_EC2", "localhost:5000", 1);
    ASSERT_STATUS(td_aws_new(NULL, &aws), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "AWS_ENDPOINT_URL_EC2");
    clear_env();
    rmdir(dir);
}

static void test_encodings(void) {
    char *s = td__uri_encode("a b/c~d_e.f-g+h%é", 1);
    ASSERT_STREQ(s, "a%20b/c~d_e.f-g%2Bh%25%C3%A9");
    free(s);
    s = td__uri_encode("a/b", 0);
    ASSERT_STREQ(s, "a%2Fb");
    free(s);
    const char *b64[][2] = {{"", ""},
                            {"f", "Zg=="},
                            {"fo", "Zm8="},
                            {"foo", "Zm9v"},
                            {"foob", "Zm9vYg=="},
                            {"fooba", "Zm9vYmE="},
                            {"foobar", "Zm9vYmFy"}};
    for (size_t i = 0; i < TD_ARRAY_LEN(b64); i++) {
        s = td__base64(b64[i][0], strlen(b64[i][0]));
        ASSERT_STREQ(s, b64[i][1]);
        free(s);
    }
    char *q = NULL;
    td__query_add(&q, "Filter.1.Name", "tag:tandem:run");
    td__query_addf(&q, "MaxCount", "%d", 2);
    ASSERT_STREQ(q, "Filter.1.Name=tag%3Atandem%3Arun&MaxCount=2");
    free(q);
    char hex[65];
    td_aws_sha256_hex("abc", 3, hex);
    ASSERT_STREQ(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

/* The spot notices' documents, and the IMDS client's endpoint check (no request is made). */
static void test_imds(void) {
    td_spot_notice n;
    ASSERT_OK(td_spot_action_parse("{\"action\": \"terminate\", \"time\": "
                                   "\"2026-11-26T15:32:00Z\"}",
                                   &n));
    ASSERT_STREQ(n.action, "terminate");
    ASSERT_STREQ(n.time, "2026-11-26T15:32:00Z");
    ASSERT_EQ((long long)n.time_wall_s, 1795707120LL);
    ASSERT_OK(td_spot_rebalance_parse("{\"noticeTime\": \"2026-11-26T15:30:00Z\"}", &n));
    ASSERT_STREQ(n.action, "rebalance");
    ASSERT_STREQ(n.time, "2026-11-26T15:30:00Z");
    ASSERT_STATUS(td_spot_action_parse("{\"time\": \"2026-11-26T15:32:00Z\"}", &n), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "\"action\"");
    ASSERT_STATUS(td_spot_rebalance_parse("not json", &n), TD_ERR_FORMAT);

    td_imds_t *c = NULL;
    unsetenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    ASSERT_OK(td_imds_new(NULL, &c));
    ASSERT_STREQ(td_imds_endpoint(c), "http://169.254.169.254");
    td_imds_free(c);
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:1/", 1);
    ASSERT_OK(td_imds_new(NULL, &c));
    ASSERT_STREQ(td_imds_endpoint(c), "http://127.0.0.1:1");
    /* nothing listens there: an error naming the URL, quickly, not a 404 */
    char *body = NULL;
    int status = -1;
    ASSERT(td_imds_get(c, "latest/meta-data/instance-id", &body, &status) != TD_OK);
    ASSERT_EQ(status, 0);
    ASSERT(body == NULL);
    ASSERT_CONTAINS(td_error_msg(), "http://127.0.0.1:1/latest/api/token");
    td_imds_free(c);
    setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "169.254.169.254/latest", 1);
    ASSERT_STATUS(td_imds_new(NULL, &c), TD_ERR_INVALID);
    ASSERT_CONTAINS(td_error_msg(), "AWS_EC2_METADATA_SERVICE_ENDPOINT");
    unsetenv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
}

/* The known regions: whole names only (no prefix, no suffix of another). */
static void test_regions(void) {
    ASSERT(td_aws_region_known("us-east-1"));
    ASSERT(td_aws_region_known("cn-northwest-1"));
    ASSERT(td_aws_region_known("eu-west-3"));
    ASSERT(!td_aws_region_known("us-east"));
    ASSERT(!td_aws_region_known("east-1"));
    ASSERT(!td_aws_region_known("us-east-12"));
    ASSERT(!td_aws_region_known("xx-nowhere-9"));
    ASSERT(!td_aws_region_known(""));
    ASSERT(!td_aws_region_known(NULL));
}

/* The retries' pauses: doubling from the base, then held at the cap (a planted removal of the
 * cap went unseen while the moto test's few short retries never reached it). */
static void test_backoff(void) {
    const int64_t want[] = {1000, 2000, 4000, 5000, 5000};
    for (int i = 0; i < (int)TD_ARRAY_LEN(want); i++)
        ASSERT_EQ(td__aws_backoff_ceiling_ms(1000, 5000, i), want[i]);
    /* the client's own: 200 ms doubling to the 20 s cap, held there however many attempts */
    const int64_t real[] = {200, 400, 800, 1600, 3200, 6400, 12800, 20000, 20000, 20000};
    for (int i = 0; i < (int)TD_ARRAY_LEN(real); i++)
        ASSERT_EQ(td__aws_backoff_ceiling_ms(200, TD__AWS_BACKOFF_MAX_MS, i), real[i]);
    ASSERT_EQ(td__aws_backoff_ceiling_ms(200, TD__AWS_BACKOFF_MAX_MS, 1000), 20000);
}

/* Prices and instance types (cost, resources:): the newest spot price wins whatever the order,
 * a GPU type's count, model and memory, x86_64 found though listed second; the price file's
 * last matching line, '*' regions, its errors named with the line; the table's fallback; the
 * switch's heartbeat and its script's quoting of the shutdown command. */
static void test_prices(void) {
    static const char SPOT[] =
        "<DescribeSpotPriceHistoryResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\">"
        "<spotPriceHistorySet>"
        "<item><instanceType>g5.xlarge</instanceType><spotPrice>0.4000</spotPrice>"
        "<timestamp>2026-01-02T03:00:00.000Z</timestamp></item>"
        "<item><instanceType>g5.xlarge</instanceType><spotPrice>0.4512</spotPrice>"
        "<timestamp>2026-01-02T05:00:00.000Z</timestamp></item>"
        "<item><instanceType>g5.xlarge</instanceType><spotPrice>0.3000</spotPrice>"
        "<timestamp>2026-01-01T23:00:00.000Z</timestamp></item>"
        "</spotPriceHistorySet></DescribeSpotPriceHistoryResponse>";
    double usd = 0;
    char when[48];
    ASSERT_EQ(td_ec2_parse_spot_price(SPOT, strlen(SPOT), &usd, when, sizeof when), TD_OK);
    ASSERT_NEAR(usd, 0.4512, 1e-12);
    ASSERT_STREQ(when, "2026-01-02T05:00:00.000Z");
    static const char NONE[] = "<DescribeSpotPriceHistoryResponse><spotPriceHistorySet/>"
                               "</DescribeSpotPriceHistoryResponse>";
    ASSERT_EQ(td_ec2_parse_spot_price(NONE, strlen(NONE), &usd, when, sizeof when),
              TD_ERR_NOTFOUND);
    td_error_clear();

    static const char TYPES[] =
        "<DescribeInstanceTypesResponse><instanceTypeSet>"
        "<item><instanceType>g5.12xlarge</instanceType>"
        "<vCpuInfo><defaultVCpus>48</defaultVCpus></vCpuInfo>"
        "<memoryInfo><sizeInMiB>196608</sizeInMiB></memoryInfo>"
        "<processorInfo><supportedArchitectures><item>i386</item><item>x86_64</item>"
        "</supportedArchitectures></processorInfo>"
        "<gpuInfo><gpus><item><name>A10G</name><count>4</count>"
        "<memoryInfo><sizeInMiB>22888</sizeInMiB></memoryInfo></item></gpus></gpuInfo></item>"
        "<item><instanceType>t4g.small</instanceType>"
        "<vCpuInfo><defaultVCpus>2</defaultVCpus></vCpuInfo>"
        "<memoryInfo><sizeInMiB>2048</sizeInMiB></memoryInfo>"
        "<processorInfo><supportedArchitectures><item>arm64</item></supportedArchitectures>"
        "</processorInfo></item>"
        "</instanceTypeSet><nextToken>p2</nextToken></DescribeInstanceTypesResponse>";
    td_ec2_type *types = NULL;
    size_t n = 0;
    char *next = NULL;
    ASSERT_EQ(td_ec2_parse_instance_types(TYPES, strlen(TYPES), &types, &n, &next), TD_OK);
    ASSERT_EQ(n, 2);
    ASSERT_STREQ(next, "p2");
    ASSERT_STREQ(types[0].name, "g5.12xlarge");
    ASSERT_EQ(types[0].vcpus, 48);
    ASSERT_NEAR(types[0].memory_gib, 192.0, 1e-9);
    ASSERT_EQ(types[0].gpus, 4);
    ASSERT_STREQ(types[0].gpu_model, "A10G");
    ASSERT_NEAR(types[0].gpu_memory_gib, 22888 / 1024.0, 1e-9);
    ASSERT_STREQ(types[0].arch, "x86_64");
    ASSERT_EQ(types[1].gpus, 0);
    ASSERT_STREQ(types[1].arch, "arm64");
    free(types);
    free(next);

    char path[] = "/tmp/tandem-prices-XXXXXX";
    int fd = mkstemp(path);
    ASSERT(fd >= 0);
    const char *text = "# prices\n* g5.xlarge 9\nus-east-1 g5.xlarge 1.5  # override\n"
                       "eu-west-1 t3.micro 0.02\n";
    ASSERT_EQ(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    char src[256];
    ASSERT_EQ(td_aws_on_demand_price("us-east-1", "g5.xlarge", path, &usd, src, sizeof src), TD_OK);
    ASSERT_NEAR(usd, 1.5, 1e-12);
    ASSERT(strstr(src, ":3"));
    ASSERT_EQ(td_aws_on_demand_price("ap-south-1", "g5.xlarge", path, &usd, src, sizeof src),
              TD_OK);
    ASSERT_NEAR(usd, 9, 1e-12);
    /* not in the file: tandem's table (us-east-1 only) */
    ASSERT_EQ(td_aws_on_demand_price("us-east-1", "t3.micro", path, &usd, src, sizeof src), TD_OK);
    ASSERT_NEAR(usd, 0.0104, 1e-12);
    ASSERT(strstr(src, "tandem's table"));
    ASSERT_EQ(td_aws_on_demand_price("ap-south-1", "t3.micro", path, &usd, src, sizeof src),
              TD_ERR_NOTFOUND);
    ASSERT(strstr(td_error_msg(), "ap-south-1 t3.micro USD_PER_HOUR"));
    td_error_clear();
    FILE *f = fopen(path, "a");
    ASSERT(f);
    fputs("us-east-1 g5.xlarge cheap\n", f);
    fclose(f);
    ASSERT_EQ(td_aws_on_demand_price("us-east-1", "g5.xlarge", path, &usd, src, sizeof src),
              TD_ERR_FORMAT);
    ASSERT(strstr(td_error_msg(), ":5: expected 'REGION TYPE USD_PER_HOUR'"));
    td_error_clear();
    unlink(path);

    /* the switch's heartbeat: four per timeout, between 1 and 30 s */
    ASSERT_NEAR(td_orphan_heartbeat_s(10), 2.5, 1e-12);
    ASSERT_NEAR(td_orphan_heartbeat_s(300), 30, 1e-12);
    ASSERT_NEAR(td_orphan_heartbeat_s(2), 1, 1e-12);
    char *ud = td_orphan_user_data(300, 1200, "echo it's");
    ASSERT(!strncmp(ud, "#!/bin/sh\n", 10));
    ASSERT(strstr(ud, "heard=/dev/shm/tandem-heard first=1200\n"));
    ASSERT(strstr(ud, "until sh -c 'echo it'\\''s'; do"));
    free(ud);
}

int main(void) {
    test_prices();
    test_backoff();
    test_regions();
    test_imds();
    test_ec2_parse();
    test_errors();
    test_s3_parse();
    test_creds();
    test_encodings();
    TEST_PASS();
}
