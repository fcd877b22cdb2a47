# The frameworks' tests: PyTorch 2.x, Lightning, transformers, accelerate from the frameworks'
# venv (skip with 77 without it); 2 workers, a kill and a restart each: 1-3 min on 2 idle cores,
# an import of torch 2.x alone takes ~10 s on a loaded one.
set_tests_properties(python/test_fw_lightning python/test_fw_hf_trainer python/test_fw_accelerate
                     PROPERTIES TIMEOUT 900)
# Lightning's Slurm auto-requeue on the namespace cluster (root; skips with 77 without it or
# without the frameworks' venv): the cluster, 2 attempts of a small Lightning job: 1-2 min.
set_tests_properties(python/test_fw_lightning_slurm PROPERTIES TIMEOUT 900)
# issue 30: a script's run finishes (an HF Trainer resumed at its last step) and reports a hang
# at exit: the frameworks' venv, one or two short runs each.
set_tests_properties(python/test_script_hf_final_step PROPERTIES TIMEOUT 600)
# issue 30: Lightning's own launch (devices=2 in one process) refused under tandem with the line
# to change, then that line: two short Lightning runs (a torch import each, ~10 s loaded).
set_tests_properties(python/test_env_lightning_spawn PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)
# issue 33: the frameworks' tests run tandem from the pip wheel (tests/lib/frameworks.sh), built
# once by the fixture packaging/test_wheel_build.
set_tests_properties(python/test_fw_lightning python/test_fw_hf_trainer python/test_fw_accelerate
                     python/test_fw_lightning_slurm python/test_script_hf_final_step
                     python/test_env_lightning_spawn python/test_wandb_shim python/test_entry_point
                     PROPERTIES FIXTURES_REQUIRED tandem_wheel)
