"""The script of tests/executors/test_script_record_*.sh (issue 30): config, tags and summary
through the Python SDK; rank 0 writes two files, prints their SHA-256 (hashlib) and records them
with tandem.artifact (one under a subdirectory name)."""
import hashlib, os
import tandem
run = tandem.init(config={"lr": 0.25, "layers": 3}, tags=["from-node"])
tandem.summary["best_acc"] = 0.875
if run.rank == 0:
    os.makedirs("out", exist_ok=True)
    for name, size in (("model.bin", 300000), ("weights.bin", 5000)):
        data = os.urandom(size)
        with open(os.path.join("out", name), "wb") as f:
            f.write(data)
        print(f"sha256 {name} {hashlib.sha256(data).hexdigest()}", flush=True)
    tandem.artifact("out/model.bin")
    tandem.artifact("out/weights.bin", name="sub/weights.bin")
    tandem.summary["best_acc"] = 0.9375  # a later value replaces the first
tandem.finish()
