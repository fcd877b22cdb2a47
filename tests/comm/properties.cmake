# comm tests include the layer's internal headers (wire format, test hooks, group internals).
foreach(t comm_test_store comm_test_collectives)
  if(TARGET ${t})
    target_include_directories(${t} PRIVATE ${CMAKE_SOURCE_DIR}/src)
  endif()
endforeach()
# Ranks as forked processes; the SIGKILL case times how fast peers notice: keep off a loaded box.
set_tests_properties(comm/test_collectives PROPERTIES RUN_SERIAL TRUE)
# Network namespaces as hosts (root only; skips with 77 otherwise).
set_tests_properties(comm/test_multihost PROPERTIES RUN_SERIAL TRUE SKIP_RETURN_CODE 77)
# The multi-host test's rank/store helper; the script finds it at
# $TANDEM_BUILD_DIR/tests/comm/comm_worker.
if(TARGET td_comm)
  add_executable(comm_worker ${CMAKE_CURRENT_LIST_DIR}/comm_worker.c)
  target_include_directories(comm_worker PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_SOURCE_DIR}/src)
  target_link_libraries(comm_worker PRIVATE td_comm)
  set_target_properties(comm_worker PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                        ${CMAKE_BINARY_DIR}/tests/comm)
  add_dependencies(tandem comm_worker)
endif()
