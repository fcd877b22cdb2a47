/* The node agent's part of the dead-man's switch (tandem/cloud.h, docs/cloud.md). */
#ifndef TANDEM_LAUNCH_ORPHAN_H
#define TANDEM_LAUNCH_ORPHAN_H

/* The supervisor's "alive N" (args: "N", seconds): with TANDEM_ORPHAN_HEARD set, that file's
 * modification time becomes now + N, the moment by which the supervisor promised to speak
 * again; the instance's watch shuts the instance down once it has passed. Without the variable,
 * nothing. A failure is one warning (the switch then ends the instance when its time comes:
 * say so loudly). Thread-safe (the link's thread calls it). */
void td__orphan_heard(const char *args);

#endif
