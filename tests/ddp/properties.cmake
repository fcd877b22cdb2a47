# The reducer test forks ranks around a store; it takes well under a second but must never hang.
set_tests_properties(ddp/test_reducer PROPERTIES TIMEOUT 120)
# Kills a worker and times how fast the launcher notices (2 s): keep it off a loaded box.
set_tests_properties(ddp/test_failure_restart PROPERTIES RUN_SERIAL TRUE TIMEOUT 300)
# Network namespaces as hosts (root only; skips with 77 otherwise); its launchers bind a fixed
# port inside private namespaces, and it runs 4 trainer processes.
set_tests_properties(ddp/test_multinode_train PROPERTIES RUN_SERIAL TRUE TIMEOUT 300
                     SKIP_RETURN_CODE 77)
# A small uneven epoch three times (2 workers, 1 process, 1 process one step short).
set_tests_properties(ddp/test_uneven_tail PROPERTIES TIMEOUT 300)
