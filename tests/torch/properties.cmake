# The PyTorch backend's tests start several jobs of 2-4 PyTorch processes each: minutes on a
# loaded machine. They skip (77) where the frameworks venv or the extension is missing.
set_tests_properties(torch/test_ops torch/test_ddp torch/test_dead_rank torch/test_lightning torch/test_stall PROPERTIES TIMEOUT 1200 SKIP_RETURN_CODE 77)
