# The accuracy run trains 2 epochs (~2-3 min on 2 cores) and wants both cores to itself.
set_tests_properties(train/test_accuracy PROPERTIES TIMEOUT 900 RUN_SERIAL TRUE)
# The CLI test spawns and signals trainer processes; keep it off a loaded machine's edge.
set_tests_properties(train/test_train_cli PROPERTIES TIMEOUT 600)
