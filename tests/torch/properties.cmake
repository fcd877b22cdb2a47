# The PyTorch backend's tests start several jobs of 2-4 PyTorch processes each: minutes on a
# loaded machine. They skip (77) where the frameworks venv or the extension is missing.
set_tests_properties(torch/test_ops torch/test_ddp torch/test_dead_rank torch/test_lightning torch/test_stall torch/test_hf PROPERTIES TIMEOUT 1200 SKIP_RETURN_CODE 77)
# Under the sanitizers (TANDEM_SANITIZE) the extension carries comm's instrumented C into a
# python that was not linked with the runtime, which ASan refuses ("ASan runtime does not come
# first"): the runtime is preloaded into the test's processes instead, so comm's code under
# PyTorch is checked too.
if(TANDEM_SANITIZE)
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libasan.so
                  OUTPUT_VARIABLE td_libasan OUTPUT_STRIP_TRAILING_WHITESPACE)
  execute_process(COMMAND ${CMAKE_C_COMPILER} -print-file-name=libubsan.so
                  OUTPUT_VARIABLE td_libubsan OUTPUT_STRIP_TRAILING_WHITESPACE)
  set_property(TEST torch/test_ops torch/test_ddp torch/test_dead_rank torch/test_lightning
               torch/test_stall torch/test_hf APPEND PROPERTY ENVIRONMENT
               "LD_PRELOAD=${td_libasan}:${td_libubsan}")
endif()
