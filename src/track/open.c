/* Opening the run store: a connection to runs.db (store.c) that rebuilds the index from the
 * run directories (rebuild.c) when it finds it lost. The connection knows the rebuild only as
 * this hook, so the database layer does not depend on the files above it. */
#include "store_internal.h"

td_status td_rundb_open(const char *project_dir, td_rundb **out) {
    return td_rundb_open_ex(project_dir, 0, out);
}

td_status td_rundb_open_ex(const char *project_dir, unsigned flags, td_rundb **out) {
    return td__rundb_connect(project_dir, flags, td_rundb_rebuild, out);
}
