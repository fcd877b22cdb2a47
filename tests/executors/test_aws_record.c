/* executors: executor aws's record of a run's instances (RUN/instances.json, src/exec/aws_record.c)
 * and the gates of its orphan handling (src/exec/aws_gc.c) that need no AWS:
 *   - the record's format (the example of docs/cloud.md read field by field), a write read back
 *     equal, nulls, put/update/end (the first end stays), a missing file, malformed ones named;
 *   - lifetimes and instance-hours, ended and live, and the run's total;
 *   - EC2's launch time, an instance described by EC2 (its tandem:project/node tags, subnet,
 *     spot lifecycle) as a record entry;
 *   - cancel_orphan and the check of tandem ps make no AWS call for a run without a record, with
 *     nothing alive in it, or whose lock is held (a live supervisor); with the lock free they do
 *     (here against a closed port: the failure is a warning naming the run and tandem gc). */
#include "test.h"

#include <fcntl.h>
#include <stdlib.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "exec/aws_internal.h"

static char tmp[] = "/tmp/td-aws-record-XXXXXX";

static const char *example =
    "{\"provider\": \"aws\", \"region\": \"us-east-1\",\n"
    " \"instances\": [\n"
    "   {\"id\": \"i-0abc\", \"node\": 1, \"type\": \"t3.micro\", \"market\": \"spot\", "
    "\"subnet\": \"subnet-1\", \"zone\": \"us-east-1a\",\n"
    "    \"launched_s\": 1764000000.1, \"ended_s\": 1764000300.5, \"end\": \"interrupted (spot "
    "instance-action terminate)\",\n"
    "    \"replaces\": null, \"state\": \"terminated\"},\n"
    "   {\"id\": \"i-0def\", \"node\": 1, \"type\": \"t3.micro\", \"market\": \"on-demand\", "
    "\"subnet\": \"subnet-2\", \"zone\": \"us-east-1b\",\n"
    "    \"launched_s\": 1764000310.0, \"ended_s\": null, \"end\": null, \"replaces\": "
    "\"i-0abc\", \"state\": \"running\"}\n"
    " ]}\n";

static void test_format(void) {
    td_run_instances r;
    ASSERT_OK(td__aws_record_parse(example, "x.json", &r));
    ASSERT_STREQ(r.provider, "aws");
    ASSERT_STREQ(r.region, "us-east-1");
    ASSERT_EQ((int)r.count, 2);
    const td_run_instance *a = &r.items[0], *b = &r.items[1];
    ASSERT_STREQ(a->id, "i-0abc");
    ASSERT_EQ(a->node, 1);
    ASSERT_STREQ(a->type, "t3.micro");
    ASSERT_STREQ(a->market, "spot");
    ASSERT_STREQ(a->subnet, "subnet-1");
    ASSERT_STREQ(a->zone, "us-east-1a");
    ASSERT_NEAR(a->launched_s, 1764000000.1, 1e-6);
    ASSERT_NEAR(a->ended_s, 1764000300.5, 1e-6);
    ASSERT_STREQ(a->end, "interrupted (spot instance-action terminate)");
    ASSERT_STREQ(a->replaces, "");
    ASSERT_STREQ(a->state, "terminated");
    ASSERT_EQ(td_run_instance_live(a), 0);
    ASSERT_STREQ(b->replaces, "i-0abc");
    ASSERT_EQ(b->ended_s, 0.0);
    ASSERT(b->end == NULL);
    ASSERT_EQ(td_run_instance_live(b), 1);

    /* Lifetimes: an ended one is its span, a live one runs to now. */
    ASSERT_NEAR(td_run_instance_lifetime_s(a, 1764009999), 300.4, 1e-6);
    ASSERT_NEAR(td_run_instance_lifetime_s(b, 1764000310 + 7200), 7200, 1e-6);
    ASSERT_NEAR(td_run_instances_hours(&r, 1764000310 + 7200), (300.4 + 7200) / 3600, 1e-9);
    td_run_instance unknown = {.launched_s = 0};
    ASSERT_EQ(td_run_instance_lifetime_s(&unknown, 1e9), 0.0);

    /* Written and read back: the same values, nulls as nulls. */
    ASSERT_OK(td__aws_record_write(tmp, &r));
    td_run_instances back;
    ASSERT_OK(td_run_instances_read(tmp, &back));
    ASSERT_EQ((int)back.count, 2);
    for (size_t i = 0; i < 2; i++) {
        const td_run_instance *x = &r.items[i], *y = &back.items[i];
        ASSERT_STREQ(x->id, y->id);
        ASSERT_EQ(x->node, y->node);
        ASSERT_STREQ(x->type, y->type);
        ASSERT_STREQ(x->market, y->market);
        ASSERT_STREQ(x->subnet, y->subnet);
        ASSERT_STREQ(x->zone, y->zone);
        ASSERT_NEAR(x->launched_s, y->launched_s, 1e-6);
        ASSERT_NEAR(x->ended_s, y->ended_s, 1e-6);
        ASSERT((x->end == NULL) == (y->end == NULL));
        if (x->end) ASSERT_STREQ(x->end, y->end);
        ASSERT_STREQ(x->replaces, y->replaces);
        ASSERT_STREQ(x->state, y->state);
    }
    char *text = td__aws_record_dump(&back);
    ASSERT_CONTAINS(text, "\"ended_s\": null");
    ASSERT_CONTAINS(text, "\"replaces\": \"i-0abc\"");
    ASSERT_CONTAINS(text, "\"launched_s\": 1764000000.1");
    free(text);
    /* Nothing left beside it (the atomic write's temporary). */
    char *cmd = td_xasprintf("test $(ls -A %s | wc -l) = 1", tmp);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    td_run_instances_clear(&back);
    td_run_instances_clear(&r);
}

static void test_changes(void) {
    char *dir = td_xasprintf("%s/run2", tmp);
    ASSERT_EQ(mkdir(dir, 0755), 0);
    td_run_instances r;
    ASSERT_STATUS(td_run_instances_read(dir, &r), TD_ERR_NOTFOUND);
    td_error_clear();
    /* update on a missing record creates it with the region */
    td_run_instance in = {.node = 0, .launched_s = 1000, .ended_s = 0};
    snprintf(in.id, sizeof in.id, "i-1");
    snprintf(in.type, sizeof in.type, "g5.xlarge");
    snprintf(in.market, sizeof in.market, "spot");
    snprintf(in.state, sizeof in.state, "pending");
    ASSERT_OK(td__aws_record_update(dir, "eu-west-1", &in, 1));
    snprintf(in.state, sizeof in.state, "running"); /* the same id again: updated, not added */
    td_run_instance in2 = in;
    snprintf(in2.id, sizeof in2.id, "i-2");
    in2.node = 1;
    td_run_instance both[2] = {in, in2};
    ASSERT_OK(td__aws_record_update(dir, "ignored-once-set", both, 2));
    ASSERT_OK(td_run_instances_read(dir, &r));
    ASSERT_STREQ(r.provider, "aws");
    ASSERT_STREQ(r.region, "eu-west-1");
    ASSERT_EQ((int)r.count, 2);
    ASSERT_STREQ(r.items[0].state, "running");
    ASSERT_EQ(r.items[1].node, 1);
    /* ends: the first one stays, the state follows EC2 */
    ASSERT_EQ(td__aws_record_end(&r, "i-1", 4600, "interrupted (spot)", NULL), 0);
    ASSERT_EQ(td__aws_record_end(&r, "i-1", 9000, TD__AWS_END_GC, "terminated"), 0);
    ASSERT_EQ(td__aws_record_end(&r, "i-9", 9000, TD__AWS_END_GC, NULL), -1);
    ASSERT_STREQ(r.items[0].end, "interrupted (spot)");
    ASSERT_EQ(r.items[0].ended_s, 4600.0);
    ASSERT_STREQ(r.items[0].state, "terminated");
    ASSERT_NEAR(td_run_instance_lifetime_s(&r.items[0], 1e10), 3600, 1e-9);
    ASSERT_NEAR(td_run_instances_hours(&r, 1000 + 1800), 1.0 + 0.5, 1e-9);
    td_run_instances_clear(&r);

    /* malformed records: named, with the field */
    ASSERT_STATUS(td__aws_record_parse("[1]", "RUN/instances.json", &r), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "RUN/instances.json");
    ASSERT_STATUS(td__aws_record_parse("{\"instances\": [{\"node\": 1}]}", "R.json", &r),
                  TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "instances[0] has no \"id\"");
    ASSERT_STATUS(td__aws_record_parse("{\"region\": \"x\"}", "R.json", &r), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "\"instances\"");
    ASSERT_STATUS(td__aws_record_parse("{\"instances\": [", "R.json", &r), TD_ERR_FORMAT);
    ASSERT_CONTAINS(td_error_msg(), "R.json: line");
    td_error_clear();
    free(dir);
}

static void test_ec2(void) {
    /* 2026-11-26T15:00:00Z = 1795705200 (date -u -d ... +%s) */
    ASSERT_NEAR(td__aws_parse_time("2026-11-26T15:00:00.000Z"), 1795705200.0, 1e-6);
    ASSERT_NEAR(td__aws_parse_time("2026-11-26T15:00:01.500Z"), 1795705201.5, 1e-6);
    ASSERT_EQ(td__aws_parse_time("yesterday"), 0.0);
    const char *xml =
        "<DescribeInstancesResponse><reservationSet><item><instancesSet><item>"
        "<instanceId>i-0aa</instanceId><instanceState><name>running</name></instanceState>"
        "<instanceType>t3.micro</instanceType><instanceLifecycle>spot</instanceLifecycle>"
        "<subnetId>subnet-9</subnetId><placement><availabilityZone>us-east-1c</availabilityZone>"
        "</placement><launchTime>2026-11-26T15:00:00.000Z</launchTime><tagSet>"
        "<item><key>tandem:run</key><value>train-4</value></item>"
        "<item><key>tandem:project</key><value>/home/u/proj</value></item>"
        "<item><key>tandem:node</key><value>3</value></item>"
        "</tagSet></item><item><instanceId>i-0bb</instanceId><tagSet>"
        "<item><key>tandem:node</key><value>x7</value></item></tagSet></item>"
        "</instancesSet></item></reservationSet></DescribeInstancesResponse>";
    td_ec2_instances l = {0};
    ASSERT_OK(td_ec2_parse_instances(xml, strlen(xml), &l, NULL));
    ASSERT_EQ(l.count, 2);
    ASSERT_STREQ(l.items[0].run_id, "train-4");
    ASSERT_STREQ(l.items[0].project, "/home/u/proj");
    ASSERT_EQ(l.items[0].node, 3);
    ASSERT_EQ(l.items[1].node, -1); /* a tag that is not an index stays unknown */
    td_run_instance in;
    td__aws_instance_from_ec2(&l.items[0], &in);
    ASSERT_STREQ(in.id, "i-0aa");
    ASSERT_EQ(in.node, 3);
    ASSERT_STREQ(in.market, "spot");
    ASSERT_STREQ(in.subnet, "subnet-9");
    ASSERT_STREQ(in.zone, "us-east-1c");
    ASSERT_STREQ(in.state, "running");
    ASSERT_NEAR(in.launched_s, 1795705200.0, 1e-6);
    ASSERT(in.end == NULL && in.ended_s == 0);
    td__aws_instance_from_ec2(&l.items[1], &in);
    ASSERT_STREQ(in.market, "on-demand");
    td_ec2_instances_free(&l);
    char buf[32];
    td__aws_fmt_lifetime(0.4 * 3600, buf, sizeof buf);
    ASSERT_STREQ(buf, "up 0.40 h");
    td__aws_fmt_lifetime(12.46 * 3600, buf, sizeof buf);
    ASSERT_STREQ(buf, "up 12.5 h");
}

/* A record with one live instance in run_dir. */
static void live_record(const char *run_dir) {
    td_run_instance in = {.node = 0, .launched_s = td_wall_s() - 60};
    snprintf(in.id, sizeof in.id, "i-0live");
    snprintf(in.state, sizeof in.state, "running");
    ASSERT_OK(td__aws_record_update(run_dir, "us-east-1", &in, 1));
}

static void test_orphan_gates(void) {
    /* Any AWS call would fail (a closed port): an OK with nothing cancelled proves none was
     * made. */
    setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE", 1);
    setenv("AWS_SECRET_ACCESS_KEY", "secret", 1);
    setenv("AWS_REGION", "us-east-1", 1);
    setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1", 1);
    setenv("AWS_EC2_METADATA_DISABLED", "true", 1);
    char *project = td_xasprintf("%s/proj", tmp);
    ASSERT_EQ(mkdir(project, 0755), 0);
    td_rundb *store;
    ASSERT_OK(td_rundb_open(project, &store));
    td_run_spec spec = {.workflow = "w", .command = "true", .nodes = 1, .nproc_per_node = 1};
    td_run run;
    ASSERT_OK(td_run_create(store, &spec, &run));
    int cancelled = -1;
    char buf[512];
    /* no record: not an aws run */
    ASSERT_OK(td__aws_cancel_orphan(&run, &cancelled, buf, sizeof buf));
    ASSERT_EQ(cancelled, 0);
    int n = -1;
    td_gc_orphans(store, stderr, &n);
    ASSERT_EQ(n, 0);
    /* a record whose instances all ended */
    td_run_instance done = {.node = 0, .launched_s = 1000, .ended_s = 2000};
    snprintf(done.id, sizeof done.id, "i-0done");
    snprintf(done.state, sizeof done.state, "terminated");
    ASSERT_OK(td__aws_record_update(run.run_dir, "us-east-1", &done, 1));
    ASSERT_OK(td__aws_cancel_orphan(&run, &cancelled, buf, sizeof buf));
    ASSERT_EQ(cancelled, 0);
    /* a live instance, but the lock is held: the supervisor lives */
    live_record(run.run_dir);
    char *lock = td_run_path(run.run_dir, TD_RUN_PATH_LOCK);
    int fd = open(lock, O_RDWR | O_CREAT, 0644);
    ASSERT(fd >= 0);
    ASSERT_EQ(flock(fd, LOCK_EX | LOCK_NB), 0);
    ASSERT_OK(td__aws_cancel_orphan(&run, &cancelled, buf, sizeof buf));
    ASSERT_EQ(cancelled, 0);
    char *cap = td_xasprintf("%s/stderr", tmp);
    test_capture_begin(cap);
    td_gc_orphans(store, stderr, &n);
    char *said = test_capture_end();
    ASSERT_EQ(n, 0);
    ASSERT_STREQ(said, "");
    free(said);
    /* the lock free: now it asks AWS (and says why it could not) */
    close(fd);
    test_capture_begin(cap);
    td_gc_orphans(store, stderr, &n);
    said = test_capture_end();
    ASSERT_EQ(n, 0);
    ASSERT_CONTAINS(said, run.id);
    ASSERT_CONTAINS(said, "supervisor is gone");
    ASSERT_CONTAINS(said, "tandem gc");
    free(said);
    td_status st = td__aws_cancel_orphan(&run, &cancelled, buf, sizeof buf);
    ASSERT(st != TD_OK);
    ASSERT_CONTAINS(td_error_msg(), "tandem gc");
    td_error_clear();
    /* the record still says the instance lives: nothing was made up */
    td_run_instances r;
    ASSERT_OK(td_run_instances_read(run.run_dir, &r));
    ASSERT(td_run_instance_live(td__aws_record_find(&r, "i-0live")));
    td_run_instances_clear(&r);
    free(cap);
    free(lock);
    td_run_clear(&run);
    td_rundb_close(store);
    free(project);
}

int main(void) {
    ASSERT(mkdtemp(tmp));
    test_format();
    test_changes();
    test_ec2();
    test_orphan_gates();
    char *cmd = td_xasprintf("rm -rf %s", tmp);
    ASSERT_EQ(system(cmd), 0);
    free(cmd);
    TEST_PASS();
}
