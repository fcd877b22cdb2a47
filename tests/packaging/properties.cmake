# The pip wheel is built once per build directory by test_wheel_build (a fixture: about a minute
# the first time on 2 cores, seconds after, its CMake build directory kept), and installed by the
# tests that require it: test_wheel_install here, the frameworks' tests (tests/lib/frameworks.sh).
set_tests_properties(packaging/test_wheel_build PROPERTIES FIXTURES_SETUP tandem_wheel TIMEOUT 900)
set_tests_properties(packaging/test_wheel_install PROPERTIES FIXTURES_REQUIRED tandem_wheel)
