# GPU tests (label gpu) skip with exit 77, printing why, where there is no CUDA device or the
# build has no CUDA backend. On a GPU machine: ctest -L gpu (README, "GPU").
set_tests_properties(gpu/test_gpu_engine PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
set_tests_properties(gpu/test_gpu_train PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
set_tests_properties(gpu/test_gpu_accuracy PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
set_tests_properties(gpu/test_gpu_precision PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
set_tests_properties(gpu/test_gpu_large_batch PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
