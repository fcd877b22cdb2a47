/* The dead-man's switch of an instance (docs/cloud.md, "The dead-man's switch"): the user data
 * that makes every instance of executor aws end itself once its supervisor is gone.
 *
 * Why user data, as root, and not the node agent itself: the agent comes and goes (it exits at
 * the end of every attempt, and when its ssh connection ends it stops its workers and exits),
 * it runs as aws.user, who may not be allowed to shut the machine down, and it only exists once
 * the instance is set up. The watch below is armed from boot, outlives every agent, and only
 * reads one file's time: the agent's part is to move that time forward at each "alive N" line
 * of its supervisor (src/launch/orphan.c): the file's modification time is the moment by which
 * the supervisor promised to speak again. Past it, the instance shuts itself down, and with
 * InstanceInitiatedShutdownBehavior=terminate (td_ec2_run_spec.shutdown_terminates) EC2
 * terminates it: nothing bills for a supervisor that is gone, whoever runs tandem again or not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tandem/cloud.h"
#include "tandem/core.h"

double td_orphan_heartbeat_s(double timeout_s) {
    /* four chances per timeout: one lost or late line never ends a live run */
    double p = timeout_s / 4;
    return p < 1 ? 1 : p > 30 ? 30 : p;
}

/* s in single quotes for sh: ' becomes '\'' */
static char *sh_quote(const char *s) {
    size_t n = 2;
    for (const char *p = s; *p; p++) n += *p == '\'' ? 4 : 1;
    char *q = td_xcalloc(n + 1, 1), *o = q;
    *o++ = '\'';
    for (const char *p = s; *p; p++) {
        if (*p == '\'') {
            memcpy(o, "'\\''", 4);
            o += 4;
        } else {
            *o++ = *p;
        }
    }
    *o = '\'';
    return q;
}

char *td_orphan_user_data(double timeout_s, double first_contact_s, const char *shutdown_cmd) {
    if (!shutdown_cmd || !*shutdown_cmd) shutdown_cmd = td_env_str(TD_ENV_SHUTDOWN_CMD);
    char *cmd = sh_quote(shutdown_cmd);
    /* The loop in the background, its output in /dev/shm (cloud-init waits for the script's
     * output to close: the script itself returns at once). `stat -c %Y` is GNU's and
     * busybox's. A shutdown command that fails is tried again every minute. */
    char *script = td_xasprintf(
        "#!/bin/sh\n"
        "# tandem's dead-man's switch (docs/cloud.md): this instance shuts itself down, and EC2\n"
        "# terminates it (InstanceInitiatedShutdownBehavior=terminate), when its supervisor has\n"
        "# not been heard from for aws.orphan_timeout (%.0f s): the node agent sets the time of\n"
        "# %s to when the supervisor promised to speak again.\n"
        "heard=%s first=%.0f\n"
        "(\n"
        "  deadline=$(( $(date +%%s) + first ))\n"
        "  echo \"tandem: the dead-man's switch is armed: first word from the supervisor due by "
        "$deadline (epoch s)\"\n"
        "  while :; do\n"
        "    if [ -e \"$heard\" ]; then d=$(stat -c %%Y \"$heard\" 2>/dev/null) && "
        "deadline=$d; fi\n"
        "    now=$(date +%%s)\n"
        "    [ \"$now\" -ge \"$deadline\" ] && break\n"
        "    sleep 2\n"
        "  done\n"
        "  TANDEM_ORPHAN_WHY=\"no word from the supervisor since it said it would speak by "
        "$deadline (now $now, epoch s)\"\n"
        "  export TANDEM_ORPHAN_WHY\n"
        "  echo \"tandem: $TANDEM_ORPHAN_WHY: shutting this instance down\"\n"
        "  until sh -c %s; do sleep 60; done\n"
        ") </dev/null >>/dev/shm/tandem-orphan.log 2>&1 &\n",
        timeout_s, TD_ORPHAN_HEARD_PATH, TD_ORPHAN_HEARD_PATH, first_contact_s, cmd);
    free(cmd);
    return script;
}
