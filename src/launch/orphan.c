/* The node agent's part of the dead-man's switch (src/cloud/orphan.c has the instance's watch
 * and says why it is split so): each "alive N" line of the supervisor moves the time of the file
 * TANDEM_ORPHAN_HEARD to now + N. Only what the supervisor really sends counts: a live run that
 * prints nothing for hours still hears "alive" every few seconds, and a supervisor that is gone
 * (killed, its machine off, the network cut) sends nothing more. */
#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "orphan.h"

#include "tandem/core.h"

void td__orphan_heard(const char *args) {
    static atomic_int warned;
    const char *path = td_var_get(TD_VAR_TANDEM_ORPHAN_HEARD);
    if (!path) return;
    double n = 0;
    if (td_parse_f64("the supervisor's 'alive' seconds", args, &n) != TD_OK || !(n > 0) ||
        n > 7 * 86400.0) {
        td_error_clear();
        if (!atomic_exchange(&warned, 1))
            TD_LOG_WARN("the supervisor sent 'alive %.40s', which is not 'alive SECONDS'; is "
                        "this agent's tandem the supervisor's version?",
                        args);
        return;
    }
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    struct timespec ts[2] = {now, {now.tv_sec + (time_t)n, now.tv_nsec}};
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    int ok = fd >= 0 && futimens(fd, ts) == 0;
    int err = errno;
    if (fd >= 0) close(fd);
    if (!ok && !atomic_exchange(&warned, 1))
        TD_LOG_WARN("the dead-man's switch: cannot set the time of %s (%s) (%s): this instance "
                    "will shut itself down as if its supervisor were gone",
                    path, td_var_name(TD_VAR_TANDEM_ORPHAN_HEARD), strerror(err));
}
