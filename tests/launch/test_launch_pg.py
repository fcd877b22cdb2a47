"""launch + comm: workers build tandem's own process group from the launcher's environment
(td_pg_init_from_env: RANK, WORLD_SIZE, TANDEM_STORE_ADDR, TANDEM_TOKEN, TANDEM_RUN_ID,
TANDEM_RESTART_COUNT) and allreduce, in the first attempt and after a restart."""
import os

from launchtest import check, check_eq, launch, tmpdir, write_script

worker = os.path.join(os.environ.get("TANDEM_BUILD_DIR", "build"), "tests", "launch", "pg_worker")
check(os.access(worker, os.X_OK), f"{worker} is not built")

rc, out, err, _ = launch(["--nproc-per-node", "3", "--", worker], timeout=120)
check_eq(rc, 0, f"exit code (stderr: {err[-3000:]!r})")
for r in range(3):
    check(f"[rank {r}] pg ok rank {r} of 3 restart 0" in out, f"rank {r} missing in {out!r}")

# After a restart the group forms again in a fresh namespace of the same store.
d = tmpdir()
flaky = write_script(d, "flaky.sh", f"""#!/bin/bash
[ "$TANDEM_RESTART_COUNT" = 0 ] && [ "$RANK" = 0 ] && exit 9
exec {worker}
""")
rc, out, err, _ = launch(["--nproc-per-node", "2", "--max-restarts", "1", "--", flaky],
                         timeout=120)
check_eq(rc, 0, f"exit code with a restart (stderr: {err[-3000:]!r})")
for r in range(2):
    check(f"[rank {r}] pg ok rank {r} of 2 restart 1" in out, f"rank {r} missing in {out!r}")
print("test_launch_pg: ok")
