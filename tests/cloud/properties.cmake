# The cloud layer (src/cloud, docs/cloud.md). test_cloud_unit reads the layer's internals (XML,
# encodings); test_sigv4 reads the botocore vectors committed beside it.
target_include_directories(cloud_test_cloud_unit PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_compile_definitions(cloud_test_sigv4 PRIVATE
                           TD_TEST_CLOUD_DIR="${CMAKE_SOURCE_DIR}/tests/cloud")
# The driver of the moto tests: tandem's client against a local moto_server; the scripts find it
# at $TANDEM_BUILD_DIR/tests/cloud/cloud_driver.
if(TARGET td_cloud)
  add_executable(cloud_driver ${CMAKE_CURRENT_LIST_DIR}/cloud_driver.c)
  target_include_directories(cloud_driver PRIVATE ${CMAKE_SOURCE_DIR}/tests)
  target_link_libraries(cloud_driver PRIVATE td_cloud)
  set_target_properties(cloud_driver PROPERTIES RUNTIME_OUTPUT_DIRECTORY
                        ${CMAKE_BINARY_DIR}/tests/cloud)
  add_dependencies(tandem cloud_driver)
  # moto_server and boto3 from the venv (skips with 77 without it): 11-17 s on 2 cores
  set_tests_properties(cloud/test_moto PROPERTIES TIMEOUT 180)
endif()
# tandem gc and the orphan check of tandem ps against moto_server (venv; skips with 77 without
# it), three local runs and five instances, then nine controllers and their stores in moto's S3:
# 40-60 s on the shared 2-core machine.
set_tests_properties(cloud/test_gc PROPERTIES TIMEOUT 180)
# executor aws end to end on the EC2 fixture (root, namespaces, the venv; skips with 77
# without them): five legs, ten runs, the two references: about 150 s on 2 idle cores.
set_tests_properties(cloud/test_aws_run PROPERTIES TIMEOUT 900)
# a user's SDK script on 2 spot instances, node 0 interrupted, resumed from S3 (root, namespaces,
# the fixture's and the frameworks' venvs; skips with 77 without them): one run, one reference.
set_tests_properties(cloud/test_aws_ckpt_sdk PROPERTIES TIMEOUT 600 FIXTURES_REQUIRED tandem_wheel)
# a user's Lightning and HF Trainer scripts on 2 spot instances and the SDK script on 1, node 0
# interrupted while the first attempt holds at step 10, resumed from S3 (root, namespaces, the
# fixture's and the frameworks' venvs; skips with 77 without them): three runs, three references.
# The instances run the SDK from the pip wheel (fw_remote_python): issue 33.
set_tests_properties(cloud/test_aws_ckpt_fw PROPERTIES TIMEOUT 1800 FIXTURES_REQUIRED tandem_wheel)
# the dead-man's switch on the EC2 fixture (root, namespaces, the venv; skips with 77 without
# them): a quiet live run of 45 s (orphan_timeout 10 s) untouched, then a supervisor killed -9
# whose 2 instances terminate themselves (15 s): about 2 min on the shared 2-core machine.
set_tests_properties(cloud/test_aws_orphan PROPERTIES TIMEOUT 600)
# what a run's instances cost, on the EC2 fixture (root, namespaces, the venv; skips with 77
# without them): three short runs, about 90 s on the shared 2-core machine.
set_tests_properties(cloud/test_aws_cost PROPERTIES TIMEOUT 600)
# tandem run -d of an aws run lives in the cloud, on the EC2 fixture (root, namespaces, the venv;
# skips with 77 without them): a 2-node spot run handed to its controller, the submitter gone and
# its route cut, node 1 interrupted, attached back through S3; a detached run stopped from the
# submitter; two runs, one reference: 213-291 s on the shared 2-core machine.
set_tests_properties(cloud/test_aws_detach PROPERTIES TIMEOUT 1200)
# the bundle's probe parser and host check (src/exec/bundle.c) and the per-zone spot prices: no
# network, no host.
target_include_directories(cloud_test_bundle PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(cloud_test_bundle PRIVATE td_exec)
# zones and architectures on the EC2 fixture (root, namespaces, the venv; skips with 77 without
# them): one short run and four plans, 100-150 s on the loaded shared 2-core machine.
set_tests_properties(cloud/test_aws_zones PROPERTIES TIMEOUT 600)
# the detached run's store push and its bound (src/exec/remote_store.c, td__push_due): the
# decision, and the bytes a 20 MiB metrics file costs with and without it; no network.
target_include_directories(cloud_test_push_schedule PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_link_libraries(cloud_test_push_schedule PRIVATE td_exec)
# tandem run --resume -d of a detached aws run, on the EC2 fixture (root, namespaces, the venv;
# skips with 77 without them): a 1-node run stopped from the submitter, resumed through a new
# controller to its end; an attached run stopped and resumed the same way: 78-80 s on 2 cores.
set_tests_properties(cloud/test_aws_detach_resume PROPERTIES TIMEOUT 900)
