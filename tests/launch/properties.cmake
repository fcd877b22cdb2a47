# Launcher tests spawn process trees and measure teardown latency: keep them off a loaded box.
set_tests_properties(launch/test_launch_failure launch/test_launch_signals
                     launch/test_launch_restart launch/test_launch_orphan
                     PROPERTIES RUN_SERIAL TRUE TIMEOUT 120)
set_tests_properties(launch/test_launch_env PROPERTIES TIMEOUT 120)
# torch imports take 5-10 s per worker on a busy machine.
set_tests_properties(launch/test_torch_ddp launch/test_multinode PROPERTIES RUN_SERIAL TRUE
                     TIMEOUT 400 SKIP_RETURN_CODE 77)
# The worker of test_launch_pg.py (td_pg_init_from_env under the launcher); the script finds it at
# $TANDEM_BUILD_DIR/tests/launch/pg_worker.
if(TARGET td_comm)
  add_executable(launch_pg_worker ${CMAKE_CURRENT_LIST_DIR}/pg_worker.c)
  target_include_directories(launch_pg_worker PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_link_libraries(launch_pg_worker PRIVATE td_comm)
  set_target_properties(launch_pg_worker PROPERTIES OUTPUT_NAME pg_worker
                        RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests/launch)
  add_dependencies(tandem launch_pg_worker)
endif()
# test_rdzv.c drives the launcher's internals (src/launch/launch_internal.h).
if(TARGET launch_test_rdzv)
  target_include_directories(launch_test_rdzv PRIVATE ${CMAKE_SOURCE_DIR}/src)
endif()
# test_stall.c drives the stall check's internals (src/launch/stall.h).
if(TARGET launch_test_stall)
  target_include_directories(launch_test_stall PRIVATE ${CMAKE_SOURCE_DIR}/src)
endif()
# The stall tests freeze processes and wait on the stall time: keep them off a loaded box too.
set_tests_properties(launch/test_launch_stall launch/test_launch_stall_nodes launch/test_stall
                     PROPERTIES RUN_SERIAL TRUE TIMEOUT 180)
# Two namespaces and six short trainings; the launchers' timing is not measured.
set_tests_properties(launch/test_numerics PROPERTIES RUN_SERIAL TRUE TIMEOUT 300)
# Four short jobs against a fake IMDS; the agent's stop after the notice is timed (< 10 s).
set_tests_properties(launch/test_spot_watch PROPERTIES RUN_SERIAL TRUE TIMEOUT 180)
# test_ckpt_s3_queue.c drives the S3 checkpoint mirror's internals (src/launch/ckpt_s3.c)
# against moto behind tests/launch/s3_gate.py (the venv's; skips with 77 without it): three
# checkpoints of a few hundred KB, about 10 s on the shared 2-core machine.
if(TARGET launch_test_ckpt_s3_queue)
  target_include_directories(launch_test_ckpt_s3_queue PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(launch_test_ckpt_s3_queue PRIVATE
                             TD_TEST_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  set_tests_properties(launch/test_ckpt_s3_queue PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
# test_ckpt_s3_ranks.c drives another node's own files of directory checkpoints in S3
# (src/launch/ckpt_s3_ranks.c) against moto behind tests/launch/s3_gate.py, boto3 through
# tests/launch/ckpt_ranks_ref.py as the reference (the venv's; skips with 77 without it).
if(TARGET launch_test_ckpt_s3_ranks)
  target_include_directories(launch_test_ckpt_s3_ranks PRIVATE ${CMAKE_SOURCE_DIR}/src)
  target_compile_definitions(launch_test_ckpt_s3_ranks PRIVATE
                             TD_TEST_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
  set_tests_properties(launch/test_ckpt_s3_ranks PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
endif()
