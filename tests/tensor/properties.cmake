# test_activation compares with libm's double erfc, tanh and exp (td_tensor does not link libm itself).
target_link_libraries(tensor_test_activation PRIVATE m)
