# The portable pip wheel (scripts/wheel.sh: pip wheel, then auditwheel repair) is built once per
# build directory by test_wheel_build (a fixture: a few minutes the first time on 2 loaded cores,
# its CMake build directory kept; then seconds for an unchanged tree, which gives back the same
# wheel file without repairing again), and installed by the tests that require it:
# test_wheel_install and test_wheel_portable here, the frameworks' tests (tests/lib/frameworks.sh),
# local and remote (executors/test_fw_resume_*, cloud/test_aws_ckpt_fw).
# Two builds of the binary the first time (-march=native and the baseline tandem-x86-64).
set_tests_properties(packaging/test_wheel_build PROPERTIES FIXTURES_SETUP tandem_wheel TIMEOUT 1500)
set_tests_properties(packaging/test_wheel_levels PROPERTIES FIXTURES_REQUIRED tandem_wheel)
set_tests_properties(packaging/test_wheel_install PROPERTIES FIXTURES_REQUIRED tandem_wheel)
# a fresh venv, a mount namespace hiding the build's system libraries: root; skips (77) without
set_tests_properties(packaging/test_wheel_portable PROPERTIES FIXTURES_REQUIRED tandem_wheel)
