"""The CUDA engine against torch.nn on the same weights and inputs: BasicNet's and mlp7's
forward output, NLL loss and every parameter gradient within float32 tolerance, then
resnet-small (batchnorm, residual blocks, projection shortcuts), tests/nn/specs/mix.yaml (every
layer kind, in training and eval mode, batchnorm's running statistics after one update) and the
tabular example (the CPU engine's comparison, tests/nn/test_torch_compare.py, with the dump
taken on the GPU).
Skips (77) without a CUDA device or without the CUDA backend."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "nn"))
import test_torch_compare  # noqa: E402 (skips with 77 itself when torch is missing)

if __name__ == "__main__":
    sys.exit(test_torch_compare.main("cuda"))
