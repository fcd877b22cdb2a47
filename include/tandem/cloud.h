/* tandem cloud: a small AWS client (EC2 instances, S3 objects), no SDK.
 *
 * The foundation of `executor: aws` and of s3:// checkpoints: credentials found as the AWS tools
 * find them, requests signed with Signature Version 4, sent with libcurl (retried with backoff on
 * throttling and 5xx), EC2's Query API and S3's REST API with their XML answers parsed by expat.
 * Everything AWS-specific lives in src/cloud/; the rest of tandem sees this header only.
 *
 * Errors: every call returns td_status with a td_error() detail that names the service, the
 * action, the AWS error code and message, and what to do ("create the key pair 'k' in us-east-1
 * or change key_name"); td_aws_last_error() gives the same as a typed value (code, kind,
 * retryable, capacity) for a caller that decides (an executor trying another instance type on a
 * capacity error). A secret (secret access key, session token, signature) never appears in an
 * error, a log line, or a process's argv.
 *
 * The AWS_* variables read (the AWS tools' own names, not TANDEM_ knobs) are one table,
 * TD_AWS_ENV_MAP; docs/cloud.md has the rest. A td_aws_t is not thread-safe: one per thread. */
#ifndef TANDEM_CLOUD_H
#define TANDEM_CLOUD_H

#include <stddef.h>
#include <stdint.h>

#include "tandem/core.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- the AWS variables tandem reads, declared once: X(name, meaning) ---- */
#define TD_AWS_ENV_MAP(X)                                                                          \
    X(AWS_ACCESS_KEY_ID, "access key id (with AWS_SECRET_ACCESS_KEY): first choice")               \
    X(AWS_SECRET_ACCESS_KEY, "secret access key")                                                  \
    X(AWS_SESSION_TOKEN, "session token of temporary credentials")                                 \
    X(AWS_PROFILE, "profile of the shared files (default: 'default')")                             \
    X(AWS_SHARED_CREDENTIALS_FILE, "credentials file (default ~/.aws/credentials)")                \
    X(AWS_CONFIG_FILE, "config file (default ~/.aws/config; sections '[profile NAME]')")           \
    X(AWS_REGION, "region (first choice)")                                                         \
    X(AWS_DEFAULT_REGION, "region when AWS_REGION is unset")                                       \
    X(AWS_ENDPOINT_URL, "endpoint for every service (a local server: S3 path-style)")              \
    X(AWS_ENDPOINT_URL_EC2, "endpoint for EC2, over AWS_ENDPOINT_URL")                             \
    X(AWS_ENDPOINT_URL_S3, "endpoint for S3, over AWS_ENDPOINT_URL (S3 path-style)")               \
    X(AWS_EC2_METADATA_SERVICE_ENDPOINT,                                                           \
      "instance metadata (IMDSv2) URL, default 169.254.169.254")                                   \
    X(AWS_EC2_METADATA_DISABLED, "true: never ask the instance metadata service")

typedef enum {
#define TD__AWS_ENV_ENUM(name, doc) TD_AWS_ENV_##name,
    TD_AWS_ENV_MAP(TD__AWS_ENV_ENUM)
#undef TD__AWS_ENV_ENUM
        TD_AWS_ENV_COUNT
} td_aws_env;
const char *td_aws_env_name(td_aws_env var);
/* Its value, or NULL when unset or empty. */
const char *td_aws_env_get(td_aws_env var);
void td_aws_env_print(FILE *out);

/* ---- credentials ----
 * td_aws_creds_load looks, in this order (botocore's), at
 *   1. AWS_ACCESS_KEY_ID + AWS_SECRET_ACCESS_KEY (+ AWS_SESSION_TOKEN), unless the profile
 *      argument names a profile (as boto3's Session(profile_name=...) and the CLI's --profile);
 *   2. the profile (argument, else AWS_PROFILE, else "default") in the credentials file, then in
 *      the config file ("[profile NAME]", "[default]"): aws_access_key_id, aws_secret_access_key,
 *      aws_session_token;
 *   3. the instance role, through IMDSv2 (unless AWS_EC2_METADATA_DISABLED=true).
 * A profile named explicitly (argument or AWS_PROFILE) that neither file has is an error; a
 * profile using what tandem does not implement (credential_process, sso_*, role_arn) is an
 * error that says so. A value with a control character (CR, LF, ...) is refused, naming its
 * source and field, never its value. `source` says where the keys came from (never the keys). */
typedef struct td_aws_creds {
    char *access_key_id;
    char *secret_access_key;
    char *session_token;   /* NULL when none */
    char source[256];      /* "environment", "profile 'x' in /home/u/.aws/credentials", ... */
    double expires_wall_s; /* temporary credentials: expiry (epoch seconds); 0: none */
} td_aws_creds;

td_status td_aws_creds_load(const char *profile, td_aws_creds *out) TD_NODISCARD;
/* Wipes the secrets and frees. */
void td_aws_creds_free(td_aws_creds *c);

/* The region: AWS_REGION, AWS_DEFAULT_REGION, else the profile's `region` in the config file.
 * Writes a newly allocated string; TD_ERR_NOTFOUND with the fix when none is set. */
td_status td_aws_region_load(const char *profile, char **region_out) TD_NODISCARD;

/* ---- the instance metadata service (IMDSv2), the one client of it in tandem ----
 * Used for the instance role's credentials and by the node agent's spot watch
 * (TANDEM_SPOT_WATCH). Every request carries a session token, fetched with
 * `PUT /latest/api/token` (X-aws-ec2-metadata-token-ttl-seconds) and fetched again shortly
 * before its TTL ends or when the service answers 401 (it restarted); IMDSv1 is never used.
 * The endpoint: opts->endpoint, else AWS_EC2_METADATA_SERVICE_ENDPOINT, else
 * http://169.254.169.254. Short timeouts (1 s to connect, 2 s per request: the AWS tools' own),
 * never a proxy. It does not read AWS_EC2_METADATA_DISABLED: the caller decides. One client per
 * thread, but td_imds_cancel may be called from any thread. */
typedef struct td_imds td_imds_t;

typedef struct td_imds_opts {
    const char *endpoint; /* "http://host[:port]"; NULL: the variable, else 169.254.169.254 */
    int token_ttl_s;      /* the session token's TTL, 1..21600; 0: 21600 */
} td_imds_opts;

/* opts may be NULL. TD_ERR_INVALID for an endpoint that is not http://host[:port]. */
td_status td_imds_new(const td_imds_opts *opts, td_imds_t **out) TD_NODISCARD;
/* Wipes the token and frees. */
void td_imds_free(td_imds_t *c);
/* "http://169.254.169.254" or the override, without a trailing slash. */
const char *td_imds_endpoint(const td_imds_t *c);
/* GET path ("latest/meta-data/instance-id"; a leading '/' is optional). TD_OK with
 * *http_status_out 200 and the body (allocated, NUL-terminated; body_out may be NULL), or TD_OK
 * with 404 and *body_out NULL: a path that does not exist (yet) is an answer, not an error.
 * Anything else is an error naming the URL: no answer (*http_status_out 0: TD_ERR_PEER, or
 * TD_ERR_TIMEOUT), a refused token or request (TD_ERR_AUTH, with its status), another status
 * (TD_ERR_PEER). TD_ERR_INTERRUPTED after td_imds_cancel. */
td_status td_imds_get(td_imds_t *c, const char *path, char **body_out,
                      int *http_status_out) TD_NODISCARD;
/* Makes the call in flight, and every later one, end at once with TD_ERR_INTERRUPTED: a thread
 * that stops another blocked in td_imds_get does not wait out its timeouts. */
void td_imds_cancel(td_imds_t *c);

/* ---- spot interruptions, as IMDS announces them ----
 * TD_IMDS_SPOT_ACTION answers 404 until EC2 decides to interrupt a spot instance, then
 * {"action": "terminate" | "stop" | "hibernate", "time": "2026-11-26T15:32:00Z"} (about two
 * minutes ahead); TD_IMDS_REBALANCE answers 404 until the instance is at elevated risk of
 * interruption, then {"noticeTime": "2026-11-26T15:30:00Z"}. */
#define TD_IMDS_SPOT_ACTION "latest/meta-data/spot/instance-action"
#define TD_IMDS_REBALANCE   "latest/meta-data/events/recommendations/rebalance"

typedef struct td_spot_notice {
    char action[16];    /* "terminate", "stop", "hibernate"; "rebalance" for a recommendation */
    char time[40];      /* as IMDS wrote it */
    double time_wall_s; /* the same in epoch seconds; 0 when it does not parse */
} td_spot_notice;

/* Parsers of those two documents (pure). TD_ERR_FORMAT, naming the field, otherwise. */
td_status td_spot_action_parse(const char *json, td_spot_notice *out) TD_NODISCARD;
td_status td_spot_rebalance_parse(const char *json, td_spot_notice *out) TD_NODISCARD;

/* Whether region is one of the AWS regions tandem knows (the commercial ones as of late 2026).
 * Regions are added over time, so an unknown one is not refused: a caller whose first call
 * fails names it as the likely cause (a region that does not exist fails as a network error on
 * AWS, its endpoint having no address). */
int td_aws_region_known(const char *region);
/* The known regions, comma-separated, for messages. */
const char *td_aws_regions_list(void);

/* ---- SigV4, a pure function of its inputs ----
 * path: the URI path exactly as sent (already percent-encoded, not encoded again: S3's rule,
 * and EC2's path is "/"); query: the query string as sent ("a=b&c" or ""), pairs sorted here;
 * headers: every header to sign, including host (name case and value spacing free; the
 * canonical form is made here); x-amz-date and, with a session token, x-amz-security-token are
 * added here. payload_sha256_hex: hex SHA-256 of the body, or "UNSIGNED-PAYLOAD". */
typedef struct td_http_header {
    const char *name;
    const char *value;
} td_http_header;

typedef struct td_sigv4_in {
    const char *access_key_id;
    const char *secret_access_key;
    const char *session_token; /* NULL: none */
    const char *region;
    const char *service; /* "ec2", "s3" */
    int64_t time_s;      /* request time, epoch seconds (UTC) */
    const char *method;
    const char *path;
    const char *query;
    const td_http_header *headers;
    int nheaders;
    const char *payload_sha256_hex;
} td_sigv4_in;

typedef struct td_sigv4_out {
    char amz_date[17];       /* 20240102T030405Z: the x-amz-date header's value */
    char *canonical_request; /* for debugging (contains no secret) */
    char *string_to_sign;
    char signature[65];
    char *authorization; /* the Authorization header's value */
} td_sigv4_out;

td_status td_sigv4_sign(const td_sigv4_in *in, td_sigv4_out *out) TD_NODISCARD;
void td_sigv4_out_free(td_sigv4_out *out);

/* Lowercase hex SHA-256 of a buffer / a byte range of a file (length < 0: to the end). */
void td_aws_sha256_hex(const void *buf, size_t nbytes, char hex_out[65]);
td_status td_aws_sha256_file(const char *path, int64_t offset, int64_t nbytes, char hex_out[65]);

/* ---- errors, typed ---- */
typedef enum {
    TD_AWS_ERRK_NONE = 0,
    TD_AWS_ERRK_AUTH,      /* credentials or permissions: fix them, do not retry */
    TD_AWS_ERRK_NOTFOUND,  /* a named thing does not exist (key pair, instance, bucket, key) */
    TD_AWS_ERRK_INVALID,   /* a parameter AWS rejects (instance type, image, price) */
    TD_AWS_ERRK_CAPACITY,  /* no capacity / spot price / instance limit: try elsewhere, later */
    TD_AWS_ERRK_THROTTLE,  /* too many requests: retried with backoff */
    TD_AWS_ERRK_SERVER,    /* 5xx: retried with backoff */
    TD_AWS_ERRK_NETWORK,   /* no HTTP answer (DNS, connect, timeout): retried */
    TD_AWS_ERRK_INTEGRITY, /* bytes differ from their checksum */
    TD_AWS_ERRK_OTHER
} td_aws_errkind;

typedef struct td_aws_error {
    int http_status;   /* 0: no HTTP answer */
    char code[96];     /* "InvalidKeyPair.NotFound", "" when none */
    char message[512]; /* AWS's message */
    char request_id[96];
    td_aws_errkind kind;
    int retryable; /* worth retrying later (throttle, 5xx, network, capacity) */
    int capacity;  /* capacity of that kind is missing now: another type/zone/market may work */
} td_aws_error;

const char *td_aws_errkind_name(td_aws_errkind k);
/* Classifies an AWS error code (and HTTP status when the code is empty) into err's kind,
 * retryable and capacity fields. */
void td_aws_error_classify(td_aws_error *err);
/* Parses an EC2 (<Response><Errors><Error>) or S3 (<Error>) error body into err (code, message,
 * request id), classified. TD_ERR_FORMAT when the body is not one. */
td_status td_aws_error_parse(const char *xml, size_t nbytes, int http_status, td_aws_error *err);

/* ---- the client ---- */
typedef struct td_aws td_aws_t;

typedef struct td_aws_opts {
    const char *profile;           /* NULL: AWS_PROFILE, else "default" */
    const char *region;            /* NULL: td_aws_region_load */
    const td_aws_creds *creds;     /* NULL: td_aws_creds_load(profile); copied */
    int max_attempts;              /* per request, 0: 5 */
    int backoff_ms;                /* first retry's base delay, doubling, jittered; 0: 200 */
    int connect_timeout_ms;        /* 0: 10000 */
    int low_speed_timeout_s;       /* a transfer below 1 KiB/s this long stalled: aborted and
                                      not retried; 0: 30 */
    int ec2_page_size;             /* DescribeInstances' MaxResults (5..1000); 0: 1000 */
    int64_t multipart_threshold;   /* bytes: td_s3_put_file above this is multipart; 0: 64 MiB */
    int64_t multipart_part_nbytes; /* bytes per part (>= 5 MiB); 0: 16 MiB */
} td_aws_opts;

td_status td_aws_new(const td_aws_opts *opts, td_aws_t **out) TD_NODISCARD;
void td_aws_free(td_aws_t *aws);
const char *td_aws_region(const td_aws_t *aws);
/* "https://ec2.us-east-1.amazonaws.com" or the override. */
const char *td_aws_endpoint(const td_aws_t *aws, const char *service);
/* The typed form of the last failed call's error (kind NONE after a success). */
const td_aws_error *td_aws_last_error(const td_aws_t *aws);

/* ---- EC2 (Query API, Version=2016-11-15) ---- */
/* The tags tandem puts on what it creates (td_ec2_instance reads them back): the run's id, the
 * project's absolute directory, the node's index. */
#define TD_EC2_TAG_RUN     "tandem:run"
#define TD_EC2_TAG_PROJECT "tandem:project"
#define TD_EC2_TAG_NODE    "tandem:node"
/* A detached run's controller (src/exec/controller.c): tandem:controller=RUN_ID instead of
 * tandem:run, and tandem:store=s3://... its run's store, which tandem gc reads to decide. */
#define TD_EC2_TAG_CONTROLLER "tandem:controller"
#define TD_EC2_TAG_STORE      "tandem:store"
typedef struct td_ec2_tag {
    const char *key;
    const char *value;
} td_ec2_tag;

typedef struct td_ec2_run_spec {
    const char *image_id;      /* required */
    const char *instance_type; /* required */
    int min_count, max_count;  /* 0: 1 */
    const char *key_name;      /* NULL: none */
    const char *subnet_id;
    const char *availability_zone; /* Placement.AvailabilityZone (no subnet: its default one) */
    const char *const *security_group_ids;
    int nsecurity_groups;
    int spot;                         /* InstanceMarketOptions: spot, one-time, terminate */
    const char *spot_max_price;       /* "0.25" (USD/hour); NULL: the on-demand price */
    const char *iam_instance_profile; /* a name, or an ARN ("arn:...") */
    int root_volume_gib;              /* 0: the AMI's; else BlockDeviceMapping of root_device */
    const char *root_device_name;     /* NULL: "/dev/xvda" (Amazon Linux); "/dev/sda1" Ubuntu */
    const char *run_id;               /* tag tandem:run=ID on instances and volumes; NULL: none */
    const td_ec2_tag *tags;           /* more tags */
    int ntags;
    const char *client_token; /* idempotency (<= 64 ASCII); NULL: none */
    const char *user_data;    /* plain text, base64-encoded here; NULL: none */
    int shutdown_terminates;  /* InstanceInitiatedShutdownBehavior=terminate: a shutdown from
                                 inside the instance terminates it (the dead-man's switch) */
} td_ec2_run_spec;

typedef struct td_ec2_instance {
    char id[32];
    char state[24]; /* pending running shutting-down terminated stopping stopped */
    char type[48];
    char image_id[64];
    char lifecycle[16]; /* "spot" or "" (on demand) */
    char private_ip[48];
    char public_ip[48];
    char zone[48];
    char key_name[128];
    char launch_time[40];
    char state_reason[256]; /* "Server.SpotInstanceTermination: ...", "" when none */
    char run_id[96];        /* its tandem:run tag, "" when none */
    char subnet_id[48];
    char project[1024]; /* its tandem:project tag (the project's absolute path), "" when none */
    int node;           /* its tandem:node tag, -1 when none */
    char controller_of[96]; /* its tandem:controller tag (a detached run's id), "" when none */
    char store[257];        /* its tandem:store tag (that run's store, s3://...), "" when none */
} td_ec2_instance;

typedef struct td_ec2_instances {
    td_ec2_instance *items;
    int count;
} td_ec2_instances;
void td_ec2_instances_free(td_ec2_instances *list);

td_status td_ec2_run_instances(td_aws_t *aws, const td_ec2_run_spec *spec,
                               td_ec2_instances *out) TD_NODISCARD;
/* Instances by id (ids, nids > 0), or by the tag tandem:run=run_id, or both; state filters by
 * instance-state-name (NULL: all). Follows NextToken. */
td_status td_ec2_describe_instances(td_aws_t *aws, const char *const *ids, int nids,
                                    const char *run_id, const char *state,
                                    td_ec2_instances *out) TD_NODISCARD;
/* Every instance carrying a tandem:run tag (any value) in one of the states (instance-state-name;
 * nstates 0: all): what `tandem gc` sweeps. Follows NextToken. */
td_status td_ec2_describe_tandem(td_aws_t *aws, const char *const *states, int nstates,
                                 td_ec2_instances *out) TD_NODISCARD;
/* The same for any tag key (TD_EC2_TAG_CONTROLLER: the detached runs' controllers). */
td_status td_ec2_describe_tagged(td_aws_t *aws, const char *tag_key, const char *const *states,
                                 int nstates, td_ec2_instances *out) TD_NODISCARD;
/* out (may be NULL): each instance's id and new state. */
td_status td_ec2_terminate_instances(td_aws_t *aws, const char *const *ids, int nids,
                                     td_ec2_instances *out) TD_NODISCARD;

/* An instance type as DescribeInstanceTypes gives it: what `resources:` is matched against. */
typedef struct td_ec2_type {
    char name[48];
    int vcpus;
    double memory_gib;
    int gpus;               /* 0: none */
    char gpu_model[48];     /* "A10G", "T4", ... ("" without GPUs) */
    double gpu_memory_gib;  /* per GPU */
    char arch[16];          /* "x86_64" when it supports it, else the first it supports */
} td_ec2_type;
/* Every instance type of the region (DescribeInstanceTypes, following NextToken); caller frees
 * *out. */
td_status td_ec2_describe_instance_types(td_aws_t *aws, td_ec2_type **out,
                                         size_t *count) TD_NODISCARD;
td_status td_ec2_parse_instance_types(const char *xml, size_t nbytes, td_ec2_type **items,
                                      size_t *count, char **next_token_out);

/* ---- prices ----
 * The spot price of an instance type in a zone now (DescribeSpotPriceHistory, Linux/UNIX, the
 * newest entry): USD per hour, and EC2's timestamp of that price in when. */
td_status td_ec2_spot_price(td_aws_t *aws, const char *type, const char *zone, double *usd_out,
                            char *when, size_t when_nbytes) TD_NODISCARD;
td_status td_ec2_parse_spot_price(const char *xml, size_t nbytes, double *usd_out, char *when,
                                  size_t when_nbytes);
/* A zone's spot price now: what the zone choice of `resources:` ranks (aws_choose.c). */
typedef struct td_ec2_zone_price {
    char zone[48];
    double usd; /* per hour */
    char when[40]; /* EC2's timestamp of it */
} td_ec2_zone_price;
/* The spot price of type in each zone of the region that has one (DescribeSpotPriceHistory,
 * Linux/UNIX, the newest entry per zone), sorted by zone name; caller frees *out. None at all:
 * TD_ERR_NOTFOUND. */
td_status td_ec2_spot_prices(td_aws_t *aws, const char *type, td_ec2_zone_price **out,
                             size_t *count) TD_NODISCARD;
td_status td_ec2_parse_spot_prices(const char *xml, size_t nbytes, td_ec2_zone_price **out,
                                   size_t *count);
/* The on-demand price (USD per hour, Linux) of type in region: from prices_file when given and
 * it names them (lines "REGION TYPE USD_PER_HOUR", '#' comments, REGION * for any), else from
 * the table built into tandem (prices.c: a few common types, us-east-1, dated there). source
 * says which ("FILE:LINE" or "tandem's table (DATE)"). TD_ERR_NOTFOUND when neither has it; a
 * malformed file is TD_ERR_FORMAT naming the line. */
td_status td_aws_on_demand_price(const char *region, const char *type, const char *prices_file,
                                 double *usd_out, char *source, size_t source_nbytes);

/* ---- the dead-man's switch of an instance (orphan.c; docs/cloud.md) ----
 * Every instance of executor aws runs, from its user data (as root, from boot), a small watch
 * that shuts the instance down (InstanceInitiatedShutdownBehavior=terminate: it is terminated)
 * once its supervisor has gone silent. The supervisor sends each node agent "alive N" at least
 * every td_orphan_heartbeat_s (N: aws.orphan_timeout, more before a replacement is made); the
 * agent sets the modification time of TD_ORPHAN_HEARD_PATH to now + N (src/launch/orphan.c);
 * the watch shuts the instance down once that time has passed, or, while the file does not
 * exist yet, first_contact_s after boot (the instance is still set up, or waits for the others).
 * /dev/shm: writable by every user (the agent runs as aws.user, the watch as root), one per
 * machine, gone at a reboot. */
#define TD_AWS_ORPHAN_TIMEOUT_S 300.0
#define TD_ORPHAN_HEARD_PATH    "/dev/shm/tandem-heard"
/* How often the supervisor speaks, so that a live run is never taken for an orphan. */
double td_orphan_heartbeat_s(double timeout_s);
/* The user data script (#!/bin/sh) of the watch; shutdown_cmd is run through sh when it fires,
 * with TANDEM_ORPHAN_WHY saying why (NULL: TANDEM_SHUTDOWN_CMD, "shutdown -h now" by default).
 * Caller frees. */
char *td_orphan_user_data(double timeout_s, double first_contact_s, const char *shutdown_cmd);

/* Parsers of the responses (pure; the unit tests feed them recorded XML). */
td_status td_ec2_parse_instances(const char *xml, size_t nbytes, td_ec2_instances *out,
                                 char **next_token_out) TD_NODISCARD;

/* ---- S3 ---- */
typedef struct td_s3_url {
    char *bucket;
    char *key; /* "" for s3://bucket or s3://bucket/ */
} td_s3_url;
/* "s3://bucket/prefix/key" -> bucket, key. TD_ERR_INVALID with the reason otherwise (scheme,
 * empty or invalid bucket name, a "." / ".." / empty segment or a control character in the
 * key: it is a prefix used as written, never resolved). Trailing slashes are dropped. */
td_status td_s3_url_parse(const char *url, td_s3_url *out) TD_NODISCARD;
void td_s3_url_free(td_s3_url *u);

typedef struct td_s3_object {
    char *key;
    int64_t nbytes;
    char etag[80];
    char last_modified[40];
    char sha256_hex[65]; /* from x-amz-meta-tandem-sha256 (HEAD/GET), "" when absent */
} td_s3_object;

typedef struct td_s3_list {
    td_s3_object *items;
    int count;
} td_s3_list;
void td_s3_list_free(td_s3_list *list);
void td_s3_object_free(td_s3_object *o);

/* Uploads a file: one PutObject up to the client's multipart threshold, else a multipart upload
 * (aborted on any failure, so no half-written object or orphaned parts remain). Every request
 * carries its body's SHA-256 (x-amz-content-sha256, checked by S3) and MD5 (Content-MD5); the
 * object's SHA-256 is stored as x-amz-meta-tandem-sha256 and returned in sha256_out (may be
 * NULL). */
td_status td_s3_put_file(td_aws_t *aws, const char *bucket, const char *key, const char *path,
                         char sha256_out[65]) TD_NODISCARD;
td_status td_s3_put_buffer(td_aws_t *aws, const char *bucket, const char *key, const void *buf,
                           size_t nbytes) TD_NODISCARD;
/* Downloads to path atomically (a temporary beside it, then rename); when the object carries
 * x-amz-meta-tandem-sha256 the bytes are checked against it and nothing is left on mismatch. */
td_status td_s3_get_file(td_aws_t *aws, const char *bucket, const char *key, const char *path,
                         td_s3_object *info_out) TD_NODISCARD;
/* TD_ERR_NOTFOUND when the key does not exist. */
td_status td_s3_head(td_aws_t *aws, const char *bucket, const char *key,
                     td_s3_object *out) TD_NODISCARD;
/* Every key under prefix (NULL: all), ListObjectsV2 pages of page_size keys (0: 1000). */
td_status td_s3_list_objects(td_aws_t *aws, const char *bucket, const char *prefix, int page_size,
                             td_s3_list *out) TD_NODISCARD;
/* Deleting a key that does not exist succeeds (S3's rule). */
td_status td_s3_delete(td_aws_t *aws, const char *bucket, const char *key) TD_NODISCARD;

/* The parser of a ListObjectsV2 page (appends to out). */
td_status td_s3_parse_list(const char *xml, size_t nbytes, td_s3_list *out,
                           char **continuation_out) TD_NODISCARD;

#ifdef __cplusplus
}
#endif
#endif /* TANDEM_CLOUD_H */
