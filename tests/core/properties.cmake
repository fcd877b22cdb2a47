# test_ckpt_names reads the checkpoint-name vectors that tests/python/test_ckpt_names.py reads too.
target_compile_definitions(core_test_ckpt_names PRIVATE
                           TD_TEST_CKPT_NAMES="${CMAKE_SOURCE_DIR}/tests/core/ckpt_names.txt")
