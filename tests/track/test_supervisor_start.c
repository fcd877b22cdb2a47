/* track: a run's supervisor is one process, not one pid (chaos review: "tandem stop a-1 stopped
 * a-2": a-1's supervisor had died, the kernel handed its pid to a-2's supervisor, and the
 * liveness check, "alive and its command line names tandem", took it for a-1's). The store
 * records the supervisor's start time (field 22 of /proc/PID/stat) beside its pid; the pid then
 * counts only while the process holding it started at that time.
 *   - td_run_set_supervisor records the start time, read after the last ')' of /proc/PID/stat
 *     (the command name before it may hold spaces and parentheses), and run.json carries it;
 *   - a run whose pid is now held by another process, one whose command line names tandem, is
 *     reaped as failed ("is gone"), and that process is left alone;
 *   - a supervisor that exited and was not waited for (a zombie) is gone, as before;
 *   - td_run_signal_supervisor, a stop's signal, reaches the recorded process and nothing else;
 *   - an index made before the column existed is migrated when opened (its rows: start 0), and a
 *     row without a start time falls back to the old check. */
#include "track_test.h"

#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static char project[] = "/tmp/tandem-test-supstart-XXXXXX";
static char db_path[512];

/* Field 22 of /proc/PID/stat, parsed here independently of the store: the fields after the
 * command name, which ends at the last ')' of the line. */
static int64_t start_of(pid_t pid) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f) TEST_FAIL("cannot read %s", path);
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    ASSERT(p);
    long long v = -1;
    /* state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime
     * cstime priority nice threads itrealvalue starttime */
    int got = sscanf(p + 1,
                     " %*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %*u %*u %*d %*d %*d %*d %*d "
                     "%*d %lld",
                     &v);
    ASSERT_EQ(got, 1);
    return (int64_t)v;
}

static void sleep_ms(int ms) {
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* A child whose command name (comm) holds spaces and parentheses, as the store must cope with,
 * sleeping until killed. */
static pid_t spawn_odd_comm(void) {
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        prctl(PR_SET_NAME, "x) 1 2 (y) 3", 0, 0, 0);
        for (;;) pause();
    }
    char path[64], comm[64] = "";
    snprintf(path, sizeof path, "/proc/%d/comm", (int)pid);
    for (int i = 0; i < 200 && !strstr(comm, "x) 1"); i++) {
        FILE *f = fopen(path, "r");
        if (f) {
            size_t n = fread(comm, 1, sizeof comm - 1, f);
            comm[n] = '\0';
            fclose(f);
        }
        if (!strstr(comm, "x) 1")) sleep_ms(10);
    }
    ASSERT_CONTAINS(comm, "x) 1 2 (y) 3");
    return pid;
}

/* A live process unrelated to any run, named `name` in its command line ("NAME 600"): sleep
 * started with argv[0] = name. */
static pid_t spawn_named(const char *name) {
    pid_t pid = fork();
    ASSERT(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);  /* a failed assertion leaves nothing behind */
        execlp("sleep", name, "600", (char *)NULL); /* argv[0] = name, as `exec -a` does */
        _exit(127);
    }
    char path[64], cmd[256] = "";
    size_t len = strlen(name);
    snprintf(path, sizeof path, "/proc/%d/cmdline", (int)pid);
    for (int i = 0; i < 300 && strncmp(cmd, name, len); i++) {
        FILE *f = fopen(path, "r");
        if (f) {
            size_t n = fread(cmd, 1, sizeof cmd - 1, f);
            cmd[n] = '\0';
            fclose(f);
        }
        if (strncmp(cmd, name, len)) sleep_ms(10);
    }
    if (strncmp(cmd, name, len)) TEST_FAIL("sleep did not start as '%s': got '%s'", name, cmd);
    return pid;
}

static int alive(pid_t pid) {
    int status;
    return waitpid(pid, &status, WNOHANG) == 0;
}

static void sql(const char *text) {
    sqlite3 *db = NULL;
    ASSERT_EQ(sqlite3_open(db_path, &db), SQLITE_OK);
    sqlite3_busy_timeout(db, 5000);
    char *err = NULL;
    if (sqlite3_exec(db, text, NULL, NULL, &err) != SQLITE_OK)
        TEST_FAIL("sqlite: %s: %s", text, err ? err : "?");
    sqlite3_close(db);
}

static int64_t json_start(const char *run_dir) {
    char *path = td_xasprintf("%s/run.json", run_dir);
    json_error_t jerr;
    json_t *o = json_load_file(path, 0, &jerr);
    if (!o) TEST_FAIL("%s: %s", path, jerr.text);
    json_t *v = json_object_get(o, "supervisor_start");
    int64_t s = json_is_integer(v) ? json_integer_value(v) : -1;
    json_decref(o);
    free(path);
    return s;
}

static td_run make_running(td_rundb *store, const char *workflow, pid_t sup) {
    td_run_spec spec = {.workflow = workflow,
                        .command = "sleep 1",
                        .params_json = NULL,
                        .nodes = 1,
                        .nproc_per_node = 1};
    td_run r;
    ASSERT_OK(td_run_create(store, &spec, &r));
    ASSERT_OK(td_run_set_supervisor(store, r.id, sup));
    ASSERT_OK(td_run_set_status(store, r.id, TD_RUN_RUNNING, -2, NULL));
    td_run cur;
    ASSERT_OK(td_run_find(store, r.id, &cur));
    td_run_clear(&r);
    return cur;
}

int main(void) {
    ASSERT(mkdtemp(project));
    snprintf(db_path, sizeof db_path, "%s/.tandem/runs.db", project);
    td_rundb *store;
    ASSERT_OK(td_rundb_open(project, &store));

    /* ---- the start time as recorded: right, despite an odd command name ---- */
    pid_t odd = spawn_odd_comm();
    int64_t odd_start = start_of(odd);
    ASSERT_GT(odd_start, 0);
    td_run a = make_running(store, "a", odd);
    ASSERT_EQ(a.supervisor_pid, odd);
    ASSERT_EQ(a.supervisor_start, odd_start);
    ASSERT_EQ(json_start(a.run_dir), odd_start);
    /* the live supervisor, its start time matching, is not reaped (its comm names no tandem) */
    ASSERT_OK(td_run_reap_stale(store, &a));
    ASSERT_EQ(a.status, TD_RUN_RUNNING);

    /* ---- the same pid, now held by another process: gone, and nobody is signalled ---- */
    /* Start times are clock ticks (10 ms): a process born in odd's tick would share its start
     * time and pass for it, so fake must be born in a later one. */
    pid_t fake = spawn_named("tandem-fake");
    while (start_of(fake) == odd_start) {
        kill(fake, SIGKILL);
        waitpid(fake, NULL, 0);
        usleep(10000);
        fake = spawn_named("tandem-fake");
    }
    td_run b = make_running(store, "b", odd);
    /* b's supervisor died and its pid went to `fake` (which names tandem): the row keeps the
     * dead supervisor's start time and now names fake's pid. */
    char *q = td_xasprintf("UPDATE runs SET supervisor_pid = %d WHERE id = '%s'", (int)fake, b.id);
    sql(q);
    free(q);
    td_run_clear(&b);
    ASSERT_OK(td_run_find(store, "b-1", &b));
    ASSERT_EQ(b.supervisor_pid, fake);
    ASSERT_NE(b.supervisor_start, start_of(fake));
    ASSERT_OK(td_run_reap_stale(store, &b));
    ASSERT_EQ(b.status, TD_RUN_FAILED);
    ASSERT_CONTAINS(b.note, "is gone");
    ASSERT_CONTAINS(b.note, "another process");
    ASSERT(alive(fake));
    ASSERT(alive(odd));
    /* td_run_signal_supervisor (a stop's signal) reaches the recorded process only */
    errno = 0;
    ASSERT_EQ(td_run_signal_supervisor(&b, SIGTERM), -1);
    ASSERT_EQ(errno, ESRCH);
    sleep_ms(50);
    ASSERT(alive(fake));
    ASSERT_EQ(td_run_signal_supervisor(&a, 0), 0);
    td_run_clear(&b);

    /* ---- a supervisor that died and was not waited for yet (a zombie) is gone ---- */
    int gate[2];
    ASSERT_EQ(pipe(gate), 0);
    pid_t zombie = fork();
    ASSERT(zombie >= 0);
    if (zombie == 0) {
        char c;
        close(gate[1]);
        ssize_t got = read(gate[0], &c, 1);
        _exit(got < 0 ? 1 : 0);
    }
    close(gate[0]);
    td_run z = make_running(store, "z", zombie);
    ASSERT_GT(z.supervisor_start, 0);
    close(gate[1]); /* the child exits; nobody waits for it yet */
    char zpath[64], zstat[512] = "";
    snprintf(zpath, sizeof zpath, "/proc/%d/stat", (int)zombie);
    for (int i = 0; i < 300 && !strstr(zstat, ") Z "); i++) {
        FILE *f = fopen(zpath, "r");
        if (f) {
            size_t n = fread(zstat, 1, sizeof zstat - 1, f);
            zstat[n] = '\0';
            fclose(f);
        }
        if (!strstr(zstat, ") Z ")) sleep_ms(10);
    }
    ASSERT_CONTAINS(zstat, ") Z ");
    ASSERT_OK(td_run_reap_stale(store, &z));
    ASSERT_EQ(z.status, TD_RUN_FAILED);
    ASSERT_EQ(waitpid(zombie, NULL, 0), zombie);
    td_run_clear(&z);

    /* ---- the rebuild carries the start time from run.json ---- */
    td_rundb_close(store);
    track_test_remove_index(project);
    ASSERT_OK(td_rundb_open(project, &store));
    td_run back;
    ASSERT_OK(td_run_find(store, "a-1", &back));
    ASSERT_EQ(back.status, TD_RUN_RUNNING); /* still its live supervisor */
    ASSERT_EQ(back.supervisor_start, odd_start);
    td_run_clear(&back);
    td_rundb_close(store);

    /* ---- an index from before the column: migrated on open, and the old check for its rows ----
     */
    sql("ALTER TABLE runs DROP COLUMN supervisor_start");
    char *set = td_xasprintf("UPDATE runs SET status = 'running', ended = 0, supervisor_pid = %d "
                             "WHERE id = 'b-1'",
                             (int)fake);
    sql(set);
    free(set);
    pid_t plain = spawn_named("plain-sleep");
    set = td_xasprintf("UPDATE runs SET supervisor_pid = %d WHERE id = 'a-1'", (int)plain);
    sql(set);
    free(set);
    ASSERT_OK(td_rundb_open(project, &store));
    ASSERT_OK(td_run_find(store, "b-1", &back));
    ASSERT_EQ(back.supervisor_start, 0);
    /* no start time: alive and named tandem is all it can go by (today's check) */
    ASSERT_OK(td_run_reap_stale(store, &back));
    ASSERT_EQ(back.status, TD_RUN_RUNNING);
    td_run_clear(&back);
    ASSERT_OK(td_run_find(store, "a-1", &back));
    ASSERT_EQ(back.supervisor_start, 0); /* the migrated rows do not know theirs */
    /* ...and a row without one whose pid runs something that is not tandem is gone */
    ASSERT_OK(td_run_reap_stale(store, &back));
    ASSERT_EQ(back.status, TD_RUN_FAILED);
    ASSERT(alive(plain));
    td_run_clear(&back);
    /* a new supervisor record on the migrated index has its start time again */
    ASSERT_OK(td_run_set_supervisor(store, "b-1", odd));
    ASSERT_OK(td_run_find(store, "b-1", &back));
    ASSERT_EQ(back.supervisor_start, odd_start);
    td_run_clear(&back);
    td_rundb_close(store);

    /* the supervisor itself gets the signal; once it is gone, nobody does */
    ASSERT_EQ(td_run_signal_supervisor(&a, SIGKILL), 0);
    ASSERT_EQ(waitpid(odd, NULL, 0), odd);
    errno = 0;
    ASSERT_EQ(td_run_signal_supervisor(&a, SIGTERM), -1);
    ASSERT_EQ(errno, ESRCH);
    pid_t kids[] = {fake, plain};
    for (size_t i = 0; i < TD_ARRAY_LEN(kids); i++) {
        kill(kids[i], SIGKILL);
        waitpid(kids[i], NULL, 0);
    }
    td_run_clear(&a);
    char *rm = td_xasprintf("rm -rf '%s'", project);
    ASSERT_EQ(system(rm), 0);
    free(rm);
    TEST_PASS();
}
