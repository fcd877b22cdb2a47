# The short libFuzzer run builds the clang targets (about a minute on 2 cores from scratch) and
# fuzzes each for a few seconds; it wants the cores to itself, and its own timeout.
set_tests_properties(fuzz/test_fuzz_short PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
