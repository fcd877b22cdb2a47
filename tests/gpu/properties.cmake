# GPU tests (label gpu) skip with exit 77, printing why, where there is no CUDA device or the
# build has no CUDA backend. On a GPU machine: ctest -L gpu (README, "GPU").
set_tests_properties(gpu/test_gpu_engine PROPERTIES SKIP_RETURN_CODE 77 TIMEOUT 300)
set_tests_properties(gpu/test_gpu_train PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
set_tests_properties(gpu/test_gpu_accuracy PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
set_tests_properties(gpu/test_gpu_precision PROPERTIES TIMEOUT 600 RUN_SERIAL TRUE)
set_tests_properties(gpu/test_gpu_large_batch PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
# The kernels' index arithmetic on the host (test_gpu_kernels_host.cu includes kernels.cu): built
# with the CUDA backend, runs without a GPU.
if(TANDEM_HAVE_CUDA)
  add_executable(gpu_test_gpu_kernels_host ${CMAKE_CURRENT_LIST_DIR}/test_gpu_kernels_host.cu)
  target_include_directories(gpu_test_gpu_kernels_host PRIVATE ${CMAKE_SOURCE_DIR}/src/gpu)
  target_link_libraries(gpu_test_gpu_kernels_host PRIVATE td_gpu)
  add_test(NAME gpu/test_gpu_kernels_host COMMAND gpu_test_gpu_kernels_host)
  set_tests_properties(gpu/test_gpu_kernels_host PROPERTIES LABELS gpu TIMEOUT 120)
endif()
set_tests_properties(gpu/test_gpu_data PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
set_tests_properties(gpu/test_cuda_build PROPERTIES TIMEOUT 900)
set_tests_properties(gpu/test_gpu_losses PROPERTIES TIMEOUT 300 RUN_SERIAL TRUE)
