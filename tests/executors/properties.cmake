# A real Slurm cluster in namespaces (root only; skips with 77 otherwise, or when the Slurm
# packages cannot be installed or started), then two trainings of 2 workers and a requeue that
# waits out cred_expire (10 s): about 40 s on 2 idle cores. The fixture shares nothing with other
# tests (private namespaces, munged, state dir), so it needs no RUN_SERIAL.
set_tests_properties(executors/test_slurm_cluster PROPERTIES TIMEOUT 240 SKIP_RETURN_CODE 77)

# The slurm executor (src/exec/slurm.c). test_slurm_unit reads the layer's internals (parsing,
# state mapping, the batch script) and needs no cluster. The three cluster tests each bring up
# their own 2-node cluster (1-2 s) and train BasicNet for 40-120 steps on 2 workers (test_slurm_run
# also counts nproc_per_node: auto on the cluster and runs one more short job); the requeue
# test waits out cred_expire (10 s) twice. 30-40 s (run), 30 s (stop) and 42 s (requeue) on 2 idle
# cores; up to 60 s each when they run at once with test_slurm_cluster (ctest -j4), about 110 s
# under AddressSanitizer.
target_include_directories(executors_test_slurm_unit PRIVATE ${CMAKE_SOURCE_DIR}/src)
# The supervisor's state machine (src/exec/supervisor.h) against a fake carrier: no process.
target_include_directories(executors_test_supervisor PRIVATE ${CMAKE_SOURCE_DIR}/src)
# The supervisor on its event loop against a fake carrier whose nodes are timers: no process.
target_include_directories(executors_test_supervise_driver PRIVATE ${CMAKE_SOURCE_DIR}/src)
set_tests_properties(executors/test_slurm_run executors/test_slurm_requeue
                     executors/test_slurm_stop PROPERTIES TIMEOUT 240 SKIP_RETURN_CODE 77)

# The slurm executor without a shared file system (slurm: work_dir): its own 2-node cluster
# whose nodes see neither the project nor each other's work dir (TDS_HIDE_DIRS); BasicNet for
# 40 steps plus its local reference, 300 steps requeued twice (cred_expire, 10 s, each time)
# beside its uninterrupted reference, with both nodes' links aborted once, and a link_host the
# nodes cannot resolve (retried as a temporary DNS failure for the 10 s connect timeout): 70-100 s
# on 2 idle cores; 600 s leaves room for AddressSanitizer beside
# the other tests (test_ssh_run took up to 370 s there).
set_tests_properties(executors/test_slurm_nofs PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)

# The ssh fixture (tests/lib/sshd.sh): two hosts with their own sshd in namespaces, a hidden
# directory, a port between the hosts, publickey only, a SIGKILLed fixture's leftovers, nothing
# left after sshd_down. 7-15 s on the shared 2-core machine (about 30 ssh round trips); shares
# nothing with other tests (private namespaces, its own sshds and keys).
set_tests_properties(executors/test_ssh_fixture PROPERTIES TIMEOUT 60 SKIP_RETURN_CODE 77)

# The ssh executor (src/exec/ssh.c). test_ssh_unit reads the layer's internals (fields, hosts,
# hostfiles) and needs no host. test_ssh_run brings up two sshd hosts (tests/lib/sshd.sh) and
# trains BasicNet twice (40 and 300 steps, one host's agent killed in the second) plus the two
# local references, then stops one run and resumes it, and fails two with bad hosts: about 110 s
# on 2 idle cores, 250-370 s under AddressSanitizer.
target_include_directories(executors_test_ssh_unit PRIVATE ${CMAKE_SOURCE_DIR}/src)
# A job's secrets (src/exec/secrets.c) and the workflow's side of them: no process.
target_include_directories(executors_test_secrets_unit PRIVATE ${CMAKE_SOURCE_DIR}/src)
set_tests_properties(executors/test_ssh_run PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
# Executor aws's instance record (RUN/instances.json) and the no-AWS gates of its orphan handling
# (src/exec/aws_record.c, aws_gc.c): no server; one gate tries a closed port (about 3 s of
# retries).
target_include_directories(executors_test_aws_record PRIVATE ${CMAKE_SOURCE_DIR}/src)
# Command runs on the ssh fixture (tandem run --executor ssh -- CMD, issue 30): two short runs
# of a Python script on 2 and 1 hosts; 10-20 s on 2 idle cores.
set_tests_properties(executors/test_run_cmd_ssh PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
# A command run on the EC2 fixture (tandem run --executor aws -- CMD, issue 30): one spot
# instance, one short Python script; the fixture's start is most of it.
set_tests_properties(executors/test_run_cmd_aws PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
# issue 30: a script's sdk.json and artifacts from 2 ssh hosts without a shared directory
# (tests/lib/sshd.sh, as test_ssh_run): one short run of a Python script, about 10 s.
set_tests_properties(executors/test_script_record_ssh PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
# ... and from 2 Slurm nodes without a shared file system (tests/lib/slurm.sh, TDS_HIDE_DIRS):
# the cluster (1-2 s) and one short run, about 15 s.
set_tests_properties(executors/test_script_record_slurm PROPERTIES TIMEOUT 300 SKIP_RETURN_CODE 77)
# A worker hanging at exit after tandem.finish (TANDEM_EXIT_GRACE=25) and a stop that kills a
# worker without a checkpoint, 2 local Python workers each: about 40 s.
set_tests_properties(executors/test_script_exit_hang PROPERTIES TIMEOUT 300)
# issue 30: a user's PyTorch script (the SDK's checkpoints) on 2 ssh hosts without a shared
# directory, one host's agent killed after a checkpoint, max_restarts 1, and its uninterrupted
# local reference: about 40 s on 2 idle cores.
set_tests_properties(executors/test_script_resume_ssh PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)
# issue 30: nproc_per_node: auto|gpu counted on 2 ssh hosts (three short runs of echo): 10-20 s.
set_tests_properties(executors/test_remote_nproc_ssh PROPERTIES TIMEOUT 180 SKIP_RETURN_CODE 77)
# ... and on the Slurm cluster without a shared file system (slurm: work_dir), node 0's machine
# drained and the job requeued after a checkpoint: the cluster (1-2 s), the run and its local
# reference, 40-90 s.
set_tests_properties(executors/test_script_resume_slurm PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)
# issue 30: a user's Lightning and HF Trainer scripts (tests/cloud/spot_fw_train.py, 20 steps of
# a 2-layer MLP) on 2 ssh hosts without a shared directory, one host's agent killed once step
# 10's checkpoint (node 0's only) is committed; each leg's run (two attempts) and its
# uninterrupted local reference: 130-160 s on the shared 2-core machine, most of it the
# frameworks' imports (8 Python processes per leg).
set_tests_properties(executors/test_fw_resume_ssh PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
# ... and on the Slurm cluster without a shared file system (3 nodes), node 0's machine drained
# and the job requeued, for each framework: the cluster (1-2 s), then two legs as above,
# 145-205 s.
set_tests_properties(executors/test_fw_resume_slurm PROPERTIES TIMEOUT 600 SKIP_RETURN_CODE 77)
# issue 33: both run the hosts' SDK from the pip wheel (tests/lib/frameworks.sh, fw_remote_python)
set_tests_properties(executors/test_fw_resume_ssh executors/test_fw_resume_slurm
                     PROPERTIES FIXTURES_REQUIRED tandem_wheel)
# issue 30: node 0's checkpoint to the other nodes through the rendezvous store
# (src/launch/ckpt_peer.c), 3 nodes as threads over a loopback store, 20 MiB: 1-4 s.
target_include_directories(executors_test_ckpt_peer PRIVATE ${CMAKE_SOURCE_DIR}/src)
# issue 30: a lost launcher on the Slurm cluster without a shared file system (slurm: work_dir):
# node 1's `tandem launch` SIGKILLed after node 0's step-10 checkpoint; the batch script starts
# the group again as a new step. The cluster (1-2 s), the run (2 attempts of a Python script) and
# its uninterrupted local reference: 40-60 s on 2 idle cores.
set_tests_properties(executors/test_lost_launcher_slurm PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)
# `tandem launch --restarts-before K` (the Slurm batch script's new step after a lost launcher):
# three short local launches of 2 shell workers, no cluster: 1-3 s.
set_tests_properties(executors/test_restarts_before PROPERTIES TIMEOUT 60)
# ... and on a cluster whose nodes share the run directory: BasicNet 120 steps on 2 nodes, node
# 1's launcher SIGKILLed after the first checkpoint, and the local reference: 25-40 s.
set_tests_properties(executors/test_lost_launcher_slurm_shared PROPERTIES TIMEOUT 400 SKIP_RETURN_CODE 77)
# nproc_per_node: gpu|cpu|auto counted for Slurm (sinfo's lines, a fake sinfo) and aws (a
# catalog entry), reading the layer's internals: no cluster, no network, well under a second.
target_include_directories(executors_test_nproc_count PRIVATE ${CMAKE_SOURCE_DIR}/src)
